"""What a reference-megakernel build is made of, host side: its -D defines, the NVRTC
compile and disk cache, the kernel's parameter / control / queue / record layouts, the
per-worker shared-memory plan, the packed task tables and the device probes.
dtrace_mk/megakernel/gpu.py (the launcher) runs what this module describes.

Compilation needs no build step: `compile_source()` runs NVRTC (cuda.bindings.nvrtc)
on kernels/megakernel.cu for sm_90a (cubin) or to LTO-IR, caching the output on disk
under $DTRACE_MK_CACHE (default ~/.cache/dtrace_mk/kernels) by a hash of the sources,
options and NVRTC version.  The CI test compiles without a GPU.
"""
from __future__ import annotations

import functools
import hashlib
import os
import re
import time
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..abi import definition as abi
from ..errors import UserError
from .graph import CLASS_IDS, TaskGraph, fused_aux, fused_lowering, tp_shard
from .reference import dense_index, moe_index

from ..kernels import KERNEL_DIR  # the CUDA sources, installed as package data
from ..kernels import build

MK_THREADS = 512               # threads of a worker CTA, every build (kernels/mk_common.cuh)
MK_MAXB = 4                    # batch rows per matvec register block (kernels/mk_ops.cuh)
MK_WARPS = MK_THREADS // 32
TREC_WORDS = 16
SMEM_LIMIT = 200 * 1024        # dynamic shared memory per worker CTA (H200: up to 227 KB)
TRACE_BYTES = 32
WS_SMEM_MAX = 190 * 1024       # dynamic smem with the weight-stream ring: 227 KB less ~37 KB static (site-form build)


def site_form(defines) -> bool:
    """Whether a megakernel build runs site-form slots (aggregation descriptors) at its
    hook sites: -DDTMK_SITE_FORM (kernels/megakernel.cu HK_SITE_FORM; the compiled tier's
    linked kernels have it too)."""
    return "DTMK_SITE_FORM" in tuple(defines)


def lean_site(defines) -> bool:
    """Whether a megakernel build runs lean programs at its hook sites: -DDTMK_LEAN_SITE
    (kernels/megakernel.cu HK_LEAN; bench variant lean): descriptor programs whose keys
    have dense domains (runtime/descform.py lean_layout) update per-worker cells."""
    return "DTMK_LEAN_SITE" in tuple(defines)


def runs_descriptors(defines) -> bool:
    """Whether a build runs descriptor programs (runtime/aggdesc.py) anywhere: at its hook
    sites (site_form) or, -DDTMK_OBS_SM -DDTMK_OSQ_DESC, on its observer SMs from the
    records, into each observer warp's shadow (kernels/mk_observer.cuh osq_desc_records)."""
    d = tuple(defines)
    return site_form(d) or ("DTMK_OBS_SM" in d and "DTMK_OSQ_DESC" in d)


# Field order of struct MkParams (kernels/mk_ops.cuh); tests check they agree.
PARAM_FIELDS: Tuple[str, ...] = (
    "hidden", "n_layers", "n_heads", "n_kv_heads", "head_dim", "ffn", "vocab", "max_seq",
    "n_experts", "top_k", "expert_ffn", "batch", "qkv_dim", "tile_n", "xs_off", "xs_cap",
    "rms_eps_bits", "rope_theta_bits",
    "w_embed", "w_attn_norm", "w_qkv", "w_o", "w_mlp_norm", "w_gate", "w_up", "w_down",
    "w_router", "w_egate", "w_eup", "w_edown", "w_final_norm", "w_lm_head",
    "h", "xn", "qkv", "attn", "act", "k_cache", "v_cache", "logits", "tile_max", "tile_arg", "moe_part",
    "route_expert", "route_weight",
    "tokens", "pos", "req_gen", "req_len", "out_tokens", "n_out_steps", "req_seed", "req_min", "req_span",
    "tasks", "n_tasks", "events", "event_triggers", "n_events", "plan_off", "plan_tasks", "n_workers",
    "step_event",
    "moe", "n_moe", "dyn_items", "dyn_head", "dyn_tail", "dyn_cap",
    "step0", "n_steps",
    "control", "hook_ring", "hook_head", "hook_cap", "trace_ring", "trace_head", "trace_cap",
    "worker_state", "faults", "n_faults", "rank", "queue_threshold", "filler_ns", "prefetch",
    "ranks", "tp_peers", "tp_part", "tp_recv", "ev_comm_op",
    "resident", "hook_tail", "hook_drop", "steps_done",
    "handoff_in",
)

# control words (megakernel.cu CTL_*)
CTL_HOOK_MASK, CTL_TRACE, CTL_ABORT, CTL_REFRESH, CTL_WD_US, CTL_ABORT_WORKER = range(6)
CTL_GEN, CTL_TABLES, CTL_OBS, CTL_STAMP, CTL_WORDS = 7, 8, 10, 12, 32
CTL_GATE = 14                  # resident launches: steps < grant run; GATE_STOP: end at the grant
CTL_GEN_DUE = 16               # resident launches: the step whose gate must load the tables of CTL_GEN
ABORT_LEAVE = 6                # control[CTL_ABORT]: the lean grid stops for a grid handoff (the hook grid runs on)
WS_LEFT = 6                    # worker_state WS_STATE: stopped for a handoff, exited (megakernel.cu)
CTL_SM_MAP = 18                # -DDTMK_SM_WORKER: u64 address of int32 map[smid] -> worker (0 = block order)
CTL_OBSQ = 20                  # -DDTMK_OBS_SM: u64 address of the observer queues (megakernel.cu "observer SM")
#: -DDTMK_OBS_SM (opt-in; megakernel.cu "observer SM"): the observer queues' layout -- per
#: worker 64 bytes of words and OSQ_N 128-byte entries (megakernel.cu OSQ_*; -DDTMK_OSQ_N=K,
#: a power of two 16..1024, another depth: osq_depth_of)
OSQ_N = 64
OSQ_N_MIN, OSQ_N_MAX = 16, 1024


def osq_w_bytes(depth: int = OSQ_N) -> int:
    """A worker's observer-queue area: 64 bytes of words and `depth` 128-byte entries."""
    return 64 + depth * 128


OSQ_W_BYTES = osq_w_bytes()
#: -DDTMK_OSQ_SPLIT (opt-in; megakernel.cu OSQ_SPLIT_NH, mk_obs_sm.cuh osq_builder / osq_drainer):
#: after the workers' areas a u64 build cursor per worker (rounded up to 128 bytes), then per
#: builder / drainer pair 128 bytes of words and OSQ_SPLIT_NH blocks of a 512-byte header and
#: OBS_RING 128-byte records
OSQ_SPLIT_NH, OSQ_BLK_HDR, OBS_RING = 4, 512, 96
OSQ_PAIR_BYTES = 128 + OSQ_SPLIT_NH * (OSQ_BLK_HDR + OBS_RING * 128)


def osq_split_bytes(n_workers: int, obs_sms: int, warps: int) -> int:
    """The handoff area of a -DDTMK_OSQ_SPLIT build: the build cursors and a pair per warp of
    the building half of the observer SMs (`warps` per SM at most)."""
    return ((n_workers * 8 + 127) & ~127) + (obs_sms // 2) * warps * OSQ_PAIR_BYTES
#: the observer SM's warps at most (kernels/mk_obs_sm.cuh DTMK_OBS_SM_WARPS; a launch runs as
#: many as its dynamic shared memory holds an Obs for: 1b 5 (6 with session 35's 4-stage ring), tiny 1)
OBS_SM_WARPS_MAX = 8
#: the defines of the observer SM (hook code: a handoff job's lean build leaves them out; the
#: compiled tier's linked build passes them on: runtime/compiled/link.py MK_PASS_DEFINES)
OBS_SM_DEFINES = ("DTMK_OBS_SM", "DTMK_OBS_SM_WARPS", "DTMK_OSQ_STATS", "DTMK_OSQ_PUSH_INLINE", "DTMK_OSQ_DISCARD",
                  "DTMK_OSQ_NOPUSH", "DTMK_OSQ_PEND_LATE", "DTMK_OSQ_NORAISE",
                  "DTMK_OSQ_BURN", "DTMK_OSQ_FENCES", "DTMK_OSQ_ATOMS", "DTMK_OSQ_LOADS", "DTMK_OSQ_LAZY_PUB",
                  "DTMK_OSQ_NOVM", "DTMK_OSQ_NOLOW", "DTMK_OSQ_SCATTER",
                  "DTMK_OSQ_AREA_CTL", "DTMK_OSQ_NOMAPS", "DTMK_OSQ_DESC",
                  "DTMK_OSQ_NOFLUSH", "DTMK_OSQ_DEFER",
                  "DTMK_OSQ_PAGES", "DTMK_OSQ_ICODE", "DTMK_OSQ_MULTI", "DTMK_OSQ_N", "DTMK_OSQ_IDLE_DRAIN",
                  "DTMK_OSQ_SPLIT",
                  # session 54's measurement builds: the capture split, the workers' own shadow, the
                  # first-look call and the uncapped raise as before, the wait's flush later / inline
                  "DTMK_OSQ_NOPRE", "DTMK_OSQ_NOHOLD", "DTMK_OSQ_NOWAITCAP", "DTMK_OSQ_WSHADOW",
                  "DTMK_OSQ_LOOK_CALL", "DTMK_OSQ_RAISE_UNCAPPED", "DTMK_OSQ_DEFER_AFTER", "DTMK_OSQ_DEFER_INLINE",
                  # session 62: the shadow's updates in the waits' failed polls (it and the shadow also
                  # build without the observer SM: hook code either way, so a lean grid drops them)
                  "DTMK_OSQ_WSHADOW_DEFER")
#: -DDTMK_OBS_SMS=M: M observer SMs (default 1; the lean grid takes it too, to leave them free)
OBS_SMS_MAX = 8


#: the observer SMs of `--observer sm` (serve, top) when --observer-sms is not given.  H200,
#: 1b, hot summary (session 16, tools/obs_sm_probe.py): three SMs' 18 warps still found a
#: worker's queue full 209 times per 16-step launch, four SMs' 24 warps never did.
OBS_SMS_DEFAULT = 4
#: entries a worker of `--observer sm` stages before storing them at once (-DDTMK_OSQ_DEFER;
#: kernels/mk_observer.cuh osq_defer_flush: it stores them at its next failed poll anyway, so
#: 16 -- more than a level's tasks on one worker -- leaves every push to the level's wait;
#: H200 1b hot summary over plain, bench/obs_split.py session 25: 16 +5.2 / +6.9 / +7.6%
#: beside 4's +6.9 / +7.2 / +7.7%, within the spread; session 24: 1 +13.3 / +12.9% beside
#: 4's +9.5 / +9.5%)
OSQ_DEFER_DEFAULT = 16


def observer_defines(observer: str, sms: Optional[int] = None) -> Tuple[str, ...]:
    """The megakernel defines of a CLI --observer choice: "workers" -> none; "sm" -> the
    observer-SM build with `sms` observer SMs (--observer-sms; default OBS_SMS_DEFAULT) and
    the lazy entry publish (-DDTMK_OSQ_LAZY_PUB; H200, session 17, bench/hooks.py hot
    summary over no hooks: tiny +14.7% vs +25.0% without it, 1b +15.0% vs +16.5%), its
    entries staged in shared memory and stored by the next failed poll (-DDTMK_OSQ_DEFER=
    OSQ_DEFER_DEFAULT; sessions 24-25, bench/obs_split.py 1b hot summary over plain: DEFER=4
    +9.5 / +9.5% vs lazy's +12.0..12.8% in two runs; DEFER=16 and 4 within the spread)."""
    if observer == "workers":
        if sms is not None:
            raise UserError("--observer-sms: only with --observer sm")
        return ()
    if observer != "sm":
        raise UserError(f"--observer: expected workers or sm, got {observer!r}")
    m = OBS_SMS_DEFAULT if sms is None else int(sms)
    if not 1 <= m <= OBS_SMS_MAX:
        raise UserError(f"--observer-sms: want 1..{OBS_SMS_MAX} observer SMs, got {m}")
    return (("DTMK_OBS_SM",) + ((f"DTMK_OBS_SMS={m}",) if m > 1 else ())
            + ("DTMK_OSQ_LAZY_PUB", f"DTMK_OSQ_DEFER={OSQ_DEFER_DEFAULT}"))


def define_value(defines: Sequence[str], name: str) -> Optional[str]:
    """The value of -D`name`=value among `defines` ("" for a bare name); None without it."""
    for d in defines:
        key, _, val = d.partition("=")
        if key == name:
            return val
    return None


def osq_depth_of(defines: Sequence[str]) -> int:
    """The entries of each worker's observer queue in an observer-SM build (-DDTMK_OSQ_N=K;
    OSQ_N without it): the host allocates osq_w_bytes(K) per worker (megakernel.cu OSQ_W_BYTES)."""
    val = define_value(defines, "DTMK_OSQ_N")
    if val is None:
        return OSQ_N
    k = int(val) if val.isdigit() else 0
    if not OSQ_N_MIN <= k <= OSQ_N_MAX or k & (k - 1):
        raise UserError(f"DTMK_OSQ_N={val}: want a power of two {OSQ_N_MIN}..{OSQ_N_MAX}")
    return k


def obs_sms_of(defines: Sequence[str]) -> int:
    """The observer SMs an observer-SM build runs (-DDTMK_OBS_SMS=M; 1 without it)."""
    val = define_value(defines, "DTMK_OBS_SMS")
    if val is None:
        return 1
    if not val.isdigit() or not 1 <= int(val) <= OBS_SMS_MAX:
        raise UserError(f"DTMK_OBS_SMS={val}: want an integer 1..{OBS_SMS_MAX}")
    return int(val)


HO_WORDS = 16                  # grid handoff: recorded words per resumed worker (megakernel.cu "grid handoff")
GATE_STOP = 1 << 31
# observer state words per worker (megakernel.cu OBS_*)
OBS_NAMES = ("pending", "drained", "lost", "gen", "loaded_ts", "first_ts", "done", "drains")
OBS_WORDS = len(OBS_NAMES)
OBS_NONE = (1 << 64) - 1
WS_NAMES = ("task", "step", "event", "value", "target", "state", "ts", "done")
WS_STATES = {0: "idle", 1: "running", 2: "waiting", 3: "done", 4: "watchdog", 5: "stopped",
             WS_LEFT: "left (grid handoff)"}

TRACE_DTYPE = np.dtype([("t_dispatch", "<u8"), ("wait_ns", "<u4"), ("dur_ns", "<u4"),
                        ("task_index", "<u4"), ("step", "<u4"), ("sm", "<u2"), ("worker", "<u2"),
                        ("flags", "<u2"), ("cls", "<u2")])
assert TRACE_DTYPE.itemsize == TRACE_BYTES

CTX_DTYPE = np.dtype([(f.name, "<u8" if f.ctype == "u64" else "<u4") for f in abi.CONTEXT_FIELDS])
assert CTX_DTYPE.itemsize == abi.CONTEXT_SIZE


# ---------------------------------------------------------------------------------
# NVRTC
# ---------------------------------------------------------------------------------

CompileError = build.CompileError


def lineinfo_options(target: str) -> tuple:
    """("-lineinfo",) for a cubin when $DTRACE_MK_LINEINFO=1 (profiling: Nsight Compute and
    tools/ncu_footprint.py then attribute each instruction to its source line; NVRTC emits
    the same SASS with it, checked on the 1b no-hook and observer builds in session 30)."""
    return ("-lineinfo",) if target == "cubin" and os.environ.get("DTRACE_MK_LINEINFO") == "1" else ()


def source_hash(arch: str, target: str, defines: Sequence[str] = (), name: str = "megakernel.cu") -> str:
    h = hashlib.sha256()
    for src in build.include_closure(name, KERNEL_DIR):
        h.update(src.encode() + b"\0" + (KERNEL_DIR / src).read_bytes() + b"\0")
    h.update(f"{arch}|{target}|{'|'.join(defines)}".encode())
    h.update(build.nvrtc_version().encode())
    for opt in lineinfo_options(target):
        h.update(opt.encode())
    return h.hexdigest()[:24]


cache_dir = build.cache_dir


def compile_source(arch: str = "sm_90a", target: str = "cubin", defines: Sequence[str] = (),
                   use_cache: bool = True, name: str = "megakernel.cu") -> bytes:
    """Compile kernels/<name> with NVRTC to 'cubin' (arch sm_XX[a]) or 'ltoir'.

    Cached on disk by source hash; raises CompileError with NVRTC's log."""
    key = source_hash(arch, target, defines, name) + "_" + name.replace(".", "_")
    path = cache_dir() / f"{key}.{target}"
    cached = use_cache and path.exists()
    if os.environ.get("DTRACE_MK_BUILD_LOG"):
        log_build(arch, target, defines, name, cached)
    if cached:
        return path.read_bytes()
    out = build.nvrtc_compile((KERNEL_DIR / name).read_text(), name, arch, target, defines,
                              options=lineinfo_options(target))
    if use_cache:
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_bytes(out)
        tmp.replace(path)
    return bytes(out)


def log_build(arch: str, target: str, defines: Sequence[str], name: str, cached: bool) -> None:
    """One line of JSON per compile_source request to $DTRACE_MK_BUILD_LOG (GPU sessions
    set it: tools/kcache.py --log builds exactly what a plan's tests asked for)."""
    import json
    line = json.dumps({"arch": arch, "target": target, "name": name, "defines": list(defines),
                       "cached": bool(cached)})
    with open(os.environ["DTRACE_MK_BUILD_LOG"], "a") as f:
        f.write(line + "\n")


def cubin_file(cubin: bytes, tag: str):
    """A cubin as a file in the cache (named by its hash and `tag`), for RawModule(path=):
    written once, atomically (processes of one machine share the cache)."""
    path = cache_dir() / f"{hashlib.sha256(cubin).hexdigest()[:24]}_{tag}.cubin"
    if not path.exists():
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_bytes(cubin)
        tmp.replace(path)
    return path


def load_module(arch: str, name: str, defines: Sequence[str] = ()):
    """cupy.RawModule of kernels/<name> compiled (or cached) for arch (with -D defines)."""
    import cupy as cp
    cubin = compile_source(arch, "cubin", defines=tuple(defines), name=name)
    return cp.RawModule(path=str(cubin_file(cubin, f"{name.replace('.', '_')}.loaded")))


def _compile_job(job):
    """(spawned process) one precompile() build: (seconds, None) or (seconds, the error)."""
    arch, defines = job
    t0 = time.perf_counter()
    try:
        compile_source(arch, "cubin", defines=defines)
    except Exception as e:  # noqa: BLE001 - reported per build by the caller
        return time.perf_counter() - t0, e
    return time.perf_counter() - t0, None


def precompile(define_sets, arch: str = "sm_90a", workers: Optional[int] = None) -> Dict[tuple, tuple]:
    """NVRTC-compile megakernel.cu for each set of defines in parallel processes (one build
    is ~15-25 s on one core) into the disk cache, so Megakernel constructors load them.
    Returns {defines: (seconds, None or the exception)}; the tuple order is the cache key's."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor
    jobs = sorted({tuple(d) for d in define_sets})
    if not jobs:
        return {}
    n = workers or min(len(jobs), max(1, (os.cpu_count() or 2) - 1))
    with ProcessPoolExecutor(n, mp_context=multiprocessing.get_context("spawn")) as ex:
        return dict(zip(jobs, ex.map(_compile_job, [(arch, d) for d in jobs])))


@functools.lru_cache(maxsize=None)
def ws_ring_default(name: str) -> int:
    """The value kernels/mk_ops.cuh gives DTMK_WS_NST / DTMK_WS_STAGE when a build does not
    (its `#define`, read from the source: the one place the ring's default shape is set)."""
    m = re.search(rf"^#define {name} (\d+)$", (KERNEL_DIR / "mk_ops.cuh").read_text(), re.M)
    if not m:
        raise RuntimeError(f"kernels/mk_ops.cuh: no '#define {name} N' (the weight ring's default)")
    return int(m.group(1))


def ws_ring_bytes(defines: Sequence[str]) -> int:
    """Dynamic shared memory the megakernel's weight-streaming ring needs (kernels/mk_ops.cuh
    ws_init: DTMK_WS_NST stages of DTMK_WS_STAGE bytes -- 3 and 32768 unless the build says
    otherwise, ws_ring_default -- plus 128 bytes of alignment; on by default since session 4);
    0 for a -DDTMK_NO_WSTREAM build."""
    if define_value(defines, "DTMK_NO_WSTREAM") is not None:
        return 0
    return (int(define_value(defines, "DTMK_WS_NST") or ws_ring_default("DTMK_WS_NST"))
            * int(define_value(defines, "DTMK_WS_STAGE") or ws_ring_default("DTMK_WS_STAGE")) + 128)


def ws_ring_for(cfg, batch: int, ranks: int, defines: Sequence[str]) -> int:
    """The ring a Megakernel of this graph gets (bytes; 0 = none, the kernel keeps the old
    matvec path): only graphs with streamed tiles -- the fused / split-K lowering on one
    rank at batch <= MK_MAXB (4), kernels/mk_ops.cuh -- since an unused ring still takes
    shared memory from the L1 carveout (1b's standard lowering ran 1946 -> 2334 us/step
    with an idle ring, H200, 2026-11-30)."""
    if ranks > 1 or batch > MK_MAXB or not (cfg.fuse_norm or cfg.split_k > 1):
        return 0
    return ws_ring_bytes(defines)


def megakernel_defines(cfg, ranks: int, defines: Sequence[str] = ()) -> Tuple[str, ...]:
    """The -D defines megakernel.cu is built with for this model: the caller's, plus
    DTMK_ROPE_IN_ATTN for rope_in_attn graphs (their attn tasks rope, graph.fused_aux) and
    DTMK_H_PARITY for slice_events graphs (h is two buffers by layer parity, graph.py "Fused
    norm and split-K").  Precompile with these to hit the cache the Megakernel loads from."""
    out = tuple(defines)
    if fused_lowering(cfg, ranks) and cfg.rope_in_attn and "DTMK_ROPE_IN_ATTN" not in out:
        out += ("DTMK_ROPE_IN_ATTN",)
    if h_buffers(cfg, ranks) == 2 and "DTMK_H_PARITY" not in out:
        out += ("DTMK_H_PARITY",)
    return out


def h_buffers(cfg, ranks: int) -> int:
    """How many residual buffers h the kernel addresses: 2 for slice_events graphs (by layer
    parity, kernels/mk_ops.cuh mk_hbuf), else 1."""
    return 2 if fused_lowering(cfg, ranks) and cfg.slice_events else 1


def staged_k(cfg, ranks: int) -> int:
    """The longest activation row a task stages in shared memory (xs, kernels/mk_ops.cuh).
    The fused lowering's attn_o / mlp_down tasks stage only their K-slice (ffn / split_k),
    so 1b needs hidden = 2048 floats per slot instead of ffn = 8192.  Sizing xs to it is
    what keeps 1b's hook build in the same L1 carveout as the no-hook build: 24 KB of
    unused staging put the hook build's ~197 KB over the 196 KB carveout, leaving 28 KB
    of L1 for the kernel's spills (docs/dev/hook_cost_analysis.md "Session 6")."""
    if fused_lowering(cfg, ranks):
        S = max(cfg.split_k, 1)
        return max(cfg.hidden, -(-cfg.q_dim // S), -(-cfg.ffn // S))
    return max(cfg.hidden, cfg.ffn, cfg.q_dim)


def smem_layout(cfg, batch: int, ranks: int, defines: Sequence[str]) -> Tuple[int, int, int]:
    """(xs_off, xs_cap, bytes) of a worker's dynamic shared memory: task scratch (floats),
    then the activation staging area xs (floats), then the weight-stream ring when it fits
    (else the kernel keeps the old path, mk_ops.cuh ws_init)."""
    base = max(cfg.max_seq + MK_WARPS + MK_THREADS, batch * max(cfg.n_experts, 1) + 8,
               batch * cfg.tile_n + 2 * batch + 8, 2 * MK_WARPS + 4) + 64
    xs_off = (base + 3) // 4 * 4
    xs_cap = int(min(batch * staged_k(cfg, ranks), SMEM_LIMIT // 4 - xs_off))
    nbytes = 4 * (xs_off + xs_cap)
    ring = ws_ring_for(cfg, batch, ranks, defines)
    return xs_off, xs_cap, nbytes + ring if nbytes + ring <= WS_SMEM_MAX else nbytes


#: sm_90 unified L1 / shared memory: the shared-memory capacities (KB) an SM can be set to,
#: of 256 KB; the rest is L1.  The driver takes the smallest that holds a block's static +
#: dynamic shared memory + 1 KB reserved per block (one worker CTA per SM here).
SM90_CARVEOUTS_KB = (0, 8, 16, 32, 64, 100, 132, 164, 196, 228)


def carveout_kb(smem_bytes: int) -> int:
    """The sm_90 shared-memory carveout (KB) a block of smem_bytes (static + dynamic) gets;
    its worker's L1 is 256 KB minus it (1b's hook build at 228 KB, i.e. 28 KB of L1, ran
    7% slower than with 60 KB: docs/dev/hook_cost_analysis.md "Session 6")."""
    need = smem_bytes + 1024
    for c in SM90_CARVEOUTS_KB:
        if need <= c * 1024:
            return c
    raise UserError(f"{smem_bytes} bytes of shared memory per block exceed sm_90's 227 KB")


#: sm_90: registers and shared memory per SM (a CTA takes what it needs of each)
SM90_REGS, SM90_SMEM = 65536, 228 * 1024


def one_cta_per_sm(fn, threads: int, dyn_smem: int) -> bool:
    """Can no second CTA of this size share an SM with a CTA of `fn`?  (Its registers
    or its shared memory take more than half of the SM's.)  A grid handoff's successor
    resumes the worker of its SM only because it cannot start beside the lean CTA."""
    regs = int(fn.num_regs) * threads
    smem = int(fn.shared_size_bytes) + dyn_smem + 1024
    return 2 * regs > SM90_REGS or 2 * smem > SM90_SMEM


def set_smem(fn, nbytes: int) -> None:
    """Raise a kernel's dynamic shared-memory limit to nbytes (never lower it: several
    Megakernel objects share one loaded module)."""
    if fn.max_dynamic_shared_size_bytes < nbytes:
        fn.max_dynamic_shared_size_bytes = nbytes


def gpu_count() -> Tuple[int, str]:
    """(CUDA devices CuPy sees, why none when 0): without CuPy or a driver, (0, reason)."""
    try:
        import cupy
    except ImportError:
        return 0, "CuPy is not installed"
    try:
        n = int(cupy.cuda.runtime.getDeviceCount())
    except Exception as e:                 # no driver / no device
        return 0, f"CUDA reports no device ({e})"
    return n, "" if n else "CUDA reports no device"


def device_arch() -> str:
    import cupy
    cc = cupy.cuda.Device().compute_capability
    return f"sm_{cc}a" if cc == "90" else f"sm_{cc}"


_SMID_PROBE = r"""
extern "C" __global__ void dtmk_smid_probe(int *out) {
    unsigned sm;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    if (threadIdx.x == 0) out[blockIdx.x] = (int)sm;
}"""


def probe_smids(blocks: int, smem_bytes: int) -> List[int]:
    """The %smid of each of `blocks` blocks launched together with smem_bytes of dynamic
    shared memory each (the megakernel's: one block per SM).  Raises UserError when two
    blocks shared an SM (then the grid is not one block per SM)."""
    import cupy as cp
    k = cp.RawKernel(_SMID_PROBE, "dtmk_smid_probe")
    set_smem(k, smem_bytes)
    out = cp.full(blocks, -1, cp.int32)
    k((blocks,), (32,), (out,), shared_mem=smem_bytes)
    ids = [int(x) for x in out.get()]
    if len(set(ids)) != blocks or min(ids) < 0:
        raise UserError(f"probe_smids: {blocks} blocks of {smem_bytes} B shared memory did not get one SM "
                        f"each (SM ids {sorted(ids)})")
    return ids


# ---------------------------------------------------------------------------------
# Tables
# ---------------------------------------------------------------------------------

def pack_tables(g: TaskGraph) -> Dict[str, np.ndarray]:
    """device_tables() in the kernel's layout: tasks int32 [T, 16], moe int32 [n_moe, 8],
    plus the CSR plans and event triggers (see megakernel.cu's header)."""
    d = g.device_tables()
    cfg = g.cfg
    T = len(g.tasks)
    t = np.zeros((T, TREC_WORDS), dtype=np.int32)
    t[:, 0] = d["task_cls"]; t[:, 1] = d["task_layer"]; t[:, 2] = d["task_expert"]; t[:, 3] = d["task_slot"]
    t[:, 4] = d["task_lo"]; t[:, 5] = d["task_hi"]; t[:, 6] = d["task_wait_event"]
    t[:, 7] = d["task_wait_count"]; t[:, 8] = d["task_signal_event"]; t[:, 9] = d["task_dynamic"]
    tile = d["task_tile"].astype(np.uint64)
    t[:, 10] = (tile & np.uint64(0xFFFFFFFF)).astype(np.uint32).view(np.int32)
    t[:, 11] = (tile >> np.uint64(32)).astype(np.uint32).view(np.int32)
    expert_event_moe = {m.expert_event: i for i, m in enumerate(g.moe)}
    mi_of_layer, di_of_layer = moe_index(cfg), dense_index(cfg)
    t[:, 12] = -1; t[:, 13] = -1; t[:, 14] = -1; t[:, 15] = 0
    for plan in g.worker_plans:          # first task of each layer in a worker's plan (bit 0)
        seen = set()
        for i in plan:
            if g.tasks[i].layer not in seen:
                seen.add(g.tasks[i].layer)
                t[i, 15] = 1
    # bits 1..: the triggers of the task's signal event (task:end's event_gen, read after
    # the release signal from the task record instead of a dependent global load)
    sig = np.asarray(d["task_signal_event"], np.int64)
    trig = np.asarray(d["event_triggers"], np.int64)
    t[:, 15] |= (np.where(sig >= 0, trig[np.maximum(sig, 0)], 0) << 1).astype(np.int32)
    for task in g.tasks:
        i = task.index
        if task.cls == CLASS_IDS["rmsnorm"]:
            t[i, 12] = task.tile[0]
            t[i, 13] = expert_event_moe.get(task.wait_event, -1)
        elif task.cls in (CLASS_IDS["mlp_gate_up"], CLASS_IDS["mlp_down"]):
            t[i, 14] = di_of_layer[task.layer]
        elif task.cls in (CLASS_IDS["moe_router"], CLASS_IDS["moe_expert"]):
            t[i, 14] = mi_of_layer[task.layer]
    for i, (a12, a13) in fused_aux(g).items():     # fuse_norm / split_k (graph.py)
        t[i, 12], t[i, 13] = a12, a13
    out_tp = {}
    if g.ranks > 1:
        # tensor parallel (kernels/mk_comm.cuh): rope / attn head ranges become the rank's
        # local heads (hooks carry the global tile); comm tasks carry (all-reduce index
        # l*2+op, MoE fold, destination rank); consumers the all-reduce they reduce
        sh = tp_shard(cfg, g.rank, g.ranks)
        recv_idx = {}
        for task in g.tasks:
            i = task.index
            if task.cls == CLASS_IDS["rope_kv_append"]:
                t[i, 4] -= sh.kv_lo; t[i, 5] -= sh.kv_lo
            elif task.cls == CLASS_IDS["attn"]:
                t[i, 4] -= sh.q_lo; t[i, 5] -= sh.q_lo
            elif task.cls == CLASS_IDS["allreduce"]:
                ev = g.events[task.signal_event]
                idx = task.layer * 2 + ev.comm_op
                t[i, 12], t[i, 13], t[i, 14] = idx, expert_event_moe.get(task.wait_event, -1), task.tile[1]
                if ev.owner_rank == g.rank:
                    recv_idx[task.signal_event] = idx
        for task in g.tasks:
            if task.cls == CLASS_IDS["rmsnorm"] and task.wait_event in recv_idx:
                t[task.index, 13] = -1
                t[task.index, 14] = recv_idx[task.wait_event]
        out_tp["ev_comm_op"] = d["event_comm_op"].astype(np.int32)
    moe = np.zeros((max(len(g.moe), 1), 8), dtype=np.int32)
    for i, m in enumerate(g.moe):
        moe[i, :6] = (m.layer, m.router_task, m.expert_base, m.expert_tiles, m.router_event, m.expert_event)
    return {"tasks": t, "moe": moe, "plan_off": d["plan_offsets"].astype(np.int32),
            "plan_tasks": np.maximum(d["plan_tasks"], 0).astype(np.int32) if len(d["plan_tasks"]) else np.zeros(1, np.int32),
            "event_triggers": d["event_triggers"].astype(np.int32), **out_tp}


def hook_mask(hooks) -> int:
    """Hook names ("task:end"), ids, "all" or an int mask -> the kernel's mask."""
    if hooks is None or hooks is False:
        return 0
    if isinstance(hooks, int) and not isinstance(hooks, bool):
        return hooks
    if hooks is True or hooks == "all":
        hooks = [h.name for h in abi.HOOKS if not h.name.startswith("comm:")]
    m = 0
    for h in hooks:
        m |= 1 << (abi.hook(h).id if isinstance(h, str) else int(h))
    return m
