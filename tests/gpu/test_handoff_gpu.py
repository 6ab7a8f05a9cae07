"""Grid handoff on the GPU (kernels/megakernel.cu "grid handoff"): the lean build (no hook
code) runs; the hook build takes over each worker at a task boundary while the job runs.
Outputs keep every bit, every task of every step runs exactly once across the two grids,
deferred late signals and queue-saturation phantoms are handed on, and a monitor attached
to a lean job counts exactly the tasks the hook grid ran, per worker."""
import numpy as np
import pytest

pytestmark = pytest.mark.gpu

from dtrace_mk.megakernel.faults import FaultTable
from dtrace_mk.megakernel.presets import PRESETS

BATCH = 2
_MK = {}


def megakernel(name, defines=()):
    from dtrace_mk.megakernel import gpu
    if (name, defines) not in _MK:
        _MK[name, defines] = gpu.Megakernel(PRESETS[name], batch=BATCH, seed=0, handoff=True, defines=defines)
    m = _MK[name, defines]
    m.reset()
    m.set_observer(0, None)
    return m


def run(m, steps, **kw):
    h = m.start(steps, trace=True, refresh=1, **kw)
    res = m.finish(h)
    return res, m.handoff_state(h)


def task_steps(res):
    """(task, step) of every task the trace saw, and whether any came twice."""
    pairs = list(zip(res.trace["task_index"].tolist(), res.trace["step"].tolist()))
    return sorted(pairs), len(pairs) != len(set(pairs))


def assert_same_run(base, res):
    assert np.array_equal(res.tokens, base.tokens)
    assert np.array_equal(res.logits.view(np.uint32), base.logits.view(np.uint32))
    assert res.trace_dropped == 0 and base.trace_dropped == 0
    got, dup = task_steps(res)
    assert not dup, "a task ran twice across the handoff"
    assert got == task_steps(base)[0], "tasks lost (or extra) across the handoff"


AFTER_SYNC = ("DTMK_HO_AFTER_SYNC",)     # the leave test behind the wait's first barrier (session 11)


@pytest.mark.parametrize("name, frac, defines", [("tiny", 0.0, ()), ("tiny", 0.5, ()), ("small-moe", 0.2, ()),
                                                  ("small-moe", 0.6, ()), ("1b", 0.3, ()),
                                                  ("small-moe", 0.2, AFTER_SYNC), ("1b", 0.3, AFTER_SYNC)])
def test_a_handoff_mid_run_changes_no_bit_and_loses_no_task(name, frac, defines):
    """Every worker leaves once it has done `after` tasks: frac of a typical worker's
    static tasks in the run (0: at its first task)."""
    m = megakernel(name, defines)
    steps = 4
    plan = np.diff(m.tables["plan_off"].get())
    after = int(frac * steps * np.median(plan[plan > 0]))
    base, st0 = run(m, steps, lean=True)                 # the lean grid all the way
    assert st0["pushed"] == m.num_workers and st0["claimed"] == 0 and not st0["handed_off"]
    assert len(st0["finished"]) == m.num_workers
    m.reset()
    res, st = run(m, steps, handoff_after=after)
    assert res.watchdog is None
    assert st["pushed"] == st["claimed"] == m.num_workers and st["handed_off"]
    assert st["left"], "no worker left mid-run"
    plan_off = m.tables["plan_off"].get()
    for w, step, i in st["left"]:
        assert m.step - steps <= step < m.step and plan_off[w] <= i < plan_off[w + 1]
        assert st["done_at_leave"][w] >= after
    assert_same_run(base, res)
    m.reset()
    hook = m.run(steps, trace=True)                      # the hook build alone: the same bits
    assert_same_run(base, hook)


def test_late_signals_and_phantoms_are_handed_on():
    m = megakernel("small-moe")
    ft = FaultTable.from_specs([
        {"kind": "late_notification", "task_class": "qkv", "delay_us": 300},
        {"kind": "late_notification", "task_class": "mlp_down", "delay_us": 300},
        {"kind": "queue_saturation", "worker": 0, "extra_tasks": 20},
        {"kind": "slow_task_class", "task_class": "attn", "extra_us": 20},
    ])
    base, _ = run(m, 4, lean=True, faults=ft)
    found = 0
    for after in (2, 5, 9, 14):
        m.reset()
        res, st = run(m, 4, handoff_after=after, faults=ft, watchdog_ms=3000)
        assert res.watchdog is None, res.watchdog      # a lost deferred signal would hang a wait
        assert_same_run(base, res)
        found += st["signals_handed_on"]
    assert found > 0, "no leaving worker held a deferred signal: the test did not exercise it"


@pytest.mark.parametrize("name", ["tiny", "1b"])
def test_a_monitor_attached_to_a_lean_job_counts_exactly_what_the_hook_grid_ran(name):
    import time
    from dtrace_mk.lang.pipeline import compile_query
    from dtrace_mk.megakernel import gpu
    from dtrace_mk.runtime.live import LiveSession
    m = megakernel(name)
    live = LiveSession(m)
    steps = 400 if name == "tiny" else 60
    base = m.run(steps)
    m.reset()
    mon = compile_query("task:end { @n[worker] = count(); }", m.graph.schema, name="<per worker>")
    live.start(steps)
    assert live.handle["handoff"] is not None, "nothing attached: LiveSession runs the lean grid"
    t0 = time.perf_counter()
    while live.snapshot_steps() < m.step - steps + 5 and time.perf_counter() - t0 < 20:
        time.sleep(0.001)
    assert live.running(), "the run ended before the attach: make it longer"
    aid = live.attach(mon.obj)
    lat = None
    t0 = time.perf_counter()
    while lat is None and time.perf_counter() - t0 < 5:
        lat = live.attach_latency()
    res = live.wait()
    st = m.handoff_state(live.handle)
    assert lat is not None and lat["write_to_first_event_ms"] < 1000
    assert st["claimed"] == m.num_workers and st["left"]
    assert np.array_equal(res.tokens, base.tokens)
    assert np.array_equal(res.logits.view(np.uint32), base.logits.view(np.uint32))
    snap = live.snapshot(aid)
    assert not snap.partial
    cov = snap.coverage
    assert sum(c.lost for c in cov) == 0 and sum(c.throttled for c in cov) == 0
    done = m.buf["worker_state"].get()[:, 7].astype(np.int64)           # WS_DONE: tasks per worker
    ran = {w: int(done[w]) - st["done_at_leave"][w] for w in range(m.num_workers)}
    counted = {int.from_bytes(k, "little"): int.from_bytes(v, "little") for k, v in snap.maps["n"].snapshot().items()}
    assert {w: n for w, n in ran.items() if n} == counted
    for c in cov:                     # (the snapshot keeps the latest epochs' rows only)
        assert c.eligible == c.executed
    assert (live.read_state()[:, gpu.OBS_NAMES.index("done")] == 1).all()
    live.detach(aid)
