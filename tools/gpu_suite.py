"""Run part N of M of the GPU test suite (tests/gpu), so a suite that outgrew one device
call (the 600 s limit; 382 tests took > 280 s in session 9) runs in M calls without
hand-picking files.  Deterministic: the suite's node ids in collection order, cut into M
contiguous parts of nearly equal size (a file may straddle two parts).

    python3 tools/gpu_suite.py 1/2 [-k EXPR] [pytest args...]      (tools/gpu_session.sh: suite:1/2)
    python3 tools/gpu_suite.py 218..340 [...]    tests 218 to 340 (1-based, inclusive), to finish
                                                 a part that ran out of time where it stopped

-k defaults to the deselection every recorded full run used (docs/results/gpu_tests.md).
Exit status: pytest's (5 = nothing collected, e.g. no GPU)."""
from __future__ import annotations

import subprocess
import sys
from typing import Sequence, Tuple

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
    col = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                          "tests/gpu", "-k", k], capture_output=True, text=True)
    ids = [ln.strip() for ln in col.stdout.splitlines() if "::" in ln]
    if not ids:
        print(col.stdout[-2000:] + col.stderr[-2000:], file=sys.stderr)
        return col.returncode or 5
    if ".." in argv[0]:
        lo, hi = span(len(ids), argv[0])
        what = "range"
    else:
        n, m = (int(x) for x in argv[0].split("/"))
        lo, hi = bounds(len(ids), n, m)
        what = f"part {n}/{m}"
    print(f"gpu_suite: {what}: tests {lo + 1}..{hi} of {len(ids)}", flush=True)
    # -v: a line per test as it ends, so a part killed by its time limit still names what ran
    return subprocess.call([sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", *rest, *ids[lo:hi]])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
