import os
import shutil
import tempfile

import pytest


@pytest.fixture
def runtime_dir(monkeypatch):
    """A private job registry for the test (short path: Unix socket paths are limited)."""
    d = tempfile.mkdtemp(prefix="dtmk-")
    os.chmod(d, 0o700)
    monkeypatch.setenv("DTRACE_MK_RUNTIME_DIR", d)
    yield d
    shutil.rmtree(d, ignore_errors=True)
