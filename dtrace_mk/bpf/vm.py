"""Reference eBPF VM (CPU): the executable semantics of the ISA, uBPF style.

The semantics are tables: `ALU_EXPR` (one expression per ALU operation, 64- and 32-bit),
`JMP_COND` (one condition per jump operation), memory sizes from `isa.OPCODES`, and one
method per helper in `abi.HELPERS`.  A program is decoded once into a list of closures
(one per slot, generated from those tables); running it is a loop `pc = code[pc]()`.

Machine model
-------------
* r0..r10 hold unsigned 64-bit integers.  On entry r1 = ctx pointer, r10 = frame pointer
  (top of a zeroed 512-byte stack); other registers are 0.  EXIT returns r0.
* Pointers are integers in a fake address space: address = (region << 32) | offset.
  Region 0 is unmapped (NULL), 1 the context record (read-only), 2 the stack, 3.. one
  opaque handle per map of the object (not dereferenceable), then one region per map
  value the program got a pointer to during this run (by map_lookup_elem or
  `lddw rX, map_value:NAME+off`).  Every load, store, atomic and helper memory argument
  is bounds-checked against its region.
* ALU per RFC 9669: 32-bit ops work on the low halves and zero-extend the result;
  shift amounts are masked (63 / 31); div by 0 -> 0; mod by 0 -> dst unchanged (for
  mod32: the low half of dst, zero-extended); arsh is arithmetic; le16/32/64 truncate,
  be16/32/64 byte-swap the low 16/32/64 bits (the host is little endian).
* JMP with an immediate compares against the sign-extended imm; JMP32 compares low halves.
* Operand fields an opcode does not use are ignored here (the verifier rejects them).
* After a helper call r0 holds the result; r1..r5 keep whatever they held (the verifier
  makes them unreadable, so no verified program can tell).

Tiers: `Vm(..., tier="interp")` (default) runs these closures; tier="compiled" runs the
same slots translated to one Python function by `vmcompile.py` (identical results,
maps, losses and faults; the runtime's default, $DTRACE_MK_HOST_VM=interp to force this
interpreter).

`VMFault` is raised for anything a verified program can never do: an out-of-bounds or
NULL access, a write to the context, a dereference of a map handle, an invalid opcode
or operand, a jump out of the program or into the second slot of lddw, falling off the
end, an unknown helper, a helper not allowed for the program type, or exceeding the
instruction budget (default abi.MAX_INSNS executed instructions per run).  The
verifier's property test relies on it: accepted programs never fault.

trace_printk(fmt, fmt_size, a, b, c): the format must contain its NUL within fmt_size
(as Linux); conversions are those of `format_printk`; the line goes to the TraceLog
within its byte budget (-ENOSPC and throttled when over), and the helper returns the
line's length in bytes.

Losses: each run reports which results were lost (map full, ring full, helper error)
and which were throttled (evidence refused by a byte budget) in `RunResult`, so the
runtime's coverage accounting is exact.  A helper error is -EINVAL (misuse the verifier
should have rejected, a bad printk format).  -EEXIST/-ENOENT from update/delete
with NOEXIST/EXIST flags or absent keys are answers, not losses.
"""
from __future__ import annotations

import re
import struct
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

from ..abi import definition as abi
from . import isa
from .isa import Insn, OPCODES
from .maps import E2BIG, EINVAL, ENOSPC, Map, MapSet, RingBufMap, _Hist

M64 = 0xFFFFFFFFFFFFFFFF
M32 = 0xFFFFFFFF
S64 = 1 << 63
S32 = 1 << 31
REGION_SHIFT = 32
REGION_NULL, REGION_CTX, REGION_STACK, REGION_MAPS = 0, 1, 2, 3
CTX_ADDR = REGION_CTX << REGION_SHIFT
STACK_ADDR = REGION_STACK << REGION_SHIFT
FRAME_POINTER = STACK_ADDR + abi.STACK_SIZE
DEFAULT_TRACE_BUDGET = 4096     # trace_printk bytes per worker per epoch

_CTX_WORKER = abi.FIELDS_BY_NAME["worker"].offset
_CTX_STEP = abi.FIELDS_BY_NAME["decode_step"].offset
_CTX_TS = abi.FIELDS_BY_NAME["ts_ns"].offset
assert (_CTX_WORKER, _CTX_STEP) == (24, 56)
_CTX_WORKER_STEP = struct.Struct("<24xI28xI")     # worker and decode_step in one unpack
_INITIAL_REGS = [0, CTX_ADDR] + [0] * 8 + [FRAME_POINTER]


class VMFault(Exception):
    """A run that a verified program can never produce.  `pc` is the slot index, `insns`
    the number of instructions executed including the faulting one (set by run)."""

    def __init__(self, pc: int, message: str):
        super().__init__(f"pc {pc}: {message}")
        self.pc = pc
        self.message = message
        self.insns = 0


@dataclass(slots=True)
class RunResult:
    r0: int
    insns: int
    lost: List[str] = field(default_factory=list)        # reasons, e.g. "map_full:counts"
    throttled: List[str] = field(default_factory=list)   # reasons, e.g. "ring_budget:events"


@dataclass(frozen=True)
class TraceLine:
    worker: int
    epoch: int
    text: str


class TraceLog:
    """trace_printk output, budgeted like evidence: `budget_bytes` of text (UTF-8) per
    worker per epoch; a line over budget is refused (the caller counts it throttled)."""

    def __init__(self, budget_bytes: int = DEFAULT_TRACE_BUDGET):
        self.budget_bytes = budget_bytes
        self.lines: List[TraceLine] = []
        self._used: Dict[Tuple[int, int], int] = {}

    def emit(self, worker: int, epoch: int, text: str) -> bool:
        n = len(text.encode("utf-8"))
        used = self._used.get((worker, epoch), 0)
        if used + n > self.budget_bytes:
            return False
        self._used[(worker, epoch)] = used + n
        self.lines.append(TraceLine(worker, epoch, text))
        return True

    def texts(self) -> List[str]:
        return [t.text for t in self.lines]


# ---------------------------------------------------------------------------------
# Semantic tables.  {a} = dst operand, {b} = src operand (register or immediate), both
# already reduced to the operation width; {m} = width mask, {sh} = shift-amount mask,
# {sb} = sign bit.  Results are masked to the width (32-bit results zero-extend).
# ---------------------------------------------------------------------------------

ALU_EXPR: Dict[str, str] = {
    "add": "({a} + {b}) & {m}",
    "sub": "({a} - {b}) & {m}",
    "mul": "({a} * {b}) & {m}",
    "div": "({a} // {b} if {b} else 0)",
    "or": "({a} | {b})",
    "and": "({a} & {b})",
    "lsh": "({a} << ({b} & {sh})) & {m}",
    "rsh": "({a} >> ({b} & {sh}))",
    "neg": "(-{a}) & {m}",
    "mod": "({a} % {b} if {b} else {a})",
    "xor": "({a} ^ {b})",
    "mov": "{b}",
    "arsh": "((({a} ^ {sb}) - {sb}) >> ({b} & {sh})) & {m}",
}
# Signed comparisons flip the sign bit and compare unsigned (sx(a) < sx(b) iff
# a ^ SB < b ^ SB).
JMP_COND: Dict[str, str] = {
    "jeq": "{a} == {b}", "jne": "{a} != {b}", "jset": "{a} & {b}",
    "jgt": "{a} > {b}", "jge": "{a} >= {b}", "jlt": "{a} < {b}", "jle": "{a} <= {b}",
    "jsgt": "({a} ^ {sb}) > ({b} ^ {sb})", "jsge": "({a} ^ {sb}) >= ({b} ^ {sb})",
    "jslt": "({a} ^ {sb}) < ({b} ^ {sb})", "jsle": "({a} ^ {sb}) <= ({b} ^ {sb})",
}
assert set(ALU_EXPR) | {"end"} == set(isa.ALU_OPS.values())
assert set(JMP_COND) | {"ja", "call", "exit"} == set(isa.JMP_OPS.values())
_STRUCT = {1: struct.Struct("<B"), 2: struct.Struct("<H"), 4: struct.Struct("<I"), 8: struct.Struct("<Q")}

_factory_cache: Dict[str, Callable] = {}


def _factory(src: str) -> Callable:
    """Compile (once per distinct source) a closure factory `make`."""
    f = _factory_cache.get(src)
    if f is None:
        ns: Dict[str, object] = {}
        exec(src, {}, ns)
        f = _factory_cache[src] = ns["make"]
    return f


def _operands(is64: bool, use_reg: bool) -> Dict[str, str]:
    return {"a": "r[d]" if is64 else "(r[d] & 0xFFFFFFFF)",
            "b": ("r[s]" if is64 else "(r[s] & 0xFFFFFFFF)") if use_reg else "K",
            "m": hex(M64 if is64 else M32), "sh": "63" if is64 else "31",
            "sb": hex(S64 if is64 else S32)}


def _alu_factory(op: str, is64: bool, use_reg: bool) -> Callable:
    ops = _operands(is64, use_reg)
    pre = ""
    if op in ("div", "mod") and use_reg:       # evaluate the divisor once
        pre, ops["b"] = f"  b = {ops['b']}\n", "b"
    expr = ALU_EXPR[op].format(**ops)
    return _factory(f"def make(r, d, s, K, nxt):\n def f():\n{pre}  r[d] = {expr}\n"
                    f"  return nxt\n return f\n")


def _jmp_factory(op: str, is64: bool, use_reg: bool) -> Callable:
    cond = JMP_COND[op].format(**_operands(is64, use_reg))
    return _factory(f"def make(r, d, s, K, nxt, tgt):\n def f():\n  return tgt if {cond} else nxt\n"
                    f" return f\n")


# ---------------------------------------------------------------------------------
# trace_printk formats
# ---------------------------------------------------------------------------------

_FMT = re.compile(r"%([-0 +#]*)([0-9]*)(ll|l)?([diuxXpc%])")


def format_printk(fmt: str, args: Sequence[int]) -> Optional[str]:
    """Render a trace_printk format: %d %i %u %x %X %c %p %% with optional flags, width and
    l/ll (64-bit; without them the argument's low 32 bits).  None when the format is bad
    (unsupported conversion such as %s, or more than len(args) conversions)."""
    out, pos, ai = [], 0, 0
    for m in _FMT.finditer(fmt):
        lit = fmt[pos:m.start()]
        if "%" in lit:
            return None
        out.append(lit)
        pos = m.end()
        flags, width, length, conv = m.groups()
        if conv == "%":
            if flags or width or length:
                return None
            out.append("%")
            continue
        if ai >= len(args):
            return None
        v = args[ai] & M64
        ai += 1
        spec = flags.replace("-", "<") + width
        if conv == "p":
            out.append("0x" + format(v, spec + "x"))
            continue
        if conv == "c":
            out.append(format(chr(v & 0xFF), spec.replace("0", "")))
            continue
        if not length:
            v &= M32
        if conv in "di":
            bits = 64 if length else 32
            if v >> (bits - 1):
                v -= 1 << bits
        out.append(format(v, spec + ("d" if conv in "diu" else conv)))
    rest = fmt[pos:]
    if "%" in rest:
        return None
    out.append(rest)
    return "".join(out)


# ---------------------------------------------------------------------------------
# The VM
# ---------------------------------------------------------------------------------

class Vm:
    """One program bound to its maps.  Not reentrant: run() uses per-VM register and
    stack state.  `maps` is indexed like `BpfObject.maps` (a MapSet or a list of Maps).
    `prog_type` ("observe"/"control") restricts helpers like the verifier does; None
    allows all.  `trace` may be shared by several VMs (one budget)."""

    def __init__(self, program, maps: Union[MapSet, Sequence[Map], None] = None, *,
                 max_insns: int = abi.MAX_INSNS, trace: Optional[TraceLog] = None,
                 prog_type: Optional[str] = None, clock: Optional[Callable[[], int]] = None,
                 tier: str = "interp"):
        insns = getattr(program, "insns", program)
        if prog_type is None and hasattr(program, "prog_type"):
            prog_type = program.prog_type
        self.name = getattr(program, "name", "prog")
        self.insns: List[Insn] = list(insns)
        self.maps: List[Map] = list(maps) if maps is not None else []
        self.max_insns = max_insns
        self.trace = trace if trace is not None else TraceLog()
        self.clock = clock
        self.hints: List[Tuple[int, int, int]] = []      # (worker, epoch, hint)
        self.prog_type = prog_type
        self.r: List[int] = [0] * isa.NUM_REGS
        self._bufs: List[object] = [None, b"", bytearray(abi.STACK_SIZE)] + [None] * len(self.maps)
        self._nfixed = len(self._bufs)
        self._region_of: Dict[int, int] = {}
        self._worker = 0
        self._epoch = 0
        self._pc = 0
        self._ctx = b""
        self._lost: List[str] = []
        self._throttled: List[str] = []
        self._num_workers = min((m.num_workers for m in self.maps), default=None)
        self._helpers = {
            h.id: getattr(self, "_h_" + h.name) for h in abi.HELPERS
            if prog_type is None or prog_type in h.program_types}
        self._code = self._decode()
        # tier "compiled": the same slots as one generated Python function (vmcompile.py);
        # the interpreter above stays the semantics (and finishes runs near the budget)
        self.tier = tier
        self._fast = None
        if tier == "compiled":
            from .vmcompile import compile_vm
            self._fast = compile_vm(self)
        elif tier != "interp":
            raise ValueError(f"unknown VM tier {tier!r} (compiled or interp)")

    # -- running -------------------------------------------------------------------
    def run(self, ctx: bytes, *, worker: Optional[int] = None, epoch: Optional[int] = None) -> RunResult:
        """Run once over a context record.  worker/epoch default to the record's worker
        and decode_step fields.  Raises VMFault (with .insns set)."""
        if type(ctx) is not bytes:
            ctx = bytes(ctx)
        if len(ctx) != abi.CONTEXT_SIZE:
            raise ValueError(f"context record is {len(ctx)} bytes, expected {abi.CONTEXT_SIZE}")
        if worker is None or epoch is None:
            w, e = _CTX_WORKER_STEP.unpack_from(ctx)
            worker = w if worker is None else worker
            epoch = e if epoch is None else epoch
        nw = self._num_workers
        if nw is not None and not 0 <= worker < nw:
            raise ValueError(f"worker {worker} out of range: the maps have {nw} worker copies")
        self._worker, self._epoch, self._ctx = worker, epoch, ctx
        self._lost = lost = []
        self._throttled = throttled = []
        bufs = self._bufs
        if len(bufs) > self._nfixed:
            del bufs[self._nfixed:]
            self._region_of.clear()
        bufs[REGION_CTX] = ctx
        bufs[REGION_STACK] = stack = bytearray(abi.STACK_SIZE)
        r = self.r
        pc = n = 0
        fast = self._fast
        if fast is not None:
            r0, n, pc = fast(ctx, stack, worker)
            if pc < 0:
                return RunResult(r0, n, lost, throttled)
        else:
            r[:] = _INITIAL_REGS
        code = self._code
        try:
            for n in range(n + 1, self.max_insns + 1):
                pc = code[pc]()
                if pc < 0:
                    break
            else:
                n += 1
                raise VMFault(pc, f"instruction budget of {self.max_insns} exhausted")
        except VMFault as e:
            e.insns = n
            raise
        return RunResult(r[0], n, self._lost, self._throttled)

    # -- decoding ------------------------------------------------------------------
    def _fault_fn(self, pc: int, message: str) -> Callable[[], int]:
        def f():
            raise VMFault(pc, message)
        f.fault = message       # type: ignore[attr-defined]  (the compiled tier reads it)
        return f

    def _decode(self) -> List[Callable[[], int]]:
        insns = self.insns
        n = len(insns)
        code: List[Callable[[], int]] = []
        cont = {i + 1 for i, ins in enumerate(insns) if ins.opcode == isa.LDDW and i + 1 < n}
        for pc, ins in enumerate(insns):
            if pc in cont:
                code.append(self._fault_fn(pc, "jump into the second slot of lddw"))
            else:
                code.append(self._decode_one(pc, ins, n, cont))
        code.append(self._fault_fn(n, "fell off the end of the program (no exit)"))
        return code

    def _decode_one(self, pc: int, ins: Insn, n: int, cont) -> Callable[[], int]:
        info = OPCODES.get(ins.opcode)
        if info is None:
            return self._fault_fn(pc, f"invalid opcode 0x{ins.opcode:02x}")
        r = self.r
        d, s, off, imm = ins.dst, ins.src, ins.off, ins.imm
        nxt = pc + 1
        k = info.kind
        if d > 10 or s > 10:
            return self._fault_fn(pc, f"invalid register r{max(d, s)}")
        writes_dst = k in ("alu", "ldx", "ld_imm64")
        if writes_dst and d == isa.R10:
            return self._fault_fn(pc, "r10 (frame pointer) is read-only")
        if k == "alu":
            op = isa.ALU_OPS[info.op]
            if op == "end":
                return self._decode_end(pc, info, d, imm, nxt)
            use_reg = info.src == isa.BPF_X
            K = (imm & M64) if info.is64 else (imm & M32)
            return _alu_factory(op, info.is64, use_reg)(r, d, s, K, nxt)
        if k == "jmp":
            tgt = pc + 1 + off
            bad = None
            if not 0 <= tgt <= n - 1:
                bad = f"jump to {tgt} is outside the program (0..{n - 1})"
            elif tgt in cont:
                bad = f"jump to {tgt} lands in the second slot of lddw"
            op = isa.JMP_OPS[info.op]
            if op == "ja":
                if bad:
                    return self._fault_fn(pc, bad)
                return lambda: tgt
            K = (imm & M64) if info.is64 else (imm & M32)
            f = _jmp_factory(op, info.is64, info.src == isa.BPF_X)
            if bad:
                taken = f(r, d, s, K, False, True)

                def g():
                    if taken():
                        raise VMFault(pc, bad)
                    return nxt
                return g
            return f(r, d, s, K, nxt, tgt)
        if k == "exit":
            return lambda: -1
        if k == "call":
            h = self._helpers.get(imm)
            if h is None:
                if imm in abi.HELPERS_BY_ID:
                    return self._fault_fn(pc, f"helper {abi.HELPERS_BY_ID[imm].name} is not allowed "
                                              f"in {self.prog_type} programs")
                return self._fault_fn(pc, f"unknown helper {imm}")

            def call():
                self._pc = pc
                r[0] = h() & M64
                return nxt
            return call
        if k == "ld_imm64":
            return self._decode_lddw(pc, ins, n)
        size = info.size
        st = _STRUCT[size]
        mask = (1 << (8 * size)) - 1
        unpack_from, pack_into = st.unpack_from, st.pack_into
        bufs = self._bufs
        memfault = self._mem_fault
        if k == "ldx":
            def ldx():
                a = (r[s] + off) & M64
                try:
                    r[d] = unpack_from(bufs[a >> 32], a & M32)[0]
                except (IndexError, TypeError, struct.error):
                    memfault(pc, a, size, False)
                return nxt
            return ldx
        if k == "st":
            v = imm & mask

            def st_():
                a = (r[d] + off) & M64
                try:
                    pack_into(bufs[a >> 32], a & M32, v)
                except (IndexError, TypeError, struct.error):
                    memfault(pc, a, size, True)
                return nxt
            return st_
        if k == "stx":
            def stx():
                a = (r[d] + off) & M64
                try:
                    pack_into(bufs[a >> 32], a & M32, r[s] & mask)
                except (IndexError, TypeError, struct.error):
                    memfault(pc, a, size, True)
                return nxt
            return stx
        if k == "atomic":
            if imm not in (isa.ATOMIC_ADD, isa.ATOMIC_ADD | isa.ATOMIC_FETCH):
                return self._fault_fn(pc, f"unsupported atomic operation imm=0x{imm & M32:x}")
            fetch = bool(imm & isa.ATOMIC_FETCH)
            if fetch and s == isa.R10:
                return self._fault_fn(pc, "r10 (frame pointer) is read-only")

            def atomic():
                a = (r[d] + off) & M64
                try:
                    b = bufs[a >> 32]
                    o = a & M32
                    old = unpack_from(b, o)[0]
                    pack_into(b, o, (old + r[s]) & mask)
                except (IndexError, TypeError, struct.error):
                    memfault(pc, a, size, True)
                if fetch:
                    r[s] = old
                return nxt
            return atomic
        return self._fault_fn(pc, f"unsupported instruction kind {k}")

    def _decode_end(self, pc, info, d, imm, nxt):
        r = self.r
        if imm not in (16, 32, 64):
            return self._fault_fn(pc, f"byte swap width must be 16, 32 or 64, got {imm}")
        mask = (1 << imm) - 1
        nbytes = imm // 8
        if info.src == isa.END_TO_LE:
            def le():
                r[d] &= mask
                return nxt
            return le

        def be():
            r[d] = int.from_bytes((r[d] & mask).to_bytes(nbytes, "little"), "big")
            return nxt
        return be

    def _decode_lddw(self, pc, ins, n):
        r, d = self.r, ins.dst
        if pc + 1 >= n:
            return self._fault_fn(pc, "lddw is missing its second slot")
        nxt = pc + 2
        hi = self.insns[pc + 1].imm & M32
        value = ins.imm64 if ins.imm64 is not None else (ins.imm & M32) | (hi << 32)
        if ins.src == isa.PSEUDO_NONE:
            def ld():
                r[d] = value
                return nxt
            return ld
        idx = ins.imm & M32
        if ins.src not in (isa.PSEUDO_MAP_FD, isa.PSEUDO_MAP_VALUE):
            return self._fault_fn(pc, f"invalid lddw pseudo source {ins.src}")
        if idx >= len(self.maps):
            return self._fault_fn(pc, f"map #{idx} does not exist (object has {len(self.maps)} maps)")
        if ins.src == isa.PSEUDO_MAP_FD:
            handle = (REGION_MAPS + idx) << REGION_SHIFT

            def ldmap():
                r[d] = handle
                return nxt
            return ldmap
        m = self.maps[idx]
        if m.kind != "array":
            return self._fault_fn(pc, f"map_value reference needs an array map, "
                                      f"'{m.name}' is {m.kind}")
        voff = (value >> 32) & M32
        key0 = bytes(4)
        ro = bool(getattr(m.mdef, "read_only", False))

        def ldvalue():
            r[d] = self._value_addr(m.lookup(key0, self._worker), ro) + voff
            return nxt
        return ldvalue

    # -- memory --------------------------------------------------------------------
    def _value_addr(self, buf: bytearray, read_only: bool = False) -> int:
        """Address of a map value (a region registered for the rest of this run).  Values
        of read-only maps (the loader's .rodata) are registered as immutable bytes."""
        rid = self._region_of.get(id(buf))
        if rid is None:
            rid = len(self._bufs)
            self._bufs.append(bytes(buf) if read_only else buf)
            self._region_of[id(buf)] = rid
        return rid << REGION_SHIFT

    def _region_name(self, rid: int) -> str:
        if rid == REGION_CTX:
            return "ctx"
        if rid == REGION_STACK:
            return "stack"
        if REGION_MAPS <= rid < self._nfixed:
            return f"map handle '{self.maps[rid - REGION_MAPS].name}'"
        if self._nfixed <= rid < len(self._bufs):
            return "map value"
        return f"unmapped region {rid}"

    def _mem_fault(self, pc: int, a: int, size: int, write: bool):
        what = "store" if write else "load"
        rid, o = a >> REGION_SHIFT, a & M32
        if o >= 1 << 31 and REGION_CTX <= rid + 1 < len(self._bufs) and \
                self._bufs[rid + 1] is not None:
            rid, o = rid + 1, o - (1 << 32)     # just below the next region (e.g. fp-520)
        if rid == REGION_NULL:
            raise VMFault(pc, f"{what} of {size} bytes at address 0x{a:x} (NULL or not a pointer)")
        if rid == REGION_CTX and write:
            raise VMFault(pc, f"{what} of {size} bytes at ctx+{o}: the context is read-only")
        if REGION_MAPS <= rid < self._nfixed:
            raise VMFault(pc, f"{what} of {size} bytes through {self._region_name(rid)}: "
                              f"a map pointer cannot be dereferenced")
        if rid >= len(self._bufs):
            raise VMFault(pc, f"{what} of {size} bytes at address 0x{a:x} (not a pointer)")
        buf = self._bufs[rid]
        name = self._region_name(rid)
        if write and isinstance(buf, bytes) and o + size <= len(buf):
            raise VMFault(pc, f"{what} of {size} bytes at {name}+{o}: the map is read-only")
        if rid == REGION_STACK:
            rel = o - abi.STACK_SIZE
            raise VMFault(pc, f"{what} of {size} bytes at fp{rel:+d} is outside the "
                              f"{abi.STACK_SIZE}-byte stack")
        raise VMFault(pc, f"{what} of {size} bytes at {name}{o:+d} is out of bounds "
                          f"({name} is {len(buf)} bytes)")

    def _read(self, a: int, size: int, what: str) -> bytes:
        """Bytes of a helper memory argument (bounds-checked like a load)."""
        if size == 0:
            return b""
        rid, o = a >> REGION_SHIFT, a & M32
        buf = self._bufs[rid] if 0 < rid < len(self._bufs) else None
        if buf is None or o + size > len(buf):
            try:
                self._mem_fault(self._pc, a, size, False)
            except VMFault as e:
                raise VMFault(self._pc, f"{what}: {e.message}") from None
        return bytes(buf[o:o + size])

    def _map_arg(self, a: int, helper: str) -> Map:
        rid = a >> REGION_SHIFT
        if (a & M32) or not REGION_MAPS <= rid < self._nfixed:
            raise VMFault(self._pc, f"{helper}: r1 is not a map pointer")
        return self.maps[rid - REGION_MAPS]

    # -- helpers (one method per abi.HELPERS entry, named _h_<name>) ------------------
    def _h_map_lookup_elem(self) -> int:
        r = self.r
        m = self._map_arg(r[1], "map_lookup_elem")
        if isinstance(m, RingBufMap):
            self._lost.append(f"helper_error:map_lookup_elem:{m.name}")
            return 0
        key = self._read(r[2], m.mdef.key_size, "map_lookup_elem key")
        v = m.lookup(key, self._worker)
        return 0 if v is None else self._value_addr(v, bool(getattr(m.mdef, "read_only", False)))

    def _h_map_update_elem(self) -> int:
        r = self.r
        m = self._map_arg(r[1], "map_update_elem")
        if isinstance(m, RingBufMap):
            self._lost.append(f"helper_error:map_update_elem:{m.name}")
            return -EINVAL
        key = self._read(r[2], m.mdef.key_size, "map_update_elem key")
        val = self._read(r[3], m.mdef.value_size, "map_update_elem value")
        rc = m.update(key, val, r[4], self._worker)
        if rc == -E2BIG:
            self._lost.append(f"map_full:{m.name}")
        elif rc == -EINVAL:
            self._lost.append(f"helper_error:map_update_elem:{m.name}")
        return rc

    def _h_map_delete_elem(self) -> int:
        r = self.r
        m = self._map_arg(r[1], "map_delete_elem")
        if isinstance(m, RingBufMap):
            self._lost.append(f"helper_error:map_delete_elem:{m.name}")
            return -EINVAL
        key = self._read(r[2], m.mdef.key_size, "map_delete_elem key")
        rc = m.delete(key, self._worker)
        if rc == -EINVAL:
            self._lost.append(f"helper_error:map_delete_elem:{m.name}")
        return rc

    def _h_ktime_get_ns(self) -> int:
        if self.clock is not None:
            return self.clock()
        return struct.unpack_from("<Q", self._ctx, _CTX_TS)[0]

    def _h_trace_printk(self) -> int:
        r = self.r
        size = r[2]
        if size > abi.STACK_SIZE:
            self._lost.append("helper_error:trace_printk")
            return -EINVAL
        raw = self._read(r[1], size, "trace_printk format")
        nul = raw.find(b"\0")          # as Linux: the format must end within fmt_size
        text = None
        if nul >= 0:
            try:
                text = format_printk(raw[:nul].decode("utf-8"), (r[3], r[4], r[5]))
            except UnicodeDecodeError:
                pass
        if text is None:
            self._lost.append("helper_error:trace_printk")
            return -EINVAL
        if not self.trace.emit(self._worker, self._epoch, text):
            self._throttled.append("trace_budget")
            return -ENOSPC
        return len(text.encode("utf-8"))

    def _h_get_worker_id(self) -> int:
        return self._worker

    def _h_ringbuf_output(self) -> int:
        r = self.r
        m = self._map_arg(r[1], "ringbuf_output")
        if not isinstance(m, RingBufMap) or r[4] & ~3:
            self._lost.append(f"helper_error:ringbuf_output:{m.name}")
            return -EINVAL
        if r[3] > abi.STACK_SIZE + abi.MAX_VALUE_SIZE:
            self._lost.append(f"helper_error:ringbuf_output:{m.name}")
            return -EINVAL
        data = self._read(r[2], r[3], "ringbuf_output data")
        before = m.stats.throttled
        rc = m.output(data, self._worker, self._epoch)
        if rc:
            if m.stats.throttled != before:
                self._throttled.append(f"ring_budget:{m.name}")
            else:
                self._lost.append(f"ring_full:{m.name}")
        return rc

    def _h_hist_add(self) -> int:
        r = self.r
        m = self._map_arg(r[1], "hist_add")
        if not isinstance(m, _Hist):
            self._lost.append(f"helper_error:hist_add:{m.name}")
            return -EINVAL
        key = self._read(r[2], m.mdef.key_size, "hist_add key")
        rc = m.hist_add(key, r[3], self._worker)
        if rc == -E2BIG:
            self._lost.append(f"map_full:{m.name}")
        return rc

    def _h_set_priority_hint(self) -> int:
        self.hints.append((self._worker, self._epoch, self.r[1] & M32))
        return 0


_missing = [h.name for h in abi.HELPERS if not hasattr(Vm, "_h_" + h.name)]
assert not _missing, f"helpers without a VM implementation: {_missing}"


def run(program, ctx: bytes, maps: Union[MapSet, Sequence[Map], None] = None, **kw) -> RunResult:
    """One-shot convenience: decode, run once."""
    run_kw = {k: kw.pop(k) for k in ("worker", "epoch") if k in kw}
    return Vm(program, maps, **kw).run(ctx, **run_kw)


def interpret_count(program, ctx: bytes, maps: Union[MapSet, Sequence[Map], None] = None, **kw) -> int:
    """Number of instructions one run executes (including exit).  Raises VMFault."""
    return run(program, ctx, maps, **kw).insns
