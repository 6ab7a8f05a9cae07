"""CUDA sources of the reference megakernel (package data, compiled at run time by NVRTC)."""
from pathlib import Path

KERNEL_DIR = Path(__file__).resolve().parent


#: parts of megakernel.cu kept in files of their own, each #included once at its place
MEGAKERNEL_PARTS = ("mk_observer.cuh", "mk_hooks.cuh", "mk_obs_sm.cuh")


def megakernel_text() -> str:
    """megakernel.cu with its parts (MEGAKERNEL_PARTS) written in at their #include lines:
    the kernel as one text, for source checks (it compiles the same)."""
    import re
    src = (KERNEL_DIR / "megakernel.cu").read_text()
    for part in MEGAKERNEL_PARTS:
        pat = re.compile(r'^#include "' + re.escape(part) + r'"[^\n]*$', re.M)
        assert len(pat.findall(src)) == 1, f"megakernel.cu includes {part} once"
        body = (KERNEL_DIR / part).read_text()
        src = pat.sub(lambda _m: body.rstrip("\n"), src)
    return src
