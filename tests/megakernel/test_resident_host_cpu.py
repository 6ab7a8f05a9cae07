"""gpu.Megakernel's resident-launch host side on the CPU (start_resident / grant / poll /
stop / finish): a NumPy stand-in for CuPy whose async copies are plain memory copies,
and a Python stand-in of the kernel's side of the contract (kernels/megakernel.cu: slot
n % cap while n - tail < cap, else a drop; hook_head / hook_drop / steps_done published
per step; token row (step - step0) % out_rows).  Checks the ring read (wrap-around, the
tail handed back, drops counted once, workers with nothing new), the gate words, tokens
and finish's stop step.  The kernel itself: tests/gpu/test_resident_gpu.py."""
import ctypes
import sys
import types

import numpy as np
import pytest

from dtrace_mk.errors import UserError
from dtrace_mk.megakernel import gpu
from dtrace_mk.megakernel.presets import PRESETS

sys.path.insert(0, __import__("os").path.dirname(__file__))
from test_tp_launcher_cpu import fake_cupy  # noqa: E402,F401  (the NumPy stand-in)

W, CAP, B = 4, 8, 2


class _Event:
    def __init__(self):
        self.done = False

    def record(self, stream=None):
        pass


class _Stream:
    ptr = 0

    def __init__(self, non_blocking=False):
        pass

    def synchronize(self):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


@pytest.fixture()
def mk(fake_cupy):
    rt = fake_cupy.cuda
    rt.runtime = types.SimpleNamespace(
        memcpyAsync=lambda dst, src, n, kind, s: ctypes.memmove(dst, src, n),
        memcpyHostToDevice=1, memcpyDeviceToHost=2, deviceSynchronize=lambda: None)
    rt.alloc_pinned_memory = lambda n: bytearray(n)
    rt.Stream, rt.Event = _Stream, _Event
    rt.get_elapsed_time = lambda a, b: 1.5
    fake_cupy.asnumpy = lambda a: np.array(a)
    m = gpu.Megakernel(PRESETS["tiny"], batch=B, num_workers=W, hook_cap=CAP)
    m.launches = []
    m.kernel = lambda grid, block, args, shared_mem=0, stream=None: m.launches.append(
        dict(zip(gpu.PARAM_FIELDS, (int(x) for x in np.asarray(args[0])))))
    return m


class Kernel:
    """The device side of the resident contract, step by step."""

    def __init__(self, mk):
        self.mk, self.p = mk, mk.launches[-1]
        self.n = np.zeros(W, np.int64)
        self.drop = np.zeros(W, np.int64)
        self.seq = 0

    def gate(self):
        return int(self.mk.buf["control"][gpu.CTL_GATE])

    def run_step(self, step, per_worker):
        b, p = self.mk.buf, self.p
        tail = np.asarray(b["hook_tail"]).astype(np.int64)       # read at the step's gate
        assert step < self.gate() & 0x7FFFFFFF, "ran past the grant"
        for w, k in enumerate(per_worker):
            for _ in range(k):
                if self.n[w] - tail[w] < CAP:
                    rec = np.zeros(1, gpu.CTX_DTYPE)
                    rec["hook"], rec["decode_step"], rec["worker"], rec["ts_ns"] = 4, step, w, self.seq
                    b["hook_ring"][w, self.n[w] % CAP] = rec.view(np.uint8)
                    self.n[w] += 1
                else:
                    self.drop[w] += 1
                self.seq += 1
        row = (step - p["step0"]) % p["n_out_steps"]
        self.mk.out_tokens[row] = [step * 10 + i for i in range(B)]
        b["hook_head"][:] = self.n
        b["hook_drop"][:] = self.drop
        b["steps_done"][:] = step + 1

    def end(self, last):
        g = self.gate()
        assert g & gpu.GATE_STOP and (g & 0x7FFFFFFF) == last
        self.mk.buf["steps_done"][:] = last
        self.mk._res["end"].done = True


def _steps(recs):
    return [(int(r["worker"]), int(r["decode_step"])) for r in recs]


def test_stream_wraps_hands_back_the_tail_counts_drops_and_ends_at_the_grant(mk):
    mk.start_resident(hooks="all", window=2, out_rows=8)
    p = mk.launches[-1]
    assert (p["resident"], p["n_steps"], p["n_out_steps"]) == (1, 1 << 30, 8)
    assert p["hook_tail"] == mk.buf["hook_tail"].data.ptr and p["steps_done"] == mk.buf["steps_done"].data.ptr
    k = Kernel(mk)
    assert k.gate() == 2
    k.run_step(0, [3, 0, 5, 1])
    recs, dropped, done = mk.poll()
    assert (dropped, done) == (0, 1) and len(recs) == 9
    assert _steps(recs) == [(0, 0)] * 3 + [(2, 0)] * 5 + [(3, 0)]    # per worker, ring order
    np.testing.assert_array_equal(np.asarray(mk.buf["hook_tail"]), [3, 0, 5, 1])   # handed back
    mk.grant(6)
    assert k.gate() == 6
    k.run_step(1, [6, 0, 6, 0])        # worker 2: 5 + 6 > 8 slots but 5 were consumed: wraps
    k.run_step(2, [4, 0, 0, 0])        # worker 0: 3 + 6 + 4 - 3 consumed = 10 > 8: 2 dropped
    recs, dropped, done = mk.poll()
    assert (dropped, done) == (2, 3)
    assert _steps(recs) == [(0, 1)] * 6 + [(0, 2)] * 2 + [(2, 1)] * 6
    assert list(recs["ts_ns"][:6]) == sorted(recs["ts_ns"][:6])      # wrapped slots in order
    recs, dropped, done = mk.poll()    # nothing new: nothing twice
    assert (len(recs), dropped, done) == (0, 0, 3)
    with pytest.raises(UserError, match="out_rows"):
        mk.grant(3 + 9)                # tokens of step 3 would be overwritten before a poll
    assert mk.stop() == 6 and k.gate() == 6 | gpu.GATE_STOP
    with pytest.raises(UserError, match="stopped"):
        mk.grant(7)
    for s in (3, 4, 5):
        k.run_step(s, [1, 1, 1, 1])
    k.end(6)
    res = mk.finish()
    assert res.steps == 6 and res.step0 == 0 and mk.step == 6 and not mk.resident
    assert len(res.hooks) == 12 and res.hooks_dropped == 0 and res.watchdog is None
    assert list(res.hooks["ts_ns"]) == sorted(res.hooks["ts_ns"])
    np.testing.assert_array_equal(res.tokens, [[s * 10, s * 10 + 1] for s in range(6)])


def test_finish_refuses_a_kernel_that_ended_elsewhere_and_trace_is_refused(mk):
    with pytest.raises(UserError, match="trace"):
        mk.start_resident(trace=True)
    mk.start_resident(window=3)
    with pytest.raises(UserError, match="already"):
        mk.start_resident()
    k = Kernel(mk)
    k.run_step(0, [0] * W)
    mk.buf["steps_done"][:] = 1
    mk._res["end"].done = True         # ended at step 1, though the stop was at 3
    with pytest.raises(RuntimeError, match="ended at step 1, stopped at 3"):
        mk.finish()


def test_ordinary_launches_keep_their_ring_and_drop_counts(mk):
    """run(): no tail (0), head = records stored (<= cap), drops from hook_drop."""
    p = mk._params(3, 3)
    p = dict(zip(gpu.PARAM_FIELDS, (int(x) for x in np.asarray(p))))
    assert p["resident"] == 0 and p["hook_tail"] == 0 and p["hook_drop"] == mk.buf["hook_drop"].data.ptr
    mk.buf["hook_head"][:] = [CAP, 2, 0, 0]
    mk.buf["hook_drop"][:] = [5, 0, 0, 1]
    recs, dropped = mk.read_hooks()
    assert len(recs) == CAP + 2 and dropped == 6


def test_an_observer_sm_build_launches_one_cta_more_with_its_queues_cleared(fake_cupy):
    """-DDTMK_OBS_SM resident: the observer's CTA beside the workers', the queues zeroed
    before the launch (the observer SM publishes heads and steps done for the workers:
    kernels/mk_obs_sm.cuh osq_run_entry, OSQ_TAG_STEP)."""
    rt = fake_cupy.cuda
    rt.runtime = types.SimpleNamespace(memcpyAsync=lambda dst, src, n, kind, s: ctypes.memmove(dst, src, n),
                                       memcpyHostToDevice=1, memcpyDeviceToHost=2, deviceSynchronize=lambda: None)
    rt.alloc_pinned_memory = lambda n: bytearray(n)
    rt.Stream, rt.Event = _Stream, _Event
    m = gpu.Megakernel(PRESETS["tiny"], batch=B, num_workers=W, hook_cap=CAP, defines=("DTMK_OBS_SM",))
    grids = []
    m.kernel = lambda grid, block, args, shared_mem=0, stream=None: grids.append(
        (grid, bool(np.asarray(m.buf["obsq"]).any())))
    m.buf["obsq"].fill(5)
    m.start_resident(hooks="all", window=2)
    assert grids == [((W + 1,), False)] and m.grid == W + 1
