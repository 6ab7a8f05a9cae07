/* Hand-written twin of the query in tests/lang/test_differential.py:
 *
 *   task:end /task.class == "attn"/ { @lat[task.layer] = hist(task.dur_ns);
 *                                     @n[task.class, step] = count(); }
 *   comm:wait { @wait[comm.op] = sum(comm.wait_ns); @mx = max(comm.wait_ns); }
 *
 * Same map names, types, key and value layouts as the compiler's output (8-byte keys;
 * count/sum: hash of u64 with atomic add; unkeyed max: hash with one u32 key 0), so
 * both must produce byte-identical maps over the same events.
 *
 * Build: clang -target bpf -O2 -g -c diff_attn_comm.c -I ../../../dtrace_mk/abi/include
 */
#include "dtrace_mk_bpf.h"

#define ATTN 3          /* task class "attn" in the standard schema */

struct {
    __uint(type, DTMK_MAP_TYPE_HIST_LOG2);
    __uint(max_entries, 4096);
    __type(key, dtmk_u64);
} lat SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 4096);
    __uint(key_size, 16);
    __type(value, dtmk_u64);
} n SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 4096);
    __type(key, dtmk_u64);
    __type(value, dtmk_u64);
} wait SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 1);
    __type(key, dtmk_u32);
    __type(value, dtmk_u64);
} mx SEC(".maps");

static __always_inline dtmk_u64 *lookup_or_init(void *map, void *key)
{
    dtmk_u64 zero = 0;
    dtmk_u64 *v = bpf_map_lookup_elem(map, key);

    if (v)
        return v;
    bpf_map_update_elem(map, key, &zero, BPF_NOEXIST);
    return bpf_map_lookup_elem(map, key);
}

SEC("task/end")
int attn_latency(struct dtmk_ctx *ctx)
{
    dtmk_u64 k[2];
    dtmk_u64 *v;

    if (ctx->task_class != ATTN)
        return 0;
    k[0] = ctx->layer;
    bpf_hist_add(&lat, k, ctx->dur_ns);
    k[0] = ctx->task_class;
    k[1] = ctx->decode_step;
    v = lookup_or_init(&n, k);
    if (v)
        __sync_fetch_and_add(v, 1);
    return 0;
}

SEC("comm/wait")
int remote_wait(struct dtmk_ctx *ctx)
{
    dtmk_u64 op = ctx->comm_op;
    dtmk_u64 w = ctx->wait_ns;
    dtmk_u32 zero = 0;
    dtmk_u64 *v;

    v = lookup_or_init(&wait, &op);
    if (v)
        __sync_fetch_and_add(v, w);
    v = lookup_or_init(&mx, &zero);
    if (v && *v < w)
        *v = w;
    return 0;
}

DTMK_LICENSE("GPL");
DTMK_ABI_NOTE;
