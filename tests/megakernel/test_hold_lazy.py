"""CI (no GPU): the -DDTMK_HOLD_LAZY variant (docs/dev/hook_cost_analysis.md "Session 8":
no pre-signal hold work that no loaded program reads) compiles with every build it joins,
keeps the noinline hook_hold for the cases that need it (a host ring, request_gen read,
comm:wait observed), and adds nothing to the default build.  Its exactness runs on the GPU
(tests/gpu/test_hot_attach.py, build id "holdlazy")."""

import re

import pytest

from dtrace_mk.kernels.build import nvrtc_compile, ptx_function
from dtrace_mk.megakernel.gpu import KERNEL_DIR


@pytest.fixture(scope="module")
def ptxs():
    src = (KERNEL_DIR / "megakernel.cu").read_text()
    return {d: nvrtc_compile(src, "megakernel.cu", "sm_90a", "ptx", defines=d).decode()
            for d in ((), ("DTMK_HOLD_LAZY",), ("DTMK_HOLD_LAZY", "DTMK_COMPILED_TIER"))}


def _obs_bytes(ptx: str) -> int:
    m = re.search(r"\.shared \.align \d+ \.b8 O\[(\d+)\];", ptx)
    assert m, "the observer's shared struct O is not in the PTX"
    return int(m.group(1))


def _run_task(ptx: str) -> str:
    name = next(n for n in re.findall(r"\.func\s+(?:\([^)]*\)\s*)?(\w*run_task\w*)", ptx))
    return ptx_function(ptx, name)


def test_variant_adds_one_word_and_keeps_the_full_hold(ptxs):
    base, lazy = ptxs[()], ptxs[("DTMK_HOLD_LAZY",)]
    assert 0 <= _obs_bytes(lazy) - _obs_bytes(base) <= 16          # O.hold_full (in padding or + alignment)
    for ptx in (base, lazy, ptxs[("DTMK_HOLD_LAZY", "DTMK_COMPILED_TIER")]):
        assert "hook_hold" in _run_task(ptx)                        # the full hold is still called
    # the lazy build reads the flag in run_task; the default build has no such branch
    assert _run_task(lazy).count("ld.shared") > _run_task(base).count("ld.shared")


def test_variant_compiles_to_cubin_and_without_hooks():
    src = (KERNEL_DIR / "megakernel.cu").read_text()
    for d in (("DTMK_HOLD_LAZY",), ("DTMK_HOLD_LAZY", "DTMK_NO_HOOKS")):
        assert nvrtc_compile(src, "megakernel.cu", "sm_90a", "cubin", defines=d)[:4] == b"\x7fELF"
