/* bpf_vm_harness.cu: test and benchmark kernels for the device eBPF VM.
 *
 *   dtmk_vm_harness   runs every program attached to each event's hook over an array of
 *                     128-byte context records, exactly as a hook site would: per warp
 *                     32 events (one per lane) or, with serial = 1, one event at a time
 *                     on lane 0 of a single warp (the reference runtime's order, so
 *                     order-dependent results such as a filling map compare exactly).
 *                     The block copies the hook tables (and checks their seqlock
 *                     generation) and all programs' code into shared memory at start:
 *                     a launch is one "batch" that picks up the table as it is then.
 *   dtmk_vm_naive     the baseline: one thread per event, raw RFC 9669 bytecode read
 *                     from global memory and decoded per instruction, registers in a
 *                     local array, a switch on the opcode byte.  One program.
 *
 * Outputs per (event, program slot): r0 and a DTMK_OUT_* code.
 *
 * With DTMK_HARNESS_COMPILED defined (kernels/bpf_compiled_harness.cu) the file is the
 * compiled tier's harness instead: the same kernel body named dtmk_compiled_harness, in
 * which a slot whose dtmk_prog.flags has DTMK_PROG_F_COMPILED runs the linked monitor
 * (dtmk_cm_run_prog, kernels/bpf_compiled.cuh) and is not staged; no dtmk_vm_naive.
 */
#include "bpf_vm.cuh"
#ifdef DTMK_HARNESS_COMPILED
#include "bpf_compiled.cuh"
#define H_KERNEL dtmk_compiled_harness
#define H_COMPILED(P) ((P).flags & DTMK_PROG_F_COMPILED)   /* the slot runs the linked monitor */
#else
#define H_KERNEL dtmk_vm_harness
#define H_COMPILED(P) 0
#endif
#if defined(DTMK_HARNESS_COMPILED) && defined(DTMK_CM_NO_VM)
#define H_VM_RUN_PROG(...) DTMK_OUT_NONE   /* compiled-only variant (link-time measurements): interpreted slots do not run */
#else
#define H_VM_RUN_PROG(...) dtmk_vm_run_prog(__VA_ARGS__)
#endif

/* block = any number of whole warps; dynamic shared memory:
 *   tables[DTMK_NUM_HOOKS] | code[code_cap] | regs[warps][11][32] | ctx[warps][32]
 * status[0]: hook tables skipped (odd or moving gen), status[1]: (interpreted) code larger
 * than code_cap */
/* no __launch_bounds__: with it ptxas capped the kernel at 64 registers and spilled */
#define H_MAX_WARPS 8       /* dtrace_mk.runtime.device.MAX_WARPS */

extern "C" __global__ void   /* dtmk_vm_harness (dtmk_compiled_harness with DTMK_HARNESS_COMPILED) */
H_KERNEL(const struct dtmk_hook_table *tables, const struct dtmk_ctx *events, dtmk_u64 *r0_out,
                dtmk_u8 *outcome_out, dtmk_u64 *status, dtmk_u32 n_events, dtmk_u32 serial, dtmk_u32 flags,
                dtmk_u32 code_cap, dtmk_u32 epoch_override, dtmk_u32 use_epoch_override, dtmk_u32 repeat) {
    extern __shared__ __align__(16) unsigned char smem[];
    struct dtmk_hook_table *T = (struct dtmk_hook_table *)smem;
    struct dtmk_dinsn *code = (struct dtmk_dinsn *)(smem + sizeof(struct dtmk_hook_table) * DTMK_NUM_HOOKS);
    dtmk_u64 *regs = (dtmk_u64 *)(code + code_cap);
    const unsigned n_warps = blockDim.x >> 5;
    struct dtmk_ctx *cbuf = (struct dtmk_ctx *)(regs + n_warps * DTMK_VM_NREGS * 32);
    __shared__ dtmk_u32 code_off[DTMK_NUM_HOOKS][DTMK_MAX_PROGS];
    __shared__ dtmk_u32 ok;
    __shared__ struct dtmk_cov_acc accs[H_MAX_WARPS][DTMK_MAX_PROGS];
    long long c_start = 0;
    dtmk_u64 t_start = 0;
    if (blockIdx.x == 0 && threadIdx.x == 0) { c_start = clock64(); t_start = dtmk_globaltimer(); }
    if (threadIdx.x < H_MAX_WARPS * DTMK_MAX_PROGS) {
        struct dtmk_cov_acc *a = &accs[0][0] + threadIdx.x;
        a->cov = 0; a->eligible = a->executed = a->throttled = a->lost = a->fault = 0;
    }

    /* ---- pick up the program tables (seqlock) and stage code ---- */
    if (threadIdx.x == 0) {
        ok = 1;
        dtmk_u32 used = 0;
        for (int h = 1; h < DTMK_NUM_HOOKS; h++) {
            if (!dtmk_vm_load_table(tables + h, &T[h]))
                atomicAdd((unsigned long long *)&status[0], 1ull);
            for (dtmk_u32 k = 0; k < T[h].n_progs; k++) {
                code_off[h][k] = used;
                if (!H_COMPILED(T[h].progs[k])) used += T[h].progs[k].n_insns;
            }
        }
        T[0].n_progs = 0;
        if (used + 1 > code_cap) {   /* +1: the VM prefetches one record past the end */ ok = 0; atomicAdd((unsigned long long *)&status[1], 1ull); }
    }
    __syncthreads();
    if (!ok) return;
    for (int h = 1; h < DTMK_NUM_HOOKS; h++) {
        for (dtmk_u32 k = 0; k < T[h].n_progs; k++) {
            if (H_COMPILED(T[h].progs[k])) continue;
            const uint4 *src = (const uint4 *)T[h].progs[k].insns;
            uint4 *dst = (uint4 *)(code + code_off[h][k]);
            for (dtmk_u32 i = threadIdx.x; i < T[h].progs[k].n_insns; i += blockDim.x) dst[i] = src[i];
        }
    }
    __syncthreads();

    const unsigned lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    dtmk_u64 *R = regs + warp * DTMK_VM_NREGS * 32 + lane;
    struct dtmk_ctx *wbuf = cbuf + warp * 32;
    const dtmk_u32 per = serial ? 1u : 32u;
    const dtmk_u32 gwarp = blockIdx.x * n_warps + warp, nwarp = serial ? 1u : gridDim.x * n_warps;
    if (!(serial && gwarp != 0)) {

    /* Records of the next batch are loaded into registers while this batch runs
     * (coalesced 16-byte loads: word i = k * 32 + lane of the batch), then stored to the
     * warp's shared buffer: the global latency stays off the hook path, as in the
     * megakernel, whose records are already in shared memory. */
    uint4 pf[8];
#define H_LOAD(B) { const dtmk_u32 nb_ = min(per, n_events - (B)); \
        _Pragma("unroll") for (int k = 0; k < 8; k++) { const dtmk_u32 i = k * 32 + lane; \
            if (i < nb_ * 8) pf[k] = ((const uint4 *)(events + (B)))[i]; } }
    dtmk_u32 rep = 0, base = gwarp * per;
    if (base >= n_events) rep = repeat;
    if (rep < repeat) H_LOAD(base)
    while (rep < repeat) {
        const dtmk_u32 nb = min(per, n_events - base);
        __syncwarp();
#pragma unroll
        for (int k = 0; k < 8; k++) {
            const dtmk_u32 i = k * 32 + lane;
            if (i < nb * 8) ((uint4 *)wbuf)[i] = pf[k];
        }
        __syncwarp();
        dtmk_u32 nbase = base + nwarp * per, nrep = rep;
        if (nbase >= n_events) { nbase = gwarp * per; nrep++; }
        if (nrep < repeat) H_LOAD(nbase)
        const bool valid = lane < nb;
        const dtmk_u32 ev = base + lane;
        const struct dtmk_ctx *c = wbuf + lane;
        dtmk_u32 hook = valid ? c->hook : 0u;
        if (hook >= DTMK_NUM_HOOKS) hook = 0;
        const dtmk_u32 worker = valid ? c->worker : 0u;
        const dtmk_u32 epoch = use_epoch_override ? epoch_override : (valid ? c->decode_step : 0u);
        unsigned pending = __ballot_sync(DTMK_VM_FULL, valid && hook != 0 && T[hook].n_progs != 0);
        while (pending) {
            const dtmk_u32 h = __shfl_sync(DTMK_VM_FULL, hook, __ffs(pending) - 1);
            const bool mine = valid && hook == h;
            pending &= ~__ballot_sync(DTMK_VM_FULL, mine);
            const dtmk_u32 gen = T[h].gen >> 1;
            for (dtmk_u32 k = 0; k < T[h].n_progs; k++) {
                dtmk_u64 r0 = 0;
                int out =
#ifdef DTMK_HARNESS_COMPILED
                    H_COMPILED(T[h].progs[k])
                    ? dtmk_cm_run_prog(T[h].progs[k], h, mine, c, worker, epoch, gen, flags, &r0, &accs[warp][k]) :
#endif
                    H_VM_RUN_PROG(T[h].progs[k], code + code_off[h][k], R, mine, c, worker, epoch,
                                  gen, flags, &r0, &accs[warp][k]);
                if (mine && rep == 0) {
                    r0_out[(dtmk_u64)ev * DTMK_MAX_PROGS + k] = r0;
                    outcome_out[(dtmk_u64)ev * DTMK_MAX_PROGS + k] = (dtmk_u8)out;
                }
            }
        }
        base = nbase;
        rep = nrep;
    }
#undef H_LOAD
    if (lane == 0)                          /* the warp's coverage, counted so far */
        for (int k = 0; k < DTMK_MAX_PROGS; k++) dtmk_cov_acc_flush(&accs[warp][k]);
    }
    __syncthreads();
    if (blockIdx.x == 0 && threadIdx.x == 0) {   /* block 0's SM clock over the launch */
        status[2] = (dtmk_u64)(clock64() - c_start);
        status[3] = dtmk_globaltimer() - t_start;
    }
}

#ifndef DTMK_HARNESS_COMPILED
/* ---------------------------------------------------------------------------------- */
/* baseline: the naive switch interpreter                                              */
/* ---------------------------------------------------------------------------------- */

__device__ __forceinline__ dtmk_u64 naive_cmp(dtmk_u32 op, dtmk_u64 a, dtmk_u64 b, bool is64) {
    if (!is64) { a = (dtmk_u32)a; b = (dtmk_u32)b; }
    dtmk_s64 sa = is64 ? (dtmk_s64)a : (dtmk_s64)(int)a, sb = is64 ? (dtmk_s64)b : (dtmk_s64)(int)b;
    switch (op) {
    case 0x10: return a == b;  case 0x20: return a > b;   case 0x30: return a >= b;
    case 0x40: return (a & b) != 0; case 0x50: return a != b;
    case 0x60: return sa > sb; case 0x70: return sa >= sb; case 0xa0: return a < b;
    case 0xb0: return a <= b;  case 0xc0: return sa < sb;  case 0xd0: return sa <= sb;
    }
    return 0;
}

extern "C" __global__ void dtmk_vm_naive(const dtmk_u64 *code, const dtmk_u64 *map_addrs, const struct dtmk_ctx *events,
                                          dtmk_u64 *r0_out, dtmk_u32 n_events, dtmk_u32 n_slots,
                                          dtmk_u32 threads_per_warp, dtmk_u32 repeat) {
    const unsigned lane = threadIdx.x & 31;
    if (lane >= threads_per_warp) return;
    const dtmk_u32 gw = (blockIdx.x * blockDim.x + threadIdx.x) >> 5, nw = (gridDim.x * blockDim.x) >> 5;
    for (dtmk_u32 rep = 0; rep < repeat; rep++)
    for (dtmk_u32 ev = gw * threads_per_warp + lane; ev < n_events; ev += nw * threads_per_warp) {
        dtmk_u64 r[11];
        dtmk_u64 stack[DTMK_STACK_SIZE / 8];
        for (int i = 0; i < 11; i++) r[i] = 0;
        r[1] = (dtmk_u64)(events + ev);
        r[10] = (dtmk_u64)(stack + DTMK_STACK_SIZE / 8);
        const dtmk_u32 worker = events[ev].worker, epoch = events[ev].decode_step;
        bool lost = false, thr = false;
        dtmk_u32 pc = 0;
        for (dtmk_u32 n = 0; n < DTMK_MAX_INSNS && pc < n_slots; n++) {
            const dtmk_u64 w = code[pc];
            const dtmk_u32 opc = (dtmk_u32)(w & 0xff), d = (dtmk_u32)(w >> 8) & 15, s = (dtmk_u32)(w >> 12) & 15;
            const dtmk_s64 off = (short)(w >> 16);
            const int imm = (int)(w >> 32);
            const dtmk_u32 cls = opc & 7, op = opc & 0xf0;
            pc++;
            if (cls == 7 || cls == 4) {            /* ALU64 / ALU */
                const bool is64 = cls == 7;
                dtmk_u64 a = r[d], b = (opc & 8) ? r[s] : (dtmk_u64)(dtmk_s64)imm;
                if (!is64) { a = (dtmk_u32)a; b = (dtmk_u32)b; }
                const dtmk_u32 sh = is64 ? 63 : 31;
                dtmk_u64 v = 0;
                switch (op) {
                case 0x00: v = a + b; break;   case 0x10: v = a - b; break;
                case 0x20: v = a * b; break;   case 0x30: v = b ? a / b : 0; break;
                case 0x40: v = a | b; break;   case 0x50: v = a & b; break;
                case 0x60: v = a << (b & sh); break; case 0x70: v = a >> (b & sh); break;
                case 0x80: v = 0 - a; break;   case 0x90: v = b ? a % b : a; break;
                case 0xa0: v = a ^ b; break;   case 0xb0: v = b; break;
                case 0xc0: v = is64 ? (dtmk_u64)((dtmk_s64)a >> (b & 63)) : (dtmk_u32)((int)a >> (b & 31)); break;
                case 0xd0: {
                    const dtmk_u64 x = r[d];
                    if (opc & 8) v = imm == 16 ? __byte_perm((dtmk_u32)x, 0, 0x4401) : imm == 32 ? __byte_perm((dtmk_u32)x, 0, 0x0123) : dtmk_bswap64(x);
                    else v = imm == 16 ? (x & 0xffff) : imm == 32 ? (x & 0xffffffffull) : x;
                    r[d] = v;
                    continue; }
                }
                r[d] = is64 ? v : (dtmk_u32)v;
            } else if (cls == 5 || cls == 6) {     /* JMP / JMP32 */
                if (op == 0x90) { r0_out[ev] = r[0]; break; }
                if (op == 0x80) {
                    switch (imm) {
                    case DTMK_HELPER_MAP_LOOKUP_ELEM: r[0] = dtmk_map_lookup((const struct dtmk_map *)r[1], (const void *)r[2], worker, &lost); break;
                    case DTMK_HELPER_MAP_UPDATE_ELEM: r[0] = dtmk_map_update((const struct dtmk_map *)r[1], (const void *)r[2], (const void *)r[3], r[4], worker, &lost); break;
                    case DTMK_HELPER_MAP_DELETE_ELEM: r[0] = dtmk_map_delete((const struct dtmk_map *)r[1], (const void *)r[2], &lost); break;
                    case DTMK_HELPER_KTIME_GET_NS: r[0] = events[ev].ts_ns; break;
                    case DTMK_HELPER_GET_WORKER_ID: r[0] = worker; break;
                    case DTMK_HELPER_RINGBUF_OUTPUT: r[0] = dtmk_ringbuf_output((const struct dtmk_map *)r[1], (const void *)r[2], r[3], r[4], worker, epoch, &lost, &thr); break;
                    case DTMK_HELPER_HIST_ADD: r[0] = dtmk_hist_add((const struct dtmk_map *)r[1], (const void *)r[2], r[3], &lost); break;
                    default: r[0] = (dtmk_u64)-DTMK_EINVAL; lost = true;
                    }
                    continue;
                }
                if (op == 0x00) { pc += (dtmk_u32)off; continue; }
                const dtmk_u64 b = (opc & 8) ? r[s] : (dtmk_u64)(dtmk_s64)imm;
                if (naive_cmp(op, r[d], b, cls == 5)) pc += (dtmk_u32)off;
            } else if (opc == 0x18) {              /* lddw */
                const dtmk_u64 hi = code[pc] >> 32;
                pc++;
                if (s == 0) r[d] = (dtmk_u32)imm | (hi << 32);
                else if (s == 1) r[d] = map_addrs[(dtmk_u32)imm];
                else r[d] = ((const struct dtmk_map *)map_addrs[(dtmk_u32)imm])->values + hi;
            } else {                               /* memory */
                const dtmk_u32 sz = (opc >> 3) & 3, mode = opc & 0xe0;
                if (cls == 1) {
                    const dtmk_u64 a = r[s] + off;
                    r[d] = sz == 0 ? *(const dtmk_u32 *)a : sz == 1 ? *(const dtmk_u16 *)a
                         : sz == 2 ? *(const dtmk_u8 *)a : *(const dtmk_u64 *)a;
                } else {
                    const dtmk_u64 a = r[d] + off;
                    const dtmk_u64 v = cls == 2 ? (dtmk_u64)(dtmk_s64)imm : r[s];
                    if (mode == 0xc0) {
                        if (sz == 3) { dtmk_u64 old = __isLocal((void *)a) ? *(dtmk_u64 *)a : atomicAdd((unsigned long long *)a, v);
                                       if (__isLocal((void *)a)) *(dtmk_u64 *)a = old + v;
                                       if (imm & 1) r[s] = old; }
                        else { dtmk_u32 old = __isLocal((void *)a) ? *(dtmk_u32 *)a : atomicAdd((unsigned *)a, (dtmk_u32)v);
                               if (__isLocal((void *)a)) *(dtmk_u32 *)a = old + (dtmk_u32)v;
                               if (imm & 1) r[s] = old; }
                    } else if (sz == 0) *(dtmk_u32 *)a = (dtmk_u32)v;
                    else if (sz == 1) *(dtmk_u16 *)a = (dtmk_u16)v;
                    else if (sz == 2) *(dtmk_u8 *)a = (dtmk_u8)v;
                    else *(dtmk_u64 *)a = v;
                }
            }
        }
    }
}
#endif /* !DTMK_HARNESS_COMPILED */
