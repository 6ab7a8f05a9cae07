"""Score a diagnosis result against the faults its scenario injected.

A finding matches a fault when
  * `cause` equals the fault kind's cause (`patterns.FAULT_KIND_CAUSE`),
  * `rank` (the root-cause rank) equals the fault's rank,
  * the task class or comm op agrees when the fault names one (`task_class` for
    slow_task_class / late_notification / starve_ready, `comm_op` for late_comm), and
  * the finding's steps overlap the fault's steps.

precision = findings that match some fault / findings (1.0 when there are none);
recall    = faults matched by some finding / faults (1.0 when there are none);
false-confident findings: confidence >= 0.8 and matching no fault.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Union

from ..errors import UserError
from .patterns import CAUSES, FAULT_KIND_CAUSE
from .scenario import Fault, Scenario

CONFIDENT = 0.8

RESULT_KEYS = ("scenario", "verdict", "findings", "telemetry_bytes", "coverage")
FINDING_KEYS = ("cause", "rank", "observed_on", "steps", "confidence", "impact_us", "coverage")
COVERAGE_KEYS = ("eligible", "executed", "throttled", "lost")


class ResultError(UserError):
    """A result file that does not follow the result format; names the key."""


def validate_result(d: Any, source: str = "<result>") -> Dict[str, Any]:
    if not isinstance(d, dict):
        raise ResultError(f"{source}: expected a JSON object, got {type(d).__name__}")
    for k in RESULT_KEYS:
        if k not in d:
            raise ResultError(f"{source}: missing key {k!r}")
    if d["verdict"] not in ("fault", "none"):
        raise ResultError(f"{source}: verdict must be 'fault' or 'none', got {d['verdict']!r}")
    if not isinstance(d["findings"], list):
        raise ResultError(f"{source}: findings must be a list")
    _coverage(d["coverage"], f"{source}: coverage")
    for i, f in enumerate(d["findings"]):
        where = f"{source}: findings[{i}]"
        if not isinstance(f, dict):
            raise ResultError(f"{where}: expected an object")
        for k in FINDING_KEYS:
            if k not in f:
                raise ResultError(f"{where}: missing key {k!r}")
        if f["cause"] not in CAUSES:
            raise ResultError(f"{where}: unknown cause {f['cause']!r} (known: {', '.join(CAUSES)})")
        if not isinstance(f["steps"], list) or not isinstance(f["observed_on"], list):
            raise ResultError(f"{where}: steps and observed_on must be lists")
        c = f["confidence"]
        if not isinstance(c, (int, float)) or not 0 <= c <= 1:
            raise ResultError(f"{where}: confidence must be in [0, 1], got {c!r}")
        _coverage(f["coverage"], f"{where}: coverage")
    return d


def _coverage(c, where):
    if not isinstance(c, dict) or any(k not in c for k in COVERAGE_KEYS):
        raise ResultError(f"{where}: must have keys {', '.join(COVERAGE_KEYS)}")


def load_result(path: Union[str, Path]) -> Dict[str, Any]:
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise ResultError(f"{path}: cannot read ({e.strerror})") from None
    try:
        d = json.loads(text)
    except json.JSONDecodeError as e:
        raise ResultError(f"{path}:{e.lineno}:{e.colno}: invalid JSON: {e.msg}") from None
    return validate_result(d, str(path))


def finding_matches(f: Mapping[str, Any], fault: Fault) -> bool:
    if f.get("cause") != FAULT_KIND_CAUSE[fault.kind] or f.get("rank") != fault.rank:
        return False
    if fault.task_class is not None and f.get("task_class") != fault.task_class:
        return False
    if fault.comm_op is not None and f.get("comm_op") != fault.comm_op:
        return False
    return bool(set(f.get("steps", ())) & set(fault.steps))


@dataclass
class ScoreReport:
    scenario: str
    findings: List[Dict[str, Any]]
    faults: List[Fault]
    matches: Dict[int, List[int]] = field(default_factory=dict)   # finding -> faults

    @property
    def matched_findings(self) -> List[int]:
        return [i for i, m in self.matches.items() if m]

    @property
    def found_faults(self) -> List[int]:
        return sorted({j for m in self.matches.values() for j in m})

    @property
    def precision(self) -> float:
        return 1.0 if not self.findings else len(self.matched_findings) / len(self.findings)

    @property
    def recall(self) -> float:
        return 1.0 if not self.faults else len(self.found_faults) / len(self.faults)

    @property
    def false_confident(self) -> List[int]:
        return [i for i, f in enumerate(self.findings)
                if f.get("confidence", 0) >= CONFIDENT and not self.matches.get(i)]

    def as_dict(self) -> Dict[str, Any]:
        return {"scenario": self.scenario, "precision": self.precision, "recall": self.recall,
                "findings": len(self.findings), "faults": len(self.faults),
                "matched_findings": self.matched_findings, "found_faults": self.found_faults,
                "false_confident": self.false_confident,
                "missed_faults": [j for j in range(len(self.faults)) if j not in self.found_faults]}

    def render(self) -> str:
        nf, nm = len(self.findings), len(self.matched_findings)
        lines = [f"scenario: {self.scenario}",
                 f"precision: {self.precision:.2f} ({nm}/{nf} findings match a fault)",
                 f"recall: {self.recall:.2f} ({len(self.found_faults)}/{len(self.faults)} faults found)",
                 f"false-confident: {len(self.false_confident)} (confidence >= {CONFIDENT} matching no fault)"]
        for j, fault in enumerate(self.faults):
            if j not in self.found_faults:
                lines.append(f"  missed faults[{fault.index}]: {_fault_str(fault)}")
        for i in self.false_confident:
            lines.append(f"  false-confident findings[{i}]: {_finding_str(self.findings[i])}")
        for i, f in enumerate(self.findings):
            if not self.matches.get(i) and i not in self.false_confident:
                lines.append(f"  unmatched findings[{i}]: {_finding_str(f)}")
        return "\n".join(lines)


def _fault_str(f: Fault) -> str:
    what = f.task_class or f.comm_op
    return (f"{f.kind} -> {f.cause} rank {f.rank}" + (f" {what}" if what else "")
            + f" steps {list(f.steps)}")


def _finding_str(f: Mapping[str, Any]) -> str:
    what = f.get("task_class") or f.get("comm_op")
    return (f"{f.get('cause')} rank {f.get('rank')}" + (f" {what}" if what else "")
            + f" steps {f.get('steps')} confidence {f.get('confidence')}")


def score(result: Mapping[str, Any], scenario: Scenario) -> ScoreReport:
    findings = list(result.get("findings", []))
    faults = list(scenario.faults)
    rep = ScoreReport(scenario.name, findings, faults)
    for i, f in enumerate(findings):
        rep.matches[i] = [j for j, fault in enumerate(faults) if finding_matches(f, fault)]
    return rep
