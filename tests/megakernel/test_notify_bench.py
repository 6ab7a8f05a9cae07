"""CI (no GPU): bench/notify.py's kernels compile through NVRTC for sm_90a, every
variant is a kernel of the cubin, and each variant's PTX has the instructions it claims
(fence.acq_rel, ld.acquire poll, ld.cg payload, st.release/atom producers, nanosleep, vote); the host's
verdict flags timeouts, stale payloads and shared SMs."""

import numpy as np
import pytest



@pytest.fixture(scope="module")
def notify(load_bench):
    return load_bench("notify")


@pytest.fixture(scope="module")
def ptx(notify):
    from dtrace_mk.kernels.build import nvrtc_compile
    return nvrtc_compile(notify.kernel_source(), name="notify.cu", arch="sm_90a", target="ptx").decode()


def _body(ptx: str, name: str) -> str:
    start = ptx.index(f".entry {name}(")
    end = ptx.find(".entry ", start + 1)
    return ptx[start:end if end > 0 else len(ptx)]


def test_cubin_has_every_variant(notify):
    cubin = notify.compile_cubin("sm_90a")
    assert cubin[:4] == b"\x7fELF"
    for key in notify.VARIANTS:
        assert f"ring_{key}".encode() in cubin, key
    assert b"floors" in cubin


def test_variants_use_the_claimed_instructions(ptx):
    a = _body(ptx, "ring_a")
    assert "red.release.gpu.global.add.u64" in a and "fence.acq_rel.gpu" in a
    assert "ld.relaxed.gpu.global.u64" in a and "ld.acquire" not in a
    b = _body(ptx, "ring_b")
    assert "ld.acquire.gpu.global.u64" in b and "fence.acq_rel" not in b
    for key in ("c", "cu"):
        body = _body(ptx, f"ring_{key}")
        assert "fence.acq_rel" not in body and "ld.acquire" not in body
    assert "ld.global.cg.u32" in _body(ptx, "ring_c")
    d = _body(ptx, "ring_d")
    assert "st.release.gpu.global.u64" in d and "red.release" not in d
    assert "atom.release.gpu.global.add.u64" in _body(ptx, "ring_d3")
    assert "nanosleep" in _body(ptx, "ring_f") and "nanosleep" not in a
    assert "vote" in _body(ptx, "ring_e") and "vote" not in a


def test_configuration_table(notify):
    V = notify.VARIANTS
    assert V["h"][7] == 3 and V["g"][8] == 32 and V["a"][7] == 2 and V["a"][8] == 512
    # every variant but the deliberately unsafe one must pass the payload check
    assert [k for k, v in V.items() if not v[9]] == ["cu"]
    # a variant differs from (a) in the knobs it names, e.g. (b) only in poll and fence
    diff = [i for i in range(7) if V["b"][i] != V["a"][i]]
    assert diff == [0, 1]


def _rows(n, done, smids, bad=0, elapsed=1000):
    o = np.zeros((n, 8), np.uint64)
    for r in range(n):
        o[r] = [elapsed if r == 0 else 0, bad, smids[r], done, 5, 0, 0, 0]
    return o


def test_verdict(notify):
    v = notify.verdict
    assert v(_rows(2, 100, [0, 7]), 0, 2, 100, True) == "ok"
    assert v(_rows(2, 100, [0, 7]), 1, 2, 100, True) == "TIMEOUT"
    assert v(_rows(2, 99, [0, 7]), 0, 2, 100, True) == "INCOMPLETE"
    assert v(_rows(2, 100, [3, 3]), 0, 2, 100, True) == "SAME_SM"
    assert v(_rows(2, 100, [0, 7], bad=2), 0, 2, 100, True) == "BAD4"
    assert v(_rows(2, 100, [0, 7], bad=2), 0, 2, 100, False) == "stale4"
    assert v(_rows(3, 100, [0, 7, 9], elapsed=0), 0, 3, 100, True) == "NO_TIME"
