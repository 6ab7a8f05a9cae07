"""CI (no GPU): -DDTMK_IDEAL_SITE, a MEASUREMENT-ONLY build (bench/hooks.py variant
idealsite, docs/dev/hook_cost_analysis.md "Session 9"): hook_flush does the summary's three
updates in shared memory instead of building and storing records.  It compiles, its
hook_flush stores nothing to global memory and builds no record (the default's does),
and the variant runs only off / mask3 in the bench (it has no records to observe)."""
import re

import pytest

from dtrace_mk.kernels.build import nvrtc_compile, ptx_function
from dtrace_mk.kernels import megakernel_text


@pytest.fixture(scope="module")
def ptxs():
    src = megakernel_text()
    return {d: nvrtc_compile(src, "megakernel.cu", "sm_90a", "ptx", defines=d).decode()
            for d in ((), ("DTMK_IDEAL_SITE",))}


def _hook_flush(ptx: str) -> str:
    name = next(n for n in re.findall(r"\.func\s+(?:\([^)]*\)\s*)?(\w*hook_flush\w*)", ptx))
    return ptx_function(ptx, name)


def test_the_ideal_site_updates_shared_memory_and_stores_no_record(ptxs):
    base, ideal = _hook_flush(ptxs[()]), _hook_flush(ptxs[("DTMK_IDEAL_SITE",)])
    # the default stores 16-byte record quarters (shared ring: st.shared.v4, global ring:
    # generic st.v4) and counts a full ring's records lost; the ideal site does neither
    assert "st.shared.v4.u32" in base and "st.v4.u32" in base and "obs_lost" in base
    assert not re.search(r"\bst(\.shared|\.global)?\.v4", ideal) and "obs_lost" not in ideal
    assert "st.volatile.shared" in ideal and "clz.b64" in ideal
    assert len(ideal.splitlines()) < len(base.splitlines()) / 2


def test_the_bench_runs_it_only_without_an_observer():
    from tests.bench_tables import hooks_table
    assert hooks_table("BUILD_VARIANT_RUNS")["idealsite"] == ("off", "mask3")
