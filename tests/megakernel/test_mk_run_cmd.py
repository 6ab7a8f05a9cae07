"""`dtrace-mk run` with the sim backend."""
import json

import pytest

from dtrace_mk.abi import context
from dtrace_mk.abi.schema import load_schema
from dtrace_mk.cli import main
from dtrace_mk.commands import run as run_cmd


def test_run_sim_prints_simulated_step_time(tmp_path, capsys):
    ev, tr, sc = tmp_path / "e.jsonl", tmp_path / "t.perfetto-trace", tmp_path / "s.json"
    rc = main(["run", "--model", "tiny", "--steps", "3", "--batch", "2", "--backend", "sim", "--workers", "8",
               "--events-out", str(ev), "--trace", str(tr), "--schema-out", str(sc)])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "backend sim (simulated)" in out
    assert "decode step (simulated): mean" in out and "tokens/s (6 tokens)" in out
    recs = context.read_events(ev)
    assert sum(1 for r in recs if context.hook_of(r).name == "gen:advance") == 6
    trace = json.loads(tr.read_text())
    assert any(e.get("name") == "argmax" for e in trace["traceEvents"])
    s = load_schema(sc)
    assert s.model == "tiny" and s.event_id("step_done") >= 0


def test_run_ctx_events_and_faults(tmp_path, capsys):
    f = tmp_path / "f.yaml"
    f.write_text("- {kind: slow_task_class, task_class: attn, extra_us: 5}\n")
    ev = tmp_path / "e.ctx"
    rc = main(["run", "--model", "small-moe", "--steps", "2", "--batch", "4", "--backend", "sim",
               "--faults", str(f), "--events-out", str(ev)])
    out = capsys.readouterr().out
    assert rc == 0 and "faults: 1 rows (slow_task_class)" in out and "dynamic MoE expert tasks" in out
    assert len(ev.read_bytes()) % 128 == 0 and context.read_events(ev)


def test_run_errors(tmp_path, capsys):
    f = tmp_path / "f.json"
    f.write_text('[{"kind": "starve_ready", "task_class": "attn", "delay": 3}]')
    assert main(["run", "--backend", "sim", "--faults", str(f)]) == 2
    err = capsys.readouterr().err
    assert "f.json[0].delay: unknown parameter for starve_ready" in err
    assert main(["run", "--backend", "sim", "--model", "7b"]) == 2
    assert "--model: unknown preset '7b'" in capsys.readouterr().err
    assert main(["run", "--backend", "sim", "--steps", "0"]) == 2
    assert main(["run", "--backend", "sim", "--workers", "4", "--faults", str(_sat(tmp_path))]) == 2
    assert "worker: 9 is out of range for 4 workers" in capsys.readouterr().err


def _sat(tmp_path):
    p = tmp_path / "sat.json"
    p.write_text('[{"kind": "queue_saturation", "worker": 9, "extra_tasks": 2}]')
    return p


@pytest.mark.skipif(run_cmd.gpu_available(), reason="a GPU is present")
def test_gpu_backend_refused_without_gpu(capsys):
    assert main(["run", "--backend", "gpu"]) == 2
    assert "--backend gpu: no CuPy or no GPU here" in capsys.readouterr().err
