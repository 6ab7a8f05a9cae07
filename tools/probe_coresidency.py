"""Can a second grid take the SMs a running persistent grid frees?  (grid handoff's premise)

    python tools/probe_coresidency.py

Grid A (one 512-thread block per SM, the megakernel's shape): half its blocks exit at
once, the other half spin until grid B (launched after A on another stream) sets a flag,
or give up after 1 s.  If B's blocks are placed on the freed SMs while A still runs, no
block gives up.  Cases vary what differs between the two kernels: nothing, B's static
shared memory (another L1 / shared carveout), dynamic shared memory, the carveout
attribute set equal.  Prints one line per case: blocks that gave up (0 = co-scheduled)."""
import sys

import cupy as cp

SRC = r"""
extern "C" __global__ void __launch_bounds__(512, 1) grid_a(unsigned int *flag, unsigned int *gave_up, int stay_from,
                                                               unsigned int *sms_used, float *sink) {
    extern __shared__ float dyn[];
    /* ~100 values live across the spin: ~128 registers per thread, so one block per SM
     * (the megakernel's occupancy) even when shared memory would allow more */
    float v[100];
#pragma unroll
    for (int i = 0; i < 100; ++i) v[i] = sink[(threadIdx.x + i * 7) & 1023] * (float)(i + 1);
    if (threadIdx.x == 0) {
        unsigned int sm;
        asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
        atomicOr(sms_used + (sm >> 5), 1u << (sm & 31));
    }
    if ((int)blockIdx.x < stay_from) return;
    if (threadIdx.x == 0) {
        unsigned long long t0, t;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
        for (;;) {
            if (*(volatile unsigned int *)flag) break;
            asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
            if (t - t0 > 1000000000ull) { atomicAdd(gave_up, 1u); break; }
            __nanosleep(1000);
        }
    }
    __syncthreads();
    float acc = 0.f;
#pragma unroll
    for (int i = 0; i < 100; ++i) acc += v[i] * dyn[i & 7];
    if (acc == 12345.f) sink[threadIdx.x] = acc;
}
extern "C" __global__ void __launch_bounds__(512, 1) grid_b(unsigned int *flag) {
    extern __shared__ float dyn[];
#ifdef B_STATIC
    __shared__ float pad[B_STATIC / 4];
    if (threadIdx.x == 0) { pad[0] = 1.f; dyn[0] = pad[0]; }
#endif
    if (threadIdx.x == 0) atomicExch(flag, 1u);
}
"""


def case(name, b_static=0, a_dyn=150_000, b_dyn=150_000, carveout=None):
    opts = ("--std=c++17",) + ((f"-DB_STATIC={b_static}",) if b_static else ())
    mod = cp.RawModule(code=SRC, options=opts)
    ka, kb = mod.get_function("grid_a"), mod.get_function("grid_b")
    for k, n in ((ka, a_dyn), (kb, b_dyn)):
        k.max_dynamic_shared_size_bytes = n
        if carveout is not None:
            k.preferred_shared_memory_carveout = carveout
    sms = cp.cuda.Device().attributes["MultiProcessorCount"]
    flag, gave, used = cp.zeros(1, cp.uint32), cp.zeros(1, cp.uint32), cp.zeros(8, cp.uint32)
    sink = cp.zeros(1024, cp.float32)
    sa, sb = cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)
    cp.cuda.runtime.deviceSynchronize()
    ka((sms,), (512,), (flag, gave, cp.int32(sms // 2), used, sink), shared_mem=a_dyn, stream=sa)
    kb((sms // 2,), (512,), (flag,), shared_mem=b_dyn, stream=sb)
    sa.synchronize()
    sb.synchronize()
    n_sms = sum(bin(int(x)).count("1") for x in used.get())
    print(f"{name:<44} gave up {int(gave.get()[0]):>4} of {sms - sms // 2}   (A on {n_sms} SMs, "
          f"{ka.num_regs} regs)", flush=True)


def main() -> int:
    case("same kernel shape, same shared memory")
    case("B +27 KB static shared (other carveout)", b_static=27_136)
    case("B +27 KB static, both carveout 100%", b_static=27_136, carveout=100)
    case("tiny-like: A 8 KB, B 8 KB + 27 KB static", b_static=27_136, a_dyn=7_000, b_dyn=7_000)
    case("tiny-like, both carveout 100%", b_static=27_136, a_dyn=7_000, b_dyn=7_000, carveout=100)
    case("A 8 KB, B 40 KB dynamic", a_dyn=7_000, b_dyn=40_000)
    return 0


if __name__ == "__main__":
    sys.exit(main())
