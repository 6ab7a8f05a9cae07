"""DeviceMaps.clear_hash (dtrace_mk/runtime/device.py) on the CPU twin of device memory
(compiled.HostDevice): a host clear empties a hash map's slots and its count / lost
statistics, and refuses a map that is not hash-typed.  (Kept from the removed
-DDTMK_MAP_CACHE tests: the clear itself is not about the cache.)"""
from __future__ import annotations

import numpy as np
import pytest

from dtrace_mk.bpf.program import MapDef
from dtrace_mk.runtime import compiled as C
from dtrace_mk.runtime.device import DeviceMaps


def _maps():
    return DeviceMaps(C.HostDevice, [MapDef("h8", "hash", 8, 8, 6), MapDef("arr", "array", 4, 8, 4)], 1)


def test_clear_hash_empties_the_map_and_its_counters():
    m = _maps()
    m.upload_hash(0, {b"\x01" * 8: b"\x02" * 8})
    m.upload_hash(0, {b"\x03" * 8: b"\x04" * 8})
    assert int(m.stats(0)["count"]) == 2
    assert len(m.readback().maps[0]._d) == 2
    m.bufs[0]["stats"][8:16].set(np.array([5], "<u8").view(np.uint8))      # lost = 5
    m.clear_hash(0)
    st = m.stats(0)
    assert int(st["count"]) == 0 and int(st["lost"]) == 0
    assert not m.readback().maps[0]._d


def test_clear_hash_refuses_a_map_that_is_not_hash_typed():
    with pytest.raises(Exception, match="clear_hash needs a hash map"):
        _maps().clear_hash(1)


def test_clear_restores_arrays_as_created_and_refuses_ring_buffers():
    """DeviceMaps.clear (a query's clear(@map) on a device runtime): a hash map empty, an
    array's and a per-worker array's values as created -- entry 0's init value (a loader's
    .rodata array) included -- and their counters zero; a ring buffer refused."""
    from dtrace_mk.errors import UserError
    init = (0x0123456789ABCDEF).to_bytes(8, "little")
    m = DeviceMaps(C.HostDevice, [MapDef("h8", "hash", 8, 8, 6), MapDef("arr", "array", 4, 8, 4),
                                  MapDef("mn", "array", 4, 8, 1, init_value=init),
                                  MapDef("pw", "per_worker_array", 4, 8, 2), MapDef("rb", "ringbuf", 0, 0, 4096, budget_bytes=512)], 3)
    created = m.readback()
    m.upload_hash(0, {b"\x01" * 8: b"\x02" * 8})
    for name, fill in (("arr", 7), ("mn", 3), ("pw", 9)):
        b = m.bufs[m.index(name)]
        b["values"].set(np.full(len(b["values"]), fill, np.uint8))
        b["stats"][8:16].set(np.array([4], "<u8").view(np.uint8))       # lost = 4
    dirty = m.readback()
    for name in ("h8", "arr", "mn", "pw"):
        assert dirty[name].snapshot() != created[name].snapshot(), name
        m.clear(m.index(name))
        got = m.readback()[name]
        assert got.snapshot() == created[name].snapshot() and got.stats.lost == 0, name
    assert m.readback()["mn"].lookup(b"\0\0\0\0") == init
    with pytest.raises(UserError, match="a ring buffer is drained, not cleared"):
        m.clear(m.index("rb"))
    with pytest.raises(KeyError, match="no map named 'nope'"):
        m.index("nope")
