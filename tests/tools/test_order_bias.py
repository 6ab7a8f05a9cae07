"""tools/order_bias.py: a shuffled table's launches against their place in the round."""
import json

import pytest


def _run(place_us, reps=9, variants=("nohooks", "off", "summary")):
    """A hooks.json preset: each round a rotation of `variants`; a launch costs its variant's base
    plus place_us per place; off also has launches past the rounds (the live_idle loop's)."""
    base = {"nohooks": 1000.0, "off": 1010.0, "summary": 1370.0}
    pos, times = {v: [] for v in variants}, {v: [] for v in variants}
    for r in range(reps):
        order = list(variants[r % 3:]) + list(variants[:r % 3])
        for k, v in enumerate(order):
            pos[v].append(k)
            times[v].append(base[v] + place_us * k)
    times["off"] += [5000.0] * reps              # (no place: must be left out)
    return {"preset": "1b", "order": "shuffled", "reps": reps, "positions": pos, "all_us_per_step": times}


def test_the_slope_is_the_cost_of_a_place(load_tool):
    ob = load_tool("order_bias")
    rows = {r["variant"]: r for r in ob.order_rows(_run(4.0))}
    for v, b in (("nohooks", 1000.0), ("off", 1010.0), ("summary", 1370.0)):
        assert rows[v]["slope"] == pytest.approx(4.0)
        assert (rows[v]["early"], rows[v]["late"]) == (b, b + 8.0)
        assert rows[v]["n"] == 9                  # off's 9 launches past the rounds left out
    flat = {r["variant"]: r for r in ob.order_rows(_run(0.0), ["off"])}
    assert flat["off"]["slope"] == pytest.approx(0.0) and flat["off"]["median"] == 1010.0


def test_a_fixed_order_run_or_an_unknown_variant_is_refused(load_tool, tmp_path, capsys):
    ob = load_tool("order_bias")
    fixed = _run(1.0)
    del fixed["positions"]
    p = tmp_path / "hooks.json"
    p.write_text(json.dumps({"presets": [fixed]}))
    assert ob.main([str(p)]) == 2
    assert "ran in the fixed order (bench/hooks.py --order shuffled)" in capsys.readouterr().err
    p.write_text(json.dumps({"presets": [_run(1.0)]}))
    assert ob.main([str(p), "--variants", "off,mask3"]) == 2
    assert "variants ['mask3'] not in this run" in capsys.readouterr().err
    assert ob.main([str(p), "--variants", "off"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("1b (shuffled order, 9 rounds)") and out[2].split()[:2] == ["off", "9"]
    assert out[2].split()[3] == "+1.00"
