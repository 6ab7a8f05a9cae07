/* mk_observer.cuh: part of megakernel.cu (included once, at its place in it; not a
 * standalone header): hook records (the 128-byte dtmk_ctx built in registers) and the
 * observer -- the per-CTA shared-memory ring of records, the device VM / compiled-tier
 * drains (obs_sync), table reloads, coverage accumulators and the OBS_PENDING epoch
 * publication; the site form's inline programs; the host streaming ring; the trace. */
/* ---- observer: the device VM at the hook sites ---------------------------------------- *
 * Per CTA in shared memory: copies of the hook tables (refreshed when the host bumps
 * control[CTL_GEN], checked with the other control words every `refresh` tasks and
 * every 16 polls of a dependency wait), a ring of OBS_RING contexts that thread 0
 * appends to at the hook sites (split evenly into one sub-ring per hook with VM
 * programs, obs_layout), the VM's register file and coverage accumulators.
 * Warp 0 drains through DTMK_RUN_RECORDS, one sub-ring at a time in 32-record VM calls
 * back to back (round 4: drains rare and large).  When: a wait that is not ready at its
 * first look, or its 16-poll spin check, finds a sub-ring O.full_at (<= 3/4) full: one
 * batch of the fullest sub-ring per 16 polls; a long wait (this one or the worker's
 * previous one lasted OBS_LONG_WAIT_NS): everything, one batch per 16 polls, starting
 * after OBS_EARLY_POLLS polls; the lowest held epoch OBS_LAG steps behind (not ready):
 * everything at once, so epochs finalise with a bounded lag; a first look (ready or
 * not) that finds a sub-ring O.must_at full (room for one task's records): everything;
 * before any table reload (records are run under the tables they were taken with) and
 * at kernel end.  Never before the first poll of a wait, never after a task.
 * Coverage is counted in one accumulator per (hook, slot); an emptied ring flushes those of epochs before the
 * worker's current step (a reload or the last drain: all) and publishes OBS_PENDING =
 * the lowest epoch still held (a record or an accumulator), so the host knows which
 * epochs are final.  A hook with no program keeps its enable bit clear. */
#ifndef DTMK_NO_HOOKS
struct __align__(16) Obs {
    struct dtmk_hook_table tabs[DTMK_NUM_HOOKS];
    struct dtmk_hook_table scratch;
    struct dtmk_ctx ring[OBS_RING];
    dtmk_u32 cnt[DTMK_NUM_HOOKS], base[DTMK_NUM_HOOKS];   /* per hook: records held, first ring index */
    dtmk_u32 cap, full_at, must_at, maxc;   /* sub-ring size; drain thresholds; max(cnt) */
    dtmk_u64 regs[DTMK_VM_NREGS * 32];
    struct dtmk_cov_acc accs[OBS_NACC];     /* per (hook, slot): a drain never flushes mid-way */
    dtmk_u64 tables, state;
    dtmk_u64 drained, drains;               /* mirrors of OBS_DRAINED / OBS_DRAINS (stored, never re-read) */
    dtmk_u32 n, gen_seen, reload, vm_mask, ring_mask;
    /* 1 in a resident launch: new tables load at a wait that is not ready (idle), or at the
     * gate of the step the host says they are due at (control[CTL_GEN_DUE], obs_sync
     * OBS_AT_GATE), never at a ready first look (the host's due step is never one a worker
     * has started, so the gate is early enough); 0: at the next first look, as they come */
    dtmk_u32 lazy;
    dtmk_u32 acc_min;                       /* lowest epoch held unflushed in accs; ~0 = none */
#ifndef DTMK_HOLD_EAGER
    /* the lazy hold (default since session 9; -DDTMK_HOLD_EAGER: always the full hook_hold;
     * docs/dev/hook_cost_analysis.md sessions 8-9): 1 when a loaded program reads request_gen
     * (context word 13, the tables' ctx_reads) or comm:wait is observed: only then does
     * hook_hold's pre-signal work run */
    dtmk_u32 hold_full;
#endif
    /* the site form (HK_SITE_FORM, kernels/bpf_inline.cuh): hooks with a slot flagged
     * DTMK_PROG_F_INLINE (a compiled program of the compiled tier, or descriptors:
     * DTMK_PROG_F_DESC) run it at the site (hk_inline), its map updates held in the shadow
     * until obs_sync's epoch flush (before the accumulators'); vm_mask then names only
     * hooks with slots that take records.  desc: every loaded descriptor program, copied
     * at table load (the site reads only these); gdesc: where each came from */
#if defined(DTMK_OBS_SM) && defined(DTMK_OSQ_DESC)
    /* -DDTMK_OSQ_DESC (observer SM, opt-in): descriptor programs run from the warp's ring
     * records into this shadow (lanes at once: dtmk_sh_get_mt), flushed into the maps only
     * when an epoch it holds may end (obs_sync).  Written because the VM's map helpers
     * cost the workers ~5% of 1b's step (session 18, bench/obs_split.py lazynomaps); exact,
     * but measured no cheaper than the VM (lazydesc +10.45% vs lazy +10.11%) */
    struct dtmk_shadow sh;
    dtmk_u32 sh_lo;                         /* no shadow entry is of an earlier epoch (~0: empty) */
#ifdef DTMK_OSQ_STATS
    dtmk_u64 desc_n;                        /* records run through descriptors (dtmk_osq_stats [10]) */
#endif
#endif
#ifdef HK_SITE_FORM
    dtmk_u32 inl_mask;
    struct dtmk_shadow sh;
#endif
#ifdef HK_DESC_COPY
    struct dtmk_desc desc[DTMK_OBS_DESC];
    dtmk_u64 gdesc[DTMK_NUM_HOOKS][DTMK_MAX_PROGS];   /* each slot's descriptors in global memory */
#endif
#ifdef HK_LEAN
    /* the lean form (-DDTMK_LEAN_SITE): hooks with lean slots; the two banks of dense cells
     * (epoch parity) and the epoch each holds (~0: empty), folded by obs_sync */
    dtmk_u32 lean_mask;
    dtmk_u32 lean_ep[2];
    dtmk_u32 lean[2][DTMK_LEAN_CELLS];
    struct dtmk_ctx lean_ctx;              /* the event's record, read by its programs */
    /* per hook, its lean slots compiled at the table's load (dtmk_lean_compile): lean_nop[h]
     * ops from lean_op[lean_op_at[h]], or DTMK_LEAN_SLOW (the descriptor walk) */
    struct dtmk_lean_op lean_op[DTMK_LEAN_OPS];
    dtmk_u8 lean_nop[DTMK_NUM_HOOKS], lean_op_at[DTMK_NUM_HOOKS];
#endif
    dtmk_u32 pub;                           /* the value last stored in OBS_PENDING (~0 = none) */
    dtmk_u64 pubs;                          /* epoch publishes (high half of OBS_DRAINS) */
    dtmk_u32 first_seen;                    /* OBS_FIRST_TS already set under this generation */
#ifdef DTMK_REC_FAST
    int rec_t;                              /* s_rec_t at the last observing first look (a static task or -1) */
#endif
#ifdef DTMK_OBS_SM
    dtmk_u32 osq_k, osq_nw;                 /* this observer warp's index, the observer warps */
#endif
#ifdef DTMK_VM_CODE_SMEM
    /* -DDTMK_VM_CODE_SMEM (variant, not measured yet; docs/dev/hook_cost_analysis.md
     * "Session 5"): the VM programs' code (+ the padding record the VM prefetches) copied
     * here at table load while it fits, so a drain fetches no instruction from global
     * memory (a null program measured 1.9 us per run, mostly such dependent trips).
     * gcode: each slot's code in global memory (the tables' insns then point here) */
    struct dtmk_dinsn code[DTMK_OBS_CODE];
    dtmk_u64 gcode[DTMK_NUM_HOOKS][DTMK_MAX_PROGS];
#endif
};
#ifdef DTMK_OBS_SM
/* the observer SM runs several observer warps, each with its own Obs: warp 0 this static
 * one (a worker CTA's only one), warp k > 0 the (k-1)th in the launch's dynamic shared
 * memory (mk_obs_sm.cuh osq_nwarps: as many as fit) */
__shared__ Obs O_w0;
__device__ __forceinline__ bool osq_is_observer() { return s_osq_obs != 0; }   /* (set at the kernel's start) */
__device__ __forceinline__ Obs &obs_self() {
    extern __shared__ float smem[];
    const unsigned k = threadIdx.x >> 5;
    return k == 0 || !osq_is_observer() ? O_w0 : ((Obs *)smem)[k - 1];
}
#define O (obs_self())
#else
__shared__ Obs O;
#endif
#if !OFFX_BIT(2)
#define HOOK_ON(W, h) ((W).hook_mask & (1u << (h)))
#define HOOKS_ANY(W, m) ((W).hook_mask & (m))
#else                                  /* (measurement only: megakernel.cu DTMK_OFFX) */
#define HOOK_ON(W, h) 0
#define HOOKS_ANY(W, m) 0
#endif
#else
#define HOOK_ON(W, h) 0
#define HOOKS_ANY(W, m) 0
#endif
#ifdef DTMK_SMEM_PAD   /* bench/hooks.py "nohooks_pad": the no-hooks code with the default build's static
                        * shared memory, to split the off cost into smem vs code; in any build, to move
                        * it into a larger shared-memory carveout (less L1) and measure what that costs */
__shared__ __align__(16) char dtmk_smem_pad[DTMK_SMEM_PAD];
#endif

/* ---- hooks ------------------------------------------------------------------------- */
#ifdef DTMK_LINKED_MONITOR
extern "C" __device__ void dtmk_monitor(const struct dtmk_ctx *ctx);  /* linked LTO-IR tier */
#endif

/* A record in registers: the 128-byte dtmk_ctx as 8 x 16 bytes (the field offsets are
 * pinned by dtrace_mk_abi.h's static_asserts).  hk_store writes it with 16-byte stores
 * straight into the observer's shared ring and / or the global ring: no local struct. */
struct HkRec { uint4 v[DTMK_CTX_SIZE / 16]; };

#if defined(DTMK_REC_FAST) && !defined(DTMK_NO_HOOKS)
__device__ __forceinline__ int hk_srec_t();           /* s_rec_t / s_rec (declared with run_task; */
__device__ __forceinline__ const int *hk_srec();      /* defined at the end of this file) */
/* hook_hold / hook_flush / hook_post only (t: the task running or just ended): task t's
 * record.  The shared copy when the last observing first look was t's wait (O.rec_t holds
 * only static tasks: a dynamic t never matches) and no wait_event has copied another record
 * since (run_task cleared s_rec_t to -1 after its body; a later wait_event sets it >= 0);
 * else the global table */
__device__ __forceinline__ const int *hk_trec(const MkParams &P, int t) {
    return O.rec_t == t && hk_srec_t() < 0 ? hk_srec() : trec(P, t);
}
#else
#define hk_trec trec
#endif

/* the task fields of a record (ctx_task of ABI v1): t >= 0 task t, else none */
struct HkTask { dtmk_u32 cls, index, tile_lo, tile_hi, slot, rg, layer, expert; };

/* thread 0, cold: task t's fields; rg bit 32 set: its request_gen (captured before the
 * release signal), else read now */
__device__ __forceinline__ HkTask hk_task(const MkParams &P, int t, dtmk_u64 rg) {
    HkTask k;
    if (t < 0) {
        k.cls = k.index = k.slot = k.rg = k.layer = k.expert = DTMK_NONE_U32; k.tile_lo = k.tile_hi = 0;
        return k;
    }
    const int *r = trec(P, t);
    const int slot = r[3];
    k.cls = (dtmk_u32)r[0]; k.index = (dtmk_u32)t; k.tile_lo = (dtmk_u32)r[10]; k.tile_hi = (dtmk_u32)r[11];
    k.slot = (dtmk_u32)slot;
    k.rg = (rg >> 32) ? (dtmk_u32)rg : slot >= 0 ? (dtmk_u32)__ldcg((const int *)P.req_gen + slot) : DTMK_NONE_U32;
    k.layer = (dtmk_u32)r[1]; k.expert = (dtmk_u32)r[2];
    return k;
}

__device__ __forceinline__ void hk_rec(HkRec &c, const MkParams &P, const Worker &W, dtmk_u32 hook, dtmk_u64 ts,
                                       const HkTask &k, dtmk_u32 step, dtmk_u32 event, dtmk_u64 event_gen,
                                       dtmk_u64 wait_ns, dtmk_u64 dur_ns, dtmk_u32 queue_depth, dtmk_u32 comm_op,
                                       dtmk_u32 comm_gen, dtmk_u32 peer_rank, dtmk_u32 flags) {
    c.v[0] = make_uint4(DTMK_ABI_VERSION, hook, (dtmk_u32)ts, (dtmk_u32)(ts >> 32));            /* +0 */
    c.v[1] = make_uint4((dtmk_u32)P.rank, W.sm, W.worker, k.cls);                               /* +16 */
    c.v[2] = make_uint4(k.index, step, k.tile_lo, k.tile_hi);                                   /* +32 task_gen */
    c.v[3] = make_uint4(k.slot, k.rg, step, k.layer);                                           /* +48 decode_step */
    c.v[4] = make_uint4(k.expert, event, (dtmk_u32)event_gen, (dtmk_u32)(event_gen >> 32));    /* +64 */
    c.v[5] = make_uint4(comm_op, comm_gen, peer_rank, queue_depth);                             /* +80 */
    c.v[6] = make_uint4((dtmk_u32)dur_ns, (dtmk_u32)(dur_ns >> 32), (dtmk_u32)wait_ns, (dtmk_u32)(wait_ns >> 32));
    c.v[7] = make_uint4(flags, 0u, 0u, 0u);                                                     /* +112 */
}

/* The hook site: thread 0, after the caller checked the mask bit. */
#ifndef DTMK_NO_HOOKS
__device__ __forceinline__ dtmk_u64 *obs_state(const Worker &W) { return (dtmk_u64 *)O.state + W.worker * OBS_WORDS; }

/* thread 0: a record the full ring cannot take is counted lost for every program of its hook */
__device__ __noinline__ void obs_lost(const Worker &W, dtmk_u32 hook, dtmk_u32 step) {
    const struct dtmk_hook_table &T = O.tabs[hook];
    for (dtmk_u32 k = 0; k < T.n_progs; ++k)
        dtmk_cov_row_add((struct dtmk_cov *)T.progs[k].cov, step, T.gen >> 1, 1, 0, 0, 1, 0);
    obs_state(W)[OBS_LOST] += 1;
}

#ifdef DTMK_OBS_SM
/* ---- observer SM (megakernel.cu "observer SM"): the queues in global memory ---- */
/* worker w's observer-state row (obs_state(W) for the observer, which serves every worker;
 * obs_state itself stays as it is: its code is the GPU-tested default build's) */
__device__ __forceinline__ dtmk_u64 *obs_row(dtmk_u32 w) { return (dtmk_u64 *)O.state + w * OBS_WORDS; }
__device__ __forceinline__ dtmk_u64 *osq_w(const MkParams &P, dtmk_u32 w) {   /* worker w's words */
    const dtmk_u32 *ctl = (const dtmk_u32 *)P.control;
    char *q = (char *)((dtmk_u64)ctl[CTL_OBSQ] | ((dtmk_u64)ctl[CTL_OBSQ + 1] << 32));
    return (dtmk_u64 *)(q + (dtmk_u64)w * OSQ_W_BYTES);
}
__device__ __forceinline__ uint4 *osq_entry_at(dtmk_u64 *a, dtmk_u64 i) {   /* entry i of the area at a */
    return (uint4 *)((char *)a + 64 + (i % OSQ_N) * 128);
}
__device__ __forceinline__ uint4 *osq_entry(const MkParams &P, dtmk_u32 w, dtmk_u64 i) {
    return osq_entry_at(osq_w(P, w), i);
}
/* worker thread 0: its own words -- kept in W (session 17: osq_w loads the control words,
 * a load on thread 0's path between tasks that misses L1 after each wait's acquire; keeping
 * the address saved ~1% of 1b's step); -DDTMK_OSQ_AREA_CTL (measurement only: bench/obs_split.py
 * areactl) finds it through the control words at each use, as before */
__device__ __forceinline__ dtmk_u64 *osq_mine(const MkParams &P, const Worker &W) {
#ifndef DTMK_OSQ_AREA_CTL
    return W.osq_area;
#else
    return osq_w(P, W.worker);
#endif
}
__device__ __forceinline__ dtmk_u64 osq_ld(const dtmk_u64 *p) { return *(const volatile dtmk_u64 *)p; }
/* observer warp (all lanes, converged): OSQ_W_LOW of every worker of its slice (w = k,
 * k + K, ...) := lo, and O.pub (the value last published) with it */
__device__ __forceinline__ void osq_publish_low(const MkParams &P, dtmk_u32 lo) {
#ifndef DTMK_OSQ_NOLOW                 /* (measurement only: the workers never see a low) */
    for (dtmk_u32 w = O.osq_k + (threadIdx.x & 31) * O.osq_nw; w < (dtmk_u32)P.n_workers; w += 32 * O.osq_nw)
        *(volatile dtmk_u64 *)(osq_w(P, w) + OSQ_W_LOW) = lo;
#endif
    __syncwarp();                      /* (every lane compared with O.pub before it moves) */
    if ((threadIdx.x & 31) == 0) O.pub = lo;
}
#ifdef DTMK_OSQ_STATS
extern "C" __device__ unsigned long long dtmk_osq_wstats[2];   /* (mk_obs_sm.cuh DTMK_OSQ_STATS) */
__device__ unsigned long long dtmk_osq_wstats[2];
#endif
/* -DDTMK_OSQ_LAZY_PUB (session 16; exact on the H200 and the CLI's --observer sm build since
 * session 17, gpu.observer_defines): a task's entry is stored
 * AFTER its release signal and its head published after the NEXT signal, whose MEMBAR then
 * finds the entry's stores long done (session 16: the workers' pushes cost 1b ~4.5% of step
 * time, the stores waited for by the signal's MEMBAR a suspect); or, fenced, by the next
 * wait's osq_raise, another push (osq_slot and osq_write_pend settle it first: it joins
 * that push's fenced publish) or the worker's end.  W.osq_unpub: the entry at W.osq_head
 * is stored, its head not yet published (tests/runtime/test_obs_sm_protocol.py, lazy:
 * osq_raise publishes before it raises) */
__device__ __forceinline__ void osq_settle(Worker &W) {    /* it joins the caller's next fenced publish */
#ifdef DTMK_OSQ_LAZY_PUB
    if (W.osq_unpub) { W.osq_unpub = 0; W.osq_head += 1; }
#endif
}
/* worker thread 0: wait until entry W.osq_head + ahead has a free slot in queue a (the observer
 * is fewer than OSQ_N entries behind it), reading the observer's tail only while it looks full
 * (-DDTMK_OSQ_STATS: waits counted).  osq_slot's wait, and the DEFER flush's per staged entry */
__device__ __forceinline__ void osq_wait_room(Worker &W, const dtmk_u64 *a, dtmk_u32 ahead) {
#ifdef DTMK_OSQ_STATS
    const long long c0 = clock64();
    bool waited = false;
#endif
    while (W.osq_head + ahead - W.osq_tail >= OSQ_N) {
        W.osq_tail = osq_ld(a + OSQ_W_TAIL);
        if (W.osq_head + ahead - W.osq_tail >= OSQ_N) {
            __nanosleep(256);
#ifdef DTMK_OSQ_STATS
            waited = true;
#endif
        }
    }
#ifdef DTMK_OSQ_STATS
    if (waited) {
        atomicAdd(&dtmk_osq_wstats[0], 1ull);
        atomicAdd(&dtmk_osq_wstats[1], (unsigned long long)(clock64() - c0));
    }
#endif
}
#ifdef DTMK_OSQ_DEFER
/* -DDTMK_OSQ_DEFER=N (session 24; with -DDTMK_OSQ_LAZY_PUB): a task's entry is staged in shared
 * memory after its release signal -- a few shared stores where the global push costs ~0.4 us
 * per task whatever its form (sessions 20-22; on the critical path of every level, whose last
 * producer is also a worker of the next) -- and stored to the queue, up to N at once behind one
 * fence and one head publish, by thread 0 when a poll of its next wait fails (it waits there
 * anyway), or at once when N are staged.  Queue order stays task order: every other push
 * (osq_slot, osq_write_pend), a raise (its epoch bound reads the queue) and the worker's end
 * flush the staged entries first. */
#if !defined(DTMK_OSQ_LAZY_PUB) || (DTMK_OSQ_DEFER) < 1 || (DTMK_OSQ_DEFER) > 16
#error "DTMK_OSQ_DEFER=N (1..16) stages the entries of the lazy publish: add DTMK_OSQ_LAZY_PUB"
#endif
__shared__ uint4 s_osq_stage[DTMK_OSQ_DEFER][6];
__shared__ dtmk_u32 s_osq_nst;             /* entries staged (worker thread 0) */
__device__ __forceinline__ void osq_defer_flush_body(const MkParams &P, Worker &W) {
    const dtmk_u32 n = s_osq_nst;
    if (!n) return;
    s_osq_nst = 0;
    osq_settle(W);                     /* (an unpublished entry is older: it joins this publish) */
    dtmk_u64 *a = osq_mine(P, W);
    for (dtmk_u32 i = 0; i < n; ++i) {
        osq_wait_room(W, a, i);
        uint4 *d = osq_entry_at(a, W.osq_head + i);
#pragma unroll
        for (int k = 0; k < 6; ++k) __stcg(d + k, s_osq_stage[i][k]);
    }
    __threadfence();                   /* the entries before their head */
    W.osq_head += n;
    *(volatile dtmk_u64 *)(a + OSQ_W_HEAD) = W.osq_head;
}
/* one called copy for the rare sites (a raise, another push, the 16th staged, the end);
 * -DDTMK_OSQ_DEFER_INLINE (measurement, session 54): the wait's failed poll runs the body
 * inline -- a call there restores its registers from local memory after the poll's acquire
 * emptied L1 (the first-look call cost ~1.4 points that way) */
__device__ __noinline__ void osq_defer_flush(const MkParams &P, Worker &W) { osq_defer_flush_body(P, W); }
#define OSQ_DEFER_FLUSH(P, W) osq_defer_flush(P, W)
#ifdef DTMK_OSQ_DEFER_INLINE
#define OSQ_WAIT_FLUSH(P, W) osq_defer_flush_body(P, W)   /* (the wait's failed poll) */
#else
#define OSQ_WAIT_FLUSH(P, W) osq_defer_flush(P, W)
#endif
#else
#define OSQ_DEFER_FLUSH(P, W) ((void)0)
#endif
/* worker thread 0: the next entry slot (waits while the observer is OSQ_N entries behind) */
__device__ __noinline__ uint4 *osq_slot(const MkParams &P, Worker &W) {
    OSQ_DEFER_FLUSH(P, W);             /* (-DDTMK_OSQ_DEFER: the staged entries are older) */
    osq_settle(W);                     /* (-DDTMK_OSQ_LAZY_PUB: the next slot is past the unpublished entry) */
    osq_wait_room(W, osq_mine(P, W), 0);
    return osq_entry_at(osq_mine(P, W), W.osq_head);
}
/* worker thread 0: the slot written becomes visible (fence: whether a MEMBAR since the
 * entry's stores ordered them already -- the release signal's -- is the caller's call) */
__device__ __forceinline__ void osq_publish(const MkParams &P, Worker &W, bool fence) {
    if (fence) __threadfence();
    W.osq_head += 1;
    *(volatile dtmk_u64 *)(osq_mine(P, W) + OSQ_W_HEAD) = W.osq_head;
}
/* worker thread 0 (-DDTMK_OSQ_LAZY_PUB): the unpublished entry published now, fenced */
__device__ __forceinline__ void osq_flush_unpub(const MkParams &P, Worker &W) {
#ifdef DTMK_OSQ_LAZY_PUB
    if (W.osq_unpub) { W.osq_unpub = 0; osq_publish(P, W, true); }
#endif
}
/* worker thread 0: task W.pend_t's captured hooks as an entry's six words (OSQ_TAG_PEND layout;
 * mk_obs_sm.cuh osq_run_entry reads it), from the CTA's W by its file-scope name: shared-memory
 * loads (through a `Worker &` they are generic loads, a dependent chain before each store) */
__device__ __forceinline__ void osq_pend_entry(uint4 (&e)[6]) {
    const Worker &S = s_worker;
    e[0] = make_uint4(OSQ_TAG_PEND, S.pend, S.pend_q, S.pend_flags);
    e[1] = make_uint4(S.cw_peer, S.phantoms, (dtmk_u32)S.pend_t, (dtmk_u32)S.pend_step);
    e[2] = make_uint4((dtmk_u32)S.pend_rg, (dtmk_u32)(S.pend_rg >> 32), (dtmk_u32)S.t_ready, (dtmk_u32)(S.t_ready >> 32));
    e[3] = make_uint4((dtmk_u32)S.t_begin, (dtmk_u32)(S.t_begin >> 32), (dtmk_u32)S.t_end, (dtmk_u32)(S.t_end >> 32));
    e[4] = make_uint4((dtmk_u32)S.dep_wait, (dtmk_u32)(S.dep_wait >> 32), (dtmk_u32)S.ts_rel, (dtmk_u32)(S.ts_rel >> 32));
    e[5] = make_uint4(S.worker, S.sm, 0u, 0u);
}
/* worker thread 0, before the release signal: task W.pend_t's captured hooks as one entry
 * (OSQ_TAG_PEND layout; mk_obs_sm.cuh osq_run_entry reads it).  A call per task on the
 * critical path; -DDTMK_OSQ_PUSH_INLINE (bench variant obssmin) inlines it into run_task */
#ifdef DTMK_OSQ_PUSH_INLINE
__device__ __forceinline__
#else
__device__ __noinline__
#endif
void osq_write_pend(const MkParams &P, Worker &W) {
    OSQ_DEFER_FLUSH(P, W);             /* (-DDTMK_OSQ_DEFER: the staged entries are older) */
    osq_settle(W);                     /* (-DDTMK_OSQ_LAZY_PUB: the next slot is past the unpublished entry) */
    /* (the observer's tail is read again only when the queue looks full: osq_slot) */
    uint4 *d = W.osq_head - W.osq_tail < OSQ_N ? osq_entry_at(osq_mine(P, W), W.osq_head) : osq_slot(P, W);
    /* every field read first, then the global stores (st.global: nothing to order against W) */
    uint4 e[6];
    osq_pend_entry(e);
#pragma unroll
    for (int k = 0; k < 6; ++k) __stcg(d + k, e[k]);
    W.pend = 0; W.pend_rg = 0;
}
#ifdef DTMK_OSQ_DEFER
/* worker thread 0, after the release signal: task W.pend_t's entry staged (osq_defer_flush) */
__device__ __forceinline__ void osq_defer_stage(const MkParams &P, Worker &W) {
    uint4 e[6];
    osq_pend_entry(e);
    const dtmk_u32 n = s_osq_nst;
#pragma unroll
    for (int k = 0; k < 6; ++k) s_osq_stage[n][k] = e[k];
    s_osq_nst = n + 1;
    W.pend = 0; W.pend_rg = 0;
    if (n + 1 == (dtmk_u32)(DTMK_OSQ_DEFER)) osq_defer_flush(P, W);
}
#endif
/* worker thread 0: OBS_PENDING up to its observer warp's low, bounded by the step of the
 * oldest entry the observer has not taken yet (a worker's entries are in step order), so
 * epochs become final while the observer lags (tests/runtime/test_obs_sm_protocol.py), and
 * by `cap`, the step of the task the worker waits for (its next records': session 54).
 * Raised past it, the next task's hold_epoch lowers OBS_PENDING again with a global store
 * right before the release signal; capped, the hold finds OBS_PENDING <= its step and
 * stores nothing.  Fewer stores, same time (bench/obs_split.py uncap16 vs defer16B, H100,
 * within the spread); -DDTMK_OSQ_RAISE_UNCAPPED: the raise as before */
__device__ __noinline__ void osq_raise(const MkParams &P, Worker &W, dtmk_u32 cap) {
    OSQ_DEFER_FLUSH(P, W);             /* (-DDTMK_OSQ_DEFER: every staged entry in the queue first) */
    osq_flush_unpub(P, W);             /* (-DDTMK_OSQ_LAZY_PUB: every entry published before a raise) */
    /* acquire: the observer fenced what it did with the entries (OSQ_W_LOW) before the tail */
    const dtmk_u64 *a = osq_mine(P, W);
    if (!O.state) return;
    const dtmk_u64 tail = ld_acquire(a + OSQ_W_TAIL);
    dtmk_u32 lo = (dtmk_u32)osq_ld(a + OSQ_W_LOW);
    if (tail != W.osq_head) {          /* entry `tail` is intact: only this thread writes its slot, after it is taken */
        const uint4 *d = osq_entry_at((dtmk_u64 *)a, tail);
        const dtmk_u32 tag = d[0].x;
        if (tag == OSQ_TAG_STEP) return;   /* (a gate's entry holds no records: wait for the next look) */
        lo = min(lo, tag == OSQ_TAG_PEND ? d[1].w : d[3].z);   /* (osq_run_entry's step of either kind) */
    }
#ifndef DTMK_OSQ_RAISE_UNCAPPED
    lo = min(lo, cap);
#endif
    if (lo == O.pub) return;
    __threadfence();                   /* the observer's flushes (fenced before low) first */
    O.pub = lo;
    *(volatile dtmk_u64 *)(obs_state(W) + OBS_PENDING) = lo == ~0u ? ~0ull : (dtmk_u64)lo;
}
#endif

/* thread 0: W.observe after any change of hook_mask, trace_on or O.reload */
__device__ __forceinline__ void obs_update(Worker &W) { W.observe = W.hook_mask | W.trace_on | O.reload; }

/* hooks whose device programs want this worker's records: through the ring (vm_mask) or,
 * in a site-form build, at the site (inl_mask) */
__device__ __forceinline__ dtmk_u32 obs_prog_hooks() {
    dtmk_u32 m = O.vm_mask;
#ifdef HK_SITE_FORM
    m |= O.inl_mask;
#endif
#ifdef HK_LEAN
    m |= O.lean_mask;
#endif
    return m;
}


/* warp 0: move ring record `lane` (valid) to index `dst`; every lane reads before any writes */
__device__ __forceinline__ void obs_move(bool valid, dtmk_u32 src, dtmk_u32 dst) {
    uint4 v[DTMK_CTX_SIZE / 16];
    if (valid) {
#pragma unroll
        for (int i = 0; i < DTMK_CTX_SIZE / 16; ++i) v[i] = ((const uint4 *)&O.ring[src])[i];
    }
    __syncwarp();
    if (valid) {
#pragma unroll
        for (int i = 0; i < DTMK_CTX_SIZE / 16; ++i) ((uint4 *)&O.ring[dst])[i] = v[i];
    }
    __syncwarp();
}

/* one thread, ring empty: split the ring evenly between the hooks of `mask` (VM programs) */
__device__ __forceinline__ void obs_layout(dtmk_u32 mask) {
    const dtmk_u32 k = __popc(mask);
    const dtmk_u32 cap = k ? OBS_RING / k : 0;
    dtmk_u32 b = 0;
    for (int h = 0; h < DTMK_NUM_HOOKS; ++h) {
        O.cnt[h] = 0; O.base[h] = b;
        if (mask & (1u << h)) b += cap;
    }
    O.cap = cap; O.maxc = 0;
#ifdef DTMK_REC_FAST
    O.rec_t = -1;                                             /* (start / reload) the global table */
#endif
    O.must_at = cap > OBS_ROOM ? cap - OBS_ROOM : 1u;          /* room for one task's records */
    O.full_at = min(cap - cap / 4, cap > 2 * OBS_ROOM ? cap - 2 * OBS_ROOM : 1u);   /* <= 3/4 full */
    if (!O.full_at) O.full_at = 1;
}

/* thread 0 at a launch's start (the observer SM: lane 0 of each observer warp, its own
 * Obs and row W.worker): the observer's state; tables load at the first drain (O.reload) */
__device__ __forceinline__ void obs_init(const MkParams &P, Worker &W) {
    const dtmk_u32 *ctl = (const dtmk_u32 *)P.control;
    O.tables = (dtmk_u64)ctl[CTL_TABLES] | ((dtmk_u64)ctl[CTL_TABLES + 1] << 32);
    O.state = (dtmk_u64)ctl[CTL_OBS] | ((dtmk_u64)ctl[CTL_OBS + 1] << 32);
    if (!O.state) O.tables = 0;
    O.n = 0; O.vm_mask = 0; O.ring_mask = 0; O.lazy = P.resident ? 1u : 0u; O.acc_min = ~0u;
#ifndef DTMK_HOLD_EAGER
    O.hold_full = 1;
#endif
    obs_layout(0u);
    O.drained = O.drains = O.pubs = 0; O.first_seen = 0; O.pub = 0;
    if (O.state) {
        const dtmk_u64 *g = obs_state(W);
        const dtmk_u64 d = g[OBS_DRAINS], pend = g[OBS_PENDING];
        O.drained = g[OBS_DRAINED]; O.drains = d & 0xffffffffull; O.pubs = d >> 32;
        O.first_seen = g[OBS_FIRST_TS] != 0;
        O.pub = pend >= 0xffffffffull ? ~0u : (dtmk_u32)pend;   /* what the host sees now */
    }
    O.gen_seen = 0xffffffffu; O.reload = O.tables ? 1u : 0u;
}

#ifdef DTMK_OBS_SM
#define OBS_RUN_WORKER(W) DTMK_WORKER_OF_CTX   /* the observer's batches mix workers */
#else
#define OBS_RUN_WORKER(W) (W).worker
#endif
#if defined(DTMK_OBS_SM) && defined(DTMK_OSQ_DESC)
/* dtmk_run_prog's exec step for a descriptor program (a = the warp's shadow, the slot) */
struct osq_desc_exec_step {
    static __device__ __forceinline__ int exec(const struct dtmk_prog &P, bool run, const void *ctx, dtmk_u32 worker,
                                               dtmk_u32 epoch, dtmk_u32, dtmk_u64 *, struct dtmk_shadow *S, dtmk_u32 slot) {
        if (!run) return DTMK_OUT_NONE;
        return dtmk_desc_run<true>((const struct dtmk_desc *)P.descs, P.n_descs, (const struct dtmk_ctx *)ctx,
                                   worker, epoch, S, slot);
    }
};
/* observer warp (all lanes): hook h's descriptor programs over up to 32 of its ring
 * records (lane l: recs[l]), their updates into the warp's shadow, coverage as the VM's
 * (dtmk_run_prog: sampling, rate limit, the same accumulators) */
__device__ __noinline__ void osq_desc_records(const struct dtmk_hook_table *tables, const struct dtmk_ctx *recs,
                                              dtmk_u32 n, struct dtmk_cov_acc *accs, dtmk_u32 h) {
    const unsigned lane = threadIdx.x & 31;
    const struct dtmk_hook_table &T = tables[h];
    const bool mine = lane < n;
    const struct dtmk_ctx *c = recs + (mine ? lane : 0);
    const dtmk_u32 epoch = mine ? c->decode_step : ~0u, worker = mine ? c->worker : 0u;
    bool any = false;
    for (dtmk_u32 k = 0; k < T.n_progs; ++k) {
        if (!(T.progs[k].flags & DTMK_PROG_F_DESC)) continue;
        dtmk_u64 r0 = 0;
        dtmk_run_prog<osq_desc_exec_step>(T.progs[k], mine, c, worker, epoch, T.gen >> 1, 0u, &r0, accs + k,
                                          &O.sh, h * DTMK_MAX_PROGS + k);
        any = true;
    }
    if (!any) return;
    const dtmk_u32 lo = __reduce_min_sync(0xffffffffu, epoch);   /* (an upper bound of none: conservative) */
    if (lane == 0 && lo < O.sh_lo) O.sh_lo = lo;
#ifdef DTMK_OSQ_STATS
    if (lane == 0) O.desc_n += n;
#endif
    __syncwarp();
}
#define OSQ_SH_LO O.sh_lo
#else
#define OSQ_SH_LO (~0u)                 /* (no shadow: the condition below folds to false) */
#endif

#ifdef HK_LEAN
/* warp 0 (obs_sync): the lean banks into the maps, emptied; whether this lane moved any.  Its
 * own function: inlined, the fold's registers raised the spills of obs_sync's callers */
__device__ __noinline__ bool obs_lean_fold(dtmk_u32 worker, unsigned lane) {
    bool moved = false;
    for (int b = 0; b < 2; ++b) {
        if (O.lean_ep[b] == ~0u) continue;
        moved |= dtmk_lean_fold(O.lean[b], O.lean_ep[b], worker, O.tabs, O.desc, O.accs, lane, 32);
        __syncwarp();
        if (lane == 0) O.lean_ep[b] = ~0u;
        __syncwarp();
    }
    return moved;
}
#endif

/* warp 0 (all 32 lanes, converged): run the ring through the VM, each hook's sub-ring in
 * 32-record VM calls back to back (within a hook in time order); `chunk`: one 32-record
 * batch of the fullest sub-ring only (a spin loop calls it again after re-polling).  Once the ring is empty: flush the coverage accumulators of
 * epochs < `step` (all on a reload or with step ~0), publish OBS_PENDING, then reload the
 * hook tables if the host published new ones. */
__device__ __noinline__ void obs_sync(const MkParams &P, Worker &W, bool chunk, dtmk_u32 step) {
    const unsigned lane = threadIdx.x & 31;
    if (step & OBS_AT_GATE) {
        /* a granted step gate with new tables pending: load them here only if due by this
         * step; a change due later (a summary window's successor, the detach of a window
         * that counts nothing more) loads in idle time, not where every worker would drain
         * and reload at once before the step's first task.  (Decided here, in a noinline
         * body: code at the gate itself raised dtmk_megakernel's spills.) */
        step &= ~OBS_AT_GATE;
        dtmk_u32 due = 0;
        if (lane == 0) {
            __threadfence();                   /* CTL_GEN (read by refresh_control) before CTL_GEN_DUE */
            due = ld_volatile_u32((const dtmk_u32 *)P.control + CTL_GEN_DUE);
        }
        if (step < __shfl_sync(0xffffffffu, due, 0)) {
            if (lane == 0) { O.reload = 0; obs_update(W); }   /* refresh_control sets it again */
            __syncwarp();
            return;
        }
    }
    dtmk_u32 n = O.n;
    dtmk_u64 *g = obs_state(W);
    const bool reload = O.reload;
    if (reload) { chunk = false; step = ~0u; }
    bool ran = false;
    if (n && lane == 0 && !O.first_seen) {            /* attach latency: first counted event */
        dtmk_u64 first = ~0ull;
        for (int h = 1; h < DTMK_NUM_HOOKS; ++h) {
            if (!O.tabs[h].n_progs) continue;
            for (dtmk_u32 i = 0; i < O.cnt[h]; ++i)
                if (O.ring[O.base[h] + i].ts_ns < first) first = O.ring[O.base[h] + i].ts_ns;
        }
        if (first != ~0ull) { g[OBS_FIRST_TS] = first; O.first_seen = 1; }
    }
    __syncwarp();
    /* one hook's sub-ring per round, in batches of 32 records (one VM call each) back to
     * back; `chunk`: one batch, then the rest of that sub-ring moves to its front */
    int hsel = 0;                                   /* chunk: the fullest sub-ring */
    if (chunk) {
        dtmk_u32 mx = 0;
        for (int h = 1; h < DTMK_NUM_HOOKS; ++h) if (O.cnt[h] > mx) { mx = O.cnt[h]; hsel = h; }
    }
    for (int h = 1; n && h < DTMK_NUM_HOOKS; ++h) {
        const dtmk_u32 c = O.cnt[h];
        if (!c || (chunk && h != hsel)) continue;
        const dtmk_u32 b = O.base[h], todo = chunk ? min(c, 32u) : c;
        for (dtmk_u32 w = 0; w < todo; w += 32) {
            DTMK_PROF_BEGIN(prof_c0);
#if defined(DTMK_OBS_SM) && defined(DTMK_OSQ_DESC)   /* (the descriptor programs first; the VM skips them) */
            osq_desc_records(O.tabs, O.ring + b + w, min(todo - w, 32u), O.accs + h * DTMK_MAX_PROGS, h);
#endif
#ifndef DTMK_OSQ_NOVM                  /* (measurement only, observer SM: records built, never run) */
            DTMK_RUN_RECORDS(O.tabs, O.ring + b + w, min(todo - w, 32u), O.regs, O.accs + h * DTMK_MAX_PROGS,
                             OBS_RUN_WORKER(W), 0);
#endif
            __syncwarp();
            if (lane == 0) DTMK_PROF_END1(8, prof_c0);
        }
        const dtmk_u32 rem = c - todo;
        DTMK_PROF_BEGIN(prof_c0);
        for (dtmk_u32 w = 0; w < rem; w += 32)          /* ascending: a batch is read before it is overwritten */
            obs_move(w + lane < rem, b + todo + w + lane, b + w + lane);
        if (lane == 0) DTMK_PROF_END1(12, prof_c0);
        n -= todo;
        if (lane == 0) {
            O.cnt[h] = rem; O.n = n; O.drained += todo; O.drains += (todo + 31) / 32;
            dtmk_u32 mx = 0;
            for (int k = 1; k < DTMK_NUM_HOOKS; ++k) mx = max(mx, O.cnt[k]);
            O.maxc = mx;
        }
        __syncwarp();
        ran = true;
        if (chunk) break;
    }
    /* "|| OSQ_SH_LO < step": the observer SM's descriptor shadow (-DDTMK_OSQ_DESC); constant false
     * elsewhere, where it stands for the observer warp's removed refusal flag (kept so the PTX stays
     * that of 1e256b7: without it NVVM orders this cold branch differently; same behaviour) */
    if (n == 0 && (ran || O.acc_min < step || OSQ_SH_LO < step)) {
        DTMK_PROF_BEGIN(prof_c0);
        dtmk_u32 keep = ~0u;
        bool flushed = false;
#if defined(DTMK_OBS_SM) && defined(DTMK_OSQ_DESC)
        /* the shadow's values into the maps (all of it) when an epoch it holds may end
         * here; otherwise its oldest epoch stays held (keep: with this flush condition and
         * two coverage ways per slot the model check finds no interleaving that needs the
         * hold; it is what would keep a later flush -- e.g. once the NEWEST entry is < step --
         * exact: tests/runtime/test_obs_sm_protocol.py desc) */
        if (O.sh_lo < step) {
#ifndef DTMK_OSQ_NOFLUSH
            flushed = dtmk_sh_flush(&O.sh, O.tabs, O.accs, lane, 32);
#else       /* measurement only (obs_split lazydescnoflush): the values dropped, no map is written */
            for (unsigned i = lane; i < DTMK_SH_N; i += 32) O.sh.e[i].map = 0;
#endif
            __syncwarp();
            if (lane == 0) O.sh_lo = ~0u;
            __syncwarp();
        }
        keep = O.sh_lo;
#endif
#ifdef HK_SITE_FORM
        /* the site form's map updates first (all epochs: moving the current one's early
         * is harmless), so an epoch's values are in before its coverage and OBS_PENDING */
        DTMK_PROF_BEGIN(prof_sh);
        flushed = dtmk_sh_flush(&O.sh, O.tabs, O.accs, lane, 32);
        __syncwarp();
        DTMK_PROF_END(30, prof_sh);
#endif
#ifdef HK_LEAN
        /* the lean banks likewise (both: the current epoch's early is harmless) */
        if ((O.lean_ep[0] & O.lean_ep[1]) != ~0u) flushed |= obs_lean_fold(W.worker, lane);
#endif
        for (int i = lane; i < OBS_NACC; i += 32) {
            struct dtmk_cov_acc *a = &O.accs[i];
            if (a->cov && a->eligible) {
                if (a->epoch < step) { dtmk_cov_acc_flush(a); flushed = true; }
                else keep = min(keep, a->epoch);
            }
        }
        keep = __reduce_min_sync(0xffffffffu, keep);
        /* fence + publish only when coverage was flushed or OBS_PENDING moves (an epoch
         * end): between epoch ends the lowest held epoch is the one already published, so
         * nothing becomes final and the map / coverage writes need no fence yet */
        if (__any_sync(0xffffffffu, flushed) || keep != O.pub) {
            __threadfence();                           /* this lane's coverage before OBS_PENDING */
            __syncwarp();
#ifdef DTMK_OBS_SM
            __threadfence();                           /* (every lane: the flushes before its stores) */
            osq_publish_low(P, keep);                  /* every worker of the slice raises its own row from it */
            if (lane == 0) O.pubs += 1;
#else
            if (lane == 0) {
                __threadfence();
                O.pub = keep;
                O.pubs += 1;
                *(volatile dtmk_u64 *)(g + OBS_PENDING) = keep == ~0u ? ~0ull : (dtmk_u64)keep;
            }
#endif
        }
        if (lane == 0) {
            O.acc_min = keep;
            g[OBS_DRAINED] = O.drained;
            g[OBS_DRAINS] = (O.drains & 0xffffffffull) | (O.pubs << 32);
        }
        __syncwarp();
        if (lane == 0) DTMK_PROF_END1(10, prof_c0);
    }
    if (lane == 0 && reload && n == 0) {
        const dtmk_u32 gen = ld_volatile_u32((const dtmk_u32 *)P.control + CTL_GEN);
        const struct dtmk_hook_table *gt = (const struct dtmk_hook_table *)O.tables;
        bool ok = true;
        dtmk_u32 mask = 0, inl = 0, lean = 0;  /* hooks whose slots take records / run inline / lean */
        for (int h = 1; h < DTMK_NUM_HOOKS; ++h) {
            if (*(volatile const dtmk_u32 *)&gt[h].gen != O.tabs[h].gen) {
                if (dtmk_vm_load_table(gt + h, &O.scratch)) {
                    O.tabs[h] = O.scratch;
#ifdef HK_DESC_COPY
                    for (dtmk_u32 k = 0; k < O.tabs[h].n_progs; ++k) O.gdesc[h][k] = O.tabs[h].progs[k].descs;
#endif
#ifdef DTMK_VM_CODE_SMEM
                    for (dtmk_u32 k = 0; k < O.tabs[h].n_progs; ++k) O.gcode[h][k] = O.tabs[h].progs[k].insns;
#endif
                } else {
                    ok = false;                       /* being written: keep the old copy, retry */
                }
            }
#ifdef HK_SITE_FORM
            for (dtmk_u32 k = 0; k < O.tabs[h].n_progs; ++k) {
#ifdef HK_LEAN
                if (O.tabs[h].progs[k].flags & DTMK_PROG_F_LEAN) lean |= 1u << h;
                else
#endif
                if (O.tabs[h].progs[k].flags & DTMK_PROG_F_INLINE) inl |= 1u << h;
                else mask |= 1u << h;
            }
#else       /* no site form: every slot takes records; one the host flagged for the site runs its code in the VM */
#ifdef HK_LEAN   /* lean slots keep their flags and run at the site (dtmk_lean_event); the rest take records */
            for (dtmk_u32 k = 0; k < O.tabs[h].n_progs; ++k) {
                if (O.tabs[h].progs[k].flags & DTMK_PROG_F_LEAN) { lean |= 1u << h; continue; }
                O.tabs[h].progs[k].flags &= ~(DTMK_PROG_F_INLINE | DTMK_PROG_F_DESC);
                mask |= 1u << h;
            }
#else
            for (dtmk_u32 k = 0; k < O.tabs[h].n_progs; ++k)
#if defined(DTMK_OBS_SM) && defined(DTMK_OSQ_DESC)
                /* descriptor programs keep both flags (the VM skips them, osq_desc_records runs
                 * them) and run their lanes at once: the shadow's updates are atomic */
                if (O.tabs[h].progs[k].flags & DTMK_PROG_F_DESC) O.tabs[h].progs[k].flags &= ~DTMK_PROG_F_SERIAL;
                else
#endif
                O.tabs[h].progs[k].flags &= ~(DTMK_PROG_F_INLINE | DTMK_PROG_F_DESC);
            if (O.tabs[h].n_progs) mask |= 1u << h;
#endif
#endif
        }
#ifdef DTMK_VM_CODE_SMEM
        /* lay every program's code out again (the ring is empty: no drain reads it now);
         * a program that does not fit keeps running from global memory */
        dtmk_u32 used = 0;
        for (int h = 1; h < DTMK_NUM_HOOKS; ++h) {
            for (dtmk_u32 k = 0; k < O.tabs[h].n_progs; ++k) {
                struct dtmk_prog &pg = O.tabs[h].progs[k];
                const dtmk_u32 n = pg.n_insns + 1;
                pg.insns = O.gcode[h][k];
                if (used + n > DTMK_OBS_CODE) continue;
                const struct dtmk_dinsn *src = (const struct dtmk_dinsn *)O.gcode[h][k];
                for (dtmk_u32 i = 0; i < n; ++i) O.code[used + i] = src[i];
                pg.insns = (dtmk_u64)(O.code + used);
                used += n;
            }
        }
#endif
        /* every descriptor program into shared memory again, from its global copy (the
         * shadow is empty here): the site reads descriptors only from here (desc_at).  The
         * host keeps the sum of all entries within DTMK_OBS_DESC (runtime/descform.py
         * DESC_CAP); one that did not fit would count its events lost, never read garbage */
#ifdef HK_DESC_COPY
        dtmk_u32 nd = 0;
        for (int h = 1; h < DTMK_NUM_HOOKS; ++h) {
            for (dtmk_u32 k = 0; k < O.tabs[h].n_progs; ++k) {
                struct dtmk_prog &pg = O.tabs[h].progs[k];
                pg.desc_at = 0;
                if (!(pg.flags & DTMK_PROG_F_DESC) || nd + pg.n_descs > DTMK_OBS_DESC) continue;
                const struct dtmk_desc *src = (const struct dtmk_desc *)O.gdesc[h][k];
                for (dtmk_u32 i = 0; i < pg.n_descs; ++i) O.desc[nd + i] = src[i];
                pg.desc_at = (dtmk_u16)(nd + 1);
                nd += pg.n_descs;
            }
        }
#endif
#ifdef HK_LEAN
        {
            dtmk_u32 no = 0;
            for (int h = 1; h < DTMK_NUM_HOOKS; ++h) {
                const dtmk_u32 n = (lean >> h) & 1u ? dtmk_lean_compile(O.tabs[h], O.desc, O.lean_op + no, DTMK_LEAN_OPS - no)
                                                    : 0u;
                O.lean_op_at[h] = (dtmk_u8)no;
                O.lean_nop[h] = (dtmk_u8)n;
                if (n != DTMK_LEAN_SLOW) no += n;
            }
        }
#endif
        O.vm_mask = mask;
        obs_layout(mask);                             /* the ring is empty here */
#ifndef DTMK_HOLD_EAGER
        {
            dtmk_u32 reads = 0;
            for (int h = 1; h < DTMK_NUM_HOOKS; ++h) if (O.tabs[h].n_progs) reads |= O.tabs[h].ctx_reads;
            O.hold_full = ((reads >> 13) & 1u) || ((mask | inl | lean) & (1u << DTMK_HOOK_COMM_WAIT)) ? 1u : 0u;
        }
#endif
#ifdef HK_SITE_FORM
        O.inl_mask = inl;                             /* the shadow is empty here (flushed above) */
#endif
#ifdef HK_LEAN
        O.lean_mask = lean;                           /* the banks are empty here (folded above) */
#endif
        W.hook_mask = O.ring_mask | mask | inl | lean;
        if (ok) {
            O.gen_seen = gen;
            O.reload = 0;
            O.first_seen = 0;
            g[OBS_FIRST_TS] = 0;
            g[OBS_LOADED_TS] = mk_now();
            *(volatile dtmk_u64 *)(g + OBS_GEN) = gen;
        }
        obs_update(W);
    }
    __syncwarp();
}
#ifdef DTMK_DRAIN_POLL
/* The drain's poller (the default of the workers' hook builds since session 48; off with
 * -DDTMK_NO_DRAIN_POLL, megakernel.cu).  A drain inside a dependency wait (a 32-record batch:
 * ~10-15 us) runs on warp 0, whose thread 0 is the wait's only poller: an event met meanwhile
 * is seen only at the drain's end, so task:ready and dep:release came late by up to a batch
 * and the monitor's own cost read as the producer's notification lag (session 46's fault-free
 * late_notification findings two steps after each summary-window park).  Here warp 1's lane 0
 * polls the awaited event while warp 0 drains and stamps s_seen when it is met; the task
 * carries DTMK_FLAG_OBS_DELAY, task:ready and dep:release that stamp (W.t_seen).  The task
 * still starts after the drain: that delay is the monitor's and stays in the timeline (ready
 * -> dispatch stamps), out of the dispatch wait.  Measured (H100, docs/results/hooks.md
 * "Session 47", "Session 48"): relaxed loads 200 ns apart, fault-free serving verdict none in
 * tiny 5 of 6 / 1b 6 of 6 (without: tiny fault 5 of 6); the 1b step's period +0.7%, the same
 * with 50 ns or no pause (not the pause, not the loads); acquire loads +2.6%. */
/* the poller's pause between loads (ns; 0: back to back) */
#ifndef DTMK_DRAIN_POLL_NS
#define DTMK_DRAIN_POLL_NS 200
#endif
__shared__ dtmk_u64 s_seen;                    /* 0: not seen met during a drain (thread 0 clears) */
__shared__ volatile dtmk_u32 s_drain_busy;     /* set by thread 0 before the drain's barrier, cleared by
                                                * warp 0 after the drain: the poller stops */
/* the wait's counter and target, set by thread 0 at its first look: read here, not passed as
 * arguments (which cost wait_event spill loads) */
__shared__ const dtmk_u64 *s_poll_ev;
__shared__ dtmk_u64 s_poll_target;
/* the poller (warp 1's lane 0) until warp 0's drain ends or the event is met (s_seen: when).
 * Relaxed loads DTMK_DRAIN_POLL_NS apart: the poller only stamps the moment (thread 0's next
 * poll is the acquire that orders the task after the event).  -DDTMK_DRAIN_POLL_ACQ: a66c5f7's
 * back-to-back acquire loads -- they slowed the drain beside them (H100: 1b's serving step
 * +2.6..3.0%, tiny's +5.6..9%; suspected: an acquire load invalidates the SM's L1, where the
 * VM's map lines sit) */
__device__ __forceinline__ void drain_poll(const MkParams &P, const dtmk_u64 *ev, const dtmk_u64 target) {
    while (s_drain_busy) {
#ifdef DTMK_DRAIN_POLL_ACQ
        const dtmk_u64 v = ev_ld_acquire(P, ev);
#else
        const dtmk_u64 v = ev_ld_relaxed(P.ranks > 1, ev);
#endif
        if (v >= target) { s_seen = mk_now(); break; }
#if !defined(DTMK_DRAIN_POLL_ACQ) && DTMK_DRAIN_POLL_NS > 0
        __nanosleep(DTMK_DRAIN_POLL_NS);
#endif
    }
}
#ifdef DTMK_GATE_POLL
/* -DDTMK_GATE_POLL (opt-in: on two H100s, session 49, it cost nothing, and the spikes it aims
 * at did not appear with or without it -- nothing to gain shown): a
 * resident step gate's drain for new tables (OBS_AT_GATE; the kernel set s_drain_busy) -- the
 * other workers run the step already, so the poller watches this worker's first static task's
 * event (the plan loop's event and target), and that task's first look takes s_seen (session
 * 48: fault-free tiny's remaining qkv lag spikes sat at the steps new tables were due) */
__device__ __noinline__ void gate_poll(const MkParams &P, const Worker &W, dtmk_u32 step) {
    const int p0 = ((const int *)P.plan_off)[W.worker], p1 = ((const int *)P.plan_off)[W.worker + 1];
    if (p0 >= p1) return;
    const int *r = trec(P, ((const int *)P.plan_tasks)[p0]);
    const int e = r[6];
    drain_poll(P, (const dtmk_u64 *)P.events + (e >= 0 ? e : (int)P.step_event),
               e >= 0 ? (dtmk_u64)r[7] * (dtmk_u64)(step + 1) : (dtmk_u64)step);
}
#endif
#endif
/* whole CTA calls it (a uniform call site: no divergence bookkeeping in the hot caller) */
__device__ __noinline__ void obs_sync_cta(const MkParams &P, Worker &W, bool chunk, dtmk_u32 step) {
    DTMK_PROF_BEGIN(prof_c0);
#ifndef DTMK_GATE_POLL
    if (threadIdx.x < 32) obs_sync(P, W, chunk, step);
#else
    if (threadIdx.x < 32) {
        obs_sync(P, W, chunk, step);
        if (threadIdx.x == 0) s_drain_busy = 0;
    } else if (threadIdx.x == 32 && (step & OBS_AT_GATE)) {
        gate_poll(P, W, step & ~OBS_AT_GATE);
    }
#endif
#ifdef DTMK_OBS_PROF
    if (threadIdx.x == 0) { DTMK_PROF_END1(chunk ? 0 : 2, prof_c0); s_prof_drain = clock64() - prof_c0; }
#endif
}
#define OBS_SYNC_IF(cond, chunk, step) do { if (cond) obs_sync_cta(P, W, chunk, step); } while (0)
#ifdef DTMK_DRAIN_POLL
/* obs_sync_cta inside a dependency wait (poll: the event is not known met): the poller runs */
__device__ __noinline__ void obs_sync_wait_cta(const MkParams &P, Worker &W, bool chunk, dtmk_u32 step, bool poll) {
    DTMK_PROF_BEGIN(prof_c0);
    if (threadIdx.x < 32) {
        obs_sync(P, W, chunk, step);
        if (threadIdx.x == 0) s_drain_busy = 0;
    } else if (threadIdx.x == 32 && poll) {
        drain_poll(P, s_poll_ev, s_poll_target);
    }
#ifdef DTMK_OBS_PROF
    if (threadIdx.x == 0) { DTMK_PROF_END1(chunk ? 0 : 2, prof_c0); s_prof_drain = clock64() - prof_c0; }
#endif
}
#define OBS_SYNC_WAIT_IF(cond, chunk, step, poll) do { if (cond) obs_sync_wait_cta(P, W, chunk, step, poll); } while (0)
#else
#define OBS_SYNC_WAIT_IF(cond, chunk, step, poll) OBS_SYNC_IF(cond, chunk, step)
#endif
/* the lowest epoch held (published) is OBS_LAG or more steps behind `step`: drain all */
#define OBS_LAGGING(step) (O.pub < (dtmk_u32)(step) && (dtmk_u32)(step) - O.pub >= OBS_LAG)
/* cold, thread 0, while observing, at a wait's first look (rd: ready): 2 when the ring
 * must be drained at once (nearly full, or new tables: at a ready look only without step
 * gates, O.lazy).  A ring of OBS_FULL_AT.. records
 * waits for the spin (not ready) or the next wait (ready): no drain on the critical path. */
__device__ __noinline__ int obs_first_look(Worker &W, int rd, dtmk_u32 step) {
#ifdef DTMK_OBS_SM
    if (rd) W.long_wait = 0;
    return 0;                          /* workers drain nothing: the observer SM does */
#endif
#ifdef DTMK_REC_FAST
    O.rec_t = hk_srec_t();                                  /* s_rec holds this static task's record */
    if (rd) W.long_wait = 0;
    /* no device observer (hooks to the global ring only, e.g. bench mask3): nothing to drain
     * or reload.  The default build returns 2 here at every non-ready first look of steps
     * >= OBS_LAG: O.pub stays 0 without observer state, so OBS_LAGGING is always true and
     * warp 0 calls an empty obs_sync before the spin */
    if (!O.tables) return 0;
#else
    if (rd) W.long_wait = 0;
#endif
    if (O.maxc >= O.must_at || (O.reload && (!rd || !O.lazy))) return 2;   /* all at once */
    if (!rd && OBS_LAGGING(step)) return 2;               /* bounded epoch lag: all, publish */
    /* the site form: the shadow holds an earlier epoch -> flush it in this idle wait
     * (every step: ~40 entries per worker and step, the 128-entry shadow would overflow
     * into the global helpers within OBS_LAG steps) */
#ifdef HK_SITE_FORM
    if (!rd && O.inl_mask && O.acc_min < step) return 2;
#endif
#ifdef HK_LEAN
    /* the lean banks: the same; and, ready or not, when the bank the next epoch takes still
     * holds one before this wait's step (no idle wait folded it: hk_lean's comment) */
    if (O.lean_mask && ((!rd && O.acc_min < step) || O.lean_ep[(step + 1u) & 1u] < step)) return 2;
#endif
    return (!rd && O.maxc >= O.full_at) ? 4 : 0;            /* not ready, 3/4 full: one batch now */
}
/* cold, thread 0, every 16th poll of a wait while observing: leave the spin to drain? */
#ifndef DTMK_OBS_SM                   /* (its workers drain nothing: osq_raise in the spin) */
__device__ __noinline__ bool obs_spin_drain(const Worker &W, dtmk_u64 waited, dtmk_u32 step) {
    return O.maxc >= O.full_at ||
           ((O.n || O.acc_min < step) && (W.long_wait || waited >= OBS_LONG_WAIT_NS || OBS_LAGGING(step)));
}
#endif
#else
#define OBS_SYNC_IF(cond, chunk, step) do { } while (0)
#define OBS_SYNC_WAIT_IF(cond, chunk, step, poll) do { } while (0)
#endif

#if defined(HK_SITE_FORM) || defined(HK_LEAN)
/* thread 0, after an event counted at the site (hk_inline, hk_lean): its epoch held in
 * OBS_PENDING as a ring record's is, and the attach latency's first counted event (ts) */
__device__ __forceinline__ void hk_site_held(Worker &W, dtmk_u32 step, dtmk_u64 ts) {
    if (step < O.acc_min) O.acc_min = step;
    if (O.acc_min < O.pub) {
        O.pub = O.acc_min;
        *(volatile dtmk_u64 *)(obs_state(W) + OBS_PENDING) = O.acc_min;
    }
    if (!O.first_seen) { obs_state(W)[OBS_FIRST_TS] = ts; O.first_seen = 1; }
}
#endif

#ifdef HK_SITE_FORM
#if defined(DTMK_INL_PROBE) && defined(DTMK_OBS_PROF)
__device__ __noinline__ void hk_probe_empty() { asm volatile(""); }
#endif
/* the hook's site-form programs (descriptors; compiled inline) over the context in the
 * shadow's scratch, inlined into the site.  Session 9 made it one noinline copy for code
 * size (1.16 -> 1.08 us per event); session 10 measured the call itself on 1b
 * (the inlined form, then a variant, same run): hot summary +43.2 -> +36.2%, compiled +37.4 ->
 * +29.3%, a null program +25.7 -> +20.8% over off -- the call's ABI saves / restores go
 * to local memory, whose lines miss L1 on the busy SM (docs/dev/hook_cost_analysis.md
 * "Session 10").  -DDTMK_INL_NOINLINE (bench variant inlcall): the call again */
#ifdef DTMK_INL_NOINLINE   /* (bench variant inlcall: session 9's one noinline copy) */
__device__ __noinline__
#else
__device__ __forceinline__
#endif
void hk_inline_run(Worker &W, dtmk_u32 hook, dtmk_u32 step) {
    dtmk_inl_event(O.tabs[hook], hook, &O.sh.ctx, W.worker, step, 0u, &O.sh, O.accs + hook * DTMK_MAX_PROGS, 0, 0,
                   O.desc);
}
/* thread 0 (in the cold hk_store callers): record c through the hook's inline programs (kernels/bpf_inline.cuh):
 * no ring slot, no drain; map updates into the shadow, coverage into O.accs, both
 * flushed by obs_sync.  Holds OBS_PENDING <= step as a ring record does (hook_hold held
 * it before the task's release signal when the record comes after it). */
__device__ __forceinline__ void hk_inline(Worker &W, const HkRec &c, dtmk_u32 hook, dtmk_u32 step) {
    DTMK_PROF_BEGIN(prof_i);
#pragma unroll
    for (int i = 0; i < DTMK_CTX_SIZE / 16; ++i) ((uint4 *)&O.sh.ctx)[i] = c.v[i];
    hk_inline_run(W, hook, step);
    DTMK_PROF_END1(28, prof_i);
#if defined(DTMK_INL_PROBE) && defined(DTMK_OBS_PROF)
    /* profiling only (maps count each event twice): the same event again at once (code
     * and data now warm) -> [20, 21]; an empty noinline call -> [22, 23] */
    { DTMK_PROF_BEGIN(prof_i2); hk_inline_run(W, hook, step); DTMK_PROF_END1(20, prof_i2); }
    { DTMK_PROF_BEGIN(prof_i3); hk_probe_empty(); DTMK_PROF_END1(22, prof_i3); }
#endif
    hk_site_held(W, step, O.sh.ctx.ts_ns);
}
#endif

#ifdef HK_LEAN
/* thread 0 (hk_store): record c through the hook's lean programs into the bank of its epoch;
 * holds OBS_PENDING <= step as hk_inline does.  A bank still holding another epoch is not
 * folded here (a call from the site raised run_task's spills, as the site form's did): a
 * wait's first look folds the bank the next epoch takes as soon as it holds one before the
 * wait's step (obs_first_look), so an event finds its bank empty or its own; were it not -- one
 * wait taking dynamic tasks of steps s - 1 and s + 1 after its first look at s could do it --
 * the event is counted lost (coverage shows it), never put in another epoch's cells */
__device__ __forceinline__ void hk_lean(Worker &W, const HkRec &c, dtmk_u32 hook, dtmk_u32 step) {
    DTMK_PROF_BEGIN(prof_i);             /* (-DDTMK_OBS_PROF: counters 28, 29 as hk_inline's; the walk's
                                          * parts with -DDTMK_LEAN_SPLIT: bpf_inline.cuh) */
    const dtmk_u32 b = step & 1u;
    if (O.lean_ep[b] == ~0u) O.lean_ep[b] = step;
    /* the record into shared memory, read there by byte offset: a reader of the registers (a
     * switch per field read) made ~40 KB of SASS per inlined copy, fetched afresh per event
     * (session 63: ~1 us per event on 1b, bench/level_profile.py's post time) */
#pragma unroll
    for (int i = 0; i < DTMK_CTX_SIZE / 16; ++i) ((uint4 *)&O.lean_ctx)[i] = c.v[i];
    const struct dtmk_ctx_reader rd = {&O.lean_ctx};
#ifndef DTMK_LEAN_NOEVENT   /* MEASUREMENT ONLY (session 63): everything but the programs and their coverage */
    dtmk_lean_hook(O.lean_op + O.lean_op_at[hook], O.lean_nop[hook], O.tabs[hook], rd, W.worker, step,
                   O.lean_ep[b] == step ? O.lean[b] : 0, O.accs + hook * DTMK_MAX_PROGS, O.desc);
#else
    (void)rd;
#endif
    hk_site_held(W, step, (dtmk_u64)c.v[0].w << 32 | c.v[0].z);
    DTMK_PROF_END1(28, prof_i);
}
#endif

/* cold, thread 0: publish record c of `hook` (epoch `step`): linked monitor, the
 * observer's shared ring when a VM program of the hook wants it (counted lost when the
 * ring is full), the global ring when the hook is enabled there (else no copy) */
__device__ __forceinline__ void hk_store(const MkParams &P, Worker &W, const HkRec &c, dtmk_u32 hook, dtmk_u32 step) {
#ifdef DTMK_OBS_SM
    if (!osq_is_observer()) {          /* a worker: the record goes to the observer, whole */
        uint4 *d = osq_slot(P, W);
#pragma unroll
        for (int i = 0; i < DTMK_CTX_SIZE / 16; ++i) d[i] = c.v[i];
        osq_publish(P, W, true);
        return;
    }
#endif
#ifdef DTMK_LINKED_MONITOR
    {
        struct dtmk_ctx loc;
#pragma unroll
        for (int i = 0; i < DTMK_CTX_SIZE / 16; ++i) ((uint4 *)&loc)[i] = c.v[i];
        dtmk_monitor(&loc);
    }
#endif
#ifndef DTMK_NO_HOOKS
    const dtmk_u32 bit = 1u << hook;
#ifdef HK_LEAN
    if (O.lean_mask & bit) hk_lean(W, c, hook, step);
#endif
#ifdef HK_SITE_FORM
    if (O.inl_mask & bit) hk_inline(W, c, hook, step);
#endif
#ifdef DTMK_OBS_SM
    if (O.vm_mask & bit) {             /* an observer lane; its round (osq_observer) checked the room */
        const dtmk_u32 cn = atomicAdd(&O.cnt[hook], 1u);
        if (cn < O.cap) {
            uint4 *d = (uint4 *)&O.ring[O.base[hook] + cn];
#pragma unroll
            for (int i = 0; i < DTMK_CTX_SIZE / 16; ++i) d[i] = c.v[i];
            atomicAdd(&O.n, 1u);
            atomicMax(&O.maxc, cn + 1);
            W.osq_lo = min(W.osq_lo, step);    /* the round lowers OSQ_W_LOW before the tails */
        } else {
            atomicSub(&O.cnt[hook], 1u);
            obs_lost(W, hook, step);
        }
    }
#else
    if (O.vm_mask & bit) {
        const dtmk_u32 cn = O.cnt[hook];
        if (cn < O.cap) {
            uint4 *d = (uint4 *)&O.ring[O.base[hook] + cn];
#pragma unroll
            for (int i = 0; i < DTMK_CTX_SIZE / 16; ++i) d[i] = c.v[i];
            /* OBS_PENDING (lowest epoch held) only moves down here; a record built after
             * its task's release signal had it held by hook_hold before the signal;
             * obs_sync moves it up once the ring is empty */
            const dtmk_u32 lo = min(step, O.acc_min);
            if (lo < O.pub) {
                O.pub = lo;
                *(volatile dtmk_u64 *)(obs_state(W) + OBS_PENDING) = lo;
            }
            O.cnt[hook] = cn + 1; O.n += 1;
            if (cn >= O.maxc) O.maxc = cn + 1;
        } else {
            obs_lost(W, hook, step);
        }
    }
#endif
    if (!(O.ring_mask & bit)) return;
#endif
    /* streaming ring: hook_head = records stored; slot n % cap (W.hook_slot: no 64-bit
     * modulo per record) while the host's tail (consumed, 0 outside resident launches)
     * leaves room, else counted in hook_drop */
    const dtmk_u64 n = W.hook_n;
    if (n - W.hook_tail < P.hook_cap) {
        const dtmk_u64 slot = W.hook_slot;
        uint4 *dst = (uint4 *)((char *)P.hook_ring + ((dtmk_u64)W.worker * P.hook_cap + slot) * DTMK_CTX_SIZE);
#pragma unroll
        for (int i = 0; i < DTMK_CTX_SIZE / 16; ++i) dst[i] = c.v[i];
        W.hook_slot = slot + 1 == P.hook_cap ? 0 : slot + 1;
        W.hook_n = n + 1;
    } else {
        W.hook_drop += 1;
    }
}

/* cold, thread 0: build and publish one record (ts given: no clock read here); t >= 0:
 * the task fields of t (request_gen: rg, see hk_task) and FLAG_REMOTE (mk_comm.cuh) */
__device__ __forceinline__ void hk_put_rec(const MkParams &P, Worker &W, dtmk_u32 hook, dtmk_u64 ts, int t, int step,
                                           dtmk_u32 flags, dtmk_u32 event, dtmk_u64 event_gen, dtmk_u64 wait_ns,
                                           dtmk_u64 dur_ns, dtmk_u32 queue_depth, dtmk_u32 comm_op, dtmk_u32 comm_gen,
                                           dtmk_u32 peer_rank, dtmk_u64 rg) {
    const HkTask k = hk_task(P, t, rg);
    if (t >= 0) flags |= tp_flags(P, trec(P, t), (int)hook);
    HkRec c;
    hk_rec(c, P, W, hook, ts, k, (dtmk_u32)step, event, event_gen, wait_ns, dur_ns, queue_depth, comm_op, comm_gen,
           peer_rank, flags);
    hk_store(P, W, c, hook, (dtmk_u32)step);
}
__device__ __noinline__ void hook_put(const MkParams &P, Worker &W, dtmk_u32 hook, dtmk_u64 ts, int t, int step,
                                      dtmk_u32 flags, dtmk_u32 event, dtmk_u64 event_gen, dtmk_u64 wait_ns,
                                      dtmk_u64 dur_ns, dtmk_u32 queue_depth, dtmk_u32 comm_op, dtmk_u32 comm_gen,
                                      dtmk_u32 peer_rank, dtmk_u64 rg) {
    hk_put_rec(P, W, hook, ts, t, step, flags, event, event_gen, wait_ns, dur_ns, queue_depth, comm_op, comm_gen,
               peer_rank, rg);
}

__device__ void trace_rec(const MkParams &P, Worker &W, int t, int step, dtmk_u64 t0, dtmk_u64 t1, dtmk_u64 t2,
                          dtmk_u32 flags) {
    dtmk_u64 n = W.trace_n++;
    if (n < P.trace_cap) {
        TraceRec r;
        r.t_dispatch = t0; r.wait_ns = (dtmk_u32)min(t1 - t0, 0xffffffffull);
        r.dur_ns = (dtmk_u32)min(t2 - t1, 0xffffffffull); r.task_index = t; r.step = step;
        r.sm = (dtmk_u16)W.sm; r.worker = (dtmk_u16)W.worker; r.flags = (dtmk_u16)flags;
        r.cls = (dtmk_u16)trec(P, t)[0];
        uint4 *dst = (uint4 *)((char *)P.trace_ring + ((dtmk_u64)W.worker * P.trace_cap + n) * TRACE_BYTES);
        dst[0] = ((uint4 *)&r)[0]; dst[1] = ((uint4 *)&r)[1];
    }
}
