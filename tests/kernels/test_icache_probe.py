"""CI (no GPU): tools/icache_probe.py's generated code -- straight-line segments of the size
asked, distinct per seed, compiled by NVRTC to about that many bytes of SASS -- and its
knee finder."""
import re

import pytest


@pytest.fixture(scope="module")
def icp(load_tool):
    return load_tool("icache_probe")


def test_segment_has_the_statements_of_its_size_and_distinct_constants(icp):
    a, b = icp.segment(8, 1), icp.segment(8, 2)
    assert a.count(";") == 8 * 1024 // icp.BYTES_PER_STMT == 256
    assert a == icp.segment(8, 1)                             # deterministic per seed
    consts = lambda s: set(re.findall(r"0x[0-9a-f]{8}u", s))
    assert len(consts(a)) > 250 and not consts(a) & consts(b)   # two segments share no instruction word


def test_kernel_compiles_to_about_the_asked_bytes_of_sass(icp):
    from dtrace_mk.kernels import build
    small = build.nvrtc_compile(icp.kernel_source([8]), "icp.cu", "sm_90a", "cubin", ())
    big = build.nvrtc_compile(icp.kernel_source([8, 32]), "icp.cu", "sm_90a", "cubin", ())
    grown = len(big) - len(small)
    assert 0.9 * 32 * 1024 <= grown <= 1.15 * 32 * 1024, grown   # 2 SASS instructions per statement


def test_knee_is_the_first_size_past_the_factor(icp):
    pts = [(4, 1.0), (16, 1.1), (32, 1.4), (48, 2.2), (64, 3.0)]
    assert icp.knee(pts) == 48
    assert icp.knee(pts, factor=2.5) == 64
    assert icp.knee(pts[:3]) is None and icp.knee([]) is None


def test_reps_keep_the_instruction_count_and_a_floor(icp):
    assert icp.reps_for(16) == int(4e6 / 1024)
    assert icp.reps_for(10 ** 6) == 4
