/* mk_obs_sm.cuh: part of megakernel.cu (included once, at its place in it; not a
 * standalone header): the observer SM's loop (-DDTMK_OBS_SM; DRAFT of session 13: exact on
 * the H200, not yet fast) -- megakernel.cu "observer SM". */
#ifdef DTMK_OBS_SM
/* observer, lane 0: worker w's host-ring cursor into W (the observer's own Worker) / back */
__device__ __forceinline__ void osq_cursor_in(const MkParams &P, Worker &W, dtmk_u32 w, dtmk_u32 sm) {
    const dtmk_u64 *a = osq_w(P, w);
    W.worker = w; W.sm = sm;
    W.hook_n = a[OSQ_W_HOOK_N]; W.hook_slot = a[OSQ_W_HOOK_SLOT]; W.hook_drop = a[OSQ_W_HOOK_DROP];
    W.hook_tail = 0;                   /* (non-resident launches: the host reads the ring at the end) */
}
__device__ __forceinline__ void osq_cursor_out(const MkParams &P, const Worker &W) {
    dtmk_u64 *a = osq_w(P, W.worker);
    a[OSQ_W_HOOK_N] = W.hook_n; a[OSQ_W_HOOK_SLOT] = W.hook_slot; a[OSQ_W_HOOK_DROP] = W.hook_drop;
}
/* observer, warp 0: the tables it loaded (obs_sync, O.reload) -> the workers: the hook mask,
 * every worker's OBS_GEN / OBS_LOADED_TS (obs_sync wrote row 0's) */
__device__ __noinline__ void osq_publish_tables(const MkParams &P, Worker &W) {
    const unsigned lane = threadIdx.x & 31;
    struct Osq *q = osq_hdr(P);
    if (O.state) {
        const dtmk_u64 *g0 = (const dtmk_u64 *)O.state;
        for (dtmk_u32 w = lane + 1; w < (dtmk_u32)P.n_workers; w += 32) {
            dtmk_u64 *g = obs_row(w);
            g[OBS_LOADED_TS] = g0[OBS_LOADED_TS]; g[OBS_FIRST_TS] = 0;
            *(volatile dtmk_u64 *)(g + OBS_GEN) = g0[OBS_GEN];
        }
    }
    __syncwarp();
    if (lane == 0) {
        *(volatile dtmk_u32 *)&q->mask = O.vm_mask;
        __threadfence();
        *(volatile dtmk_u32 *)&q->live = 1u;
    }
    __syncwarp();
}
/* observer, warp 0: run worker w's entries [tail, head): lane 0 builds the records (the
 * observer ring and the host ring), the warp drains the ring before it could overflow */
__device__ __noinline__ dtmk_u32 osq_run_worker(const MkParams &P, Worker &W, dtmk_u32 w, dtmk_u64 head,
                                                dtmk_u32 seen) {
    const unsigned lane = threadIdx.x & 31;
    dtmk_u64 *a = osq_w(P, w);
    dtmk_u64 tail = osq_ld(a + OSQ_W_TAIL);
    for (; tail < head; ++tail) {
        if (O.n && O.maxc >= O.must_at) { W.worker = 0; obs_sync(P, W, false, seen); }
        /* L2 loads: this SM's L1 may hold the slot's previous lap (the head was read with
         * acquire: the entry's stores, ordered before it by the worker's MEMBAR, are seen) */
        const uint4 *d = osq_entry(P, w, tail);
        if (lane == 0) {
            const uint4 d0 = __ldcg(d);
            if (d0.x == OSQ_TAG_PEND) {           /* a task's captured hooks */
                const uint4 d5 = __ldcg(d + 5);
                osq_cursor_in(P, W, d5.x, d5.y);
                W.pend = d0.y; W.pend_q = d0.z; W.pend_flags = d0.w;
                const uint4 d1 = __ldcg(d + 1), d2 = __ldcg(d + 2), d3 = __ldcg(d + 3), d4 = __ldcg(d + 4);
                W.cw_peer = d1.x; W.phantoms = d1.y; W.pend_t = (int)d1.z; W.pend_step = (int)d1.w;
                W.pend_rg = ((dtmk_u64)d2.y << 32) | d2.x; W.t_ready = ((dtmk_u64)d2.w << 32) | d2.z;
                W.t_begin = ((dtmk_u64)d3.y << 32) | d3.x; W.t_end = ((dtmk_u64)d3.w << 32) | d3.z;
                W.dep_wait = ((dtmk_u64)d4.y << 32) | d4.x; W.ts_rel = ((dtmk_u64)d4.w << 32) | d4.z;
                seen = max(seen, d1.w);
                hook_flush(P, W);
            } else {                              /* a record built by the worker */
                HkRec c;
#pragma unroll
                for (int i = 0; i < DTMK_CTX_SIZE / 16; ++i) c.v[i] = __ldcg(d + i);
                osq_cursor_in(P, W, c.v[1].z, c.v[1].y);
                hk_store(P, W, c, c.v[0].y, c.v[3].z);
                seen = max(seen, c.v[3].z);
            }
            osq_cursor_out(P, W);
        }
        seen = __shfl_sync(0xffffffffu, seen, 0);
        __syncwarp();
    }
    if (lane == 0) {
        /* the records' effects (host-ring records, Osq.low lowered by hk_store) before the
         * tail: a worker that reads tail == head then reads a low that holds its epochs */
        __threadfence();
        *(volatile dtmk_u64 *)(a + OSQ_W_TAIL) = tail;
    }
    __syncwarp();
    return seen;
}
/* the observer CTA's warp 0 (megakernel.cu "observer SM"): load the tables, then until
 * every worker is done and every queue empty: run the workers' new entries, reload on a
 * new generation, drain and flush epochs below the highest step seen when idle; at the
 * end the last drain, every worker's host-ring head, OBS_PENDING ~0 and OBS_DONE. */
__device__ __noinline__ void osq_observer(const MkParams &P, Worker &W) {
    const unsigned lane = threadIdx.x & 31;
    const dtmk_u32 nw = (dtmk_u32)P.n_workers;
    struct Osq *q = osq_hdr(P);
    for (dtmk_u32 w = lane; w < nw; w += 32) {   /* the host rings' cursors */
        dtmk_u64 *a = osq_w(P, w);
        const dtmk_u64 n = ((const dtmk_u64 *)P.hook_head)[w];
        a[OSQ_W_HOOK_N] = n; a[OSQ_W_HOOK_SLOT] = P.hook_cap ? n % P.hook_cap : 0;
        a[OSQ_W_HOOK_DROP] = P.hook_drop ? ((const dtmk_u64 *)P.hook_drop)[w] : 0;
    }
    if (lane == 0) {
        W.worker = 0; O.pub = ~0u;
        *(volatile dtmk_u32 *)&q->low = ~0u;
        O.ring_mask = ld_volatile_u32((const dtmk_u32 *)P.control + CTL_HOOK_MASK);   /* the host ring's hooks */
    }
    __syncwarp();
    if (O.tables) {
        while (O.reload) obs_sync(P, W, false, ~0u);  /* (retries while the host writes a table) */
        osq_publish_tables(P, W);
    } else if (lane == 0) {
        *(volatile dtmk_u32 *)&q->live = 1u;
    }
    __syncwarp();
    dtmk_u32 seen = (dtmk_u32)P.step0;
    for (;;) {
        bool any = false, all_done = true;
        for (dtmk_u32 base = 0; base < nw; base += 32) {
            const dtmk_u32 w = base + lane;
            dtmk_u64 head = 0, tail = 0, done = 1;
            if (w < nw) {
                const dtmk_u64 *a = osq_w(P, w);
                /* acquire, done before head: a done worker's head is final; the head's
                 * entries are complete (the worker's MEMBAR or fence precedes the head) */
                done = ld_acquire(a + OSQ_W_DONE);
                head = ld_acquire(a + OSQ_W_HEAD);
                tail = osq_ld(a + OSQ_W_TAIL);
            }
            all_done = all_done && __all_sync(0xffffffffu, done != 0 && head == tail);
            unsigned todo = __ballot_sync(0xffffffffu, head != tail);
            any = any || todo;
            while (todo) {
                const int l = __ffs(todo) - 1;
                todo &= todo - 1;
                seen = osq_run_worker(P, W, base + l, __shfl_sync(0xffffffffu, head, l), seen);
            }
        }
        if (all_done) break;
        if (O.tables) {
            dtmk_u32 gen = 0;
            if (lane == 0) {
                gen = ld_volatile_u32((const dtmk_u32 *)P.control + CTL_GEN);
                O.ring_mask = ld_volatile_u32((const dtmk_u32 *)P.control + CTL_HOOK_MASK);
            }
            gen = __shfl_sync(0xffffffffu, gen, 0);
            if (gen != O.gen_seen) {                  /* new tables: the records held first */
                if (lane == 0) { O.reload = 1; W.worker = 0; }
                __syncwarp();
                obs_sync(P, W, false, ~0u);
                if (!O.reload) osq_publish_tables(P, W);
                continue;
            }
            if (!any && (O.n || O.acc_min < seen)) {
                if (lane == 0) W.worker = 0;
                __syncwarp();
                obs_sync(P, W, false, seen);          /* drain, flush epochs < the highest step seen */
                continue;
            }
        }
        if (!any) __nanosleep(500);
    }
    if (lane == 0) W.worker = 0;
    __syncwarp();
    if (O.tables) obs_sync(P, W, false, ~0u);        /* the last drain: every record, every epoch */
    __threadfence();
    for (dtmk_u32 w = lane; w < nw; w += 32) {
        const dtmk_u64 *a = osq_w(P, w);
        ((dtmk_u64 *)P.hook_head)[w] = a[OSQ_W_HOOK_N];
        if (P.hook_drop) ((dtmk_u64 *)P.hook_drop)[w] = a[OSQ_W_HOOK_DROP];
        if (O.state) {
            dtmk_u64 *g = obs_row(w);
            *(volatile dtmk_u64 *)(g + OBS_PENDING) = ~0ull;
            *(volatile dtmk_u64 *)(g + OBS_DONE) = 1;
        }
    }
}
#endif
