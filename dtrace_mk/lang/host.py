"""Host driver for compiled queries: feed recorded hook contexts through the reference
runtime and run the host-side clauses of the printing plan.

    blocks = run_events(obj, records)           # obj: BpfObject with a dtmk_plan note
    print(printing.render_text(blocks))

Semantics (bpftrace-like, on simulated time = the records' ts_ns):
* BEGIN actions run before the first record.
* `interval:ms:N` actions run each time a record's ts_ns reaches the next multiple of
  N ms after the first record's ts_ns (before that record fires).  A query that runs in a
  device runtime is not fed records: its host ticks it with the host clock (`tick`), and
  its clear() empties the device map (the runtime's `clear_map`).
* `exit()` (host or device) stops reading records; END actions then run.
* At exit every map that END did not print is printed (empty maps say `(empty)` only
  when printed explicitly), then the evidence records (drained from the ring).
"""
from __future__ import annotations

import struct
from typing import Iterable, List, Optional, Sequence

from ..abi import context
from ..bpf.program import BpfObject
from ..errors import UserError
from . import printing
from .passes.lower import NOTE_PLAN


def find_plan(obj: BpfObject) -> Optional[dict]:
    """The printing plan of a compiled query: the object's `dtmk_plan` note, else the
    OUT.plan.json that `dtrace-mk compile -o OUT.o` writes beside it; None for objects
    not compiled from a query (clang-built monitors)."""
    import json
    from pathlib import Path
    text = (obj.notes or {}).get(NOTE_PLAN)
    if text:
        return json.loads(text)
    p = Path(obj.path)
    side = p.with_name(p.stem + ".plan.json") if p.suffix == ".o" else Path(str(p) + ".plan.json")
    if obj.path != "<memory>" and side.is_file():
        try:
            return json.loads(side.read_text())
        except (OSError, ValueError) as e:
            raise UserError(f"{side}: cannot read the printing plan: {e}") from None
    return None


def _plan(obj: BpfObject, plan: Optional[dict]) -> dict:
    if plan is not None:
        return plan
    found = find_plan(obj)
    if found is None:
        raise UserError(f"{obj.path}: no printing plan (dtmk_plan note or .plan.json beside it); "
                        f"the object was not compiled from a query")
    return found


class QueryRun:
    """One attached query on a ReferenceRuntime."""

    def __init__(self, obj: BpfObject, plan: Optional[dict] = None, *, num_workers: int = 1,
                 runtime=None, verify: bool = True):
        from ..runtime.reference import ReferenceRuntime, _verify
        self.plan = _plan(obj, plan)
        self.obj = obj
        self.rt = runtime or ReferenceRuntime(num_workers=num_workers)
        # a query of host clauses only (BEGIN { print("x") }) has nothing to attach
        self.aid = self.rt.attach(obj, verify=verify and _verify is not None) if obj.programs else None
        self.maps_by_name = {m["name"]: m for m in self.plan["maps"]}
        self.blocks: List[dict] = []
        self.exited = False
        self.printed_at_end: set = set()
        self.baseline: dict = {}        # map name -> coverage totals at its last clear()

    # -- actions ---------------------------------------------------------------------
    def _actions(self, actions: Sequence[dict], when: str) -> None:
        for a in actions:
            if a["op"] == "exit":
                self.exited = True
            elif a["op"] == "clear":
                self._clear(self.maps_by_name[a["map"]])
                if when == "END":
                    self.printed_at_end.add(a["map"])
            elif "text" in a:
                self.blocks.append({"type": "text", "when": when, "text": a["text"]})
            else:
                self.print_map(a["map"], when)
                if when == "END":
                    self.printed_at_end.add(a["map"])

    def _clear(self, pm: dict) -> None:
        clear = getattr(self.rt, "clear_map", None)     # a device runtime: its own map
        if clear is not None:
            clear(self.aid, pm["bpf_map"])
        else:
            self.rt.maps(self.aid)[pm["bpf_map"]].clear()
        self.baseline[pm["name"]] = printing.coverage_of(pm, self.rt.coverage(self.aid))

    def print_map(self, name: str, when: str) -> None:
        pm = self.maps_by_name[name]
        self.blocks.append(self.block(pm, when))

    def block(self, pm: dict, when: str) -> dict:
        """Map `pm` of the plan as it is now, as a printing block (its coverage: since its
        last clear())."""
        return self.map_blocks([pm], when)[0]

    def map_blocks(self, pms: Sequence[dict], when: str) -> List[dict]:
        """block() of each map in `pms`, the runtime's maps and coverage read once (a
        device runtime copies every map of the attachment per read)."""
        if not pms:
            return []
        maps, rows = self.rt.maps(self.aid), self.rt.coverage(self.aid)
        return [printing.map_block(pm, maps, rows, self.plan["names"], when, self.baseline.get(pm["name"]))
                for pm in pms]

    def attachments(self) -> List[int]:
        """The runtime attachments this query holds (what a detach must end)."""
        return [] if self.aid is None else [self.aid]

    # -- the run ---------------------------------------------------------------------
    # begin() / feed() / finish() let a live source (the sim backend's hook stream, a
    # device ring) drive the query one record at a time; run() replays a recording.
    def begin(self) -> None:
        self._actions(self.plan["host"]["BEGIN"], "BEGIN")
        self._intervals = [dict(iv, next=None, index=i) for i, iv in enumerate(self.plan["host"]["intervals"])]
        exit_map = self.plan.get("exit_map")
        self._exit_m = self.rt.maps(self.aid)[exit_map] if exit_map and self.aid is not None else None
        self._t0 = None

    def feed(self, rec: bytes) -> bool:
        """Fire one packed context record; False once the query has exited."""
        if self.exited or self.aid is None:
            return False
        self.tick(struct.unpack_from("<Q", rec, context.OFF_TS_NS)[0])
        if self.exited:
            return False
        self.rt.fire(rec)
        if self._exit_m is not None and any(self._exit_m.lookup(b"\0\0\0\0")):
            self.exited = True
        return not self.exited

    def tick(self, now_ns: int) -> None:
        """Run the interval clauses due at `now_ns`: a fed query's clock is its records'
        ts_ns; a query the host does not feed (a device runtime's) is ticked with the
        host's clock instead.  The first tick starts every interval."""
        for iv, ts_ns in self._due_intervals(now_ns):
            self._run_clause(iv, ts_ns)
        self.drain()

    def due_clauses(self, now_ns: int) -> List[tuple]:
        """(index, time since the first tick) of each interval clause due at `now_ns`, not
        run: a job's rank 0 decides when clauses run and tells every rank (run_clause)."""
        return [(iv["index"], ts_ns) for iv, ts_ns in self._due_intervals(now_ns)]

    def run_clause(self, index: int, ts_ns: int, at_step: Optional[int] = None) -> Optional[int]:
        """Run interval clause `index` (of due_clauses) as due at `ts_ns`.  at_step: the
        step a device query's cut should start at, if still unstarted (DeviceQueryRun;
        the same on every rank of a job).  Returns the step its cut starts at (what rank
        0 tells the other ranks), None for a clause that cuts nothing: a query here runs
        it at once."""
        if not self.exited:
            return self._run_clause(self._intervals[index], ts_ns, at_step)
        return None

    def _run_clause(self, iv: dict, ts_ns: int, at_step: Optional[int] = None) -> Optional[int]:
        self.blocks.append({"type": "interval", "probe": iv["probe"], "ts_ns": ts_ns})
        self._actions(iv["actions"], iv["probe"])
        return None

    def drain(self, force: bool = False) -> None:
        """Run the clauses that wait for their steps to be final (DeviceQueryRun's cuts);
        a query here waits for none."""

    def _due_intervals(self, now_ns: int):
        """(clause, its time since the first tick) for each interval due at `now_ns`, in
        clause order, until the query exits."""
        if self._t0 is None:
            self._t0 = now_ns
            for iv in self._intervals:
                iv["next"] = now_ns + iv["ms"] * 1_000_000
        for iv in self._intervals:
            while now_ns >= iv["next"] and not self.exited:
                ts = iv["next"] - self._t0
                iv["next"] += iv["ms"] * 1_000_000
                yield iv, ts

    def poll_exit(self) -> bool:
        """For a query the host does not feed (it runs in a device runtime: the GPU rank's
        device VM): has a hook clause run exit()?  Reads the exit map from the runtime --
        that one map where the runtime can (`read_map`).  True once it has."""
        if not self.exited and self.aid is not None and self._exit_ran(self.aid):
            self.exited = True
        return self.exited

    def _exit_ran(self, aid: int, maps=None) -> bool:
        """Has attachment `aid` run exit()?  Its exit map from `maps` (its MapSet, read
        already), else read alone where the runtime can (`read_map`); False for a query
        without exit()."""
        name = self.plan.get("exit_map")
        if not name:
            return False
        read = getattr(self.rt, "read_map", None)
        if maps is not None:
            m = maps[name]
        else:
            m = read(aid, name) if read is not None else self.rt.maps(aid)[name]
        return any(m.lookup(b"\0\0\0\0"))

    def finish(self) -> List[dict]:
        self._actions(self.plan["host"]["END"], "END")
        rest = [pm for pm in self.plan["maps"] if pm["name"] not in self.printed_at_end]
        for pm, b in zip(rest, self.map_blocks(rest, "exit")):
            if b["coverage"]["eligible"] or (b["entries"] and pm["map_type"] != "per_worker_array"):
                self.blocks.append(b)
        self._evidence()
        return self.blocks

    def run(self, records: Iterable[bytes]) -> List[dict]:
        self.begin()
        for rec in records:
            if not self.feed(rec):
                break
        return self.finish()

    def _evidence(self) -> None:
        ev = self.plan.get("evidence")
        if self.aid is None:
            return
        if not ev:
            return
        recs = {r["tag"]: r for r in ev["records"]}
        records, rows = self._evidence_source()
        for _name, rec in records:
            words = [int.from_bytes(rec.data[i:i + 8], "little") for i in range(0, len(rec.data), 8)]
            r = recs.get(words[0])
            if r is None:
                continue
            fields = {f["name"]: printing.key_label(v, f["type"], self.plan["names"])
                      for f, v in zip(r["fields"], words[1:])}
            self.blocks.append({"type": "evidence", "worker": rec.worker, "epoch": rec.epoch,
                                "fields": fields})
        rows = [c for c in rows if any(c.program in r["programs"] for r in ev["records"])]
        thr = sum(v for c in rows for k, v in c.reasons.items() if k.startswith("ring_budget"))
        if thr:
            self.blocks.append({"type": "warning", "text": f"evidence: {thr} records refused by the "
                                f"budget of {ev['budget_bytes']} bytes per worker per epoch"})

    def _evidence_source(self):
        """(the evidence records drained, the coverage rows of the programs) at the end."""
        return self.rt.evidence(self.aid), self.rt.coverage(self.aid)


def workers_needed(records: Sequence[bytes]) -> int:
    if not records:
        return 1
    return max(struct.unpack_from("<I", r, context.OFF_WORKER)[0] for r in records) + 1


def run_events(obj: BpfObject, records: Sequence[bytes], plan: Optional[dict] = None, *,
               num_workers: Optional[int] = None, verify: bool = True) -> List[dict]:
    """Attach obj to a fresh ReferenceRuntime, feed the records, return the printed blocks."""
    records = list(records)
    q = QueryRun(obj, plan, num_workers=num_workers or workers_needed(records), verify=verify)
    return q.run(records)
