"""Which SMs share a GPC?  (session 29: the hot summary slows a fixed set of SMs -- 16-19,
32-35, 48-51, ... with the observers on 0-3 -- does that set follow the GPC layout?)

    python tools/gpc_probe.py [--launches 20] [--out DIR]

A thread-block cluster runs inside one GPC (CUDA programming guide, "Thread Block
Clusters"), so two SMs whose blocks ever share a cluster share a GPC.  The probe launches
many short clusters of 8 blocks (the portable maximum) through cuda.core's cluster launch,
records each block's %smid, and joins the SMs of each cluster (union-find); the groups it
prints are GPCs, or parts of one if some pair of SMs never met (more --launches).  Prints one
line per group (its SM ids; TPCs are SM pairs 2k, 2k+1) and writes DIR/gpc_probe.json.

    python tools/gpc_probe.py --from DIR/gpc_probe.json --spread 4

prints (no GPU) 4 SM ids, one from each of the 4 largest groups (each group's last SM), as a
comma list for bench/level_profile.py --observer-smids: observers spread over 4 GPCs."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

SRC = r"""
extern "C" __global__ void gpc_probe(unsigned int *smid_of_block, unsigned long long spin_ns) {
    unsigned int s;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(s));
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (t - t0 < spin_ns);  /* (co-resident: spread) */
    if (threadIdx.x == 0) smid_of_block[blockIdx.x] = s;
}
"""
CLUSTER = 8


def groups_of(smids, cluster: int = CLUSTER) -> list:
    """Union-find over SMs met in one cluster: smids[b] = the SM of block b, blocks
    b // cluster form a cluster.  Returns the groups, each a sorted SM id list, sorted."""
    parent = {}

    def find(x):
        parent.setdefault(x, x)
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x
    if len(smids) % cluster:
        raise ValueError(f"groups_of: {len(smids)} blocks is not a whole number of clusters of {cluster}")
    for c in range(0, len(smids), cluster):
        members = [int(s) for s in smids[c:c + cluster]]
        for s in members:
            parent[find(s)] = find(members[0])
    out = {}
    for s in parent:
        out.setdefault(find(s), []).append(s)
    return sorted(sorted(g) for g in out.values())


def spread(groups, n: int) -> list:
    """n SM ids, the last of each of the n largest groups (ties: the lower ids first)."""
    if n > len(groups):
        raise ValueError(f"spread: {n} SMs from {len(groups)} groups")
    big = sorted(groups, key=lambda g: (-len(g), g[0]))[:n]
    return sorted(g[-1] for g in big)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--launches", type=int, default=20, help="cluster launches whose meetings are joined")
    ap.add_argument("--clusters", type=int, default=264, help="clusters of 8 blocks per launch")
    ap.add_argument("--out", default=".")
    ap.add_argument("--from", dest="from_file", metavar="JSON", help="read the groups of an earlier run (no GPU)")
    ap.add_argument("--spread", type=int, metavar="N", help="with --from: print N SMs, one per largest group")
    a = ap.parse_args(argv)
    if a.from_file or a.spread:
        if not (a.from_file and a.spread):
            ap.error("--from and --spread go together")
        groups = json.loads(Path(a.from_file).read_text())["groups"]
        try:
            print(",".join(str(s) for s in spread(groups, a.spread)))
        except ValueError as e:
            ap.error(f"--spread: {e}")
        return 0
    import numpy as np
    import cupy as cp
    from cuda.core import Device, LaunchConfig, Program, ProgramOptions, launch
    dev = Device()
    dev.set_current()
    arch = "sm_" + "".join(str(x) for x in dev.compute_capability)
    kern = Program(SRC, "c++", ProgramOptions(arch=arch)).compile("cubin").get_kernel("gpc_probe")
    stream = dev.create_stream()
    out = cp.full(a.clusters * CLUSTER, 0xFFFFFFFF, cp.uint32)
    blocks = []
    for k in range(a.launches):
        out.fill(0xFFFFFFFF)
        cp.cuda.Device().synchronize()
        cfg = LaunchConfig(grid=a.clusters, cluster=CLUSTER, block=1024)   # (2 blocks per SM at most: a cluster spans SMs)
        launch(stream, cfg, kern, np.uint64(out.data.ptr), np.uint64(2000 + 500 * (k % 7)))
        stream.sync()
        got = out.get()
        if (got == 0xFFFFFFFF).any():
            raise SystemExit(f"gpc_probe: launch {k}: {(got == 0xFFFFFFFF).sum()} blocks wrote no SM id")
        blocks.extend(int(x) for x in got)
    groups = groups_of(blocks)
    n_sm = dev.properties.multiprocessor_count
    seen = sorted({s for g in groups for s in g})
    print(f"{len(groups)} groups over {len(seen)} of {n_sm} SMs ({a.launches} launches of {a.clusters} clusters of {CLUSTER})")
    for i, g in enumerate(groups):
        print(f"  group {i}: {len(g):>3} SMs: {g}")
    Path(a.out).mkdir(parents=True, exist_ok=True)
    (Path(a.out) / "gpc_probe.json").write_text(json.dumps({"groups": groups, "sms": n_sm, "launches": a.launches}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
