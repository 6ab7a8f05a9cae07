"""CI (no GPU): the observer warp (-DDTMK_OBS_WARP, kernels/megakernel.cu "observer
warp", session 13).  Thread 0 pushes one entry per task into a shared-memory queue and
warp OW_WARP builds the records and runs the VM while thread 0 polls a dependency wait.
These tests hold the build and its epoch protocol to what the GPU tests measured
(tests/gpu/test_hot_attach.py *obswarp*, test_observer_warp_epochs_are_final_only_when_complete)."""
import re

import pytest

from dtrace_mk.kernels.build import nvrtc_compile
from dtrace_mk.megakernel.gpu import KERNEL_DIR
from tests.megakernel.test_hook_sites import body

SRC = (KERNEL_DIR / "megakernel.cu").read_text()


def _between(text: str, a: str, b: str) -> str:
    return text[text.index(a):text.index(b, text.index(a))]


@pytest.mark.slow
@pytest.mark.parametrize("defines", [("DTMK_OBS_WARP",), ("DTMK_OBS_WARP", "DTMK_SITE_FORM"),
                                     ("DTMK_OBS_WARP", "DTMK_ROPE_IN_ATTN")], ids=["tiny", "siteform", "1b"])
def test_the_observer_warp_build_compiles_for_sm_90(defines):
    ptx = nvrtc_compile(SRC, "megakernel.cu", "sm_90a", "ptx", defines=defines).decode()
    assert ".entry dtmk_megakernel" in ptx
    assert re.search(r"\.func[^(]*\bow_serve\b|_Z8ow_serve", ptx), "the observer's loop is out of line"


def test_a_no_hook_observer_warp_build_is_refused():
    with pytest.raises(Exception, match="DTMK_OBS_WARP"):
        nvrtc_compile(SRC, "megakernel.cu", "sm_90a", "ptx", defines=("DTMK_OBS_WARP", "DTMK_NO_HOOKS"))


def test_thread_0_pushes_and_never_builds_records():
    """hook_post / hook_event flush a task's captured hooks through HK_FLUSH_PEND, which is
    the push (ow_push_pend) with the observer warp; records built on thread 0 go through
    hk_emit (the queue), never straight into the rings."""
    assert re.search(r"#ifdef DTMK_OBS_WARP\n#define HK_FLUSH_PEND\(P, W\) ow_push_pend\(W\)", SRC)
    for fn in ("hook_post", "hook_event"):
        assert "HK_FLUSH_PEND(P, W)" in body(fn) and "hook_flush(" not in body(fn), fn
    assert "hk_store(" not in body("hook_post") and "hk_emit(" in body("hook_post")
    assert "hk_emit(" in body("hk_put_rec") and "hk_store(" not in body("hk_put_rec")
    emit = body("hk_emit")
    assert emit.index("ow_slot()") < emit.index("ow_commit(") < emit.index("#else") < emit.index("hk_store(")


def test_obs_pending_is_held_before_an_entry_is_visible():
    c = body("ow_commit")
    assert c.index("OBS_PENDING") < c.index("__threadfence_block()") < c.index("ow_st(&O.q_head")


def test_obs_pending_is_raised_only_when_the_observer_consumed_everything():
    r = body("ow_raise")
    assert r.index("ow_ld(&O.q_tail) != O.q_head") < r.index("ow_ld(&O.ow_low)") < r.index("__threadfence()") \
        < r.index("OBS_PENDING")


def test_only_thread_0_writes_obs_pending_in_the_observer_warp_build():
    """obs_sync (run by the observer) publishes ow_low after its fence; hk_store and
    hk_inline lower ow_low; the OBS_PENDING stores they make without the observer warp are
    compiled out."""
    s = body("obs_sync")
    pub = _between(s, "#ifdef DTMK_OBS_WARP\n                O.pubs += 1;\n                *(volatile dtmk_u32 *)&O.ow_low = keep;",
                   "#else")
    assert "+ OBS_PENDING)" not in pub
    assert s.index("__threadfence();") < s.index("*(volatile dtmk_u32 *)&O.ow_low = keep;")
    for fn in ("hk_store", "hk_inline"):
        part = _between(body(fn), "#ifdef DTMK_OBS_WARP", "#else")
        assert "O.ow_low" in part and "+ OBS_PENDING)" not in part, fn


def test_an_entry_is_consumed_after_it_ran():
    e = body("ow_entry")
    assert e.index("hook_flush(P, Wo)") < e.index("ow_st(&O.q_tail, tail + 1)")
    assert e.index("obs_sync(P, Wo, false, ~0u)") < e.index("ow_st(&O.ow_seq")
    assert e.index("ow_st(&O.q_tail") < e.index("ow_st(&O.ow_seq")


def test_the_observer_leaves_a_wait_when_thread_0_yields():
    """ow_yield is set by thread 0 before the barrier that ends a poll round and cleared
    only where the observer cannot be serving (a first look before the wait's first
    barrier; between the two barriers after a poll round)."""
    w = body("wait_event")
    assert w.count("ow_st(&O.ow_yield, 1)") == 1 and w.count("ow_st(&O.ow_yield, 0)") == 1
    i_set, i_serve = w.index("ow_st(&O.ow_yield, 1)"), w.index("ow_serve(P, false)")
    assert i_set < i_serve < w.index("MK_SYNC()", i_serve)
    i_clear = w.index("ow_st(&O.ow_yield, 0)")
    assert w.rindex("if (ready || aborted) break;", 0, i_clear) < i_clear < w.index("MK_SYNC()", i_clear)
    assert "ow_st(&O.ow_yield, 0)" in body("obs_first_look")
    s = body("ow_serve")
    assert s.index("if (!all && ow_ld(&O.ow_yield)) break;") < s.index("ow_entry(")
