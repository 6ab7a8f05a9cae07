"""The cost table (dtrace_mk/megakernel/cost.py): which entry a graph's lowering gets, why
re-measuring it moves no task between workers, and bench/megakernel.py's update of it
from a device run."""
import dataclasses
import json
import random

import pytest

from dtrace_mk.errors import UserError
from dtrace_mk.megakernel import cost
from dtrace_mk.megakernel.cost import ClassCost, CostTable, lowered_costs, lowering_name
from dtrace_mk.megakernel.graph import CLASS_IDS, NONE_U32, EventDef, Task, _plan, build_graph
from dtrace_mk.megakernel.presets import PRESETS
from dtrace_mk.megakernel.sim import Sim

FUSED = lowering_name(PRESETS["1b"])
STANDARD_1B = dataclasses.replace(PRESETS["1b"], fuse_norm=False, split_k=1, rope_in_attn=False)


def _table(**presets):
    return CostTable({"source": "measured", "presets": presets}, "<test>")


ONE_B = {"classes": {"qkv": {"fixed_ns": 1000.0, "per_row_ns": 10.0}}, "notify_ns": 900,
         "lowerings": {FUSED: {"classes": {"qkv": {"fixed_ns": 7777.0, "per_row_ns": 77.0}},
                               "notify_ns": 1234}}}


def test_a_graph_gets_its_lowerings_entry_and_the_standard_one_otherwise():
    assert FUSED != "standard" and lowering_name(STANDARD_1B) == "standard"
    t = _table(**{"1b": ONE_B})
    fused = t.for_model(PRESETS["1b"])
    assert (fused.lowering, fused.classes["qkv"].fixed_ns, fused.notify_ns) == (FUSED, 7777.0, 1234)
    assert lowered_costs(fused, PRESETS["1b"]) is fused          # measured as built: no rule applied
    std = t.for_model(STANDARD_1B)
    assert (std.lowering, std.classes["qkv"].fixed_ns, std.notify_ns) == ("standard", 1000.0, 900)
    # a lowering without its own entry: the standard one, mapped by lowered_costs' rule
    no_low = _table(**{"1b": {k: v for k, v in ONE_B.items() if k != "lowerings"}}).for_model(PRESETS["1b"])
    mapped = lowered_costs(no_low, PRESETS["1b"])
    assert no_low.lowering == "standard" and mapped.lowering == FUSED
    assert mapped.classes["qkv"].fixed_ns != 1000.0
    # classes an entry leaves out keep the estimate
    assert fused.classes["attn_o"] == cost.estimate_costs(PRESETS["1b"]).classes["attn_o"]


@pytest.mark.parametrize("entry, message", [
    ({"lowerings": []}, "<test>: presets.1b.lowerings: expected an object"),
    ({"lowerings": {FUSED: 3}}, f"<test>: presets.1b.lowerings.{FUSED}: expected an object"),
    ({"lowerings": {FUSED: {"classes": {"bogus": {"fixed_ns": 1}}}}},
     f"<test>: presets.1b.lowerings.{FUSED}.classes.bogus: unknown task class"),
    ({"lowerings": {FUSED: {"classes": {"qkv": {"per_row_ns": 1}}}}},
     f"<test>: presets.1b.lowerings.{FUSED}.classes.qkv: expected {{\"fixed_ns\": number"),
])
def test_a_bad_lowering_entry_is_refused_with_its_place(entry, message):
    with pytest.raises(UserError) as e:
        _table(**{"1b": entry}).for_model(PRESETS["1b"])
    assert str(e.value).startswith(message)


def _skewed(costs, rng):
    """`costs` with every class's fixed and per-row parts scaled by random factors in 0.1..10."""
    return dataclasses.replace(costs, classes={
        k: ClassCost(v.fixed_ns * rng.uniform(0.1, 10), v.per_row_ns * rng.uniform(0.1, 10))
        for k, v in costs.classes.items()})


@pytest.mark.parametrize("name, workers, batch, ranks", [
    ("tiny", 16, 1, 1), ("tiny", 7, 4, 1), ("small-moe", 16, 4, 1), ("1b", 132, 1, 1), ("wide-tp", 16, 1, 2)])
def test_plans_do_not_depend_on_the_class_costs(name, workers, batch, ranks):
    """Why re-measuring the cost table moves no task on the GPU (cost.py's module doc): the
    planner's list scheduling hands out a level of one class in an order the graph's shape
    sets.  A lowering that mixes classes on one event would break this -- then a new table
    is a change of the GPU's worker plans, to be measured as such."""
    cfg = PRESETS[name]
    plans = build_graph(cfg, batch, workers, ranks=ranks).worker_plans
    rng = random.Random(7)
    base = cost.model_costs(cfg, ranks=ranks)
    for _ in range(3):
        skewed = _skewed(base, rng)
        assert build_graph(cfg, batch, workers, ranks=ranks, costs=skewed).worker_plans == plans


def test_plans_follow_the_costs_when_one_event_has_two_classes():
    """The property above is the graphs', not the planner's: two classes on one event and
    the costs decide which worker takes the third task."""
    cfg = PRESETS["tiny"]
    ev = [EventDef(0, "in", "rmsnorm", 1), EventDef(1, "out", "qkv", 3)]
    qkv, attn = CLASS_IDS["qkv"], CLASS_IDS["attn"]

    def task(i, cls):
        return Task(i, cls, 0, NONE_U32, (i, 0, 0, 0), 0, 1, 0, 1, 1)

    tasks = [task(0, qkv), task(1, attn), task(2, qkv)]
    base = cost.model_costs(cfg)

    def plans(qkv_ns, attn_ns):
        c = dict(base.classes, qkv=ClassCost(qkv_ns, 0.0), attn=ClassCost(attn_ns, 0.0))
        return _plan(tasks, ev, [], cfg, 1, 2, dataclasses.replace(base, classes=c))

    assert plans(1000.0, 5000.0) == [[0, 2], [1]]     # qkv ends first: its worker takes task 2
    assert plans(5000.0, 1000.0) == [[0], [1, 2]]


def _bench_json(tmp_path, costs, results=()):
    p = tmp_path / "bench.json"
    p.write_text(json.dumps({"info": {"card": "NVIDIA H200", "date": "2026-12-07 21:00 UTC"},
                             "costs": costs, "results": list(results)}))
    return p


def _measured(lowering, qkv_ns, notify=2000):
    return {"classes": {"qkv": {"fixed_ns": qkv_ns, "per_row_ns": 5.0}}, "lowering": lowering,
            "notify_ns": notify, "dispatch_ns": 100, "step_overhead_ns": 3000}


def test_write_cost_table_keeps_the_standard_entry_and_adds_the_lowering(load_bench, tmp_path):
    mb = load_bench("megakernel")
    table = tmp_path / "cost_table.json"
    table.write_text(json.dumps({"source": "measured", "defaults": {"notify_ns": 700},
                                 "presets": {"1b": {"classes": {"qkv": {"fixed_ns": 1000.0, "per_row_ns": 1.0}},
                                                    "source": "measured"},
                                             "small-moe": {"classes": {"qkv": {"fixed_ns": 42.0}}}}}))
    bj = _bench_json(tmp_path, {"1b": _measured(FUSED, 6500.0), "tiny": _measured("standard", 2500.0, 1800)},
                     [{"preset": "1b", "batch": 1, "megakernel": {"step_ms": 1.1217}}])
    mb.write_cost_table(bj, table, "abc1234")
    d = json.loads(table.read_text())
    assert (d["card"], d["commit"], d["source"]) == ("NVIDIA H200", "abc1234", "measured")
    one_b = d["presets"]["1b"]
    assert one_b["classes"]["qkv"]["fixed_ns"] == 1000.0                 # the standard entry stays
    low = one_b["lowerings"][FUSED]
    assert low["classes"]["qkv"]["fixed_ns"] == 6500.0 and low["gpu_step_us"] == {"1": 1121.7}
    assert low["measured"] == "2026-12-07 21:00 UTC, abc1234, NVIDIA H200"
    assert d["presets"]["tiny"]["classes"]["qkv"]["fixed_ns"] == 2500.0
    assert d["presets"]["small-moe"]["classes"]["qkv"]["fixed_ns"] == 42.0   # not measured: kept
    t = CostTable.load(table)
    assert t.for_model(PRESETS["1b"]).classes["qkv"].fixed_ns == 6500.0
    assert t.for_model(STANDARD_1B).classes["qkv"].fixed_ns == 1000.0
    assert t.for_model(PRESETS["tiny"]).notify_ns == 1800
    # measuring the standard lowering again replaces the entry and keeps the lowerings
    mb.write_cost_table(_bench_json(tmp_path, {"1b": _measured("standard", 900.0)}), table, "def5678")
    one_b = json.loads(table.read_text())["presets"]["1b"]
    assert one_b["classes"]["qkv"]["fixed_ns"] == 900.0 and FUSED in one_b["lowerings"]


def test_write_cost_table_refuses_a_run_without_costs(load_bench, tmp_path):
    mb = load_bench("megakernel")
    with pytest.raises(SystemExit, match="no measured costs"):
        mb.write_cost_table(_bench_json(tmp_path, {}), tmp_path / "t.json", "x")
    assert not (tmp_path / "t.json").exists()


def test_sim_step_us_is_the_sims_mean_step(load_bench):
    mb = load_bench("megakernel")
    g = build_graph(PRESETS["tiny"], 1, 16)
    steps = Sim(g, 3).run().step_ns
    assert mb.sim_step_us(g, 3) == pytest.approx(sum(steps) / 3 / 1e3)


def test_provenance_says_what_the_sims_timing_rests_on():
    t = CostTable({"source": "measured", "card": "NVIDIA H200", "date": "2026-11-30", "commit": "0f1427e",
                   "presets": {"tiny": {"classes": {}, "measured": "2026-11-30 19:05 UTC, 0f1427e, NVIDIA H200"},
                               "small-moe": {"classes": {}},
                               "wide-tp": {"source": "estimate"},
                               "1b": {"classes": {}}}}, "<test>")
    assert t.for_model(PRESETS["tiny"]).provenance() == "measured (2026-11-30 19:05 UTC, 0f1427e, NVIDIA H200)"
    # an entry without its own stamp: the table's card, date and commit
    assert t.for_model(PRESETS["small-moe"]).provenance() == "measured (NVIDIA H200, 2026-11-30, 0f1427e)"
    # the entry's own source wins over the file's
    assert t.for_model(PRESETS["wide-tp"]).provenance() == "estimate (no GPU measurement for this model)"
    mapped = lowered_costs(t.for_model(PRESETS["1b"]), PRESETS["1b"])
    assert mapped.provenance().endswith(f"; standard lowering's costs mapped to {FUSED} by rule")
    # measured as built (a lowerings entry): nothing mapped
    as_built = lowered_costs(_table(**{"1b": ONE_B}).for_model(PRESETS["1b"]), PRESETS["1b"])
    assert as_built.mapped_from == "" and "mapped" not in as_built.provenance()


def test_run_prints_the_sims_timing_provenance(capsys):
    from dtrace_mk.cli import main
    assert main(["run", "--model", "tiny", "--steps", "2", "--backend", "sim"]) == 0
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if ln.startswith("sim timing: "))
    assert line == f"sim timing: cost table {cost.model_costs(PRESETS['tiny']).provenance()}"
    assert "NVIDIA H200" in line
