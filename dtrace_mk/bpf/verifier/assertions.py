"""Instruction -> assertions: what must hold before an instruction runs.

Assertions depend only on the instruction (and the helper table), never on the abstract
state; the checker (checker.py) has one method per assertion kind that decides whether
the state before the instruction satisfies it.  Order matters: registers must be
initialised before their types are inspected, a memory access is valid before the value
it stores is judged.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

from ...abi.definition import HELPERS_BY_ID
from .. import isa
from ..isa import Insn, OpInfo


@dataclass(frozen=True)
class Init:
    """Register `reg` has been written on every path to here."""
    reg: int


@dataclass(frozen=True)
class MemAccess:
    """[base + off, +size) is valid memory for `mode` ("read", "write", "atomic")."""
    base: int
    off: int
    size: int
    mode: str


@dataclass(frozen=True)
class StoredValue:
    """The value in register `src` may be stored through `base` (no pointer leaks)."""
    base: int
    src: int
    size: int
    atomic: bool = False


@dataclass(frozen=True)
class Arith:
    """`dst = dst OP src|imm` is allowed for the operand types (pointer arithmetic rules)."""
    mnemonic: str
    op: str
    dst: int
    src: Optional[int]            # None: immediate
    imm: int
    is64: bool


@dataclass(frozen=True)
class Compare:
    """A conditional jump may compare these operands (pointers: null checks only)."""
    mnemonic: str
    op: str
    dst: int
    src: Optional[int]
    imm: int
    is64: bool


@dataclass(frozen=True)
class Call:
    """The helper exists and is allowed for the program type."""
    helper_id: int


@dataclass(frozen=True)
class HelperArg:
    """Argument `arg` (1-based, in register r`arg`) has kind `kind` of the helper's table."""
    helper_id: int
    arg: int
    kind: str


@dataclass(frozen=True)
class Return:
    """r0 holds an initialised scalar."""


KINDS = (Init, MemAccess, StoredValue, Arith, Compare, Call, HelperArg, Return)


def explicate(ins: Insn, info: OpInfo) -> Tuple[object, ...]:
    k = info.kind
    out = []
    if k == "alu":
        op = isa.ALU_OPS[info.op]
        if op != "mov":
            out.append(Init(ins.dst))
        if info.src == isa.BPF_X and op not in ("neg", "end"):
            out.append(Init(ins.src))
        if op != "end":
            out.append(Arith(info.mnemonic, op, ins.dst,
                             ins.src if info.src == isa.BPF_X else None, ins.imm, info.is64))
        else:
            out.append(Arith(info.mnemonic + str(ins.imm), "end", ins.dst, None, ins.imm, True))
    elif k == "jmp":
        if info.op != isa.BPF_JA:
            out.append(Init(ins.dst))
            src = ins.src if info.src == isa.BPF_X else None
            if src is not None:
                out.append(Init(src))
            out.append(Compare(info.mnemonic, isa.JMP_OPS[info.op], ins.dst, src, ins.imm, info.is64))
    elif k == "ldx":
        out += [Init(ins.src), MemAccess(ins.src, ins.off, info.size, "read")]
    elif k == "st":
        out += [Init(ins.dst), MemAccess(ins.dst, ins.off, info.size, "write")]
    elif k == "stx":
        out += [Init(ins.dst), Init(ins.src), MemAccess(ins.dst, ins.off, info.size, "write"),
                StoredValue(ins.dst, ins.src, info.size)]
    elif k == "atomic":
        out += [Init(ins.dst), Init(ins.src), MemAccess(ins.dst, ins.off, info.size, "atomic"),
                StoredValue(ins.dst, ins.src, info.size, atomic=True)]
    elif k == "call":
        out.append(Call(ins.imm))
        h = HELPERS_BY_ID.get(ins.imm)
        if h is not None:
            # optional trailing scalars (trace_printk's format arguments) may be unset
            out += [Init(i + 1) for i, kind in enumerate(h.args) if kind != "opt_scalar"]
            out += [HelperArg(h.id, i + 1, kind) for i, kind in enumerate(h.args)]
    elif k == "exit":
        out.append(Return())
    return tuple(out)
