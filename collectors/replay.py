"""Replay the collector's diagnosis from a dump (collectors.diagnose.DUMP_ENV).

    DTRACE_MK_COLLECTOR_DUMP=/tmp/in.pkl dtrace-mk demo ...     # the job writes the dump
    python -m dtrace_mk.collectors.replay /tmp/in.pkl [--json]               # diagnose() again, offline
    python -m dtrace_mk.collectors.replay /tmp/in.pkl --steps 20-40 [--rank R]   # the epochs, step by step

Prints the verdict and findings (or the whole result as JSON): a wrong diagnosis seen on
the GPU machine can be studied on any machine, and a fix checked on the same input.
--steps prints one line per epoch of a rank instead: the gap since the previous epoch's
end (the kernel parked or idle), its length, and per task class the summed notification
lag and dependency wait (us) -- how session 46 found its late_notification artefact two
steps after each summary window's park."""
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


def _range(text: str):
    a, _, b = text.partition("-")
    if not a.isdigit() or (b and not b.isdigit()):
        raise ValueError(f"--steps: expected A-B or A (epochs), got {text!r}")
    return int(a), int(b or a)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    if "--steps" in argv:
        d = load(argv[0])
        i = argv.index("--steps")
        try:
            lo, hi = _range(argv[i + 1] if i + 1 < len(argv) else "")
            rank = int(argv[argv.index("--rank") + 1]) if "--rank" in argv else 0
            print(step_table(d["summaries"], lo, hi, rank))
        except (ValueError, IndexError) as e:
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
