"""Does a launch's place in its round move its time?  Reads a bench/hooks.py table run with
`--order shuffled` (hooks.json `positions`: each timed launch's place in its round, by variant)
and prints, per variant, its median us/step, the least-squares slope of us/step over the place
(us per place) and the medians of its launches in the first / last third of the rounds' places.

    python3 tools/order_bias.py OUT/hooks.json [--variants nohooks,off,off2,...]

Why (session 62): bench/obs_split.py moved a variant ~0.5 point with its place in the round, and
the table's off / nohooks read ~1.2 points above --offpath's on the same cubins.  A slope near 0
for nohooks and off says the table's order is not what separates the two methods.
Exit status 2 on a file without `positions` (a fixed-order run) or an unknown variant."""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from typing import Dict, List


def fit_slope(xs: List[float], ys: List[float]) -> float:
    """Least-squares slope of ys over xs (0.0 where the xs do not vary)."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0


def order_rows(preset: dict, variants=None) -> List[Dict]:
    """One row per variant: n, median, slope (us per place), early / late medians (the first and
    last third of the places the rounds had).  A variant's launches past its rounds (the table
    times off again with live_idle after them) are left out: they have no place."""
    pos, times = preset.get("positions"), preset["all_us_per_step"]
    if not pos:
        raise ValueError("no `positions` in this run: it ran in the fixed order (bench/hooks.py --order shuffled)")
    names = list(pos) if variants is None else list(variants)
    unknown = [v for v in names if v not in pos]
    if unknown:
        raise ValueError(f"variants {unknown} not in this run; it has {sorted(pos)}")
    places = max(max(p) for p in pos.values() if p) + 1
    rows = []
    for v in names:
        xs, ys = pos[v], times[v][:len(pos[v])]
        early = [y for x, y in zip(xs, ys) if x < places / 3]
        late = [y for x, y in zip(xs, ys) if x >= 2 * places / 3]
        rows.append({"variant": v, "n": len(ys), "median": statistics.median(ys), "slope": fit_slope(xs, ys),
                     "early": statistics.median(early) if early else None,
                     "late": statistics.median(late) if late else None})
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("hooks_json")
    ap.add_argument("--variants", default="", help="comma-separated (default: every variant of the run)")
    a = ap.parse_args(argv)
    try:
        with open(a.hooks_json) as f:
            res = json.load(f)
        for preset in res["presets"]:
            rows = order_rows(preset, [v for v in a.variants.split(",") if v] or None)
            print(f"{preset['preset']} ({preset.get('order', '?')} order, {preset.get('reps')} rounds)")
            print(f"{'variant':<16} {'n':>3} {'median us':>10} {'us/place':>9} {'early':>8} {'late':>8}")
            f = lambda x: f"{x:>8.1f}" if x is not None else f"{'-':>8}"  # noqa: E731
            for r in rows:
                print(f"{r['variant']:<16} {r['n']:>3} {r['median']:>10.1f} {r['slope']:>+9.2f} {f(r['early'])} {f(r['late'])}")
    except (OSError, ValueError, KeyError) as e:
        print(f"order_bias: {a.hooks_json}: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
