"""DTMK_REC_FAST (docs/dev/hook_cost_analysis.md round 8; the default since session 4,
-DDTMK_REC_GLOBAL builds the old path): the hook code reads the running task's record from
wait_event's shared copy (s_rec) instead of the global table.
NVRTC + nvJitLink run without a GPU; record equality on the device is
tests/gpu/test_rec_fast_gpu.py (and test_hot_attach.py / test_obs_ring.py, parametrized)."""
from __future__ import annotations

import pytest

from dtrace_mk.kernels import build
from dtrace_mk.megakernel import gpu
from dtrace_mk.runtime import compiled as C

FAST = ("DTMK_REC_FAST",)
GLOBAL = ("DTMK_REC_GLOBAL",)


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("DTRACE_MK_CACHE", str(tmp_path_factory.getbasetemp() / "rec_fast_cache"))


def _func(ptx, name):
    body = build.ptx_function(ptx, name)
    assert body, name
    return body


def test_rec_fast_compiles_and_refuses_other_layouts():
    pytest.importorskip("cuda.bindings.nvrtc")
    cub = gpu.compile_source("sm_90a", "cubin", defines=FAST, use_cache=False)
    assert cub[:4] == b"\x7fELF" and b"dtmk_megakernel" in cub
    for other in ("DTMK_NO_HOOKS", "DTMK_REC_LATE"):
        with pytest.raises(Exception, match="DTMK_REC_FAST needs"):
            gpu.compile_source("sm_90a", "cubin", defines=FAST + (other,), use_cache=False)
    with pytest.raises(Exception, match="exclude each other"):
        gpu.compile_source("sm_90a", "cubin", defines=FAST + GLOBAL, use_cache=False)


def test_rec_fast_is_the_default(megakernel_ptx):
    """The default build IS the explicit-define build (identical PTX); the old path differs."""
    d, f, g = (build.ptx_canonical(megakernel_ptx(defs)) for defs in ((), FAST, GLOBAL))
    assert d == f and d != g


def test_rec_fast_hook_hold_reads_the_shared_copy(megakernel_ptx):
    """Only REC_FAST's hook_hold / hook_flush select the shared record (s_rec, whose
    holder O.rec_t the observing first look sets); the old path's (REC_GLOBAL) do not."""
    d, f = megakernel_ptx(GLOBAL), megakernel_ptx(())
    for fn in ("hook_hold", "hook_flush"):
        assert "s_rec" in _func(f, fn), fn
        assert "s_rec" not in _func(d, fn), fn
    assert "s_rec_t" in _func(f, "obs_first_look") and "s_rec_t" not in _func(d, "obs_first_look")


def test_rec_fast_compiled_tier_links_the_same_build():
    spec = C.megakernel_spec(GLOBAL)
    assert spec.defines == C.MK_DEFINES + GLOBAL and spec.maxrreg == C.MEGAKERNEL_SPEC.maxrreg
    assert spec.key("sm_90a") != C.MEGAKERNEL_SPEC.key("sm_90a")
    assert C.megakernel_spec(()) is C.MEGAKERNEL_SPEC
    pytest.importorskip("cuda.bindings.nvrtc")
    lto = gpu.compile_source("sm_90a", "ltoir", defines=GLOBAL + ("DTMK_COMPILED_TIER",), use_cache=False)
    assert len(lto) > 1000
    if not C.nvjitlink_available():
        pytest.skip("nvJitLink is not installed")
    from dtrace_mk.runtime.live import link_megakernel, summary_monitor
    rt = C.HostCompiledRuntime(4)
    rt.attach(summary_monitor().obj)
    cubin, _ = link_megakernel(rt.monitor(), "sm_90a", stage=1, defines=GLOBAL)
    assert cubin[:4] == b"\x7fELF" and b"dtmk_cm_run_records" in cubin


def test_record_cost_bench_kernel_compiles_and_chases_cycles(load_bench):
    """bench/record_cost.py (the round-8 microbenchmark): its kernel compiles for sm_90a,
    every hot chase visits the CTA's 16 lines once per cycle, the cold chase all lines."""
    rc = load_bench("record_cost")
    hot, cold = rc.hot_table(3), rc.chase_table(256)
    for c in range(3):
        j, seen = c * 16, set()
        for _ in range(16):
            seen.add(j)
            j = int(hot[j, 0])
        assert j == c * 16 and seen == set(range(c * 16, c * 16 + 16))
    j, seen = 0, set()
    for _ in range(256):
        seen.add(j)
        j = int(cold[j, 0])
    assert j == 0 and len(seen) == 256
    pytest.importorskip("cuda.bindings.nvrtc")
    from dtrace_mk.kernels import build
    assert build.nvrtc_compile(rc.SRC, "rc.cu", "sm_90a", "cubin", ())[:4] == b"\x7fELF"
