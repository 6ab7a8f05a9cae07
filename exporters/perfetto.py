"""Perfetto trace encoder: `ExportBatch` -> the native protobuf trace (`.perfetto-trace`).

The file is a `perfetto.protos.Trace`: repeated `TracePacket` (field 1), hand-encoded
with `exporters.protowire`.  Used messages and field numbers (from Perfetto's
protos/perfetto/trace/...):

    Trace            packet=1
    TracePacket      timestamp=8 trusted_packet_sequence_id=10 track_event=11
                     sequence_flags=13 track_descriptor=60
    TrackDescriptor  uuid=1 name=2 process=3 thread=4 parent_uuid=5 counter=8
    ProcessDescriptor pid=1 process_name=6      ThreadDescriptor pid=1 tid=2 thread_name=5
    CounterDescriptor unit=3 (UNIT_COUNT=2)
    TrackEvent       debug_annotations=4 type=9 track_uuid=11 categories=22 name=23
                     counter_value=30 flow_ids=47 terminating_flow_ids=48
    DebugAnnotation  bool_value=2 uint_value=3 int_value=4 double_value=5 string_value=6 name=10

Tracks, per rank r (a process "rank r"):
  * one thread track per worker (SM): task slices named by class, identity (task_index,
    step, layer, tile, slot, expert, flags) as debug annotations;
  * "decode steps": one slice per step; "findings": one slice per finding and step;
  * "comm signals": an instant per (comm_op, comm_gen, receiver) at the last signal,
    starting a flow; "comm wait <- rank p": a slice per wait (tiles merged) and, when
    joined, a "release" instant at its end that terminates that flow (flows = remote
    dependencies, across process tracks; Perfetto orders a flow by time, so a signal
    later than the release by clock error is clamped, `clamped_ns` in its args);
  * "evidence": escalated raw evidence slices;
  * counter tracks "queue depth wN" (samples from the task trace) or "queue depth max"
    (per step, from the summaries when no task trace has samples).
Times: every rank's device times mapped to the aligned clock (`ExportBatch.to_unix_ns`).
"""
from __future__ import annotations

import hashlib
import json
from typing import Any, Dict, Iterable, List, Optional, Tuple

from ..abi.definition import FLAG_DYNAMIC, NONE_U32
from ..collectors.join import group_signals
from .batch import ExportBatch, merge_wait_tiles, TaskSlice, TaskTrace
from .protowire import Msg

TYPE_SLICE_BEGIN, TYPE_SLICE_END, TYPE_INSTANT, TYPE_COUNTER = 1, 2, 3, 4
SEQ_INCREMENTAL_STATE_CLEARED = 1
SEQ_ID = 1
UNIT_COUNT = 2
# packet order at one timestamp: ends before counters before instants before begins
_ORDER = {TYPE_SLICE_END: 0, TYPE_COUNTER: 1, TYPE_INSTANT: 2, TYPE_SLICE_BEGIN: 3}


def _uuid(*parts: Any) -> int:
    h = hashlib.blake2b("|".join(str(p) for p in parts).encode(), digest_size=8)
    return (int.from_bytes(h.digest(), "big") >> 1) or 1     # < 2^63, non-zero


def flow_id(comm_op: int, comm_gen: int, sender: int, receiver: int) -> int:
    return _uuid("flow", comm_op, comm_gen, sender, receiver)


def _annotation(name: str, v: Any) -> Msg:
    m = Msg().string(10, name)
    if isinstance(v, bool):
        m.boolean(2, v)
    elif isinstance(v, int):
        m.int64(4, v)
    elif isinstance(v, float):
        m.double(5, v)
    elif isinstance(v, str):
        m.string(6, v)
    else:
        m.string(6, json.dumps(v, separators=(",", ":")))
    return m


class TraceBuilder:
    """Tracks and events; `bytes()` sorts events by time and encodes the trace."""

    def __init__(self):
        self._tracks: List[bytes] = []
        self._events: List[Tuple[int, int, int, bytes]] = []
        self._seen: set = set()
        self.counts = {"tracks": 0, "slices": 0, "instants": 0, "counters": 0, "flows": 0}

    def track(self, uuid: int, name: str, *, parent: Optional[int] = None,
              process: Optional[Tuple[int, str]] = None, thread: Optional[Tuple[int, int, str]] = None,
              counter: bool = False) -> int:
        if uuid in self._seen:
            return uuid
        self._seen.add(uuid)
        td = Msg().uint(1, uuid).string(2, name)
        if process is not None:
            td.msg(3, Msg().int64(1, process[0]).string(6, process[1]))
        if thread is not None:
            td.msg(4, Msg().int64(1, thread[0]).int64(2, thread[1]).string(5, thread[2]))
        if parent is not None:
            td.uint(5, parent)
        if counter:
            td.msg(8, Msg().uint(3, UNIT_COUNT))
        pkt = Msg().uint(10, SEQ_ID)
        if not self._tracks:
            pkt.uint(13, SEQ_INCREMENTAL_STATE_CLEARED)
        self._tracks.append(bytes(pkt.msg(60, td)))
        self.counts["tracks"] += 1
        return uuid

    def _event(self, ts: int, typ: int, track: int, ev: Msg) -> None:
        ev.uint(9, typ).uint(11, track)
        pkt = Msg().uint(8, max(int(ts), 0)).uint(10, SEQ_ID).msg(11, ev)
        self._events.append((int(ts), _ORDER[typ], len(self._events), bytes(pkt)))

    def _named(self, category: str, name: str, args: Optional[Dict[str, Any]], flows: Iterable[int],
               terminating_flows: Iterable[int]) -> Msg:
        """The TrackEvent fields a slice begin and an instant share: category, name, debug
        annotations, flow ids (a terminating flow is counted once, where it ends)."""
        ev = Msg().string(22, category).string(23, name)
        for k, v in (args or {}).items():
            ev.msg(4, _annotation(k, v))
        for f in flows:
            ev.fixed64(47, f)
        for f in terminating_flows:
            ev.fixed64(48, f)
            self.counts["flows"] += 1
        return ev

    def slice(self, track: int, name: str, begin: int, end: int, args: Optional[Dict[str, Any]] = None,
              category: str = "task", flows: Iterable[int] = (), terminating_flows: Iterable[int] = ()) -> None:
        ev = self._named(category, name, args, flows, terminating_flows)
        self._event(begin, TYPE_SLICE_BEGIN, track, ev)
        self._event(max(end, begin), TYPE_SLICE_END, track, Msg())
        self.counts["slices"] += 1

    def instant(self, track: int, name: str, ts: int, args: Optional[Dict[str, Any]] = None,
                category: str = "comm", flows: Iterable[int] = (),
                terminating_flows: Iterable[int] = ()) -> None:
        ev = self._named(category, name, args, flows, terminating_flows)
        self._event(ts, TYPE_INSTANT, track, ev)
        self.counts["instants"] += 1

    def counter(self, track: int, ts: int, value: int) -> None:
        self._event(ts, TYPE_COUNTER, track, Msg().int64(30, int(value)))
        self.counts["counters"] += 1

    def __bytes__(self) -> bytes:
        packets = self._tracks + [p for _, _, _, p in sorted(self._events)]
        return b"".join(bytes(Msg().bytes_(1, p)) for p in packets)


def build_perfetto(batch: ExportBatch) -> Tuple[bytes, Dict[str, int]]:
    """The trace bytes and counts of what went in (tracks, slices, instants, counters,
    flows)."""
    tb = TraceBuilder()
    names = batch.names
    u = batch.to_unix_ns

    def proc(r: int) -> int:
        info = batch.info(r)
        label = f"rank {r}" + (f" ({info.host}" + (f", GPU {info.gpu}" if info.gpu is not None else "")
                               + ")" if info.host != "unknown" or info.gpu is not None else "")
        return tb.track(_uuid("proc", r), label, process=(r + 1, label))

    def child(r: int, kind: str, name: str, counter: bool = False) -> int:
        return tb.track(_uuid(kind, r, name), name, parent=proc(r), counter=counter)

    for r in batch.ranks():
        proc(r)

    # --- full task traces: one thread track per worker (SM)
    have_queue_samples = set()
    for r, tt in sorted(batch.task_traces.items()):
        for w in range(tt.workers):
            _worker_track(tb, r, w, tt)
        begins = batch.to_unix_many(r, [s.begin_ns for s in tt.slices]).tolist()
        ends = batch.to_unix_many(r, [s.end_ns for s in tt.slices]).tolist()
        for s, b, e in zip(tt.slices, begins, ends):
            tb.slice(_worker_track(tb, r, s.worker, tt), s.name, b, e, dict(s.args))
        last: Dict[int, int] = {}
        samples = sorted(tt.queue_depth, key=lambda x: (x[1], x[0]))
        for (w, _, depth), ts in zip(samples, batch.to_unix_many(r, [x[1] for x in samples]).tolist()):
            if last.get(w) == depth:
                continue
            last[w] = depth
            nm = "dynamic queue depth" if w < 0 else f"queue depth w{w}"
            tb.counter(child(r, "counter", nm, counter=True), ts, depth)
            have_queue_samples.add(r)
        if tt.steps and not any(s.rank == r for s in batch.summaries):
            trk = child(r, "track", "decode steps")
            for k, b, e in tt.steps:
                tb.slice(trk, f"step {k}", u(r, b), u(r, e), {"step": k}, category="step")

    # --- steps and per-step queue depth maxima from the summaries
    for s in sorted(batch.summaries, key=lambda s: (s.rank, s.epoch)):
        r = s.rank
        b, e = u(r, s.begin_ns), u(r, s.end_ns)
        cov = s.coverage
        tb.slice(child(r, "track", "decode steps"), f"step {s.epoch}", b, e,
                 {"step": s.epoch, "queue_depth_max": s.queue_depth_max,
                  "remote_wait_us": round(s.remote_wait_sum_ns / 1000.0, 3),
                  "coverage.eligible": cov.eligible, "coverage.executed": cov.executed,
                  "coverage.throttled": cov.throttled, "coverage.lost": cov.lost}, category="step")
        if r not in have_queue_samples:
            tb.counter(child(r, "counter", "queue depth max", counter=True), b, s.queue_depth_max)

    # --- remote dependencies: signal instant -> "release" instant at the end of the wait
    # slice, one flow per key.  Perfetto orders a flow by time, so the signal instant is
    # causally clamped to before the release (as the collector clamps it).
    groups = group_signals(batch.signals)
    release_ts: Dict[Tuple[int, int, int, int], int] = {}
    for k, w0, b, e, tiles in merge_wait_tiles(batch.waits):
        op, gen, snd, rcv = k
        ub, ue = u(rcv, b), u(rcv, e)
        trk = child(rcv, "track", f"comm wait <- rank {snd}")
        tb.slice(trk, f"wait {names.comm_op(op)}", ub, ue,
                 {"comm_op": names.comm_op(op), "comm_gen": gen, "peer": snd, "layer": w0.layer,
                  "step": w0.step, "task_class": names.task_class(w0.task_class), "tiles": tiles,
                  "joined": k in groups}, category="comm")
        if k in groups:
            release_ts[k] = max(ub, ue - 1)
            tb.instant(trk, f"release {names.comm_op(op)}", release_ts[k],
                       {"comm_op": names.comm_op(op), "comm_gen": gen, "peer": snd},
                       terminating_flows=[flow_id(*k)])
    for (op, gen, snd, rcv), g in sorted(groups.items()):
        k = (op, gen, snd, rcv)
        ts = u(snd, g.last_ns)
        args = {"comm_op": names.comm_op(op), "comm_gen": gen, "peer": rcv, "layer": g.layer,
                "step": g.step, "signals": g.count}
        flows = []
        if k in release_ts:
            flows = [flow_id(*k)]
            if ts >= release_ts[k]:
                args["clamped_ns"] = ts - (release_ts[k] - 1)
                ts = release_ts[k] - 1
        tb.instant(child(snd, "track", "comm signals"), f"signal {names.comm_op(op)} -> rank {rcv}",
                   ts, args, flows=flows)

    # --- findings and escalated evidence
    extents = {(s.rank, s.epoch): (u(s.rank, s.begin_ns), u(s.rank, s.end_ns)) for s in batch.summaries}
    for f in batch.result.get("findings", []):
        for k in f.get("steps", []):
            r = next((x for x in [f["rank"]] + list(f.get("observed_on", [])) if (x, k) in extents), None)
            if r is None:
                continue
            b, e = extents[(r, k)]
            args = {key: f[key] for key in ("cause", "rank", "confidence", "impact_us", "task_class",
                                            "comm_op", "layer") if key in f}
            args["observed_on"] = list(f.get("observed_on", []))
            tb.slice(child(r, "track", "findings"), f["cause"], b, e, args, category="finding")
    for ev in batch.evidence:
        tb.slice(child(ev.rank, "track", "evidence"), ev.name, u(ev.rank, ev.begin_ns),
                 u(ev.rank, ev.end_ns), dict(ev.attributes, step=ev.step), category="evidence")
    return bytes(tb), dict(tb.counts)


def _worker_track(tb: TraceBuilder, r: int, w: int, tt: TaskTrace) -> int:
    sm = tt.sms.get(w, w)
    label = f"worker {w} (SM {sm})"
    pid = r + 1
    return tb.track(_uuid("worker", r, w), label, thread=(pid, pid * 100000 + w + 1, label))


def write_perfetto(path, batch: ExportBatch) -> Dict[str, int]:
    data, counts = build_perfetto(batch)
    with open(path, "wb") as fh:
        fh.write(data)
    counts["bytes"] = len(data)
    return counts


# ------------------------------------------------------------------ task trace adapters

def _identity(task, step: int, flags: int) -> Dict[str, Any]:
    a: Dict[str, Any] = {"task_index": task.index, "step": step, "tile": list(task.tile)}
    if task.layer != NONE_U32:
        a["layer"] = task.layer
    if task.expert != NONE_U32:
        a["expert"] = task.expert
    if task.slot != NONE_U32:
        a["request_slot"] = task.slot
    if flags:
        a["flags"] = flags
    return a


def task_trace_from_sim(graph, result, rank: Optional[int] = None,
                        queue_depth: Iterable[Tuple[int, int, int]] = ()) -> TaskTrace:
    """From a sim run with `collect_trace=True` (`SimResult.trace`)."""
    from ..megakernel.graph import CLASS_NAMES
    r = graph.rank if rank is None else rank
    tt = TaskTrace(r, graph.num_workers, queue_depth=list(queue_depth),
                   steps=[(k, s, e) for k, (s, e) in enumerate(zip(result.step_start_ns, result.step_end_ns))])
    for t, k, w, b, e, fl in result.trace:
        task = graph.tasks[t]
        tt.slices.append(TaskSlice(w, CLASS_NAMES[task.cls], b, e, _identity(task, k, fl)))
    return tt


def task_trace_from_gpu(trace, graph, rank: Optional[int] = None,
                        queue_depth: Iterable[Tuple[int, int, int]] = ()) -> TaskTrace:
    """From the GPU launcher's trace records (`gpu.TRACE_DTYPE`; device clock ns)."""
    r = graph.rank if rank is None else rank
    tt = TaskTrace(r, graph.num_workers, queue_depth=list(queue_depth))
    for rec in trace:
        task = graph.tasks[int(rec["task_index"])]
        b = int(rec["t_dispatch"]) + int(rec["wait_ns"])
        w = int(rec["worker"])
        tt.sms[w] = int(rec["sm"])
        tt.slices.append(TaskSlice(w, task.class_name, b, b + int(rec["dur_ns"]),
                                   _identity(task, int(rec["step"]), int(rec["flags"]))))
    return tt


def task_trace_from_chrome(doc: Dict[str, Any], rank: Optional[int] = None) -> List[TaskTrace]:
    """From a Chrome trace JSON that `dtrace-mk run --trace` wrote (sim or GPU): its
    complete events of category "task" (one track per tid = worker) and "step"."""
    by_pid: Dict[int, TaskTrace] = {}
    for ev in doc.get("traceEvents", []):
        if ev.get("ph") != "X":
            continue
        pid = int(ev.get("pid", 0)) if rank is None else rank
        tt = by_pid.setdefault(pid, TaskTrace(pid, 0))
        b = int(round(float(ev["ts"]) * 1000))
        e = b + int(round(float(ev.get("dur", 0)) * 1000))
        if ev.get("cat") == "task":
            w = int(ev.get("tid", 0))
            args = dict(ev.get("args", {}))
            if "slot" in args:
                args["request_slot"] = args.pop("slot")
            tt.slices.append(TaskSlice(w, ev["name"], b, e, args))
            tt.workers = max(tt.workers, w + 1)
            if "sm" in args:
                tt.sms[w] = int(args["sm"])
        elif ev.get("cat") == "step":
            k = int(str(ev.get("name", "step 0")).split()[-1])
            tt.steps.append((k, b, e))
    return [by_pid[p] for p in sorted(by_pid)]


def queue_depth_sink(out: List[Tuple[int, int, int]]):
    """A hook-context sink (sim `sink=`, GPU `sink=`) recording `(worker, ts_ns, depth)`
    from every context carrying `queue_depth`; dynamic-queue depths get worker -1."""
    def sink(ctx: Dict[str, Any]) -> None:
        d = ctx.get("queue_depth")
        if d is None:
            return
        w = -1 if int(ctx.get("flags", 0)) & FLAG_DYNAMIC else int(ctx.get("worker", 0))
        out.append((w, int(ctx["ts_ns"]), int(d)))
    return sink
