"""tools/gpu_suite.py: the GPU suite cut into M device calls covers every test exactly
once, in collection order, and refuses a bad part spec."""
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def gpu_suite(load_tool):
    return load_tool("gpu_suite")


@pytest.mark.parametrize("n_ids", [0, 1, 5, 382])
@pytest.mark.parametrize("m", [1, 2, 3, 7])
def test_parts_cover_every_test_once_in_order(gpu_suite, n_ids, m):
    ids = [f"tests/gpu/test_{i // 10}.py::t[{i}]" for i in range(n_ids)]
    parts = [ids[slice(*gpu_suite.bounds(len(ids), n, m))] for n in range(1, m + 1)]
    assert [x for p in parts for x in p] == ids
    assert max(map(len, parts)) - min(map(len, parts)) <= 1


def test_a_range_names_tests_one_based_and_inclusive(gpu_suite):
    assert gpu_suite.span(453, "218..226") == (217, 226)
    assert gpu_suite.span(453, "400..999") == (399, 453)     # past the end: to the end
    for bad, msg in [("0..5", "need 1 <= A <= B"), ("9..3", "need 1 <= A <= B"), ("500..600", "has 453 tests")]:
        with pytest.raises(ValueError, match=msg):
            gpu_suite.span(453, bad)


def test_a_bad_part_is_refused(gpu_suite):
    with pytest.raises(ValueError, match="need 1 <= N <= M"):
        gpu_suite.bounds(1, 3, 2)
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "gpu_suite.py"), "two"], capture_output=True, text=True)
    assert r.returncode == 2 and "part N of M" in r.stderr


def test_without_a_gpu_nothing_is_collected_and_the_status_says_so():
    # CI has no GPU: tests/conftest.py ignores tests/gpu, so part 1/1 collects nothing (5)
    from tests.conftest import HAVE_GPU
    if HAVE_GPU:
        pytest.skip("a GPU is present: the suite would run")
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "gpu_suite.py"), "1/1"], capture_output=True,
                       text=True, cwd=ROOT)
    assert r.returncode == 5, (r.returncode, r.stdout[-500:], r.stderr[-500:])
