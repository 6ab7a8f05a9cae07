"""Compiled tier: verified eBPF -> CUDA C -> NVRTC LTO-IR -> nvJitLink with the kernel.

One pipeline of passes, a module each (docs/compiled_tier.md):

* `translator`: the device VM's pre-decoded records -> one CUDA C function per program,
  and `monitor_source` -> the monitor module (map shapes, programs, per-hook entries);
* `link`: NVRTC (LTO-IR / relocatable cubin) and nvJitLink, the on-disk caches, the
  kernels a monitor is linked with (`KernelSpec`) and the two-stage build of a promotion;
* `host`: the same monitor and map code built with g++ (the CPU's differential test);
* `runtime`: `HostCompiledRuntime` and `CompiledRuntime` -- tables with compiled slots and
  the promotion protocol of dtrace_mk.runtime.tiers.

This package re-exports the names callers use (`from dtrace_mk.runtime import compiled
as C; C.build_linked(...)`); a test that patches a module-level name patches it in the
submodule that reads it (e.g. `C.link.KERNEL_DIR`).
"""
from . import host, link, runtime, translator
from .host import HOST_DRIVER, HOST_SHIM, HostDevice, host_library, host_maps_header, host_source
from .link import (ARCH, HARNESS, HARNESS_SOURCES, HARNESS_SPEC, KERNEL_DIR, MEGAKERNEL_SPEC, MK_DEFINES,
                   MK_MAXRREG, MK_PASS_DEFINES, MK_SOURCES, STAGE_FAST, STAGE_LTO, BuildTimes, KernelSpec,
                   LinkError, build_compiled_harness, build_linked, harness_ltoir, include_closure, kernel_hash,
                   kernel_object, link_cubin, link_relocatable, ltoir, megakernel_spec, nvjitlink_available,
                   program_hash, relocatable_cubin)
from .runtime import PROG_F_COMPILED, PROG_F_INLINE, CompiledRuntime, HostCompiledRuntime, _CompiledMixin
from .translator import (HOOK_IDS, PRELUDE, MapShape, MonitorProgram, TranslateError, longest_path,
                         monitor_source, translate)

__all__ = [
    "host", "link", "runtime", "translator",
    "HOST_DRIVER", "HOST_SHIM", "HostDevice", "host_library", "host_maps_header", "host_source",
    "ARCH", "HARNESS", "HARNESS_SOURCES", "HARNESS_SPEC", "KERNEL_DIR", "MEGAKERNEL_SPEC", "MK_DEFINES",
    "MK_MAXRREG", "MK_PASS_DEFINES", "MK_SOURCES", "STAGE_FAST", "STAGE_LTO", "BuildTimes", "KernelSpec",
    "LinkError", "build_compiled_harness", "build_linked", "harness_ltoir", "include_closure", "kernel_hash",
    "kernel_object", "link_cubin", "link_relocatable", "ltoir", "megakernel_spec", "nvjitlink_available",
    "program_hash", "relocatable_cubin",
    "PROG_F_COMPILED", "PROG_F_INLINE", "CompiledRuntime", "HostCompiledRuntime", "_CompiledMixin",
    "HOOK_IDS", "PRELUDE", "MapShape", "MonitorProgram", "TranslateError", "longest_path",
    "monitor_source", "translate",
]
