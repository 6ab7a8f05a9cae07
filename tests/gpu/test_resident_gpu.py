"""The resident megakernel (gpu.Megakernel.start_resident / grant / poll / stop / finish):
one launch serving many steps behind a step gate, hook records streamed while it runs.

(a) granted in pieces, it computes the same tokens and the same hook records (per step,
    per task) as one ordinary launch of the same steps;
(b) records stream while it runs: the gate holds the kernel at the granted step, so a
    poll returns every step-0 record before the last step is granted (no sleeps);
(c) a tiny ring: nothing consumed while it runs, stored + dropped == the records of a
    full-capacity run (drops counted exactly); polled every step, it wraps with no drop;
(d) stop() ends every worker at the granted step; finish() returns without the watchdog,
    also after the kernel sat parked at the gate far longer than the watchdog's limit.
"""
import time
from collections import Counter

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

from dtrace_mk.abi import definition as D
from dtrace_mk.megakernel.gpu import observer_defines
from dtrace_mk.megakernel.presets import PRESETS

BATCH = 4
N = 12
#: hooks that fire once per task and step whatever the timing (dep:* depend on waits)
DET = ("task:dispatch", "task:begin", "task:end")


def _mk(**kw):
    from dtrace_mk.megakernel import gpu
    return gpu.Megakernel(PRESETS["tiny"], batch=BATCH, seed=0, **kw)


def ident(recs, hooks=DET):
    """Counter of record identities (hook, step, task, worker, slot, request gen)."""
    ids = {D.hook(h).id for h in hooks}
    return Counter((int(r["hook"]), int(r["decode_step"]), int(r["task_index"]), int(r["worker"]),
                    int(r["request_slot"]), int(r["request_gen"])) for r in recs if int(r["hook"]) in ids)


def poll_until(mk, step, got, timeout_s=60.0):
    """Poll until every worker finished the steps < `step`; returns the drops seen."""
    t0, dropped = time.monotonic(), 0
    while True:
        recs, d, done = mk.poll()
        got.append(recs)
        dropped += d
        if done >= step:
            return dropped
        assert time.monotonic() - t0 < timeout_s, f"resident kernel: steps finished {done} < {step}"


#: the observer SM (kernels/megakernel.cu "observer SM"): its observer publishes each
#: worker's head and steps done at the worker's gates (OSQ_TAG_STEP)
BUILDS = pytest.mark.parametrize("defines", [(), ("DTMK_OBS_SM",), ("DTMK_OBS_SM", "DTMK_OBS_SMS=3"),
                                             ("DTMK_OBS_SM", "DTMK_OBS_SMS=4", "DTMK_OSQ_LAZY_PUB"),
                                             observer_defines("sm"),    # (the CLI's: + DTMK_OSQ_DEFER)
                                             observer_defines("sm") + ("DTMK_OSQ_MULTI=4",),   # (session 26, opt-in)
                                             observer_defines("sm") + ("DTMK_OSQ_N=256",),     # (session 27, opt-in)
                                             observer_defines("sm") + ("DTMK_OSQ_N=16",),      # (room waits often)
                                             observer_defines("sm") + ("DTMK_OSQ_IDLE_DRAIN=16",),    # (session 34)
                                             observer_defines("sm") + ("DTMK_OSQ_SPLIT",)],   # (session 35, opt-in)
                                 ids=["default", "obssm", "obssm3", "obssm4lazy", "obssm4defer", "obssm4multi",
                                      "obssm4deep", "obssm4shallow", "obssm4idle", "obssm4split"])


@BUILDS
def test_resident_in_pieces_equals_one_launch(defines):
    mk = _mk(defines=defines)
    ref = mk.run(N, hooks="all")
    assert ref.hooks_dropped == 0
    mk.reset()
    got = []
    mk.start_resident(hooks="all", window=3)
    dropped = 0
    for until in (5, 9, N):
        dropped += poll_until(mk, mk._res["grant"], got)
        mk.grant(until)
    dropped += poll_until(mk, N, got)
    res = mk.finish()
    got.append(res.hooks)
    recs = np.concatenate(got)
    assert dropped == 0 and res.hooks_dropped == 0 and res.watchdog is None
    assert (res.steps, res.step0, mk.step) == (N, 0, N)
    np.testing.assert_array_equal(res.tokens, ref.tokens)
    assert ident(recs, DET + ("gen:advance",)) == ident(ref.hooks, DET + ("gen:advance",))
    # every hook's records stay within the run's steps and every step has its records
    assert sorted(set(recs["decode_step"].tolist())) == list(range(N))


@BUILDS
def test_records_stream_while_the_kernel_runs(defines):
    mk = _mk(defines=defines)
    ref = mk.run(2, hooks=list(DET))
    mk.reset()
    got = []
    mk.start_resident(hooks=list(DET), window=2)     # the gate holds it at step 2
    poll_until(mk, 2, got)
    early = np.concatenate(got)
    assert mk.resident and not mk._res["end"].done  # still running, parked at the gate
    assert int(early["decode_step"].max()) == 1
    assert ident(early[early["decode_step"] == 0]) == ident(ref.hooks[ref.hooks["decode_step"] == 0])
    assert ident(early) == ident(ref.hooks)          # nothing of steps < 2 comes later
    mk.grant(4)
    poll_until(mk, 4, got)
    res = mk.finish()
    assert res.steps == 4 and len(res.hooks) == 0 and res.watchdog is None


@BUILDS
def test_tiny_ring_drops_are_counted_exactly_and_a_polled_ring_wraps_without_loss(defines):
    steps = 16
    full = _mk(defines=defines)
    ref = full.run(steps, hooks=list(DET))
    assert ref.hooks_dropped == 0
    total = len(ref.hooks)
    mk = _mk(hook_cap=16, defines=defines)
    one = mk.run(steps, hooks=list(DET))               # ordinary launch: the ring does not wrap
    assert one.hooks_dropped > 0 and len(one.hooks) + one.hooks_dropped == total
    mk.reset()
    mk.start_resident(hooks=list(DET), window=steps)   # everything granted and stopped at once:
    mk.stop()                                          # nothing consumed while it runs
    res = mk.finish()
    assert res.steps == steps
    assert res.hooks_dropped > 0 and len(res.hooks) + res.hooks_dropped == total
    mk.reset()
    got = []
    mk.start_resident(hooks=list(DET), window=1)       # one step at a time, consumed each step
    dropped = 0
    for k in range(1, steps + 1):
        dropped += poll_until(mk, k, got)
        mk.grant(k + 1 if k < steps else steps)
    res = mk.finish()
    got.append(res.hooks)
    assert dropped + res.hooks_dropped == 0
    assert ident(np.concatenate(got)) == ident(ref.hooks)  # 16 slots per worker, wrapped many times


def test_stop_ends_every_worker_at_the_grant_without_the_watchdog():
    mk = _mk()
    ref = mk.run(5)
    mk.reset()
    got = []
    mk.start_resident(hooks=list(DET), window=3, watchdog_ms=100)
    poll_until(mk, 3, got)
    t0 = time.monotonic()
    while time.monotonic() - t0 < 0.5:               # parked 5x the watchdog's limit
        mk.poll()
    assert mk.stop() == 3
    res = mk.finish()                                 # raises WatchdogFired if it fired
    assert res.watchdog is None and res.steps == 3 and mk.step == 3
    done = mk.cp.asnumpy(mk.buf["steps_done"])
    assert (done == 3).all(), done                    # every worker ended at step 3
    from dtrace_mk.megakernel import gpu
    ws = mk.cp.asnumpy(mk.buf["worker_state"])
    assert (ws[:, gpu.WS_NAMES.index("state")] == 3).all()   # all "done", none stopped/aborted
    assert int(mk.cp.asnumpy(mk.buf["control"])[gpu.CTL_ABORT]) == 0
    np.testing.assert_array_equal(res.tokens, ref.tokens[:3])
    nxt = mk.run(2)                                   # the next launch continues at step 3
    np.testing.assert_array_equal(nxt.tokens, ref.tokens[3:5])


def test_trace_is_refused_in_a_resident_launch():
    from dtrace_mk.errors import UserError
    mk = _mk()
    with pytest.raises(UserError, match="trace"):
        mk.start_resident(trace=True)
    assert not mk.resident


@pytest.mark.parametrize("observer", ["workers", "sm", "sm-calibrate"])
def test_serve_on_one_gpu_is_one_resident_launch(tmp_path, observer):
    """`python -m dtrace_mk.launch.serve --backend gpu` (no launcher, one rank): every
    step served by ONE resident launch, no record dropped, the diagnosis of a clean run --
    the records built by the workers or by observer SMs (--observer sm: where the hardware
    puts them, the grid one SM short; sm-calibrate: calibrated and pinned in a grid of
    every SM, the clock pairs' SM idle)."""
    import json
    import os
    import subprocess
    import sys
    out = tmp_path / "r.json"
    env = dict(os.environ, NCCL_NVLS_ENABLE="0")
    env.pop("DTRACE_MK_JOB_DIR", None)
    p = subprocess.run([sys.executable, "-m", "dtrace_mk.launch.serve", "--backend", "gpu", "--steps", "40",
                        "--batch", str(BATCH), "--result", str(out), "--observer", observer.split("-")[0]]
                       + (["--observer-place", "calibrate"] if observer == "sm-calibrate" else []),
                       capture_output=True, text=True,
                       env=env, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "resident kernel" in p.stderr
    assert ("observer placement (" in p.stderr) == (observer == "sm-calibrate"), p.stderr[-2000:]
    assert "served 40 steps" in p.stderr and "(1 resident launch)" in p.stderr, p.stderr[-2000:]
    assert "dropped by full rings: 0 " in p.stderr, p.stderr[-2000:]
    res = json.loads(out.read_text())
    assert res["coverage"]["eligible"] > 0 and res["coverage"]["lost"] == 0
    assert res["transport"]["lost_records"] in ({}, {"0": 0})


def test_attach_while_running_counts_from_the_first_unstarted_step_exactly():
    """serve's live attach (launch/device_live.py): a query attached into the RUNNING
    resident kernel with first_epoch = the first step no worker has started (the grant)
    counts every task:end of that step and later ones, and nothing of earlier steps, with
    the kernel never parked for it (the grant is moved on right after the attach)."""
    from dtrace_mk.lang.pipeline import compile_query
    from dtrace_mk.runtime.live import LiveSession
    mk = _mk()
    live = LiveSession(mk)
    obj = compile_query("task:end { @c[step] = count(); }").obj
    got = []
    mk.start_resident(hooks=list(DET), window=4)
    poll_until(mk, 1, got)                     # running: step 0 finished, steps up to 3 granted
    first = mk.unstarted_step()
    assert first == 4
    aid = live.attach(obj, first_epoch=first)
    mk.grant(N)                                # no parking: steps first.. run at once
    poll_until(mk, N, got)
    res = mk.finish()
    assert res.watchdog is None and res.steps == N
    cov = {c.epoch: c for c in live.rt.coverage(aid)}
    tasks = len(mk.graph.tasks)
    assert sorted(cov) == list(range(first, N)), sorted(cov)
    assert all(c.eligible == c.executed == tasks and c.lost == 0 for c in cov.values()), cov
    counts = {int.from_bytes(k, "little"): int.from_bytes(v, "little")
              for k, v in live.rt.maps(aid)["c"].snapshot().items()}
    assert counts == {s: tasks for s in range(first, N)}, counts


def test_live_query_outlives_the_device_tables_with_retirement():
    """A resident launch serves more steps than a program's device tables hold epochs
    (64 coverage rows, 8 rate-limit slots).  Retiring complete epochs while the kernel
    runs (LiveSession.retire_complete, as serve_gpu does every RETIRE_EVERY steps) keeps
    every step's coverage exact, reported from the host once retired, and the rate limit
    granted in every step; without retirement the 65th step's events found no row (the
    coverage read raised: the 150-step GPU demo of 2026-11-30 16:00 UTC died of it)."""
    from dtrace_mk.lang.pipeline import compile_query
    from dtrace_mk.runtime.device import COV_ROWS
    from dtrace_mk.runtime.live import LiveSession
    steps = COV_ROWS + 40
    mk = _mk()
    live = LiveSession(mk)
    obj = compile_query("task:end { @c[step] = count(); }").obj
    # the same query rate-limited to 3 runs per step: its rate-limit slots must recycle too
    aid = live.attach(obj, first_epoch=0)
    rid = live.attach(compile_query("task:end { @r[step] = count(); }").obj, first_epoch=0, max_per_epoch=3)
    got, retired = [], 0
    mk.start_resident(hooks=list(DET), window=4)
    for k in range(2, steps + 1, 2):
        poll_until(mk, k - 1, got)
        retired += live.retire_complete()
        mk.grant(min(steps, k + 3))
    poll_until(mk, steps, got)
    res = mk.finish()
    retired += live.retire_complete()
    assert res.watchdog is None and res.steps == steps
    tasks = len(mk.graph.tasks)
    assert retired >= steps - 8                # the tables were emptied along the way
    cov = {c.epoch: c for c in live.rt.coverage(aid)}
    assert sorted(cov) == list(range(steps))
    assert all(c.eligible == c.executed == tasks and c.lost == c.throttled == 0 for c in cov.values()), \
        [c for c in cov.values() if c.executed != tasks][:3]
    counts = {int.from_bytes(k, "little"): int.from_bytes(v, "little")
              for k, v in live.rt.maps(aid)["c"].snapshot().items()}
    assert counts == {s: tasks for s in range(steps)}
    rcov = {c.epoch: c for c in live.rt.coverage(rid)}
    assert sorted(rcov) == list(range(steps))
    # the rate limit granted 3 runs in EVERY step (its slots were retired), the rest throttled
    assert all(c.executed == 3 and c.throttled == tasks - 3 for c in rcov.values()), \
        [c for c in rcov.values() if c.executed != 3][:3]
    rcounts = {int.from_bytes(k, "little"): int.from_bytes(v, "little")
               for k, v in live.rt.maps(rid)["r"].snapshot().items()}
    assert rcounts == {s: 3 for s in range(steps)}
