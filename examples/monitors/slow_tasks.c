/* Evidence for slow tasks: on task:end, when a task ran longer than SLOW_NS, copy a
 * raw record into a ring buffer (at most 4096 bytes per epoch and worker; the rest
 * is counted as throttled), count it, and print a trace line.
 *
 * The trace_printk format strings are constants: clang places them in .rodata and
 * the loader turns them into an internal read-only map.
 */
#include "dtrace_mk_bpf.h"

#define SLOW_NS 20000

struct slow_task {
    dtmk_u64 ts_ns;
    dtmk_u64 dur_ns;
    dtmk_u64 tile;
    dtmk_u32 task_class;
    dtmk_u32 task_index;
    dtmk_u32 layer;
    dtmk_u32 request_slot;
    dtmk_u32 worker;
    dtmk_u32 decode_step;
};

struct {
    __uint(type, BPF_MAP_TYPE_RINGBUF);
    __uint(max_entries, 4096);
    __uint(budget_bytes, 4096);
} slow_evidence SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, 2);
    __type(key, dtmk_u32);
    __type(value, dtmk_u64);
} slow_count SEC(".maps");                 /* [0] slow tasks, [1] records dropped */

SEC("task/end")
int slow_task_evidence(struct dtmk_ctx *ctx)
{
    struct slow_task rec = {};
    dtmk_u32 idx = 0;
    dtmk_u64 *n;

    if (ctx->dur_ns <= SLOW_NS)
        return 0;
    rec.ts_ns = ctx->ts_ns;
    rec.dur_ns = ctx->dur_ns;
    rec.tile = ctx->tile;
    rec.task_class = ctx->task_class;
    rec.task_index = ctx->task_index;
    rec.layer = ctx->layer;
    rec.request_slot = ctx->request_slot;
    rec.worker = ctx->worker;
    rec.decode_step = ctx->decode_step;
    if (bpf_ringbuf_output(&slow_evidence, &rec, sizeof(rec), 0) < 0)
        idx = 1;
    n = bpf_map_lookup_elem(&slow_count, &idx);
    if (n)
        __sync_fetch_and_add(n, 1);
    {
        static const char fmt[] = "slow task class %u layer %u: %llu ns";
        bpf_trace_printk(fmt, sizeof(fmt), ctx->task_class, ctx->layer, ctx->dur_ns);
    }
    return 0;
}

DTMK_LICENSE("Dual MIT/GPL");
DTMK_ABI_NOTE;
