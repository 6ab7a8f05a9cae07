"""Join remote waits to the signals that released them by a *logical* key.

The key is `(comm_op, comm_gen, sender, receiver)`: a `RemoteWait` on rank r for peer p
matches the `Signal`s that rank p sent to rank r for the same `(comm_op, comm_gen)`.
Timestamps never take part in the join, so clock error cannot mis-pair records.

A communication op may be tiled: one key may carry several signals (the remote event's
counter reaches its target with the last one) and several waits (one per waiting tile).
Signals of one key are grouped (`SignalGroup`: count, first and last signal time); every
wait of the key joins the group.  The release of the remote event is the *last* signal.

What cannot be joined is counted, never dropped silently: waits with no signal (the
sender's record was lost, or the sender is dead), signals with no wait (normal: the data
was there before anyone waited, so no wait was recorded).  Ranks in `expected_ranks` that
contributed no record at all are reported as missing.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Set, Tuple

from .records import RemoteWait, Signal

Key = Tuple[int, int, int, int]   # (comm_op, comm_gen, sender, receiver)


def wait_key(w: RemoteWait) -> Key:
    return (w.comm_op, w.comm_gen, w.peer, w.rank)


def signal_key(s: Signal) -> Key:
    return (s.comm_op, s.comm_gen, s.rank, s.peer)


@dataclass(slots=True)
class SignalGroup:
    key: Key
    count: int
    first_ns: int
    last_ns: int
    step: int
    layer: int

    @property
    def sender(self) -> int:
        return self.key[2]


@dataclass
class JoinResult:
    pairs: List[Tuple[RemoteWait, SignalGroup]] = field(default_factory=list)
    unmatched_waits: List[RemoteWait] = field(default_factory=list)
    unmatched_signals: int = 0
    signals: int = 0
    waits: int = 0
    missing_ranks: List[int] = field(default_factory=list)
    groups: Dict[Key, SignalGroup] = field(default_factory=dict)

    def unmatched_by_peer(self) -> Dict[int, int]:
        out: Dict[int, int] = {}
        for w in self.unmatched_waits:
            out[w.peer] = out.get(w.peer, 0) + 1
        return out

    def report(self) -> Dict[str, object]:
        return {"waits": self.waits, "signals": self.signals, "joined_waits": len(self.pairs),
                "unmatched_waits": len(self.unmatched_waits),
                "unmatched_waits_by_peer": {str(k): v for k, v in
                                            sorted(self.unmatched_by_peer().items())},
                "unmatched_signals": self.unmatched_signals,
                "missing_ranks": list(self.missing_ranks)}


def group_signals(signals: Iterable[Signal]) -> Dict[Key, SignalGroup]:
    groups: Dict[Key, SignalGroup] = {}
    get = groups.get
    for s in signals:
        k = (s.comm_op, s.comm_gen, s.rank, s.peer)
        g = get(k)
        if g is None:
            groups[k] = SignalGroup(k, 1, s.signal_ns, s.signal_ns, s.step, s.layer)
        else:
            g.count += 1
            if s.signal_ns < g.first_ns:
                g.first_ns = s.signal_ns
            if s.signal_ns > g.last_ns:
                g.last_ns = s.signal_ns
    return groups


def join(waits: Iterable[RemoteWait], signals: Iterable[Signal],
         expected_ranks: Optional[Iterable[int]] = None,
         present_ranks: Optional[Iterable[int]] = None) -> JoinResult:
    """Join waits to signal groups by logical key.

    `present_ranks`: ranks that sent anything at all (summaries included); defaults to
    the ranks seen in `waits` and `signals`.  `expected_ranks` minus those is missing.
    """
    groups = group_signals(signals)
    res = JoinResult(signals=sum(g.count for g in groups.values()), groups=groups)
    used: Set[Key] = set()
    seen: Set[int] = set()
    get, pairs, unmatched, use = groups.get, res.pairs, res.unmatched_waits, used.add
    n = 0
    for w in waits:
        n += 1
        k = (w.comm_op, w.comm_gen, w.peer, w.rank)
        g = get(k)
        if g is None:
            unmatched.append(w)
        else:
            pairs.append((w, g))
            use(k)
    res.waits = n
    seen.update(k[3] for k in used)
    seen.update(w.rank for w in unmatched)
    res.unmatched_signals = sum(g.count for k, g in groups.items() if k not in used)
    seen.update(k[2] for k in groups)
    if expected_ranks is not None:
        present = set(present_ranks) if present_ranks is not None else seen
        res.missing_ranks = sorted(set(expected_ranks) - present)
    return res
