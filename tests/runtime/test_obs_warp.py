"""Rounds 6 and 7 of docs/dev/hook_cost_analysis.md were measured on the H200 and removed
(last in commit 1e256b7): the observer warp (-DDTMK_OBS_WARP, a 17th warp per CTA) and the
off copy (run_task / wait_event compiled twice, chosen per call through MK_OBS_FN / MK_OBS_ON;
session 55 brought -DDTMK_OFF_COPY back in another form -- a per-task latch, measured with
pinned workers: tests/megakernel/test_off_copy.py).  Session 13 tried the
observer warp again as warp 15 serving a shared-memory queue inside dependency waits
(exact on the GPU, slower: 1b hot summary +43.7% vs +40.0%; code last in commit b27d8dc;
"Session 13" of the same file).  Nothing of either is left: one block size (MK_THREADS),
one barrier macro (MK_SYNC = __syncthreads), one copy of the task loop."""
from __future__ import annotations

import re

from dtrace_mk.kernels import KERNEL_DIR, megakernel_text
from dtrace_mk.megakernel import gpu
from dtrace_mk.runtime import compiled as C

GONE = ("DTMK_OBS_WARP", "DTMK_OBS_MAXNREG", "MK_OBS_FN", "MK_OBS_ON", "MK_BLOCK_THREADS",
        "MK_SYNC_ALL", "MK_OBS_WARP_ID", "OBS_REFUSED", "ObsJob", "bar.sync 1")


def test_kernel_sources_carry_no_removed_variant():
    for f in sorted(KERNEL_DIR.glob("*.cu*")) + sorted(KERNEL_DIR.glob("*.h")):
        src = f.read_text()
        for g in GONE:
            assert g not in src, (f.name, g)


def test_python_side_has_one_block_size_and_no_variant():
    assert gpu.MK_THREADS == 512 and not hasattr(gpu, "block_threads") and not hasattr(gpu, "OBS_WARP_DEFINE")
    assert not hasattr(C, "MK_OBS_MAXRREG")
    assert C.megakernel_spec(()) is C.MEGAKERNEL_SPEC
    # an unknown define is not a variant of the compiled tier's build
    assert C.megakernel_spec(("DTMK_OBS_WARP",)) is C.MEGAKERNEL_SPEC
    src = (KERNEL_DIR.parents[0] / "bench" / "hooks.py").read_text()
    from tests.bench_tables import hooks_table
    variants = hooks_table("BUILD_VARIANTS")
    assert "obswarp" not in variants and "offcopy" not in variants
    assert "DTMK_OBS_WARP" not in src


def test_compute_sources_use_mk_sync_and_mk_threads():
    """Every CTA barrier is MK_SYNC and every block-strided loop of the task bodies counts
    MK_THREADS (the launch's block size), never blockDim.x."""
    for f in ("mk_ops.cuh", "mk_comm.cuh", "mk_common.cuh"):
        src = (KERNEL_DIR / f).read_text()
        assert "blockDim" not in src, f
        assert not re.search(r"__syncthreads\(\)\s*;", src.replace("#define MK_SYNC() __syncthreads()", "")), f
    assert "__syncthreads()" not in megakernel_text()
