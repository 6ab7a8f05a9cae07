"""How much code an SM's instruction cache (ICC) and a GPC's L1.5 (GCC) hold, and how much
code one SM may run before it slows the other SMs of its GPC (GPU).

    python tools/icache_probe.py [--out DIR] [--quick]

Session 30 (Nsight Compute, tools/obs_sm_gpu_plan.sh 63-64) named the path by which the hot
summary's observer SMs slow the SMs of their GPC: instruction fetch.  An SM fetches from its
own ICC, an ICC miss goes to the GPC's L1.5 (GCC: constants and instructions, shared by the
GPC's SMs), a GCC miss to L2.  With the summary on, the observers' GPC's GCC missed 3.7x as
often as in the same build with the summary off.  This probe measures the two capacities
that budget the observers' code, with straight-line integer code (2 SASS instructions per
statement, 4 independent chains, so fetch, not latency, bounds it), 4 warps per SM, one CTA
per SM (large dynamic shared memory), each CTA's role chosen by its %smid:

  icc   one SM runs N KB of code in a loop: cycles per warp instruction against N (the knee
        where N outgrows the ICC, and where it outgrows the GCC)
  gcc   k SMs of one GPC each run their own N KB (k * N KB in the GCC), against k
  mates the shape of the megakernel: the other SMs of a GPC run the same W KB (the workers),
        one SM runs its own M KB (an observer): the mates' cycles per instruction against M

The GPC map comes from tools/gpc_probe.py (thread-block clusters).  Writes
DIR/icache_probe.json; the tables are printed last."""
from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

SASS_PER_STMT = 2            # (sm_90a: a LOP3 and an IADD per statement, checked with nvdisasm)
BYTES_PER_STMT = 16 * SASS_PER_STMT
THREADS = 128                # 4 warps: one per SM sub-partition, as every warp of a worker runs one code
SMEM = 160 * 1024            # dynamic shared memory per CTA: one CTA per SM


def segment(kb: float, seed: int) -> str:
    """Straight-line code of about kb KB of SASS, its constants drawn from seed (two segments of
    different seeds share no instruction word, so they share no cache line either)."""
    r = random.Random(seed)
    out = []
    for i in range(max(1, int(kb * 1024) // BYTES_PER_STMT)):
        j = i % 4
        c = r.getrandbits(32)
        out.append(f"x{j}=(x{j}^0x{c:08x}u)+x{(j + 1) % 4};" if i % 2 else f"x{j}=(x{j}+0x{c:08x}u)^x{(j + 2) % 4};")
    return "\n".join(out)


def kernel_source(sizes_kb) -> str:
    """One kernel: role s (role_of_sm[%smid]) runs segment s of sizes_kb[s] KB `reps[s]` times,
    timed with clock64; role -1 returns at once."""
    cases = "\n".join(f"case {s}: for (unsigned r = 0; r < n; ++r) {{\n{segment(kb, 1000 + s)}\n}} break;"
                      for s, kb in enumerate(sizes_kb))
    return r"""
extern "C" __global__ void icp(const int *role_of_sm, const unsigned *reps, unsigned long long *cycles) {
    unsigned sm;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    const int role = role_of_sm[sm];
    if (role < 0) return;
    const unsigned n = reps[role];
    unsigned x0 = threadIdx.x, x1 = x0 * 3u, x2 = x0 ^ 5u, x3 = x0 + 7u;
    __syncthreads();
    const long long t0 = clock64();
    switch (role) {
""" + cases + r"""
    }
    __syncthreads();
    const long long t1 = clock64();
    if (threadIdx.x == 0) cycles[2 * sm] = (unsigned long long)(t1 - t0);
    if ((x0 ^ x1 ^ x2 ^ x3) == 0x9e3779b9u) cycles[2 * sm + 1] = 1;   /* (keeps the chains live) */
}
"""


def reps_for(kb: float, instr_per_warp: float = 4e6) -> int:
    """Loop trips that execute about instr_per_warp instructions per warp (a few ms)."""
    return max(4, int(instr_per_warp / (kb * 1024 / 16)))


def knee(points, factor: float = 1.5):
    """The first x whose y exceeds factor x the y of the smallest x (points: [(x, y)] sorted by
    x); None if none does."""
    if not points:
        return None
    base = points[0][1]
    for x, y in points:
        if y > factor * base:
            return x
    return None


class Probe:
    """Compiles kernels (cached by their segment sizes) and runs one role table at a time."""

    def __init__(self, n_sm: int):
        import cupy as cp
        self.cp, self.n_sm, self.kernels = cp, n_sm, {}

    def kernel(self, sizes_kb):
        key = tuple(sizes_kb)
        if key not in self.kernels:
            k = self.cp.RawKernel(kernel_source(key), "icp", options=("-std=c++17",))
            k.max_dynamic_shared_size_bytes = SMEM
            self.kernels[key] = k
        return self.kernels[key]

    def run(self, sizes_kb, roles: dict, trips=None) -> dict:
        """roles: {sm: segment}; returns {sm: cycles per warp instruction} (the best of 3 runs,
        after a warm-up run that fills the caches).  trips: per segment, a multiple of its
        reps_for (an observer runs longer than its mates, so it disturbs all their run)."""
        cp = self.cp
        role_of_sm = cp.full(self.n_sm, -1, cp.int32)
        for sm, s in roles.items():
            role_of_sm[sm] = s
        reps = cp.asarray([reps_for(kb) * (trips[i] if trips else 1) for i, kb in enumerate(sizes_kb)], cp.uint32)
        cyc = cp.zeros(2 * self.n_sm, cp.uint64)
        k = self.kernel(sizes_kb)
        best = {}
        for it in range(4):
            cyc.fill(0)
            k((self.n_sm,), (THREADS,), (role_of_sm, reps, cyc), shared_mem=SMEM)
            got = cyc.get()
            if it == 0:
                continue
            for sm, s in roles.items():
                if got[2 * sm] == 0:
                    raise SystemExit(f"icache_probe: SM {sm} ran no CTA (one CTA per SM expected)")
                per = float(got[2 * sm]) / (int(reps[s]) * sizes_kb[s] * 1024 / 16)
                best[sm] = min(best.get(sm, per), per)
        return best


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=".")
    ap.add_argument("--quick", action="store_true", help="fewer sizes (a smoke run)")
    ap.add_argument("--gpc", type=int, default=2, help="the GPC (tools/gpc_probe.py group) the gcc and mates runs use")
    a = ap.parse_args(argv)
    import cupy as cp
    import gpc_probe
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    gpc_probe.main(["--out", str(out)])
    groups = json.loads((out / "gpc_probe.json").read_text())["groups"]
    n_sm = cp.cuda.Device().attributes["MultiProcessorCount"]
    gpc = sorted(groups[a.gpc])
    if len(gpc) < 8:
        raise SystemExit(f"icache_probe: GPC group {a.gpc} has {len(gpc)} SMs; pick another --gpc")
    p = Probe(n_sm)
    t0 = time.time()
    res = {"gpc_sms": gpc, "icc": [], "gcc": {}, "mates": {}}
    # icc: one SM, N KB
    sizes = [4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256] if not a.quick else [8, 32, 128]
    for kb in sizes:
        res["icc"].append((kb, p.run([kb], {gpc[0]: 0})[gpc[0]]))
        print(f"icc {kb:>4} KB: {res['icc'][-1][1]:.3f} cycles / warp instruction  ({time.time() - t0:.0f} s)", flush=True)
    # gcc: k SMs of the GPC, each its own N KB
    ks = [k for k in (1, 2, 4, 8, 12, 16) if k <= len(gpc)]
    for kb in ((24, 48) if not a.quick else (48,)):
        segs = [kb] * max(ks)
        res["gcc"][kb] = []
        for k in ks:
            got = p.run(segs, {gpc[i]: i for i in range(k)})
            res["gcc"][kb].append((k, sum(got.values()) / k))
            print(f"gcc {k:>2} SMs x {kb} KB own code: {res['gcc'][kb][-1][1]:.3f}  ({time.time() - t0:.0f} s)", flush=True)
    # mates: the GPC's other SMs run one W KB (workers), its first SM its own M KB (an observer)
    for w in ((32, 96) if not a.quick else (64,)):
        res["mates"][w] = []
        for m in ((0, 8, 16, 32, 64) if not a.quick else (0, 32)):
            roles = {s: 0 for s in gpc[1:]}
            if m:
                roles[gpc[0]] = 1
            got = p.run([w, m or 4], roles, trips=[1, 3])
            mates = [got[s] for s in gpc[1:]]
            res["mates"][w].append((m, sum(mates) / len(mates), got.get(gpc[0])))
            print(f"mates {w} KB, observer {m:>2} KB: {res['mates'][w][-1][1]:.3f}  ({time.time() - t0:.0f} s)", flush=True)
    (out / "icache_probe.json").write_text(json.dumps(res, indent=1))
    print(f"\nicc: one SM of GPC {a.gpc}, cycles per warp instruction against its code size "
          f"(knee x1.5: {knee(res['icc'])} KB)")
    print("  " + "  ".join(f"{kb}K {c:.2f}" for kb, c in res["icc"]))
    for kb, rows in res["gcc"].items():
        print(f"gcc: k SMs of GPC {a.gpc} ({len(gpc)} SMs), each its own {kb} KB: " +
              "  ".join(f"k={k} {c:.2f}" for k, c in rows))
    for w, rows in res["mates"].items():
        print(f"mates: {len(gpc) - 1} SMs run one {w} KB; one SM its own M KB -> the mates' cycles per instruction: " +
              "  ".join(f"M={m} {c:.2f}" for m, c, _ in rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
