"""A minimal protobuf wire-format writer and a generic reader (no .proto, no codegen).

Writer: `Msg` collects fields in order and `bytes(msg)` is the encoding; nested messages
are `Msg`s.  Reader: `parse(buf)` -> list of `(field_number, wire_type, value)` where
value is an int (varint, fixed32/64 as unsigned) or bytes (length-delimited); `fields`
groups them by field number.  Enough for the Perfetto trace format and its tests.
"""
from __future__ import annotations

import functools
import struct
from typing import Dict, Iterable, List, Tuple, Union

VARINT, I64, LEN, I32 = 0, 1, 2, 5


_SMALL = [bytes((i,)) for i in range(128)]


def varint(v: int) -> bytes:
    if 0 <= v < 128:
        return _SMALL[v]
    if v < 0:
        v &= (1 << 64) - 1              # int64: two's complement, 10 bytes
    out = bytearray()
    while v > 0x7F:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


@functools.lru_cache(maxsize=1024)
def key(field: int, wire_type: int) -> bytes:
    return varint((field << 3) | wire_type)


@functools.lru_cache(maxsize=4096)
def string_field(field: int, v: str) -> bytes:
    """A whole length-delimited string field (cached: names repeat)."""
    b = v.encode("utf-8")
    return key(field, LEN) + varint(len(b)) + b


class Msg:
    __slots__ = ("_parts",)

    def __init__(self):
        self._parts: List[bytes] = []

    def uint(self, field: int, v: int) -> "Msg":
        self._parts.append(key(field, VARINT) + varint(int(v)))
        return self

    int64 = uint    # two's complement for negatives, as protobuf's int64

    def boolean(self, field: int, v: bool) -> "Msg":
        return self.uint(field, 1 if v else 0)

    def fixed64(self, field: int, v: int) -> "Msg":
        self._parts.append(key(field, I64) + struct.pack("<Q", v & ((1 << 64) - 1)))
        return self

    def double(self, field: int, v: float) -> "Msg":
        self._parts.append(key(field, I64) + struct.pack("<d", float(v)))
        return self

    def bytes_(self, field: int, v: bytes) -> "Msg":
        self._parts.append(key(field, LEN) + varint(len(v)) + v)
        return self

    def string(self, field: int, v: str) -> "Msg":
        if len(v) <= 64:
            self._parts.append(string_field(field, v))
            return self
        return self.bytes_(field, v.encode("utf-8"))

    def msg(self, field: int, m: "Msg") -> "Msg":
        return self.bytes_(field, bytes(m))

    def __bytes__(self) -> bytes:
        return b"".join(self._parts)


class WireError(ValueError):
    pass


def _read_varint(buf: bytes, i: int) -> Tuple[int, int]:
    shift = v = 0
    while True:
        if i >= len(buf):
            raise WireError(f"truncated varint at byte {i}")
        b = buf[i]
        i += 1
        v |= (b & 0x7F) << shift
        if not b & 0x80:
            return v, i
        shift += 7
        if shift > 63:
            raise WireError(f"varint too long at byte {i}")


def parse(buf: bytes) -> List[Tuple[int, int, Union[int, bytes]]]:
    out = []
    i, n = 0, len(buf)
    while i < n:
        k, i = _read_varint(buf, i)
        field, wt = k >> 3, k & 7
        if field == 0:
            raise WireError(f"field number 0 at byte {i}")
        if wt == VARINT:
            v, i = _read_varint(buf, i)
        elif wt == I64:
            if i + 8 > n:
                raise WireError(f"truncated fixed64 at byte {i}")
            v = struct.unpack_from("<Q", buf, i)[0]
            i += 8
        elif wt == I32:
            if i + 4 > n:
                raise WireError(f"truncated fixed32 at byte {i}")
            v = struct.unpack_from("<I", buf, i)[0]
            i += 4
        elif wt == LEN:
            ln, i = _read_varint(buf, i)
            if i + ln > n:
                raise WireError(f"truncated length-delimited field {field} at byte {i}")
            v = bytes(buf[i:i + ln])
            i += ln
        else:
            raise WireError(f"unsupported wire type {wt} (field {field}) at byte {i}")
        out.append((field, wt, v))
    return out


def fields(buf: bytes) -> Dict[int, List[Union[int, bytes]]]:
    d: Dict[int, List[Union[int, bytes]]] = {}
    for f, _, v in parse(buf):
        d.setdefault(f, []).append(v)
    return d


def signed(v: int) -> int:
    """A varint read as int64."""
    return v - (1 << 64) if v >= 1 << 63 else v


def concat(msgs: Iterable[bytes]) -> bytes:
    return b"".join(msgs)
