"""The off-copy build of the megakernel (-DDTMK_OFF_COPY, docs/dev/hook_cost_analysis.md
round 7): run_task and wait_event are compiled twice (template <bool OBS>), the caller picks
the copy from W.observe at every call, and the OBS = false copy carries no per-task hook or
observer site -- only the control refresh and the spin's CTL_GEN check that let a hot attach
switch a worker to the observing copy.  NVRTC runs without a GPU; exactness and hot attach on
the device are tests/gpu/test_hot_attach.py (parametrized over this build)."""
from __future__ import annotations

import re

import pytest

from dtrace_mk.kernels import KERNEL_DIR
from dtrace_mk.megakernel import gpu

OFF = ("DTMK_OFF_COPY",)
#: cold hook / observer functions the per-task path of the observing copy may call
HOOK_FNS = ("hook_hold", "hook_post", "hook_event", "obs_first_look", "obs_spin_drain")

_PTX = {}


def _ptx(defines):
    pytest.importorskip("cuda.bindings.nvrtc")
    from dtrace_mk.kernels import build
    if defines not in _PTX:
        _PTX[defines] = build.nvrtc_compile((KERNEL_DIR / "megakernel.cu").read_text(), "megakernel.cu", "sm_90a",
                                            "ptx", tuple(defines)).decode(errors="replace")
    return _PTX[defines]


def _funcs(ptx: str) -> dict:
    """mangled .func name -> its PTX body (up to the closing brace at column 0)."""
    out = {}
    for m in re.finditer(r"^\.func\s+(?:\([^)]*\)\s*)?(\w+)\(", ptx, re.M):
        end = ptx.find("\n}\n", m.end())
        out[m.group(1)] = ptx[m.end():end]
    return out


def _calls(body: str) -> set:
    return set(re.findall(r"call(?:\.uni)?\s*(?:\([^)]*\),\s*)?(\w+),", body))


def test_two_copies_and_the_off_copy_has_no_hook_site():
    f = _funcs(_ptx(OFF))
    for base in ("run_task", "wait_event"):
        on = [n for n in f if base + "ILb1E" in n]
        off = [n for n in f if base + "ILb0E" in n]
        assert len(on) == 1 and len(off) == 1, (base, sorted(f))
        called_on = _calls(f[on[0]])
        called_off = _calls(f[off[0]])
        for h in HOOK_FNS:
            assert not any(h in c for c in called_off), (base, h, called_off)
        assert any(any(h in c for h in HOOK_FNS) for c in called_on), (base, called_on)
    # hot attach still works from the off copy: the spin's generation check and the reload
    # drain (obs_sync_cta on the break path) stay in wait_event<false>
    we_off = f[[n for n in f if "wait_eventILb0E" in n][0]]
    assert any("obs_sync_cta" in c for c in _calls(we_off))


def test_default_build_has_one_copy():
    f = _funcs(_ptx(()))
    assert not any("ILb0E" in n or "ILb1E" in n for n in f if "run_task" in n or "wait_event" in n)
    assert any("run_task" in n for n in f) and any("wait_event" in n for n in f)


def test_off_copy_builds_compile_and_obs_warp_is_refused():
    pytest.importorskip("cuda.bindings.nvrtc")
    for d in (OFF, ("DTMK_NO_HOOKS",) + OFF):
        cub = gpu.compile_source("sm_90a", "cubin", defines=d, use_cache=False)
        assert cub[:4] == b"\x7fELF" and b"dtmk_megakernel" in cub, d
    with pytest.raises(gpu.CompileError, match="DTMK_OFF_COPY"):
        gpu.compile_source("sm_90a", "ptx", defines=OFF + ("DTMK_OBS_WARP",), use_cache=False)
    assert gpu.block_threads(OFF) == gpu.MK_THREADS


def test_bench_knows_the_variant():
    import importlib.util
    spec = importlib.util.spec_from_file_location("bench_hooks", KERNEL_DIR.parents[0] / "bench" / "hooks.py")
    assert spec is not None
    src = (KERNEL_DIR.parents[0] / "bench" / "hooks.py").read_text()
    assert 'BUILD_VARIANTS["offcopy"] = ("DTMK_OFF_COPY",)' in src and "--offpath" in src
