"""End to end under real mpiexec: every public scenario on the sim backend with 2 and 4
ranks (one MPI process per rank plus the collector, MPMD) scores full recall and no
false-confident finding.  Scenarios of one rank count share one mpiexec launch
(`diagnose.run_job`) to keep the suite short."""
import json
import sys
from pathlib import Path

import pytest

from dtrace_mk.collectors.scenario import load_scenario
from dtrace_mk.collectors.score import score, validate_result
from dtrace_mk.commands import diagnose as D

pytestmark = pytest.mark.mpi

SCENARIO_DIR = Path(__file__).resolve().parents[1] / "scenarios"
FILES = sorted(p for p in SCENARIO_DIR.iterdir() if p.suffix in (".yaml", ".yml", ".json"))


def _mpiexec_or_skip():
    try:
        D.find_mpiexec()
    except Exception as e:           # no MPI installed: these tests cannot run here
        pytest.skip(str(e))


def _brief(res):
    return [(f["cause"], f["rank"], f.get("task_class") or f.get("comm_op"), f["steps"],
             f["confidence"]) for f in res["findings"]]


_CACHE = {}


def _results(ranks):
    """Every scenario that fits `ranks`, diagnosed in one launch (cached per session)."""
    if ranks not in _CACHE:
        _mpiexec_or_skip()
        runs = [p for p in FILES
                if max((f.rank for f in load_scenario(p).faults), default=0) < ranks]
        out = D.run_job([(p, ranks) for p in runs], "sim", 600.0,
                        lambda s: print(s, file=sys.stderr), quiet=True)
        _CACHE[ranks] = dict(zip(runs, out))
    return _CACHE[ranks]


def _params():
    for ranks in (2, 4):
        for p in FILES:
            need = max((f.rank for f in load_scenario(p).faults), default=0) + 1
            if ranks >= need:
                yield pytest.param(p, ranks, id=f"{p.stem}-{ranks}")


@pytest.mark.parametrize("path, ranks", list(_params()))
def test_scenario_scores(path, ranks):
    res = _results(ranks)[path]
    assert res is not None, f"no result for {path.name} at {ranks} ranks"
    validate_result(res)
    sc = load_scenario(path)
    rep = score(res, sc)
    assert not res["missing_ranks"], res["missing_ranks"]
    assert rep.recall == 1.0, (rep.render(), _brief(res))
    assert rep.false_confident == [], (rep.render(), _brief(res))
    assert res["verdict"] == ("fault" if sc.faults else "none"), _brief(res)
    assert res["telemetry_bytes"] > 0
    assert res["coverage"]["eligible"] == (res["coverage"]["executed"] + res["coverage"]["throttled"]
                                           + res["coverage"]["lost"])


def test_a_rank_that_dies_mid_run_yields_a_partial_result_naming_it():
    _mpiexec_or_skip()
    path = SCENARIO_DIR / "slow_task_class_r1.yaml"
    (res,) = D.run_job([(path, 2)], "sim", 120.0, lambda s: None, quiet=True,
                       kill={"rank": 1, "step": 4})
    assert res is not None
    validate_result(res)
    assert res["partial"] is True
    assert 1 in res["missing_ranks"] or "1" in res["incomplete_ranks"]
    assert res["transport"]["from_spool"] is True
    # what rank 1 sent before it died is still used
    assert res["coverage"]["eligible"] > 0


def test_the_command_writes_the_result_and_score_reads_it(tmp_path, capsys):
    _mpiexec_or_skip()
    from dtrace_mk import cli
    path = SCENARIO_DIR / "pair_local_imbalance_r1.yaml"
    out = tmp_path / "r.json"
    assert cli.main(["diagnose", "--scenario", str(path), "--out", str(out), "--quiet"]) == 0
    text = capsys.readouterr().out
    assert "verdict fault" in text and "local_imbalance" in text and "bytes per rank per step" in text
    res = json.loads(out.read_text())
    assert set(res) >= {"scenario", "verdict", "findings", "telemetry_bytes", "coverage"}
    assert res["scenario"] == "pair_local_imbalance_r1"
    assert cli.main(["score", str(out), "--scenario", str(path)]) == 0
    assert "recall: 1.00" in capsys.readouterr().out


def test_without_mpmd_rank_0_collects_in_process(tmp_path):
    _mpiexec_or_skip()
    import subprocess
    path = SCENARIO_DIR / "pair_remote_stall_r0.yaml"
    result = tmp_path / "r.json"
    job = tmp_path / "job.json"
    job.write_text(json.dumps({"backend": "sim", "deadline_s": 120, "quiet": True,
                               "runs": [{"scenario": str(path), "ranks": 2, "result": str(result)}]}))
    subprocess.run([D.find_mpiexec(), "-n", "2", sys.executable, "-m", "dtrace_mk.commands.diagnose",
                    "--job", str(job)], check=True, timeout=120, stdin=subprocess.DEVNULL)
    res = json.loads(result.read_text())
    rep = score(res, load_scenario(path))
    assert rep.recall == 1.0 and rep.false_confident == [], rep.render()
    assert all(r["done"] for r in res["transport"]["ranks"].values())


def test_gpu_backend_without_gpus_is_a_clear_error(capsys):
    """Without enough GPUs, --backend gpu says so and points at the sim (no traceback)."""
    from dtrace_mk import cli
    assert cli.main(["diagnose", "--scenario", str(SCENARIO_DIR / "no_fault.yaml"),
                     "--backend", "gpu"]) == 2
    err = capsys.readouterr().err
    assert "--backend gpu" in err and "use --backend sim" in err


def test_mpiexec_flags_follow_the_flavour():
    mpich = D.mpiexec_command("/x/mpiexec", 3, ["--job", "j"], flavour="mpich")
    assert mpich[:3] == ["/x/mpiexec", "-n", "3"] and mpich.count(":") == 1
    i = mpich.index(":")
    assert mpich[i + 1:i + 3] == ["-n", "1"] and mpich[3:i] == mpich[i + 3:]
    ompi = D.mpiexec_command("/x/mpirun", 2, [], flavour="openmpi")
    assert "--oversubscribe" in ompi
    import os
    assert ("--allow-run-as-root" in ompi) == (os.geteuid() == 0)
