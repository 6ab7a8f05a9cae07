import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _find_tool(*names):
    for n in names:
        p = shutil.which(n)
        if p:
            return p
    return None


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO


def _load_script(folder: str, name: str):
    """<folder>/<name>.py as a module (the benches and tools are scripts, not a package)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(f"{folder}_{name}", REPO / folder / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _load_bench(name: str):
    return _load_script("bench", name)


@pytest.fixture(scope="session")
def load_bench():
    """load_bench("notify") -> bench/notify.py as a module."""
    return _load_bench


_PTX = {}


def _megakernel_ptx(defines=(), name: str = "megakernel.cu") -> str:
    """PTX of kernels/<name> for sm_90a with -D defines (NVRTC, no GPU), compiled once per
    test session: several modules read the same builds' PTX (the default build's, e.g.).
    Functions go by their source names (build.source_names: -DDTMK_HOT_FIRST's renames, the
    default layout's, undone); tests of the layout itself compile for themselves."""
    key = (name, tuple(defines))
    if key not in _PTX:
        pytest.importorskip("cuda.bindings.nvrtc")
        from dtrace_mk.kernels import KERNEL_DIR
        from dtrace_mk.kernels.build import nvrtc_compile, source_names
        _PTX[key] = source_names(nvrtc_compile((KERNEL_DIR / name).read_text(), name, "sm_90a", "ptx",
                                               tuple(defines)).decode(errors="replace"))
    return _PTX[key]


@pytest.fixture(scope="session")
def megakernel_ptx():
    """megakernel_ptx(defines=(), name="megakernel.cu") -> the PTX text (cached per session)."""
    return _megakernel_ptx


@pytest.fixture(scope="session")
def load_tool():
    """load_tool("gpc_probe") -> tools/gpc_probe.py as a module."""
    return lambda name: _load_script("tools", name)


@pytest.fixture
def runtime_dir(monkeypatch):
    """A private job registry for the test ($DTRACE_MK_RUNTIME_DIR; a short path: Unix
    socket paths are limited)."""
    import os
    import tempfile
    d = tempfile.mkdtemp(prefix="dtmk-")
    os.chmod(d, 0o700)
    monkeypatch.setenv("DTRACE_MK_RUNTIME_DIR", d)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def megakernel_builds(monkeypatch):
    """gpu.Megakernel replaced by a stand-in that records the defines of each build asked for
    and raises Stop (the layer above, e.g. top's GPU path, tested up to the build).  Returns
    (the defines list, the Stop exception)."""
    from dtrace_mk.megakernel import gpu
    built = []

    class Stop(Exception):
        pass

    def fake(cfg, batch=1, defines=()):
        built.append(defines)
        raise Stop
    monkeypatch.setattr(gpu, "Megakernel", fake)
    return built, Stop


@pytest.fixture(scope="session")
def clang():
    """Path of the distro clang that builds eBPF monitors (installed by dev.sh)."""
    p = _find_tool("clang", "clang-14")
    if p is None:
        pytest.fail("clang is not installed: run ./dev.sh (it installs the distro clang)")
    return p


# --- GPU tests -------------------------------------------------------------------------
# tests/gpu holds every test that needs CuPy and a CUDA GPU (marker `gpu`).  Without a GPU
# (CI) the folder is not collected at all rather than reported as skipped: those tests are
# run on the lent H200 and their results recorded under docs/results/.

def _gpu_available() -> bool:
    try:
        import cupy
        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


HAVE_GPU = _gpu_available()
collect_ignore_glob = [] if HAVE_GPU else ["gpu/*"]


def pytest_report_header(config):
    return ("GPU: present, tests/gpu collected" if HAVE_GPU else
            "GPU: none; tests/gpu not collected (run on the lent H200, see docs/results/)")
