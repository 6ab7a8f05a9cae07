"""The per-rank agent: runs the monitors inside the serving process and ships, per epoch,
the records the collector needs.

    agent = RankAgent(rank, channel, num_workers=132, schema=graph.schema)
    agent.start()                                   # HELLO + start-up ping-pongs
    Sim(graph, steps, sink=agent.sink, hooks=agent.hooks, ...).run()
    agent.clock_sample(device_ns, host_ns)          # whenever the serving loop has one
    stats = agent.close()                           # last epochs, BYE, bounded wait

Record flow
-----------
1. Every hook context the megakernel emits (the sim's sink, or records drained from the
   device ring) is fired into a `ReferenceRuntime` where the default summary monitors
   (`monitors/summary_tasks.d` + `summary_comm.d`, one query compiled by `dtrace_mk.lang`)
   aggregate it into maps keyed by step (the last signal per all-reduce and peer
   included), and write one evidence record per `comm:wait`.
2. An epoch is one decode step.  Epoch k is *flushed* once a context of step
   k + `flush_lag` arrives (or when more than `max_open_epochs` are open, or at close):
   the agent reads the maps' step-k entries and deletes them, drains the evidence ring,
   and builds
     * one `EpochSummary` (per class: count, duration sum/max, dispatch wait, local
       dependency wait, notification lag = ready - last producer end per event; queue
       depth max and its worker; per-expert task time; remote wait totals; coverage);
     * one `RemoteWait` per comm:wait evidence record: `wait_end = ts`, `wait_begin =
       ts - wait_ns`, but no earlier than the last local producer end of the awaited event
       (an all-reduce receive event is fed by this rank's own comm tasks too; until they
       are done the task waits on local work, and counting that as remote wait would hide
       a late sender under every step's local pipeline time);
     * one `Signal` per (peer, comm_op, comm_gen): the last tile's signal time (the
       release the collector joins on; tiles merged in the map `@signal_last`);
     * the `ClockSample`s queued since the last flush.
3. Records are packed (msgpack, `collectors.records`) into messages of at most
   `channel.max_payload` bytes, whole records only, and handed to the channel
   (`collectors.transport.RankChannel`: bounded queue, bounded Isends in flight).
   A message the channel refuses is *lost*: its records are counted (`records_lost`,
   sent in every message header so the collector's `on_lost_records` sees them), and
   the loss of wait/signal records is moved from `executed` to `lost` in the coverage of
   the epoch's summary (eligible = executed + throttled + lost still holds).

Bounded memory: maps hold at most `max_open_epochs` epochs (entries are deleted when
read), evidence is drained every flush, the coverage rows of flushed epochs are
dropped, clock samples wait in a bounded queue, the channel's queue is bounded.  The
agent never blocks the serving loop: `sink`/`feed` fire the monitors and, every
`progress_every` events, make transport progress (non-blocking tests).

Evidence budget: `budget_bytes_per_step` (scenario) bounds the packed bytes of the
RemoteWait and Signal records of one epoch of this rank (and is the per-worker evidence
budget of the summary monitors on the device); records over it are not sent and count
as `throttled` in that epoch's coverage.  Summaries and clock samples are always sent.

Device summaries (`summarize_on(runtime, first_epoch)`, a GPU rank's `serve --summaries
device`): the query's task half (summary_tasks.d) runs in the device VM of the rank's
running megakernel instead, attached afresh for each window of W steps
(runtime.summary_windows: the host never deletes what the kernel inserts), and each
window's maps and coverage are read once every worker has flushed its steps.  The host
runtime keeps the comm half, fed only the comm:* records the kernel streams (and the
user monitors' hooks), so the host no longer paces the kernel with every record.  Epochs
are then flushed by `device_progress(fed_through)` a window at a time -- every step of
the window is an epoch -- with the same records as above: the comm evidence of a later
window's epochs waits for that window (its @end_ts clips the remote waits).  Not with
escalated evidence (it holds every task:end run on the host).

Escalated evidence (`escalate=True`, DTrace-style speculation): `monitors/speculate.d`
holds every task run of the epoch in its own evidence ring (SPECULATE_BUDGET bytes per
worker per epoch; runs over it are not held).  When epoch k is flushed, its summary
decides, against this rank's last STEP_HISTORY epochs (after MIN_HISTORY of them): the
step took more than SLOW_STEP_FACTOR x their median step time (REASON_SLOW_STEP), or a
class's slowest run took more than OUTLIER_FACTOR x the median of that class's per-epoch
maxima (REASON_CLASS_OUTLIER: a fault on a share of a class moves its maximum, not always
far from its own epoch's mean).  Then at most ESCALATE_MAX of the held runs go out as
`TaskEvidence`, the relatively slowest first (duration over that class baseline; for an
outlier class only its runs above the factor), before the epoch's summary; otherwise the
held runs are discarded.  The exporters make them child spans of the rank's step span and
Perfetto slices.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from ..abi import context
from ..collectors.records import (REASON_CLASS_OUTLIER, REASON_SLOW_STEP, ClassStat, ClockSample,
                                  Coverage, EpochSummary, PingPong, RemoteWait, Signal, TaskEvidence, pack)
from ..errors import UserError
from .summary_arrays import TaskParts, WindowTasks, parts_of_entries

MONITOR_DIR = Path(__file__).resolve().parent / "monitors"
#: The summary query is two files, concatenated in this order (module doc: on a GPU rank
#: with device summaries the task half runs on the device, the comm half on the host).
SUMMARY_PARTS = {"tasks": MONITOR_DIR / "summary_tasks.d", "comm": MONITOR_DIR / "summary_comm.d"}

#: The maps of the summary query the agent reads (name -> number of key words).
SUMMARY_MAPS = {"dur": 2, "end_ts": 3, "expert_ns": 2, "ready_ts": 2,
                "queue_max": 2, "t_begin": 1, "dispatch_wait": 2, "dep_wait": 2,
                "remote_wait": 1, "signal_last": 5}
#: ... of them the comm half's (summary_comm.d); the others are the task half's
COMM_MAPS = frozenset({"remote_wait", "signal_last"})
#: ... and the task half's (a device window's maps: summary_arrays.WindowTasks)
TASK_MAPS = {name: n for name, n in SUMMARY_MAPS.items() if name not in COMM_MAPS}
#: Entries per summary map: a few open epochs of (64 peers x 2 ops x 32 layers) signals.
SUMMARY_MAP_ENTRIES = 16384
#: Entries per map of a device summary window (runtime.summary_windows): its W steps and
#: the host's lag; the largest map per step is @queue_max, one entry per worker (1b on an
#: H200: 131), so 8192 hold ~60 steps.
DEVICE_SUMMARY_ENTRIES = 8192
#: ... sized for the default window (16 steps) and DEVICE_SUMMARY_LAG steps of the host's lag
DEVICE_SUMMARY_LAG = 44


def device_summary_entries(window: int) -> int:
    """Entries per map of a device summary window of `window` steps (serve --summary-window):
    DEVICE_SUMMARY_ENTRIES per (default window + lag) steps of the window and the host's lag,
    in whole powers of two of it (8192 up to 16 steps, 16384 up to 76, ...)."""
    from .summary_windows import DEFAULT_WINDOW
    units = -(-(int(window) + DEVICE_SUMMARY_LAG) // (DEFAULT_WINDOW + DEVICE_SUMMARY_LAG))
    return DEVICE_SUMMARY_ENTRIES * (1 << (units - 1).bit_length())


EVIDENCE_MAP = "dtmk_evidence"

#: Evidence bytes per worker per epoch when the scenario sets no budget: every remote
#: wait and signal of a step on one worker (80 / 56 bytes each) with a wide margin.
DEFAULT_EVIDENCE_BUDGET = 1 << 16
MAX_CLOCK_SAMPLES_QUEUED = 256
U64 = (1 << 64) - 1

SPECULATE_FILE = MONITOR_DIR / "speculate.d"
#: Escalated evidence (module doc): the held runs' ring budget per worker per epoch (a
#: 64-byte record per task:end: 256 runs), the predicates and the cap per epoch.
SPECULATE_BUDGET = 1 << 14
SLOW_STEP_FACTOR = 1.25
STEP_HISTORY, MIN_HISTORY = 16, 4
OUTLIER_FACTOR = 2.0
ESCALATE_MAX = 8
_STEP = struct.Struct("<I")
_OFF_STEP = context.OFF_DECODE_STEP


def summary_query_text(part: str = "all") -> str:
    """The summary query: "all" (both halves, tasks first), "tasks" or "comm"."""
    if part == "all":
        return "\n".join(f.read_text() for f in SUMMARY_PARTS.values())
    return SUMMARY_PARTS[part].read_text()


def compile_summary(schema=None, budget_bytes_per_step: Optional[int] = None, part: str = "all",
                    max_entries: int = SUMMARY_MAP_ENTRIES):
    """Compile the default summary monitors, or one half (a `lang.pipeline.CompileResult`)."""
    from ..lang.passes.lower import Options
    from ..lang.pipeline import compile_query
    budget = budget_bytes_per_step or DEFAULT_EVIDENCE_BUDGET
    opts = Options(max_entries=max_entries, evidence_budget=budget,
                   evidence_ring=max(65536, 2 * budget))
    name = str(SUMMARY_PARTS[part]) if part != "all" else str(MONITOR_DIR / "summary_{tasks,comm}.d")
    return compile_query(summary_query_text(part), schema, name=name, options=opts)


def compile_speculate(schema=None):
    """Compile the held-evidence monitor of escalation (`monitors/speculate.d`)."""
    from ..lang.passes.lower import Options
    from ..lang.pipeline import compile_query
    opts = Options(evidence_budget=SPECULATE_BUDGET, evidence_ring=max(65536, 2 * SPECULATE_BUDGET))
    return compile_query(SPECULATE_FILE.read_text(), schema, name=str(SPECULATE_FILE), options=opts)


class ListChannel:
    """A channel that keeps every payload (tests, single-process use); `refuse_after`
    refuses messages after that many (a collector that stopped draining)."""

    max_payload = 16384 - 24

    def __init__(self, refuse_after: Optional[int] = None, max_payload: Optional[int] = None):
        self.payloads: List[bytes] = []
        self.refuse_after = refuse_after
        self.lost_total = 0
        self.closed = False
        self.refused = 0
        if max_payload is not None:
            self.max_payload = max_payload

    def send(self, payload: bytes, records: int = 0) -> bool:
        if self.closed or (self.refuse_after is not None and len(self.payloads) >= self.refuse_after):
            self.refused += 1
            return False
        self.payloads.append(bytes(payload))
        return True

    def add_lost(self, n: int) -> None:
        self.lost_total += n

    def progress(self) -> None:
        pass

    def start(self, pings: int = 0, timeout_s: float = 0.0) -> None:
        pass

    def close(self, timeout_s: float = 0.0) -> bool:
        self.closed = True
        return True

    def records(self):
        from ..collectors.records import unpack_stream
        return [r for p in self.payloads for r in unpack_stream(p)]


@dataclass
class AgentStats:
    rank: int
    events: int = 0
    epochs: int = 0
    records: int = 0                # records built
    records_sent: int = 0           # handed to the channel in accepted messages
    records_lost: int = 0           # in messages the channel refused
    bytes_sent: int = 0             # payload bytes accepted by the channel
    bytes_per_epoch: Dict[int, int] = field(default_factory=dict)
    late_events: int = 0            # contexts of an epoch after it was flushed
    max_open_epochs: int = 0
    max_map_entries: int = 0
    clock_samples_dropped: int = 0
    held_runs: int = 0              # task runs held for escalation (flushed epochs)
    escalated_epochs: int = 0       # epochs whose predicate fired
    escalated_runs: int = 0         # TaskEvidence records built

    def as_dict(self) -> Dict[str, Any]:
        per = list(self.bytes_per_epoch.values())
        return {"rank": self.rank, "events": self.events, "epochs": self.epochs,
                "records": self.records, "records_sent": self.records_sent,
                "records_lost": self.records_lost, "bytes_sent": self.bytes_sent,
                "bytes_per_epoch_max": max(per, default=0),
                "bytes_per_epoch_mean": round(sum(per) / len(per), 1) if per else 0.0,
                "late_events": self.late_events, "max_open_epochs": self.max_open_epochs,
                "max_map_entries": self.max_map_entries,
                "clock_samples_dropped": self.clock_samples_dropped,
                "held_runs": self.held_runs, "escalated_epochs": self.escalated_epochs,
                "escalated_runs": self.escalated_runs}


def _words(raw: bytes, n: int) -> Tuple[int, ...]:
    return struct.unpack_from("<%dQ" % n, raw)


class RankAgent:
    def __init__(self, rank: int, channel, *, num_workers: int, schema=None,
                 monitors: Sequence[str] = (), budget_bytes_per_step: Optional[int] = None,
                 flush_lag: int = 2, max_open_epochs: int = 4, progress_every: int = 256,
                 escalate: bool = True):
        from .reference import ReferenceRuntime
        if flush_lag < 1 or max_open_epochs < flush_lag:
            raise UserError(f"agent: flush_lag {flush_lag} must be >= 1 and <= max_open_epochs "
                            f"{max_open_epochs}")
        self.rank = rank
        self.channel = channel
        self.flush_lag = flush_lag
        self.max_open_epochs = max_open_epochs
        self.progress_every = max(1, progress_every)
        self.budget = budget_bytes_per_step
        self.schema = schema
        self.windows = None                       # device summaries (summarize_on)
        self._window = None                       # the window being flushed
        self._ev_held: List[Tuple[int, ...]] = []  # device summaries: evidence of later epochs
        self.throttled_by_epoch: Dict[int, int] = {}
        self.summary = compile_summary(schema, budget_bytes_per_step)
        self.rt = ReferenceRuntime(num_workers=num_workers, rank=rank)
        self.aid = self.rt.attach(self.summary.obj)
        self.maps = self.rt.maps(self.aid)
        self.programs = {p.name for p in self.summary.obj.programs}
        self._ev_tags = self._evidence_tags(self.summary.plan)
        # escalated evidence: its own attachment (its own ring and budget) on the same runtime
        self.spec_aid = self.rt.attach(compile_speculate(schema).obj) if escalate else None
        self.held_ring = self.rt.maps(self.spec_aid)[EVIDENCE_MAP] if escalate else None
        self.step_history: List[int] = []         # step_ns of the last STEP_HISTORY flushed epochs
        self.class_history: Dict[int, List[int]] = {}   # class -> its maxima of those epochs
        self._held: Dict[int, List[Tuple[int, ...]]] = {}   # held runs of open epochs
        self.user = [self._user_query(path, schema, num_workers) for path in monitors]
        self.hooks: List[str] = self._hooks_fed()
        self.stats = AgentStats(rank)
        self.open: Dict[int, None] = {}          # epochs with events, not flushed (ordered)
        self.flushed_upto = -1                    # every epoch <= this is flushed
        self.max_step = -1
        self.clock_q: List[Any] = []             # ClockSamples (and simulated PingPongs)
        self.late_cov = Coverage()                # coverage of late events, into the next summary
        self.lost_by_epoch: Dict[int, int] = {}
        self.closed = False
        self._n = 0
        self.user_blocks: Dict[str, List[dict]] = {}

    # -- set-up ------------------------------------------------------------------------
    def _hooks_fed(self) -> List[str]:
        """The hooks whose records `feed` needs (the serving loop may stream only these)."""
        objs = [self.summary.obj] + [q.obj for q in self.user]
        if self.spec_aid is not None:
            objs.append(self.rt.attachment(self.spec_aid).obj)
        return sorted({p.hook.name for o in objs for p in o.programs})

    def summarize_on(self, runtime, first_epoch: int, window: Optional[int] = None) -> None:
        """Device summaries (module doc): from now on the summary query's task half runs in
        `runtime` -- the device VM of this rank's running megakernel
        (launch.device_live.DeviceQueries), in windows of `window` steps from `first_epoch`
        (runtime.summary_windows) -- and the host keeps the comm half, so `feed` needs only
        the comm:* records (and the user monitors' hooks: `hooks`).  Epochs are flushed by
        `device_progress`, not by the records' steps.  Before the first record."""
        from .summary_windows import DEFAULT_WINDOW, SummaryWindows
        if self.stats.events or self.windows is not None:
            raise UserError("agent: summarize_on must come before the first record, once")
        if self.spec_aid is not None:
            raise UserError("agent: escalated evidence holds every task:end run on the host; it does not "
                            "combine with device summaries (RankAgent(escalate=False))")
        comm = compile_summary(self.schema, self.budget, part="comm")
        window = window or DEFAULT_WINDOW
        tasks = compile_summary(self.schema, self.budget, part="tasks", max_entries=device_summary_entries(window))
        self.windows = SummaryWindows(runtime, tasks.obj, first_epoch, window)
        self.rt.detach(self.aid)
        self.rt.forget(self.aid)
        self.summary = comm
        self.aid = self.rt.attach(comm.obj)
        self.maps = self.rt.maps(self.aid)
        self.programs = {p.name for p in comm.obj.programs}
        self._ev_tags = self._evidence_tags(comm.plan)
        self.flushed_upto = max(self.flushed_upto, int(first_epoch) - 1)
        self.hooks = self._hooks_fed()

    @staticmethod
    def _evidence_tags(plan: dict) -> Dict[int, str]:
        out = {}
        for r in (plan.get("evidence") or {}).get("records", []):
            progs = r["programs"]
            if any(p.endswith("_comm_wait") for p in progs):
                out[r["tag"]] = "wait"
            elif any(p.endswith("_comm_signal") for p in progs):
                out[r["tag"]] = "signal"
        return out

    def _user_query(self, path: str, schema, num_workers: int):
        from ..lang.host import QueryRun
        from ..lang.pipeline import compile_query
        try:
            text = Path(path).read_text()
        except OSError as e:
            raise UserError(f"monitor {path}: cannot read ({e.strerror})") from None
        res = compile_query(text, schema, name=str(path))
        q = QueryRun(res.obj, res.plan, num_workers=num_workers)
        q.path = str(path)
        q.begin()
        return q

    # -- the serving loop's side ---------------------------------------------------------
    def start(self, pings: int = 8, timeout_s: float = 5.0) -> None:
        self.channel.start(pings, timeout_s)

    def sink(self, ctx: Mapping[str, Any]) -> None:
        """The sim backend's sink: one context dict."""
        from ..megakernel.sim import pack_ctx
        self.feed(pack_ctx(ctx))

    def feed(self, rec: bytes) -> None:
        """One packed 128-byte context record (in nondecreasing ts order per worker)."""
        if self.closed:
            return
        step = _STEP.unpack_from(rec, _OFF_STEP)[0]
        st = self.stats
        st.events += 1
        if self.windows is not None:          # device summaries: device_progress flushes
            self.max_step = max(self.max_step, step)
            if step <= self.flushed_upto:
                st.late_events += 1
        else:
            if step > self.max_step:
                self.max_step = step
                if step - self.flush_lag > self.flushed_upto:
                    self._flush_through(step - self.flush_lag)
            if step > self.flushed_upto:
                if step not in self.open:
                    self.open[step] = None
                    if len(self.open) > self.max_open_epochs:
                        self._flush_through(min(self.open))
                    st.max_open_epochs = max(st.max_open_epochs, len(self.open))
            else:
                st.late_events += 1
        self.rt.fire(rec)
        for q in self.user:
            q.feed(rec)
        self._n += 1
        if self._n >= self.progress_every:
            self._n = 0
            self.channel.progress()

    def clock_sample(self, device_ns: int, host_ns: int) -> None:
        """A simultaneous reading of this rank's device clock and host clock."""
        if len(self.clock_q) >= MAX_CLOCK_SAMPLES_QUEUED:
            self.stats.clock_samples_dropped += 1
            return
        self.clock_q.append(ClockSample(self.rank, int(device_ns), int(host_ns)))

    def pingpong(self, t0_ns: int, t_remote_ns: int, t1_ns: int) -> None:
        """A host round trip measured outside the transport (the sim backend simulates the
        Score-P ping-pong on its simulated hosts); shipped like clock samples."""
        if len(self.clock_q) >= MAX_CLOCK_SAMPLES_QUEUED:
            self.stats.clock_samples_dropped += 1
            return
        self.clock_q.append(PingPong(self.rank, int(t0_ns), int(t_remote_ns), int(t1_ns)))

    def progress(self) -> None:
        self.channel.progress()

    def device_progress(self, fed_through: int) -> None:
        """Device summaries: the records of every step <= fed_through were fed.  Ships the
        epochs of each window that is complete on the device (runtime.summary_windows);
        reads the device only when one may be."""
        w = self.windows
        if w is None or self.closed or fed_through < w.due:
            return
        for got in w.read(min(fed_through, int(w.rt.final_epoch()))):
            self._flush_window(got)

    def _flush_window(self, got) -> None:
        """Flush epochs got.first .. got.end-1 from the window's maps and coverage (every
        step of the range is an epoch: the kernel ran it)."""
        self._window = got
        try:
            for k in range(max(got.first, self.flushed_upto + 1), got.end):
                self.open.setdefault(k, None)
            self.stats.max_open_epochs = max(self.stats.max_open_epochs, len(self.open))
            self._flush_through(got.end - 1)
        finally:
            self._window = None

    def close(self, timeout_s: float = 10.0) -> AgentStats:
        """Flush every open epoch, send the rest, say BYE (bounded wait).  With device
        summaries the launch has ended: every step that ran is final on the device."""
        if not self.closed:
            if self.windows is not None:
                for got in self.windows.close(int(self.windows.rt.final_epoch())):
                    self._flush_window(got)
            self._flush_through(max(self.max_step, self.flushed_upto))
            if self.clock_q:
                self._ship(self._take_clock())
            self.closed = True
            for q in self.user:
                self.user_blocks[q.path] = q.finish()
            if self.user_blocks and hasattr(self.channel, "note"):
                self._note_user_blocks()
            self.channel.close(timeout_s)
        return self.stats

    def _note_user_blocks(self) -> None:
        """Ship the user monitors' printed output (JSON blocks) as one NOTE; blocks that do
        not fit are cut and the note says how many."""
        import json
        blocks = [{"monitor": path, **b} for path, bs in self.user_blocks.items() for b in bs]
        cap = self.channel.max_payload
        while blocks:
            doc = {"rank": self.rank, "blocks": blocks, "cut": 0}
            data = json.dumps(doc).encode()
            if len(data) <= cap:
                break
            blocks = blocks[:len(blocks) // 2]
        n_all = sum(len(bs) for bs in self.user_blocks.values())
        doc = {"rank": self.rank, "blocks": blocks, "cut": n_all - len(blocks)}
        self.channel.note(json.dumps(doc).encode())

    # -- epochs ----------------------------------------------------------------------------
    def _flush_through(self, last: int) -> None:
        """Flush every open epoch <= last (and mark everything <= last flushed)."""
        if last <= self.flushed_upto and not any(k <= last for k in self.open):
            return
        snap = self._snapshot()
        # a device window's task half: reduced as arrays (summary_arrays), not as entries
        half = (WindowTasks(self._window.maps, self._window.first, self._window.end, TASK_MAPS)
                if self._window else None)
        self.stats.max_map_entries = max(self.stats.max_map_entries, max(len(v) for v in snap.values()),
                                         half.entries if half else 0)
        if half is not None:
            local_end = half.local_end()
        else:
            local_end: Dict[Tuple[int, int], int] = {}       # (step, event) -> last local end
            for (step, ev, _c), v in snap["end_ts"].items():
                t = _words(v, 1)[0]
                if t > local_end.get((step, ev), -1):
                    local_end[(step, ev)] = t
        evidence = self._drain_evidence(local_end, last)
        epochs = sorted(k for k in self.open if k <= last)
        for (step, op, gen, peer, layer), v in snap["signal_last"].items():
            if step <= last:
                evidence.setdefault(step, []).append(
                    Signal(self.rank, peer, op, gen, step, layer, _words(v, 1)[0]))
        # waits and signals first: their losses go into the summaries' coverage
        for k in epochs:
            self._ship(self._within_budget(k, evidence.pop(k, [])), epoch=k)
        for k, recs in evidence.items():        # evidence of other epochs (late or early)
            self._ship(self._within_budget(k, recs), epoch=k)
        cov = self._coverage(epochs)
        held = self._drain_held(last)
        by_step: Dict[int, Dict[str, Dict[Tuple[int, ...], bytes]]] = {}   # each epoch's entries, once
        for name, entries in snap.items():
            for key, v in entries.items():
                by_step.setdefault(key[0], {n: {} for n in snap})[name][key] = v
        empty = {n: {} for n in snap}
        for k in epochs:
            entries = by_step.get(k, empty)
            parts = half.of(k) if half is not None else parts_of_entries(k, entries)
            s = self._summary(k, parts, entries, cov.get(k, Coverage()))
            esc = self._escalate(s, held.pop(k, []))
            if esc:                      # before the summary: a live exporter builds the step at it
                self._ship(esc, epoch=k)
            self._ship([s] + self._take_clock(), epoch=k, summary=True)
            del self.open[k]
            self.stats.epochs += 1
        self._delete_upto(snap, last)
        self.flushed_upto = max(self.flushed_upto, last)
        self.channel.progress()

    def _snapshot(self) -> Dict[str, Dict[Tuple[int, ...], bytes]]:
        """Every summary map, {key words: value}: from the host runtime, or with device
        summaries the comm half's from the host and the task half's empty (the window being
        flushed is reduced as arrays: summary_arrays.WindowTasks)."""
        if self.windows is None:
            return {name: self._read(self.maps, name, n) for name, n in SUMMARY_MAPS.items()}
        return {name: self._read(self.maps, name, n) if name in COMM_MAPS else {}
                for name, n in SUMMARY_MAPS.items()}    # (the window's: WindowTasks)

    @staticmethod
    def _read(maps, name: str, nkeys: int) -> Dict[Tuple[int, ...], bytes]:
        return {_words(k, nkeys): bytes(v) for k, v in maps[name].snapshot().items()}

    def _delete_upto(self, snap, last: int) -> None:
        for name, entries in snap.items():
            if self.windows is not None and name not in COMM_MAPS:
                continue                  # a window's maps are dropped whole
            m = self.maps[name]
            n = SUMMARY_MAPS[name]
            for key in entries:
                if key[0] <= last:
                    m.delete(struct.pack("<%dQ" % n, *key))
        # coverage rows and evidence budget use of flushed epochs go (bounded memory)
        self.rt.coverage_table(self.aid).retire_epochs(last)
        if self._ev_tags:
            self.maps[EVIDENCE_MAP].retire_epochs(last)
        if self.spec_aid is not None:
            self.rt.coverage_table(self.spec_aid).retire_epochs(last)
            self.held_ring.retire_epochs(last)

    def _coverage(self, epochs: Sequence[int]) -> Dict[int, Coverage]:
        want = set(epochs)
        out: Dict[int, Coverage] = {}
        late = Coverage()
        for c in self.rt.coverage_table(self.aid).rows():
            if c.program not in self.programs:
                continue
            cv = Coverage(c.eligible, c.executed, c.throttled, c.lost)
            if c.epoch in want:
                out[c.epoch] = out.get(c.epoch, Coverage()) + cv
            elif c.epoch <= self.flushed_upto:
                # events of an epoch already shipped: their map output was discarded
                late = late + Coverage(cv.eligible, 0, cv.throttled, cv.executed + cv.lost)
        self.late_cov = self.late_cov + late
        if self._window is not None:          # the device window's rows (its range only)
            for c in self._window.coverage:
                if c.epoch in want:
                    out[c.epoch] = out.get(c.epoch, Coverage()) + Coverage(c.eligible, c.executed, c.throttled,
                                                                           c.lost)
        if epochs and self.late_cov.eligible:
            k = epochs[0]
            c = out.get(k, Coverage()) + self.late_cov
            self.late_cov = Coverage()
            out[k] = c
        for k in list(self.throttled_by_epoch):
            if k in want:
                n = self.throttled_by_epoch.pop(k)
                c = out.get(k, Coverage())
                moved = min(n, c.executed)
                out[k] = Coverage(c.eligible, c.executed - moved, c.throttled + moved, c.lost)
            elif k <= self.flushed_upto:
                self.throttled_by_epoch.pop(k)     # a flushed epoch: its summary is gone
        for k in list(self.lost_by_epoch):
            if k in want or k <= self.flushed_upto:
                n = self.lost_by_epoch.pop(k)
                tgt = k if k in want else epochs[0] if epochs else None
                if tgt is None:
                    continue
                c = out.get(tgt, Coverage())
                moved = min(n, c.executed)
                out[tgt] = Coverage(c.eligible, c.executed - moved, c.throttled, c.lost + moved)
        return out

    def _drain_evidence(self, local_end: Mapping[Tuple[int, int], int], last: int) -> Dict[int, List[Any]]:
        """The comm evidence drained from the ring, as RemoteWait / Signal records by epoch.
        With device summaries the records of epochs after `last` wait for their window's
        flush (local_end, from @end_ts, comes with it)."""
        by_epoch: Dict[int, List[Any]] = {}
        ring = self.maps[EVIDENCE_MAP] if self._ev_tags else None
        if ring is None:
            return by_epoch
        held, self._ev_held = self._ev_held, []
        for w in held + [_words(rec.data, len(rec.data) // 8) for rec in ring.drain()]:
            nw = len(w)
            if self.windows is not None and nw >= 5 and w[4] > last:   # (tag, op, gen, peer, step, ...)
                self._ev_held.append(w)
                continue
            kind = self._ev_tags.get(w[0])
            if kind == "wait" and nw >= 9:
                op, gen, peer, step, layer, cls, ts, wait = w[1:9]
                begin = max(0, ts - wait)
                if nw >= 10:       # not before the awaited event's local inputs were complete
                    begin = min(max(begin, local_end.get((step, w[9]), 0)), ts)
                r = RemoteWait(self.rank, peer, op, gen, step, layer, cls, begin, ts)
            elif kind == "signal" and nw >= 7:
                op, gen, peer, step, layer, ts = w[1:7]
                r = Signal(self.rank, peer, op, gen, step, layer, ts)
            else:
                continue
            by_epoch.setdefault(r.step, []).append(r)
        return by_epoch

    # -- escalated evidence (module doc) ---------------------------------------------------
    def _drain_held(self, last: int) -> Dict[int, List[Tuple[int, ...]]]:
        """The held task runs of epochs <= last, by epoch: (class, layer, tile, index,
        worker, begin, end); those of still open epochs stay held (self._held)."""
        if self.spec_aid is None:
            return {}
        for rec in self.held_ring.drain():
            w = _words(rec.data, len(rec.data) // 8)
            if len(w) < 8:
                continue
            step, cls, layer, tile, index, ts, dur = w[1:8]
            self._held.setdefault(step, []).append((cls, layer, tile, index, rec.worker, max(0, ts - dur), ts))
        out = {k: self._held.pop(k) for k in [k for k in self._held if k <= last]}
        self.stats.held_runs += sum(len(v) for v in out.values())
        return out

    def _escalate(self, s: EpochSummary, runs: List[Tuple[int, ...]]) -> List[TaskEvidence]:
        """The TaskEvidence of epoch `s` when a predicate fires on its summary, else []."""
        if self.spec_aid is None:
            return []

        def median(v):
            return sorted(v)[len(v) // 2] if len(v) >= MIN_HISTORY else None
        base_step = median(self.step_history)
        slow = base_step is not None and s.step_ns > SLOW_STEP_FACTOR * base_step
        base = {c.task_class: median(self.class_history.get(c.task_class, ())) for c in s.classes}
        outliers = {c.task_class for c in s.classes
                    if base[c.task_class] and c.dur_max_ns > OUTLIER_FACTOR * base[c.task_class]}
        self.step_history = (self.step_history + [s.step_ns])[-STEP_HISTORY:]
        for c in s.classes:
            if c.count:
                self.class_history[c.task_class] = (self.class_history.get(c.task_class, [])
                                                    + [c.dur_max_ns])[-STEP_HISTORY:]
        if not runs or not (slow or outliers):
            return []
        picked = []
        for r in runs:
            cls, dur = r[0], r[6] - r[5]
            ratio = dur / base[cls] if base.get(cls) else 0.0
            if cls in outliers and ratio > OUTLIER_FACTOR:
                picked.append((ratio, REASON_CLASS_OUTLIER, r))
            elif slow:
                picked.append((ratio, REASON_SLOW_STEP, r))
        picked.sort(key=lambda x: (-x[0], x[2][3], x[2][4]))
        out = [TaskEvidence(self.rank, s.epoch, r[0], r[1], r[2], r[3], r[4], r[5], r[6], why)
               for _, why, r in picked[:ESCALATE_MAX]]
        if out:
            self.stats.escalated_epochs += 1
            self.stats.escalated_runs += len(out)
        return out

    def _within_budget(self, epoch: int, recs: List[Any]) -> List[Any]:
        """The records of `epoch` that fit its byte budget; the rest count as throttled."""
        if self.budget is None or not recs:
            return recs
        used = self.stats.bytes_per_epoch.get(epoch, 0)
        out = []
        for r in recs:
            n = len(pack(r))
            if used + n > self.budget:
                self.throttled_by_epoch[epoch] = self.throttled_by_epoch.get(epoch, 0) + 1
                continue
            used += n
            out.append(r)
        return out

    def _take_clock(self) -> List[Any]:
        q, self.clock_q = self.clock_q, []
        return q

    def _summary(self, k: int, parts: TaskParts, snap, cov: Coverage) -> EpochSummary:
        """Epoch k's EpochSummary from its task half's reductions (summary_arrays) and the
        comm half's entries (those of step k: the caller splits a flush's snapshot by step
        once)."""
        rw = snap["remote_wait"].get((k,))
        rwc, rws, rwm = 0, 0, 0
        if rw is not None:
            rwc, rws, _mn, rwm = _words(rw, 4)
        b = parts.t_begin if parts.t_begin is not None else 0
        # the epoch's end: its last task:end, the largest producer end of any event
        e = parts.end if parts.end is not None else b
        if b == U64:
            b = e
        classes = tuple(ClassStat(c, *v) for c, v in sorted(parts.classes.items()))
        return EpochSummary(self.rank, k, b, max(e, b), classes, parts.qmax, parts.qworker, parts.experts,
                            rwc, rws, rwm, cov)

    # -- shipping ----------------------------------------------------------------------------
    def _ship(self, records: Iterable[Any], epoch: Optional[int] = None, summary: bool = False) -> None:
        """Pack records into messages of whole records and hand them to the channel."""
        cap = self.channel.max_payload
        buf: List[bytes] = []
        size = 0
        waits = 0            # wait/signal records in buf (their loss is coverage loss)
        sent_bytes = 0
        for r in records:
            self.stats.records += 1
            b = pack(r)
            if size + len(b) > cap and buf:
                sent_bytes += self._send(buf, waits, epoch)
                buf, size, waits = [], 0, 0
            buf.append(b)
            size += len(b)
            if isinstance(r, (RemoteWait, Signal)):
                waits += 1
        if buf:
            sent_bytes += self._send(buf, waits, epoch)
        if epoch is not None:
            self.stats.bytes_per_epoch[epoch] = self.stats.bytes_per_epoch.get(epoch, 0) + sent_bytes

    def _send(self, buf: List[bytes], evidence: int, epoch: Optional[int]) -> int:
        payload = b"".join(buf)
        if self.channel.send(payload, len(buf)):
            self.stats.records_sent += len(buf)
            self.stats.bytes_sent += len(payload)
            return len(payload)
        self.stats.records_lost += len(buf)
        self.channel.add_lost(len(buf))
        if evidence and epoch is not None:
            self.lost_by_epoch[epoch] = self.lost_by_epoch.get(epoch, 0) + evidence
        return 0
