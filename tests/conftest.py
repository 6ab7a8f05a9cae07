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


@pytest.fixture(scope="session")
def clang():
    """Path of the distro clang that builds eBPF monitors (installed by dev.sh)."""
    p = _find_tool("clang", "clang-14")
    if p is None:
        pytest.fail("clang is not installed: run ./dev.sh (it installs the distro clang)")
    return p
