"""Every public scenario, through the synthetic model and the diagnosis, at 2 and 4 ranks
(mesh and ring topologies): full recall and no false-confident finding.  (The sim and GPU
backends replace the synthetic model in the multi-rank tests.)"""
import pytest

from dtrace_mk.collectors.scenario import load_scenario
from dtrace_mk.collectors.score import score, validate_result

from collector_helpers import SCENARIO_DIR, brief, run

FILES = sorted(p for p in SCENARIO_DIR.iterdir() if p.suffix in (".yaml", ".yml", ".json"))


def test_public_set_is_complete():
    scs = [load_scenario(p) for p in FILES]
    assert len(scs) >= 12
    assert any(not s.faults for s in scs), "a no-fault run"
    kinds = {f.kind for s in scs for f in s.faults}
    assert kinds == {"late_comm", "slow_task_class", "routing_skew", "late_notification",
                     "queue_saturation", "starve_ready"}
    assert len({s.name for s in scs}) == len(scs), "scenario names are unique"
    assert any(p.suffix == ".json" for p in FILES) and any(p.suffix == ".yaml" for p in FILES)


def _runs():
    """(scenario file, ranks, topology) for every run that can host the scenario's faults
    (a scenario naming rank 3 needs 4 ranks)."""
    for path in FILES:
        need = max((f.rank for f in load_scenario(path).faults), default=0) + 1
        for ranks in (2, 4):
            if ranks >= need:
                for topology in ("mesh", "ring"):
                    yield pytest.param(path, ranks, topology, id=f"{path.stem}-{ranks}-{topology}")


@pytest.mark.parametrize("path, ranks, topology", list(_runs()))
def test_scenario_scores(path, ranks, topology):
    sc = load_scenario(path)
    res, _ = run(sc, ranks=ranks, topology=topology)
    validate_result(res)
    rep = score(res, sc)
    assert rep.recall == 1.0, (rep.render(), brief(res))
    assert rep.false_confident == [], (rep.render(), brief(res))
    assert res["verdict"] == ("fault" if sc.faults else "none"), brief(res)


def test_pairs_same_step_time_different_cause():
    """The paired scenarios take nearly the same time but name different causes."""
    for rank in (0, 1):
        a = load_scenario(SCENARIO_DIR / f"pair_remote_stall_r{rank}.yaml")
        b = load_scenario(SCENARIO_DIR / f"pair_local_imbalance_r{rank}.yaml")
        ra, ta = run(a)
        rb, tb = run(b)
        step = a.faults[0].steps[0]
        for r in range(a.ranks):
            tia, tib = ta.step_time_ns[r][step], tb.step_time_ns[r][step]
            assert abs(tia - tib) / tia < 0.05, (r, tia, tib)
        assert [(f["cause"], f["rank"]) for f in ra["findings"]] == [("remote_stall", rank)]
        assert [(f["cause"], f["rank"]) for f in rb["findings"]] == [("local_imbalance", rank)]
