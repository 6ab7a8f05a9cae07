"""CI (no GPU): the megakernel's speed variants (docs/dev/megakernel_speed.md "Session 3")
keep compiling through NVRTC for sm_90a, the default build has the faster code shapes
(acquire poll; norm weights loaded before the fused prologue's block sum; the task record
copied to shared memory before the dependency's acquire), and bench/megakernel.py's
--variants parsing and table work.  The defines left are the old (session-2) paths, kept
so the bench can compare them with the default."""

import pytest

from dtrace_mk.kernels.build import mangled, ptx_function, source_names, wait_copies
from dtrace_mk.megakernel import gpu

BUILDS = {"default": (),
          "reclate": ("DTMK_REC_LATE",),                                   # record read after the acquire
          "s2code": ("DTMK_POLL_FENCE", "DTMK_PROLOGUE_SERIAL", "DTMK_REC_LATE")}   # the session-2 code


@pytest.fixture()
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DTRACE_MK_CACHE", str(tmp_path))


@pytest.mark.parametrize("name", sorted(BUILDS))
def test_variant_builds_compile(fresh_cache, name):
    cubin = gpu.compile_source("sm_90a", "cubin", defines=BUILDS[name], use_cache=False)
    assert cubin[:4] == b"\x7fELF"


#: the hook build's wait, two copies (session 60)
WAITS = tuple(mangled(n) for n in wait_copies())


def _func(ptx: str, name: str) -> str:
    body = ptx_function(ptx, name)
    assert body, f"{name} not in the PTX"
    return body


def test_default_ptx_shapes(fresh_cache):
    ptx = source_names(gpu.compile_source("sm_90a", "ptx", use_cache=False).decode())
    sn = _func(ptx, "stage_norm")
    # the fused prologue's norm weights are loaded before its first barrier (block sum)
    assert "ld.global.nc.u16" in sn and sn.index("ld.global.nc.u16") < sn.index("bar.sync")
    for wait in WAITS:                              # (the default's two copies of the wait)
        we = _func(ptx, wait)
        # first look and poll are acquire loads; the poll has no relaxed load + fence any more
        assert we.count("ld.acquire.gpu") >= 2, wait
        assert "ld.relaxed.gpu" not in we, wait
        # record early: the waiting task's record is copied into s_rec before the first acquire
        assert "st.shared.v4.u32 \t[s_rec]" in we, wait
        assert we.index("st.shared.v4.u32 \t[s_rec]") < we.index("ld.acquire.gpu"), wait
    assert "s_rec_t" in _func(ptx, "run_task")


def test_rec_late_reads_the_record_in_run_task(fresh_cache):
    ptx = source_names(gpu.compile_source("sm_90a", "ptx", defines=("DTMK_REC_LATE",), use_cache=False).decode())
    assert not any("s_rec" in _func(ptx, f) for f in WAITS + ("run_task",))


@pytest.fixture(scope="module")
def bench(load_bench):
    return load_bench("megakernel")


def test_parse_variants(bench):
    v = bench.parse_variants("old=DTMK_POLL_FENCE+DTMK_PROLOGUE_SERIAL,late=DTMK_REC_LATE+prefetch,pf=prefetch")
    assert v == [("default", (), False), ("old", ("DTMK_POLL_FENCE", "DTMK_PROLOGUE_SERIAL"), False),
                 ("late", ("DTMK_REC_LATE",), True), ("pf", (), True)]
    with pytest.raises(SystemExit, match="NAME=DEF"):
        bench.parse_variants("justaname")
    with pytest.raises(SystemExit, match="duplicate"):
        bench.parse_variants("a=X,a=Y")


def test_variant_table(bench):
    v = {"preset": "1b", "batch": 1, "weight_bytes_per_step": 2.0e9, "variants": [
        {"variant": "default", "defines": [], "prefetch": False, "tokens_equal": True, "logits_bit_equal": True,
         "step_ms": 1.6},
        {"variant": "fast", "defines": ["DTMK_X=1"], "prefetch": True, "tokens_equal": True,
         "logits_bit_equal": False, "step_ms": 0.8},
        {"variant": "broken", "defines": ["DTMK_Y"], "prefetch": False, "error": "CompileError('x')"}]}
    results = [{"preset": "1b:old", "eager": {"step_ms": 1.6}}, {"preset": "1b", "eager": {"step_ms": 2.0}},
               {"preset": "tiny", "eager": {"step_ms": 0.1}}]
    out = bench.variant_table(v, results, bw=4.0e12)
    lines = out.splitlines()
    assert "1b:old 1600.0 us" in lines[0]            # the fastest eager build of the same model
    fast = next(ln for ln in lines if ln.startswith("fast"))
    # 800 us: eager/mk 2.00, default/mk 2.00, 2.5 TB/s = 62.5 % of 4 TB/s, tokens T, bits F
    assert fast.split()[1:8] == ["800.0", "2.00", "2.00", "2500", "62.5", "T", "F"]
    assert "DTMK_X=1+prefetch" in fast
    assert next(ln for ln in lines if ln.startswith("broken")).split()[1] == "FAILED"


def test_preset_options(bench):
    """--presets' colon options map to the lowering fields; an unknown one names the list"""
    cfg = bench.preset("1b:se")
    assert cfg.slice_events and cfg.split_k == 4 and not cfg.head_events
    assert bench.preset("1b:q32:h").head_events and bench.preset("1b:q32:h").qkv_tile_n == 32
    assert not bench.preset("1b:old").fuse_norm
    with pytest.raises(SystemExit, match=r"unknown option 'x' in '1b:x' \(old, fuse, s<N>, t<N>, q<N>, r, nor, h, se\)"):
        bench.preset("1b:x")
