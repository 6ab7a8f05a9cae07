"""Worker placement on the GPU (-DDTMK_SM_WORKER, megakernel.cu "worker placement"): with a
map every task of worker k runs on SM order[k] in every launch, outputs keep every bit,
and a map that leaves out an SM the grid gets stops the launch instead of running two
plans on one worker."""
import numpy as np
import pytest

pytestmark = pytest.mark.gpu

from dtrace_mk.megakernel.presets import PRESETS

SMW = ("DTMK_NO_HOOKS", "DTMK_SM_WORKER")


@pytest.fixture(scope="module")
def mks():
    from dtrace_mk.megakernel import gpu
    return gpu.Megakernel(PRESETS["tiny"], batch=2, seed=0, defines=SMW), gpu.Megakernel(PRESETS["tiny"], batch=2, seed=0)


def test_each_plan_runs_on_its_mapped_sm_and_outputs_keep_every_bit(mks):
    m, plain = mks
    plain.reset()
    base = plain.run(6, trace=True)
    sms = sorted(m.place_workers())
    for order in (sms[::-1], sms[5:] + sms[:5]):
        assert m.place_workers(order) == order
        for _ in range(2):                          # the same SM in every launch
            m.reset()
            res = m.run(6, trace=True)
            assert np.array_equal(res.tokens, base.tokens)
            assert np.array_equal(res.logits, base.logits)
            tr = res.trace
            assert len(tr) == len(base.trace) > 0
            assert np.array_equal(tr["sm"], np.asarray(order)[tr["worker"]])
            # each worker ran its own plan: the same tasks per worker as in block order
            assert sorted(zip(tr["worker"].tolist(), tr["task_index"].tolist(), tr["step"].tolist())) == \
                sorted(zip(base.trace["worker"].tolist(), base.trace["task_index"].tolist(), base.trace["step"].tolist()))
    m.place_workers([])


def test_a_map_without_an_sm_of_the_grid_stops_the_launch(mks):
    from dtrace_mk.megakernel import gpu
    m, _ = mks
    order = m.place_workers()
    m.sm_map[order[3]] = -1                     # SM order[3] now runs no worker
    m.reset()
    res = m.run(2, raise_on_watchdog=False, watchdog_ms=500)
    assert int(m.buf["control"][gpu.CTL_ABORT]) == 3
    assert res.watchdog is not None and res.watchdog["reason"].startswith("worker placement")
    m.place_workers([])


def test_a_recorded_placement_is_where_each_worker_ran_and_pins_as_it_ran(mks):
    m, _ = mks
    sms = sorted(m.place_workers())
    m.record_placement()
    m.reset()
    res = m.run(3, trace=True)
    pl = m.placement()
    assert sorted(pl) == sms                                   # one worker per SM of the grid
    assert np.array_equal(res.trace["sm"], np.asarray(pl)[res.trace["worker"]])
    m.place_workers(pl)
    for _ in range(2):
        m.reset()
        res = m.run(3, trace=True)
        assert np.array_equal(res.trace["sm"], np.asarray(pl)[res.trace["worker"]])
    m.place_workers([])
