"""The off path with grid handoff, as ratios measured in one run (issue 5's first target).

    python bench/handoff.py [--presets tiny,1b] [--reps 5] [--instances 3] [--out DIR]

Per preset (batch 1, one launch of K decode steps, device events, median of --reps runs
taken round-robin so drift hits all alike; tokens of every row checked against nohooks):

  nohooks   megakernel.cu with -DDTMK_NO_HOOKS: no hook code at all (the baseline)
  leanplain the lean build's code (-DDTMK_NO_HOOKS -DDTMK_HANDOFF) launched plainly (no
            handoff block): the handoff code's own cost
  leanafter the same with -DDTMK_HO_AFTER_SYNC (the leave test behind the wait's first
            barrier: thread 0's wait prologue is the no-hook build's PTX)
  default   the default hook build, nothing enabled (the off path without handoff)
  (each of these four in --instances Megakernels with their own weights and buffers:
  the same code runs up to ~2% apart in two instances (1b, measured 2026-12-01), so a
  build's figure is the MEAN over its instances, printed with their range)
  lean      Megakernel(handoff=True).start(lean=True): the lean grid (-DDTMK_NO_HOOKS
            -DDTMK_HANDOFF) as LiveSession runs a job with nothing attached; it would hand
            over to the hook build at the first attach (the off path WITH handoff)
  lean2     the same again (lean2 / lean: the noise floor of this run)
  swap      lean, handed to the hook build by every worker after its 8th task (the cost of
            a run that swaps: one extra grid launch, each worker's leave and resume)
  hook      the handoff hook build (-DDTMK_HANDOFF) alone, nothing attached
  summary   the summary monitor attached in the hot tier before the launch (the hook build
            runs; what a user pays while monitoring, printed against lean)

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

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from dtrace_mk.megakernel import gpu  # noqa: E402
from dtrace_mk.megakernel.presets import PRESETS  # noqa: E402
from dtrace_mk.megakernel.reference import make_weights  # noqa: E402
from dtrace_mk.runtime.live import LiveSession, summary_monitor  # noqa: E402

STEPS = {"tiny": 128, "1b": 48}      # per launch: long enough that launch jitter stays below 0.5%
LONG = {"tiny": 4000, "1b": 600}
BUILDS = {"nohooks": ("DTMK_NO_HOOKS",), "leanplain": ("DTMK_HANDOFF", "DTMK_NO_HOOKS"),
          "leanafter": ("DTMK_HANDOFF", "DTMK_NO_HOOKS", "DTMK_HO_AFTER_SYNC"), "default": ()}
SINGLE = ("lean", "lean2", "swap", "hook", "summary")


def bench_preset(name: str, reps: int, log, instances: int = 3) -> dict:
    cfg = PRESETS[name]
    w = make_weights(cfg, 0)
    steps = STEPS.get(name, 16)
    mkh = gpu.Megakernel(cfg, batch=1, weights=w, handoff=True)
    inst = {f"{b}.{k}": gpu.Megakernel(cfg, batch=1, weights=w, defines=d)
            for k in range(instances) for b, d in BUILDS.items()}
    rows = tuple(inst) + SINGLE
    live = LiveSession(mkh)                       # the summary's tables (attached for "summary" only)
    mon = summary_monitor(mkh.graph.schema)

    def timed(m, **kw):
        m.reset()
        h = m.start(steps, poison=False, **kw)
        r = m.finish(h)
        return r, m.handoff_state(h)

    def run(v):
        mkh.set_observer(0, None)
        if v in inst:
            return timed(inst[v])
        if v in ("lean", "lean2"):
            return timed(mkh, lean=True)
        if v == "swap":
            return timed(mkh, handoff_after=8)
        if v == "summary":
            mkh.set_observer(int(live.rt.tables.data.ptr), live.state)
        try:
            return timed(mkh)
        finally:
            mkh.set_observer(0, None)

    aid = live.attach(mon.obj)                   # in the tables; only "summary" wires them
    times = {v: [] for v in rows}
    toks, swaps = {}, {}
    for rep in range(reps + 1):                  # rep 0: warm-up (not timed)
        for v in (rows if rep % 2 else rows[::-1]):   # both orders: no row always follows another
            r, st = run(v)
            toks[v] = r.tokens
            if v == "swap":
                swaps = {"left": len(st["left"]), "claimed": st["claimed"]}
            if rep:
                times[v].append(r.elapsed_ms * 1e3 / steps)
    live.detach(aid)
    med = {v: statistics.median(t) for v, t in times.items()}
    for b in BUILDS:                              # a build's figure: the mean over its instances
        ks = [med[f"{b}.{k}"] for k in range(instances)]
        med[b] = statistics.fmean(ks)
        med[b + "_range"] = (min(ks), max(ks))
    out = {"preset": name, "steps_per_launch": steps, "reps": reps, "instances": instances,
           "us_per_step": med, "all_us_per_step": times,
           "tokens_equal": {v: bool(np.array_equal(t, toks["nohooks.0"])) for v, t in toks.items()},
           "swap": swaps, "tasks": len(mkh.graph.tasks),
           "smem": {b: inst[f"{b}.0"].shared_memory() for b in BUILDS} | {"hook": mkh.shared_memory()}}
    log(json.dumps({k: out[k] for k in ("preset", "us_per_step", "tokens_equal", "swap")}))
    # hot attach into a lean job: one handoff per launch
    lat = []
    for rep in range(reps):
        live.mk.reset()
        mkh.set_observer(int(live.rt.tables.data.ptr), live.state)     # where the hook grid finds them
        live.start(LONG.get(name, 600))
        assert live.handle["handoff"] is not None
        t0 = time.perf_counter()
        while live.snapshot_steps() < 3 and time.perf_counter() - t0 < 20:
            time.sleep(0.001)
        a = live.attach(mon.obj)
        got = None
        while got is None and time.perf_counter() - t0 < 30 and live.running():
            got = live.attach_latency(live.gen)
        live.mk.abort()
        live.wait(raise_on_watchdog=False)
        st = live.mk.handoff_state(live.handle)
        if got is not None:
            got["claimed"] = st["claimed"]
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
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--instances", type=int, default=3, help="Megakernels per build for nohooks / leanplain / default")
    ap.add_argument("--out", default=".")
    a = ap.parse_args(argv)
    import cupy as cp
    from benchio import card, each_preset, logger
    outdir = Path(a.out)
    log = logger(outdir, "handoff.log")
    res = {**card(cp), "presets": each_preset(a.presets.split(","),
                                              lambda p: bench_preset(p, a.reps, log, a.instances), log)}
    (outdir / "handoff.json").write_text(json.dumps(res, indent=1, default=str))
    print(f"\n{res['card']}  {res['date']}  {res['commit']}  (median us/step; % of the row named)")
    print(f"{'preset':<6} {'nohooks us':>10} {'nohk spread':>11} {'lplain/nohk':>11} {'lafter/nohk':>11} "
          f"{'dflt/nohk':>9} {'lean/nohk':>9} "
          f"{'lean2/lean':>10} {'swap/lean':>9} {'hook/dflt':>9} {'sum/lean':>8} {'attach ms':>9} {'left':>5} tok")
    for r in res["presets"]:
        u = r["us_per_step"]
        rel = lambda a_, b: f"{100 * (u[a_] / u[b] - 1):+.2f}%"  # noqa: E731
        lo, hi = u["nohooks_range"]
        print(f"{r['preset']:<6} {u['nohooks']:>10.1f} {100 * (hi / lo - 1):>10.2f}% {rel('leanplain', 'nohooks'):>11} "
              f"{rel('leanafter', 'nohooks'):>11} "
              f"{rel('default', 'nohooks'):>9} {rel('lean', 'nohooks'):>9} {rel('lean2', 'lean'):>10} "
              f"{rel('swap', 'lean'):>9} {rel('hook', 'default'):>9} {rel('summary', 'lean'):>8} "
              f"{r.get('attach_write_to_first_event_ms_median', float('nan')):>9.3f} "
              f"{r['swap'].get('left', 0):>5} {all(r['tokens_equal'].values())}")
    print("(nohooks / leanplain / leanafter / dflt: means over each build's instances; per instance:)")
    for r in res["presets"]:
        u = r["us_per_step"]
        print(r["preset"], "  ".join(f"{b}: " + " ".join(f"{u[f'{b}.{k}']:.1f}" for k in range(r["instances"]))
                                     for b in BUILDS))
    return 0


if __name__ == "__main__":
    sys.exit(main())
