"""Queries that run in a device runtime, with interval clauses exact at step boundaries.

A query attached to a device runtime (launch.device_live.DeviceQueries on a GPU rank;
summary_windows.ReferenceDevice, its CPU model) is never fed: the kernel's VM runs its
hook clauses, and its `interval:` clauses run on the host's clock.  Emptying a device map
while the kernel runs is not exact (updates racing the clear survive it or not; a key
inserted across it can be listed twice: kernels/bpf_map_ops.cuh), and a map printed
mid-step holds part of a step.  `DeviceQueryRun` makes each interval clause that prints
or clears a map a **cut** at a step boundary instead:

1. the query is attached again from the first step no worker has started, f, replacing
   the current attachment in the same table change (the old one counts steps < f, the
   new one steps >= f: `attach(first_epoch=, replaces=)`, as the device summary windows
   do);
2. the clause waits until every step < f is final (`final_epoch() >= f - 1`);
3. then every attachment (a *segment*) that ended at or before f is read once, folded
   into the host's value of each map (`printing.merge_blocks`: each aggregation's own
   merge) and detached; its device memory is given back once every worker has loaded
   that table change (`loaded_gen`);
4. the clause's actions run on the folded values: print(@m) prints m as of the end of
   step f - 1, clear(@m) forgets the host's value; nothing on the device is cleared.

In a job, rank 0 decides when each clause runs and the step f to cut at (`run_clause(...,
at_step=)`: one past its grant, unstarted on every rank: launch.api), so each rank's tick
covers the same steps; a rank already past f cuts at its own first unstarted step.
Clauses run in the order they came due (a clause without map actions waits behind an
earlier cut).  At most MAX_LIVE_SEGMENTS attachments are alive: a clause due while that
many are reuses the latest cut (still exact, its steps end earlier).  Each interval header
names its steps.  Reports between intervals, END and the exit-time maps show the folded
values plus what the live segments hold then (steps still running: as read).

Outside the hot tier (`compiled`, `auto`) attaching the query again would start a build
and a launch-ending swap every interval.  There a `BufferedQueryRun` attaches it twice,
once: the second *parked* (first_epoch=PARKED: it counts nothing) and promoted with the
first (`follows=`: TierManager.follow), so both are linked in at the same boundary.  A cut
**rearms** the idle one from step f, ending the running one there (`rearm(aid,
first_epoch=, replaces=)`: one table change, the slots' epochs are data the compiled code
reads); a folded segment's maps are emptied on the device -- exact:
its steps are final and it counts no later step -- and it is the idle one again.  Its
coverage rows and ring records are told apart by epoch.  Two attachments, so while the
idle one is not folded yet a clause reuses the latest cut.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional

from ..bpf.maps import MapSet
from ..errors import UserError
from ..lang import printing
from ..lang.host import QueryRun
from .reference import PARKED
from .summary_windows import forget_loaded


#: Attachments of one query alive at once (the running one and ended ones whose steps are
#: not final yet): each holds a program slot of its hooks (runtime.device.MAX_PROGS = 8,
#: shared with the summary windows and other queries).  A kernel 4 steps ahead of its
#: flushes could otherwise leave 5; past this a clause reuses the latest cut.
MAX_LIVE_SEGMENTS = 3


@dataclass
class _Segment:
    aid: int
    first: int                      # its first step
    end: Optional[int] = None       # its successor's first step (None: the live one)


@dataclass
class _Due:
    iv: dict                        # the interval clause of the plan
    ts_ns: int                      # when it came due (host clock, from the first tick)
    boundary: Optional[int]         # the step its maps are read at; None: no map action
    inplace: str = ""               # why this clause could not cut (it clears in place)


def _touches_maps(iv: dict) -> bool:
    return any(a["op"] == "clear" or ("map" in a and "text" not in a) for a in iv["actions"])


def device_query_run(obj, runtime, verify: bool = True) -> QueryRun:
    """The QueryRun of a query on a device runtime: a DeviceQueryRun where the session's
    tier is hot, else a BufferedQueryRun (its cuts need no build: module doc)."""
    if getattr(runtime, "tier", "hot") == "hot":
        return DeviceQueryRun(obj, runtime=runtime, verify=verify)
    return BufferedQueryRun(obj, runtime=runtime, verify=verify)


class DeviceQueryRun(QueryRun):
    """A QueryRun on a device runtime whose interval clauses cut at step boundaries
    (module doc).  Called from the serving loop's thread only."""

    def __init__(self, obj, plan=None, *, runtime, verify: bool = True):
        super().__init__(obj, plan, runtime=runtime, verify=verify)
        self._verify = verify
        self.segments: List[_Segment] = []
        if self.aid is not None:
            self.segments.append(_Segment(self.aid, int(runtime.first_epoch_of(self.aid))))
        self.folded: Dict[str, dict] = {}       # map name -> its value in ended segments, as a block
        self._folded_evidence: list = []
        self._folded_rows: list = []
        self._due: List[_Due] = []
        self._retiring: List[tuple] = []        # (aid, table generation of its detach)
        self._steps_from = self.segments[0].first if self.segments else 0
        self._final_view = False                # a clause at a boundary: folded values only
        self._seg_base: Dict[tuple, dict] = {}  # (aid, first step, map) -> coverage at an in-place clear
        self._empty = MapSet(obj.maps)          # a cleared map that counted nothing since

    # -- interval clauses ----------------------------------------------------------------
    def _run_clause(self, iv: dict, ts_ns: int, at_step: Optional[int] = None) -> Optional[int]:
        due = _Due(iv, ts_ns, None)
        if _touches_maps(iv):
            try:
                due.boundary = self._cut(at_step)
            except UserError as e:            # e.g. no free table slot: this one clears in place
                due.inplace = str(e)
        self._due.append(due)
        return due.boundary

    def _cut(self, at_step: Optional[int] = None) -> int:
        """Attach the successor from the first unstarted step, or `at_step` if later (module
        doc, 1); the step it starts at."""
        cur = self.segments[-1]
        if at_step is not None and cur.first >= at_step:
            return cur.first                # told the latest cut's step: rank 0 reused that cut
        f = max(int(self.rt.unstarted_step()), -1 if at_step is None else int(at_step))
        if cur.first >= f or len(self.segments) >= MAX_LIVE_SEGMENTS:
            return cur.first                # none of it has started / the table is shared: the
                                            # latest cut again (exact, only earlier than now)
        nxt = self._successor(cur, f)
        if nxt is None:
            return cur.first                # (a buffered query's other attachment still busy)
        aid, cur.end = nxt
        self.segments.append(_Segment(aid, cur.end))
        self.aid = aid
        return cur.end

    def _successor(self, cur: _Segment, f: int) -> Optional[tuple]:
        """(attachment, its first step) counting from step f on, `cur` ending there: the
        query attached again, in the hot tier."""
        aid = self.rt.attach(self.obj, verify=self._verify, first_epoch=f, tier="hot", replaces=cur.aid)
        return aid, int(self.rt.first_epoch_of(aid))

    def drain(self, force: bool = False) -> None:
        """Run the clauses whose boundary is final, in order (force: every one, at the end,
        with what the segments hold then)."""
        final = int(self.rt.final_epoch())
        while self._due and not self.exited:
            d = self._due[0]
            if d.boundary is not None and not force and final < d.boundary - 1:
                break
            self._due.pop(0)
            head = {"type": "interval", "probe": d.iv["probe"], "ts_ns": d.ts_ns}
            if d.boundary is not None:
                self._fold_upto(d.boundary)
                last = d.boundary - 1
                if force and last > final:  # at the end: steps never started are not in it
                    last = min(last, int(self.rt.unstarted_step()) - 1)
                head["steps"] = [self._steps_from, last]
                self._steps_from = min(d.boundary, max(last + 1, self._steps_from))
            self.blocks.append(head)
            if d.inplace:
                self.blocks.append({"type": "warning", "text": f"{d.iv['probe']}: no cut at a step "
                                    f"boundary ({d.inplace}); its clear() empties the device map in place"})
            self._final_view = d.boundary is not None
            try:
                self._actions(d.iv["actions"], d.iv["probe"])
            finally:
                self._final_view = False
        self._forget()

    def _fold_upto(self, boundary: int) -> None:
        """Read, fold and retire every segment that ended at or before `boundary`."""
        while self.segments and self.segments[0].end is not None and self.segments[0].end <= boundary:
            seg = self.segments.pop(0)
            self._fold(seg)
            self._retire(seg)

    def _retire(self, seg: _Segment) -> None:
        """A folded segment's attachment: detached, its memory given back once every worker
        loaded the detach."""
        self.rt.detach(seg.aid)
        self._retiring.append((seg.aid, int(self.rt.table_gen())))

    def _fold(self, seg: _Segment) -> None:
        maps, rows = self.rt.maps(seg.aid), self._rows(seg)
        pms = self.plan["maps"]
        for pm, b in zip(pms, self._segment_blocks(pms, seg, "fold", maps, rows)):
            self.folded[pm["name"]] = _merge(self.folded.get(pm["name"]), b)
        self._folded_evidence.extend(self._evidence_of(seg))
        self._folded_rows.extend(rows)
        if self._exit_ran(seg.aid, maps):
            self.exited = True

    def _rows(self, seg: _Segment) -> list:
        """The coverage rows of the segment's steps (an attachment used again for a later
        range -- BufferedQueryRun -- keeps the rows of its earlier ones)."""
        return [c for c in self.rt.coverage(seg.aid) if _in(seg, c.epoch)]

    def _evidence_of(self, seg: _Segment) -> list:
        return [(name, r) for name, r in self.rt.evidence(seg.aid) if _in(seg, r.epoch)]

    def _forget(self) -> None:
        self._retiring = forget_loaded(self.rt, self._retiring)

    # -- the query's maps ----------------------------------------------------------------
    def _clear(self, pm: dict) -> None:
        self.folded.pop(pm["name"], None)
        if self._final_view:                # the live segments count steps after the boundary
            return
        for seg in self.segments:           # END, or a clause that could not cut: in place
            self.rt.clear_map(seg.aid, pm["bpf_map"])
            self._seg_base[(seg.aid, seg.first, pm["name"])] = printing.coverage_of(pm, self._rows(seg))

    def _segment_blocks(self, pms, seg: _Segment, when: str, maps=None, rows=None) -> List[dict]:
        maps = self.rt.maps(seg.aid) if maps is None else maps
        rows = self._rows(seg) if rows is None else rows
        return [printing.map_block(pm, maps, rows, self.plan["names"], when,
                                   self._seg_base.get((seg.aid, seg.first, pm["name"]))) for pm in pms]

    def map_blocks(self, pms, when: str) -> List[dict]:
        """The folded values, plus (outside a clause at its boundary) what every live
        segment holds now, each segment's maps read once."""
        out = [self.folded.get(pm["name"]) for pm in pms]
        if not self._final_view:
            for seg in self.segments:
                out = [_merge(b, live) for b, live in zip(out, self._segment_blocks(pms, seg, when))]
        return [{**(b or printing.map_block(pm, self._empty, [], self.plan["names"], when)), "when": when}
                for pm, b in zip(pms, out)]

    def poll_exit(self) -> bool:
        if not self.exited and any(self._exit_ran(seg.aid) for seg in self.segments):
            self.exited = True
        return self.exited

    def finish(self):
        self.drain(force=True)
        return super().finish()

    def attachments(self) -> List[int]:
        return [s.aid for s in self.segments]

    def _evidence_source(self):
        records, rows = list(self._folded_evidence), list(self._folded_rows)
        for seg in self.segments:
            records.extend(self._evidence_of(seg))
            rows.extend(self._rows(seg))
        return records, rows


class BufferedQueryRun(DeviceQueryRun):
    """A DeviceQueryRun outside the hot tier: two attachments of the query take turns
    (module doc), so its cuts never attach a program the tier would have to build and
    swap in.  The second is attached parked (first_epoch=PARKED) when the query has an
    interval clause that prints or clears a map; a cut rearms the idle one from step f;
    a folded segment's maps are emptied (no worker writes them: its steps are final and
    it counts no later one) and it waits, idle, for the next cut.  While the other has
    not been folded yet, a clause reuses the latest cut."""

    def __init__(self, obj, plan=None, *, runtime, verify: bool = True):
        super().__init__(obj, plan, runtime=runtime, verify=verify)
        self.idle: List[int] = []
        self._unbuffered = ""               # why there is no second attachment
        if self.aid is not None and any(_touches_maps(iv) for iv in self.plan["host"]["intervals"]):
            try:
                self.idle.append(self.rt.attach(obj, verify=verify, first_epoch=PARKED, follows=self.aid))
            except UserError as e:          # e.g. no free table slot: clears in place
                self._unbuffered = str(e)

    def _successor(self, cur: _Segment, f: int) -> Optional[tuple]:
        if self._unbuffered:
            raise UserError(self._unbuffered)
        if not self.idle:
            return None
        aid = self.idle.pop(0)
        return aid, int(self.rt.rearm(aid, first_epoch=f, replaces=cur.aid))

    def _retire(self, seg: _Segment) -> None:
        for m in self.obj.maps:             # ring buffers keep their records (by epoch: _evidence_of)
            if m.type != "ringbuf":
                self.rt.clear_map(seg.aid, m.name)
        self.idle.append(seg.aid)

    def attachments(self) -> List[int]:
        return super().attachments() + self.idle


def _in(seg: _Segment, epoch: int) -> bool:
    return seg.first <= epoch and (seg.end is None or epoch < seg.end)


def _merge(a: Optional[dict], b: dict) -> dict:
    """Two blocks of one map (disjoint steps) as one: merge_blocks, which combines ranks'
    blocks the same way (each aggregation's merge; coverage summed)."""
    if a is None:
        return b
    (m,) = printing.merge_blocks([[a], [{**b, "when": a["when"]}]])
    return m
