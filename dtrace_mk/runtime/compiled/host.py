"""Compiled tier on the CPU: the same monitor and map code built with g++.

`host_library(monitor)` compiles the very same monitor source with the host g++
(CUDA keywords and intrinsics as macros, a warp of one lane), together with
kernels/bpf_maps.cuh and kernels/bpf_compiled.cuh, over numpy-backed maps laid out as
on the device (DeviceMaps with a numpy "device"), and fires events serially as the
harness does (`HOST_DRIVER`); compiled.runtime.HostCompiledRuntime runs it: a differential
test against the reference VM without a GPU.
"""
from __future__ import annotations

import ctypes
import hashlib
import subprocess
import tempfile
from pathlib import Path
from typing import Dict, Sequence

import numpy as np

from .. import device as D
from .link import KERNEL_DIR


HOST_SHIM = r"""/* CUDA on the host: a warp of one lane, one thread, plain memory */
#define __device__
#define __host__
#define __global__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __align__(n) __attribute__((aligned(n)))
#define __restrict__ __restrict
struct dtmk_host_dim3 { unsigned x, y, z; };
static const dtmk_host_dim3 threadIdx = {0, 0, 0};
static inline unsigned long long atomicAdd(unsigned long long *a, unsigned long long v) { unsigned long long o = *a; *a = o + v; return o; }
static inline unsigned atomicAdd(unsigned *a, unsigned v) { unsigned o = *a; *a = o + v; return o; }
static inline unsigned atomicCAS(unsigned *a, unsigned c, unsigned v) { unsigned o = *a; if (o == c) *a = v; return o; }
static inline unsigned long long atomicCAS(unsigned long long *a, unsigned long long c, unsigned long long v) { unsigned long long o = *a; if (o == c) *a = v; return o; }
static inline void __threadfence() {}
static inline void __threadfence_block() {}
static inline void __nanosleep(unsigned) {}
static inline int __clzll(long long v) { return v ? __builtin_clzll((unsigned long long)v) : 64; }
static inline unsigned __ballot_sync(unsigned, int p) { return p ? 1u : 0u; }
template <class T> static inline T __shfl_sync(unsigned, T v, int) { return v; }
static inline int __popc(unsigned v) { return __builtin_popcount(v); }
static inline int __ffs(int v) { return __builtin_ffs(v); }
static inline bool __isLocal(const void *) { return false; }
static inline bool __isShared(const void *) { return false; }
static inline void __syncwarp(unsigned = 0xffffffffu) {}
static inline unsigned long long atomicMax(unsigned long long *a, unsigned long long v) { unsigned long long o = *a; if (v > o) *a = v; return o; }
static inline unsigned long long atomicMin(unsigned long long *a, unsigned long long v) { unsigned long long o = *a; if (v < o) *a = v; return o; }
"""

HOST_DRIVER = r"""
/* the harness's serial loop (one event at a time, table order), on the host; slots with
 * DTMK_PROG_F_INLINE as the megakernel's hook site runs them (kernels/bpf_inline.cuh): one
 * shadow and one set of coverage accumulators, flushed at the end of every call (the
 * megakernel's epoch end) */
static struct dtmk_shadow dtmk_host_shadow;
static struct dtmk_cov_acc dtmk_host_accs[DTMK_NUM_HOOKS * DTMK_MAX_PROGS];
/* the lean form's banks, per worker and epoch parity, as each worker of the megakernel
 * keeps them (a bank holding another epoch is folded before an event of a new one, as a
 * wait's first look does in the megakernel: obs_first_look) */
#define DTMK_HOST_WORKERS 64
static dtmk_u32 dtmk_host_lean[DTMK_HOST_WORKERS][2][DTMK_LEAN_CELLS];
static dtmk_u32 dtmk_host_lean_ep[DTMK_HOST_WORKERS][2];
static int dtmk_host_lean_init;
static void dtmk_host_lean_fold(const struct dtmk_hook_table *T, dtmk_u32 w, dtmk_u32 b) {
    if (dtmk_host_lean_ep[w][b] == ~0u) return;
    dtmk_lean_fold(dtmk_host_lean[w][b], dtmk_host_lean_ep[w][b], w, T, 0, dtmk_host_accs, 0, 1);
    dtmk_host_lean_ep[w][b] = ~0u;
}
/* hook h's lean slots as the megakernel compiles them at a table load: the op count, or
 * DTMK_LEAN_SLOW (the descriptor walk) -- tests read which path a program takes */
extern "C" dtmk_u32 dtmk_host_lean_ops(const struct dtmk_hook_table *T, dtmk_u32 h) {
    struct dtmk_lean_op ops[DTMK_MAX_PROGS];
    return dtmk_lean_compile(T[h], 0, ops, DTMK_MAX_PROGS);
}
extern "C" int dtmk_host_fire(const struct dtmk_hook_table *T, const struct dtmk_ctx *events, dtmk_u32 n,
                              dtmk_u64 *r0_out, dtmk_u8 *outcome_out, dtmk_u32 flags) {
    if (!dtmk_host_lean_init) {
        for (int w = 0; w < DTMK_HOST_WORKERS; w++) dtmk_host_lean_ep[w][0] = dtmk_host_lean_ep[w][1] = ~0u;
        dtmk_host_lean_init = 1;
    }
    /* each hook's lean slots compiled once, as the megakernel does at a table load */
    struct dtmk_lean_op ops[DTMK_NUM_HOOKS][DTMK_MAX_PROGS];
    dtmk_u32 nop[DTMK_NUM_HOOKS];
    for (int h = 0; h < DTMK_NUM_HOOKS; h++) nop[h] = dtmk_lean_compile(T[h], 0, ops[h], DTMK_MAX_PROGS);
    for (dtmk_u32 ev = 0; ev < n; ev++) {
        const struct dtmk_ctx *c = events + ev;
        dtmk_u32 h = c->hook;
        if (h == 0 || h >= DTMK_NUM_HOOKS || (T[h].gen & 1)) continue;
        if (c->worker >= DTMK_HOST_WORKERS) return -2;
        {   /* the lean slots first (the site's order: dtmk_inl_event skips them) */
            const dtmk_u32 w = c->worker, b = c->decode_step & 1u;
            if (dtmk_host_lean_ep[w][b] != c->decode_step) {
                dtmk_host_lean_fold(T, w, b);
                dtmk_host_lean_ep[w][b] = c->decode_step;
            }
            const struct dtmk_ctx_reader rd = {c};
            dtmk_lean_hook(ops[h], nop[h], T[h], rd, w, c->decode_step, dtmk_host_lean[w][b],
                           dtmk_host_accs + h * DTMK_MAX_PROGS, 0, outcome_out + (dtmk_u64)ev * DTMK_MAX_PROGS);
        }
        for (dtmk_u32 k = 0; k < T[h].n_progs; k++)
            if (!(T[h].progs[k].flags & DTMK_PROG_F_COMPILED)) return -1;     /* no interpreter on the host */
        dtmk_inl_event(T[h], h, c, c->worker, c->decode_step, flags, &dtmk_host_shadow,
                       dtmk_host_accs + h * DTMK_MAX_PROGS, r0_out + (dtmk_u64)ev * DTMK_MAX_PROGS,
                       outcome_out + (dtmk_u64)ev * DTMK_MAX_PROGS);
        for (dtmk_u32 k = 0; k < T[h].n_progs; k++) {
            const struct dtmk_prog &P = T[h].progs[k];
            if (P.flags & DTMK_PROG_F_INLINE) continue;
            dtmk_u64 r0 = 0;
            int out = dtmk_cm_run_prog(P, h, true, c, c->worker, c->decode_step, T[h].gen >> 1, flags, &r0, 0);
            r0_out[(dtmk_u64)ev * DTMK_MAX_PROGS + k] = r0;
            outcome_out[(dtmk_u64)ev * DTMK_MAX_PROGS + k] = (dtmk_u8)out;
        }
    }
    dtmk_sh_flush(&dtmk_host_shadow, T, dtmk_host_accs, 0, 1);
    for (dtmk_u32 w = 0; w < DTMK_HOST_WORKERS; w++) { dtmk_host_lean_fold(T, w, 0); dtmk_host_lean_fold(T, w, 1); }
    for (int i = 0; i < DTMK_NUM_HOOKS * DTMK_MAX_PROGS; i++) dtmk_cov_acc_flush(&dtmk_host_accs[i]);
    return 0;
}
"""

_ASM_FIXES = (
    ('asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");',
     "v = *(volatile const dtmk_u32 *)p;"),
    ('asm volatile("st.release.gpu.global.u32 [%0], %1;" :: "l"(p), "r"(v) : "memory");',
     "*(volatile dtmk_u32 *)p = v;"),
)


def host_maps_header() -> str:
    """kernels/bpf_maps.cuh with kernels/bpf_map_ops.cuh inlined where it is included, and
    their two PTX one-liners (acquire load, release store) as plain C: the only edits the
    host build makes to the device map code."""
    inc = '#include "bpf_map_ops.cuh"'
    text = (KERNEL_DIR / "bpf_maps.cuh").read_text()
    if inc not in text:
        raise RuntimeError(f"bpf_maps.cuh changed: host build cannot find {inc!r}")
    text = text.replace(inc, (KERNEL_DIR / "bpf_map_ops.cuh").read_text(), 1)
    for old, new in _ASM_FIXES:
        if old not in text:
            raise RuntimeError(f"bpf_maps.cuh changed: host build cannot find {old!r}")
        text = text.replace(old, new)
    if "asm" in "".join(l.split("/*")[0] for l in text.splitlines() if not l.lstrip().startswith("*")):
        raise RuntimeError("bpf_maps.cuh has inline PTX the host build does not know")
    return text


def host_source(monitor: str) -> str:
    """One host C++ translation unit: shim, map code, the compiled-tier wrapper, the
    monitor, the serial driver."""
    wrapper = (KERNEL_DIR / "bpf_compiled.cuh").read_text().replace('#include "bpf_maps.cuh"', "")
    maps = host_maps_header().replace('#include "dtrace_mk_abi.h"', "")
    return "\n".join([HOST_SHIM, '#include "dtrace_mk_abi.h"', maps, monitor.replace('#include "dtrace_mk_abi.h"', ""),
                      wrapper.replace('#include "dtrace_mk_abi.h"', ""), HOST_DRIVER])


_HOST_LIBS: Dict[str, ctypes.CDLL] = {}


def host_library(monitor: str, opt: str = "-O1", defines: Sequence[str] = ()) -> ctypes.CDLL:
    """Compile host_source(monitor) with g++ into a shared library and load it (cached
    per process by the source hash; the map addresses in the source are this process's).
    defines: -D options of the build (the device code's opt-in variants, e.g. DTMK_HASH_LOOK_FAST)."""
    src = host_source(monitor)
    key = hashlib.sha256((opt + "|".join(defines) + src).encode()).hexdigest()[:20]
    if key in _HOST_LIBS:
        return _HOST_LIBS[key]
    with tempfile.TemporaryDirectory() as td:
        c = Path(td) / "monitor_host.cpp"
        c.write_text(src)
        so = Path(td) / f"cm_host_{key}.so"
        cmd = ["g++", "-std=c++17", opt, "-shared", "-fPIC", "-fno-strict-aliasing", "-w",
               "-Wl,-z,defs", f"-I{KERNEL_DIR}", *[f"-D{d}" for d in defines], "-o", str(so), str(c)]
        res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode:
            raise D.CompileError(f"host build of the compiled monitor failed:\n{res.stderr[-4000:]}")
        lib = ctypes.CDLL(str(so))          # stays mapped after the directory goes
    lib.dtmk_host_fire.restype = ctypes.c_int
    lib.dtmk_host_fire.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint32, ctypes.c_void_p,
                                   ctypes.c_void_p, ctypes.c_uint32]
    lib.dtmk_host_lean_ops.restype = ctypes.c_uint32
    lib.dtmk_host_lean_ops.argtypes = [ctypes.c_void_p, ctypes.c_uint32]
    _HOST_LIBS[key] = lib
    return lib


class _HostArray(np.ndarray):
    """A numpy array posing as a CuPy device array (.data.ptr, .get(), .set())."""

    class _Ptr:
        __slots__ = ("ptr",)

        def __init__(self, ptr: int):
            self.ptr = ptr

    @property
    def data(self):                                    # noqa: D401 - CuPy's name
        return _HostArray._Ptr(self.ctypes.data)

    def get(self, stream=None) -> np.ndarray:
        return np.array(self, copy=True).view(np.ndarray)

    def set(self, x, stream=None) -> None:
        self[...] = np.asarray(x).reshape(self.shape)


class HostDevice:
    """The slice of CuPy that DeviceMaps and the runtime's tables use, on numpy."""
    uint8, uint32, uint64, ndarray = np.uint8, np.uint32, np.uint64, _HostArray

    @staticmethod
    def zeros(n, dtype=np.uint8):
        return np.zeros(n, dtype=dtype).view(_HostArray)

    @staticmethod
    def asarray(a):
        return np.array(a, copy=True).view(_HostArray)
