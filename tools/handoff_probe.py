"""Grid handoff, seen from the device clock: per preset and handoff_after, did the run end
normally, how many workers left / were resumed, and did successor CTAs start while lean
workers still ran (the first resume before the last leave: co-scheduled grids).

    python tools/handoff_probe.py [--presets tiny,1b] [--after 0,8] [--watchdog-ms 500]"""
import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--presets", default="tiny,1b")
    ap.add_argument("--after", default="0,8")
    ap.add_argument("--watchdog-ms", type=int, default=500)
    ap.add_argument("--steps", type=int, default=4)
    a = ap.parse_args()
    from dtrace_mk.megakernel import gpu
    from dtrace_mk.megakernel.presets import PRESETS
    print(f"{'preset':<9} {'after':>5} {'end':<9} {'left':>4} {'resum':>5} {'fin':>4} "
          f"{'1st resume - 1st leave':>23} {'last leave - 1st resume':>24} {'resume-leave med us':>17}")
    for name in a.presets.split(","):
        m = gpu.Megakernel(PRESETS[name], batch=2, seed=0, handoff=True)
        for after in (int(x) for x in a.after.split(",")):
            m.reset()
            h = m.start(a.steps, handoff_after=after, watchdog_ms=a.watchdog_ms, refresh=1)
            res = m.finish(h, raise_on_watchdog=False)
            st = m.handoff_state(h)
            push, claim = st["leave_ns"], st["resume_ns"]
            pushed = push[push > 0]
            claimed = claim[claim > 0]
            first_push = pushed.min() if pushed.size else 0
            d1 = (claimed.min() - first_push) / 1e3 if claimed.size and pushed.size else float("nan")
            d2 = (pushed.max() - claimed.min()) / 1e3 if claimed.size and pushed.size else float("nan")
            both = (push > 0) & (claim > 0)
            med = float(np.median(claim[both] - push[both])) / 1e3 if both.any() else float("nan")
            end = "ok" if res.watchdog is None else res.watchdog["reason"]
            print(f"{name:<9} {after:>5} {end:<9} {len(st['left']):>4} {st['resumed']:>5} {len(st['finished']):>4} "
                  f"{d1:>23.1f} {d2:>24.1f} {med:>17.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
