/* bpf_run_prog.cuh: one program over a warp's events, whatever executes it: sampling, rate
 * limit, the exec step, coverage.  The single body behind dtmk_vm_run_prog (bpf_vm.cuh; the
 * exec step is the interpreter, dtmk_vm_exec) and dtmk_cm_run_prog (bpf_compiled.cuh; the
 * exec step is the compiled program of the linked monitor), so the two tiers cannot differ
 * in anything but execution.
 *
 *   dtmk_run_prog<Exec>(P, eligible, ctx, worker, epoch, gen, flags, r0, acc, a...)
 *       (all 32 lanes of a warp together) -> DTMK_OUT_* of this lane's event; arguments as
 *       dtmk_vm_run_prog's (bpf_vm.cuh).  The exec step is the policy type Exec's
 *         static __device__ __forceinline__ int exec(const struct dtmk_prog &P, bool run,
 *             const void *ctx, dtmk_u32 worker, dtmk_u32 epoch, dtmk_u32 flags, dtmk_u64 *r0, A... a)
 *       called by every lane once (warp collectives allowed): runs the program for the
 *       lanes with `run`, returns their DTMK_OUT_* and DTMK_OUT_NONE for the other lanes;
 *       `a...`: the tier's own arguments, passed through.  (A static function with plain
 *       arguments rather than a lambda: a closure object changed the VM's generated code.)
 *
 * Include it where the DTMK_OUT_* codes are defined (bpf_vm.cuh; bpf_compiled.cuh, whose
 * host build has no bpf_vm.cuh).  No standard headers (NVRTC); compiles on the host too
 * (the compiled tier's g++ build, dtrace_mk/runtime/compiled/host.py: a warp of one lane).
 */
#ifndef DTMK_BPF_RUN_PROG_CUH
#define DTMK_BPF_RUN_PROG_CUH

#include "bpf_maps.cuh"

#ifndef DTMK_VM_FULL
#define DTMK_VM_FULL 0xffffffffu
#endif
#include "bpf_prog_flags.h"   /* DTMK_PROG_F_SERIAL */

template <class Exec, class... A>
__device__ __forceinline__ int dtmk_run_prog(const struct dtmk_prog &P, bool eligible, const void *ctx, dtmk_u32 worker,
                                             dtmk_u32 epoch, dtmk_u32 gen, dtmk_u32 flags, dtmk_u64 *r0,
                                             struct dtmk_cov_acc *acc, A... a) {
    const unsigned lane = threadIdx.x & 31;
    eligible = eligible && DTMK_PROG_COUNTS(P, epoch);   /* attached from a step boundary on (a window: up to one) */
    const unsigned em = __ballot_sync(DTMK_VM_FULL, eligible);
    if (!em) return DTMK_OUT_NONE;
    struct dtmk_cov *cov = (struct dtmk_cov *)P.cov;
    bool run = eligible;
    if (P.sample_every > 1) {   /* every N-th eligible event runs (tickets in lane order) */
        const int leader = __ffs(em) - 1;
        unsigned long long base = 0;
        if ((int)lane == leader) base = atomicAdd((unsigned long long *)&cov->seen, (unsigned long long)__popc(em));
        base = __shfl_sync(DTMK_VM_FULL, base, leader);
        const unsigned long long ticket = base + __popc(em & ((1u << lane) - 1u));
        run = eligible && (ticket % P.sample_every) == 0;
    }
    if (P.max_per_epoch != DTMK_NO_LIMIT) {   /* rate limit: at most N runs per epoch */
        const unsigned cand = __ballot_sync(DTMK_VM_FULL, run);
        unsigned pend = cand;
        bool granted = false;
        while (pend) {
            const int leader = __ffs(pend) - 1;
            const dtmk_u32 e = __shfl_sync(DTMK_VM_FULL, epoch, leader);
            const unsigned grp = __ballot_sync(DTMK_VM_FULL, ((cand >> lane) & 1) && epoch == e);
            pend &= ~grp;
            dtmk_u32 base = 0;
            if ((int)lane == leader) base = dtmk_rate_ticket(cov, e, (dtmk_u32)__popc(grp));
            base = __shfl_sync(DTMK_VM_FULL, base, leader);
            if ((grp >> lane) & 1)
                granted = base != DTMK_NO_LIMIT &&
                          (unsigned long long)base + __popc(grp & ((1u << lane) - 1u)) < P.max_per_epoch;
        }
        run = run && granted;
    }
    DTMK_PROF_BEGIN(prof_exec);    /* -DDTMK_OBS_PROF only (bpf_maps.cuh) */
    /* DTMK_PROG_F_SERIAL: a program that writes map values without atomics (e.g. max:
     * load, compare, store) runs its lanes one at a time in lane order (= record order),
     * as the reference does; in parallel two lanes of one key would lose an update.  One
     * call site for both ways (the exec step is large: the VM is inlined here). */
    const bool serial = (P.flags & DTMK_PROG_F_SERIAL) != 0;
    unsigned todo = serial ? __ballot_sync(DTMK_VM_FULL, run) : 0u;
    int out = DTMK_OUT_NONE;
    do {
        const int l = todo ? __ffs(todo) - 1 : -1;
        const bool mine = !serial || (int)lane == l;
        const int o = Exec::exec(P, run && mine, ctx, worker, epoch, flags, r0, a...);
        if (mine) out = o;
        todo &= todo - 1u;
        if (serial) __syncwarp();   /* this lane's map writes before the next lane's reads */
    } while (todo);
    DTMK_PROF_END(14, prof_exec);
    if (eligible && !run) out = DTMK_OUT_SAMPLED;
    const unsigned exec = __ballot_sync(DTMK_VM_FULL, out == DTMK_OUT_EXECUTED);
    const unsigned thr = __ballot_sync(DTMK_VM_FULL, out == DTMK_OUT_THROTTLED || out == DTMK_OUT_SAMPLED);
    const unsigned lost = __ballot_sync(DTMK_VM_FULL, out == DTMK_OUT_LOST || out == DTMK_OUT_FAULT);
    const unsigned fault = __ballot_sync(DTMK_VM_FULL, out == DTMK_OUT_FAULT);
    DTMK_PROF_BEGIN(prof_cov);
    dtmk_cov_add(cov, gen, epoch, em, exec, thr, lost, fault, acc);
    DTMK_PROF_END(16, prof_cov);
    return out;
}

#endif /* DTMK_BPF_RUN_PROG_CUH */
