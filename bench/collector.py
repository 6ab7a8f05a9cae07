"""Collector benchmark (one core, in-process, no transport).

1. joins per second: `collectors.join.join` over synthetic waits/signals (a mesh
   all-reduce: every rank waits on every other rank, two comm ops per layer);
2. the analysis cost per decode step at 2, 8 and 64 ranks: the whole pure pipeline
   (`diagnose`: clock fit, join, align, detectors, delay analysis) over records from the
   synthetic timeline model, divided by the number of steps.  The transport's cost
   (msgpack over non-blocking mpi4py) is added when the collector runs under mpirun.

Validates before it times: the diagnosis of a late_comm fault must find it.

    .venv/bin/python bench/collector.py [--quick]
"""
from __future__ import annotations

import argparse
import os
import random
import sys
import time

from dtrace_mk.collectors.diagnose import diagnose
from dtrace_mk.collectors.join import join
from dtrace_mk.collectors.records import RemoteWait, Signal, pack
from dtrace_mk.collectors.scenario import parse_scenario
from dtrace_mk.collectors.score import score
from dtrace_mk.collectors.synth import SynthConfig, synthesize


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


def bench_join(n_target: int) -> None:
    ranks = 8
    gens = max(1, n_target // (2 * ranks * (ranks - 1)))
    waits, sigs = synthetic_pairs(ranks, gens)
    res = join(waits, sigs)
    assert len(res.pairs) == len(waits) and not res.unmatched_waits      # validate
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        join(waits, sigs)
        best = min(best, time.perf_counter() - t0)
    print(f"join: {len(waits)} waits x {len(sigs)} signals in {best * 1e3:.1f} ms "
          f"= {len(waits) / best / 1e6:.2f} M joins/s (one core)")


def bench_diagnose(ranks: int, steps: int) -> None:
    sc = parse_scenario(dict(name=f"bench{ranks}", ranks=ranks, model="tiny", steps=steps, batch=4,
                             seed=1, faults=[dict(kind="late_comm", rank=ranks - 1, steps=[1],
                                                  comm_op="allreduce_attn", delay_us=200)]))
    tr = synthesize(SynthConfig.from_scenario(sc))
    t0 = time.perf_counter()
    res = diagnose(tr.summaries, tr.waits, tr.signals, tr.clock_samples, sc, pingpongs=tr.pingpongs)
    dt = time.perf_counter() - t0
    rep = score(res, sc)
    assert rep.recall == 1.0 and not rep.false_confident, rep.render()         # validate
    nbytes = sum(len(pack(r)) for r in tr.summaries + tr.waits + tr.signals)
    print(f"diagnose: {ranks:3d} ranks, {steps} steps, {len(tr.waits):7d} waits: "
          f"{dt * 1e3 / steps:8.1f} ms/step analysis, {nbytes / steps / 1024:8.1f} KiB/step records")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sizes (smoke test)")
    a = ap.parse_args(argv)
    # single-threaded Python: one core (not pinned, so a busy core does not skew it)
    print(f"load average: {' '.join(f'{x:.1f}' for x in os.getloadavg())} "
          f"on {os.cpu_count()} cores (numbers below scale with it)")
    bench_join(20_000 if a.quick else 200_000)
    for ranks in (2, 8, 64):
        bench_diagnose(ranks, 3 if a.quick else (8 if ranks < 64 else 4))
    return 0


if __name__ == "__main__":
    sys.exit(main())
