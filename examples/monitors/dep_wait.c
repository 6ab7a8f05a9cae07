/* Dependency wait per layer and remote wait per peer rank.
 *
 *   dep:release -> dep_wait_ns[layer] += wait_ns ; dep_releases[layer] += 1
 *   comm:wait   -> remote_wait_ns[peer_rank] += wait_ns   (per-worker copies, no contention)
 *
 * Shows the usual hash pattern: a null-checked lookup with an atomic add, and an
 * insert (BPF_NOEXIST) the first time a key is seen.
 */
#include "dtrace_mk_bpf.h"

struct wait_stat {
    dtmk_u64 wait_ns;
    dtmk_u64 releases;
};

struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 256);
    __type(key, dtmk_u32);                 /* layer */
    __type(value, struct wait_stat);
} dep_wait SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
    __uint(max_entries, 64);
    __type(key, dtmk_u32);                 /* peer rank */
    __type(value, dtmk_u64);
} remote_wait_ns SEC(".maps");

static __always_inline void add_wait(dtmk_u32 layer, dtmk_u64 wait_ns)
{
    struct wait_stat *st = bpf_map_lookup_elem(&dep_wait, &layer);

    if (st) {
        __sync_fetch_and_add(&st->wait_ns, wait_ns);
        __sync_fetch_and_add(&st->releases, 1);
    } else {
        struct wait_stat init = { .wait_ns = wait_ns, .releases = 1 };
        bpf_map_update_elem(&dep_wait, &layer, &init, BPF_NOEXIST);
    }
}

SEC("dep/release")
int dep_wait_by_layer(struct dtmk_ctx *ctx)
{
    add_wait(ctx->layer, ctx->wait_ns);
    return 0;
}

SEC("comm/wait")
int remote_wait_by_peer(struct dtmk_ctx *ctx)
{
    dtmk_u32 peer = ctx->peer_rank;
    dtmk_u64 *v;

    if (peer >= 64)
        return 0;
    v = bpf_map_lookup_elem(&remote_wait_ns, &peer);
    if (v)
        *v += ctx->wait_ns;
    return 0;
}

DTMK_LICENSE("Dual MIT/GPL");
DTMK_ABI_NOTE;
