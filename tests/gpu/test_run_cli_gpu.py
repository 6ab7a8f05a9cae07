"""`dtrace-mk run --backend gpu` on the lent GPU: without --events-out it runs the build
without hook code (and still writes the built-in trace); with it, the hook build with every
hook on, and its records name every task of every step once at task:end."""
import re
from collections import Counter

import pytest

pytestmark = pytest.mark.gpu


def test_run_cli_on_the_gpu(tmp_path, capsys):
    from dtrace_mk.abi import context
    from dtrace_mk.cli import main
    from dtrace_mk.megakernel.graph import build_graph
    from dtrace_mk.megakernel.presets import get_preset
    steps, batch, workers = 6, 2, 16
    tr = tmp_path / "t.perfetto-trace"
    assert main(["run", "--model", "tiny", "--steps", str(steps), "--batch", str(batch), "--backend", "gpu",
                 "--workers", str(workers), "--trace", str(tr)]) == 0
    out = capsys.readouterr().out
    assert "backend gpu" in out and f"({steps * batch} tokens)" in out, out
    assert re.search(r"trace: .* \((\d+) task records, 0 dropped\)", out) and tr.stat().st_size > 0
    ev = tmp_path / "e.ctx"
    assert main(["run", "--model", "tiny", "--steps", str(steps), "--batch", str(batch), "--backend", "gpu",
                 "--workers", str(workers), "--events-out", str(ev)]) == 0
    out = capsys.readouterr().out
    assert "dropped" not in out, out
    tasks = build_graph(get_preset("tiny"), batch, workers).tasks
    recs = [context.unpack(r) for r in context.read_events(ev) if context.hook_of(r).name == "task:end"]
    ends = Counter((r["task_index"], r["decode_step"]) for r in recs)
    static = {t.index for t in tasks if not t.dynamic}
    assert {k for k in ends if k[0] in static} == {(i, s) for i in static for s in range(steps)}
    assert set(ends.values()) == {1}
