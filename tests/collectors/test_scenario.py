import json

import pytest

from dtrace_mk.collectors.scenario import ScenarioError, load_scenario, parse_scenario

from collector_helpers import SCENARIO_DIR

GOOD = dict(name="s", ranks=2, model="tiny", steps=8, batch=4, seed=1)


def test_parse_full_example(tmp_path):
    p = tmp_path / "x.yaml"
    p.write_text("""
name: demo
ranks: 2
backend: sim
model: tiny
steps: 8
batch: 4
seed: 3
monitors: [a.d, b.d]
budget_bytes_per_step: 4096
faults:
  - {kind: late_comm, rank: 1, steps: [4, 3, 4], comm_op: allreduce_mlp, delay_us: 50}
  - {kind: slow_task_class, rank: 0, steps: [1], task_class: attn, layer: 1, extra_us: 5, fraction: 0.5}
""")
    sc = load_scenario(p)
    assert (sc.name, sc.ranks, sc.backend, sc.monitors, sc.budget_bytes_per_step) == (
        "demo", 2, "sim", ("a.d", "b.d"), 4096)
    f0, f1 = sc.faults
    assert (f0.kind, f0.rank, f0.steps, f0.comm_op, f0.cause) == ("late_comm", 1, (3, 4), "allreduce_mlp",
                                                                 "remote_stall")
    assert f1.params == {"task_class": "attn", "layer": 1, "extra_us": 5.0, "fraction": 0.5}
    assert parse_scenario(sc.to_dict()).faults == sc.faults


def test_defaults():
    sc = parse_scenario(GOOD)
    assert sc.backend == "auto" and sc.faults == () and sc.monitors == () and sc.budget_bytes_per_step is None


@pytest.mark.parametrize("fault,msg", [
    (dict(kind="late_com", rank=0, steps=[1]),
     "f.yaml: faults[0]: unknown fault kind 'late_com' (known: late_comm, slow_task_class, "
     "routing_skew, late_notification, queue_saturation, starve_ready); did you mean 'late_comm'?"),
    (dict(kind="late_comm", rank=0, steps=[1], comm_op="allreduce_attn", delay=5),
     "f.yaml: faults[0] (late_comm): unknown parameter 'delay' (known: rank, steps, comm_op, layer, "
     "delay_us); did you mean 'delay_us'?"),
    (dict(kind="late_comm", rank=0, steps=[1], delay_us=5),
     "f.yaml: faults[0] (late_comm): missing parameter 'comm_op'"),
    (dict(kind="late_comm", rank=0, steps=[1], comm_op="allgather", delay_us=5),
     "f.yaml: faults[0] (late_comm): comm_op must be a comm op (allreduce_attn, allreduce_mlp), "
     "got 'allgather'"),
    (dict(kind="starve_ready", rank=2, steps=[1], task_class="attn", delay_us=5),
     "f.yaml: faults[0] (starve_ready): rank must be an integer in 0..1, got 2"),
    (dict(kind="starve_ready", rank=0, steps=[8], task_class="attn", delay_us=5),
     "f.yaml: faults[0] (starve_ready): steps must be a non-empty list of steps in 0..7, got [8]"),
    (dict(kind="routing_skew", rank=0, steps=[1], expert=1, share=1.5),
     "f.yaml: faults[0] (routing_skew): share must be a number in (0, 1], got 1.5"),
    (dict(kind="queue_saturation", rank=0, steps=[1], worker=1, extra_tasks=0),
     "f.yaml: faults[0] (queue_saturation): extra_tasks must be an integer >= 1, got 0"),
    (dict(kind="slow_task_class", rank=0, steps=[1], task_class="attn", extra_us=True),
     "f.yaml: faults[0] (slow_task_class): extra_us must be a number > 0, got True"),
    (dict(rank=0, steps=[1]), "f.yaml: faults[0]: missing field 'kind'"),
])
def test_fault_errors_are_exact(fault, msg):
    with pytest.raises(ScenarioError) as e:
        parse_scenario(dict(GOOD, faults=[fault]), "f.yaml")
    assert str(e.value) == msg


@pytest.mark.parametrize("patch,msg", [
    (dict(rank=2), "f.yaml: unknown field 'rank' (known: name, ranks, backend, model, steps, batch, "
                   "seed, monitors, budget_bytes_per_step, faults); did you mean 'ranks'?"),
    (dict(backend="tpu"), "f.yaml: backend must be one of auto, sim, gpu, got 'tpu'"),
    (dict(ranks=0), "f.yaml: ranks must be an integer >= 1, got 0"),
    (dict(steps="8"), "f.yaml: steps must be an integer >= 1, got '8'"),
])
def test_top_level_errors_are_exact(patch, msg):
    with pytest.raises(ScenarioError) as e:
        parse_scenario(dict(GOOD, **patch), "f.yaml")
    assert str(e.value) == msg


def test_missing_field():
    d = dict(GOOD)
    del d["seed"]
    with pytest.raises(ScenarioError, match=r"^f.yaml: missing field 'seed'$"):
        parse_scenario(d, "f.yaml")


def test_file_syntax_errors_name_line(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("name: x\nranks: [1\n")
    with pytest.raises(ScenarioError, match=r"bad.yaml:3:1: invalid YAML"):
        load_scenario(p)
    j = tmp_path / "bad.json"
    j.write_text('{"name": "x",\n "ranks": }')
    with pytest.raises(ScenarioError, match=r"bad.json:2:11: invalid JSON: Expecting value"):
        load_scenario(j)
    with pytest.raises(ScenarioError, match="nope.yaml: cannot read"):
        load_scenario(tmp_path / "nope.yaml")


def test_public_files_parse():
    files = sorted(SCENARIO_DIR.glob("*.*"))
    assert len(files) >= 12
    for p in files:
        load_scenario(p)


def test_unknown_model_names_the_presets():
    with pytest.raises(ScenarioError, match=r"^f.yaml: model must be a preset name \(tiny, .*\), got 'huge'$"):
        parse_scenario(dict(GOOD, model="huge"), "f.yaml")


def test_public_faults_feed_the_device_fault_table():
    """Scenario faults convert to the megakernel's fault specs, which accept them."""
    faults_mod = pytest.importorskip("dtrace_mk.megakernel.faults")
    from dtrace_mk.collectors.scenario import FAULT_PARAMS, device_fault_specs
    for kind, params in FAULT_PARAMS.items():
        req, opt = faults_mod._KEYS[kind]
        assert set(params) <= set(req) | set(opt) | set(faults_mod._SCOPE), kind
    for p in sorted(SCENARIO_DIR.glob("*.*")):
        sc = load_scenario(p)
        for r in range(sc.ranks):
            specs = device_fault_specs(sc, r)
            table = faults_mod.FaultTable.from_specs(specs, f"{p.name} rank {r}")
            covered = {(row.kind_name, k) for row in table.rows
                       for k in range(row.step_lo, row.step_hi + 1)}
            want = {(f.kind, k) for f in sc.faults if f.rank == r for k in f.steps}
            assert covered == want, (p.name, r)


def test_device_specs_keep_step_lists_and_split_into_runs():
    from dtrace_mk.collectors.scenario import device_fault_specs
    from dtrace_mk.megakernel.faults import FaultTable
    sc = parse_scenario(dict(GOOD, faults=[dict(kind="starve_ready", rank=1, steps=[1, 2, 3, 6],
                                                task_class="attn", delay_us=5)]))
    assert device_fault_specs(sc, 0) == []
    specs = device_fault_specs(sc, 1)
    assert [d["steps"] for d in specs] == [[1, 2, 3, 6]]
    assert [(r.step_lo, r.step_hi) for r in FaultTable.from_specs(specs).rows] == [(1, 3), (6, 6)]
