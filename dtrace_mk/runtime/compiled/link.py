"""Compiled tier, pass 2: the monitor's CUDA C -> NVRTC -> nvJitLink with the kernel.

Build: `ltoir(source)` (NVRTC, -dlto -rdc=true, sm_90a), `link_cubin([...])`
(nvJitLink -lto), `build_compiled_harness(monitor)` = harness LTO-IR (cached by the
kernel sources' hash) + monitor LTO-IR (cached by its source hash) -> cubin (cached
by both), with timings (`BuildTimes`).  Promotions use the two-stage build
(`build_linked`, section "Two-stage builds"): stage 1 links a cached relocatable kernel
cubin with the monitor's own cubin without LTO (~0.1 s: the swap), stage 2 is the full
LTO link (seconds, in the background, swapped in at a later launch boundary).
"""
from __future__ import annotations

import hashlib
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from ...errors import UserError
from ...kernels import build
from ...megakernel.gpu import OBS_SM_DEFINES
from .. import device as D

KERNEL_DIR = D.KERNEL_DIR
HARNESS = "bpf_compiled_harness.cu"
HARNESS_SOURCES = tuple(sorted(set(build.include_closure(HARNESS, KERNEL_DIR)) | set(D.SOURCES)))
ARCH = "sm_90a"


class LinkError(UserError):
    """nvJitLink refused the link (the message carries its log)."""



def ltoir(source: str, name: str = "monitor.cu", arch: str = ARCH, defines: Sequence[str] = ()) -> bytes:
    """NVRTC: CUDA source -> LTO-IR for `arch` (-dlto -rdc=true); kernels/ on the include
    path.  Raises device.CompileError with NVRTC's log."""
    return build.nvrtc_compile(source, name, arch, "ltoir", defines)


def nvjitlink_available() -> bool:
    try:
        from cuda.bindings import nvjitlink
        nvjitlink.version()
        return True
    except Exception:   # noqa: BLE001 - missing library shows as various errors
        return False


def _nvjitlink(inputs: Sequence[Tuple[str, bytes]], opts: List[str], kind: str, what: str) -> bytes:
    """One nvJitLink run over (name, bytes) inputs of one InputType; LinkError with the
    linker's log on failure."""
    from cuda.bindings import nvjitlink
    h = nvjitlink.create(len(opts), opts)
    try:
        try:
            for nm, data in inputs:
                nvjitlink.add_data(h, getattr(nvjitlink.InputType, kind), data, len(data), nm)
            nvjitlink.complete(h)
        except nvjitlink.nvJitLinkError as e:
            size = nvjitlink.get_error_log_size(h)
            log = bytearray(size)
            nvjitlink.get_error_log(h, log)
            raise LinkError(f"nvJitLink ({what}): {e}\n{bytes(log).decode(errors='replace').strip(chr(0))}") from None
        size = nvjitlink.get_linked_cubin_size(h)
        out = bytearray(size)
        nvjitlink.get_linked_cubin(h, out)
        return bytes(out)
    finally:
        nvjitlink.destroy(h)


def link_cubin(inputs: Sequence[Tuple[str, bytes]], arch: str = ARCH, lineinfo: bool = False) -> bytes:
    """nvJitLink: LTO-IR inputs (name, bytes) -> one cubin (-lto: cross-module inlining);
    lineinfo: keep the inputs' line tables (tools/sass_size.py)."""
    return _nvjitlink(inputs, [f"-arch={arch}", "-lto", "-O3"] + (["-lineinfo"] if lineinfo else []), "LTOIR", arch)


_cache_dir = build.cache_dir


def _write_atomic(path: Path, data: bytes) -> None:
    # (per process and thread: two threads that miss one key both build it -- bench/hooks.py's
    # side-by-side links, the tier manager's background builds -- and must not share a tmp)
    tmp = path.with_suffix(path.suffix + f".tmp{os.getpid()}.{threading.get_ident()}")
    tmp.write_bytes(data)
    tmp.replace(path)


def kernel_hash(arch: str = ARCH, defines: Sequence[str] = ()) -> str:
    h = hashlib.sha256()
    for s in HARNESS_SOURCES:
        h.update(s.encode() + b"\0" + (KERNEL_DIR / s).read_bytes())
    h.update(f"{arch}|{'|'.join(defines)}".encode())
    return h.hexdigest()[:20]


def program_hash(source: str, arch: str = ARCH) -> str:
    return hashlib.sha256(f"{arch}\0{source}".encode()).hexdigest()[:20]


@dataclass
class BuildTimes:
    """Seconds spent on one compiled-harness build (0.0 = taken from a cache)."""
    translate_s: float = 0.0
    monitor_ltoir_s: float = 0.0
    harness_ltoir_s: float = 0.0
    link_s: float = 0.0
    cached: str = ""            # "cubin", "ltoir"/"monitor" or ""
    stage: int = 2              # 1: relocatable link (fast swap), 2: full LTO

    @property
    def swap_s(self) -> float:
        """What a promotion waits for with the kernel's LTO-IR cached: translate +
        monitor compile + link."""
        return self.translate_s + self.monitor_ltoir_s + self.link_s


_MEM: Dict[str, bytes] = {}


def _cached(key: str, suffix: str, make) -> Tuple[bytes, bool]:
    if key in _MEM:
        return _MEM[key], True
    path = _cache_dir() / f"{key}{suffix}"
    if path.exists():
        data = path.read_bytes()
        _MEM[key] = data
        return data, True
    data = make()
    _write_atomic(path, data)
    _MEM[key] = data
    return data, False


def harness_ltoir(arch: str = ARCH, defines: Sequence[str] = ()) -> Tuple[bytes, float]:
    """The compiled harness as LTO-IR, cached by the kernel sources' hash (seconds spent)."""
    t0 = time.perf_counter()
    src = (KERNEL_DIR / HARNESS).read_text()
    data, hit = _cached(f"cm_harness_{kernel_hash(arch, defines)}", ".ltoir",
                        lambda: ltoir(src, HARNESS, arch, defines))
    return data, 0.0 if hit else time.perf_counter() - t0


def build_compiled_harness(monitor: str, arch: str = ARCH, defines: Sequence[str] = ()
                           ) -> Tuple[Path, BuildTimes]:
    """Harness LTO-IR + monitor LTO-IR -> linked cubin, cached by (program hash, kernel
    hash).  Returns the cubin's path and what each step cost."""
    times = BuildTimes()
    ph, kh = program_hash(monitor, arch), kernel_hash(arch, defines)
    path = _cache_dir() / f"cm_{kh}_{ph}.cubin"
    if path.exists():
        times.cached = "cubin"
        return path, times
    h_ir, times.harness_ltoir_s = harness_ltoir(arch, defines)
    t0 = time.perf_counter()
    m_ir, hit = _cached(f"cm_monitor_{ph}", ".ltoir", lambda: ltoir(monitor, "monitor.cu", arch))
    times.monitor_ltoir_s = 0.0 if hit else time.perf_counter() - t0
    if hit:
        times.cached = "ltoir"
    t0 = time.perf_counter()
    cubin = link_cubin([(HARNESS, h_ir), ("monitor.cu", m_ir)], arch)
    times.link_s = time.perf_counter() - t0
    _write_atomic(path, cubin)
    return path, times


# ---------------------------------------------------------------------------------
# Two-stage builds: stage 1 (fast, the swap) and stage 2 (full LTO, in the background)
# ---------------------------------------------------------------------------------
#
# Stage 1 links a PRECOMPILED relocatable (-rdc, non-LTO) cubin of the kernel (built once
# per kernel-source hash, cached on disk) with the monitor compiled on its own by NVRTC
# into a relocatable cubin: nvJitLink only resolves symbols (no LTO, no kernel codegen),
# so a promotion costs translate + the monitor's NVRTC/ptxas + a ~2 ms link.  The hook
# site calls dtmk_cm_hook_<id> for real (not inlined); the map helpers stay the kernel's.
# Stage 2 is the full LTO link (kernel LTO-IR + monitor LTO-IR, the monitor inlined at the
# hook sites): seconds, so it runs off the launch path and is swapped in at a later launch
# boundary (tiers.TierManager).  Everything is linked into ONE cubin in both stages.
#
# An -rdc compile compiles every non-inlined function on its own under the ABI; ptxas
# then refuses callees that use more registers than the entry's __launch_bounds__ allow
# (the whole-program build fits them automatically).  `maxrreg` = the entry's limit
# (megakernel: 65536 / MK_THREADS = 128) is passed to the kernel's and the monitor's
# compile, which is the limit the whole-program build applies to those functions anyway.

STAGE_FAST, STAGE_LTO = 1, 2
MK_SOURCES = tuple(build.include_closure("megakernel.cu", KERNEL_DIR))   # every file the build reads
MK_MAXRREG = 128                      # 65536 registers / MK_THREADS (512), 1 block per SM
MK_DEFINES = ("DTMK_COMPILED_TIER",)


include_closure = build.include_closure     # the one include scanner (kernels/build.py)


def _sources_hash(sources: Sequence[str], tag: str) -> str:
    h = hashlib.sha256()
    for s in sorted(set(sources)):
        h.update(s.encode() + b"\0" + (KERNEL_DIR / s).read_bytes())
    h.update(tag.encode() + b"\0" + build.nvrtc_version().encode())
    return h.hexdigest()[:20]


def _rdc_opts(maxrreg: Optional[int]) -> List[str]:
    return ["--relocatable-device-code=true"] + ([f"-maxrregcount={maxrreg}"] if maxrreg else [])


def relocatable_cubin(source: str, name: str, arch: str = ARCH, defines: Sequence[str] = (),
                      maxrreg: Optional[int] = None) -> bytes:
    """NVRTC: CUDA source -> relocatable (-rdc, non-LTO) cubin (device.CompileError)."""
    return build.nvrtc_compile(source, name, arch, "cubin", defines, options=_rdc_opts(maxrreg))


def link_relocatable(inputs: Sequence[Tuple[str, bytes]], arch: str = ARCH) -> bytes:
    """nvJitLink without -lto: relocatable cubins (name, bytes) -> one cubin (symbol
    resolution only, no codegen)."""
    return _nvjitlink(inputs, [f"-arch={arch}"], "CUBIN", f"{arch}, relocatable")


@dataclass(frozen=True)
class KernelSpec:
    """What a monitor is linked with: kernels/<name> built with `defines`; `maxrreg` the
    entry's register limit for -rdc compiles (None: no __launch_bounds__)."""
    name: str
    sources: Tuple[str, ...]
    defines: Tuple[str, ...] = ()
    maxrreg: Optional[int] = None
    tag: str = "harness"

    def key(self, arch: str) -> str:
        """Hash of the listed sources plus everything kernels/<name> includes."""
        return _sources_hash(tuple(self.sources) + tuple(include_closure(self.name)),
                             f"{arch}|{'|'.join(self.defines)}|{self.maxrreg}|{self.name}")


HARNESS_SPEC = KernelSpec(HARNESS, HARNESS_SOURCES, (), None, "harness")
MEGAKERNEL_SPEC = KernelSpec("megakernel.cu", MK_SOURCES, MK_DEFINES, MK_MAXRREG, "megakernel")
#: build variants of the default 512-thread kernel that the compiled tier links as they are
#: (-DDTMK_REC_GLOBAL: the record path before hook_cost_analysis.md round 8; DTMK_REC_FAST is
#: the default since session 4, passing it changes nothing but the cache key).  Every
#: variant bench/hooks.py and bench/level_profile.py run with a compiled monitor must be
#: here: a define left out is silently absent from the linked build (session 9 found
#: DTMK_HOLD_LAZY and DTMK_OBS_PROF missing: "summary_cm_lazyhold" measured the default).
#: DTMK_HOLD_EAGER: the always-full pre-signal hold (the lazy one is the default since session 9).
MK_PASS_DEFINES = ("DTMK_REC_GLOBAL", "DTMK_REC_FAST", "DTMK_EXTRA_SYNC",
                   "DTMK_ROPE_IN_ATTN",   # the graph's attn tasks rope (gpu.megakernel_defines): without it
                                          # the linked kernel computes wrong tokens for 1b
                   "DTMK_H_PARITY",       # slice_events graphs: h by layer parity (the same)
                   "DTMK_HOLD_EAGER", "DTMK_OBS_PROF", "DTMK_VM_CODE_SMEM", "DTMK_WS_EVICT_NORMAL",
                   "DTMK_WS_NST", "DTMK_WS_STAGE",   # the weight ring's shape: the launch sizes its smem by them
                   "DTMK_INL_PROBE",    # profiling: the inline event warm, an empty call (level_profile)
                   "DTMK_INL_NOINLINE",   # the site form through a noinline call (bench variant inlcall)
                   "DTMK_HASH_LOOK_FAST",   # the generic helpers' register-only probe (bench variant obssm4look)
                   "DTMK_NO_DRAIN_POLL", "DTMK_DRAIN_POLL_ACQ", "DTMK_DRAIN_POLL_NS", "DTMK_GATE_POLL",   # the drain's poller's forms
                   "DTMK_OFF_COPY",     # the waits' copy without hook code (session 55): the same loop
                   "DTMK_ONE_WAIT",     # ... or one wait (the default's two copies since session 60)
                   "DTMK_COPY_IN_WAIT",   # ... copy 0 calling copy 1 (measurement, session 60)
                   "DTMK_HOT_FIRST",    # the workers' hot functions first in the cubin (session 58)
                   "DTMK_NO_HOT_FIRST",   # ... or the old layout (hot-first is the default since session 60)
                   "DTMK_HOT_OBS",      # ... extended to the observer-SM build's hot functions (measurement, session 61)
                   "DTMK_SM_WORKER", "DTMK_SM_IDLE",   # placed workers (bench/level_profile.py --place: the
                                                       # per-GPC tables; without them the linked kernel ran
                                                       # its workers in block order under a placed name)
                   # the observer SM (it runs the linked programs): its count and its defines, from
                   # their one list (gpu.OBS_SM_DEFINES) but the probe's counters
                   "DTMK_OBS_SMS") + tuple(d for d in OBS_SM_DEFINES if d != "DTMK_OSQ_STATS")


def megakernel_spec(defines: Sequence[str] = ()) -> KernelSpec:
    """The compiled tier's kernel for a Megakernel built with `defines` (its .defines):
    MEGAKERNEL_SPEC, plus those of MK_PASS_DEFINES it carries (same block, same limit)."""
    names = {d.split("=")[0]: d for d in defines}
    passed = tuple(names[k] for k in MK_PASS_DEFINES if k in names)
    if passed:
        return KernelSpec("megakernel.cu", MK_SOURCES, MK_DEFINES + passed, MK_MAXRREG, "megakernel_v")
    return MEGAKERNEL_SPEC


def kernel_object(spec: KernelSpec, stage: int, arch: str = ARCH) -> Tuple[bytes, float]:
    """The kernel side of a link, cached on disk by the kernel sources' hash: stage 1 a
    relocatable cubin, stage 2 LTO-IR.  Returns (bytes, seconds spent; 0.0 = cached)."""
    t0 = time.perf_counter()
    src = (KERNEL_DIR / spec.name).read_text()
    if stage == STAGE_FAST:
        data, hit = _cached(f"cm_{spec.tag}_rdc_{spec.key(arch)}", ".cubin",
                            lambda: relocatable_cubin(src, spec.name, arch, spec.defines, spec.maxrreg))
    else:
        data, hit = _cached(f"cm_{spec.tag}_lto_{spec.key(arch)}", ".ltoir",
                            lambda: ltoir(src, spec.name, arch, spec.defines))
    return data, 0.0 if hit else time.perf_counter() - t0


def build_linked(monitor: str, spec: KernelSpec, stage: int = STAGE_FAST, arch: str = ARCH
                 ) -> Tuple[Path, BuildTimes]:
    """Kernel `spec` + compiled monitor -> one cubin on disk (cached by kernel hash,
    program hash and stage).  Stage 1: relocatable kernel cubin + the monitor's own
    relocatable cubin, linked without LTO (the swap: ~0.1 s); stage 2: full LTO (the
    monitor inlined at the hook sites; seconds).  Returns (path, BuildTimes)."""
    if stage not in (STAGE_FAST, STAGE_LTO):
        raise ValueError(f"stage must be 1 or 2, got {stage!r}")
    times = BuildTimes(stage=stage)
    ph, kh = program_hash(monitor, arch), spec.key(arch)
    path = _cache_dir() / f"cm_{spec.tag}_s{stage}_{kh}_{ph}.cubin"
    if path.exists():
        times.cached = "cubin"
        return path, times
    k_obj, times.harness_ltoir_s = kernel_object(spec, stage, arch)
    t0 = time.perf_counter()
    if stage == STAGE_FAST:
        m_obj, hit = _cached(f"cm_monitor_rdc{spec.maxrreg or 0}_{ph}", ".cubin",
                             lambda: relocatable_cubin(monitor, "monitor.cu", arch, (), spec.maxrreg))
    else:
        m_obj, hit = _cached(f"cm_monitor_{ph}", ".ltoir", lambda: ltoir(monitor, "monitor.cu", arch))
    times.monitor_ltoir_s = 0.0 if hit else time.perf_counter() - t0
    if hit:
        times.cached = "monitor"
    t0 = time.perf_counter()
    if stage == STAGE_FAST:
        cubin = link_relocatable([(spec.name, k_obj), ("monitor.cu", m_obj)], arch)
    else:
        cubin = link_cubin([(spec.name, k_obj), ("monitor.cu", m_obj)], arch)
    times.link_s = time.perf_counter() - t0
    _write_atomic(path, cubin)
    return path, times
