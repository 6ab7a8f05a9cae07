"""Compiled tier, pass 1: verified eBPF -> CUDA C (the translator and the monitor module).

The translator works on the device VM's own pre-decoded records (`encode_program`:
jump targets as record indices, K operands pre-extended, lddw with its value or the
map's device address), so both tiers start from the same bytes, and each record
becomes the C statement that does what kernels/bpf_vm.cuh does for that op:

* one `static __device__ __forceinline__ int dtmk_cm_prog_<i>(ctx, worker, epoch, flags,
  &r0)` per program; r0..r10 are local u64 variables (r1 = ctx, r10 = top of a
  per-lane local stack array of the verifier's stack depth, zeroed like the VM does);
* every jump target a label, jumps `goto` (verified programs are DAGs; an unverified
  program with a loop is translated with instruction counting, which ends it as the VM's
  budget does);
* ALU/JMP exactly as the VM (RFC 9669: 32-bit ops on the low halves, zero-extended;
  div by 0 -> 0, mod by 0 -> dst (mod32: its low half); shifts masked; signed compares
  and arsh through casts; le/be truncate / byte-swap);
* memory as typed loads/stores through the same generic pointers (ctx record, local
  stack, map values); xadd non-atomic on the local stack, atomicAdd elsewhere;
* helpers run the VM's map operations (kernels/bpf_map_ops.cuh) with the same arguments,
  folded to each map's shape: `monitor_source` emits a shape of constants per map (the
  descriptor the host wrote at attach, `MapShape`), and a call whose r1 the translator
  knows names that one shape; a ringbuf (and an r1 it cannot name) calls the generic
  helper the kernel defines, and so does the inline form (the workers' hook code, where
  folded fallbacks only grew the sites); lost / throttled flags and the outcome
  (EXECUTED/THROTTLED/LOST, FAULT for an unknown helper, an invalid op or falling off
  the end) as dtmk_vm_exec;
* the per-event instruction bound: when the longest path (lddw = 1) fits in the
  budget (always, for a verified program under the default budget) nothing is counted;
  otherwise every instruction counts and jumps, calls and exit check it as the VM does.

`monitor_source(progs)` wraps the functions into a module that defines the per-hook
entry points of kernels/bpf_compiled.cuh (`dtmk_cm_hook_<id>`, a switch on cm_id).
The module declares, not defines, the map helpers: the kernel module defines them (the
monitor includes bpf_map_ops.cuh, inline templates only).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Dict, List, Optional, Sequence

import numpy as np

from ...abi import definition as abi
from ...bpf.devicegen import NAME_OF_OP
from ...errors import UserError

if TYPE_CHECKING:                      # runtime/inline.py imports the verifier: loaded at attach
    from ..inline import InlineMap

M64, M32 = (1 << 64) - 1, (1 << 32) - 1
HOOK_IDS = tuple(range(1, abi.MAX_HOOK_ID + 1))


class TranslateError(UserError):
    """A program the compiled tier cannot translate (names the program and record)."""



_CMP = {0x1: "{a} == {b}", 0x2: "{a} > {b}", 0x3: "{a} >= {b}", 0x4: "({a} & {b}) != 0", 0x5: "{a} != {b}",
        0x6: "{sa} > {sb}", 0x7: "{sa} >= {sb}", 0xA: "{a} < {b}", 0xB: "{a} <= {b}", 0xC: "{sa} < {sb}",
        0xD: "{sa} <= {sb}"}
_GROUPS = ("misc", "alu64_k", "alu64_x", "alu32_k", "alu32_x", "jmp64_k", "jmp64_x", "jmp32_k",
           "jmp32_x", "mem", "call")
_MEM_T = {0: "dtmk_u8", 1: "dtmk_u16", 2: "dtmk_u32", 3: "dtmk_u64"}


def _hex(v: int) -> str:
    return f"0x{v & M64:x}ull"


def _group(op: int) -> str:
    return _GROUPS[op >> 4] if op >> 4 < len(_GROUPS) else "invalid"


def _successors(recs: np.ndarray, i: int) -> List[int]:
    op = int(recs[i]["op"])
    name = NAME_OF_OP.get(op, "invalid")
    if name in ("exit", "invalid", "call"):
        return []
    if name == "ja":
        return [int(recs[i]["off"])]
    if _group(op).startswith("jmp"):
        return [i + 1, int(recs[i]["off"])]
    return [i + 1]


def longest_path(recs: np.ndarray, name: str = "prog") -> int:
    """Most records one run can execute (lddw = 1) over the control-flow graph, which
    must be a DAG (backward jumps are fine, loops are not: TranslateError names the
    record that closes one).  Falling off the end counts as one step (a fault)."""
    n = len(recs)
    succ = [[t for t in _successors(recs, i) if 0 <= t <= n] for i in range(n)]
    best = [0] * (n + 1)
    state = [0] * (n + 1)            # 0 new, 1 on the DFS stack, 2 done
    state[n] = 2
    for root in range(n):
        if state[root]:
            continue
        stack = [(root, 0)]
        state[root] = 1
        while stack:
            i, k = stack[-1]
            if k < len(succ[i]):
                stack[-1] = (i, k + 1)
                t = succ[i][k]
                if state[t] == 1:
                    raise TranslateError(f"{name}: record {i}: jump to {t} closes a loop: the compiled "
                                         f"tier needs a loop-free (verified) program")
                if state[t] == 0:
                    state[t] = 1
                    stack.append((t, 0))
                continue
            best[i] = 1 + max((best[t] for t in succ[i]), default=0)
            state[i] = 2
            stack.pop()
    return best[0] if n else 0


def _alu(grp: str, sub: int, dst: str, src: str, imm: int) -> str:
    """One ALU record as the VM computes it (its ALU group body)."""
    is64, isx = grp.startswith("alu64"), grp.endswith("_x")
    if is64:
        a, b, sh, zero, k = dst, (src if isx else _hex(imm)), 63, "0ull", imm & M64
    else:
        a, b, sh, zero, k = f"(dtmk_u32){dst}", (f"(dtmk_u32){src}" if isx else f"0x{imm & M32:x}u"), 31, "0u", imm & M32
    amt = f"({b} & {sh})" if isx else str(k & sh)
    if sub == 0x0: v = f"{a} + {b}"
    elif sub == 0x1: v = f"{a} - {b}"
    elif sub == 0x2: v = f"{a} * {b}"
    elif sub == 0x3: v = f"({b} == {zero} ? {zero} : {a} / {b})" if isx else (zero if k == 0 else f"{a} / {b}")
    elif sub == 0x4: v = f"{a} | {b}"
    elif sub == 0x5: v = f"{a} & {b}"
    elif sub == 0x6: v = f"{a} << {amt}"
    elif sub == 0x7: v = f"{a} >> {amt}"
    elif sub == 0x9: v = f"({b} == {zero} ? {a} : {a} % {b})" if isx else (a if k == 0 else f"{a} % {b}")
    elif sub == 0xA: v = f"{a} ^ {b}"
    elif sub == 0xB: v = b
    elif sub == 0xC: v = f"(dtmk_u64)((dtmk_s64){a} >> {amt})" if is64 else f"(dtmk_u32)((int){a} >> {amt})"
    else: v = a                                   # never encoded (the VM keeps dst)
    return f"{dst} = {v};" if is64 else f"{dst} = (dtmk_u32)({v});"


def _jmp(grp: str, sub: int, dst: str, src: str, imm: int, tgt: int, check: str) -> str:
    is64, isx = grp.startswith("jmp64"), grp.endswith("_x")
    if is64:
        a, b = dst, (src if isx else _hex(imm))
        sa, sb = f"(dtmk_s64){a}", f"(dtmk_s64){b}"
    else:
        a, b = f"(dtmk_u32){dst}", (f"(dtmk_u32){src}" if isx else f"0x{imm & M32:x}u")
        sa, sb = f"(int){a}", f"(int){b}"
    cond = _CMP.get(sub)
    if cond is None:                              # never encoded (the VM: not taken)
        return check or ";"
    return f"{check}if ({cond.format(a=a, b=b, sa=sa, sb=sb)}) goto L{tgt};"


def _mem(sub: int, dst: str, src: str, aux: int, off: int, imm: int, shadow: bool = False) -> Optional[str]:
    o = f"(dtmk_s64)({off})"
    own = "__isLocal(a_) || __isShared(a_)" if shadow else "__isLocal(a_)"   # one thread: no atomic (shadow: S)
    if sub <= 3:
        return f"{dst} = *(const {_MEM_T[sub]} *)({src} + {o});"
    if sub <= 7:
        t = _MEM_T[sub - 4]
        return f"*({t} *)({dst} + {o}) = ({t}){_hex(imm)};"
    if sub <= 11:
        t = _MEM_T[sub - 8]
        return f"*({t} *)({dst} + {o}) = ({t}){src};"
    if sub in (12, 13):
        t, at = ("dtmk_u32", "unsigned") if sub == 12 else ("dtmk_u64", "unsigned long long")
        fetch = f" {src} = o_;" if aux else ""
        return (f"{{ {t} *a_ = ({t} *)({dst} + {o}); const {t} v_ = ({t}){src}; {t} o_; "
                f"if ({own}) {{ o_ = *a_; *a_ = o_ + v_; }} else o_ = atomicAdd(({at} *)a_, v_);{fetch} }}")
    if sub in (14, 15):                  # stxdw_max / _min: a triple's store (devicegen DEVICE_ONLY)
        cmp, fn = ("<", "atomicMax") if sub == 14 else (">", "atomicMin")
        return (f"{{ dtmk_u64 *a_ = (dtmk_u64 *)({dst} + {o}); const dtmk_u64 v_ = {src}; "
                f"if ({own}) {{ if (*a_ {cmp} v_) *a_ = v_; }} else {fn}((unsigned long long *)a_, v_); }}")
    return None


def _inline_call(nm: str, shadow: Dict[int, "InlineMap"], plain: str) -> str:
    """The inline form's helper call: maps of the shadow (kernels/bpf_inline.cuh) by
    descriptor address (r1 is the lddw constant just before, so the test folds away),
    every other map -- and a full shadow probe window -- through the ordinary helper."""
    arms = []
    for addr, im in sorted(shadow.items()):
        a = _hex(addr)
        key = f"dtmk_sh_key(r2, {im.key_size}u)"
        if nm == "call_map_lookup_elem" and im.kind == "hash":
            arms.append(f"if (r1 == {a}) {{ struct dtmk_sh_ent *e_ = dtmk_sh_get(S, {a}, {key}, 0u, {im.ops}u, epoch, "
                        f"slot); if (e_) r0 = (dtmk_u64)e_->val; else {{ {plain} }} }}")
        elif nm == "call_hist_add" and im.kind != "hash":
            lo, hi, step, nb = im.lin
            b = ("dtmk_bucket_log2(r3)" if im.kind == "hist_log2" else
                 f"dtmk_bucket_linear({lo}ll, {hi}ll, {step}ll, {nb}u, r3)")
            arms.append(f"if (r1 == {a}) {{ struct dtmk_sh_ent *e_ = dtmk_sh_get(S, {a}, {key}, {b}, 1u, epoch, "
                        f"slot); if (e_) {{ e_->val[0] += 1; r0 = 0; }} else {{ {plain} }} }}")
    return " else ".join(arms + [f"{{ {plain} }}"]) if arms else plain


def _call(nm: str, shadow: Optional[Dict[int, "InlineMap"]] = None, shapes: Optional[Dict[int, str]] = None) -> str:
    plain = _shaped_call(nm, shapes) if shapes else _plain_call(nm)
    return _inline_call(nm, shadow, plain) if shadow else plain


#: the map helpers a shape of constants can run: helper -> (bpf_map_ops.cuh operation, its arguments after the shape)
_SHAPED_OPS = {
    "call_map_lookup_elem": ("dtmk_map_lookup_t", "(const void *)r2, worker, &lost"),
    "call_map_update_elem": ("dtmk_map_update_t", "(const void *)r2, (const void *)r3, r4, worker, &lost"),
    "call_map_delete_elem": ("dtmk_map_delete_t", "(const void *)r2, &lost"),
    "call_hist_add": ("dtmk_hist_add_t", "(const void *)r2, r3, &lost"),
}


def _shaped_call(nm: str, shapes: Dict[int, str]) -> str:
    """A map helper call through the shape of the map r1 names (kernels/bpf_map_ops.cuh
    DTMK_CONST_SHAPE): r1 is the lddw constant just before, so the test folds to one arm;
    a map without a shape (a ringbuf) -- or an r1 no arm names -- takes the generic helper."""
    plain = _plain_call(nm)
    if nm not in _SHAPED_OPS:
        return plain
    op, args = _SHAPED_OPS[nm]
    arms = [f"if (r1 == {_hex(addr)}) r0 = {op}({name}(), {args});" for addr, name in sorted(shapes.items())]
    return " else ".join(arms + [f"{{ {plain} }}"])


def _shapes_at(shapes: Optional[Dict[int, str]], r1_map: Optional[int]) -> Optional[Dict[int, str]]:
    """The arms a call needs: only r1's map when the translator knows it (a map without a
    shape: none, the generic helper), else every shape (the C compiler may still fold)."""
    if not shapes or r1_map is None:
        return shapes
    return {r1_map: shapes[r1_map]} if r1_map in shapes else None


def _writes(grp: str, sub: int, aux: int, d: int, s: int, reg: int) -> bool:
    """May this record write register `reg`?  Jumps and stores write none; an atomic add
    with fetch writes its source; everything else its destination."""
    if grp.startswith("jmp"):
        return False
    if grp == "mem" and 4 <= sub <= 15:
        return sub in (12, 13) and bool(aux) and s == reg
    return d == reg


def _plain_call(nm: str) -> str:
    m = "(const struct dtmk_map *)r1"
    return {
        "call_map_lookup_elem": f"r0 = dtmk_map_lookup({m}, (const void *)r2, worker, &lost);",
        "call_map_update_elem": f"r0 = dtmk_map_update({m}, (const void *)r2, (const void *)r3, r4, worker, &lost);",
        "call_map_delete_elem": f"r0 = dtmk_map_delete({m}, (const void *)r2, &lost);",
        "call_ktime_get_ns": "r0 = (flags & 1u) ? ctx->ts_ns : dtmk_cm_globaltimer();",
        "call_get_worker_id": "r0 = worker;",
        "call_ringbuf_output": f"r0 = dtmk_ringbuf_output({m}, (const void *)r2, r3, r4, worker, epoch, &lost, &thr);",
        "call_hist_add": f"r0 = dtmk_hist_add({m}, (const void *)r2, r3, &lost);",
        "call_set_priority_hint": "r0 = 0;",
    }.get(nm, "r0 = (dtmk_u64)-22; lost = true;")   # trace_printk: not on the device yet (-EINVAL, lost)


def translate(recs: np.ndarray, fn: str, *, max_insns: int = abi.MAX_INSNS,
              stack_depth: int = abi.STACK_SIZE, name: str = "prog",
              shadow: Optional[Dict[int, "InlineMap"]] = None, shapes: Optional[Dict[int, str]] = None) -> str:
    """dtmk_dinsn records (device.encode_program) -> one C function `fn`.  `shadow`: the
    inline form (kernels/bpf_inline.cuh): the maps the shadow combines, by descriptor
    address (dtrace_mk.runtime.inline); `fn` then also takes the shadow and the slot.
    `shapes`: descriptor address -> the name of its shape of constants (monitor_source
    emits them): map helpers on those maps run folded (kernels/bpf_map_ops.cuh)."""
    n = len(recs)
    try:                                               # the budget can bind: count like the VM
        count = longest_path(recs, name) > max_insns
    except TranslateError:                             # a loop (unverified program): the budget ends it
        count = True
    depth = max(8, (stack_depth + 7) // 8 * 8)
    targets = set()
    for i in range(n):
        op = int(recs[i]["op"])
        if NAME_OF_OP.get(op) == "ja" or _group(op).startswith("jmp"):
            t = int(recs[i]["off"])
            if not 0 <= t < n:
                raise TranslateError(f"{name}: record {i}: jump to {t} outside the program")
            targets.add(t)
    out: List[str] = []
    w = out.append
    used_fault = False
    w(f"/* {name}: {n} records, stack {depth} bytes, "
      f"{'counted budget ' + str(max_insns) if count else 'no budget check needed'} */\n")
    extra = ", struct dtmk_shadow *S, dtmk_u32 slot" if shadow is not None else ""
    w(f"static __device__ __forceinline__ int {fn}(const struct dtmk_ctx *ctx, dtmk_u32 worker, dtmk_u32 epoch,\n"
      f"        dtmk_u32 flags, dtmk_u64 *r0_out{extra}) {{\n")
    if shadow is not None:
        # the inline form: the stack in the shadow's scratch (shared memory), not zeroed:
        # only verified programs run inline, and the verifier lets none read a stack byte
        # it has not written in this run (stack-uninit-read, helper-mem/uninit)
        w("    dtmk_u64 *stk = S->stk;\n")
    else:
        w("    dtmk_u64 stk[%d];\n" % (depth // 8))
        w("    for (int i = 0; i < %d; i++) stk[i] = 0;\n" % (depth // 8))
    w("    dtmk_u64 r0 = 0, r1 = (dtmk_u64)ctx, r2 = 0, r3 = 0, r4 = 0, r5 = 0, r6 = 0, r7 = 0, r8 = 0, r9 = 0;\n")
    w(f"    dtmk_u64 r10 = (dtmk_u64)(stk + {depth // 8});\n")
    w("    bool lost = false, thr = false;\n")
    w("    (void)worker; (void)epoch; (void)flags; (void)r10;%s\n" % (" (void)S; (void)slot;" if shadow is not None else ""))
    if count:
        w("    dtmk_u32 cnt = 0;\n")
    CNT = "cnt++; " if count else ""
    r1_map: Optional[int] = None                 # the map address r1 holds here, if known

    def chk() -> str:
        nonlocal used_fault
        if not count:
            return ""
        used_fault = True
        return f"if (cnt > {max_insns}u) goto L_fault; "

    for i in range(n):
        r = recs[i]
        op, d, s, aux, off, imm = (int(r["op"]), int(r["dst"]), int(r["src"]), int(r["aux"]), int(r["off"]),
                                   int(r["imm"]))
        sub = op & 15
        nm = NAME_OF_OP.get(op, "invalid")
        grp = _group(op)
        if i in targets:
            w(f"L{i}:\n")
            r1_map = None                        # (another path may bring another r1)
        if grp.startswith("alu"):
            line = _alu(grp, sub, f"r{d}", f"r{s}", imm)
        elif grp.startswith("jmp"):
            line = _jmp(grp, sub, f"r{d}", f"r{s}", imm, off, chk())
        elif grp == "mem":
            line = _mem(sub, f"r{d}", f"r{s}", aux, off, imm, shadow is not None)
            if line is None:
                used_fault = True
                line = "goto L_fault;"
        elif grp == "call":
            line = chk() + _call(nm, shadow, _shapes_at(shapes, r1_map))
        elif nm in ("lddw", "lddw_map", "lddw_map_value"):
            line = f"r{d} = {_hex(imm)};"
        elif nm == "neg":
            line = f"r{d} = 0ull - r{d};"
        elif nm == "neg32":
            line = f"r{d} = (dtmk_u32)(0u - (dtmk_u32)r{d});"
        elif nm == "le":
            line = f"r{d} &= 0xffffull;" if imm == 16 else f"r{d} &= 0xffffffffull;" if imm == 32 else ";"
        elif nm == "be":
            line = (f"r{d} = ((r{d} & 0xffull) << 8) | ((r{d} >> 8) & 0xffull);" if imm == 16 else
                    f"r{d} = DTMK_CM_BSWAP32((dtmk_u32)r{d});" if imm == 32 else
                    f"r{d} = DTMK_CM_BSWAP64(r{d});")
        elif nm == "ja":
            line = f"{chk()}goto L{off};"
        elif nm == "exit":
            line = f"{chk()}goto L_exit;"
        else:                                    # unknown helper id, invalid op: fault (as the VM)
            used_fault = True
            line = "goto L_fault;"
        w(f"    /* {i}: {nm} */ {CNT}{line}\n")
        # which map r1 names on the straight line after this record (the calls' usual
        # `lddw_map r1; ...; call`): a call clobbers r1..r5, anything else may write r1
        if nm == "lddw_map" and d == 1:
            r1_map = imm
        elif grp == "call" or _writes(grp, sub, aux, d, s, 1):
            r1_map = None
    used_fault = True
    w("    goto L_fault;   /* fell off the end (never in a verified program) */\n")
    w("L_exit:\n    *r0_out = r0;\n")
    w("    return lost ? DTMK_OUT_LOST : thr ? DTMK_OUT_THROTTLED : DTMK_OUT_EXECUTED;\n")
    if used_fault:
        w("L_fault:\n    return DTMK_OUT_FAULT;\n")
    w("}\n")
    return "".join(out)


PRELUDE = r"""/* GENERATED by dtrace_mk.runtime.compiled: a compiled-tier monitor.  Do not edit. */
#include "dtrace_mk_abi.h"
#ifndef DTMK_OUT_NONE
#define DTMK_OUT_NONE 0
#define DTMK_OUT_EXECUTED 1
#define DTMK_OUT_THROTTLED 2
#define DTMK_OUT_LOST 3
#define DTMK_OUT_FAULT 4
#define DTMK_OUT_SAMPLED 5
#endif
#include "bpf_inline.cuh"
#include "bpf_map_ops.cuh"   /* the map operations, over the shapes of constants emitted below */
/* defined by the kernel module (kernels/bpf_maps.cuh): the device VM's own helpers */
__device__ dtmk_u64 dtmk_map_lookup(const struct dtmk_map *m, const void *key, dtmk_u32 worker, bool *lost);
__device__ dtmk_u64 dtmk_map_update(const struct dtmk_map *m, const void *key, const void *value,
                                    dtmk_u64 flags, dtmk_u32 worker, bool *lost);
__device__ dtmk_u64 dtmk_map_delete(const struct dtmk_map *m, const void *key, bool *lost);
__device__ dtmk_u64 dtmk_hist_add(const struct dtmk_map *m, const void *key, dtmk_u64 v, bool *lost);
__device__ dtmk_u64 dtmk_ringbuf_output(const struct dtmk_map *m, const void *data, dtmk_u64 size,
                                        dtmk_u64 flags, dtmk_u32 worker, dtmk_u32 epoch,
                                        bool *lost, bool *throttled);
#ifdef __CUDA_ARCH__
static __device__ __forceinline__ dtmk_u64 dtmk_cm_globaltimer() {
    dtmk_u64 t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
#define DTMK_CM_BSWAP32(x) ((dtmk_u64)__byte_perm((x), 0, 0x0123))
#define DTMK_CM_BSWAP64(x) ((((dtmk_u64)__byte_perm((dtmk_u32)(x), 0, 0x0123)) << 32) | \
                            (dtmk_u64)__byte_perm((dtmk_u32)((x) >> 32), 0, 0x0123))
#else
static inline dtmk_u64 dtmk_cm_globaltimer() { return 0; }
#define DTMK_CM_BSWAP32(x) ((dtmk_u64)__builtin_bswap32(x))
#define DTMK_CM_BSWAP64(x) ((dtmk_u64)__builtin_bswap64(x))
#endif
"""


@dataclass
class MonitorProgram:
    """One program of a monitor: its hook, its cm_id (the table's flags >> 16) and code.
    shadow: also translate its inline form (the maps the shadow combines, by descriptor
    address; dtrace_mk.runtime.inline), None: ring path only."""
    hook_id: int
    cm_id: int
    name: str
    recs: np.ndarray
    max_insns: int = abi.MAX_INSNS
    stack_depth: int = abi.STACK_SIZE
    shadow: Optional[Dict[int, "InlineMap"]] = None
    #: descriptor address -> the map's shape as the host wrote it (its map helpers run
    #: folded to it); None or a missing map: the generic helpers
    maps: Optional[Dict[int, "MapShape"]] = None


@dataclass(frozen=True)
class MapShape:
    """A map's descriptor as the host wrote it at attach (device.MAP_DTYPE; written once,
    never changed while the map lives): the constants of its shape in a compiled monitor
    (kernels/bpf_map_ops.cuh DTMK_CONST_SHAPE)."""
    type: int
    key_size: int
    value_size: int
    max_entries: int
    capacity: int
    key_stride: int
    value_stride: int
    n_buckets: int
    lin_lo: int
    lin_hi: int
    lin_step: int
    values: int
    keys: int
    slots: int
    stats: int

    @classmethod
    def of(cls, desc) -> Optional["MapShape"]:
        """From a MAP_DTYPE row; None for a map whose helpers stay generic (a ringbuf:
        its output helper reads the descriptor as it is)."""
        if int(desc["type"]) == abi.MAP_TYPES_BY_NAME["ringbuf"].id:
            return None
        return cls(**{f: int(desc[f]) for f in cls.__dataclass_fields__})

    def macro(self, name: str, addr: int) -> str:
        """The shape as kernels/bpf_map_ops.cuh's DTMK_CONST_SHAPE, struct `name`, for the
        descriptor at `addr` (its generic insert)."""
        s64 = lambda v: f"(dtmk_s64){_hex(v & M64)}"   # noqa: E731 - (signed values as their bits)
        mt = abi.MAP_TYPES_BY_ID.get(self.type)
        kind = mt.name if mt else str(self.type)
        return (f"/* {kind}: key {self.key_size} B, value {self.value_size} B, {self.max_entries} entries */\n"
                f"DTMK_CONST_SHAPE({name}, {_hex(addr)}, {self.type}u, {self.key_size}u, {self.value_size}u, "
                f"{self.max_entries}u, {self.capacity}u, {self.key_stride}u, {self.value_stride}u, "
                f"{self.n_buckets}u, {s64(self.lin_lo)}, {s64(self.lin_hi)}, {s64(self.lin_step)}, "
                f"{_hex(self.values)}, {_hex(self.keys)}, {_hex(self.slots)}, {_hex(self.stats)})\n")


def monitor_source(progs: Sequence[MonitorProgram]) -> str:
    """The monitor module: a shape of constants per map the programs name, every
    program's function and dtmk_cm_hook_<id> for every hook (an empty list gives the
    empty monitor)."""
    parts = [PRELUDE]
    ids = [p.cm_id for p in progs]
    if len(set(ids)) != len(ids) or any(not 0 <= i < 1 << 16 for i in ids):
        raise ValueError(f"cm_ids must be distinct and < 65536: {ids}")
    shapes: Dict[int, MapShape] = {}
    for p in progs:
        for addr, sh in (p.maps or {}).items():
            if sh is not None and shapes.setdefault(addr, sh) != sh:
                raise ValueError(f"map {addr:#x}: two shapes given")
    names = {addr: f"dtmk_cm_map{i}" for i, addr in enumerate(sorted(shapes))}
    for addr in sorted(shapes):
        parts.append(shapes[addr].macro(names[addr], addr))
    for p in progs:
        mine = {a: names[a] for a in (p.maps or {}) if a in names}
        parts.append(translate(p.recs, f"dtmk_cm_prog_{p.cm_id}", max_insns=p.max_insns,
                               stack_depth=p.stack_depth, name=p.name, shapes=mine))
        if p.shadow is not None:     # (generic calls: the inline form runs in the workers' hook code,
            # where its helper calls are a full shadow window's rare fallback and folding them grew
            # hook_flush / hook_put by ~100 instructions each -- session 10: the workers' spills)
            parts.append(translate(p.recs, f"dtmk_cm_iprog_{p.cm_id}", max_insns=p.max_insns,
                                   stack_depth=p.stack_depth, name=p.name + " (inline)", shadow=p.shadow))
    for h in HOOK_IDS:
        mine = [p for p in progs if p.hook_id == h]
        parts.append(f'extern "C" __device__ int dtmk_cm_hook_{h}(dtmk_u32 cm_id, const struct dtmk_ctx *ctx, '
                     f'dtmk_u32 worker, dtmk_u32 epoch,\n        dtmk_u32 flags, dtmk_u64 *r0) {{\n')
        if mine:
            parts.append("    switch (cm_id) {\n")
            for p in mine:
                parts.append(f"    case {p.cm_id}: return dtmk_cm_prog_{p.cm_id}(ctx, worker, epoch, flags, r0);\n")
            parts.append("    default: return DTMK_OUT_FAULT;\n    }\n}\n")
        else:
            parts.append("    (void)cm_id; (void)ctx; (void)worker; (void)epoch; (void)flags; (void)r0;\n"
                         "    return DTMK_OUT_FAULT;\n}\n")
        inl = [p for p in mine if p.shadow is not None]
        parts.append(f'extern "C" __device__ int dtmk_cm_inline_{h}(dtmk_u32 cm_id, const struct dtmk_ctx *ctx, '
                     f'dtmk_u32 worker, dtmk_u32 epoch,\n        dtmk_u32 flags, dtmk_u64 *r0, '
                     f'struct dtmk_shadow *S, dtmk_u32 slot) {{\n')
        if inl:
            parts.append("    switch (cm_id) {\n")
            for p in inl:
                parts.append(f"    case {p.cm_id}: return dtmk_cm_iprog_{p.cm_id}(ctx, worker, epoch, flags, r0, S, "
                             f"slot);\n")
            parts.append("    default: return DTMK_OUT_FAULT;\n    }\n}\n")
        else:
            parts.append("    (void)cm_id; (void)ctx; (void)worker; (void)epoch; (void)flags; (void)r0; (void)S; "
                         "(void)slot;\n    return DTMK_OUT_FAULT;\n}\n")
    return "".join(parts)
