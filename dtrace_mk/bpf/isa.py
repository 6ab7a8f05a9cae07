"""eBPF instruction set (RFC 9669 encoding): the one opcode table.

Every opcode is composed from its class, source and operation fields, as in the RFC.
`OPCODES` maps each valid opcode byte to an `OpInfo` that states its mnemonic and
which operand fields it uses; the assembler, disassembler, verifier, reference VM and
the device VM's opcode list are all derived from it.  An opcode byte that is not in the
table is invalid, full stop.

Instruction layout (little endian, 8 bytes):
    opcode:8 | dst_reg:4 src_reg:4 | offset:16 (signed) | imm:32 (signed)
LD_IMM64 (opcode 0x18) occupies two slots; the second slot's imm is the upper half.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, replace
from typing import Dict, List, Optional, Tuple

# --- instruction classes (low 3 bits) ---
BPF_LD, BPF_LDX, BPF_ST, BPF_STX, BPF_ALU, BPF_JMP, BPF_JMP32, BPF_ALU64 = range(8)
CLASS_NAMES = {BPF_LD: "ld", BPF_LDX: "ldx", BPF_ST: "st", BPF_STX: "stx",
               BPF_ALU: "alu", BPF_JMP: "jmp", BPF_JMP32: "jmp32", BPF_ALU64: "alu64"}

# --- source (bit 3) for ALU/JMP ---
BPF_K, BPF_X = 0x00, 0x08

# --- ALU operations (high 4 bits) ---
ALU_OPS = {
    0x00: "add", 0x10: "sub", 0x20: "mul", 0x30: "div", 0x40: "or", 0x50: "and",
    0x60: "lsh", 0x70: "rsh", 0x80: "neg", 0x90: "mod", 0xA0: "xor", 0xB0: "mov",
    0xC0: "arsh", 0xD0: "end",
}
BPF_ADD, BPF_SUB, BPF_MUL, BPF_DIV, BPF_OR, BPF_AND, BPF_LSH, BPF_RSH = 0x00, 0x10, 0x20, 0x30, 0x40, 0x50, 0x60, 0x70
BPF_NEG, BPF_MOD, BPF_XOR, BPF_MOV, BPF_ARSH, BPF_END = 0x80, 0x90, 0xA0, 0xB0, 0xC0, 0xD0

# --- JMP operations (high 4 bits) ---
JMP_OPS = {
    0x00: "ja", 0x10: "jeq", 0x20: "jgt", 0x30: "jge", 0x40: "jset", 0x50: "jne",
    0x60: "jsgt", 0x70: "jsge", 0x80: "call", 0x90: "exit", 0xA0: "jlt", 0xB0: "jle",
    0xC0: "jslt", 0xD0: "jsle",
}
BPF_JA, BPF_JEQ, BPF_JGT, BPF_JGE, BPF_JSET, BPF_JNE, BPF_JSGT, BPF_JSGE = 0x00, 0x10, 0x20, 0x30, 0x40, 0x50, 0x60, 0x70
BPF_CALL, BPF_EXIT, BPF_JLT, BPF_JLE, BPF_JSLT, BPF_JSLE = 0x80, 0x90, 0xA0, 0xB0, 0xC0, 0xD0

# --- memory: size (bits 3-4) and mode (bits 5-7) ---
BPF_W, BPF_H, BPF_B, BPF_DW = 0x00, 0x08, 0x10, 0x18
SIZE_BYTES = {BPF_W: 4, BPF_H: 2, BPF_B: 1, BPF_DW: 8}
SIZE_SUFFIX = {BPF_W: "w", BPF_H: "h", BPF_B: "b", BPF_DW: "dw"}
BPF_IMM, BPF_MEM, BPF_ATOMIC = 0x00, 0x60, 0xC0

# --- LD_IMM64 src_reg pseudo forms ---
PSEUDO_NONE = 0
PSEUDO_MAP_FD = 1        # imm = map index in the object (after relocation)
PSEUDO_MAP_VALUE = 2     # imm = map index, next imm = offset into the value (array maps)

# --- atomic imm operations ---
ATOMIC_ADD = 0x00
ATOMIC_FETCH = 0x01

# --- byte swap (END) source bit: to little / to big endian ---
END_TO_LE, END_TO_BE = BPF_K, BPF_X

R0, R1, R2, R3, R4, R5, R6, R7, R8, R9, R10 = range(11)
NUM_REGS = 11
FRAME_POINTER = R10


@dataclass(frozen=True)
class OpInfo:
    """What an opcode is and which fields it uses.

    kind: alu | jmp | call | exit | ld_imm64 | ldx | st | stx | atomic
    uses_*: the field is meaningful; fields not used must be zero in a valid program.
    """
    opcode: int
    mnemonic: str
    kind: str
    cls: int
    op: int = 0
    src: int = 0            # BPF_K or BPF_X (alu/jmp)
    size: int = 0           # bytes (memory ops)
    is64: bool = True       # ALU64/JMP vs ALU/JMP32
    uses_dst: bool = False
    uses_src: bool = False
    uses_off: bool = False
    uses_imm: bool = False


def _build_table() -> Dict[int, OpInfo]:
    t: Dict[int, OpInfo] = {}

    def add(info: OpInfo) -> None:
        assert info.opcode not in t, hex(info.opcode)
        t[info.opcode] = info

    for cls, is64, suffix in ((BPF_ALU64, True, ""), (BPF_ALU, False, "32")):
        for op, name in ALU_OPS.items():
            if op == BPF_END:
                if is64:
                    continue   # 64-bit unconditional bswap (RFC 9669 v4) not supported in v1
                for src, e in ((END_TO_LE, "le"), (END_TO_BE, "be")):
                    # imm = 16, 32 or 64; mnemonic carries the width ("be16")
                    add(OpInfo(cls | src | op, e, "alu", cls, op, src, 0, False,
                               uses_dst=True, uses_imm=True))
                continue
            if op == BPF_NEG:
                add(OpInfo(cls | BPF_K | op, name + suffix, "alu", cls, op, BPF_K, 0, is64, uses_dst=True))
                continue
            add(OpInfo(cls | BPF_K | op, name + suffix, "alu", cls, op, BPF_K, 0, is64,
                       uses_dst=True, uses_imm=True))
            add(OpInfo(cls | BPF_X | op, name + suffix, "alu", cls, op, BPF_X, 0, is64,
                       uses_dst=True, uses_src=True))

    for cls, is64, suffix in ((BPF_JMP, True, ""), (BPF_JMP32, False, "32")):
        for op, name in JMP_OPS.items():
            if op == BPF_JA:
                if is64:
                    add(OpInfo(cls | op, "ja", "jmp", cls, op, BPF_K, 0, True, uses_off=True))
                continue   # JMP32 ja (gotol) not supported in v1
            if op == BPF_CALL:
                if is64:
                    add(OpInfo(cls | op, "call", "call", cls, op, BPF_K, 0, True, uses_imm=True))
                continue
            if op == BPF_EXIT:
                if is64:
                    add(OpInfo(cls | op, "exit", "exit", cls, op, BPF_K, 0, True))
                continue
            add(OpInfo(cls | BPF_K | op, name + suffix, "jmp", cls, op, BPF_K, 0, is64,
                       uses_dst=True, uses_off=True, uses_imm=True))
            add(OpInfo(cls | BPF_X | op, name + suffix, "jmp", cls, op, BPF_X, 0, is64,
                       uses_dst=True, uses_src=True, uses_off=True))

    add(OpInfo(BPF_LD | BPF_IMM | BPF_DW, "lddw", "ld_imm64", BPF_LD, 0, 0, 8, True,
               uses_dst=True, uses_imm=True))

    for sz, nbytes in SIZE_BYTES.items():
        sfx = SIZE_SUFFIX[sz]
        add(OpInfo(BPF_LDX | BPF_MEM | sz, "ldx" + sfx, "ldx", BPF_LDX, 0, 0, nbytes, True,
                   uses_dst=True, uses_src=True, uses_off=True))
        add(OpInfo(BPF_ST | BPF_MEM | sz, "st" + sfx, "st", BPF_ST, 0, 0, nbytes, True,
                   uses_dst=True, uses_off=True, uses_imm=True))
        add(OpInfo(BPF_STX | BPF_MEM | sz, "stx" + sfx, "stx", BPF_STX, 0, 0, nbytes, True,
                   uses_dst=True, uses_src=True, uses_off=True))
    for sz in (BPF_W, BPF_DW):
        # atomic add; imm selects the operation (ATOMIC_ADD, optionally | ATOMIC_FETCH)
        add(OpInfo(BPF_STX | BPF_ATOMIC | sz, "xadd" + SIZE_SUFFIX[sz], "atomic", BPF_STX, 0, 0,
                   SIZE_BYTES[sz], True, uses_dst=True, uses_src=True, uses_off=True, uses_imm=True))
    return t


OPCODES: Dict[int, OpInfo] = _build_table()
MNEMONICS: Dict[Tuple[str, int], OpInfo] = {}
for _info in OPCODES.values():
    MNEMONICS.setdefault((_info.mnemonic, _info.src), _info)


@dataclass(frozen=True)
class Insn:
    """One 8-byte instruction slot.  Programs are lists of slots, so an index is a slot
    number and jump offsets count slots, as in the RFC.  LD_IMM64 takes two slots: the
    first carries the whole value in `imm64` (and the map name in `map_ref` for the
    pseudo map forms); the second is a continuation slot (opcode 0, imm = upper half)
    that is never executed and may not be jumped to."""
    opcode: int
    dst: int = 0
    src: int = 0
    off: int = 0
    imm: int = 0
    imm64: Optional[int] = None
    map_ref: Optional[str] = None

    @property
    def info(self) -> Optional[OpInfo]:
        return OPCODES.get(self.opcode)

    @property
    def is_lddw(self) -> bool:
        return self.opcode == LDDW

    def encode(self) -> bytes:
        return struct.pack("<BBhi", self.opcode, ((self.src & 0xF) << 4) | (self.dst & 0xF),
                           self.off, _s32(self.imm))


LDDW = BPF_LD | BPF_IMM | BPF_DW


def _s32(v: int) -> int:
    v &= 0xFFFFFFFF
    return v - (1 << 32) if v & 0x80000000 else v


def decode(data: bytes) -> List[Insn]:
    """Bytes -> slots.  Raises ValueError naming the slot on a truncated program or a
    malformed LD_IMM64 pair; other invalid opcodes are left for the verifier to name."""
    if len(data) % 8:
        raise ValueError(f"program length {len(data)} is not a multiple of 8 bytes")
    out: List[Insn] = []
    n = len(data) // 8
    i = 0
    while i < n:
        opcode, regs, off, imm = struct.unpack_from("<BBhi", data, i * 8)
        dst, src = regs & 0xF, regs >> 4
        if opcode != LDDW:
            out.append(Insn(opcode, dst, src, off, imm))
            i += 1
            continue
        if i + 1 >= n:
            raise ValueError(f"insn {i}: lddw is missing its second slot")
        op2, regs2, off2, imm2 = struct.unpack_from("<BBhi", data, (i + 1) * 8)
        if op2 != 0 or regs2 != 0 or off2 != 0:
            raise ValueError(f"insn {i + 1}: invalid second slot of lddw")
        imm64 = (imm & 0xFFFFFFFF) | ((imm2 & 0xFFFFFFFF) << 32)
        out.append(Insn(opcode, dst, src, off, imm, imm64))
        out.append(Insn(0, 0, 0, 0, imm2))
        i += 2
    return out


def encode(insns: List[Insn]) -> bytes:
    return b"".join(i.encode() for i in insns)


def lddw(dst: int, value: int) -> List[Insn]:
    """The two slots of `lddw dst, value`."""
    value &= 0xFFFFFFFFFFFFFFFF
    return [Insn(LDDW, dst, 0, 0, _s32(value), value), Insn(0, 0, 0, 0, _s32(value >> 32))]


def lddw_map(dst: int, map_name: str, map_index: int = 0, pseudo: int = PSEUDO_MAP_FD,
             value_off: int = 0) -> List[Insn]:
    """The two slots of a map reference: imm = map index, upper imm = value offset."""
    value = (map_index & 0xFFFFFFFF) | ((value_off & 0xFFFFFFFF) << 32)
    return [Insn(LDDW, dst, pseudo, 0, _s32(map_index), value, map_name),
            Insn(0, 0, 0, 0, _s32(value_off))]


def with_map_index(insns: List[Insn], at: int, index: int) -> None:
    """Relocate the map reference at slot `at` to map `index` (in place on the list)."""
    ins = insns[at]
    hi = (ins.imm64 or 0) >> 32
    insns[at] = replace(ins, imm=_s32(index), imm64=(index & 0xFFFFFFFF) | (hi << 32))
