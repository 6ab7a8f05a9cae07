"""CI (no GPU): the observer SM (-DDTMK_OBS_SM, opt-in -- kernels/megakernel.cu "observer
SM", kernels/mk_obs_sm.cuh; session 13's one-warp draft was exact on the H200 but slow,
session 14 gave it K warps with lane-parallel record building and its compiled tier).
The build compiles, refuses what it does not support, leaves every other build's code
alone, lays out its queues as the host does, and keeps the epoch protocol's order."""
import re
import sys

import numpy as np
import pytest

from dtrace_mk.errors import UserError
from dtrace_mk.kernels import KERNEL_DIR, megakernel_text
from dtrace_mk.kernels.build import nvrtc_compile
from dtrace_mk.megakernel import gpu
from dtrace_mk.megakernel.presets import PRESETS
from tests.megakernel.test_hook_sites import body

sys.path.insert(0, __import__("os").path.dirname(__file__))
from test_tp_launcher_cpu import fake_cupy  # noqa: E402,F401  (the NumPy stand-in)

SRC = megakernel_text()
OBS_SM_SRC = (KERNEL_DIR / "mk_obs_sm.cuh").read_text()


@pytest.mark.slow
@pytest.mark.parametrize("defines", [("DTMK_OBS_SM",), ("DTMK_OBS_SM", "DTMK_ROPE_IN_ATTN"),
                                     ("DTMK_OBS_SM", "DTMK_OSQ_STATS"),
                                     ("DTMK_OBS_SM", "DTMK_HANDOFF", "DTMK_SM_WORKER"),
                                     ("DTMK_OBS_SM", "DTMK_OBS_PROF"),    # (the probe's --prof: warp 0 counted)
                                     gpu.observer_defines("sm") + ("DTMK_OSQ_MULTI=4", "DTMK_OSQ_STATS"),
                                     gpu.observer_defines("sm") + ("DTMK_OSQ_N=256", "DTMK_OSQ_IDLE_DRAIN=16"),
                                     gpu.observer_defines("sm") + ("DTMK_OSQ_NOMAPS", "DTMK_OSQ_ATOMS=8",
                                                                   "DTMK_OSQ_LOADS=16", "DTMK_OSQ_SCATTER"),
                                     gpu.observer_defines("sm") + ("DTMK_OSQ_DISCARD", "DTMK_OSQ_ICODE=8",
                                                                   "DTMK_OSQ_JCODE=8", "DTMK_WK_ICODE=8"),
                                     gpu.observer_defines("sm") + ("DTMK_OSQ_SPLIT", "DTMK_OSQ_STATS"),
                                     gpu.observer_defines("sm") + ("DTMK_OSQ_NOPUSH", "DTMK_OSQ_NOPRE", "DTMK_OSQ_NOHOLD",
                                                                   "DTMK_OSQ_NOWAITCAP", "DTMK_OSQ_WSHADOW"),
                                     gpu.observer_defines("sm") + ("DTMK_OSQ_LOOK_CALL", "DTMK_OSQ_RAISE_UNCAPPED",
                                                                   "DTMK_OSQ_DEFER_AFTER=4", "DTMK_OSQ_DEFER_INLINE"),
                                     gpu.observer_defines("sm") + ("DTMK_OSQ_NOPUSH", "DTMK_OSQ_WSHADOW",
                                                                   "DTMK_OSQ_WSHADOW_DEFER")],
                         ids=["tiny", "1b", "stats", "handoff", "prof", "multi", "deep", "synthetic", "code", "split",
                              "capture", "lookcall", "shadowdefer"])
def test_the_observer_sm_build_compiles(defines):
    ptx = nvrtc_compile((KERNEL_DIR / "megakernel.cu").read_text(), "megakernel.cu", "sm_90a", "ptx",
                        defines=defines).decode()
    assert ".entry dtmk_megakernel" in ptx and "osq_observer" in ptx
    assert ("dtmk_osq_stats" in ptx) == ("DTMK_OSQ_STATS" in defines)
    # the synthetic atomics / loads run after a real entry run too (used, not only declared)
    assert bool(re.search(r"mov\.u64 \t*%rd\d+, dtmk_osq_sink;", ptx)) == ("DTMK_OSQ_ATOMS=8" in defines)
    # the measurement-only code blocks (straight, ICODE; jumping, JCODE) are called per discarded entry
    assert ("call.uni" in ptx and "osq_jcode" in ptx) == ("DTMK_OSQ_JCODE=8" in defines)
    assert ("osq_icode" in ptx) == ("DTMK_OSQ_ICODE=8" in defines)
    # ... and the workers' (plan 83), once per task
    assert ("wk_icode" in ptx) == ("DTMK_WK_ICODE=8" in defines)
    # session 54's capture split: the workers' own summary shadow (updated per task, flushed at the end)
    assert ("wsh_flush" in ptx and "dtmk_wsh_sink" in ptx) == ("DTMK_OSQ_WSHADOW" in defines)
    # session 62: the shadow's updates staged, applied in the waits' failed polls
    assert ("s_wsh_st" in ptx) == ("DTMK_OSQ_WSHADOW_DEFER" in defines)
    # the wait's first look is no call in the observer-SM build (it returned 0 there), unless asked back
    assert ("obs_first_look" in ptx) == ("DTMK_OSQ_LOOK_CALL" in defines)
    # the Obs of the observer build: the size the 1b / tiny warp counts above assume
    assert re.search(r"\.shared \.align 16 \.b8 O_w0\[29264\]", ptx)


@pytest.mark.parametrize("other", ["DTMK_OSQ_NOPRE", "DTMK_OSQ_NOHOLD", "DTMK_OSQ_NOWAITCAP", "DTMK_OSQ_WSHADOW"])
def test_the_capture_splits_need_nopush(other):
    """Measurement-only capture cuts drop what the entry would carry: without -DDTMK_OSQ_NOPUSH
    they would push wrong entries, so the build refuses them, naming the define."""
    with pytest.raises(Exception, match=other.replace("DTMK_OSQ_", "") + ".*NOPUSH"):
        nvrtc_compile((KERNEL_DIR / "megakernel.cu").read_text(), "megakernel.cu", "sm_90a", "ptx",
                      defines=gpu.observer_defines("sm") + (other,))


def test_the_in_cta_shadow_builds_and_needs_hook_code():
    """Session 62's in-CTA shadow (bench/hooks.py wshincta / wshdeferincta): the default build's sites
    update the shadow instead of building records -- hook code, so refused in a no-hook build."""
    ptx = nvrtc_compile((KERNEL_DIR / "megakernel.cu").read_text(), "megakernel.cu", "sm_90a", "ptx",
                        defines=("DTMK_OSQ_WSHADOW", "DTMK_OSQ_WSHADOW_DEFER")).decode()
    assert "wsh_flush" in ptx and "dtmk_wsh_sink" in ptx and "s_wsh_st" in ptx and "osq_observer" not in ptx
    with pytest.raises(Exception, match="WSHADOW is measurement of hook code: not with -DDTMK_NO_HOOKS"):
        nvrtc_compile((KERNEL_DIR / "megakernel.cu").read_text(), "megakernel.cu", "sm_90a", "ptx",
                      defines=("DTMK_NO_HOOKS", "DTMK_OSQ_WSHADOW"))


def test_the_deferred_shadow_needs_the_shadow():
    with pytest.raises(Exception, match="WSHADOW_DEFER defers -DDTMK_OSQ_WSHADOW's updates: add it"):
        nvrtc_compile((KERNEL_DIR / "megakernel.cu").read_text(), "megakernel.cu", "sm_90a", "ptx",
                      defines=gpu.observer_defines("sm") + ("DTMK_OSQ_NOPUSH", "DTMK_OSQ_WSHADOW_DEFER"))


@pytest.mark.parametrize("other", ["DTMK_NO_HOOKS", "DTMK_SITE_FORM"])
def test_unsupported_combinations_are_refused_at_compile_time(other):
    with pytest.raises(Exception, match="DTMK_OBS_SM"):
        nvrtc_compile((KERNEL_DIR / "megakernel.cu").read_text(), "megakernel.cu", "sm_90a", "ptx",
                      defines=("DTMK_OBS_SM", other))


def test_queue_layout_is_the_hosts():
    val = lambda name: re.search(r"#define " + name + r" ([^\n/]+)", SRC).group(1).strip()  # noqa: E731
    assert int(val("OSQ_N")) == gpu.OSQ_N and "OSQ_HDR_BYTES" not in SRC   # (the draft's header: gone)
    assert val("OSQ_W_BYTES") == "(64 + OSQ_N * 128)" and gpu.OSQ_W_BYTES == 64 + gpu.OSQ_N * 128
    assert int(val("CTL_OBSQ")) == gpu.CTL_OBSQ and gpu.CTL_OBSQ + 1 < gpu.CTL_WORDS
    assert gpu.CTL_OBSQ not in (gpu.CTL_SM_MAP, gpu.CTL_SM_MAP + 1)
    words = [int(val(w)) for w in ("OSQ_W_HEAD", "OSQ_W_TAIL", "OSQ_W_DONE", "OSQ_W_HOOK_N", "OSQ_W_HOOK_SLOT",
                                   "OSQ_W_HOOK_DROP", "OSQ_W_MASK", "OSQ_W_LOW")]
    assert sorted(words) == list(range(8))                  # the 64 bytes of a worker's words, each once
    assert int(val("DTMK_OBS_SM_WARPS")) == gpu.OBS_SM_WARPS_MAX


def test_a_builds_per_warp_rows_follow_its_own_warp_limit():
    """dtmk_osq_stats[DTMK_OBS_SMS * DTMK_OBS_SM_WARPS * ...]: a build's own
    -DDTMK_OBS_SM_WARPS when it has one (session 37: tools/obs_sm_probe.py cleared 8 rows of a
    4-warp build's array and CUDA refused the memset)."""
    from types import SimpleNamespace
    rows = gpu.Megakernel.obs_sm_warps_max.fget
    assert rows(SimpleNamespace(defines=("DTMK_OBS_SM", "DTMK_OBS_SM_WARPS=4"))) == 4
    assert rows(SimpleNamespace(defines=("DTMK_OBS_SM",))) == gpu.OBS_SM_WARPS_MAX
    assert "m.obs_sm_warps_max" in (KERNEL_DIR.parent / "tools" / "obs_sm_probe.py").read_text()


def test_each_observer_warp_has_its_own_obs_within_the_dynamic_shared_memory():
    """Warp 0 keeps the static Obs (a worker CTA's only one); observer warp k > 0 the
    (k-1)th in the dynamic shared memory, and a launch runs only as many warps as that
    memory holds (1b: 6; tiny: 1).  The observer CTA clears its Obs per warp: the kernel's
    CTA-wide clearing loops skip it (warps past the last Obs would write out of bounds)."""
    f = body("obs_self")
    assert "k == 0 || !osq_is_observer() ? O_w0 : ((Obs *)smem)[k - 1]" in f
    n = body("osq_nwarps")
    assert "%%dynamic_smem_size" in n and "1u + dyn / (dtmk_u32)sizeof(Obs)" in n and "DTMK_OBS_SM_WARPS" in n
    k = body("dtmk_megakernel")
    guard = k.index("if (!osq_is_observer()) {          /* (each observer warp clears its own Obs")
    assert guard < k.index("((dtmk_u32 *)O.tabs)[i] = 0") < k.index("O.accs[i].cov = 0")
    o = body("osq_observer")
    assert o.index("if (kl >= Kl || k >= nw) return;") < o.index("((dtmk_u32 *)O.tabs)[i] = 0") < o.index("obs_init(P, Wk)")
    for nb, ptx_warps in ((4928, 1), (117184, 5)):            # tiny / 1b's dynamic bytes at batch 1
        assert min(gpu.OBS_SM_WARPS_MAX, 1 + nb // 29264) == ptx_warps   # sizeof(Obs) of the OBS_SM build


def test_a_round_takes_one_entry_per_lane_with_room_for_its_records():
    """Each lane builds one worker's next entry; ring slots come from shared-memory
    atomics, and the round first drains a ring without room for one record per hook and
    entry (an entry makes at most one record per hook), so no record is lost to a race."""
    o = body("osq_observer")
    room = o.index("O.maxc + (dtmk_u32)__popc(todo) > O.cap")
    assert o.index("while ((dtmk_u32)__popc(todo) > O.cap)") < room < o.index("osq_run_entry(P, Wl, rw, rt)")
    s = body("hk_store")
    obs = s[s.index("#ifdef DTMK_OBS_SM\n    if (O.vm_mask & bit)"):]
    assert "atomicAdd(&O.cnt[hook], 1u)" in obs and "atomicSub(&O.cnt[hook], 1u)" in obs
    assert "W.osq_lo = min(W.osq_lo, step)" in obs
    assert re.search(r"HK_ORDER \(\(DTMK_HOOK_DEP_RELEASE\)", SRC)        # each hook once per task


def test_the_entry_goes_before_the_release_signal_and_its_head_after():
    """No fence of its own on the critical path: the signal's MEMBAR orders the entry's
    stores before the head; a deferred (late) or comm signal gets a fence."""
    rt = body("run_task")
    i_write = rt.index("osq_write_pend(P, W); W.osq_unpub = 1;")
    i_sig = rt.index("else post_signal(P, W, sig, f.late);")
    i_pub = rt.index("osq_publish(P, W, f.late != 0 || r[0] == MK_CLS_ALLREDUCE)")
    assert rt.index("hold_light(") < i_write < i_sig < i_pub
    pub = body("osq_publish")
    assert pub.index("if (fence) __threadfence();") < pub.index("OSQ_W_HEAD")


def test_obs_pending_rises_to_the_low_bounded_by_the_oldest_entry_not_taken():
    """A worker raises its row to OSQ_W_LOW, bounded while its queue is not empty by the
    step of the entry at its tail (session 15: else no epoch became final while the
    observer lagged; tests/runtime/test_obs_sm_protocol.py checks the rule); the
    observer lowers OSQ_W_LOW to the round's record epochs and fences before the tails;
    an epoch publish (obs_sync) fences the coverage flushes before the new low."""
    r = body("osq_raise")
    assert r.index("ld_acquire(a + OSQ_W_TAIL)") < r.index("a + OSQ_W_LOW") < r.index("if (tail != W.osq_head)") \
        < r.index("__threadfence()") < r.index("OBS_PENDING")
    bound = r[r.index("if (tail != W.osq_head)"):r.index("__threadfence()")]
    # the entry's step where osq_run_entry reads it; a gate's STEP entry defers the raise
    assert "osq_entry_at((dtmk_u64 *)a, tail)" in bound and "if (tag == OSQ_TAG_STEP) return;" in bound
    assert "lo = min(lo, tag == OSQ_TAG_PEND ? d[1].w : d[3].z);" in bound
    e = body("osq_run_rec")             # (osq_run_entry loads the entry, osq_run_rec runs it)
    assert "step = d1.w;" in e and "step = c.v[3].z;" in e
    o = body("osq_observer")
    assert o.index("osq_run_entry(P, Wl, rw, rt)") < o.index("osq_publish_low(P, lo)") \
        < o.index("__threadfence();                   /* (every lane: its records") < o.index("OSQ_W_TAIL) = tail + 1")
    s = body("obs_sync")
    pub = s[s.index("#ifdef DTMK_OBS_SM\n            __threadfence();"):]
    assert pub.index("__threadfence()") < pub.index("osq_publish_low(P, keep)")


def test_workers_build_no_record_and_load_no_tables():
    f = body("hook_flush")
    assert f.index("if (!osq_is_observer())") < f.index("osq_write_pend(P, W)") < f.index("return;")
    s = body("hk_store")
    assert s.index("if (!osq_is_observer())") < s.index("osq_publish(P, W, true)") < s.index("O.vm_mask & bit")
    assert "if (!osq_is_observer()) O.reload = 0;" in SRC
    rc = body("refresh_control")
    assert "osq_ld(osq_mine(P, W) + OSQ_W_MASK)" in rc and "O.vm_mask = (dtmk_u32)m;" in rc
    # the hold the observer's programs need (request_gen read before the signal or not)
    assert "O.hold_full = (dtmk_u32)(m >> 33) & 1u;" in rc
    assert "((dtmk_u64)(O.hold_full != 0) << 33)" in body("osq_publish_tables")


def test_the_observer_ends_every_workers_rows():
    """After its last drain each observer warp ends its slice's rows and host-ring heads
    (osq_slice_end); split (-DDTMK_OSQ_SPLIT), the builder the heads, the drainer the rows."""
    e = body("osq_slice_end")
    assert "OBS_PENDING) = ~0ull" in e and "OBS_DONE) = 1" in e and "P.hook_head)[w]" in e
    o = body("osq_observer")
    assert "osq_slice_end(P, lane, k, K, nw, true, true)" in o[o.rindex("obs_sync(P, Wk, false, ~0u)"):]
    d = body("osq_drainer")
    assert "osq_slice_end(P, lane, p, K, nw, false, true)" in d[d.rindex("obs_sync(P, Wk, false, ~0u)"):]
    assert body("osq_builder").rstrip("}").rstrip().endswith("osq_slice_end(P, lane, k, K, nw, true, false);")


@pytest.mark.parametrize("k", ["48", "8", "2048", "x"])
def test_a_queue_depth_not_a_power_of_two_in_range_is_refused_by_host_and_kernel(k):
    with pytest.raises(UserError, match=f"DTMK_OSQ_N={k}: want a power of two 16..1024"):
        gpu.osq_depth_of(("DTMK_OBS_SM", f"DTMK_OSQ_N={k}"))
    if k.isdigit():
        with pytest.raises(Exception, match="DTMK_OSQ_N=K: want a power of two 16..1024"):
            nvrtc_compile(SRC, "megakernel.cu", "sm_90a", "ptx", defines=("DTMK_OBS_SM", f"DTMK_OSQ_N={k}"))


def test_a_deeper_queue_is_allocated_by_the_host_and_strided_by_the_kernel(fake_cupy):
    """-DDTMK_OSQ_N=K: K 128-byte entries per worker, one source of the depth (the define),
    read by the host's allocation (gpu.osq_depth_of) and the kernel's OSQ_W_BYTES."""
    assert gpu.osq_depth_of(("DTMK_OBS_SM",)) == gpu.OSQ_N
    mk = gpu.Megakernel(PRESETS["tiny"], batch=1, defines=("DTMK_OBS_SM", "DTMK_OSQ_N=256"))
    assert mk.osq_w_bytes == 64 + 256 * 128 and mk.buf["obsq"].size == 15 * (64 + 256 * 128)
    assert re.search(r"#define OSQ_N \(DTMK_OSQ_N\)", SRC) and "(i % OSQ_N) * 128" in SRC


def test_host_plans_one_worker_fewer_and_launches_the_observer(fake_cupy, monkeypatch):
    import contextlib
    launches = []
    fake_cupy.cuda.get_current_stream = contextlib.nullcontext
    mk = gpu.Megakernel(PRESETS["tiny"], batch=1, defines=("DTMK_OBS_SM",))
    assert (mk.num_workers, mk.grid) == (15, 16) and mk.graph.num_workers == 15
    assert mk.buf["obsq"].size == 15 * gpu.OSQ_W_BYTES
    plain = gpu.Megakernel(PRESETS["tiny"], batch=1)
    assert (plain.num_workers, plain.grid) == (16, 16) and plain.buf["obsq"].size == 8
    mk.kernel = lambda grid, block, args, shared_mem=0, stream=None: launches.append(grid)
    mk.obs_tables, mk.obs_state = 0, None
    mk._prepare(None, False, None, 2000, 16)
    ctl = np.asarray(mk.buf["control"])
    assert (int(ctl[gpu.CTL_OBSQ]) | int(ctl[gpu.CTL_OBSQ + 1]) << 32) == int(mk.buf["obsq"].data.ptr)
    mk.launch(2, 2)
    assert launches == [(16,)]
    with pytest.raises(UserError, match="need 17 SMs"):
        gpu.Megakernel(PRESETS["tiny"], batch=1, num_workers=16, defines=("DTMK_OBS_SM",))


def test_a_resident_launch_runs_the_observer_and_it_publishes_each_gate():
    """Resident (serving) launches: the host streams the host ring by each worker's
    hook_head, published before steps_done.  With the observer SM a worker's gate pushes a
    STEP entry instead; the observer, having run every earlier entry of that worker,
    writes head, drops and steps done behind a system fence.  The worker's DONE follows
    its last gate's entry; parked workers still raise OBS_PENDING; the observer reads the
    host's tail (the ring wraps while polled)."""
    g = body("gate_publish")
    obs = g[:g.index("#else")]
    assert "OSQ_TAG_STEP" in obs and "osq_publish(P, W, true)" in obs and "steps_done" not in obs
    e = body("osq_run_rec")
    step = e[e.index("c.v[0].x == OSQ_TAG_STEP"):]
    assert step.index("__threadfence_system()") < step.index("P.hook_head)[w]") < step.index("P.steps_done)[w]")
    assert "P.resident ? *((const volatile dtmk_u64 *)P.hook_tail + w) : 0" in body("osq_cursor_in")
    k = body("dtmk_megakernel")
    end = k[k.rindex("if (P.resident && ends_here) gate_publish"):]
    assert end.index("gate_publish") < end.index("OSQ_W_DONE) = 1")
    assert "OSQ_W_DONE" not in k[:k.rindex("if (P.resident && ends_here) gate_publish")]
    park = k[k.index("while ((W.gate = gate_look(P, W, step)) == 1) {"):]
    assert park.index("osq_raise(P, W, (dtmk_u32)step)") < park.index("__nanosleep(2000)")
    assert int(re.search(r"#define OSQ_TAG_STEP (0x[0-9a-f]+)u", SRC).group(1), 16) != 0xffffffff


def test_a_handoff_job_leaves_the_observer_its_sm_in_both_grids(fake_cupy, monkeypatch):
    """Megakernel(handoff=True, defines=(DTMK_OBS_SM,)): both grids are planned for SMs - 1
    workers and launch one CTA per SM; the placement map gives the last SM the id
    n_workers -- the hook grid's observer, and a lean CTA that leaves at once -- the lean
    build carries none of the observer's defines, and the queues are cleared for the hook
    grid (launched while the lean one runs)."""
    import contextlib
    import ctypes
    import types
    from test_resident_host_cpu import _Event, _Stream
    rt = fake_cupy.cuda
    real_preload = gpu.Megakernel._preload
    monkeypatch.setattr(gpu.Megakernel, "_preload", lambda self, k: None)
    monkeypatch.setattr(gpu, "probe_smids", lambda blocks, smem: list(range(blocks))[::-1])
    monkeypatch.setattr(gpu, "one_cta_per_sm", lambda fn, threads, smem: True)
    rt.runtime = types.SimpleNamespace(memcpyAsync=lambda d, s_, n, k, st: ctypes.memmove(d, s_, n),
                                       memcpyHostToDevice=1, memcpyDeviceToHost=2, deviceSynchronize=lambda: None)
    rt.alloc_pinned_memory = lambda n: bytearray(n)
    rt.Stream, rt.Event = _Stream, _Event
    rt.get_current_stream = contextlib.nullcontext
    m = gpu.Megakernel(PRESETS["tiny"], batch=2, handoff=True, defines=("DTMK_OBS_SM", "DTMK_OSQ_STATS"))
    assert (m.num_workers, m.grid) == (15, 16)
    assert {"DTMK_OBS_SM", "DTMK_OSQ_STATS", "DTMK_HANDOFF", "DTMK_SM_WORKER"} <= set(m.defines)
    assert set(m.lean_defines) == {"DTMK_NO_HOOKS", "DTMK_SM_WORKER"}
    assert list(m.sm_map) == list(range(16))        # SM 15 -> 15 == n_workers: the observer's SM
    grids = []

    def kern(tag):
        def launch(grid, block, args, shared_mem=0, stream=None):
            if tag == "lean":
                m.buf["worker_state"][:, 5] = 2          # every lean CTA started
            grids.append((tag, grid, bool(np.asarray(m.buf["obsq"]).any())))
        return launch
    m.kernel, m.lean_kernel = kern("hook"), kern("lean")
    m.buf["obsq"].fill(7)                                # a previous launch's queues
    h = m.start(3, lean=True)
    assert m.handoff(h) is True
    assert grids == [("lean", (16,), True), ("hook", (16,), False)]
    # the preload (the hook build's first launch, before any _prepare): its observer
    # finds the queues' address in control and the queues zeroed
    m.buf["control"].fill(0)
    m.buf["obsq"].fill(7)
    seen = []
    real_preload(m, lambda grid, block, args, shared_mem=0: seen.append(
        (grid, int(m.buf["control"][gpu.CTL_OBSQ]) | int(m.buf["control"][gpu.CTL_OBSQ + 1]) << 32,
         bool(np.asarray(m.buf["obsq"]).any()))))
    assert seen == [((16,), int(m.buf["obsq"].data.ptr), False)]


def test_the_map_names_the_observers_sm_and_the_lean_grid_leaves_it():
    """sm_worker: map value n_workers is the observer's SM -- the observer-SM build's CTA
    there observes (and resumes no worker), any other build's leaves at once (MK_IDLE)."""
    f = body("sm_worker")
    obs = f[f.index("const bool observers_sm = w == (int)P.n_workers;"):f.index("if (w < 0 || w >= (int)P.n_workers)")]
    assert "s_osq_obs = (dtmk_u32)(w - (int)P.n_workers) + 1u;" in obs and "W.aborted = MK_IDLE;" in obs \
        and "W.worker = 0;" in obs
    # several observers (-DDTMK_OBS_SMS=M): map values n_workers .. n_workers + M - 1
    assert "const bool observers_sm = w >= (int)P.n_workers && w < (int)P.n_workers + DTMK_OBS_SMS;" in obs
    k = body("dtmk_megakernel")
    assert "if (P.handoff_in && !W.aborted && !HO_OBSERVER) ho_resume(P, W);" in k
    assert k.index("ho_resume(P, W)") < k.index("if (W.aborted == MK_IDLE) return;") < k.index("osq_observer(P)")
    assert "s_osq_obs = blockIdx.x + DTMK_OBS_SMS >= gridDim.x ? blockIdx.x + DTMK_OBS_SMS + 1 - gridDim.x : 0u;" in k
    assert body("osq_is_observer").count("s_osq_obs") == 1


def test_bench_hooks_runs_the_observer_sm_as_build_variants():
    """bench/hooks.py --variants obssm,obssm1: the hot runs and the compiled tier (the
    observer runs the linked programs) side by side with the default build; obssm1 pins
    one observer warp (session 13's draft had one)."""
    from tests.bench_tables import hooks_table
    v, runs = hooks_table("BUILD_VARIANTS"), hooks_table("BUILD_VARIANT_RUNS")
    assert v["obssm"] == ("DTMK_OBS_SM",) and v["obssm1"] == ("DTMK_OBS_SM", "DTMK_OBS_SM_WARPS=1")
    assert "summary_cm" in runs["obssm"] and "summary" in runs["obssm1"]
    assert v["obssmin"] == ("DTMK_OBS_SM", "DTMK_OSQ_PUSH_INLINE")
    assert {"DTMK_OBS_SM", "DTMK_OBS_SM_WARPS", "DTMK_OSQ_PUSH_INLINE"} <= set(hooks_table("HOOK_ONLY_DEFINES"))
    from dtrace_mk.runtime.compiled import MK_PASS_DEFINES     # the compiled tier links them too
    assert set(gpu.OBS_SM_DEFINES) - {"DTMK_OSQ_STATS"} <= set(MK_PASS_DEFINES)


def test_workers_call_nothing_after_the_signal_unless_gen_advance_or_the_trace():
    """In the observer-SM build a worker's records go to the observer: after the release
    signal it calls hook_post only for the argmax task's gen:advance records or the
    trace, and resets the request_gen capture itself."""
    rt = body("run_task")
    obs = rt[rt.index("#ifdef DTMK_OBS_SM\n        /* the captured records went to the observer"):]
    obs = obs[:obs.index("#else")]
    assert "W.pend_rg = 0;" in obs and "if (OBS_RUN(W) && (W.trace_on || r[0] == 10)) hook_post(" in obs
    w = body("osq_write_pend")
    assert "W.osq_head - W.osq_tail < OSQ_N ? osq_entry_at(osq_mine(P, W), W.osq_head) : osq_slot(P, W)" in w


def test_the_probe_reads_the_kernels_counters(load_tool):
    """tools/obs_sm_probe.py names the counters of -DDTMK_OSQ_STATS in the kernel's order."""
    probe = load_tool("obs_sm_probe")
    assert int(re.search(r"#define OSQ_STATS_N (\d+)", OBS_SM_SRC).group(1)) == len(probe.STAT_NAMES)
    for i, name in ((0, "rounds"), (1, "entries"), (3, "room_drains"), (5, "cyc_build"), (8, "max_lag")):
        assert probe.STAT_NAMES[i] == name
    # busy: a warp's four phases over the step at the SM clock (plan 50's warp 0 of the N 16 build)
    w0 = {"rounds": 1419, "entries": 6811, "idle_scans": 20, "room_drains": 207, "max_lag": 17, "desc_records": 0,
          "cyc_scan": 214542 * 16, "cyc_build": 619170 * 16, "cyc_sync": 956169 * 16, "cyc_tail": 409517 * 16}
    assert probe.warp_busy(w0, 16, 1337.9) == pytest.approx(2199398 / (1337.9e-6 * 1980e6))   # 0.83
    rows = probe.warp_table([w0, dict(w0, cyc_sync=0)], 16, 1337.9)
    assert rows[1].endswith(" 83%") and rows[2].endswith(" 47%") and "busy" in rows[0]


def test_the_gpu_plan_names_existing_tests_builds_and_variants(load_bench):
    """tools/obs_sm_gpu_plan.sh (the next lent GPU's three calls): every file it runs
    exists, its -k selections match tests there, and the bench variants it asks for exist."""
    from tests.bench_tables import hooks_table
    root = KERNEL_DIR.parent
    plan = (root / "tools" / "obs_sm_gpu_plan.sh").read_text()
    for f in re.findall(r"(tests/gpu/\w+\.py|tools/\w+\.py|bench/\w+\.py)", plan):
        assert (root / f).exists(), f
    for f, k in re.findall(r"(tests/gpu/\w+\.py) -k (\w+)", plan):
        assert k in (root / f).read_text(), (f, k)
    variants = {"hooks": set(), "obs_split": set()}
    for script, vs in re.findall(r"bench/(hooks|obs_split)\.py[^\n\"]*--variants ([\w,]+)", plan):
        variants[script].update(vs.split(","))
    for vs in re.findall(r"\$\(osplit \d+ \d+ ([\w,]+) \w+\)", plan):   # (the plans' obs_split helper)
        variants["obs_split"].update(vs.split(","))
    for vs in re.findall(r"\$\(offpath \d+ \d+ ([\w,]+) \w+\)", plan):  # (... and bench/hooks.py --offpath's)
        variants["hooks"].update(vs.split(","))
    assert {"nopush16", "dinline", "uncapB"} <= variants["obs_split"], variants
    assert {"obssm", "obssm3", "obssm4", "offxall", "offcopyw", "offxw"} <= variants["hooks"] <= set(hooks_table("BUILD_VARIANTS")), variants
    obs_split = load_bench("obs_split")
    assert {"novm", "nolow"} <= variants["obs_split"] <= set(obs_split.VARIANTS), variants


def test_several_observer_sms_split_the_workers_between_all_their_warps():
    """-DDTMK_OBS_SMS=M: observer m's warp kl is warp k = m Kl + kl of K = M Kl, serving
    workers k, k + K, ... (every slice loop, row and counter uses k / K); a warp past the
    workers leaves (it would have no slice and no row of its own)."""
    o = body("osq_observer")
    assert "const dtmk_u32 k = (s_osq_obs - 1u) * Kl + kl, K = DTMK_OBS_SMS * Kl;" in o
    assert "if (kl >= Kl || k >= nw) return;" in o
    assert "O.osq_k = k; O.osq_nw = K;" in o and "Wk.worker = k;" in o
    assert "dtmk_osq_stats[DTMK_OBS_SMS * DTMK_OBS_SM_WARPS * OSQ_STATS_N]" in OBS_SM_SRC
    assert "O.osq_k + (threadIdx.x & 31) * O.osq_nw" in body("osq_publish_low")


@pytest.mark.slow
def test_three_observer_sms_compile_with_the_lean_grid_leaving_them_free():
    src = (KERNEL_DIR / "megakernel.cu").read_text()
    ptx = nvrtc_compile(src, "megakernel.cu", "sm_90a", "ptx",
                        defines=("DTMK_OBS_SM", "DTMK_OBS_SMS=3", "DTMK_OSQ_STATS")).decode()
    assert re.search(r"dtmk_osq_stats\[2112\]", ptx)       # bytes: 3 SMs x 8 warps x 11 u64 counters
    lean = nvrtc_compile(src, "megakernel.cu", "sm_90a", "ptx",
                         defines=("DTMK_NO_HOOKS", "DTMK_SM_WORKER", "DTMK_OBS_SMS=3")).decode()
    assert "osq_observer" not in lean and "sm_worker" in lean


def test_host_plans_m_workers_fewer_for_m_observer_sms(fake_cupy):
    mk = gpu.Megakernel(PRESETS["tiny"], batch=1, defines=("DTMK_OBS_SM", "DTMK_OBS_SMS=3"))
    assert (mk.obs_sms, mk.num_workers, mk.grid) == (3, 13, 16) and mk.graph.num_workers == 13
    assert gpu.obs_sms_of(("DTMK_OBS_SM",)) == 1 and gpu.obs_sms_of(("DTMK_OBS_SMS=4",)) == 4
    for bad in ("DTMK_OBS_SMS=0", "DTMK_OBS_SMS=x", f"DTMK_OBS_SMS={gpu.OBS_SMS_MAX + 1}"):
        with pytest.raises(UserError, match="DTMK_OBS_SMS"):
            gpu.obs_sms_of((bad,))
    with pytest.raises(UserError, match="14 workers and 3 observer"):
        gpu.Megakernel(PRESETS["tiny"], batch=1, num_workers=14, defines=("DTMK_OBS_SM", "DTMK_OBS_SMS=3"))
    # a handoff job's lean grid keeps DTMK_OBS_SMS (it leaves the observers' SMs free)
    assert "DTMK_OBS_SMS" not in gpu.OBS_SM_DEFINES
    from tests.bench_tables import hooks_table
    v = hooks_table("BUILD_VARIANTS")
    assert all(v[f"obssm{m}"] == ("DTMK_OBS_SM", f"DTMK_OBS_SMS={m}") for m in (2, 3, 4))
    from dtrace_mk.runtime.compiled import MK_PASS_DEFINES
    assert "DTMK_OBS_SMS" in MK_PASS_DEFINES


@pytest.mark.slow
def test_the_lazy_publish_build_compiles_and_publishes_before_every_raise_and_push():
    """-DDTMK_OSQ_LAZY_PUB (session 16, opt-in): a task's entry stored after its signal and
    published after the next one; a raise, another push and the worker's end publish it
    first (tests/runtime/test_obs_sm_protocol.py lazy is the protocol's model check)."""
    src = (KERNEL_DIR / "megakernel.cu").read_text()
    lazy = nvrtc_compile(src, "megakernel.cu", "sm_90a", "ptx",
                         defines=("DTMK_OBS_SM", "DTMK_OBS_SMS=4", "DTMK_OSQ_LAZY_PUB")).decode()
    assert ".entry dtmk_megakernel" in lazy and "osq_observer" in lazy
    def first_calls(fn, n):
        b = body(fn)
        return [ln.split("/*")[0].strip() for ln in b[b.index("{") + 1:].strip().splitlines()[:n]]
    # (OSQ_DEFER_FLUSH: nothing unless -DDTMK_OSQ_DEFER; then the staged entries go first)
    assert first_calls("osq_raise", 2) == ["OSQ_DEFER_FLUSH(P, W);", "osq_flush_unpub(P, W);"]
    # every push takes its slot through osq_slot or osq_write_pend, which settle first
    for fn in ("osq_slot", "osq_write_pend"):
        assert first_calls(fn, 2) == ["OSQ_DEFER_FLUSH(P, W);", "osq_settle(W);"], fn
    for fn, getter in (("hk_store", "osq_slot(P, W)"), ("hook_flush", "osq_write_pend(P, W)"),
                       ("gate_publish", "osq_slot(P, W)")):
        assert getter in body(fn), fn
    rt = body("run_task")
    after = rt[rt.index("post_signal(P, W, sig, f.late);"):]
    lz = after[after.index("#ifdef DTMK_OSQ_LAZY_PUB"):]
    assert after.index("osq_publish(P, W, f.late != 0") < after.index("#ifdef DTMK_OSQ_LAZY_PUB")
    assert "osq_write_pend(P, W); W.osq_unpub = 1;" in lz[:lz.index("#endif")]
    from tests.bench_tables import hooks_table
    assert hooks_table("BUILD_VARIANTS")["obssm4lazy"] == ("DTMK_OBS_SM", "DTMK_OBS_SMS=4", "DTMK_OSQ_LAZY_PUB")
    from dtrace_mk.runtime.compiled import MK_PASS_DEFINES
    assert "DTMK_OSQ_LAZY_PUB" in MK_PASS_DEFINES and "DTMK_OSQ_LAZY_PUB" in gpu.OBS_SM_DEFINES


@pytest.mark.slow
def test_the_deferred_entry_build_stages_after_the_signal_and_stores_in_the_wait():
    """-DDTMK_OSQ_DEFER=N (session 24, opt-in, with the lazy publish): after the release signal
    the task's entry goes to shared memory (osq_defer_stage; the N-th staged flushes at once);
    a failed poll of the next wait stores them (osq_defer_flush), as do every other push, a
    raise (first_calls above) and the worker's end; without the lazy publish it is refused
    (tests/runtime/test_obs_sm_protocol.py defer is the protocol's model check)."""
    src = (KERNEL_DIR / "megakernel.cu").read_text()
    lazy = ("DTMK_OBS_SM", "DTMK_OBS_SMS=4", "DTMK_OSQ_LAZY_PUB")
    ptx = nvrtc_compile(src, "megakernel.cu", "sm_90a", "ptx", defines=lazy + ("DTMK_OSQ_DEFER=4",)).decode()
    assert re.search(r"\.shared \.align 16 \.b8 s_osq_stage\[384\]", ptx)      # 4 entries x 96 B
    assert "osq_defer_flush" in ptx
    assert "osq_defer_flush" not in nvrtc_compile(src, "megakernel.cu", "sm_90a", "ptx", defines=lazy).decode()
    from dtrace_mk.kernels.build import CompileError
    with pytest.raises(CompileError, match="add DTMK_OSQ_LAZY_PUB"):
        nvrtc_compile(src, "megakernel.cu", "sm_90a", "ptx", defines=("DTMK_OBS_SM", "DTMK_OSQ_DEFER=4"))
    rt = body("run_task")
    after = rt[rt.index("post_signal(P, W, sig, f.late);"):]
    lz = after[after.index("#ifdef DTMK_OSQ_LAZY_PUB"):]
    lz = lz[:lz.index("#else\n        /* measurement only")]
    assert "if (W.pend) osq_defer_stage(P, W);" in lz
    st = body("osq_defer_stage")
    assert "__stcg" not in st and "if (n + 1 == (dtmk_u32)(DTMK_OSQ_DEFER)) osq_defer_flush(P, W);" in st
    fl = body("osq_defer_flush_body")
    assert fl.index("osq_settle(W);") < fl.index("__stcg") < fl.index("__threadfence();") < fl.index("OSQ_W_HEAD")
    assert "osq_defer_flush_body(P, W);" in body("osq_defer_flush")     # (the one called copy)
    we = body("wait_event")
    poll = we[we.index("if (v >= target) { W.ready = 1; break; }"):]
    # the failed poll's flush: the call unless -DDTMK_OSQ_DEFER_INLINE (session 54's measurement) inlines it
    assert poll.index("if (s_osq_nst) { OSQ_WAIT_FLUSH(P, W); continue; }") < poll.index("if (it & 15) continue;")
    assert re.search(r"#ifdef DTMK_OSQ_DEFER_INLINE\s+#define OSQ_WAIT_FLUSH\(P, W\) osq_defer_flush_body\(P, W\).*\s+"
                     r"#else\s+#define OSQ_WAIT_FLUSH\(P, W\) osq_defer_flush\(P, W\)", SRC)
    end = (KERNEL_DIR / "megakernel.cu").read_text()
    assert end.index("OSQ_DEFER_FLUSH(P, W);          /* (-DDTMK_OSQ_DEFER") < end.index(
        "*(volatile dtmk_u64 *)(osq_mine(P, W) + OSQ_W_DONE) = 1;")
    from tests.bench_tables import hooks_table
    # obssm4defer is the CLI's --observer sm build (gpu.observer_defines)
    assert hooks_table("BUILD_VARIANTS")["obssm4defer"] == lazy + (f"DTMK_OSQ_DEFER={gpu.OSQ_DEFER_DEFAULT}",)
    from dtrace_mk.runtime.compiled import MK_PASS_DEFINES
    assert "DTMK_OSQ_DEFER" in MK_PASS_DEFINES and "DTMK_OSQ_DEFER" in gpu.OBS_SM_DEFINES


def test_obs_split_variants_name_defines_the_kernel_has_and_the_compiled_tier_passes(load_bench):
    """bench/obs_split.py (plan 8): each variant's defines exist in the kernel sources and
    reach the compiled tier's link; the defaults name known variants, base first."""
    mod = load_bench("obs_split")
    src = "".join(p.read_text() for p in KERNEL_DIR.glob("*.cu*"))
    from dtrace_mk.runtime.compiled import MK_PASS_DEFINES
    for v, defs in mod.VARIANTS.items():
        for d in defs:
            name = d.split("=")[0]
            assert re.search(rf"\b{name}\b", src), (v, name)
            assert name in MK_PASS_DEFINES, (v, name)
    dv = mod.DEFAULT_VARIANTS.split(",")
    assert dv[0] == "base" and set(dv) <= set(mod.VARIANTS)


def test_a_worker_finds_its_queue_words_in_its_worker_state():
    """Session 17: a worker's pushes, raises and mask reads take its queue area from W
    (osq_mine; set once sm_worker's placement fixed the worker index), not from the
    control words at every use -- that load missed L1 after every wait's acquire.  Only
    the measurement-only -DDTMK_OSQ_AREA_CTL goes back to it."""
    obs = (KERNEL_DIR / "mk_observer.cuh").read_text()
    mine = obs[obs.index("osq_mine(const MkParams"):]
    mine = mine[:mine.index("\n}") + 2]
    assert "return W.osq_area;" in mine and "#ifndef DTMK_OSQ_AREA_CTL" in mine
    worker_side = [body(f) for f in ("osq_slot", "osq_write_pend", "osq_raise")]
    for b in worker_side:
        assert "osq_w(P" not in b and "osq_entry(P" not in b and "osq_mine(P, W)" in b, b[:80]
    mk = (KERNEL_DIR / "megakernel.cu").read_text()
    assert mk.index("sm_worker(P, W);") < mk.index("W.osq_area = osq_w(P, W.worker);")
    assert "osq_w(P, W.worker)" not in mk.replace("W.osq_area = osq_w(P, W.worker);", "")


OBSSM4DESC = ("DTMK_OBS_SM", "DTMK_OBS_SMS=4", "DTMK_OSQ_LAZY_PUB", "DTMK_OSQ_DESC")


@pytest.mark.slow
def test_the_descriptor_shadow_build_compiles_with_four_observer_warps_on_1b():
    """-DDTMK_OSQ_DESC (session 18, opt-in): each observer warp's Obs carries a shadow (6.8 KB
    more), so 1b's dynamic shared memory holds one Obs fewer: 4 observer warps per SM (5 without)."""
    ptx = nvrtc_compile((KERNEL_DIR / "megakernel.cu").read_text(), "megakernel.cu", "sm_90a", "ptx",
                        defines=OBSSM4DESC + ("DTMK_ROPE_IN_ATTN",)).decode()
    assert "osq_desc_records" in ptx and "osq_observer" in ptx
    size = int(re.search(r"\.shared \.align 16 \.b8 O_w0\[(\d+)\]", ptx).group(1))
    assert size == 36048
    assert min(gpu.OBS_SM_WARPS_MAX, 1 + 117184 // size) == 4


def test_observers_run_descriptors_into_the_shadow_and_flush_it_before_an_epoch_ends():
    """The descriptor programs run over each ring batch before the VM (which skips them:
    they keep DTMK_PROG_F_INLINE); the shadow moves into the maps before the coverage
    accumulators and the low are published, and while it holds an epoch that epoch stays
    held (keep starts at sh_lo): a snapshot never sees an epoch final without its values."""
    sync = body("obs_sync")
    assert sync.index("osq_desc_records(O.tabs, O.ring + b + w") < sync.index("DTMK_RUN_RECORDS(")
    assert "OSQ_SH_LO < step" in sync
    flush = sync.index("if (O.sh_lo < step) {")
    assert flush < sync.index("keep = O.sh_lo;") < sync.index("dtmk_cov_acc_flush(a)") < sync.index("osq_publish_low(P, keep)")
    assert "dtmk_sh_flush(&O.sh, O.tabs, O.accs, lane, 32)" in sync[flush:flush + 200]
    assert "if (O.tabs[h].progs[k].flags & DTMK_PROG_F_DESC) O.tabs[h].progs[k].flags &= ~DTMK_PROG_F_SERIAL;" in sync
    run = body("osq_desc_records")
    assert "dtmk_run_prog<osq_desc_exec_step>" in run and "&O.sh, h * DTMK_MAX_PROGS + k" in run
    assert "if (lane == 0 && lo < O.sh_lo) O.sh_lo = lo;" in run
    inl = (KERNEL_DIR / "bpf_inline.cuh").read_text()
    mt = inl[inl.index("dtmk_sh_get_mt("):]
    assert "atomicCAS((unsigned long long *)&e->map, 0ull, DTMK_SH_BUSY)" in mt[:1500]
    assert gpu.runs_descriptors(OBSSM4DESC) and gpu.runs_descriptors(("DTMK_SITE_FORM",))
    assert not gpu.runs_descriptors(OBSSM4DESC[:3]) and not gpu.runs_descriptors(("DTMK_OSQ_DESC",))
    assert "DTMK_OSQ_DESC" in gpu.OBS_SM_DEFINES
    from tests.bench_tables import hooks_table
    assert hooks_table("BUILD_VARIANTS")["obssm4desc"] == OBSSM4DESC


def test_several_entries_per_round_only_for_task_entries_without_a_host_ring():
    """-DDTMK_OSQ_MULTI=D (session 26, opt-in): a worker's backlog runs on up to D lanes of a
    round.  A lane at d > 0 takes only a task entry (OSQ_TAG_PEND: a step gate or a worker-built
    record stays a round of its own) and only while no host ring takes records (its cursor is per
    worker, in entry order); a lane runs only if every lane before it in its worker's backlog
    does (a prefix), and lane i stores its worker's tail once, by the count taken.  The
    protocol itself: tests/runtime/test_obs_sm_protocol.py (multi)."""
    src = OBS_SM_SRC[OBS_SM_SRC.index("/* -DDTMK_OSQ_MULTI=D: a worker's backlog"):]
    src = src[:src.index("#endif")]
    assert "if (D > 1 && !O.ring_mask)" in src
    assert "if (want && d > 0) want = mc.v[0].x == OSQ_TAG_PEND;" in src
    assert "for (dtmk_u32 e = 0; e < d; ++e) want = want && ((wm >> (i + e * ng)) & 1u);" in src
    tail = OBS_SM_SRC[OBS_SM_SRC.index("lane i: its worker's entries this round"):]
    tail = tail[:tail.index("#else")]
    assert "if (lane < ng && taken) *(volatile dtmk_u64 *)(osq_w(P, w) + OSQ_W_TAIL) = tail + taken;" in tail
    # without the define the round is the one it was: one entry per lane, its own tail + 1
    assert "if ((todo >> lane) & 1u) *(volatile dtmk_u64 *)(osq_w(P, w) + OSQ_W_TAIL) = tail + 1;" in OBS_SM_SRC
    assert "DTMK_OSQ_MULTI" in gpu.OBS_SM_DEFINES       # (the compiled tier's linked build passes it on)


def _multi_round(ng, multi, backlog, pend, cap):
    """A transcription of osq_observer's -DDTMK_OSQ_MULTI lane choice for one round (the lines
    test_several_entries_per_round_only_for_task_entries_without_a_host_ring pins): ng workers,
    worker i with backlog[i] entries whose kinds pend[i][d] (True: OSQ_TAG_PEND), the ring's
    room cut to `cap` lanes.  Returns (the lanes' (worker, d), each worker's tail advance)."""
    D = min(multi, 32 // ng)
    want = [False] * 32
    for lane in range(32):
        i, d = lane % ng, lane // ng
        want[lane] = d < D and d < backlog[i] and (d == 0 or pend[i][d])
    wm = want[:]
    todo = []
    for lane in range(32):
        i, d = lane % ng, lane // ng
        w = want[lane] and all(wm[i + e * ng] for e in range(d))
        todo.append(w)
    while sum(todo) > cap:                      # the room cut: the highest lane first
        todo[max(lane for lane in range(32) if todo[lane])] = False
    lanes = [(lane % ng, lane // ng) for lane in range(32) if todo[lane]]
    taken = [sum(todo[e] for e in range(i, 32, ng)) for i in range(ng)]
    return lanes, taken


def test_a_multi_round_runs_a_prefix_of_each_backlog_and_advances_each_tail_by_it():
    import itertools
    for ng in (1, 2, 5, 6, 16, 17):
        for multi in (2, 4, 8):
            for cap in (32, 7, 3):
                for pattern in itertools.product((0, 1, 3, 6), repeat=min(ng, 3)):
                    backlog = [pattern[i % len(pattern)] for i in range(ng)]
                    # worker i's entry d is a gate / worker-built record (not PEND) when d == i % 4 + 1
                    pend = [[d != i % 4 + 1 for d in range(8)] for i in range(ng)]
                    lanes, taken = _multi_round(ng, multi, backlog, pend, cap)
                    assert len(lanes) <= cap and len(set(lanes)) == len(lanes)
                    for i in range(ng):
                        ds = sorted(d for w, d in lanes if w == i)
                        assert ds == list(range(len(ds))) and taken[i] == len(ds)   # a prefix, counted once
                        assert len(ds) <= min(backlog[i], multi, 32 // ng)
                        assert all(pend[i][d] for d in ds if d > 0)               # only task entries join
                        if cap == 32 and backlog[i]:
                            assert ds, "a worker with a backlog gets its oldest entry"
                            stop = next((d for d in range(1, backlog[i]) if not pend[i][d]), backlog[i])
                            assert len(ds) == min(stop, multi, 32 // ng)          # as many as allowed


def test_the_split_build_s_handoff_area_is_the_hosts(fake_cupy):
    """-DDTMK_OSQ_SPLIT (session 35): the builder / drainer blocks after the workers' queues --
    one source per size (megakernel.cu OSQ_SPLIT_NH / OSQ_BLK_HDR / OBS_RING, gpu.py's copy),
    allocated by the host only for that build, refused with an odd number of observer SMs."""
    val = lambda name: re.search(r"#define " + name + r" ([^\n/]+)", SRC).group(1).strip()  # noqa: E731
    assert (int(val("OSQ_SPLIT_NH")), int(val("OSQ_BLK_HDR")), int(val("OBS_RING"))) == \
        (gpu.OSQ_SPLIT_NH, gpu.OSQ_BLK_HDR, gpu.OBS_RING)
    assert val("OSQ_PAIR_BYTES") == "(128 + OSQ_SPLIT_NH * OSQ_BLK_BYTES)"
    assert val("OSQ_BLK_BYTES") == "(OSQ_BLK_HDR + OBS_RING * 128)"
    words = [int(val(w)) for w in ("OSQ_P_HEAD", "OSQ_P_TAIL", "OSQ_P_SEQ", "OSQ_P_MASK", "OSQ_P_GEN", "OSQ_P_DONE")]
    assert sorted(words) == list(range(6))                  # a pair's words, each once, within its 128 bytes
    # the header's commit list (u32 words 32 + i, u64 words 32 + i, i < 32) ends inside OSQ_BLK_HDR
    assert (32 + 32) * 8 <= gpu.OSQ_BLK_HDR and "((dtmk_u64 *)b)[32 + i] = pc" in OBS_SM_SRC
    split = gpu.observer_defines("sm") + ("DTMK_OSQ_SPLIT",)
    mk = gpu.Megakernel(PRESETS["tiny"], batch=1, defines=split)
    n = mk.num_workers
    cursors = (n * 8 + 127) // 128 * 128
    assert mk.buf["obsq"].size == n * gpu.OSQ_W_BYTES + cursors + 2 * gpu.OBS_SM_WARPS_MAX * gpu.OSQ_PAIR_BYTES
    plain = gpu.Megakernel(PRESETS["tiny"], batch=1, defines=gpu.observer_defines("sm"))
    assert plain.buf["obsq"].size == plain.num_workers * gpu.OSQ_W_BYTES
    with pytest.raises(UserError, match="DTMK_OSQ_SPLIT: an even number of observer SMs"):
        gpu.Megakernel(PRESETS["tiny"], batch=1, defines=gpu.observer_defines("sm", 3) + ("DTMK_OSQ_SPLIT",))
    for bad in (("DTMK_OBS_SMS=3",), ("DTMK_OBS_SMS=4", "DTMK_OSQ_MULTI=2"), ("DTMK_OBS_SMS=4", "DTMK_OSQ_IDLE_DRAIN=4"),
                ("DTMK_OBS_SMS=4", "DTMK_OSQ_DESC")):
        with pytest.raises(Exception, match="DTMK_OSQ_SPLIT: an even DTMK_OBS_SMS"):
            nvrtc_compile(SRC, "megakernel.cu", "sm_90a", "ptx", defines=("DTMK_OBS_SM", "DTMK_OSQ_SPLIT") + bad)


def test_the_split_s_drainer_moves_the_tails_only_after_the_low_and_the_builder_never():
    """The protocol the model checks (tests/runtime/test_obs_sm_protocol.py split): the builder
    reads entries at its own cursor and never stores a tail; the drainer lowers OSQ_W_LOW from
    the block's records, fences, then moves the tails; a reload block drains under the old tables."""
    b = body("osq_builder")
    d = body("osq_drainer")
    assert "OSQ_W_TAIL" not in b and "osq_bcur(P, w) = cur + 1" in b
    assert "osq_run_entry(P, Wl, w, cur)" in b and "obs_sync" not in b
    assert b.index("if (pn) OSQ_HAND_OVER(0u);\n                OSQ_HAND_OVER(OSQ_BLK_RELOAD);") \
        < b.index("seq = osq_adopt(pr, seq)")
    # a block is handed over before the builder ends (all_done) and before it switches group
    assert "if (pn && (all_done || !any ||" in b and "if (pn && pg != g0) OSQ_HAND_OVER(0u);" in b
    low, fence, tail = d.index("osq_publish_low(P, low)"), d.index("__threadfence();\n            for (dtmk_u64 i = ht"), \
        d.index("+ OSQ_W_TAIL) = __ldcg((const dtmk_u64 *)b + 32 + lane)")
    assert low < fence < tail
    assert d.index("if (lane == 0) O.reload = 1;") < d.index("osq_pair_publish(pr, ++seq)")
    assert "run_entry" not in d and "hook_flush" not in d


def test_a_waiting_worker_raises_no_further_than_the_step_it_waits_for():
    """Session 54: osq_raise is bounded by the awaited task's step (so the next task's hold
    stores nothing before its release signal; the protocol model: test_obs_sm_protocol.py
    capped) -- unless the measurement build asks for the old raise -- and every call passes
    the wait's or the gate's step."""
    r = body("osq_raise")
    assert re.search(r"#ifndef DTMK_OSQ_RAISE_UNCAPPED\s+lo = min\(lo, cap\);\s+#endif\s+if \(lo == O.pub\) return;", r), r
    calls = re.findall(r"osq_raise\(P, W(.*?)\);", SRC)
    assert len(calls) == 2 and all(c == ", (dtmk_u32)step" for c in calls), calls
