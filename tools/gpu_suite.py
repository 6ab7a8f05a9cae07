"""Run part N of M of the GPU test suite (tests/gpu), so a suite that outgrew one device
call (the 600 s limit; 382 tests took > 280 s in session 9) runs in M calls without
hand-picking files.  Deterministic: the suite's node ids in collection order, cut into M
contiguous parts of nearly equal size (a file may straddle two parts).

    python3 tools/gpu_suite.py 1/2 [-k EXPR] [pytest args...]      (tools/gpu_session.sh: suite:1/2)
    python3 tools/gpu_suite.py 218..340 [...]    tests 218 to 340 (1-based, inclusive), to finish
                                                 a part that ran out of time where it stopped
    python3 tools/gpu_suite.py 2/3 --times T.tsv [T2.tsv ...] [...]
                                                 parts of nearly equal recorded time instead
                                                 of equal count (tests not in the files count
                                                 as the recorded median)
    python3 tools/gpu_suite.py 1..9999 --budget 480 [...]
                                                 no test starts after 480 s: a part that would
                                                 outrun its device call ends cleanly and prints
                                                 the range still to run (`the rest: A..B`)

-k defaults to the deselection every recorded full run used (docs/results/gpu_tests.md).
With $DTRACE_MK_SUITE_TIMES set (tools/gpu_session.sh: $LOG/suite_times.tsv, back in
logs.tgz) each test's seconds are appended there as it ends (tools/suite_times.py): the
--times files of the next session.
Exit status: pytest's (5 = nothing collected, e.g. no GPU)."""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

TOOLS = Path(__file__).resolve().parent
sys.path.insert(0, str(TOOLS))
from suite_times import DEADLINE_ENV, STOP_ENV, ENV as TIMES_ENV  # noqa: E402  (the plugin's variables, named once)

DESELECT = "not (wstream8 or wstream9 or wstream_nopre or wsnext)"


def bounds(total: int, n: int, m: int) -> Tuple[int, int]:
    """[lo, hi) of part n (1-based) of m contiguous, nearly equal parts of `total` items."""
    if not 1 <= n <= m:
        raise ValueError(f"part {n}/{m}: need 1 <= N <= M")
    return (n - 1) * total // m, n * total // m


def span(total: int, spec: str) -> Tuple[int, int]:
    """[lo, hi) of "A..B" (tests A to B, 1-based, inclusive; B past the end means the end)."""
    a, b = (int(x) for x in spec.split(".."))
    if not 1 <= a <= b:
        raise ValueError(f"range {spec}: need 1 <= A <= B")
    if a > total:
        raise ValueError(f"range {spec}: the suite has {total} tests")
    return a - 1, min(b, total)


def read_times(paths: Sequence[str]) -> Dict[str, float]:
    """node id -> seconds from suite_times.py's lines (a later line of a test wins)."""
    times: Dict[str, float] = {}
    for p in paths:
        for n, line in enumerate(Path(p).read_text().splitlines(), 1):
            fields = line.split("\t")
            try:
                times[fields[0]] = float(fields[1])
            except (IndexError, ValueError):
                raise ValueError(f"{p}:{n}: expected 'node id<TAB>seconds<TAB>outcome', got {line[:80]!r}") from None
    return times


def time_bounds(ids: Sequence[str], times: Dict[str, float], n: int, m: int) -> Tuple[int, int, float]:
    """[lo, hi) of part n of m contiguous parts of nearly equal recorded time, and that
    part's predicted seconds; a test without a time counts as the median of those known."""
    bounds(max(len(ids), 1), n, m)                       # (the same check of n and m)
    known = sorted(times[i] for i in ids if i in times)
    default = known[len(known) // 2] if known else 1.0
    w: List[float] = [times.get(i, default) for i in ids]
    total, prefix = sum(w), [0.0]
    for x in w:
        prefix.append(prefix[-1] + x)

    def cut(k: int) -> int:      # the index whose prefix is nearest k/m of the total
        goal = total * k / m
        return min(range(len(prefix)), key=lambda i: (abs(prefix[i] - goal), i))
    lo, hi = (0 if n == 1 else cut(n - 1)), (len(ids) if n == m else cut(n))
    hi = max(hi, lo)
    return lo, hi, prefix[hi] - prefix[lo]


def main(argv: Sequence[str]) -> int:
    if not argv or ("/" not in argv[0] and ".." not in argv[0]):
        print(__doc__, file=sys.stderr)
        return 2
    rest = list(argv[1:])
    k = DESELECT
    if "-k" in rest:
        i = rest.index("-k")
        k = rest[i + 1]
        del rest[i:i + 2]
    time_files: List[str] = []
    if "--times" in rest:
        i = rest.index("--times")
        j = i + 1
        while j < len(rest) and not rest[j].startswith("-"):
            j += 1
        time_files = rest[i + 1:j]
        del rest[i:j]
        if not time_files:
            print("gpu_suite: --times needs one or more files (tools/suite_times.py's)", file=sys.stderr)
            return 2
    budget = None
    if "--budget" in rest:
        i = rest.index("--budget")
        try:
            budget = float(rest[i + 1])
            if budget <= 0:
                raise ValueError
        except (IndexError, ValueError):
            print("gpu_suite: --budget needs a positive number of seconds", file=sys.stderr)
            return 2
        del rest[i:i + 2]
    try:
        times = read_times(time_files) if time_files else None      # (bad files: before the collection)
    except (OSError, ValueError) as e:
        print(f"gpu_suite: --times: {e}", file=sys.stderr)
        return 2
    col = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                          "tests/gpu", "-k", k], capture_output=True, text=True)
    ids = [ln.strip() for ln in col.stdout.splitlines() if "::" in ln]
    if not ids:
        print(col.stdout[-2000:] + col.stderr[-2000:], file=sys.stderr)
        return col.returncode or 5
    try:
        if ".." in argv[0]:
            lo, hi = span(len(ids), argv[0])
            what = "range"
        else:
            n, m = (int(x) for x in argv[0].split("/"))
            if times is not None:
                lo, hi, secs = time_bounds(ids, times, n, m)
                what = f"part {n}/{m} by recorded time (~{secs:.0f} s)"
            else:
                lo, hi = bounds(len(ids), n, m)
                what = f"part {n}/{m}"
    except ValueError as e:
        print(f"gpu_suite: {argv[0]}: {e}", file=sys.stderr)
        return 2
    print(f"gpu_suite: {what}: tests {lo + 1}..{hi} of {len(ids)}", flush=True)
    env, plugin = dict(os.environ), []
    stop = None
    if budget is not None:                         # (the deadline counts from here, after the collection)
        fd, stop = tempfile.mkstemp(prefix="gpu_suite_stop.")
        os.close(fd)
        env[DEADLINE_ENV], env[STOP_ENV] = f"{time.time() + budget:.3f}", stop
    if env.get(TIMES_ENV) or stop:                 # each test's seconds as it ends (suite_times.py)
        env["PYTHONPATH"] = str(TOOLS) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        plugin = ["-p", "suite_times"]
    # -v: a line per test as it ends, so a part killed by its time limit still names what ran
    rc = subprocess.call([sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", *plugin, *rest,
                          *ids[lo:hi]], env=env)
    return rc if stop is None else budget_outcome(rc, stop, lo, hi)


def budget_outcome(rc: int, stop: str, lo: int, hi: int) -> int:
    """After a --budget run: say which tests ran and, when the budget cut it short, the range
    still to run.  The status is pytest's, except that its 2 (interrupted: the budget's stop,
    also when the deadline passed during the last test) becomes 1 with a failure, else 0."""
    try:
        ended, bad = (int(x) for x in Path(stop).read_text().split())
    except (OSError, ValueError):
        return rc                                  # pytest ended before its session did: its own status
    finally:
        Path(stop).unlink(missing_ok=True)
    if rc == 2:
        rc = 1 if bad else 0
    if lo + ended >= hi:
        print(f"gpu_suite: tests {lo + 1}..{hi} all ran within the budget", flush=True)
    else:
        print(f"gpu_suite: the budget ran out: tests {lo + 1}..{lo + ended} ran ({bad} failed or errored); "
              f"the rest: {lo + ended + 1}..{hi}", flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
