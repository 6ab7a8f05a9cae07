"""The summary query's task half, reduced per epoch: from the host's map dictionaries
(`parts_of_entries`, one epoch's entries) or, for a device summary window, from its maps
as arrays (`WindowTasks`, every epoch of the window at once).  Both give the same
`TaskParts`; the agent (runtime/agent.py `_summary`) makes the EpochSummary from them.

Why two: a device window holds ~600 entries per step of 1b (a @queue_max entry per
worker, an @end_ts / @ready_ts entry per event), and the per-entry Python of the
dictionary form (a key tuple, a value unpack, a dict per step) took ~1-2 ms per step on
the GPU machine's host -- as long as the kernel's step, so the host paced the kernel.
The array form does the same reductions with numpy over the window's raw keys and values
(the maps' insertion order kept wherever it decides a tie).

The reductions (monitors/summary_tasks.d names the maps), per epoch k:
  classes      class -> [count, sum, max of @dur, @dispatch_wait, @dep_wait, notification
               lag]; the lag: per event with a local @ready_ts, ready minus the last
               producer end (@end_ts's largest; on a tie the first entry), when the
               ready is later, charged to that producer's class (a class gets a row
               only from an entry or a positive lag)
  end          the largest @end_ts of the epoch (None: no entry)
  qmax, qworker  the deepest @queue_max and its worker (on a tie the lowest worker)
  experts      @expert_ns per expert below MAX_EXPERTS, as a tuple from expert 0
  t_begin      @t_begin's value (None: no entry)
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Tuple

import numpy as np

from ..collectors.records import MAX_EXPERTS

U64 = (1 << 64) - 1
_STATS = struct.Struct("<4Q")                # @dur's stats(): count, sum, min, max
_WORD = struct.Struct("<Q")                  # every other task-half value: one u64


@dataclass
class TaskParts:
    classes: Dict[int, List[int]] = field(default_factory=dict)   # class -> [n, sum, max, disp, dep, lag]
    end: Optional[int] = None
    qmax: int = 0
    qworker: int = 0
    experts: Tuple[int, ...] = ()
    t_begin: Optional[int] = None


def _row(classes: Dict[int, List[int]], c: int) -> List[int]:
    r = classes.get(c)
    if r is None:
        r = classes[c] = [0, 0, 0, 0, 0, 0]
    return r


def parts_of_entries(k: int, snap) -> TaskParts:
    """TaskParts of epoch k from {map name: {key words: value bytes}} (entries of other
    epochs are skipped)."""
    w1 = _WORD.unpack_from
    p = TaskParts()
    for (step, c), v in snap["dur"].items():
        if step == k:
            n, s, _mn, mx = _STATS.unpack_from(v)
            r = _row(p.classes, c)
            r[0], r[1], r[2] = n, s, mx
    for name, i in (("dispatch_wait", 3), ("dep_wait", 4)):
        for (step, c), v in snap[name].items():
            if step == k:
                _row(p.classes, c)[i] = w1(v)[0]
    last_end: Dict[int, Tuple[int, int]] = {}
    for (step, ev, c), v in snap["end_ts"].items():
        if step == k:
            t = w1(v)[0]
            if ev not in last_end or t > last_end[ev][0]:
                last_end[ev] = (t, c)
    for (step, ev), v in snap["ready_ts"].items():
        if step == k and ev in last_end:
            t_ready = w1(v)[0]
            t_end, c = last_end[ev]
            if t_ready != U64 and t_ready > t_end:
                _row(p.classes, c)[5] += t_ready - t_end
    for (step, w), v in snap["queue_max"].items():
        if step == k:
            d = w1(v)[0]
            if d > p.qmax or (d == p.qmax and w < p.qworker):
                p.qmax, p.qworker = d, w
    experts: Dict[int, int] = {}
    for (step, e), v in snap["expert_ns"].items():
        if step == k and e < MAX_EXPERTS:
            experts[e] = w1(v)[0]
    p.experts = tuple(experts.get(e, 0) for e in range(max(experts) + 1)) if experts else ()
    tb = snap["t_begin"].get((k,))
    p.t_begin = w1(tb)[0] if tb is not None else None
    p.end = max((t for t, _ in last_end.values()), default=None)
    return p


def map_arrays(m, key_words: int, value_words: int) -> Tuple[np.ndarray, np.ndarray]:
    """A host hash map's entries (insertion order) as uint64 arrays keys (n, key_words)
    and values (n, value_words)."""
    keys, values = m.raw_entries()
    n = len(keys) // (8 * key_words)
    return (np.frombuffer(keys, "<u8").reshape(n, key_words),
            np.frombuffer(values, "<u8").reshape(n, value_words))


def _firsts(*cols: np.ndarray) -> np.ndarray:
    """Indices where the sorted columns' tuple changes (each group's first row)."""
    n = len(cols[0])
    if not n:
        return np.zeros(0, np.int64)
    new = np.zeros(n, bool)
    new[0] = True
    for c in cols:
        new[1:] |= c[1:] != c[:-1]
    return np.flatnonzero(new)


class WindowTasks:
    """The task half's maps of one device summary window (a host MapSet read from the
    device), epochs first .. end-1, reduced for every epoch at once.  key_words: each
    task-half map's key width in u64 words (the agent's SUMMARY_MAPS)."""

    def __init__(self, maps, first: int, end: int, key_words: Mapping[str, int]):
        a: Dict[str, Tuple[np.ndarray, np.ndarray]] = {}
        self.entries = 0
        for name, kw in key_words.items():
            K, V = map_arrays(maps[name], kw, _STATS.size // 8 if name == "dur" else 1)
            keep = (K[:, 0] >= first) & (K[:, 0] < end)
            a[name] = (K[keep], V[keep])
            self.entries = max(self.entries, int(keep.sum()))
        self.parts: Dict[int, TaskParts] = {}
        self._last_end = self._winners(*a["end_ts"])
        self._classes(a)
        self._lag(a["ready_ts"])
        self._queue(*a["queue_max"])
        self._experts(*a["expert_ns"])
        K, V = a["t_begin"]
        for k, t in zip(K[:, 0].tolist(), V[:, 0].tolist()):
            self._p(k).t_begin = t

    def _p(self, k: int) -> TaskParts:
        p = self.parts.get(k)
        if p is None:
            p = self.parts[k] = TaskParts()
        return p

    def of(self, k: int) -> TaskParts:
        return self.parts.get(k) or TaskParts()

    def local_end(self) -> Dict[Tuple[int, int], int]:
        """(step, event) -> the last local task:end of its producers (agent._drain_evidence)."""
        steps, evs, ts, _cs = self._last_end
        return dict(zip(zip(steps.tolist(), evs.tolist()), ts.tolist()))

    @staticmethod
    def _winners(K: np.ndarray, V: np.ndarray):
        """Per (step, event) of @end_ts: the largest end and its class (the first entry on
        a tie).  Arrays steps, events, ends, classes sorted by (step, event)."""
        t = V[:, 0]
        order = np.lexsort((np.arange(len(t)), ~t, K[:, 1], K[:, 0]))   # ~t: largest first
        s, e = K[order, 0], K[order, 1]
        f = _firsts(s, e)
        return s[f], e[f], t[order][f], K[order, 2][f]

    def _classes(self, a) -> None:
        K, V = a["dur"]
        for k, c, n, s, mx in zip(K[:, 0].tolist(), K[:, 1].tolist(), V[:, 0].tolist(), V[:, 1].tolist(),
                                  V[:, 3].tolist()):
            r = _row(self._p(k).classes, c)
            r[0], r[1], r[2] = n, s, mx
        for name, i in (("dispatch_wait", 3), ("dep_wait", 4)):
            K, V = a[name]
            for k, c, v in zip(K[:, 0].tolist(), K[:, 1].tolist(), V[:, 0].tolist()):
                _row(self._p(k).classes, c)[i] = v
        steps, _evs, ts, _cs = self._last_end
        if len(steps):                                   # each epoch's end: its largest @end_ts
            f = _firsts(steps)
            for k, t in zip(steps[f].tolist(), np.maximum.reduceat(ts, f).tolist()):
                self._p(k).end = t

    def _lag(self, ready) -> None:
        steps, evs, ts, cs = self._last_end
        K, V = ready
        # (step, event) -> index of its @end_ts winner; one dict lookup per @ready_ts entry
        winner = {se: i for i, se in enumerate(zip(steps.tolist(), evs.tolist()))}
        for k, ev, t_ready in zip(K[:, 0].tolist(), K[:, 1].tolist(), V[:, 0].tolist()):
            i = winner.get((k, ev))
            if i is not None and t_ready != U64 and t_ready > int(ts[i]):
                _row(self._p(k).classes, int(cs[i]))[5] += t_ready - int(ts[i])

    def _queue(self, K: np.ndarray, V: np.ndarray) -> None:
        d = V[:, 0]
        order = np.lexsort((K[:, 1], ~d, K[:, 0]))      # per step: deepest, then lowest worker
        f = _firsts(K[order, 0])
        for k, dm, w in zip(K[order, 0][f].tolist(), d[order][f].tolist(), K[order, 1][f].tolist()):
            if dm > 0:                                   # (all 0: depth 0 at worker 0, as parts_of_entries)
                p = self._p(k)
                p.qmax, p.qworker = dm, w

    def _experts(self, K: np.ndarray, V: np.ndarray) -> None:
        got: Dict[int, Dict[int, int]] = {}
        for k, e, v in zip(K[:, 0].tolist(), K[:, 1].tolist(), V[:, 0].tolist()):
            if e < MAX_EXPERTS:
                got.setdefault(k, {})[e] = v
        for k, ex in got.items():
            self._p(k).experts = tuple(ex.get(e, 0) for e in range(max(ex) + 1))
