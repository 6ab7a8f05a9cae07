"""What one hook record costs thread 0 (round 8, docs/dev/hook_cost_analysis.md).

    python bench/record_cost.py [--ops 2048] [--reps 5] [--out DIR]

One GPU, < 1 minute.  One CTA of 512 threads per SM, like the megakernel: warp 0 (thread 0,
or all its 32 lanes for the warp-cooperative store) runs --ops operations of one kind back
to back, timed by %globaltimer and clock64 around the loop; with --load (default both) warps
1-15 of every CTA stream a 2 GiB buffer from HBM meanwhile (ld.global.cg, 16 B per thread),
which is what the other CTAs of a 1b decode step do while a worker's thread 0 runs the
scheduler.  Printed per kind: ns and SM cycles per operation (median over the 132 CTAs,
then median over --reps launches), idle and under load.

  empty       the loop alone (subtract from the others)
  gtimer      one %globaltimer read whose value is tested (mk_now at a hook site)
  clock64     one clock64 read, tested (a per-launch-calibrated duration source)
  st_t0       thread 0 writes a 128-byte record: 8 x st.global.v4 (hk_store today)
  st_warp     warp 0 writes it cooperatively: 32 lanes x st.global.u32, one coalesced
              128-byte store + __syncwarp (the warp-cooperative variant)
  st_t0_fence st_t0 followed by __threadfence (what the next release signal's
              MEMBAR.ALL.GPU pays when the record stores are still outstanding)
  l2_chase    one dependent ld.global.cg of a 64-byte task-record line that this CTA
              touched 16 hops ago (an L2 hit, L1 bypassed as after the wait's acquire
              CCTL.IVALL): the trip hook_hold (before the release signal) and hook_flush
              (after it) pay for the task record; DTMK_REC_FAST removes it
  smem_chase  one dependent generic load from shared memory (the s_rec copy DTMK_REC_FAST
              reads instead)
  hbm_chase   as l2_chase over 4 MiB of lines touched once per launch (mostly L2 misses):
              the upper bound if the weight stream evicted the task table

What decides (written before any run): if gtimer under load is >= ~100 ns, the 3 extra
mk_now per observed task (t_disp, t_ready, t_begin) are ~0.3 us per handoff and worth
deriving from one stamp; if l2_chase under load is >= ~500 ns, the task-record trips
(1 before the release signal, 2 after it per task) explain ~1-1.5 us per handoff and
DTMK_REC_FAST is the lever; st_t0 vs st_warp says whether a warp-cooperative store pays
(expected: both << 100 ns per record, i.e. the stores are not the cost).
Writes DIR/record_cost.json.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

REQUIRES = "gpu"   # what `dtrace-mk bench record_cost` checks before it runs: cpu, gpu, or gpu:N (N ranks, N GPUs)

KINDS = ("empty", "gtimer", "clock64", "st_t0", "st_warp", "st_t0_fence", "l2_chase", "smem_chase", "hbm_chase")

SRC = r"""
typedef unsigned long long u64;
__device__ __forceinline__ u64 gtimer() { u64 t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); return t; }
__device__ __forceinline__ u64 clk() { u64 t; asm volatile("mov.u64 %0, %%clock64;" : "=l"(t)); return t; }
__device__ __forceinline__ uint4 ldcg4(const uint4 *p) { return __ldcg(p); }

/* kind: see KINDS in record_cost.py; load: warps 1-15 stream `buf` (n16 uint4) meanwhile.
 * out[block * 4 + 0..3]: ns, cycles of warp 0's loop, a sink, 0 */
extern "C" __global__ void __launch_bounds__(512, 1)
rc_kernel(int kind, int ops, int load, const uint4 *buf, unsigned long long n16, uint4 *ring,
          const int *chase, int chase_n, const int *hot, u64 *out) {
    __shared__ volatile int stop;
    __shared__ int srec[64];
    __shared__ u64 sink_s;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (threadIdx.x == 0) { stop = 0; sink_s = 0; }
    if (threadIdx.x < 64) srec[threadIdx.x] = (threadIdx.x + 16) & 63;   /* a cycle over 64 words */
    __syncthreads();
    if (warp > 0) {
        if (!load) return;
        uint4 acc = make_uint4(0, 0, 0, 0);
        const u64 stride = (u64)gridDim.x * (blockDim.x - 32);
        u64 i = (u64)blockIdx.x * (blockDim.x - 32) + (threadIdx.x - 32);
        for (int it = 0; !stop; ++it) {
#pragma unroll 4
            for (int k = 0; k < 16; ++k) {
                const uint4 v = ldcg4(buf + i % n16);
                acc.x ^= v.x; acc.y += v.y; acc.z ^= v.z; acc.w += v.w;
                i += stride;
            }
        }
        if ((acc.x ^ acc.y ^ acc.z ^ acc.w) == 0x9e3779b9u) atomicAdd(&sink_s, 1ull);
        return;
    }
    /* warp 0: let the stream ramp up, then time `ops` operations */
    if (load) { const u64 w0 = gtimer(); while (gtimer() - w0 < 20000) { } }
    __syncwarp();
    u64 sink = 0;
    const u64 t0 = gtimer(), c0 = clk();
    uint4 *my = ring + (u64)blockIdx.x * 8 * 1024;           /* 1024 records of 128 B per CTA */
    if (kind == 0) {
        if (lane == 0) for (int i = 0; i < ops; ++i) { sink += i; if (sink == 7) sink_s = 1; }
    } else if (kind == 1) {
        if (lane == 0) for (int i = 0; i < ops; ++i) { const u64 t = gtimer(); if (t == 7) sink_s = t; sink += t; }
    } else if (kind == 2) {
        if (lane == 0) for (int i = 0; i < ops; ++i) { const u64 t = clk(); if (t == 7) sink_s = t; sink += t; }
    } else if (kind == 3 || kind == 5) {
        if (lane == 0) for (int i = 0; i < ops; ++i) {
            uint4 *d = my + (u64)(i & 1023) * 8;
#pragma unroll
            for (int k = 0; k < 8; ++k) d[k] = make_uint4(i, k, blockIdx.x, (unsigned)sink);
            if (kind == 5) __threadfence();
        }
    } else if (kind == 4) {
        for (int i = 0; i < ops; ++i) {
            unsigned *d = (unsigned *)(my + (u64)(i & 1023) * 8);
            d[lane] = (unsigned)(i * 32 + lane) ^ blockIdx.x;
            __syncwarp();
        }
    } else if (kind == 6 || kind == 8) {
        if (lane == 0) {
            const int *tab = kind == 6 ? hot : chase;            /* hot: 16 lines per CTA, one cycle */
            int j = kind == 6 ? (int)blockIdx.x * 16 : (int)(blockIdx.x * 97) % chase_n;
            for (int i = 0; i < ops; ++i) j = __ldcg(tab + (u64)j * 16);   /* one 64-B line per hop */
            sink += j;
        }
    } else if (kind == 7) {
        if (lane == 0) {
            const int *p = (const int *)(void *)srec;           /* generic pointer to shared */
            int j = blockIdx.x & 63;
            for (int i = 0; i < ops; ++i) j = p[j];
            sink += j;
        }
    }
    __syncwarp();
    const u64 t1 = gtimer(), c1 = clk();
    if (lane == 0) {
        out[blockIdx.x * 4 + 0] = t1 - t0;
        out[blockIdx.x * 4 + 1] = c1 - c0;
        out[blockIdx.x * 4 + 2] = sink + sink_s;
        out[blockIdx.x * 4 + 3] = 0;
        stop = 1;
    }
}
"""


def chase_table(n: int, seed: int = 1):
    """n task-record lines (16 int32 each); word 0 of line j is the next line (one random
    cycle): every hop is a dependent load of a different 64-byte line."""
    import numpy as np
    rng = np.random.default_rng(seed)
    order = rng.permutation(n)
    t = np.zeros((n, 16), np.int32)
    t[order, 0] = np.roll(order, -1)
    return t


def hot_table(ctas: int):
    """16 lines per CTA, each CTA's a cycle through its own lines (word 0: next line)."""
    import numpy as np
    t = np.zeros((ctas * 16, 16), np.int32)
    for c in range(ctas):
        t[c * 16 + np.arange(16), 0] = c * 16 + (np.arange(16) * 5 + 3) % 16   # 5 is odd: one 16-cycle
    return t


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ops", type=int, default=2048)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--load", default="0,1", help="0 idle, 1 warps 1-15 stream HBM (both by default)")
    ap.add_argument("--out", default=".")
    a = ap.parse_args(argv)
    import cupy as cp
    import numpy as np
    props = cp.cuda.runtime.getDeviceProperties(0)
    sms = props["multiProcessorCount"]
    mod = cp.RawModule(code=SRC, options=("-std=c++17",))
    k = mod.get_function("rc_kernel")
    n16 = (2 << 30) // 16
    buf = cp.ones(n16 * 4, cp.uint32)
    ring = cp.zeros(sms * 8 * 1024 * 4, cp.uint32)
    chase_n = 1 << 16                                   # 4 MiB of lines: L2-resident (50 MiB L2)
    chase = cp.asarray(chase_table(chase_n))
    hot = cp.asarray(hot_table(sms))
    out = cp.zeros(sms * 4, cp.uint64)
    loads = [int(x) for x in a.load.split(",") if x != ""]
    res = {"card": props["name"].decode(), "sms": sms, "ops": a.ops,
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "kinds": {}}
    for ld in loads:
        for kind in range(len(KINDS)):
            k((sms,), (512,), (np.int32(kind), np.int32(64), np.int32(ld), buf, np.uint64(n16), ring, chase,
                               np.int32(chase_n), hot, out))       # warm-up (and the chase lines into L2)
        cp.cuda.Device().synchronize()
    t_start = time.perf_counter()
    for rep in range(a.reps):
        for ld in loads:
            for kind, name in enumerate(KINDS):
                k((sms,), (512,), (np.int32(kind), np.int32(a.ops), np.int32(ld), buf, np.uint64(n16), ring, chase,
                                   np.int32(chase_n), hot, out))
                o = out.get().reshape(sms, 4)
                ns = float(np.median(o[:, 0])) / a.ops
                cyc = float(np.median(o[:, 1])) / a.ops
                d = res["kinds"].setdefault(f"{name}/{'load' if ld else 'idle'}", {"ns": [], "cycles": []})
                d["ns"].append(ns)
                d["cycles"].append(cyc)
    res["wall_s"] = time.perf_counter() - t_start
    for v in res["kinds"].values():
        v["ns_med"] = statistics.median(v["ns"])
        v["cycles_med"] = statistics.median(v["cycles"])
    outdir = Path(a.out)
    outdir.mkdir(parents=True, exist_ok=True)
    (outdir / "record_cost.json").write_text(json.dumps(res, indent=1))
    print(f"{res['card']}  {res['date']}  {sms} SMs  ops={a.ops}  (median CTA, median of {a.reps})")
    print(f"{'kind':<12} " + " ".join(f"{('idle' if ld == 0 else 'load') + ' ns':>10} {'cyc':>7}" for ld in loads)
          + "   ns over empty")
    for name in KINDS:
        row = []
        over = []
        for ld in loads:
            v = res["kinds"][f"{name}/{'load' if ld else 'idle'}"]
            e = res["kinds"][f"empty/{'load' if ld else 'idle'}"]
            row.append(f"{v['ns_med']:>10.1f} {v['cycles_med']:>7.0f}")
            over.append(f"{v['ns_med'] - e['ns_med']:+.1f}")
        print(f"{name:<12} " + " ".join(row) + "   " + " / ".join(over))
    return 0


if __name__ == "__main__":
    sys.exit(main())
