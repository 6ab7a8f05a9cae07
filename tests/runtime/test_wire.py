"""dtrace_mk.runtime.wire: the bytes bench/hooks.py compares (a monitor snapshot vs a task
trace, both msgpack): what the encoding keeps, and that it decodes to the map contents."""
import msgpack
import numpy as np

from dtrace_mk.bpf.maps import create_map
from dtrace_mk.megakernel import gpu
from dtrace_mk.runtime.wire import snapshot_wire, trace_wire
from dtrace_mk.bpf.program import MapDef
from dtrace_mk.abi import definition as abi


def _maps():
    nb = abi.HIST_LOG2_BUCKETS
    lat = create_map(MapDef("lat", "hist_log2", 4, 8 * nb, 16))
    q = create_map(MapDef("queue", "hash", 4, 8, 256))
    for cls, durs in ((3, (1000, 1100, 70000)), (9, (5,))):
        for d in durs:
            lat.hist_add(cls.to_bytes(4, "little"), d)
    for w in range(132):
        q.update(w.to_bytes(4, "little"), (1 + w % 2).to_bytes(8, "little"))
    q.update((200).to_bytes(4, "little"), bytes(8))               # all zero: left out
    return lat, q


def test_snapshot_wire_decodes_to_the_maps_nonzero_contents():
    lat, q = _maps()
    body = msgpack.unpackb(snapshot_wire([lat, q]))
    assert [name for name, _ in body] == ["lat", "queue"]
    hist = dict((k, v) for k, v in body[0][1])
    full = {int.from_bytes(k, "little"): v for k, v in lat.snapshot().items()}
    for k, v in hist.items():                      # sparse buckets: [index, count, ...]
        assert dict(zip(v[::2], v[1::2])) == {i: c for i, c in enumerate(full[k]) if c}
    assert set(hist) == {3, 9}
    assert dict((k, v) for k, v in body[1][1]) == {w: 1 + w % 2 for w in range(132)}


def test_snapshot_wire_is_smaller_than_the_dense_entries():
    lat, q = _maps()
    dense = sum(len(k) + len(v) * 8 for k, v in lat.snapshot().items()) + \
        sum(len(k) + len(v) for k, v in q.snapshot().items())
    wire = len(snapshot_wire([lat, q]))
    assert wire < dense / 4, (wire, dense)          # small ints in one or two bytes, buckets sparse


def test_trace_wire_keeps_every_field_of_every_record():
    tr = np.zeros(3, dtype=gpu.TRACE_DTYPE)
    tr["t_dispatch"] = [10 ** 18, 10 ** 18 + 5, 2 ** 63]
    tr["dur_ns"] = [900, 12, 0]
    tr["worker"] = [0, 131, 7]
    rows = msgpack.unpackb(trace_wire(tr))
    assert rows == [[int(r[n]) for n in gpu.TRACE_DTYPE.names] for r in tr]
    assert msgpack.unpackb(trace_wire([[1, 2], [3, 4]])) == [[1, 2], [3, 4]]


def test_the_summary_snapshot_is_over_100x_fewer_wire_bytes_than_a_step_of_trace_on_1b(load_tool):
    """tools/summary_bytes.py on the sim (the GPU's record counts: 8822 trace records per
    1b step, 6,400 B of summary map entries, as bench/hooks.py measured on the H200)."""
    sb = load_tool("summary_bytes")
    r = sb.measure("1b", 2)
    assert r["trace_records_per_step"] == 8822 and r["summary_raw"] == 6400
    assert r["trace_wire_per_step"] >= 100 * r["summary_wire"], r
    assert r["trace_raw_per_step"] < 100 * r["summary_raw"]      # (dense histograms: 44x only)
