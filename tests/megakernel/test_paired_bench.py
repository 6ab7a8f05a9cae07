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


def _fake_smi(tmp_path, lines_py: str):
    """An nvidia-smi on PATH that prints lines_py's samples (a Python expression of the
    time t) every 20 ms, stamped like the real one."""
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/usr/bin/env python3\nimport datetime, time\n"
                   "while True:\n"
                   "    t = time.time()\n"
                   "    ts = datetime.datetime.fromtimestamp(t).strftime('%Y/%m/%d %H:%M:%S.%f')[:-3]\n"
                   f"    print(ts + ', ' + ({lines_py}), flush=True)\n"
                   "    time.sleep(0.02)\n")
    smi.chmod(0o755)
    return smi


def test_sample_clocks_attributes_samples_to_the_key_that_ran(load_bench, tmp_path, monkeypatch):
    """bench/obs_split.py --clocks: a sample belongs to the key whose run window holds its
    own timestamp -- here the fake card's clock depends on which key runs."""
    import time
    bio = load_bench("benchio")
    flag = tmp_path / "running"
    _fake_smi(tmp_path, f"('1755, 3201, 300.0, 0x4' if open({str(flag)!r}).read() == 'b' "
                        f"else '1980, 3201, 160.5, 0x0')")
    flag.write_text("a")
    monkeypatch.setenv("PATH", f"{tmp_path}:{__import__('os').environ['PATH']}")

    def launch(k):
        flag.write_text(k)
        time.sleep(0.01)
    out = bio.sample_clocks(["a", "b"], launch, 0.4, log=lambda s: None)
    assert out["a"]["sm_mhz"] == 1980 and out["a"]["power_w"] == 160.5 and out["a"]["reasons"] == ["0x0"]
    # (the fake reads the flag when it prints: b's first samples may still carry a's value)
    assert out["b"]["sm_mhz_min"] == 1755 and out["b"]["reasons"][-1] == "0x4"
    assert out["a"]["samples"] >= 5 and out["b"]["samples"] >= 5


def test_sample_clocks_without_nvidia_smi_returns_nothing(load_bench, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))          # (no nvidia-smi there)
    said = []
    assert load_bench("benchio").sample_clocks(["a"], lambda k: None, 0.05, log=said.append) == {}
    assert said == ["sample_clocks: no nvidia-smi"]


def _place_parser(bio):
    import argparse
    ap = argparse.ArgumentParser(prog="bench")
    bio.add_place_args(ap)
    return ap


@pytest.mark.parametrize("argv, sms, err", [
    (["--observer-smids", "0,1"], 2, "--observer-smids needs --place and 2 distinct ids"),
    (["--place", "--observer-smids", "0,1,1"], 3, "--observer-smids needs --place and 3 distinct ids"),
    (["--place", "--observer-smids", "0,x"], 2, "--observer-smids: not a comma list of SM ids: '0,x'"),
    (["--place", "--idle-smids", "4,5"], 2, "--idle-smids needs --observer-smids"),
    (["--place", "--observer-smids", "0,1", "--idle-smids", "1,5"], 2, "--idle-smids needs --observer-smids and distinct"),
])
def test_place_args_name_the_option_at_fault(load_bench, capsys, argv, sms, err):
    """bench/obs_split.py and bench/level_profile.py share these options and checks."""
    bio = load_bench("benchio")
    ap = _place_parser(bio)
    with pytest.raises(SystemExit):
        bio.place_args(ap, ap.parse_args(argv), sms)
    assert err in capsys.readouterr().err


def test_place_by_smid_puts_observers_then_idle_sms_last(load_bench, monkeypatch):
    """The observers' SMs, then the idle ones, end the order (where the grid's observer and
    idle CTAs run); a build without observer SMs moves them only when SMs idle."""
    from dtrace_mk.megakernel import gpu
    bio = load_bench("benchio")
    ap = _place_parser(bio)
    obs, idle = bio.place_args(ap, ap.parse_args(["--place", "--observer-smids", "0,1", "--idle-smids", "4"]), 2)
    assert (obs, idle) == ([0, 1], [4])
    monkeypatch.setattr(gpu, "probe_smids", lambda grid, smem: [5, 3, 1, 0, 2, 4])   # (block order)

    class M:
        grid, smem = 6, 0

        def place_workers(self, order):
            self.order = order
    m = M()
    assert bio.place_by_smid(m, obs, idle) == [2, 3, 5, 0, 1, 4] == m.order
    assert bio.place_by_smid(m, obs, idle, worker_order="natural") == [5, 3, 2, 0, 1, 4]
    assert bio.place_by_smid(m, obs, (), observers=False) == [0, 1, 2, 3, 4, 5]
    assert bio.place_by_smid(m, obs, idle, observers=False) == [2, 3, 5, 0, 1, 4]
    with pytest.raises(SystemExit, match=r"distinct SMs of the grid's 0\.\.5, got \[0, 9\]"):
        bio.place_by_smid(m, [0, 9])
    assert bio.pin_defines(()) == ("DTMK_SM_WORKER",)
    assert bio.pin_defines([4]) == ("DTMK_SM_WORKER", "DTMK_SM_IDLE")
