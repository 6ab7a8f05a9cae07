"""pytest plugin (tools/gpu_suite.py loads it with `-p suite_times`): as each test ends,
append one line to $DTRACE_MK_SUITE_TIMES -- node id, seconds (setup + call + teardown),
outcome -- so a part killed by its time limit still leaves the times of what ran.
`tools/gpu_suite.py N/M --times FILE...` then cuts the parts by recorded time, not by count
(session 53: 171 tests took 217 s, the next 105 more than 440 s).

With $DTRACE_MK_SUITE_DEADLINE (a Unix time; tools/gpu_suite.py --budget) no test starts
after it: the run stops once the test running then ends, and $DTRACE_MK_SUITE_STOP gets
"tests ended<TAB>of them failed or errored" -- a part cut short by its device call's limit
ends cleanly and says where to go on, instead of being killed mid-test."""
from __future__ import annotations

import os
import time
from typing import Dict, List, Tuple

ENV = "DTRACE_MK_SUITE_TIMES"
DEADLINE_ENV, STOP_ENV = "DTRACE_MK_SUITE_DEADLINE", "DTRACE_MK_SUITE_STOP"
_open: Dict[str, Tuple[float, str]] = {}     # node id -> (seconds so far, outcome so far)
_ended: List[str] = []                        # each ended test's outcome, in order
_session: list = []                           # the pytest session (to stop it)


def pytest_sessionstart(session) -> None:
    _session[:] = [session]


def _ended_test(outcome: str) -> None:
    """Count an ended test; past the deadline, stop before the next one starts."""
    _ended.append(outcome)
    deadline = os.environ.get(DEADLINE_ENV)
    if deadline and time.time() >= float(deadline) and _session:
        _session[0].shouldstop = f"the time budget ran out ({DEADLINE_ENV}) after {len(_ended)} tests"


def pytest_sessionfinish(session) -> None:
    path = os.environ.get(STOP_ENV)
    if path:
        bad = sum(o in ("failed", "error") for o in _ended)
        with open(path, "w") as f:
            f.write(f"{len(_ended)}\t{bad}\n")


def pytest_runtest_logreport(report) -> None:
    path = os.environ.get(ENV)
    seconds, outcome = _open.get(report.nodeid, (0.0, "passed"))
    seconds += report.duration
    if outcome == "passed" and not report.passed:
        outcome = "error" if report.failed and report.when != "call" else report.outcome
    if report.when != "teardown":
        _open[report.nodeid] = (seconds, outcome)
        return
    _open.pop(report.nodeid, None)
    if path:
        with open(path, "a") as f:    # (a line per test, written as it ends)
            f.write(f"{report.nodeid}\t{seconds:.2f}\t{outcome}\n")
    _ended_test(outcome)
