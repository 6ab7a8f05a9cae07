"""The demo on GPU ranks (2 x H200): `dtrace-mk demo --backend gpu` = `dtrace-mk launch`
of 2 tensor-parallel megakernels (resident across the serving steps) + the collector under mpiexec, a
query attached live through the control socket that runs in the device VM, the injected
late_comm fault on rank 1, spans to a file.

Asserts: the live query's final output on both ranks counts task:end per step, every
step the same count = the tasks of one step of the rank's graph, and its coverage says
exactly that many events (count x steps observed); the diagnosis's confident findings
are only remote_stall rooted at rank 1, within the fault's steps; the spans file has spans of both ranks and links from each rank's
remote waits to the other rank's signal spans."""
import json
import os
import subprocess
import sys

from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "launch"))
from gpu_demo_checks import check_gpu_demo  # noqa: E402  (shared with the CPU stand-in test)

STEPS = 16
BATCH = 4


def _gpus() -> int:
    try:
        import cupy
        return int(cupy.cuda.runtime.getDeviceCount())
    except Exception:
        return 0


def test_demo_on_two_gpus_live_query_in_the_device_vm_diagnosis_and_spans(runtime_dir, tmp_path):
    """With host summaries (every record to the ranks' Python agents); the default, device
    summaries, runs in tests/gpu/test_device_summaries_gpu.py."""
    n = _gpus()
    if n < 2:
        pytest.skip(f"needs 2 GPUs (CuPy sees {n})")
    spans = tmp_path / "spans.jsonl"
    env = dict(os.environ, DTRACE_MK_RUNTIME_DIR=runtime_dir, NCCL_NVLS_ENABLE="0")
    p = subprocess.run([sys.executable, "-m", "dtrace_mk", "demo", "--backend", "gpu", "--steps", str(STEPS),
                        "--batch", str(BATCH), "-f", "json", "--spans", str(spans), "--timeout", "420",
                        "--summaries", "host"],
                       capture_output=True, text=True, env=env, timeout=540)
    assert p.returncode == 0, f"demo failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    import cupy
    sms = cupy.cuda.Device(0).attributes["MultiProcessorCount"]
    diag = check_gpu_demo(p.stdout, spans, workers=sms - 1, steps=STEPS, batch=BATCH)   # serve: SMs - 1
    print(json.dumps({k: diag[k] for k in ("backend", "findings", "links", "cross_rank_links",
                                           "spans", "wall_s") if k in diag}))
