"""What one SM given to an observer would cost: the no-hook build with one worker fewer
(the graph planned for N-1 workers, one SM idle) against all N, side by side.

    python bench/spare_sm.py [--presets 1b,tiny] [--reps 9] [--out DIR]

Why: an observer CTA on its own SM could run the device VM over records the workers
write to global memory, off every worker's critical path (docs/results/hooks.md "Session
13").  The sim says 131 workers step exactly as fast as 132 on tiny, small-moe and 1b
(1b's ops have 128 tiles per layer).  Here on the GPU: two Megakernels on the same
weights (N and N-1 workers), launches alternating, rep 0 a warm-up; median us/step of
each and their ratio; tokens checked equal (a task computes the same on any worker)."""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import numpy as np

REQUIRES = "gpu"   # what `dtrace-mk bench spare_sm` checks before it runs: cpu, gpu, or gpu:N (N ranks, N GPUs)

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

STEPS = {"tiny": 128, "1b": 48}


def bench_preset(name: str, reps: int, log) -> dict:
    import cupy as cp
    from benchio import timed_rounds
    from dtrace_mk.megakernel import gpu
    from dtrace_mk.megakernel.presets import PRESETS
    from dtrace_mk.megakernel.reference import make_weights
    cfg, steps = PRESETS[name], STEPS.get(name, 16)
    n = cp.cuda.Device().attributes["MultiProcessorCount"]
    w = make_weights(cfg, 0)
    mks = {f"w{k}": gpu.Megakernel(cfg, batch=1, weights=w, num_workers=k, defines=("DTMK_NO_HOOKS",))
           for k in (n, n - 1)}

    def launch(key):
        m = mks[key]
        m.reset()
        return m.run(steps, poison=False)

    times, last = timed_rounds(list(mks), reps, steps, launch)
    med = {k: statistics.median(v) for k, v in times.items()}
    a, b = f"w{n}", f"w{n - 1}"
    out = {"preset": name, "steps_per_launch": steps, "reps": reps, "us_per_step": med,
           "all_us_per_step": times, "ratio_pct": 100.0 * (med[b] / med[a] - 1.0),
           "tokens_equal": bool(np.array_equal(last[a].tokens, last[b].tokens))}
    log(str(out))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--presets", default="1b,tiny")
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--out", default=".")
    a = ap.parse_args(argv)
    from benchio import run_presets
    res = run_presets(a.out, "spare_sm", a.presets, lambda p, log: bench_preset(p, a.reps, log))
    print(f"\n{res['card']}  {res['date']}  {res['commit']}  (median us/step; no-hook build)")
    for r in res["presets"]:
        (ka, va), (kb, vb) = list(r["us_per_step"].items())
        print(f"{r['preset']:<6} {ka} {va:8.1f}  {kb} {vb:8.1f}  {kb}/{ka} {r['ratio_pct']:+.2f}%  "
              f"tokens equal: {r['tokens_equal']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
