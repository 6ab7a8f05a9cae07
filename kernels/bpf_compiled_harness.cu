/* bpf_compiled_harness.cu: the device VM's test harness (kernels/bpf_vm_harness.cu,
 * dtmk_vm_harness) with the compiled tier: a program table slot whose dtmk_prog.flags has
 * DTMK_PROG_F_COMPILED runs the compiled monitor linked into this module (dtmk_cm_run_prog,
 * kernels/bpf_compiled.cuh) instead of the interpreter; the other slots run the VM.  Same
 * arguments, shared memory layout, outputs and coverage flushing as dtmk_vm_harness, so
 * the host launches either kernel the same way and the tests compare them directly.
 *
 * Built as LTO-IR (NVRTC -dlto -rdc=true) and linked by nvJitLink with the monitor's
 * LTO-IR (dtrace_mk/runtime/compiled.py), which defines dtmk_cm_hook_<id>; the link
 * inlines the compiled programs here.  Also compiled with the empty monitor (every hook
 * function returns DTMK_OUT_FAULT) when nothing is compiled.
 */
#include "bpf_vm.cuh"
#include "bpf_compiled.cuh"

/* block = any number of whole warps; dynamic shared memory as dtmk_vm_harness:
 *   tables[DTMK_NUM_HOOKS] | code[code_cap] | regs[warps][11][32] | ctx[warps][32]
 * status[0]: hook tables skipped (odd or moving gen), status[1]: interpreted code larger
 * than code_cap */
#define H_MAX_WARPS 8       /* dtrace_mk.runtime.device.MAX_WARPS */

extern "C" __global__ void
dtmk_compiled_harness(const struct dtmk_hook_table *tables, const struct dtmk_ctx *events, dtmk_u64 *r0_out,
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
                if (!(T[h].progs[k].flags & DTMK_PROG_F_COMPILED)) used += T[h].progs[k].n_insns;
            }
        }
        T[0].n_progs = 0;
        if (used + 1 > code_cap) {   /* +1: the VM prefetches one record past the end */ ok = 0; atomicAdd((unsigned long long *)&status[1], 1ull); }
    }
    __syncthreads();
    if (!ok) return;
    for (int h = 1; h < DTMK_NUM_HOOKS; h++) {
        for (dtmk_u32 k = 0; k < T[h].n_progs; k++) {
            if (T[h].progs[k].flags & DTMK_PROG_F_COMPILED) continue;
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
#ifdef DTMK_CM_NO_VM    /* compiled-only variant (link-time measurements): hot slots do not run */
                int out = (T[h].progs[k].flags & DTMK_PROG_F_COMPILED)
                    ? dtmk_cm_run_prog(T[h].progs[k], h, mine, c, worker, epoch, gen, flags, &r0, &accs[warp][k])
                    : DTMK_OUT_NONE;
#else
                int out = (T[h].progs[k].flags & DTMK_PROG_F_COMPILED)
                    ? dtmk_cm_run_prog(T[h].progs[k], h, mine, c, worker, epoch, gen, flags, &r0, &accs[warp][k])
                    : dtmk_vm_run_prog(T[h].progs[k], code + code_off[h][k], R, mine, c, worker, epoch,
                                       gen, flags, &r0, &accs[warp][k]);
#endif
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
