"""CI (no GPU): the -DDTMK_VM_CODE_SMEM variant (VM program code copied into the
observer's shared memory at table load; docs/dev/hook_cost_analysis.md "Session 5")
compiles, grows the observer by exactly the code buffer and the global-pointer table,
and leaves the default build's PTX without them.  Its exactness runs on the GPU
(tests/gpu/test_hot_attach.py, build id "codesmem")."""

import re

import pytest

from dtrace_mk.kernels.build import nvrtc_compile
from dtrace_mk.runtime.device import MAX_PROGS, NUM_HOOKS
from dtrace_mk.kernels import megakernel_text


def _obs_bytes(ptx: str) -> int:
    m = re.search(r"\.shared \.align \d+ \.b8 O\[(\d+)\];", ptx)
    assert m, "the observer's shared struct O is not in the PTX"
    return int(m.group(1))


@pytest.fixture(scope="module")
def ptxs():
    src = megakernel_text()
    return {d: nvrtc_compile(src, "megakernel.cu", "sm_90a", "ptx", defines=d).decode()
            for d in ((), ("DTMK_VM_CODE_SMEM",), ("DTMK_VM_CODE_SMEM", "DTMK_OBS_CODE=64"))}


def test_code_buffer_size(ptxs):
    base = _obs_bytes(ptxs[()])
    gcode = 8 * NUM_HOOKS * MAX_PROGS
    assert _obs_bytes(ptxs[("DTMK_VM_CODE_SMEM",)]) - base == 256 * 16 + gcode
    assert _obs_bytes(ptxs[("DTMK_VM_CODE_SMEM", "DTMK_OBS_CODE=64")]) - base == 64 * 16 + gcode


def test_variant_compiles_to_cubin():
    src = megakernel_text()
    assert nvrtc_compile(src, "megakernel.cu", "sm_90a", "cubin", defines=("DTMK_VM_CODE_SMEM",))[:4] == b"\x7fELF"
