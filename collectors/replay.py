"""Replay the collector's diagnosis from a dump (collectors.diagnose.DUMP_ENV).

    DTRACE_MK_COLLECTOR_DUMP=/tmp/in.pkl dtrace-mk demo ...     # the job writes the dump
    python -m dtrace_mk.collectors.replay /tmp/in.pkl [--json]               # diagnose() again, offline

Prints the verdict and findings (or the whole result as JSON): a wrong diagnosis seen on
the GPU machine can be studied on any machine, and a fix checked on the same input."""
from __future__ import annotations

import json
import pickle
import sys

from .diagnose import diagnose


def replay(path: str) -> dict:
    with open(path, "rb") as f:
        d = pickle.load(f)
    return diagnose(d["summaries"], d["waits"], d["signals"], d["clock_samples"], d["scenario"],
                    pingpongs=d["pingpongs"], lost_ranks=d["lost_ranks"], **d["kw"])


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    res = replay(argv[0])
    if "--json" in argv:
        print(json.dumps(res, indent=1, default=str))
        return 0
    from ..launch.launcher import summary_lines        # the text `dtrace-mk launch` prints
    print("\n".join(summary_lines(res)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
