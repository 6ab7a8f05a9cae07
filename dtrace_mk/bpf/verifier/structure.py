"""Encoding checks: each slot on its own, before any control flow or types.

Opcode in the ISA table, unused fields zero, registers r0..r10, r10 never written,
fixed-meaning immediates valid, lddw pairs well formed with known pseudo sources and
map references in range, jump targets inside the program and not inside an lddw.
"""
from __future__ import annotations

from typing import Sequence, Set

from .. import isa
from ..isa import Insn, OPCODES
from .messages import error

_SHIFTS = (isa.BPF_LSH, isa.BPF_RSH, isa.BPF_ARSH)
ARRAY_TYPES = ("array",)    # lddw map_value targets (Linux: array maps, not per-cpu)


def lddw_value(insns: Sequence[Insn], pc: int) -> int:
    """The 64-bit immediate of the lddw at pc, from its two slots (as encoded)."""
    return (insns[pc].imm & 0xFFFFFFFF) | ((insns[pc + 1].imm & 0xFFFFFFFF) << 32)


def continuation_slots(insns: Sequence[Insn]) -> Set[int]:
    out, i = set(), 0
    while i < len(insns):
        if insns[i].opcode == isa.LDDW:
            out.add(i + 1)
            i += 2
        else:
            i += 1
    return out


def check(insns: Sequence[Insn], maps: Sequence) -> Set[int]:
    """Raise VerifierError at the first malformed slot; return the lddw second slots."""
    n = len(insns)
    cont = continuation_slots(insns)
    i = 0
    while i < n:
        ins = insns[i]
        info = OPCODES.get(ins.opcode)
        if info is None:
            raise error(i, "invalid-opcode/cont" if ins.opcode == 0 else "invalid-opcode",
                        opcode=ins.opcode)
        _fields(i, ins, info)
        if info.kind == "ld_imm64":
            _lddw(insns, i, maps)
            i += 2
            continue
        if info.kind == "jmp":
            target = i + ins.off + 1
            if not 0 <= target < n:
                raise error(i, "jump-out-of-range", target=target, last=n - 1)
            if target in cont:
                raise error(i, "jump-into-lddw", target=target)
        i += 1
    return cont


def _fields(pc: int, ins: Insn, info: isa.OpInfo) -> None:
    m = info.mnemonic
    # Insn objects built in Python can hold what no encoding can; reject it here
    for name, value, bits in (("off", ins.off, 16), ("imm", ins.imm, 32)):
        if not -(1 << (bits - 1)) <= value < (1 << (bits - 1)):
            raise error(pc, "field-range", field=name, value=value, bits=bits)
    for name, value in (("dst", ins.dst), ("src", ins.src)):
        if not 0 <= value <= 15:
            raise error(pc, "field-range", field=name, value=value, bits=4)
    if info.uses_dst:
        if ins.dst > 10:
            raise error(pc, "bad-register", mnemonic=m, reg=ins.dst, field="dst")
    elif ins.dst:
        raise error(pc, "unused-field", mnemonic=m, field="dst", value=ins.dst)
    if info.kind == "ld_imm64":
        if ins.src not in (isa.PSEUDO_NONE, isa.PSEUDO_MAP_FD, isa.PSEUDO_MAP_VALUE):
            raise error(pc, "lddw-pseudo", src=ins.src)
    elif info.kind == "call":
        if ins.src:
            raise error(pc, "unused-field/call", value=ins.src)
    elif info.uses_src:
        if ins.src > 10:
            raise error(pc, "bad-register", mnemonic=m, reg=ins.src, field="src")
    elif ins.src:
        raise error(pc, "unused-field", mnemonic=m, field="src", value=ins.src)
    if not info.uses_off and ins.off:
        raise error(pc, "unused-field", mnemonic=m, field="off", value=ins.off)
    if not info.uses_imm and ins.imm:
        raise error(pc, "unused-field", mnemonic=m, field="imm", value=ins.imm)
    # register writes
    if info.kind in ("alu", "ldx", "ld_imm64") and ins.dst == isa.R10:
        raise error(pc, "write-r10", mnemonic=m)
    if info.kind == "atomic" and ins.imm & isa.ATOMIC_FETCH and ins.src == isa.R10:
        raise error(pc, "write-r10", mnemonic=m + "_fetch")
    # immediates with a fixed meaning
    if info.kind == "alu" and info.op == isa.BPF_END and ins.imm not in (16, 32, 64):
        raise error(pc, "invalid-imm/swap", mnemonic=m, imm=ins.imm)
    if info.kind == "alu" and info.op in _SHIFTS and info.src == isa.BPF_K:
        width = 64 if info.is64 else 32
        if not 0 <= ins.imm < width:
            raise error(pc, "shift-range", mnemonic=m, imm=ins.imm, maxshift=width - 1)
    if info.kind == "atomic" and ins.imm not in (isa.ATOMIC_ADD, isa.ATOMIC_ADD | isa.ATOMIC_FETCH):
        raise error(pc, "invalid-imm/atomic", imm=ins.imm & 0xFFFFFFFF)


def _lddw(insns: Sequence[Insn], pc: int, maps: Sequence) -> None:
    if pc + 1 >= len(insns):
        raise error(pc, "lddw-missing-slot")
    nxt = insns[pc + 1]
    if nxt.opcode or nxt.dst or nxt.src or nxt.off:
        raise error(pc + 1, "lddw-second-slot", first=pc, opcode=nxt.opcode, dst=nxt.dst,
                    src=nxt.src, off=nxt.off)
    ins = insns[pc]
    if ins.src in (isa.PSEUDO_MAP_FD, isa.PSEUDO_MAP_VALUE):
        idx = ins.imm & 0xFFFFFFFF
        if idx >= len(maps):
            raise error(pc, "map-index", index=idx, count=len(maps))
        if ins.src == isa.PSEUDO_MAP_VALUE:
            m = maps[idx]
            if m.type not in ARRAY_TYPES:
                raise error(pc, "map-value-ref/type", map=m.name, mtype=m.type)
            voff = nxt.imm & 0xFFFFFFFF
            if voff >= m.value_size:
                raise error(pc, "map-value-ref/off", off=voff, vsize=m.value_size, map=m.name)
