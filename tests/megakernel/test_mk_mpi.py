"""The multi-rank sim under real MPI processes (`mpiexec -n 2` / `-n 4`): the same hook
streams as the in-process loopback transport, and a failing rank stops every rank."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dtrace_mk.cli import main

pytestmark = pytest.mark.mpi

HERE = Path(__file__).resolve().parent


def mpiexec():
    cand = Path(sys.executable).parent / "mpiexec"
    exe = str(cand) if cand.exists() else shutil.which("mpiexec")
    if exe is None:
        pytest.skip("no mpiexec on this machine")
    pytest.importorskip("mpi4py")
    return exe


def launch(n, args, timeout=90):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "OMPI_", "PMIX_"))}
    return subprocess.run([mpiexec(), "-n", str(n), sys.executable, *args], capture_output=True,
                          text=True, timeout=timeout, env=env, cwd=str(HERE))


FAULTS = ("- {kind: late_comm, comm_op: allreduce_mlp, layer: 0, delay_us: 30, rank: 1, steps: [2]}\n"
          "- {kind: slow_task_class, task_class: attn_o, extra_us: 15, rank: 0, steps: [4]}\n")


@pytest.mark.parametrize("n", [2, 4])
def test_mpiexec_run_matches_loopback(n, tmp_path, capsys):
    f = tmp_path / "faults.yaml"
    f.write_text(FAULTS)
    common = ["run", "--backend", "sim", "--model", "tiny", "--steps", "6", "--batch", "3", "--workers", "8",
              "--seed", "5", "--faults", str(f)]
    p = launch(n, ["-m", "dtrace_mk", *common, "--events-out", str(tmp_path / "mpi.{rank}.jsonl")])
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert sum(1 for x in lines if x.startswith("rank ")) == n, "per-rank lines, printed once (rank 0)"
    assert f"{n} tensor-parallel ranks ({n} MPI processes)" in p.stdout
    assert main([*common, "--ranks", str(n), "--events-out", str(tmp_path / "lb.{rank}.jsonl")]) == 0
    out = capsys.readouterr().out
    assert f"({n} ranks in one process)" in out
    for r in range(n):
        a = (tmp_path / f"mpi.{r}.jsonl").read_text()
        b = (tmp_path / f"lb.{r}.jsonl").read_text()
        assert a.count('"comm:wait"') > 0 and a == b, f"rank {r}: MPI and loopback hook streams differ"
    # the per-rank summary lines agree too
    assert [x for x in lines if x.startswith("rank ")] == [x for x in out.splitlines() if x.startswith("rank ")]


def test_a_failing_rank_stops_every_rank():
    p = launch(2, [str(HERE / "mpi_child.py"), "fail"], timeout=60)
    assert p.returncode != 0
    assert "rank 1: ValueError: sink of rank 1 broke" in p.stderr
    assert "rank 0: RuntimeError: sim rank(s) [1] failed; rank 0 stopped with them" in p.stderr
