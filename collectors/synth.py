"""Synthetic records for tests and the benchmark: a tiny timeline model of a tensor-
parallel decoder (not the sim backend; no scheduler, no VM), with scenario faults applied
the way the device fault table is expected to act.

Per rank, per step, per layer: an attention phase (rmsnorm, qkv, rope_kv_append, attn,
attn_o), the `allreduce_attn` comm op, an MLP phase (rmsnorm, mlp_gate_up, mlp_down; or
moe_router, moe_expert), `allreduce_mlp`; then lm_head and argmax.  A phase's time is the
sum of its classes' per-tile durations (tiles run in parallel across workers).  Comm ops
are signal-then-wait: each rank signals its peers (all others for `topology="mesh"`, the
next rank for `"ring"`) after its comm task, then waits for its peers' signals.

True time is one clock; each rank's device clock has its own offset, drift and 32 ns
quantisation, each host its own offset; ClockSamples and PingPongs let the collector
undo that.

Fault effects (per affected rank, step, and layer when given):
  late_comm         the rank's signals for comm_op are delay_us late
  slow_task_class   ceil(fraction * tiles) tasks of the class take extra_us longer; phase += extra_us
  starve_ready      every task of the class waits delay_us more between ready and dispatch
  late_notification the class's event is released delay_us after its last producer ends
                    (notify lag); its consumers wait that long in dep:wait; phase += delay_us
  queue_saturation  worker's queue holds extra_tasks more; all classes' dispatch waits grow
  routing_skew      `share` of the MoE tokens go to `expert`; that expert's task is longer
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from .records import (ClassStat, ClockSample, Coverage, EpochSummary, Names, PingPong,
                      RemoteWait, Signal)
from .scenario import Fault, Scenario

BASE_US = {"rmsnorm": 3.0, "qkv": 8.0, "rope_kv_append": 2.0, "attn": 12.0, "attn_o": 6.0,
           "mlp_gate_up": 15.0, "mlp_down": 10.0, "moe_router": 3.0, "moe_expert": 12.0,
           "lm_head": 20.0, "argmax": 2.0, "allreduce": 4.0}
ATTN = ("rmsnorm", "qkv", "rope_kv_append", "attn", "attn_o")
MLP = ("rmsnorm", "mlp_gate_up", "mlp_down")
MOE = ("rmsnorm", "moe_router", "moe_expert")
HEAD = ("lm_head", "argmax")


@dataclass
class SynthConfig:
    ranks: int = 2
    steps: int = 8
    layers: int = 2
    tiles: int = 8
    workers: int = 8
    experts: int = 8
    moe: bool = False
    topology: str = "mesh"            # mesh | ring
    seed: int = 0
    noise: float = 0.03               # relative noise on durations and waits
    link_latency_ns: float = 2500.0
    clock_skew: bool = True           # device offsets/drift, host offsets
    ranks_per_host: int = 2
    dead_rank: Optional[int] = None   # this rank sends nothing from dead_from_step on
    dead_from_step: int = 0
    faults: Sequence[Fault] = ()
    lost_fraction: float = 0.0        # fraction of eligible events lost (coverage)

    @classmethod
    def from_scenario(cls, sc: Scenario, **kw) -> "SynthConfig":
        moe = any(f.kind == "routing_skew" for f in sc.faults) or "moe" in sc.model
        return cls(ranks=sc.ranks, steps=sc.steps, seed=sc.seed, faults=sc.faults, moe=moe, **kw)


@dataclass
class SynthTrace:
    summaries: List[EpochSummary] = field(default_factory=list)
    waits: List[RemoteWait] = field(default_factory=list)
    signals: List[Signal] = field(default_factory=list)
    clock_samples: List[ClockSample] = field(default_factory=list)
    pingpongs: List[PingPong] = field(default_factory=list)
    step_time_ns: Dict[int, List[float]] = field(default_factory=dict)  # rank -> per step


class _Clocks:
    def __init__(self, cfg: SynthConfig, rng: np.random.Generator):
        n = cfg.ranks
        if cfg.clock_skew:
            self.dev_off = rng.uniform(37e3, 236e3, n) + rng.uniform(1e9, 5e9, n)  # boot times
            self.drift = rng.uniform(1e-6, 4e-6, n) * rng.choice([-1, 1], n)
            hosts = (n + cfg.ranks_per_host - 1) // cfg.ranks_per_host
            self.host_off = np.concatenate([[0.0], rng.uniform(-500e3, 500e3, hosts - 1)])
        else:
            self.dev_off = np.zeros(n)
            self.drift = np.zeros(n)
            self.host_off = np.zeros(1 + n)
        self.rph = cfg.ranks_per_host

    def device(self, rank: int, t: float) -> int:
        d = (t + self.dev_off[rank]) * (1.0 + self.drift[rank])
        return int(d // 32) * 32

    def host(self, rank: int, t: float) -> float:
        return t + self.host_off[rank // self.rph]


def synthesize(cfg: SynthConfig, names: Optional[Names] = None) -> SynthTrace:
    names = names or Names.standard()
    rng = np.random.default_rng(cfg.seed)
    clocks = _Clocks(cfg, rng)
    R, tr = cfg.ranks, SynthTrace()
    cid = {n: i for i, n in enumerate(names.task_classes)}
    op_id = {n: i for i, n in enumerate(names.comm_ops)}
    faults: Dict[Tuple[int, int], List[Fault]] = {}
    for f in cfg.faults:
        for s in f.steps:
            faults.setdefault((f.rank, s), []).append(f)

    def active(rank, step, kind, layer=None):
        for f in faults.get((rank, step), []):
            if f.kind == kind and (layer is None or f.params.get("layer") in (None, layer)):
                yield f

    def peers_to(r):   # ranks r signals
        return [p for p in range(R) if p != r] if cfg.topology == "mesh" else [(r + 1) % R]

    def peers_from(r):  # ranks r waits on
        return [p for p in range(R) if p != r] if cfg.topology == "mesh" else [(r - 1) % R]

    t = np.full(R, 1e6)                   # true time, ns
    start_t = t.copy()
    comm_gen = {op: 0 for op in op_id}
    t_end = 0.0
    for step in range(cfg.steps):
        stats = [dict() for _ in range(R)]  # rank -> class -> [count, sum, max, disp, dep, lag]
        qmax = [0] * R
        qworker = [0] * R
        experts = [np.zeros(cfg.experts, dtype=np.int64) for _ in range(R)]
        step_begin = t.copy()
        step_waits: Dict[int, List[RemoteWait]] = {}

        def run_phase(r, classes, layer):
            dt = 0.0
            st = stats[r]
            qsat = sum(f.params["extra_tasks"] for f in active(r, step, "queue_saturation"))
            depth = cfg.tiles + int(rng.integers(0, 2))
            if depth + qsat > qmax[r]:
                qmax[r] = depth + qsat
                qworker[r] = next((f.params["worker"] for f in active(r, step, "queue_saturation")),
                                  int(rng.integers(0, cfg.workers)))
            for cname in classes:
                c = cid[cname]
                base = BASE_US[cname] * 1e3
                n = cfg.tiles
                durs = base * (1.0 + cfg.noise * rng.standard_normal(n)).clip(0.5)
                disp = 500.0 * (1.0 + cfg.noise * rng.standard_normal(n)).clip(0.1)
                dep = 300.0 * (1.0 + cfg.noise * rng.standard_normal(n)).clip(0.1)
                lag = 200.0 * max(0.1, 1.0 + cfg.noise * rng.standard_normal())
                crit = float(durs.max())
                if cname == "moe_expert":
                    tokens = np.full(cfg.experts, 4)
                    for f in active(r, step, "routing_skew"):
                        total = int(tokens.sum())
                        hot = int(round(f.params["share"] * total))
                        rest = max(total - hot, 0)
                        tokens = np.full(cfg.experts, rest // max(cfg.experts - 1, 1))
                        tokens[f.params["expert"]] = hot
                    experts[r] += tokens
                    n = cfg.experts
                    durs = base * tokens / 4.0 * (1.0 + cfg.noise * rng.standard_normal(n)).clip(0.5)
                    disp = np.resize(disp, n)
                    dep = np.resize(dep, n)
                    crit = float(durs.max())
                for f in active(r, step, "slow_task_class", layer):
                    if f.params["task_class"] == cname:
                        k = max(1, math.ceil(f.params.get("fraction", 1.0) * n))
                        durs[:k] += f.params["extra_us"] * 1e3
                        crit = float(durs.max())
                extra = 0.0
                for f in active(r, step, "starve_ready"):
                    if f.params["task_class"] == cname:
                        disp = disp + f.params["delay_us"] * 1e3
                        extra += f.params["delay_us"] * 1e3
                if qsat:
                    disp = disp + qsat * 1e3 / cfg.workers * 4
                    extra += qsat * 1e3 / cfg.workers * 4
                for f in active(r, step, "late_notification"):
                    if f.params["task_class"] == cname:
                        lag += f.params["delay_us"] * 1e3
                        extra += f.params["delay_us"] * 1e3
                s = st.setdefault(c, [0, 0.0, 0.0, 0.0, 0.0, 0.0])
                s[0] += n
                s[1] += float(durs.sum())
                s[2] = max(s[2], float(durs.max()))
                s[3] += float(disp.sum())
                s[4] += float(dep.sum())
                s[5] += float(lag)
                dt += crit + extra + float(disp.mean()) * 0.0
            return dt

        def comm(op, layer):
            gen = comm_gen[op]
            comm_gen[op] += 1
            sig = np.zeros(R)
            for r in range(R):
                t[r] += run_phase(r, ("allreduce",), layer)
                delay = sum(f.params["delay_us"] * 1e3 for f in active(r, step, "late_comm", layer)
                            if f.params["comm_op"] == op)
                sig[r] = t[r] + delay
            alive = [not (cfg.dead_rank == r and step >= cfg.dead_from_step) for r in range(R)]
            new_t = t.copy()
            for r in range(R):
                for p in peers_to(r):
                    if alive[r]:
                        tr.signals.append(Signal(r, p, op_id[op], gen, step, layer,
                                                 clocks.device(r, sig[r])))
                begin = sig[r]
                arrivals = [sig[p] + cfg.link_latency_ns * (1 + cfg.noise * abs(rng.standard_normal()))
                            for p in peers_from(r)]
                for p, arr in zip(peers_from(r), arrivals):
                    if not alive[p]:
                        end = begin + 5e6     # gives up after 5 ms
                    else:
                        end = max(begin + 100.0, arr)
                    if alive[r]:
                        w = RemoteWait(r, p, op_id[op], gen, step, layer, cid["allreduce"],
                                       clocks.device(r, begin), clocks.device(r, end))
                        tr.waits.append(w)
                        step_waits.setdefault(r, []).append(w)
                    new_t[r] = max(new_t[r], end)
            t[:] = new_t

        for layer in range(cfg.layers):
            for r in range(R):
                t[r] += run_phase(r, ATTN, layer)
            comm("allreduce_attn", layer)
            for r in range(R):
                t[r] += run_phase(r, MOE if cfg.moe else MLP, layer)
            comm("allreduce_mlp", layer)
        for r in range(R):
            t[r] += run_phase(r, HEAD, cfg.layers)

        for r in range(R):
            tr.step_time_ns.setdefault(r, []).append(float(t[r] - step_begin[r]))
            if cfg.dead_rank == r and step >= cfg.dead_from_step:
                continue
            classes = tuple(ClassStat(c, v[0], int(v[1]), int(v[2]), int(v[3]), int(v[4]), int(v[5]))
                            for c, v in sorted(stats[r].items()))
            elig = sum(v[0] for v in stats[r].values()) * 4
            lost = int(elig * cfg.lost_fraction)
            rw = step_waits.get(r, [])
            tr.summaries.append(EpochSummary(
                r, step, clocks.device(r, step_begin[r]), clocks.device(r, t[r]), classes,
                qmax[r], qworker[r], tuple(int(x) for x in experts[r]) if cfg.moe else (),
                len(rw), sum(w.wait_end_ns - w.wait_begin_ns for w in rw),
                max((w.wait_end_ns - w.wait_begin_ns for w in rw), default=0),
                Coverage(elig, elig - lost, 0, lost)))
        t_end = float(t.max())

    # clock samples every 50 ms over the run (and one after), ping-pongs at the start
    for r in range(R):
        if cfg.dead_rank == r and cfg.dead_from_step == 0:
            continue
        ts = np.arange(0.0, t_end + 100e6, 50e6)
        for x in ts:
            jitter = abs(rng.normal(0, 150.0))
            tr.clock_samples.append(ClockSample(r, clocks.device(r, x), int(clocks.host(r, x + jitter))))
        for _ in range(16):
            t0 = float(rng.uniform(0, 1e6))
            out_d = 1000.0 + abs(rng.normal(0, 3000.0))
            back_d = 1000.0 + abs(rng.normal(0, 3000.0))
            tr.pingpongs.append(PingPong(r, int(clocks.host(0, t0)),
                                         int(clocks.host(r, t0 + out_d)),
                                         int(clocks.host(0, t0 + out_d + back_d))))
    return tr
