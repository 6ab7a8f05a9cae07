"""Host map model: the semantics the sim and device maps must match."""
import pytest

from dtrace_mk.abi import definition as abi
from dtrace_mk.bpf import maps as M
from dtrace_mk.bpf.program import LoadError, MapDef


def k4(i):
    return i.to_bytes(4, "little")


def v8(i):
    return (i & (2**64 - 1)).to_bytes(8, "little")


def test_every_abi_map_type_has_a_model():
    assert set(M.MAP_CLASSES) == set(abi.MAP_TYPES_BY_NAME)


def test_create_map_validates():
    with pytest.raises(LoadError, match="map 'a': key_size must be 4 for array"):
        M.create_map(MapDef("a", "array", 8, 8, 4))
    with pytest.raises(LoadError, match="ringbuf needs budget_bytes"):
        M.create_map(MapDef("r", "ringbuf", 0, 0, 64))


def test_hash_full_e2big_counts_lost_and_replace_still_works():
    h = M.create_map(MapDef("h", "hash", 4, 8, 2))
    assert h.update(k4(1), v8(1)) == 0 and h.update(k4(2), v8(2)) == 0
    assert h.update(k4(3), v8(3)) == -abi.E2BIG
    assert h.stats.lost == 1
    assert h.update(k4(1), v8(10)) == 0                      # existing key in a full map
    assert h.snapshot() == {k4(1): v8(10), k4(2): v8(2)}
    assert h.delete(k4(2)) == 0 and h.delete(k4(2)) == -abi.ENOENT
    assert h.update(k4(3), v8(3)) == 0
    assert h.lookup(k4(9)) is None


def test_hash_flags_and_pointer_stability():
    h = M.create_map(MapDef("h", "hash", 4, 8, 4))
    assert h.update(k4(1), v8(1), M.BPF_EXIST) == -abi.ENOENT
    assert h.update(k4(1), v8(1), M.BPF_NOEXIST) == 0
    assert h.update(k4(1), v8(2), M.BPF_NOEXIST) == -abi.EEXIST
    assert h.update(k4(1), v8(2), 7) == -abi.EINVAL
    ref = h.lookup(k4(1))
    assert h.update(k4(1), v8(5), M.BPF_EXIST) == 0
    assert bytes(ref) == v8(5)                               # updates are in place
    ref[0] = 9
    assert h.snapshot()[k4(1)] == v8(9)
    assert h.stats.lost == 0
    with pytest.raises(ValueError, match="key of 2 bytes, expected 4"):
        h.update(b"xx", v8(1))


def test_array_semantics():
    a = M.create_map(MapDef("a", "array", 4, 8, 3))
    assert bytes(a.lookup(k4(2))) == bytes(8)                # exists, zeroed
    assert a.lookup(k4(3)) is None
    assert a.update(k4(3), v8(1)) == -abi.E2BIG and a.stats.lost == 1
    assert a.update(k4(0), v8(1), M.BPF_NOEXIST) == -abi.EEXIST
    assert a.update(k4(1), v8(4), M.BPF_EXIST) == 0
    assert a.delete(k4(1)) == -abi.EINVAL
    assert a.snapshot() == {k4(0): bytes(8), k4(1): v8(4), k4(2): bytes(8)}
    assert a.snapshot(skip_zero=True) == {k4(1): v8(4)}
    a.clear()
    assert a.snapshot(skip_zero=True) == {} and a.stats.lost == 0


def test_array_init_value_for_rodata():
    a = M.create_map(MapDef(".rodata", "array", 4, 8, 1, init_value=b"hi", read_only=True))
    assert a.snapshot() == {k4(0): b"hi" + bytes(6)}
    assert bytes(a.lookup(k4(0))) == b"hi" + bytes(6)


def test_per_worker_array_copies_and_sum():
    p = M.create_map(MapDef("p", "per_worker_array", 4, 8, 2), num_workers=3)
    p.lookup(k4(0), worker=0)[:] = v8(5)
    assert p.update(k4(0), v8(7), worker=2) == 0
    assert bytes(p.lookup(k4(0), worker=1)) == bytes(8)
    assert p.snapshot(skip_zero=True) == {k4(0): [v8(5), bytes(8), v8(7)]}
    assert p.snapshot(skip_zero=True, per_worker=False) == {k4(0): v8(12)}
    with pytest.raises(ValueError, match="worker 3 out of range"):
        p.lookup(k4(0), worker=3)


def test_sum_values_wraps_per_word():
    assert M.sum_values([v8(2**64 - 1), v8(2)]) == v8(1)
    a = (0xFFFFFFFF).to_bytes(4, "little") + (1).to_bytes(4, "little") + b"\x01\x00\x00\x00"
    b = (1).to_bytes(4, "little") + (1).to_bytes(4, "little") + b"\x01\x00\x00\x00"
    assert M.sum_values([a, b]) == bytes(4) + (2).to_bytes(4, "little") + b"\x02\x00\x00\x00"


@pytest.mark.parametrize("v,b", [(0, 0), (1, 1), (2, 2), (3, 2), (4, 3), (7, 3), (8, 4),
                                 (2**62, 63), (2**63 - 1, 63), (2**64 - 1, 63), (-1, 63)])
def test_log2_bucket(v, b):
    assert M.log2_bucket(v) == b


def test_linear_bucket_edges():
    m = MapDef("h", "hist_linear", 4, 0, 1, lin_lo=-10, lin_hi=25, lin_step=10)
    assert m.hist_buckets == 4 + 2    # [-10,0) [0,10) [10,20) [20,25) + under/over
    want = {-11: 0, -10: 1, -1: 1, 0: 2, 19: 3, 20: 4, 24: 4, 25: 5, 2**63 - 1: 5, 2**64 - 1: 1}
    for v, b in want.items():
        assert M.linear_bucket(m, v) == b, v


def test_hist_add_and_full():
    h = M.create_map(MapDef("h", "hist_log2", 4, 512, 1))
    assert h.hist_add(k4(1), 5) == 0 and h.hist_add(k4(1), 6) == 0
    assert h.hist_add(k4(2), 5) == -abi.E2BIG and h.stats.lost == 1
    snap = h.snapshot()
    assert snap[k4(1)][3] == 2 and sum(snap[k4(1)]) == 2 and len(snap[k4(1)]) == 64


def test_ringbuf_budget_capacity_and_drain():
    r = M.create_map(MapDef("r", "ringbuf", 0, 0, 12, budget_bytes=8), num_workers=2)
    assert r.output(b"abcd", worker=0, epoch=0) == 0
    assert r.output(b"efgh", worker=0, epoch=0) == 0
    assert r.output(b"i", worker=0, epoch=0) == -abi.ENOSPC          # budget: throttled
    assert (r.stats.throttled, r.stats.lost) == (1, 0)
    assert r.budget_left(0, 0) == 0 and r.budget_left(1, 0) == 8
    assert r.output(b"ijkl", worker=0, epoch=1) == 0                 # new epoch budget
    assert r.output(b"m", worker=0, epoch=1) == -abi.ENOSPC          # ring holds 12 bytes: lost
    assert (r.stats.throttled, r.stats.lost) == (1, 1)
    assert r.output(b"zz", worker=1, epoch=0) == 0
    recs = r.drain()
    assert [(x.worker, x.epoch, x.data) for x in recs] == [
        (0, 0, b"abcd"), (0, 0, b"efgh"), (0, 1, b"ijkl"), (1, 0, b"zz")]
    assert r.drain() == []
    assert r.output(b"m", worker=0, epoch=1) == 0                    # drained: room again
    assert r.lookup(b"") is None and r.update(b"", b"") == -abi.EINVAL


def test_mapset_indexing_and_snapshot():
    ms = M.MapSet([MapDef("a", "array", 4, 8, 1), MapDef("h", "hash", 4, 4, 2)], num_workers=2)
    assert ms[0] is ms["a"] and len(ms) == 2
    ms["h"].update(k4(1), k4(2))
    assert ms.snapshot(skip_zero=True) == {"a": {}, "h": {k4(1): k4(2)}}
    ms.clear()
    assert ms.snapshot(skip_zero=True) == {"a": {}, "h": {}}


def test_ringbuf_retire_epochs_frees_budget_of_shipped_epochs_only():
    from dtrace_mk.bpf.maps import create_map
    from dtrace_mk.bpf.program import MapDef
    rb = create_map(MapDef("ev", "ringbuf", 0, 0, 4096, budget_bytes=16), num_workers=1)
    for epoch in (1, 2):
        assert rb.output(b"x" * 16, worker=0, epoch=epoch) == 0
        assert rb.output(b"y", worker=0, epoch=epoch) < 0          # over budget
    rb.retire_epochs(1)
    assert rb.output(b"z", worker=0, epoch=1) == 0                 # epoch 1 forgotten
    assert rb.output(b"z", worker=0, epoch=2) < 0                  # epoch 2 still counted
