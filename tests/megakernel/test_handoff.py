"""Grid handoff (kernels/megakernel.cu "grid handoff", Megakernel(handoff=True)) on the CPU:

* the claim protocol, modelled: lean workers leave in any order while they wait on the
  successors of workers that left before them; successor CTAs are placed only on SMs a lean
  worker freed and take the next PUSHED worker.  Under random schedules every worker is
  resumed exactly once and nothing deadlocks; the naive rule (successor b resumes worker b)
  deadlocks, so the model can fail;
* which build has which half (lean: leave, hook build: resume, default: neither) and the
  constants shared by megakernel.cu and gpu.py;
* the host side with the NumPy stand-in for CuPy: which kernel each launch runs, the
  params that tie the two grids to one block, the control word and its order.
The kernel on the GPU: tests/gpu/test_handoff_gpu.py."""
import random
import re
import sys

import numpy as np
import pytest

from dtrace_mk.errors import UserError
from dtrace_mk.kernels.build import nvrtc_compile
from dtrace_mk.megakernel import gpu
from dtrace_mk.megakernel.gpu import KERNEL_DIR
from dtrace_mk.megakernel.presets import PRESETS


# ---- the protocol, modelled --------------------------------------------------------------
def simulate(n_workers: int, n_sms: int, deps, rng, naive: bool = False) -> dict:
    """One random schedule.  deps[w]: workers whose NEXT task lean worker w waits for
    before it reaches the task boundary where it leaves; if such a worker already left,
    its successor must be running.  Returns {"resumed": [...], "deadlock": bool}."""
    lean = set(range(n_workers))          # lean CTAs still on their SMs
    left, queue = set(), []               # workers that left; the push queue
    placed = []                           # successor CTAs: [block, claimed slot or None, worker or None]
    resumed = []
    next_block = 0
    while len(resumed) < n_workers:
        acts = []
        for w in lean:
            if all(v not in left or v in resumed for v in deps[w]):
                acts.append(("leave", w))
        if len(lean) + len(placed) < n_sms and next_block < n_workers:
            acts.append(("place", None))
        for s in placed:
            if s[2] is not None:
                continue
            if naive:
                if s[0] in left:
                    acts.append(("resume", s))
            elif s[1] is None:
                acts.append(("claim", s))
            elif s[1] < len(queue):
                acts.append(("resume", s))
        if not acts:
            return {"resumed": resumed, "deadlock": True}
        kind, x = rng.choice(acts)
        if kind == "leave":
            lean.discard(x)
            left.add(x)
            queue.append(x)
        elif kind == "place":
            placed.append([next_block, None, None])
            next_block += 1
        elif kind == "claim":                         # atomicAdd on the claim counter
            x[1] = sum(s[1] is not None for s in placed)
        else:
            x[2] = x[0] if naive else queue[x[1]]
            resumed.append(x[2])
    return {"resumed": resumed, "deadlock": False}


def random_deps(n, rng):
    """Each worker waits on up to 3 others' next tasks (any pattern a plan can make:
    only the ORDER of leaving is constrained, and the simulation allows every order)."""
    return {w: rng.sample([v for v in range(n) if v != w], k=min(n - 1, rng.randint(0, 3))) for w in range(n)}


@pytest.mark.parametrize("n_workers, n_sms", [(4, 4), (8, 8), (6, 9), (16, 16)])
def test_claim_protocol_resumes_every_worker_once_without_deadlock(n_workers, n_sms):
    rng = random.Random(n_workers * 100 + n_sms)
    for _ in range(300):
        out = simulate(n_workers, n_sms, random_deps(n_workers, rng), rng)
        assert not out["deadlock"], out
        assert sorted(out["resumed"]) == list(range(n_workers))


def test_the_naive_successor_rule_deadlocks_in_the_model():
    """Successor block b resuming worker b: worker 1 leaves first, block 0 takes its SM
    and waits for worker 0, which (like 2 and 3) waits on worker 1's next task: no SM is
    left for block 1."""
    rng = random.Random(7)
    deps = {0: [1], 1: [], 2: [1], 3: [1]}
    outs = [simulate(4, 4, deps, rng, naive=True)["deadlock"] for _ in range(200)]
    assert any(outs)
    assert not any(simulate(4, 4, deps, rng)["deadlock"] for _ in range(200))


# ---- the kernel sources ------------------------------------------------------------------
@pytest.fixture(scope="module")
def ptx():
    src = (KERNEL_DIR / "megakernel.cu").read_text()
    out = {}
    for name, defs in {"default": (), "lean": ("DTMK_NO_HOOKS", "DTMK_HANDOFF"), "hook": ("DTMK_HANDOFF",),
                       "nohooks": ("DTMK_NO_HOOKS",),
                       "lean_after": ("DTMK_NO_HOOKS", "DTMK_HANDOFF", "DTMK_HO_AFTER_SYNC")}.items():
        out[name] = nvrtc_compile(src, "megakernel.cu", "sm_90a", "ptx", defines=defs).decode()
    return out


def _funcs(ptx_text):
    return set(re.findall(r"\.func\s+(?:\([^)]*\)\s*)?(\w+)", ptx_text))


def test_each_build_has_its_half_of_the_handoff(ptx):
    has = {k: {f for f in ("ho_save", "ho_push", "ho_claim") if any(f in g for g in _funcs(v))} for k, v in ptx.items()}
    assert has == {"default": set(), "lean": {"ho_save", "ho_push"}, "hook": {"ho_claim"}, "nohooks": set(),
                   "lean_after": {"ho_save", "ho_push"}}


def _until_first_barrier(ptx_text, func):
    """The PTX of `func` up to its first CTA barrier, registers and labels renamed away:
    thread 0's path to the wait's first look and the barrier behind it."""
    m = re.search(r"^\.func[^\n]*" + func + r"[^\n]*\n(.*?)^}", ptx_text, re.M | re.S)
    assert m, func
    body = m.group(1)
    body = body[:body.index("bar.sync")]
    body = "\n".join(ln for ln in body.splitlines() if not ln.strip().startswith(".reg"))   # counts only
    body = re.sub(r"%[a-z]+\d+", "%R", body)
    return re.sub(r"\$L__BB\d+_\d+", "L", body)


def test_the_after_sync_leave_keeps_thread_0s_wait_prologue_the_no_hook_builds(ptx):
    """-DDTMK_HO_AFTER_SYNC (prepared in session 11): the lean worker's leave test moves
    behind the wait's first barrier, so the path every dependency handoff waits on is
    the no-hook build's, instruction for instruction; the default lean build tests there."""
    base = _until_first_barrier(ptx["nohooks"], "wait_event")
    assert _until_first_barrier(ptx["lean_after"], "wait_event") == base
    assert _until_first_barrier(ptx["lean"], "wait_event") != base


def test_handoff_constants_agree_between_kernel_and_host():
    src = (KERNEL_DIR / "megakernel.cu").read_text()
    assert int(re.search(r"#define CTL_HANDOFF (\d+)", src).group(1)) == gpu.CTL_HANDOFF
    assert int(re.search(r"#define HO_WORDS (\d+)", src).group(1)) == gpu.HO_WORDS
    assert gpu.CTL_HANDOFF < gpu.CTL_WORDS and gpu.CTL_HANDOFF not in (gpu.CTL_GATE, gpu.CTL_GEN)


def test_handoff_refuses_a_stream_started_before_the_wait():
    src = (KERNEL_DIR / "megakernel.cu").read_text()
    with pytest.raises(Exception, match="DTMK_HANDOFF"):
        nvrtc_compile(src, "megakernel.cu", "sm_90a", "ptx", defines=("DTMK_NO_HOOKS", "DTMK_HANDOFF", "DTMK_WS_NEXT"))


# ---- the host side -----------------------------------------------------------------------
sys.path.insert(0, __import__("os").path.dirname(__file__))
from test_resident_host_cpu import _Event, _Stream  # noqa: E402
from test_tp_launcher_cpu import fake_cupy  # noqa: E402,F401  (the NumPy stand-in)


@pytest.fixture()
def mkh(fake_cupy, monkeypatch):
    import ctypes
    import types
    rt = fake_cupy.cuda
    writes, preloads = [], []
    monkeypatch.setattr(gpu.Megakernel, "_preload", lambda self, k: preloads.append(k))

    def memcpy(dst, src, n, kind, s):
        writes.append((dst, n))
        ctypes.memmove(dst, src, n)
    rt.runtime = types.SimpleNamespace(memcpyAsync=memcpy, memcpyHostToDevice=1, memcpyDeviceToHost=2,
                                       deviceSynchronize=lambda: None)
    rt.alloc_pinned_memory = lambda n: bytearray(n)
    rt.Stream, rt.Event = _Stream, _Event
    rt.get_elapsed_time = lambda a, b: 1.5
    m = gpu.Megakernel(PRESETS["tiny"], batch=2, num_workers=4, handoff=True)
    m.launches, m.writes, m.preloads = [], writes, preloads

    def kern(tag):
        return lambda grid, block, args, shared_mem=0, stream=None: m.launches.append(
            (tag, dict(zip(gpu.PARAM_FIELDS, (int(x) for x in np.asarray(args[0]))))))
    m.kernel, m.lean_kernel = kern("hook"), kern("lean")
    return m


def test_the_two_builds_differ_only_in_hook_code(mkh):
    assert "DTMK_HANDOFF" in mkh.defines and "DTMK_NO_HOOKS" not in mkh.defines
    assert set(mkh.lean_defines) - set(mkh.defines) == {"DTMK_NO_HOOKS"}


def test_the_hook_build_is_loaded_before_any_lean_launch(mkh):
    """CUDA loads a module at its first launch and that load waits for running kernels:
    the successor's first launch must not be the one during a lean run (tiny deadlocked)."""
    assert len(mkh.preloads) == 1 and mkh.launches == []


def test_a_lean_start_then_a_handoff_ties_both_grids_to_one_block(mkh):
    h = mkh.start(5, lean=True)
    assert [t for t, _ in mkh.launches] == ["lean"]
    lean = mkh.launches[0][1]
    assert lean["handoff_out"] == int(h["handoff"]["block"].data.ptr) != 0 and lean["handoff_in"] == 0
    assert int(mkh.buf["control"][gpu.CTL_HANDOFF]) == 0          # not asked yet
    assert mkh.handoff(h) is True
    assert [t for t, _ in mkh.launches] == ["lean", "hook"]
    succ = mkh.launches[1][1]
    assert succ["handoff_in"] == lean["handoff_out"] and succ["handoff_out"] == 0
    assert {k: v for k, v in succ.items() if not k.startswith("handoff")} == \
        {k: v for k, v in lean.items() if not k.startswith("handoff")}
    # the leave request is written after the successor was launched
    assert int(mkh.buf["control"][gpu.CTL_HANDOFF]) == 1
    assert mkh.writes[-1] == (int(mkh.buf["control"].data.ptr) + 4 * gpu.CTL_HANDOFF, 4)
    assert mkh.handoff(h) is False                                 # once per launch
    assert len(mkh.launches) == 2


def test_handoff_after_asks_before_the_launch(mkh):
    mkh.start(3, handoff_after=6)
    assert [t for t, _ in mkh.launches] == ["lean", "hook"]
    assert int(mkh.buf["control"][gpu.CTL_HANDOFF]) == 7


def test_a_plain_start_runs_the_hook_build_and_never_hands_off(mkh):
    h = mkh.start(3)
    assert [t for t, _ in mkh.launches] == ["hook"] and mkh.launches[0][1]["handoff_out"] == 0
    assert mkh.handoff(h) is False and h["handoff"] is None


def test_bad_handoff_requests_are_refused(mkh, fake_cupy):
    with pytest.raises(UserError, match="lean=True runs no hook code"):
        mkh.start(3, lean=True, hooks="all")
    with pytest.raises(UserError, match="handoff_after must be >= 0"):
        mkh.start(3, handoff_after=-1)
    plain = gpu.Megakernel(PRESETS["tiny"], batch=2, num_workers=4)
    with pytest.raises(UserError, match="built without handoff"):
        plain.start(3, lean=True)
    with pytest.raises(UserError, match="leave DTMK_NO_HOOKS out"):
        gpu.Megakernel(PRESETS["tiny"], batch=2, num_workers=4, handoff=True, defines=("DTMK_NO_HOOKS",))
