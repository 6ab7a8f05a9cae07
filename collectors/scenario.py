"""Scenario files: what to run and which faults to inject (YAML or JSON).

    name: late_comm_r1
    ranks: 2
    backend: auto            # auto | sim | gpu   (optional, default auto)
    model: tiny              # preset name
    steps: 8                 # decode steps, numbered 0 .. steps-1
    batch: 4
    seed: 1
    monitors: [q.d]          # optional: query files (default: built-in summary monitors)
    budget_bytes_per_step: 65536   # optional
    faults:                  # optional, default none
      - {kind: late_comm, rank: 1, steps: [3, 4], comm_op: allreduce_attn, delay_us: 200}

Fault kinds and their parameters are one table, `FAULT_PARAMS`, below.  An unknown field,
kind or parameter, a missing required one, or a value of the wrong type or range is a
`ScenarioError` naming the file, the entry (`faults[2] (late_comm)`) and the field.

(The device fault table in `dtrace_mk/megakernel/faults.py` parses the same fault specs;
the two should share this table — see the collector report.)
"""
from __future__ import annotations

import difflib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from ..errors import UserError
from .patterns import FAULT_KIND_CAUSE
from .records import Names

BACKENDS = ("auto", "sim", "gpu")


class ScenarioError(UserError):
    """A bad scenario file; the message names the file, the entry and the field."""


# ---- value checks: each returns the normalised value or raises ValueError(expectation) ----

def _int(lo: int = 0):
    def check(v, names: Names):
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise ValueError(f"an integer >= {lo}")
        return v
    return check


def _pos_number(v, names: Names):
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
        raise ValueError("a number > 0")
    return float(v)


def _fraction(v, names: Names):
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v <= 1:
        raise ValueError("a number in (0, 1]")
    return float(v)


def _task_class(v, names: Names):
    if not isinstance(v, str) or v not in names.task_classes:
        raise ValueError("a task class (" + ", ".join(names.task_classes) + ")")
    return v


def _comm_op(v, names: Names):
    if not isinstance(v, str) or v not in names.comm_ops:
        raise ValueError("a comm op (" + ", ".join(names.comm_ops) + ")")
    return v


Check = Callable[[Any, Names], Any]

#: kind -> {parameter: (required, check)}; `kind`, `rank`, `steps` are common to all.
FAULT_PARAMS: Dict[str, Dict[str, Tuple[bool, Check]]] = {
    "late_comm":         {"comm_op": (True, _comm_op), "layer": (False, _int(0)),
                          "delay_us": (True, _pos_number)},
    "slow_task_class":   {"task_class": (True, _task_class), "layer": (False, _int(0)),
                          "extra_us": (True, _pos_number), "fraction": (False, _fraction)},
    "routing_skew":      {"expert": (True, _int(0)), "share": (True, _fraction)},
    "late_notification": {"task_class": (True, _task_class), "delay_us": (True, _pos_number)},
    "queue_saturation":  {"worker": (True, _int(0)), "extra_tasks": (True, _int(1))},
    "starve_ready":      {"task_class": (True, _task_class), "delay_us": (True, _pos_number)},
}
FAULT_COMMON = ("kind", "rank", "steps")
assert set(FAULT_PARAMS) == set(FAULT_KIND_CAUSE), "fault kinds and pattern fault_kinds differ"

TOP_FIELDS: Dict[str, bool] = {   # field -> required
    "name": True, "ranks": True, "backend": False, "model": True, "steps": True,
    "batch": True, "seed": True, "monitors": False, "budget_bytes_per_step": False,
    "faults": False,
}


@dataclass(frozen=True)
class Fault:
    index: int
    kind: str
    rank: int
    steps: Tuple[int, ...]
    params: Mapping[str, Any]

    @property
    def cause(self) -> str:
        return FAULT_KIND_CAUSE[self.kind]

    @property
    def task_class(self) -> Optional[str]:
        return self.params.get("task_class")

    @property
    def comm_op(self) -> Optional[str]:
        return self.params.get("comm_op")

    def to_dict(self) -> Dict[str, Any]:
        return {"kind": self.kind, "rank": self.rank, "steps": list(self.steps), **self.params}


@dataclass(frozen=True)
class Scenario:
    name: str
    ranks: int
    model: str
    steps: int
    batch: int
    seed: int
    backend: str = "auto"
    monitors: Tuple[str, ...] = ()
    budget_bytes_per_step: Optional[int] = None
    faults: Tuple[Fault, ...] = ()
    source: str = "<memory>"

    def to_dict(self) -> Dict[str, Any]:
        d: Dict[str, Any] = {"name": self.name, "ranks": self.ranks, "backend": self.backend,
                             "model": self.model, "steps": self.steps, "batch": self.batch,
                             "seed": self.seed}
        if self.monitors:
            d["monitors"] = list(self.monitors)
        if self.budget_bytes_per_step is not None:
            d["budget_bytes_per_step"] = self.budget_bytes_per_step
        d["faults"] = [f.to_dict() for f in self.faults]
        return d


def _unknown(what: str, name: str, known: Sequence[str]) -> str:
    msg = f"unknown {what} {name!r} (known: {', '.join(known)})"
    near = difflib.get_close_matches(str(name), list(known), n=1)
    return msg + (f"; did you mean {near[0]!r}?" if near else "")


def _check(where: str, fname: str, value, check: Check, names: Names):
    try:
        return check(value, names)
    except ValueError as e:
        raise ScenarioError(f"{where}: {fname} must be {e}, got {value!r}") from None


def parse_scenario(data: Any, source: str = "<memory>", names: Optional[Names] = None) -> Scenario:
    names = names or Names.standard()
    if not isinstance(data, dict):
        raise ScenarioError(f"{source}: expected a mapping at the top, got {type(data).__name__}")
    for k in data:
        if k not in TOP_FIELDS:
            raise ScenarioError(f"{source}: {_unknown('field', k, list(TOP_FIELDS))}")
    for k, req in TOP_FIELDS.items():
        if req and k not in data:
            raise ScenarioError(f"{source}: missing field {k!r}")
    name = data["name"]
    if not isinstance(name, str) or not name:
        raise ScenarioError(f"{source}: name must be a non-empty string, got {name!r}")
    ranks = _check(source, "ranks", data["ranks"], _int(1), names)
    steps = _check(source, "steps", data["steps"], _int(1), names)
    batch = _check(source, "batch", data["batch"], _int(1), names)
    seed = _check(source, "seed", data["seed"], _int(0), names)
    model = data["model"]
    presets = _preset_names()
    if not isinstance(model, str) or not model or (presets and model not in presets):
        raise ScenarioError(f"{source}: model must be a preset name"
                            + (f" ({', '.join(presets)})" if presets else "") + f", got {model!r}")
    backend = data.get("backend", "auto")
    if backend not in BACKENDS:
        raise ScenarioError(f"{source}: backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    monitors = data.get("monitors", []) or []
    if not isinstance(monitors, list) or not all(isinstance(m, str) for m in monitors):
        raise ScenarioError(f"{source}: monitors must be a list of query file names, got {monitors!r}")
    budget = data.get("budget_bytes_per_step")
    if budget is not None:
        budget = _check(source, "budget_bytes_per_step", budget, _int(1), names)
    raw_faults = data.get("faults", []) or []
    if not isinstance(raw_faults, list):
        raise ScenarioError(f"{source}: faults must be a list, got {type(raw_faults).__name__}")
    faults = tuple(_parse_fault(i, f, source, ranks, steps, names) for i, f in enumerate(raw_faults))
    return Scenario(name, ranks, model, steps, batch, seed, backend, tuple(monitors), budget,
                    faults, source)


def _parse_fault(i: int, f: Any, source: str, ranks: int, steps: int, names: Names) -> Fault:
    where = f"{source}: faults[{i}]"
    if not isinstance(f, dict):
        raise ScenarioError(f"{where}: expected a mapping, got {type(f).__name__}")
    if "kind" not in f:
        raise ScenarioError(f"{where}: missing field 'kind'")
    kind = f["kind"]
    if kind not in FAULT_PARAMS:
        raise ScenarioError(f"{where}: {_unknown('fault kind', kind, list(FAULT_PARAMS))}")
    where = f"{where} ({kind})"
    table = FAULT_PARAMS[kind]
    for k in f:
        if k not in FAULT_COMMON and k not in table:
            raise ScenarioError(f"{where}: {_unknown('parameter', k, list(FAULT_COMMON[1:]) + list(table))}")
    for k in ("rank", "steps"):
        if k not in f:
            raise ScenarioError(f"{where}: missing field {k!r}")
    for k, (req, _) in table.items():
        if req and k not in f:
            raise ScenarioError(f"{where}: missing parameter {k!r}")
    rank = f["rank"]
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < ranks:
        raise ScenarioError(f"{where}: rank must be an integer in 0..{ranks - 1}, got {rank!r}")
    st = f["steps"]
    if (not isinstance(st, list) or not st
            or not all(isinstance(s, int) and not isinstance(s, bool) and 0 <= s < steps for s in st)):
        raise ScenarioError(f"{where}: steps must be a non-empty list of steps in 0..{steps - 1}, got {st!r}")
    params = {k: _check(where, k, f[k], table[k][1], names) for k in table if k in f}
    return Fault(i, kind, rank, tuple(sorted(set(st))), params)


def _preset_names() -> Tuple[str, ...]:
    try:
        from ..megakernel.presets import PRESETS
    except ImportError:          # the megakernel layer is optional for the collector
        return ()
    return tuple(PRESETS)


def device_fault_specs(scenario: Scenario, rank: int) -> List[Dict[str, Any]]:
    """The faults of `rank` as specs for the device fault table
    (`dtrace_mk.megakernel.faults.FaultTable.from_specs`, which reads `steps` the same
    way): `rank` dropped, a per-fault `seed`."""
    return [{"kind": f.kind, "steps": list(f.steps), "seed": scenario.seed * 1000 + f.index, **f.params}
            for f in scenario.faults if f.rank == rank]


def load_scenario(path: Union[str, Path], names: Optional[Names] = None) -> Scenario:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise ScenarioError(f"{path}: cannot read ({e.strerror})") from None
    return parse_scenario(_load_text(text, str(path)), str(path), names)


def _load_text(text: str, source: str):
    if source.endswith(".json"):
        try:
            return json.loads(text)
        except json.JSONDecodeError as e:
            raise ScenarioError(f"{source}:{e.lineno}:{e.colno}: invalid JSON: {e.msg}") from None
    import yaml
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        loc = f":{mark.line + 1}:{mark.column + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e)
        raise ScenarioError(f"{source}{loc}: invalid YAML: {problem}") from None
