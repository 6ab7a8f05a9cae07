/* mk_obs_sm.cuh: part of megakernel.cu (included once, at its place in it; not a
 * standalone header): the observer SM's loop (-DDTMK_OBS_SM; megakernel.cu "observer SM").
 * Several observer warps, each with its own Obs (mk_observer.cuh obs_self) serving a slice
 * of the workers (w = k, k + K, ...); each lane runs one worker's next entry at a time, so
 * a warp builds up to 32 tasks' records at once and the VM runs them as full batches. */
#ifdef DTMK_OBS_SM
#ifndef DTMK_OBS_SM_WARPS
#define DTMK_OBS_SM_WARPS 8   /* observer warps at most (1b: ~26 K records per step need several) */
#endif
/* -DDTMK_OSQ_STATS (tools/obs_sm_probe.py; measurement only): per observer warp k, u64
 * dtmk_osq_stats[k][i] (k: the warp among all observer SMs'): [0] rounds that ran entries, [1] entries, [2] idle scans, [3]
 * drains for room inside a round, [4..7] SM cycles scanning heads / building records /
 * in obs_sync (room drains, idle drains, reloads) / lowering OSQ_W_LOW + fence + tails,
 * [8] the largest head - tail seen, [9] idle drains, [10] records run through descriptors
 * (-DDTMK_OSQ_DESC); and per launch
 * dtmk_osq_wstats: [0] worker pushes that found their queue full, [1] cycles they waited.
 * (-DDTMK_OSQ_SPLIT: the builders' rows are their pair index p, [0]-[2], [4], [5] as above; the
 * drainers' rows come after DTMK_OBS_SMS / 2 x DTMK_OBS_SM_WARPS: [0] batches, [1] blocks, [2] idle
 * polls, [3] room drains, [6] obs_sync cycles, [7] batch cycles -- room drains counted in both.)
 * Also measurement only, to split the hot summary's cost: -DDTMK_OSQ_DISCARD (the observer
 * takes entries without running them), -DDTMK_OSQ_NOPUSH (workers capture, push nothing),
 * -DDTMK_OSQ_PEND_LATE (a task's entry stored after its release signal, then fenced),
 * -DDTMK_OSQ_NORAISE (waiting workers never raise OBS_PENDING: no epoch final before the end),
 * -DDTMK_OSQ_BURN=C (C cycles spent per entry taken, touching no memory: with DISCARD instead
 * of running it -- session 16: no cost -- else after running it -- session 19: no cost either),
 * and per entry (after DISCARD's take, since session 27 also after a run) -DDTMK_OSQ_FENCES=N
 * fences, -DDTMK_OSQ_ATOMS=N atomics, -DDTMK_OSQ_LOADS=N dependent L2 loads: which of the
 * VM's kinds of work costs the workers;
 * -DDTMK_OSQ_NOVM (records built into the warp's ring, drained without running the VM) and
 * -DDTMK_OSQ_SCATTER (those atomics / loads at a word per lane and entry; without it the
 * lanes share one word and the warp's requests coalesce -- session 16's runs),
 * -DDTMK_OSQ_NOLOW (OSQ_W_LOW never stored: the workers' raises see no epoch held; epochs
 * final early -- coverage snapshots are then wrong) split the rest (session 17);
 * -DDTMK_OSQ_NOMAPS (bpf_vm.cuh: the VM's map helpers return without touching memory) and,
 * with the opt-in -DDTMK_OSQ_DESC (descriptor programs into a shadow per observer warp:
 * mk_observer.cuh osq_desc_records), -DDTMK_OSQ_NOFLUSH (the shadow dropped, no map written)
 * split the VM's map share (session 18); after the entry's run, -DDTMK_OSQ_PAGES=N dependent loads
 * on N pages of 2 MB (the TLBs' reach?) and -DDTMK_OSQ_ICODE=N unrolled code (an instruction
 * cache shared with the workers?) test how the maps' share reaches the workers (session 26); ICODE
 * also runs with DISCARD (fresh code alone, session 29).
 * Opt-in, not measurement: -DDTMK_OSQ_MULTI=D (a worker's backlog runs on up to D lanes of a
 * round: osq_observer) */
#define OSQ_STATS_N 11
#if defined(DTMK_OSQ_ATOMS) || defined(DTMK_OSQ_LOADS)
__device__ unsigned long long dtmk_osq_sink[257];   /* (measurement only: the synthetic work per entry) */
#ifndef DTMK_OSQ_SCATTER               /* (one word for every lane: the warp's atomics and loads coalesce) */
#define OSQ_SINK_LANE 0u
#else                                  /* (a word per lane and entry, as the VM's map work; w, i: osq_run_entry's) */
#define OSQ_SINK_LANE ((dtmk_u32)(w * 37u + i * 11u))
#endif
#endif
#ifdef DTMK_OSQ_STATS
extern "C" __device__ unsigned long long dtmk_osq_stats[DTMK_OBS_SMS * DTMK_OBS_SM_WARPS * OSQ_STATS_N];
__device__ unsigned long long dtmk_osq_stats[DTMK_OBS_SMS * DTMK_OBS_SM_WARPS * OSQ_STATS_N];
#define OSQ_T0(name) const long long name = clock64()   /* (OSQ_ADD / OSQ_CYC: k is the observer warp in scope) */
#define OSQ_ADD(i, v) do { if ((threadIdx.x & 31) == 0) dtmk_osq_stats[k * OSQ_STATS_N + (i)] += (v); } while (0)
#define OSQ_CYC(i, name) OSQ_ADD(i, (unsigned long long)(clock64() - (name)))
#else
#define OSQ_T0(name)
#define OSQ_ADD(i, v) do { } while (0)
#define OSQ_CYC(i, name) do { } while (0)
#endif
/* the observer warps of this launch: as many as have an Obs (warp 0 the static one, the
 * others in the dynamic shared memory the launch gives every CTA), DTMK_OBS_SM_WARPS at most */
__device__ __forceinline__ dtmk_u32 osq_nwarps() {
    dtmk_u32 dyn;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dyn));
    return min(min((dtmk_u32)DTMK_OBS_SM_WARPS, blockDim.x / 32u), 1u + dyn / (dtmk_u32)sizeof(Obs));
}
/* an observer lane: worker w's host-ring cursor into W (the lane's Worker) / back; only
 * while the host ring takes records (O.ring_mask; hk_store writes no other hook there) */
__device__ __forceinline__ void osq_cursor_in(const MkParams &P, Worker &W, dtmk_u32 w, dtmk_u32 sm, bool any = false) {
    W.worker = w; W.sm = sm;
    if (!O.ring_mask && !any) return;
    const dtmk_u64 *a = osq_w(P, w);
    W.hook_n = a[OSQ_W_HOOK_N]; W.hook_slot = a[OSQ_W_HOOK_SLOT]; W.hook_drop = a[OSQ_W_HOOK_DROP];
    /* what the host consumed (a resident launch's poll; otherwise it reads at the end) */
    W.hook_tail = P.resident ? *((const volatile dtmk_u64 *)P.hook_tail + w) : 0;
}
__device__ __forceinline__ void osq_cursor_out(const MkParams &P, const Worker &W) {
    if (!O.ring_mask) return;
    dtmk_u64 *a = osq_w(P, W.worker);
    a[OSQ_W_HOOK_N] = W.hook_n; a[OSQ_W_HOOK_SLOT] = W.hook_slot; a[OSQ_W_HOOK_DROP] = W.hook_drop;
}
/* observer warp (all lanes): the tables it loaded (obs_sync, O.reload) -> its workers:
 * OBS_GEN / OBS_LOADED_TS copied from its own row (obs_sync wrote row k), then the hook
 * mask with the live bit (a launch's workers wait for it) */
__device__ __noinline__ void osq_publish_tables(const MkParams &P) {
    const unsigned lane = threadIdx.x & 31;
    const dtmk_u32 k = O.osq_k, K = O.osq_nw, nw = (dtmk_u32)P.n_workers;
    if (O.state) {
        const dtmk_u64 *gk = obs_row(k);
        for (dtmk_u32 w = k + (lane + 1) * K; w < nw; w += 32 * K) {
            dtmk_u64 *g = obs_row(w);
            g[OBS_LOADED_TS] = gk[OBS_LOADED_TS]; g[OBS_FIRST_TS] = 0;
            *(volatile dtmk_u64 *)(g + OBS_GEN) = gk[OBS_GEN];
        }
    }
    __threadfence();
#ifndef DTMK_HOLD_EAGER
    /* bit 33: a loaded program reads request_gen (or comm:wait is observed): the workers'
     * full pre-signal hold; else the light one (the default build decides this at load) */
    const dtmk_u64 m = (1ull << 32) | ((dtmk_u64)(O.hold_full != 0) << 33) | O.vm_mask;
#else
    const dtmk_u64 m = (1ull << 32) | O.vm_mask;
#endif
    for (dtmk_u32 w = k + lane * K; w < nw; w += 32 * K) *(volatile dtmk_u64 *)(osq_w(P, w) + OSQ_W_MASK) = m;
    __syncwarp();
}
#if defined(DTMK_OSQ_PAGES) || defined(DTMK_OSQ_ICODE) || defined(DTMK_OSQ_JCODE)
__device__ unsigned long long dtmk_osq_sink2;   /* (measurement only: keeps PAGES' / ICODE's / JCODE's results) */
#endif
#ifdef DTMK_OSQ_ICODE
/* (session 26: does the observers' code footprint reach the workers -- an instruction cache
 * above the SM?)  mk_common.cuh probe_icode: straight-line code, no memory */
__device__ __noinline__ dtmk_u32 osq_icode(dtmk_u32 a) { return probe_icode<(DTMK_OSQ_ICODE), 0u>(a); }
#endif
#ifdef DTMK_OSQ_JCODE
/* (session 31) ICODE's question for code that jumps: DTMK_OSQ_JCODE blocks of ~10 instructions
 * (~200 B each with their share of the dispatch), N / 2 of them run per entry in a data-dependent,
 * warp-uniform order through a binary compare tree -- the VM's way of moving through its code --
 * against ICODE's straight line of about the same KB (docs/dev/hook_cost_analysis.md "Session 31":
 * the summary's ~30 KB per entry cost its GPC-mates far more than 30 KB of straight-line code) */
template <int J> __device__ __forceinline__ void osq_jblock(dtmk_u32 &a, dtmk_u32 &b) {
    a = (a ^ (a >> 7)) * 0x2545f491u + (dtmk_u32)J * 0x9e3779b9u;
    b = (b ^ (b >> 9)) * 0x9e3779b1u + (dtmk_u32)J * 0x85ebca6bu;
    a ^= b >> 3;
    b += a << 5;
}
template <int LO, int HI> __device__ __forceinline__ void osq_jpick(dtmk_u32 k, dtmk_u32 &a, dtmk_u32 &b) {
    if constexpr (HI - LO == 1) {
        osq_jblock<LO>(a, b);
    } else {
        constexpr int MID = (LO + HI) / 2;
        if (k < (dtmk_u32)MID) osq_jpick<LO, MID>(k, a, b);
        else osq_jpick<MID, HI>(k, a, b);
    }
}
__device__ __noinline__ dtmk_u32 osq_jcode(dtmk_u32 a) {
    const unsigned act = __activemask();
    dtmk_u32 b = a ^ 0x9e3779b9u;
    for (int s = 0; s < (DTMK_OSQ_JCODE) / 2; ++s) {
        const dtmk_u32 k = __shfl_sync(act, a >> 11, __ffs(act) - 1) % (dtmk_u32)(DTMK_OSQ_JCODE);   /* (uniform: no serialised blocks) */
        osq_jpick<0, (DTMK_OSQ_JCODE)>(k, a, b);
    }
    return a ^ b;
}
#endif
/* observer lane: worker w's entry i into c.  L2 loads: this SM's L1 may hold the slot's previous
 * lap (the head was read with acquire: the entry's stores, ordered before it by the worker's
 * MEMBAR, are seen) */
__device__ __forceinline__ void osq_load_entry(const MkParams &P, dtmk_u32 w, dtmk_u64 i, HkRec &c) {
    const uint4 *d = osq_entry(P, w, i);
#pragma unroll
    for (int j = 0; j < DTMK_CTX_SIZE / 16; ++j) c.v[j] = __ldcg(d + j);
}
/* an observer lane: worker w's entry i (its words in c) -> its records (the warp's ring, the
 * host ring); returns the entry's decode step */
__device__ __forceinline__ dtmk_u32 osq_run_rec(const MkParams &P, Worker &W, dtmk_u32 w, dtmk_u64 i, const HkRec &c) {
    dtmk_u32 step;
    if (c.v[0].x == OSQ_TAG_PEND) {    /* a task's captured hooks (osq_write_pend) */
        const uint4 d0 = c.v[0], d1 = c.v[1], d2 = c.v[2], d3 = c.v[3], d4 = c.v[4];
        osq_cursor_in(P, W, w, c.v[5].y);
        W.pend = d0.y; W.pend_q = d0.z; W.pend_flags = d0.w;
        W.cw_peer = d1.x; W.phantoms = d1.y; W.pend_t = (int)d1.z; W.pend_step = (int)d1.w;
        W.pend_rg = ((dtmk_u64)d2.y << 32) | d2.x; W.t_ready = ((dtmk_u64)d2.w << 32) | d2.z;
        W.t_begin = ((dtmk_u64)d3.y << 32) | d3.x; W.t_end = ((dtmk_u64)d3.w << 32) | d3.z;
        W.dep_wait = ((dtmk_u64)d4.y << 32) | d4.x; W.ts_rel = ((dtmk_u64)d4.w << 32) | d4.z;
        step = d1.w;
#ifndef DTMK_OSQ_DISCARD
        hook_flush(P, W);
#ifdef DTMK_OSQ_BURN                   /* measurement only: the entry run, then DTMK_OSQ_BURN cycles more (no memory) */
        { const long long b0 = clock64(); while (clock64() - b0 < (long long)(DTMK_OSQ_BURN)) { } }
#endif
#ifdef DTMK_OSQ_PAGES                  /* measurement only: then N dependent loads, each on another 2 MB page of the gate weights */
        {
            const dtmk_u64 pages = (P.n_layers * P.ffn * P.hidden * 2ull) >> 21;
            dtmk_u64 x = (dtmk_u64)w * 131u + i * 7u;
            for (int j = 0; pages && j < (DTMK_OSQ_PAGES); ++j) {
                const dtmk_u64 pg = (x * 2654435761ull + (dtmk_u64)j * 40503u) % pages;
                x += __ldcg((const unsigned *)(P.w_gate + (pg << 21) + ((x & 1023u) << 6))) | 1u;
            }
            if (x == 12345) dtmk_osq_sink2 = x;   /* (keeps the chain) */
        }
#endif
#ifdef DTMK_OSQ_ICODE                  /* measurement only: then ~DTMK_OSQ_ICODE * 12 instructions of straight-line code */
        if (osq_icode((dtmk_u32)(w * 131u + i)) == 0x12345678u) dtmk_osq_sink2 = 1;
#endif
#else
        W.pend = 0;                    /* measurement only: the entry taken, not run */
#ifdef DTMK_OSQ_BURN                   /* ... and DTMK_OSQ_BURN cycles spent on it (a busy observer, no memory) */
        { const long long b0 = clock64(); while (clock64() - b0 < (long long)(DTMK_OSQ_BURN)) { } }
#endif
#ifdef DTMK_OSQ_ICODE                  /* ... or fresh code alone, no VM (session 29: the GPC-mates' slowdown?) */
        if (osq_icode((dtmk_u32)(w * 131u + i)) == 0x12345678u) dtmk_osq_sink2 = 1;
#endif
#ifdef DTMK_OSQ_JCODE                  /* ... or fresh code that jumps (session 31) */
        if (osq_jcode((dtmk_u32)(w * 131u + i)) == 0x12345678u) dtmk_osq_sink2 = 1;
#endif
#endif
        /* measurement only, after the entry's run or its discard (session 27: with NOMAPS, do
         * synthetic atomics / loads per entry cost what the maps do?) */
#ifdef DTMK_OSQ_FENCES                 /* ... N fences (do the observer's fences cost the workers?) */
        for (int j = 0; j < (DTMK_OSQ_FENCES); ++j) __threadfence();
#endif
#ifdef DTMK_OSQ_ATOMS                  /* ... N global atomic adds (its atomics?  OSQ_SINK_LANE: where) */
        for (int j = 0; j < (DTMK_OSQ_ATOMS); ++j) atomicAdd(&dtmk_osq_sink[1 + ((OSQ_SINK_LANE + j * 3u) & 255)], 1ull);
#endif
#ifdef DTMK_OSQ_LOADS                  /* ... N dependent L2 loads (its memory latency chain?) */
        {
            dtmk_u64 x = OSQ_SINK_LANE;
            for (int j = 0; j < (DTMK_OSQ_LOADS); ++j) x = __ldcg(&dtmk_osq_sink[1 + ((x + j) & 255)]);
            if (x == 12345) dtmk_osq_sink[0] = x;   /* (keeps the chain) */
        }
#endif
    } else if (c.v[0].x == OSQ_TAG_STEP) {   /* a resident launch's step gate (gate_publish) */
        osq_cursor_in(P, W, w, W.sm, true);
        __threadfence_system();        /* this worker's records (earlier entries) before its head */
        ((volatile dtmk_u64 *)P.hook_head)[w] = W.hook_n;
        ((volatile dtmk_u64 *)P.hook_drop)[w] = W.hook_drop;
        __threadfence_system();        /* (a poll reads steps_done first: the head is in by then) */
        ((volatile dtmk_u64 *)P.steps_done)[w] = ((dtmk_u64)c.v[0].z << 32) | c.v[0].y;
        return 0u;
    } else {                           /* a record built by the worker */
        osq_cursor_in(P, W, w, c.v[1].y);
        step = c.v[3].z;
#ifndef DTMK_OSQ_DISCARD
        hk_store(P, W, c, c.v[0].y, step);
#endif
    }
    osq_cursor_out(P, W);
    return step;
}
/* observer lane: worker w's entry i loaded and run */
__device__ __noinline__ dtmk_u32 osq_run_entry(const MkParams &P, Worker &W, dtmk_u32 w, dtmk_u64 i) {
    HkRec c;
    osq_load_entry(P, w, i, c);
    return osq_run_rec(P, W, w, i, c);
}
#ifdef DTMK_OSQ_MULTI
/* observer lane: an entry the round loaded already (to see its tag) run */
__device__ __noinline__ dtmk_u32 osq_run_loaded(const MkParams &P, Worker &W, dtmk_u32 w, dtmk_u64 i, const HkRec &c) {
    return osq_run_rec(P, W, w, i, c);
}
#endif
/* observer warp (all lanes) at its start, for its slice (workers k, k + K, ...): each worker's host-ring
 * cursor from the host's heads, nothing held (OSQ_W_LOW ~0); then the first tables, loaded and published */
__device__ __forceinline__ void osq_slice_start(const MkParams &P, Worker &Wk, dtmk_u32 lane, dtmk_u32 k, dtmk_u32 K,
                                                dtmk_u32 nw) {
    for (dtmk_u32 w = k + lane * K; w < nw; w += 32 * K) {
        dtmk_u64 *a = osq_w(P, w);
        const dtmk_u64 n = ((const dtmk_u64 *)P.hook_head)[w];
        a[OSQ_W_HOOK_N] = n; a[OSQ_W_HOOK_SLOT] = P.hook_cap ? n % P.hook_cap : 0;
        a[OSQ_W_HOOK_DROP] = P.hook_drop ? ((const dtmk_u64 *)P.hook_drop)[w] : 0;
        *(volatile dtmk_u64 *)(a + OSQ_W_LOW) = ~0u;
    }
    __syncwarp();
    if (O.tables)
        while (O.reload) obs_sync(P, Wk, false, ~0u);   /* (retries while the host writes a table) */
    osq_publish_tables(P);                          /* (no tables: no hooks, the live bit alone) */
}
/* observer warp (all lanes) at its end, for its slice: the host rings' heads (heads) and / or each
 * worker's OBS_PENDING ~0 and OBS_DONE (rows) */
__device__ __forceinline__ void osq_slice_end(const MkParams &P, dtmk_u32 lane, dtmk_u32 k, dtmk_u32 K, dtmk_u32 nw,
                                              bool heads, bool rows) {
    for (dtmk_u32 w = k + lane * K; w < nw; w += 32 * K) {
        const dtmk_u64 *a = osq_w(P, w);
        if (heads) {
            ((dtmk_u64 *)P.hook_head)[w] = a[OSQ_W_HOOK_N];
            if (P.hook_drop) ((dtmk_u64 *)P.hook_drop)[w] = a[OSQ_W_HOOK_DROP];
        }
        if (rows && O.state) {
            dtmk_u64 *g = obs_row(w);
            *(volatile dtmk_u64 *)(g + OBS_PENDING) = ~0ull;
            *(volatile dtmk_u64 *)(g + OBS_DONE) = 1;
        }
    }
}
#ifdef DTMK_OSQ_SPLIT
/* (with -DDTMK_OSQ_DESC, the drainers running descriptors into their shadow, it kept up but cost as
 * much -- hooks.md "Session 35", plans 88 / 90 at 0a8958d -- and its final epochs did not advance while
 * 1b ran: refused again rather than kept with an open liveness question) */
#if DTMK_OBS_SMS < 2 || (DTMK_OBS_SMS) % 2 || defined(DTMK_OSQ_MULTI) || defined(DTMK_OSQ_DESC) || defined(DTMK_OSQ_IDLE_DRAIN)
#error "DTMK_OSQ_SPLIT: an even DTMK_OBS_SMS >= 2 (half build, half drain), without DTMK_OSQ_MULTI / _DESC / _IDLE_DRAIN"
#endif
/* -DDTMK_OSQ_SPLIT (megakernel.cu OSQ_SPLIT_NH): the area after the workers' -- a build cursor per
 * worker, then pair p's words and blocks */
__device__ __forceinline__ dtmk_u64 *osq_bcur(const MkParams &P, dtmk_u32 w) { return osq_w(P, (dtmk_u32)P.n_workers) + w; }
__device__ __forceinline__ dtmk_u64 *osq_pair(const MkParams &P, dtmk_u32 p) {
    char *a = (char *)osq_w(P, (dtmk_u32)P.n_workers);
    return (dtmk_u64 *)(a + ((P.n_workers * 8ull + 127ull) & ~127ull) + (dtmk_u64)p * OSQ_PAIR_BYTES);
}
__device__ __forceinline__ dtmk_u32 *osq_blk(dtmk_u64 *pair, dtmk_u64 i) {
    return (dtmk_u32 *)((char *)pair + 128 + (i % OSQ_SPLIT_NH) * OSQ_BLK_BYTES);
}
__device__ __forceinline__ uint4 *osq_blk_rec(dtmk_u32 *b, dtmk_u32 i) { return (uint4 *)((char *)b + OSQ_BLK_HDR) + i * 8; }
#define OSQ_SPLIT_BATCH 16             /* a builder's block: at most this many entries ... */
#define OSQ_SPLIT_PASSES 4             /* ... or the entries of this many passes (osq_builder) */
__device__ __forceinline__ void osq_st_release(dtmk_u64 *p, dtmk_u64 v) {
    asm volatile("st.release.gpu.global.u64 [%0], %1;" :: "l"(p), "l"(v) : "memory");
}
/* the warp's index among its side's (builders or drainers: pair p = builder p + drainer p) */
__device__ __forceinline__ dtmk_u32 osq_pair_index(dtmk_u32 kl, dtmk_u32 Kl) {
    return ((s_osq_obs - 1u) % (DTMK_OBS_SMS / 2)) * Kl + kl;
}
/* builder warp: wait until the drainer leaves block hh free (it is OSQ_SPLIT_NH behind at most) */
__device__ __forceinline__ void osq_blk_room(dtmk_u64 *pr, dtmk_u64 hh) {
    if ((threadIdx.x & 31) == 0)
        while (hh - ld_acquire(pr + OSQ_P_TAIL) >= OSQ_SPLIT_NH) __nanosleep(128);
    __syncwarp();
}
/* builder warp (all lanes): the ring's records (each at its ring index) and the entries they
 * came from (lane l with pc != 0: its worker w's entries before build cursor pc) as block hh,
 * published; the ring is empty again.  lo / hi: the records' lowest epoch, the entries' highest step */
__device__ __noinline__ void osq_hand_over(dtmk_u64 *pr, dtmk_u64 hh, dtmk_u32 w, dtmk_u64 pc, dtmk_u32 lo, dtmk_u32 hi,
                                           dtmk_u32 flags) {
    const unsigned lane = threadIdx.x & 31;
    dtmk_u32 *b = osq_blk(pr, hh);
    for (int h = 1; h < DTMK_NUM_HOOKS; ++h) {
        const dtmk_u32 c = O.cnt[h], base = O.base[h];
        for (dtmk_u32 i = lane; i < c; i += 32) {
            const uint4 *src = (const uint4 *)&O.ring[base + i];
            uint4 *dst = osq_blk_rec(b, base + i);
#pragma unroll
            for (int j = 0; j < DTMK_CTX_SIZE / 16; ++j) __stcg(dst + j, src[j]);
        }
    }
    if (lane < 16) b[lane] = lane < DTMK_NUM_HOOKS ? O.cnt[lane] : 0u;
    const unsigned held = __ballot_sync(0xffffffffu, pc != 0);
    if (pc) {                          /* commit i: the worker, its tail once the drainer holds the records */
        const dtmk_u32 i = __popc(held & ((1u << lane) - 1u));
        b[32 + i] = w; ((dtmk_u64 *)b)[32 + i] = pc;   /* (header words 32..63: workers; bytes 256..511: cursors) */
    }
    if (lane == 0) { b[16] = flags; b[17] = __popc(held); b[18] = lo; b[19] = hi; }
    __threadfence();                   /* (every lane: its part of the block before the head) */
    __syncwarp();
    if (lane == 0) {
        *(volatile dtmk_u64 *)(pr + OSQ_P_HEAD) = hh + 1;
        for (int h = 0; h < DTMK_NUM_HOOKS; ++h) O.cnt[h] = 0;
        O.n = 0; O.maxc = 0;
    }
    __syncwarp();
}
/* builder warp: the drainer's tables after seq `old` (their hooks, hold, generation): the ring
 * laid out as the drainer's */
__device__ __noinline__ dtmk_u32 osq_adopt(dtmk_u64 *pr, dtmk_u32 old) {
    dtmk_u32 seq = 0;
    if ((threadIdx.x & 31) == 0) {
        while ((seq = (dtmk_u32)ld_acquire(pr + OSQ_P_SEQ)) == old) __nanosleep(256);
        const dtmk_u64 m = osq_ld(pr + OSQ_P_MASK);
        O.vm_mask = (dtmk_u32)m & 0x7fffffffu;
#ifndef DTMK_HOLD_EAGER
        O.hold_full = (dtmk_u32)(m >> 31) & 1u;
#endif
        O.gen_seen = (dtmk_u32)osq_ld(pr + OSQ_P_GEN);
        obs_layout(O.vm_mask);
    }
    return __shfl_sync(0xffffffffu, seq, 0);
}
/* drainer warp: its tables to its builder (after the slice's workers got theirs) */
__device__ __forceinline__ void osq_pair_publish(dtmk_u64 *pr, dtmk_u32 seq) {
    if ((threadIdx.x & 31) == 0) {
#ifndef DTMK_HOLD_EAGER
        const dtmk_u64 hold = O.hold_full;
#else
        const dtmk_u64 hold = 1;
#endif
        *(volatile dtmk_u64 *)(pr + OSQ_P_MASK) = O.vm_mask | (hold << 31);
        *(volatile dtmk_u64 *)(pr + OSQ_P_GEN) = O.gen_seen;
        __threadfence();
        *(volatile dtmk_u64 *)(pr + OSQ_P_SEQ) = seq;
    }
    __syncwarp();
}
/* builder warp p (the first DTMK_OBS_SMS / 2 observer SMs): osq_observer's rounds without the
 * drains -- each lane reads one worker's next entry (its build cursor, not the tail), builds its
 * records into the warp's ring, and the round goes to drainer p as one block.  New generation: a
 * reload block, then the drainer's new tables.  At the end the slice's host-ring heads. */
__device__ __noinline__ void osq_builder(const MkParams &P) {
    const unsigned lane = threadIdx.x & 31;
    const dtmk_u32 kl = threadIdx.x >> 5, Kl = osq_nwarps(), nw = (dtmk_u32)P.n_workers;
    const dtmk_u32 k = osq_pair_index(kl, Kl), K = (DTMK_OBS_SMS / 2) * Kl;
    if (kl >= Kl || k >= nw) return;
    Worker Wk, Wl;
    {
        dtmk_u32 sm;
        asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
        Wk.worker = k; Wk.sm = Wl.sm = sm; Wk.hook_mask = 0; Wk.trace_on = 0; Wk.observe = 0;
        Wl.pend = 0; Wl.pend_rg = 0; Wl.hook_tail = 0; Wl.osq_lo = ~0u;
    }
    for (int i = lane; i < (int)(sizeof(O.tabs) / 4); i += 32) ((dtmk_u32 *)O.tabs)[i] = 0;   /* (obs_lost reads them) */
    __syncwarp();
    if (lane == 0) {
        obs_init(P, Wk);
        O.reload = 0;                  /* (the drainer loads the tables) */
        O.osq_k = k; O.osq_nw = K;
        O.ring_mask = ld_volatile_u32((const dtmk_u32 *)P.control + CTL_HOOK_MASK);
    }
    __syncwarp();
    dtmk_u64 *pr = osq_pair(P, k);
    dtmk_u32 seq = osq_adopt(pr, 0u);  /* (the drainer also set the slice's cursors and lows) */
    dtmk_u64 hh = 0;                   /* blocks published */
    /* the entries built and not handed over yet (one block): lane -- its worker's cursor after
     * them (0: none); warp -- their group, count, lowest record epoch, highest step, passes */
    dtmk_u64 pc = 0;
    dtmk_u32 pg = 0, pn = 0, plo = ~0u, phi = 0, passes = 0;
#define OSQ_HAND_OVER(flags) do {                                                         \
        osq_blk_room(pr, hh);                                                             \
        osq_hand_over(pr, hh, k + (pg + lane) * K, pc, plo, phi, flags);                  \
        hh += 1; pc = 0; pn = 0; plo = ~0u; phi = 0; passes = 0;                          \
    } while (0)
    for (;;) {
        bool any = false, all_done = true;
        for (dtmk_u32 g0 = 0; k + g0 * K < nw; g0 += 32) {
            OSQ_T0(c_scan);
            const dtmk_u32 w = k + (g0 + lane) * K;
            const dtmk_u64 *a = osq_w(P, w < nw ? w : 0u);
            /* (osq_observer's scan with the build cursor for the tail: a shared helper changed the
             * GPU-tested CLI build's PTX, session 35, so the few lines stay twice) */
            dtmk_u64 head = 0, cur = 0;
            if (w < nw) {
                head = ld_acquire(a + OSQ_W_HEAD);
                cur = osq_ld(osq_bcur(P, w));
            }
            unsigned todo = __ballot_sync(0xffffffffu, head != cur);
            if (!todo) {
                bool fin = true;
                if (w < nw) fin = ld_acquire(a + OSQ_W_DONE) != 0 && ld_acquire(a + OSQ_W_HEAD) == cur;
                all_done = __all_sync(0xffffffffu, fin) && all_done;
            } else {
                all_done = false;
            }
            OSQ_CYC(4, c_scan);
            if (!todo) continue;
            any = true;
            OSQ_T0(c_build);
            if (pn && pg != g0) OSQ_HAND_OVER(0u);   /* (a block holds one group's workers) */
            if (O.cap) {                       /* one record per hook and entry: the sub-rings' size */
                while ((dtmk_u32)__popc(todo) > O.cap) todo &= ~(1u << (31 - __clz(todo)));
                if (pn && O.maxc + (dtmk_u32)__popc(todo) > O.cap) OSQ_HAND_OVER(0u);
            }
            Wl.osq_lo = ~0u;
            dtmk_u32 st = 0;
            if ((todo >> lane) & 1u) st = osq_run_entry(P, Wl, w, cur);
            __syncwarp();
            plo = min(plo, __reduce_min_sync(0xffffffffu, Wl.osq_lo));
            phi = max(phi, __reduce_max_sync(0xffffffffu, st));
            pn += __popc(todo); pg = g0;
            if ((todo >> lane) & 1u) { pc = cur + 1; *(volatile dtmk_u64 *)osq_bcur(P, w) = cur + 1; }
            OSQ_CYC(5, c_build);
            OSQ_ADD(0, 1);
            OSQ_ADD(1, __popc(todo));
        }
        /* a block goes at OSQ_SPLIT_BATCH entries, at a pass that found nothing new, after
         * OSQ_SPLIT_PASSES passes, or at the end: fewer, fuller blocks -- the drainer's fences
         * are per batch of blocks, the builder's per block */
        if (pn && (all_done || !any || pn >= OSQ_SPLIT_BATCH || ++passes >= OSQ_SPLIT_PASSES)) OSQ_HAND_OVER(0u);
        if (all_done) break;
        if (O.tables) {
            dtmk_u32 gen = 0;
            if (lane == 0) {
                gen = ld_volatile_u32((const dtmk_u32 *)P.control + CTL_GEN);
                O.ring_mask = ld_volatile_u32((const dtmk_u32 *)P.control + CTL_HOOK_MASK);
            }
            gen = __shfl_sync(0xffffffffu, gen, 0);
            if (gen != O.gen_seen) {           /* new tables: what was built runs under the old ones first */
                if (pn) OSQ_HAND_OVER(0u);
                OSQ_HAND_OVER(OSQ_BLK_RELOAD);         /* (nothing held now: no records, no commits) */
                seq = osq_adopt(pr, seq);
                continue;
            }
        }
        if (!any) { OSQ_ADD(2, 1); __nanosleep(500); }
    }
#undef OSQ_HAND_OVER
    __threadfence();                   /* (the host-ring records, the last block) */
    __syncwarp();
    if (lane == 0) *(volatile dtmk_u64 *)(pr + OSQ_P_DONE) = 1;
    osq_slice_end(P, lane, k, K, nw, true, false);
}
/* drainer warp p (the last DTMK_OBS_SMS / 2 observer SMs): the slice's start (host-ring cursors,
 * lows, tables), then builder p's blocks in order -- records into the ring behind what it holds
 * (drained first when a sub-ring lacks room), OSQ_W_LOW lowered to their epochs, then the tails
 * of the entries they came from; idle: drain and flush epochs below the highest step seen.  At
 * the end the last drain, OBS_PENDING ~0 and OBS_DONE */
__device__ __noinline__ void osq_drainer(const MkParams &P) {
    const unsigned lane = threadIdx.x & 31;
    const dtmk_u32 kl = threadIdx.x >> 5, Kl = osq_nwarps(), nw = (dtmk_u32)P.n_workers;
    const dtmk_u32 p = osq_pair_index(kl, Kl), K = (DTMK_OBS_SMS / 2) * Kl;
#ifdef DTMK_OSQ_STATS
    const dtmk_u32 k = (DTMK_OBS_SMS / 2) * DTMK_OBS_SM_WARPS + p;   /* (OSQ_ADD's row: after the builders') */
#endif
    if (kl >= Kl || p >= nw) return;
    Worker Wk;
    {
        dtmk_u32 sm;
        asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
        Wk.worker = p; Wk.sm = sm; Wk.hook_mask = 0; Wk.trace_on = 0; Wk.observe = 0;
    }
    for (int i = lane; i < (int)(sizeof(O.tabs) / 4); i += 32) ((dtmk_u32 *)O.tabs)[i] = 0;
    for (int i = lane; i < OBS_NACC; i += 32) { O.accs[i].cov = 0; O.accs[i].eligible = 0; }
    __syncwarp();
    if (lane == 0) { obs_init(P, Wk); O.osq_k = p; O.osq_nw = K; O.pub = ~0u; }
    __syncwarp();
    osq_slice_start(P, Wk, lane, p, K, nw);
    dtmk_u64 *pr = osq_pair(P, p);
    dtmk_u32 seq = 1;
    __threadfence();                   /* (the cursors before the builder reads them) */
    osq_pair_publish(pr, seq);
    dtmk_u32 seen = (dtmk_u32)P.step0;
    dtmk_u64 ht = 0;                   /* blocks taken */
    for (;;) {
        dtmk_u64 hd = 0, fin = 0;
        if (lane == 0) { fin = ld_acquire(pr + OSQ_P_DONE); hd = ld_acquire(pr + OSQ_P_HEAD); }
        hd = __shfl_sync(0xffffffffu, hd, 0);
        fin = __shfl_sync(0xffffffffu, fin, 0);
        if (hd == ht) {
            if (fin) break;                    /* (DONE was read before the head: no block after it) */
            if (O.tables && (O.n || O.acc_min < seen)) {
                OSQ_T0(c_sync);
                obs_sync(P, Wk, false, seen);  /* drain, flush epochs < the highest step seen */
                OSQ_CYC(6, c_sync);
                OSQ_ADD(9, 1);
            } else {
                __nanosleep(256);
            }
            OSQ_ADD(2, 1);
            continue;
        }
        OSQ_ADD(0, 1);                         /* (-DDTMK_OSQ_STATS, a drainer's row: [0] batches, [1] blocks, [2] idle polls) */
        OSQ_ADD(1, hd - ht);
        /* a batch: every block published (up to a reload block, which goes alone) -- records into
         * the ring, then one low and one fence for all, then their tails */
        OSQ_T0(c_tail);
        dtmk_u64 e = ht;
        dtmk_u32 low = ~0u;
        bool reload = false;
        for (; e < hd; ++e) {
            const dtmk_u32 *b = osq_blk(pr, e);
            const dtmk_u32 hv = lane < 20 ? __ldcg(b + lane) : 0u;   /* per hook its records; flags, commits, lo, hi */
            if (__shfl_sync(0xffffffffu, hv, 16) & OSQ_BLK_RELOAD) { reload = e == ht; break; }
            bool room = true;
            for (int h = 1; h < DTMK_NUM_HOOKS; ++h) {
                const dtmk_u32 c = __shfl_sync(0xffffffffu, hv, h);
                if (c && O.cnt[h] + c > O.cap) room = false;
            }
            if (!room) {                       /* (the tails of the batch's blocks wait: their entries hold the epochs) */
                OSQ_T0(c_sync);
                obs_sync(P, Wk, false, seen ? seen - 1 : 0u);
                OSQ_CYC(6, c_sync);
                OSQ_ADD(3, 1);
            }
            dtmk_u32 added = 0;
            for (int h = 1; h < DTMK_NUM_HOOKS; ++h) {
                const dtmk_u32 c = __shfl_sync(0xffffffffu, hv, h);
                if (!c) continue;
                const dtmk_u32 base = O.base[h], at = base + O.cnt[h];
                for (dtmk_u32 i = lane; i < c; i += 32) {
                    const uint4 *src = osq_blk_rec((dtmk_u32 *)b, base + i);
                    uint4 *dst = (uint4 *)&O.ring[at + i];
#pragma unroll
                    for (int j = 0; j < DTMK_CTX_SIZE / 16; ++j) dst[j] = __ldcg(src + j);
                }
                __syncwarp();
                if (lane == 0) { O.cnt[h] += c; O.maxc = max(O.maxc, O.cnt[h]); }
                added += c;
            }
            if (lane == 0) O.n += added;
            __syncwarp();
            seen = max(seen, __shfl_sync(0xffffffffu, hv, 19));
            low = min(low, __shfl_sync(0xffffffffu, hv, 18));
        }
        if (reload) {                          /* every earlier block ran under the old tables */
            if (lane == 0) O.reload = 1;
            __syncwarp();
            OSQ_T0(c_sync);
            while (O.reload) obs_sync(P, Wk, false, ~0u);   /* (retries while the host writes a table) */
            OSQ_CYC(6, c_sync);
            osq_publish_tables(P);
            osq_pair_publish(pr, ++seq);
            e = ht + 1;
        } else {
            /* the ring's epochs held (OSQ_W_LOW) before the tails, as osq_observer's round */
            low = min(low, O.acc_min);
            if (low < O.pub) osq_publish_low(P, low);
            __threadfence();
            for (dtmk_u64 i = ht; i < e; ++i) {    /* (block order: a later block's cursor is the larger) */
                const dtmk_u32 *b = osq_blk(pr, i);
                if (lane < __ldcg(b + 17)) {
                    const dtmk_u32 w = __ldcg(b + 32 + lane);
                    *(volatile dtmk_u64 *)(osq_w(P, w) + OSQ_W_TAIL) = __ldcg((const dtmk_u64 *)b + 32 + lane);
                }
                __syncwarp();
            }
        }
        __syncwarp();
        ht = e;
        if (lane == 0) osq_st_release(pr + OSQ_P_TAIL, ht);   /* (the blocks read before the builder reuses them) */
        OSQ_CYC(7, c_tail);
    }
    __syncwarp();
    if (O.tables) obs_sync(P, Wk, false, ~0u);       /* the last drain: every record, every epoch */
    __threadfence();
    osq_slice_end(P, lane, p, K, nw, false, true);
}
#endif
/* observer warp k of K (megakernel.cu "observer SM"): load the tables, then until every
 * worker of its slice is done and its queue empty, rounds: each lane takes the next entry
 * of one worker (up to 32 at once; the ring drained first when it lacks room for one
 * record per hook and entry), OSQ_W_LOW lowered to the records' epochs, then the tails.
 * New generation: reload.  Idle: drain and flush epochs below the highest step seen.  At
 * the end the last drain, the slice's host-ring heads, OBS_PENDING ~0 and OBS_DONE. */
__device__ __noinline__ void osq_observer(const MkParams &P) {
    const unsigned lane = threadIdx.x & 31;
    const dtmk_u32 kl = threadIdx.x >> 5, Kl = osq_nwarps(), nw = (dtmk_u32)P.n_workers;
    /* k of K: this warp among every observer SM's (-DDTMK_OBS_SMS; each runs Kl warps);
     * a warp past the workers has no slice (and no observer-state row of its own) */
    const dtmk_u32 k = (s_osq_obs - 1u) * Kl + kl, K = DTMK_OBS_SMS * Kl;
#ifdef DTMK_OSQ_SPLIT                  /* (the phases on two halves of the observer SMs) */
    if (s_osq_obs <= DTMK_OBS_SMS / 2) osq_builder(P); else osq_drainer(P);
    return;
#endif
    if (kl >= Kl || k >= nw) return;
    Worker Wk, Wl;                     /* the warp's (row k: obs_sync) and the lane's (its entry's worker) */
    {
        dtmk_u32 sm;
        asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
        Wk.worker = k; Wk.sm = Wl.sm = sm; Wk.hook_mask = 0; Wk.trace_on = 0; Wk.observe = 0;
        Wl.pend = 0; Wl.pend_rg = 0; Wl.hook_tail = 0; Wl.osq_lo = ~0u;
    }
    for (int i = lane; i < (int)(sizeof(O.tabs) / 4); i += 32) ((dtmk_u32 *)O.tabs)[i] = 0;
    for (int i = lane; i < OBS_NACC; i += 32) { O.accs[i].cov = 0; O.accs[i].eligible = 0; }
#ifdef DTMK_OSQ_DESC
    for (int i = lane; i < (int)DTMK_SH_N; i += 32) O.sh.e[i].map = 0;
    if (lane == 0) O.sh_lo = ~0u;
#ifdef DTMK_OSQ_STATS
    if (lane == 0) O.desc_n = 0;
#endif
#endif
    __syncwarp();
    if (lane == 0) {
        obs_init(P, Wk);
        O.osq_k = k; O.osq_nw = K; O.pub = ~0u;
        O.ring_mask = ld_volatile_u32((const dtmk_u32 *)P.control + CTL_HOOK_MASK);   /* the host ring's hooks */
    }
    __syncwarp();
    osq_slice_start(P, Wk, lane, k, K, nw);
    dtmk_u32 seen = (dtmk_u32)P.step0;
#ifdef DTMK_OSQ_IDLE_DRAIN
    dtmk_u32 idle = 0;                 /* idle rounds in a row with records held */
#endif
    for (;;) {
        bool any = false, all_done = true;
        for (dtmk_u32 g0 = 0; k + g0 * K < nw; g0 += 32) {
            OSQ_T0(c_scan);
            const dtmk_u32 w = k + (g0 + lane) * K;
            const dtmk_u64 *a = osq_w(P, w < nw ? w : 0u);
            dtmk_u64 head = 0, tail = 0;
            if (w < nw) {
                /* acquire: the head's entries are complete (the worker's MEMBAR or fence
                 * precedes the head) */
                head = ld_acquire(a + OSQ_W_HEAD);
                tail = osq_ld(a + OSQ_W_TAIL);
            }
            unsigned todo = __ballot_sync(0xffffffffu, head != tail);
            if (!todo) {                       /* the slice's end?  DONE, then the head again: */
                bool fin = true;               /* a worker sets DONE after its last head */
                if (w < nw) fin = ld_acquire(a + OSQ_W_DONE) != 0 && ld_acquire(a + OSQ_W_HEAD) == tail;
                all_done = __all_sync(0xffffffffu, fin) && all_done;
            } else {
                all_done = false;
            }
#ifdef DTMK_OSQ_STATS
            {
                const unsigned long long lag = __reduce_max_sync(0xffffffffu, (dtmk_u32)(head - tail));
                if (lane == 0 && lag > dtmk_osq_stats[k * OSQ_STATS_N + 8]) dtmk_osq_stats[k * OSQ_STATS_N + 8] = lag;
            }
#endif
            OSQ_CYC(4, c_scan);
            if (!todo) continue;
            any = true;
            dtmk_u32 rw = w;                   /* the lane's entry: worker rw's entry rt */
            dtmk_u64 rt = tail;
#ifdef DTMK_OSQ_MULTI
            HkRec mc;                          /* (the entry's words, when the round loaded them) */
            bool loaded = false;
            /* -DDTMK_OSQ_MULTI=D: a worker's backlog takes up to D lanes of the round (its
             * entry tail + d on lane i + d * ng; lanes i < ng are the slice's workers, as
             * without it).  1b's warps watch 5-6 workers each, so 26 of 32 lanes sat idle
             * while the busiest workers' queues filled (session 26, plan 50).  Only task
             * entries (OSQ_TAG_PEND) join at d > 0, only while no host ring takes records
             * (its cursor is per worker and entry order), and only as a prefix of the backlog. */
            const dtmk_u32 ng = (dtmk_u32)__popc(__ballot_sync(0xffffffffu, w < nw));
            const dtmk_u32 D = min((dtmk_u32)(DTMK_OSQ_MULTI), 32u / ng);
            if (D > 1 && !O.ring_mask) {
                const dtmk_u32 i = lane % ng, d = lane / ng;
                const dtmk_u32 wi = __shfl_sync(0xffffffffu, w, i);
                const dtmk_u64 hi = __shfl_sync(0xffffffffu, head, i), ti = __shfl_sync(0xffffffffu, tail, i);
                bool want = d < D && ti + d < hi;
                if (want) {                    /* the entry's words now (its tag decides; the run reuses them) --
                                                * lane i read the head with acquire, the shuffles sync the warp */
                    osq_load_entry(P, wi, ti + d, mc);
                    loaded = true;
                }
                if (want && d > 0) want = mc.v[0].x == OSQ_TAG_PEND;
                const unsigned wm = __ballot_sync(0xffffffffu, want);
                for (dtmk_u32 e = 0; e < d; ++e) want = want && ((wm >> (i + e * ng)) & 1u);
                todo = __ballot_sync(0xffffffffu, want);
                rw = wi; rt = ti + d;
            }
#endif
            if (O.cap) {                       /* room for one record per hook and entry */
                while ((dtmk_u32)__popc(todo) > O.cap) todo &= ~(1u << (31 - __clz(todo)));
                /* (flushing only epochs 2 behind the newest: the two accumulator ways hold
                 * the newest and the one before, which stragglers still add to) */
                if (O.n && O.maxc + (dtmk_u32)__popc(todo) > O.cap) {
                    OSQ_T0(c_sync);
                    obs_sync(P, Wk, false, seen ? seen - 1 : 0u);
                    OSQ_CYC(6, c_sync);
                    OSQ_ADD(3, 1);
                }
            }
            OSQ_T0(c_build);
            Wl.osq_lo = ~0u;
            dtmk_u32 st = 0;
#ifdef DTMK_OSQ_MULTI
            if ((todo >> lane) & 1u) st = loaded ? osq_run_loaded(P, Wl, rw, rt, mc) : osq_run_entry(P, Wl, rw, rt);
#else
            if ((todo >> lane) & 1u) st = osq_run_entry(P, Wl, rw, rt);
#endif
            __syncwarp();
            OSQ_CYC(5, c_build);
            OSQ_ADD(0, 1);
            OSQ_ADD(1, __popc(todo));
            OSQ_T0(c_tail);
            seen = max(seen, __reduce_max_sync(0xffffffffu, st));
            /* the ring's epochs held (OSQ_W_LOW) before the tails: a worker that reads its
             * tail == head then raises OBS_PENDING only to a low that holds them */
            const dtmk_u32 lo = min(__reduce_min_sync(0xffffffffu, Wl.osq_lo), O.acc_min);
            if (lo < O.pub) osq_publish_low(P, lo);
            __threadfence();                   /* (every lane: its records and the low before its tail) */
#ifdef DTMK_OSQ_MULTI
            {   /* lane i: its worker's entries this round (a prefix: the room cut drops the highest lanes) */
                dtmk_u32 taken = 0;
                for (dtmk_u32 e = lane; e < 32u; e += ng) taken += (todo >> e) & 1u;
                if (lane < ng && taken) *(volatile dtmk_u64 *)(osq_w(P, w) + OSQ_W_TAIL) = tail + taken;
            }
#else
            if ((todo >> lane) & 1u) *(volatile dtmk_u64 *)(osq_w(P, w) + OSQ_W_TAIL) = tail + 1;
#endif
            __syncwarp();
            OSQ_CYC(7, c_tail);
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
                if (lane == 0) O.reload = 1;
                __syncwarp();
                OSQ_T0(c_sync);
                obs_sync(P, Wk, false, ~0u);
                OSQ_CYC(6, c_sync);
                if (!O.reload) osq_publish_tables(P);
                continue;
            }
#ifdef DTMK_OSQ_IDLE_DRAIN
            /* (opt-in, session 34) an idle round drains only once DTMK_OSQ_IDLE_DRAIN rounds in a row
             * found nothing, or an epoch waits for its flush (acc_min < seen); until then the records
             * stay in the ring (their epochs held, OSQ_W_LOW) and the room rule above drains full
             * 32-record batches.  Measured (1b, hooks.md "Session 34"): ~20% less drain work, queues
             * full 8x less often, the GPC-mates' slowdown and the step unchanged -- the observers'
             * code size, not how often its passes run, is what their GPC pays for */
            if (any || O.acc_min < seen) idle = 0;
            else if (O.n && ++idle < (dtmk_u32)(DTMK_OSQ_IDLE_DRAIN)) { __nanosleep(500); continue; }
            else idle = 0;
#endif
            if (!any && (O.n || O.acc_min < seen)) {
                OSQ_T0(c_sync);
                obs_sync(P, Wk, false, seen);         /* drain, flush epochs < the highest step seen */
                OSQ_CYC(6, c_sync);
                OSQ_ADD(9, 1);
                continue;
            }
        }
        if (!any) { OSQ_ADD(2, 1); __nanosleep(500); }
    }
    __syncwarp();
    if (O.tables) obs_sync(P, Wk, false, ~0u);       /* the last drain: every record, every epoch */
#if defined(DTMK_OSQ_DESC) && defined(DTMK_OSQ_STATS)
    OSQ_ADD(10, O.desc_n);
#endif
    __threadfence();
    osq_slice_end(P, lane, k, K, nw, true, true);
}
#endif
