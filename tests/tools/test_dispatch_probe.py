"""tools/dispatch_probe.py (plan 117; the GPU run itself is not in CI): its table from hook
records -- flagged (FLAG_OBS_DELAY) and other dispatch waits per class, the flagged tasks'
drain gap, warm-up steps and dynamic tasks left out."""
import numpy as np
import pytest

from dtrace_mk.abi import definition as D
from dtrace_mk.abi.context import CTX_DTYPE


@pytest.fixture(scope="module")
def probe(load_tool):
    return load_tool("dispatch_probe")


def _rec(hook, worker, step, task, cls, ts, wait=0, flags=0):
    r = np.zeros(1, CTX_DTYPE)
    r["hook"], r["worker"], r["decode_step"], r["task_index"] = D.hook(hook).id, worker, step, task
    r["task_class"], r["ts_ns"], r["wait_ns"], r["flags"] = cls, ts, wait, flags
    return r


def test_flagged_and_other_dispatch_waits_and_the_drain_gap(probe):
    f = D.FLAG_OBS_DELAY
    h = np.concatenate([
        # (worker 0, step 2, task 5): ready at 1000, drain until 13000, dispatched 13500 with wait 500
        _rec("task:ready", 0, 2, 5, 3, 1000, flags=f), _rec("task:dispatch", 0, 2, 5, 3, 13500, 500, f),
        # (worker 1, step 2, task 6): plain, ready + wait == dispatch
        _rec("task:ready", 1, 2, 6, 3, 2000), _rec("task:dispatch", 1, 2, 6, 3, 4000, 2000),
        # a warm-up step and a dynamic task: left out
        _rec("task:dispatch", 0, 1, 5, 3, 9000, 7000), _rec("task:dispatch", 2, 3, 9, 3, 9000, 7000, D.FLAG_DYNAMIC),
    ])
    rows = probe.add_records({}, h, {3: "attn"})
    assert rows == {"attn": {True: [500], False: [2000], "gap": [12000]}}
    lines = probe.table(rows).splitlines()
    assert lines[0].split()[:3] == ["class", "tasks", "flag"]
    cells = lines[1].split()
    assert cells[:3] == ["attn", "2", "1"] and cells[3] == "2.00" and cells[7] == "0.50" and cells[-1] == "12.00"
