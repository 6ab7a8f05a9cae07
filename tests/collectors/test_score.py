import json

import pytest

from dtrace_mk.cli import main
from dtrace_mk.collectors.score import ResultError, score, validate_result

from collector_helpers import SCENARIO_DIR, scenario

COV = {"eligible": 10, "executed": 10, "throttled": 0, "lost": 0}

SC = scenario(name="sc", ranks=4, faults=[
    dict(kind="late_comm", rank=1, steps=[3, 4], comm_op="allreduce_attn", delay_us=100),
    dict(kind="starve_ready", rank=0, steps=[5], task_class="attn", delay_us=100),
    dict(kind="routing_skew", rank=2, steps=[6], expert=1, share=0.5)])


def F(cause, rank, steps, conf=0.9, **kw):
    return dict(cause=cause, rank=rank, observed_on=[0], steps=steps, confidence=conf,
                impact_us=10.0, coverage=COV, **kw)


def R(*findings):
    return {"scenario": "sc", "verdict": "fault" if findings else "none", "findings": list(findings),
            "telemetry_bytes": 0, "coverage": COV}


def test_all_matched():
    rep = score(R(F("remote_stall", 1, [4], comm_op="allreduce_attn"),
                  F("local_imbalance", 0, [5], task_class="attn"),
                  F("routing_skew", 2, [6], expert=1)), SC)
    assert (rep.precision, rep.recall, rep.false_confident) == (1.0, 1.0, [])


@pytest.mark.parametrize("bad", [
    F("remote_stall", 0, [4], comm_op="allreduce_attn"),        # wrong rank (the waiter)
    F("remote_stall", 1, [4], comm_op="allreduce_mlp"),         # wrong op
    F("remote_stall", 1, [5], comm_op="allreduce_attn"),        # no step overlap
    F("local_imbalance", 1, [3], task_class="attn"),            # wrong cause
    F("local_imbalance", 0, [5], task_class="qkv"),             # wrong class
    F("remote_stall", 1, [4]),                                  # op missing though the fault names one
])
def test_mismatches(bad):
    rep = score(R(bad, F("routing_skew", 2, [6])), SC)
    assert rep.precision == 0.5 and rep.recall == pytest.approx(1 / 3)
    assert rep.false_confident == [0]


def test_low_confidence_unmatched_is_not_false_confident():
    rep = score(R(F("slow_task_class", 3, [1], conf=0.79, task_class="qkv")), SC)
    assert rep.false_confident == [] and rep.precision == 0.0 and rep.recall == 0.0


def test_empty_cases():
    assert (score(R(), scenario()).precision, score(R(), scenario()).recall) == (1.0, 1.0)
    rep = score(R(F("slow_task_class", 0, [1], task_class="attn")), scenario())
    assert (rep.precision, rep.recall, rep.false_confident) == (0.0, 1.0, [0])


def test_render():
    rep = score(R(F("remote_stall", 1, [4], comm_op="allreduce_attn"),
                  F("queue_saturation", 3, [1], conf=0.95)), SC)
    assert rep.render() == "\n".join([
        "scenario: sc",
        "precision: 0.50 (1/2 findings match a fault)",
        "recall: 0.33 (1/3 faults found)",
        "false-confident: 1 (confidence >= 0.8 matching no fault)",
        "  missed faults[1]: starve_ready -> local_imbalance rank 0 attn steps [5]",
        "  missed faults[2]: routing_skew -> routing_skew rank 2 steps [6]",
        "  false-confident findings[1]: queue_saturation rank 3 steps [1] confidence 0.95"])


def test_validate_result_names_the_key():
    with pytest.raises(ResultError, match=r"^r.json: missing key 'coverage'$"):
        validate_result({k: v for k, v in R().items() if k != "coverage"}, "r.json")
    bad = R(F("remote_stall", 1, [4]))
    bad["findings"][0]["cause"] = "gremlins"
    with pytest.raises(ResultError, match=r"r.json: findings\[0\]: unknown cause 'gremlins'"):
        validate_result(bad, "r.json")


def test_cli_score(tmp_path, capsys):
    res = tmp_path / "r.json"
    res.write_text(json.dumps(R(F("local_imbalance", 1, [3], task_class="attn"))))
    rc = main(["score", str(res), "--scenario", str(SCENARIO_DIR / "pair_local_imbalance_r1.yaml")])
    out = capsys.readouterr().out
    assert rc == 0
    assert "precision: 1.00 (1/1 findings match a fault)" in out and "recall: 1.00" in out
    rc = main(["score", str(res), "--scenario", str(SCENARIO_DIR / "no_fault.yaml"), "--json"])
    d = json.loads(capsys.readouterr().out)
    assert rc == 0 and d["false_confident"] == [0] and d["precision"] == 0.0


def test_cli_score_bad_input(tmp_path, capsys):
    res = tmp_path / "r.json"
    res.write_text("{")
    rc = main(["score", str(res), "--scenario", str(SCENARIO_DIR / "no_fault.yaml")])
    assert rc == 2 and "r.json:1:2: invalid JSON" in capsys.readouterr().err
