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
 * dtrace_mk/runtime/compiled/host.py, one lane) for the CI differential test.
 */
#ifndef DTMK_BPF_INLINE_CUH
#define DTMK_BPF_INLINE_CUH

#include "dtrace_mk_abi.h"
#include "bpf_buckets.cuh"

#include "bpf_prog_flags.h"   /* DTMK_PROG_F_INLINE, DTMK_PROG_F_DESC */
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

/* the inline entry points of a compiled monitor (dtrace_mk/runtime/compiled/translator.py
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

/* where the probe for (map, key, word, epoch, slot) starts */
__device__ __forceinline__ dtmk_u32 dtmk_sh_hash(dtmk_u64 map, dtmk_u64 key, dtmk_u32 word, dtmk_u32 epoch,
                                                 dtmk_u32 slot) {
    const dtmk_u64 x = (map >> 4) ^ (key * 0x9E3779B97F4A7C15ull) ^ ((dtmk_u64)word << 40) ^ ((dtmk_u64)slot << 52);
    return (dtmk_u32)(x >> 32) ^ (dtmk_u32)x ^ epoch;
}

/* the entry of (map, key, word, epoch, slot), claimed when absent; 0 when its probe
 * window is full (the caller uses the ordinary helper).  Counts the event on it. */
__device__ __forceinline__ struct dtmk_sh_ent *dtmk_sh_get(struct dtmk_shadow *S, dtmk_u64 map, dtmk_u64 key,
                                                          dtmk_u32 word, dtmk_u32 ops, dtmk_u32 epoch, dtmk_u32 slot) {
    const dtmk_u32 h = dtmk_sh_hash(map, key, word, epoch, slot);
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

/* dtmk_sh_get for a shadow that several lanes of a warp update at once (-DDTMK_OSQ_DESC:
 * an observer warp's lanes each run one record's descriptors).  A free entry is claimed
 * by CAS to DTMK_SH_BUSY, filled, then its map published; a lane that meets a claim in
 * progress waits for it (independent thread scheduling lets the claimer finish).  The
 * values are then updated with shared-memory atomics (dtmk_desc_run<true>). */
#define DTMK_SH_BUSY 1ull          /* (no dtmk_map is at address 1) */
__device__ __forceinline__ struct dtmk_sh_ent *dtmk_sh_get_mt(struct dtmk_shadow *S, dtmk_u64 map, dtmk_u64 key,
                                                             dtmk_u32 word, dtmk_u32 ops, dtmk_u32 epoch, dtmk_u32 slot) {
    const dtmk_u32 h = dtmk_sh_hash(map, key, word, epoch, slot);
#pragma unroll 1
    for (dtmk_u32 i = 0; i < DTMK_SH_PROBE; ++i) {
        struct dtmk_sh_ent *e = &S->e[(h + i) & (DTMK_SH_N - 1)];
        volatile struct dtmk_sh_ent *ve = e;
        dtmk_u64 m = ve->map;
        if (m == 0) {
            m = atomicCAS((unsigned long long *)&e->map, 0ull, DTMK_SH_BUSY);
            if (m == 0) {                  /* claimed: fill, then publish the map */
                ve->key = key; ve->val[0] = 0; ve->val[1] = 0; ve->epoch = epoch; ve->n_ev = 1;
                ve->word = (dtmk_u16)word; ve->slot = (dtmk_u8)slot; ve->ops = (dtmk_u8)ops;
                __threadfence_block();
                ve->map = map;
                return e;
            }
        }
        while (m == DTMK_SH_BUSY) m = ve->map;
        __threadfence_block();             /* (the claimer's fields before its map) */
        if (m == map && ve->key == key && ve->word == word && ve->epoch == epoch && ve->slot == slot) {
            atomicAdd((unsigned *)&e->n_ev, 1u);
            return e;
        }
    }
    return 0;
}

/* ---- the descriptor form -------------------------------------------------------------
 * A program that dtrace_mk/runtime/aggdesc.py reduced to aggregation descriptors runs from
 * data at the site: no compile, no interpreter, no ring, in the hot tier as well
 * (dtmk_prog.flags DTMK_PROG_F_INLINE | DTMK_PROG_F_DESC; dtmk_prog.descs: its entries).
 * Encoded by dtrace_mk/runtime/descform.py (the one source of this layout besides the
 * struct, checked against it through NVRTC static_asserts).
 *
 * The entries are the program's cases, in order: a case's GUARDs, its AGGs, then END.  The
 * first case whose guards all hold applies its AGGs and ends the run; none holds: no
 * update (the cases are disjoint: aggdesc drops the ones that update nothing).  An AGG is
 * one update into the shadow, keyed exactly like the compiled inline form's: a hist bucket
 * +1, or a hash value word added to / raised to the value.  DTMK_D_SAME: the previous AGG's
 * entry (a second word of the same lookup, e.g. avg's sum and count). */
#define DTMK_D_END 0u
#define DTMK_D_GUARD 1u
#define DTMK_D_AGG 2u
#define DTMK_D_SAME 0x80u          /* kind bit of an AGG: the previous AGG's shadow entry */
#define DTMK_D_SRC_WORKER 0xfeu    /* a source: a context byte offset (< DTMK_CTX_SIZE) or these */
#define DTMK_D_SRC_CONST 0xffu     /* (the value: vconst) */
#define DTMK_D_HIST_LOG2 4u        /* AGG op: DTMK_SH_ADD / DTMK_SH_MAX into hash value word */
#define DTMK_D_HIST_LIN 5u         /* `word`, or +1 into the value's bucket of a hist map */
#define DTMK_D_TAKEN 0x40u         /* GUARD op: the comparison (DTMK_D_JEQ..) | TAKEN | WIDE */
#define DTMK_D_WIDE 0x80u          /* 64-bit compare (else the low 32 bits: jmp32) */
enum { DTMK_D_JEQ, DTMK_D_JGT, DTMK_D_JGE, DTMK_D_JLT, DTMK_D_JLE, DTMK_D_JSET, DTMK_D_JNE, DTMK_D_JSGT,
       DTMK_D_JSGE, DTMK_D_JSLT, DTMK_D_JSLE };

struct __align__(16) dtmk_desc {   /* 96 bytes */
    dtmk_u64 map;                  /* AGG: the dtmk_map (device address) */
    dtmk_u64 kconst;               /* AGG: the key's constant bytes in place (0 elsewhere) */
    dtmk_u64 vconst;               /* AGG: the value when vsrc is DTMK_D_SRC_CONST; GUARD: the constant */
    dtmk_s64 lin_lo, lin_hi, lin_step;   /* HIST_LIN: the map's buckets */
    dtmk_u8 kind, op, vsrc, vsize;       /* vsrc / vsize: the value (AGG) or the compared operand (GUARD) */
    dtmk_u8 word, shops, nparts, pad0;   /* shops: the shadow ops of the map in this program */
    dtmk_u8 ksrc[4], ksize[4], kpos[4];  /* key part i: source, bytes, byte position in the key */
    dtmk_u32 nb;                         /* hist maps: buckets */
    dtmk_u32 pad1[2];
    /* the lean form (an AGG of a DTMK_PROG_F_LEAN program, not SAME): its region of the
     * worker's cells -- first cell, cells per key -- and per key part the stride in cells
     * (bit 15, DTMK_LEAN_NONE: DTMK_NONE_U32 is index ldom) and the domain 0..ldom-1
     * (0: the part is the worker's own id or the epoch, index 0) */
    dtmk_u16 lbase, lper;
    dtmk_u16 lstride[4];
    dtmk_u8 ldom[4];
};
static_assert(sizeof(struct dtmk_desc) == 96, "dtmk_desc size");

/* a source's value: `size` bytes of the context at `src` (zero-extended), or worker / c */
__device__ __forceinline__ dtmk_u64 dtmk_desc_src(const struct dtmk_ctx *ctx, dtmk_u32 src, dtmk_u32 size,
                                                  dtmk_u32 worker, dtmk_u64 c) {
    if (src == DTMK_D_SRC_CONST) return c;
    if (src == DTMK_D_SRC_WORKER) return worker;
    const dtmk_u8 *p = (const dtmk_u8 *)ctx + src;   /* aligned to its size (descform.py checks) */
    return size == 8 ? *(const dtmk_u64 *)p : size == 4 ? *(const dtmk_u32 *)p
         : size == 2 ? *(const dtmk_u16 *)p : *p;
}

/* *p (a struct of 16-byte multiples, 16-aligned, in any space) into registers, its loads issued
 * together before any branch: of a plain copy the compiler sinks each field's load to its first
 * use, one dependent trip each behind the branches before it */
template <class T>
__device__ __forceinline__ T dtmk_load_whole(const T *p) {
    static_assert(sizeof(T) % 16 == 0, "dtmk_load_whole: 16-byte multiples");
#ifdef __CUDA_ARCH__
    T r;
    dtmk_u32 *d = (dtmk_u32 *)&r;
#pragma unroll
    for (int i = 0; i < (int)(sizeof(T) / 16); ++i)
        asm volatile("ld.relaxed.cta.v4.u32 {%0, %1, %2, %3}, [%4];"
                     : "=r"(d[4 * i]), "=r"(d[4 * i + 1]), "=r"(d[4 * i + 2]), "=r"(d[4 * i + 3])
                     : "l"((const char *)p + 16 * i));
    return r;
#else
    return *p;
#endif
}

__device__ __forceinline__ bool dtmk_desc_guard(const struct dtmk_desc &d, dtmk_u64 v) {
    dtmk_u64 c = d.vconst;
    if (!(d.op & DTMK_D_WIDE)) { v = (dtmk_u32)v; c = (dtmk_u32)c; }
    const dtmk_u64 sb = (d.op & DTMK_D_WIDE) ? 1ull << 63 : 1ull << 31;   /* signed: flip the sign bit */
    bool r;
    switch (d.op & 15u) {
    case DTMK_D_JEQ: r = v == c; break;
    case DTMK_D_JGT: r = v > c; break;
    case DTMK_D_JGE: r = v >= c; break;
    case DTMK_D_JLT: r = v < c; break;
    case DTMK_D_JLE: r = v <= c; break;
    case DTMK_D_JSET: r = (v & c) != 0; break;
    case DTMK_D_JNE: r = v != c; break;
    case DTMK_D_JSGT: r = (v ^ sb) > (c ^ sb); break;
    case DTMK_D_JSGE: r = (v ^ sb) >= (c ^ sb); break;
    case DTMK_D_JSLT: r = (v ^ sb) < (c ^ sb); break;
    default: r = (v ^ sb) <= (c ^ sb); break;
    }
    return r == ((d.op & DTMK_D_TAKEN) != 0);
}

/* The guards of the case at D[i] (the descriptor and the lean forms' one walk): whether they
 * all hold, with i at the case's first AGG; if not, i past its END.  operand(g): the value
 * guard g compares */
template <class F>
__device__ __forceinline__ bool dtmk_desc_case(const struct dtmk_desc *D, dtmk_u32 &i, const F &operand) {
    bool hold = true;
#pragma unroll 1
    for (; D[i].kind == DTMK_D_GUARD; ++i) hold = hold && dtmk_desc_guard(D[i], operand(D[i]));
    if (hold) return true;
    while (D[i].kind != DTMK_D_END) ++i;
    ++i;
    return false;
}

/* ---- the lean form ---------------------------------------------------------------------
 * A descriptor program whose every AGG key part has a small dense domain (a task class, a
 * layer, an expert; the worker's own id and the epoch count as one value) runs into dense
 * per-worker cells instead of the keyed shadow: the key's parts index the AGG's region
 * (base + part x stride + bucket or word), so an update is one shared-memory add, no probe;
 * the fields come from the event's record through the caller's reader (the megakernel: a
 * shared-memory copy of the record, read by byte offset).  The host lays the regions out
 * (dtrace_mk/runtime/descform.py lean_layout) within DTMK_LEAN_CELLS 32-bit cells per bank;
 * a worker keeps two banks (epoch parity) and dtmk_lean_fold moves a bank into the maps
 * (obs_sync, before the coverage accumulators, as the shadow's flush).  Cells per key: a
 * hist map's buckets (each cell counts its events); a hash map's value words as (lo, hi)
 * cell pairs, then the key's event count.  A part outside its domain (the host's domains
 * are the megakernel's own: it cannot happen) is counted lost, never folded elsewhere. */
#define DTMK_LEAN_NONE 0x8000u     /* lstride bit: the part's DTMK_NONE_U32 is index ldom */
#ifndef DTMK_LEAN_CELLS
#define DTMK_LEAN_CELLS 1024u      /* 32-bit cells per bank (4 KB; two banks per worker) */
#endif

/* a context reader over a record in memory (the megakernel's shared copy; the host driver):
 * the aligned 8 bytes holding the field, shifted and masked -- no branch on the size (a field is
 * aligned to its size: descform.py checks; little-endian as the device) */
struct dtmk_ctx_reader {
    const struct dtmk_ctx *c;
    __device__ __forceinline__ dtmk_u64 operator()(dtmk_u32 src, dtmk_u32 size) const {
        const dtmk_u64 w = *(const dtmk_u64 *)((const dtmk_u8 *)c + (src & ~7u)) >> (8u * (src & 7u));
        return size >= 8 ? w : w & ((1ull << (8u * size)) - 1);
    }
};

template <class R>
__device__ __forceinline__ dtmk_u64 dtmk_lean_src(const R &rd, dtmk_u32 src, dtmk_u32 size, dtmk_u32 worker,
                                                  dtmk_u64 c) {
    const dtmk_u64 f = rd(src & (DTMK_CTX_SIZE - 1u), size);   /* (read before the choice: no branch) */
    return src == DTMK_D_SRC_CONST ? c : src == DTMK_D_SRC_WORKER ? (dtmk_u64)worker : f;
}

/* a dense key part's cell offset: a value kv inside its domain -> kv * stride; DTMK_NONE_U32 (the
 * field's all-ones below 4 bytes) where the stride has DTMK_LEAN_NONE -> dom * stride (the index past
 * the domain); anything else is outside (false) -- the walk's and the fast ops' one rule */
__device__ __forceinline__ bool dtmk_lean_part(dtmk_u64 kv, dtmk_u32 ksize, dtmk_u32 dom, dtmk_u32 stride,
                                               dtmk_u32 &off) {
    const dtmk_u32 st = stride & ~DTMK_LEAN_NONE;
    const dtmk_u64 none = ksize < 4 ? (1ull << (8 * ksize)) - 1 : DTMK_NONE_U32;
    if (kv < dom) { off = (dtmk_u32)kv * st; return true; }
    if ((stride & DTMK_LEAN_NONE) && kv == none) { off = dom * st; return true; }
    return false;
}

/* one event through a lean program's descriptors D[0..n) into `cells` (the bank of the
 * event's epoch); DTMK_OUT_LOST when a key part was outside its domain */
template <class R>
__device__ __forceinline__ int dtmk_lean_run(const struct dtmk_desc *D, dtmk_u32 n, const R &rd, dtmk_u32 worker,
                                             dtmk_u32 *cells) {
    dtmk_u32 i = 0;
#pragma unroll 1
    while (i < n) {                                    /* one case per round (dtmk_desc_run's order) */
        if (!dtmk_desc_case(D, i, [&](const struct dtmk_desc &g) {
                return dtmk_lean_src(rd, g.vsrc, g.vsize, worker, g.vconst); }))
            continue;
        dtmk_u32 at = 0;                               /* the lookup's first cell */
        bool in = true;
#pragma unroll 1
        for (; D[i].kind != DTMK_D_END; ++i) {
            const struct dtmk_desc &d = D[i];
            const dtmk_u64 v = dtmk_lean_src(rd, d.vsrc, d.vsize, worker, d.vconst);
            if (!(d.kind & DTMK_D_SAME)) {
                at = d.lbase;
                for (dtmk_u32 p = 0; p < d.nparts; ++p) {
                    if (!d.ldom[p]) continue;          /* the worker's own id / the epoch */
                    dtmk_u64 kv = dtmk_lean_src(rd, d.ksrc[p], d.ksize[p], worker, 0);
                    if (d.ksize[p] < 8) kv &= (1ull << (8 * d.ksize[p])) - 1;
                    dtmk_u32 off = 0;
                    if (dtmk_lean_part(kv, d.ksize[p], d.ldom[p], d.lstride[p], off)) at += off;
                    else in = false;
                }
                if (in && d.op < DTMK_D_HIST_LOG2) cells[at + d.lper - 1] += 1;   /* the key's events */
            }
            if (!in) continue;
            if (d.op >= DTMK_D_HIST_LOG2) {
                cells[at + (d.op == DTMK_D_HIST_LOG2 ? dtmk_bucket_log2(v)
                                                     : dtmk_bucket_linear(d.lin_lo, d.lin_hi, d.lin_step, d.nb, v))] += 1;
                continue;
            }
            dtmk_u32 *w = cells + at + 2 * d.word;
            const dtmk_u64 old = (dtmk_u64)w[1] << 32 | w[0];
            const dtmk_u64 x = d.op == DTMK_SH_ADD ? old + v : (v > old ? v : old);
            w[0] = (dtmk_u32)x; w[1] = (dtmk_u32)(x >> 32);
        }
        return in ? DTMK_OUT_EXECUTED : DTMK_OUT_LOST;
    }
    return DTMK_OUT_EXECUTED;
}

#ifdef DTMK_BPF_MAPS_CUH
/* one event through a program's descriptors D[0..n): its shadow updates (a full probe
 * window: the global map directly, as the compiled form's ordinary helper would);
 * DTMK_OUT_LOST when the map refused a new key (counted in its stats by the helper) */
template <bool MT = false>   /* MT: lanes share S (dtmk_sh_get_mt, atomic value updates) */
__device__ __forceinline__ int dtmk_desc_run(const struct dtmk_desc *D, dtmk_u32 n, const struct dtmk_ctx *ctx,
                                             dtmk_u32 worker, dtmk_u32 epoch, struct dtmk_shadow *S, dtmk_u32 slot) {
    dtmk_u32 i = 0;
#pragma unroll 1
    while (i < n) {                                    /* one case per round */
        if (!dtmk_desc_case(D, i, [&](const struct dtmk_desc &g) {
                return dtmk_desc_src(ctx, g.vsrc, g.vsize, worker, g.vconst); }))
            continue;
        struct dtmk_sh_ent *e = 0;
        int out = DTMK_OUT_EXECUTED;
#pragma unroll 1
        for (; D[i].kind != DTMK_D_END; ++i) {
            const struct dtmk_desc &d = D[i];
            const dtmk_u64 v = dtmk_desc_src(ctx, d.vsrc, d.vsize, worker, d.vconst);
            const struct dtmk_map *m = (const struct dtmk_map *)d.map;
            if (out != DTMK_OUT_EXECUTED) continue;   /* the lookup-or-insert failed: no further word */
            dtmk_u64 key = d.kconst;
            if (!(d.kind & DTMK_D_SAME) || !e) {
                for (dtmk_u32 p = 0; p < d.nparts; ++p) {
                    const dtmk_u64 kv = dtmk_desc_src(ctx, d.ksrc[p], d.ksize[p], worker, 0);
                    key |= (d.ksize[p] == 8 ? kv : kv & ((1ull << (8 * d.ksize[p])) - 1)) << (8 * d.kpos[p]);
                }
            }
            if (d.op >= DTMK_D_HIST_LOG2) {
                const dtmk_u32 b = d.op == DTMK_D_HIST_LOG2 ? dtmk_bucket_log2(v)
                                 : dtmk_bucket_linear(d.lin_lo, d.lin_hi, d.lin_step, d.nb, v);
                e = MT ? dtmk_sh_get_mt(S, d.map, key, b, 1u, epoch, slot) : dtmk_sh_get(S, d.map, key, b, 1u, epoch, slot);
                if (e) {
                    if (MT) atomicAdd((unsigned long long *)&e->val[0], 1ull);
                    else e->val[0] += 1;
                    continue;
                }
                bool lost = false;
                dtmk_hist_add(m, &key, v, &lost);
                if (lost) out = DTMK_OUT_LOST;
                continue;
            }
            if (!(d.kind & DTMK_D_SAME) || !e)
                e = MT ? dtmk_sh_get_mt(S, d.map, key, 0u, d.shops, epoch, slot) : dtmk_sh_get(S, d.map, key, 0u, d.shops, epoch, slot);
            if (e) {
                if (MT) {
                    if (d.op == DTMK_SH_ADD) atomicAdd((unsigned long long *)&e->val[d.word], (unsigned long long)v);
                    else atomicMax((unsigned long long *)&e->val[d.word], (unsigned long long)v);
                } else if (d.op == DTMK_SH_ADD) e->val[d.word] += v;
                else if (v > e->val[d.word]) e->val[d.word] = v;
                continue;
            }
            bool created;                              /* the probe window is full: the map itself */
            const int s = dtmk_hash_find(m, &key, true, 0, &created);
            if (s < 0) { out = DTMK_OUT_LOST; continue; }
            unsigned long long *w = (unsigned long long *)dtmk_hash_value(m, s) + d.word;
            if (d.op == DTMK_SH_ADD) atomicAdd(w, (unsigned long long)v);
            else atomicMax(w, (unsigned long long)v);
        }
        return out;
    }
    return DTMK_OUT_EXECUTED;
}
#endif

#ifdef DTMK_BPF_MAPS_CUH   /* the kernel side: maps, coverage, program tables */

/* one event's outcome in a slot's coverage accumulator (flushed when its key changes, as
 * dtmk_cov_add does) */
__device__ __forceinline__ void dtmk_acc_count(struct dtmk_cov_acc *a, dtmk_u64 cov, dtmk_u32 epoch, dtmk_u32 gen,
                                               int out) {
    if (a->cov != cov || a->epoch != epoch || a->gen != gen) {
        dtmk_cov_acc_flush(a);
        a->cov = cov; a->epoch = epoch; a->gen = gen;
    }
    a->eligible += 1;
    if (out == DTMK_OUT_EXECUTED) {       /* (the common case: two shared read-modify-writes, not five) */
        a->executed += 1;
        return;
    }
    a->throttled += out == DTMK_OUT_THROTTLED;
    a->lost += out == DTMK_OUT_LOST || out == DTMK_OUT_FAULT;
    a->fault += out == DTMK_OUT_FAULT;
}

/* One event of `hook` through the hook's inline programs (table T), on one thread:
 * first_epoch / end_epoch, the compiled program, its coverage in the slot's accumulator (accs: the
 * hook's DTMK_MAX_PROGS, flushed when its key changes, as dtmk_cov_add does); r0s / outs
 * (the host driver only): each slot's r0 and outcome. */
__device__ __forceinline__ void dtmk_inl_event(const struct dtmk_hook_table &T, dtmk_u32 hook,
                                               const struct dtmk_ctx *ctx, dtmk_u32 worker, dtmk_u32 epoch,
                                               dtmk_u32 flags, struct dtmk_shadow *S, struct dtmk_cov_acc *accs,
                                               dtmk_u64 *r0s = 0, dtmk_u8 *outs = 0,
                                               const struct dtmk_desc *loaded = 0) {
    const dtmk_u32 gen = T.gen >> 1;
    for (dtmk_u32 k = 0; k < T.n_progs; ++k) {
        const struct dtmk_prog &P = T.progs[k];
        if ((P.flags & (DTMK_PROG_F_INLINE | DTMK_PROG_F_LEAN)) != DTMK_PROG_F_INLINE || !DTMK_PROG_COUNTS(P, epoch))
            continue;                                  /* (lean slots: dtmk_lean_event) */
        dtmk_u64 r0 = 0;
        const dtmk_u32 cm = P.flags >> 16, slot = hook * DTMK_MAX_PROGS + k;
        int out;
        if (P.flags & DTMK_PROG_F_DESC) {
            /* loaded: the kernel's shared copy (P.desc_at = index + 1; 0: not loaded, never
             * while the host keeps the sum of entries within DTMK_OBS_DESC); else P.descs */
            if (!loaded) out = dtmk_desc_run((const struct dtmk_desc *)P.descs, P.n_descs, ctx, worker, epoch, S, slot);
            else if (P.desc_at) out = dtmk_desc_run(loaded + (P.desc_at - 1), P.n_descs, ctx, worker, epoch, S, slot);
            else out = DTMK_OUT_FAULT;
        } else {
#ifdef DTMK_INL_DESC_ONLY   /* a kernel without a linked monitor (the hot tier's build): descriptors only */
            out = DTMK_OUT_FAULT;
#else
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
#endif
        }
        if (outs) { outs[k] = (dtmk_u8)out; r0s[k] = r0; }   /* the host driver's per-slot results */
        dtmk_acc_count(accs + k, P.cov, epoch, gen, out);
    }
}

/* a lean slot's descriptors: in the kernel's shared copy `loaded` (0: it did not fit there),
 * or, without one (the host driver), the program's own */
__device__ __forceinline__ const struct dtmk_desc *dtmk_lean_descs(const struct dtmk_prog &P,
                                                                  const struct dtmk_desc *loaded) {
    return !loaded ? (const struct dtmk_desc *)P.descs : P.desc_at ? loaded + (P.desc_at - 1) : 0;
}

/* One event of `hook` through its lean programs (the bank `cells` of the event's epoch, 0:
 * none free -- the event is counted lost; the descriptors in the kernel's shared copy
 * `loaded`, or each program's own): as dtmk_inl_event, whose slot loop skips them.  outs
 * (the host driver only): each slot's outcome. */
template <class R>
__device__ __forceinline__ void dtmk_lean_event(const struct dtmk_hook_table &T, const R &rd, dtmk_u32 worker,
                                                dtmk_u32 epoch, dtmk_u32 *cells, struct dtmk_cov_acc *accs,
                                                const struct dtmk_desc *loaded, dtmk_u8 *outs = 0) {
    const dtmk_u32 gen = T.gen >> 1;
    for (dtmk_u32 k = 0; k < T.n_progs; ++k) {
        const struct dtmk_prog &P = T.progs[k];
        if (!(P.flags & DTMK_PROG_F_LEAN) || !DTMK_PROG_COUNTS(P, epoch)) continue;
        const struct dtmk_desc *D = dtmk_lean_descs(P, loaded);
#ifdef DTMK_LEAN_SPLIT   /* MEASUREMENT ONLY: the run [20, 21], the coverage [22, 23] */
        DTMK_PROF_BEGIN(lp_run);
#endif
        const int out = !D ? DTMK_OUT_FAULT : !cells ? DTMK_OUT_LOST : dtmk_lean_run(D, P.n_descs, rd, worker, cells);
#ifdef DTMK_LEAN_SPLIT
        DTMK_PROF_END1(20, lp_run);
        DTMK_PROF_BEGIN(lp_acc);
#endif
        if (outs) outs[k] = (dtmk_u8)out;
        dtmk_acc_count(accs + k, P.cov, epoch, gen, out);
#ifdef DTMK_LEAN_SPLIT
        DTMK_PROF_END1(22, lp_acc);
#endif
    }
}

/* The lean form's fast path.  A lean slot whose program is one unguarded AGG -- ADD or MAX into
 * a hash value word, or +1 into a log2 histogram bucket -- with at most one key part of a dense
 * domain is compiled, when the table is loaded, into one 32-byte op: what dtmk_lean_event reads
 * of the slot, its program and its descriptors in one round of loads, and run with no walk.
 * A hook whose lean slots all compile runs them so; else the walk (dtmk_lean_event).  Why:
 * session 64 measured the walk at ~0.74 us per one-AGG program on 1b's busy SMs, with its
 * descriptors' loads issued together (-DDTMK_LEAN_SPLIT) as much as field by field; with the
 * ops hk_lean took 0.68 us per event instead of ~1.3 (H100, docs/results/hooks.md). */
struct __align__(16) dtmk_lean_op {   /* 32 bytes */
    dtmk_u64 cov;                      /* the slot's coverage (its accumulator's key) */
    dtmk_u32 first_epoch, end_epoch;   /* the slot's window (DTMK_PROG_COUNTS) */
    dtmk_u32 vconst;                   /* the value when vsrc is DTMK_D_SRC_CONST */
    dtmk_u16 at, kstride;              /* the value's cell (region + word) at key index 0; cells per index
                                        * (DTMK_LEAN_NONE: DTMK_NONE_U32 is index kdom) */
    dtmk_u8 op, slot, vsrc, vsize;     /* op: DTMK_SH_ADD / DTMK_SH_MAX / DTMK_D_HIST_LOG2 */
    dtmk_u8 ksrc, ksize, kdom, cnt;    /* the dense part (kdom 0: none); cnt: the key's count cell
                                        * past the value's (ADD / MAX) */
};
static_assert(sizeof(struct dtmk_lean_op) == 32, "dtmk_lean_op size");
#ifndef DTMK_LEAN_OPS
#define DTMK_LEAN_OPS 16u              /* a worker's compiled ops, all hooks (512 bytes of shared memory) */
#endif
#define DTMK_LEAN_SLOW 0xffu           /* a hook's op count when one of its lean slots did not compile */

/* the ops of T's lean slots into ops[0..max): their number, or DTMK_LEAN_SLOW (descriptors as
 * dtmk_lean_event finds them: the shared copy `loaded`, or each program's own) */
__device__ __forceinline__ dtmk_u32 dtmk_lean_compile(const struct dtmk_hook_table &T, const struct dtmk_desc *loaded,
                                                      struct dtmk_lean_op *ops, dtmk_u32 max) {
    dtmk_u32 n = 0;
    for (dtmk_u32 k = 0; k < T.n_progs; ++k) {
        const struct dtmk_prog &P = T.progs[k];
        if (!(P.flags & DTMK_PROG_F_LEAN)) continue;
        const struct dtmk_desc *D = dtmk_lean_descs(P, loaded);
        if (!D || n == max || P.n_descs != 2 || D[0].kind != DTMK_D_AGG || D[1].kind != DTMK_D_END) return DTMK_LEAN_SLOW;
        const struct dtmk_desc &d = D[0];
        if (d.op != DTMK_SH_ADD && d.op != DTMK_SH_MAX && d.op != DTMK_D_HIST_LOG2) return DTMK_LEAN_SLOW;
        if (d.vsrc == DTMK_D_SRC_CONST && d.vconst > 0xffffffffull) return DTMK_LEAN_SLOW;
        struct dtmk_lean_op o = {};
        for (dtmk_u32 p = 0; p < d.nparts; ++p) {
            if (!d.ldom[p]) continue;              /* the worker's own id / the epoch: index 0 */
            if (o.kdom) return DTMK_LEAN_SLOW;     /* two dense parts: the walk */
            o.ksrc = d.ksrc[p]; o.ksize = d.ksize[p]; o.kdom = d.ldom[p]; o.kstride = d.lstride[p];
        }
        const bool hist = d.op == DTMK_D_HIST_LOG2;
        o.cov = P.cov; o.first_epoch = P.first_epoch; o.end_epoch = P.end_epoch;
        o.vconst = (dtmk_u32)d.vconst; o.vsrc = d.vsrc; o.vsize = d.vsize;
        o.op = d.op; o.slot = (dtmk_u8)k;
        o.at = (dtmk_u16)(d.lbase + (hist ? 0u : 2u * d.word));
        o.cnt = (dtmk_u8)(hist ? 0u : d.lper - 1u - 2u * d.word);
        ops[n++] = o;
    }
    return n;
}

/* One event through a hook's n compiled lean ops (dtmk_lean_event's outcomes and coverage) */
template <class R>
__device__ __forceinline__ void dtmk_lean_fast(const struct dtmk_lean_op *ops, dtmk_u32 n, dtmk_u32 gen, const R &rd,
                                               dtmk_u32 worker, dtmk_u32 epoch, dtmk_u32 *cells,
                                               struct dtmk_cov_acc *accs, dtmk_u8 *outs = 0) {
    for (dtmk_u32 j = 0; j < n; ++j) {
        const struct dtmk_lean_op o = dtmk_load_whole(ops + j);
        if (!DTMK_PROG_COUNTS(o, epoch)) continue;
        const dtmk_u64 kv = rd(o.ksrc, o.ksize);   /* (a dense part is a context field; none: 0, 0) */
        const dtmk_u64 v = dtmk_lean_src(rd, o.vsrc, o.vsize, worker, (dtmk_u64)o.vconst);
        dtmk_u32 off = 0;
        const bool in = !o.kdom || dtmk_lean_part(kv, o.ksize, o.kdom, o.kstride, off);
        int out = DTMK_OUT_LOST;
        if (cells && in) {
            dtmk_u32 *c = cells + o.at + off;
            if (o.op == DTMK_D_HIST_LOG2) {
                c[dtmk_bucket_log2(v)] += 1;
            } else {
                c[o.cnt] += 1;                     /* the key's events */
                const dtmk_u64 old = (dtmk_u64)c[1] << 32 | c[0];
                const dtmk_u64 x = o.op == DTMK_SH_ADD ? old + v : (v > old ? v : old);
                c[0] = (dtmk_u32)x; c[1] = (dtmk_u32)(x >> 32);
            }
            out = DTMK_OUT_EXECUTED;
        }
        if (outs) outs[o.slot] = (dtmk_u8)out;
        dtmk_acc_count(accs + o.slot, o.cov, epoch, gen, out);
    }
}

/* One event of `hook` at the site: its compiled ops (n of them), or its descriptor walk when
 * n is DTMK_LEAN_SLOW -- the megakernel's hk_lean and the host driver alike */
template <class R>
__device__ __forceinline__ void dtmk_lean_hook(const struct dtmk_lean_op *ops, dtmk_u32 n,
                                               const struct dtmk_hook_table &T, const R &rd, dtmk_u32 worker,
                                               dtmk_u32 epoch, dtmk_u32 *cells, struct dtmk_cov_acc *accs,
                                               const struct dtmk_desc *loaded, dtmk_u8 *outs = 0) {
    if (n != DTMK_LEAN_SLOW) dtmk_lean_fast(ops, n, T.gen >> 1, rd, worker, epoch, cells, accs, outs);
    else dtmk_lean_event(T, rd, worker, epoch, cells, accs, loaded, outs);
}

/* n events of slot `slot` in `epoch`, counted executed, become lost: its accumulator when it still
 * holds that epoch (not flushed yet), else the global coverage row (already holding them) */
__device__ __forceinline__ void dtmk_slot_lose(const struct dtmk_hook_table *tabs, struct dtmk_cov_acc *accs,
                                              dtmk_u32 slot, dtmk_u32 epoch, dtmk_u32 n) {
    const struct dtmk_hook_table &T = tabs[slot / DTMK_MAX_PROGS];
    const struct dtmk_prog &P = T.progs[slot % DTMK_MAX_PROGS];
    struct dtmk_cov_acc *a = accs + slot;
    if (a->cov == P.cov && a->epoch == epoch && a->gen == T.gen >> 1 && a->eligible) {
        atomicAdd(&a->executed, 0u - n);
        atomicAdd(&a->lost, n);
        return;
    }
    struct dtmk_cov_row *row = dtmk_cov_row_for((struct dtmk_cov *)P.cov, epoch, T.gen >> 1);
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
            dtmk_slot_lose(tabs, accs, e->slot, e->epoch, e->n_ev);
        }
        e->map = 0;
        moved = true;
    }
    return moved;
}

/* the key of cell c (from its region's first cell) of lean AGG d: the constant bytes and each
 * part's value -- its index, DTMK_NONE_U32 for the index past the domain, or the worker / epoch */
__device__ __forceinline__ dtmk_u64 dtmk_lean_key(const struct dtmk_desc &d, dtmk_u32 c, dtmk_u32 worker,
                                                 dtmk_u32 epoch) {
    dtmk_u64 key = d.kconst;
    for (dtmk_u32 p = 0; p < d.nparts; ++p) {
        const dtmk_u32 dom = d.ldom[p], st = d.lstride[p] & ~DTMK_LEAN_NONE;
        dtmk_u64 v;
        if (!dom) {
            v = d.ksrc[p] == DTMK_OFF_DECODE_STEP ? epoch : worker;
        } else {
            const dtmk_u32 x = (c / st) % (dom + ((d.lstride[p] & DTMK_LEAN_NONE) ? 1u : 0u));
            v = x == dom ? (dtmk_u64)DTMK_NONE_U32 : x;
        }
        if (d.ksize[p] < 8) v &= (1ull << (8 * d.ksize[p])) - 1;
        key |= v << (8 * d.kpos[p]);
    }
    return key;
}

/* Lanes lane, lane + nl, ...: move a bank of lean cells -- counted in `epoch` by `worker` under
 * tables tabs, the descriptors in the kernel's shared copy `loaded` (desc_at) or, without one,
 * each program's own -- into the maps and zero it, as dtmk_sh_flush does the shadow (a key the
 * full map refuses: its events lost, in the map's stats and the program's coverage).  A hash
 * key is moved by the lane of its count cell.  Returns whether this lane moved any. */
__device__ __forceinline__ bool dtmk_lean_fold(dtmk_u32 *cells, dtmk_u32 epoch, dtmk_u32 worker,
                                               const struct dtmk_hook_table *tabs, const struct dtmk_desc *loaded,
                                               struct dtmk_cov_acc *accs, unsigned lane, unsigned nl) {
    bool moved = false;
    for (int h = 1; h < DTMK_NUM_HOOKS; ++h) {
        const struct dtmk_hook_table &T = tabs[h];
        for (dtmk_u32 k = 0; k < T.n_progs; ++k) {
            const struct dtmk_prog &P = T.progs[k];
            if (!(P.flags & DTMK_PROG_F_LEAN)) continue;
            const struct dtmk_desc *D = dtmk_lean_descs(P, loaded);
            if (!D) continue;                          /* not in the shared copy: its events were faults */
            for (dtmk_u32 i = 0; i < P.n_descs; ++i) {
                const struct dtmk_desc &d = D[i];
                if (d.kind != DTMK_D_AGG) continue;    /* (a SAME AGG shares its lookup's region) */
                dtmk_u32 keys = 1;
                for (dtmk_u32 p = 0; p < d.nparts; ++p)
                    if (d.ldom[p]) keys *= d.ldom[p] + ((d.lstride[p] & DTMK_LEAN_NONE) ? 1u : 0u);
                const dtmk_u32 per = d.lper, n = keys * per;
                const bool hist = d.op >= DTMK_D_HIST_LOG2;
                const struct dtmk_map *m = (const struct dtmk_map *)d.map;
                for (dtmk_u32 c = lane; c < n; c += nl) {
                    dtmk_u32 *x = cells + d.lbase + c;
                    const dtmk_u32 sub = c % per;
                    if (!hist && sub != per - 1) continue;
                    const dtmk_u32 nev = *x;
                    if (!nev) continue;
                    const dtmk_u64 key = dtmk_lean_key(d, c, worker, epoch);
                    bool created;
                    const int s = dtmk_hash_find(m, &key, true, 0, &created);
                    unsigned long long *v = s >= 0 ? (unsigned long long *)dtmk_hash_value(m, s) : 0;
                    if (hist) {
                        if (v) atomicAdd(v + sub, (unsigned long long)nev);
                    } else {
                        for (dtmk_u32 w = 0; 2 * w + 1 < per; ++w) {
                            dtmk_u32 *wc = x - (per - 1) + 2 * w;
                            const dtmk_u64 val = (dtmk_u64)wc[1] << 32 | wc[0];
                            const dtmk_u32 op = (d.shops >> (2 * w)) & 3u;
                            if (v && val) {                /* 0: identity of both (the key is in) */
                                if (op == DTMK_SH_ADD) atomicAdd(v + w, (unsigned long long)val);
                                else if (op == DTMK_SH_MAX) atomicMax(v + w, (unsigned long long)val);
                            }
                            wc[0] = 0; wc[1] = 0;
                        }
                    }
                    if (!v) {                              /* the map is full: dtmk_hash_find counted one */
                        if (nev > 1) atomicAdd((unsigned long long *)&dtmk_stats(m)->lost, (unsigned long long)(nev - 1));
                        dtmk_slot_lose(tabs, accs, h * DTMK_MAX_PROGS + k, epoch, nev);
                    }
                    *x = 0;
                    moved = true;
                }
            }
        }
    }
    return moved;
}

#endif /* DTMK_BPF_MAPS_CUH */
#endif /* DTMK_BPF_INLINE_CUH */
