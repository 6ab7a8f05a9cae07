"""Latency of the reads a hook site makes on thread 0 (GPU, one CTA, ~1 s).

    python bench/timer_cost.py

Per read, in a dependent chain of N (each read's address or use depends on the last),
one thread: %globaltimer, clock64, a shared-memory load, an L2-resident global load
after an L1 invalidation (what a task-record read costs after the acquire poll), a
global load that hits L1, and a red.release (fire and forget).  Prints ns per read.
"""
from __future__ import annotations

import sys

REQUIRES = "gpu"   # what `dtrace-mk bench timer_cost` checks before it runs: cpu, gpu, or gpu:N (N ranks, N GPUs)

SRC = r"""
typedef unsigned long long u64;
__device__ __forceinline__ u64 gt() { u64 t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); return t; }
extern "C" __global__ void k(u64 *out, int *buf, int n) {
    __shared__ int sm[1024];
    for (int i = threadIdx.x; i < 1024; i += blockDim.x) sm[i] = (i * 7 + 1) & 1023;
    __syncthreads();
    if (threadIdx.x) return;
    u64 acc = 0, c0, c1;
    // globaltimer chain
    c0 = clock64();
    for (int i = 0; i < n; ++i) acc += gt() & 1;
    c1 = clock64(); out[0] = c1 - c0;
    // clock64 chain
    c0 = clock64();
    for (int i = 0; i < n; ++i) { u64 c; asm volatile("mov.u64 %0, %%clock64;" : "=l"(c)); acc += c & 1; }
    c1 = clock64(); out[1] = c1 - c0;
    // shared chain
    int j = 0;
    c0 = clock64();
    for (int i = 0; i < n; ++i) j = ((volatile int *)sm)[j];
    c1 = clock64(); out[2] = c1 - c0; acc += j;
    // global chain, L1 invalidated each time (ld.acquire.gpu = the poll's load)
    j = 0;
    c0 = clock64();
    for (int i = 0; i < n; ++i) { int v; asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(buf + j) : "memory"); j = v; }
    c1 = clock64(); out[3] = c1 - c0; acc += j;
    // global chain, L1 hits
    j = 0;
    for (int i = 0; i < 64; ++i) j = __ldca(buf + j);
    j = 0;
    c0 = clock64();
    for (int i = 0; i < n; ++i) j = __ldca(buf + j);
    c1 = clock64(); out[4] = c1 - c0; acc += j;
    // release reductions (no return value)
    c0 = clock64();
    for (int i = 0; i < n; ++i) asm volatile("red.release.gpu.global.add.u64 [%0], 1;" :: "l"(out + 16) : "memory");
    c1 = clock64(); out[5] = c1 - c0;
    // atomicAdd with its result used (a ring reservation)
    u64 h = 0;
    c0 = clock64();
    for (int i = 0; i < n; ++i) h += atomicAdd(out + 17, 1ull + (h & 1));
    c1 = clock64(); out[6] = c1 - c0;
    out[8] = acc + h;
}
"""

NAMES = ["%globaltimer", "clock64", "shared load (chain)", "global ld.acquire (L2, chain)",
         "global load L1 hit (chain)", "red.release.gpu (no result)", "atomicAdd (result used)"]


def main() -> int:
    import cupy as cp
    n = 512
    mod = cp.RawModule(code=SRC, options=("-std=c++17",))
    k = mod.get_function("k")
    out = cp.zeros(32, cp.uint64)
    buf = cp.zeros(1 << 16, cp.int32)
    buf[:] = (cp.arange(1 << 16, dtype=cp.int32) * 33 + 1) & 1023
    for _ in range(3):
        out[:] = 0
        k((1,), (128,), (out, buf, cp.int32(n)))
    cp.cuda.runtime.deviceSynchronize()
    clk = cp.cuda.runtime.deviceGetAttribute(cp.cuda.runtime.cudaDevAttrClockRate, 0) * 1e3  # Hz
    o = out.get()
    print(f"{cp.cuda.runtime.getDeviceProperties(0)['name'].decode()}, SM clock attribute {clk / 1e9:.2f} GHz")
    for i, name in enumerate(NAMES):
        cyc = o[i] / n
        print(f"  {name:<32} {cyc:8.1f} cycles  {cyc / clk * 1e9:8.1f} ns")
    return 0


if __name__ == "__main__":
    sys.exit(main())
