"""The README's demo on the sim backend: the fault shows in step times and in the live
query, and every map carries coverage that adds up."""
import re

import pytest

from dtrace_mk.cli import main


def _demo(capsys, *extra):
    assert main(["demo", "--backend", "sim", *extra]) == 0
    return capsys.readouterr().out


def _steps(out):
    return [float(m) for m in re.findall(r"step +\d+: +([\d.]+) us", out)]


def _attn_avg(out, layer):
    m = re.search(rf"@attn_dur_ns\[{layer}\]: count (\d+), average (\d+)", out)
    assert m, out
    return int(m.group(1)), int(m.group(2))


def test_demo_shows_the_fault_in_steps_and_live_query(capsys):
    out = _demo(capsys)
    steps = _steps(out)
    assert len(steps) == 12
    assert min(steps[6:]) > max(steps[:6]) + 30, steps        # +40 us on layer-1 attn tasks
    n0, avg0 = _attn_avg(out, 0)
    n1, avg1 = _attn_avg(out, 1)
    assert n0 == n1 > 0
    assert avg1 - avg0 == pytest.approx(40_000, abs=500)
    for e, x, t, l in re.findall(r"coverage @\w+: eligible (\d+), executed (\d+), throttled (\d+), lost (\d+)", out):
        assert int(e) == int(x) + int(t) + int(l)
    live = re.search(r"coverage @attn_dur_ns: eligible (\d+)", out)
    start = re.search(r"coverage @latency: eligible (\d+)", out)
    # attached live at step 6 of 12: it saw exactly the second half of task:end events
    assert int(live.group(1)) * 2 == int(start.group(1))


def test_demo_without_fault_has_even_layers(capsys):
    out = _demo(capsys, "--no-fault")
    steps = _steps(out)
    assert max(steps) - min(steps) < 5, steps
    _, avg0 = _attn_avg(out, 0)
    _, avg1 = _attn_avg(out, 1)
    assert abs(avg1 - avg0) < 1000


def test_demo_json_is_ndjson(capsys):
    import json
    out = _demo(capsys, "-f", "json")
    rows = [json.loads(l) for l in out.splitlines() if l.strip()]
    assert rows and all("coverage" in r for r in rows if r.get("type") == "map")


def test_demo_rejects_too_few_steps(capsys):
    assert main(["demo", "--backend", "sim", "--steps", "1"]) == 2
    assert "--steps: expected >= 2" in capsys.readouterr().err
