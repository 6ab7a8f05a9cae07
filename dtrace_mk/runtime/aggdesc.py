"""Aggregation descriptors: a verified program that only aggregates context fields,
reduced to data -- the data-driven hook site (docs/dev/hook_cost_analysis.md sessions 9
and 10; runtime/descform.py encodes a plan for the device, kernels/bpf_inline.cuh
`dtmk_desc_run` runs it at the hook sites of a site-form kernel, in the hot tier too: no
compile, descriptors are data).  This module decides which programs reduce to such
updates and what they are, from the verified bytecode alone:

    plan = reduce(program, maps, facts)     # AggPlan: .cases (guards -> aggs) or .reason
    apply(plan, ctx, maps_model, worker)    # one run's updates, on the host map model

An `Agg` is one map update of one run: HIST (hist_add: +1 in the value's bucket), ADD
(a hash value word xadd-ed), MAX / MIN (a hash value word raised / lowered by the
verifier-checked triple), with its key (the key bytes: context fields, constants and
the worker id, in stack order) and value (a context field, a constant or the worker).

A run's updates depend on guards: a branch comparing a context field (or the worker) with
a constant forks the walk, and each path that reaches `exit` is a `Case` -- its guards
(every comparison on the way, taken or not) and its updates.  The cases are disjoint and
cover every input, so exactly one applies per run (the query's predicate `/a && b/` is one
updating case and the cases that skip).

A program reduces when its inline plan qualifies (runtime/inline.py: every update
commutes, at most one shadow access per run, every lookup a lookup-or-insert) AND every
path is straight-line over context fields: followed where every lookup finds its key (the
shadow never returns null; the insert path only inserts the zero value the flush inserts
anyway), every register and stack slot holds a context load, a constant, the worker id,
the stack or context pointer, a map pointer or a map value pointer; any arithmetic on
them, a comparison of two fields and any other helper keep the program as a program (the
reason names the instruction).  Exactness: `apply` over any context equals the reference
VM's run (tests/runtime/test_aggdesc.py, golden and random queries)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Sequence, Tuple, Union

from ..bpf import isa
from ..bpf.program import MapDef, Program

HIST, ADD, MAX, MIN = "hist", "add", "max", "min"
MASK64 = (1 << 64) - 1


@dataclass(frozen=True)
class Ctx:
    """A context field: `size` bytes at byte offset `off`, zero-extended."""
    off: int
    size: int


@dataclass(frozen=True)
class Const:
    value: int


@dataclass(frozen=True)
class Worker:
    """get_worker_id(): the running worker."""


Scalar = Union[Ctx, Const, Worker]


@dataclass(frozen=True)
class Agg:
    """One map update per run.  key: (scalar, bytes) parts in stack order, their bytes
    concatenated little-endian (a scalar stored with fewer bytes than it has is
    truncated, as the store does); word: the hash value word (8 bytes) the update hits
    (HIST: 0, the bucket comes from the value)."""
    op: str
    map: int
    key: Tuple[Tuple[Scalar, int], ...]
    value: Scalar
    word: int = 0


@dataclass(frozen=True)
class Guard:
    """`value <op> const` (vm.JMP_COND's operators; jmp32: on the low 32 bits) is `taken`."""
    value: Scalar
    op: str
    const: int
    is64: bool
    taken: bool


@dataclass(frozen=True)
class Case:
    guards: Tuple[Guard, ...]
    aggs: Tuple[Agg, ...]


MAX_CASES = 16        # paths of one program (a predicate of k comparisons: k + 1)


@dataclass
class AggPlan:
    cases: Tuple[Case, ...] = ()
    reason: Optional[str] = None

    @property
    def ok(self) -> bool:
        return self.reason is None

    @property
    def aggs(self) -> Tuple[Agg, ...]:
        """The updates of a program without guards (one case), else ()."""
        return self.cases[0].aggs if len(self.cases) == 1 and not self.cases[0].guards else ()


# symbolic register values (besides the scalars)
@dataclass(frozen=True)
class _CtxPtr:
    pass


@dataclass(frozen=True)
class _Fp:
    off: int


@dataclass(frozen=True)
class _MapPtr:
    map: int


@dataclass(frozen=True)
class _Val:
    map: int
    key: Tuple[Tuple[Scalar, int], ...]
    off: int


class _Refuse(Exception):
    pass


def reduce(prog: Program, maps: Sequence[MapDef], facts) -> AggPlan:
    """The aggregation descriptors of a verified program (`facts`: its inline.ProgramFacts),
    or the reason it stays a program."""
    if not facts.plan.ok:
        return AggPlan(reason=f"not inline: {facts.plan.reason}")
    cases = []
    try:
        _walk(prog, maps, facts, 0, {isa.R1: _CtxPtr(), isa.R10: _Fp(0)}, {}, (), (), cases)
    except _Refuse as e:
        return AggPlan(reason=str(e))
    return AggPlan(cases=tuple(c for c in cases if c.aggs))   # (a case without updates does nothing)


def _walk(prog: Program, maps: Sequence[MapDef], facts, pc: int, regs: Dict[int, object],
          stack: Dict[int, Tuple[object, int]], guards: Tuple[Guard, ...], done: Tuple[Agg, ...],
          cases: list) -> None:
    """Walk from pc with registers / stack (offset below r10 -> (term, bytes)); append a
    Case per path that exits.  A guard forks a copy of the state."""
    insns = prog.insns
    names = {m.name: i for i, m in enumerate(maps)}
    out = list(done)
    steps = 0
    while True:
        steps += 1
        if steps > len(insns) + 1:                     # (verified programs have no loops)
            raise _Refuse(f"insn {pc}: a loop")
        ins = insns[pc]
        info = ins.info
        where = f"insn {pc}: {info.mnemonic if info else hex(ins.opcode)}"

        def reg(r):
            if r not in regs:
                raise _Refuse(f"{where}: r{r} holds no aggregation operand")
            return regs[r]

        if ins.is_lddw:
            if ins.src != isa.PSEUDO_MAP_FD:
                raise _Refuse(f"{where}: a 64-bit constant or map value address")
            regs[ins.dst] = _MapPtr(names[ins.map_ref] if ins.map_ref in names else ins.imm)
            pc += 2
            continue
        kind = info.kind
        if kind == "alu":
            if info.op == isa.BPF_MOV and info.is64:
                regs[ins.dst] = reg(ins.src) if info.src == isa.BPF_X else Const(ins.imm & MASK64)
            elif info.op == isa.BPF_ADD and info.is64 and info.src == isa.BPF_K and \
                    isinstance(regs.get(ins.dst), (_Fp, _Val)):
                v = regs[ins.dst]
                regs[ins.dst] = _Fp(v.off + ins.imm) if isinstance(v, _Fp) else _Val(v.map, v.key, v.off + ins.imm)
            else:
                raise _Refuse(f"{where}: arithmetic on an operand (descriptors take fields as they are)")
        elif kind == "ldx":
            base = reg(ins.src)
            if isinstance(base, _CtxPtr):
                regs[ins.dst] = Ctx(ins.off, info.size)
            elif isinstance(base, _Fp):
                regs[ins.dst] = _stack_term(stack, base.off + ins.off, info.size, where)
            elif isinstance(base, _Val) and facts.extremum_stores.get(pc + 2) and info.size == 8:
                # the raise-to / lower-to triple: ldxdw rT, [v]; jge|jle rT, rV; stxdw [v], rV
                j = insns[pc + 1]
                op = MAX if facts.extremum_stores[pc + 2] == "max" else MIN
                out.append(_value_agg(op, base, ins.off, reg(j.src), where))
                regs.pop(ins.dst, None)               # (dead after the triple: inline.py checks)
                pc += 3
                continue
            else:
                raise _Refuse(f"{where}: a load from a map value outside a max / min triple")
        elif kind in ("st", "stx"):
            base = reg(ins.dst)
            if not isinstance(base, _Fp):
                raise _Refuse(f"{where}: a store outside the stack")
            val = Const(ins.imm & MASK64) if kind == "st" else reg(ins.src)
            if not isinstance(val, (Ctx, Const, Worker)):
                raise _Refuse(f"{where}: a pointer stored to the stack")
            off = base.off + ins.off
            for o in [o for o, (_, n) in stack.items() if o < off + info.size and off < o + n]:
                del stack[o]                          # overwritten (partly: gone)
            stack[off] = (_truncate(val, info.size, where), info.size)
        elif kind == "atomic":
            base = reg(ins.dst)
            if not isinstance(base, _Val) or ins.imm != isa.ATOMIC_ADD or info.size != 8:
                raise _Refuse(f"{where}: an atomic other than a 64-bit add into a map value")
            out.append(_value_agg(ADD, base, ins.off, reg(ins.src), where))
        elif kind == "call":
            helper = _helper_name(ins.imm)
            where = f"insn {pc}: call {helper}"
            if helper == "get_worker_id":
                regs[isa.R0] = Worker()
            elif helper == "map_lookup_elem":
                m = _map_of(reg(isa.R1), where, maps, facts.plan.maps)
                regs[isa.R0] = _Val(m, _key(stack, reg(isa.R2), maps[m].key_size, where), 0)
            elif helper == "hist_add":
                m = _map_of(reg(isa.R1), where, maps, facts.plan.maps)
                key = _key(stack, reg(isa.R2), maps[m].key_size, where)
                out.append(Agg(HIST, m, key, _scalar(reg(isa.R3), where)))
                regs[isa.R0] = Const(0)               # (never read: inline.py checks)
            else:
                raise _Refuse(f"{where}: helper {helper} on the followed path")
            for r in (isa.R1, isa.R2, isa.R3, isa.R4, isa.R5):
                regs.pop(r, None)
        elif kind == "jmp":
            op = info.op
            if op == isa.BPF_JA:
                pc += 1 + ins.off
                continue
            if op in (isa.BPF_JEQ, isa.BPF_JNE) and info.src == isa.BPF_K and ins.imm == 0 and \
                    isinstance(regs.get(ins.dst), _Val):
                # a lookup's null check: follow "found" (the shadow always finds or inserts)
                pc = pc + 1 + ins.off if op == isa.BPF_JNE else pc + 1
                continue
            a = reg(ins.dst)
            b = Const(ins.imm & MASK64) if info.src == isa.BPF_K else reg(ins.src)
            if not isinstance(a, (Ctx, Const, Worker)) or not isinstance(b, Const):
                raise _Refuse(f"{where}: a comparison that is not a field with a constant")
            g = Guard(a, info.mnemonic.removesuffix("32"), b.value, info.is64, True)
            if isinstance(a, Const):                   # both known: not a guard
                pc = pc + 1 + ins.off if guard_holds(g, a.value) else pc + 1
                continue
            for taken in (True, False):
                if len(cases) >= MAX_CASES:
                    raise _Refuse(f"{where}: more than {MAX_CASES} paths")
                gt = Guard(g.value, g.op, g.const, g.is64, taken)
                _walk(prog, maps, facts, pc + 1 + ins.off if taken else pc + 1, dict(regs), dict(stack),
                      guards + (gt,), tuple(out), cases)
            return
        elif kind == "exit":
            cases.append(Case(guards, tuple(out)))
            return
        else:
            raise _Refuse(f"{where}: not an aggregation step")
        pc += 1


def _helper_name(hid: int) -> str:
    from ..abi import definition as abi
    h = abi.HELPERS_BY_ID.get(hid)
    return h.name if h else f"#{hid}"


def _map_of(v, where: str, maps: Sequence[MapDef], plan_maps) -> int:
    if not isinstance(v, _MapPtr):
        raise _Refuse(f"{where}: r1 is no map")
    if v.map not in plan_maps:                 # arrays: the inline form's ordinary helpers
        raise _Refuse(f"{where}: map '{maps[v.map].name}' is a {maps[v.map].type} "
                      f"(descriptors update hash and hist maps)")
    return v.map


def _scalar(v, where: str) -> Scalar:
    if not isinstance(v, (Ctx, Const, Worker)):
        raise _Refuse(f"{where}: the value is a pointer")
    return v


def _truncate(v: Scalar, size: int, where: str) -> Scalar:
    """What a `size`-byte store keeps of v (little-endian: the low bytes), as a scalar."""
    if isinstance(v, Const):
        return Const(v.value & ((1 << 8 * size) - 1))
    if isinstance(v, Ctx):
        return Ctx(v.off, size) if size < v.size else v
    if size < 4:                                       # the worker id is a u32
        raise _Refuse(f"{where}: the worker id stored in {size} bytes")
    return v


def _stack_term(stack, off: int, size: int, where: str) -> Scalar:
    got = stack.get(off)
    if got is None or got[1] != size:
        raise _Refuse(f"{where}: a stack load that is not one earlier store of the same size")
    return got[0]


def _key(stack, ptr, key_size: int, where: str) -> Tuple[Tuple[Scalar, int], ...]:
    if not isinstance(ptr, _Fp):
        raise _Refuse(f"{where}: the key is not on the stack")
    parts, off = [], ptr.off
    while off < ptr.off + key_size:
        got = stack.get(off)
        if got is None or off + got[1] > ptr.off + key_size:
            raise _Refuse(f"{where}: key byte {off - ptr.off} is not one whole stored field")
        parts.append(got)
        off += got[1]
    return tuple(parts)


def _value_agg(op: str, base: "_Val", ins_off: int, val, where: str) -> Agg:
    off = base.off + ins_off
    if off % 8:
        raise _Refuse(f"{where}: value offset {off} is not a word")
    return Agg(op, base.map, base.key, _scalar(val, where), off // 8)


# -- semantics on the host map model (what the device site will do) -------------------

def scalar_value(s: Scalar, ctx: bytes, worker: int) -> int:
    if isinstance(s, Ctx):
        return int.from_bytes(ctx[s.off:s.off + s.size], "little")
    if isinstance(s, Const):
        return s.value & MASK64
    return worker


def key_bytes(key: Tuple[Tuple[Scalar, int], ...], ctx: bytes, worker: int) -> bytes:
    return b"".join((scalar_value(s, ctx, worker) & ((1 << 8 * n) - 1)).to_bytes(n, "little")
                    for s, n in key)


_CONDS: Dict[Tuple[str, bool], object] = {}


def guard_holds(g: Guard, v: int) -> bool:
    """Whether the branch of guard g is taken for value v (the VM's own JMP_COND text:
    one source of the comparison semantics)."""
    from ..bpf.vm import JMP_COND
    fn = _CONDS.get((g.op, g.is64))
    if fn is None:
        sb = 1 << 63 if g.is64 else 1 << 31
        fn = _CONDS[(g.op, g.is64)] = eval("lambda a, b: bool(" + JMP_COND[g.op].format(a="a", b="b", sb=sb) + ")")
    m = MASK64 if g.is64 else 0xFFFFFFFF
    return fn(v & m, g.const & m)


def apply(plan: AggPlan, ctx: bytes, maps, worker: int = 0) -> None:
    """Apply one run to a host MapSet (dtrace_mk.bpf.maps) the way the program does: the
    case whose guards hold, each update a hist_add, or a lookup-or-insert of a zero value
    then the word's add / max / min (64-bit, wrapping)."""
    case = next((c for c in plan.cases
                 if all(guard_holds(g, scalar_value(g.value, ctx, worker)) == g.taken for g in c.guards)), None)
    for a in case.aggs if case else ():
        m = maps[a.map]
        key = key_bytes(a.key, ctx, worker)
        v = scalar_value(a.value, ctx, worker)
        if a.op == HIST:
            m.hist_add(key, v, worker)
            continue
        if m.lookup(key, worker) is None:
            m.update(key, bytes(m.mdef.value_size), 1, worker)
        cur = bytearray(m.lookup(key, worker))
        old = int.from_bytes(cur[8 * a.word:8 * a.word + 8], "little")
        new = {ADD: (old + v) & MASK64, MAX: max(old, v), MIN: min(old, v)}[a.op]
        cur[8 * a.word:8 * a.word + 8] = new.to_bytes(8, "little")
        m.update(key, bytes(cur), 0, worker)
