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
