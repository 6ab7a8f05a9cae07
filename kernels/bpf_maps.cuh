/* bpf_maps.cuh: device maps, program tables and coverage counters of the device VM.
 *
 * Semantics are the host model's (dtrace_mk/bpf/maps.py, dtrace_mk/bpf/coverage.py);
 * layouts are written by the host (dtrace_mk/runtime/device.py, whose numpy dtypes a
 * CI test checks against these structs through NVRTC static_asserts).
 *
 *   array             values[max_entries][value_stride]
 *   per_worker_array  values[n_workers][max_entries][value_stride]
 *   hash, hist_*      open addressing, capacity = power of two >= 2 * max_entries,
 *                     linear probing bounded by the capacity; slot state EMPTY/TOMB ->
 *                     BUSY (claimed by atomicCAS, key and value written) -> FULL -> TOMB
 *                     (deleted; reused by later inserts).  `count` = live keys: a new
 *                     key when count == max_entries -> -E2BIG, counted in stats.lost.
 *   hist_log2/linear  a hash whose value is n_buckets u64 counters (atomicAdd).
 *   ringbuf           per worker: data[max_entries] bytes, recs[max_entries] records
 *                     (offset, length, epoch); held = data bytes held (until the host
 *                     drains); budget used per (worker, epoch) in DTMK_RB_EPOCHS slots
 *                     tagged by epoch.  Over budget -> -ENOSPC, throttled; ring full ->
 *                     -ENOSPC, lost.  No wrap: the host drains between batches.
 *   coverage          per program: rows tagged (epoch, program_gen), open addressing;
 *                     eligible, executed, throttled, lost added per warp (one atomic
 *                     per non-zero bucket per epoch group).
 *
 * All pointers in descriptors are device addresses written by the host.  No C++
 * standard headers (NVRTC).
 */
#ifndef DTMK_BPF_MAPS_CUH
#define DTMK_BPF_MAPS_CUH

#include "dtrace_mk_abi.h"
#include "bpf_buckets.cuh"
#include "bpf_map_ops.cuh"   /* the descriptor, its stats and every map operation */

#define DTMK_RB_EPOCHS 8
#define DTMK_EPOCH_NONE 0xffffffffu
#define DTMK_COV_ROWS 64
#define DTMK_COV_TAG_EMPTY 0xffffffffffffffffull
#define DTMK_MAX_PROGS 8

struct dtmk_rb_worker {
    dtmk_u64 held;                       /* data bytes held until drained */
    dtmk_u64 nrec;                       /* records written */
    dtmk_u32 ep_tag[DTMK_RB_EPOCHS];     /* epoch of each budget slot, DTMK_EPOCH_NONE = free */
    dtmk_u64 ep_used[DTMK_RB_EPOCHS];    /* budget bytes used in that epoch */
    dtmk_u64 slot_busy;                  /* refusals because all budget slots held other epochs */
};
static_assert(sizeof(struct dtmk_rb_worker) == 120, "dtmk_rb_worker size");

struct dtmk_rb_rec {
    dtmk_u32 off, len, epoch, pad;
};

/* Coverage of one program: rows keyed by (epoch, program_gen). */
struct dtmk_cov_row {
    dtmk_u64 tag;   /* (epoch << 32) | program_gen; DTMK_COV_TAG_EMPTY = free */
    dtmk_u64 eligible, executed, throttled, lost;
    dtmk_u64 fault, pad0, pad1;   /* fault: lost because the instruction budget ran out */
};
#define DTMK_RL_EPOCHS 8   /* a power of 2; a resident launch retires complete epochs (DeviceRuntime.retire_epochs) */
#define DTMK_NO_LIMIT 0xffffffffu
struct dtmk_cov {
    dtmk_u64 seen;       /* eligible events so far (sampling tickets) */
    dtmk_u64 overflow;   /* events that found no free row (a host bug: rows not drained) */
    dtmk_u32 rl_tag[DTMK_RL_EPOCHS];   /* rate limit: epoch of each slot (DTMK_EPOCH_NONE = free) */
    dtmk_u32 rl_ran[DTMK_RL_EPOCHS];   /* runs granted in that epoch */
    dtmk_u64 pad[6];     /* the header is 128 bytes: rows start on a 128-byte line */
    struct dtmk_cov_row rows[DTMK_COV_ROWS];
};

/* Program table: per hook, up to DTMK_MAX_PROGS programs. */
struct __align__(16) dtmk_prog {
    dtmk_u64 insns;        /* struct dtmk_dinsn[n_insns] */
    dtmk_u64 cov;          /* struct dtmk_cov */
    dtmk_u32 n_insns, max_insns, stack_depth, sample_every;
    dtmk_u32 prog_id, flags, max_per_epoch;   /* max_per_epoch: DTMK_NO_LIMIT = none */
    dtmk_u32 first_epoch;  /* events of earlier epochs (decode steps) are not eligible: an attach
                            * into a running kernel counts from a step boundary no worker has
                            * started (launch/serve.py), 0 = every event */
    dtmk_u64 descs;        /* DTMK_PROG_F_DESC (bpf_inline.cuh): struct dtmk_desc[n_descs], run at the site */
    dtmk_u16 n_descs;
    dtmk_u16 desc_at;      /* the kernel's table copy: index + 1 of its shared copy (0: none; host writes 0) */
    dtmk_u32 end_epoch;    /* events of this epoch and later are not eligible (0 = none): a summary
                            * window ends where its successor starts, so the table change that
                            * attaches the successor need not be loaded before that epoch
                            * (control[CTL_GEN_DUE], runtime/summary_windows.py) */
};
static_assert(sizeof(struct dtmk_prog) == 64, "dtmk_prog size");

/* Does the program count events of `epoch`?  From first_epoch on, and before end_epoch
 * when it has one -- the one rule of the ring path (bpf_run_prog.cuh) and the site form
 * (bpf_inline.cuh); the reference's: runtime/reference.py fire.  A macro: the same test as
 * an inline function changed the default build's code; as a macro its SASS is the same) */
#define DTMK_PROG_COUNTS(P, epoch) ((epoch) >= (P).first_epoch && ((P).end_epoch == 0u || (epoch) < (P).end_epoch))

/* gen is a seqlock: the host makes it odd, writes the table, then writes the next even
 * value.  program_gen = gen / 2.  A reader that sees an odd gen, or a gen that changed
 * while it copied the table, keeps its previous copy. */
struct __align__(16) dtmk_hook_table {
    dtmk_u32 gen;
    dtmk_u32 n_progs;
    dtmk_u32 ctx_reads;    /* bit i: a program of the hook reads context word i (bytes 4i..4i+3) */
    dtmk_u32 pad[13];
    struct dtmk_prog progs[DTMK_MAX_PROGS];
};
static_assert(sizeof(struct dtmk_hook_table) == 64 + 64 * DTMK_MAX_PROGS, "dtmk_hook_table size");

/* -DDTMK_OBS_PROF cycle counters (megakernel.cu defines them before including this
 * file; everywhere else they are nothing) */
#ifndef DTMK_PROF_BEGIN
#define DTMK_PROF_BEGIN(name)
#define DTMK_PROF_END(k, name)
#define DTMK_PROF_END1(k, name)
#endif

/* ---------------------------------------------------------------------------------- */
/* the helpers the VM calls (and the compiled tier, for a map it has no shape of):     */
/* bpf_map_ops.cuh's operations over the descriptor, one __noinline__ body each        */
/* ---------------------------------------------------------------------------------- */

__device__ __noinline__ int dtmk_hash_find(const struct dtmk_map *m, const void *key, bool create,
                                           const void *init, bool *created) {
#ifdef DTMK_HASH_LOOK_FAST
    /* opt-in (session 38, for the hot tier's drain): a 4- or 8-byte key -- the summary's --
     * probes through the compiled tier's register-only dtmk_hash_look (no key words in local
     * memory) and only an absent key takes the generic body (which probes again: the same
     * slot or insert, as a constant shape's find()) */
    const dtmk_u32 ks = m->key_size;
    if (ks == 8u || ks == 4u) {
        const int s = ks == 8u ? dtmk_hash_look<8u>(key, m->keys, m->slots, m->capacity, m->key_stride)
                               : dtmk_hash_look<4u>(key, m->keys, m->slots, m->capacity, m->key_stride);
        *created = false;
        if (s >= 0 || !create) return s;
    }
#endif
    return dtmk_hash_find_t(dtmk_desc_shape{m}, key, create, init, created);
}
__device__ __noinline__ dtmk_u64 dtmk_map_lookup(const struct dtmk_map *m, const void *key, dtmk_u32 worker,
                                                 bool *lost) {
    return dtmk_map_lookup_t(dtmk_desc_shape{m}, key, worker, lost);
}
__device__ __noinline__ dtmk_u64 dtmk_map_update(const struct dtmk_map *m, const void *key, const void *value,
                                                 dtmk_u64 flags, dtmk_u32 worker, bool *lost) {
    return dtmk_map_update_t(dtmk_desc_shape{m}, key, value, flags, worker, lost);
}
__device__ __noinline__ dtmk_u64 dtmk_map_delete(const struct dtmk_map *m, const void *key, bool *lost) {
    return dtmk_map_delete_t(dtmk_desc_shape{m}, key, lost);
}
__device__ __noinline__ dtmk_u64 dtmk_hist_add(const struct dtmk_map *m, const void *key, dtmk_u64 v, bool *lost) {
    return dtmk_hist_add_t(dtmk_desc_shape{m}, key, v, lost);
}

/* budget slot of (worker ring, epoch): claim a free one for a new epoch */
__device__ __forceinline__ int dtmk_rb_epoch_slot(struct dtmk_rb_worker *rw, dtmk_u32 epoch) {
    for (int k = 0; k < DTMK_RB_EPOCHS; k++) {
        int j = (int)((epoch + (dtmk_u32)k) & (DTMK_RB_EPOCHS - 1));
        dtmk_u32 tag = *(volatile dtmk_u32 *)&rw->ep_tag[j];
        if (tag == epoch) return j;
        if (tag == DTMK_EPOCH_NONE) {
            dtmk_u32 old = atomicCAS(&rw->ep_tag[j], DTMK_EPOCH_NONE, epoch);
            if (old == DTMK_EPOCH_NONE || old == epoch) return j;
        }
    }
    return -1;
}

__device__ __noinline__ dtmk_u64 dtmk_ringbuf_output(const struct dtmk_map *m, const void *data, dtmk_u64 size,
                                                     dtmk_u64 flags, dtmk_u32 worker, dtmk_u32 epoch,
                                                     bool *lost, bool *throttled) {
    if (m->type != BPF_MAP_TYPE_RINGBUF || (flags & ~3ull) || size > DTMK_STACK_SIZE + 4096) {
        *lost = true;
        return (dtmk_u64)-DTMK_EINVAL;
    }
    struct dtmk_rb_worker *rw = (struct dtmk_rb_worker *)m->slots + worker;
    struct dtmk_map_stats *s = dtmk_stats(m);
    int j = dtmk_rb_epoch_slot(rw, epoch);
    if (j < 0) {      /* no budget slot: the host did not retire old epochs */
        atomicAdd((unsigned long long *)&rw->slot_busy, 1ull);
        atomicAdd((unsigned long long *)&s->lost, 1ull);
        *lost = true;
        return (dtmk_u64)-DTMK_ENOSPC;
    }
    unsigned long long *used = (unsigned long long *)&rw->ep_used[j];
    unsigned long long u = *(volatile unsigned long long *)used, prev;
    do {
        if (u + size > m->budget_bytes) {
            atomicAdd((unsigned long long *)&s->throttled, 1ull);
            *throttled = true;
            return (dtmk_u64)-DTMK_ENOSPC;
        }
        prev = u;
        u = atomicCAS(used, prev, prev + size);
    } while (u != prev);
    unsigned long long *held = (unsigned long long *)&rw->held;
    unsigned long long h = *(volatile unsigned long long *)held;
    do {
        if (h + size > m->max_entries) {
            atomicAdd(used, (unsigned long long)(-(long long)size));   /* give the budget back */
            atomicAdd((unsigned long long *)&s->lost, 1ull);
            *lost = true;
            return (dtmk_u64)-DTMK_ENOSPC;
        }
        prev = h;
        h = atomicCAS(held, prev, prev + size);
    } while (h != prev);
    dtmk_u64 base = m->values + (dtmk_u64)worker * m->max_entries;
    dtmk_copy((void *)(base + h), data, (dtmk_u32)size);
    unsigned long long r = atomicAdd((unsigned long long *)&rw->nrec, 1ull);
    struct dtmk_rb_rec *rec = (struct dtmk_rb_rec *)m->keys + (dtmk_u64)worker * m->max_entries + r;
    rec->off = (dtmk_u32)h; rec->len = (dtmk_u32)size; rec->epoch = epoch; rec->pad = 0;
    return 0;
}

/* ---------------------------------------------------------------------------------- */
/* coverage                                                                            */
/* ---------------------------------------------------------------------------------- */

__device__ __forceinline__ struct dtmk_cov_row *dtmk_cov_row_for(struct dtmk_cov *c, dtmk_u32 epoch, dtmk_u32 gen) {
    dtmk_u64 tag = ((dtmk_u64)epoch << 32) | gen;
    for (int k = 0; k < DTMK_COV_ROWS; k++) {
        int j = (int)((epoch * 7u + gen + (dtmk_u32)k) & (DTMK_COV_ROWS - 1));
        unsigned long long *t = (unsigned long long *)&c->rows[j].tag;
        unsigned long long cur = *(volatile unsigned long long *)t;
        if (cur == tag) return &c->rows[j];
        if (cur == DTMK_COV_TAG_EMPTY) {
            cur = atomicCAS(t, DTMK_COV_TAG_EMPTY, tag);
            if (cur == DTMK_COV_TAG_EMPTY || cur == tag) return &c->rows[j];
        }
    }
    return 0;
}

/* Rate limit: reserve n runs in `epoch`; returns how many were granted before (the
 * caller's tickets are base .. base+n-1).  No free slot (the host did not retire old
 * epochs): DTMK_NO_LIMIT, i.e. nothing granted. */
__device__ __forceinline__ dtmk_u32 dtmk_rate_ticket(struct dtmk_cov *c, dtmk_u32 epoch, dtmk_u32 n) {
    for (int k = 0; k < DTMK_RL_EPOCHS; k++) {
        int j = (int)((epoch + (dtmk_u32)k) & (DTMK_RL_EPOCHS - 1));
        dtmk_u32 tag = *(volatile dtmk_u32 *)&c->rl_tag[j];
        if (tag == DTMK_EPOCH_NONE) {
            dtmk_u32 old = atomicCAS(&c->rl_tag[j], DTMK_EPOCH_NONE, epoch);
            tag = old == DTMK_EPOCH_NONE ? epoch : old;
        }
        if (tag == epoch) return atomicAdd(&c->rl_ran[j], n);
    }
    return DTMK_NO_LIMIT;
}

/* A warp's running counts for one program and (epoch, gen), kept in shared memory and
 * added to the global row only when the key changes or the caller flushes (end of a
 * batch loop, an epoch boundary, a table refresh): one set of atomics per epoch instead
 * of per 32 events.  Exactness is unchanged; visibility waits for the flush. */
struct dtmk_cov_acc {
    dtmk_u64 cov;                         /* struct dtmk_cov address; 0 = empty */
    dtmk_u32 epoch, gen;
    dtmk_u32 eligible, executed, throttled, lost, fault, pad;
};

__device__ __forceinline__ void dtmk_cov_row_add(struct dtmk_cov *c, dtmk_u32 e, dtmk_u32 gen, dtmk_u32 elig,
                                                 dtmk_u32 exec, dtmk_u32 thr, dtmk_u32 lost, dtmk_u32 fault) {
    struct dtmk_cov_row *row = dtmk_cov_row_for(c, e, gen);
    if (!row) {
        atomicAdd((unsigned long long *)&c->overflow, (unsigned long long)elig);
        return;
    }
    if (exec) atomicAdd((unsigned long long *)&row->executed, (unsigned long long)exec);
    if (thr) atomicAdd((unsigned long long *)&row->throttled, (unsigned long long)thr);
    if (lost) atomicAdd((unsigned long long *)&row->lost, (unsigned long long)lost);
    if (fault) atomicAdd((unsigned long long *)&row->fault, (unsigned long long)fault);
    /* eligible last: a reader that sees eligible sees its buckets (fenced) */
    __threadfence();
    atomicAdd((unsigned long long *)&row->eligible, (unsigned long long)elig);
}

/* one thread */
__device__ __forceinline__ void dtmk_cov_acc_flush(struct dtmk_cov_acc *a) {
    if (a->cov && a->eligible)
        dtmk_cov_row_add((struct dtmk_cov *)a->cov, a->epoch, a->gen, a->eligible, a->executed, a->throttled,
                         a->lost, a->fault);
    a->cov = 0;
    a->eligible = a->executed = a->throttled = a->lost = a->fault = 0;
}

/* Count one warp's outcomes for one program: every lane in `elig` had an eligible event
 * in `epoch`; exec/thr/lost/fault are ballots (lost includes fault).  Called by all
 * lanes of the warp (convergent).  acc: the warp's accumulator for this program slot
 * (shared memory), or 0 to add to the global rows at once. */
__device__ __forceinline__ void dtmk_cov_add(struct dtmk_cov *c, dtmk_u32 gen, dtmk_u32 epoch, unsigned elig,
                                             unsigned exec, unsigned thr, unsigned lost, unsigned fault,
                                             struct dtmk_cov_acc *acc) {
    unsigned lane = threadIdx.x & 31;
    unsigned pending = elig;
    while (pending) {
        int leader = __ffs(pending) - 1;
        dtmk_u32 e = __shfl_sync(0xffffffffu, epoch, leader);
        unsigned grp = __ballot_sync(0xffffffffu, ((elig >> lane) & 1) && epoch == e);
        pending &= ~grp;
        if ((int)lane == leader) {
            const dtmk_u32 ne = __popc(grp), nx = __popc(grp & exec), nt = __popc(grp & thr),
                           nl = __popc(grp & lost), nf = __popc(grp & fault);
            if (!acc) {
                dtmk_cov_row_add(c, e, gen, ne, nx, nt, nl, nf);
            } else {
#ifdef DTMK_COV_ACC_WAYS
                /* several epochs per slot (the observer SM: its batches mix workers at
                 * different steps): way e mod WAYS, the ways DTMK_COV_ACC_STRIDE apart */
                struct dtmk_cov_acc *a = acc + (e & (DTMK_COV_ACC_WAYS - 1u)) * DTMK_COV_ACC_STRIDE;
#else
                struct dtmk_cov_acc *a = acc;
#endif
                if (a->cov != (dtmk_u64)c || a->epoch != e || a->gen != gen) {
                    DTMK_PROF_BEGIN(prof_flush);
                    dtmk_cov_acc_flush(a);
                    DTMK_PROF_END1(18, prof_flush);
                    a->cov = (dtmk_u64)c; a->epoch = e; a->gen = gen;
                }
                a->eligible += ne; a->executed += nx; a->throttled += nt;
                a->lost += nl; a->fault += nf;
            }
        }
    }
}

#endif /* DTMK_BPF_MAPS_CUH */
