"""CI (no GPU): -DDTMK_HOT_FIRST (session 58, measurement; bench/hooks.py variant hotfirst) -- the
workers' hot functions renamed so that they follow the kernel's entry in the cubin (which orders
its subroutines by mangled name): one contiguous region of hot code instead of one interleaved
with cold functions.  Plan 157 found the off path's cost in the GPC caches' instruction fetches
from L2, not in instructions executed; plan 158 times this layout.  PTX names here; the GPU side
is its tokens (bench/hooks.py --offpath checks them equal to the default no-hook build's)."""

import pytest

from dtrace_mk.kernels.build import ptx_function_names
from dtrace_mk.megakernel import gpu

#: the renamed hot functions, in their cubin order (each name 10 characters: _Z10a...)
HOT = ("a0run_task", "a1run_body", "a2ws_projx", "a3wsgateup", "a4stagenrm", "a5prestart", "a6wait_evt",
       "a7attnstgd", "a8ropeattn")


@pytest.fixture()
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DTRACE_MK_CACHE", str(tmp_path))


def _funcs(defines) -> list:
    return ptx_function_names(gpu.compile_source("sm_90a", "ptx", defines=defines, use_cache=False).decode())


def test_hot_first_renames(fresh_cache):
    names = _funcs(("DTMK_HOT_FIRST", "DTMK_ROPE_IN_ATTN"))
    hot = [n for n in names if n.startswith("_Z10a")]
    for f in HOT:
        assert any(n.startswith(f"_Z10{f}") for n in hot), f
    # the old names are gone, and every renamed function sorts before every other subroutine
    assert not any(n.startswith(("_Z8run_body", "_Z8run_task", "_Z10wait_event", "_Z7ws_proj")) for n in names)
    assert max(hot) < min(n for n in names if n not in hot)


def test_default_keeps_names(fresh_cache):
    names = _funcs(("DTMK_ROPE_IN_ATTN",))
    assert not any(n.startswith("_Z10a") for n in names)
    assert any(n.startswith("_Z8run_body") for n in names) and any(n.startswith("_Z10wait_event") for n in names)
