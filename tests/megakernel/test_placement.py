"""CI (no GPU): worker placement (-DDTMK_SM_WORKER, megakernel.cu "worker placement"):
the control word shared by kernel and host, Megakernel.place_workers' map and
record_placement (host side, NumPy stand-in for CuPy) and bench/placement.py's worker
orders.  (The grid handoff's use of it: test_handoff.py.)"""
import re
import sys

import numpy as np
import pytest

from dtrace_mk.errors import UserError
from dtrace_mk.megakernel import gpu
from dtrace_mk.megakernel.presets import PRESETS

sys.path.insert(0, __import__("os").path.dirname(__file__))
from test_tp_launcher_cpu import fake_cupy  # noqa: E402,F401  (the NumPy stand-in)
from dtrace_mk.kernels import megakernel_text


def test_sm_map_word_agrees_between_kernel_and_host():
    src = megakernel_text()
    assert int(re.search(r"#define CTL_SM_MAP (\d+)", src).group(1)) == gpu.CTL_SM_MAP
    used = {gpu.CTL_GATE, gpu.CTL_STAMP, gpu.CTL_STAMP + 1, gpu.CTL_OBS, gpu.CTL_OBS + 1, gpu.CTL_TABLES,
            gpu.CTL_TABLES + 1, gpu.CTL_GEN}
    assert gpu.CTL_SM_MAP + 1 < gpu.CTL_WORDS and not {gpu.CTL_SM_MAP, gpu.CTL_SM_MAP + 1} & used


def test_every_control_word_agrees_between_kernel_and_host():
    """megakernel.cu's #define CTL_* and the host's gpu.CTL_* name the same words, and no
    two control words share one (u64 ones take two)."""
    src = megakernel_text()
    kernel = {m.group(1): int(m.group(2)) for m in re.finditer(r"#define (CTL_\w+) (\d+)", src)}
    for name, word in kernel.items():
        if name == "CTL_STEP_OVERRIDE":          # (kernel-only: the host never writes it)
            continue
        assert getattr(gpu, name) == word, name
    wide = {"CTL_TABLES", "CTL_OBS", "CTL_STAMP", "CTL_SM_MAP", "CTL_OBSQ"}
    taken = []
    for name, word in kernel.items():
        if name != "CTL_WORDS":
            taken += [word, word + 1] if name in wide else [word]
    assert len(taken) == len(set(taken)) and max(taken) < kernel["CTL_WORDS"], sorted(taken)
    assert "CTL_GEN_DUE" in kernel


@pytest.fixture()
def mk(fake_cupy, monkeypatch):
    monkeypatch.setattr(gpu, "probe_smids", lambda blocks, smem: [7, 0, 3, 5][:blocks])
    return gpu.Megakernel(PRESETS["tiny"], batch=1, num_workers=4, defines=("DTMK_NO_HOOKS", "DTMK_SM_WORKER"))


def _ctl_map(m):
    m._prepare(None, False, None, 2000, 16)
    c = np.asarray(m.buf["control"]).astype(np.uint64)
    return int(c[gpu.CTL_SM_MAP]) | (int(c[gpu.CTL_SM_MAP + 1]) << 32)


def test_place_workers_maps_each_sm_to_its_worker(mk):
    assert _ctl_map(mk) == 0                           # no map: block order
    assert mk.place_workers() == [0, 3, 5, 7]          # default: SMs in id order
    assert list(mk.sm_map) == [0, -1, -1, 1, -1, 2, -1, 3]
    assert _ctl_map(mk) == int(mk.sm_map.data.ptr)
    mk.place_workers([5, 7, 0, 3])                      # worker 0 on SM 5, ...
    assert list(mk.sm_map) == [2, -1, -1, 3, -1, 0, -1, 1]
    assert mk.place_workers([]) == [] and mk.sm_map is None and _ctl_map(mk) == 0


def test_place_workers_refuses_what_is_not_a_permutation_of_the_sms(mk):
    with pytest.raises(UserError, match="permutation of the SMs"):
        mk.place_workers([0, 3, 5, 6])
    with pytest.raises(UserError, match="permutation of the SMs"):
        mk.place_workers([0, 3, 5, 5])


def test_place_workers_needs_the_build(fake_cupy):
    m = gpu.Megakernel(PRESETS["tiny"], batch=1, num_workers=4, defines=("DTMK_NO_HOOKS",))
    with pytest.raises(UserError, match="lacks -DDTMK_SM_WORKER"):
        m.place_workers()


def test_bench_orders_are_permutations(load_bench):
    pl = load_bench("placement")
    sm = [9, 2, 4, 1, 0, 6]
    o = pl.orders(sm)
    assert o["block"] is None
    for name, order in o.items():
        if order is not None:
            assert sorted(order) == sorted(sm), name
    assert o["sorted"] == [0, 1, 2, 4, 6, 9] and o["rev"] == o["sorted"][::-1]
    assert "hw_best" not in o
    found = [(3.0, [1, 2, 4, 9, 0, 6]), (1.0, [0, 1, 2, 4, 6, 9]), (2.0, [9, 6, 4, 2, 1, 0])]
    o = pl.orders(sm, found)
    assert (o["hw_best"], o["hw_median"], o["hw_worst"]) == (found[1][1], found[2][1], found[0][1])
    assert len(pl.pairs()) == len(set(pl.pairs())) and set(pl.CODE_MAPS) <= set(pl.MAPS)


def test_record_placement_asks_the_kernel_to_record(mk, monkeypatch):
    with pytest.raises(UserError, match="record_placement"):
        mk.placement()
    mk.place_workers()
    mk.record_placement()
    assert mk.sm_map is None
    assert _ctl_map(mk) == int(mk._sm_rec.data.ptr) | 1       # bit 0: record, keep the block order
    monkeypatch.setattr(mk.cp, "asnumpy", np.asarray, raising=False)
    mk._sm_rec[:] = [5, 0, 7, 3]
    assert mk.placement() == [5, 0, 7, 3]
    mk.place_workers(mk.placement())                           # a recorded placement pins as it ran
    assert list(mk.sm_map) == [1, -1, -1, 3, -1, 0, -1, 2] and mk._sm_rec is None


# -DDTMK_SM_IDLE (measurement only, session 27; bench/obs_split.py --idle-smids): SMs that run nothing
IDLE = ("DTMK_NO_HOOKS", "DTMK_SM_WORKER", "DTMK_SM_IDLE")


def test_idle_sms_add_ctas_that_the_map_marks_minus_two(fake_cupy, monkeypatch):
    monkeypatch.setattr(gpu, "probe_smids", lambda blocks, smem: [7, 0, 3, 5][:blocks])
    m = gpu.Megakernel(PRESETS["tiny"], batch=1, num_workers=3, defines=IDLE, idle_sms=1)
    assert (m.num_workers, m.grid, m.graph.num_workers) == (3, 4, 3)
    m.place_workers([5, 7, 0, 3])                      # workers 0-2 on SMs 5, 7, 0; SM 3 idle
    assert list(m.sm_map) == [2, -1, -1, -2, -1, 0, -1, 1]


@pytest.mark.parametrize("defines, kw, msg", [
    (("DTMK_NO_HOOKS", "DTMK_SM_WORKER"), {"idle_sms": 1}, "needs -DDTMK_SM_IDLE and -DDTMK_SM_WORKER"),
    (IDLE, {"idle_sms": -1}, "a count >= 0"),
    (IDLE, {"idle_sms": 1, "num_workers": 16}, r"1 idle SM\(s\) need 17 SMs .* this GPU has 16: num_workers <= 15")])
def test_idle_sms_refused_without_the_build_or_room(fake_cupy, defines, kw, msg):
    with pytest.raises(UserError, match=msg):
        gpu.Megakernel(PRESETS["tiny"], batch=1, defines=defines, **kw)


def test_an_idle_sm_leaves_before_it_touches_a_workers_rows():
    """sm_worker marks map value -2 (MK_IDLE_SM); every thread leaves after the barrier that
    publishes it, before obs_init (which would write worker 0's observer rows)."""
    from tests.megakernel.test_hook_sites import body
    assert "if (w == -2) { W.worker = 0; W.aborted = MK_IDLE_SM; return; }" in body("sm_worker")
    k = body("dtmk_megakernel")
    i = k.index("if (W.aborted == MK_IDLE_SM) return;")
    assert k.index("sm_worker(P, W)") < k.rindex("MK_SYNC()", 0, i) < i < k.index("obs_init(P, W)")


@pytest.mark.slow
def test_the_idle_build_compiles_and_needs_the_placement():
    from dtrace_mk.kernels.build import nvrtc_compile
    src = megakernel_text()
    for defs in (IDLE, ("DTMK_OBS_SM", "DTMK_OBS_SMS=4", "DTMK_SM_WORKER", "DTMK_SM_IDLE")):
        assert ".entry dtmk_megakernel" in nvrtc_compile(src, "megakernel.cu", "sm_90a", "ptx", defines=defs).decode()
    with pytest.raises(Exception, match="DTMK_SM_IDLE leaves the SMs a placement map marks -2 idle"):
        nvrtc_compile(src, "megakernel.cu", "sm_90a", "ptx", defines=("DTMK_SM_IDLE",))
