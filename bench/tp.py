"""Tensor parallelism on 2 GPUs: TP megakernel vs NCCL per-operator TP vs one GPU.

    mpirun --allow-run-as-root -n 2 python bench/tp.py [--presets tiny,1b] [--batch 4]
                                                    [--steps 32] [--reps 5] [--out DIR]

In one run, for each preset at the given batch, the decode-step time (median of --reps
runs of --steps steps, from the same state, after a warm-up run) of

* mk_tp    the persistent megakernel split over the ranks (dtrace_mk.megakernel.tp
           TPGroup, its in-kernel all-reduces), one launch per run;
* nccl_tp  the kernel-per-operator baseline split the same way (baseline.TPBaseline:
           CuPy ops, cuBLAS matmuls, two NCCL all-reduces per layer), eager launches;
* mk_1gpu  the single-GPU megakernel on rank 0 (the other ranks wait);

and their ratios (nccl_tp / mk_tp: how much faster the TP megakernel is than NCCL TP;
mk_1gpu / mk_tp: the TP speed-up).  Tokens of the three are compared first (same
weights: make_weights(cfg, 0) on every rank, drawn on the GPU for 1b).  Rank 0 prints the table
last and writes DIR/tp.json.  Without dtrace_mk.megakernel.tp, mk_tp is reported as
missing and the rest still runs.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

REQUIRES = "gpu:2"   # what `dtrace-mk bench tp` checks before it runs: cpu, gpu, or gpu:N (N ranks, N GPUs)

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--presets", default="tiny,1b")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)

    import cupy as cp
    from mpi4py import MPI
    from dtrace_mk.megakernel import gpu
    from dtrace_mk.megakernel.baseline import NcclAllReduce, TPBaseline
    from dtrace_mk.megakernel.presets import PRESETS
    from dtrace_mk.megakernel.reference import make_weights

    comm = MPI.COMM_WORLD
    rank, ranks = comm.Get_rank(), comm.Get_size()

    def log(s):
        if rank == 0:
            print(f"bench/tp: {s}", file=sys.stderr, flush=True)

    try:
        from dtrace_mk.megakernel.tp import TPGroup
        group = TPGroup(comm)
        tp_error = None
    except Exception as e:          # ImportError while the TP launcher is not there
        group, tp_error = None, f"{type(e).__name__}: {e}"
        cp.cuda.Device(rank % cp.cuda.runtime.getDeviceCount()).use()
        log(f"TP megakernel unavailable ({tp_error}); timing the baseline and one GPU only")
    allreduce = NcclAllReduce(comm) if ranks > 1 else None
    log(f"{ranks} ranks, GPU {cp.cuda.Device().id} on rank 0")

    def median_ms(fn, reset):
        reset()
        comm.Barrier()
        fn()                                            # warm-up
        ts = []
        for _ in range(a.reps):
            reset()
            comm.Barrier()
            ts.append(fn())
        return statistics.median(ts)

    rows = []
    for name in a.presets.split(","):
        cfg = PRESETS[name]
        t0 = time.time()
        # the same full weights on every rank (1b: drawn on the GPU, as bench/megakernel.py)
        w = make_weights(cfg, 0, xp=cp if name == "1b" else np)
        row = {"preset": name, "batch": a.batch, "steps": a.steps, "reps": a.reps, "ranks": ranks}
        toks = {}
        # -- TP megakernel (every rank)
        if group is not None:
            mk = gpu.Megakernel(cfg, a.batch, weights=w, tp=group)   # shards w itself
            mk.reset(); comm.Barrier()
            toks["mk_tp"] = mk.run(a.steps).tokens
            row["mk_tp_ms"] = median_ms(lambda: mk.run(a.steps, poison=False).elapsed_ms / a.steps,
                                        mk.reset)
            del mk
            group.close()                       # unmap the peers' buffers (collective)
        # -- NCCL per-operator TP baseline (every rank)
        bl = TPBaseline(cfg, a.batch, rank, ranks, weights=w, allreduce=allreduce)
        bl.reset(); comm.Barrier()
        toks["nccl_tp"] = bl.run(a.steps)["tokens"]
        row["nccl_tp_ms"] = median_ms(lambda: bl.run(a.steps)["elapsed_ms"] / a.steps, bl.reset)
        bl = None                               # free its buffers before the next model
        cp.get_default_memory_pool().free_all_blocks()
        # -- single-GPU megakernel (rank 0)
        if rank == 0:
            mk1 = gpu.Megakernel(cfg, a.batch, weights=w)
            mk1.reset()
            toks["mk_1gpu"] = mk1.run(a.steps).tokens
            mk1.run(a.steps, poison=False)
            ts = []
            for _ in range(a.reps):
                mk1.reset()
                ts.append(mk1.run(a.steps, poison=False).elapsed_ms / a.steps)
            row["mk_1gpu_ms"] = statistics.median(ts)
            del mk1
        comm.Barrier()
        # -- tokens: every variant on every rank agrees with rank 0's single GPU run
        all_toks = comm.gather({k: np.asarray(v).astype(np.int64).tolist() for k, v in toks.items()},
                               root=0)
        if rank == 0:
            ref = all_toks[0]["mk_1gpu"]
            row["tokens_equal"] = {f"{k}@r{r}": t[k] == ref for r, t in enumerate(all_toks)
                                   for k in t if k != "mk_1gpu"}
            mt, nt, one = row.get("mk_tp_ms"), row["nccl_tp_ms"], row["mk_1gpu_ms"]
            row["nccl_tp_over_mk_tp"] = round(nt / mt, 3) if mt else None
            row["mk_1gpu_over_mk_tp"] = round(one / mt, 3) if mt else None
            row["nccl_tp_over_mk_1gpu"] = round(nt / one, 3)
            row["setup_s"] = round(time.time() - t0, 1)
            log(f"{name}: {json.dumps(row)}")
        rows.append(row)
        cp.get_default_memory_pool().free_all_blocks()

    if rank == 0:
        if tp_error:
            for r in rows:
                r["mk_tp_error"] = tp_error
        if a.out:
            Path(a.out).mkdir(parents=True, exist_ok=True)
            (Path(a.out) / "tp.json").write_text(json.dumps(rows, indent=1))
        fmt = lambda v: "   n/a" if v is None else f"{v:6.3f}"  # noqa: E731
        print(f"\nTP on {ranks} GPUs, batch {a.batch}, {a.steps} steps/run, median of {a.reps} "
              f"(ms per decode step; ratios > 1: the TP megakernel is faster)")
        print(f"{'preset':<8} {'mk_tp':>8} {'nccl_tp':>8} {'mk_1gpu':>8}   {'nccl/mk_tp':>10} "
              f"{'1gpu/mk_tp':>10}   tokens_equal")
        for r in rows:
            ok = all(r["tokens_equal"].values())
            print(f"{r['preset']:<8} {fmt(r.get('mk_tp_ms')):>8} {fmt(r['nccl_tp_ms']):>8} "
                  f"{fmt(r['mk_1gpu_ms']):>8}   {fmt(r['nccl_tp_over_mk_tp']):>10} "
                  f"{fmt(r['mk_1gpu_over_mk_tp']):>10}   {ok}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
