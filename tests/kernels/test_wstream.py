"""CI (no GPU): the TMA weight streaming of the megakernel (-DDTMK_WSTREAM, the default since
session 4; -DDTMK_NO_WSTREAM is the old path;
kernels/mk_ops.cuh "weight streaming through shared memory"; docs/dev/megakernel_speed.md
"Session 4") compiles through NVRTC to sm_90a cubin with the default hook code and with
-DDTMK_NO_HOOKS; ptxas gives its new functions no spills and leaves op_proj / op_gate_up
as they are in the old build; the old-path builds and the per-operator baseline contain
none of it; the ring fits the 1b launch's shared memory; gpu.ws_ring_bytes reads the
defines."""
import re

import pytest

from dtrace_mk.kernels import build
from dtrace_mk.megakernel import gpu
from dtrace_mk.megakernel.presets import PRESETS

WS = ("DTMK_WSTREAM",)
OLD = ("DTMK_NO_WSTREAM",)      # the matvec path before session 4 (the default streams since)
WS8 = ("DTMK_WSTREAM", "DTMK_WS_NST=8", "DTMK_WS_STAGE=16384")
SMEM_MAX = 227 * 1024          # sm_90: static + dynamic shared memory per block


def _compile_v(defines):
    """NVRTC cubin of megakernel.cu with `ptxas -v`: (cubin, ptxas log)."""
    nvrtc = build.nvrtc_module()
    src = (build.KERNEL_DIR / "megakernel.cu").read_text()
    err, prog = nvrtc.nvrtcCreateProgram(src.encode(), b"megakernel.cu", 0, [], [])
    assert err == nvrtc.nvrtcResult.NVRTC_SUCCESS
    try:
        opts = ["--gpu-architecture=sm_90a", "--std=c++17", "-default-device",
                f"--include-path={build.KERNEL_DIR}", "--ptxas-options=-v"] + [f"-D{d}" for d in defines]
        res = nvrtc.nvrtcCompileProgram(prog, len(opts), [o.encode() for o in opts])
        log = bytes(nvrtc.nvrtcGetProgramLogSize(prog)[1])
        nvrtc.nvrtcGetProgramLog(prog, log)
        log = log.replace(b"\0", b"").decode(errors="replace")
        assert res[0] == nvrtc.nvrtcResult.NVRTC_SUCCESS, log
        out = bytes(nvrtc.nvrtcGetCUBINSize(prog)[1])
        nvrtc.nvrtcGetCUBIN(prog, out)
        return out, log
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def _resources(log):
    """{function (mangled, or the entry's name): (spill stores, spill loads)}, and the
    entry's registers and static shared memory"""
    funcs = {m.group(1): (int(m.group(2)), int(m.group(3))) for m in re.finditer(
        r"Function properties for (\S+)\s*\n\s*ptxas\s+\.\s+\d+ bytes stack frame, (\d+) bytes spill stores, "
        r"(\d+) bytes spill loads", log)}
    m = re.search(r"Compiling entry function 'dtmk_megakernel'.*?Used (\d+) registers.*?(\d+) bytes smem", log, re.S)
    assert m, log[:2000]
    return funcs, int(m.group(1)), int(m.group(2))


def _spills(funcs, name):
    hits = [v for k, v in funcs.items() if name in k]
    assert hits, f"{name} not in the ptxas log"
    return hits[0]


@pytest.fixture(scope="module")
def builds():
    return {"ws": _compile_v(WS), "ws_nohooks": _compile_v(WS + ("DTMK_NO_HOOKS",))}


def _ptx(defines):
    return build.nvrtc_compile((build.KERNEL_DIR / "megakernel.cu").read_text(), "megakernel.cu",
                               "sm_90a", "ptx", defines).decode()


@pytest.fixture(scope="module")
def ptxs():
    return {"default": _ptx(()), "old": _ptx(OLD), "old_nohooks": _ptx(OLD + ("DTMK_NO_HOOKS",)), "ws": _ptx(WS)}


def test_variant_compiles_with_and_without_hooks(builds):
    for name in ("ws", "ws_nohooks"):
        cubin, log = builds[name]
        assert cubin[:4] == b"\x7fELF"
        funcs, regs, smem = _resources(log)
        print(f"{name}: {regs} registers, {smem} bytes static smem; "
              + ", ".join(f"{k}: {v[0]}/{v[1]} B spill st/ld" for k, v in sorted(funcs.items())
                          if re.search(r"ws_|op_proj|op_gate_up|op_fused|op_split|wait_event|run_task", k)))
        assert regs <= 128                      # 512 threads, one CTA per SM
        for f in ("ws_proj", "ws_gate_up", "ws_prestart"):
            assert _spills(funcs, f)[0] == 0, f"{name}: {f} spills"


def test_variant_leaves_the_old_matvec_code_alone(ptxs):
    """op_proj / op_gate_up / mv_row_nl (the paths every uncovered tile keeps) are the same
    PTX in the variant as in the default build (so ptxas gives them the same registers and
    spills: 32 / 176 and 20 / 36 bytes spill stores / loads with hooks on, CUDA 13.0)"""
    for f in ("_Z7op_projP", "_Z10op_gate_upP", "mv_row_nl"):
        a, b = _func(ptxs["old"], f), _func(ptxs["ws"], f)
        strip = lambda t: re.sub(r"\$L__BB\d+_\d+|%[a-z]+\d+", "", t)   # noqa: E731  (label / register numbering)
        assert strip(a) == strip(b), f"{f} differs between the default and the DTMK_WSTREAM build"


def test_default_is_the_weight_stream_and_the_old_path_has_none(ptxs):
    """Since session 4 the default build IS -DDTMK_WSTREAM (identical PTX);
    -DDTMK_NO_WSTREAM (with or without hooks) has none of its code; the per-operator
    baseline (baseline.cu, which includes mk_ops.cuh) has none either."""
    assert ptxs["default"] == ptxs["ws"]
    for name in ("old", "old_nohooks"):
        for sym in ("cp.async.bulk.shared", "mbarrier", "ws_s", "ws_prestart", "dtmk_ws_stats", "ws_tile"):
            assert sym not in ptxs[name], f"{name} build contains {sym}"
    base = build.nvrtc_compile((build.KERNEL_DIR / "baseline.cu").read_text(), "baseline.cu", "sm_90a", "ptx",
                               ()).decode()
    assert "cp.async.bulk.shared" not in base and "ws_prestart" not in base


def _func(ptx, name):
    m = re.search(r"\.func\s[^\n(]*" + re.escape(name) + r"[^\n(]*\(", ptx)
    assert m, f"{name} not in the PTX"
    ends = [e for e in (ptx.find("\n.func", m.end()), ptx.find("\n.entry", m.end())) if e > 0]
    return ptx[m.start():min(ends) if ends else len(ptx)]


@pytest.mark.parametrize("extra", [(), ("DTMK_REC_LATE",), ("DTMK_WS_NST=9", "DTMK_WS_STAGE=16384"),
                                   ("DTMK_WS_NOPRE", "DTMK_WS_XSMEM")])
def test_variant_ptx_shape(ptxs, extra):
    ptx = _ptx(WS + extra) if extra else ptxs["ws"]
    we = _func(ptx, "wait_event")
    # the stream is started inside the dependency wait, before the poll loop's first barrier
    # after the first look (warp 1 while thread 0 polls)
    if "DTMK_WS_NOPRE" in extra:
        assert "ws_prestart" not in we                 # the body starts every stream
    else:
        assert "ws_prestart" in we
        pre = _func(ptx, "ws_prestart")
        assert "ws_task_desc" in pre or "mbarrier.arrive.expect_tx" in pre
    assert "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes" in ptx
    assert "mbarrier.try_wait.parity.shared::cta.b64" in ptx
    rb = _func(ptx, "run_body")      # op_fused_proj / op_fused_gate_up / op_split_proj inline here
    for callee in ("ws_proj", "ws_gate_up"):
        assert callee in rb, f"run_body does not call {callee}"
    assert "bar.red.or" in rb                  # ws_begin: one barrier checks the prediction


def test_ws_ring_bytes():
    assert gpu.ws_ring_bytes(()) == 4 * 32768 + 128                  # the default streams
    assert gpu.ws_ring_bytes(("DTMK_NO_HOOKS",)) == 4 * 32768 + 128
    assert gpu.ws_ring_bytes(OLD) == gpu.ws_ring_bytes(OLD + ("DTMK_NO_HOOKS",)) == 0
    assert gpu.ws_ring_bytes(WS) == 4 * 32768 + 128
    assert gpu.ws_ring_bytes(WS8) == 8 * 16384 + 128
    assert gpu.ws_ring_bytes(("DTMK_WSTREAM", "DTMK_WS_NST=9", "DTMK_WS_STAGE=16384")) == 9 * 16384 + 128


def _dyn_smem(cfg, B, defines):
    """gpu.Megakernel's dynamic shared memory (its formula, kept in step by hand)"""
    base = max(cfg.max_seq + gpu.MK_WARPS + gpu.MK_THREADS, B * max(cfg.n_experts, 1) + 8,
               B * cfg.tile_n + 2 * B + 8, 2 * gpu.MK_WARPS + 4) + 64
    xs_off = (base + 3) // 4 * 4
    xs_cap = int(min(B * max(cfg.hidden, cfg.ffn, cfg.q_dim), gpu.SMEM_LIMIT // 4 - xs_off))
    smem = 4 * (xs_off + xs_cap)
    ring = gpu.ws_ring_bytes(defines)
    return smem + ring if smem + ring <= gpu.WS_SMEM_MAX else smem, ring


@pytest.mark.parametrize("defines", [WS, WS8, ("DTMK_WSTREAM", "DTMK_WS_NST=9", "DTMK_WS_STAGE=16384")])
def test_ring_fits_the_1b_launch(builds, defines):
    """1b batch 1: the ring is added (so the kernel streams) and static + dynamic shared
    memory stays within the 227 KB of an sm_90 block"""
    _, _, static = _resources(builds["ws"][1])
    dyn, ring = _dyn_smem(PRESETS["1b"], 1, defines)
    assert dyn >= ring > 0 and dyn - ring > 0
    assert static + dyn <= SMEM_MAX, (static, dyn)
    assert gpu.WS_SMEM_MAX + static <= SMEM_MAX


# ---- the ring protocol, modelled (kernels/mk_ops.cuh ws_issue / ws_wait / ws_release) --------
def _run_ring(nst_ring, streams, seed, skip_rowless=False, warps=16, rps_rows=None):
    """Random interleaving of 16 warps consuming `streams` (stage counts) through a ring of
    nst_ring slots with parity-waited mbarriers, as the kernel does: the first
    min(NST, stages) issued at the start, stage j + NST issued by the 16th warp done with
    stage j, completions after random delays.  skip_rowless: warps skip stages without a
    row of theirs (rows r % 16 == warp, rps_rows rows per stage) -- the unsound protocol.
    Returns None when every wait saw its own stage's bytes, else what went wrong."""
    import random
    rnd = random.Random(seed)
    done_phases = [0] * nst_ring          # completed phases per slot
    content = [None] * nst_ring           # global stage whose bytes the slot holds
    inflight = []                         # (global stage) issued, not landed
    cnt = [0] * nst_ring
    seq = 0
    for nst in streams:
        g0 = seq
        for j in range(min(nst_ring, nst)):
            inflight.append(g0 + j)
        pos = [0] * warps
        computing = [False] * warps

        def mine(w, j):
            if not skip_rowless:
                return True
            r0 = j * rps_rows
            return any(r % 16 == w for r in range(r0, r0 + rps_rows))

        for _ in range(200000):
            if all(p >= nst for p in pos) and not inflight:
                break
            acts = [("land", i) for i in range(len(inflight))]
            acts += [("warp", w) for w in range(warps) if pos[w] < nst]
            kind, i = rnd.choice(acts)
            if kind == "land":
                g = inflight.pop(i)
                s = g % nst_ring
                content[s] = g
                done_phases[s] += 1
                continue
            w = i
            j = pos[w]
            while skip_rowless and j < nst and not mine(w, j):
                j += 1
            if j >= nst:
                pos[w] = nst
                continue
            g = g0 + j
            s = g % nst_ring
            if not computing[w]:
                # mbarrier.try_wait.parity(P): true when P differs from the current phase's parity
                if (g // nst_ring) & 1 == done_phases[s] & 1:
                    continue                          # not yet
                if content[s] != g:
                    return f"warp {w} read slot {s} holding stage {content[s]} as stage {g}"
                computing[w] = True
                continue
            computing[w] = False
            pos[w] = j + 1
            if skip_rowless:                          # release counts the stage's row owners only
                need = sum(1 for v in range(warps) if mine(v, j))
            else:
                need = warps
            cnt[s] += 1
            if cnt[s] == need:
                cnt[s] = 0
                if j + nst_ring < nst:
                    inflight.append(g + nst_ring)
        else:
            return "deadlock"
        if any(p < nst for p in pos):
            return "deadlock"
        seq = g0 + nst                                # ws_end
    return None


@pytest.mark.parametrize("nst_ring", [4, 8, 9])
def test_ring_protocol_never_reads_a_stale_stage(nst_ring):
    # 1b streams (stages per tile at 32 KB / 16 KB), tiny's 2-stage tiles, back to back
    streams = [8, 2, 16, 8, 8, 2, 1, 16, 32, 3]
    for seed in range(30):
        assert _run_ring(nst_ring, streams, seed) is None, seed


def test_ring_model_catches_the_unsound_protocol():
    """the model is not vacuous: letting warps skip stages without rows of theirs (the
    first version) reads a stale stage or deadlocks for some interleaving with 9 slots"""
    bad = [_run_ring(9, [16, 16], seed, skip_rowless=True, rps_rows=4) for seed in range(200)]
    assert any(b is not None for b in bad)


def test_ring_only_for_graphs_with_streamed_tiles():
    """An idle ring costs the L1 carveout (1b standard lowering 1946 -> 2334 us/step on the
    H200): Megakernel adds it only for the fused / split-K lowering on one rank, batch <= 4."""
    one = PRESETS["1b"]
    assert gpu.ws_ring_for(one, 1, 1, ()) == 4 * 32768 + 128
    assert gpu.ws_ring_for(one, 4, 1, ()) == 4 * 32768 + 128
    assert gpu.ws_ring_for(one, 8, 1, ()) == 0                       # batch > MK_MAXB
    assert gpu.ws_ring_for(one, 1, 2, ()) == 0                       # tensor parallel: standard lowering
    assert gpu.ws_ring_for(one, 1, 1, OLD) == 0
    std = PRESETS["tiny"]
    assert not std.fuse_norm and std.split_k == 1 and gpu.ws_ring_for(std, 1, 1, ()) == 0
