"""sim backend: a discrete-event simulation of the reference megakernel on the CPU.

It runs the graph of `graph.build_graph` with the same scheduler policy as the GPU
kernel (one worker per SM, static per-worker plans, workers wait on their task's event,
a dynamic FIFO queue for MoE expert tasks filled by the router; see graph.py), request
slots with request generations (continuous batching) and the fault table
(`faults.py`), and emits the hook contexts of every ABI hook at the places
docs/dev/megakernel_contract.md ("Hook semantics", "Tensor parallelism") defines.  It computes no
numerics: it reports simulated time (ns) per decode step.

    result = simulate(graph, steps=8, faults=table, sink=print, seed=0)
    result.step_ns, result.tokens_per_s, result.hook_counts

Sinks
-----
`sink` is any callable taking one context (a dict with "hook" = hook name and every
field the ABI declares valid for that hook; `dtrace_mk.abi.context.from_dict` packs
it).  It is called in nondecreasing ts_ns order, on the calling thread; it must not
raise (an exception aborts the simulation).  Helpers: `runtime_sink(rt)` (feeds
`ReferenceRuntime.fire`; with `hooks=runtime_hooks(rt)` only attached hooks are
built), `records_sink(list)` (packed 128-byte records), `jsonl_sink(fh)`, `tee(...)`.  `hooks=` limits which hooks are built at all (like the kernel's
enable mask); `sink=None` builds none.

Timing (cost.py)
----------------
dispatch -> begin: dispatch_ns; begin -> end: fixed_ns + per_row_ns * rows (+ slow
faults); a signal lands notify_ns after the end (+ late_notification); the next step
starts step_overhead_ns after argmax's signal lands.  A queue_saturation phantom
costs filler_ns.  A comm task's signal to another rank is issued at its end (+
late_notification + late_comm) and lands comm_ns later on the peer (visible there at
once: comm_ns includes the flag propagation).

Continuous batching
-------------------
`batch` slots, filled exactly as the GPU kernel and `reference.py` do
(`reference.Requests`): slot b's generation g starts at position 0 and runs
`req_len(b, g)` steps.  Every step gives every slot one token; its `attn` task costs
per KV row (position + 1).  At a step's end gen:advance fires per slot with the
generation of the request that got the token; a slot whose request reached its length
is refilled (request_gen + 1, position 0).

Ranks (tensor parallelism, graph.py)
------------------------------------
Every event has an `owner_rank`.  Only `allreduce` comm tasks signal other ranks'
events: at the issue time the sim fires **comm:signal** (the comm task's fields;
event_id/event_gen = the peer's event and the target the signal counts toward;
comm_op; comm_gen = step * n_layers + layer; peer_rank = the receiver; FLAG_REMOTE)
and hands `(event, owner_rank, count, arrival ts, comm_op, comm_gen)` to
`transport.send`.  Arriving signals enter through `Sim.deliver(event, count, ts,
sender, seq, comm_op, comm_gen)`.  The consumer of a remote-fed (receive) event fires
**comm:wait** once per step when its wait ends -- at the same time as its dep:release,
or when the worker first sees it ready if it never waited: comm_op/comm_gen as the
last remote signal carried them, peer_rank = the rank whose signal landed last,
wait_ns = min(max(last remote landing - time the worker reached the task, 0), the
dependency wait) (the part of the wait the remote data was missing; FLAG_REMOTE).
task:ready / dep:wait / dep:release / task:begin of such a consumer carry FLAG_REMOTE,
and task:end / comm:signal of a comm task that signals a peer.  `late_comm` delays the
issue of matching comm tasks' signals to peers (not the rank's own slot): comm:signal
is late, the peers stall.  A single `Sim.run()` handles single-rank graphs; multi-rank
runs go through `mpi_transport` (`run_loopback`, `run_mpi`), which call `start`,
`advance`, `next_ts`, `deliver` and `finish`.

GPU semantics (options, default off)
------------------------------------
`gpu_comm_wait=True` emits comm:wait the way the GPU kernel does (it cannot observe when
a remote signal landed): wait_ns = the consumer's whole dependency wait, ts = its
release (first sight of ready), as the contract's "GPU side (as built)" says.
`launch_skew_ns=S` delays the start of every step k on this rank by a deterministic
amount in [0, S] (splitmix64 of seed, rank, step), like one host launch per step
whose ranks start apart.  Defaults leave every stream byte-identical.

Clocks
------
`clock=RankClock(...)` maps the emitted ts_ns (only those) to a rank's device clock
(offset, drift, 32 ns ticks); `SimResult.clock_samples` holds (device_ns, host_ns) at
every step start and at the end, `on_clock(device_ns, host_ns)` gets them as they are
taken.  The default is the identity (single-rank streams are unchanged).
"""
from __future__ import annotations

import heapq
import json
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

from ..abi import context
from ..abi import definition as D
from ..errors import UserError
from . import faults as F
from .cost import ModelCosts, lowered_costs, model_costs
from .graph import CLASS_IDS, TaskGraph
from .reference import Requests

NONE = D.NONE_U32
Sink = Callable[[Dict[str, Any]], Any]

_H_READY, _H_DISPATCH, _H_BEGIN, _H_END = "task:ready", "task:dispatch", "task:begin", "task:end"
_H_WAIT, _H_RELEASE, _H_GEN, _H_PRESSURE = "dep:wait", "dep:release", "gen:advance", "queue:pressure"
_H_CSIGNAL, _H_CWAIT = "comm:signal", "comm:wait"
SIM_HOOKS = (_H_READY, _H_DISPATCH, _H_BEGIN, _H_END, _H_WAIT, _H_RELEASE, _H_GEN, _H_PRESSURE,
             _H_CSIGNAL, _H_CWAIT)

# heap event codes
(_SIGNAL, _BOUNDARY, _BEGIN, _END, _DYN_PUSH, _STEP_START, _PHANTOMS_DONE, _WAKE, _DYN_START,
 _RSIGNAL, _COMM_SIGNAL) = range(11)

_C_ATTN = CLASS_IDS["attn"]
_C_ARGMAX = CLASS_IDS["argmax"]
_C_ROUTER = CLASS_IDS["moe_router"]


# --------------------------------------------------------------------------------- sinks

# A sim context dict -> its 128-byte record (values are in range by construction).
pack_ctx = context.pack_trusted


def runtime_sink(runtime) -> Sink:
    """Feed every context into `ReferenceRuntime.fire` (epoch = decode step)."""
    fire = runtime.fire
    return lambda ctx: fire(pack_ctx(ctx))


def runtime_hooks(runtime) -> List[str]:
    """Names of the hooks that have programs attached in `runtime`: pass as `hooks=` so
    the sim builds only contexts someone reads (packing dominates otherwise)."""
    names = {p.hook.name for aid in runtime.attachments() for p in runtime.attachment(aid).obj.programs}
    return [h for h in SIM_HOOKS if h in names]


def records_sink(out: List[bytes]) -> Sink:
    """Append packed 128-byte records to `out`."""
    return lambda ctx: out.append(pack_ctx(ctx))


def jsonl_sink(fh) -> Sink:
    """Write one JSON object per context (the events-file format of abi.context)."""
    def w(ctx: Dict[str, Any]) -> None:
        fh.write(json.dumps({k: v for k, v in ctx.items() if k != "abi_version"}) + "\n")
    return w


def tee(*sinks: Optional[Sink]) -> Optional[Sink]:
    live = [s for s in sinks if s is not None]
    if not live:
        return None
    if len(live) == 1:
        return live[0]
    return lambda ctx: [s(ctx) for s in live]


# ----------------------------------------------------------------------------- transport

class LocalTransport:
    """Single rank: no event is remote.  Multi-rank transports (`mpi_transport.py`)
    implement the same `send`; signals arriving from peers enter through `Sim.deliver`."""

    def send(self, event: int, owner_rank: int, count: int, ts_ns: int, comm_op: int = -1,
             comm_gen: int = 0) -> None:
        raise UserError(f"event {event} is owned by rank {owner_rank}: a multi-rank graph needs a "
                        f"multi-rank transport (dtrace_mk.megakernel.mpi_transport)")


# ------------------------------------------------------------------------------- clocks

@dataclass(frozen=True)
class RankClock:
    """A rank's device clock (`%globaltimer`) and host clock as functions of sim time t:

        device_ns(t) = floor((t + offset_ns + t * drift_ppb / 1e9) / quantum_ns) * quantum_ns
        host_ns(t)   = t + host_offset_ns (+ a deterministic read jitter in [0, jitter_ns))

    Only the ts_ns of emitted hook contexts and the clock samples go through it; the
    simulation's causality (and SimResult's step times) stay in sim time.  The default
    (`RankClock()`) is the identity."""
    offset_ns: int = 0
    drift_ppb: int = 0            # parts per billion (1 ppm = 1000 ppb); may be negative
    quantum_ns: int = 1
    host_offset_ns: int = 0
    jitter_ns: int = 0
    seed: int = 0

    @property
    def identity(self) -> bool:
        return self.offset_ns == 0 and self.drift_ppb == 0 and self.quantum_ns == 1

    def device_ns(self, t: int) -> int:
        v = t + self.offset_ns + (t * self.drift_ppb) // 1_000_000_000
        return v - v % self.quantum_ns

    def host_ns(self, t: int, sample: int = 0) -> int:
        j = F.splitmix64(self.seed ^ (sample * 0x9E3779B97F4A7C15 & F.M64)) % self.jitter_ns if self.jitter_ns else 0
        return t + self.host_offset_ns + j

    @classmethod
    def for_rank(cls, rank: int, seed: int = 0, ranks_per_host: int = 8) -> "RankClock":
        """A realistic, deterministic clock for `rank`: offset 37..236 us, drift +-1..4 ppm,
        32 ns ticks (H200 %globaltimer); the host clock of host rank // ranks_per_host is
        offset 0 (host 0) or 1..50 us, read with up to 200 ns jitter."""
        h = F.splitmix64((seed * 0x100000001B3 + rank + 1) & F.M64)
        offset = 37_000 + h % 200_000
        drift = 1000 + (h >> 20) % 3001
        if (h >> 40) & 1:
            drift = -drift
        host = rank // max(ranks_per_host, 1)
        hh = F.splitmix64((seed * 0x100000001B3 + 0xC0FFEE + host) & F.M64)
        host_off = 0 if host == 0 else 1000 + hh % 49_000
        return cls(offset, drift, 32, host_off, 200, F.splitmix64(h))


# -------------------------------------------------------------------------------- result

@dataclass
class SimResult:
    steps: int
    batch: int
    step_start_ns: List[int]
    step_end_ns: List[int]
    hook_counts: Dict[str, int]
    tasks_run: int
    dynamic_tasks: List[int]          # dynamic (expert) tasks run per step
    requests_finished: int
    trace: List[Tuple[int, int, int, int, int, int]] = field(default_factory=list)
    # (task_index, step, worker, begin_ns, end_ns, flags) when collect_trace
    rank: int = 0
    clock_samples: List[Tuple[int, int]] = field(default_factory=list)
    # (device_ns, host_ns) at every step start and at the end (see RankClock)
    signals_sent: int = 0             # signals sent to other ranks
    signals_received: int = 0
    comm_wait_ns: int = 0             # sum of comm:wait wait_ns (remote data not there yet)

    @property
    def step_ns(self) -> List[int]:
        return [e - s for s, e in zip(self.step_start_ns, self.step_end_ns)]

    @property
    def total_ns(self) -> int:
        return self.step_end_ns[-1] if self.step_end_ns else 0

    @property
    def tokens(self) -> int:
        return self.batch * self.steps

    @property
    def tokens_per_s(self) -> float:
        return self.tokens * 1e9 / self.total_ns if self.total_ns else 0.0


# ------------------------------------------------------------------------------------ sim

END_OF_TIME = 1 << 62


class Sim:
    """One rank's simulation.  `run()` runs it alone (single-rank graphs); multi-rank
    drivers (`mpi_transport.py`) call `start()`, then alternately `advance(until)`,
    `next_ts()` and `deliver(...)`, and finally `finish()`."""

    def __init__(self, graph: TaskGraph, steps: int, *, faults: Optional[F.FaultTable] = None,
                 costs: Optional[ModelCosts] = None, seed: int = 0, sink: Optional[Sink] = None,
                 hooks: Optional[Iterable[str]] = None, queue_threshold: int = 16,
                 transport=None, collect_trace: bool = False, requests: Optional[Requests] = None,
                 clock: Optional[RankClock] = None,
                 on_clock: Optional[Callable[[int, int], Any]] = None,
                 gpu_comm_wait: bool = False, launch_skew_ns: int = 0):
        if steps < 0:
            raise UserError(f"--steps: expected >= 0, got {steps}")
        if queue_threshold < 1:
            raise UserError(f"queue_threshold: expected >= 1, got {queue_threshold}")
        self.g, self.cfg, self.steps = graph, graph.cfg, steps
        self.costs = lowered_costs(costs or model_costs(graph.cfg, ranks=graph.ranks), graph.cfg, graph.ranks)
        self.faults = faults or F.FaultTable()
        self.seed = seed
        self.sink = sink
        if hooks is None:
            hooks = SIM_HOOKS
        hooks = set(hooks)
        for h in hooks:
            if h not in D.HOOKS_BY_NAME:
                raise UserError(f"hooks: unknown hook {h!r}")
        self.on = {h: (sink is not None and h in hooks) for h in SIM_HOOKS}
        self.threshold = queue_threshold
        self.transport = transport or LocalTransport()
        self.collect_trace = collect_trace
        self.rank = graph.rank
        self.requests = requests or Requests()
        self.clock = clock or RankClock()
        self.on_clock = on_clock
        if launch_skew_ns < 0:
            raise UserError(f"launch_skew_ns: expected >= 0, got {launch_skew_ns}")
        self.gpu_comm_wait = bool(gpu_comm_wait)
        self.launch_skew_ns = int(launch_skew_ns)
        if graph.ranks > 1 and self.costs.comm_ns < 1:
            raise UserError(f"comm_ns: expected >= 1 ns for a multi-rank graph (it is the lookahead), "
                            f"got {self.costs.comm_ns}")
        self._started = False
        self._check_faults()

    def _check_faults(self) -> None:
        W = self.g.num_workers
        for i, r in enumerate(self.faults.rows):
            if r.kind == F.QUEUE_SATURATION and r.param_a >= W:
                raise UserError(f"{self.faults.source}[{i}].worker: {r.param_a} is out of range "
                                f"for {W} workers")
            if r.kind == F.ROUTING_SKEW and self.cfg.moe_layers and r.param_a >= self.cfg.n_experts:
                raise UserError(f"{self.faults.source}[{i}].expert: {r.param_a} is out of range "
                                f"for {self.cfg.n_experts} experts")

    # ---------------------------------------------------------------- fault helpers
    def _fault_rows(self) -> None:
        rows = self.faults.rows
        self.f_slow = [r for r in rows if r.kind == F.SLOW_TASK_CLASS]
        self.f_late = [r for r in rows if r.kind == F.LATE_NOTIFICATION]
        self.f_starve = [r for r in rows if r.kind == F.STARVE_READY]
        self.f_skew = [r for r in rows if r.kind == F.ROUTING_SKEW]
        self.f_sat = [r for r in rows if r.kind == F.QUEUE_SATURATION]
        self.f_comm = [r for r in rows if r.kind == F.LATE_COMM]

    @staticmethod
    def _sum(rows, t: int, k: int, cls: int, layer: int) -> int:
        s = 0
        for r in rows:
            if r.in_scope(k, layer, cls) and r.picks(t, k):
                s += r.param_a
        return s

    # ---------------------------------------------------------------------- run
    def run(self) -> SimResult:
        """Run all steps of a single-rank graph (or a multi-rank one whose transport
        never sends: use `mpi_transport` for multi-rank runs)."""
        if self.g.ranks > 1 and isinstance(self.transport, LocalTransport):
            raise UserError(f"rank {self.rank} of {self.g.ranks}: a multi-rank graph needs a multi-rank "
                            f"transport (dtrace_mk.megakernel.mpi_transport: run_loopback, run_mpi)")
        self.start()
        self.advance(END_OF_TIME)
        return self.finish()

    def next_ts(self) -> int:
        """Sim time of the next pending event (END_OF_TIME when none)."""
        h = self._heap
        return h[0][0] if h else END_OF_TIME

    def deliver(self, event: int, count: int, ts_ns: int, sender: int, seq: int, comm_op: int = -1,
                comm_gen: int = 0) -> None:
        """A signal from rank `sender` (its `seq`-th send) lands on `event` at `ts_ns`.
        Deliveries sort after local events of the same ts, then by (sender, seq), so the
        order never depends on when the driver delivered them (only before ts)."""
        key = (sender << 40) | seq
        self._rmeta[key] = (comm_op, comm_gen)
        heapq.heappush(self._heap, (ts_ns, 1, key, _RSIGNAL, event, count))

    def start(self) -> None:
        if self._started:
            raise RuntimeError("Sim.start: already started")
        self._started = True
        self._heap: List[Tuple[int, int, int, int, int, int]] = []
        self._rmeta: Dict[int, Tuple[int, int]] = {}
        self.clock_samples: List[Tuple[int, int]] = []
        self._build()

    def advance(self, until: int) -> None:
        """Process every pending event with ts < until."""
        self._advance(until)

    def finish(self) -> SimResult:
        return self._finish()

    # ------------------------------------------------------------------- the model
    def _build(self) -> None:
        g, cfg, costs = self.g, self.cfg, self.costs
        W, B, steps = g.num_workers, g.batch, self.steps
        self._fault_rows()
        tasks = g.tasks
        T = len(tasks)
        t_cls = [t.cls for t in tasks]
        t_layer = [t.layer for t in tasks]
        t_expert = [t.expert for t in tasks]
        t_tile = [t.tile_packed for t in tasks]
        t_slot = [t.slot for t in tasks]
        t_wait = [t.wait_event for t in tasks]
        t_wcount = [t.wait_count for t in tasks]
        t_sig = [t.signal_event for t in tasks]
        t_dyn = [t.dynamic for t in tasks]
        ev_trig = [e.triggers for e in g.events]
        ev_owner = [e.owner_rank for e in g.events]
        ev_cop = [e.comm_op for e in g.events]
        owner = g.task_worker()
        plans = g.worker_plans
        consumers = [[i for i in c if not t_dyn[i]] for c in g.consumers()]
        fixed, per_row = costs.by_class_id()
        base_ns = [int(fixed[c] + per_row[c] * B) for c in t_cls]
        notify, disp_ns, comm_ns = costs.notify_ns, costs.dispatch_ns, costs.comm_ns
        step_event = g.step_event
        moe_by_router = {m.router_task: m for m in g.moe}
        rank = self.rank
        n_layers = cfg.n_layers
        # remote structure: FLAG_REMOTE on hooks naming a remote-fed wait event / a remote signal
        ev_rfed = [g.remote_fed(e) for e in range(len(g.events))]
        wflag = [D.FLAG_REMOTE if (w >= 0 and ev_rfed[w]) else 0 for w in t_wait]
        sflag = [D.FLAG_REMOTE if ev_owner[s] != rank else 0 for s in t_sig]
        t_cop = [ev_cop[s] for s in t_sig]            # comm op of a comm task (-1 otherwise)
        # queue_saturation: first plan task of each layer per worker
        first_of_layer: Dict[int, int] = {}
        for w, plan in enumerate(plans):
            seen = set()
            for i in plan:
                if t_layer[i] not in seen:
                    seen.add(t_layer[i])
                    first_of_layer[i] = w
        sat_layer = [r for r in self.f_sat if r.layer >= 0]
        sat_step = [r for r in self.f_sat if r.layer < 0]
        any_task_fault = bool(self.f_slow or self.f_late or self.f_starve)
        f_comm = self.f_comm

        sink, on = self.sink, self.on
        on_ready, on_disp, on_begin, on_end = on[_H_READY], on[_H_DISPATCH], on[_H_BEGIN], on[_H_END]
        on_wait, on_rel, on_gen, on_press = on[_H_WAIT], on[_H_RELEASE], on[_H_GEN], on[_H_PRESSURE]
        on_csig, on_cwait = on[_H_CSIGNAL], on[_H_CWAIT]
        counts = dict.fromkeys(SIM_HOOKS, 0)
        clock = self.clock
        dev = None if clock.identity else clock.device_ns

        # ---- request slots (continuous batching; same model as reference.py / the kernel)
        req = self.requests
        req_gen = [0] * B
        pos = [0] * B                        # position of the slot's current token
        req_len = [req.req_len(s, 0, cfg.max_seq) for s in range(B)]
        fin = [0]                            # requests finished

        # ---- dynamic state ----------------------------------------------------------
        heap = self._heap
        rmeta = self._rmeta
        seqc = [0]
        count = [0] * len(g.events)          # visible signals, monotonic
        ready_ts = [-1] * T                  # when the task became ready in its current step
        task_step = [0] * T                  # step of the task's current/last readiness
        flags_of = [0] * T
        cost_of = [0] * T                    # duration of the task's current run
        depth = [0] * W                      # ready-queue depth (static ready + phantoms)
        phantom = [0] * W
        busy = [False] * W
        w_step = [0] * W                     # step of the worker's plan position
        w_pos = [0] * W
        w_task = [-1] * W                    # task running (or -1)
        w_task_step = [0] * W
        w_wait_task = [-1] * W               # static task the worker is waiting on
        w_wait_start = [0] * W
        w_dep_wait = [0] * W                 # dependency wait of the running task
        w_arrived = [-1] * W                 # head task the worker has reached (phantoms added)
        w_obs = [-1] * W                     # when the worker first saw its head task ready
        w_obs_dep = [0] * W                  # that task's dependency wait
        w_dispatch = [0] * W
        w_pending: List[Tuple[int, int, int]] = [(0, 0, 0)] * W   # starved dynamic task
        dynq: deque = deque()                # (task, step, ready_ts, rows)
        dyn_count = [0] * max(steps, 1)
        step_start = [0] * steps
        step_end = [0] * steps
        trace = []
        tasks_run = [0]
        sent = [0]
        received = [0]
        comm_wait_ns = [0]
        route_tokens: Dict[Tuple[int, int], List[int]] = {}
        # remote-fed events: the last remote signal of the current generation
        ev_rpeer = [NONE] * len(g.events)
        ev_rts = [0] * len(g.events)
        ev_rid = [(-1, 0)] * len(g.events)   # (comm_op, comm_gen) the peer sent
        t_rinfo: Dict[int, Tuple[int, int, int, int]] = {}   # consumer -> (peer, ts, op, gen)

        gpu_wait, skew_ns = self.gpu_comm_wait, self.launch_skew_ns

        def launch_skew(k: int) -> int:
            """launch_skew_ns: step k starts this much later on this rank (a separate host
            launch per step), in [0, launch_skew_ns], deterministic per (seed, rank, step)."""
            if not skew_ns:
                return 0
            return F.splitmix64((self.seed * 0x100000001B3 ^ (rank << 32) ^ k ^ 0x5CE3) & F.M64) % (skew_ns + 1)

        def push(ts: int, code: int, a: int = 0, b: int = 0) -> None:
            seqc[0] += 1
            heapq.heappush(heap, (ts, 0, seqc[0], code, a, b))

        def task_ctx(h: str, ts: int, w: int, t: int, k: int) -> Dict[str, Any]:
            s = t_slot[t]
            return {"hook": h, "abi_version": 1, "ts_ns": ts, "rank": rank, "sm": w, "worker": w,
                    "decode_step": k, "flags": flags_of[t], "task_class": t_cls[t], "task_index": t,
                    "task_gen": k, "tile": t_tile[t], "request_slot": s,
                    "request_gen": req_gen[s] if s != NONE else NONE, "layer": t_layer[t],
                    "expert": t_expert[t]}

        if dev is None:
            def emit(h: str, d: Dict[str, Any]) -> None:
                counts[h] += 1
                sink(d)
        else:
            def emit(h: str, d: Dict[str, Any]) -> None:
                counts[h] += 1
                d["ts_ns"] = dev(d["ts_ns"])
                sink(d)

        def clock_sample(t: int) -> None:
            smp = (clock.device_ns(t), clock.host_ns(t, len(self.clock_samples)))
            self.clock_samples.append(smp)
            if self.on_clock is not None:
                self.on_clock(*smp)

        def wait_ids(t: int, k: int) -> Tuple[int, int]:
            e = t_wait[t]
            return (step_event, k) if e < 0 else (e, t_wcount[t] * (k + 1))

        def pressure(w: int, ts: int, k: int, cls: int, layer: int, d: int) -> None:
            if d == self.threshold:
                if on_press:
                    emit(_H_PRESSURE, {"hook": _H_PRESSURE, "abi_version": 1, "ts_ns": ts, "rank": rank,
                                       "sm": w, "worker": w, "decode_step": k, "flags": 0,
                                       "queue_depth": d, "task_class": cls, "layer": layer})
                else:
                    counts[_H_PRESSURE] += 1

        def add_phantoms(w: int, n: int, ts: int, k: int) -> None:
            for _ in range(n):
                phantom[w] += 1
                depth[w] += 1
                pressure(w, ts, k, NONE, NONE, depth[w])

        def comm_delay(t: int, k: int) -> int:
            """late_comm: extra ns before comm task t's signal to a peer is issued."""
            return self._sum(f_comm, t, k, t_cop[t], t_layer[t]) if (f_comm and sflag[t]) else 0

        def task_faults(t: int, k: int) -> None:
            """Compute the fault flag and duration of task t at step k (at readiness)."""
            f = D.FLAG_DYNAMIC if t_dyn[t] else 0
            c = cost_of[t]
            if any_task_fault:
                cl, ly = t_cls[t], t_layer[t]
                extra = self._sum(self.f_slow, t, k, cl, ly)
                if extra or self._sum(self.f_late, t, k, cl, ly) or self._sum(self.f_starve, t, k, cl, ly):
                    f |= D.FLAG_FAULT
                c += extra
            if t_cls[t] == _C_ROUTER and any(r.in_scope(k, t_layer[t]) for r in self.f_skew):
                f |= D.FLAG_FAULT
            if f_comm and comm_delay(t, k):
                f |= D.FLAG_FAULT
            flags_of[t] = f
            cost_of[t] = c

        def make_ready(t: int, k: int, ts: int, ev: int, gen: int) -> None:
            w = owner[t]
            ready_ts[t] = ts
            task_step[t] = k
            if t_cls[t] == _C_ATTN:
                cost_of[t] = int(fixed[_C_ATTN] + per_row[_C_ATTN] * (pos[t_slot[t]] + 1))
            else:
                cost_of[t] = base_ns[t]
            task_faults(t, k)
            depth[w] += 1
            if on_ready:
                d = task_ctx(_H_READY, ts, w, t, k)
                d["event_id"], d["event_gen"], d["queue_depth"] = ev, gen, depth[w]
                d["flags"] |= wflag[t]
                emit(_H_READY, d)
            else:
                counts[_H_READY] += 1
            pressure(w, ts, k, t_cls[t], t_layer[t], depth[w])
            if not busy[w] and w_wait_task[w] == t:
                push(ts, _BOUNDARY, w)

        def start_task(w: int, t: int, k: int, now: int, rdy: int, dep_wait: int) -> None:
            busy[w] = True
            w_task[w], w_task_step[w], w_dep_wait[w], w_dispatch[w] = t, k, dep_wait, now
            if on_disp:
                d = task_ctx(_H_DISPATCH, now, w, t, k)
                d["queue_depth"], d["wait_ns"] = (len(dynq) if t_dyn[t] else depth[w]), now - rdy
                emit(_H_DISPATCH, d)
            else:
                counts[_H_DISPATCH] += 1
            tasks_run[0] += 1
            push(now + disp_ns, _BEGIN, w)

        def comm_wait(w: int, t: int, k: int, now: int, reached: int) -> None:
            """comm:wait of a consumer of a remote-fed event at the end of its wait."""
            peer, rts, op, cgen = t_rinfo.get(t, (NONE, 0, -1, 0))
            wait = (now - reached) if gpu_wait else min(max(rts - reached, 0), now - reached)
            comm_wait_ns[0] += wait
            if not on_cwait:
                counts[_H_CWAIT] += 1
                return
            ev, gen = wait_ids(t, k)
            d = task_ctx(_H_CWAIT, now, w, t, k)
            d["event_id"], d["event_gen"], d["comm_op"], d["comm_gen"], d["peer_rank"] = \
                ev, gen, op, cgen, peer
            d["wait_ns"] = wait
            d["flags"] |= D.FLAG_REMOTE
            emit(_H_CWAIT, d)

        def boundary(w: int, now: int) -> None:
            """Worker w is free at `now`: run its next static task if ready, else wait on
            it (taking dynamic tasks meanwhile).  Mirrors kernels/megakernel.cu."""
            if busy[w]:
                return
            k = w_step[w]
            if k < steps and plans[w]:
                pos_ = w_pos[w]
                t = plans[w][pos_]
                if w_arrived[w] != t:                       # the worker reaches t
                    w_arrived[w] = t
                    if pos_ == 0 and sat_step:
                        n = sum(r.param_b for r in sat_step if r.param_a == w and r.step_lo <= k <= r.step_hi)
                        if n:
                            add_phantoms(w, n, now, k)
                    if sat_layer and t in first_of_layer:
                        n = sum(r.param_b for r in sat_layer
                                if r.param_a == w and r.layer == t_layer[t] and r.step_lo <= k <= r.step_hi)
                        if n:
                            add_phantoms(w, n, now, k)
                r = ready_ts[t] if task_step[t] == k else -1
                if r >= 0:
                    if w_obs[w] < 0:                        # first sight of t ready
                        w_obs[w] = now
                        dep_wait = 0
                        reached = now
                        if w_wait_task[w] == t:
                            reached = w_wait_start[w]
                            dep_wait = now - reached
                            w_wait_task[w] = -1
                            if on_rel:
                                ev, gen = wait_ids(t, k)
                                d = task_ctx(_H_RELEASE, now, w, t, k)
                                d["event_id"], d["event_gen"], d["wait_ns"] = ev, gen, dep_wait
                                d["flags"] |= wflag[t]
                                emit(_H_RELEASE, d)
                            else:
                                counts[_H_RELEASE] += 1
                        if wflag[t]:
                            comm_wait(w, t, k, now, reached)
                        w_obs_dep[w] = dep_wait
                    if phantom[w]:                          # drain queue_saturation entries
                        busy[w] = True
                        push(now + phantom[w] * costs.filler_ns, _PHANTOMS_DONE, w)
                        return
                    if self.f_starve:                       # held until first sight + delay
                        due = w_obs[w] + self._sum(self.f_starve, t, k, t_cls[t], t_layer[t])
                        if now < due:
                            busy[w] = True
                            push(due, _WAKE, w)
                            return
                    depth[w] -= 1
                    ready_ts[t] = -1
                    w_pos[w] = pos_ + 1
                    if w_pos[w] == len(plans[w]):
                        w_pos[w] = 0
                        w_step[w] += 1
                    w_obs[w] = -1
                    w_arrived[w] = -1
                    start_task(w, t, k, now, r, w_obs_dep[w])
                    return
                if w_wait_task[w] != t:
                    w_wait_task[w] = t
                    w_wait_start[w] = now
                    if on_wait:
                        ev, gen = wait_ids(t, k)
                        d = task_ctx(_H_WAIT, now, w, t, k)
                        d["event_id"], d["event_gen"] = ev, gen
                        d["flags"] |= wflag[t]
                        emit(_H_WAIT, d)
                    else:
                        counts[_H_WAIT] += 1
            if dynq:
                t, k2, rdy, _rows = dynq.popleft()
                if self.f_starve:                           # held until queued + delay
                    due = rdy + self._sum(self.f_starve, t, k2, t_cls[t], t_layer[t])
                    if now < due:
                        busy[w] = True
                        w_pending[w] = (t, k2, rdy)
                        push(due, _DYN_START, w)
                        return
                start_task(w, t, k2, now, rdy, 0)

        def signal(e: int, n: int, ts: int) -> None:
            if ev_owner[e] != rank:       # only comm tasks signal other ranks (comm_signal)
                raise RuntimeError(f"event {e} of rank {ev_owner[e]} signalled outside a comm task")
            push(ts, _SIGNAL, e, n)

        def comm_signal(w: int, t: int, k: int, now: int) -> None:
            """Comm task t (step k) issues its signal to the peer's event at `now`."""
            e = t_sig[t]
            peer = ev_owner[e]
            cgen = k * n_layers + t_layer[t]
            if on_csig:
                d = task_ctx(_H_CSIGNAL, now, w, t, k)
                d["event_id"], d["event_gen"], d["comm_op"], d["comm_gen"], d["peer_rank"] = \
                    e, ev_trig[e] * (k + 1), t_cop[t], cgen, peer
                d["flags"] |= D.FLAG_REMOTE
                emit(_H_CSIGNAL, d)
            else:
                counts[_H_CSIGNAL] += 1
            sent[0] += 1
            self.transport.send(e, peer, 1, now + comm_ns, t_cop[t], cgen)

        def land(e: int, n: int, now: int) -> None:
            count[e] += n
            trig = ev_trig[e]
            if count[e] % trig:
                return
            gen = count[e]
            k = gen // trig - 1
            if e == step_event:
                push(now + costs.step_overhead_ns + launch_skew(k + 1), _STEP_START, k + 1)
                return
            for t in consumers[e]:
                if ev_rfed[e]:
                    t_rinfo[t] = (ev_rpeer[e], ev_rts[e]) + ev_rid[e]
                make_ready(t, k, now, e, gen)

        def route(m, k: int) -> List[int]:
            """Tokens per expert for MoE layer m at step k (hash routing + skew)."""
            tok = [0] * cfg.n_experts
            for choice in sim_routing(cfg.n_experts, cfg.top_k, B, m.layer, k, self.seed, self.f_skew):
                for e in choice:
                    tok[e] += 1
            return tok

        # ---- main loop ----------------------------------------------------------------
        if steps:
            push(launch_skew(0), _STEP_START, 0)
            for w in range(W):
                push(0, _BOUNDARY, w)
        pop = heapq.heappop

        def advance(until: int) -> None:
            while heap and heap[0][0] < until:
                now, _, key, code, a, b = pop(heap)
                if code == _SIGNAL:
                    land(a, b, now)
                elif code == _BOUNDARY:
                    boundary(a, now)
                elif code == _BEGIN:
                    w = a
                    t, k = w_task[w], w_task_step[w]
                    if on_begin:
                        ev, gen = wait_ids(t, k)
                        d = task_ctx(_H_BEGIN, now, w, t, k)
                        d["event_id"], d["event_gen"], d["wait_ns"], d["queue_depth"] = \
                            ev, gen, w_dep_wait[w], depth[w]
                        d["flags"] |= wflag[t]
                        emit(_H_BEGIN, d)
                    else:
                        counts[_H_BEGIN] += 1
                    dur = cost_of[t]
                    push(now + dur, _END, w, now)
                elif code == _END:
                    w = a
                    t = w_task[w]
                    k = w_task_step[w]
                    e = t_sig[t]
                    if on_end:
                        d = task_ctx(_H_END, now, w, t, k)
                        d["event_id"], d["event_gen"], d["dur_ns"], d["wait_ns"] = \
                            e, ev_trig[e] * (k + 1), now - b, w_dep_wait[w]
                        d["flags"] |= sflag[t]
                        emit(_H_END, d)
                    else:
                        counts[_H_END] += 1
                    if self.collect_trace:
                        trace.append((t, k, w, b, now, flags_of[t]))
                    late = self._sum(self.f_late, t, k, t_cls[t], t_layer[t]) if self.f_late else 0
                    land_ts = now + notify + late
                    m = moe_by_router.get(t)
                    if m is not None:
                        tok = route(m, k)
                        route_tokens[(m.layer, k)] = tok
                        empty = sum(1 for x in tok if x == 0) * m.expert_tiles
                        if empty:
                            signal(m.expert_event, empty, land_ts)
                        push(land_ts, _DYN_PUSH, t, k)
                    elif t_cls[t] == _C_ARGMAX:
                        step_end[k] = now
                        for s in range(B):
                            if on_gen:
                                emit(_H_GEN, {"hook": _H_GEN, "abi_version": 1, "ts_ns": now, "rank": rank,
                                              "sm": w, "worker": w, "decode_step": k, "flags": 0,
                                              "request_slot": s, "request_gen": req_gen[s]})
                            else:
                                counts[_H_GEN] += 1
                            pos[s] += 1
                            if pos[s] >= req_len[s]:
                                fin[0] += 1
                                req_gen[s] += 1
                                pos[s] = 0
                                req_len[s] = req.req_len(s, req_gen[s], cfg.max_seq)
                    if sflag[t]:                # a comm task: its signal goes to a peer
                        issue = now + late + comm_delay(t, k)
                        if issue == now:
                            comm_signal(w, t, k, now)
                        else:
                            push(issue, _COMM_SIGNAL, t, k * W + w)
                    else:
                        signal(e, 1, land_ts)
                    w_task[w] = -1
                    w_dep_wait[w] = 0
                    busy[w] = False
                    boundary(w, now)
                elif code == _RSIGNAL:
                    op, cgen = rmeta.pop(key)
                    received[0] += 1
                    ev_rpeer[a], ev_rts[a], ev_rid[a] = key >> 40, now, (op, cgen)
                    land(a, b, now)
                elif code == _COMM_SIGNAL:
                    comm_signal(b % W, a, b // W, now)
                elif code == _DYN_PUSH:
                    m = moe_by_router[a]
                    k = b
                    rw = owner[a]
                    tok = route_tokens.pop((m.layer, k))
                    for ex in range(cfg.n_experts):
                        if not tok[ex]:
                            continue
                        for x in range(m.expert_tiles):
                            t = m.expert_base + ex * m.expert_tiles + x
                            task_step[t] = k
                            cost_of[t] = int(fixed[t_cls[t]] + per_row[t_cls[t]] * tok[ex])
                            task_faults(t, k)
                            dynq.append((t, k, now, tok[ex]))
                            dyn_count[k] += 1
                            if on_ready:
                                d = task_ctx(_H_READY, now, rw, t, k)
                                d["event_id"], d["event_gen"], d["queue_depth"] = m.router_event, k + 1, len(dynq)
                                emit(_H_READY, d)
                            else:
                                counts[_H_READY] += 1
                            pressure(rw, now, k, t_cls[t], t_layer[t], len(dynq))
                    signal(m.router_event, 1, now)
                    for w in range(W):
                        if not busy[w]:
                            boundary(w, now)
                elif code == _PHANTOMS_DONE:
                    depth[a] -= phantom[a]
                    phantom[a] = 0
                    busy[a] = False
                    boundary(a, now)
                elif code == _DYN_START:
                    t, k2, rdy = w_pending[a]
                    start_task(a, t, k2, now, rdy, 0)
                elif code == _WAKE:
                    busy[a] = False
                    boundary(a, now)
                elif code == _STEP_START:
                    k = a
                    if k >= steps:
                        continue
                    step_start[k] = now
                    clock_sample(now)
                    make_ready(0, k, now, step_event, k)

        def finish() -> SimResult:
            if heap:
                raise RuntimeError(f"Sim.finish: {len(heap)} events pending (advance to the end first)")
            self.count = count
            done = sum(1 for k in range(steps) if count[step_event] >= k + 1)
            if done < steps:   # a scheduling bug (or a peer rank that never signalled)
                stuck = {w: plans[w][w_pos[w]] for w in range(W) if w_step[w] < steps and plans[w]}
                raise RuntimeError(f"sim rank {rank} stalled in step {done}: workers wait on tasks {stuck}")
            if steps:
                clock_sample(step_end[-1])
            return SimResult(steps, B, step_start, step_end, counts, tasks_run[0], dyn_count[:steps], fin[0],
                             trace, rank, list(self.clock_samples), sent[0], received[0], comm_wait_ns[0])

        self._advance = advance
        self._finish = finish


def sim_routing(n_experts: int, top_k: int, batch: int, layer: int, step: int, seed: int,
                faults: Iterable[F.FaultRow] = ()) -> List[List[int]]:
    """The sim's MoE routing: top-k distinct experts per slot, from a splitmix64 hash of
    (seed, layer, step, slot) instead of router numerics, then the routing_skew rows
    in scope (the same rule as the kernel: if fault_pick(seed, (layer << 16) | slot,
    step) < share ppm, the slot's first choice becomes the expert, swapping if it was
    already chosen)."""
    skew = [r for r in faults if r.kind == F.ROUTING_SKEW and r.in_scope(step, layer)]
    base = F.splitmix64(((seed * 0x1000193) ^ (layer << 40) ^ (step << 8) ^ 0x5EED) & F.M64)
    out = []
    for s in range(batch):
        hs = F.splitmix64(base ^ (s * 0x9E3779B97F4A7C15 & F.M64))
        choice = sorted(range(n_experts), key=lambda e: F.splitmix64(hs ^ e))[:top_k]
        for r in skew:
            if F.fault_pick(r.seed, (layer << 16) | s, step) < r.param_b:
                x = r.param_a
                if x in choice:
                    j = choice.index(x)
                    choice[0], choice[j] = choice[j], choice[0]
                else:
                    choice[0] = x
        out.append(choice)
    return out


def simulate(graph: TaskGraph, steps: int, *, faults: Optional[F.FaultTable] = None,
             sink: Optional[Sink] = None, seed: int = 0, **kw) -> SimResult:
    """Run `steps` decode steps of `graph` in the sim; see `Sim` for the options."""
    return Sim(graph, steps, faults=faults, sink=sink, seed=seed, **kw).run()


def chrome_trace(graph: TaskGraph, result: SimResult) -> Dict[str, Any]:
    """The full task trace (needs `collect_trace=True`) as Chrome trace-event JSON, which
    Perfetto's UI also opens: one complete event per task run, one track per worker."""
    from .graph import CLASS_NAMES
    ev: List[Dict[str, Any]] = [{"name": "process_name", "ph": "M", "pid": graph.rank,
                                  "args": {"name": f"rank {graph.rank} (sim, {graph.cfg.name})"}}]
    for w in range(graph.num_workers):
        ev.append({"name": "thread_name", "ph": "M", "pid": graph.rank, "tid": w,
                   "args": {"name": f"worker {w}"}})
    for t, k, w, b, e, fl in result.trace:
        task = graph.tasks[t]
        args = {"task_index": t, "step": k, "tile": list(task.tile)}
        if task.layer != NONE:
            args["layer"] = task.layer
        if task.expert != NONE:
            args["expert"] = task.expert
        if task.slot != NONE:
            args["slot"] = task.slot
        if fl:
            args["flags"] = fl
        ev.append({"name": CLASS_NAMES[task.cls], "cat": "task", "ph": "X", "pid": graph.rank, "tid": w,
                   "ts": b / 1000.0, "dur": (e - b) / 1000.0, "args": args})
    for k, (s, e) in enumerate(zip(result.step_start_ns, result.step_end_ns)):
        ev.append({"name": f"step {k}", "cat": "step", "ph": "X", "pid": graph.rank,
                   "tid": graph.num_workers, "ts": s / 1000.0, "dur": (e - s) / 1000.0})
    return {"traceEvents": ev, "displayTimeUnit": "ns",
            "otherData": {"backend": "sim", "model": graph.cfg.name, "batch": graph.batch}}
