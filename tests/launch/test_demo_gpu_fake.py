"""The demo's GPU path end to end on a machine without a GPU: `dtrace-mk demo` with
stand-ins for CuPy (2 "GPUs"), the megakernel (one collective step per run(1), records
from a 2-rank sim with the same fault tables), tensor parallelism, the clock pairing and
the device VM (tests/launch/fake_gpu/sitecustomize.py) in every process under mpiexec.
It checks exactly what tests/gpu/test_launch_gpu.py checks on 2 H200s: backend auto picks
gpu, the live query runs in the (stand-in) device runtime and counts every task:end once,
the remote stall is rooted at rank 1, spans of both ranks with cross-rank links; the
first launch's warm-up steps (GPU_LAUNCH_WARMUP_STEPS) are never observed and the served
steps keep the device's numbers."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dtrace_mk.commands.diagnose import GPU_LAUNCH_WARMUP_STEPS as W
from gpu_demo_checks import check_aligned_interval_cuts, check_gpu_demo

pytestmark = pytest.mark.mpi

HERE = Path(__file__).resolve().parent
STEPS = 12
BATCH = 4


def _fake_env(**extra):
    """This process's environment with 2 stand-in GPUs (fake_gpu/sitecustomize.py on the
    path of every process the test starts)."""
    path = [str(HERE / "fake_gpu")] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return dict(os.environ, DTRACE_MK_FAKE_GPUS="2", PYTHONPATH=os.pathsep.join(path), **extra)


@pytest.mark.parametrize("summaries", [("--summaries", "host"), ()], ids=["host", "device-default"])
def test_demo_picks_gpu_ranks_and_shows_live_counts_diagnosis_and_spans(runtime_dir, tmp_path, summaries):
    """(The default, device summaries: the agents' task half in the stand-in device VM,
    only comm:* records streamed; --summaries host: every record to the host agents; the
    same diagnosis and spans either way.)"""
    from dtrace_mk.commands.diagnose import find_mpiexec
    find_mpiexec()
    spans = tmp_path / "spans.jsonl"
    env = _fake_env(DTRACE_MK_FAKE_STEPS=str(W + STEPS + 4))
    p = subprocess.run([sys.executable, "-m", "dtrace_mk", "demo", "--steps", str(STEPS), "--batch", str(BATCH),
                        "-f", "json", "--spans", str(spans), "--timeout", "100", *summaries],
                       capture_output=True, text=True, env=env, timeout=150)
    assert p.returncode == 0, f"demo failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    check_gpu_demo(p.stdout, spans, workers=8 - 1, steps=STEPS, batch=BATCH)   # 8 fake SMs, one for the clock


def test_gpu_ranks_stop_at_the_same_step_when_one_asks_mid_run(runtime_dir, tmp_path):
    """Two serving ranks (no collector) with stand-ins: rank 0 learns of finished steps in
    bigger groups than rank 1 (uneven polls), rank 1 gets SIGINT at (device) step 9.  Both
    end the resident launch at the same step (the stand-in's finish() compares the ranks'
    steps and fails otherwise) and the job ends cleanly before its 60 steps, which are
    numbered from W (after the warm-up)."""
    import re
    from dtrace_mk.commands.diagnose import find_mpiexec, mpi_flavour
    mpiexec = find_mpiexec()
    env = _fake_env(DTRACE_MK_FAKE_STEPS="64", DTRACE_MK_FAKE_UNEVEN="1", DTRACE_MK_FAKE_SIGINT_AT="9")
    env.pop("DTRACE_MK_JOB_DIR", None)
    cmd = [mpiexec]
    if mpi_flavour(mpiexec) == "openmpi":
        cmd += ["--oversubscribe", "--mca", "btl_vader_single_copy_mechanism", "none"]
        if os.geteuid() == 0:
            cmd.append("--allow-run-as-root")
    cmd += ["-n", "2", sys.executable, "-m", "dtrace_mk.launch.serve", "--backend", "gpu", "--steps", "60",
            "--batch", str(BATCH)]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=150)
    assert p.returncode == 0, f"serve failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    m = re.search(r"served (\d+) steps \((\d+)\.\.(\d+)\) .*\(1 resident launch\)", p.stderr)
    assert m, p.stderr[-3000:]
    n, a, b = (int(x) for x in m.groups())
    assert 9 - W < n < 60 and a == W and b == W + n - 1 and b > 9, m.group(0)


def test_interval_cuts_of_a_device_query_cover_the_same_steps_on_every_rank(runtime_dir):
    """(gpu_demo_checks.check_aligned_interval_cuts; tests/gpu/test_launch_attach_gpu.py
    runs it on 2 H200s.)"""
    env = _fake_env(DTRACE_MK_FAKE_STEPS=str(W + 60 + 4))
    check_aligned_interval_cuts(env, steps=60, interval_ms=20, workers=8 - 1, batch=BATCH)
