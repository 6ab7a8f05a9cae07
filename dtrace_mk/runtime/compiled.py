"""Compiled tier: verified eBPF -> CUDA C -> NVRTC LTO-IR -> nvJitLink with the kernel.

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

Build: `ltoir(source)` (NVRTC, -dlto -rdc=true, sm_90a), `link_cubin([...])`
(nvJitLink -lto), `build_compiled_harness(monitor)` = harness LTO-IR (cached by the
kernel sources' hash) + monitor LTO-IR (cached by its source hash) -> cubin (cached
by both), with timings (`BuildTimes`).  Promotions use the two-stage build
(`build_linked`, section "Two-stage builds"): stage 1 links a cached relocatable kernel
cubin with the monitor's own cubin without LTO (~0.1 s: the swap), stage 2 is the full
LTO link (seconds, in the background, swapped in at a later launch boundary).

CPU: `HostCompiledRuntime` compiles the very same monitor source with the host g++
(CUDA keywords and intrinsics as macros, a warp of one lane), together with
kernels/bpf_maps.cuh and kernels/bpf_compiled.cuh, over numpy-backed maps laid out as
on the device (DeviceMaps with a numpy "device"), and fires events serially as the
harness does: a differential test against the reference VM without a GPU.

GPU: `CompiledRuntime` = DeviceRuntime whose launches run kernels/bpf_compiled_harness.cu
linked with the current monitor; `attach(..., tier="compiled")` or `promote(aid)` (the
tier swap: see dtrace_mk/runtime/tiers.py for the policy and the handover rules).
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np

from ..abi import definition as abi
from ..bpf.devicegen import NAME_OF_OP
from ..errors import UserError
from ..kernels import build
from ..megakernel.gpu import OBS_SM_DEFINES
from . import device as D

if TYPE_CHECKING:                      # runtime/inline.py imports the verifier: loaded at attach
    from .inline import InlineMap

M64, M32 = (1 << 64) - 1, (1 << 32) - 1
KERNEL_DIR = D.KERNEL_DIR
HARNESS = "bpf_compiled_harness.cu"
HARNESS_SOURCES = tuple(sorted(set(build.include_closure(HARNESS, KERNEL_DIR)) | set(D.SOURCES)))
HOOK_IDS = tuple(range(1, abi.MAX_HOOK_ID + 1))
PROG_F_COMPILED = 1                   # kernels/bpf_prog_flags.h DTMK_PROG_F_COMPILED
PROG_F_INLINE = D.PROG_F_INLINE
ARCH = "sm_90a"


class TranslateError(UserError):
    """A program the compiled tier cannot translate (names the program and record)."""


class LinkError(UserError):
    """nvJitLink refused the link (the message carries its log)."""


# ---------------------------------------------------------------------------------
# Translation
# ---------------------------------------------------------------------------------

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


# ---------------------------------------------------------------------------------
# NVRTC -> LTO-IR, nvJitLink -> cubin, caches
# ---------------------------------------------------------------------------------

def ltoir(source: str, name: str = "monitor.cu", arch: str = ARCH, defines: Sequence[str] = ()) -> bytes:
    """NVRTC: CUDA source -> LTO-IR for `arch` (-dlto -rdc=true); kernels/ on the include
    path.  Raises device.CompileError with NVRTC's log."""
    return build.nvrtc_compile(source, name, arch, "ltoir", defines)


def nvjitlink_available() -> bool:
    try:
        from cuda.bindings import nvjitlink
        nvjitlink.version()
        return True
    except Exception:   # noqa: BLE001 - missing library shows as various errors
        return False


def _nvjitlink(inputs: Sequence[Tuple[str, bytes]], opts: List[str], kind: str, what: str) -> bytes:
    """One nvJitLink run over (name, bytes) inputs of one InputType; LinkError with the
    linker's log on failure."""
    from cuda.bindings import nvjitlink
    h = nvjitlink.create(len(opts), opts)
    try:
        try:
            for nm, data in inputs:
                nvjitlink.add_data(h, getattr(nvjitlink.InputType, kind), data, len(data), nm)
            nvjitlink.complete(h)
        except nvjitlink.nvJitLinkError as e:
            size = nvjitlink.get_error_log_size(h)
            log = bytearray(size)
            nvjitlink.get_error_log(h, log)
            raise LinkError(f"nvJitLink ({what}): {e}\n{bytes(log).decode(errors='replace').strip(chr(0))}") from None
        size = nvjitlink.get_linked_cubin_size(h)
        out = bytearray(size)
        nvjitlink.get_linked_cubin(h, out)
        return bytes(out)
    finally:
        nvjitlink.destroy(h)


def link_cubin(inputs: Sequence[Tuple[str, bytes]], arch: str = ARCH, lineinfo: bool = False) -> bytes:
    """nvJitLink: LTO-IR inputs (name, bytes) -> one cubin (-lto: cross-module inlining);
    lineinfo: keep the inputs' line tables (tools/sass_size.py)."""
    return _nvjitlink(inputs, [f"-arch={arch}", "-lto", "-O3"] + (["-lineinfo"] if lineinfo else []), "LTOIR", arch)


_cache_dir = build.cache_dir


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_suffix(path.suffix + f".tmp{os.getpid()}")
    tmp.write_bytes(data)
    tmp.replace(path)


def kernel_hash(arch: str = ARCH, defines: Sequence[str] = ()) -> str:
    h = hashlib.sha256()
    for s in HARNESS_SOURCES:
        h.update(s.encode() + b"\0" + (KERNEL_DIR / s).read_bytes())
    h.update(f"{arch}|{'|'.join(defines)}".encode())
    return h.hexdigest()[:20]


def program_hash(source: str, arch: str = ARCH) -> str:
    return hashlib.sha256(f"{arch}\0{source}".encode()).hexdigest()[:20]


@dataclass
class BuildTimes:
    """Seconds spent on one compiled-harness build (0.0 = taken from a cache)."""
    translate_s: float = 0.0
    monitor_ltoir_s: float = 0.0
    harness_ltoir_s: float = 0.0
    link_s: float = 0.0
    cached: str = ""            # "cubin", "ltoir"/"monitor" or ""
    stage: int = 2              # 1: relocatable link (fast swap), 2: full LTO

    @property
    def swap_s(self) -> float:
        """What a promotion waits for with the kernel's LTO-IR cached: translate +
        monitor compile + link."""
        return self.translate_s + self.monitor_ltoir_s + self.link_s


_MEM: Dict[str, bytes] = {}


def _cached(key: str, suffix: str, make) -> Tuple[bytes, bool]:
    if key in _MEM:
        return _MEM[key], True
    path = _cache_dir() / f"{key}{suffix}"
    if path.exists():
        data = path.read_bytes()
        _MEM[key] = data
        return data, True
    data = make()
    _write_atomic(path, data)
    _MEM[key] = data
    return data, False


def harness_ltoir(arch: str = ARCH, defines: Sequence[str] = ()) -> Tuple[bytes, float]:
    """The compiled harness as LTO-IR, cached by the kernel sources' hash (seconds spent)."""
    t0 = time.perf_counter()
    src = (KERNEL_DIR / HARNESS).read_text()
    data, hit = _cached(f"cm_harness_{kernel_hash(arch, defines)}", ".ltoir",
                        lambda: ltoir(src, HARNESS, arch, defines))
    return data, 0.0 if hit else time.perf_counter() - t0


def build_compiled_harness(monitor: str, arch: str = ARCH, defines: Sequence[str] = ()
                           ) -> Tuple[Path, BuildTimes]:
    """Harness LTO-IR + monitor LTO-IR -> linked cubin, cached by (program hash, kernel
    hash).  Returns the cubin's path and what each step cost."""
    times = BuildTimes()
    ph, kh = program_hash(monitor, arch), kernel_hash(arch, defines)
    path = _cache_dir() / f"cm_{kh}_{ph}.cubin"
    if path.exists():
        times.cached = "cubin"
        return path, times
    h_ir, times.harness_ltoir_s = harness_ltoir(arch, defines)
    t0 = time.perf_counter()
    m_ir, hit = _cached(f"cm_monitor_{ph}", ".ltoir", lambda: ltoir(monitor, "monitor.cu", arch))
    times.monitor_ltoir_s = 0.0 if hit else time.perf_counter() - t0
    if hit:
        times.cached = "ltoir"
    t0 = time.perf_counter()
    cubin = link_cubin([(HARNESS, h_ir), ("monitor.cu", m_ir)], arch)
    times.link_s = time.perf_counter() - t0
    _write_atomic(path, cubin)
    return path, times


# ---------------------------------------------------------------------------------
# Two-stage builds: stage 1 (fast, the swap) and stage 2 (full LTO, in the background)
# ---------------------------------------------------------------------------------
#
# Stage 1 links a PRECOMPILED relocatable (-rdc, non-LTO) cubin of the kernel (built once
# per kernel-source hash, cached on disk) with the monitor compiled on its own by NVRTC
# into a relocatable cubin: nvJitLink only resolves symbols (no LTO, no kernel codegen),
# so a promotion costs translate + the monitor's NVRTC/ptxas + a ~2 ms link.  The hook
# site calls dtmk_cm_hook_<id> for real (not inlined); the map helpers stay the kernel's.
# Stage 2 is the full LTO link (kernel LTO-IR + monitor LTO-IR, the monitor inlined at the
# hook sites): seconds, so it runs off the launch path and is swapped in at a later launch
# boundary (tiers.TierManager).  Everything is linked into ONE cubin in both stages.
#
# An -rdc compile compiles every non-inlined function on its own under the ABI; ptxas
# then refuses callees that use more registers than the entry's __launch_bounds__ allow
# (the whole-program build fits them automatically).  `maxrreg` = the entry's limit
# (megakernel: 65536 / MK_THREADS = 128) is passed to the kernel's and the monitor's
# compile, which is the limit the whole-program build applies to those functions anyway.

STAGE_FAST, STAGE_LTO = 1, 2
MK_SOURCES = tuple(build.include_closure("megakernel.cu", KERNEL_DIR))   # every file the build reads
MK_MAXRREG = 128                      # 65536 registers / MK_THREADS (512), 1 block per SM
MK_DEFINES = ("DTMK_COMPILED_TIER",)


include_closure = build.include_closure     # the one include scanner (kernels/build.py)


def _sources_hash(sources: Sequence[str], tag: str) -> str:
    h = hashlib.sha256()
    for s in sorted(set(sources)):
        h.update(s.encode() + b"\0" + (KERNEL_DIR / s).read_bytes())
    h.update(tag.encode() + b"\0" + build.nvrtc_version().encode())
    return h.hexdigest()[:20]


def _rdc_opts(maxrreg: Optional[int]) -> List[str]:
    return ["--relocatable-device-code=true"] + ([f"-maxrregcount={maxrreg}"] if maxrreg else [])


def relocatable_cubin(source: str, name: str, arch: str = ARCH, defines: Sequence[str] = (),
                      maxrreg: Optional[int] = None) -> bytes:
    """NVRTC: CUDA source -> relocatable (-rdc, non-LTO) cubin (device.CompileError)."""
    return build.nvrtc_compile(source, name, arch, "cubin", defines, options=_rdc_opts(maxrreg))


def link_relocatable(inputs: Sequence[Tuple[str, bytes]], arch: str = ARCH) -> bytes:
    """nvJitLink without -lto: relocatable cubins (name, bytes) -> one cubin (symbol
    resolution only, no codegen)."""
    return _nvjitlink(inputs, [f"-arch={arch}"], "CUBIN", f"{arch}, relocatable")


@dataclass(frozen=True)
class KernelSpec:
    """What a monitor is linked with: kernels/<name> built with `defines`; `maxrreg` the
    entry's register limit for -rdc compiles (None: no __launch_bounds__)."""
    name: str
    sources: Tuple[str, ...]
    defines: Tuple[str, ...] = ()
    maxrreg: Optional[int] = None
    tag: str = "harness"

    def key(self, arch: str) -> str:
        """Hash of the listed sources plus everything kernels/<name> includes."""
        return _sources_hash(tuple(self.sources) + tuple(include_closure(self.name)),
                             f"{arch}|{'|'.join(self.defines)}|{self.maxrreg}|{self.name}")


HARNESS_SPEC = KernelSpec(HARNESS, HARNESS_SOURCES, (), None, "harness")
MEGAKERNEL_SPEC = KernelSpec("megakernel.cu", MK_SOURCES, MK_DEFINES, MK_MAXRREG, "megakernel")
#: build variants of the default 512-thread kernel that the compiled tier links as they are
#: (-DDTMK_REC_GLOBAL: the record path before hook_cost_analysis.md round 8; DTMK_REC_FAST is
#: the default since session 4, passing it changes nothing but the cache key).  Every
#: variant bench/hooks.py and bench/level_profile.py run with a compiled monitor must be
#: here: a define left out is silently absent from the linked build (session 9 found
#: DTMK_HOLD_LAZY and DTMK_OBS_PROF missing: "summary_cm_lazyhold" measured the default).
#: DTMK_HOLD_EAGER: the always-full pre-signal hold (the lazy one is the default since session 9).
MK_PASS_DEFINES = ("DTMK_REC_GLOBAL", "DTMK_REC_FAST", "DTMK_EXTRA_SYNC",
                   "DTMK_ROPE_IN_ATTN",   # the graph's attn tasks rope (gpu.megakernel_defines): without it
                                          # the linked kernel computes wrong tokens for 1b
                   "DTMK_H_PARITY",       # slice_events graphs: h by layer parity (the same)
                   "DTMK_HOLD_EAGER", "DTMK_OBS_PROF", "DTMK_VM_CODE_SMEM", "DTMK_WS_EVICT_NORMAL",
                   "DTMK_WS_NST", "DTMK_WS_STAGE",   # the weight ring's shape: the launch sizes its smem by them
                   "DTMK_INL_PROBE",    # profiling: the inline event warm, an empty call (level_profile)
                   "DTMK_INL_NOINLINE",   # the site form through a noinline call (bench variant inlcall)
                   "DTMK_HASH_LOOK_FAST",   # the generic helpers' register-only probe (bench variant obssm4look)
                   "DTMK_SM_WORKER", "DTMK_SM_IDLE",   # placed workers (bench/level_profile.py --place: the
                                                       # per-GPC tables; without them the linked kernel ran
                                                       # its workers in block order under a placed name)
                   # the observer SM (it runs the linked programs): its count and its defines, from
                   # their one list (gpu.OBS_SM_DEFINES) but the probe's counters
                   "DTMK_OBS_SMS") + tuple(d for d in OBS_SM_DEFINES if d != "DTMK_OSQ_STATS")


def megakernel_spec(defines: Sequence[str] = ()) -> KernelSpec:
    """The compiled tier's kernel for a Megakernel built with `defines` (its .defines):
    MEGAKERNEL_SPEC, plus those of MK_PASS_DEFINES it carries (same block, same limit)."""
    names = {d.split("=")[0]: d for d in defines}
    passed = tuple(names[k] for k in MK_PASS_DEFINES if k in names)
    if passed:
        return KernelSpec("megakernel.cu", MK_SOURCES, MK_DEFINES + passed, MK_MAXRREG, "megakernel_v")
    return MEGAKERNEL_SPEC


def kernel_object(spec: KernelSpec, stage: int, arch: str = ARCH) -> Tuple[bytes, float]:
    """The kernel side of a link, cached on disk by the kernel sources' hash: stage 1 a
    relocatable cubin, stage 2 LTO-IR.  Returns (bytes, seconds spent; 0.0 = cached)."""
    t0 = time.perf_counter()
    src = (KERNEL_DIR / spec.name).read_text()
    if stage == STAGE_FAST:
        data, hit = _cached(f"cm_{spec.tag}_rdc_{spec.key(arch)}", ".cubin",
                            lambda: relocatable_cubin(src, spec.name, arch, spec.defines, spec.maxrreg))
    else:
        data, hit = _cached(f"cm_{spec.tag}_lto_{spec.key(arch)}", ".ltoir",
                            lambda: ltoir(src, spec.name, arch, spec.defines))
    return data, 0.0 if hit else time.perf_counter() - t0


def build_linked(monitor: str, spec: KernelSpec, stage: int = STAGE_FAST, arch: str = ARCH
                 ) -> Tuple[Path, BuildTimes]:
    """Kernel `spec` + compiled monitor -> one cubin on disk (cached by kernel hash,
    program hash and stage).  Stage 1: relocatable kernel cubin + the monitor's own
    relocatable cubin, linked without LTO (the swap: ~0.1 s); stage 2: full LTO (the
    monitor inlined at the hook sites; seconds).  Returns (path, BuildTimes)."""
    if stage not in (STAGE_FAST, STAGE_LTO):
        raise ValueError(f"stage must be 1 or 2, got {stage!r}")
    times = BuildTimes(stage=stage)
    ph, kh = program_hash(monitor, arch), spec.key(arch)
    path = _cache_dir() / f"cm_{spec.tag}_s{stage}_{kh}_{ph}.cubin"
    if path.exists():
        times.cached = "cubin"
        return path, times
    k_obj, times.harness_ltoir_s = kernel_object(spec, stage, arch)
    t0 = time.perf_counter()
    if stage == STAGE_FAST:
        m_obj, hit = _cached(f"cm_monitor_rdc{spec.maxrreg or 0}_{ph}", ".cubin",
                             lambda: relocatable_cubin(monitor, "monitor.cu", arch, (), spec.maxrreg))
    else:
        m_obj, hit = _cached(f"cm_monitor_{ph}", ".ltoir", lambda: ltoir(monitor, "monitor.cu", arch))
    times.monitor_ltoir_s = 0.0 if hit else time.perf_counter() - t0
    if hit:
        times.cached = "monitor"
    t0 = time.perf_counter()
    if stage == STAGE_FAST:
        cubin = link_relocatable([(spec.name, k_obj), ("monitor.cu", m_obj)], arch)
    else:
        cubin = link_cubin([(spec.name, k_obj), ("monitor.cu", m_obj)], arch)
    times.link_s = time.perf_counter() - t0
    _write_atomic(path, cubin)
    return path, times


# ---------------------------------------------------------------------------------
# Host build (g++): the same monitor and map code on the CPU, a warp of one lane
# ---------------------------------------------------------------------------------

HOST_SHIM = r"""/* CUDA on the host: a warp of one lane, one thread, plain memory */
#define __device__
#define __host__
#define __global__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __align__(n) __attribute__((aligned(n)))
#define __restrict__ __restrict
struct dtmk_host_dim3 { unsigned x, y, z; };
static const dtmk_host_dim3 threadIdx = {0, 0, 0};
static inline unsigned long long atomicAdd(unsigned long long *a, unsigned long long v) { unsigned long long o = *a; *a = o + v; return o; }
static inline unsigned atomicAdd(unsigned *a, unsigned v) { unsigned o = *a; *a = o + v; return o; }
static inline unsigned atomicCAS(unsigned *a, unsigned c, unsigned v) { unsigned o = *a; if (o == c) *a = v; return o; }
static inline unsigned long long atomicCAS(unsigned long long *a, unsigned long long c, unsigned long long v) { unsigned long long o = *a; if (o == c) *a = v; return o; }
static inline void __threadfence() {}
static inline void __threadfence_block() {}
static inline void __nanosleep(unsigned) {}
static inline int __clzll(long long v) { return v ? __builtin_clzll((unsigned long long)v) : 64; }
static inline unsigned __ballot_sync(unsigned, int p) { return p ? 1u : 0u; }
template <class T> static inline T __shfl_sync(unsigned, T v, int) { return v; }
static inline int __popc(unsigned v) { return __builtin_popcount(v); }
static inline int __ffs(int v) { return __builtin_ffs(v); }
static inline bool __isLocal(const void *) { return false; }
static inline bool __isShared(const void *) { return false; }
static inline void __syncwarp(unsigned = 0xffffffffu) {}
static inline unsigned long long atomicMax(unsigned long long *a, unsigned long long v) { unsigned long long o = *a; if (v > o) *a = v; return o; }
static inline unsigned long long atomicMin(unsigned long long *a, unsigned long long v) { unsigned long long o = *a; if (v < o) *a = v; return o; }
"""

HOST_DRIVER = r"""
/* the harness's serial loop (one event at a time, table order), on the host; slots with
 * DTMK_PROG_F_INLINE as the megakernel's hook site runs them (kernels/bpf_inline.cuh): one
 * shadow and one set of coverage accumulators, flushed at the end of every call (the
 * megakernel's epoch end) */
static struct dtmk_shadow dtmk_host_shadow;
static struct dtmk_cov_acc dtmk_host_accs[DTMK_NUM_HOOKS * DTMK_MAX_PROGS];
extern "C" int dtmk_host_fire(const struct dtmk_hook_table *T, const struct dtmk_ctx *events, dtmk_u32 n,
                              dtmk_u64 *r0_out, dtmk_u8 *outcome_out, dtmk_u32 flags) {
    for (dtmk_u32 ev = 0; ev < n; ev++) {
        const struct dtmk_ctx *c = events + ev;
        dtmk_u32 h = c->hook;
        if (h == 0 || h >= DTMK_NUM_HOOKS || (T[h].gen & 1)) continue;
        for (dtmk_u32 k = 0; k < T[h].n_progs; k++)
            if (!(T[h].progs[k].flags & DTMK_PROG_F_COMPILED)) return -1;     /* no interpreter on the host */
        dtmk_inl_event(T[h], h, c, c->worker, c->decode_step, flags, &dtmk_host_shadow,
                       dtmk_host_accs + h * DTMK_MAX_PROGS, r0_out + (dtmk_u64)ev * DTMK_MAX_PROGS,
                       outcome_out + (dtmk_u64)ev * DTMK_MAX_PROGS);
        for (dtmk_u32 k = 0; k < T[h].n_progs; k++) {
            const struct dtmk_prog &P = T[h].progs[k];
            if (P.flags & DTMK_PROG_F_INLINE) continue;
            dtmk_u64 r0 = 0;
            int out = dtmk_cm_run_prog(P, h, true, c, c->worker, c->decode_step, T[h].gen >> 1, flags, &r0, 0);
            r0_out[(dtmk_u64)ev * DTMK_MAX_PROGS + k] = r0;
            outcome_out[(dtmk_u64)ev * DTMK_MAX_PROGS + k] = (dtmk_u8)out;
        }
    }
    dtmk_sh_flush(&dtmk_host_shadow, T, dtmk_host_accs, 0, 1);
    for (int i = 0; i < DTMK_NUM_HOOKS * DTMK_MAX_PROGS; i++) dtmk_cov_acc_flush(&dtmk_host_accs[i]);
    return 0;
}
"""

_ASM_FIXES = (
    ('asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");',
     "v = *(volatile const dtmk_u32 *)p;"),
    ('asm volatile("st.release.gpu.global.u32 [%0], %1;" :: "l"(p), "r"(v) : "memory");',
     "*(volatile dtmk_u32 *)p = v;"),
)


def host_maps_header() -> str:
    """kernels/bpf_maps.cuh with kernels/bpf_map_ops.cuh inlined where it is included, and
    their two PTX one-liners (acquire load, release store) as plain C: the only edits the
    host build makes to the device map code."""
    inc = '#include "bpf_map_ops.cuh"'
    text = (KERNEL_DIR / "bpf_maps.cuh").read_text()
    if inc not in text:
        raise RuntimeError(f"bpf_maps.cuh changed: host build cannot find {inc!r}")
    text = text.replace(inc, (KERNEL_DIR / "bpf_map_ops.cuh").read_text(), 1)
    for old, new in _ASM_FIXES:
        if old not in text:
            raise RuntimeError(f"bpf_maps.cuh changed: host build cannot find {old!r}")
        text = text.replace(old, new)
    if "asm" in "".join(l.split("/*")[0] for l in text.splitlines() if not l.lstrip().startswith("*")):
        raise RuntimeError("bpf_maps.cuh has inline PTX the host build does not know")
    return text


def host_source(monitor: str) -> str:
    """One host C++ translation unit: shim, map code, the compiled-tier wrapper, the
    monitor, the serial driver."""
    wrapper = (KERNEL_DIR / "bpf_compiled.cuh").read_text().replace('#include "bpf_maps.cuh"', "")
    maps = host_maps_header().replace('#include "dtrace_mk_abi.h"', "")
    return "\n".join([HOST_SHIM, '#include "dtrace_mk_abi.h"', maps, monitor.replace('#include "dtrace_mk_abi.h"', ""),
                      wrapper.replace('#include "dtrace_mk_abi.h"', ""), HOST_DRIVER])


_HOST_LIBS: Dict[str, ctypes.CDLL] = {}


def host_library(monitor: str, opt: str = "-O1", defines: Sequence[str] = ()) -> ctypes.CDLL:
    """Compile host_source(monitor) with g++ into a shared library and load it (cached
    per process by the source hash; the map addresses in the source are this process's).
    defines: -D options of the build (the device code's opt-in variants, e.g. DTMK_HASH_LOOK_FAST)."""
    src = host_source(monitor)
    key = hashlib.sha256((opt + "|".join(defines) + src).encode()).hexdigest()[:20]
    if key in _HOST_LIBS:
        return _HOST_LIBS[key]
    with tempfile.TemporaryDirectory() as td:
        c = Path(td) / "monitor_host.cpp"
        c.write_text(src)
        so = Path(td) / f"cm_host_{key}.so"
        cmd = ["g++", "-std=c++17", opt, "-shared", "-fPIC", "-fno-strict-aliasing", "-w",
               "-Wl,-z,defs", f"-I{KERNEL_DIR}", *[f"-D{d}" for d in defines], "-o", str(so), str(c)]
        res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode:
            raise D.CompileError(f"host build of the compiled monitor failed:\n{res.stderr[-4000:]}")
        lib = ctypes.CDLL(str(so))          # stays mapped after the directory goes
    lib.dtmk_host_fire.restype = ctypes.c_int
    lib.dtmk_host_fire.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint32, ctypes.c_void_p,
                                   ctypes.c_void_p, ctypes.c_uint32]
    _HOST_LIBS[key] = lib
    return lib


class _HostArray(np.ndarray):
    """A numpy array posing as a CuPy device array (.data.ptr, .get(), .set())."""

    class _Ptr:
        __slots__ = ("ptr",)

        def __init__(self, ptr: int):
            self.ptr = ptr

    @property
    def data(self):                                    # noqa: D401 - CuPy's name
        return _HostArray._Ptr(self.ctypes.data)

    def get(self) -> np.ndarray:
        return np.array(self, copy=True).view(np.ndarray)

    def set(self, x) -> None:
        self[...] = np.asarray(x).reshape(self.shape)


class HostDevice:
    """The slice of CuPy that DeviceMaps and the runtime's tables use, on numpy."""
    uint8, uint32, uint64, ndarray = np.uint8, np.uint32, np.uint64, _HostArray

    @staticmethod
    def zeros(n, dtype=np.uint8):
        return np.zeros(n, dtype=dtype).view(_HostArray)

    @staticmethod
    def asarray(a):
        return np.array(a, copy=True).view(_HostArray)


# ---------------------------------------------------------------------------------
# Runtimes
# ---------------------------------------------------------------------------------

def _monitor_programs(entries: Iterable[Tuple[object, object]], cm_ids: Dict[int, int],
                      fold_maps: bool = True) -> List[MonitorProgram]:
    """MonitorProgram per (attachment, _DevProg), cm_id = cm_ids[id(_DevProg)]; programs
    the inline form can run get it too (the table flag decides which form runs).
    fold_maps: each map's shape of constants (else every helper call is the generic one)."""
    out = []
    for att, dp in entries:
        recs = D.encode_program(dp.program.insns, att.maps.desc_addrs, att.maps.value_addrs, dp.program.name,
                                dp.facts.extremum_stores)
        plan = dp.facts.plan
        addrs = att.maps.desc_addrs
        shadow = {addrs[i]: im for i, im in plan.maps.items()} if plan.ok else None
        shapes = {addrs[i]: MapShape.of(att.maps.host_descs[i]) for i in range(len(addrs))} if fold_maps else {}
        out.append(MonitorProgram(dp.program.hook.id, cm_ids[id(dp)], f"{att.id}:{dp.program.name}", recs,
                                  dp.max_insns, dp.stack_depth, shadow, shapes))
    return out


class _CompiledMixin:
    """Table publishing with compiled slots, cm_id bookkeeping, the promotion protocol of
    dtrace_mk.runtime.tiers (prepare_promotion / commit_promotion)."""

    inline_tier = True    # compiled programs that qualify run at the hook site (megakernel)
    #: map helpers folded to each map's shape (kernels/bpf_map_ops.cuh); False: the generic
    #: helpers, as before session 38 (bench/hooks.py measures the two side by side)
    fold_maps = True
    #: a compiled program that also has descriptors runs them (the host build's test of
    #: the descriptor form); else its compiled code (the compiled tier as promised)
    desc_over_compiled = False

    def _cm_init(self) -> None:
        self._cm_id: Dict[int, int] = {}          # id(_DevProg) -> cm_id (compiled, in the tables)
        self._cm_reserved: Dict[int, int] = {}    # id(_DevProg) -> cm_id (promotion being built)
        self._next_cm = 0
        self._tier: Dict[int, str] = {}           # attachment -> "compiled" (absent: "hot")
        self.installed_stage = 0                  # stage of the loaded module (0: none/host)

    def attachments(self) -> List[int]:
        return list(self._atts)

    def runs_inline(self, att, dp) -> bool:
        """A compiled program runs in the inline form (kernels/bpf_inline.cuh) when the
        runtime allows it (`inline_tier`), its plan qualifies and every event runs it
        (no sampling, no rate limit: those need the warp's tickets)."""
        return (self.inline_tier and att.sample_every <= 1 and att.max_per_epoch is None
                and dp.facts.plan.ok)

    def forms(self, aid: int) -> Dict[str, str]:
        """How each program of a compiled attachment runs: "inline", or "ring: <why>"
        (the inline plan's reason, the runtime's choice, sampling or a rate limit); a hot
        one (or descriptors over compiled code): DeviceRuntime.forms'."""
        att = self._atts[aid]
        out = {}
        hot = super().forms(aid)                 # not compiled: DeviceRuntime's forms
        for dp in att.progs:
            if id(dp) not in self._cm_id or (dp.descs is not None and self.desc_over_compiled):
                out[dp.program.name] = hot[dp.program.name]
                continue
            if self.runs_inline(att, dp):
                out[dp.program.name] = "inline"
                continue
            plan = dp.facts.plan
            why = (plan.reason if not plan.ok else "the runtime runs compiled programs through the ring"
                   if not self.inline_tier else "sampling / a rate limit needs the warp's tickets")
            out[dp.program.name] = f"ring: {why}"
        return out

    def tier(self, aid: int) -> str:
        return self._tier.get(aid, "hot")

    def _compiled_entries(self, extra: Optional[int] = None) -> List[Tuple[object, object]]:
        out = []
        for hid in HOOK_IDS:
            for (a, d) in self._by_hook[hid]:
                if id(d) in self._cm_id or (extra is not None and a.id == extra):
                    out.append((a, d))
        return out

    def monitor(self, extra: Optional[int] = None, stage: int = STAGE_LTO) -> str:
        """The monitor source for what is compiled now (plus attachment `extra`, whose
        programs take their reserved cm_ids), for a build of `stage`.  Stage 1 -- the swap,
        on the promotion's critical path -- keeps the generic map helpers: folding the maps'
        shapes adds about a third to the monitor's relocatable compile (session 38: 150 ->
        200 ms on the 2-core box); stage 2 (the background LTO build that replaces it)
        folds them when `fold_maps`."""
        ids = dict(self._cm_id)
        if extra is not None:
            for dp in self._atts[extra].progs:
                ids.setdefault(id(dp), self._cm_reserved.get(id(dp), -1))
        fold = self.fold_maps and stage != STAGE_FAST
        return monitor_source(_monitor_programs(self._compiled_entries(extra), ids, fold))

    def _reserve(self, aid: int) -> None:
        for dp in self._atts[aid].progs:
            if id(dp) not in self._cm_id and id(dp) not in self._cm_reserved:
                self._cm_reserved[id(dp)] = self._next_cm
                self._next_cm += 1

    DEFAULT_TIER = "hot"

    def attach(self, obj, verify: bool = True, *, tier: Optional[str] = None, **kw) -> int:
        """Attach like DeviceRuntime; tier "compiled" also marks the programs compiled
        (same program_gen as a hot attach), "hot" leaves them to the VM until promoted."""
        tier = tier or self.DEFAULT_TIER
        if tier not in ("hot", "compiled"):
            raise UserError(f"tier must be 'hot' or 'compiled', got {tier!r}")
        aid = super().attach(obj, verify, **kw)
        if tier == "compiled":
            self._mark_compiled(aid)
            for hid in self._hooks_of(aid):
                self._publish(hid)
        return aid

    def _mark_compiled(self, aid: int) -> None:
        self._reserve(aid)
        for dp in self._atts[aid].progs:
            if id(dp) not in self._cm_id:
                self._cm_id[id(dp)] = self._cm_reserved.pop(id(dp))
        self._tier[aid] = "compiled"

    def _fill_slot(self, e, att, dp) -> None:
        """DeviceRuntime's slot plus the compiled flag, cm_id and inline flag."""
        super()._fill_slot(e, att, dp)
        cm = self._cm_id.get(id(dp))
        if cm is not None:
            e["flags"] |= PROG_F_COMPILED | (cm << 16)
            if dp.descs is not None and not self.desc_over_compiled:   # compiled: the program's code
                e["flags"] = int(e["flags"]) & ~(PROG_F_INLINE | D.PROG_F_DESC)
                e["descs"], e["n_descs"] = 0, 0
            if self.runs_inline(att, dp):
                e["flags"] |= PROG_F_INLINE

    def _hooks_of(self, aid: int) -> List[int]:
        return sorted({dp.program.hook.id for dp in self._atts[aid].progs})

    # -- promotion protocol (dtrace_mk.runtime.tiers) --------------------------------------
    def prepare_promotion(self, aid: int) -> Tuple[str, object]:
        """Fix what the build will contain (cm_ids reserved, the monitor source) on the
        calling thread; returns (key, work): work() does the host-only build and may run on
        any thread; key identifies the compiled set it was built for."""
        if aid not in self._atts:
            raise KeyError(f"no attachment {aid}")
        self._reserve(aid)
        src = self.monitor(extra=aid, stage=STAGE_FAST)
        return src, self._build_work(src, STAGE_FAST)

    def prepare_optimize(self) -> Optional[Tuple[str, object]]:
        """Stage 2: (key, work) for the full LTO build of what is compiled now, or None
        when there is nothing to improve (nothing compiled, or the loaded module is
        already the LTO one for this monitor).  work() may run on any thread."""
        src = self.monitor()
        if not self._cm_id or (self.installed_stage == STAGE_LTO and self._installed_src() == src):
            return None
        return src, self._build_work(src, STAGE_LTO)

    def commit_optimize(self, key: str, artifact: object) -> bool:
        """At a launch boundary: load the stage-2 module built for `key` and republish
        every hook with a compiled program under a new program_gen (so the events of the
        stage-1 and stage-2 modules fall in distinct coverage rows, g+1 and g+2).  False
        (nothing changed) when the compiled set moved on since prepare_optimize."""
        if not self._cm_id or self.monitor() != key:
            return False
        self._install(key, artifact)
        hooks = sorted({dp.program.hook.id for a in self._atts.values() for dp in a.progs if id(dp) in self._cm_id})
        for hid in hooks:
            self._gen[hid] += 1
            self._publish(hid)
        return True

    def _installed_src(self) -> Optional[str]:
        return getattr(self, "_module_src", None) or getattr(self, "_lib_src", None)

    def commit_promotion(self, aid: int, key: str, artifact: object) -> bool:
        """At a launch boundary: take the built artifact, mark the attachment's programs
        compiled and publish their hooks under a new program_gen.  False (nothing changed)
        when the attachment is gone or the compiled set moved on since prepare."""
        if (aid not in self._atts or self.tier(aid) == "compiled"
                or self.monitor(extra=aid, stage=STAGE_FAST) != key):
            return False
        self._install(key, artifact)
        self._mark_compiled(aid)
        for hid in self._hooks_of(aid):
            self._gen[hid] += 1
            self._publish(hid)
        return True

    def promote(self, aid: int) -> bool:
        """prepare + build + commit now (the next launch runs compiled)."""
        key, work = self.prepare_promotion(aid)
        return self.commit_promotion(aid, key, work())

    def _build_work(self, src: str, stage: int = STAGE_LTO):
        raise NotImplementedError

    def _install(self, src: str, artifact: object) -> None:
        raise NotImplementedError


class HostCompiledRuntime(_CompiledMixin, D.DeviceRuntime):
    """The compiled tier on the CPU (g++), DeviceRuntime's interface: attach (every
    program compiled), fire(records) serially (the harness's serial mode), maps(aid),
    coverage(aid).  Maps, tables and coverage are the device layouts in host memory."""

    def __init__(self, num_workers: int = 1, *, max_insns: int = abi.MAX_INSNS, clock_from_ctx: bool = True,
                 opt: str = "-O1", inline: bool = False, descriptors: bool = False, defines: Sequence[str] = ()):
        if num_workers < 1:
            raise ValueError("num_workers must be >= 1")
        self.opt = opt                          # g++ optimisation level of the host build
        self.defines = tuple(defines)           # ... and its -D options (the device code's opt-in variants)
        # inline: qualifying programs run as the megakernel's hook site runs them (shadow
        # flushed at the end of every fire(): the epoch end); else as the harness does.
        # descriptors: programs that reduce run from their descriptors there instead (the
        # descriptor form of kernels/bpf_inline.cuh, on the host)
        self.inline_tier = inline
        self.descriptors = self.desc_over_compiled = descriptors
        self.cp = HostDevice
        self.num_workers = num_workers
        self.max_insns = max_insns
        self.code_cap = 1 << 30
        self.flags = D.FLAG_CLOCK_FROM_CTX if clock_from_ctx else 0
        self.host_tables = np.zeros(D.NUM_HOOKS, dtype=D.HOOK_TABLE_DTYPE)
        self.tables = HostDevice.asarray(self.host_tables.view(np.uint8))
        self.status = HostDevice.zeros(4, np.uint64)
        self._gen = {h.id: 0 for h in abi.HOOKS}
        self._by_hook = {h.id: [] for h in abi.HOOKS}
        self._atts, self._detached = {}, {}
        self._next = 1
        self._cm_init()
        self._lib = None
        self._lib_src: Optional[str] = None

    # HostCompiledRuntime: compiled at attach (the host has no interpreter: a "hot"
    # attachment is refused by fire() until promoted; for the promotion protocol's tests).
    DEFAULT_TIER = "compiled"

    def _build_work(self, src: str, stage: int = STAGE_LTO):
        return lambda: (host_library(src, self.opt, self.defines), stage)

    def prepare_optimize(self):
        # the host build has one stage; the protocol still runs (a "stage 2" artifact is
        # the same library) so the handover rows of stage 1 -> 2 can be checked on the CPU
        src = self.monitor()
        if not self._cm_id or self.installed_stage == STAGE_LTO and self._lib_src == src:
            return None
        return src, self._build_work(src, STAGE_LTO)

    def _install(self, src: str, artifact: object) -> None:
        if isinstance(artifact, tuple):
            artifact, self.installed_stage = artifact
        self._lib, self._lib_src = artifact, src

    def fire(self, records, **kw) -> D.FireBatch:
        if isinstance(records, (list, tuple)):
            blob = b"".join(bytes(r) for r in records)
        else:
            blob = bytes(records)
        if len(blob) % abi.CONTEXT_SIZE:
            raise UserError(f"context records: {len(blob)} bytes is not a multiple of {abi.CONTEXT_SIZE}")
        ev = np.frombuffer(blob, np.uint8).copy()
        n = len(blob) // abi.CONTEXT_SIZE
        words = ev.reshape(-1, abi.CONTEXT_SIZE).view("<u4") if n else np.zeros((0, 32), "<u4")
        hooks = words[:, 1].copy()
        bad = np.flatnonzero((hooks < 1) | (hooks > abi.MAX_HOOK_ID))
        if bad.size:
            raise UserError(f"context record {int(bad[0])}: field 'hook': {int(hooks[bad[0]])} is not a hook id")
        badw = np.flatnonzero(words[:, 6] >= self.num_workers)
        if badw.size:
            raise UserError(f"context record {int(badw[0])}: field 'worker': {int(words[badw[0], 6])} is out "
                            f"of range for {self.num_workers} workers")
        hot = [f"{a.id}:{d.program.name}" for hid in HOOK_IDS for a, d in self._by_hook[hid] if id(d) not in self._cm_id]
        if hot:
            raise UserError(f"host compiled tier: {', '.join(hot)} not compiled (no interpreter on the host); "
                            f"promote first")
        src = self.monitor(stage=self.installed_stage or STAGE_LTO)   # (the installed stage's form)
        if self._lib_src != src:
            self._install(src, host_library(src, self.opt, self.defines))
        r0 = np.zeros(max(n, 1) * D.MAX_PROGS, np.uint64)
        out = np.zeros(max(n, 1) * D.MAX_PROGS, np.uint8)
        if n:
            rc = self._lib.dtmk_host_fire(self.tables.ctypes.data, ev.ctypes.data, n, r0.ctypes.data,
                                          out.ctypes.data, self.flags)
            if rc:
                raise UserError("host compiled tier: a table slot is not compiled (no interpreter on the host)")
        slots = {hid: [(a.id, d.program.name) for a, d in ents] for hid, ents in self._by_hook.items()}
        return D.FireBatch(slots, hooks, r0.reshape(-1, D.MAX_PROGS)[:n], out.reshape(-1, D.MAX_PROGS)[:n])


class CompiledRuntime(_CompiledMixin, D.DeviceRuntime):
    """DeviceRuntime whose launches run kernels/bpf_compiled_harness.cu linked with the
    monitor of every program marked compiled (CuPy + GPU); hot programs run in the VM of
    the same kernel.  `attach(..., tier="compiled")` compiles at attach (same program_gen
    as a hot attach); `promote(aid)` / the tiers.TierManager protocol swap a hot one in
    at the next launch under a new program_gen.  `last_build`: what the last build cost."""

    def __init__(self, num_workers: int = 1, *, link_stage: int = STAGE_LTO, **kw):
        super().__init__(num_workers, **kw)
        self._cm_init()
        self.arch = kw.get("arch") or self._arch()
        self.link_stage = link_stage        # what ensure_module builds (promotions: stage 1)
        self.last_build: Optional[BuildTimes] = None
        self._module_src: Optional[str] = None
        src = self.monitor(stage=self.link_stage)
        self._install(src, self._build_work(src, self.link_stage)())

    def _arch(self) -> str:
        cc = self.cp.cuda.Device().compute_capability
        return f"sm_{cc}a" if cc == "90" else f"sm_{cc}"

    def _build_work(self, src: str, stage: int = STAGE_LTO):
        arch = self.arch
        return lambda: build_linked(src, HARNESS_SPEC, stage, arch)

    def _install(self, src: str, artifact) -> None:
        path, times = artifact
        if src == self._module_src and times.stage == self.installed_stage:
            return
        self.last_build = times
        self.installed_stage = times.stage
        self.module = self.cp.RawModule(path=str(path))
        self.kernel = self.module.get_function("dtmk_compiled_harness")
        self.kernel.max_dynamic_shared_size_bytes = self.smem_bytes(D.MAX_WARPS)
        self._module_src = src

    # CompiledRuntime: hot (device VM) by default; "compiled" takes effect from the next
    # launch, whose module is built once for everything attached compiled since.
    DEFAULT_TIER = "hot"
    inline_tier = False   # the harness runs records, it has no hook site

    def ensure_module(self) -> Optional[BuildTimes]:
        """Build and load the module for what is compiled now, if it changed (launch()
        does this first).  Returns the build's times, None when nothing changed."""
        src = self.monitor(stage=self.link_stage)
        if src == self._module_src:
            return None
        self._install(src, self._build_work(src, self.link_stage)())
        return self.last_build

    def launch(self, *a, **kw) -> None:
        self.ensure_module()
        super().launch(*a, **kw)

    def detach(self, aid: int) -> None:
        super().detach(aid)
        self._tier.pop(aid, None)
        for dp in self._detached[aid].progs:
            self._cm_id.pop(id(dp), None)
            self._cm_reserved.pop(id(dp), None)
        # the loaded module keeps the detached programs' code until the next build: the
        # tables no longer name their cm_ids, so it never runs (no relink on detach)
