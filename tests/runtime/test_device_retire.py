"""The host side of retiring device coverage rows (DeviceRuntime.retire_epochs; the GPU
side is tests/gpu/test_resident_gpu.py): a retired row and a device row of the same
(epoch, program_gen) add up, rows of other keys stay apart, empty rows are skipped."""
from types import SimpleNamespace

import numpy as np

from dtrace_mk.runtime import device as D


def test_coverage_rows_merge_retired_and_device_rows():
    prog = SimpleNamespace(name="p", hook=SimpleNamespace(name="task:end"))
    dp = SimpleNamespace(program=prog, retired={})
    c = np.zeros(1, D.COV_DTYPE)[0]
    c["rows"]["tag"] = D.COV_TAG_EMPTY
    c["rows"][3] = ((5 << 32) | 1, 10, 9, 1, 0, 0, 0, 0)
    D._fold_row(dp.retired, c["rows"][3])            # retired while the kernel ran ...
    c["rows"][7] = ((5 << 32) | 1, 4, 3, 0, 1, 1, 0, 0)   # ... and the same step's late events
    c["rows"][9] = ((6 << 32) | 1, 2, 2, 0, 0, 0, 0, 0)
    c["rows"][3]["tag"] = D.COV_TAG_EMPTY            # the retired row was freed
    got = {(cv.epoch, cv.program_gen): cv for cv in D.coverage_rows(dp, c)}
    assert sorted(got) == [(5, 1), (6, 1)]
    a = got[(5, 1)]
    assert (a.eligible, a.executed, a.throttled, a.lost, a.reasons.get("fault")) == (14, 12, 1, 1, 1)
    a.check()
    assert dp.retired == {(5, 1): [10, 9, 1, 0, 0]}       # reading does not change the host rows


def test_coverage_checks_only_rows_the_kernel_has_finished_when_told():
    """DeviceRuntime.coverage(check_upto=final): a row of a step the kernel still runs may
    be copied between its counters' updates (buckets first, eligible last: eligible below
    their sum); it is returned unchecked, a final row's invariant is checked."""
    import pytest
    from dtrace_mk.bpf.coverage import CoverageError
    prog = SimpleNamespace(name="p", hook=SimpleNamespace(name="task:end"))
    c = np.zeros(1, D.COV_DTYPE)
    c[0]["rows"]["tag"] = D.COV_TAG_EMPTY
    c[0]["rows"][1] = ((4 << 32) | 1, 8, 8, 0, 0, 0, 0, 0)     # step 4: final, consistent
    c[0]["rows"][2] = ((5 << 32) | 1, 6, 7, 0, 0, 0, 0, 0)     # step 5: mid-update (eligible not yet added)
    dp = SimpleNamespace(program=prog, retired={}, cov=SimpleNamespace(get=lambda: c.view(np.uint8)))
    rt = SimpleNamespace(_get=lambda aid: SimpleNamespace(progs=[dp]))
    rows = D.DeviceRuntime.coverage(rt, 1, check_upto=4)
    assert sorted((r.epoch, r.eligible) for r in rows) == [(4, 8), (5, 6)]
    with pytest.raises(CoverageError, match="epoch 5"):
        D.DeviceRuntime.coverage(rt, 1)
    c[0]["rows"][1]["executed"] = 9                            # a final row that is wrong: said
    with pytest.raises(CoverageError, match="epoch 4"):
        D.DeviceRuntime.coverage(rt, 1, check_upto=4)


def _rows_of(dp):
    return dp.cov.get().view(D.COV_DTYPE)[0]["rows"]


def _put_row(dp, j, epoch, gen, counts):
    """What a worker's first event of (epoch, gen) and its later ones leave in row j."""
    c = dp.cov.get().view(D.COV_DTYPE).copy()
    c[0]["rows"][j] = ((epoch << 32) | gen, *counts, 0, 0)
    dp.cov.set(c.view(np.uint8))


def test_retire_frees_final_rows_in_runs_and_reads_only_attachments_that_can_hold_them(monkeypatch):
    """DeviceRuntime.retire_epochs on the host twin of device memory: rows of epochs <=
    upto are folded into the host's rows (coverage() unchanged) and freed -- counters 0,
    tag empty -- while later rows and the rest of the table keep every byte; an
    attachment that cannot hold such a row (device summaries' next window, an ended one
    already retired past its end) costs no device read; a parked one counts again from
    its rearm."""
    from dtrace_mk.lang.pipeline import compile_query
    from dtrace_mk.runtime.compiled import HostCompiledRuntime
    from dtrace_mk.runtime.compiled.host import _HostArray
    from dtrace_mk.runtime.reference import PARKED
    obj = compile_query("task:end { @n[task.class] = count(); }", None, name="<q>").obj
    rt = HostCompiledRuntime(num_workers=2)
    a = rt.attach(obj, tier="hot", first_epoch=0)
    b = rt.attach(obj, tier="hot", first_epoch=16, replaces=a)       # a counts epochs 0..15
    p = rt.attach(obj, tier="hot", first_epoch=PARKED)                # parked until rearmed
    da, db, dpk = (rt._atts[x].progs[0] for x in (a, b, p))
    for j, ep in enumerate((0, 1, 2, 5, 3)):                         # rows 0..4: epochs 0, 1, 2, 5, 3
        _put_row(da, j, ep, 1, (10 + j, 9 + j, 1, 0, 0))
    _put_row(da, 9, 4, 1, (2, 2, 0, 0, 0))
    before = _rows_of(da).copy()
    want = {(cv.epoch, cv.program_gen): (cv.eligible, cv.executed) for cv in rt.coverage(a)}
    reads = []
    real_get = _HostArray.get
    monkeypatch.setattr(_HostArray, "get", lambda self, stream=None: reads.append(id(self)) or real_get(self))

    assert rt.retire_epochs(3) == 4                                  # epochs 0, 1, 2, 3: rows 0, 1, 2, 4
    assert reads == [id(da.cov)]                                     # b (from 16) and the parked one: not read
    rows = _rows_of(da)
    for j in (0, 1, 2, 4):
        assert rows[j]["tag"] == D.COV_TAG_EMPTY and not any(int(rows[j][f]) for f in D._COV_COUNTS)
    for j in [j for j in range(D.COV_ROWS) if j not in (0, 1, 2, 4)]:
        assert rows[j].tobytes() == before[j].tobytes()               # epoch 5's and 4's rows, empty ones
    assert da.retired == {(e, 1): [10 + j, 9 + j, 1, 0, 0] for j, e in ((0, 0), (1, 1), (2, 2), (4, 3))}
    assert {(cv.epoch, cv.program_gen): (cv.eligible, cv.executed) for cv in rt.coverage(a)} == want

    reads.clear()
    assert rt.retire_epochs(20) == 2                                 # a's last rows (epochs 4, 5); b from 16
    assert reads == [id(da.cov), id(db.cov)]
    reads.clear()
    rt.retire_epochs(21)
    assert reads == [id(db.cov)]                                     # a ended at 16, retired through 20
    rt.rearm(p, first_epoch=30)
    _put_row(dpk, 0, 30, 1, (1, 1, 0, 0, 0))
    reads.clear()
    assert rt.retire_epochs(30) == 1 and reads == [id(db.cov), id(dpk.cov)]


def test_retire_frees_the_ring_buffers_budget_slots_of_final_epochs_only():
    """DeviceMaps.retire_epochs: a ring buffer's per-worker budget slots of epochs <= upto
    get used = 0, then tag = none; later epochs' slots and the records keep every byte."""
    from dtrace_mk.bpf.program import MapDef
    from dtrace_mk.runtime.compiled import HostDevice
    dm = D.DeviceMaps(HostDevice, [MapDef("ev", "ringbuf", 0, 0, 4096, budget_bytes=512)], 3)
    rw = dm.bufs[0]["slots"].get().view(D.RB_WORKER_DTYPE).copy()
    rw["ep_tag"][0, :3] = (3, 7, 5)
    rw["ep_used"][0, :3] = (100, 70, 50)
    rw["ep_tag"][2, 4] = 4
    rw["ep_used"][2, 4] = 40
    rw["nrec"][0] = 9
    dm.bufs[0]["slots"].set(rw.view(np.uint8))
    dm.retire_epochs(5)
    got = dm.bufs[0]["slots"].get().view(D.RB_WORKER_DTYPE)
    none = D.EPOCH_NONE
    assert got["ep_tag"][0, :3].tolist() == [none, 7, none] and got["ep_used"][0, :3].tolist() == [0, 70, 0]
    assert got["ep_tag"][2, 4] == none and got["ep_used"][2, 4] == 0 and got["nrec"][0] == 9
    assert (got["ep_tag"][1] == none).all()
