"""Collector benchmark: joins per second, and the collector's end-to-end cost per decode step.

    .venv/bin/python bench/collector.py [--quick] [--ranks 2,8,64] [--steps 4] [--mpi 2,8]

Side by side, in one process, on one core (single-threaded Python; the numbers are CPU
time, `time.process_time`, so a second busy core does not inflate them):

(a) joins per second: `collectors.join.join` over synthetic waits/signals (a mesh
    all-reduce on 8 ranks: every rank waits on every other rank, two comm ops per
    layer), best of 3.

(b) end to end at R = 2, 8 and 64 sim ranks (preset `wide-tp`, which splits 1..64 ways;
    batch 4; a `late_comm` fault on rank R-1 at step 1 so there is something to find):
    R sim ranks run in this process (`run_loopback`), each with its `RankAgent` (default
    summary monitors) shipping over a `RankChannel` on an in-process `LoopbackHub` (the
    same wire, message framing, ping-pongs, BYE/FIN as under mpiexec; the hub delivers at
    once instead of MPI) to one `CollectorLoop` + `CollectorSink`, which is polled at
    every step start of rank 0 and at the end; then `Accumulator.result` runs the
    diagnosis.  Every agent and collector entry point is wrapped with a CPU timer that
    keeps *exclusive* time (a nested timed call is charged to its own phase only):

      agent      RankAgent.feed (monitors, epoch flush, pack, channel send),
                 clock_sample, pingpong, close              -> per rank, / steps
      receive    CollectorLoop.poll/run (Test loop, headers, pings, FIN)
      unpack     sink on_bytes/on_record (msgpack unpack + accumulate)
      clock      build_clock_model, align_waits, align_signals (clock fit, alignment,
                 causal check)
      join       collectors.join.join
      classify   detect_all minus root cause (all six detectors)
      rootcause  rootcause.attribute (upstream delay analysis)
      result     the rest of Accumulator.result (merge, confidence, coverage, dict)

    collector/step = (receive + unpack + clock + join + classify + rootcause + result) /
    steps.  Excluded: the simulation itself (the sim's event loop, the windows of the
    loopback transport, and `pack_ctx`, which turns the sim's context dicts into the
    128-byte records a GPU ring would hand the agent), graph building and the agents'
    one-time monitor compilation.  Telemetry = packed-record payload bytes the
    collector received (24-byte message headers not included), per step for the whole
    job and per rank.  The diagnosis is scored against the fault (`found`).

(c) optionally (`--mpi 2,8`): the same scenario as a real MPMD job,
    `mpiexec -n R <rank> : -n 1 <collector>` (what `dtrace-mk diagnose` runs), with
    each process reporting its own process_time from job start to result; the
    collector's CPU then also includes idle polling and start-up ping-pongs, and the
    ranks (R + 1 processes on this machine's cores) are oversubscribed, so only its
    CPU time, not wall time, compares with (b).

Timings are printed, never asserted (tests/ do not time anything).
"""
from __future__ import annotations

import argparse
import gc
import importlib
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

from dtrace_mk.collectors.join import join
from dtrace_mk.collectors.records import RemoteWait, Signal
from dtrace_mk.collectors.scenario import parse_scenario
from dtrace_mk.collectors.score import score

REQUIRES = "cpu"   # what `dtrace-mk bench collector` checks before it runs: cpu, gpu, or gpu:N (N ranks, N GPUs)

pt = time.process_time
PRESET = "wide-tp"
BATCH = 4
PHASES = ("receive", "unpack", "clock", "join", "classify", "rootcause", "result")


# ----------------------------------------------------------------------- (a) joins/s

def synthetic_pairs(ranks: int, gens: int, seed: int = 0):
    rnd = random.Random(seed)
    waits, sigs = [], []
    for g in range(gens):
        for op in (0, 1):
            for r in range(ranks):
                for p in range(ranks):
                    if p == r:
                        continue
                    t = g * 100_000 + rnd.randint(0, 5_000)
                    sigs.append(Signal(p, r, op, g, g // 4, g % 4, t))
                    waits.append(RemoteWait(r, p, op, g, g // 4, g % 4, 11, t - 3_000, t + 2_500))
    rnd.shuffle(waits)
    rnd.shuffle(sigs)
    return waits, sigs


def bench_join(n_target: int) -> Dict[str, Any]:
    ranks = 8
    gens = max(1, n_target // (2 * ranks * (ranks - 1)))
    waits, sigs = synthetic_pairs(ranks, gens)
    res = join(waits, sigs)
    if len(res.pairs) != len(waits) or res.unmatched_waits:          # validate, not time
        raise SystemExit(f"join: {len(res.pairs)} pairs of {len(waits)} waits; "
                         f"{len(res.unmatched_waits)} unmatched")
    def best_of_3() -> float:
        best = float("inf")
        for _ in range(3):
            t0 = pt()
            join(waits, sigs)
            best = min(best, pt() - t0)
        return best
    best = best_of_3()
    gc.disable()                  # how much of it is the cyclic GC walking the records
    try:
        best_nogc = best_of_3()
    finally:
        gc.enable()
    out = {"waits": len(waits), "signals": len(sigs), "cpu_s": best,
           "joins_per_s": len(waits) / best, "joins_per_s_gc_off": len(waits) / best_nogc}
    print(f"join: {len(waits)} waits x {len(sigs)} signals in {best * 1e3:.1f} ms CPU "
          f"= {out['joins_per_s'] / 1e6:.2f} M joins/s (one core; "
          f"{out['joins_per_s_gc_off'] / 1e6:.2f} M with the GC off)", flush=True)
    return out


# --------------------------------------------------------------- (b) loopback, timed

class CpuPhases:
    """Exclusive CPU time per phase: a timed call nested in another is charged to its
    own phase and subtracted from the caller's."""

    def __init__(self):
        self.excl: Dict[str, float] = defaultdict(float)
        self.calls: Dict[str, int] = defaultdict(int)
        self._stack: List[float] = []

    def wrap(self, phase: str, fn: Callable) -> Callable:
        excl, calls, stack = self.excl, self.calls, self._stack

        def timed(*a, **kw):
            t0 = pt()
            stack.append(0.0)
            try:
                return fn(*a, **kw)
            finally:
                dt = pt() - t0
                child = stack.pop()
                excl[phase] += dt - child
                calls[phase] += 1
                if stack:
                    stack[-1] += dt
        return timed


def timer_overhead_us(n: int = 20000) -> float:
    """CPU per wrapped call of an empty function (charged to the wrapped phases)."""
    ph = CpuPhases()
    f = ph.wrap("x", lambda: None)
    t0 = pt()
    for _ in range(n):
        f()
    return (pt() - t0) / n * 1e6


@contextmanager
def patched(ph: CpuPhases):
    """Time the pipeline stages inside `diagnose` (module globals, restored after)."""
    from dtrace_mk.collectors import diagnose as D
    from dtrace_mk.collectors import rootcause as RC
    saved = [(D, n, getattr(D, n)) for n in ("build_clock_model", "align_waits",
                                              "align_signals", "join", "detect_all")]
    saved.append((RC, "attribute", RC.attribute))
    phase = {"build_clock_model": "clock", "align_waits": "clock", "align_signals": "clock",
             "join": "join", "detect_all": "classify", "attribute": "rootcause"}
    try:
        for mod, name, fn in saved:
            setattr(mod, name, ph.wrap(phase[name], fn))
        yield
    finally:
        for mod, name, fn in saved:
            setattr(mod, name, fn)


def bench_scenario(ranks: int, steps: int, seed: int = 1):
    return parse_scenario(dict(name=f"bench-{PRESET}-{ranks}", ranks=ranks, model=PRESET,
                               steps=steps, batch=BATCH, seed=seed, backend="sim",
                               faults=[dict(kind="late_comm", rank=ranks - 1, steps=[1],
                                            comm_op="allreduce_attn", delay_us=200)]))


def bench_loopback(ranks: int, steps: int, quiet: bool = False) -> Dict[str, Any]:
    from dtrace_mk.collectors import transport as T
    from dtrace_mk.collectors.scenario import device_fault_specs
    from dtrace_mk.commands.diagnose import SIM_WORKERS, _sim_pingpongs
    from dtrace_mk.megakernel.faults import FaultTable
    from dtrace_mk.megakernel.graph import build_graph
    from dtrace_mk.megakernel.mpi_transport import run_loopback
    from dtrace_mk.megakernel.presets import get_preset
    from dtrace_mk.runtime.agent import RankAgent

    sc = bench_scenario(ranks, steps)
    cfg = get_preset(sc.model)
    ph = CpuPhases()
    cpu0 = pt()

    # set-up (excluded): graphs, the collector, agents (monitor compilation)
    graphs = [build_graph(cfg, sc.batch, SIM_WORKERS, rank=r, ranks=ranks) for r in range(ranks)]
    hub = T.LoopbackHub(ranks + 1)
    acc = T.CollectorSink(use_pingpongs=False)      # sim: ping-pongs of simulated hosts
    acc.on_bytes = ph.wrap("unpack", acc.on_bytes)
    acc.on_record = ph.wrap("unpack", acc.on_record)
    acc.result = ph.wrap("result", acc.result)
    loop = T.CollectorLoop(hub.port(ranks), list(range(ranks)), acc, silence_timeout_s=3600.0)
    loop.poll = ph.wrap("receive", loop.poll)
    loop.run = ph.wrap("receive", loop.run)

    class Channel(T.RankChannel):
        """A RankChannel whose close() lets the in-process collector run while it waits
        for FIN (under mpiexec the collector is another process)."""

        def progress(self) -> None:
            super().progress()
            if self.closed and not self.fin:
                loop.poll()

    agents = []
    for r in range(ranks):
        a = RankAgent(r, Channel(hub.port(r), ranks, r), num_workers=graphs[r].num_workers,
                      schema=graphs[r].schema, budget_bytes_per_step=sc.budget_bytes_per_step)
        key = f"agent{r}"
        a.feed = ph.wrap(key, a.feed)               # a.sink = pack_ctx (sim side) + feed
        a.clock_sample = ph.wrap(key, a.clock_sample)
        a.pingpong = ph.wrap(key, a.pingpong)
        a.close = ph.wrap(key, a.close)
        a.start = ph.wrap(key, a.start)
        agents.append(a)
    faults = [FaultTable.from_specs(device_fault_specs(sc, r), f"bench rank {r}")
              for r in range(ranks)]

    def rank0_clock(device_ns: int, host_ns: int) -> None:
        agents[0].clock_sample(device_ns, host_ns)
        loop.poll()                                 # the collector runs once per step
    on_clock = [rank0_clock] + [a.clock_sample for a in agents[1:]]
    cpu_setup = pt() - cpu0

    # the run: sims + agents + collector polls
    for a in agents:
        a.start(pings=0)          # HELLO; the collector's start-up pings are answered as
        #                           the agents make progress (no tight wait in one process)
    t_run, w_run = pt(), time.perf_counter()
    results = run_loopback(cfg, sc.batch, SIM_WORKERS, ranks, sc.steps, faults=faults,
                           sinks=[a.sink for a in agents], seed=sc.seed, graphs=graphs,
                           on_clock=on_clock, hooks=agents[0].hooks)
    for r, (a, res) in enumerate(zip(agents, results)):
        _sim_pingpongs(a, graphs[r], sc, r, res)
    for a in agents:
        a.close(timeout_s=10.0)
    if not loop.run(deadline_s=time.monotonic() + 30.0):
        raise SystemExit(f"{ranks} ranks: not every agent said BYE: {loop.report()}")
    loop.close()
    with patched(ph):
        result = acc.result(sc, ranks=ranks)
    cpu_run, wall_run = pt() - t_run, time.perf_counter() - w_run

    rep = score(result, sc)
    agent_cpu = [ph.excl[f"agent{r}"] for r in range(ranks)]
    coll = {p: ph.excl[p] for p in PHASES}
    events = sum(a.stats.events for a in agents)
    lost = sum(a.stats.records_lost for a in agents)
    out = {
        "ranks": ranks, "steps": steps, "preset": sc.model, "batch": sc.batch,
        "events_per_rank_step": events / (ranks * steps),
        "waits": len(acc.waits), "waits_per_step": len(acc.waits) / steps, "signals": len(acc.signals), "summaries": len(acc.summaries),
        "messages": sum(st.messages for st in loop.state.values()),
        "telemetry_bytes": acc.bytes, "bytes_per_step": acc.bytes / steps,
        "bytes_per_rank_step": acc.bytes / (steps * ranks), "records_lost": lost,
        "agent_us_per_rank_step_mean": sum(agent_cpu) / (ranks * steps) * 1e6,
        "agent_us_per_rank_step_max": max(agent_cpu) / steps * 1e6,
        "agent_max_rank": max(range(ranks), key=agent_cpu.__getitem__),
        "events_per_step_by_rank": [a.stats.events / steps for a in agents],
        "agent_us_per_event": sum(agent_cpu) / max(events, 1) * 1e6,
        "collector_ms_per_step": sum(coll.values()) / steps * 1e3,
        "phase_ms_per_step": {p: v / steps * 1e3 for p, v in coll.items()},
        "timed_calls": sum(ph.calls.values()),
        "cpu_setup_s": cpu_setup, "cpu_run_s": cpu_run, "wall_run_s": wall_run,
        "sim_excluded_s": cpu_run - sum(agent_cpu) - sum(coll.values()),
        "found": rep.recall == 1.0 and not rep.false_confident,
        "score": {"precision": rep.precision, "recall": rep.recall,
                  "false_confident": len(rep.false_confident)},
        "verdict": result["verdict"],
    }
    if quiet:
        return out
    print(f"loopback: {ranks:3d} ranks x {steps} steps: collector {out['collector_ms_per_step']:.2f} "
          f"ms/step, agent {out['agent_us_per_rank_step_mean'] / 1e3:.2f} ms/rank/step, "
          f"{out['bytes_per_step'] / 1024:.1f} KiB/step; run {cpu_run:.1f} s CPU "
          f"(sim {out['sim_excluded_s']:.1f} s excluded); found={out['found']}", flush=True)
    return out


# -------------------------------------------------------------------- (c) mpiexec

def mpi_child(job: str) -> int:
    """One process of the MPMD job (bench/collector.py --mpi-child JOB): runs
    `dtrace_mk.commands.diagnose.mpi_main` with the same CPU timers as the loopback run
    (patched on the classes, in this process only) and writes its own figures."""
    from mpi4py import MPI
    from dtrace_mk.collectors import diagnose as D
    from dtrace_mk.collectors import transport as T
    from dtrace_mk.commands.diagnose import mpi_main
    from dtrace_mk.runtime.agent import RankAgent
    for mod in ("dtrace_mk.collectors.rootcause", "dtrace_mk.megakernel.mpi_transport"):
        importlib.import_module(mod)          # mpi_main imports lazily: before the clock
    _warm_pipeline()              # first-use costs, as the loopback run's warm-up does
    ph = CpuPhases()
    for name in ("poll", "run"):
        setattr(T.CollectorLoop, name, ph.wrap("receive", getattr(T.CollectorLoop, name)))
    for name in ("on_bytes", "add"):
        setattr(D.Accumulator, name, ph.wrap("unpack", getattr(D.Accumulator, name)))
    D.Accumulator.result = ph.wrap("result", D.Accumulator.result)
    for name in ("feed", "clock_sample", "pingpong", "close", "start"):
        setattr(RankAgent, name, ph.wrap("agent", getattr(RankAgent, name)))
    c0, w0 = pt(), time.perf_counter()
    with patched(ph):
        rc = mpi_main(["--job", job])
    appnum = MPI.COMM_WORLD.Get_attr(MPI.APPNUM) or 0
    me = MPI.COMM_WORLD.Get_rank()
    Path(f"{job}.cpu.{me}.json").write_text(json.dumps(
        {"world_rank": me, "collector": bool(appnum), "cpu_s": pt() - c0,
         "wall_s": time.perf_counter() - w0, "phases": dict(ph.excl)}))
    return rc


def _warm_pipeline() -> None:
    """One small diagnosis on the synthetic timeline model (untimed)."""
    from dtrace_mk.collectors.diagnose import diagnose
    from dtrace_mk.collectors.synth import SynthConfig, synthesize
    sc = parse_scenario(dict(name="warm", ranks=2, model="tiny", steps=3, batch=4, seed=1,
                             faults=[dict(kind="late_comm", rank=1, steps=[1],
                                          comm_op="allreduce_attn", delay_us=200)]))
    tr = synthesize(SynthConfig.from_scenario(sc))
    diagnose(tr.summaries, tr.waits, tr.signals, tr.clock_samples, sc, pingpongs=tr.pingpongs)


def bench_mpi(ranks: int, steps: int, timeout_s: float) -> Optional[Dict[str, Any]]:
    from dtrace_mk.commands.diagnose import find_mpiexec, mpi_flavour
    sc_dict = dict(name=f"bench-{PRESET}-{ranks}", ranks=ranks, model=PRESET, steps=steps,
                   batch=BATCH, seed=1, backend="sim",
                   faults=[dict(kind="late_comm", rank=ranks - 1, steps=[1],
                                comm_op="allreduce_attn", delay_us=200)])
    mpiexec = find_mpiexec()
    flags = ["--oversubscribe"] if mpi_flavour(mpiexec) == "openmpi" else []
    with tempfile.TemporaryDirectory(prefix="dtmk-bench-") as tmp:
        scp = Path(tmp) / "scenario.json"
        scp.write_text(json.dumps(sc_dict))
        result = Path(tmp) / "result.json"
        job = Path(tmp) / "job.json"
        job.write_text(json.dumps({"backend": "sim", "deadline_s": timeout_s, "quiet": True,
                                   "runs": [{"scenario": str(scp), "ranks": ranks,
                                             "result": str(result)}]}))
        child = [sys.executable, os.path.abspath(__file__), "--mpi-child", str(job)]
        cmd = [mpiexec] + flags + ["-n", str(ranks)] + child + [":", "-n", "1"] + child
        w0 = time.perf_counter()
        try:
            p = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                               timeout=timeout_s + 10)
        except subprocess.TimeoutExpired:
            print(f"mpiexec -n {ranks}: over {timeout_s:.0f} s, skipped", flush=True)
            return None
        wall = time.perf_counter() - w0
        if p.returncode != 0 or not result.is_file():
            print(f"mpiexec -n {ranks}: exit {p.returncode}, no result; stderr tail:\n"
                  f"{p.stderr[-2000:]}", flush=True)
            return None
        res = json.loads(result.read_text())
        cpus = [json.loads(f.read_text()) for f in Path(tmp).glob("job.json.cpu.*.json")]
    from dtrace_mk.collectors.scenario import parse_scenario as _ps
    rep = score(res, _ps(sc_dict))
    coll = [c for c in cpus if c["collector"]]
    rk = [c for c in cpus if not c["collector"]]
    if not coll:
        print(f"mpiexec -n {ranks}: the collector wrote no figures", flush=True)
        return None
    cph = coll[0]["phases"]
    out = {"ranks": ranks, "steps": steps, "wall_s": wall,
           "collector_cpu_s": coll[0]["cpu_s"],
           "collector_process_ms_per_step": coll[0]["cpu_s"] / steps * 1e3,
           "collector_ms_per_step": sum(cph.get(p, 0.0) for p in PHASES) / steps * 1e3,
           "phase_ms_per_step": {p: cph.get(p, 0.0) / steps * 1e3 for p in PHASES},
           "agent_ms_per_rank_step": (sum(c["phases"].get("agent", 0.0) for c in rk)
                                      / max(len(rk), 1) / steps * 1e3),
           "rank_cpu_s_mean": sum(c["cpu_s"] for c in rk) / max(len(rk), 1),
           "bytes_per_step": res["telemetry_bytes"] / steps,
           "found": rep.recall == 1.0 and not rep.false_confident}
    print(f"mpiexec -n {ranks} : -n 1: wall {wall:.1f} s, collector "
          f"{out['collector_ms_per_step']:.2f} ms/step in its calls, whole process "
          f"{out['collector_process_ms_per_step']:.1f} ms/step CPU; found={out['found']}",
          flush=True)
    return out


# ----------------------------------------------------------------------------- main

def table(j: Dict[str, Any], rows: List[Dict[str, Any]], mpi: List[Dict[str, Any]]) -> str:
    L = [f"joins/s, one core: {j['joins_per_s'] / 1e6:.2f} M ({j['joins_per_s_gc_off'] / 1e6:.2f} M "
         f"with the GC off; {j['waits']} waits, mesh all-reduce of 8 ranks, best of 3, CPU time)",
         ""]
    L.append("| ranks | steps | events/rank/step | waits/step | agent ms/rank/step (mean / max) | "
             "telemetry KiB/step (B/rank/step) | collector ms/step | receive | unpack | "
             "clock | join | classify | rootcause | result | found |")
    L.append("|---:|---:|---:|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for r in rows:
        p = r["phase_ms_per_step"]
        L.append(f"| {r['ranks']} | {r['steps']} | {r['events_per_rank_step']:.0f} | {r['waits_per_step']:.0f} | "
                 f"{r['agent_us_per_rank_step_mean'] / 1e3:.2f} / "
                 f"{r['agent_us_per_rank_step_max'] / 1e3:.2f} (rank {r['agent_max_rank']}) | "
                 f"{r['bytes_per_step'] / 1024:.1f} ({r['bytes_per_rank_step']:.0f}) | "
                 f"{r['collector_ms_per_step']:.2f} | "
                 + " | ".join(f"{p[k]:.2f}" for k in PHASES)
                 + f" | {'yes' if r['found'] else 'NO'} |")
    if mpi:
        L += ["", "| mpiexec | steps | wall s | agent ms/rank/step | telemetry KiB/step | "
                  "collector ms/step | receive | unpack | clock | join | classify | rootcause | "
                  "result | collector process CPU ms/step | found |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
        for m in mpi:
            p = m["phase_ms_per_step"]
            L.append(f"| -n {m['ranks']} : -n 1 | {m['steps']} | {m['wall_s']:.1f} | "
                     f"{m['agent_ms_per_rank_step']:.2f} | {m['bytes_per_step'] / 1024:.1f} | "
                     f"{m['collector_ms_per_step']:.2f} | "
                     + " | ".join(f"{p[k]:.2f}" for k in PHASES)
                     + f" | {m['collector_process_ms_per_step']:.1f} | "
                     f"{'yes' if m['found'] else 'NO'} |")
    return "\n".join(L)


def _ints(s: str) -> List[int]:
    return [int(x) for x in s.split(",") if x.strip()]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sizes, 2 and 8 ranks (smoke test)")
    ap.add_argument("--ranks", type=_ints, default=None, metavar="2,8,64",
                    help="sim ranks of the loopback runs (default 2,8,64; --quick 2,8)")
    ap.add_argument("--steps", type=int, default=None, help="decode steps (default 4; --quick 3)")
    ap.add_argument("--mpi", type=_ints, default=[], metavar="2,8",
                    help="also run these rank counts as a real mpiexec MPMD job")
    ap.add_argument("--mpi-timeout", type=float, default=60.0, metavar="S")
    ap.add_argument("--json", metavar="FILE", help="write every figure as JSON")
    ap.add_argument("--mpi-child", metavar="JOB", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.mpi_child:
        return mpi_child(a.mpi_child)
    ranks = a.ranks or ([2, 8] if a.quick else [2, 8, 64])
    steps = a.steps or (3 if a.quick else 4)
    if steps < 3:
        raise SystemExit("--steps: at least 3 (the fault is at step 1; the detectors need a baseline)")
    print(f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())} on {os.cpu_count()} "
          f"cores; CPU time (process_time) throughout; timer overhead "
          f"{timer_overhead_us():.2f} us per timed call", flush=True)
    j = bench_join(20_000 if a.quick else 200_000)
    bench_loopback(2, 3, quiet=True)     # warm-up (first-use imports, caches), not reported
    rows = [bench_loopback(r, steps) for r in ranks]
    mpi = [m for m in (bench_mpi(r, steps, a.mpi_timeout) for r in a.mpi) if m]
    if a.json:
        Path(a.json).write_text(json.dumps({"join": j, "loopback": rows, "mpi": mpi}, indent=1))
    print()
    print(table(j, rows, mpi))
    return 0


if __name__ == "__main__":
    sys.exit(main())
