"""CI (no GPU): the TMA weight streaming of the megakernel (-DDTMK_WSTREAM, the default since
session 4; -DDTMK_NO_WSTREAM is the old path;
kernels/mk_ops.cuh "weight streaming through shared memory"; docs/dev/megakernel_speed.md
"Session 4") compiles through NVRTC to sm_90a cubin with the default hook code and with
-DDTMK_NO_HOOKS; ptxas gives its new functions no spills and leaves op_proj / op_gate_up
as they are in the old build; the old-path builds and the per-operator baseline contain
none of it; the ring fits the 1b launch's shared memory; gpu.ws_ring_bytes reads the
defines.  Session 4b: -DDTMK_WS_NEXT (the next static task's stream follows the current one
through the ring) compiles the same way, leaves the default PTX alone, and its protocol --
global stage indices running on across tasks -- is modelled under random interleavings,
mispredictions and aborts; three unsound orderings fail in the model."""
import random
import re

import pytest

from dtrace_mk.kernels import build
from dtrace_mk.megakernel import gpu
from dtrace_mk.megakernel.presets import PRESETS
from dtrace_mk.kernels import megakernel_text

WS = ("DTMK_WSTREAM",)
OLD = ("DTMK_NO_WSTREAM",)      # the matvec path before session 4 (the default streams since)
WS8 = ("DTMK_WSTREAM", "DTMK_WS_NST=8", "DTMK_WS_STAGE=16384")
NEXT = ("DTMK_WS_NEXT",)        # session 4b: streaming across task boundaries
NOTAIL = NEXT + ("DTMK_WS_NEXT_NOTAIL",)   # ... only into slots free at a task boundary
SMEM_MAX = 227 * 1024          # sm_90: static + dynamic shared memory per block


def _compile_v(defines):
    """NVRTC cubin of megakernel.cu with `ptxas -v`: (cubin, ptxas log)."""
    nvrtc = build.nvrtc_module()
    src = megakernel_text()
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
        return out, build.source_names(log)      # (functions by their source names)
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
    return {"ws": _compile_v(WS), "ws_nohooks": _compile_v(WS + ("DTMK_NO_HOOKS",)), "next": _compile_v(NEXT)}


@pytest.fixture(scope="module")
def ptxs(megakernel_ptx):
    p = megakernel_ptx
    return {"default": p(()), "old": p(OLD), "old_nohooks": p(OLD + ("DTMK_NO_HOOKS",)), "ws": p(WS),
            "next": p(NEXT), "next_nohooks": p(NEXT + ("DTMK_NO_HOOKS",)), "notail": p(NOTAIL)}


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
        same = build.ptx_canonical(a, labels=True) == build.ptx_canonical(b, labels=True)   # (register / label numbering)
        assert same, f"{f} differs between the default and the DTMK_WSTREAM build"


def test_default_is_the_weight_stream_and_the_old_path_has_none(ptxs):
    """Since session 4 the default build IS -DDTMK_WSTREAM (identical PTX);
    -DDTMK_NO_WSTREAM (with or without hooks) has none of its code; the per-operator
    baseline (baseline.cu, which includes mk_ops.cuh) has none either."""
    assert build.ptx_canonical(ptxs["default"]) == build.ptx_canonical(ptxs["ws"])
    for name in ("old", "old_nohooks"):
        for sym in ("cp.async.bulk.shared", "mbarrier", "ws_s", "ws_prestart", "dtmk_ws_stats", "ws_tile"):
            assert sym not in ptxs[name], f"{name} build contains {sym}"
    base = build.nvrtc_compile((build.KERNEL_DIR / "baseline.cu").read_text(), "baseline.cu", "sm_90a", "ptx",
                               ()).decode()
    assert "cp.async.bulk.shared" not in base and "ws_prestart" not in base


def _func(ptx, name):
    body = build.ptx_function(ptx, name)
    assert body, f"{name} not in the PTX"
    return body


@pytest.mark.parametrize("extra", [(), ("DTMK_REC_LATE",), ("DTMK_WS_NST=9", "DTMK_WS_STAGE=16384"),
                                   ("DTMK_WS_NOPRE", "DTMK_WS_XSMEM")])
def test_variant_ptx_shape(megakernel_ptx, ptxs, extra):
    ptx = megakernel_ptx(WS + extra) if extra else ptxs["ws"]
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
    # the launch's default is the kernel's (gpu.ws_ring_default reads mk_ops.cuh's #defines)
    assert (gpu.ws_ring_default("DTMK_WS_NST"), gpu.ws_ring_default("DTMK_WS_STAGE")) == (3, 32768)
    assert gpu.ws_ring_bytes(()) == 3 * 32768 + 128                  # the default streams
    assert gpu.ws_ring_bytes(("DTMK_NO_HOOKS",)) == 3 * 32768 + 128
    assert gpu.ws_ring_bytes(OLD) == gpu.ws_ring_bytes(OLD + ("DTMK_NO_HOOKS",)) == 0
    assert gpu.ws_ring_bytes(WS) == 3 * 32768 + 128
    assert gpu.ws_ring_bytes(WS8) == 8 * 16384 + 128
    assert gpu.ws_ring_bytes(("DTMK_WSTREAM", "DTMK_WS_NST=9", "DTMK_WS_STAGE=16384")) == 9 * 16384 + 128


def _dyn_smem(cfg, B, defines):
    _, _, dyn = gpu.smem_layout(cfg, B, 1, defines)
    return dyn, gpu.ws_ring_for(cfg, B, 1, defines)


@pytest.mark.parametrize("defines", [WS, WS8, ("DTMK_WSTREAM", "DTMK_WS_NST=9", "DTMK_WS_STAGE=16384")])
def test_ring_fits_the_1b_launch(builds, defines):
    """1b batch 1: the ring is added (so the kernel streams) and static + dynamic shared
    memory stays within the 227 KB of an sm_90 block"""
    _, _, static = _resources(builds["ws"][1])
    dyn, ring = _dyn_smem(PRESETS["1b"], 1, defines)
    assert dyn >= ring > 0 and dyn - ring > 0
    assert static + dyn <= SMEM_MAX, (static, dyn)
    assert gpu.WS_SMEM_MAX + static <= SMEM_MAX


def test_carveout_of_1b_builds(builds):
    """1b batch 1: xs holds only a K-slice (gpu.staged_k), and the weight ring has three
    stages, so the hook build fits the 164 KB shared-memory carveout (92 KB of L1) and the
    no-hook build the 132 KB one.  The hook build had 60 KB of L1 with a four-stage ring
    (~2.5% slower off, session 36: docs/results/hooks.md) and 28 KB with 24 KB of unused
    staging (~7%, docs/dev/hook_cost_analysis.md "Session 6")."""
    cfg = PRESETS["1b"]
    assert gpu.staged_k(cfg, 1) == cfg.hidden == cfg.ffn // cfg.split_k
    assert gpu.staged_k(cfg, 2) == max(cfg.hidden, cfg.ffn, cfg.q_dim)     # TP keeps whole rows
    xs_off, xs_cap, dyn = gpu.smem_layout(cfg, 1, 1, ())
    assert xs_cap == cfg.hidden and dyn == 4 * (xs_off + xs_cap) + gpu.ws_ring_bytes(())
    static = {k: _resources(builds[k][1])[2] for k in ("ws", "ws_nohooks")}
    carve = {k: gpu.carveout_kb(v + dyn) for k, v in static.items()}
    print(f"static {static}, dynamic {dyn} -> carveouts {carve}")
    assert carve == {"ws": 164, "ws_nohooks": 132}, (static, dyn, carve)


def test_carveout_kb():
    assert gpu.carveout_kb(0) == 8 and gpu.carveout_kb(7 * 1024) == 8 and gpu.carveout_kb(7 * 1024 + 1) == 16
    assert gpu.carveout_kb(195 * 1024) == 196 and gpu.carveout_kb(195 * 1024 + 1) == 228
    with pytest.raises(Exception, match="227 KB"):
        gpu.carveout_kb(227 * 1024 + 1)


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
    assert gpu.ws_ring_for(one, 1, 1, ()) == 3 * 32768 + 128
    assert gpu.ws_ring_for(one, 4, 1, ()) == 3 * 32768 + 128
    assert gpu.ws_ring_for(one, 8, 1, ()) == 0                       # batch > MK_MAXB
    assert gpu.ws_ring_for(one, 1, 2, ()) == 0                       # tensor parallel: standard lowering
    assert gpu.ws_ring_for(one, 1, 1, OLD) == 0
    std = PRESETS["tiny"]
    assert not std.fuse_norm and std.split_k == 1 and gpu.ws_ring_for(std, 1, 1, ()) == 0
    src = (build.KERNEL_DIR / "mk_ops.cuh").read_text()
    assert re.search(r"#define MK_MAXB (\d+)", src).group(1) == str(gpu.MK_MAXB)


# ---- session 4b: -DDTMK_WS_NEXT, streaming across task boundaries --------------------------
def test_next_compiles_without_new_spills(builds, ptxs):
    """the variant builds to sm_90a cubin (hooks on; no hooks: PTX) with 128 registers at most,
    no spills in the stream functions (ws_next reads its record into shared memory directly:
    a local WsDesc spilled 108 bytes around ptxas' 64-bit division call), and a few bytes more
    static shared memory than the default stream"""
    cubin, log = builds["next"]
    assert cubin[:4] == b"\x7fELF"
    funcs, regs, smem = _resources(log)
    _, _, smem_ws = _resources(builds["ws"][1])
    assert regs <= 128
    for f in ("ws_proj", "ws_gate_up", "ws_prestart", "ws_next"):
        assert _spills(funcs, f)[0] == 0, f"DTMK_WS_NEXT: {f} spills"
    assert smem_ws < smem <= smem_ws + 64, (smem_ws, smem)
    assert ".entry dtmk_megakernel" in ptxs["next_nohooks"]


def _entry(ptx):
    i = ptx.find(".entry dtmk_megakernel")
    assert i >= 0
    return ptx[i:]


def test_next_ptx_shape(megakernel_ptx, ptxs):
    """the default build has none of the variant's code; the variant (and DTMK_WS_NEXT_NOTAIL)
    calls ws_next from the plan loop (the kernel entry) and still starts / completes streams
    in wait_event; NOTAIL without WS_NEXT is refused"""
    for name in ("default", "ws", "old"):
        for sym in ("ws_next", "dtmk_ws_next_stats", "ws_fill", "ws_start_next"):
            assert sym not in ptxs[name], f"{name} build contains {sym}"
    for name in ("next", "next_nohooks", "notail"):
        ptx = ptxs[name]
        assert re.search(r"call[^;]*ws_next", _entry(ptx), re.S), f"{name}: the plan loop does not call ws_next"
        assert "ws_prestart" in _func(ptx, "wait_event")
        assert "dtmk_ws_next_stats" in ptx
        rb = _func(ptx, "run_body")
        assert "ws_proj" in rb and "ws_gate_up" in rb and "bar.red.or" in rb
    assert ptxs["notail"] != ptxs["next"]
    with pytest.raises(build.CompileError, match="DTMK_WS_NEXT_NOTAIL is an option of DTMK_WS_NEXT"):
        megakernel_ptx(("DTMK_WS_NEXT_NOTAIL",))




class _Bad(Exception):
    pass


class _NextRing:
    """One CTA's ring under -DDTMK_WS_NEXT, transliterated from kernels/mk_ops.cuh (ws_issue,
    ws_wait, ws_drop, ws_fill, ws_start, ws_start_next, ws_begin, ws_release, ws_end) and
    megakernel.cu (ws_next, ws_prestart, the plan loop, the kernel end).  Functions are
    generators: every yield is a point where other warps step or copies land."""

    def __init__(self, nst, rnd, warps=16, strict=True, unsound=(), notail=False):
        self.N, self.rnd, self.warps, self.strict, self.unsound = nst, rnd, warps, strict, set(unsound)
        self.notail = notail                  # -DDTMK_WS_NEXT_NOTAIL: releases never issue nd's stages
        self.phase = [0] * nst                # completed phases of each slot's mbarrier
        self.content = [None] * nst           # (stream key, stage) whose bytes the slot holds
        self.inflight = []                    # (global stage, content): issued, not landed
        self.issued, self.done = set(), set()  # done: landed and nobody reads it any more
        self.cnt = [0] * nst
        self.seq = self.top = 0
        self.live = self.nvalid = False
        self.d = self.nd = None               # descriptors: (key, stages)
        self.nchain = self.nearly = self.npre = self.nmiss = 0

    # ---- the hardware: copies, mbarrier parity waits ----
    def issue(self, desc, g, j):
        s = g % self.N
        if self.strict:
            if g in self.issued:
                raise _Bad(f"stage {g} issued twice")
            if g >= self.N and g - self.N not in self.done:
                raise _Bad(f"stage {g} issued into slot {s} before stage {g - self.N} was done with")
        self.issued.add(g)
        self.inflight.append((g, (desc[0], j)))

    def land(self, i):
        g, c = self.inflight.pop(i)
        self.content[g % self.N] = c
        self.phase[g % self.N] += 1

    def wait(self, g):
        # mbarrier.try_wait.parity(P): true once the phase of parity P completed (current parity != P)
        while ((g // self.N) & 1) == (self.phase[g % self.N] & 1):
            yield "spin"

    # ---- mk_ops.cuh ----
    def drop(self):
        if not self.live:
            return
        for g in range(self.seq, self.top):
            yield from self.wait(g)
            self.done.add(g)
        self.seq, self.live = self.top, False

    def fill(self):
        na = self.d[1]
        end = min(self.N, na + (self.nd[1] if self.nvalid else 0))
        if "no_fill" in self.unsound:
            end = min(self.N, na)
        for x in range(self.top - self.seq, end):
            a = x < na
            self.issue(self.d if a else self.nd, self.seq + x, x if a else x - na)
            yield "step"
        if self.top - self.seq < end:
            self.top = self.seq + end

    def start(self, desc):
        self.d, self.live = desc, True
        yield from self.fill()

    def start_next(self):
        self.d, self.nvalid, self.live = self.nd, False, True
        self.nearly += 1
        yield from self.fill()

    def begin(self, desc):
        hit = self.live and self.d == desc
        full = min(self.N, desc[1] + (self.nd[1] if self.nvalid else 0))
        if "no_fill" in self.unsound:
            full = 0
        if not hit or self.top - self.seq < full:
            if not hit:
                yield from self.drop()
                yield from self.start(desc)
                self.nmiss += 1
            else:
                yield from self.fill()

    def consume(self, desc, w):
        """warp w of ws_tile (every stage, in order) with ws_release"""
        g0, nst = self.seq, desc[1]
        for j in range(nst):
            g = g0 + j
            s = g % self.N
            yield from self.wait(g)
            if self.content[s] != (desc[0], j):
                raise _Bad(f"warp {w} read slot {s} holding {self.content[s]} as {(desc[0], j)} (stage {g})")
            yield "step"                                      # computing its rows from the slot
            if self.content[s] != (desc[0], j):
                raise _Bad(f"slot {s} overwritten while warp {w} read stage {g}")
            self.cnt[s] += 1
            c = self.cnt[s]
            last = c == self.warps
            if last:
                self.cnt[s] = 0
                self.done.add(g)
            yield "step"
            k = j + self.N
            a = k < nst
            if not a:
                k -= nst
            # unsound "chain_first": the next stream's stages go out when the FIRST warp is done
            # with the slot's stage (others may still read it), not the 16th
            trigger = c == 1 if ("chain_first" in self.unsound and not a) else last
            if self.notail and not a:
                trigger = False
            if trigger and (a or (self.nvalid and k < self.nd[1])):
                self.issue(desc if a else self.nd, g + self.N, k)
                yield "step"

    def end(self, desc):
        s = self.seq + desc[1]
        self.seq = s
        if self.nvalid:
            self.d, self.nvalid, self.live = self.nd, False, True
            # NOTAIL: only what ws_fill issued (possibly nothing: live with top == seq)
            self.top = max(self.top, s) if self.notail else s + min(self.N, self.d[1])
            self.nchain += 1
        else:
            self.live, self.top = False, s

    # ---- megakernel.cu ----
    def ws_next(self, pred):
        if self.nvalid and "renext" not in self.unsound:
            yield from self.drop()
        self.nd, self.nvalid = pred, pred is not None

    def prestart(self, pred):
        if pred is not None:
            if self.live and self.d == pred:
                yield from self.fill()
                return
            yield from self.drop()
            yield from self.start(pred)
        else:
            if not self.nvalid:
                return
            yield from self.drop()
            yield from self.start_next()
        self.npre += 1


def _schedule(ring, agents, rnd):
    """step the agents (generators) and land copies in random order until the agents finish"""
    agents = list(agents)
    spins = 0
    while agents:
        n_land = len(ring.inflight)
        i = rnd.randrange(n_land + len(agents))
        if i < n_land:
            ring.land(i)
            spins = 0
            continue
        a = agents[i - n_land]
        try:
            r = next(a)
        except StopIteration:
            agents.remove(a)
            spins = 0
            continue
        if r == "spin":
            spins += 1
            if not ring.inflight and spins > 40 * len(agents) + 40:
                raise _Bad("deadlock: every warp waits for a stage nobody issued")
        else:
            spins = 0


def _run_next(nst_ring, plan, steps, seed, nopre=False, p_abort=0.0, unsound=(), strict=True, warps=16,
              notail=False):
    """plan: per task (body stream, predicted stream): (key, stages) or None; the worker runs
    it `steps` times in one launch.  Returns (None, counters) or (what went wrong, None)."""
    rnd = random.Random(seed)
    ring = _NextRing(nst_ring, rnd, warps=warps, strict=strict, unsound=unsound, notail=notail)
    inst = [task for _ in range(steps) for task in plan]
    try:
        for i, (body, pred) in enumerate(inst):
            nxt = inst[i + 1][1] if i + 1 < len(inst) else None
            _schedule(ring, [ring.ws_next(nxt)], rnd)                 # warp 1, plan loop
            if not nopre:
                _schedule(ring, [ring.prestart(pred)], rnd)           # warp 1, wait_event
            if rnd.random() < p_abort:
                break                                                 # the wait aborted
            if body is not None:
                _schedule(ring, [ring.begin(body)], rnd)              # warp 0 after the barrier
                _schedule(ring, [ring.consume(body, w) for w in range(warps)], rnd)
                ring.end(body)                                        # thread 0 after a barrier
        _schedule(ring, [ring.drop()], rnd)                           # the kernel end
        if ring.inflight:
            raise _Bad(f"the CTA exits with stages {sorted(g for g, _ in ring.inflight)} in flight")
    except _Bad as e:
        return str(e), None
    return None, dict(chain=ring.nchain, early=ring.nearly, pre=ring.npre, miss=ring.nmiss, stages=ring.seq)


def _next_counts(covered):
    """(chained, started early, started by the wait) for a worker running the static tasks
    `covered` (flags: has a stream) back to back in one launch, predictions right: a streamed
    task after a streamed one is chained (ws_end), after an unstreamed one started early (that
    task's ws_prestart), the launch's first one started by its own wait (ws_prestart)"""
    chain = early = pre = 0
    for i, c in enumerate(covered):
        if not c:
            continue
        if i == 0:
            pre += 1
        elif covered[i - 1]:
            chain += 1
        else:
            early += 1
            pre += 1
    return chain, early, pre


# 1b-like worker plans (stages per stream at 4 x 32 KB): a layer's qkv / rope / attention /
# attn_o / gate_up / down; four lm_head tiles and the argmax; tiny fused's short streams; one
# task per step (the next step's copy of the same task follows it)
_PLANS = {
    "layer": [("qkv", 8), None, None, ("o", 2), ("gu", 16), ("down", 8)],
    "lm_head": [("l0", 8), ("l1", 8), ("l2", 8), ("l3", 8), None],
    "short": [("a", 1), ("b", 2), None, ("c", 3), ("d", 1), ("e", 1)],
    "one": [("x", 8)],
    "long": [("gu0", 33), ("gu1", 16)],
}


@pytest.mark.parametrize("notail", [False, True])
@pytest.mark.parametrize("nst_ring", [1, 4, 8, 9])
@pytest.mark.parametrize("plan", sorted(_PLANS))
def test_next_protocol_sound(nst_ring, plan, notail):
    """random interleavings of the 16 warps, the copies' landings and the control warps: every
    wait reads its own stage, no slot is refilled before its stage is done with, no deadlock,
    no copy in flight at the kernel end; the counters are the rule the GPU test checks"""
    tasks = [(d, d) for d in _PLANS[plan]]
    steps = 3
    chain, early, pre = _next_counts([d is not None for d in _PLANS[plan]] * steps)
    for seed in range(12):
        err, c = _run_next(nst_ring, tasks, steps, seed, notail=notail)
        assert err is None, (plan, seed, err)
        assert (c["chain"], c["early"], c["pre"], c["miss"]) == (chain, early, pre, 0), c
        assert c["stages"] == steps * sum(d[1] for d in _PLANS[plan] if d)


def test_next_protocol_sound_with_mispredictions_and_aborts():
    """random plans with wrong predictions (a body with another stream than ws_task_desc said,
    or none), aborted waits, the wait's start off (DTMK_WS_NOPRE), rings of 1..9 slots, with
    and without the tail chaining (DTMK_WS_NEXT_NOTAIL)"""
    for seed in range(300):
        rnd = random.Random(1000 + seed)
        keys = [(f"k{i}", rnd.choice([1, 2, 3, 5, 8, 16, 33])) for i in range(4)]
        plan = []
        for _ in range(rnd.randint(1, 6)):
            body = rnd.choice(keys + [None])
            plan.append((body, body if rnd.random() > 0.25 else rnd.choice(keys + [None])))
        n = rnd.choice([1, 2, 4, 8, 9])
        err, _ = _run_next(n, plan, rnd.randint(1, 3), seed, nopre=rnd.random() < 0.3, p_abort=0.05,
                           notail=seed % 2 == 1)
        assert err is None, (seed, n, plan, err)


def test_next_model_catches_unsound_orderings():
    """the model is not vacuous (no oracle: what the hardware would do): (1) not giving a short
    stream's free slots to the next stream while ws_end still counts them issued leaves a hole
    (deadlock); (2) chaining when the FIRST warp is done with a stage (not the 16th) overwrites
    a slot others still read; (3) ws_next changing the next stream without first waiting for
    the stages issued for the old one makes a later stream read them as its own"""
    layer = [(d, d) for d in _PLANS["layer"]]
    for unsound, tasks in (("no_fill", layer), ("chain_first", layer),
                           ("renext", [(("a", 1),) * 2, (None, ("b", 3)), (("b", 3),) * 2, (("c", 2),) * 2])):
        bad = [_run_next(4, tasks, 2, seed, unsound=(unsound,), strict=False)[0] for seed in range(10)]
        assert any(b is not None for b in bad), unsound
        ok = [_run_next(4, tasks, 2, seed)[0] for seed in range(10)]
        assert all(b is None for b in ok), (unsound, ok)


# ---- session 23: -DDTMK_PHASE_PROF, where a streamed tile's body goes (bench/level_profile.py) ----
PHASE = ("DTMK_PHASE_PROF",)


def test_phase_prof_is_measurement_only(megakernel_ptx, ptxs):
    """the profile's counters exist only in its build (hooks on and off); the body's ops and
    ws_wait / ws_tile_xr / ws_end read clock64 there; a build without the stream is refused"""
    for name in ("default", "ws", "old", "next"):
        assert "dtmk_phase_prof" not in ptxs[name], name
    for defs in (PHASE, PHASE + ("DTMK_NO_HOOKS",)):
        ptx = megakernel_ptx(defs)
        assert ".global .align 8 .b8 dtmk_phase_prof[400];" in ptx, defs      # 5 ops x PH_N u64
        assert "%clock64" in _func(ptx, "ws_gate_up") and "%clock64" in _func(ptx, "ws_proj")
        assert "dtmk_phase_prof" in _entry(ptx)           # the kernel end's flush
    with pytest.raises(build.CompileError, match="DTMK_PHASE_PROF profiles the weight stream's tiles"):
        megakernel_ptx(PHASE + OLD)


def test_phase_prof_layout_is_the_benchs():
    """bench/level_profile.py names the kernel's ops in the kernel's enum order and reads
    PH_N counters per op (one layout, two readers: checked against the source)"""
    import importlib.util
    from pathlib import Path
    src = (build.KERNEL_DIR / "mk_ops.cuh").read_text()
    ops = re.search(r"enum \{ (PH_[A-Z_, ]+) \};", src).group(1).replace(" ", "").split(",")
    n = int(re.search(r"#define PH_N (\d+)", src).group(1))
    spec = importlib.util.spec_from_file_location(
        "_lp", Path(build.KERNEL_DIR).parent / "bench" / "level_profile.py")
    lp = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(lp)
    assert ops[-1] == "PH_OPS" and len(ops) - 1 == lp.PH_OPS == len(lp.PH_OPS_NAMES)
    assert [o[3:].lower() for o in ops[:-1]] == ["qkv", "lm", "gu", "attno", "down"]
    assert lp.PH_OPS_NAMES == ("qkv", "lm_head", "mlp_gate_up", "attn_o", "mlp_down")
    assert lp.PH_N == n
    # counters -> us per tile at 1.98 GHz: 2 gate/up tiles, 19800 cycles of stream = 5 us each
    v = [0] * (lp.PH_OPS * n)
    g = 2 * n
    v[g + 0], v[g + 2], v[g + 3], v[g + 4], v[g + 5], v[g + 7], v[g + 8] = 2, 19800, 3960, 32, 4, 7920, 1980
    rows = lp.phase_rows(v, steps=1)
    assert list(rows) == ["mlp_gate_up"]
    r = rows["mlp_gate_up"]
    assert r["tiles_per_step"] == 2 and r["stream_us"] == pytest.approx(5.0) and r["spin_us"] == pytest.approx(1.0)
    assert r["waits_per_tile"] == 16 and r["spinning_waits_per_tile"] == 2
    assert r["rows_us"] == pytest.approx(2.0) and r["release_us"] == pytest.approx(0.5) and r["end_bar_us"] == 0

