"""The observer-warp build of the megakernel (-DDTMK_OBS_WARP, docs/dev/hook_cost_analysis.md
round 6): a 17th warp per CTA builds and stores the hook records and runs the VM /
compiled programs; the 16 compute warps synchronize on a named barrier (MK_SYNC).
NVRTC + nvJitLink run without a GPU; the exactness on the device is tests/gpu
(test_hot_attach.py, test_obs_ring.py, parametrized over this build)."""
from __future__ import annotations

import re

import pytest

from dtrace_mk.kernels import KERNEL_DIR
from dtrace_mk.megakernel import gpu
from dtrace_mk.runtime import compiled as C

OBS = ("DTMK_OBS_WARP",)


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("DTRACE_MK_CACHE", str(tmp_path_factory.getbasetemp() / "obs_warp_cache"))


def _ptx(defines):
    pytest.importorskip("cuda.bindings.nvrtc")
    from dtrace_mk.kernels import build
    return build.nvrtc_compile((KERNEL_DIR / "megakernel.cu").read_text(), "megakernel.cu", "sm_90a", "ptx",
                               tuple(defines)).decode(errors="replace")


def test_block_size_comes_from_the_defines():
    assert gpu.block_threads(()) == gpu.MK_THREADS == 512
    assert gpu.block_threads(("DTMK_COMPILED_TIER",)) == 512
    assert gpu.block_threads(OBS) == gpu.block_threads(OBS + ("DTMK_OBS_MAXNREG=120",)) == 544


def test_compute_sources_use_mk_sync_and_mk_threads():
    """Every compute barrier excludes the observer warp (MK_SYNC) and every block-strided
    loop of the task bodies counts the compute threads (MK_THREADS), never blockDim.x."""
    for f in ("mk_ops.cuh", "mk_comm.cuh", "mk_common.cuh"):
        src = (KERNEL_DIR / f).read_text()
        assert "blockDim" not in src, f
        assert not re.search(r"__syncthreads\(\)\s*;", src.replace("#define MK_SYNC() __syncthreads()", "")
                             .replace("#define MK_SYNC_ALL() __syncthreads()", "")), f
    mk = (KERNEL_DIR / "megakernel.cu").read_text()
    assert "__syncthreads()" not in mk            # MK_SYNC (compute) / MK_SYNC_ALL (prologue, join)


def test_obs_warp_ptx_launch_bounds_and_named_barrier():
    d, o = _ptx(()), _ptx(OBS)
    assert re.search(r"\.maxntid 512, 1, 1", d) and re.search(r"\.maxntid 544, 1, 1", o)
    assert "bar.sync 1, 512" in o and "bar.sync 1, 512" not in d
    for fn in ("obs_warp", "obs_build_flush", "obsq_push"):       # observer code only in the variant
        assert fn in o and fn not in d, fn


def test_obs_warp_variants_compile():
    pytest.importorskip("cuda.bindings.nvrtc")
    cub = gpu.compile_source("sm_90a", "cubin", defines=OBS, use_cache=False)
    assert cub[:4] == b"\x7fELF" and b"dtmk_megakernel" in cub
    lto = gpu.compile_source("sm_90a", "ltoir", defines=OBS + ("DTMK_COMPILED_TIER",), use_cache=False)
    assert len(lto) > 1000
    with pytest.raises(Exception, match="DTMK_OBS_WARP needs the hook code"):
        gpu.compile_source("sm_90a", "cubin", defines=OBS + ("DTMK_NO_HOOKS",), use_cache=False)


def test_obs_warp_compiled_tier_spec_and_stage1_link():
    """The compiled tier of an observer-warp Megakernel links the same build (its
    defines, register limit 96) with the summary monitor."""
    assert C.megakernel_spec(()) is C.MEGAKERNEL_SPEC
    spec = C.megakernel_spec(OBS)
    assert spec.defines == C.MK_DEFINES + OBS and spec.maxrreg == C.MK_OBS_MAXRREG
    assert spec.key("sm_90a") != C.MEGAKERNEL_SPEC.key("sm_90a")
    assert C.megakernel_spec(OBS + ("DTMK_OBS_MAXNREG=120",)).maxrreg == 120
    if not C.nvjitlink_available():
        pytest.skip("nvJitLink is not installed")
    from dtrace_mk.runtime.live import link_megakernel, summary_monitor
    mon = summary_monitor()
    rt = C.HostCompiledRuntime(4)
    rt.attach(mon.obj)
    cubin, _ = link_megakernel(rt.monitor(), "sm_90a", stage=1, defines=OBS)
    assert cubin[:4] == b"\x7fELF" and b"dtmk_megakernel" in cubin and b"dtmk_cm_run_records" in cubin
