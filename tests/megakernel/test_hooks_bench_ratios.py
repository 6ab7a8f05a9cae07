"""CI (no GPU): bench/hooks.py's last table, each build's monitors over its own off with the
launches' range (own_off), and benchio.launch_ratios' pairing by round."""
import pytest


def test_launch_ratios_pair_launches_by_round(load_bench):
    lr = load_bench("benchio").launch_ratios
    # off is timed again after the rounds (bench/hooks.py's live_idle loop): only the first
    # len(summary) off launches pair with the summary's
    r = lr({"summary": [110.0, 132.0, 111.0], "off": [100.0, 110.0, 100.0, 50.0, 50.0]}, "summary", "off")
    assert r["n"] == 3
    assert r["ratios"] == pytest.approx([0.10, 0.20, 0.11])
    assert (r["median"], r["lo"], r["hi"]) == pytest.approx((0.11, 0.10, 0.20))
    assert lr({"summary": [1.0]}, "summary", "off") == {}
    assert lr({"summary": [], "off": [1.0]}, "summary", "off") == {}


def test_own_off_takes_each_build_over_its_own_off(load_bench):
    hooks = load_bench("hooks")
    times = {"nohooks": [1000.0, 1000.0], "off": [1010.0, 1010.0, 990.0, 990.0], "off2": [1010.0, 1020.1],
             "summary": [1373.6, 1383.7], "off_obssm4defer": [1030.0, 1060.0],
             "summary_obssm4defer": [1102.1, 1166.0], "summary_cm_obssm4defer": [1081.5, 1123.6],
             "summary_cmgen_obssm4defer": [1091.8, 1144.8]}
    t = hooks.own_off(times, ("obssm4defer",))
    d, b = t["default"], t["obssm4defer"]
    assert d["off"]["median"] == pytest.approx(0.01)                      # over nohooks
    assert d["summary"]["ratios"] == pytest.approx([0.36, 0.37])          # over the default's off
    assert "summary_cm" not in d                                          # not run: left out, not zero
    assert b["off"]["ratios"] == pytest.approx([0.03, 0.06])              # the build's off over nohooks
    assert b["summary"]["ratios"] == pytest.approx([0.07, 0.10])          # over its OWN off, not the default's
    assert (b["summary"]["lo"], b["summary"]["hi"]) == pytest.approx((0.07, 0.10))
    assert b["summary_cm"]["median"] == pytest.approx(0.055)
    assert b["summary_cmgen"]["ratios"] == pytest.approx([0.06, 0.08])   # the generic helpers' A/B run
    lines = hooks.own_off_lines("1b", t)
    assert len(lines) == 3 and lines[0].split()[:2] == ["preset", "build"]
    row = lines[2]
    assert row.split()[:2] == ["1b", "obssm4defer"]
    assert "+8.50% [+7.00..+10.00]" in row and "+4.50% [+3.00..+6.00]" in row and "+7.00% [+6.00..+8.00]" in row
    assert lines[1].rstrip().endswith("-")                                # the default's missing summary_cm


def test_a_runs_name_splits_at_the_build_it_ends_with(load_bench):
    """Build names hold "_" (obssm4defer_w4) and may end one another (obssm4defer_ring4 ends
    with ring4): the longest build that ends the name is the build (session 37: rsplit at the
    last "_" took "w4" for a build and the bench stopped)."""
    split = load_bench("hooks").run_and_build
    builds = ("obssm4defer", "obssm4defer_w4", "ring4", "obssm4defer_ring4")
    assert split("summary_cm_obssm4defer_w4", builds) == ("summary_cm", "obssm4defer_w4")
    assert split("off_obssm4defer_ring4", builds) == ("off", "obssm4defer_ring4")
    assert split("summary_ring4", builds) == ("summary", "ring4")
    assert split("summary_obssm4defer", builds) == ("summary", "obssm4defer")
    assert split("summary_cm", builds) == ("summary_cm", None)              # a default build's run
    assert split("off", ()) == ("off", None)
    hooks = load_bench("hooks")
    for name in hooks.BUILD_VARIANTS:                                       # every variant, every run
        for run in hooks.BUILD_VARIANT_RUNS.get(name, hooks.BUILD_RUNS):
            assert split(f"{run}_{name}", hooks.BUILD_VARIANTS) == (run, name)
