/* mk_common.cuh: small device helpers shared by the megakernel and the per-operator
 * baseline.  NVRTC has no C++ standard headers: only dtrace_mk_abi.h typedefs here.
 *
 *   bf16 <-> fp32, 16-byte weight loads, L2-only activation loads,
 *   acquire/release event counters, %globaltimer, splitmix64 fault_pick,
 *   warp / block reductions.
 */
#ifndef DTMK_MK_COMMON_CUH
#define DTMK_MK_COMMON_CUH

/* NVRTC 13.0 (the H200 image's) has no __builtin_offsetof, which the generated
 * header's layout checks use; gpu.compile_source() then retries with
 * DTMK_NO_OFFSETOF_ASSERTS (CI's newer NVRTC keeps the checks). */
#ifdef DTMK_NO_OFFSETOF_ASSERTS
#define static_assert(...)
#endif
#include "dtrace_mk_abi.h"
#ifdef DTMK_NO_OFFSETOF_ASSERTS
#undef static_assert
#endif

#if defined(DTMK_OSQ_ICODE) || defined(DTMK_WK_ICODE)
/* MEASUREMENT ONLY (the instruction-cache probes: mk_obs_sm.cuh osq_icode, megakernel.cu
 * wk_icode): four independent xorshift-multiply chains, unrolled N times -- straight-line
 * code, no memory, ~12 instructions per iteration.
 * SALT changes the multipliers, so each caller's copy is code of its own (SALT 0: session 26's
 * osq_icode, its PTX equal but for the order of the last three xors) */
template <int N, unsigned SALT> __device__ __forceinline__ dtmk_u32 probe_icode(dtmk_u32 a) {
    dtmk_u32 b = a ^ 0x9e3779b9u, c = a + 0x7f4a7c15u, d = a * 3u + 1u;
#pragma unroll
    for (int j = 0; j < N; ++j) {
        a = (a ^ (a >> 7)) * (0x2545f491u ^ SALT) + (dtmk_u32)j;
        b = (b ^ (b >> 9)) * (0x9e3779b1u ^ SALT) + (dtmk_u32)(j * 3);
        c = (c ^ (c >> 5)) * (0x85ebca6bu ^ SALT) + (dtmk_u32)(j * 5);
        d = (d ^ (d >> 11)) * (0xc2b2ae35u ^ SALT) + (dtmk_u32)(j * 7);
    }
    return a ^ b ^ c ^ d;
}
#endif

#define MK_THREADS 512                      /* threads of a CTA (the task bodies) */
/* the kernel's register bound: one 512-thread CTA per SM (128 registers).  -DDTMK_MAXNREG=N
 * (measurement, bench/paired.py --codes): __maxnreg__(N) instead.  Session 13: the no-hook
 * code at 120 registers ran +2.5% (1b) / +3.3% (tiny); and a 17th warp cannot be launched
 * beside 120-register warps anyway (warps get registers in groups of 4: the driver allows
 * 512 threads), docs/dev/hook_cost_analysis.md round 6 and "Session 13". */
#ifdef DTMK_MAXNREG
#define MK_KERNEL_BOUNDS __maxnreg__(DTMK_MAXNREG)
#else
#define MK_KERNEL_BOUNDS __launch_bounds__(MK_THREADS, 1)
#endif
#define MK_WARPS (MK_THREADS / 32)
#define MK_SYNC() __syncthreads()          /* every CTA barrier (one name for grep) */
#define MK_FULL 0xffffffffu

/* ---- numbers ------------------------------------------------------------------ */
__device__ __forceinline__ float bf16_lo(dtmk_u32 w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf16_hi(dtmk_u32 w) { return __uint_as_float(w & 0xffff0000u); }
__device__ __forceinline__ float bf16_at(const unsigned short *p, long i) {
    return __uint_as_float(((dtmk_u32)__ldg(p + i)) << 16);
}

/* dot of 8 bf16 weights (one 16-byte load) with 8 fp32 activations at x: from L2
 * (global, written by other CTAs: never through the non-coherent L1) or shared memory */
/* the arithmetic (its order fixes the bits every matvec path must reproduce): a = x[0:4],
 * b = x[4:8] already in registers */
__device__ __forceinline__ float dot8_regs(uint4 w, float4 a, float4 b) {
    float s = bf16_lo(w.x) * a.x;
    s = fmaf(bf16_hi(w.x), a.y, s);
    s = fmaf(bf16_lo(w.y), a.z, s);
    s = fmaf(bf16_hi(w.y), a.w, s);
    s = fmaf(bf16_lo(w.z), b.x, s);
    s = fmaf(bf16_hi(w.z), b.y, s);
    s = fmaf(bf16_lo(w.w), b.z, s);
    s = fmaf(bf16_hi(w.w), b.w, s);
    return s;
}
template <bool SHARED>
__device__ __forceinline__ float dot8(uint4 w, const float *x) {
    float4 a, b;
    if (SHARED) { a = *(const float4 *)x; b = *(const float4 *)(x + 4); }
    else { a = __ldcg((const float4 *)x); b = __ldcg((const float4 *)(x + 4)); }
    return dot8_regs(w, a, b);
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(MK_FULL, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(MK_FULL, v, o));
    return v;
}

/* block-wide sum; scratch holds >= MK_WARPS floats; all threads get the result */
__device__ __forceinline__ float block_sum(float v, float *scratch) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_sum(v);
    MK_SYNC();
    if (lane == 0) scratch[warp] = v;
    MK_SYNC();
    float t = lane < MK_WARPS ? scratch[lane] : 0.0f;
    return warp_sum(t);
}

/* ---- time --------------------------------------------------------------------- */
__device__ __forceinline__ dtmk_u64 mk_now() {
    dtmk_u64 t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
__device__ __forceinline__ void mk_spin_ns(dtmk_u64 ns) {
    if (ns == 0) return;
    dtmk_u64 t0 = mk_now();
    while (mk_now() - t0 < ns) { __nanosleep(64); }
}

/* ---- event counters (monotonic u64) ------------------------------------------- */
/* NAME(p): a u64 load with memory-model semantics SEM at scope SCOPE (gpu: this GPU's
 * workers; sys: peer GPUs too, mk_comm.cuh) */
#define MK_LD_U64(NAME, SEM, SCOPE)                                                              \
    __device__ __forceinline__ dtmk_u64 NAME(const dtmk_u64 *p) {                                \
        dtmk_u64 v;                                                                              \
        asm volatile("ld." #SEM "." #SCOPE ".global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory"); \
        return v;                                                                                \
    }
MK_LD_U64(ld_acquire, acquire, gpu)
MK_LD_U64(ld_relaxed, relaxed, gpu)
__device__ __forceinline__ void fence_acquire() { asm volatile("fence.acq_rel.gpu;" ::: "memory"); }
/* start streaming [p, p + bytes) into L2 (bulk copy engine, sm_90); 16-byte aligned */
__device__ __forceinline__ void prefetch_l2(const void *p, dtmk_u64 bytes) {
    const char *c = (const char *)p;
    while (bytes >= 16) {
        dtmk_u32 n = (dtmk_u32)(bytes > 65536 ? 65536 : bytes & ~15ull);
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" :: "l"(c), "r"(n) : "memory");
        c += n; bytes -= n;
    }
}
__device__ __forceinline__ void red_release_add(dtmk_u64 *p, dtmk_u64 v) {
    asm volatile("red.release.gpu.global.add.u64 [%0], %1;" :: "l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ dtmk_u32 ld_volatile_u32(const dtmk_u32 *p) {
    return *(volatile const dtmk_u32 *)p;
}

/* ---- shared fault hash: identical to dtrace_mk.megakernel.faults.fault_pick ------ */
__device__ __forceinline__ dtmk_u64 splitmix64(dtmk_u64 x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

/* fault_pick(seed, idx, step) in [0, 1e6): identical to faults.fault_pick */
__device__ __forceinline__ dtmk_u32 fault_pick(dtmk_u64 seed, dtmk_u32 idx, dtmk_u32 step) {
    return (dtmk_u32)(splitmix64(splitmix64(seed) ^ ((dtmk_u64)idx << 32) ^ (dtmk_u64)step) % 1000000ull);
}
#endif /* DTMK_MK_COMMON_CUH */
