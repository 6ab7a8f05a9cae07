"""Where the observer warp's time goes (-DDTMK_OBS_WARP -DDTMK_OW_STATS; kernels/megakernel.cu
"observer warp"): the hot summary monitor attached before the launch, per build, side by
side with the default hook build and the no-hook build (us/step, median of --reps), and
the observer's counters per worker and step.

    python tools/obs_warp_probe.py [--presets 1b,tiny] [--reps 3] [--extra OW_Q=64+OW_ROOM=24,...]

Counters (dtmk_ow_stats): forced serves at first looks, entries and VM units run while
thread 0 polls / in forced serves, poll rounds served, and the delay from thread 0 seeing
its event to the observer joining the barrier (mean and max, ns)."""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

STEPS = {"tiny": 128, "1b": 32}
NAMES = ("forced", "ent_poll", "ent_forced", "vm_poll", "vm_forced", "late_ns_sum", "rounds", "late_ns_max")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--presets", default="1b,tiny")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--extra", default="", help="extra observer-warp builds: DEFINE+DEFINE,... (each + the stats)")
    a = ap.parse_args(argv)
    import cupy as cp
    import numpy as np
    from dtrace_mk.megakernel import gpu
    from dtrace_mk.megakernel.presets import PRESETS
    from dtrace_mk.megakernel.reference import make_weights
    from dtrace_mk.runtime.live import LiveSession, summary_monitor
    builds = {"nohooks": ("DTMK_NO_HOOKS",), "default": (), "obswarp": ("DTMK_OBS_WARP", "DTMK_OW_STATS")}
    for spec in filter(None, a.extra.split(",")):
        builds["obswarp+" + spec] = ("DTMK_OBS_WARP", "DTMK_OW_STATS") + tuple(spec.split("+"))
    for name in a.presets.split(","):
        cfg, steps = PRESETS[name], STEPS.get(name, 32)
        w = make_weights(cfg, 0)
        rows = {}
        for b, defs in builds.items():
            mk = gpu.Megakernel(cfg, batch=1, weights=w, defines=defs)
            live = None if b == "nohooks" else LiveSession(mk)
            aid = live.attach(summary_monitor(mk.graph.schema).obj) if live else None
            stats = cp.ndarray((8,), cp.uint64, memptr=mk.module.get_global("dtmk_ow_stats")) if "DTMK_OW_STATS" in defs else None
            times, tok = [], None
            for r in range(a.reps + 1):
                mk.reset()
                if stats is not None:
                    stats[:] = 0
                if live:
                    live.start(steps)
                    res = live.wait()
                else:
                    res = mk.run(steps, poison=False)
                tok = res.tokens if tok is None else tok
                assert np.array_equal(res.tokens, tok)
                if r:
                    times.append(res.elapsed_ms * 1e3 / steps)
            st = stats.get() if stats is not None else None
            lost = int(live.snapshot(aid).state["lost"].sum()) if live else 0
            if live:
                live.detach(aid)
            rows[b] = (statistics.median(times), st, lost)
        base = rows["nohooks"][0]
        print(f"\n{name} ({steps} steps/launch, {a.reps} reps, per worker and step below)")
        per = steps * 132
        for b, (us, st, lost) in rows.items():
            line = f"  {b:<28} {us:8.1f} us/step  {100 * (us / base - 1):+7.2f}% vs nohooks  lost {lost}"
            if st is not None:
                s = [int(x) for x in st]
                line += ("  forced %.2f  ent poll/forced %.1f/%.1f  vm poll/forced %.2f/%.2f  rounds %.1f  "
                         "late mean %.0f ns max %d ns" % (s[0] / per, s[1] / per, s[2] / per, s[3] / per, s[4] / per,
                                                         s[6] / per, s[5] / max(s[6], 1), s[7]))
            print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
