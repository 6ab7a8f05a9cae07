"""Grid handoff (kernels/megakernel.cu "grid handoff", Megakernel(handoff=True)) on the CPU:

* the protocol, modelled: lean workers stop in any order; a successor CTA is placed only
  on an SM a lean CTA left and resumes the worker of that SM.  Under random schedules
  every worker is resumed exactly once, from its final row, and nothing deadlocks; with
  two CTAs to an SM a successor could start beside a lean worker that has not stopped
  (the host refuses such builds: one_cta_per_sm), so the model can fail;
* what the kernel's resume rule relies on in every graph (tiny, small-moe, 1b): the
  (event, target) of a worker's wait names its step, the end-of-run drain's pair is no
  task's, every awaited event has triggers;
* the sources: the lean grid IS the no-hook build with placement (its per-task functions
  are the no-hook build's PTX), the hook build alone resumes, the constants shared by
  megakernel.cu and gpu.py;
* the host side with the NumPy stand-in for CuPy: which kernel each launch runs, the
  params that tie the successor to its record block, the stop word and its order.
The kernel on the GPU: tests/gpu/test_handoff_gpu.py."""
import random
import re
import sys
import types

import numpy as np
import pytest

from dtrace_mk.errors import UserError
from dtrace_mk.kernels.build import nvrtc_compile, source_names
from dtrace_mk.megakernel import gpu
from dtrace_mk.megakernel.graph import build_graph
from dtrace_mk.megakernel.presets import PRESETS
from dtrace_mk.kernels import megakernel_text

ONE_CTA_PER_SM = gpu.one_cta_per_sm      # (the host tests below stand it in)


# ---- the protocol, modelled --------------------------------------------------------------
def simulate(n_workers: int, per_sm: int, rng) -> dict:
    """One random schedule: worker w's lean CTA runs on SM w until it stops (any order);
    successor CTAs are placed while an SM has room (per_sm CTAs each), the successor on
    SM s resumes worker s once placed, reading the row it finds: "final" only if the lean
    CTA has stopped.  Returns {"resumed": [...], "stale": reads of a live row, "deadlock"}."""
    running = set(range(n_workers))       # lean CTAs still on their SMs
    waiting = list(range(n_workers))      # successor CTAs not yet placed (hardware queue order)
    resumed, stale = [], 0
    while len(resumed) < n_workers:
        acts = [("stop", w) for w in running]
        free = [sm for sm in range(n_workers) if (sm in running) + sum(1 for r in resumed if r == sm) < per_sm
                and sm not in resumed]
        if waiting and free:
            acts.append(("place", rng.choice(free)))
        if not acts:
            return {"resumed": resumed, "stale": stale, "deadlock": True}
        kind, x = rng.choice(acts)
        if kind == "stop":
            running.discard(x)
        else:
            waiting.pop(0)
            stale += x in running             # its worker has not stopped: the row is not final
            resumed.append(x)
    return {"resumed": resumed, "stale": stale, "deadlock": False}


@pytest.mark.parametrize("n_workers", [4, 8, 16])
def test_resume_by_sm_resumes_every_worker_once_from_its_final_row(n_workers):
    rng = random.Random(n_workers)
    for _ in range(300):
        out = simulate(n_workers, 1, rng)
        assert not out["deadlock"] and out["stale"] == 0, out
        assert sorted(out["resumed"]) == list(range(n_workers))


def test_two_ctas_to_an_sm_would_read_a_live_row():
    rng = random.Random(3)
    assert any(simulate(8, 2, rng)["stale"] for _ in range(200))


# ---- what the resume rule relies on ------------------------------------------------------
@pytest.mark.parametrize("preset", ["tiny", "small-moe", "1b"])
def test_a_waits_event_and_target_name_its_step(preset):
    """ho_resume finds the task a stopped worker waited for from (WS_EVENT, WS_TARGET):
    a task waiting for an event e >= 0 at step s waits for triggers(e) * (s + 1), one
    without waits for the step event at target s; the drain waits for (step_event, last)."""
    g = build_graph(PRESETS[preset], 1, 16)
    tabs = gpu.pack_tables(g)
    tasks, off, plan = tabs["tasks"], tabs["plan_off"], tabs["plan_tasks"]
    step0, last = 3, 9
    for w in range(g.num_workers):
        pairs = {}
        for s in range(step0, last):
            for i in range(off[w], off[w + 1]):
                r = tasks[plan[i]]
                if r[6] >= 0:
                    assert r[7] > 0, "an awaited event without triggers"
                    e, target = int(r[6]), int(r[7]) * (s + 1)
                    assert target % int(r[7]) == 0 and target // int(r[7]) - 1 == s
                else:
                    e, target = g.step_event, s
                assert (e, target) != (g.step_event, last), "a task's wait looks like the drain's"
                pairs.setdefault((e, target), []).append((s, i))
        for (e, target), where in pairs.items():      # the same pair never spans two steps
            assert len({s for s, _ in where}) == 1, (w, e, target, where)


# ---- the kernel sources ------------------------------------------------------------------
@pytest.fixture(scope="module")
def ptx():
    src = megakernel_text()
    out = {}
    for name, defs in {"default": (), "hook": ("DTMK_HANDOFF", "DTMK_SM_WORKER"), "nohooks": ("DTMK_NO_HOOKS",),
                       "lean": ("DTMK_NO_HOOKS", "DTMK_SM_WORKER")}.items():
        out[name] = source_names(nvrtc_compile(src, "megakernel.cu", "sm_90a", "ptx", defines=defs).decode())
    return out


def _funcs(ptx_text):
    return set(re.findall(r"\.func\s+(?:\([^)]*\)\s*)?(\w+)", ptx_text))


def _body(ptx_text, func):
    """The PTX of `func`, its registers and labels renamed in first-use order
    (kernels/build.ptx_canonical: the same code in two builds compares equal, a changed
    operand does not)."""
    from dtrace_mk.kernels.build import ptx_canonical
    m = re.search(r"^\.func[^\n]*" + func + r"[^\n]*\n(.*?)^}", ptx_text, re.M | re.S)
    assert m, func
    return ptx_canonical(m.group(1), labels=True)


def test_only_the_hook_build_resumes(ptx):
    has = {k: {f for f in ("ho_resume", "sm_worker") if any(f in g for g in _funcs(v))} for k, v in ptx.items()}
    assert has == {"default": set(), "hook": {"ho_resume", "sm_worker"}, "nohooks": set(), "lean": {"sm_worker"}}


def test_the_lean_loop_is_the_no_hook_builds(ptx):
    """Placement adds one call at the kernel's entry; the functions every task runs
    through are the no-hook build's, instruction for instruction (session 11's lean build
    had a leave test in them and ran 1.2-1.4% slower on 1b)."""
    for f in ("wait_event", "run_task", "run_body"):
        assert _body(ptx["lean"], f) == _body(ptx["nohooks"], f), f


@pytest.mark.parametrize("defs, msg", [(("DTMK_NO_HOOKS", "DTMK_HANDOFF", "DTMK_SM_WORKER"), "the hook build's"),
                                       (("DTMK_HANDOFF",), "DTMK_SM_WORKER"),
                                       (("DTMK_HANDOFF", "DTMK_SM_WORKER", "DTMK_WS_NEXT"), "DTMK_HANDOFF")])
def test_builds_that_cannot_hand_off_are_refused(defs, msg):
    src = megakernel_text()
    with pytest.raises(Exception, match=msg):
        nvrtc_compile(src, "megakernel.cu", "sm_90a", "ptx", defines=defs)


def test_handoff_constants_agree_between_kernel_and_host():
    src = megakernel_text()
    assert int(re.search(r"#define ABORT_LEAVE (\d+)u", src).group(1)) == gpu.ABORT_LEAVE
    assert int(re.search(r"#define WS_LEFT (\d+)", src).group(1)) == gpu.WS_LEFT
    assert int(re.search(r"#define HO_WORDS (\d+)", src).group(1)) == gpu.HO_WORDS
    assert gpu.ABORT_LEAVE not in (1, 2, 3) and gpu.WS_LEFT not in gpu.WS_STATES.keys() - {gpu.WS_LEFT}


def test_one_cta_per_sm():
    fn = lambda regs, smem: types.SimpleNamespace(num_regs=regs, shared_size_bytes=smem)  # noqa: E731
    assert gpu.one_cta_per_sm(fn(128, 1344), 512, 5000)          # the register file (tiny's builds)
    assert not gpu.one_cta_per_sm(fn(64, 1344), 512, 5000)
    assert gpu.one_cta_per_sm(fn(64, 27000), 512, 150000)        # shared memory (1b)


# ---- the host side -----------------------------------------------------------------------
sys.path.insert(0, __import__("os").path.dirname(__file__))
from test_resident_host_cpu import _Event, _Stream  # noqa: E402
from test_tp_launcher_cpu import fake_cupy  # noqa: E402,F401  (the NumPy stand-in)


@pytest.fixture()
def mkh(fake_cupy, monkeypatch):
    import ctypes
    rt = fake_cupy.cuda
    writes, preloads = [], []
    monkeypatch.setattr(gpu.Megakernel, "_preload", lambda self, k: preloads.append(k))
    monkeypatch.setattr(gpu, "probe_smids", lambda blocks, smem: list(range(blocks))[::-1])
    monkeypatch.setattr(gpu, "one_cta_per_sm", lambda fn, threads, smem: True)

    def memcpy(dst, src, n, kind, s):
        writes.append((dst, n))
        ctypes.memmove(dst, src, n)
    rt.runtime = types.SimpleNamespace(memcpyAsync=memcpy, memcpyHostToDevice=1, memcpyDeviceToHost=2,
                                       deviceSynchronize=lambda: None)
    rt.alloc_pinned_memory = lambda n: bytearray(n)
    rt.Stream, rt.Event = _Stream, _Event
    rt.get_elapsed_time = lambda a, b: 1.5
    m = gpu.Megakernel(PRESETS["tiny"], batch=2, num_workers=4, handoff=True)
    m.launches, m.writes, m.preloads, m.lean_starts = [], writes, preloads, True

    def kern(tag):
        def launch(grid, block, args, shared_mem=0, stream=None):
            m.rows_at_launch = np.asarray(m.buf["worker_state"])[:, 5].copy()
            if tag == "lean" and m.lean_starts:
                m.buf["worker_state"][:, 5] = 2                      # every lean CTA started: waiting
            ctl = np.asarray(m.buf["control"])
            m.launches.append((tag, dict(zip(gpu.PARAM_FIELDS, (int(x) for x in np.asarray(args[0])))),
                               int(ctl[gpu.CTL_ABORT])))
        return launch
    m.kernel, m.lean_kernel = kern("hook"), kern("lean")
    return m


def test_the_lean_build_is_the_no_hook_build_with_placement(mkh):
    cfg = PRESETS["tiny"]
    assert mkh.lean_defines == gpu.megakernel_defines(cfg, 1, ("DTMK_NO_HOOKS", "DTMK_SM_WORKER"))
    assert set(mkh.defines) == {"DTMK_HANDOFF", "DTMK_SM_WORKER"}
    assert mkh.sm_map is not None and list(mkh.sm_map) == [0, 1, 2, 3]   # placed at construction (SM order)


def test_the_hook_build_is_loaded_before_any_lean_launch(mkh):
    """CUDA loads a module at its first launch and that load waits for running kernels:
    the successor's first launch must not be the one during a lean run (tiny deadlocked)."""
    assert len(mkh.preloads) == 1 and mkh.launches == []


def test_a_lean_start_then_a_handoff(mkh):
    mkh.buf["worker_state"][:, 5] = 3                              # a previous launch's rows
    h = mkh.start(5, lean=True)
    assert [t for t, _, _ in mkh.launches] == ["lean"]
    _, lean, stop = mkh.launches[0]
    assert lean["handoff_in"] == 0 and stop == 0
    assert (mkh.rows_at_launch == 0).all()                        # no stale row for a successor
    assert mkh.handoff(h) is True
    _, succ, stop = mkh.launches[1]
    assert mkh.launches[1][0] == "hook" and stop == 0               # launched before the stop is asked
    assert succ["handoff_in"] == int(h["handoff"]["block"].data.ptr) != 0
    assert {k: v for k, v in succ.items() if k != "handoff_in"} == {k: v for k, v in lean.items() if k != "handoff_in"}
    assert int(mkh.buf["control"][gpu.CTL_ABORT]) == gpu.ABORT_LEAVE
    assert mkh.writes[-1] == (int(mkh.buf["control"].data.ptr) + 4 * gpu.CTL_ABORT, 4)
    assert mkh.handoff(h) is False                                 # once per launch
    assert len(mkh.launches) == 2


def test_the_successor_waits_for_every_lean_cta_to_start(mkh):
    mkh.lean_starts = False                                      # no lean CTA has written its row yet
    h = mkh.start(3, lean=True)
    polls = []
    real = mkh._read_worker_state

    def read(side):
        polls.append(1)
        if len(polls) == 3:
            mkh.buf["worker_state"][:, 5] = [2, 1, 2, 6]             # all started (one already left)
        return real(side)
    mkh._read_worker_state = read
    mkh.handoff(h)
    assert len(polls) == 3 and [t for t, _, _ in mkh.launches] == ["lean", "hook"]


def test_handoff_after_0_asks_before_the_launch(mkh):
    mkh.start(3, handoff_after=0)
    assert [(t, stop) for t, _, stop in mkh.launches] == [("lean", gpu.ABORT_LEAVE), ("hook", gpu.ABORT_LEAVE)]


def test_handoff_after_n_asks_once_a_worker_did_n_tasks(mkh):
    mkh.buf["worker_state"][:, 7] = [0, 9, 2, 0]                   # WS_DONE: worker 1 did 9
    mkh.start(3, handoff_after=8)
    assert [(t, stop) for t, _, stop in mkh.launches] == [("lean", 0), ("hook", 0)]
    assert int(mkh.buf["control"][gpu.CTL_ABORT]) == gpu.ABORT_LEAVE


def test_a_handoffs_stop_is_no_watchdog_report(mkh):
    h = mkh.start(2, lean=True)
    mkh.handoff(h)
    h["end"].done = h["handoff"]["end"].done = True
    mkh.cp.asnumpy = np.asarray
    res = mkh.finish(h)
    assert res.watchdog is None
    mkh.buf["control"][gpu.CTL_ABORT] = 2                          # a real watchdog after it is
    assert mkh._collect(2, 0, 1.0, None, 2000).watchdog is not None


def test_handoff_state_reads_the_successors_records(mkh):
    h = mkh.start(2, lean=True)
    mkh.handoff(h)
    W, HW = mkh.num_workers, gpu.HO_WORDS
    b = np.zeros(2 + W * HW, np.uint64)
    rec = b[2:].reshape(W, HW)
    rec[0, :4] = [7, 5, 40, 1]                                      # left at step 7, plan index 5
    rec[1, :2] = [~np.uint64(0), np.uint64(2 ** 64 - 2)]            # finished (index -2)
    rec[2, :3] = [9, np.uint64(2 ** 64 - 3), 61]                    # only the drain was left
    rec[3, :3] = [8, 12, 33]
    rec[:, 13] = [100, 101, 102, 103]
    b[0], b[1] = 3, 4
    h["handoff"]["block"][:] = b
    st = mkh.handoff_state(h)
    assert st["resumed"] == 4 and st["handed_off"]
    assert st["left"] == [(0, 7, 5), (3, 8, 12)] and st["finished"] == [1] and st["drain"] == [2]
    assert st["done_at_leave"] == {0: 40, 1: 0, 2: 61, 3: 33} and st["phantoms_readded"] == 1


def test_a_plain_start_runs_the_hook_build_and_never_hands_off(mkh):
    h = mkh.start(3)
    assert [t for t, _, _ in mkh.launches] == ["hook"] and mkh.launches[0][1]["handoff_in"] == 0
    assert mkh.handoff(h) is False and h["handoff"] is None


def test_bad_handoff_requests_are_refused(mkh, fake_cupy, monkeypatch):
    with pytest.raises(UserError, match="lean=True runs no hook code"):
        mkh.start(3, lean=True, hooks="all")
    with pytest.raises(UserError, match="handoff_after must be >= 0"):
        mkh.start(3, handoff_after=-1)
    with pytest.raises(UserError, match="needs the workers placed"):
        mkh.place_workers([])
    with pytest.raises(UserError, match="needs the workers placed"):
        mkh.record_placement()
    plain = gpu.Megakernel(PRESETS["tiny"], batch=2, num_workers=4)
    with pytest.raises(UserError, match="built without handoff"):
        plain.start(3, lean=True)
    with pytest.raises(UserError, match="leave DTMK_NO_HOOKS out"):
        gpu.Megakernel(PRESETS["tiny"], batch=2, num_workers=4, handoff=True, defines=("DTMK_NO_HOOKS",))
    fn = gpu.load_module("sm_90a", "megakernel.cu").get_function("dtmk_megakernel")
    fn.num_regs, fn.shared_size_bytes = 64, 1344              # two such CTAs fit one SM
    monkeypatch.setattr(gpu, "one_cta_per_sm", ONE_CTA_PER_SM)
    with pytest.raises(UserError, match="64 registers x 512 threads.*could share an SM"):
        gpu.Megakernel(PRESETS["tiny"], batch=2, num_workers=4, handoff=True)
