"""CI (no GPU): -DDTMK_HOT_FIRST (session 58; the default layout since session 60,
-DDTMK_NO_HOT_FIRST without it) -- the workers' hot functions renamed so that they follow the
kernel's entry in the cubin (which orders its subroutines by mangled name): one contiguous region
of hot code instead of one interleaved with cold functions.  Plan 157 found the off path's cost in
the GPC caches' instruction fetches from L2, not in instructions executed; plan 158 timed this
layout (no hooks -0.7%), plan 161 with the wait's two copies (off +0.35..+0.56%).  PTX names here
(build.source_names undoes the renames for the other tests); the GPU side is its tokens
(bench/hooks.py --offpath checks them equal to the default no-hook build's) and the GPU suite.
-DDTMK_HOT_OBS (measurement, session 61) extends the layout to the observer-SM build's hot functions."""

import pytest

from dtrace_mk.kernels.build import (_renames_block, hot_first_renames, hot_obs_renames, hot_tiny_renames,
                                     ptx_function_names, source_names)
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


#: -DDTMK_HOT_OBS (measurement, session 61): the observer-SM build's hot functions, after HOT's
HOT_OBS = ("a9osqflush", "b0osqraise", "b1osqobsrv", "b2osqrunen", "b3hookflsh", "b4obs_sync", "b5vmrunrec")
OBS_BUILD = ("DTMK_OBS_SM", "DTMK_OBS_SMS=4", "DTMK_OSQ_LAZY_PUB", "DTMK_OSQ_DEFER=16", "DTMK_ROPE_IN_ATTN")


def test_hot_obs_list_is_read_through_its_nested_check():
    """build.hot_obs_renames reads the `#ifdef DTMK_HOT_OBS` block past its nested #if/#error/#endif."""
    r = hot_obs_renames()
    assert tuple(r.values()) == HOT_OBS
    assert r["osq_defer_flush"] == "a9osqflush" and r["dtmk_vm_run_records"] == "b5vmrunrec"
    text = "#ifdef M\n#if X\n#define in_check no\n#endif\n#define f a0f   /* why */\n#endif\n#define g a1g\n"
    assert _renames_block(text, "M") == {"f": "a0f"}     # (not the nested block's, not what follows)
    with pytest.raises(ValueError, match="#ifdef M: no #endif"):
        _renames_block("#ifdef M\n#define f a0f\n", "M")


def _check_placed_after_hot(base: tuple, define: str, renamed: tuple, old_names: tuple) -> None:
    """`base` + `define`: HOT's and `renamed`'s functions there, before every other subroutine, none
    under its old name (`old_names`: mangled prefixes); source_names gives `base`'s functions."""
    raw = _ptx(base + (define,))
    names = ptx_function_names(raw)
    hot = [n for n in names if n.startswith(tuple(f"_Z10{f}" for f in HOT + renamed))]
    for f in HOT + renamed:
        assert any(n.startswith(f"_Z10{f}") for n in hot), f
    assert not any(n.startswith(old_names) for n in names)
    assert max(hot) < min(n for n in names if n not in hot)
    assert sorted(ptx_function_names(source_names(raw))) == sorted(ptx_function_names(source_names(_ptx(base))))


def test_hot_obs_places_the_observer_build_s_hot_functions_after_the_workers(fresh_cache):
    _check_placed_after_hot(OBS_BUILD, "DTMK_HOT_OBS", HOT_OBS,
                            ("_Z15osq_defer_flush", "_Z9osq_raise", "_Z12osq_observer", "_Z8obs_sync",
                             "_Z10hook_flush", "_Z19dtmk_vm_run_records"))


@pytest.mark.parametrize("defines", [("DTMK_HOT_OBS",), OBS_BUILD + ("DTMK_HOT_OBS", "DTMK_NO_HOT_FIRST")])
def test_hot_obs_needs_the_observer_sm_and_the_hot_first_layout(fresh_cache, defines):
    with pytest.raises(Exception, match="DTMK_HOT_OBS extends the hot-first layout to the observer-SM build"):
        _ptx(defines)


#: -DDTMK_HOT_TINY (measurement, session 66): the standard lowering's task functions, after HOT's
HOT_TINY = ("a9op_projx", "b6gateupop", "b7rmsnorm_", "b8rope_kv_", "b9op_attn_", "c0mv_rownl")


@pytest.mark.parametrize("defines", [("DTMK_ROPE_IN_ATTN",), ("DTMK_NO_HOOKS", "DTMK_ROPE_IN_ATTN")])
def test_hot_tiny_places_the_standard_lowering_s_task_functions_after_the_hot_ones(fresh_cache, defines):
    """tiny's per-task functions (not weight-streamed: op_proj / op_gate_up, the rmsnorm and rope levels,
    attention's dispatch) follow the hot region in the hook and the no-hook build alike, every one
    before the first cold function (hook_event, the VM, obs_sync in the hook build)."""
    assert tuple(hot_tiny_renames().values()) == HOT_TINY
    _check_placed_after_hot(defines, "DTMK_HOT_TINY", HOT_TINY,
                            ("_Z7op_projP", "_Z10op_gate_upP", "_Z10op_rmsnormR", "_Z10op_rope_kvR", "_Z7op_attnR",
                             "_Z9mv_row_nl"))


def test_hot_tiny_needs_the_hot_first_layout(fresh_cache):
    with pytest.raises(Exception, match="DTMK_HOT_TINY extends the hot-first layout"):
        _ptx(("DTMK_HOT_TINY", "DTMK_NO_HOT_FIRST", "DTMK_ONE_WAIT"))
