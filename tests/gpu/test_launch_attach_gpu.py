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
