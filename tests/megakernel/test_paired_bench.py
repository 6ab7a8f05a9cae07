"""CI (no GPU): bench/paired.py's arithmetic (a ratio taken on the same instance cancels
what the instance adds) and that its codes are pairable (one dynamic shared-memory layout
for 1b and tiny, so they run on one Megakernel's params)."""

import numpy as np
import pytest

from dtrace_mk.megakernel import gpu
from dtrace_mk.megakernel.presets import PRESETS


@pytest.fixture(scope="module")
def paired(load_bench):
    return load_bench("paired")


def test_paired_ratio_cancels_the_instance(paired):
    # instance "1" is 2% slower in every code; the code "x" costs 0.4% everywhere
    med = {i: {"nohooks": 1000.0 * f, "x": 1004.0 * f} for i, f in (("0", 1.0), ("1", 1.02), ("w0", 1.0))}
    s = paired.summarize(med)
    assert s["x"]["mean_pct"] == pytest.approx(0.4)
    assert s["x"]["min_pct"] == pytest.approx(0.4) and s["x"]["max_pct"] == pytest.approx(0.4)
    assert s["nohooks"]["mean_pct"] == 0.0
    # what an unpaired comparison would carry: the instances' 2%
    assert s["x"]["spread_pct"] == pytest.approx(2.0)
    assert s["x"]["us_mean"] == pytest.approx(1004.0 * 3.02 / 3)


def test_paired_ratio_per_instance(paired):
    med = {"0": {"nohooks": 100.0, "x": 101.0}, "1": {"nohooks": 200.0, "x": 199.0}}
    s = paired.summarize(med)["x"]
    assert s["paired_pct"] == {"0": pytest.approx(1.0), "1": pytest.approx(-0.5)}
    assert s["mean_pct"] == pytest.approx(0.25)


def test_rounds_alternate_order(load_bench):
    pairs = [("0", "a"), ("0", "b"), ("1", "a")]
    r = load_bench("benchio").rounds(pairs, 3)
    assert len(r) == 4                        # warm-up + 3
    assert r[0] == pairs and r[1] == pairs[::-1] and r[2] == pairs
    assert all(sorted(x) == sorted(pairs) for x in r)


@pytest.mark.parametrize("preset", ["tiny", "1b"])
def test_codes_share_one_layout(paired, preset):
    cfg = PRESETS[preset]
    lay = {c: gpu.smem_layout(cfg, 1, 1, gpu.megakernel_defines(cfg, 1, d)) for c, d in paired.CODES.items()}
    assert len(set(lay.values())) == 1, lay
    assert paired.BASE in paired.CODES and paired.CODES[paired.BASE] == ("DTMK_NO_HOOKS",)


def test_handoff_bench_ratios_are_taken_per_instance(load_bench):
    hb = load_bench("handoff")
    row = {v: 100.0 for v in hb.ROWS}
    med = {"0": dict(row, lean=101.0), "1": {v: 2 * x for v, x in dict(row, lean=103.0).items()}}
    r = hb.paired_ratios(med)
    assert r["lean/nohooks"]["mean_pct"] == pytest.approx(2.0)
    assert (r["lean/nohooks"]["min_pct"], r["lean/nohooks"]["max_pct"]) == (pytest.approx(1.0), pytest.approx(3.0))
    assert r["hook/lean"]["mean_pct"] == pytest.approx(100 * ((100 / 101 + 100 / 103) / 2 - 1))
    assert {a for a, _ in hb.RATIOS} | {b for _, b in hb.RATIOS} <= set(hb.ROWS)


def test_extra_codes_parse_with_their_launch_options(paired):
    codes, kw = paired.parse_codes("r120=DTMK_NO_HOOKS+DTMK_MAXNREG=120, nhtrace=DTMK_NO_HOOKS@trace")
    assert codes == {"r120": ("DTMK_NO_HOOKS", "DTMK_MAXNREG=120"), "nhtrace": ("DTMK_NO_HOOKS",)}
    assert kw == {"r120": {}, "nhtrace": {"trace": True}}
    for bad in ("nohooks=DTMK_NO_HOOKS", "x", "lean=DTMK_NO_HOOKS", "y=DTMK_NO_HOOKS@fast"):
        with pytest.raises(SystemExit, match="--codes"):
            paired.parse_codes(bad)


def test_spare_sm_bench_compares_one_worker_fewer(load_bench):
    """bench/spare_sm.py: the same no-hook build planned for N and N-1 workers; the graph
    of N-1 workers has the same tasks (a task computes the same on any worker)."""
    from dtrace_mk.megakernel.graph import build_graph
    load_bench("spare_sm")
    for name in ("tiny", "1b"):
        a, b = build_graph(PRESETS[name], 1, 132), build_graph(PRESETS[name], 1, 131)
        assert len(a.tasks) == len(b.tasks) and (a.num_workers, b.num_workers) == (132, 131)
        ta, tb = a.device_tables(), b.device_tables()
        for k in ta:          # every task and event table equal; only the plans differ
            if k.startswith(("task_", "event_", "moe_", "layer_")):
                assert np.array_equal(ta[k], tb[k]), (name, k)
        assert (len(ta["plan_offsets"]), len(tb["plan_offsets"])) == (133, 132)   # one plan per worker
