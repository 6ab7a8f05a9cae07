/* Task latency by task class, and ready-queue depth at dispatch.
 *
 *   task:end      -> lat_by_class[task_class] = log2 histogram of dur_ns
 *   task:dispatch -> queue_depth_hist[0]      = linear histogram of queue_depth (0..64 by 4)
 *
 * Build: clang -target bpf -O2 -g -c task_latency.c -I ../../dtrace_mk/abi/include
 *        (or: python examples/monitors/build.py)
 * Check: dtrace-mk verify task_latency.o
 */
#include "dtrace_mk_bpf.h"

struct {
    __uint(type, DTMK_MAP_TYPE_HIST_LOG2);
    __uint(max_entries, 64);
    __type(key, dtmk_u32);                 /* task class id (task schema) */
} lat_by_class SEC(".maps");               /* value: 64 u64 buckets, implied */

struct {
    __uint(type, DTMK_MAP_TYPE_HIST_LINEAR);
    __uint(max_entries, 1);
    __type(key, dtmk_u32);
    __uint(lin_lo, 0);
    __uint(lin_hi, 64);
    __uint(lin_step, 4);
} queue_depth_hist SEC(".maps");

SEC("task/end")
int task_latency(struct dtmk_ctx *ctx)
{
    dtmk_u32 cls = ctx->task_class;

    bpf_hist_add(&lat_by_class, &cls, ctx->dur_ns);
    return 0;
}

SEC("task/dispatch")
int dispatch_queue_depth(struct dtmk_ctx *ctx)
{
    dtmk_u32 zero = 0;

    bpf_hist_add(&queue_depth_hist, &zero, ctx->queue_depth);
    return 0;
}

DTMK_LICENSE("Dual MIT/GPL");
DTMK_ABI_NOTE;
