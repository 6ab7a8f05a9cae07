"""CI (no GPU): the lazy pre-signal hold, the default since session 9
(docs/dev/hook_cost_analysis.md "Session 8" / "Session 9": no pre-signal hold work that no
loaded program reads; measured -2.4 points on 1b's hot summary in two same-run A/Bs).
-DDTMK_HOLD_EAGER builds the always-full hold.  Both keep the noinline hook_hold for the
cases that need it (a host ring, request_gen read, comm:wait observed); the eager build has
no hold flag.  Exactness on the GPU: tests/gpu/test_hot_attach.py (builds "default" and
"holdeager")."""

import re

import pytest

from dtrace_mk.kernels.build import nvrtc_compile, ptx_function
from dtrace_mk.kernels import megakernel_text


@pytest.fixture(scope="module")
def ptxs():
    src = megakernel_text()
    return {d: nvrtc_compile(src, "megakernel.cu", "sm_90a", "ptx", defines=d).decode()
            for d in ((), ("DTMK_HOLD_EAGER",), ("DTMK_COMPILED_TIER",))}


def _obs_bytes(ptx: str) -> int:
    m = re.search(r"\.shared \.align \d+ \.b8 O\[(\d+)\];", ptx)
    assert m, "the observer's shared struct O is not in the PTX"
    return int(m.group(1))


def _run_task(ptx: str) -> str:
    name = next(n for n in re.findall(r"\.func\s+(?:\([^)]*\)\s*)?(\w*run_task\w*)", ptx))
    return ptx_function(ptx, name)


def test_the_lazy_hold_adds_one_word_and_keeps_the_full_hold(ptxs):
    lazy, eager = ptxs[()], ptxs[("DTMK_HOLD_EAGER",)]
    assert 0 <= _obs_bytes(lazy) - _obs_bytes(eager) <= 16         # O.hold_full (in padding or + alignment)
    for ptx in ptxs.values():
        assert "hook_hold" in _run_task(ptx)                        # the full hold is still called
    # the default build reads the flag in run_task; the eager build has no such branch
    assert _run_task(lazy).count("ld.shared") > _run_task(eager).count("ld.shared")


def test_the_eager_variant_compiles_to_cubin_and_without_hooks():
    src = megakernel_text()
    for d in (("DTMK_HOLD_EAGER",), ("DTMK_HOLD_EAGER", "DTMK_NO_HOOKS")):
        assert nvrtc_compile(src, "megakernel.cu", "sm_90a", "cubin", defines=d)[:4] == b"\x7fELF"
