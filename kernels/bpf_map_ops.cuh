/* bpf_map_ops.cuh: the map operations of the device VM's helpers and of the compiled tier.
 *
 * Layouts and semantics: see bpf_maps.cuh (the descriptor and stats structs live here so a
 * generated monitor can include this file without the helpers' definitions).  Each
 * operation is written once, over the map's "shape" (below): the helpers the VM calls read
 * it from the descriptor; a compiled monitor (dtrace_mk/runtime/compiled/translator.py) gives each of
 * its maps a shape of constants, so its calls fold to that map's type and sizes -- the
 * compiled tier's drain probes a present key through one small register-only function per
 * key size instead of the generic helpers' type switches, descriptor loads and key words in
 * local memory (docs/dev/hook_cost_analysis.md, session 38).
 *
 * Included by bpf_maps.cuh (the kernel module: it also defines the __noinline__ helpers)
 * and by generated monitors.  Everything here is inline or a template: no symbol is
 * defined twice when the two modules are linked.  No standard headers (NVRTC); the host
 * build (compiled/host.py host_source) inlines this file with its two PTX one-liners as C.
 */
#ifndef DTMK_BPF_MAP_OPS_CUH
#define DTMK_BPF_MAP_OPS_CUH

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

/* a key (key_size bytes at a generic address) as zero-padded little-endian words.  U: the
 * word loops' unroll count -- 1 in the generic helpers (keys are 1-4 words: rolled loops
 * keep their code small), the key's words in a shape of constants (unrolled, w stays in
 * registers instead of local memory) */
template <int U>
__device__ __forceinline__ dtmk_u32 dtmk_load_key(const void *key, dtmk_u32 key_size, dtmk_u32 *w) {
    dtmk_u32 nw = (key_size + 3) >> 2;
    dtmk_u64 a = (dtmk_u64)key;
    if (((a | key_size) & 3) == 0) {
#pragma unroll (U)
        for (dtmk_u32 i = 0; i < nw; i++) w[i] = *(const dtmk_u32 *)(a + 4 * i);
    } else {
        for (dtmk_u32 i = 0; i < nw; i++) w[i] = 0;
        for (dtmk_u32 i = 0; i < key_size; i++)
            w[i >> 2] |= (dtmk_u32)(*(const dtmk_u8 *)(a + i)) << (8 * (i & 3));
    }
    return nw;
}

/* FNV-1a over the key words, then a murmur finalizer (dtrace_mk.runtime.device.key_hash) */
template <int U>
__device__ __forceinline__ dtmk_u32 dtmk_key_hash(const dtmk_u32 *w, dtmk_u32 nw) {
    dtmk_u32 h = 2166136261u;
#pragma unroll (U)
    for (dtmk_u32 i = 0; i < nw; i++) h = (h ^ w[i]) * 16777619u;
    h ^= h >> 16; h *= 0x85ebca6bu; h ^= h >> 13; h *= 0xc2b2ae35u; h ^= h >> 16;
    return h;
}

__device__ __forceinline__ struct dtmk_map_stats *dtmk_stats(const struct dtmk_map *m) {
    return (struct dtmk_map_stats *)m->stats;
}

/* ---------------------------------------------------------------------------------- */
/* a map's shape: where each operation below reads the map's fields                   */
/* ---------------------------------------------------------------------------------- */

/* Every operation below is a template over the map's shape Sh, which answers type(),
 * key_size(), value_size(), max_entries(), capacity(), cap_mask(), key_stride(),
 * value_stride(), n_buckets(), lin_lo() / lin_hi() / lin_step(), values(), keys(), slots(),
 * stats() and find() (the hash probe: a __noinline__ call); a shape dtmk_hash_find_t
 * probes with also gives KEY_UNROLL (the key-word loops' unroll count: 1, or every word
 * when the key size is a constant):
 *   dtmk_desc_shape   reads the descriptor at run time: the helpers the VM calls
 *                     (bpf_maps.cuh), for any map;
 *   a generated shape the compiled tier's monitor (dtrace_mk/runtime/compiled/translator.py) emits one
 *                     per map its programs name, every field a constant (the host wrote
 *                     the descriptor once, at attach): the same operations, folded to
 *                     that map's type and sizes, without the descriptor's loads.
 * So both tiers run one body of each operation, and a map's stats count alike. */
__device__ __noinline__ int dtmk_hash_find(const struct dtmk_map *m, const void *key, bool create,
                                           const void *init, bool *created);
struct dtmk_desc_shape {
    static const int KEY_UNROLL = 1;   /* key words: rolled loops (any key size) */
    const struct dtmk_map *m;
    __device__ __forceinline__ dtmk_u32 type() const { return m->type; }
    __device__ __forceinline__ dtmk_u32 key_size() const { return m->key_size; }
    __device__ __forceinline__ dtmk_u32 value_size() const { return m->value_size; }
    __device__ __forceinline__ dtmk_u32 max_entries() const { return m->max_entries; }
    __device__ __forceinline__ dtmk_u32 capacity() const { return m->capacity; }
    __device__ __forceinline__ dtmk_u32 cap_mask() const { return m->cap_mask; }
    __device__ __forceinline__ dtmk_u32 key_stride() const { return m->key_stride; }
    __device__ __forceinline__ dtmk_u32 value_stride() const { return m->value_stride; }
    __device__ __forceinline__ dtmk_u32 n_buckets() const { return m->n_buckets; }
    __device__ __forceinline__ dtmk_s64 lin_lo() const { return m->lin_lo; }
    __device__ __forceinline__ dtmk_s64 lin_hi() const { return m->lin_hi; }
    __device__ __forceinline__ dtmk_s64 lin_step() const { return m->lin_step; }
    __device__ __forceinline__ dtmk_u64 values() const { return m->values; }
    __device__ __forceinline__ dtmk_u64 keys() const { return m->keys; }
    __device__ __forceinline__ dtmk_u64 slots() const { return m->slots; }
    __device__ __forceinline__ struct dtmk_map_stats *stats() const { return (struct dtmk_map_stats *)m->stats; }
    __device__ __forceinline__ int find(const void *key, bool create, const void *init, bool *created) const {
        return dtmk_hash_find(m, key, create, init, created);
    }
};

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
 * (never in serial use; documented in docs/results/device_vm.md).  The body of every
 * shape's find(). */
template <class Sh>
__device__ __forceinline__ int dtmk_hash_find_t(const Sh &m, const void *key, bool create, const void *init,
                                                bool *created) {
    dtmk_u32 w[DTMK_MAX_KEY_WORDS];
    dtmk_u32 nw = dtmk_load_key<Sh::KEY_UNROLL>(key, m.key_size(), w);
    const dtmk_u32 h0 = dtmk_key_hash<Sh::KEY_UNROLL>(w, nw) & m.cap_mask();
    dtmk_u32 *states = (dtmk_u32 *)m.slots();
    const dtmk_u32 kstride = m.key_stride();
    *created = false;
    for (;;) {
        int free_slot = -1;
        dtmk_u32 i = h0, probe = 0;
        for (; probe < m.capacity(); probe++, i = (i + 1) & m.cap_mask()) {
            dtmk_u32 st = dtmk_ld_acquire_u32(states + i);
            while (st == DTMK_SLOT_BUSY) {
                __nanosleep(20);
                st = dtmk_ld_acquire_u32(states + i);
            }
            if (st == DTMK_SLOT_FULL) {
                const dtmk_u32 *k = (const dtmk_u32 *)(m.keys() + (dtmk_u64)i * kstride);
                bool eq = true;
#pragma unroll (Sh::KEY_UNROLL)
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
            struct dtmk_map_stats *s = m.stats();      /* capacity >= 2 * max_entries        */
            atomicAdd((unsigned long long *)&s->probe_exhausted, 1ull);
            atomicAdd((unsigned long long *)&s->lost, 1ull);
            return DTMK_HASH_FULL;
        }
        const dtmk_u32 fs = (dtmk_u32)free_slot;
        const dtmk_u32 seen = dtmk_ld_acquire_u32(states + fs);
        if ((seen != DTMK_SLOT_EMPTY && seen != DTMK_SLOT_TOMB) ||
            atomicCAS(states + fs, seen, DTMK_SLOT_BUSY) != seen)
            continue;                                  /* someone took it: probe again */
        struct dtmk_map_stats *s = m.stats();
        unsigned long long c = atomicAdd((unsigned long long *)&s->count, 1ull);
        if (c >= m.max_entries()) {
            atomicAdd((unsigned long long *)&s->count, ~0ull);   /* -1 */
            atomicAdd((unsigned long long *)&s->lost, 1ull);
            dtmk_st_release_u32(states + fs, seen);
            return DTMK_HASH_FULL;
        }
        dtmk_u32 *k = (dtmk_u32 *)(m.keys() + (dtmk_u64)fs * kstride);
        for (dtmk_u32 j = 0; j < nw; j++) k[j] = w[j];
        void *v = (void *)(m.values() + (dtmk_u64)fs * m.value_stride());
        if (init) dtmk_copy(v, init, m.value_size());
        else dtmk_zero(v, m.value_stride());
        __threadfence();
        dtmk_st_release_u32(states + fs, DTMK_SLOT_FULL);
        *created = true;
        return (int)fs;
    }
}

template <class Sh> __device__ __forceinline__ dtmk_u64 dtmk_hash_value_t(const Sh &m, int slot) {
    return m.values() + (dtmk_u64)(dtmk_u32)slot * m.value_stride();
}
__device__ __forceinline__ dtmk_u64 dtmk_hash_value(const struct dtmk_map *m, int slot) {
    return dtmk_hash_value_t(dtmk_desc_shape{m}, slot);
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

template <class Sh> __device__ __forceinline__ dtmk_u64 dtmk_array_value_t(const Sh &m, dtmk_u32 idx, dtmk_u32 worker) {
    dtmk_u64 row = m.type() == BPF_MAP_TYPE_PERCPU_ARRAY ? (dtmk_u64)worker * m.max_entries() + idx : idx;
    return m.values() + row * m.value_stride();
}

template <class Sh>
__device__ __forceinline__ dtmk_u64 dtmk_map_lookup_t(const Sh &m, const void *key, dtmk_u32 worker, bool *lost) {
    dtmk_u32 t = m.type();
    if (dtmk_is_array(t)) {
        dtmk_u32 idx = dtmk_array_index(key);
        return idx < m.max_entries() ? dtmk_array_value_t(m, idx, worker) : 0;
    }
    if (dtmk_is_hash(t)) {
        bool created;
        int s = m.find(key, false, 0, &created);
        return s >= 0 ? dtmk_hash_value_t(m, s) : 0;
    }
    *lost = true;               /* ringbuf: helper error */
    return 0;
}

template <class Sh>
__device__ __forceinline__ dtmk_u64 dtmk_map_update_t(const Sh &m, const void *key, const void *value, dtmk_u64 flags,
                                                      dtmk_u32 worker, bool *lost) {
    dtmk_u32 t = m.type();
    if (!dtmk_is_array(t) && !dtmk_is_hash(t)) { *lost = true; return (dtmk_u64)-DTMK_EINVAL; }
    if (flags > 2) { *lost = true; return (dtmk_u64)-DTMK_EINVAL; }
    if (dtmk_is_array(t)) {
        dtmk_u32 idx = dtmk_array_index(key);
        if (idx >= m.max_entries()) {
            atomicAdd((unsigned long long *)&m.stats()->lost, 1ull);
            *lost = true;
            return (dtmk_u64)-DTMK_E2BIG;
        }
        if (flags == 1) return (dtmk_u64)-DTMK_EEXIST;
        dtmk_copy((void *)dtmk_array_value_t(m, idx, worker), value, m.value_size());
        return 0;
    }
    bool created;
    if (flags == 2) {   /* EXIST */
        int s = m.find(key, false, 0, &created);
        if (s < 0) return (dtmk_u64)-DTMK_ENOENT;
        dtmk_copy((void *)dtmk_hash_value_t(m, s), value, m.value_size());
        return 0;
    }
    int s = m.find(key, true, value, &created);
    if (s == DTMK_HASH_FULL) { *lost = true; return (dtmk_u64)-DTMK_E2BIG; }
    if (created) return 0;
    if (flags == 1) return (dtmk_u64)-DTMK_EEXIST;
    dtmk_copy((void *)dtmk_hash_value_t(m, s), value, m.value_size());
    return 0;
}

template <class Sh> __device__ __forceinline__ dtmk_u64 dtmk_map_delete_t(const Sh &m, const void *key, bool *lost) {
    dtmk_u32 t = m.type();
    if (!dtmk_is_hash(t)) { *lost = true; return (dtmk_u64)-DTMK_EINVAL; }
    bool created;
    int s = m.find(key, false, 0, &created);
    if (s < 0) return (dtmk_u64)-DTMK_ENOENT;
    dtmk_u32 *states = (dtmk_u32 *)m.slots();
    if (atomicCAS(states + s, DTMK_SLOT_FULL, DTMK_SLOT_TOMB) != DTMK_SLOT_FULL)
        return (dtmk_u64)-DTMK_ENOENT;            /* deleted concurrently */
    atomicAdd((unsigned long long *)&m.stats()->count, ~0ull);
    return 0;
}

template <class Sh>
__device__ __forceinline__ dtmk_u64 dtmk_hist_add_t(const Sh &m, const void *key, dtmk_u64 v, bool *lost) {
    dtmk_u32 t = m.type();
    if (t != DTMK_MAP_TYPE_HIST_LOG2 && t != DTMK_MAP_TYPE_HIST_LINEAR) { *lost = true; return (dtmk_u64)-DTMK_EINVAL; }
    bool created;
    int s = m.find(key, true, 0, &created);
    if (s < 0) { *lost = true; return (dtmk_u64)-DTMK_E2BIG; }
    dtmk_u32 b = t == DTMK_MAP_TYPE_HIST_LOG2 ? dtmk_bucket_log2(v)
                                              : dtmk_bucket_linear(m.lin_lo(), m.lin_hi(), m.lin_step(), m.n_buckets(), v);
    atomicAdd((unsigned long long *)(dtmk_hash_value_t(m, s) + 8ull * b), 1ull);
    return 0;
}

/* The probe alone, for a key of KEY_SIZE bytes in the table at keys / slots: one
 * __noinline__ body per key size, shared by every map of that size in a compiled monitor
 * (a present key is what the drain meets per record; an absent one goes to the insert). */
template <dtmk_u32 KEY_SIZE> struct dtmk_probe_shape {
    static const int KEY_UNROLL = KEY_SIZE > 4 ? (KEY_SIZE + 3) / 4 : 1;   /* every key word */
    dtmk_u64 keys_, slots_;
    dtmk_u32 capacity_, key_stride_;
    __device__ __forceinline__ dtmk_u32 key_size() const { return KEY_SIZE; }
    __device__ __forceinline__ dtmk_u32 capacity() const { return capacity_; }
    __device__ __forceinline__ dtmk_u32 cap_mask() const { return capacity_ - 1u; }
    __device__ __forceinline__ dtmk_u32 key_stride() const { return key_stride_; }
    __device__ __forceinline__ dtmk_u64 keys() const { return keys_; }
    __device__ __forceinline__ dtmk_u64 slots() const { return slots_; }
    /* (the insert's fields: never reached with create == false) */
    __device__ __forceinline__ dtmk_u32 max_entries() const { return 0; }
    __device__ __forceinline__ dtmk_u32 value_size() const { return 0; }
    __device__ __forceinline__ dtmk_u32 value_stride() const { return 0; }
    __device__ __forceinline__ dtmk_u64 values() const { return 0; }
    __device__ __forceinline__ struct dtmk_map_stats *stats() const { return 0; }
};
template <dtmk_u32 KEY_SIZE>
__device__ __noinline__ int dtmk_hash_look(const void *key, dtmk_u64 keys, dtmk_u64 slots, dtmk_u32 capacity,
                                           dtmk_u32 key_stride) {
    bool created;
    return dtmk_hash_find_t(dtmk_probe_shape<KEY_SIZE>{keys, slots, capacity, key_stride}, key, false, 0, &created);
}

/* A shape of constants (the compiled tier: dtrace_mk/runtime/compiled/translator.py emits one per map
 * its programs name, from the descriptor DESC the host wrote at attach): struct N answers
 * every field with a literal.  Its find() probes through dtmk_hash_look<KEY_SIZE> (no
 * per-map code) and inserts an absent key through the generic dtmk_hash_find (the probe
 * would find a present key there too; an epoch's keys are few, so the insert stays off the
 * lines the drain runs per record).  An array map's find() is never called: type() folds
 * the hash branches away. */
#define DTMK_CONST_SHAPE(N, DESC, TYPE, KEY_SIZE, VALUE_SIZE, MAX_ENTRIES, CAPACITY, KEY_STRIDE, VALUE_STRIDE, \
                         N_BUCKETS, LIN_LO, LIN_HI, LIN_STEP, VALUES, KEYS, SLOTS, STATS)                       \
    struct N {                                                                                                  \
        __device__ __forceinline__ dtmk_u32 type() const { return TYPE; }                                       \
        __device__ __forceinline__ dtmk_u32 key_size() const { return KEY_SIZE; }                               \
        __device__ __forceinline__ dtmk_u32 value_size() const { return VALUE_SIZE; }                           \
        __device__ __forceinline__ dtmk_u32 max_entries() const { return MAX_ENTRIES; }                         \
        __device__ __forceinline__ dtmk_u32 capacity() const { return CAPACITY; }                               \
        __device__ __forceinline__ dtmk_u32 cap_mask() const { return (CAPACITY) - 1u; }                        \
        __device__ __forceinline__ dtmk_u32 key_stride() const { return KEY_STRIDE; }                           \
        __device__ __forceinline__ dtmk_u32 value_stride() const { return VALUE_STRIDE; }                       \
        __device__ __forceinline__ dtmk_u32 n_buckets() const { return N_BUCKETS; }                             \
        __device__ __forceinline__ dtmk_s64 lin_lo() const { return (dtmk_s64)(LIN_LO); }                       \
        __device__ __forceinline__ dtmk_s64 lin_hi() const { return (dtmk_s64)(LIN_HI); }                       \
        __device__ __forceinline__ dtmk_s64 lin_step() const { return (dtmk_s64)(LIN_STEP); }                   \
        __device__ __forceinline__ dtmk_u64 values() const { return VALUES; }                                   \
        __device__ __forceinline__ dtmk_u64 keys() const { return KEYS; }                                       \
        __device__ __forceinline__ dtmk_u64 slots() const { return SLOTS; }                                     \
        __device__ __forceinline__ struct dtmk_map_stats *stats() const { return (struct dtmk_map_stats *)(STATS); } \
        __device__ __forceinline__ int find(const void *key, bool create, const void *init, bool *created) const { \
            const int s = dtmk_hash_look<KEY_SIZE>(key, KEYS, SLOTS, CAPACITY, KEY_STRIDE);                    \
            *created = false;                                                                                   \
            return s >= 0 || !create ? s : dtmk_hash_find((const struct dtmk_map *)(DESC), key, true, init, created); \
        }                                                                                                       \
    };

#endif /* DTMK_BPF_MAP_OPS_CUH */
