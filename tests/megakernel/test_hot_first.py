"""CI (no GPU): -DDTMK_HOT_FIRST (session 58; the default layout since session 60,
-DDTMK_NO_HOT_FIRST without it) -- the workers' hot functions renamed so that they follow the
kernel's entry in the cubin (which orders its subroutines by mangled name): one contiguous region
of hot code instead of one interleaved with cold functions.  Plan 157 found the off path's cost in
the GPC caches' instruction fetches from L2, not in instructions executed; plan 158 timed this
layout (no hooks -0.7%), plan 161 with the wait's two copies (off +0.35..+0.56%).  PTX names here
(build.source_names undoes the renames for the other tests); the GPU side is its tokens
(bench/hooks.py --offpath checks them equal to the default no-hook build's) and the GPU suite."""

import pytest

from dtrace_mk.kernels.build import hot_first_renames, ptx_function_names, source_names
from dtrace_mk.megakernel import gpu

#: the renamed hot functions, in their cubin order (each name 10 characters: _Z10a...)
HOT = ("a0run_task", "a1run_body", "a2ws_projx", "a3wsgateup", "a4stagenrm", "a5prestart", "a6wait_evt",
       "a7attnstgd", "a8ropeattn")


@pytest.fixture()
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DTRACE_MK_CACHE", str(tmp_path))


def _ptx(defines) -> str:
    return gpu.compile_source("sm_90a", "ptx", defines=defines, use_cache=False).decode()


def test_the_kernel_s_list_is_the_one_read():
    """build.hot_first_renames reads kernels/megakernel.cu's block: the names above, each 10
    characters (so that they sort by their digit), wait_event's two names on one new name."""
    r = hot_first_renames()
    assert sorted(set(r.values())) == list(HOT)
    assert r["run_body"] == "a1run_body" and r["wait_event"] == r["wait_event_off"] == "a6wait_evt"


@pytest.mark.parametrize("defines", [("DTMK_ROPE_IN_ATTN",), ("DTMK_HOT_FIRST", "DTMK_ONE_WAIT", "DTMK_ROPE_IN_ATTN"),
                                     ("DTMK_NO_HOOKS", "DTMK_ROPE_IN_ATTN")])
def test_hot_first_renames(fresh_cache, defines):
    """The default hook build, one wait, no hooks: all in the hot-first layout."""
    names = ptx_function_names(_ptx(defines))
    hot = [n for n in names if n.startswith("_Z10a")]
    for f in HOT:
        assert any(n.startswith(f"_Z10{f}") for n in hot), f
    # the old names are gone, and every renamed function sorts before every other subroutine
    assert not any(n.startswith(("_Z8run_body", "_Z8run_task", "_Z10wait_event", "_Z14wait_event_off", "_Z7ws_proj"))
                   for n in names)
    assert max(hot) < min(n for n in names if n not in hot)


def test_no_hot_first_keeps_names(fresh_cache):
    names = ptx_function_names(_ptx(("DTMK_NO_HOT_FIRST", "DTMK_ONE_WAIT", "DTMK_ROPE_IN_ATTN")))
    assert not any(n.startswith("_Z10a") for n in names)
    assert any(n.startswith("_Z8run_body") for n in names) and any(n.startswith("_Z10wait_event") for n in names)


@pytest.mark.parametrize("defines,wait", [((), "_Z14wait_event_off"), (("DTMK_ONE_WAIT",), "_Z10wait_event"),
                                          (("DTMK_NO_HOOKS",), "_Z10wait_event")])
def test_source_names_undo_the_renames(fresh_cache, defines, wait):
    """source_names: the hot-first build's functions by their source names -- those of the old
    layout, a6wait_evt as copy 0 where copy 1 is there, else as the one wait."""
    raw = _ptx(defines)
    names = ptx_function_names(source_names(raw))
    assert not any(n.startswith("_Z10a") for n in names)
    assert {n for n in names if "wait_event" in n and "wait_event_obs" not in n} == \
        {n.replace("_Z10a6wait_evt", wait) for n in ptx_function_names(raw) if n.startswith("_Z10a6wait_evt")}
    old = ptx_function_names(_ptx(defines + ("DTMK_NO_HOT_FIRST",)))
    assert sorted(names) == sorted(old)          # (the same functions, under the same names)
