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


@pytest.mark.parametrize("m", [1, 2, 3, 5])
def test_parts_by_time_cover_every_test_once_and_balance_the_seconds(gpu_suite, m):
    """Session 53: 171 tests took 217 s, the next 105 more than 440 s -- equal counts are not
    equal device time.  Cut by recorded seconds, the parts stay contiguous and complete, and
    no part is further from total/m than one test's time."""
    ids = [f"tests/gpu/test_{i // 10}.py::t[{i}]" for i in range(60)]
    times = {x: (20.0 if 20 <= i < 30 else 1.0) for i, x in enumerate(ids)}     # one slow file
    parts = [gpu_suite.time_bounds(ids, times, n, m) for n in range(1, m + 1)]
    assert [x for lo, hi, _ in parts for x in ids[lo:hi]] == ids
    total = sum(times.values())
    assert sum(s for _, _, s in parts) == pytest.approx(total)
    assert all(abs(s - total / m) <= 20.0 for _, _, s in parts), parts
    if m == 3:       # by count the slow file would sit in part 2 with 10 fast ones (210 s)
        assert [hi - lo for lo, hi, _ in parts] != [20, 20, 20]


def test_a_test_without_a_recorded_time_counts_as_the_median(gpu_suite):
    ids = ["a", "b", "c", "d"]
    lo, hi, secs = gpu_suite.time_bounds(ids, {"a": 1.0, "b": 3.0, "c": 100.0}, 1, 1)
    assert (lo, hi, secs) == (0, 4, 1.0 + 3.0 + 100.0 + 3.0)
    assert gpu_suite.time_bounds(ids, {}, 2, 2)[:2] == (2, 4)      # nothing known: by count


def test_times_files_are_read_and_a_bad_line_is_named(gpu_suite, tmp_path):
    f = tmp_path / "t.tsv"
    f.write_text("x::a\t1.50\tpassed\nx::b\t2\tfailed\nx::a\t4.25\tpassed\n")
    assert gpu_suite.read_times([str(f)]) == {"x::a": 4.25, "x::b": 2.0}
    f.write_text("x::a\t1.5\tpassed\nx::b seconds\n")
    with pytest.raises(ValueError, match=r"t\.tsv:2: expected 'node id<TAB>seconds<TAB>outcome'"):
        gpu_suite.read_times([str(f)])
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "gpu_suite.py"), "1/2", "--times", str(f)],
                       capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 2 and "gpu_suite: --times:" in r.stderr and "t.tsv:2" in r.stderr


def test_the_timing_plugin_writes_a_line_per_test_as_it_ends(tmp_path):
    """tools/suite_times.py: node id, seconds of setup + call + teardown, and the outcome
    (a failing call, a skip, an error in setup) -- appended per test, so a killed part keeps them."""
    (tmp_path / "test_x.py").write_text(
        "import time, pytest\n"
        "@pytest.fixture\n"
        "def slow():\n    time.sleep(0.2)\n    yield\n    time.sleep(0.1)\n"
        "@pytest.fixture\n"
        "def broken():\n    raise RuntimeError('setup')\n"
        "def test_ok(slow): pass\n"
        "def test_bad(): assert False\n"
        "def test_skip(): pytest.skip('no')\n"
        "def test_err(broken): pass\n")
    out = tmp_path / "times.tsv"
    env = dict(__import__("os").environ, DTRACE_MK_SUITE_TIMES=str(out), PYTHONPATH=str(ROOT / "tools"))
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "suite_times", "-p", "no:cacheprovider",
                    "test_x.py"], cwd=tmp_path, env=env, capture_output=True, text=True)
    rows = {ln.split("\t")[0]: ln.split("\t")[1:] for ln in out.read_text().splitlines()}
    assert {k: v[1] for k, v in rows.items()} == {"test_x.py::test_ok": "passed", "test_x.py::test_bad": "failed",
                                                  "test_x.py::test_skip": "skipped", "test_x.py::test_err": "error"}
    assert 0.3 <= float(rows["test_x.py::test_ok"][0]) < 5.0


def _run_with_deadline(tmp_path, deadline):
    (tmp_path / "test_y.py").write_text(
        "def test_a(): pass\n"
        "def test_b(): assert False\n"
        "def test_c(): pass\n"
        "def test_d(): pass\n")
    stop = tmp_path / "stop"
    env = dict(__import__("os").environ, PYTHONPATH=str(ROOT / "tools"), DTRACE_MK_SUITE_DEADLINE=f"{deadline}",
               DTRACE_MK_SUITE_STOP=str(stop))
    env.pop("DTRACE_MK_SUITE_TIMES", None)
    r = subprocess.run([sys.executable, "-m", "pytest", "-v", "-p", "suite_times", "-p", "no:cacheprovider",
                        "test_y.py"], cwd=tmp_path, env=env, capture_output=True, text=True)
    return r, stop.read_text()


def test_past_the_budget_no_further_test_starts_and_the_count_is_left(tmp_path):
    """--budget's plugin half: a deadline already past lets the running test end and starts no
    other (pytest: interrupted, 2); the stop file holds the tests ended and the failed ones."""
    import time
    r, stop = _run_with_deadline(tmp_path, time.time() - 1)
    assert r.returncode == 2, r.stdout[-800:]
    assert "test_a PASSED" in r.stdout and "test_b" not in r.stdout
    assert stop == "1\t0\n"
    r, stop = _run_with_deadline(tmp_path, time.time() + 3600)     # far: all four, one failed
    assert r.returncode == 1 and stop == "4\t1\n", r.stdout[-800:]


@pytest.mark.parametrize("ended, bad, rc, want_rc, said", [
    (3, 0, 2, 0, "the budget ran out: tests 11..13 ran (0 failed or errored); the rest: 14..20"),
    (3, 1, 2, 1, "the budget ran out: tests 11..13 ran (1 failed or errored); the rest: 14..20"),
    (10, 0, 0, 0, "tests 11..20 all ran within the budget"),
    (10, 2, 1, 1, "tests 11..20 all ran within the budget"),
    (10, 0, 2, 0, "tests 11..20 all ran within the budget"),     # the deadline passed during the last test
])
def test_a_run_cut_by_its_budget_names_the_range_still_to_run(gpu_suite, tmp_path, capsys, ended, bad, rc,
                                                              want_rc, said):
    stop = tmp_path / "stop"
    stop.write_text(f"{ended}\t{bad}\n")
    assert gpu_suite.budget_outcome(rc, str(stop), 10, 20) == want_rc
    assert said in capsys.readouterr().out
    assert not stop.exists()
    assert gpu_suite.budget_outcome(4, str(stop), 10, 20) == 4     # no stop file (pytest died early): its status


def test_a_bad_budget_is_refused():
    for bad in (["--budget"], ["--budget", "soon"], ["--budget", "0"]):
        r = subprocess.run([sys.executable, str(ROOT / "tools" / "gpu_suite.py"), "1/1", *bad],
                           capture_output=True, text=True, cwd=ROOT)
        assert r.returncode == 2 and "--budget needs a positive number of seconds" in r.stderr, bad
