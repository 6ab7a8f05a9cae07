/* bpf_buckets.cuh: which bucket of a hist_log2 / hist_linear map a value counts in (the
 * value layouts the host reads: dtrace_mk/bpf/maps.py).  One definition for the map
 * helpers (bpf_maps.cuh) and the compiled tier's inline form (bpf_inline.cuh, included by
 * generated monitors, which do not include bpf_maps.cuh).  No standard headers (NVRTC). */
#ifndef DTMK_BPF_BUCKETS_CUH
#define DTMK_BPF_BUCKETS_CUH

#include "dtrace_mk_abi.h"

/* bucket 0: v == 0; bucket b: 2^(b-1) <= v < 2^b; the last bucket takes the rest */
__device__ __forceinline__ dtmk_u32 dtmk_bucket_log2(dtmk_u64 v) {
    if (v == 0) return 0;
    dtmk_u32 b = 64 - __clzll((long long)v);
    return b < DTMK_HIST_LOG2_BUCKETS - 1 ? b : DTMK_HIST_LOG2_BUCKETS - 1;
}
/* bucket 0: v < lo; bucket n-1: v >= hi; else 1 + (v - lo) / step (signed values) */
__device__ __forceinline__ dtmk_u32 dtmk_bucket_linear(dtmk_s64 lo, dtmk_s64 hi, dtmk_s64 step, dtmk_u32 n_buckets,
                                                      dtmk_u64 v) {
    dtmk_s64 s = (dtmk_s64)v;
    if (s < lo) return 0;
    if (s >= hi) return n_buckets - 1;
    /* lo <= s < hi: the difference fits in u64 */
    return 1 + (dtmk_u32)((dtmk_u64)(s - lo) / (dtmk_u64)step);
}

#endif /* DTMK_BPF_BUCKETS_CUH */
