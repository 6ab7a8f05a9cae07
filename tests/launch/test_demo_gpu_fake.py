"""The demo's GPU path end to end on a machine without a GPU: `dtrace-mk demo` with
stand-ins for CuPy (2 "GPUs"), the megakernel (one collective step per run(1), records
from a 2-rank sim with the same fault tables), tensor parallelism, the clock pairing and
the device VM (tests/launch/fake_gpu/sitecustomize.py) in every process under mpiexec.
It checks exactly what tests/gpu/test_launch_gpu.py checks on 2 H200s: backend auto picks
gpu, the live query runs in the (stand-in) device runtime and counts every task:end once,
the remote stall is rooted at rank 1, spans of both ranks with cross-rank links."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpu_demo_checks import check_gpu_demo

pytestmark = pytest.mark.mpi

HERE = Path(__file__).resolve().parent
STEPS = 12
BATCH = 4


def test_demo_picks_gpu_ranks_and_shows_live_counts_diagnosis_and_spans(runtime_dir, tmp_path):
    from dtrace_mk.commands.diagnose import find_mpiexec
    find_mpiexec()
    spans = tmp_path / "spans.jsonl"
    env = dict(os.environ, DTRACE_MK_FAKE_GPUS="2", DTRACE_MK_FAKE_STEPS=str(STEPS + 4),
               PYTHONPATH=os.pathsep.join([str(HERE / "fake_gpu")] + [p for p in os.environ.get(
                   "PYTHONPATH", "").split(os.pathsep) if p]))
    p = subprocess.run([sys.executable, "-m", "dtrace_mk", "demo", "--steps", str(STEPS), "--batch", str(BATCH),
                        "-f", "json", "--spans", str(spans), "--timeout", "100"],
                       capture_output=True, text=True, env=env, timeout=150)
    assert p.returncode == 0, f"demo failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    check_gpu_demo(p.stdout, spans, sms=8, steps=STEPS, batch=BATCH)
