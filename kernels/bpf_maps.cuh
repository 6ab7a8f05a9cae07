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

#define DTMK_E2BIG 7
#define DTMK_ENOENT 2
#define DTMK_ENOSPC 28
#define DTMK_EINVAL 22
#define DTMK_EEXIST 17

#define DTMK_SLOT_EMPTY 0u
#define DTMK_SLOT_BUSY 1u
#define DTMK_SLOT_FULL 2u
#define DTMK_SLOT_TOMB 3u

#define DTMK_RB_EPOCHS 8
#define DTMK_EPOCH_NONE 0xffffffffu
#define DTMK_COV_ROWS 64
#define DTMK_COV_TAG_EMPTY 0xffffffffffffffffull
#define DTMK_MAX_PROGS 8
#define DTMK_MAX_KEY_WORDS 16      /* 64-byte keys */

/* Map descriptor (128 bytes). */
struct __align__(16) dtmk_map {
    dtmk_u32 type, key_size, value_size, max_entries;
    dtmk_u32 capacity, cap_mask, key_stride, value_stride;
    dtmk_u32 n_workers, n_buckets, read_only, pad0;
    dtmk_u32 pad1;
    dtmk_u32 pad2;
    dtmk_s64 lin_lo, lin_hi, lin_step;
    dtmk_u64 budget_bytes;
    dtmk_u64 values;   /* array/hash values; ringbuf data */
    dtmk_u64 keys;     /* hash keys; ringbuf records */
    dtmk_u64 slots;    /* hash slot states (u32); ringbuf per-worker state */
    dtmk_u64 stats;    /* struct dtmk_map_stats */
    dtmk_u64 pad3;
};
static_assert(sizeof(struct dtmk_map) == 128, "dtmk_map size");

struct dtmk_map_stats {
    dtmk_u64 count;       /* hash: live keys */
    dtmk_u64 lost;        /* full map / out of range / ring full */
    dtmk_u64 throttled;   /* ring budget refusals */
    dtmk_u64 probe_exhausted;  /* hash: no EMPTY or deleted slot on the probe path (never while capacity >= 2 x max_entries) */
    dtmk_u64 pad0;        /* reserved: 0 */
    dtmk_u64 pad1;        /* reserved: 0 */
};
static_assert(sizeof(struct dtmk_map_stats) == 48, "dtmk_map_stats size");

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
    dtmk_u32 n_descs;
    dtmk_u32 desc_at;      /* the kernel's table copy: index + 1 of its shared copy (0: none; host writes 0) */
};
static_assert(sizeof(struct dtmk_prog) == 64, "dtmk_prog size");

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

/* ---------------------------------------------------------------------------------- */
/* small memory helpers                                                                */
/* ---------------------------------------------------------------------------------- */

__device__ __forceinline__ dtmk_u32 dtmk_ld_acquire_u32(const dtmk_u32 *p) {
    dtmk_u32 v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ void dtmk_st_release_u32(dtmk_u32 *p, dtmk_u32 v) {
    asm volatile("st.release.gpu.global.u32 [%0], %1;" :: "l"(p), "r"(v) : "memory");
}

/* -DDTMK_OBS_PROF cycle counters (megakernel.cu defines them before including this
 * file; everywhere else they are nothing) */
#ifndef DTMK_PROF_BEGIN
#define DTMK_PROF_BEGIN(name)
#define DTMK_PROF_END(k, name)
#define DTMK_PROF_END1(k, name)
#endif

/* copy n bytes (n < 2^16) between generic addresses; word-wise when aligned */
__device__ __forceinline__ void dtmk_copy(void *dst, const void *src, dtmk_u32 n) {
    dtmk_u64 a = (dtmk_u64)dst, b = (dtmk_u64)src;
    if (((a | b | n) & 7) == 0) {
        for (dtmk_u32 i = 0; i < n; i += 8) *(dtmk_u64 *)(a + i) = *(const dtmk_u64 *)(b + i);
    } else if (((a | b | n) & 3) == 0) {
        for (dtmk_u32 i = 0; i < n; i += 4) *(dtmk_u32 *)(a + i) = *(const dtmk_u32 *)(b + i);
    } else {
        for (dtmk_u32 i = 0; i < n; i++) *(dtmk_u8 *)(a + i) = *(const dtmk_u8 *)(b + i);
    }
}
__device__ __forceinline__ void dtmk_zero(void *dst, dtmk_u32 n) {
    dtmk_u64 a = (dtmk_u64)dst;
    if (((a | n) & 7) == 0) {
        for (dtmk_u32 i = 0; i < n; i += 8) *(dtmk_u64 *)(a + i) = 0;
    } else {
        for (dtmk_u32 i = 0; i < n; i++) *(dtmk_u8 *)(a + i) = 0;
    }
}

/* a key (key_size bytes at a generic address) as zero-padded little-endian words */
__device__ __forceinline__ dtmk_u32 dtmk_load_key(const void *key, dtmk_u32 key_size, dtmk_u32 *w) {
    dtmk_u32 nw = (key_size + 3) >> 2;
    dtmk_u64 a = (dtmk_u64)key;
    if (((a | key_size) & 3) == 0) {
#pragma unroll 1   /* (keys are 1-4 words: rolled loops keep the helpers' code small, as below) */
        for (dtmk_u32 i = 0; i < nw; i++) w[i] = *(const dtmk_u32 *)(a + 4 * i);
    } else {
        for (dtmk_u32 i = 0; i < nw; i++) w[i] = 0;
        for (dtmk_u32 i = 0; i < key_size; i++)
            w[i >> 2] |= (dtmk_u32)(*(const dtmk_u8 *)(a + i)) << (8 * (i & 3));
    }
    return nw;
}

/* FNV-1a over the key words, then a murmur finalizer (dtrace_mk.runtime.device.key_hash) */
__device__ __forceinline__ dtmk_u32 dtmk_key_hash(const dtmk_u32 *w, dtmk_u32 nw) {
    dtmk_u32 h = 2166136261u;
#pragma unroll 1
    for (dtmk_u32 i = 0; i < nw; i++) h = (h ^ w[i]) * 16777619u;
    h ^= h >> 16; h *= 0x85ebca6bu; h ^= h >> 13; h *= 0xc2b2ae35u; h ^= h >> 16;
    return h;
}

__device__ __forceinline__ struct dtmk_map_stats *dtmk_stats(const struct dtmk_map *m) {
    return (struct dtmk_map_stats *)m->stats;
}

/* ---------------------------------------------------------------------------------- */
/* hash tables (hash, hist_log2, hist_linear)                                          */
/* ---------------------------------------------------------------------------------- */

#define DTMK_HASH_ABSENT (-1)
#define DTMK_HASH_FULL (-2)

/* Find key; with `create`, insert it when absent (value zeroed, or copied from init).
 * Returns the slot, DTMK_HASH_ABSENT, or DTMK_HASH_FULL (counted lost).  *created is set
 * when this call inserted the key.  A new key goes into the first tombstone of its probe
 * sequence (deleted slots are reused, so a map holds max_entries keys however many were
 * deleted before), else into the EMPTY slot that ended the probe.  Two inserts of one
 * key race correctly (both aim at the same first free slot; the CAS loser re-examines
 * it); an insert racing a delete of ANOTHER key on its probe path may duplicate the key
 * (never in serial use; documented in docs/results/device_vm.md). */
__device__ __noinline__ int dtmk_hash_find(const struct dtmk_map *m, const void *key, bool create,
                                           const void *init, bool *created) {
    dtmk_u32 w[DTMK_MAX_KEY_WORDS];
    dtmk_u32 nw = dtmk_load_key(key, m->key_size, w);
    const dtmk_u32 h0 = dtmk_key_hash(w, nw) & m->cap_mask;
    dtmk_u32 *states = (dtmk_u32 *)m->slots;
    const dtmk_u32 kstride = m->key_stride;
    *created = false;
    for (;;) {
        int free_slot = -1;
        dtmk_u32 i = h0, probe = 0;
        for (; probe < m->capacity; probe++, i = (i + 1) & m->cap_mask) {
            dtmk_u32 st = dtmk_ld_acquire_u32(states + i);
            while (st == DTMK_SLOT_BUSY) {
                __nanosleep(20);
                st = dtmk_ld_acquire_u32(states + i);
            }
            if (st == DTMK_SLOT_FULL) {
                const dtmk_u32 *k = (const dtmk_u32 *)(m->keys + (dtmk_u64)i * kstride);
                bool eq = true;
#pragma unroll 1
                for (dtmk_u32 j = 0; j < nw; j++) eq &= (k[j] == w[j]);
                if (eq) return (int)i;
            } else if (st == DTMK_SLOT_TOMB) {
                if (free_slot < 0) free_slot = (int)i;
            } else {                                   /* EMPTY: the key is absent */
                if (free_slot < 0) free_slot = (int)i;
                break;
            }
        }
        if (!create) return DTMK_HASH_ABSENT;
        if (free_slot < 0) {                           /* every slot FULL: cannot happen while */
            struct dtmk_map_stats *s = dtmk_stats(m);  /* capacity >= 2 * max_entries        */
            atomicAdd((unsigned long long *)&s->probe_exhausted, 1ull);
            atomicAdd((unsigned long long *)&s->lost, 1ull);
            return DTMK_HASH_FULL;
        }
        const dtmk_u32 fs = (dtmk_u32)free_slot;
        const dtmk_u32 seen = dtmk_ld_acquire_u32(states + fs);
        if ((seen != DTMK_SLOT_EMPTY && seen != DTMK_SLOT_TOMB) ||
            atomicCAS(states + fs, seen, DTMK_SLOT_BUSY) != seen)
            continue;                                  /* someone took it: probe again */
        struct dtmk_map_stats *s = dtmk_stats(m);
        unsigned long long c = atomicAdd((unsigned long long *)&s->count, 1ull);
        if (c >= m->max_entries) {
            atomicAdd((unsigned long long *)&s->count, ~0ull);   /* -1 */
            atomicAdd((unsigned long long *)&s->lost, 1ull);
            dtmk_st_release_u32(states + fs, seen);
            return DTMK_HASH_FULL;
        }
        dtmk_u32 *k = (dtmk_u32 *)(m->keys + (dtmk_u64)fs * kstride);
        for (dtmk_u32 j = 0; j < nw; j++) k[j] = w[j];
        void *v = (void *)(m->values + (dtmk_u64)fs * m->value_stride);
        if (init) dtmk_copy(v, init, m->value_size);
        else dtmk_zero(v, m->value_stride);
        __threadfence();
        dtmk_st_release_u32(states + fs, DTMK_SLOT_FULL);
        *created = true;
        return (int)fs;
    }
}

__device__ __forceinline__ dtmk_u64 dtmk_hash_value(const struct dtmk_map *m, int slot) {
    return m->values + (dtmk_u64)(dtmk_u32)slot * m->value_stride;
}

/* ---------------------------------------------------------------------------------- */
/* helpers' map operations: return value as the program sees it; *lost / *throttled    */
/* set as the reference VM appends reasons                                             */
/* ---------------------------------------------------------------------------------- */

__device__ __forceinline__ bool dtmk_is_hash(dtmk_u32 t) {
    return t == BPF_MAP_TYPE_HASH || t == DTMK_MAP_TYPE_HIST_LOG2 || t == DTMK_MAP_TYPE_HIST_LINEAR;
}
__device__ __forceinline__ bool dtmk_is_array(dtmk_u32 t) {
    return t == BPF_MAP_TYPE_ARRAY || t == BPF_MAP_TYPE_PERCPU_ARRAY;
}

__device__ __forceinline__ dtmk_u32 dtmk_array_index(const void *key) {
    dtmk_u64 a = (dtmk_u64)key;
    if ((a & 3) == 0) return *(const dtmk_u32 *)a;
    const dtmk_u8 *b = (const dtmk_u8 *)a;
    return (dtmk_u32)b[0] | ((dtmk_u32)b[1] << 8) | ((dtmk_u32)b[2] << 16) | ((dtmk_u32)b[3] << 24);
}

__device__ __forceinline__ dtmk_u64 dtmk_array_value(const struct dtmk_map *m, dtmk_u32 idx, dtmk_u32 worker) {
    dtmk_u64 row = m->type == BPF_MAP_TYPE_PERCPU_ARRAY ? (dtmk_u64)worker * m->max_entries + idx : idx;
    return m->values + row * m->value_stride;
}

__device__ __noinline__ dtmk_u64 dtmk_map_lookup(const struct dtmk_map *m, const void *key, dtmk_u32 worker,
                                                 bool *lost) {
    dtmk_u32 t = m->type;
    if (dtmk_is_array(t)) {
        dtmk_u32 idx = dtmk_array_index(key);
        return idx < m->max_entries ? dtmk_array_value(m, idx, worker) : 0;
    }
    if (dtmk_is_hash(t)) {
        bool created;
        int s = dtmk_hash_find(m, key, false, 0, &created);
        return s >= 0 ? dtmk_hash_value(m, s) : 0;
    }
    *lost = true;               /* ringbuf: helper error */
    return 0;
}

__device__ __noinline__ dtmk_u64 dtmk_map_update(const struct dtmk_map *m, const void *key, const void *value,
                                                 dtmk_u64 flags, dtmk_u32 worker, bool *lost) {
    dtmk_u32 t = m->type;
    if (!dtmk_is_array(t) && !dtmk_is_hash(t)) { *lost = true; return (dtmk_u64)-DTMK_EINVAL; }
    if (flags > 2) { *lost = true; return (dtmk_u64)-DTMK_EINVAL; }
    if (dtmk_is_array(t)) {
        dtmk_u32 idx = dtmk_array_index(key);
        if (idx >= m->max_entries) {
            atomicAdd((unsigned long long *)&dtmk_stats(m)->lost, 1ull);
            *lost = true;
            return (dtmk_u64)-DTMK_E2BIG;
        }
        if (flags == 1) return (dtmk_u64)-DTMK_EEXIST;
        dtmk_copy((void *)dtmk_array_value(m, idx, worker), value, m->value_size);
        return 0;
    }
    bool created;
    if (flags == 2) {   /* EXIST */
        int s = dtmk_hash_find(m, key, false, 0, &created);
        if (s < 0) return (dtmk_u64)-DTMK_ENOENT;
        dtmk_copy((void *)dtmk_hash_value(m, s), value, m->value_size);
        return 0;
    }
    int s = dtmk_hash_find(m, key, true, value, &created);
    if (s == DTMK_HASH_FULL) { *lost = true; return (dtmk_u64)-DTMK_E2BIG; }
    if (created) return 0;
    if (flags == 1) return (dtmk_u64)-DTMK_EEXIST;
    dtmk_copy((void *)dtmk_hash_value(m, s), value, m->value_size);
    return 0;
}

__device__ __noinline__ dtmk_u64 dtmk_map_delete(const struct dtmk_map *m, const void *key, bool *lost) {
    dtmk_u32 t = m->type;
    if (!dtmk_is_hash(t)) { *lost = true; return (dtmk_u64)-DTMK_EINVAL; }
    bool created;
    int s = dtmk_hash_find(m, key, false, 0, &created);
    if (s < 0) return (dtmk_u64)-DTMK_ENOENT;
    dtmk_u32 *states = (dtmk_u32 *)m->slots;
    if (atomicCAS(states + s, DTMK_SLOT_FULL, DTMK_SLOT_TOMB) != DTMK_SLOT_FULL)
        return (dtmk_u64)-DTMK_ENOENT;            /* deleted concurrently */
    atomicAdd((unsigned long long *)&dtmk_stats(m)->count, ~0ull);
    return 0;
}

__device__ __forceinline__ dtmk_u32 dtmk_log2_bucket(dtmk_u64 v) { return dtmk_bucket_log2(v); }
__device__ __forceinline__ dtmk_u32 dtmk_linear_bucket(const struct dtmk_map *m, dtmk_u64 v) {
    return dtmk_bucket_linear(m->lin_lo, m->lin_hi, m->lin_step, m->n_buckets, v);
}

__device__ __noinline__ dtmk_u64 dtmk_hist_add(const struct dtmk_map *m, const void *key, dtmk_u64 v, bool *lost) {
    dtmk_u32 t = m->type;
    if (t != DTMK_MAP_TYPE_HIST_LOG2 && t != DTMK_MAP_TYPE_HIST_LINEAR) { *lost = true; return (dtmk_u64)-DTMK_EINVAL; }
    bool created;
    int s = dtmk_hash_find(m, key, true, 0, &created);
    if (s < 0) { *lost = true; return (dtmk_u64)-DTMK_E2BIG; }
    dtmk_u32 b = t == DTMK_MAP_TYPE_HIST_LOG2 ? dtmk_log2_bucket(v) : dtmk_linear_bucket(m, v);
    atomicAdd((unsigned long long *)(dtmk_hash_value(m, s) + 8ull * b), 1ull);
    return 0;
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
