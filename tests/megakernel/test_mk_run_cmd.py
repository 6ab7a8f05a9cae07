"""`dtrace-mk run` with the sim backend."""
import json
import re

import pytest

from dtrace_mk.abi import context
from dtrace_mk.abi.schema import load_schema
from dtrace_mk.cli import main
from dtrace_mk.commands import run as run_cmd


def test_run_sim_prints_simulated_step_time(tmp_path, capsys):
    ev, tr, sc = tmp_path / "e.jsonl", tmp_path / "t.json", tmp_path / "s.json"
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


def test_run_ranks_in_process_writes_per_rank_files(tmp_path, capsys):
    ev, sc, tr = tmp_path / "e.ctx", tmp_path / "s.json", tmp_path / "t{rank}.json"
    rc = main(["run", "--backend", "sim", "--ranks", "2", "--steps", "2", "--batch", "2", "--workers", "8",
               "--events-out", str(ev), "--schema-out", str(sc), "--trace", str(tr), "--no-clock-skew"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "2 tensor-parallel ranks (2 ranks in one process)" in out
    assert [x.split(":")[0] for x in out.splitlines() if x.startswith("rank ")] == ["rank 0", "rank 1"]
    for r in range(2):
        recs = context.read_events(tmp_path / f"e.rank{r}.ctx")
        names = {context.hook_of(x).name for x in recs}
        assert {"comm:signal", "comm:wait"} <= names
        s = load_schema(tmp_path / f"s.rank{r}.json")
        assert s.events[s.event_id("L0.allreduce_attn.r1")].owner_rank == 1
        assert json.loads((tmp_path / f"t{r}.json").read_text())["traceEvents"][0]["pid"] == r
    assert run_cmd.rank_path("x/e.jsonl", 3, 4) == "x/e.rank3.jsonl"
    assert run_cmd.rank_path("e{rank}.ctx", 3, 4) == "e3.ctx" and run_cmd.rank_path("e.ctx", 0, 1) == "e.ctx"


def test_run_ranks_errors(tmp_path, capsys):
    assert main(["run", "--backend", "sim", "--ranks", "3"]) == 2
    assert "cannot be split over 3 ranks" in capsys.readouterr().err
    assert main(["run", "--backend", "gpu", "--ranks", "2"]) == 2
    assert "--backend gpu: 2 tensor-parallel ranks run on the sim backend only" in capsys.readouterr().err
    assert main(["run", "--backend", "sim", "--ranks", "0"]) == 2
    f = tmp_path / "f.yaml"
    f.write_text("- {kind: late_comm, comm_op: allreduce_attn, delay_us: 3, rank: 2}\n")
    assert main(["run", "--backend", "sim", "--ranks", "2", "--faults", str(f)]) == 2
    assert "f.yaml[0].rank: expected 0..1, got 2" in capsys.readouterr().err
    f.write_text("- {kind: late_comm, comm_op: allreduce_x, delay_us: 3, rank: 1}\n")
    assert main(["run", "--backend", "sim", "--ranks", "2", "--faults", str(f)]) == 2
    assert "f.yaml[0].comm_op: unknown comm op" in capsys.readouterr().err


def test_trace_native_perfetto_when_suffix_says_so(tmp_path, capsys):
    """--trace X.perfetto-trace writes Perfetto's protobuf: TracePackets whose track
    events include one slice begin per task (TrackEvent type 1 = SLICE_BEGIN)."""
    from dtrace_mk.cli import main
    from dtrace_mk.exporters.protowire import fields, parse

    out = tmp_path / "t.perfetto-trace"
    assert main(["run", "--backend", "sim", "--steps", "2", "--trace", str(out)]) == 0
    m = re.search(r"trace: .* \((\d+) task records\)", capsys.readouterr().out)
    tasks = int(m.group(1))
    packets = [v for f, _, v in parse(out.read_bytes()) if f == 1]
    begins = 0
    for pkt in packets:
        for ev in fields(pkt).get(11, []):            # TracePacket.track_event
            if fields(ev).get(9) == [1]:              # TrackEvent.type == SLICE_BEGIN
                begins += 1
    assert begins >= tasks > 0


def test_gpu_run_builds_hook_code_only_when_hook_records_are_asked_for(monkeypatch):
    """`run --backend gpu` without --events-out runs the build without hook code (hooks
    compiled in but off cost the loop a few percent); with it, the hook build, hooks on."""
    import types
    import numpy as np
    from dtrace_mk.megakernel import gpu
    from dtrace_mk.megakernel.graph import build_graph
    from dtrace_mk.megakernel.presets import get_preset
    seen = []

    class FakeMk:
        def __init__(self, cfg, **kw):
            seen.append(kw["defines"])

        def run(self, steps, hooks=None, trace=False, faults=None):
            seen.append(hooks)
            return types.SimpleNamespace(elapsed_ms=1.0, tokens=np.zeros((steps, 1), np.int32),
                                         hooks=np.zeros(0, np.uint8), trace=None, trace_dropped=0,
                                         hooks_dropped=0)
    monkeypatch.setattr(gpu, "Megakernel", FakeMk)
    graph = build_graph(get_preset("tiny"), 1, 8)
    args = types.SimpleNamespace(seed=0, queue_threshold=0, steps=2, trace=None)
    for sink in (None, lambda rec: None):
        run_cmd._run_gpu(graph, args, [], sink)
    assert seen[:2] == [("DTMK_NO_HOOKS",), None] and seen[2:4] == [(), "all"]
