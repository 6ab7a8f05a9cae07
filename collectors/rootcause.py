"""Scalasca-style delay analysis: follow remote stalls upstream to their root rank.

A stalled wait `w` (receiver r, sender p) was caused by p arriving late at its signal.
The *synchronization interval* on p is `(t0, S)`: from the last point both ranks share to
the release S.  The last shared point is the later of: p's latest wait on r before S
(its end; its begin when r was late there, since r's delayed signal is then what p may
pass on: r ran ahead and waits on p now) and p's previous signal to r (both excluding the
same (comm_op, comm_gen)); the second matters when r never signals p (ring or pipeline
topologies).  Inside it, p may itself have waited on other ranks; the late-sender parts of
those waits (clipped to the interval), summed, are p's *indirect* delay `I`.  Of the
late-sender time `late(w)`, the fraction `f = min(I, late(w)) / late(w)` is indirect and
the rest direct (a wait still running when the late signal left does not count: it ran
on another worker; CONCURRENT_SLACK_NS).  The cost `amount` being explained (the observed stall, at the top) is
scaled accordingly:

    direct cost at p    = amount * late_share * (1 - f) + amount * (1 - late_share)
    indirect cost via v = amount * late_share * f * clip(v) / I     for each wait v of p

where `late_share = late(w) / stall(w)` (the part of the stall that is late sender, the rest
is excess transfer, always charged to the sender).  Indirect costs recurse into the senders
of those waits.  Times move strictly backwards along a chain, so the recursion ends; a
depth cap guards against malformed input.

Each direct cost is a `Cost` at its root rank, remembering every rank that waited on the
way (`observed_on`).  A local fault on rank r that made r late therefore yields costs
rooted at r, never at the ranks that waited.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Dict, Iterable, List, Sequence, Tuple

from .classify import AlignedWait

MAX_DEPTH = 64
MIN_AMOUNT_NS = 1.0
#: A megakernel rank is many workers at once: a wait of the sender that had not ended
#: when its late signal left ran on another worker and cannot have delayed that signal
#: (a signal that depends on a wait leaves after it).  Scalasca's one-thread-per-rank
#: model counted it, and on 2 x H200 the two ranks' concurrent waits (rank 1 late at
#: allreduce_attn while waiting at allreduce_mlp for rank 0, itself waiting on rank 1)
#: bounced the cost between the ranks until no single cost was a stall.  The slack
#: covers the causal clamp of the release (classify: <= min_latency_ns).
CONCURRENT_SLACK_NS = 2_000.0


@dataclass
class Cost:
    root: int
    step: int               # the step of the root's late signal
    comm_op: int            # the op of the root's late signal
    layer: int
    amount: float           # ns of observed waiting charged to the root
    wait: AlignedWait       # the top-level stalled wait this cost explains
    observed_on: Tuple[int, ...]   # ranks that waited on the way, nearest first
    direct: bool = True


class WaitIndex:
    """Waits per receiver sorted by end, and per (receiver, sender) ends for bisect."""

    def __init__(self, waits: Iterable[AlignedWait], signal_times=None):
        self.signal_times = signal_times or {}
        self.by_receiver: Dict[int, List[AlignedWait]] = {}
        for w in waits:
            self.by_receiver.setdefault(w.receiver, []).append(w)
        self.pair: Dict[Tuple[int, int], List[AlignedWait]] = {}
        for r, ws in self.by_receiver.items():
            ws.sort(key=lambda w: w.end)
            for w in ws:
                self.pair.setdefault((r, w.sender), []).append(w)
        self.pair_ends = {k: [w.end for w in v] for k, v in self.pair.items()}
        self.recv_ends = {r: [w.end for w in v] for r, v in self.by_receiver.items()}
        self.max_len = {r: max((w.end - w.begin for w in v), default=0.0)
                        for r, v in self.by_receiver.items()}
        self.sig_keys = {k: set(keys) for k, (_, keys) in self.signal_times.items()}
        self.passed: Dict[Tuple[int, int, int], float] = {}   # (rank, op, gen) -> wait end
        for w in waits_list(self.by_receiver):
            k = (w.receiver, w.comm_op, w.comm_gen)
            self.passed[k] = max(self.passed.get(k, w.end), w.end)

    def sync_point(self, rank: int, peer: int, before: float, exclude: Tuple[int, int]) -> float:
        """Of `rank`'s latest wait on `peer` ending before `before` (not `exclude` key): its
        end, or its begin when it had a late-sender part.  In the second case `peer` was
        itself late there, which can be what made `rank` late now (a delayed signal from
        `peer` that `peer` did not wait for: it ran ahead, and then waits on `rank`), so
        that wait's late part belongs to the interval as indirect delay.

        With more than two ranks a wait names only the sender that landed last: `rank`'s
        latest wait on a third rank in an all-reduce that `peer` also signalled `rank`
        in is a shared point too (its end: `peer`'s part had arrived by then, and `peer`
        passed the same all-reduce), so `rank`'s waiting on the third rank before it
        does not explain `rank`'s lateness to `peer` afterwards.

        Either point is no earlier than where `peer` itself passed that all-reduce (its
        own wait's end there, when recorded): `peer` ran ahead only from there on, so
        only `rank`'s waiting after it can be what `peer` passed on (a rank that started
        the step late makes everyone wait once, then all resume together)."""
        out = float("-inf")
        ws = self.pair.get((rank, peer))
        if ws:
            i = bisect.bisect_left(self.pair_ends[(rank, peer)], before) - 1
            while i >= 0:
                w = ws[i]
                if (w.comm_op, w.comm_gen) != exclude:
                    if w.late > 0.0:
                        pt = self.passed.get((peer, w.comm_op, w.comm_gen))
                        out = w.begin if pt is None else max(w.begin, min(pt, w.end))
                    else:
                        out = w.end
                    break
                i -= 1
        keys = self.sig_keys.get((peer, rank))
        if keys:
            ws = self.by_receiver.get(rank, [])
            i = bisect.bisect_left(self.recv_ends.get(rank, []), before) - 1
            while i >= 0 and ws[i].end > out:
                w = ws[i]
                k = (w.comm_op, w.comm_gen)
                if w.sender != peer and k != exclude and k in keys:
                    pt = self.passed.get((peer, w.comm_op, w.comm_gen))
                    return max(out, w.end if pt is None else min(pt, w.end))
                i -= 1
        return out

    def prev_signal(self, sender: int, receiver: int, before: float, exclude: Tuple[int, int]) -> float:
        ts = self.signal_times.get((sender, receiver))
        if not ts:
            return float("-inf")
        times, keys = ts
        i = bisect.bisect_left(times, before) - 1
        while i >= 0:
            if keys[i] != exclude:
                return times[i]
            i -= 1
        return float("-inf")

    def late_parts(self, rank: int, t0: float, t1: float, skip_key: Tuple[int, int]
                   ) -> List[Tuple[AlignedWait, float]]:
        """`rank`'s waits whose late-sender interval overlaps (t0, t1), with the overlap
        (waits of the same (comm_op, comm_gen) as the wait being explained excepted: a
        rank signals an all-reduce before it waits in it)."""
        ws = self.by_receiver.get(rank, [])
        ends = self.recv_ends.get(rank, [])
        out = []
        stop = t1 + self.max_len.get(rank, 0.0)
        for i in range(bisect.bisect_right(ends, t0), len(ws)):
            w = ws[i]
            if w.end > stop:
                break
            if w.begin >= t1:
                continue
            if (w.comm_op, w.comm_gen) == skip_key or w.late <= 0.0:
                continue
            if w.end > t1 + CONCURRENT_SLACK_NS:
                continue           # still waiting when it signalled: another worker's wait
            ov = min(w.late_end, t1) - max(w.begin, t0)
            if ov > 0.0:
                out.append((w, ov))
        return out


def waits_list(by_receiver: Dict[int, List[AlignedWait]]) -> Iterable[AlignedWait]:
    for ws in by_receiver.values():
        yield from ws


def attribute(stalled: Sequence[AlignedWait], all_waits: Sequence[AlignedWait],
              signal_times=None, max_depth: int = MAX_DEPTH) -> List[Cost]:
    """Charge each stalled wait's `stall` to root ranks (direct costs).

    `signal_times`: `classify.align_signals(...)`, (sender, receiver) -> sorted aligned
    signal times and keys; without it only waits define shared points."""
    idx = WaitIndex(all_waits, signal_times)
    out: List[Cost] = []
    for w in stalled:
        _explain(idx, w, w, w.stall if w.stall > 0 else w.late, (w.receiver,), 0, max_depth, out)
    return out


def _explain(idx: WaitIndex, top: AlignedWait, w: AlignedWait, amount: float,
             path: Tuple[int, ...], depth: int, max_depth: int, out: List[Cost]) -> None:
    if amount < MIN_AMOUNT_NS:
        return
    p, r, s = w.sender, w.receiver, w.release
    stall_len = max(w.stall, w.late)
    late_share = (w.late / stall_len) if stall_len > 0 else 0.0
    late_amount = amount * late_share
    parts: List[Tuple[AlignedWait, float]] = []
    indirect_total = 0.0
    if depth < max_depth and w.late > 0.0:
        t0 = max(idx.sync_point(p, r, s, (w.comm_op, w.comm_gen)),
                 idx.prev_signal(p, r, s, (w.comm_op, w.comm_gen)))
        parts = idx.late_parts(p, t0, s, skip_key=(w.comm_op, w.comm_gen))
        indirect_total = sum(ov for _, ov in parts)
    # the stalled wait: the part of late that is skew or the series' usual lateness
    # (`base`) is explained first by the sender's waiting in the interval; only the rest
    # of either is compared
    lex = w.late - w.base
    if depth == 0 and w.base > 0.0 and lex > 0.0:
        f = min(max(indirect_total - w.base, 0.0), lex) / lex
    else:
        f = min(indirect_total, w.late) / w.late if w.late > 0.0 else 0.0
    direct = late_amount * (1.0 - f) + (amount - late_amount)
    if direct >= MIN_AMOUNT_NS:
        out.append(Cost(p, w.sender_step, w.comm_op, w.sender_layer, direct, top, path,
                        direct=(depth == 0)))
    if f > 0.0:
        indirect = late_amount * f
        for v, ov in parts:
            _explain(idx, top, v, indirect * ov / indirect_total, path + (p,), depth + 1,
                     max_depth, out)
