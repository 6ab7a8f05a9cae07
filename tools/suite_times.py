"""pytest plugin (tools/gpu_suite.py loads it with `-p suite_times`): as each test ends,
append one line to $DTRACE_MK_SUITE_TIMES -- node id, seconds (setup + call + teardown),
outcome -- so a part killed by its time limit still leaves the times of what ran.
`tools/gpu_suite.py N/M --times FILE...` then cuts the parts by recorded time, not by count
(session 53: 171 tests took 217 s, the next 105 more than 440 s)."""
from __future__ import annotations

import os
from typing import Dict, Tuple

ENV = "DTRACE_MK_SUITE_TIMES"
_open: Dict[str, Tuple[float, str]] = {}     # node id -> (seconds so far, outcome so far)


def pytest_runtest_logreport(report) -> None:
    path = os.environ.get(ENV)
    if not path:
        return
    seconds, outcome = _open.get(report.nodeid, (0.0, "passed"))
    seconds += report.duration
    if outcome == "passed" and not report.passed:
        outcome = "error" if report.failed and report.when != "call" else report.outcome
    if report.when != "teardown":
        _open[report.nodeid] = (seconds, outcome)
        return
    _open.pop(report.nodeid, None)
    with open(path, "a") as f:        # (a line per test, written as it ends)
        f.write(f"{report.nodeid}\t{seconds:.2f}\t{outcome}\n")
