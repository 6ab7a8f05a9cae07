"""Write a `BpfObject` as an eBPF ELF object in the form clang emits, so that
`dtrace_mk.bpf.elf.load_object(write_object(obj))` reproduces `obj` and LLVM's tools
(`llvm-objdump -d -r`, `llvm-readelf`) read it.

    data = write_object(obj)          # bytes of a relocatable ELF64 LE, EM_BPF

Layout (section order):

    NULL, .strtab (section and symbol names),
    <hook section> + .rel<hook section>      one pair per distinct Program.section,
                                             programs concatenated, one FUNC symbol each
    .maps          one zeroed struct per map (8 bytes per member), OBJECT symbol each
    .rodata        the internal read-only map's initial bytes (if the object has one)
    license, dtmk_abi (u32), dtmk_schema (if schema_hash is set)
    dtmk_<note>    one per BpfObject.notes entry (keys start with "dtmk_"; UTF-8 + NUL)
    .BTF           map definition structs as clang encodes `__uint`/`__type`, VARs,
                   a `.maps` DATASEC, and FUNC/FUNC_PROTO records for the programs
    .symtab

Map references are written as clang writes them: an LD_IMM64 with src 0 and a
R_BPF_64_64 relocation to the map's symbol (imm 0), or, for the `.rodata` map, to the
`.rodata` section symbol with the byte offset in imm.  Map order is canonical on the
way back: maps of `.maps` in object order, then the `.rodata` map; an object already
in that order (what the loader produces) round-trips exactly.  (The loader drops a
`.rodata` map that no program references.)

Key and value types: a map with `key_desc` gets `__type(key, T)` where T is a typedef
named `key_desc` over an unsigned integer (sizes 1/2/4/8) or a byte array; without a
description, `__uint(key_size, N)`.  The same for values.
"""
from __future__ import annotations

import struct
from typing import Dict, List, Optional, Tuple

from ..abi import definition as abi
from . import btf as btf_mod
from . import isa
from .elf import (ABI_SECTION, EHDR, EM_BPF, ELFCLASS64, ELFDATA2LSB, ET_REL, LICENSE_SECTION,
                  MAPS_SECTION, NOTE_PREFIX, R_BPF_64_64, REL, RODATA_MAP, SCHEMA_SECTION, SHDR,
                  SHF_ALLOC, SHF_EXECINSTR, SHF_INFO_LINK, SHF_WRITE, SHT_PROGBITS, SHT_REL,
                  SHT_STRTAB, SHT_SYMTAB, STB_GLOBAL, STB_LOCAL, STT_FUNC, STT_OBJECT, STT_SECTION,
                  SYM)
from .isa import Insn
from .program import BpfObject, LoadError, MapDef

_UNSIGNED = {1: "unsigned char", 2: "unsigned short", 4: "unsigned int", 8: "unsigned long long"}


class _Sec:
    def __init__(self, name: str, type_: int, flags: int, data: bytes = b"", align: int = 1,
                 entsize: int = 0):
        self.name, self.type, self.flags, self.data = name, type_, flags, data
        self.align, self.entsize = align, entsize
        self.link = self.info = 0
        self.index = -1


def _is_internal(m: MapDef) -> bool:
    return m.name == RODATA_MAP


def write_object(obj: BpfObject) -> bytes:
    """Encode `obj` as ELF bytes.  Raises LoadError (naming the program, insn or map)
    for objects that cannot be expressed: unknown sections, bad map indices,
    non-.rodata map value references, duplicate names."""
    where = obj.path or "<memory>"

    def fail(msg: str) -> LoadError:
        return LoadError(f"{where}: cannot write object: {msg}")

    # --- maps: canonical order, internal .rodata last --------------------------------
    regular = [i for i, m in enumerate(obj.maps) if not _is_internal(m)]
    internal = [i for i, m in enumerate(obj.maps) if _is_internal(m)]
    if len(internal) > 1:
        raise fail(f"more than one '{RODATA_MAP}' map")
    names = [m.name for m in obj.maps]
    for n in names:
        if names.count(n) > 1:
            raise fail(f"map name '{n}' used twice")
        if not n or not (n[0].isalpha() or n[0] == "_") or not n.replace("_", "a").isalnum():
            if n != RODATA_MAP:
                raise fail(f"map name '{n}' is not a C identifier")
    order = regular + internal
    new_index = {old: new for new, old in enumerate(order)}
    rodata_map: Optional[MapDef] = obj.maps[internal[0]] if internal else None

    # --- string table shared by section and symbol names --------------------------------
    strtab = bytearray(b"\0")
    str_off: Dict[str, int] = {"": 0}

    def s(name: str) -> int:
        if name not in str_off:
            str_off[name] = len(strtab)
            strtab.extend(name.encode() + b"\0")
        return str_off[name]

    # --- sections (data filled in below; indices fixed first) ---------------------------
    secs: List[_Sec] = [_Sec("", 0, 0)]
    strtab_sec = _Sec(".strtab", SHT_STRTAB, 0)
    secs.append(strtab_sec)

    prog_secs: Dict[str, Tuple[_Sec, _Sec]] = {}
    prog_names: Dict[str, int] = {}
    for p in obj.programs:
        if p.section not in abi.HOOKS_BY_SECTION:
            raise fail(f"program '{p.name}': section '{p.section}' is not a hook section "
                       f"(expected one of {', '.join(h.section for h in abi.HOOKS)})")
        if p.name in prog_names or p.name in names:
            raise fail(f"program name '{p.name}' used twice")
        prog_names[p.name] = 1
        if p.section not in prog_secs:
            text = _Sec(p.section, SHT_PROGBITS, SHF_ALLOC | SHF_EXECINSTR, align=8)
            rel = _Sec(".rel" + p.section, SHT_REL, SHF_INFO_LINK, align=8, entsize=REL.size)
            secs += [text, rel]
            prog_secs[p.section] = (text, rel)
    maps_sec = _Sec(MAPS_SECTION, SHT_PROGBITS, SHF_WRITE | SHF_ALLOC, align=8) if regular else None
    if maps_sec:
        secs.append(maps_sec)
    rodata_sec = None
    if rodata_map is not None:
        init = bytes(rodata_map.init_value or b"")
        if len(init) > rodata_map.value_size:
            raise fail(f"map '{RODATA_MAP}': init_value of {len(init)} bytes exceeds value_size "
                       f"{rodata_map.value_size}")
        rodata_sec = _Sec(".rodata", SHT_PROGBITS, SHF_ALLOC, init.ljust(rodata_map.value_size, b"\0"), align=8)
        secs.append(rodata_sec)
    lic_sec = _Sec(LICENSE_SECTION, SHT_PROGBITS, SHF_WRITE | SHF_ALLOC, _cstring(obj.license, "license", fail))
    abi_sec = _Sec(ABI_SECTION, SHT_PROGBITS, SHF_WRITE | SHF_ALLOC, struct.pack("<I", obj.abi_version), 4)
    secs += [lic_sec, abi_sec]
    schema_sec = None
    if obj.schema_hash is not None:
        schema_sec = _Sec(SCHEMA_SECTION, SHT_PROGBITS, SHF_WRITE | SHF_ALLOC,
                          _cstring(obj.schema_hash, "schema hash", fail))
        secs.append(schema_sec)
    for key in sorted(obj.notes):
        if not key.startswith(NOTE_PREFIX) or key in (ABI_SECTION, SCHEMA_SECTION) or \
                not key.replace("_", "a").replace(".", "a").isalnum():
            raise fail(f"note '{key}': note names become ELF sections and must look like "
                       f"'{NOTE_PREFIX}name' (not {ABI_SECTION} or {SCHEMA_SECTION})")
        secs.append(_Sec(key, SHT_PROGBITS, 0, _cstring(obj.notes[key], f"note '{key}'", fail)))
    btf_sec = _Sec(".BTF", SHT_PROGBITS, 0, align=4)
    symtab_sec = _Sec(".symtab", SHT_SYMTAB, 0, align=8, entsize=SYM.size)
    secs += [btf_sec, symtab_sec]
    for i, sec in enumerate(secs):
        sec.index = i

    # --- symbols: locals (section symbols) first, then globals ---------------------------
    local_syms: List[Tuple[str, int, int, int, int]] = []    # (name, type, shndx, value, size)
    global_syms: List[Tuple[str, int, int, int, int]] = []
    sec_sym: Dict[str, int] = {}
    for text, _rel in prog_secs.values():
        sec_sym[text.name] = len(local_syms) + 1
        local_syms.append(("", STT_SECTION, text.index, 0, 0))
    if rodata_sec is not None:
        sec_sym[".rodata"] = len(local_syms) + 1
        local_syms.append(("", STT_SECTION, rodata_sec.index, 0, 0))
    first_global = len(local_syms) + 1

    # map symbols and the .maps struct layout
    map_sym: Dict[int, int] = {}          # new map index -> symbol index
    map_members: List[List[Tuple[str, object]]] = []
    map_off: List[int] = []
    off = 0
    for new, old in enumerate(regular):
        m = obj.maps[old]
        members = _map_members(m, fail)
        map_members.append(members)
        map_off.append(off)
        map_sym[new] = first_global + len(global_syms)
        global_syms.append((m.name, STT_OBJECT, maps_sec.index, off, 8 * len(members)))
        off += 8 * len(members)
    if maps_sec:
        maps_sec.data = b"\0" * off

    # programs: section data, FUNC symbols, relocations
    sec_data: Dict[str, bytearray] = {name: bytearray() for name in prog_secs}
    sec_rels: Dict[str, bytearray] = {name: bytearray() for name in prog_secs}
    func_syms: List[Tuple[str, int, int, int]] = []
    for p in obj.programs:
        buf = sec_data[p.section]
        start = len(buf)
        insns = list(p.insns)
        for i, ins in enumerate(insns):
            if not (ins.is_lddw and ins.src in (isa.PSEUDO_MAP_FD, isa.PSEUDO_MAP_VALUE)):
                continue
            at = f"program '{p.name}', insn {i}"
            old = ins.imm & 0xFFFFFFFF
            if old >= len(obj.maps):
                raise fail(f"{at}: map index {old} out of range (object has {len(obj.maps)} maps)")
            m = obj.maps[old]
            if ins.map_ref is not None and ins.map_ref != m.name:
                raise fail(f"{at}: map reference names '{ins.map_ref}' but index {old} is map '{m.name}'")
            voff = ((ins.imm64 or 0) >> 32) & 0xFFFFFFFF if ins.imm64 is not None else \
                (insns[i + 1].imm & 0xFFFFFFFF if i + 1 < len(insns) else 0)
            if _is_internal(m):
                if ins.src != isa.PSEUDO_MAP_VALUE:
                    raise fail(f"{at}: '{RODATA_MAP}' can only be referenced by value (lddw src=2)")
                sym, imm = sec_sym[".rodata"], voff
            else:
                if ins.src != isa.PSEUDO_MAP_FD:
                    raise fail(f"{at}: direct value reference into map '{m.name}' (lddw src=2) cannot "
                               f"be expressed in an object file; only '{RODATA_MAP}' supports it")
                sym, imm = map_sym[new_index[old]], 0
            insns[i] = Insn(isa.LDDW, ins.dst, 0, ins.off, imm, imm)
            if i + 1 < len(insns):
                insns[i + 1] = Insn(0, 0, 0, 0, 0)
            sec_rels[p.section] += REL.pack(start + 8 * i, (sym << 32) | R_BPF_64_64)
        buf += isa.encode(insns)
        func_syms.append((p.name, prog_secs[p.section][0].index, start, 8 * len(insns)))
    for name, (text, rel) in prog_secs.items():
        text.data = bytes(sec_data[name])
        rel.data = bytes(sec_rels[name])
        rel.link, rel.info = symtab_sec.index, text.index
    for name, shndx, value, size in func_syms:
        global_syms.append((name, STT_FUNC, shndx, value, size))
    global_syms.append(("_license", STT_OBJECT, lic_sec.index, 0, len(lic_sec.data)))
    global_syms.append(("_dtmk_abi", STT_OBJECT, abi_sec.index, 0, 4))
    if schema_sec is not None:
        global_syms.append(("_dtmk_schema", STT_OBJECT, schema_sec.index, 0, len(schema_sec.data)))

    # --- BTF ------------------------------------------------------------------------------
    b = btf_mod.BtfBuilder()
    t_int = b.add_int("int", 4, signed=True)
    t_idx = b.add_int("__ARRAY_SIZE_TYPE__", 4)
    var_entries = []
    for new, old in enumerate(regular):
        members = []
        for bit, (mname, val) in enumerate(map_members[new]):
            if isinstance(val, int):
                tid = b.add_ptr(b.add_array(t_int, t_idx, val))
            else:
                desc, size = val
                tid = b.add_ptr(_desc_type(b, desc, size))
            members.append((mname, tid, 64 * bit))
        st = b.add_struct("", 8 * len(members), members)
        var = b.add_var(obj.maps[old].name, st)
        var_entries.append((var, map_off[new], 8 * len(members)))
    if obj.programs:
        ctx = b.add_ptr(b.add_fwd_struct("dtmk_ctx"))
        proto = b.add_func_proto(t_int, [("ctx", ctx)])
        for p in obj.programs:
            b.add_func(p.name, proto)
    if var_entries:
        b.add_datasec(MAPS_SECTION, off, var_entries)
    btf_sec.data = b.encode()

    # --- symtab ---------------------------------------------------------------------------
    symtab = bytearray(SYM.size)
    for name, stype, shndx, value, size in local_syms:
        symtab += SYM.pack(s(name), (STB_LOCAL << 4) | stype, 0, shndx, value, size)
    for name, stype, shndx, value, size in global_syms:
        symtab += SYM.pack(s(name), (STB_GLOBAL << 4) | stype, 0, shndx, value, size)
    symtab_sec.data = bytes(symtab)
    symtab_sec.link, symtab_sec.info = strtab_sec.index, first_global
    for sec in secs[1:]:
        s(sec.name)
    strtab_sec.data = bytes(strtab)

    # --- layout ---------------------------------------------------------------------------
    out = bytearray(EHDR.size)
    offsets = [0] * len(secs)
    for i, sec in enumerate(secs[1:], 1):
        pad = (-len(out)) % max(sec.align, 1)
        out += b"\0" * pad
        offsets[i] = len(out)
        out += sec.data
    out += b"\0" * ((-len(out)) % 8)
    shoff = len(out)
    for i, sec in enumerate(secs):
        if i == 0:
            out += b"\0" * SHDR.size
            continue
        out += SHDR.pack(str_off[sec.name], sec.type, sec.flags, 0, offsets[i], len(sec.data),
                         sec.link, sec.info, sec.align, sec.entsize)
    ident = b"\x7fELF" + bytes([ELFCLASS64, ELFDATA2LSB, 1, 0]) + b"\0" * 8
    out[:EHDR.size] = EHDR.pack(ident, ET_REL, EM_BPF, 1, 0, 0, shoff, 0, EHDR.size, 0, 0,
                                SHDR.size, len(secs), strtab_sec.index)
    return bytes(out)


def _cstring(text: str, what: str, fail) -> bytes:
    """UTF-8 + NUL for a string section."""
    if "\0" in text:
        raise fail(f"{what}: text contains a NUL byte")
    try:
        return text.encode("utf-8") + b"\0"
    except UnicodeEncodeError as e:
        raise fail(f"{what}: not encodable as UTF-8 ({e.reason})") from None


def _map_members(m: MapDef, fail) -> List[Tuple[str, object]]:
    """The members of a map's definition struct: (name, int value) for `__uint`,
    (name, (desc, size)) for `__type`."""
    if m.type not in abi.MAP_TYPES_BY_NAME:
        raise fail(f"map '{m.name}': unknown map type '{m.type}'")
    out: List[Tuple[str, object]] = [("type", m.type_id), ("max_entries", m.max_entries)]
    for which, desc, size in (("key", m.key_desc, m.key_size), ("value", m.value_desc, m.value_size)):
        if not size:
            continue
        out.append((which, (desc, size)) if desc else (f"{which}_size", size))
    if m.type == "hist_linear":
        out += [("lin_lo", m.lin_lo), ("lin_hi", m.lin_hi), ("lin_step", m.lin_step)]
    if m.type == "ringbuf" or m.budget_bytes:
        out.append(("budget_bytes", m.budget_bytes))
    enc: List[Tuple[str, object]] = []
    for name, val in out:
        if isinstance(val, int):
            if name in ("lin_lo", "lin_hi"):
                if not -(1 << 31) <= val < (1 << 31):
                    raise fail(f"map '{m.name}': {name} {val} does not fit a signed 32-bit bound")
                val &= 0xFFFFFFFF
            elif not 0 <= val <= 0xFFFFFFFF:
                raise fail(f"map '{m.name}': {name} {val} does not fit a u32 (__uint({name}, N))")
        enc.append((name, val))
    return enc


def _desc_type(b: btf_mod.BtfBuilder, desc: str, size: int) -> int:
    if size in _UNSIGNED:
        base = b.add_int(_UNSIGNED[size], size)
    else:
        base = b.add_array(b.add_int("unsigned char", 1), b.add_int("__ARRAY_SIZE_TYPE__", 4), size)
    return b.add_typedef(desc, base)
