"""Where the observer SM's time goes (GPU; measurement only): the hot summary monitor in
the default hook build and in the observer-SM build (-DDTMK_OBS_SM -DDTMK_OSQ_STATS), side
by side on the same weights, then the observer warps' counters of one more launch.

    python tools/obs_sm_probe.py [--presets tiny,1b] [--reps 5] [--steps N] [--out DIR]
                                 [--defines DEF+DEF] [--prof]

Per preset: us/step (median over alternating launches, round 0 a warm-up) of `nohooks`
(no hook code, all SMs working), `default` (summary attached), `obssm` (summary attached)
and `obssm_plain` (nothing attached); tokens checked equal.  Then per observer warp (kernels/mk_obs_sm.cuh DTMK_OSQ_STATS):
rounds, entries per round, idle scans, room drains, the largest queue lag, and the SM
cycles in scanning / building / obs_sync / tails per step; and how often (and how long) a
worker found its queue full -- the backpressure that turns observer lag into step time.
--defines: extra defines of the observer-SM build (a variant, e.g. DTMK_OBS_SMS=3);
--prof: one more launch of that build with -DDTMK_OBS_PROF, printing where observer warp
0's obs_sync time goes (VM calls, flushes, moves; inside them the exec step, coverage,
helper calls, memory instructions: bench/level_profile.py's tables, per step)."""
from __future__ import annotations

import argparse
import hashlib
import re
import statistics
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

STEPS = {"tiny": 64, "1b": 16}
STAT_NAMES = ("rounds", "entries", "idle_scans", "room_drains", "cyc_scan", "cyc_build", "cyc_sync", "cyc_tail",
              "max_lag", "idle_drains", "desc_records")
OBS_DEFINES = ("DTMK_OBS_SM", "DTMK_OSQ_STATS")
SM_HZ = 1980e6                         # the H200's SM clock under the megakernel (hooks.md session 18: every build)


def probe_preset(name: str, reps: int, steps: int, log, extra=(), prof=False, query=None, obs_smids=None) -> dict:
    import cupy as cp
    from benchio import timed_rounds
    from dtrace_mk.megakernel import gpu
    from dtrace_mk.megakernel.presets import PRESETS
    from dtrace_mk.megakernel.reference import make_weights
    from dtrace_mk.runtime.live import LiveSession, summary_monitor
    cfg = PRESETS[name]
    w = make_weights(cfg, 0)
    mks = {"default": gpu.Megakernel(cfg, batch=1, weights=w),
           "obssm": gpu.Megakernel(cfg, batch=1, weights=w, defines=OBS_DEFINES + tuple(extra)),
           "nohooks": gpu.Megakernel(cfg, batch=1, weights=w, defines=("DTMK_NO_HOOKS",))}
    if obs_smids:                      # -DDTMK_SM_WORKER: the observers on these SMs, workers on the rest in id order
        mo = mks["obssm"]
        ids = sorted(gpu.probe_smids(mo.grid, mo.smem))
        if len(obs_smids) != mo.obs_sms or not set(obs_smids) <= set(ids):
            raise SystemExit(f"--observer-smids: want {mo.obs_sms} of the grid's SMs {ids[0]}..{ids[-1]}")
        mo.place_workers([i for i in ids if i not in obs_smids] + list(obs_smids))
        log(f"{name}: observers on SMs {list(obs_smids)}")
    lives = {k: LiveSession(mks[k]) for k in ("default", "obssm")}
    for live in lives.values():
        if query is None:
            live.attach(summary_monitor(live.mk.graph.schema).obj)
        else:
            from dtrace_mk.lang.pipeline import compile_query
            live.attach(compile_query(query, live.mk.graph.schema, name="<probe query>").obj)

    def launch(key):
        m = mks["obssm" if key.startswith("obssm") else key]
        m.reset()
        if key == "nohooks":
            return m.run(steps, poison=False)
        if key == "obssm_plain":
            m.set_observer(0, None)
            res = m.run(steps, poison=False)
            m.set_observer(int(lives["obssm"].rt.tables.data.ptr), lives["obssm"].state)
            return res
        live = lives[key]
        live.start(steps)
        return live.wait()

    keys = ["nohooks", "default", "obssm", "obssm_plain"]
    times, last = timed_rounds(keys, reps, steps, launch)
    med = {k: statistics.median(v) for k, v in times.items()}
    m = mks["obssm"]
    rows = m.obs_sms * m.obs_sm_warps_max               # (warp k = observer m's warp kl: m * Kl + kl)
    stats = cp.ndarray((rows * len(STAT_NAMES),), cp.uint64,
                       memptr=m.module.get_global("dtmk_osq_stats"))
    wstats = cp.ndarray((2,), cp.uint64, memptr=m.module.get_global("dtmk_osq_wstats"))
    stats.fill(0)
    wstats.fill(0)
    launch("obssm")
    st = stats.get().reshape(rows, len(STAT_NAMES))
    warps = [dict(zip(STAT_NAMES, (int(x) for x in row))) for row in st if row[0] or row[2]]
    ws = wstats.get()
    out = {"preset": name, "steps_per_launch": steps, "reps": reps, "us_per_step": med,
           "summary_obssm_vs_default_pct": 100.0 * (med["obssm"] / med["default"] - 1.0),
           "summary_obssm_vs_plain_pct": 100.0 * (med["obssm"] / med["obssm_plain"] - 1.0),
           "summary_obssm_vs_nohooks_pct": 100.0 * (med["obssm"] / med["nohooks"] - 1.0),
           "summary_default_vs_nohooks_pct": 100.0 * (med["default"] / med["nohooks"] - 1.0),
           "tokens_equal": all(np.array_equal(last["nohooks"].tokens, last[k].tokens) for k in keys),
           "observer_warps": warps, "full_queue_pushes": int(ws[0]), "full_queue_cycles": int(ws[1])}
    log(str(out))
    log(f"{name}: us/step nohooks {med['nohooks']:.1f}  default+summary {med['default']:.1f}  obssm+summary "
        f"{med['obssm']:.1f}  obssm plain {med['obssm_plain']:.1f}")
    log(f"{name}: hot summary over no hook code: default {out['summary_default_vs_nohooks_pct']:+.2f}%  "
        f"observer SM {out['summary_obssm_vs_nohooks_pct']:+.2f}%  (obssm summary vs its plain run "
        f"{out['summary_obssm_vs_plain_pct']:+.2f}%); tokens equal: {out['tokens_equal']}")
    for line in warp_table(warps, steps, med["obssm"]):
        log(line)
    log(f"workers found their queue full {out['full_queue_pushes']} times, {out['full_queue_cycles']} cycles")
    if prof:
        out["prof"] = observer_prof(cfg, w, steps, tuple(extra), log)
    return out


def warp_busy(r: dict, steps: int, us_per_step: float) -> float:
    """An observer warp's share of the step spent scanning, building, draining and storing
    tails (the rest: idle rounds' sleeps).  Session 26: ~85% on 1b, the busiest warps ~100%."""
    cyc = sum(r[c] for c in ("cyc_scan", "cyc_build", "cyc_sync", "cyc_tail")) / steps
    return cyc / (us_per_step * 1e-6 * SM_HZ)


def warp_table(warps, steps: int, us_per_step: float) -> list:
    """The per-warp lines of the probe's report (cycles per step; busy: warp_busy)."""
    lines = [f"{'warp':>4} {'rounds':>7} {'ent/rnd':>7} {'idle':>7} {'drains':>6} {'lag':>4} "
             f"{'scan/st':>9} {'build/st':>9} {'sync/st':>9} {'tail/st':>9} {'desc':>7} {'busy':>5}   (cycles per "
             f"step; desc: records run through descriptors, -DDTMK_OSQ_DESC; busy: of the step at "
             f"{SM_HZ / 1e6:.0f} MHz)"]
    for k, r in enumerate(warps):
        per = lambda c: r[c] / steps  # noqa: E731
        lines.append(f"{k:>4} {r['rounds']:>7} {r['entries'] / max(r['rounds'], 1):>7.1f} {r['idle_scans']:>7} "
                     f"{r['room_drains']:>6} {r['max_lag']:>4} {per('cyc_scan'):>9.0f} {per('cyc_build'):>9.0f} "
                     f"{per('cyc_sync'):>9.0f} {per('cyc_tail'):>9.0f} {r['desc_records']:>7} "
                     f"{100 * warp_busy(r, steps, us_per_step):>4.0f}%")
    return lines


def observer_prof(cfg, w, steps: int, extra, log) -> list:
    """One launch of the observer-SM build with -DDTMK_OBS_PROF and the summary attached:
    observer warp 0's dtmk_obs_prof counters (count, cycles) per step."""
    import cupy as cp
    from level_profile import PROF_N, print_prof
    from dtrace_mk.megakernel import gpu
    from dtrace_mk.runtime.live import LiveSession, summary_monitor
    m = gpu.Megakernel(cfg, batch=1, weights=w, defines=OBS_DEFINES + tuple(extra) + ("DTMK_OBS_PROF",))
    live = LiveSession(m)
    live.attach(summary_monitor(m.graph.schema).obj)
    prof = cp.ndarray((PROF_N,), cp.uint64, memptr=m.module.get_global("dtmk_obs_prof"))
    for _ in range(2):                 # (the first launch warms up; the second is counted)
        prof.fill(0)
        m.reset()
        live.start(steps)
        live.wait()
    v = [int(x) for x in prof.get()]
    log("observer warp 0 (DTMK_OBS_PROF; per step):")
    print_prof({"obssm w0": v}, steps, 1, emit=log)   # (into the probe's log, beside its other tables)
    return v


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--presets", default="tiny,1b")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--steps", type=int, default=0, help="decode steps per launch (0: tiny 64, 1b 16)")
    ap.add_argument("--out", default=".")
    ap.add_argument("--defines", default="", help="DEF+DEF: extra defines of the observer-SM build")
    ap.add_argument("--prof", action="store_true", help="also profile observer warp 0 (-DDTMK_OBS_PROF)")
    ap.add_argument("--observer-smids", default="",
                    help="comma list: the observer SMs (needs DTMK_SM_WORKER in --defines; workers on the rest)")
    ap.add_argument("--query", default=None,
                    help="a query (text, or @FILE) attached instead of the summary monitor (live.SUMMARY_QUERY)")
    a = ap.parse_args(argv)
    if a.reps < 2:
        ap.error("--reps must be >= 2 (round 0 is a warm-up)")
    from benchio import run_presets
    extra = tuple(d for d in a.defines.split("+") if d)
    tag = "".join("_" + re.sub(r"\W", "", d.lower().replace("dtmk_", "")) for d in extra)   # (file names)
    query = a.query
    if query is not None:
        if query.startswith("@"):
            query = Path(query[1:]).read_text()
        tag += "_q" + hashlib.sha1(query.encode()).hexdigest()[:6]
    obs_smids = [int(x) for x in a.observer_smids.split(",") if x]
    if obs_smids:
        tag += "_sm" + "-".join(map(str, obs_smids))
    run_presets(a.out, "obs_sm_probe" + tag, a.presets,
                lambda p, log: probe_preset(p, a.reps, a.steps or STEPS.get(p, 16), log, extra, a.prof, query, obs_smids))
    return 0


if __name__ == "__main__":
    sys.exit(main())
