"""Abstract state: the type of every register and what is known about every stack byte.

Register kinds:

    uninit              never written (or clobbered by a call)
    scalar              a number; `num` is its Scalar (bounds + tnum); `id` (set by a
                        64-bit mov) ties copies so a branch on one narrows them all
    ctx                 the context record; `off` is a constant Scalar
    stack               r10 + `off` (a constant Scalar, normally negative)
    map_ptr             a map reference (lddw src=1), `map` = map index
    map_value           pointer into a value of map `map`, `off` a Scalar (may vary)
    map_value_or_null   result of map_lookup_elem before its null check; `id` ties
                        copies together so one check refines them all
    mixed               joins of different kinds; any use is an error

Stack: a 512-bit mask of initialised bytes plus 8-byte spill slots (aligned offsets
-512..-8) that remember the full register value stored there by an 8-byte store.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

from . import scalar as S
from .scalar import Scalar

UNINIT, SCALAR, CTX, STACK, MAP_PTR, MAP_VALUE, MAP_VALUE_OR_NULL, MIXED = (
    "uninit", "scalar", "ctx", "stack", "map_ptr", "map_value", "map_value_or_null", "mixed")
POINTERS = (CTX, STACK, MAP_PTR, MAP_VALUE, MAP_VALUE_OR_NULL)

STACK_SIZE = 512
_ZERO = S.const(0)


class Reg:
    """One register's abstract value.  Immutable."""
    __slots__ = ("kind", "num", "off", "map", "id", "kinds")

    def __init__(self, kind: str, num: Optional[Scalar] = None, off: Scalar = _ZERO,
                 map: Optional[int] = None, id: Optional[int] = None, kinds: Tuple[str, ...] = ()):
        self.kind, self.num, self.off, self.map, self.id = kind, num, off, map, id
        self.kinds = kinds           # for MIXED: the kinds that met

    def __eq__(self, o) -> bool:
        return (isinstance(o, Reg) and self.kind == o.kind and self.num == o.num
                and self.off == o.off and self.map == o.map and self.id == o.id
                and self.kinds == o.kinds)

    def __hash__(self) -> int:
        return hash((self.kind, self.map, self.id))

    def __repr__(self) -> str:
        return f"Reg({self.kind}, num={self.num}, off={self.off}, map={self.map}, id={self.id})"

    @property
    def is_pointer(self) -> bool:
        return self.kind in POINTERS


UNINIT_REG = Reg(UNINIT)
UNKNOWN_SCALAR = Reg(SCALAR, S.unknown())


def scalar(num: Scalar) -> Reg:
    return Reg(SCALAR, num)


def const(v: int) -> Reg:
    return Reg(SCALAR, S.const(v))


def join_reg(a: Reg, b: Reg) -> Reg:
    if a is b or a == b:
        return a
    if a.kind == UNINIT or b.kind == UNINIT:
        return UNINIT_REG   # may be unwritten on some path: reading it is an error
    if a.kind == b.kind:
        k = a.kind
        if k == SCALAR:
            return Reg(SCALAR, S.join(a.num, b.num), id=a.id if a.id == b.id else None)
        if k in (CTX, STACK):
            if a.off == b.off:
                return a
        elif k == MAP_PTR:
            if a.map == b.map:
                return a
        elif k in (MAP_VALUE, MAP_VALUE_OR_NULL) and a.map == b.map:
            return Reg(k, off=S.join(a.off, b.off), map=a.map, id=a.id if a.id == b.id else None)
    # a checked map value on one path and NULL (scalar 0) on the other: value-or-null
    for p, q in ((a, b), (b, a)):
        if (p.kind in (MAP_VALUE, MAP_VALUE_OR_NULL) and q.kind == SCALAR
                and q.num.const == 0):
            return Reg(MAP_VALUE_OR_NULL, off=p.off, map=p.map, id=None)
    kinds = tuple(sorted(set((a.kinds or (_short(a),)) + (b.kinds or (_short(b),)))))
    return Reg(MIXED, kinds=kinds)


def _short(r: Reg) -> str:
    """A register's kind for 'different types' messages (offsets where they matter)."""
    if r.kind in (CTX, STACK) and r.off.const is not None:
        return f"{'fp' if r.kind == STACK else 'ctx'}{S.to_signed(r.off.const):+d}"
    if r.kind in (MAP_PTR, MAP_VALUE, MAP_VALUE_OR_NULL):
        return f"{r.kind} of map #{r.map}"
    return r.kind


class State:
    """Registers r0..r10 and the stack.  Copy-on-write by convention: `copy()` before
    changing anything reachable from a state another edge may still use."""
    __slots__ = ("regs", "init", "spills")

    def __init__(self, regs: List[Reg], init: int, spills: Dict[int, Reg]):
        self.regs = regs
        self.init = init            # bit i set: stack byte at offset -(512 - i) is initialised
        self.spills = spills        # slot offset (-512..-8, multiple of 8) -> spilled Reg

    @classmethod
    def entry(cls) -> "State":
        regs = [UNINIT_REG] * 11
        regs[1] = Reg(CTX)
        regs[10] = Reg(STACK)
        return cls(regs, 0, {})

    def copy(self) -> "State":
        return State(list(self.regs), self.init, dict(self.spills))

    # -- stack bytes: offset o in [-512, 0) is bit o + 512
    @staticmethod
    def _bits(off: int, size: int) -> int:
        return ((1 << size) - 1) << (off + STACK_SIZE)

    @staticmethod
    def is_init_bits(init: int, slot: int) -> bool:
        b = 0xFF << (slot + STACK_SIZE)
        return init & b == b

    def is_init(self, off: int, size: int) -> bool:
        b = self._bits(off, size)
        return self.init & b == b

    def first_uninit(self, off: int, size: int) -> int:
        for o in range(off, off + size):
            if not self.init & self._bits(o, 1):
                return o
        return off

    def mark_init(self, off: int, size: int) -> None:
        self.init |= self._bits(off, size)

    def slots(self, off: int, size: int):
        """Spill slots overlapping [off, off+size)."""
        start = off - (off % 8)
        return [s for s in range(start, off + size, 8) if s in self.spills]

    def refine_id(self, id_, new: Reg) -> None:
        """Replace every register and spill carrying null-check id `id_` by `new`."""
        for i, r in enumerate(self.regs):
            if r.kind == MAP_VALUE_OR_NULL and r.id == id_:
                self.regs[i] = new
        for s, r in list(self.spills.items()):
            if r.kind == MAP_VALUE_OR_NULL and r.id == id_:
                self.spills[s] = new

    def narrow_id(self, id_, num: Scalar) -> bool:
        """Intersect every scalar copy carrying id `id_` (registers and spills) with `num`;
        False when some copy cannot take any value of `num` (the edge is infeasible)."""
        for i, r in enumerate(self.regs):
            if r.kind == SCALAR and r.id == id_:
                m = S.meet(r.num, num)
                if m is None:
                    return False
                self.regs[i] = Reg(SCALAR, m, id=id_)
        for s, r in list(self.spills.items()):
            if r.kind == SCALAR and r.id == id_:
                m = S.meet(r.num, num)
                if m is None:
                    return False
                self.spills[s] = Reg(SCALAR, m, id=id_)
        return True


def join_state(a: State, b: State) -> State:
    regs = [x if x is y else join_reg(x, y) for x, y in zip(a.regs, b.regs)]
    init = a.init & b.init
    spills: Dict[int, Reg] = {}
    for s in a.spills.keys() | b.spills.keys():
        ra, rb = a.spills.get(s), b.spills.get(s)
        if ra is not None and rb is not None:
            spills[s] = ra if ra is rb else join_reg(ra, rb)
            continue
        r = ra if ra is not None else rb
        other = b if ra is not None else a
        if not other.is_init(s, 8):
            continue                 # the slot is not initialised on the other path
        # spilled on one path, plain bytes on the other: a scalar stays a scalar
        spills[s] = UNKNOWN_SCALAR if r.kind == SCALAR else Reg(MIXED, kinds=(r.kind, SCALAR))
    if init != a.init or init != b.init:   # keep spills whose bytes are initialised on both paths
        spills = {s: r for s, r in spills.items() if State.is_init_bits(init, s)}
    return State(regs, init, spills)
