"""CI (no GPU): -DDTMK_OFF_COPY (session 55) -- wait_event (bit 0) and run_task (bit 1) in two
copies (wait_event_off / wait_event_obs since session 59: functions of their own names, so that
the observing copy does not sit in -DDTMK_HOT_FIRST's hot region; run_task's a template on RCOPY),
chosen per static task by the whole CTA from the latch
s_obs_copy: copy 1 is the hook build's code, copy 0 the same with its "observing?" gates
constant 0, so that NVRTC drops the hook code there.  =1 is the hook build's default since
session 60 (plan 161: +0.35..+0.56% off over no hooks in the hot-first layout; before, plan 146,
it kept most of the off cost -- the layout's share; not with the observer SM) -- and the
measurement-only -DDTMK_OFFX whose builds measured where the off cost sits (plan 145).  PTX shapes
(by source names, build.source_names, but for the layout's own test), refusals; the GPU side
(exactness of the copies) is tests/gpu/test_hot_attach.py's default build and the whole GPU suite."""

import re

import pytest

from dtrace_mk.kernels import megakernel_text
from dtrace_mk.kernels.build import (CompileError, mangled, ptx_canonical, ptx_function, ptx_function_names,
                                     source_names, wait_copies)
from dtrace_mk.megakernel import gpu

#: the hook functions an observing wait calls in the default build (none in the other copy)
WAIT_HOOK_CALLS = ("obs_first_look", "hook_event", "obs_spin_drain", "obs_sync_wait_cta")
#: ... and an observing run_task (the full pre-signal hold, the records after the signal)
RUN_HOOK_CALLS = ("hook_hold", "hook_post")


@pytest.fixture()
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DTRACE_MK_CACHE", str(tmp_path))


def _ptx(defines, raw: bool = False) -> str:
    """The build's PTX, its functions by their source names unless `raw`."""
    ptx = gpu.compile_source("sm_90a", "ptx", defines=defines, use_cache=False).decode()
    return ptx if raw else source_names(ptx)


def _func(ptx: str, name: str) -> str:
    body = ptx_function(ptx, name)
    assert body, f"{name} not in the PTX"
    return body


def _kernel(ptx: str) -> str:
    return ptx[ptx.index(".entry dtmk_megakernel"):]


#: wait_event's copy 0 and copy 1 (PTX names)
WAIT_OFF, WAIT_OBS = (mangled(n) for n in wait_copies())


def _copies(ptx: str, fn: str, calls) -> tuple:
    """Copy 0 and copy 1 of `fn` (run_task's template instances; wait_event's named copies); each of
    `calls` is called by copy 1 only."""
    if fn == "wait_event":
        off, obs = _func(ptx, WAIT_OFF), _func(ptx, WAIT_OBS)
    else:
        off, obs = (_func(ptx, f"_Z{len(fn)}{fn}ILj{c}E") for c in (0, 1))
    for f in calls:
        assert f in obs and f not in off, (fn, f)
    return off, obs


@pytest.mark.parametrize("defines", [(), ("DTMK_OFF_COPY=1",), ("DTMK_NO_HOT_FIRST", "DTMK_OFF_COPY=1")])
def test_wait_copies(fresh_cache, defines):
    """The default hook build's wait (session 60), =1 named, and =1 in the old layout."""
    ptx = _ptx(defines)
    off, obs = _copies(ptx, "wait_event", WAIT_HOOK_CALLS)
    # both copies poll and take dynamic tasks; run_task has one copy (bit 1 unset)
    assert "ld.acquire.gpu" in off and "_Z8run_task" in off
    assert "_Z8run_taskILj" not in ptx
    # the main loop calls the copy the latch names; run_task writes the latch
    k = _kernel(ptx)
    assert WAIT_OFF in k and WAIT_OBS in k and "ld.shared.u32" in k and "_Z10wait_event" not in ptx
    assert "s_obs_copy" in _func(ptx, "_Z8run_task") and "s_obs_copy" in k


def test_wait_and_run_copies(fresh_cache):
    ptx = _ptx(("DTMK_OFF_COPY=3",))
    off, obs = _copies(ptx, "run_task", RUN_HOOK_CALLS)
    assert "run_body" in off and "run_body" in obs
    # a wait's dynamic tasks run in the wait's copy
    assert "_Z8run_taskILj0E" in _func(ptx, WAIT_OFF) and "_Z8run_taskILj0E" not in _func(ptx, WAIT_OBS)
    assert "_Z8run_taskILj1E" in _func(ptx, WAIT_OBS)


def test_hot_first_copies(fresh_cache):
    """In the hot-first layout copy 0 is the hot wait (a6wait_evt, among the renamed functions that follow
    the kernel's entry) and the observing copy keeps its name, sorting after all of them (session 59,
    plan 161: +0.35..+0.56% over the hot-first no-hook build, from +1.1..1.3% as a template's instances)."""
    ptx = _ptx((), raw=True)
    # the default since session 60 (ptx_canonical: NVRTC's register numbering varies between compiles)
    assert ptx_canonical(ptx) == ptx_canonical(_ptx(("DTMK_HOT_FIRST", "DTMK_OFF_COPY=1"), raw=True))
    off, obs = _func(ptx, "_Z10a6wait_evt"), _func(ptx, WAIT_OBS)
    for f in WAIT_HOOK_CALLS:
        assert f in obs and f not in off, f
    names = ptx_function_names(ptx)
    hot = [n for n in names if n.startswith("_Z10a")]
    obs_name = [n for n in names if n.startswith(WAIT_OBS)]
    assert obs_name and not any(n.startswith(WAIT_OFF) for n in names) and max(hot) < obs_name[0]


def test_copy_in_wait(fresh_cache):
    """-DDTMK_COPY_IN_WAIT (measurement, session 60): the main loop calls copy 0 only (the step gate and
    the drain keep calling copy 1), copy 0 calls copy 1 when the latch says (before any work of its
    own), copy 1 never copy 0; one run_task call fewer."""
    ptx, default = _ptx(("DTMK_COPY_IN_WAIT",)), _kernel(_ptx(()))
    k, off, obs = _kernel(ptx), _func(ptx, WAIT_OFF), _func(ptx, WAIT_OBS)
    assert k.count(WAIT_OFF) == default.count(WAIT_OFF) == 1 and k.count(WAIT_OBS) == default.count(WAIT_OBS) - 1
    assert k.count("_Z8run_task") == default.count("_Z8run_task") - 1
    assert WAIT_OBS in off and "s_obs_copy" in off and off.index("s_obs_copy") < off.index(WAIT_OBS)
    assert off.index(WAIT_OBS) < off.index("ld.acquire.gpu") and WAIT_OFF not in obs.split("\n", 1)[1]


@pytest.mark.parametrize("defines", [("DTMK_ONE_WAIT",), ("DTMK_NO_HOOKS",), ("DTMK_OBS_SM", "DTMK_OBS_SMS=4"),
                                     ("DTMK_OFFX=1",)])
def test_one_wait_builds(fresh_cache, defines):
    """One wait (no copies, no latch) where asked, without hooks, with the observer SM (whose epochs
    stopped with the copies, plan 146) and in the measurement -DDTMK_OFFX's builds."""
    names = ptx_function_names(_ptx(defines))
    assert any(n.startswith("_Z10wait_event") for n in names), names
    assert not any(n.startswith((WAIT_OFF, WAIT_OBS)) for n in names)


def test_offx_measurement_builds(fresh_cache):
    """-DDTMK_OFFX=7: the per-task path without hook calls (statically the no-hook path)."""
    ptx = _ptx(("DTMK_OFFX=7",))
    we, rt = _func(ptx, "wait_event"), _func(ptx, "run_task")
    for f in WAIT_HOOK_CALLS[:3] + ("hook_comm_signal",):
        assert f not in we, f
    for f in RUN_HOOK_CALLS:
        assert f not in rt, f


@pytest.mark.parametrize("defines,msg", [
    (("DTMK_OFF_COPY=1", "DTMK_OFFX=1"), "-DDTMK_OFF_COPY and the measurement -DDTMK_OFFX exclude each other"),
    (("DTMK_OBS_SM", "DTMK_OFFX=1"), "-DDTMK_OFFX is measurement only: the default hook build"),
    (("DTMK_OBS_SM", "DTMK_OBS_SMS=4", "DTMK_OFF_COPY=1"), "-DDTMK_OFF_COPY is not with -DDTMK_OBS_SM (plan 146"),
    (("DTMK_ONE_WAIT", "DTMK_OFF_COPY=1"), "DTMK_ONE_WAIT and DTMK_OFF_COPY exclude each other"),
    (("DTMK_NO_HOT_FIRST", "DTMK_HOT_FIRST"), "DTMK_NO_HOT_FIRST and DTMK_HOT_FIRST exclude each other"),
    (("DTMK_ONE_WAIT", "DTMK_COPY_IN_WAIT"), "-DDTMK_COPY_IN_WAIT is for the wait's two copies alone"),
    (("DTMK_OFF_COPY=3", "DTMK_COPY_IN_WAIT"), "-DDTMK_COPY_IN_WAIT is for the wait's two copies alone"),
])
def test_refused_combinations(fresh_cache, defines, msg):
    with pytest.raises(CompileError, match=msg.replace("(", r"\(")):
        gpu.compile_source("sm_90a", "ptx", defines=defines, use_cache=False)


def _between(src: str, start: str, end: str) -> str:
    i = src.index(start)
    return src[i:src.index(end, i)]


def test_the_latch_is_written_only_before_a_barrier_and_read_once_per_task():
    """The rule that keeps the copy choice uniform over the CTA (megakernel.cu "the observing?
    latch"): thread 0 writes s_obs_copy only (a) in run_task's prologue, before its first barrier,
    and (b) in a forced refresh_control, every call of which a barrier follows in the same thread-0
    block; the main loop reads it once per static task, right before the wait.  A write moved
    after run_task's body barrier, or a forced refresh without its barrier, fails here."""
    src = megakernel_text()
    writes = [m.start() for m in re.finditer(r"s_obs_copy = ", src)]
    assert len(writes) == 2
    rt = _between(src, "__device__ __noinline__ void run_task(", "run_body(P, W, t, step, smem, r);")
    assert "s_obs_copy = W.observe;" in rt
    assert rt.index("s_obs_copy = W.observe;") < rt.index("MK_SYNC();")          # before its first barrier
    rc = _between(src, "void refresh_control(", "\n}\n")
    assert "if (force) s_obs_copy = W.observe;" in rc
    calls = [m.end() for m in re.finditer(r"refresh_control\(P, W, true\);", src)]
    assert len(calls) == 3
    for c in calls:                                   # the thread-0 block closes, then the barrier
        rest = src[c:c + 600]
        assert re.match(r"(?:\s*(?:#[^\n]*|if \([^\n]*\n[^\n]*|}[^\n]*|\} else \{[^}]*\}))*\s*MK_SYNC\(\);",
                        rest), rest[:300]
    loop = _between(src, "#elif OFF_COPY_BIT(0) || OFF_COPY_BIT(1)\n            if (s_obs_copy) {", "#else")
    assert loop.count("WAIT_EVENT_COPY(1u)") == 1 and loop.count("WAIT_EVENT_COPY(0u)") == 1
    # the other read: -DDTMK_COPY_IN_WAIT's copy 0, at its start (the main loop's one call of it)
    off = _between(src, "void wait_event_off(const MkParams &P, Worker &W, int t, int step, int e, dtmk_u64 target, float *smem) {",
                   "wait_event_body<0u>")
    assert src.count("if (s_obs_copy)") == 2 and off.count("if (s_obs_copy)") == 1
