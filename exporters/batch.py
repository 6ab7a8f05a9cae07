"""The exporters' one input: `ExportBatch`, built from what the collector produces.

    batch = build_batch(result, records, job_id="job-42", rank_info={0: RankInfo("node1", 0)})

* `result`  — the dict `collectors.diagnose.diagnose` (or `Accumulator.result`) returns.
* `records` — the records the diagnosis was computed from: a `RecordSet`, an
  `Accumulator` (anything with `.summaries/.waits/.signals/.clock_samples/.pingpongs`,
  and `.evidence` when it has escalated evidence), a mapping with those keys, or a flat
  iterable of records.  Their `TaskEvidence` records become the batch's `RawEvidence`
  (`evidence_of`), beside any given explicitly.  `ClockSample`s and
  `PingPong`s are needed to put every rank on the one aligned clock (the clock model is
  rebuilt from them exactly as `diagnose` builds it; the result only holds its report).

Times.  Record times are each rank's device clock.  `ExportBatch.to_unix_ns(rank, t)`
maps them to the aligned clock (`ClockModel.to_global`) plus the model's `origin_ns`,
i.e. to the collector host's clock in integer ns.  When the agents stamp
`ClockSample.host_ns` with `time.time_ns()` (CLOCK_REALTIME), that is Unix time, which
is what OpenTelemetry backends expect.

Saved records.  A saved diagnosis is `RESULT.json` plus `RESULT.records.msgpack` (the
records as one msgpack stream, `collectors.records.pack_stream`); `records_path_for`
names the second file, `save_records` / `load_records` write and read it.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from ..collectors.clock import DEFAULT_WINDOW_NS, ClockModel, build_clock_model
from ..collectors.records import (REASON_NAMES, RECORD_LISTS, ClockSample, Coverage, EpochSummary, Names,
                                  PingPong, RecordError, RemoteWait, Signal, TaskEvidence, pack_stream,
                                  unpack_stream)
from ..errors import UserError

RECORDS_SUFFIX = ".records.msgpack"


class ExportError(UserError):
    """Bad exporter input (result file, records file, option); names the file/field."""


@dataclass
class RecordSet:
    summaries: List[EpochSummary] = field(default_factory=list)
    waits: List[RemoteWait] = field(default_factory=list)
    signals: List[Signal] = field(default_factory=list)
    clock_samples: List[ClockSample] = field(default_factory=list)
    pingpongs: List[PingPong] = field(default_factory=list)
    evidence: List[TaskEvidence] = field(default_factory=list)      # escalated raw evidence

    _KEYS = ("summaries", "waits", "signals", "clock_samples", "pingpongs", "evidence")
    _REQUIRED = _KEYS[:5]          # (a container without escalated evidence has no .evidence)

    @classmethod
    def of(cls, records: Any) -> "RecordSet":
        if records is None:
            return cls()
        if isinstance(records, RecordSet):
            return records
        if isinstance(records, Mapping):
            return cls(*[list(records.get(k, ())) for k in cls._KEYS])
        if all(hasattr(records, k) for k in cls._REQUIRED):
            return cls(*[list(getattr(records, k, ())) for k in cls._KEYS])
        rs = cls()
        for r in records:
            rs.add(r)
        return rs

    def add(self, r) -> None:
        name = RECORD_LISTS.get(type(r))
        if name is None:
            raise TypeError(f"not a collector record: {type(r).__name__}")
        getattr(self, name).append(r)

    def __iter__(self):
        for k in self._KEYS:
            yield from getattr(self, k)

    def __len__(self) -> int:
        return sum(len(getattr(self, k)) for k in self._KEYS)


@dataclass(frozen=True)
class RankInfo:
    """Where a rank ran (resource attributes of its spans)."""
    host: str = "unknown"
    gpu: Optional[int] = None


@dataclass(frozen=True)
class TaskSlice:
    """One task run from a full task trace: `begin_ns`/`end_ns` on the rank's device
    clock; `args` the task's identity (task_index, step, layer, tile, slot, expert...)."""
    worker: int
    name: str
    begin_ns: int
    end_ns: int
    args: Mapping[str, Any] = field(default_factory=dict)


@dataclass
class TaskTrace:
    """One rank's full task trace (sim `SimResult.trace` or the GPU trace ring), with
    optional queue depth samples `(worker, ts_ns, depth)` (worker -1: the dynamic queue)
    and step boundaries `(step, begin_ns, end_ns)`."""
    rank: int
    workers: int
    slices: List[TaskSlice] = field(default_factory=list)
    queue_depth: List[Tuple[int, int, int]] = field(default_factory=list)
    steps: List[Tuple[int, int, int]] = field(default_factory=list)
    sms: Dict[int, int] = field(default_factory=dict)   # worker -> SM, when known


@dataclass(frozen=True)
class RawEvidence:
    """An escalated raw evidence record (budgeted, shipped when a summary predicate
    fired): becomes a child span of its rank's step span and a slice in Perfetto."""
    rank: int
    step: int
    name: str
    begin_ns: int               # device clock of `rank`
    end_ns: int
    attributes: Mapping[str, Any] = field(default_factory=dict)


@dataclass
class ExportBatch:
    result: Dict[str, Any]
    records: RecordSet
    clock: ClockModel
    names: Names
    job_id: str = "local"
    service_name: str = "dtrace_mk"
    rank_info: Dict[int, RankInfo] = field(default_factory=dict)
    task_traces: Dict[int, TaskTrace] = field(default_factory=dict)
    evidence: List[RawEvidence] = field(default_factory=list)
    #: added to the aligned clock to get Unix time when the hosts' clock is not
    #: CLOCK_REALTIME (the MPI transport uses time.monotonic_ns(): the collector records
    #: `time.time_ns() - time.monotonic_ns()` as the result's "wall_offset_ns")
    wall_offset_ns: int = 0

    @property
    def summaries(self) -> List[EpochSummary]:
        return self.records.summaries

    @property
    def waits(self) -> List[RemoteWait]:
        return self.records.waits

    @property
    def signals(self) -> List[Signal]:
        return self.records.signals

    def ranks(self) -> List[int]:
        rs = {s.rank for s in self.summaries} | {w.rank for w in self.waits} | \
             {s.rank for s in self.signals} | set(self.task_traces) | set(self.rank_info)
        rs |= {f["rank"] for f in self.result.get("findings", ())}
        return sorted(rs)

    def info(self, rank: int) -> RankInfo:
        return self.rank_info.get(rank, RankInfo())

    def to_unix_ns(self, rank: int, device_ns: int) -> int:
        """One device time of `rank` -> integer ns on the aligned clock (see module doc).
        Record times are converted in bulk on first use (vectorised per rank)."""
        tm = self.__dict__.get("_time_map")
        if tm is None:
            tm = self.__dict__["_time_map"] = self._record_times()
        v = tm.get((rank, device_ns))
        if v is None:
            v = int(self.clock.origin_ns) + int(round(float(self.clock.to_global(rank, int(device_ns))))) \
                + self.wall_offset_ns
        return v

    def to_unix_many(self, rank: int, device_ns) -> np.ndarray:
        """Vectorised `to_unix_ns` (int64 array)."""
        d = np.asarray(device_ns, dtype=np.int64)
        if d.size == 0:
            return np.zeros(0, dtype=np.int64)
        g = np.asarray(self.clock.to_global(rank, d), dtype=np.float64)
        return np.rint(g).astype(np.int64) + np.int64(self.clock.origin_ns + self.wall_offset_ns)

    def _record_times(self) -> Dict[Tuple[int, int], int]:
        per: Dict[int, set] = {}
        for s in self.summaries:
            per.setdefault(s.rank, set()).update((s.begin_ns, s.end_ns))
        for w in self.waits:
            per.setdefault(w.rank, set()).update((w.wait_begin_ns, w.wait_end_ns))
        for s in self.signals:
            per.setdefault(s.rank, set()).add(s.signal_ns)
        for e in self.evidence:
            per.setdefault(e.rank, set()).update((e.begin_ns, e.end_ns))
        out: Dict[Tuple[int, int], int] = {}
        for r, ts in per.items():
            arr = sorted(ts)
            for t, v in zip(arr, self.to_unix_many(r, arr).tolist()):
                out[(r, t)] = v
        return out

    def aligned_to_unix_ns(self, aligned_ns: float) -> int:
        return int(self.clock.origin_ns) + int(round(aligned_ns)) + self.wall_offset_ns

    def looks_like_unix_time(self) -> bool:
        """False when span times would land before 2001 (a monotonic host clock and no
        wall_offset_ns): backends then show (or drop) them as decades old."""
        s = self.summaries[0] if self.summaries else None
        if s is None:
            return True
        return self.to_unix_ns(s.rank, s.begin_ns) > 10 ** 18

    def summary_index(self) -> Dict[Tuple[int, int], EpochSummary]:
        """(rank, epoch) -> summary (cached; rebuilt when the summaries list changes size)."""
        cache = self.__dict__.get("_summary_index")
        if cache is None or cache[0] != len(self.summaries):
            cache = (len(self.summaries), {(s.rank, s.epoch): s for s in self.summaries})
            self.__dict__["_summary_index"] = cache
        return cache[1]

    def coverage(self, rank: int, step: int) -> Coverage:
        s = self.summary_index().get((rank, step))
        return s.coverage if s is not None else Coverage()


def merge_wait_tiles(waits: Iterable[RemoteWait]) -> List[Tuple[Tuple[int, int, int, int], RemoteWait, int, int, int]]:
    """The tiles of one remote wait (same comm_op, comm_gen, sender, receiver) as one wait:
    (key, first tile, earliest begin, latest end, tile count), sorted by key."""
    merged: Dict[Tuple[int, int, int, int], List[Any]] = {}
    for w in waits:
        k = (w.comm_op, w.comm_gen, w.peer, w.rank)
        m = merged.get(k)
        if m is None:
            merged[k] = [w, w.wait_begin_ns, w.wait_end_ns, 1]
        else:
            m[1], m[2], m[3] = min(m[1], w.wait_begin_ns), max(m[2], w.wait_end_ns), m[3] + 1
    return [(k, *v) for k, v in sorted(merged.items())]


def evidence_of(records: Iterable[TaskEvidence], names: Names) -> List[RawEvidence]:
    """The escalated TaskEvidence records as the exporters' RawEvidence: named by class,
    layer and tile, the identity and the reason in the attributes."""
    out = []
    for e in records:
        cls = names.task_class(e.task_class)
        coords = [(e.tile >> s) & 0xFFFF for s in (0, 16, 32, 48)]     # x | y<<16 | z<<32 | w<<48
        while len(coords) > 1 and coords[-1] == 0:
            coords.pop()
        tile = ",".join(map(str, coords))
        layer = f" L{e.layer}" if e.layer != 0xFFFFFFFF else ""
        out.append(RawEvidence(e.rank, e.step, f"{cls}{layer} tile {tile}", e.begin_ns, e.end_ns,
                               {"class": cls, "layer": e.layer, "tile": tile, "task_index": e.task_index,
                                "worker": e.worker, "reason": REASON_NAMES.get(e.reason, str(e.reason))}))
    return out


def build_batch(result: Mapping[str, Any], records: Any = None, *, job_id: Optional[str] = None,
                service_name: str = "dtrace_mk",
                rank_info: Optional[Mapping[int, RankInfo]] = None,
                names: Optional[Names] = None,
                task_traces: Union[Mapping[int, TaskTrace], Sequence[TaskTrace], None] = None,
                evidence: Iterable[RawEvidence] = (),
                window_ns: int = DEFAULT_WINDOW_NS,
                wall_offset_ns: Optional[int] = None) -> ExportBatch:
    """An `ExportBatch` from a diagnosis result and the records it came from.
    `wall_offset_ns` defaults to the result's "wall_offset_ns" (0 when absent)."""
    if not isinstance(result, Mapping) or "findings" not in result:
        raise ExportError("result: expected a diagnosis result (a mapping with 'findings')")
    rs = RecordSet.of(records)
    clock = build_clock_model(rs.clock_samples, rs.pingpongs, window_ns)
    if isinstance(task_traces, Mapping):
        tt = dict(task_traces)
    else:
        tt = {t.rank: t for t in (task_traces or ())}
    names = names or Names.standard()
    return ExportBatch(dict(result), rs, clock, names,
                       job_id=job_id or str(result.get("job_id") or "local"),
                       service_name=service_name, rank_info=dict(rank_info or {}),
                       task_traces=tt, evidence=list(evidence) + evidence_of(rs.evidence, names),
                       wall_offset_ns=int(wall_offset_ns if wall_offset_ns is not None
                                          else result.get("wall_offset_ns") or 0))


# ------------------------------------------------------------------------ saved results

def records_path_for(result_path: Union[str, Path]) -> Path:
    """RESULT.json -> RESULT.records.msgpack (beside it)."""
    p = Path(result_path)
    stem = p.name[:-len(".json")] if p.name.endswith(".json") else p.name
    return p.with_name(stem + RECORDS_SUFFIX)


def save_records(path: Union[str, Path], records: Any) -> Path:
    p = Path(path)
    p.write_bytes(pack_stream(RecordSet.of(records)))
    return p


def load_records(path: Union[str, Path]) -> RecordSet:
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as e:
        raise ExportError(f"{p}: cannot read records ({e.strerror})") from None
    rs = RecordSet()
    try:
        for r in unpack_stream(data):
            rs.add(r)
    except RecordError as e:
        raise ExportError(f"{p}: {e}") from None
    except ValueError as e:   # msgpack: truncated or not msgpack
        raise ExportError(f"{p}: not a records stream ({e})") from None
    return rs


def save_result(path: Union[str, Path], result: Mapping[str, Any], records: Any = None) -> Path:
    """Write RESULT.json (and RESULT.records.msgpack when records are given)."""
    p = Path(path)
    p.write_text(json.dumps(result, indent=2, sort_keys=False) + "\n")
    if records is not None:
        save_records(records_path_for(p), records)
    return p


def load_result(path: Union[str, Path]) -> Dict[str, Any]:
    p = Path(path)
    try:
        res = json.loads(p.read_text())
    except OSError as e:
        raise ExportError(f"{p}: cannot read result ({e.strerror})") from None
    except json.JSONDecodeError as e:
        raise ExportError(f"{p}:{e.lineno}:{e.colno}: not JSON ({e.msg})") from None
    if not isinstance(res, dict) or "findings" not in res:
        raise ExportError(f"{p}: not a diagnosis result (no 'findings')")
    return res
