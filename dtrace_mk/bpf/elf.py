"""ELF loader for eBPF monitor objects (what `clang -target bpf -O2 -g -c` emits, and
what `dtrace_mk.bpf.elfwrite` writes).

    obj = load_object("mon.o")            # or load_object(data_bytes, name="mon.o")

What an object holds and how it maps to a `BpfObject`:

* ELF64, little endian, relocatable, `e_machine == EM_BPF` (247).
* Programs: every executable section must be a hook section (`task/end`, see
  `abi.HOOKS_BY_SECTION`); each FUNC symbol in it is one program (slots
  `st_value/8 .. (st_value+st_size)/8`).  Non-empty `.text` (a function without a
  hook section) and BPF-to-BPF calls are refused.
* Maps: BTF-defined, in `.maps`, as libbpf does (`__uint(type, ...)`,
  `__type(key, ...)`, ...), plus dtrace_mk's `lin_lo/lin_hi/lin_step` (hist_linear)
  and `budget_bytes` (ringbuf); lin_lo/lin_hi are signed 32-bit (a negative bound:
  `__uint(lin_lo, (dtmk_u32)-100)`).  Map order: by offset in `.maps`.  The definitions
  come from `.BTF` (compile with `-g`).
* Relocations (`.rel<section>`, R_BPF_64_64 on an LD_IMM64): to a map symbol ->
  `src=PSEUDO_MAP_FD, imm=map index`; to `.rodata*` (constants, trace_printk formats)
  -> `src=PSEUDO_MAP_VALUE`, the map being one internal read-only array map named
  `.rodata` (1 entry; all `.rodata*` sections concatenated, each 8-aligned; appended
  after the BTF maps) and the upper imm the byte offset into its value.
* `license` (string), `dtmk_abi` (u32, required, must equal `abi.ABI_VERSION`),
  `dtmk_schema` (optional string: the task schema hash the object was built against).
* Any other section named `dtmk_*` is a note: `BpfObject.notes[name]` = its text (the
  query compiler stores its printing plan in `dtmk_plan`).

Every problem raises `LoadError` naming the file, the section/symbol and what was
expected.
"""
from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple, Union

from ..abi import definition as abi
from . import btf as btf_mod
from . import isa
from .isa import Insn
from .program import BpfObject, LoadError, MapDef, Program, SourceLine

# --- ELF constants -------------------------------------------------------------------
ELF_MAGIC = b"\x7fELF"
ELFCLASS64, ELFDATA2LSB = 2, 1
ET_REL = 1
EM_BPF = 247
SHT_NULL, SHT_PROGBITS, SHT_SYMTAB, SHT_STRTAB, SHT_RELA, SHT_NOBITS, SHT_REL = 0, 1, 2, 3, 4, 8, 9
SHF_WRITE, SHF_ALLOC, SHF_EXECINSTR, SHF_INFO_LINK = 0x1, 0x2, 0x4, 0x40
STT_NOTYPE, STT_OBJECT, STT_FUNC, STT_SECTION, STT_FILE = 0, 1, 2, 3, 4
STB_LOCAL, STB_GLOBAL = 0, 1
SHN_UNDEF, SHN_ABS, SHN_COMMON = 0, 0xFFF1, 0xFFF2
R_BPF_NONE, R_BPF_64_64, R_BPF_64_ABS64, R_BPF_64_ABS32, R_BPF_64_NODYLD32, R_BPF_64_32 = 0, 1, 2, 3, 4, 10

EHDR = struct.Struct("<16sHHIQQQIHHHHHH")   # 64 bytes
SHDR = struct.Struct("<IIQQQQIIQQ")         # 64 bytes
SYM = struct.Struct("<IBBHQQ")              # 24 bytes
REL = struct.Struct("<QQ")                  # 16 bytes

_MACHINES = {0: "none", 3: "x86 (EM_386)", 40: "ARM", 62: "x86-64", 183: "AArch64", 190: "CUDA",
             243: "RISC-V", 247: "BPF"}
_ET_NAMES = {0: "none", 1: "relocatable", 2: "executable", 3: "shared object", 4: "core"}

MAPS_SECTION = ".maps"
LICENSE_SECTION = "license"
ABI_SECTION = "dtmk_abi"
SCHEMA_SECTION = "dtmk_schema"
NOTE_PREFIX = "dtmk_"            # other dtmk_* sections are BpfObject.notes
RODATA_MAP = ".rodata"

# Map definition members understood in `.maps` (libbpf's plus dtrace_mk's).
_UINT_MEMBERS = ("type", "max_entries", "key_size", "value_size", "lin_lo", "lin_hi", "lin_step",
                 "budget_bytes")
_TYPE_MEMBERS = ("key", "value")
MAP_MEMBERS = _UINT_MEMBERS + _TYPE_MEMBERS
# hist_linear bounds are signed 32-bit (values are compared as s64): a negative bound is
# written __uint(lin_lo, (dtmk_u32)-100), i.e. two's complement in the array size.
_SIGNED_MEMBERS = ("lin_lo", "lin_hi")


# --- generic ELF reading -------------------------------------------------------------

@dataclass
class Section:
    index: int
    name: str
    type: int
    flags: int
    offset: int
    size: int
    link: int
    info: int
    addralign: int
    entsize: int
    data: bytes = b""


@dataclass
class Symbol:
    index: int
    name: str
    bind: int
    type: int
    shndx: int
    value: int
    size: int


@dataclass
class Reloc:
    offset: int
    type: int
    sym: int


@dataclass
class ElfFile:
    """A parsed ELF64 LE relocatable file (only what eBPF objects use)."""
    where: str
    machine: int
    sections: List[Section]
    symbols: List[Symbol]
    rels: Dict[int, List[Reloc]] = field(default_factory=dict)   # target section index -> relocs

    def section(self, name: str) -> Optional[Section]:
        for s in self.sections:
            if s.name == name:
                return s
        return None


def _err(where: str, msg: str) -> LoadError:
    return LoadError(f"{where}: {msg}")


def _cstr(buf: bytes, off: int) -> str:
    end = buf.find(b"\0", off)
    return buf[off:end if end >= 0 else len(buf)].decode("utf-8", "replace")


def read_elf(data: bytes, where: str) -> ElfFile:
    """Parse the ELF container.  Raises LoadError ("not an eBPF object: ...") for
    anything that is not a 64-bit little-endian BPF relocatable object."""
    if len(data) < 4 or data[:4] != ELF_MAGIC:
        head = data[:8]
        return _raise(where, f"not an eBPF object: expected an ELF file (\\x7fELF), found {head!r}"
                      + (" (empty file)" if not data else ""))
    if len(data) < EHDR.size:
        _raise(where, f"not an eBPF object: truncated ELF header ({len(data)} bytes)")
    (ident, e_type, e_machine, _ver, _entry, _phoff, e_shoff, _flags, _ehsize, _phentsize, _phnum,
     e_shentsize, e_shnum, e_shstrndx) = EHDR.unpack_from(data, 0)
    if ident[4] != ELFCLASS64:
        _raise(where, f"not an eBPF object: ELF class {ident[4]} (expected 64-bit, ELFCLASS64)")
    if ident[5] != ELFDATA2LSB:
        _raise(where, "not an eBPF object: big-endian ELF (expected little endian; "
                      "compile with -target bpf or bpfel)")
    if e_machine != EM_BPF:
        mname = _MACHINES.get(e_machine, "unknown")
        _raise(where, f"not an eBPF object: ELF machine is {mname} ({e_machine}), expected "
                      f"EM_BPF ({EM_BPF}); compile with 'clang -target bpf -O2 -g -c'")
    if e_type != ET_REL:
        _raise(where, f"not an eBPF object: ELF type is {_ET_NAMES.get(e_type, e_type)}, expected a "
                      "relocatable object (clang -c)")
    if e_shentsize != SHDR.size or e_shoff + e_shnum * SHDR.size > len(data):
        _raise(where, f"truncated or malformed ELF section header table ({e_shnum} entries at "
                      f"offset {e_shoff}, file is {len(data)} bytes)")
    secs: List[Section] = []
    for i in range(e_shnum):
        f = SHDR.unpack_from(data, e_shoff + i * SHDR.size)
        s = Section(i, "", f[1], f[2], f[4], f[5], f[6], f[7], f[8], f[9])
        if s.type not in (SHT_NOBITS, SHT_NULL):
            if s.offset + s.size > len(data):
                _raise(where, f"section {i} extends past the end of the file")
            s.data = data[s.offset:s.offset + s.size]
        secs.append(s)
    if not 0 < e_shstrndx < len(secs):
        _raise(where, "ELF has no section name table")
    shstr = secs[e_shstrndx].data
    for i, s in enumerate(secs):
        f = SHDR.unpack_from(data, e_shoff + i * SHDR.size)
        s.name = _cstr(shstr, f[0])

    syms: List[Symbol] = []
    symtab = next((s for s in secs if s.type == SHT_SYMTAB), None)
    if symtab is not None:
        if not 0 < symtab.link < len(secs):
            _raise(where, ".symtab links to no string table")
        strtab = secs[symtab.link].data
        for i in range(len(symtab.data) // SYM.size):
            st_name, st_info, _other, shndx, value, size = SYM.unpack_from(symtab.data, i * SYM.size)
            stype, bind = st_info & 0xF, st_info >> 4
            name = _cstr(strtab, st_name)
            if stype == STT_SECTION and not name and 0 < shndx < len(secs):
                name = secs[shndx].name
            syms.append(Symbol(i, name, bind, stype, shndx, value, size))

    elf = ElfFile(where, e_machine, secs, syms)
    for s in secs:
        if s.type == SHT_RELA:
            _raise(where, f"section '{s.name}': RELA relocations are not used by BPF objects (expected REL)")
        if s.type != SHT_REL:
            continue
        rels = []
        for i in range(len(s.data) // REL.size):
            off, info = REL.unpack_from(s.data, i * REL.size)
            rels.append(Reloc(off, info & 0xFFFFFFFF, info >> 32))
        elf.rels.setdefault(s.info, []).extend(rels)
    return elf


def _raise(where: str, msg: str):
    raise _err(where, msg)


# --- BpfObject loading ---------------------------------------------------------------

def _valid_sections() -> str:
    return ", ".join(h.section for h in abi.HOOKS)


def load_object(path_or_bytes: Union[str, os.PathLike, bytes, bytearray, memoryview], *,
                name: Optional[str] = None) -> BpfObject:
    """Load an eBPF object file (path or bytes) into a `BpfObject`; `name` labels the
    object in messages (default: the path, or "<memory>")."""
    if isinstance(path_or_bytes, (bytes, bytearray, memoryview)):
        data = bytes(path_or_bytes)
        where = name or "<memory>"
    else:
        p = Path(path_or_bytes)
        where = name or str(p)
        try:
            data = p.read_bytes()
        except OSError as e:
            raise LoadError(f"{where}: cannot read: {e.strerror or e}") from None
    return _Loader(read_elf(data, where)).load()


class _Loader:
    def __init__(self, elf: ElfFile):
        self.elf = elf
        self.where = elf.where
        self._btf: Optional[btf_mod.Btf] = None
        self._lines: Optional[Dict[str, List[btf_mod.LineInfo]]] = None

    def fail(self, msg: str) -> LoadError:
        return LoadError(f"{self.where}: {msg}")

    @property
    def btf(self) -> btf_mod.Btf:
        if self._btf is None:
            sec = self.elf.section(".BTF")
            if sec is None:
                raise self.fail(f"section '{MAPS_SECTION}': no .BTF section to describe the maps; "
                                "compile with -g (maps in SEC(\".maps\") are defined through BTF)")
            try:
                self._btf = btf_mod.parse(sec.data)
            except btf_mod.BtfError as e:
                raise self.fail(f"section '.BTF': {e}") from None
        return self._btf

    def line_info(self, section: str) -> List[btf_mod.LineInfo]:
        """.BTF.ext line info of a section ([] without -g; malformed line info is ignored:
        it only decorates messages)."""
        if self._lines is None:
            self._lines = {}
            ext, sec = self.elf.section(".BTF.ext"), self.elf.section(".BTF")
            if ext is not None and sec is not None:
                try:
                    self._lines = btf_mod.parse_line_info(ext.data, self.btf)
                except (btf_mod.BtfError, LoadError):
                    self._lines = {}
        return self._lines.get(section, [])

    # --- top level -------------------------------------------------------------------
    def load(self) -> BpfObject:
        abi_version = self._abi_version()
        license_ = self._string_section(LICENSE_SECTION) or ""
        schema = self._string_section(SCHEMA_SECTION)
        maps, map_index = self._maps()
        rodata_base = self._rodata_layout()
        rodata_map_index: Optional[int] = None
        if rodata_base:
            blob = bytearray()
            for sec, base in rodata_base.items():
                blob += b"\0" * (base - len(blob)) + self.elf.sections[sec].data
            maps.append(MapDef(RODATA_MAP, "array", 4, max(len(blob), 1), 1,
                               init_value=bytes(blob), read_only=True))
            rodata_map_index = len(maps) - 1
        programs = self._programs(map_index, rodata_base, rodata_map_index)
        used_rodata = any(i.is_lddw and i.map_ref == RODATA_MAP for p in programs for i in p.insns)
        if rodata_map_index is not None and not used_rodata:
            maps.pop(rodata_map_index)      # constants no program references (e.g. debug-only)
        for m in maps:
            try:
                m.validate()
            except LoadError as e:
                raise self.fail(f"section '{MAPS_SECTION}': {e}") from None
        notes = {}
        for sec in self.elf.sections:
            if sec.name.startswith(NOTE_PREFIX) and sec.name not in (ABI_SECTION, SCHEMA_SECTION):
                notes[sec.name] = self._string_section(sec.name) or ""
        return BpfObject(programs=programs, maps=maps, license=license_, abi_version=abi_version,
                         schema_hash=schema, path=self.where, notes=notes)

    def _string_section(self, name: str) -> Optional[str]:
        sec = self.elf.section(name)
        if sec is None:
            return None
        raw = sec.data.split(b"\0", 1)[0]
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise self.fail(f"section '{name}': expected a NUL-terminated UTF-8 string") from None

    def _abi_version(self) -> int:
        sec = self.elf.section(ABI_SECTION)
        if sec is None:
            raise self.fail(f"no '{ABI_SECTION}' section: the object does not say which hook ABI it "
                            f"was built for (expected ABI v{abi.ABI_VERSION}; add 'DTMK_ABI_NOTE;' from "
                            "dtrace_mk_bpf.h)")
        if len(sec.data) != 4:
            raise self.fail(f"section '{ABI_SECTION}': expected a 4-byte u32, got {len(sec.data)} bytes")
        (v,) = struct.unpack("<I", sec.data)
        if v != abi.ABI_VERSION:
            raise self.fail(f"section '{ABI_SECTION}': object built for hook ABI v{v}, this dtrace_mk "
                            f"expects ABI v{abi.ABI_VERSION}; rebuild it against this dtrace_mk_bpf.h")
        return v

    # --- maps --------------------------------------------------------------------------
    def _maps(self) -> Tuple[List[MapDef], Dict[str, int]]:
        sec = self.elf.section(MAPS_SECTION)
        if sec is None:
            legacy = self.elf.section("maps")
            if legacy is not None and legacy.size:
                raise self.fail("section 'maps': legacy 'struct bpf_map_def' maps are not supported; "
                                "define maps with BTF in SEC(\".maps\") (see dtrace_mk_bpf.h)")
            return [], {}
        syms = sorted((s for s in self.elf.symbols
                       if s.shndx == sec.index and s.type in (STT_OBJECT, STT_NOTYPE) and s.name),
                      key=lambda s: s.value)
        maps: List[MapDef] = []
        index: Dict[str, int] = {}
        for s in syms:
            try:
                m = self._map_def(s)
            except btf_mod.BtfError as e:
                raise self.fail(f"section '{MAPS_SECTION}', map '{s.name}': malformed BTF: {e}") from None
            index[s.name] = len(maps)
            maps.append(m)
        return maps, index

    def _map_def(self, sym: Symbol) -> MapDef:
        where = f"section '{MAPS_SECTION}', map '{sym.name}'"
        btf = self.btf
        var = btf.var(sym.name)
        if var is None:
            raise self.fail(f"{where}: no BTF variable of that name (compile with -g)")
        st = btf.resolve(var.type)
        if st.kind != btf_mod.KIND_STRUCT:
            raise self.fail(f"{where}: expected a struct definition (struct {{ __uint(type, ...); ... }}), "
                            f"got BTF {st.kind_name}")
        vals: Dict[str, int] = {}
        key_desc = value_desc = None
        for mem in st.members:
            if mem.name not in MAP_MEMBERS:
                raise self.fail(f"{where}: unknown member '{mem.name}' (expected one of "
                                f"{', '.join(MAP_MEMBERS)})")
            ptr = btf.resolve(mem.type)
            if ptr.kind != btf_mod.KIND_PTR:
                form = f"__uint({mem.name}, N)" if mem.name in _UINT_MEMBERS else f"__type({mem.name}, T)"
                raise self.fail(f"{where}: member '{mem.name}' must be declared as {form}")
            if mem.name in _UINT_MEMBERS:
                arr = btf.resolve(ptr.type) if ptr.type else None
                if arr is None or arr.kind != btf_mod.KIND_ARRAY:
                    raise self.fail(f"{where}: member '{mem.name}' must be declared as __uint({mem.name}, N)")
                v = arr.nelems
                if mem.name in _SIGNED_MEMBERS and v >= 1 << 31:
                    v -= 1 << 32            # __uint(lin_lo, (dtmk_u32)-100)
                vals[mem.name] = v
            else:
                if ptr.type == 0:
                    raise self.fail(f"{where}: member '{mem.name}' has type void; use __type({mem.name}, T)")
                try:
                    size = btf.size_of(ptr.type)
                except btf_mod.BtfError as e:
                    raise self.fail(f"{where}: member '{mem.name}': {e}") from None
                vals[f"__{mem.name}"] = size
                desc = btf.c_name(ptr.type)
                if mem.name == "key":
                    key_desc = desc
                else:
                    value_desc = desc
        for which in _TYPE_MEMBERS:
            tsize, usize = vals.pop(f"__{which}", None), vals.get(f"{which}_size")
            if tsize is not None and usize is not None and tsize != usize:
                raise self.fail(f"{where}: {which}_size {usize} disagrees with the size of "
                                f"__type({which}, ...) ({tsize})")
            if tsize is not None:
                vals[f"{which}_size"] = tsize
        if "type" not in vals:
            raise self.fail(f"{where}: missing __uint(type, ...) (one of "
                            f"{', '.join(m.c_name for m in abi.MAP_TYPES)})")
        mt = abi.MAP_TYPES_BY_ID.get(vals["type"])
        if mt is None:
            raise self.fail(f"{where}: unsupported map type {vals['type']} (expected one of "
                            f"{', '.join(f'{m.c_name} ({m.id})' for m in abi.MAP_TYPES)})")
        if "max_entries" not in vals:
            raise self.fail(f"{where}: missing __uint(max_entries, N)")
        m = MapDef(sym.name, mt.name, vals.get("key_size", 0), vals.get("value_size", 0),
                   vals["max_entries"], vals.get("lin_lo", 0), vals.get("lin_hi", 0),
                   vals.get("lin_step", 0), vals.get("budget_bytes", 0), key_desc, value_desc)
        if mt.name in ("hist_log2", "hist_linear") and "value_size" not in vals:
            m.value_size = 8 * m.hist_buckets if m.lin_step > 0 or mt.name == "hist_log2" else 0
        if mt.name != "ringbuf":
            for which in _TYPE_MEMBERS:
                implied = which == "value" and mt.name in ("hist_log2", "hist_linear")
                if f"{which}_size" not in vals and not implied:
                    raise self.fail(f"{where}: missing __type({which}, T) (or __uint({which}_size, N))")
        for extra, types in (("lin_lo", ("hist_linear",)), ("lin_hi", ("hist_linear",)),
                             ("lin_step", ("hist_linear",)), ("budget_bytes", ("ringbuf",))):
            if extra in vals and mt.name not in types:
                raise self.fail(f"{where}: member '{extra}' only applies to {', '.join(types)} maps, "
                                f"this is {mt.c_name}")
        if mt.name == "ringbuf":
            for which in _TYPE_MEMBERS:
                if vals.get(f"{which}_size"):
                    raise self.fail(f"{where}: a ringbuf has no {which} (records are raw bytes)")
        try:
            m.validate()
        except LoadError as e:
            raise self.fail(f"section '{MAPS_SECTION}': {e}") from None
        return m

    # --- .rodata -----------------------------------------------------------------------
    def _rodata_layout(self) -> Dict[int, int]:
        """section index -> byte offset of that `.rodata*` section in the `.rodata` map."""
        out: Dict[int, int] = {}
        off = 0
        for s in self.elf.sections:
            if s.name == ".rodata" or s.name.startswith(".rodata."):
                if s.type == SHT_NOBITS:
                    continue
                off = (off + 7) & ~7
                out[s.index] = off
                off += s.size
        return out

    # --- programs ----------------------------------------------------------------------
    def _programs(self, map_index: Dict[str, int], rodata_base: Dict[int, int],
                  rodata_map: Optional[int]) -> List[Program]:
        """Programs in symbol-table order (source order for clang; object order for
        objects written by elfwrite)."""
        found: List[Tuple[int, Program]] = []
        for sec in self.elf.sections:
            if not sec.flags & SHF_EXECINSTR or sec.name == ".text":
                continue
            hook = abi.HOOKS_BY_SECTION.get(sec.name)
            funcs = sorted((s for s in self.elf.symbols if s.shndx == sec.index and s.type == STT_FUNC),
                           key=lambda s: s.value)
            if hook is None:
                names = ", ".join(f.name for f in funcs) or "?"
                raise self.fail(f"section '{sec.name}' (program {names}): not a hook section; "
                                f"expected one of {_valid_sections()}")
            if sec.size % 8:
                raise self.fail(f"section '{sec.name}': size {sec.size} is not a multiple of 8 bytes")
            if not funcs:
                funcs = [Symbol(-1, sec.name.replace("/", "_"), STB_GLOBAL, STT_FUNC, sec.index, 0, sec.size)]
            rels = {r.offset: r for r in self.elf.rels.get(sec.index, [])}
            for f in funcs:
                found.append((f.index, self._program(sec, hook, f, rels, map_index, rodata_base,
                                                     rodata_map)))
        programs = [p for _i, p in sorted(found, key=lambda t: t[0])]
        # after the hook sections, so that a call into .text gets the bpf-to-bpf message
        text = self.elf.section(".text")
        if text is not None and text.size:
            funcs = [s.name for s in self.elf.symbols if s.shndx == text.index and s.type == STT_FUNC]
            raise self.fail(f"section '.text': function(s) {', '.join(funcs) or '?'} are not in a hook "
                            f"section; put programs in SEC(\"<hook section>\") (one of {_valid_sections()}) "
                            "and mark helper functions static __always_inline")
        if not programs:
            raise self.fail(f"no programs: expected at least one function in a hook section "
                            f"(SEC(\"task/end\") int prog(struct dtmk_ctx *ctx) {{ ... }})")
        return programs

    def _program(self, sec: Section, hook: abi.Hook, fn: Symbol, rels: Dict[int, Reloc],
                 map_index: Dict[str, int], rodata_base: Dict[int, int],
                 rodata_map: Optional[int]) -> Program:
        where = f"section '{sec.name}', program '{fn.name}'"
        if fn.value % 8 or fn.size % 8 or fn.value + fn.size > sec.size:
            raise self.fail(f"{where}: symbol range {fn.value}+{fn.size} is not 8-byte slots inside the "
                            f"section ({sec.size} bytes)")
        if fn.size == 0:
            raise self.fail(f"{where}: empty function")
        try:
            insns = isa.decode(sec.data[fn.value:fn.value + fn.size])
        except ValueError as e:
            raise self.fail(f"{where}: {e}") from None
        prog = Program(fn.name, sec.name, hook, insns)
        for li in self.line_info(sec.name):
            if fn.value <= li.insn_off < fn.value + fn.size and li.insn_off % 8 == 0:
                prog.lines[(li.insn_off - fn.value) // 8] = SourceLine(li.file, li.line, li.col, li.text)

        def at(i: int) -> str:
            loc = prog.source_at(i)
            return f"{where}, insn {i}" + (f" ({loc})" if loc else "")

        for i, ins in enumerate(insns):
            if ins.opcode == isa.BPF_JMP | isa.BPF_CALL and ins.src == 1:
                raise self.fail(f"{at(i)}: bpf-to-bpf calls are not supported in ABI v1 "
                                "(mark helpers static __always_inline)")
            if ins.opcode == isa.BPF_JMP | isa.BPF_CALL and ins.src == 2:
                raise self.fail(f"{at(i)}: kfunc calls are not supported in ABI v1 "
                                "(only the helpers in dtrace_mk_bpf.h)")
        for off in sorted(o for o in rels if fn.value <= o < fn.value + fn.size):
            r = rels[off]
            slot = (off - fn.value) // 8
            self._relocate(at(slot), insns, slot, off, r, map_index, rodata_base, rodata_map)
        for i, ins in enumerate(insns):
            if ins.is_lddw and ins.src in (isa.PSEUDO_MAP_FD, isa.PSEUDO_MAP_VALUE) and ins.map_ref is None:
                raise self.fail(f"{at(i)}: map reference (lddw src={ins.src}) without a "
                                "relocation naming the map")
        return prog

    def _relocate(self, here: str, insns: List[Insn], slot: int, off: int, r: Reloc,
                  map_index: Dict[str, int], rodata_base: Dict[int, int], rodata_map: Optional[int]) -> None:
        if r.type == R_BPF_64_32:
            raise self.fail(f"{here}: bpf-to-bpf calls are not supported in ABI v1 "
                            "(mark helpers static __always_inline)")
        if r.type != R_BPF_64_64:
            raise self.fail(f"{here}: unsupported relocation type {r.type} (expected "
                            f"R_BPF_64_64 ({R_BPF_64_64}) on a map reference)")
        if off % 8 or slot >= len(insns) or not insns[slot].is_lddw:
            raise self.fail(f"{here}: relocation at byte {off} is not on an lddw instruction")
        if not 0 <= r.sym < len(self.elf.symbols):
            raise self.fail(f"{here}: relocation names symbol #{r.sym}, which does not exist")
        sym = self.elf.symbols[r.sym]
        ins = insns[slot]
        if sym.shndx in (SHN_UNDEF, SHN_COMMON) or sym.shndx >= len(self.elf.sections):
            raise self.fail(f"{here}: reference to undefined symbol '{sym.name}' "
                            "(extern variables and functions are not supported)")
        target = self.elf.sections[sym.shndx]
        if target.name == MAPS_SECTION:
            if sym.name not in map_index:
                # a section symbol + addend would also name a map; find it by offset
                base = sym.value + (ins.imm & 0xFFFFFFFF)
                names = [s.name for s in self.elf.symbols if s.shndx == target.index and
                         s.type in (STT_OBJECT, STT_NOTYPE) and s.value == base and s.name in map_index]
                if not names:
                    raise self.fail(f"{here}: reference to '{sym.name}' in {MAPS_SECTION} "
                                    "that is not a map")
                name = names[0]
            else:
                name = sym.name
            insns[slot:slot + 2] = isa.lddw_map(ins.dst, name, map_index[name], isa.PSEUDO_MAP_FD)
            return
        if sym.shndx in rodata_base and rodata_map is not None:
            value_off = rodata_base[sym.shndx] + sym.value + (ins.imm & 0xFFFFFFFF)
            if value_off >= rodata_base[sym.shndx] + target.size and target.size:
                raise self.fail(f"{here}: offset {sym.value + ins.imm} past the end of "
                                f"'{target.name}' ({target.size} bytes)")
            insns[slot:slot + 2] = isa.lddw_map(ins.dst, RODATA_MAP, rodata_map, isa.PSEUDO_MAP_VALUE,
                                                value_off)
            return
        if target.name in (".data", ".bss") or target.name.startswith((".data.", ".bss.")):
            raise self.fail(f"{here}: global variable '{sym.name}' in '{target.name}': "
                            "writable globals are not supported in ABI v1; use a map "
                            "(or 'static const' for constants)")
        raise self.fail(f"{here}: reference to '{sym.name}' in section '{target.name}' "
                        f"(expected a map in {MAPS_SECTION} or a constant in .rodata)")


def program_from_bytes(data: bytes, hook: str, *, name: str = "prog", where: str = "<memory>") -> BpfObject:
    """Wrap raw bytecode (a `.bin` file: 8-byte slots, no maps) as a one-program object
    for `hook` (name "task:end" or section "task/end")."""
    try:
        h = abi.hook(hook)
    except KeyError:
        raise LoadError(f"{where}: unknown hook '{hook}' (expected one of "
                        f"{', '.join(h.name for h in abi.HOOKS)})") from None
    try:
        insns = isa.decode(data)
    except ValueError as e:
        raise LoadError(f"{where}: {e}") from None
    if not insns:
        raise LoadError(f"{where}: empty program")
    return BpfObject(programs=[Program(name, h.section, h, insns)], maps=[], path=where)
