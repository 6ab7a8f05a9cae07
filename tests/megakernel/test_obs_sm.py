"""CI (no GPU): the observer SM (-DDTMK_OBS_SM; a DRAFT of session 13, exact on the H200
(tests/gpu/test_hot_attach.py *obssm*) but slow -- kernels/megakernel.cu "observer SM",
docs/dev/hook_cost_analysis.md "Session 13").
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
@pytest.mark.parametrize("defines", [("DTMK_OBS_SM",), ("DTMK_OBS_SM", "DTMK_ROPE_IN_ATTN")], ids=["tiny", "1b"])
def test_the_observer_sm_build_compiles(defines):
    ptx = nvrtc_compile((KERNEL_DIR / "megakernel.cu").read_text(), "megakernel.cu", "sm_90a", "ptx",
                        defines=defines).decode()
    assert ".entry dtmk_megakernel" in ptx and "osq_observer" in ptx


@pytest.mark.parametrize("other", ["DTMK_NO_HOOKS", "DTMK_HANDOFF", "DTMK_SITE_FORM", "DTMK_COMPILED_TIER"])
def test_unsupported_combinations_are_refused_at_compile_time(other):
    with pytest.raises(Exception, match="DTMK_OBS_SM"):
        nvrtc_compile((KERNEL_DIR / "megakernel.cu").read_text(), "megakernel.cu", "sm_90a", "ptx",
                      defines=("DTMK_OBS_SM", other))


def test_queue_layout_is_the_hosts():
    val = lambda name: re.search(r"#define " + name + r" ([^\n/]+)", SRC).group(1).strip()  # noqa: E731
    assert int(val("OSQ_N")) == gpu.OSQ_N and int(val("OSQ_HDR_BYTES")) == gpu.OSQ_HDR_BYTES
    assert val("OSQ_W_BYTES") == "(64 + OSQ_N * 128)" and gpu.OSQ_W_BYTES == 64 + gpu.OSQ_N * 128
    assert int(val("CTL_OBSQ")) == gpu.CTL_OBSQ and gpu.CTL_OBSQ + 1 < gpu.CTL_WORDS
    assert gpu.CTL_OBSQ not in (gpu.CTL_SM_MAP, gpu.CTL_SM_MAP + 1)


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


def test_obs_pending_rises_only_after_the_observer_consumed_the_queue():
    r = body("osq_raise")
    assert r.index("OSQ_W_TAIL) != W.osq_head") < r.index("->low") < r.index("__threadfence()") \
        < r.index("OBS_PENDING")
    run = body("osq_run_worker")
    assert run.index("hook_flush(P, W)") < run.index("__threadfence();") < run.index("OSQ_W_TAIL) = tail")


def test_workers_build_no_record_and_load_no_tables():
    f = body("hook_flush")
    assert f.index("if (!osq_is_observer())") < f.index("osq_write_pend(P, W)") < f.index("return;")
    s = body("hk_store")
    assert s.index("if (!osq_is_observer())") < s.index("osq_publish(P, W, true)") < s.index("O.vm_mask & bit")
    assert "if (!osq_is_observer()) O.reload = 0;" in SRC
    assert "O.vm_mask = ld_volatile_u32(&osq_hdr(P)->mask)" in body("refresh_control")


def test_the_observer_ends_every_workers_rows():
    o = body("osq_observer")
    end = o[o.rindex("obs_sync(P, W, false, ~0u)"):]
    assert "OBS_PENDING) = ~0ull" in end and "OBS_DONE) = 1" in end and "P.hook_head)[w]" in end


def test_host_plans_one_worker_fewer_and_launches_the_observer(fake_cupy, monkeypatch):
    import contextlib
    launches = []
    fake_cupy.cuda.get_current_stream = contextlib.nullcontext
    mk = gpu.Megakernel(PRESETS["tiny"], batch=1, defines=("DTMK_OBS_SM",))
    assert (mk.num_workers, mk.grid) == (15, 16) and mk.graph.num_workers == 15
    assert mk.buf["obsq"].size == gpu.OSQ_HDR_BYTES + 15 * gpu.OSQ_W_BYTES
    plain = gpu.Megakernel(PRESETS["tiny"], batch=1)
    assert (plain.num_workers, plain.grid) == (16, 16) and plain.buf["obsq"].size == 8
    mk.kernel = lambda grid, block, args, shared_mem=0, stream=None: launches.append(grid)
    mk.obs_tables, mk.obs_state = 0, None
    mk._prepare(None, False, None, 2000, 16)
    ctl = np.asarray(mk.buf["control"])
    assert (int(ctl[gpu.CTL_OBSQ]) | int(ctl[gpu.CTL_OBSQ + 1]) << 32) == int(mk.buf["obsq"].data.ptr)
    mk.launch(2, 2)
    assert launches == [(16,)]
    with pytest.raises(UserError, match="DTMK_OBS_SM"):
        gpu.Megakernel(PRESETS["tiny"], batch=1, defines=("DTMK_OBS_SM", "DTMK_SM_WORKER"))
    with pytest.raises(UserError, match="DTMK_OBS_SM"):
        mk.start_resident()


def test_bench_hooks_runs_the_draft_as_a_build_variant():
    """bench/hooks.py --variants obssm: its hot runs side by side with the default build
    (no compiled tier in the draft: the kernel #errors with DTMK_COMPILED_TIER)."""
    from tests.bench_tables import hooks_table
    assert hooks_table("BUILD_VARIANTS")["obssm"] == ("DTMK_OBS_SM",)
    assert "summary_cm" not in hooks_table("BUILD_VARIANT_RUNS")["obssm"]
    assert "DTMK_OBS_SM" in hooks_table("HOOK_ONLY_DEFINES")
