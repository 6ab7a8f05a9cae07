"""Grid handoff on the GPU (kernels/megakernel.cu "grid handoff"): the lean grid (the no-hook
build, workers placed) runs; the hook build takes over each worker at its next dependency
wait while the job runs, the successor on each SM resuming the worker that ran there.
Outputs keep every bit, every task of every step runs exactly once across the two grids,
faults in flight (deferred late signals, queue-saturation phantoms) neither hang nor change
a bit, and a monitor attached to a lean job counts exactly the tasks the hook grid ran,
per worker."""
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


STEPS = {"tiny": 48, "small-moe": 24, "1b": 4}      # a few ms of lean grid


#: the observer SM's job (-DDTMK_OBS_SM): both grids planned for SMs - 1 workers; the lean
#: CTA on the observer's SM leaves at once, the hook grid's observer takes it (sm_worker)
OBSSM = ("DTMK_OBS_SM",)


@pytest.mark.parametrize("name, frac, defines", [("tiny", 0.0, ()), ("tiny", 0.5, ()), ("small-moe", 0.0, ()),
                                                 ("small-moe", 0.2, ()), ("small-moe", 0.6, ()), ("1b", 0.0, ()),
                                                 ("1b", 0.3, ()), ("tiny", 0.5, OBSSM), ("1b", 0.3, OBSSM)])
def test_a_handoff_mid_run_changes_no_bit_and_loses_no_task(name, frac, defines):
    """The stop is asked before the launch (frac 0: every worker leaves at its first
    dependency wait) or, by the host, once some worker has done `after` tasks: frac of a
    typical worker's static tasks in the run (runs of a few ms, so the host's ask lands
    mid-run)."""
    from dtrace_mk.megakernel import gpu
    m = megakernel(name, defines)
    steps = STEPS[name]
    plan = np.diff(m.tables["plan_off"].get())
    after = int(frac * steps * np.median(plan[plan > 0]))
    col = gpu.WS_NAMES.index("done")
    base, st0 = run(m, steps, lean=True)                 # the lean grid all the way
    assert st0["resumed"] == 0 and not st0["handed_off"]
    assert (m.buf["worker_state"].get()[:, gpu.WS_NAMES.index("state")] == 3).all()
    base_done = m.buf["worker_state"].get()[:, col].astype(np.int64)
    m.reset()
    res, st = run(m, steps, handoff_after=after)
    assert res.watchdog is None
    assert st["resumed"] == m.num_workers and st["handed_off"]
    assert st["left"], "no worker left mid-run"
    assert len(st["left"]) + len(st["drain"]) + len(st["finished"]) == m.num_workers
    plan_off = m.tables["plan_off"].get()
    for w, step, i in st["left"]:
        assert m.step - steps <= step < m.step and plan_off[w] <= i < plan_off[w + 1]
    # each successor counts on from its worker's tasks done: the launch's total is the lean run's
    done = m.buf["worker_state"].get()[:, col].astype(np.int64)
    assert int(done.sum()) == int(base_done.sum())
    assert all(done[w] >= n for w, n in st["done_at_leave"].items())
    assert_same_run(base, res)
    m.reset()
    hook = m.run(steps, trace=True)                      # the hook build alone: the same bits
    assert_same_run(base, hook)


def test_faults_in_flight_at_the_handoff_neither_hang_nor_change_a_bit():
    """A leaving worker posts its deferred late signals as it exits (up to the delay
    early: their timing, not their count, changes); a successor re-adds the unspent
    queue-saturation phantoms of the task it resumes (or spent them with a dynamic task)."""
    m = megakernel("small-moe")
    ft = FaultTable.from_specs([
        {"kind": "late_notification", "task_class": "qkv", "delay_us": 300},
        {"kind": "late_notification", "task_class": "mlp_down", "delay_us": 300},
        {"kind": "queue_saturation", "worker": 0, "extra_tasks": 20},
        {"kind": "slow_task_class", "task_class": "attn", "extra_us": 20},
    ])
    base, _ = run(m, 4, lean=True, faults=ft)
    for after in (0, 2, 5, 9, 14):
        m.reset()
        res, st = run(m, 4, handoff_after=after, faults=ft, watchdog_ms=3000)
        assert res.watchdog is None, res.watchdog      # a lost signal would hang a wait
        assert st["resumed"] == m.num_workers
        assert_same_run(base, res)


def test_unspent_phantoms_are_re_added_by_the_successor():
    """tiny (no dynamic tasks): every worker gets queue-saturation phantoms at each step's
    first task; a worker that stops in that task's wait leaves them unspent and its
    successor adds them again, so queue depth and the phantom drain happen once."""
    m = megakernel("tiny")
    W = m.num_workers
    ft = FaultTable.from_specs([{"kind": "queue_saturation", "worker": w, "extra_tasks": 5} for w in range(W)])
    steps = STEPS["tiny"]
    base, _ = run(m, steps, lean=True, faults=ft)
    readded = 0
    for after in (0, 10, 40, 90):
        m.reset()
        res, st = run(m, steps, handoff_after=after, faults=ft)
        assert res.watchdog is None
        assert_same_run(base, res)
        readded += st["phantoms_readded"]
    assert readded > 0, "no successor re-added phantoms: the test did not exercise them"


@pytest.mark.parametrize("name, defines", [("tiny", ()), ("1b", ()), ("tiny", OBSSM), ("1b", OBSSM),
                                            ("1b", OBSSM + ("DTMK_OBS_SMS=3",))],
                         ids=["tiny", "1b", "tiny-obssm", "1b-obssm", "1b-obssm3"])
def test_a_monitor_attached_to_a_lean_job_counts_exactly_what_the_hook_grid_ran(name, defines):
    import time
    from dtrace_mk.lang.pipeline import compile_query
    from dtrace_mk.megakernel import gpu
    from dtrace_mk.runtime.live import LiveSession
    m = megakernel(name, defines)
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
    assert st["resumed"] == m.num_workers and st["left"]
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
