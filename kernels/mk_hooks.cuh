/* mk_hooks.cuh: part of megakernel.cu (included once, at its place in it; not a
 * standalone header): the hook sites' cold code -- capture before the release signal,
 * records built after it (hook_flush), hook_event / hook_put, the pre-signal hold. */
/* ---- hook sites ------------------------------------------------------------------------
 * HOW TO WRITE A HOOK SITE.  Hooks are off almost always and the off path must cost
 * (almost) nothing, so a site is, on thread 0, ONE mask test and ONE call of a cold
 * __noinline__ function:
 *
 *     if (HOOK_ON(W, DTMK_HOOK_COMM_WAIT))
 *         hook_event(P, W, DTMK_HOOK_COMM_WAIT, t, step, flags, event, gen, wait_ns,
 *                    0, 0, 0, comm_op, comm_gen, peer_rank);
 *
 *   * No dtmk_ctx, clock read (%globaltimer), table load or hook-only computation at the
 *     site: pass the scalars the site already has.  hook_event fills the common and task
 *     fields (none for t < 0), reads the clock (ts_ns 0: now), and hook_put builds the
 *     record in registers and stores it (16-byte stores) into the observer's shared ring
 *     and / or the global ring, wherever the hook is enabled.
 *   * flags: the task's DTMK_FLAG_* bits, or HK_FAULTS to let hook_event compute
 *     task_faults(P, t, step).flags itself (cold).
 *   * Several hooks at one place: `if (HOOKS_ANY(W, bits)) my_cold_fn(...)` with the
 *     HOOK_ON tests inside the cold __noinline__ function (see hook_post).
 *   * A value only hooks or the trace need on the per-task path (a timer, a wait) is
 *     computed under `if (W.observe)` (one shared load per task: hook_mask | trace_on |
 *     reload pending) and kept in a Worker field, never passed through run_task.
 *   * Between a task's readiness and its release signal (its successor's critical path)
 *     a site builds nothing and calls nothing: it sets its bit in W.pend and keeps the
 *     scalars that cannot be recomputed later (stamps, waits, queue depth) in Worker
 *     fields.  hook_hold (before the signal) holds OBS_PENDING and reads what may change
 *     once the signal is out (request_gen, comm:wait's sender); hook_flush builds the
 *     records after the signal, in hook order (dep:release, task:ready, queue:pressure,
 *     comm:wait, task:dispatch, task:begin, task:end), each with its captured stamp.
 *     hook_event flushes them first, so a record built elsewhere in that window (router
 *     task:ready, comm:signal) keeps the worker's ring in time order.
 *   * -DDTMK_NO_HOOKS makes HOOK_ON / HOOKS_ANY constant 0: the site compiles away.
 */
#define HK_FAULTS 0x80000000u   /* hook_event flags: add task_faults(P, t, step).flags */
#define HK_BIT(h) (1u << DTMK_HOOK_##h)

#ifndef DTMK_NO_HOOKS
/* thread 0, cold: complete the records captured for task W.pend_t (fields cls, slot,
 * dep = r[6], a14 = r[14] of its task record, loaded by the caller in one batch): drop
 * queue:pressure without an upward threshold crossing and comm:wait of a task that is no
 * consumer of a receive event, and read what may change after the release signal
 * (request_gen; the last remote sender).  Marks W.pend_rg (bit 32) done; hook_flush
 * does it if hook_hold has not (a router's task:ready records flush before its hold). */
__device__ __forceinline__ dtmk_u32 hk_capture(const MkParams &P, Worker &W, dtmk_u32 pend, int cls, int slot, int dep,
                                               int a14) {
    if (pend & HK_BIT(QUEUE_PRESSURE)) {
        const dtmk_u32 th = (dtmk_u32)P.queue_threshold, q = W.pend_q;
        if (!(th != 0 && q - 1 < th && th <= q)) pend &= ~HK_BIT(QUEUE_PRESSURE);
    }
    if (pend & HK_BIT(COMM_WAIT)) {
        if (cls == MK_CLS_RMSNORM && a14 >= 0) {
            const int e = dep >= 0 ? dep : (int)P.step_event;
            W.cw_peer = (dtmk_u32)ld_relaxed_sys((const dtmk_u64 *)P.events + P.n_events + e);
        } else {
            pend &= ~HK_BIT(COMM_WAIT);
        }
    }
#ifndef DTMK_HOLD_EAGER
    /* no loaded program reads request_gen and no host ring takes records: not read */
    const bool rg = O.ring_mask || O.hold_full;
#else
    const bool rg = true;
#endif
    W.pend_rg = (1ull << 32) | (rg && slot >= 0 && pend ? (dtmk_u32)__ldcg((const int *)P.req_gen + slot) : DTMK_NONE_U32);
    W.pend = pend;
    return pend;
}

/* the order hook_flush builds captured records in (4-bit hook ids, lowest nibble first):
 * dep:release, task:ready, queue:pressure, comm:wait, task:dispatch, task:begin, task:end */
#define HK_ORDER ((DTMK_HOOK_DEP_RELEASE) | (DTMK_HOOK_TASK_READY << 4) | (DTMK_HOOK_QUEUE_PRESSURE << 8) | \
                  (DTMK_HOOK_COMM_WAIT << 12) | (DTMK_HOOK_TASK_DISPATCH << 16) | (DTMK_HOOK_TASK_BEGIN << 20) | \
                  (DTMK_HOOK_TASK_END << 24))

/* thread 0, cold: build the records captured for task W.pend_t (see Worker) after its
 * release signal, in hook order, each with its captured stamp; every field as it was
 * when captured.  The task's fields are loaded once; one emit site for all records. */
__device__ __noinline__ void hook_flush(const MkParams &P, Worker &W) {
#ifdef DTMK_OBS_SM
    if (!osq_is_observer()) {          /* a worker: the captured hooks go to the observer SM */
        osq_write_pend(P, W);
        osq_publish(P, W, true);
        return;
    }
#endif
    const int t = W.pend_t, step = W.pend_step;
    const int *r = hk_trec(P, t);
    const int cls = r[0], slot = r[3], dep = r[6], dep_n = r[7], sig = r[8], dyn = r[9], a14 = r[14], r15 = r[15];
    HkTask k;
    k.cls = (dtmk_u32)cls; k.index = (dtmk_u32)t; k.tile_lo = (dtmk_u32)r[10]; k.tile_hi = (dtmk_u32)r[11];
    k.slot = (dtmk_u32)slot; k.layer = (dtmk_u32)r[1]; k.expert = (dtmk_u32)r[2];
    dtmk_u32 rem = 0;                    /* hooks of this task that carry FLAG_REMOTE (mk_comm.cuh) */
#pragma unroll
    for (int h = 1; h < DTMK_NUM_HOOKS; ++h) rem |= tp_flags(P, r, h) ? 1u << h : 0u;
    dtmk_u32 pend = W.pend;
    if (!(W.pend_rg >> 32)) pend = hk_capture(P, W, pend, cls, slot, dep, a14);
    W.pend = 0;
    k.rg = (dtmk_u32)W.pend_rg;
    W.pend_rg = 0;
    /* the awaited event: the plan's dependency (a dynamic task: its MoE layer's queue event) */
    int e = dep >= 0 ? dep : (int)P.step_event;
    dtmk_u64 target = dep >= 0 ? (dtmk_u64)dep_n * (dtmk_u64)(step + 1) : (dtmk_u64)step;
    if (dyn) { e = ((const int *)P.moe)[a14 * 8 + 4]; target = (dtmk_u64)(step + 1); }
    const dtmk_u32 flags = W.pend_flags, N = DTMK_NONE_U32;
    const dtmk_u64 t_ready = W.t_ready, t_begin = W.t_begin, t_end = W.t_end, dep_wait = W.dep_wait;
#ifdef DTMK_IDEAL_SITE
    /* MEASUREMENT ONLY (bench/hooks.py variant idealsite, run mask3; no record, no
     * observer, nothing readable): the floor of a site that does the summary's three
     * updates itself -- the data-driven site of docs/dev/hook_cost_analysis.md "Session 9"
     * at its cheapest: a histogram bucket, a sum and a maximum in shared memory (the
     * observer's ring, unused without an observer), volatile so nothing is optimized out */
    {
        volatile dtmk_u32 *hist = (volatile dtmk_u32 *)O.ring;          /* [16 classes][64 buckets] */
        volatile dtmk_u64 *sum = (volatile dtmk_u64 *)(O.ring) + 16 * 64 / 2;
        volatile dtmk_u32 *qmax = (volatile dtmk_u32 *)(sum + 16);
        const dtmk_u32 c = (dtmk_u32)cls & 15u;
        if (pend & HK_BIT(TASK_END)) {
            const dtmk_u64 d = t_end - t_begin;
            hist[c * 64 + (d ? min(64 - __clzll((long long)d), 63) : 0)] += 1;
        }
        if (pend & HK_BIT(DEP_RELEASE)) sum[c] += dep_wait;
        if ((pend & HK_BIT(TASK_READY)) && W.pend_q > *qmax) *qmax = W.pend_q;
        (void)flags; (void)t_ready; (void)e; (void)target; (void)rem; (void)k;
        return;
    }
#endif
    for (dtmk_u32 o = HK_ORDER; o; o >>= 4) {
        const dtmk_u32 h = o & 15u;
        if (!(pend & (1u << h))) continue;
        dtmk_u64 ts = t_ready, gen = target, wait = 0, dur = 0;
        dtmk_u32 ev = (dtmk_u32)e, qd = 0, op = N, cg = 0, peer = N, fl = flags;
        switch (h) {
        case DTMK_HOOK_DEP_RELEASE: ts = W.ts_rel; wait = dep_wait; break;
        case DTMK_HOOK_TASK_READY:
            qd = W.pend_q;
#ifdef DTMK_DRAIN_POLL
            if (flags & DTMK_FLAG_OBS_DELAY) ts = W.t_seen;   /* seen met during a drain (obs_sync_wait_cta) */
#endif
            break;
        case DTMK_HOOK_QUEUE_PRESSURE: ev = N; gen = 0; qd = (dtmk_u32)P.queue_threshold; fl = 0; break;
        case DTMK_HOOK_COMM_WAIT:
            wait = dep_wait; op = (dtmk_u32)((const int *)P.ev_comm_op)[e];
            cg = (dtmk_u32)((dtmk_u64)step * P.n_layers + (dtmk_u64)(a14 >> 1)); peer = W.cw_peer;
            break;
        case DTMK_HOOK_TASK_DISPATCH: ts = t_begin; ev = N; gen = 0; wait = t_begin - t_ready; qd = W.phantoms; break;
        case DTMK_HOOK_TASK_BEGIN: ts = t_begin; wait = dep_wait; qd = W.phantoms; break;
        default: /* task:end */
            ts = t_end; ev = (dtmk_u32)sig; gen = (dtmk_u64)((dtmk_u32)r15 >> 1) * (dtmk_u64)(step + 1);
            wait = dep_wait; dur = t_end - t_begin;
            break;
        }
        if (rem & (1u << h)) fl |= DTMK_FLAG_REMOTE;
        DTMK_PROF_BEGIN(prof_r);
        HkRec c;
        hk_rec(c, P, W, h, ts, k, (dtmk_u32)step, ev, gen, wait, dur, qd, op, cg, peer, fl);
        hk_store(P, W, c, h, (dtmk_u32)step);
        DTMK_PROF_END1(26, prof_r);
    }
}
#endif

__device__ __noinline__ void hook_event(const MkParams &P, Worker &W, int hook, int t, int step, dtmk_u32 flags,
                                        dtmk_u32 event, dtmk_u64 event_gen, dtmk_u64 wait_ns, dtmk_u64 dur_ns = 0,
                                        dtmk_u32 queue_depth = 0, dtmk_u64 ts_ns = 0,
                                        dtmk_u32 comm_op = DTMK_NONE_U32, dtmk_u32 comm_gen = 0,
                                        dtmk_u32 peer_rank = DTMK_NONE_U32) {
    /* stamp first: the flush below takes ~1 us, and e.g. comm:signal's stamp is what the
     * collector's causal check compares the peer's release with */
    const dtmk_u64 ts = ts_ns ? ts_ns : mk_now();
#ifndef DTMK_NO_HOOKS
    if (W.pend) hook_flush(P, W);   /* records captured before this one go first (ring order = time order) */
#endif
    if (flags & HK_FAULTS) flags = (flags & ~HK_FAULTS) | (t >= 0 ? task_faults(P, t, step).flags : 0u);
    hook_put(P, W, (dtmk_u32)hook, ts, t, step, flags, event, event_gen, wait_ns, dur_ns,
             queue_depth, comm_op, comm_gen, peer_rank, 0);
}

/* thread 0: queue:pressure on an upward crossing of the threshold */
__device__ void pressure(const MkParams &P, Worker &W, int step, dtmk_u32 d0, dtmk_u32 d1, int t) {
    dtmk_u32 th = (dtmk_u32)P.queue_threshold;
    if (!HOOK_ON(W, DTMK_HOOK_QUEUE_PRESSURE) || th == 0 || !(d0 < th && th <= d1)) return;
    hook_event(P, W, DTMK_HOOK_QUEUE_PRESSURE, t, step, 0, DTMK_NONE_U32, 0, 0, 0, th);
}

/* cold, thread 0, while observing, after a task's body and before its release signal:
 * task:end (stamp t_end) joins the captured records; hk_capture reads what may change
 * once the signal is out; and when a VM program will get a record of this task after the
 * signal (captured, gen:advance of the argmax task, comm:signal of a comm task to a
 * peer), OBS_PENDING holds `step` before it (a snapshot that sees the step counter move
 * must not call the epoch final) */
#ifndef DTMK_NO_HOOKS
/* thread 0, before the release signal: OBS_PENDING holds `step` when a program will get a
 * record of this task after it (pend: the captured hooks) */
__device__ __forceinline__ void hold_epoch(const MkParams &P, Worker &W, dtmk_u32 pend, int cls, int a14,
                                           dtmk_u32 step) {
    dtmk_u32 later = pend;
    if (cls == 10) later |= HK_BIT(GEN_ADVANCE);
    if (cls == MK_CLS_ALLREDUCE && a14 != (int)P.rank) later |= HK_BIT(COMM_SIGNAL);
    if ((obs_prog_hooks() & later) && step < O.pub) {
        O.pub = step;
        *(volatile dtmk_u64 *)(obs_state(W) + OBS_PENDING) = step;
    }
}
__device__ __noinline__ void hook_hold(const MkParams &P, Worker &W, int t, dtmk_u32 step, dtmk_u64 t_end) {
    const int *r = hk_trec(P, t);
    const int cls = r[0], slot = r[3], dep = r[6], a14 = r[14];   /* one batch of loads */
    dtmk_u32 pend = W.pend | HOOKS_ANY(W, HK_BIT(TASK_END));
    W.t_end = t_end;
    if (pend) pend = hk_capture(P, W, pend, cls, slot, dep, a14);
    hold_epoch(P, W, pend, cls, a14, step);
}
#ifndef DTMK_HOLD_EAGER
/* thread 0, before the release signal, when nothing reads what hook_hold reads early
 * (O.hold_full == 0, no host ring): task:end joins the captured records and OBS_PENDING
 * holds `step` -- shared memory only, no call; hk_capture runs after the signal */
__device__ __forceinline__ void hold_light(const MkParams &P, Worker &W, int cls, int a14, dtmk_u32 step,
                                           dtmk_u64 t_end) {
    W.t_end = t_end;
    W.pend |= HOOKS_ANY(W, HK_BIT(TASK_END));
    hold_epoch(P, W, W.pend, cls, a14, step);
}
#if !defined(DTMK_IDEAL_SITE) && !(defined(DTMK_OSQ_WSHADOW) && !defined(DTMK_OBS_SM))
#define HOLD_FULL() (O.ring_mask | O.hold_full)   /* hook_hold's pre-signal work is needed */
#else
/* measurement only (idealsite; the in-CTA -DDTMK_OSQ_WSHADOW): a descriptor site reads nothing
 * before the signal (mask3's host ring would otherwise take the full hold, which the floor must
 * not count) */
#define HOLD_FULL() false
#endif
#else
#define HOLD_FULL() true
__device__ __forceinline__ void hold_light(const MkParams &, Worker &, int, int, dtmk_u32, dtmk_u64) {}
#endif
#else
__device__ __forceinline__ void hook_hold(const MkParams &, Worker &, int, dtmk_u32, dtmk_u64) {}
__device__ __forceinline__ void hold_light(const MkParams &, Worker &, int, int, dtmk_u32, dtmk_u64) {}
#define HOLD_FULL() true
#endif

/* cold, thread 0, after a task's release signal: its captured records (hook_flush),
 * gen:advance and the trace record */
__device__ __noinline__ void hook_post(const MkParams &P, Worker &W, int t, int step, dtmk_u32 flags, dtmk_u64 t_end) {
#ifndef DTMK_NO_HOOKS
    if (W.pend) hook_flush(P, W);
    W.pend_rg = 0;                       /* the next task captures afresh */
#endif
    if (hk_trec(P, t)[0] == 10 && HOOK_ON(W, DTMK_HOOK_GEN_ADVANCE)) {
        const HkTask none = hk_task(P, -1, 0);
        for (int b = 0; b < (int)P.batch; ++b) {
            /* the request that got this step's token: a refilled slot (pos 0) was gen-1 */
            const int g = __ldcg((const int *)P.req_gen + b), p = __ldcg((const int *)P.pos + b);
            HkTask k = none;
            k.slot = (dtmk_u32)b; k.rg = (dtmk_u32)(p == 0 ? g - 1 : g);
            HkRec c;
            hk_rec(c, P, W, DTMK_HOOK_GEN_ADVANCE, t_end, k, (dtmk_u32)step, DTMK_NONE_U32, 0, 0, 0, 0, DTMK_NONE_U32, 0,
                   DTMK_NONE_U32, 0);
            hk_store(P, W, c, DTMK_HOOK_GEN_ADVANCE, (dtmk_u32)step);
        }
    }
    if (W.trace_on) trace_rec(P, W, t, step, W.t_disp, W.t_begin, t_end, flags);
}
