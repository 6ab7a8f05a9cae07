"""Fixed-layout records that per-rank agents ship to the collector.

Every record is a flat tuple on the wire, packed with msgpack:

    [tag, version, field_0, field_1, ...]

`tag` names the record type (one small int), `version` is `RECORD_VERSION`.  Fields are
integers (nanoseconds, ids, counts) or, for the summary's variable parts, tuples whose
length is bounded by a constant below; so every record has a hard upper bound on its
packed size (`max_packed_size(type)`), which the agent uses to size its send buffers and
the evidence budget.

Ids, not names: `task_class` and `comm_op` are ids from the task schema
(`dtrace_mk.abi.schema`); the collector turns them into names only when it writes a
result.

Times: `*_ns` fields are the device clock (`%globaltimer`) of the rank that recorded
them, except `ClockSample.host_ns` (that rank's host clock).  The collector maps device
times to one aligned clock (`collectors.clock`).

The record types:

* `EpochSummary`  — one per rank per epoch (an epoch is one decode step in the default
  summary monitors): per task class count/sum/max duration, dispatch wait (ready ->
  dispatch), local dependency wait (dep:wait -> dep:release, local events only: waits on
  remote events are `RemoteWait`s), notification lag (the task:end of the producer whose
  trigger completed an event -> that event's dep:release, attributed to the producer's
  class, one sample per event); queue depth maximum and the worker that hit it; per
  expert task counts; remote wait totals; coverage of the monitors that produced it.
* `RemoteWait`    — a task on `rank` waited on a remote event signalled by `peer` for
  `(comm_op, comm_gen)`.
* `Signal`        — `rank` (the sender) signalled `peer` (the receiver) for
  `(comm_op, comm_gen)` at `signal_ns`.
* `ClockSample`   — a simultaneous reading of `rank`'s device clock and its host clock.
* `PingPong`      — one host-to-host round trip measured by the collector's host against
  `rank`'s host: `t0_ns`, `t1_ns` on the collector's host clock, `t_remote_ns` on the
  rank's host clock.
* `TaskEvidence`  — escalated raw evidence: one task run (its identity, worker, begin and
  end) that the agent held for its epoch and shipped because a summary predicate fired on
  that epoch (`reason`: a slow step, or its class's outlier; runtime/agent.py "Escalated
  evidence"); epochs whose predicates do not fire ship none.
"""
from __future__ import annotations

from dataclasses import dataclass, fields as dc_fields
from typing import Any, ClassVar, Dict, Iterable, Iterator, List, Tuple, Type, Union

import msgpack

from ..errors import UserError

RECORD_VERSION = 1

#: Bounds that make every record fixed-size in the worst case.
MAX_TASK_CLASSES = 32
MAX_EXPERTS = 64
MAX_RANKS = 4096

# The largest msgpack encoding of one integer (uint64 / int64): 1 type byte + 8.
_INT_MAX_BYTES = 9
# An array header: fixarray up to 15 entries (1 byte), array16 (3 bytes).
_ARRAY_HDR_MAX = 3


class RecordError(UserError):
    """A record that cannot be decoded: wrong tag, version, arity or bound."""


# Per task class entry inside a summary: (class_id, count, dur_sum_ns, dur_max_ns,
# dispatch_wait_sum_ns, dep_wait_sum_ns, notify_lag_sum_ns)
CLASS_STAT_FIELDS = ("task_class", "count", "dur_sum_ns", "dur_max_ns",
                     "dispatch_wait_sum_ns", "dep_wait_sum_ns", "notify_lag_sum_ns")


@dataclass(frozen=True)
class ClassStat:
    task_class: int
    count: int = 0
    dur_sum_ns: int = 0
    dur_max_ns: int = 0
    dispatch_wait_sum_ns: int = 0
    dep_wait_sum_ns: int = 0
    notify_lag_sum_ns: int = 0

    def as_tuple(self) -> Tuple[int, ...]:
        return (self.task_class, self.count, self.dur_sum_ns, self.dur_max_ns,
                self.dispatch_wait_sum_ns, self.dep_wait_sum_ns, self.notify_lag_sum_ns)


@dataclass(frozen=True)
class Coverage:
    eligible: int = 0
    executed: int = 0
    throttled: int = 0
    lost: int = 0

    def __add__(self, other: "Coverage") -> "Coverage":
        return Coverage(self.eligible + other.eligible, self.executed + other.executed,
                        self.throttled + other.throttled, self.lost + other.lost)

    def as_dict(self) -> Dict[str, int]:
        return {"eligible": self.eligible, "executed": self.executed,
                "throttled": self.throttled, "lost": self.lost}

    @property
    def consistent(self) -> bool:
        return self.eligible == self.executed + self.throttled + self.lost

    @property
    def seen_fraction(self) -> float:
        """executed / eligible (1.0 when nothing was eligible)."""
        return 1.0 if self.eligible == 0 else self.executed / self.eligible


class _Record:
    TAG: ClassVar[int]
    _NAMES: ClassVar[Tuple[str, ...]] = ()
    _FLAT: ClassVar[bool] = True      # all fields are integers

    def to_wire(self) -> Tuple[Any, ...]:
        head = (self.TAG, RECORD_VERSION)
        if self._FLAT:
            return head + tuple([getattr(self, n) for n in self._NAMES])
        return head + tuple([_to_wire(getattr(self, n)) for n in self._NAMES])

    @classmethod
    def from_fields(cls, values: List[Any]):
        return cls(*values)


def _to_wire(v):
    if isinstance(v, Coverage):
        return (v.eligible, v.executed, v.throttled, v.lost)
    if isinstance(v, tuple):
        return tuple(x.as_tuple() if isinstance(x, ClassStat) else x for x in v)
    return v


@dataclass(frozen=True)
class EpochSummary(_Record):
    TAG: ClassVar[int] = 1
    rank: int
    epoch: int
    begin_ns: int                      # device clock, first hook of the epoch
    end_ns: int                        # device clock, last hook of the epoch
    classes: Tuple[ClassStat, ...] = ()
    queue_depth_max: int = 0
    queue_depth_worker: int = 0        # the worker whose queue hit the maximum
    expert_counts: Tuple[int, ...] = ()  # tasks per expert (index = expert id)
    remote_wait_count: int = 0
    remote_wait_sum_ns: int = 0
    remote_wait_max_ns: int = 0
    coverage: Coverage = Coverage()

    def __post_init__(self):
        if len(self.classes) > MAX_TASK_CLASSES:
            raise RecordError(f"EpochSummary rank {self.rank} epoch {self.epoch}: "
                              f"{len(self.classes)} task classes (at most {MAX_TASK_CLASSES})")
        if len(self.expert_counts) > MAX_EXPERTS:
            raise RecordError(f"EpochSummary rank {self.rank} epoch {self.epoch}: "
                              f"{len(self.expert_counts)} experts (at most {MAX_EXPERTS})")

    @classmethod
    def from_fields(cls, values):
        (rank, epoch, b, e, classes, qmax, qw, experts, rwc, rws, rwm, cov) = values
        return cls(rank, epoch, b, e,
                   tuple(ClassStat(*c) for c in classes), qmax, qw, tuple(experts),
                   rwc, rws, rwm, Coverage(*cov))

    def class_stat(self, class_id: int) -> ClassStat:
        for c in self.classes:
            if c.task_class == class_id:
                return c
        return ClassStat(class_id)

    @property
    def step_ns(self) -> int:
        return self.end_ns - self.begin_ns


@dataclass(frozen=True)
class RemoteWait(_Record):
    TAG: ClassVar[int] = 2
    rank: int            # the waiting rank (receiver)
    peer: int            # the rank expected to signal (sender)
    comm_op: int
    comm_gen: int
    step: int
    layer: int
    task_class: int
    wait_begin_ns: int
    wait_end_ns: int


@dataclass(frozen=True)
class Signal(_Record):
    TAG: ClassVar[int] = 3
    rank: int            # sender
    peer: int            # receiver
    comm_op: int
    comm_gen: int
    step: int
    layer: int
    signal_ns: int


@dataclass(frozen=True)
class ClockSample(_Record):
    TAG: ClassVar[int] = 4
    rank: int
    device_ns: int
    host_ns: int


@dataclass(frozen=True)
class PingPong(_Record):
    TAG: ClassVar[int] = 5
    rank: int            # the remote rank whose host answered
    t0_ns: int           # collector host clock, request sent
    t_remote_ns: int     # remote host clock, reply stamped
    t1_ns: int           # collector host clock, reply received


#: TaskEvidence.reason: why its epoch's evidence was escalated
REASON_SLOW_STEP = 1          # the step took much longer than the rank's recent steps
REASON_CLASS_OUTLIER = 2      # a task of its class took much longer than the class's mean
REASON_NAMES = {REASON_SLOW_STEP: "slow_step", REASON_CLASS_OUTLIER: "class_outlier"}


@dataclass(frozen=True)
class TaskEvidence(_Record):
    TAG: ClassVar[int] = 6
    rank: int
    step: int
    task_class: int
    layer: int
    tile: int
    task_index: int
    worker: int
    begin_ns: int        # device clock (task:begin = its task:end's ts - dur)
    end_ns: int
    reason: int          # REASON_*


for _t in (EpochSummary, RemoteWait, Signal, ClockSample, PingPong, TaskEvidence):
    _t._NAMES = tuple(f.name for f in dc_fields(_t))
EpochSummary._FLAT = False

Record = Union[EpochSummary, RemoteWait, Signal, ClockSample, PingPong, TaskEvidence]
RECORD_TYPES: Dict[int, Type[_Record]] = {
    t.TAG: t for t in (EpochSummary, RemoteWait, Signal, ClockSample, PingPong, TaskEvidence)}

# Which list of a record container (collectors.diagnose.Accumulator,
# exporters.batch.RecordSet) holds each record type.
RECORD_LISTS: Dict[Type[_Record], str] = {EpochSummary: "summaries", RemoteWait: "waits", Signal: "signals",
                                          ClockSample: "clock_samples", PingPong: "pingpongs",
                                          TaskEvidence: "evidence"}


def max_packed_size(rtype: Type[_Record]) -> int:
    """Upper bound on `len(pack(r))` for any valid record of `rtype`."""
    n_scalar = len(dc_fields(rtype)) + 2          # + tag, version
    if rtype is EpochSummary:
        n_scalar -= 3                              # classes, experts, coverage are arrays
        size = _ARRAY_HDR_MAX + n_scalar * _INT_MAX_BYTES
        size += _ARRAY_HDR_MAX + MAX_TASK_CLASSES * (1 + len(CLASS_STAT_FIELDS) * _INT_MAX_BYTES)
        size += _ARRAY_HDR_MAX + MAX_EXPERTS * _INT_MAX_BYTES
        size += 1 + 4 * _INT_MAX_BYTES
        return size
    return 1 + n_scalar * _INT_MAX_BYTES


def pack(record: Record) -> bytes:
    return msgpack.packb(record.to_wire(), use_bin_type=True)


def unpack(data: bytes) -> Record:
    try:
        wire = msgpack.unpackb(data, raw=False, use_list=True, strict_map_key=True)
    except Exception as e:  # msgpack raises several types for bad input
        raise RecordError(f"record: not msgpack ({type(e).__name__}: {e})") from None
    return from_wire(wire)


def from_wire(wire) -> Record:
    if not isinstance(wire, (list, tuple)) or len(wire) < 2:
        raise RecordError(f"record: expected [tag, version, ...], got {type(wire).__name__}")
    tag, version = wire[0], wire[1]
    rtype = RECORD_TYPES.get(tag)
    if rtype is None:
        raise RecordError(f"record: unknown tag {tag!r}")
    if version != RECORD_VERSION:
        raise RecordError(f"{rtype.__name__}: version {version!r}, this collector reads "
                          f"version {RECORD_VERSION}")
    n = len(dc_fields(rtype))
    if len(wire) - 2 != n:
        raise RecordError(f"{rtype.__name__}: {len(wire) - 2} fields, expected {n}")
    try:
        return rtype.from_fields(list(wire[2:]))
    except RecordError:
        raise
    except (TypeError, ValueError) as e:
        raise RecordError(f"{rtype.__name__}: malformed fields ({e})") from None


def pack_stream(records: Iterable[Record]) -> bytes:
    """Concatenate packed records (msgpack streams are self-delimiting)."""
    return b"".join(pack(r) for r in records)


def unpack_stream(data: bytes) -> Iterator[Record]:
    unpacker = msgpack.Unpacker(raw=False, use_list=True)
    unpacker.feed(data)
    for wire in unpacker:
        yield from_wire(wire)


@dataclass(frozen=True)
class Names:
    """Id -> name tables for record fields (from the task schema).  Ids index the tuples."""
    task_classes: Tuple[str, ...]
    comm_ops: Tuple[str, ...]

    @classmethod
    def standard(cls) -> "Names":
        from ..abi.schema import STANDARD_COMM_OPS, STANDARD_TASK_CLASSES
        return cls(tuple(c[0] for c in STANDARD_TASK_CLASSES), tuple(STANDARD_COMM_OPS))

    @classmethod
    def from_schema(cls, schema) -> "Names":
        """From a `dtrace_mk.abi.schema` schema object (task_classes / comm_ops lists)."""
        return cls(tuple(c.name for c in schema.task_classes),
                   tuple(getattr(o, "name", o) for o in schema.comm_ops))

    def task_class(self, i: int) -> str:
        return self.task_classes[i] if 0 <= i < len(self.task_classes) else f"class#{i}"

    def comm_op(self, i: int) -> str:
        return self.comm_ops[i] if 0 <= i < len(self.comm_ops) else f"op#{i}"

    def task_class_id(self, name: str) -> int:
        return self.task_classes.index(name)

    def comm_op_id(self, name: str) -> int:
        return self.comm_ops.index(name)
