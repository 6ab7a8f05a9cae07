"""Worker placement: does the SM a plan runs on set the decode step's speed?

    python bench/placement.py [--presets 1b,tiny] [--reps 8] [--out DIR]

bench/paired.py (2026-12-01) found one build's launches running 1b's step in discrete
levels ~1.5% apart (1121 / 1139 / 1157 us), on the same memory and code: the hardware puts
block b (worker b's static plan) on a different SM in each launch.  Builds with
-DDTMK_SM_WORKER take the worker from a map smid -> worker (Megakernel.place_workers), so
a plan runs on the same SM in every launch.  One Megakernel, its kernel switched between
codes (same memory; bench/paired.py):

  search: --search launches in block order, each recording where the hardware put every
    worker (Megakernel.record_placement); their fastest, median and slowest placements
    become the maps hw_best, hw_median, hw_worst
  maps (code nohooks_sm = -DDTMK_NO_HOOKS -DDTMK_SM_WORKER):
    block    no map: block order, as every build before (placement differs per launch)
    sorted   worker k on the k-th SM id          rev      reversed
    shuf1    a random permutation                hw_*     found by the search
  codes under the maps hw_best and sorted (the off path with placement fixed):
    default_sm    the hook build (-DDTMK_SM_WORKER), nothing enabled
    hook_sm       the grid handoff's hook build (-DDTMK_HANDOFF -DDTMK_SM_WORKER), launched
                  plainly: its off cost against the lean grid's code (nohooks_sm)
  (session 11's lean builds with a leave test, leanplain_sm / leanafter_sm, ran here on
  2026-12-01 at 1c6cb41: +1.44 / +2.42% under hw_best on 1b; they are gone)

Per (map, code): every launch's us/step (one launch of K steps, device events), rounds
with the order reversed every other one, the first a warm-up; tokens checked equal.
Reading: if a fixed map's launches agree within a few tenths of a percent while "block"
spreads, placement is the launch-to-launch spread; the maps' medians then say how much
placement alone is worth.  Writes DIR/placement.json; a short table last.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import numpy as np

REQUIRES = "gpu"   # what `dtrace-mk bench placement` checks before it runs: cpu, gpu, or gpu:N (N ranks, N GPUs)

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

STEPS = {"tiny": 128, "1b": 48}
SMW = "DTMK_SM_WORKER"
CODES = {"nohooks_sm": ("DTMK_NO_HOOKS", SMW), "default_sm": (SMW,), "hook_sm": ("DTMK_HANDOFF", SMW)}
MAPS = ("block", "sorted", "rev", "shuf1", "hw_best", "hw_median", "hw_worst")
CODE_MAPS = ("hw_best", "sorted")    # where every code runs (paired with nohooks_sm there)


def orders(smids, found=None):
    """map name -> worker order (list of SM ids; None = no map).  found: [(us, order)] of
    the search's block-order launches -> hw_best / hw_median / hw_worst."""
    s = sorted(smids)
    n = len(s)
    out = {"block": None, "sorted": s, "rev": s[::-1], "rot": s[n // 3:] + s[:n // 3]}
    for k in (1, 2):
        out[f"shuf{k}"] = [s[i] for i in np.random.default_rng(k).permutation(n)]
    if found:
        by = sorted(found, key=lambda x: x[0])
        out.update(hw_best=by[0][1], hw_median=by[len(by) // 2][1], hw_worst=by[-1][1])
    return {m: out[m] for m in MAPS if m in out}


def pairs():
    return [(m, "nohooks_sm") for m in MAPS] + [(m, c) for m in CODE_MAPS for c in CODES if c != "nohooks_sm"]


def stats(t):
    return {"median": statistics.median(t), "min": min(t), "max": max(t),
            "spread_pct": 100.0 * (max(t) / min(t) - 1.0)}


def bench_preset(name: str, reps: int, log, search: int = 24) -> dict:
    from dtrace_mk.megakernel import gpu
    from dtrace_mk.megakernel.presets import PRESETS
    from benchio import kernels_on, record_placements, timed_rounds
    cfg = PRESETS[name]
    steps = STEPS.get(name, 16)
    m = gpu.Megakernel(cfg, batch=1, defines=CODES["nohooks_sm"])
    kern = kernels_on(m, CODES)
    smids = gpu.probe_smids(m.num_workers, m.smem)
    log(json.dumps({"preset": name, "workers": m.num_workers, "smids": sorted(smids)}))
    m.kernel = kern["nohooks_sm"]
    found = record_placements(m, steps, search)
    ords = orders(smids, found)
    log(json.dumps({"preset": name, "search_us_per_step": sorted(round(u, 1) for u, _ in found)}))

    def timed(mp, c):
        if ords[mp] is None:
            m.place_workers([])
        else:
            m.place_workers(ords[mp])
        m.kernel = kern[c]
        m.reset()
        return m.finish(m.start(steps, poison=False))

    ps = pairs()
    times, last = timed_rounds(ps, reps, steps, lambda p: timed(*p))
    ref = last[ps[0]].tokens
    st = {f"{mp}/{c}": stats(t) for (mp, c), t in times.items()}
    paired = {f"{mp}/{c}": 100.0 * (st[f"{mp}/{c}"]["median"] / st[f"{mp}/nohooks_sm"]["median"] - 1.0)
              for mp in CODE_MAPS for c in CODES}
    out = {"preset": name, "steps_per_launch": steps, "reps": reps, "stats": st, "paired_pct": paired,
           "search_us_per_step": [u for u, _ in found], "orders": ords,
           "all_us_per_step": {f"{mp}/{c}": t for (mp, c), t in times.items()},
           "tokens_equal": all(np.array_equal(r.tokens, ref) for r in last.values())}
    log(json.dumps({k: out[k] for k in ("preset", "stats", "paired_pct", "tokens_equal")}))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--presets", default="1b,tiny")
    ap.add_argument("--reps", type=int, default=8)
    ap.add_argument("--search", type=int, default=24, help="block-order launches whose placements are recorded")
    ap.add_argument("--out", default=".")
    a = ap.parse_args(argv)
    from benchio import run_presets
    res = run_presets(a.out, "placement", a.presets, lambda p, log: bench_preset(p, a.reps, log, a.search))
    print(f"\n{res['card']}  {res['date']}  {res['commit']}  (us/step over --reps launches; paired % vs nohooks_sm, same map)")
    for r in res["presets"]:
        print(f"{r['preset']}  tokens equal: {r['tokens_equal']}")
        print(f"{'map/code':<20} {'median':>8} {'min':>8} {'max':>8} {'spread':>7} {'paired':>8}")
        for k, s in r["stats"].items():
            pp = r["paired_pct"].get(k)
            print(f"{k:<20} {s['median']:>8.1f} {s['min']:>8.1f} {s['max']:>8.1f} {s['spread_pct']:>6.2f}% "
                  + (f"{pp:>+7.2f}%" if pp is not None else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
