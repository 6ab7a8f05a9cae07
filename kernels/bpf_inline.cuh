/* bpf_inline.cuh: the compiled tier's inline form -- a compiled program run at the hook
 * site itself, on the event's thread, with no ring slot and no drain, its map updates
 * combined in a per-worker shadow table and moved into the device maps at epoch ends.
 *
 * Why: a record through the observer costs its 128-byte ring slot, a warp drain and a
 * global hash probe per map update, and a ring that fills counts records lost.  Inline,
 * nothing is lost and the maps' updates combine per worker before any global atomic.
 * Measured on the H200 (docs/results/hooks.md, session 8): as costly as the ring form
 * while the site still builds the record it runs the program over; the cheaper site
 * (the program over the captured scalars) is docs/dev/hook_cost_analysis.md's next step.
 *
 * Which programs (dtrace_mk/runtime/inline.py decides, from the verifier's types): every
 * map update is an aggregation that commutes, so applying an epoch's deltas later and in
 * another order gives the same map:
 *   hist_add on a hist_log2 / hist_linear map       -> ADD 1 to (map, key, bucket)
 *   lookup on a hash map whose value words are only
 *     xadd'ed                                       -> ADD into the shadow value
 *     ldx / jge / stx "raise to" triples            -> MAX into the shadow value
 * (keys <= 8 bytes, values <= 16 bytes); no ringbuf, no delete, no sampling or rate limit,
 * helper results the shadow cannot reproduce (hist_add's return value) never read.
 * Other maps of the program are used through the ordinary helpers.
 *
 * The shadow (one per worker, in shared memory; thread 0 only at the sites, warp 0 at the
 * flush, never both at once): entries (map, key, bucket, epoch, program slot) -> partial
 * value, open addressing over DTMK_SH_N entries with DTMK_SH_PROBE probes.  A full probe
 * window is no loss: the event goes through the ordinary helper (global map) instead.
 * The flush (obs_sync, before the coverage accumulators: so an epoch's map values are in
 * before OBS_PENDING moves past it) inserts each key (dtmk_hash_find, zero value, exactly
 * what the program's insert path does) and adds / raises its words with atomics.  A key
 * the full map refuses: its entry's events become lost (map stats.lost and the program's
 * coverage, executed -> lost), one per event as the helpers would have counted them;
 * which of an epoch's new keys get the last free slots may differ from event order (as
 * it does between workers today).
 *
 * Generated monitors include this file for the shadow and the bucket functions; the
 * kernel module (megakernel.cu, with bpf_maps.cuh before it) also gets the site function
 * and the flush.  No standard headers (NVRTC); compiles on the host (g++ shim of
 * dtrace_mk/runtime/compiled.py, one lane) for the CI differential test.
 */
#ifndef DTMK_BPF_INLINE_CUH
#define DTMK_BPF_INLINE_CUH

#include "dtrace_mk_abi.h"
#include "bpf_buckets.cuh"

#define DTMK_PROG_F_INLINE 2u      /* dtmk_prog.flags: run at the hook site (with DTMK_PROG_F_COMPILED) */
#define DTMK_SH_N 128u             /* shadow entries per worker (power of two) */
#define DTMK_SH_PROBE 16u
#define DTMK_SH_ADD 1u             /* 2 bits per value word in dtmk_sh_ent.ops */
#define DTMK_SH_MAX 2u

struct dtmk_sh_ent {
    dtmk_u64 map;      /* dtmk_map device address; 0 = free */
    dtmk_u64 key;      /* the key's bytes (key_size <= 8), zero-extended */
    dtmk_u64 val[2];   /* partial value; word i combined into the map by op i */
    dtmk_u32 epoch;    /* decode step of its events */
    dtmk_u32 n_ev;     /* events that reached it (lost if the flush cannot insert the key) */
    dtmk_u16 word;     /* hist maps: the bucket (value word) val[0] counts; hash maps: 0 */
    dtmk_u8 slot;      /* hook * DTMK_MAX_PROGS + table slot: the program's coverage */
    dtmk_u8 ops;       /* word 0: bits 0-1, word 1: bits 2-3 (DTMK_SH_ADD / DTMK_SH_MAX / 0) */
    dtmk_u32 pad;
};
static_assert(sizeof(struct dtmk_sh_ent) == 48, "dtmk_sh_ent size");

struct __align__(16) dtmk_shadow {   /* 16: the site copies the context in with 16-byte stores */
    struct dtmk_sh_ent e[DTMK_SH_N];
    /* scratch of the event being run: its context and the program's stack, here rather
     * than in local memory (thread 0's local lines miss to L2 on a busy SM) */
    struct dtmk_ctx ctx;
    dtmk_u64 stk[DTMK_STACK_SIZE / 8];
};
/* (sizeof, not offsetof: the device image's NVRTC 13.0 has no __builtin_offsetof here) */
static_assert(sizeof(struct dtmk_sh_ent) * DTMK_SH_N % 16 == 0, "dtmk_shadow.ctx takes 16-byte stores");

/* the inline entry points of a compiled monitor (dtrace_mk/runtime/compiled.py
 * monitor_source; the empty monitor's return DTMK_OUT_FAULT): one event through compiled
 * program cm_id of hook <id>, maps through shadow S, coverage slot `slot` */
#define DTMK_CM_INLINE_DECL(id)                                                                    \
    extern "C" __device__ int dtmk_cm_inline_##id(dtmk_u32 cm_id, const struct dtmk_ctx *ctx,        \
                                                  dtmk_u32 worker, dtmk_u32 epoch, dtmk_u32 flags,  \
                                                  dtmk_u64 *r0, struct dtmk_shadow *S, dtmk_u32 slot);
DTMK_CM_INLINE_DECL(1) DTMK_CM_INLINE_DECL(2) DTMK_CM_INLINE_DECL(3) DTMK_CM_INLINE_DECL(4)
DTMK_CM_INLINE_DECL(5) DTMK_CM_INLINE_DECL(6) DTMK_CM_INLINE_DECL(7) DTMK_CM_INLINE_DECL(8)
DTMK_CM_INLINE_DECL(9) DTMK_CM_INLINE_DECL(10)

/* key bytes at p (the program's stack), n <= 8, as the shadow's u64 (one load for the
 * aligned 8- and 4-byte keys the language makes) */
__device__ __forceinline__ dtmk_u64 dtmk_sh_key(dtmk_u64 p, dtmk_u32 n) {
    if (n == 8 && (p & 7) == 0) return *(const dtmk_u64 *)p;
    if (n == 4 && (p & 3) == 0) return *(const dtmk_u32 *)p;
    const dtmk_u8 *b = (const dtmk_u8 *)p;
    dtmk_u64 k = 0;
    for (dtmk_u32 i = 0; i < n; ++i) k |= (dtmk_u64)b[i] << (8 * i);
    return k;
}

/* the entry of (map, key, word, epoch, slot), claimed when absent; 0 when its probe
 * window is full (the caller uses the ordinary helper).  Counts the event on it. */
__device__ __forceinline__ struct dtmk_sh_ent *dtmk_sh_get(struct dtmk_shadow *S, dtmk_u64 map, dtmk_u64 key,
                                                          dtmk_u32 word, dtmk_u32 ops, dtmk_u32 epoch, dtmk_u32 slot) {
    const dtmk_u64 x = (map >> 4) ^ (key * 0x9E3779B97F4A7C15ull) ^ ((dtmk_u64)word << 40) ^ ((dtmk_u64)slot << 52);
    const dtmk_u32 h = (dtmk_u32)(x >> 32) ^ (dtmk_u32)x ^ epoch;
    /* not unrolled: the first probe nearly always decides, and 16 unrolled copies per
     * lookup site made the inline path ~3900 SASS instructions of cold code per hook site */
#pragma unroll 1
    for (dtmk_u32 i = 0; i < DTMK_SH_PROBE; ++i) {
        struct dtmk_sh_ent *e = &S->e[(h + i) & (DTMK_SH_N - 1)];
        if (e->map == 0) {
            e->map = map; e->key = key; e->val[0] = 0; e->val[1] = 0; e->epoch = epoch; e->n_ev = 1;
            e->word = (dtmk_u16)word; e->slot = (dtmk_u8)slot; e->ops = (dtmk_u8)ops;
            return e;
        }
        if (e->map == map && e->key == key && e->word == word && e->epoch == epoch && e->slot == slot) {
            e->n_ev += 1;
            return e;
        }
    }
    return 0;
}

#ifdef DTMK_BPF_MAPS_CUH   /* the kernel side: maps, coverage, program tables */

/* One event of `hook` through the hook's inline programs (table T), on one thread:
 * first_epoch, the compiled program, its coverage in the slot's accumulator (accs: the
 * hook's DTMK_MAX_PROGS, flushed when its key changes, as dtmk_cov_add does); r0s / outs
 * (the host driver only): each slot's r0 and outcome. */
__device__ __forceinline__ void dtmk_inl_event(const struct dtmk_hook_table &T, dtmk_u32 hook,
                                               const struct dtmk_ctx *ctx, dtmk_u32 worker, dtmk_u32 epoch,
                                               dtmk_u32 flags, struct dtmk_shadow *S, struct dtmk_cov_acc *accs,
                                               dtmk_u64 *r0s = 0, dtmk_u8 *outs = 0) {
    const dtmk_u32 gen = T.gen >> 1;
    for (dtmk_u32 k = 0; k < T.n_progs; ++k) {
        const struct dtmk_prog &P = T.progs[k];
        if (!(P.flags & DTMK_PROG_F_INLINE) || epoch < P.first_epoch) continue;
        dtmk_u64 r0 = 0;
        const dtmk_u32 cm = P.flags >> 16, slot = hook * DTMK_MAX_PROGS + k;
        int out;
        switch (hook) {
        case 1: out = dtmk_cm_inline_1(cm, ctx, worker, epoch, flags, &r0, S, slot); break;
        case 2: out = dtmk_cm_inline_2(cm, ctx, worker, epoch, flags, &r0, S, slot); break;
        case 3: out = dtmk_cm_inline_3(cm, ctx, worker, epoch, flags, &r0, S, slot); break;
        case 4: out = dtmk_cm_inline_4(cm, ctx, worker, epoch, flags, &r0, S, slot); break;
        case 5: out = dtmk_cm_inline_5(cm, ctx, worker, epoch, flags, &r0, S, slot); break;
        case 6: out = dtmk_cm_inline_6(cm, ctx, worker, epoch, flags, &r0, S, slot); break;
        case 7: out = dtmk_cm_inline_7(cm, ctx, worker, epoch, flags, &r0, S, slot); break;
        case 8: out = dtmk_cm_inline_8(cm, ctx, worker, epoch, flags, &r0, S, slot); break;
        case 9: out = dtmk_cm_inline_9(cm, ctx, worker, epoch, flags, &r0, S, slot); break;
        case 10: out = dtmk_cm_inline_10(cm, ctx, worker, epoch, flags, &r0, S, slot); break;
        default: out = DTMK_OUT_FAULT; break;
        }
        if (outs) { outs[k] = (dtmk_u8)out; r0s[k] = r0; }   /* the host driver's per-slot results */
        struct dtmk_cov_acc *a = accs + k;
        if (a->cov != P.cov || a->epoch != epoch || a->gen != gen) {
            dtmk_cov_acc_flush(a);
            a->cov = P.cov; a->epoch = epoch; a->gen = gen;
        }
        a->eligible += 1;
        a->executed += out == DTMK_OUT_EXECUTED;
        a->throttled += out == DTMK_OUT_THROTTLED;
        a->lost += out == DTMK_OUT_LOST || out == DTMK_OUT_FAULT;
        a->fault += out == DTMK_OUT_FAULT;
    }
}

/* n of entry e's events, counted executed, become lost: its accumulator when it still
 * holds e's epoch (not flushed yet), else the global coverage row (already holding them) */
__device__ __forceinline__ void dtmk_sh_lose(const struct dtmk_hook_table *tabs, struct dtmk_cov_acc *accs,
                                            const struct dtmk_sh_ent *e, dtmk_u32 n) {
    const struct dtmk_hook_table &T = tabs[e->slot / DTMK_MAX_PROGS];
    const struct dtmk_prog &P = T.progs[e->slot % DTMK_MAX_PROGS];
    struct dtmk_cov_acc *a = accs + e->slot;
    if (a->cov == P.cov && a->epoch == e->epoch && a->gen == T.gen >> 1 && a->eligible) {
        atomicAdd(&a->executed, 0u - n);
        atomicAdd(&a->lost, n);
        return;
    }
    struct dtmk_cov_row *row = dtmk_cov_row_for((struct dtmk_cov *)P.cov, e->epoch, T.gen >> 1);
    if (!row) return;                     /* no row: the events are in the overflow count */
    atomicAdd((unsigned long long *)&row->executed, 0ull - (unsigned long long)n);
    atomicAdd((unsigned long long *)&row->lost, (unsigned long long)n);
}

/* Lanes lane, lane + nl, ...: move every shadow entry into its map and free it (callers:
 * all lanes of warp 0 in obs_sync, or one host thread).  Returns whether this lane moved
 * any (the caller fences before it publishes).  tabs / accs: the tables the entries'
 * slots refer to (the flush runs before a table reload). */
__device__ __forceinline__ bool dtmk_sh_flush(struct dtmk_shadow *S, const struct dtmk_hook_table *tabs,
                                              struct dtmk_cov_acc *accs, unsigned lane, unsigned nl) {
    bool moved = false;
    for (unsigned i = lane; i < DTMK_SH_N; i += nl) {
        struct dtmk_sh_ent *e = &S->e[i];
        if (!e->map) continue;
        const struct dtmk_map *m = (const struct dtmk_map *)e->map;
        bool created;
        const int s = dtmk_hash_find(m, &e->key, true, 0, &created);
        if (s >= 0) {
            unsigned long long *v = (unsigned long long *)dtmk_hash_value(m, s) + e->word;
            for (int w = 0; w < 2; ++w) {
                const dtmk_u32 op = (e->ops >> (2 * w)) & 3u;
                if (!e->val[w]) continue;          /* 0: identity of both (the key is in) */
                if (op == DTMK_SH_ADD) atomicAdd(v + w, (unsigned long long)e->val[w]);
                else if (op == DTMK_SH_MAX) atomicMax(v + w, (unsigned long long)e->val[w]);
            }
        } else {                                   /* the map is full: dtmk_hash_find counted one */
            if (e->n_ev > 1) atomicAdd((unsigned long long *)&dtmk_stats(m)->lost, (unsigned long long)(e->n_ev - 1));
            dtmk_sh_lose(tabs, accs, e, e->n_ev);
        }
        e->map = 0;
        moved = true;
    }
    return moved;
}

#endif /* DTMK_BPF_MAPS_CUH */
#endif /* DTMK_BPF_INLINE_CUH */
