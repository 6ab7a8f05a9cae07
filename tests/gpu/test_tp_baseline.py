"""The NCCL tensor-parallel per-operator baseline on 2 GPUs (mpirun -n 2): every rank's
tokens equal the single-GPU NumPy reference's, the logits agree within fp32 rounding,
and the all-reduce really crosses the GPUs (each rank on its own device; a run with the
NCCL sum replaced by nothing gives different tokens).

Run as a test (pytest starts mpirun on this file) or by hand:
    mpirun --allow-run-as-root -n 2 python tests/gpu/test_tp_baseline.py OUT.json
"""
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

STEPS, BATCH = 9, 4


def child(out_path: str) -> None:
    import cupy as cp
    import numpy as np
    from mpi4py import MPI
    from dtrace_mk.megakernel.baseline import TPBaseline
    from dtrace_mk.megakernel.presets import PRESETS
    from dtrace_mk.megakernel.reference import ReferenceModel, make_weights
    comm = MPI.COMM_WORLD
    rank, ranks = comm.Get_rank(), comm.Get_size()
    cp.cuda.Device(rank % cp.cuda.runtime.getDeviceCount()).use()
    cfg = PRESETS["tiny"]
    w = make_weights(cfg, 0)
    bl = TPBaseline(cfg, BATCH, rank, ranks, weights=w, comm=comm)
    got = bl.run(STEPS)
    alone = TPBaseline(cfg, BATCH, rank, ranks, weights=w, allreduce=lambda a: None).run(STEPS)
    ref = ReferenceModel(cfg, BATCH, w).run(STEPS)
    rel = float(np.linalg.norm(got["logits"] - ref["logits"][-1]) / np.linalg.norm(ref["logits"][-1]))
    rows = comm.gather({"rank": rank, "device": cp.cuda.Device().id,
                        "tokens_equal": bool(np.array_equal(got["tokens"], ref["tokens"])),
                        "alone_equal": bool(np.array_equal(alone["tokens"], ref["tokens"])),
                        "logits_rel_err": rel, "ms_per_step": got["elapsed_ms"] / STEPS}, root=0)
    if rank == 0:
        Path(out_path).write_text(json.dumps(rows))


def test_nccl_tp_baseline_tokens_equal_reference(tmp_path):
    from dtrace_mk.commands import diagnose as D
    n, why = D.gpu_count()
    if n < 2:
        pytest.skip(f"needs 2 GPUs, {why or f'CuPy sees {n}'}")
    try:
        mpiexec = D.find_mpiexec()
    except Exception as e:
        pytest.skip(str(e))
    # the flags diagnose uses for this mpiexec (Open MPI: --oversubscribe, as root
    # --allow-run-as-root, ...), without its MPMD collector part
    flags = D.mpiexec_command(mpiexec, 2, [])[1:]
    flags = flags[:flags.index("-n")]
    out = tmp_path / "tp.json"
    subprocess.run([mpiexec, *flags, "-n", "2", sys.executable, __file__, str(out)], check=True,
                   timeout=300, stdin=subprocess.DEVNULL)
    rows = json.loads(out.read_text())
    assert [r["rank"] for r in rows] == [0, 1]
    assert {r["device"] for r in rows} == {0, 1}, rows
    for r in rows:
        assert r["tokens_equal"], rows
        assert r["logits_rel_err"] < 1e-4, rows
        assert not r["alone_equal"], rows


if __name__ == "__main__":
    child(sys.argv[1])
