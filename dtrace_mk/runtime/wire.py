"""What a monitor's answer and a full task trace cost on the wire: the same encoding for
both (msgpack, as the agent ships records: collectors.records), so bench/hooks.py can
compare their bytes like for like (issue 5: the summary monitor >= 100x fewer bytes than
an MPK-style trace).

    snapshot_wire(maps)      one snapshot of a monitor's maps
    trace_wire(records)      trace records (gpu.TRACE_DTYPE rows), one array per record

A map entry is [key, value] with keys and values as the unsigned integers they store
(little-endian, the kernel's layout; longer ones stay bytes); a histogram's value is its
nonzero buckets as [index, count, ...]; entries that are all zero are left out (a
reader of the snapshot sees them as absent, which the host map model treats alike).
"""
from __future__ import annotations

from typing import Any, Iterable, List

import msgpack


def _num(b: bytes) -> Any:
    return int.from_bytes(b, "little") if len(b) <= 8 else bytes(b)


def _value(v: Any) -> Any:
    if isinstance(v, (list, tuple)):             # a histogram: its nonzero buckets
        out: List[int] = []
        for i, c in enumerate(v):
            if c:
                out += [i, int(c)]
        return out
    return _num(v)


def snapshot_wire(maps: Iterable[Any]) -> bytes:
    """msgpack of [[map name, [[key, value], ...]], ...] for maps with .name and
    .snapshot() -> {key bytes: value bytes | histogram bucket list}."""
    body = []
    for m in maps:
        ents = [[_num(k), _value(v)] for k, v in sorted(m.snapshot(skip_zero=True).items())]
        body.append([m.name, ents])
    return msgpack.packb(body, use_bin_type=True)


def trace_wire(records) -> bytes:
    """msgpack of the trace as one array of integers per record (a numpy structured
    array of gpu.TRACE_DTYPE, or any rows of integers)."""
    names = getattr(getattr(records, "dtype", None), "names", None)
    rows = [[int(r[n]) for n in names] for r in records] if names else [[int(x) for x in r] for r in records]
    return msgpack.packb(rows, use_bin_type=True)
