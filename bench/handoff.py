"""The off path with grid handoff, as PAIRED ratios measured in one run (issue 5's first target).

    python bench/handoff.py [--presets tiny,1b] [--reps 7] [--instances 3] [--placement sorted|search]
                            [--out DIR]

Each instance is one Megakernel(handoff=True) (its own weights and buffers); every row of
an instance runs on that instance's memory (kernels switched, as bench/paired.py: two
instances of one build differed by up to 1.6%, and one build's launches by 1.5% with the
hardware's block placement, bench/placement.py), and a row's figure is the mean over
instances of its ratio on the same instance.  Batch 1, one launch of K decode steps,
device events, median of --reps runs, rounds in alternating order; tokens checked.

  nohooks   -DDTMK_NO_HOOKS, launched plainly: no hook code, the hardware's placement
  lean      start(lean=True): the lean grid as LiveSession runs a job with nothing
            attached (the no-hook build with placement; the first attach hands over)
  lean2     the same again (lean2 / lean: the noise floor of this run)
  leancode  the lean grid's kernel launched plainly (no successor preloaded, no handoff)
  default   the default hook build, nothing enabled, hardware placement (the off path
            WITHOUT handoff)
  hook      the handoff hook build (-DDTMK_HANDOFF -DDTMK_SM_WORKER) alone, nothing
            attached, workers placed as the lean grid's: hook / lean is the hook build's
            off cost at equal placement
  swap      lean, handed to the hook build once a worker has done 8 tasks
  summary   the summary monitor attached in the hot tier before the launch (the hook build
            runs; what a user pays while monitoring, printed against lean)
--placement: sorted (the SMs in id order) or search (the fastest of 16 block-order
launches of the lean code, recorded: Megakernel.record_placement).

then the hot attach latency INTO A LEAN JOB: LiveSession starts the lean grid, the summary
is attached mid-run (the hook grid is launched and every worker moves over), from the
host's generation write and from the attach command to the first counted event (device
clock); one attach per launch, --reps launches.

Writes DIR/handoff.json; prints a short table last.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

REQUIRES = "gpu"   # what `dtrace-mk bench handoff` checks before it runs: cpu, gpu, or gpu:N (N ranks, N GPUs)

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from dtrace_mk.megakernel import gpu  # noqa: E402
from dtrace_mk.megakernel.presets import PRESETS  # noqa: E402
from dtrace_mk.megakernel.reference import make_weights  # noqa: E402
from dtrace_mk.runtime.live import LiveSession, summary_monitor  # noqa: E402

STEPS = {"tiny": 128, "1b": 48}      # per launch: long enough that launch jitter stays below 0.5%
LONG = {"tiny": 4000, "1b": 600}
CODES = {"nohooks": ("DTMK_NO_HOOKS",), "default": ()}       # launched plainly on the instance's memory
ROWS = ("nohooks", "lean", "lean2", "leancode", "default", "hook", "swap", "summary")
RATIOS = (("lean", "nohooks"), ("lean2", "lean"), ("leancode", "lean"), ("default", "nohooks"), ("hook", "lean"),
          ("swap", "lean"), ("summary", "lean"))


def paired_ratios(med: dict) -> dict:
    """med[instance][row] -> {"a/b": {"mean_pct", "min_pct", "max_pct"}} over RATIOS, each
    taken on one instance, then averaged over instances."""
    out = {}
    for a_, b_ in RATIOS:
        per = [100.0 * (m[a_] / m[b_] - 1.0) for m in med.values()]
        out[f"{a_}/{b_}"] = {"mean_pct": statistics.fmean(per), "min_pct": min(per), "max_pct": max(per)}
    return out


def search_order(cfg, steps: int, w, n: int = 16):
    """The fastest of n block-order launches of the lean code, as a worker order."""
    from benchio import record_placements
    m = gpu.Megakernel(cfg, batch=1, weights=w, defines=("DTMK_NO_HOOKS", "DTMK_SM_WORKER"))
    return min(record_placements(m, steps, n), key=lambda x: x[0])[1]


def bench_preset(name: str, reps: int, log, instances: int = 3, placement: str = "sorted") -> dict:
    from benchio import kernels_on, timed_rounds
    cfg = PRESETS[name]
    w = make_weights(cfg, 0)
    steps = STEPS.get(name, 16)
    inst = [gpu.Megakernel(cfg, batch=1, weights=w, handoff=True) for _ in range(instances)]
    m0 = inst[0]
    order = search_order(cfg, steps, w) if placement == "search" else None
    used = [m.place_workers(order) for m in inst][0]
    kern = kernels_on(m0, CODES)
    lives = [LiveSession(m) for m in inst]        # the summary's tables (attached for "summary" only)
    mon = summary_monitor(m0.graph.schema)
    swaps = {}                                    # what the last "swap" run handed over

    def run(k, v):
        m, live = inst[k], lives[k]
        hook = m.kernel
        m.set_observer(0, None)
        kw = {}
        if v in kern:
            m.kernel = kern[v]
        elif v == "leancode":
            m.kernel = m.lean_kernel
        elif v in ("lean", "lean2"):
            kw = {"lean": True}
        elif v == "swap":
            kw = {"handoff_after": 8}
        elif v == "summary":
            m.set_observer(int(live.rt.tables.data.ptr), live.state)
        try:
            m.reset()
            h = m.start(steps, poison=False, **kw)
            res = m.finish(h)
            if v == "swap":
                st = m.handoff_state(h)
                swaps.update(left=len(st["left"]), resumed=st["resumed"])
            return res
        finally:
            m.kernel = hook
            m.set_observer(0, None)

    aids = [live.attach(mon.obj) for live in lives]   # in the tables; only "summary" wires them
    pairs = [(k, v) for k in range(instances) for v in ROWS]
    times, last = timed_rounds(pairs, reps, steps, lambda p: run(*p))
    for live, aid in zip(lives, aids):
        live.detach(aid)
    med = {str(k): {v: statistics.median(times[(k, v)]) for v in ROWS} for k in range(instances)}
    live = lives[0]
    out = {"preset": name, "steps_per_launch": steps, "reps": reps, "instances": instances,
           "placement": placement, "order": used,
           "us_per_step": med, "ratios": paired_ratios(med),
           "all_us_per_step": {f"{k}/{v}": t for (k, v), t in times.items()},
           "tokens_equal": all(np.array_equal(r.tokens, last[pairs[0]].tokens) for r in last.values()),
           "swap": swaps, "tasks": len(m0.graph.tasks), "smem": {"hook": m0.shared_memory()}}
    log(json.dumps({k: out[k] for k in ("preset", "us_per_step", "ratios", "tokens_equal", "swap")}))
    # hot attach into a lean job: one handoff per launch
    lat = []
    for rep in range(reps):
        m0.reset()
        m0.set_observer(int(live.rt.tables.data.ptr), live.state)      # where the hook grid finds them
        live.start(LONG.get(name, 600))
        assert live.handle["handoff"] is not None
        t0 = time.perf_counter()
        while live.snapshot_steps() < 3 and time.perf_counter() - t0 < 20:
            time.sleep(0.001)
        a = live.attach(mon.obj)
        got = None
        while got is None and time.perf_counter() - t0 < 30 and live.running():
            got = live.attach_latency(live.gen)
        m0.abort()
        live.wait(raise_on_watchdog=False)
        st = m0.handoff_state(live.handle)
        if got is not None:
            got["resumed"] = st["resumed"]
            lat.append(got)
        live.detach(a)
    out["attach"] = lat
    if lat:
        out["attach_write_to_first_event_ms_median"] = statistics.median(x["write_to_first_event_ms"] for x in lat)
        out["attach_cmd_to_first_event_ms_median"] = statistics.median(x["cmd_to_first_event_ms"] for x in lat)
    log(json.dumps({"preset": name, "attach": lat}))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--presets", default="tiny,1b")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--instances", type=int, default=3, help="Megakernel(handoff=True) instances (paired rows)")
    ap.add_argument("--placement", choices=("sorted", "search"), default="sorted")
    ap.add_argument("--out", default=".")
    a = ap.parse_args(argv)
    from benchio import run_presets
    res = run_presets(a.out, "handoff", a.presets, lambda p, log: bench_preset(p, a.reps, log, a.instances, a.placement))
    print(f"\n{res['card']}  {res['date']}  {res['commit']}  (paired: mean over instances of a/b on one "
          f"instance; median us/step per instance)")
    for r in res["presets"]:
        print(f"{r['preset']}  placement {r['placement']}  tokens equal: {r['tokens_equal']}  swap {r['swap']}  "
              f"attach write->first event {r.get('attach_write_to_first_event_ms_median', float('nan')):.3f} ms, "
              f"cmd->first event {r.get('attach_cmd_to_first_event_ms_median', float('nan')):.3f} ms")
        print(f"  {'row':<9} " + " ".join(f"{k:>9}" for k in r["us_per_step"]))
        for v in ROWS:
            print(f"  {v:<9} " + " ".join(f"{m[v]:>9.1f}" for m in r["us_per_step"].values()))
        print("  " + "  ".join(f"{k} {x['mean_pct']:+.2f}% ({x['min_pct']:+.2f}..{x['max_pct']:+.2f})"
                               for k, x in r["ratios"].items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
