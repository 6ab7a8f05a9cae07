"""GPU tests: skipped unless CuPy imports and sees a CUDA device.  (Minimal version written
by the device-VM work; the megakernel tests may extend it.)"""
import pytest


def _gpu_available() -> bool:
    try:
        import cupy
        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


_GPU = _gpu_available()


def pytest_collection_modifyitems(config, items):
    if _GPU:
        return
    skip = pytest.mark.skip(reason="needs CuPy and a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
