"""eBPF verifier: instruction -> assertions -> checker -> one message format.

    from dtrace_mk.bpf.verifier import verify, VerifierError, VerifyResult
    res = verify(prog, maps)            # raises VerifierError (a dtrace_mk.errors.Rejected)

Pipeline (each stage assumes the previous one passed):

1. program level   (this file)      program type, size
2. structure.py    each slot alone  opcode, unused fields, registers, lddw pairs,
                                    map references, jump targets
3. cfg.py          control flow     no loops, no falling off the end, nothing unreachable;
                                    topological order and longest path
4. checker.py      abstract walk    assertions.py derives what must hold before each
                                    instruction; the checker decides it on the abstract
                                    state (types.py, scalar.py) and applies the transfer
5. messages.py     wording          every rule id and message template

The rule ids and their meanings are `messages.RULES`; docs/verifier.md lists them.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence, Set, Type

from ...abi import definition as abi
from ..program import MapDef, Program
from . import cfg as _cfg
from . import structure
from .checker import Checker
from .messages import RULES, VerifierError, error

__all__ = ["verify", "VerifierError", "VerifyResult", "RULES"]


@dataclass
class VerifyResult:
    """What an accepted program needs from the runtime.

    insn_count      slots (an lddw counts 2)
    max_path_insns  instructions on the longest control-flow path (an lddw counts 1): the
                    most instructions one run can execute, the per-event bound VM budgets use
    helpers_used    helper ids called on feasible paths
    maps_used       map indices referenced on feasible paths
    stack_depth     bytes of stack below r10 the program touches (multiple of 8)
    walk            the Checker that accepted it (its per-instruction facts, e.g. the
                    runtime's inline analysis: verify(..., checker=inline._Facts))
    """
    insn_count: int
    max_path_insns: int
    helpers_used: Set[int] = field(default_factory=set)
    maps_used: Set[int] = field(default_factory=set)
    stack_depth: int = 0
    walk: Optional[Checker] = field(default=None, compare=False, repr=False)


def verify(prog: Program, maps: Sequence[MapDef], prog_type: Optional[str] = None, *,
           checker: Type[Checker] = Checker) -> VerifyResult:
    """Verify `prog` against the object's `maps`; raise VerifierError on the first violation.

    prog_type overrides prog.prog_type; a "control" program is only accepted when the
    caller asks for prog_type="control" explicitly (control programs are not attachable
    to ABI v1 hooks).  checker: a Checker subclass that notes more on the same walk (kept
    as .walk, with the control-flow graph as .walk.graph)."""
    ptype = prog_type or prog.prog_type
    if ptype not in abi.PROGRAM_TYPES_BY_NAME:
        raise error(None, "prog-type-unknown", ptype=ptype,
                    known=", ".join(abi.PROGRAM_TYPES_BY_NAME))
    if not abi.PROGRAM_TYPES_BY_NAME[ptype].attachable and prog_type != ptype:
        raise error(None, "prog-type-not-attachable", hook=prog.hook.name)
    insns = prog.insns
    if not insns:
        raise error(None, "empty-program", name=prog.name)
    if len(insns) > abi.MAX_INSNS:
        raise error(None, "program-too-large", name=prog.name, n=len(insns), limit=abi.MAX_INSNS)
    cont = structure.check(insns, maps)
    graph = _cfg.build(insns, cont)
    walk = checker(insns, list(maps), prog.hook, ptype)
    walk.run(graph.order)
    walk.graph = graph
    depth = walk.stack_depth
    return VerifyResult(insn_count=len(insns), max_path_insns=graph.longest,
                        helpers_used=walk.helpers_used, maps_used=walk.maps_used,
                        stack_depth=(depth + 7) // 8 * 8, walk=walk)
