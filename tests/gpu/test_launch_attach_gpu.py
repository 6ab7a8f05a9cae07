"""The second-terminal workflow on 2 GPU ranks (2 x H200): `dtrace-mk launch -n 2 --backend
gpu -- python -m dtrace_mk.launch.serve --duration 120` (one resident megakernel per GPU),
then from other processes: list, a rejected query and a rejected object (the job keeps
serving), attach streaming (the query runs in the device VM of both running kernels),
detach, Ctrl-C on an attached client, live Prometheus metrics, Ctrl-C on the job (it stops
at a step boundary, the collector names remote_stall rooted at rank 1 and exports spans).
The same code as the sim test (tests/launch/test_launch_e2e.py); the job serves hundreds
of steps, more than a device coverage table holds (its epochs are retired while it runs)."""
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "launch"))
from test_launch_e2e import launch_attach_list_detach_stop  # noqa: E402


def test_launch_attach_list_detach_stop_on_two_gpus(runtime_dir, tmp_path):
    import cupy
    n = int(cupy.cuda.runtime.getDeviceCount())
    if n < 2:
        pytest.skip(f"needs 2 GPUs (CuPy sees {n})")
    launch_attach_list_detach_stop(runtime_dir, tmp_path, "gpu")


def test_interval_cuts_of_a_device_query_cover_the_same_steps_on_both_gpus(runtime_dir):
    """A device query's print + clear interval on 2 GPU ranks: every tick names the same
    steps on both ranks, each holds exactly those steps' task:end events
    (tests/launch/gpu_demo_checks.check_aligned_interval_cuts; CPU stand-ins:
    tests/launch/test_demo_gpu_fake.py)."""
    import os
    import cupy
    from gpu_demo_checks import check_aligned_interval_cuts
    n = int(cupy.cuda.runtime.getDeviceCount())
    if n < 2:
        pytest.skip(f"needs 2 GPUs (CuPy sees {n})")
    sms = int(cupy.cuda.Device(0).attributes["MultiProcessorCount"])
    ticks = check_aligned_interval_cuts(dict(os.environ), steps=6000, interval_ms=20, workers=sms - 1, batch=4)
    print(f"aligned interval ticks: {len(ticks[0])} on rank 0, first {ticks[0][0][0]}, last {ticks[0][-1][0]}")
