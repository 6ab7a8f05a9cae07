/* bpf_vm.cuh: the device eBPF VM (hot tier).  Runs verified, host-pre-decoded bytecode
 * (struct dtmk_dinsn, kernels/bpf_opcodes.h) for up to 32 events at once: one warp, one
 * event per lane (the observer-warp model).
 *
 * Design (see docs/results/device_vm.md for the measurements behind it):
 *
 *   * Warp-uniform dispatch.  The warp walks ONE program counter `upc`; lane l runs the
 *     instruction at upc when its own pc `p` has been reached (p <= upc), otherwise it
 *     is parked at a later jump target.  The instruction fetch (one 16-byte shared
 *     memory broadcast) and the switch are uniform, so a data-dependent branch never
 *     serialises the dispatch.  Non-jump instructions just advance upc; jumps and exit
 *     make each lane's p exact and take upc = min over lanes (one __reduce_min_sync).
 *     Verified programs are DAGs, so the walk is at most n_insns steps; backward jumps
 *     (unverified test programs) also work: p is exact after every jump.
 *   * Registers in shared memory, [reg][lane] per warp (11 x 32 x 8 bytes): uniform
 *     register numbers, conflict-free, no local-memory traffic.  The stack is a per-lane
 *     local array (the hardware interleaves it per lane); r10 points at its top, r1 at
 *     the lane's context record.  All pointers are plain generic addresses: the verifier
 *     proved every access safe, so no run-time bounds checks.
 *   * Per-event instruction bound: a lane counts what it executes and is stopped (its
 *     event counted lost, "fault") when it passes max_insns (the verifier's
 *     max_path_insns) at a jump, call or exit.
 *   * Dispatch: op = group << 4 | sub (kernels/bpf_opcodes.h).  One switch on the
 *     group, then a small dense switch on `sub` inside one shared body per group (all
 *     ALU ops of a width share operand fetch and write-back; all jumps share the pc
 *     update), not one switch over ~120 cases (measured: docs/results/device_vm.md).
 *     Code size is a cost of its own (on the observer SM the VM is most of the code run
 *     per entry, and that code shares the GPC's instruction cache with the workers':
 *     docs/dev/hook_cost_analysis.md "Session 30"): the memory group computes one address
 *     and switches on the width only; every jump, exit and fault shares one pc sync; the
 *     rare div / mod run out of line; map-value atomics name the global space.
 *   * Helpers: map_lookup_elem, map_update_elem, map_delete_elem, ktime_get_ns,
 *     get_worker_id, ringbuf_output, hist_add with the host model's semantics
 *     (kernels/bpf_maps.cuh).  trace_printk is not implemented on the device yet: it
 *     returns -EINVAL and counts the event lost.  set_priority_hint (control programs,
 *     not attachable in ABI v1) returns 0 and records nothing.
 *
 * API:
 *
 *   dtmk_vm_load_table(global_table, shared_copy)            (one thread)
 *       snapshot a hook's program table under its seqlock generation; false (and no
 *       programs in the copy) while the host is writing it: retry at the next refresh.
 *   dtmk_vm_run_records(tables, recs, n, regs, accs, worker, flags)
 *       (all 32 lanes) the hook site's call: every program of each record's hook over
 *       up to 32 records in shared memory; see its comment.
 *   dtmk_vm_run_prog(prog, code, regs, eligible, ctx, worker, epoch, gen, flags, &r0, acc)
 *       (all 32 lanes of a warp together) -> DTMK_OUT_* of this lane's event; adds the
 *       warp's coverage to prog.cov, through `acc` (a shared-memory dtmk_cov_acc per
 *       program slot and warp; flush with dtmk_cov_acc_flush at epoch ends) or at once.  `code` may be shared or global memory; the VM
 *       reads one record past the program's end (prefetch), so a code buffer carries
 *       one padding record.  `regs`: the warp's DTMK_VM_REG_BYTES_PER_WARP bytes of
 *       shared memory, offset by the lane (regs_base + lane).
 */
#ifndef DTMK_BPF_VM_CUH
#define DTMK_BPF_VM_CUH

#include "dtrace_mk_abi.h"
#include "bpf_opcodes.h"
#include "bpf_maps.cuh"
#include "bpf_prog_flags.h"

#define DTMK_VM_NOPC 0xffffffffu
#define DTMK_WORKER_OF_CTX 0xffffffffu   /* run_records' worker: each record's own (-DDTMK_OBS_SM) */
#define DTMK_VM_FULL 0xffffffffu
#define DTMK_VM_NREGS 11
#define DTMK_VM_REG_BYTES_PER_WARP (DTMK_VM_NREGS * 32 * 8)

/* outcome of one (event, program) */
#define DTMK_OUT_NONE 0        /* not eligible */
#define DTMK_OUT_EXECUTED 1
#define DTMK_OUT_THROTTLED 2
#define DTMK_OUT_LOST 3
#define DTMK_OUT_FAULT 4       /* lost: instruction budget */
#define DTMK_OUT_SAMPLED 5     /* throttled before running (sampling) */

/* flags */
#define DTMK_VM_CLOCK_FROM_CTX 1u   /* ktime_get_ns returns the record's ts_ns (tests) */

__device__ __forceinline__ dtmk_u64 dtmk_globaltimer() {
    dtmk_u64 t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

__device__ __forceinline__ dtmk_u64 dtmk_bswap64(dtmk_u64 v) {
    dtmk_u32 lo = (dtmk_u32)v, hi = (dtmk_u32)(v >> 32);
    return ((dtmk_u64)__byte_perm(lo, 0, 0x0123) << 32) | __byte_perm(hi, 0, 0x0123);
}

/* Atomics on map values.  The verifier lets atomics target map values only, and a map's values
 * are device (global) memory, so these name the global space: a generic atomic also tests
 * whether the address is in the shared window and carries both forms (~30 instructions
 * each of the observer's per-entry code, docs/dev/hook_cost_analysis.md "Session 31").
 * Relaxed, GPU scope: what atomicAdd / atomicMax are. */
#define DTMK_GLOBAL_ATOM(name, T, C, op)                                                          \
    __device__ __forceinline__ T name(T *a, T v) {                                                \
        T old;                                                                                    \
        asm volatile("{ .reg .u64 g; cvta.to.global.u64 g, %1; atom.global." op " %0, [g], %2; }" \
                     : "=" C(old) : "l"(a), C(v) : "memory");                                     \
        return old;                                                                               \
    }
#define DTMK_GLOBAL_RED(name, T, C, op)                                                           \
    __device__ __forceinline__ void name(T *a, T v) {                                             \
        asm volatile("{ .reg .u64 g; cvta.to.global.u64 g, %0; red.global." op " [g], %1; }"      \
                     :: "l"(a), C(v) : "memory");                                                 \
    }
DTMK_GLOBAL_ATOM(dtmk_atom_add_u32, dtmk_u32, "r", "add.u32")
DTMK_GLOBAL_ATOM(dtmk_atom_add_u64, dtmk_u64, "l", "add.u64")
DTMK_GLOBAL_RED(dtmk_red_add_u32, dtmk_u32, "r", "add.u32")
DTMK_GLOBAL_RED(dtmk_red_add_u64, dtmk_u64, "l", "add.u64")
DTMK_GLOBAL_RED(dtmk_red_max_u64, dtmk_u64, "l", "max.u64")
DTMK_GLOBAL_RED(dtmk_red_min_u64, dtmk_u64, "l", "min.u64")
#undef DTMK_GLOBAL_ATOM
#undef DTMK_GLOBAL_RED

/* div / mod (ALU sub 3 / 9) out of line: the 64-bit forms are long inline sequences, and
 * no hot monitor divides (BPF semantics: x / 0 = 0, x % 0 = x) */
__device__ __noinline__ dtmk_u64 dtmk_vm_divmod(dtmk_u64 a, dtmk_u64 b, bool is64, bool mod) {
    if (b == 0) return mod ? a : 0ull;
    if (is64) return mod ? a % b : a / b;
    return mod ? (dtmk_u64)((dtmk_u32)a % (dtmk_u32)b) : (dtmk_u64)((dtmk_u32)a / (dtmk_u32)b);
}

/* Run one program for the lanes with `active`; returns the lane's outcome (NONE when
 * not active).  R: this warp's register file in shared memory, already offset by lane. */
__device__ __forceinline__ int dtmk_vm_exec(const struct dtmk_dinsn *__restrict__ code, dtmk_u32 max_insns,
                                            dtmk_u32 stack_depth, dtmk_u64 *__restrict__ R, bool active,
                                            const void *ctx, dtmk_u32 worker, dtmk_u32 epoch, dtmk_u32 flags,
                                            dtmk_u64 *r0_out) {
#ifdef DTMK_VM_REGS_LOCAL   /* variant for the benchmark: registers in a per-lane local array */
    dtmk_u64 lregs[DTMK_VM_NREGS];
#define REG(i) lregs[(i)]
#else
#define REG(i) R[(dtmk_u32)(i) << 5]
#endif
    dtmk_u64 stack[DTMK_STACK_SIZE / 8];
    bool lost = false, thr = false, fault = false, done_ok = false;
    dtmk_u32 p = active ? 0u : DTMK_VM_NOPC;
    dtmk_u32 cnt = 0;
    if (active) {
        /* (a loop, not unrolled: the unrolled form was ~54 instructions of the observer's
         * per-entry code, docs/dev/hook_cost_analysis.md "Session 31") */
#pragma unroll 1
        for (dtmk_u32 k = 0; k < stack_depth / 8; k++) stack[DTMK_STACK_SIZE / 8 - 1 - k] = 0;
#pragma unroll
        for (int i = 0; i < DTMK_VM_NREGS; i++) REG(i) = 0;
        REG(1) = (dtmk_u64)ctx;
        REG(10) = (dtmk_u64)(stack + DTMK_STACK_SIZE / 8);
    }
    dtmk_u32 upc = __reduce_min_sync(DTMK_VM_FULL, p);
    if (upc == DTMK_VM_NOPC) return DTMK_OUT_NONE;

#ifdef DTMK_VM_NO_PREFETCH
#define NEXT { upc++; continue; }
#define FETCH
#else   /* the next record is loaded while this one executes; a jump reloads */
#define NEXT { upc++; I = N; continue; }
#define FETCH I = code[upc];
#endif
#define SYNC_PC goto sync_pc;   /* (one copy of the pc sync for every jump, call guard and exit) */
#define CALL_GUARD (me && (cnt > max_insns ? (fault = true, p = DTMK_VM_NOPC, false) : true))
#define ADDR(reg) (REG(reg) + (dtmk_u64)(dtmk_s64)I.off)

#ifdef DTMK_VM_NO_PREFETCH
    for (;;) {
        const struct dtmk_dinsn I = code[upc];
#else
    struct dtmk_dinsn I = code[upc];
    for (;;) {
        const struct dtmk_dinsn N = code[upc + 1];   /* code has one padding record */
#endif
        const bool me = p <= upc;
        cnt += me;
        const dtmk_u32 group = I.op >> 4, sub = I.op & 15u;
        switch (group) {
        case DTMK_OPG_ALU64_K: case DTMK_OPG_ALU64_X: case DTMK_OPG_ALU32_K: case DTMK_OPG_ALU32_X: {
            /* every lane computes (registers only, cannot fault); parked lanes do not store */
            const bool is64 = group <= DTMK_OPG_ALU64_X;
            const bool isx = group == DTMK_OPG_ALU64_X || group == DTMK_OPG_ALU32_X;
            dtmk_u64 a = REG(I.dst), b = isx ? REG(I.src) : I.imm;
            if (!is64) { a = (dtmk_u32)a; b = (dtmk_u32)b; }
            dtmk_u64 v;
            switch (sub) {
            case 0x0: v = a + b; break;
            case 0x1: v = a - b; break;
            case 0x2: v = a * b; break;
            case 0x3: v = dtmk_vm_divmod(a, b, is64, false); break;
            case 0x4: v = a | b; break;
            case 0x5: v = a & b; break;
            case 0x6: v = a << (b & (is64 ? 63 : 31)); break;
            case 0x7: v = a >> (b & (is64 ? 63 : 31)); break;
            case 0x9: v = dtmk_vm_divmod(a, b, is64, true); break;
            case 0xa: v = a ^ b; break;
            case 0xb: v = b; break;
            case 0xc: v = is64 ? (dtmk_u64)((dtmk_s64)a >> (b & 63)) : (dtmk_u64)(dtmk_u32)((int)(dtmk_u32)a >> (b & 31)); break;
            default: v = a; break;   /* never encoded */
            }
            if (!is64) v = (dtmk_u32)v;
            if (me) REG(I.dst) = v;
            NEXT
        }
        case DTMK_OPG_JMP64_K: case DTMK_OPG_JMP64_X: case DTMK_OPG_JMP32_K: case DTMK_OPG_JMP32_X: {
            const bool is64 = group <= DTMK_OPG_JMP64_X;
            const bool isx = group == DTMK_OPG_JMP64_X || group == DTMK_OPG_JMP32_X;
            dtmk_u64 a = REG(I.dst), b = isx ? REG(I.src) : I.imm;
            if (!is64) { a = (dtmk_u32)a; b = (dtmk_u32)b; }
            const dtmk_s64 sa = is64 ? (dtmk_s64)a : (dtmk_s64)(int)(dtmk_u32)a;
            const dtmk_s64 sb = is64 ? (dtmk_s64)b : (dtmk_s64)(int)(dtmk_u32)b;
            bool t;
            switch (sub) {
            case 0x1: t = a == b; break;
            case 0x2: t = a > b; break;
            case 0x3: t = a >= b; break;
            case 0x4: t = (a & b) != 0; break;
            case 0x5: t = a != b; break;
            case 0x6: t = sa > sb; break;
            case 0x7: t = sa >= sb; break;
            case 0xa: t = a < b; break;
            case 0xb: t = a <= b; break;
            case 0xc: t = sa < sb; break;
            case 0xd: t = sa <= sb; break;
            default: t = false; break;
            }
            if (me) {
                p = t ? (dtmk_u32)I.off : upc + 1;
                if (cnt > max_insns) { p = DTMK_VM_NOPC; fault = true; }
            }
            SYNC_PC
        }
        case DTMK_OPG_MEM: {
            DTMK_PROF_BEGIN(prof_mem);
            if (me) {
                /* one address for every form (loads, sub 0-3, off src; the rest off dst) and one
                 * width switch per kind: a 16-way compare tree was most of this group's code */
                char *a = (char *)ADDR(sub < 4 ? I.src : I.dst);
                if (sub < 4) {                                   /* ldx: width 1 << sub */
                    dtmk_u64 v;
                    switch (sub) {
                    case 0x0: v = *(const dtmk_u8 *)a; break;
                    case 0x1: v = *(const dtmk_u16 *)a; break;
                    case 0x2: v = *(const dtmk_u32 *)a; break;
                    default: v = *(const dtmk_u64 *)a; break;
                    }
                    REG(I.dst) = v;
                } else if (sub < 12) {                           /* st imm (4-7) / stx (8-b): width 1 << (sub & 3) */
                    const dtmk_u64 v = sub < 8 ? (dtmk_u64)I.imm : REG(I.src);
                    switch (sub & 3u) {
                    case 0x0: *(dtmk_u8 *)a = (dtmk_u8)v; break;
                    case 0x1: *(dtmk_u16 *)a = (dtmk_u16)v; break;
                    case 0x2: *(dtmk_u32 *)a = (dtmk_u32)v; break;
                    default: *(dtmk_u64 *)a = v; break;
                    }
                } else if (sub == 0xc) {                         /* xadd32 (aux: fetch) */
                    dtmk_u32 *w = (dtmk_u32 *)a;
                    const dtmk_u32 v = (dtmk_u32)REG(I.src);
                    dtmk_u32 old;
                    if (__isLocal(w)) { old = *w; *w = old + v; }
                    else if (I.aux) old = dtmk_atom_add_u32(w, v);
                    else { dtmk_red_add_u32(w, v); old = 0; }   /* result unused: a RED, no round trip */
                    if (I.aux) REG(I.src) = old;
                } else if (sub == 0xd) {                         /* xadd64 (aux: fetch) */
                    dtmk_u64 *w = (dtmk_u64 *)a;
                    const dtmk_u64 v = REG(I.src);
                    dtmk_u64 old;
                    if (__isLocal(w)) { old = *w; *w = old + v; }
                    else if (I.aux) old = dtmk_atom_add_u64(w, v);
                    else { dtmk_red_add_u64(w, v); old = 0; }   /* a RED */
                    if (I.aux) REG(I.src) = old;
                }
                /* stxdw_max / stxdw_min: a raise-to / lower-to triple's store into a map
                 * value (never a stack slot): atomic, so racing lanes keep the extreme */
                else if (sub == 0xe) dtmk_red_max_u64((dtmk_u64 *)a, REG(I.src));
                else dtmk_red_min_u64((dtmk_u64 *)a, REG(I.src));
            }
            DTMK_PROF_END(22, prof_mem);
            NEXT }
        case DTMK_OPG_CALL: {
            DTMK_PROF_BEGIN(prof_call);
            if (CALL_GUARD) {
#ifdef DTMK_OSQ_NOMAPS   /* measurement only (bench/obs_split.py lazynomaps): the VM runs, no map helper touches memory */
                if (I.op != DTMK_OP_CALL_KTIME_GET_NS && I.op != DTMK_OP_CALL_GET_WORKER_ID) REG(0) = 0; else
#endif
                switch (I.op) {
                case DTMK_OP_CALL_MAP_LOOKUP_ELEM:
                    REG(0) = dtmk_map_lookup((const struct dtmk_map *)REG(1), (const void *)REG(2), worker, &lost);
                    break;
                case DTMK_OP_CALL_MAP_UPDATE_ELEM:
                    REG(0) = dtmk_map_update((const struct dtmk_map *)REG(1), (const void *)REG(2),
                                             (const void *)REG(3), REG(4), worker, &lost);
                    break;
                case DTMK_OP_CALL_MAP_DELETE_ELEM:
                    REG(0) = dtmk_map_delete((const struct dtmk_map *)REG(1), (const void *)REG(2), &lost);
                    break;
                case DTMK_OP_CALL_KTIME_GET_NS:
                    REG(0) = (flags & DTMK_VM_CLOCK_FROM_CTX) ? ((const struct dtmk_ctx *)ctx)->ts_ns
                                                              : dtmk_globaltimer();
                    break;
                case DTMK_OP_CALL_GET_WORKER_ID: REG(0) = worker; break;
                case DTMK_OP_CALL_RINGBUF_OUTPUT:
                    REG(0) = dtmk_ringbuf_output((const struct dtmk_map *)REG(1), (const void *)REG(2), REG(3),
                                                 REG(4), worker, epoch, &lost, &thr);
                    break;
                case DTMK_OP_CALL_HIST_ADD:
                    REG(0) = dtmk_hist_add((const struct dtmk_map *)REG(1), (const void *)REG(2), REG(3), &lost);
                    break;
                case DTMK_OP_CALL_SET_PRIORITY_HINT: REG(0) = 0; break;   /* control programs: not attachable */
                case DTMK_OP_CALL_TRACE_PRINTK:                            /* not on the device yet */
                default: REG(0) = (dtmk_u64)-DTMK_EINVAL; lost = true; break;
                }
            }
            DTMK_PROF_END(20, prof_call);
            NEXT }
        case DTMK_OPG_MISC:
            switch (I.op) {
            case DTMK_OP_LDDW: case DTMK_OP_LDDW_MAP: case DTMK_OP_LDDW_MAP_VALUE:
                if (me) REG(I.dst) = I.imm;
                NEXT
            case DTMK_OP_NEG: { const dtmk_u64 v = 0ull - REG(I.dst); if (me) REG(I.dst) = v; } NEXT
            case DTMK_OP_NEG32: { const dtmk_u64 v = (dtmk_u32)(0u - (dtmk_u32)REG(I.dst)); if (me) REG(I.dst) = v; } NEXT
            case DTMK_OP_LE: {
                const dtmk_u64 a = REG(I.dst);
                const dtmk_u64 v = I.imm == 16 ? (a & 0xffffull) : I.imm == 32 ? (a & 0xffffffffull) : a;
                if (me) REG(I.dst) = v; } NEXT
            case DTMK_OP_BE: {
                const dtmk_u64 a = REG(I.dst);
                const dtmk_u64 v = I.imm == 16 ? (dtmk_u64)__byte_perm((dtmk_u32)a, 0, 0x4401)
                                 : I.imm == 32 ? (dtmk_u64)__byte_perm((dtmk_u32)a, 0, 0x0123) : dtmk_bswap64(a);
                if (me) REG(I.dst) = v; } NEXT
            case DTMK_OP_JA:
                if (me) {
                    p = (dtmk_u32)I.off;
                    if (cnt > max_insns) { p = DTMK_VM_NOPC; fault = true; }
                }
                SYNC_PC
            case DTMK_OP_EXIT:
                if (me) {
                    if (cnt > max_insns) fault = true;
                    else { *r0_out = REG(0); done_ok = true; }
                    p = DTMK_VM_NOPC;
                }
                SYNC_PC
            default:   /* invalid op or unknown helper: never in a verified program */
                if (me) { fault = true; p = DTMK_VM_NOPC; }
                SYNC_PC
            }
        default:
            if (me) { fault = true; p = DTMK_VM_NOPC; }
            SYNC_PC
        }
    sync_pc:   /* after a jump, exit or fault: each lane's p is exact; the warp goes on at the lowest */
        upc = __reduce_min_sync(DTMK_VM_FULL, p);
        if (upc == DTMK_VM_NOPC) break;
        FETCH
    }
done:
    if (!active) return DTMK_OUT_NONE;
    if (fault || !done_ok) return DTMK_OUT_FAULT;
    if (lost) return DTMK_OUT_LOST;
    if (thr) return DTMK_OUT_THROTTLED;
    return DTMK_OUT_EXECUTED;
#undef REG
#undef NEXT
#undef FETCH
#undef SYNC_PC
#undef CALL_GUARD
#undef ADDR
}

/* Snapshot one hook table (one thread).  program_gen of the copy = copy->gen / 2. */
__device__ __forceinline__ bool dtmk_vm_load_table(const struct dtmk_hook_table *src, struct dtmk_hook_table *dst) {
    const dtmk_u32 g1 = *(volatile const dtmk_u32 *)&src->gen;
    __threadfence();
    *dst = *src;
    __threadfence();
    const dtmk_u32 g2 = *(volatile const dtmk_u32 *)&src->gen;
    if ((g1 & 1) || g1 != g2) {    /* being written: run nothing on this hook for now */
        dst->n_progs = 0;
        return false;
    }
    return true;
}

#include "bpf_run_prog.cuh"   /* dtmk_run_prog: sampling, rate limit, coverage (shared with the compiled tier) */

/* dtmk_run_prog's exec step for the interpreter (a = code, R) */
struct dtmk_vm_exec_step {
    static __device__ __forceinline__ int exec(const struct dtmk_prog &P, bool run, const void *ctx, dtmk_u32 worker,
                                               dtmk_u32 epoch, dtmk_u32 flags, dtmk_u64 *r0,
                                               const struct dtmk_dinsn *code, dtmk_u64 *R) {
        return dtmk_vm_exec(code, P.max_insns, P.stack_depth, R, run, ctx, worker, epoch, flags, r0);
    }
};

/* One program over the warp's events: sampling, rate limit, execution, coverage.  `eligible`: this
 * lane has an event for the program's hook.  `gen`: the hook table's program_gen.  dtmk_run_prog
 * (bpf_run_prog.cuh) with the interpreter as its exec step. */
__device__ __forceinline__ int dtmk_vm_run_prog(const struct dtmk_prog &P, const struct dtmk_dinsn *code,
                                                dtmk_u64 *R, bool eligible, const void *ctx, dtmk_u32 worker,
                                                dtmk_u32 epoch, dtmk_u32 gen, dtmk_u32 flags, dtmk_u64 *r0,
                                                struct dtmk_cov_acc *acc = 0) {
    return dtmk_run_prog<dtmk_vm_exec_step>(P, eligible, ctx, worker, epoch, gen, flags, r0, acc, code, R);
}

/* A hook site's whole job for one warp: run the programs attached to each record's hook
 * over up to 32 records (lane l takes recs[l] when l < n), in table order, counting
 * coverage into accs[k] (the warp's accumulator for program slot k, shared memory;
 * flush them with dtmk_cov_acc_flush at epoch ends and before the kernel exits).
 *   tables  the CTA's copy of the hook tables, indexed by hook id (dtmk_vm_load_table);
 *           program code is read from tables[h].progs[k].insns (global memory as the
 *           host wrote it, or a shared-memory copy the caller substituted)
 *   regs    the warp's register file: DTMK_VM_REG_BYTES_PER_WARP bytes of shared memory
 *   worker  this worker's index (per-worker maps and rings); epoch = record decode_step
 * All 32 lanes of the warp call it.  Same loop as kernels/bpf_vm_harness.cu. */
__device__ __noinline__ void dtmk_vm_run_records(const struct dtmk_hook_table *tables, const struct dtmk_ctx *recs,
                                                 dtmk_u32 n, dtmk_u64 *regs, struct dtmk_cov_acc *accs,
                                                 dtmk_u32 worker, dtmk_u32 flags) {
    const unsigned lane = threadIdx.x & 31;
    const bool valid = lane < n;
    const struct dtmk_ctx *c = recs + (valid ? lane : 0);
    dtmk_u32 hook = valid ? c->hook : 0u;
    if (hook >= DTMK_NUM_HOOKS) hook = 0;
    const dtmk_u32 epoch = valid ? c->decode_step : 0u;
#ifdef DTMK_OBS_SM
    if (worker == DTMK_WORKER_OF_CTX) worker = valid ? c->worker : 0u;   /* a batch of several workers */
#endif
    dtmk_u64 *R = regs + lane;
    unsigned pending = __ballot_sync(DTMK_VM_FULL, valid && hook != 0 && tables[hook].n_progs != 0);
    while (pending) {
        const dtmk_u32 h = __shfl_sync(DTMK_VM_FULL, hook, __ffs(pending) - 1);
        const bool mine = valid && hook == h;
        pending &= ~__ballot_sync(DTMK_VM_FULL, mine);
        const struct dtmk_hook_table &T = tables[h];
        for (dtmk_u32 k = 0; k < T.n_progs; k++) {
            dtmk_u64 r0 = 0;
            if (T.progs[k].flags & DTMK_PROG_F_INLINE) continue;   /* ran at the site (bpf_inline.cuh) */
            dtmk_vm_run_prog(T.progs[k], (const struct dtmk_dinsn *)T.progs[k].insns, R, mine, c, worker, epoch,
                             T.gen >> 1, flags, &r0, accs + k);
        }
    }
}

#endif /* DTMK_BPF_VM_CUH */
