"""Control-flow graph over instruction starts (an lddw is one node spanning two slots).

Built after the encoding checks, so every jump target is a valid instruction start.
Rejects cycles (v1 has no loops), falling off the end and unreachable instructions, and
gives the checker a topological order (every predecessor before its successors) and
the longest path, which bounds the instructions one run executes.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Sequence, Set

from .. import isa
from ..isa import Insn, OPCODES
from .messages import error


def successors(insns: Sequence[Insn], pc: int) -> List[int]:
    """Successors of the instruction at pc (fallthrough first); may include len(insns)."""
    ins = insns[pc]
    info = OPCODES[ins.opcode]
    if info.kind == "exit":
        return []
    if info.kind == "ld_imm64":
        return [pc + 2]
    if info.kind == "jmp":
        target = pc + ins.off + 1
        if info.op == isa.BPF_JA:
            return [target]
        return [pc + 1, target] if target != pc + 1 else [pc + 1]
    return [pc + 1]


@dataclass
class Cfg:
    succ: Dict[int, List[int]]
    order: List[int]             # reachable instruction starts, topologically sorted
    longest: int                 # instructions on the longest path from the entry


def build(insns: Sequence[Insn], cont: Set[int]) -> Cfg:
    n = len(insns)
    succ: Dict[int, List[int]] = {}
    WHITE, GREY, BLACK = 0, 1, 2
    color: Dict[int, int] = {}
    post: List[int] = []
    stack = [(0, 0)]              # (pc, index of the next successor to visit)
    color[0] = GREY
    succ[0] = successors(insns, 0)
    while stack:
        pc, k = stack[-1]
        ss = succ[pc]
        if k == 0:
            for s in ss:
                if s >= n:
                    raise error(pc, "fall-off-end", at=pc)
        if k < len(ss):
            stack[-1] = (pc, k + 1)
            s = ss[k]
            c = color.get(s, WHITE)
            if c == GREY:
                raise error(pc, "back-edge", target=s)
            if c == WHITE:
                color[s] = GREY
                succ[s] = successors(insns, s)
                stack.append((s, 0))
            continue
        color[pc] = BLACK
        post.append(pc)
        stack.pop()
    for pc in range(n):
        if pc not in color and pc not in cont:
            raise error(pc, "unreachable", at=pc)
    order = post[::-1]
    longest: Dict[int, int] = {}
    for pc in post:               # successors come first in postorder
        longest[pc] = 1 + max((longest[s] for s in succ[pc]), default=0)
    return Cfg(succ, order, longest[0])
