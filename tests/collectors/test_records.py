import msgpack
import pytest

from dtrace_mk.collectors.records import (MAX_EXPERTS, MAX_TASK_CLASSES, RECORD_VERSION, ClassStat,
                                          ClockSample, Coverage, EpochSummary, PingPong, RecordError,
                                          RemoteWait, Signal, max_packed_size, pack, pack_stream,
                                          unpack, unpack_stream)

BIG = (1 << 64) - 1


def _examples():
    cs = tuple(ClassStat(i, 8, 96_000, 13_000, 4_000, 2_400, 200) for i in range(3))
    return [
        EpochSummary(1, 7, 10_000, 190_000, cs, 9, 3, (4, 4, 4, 12), 2, 5_000, 4_000,
                     Coverage(100, 90, 6, 4)),
        RemoteWait(0, 1, 0, 42, 7, 1, 11, 123_456, 130_000),
        Signal(1, 0, 0, 42, 7, 1, 129_000),
        ClockSample(3, 987_654_321, 1_700_000_000_000_000_000),
        PingPong(2, 100, 5_000_123, 2_300),
    ]


@pytest.mark.parametrize("rec", _examples(), ids=lambda r: type(r).__name__)
def test_roundtrip_and_bound(rec):
    data = pack(rec)
    assert unpack(data) == rec
    assert len(data) <= max_packed_size(type(rec))
    assert msgpack.unpackb(data)[:2] == [type(rec).TAG, RECORD_VERSION]


def test_worst_case_sizes_respect_bound():
    cs = tuple(ClassStat(BIG, BIG, BIG, BIG, BIG, BIG, BIG) for _ in range(MAX_TASK_CLASSES))
    s = EpochSummary(BIG, BIG, BIG, BIG, cs, BIG, BIG, (BIG,) * MAX_EXPERTS, BIG, BIG, BIG,
                     Coverage(BIG, BIG, BIG, BIG))
    assert len(pack(s)) <= max_packed_size(EpochSummary)
    w = RemoteWait(*([-(1 << 63)] * 9))
    assert len(pack(w)) <= max_packed_size(RemoteWait)
    assert max_packed_size(RemoteWait) <= 100 and max_packed_size(Signal) <= 100


def test_summary_bounds_are_enforced():
    with pytest.raises(RecordError, match="33 task classes"):
        EpochSummary(0, 0, 0, 0, tuple(ClassStat(i) for i in range(33)))
    with pytest.raises(RecordError, match="65 experts"):
        EpochSummary(0, 0, 0, 0, (), expert_counts=(1,) * 65)


def test_stream_roundtrip():
    recs = _examples()
    assert list(unpack_stream(pack_stream(recs))) == recs


@pytest.mark.parametrize("wire,msg", [
    ([99, 1, 0], "record: unknown tag 99"),
    ([2, 7, 0, 1, 0, 0, 0, 0, 0, 0, 0], "RemoteWait: version 7, this collector reads version 1"),
    ([3, 1, 0, 1], "Signal: 2 fields, expected 7"),
    ("x", "record: expected [tag, version, ...], got str"),
])
def test_bad_records_name_the_problem(wire, msg):
    with pytest.raises(RecordError) as e:
        unpack(msgpack.packb(wire))
    assert str(e.value) == msg


def test_coverage_arithmetic():
    c = Coverage(10, 7, 2, 1) + Coverage(5, 5, 0, 0)
    assert c.as_dict() == {"eligible": 15, "executed": 12, "throttled": 2, "lost": 1}
    assert c.consistent and not Coverage(3, 1, 0, 0).consistent
