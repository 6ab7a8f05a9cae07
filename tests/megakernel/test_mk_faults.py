"""Fault specs -> table rows, parse errors, and the shared fault_pick hash."""
import json

import numpy as np
import pytest

from dtrace_mk.errors import UserError
from dtrace_mk.megakernel import faults as F
from dtrace_mk.megakernel.faults import INT64_MAX, FaultRow, FaultTable, fault_pick, splitmix64
from dtrace_mk.megakernel.graph import CLASS_IDS


def row(spec):
    (r,) = FaultTable.from_specs([spec]).rows
    return r


@pytest.mark.parametrize("spec, expect", [
    ({"kind": "slow_task_class", "task_class": "attn", "layer": 3, "extra_us": 20, "fraction": 0.5,
      "steps": [2, 3, 4, 5]},
     (1, CLASS_IDS["attn"], 3, 2, 5, 20000, 500000, 0)),
    ({"kind": "routing_skew", "expert": 3, "share": 0.8, "seed": 9},
     (2, -1, -1, 0, INT64_MAX, 3, 800000, 9)),
    ({"kind": "late_notification", "task_class": "qkv", "delay_us": 1.5},
     (3, CLASS_IDS["qkv"], -1, 0, INT64_MAX, 1500, 1000000, 0)),
    ({"kind": "queue_saturation", "worker": 7, "extra_tasks": 40, "steps": 3},
     (4, -1, -1, 3, 3, 7, 40, 0)),
    ({"kind": "starve_ready", "task_class": CLASS_IDS["mlp_down"], "delay_us": 30, "fraction": 0.25,
      "steps": "4-"},
     (5, CLASS_IDS["mlp_down"], -1, 4, INT64_MAX, 30000, 250000, 0)),
    ({"kind": "late_comm", "comm_op": "allreduce_mlp", "layer": 2, "delay_us": 50, "steps": "1-2"},
     (6, 1, 2, 1, 2, 50000, 1000000, 0)),
])
def test_spec_to_row(spec, expect):
    r = row(spec)
    assert (r.kind, r.task_class, r.layer, r.step_lo, r.step_hi, r.param_a, r.param_b, r.seed) == expect
    assert r.kind_name == spec["kind"]


def test_table_array_round_trip():
    t = FaultTable.from_specs({"faults": [
        {"kind": "slow_task_class", "task_class": "attn", "extra_us": 2},
        {"kind": "routing_skew", "expert": 1, "share": 1.0, "seed": (1 << 64) - 1}]})
    a = t.to_array()
    assert a.dtype == np.int64 and a.shape == (2, 8)
    assert a[1, 7] == -1                     # u64 seed stored with the same bits
    assert FaultTable.from_array(a).rows == t.rows
    assert FaultTable.from_specs([]).to_array().shape == (0, 8)


@pytest.mark.parametrize("specs, msg", [
    ([{"kind": "slow_task"}], 'faults[0].kind: unknown fault kind "slow_task" (known: slow_task_class,'),
    ([{"task_class": "attn"}], "faults[0].kind: missing"),
    ([{"kind": "starve_ready", "task_class": "attn", "delay_us": 1, "extra_us": 2}],
     "faults[0].extra_us: unknown parameter for starve_ready"),
    ([{"kind": "routing_skew", "expert": 1, "share": 0.5, "fraction": 0.5}],
     "faults[0].fraction: unknown parameter for routing_skew"),
    ([{"kind": "routing_skew", "expert": 1}], "faults[0].share: missing (required by routing_skew)"),
    ([{"kind": "slow_task_class", "task_class": "atn", "extra_us": 1}], 'faults[0].task_class: unknown task class "atn"'),
    ([{"kind": "slow_task_class", "task_class": 99, "extra_us": 1}], "faults[0].task_class: unknown task class id 99"),
    ([{"kind": "late_comm", "comm_op": "allgather", "delay_us": 1}], 'faults[0].comm_op: unknown comm op "allgather"'),
    ([{"kind": "slow_task_class", "task_class": "attn", "extra_us": -1}], "faults[0].extra_us: expected 0..1000000000.0, got -1"),
    ([{"kind": "slow_task_class", "task_class": "attn", "extra_us": "5"}], 'faults[0].extra_us: expected a number, got "5"'),
    ([{"kind": "starve_ready", "task_class": "attn", "delay_us": 1, "fraction": 1.5}], "faults[0].fraction: expected 0.0..1.0, got 1.5"),
    ([{"kind": "queue_saturation", "worker": 1.5, "extra_tasks": 3}], "faults[0].worker: expected an integer, got 1.5"),
    ([{"kind": "queue_saturation", "worker": 1, "extra_tasks": 3, "steps": "5-2"}], "faults[0].steps: expected 0 <= lo <= hi, got 5..2"),
    ([{"kind": "queue_saturation", "worker": 1, "extra_tasks": 3, "steps": "a-b"}], 'faults[0].steps: expected "lo-hi", got "a-b"'),
    ([{"kind": "queue_saturation", "worker": 1, "extra_tasks": 3, "steps": []}], "faults[0].steps: expected a list of steps, a step"),
    ([{"kind": "queue_saturation", "worker": 1, "extra_tasks": 3, "layer": -2}], "faults[0].layer: expected 0..65535, got -2"),
    ([{"kind": "routing_skew", "expert": 1, "share": 0.5}, "x"], 'faults[1]: expected an object with a \'kind\''),
    ({"kind": "routing_skew"}, "faults: expected a list of fault specs"),
])
def test_parse_errors_name_the_spec_and_key(specs, msg):
    with pytest.raises(UserError) as ei:
        FaultTable.from_specs(specs)
    assert msg in str(ei.value)


def test_load_yaml_and_json(tmp_path):
    y = tmp_path / "f.yaml"
    y.write_text("- {kind: slow_task_class, task_class: attn, extra_us: 20, steps: \"1-2\"}\n"
                 "- kind: queue_saturation\n  worker: 3\n  extra_tasks: 9\n")
    t = FaultTable.load(y)
    assert [r.kind_name for r in t.rows] == ["slow_task_class", "queue_saturation"]
    j = tmp_path / "f.json"
    j.write_text('[{"kind": "routing_skew", "expert": 2, "share": 0.5}]')
    assert FaultTable.load(j).rows[0].param_b == 500000
    bad = tmp_path / "bad.json"
    bad.write_text('[{"kind": "routing_skew",\n "expert": }]')
    with pytest.raises(UserError, match=r"bad.json:2:12: not valid JSON"):
        FaultTable.load(bad)
    bad2 = tmp_path / "bad.yaml"
    bad2.write_text("- {kind: late_comm, comm_op: allreduce_attn, delay_us: 5, peer: 1}\n")
    with pytest.raises(UserError, match=r"bad.yaml\[0\].peer: unknown parameter for late_comm"):
        FaultTable.load(bad2)
    with pytest.raises(UserError, match="cannot read fault file"):
        FaultTable.load(tmp_path / "missing.json")


def test_splitmix64_reference_value():
    # first output of the reference splitmix64 generator seeded with 0
    assert splitmix64(0) == 0xE220A8397B1DCDAF


# Hard-coded so a change to fault_pick fails here (and the CUDA side checks the same file).
PINNED = [[0, 0, 0, 947055], [0, 0, 1, 732430], [0, 1, 0, 597323], [0, 2, 1, 69539]]


def test_fault_pick_pinned_vectors():
    for seed, idx, step, pick in PINNED:
        assert fault_pick(seed, idx, step) == pick


def test_fault_pick_vector_file_matches():
    d = json.loads(F.VECTORS_PATH.read_text())
    vec = d["vectors"]
    assert vec == F.fault_pick_vectors()
    assert len(vec) >= 200
    for s, i, k, p in vec:
        assert 0 <= p < 1_000_000
        assert fault_pick(s, i, k) == p
    # truncation to 32 bits of idx and step is part of the definition
    assert fault_pick(5, (1 << 32) + 7, 3) == fault_pick(5, 7, 3)
    assert fault_pick(5, 7, (1 << 32) + 3) == fault_pick(5, 7, 3)


def test_fraction_selection_is_close_to_the_fraction():
    r = row({"kind": "slow_task_class", "task_class": "attn", "extra_us": 1, "fraction": 0.3, "seed": 11})
    n = sum(r.picks(i, k) for i in range(1000) for k in range(10))
    assert 2700 < n < 3300
    full = row({"kind": "slow_task_class", "task_class": "attn", "extra_us": 1})
    assert all(full.picks(i, 0) for i in range(100))
    none = row({"kind": "slow_task_class", "task_class": "attn", "extra_us": 1, "fraction": 0})
    assert not any(none.picks(i, 0) for i in range(100))


def test_in_scope():
    r = FaultRow(1, 3, 2, 4, 6, 0, 1, 0)
    assert r.in_scope(4, 2, 3) and r.in_scope(6, 2, 3)
    assert not r.in_scope(3, 2, 3) and not r.in_scope(7, 2, 3)
    assert not r.in_scope(5, 1, 3) and not r.in_scope(5, 2, 4)
    anyr = FaultRow(1, -1, -1, 0, INT64_MAX, 0, 1, 0)
    assert anyr.in_scope(10 ** 6, 0xFFFFFFFF, 7)


def test_a_list_of_steps_becomes_one_row_per_consecutive_run():
    rows = FaultTable.from_specs([{"kind": "starve_ready", "task_class": "attn", "delay_us": 5,
                                   "steps": [7, 1, 2, 3, 9, 8]}]).rows
    assert [(r.step_lo, r.step_hi) for r in rows] == [(1, 3), (7, 9)]
    with pytest.raises(UserError, match=r"faults\[0\]\.steps: expected steps >= 0"):
        FaultTable.from_specs([{"kind": "starve_ready", "task_class": "attn", "delay_us": 5, "steps": [-1]}])
