"""Host VM tiers side by side: interpreter vs compiled, on the default summary monitors.

    .venv/bin/python bench/host_vm.py [--steps 12] [--repeat 3]

Simulates the tiny preset (4 layers, 131 workers) for --steps steps, then feeds the
hook records to a fresh ReferenceRuntime holding the summary monitors (what the agent
does on a serving rank), once per tier.  The two tiers must end with identical maps
(bytes), coverage, results and faults (checked before any timing: a benchmark of a
wrong program is worthless).  Prints ns per program run through `fire` (end to end) and
through `Vm.run` alone, best of --repeat, and the ratio.  No assertions on timings.
"""
from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

REQUIRES = "cpu"   # what `dtrace-mk bench host_vm` checks before it runs: cpu, gpu, or gpu:N (N ranks, N GPUs)

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dtrace_mk.bpf.maps import RingBufMap                    # noqa: E402
from dtrace_mk.megakernel import sim                         # noqa: E402
from dtrace_mk.megakernel.graph import build_graph           # noqa: E402
from dtrace_mk.megakernel.presets import get_preset          # noqa: E402
from dtrace_mk.runtime.agent import compile_summary          # noqa: E402
from dtrace_mk.runtime.reference import ReferenceRuntime     # noqa: E402

TIERS = ("interp", "compiled")


def records(steps: int, workers: int):
    g = build_graph(get_preset("tiny"), 4, workers)
    recs = []
    sim.simulate(g, steps, sink=sim.records_sink(recs))
    return g.schema, recs


def state(rt, aid, results):
    maps = {}
    for m in rt.maps(aid):
        maps[m.name] = [r.data for r in m.drain()] if isinstance(m, RingBufMap) else m.snapshot()
    cov = [(c.program, c.epoch, c.eligible, c.executed, c.throttled, c.lost) for c in rt.coverage(aid)]
    return maps, cov, results


def feed(obj, recs, workers, tier):
    rt = ReferenceRuntime(num_workers=workers, vm_tier=tier)
    aid = rt.attach(obj)
    t0 = time.perf_counter()
    out = [rt.fire(r) for r in recs]
    dt = time.perf_counter() - t0
    results = [(f.program, f.outcome, f.r0, f.reasons, str(f.fault)) for fs in out for f in fs]
    return rt, aid, results, dt


def vm_only(obj, recs, workers, tier):
    """Time Vm.run alone over the (vm, record) pairs fire would run."""
    rt = ReferenceRuntime(num_workers=workers, vm_tier=tier)
    aid = rt.attach(obj)
    by_hook = {}
    for st in rt.attachment(aid).progs:
        by_hook.setdefault(st.program.hook.id, []).append(st.vm)
    pairs = [(vm.run, r) for r in recs for vm in by_hook.get(int.from_bytes(r[4:8], "little"), ())]
    t0 = time.perf_counter()
    for run, r in pairs:
        run(r)
    return time.perf_counter() - t0, len(pairs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--workers", type=int, default=131)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    schema, recs = records(a.steps, a.workers)
    obj = compile_summary(schema).obj
    ref = None
    fire_ns, vm_ns = {}, {}
    for tier in TIERS:
        rt, aid, results, _ = feed(obj, recs, a.workers, tier)
        got = state(rt, aid, results)
        if ref is None:
            ref = got
        elif got != ref:
            sys.exit(f"tier {tier} differs from {TIERS[0]}: results/maps/coverage not identical")
        runs = len(results)
        fire_ns[tier] = min(feed(obj, recs, a.workers, tier)[3] for _ in range(a.repeat)) * 1e9 / runs
        best = min(vm_only(obj, recs, a.workers, tier) for _ in range(a.repeat))
        vm_ns[tier] = best[0] * 1e9 / best[1]
    print(f"# host VM tiers, {platform.python_implementation()} {platform.python_version()}, "
          f"{platform.machine()}; {len(recs)} records ({a.steps} steps), {runs} program runs, "
          f"{len(obj.programs)} summary programs; best of {a.repeat}")
    print(f"{'tier':<10} {'ns/run (fire)':>14} {'ns/run (Vm.run)':>16}")
    for tier in TIERS:
        print(f"{tier:<10} {fire_ns[tier]:>14.0f} {vm_ns[tier]:>16.0f}")
    print(f"speedup    {fire_ns['interp'] / fire_ns['compiled']:>14.2f}x "
          f"{vm_ns['interp'] / vm_ns['compiled']:>15.2f}x   (identical maps, coverage, results)")


if __name__ == "__main__":
    main()
