/* mk_comm.cuh: tensor parallelism of the reference megakernel, one rank per GPU.
 *
 * The lowering is graph.py's ("Tensor parallelism"; docs/dev/megakernel_contract.md).
 * Each rank runs the same persistent kernel on its shard: MkParams' shape fields
 * (n_heads, n_kv_heads, qkv_dim, ffn, expert_ffn) are the rank's local ones and gpu.py
 * remaps rope/attn head ranges to local heads, so the task bodies of mk_ops.cuh run
 * unchanged.  What this file adds (all dormant when P.ranks == 1):
 *
 *   partials   attn_o / mlp_down write their row-parallel partial sums to
 *              tp_part[l*2 + op] (op = comm op id: 0 allreduce_attn, 1 allreduce_mlp)
 *              with no residual add; MoE experts keep writing moe_part (the comm task
 *              folds the routed experts of its columns).
 *   comm task  class `allreduce` (11): copies columns lo..hi of the partial into rank
 *              q's receive slot [rank] (tp_recv[l*2+op][rank], peer memory mapped via
 *              CUDA IPC), every writing thread fences at system scope, then thread 0
 *              signals q's receive event with a system-scope release add (the own-slot
 *              task: local, also system scope -- peers add to the same counter).
 *              late_notification + late_comm defer a remote signal (worker not held):
 *              per-CTA pending slots posted at the worker's polls.
 *   consumer   the rmsnorm after an all-reduce (task word 14 = l*2+op) waits with
 *              system-scope acquire loads, then h += sum over q = 0..R-1 of slot [q]
 *              (same order on every rank: h stays bit-identical across ranks) and
 *              normalises as before.
 *   hooks      comm:signal when a signal to a peer is issued (task fields, event_id /
 *              event_gen = the peer's event and target, comm_op, comm_gen = step *
 *              n_layers + layer, peer_rank = receiver, FLAG_REMOTE); comm:wait once per
 *              consumer and step when its wait ends (event / target, comm_op, comm_gen,
 *              peer_rank = the last remote sender, wait_ns = the dependency wait);
 *              FLAG_REMOTE on ready / begin / dep:wait / dep:release of consumers and on
 *              task:end of a comm task that signals a peer (sim.py's rules).
 *
 * Device tables (gpu.py): tp_peers u64[R][2] = (events, recv) of every rank mapped in
 * this process (own entry = own buffers); events u64[2E]: counters, then per event the
 * rank of the last remote sender; ev_comm_op int32[E].
 * Functions that need the scheduler's Worker are templates (ADL finds megakernel.cu's
 * hook_event at instantiation), so this header is included before the scheduler.
 */
#ifndef DTMK_MK_COMM_CUH
#define DTMK_MK_COMM_CUH

#include "mk_ops.cuh"

#define MK_CLS_RMSNORM 0
#define MK_CLS_ALLREDUCE 11
#define F_LATE_COMM 6
#define MK_COMM_PEND 8        /* deferred comm signals per worker */

/* ---- system-scope primitives (peer GPUs read / write these locations) ---------------- */
MK_LD_U64(ld_acquire_sys, acquire, sys)
MK_LD_U64(ld_relaxed_sys, relaxed, sys)
__device__ __forceinline__ void fence_acq_rel_sys() { asm volatile("fence.acq_rel.sys;" ::: "memory"); }
__device__ __forceinline__ void red_release_sys_add(dtmk_u64 *p, dtmk_u64 v) {
    asm volatile("red.release.sys.global.add.u64 [%0], %1;" :: "l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ void st_relaxed_sys(dtmk_u64 *p, dtmk_u64 v) {
    asm volatile("st.relaxed.sys.global.u64 [%0], %1;" :: "l"(p), "l"(v) : "memory");
}

/* event counter loads of a waiter: system scope in tensor-parallel runs (receive events
 * are added to by peer GPUs), GPU scope otherwise (single-rank code path unchanged) */
__device__ __forceinline__ dtmk_u64 ev_ld_acquire(const MkParams &P, const dtmk_u64 *p) {
    return P.ranks > 1 ? ld_acquire_sys(p) : ld_acquire(p);
}
__device__ __forceinline__ dtmk_u64 ev_ld_relaxed(bool sys, const dtmk_u64 *p) {
    return sys ? ld_relaxed_sys(p) : ld_relaxed(p);
}
__device__ __forceinline__ void ev_fence_acquire(bool sys) {
    if (sys) fence_acq_rel_sys(); else fence_acquire();
}

/* ---- buffers ------------------------------------------------------------------------ */
struct MkPeer { dtmk_u64 events, recv; };

/* partial-sum buffer of all-reduce idx (= layer * 2 + comm op): [B][H] */
__device__ __forceinline__ float *tp_part(const MkParams &P, int idx) {
    return (float *)P.tp_part + (long)idx * P.batch * P.hidden;
}

/* ---- task bodies -------------------------------------------------------------------- */
/* comm task (whole CTA): columns lo..hi of this rank's partial of all-reduce idx into
 * rank q's receive slot [rank].  fold >= 0: the partial is the fold of MoE ordinal
 * `fold`'s routed expert partials (fixed order, as moe_fold).  Ends with a system-scope
 * fence by every thread (the signal that follows is thread 0's, after bar.sync). */
__device__ __noinline__ void op_comm_tile(const MkParams &P, int idx, int fold, int q, int lo, int hi) {
    int B = (int)P.batch, H = (int)P.hidden, R = (int)P.ranks, rank = (int)P.rank, n = hi - lo;
    const MkPeer *peers = (const MkPeer *)P.tp_peers;
    float *dst = (float *)(q == rank ? P.tp_recv : peers[q].recv) + ((long)idx * R + rank) * B * H;
    if (fold < 0) {
        const float *src = tp_part(P, idx);
        for (int i = threadIdx.x * 4; i < B * n; i += MK_THREADS * 4) {
            int b = i / n, c = lo + i % n;
            *(float4 *)(dst + (long)b * H + c) = __ldcg((const float4 *)(src + (long)b * H + c));
        }
    } else {
        int K = (int)P.top_k, E = (int)P.n_experts, et = (int)(P.expert_ffn / P.tile_n);
        const int *re = (const int *)P.route_expert + (long)fold * B * K;
        const float *part = (const float *)P.moe_part + (long)fold * E * et * B * H;
        for (int i = threadIdx.x; i < B * n; i += MK_THREADS) {
            int b = i / n, c = lo + i % n;
            float s = 0.0f;
            for (int k = 0; k < K; ++k) {
                int e = __ldcg(re + b * K + k);
                for (int x = 0; x < et; ++x) s += __ldcg(part + (((long)e * et + x) * B + b) * H + c);
            }
            dst[(long)b * H + c] = s;
        }
    }
    __threadfence_system();
}

/* consumer rmsnorm (whole CTA): h += sum of the R receive slots of all-reduce idx */
__device__ __noinline__ void op_tp_reduce(const MkParams &P, int idx) {
    int B = (int)P.batch, H = (int)P.hidden, R = (int)P.ranks;
    long n = (long)B * H;
    const float *rv = (const float *)P.tp_recv + (long)idx * R * n;
    float *h = (float *)P.h;
    for (long i = threadIdx.x; i < n; i += MK_THREADS) {
        float s = 0.0f;
        for (int q = 0; q < R; ++q) s += __ldcg(rv + q * n + i);
        h[i] = __ldcg(h + i) + s;
    }
    __threadfence();
    MK_SYNC();
}

/* ---- faults and flags ----------------------------------------------------------------- */
/* late_comm (faults.py): ns by which comm task t's signal to a peer is issued late
 * (rows: class column = comm op of its signal event, layer = the all-reduce's layer) */
__device__ dtmk_u64 comm_late_ns(const MkParams &P, int t, int step) {
    const int *r = (const int *)P.tasks + t * 16;
    if (r[0] != MK_CLS_ALLREDUCE || !P.n_faults || r[14] == (int)P.rank) return 0;
    int op = ((const int *)P.ev_comm_op)[r[8]], layer = r[1];
    const long long *F = (const long long *)P.faults;
    long long s = 0;
    for (int i = 0; i < (int)P.n_faults; ++i) {
        const long long *f = F + i * 8;
        if (f[0] != F_LATE_COMM || (f[1] >= 0 && f[1] != op) || (f[2] >= 0 && f[2] != layer)) continue;
        if (step < f[3] || step > f[4]) continue;
        if (f[6] < 1000000 && fault_pick((dtmk_u64)f[7], (dtmk_u32)t, (dtmk_u32)step) >= (dtmk_u32)f[6]) continue;
        s += f[5];
    }
    return s > 0 ? (dtmk_u64)s : 0;
}

/* FLAG_REMOTE of hook `hook` of the task with record r (sim.py's wflag / sflag) */
__device__ __forceinline__ dtmk_u32 tp_flags(const MkParams &P, const int *r, int hook) {
    if (r[0] == MK_CLS_RMSNORM && r[14] >= 0)              /* consumer of a receive event */
        return (hook == DTMK_HOOK_TASK_READY || hook == DTMK_HOOK_TASK_BEGIN || hook == DTMK_HOOK_DEP_WAIT ||
                hook == DTMK_HOOK_DEP_RELEASE || hook == DTMK_HOOK_COMM_WAIT) ? DTMK_FLAG_REMOTE : 0u;
    if (r[0] == MK_CLS_ALLREDUCE && r[14] != (int)P.rank)   /* comm task signalling a peer */
        return (hook == DTMK_HOOK_TASK_END || hook == DTMK_HOOK_COMM_SIGNAL) ? DTMK_FLAG_REMOTE : 0u;
    return 0u;
}

/* ---- signals (thread 0) ------------------------------------------------------------- */
struct MkCommPend {
    int task[MK_COMM_PEND], step[MK_COMM_PEND];
    dtmk_u32 flags[MK_COMM_PEND];
    dtmk_u64 due[MK_COMM_PEND];
};
__shared__ MkCommPend CPD;

__device__ __forceinline__ void comm_init() {
    for (int i = 0; i < MK_COMM_PEND; ++i) CPD.task[i] = -1;
}

/* comm:signal of comm task t (step) issued now (cold, outlined; megakernel.cu's
 * hook_event fills the record) */
template <class WK>
__device__ __noinline__ void hook_comm_signal(const MkParams &P, WK &W, int t, int step, dtmk_u32 flags) {
    const int *r = (const int *)P.tasks + t * 16;
    int e = r[8];
    hook_event(P, W, DTMK_HOOK_COMM_SIGNAL, t, step, flags, (dtmk_u32)e,
               (dtmk_u64)((const int *)P.event_triggers)[e] * (dtmk_u64)(step + 1), (dtmk_u64)0, (dtmk_u64)0,
               0u, (dtmk_u64)0, (dtmk_u32)((const int *)P.ev_comm_op)[e],
               (dtmk_u32)((dtmk_u64)step * P.n_layers + (dtmk_u64)r[1]), (dtmk_u32)r[14]);
}

/* issue comm task t's signal (its copy is complete and fenced) */
template <class WK>
__device__ void comm_issue(const MkParams &P, WK &W, int t, int step, dtmk_u32 flags) {
    const int *r = (const int *)P.tasks + t * 16;
    int e = r[8], q = r[14];
    if (q == (int)P.rank) { red_release_sys_add((dtmk_u64 *)P.events + e, 1); return; }
    dtmk_u64 *ev = (dtmk_u64 *)((const MkPeer *)P.tp_peers)[q].events;
    __threadfence_system();
    st_relaxed_sys(ev + P.n_events + e, P.rank);        /* last remote sender (comm:wait) */
    red_release_sys_add(ev + e, 1);
#ifndef DTMK_NO_HOOKS
    if (!OFFX_BIT(2) && (W.hook_mask & (1u << DTMK_HOOK_COMM_SIGNAL))) hook_comm_signal(P, W, t, step, flags);
#endif
}

/* post deferred comm signals that are due (all: force) */
template <class WK>
__device__ void comm_poll(const MkParams &P, WK &W, bool force) {
    dtmk_u64 now = mk_now();
    for (int i = 0; i < MK_COMM_PEND; ++i) {
        if (CPD.task[i] >= 0 && (force || now >= CPD.due[i])) {
            int t = CPD.task[i];
            CPD.task[i] = -1;
            comm_issue(P, W, t, CPD.step[i], CPD.flags[i]);
        }
    }
}

/* end of comm task t: signal now, or `late` (late_notification) + late_comm ns from now
 * without holding the worker (late_comm only for a peer) */
template <class WK>
__device__ void comm_post(const MkParams &P, WK &W, int t, int step, dtmk_u64 late, dtmk_u32 flags) {
    late += comm_late_ns(P, t, step);
    if (!late) { comm_issue(P, W, t, step, flags); return; }
    dtmk_u64 due = mk_now() + late;
    for (;;) {
        for (int i = 0; i < MK_COMM_PEND; ++i)
            if (CPD.task[i] < 0) { CPD.task[i] = t; CPD.step[i] = step; CPD.flags[i] = flags; CPD.due[i] = due; return; }
        comm_poll(P, W, false);          /* all slots busy: wait for the earliest */
        __nanosleep(100);
    }
}

/* comm:wait records are captured and built by megakernel.cu (hk_capture / hook_flush):
 * ts = when the worker saw the receive event ready, wait_ns = its dependency wait, peer =
 * the last remote sender (written by comm_issue before its add). */

#endif /* DTMK_MK_COMM_CUH */
