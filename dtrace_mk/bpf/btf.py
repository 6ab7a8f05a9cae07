"""BTF (BPF Type Format) as far as dtrace_mk needs it: parse the `.BTF` section clang
emits (to recover BTF-defined map definitions) and build one (for objects written by
`dtrace_mk.bpf.elfwrite`).

Layout (Linux Documentation/bpf/btf.rst): a 24-byte header (magic 0xeB9F, version 1,
flags, hdr_len, type_off, type_len, str_off, str_len; offsets count from the end of
the header), then the type records, then a string table.  Type ids start at 1 (0 is
`void`).  Each record is `name_off:u32, info:u32, size_or_type:u32` followed by
kind-specific data; `info` packs vlen (bits 0-15), kind (bits 24-28) and kind_flag
(bit 31).

Only what maps need is interpreted (sizes, names, the `__uint`/`__type` encoding of
map members); every kind is still walked so that any valid BTF parses.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

BTF_MAGIC = 0xEB9F
BTF_VERSION = 1
HEADER_SIZE = 24

KIND_INT, KIND_PTR, KIND_ARRAY, KIND_STRUCT, KIND_UNION, KIND_ENUM, KIND_FWD = 1, 2, 3, 4, 5, 6, 7
KIND_TYPEDEF, KIND_VOLATILE, KIND_CONST, KIND_RESTRICT, KIND_FUNC, KIND_FUNC_PROTO = 8, 9, 10, 11, 12, 13
KIND_VAR, KIND_DATASEC, KIND_FLOAT, KIND_DECL_TAG, KIND_TYPE_TAG, KIND_ENUM64 = 14, 15, 16, 17, 18, 19

KIND_NAMES = {
    KIND_INT: "int", KIND_PTR: "ptr", KIND_ARRAY: "array", KIND_STRUCT: "struct",
    KIND_UNION: "union", KIND_ENUM: "enum", KIND_FWD: "fwd", KIND_TYPEDEF: "typedef",
    KIND_VOLATILE: "volatile", KIND_CONST: "const", KIND_RESTRICT: "restrict",
    KIND_FUNC: "func", KIND_FUNC_PROTO: "func_proto", KIND_VAR: "var", KIND_DATASEC: "datasec",
    KIND_FLOAT: "float", KIND_DECL_TAG: "decl_tag", KIND_TYPE_TAG: "type_tag", KIND_ENUM64: "enum64",
}
_MODIFIERS = (KIND_TYPEDEF, KIND_VOLATILE, KIND_CONST, KIND_RESTRICT, KIND_TYPE_TAG)

INT_SIGNED = 1 << 0
VAR_GLOBAL_ALLOCATED = 1


class BtfError(ValueError):
    """Malformed BTF; the message says where (byte offset or type id) and what."""


@dataclass
class BtfMember:
    name: str
    type: int
    offset: int = 0        # bit offset (struct/union), value (enum), var offset (datasec)
    size: int = 0          # datasec entries only


@dataclass
class BtfType:
    id: int
    kind: int
    name: str
    size: int = 0          # INT/STRUCT/UNION/ENUM/FLOAT/DATASEC
    type: int = 0          # PTR/TYPEDEF/modifiers/FUNC/VAR/DECL_TAG, FUNC_PROTO return
    nelems: int = 0        # ARRAY
    index_type: int = 0    # ARRAY
    members: List[BtfMember] = field(default_factory=list)
    int_encoding: int = 0  # INT
    int_bits: int = 0      # INT
    linkage: int = 0       # VAR / FUNC
    kind_flag: bool = False

    @property
    def kind_name(self) -> str:
        return KIND_NAMES.get(self.kind, f"kind#{self.kind}")


class Btf:
    """Parsed BTF: `types[id]` (index 0 is a `void` placeholder); `strings` is the raw
    string table (`.BTF.ext` records point into it)."""

    def __init__(self, types: List[BtfType], strings: bytes = b""):
        self.types = types
        self.strings = strings

    def string(self, off: int) -> str:
        if not 0 <= off < len(self.strings):
            raise BtfError(f"string offset {off} past the string table ({len(self.strings)} bytes)")
        end = self.strings.find(b"\0", off)
        return self.strings[off:end if end >= 0 else len(self.strings)].decode("utf-8", "replace")

    # --- lookups -----------------------------------------------------------------------
    def __getitem__(self, tid: int) -> BtfType:
        if not 0 < tid < len(self.types):
            raise BtfError(f"type id {tid} out of range 1..{len(self.types) - 1}")
        return self.types[tid]

    def var(self, name: str) -> Optional[BtfType]:
        for t in self.types[1:]:
            if t.kind == KIND_VAR and t.name == name:
                return t
        return None

    def datasec(self, name: str) -> Optional[BtfType]:
        for t in self.types[1:]:
            if t.kind == KIND_DATASEC and t.name == name:
                return t
        return None

    def resolve(self, tid: int) -> BtfType:
        """Follow typedefs and qualifiers to the underlying type."""
        seen = 0
        t = self[tid]
        while t.kind in _MODIFIERS:
            seen += 1
            if seen > 64:
                raise BtfError(f"type id {tid}: typedef/qualifier chain too long (a loop?)")
            t = self[t.type]
        return t

    def size_of(self, tid: int, _depth: int = 0) -> int:
        if tid == 0:
            raise BtfError("size of void")
        if _depth > 64:
            raise BtfError(f"type id {tid}: type nesting too deep")
        t = self.resolve(tid)
        if t.kind in (KIND_INT, KIND_STRUCT, KIND_UNION, KIND_ENUM, KIND_ENUM64, KIND_FLOAT, KIND_DATASEC):
            return t.size
        if t.kind == KIND_PTR:
            return 8
        if t.kind == KIND_ARRAY:
            return t.nelems * self.size_of(t.type, _depth + 1)
        raise BtfError(f"type id {t.id} ({t.kind_name} '{t.name}') has no size")

    def c_name(self, tid: int, _depth: int = 0) -> str:
        """A C-like spelling of a type for messages and map descriptions."""
        if tid == 0:
            return "void"
        if _depth > 16:
            return "..."
        t = self[tid]
        if t.kind in (KIND_STRUCT, KIND_UNION, KIND_ENUM, KIND_ENUM64):
            kw = {KIND_STRUCT: "struct", KIND_UNION: "union"}.get(t.kind, "enum")
            return f"{kw} {t.name}" if t.name else f"{kw} <anon>"
        if t.kind == KIND_FWD:
            return ("union " if t.kind_flag else "struct ") + t.name
        if t.kind in (KIND_CONST, KIND_VOLATILE, KIND_RESTRICT, KIND_TYPE_TAG):
            return self.c_name(t.type, _depth + 1)
        if t.kind == KIND_PTR:
            return self.c_name(t.type, _depth + 1) + " *"
        if t.kind == KIND_ARRAY:
            return f"{self.c_name(t.type, _depth + 1)}[{t.nelems}]"
        return t.name or t.kind_name


def parse(data: bytes) -> Btf:
    """Parse a `.BTF` section.  Raises BtfError naming the offset or type id."""
    if len(data) < HEADER_SIZE:
        raise BtfError(f"{len(data)} bytes is too short for a BTF header ({HEADER_SIZE})")
    magic, version, _flags, hdr_len = struct.unpack_from("<HBBI", data, 0)
    if magic != BTF_MAGIC:
        raise BtfError(f"bad magic 0x{magic:04x} (expected 0x{BTF_MAGIC:04x}; big-endian BTF is not supported)")
    if version != BTF_VERSION:
        raise BtfError(f"version {version} (expected {BTF_VERSION})")
    if hdr_len < HEADER_SIZE or hdr_len > len(data):
        raise BtfError(f"header length {hdr_len} out of range")
    type_off, type_len, str_off, str_len = struct.unpack_from("<IIII", data, 8)
    base = hdr_len
    if base + type_off + type_len > len(data) or base + str_off + str_len > len(data):
        raise BtfError("type or string section extends past the end of .BTF")
    strings = data[base + str_off: base + str_off + str_len]

    def s(off: int) -> str:
        if off >= len(strings):
            raise BtfError(f"string offset {off} past the string table ({len(strings)} bytes)")
        end = strings.find(b"\0", off)
        if end < 0:
            end = len(strings)
        return strings[off:end].decode("utf-8", "replace")

    types: List[BtfType] = [BtfType(0, 0, "void")]
    p, end = base + type_off, base + type_off + type_len

    def need(n: int) -> None:
        if p + n > end:
            raise BtfError(f"type id {len(types)}: record truncated at byte {p - base - type_off}")

    while p < end:
        need(12)
        name_off, info, st = struct.unpack_from("<III", data, p)
        p += 12
        vlen, kind = info & 0xFFFF, (info >> 24) & 0x1F
        t = BtfType(len(types), kind, s(name_off), kind_flag=bool(info >> 31))
        if kind == KIND_INT:
            need(4)
            (enc,) = struct.unpack_from("<I", data, p)
            p += 4
            t.size, t.int_encoding, t.int_bits = st, (enc >> 24) & 0xF, enc & 0xFF
        elif kind in (KIND_PTR, KIND_TYPEDEF, KIND_VOLATILE, KIND_CONST, KIND_RESTRICT, KIND_TYPE_TAG):
            t.type = st
        elif kind == KIND_FWD:
            pass
        elif kind == KIND_ARRAY:
            need(12)
            t.type, t.index_type, t.nelems = struct.unpack_from("<III", data, p)
            p += 12
        elif kind in (KIND_STRUCT, KIND_UNION):
            t.size = st
            need(12 * vlen)
            for _ in range(vlen):
                mn, mt, mo = struct.unpack_from("<III", data, p)
                p += 12
                t.members.append(BtfMember(s(mn), mt, mo))
        elif kind == KIND_ENUM:
            t.size = st
            need(8 * vlen)
            for _ in range(vlen):
                mn, mv = struct.unpack_from("<Ii", data, p)
                p += 8
                t.members.append(BtfMember(s(mn), 0, mv))
        elif kind == KIND_ENUM64:
            t.size = st
            need(12 * vlen)
            for _ in range(vlen):
                mn, lo, hi = struct.unpack_from("<III", data, p)
                p += 12
                t.members.append(BtfMember(s(mn), 0, lo | (hi << 32)))
        elif kind == KIND_FUNC:
            t.type, t.linkage = st, vlen
        elif kind == KIND_FUNC_PROTO:
            t.type = st
            need(8 * vlen)
            for _ in range(vlen):
                mn, mt = struct.unpack_from("<II", data, p)
                p += 8
                t.members.append(BtfMember(s(mn), mt))
        elif kind == KIND_VAR:
            need(4)
            t.type = st
            (t.linkage,) = struct.unpack_from("<I", data, p)
            p += 4
        elif kind == KIND_DATASEC:
            t.size = st
            need(12 * vlen)
            for _ in range(vlen):
                vt, vo, vs = struct.unpack_from("<III", data, p)
                p += 12
                t.members.append(BtfMember("", vt, vo, vs))
        elif kind == KIND_FLOAT:
            t.size = st
        elif kind == KIND_DECL_TAG:
            need(4)
            t.type = st
            p += 4
        else:
            raise BtfError(f"type id {len(types)}: unknown BTF kind {kind}")
        types.append(t)
    return Btf(types, bytes(strings))


@dataclass(frozen=True)
class LineInfo:
    insn_off: int          # byte offset in the section
    file: str
    line: int
    col: int
    text: str


def parse_line_info(ext: bytes, btf: Btf) -> Dict[str, List[LineInfo]]:
    """Line info of a `.BTF.ext` section: section name -> records.  Header: magic,
    version, flags, hdr_len, func_info_off/len, line_info_off/len (offsets from the end
    of the header); the line_info part is a record size, then per section
    `sec_name_off, num_info` and num_info records `insn_off, file_name_off, line_off,
    line_col` (line << 10 | col)."""
    if len(ext) < 24:
        raise BtfError(f".BTF.ext: {len(ext)} bytes is too short for its header")
    magic, version, _flags, hdr_len, _fo, _fl, lo, ll = struct.unpack_from("<HBBIIIII", ext, 0)
    if magic != BTF_MAGIC or version != BTF_VERSION:
        raise BtfError(f".BTF.ext: bad magic 0x{magic:04x} or version {version}")
    out: Dict[str, List[LineInfo]] = {}
    if not ll:
        return out
    p, end = hdr_len + lo, hdr_len + lo + ll
    if end > len(ext) or ll < 4:
        raise BtfError(".BTF.ext: line info extends past the end of the section")
    (rec_size,) = struct.unpack_from("<I", ext, p)
    p += 4
    if rec_size < 16:
        raise BtfError(f".BTF.ext: line info record size {rec_size} < 16")
    while p + 8 <= end:
        sec_off, n = struct.unpack_from("<II", ext, p)
        p += 8
        if p + n * rec_size > end:
            raise BtfError(".BTF.ext: line info block extends past the end of the section")
        recs = out.setdefault(btf.string(sec_off), [])
        for _ in range(n):
            insn_off, file_off, line_off, line_col = struct.unpack_from("<IIII", ext, p)
            p += rec_size
            recs.append(LineInfo(insn_off, btf.string(file_off), line_col >> 10, line_col & 0x3FF,
                                 btf.string(line_off).strip()))
    return out


class BtfBuilder:
    """Emit BTF: add types (each `add_*` returns the new type id), then `encode()`."""

    def __init__(self) -> None:
        self._strings = bytearray(b"\0")
        self._str_index: Dict[str, int] = {"": 0}
        self._records: List[bytes] = []
        self._memo: Dict[Tuple, int] = {}

    def _str(self, s: str) -> int:
        if s not in self._str_index:
            self._str_index[s] = len(self._strings)
            self._strings += s.encode() + b"\0"
        return self._str_index[s]

    def _add(self, name: str, kind: int, vlen: int, st: int, extra: bytes = b"", memo_key=None) -> int:
        if memo_key is not None and memo_key in self._memo:
            return self._memo[memo_key]
        self._records.append(struct.pack("<III", self._str(name), (kind << 24) | vlen, st) + extra)
        tid = len(self._records)
        if memo_key is not None:
            self._memo[memo_key] = tid
        return tid

    def add_int(self, name: str, size: int, signed: bool = False) -> int:
        enc = ((INT_SIGNED if signed else 0) << 24) | (size * 8)
        return self._add(name, KIND_INT, 0, size, struct.pack("<I", enc), ("int", name, size, signed))

    def add_ptr(self, target: int) -> int:
        return self._add("", KIND_PTR, 0, target, memo_key=("ptr", target))

    def add_typedef(self, name: str, target: int) -> int:
        return self._add(name, KIND_TYPEDEF, 0, target, memo_key=("typedef", name, target))

    def add_array(self, elem: int, index_type: int, nelems: int) -> int:
        return self._add("", KIND_ARRAY, 0, 0, struct.pack("<III", elem, index_type, nelems),
                         ("array", elem, index_type, nelems))

    def add_struct(self, name: str, size: int, members: List[Tuple[str, int, int]]) -> int:
        """members: (name, type id, bit offset)."""
        extra = b"".join(struct.pack("<III", self._str(n), t, o) for n, t, o in members)
        return self._add(name, KIND_STRUCT, len(members), size, extra)

    def add_fwd_struct(self, name: str) -> int:
        return self._add(name, KIND_FWD, 0, 0, memo_key=("fwd", name))

    def add_func_proto(self, ret: int, params: List[Tuple[str, int]]) -> int:
        extra = b"".join(struct.pack("<II", self._str(n), t) for n, t in params)
        return self._add("", KIND_FUNC_PROTO, len(params), ret, extra, ("proto", ret, tuple(params)))

    def add_func(self, name: str, proto: int, linkage: int = 1) -> int:
        return self._add(name, KIND_FUNC, linkage, proto)

    def add_var(self, name: str, type_id: int, linkage: int = VAR_GLOBAL_ALLOCATED) -> int:
        return self._add(name, KIND_VAR, 0, type_id, struct.pack("<I", linkage))

    def add_datasec(self, name: str, size: int, vars_: List[Tuple[int, int, int]]) -> int:
        """vars_: (var type id, offset, size)."""
        extra = b"".join(struct.pack("<III", *v) for v in vars_)
        return self._add(name, KIND_DATASEC, len(vars_), size, extra)

    def encode(self) -> bytes:
        types = b"".join(self._records)
        strings = bytes(self._strings)
        hdr = struct.pack("<HBBIIIII", BTF_MAGIC, BTF_VERSION, 0, HEADER_SIZE,
                          0, len(types), len(types), len(strings))
        return hdr + types + strings
