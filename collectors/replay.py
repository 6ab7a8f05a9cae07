"""Replay the collector's diagnosis from a dump (collectors.diagnose.DUMP_ENV).

    DTRACE_MK_COLLECTOR_DUMP=/tmp/in.pkl dtrace-mk demo ...     # the job writes the dump
    python -m dtrace_mk.collectors.replay /tmp/in.pkl [--json]               # diagnose() again, offline
    python -m dtrace_mk.collectors.replay /tmp/in.pkl --steps 20-40 [--rank R]   # the epochs, step by step
    python -m dtrace_mk.collectors.replay --shape A.pkl B.pkl ... [--rank R]      # dumps side by side

Prints the verdict and findings (or the whole result as JSON): a wrong diagnosis seen on
the GPU machine can be studied on any machine, and a fix checked on the same input.
--steps prints one line per epoch of a rank instead: the gap since the previous epoch's
end (the kernel parked or idle), its length, and per task class the summed notification
lag and dependency wait (us) -- how session 46 found its late_notification artefact two
steps after each summary window's park.  --shape prints a few lines per dump, for A/B jobs
side by side (session 47's poller): step lengths, the kernel's parks, notification-lag
spikes (which class, which epoch) and where they sit after a park, and epochs of outlying
dispatch wait per class; its period is one epoch's end to the next one's (parks left out)."""
from __future__ import annotations

import json
import pickle
import sys

from .diagnose import diagnose


def load(path: str) -> dict:
    """The collector's input as the job dumped it (diagnose.DUMP_ENV)."""
    with open(path, "rb") as f:
        return pickle.load(f)


def replay(path: str) -> dict:
    d = load(path)
    return diagnose(d["summaries"], d["waits"], d["signals"], d["clock_samples"], d["scenario"],
                    pingpongs=d["pingpongs"], lost_ranks=d["lost_ranks"], **d["kw"])


def step_table(summaries, lo: int, hi: int, rank: int = 0, names=None) -> str:
    """One line per epoch lo..hi of `rank` (module doc); classes with tasks in the range."""
    from .records import Names
    names = names or Names.standard()
    by = {s.epoch: s for s in summaries if s.rank == rank}
    rows = [by[e] for e in range(lo, hi + 1) if e in by]
    if not rows:
        raise ValueError(f"--steps {lo}-{hi}: rank {rank} has no epoch there "
                         f"({min(by) if by else '-'}..{max(by) if by else '-'} held)")
    classes = sorted({c.task_class for s in rows for c in s.classes})
    out = ["step  gap_us  len_us  " + "  ".join(f"{names.task_class(c)[:12]:>12}" for c in classes),
           "                      " + "  ".join(f"{'lag/wait':>12}" for _ in classes)]
    for s in rows:
        prev = by.get(s.epoch - 1)
        gap = f"{(s.begin_ns - prev.end_ns) / 1e3:6.0f}" if prev else "     -"
        cs = {c.task_class: c for c in s.classes}
        cells = [f"{cs[c].notify_lag_sum_ns / 1e3:5.1f}/{cs[c].dep_wait_sum_ns / 1e3:<6.0f}" if c in cs else " " * 12
                 for c in classes]
        out.append(f"{s.epoch:4d}  {gap}  {(s.end_ns - s.begin_ns) / 1e3:6.1f}  " + "  ".join(f"{x:>12}" for x in cells))
    return "\n".join(out)


PARK_NS = 5_000_000          # a gap this long between epochs: the kernel parked (window work)
LAG_SPIKE = (2.5, 5_000)     # an epoch's class notification lag > 2.5x its median + 5 us
DISPATCH_OUTLIER_NS = 25_000   # an epoch's class dispatch wait > its median + 25 us
SPIKES_LISTED = 8              # --shape names this many spiking epochs, then counts the rest


def shape(summaries, rank: int = 0, names=None) -> str:
    """A dump's shape in a few lines (module doc; the thresholds above are exploratory, not
    the detectors')."""
    import statistics
    from collections import Counter
    from .records import Names
    names = names or Names.standard()
    rows = sorted((s for s in summaries if s.rank == rank), key=lambda s: s.epoch)
    if not rows:
        raise ValueError(f"--shape: rank {rank} has no epoch")
    lens = sorted(s.end_ns - s.begin_ns for s in rows)
    parks = [b.epoch for a, b in zip(rows, rows[1:]) if b.epoch == a.epoch + 1 and b.begin_ns - a.end_ns > PARK_NS]
    lag, disp = {}, {}
    for s in rows:
        for c in s.classes:
            lag.setdefault(c.task_class, {})[s.epoch] = c.notify_lag_sum_ns
            disp.setdefault(c.task_class, {})[s.epoch] = c.dispatch_wait_sum_ns
    where = []                                    # (epoch, class) of each spike
    for c, v in lag.items():
        med = statistics.median(v.values())
        where += [(e, names.task_class(c)) for e, x in v.items() if x > LAG_SPIKE[0] * med + LAG_SPIKE[1]]
    spikes = [e for e, _ in where]
    after = Counter(e - max(p for p in parks if p <= e) for e in spikes if any(p <= e for p in parks))
    # the step's real length: one epoch's end to the next one's (session 48: stamps taken
    # earlier shorten an epoch's own begin-to-end without the step getting any shorter)
    periods = [b.end_ns - a.end_ns for a, b in zip(rows, rows[1:])
               if b.epoch == a.epoch + 1 and b.begin_ns - a.end_ns <= PARK_NS]
    period = f"period {statistics.median(periods) / 1e3:.1f} us, " if periods else ""
    outl = {}
    for c, v in disp.items():
        med = statistics.median(v.values())
        n = sum(x > med + DISPATCH_OUTLIER_NS for x in v.values())
        if n:
            outl[names.task_class(c)] = n
    p90 = lens[min(len(lens) - 1, int(0.9 * len(lens)))]
    return "\n".join([
        f"{len(rows)} epochs, step {statistics.median(lens) / 1e3:.0f} us median (p90 {p90 / 1e3:.0f}), "
        f"{period}{len(parks)} parks (> {PARK_NS / 1e6:.0f} ms)",
        f"  notification-lag spikes: {len(spikes)}" + (" -- after a park: " + ", ".join(
            f"+{k} x{n}" for k, n in sorted(after.items())) if after else ""),
        *(["  spiking (class epoch): " + ", ".join(f"{c} {e}" for e, c in sorted(where)[:SPIKES_LISTED])
           + (f", ... {len(where) - SPIKES_LISTED} more" if len(where) > SPIKES_LISTED else "")] if where else []),
        "  dispatch-wait outlier epochs: " + (", ".join(f"{c} {n}" for c, n in outl.items()) or "none")])


def _range(text: str):
    a, _, b = text.partition("-")
    if not a.isdigit() or (b and not b.isdigit()):
        raise ValueError(f"--steps: expected A-B or A (epochs), got {text!r}")
    return int(a), int(b or a)


def _rank(argv) -> int:
    """--rank R of the command line (0 without it); a ValueError names a bad one."""
    if "--rank" not in argv:
        return 0
    i = argv.index("--rank")
    try:
        return int(argv[i + 1])
    except (IndexError, ValueError):
        raise ValueError(f"--rank: expected a rank number, got {argv[i + 1] if i + 1 < len(argv) else 'nothing'}") \
            from None


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    if argv[0] == "--shape":
        try:
            rank = _rank(argv)
        except ValueError as e:
            print(f"replay: {e}", file=sys.stderr)
            return 2
        files = [a for i, a in enumerate(argv[1:], 1) if a != "--rank" and argv[i - 1] != "--rank"]
        if not files:
            print("replay: --shape: name one or more dumps", file=sys.stderr)
            return 2
        for f in files:
            try:
                print(f"{f}: " + shape(load(f)["summaries"], rank))
            except (OSError, ValueError) as e:
                print(f"replay: {f}: {e}", file=sys.stderr)
                return 2
        return 0
    if "--steps" in argv:
        d = load(argv[0])
        i = argv.index("--steps")
        try:
            lo, hi = _range(argv[i + 1] if i + 1 < len(argv) else "")
            print(step_table(d["summaries"], lo, hi, _rank(argv)))
        except ValueError as e:
            print(f"replay: {e}", file=sys.stderr)
            return 2
        return 0
    res = replay(argv[0])
    if "--json" in argv:
        print(json.dumps(res, indent=1, default=str))
        return 0
    from ..launch.launcher import summary_lines        # the text `dtrace-mk launch` prints
    print("\n".join(summary_lines(res)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
