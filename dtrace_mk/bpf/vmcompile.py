"""Compiled host tier of the reference VM: one program -> one Python function.

`vm.Vm` (the interpreter: one closure per slot, generated from `vm.ALU_EXPR` and
`vm.JMP_COND`) is the semantics.  This module translates the same slots into the source
of a single function, so a run costs a few Python statements per instruction instead of
one closure call each:

* registers are locals r0..r9 (r10 is the constant frame pointer: the interpreter
  faults on every write to it);
* ALU and jump expressions are the interpreter's tables, formatted with locals or, where
  a register's value is known at that point (a small forward constant propagation over
  the control-flow graph: lddw values and map handles, `mov r2, r10; add r2, -8`, the
  entry state), with literals; fully known ALU results are folded with the same table;
* slots run as superblocks (a jump target up to the next jump target or unconditional
  transfer) in a `while True` loop dispatched by a binary `if pc < X` tree;
* loads/stores are the interpreter's code (same struct unpack/pack on the same region
  list, same `Vm._mem_fault` on any error); at a known in-bounds stack or context
  address they read/write the buffer directly;
* helper calls copy r1..r5 into `vm.r` and call the same bound `Vm._h_*` methods;
  map_lookup_elem / map_update_elem with a known map and known in-bounds stack key and
  value pointers call the map's own lookup/update and `Vm._value_addr` directly, with
  the same loss accounting;
* anything else (invalid slots, lddw map_value, a jump to a bad target) runs the
  interpreter's own closure for that slot on synced registers;
* instructions are counted per superblock exit; a fault sets `VMFault.insns` from the
  faulting slot's position in its superblock; a superblock that might cross the
  instruction budget hands its registers to the interpreter, which finishes the run
  (so budget faults are the interpreter's).

The generated function returns (r0, insns, -1) on exit or (0, insns, pc) to ask
`Vm.run` to resume the interpreter at `pc`.  Sources are cached by text (the text holds
everything the code depends on: slots, map kinds and sizes, helper set, budget).
"""
from __future__ import annotations

import os
import struct
from typing import Callable, Dict, List, Optional, Tuple

from ..abi import definition as abi
from . import isa
from .isa import OPCODES
from .maps import E2BIG, EINVAL, HashMap, RingBufMap
from .vm import (ALU_EXPR, CTX_ADDR, FRAME_POINTER, JMP_COND, M32, M64, REGION_CTX, REGION_MAPS,
                 REGION_SHIFT, REGION_STACK, S32, S64, VMFault)

ENV = "DTRACE_MK_HOST_VM"
TIERS = ("compiled", "interp")


def default_tier() -> str:
    """The host VM tier the runtime uses: $DTRACE_MK_HOST_VM (compiled | interp),
    compiled by default."""
    t = os.environ.get(ENV, "compiled").strip().lower() or "compiled"
    if t not in TIERS:
        raise ValueError(f"${ENV}={t!r}: expected one of {', '.join(TIERS)}")
    return t


_SE = (IndexError, TypeError, struct.error)
_UNPACK = {n: struct.Struct(f).unpack_from for n, f in ((1, "<B"), (2, "<H"), (4, "<I"), (8, "<Q"))}
_PACK = {n: struct.Struct(f).pack_into for n, f in ((1, "<B"), (2, "<H"), (4, "<I"), (8, "<Q"))}
_ENTRY = {0: 0, 1: CTX_ADDR, 2: 0, 3: 0, 4: 0, 5: 0, 6: 0, 7: 0, 8: 0, 9: 0}
_REGS = ", ".join(f"r{i}" for i in range(10))
_cache: Dict[str, Callable] = {}


def _lit(v: int) -> str:
    return hex(v)


class _Gen:
    def __init__(self, vm):
        self.vm = vm
        self.insns = vm.insns
        self.n = len(self.insns)
        self.code = vm._code
        n = self.n
        self.cont = {i + 1 for i, ins in enumerate(self.insns) if ins.opcode == isa.LDDW and i + 1 < n}
        # Leaders: the entry, jump targets and the end (falling off it faults); a
        # conditional jump's fall-through stays inside its superblock.
        targets = {0, n}
        for pc, ins in enumerate(self.insns):
            if pc in self.cont or self._faulting(pc):
                continue
            info = OPCODES.get(ins.opcode)
            if info is not None and info.kind == "jmp":
                targets.add(pc + 1 + ins.off)
        self.leaders = sorted(targets)
        self.lset = set(self.leaders)
        self.pos: Dict[int, int] = {}
        self.prelude: set = set()       # lines of make() binding map methods

    def _faulting(self, pc: int) -> bool:
        """The interpreter decoded this slot to a fault, or (jumps) to a checked jump."""
        f = self.code[pc]
        if getattr(f, "fault", None) is not None:
            return True
        info = OPCODES.get(self.insns[pc].opcode)
        if info is not None and info.kind == "jmp":
            tgt = pc + 1 + self.insns[pc].off
            return not 0 <= tgt <= self.n - 1 or tgt in self.cont
        return False

    # -- one superblock ------------------------------------------------------------
    def block(self, leader: int, known: Dict[int, int], falls=frozenset()):
        """Lines of the superblock at `leader` given the registers known on entry;
        (lines, [(target, known at the edge)], instruction count).  A final transfer to a
        leader in `falls` (later in the same dispatch chunk) falls through to its test."""
        K = dict(known)
        out: List[str] = []
        edges: List[Tuple[int, Dict[int, int]]] = []
        pc, cnt = leader, 0

        def reg(i: int, w64: bool = True) -> str:
            if i == 10:
                v = FRAME_POINTER
            else:
                v = K.get(i)
            if v is None:
                return f"r{i}" if w64 else f"(r{i} & 0xffffffff)"
            return _lit(v if w64 else v & M32)

        def generic(p: int, writes: Tuple[int, ...]):
            out.append(f"R[:10] = ({_REGS},)")
            out.append(f"C[{p}]()")
            out.append(f"{_REGS} = R[:10]")
            for w in writes:
                K.pop(w, None)

        while True:
            if self.pos.setdefault(pc, cnt) != cnt:
                raise AssertionError(f"slot {pc} in two superblocks")
            if pc >= self.n or self._faulting(pc):
                ins = self.insns[pc] if pc < self.n else None
                info = OPCODES.get(ins.opcode) if ins is not None else None
                if info is not None and info.kind == "jmp" and getattr(self.code[pc], "fault", None) is None:
                    generic(pc, ())               # bad target: faults only when taken
                else:
                    out.append(f"C[{pc}]()")      # raises VMFault
                    return out, edges, cnt + 1
                cnt += 1
                nxt = pc + 1
            else:
                ins = self.insns[pc]
                info = OPCODES[ins.opcode]
                k = info.kind
                d, s, off, imm = ins.dst, ins.src, ins.off, ins.imm
                nxt = pc + 1
                if k == "exit":
                    out.append(f"return r0, n + {cnt + 1}, -1")
                    return out, edges, cnt + 1
                if k == "jmp":
                    tgt = pc + 1 + off
                    op = isa.JMP_OPS[info.op]
                    if op == "ja":
                        out.append(f"n += {cnt + 1}")
                        out.append(f"pc = {tgt}")
                        if tgt not in falls:
                            out.append("continue")
                        edges.append((tgt, dict(K)))
                        return out, edges, cnt + 1
                    w = info.is64
                    Kv = (imm & M64) if w else (imm & M32)
                    cond = JMP_COND[op].format(
                        a=reg(d, w), b=reg(s, w) if info.src == isa.BPF_X else _lit(Kv),
                        sb=_lit(S64 if w else S32))
                    out.append(f"if {cond}:")
                    out.append(f" n += {cnt + 1}")
                    out.append(f" pc = {tgt}")
                    out.append(" continue")
                    edges.append((tgt, dict(K)))
                elif k == "alu":
                    self._alu(out, K, info, d, s, imm, reg)
                elif k == "call":
                    self._call(out, K, pc, imm, reg)
                elif k == "ld_imm64":
                    nxt = pc + 2
                    value = ins.imm64 if ins.imm64 is not None else \
                        (ins.imm & M32) | ((self.insns[pc + 1].imm & M32) << 32)
                    if ins.src == isa.PSEUDO_NONE:
                        K[d] = value
                        out.append(f"r{d} = {_lit(value)}")
                    elif ins.src == isa.PSEUDO_MAP_FD:
                        K[d] = (REGION_MAPS + (ins.imm & M32)) << REGION_SHIFT
                        out.append(f"r{d} = {_lit(K[d])}")
                    else:                          # map_value: the interpreter's closure
                        generic(pc, (d,))
                else:
                    self._mem(out, K, pc, info, d, s, off, imm, reg, generic)
                cnt += 1
            if nxt in self.lset:
                out.append(f"n += {cnt}")
                out.append(f"pc = {nxt}")
                if nxt not in falls:
                    out.append("continue")
                edges.append((nxt, dict(K)))
                return out, edges, cnt
            pc = nxt

    def _alu(self, out, K, info, d, s, imm, reg):
        op = isa.ALU_OPS[info.op]
        if op == "end":
            mask = (1 << imm) - 1
            if info.src == isa.END_TO_LE:
                out.append(f"r{d} = {reg(d)} & {_lit(mask)}")
            else:
                out.append(f"r{d} = int.from_bytes(({reg(d)} & {_lit(mask)}).to_bytes({imm // 8}, 'little'), 'big')")
            K.pop(d, None)
            return
        w = info.is64
        Kv = (imm & M64) if w else (imm & M32)
        use_reg = info.src == isa.BPF_X
        ops = {"m": _lit(M64 if w else M32), "sh": "63" if w else "31", "sb": _lit(S64 if w else S32)}
        a_known = d == 10 or d in K
        b_known = (not use_reg) or s == 10 or s in K
        if (a_known or op == "mov") and b_known:
            av = FRAME_POINTER if d == 10 else K.get(d, 0)
            bv = Kv if not use_reg else (FRAME_POINTER if s == 10 else K[s])
            if not w:
                av, bv = av & M32, bv & M32
            val = eval(ALU_EXPR[op].format(a=_lit(av), b=_lit(bv), **ops))   # the table, folded
            K[d] = val
            out.append(f"r{d} = {_lit(val)}")
            return
        expr = ALU_EXPR[op].format(a=reg(d, w), b=reg(s, w) if use_reg else _lit(Kv), **ops)
        out.append(f"r{d} = {expr}")
        K.pop(d, None)

    def _stack_or_ctx(self, a: int, size: int, write: bool) -> Optional[str]:
        rid, o = a >> REGION_SHIFT, a & M32
        if rid == REGION_STACK and o + size <= abi.STACK_SIZE:
            return f"stk, {o}"
        if rid == REGION_CTX and not write and o + size <= abi.CONTEXT_SIZE:
            return f"ctx, {o}"
        return None

    def _mem(self, out, K, pc, info, d, s, off, imm, reg, generic):
        k, size = info.kind, info.size
        mask = (1 << (8 * size)) - 1
        U, P = f"U{size}", f"P{size}"
        base = s if k == "ldx" else d
        bk = FRAME_POINTER if base == 10 else K.get(base)
        if k == "atomic" and (imm not in (isa.ATOMIC_ADD, isa.ATOMIC_ADD | isa.ATOMIC_FETCH)):
            generic(pc, ())
            return
        fetch = k == "atomic" and bool(imm & isa.ATOMIC_FETCH)
        if bk is not None:
            a = (bk + off) & M64
            direct = self._stack_or_ctx(a, size, k != "ldx")
            addr = _lit(a)
        else:
            direct = None
            addr = None

        def guarded(body, write):
            """`a` = the access address, then `body` (lines) with a bad buffer a memory fault"""
            out.append(f"a = {addr or f'(r{base} + {off}) & {_lit(M64)}'}")
            out.append("try:")
            out.extend(" " + line for line in body)
            out.append("except SE:")
            out.append(f" MF({pc}, a, {size}, {write})")

        if k == "ldx":
            if direct:
                out.append(f"r{d} = {U}({direct})[0]")
            else:
                guarded([f"r{d} = {U}(bufs[a >> 32], a & 0xffffffff)[0]"], False)
            K.pop(d, None)
            return
        if k == "st":
            val = _lit(imm & mask)
        elif k == "stx":
            v = FRAME_POINTER if s == 10 else K.get(s)
            val = _lit(v & mask) if v is not None else (f"r{s}" if size == 8 else f"r{s} & {_lit(mask)}")
        else:
            val = None
        if k in ("st", "stx"):
            if direct:
                out.append(f"{P}({direct}, {val})")
            else:
                guarded([f"{P}(bufs[a >> 32], a & 0xffffffff, {val})"], True)
            return
        # atomic add (optionally fetch)
        guarded((["b_, o_ = stk, a & 0xffffffff"] if direct else ["b_ = bufs[a >> 32]", "o_ = a & 0xffffffff"])
                + [f"old = {U}(b_, o_)[0]", f"{P}(b_, o_, (old + r{s}) & {_lit(mask)})"], True)
        if fetch:
            out.append(f"r{s} = old")
            K.pop(s, None)

    def _stack_arg(self, K, r: int, size: int) -> Optional[int]:
        v = K.get(r) if r != 10 else FRAME_POINTER
        if v is None or v >> REGION_SHIFT != REGION_STACK or (v & M32) + size > abi.STACK_SIZE:
            return None
        return v & M32

    def _map_of(self, K) -> Optional[int]:
        v = K.get(1)
        if v is None or v & M32:
            return None
        idx = (v >> REGION_SHIFT) - REGION_MAPS
        if not 0 <= idx < len(self.vm.maps) or isinstance(self.vm.maps[idx], RingBufMap):
            return None
        return idx

    def _call(self, out, K, pc, imm, reg):
        vm = self.vm
        name = abi.HELPERS_BY_ID[imm].name
        idx = self._map_of(K)
        if idx is not None and name in ("map_lookup_elem", "map_update_elem"):
            m = vm.maps[idx]
            ko = self._stack_arg(K, 2, m.mdef.key_size)
            vo = self._stack_arg(K, 3, m.mdef.value_size) if name == "map_update_elem" else 0
            if ko is not None and vo is not None:
                key = f"bytes(stk[{ko}:{ko + m.mdef.key_size}])"
                if name == "map_lookup_elem":
                    ro = bool(getattr(m.mdef, "read_only", False))
                    if type(m).lookup is HashMap.lookup:    # the same dict get, one call less
                        self.prelude.add(f"D{idx} = M[{idx}]._d.get")
                        out.append(f"v_ = D{idx}({key})")
                    else:
                        self.prelude.add(f"LK{idx} = M[{idx}].lookup")
                        out.append(f"v_ = LK{idx}({key}, worker)")
                    if ro:
                        out.append("r0 = 0 if v_ is None else VA(v_, True)")
                    else:                                   # Vm._value_addr, inlined
                        out += ["if v_ is None:",
                                " r0 = 0",
                                "else:",
                                " rid_ = RO.get(id(v_))",
                                " if rid_ is None:",
                                "  rid_ = RO[id(v_)] = len(bufs)",
                                "  bufs.append(v_)",
                                f" r0 = rid_ << {REGION_SHIFT}"]
                else:
                    val = f"bytes(stk[{vo}:{vo + m.mdef.value_size}])"
                    self.prelude.add(f"UP{idx} = M[{idx}].update")
                    out.append(f"rc_ = UP{idx}({key}, {val}, {reg(4)}, worker)")
                    out.append(f"if rc_ == {-E2BIG}:")
                    out.append(f" vm._lost.append({'map_full:' + m.name!r})")
                    out.append(f"elif rc_ == {-EINVAL}:")
                    out.append(f" vm._lost.append({'helper_error:map_update_elem:' + m.name!r})")
                    out.append(f"r0 = rc_ & {_lit(M64)}")
                K.pop(0, None)
                return
        out.append("R[1:6] = (r1, r2, r3, r4, r5)")
        out.append(f"vm._pc = {pc}")
        out.append(f"r0 = H[{imm}]() & {_lit(M64)}")
        K.pop(0, None)

    # -- whole program ---------------------------------------------------------------
    def source(self) -> str:
        ins_state: Dict[int, Optional[Dict[int, int]]] = {l: None for l in self.leaders}
        ins_state[0] = dict(_ENTRY)
        work = [0]
        while work:                                 # forward constant propagation
            l = work.pop()
            self.pos = {}
            _, edges, _ = self.block(l, ins_state[l])
            for tgt, k in edges:
                cur = ins_state[tgt]
                new = dict(k) if cur is None else {r: v for r, v in cur.items() if k.get(r) == v}
                if cur is None or new != cur:
                    ins_state[tgt] = new
                    work.append(tgt)
        self.pos = {}
        bodies = {}
        live = [l for l in self.leaders if ins_state[l] is not None]     # reachable
        chunks = _chunks(live)
        falls = {l: frozenset(c[i + 1:]) for c in chunks for i, l in enumerate(c)}
        for l in live:
            known = ins_state[l]
            lines, _, cnt = self.block(l, known, falls[l])
            head = [f"if n > {self.vm.max_insns - cnt}:",
                    f" R[:10] = ({_REGS},)",
                    f" return 0, n, {l}"]
            bodies[l] = head + lines
        src = ["def make(vm, R, bufs, RO, C, H, M, VA, MF, SE, VMFault, U1, U2, U4, U8, P1, P2, P4, P8):",
               f" POS = {dict(sorted(self.pos.items()))!r}"] + [" " + x for x in sorted(self.prelude)] + [
               " def run(ctx, stk, worker):",
               "  r0 = r2 = r3 = r4 = r5 = r6 = r7 = r8 = r9 = 0",
               f"  r1 = {_lit(CTX_ADDR)}",
               "  n = 0",
               "  pc = 0",
               "  try:",
               "   while True:"]
        src += _tree(chunks, bodies, "    ")
        src += ["  except VMFault as e:",
                "   e.insns = n + POS.get(e.pc, 0) + 1",
                f"   R[:10] = ({_REGS},)",
                "   raise",
                " return run", ""]
        return "\n".join(src)


CHUNK = 6      # leaders tested in sequence at a leaf of the dispatch tree


def _chunks(leaders: List[int]) -> List[List[int]]:
    """Runs of consecutive leaders (at most CHUNK): inside one, a superblock falls
    through to a later one's `if pc == L` test instead of going back to the tree."""
    k = max(1, -(-len(leaders) // CHUNK))
    size = -(-len(leaders) // k)
    return [leaders[i:i + size] for i in range(0, len(leaders), size)]


def _tree(chunks: List[List[int]], bodies: Dict[int, List[str]], ind: str) -> List[str]:
    """Binary `if pc < X` tree over the chunks; sequential tests inside a chunk."""
    if len(chunks) == 1:
        c = chunks[0]
        if len(c) == 1:
            return [ind + line for line in bodies[c[0]]]
        out = []
        for l in c:
            out.append(f"{ind}if pc == {l}:")
            out += [ind + " " + line for line in bodies[l]]
        return out
    mid = len(chunks) // 2
    out = [f"{ind}if pc < {chunks[mid][0]}:"]
    out += _tree(chunks[:mid], bodies, ind + " ")
    out.append(f"{ind}else:")
    out += _tree(chunks[mid:], bodies, ind + " ")
    return out


def program_source(vm) -> str:
    """The generated source for a `vm.Vm` (for tests and reading)."""
    return _Gen(vm).source()


def compile_vm(vm) -> Callable:
    """The compiled run function of a `vm.Vm`: run(ctx, stack, worker) -> (r0, insns, pc)."""
    vm.r[10] = FRAME_POINTER          # never written by either tier
    src = program_source(vm)
    make = _cache.get(src)
    if make is None:
        ns: Dict[str, object] = {}
        exec(compile(src, f"<bpf {vm.name}>", "exec"), {}, ns)
        make = _cache[src] = ns["make"]
    return make(vm, vm.r, vm._bufs, vm._region_of, vm._code, vm._helpers, vm.maps, vm._value_addr, vm._mem_fault,
                _SE, VMFault, _UNPACK[1], _UNPACK[2], _UNPACK[4], _UNPACK[8],
                _PACK[1], _PACK[2], _PACK[4], _PACK[8])
