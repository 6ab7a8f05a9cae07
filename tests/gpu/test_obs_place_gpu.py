"""Observer placement on the GPU (dtrace_mk/megakernel/obs_place.py; -DDTMK_OBS_SM with
-DDTMK_SM_WORKER): Megakernel.place_observers puts the observers on the SMs named and worker
k on the k-th other SM (the trace: no task on an observer's SM), outputs keep every bit,
and calibrate_session leaves the observers on the cheapest candidate it measured, with the
monitor detached again."""
import numpy as np
import pytest

pytestmark = pytest.mark.gpu

from dtrace_mk.megakernel.presets import PRESETS


@pytest.fixture(scope="module")
def mks():
    from dtrace_mk.megakernel import gpu
    defines = gpu.observer_defines("sm", 4) + ("DTMK_SM_WORKER",)
    return (gpu.Megakernel(PRESETS["tiny"], batch=2, seed=0, defines=defines),
            gpu.Megakernel(PRESETS["tiny"], batch=2, seed=0))


def test_the_observers_run_on_the_sms_named_and_outputs_keep_every_bit(mks):
    m, plain = mks
    plain.reset()
    base = plain.run(6)
    ids = m.sm_ids()
    for obs in (ids[-4:], ids[:4], [ids[1], ids[20], ids[41], ids[62]]):
        order = m.place_observers(obs)
        assert order[-4:] == obs and sorted(order) == ids
        m.reset()
        res = m.run(6, trace=True)
        assert np.array_equal(res.tokens, base.tokens)
        assert np.array_equal(res.logits, base.logits)
        tr = res.trace
        assert len(tr) > 0 and not set(tr["sm"].tolist()) & set(obs)
        assert np.array_equal(tr["sm"], np.asarray(order)[tr["worker"]])


def test_calibration_keeps_the_cheapest_candidate_and_detaches_the_monitor(mks):
    from dtrace_mk.megakernel.obs_place import calibrate_session
    from dtrace_mk.runtime.live import LiveSession, summary_monitor
    m, plain = mks
    live = LiveSession(m)
    try:
        mon = summary_monitor(m.graph.schema)
        said = []
        cal = calibrate_session(live, mon.obj, steps=8, k=3, rounds=2, progress=said.append)
        med = cal.medians()
        assert cal.best == cal.candidates[med.index(min(med))] and cal.candidates[0] == m.sm_ids()[-4:]
        assert [len(u) for u in cal.us_per_step] == [2, 2, 2] and min(med) > 0
        assert len(said) == 2 and not live.rt._atts
        m.reset()
        res = m.run(4, trace=True)
        assert not set(res.trace["sm"].tolist()) & set(cal.best)
    finally:
        live.close()


def test_serves_grid_of_every_sm_pins_the_calibrated_observers_and_idles_one():
    """serve's placement (launch/serve.py observer_build): a grid of every SM, -DDTMK_SM_IDLE
    for the clock pairs' SM; calibrate_twin measures on a twin sharing the weights and graph,
    and the job's megakernel, pinned there, keeps every bit and runs no task on the observers'
    SMs nor on the idle one, whose CTA left at once."""
    from dtrace_mk.megakernel import gpu
    from dtrace_mk.megakernel.obs_place import calibrate_twin
    from dtrace_mk.runtime.live import summary_monitor
    import cupy as cp
    n_sm = int(cp.cuda.Device().attributes["MultiProcessorCount"])
    defines = gpu.observer_defines("sm", 4) + ("DTMK_SM_WORKER", "DTMK_SM_IDLE")
    make = lambda **kw: gpu.Megakernel(PRESETS["tiny"], batch=2, seed=0, defines=defines,  # noqa: E731
                                       num_workers=n_sm - 1 - 4, idle_sms=1, **kw)
    mk = make()
    assert mk.grid == n_sm and len(mk.sm_ids()) == n_sm
    twin = make(weights=mk.weights, graph=mk.graph)
    assert twin.weights["qkv"] is mk.weights["qkv"]          # (shared, not copied)
    cal = calibrate_twin(twin, summary_monitor(twin.graph.schema).obj, k=3, steps=8)
    order = mk.place_observers(cal.best)
    idle = order[-1]
    assert order[-5:-1] == cal.best and idle not in cal.best
    plain = gpu.Megakernel(PRESETS["tiny"], batch=2, seed=0)
    base = plain.run(6)
    mk.reset()
    res = mk.run(6, trace=True)
    assert np.array_equal(res.tokens, base.tokens) and np.array_equal(res.logits, base.logits)
    sms = set(res.trace["sm"].tolist())
    assert len(res.trace) > 0 and not sms & (set(cal.best) | {idle})
    assert mk.step == 6                                         # (the twin's steps are not the job's)
