"""Checker: one method per assertion kind, plus the transfer function.

The walk visits instructions in topological order (the CFG has no cycles); the state at
an instruction is the join of the states its feasible incoming edges carry.  Edges a
branch can never take (decided from scalar bounds or a null check) carry no state, and
instructions reached by no feasible edge are not checked (they never run).
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Set, Tuple

from ...abi import definition as abi
from .. import isa
from ..isa import Insn, OPCODES
from . import assertions as A
from . import scalar as S
from . import types as T
from .messages import describe, error
from .structure import lddw_value
from .types import Reg, State

_MAX_MEM_ARG = 512
_MAP_HELPERS_WITH_KEYS = ("map_lookup_elem", "map_update_elem", "map_delete_elem")
_HIST_TYPES = ("hist_log2", "hist_linear")


class Checker:
    def __init__(self, insns: Sequence[Insn], maps: Sequence, hook: abi.Hook, ptype: str):
        self.insns, self.maps, self.hook, self.ptype = insns, maps, hook, ptype
        self.stack_depth = 0
        self.helpers_used: Set[int] = set()
        self.maps_used: Set[int] = set()
        self._dispatch = {cls: getattr(type(self), "check_" + cls.__name__) for cls in A.KINDS}

    # ------------------------------------------------------------------ walk

    def run(self, order: Sequence[int]) -> None:
        pending: Dict[int, State] = {0: State.entry()}
        for pc in order:
            st = pending.pop(pc, None)
            if st is None:
                continue                      # no feasible path reaches pc
            ins = self.insns[pc]
            info = OPCODES[ins.opcode]
            for a in A.explicate(ins, info):
                self._dispatch[type(a)](self, a, st, pc)
            for succ, out in self.transfer(pc, ins, info, st):
                prev = pending.get(succ)
                pending[succ] = out if prev is None else T.join_state(prev, out)

    # ------------------------------------------------------------------ helpers

    def _what(self, r: Reg) -> str:
        return describe(r, self.maps)

    def _map(self, r: Reg):
        return self.maps[r.map]

    def _operand(self, st: State, src: Optional[int], imm: int, is64: bool) -> Reg:
        if src is not None:
            return st.regs[src]
        return T.const(imm if is64 else imm & S.M32)

    def _note_stack(self, off: int) -> None:
        self.stack_depth = max(self.stack_depth, -off)

    # ------------------------------------------------------------------ checks

    def check_Init(self, a: A.Init, st: State, pc: int) -> None:
        if st.regs[a.reg].kind == T.UNINIT:
            raise error(pc, "uninit-reg", reg=a.reg)

    def check_MemAccess(self, a: A.MemAccess, st: State, pc: int) -> None:
        base = st.regs[a.base]
        k = base.kind
        access = {"read": "read", "write": "write", "atomic": "atomic add"}[a.mode]
        if k == T.MIXED:
            raise error(pc, "reg-type", reg=a.base, kinds=", ".join(base.kinds))
        if k == T.MAP_VALUE_OR_NULL:
            raise error(pc, "null-check", reg=a.base, what=self._what(base),
                        use="accessing memory through it")
        if k not in (T.CTX, T.STACK, T.MAP_VALUE):
            raise error(pc, "mem-not-pointer", access=access, reg=a.base,
                        what=self._what(base))
        if a.mode == "atomic" and k != T.MAP_VALUE:
            raise error(pc, "atomic-target", reg=a.base, what=self._what(base))
        if k == T.CTX:
            self._check_ctx(a, S.to_signed(base.off.const) + a.off, access, pc)
        elif k == T.STACK:
            self._check_stack(a, st, S.to_signed(base.off.const) + a.off, access, pc)
        else:
            self._check_map_value(a, base, pc)

    def _check_ctx(self, a: A.MemAccess, off: int, access: str, pc: int) -> None:
        if a.mode != "read":
            raise error(pc, "ctx-store", access=access, off=off)
        if off < 0 or off + a.size > abi.CONTEXT_SIZE:
            raise error(pc, "ctx-bounds", access=access, off=off, size=a.size, limit=abi.CONTEXT_SIZE)
        if off % a.size:
            raise error(pc, "ctx-align", access=access, off=off, size=a.size)
        f = next(f for f in abi.CONTEXT_FIELDS if f.offset <= off < f.offset + f.size)
        if off != f.offset or a.size > f.size:
            raise error(pc, "ctx-access", off=off, size=a.size, field=f.name, foff=f.offset,
                        fsize=f.size)
        if f.name.startswith("reserved"):
            raise error(pc, "ctx-field-invalid/reserved", off=off, field=f.name, size=a.size)
        if f.name not in self.hook.valid_fields:
            raise error(pc, "ctx-field-invalid", off=off, field=f.name, size=a.size,
                        hook=self.hook.name, valid=", ".join(self.hook.valid_fields))

    def _check_stack(self, a: A.MemAccess, st: State, off: int, access: str, pc: int) -> None:
        if off < -T.STACK_SIZE or off + a.size > 0:
            raise error(pc, "stack-bounds", access=access, off=off, size=a.size)
        if off % a.size:
            raise error(pc, "stack-align", access=access, off=off, size=a.size)
        self._note_stack(off)
        if a.mode != "read":
            return
        if not st.is_init(off, a.size):
            raise error(pc, "stack-uninit-read", access=access, off=off, size=a.size,
                        first=st.first_uninit(off, a.size))
        if a.size < 8:
            for s in st.slots(off, a.size):
                r = st.spills[s]
                if r.kind != T.SCALAR:
                    raise error(pc, "spill-partial-read", off=off, size=a.size,
                                what=self._what(r), slot=s)

    def _check_map_value(self, a: A.MemAccess, base: Reg, pc: int) -> None:
        m = self._map(base)
        lo = base.off.smin + a.off
        hi = base.off.smax + a.off
        c = base.off.const
        shown = f"{S.to_signed(c) + a.off:+d}" if c is not None else f"+[{lo}, {hi}]"
        if lo < 0 or hi + a.size > m.value_size:
            raise error(pc, "map-value-bounds", reg=a.base, off=shown, size=a.size,
                        vsize=m.value_size, map=m.name)
        t = S.t_add(base.off.tnum, S.t_const(a.off), 64)
        if (t.value | t.mask) & (a.size - 1):
            raise error(pc, "map-value-align", reg=a.base, off=shown, size=a.size, map=m.name)

    def check_StoredValue(self, a: A.StoredValue, st: State, pc: int) -> None:
        v = st.regs[a.src]
        base = st.regs[a.base]
        if v.kind == T.CTX:
            raise error(pc, "ctx-leak", reg=a.src, use="is stored to memory")
        if v.kind == T.SCALAR:
            return
        if base.kind != T.STACK or a.atomic:
            where = (f"into a value of map '{self._map(base).name}'" if base.kind == T.MAP_VALUE
                     else "outside the stack")
            raise error(pc, "pointer-leak/store", reg=a.src, what=self._what(v), where=where)
        if a.size != 8:
            info = OPCODES[self.insns[pc].opcode]
            raise error(pc, "pointer-leak/narrow", mnemonic=info.mnemonic, size=a.size,
                        reg=a.src, what=self._what(v))

    def check_Arith(self, a: A.Arith, st: State, pc: int) -> None:
        dst = st.regs[a.dst]
        src = self._operand(st, a.src, a.imm, a.is64)
        if a.op == "mov":
            if not a.is64 and src.kind != T.SCALAR:
                raise error(pc, "pointer-arith", op=a.mnemonic, reg=a.src, what=self._what(src))
            return
        for r, reg in ((dst, a.dst), (src, a.src)):
            if r.kind == T.MIXED:
                raise error(pc, "reg-type", reg=reg, kinds=", ".join(r.kinds))
        if not dst.is_pointer and not src.is_pointer:
            return
        ptr, preg = (dst, a.dst) if dst.is_pointer else (src, a.src)
        if (not a.is64 or a.op not in ("add", "sub") or (dst.is_pointer and src.is_pointer)
                or (a.op == "sub" and not dst.is_pointer) or ptr.kind == T.MAP_PTR):
            raise error(pc, "pointer-arith", op=a.mnemonic, reg=preg, what=self._what(ptr))
        num = (src if dst.is_pointer else dst).num
        if ptr.kind == T.MAP_VALUE_OR_NULL:
            raise error(pc, "pointer-arith/null", op=a.mnemonic, reg=preg, what=self._what(ptr))
        if ptr.kind == T.CTX and num.const is None:
            raise error(pc, "ctx-arith", op=a.mnemonic, what=num.describe(), reg=preg)
        if ptr.kind == T.STACK and num.const is None:
            raise error(pc, "stack-var-offset", op=a.mnemonic, what=num.describe(), reg=preg)

    def check_Compare(self, a: A.Compare, st: State, pc: int) -> None:
        dst = st.regs[a.dst]
        src = self._operand(st, a.src, a.imm, a.is64)
        for r, reg in ((dst, a.dst), (src, a.src)):
            if r.kind == T.MIXED:
                raise error(pc, "reg-type", reg=reg, kinds=", ".join(r.kinds))
        if not dst.is_pointer and not src.is_pointer:
            return
        if self._null_check(a, dst, src):
            return
        ptr, preg, other = (dst, a.dst, src) if dst.is_pointer else (src, a.src, dst)
        ow = f"r{a.src}" if a.src is not None and other is src else (
            f"r{a.dst}" if other is dst else str(a.imm))
        raise error(pc, "pointer-compare", op=a.mnemonic, reg=preg, what=self._what(ptr),
                    other=f"{ow} ({self._what(other)})")

    @staticmethod
    def _null_check(a: A.Compare, dst: Reg, src: Reg) -> bool:
        return (a.op in ("jeq", "jne") and a.is64
                and dst.kind in (T.MAP_VALUE_OR_NULL, T.MAP_VALUE)
                and src.kind == T.SCALAR and src.num.const == 0)

    def check_Call(self, a: A.Call, st: State, pc: int) -> None:
        h = abi.HELPERS_BY_ID.get(a.helper_id)
        if h is None:
            raise error(pc, "helper-unknown", id=a.helper_id)
        if self.ptype not in h.program_types:
            allowed = ", ".join(x.name for x in abi.PROGRAM_TYPES_BY_NAME[self.ptype].helpers)
            raise error(pc, "helper-not-allowed", helper=h.name, id=h.id, ptype=self.ptype,
                        allowed=allowed)

    def check_HelperArg(self, a: A.HelperArg, st: State, pc: int) -> None:
        h = abi.HELPERS_BY_ID[a.helper_id]
        r = st.regs[a.arg]
        kw = dict(arg=a.arg, helper=h.name, reg=a.arg, what=self._what(r))
        if r.kind == T.CTX:
            raise error(pc, "ctx-leak", reg=a.arg, use=f"is passed to {h.name}")
        if r.kind == T.MIXED:
            raise error(pc, "reg-type", reg=a.arg, kinds=", ".join(r.kinds))
        if a.kind == "map":
            if r.kind != T.MAP_PTR:
                raise error(pc, "helper-arg", expected="a map pointer (lddw map:NAME)", **kw)
            self._check_map_type(h, self._map(r), pc)
        elif a.kind in ("key", "value"):
            m = self._map(st.regs[1])
            size = m.key_size if a.kind == "key" else m.value_size
            if r.kind != T.STACK:
                raise error(pc, "helper-arg", expected=f"a stack pointer to the {a.kind} "
                            f"({size} bytes of map '{m.name}')", **kw)
            self._check_stack_mem(h, a.arg, st, r, size, pc)
        elif a.kind == "mem":
            size = self._size_arg(h, a.arg + 1, st, pc)
            if r.kind == T.STACK:
                self._check_stack_mem(h, a.arg, st, r, size, pc)
            elif r.kind == T.MAP_VALUE_OR_NULL:
                raise error(pc, "null-check", reg=a.arg, what=self._what(r),
                            use=f"passing it to {h.name}")
            elif r.kind == T.MAP_VALUE:
                m = self._map(r)
                if r.off.smin < 0 or r.off.smax + size > m.value_size:
                    raise error(pc, "helper-mem/bounds", arg=a.arg, helper=h.name, size=size,
                                where=f"{self._what(r)}",
                                bounds=f"value_size {m.value_size}")
            else:
                raise error(pc, "helper-arg", expected="a pointer to stack or map value memory",
                            **kw)
        elif a.kind == "size":
            self._size_arg(h, a.arg, st, pc)
        elif a.kind in ("scalar", "opt_scalar"):
            if r.kind != T.SCALAR and not (a.kind == "opt_scalar" and r.kind == T.UNINIT):
                raise error(pc, "pointer-leak/arg", reg=a.arg, what=self._what(r), arg=a.arg,
                            helper=h.name)
        else:  # pragma: no cover - the ABI table names only the kinds above
            raise AssertionError(f"unknown helper argument kind {a.kind!r}")

    def _check_map_type(self, h: abi.Helper, m, pc: int) -> None:
        expected = None
        if h.name in _MAP_HELPERS_WITH_KEYS and m.type == "ringbuf":
            expected = "a map with keys (not a ringbuf)"
        elif h.name == "hist_add" and m.type not in _HIST_TYPES:
            expected = "a hist_log2 or hist_linear map"
        elif h.name == "ringbuf_output" and m.type != "ringbuf":
            expected = "a ringbuf map"
        if expected:
            raise error(pc, "helper-map-type", helper=h.name, expected=expected, map=m.name,
                        mtype=m.type)

    def _size_arg(self, h: abi.Helper, arg: int, st: State, pc: int) -> int:
        r = st.regs[arg]
        c = r.num.const if r.kind == T.SCALAR else None
        if c is None or not 1 <= c <= _MAX_MEM_ARG:
            raise error(pc, "helper-size", arg=arg, helper=h.name, reg=arg, limit=_MAX_MEM_ARG,
                        what=self._what(r))
        return c

    def _check_stack_mem(self, h: abi.Helper, arg: int, st: State, r: Reg, size: int, pc: int) -> None:
        off = S.to_signed(r.off.const)
        if off < -T.STACK_SIZE or off + size > 0:
            raise error(pc, "helper-mem/bounds", arg=arg, helper=h.name, size=size,
                        where=f"fp{off:+d}", bounds="stack is [fp-512, fp)")
        if not st.is_init(off, size):
            raise error(pc, "helper-mem/uninit", arg=arg, helper=h.name, size=size, off=off,
                        first=st.first_uninit(off, size))
        for s in st.slots(off, size):
            if st.spills[s].kind != T.SCALAR:
                raise error(pc, "helper-mem/pointer", arg=arg, helper=h.name, size=size,
                            off=off, slot=s)
        self._note_stack(off)

    def check_Return(self, a: A.Return, st: State, pc: int) -> None:
        r0 = st.regs[0]
        if r0.kind != T.SCALAR:
            raise error(pc, "exit-r0", what=self._what(r0))

    # ------------------------------------------------------------------ transfer

    def transfer(self, pc: int, ins: Insn, info: isa.OpInfo, st: State) -> List[Tuple[int, State]]:
        k = info.kind
        if k == "alu":
            self._alu(pc, ins, info, st)
        elif k == "ldx":
            st.regs[ins.dst] = self._load(st, st.regs[ins.src], ins.off, info.size)
        elif k in ("st", "stx"):
            base = st.regs[ins.dst]
            if base.kind == T.STACK:
                off = S.to_signed(base.off.const) + ins.off
                val = st.regs[ins.src] if k == "stx" else T.const(ins.imm)
                self._store_stack(st, off, info.size, val)
        elif k == "atomic":
            if ins.imm & isa.ATOMIC_FETCH:
                st.regs[ins.src] = T.scalar(S.unknown() if info.size == 8 else S.urange(0, S.M32))
        elif k == "ld_imm64":
            self._lddw(pc, ins, st)
            return [(pc + 2, st)]
        elif k == "call":
            self._call(pc, ins, st)
        elif k == "exit":
            return []
        elif k == "jmp":
            return self._jump(pc, ins, info, st)
        return [(pc + 1, st)]

    def _alu(self, pc: int, ins: Insn, info: isa.OpInfo, st: State) -> None:
        op = isa.ALU_OPS[info.op]
        dst = st.regs[ins.dst]
        if op == "end":
            st.regs[ins.dst] = T.scalar(S.byteswap(dst.num, ins.imm, info.src == isa.END_TO_BE))
            return
        src = self._operand(st, ins.src if info.src == isa.BPF_X else None, ins.imm, info.is64)
        if op == "mov":
            if not info.is64:
                st.regs[ins.dst] = T.scalar(S.zext32(S.trunc32(src.num)))
            elif src.kind == T.SCALAR and info.src == isa.BPF_X:
                if src.id is None:                    # link the copies for branch narrowing
                    src = Reg(T.SCALAR, src.num, id=("copy", pc))
                    st.regs[ins.src] = src
                st.regs[ins.dst] = src
            else:
                st.regs[ins.dst] = src
            return
        if op == "neg":
            src = dst
        if dst.is_pointer or src.is_pointer:         # add/sub, checked by check_Arith
            ptr, num = (dst, src.num) if dst.is_pointer else (src, dst.num)
            off = S.alu(op, ptr.off, num, True)
            st.regs[ins.dst] = Reg(ptr.kind, off=off, map=ptr.map)
            return
        st.regs[ins.dst] = T.scalar(S.alu(op, dst.num, src.num, info.is64))

    def _load(self, st: State, base: Reg, insn_off: int, size: int) -> Reg:
        full = T.scalar(S.urange(0, (1 << (8 * size)) - 1))
        if base.kind != T.STACK:
            return full                              # ctx fields and map values: numbers
        off = S.to_signed(base.off.const) + insn_off
        slot = off - off % 8
        spilled = st.spills.get(slot)
        if spilled is None:
            return full
        if size == 8:
            return spilled
        c = spilled.num.const                        # a scalar (checked)
        if c is not None:
            return T.const((c >> (8 * (off - slot))) & ((1 << (8 * size)) - 1))
        return full

    def _store_stack(self, st: State, off: int, size: int, val: Reg) -> None:
        for s in st.slots(off, size):
            del st.spills[s]
        st.mark_init(off, size)
        if size == 8:
            st.spills[off] = val

    def _lddw(self, pc: int, ins: Insn, st: State) -> None:
        if ins.src == isa.PSEUDO_NONE:
            st.regs[ins.dst] = T.const(lddw_value(self.insns, pc))
            return
        idx = ins.imm & 0xFFFFFFFF
        self.maps_used.add(idx)
        if ins.src == isa.PSEUDO_MAP_FD:
            st.regs[ins.dst] = Reg(T.MAP_PTR, map=idx)
        else:
            voff = self.insns[pc + 1].imm & 0xFFFFFFFF
            st.regs[ins.dst] = Reg(T.MAP_VALUE, off=S.const(voff), map=idx)

    def _call(self, pc: int, ins: Insn, st: State) -> None:
        h = abi.HELPERS_BY_ID[ins.imm]
        self.helpers_used.add(h.id)
        map_idx = st.regs[1].map
        for r in range(1, 6):
            st.regs[r] = T.UNINIT_REG
        if h.ret == "map_value_or_null":
            st.regs[0] = Reg(T.MAP_VALUE_OR_NULL, off=S.const(0), map=map_idx, id=pc)
        elif h.ret == "scalar":
            st.regs[0] = T.UNKNOWN_SCALAR
        else:
            st.regs[0] = T.UNINIT_REG

    def _jump(self, pc: int, ins: Insn, info: isa.OpInfo, st: State) -> List[Tuple[int, State]]:
        target = pc + ins.off + 1
        if info.op == isa.BPF_JA:
            return [(target, st)]
        op = isa.JMP_OPS[info.op]
        src_reg = ins.src if info.src == isa.BPF_X else None
        dst = st.regs[ins.dst]
        src = self._operand(st, src_reg, ins.imm, info.is64)
        if dst.is_pointer:                           # a null check (checked by check_Compare)
            is_null, not_null = None, None
            if dst.kind == T.MAP_VALUE_OR_NULL:
                is_null = st.copy()
                self._set_null(is_null, ins.dst, dst, T.const(0))
                not_null = st
                self._set_null(not_null, ins.dst, dst, Reg(T.MAP_VALUE, off=dst.off, map=dst.map))
            else:
                not_null = st                        # a checked map value is never NULL
            taken, fall = (is_null, not_null) if op == "jeq" else (not_null, is_null)
        else:
            r_taken, r_fall = S.branch(op, dst.num, src.num, info.is64)
            taken = self._narrow(st.copy(), ins.dst, src_reg, r_taken)
            fall = self._narrow(st, ins.dst, src_reg, r_fall)
        out = []
        if fall is not None:
            out.append((pc + 1, fall))
        if taken is not None:
            out.append((target, taken))
        return out

    @staticmethod
    def _set_null(st: State, reg: int, r: Reg, new: Reg) -> None:
        if r.id is not None:
            st.refine_id(r.id, new)
        st.regs[reg] = new

    @staticmethod
    def _narrow(st: State, dst: int, src: Optional[int], r) -> Optional[State]:
        """Apply a branch's narrowed operands to the registers and to their linked copies."""
        if r is None:
            return None
        for reg, num in ((dst, r[0]), (src, r[1])):
            if reg is None:
                continue
            id_ = st.regs[reg].id
            if id_ is None:
                st.regs[reg] = T.scalar(num)
            elif not st.narrow_id(id_, num):
                return None
        return st
