"""Put it together: records in, result dict (the issue's result JSON) out.

    diagnose(summaries, waits, signals, clock_samples, scenario=None, ...) -> dict

is a pure function; `Accumulator` is the seam for the transport: the MPI collector loop
feeds it packed records as they arrive (`on_bytes`) and tells it about ranks it gave up
on (`on_rank_lost`); `Accumulator.result()` calls `diagnose`.

Pipeline (order matters):
 1. clock model from ClockSamples (+ host ping-pongs)              clock.py
 2. join waits to signals by (comm_op, comm_gen, sender, receiver)  join.py
 3. align joined waits, enforce the causal constraint, merge tiles  classify.align_waits
 4. local detectors, then remote_stall with upstream delay analysis classify.py, rootcause.py
 5. silent ranks: unmatched waits on a missing or dead rank become capped remote_stall
    evidence rooted at it (partial result naming it)
 6. merge evidence into findings; fold remote costs rooted at a rank into that rank's
    local finding of the same (or adjacent) epoch; confidence and coverage per finding
"""
from __future__ import annotations

import os
import pickle
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Optional, Sequence, Set, Tuple

from . import patterns as P
from .classify import (Evidence, Inputs, Thresholds, align_signals, align_waits, detect_all,
                       step_begins)
from .clock import DEFAULT_WINDOW_NS, build_clock_model
from .join import join
from .records import (RECORD_LISTS, ClockSample, Coverage, EpochSummary, Names, PingPong, RecordError,
                      RemoteWait, Signal, TaskEvidence, pack, unpack_stream)
from .scenario import Scenario

#: Remote costs rooted at r fold into r's local finding within this many epochs...
FOLD_EPOCH_SLACK = 1
#: ... unless that finding is marginal there: its evidence within those epochs must pass
#: its threshold by this factor, or have at least FOLD_MIN_SHARE of the remote cost's
#: impact (on 2 x H200, all-reduce tasks 25 us slower than usual in one step -- a
#: slow_task_class at 1.09x its threshold -- swallowed the 200 us remote stalls of the
#: steps around it; a real local fault on the root passes its threshold by far)
FOLD_MIN_RATIO = 2.0
FOLD_MIN_SHARE = 0.5


@dataclass
class Finding:
    cause: str
    rank: int
    task_class: Optional[int] = None
    comm_op: Optional[int] = None
    extra: Dict[str, int] = field(default_factory=dict)
    evidence: List[Evidence] = field(default_factory=list)
    folded: List[Evidence] = field(default_factory=list)

    @property
    def steps(self) -> List[int]:
        return sorted({e.step for e in self.evidence})

    @property
    def impact_ns(self) -> float:
        return sum(e.impact_ns for e in self.evidence) + sum(e.impact_ns for e in self.folded)

    @property
    def observed_on(self) -> List[int]:
        s: Set[int] = set()
        for e in self.evidence + self.folded:
            s |= e.observed_on
        if self.cause != P.REMOTE_STALL:
            s.add(self.rank)
        return sorted(s)


def _confidence(e: Evidence, lost_frac: float, clock_err_ns: float, th: Thresholds) -> float:
    c = 1.0 - 0.5 / max(e.ratio, 1.0)
    c *= 1.0 - 0.5 * lost_frac
    if e.cause == P.REMOTE_STALL and clock_err_ns > 0:
        c *= min(1.0, e.impact_ns / (4.0 * clock_err_ns))
    return max(0.0, min(c, e.confidence_cap))


def diagnose(summaries: Iterable[EpochSummary], waits: Iterable[RemoteWait],
             signals: Iterable[Signal], clock_samples: Iterable[ClockSample],
             scenario: Optional[Scenario] = None, *, pingpongs: Iterable[PingPong] = (),
             ranks: Optional[int] = None, names: Optional[Names] = None,
             thresholds: Optional[Thresholds] = None, telemetry_bytes: Optional[int] = None,
             lost_ranks: Iterable[int] = (), window_ns: int = DEFAULT_WINDOW_NS) -> Dict[str, Any]:
    names = names or Names.standard()
    th = thresholds or Thresholds()
    summaries, waits, signals = list(summaries), list(waits), list(signals)
    clock_samples, pingpongs = list(clock_samples), list(pingpongs)

    n_ranks = ranks if ranks is not None else (scenario.ranks if scenario else None)
    present: Set[int] = ({s.rank for s in summaries} | {w.rank for w in waits}
                         | {s.rank for s in signals})
    expected = set(range(n_ranks)) if n_ranks is not None else set(present)
    lost = set(lost_ranks)
    missing = sorted((expected - present) | (lost - present))

    # per-(rank, epoch) summaries; the last per-rank epoch tells when a rank went silent
    by_key: Dict[Tuple[int, int], EpochSummary] = {}
    for s in summaries:
        by_key[(s.rank, s.epoch)] = s
    last_epoch: Dict[int, int] = {}
    for (r, e) in by_key:
        last_epoch[r] = max(last_epoch.get(r, -1), e)
    n_steps = scenario.steps if scenario else None
    max_epoch = max(last_epoch.values(), default=-1)
    final = (n_steps - 1) if n_steps is not None else max_epoch
    incomplete = {r: e for r, e in last_epoch.items() if e < final or r in lost}

    clock = build_clock_model(clock_samples, pingpongs, window_ns)
    joined = join(waits, signals, expected_ranks=expected, present_ranks=present)
    aligned, causal = align_waits(joined, clock, th.min_latency_ns, step_begins(by_key, clock))

    inp = Inputs(by_key, aligned, names, th, align_signals(joined, clock))
    evidence = detect_all(inp)
    evidence += _silent_rank_evidence(joined.unmatched_waits, set(missing), incomplete, th)

    findings = _merge(evidence)
    pair_err = clock.report()["pair_error_bound_ns"]
    out_findings = []
    for f in findings:
        cov = Coverage()
        ranks_of = set(f.observed_on) | {f.rank}
        for st in f.steps:
            for r in ranks_of:
                s = by_key.get((r, st))
                if s is not None:
                    cov = cov + s.coverage
        lost_frac = cov.lost / cov.eligible if cov.eligible else 0.0
        conf = max(_confidence(e, lost_frac, pair_err, th) for e in f.evidence)
        d: Dict[str, Any] = {"cause": f.cause, "rank": f.rank, "observed_on": f.observed_on}
        if f.task_class is not None:
            d["task_class"] = names.task_class(f.task_class)
        if f.comm_op is not None:
            d["comm_op"] = names.comm_op(f.comm_op)
        layers = {e.layer for e in f.evidence if e.layer is not None}
        if len(layers) == 1:
            d["layer"] = layers.pop()
        d["steps"] = f.steps
        d["confidence"] = round(conf, 3)
        d["impact_us"] = round(f.impact_ns / 1000.0, 1)
        d["coverage"] = cov.as_dict()
        d.update(f.extra)
        if f.folded:
            d["folded_remote_us"] = round(sum(e.impact_ns for e in f.folded) / 1000.0, 1)
        out_findings.append(d)
    out_findings.sort(key=lambda d: (-d["confidence"], -d["impact_us"]))

    total = Coverage()
    for s in by_key.values():
        total = total + s.coverage
    if telemetry_bytes is None:
        telemetry_bytes = sum(len(pack(r)) for seq in (summaries, waits, signals, clock_samples,
                                                       pingpongs) for r in seq)
    verdict = "fault" if any(d["confidence"] >= th.verdict for d in out_findings) else "none"
    clock_rep = clock.report()
    clock_rep["causal"] = causal.as_dict()
    return {
        "scenario": scenario.name if scenario else None,
        "verdict": verdict,
        "findings": out_findings,
        "telemetry_bytes": int(telemetry_bytes),
        "coverage": total.as_dict(),
        # additions beyond the required keys:
        "partial": bool(missing or incomplete),
        "missing_ranks": missing,
        "incomplete_ranks": {str(r): e for r, e in sorted(incomplete.items())},
        "join": joined.report(),
        "clock": clock_rep,
    }


def _silent_rank_evidence(unmatched: Sequence[RemoteWait], missing: Set[int],
                          incomplete: Dict[int, int], th: Thresholds) -> List[Evidence]:
    """Waits on a rank that sent nothing (or stopped sending) are charged to it, capped."""
    agg: Dict[Tuple[int, int, int], Evidence] = {}
    for w in unmatched:
        dead = w.peer in missing or (w.peer in incomplete and w.step > incomplete[w.peer])
        if not dead:
            continue
        k = (w.peer, w.step, w.comm_op)
        e = agg.get(k)
        if e is None:
            e = agg[k] = Evidence(P.REMOTE_STALL, w.peer, w.step, 0.0, 0.0, comm_op=w.comm_op,
                                  confidence_cap=th.dead_rank_confidence)
        e.impact_ns += max(0, w.wait_end_ns - w.wait_begin_ns)
        e.observed_on.add(w.rank)
    for e in agg.values():
        e.ratio = max(e.impact_ns / th.stall_floor_ns, 1.0)
    return list(agg.values())


def _merge(evidence: List[Evidence]) -> List[Finding]:
    local: Dict[tuple, Finding] = {}
    remote: List[Evidence] = []
    for e in evidence:
        if e.cause == P.REMOTE_STALL:
            remote.append(e)
            continue
        k = (e.cause, e.rank, e.task_class, tuple(sorted(e.extra.items())))
        f = local.get(k)
        if f is None:
            f = local[k] = Finding(e.cause, e.rank, e.task_class, None, dict(e.extra))
        f.evidence.append(e)
    # fold remote costs into the root rank's local finding of the same (adjacent) epoch
    by_rank: Dict[int, List[Finding]] = {}
    for f in local.values():
        by_rank.setdefault(f.rank, []).append(f)
    remote_f: Dict[tuple, Finding] = {}
    for e in remote:
        host = None
        if e.confidence_cap >= 1.0:
            best = None
            for f in by_rank.get(e.rank, []):
                near = [x for x in f.evidence if abs(x.step - e.step) <= FOLD_EPOCH_SLACK]
                if near and (max(x.ratio for x in near) >= FOLD_MIN_RATIO
                             or sum(x.impact_ns for x in near) >= FOLD_MIN_SHARE * e.impact_ns):
                    cand = (min(abs(x.step - e.step) for x in near), -sum(x.impact_ns for x in f.evidence))
                    if best is None or cand < best[0]:
                        best = (cand, f)
            host = best[1] if best else None
        if host is not None:
            host.folded.append(e)
            continue
        k = (e.rank, e.comm_op, e.confidence_cap < 1.0)
        f = remote_f.get(k)
        if f is None:
            f = remote_f[k] = Finding(P.REMOTE_STALL, e.rank, None, e.comm_op)
        f.evidence.append(e)
    return list(local.values()) + list(remote_f.values())


# ---------------------------------------------------------------------------------------
# the seam for the transport


class RecordSink:
    """Receives records from the collector's transport.

    Threading contract: called only from the collector's progress loop (one thread);
    implementations must not block and must not raise for bad input from a rank (count
    it instead).  The defaults do nothing.
    """

    def on_bytes(self, rank: int, data: bytes) -> None:
        """A message of concatenated packed records from `rank`."""

    def on_rank_lost(self, rank: int) -> None:
        """The transport gave up on `rank` (dead, timed out, or left)."""

    def on_lost_records(self, rank: int, count: int) -> None:
        """`rank`'s agent reported `count` records it could not send (counted as lost)."""

    def on_record(self, rank: int, record) -> None:
        """A record the transport made itself (a host ping-pong with `rank`)."""


#: a path: Accumulator.result() pickles the collector's input there first (replay:
#: `python -m dtrace_mk.collectors.replay PATH` runs diagnose() on it again, without the job)
DUMP_ENV = "DTRACE_MK_COLLECTOR_DUMP"


class Accumulator(RecordSink):
    """Collects records for `diagnose`; counts bytes, bad messages and lost records."""

    def __init__(self):
        self.summaries: List[EpochSummary] = []
        self.waits: List[RemoteWait] = []
        self.signals: List[Signal] = []
        self.clock_samples: List[ClockSample] = []
        self.pingpongs: List[PingPong] = []
        self.evidence: List[TaskEvidence] = []      # escalated raw evidence (exports only)
        self.bytes = 0
        self.bad_messages: Dict[int, int] = {}
        self.lost_records: Dict[int, int] = {}
        self.lost_ranks: Set[int] = set()

    def on_bytes(self, rank: int, data: bytes) -> None:
        self.bytes += len(data)
        try:
            recs = list(unpack_stream(data))
        except (RecordError, ValueError):
            self.bad_messages[rank] = self.bad_messages.get(rank, 0) + 1
            return
        for r in recs:
            self.add(r)

    def add(self, r) -> None:
        name = RECORD_LISTS.get(type(r))
        if name is not None:
            getattr(self, name).append(r)

    def on_rank_lost(self, rank: int) -> None:
        self.lost_ranks.add(rank)

    def on_record(self, rank: int, record) -> None:
        self.add(record)

    def on_lost_records(self, rank: int, count: int) -> None:
        self.lost_records[rank] = self.lost_records.get(rank, 0) + count

    def result(self, scenario: Optional[Scenario] = None, **kw) -> Dict[str, Any]:
        dump = os.environ.get(DUMP_ENV)
        if dump:           # the collector's whole input, to replay diagnose() offline
            with open(dump, "wb") as f:
                pickle.dump({"summaries": self.summaries, "waits": self.waits, "signals": self.signals,
                             "clock_samples": self.clock_samples, "pingpongs": self.pingpongs,
                             "scenario": scenario, "kw": kw, "lost_ranks": self.lost_ranks}, f)
        res = diagnose(self.summaries, self.waits, self.signals, self.clock_samples, scenario,
                       pingpongs=self.pingpongs, telemetry_bytes=self.bytes or None,
                       lost_ranks=self.lost_ranks, **kw)
        res["transport"] = {"bad_messages": {str(k): v for k, v in sorted(self.bad_messages.items())},
                            "lost_records": {str(k): v for k, v in sorted(self.lost_records.items())}}
        return res
