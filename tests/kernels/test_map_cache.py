"""CI (no GPU): the -DDTMK_MAP_CACHE hash-map lookup cache (kernels/bpf_maps.cuh).

* The map code built on the host with the cache (the compiled tier's one-lane CUDA shim,
  g++) runs random lookup / update / delete / hist_add sequences on maps laid out by
  DeviceMaps (numpy memory), and every result and the final map bytes equal the
  uncached helpers' on twin maps; hits really skip the table (a remote delete is seen
  only at the next dtmk_mc_begin, a local one at once; a host clear_hash at the next
  begin).
* Builds: the megakernel's observer grows by exactly the cache plus its 8-byte pointer
  and the default PTX has none of it; the harness (and its compiled-tier twin) compile
  with it; the compiled tier's megakernel spec carries the define.
Exactness under real concurrency runs on the GPU (tests/gpu/test_map_cache_gpu.py)."""
from __future__ import annotations

import ctypes
import hashlib
import random
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pytest

from dtrace_mk.bpf.program import MapDef
from dtrace_mk.kernels import KERNEL_DIR
from dtrace_mk.kernels.build import nvrtc_compile
from dtrace_mk.runtime import compiled as C
from dtrace_mk.runtime.device import MAP_STATS_DTYPE, DeviceMaps

MC_MAPS, MC_ENTRIES = 4, 32
CACHE_BYTES = 56 * MC_MAPS + 28 * MC_ENTRIES + 8

# ---------------------------------------------------------------------------- host model

SHIM_EXTRA = r"""
#define __shared__
static inline void __threadfence_block() {}
static inline void __syncwarp() {}
#define DTMK_MAP_CACHE
#define DTMK_MC_LANES 1
"""

DRIVER = r"""
static struct dtmk_map_cache g_mc;
extern "C" void mc_clear() { dtmk_mc_clear(&g_mc, 0, 1); }
extern "C" void mc_begin(int use) { dtmk_mc_begin(use ? &g_mc : 0); }
extern "C" void mc_bind(int use) { dtmk_mc_cur = use ? &g_mc : 0; }   /* no validation */
/* op 0 lookup, 1 update (arg = flags), 2 delete, 3 hist_add (arg = value); *lost set as the VM */
extern "C" unsigned long long mc_op(int op, unsigned long long m, const void *key, const void *val,
                                    unsigned long long arg, int *lost) {
    bool l = false;
    unsigned long long r = 0;
    const struct dtmk_map *M = (const struct dtmk_map *)m;
    switch (op) {
    case 0: r = dtmk_map_lookup(M, key, 0, &l); break;
    case 1: r = dtmk_map_update(M, key, val, arg, 0, &l); break;
    case 2: r = dtmk_map_delete(M, key, &l); break;
    case 3: r = dtmk_hist_add(M, key, arg, &l); break;
    }
    *lost = l;
    return r;
}
extern "C" unsigned mc_size() { return sizeof(struct dtmk_map_cache); }
"""


def _host_lib():
    if not shutil.which("g++"):
        pytest.skip("g++ not found")
    src = "\n".join([C.HOST_SHIM, SHIM_EXTRA, '#include "dtrace_mk_abi.h"',
                     C.host_maps_header().replace('#include "dtrace_mk_abi.h"', ""), DRIVER])
    td = Path(tempfile.mkdtemp(prefix="mc_host_"))
    c = td / "mc.cpp"
    c.write_text(src)
    so = td / f"mc_{hashlib.sha256(src.encode()).hexdigest()[:12]}.so"
    res = subprocess.run(["g++", "-std=c++17", "-O1", "-shared", "-fPIC", "-fno-strict-aliasing", "-w",
                          f"-I{KERNEL_DIR}", "-o", str(so), str(c)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-4000:]
    lib = ctypes.CDLL(str(so))
    lib.mc_op.restype = ctypes.c_ulonglong
    lib.mc_op.argtypes = [ctypes.c_int, ctypes.c_ulonglong, ctypes.c_void_p, ctypes.c_void_p,
                          ctypes.c_ulonglong, ctypes.POINTER(ctypes.c_int)]
    lib.mc_size.restype = ctypes.c_uint
    return lib


@pytest.fixture(scope="module")
def lib():
    return _host_lib()


def _defs():
    """5 hash-type maps (one more than the cache's map slots), a 24-byte-key hash (not
    cacheable) and an array."""
    return [MapDef("h8", "hash", 8, 8, 6), MapDef("lg", "hist_log2", 4, 8 * 64, 8),
            MapDef("lin", "hist_linear", 8, 8 * 7, 8, lin_lo=0, lin_hi=50, lin_step=10),
            MapDef("h16", "hash", 16, 16, 5), MapDef("h4", "hash", 4, 8, 4),
            MapDef("big", "hash", 24, 8, 4), MapDef("arr", "array", 4, 8, 4)]


def _maps():
    return DeviceMaps(C.HostDevice, _defs(), 1)


class Twin:
    """The same operations on a cached and an uncached copy of the maps."""

    def __init__(self, lib):
        self.lib = lib
        self.a, self.b = _maps(), _maps()     # a: through the cache, b: uncached
        lib.mc_clear()
        self.keep = []

    def op(self, which, op, i, key, val=b"", arg=0):
        kb = ctypes.create_string_buffer(bytes(key), max(len(key), 1))
        vb = ctypes.create_string_buffer(bytes(val), max(len(val), 1))
        self.keep += [kb, vb]
        lost = ctypes.c_int(0)
        maps = self.a if which == "a" else self.b
        self.lib.mc_bind(1 if which == "a" else 0)
        r = self.lib.mc_op(op, maps.desc_addr(i), kb, vb, arg, ctypes.byref(lost))
        if op == 0 and r:                      # a value address: compare offsets and bytes
            m, d = maps.defs[i], maps.host_descs[i]
            off = r - int(d["values"])
            r = ("val", off, ctypes.string_at(r, m.value_size))
        return r, lost.value

    def both(self, op, i, key, val=b"", arg=0):
        ra, rb = self.op("a", op, i, key, val, arg), self.op("b", op, i, key, val, arg)
        assert ra == rb, (op, i, key, val, arg, ra, rb)
        return ra


def _bytes(maps):
    out = []
    for b in maps.bufs:
        out.append({k: (v.get().tobytes() if k != "stats" else
                        v.get().view(MAP_STATS_DTYPE)[["count", "lost", "throttled", "probe_exhausted"]].tobytes())
                    for k, v in b.items()})
    return out


def test_cache_struct_size(lib):
    assert lib.mc_size() == CACHE_BYTES


@pytest.mark.parametrize("seed", range(6))
def test_random_ops_equal_the_uncached_helpers(lib, seed):
    rng = random.Random(seed)
    t = Twin(lib)
    defs = t.a.defs
    pools = {i: [rng.randbytes(m.key_size) for _ in range(m.max_entries + 3)] for i, m in enumerate(defs)}
    for i, m in enumerate(defs):
        if m.type == "array":
            pools[i] = [struct_u32(k) for k in range(m.max_entries + 2)]
    for step in range(1500):
        if rng.random() < 0.05:
            lib.mc_begin(1)                    # a new VM call: validation finds nothing moved
        i = rng.randrange(len(defs))
        m = defs[i]
        key = rng.choice(pools[i])
        r = rng.random()
        if m.type in ("hist_log2", "hist_linear"):
            op = 3 if r < 0.6 else 0 if r < 0.85 else 2
        else:
            op = 0 if r < 0.4 else 1 if r < 0.8 else 2
        if m.type == "array" and op == 2:
            op = 0
        val = rng.randbytes(m.value_size)
        arg = rng.choice([0, 1, 2, 3]) if op == 1 else rng.randrange(0, 80) if op == 3 else 0
        t.both(op, i, key, val, arg)
    assert _bytes(t.a) == _bytes(t.b)
    st = [t.a.stats(i) for i in range(len(defs))]
    assert sum(int(s["del_gen"]) for s in st) > 0       # deletes happened (and were counted)


def struct_u32(k):
    return int(k).to_bytes(4, "little")


def test_a_hit_skips_the_table_until_the_next_begin(lib):
    """A delete by another CTA (here: the uncached helper, which bumps only stats.del_gen)
    is not seen by cached lookups until dtmk_mc_begin: the hit path loads nothing from
    the table.  After begin the key is gone."""
    t = Twin(lib)
    k = b"\x01" * 8
    lib.mc_begin(1)
    assert t.op("a", 1, 0, k, b"\x07" * 8, 0) == (0, 0)
    first = t.op("a", 0, 0, k)                  # fills the entry (also filled by the insert)
    assert first[0][0] == "val" and first[0][2] == b"\x07" * 8
    lib.mc_bind(0)
    lost = ctypes.c_int(0)
    kb = ctypes.create_string_buffer(k, 8)
    assert lib.mc_op(2, t.a.desc_addr(0), kb, None, 0, ctypes.byref(lost)) == 0   # "remote" delete
    assert int(t.a.stats(0)["del_gen"]) == 1 and int(t.a.stats(0)["count"]) == 0
    stale = t.op("a", 0, 0, k)                  # cached: still the old slot (the documented window)
    assert stale == first
    lib.mc_begin(1)                             # next VM call: del_gen moved -> entries dropped
    assert t.op("a", 0, 0, k) == (0, 0)


def test_a_local_delete_invalidates_at_once(lib):
    t = Twin(lib)
    lib.mc_begin(1)
    ks = [bytes([j]) * 8 for j in range(1, 5)]
    for j, k in enumerate(ks):
        assert t.op("a", 1, 0, k, bytes([j]) * 8, 0) == (0, 0)
    assert t.op("a", 0, 0, ks[1])[0][0] == "val"
    assert t.op("a", 2, 0, ks[1]) == (0, 0)             # this CTA: lgen bumped now
    assert t.op("a", 0, 0, ks[1]) == (0, 0)
    assert t.op("a", 2, 0, ks[1]) == ((-2) & (2**64 - 1), 0)   # -ENOENT
    # re-insert (reuses the tombstone), the cache follows
    assert t.op("a", 1, 0, ks[1], b"\x55" * 8, 1) == (0, 0)
    assert t.op("a", 0, 0, ks[1])[0][2] == b"\x55" * 8
    for j, k in enumerate(ks):
        if j != 1:
            assert t.op("a", 0, 0, k)[0][2] == bytes([j]) * 8


def test_host_clear_is_seen_at_the_next_begin(lib):
    t = Twin(lib)
    lib.mc_begin(1)
    k = b"\x09" * 8
    assert t.op("a", 1, 0, k, b"\x01" * 8, 0) == (0, 0)
    assert t.op("a", 0, 0, k)[0][0] == "val"
    t.a.clear_hash(0)
    assert int(t.a.stats(0)["host_gen"]) == 1 and int(t.a.stats(0)["count"]) == 0
    assert t.op("a", 0, 0, k)[0][0] == "val"            # window: until the next VM call
    lib.mc_begin(1)
    assert t.op("a", 0, 0, k) == (0, 0)
    assert t.op("a", 1, 0, k, b"\x02" * 8, 1) == (0, 0)  # NOEXIST: inserts again
    with pytest.raises(Exception, match="clear_hash needs a hash map"):
        t.a.clear_hash(6)


def test_clear_drops_everything(lib):
    t = Twin(lib)
    lib.mc_begin(1)
    k = b"\x03" * 8
    t.op("a", 1, 0, k, b"\x01" * 8, 0)
    assert t.op("a", 0, 0, k)[0][0] == "val"
    lib.mc_bind(0)
    lost = ctypes.c_int(0)
    kb = ctypes.create_string_buffer(k, 8)
    lib.mc_op(2, t.a.desc_addr(0), kb, None, 0, ctypes.byref(lost))
    lib.mc_clear()                              # a table reload / kernel start
    lib.mc_bind(1)                              # even without validation: nothing cached
    assert t.op("a", 0, 0, k) == (0, 0)


def test_upload_hash_bumps_host_gen():
    m = _maps()
    m.upload_hash(0, {b"\x01" * 8: b"\x02" * 8})
    m.upload_hash(0, {b"\x03" * 8: b"\x04" * 8})
    m.bufs[0]["stats"][8:16].set(np.array([5], "<u8").view(np.uint8))      # lost = 5
    m.clear_hash(0)
    st = m.stats(0)
    assert int(st["host_gen"]) == 3 and int(st["count"]) == 0 and int(st["lost"]) == 0
    assert not m.readback().maps[0]._d


# ---------------------------------------------------------------------------- threads

#: the one-lane shim with real atomics and fences: host threads stand in for the lanes and
#: warps of one CTA sharing the cache (x86 is stronger than the GPU's memory model: this
#: checks the protocol's interleavings, the GPU tests check the hardware)
THREAD_SHIM = r"""
static inline unsigned long long atomicAdd(unsigned long long *a, unsigned long long v) { return __atomic_fetch_add(a, v, __ATOMIC_SEQ_CST); }
static inline unsigned atomicAdd(unsigned *a, unsigned v) { return __atomic_fetch_add(a, v, __ATOMIC_SEQ_CST); }
static inline unsigned atomicCAS(unsigned *a, unsigned c, unsigned v) { __atomic_compare_exchange_n(a, &c, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST); return c; }
static inline unsigned long long atomicCAS(unsigned long long *a, unsigned long long c, unsigned long long v) { __atomic_compare_exchange_n(a, &c, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST); return c; }
static inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
static inline void __threadfence_block() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
static inline void __nanosleep(unsigned) { __builtin_ia32_pause(); }
"""

STRESS = r"""
#include <thread>
#include <vector>
static struct dtmk_map_cache g_mc;
struct Rng { unsigned long long s; unsigned next() { s = s * 6364136223846793005ull + 1442695040888963407ull; return (unsigned)(s >> 33); } };
/* thread t owns keys (t << 8) | r, r < nk, in a hash map H (8-byte keys, u64 values) and a
 * log2 histogram L (4-byte keys); it checks every result against its own model */
static int worker(int t, unsigned long long H, unsigned long long L, int ops, int nk, unsigned seed) {
    Rng g{seed * 7919ull + t};
    std::vector<int> present(nk, 0), lpresent(nk, 0);
    std::vector<unsigned long long> val(nk, 0), cnt(nk, 0);
    int bad = 0;
    for (int i = 0; i < ops; i++) {
        if (g.next() % 16 == 0) dtmk_mc_begin(&g_mc);
        const int r = (int)(g.next() % nk);
        unsigned long long key = ((unsigned long long)t << 8) | r;
        unsigned key4 = (unsigned)key;
        bool lost = false;
        switch (g.next() % 6) {
        case 0: {
            unsigned long long a = dtmk_map_lookup((const struct dtmk_map *)H, &key, 0, &lost);
            if ((a != 0) != (bool)present[r] || (a && *(volatile unsigned long long *)a != val[r])) bad++;
            break; }
        case 1: case 2: {
            unsigned long long flags = g.next() % 3, v = g.next();
            unsigned long long rc = dtmk_map_update((const struct dtmk_map *)H, &key, &v, flags, 0, &lost);
            unsigned long long want = flags == 1 && present[r] ? (unsigned long long)-DTMK_EEXIST
                                    : flags == 2 && !present[r] ? (unsigned long long)-DTMK_ENOENT : 0;
            if (rc != want || lost) bad++;
            if (want == 0) { present[r] = 1; val[r] = v; }
            break; }
        case 3: {
            unsigned long long rc = dtmk_map_delete((const struct dtmk_map *)H, &key, &lost);
            if (rc != (present[r] ? 0ull : (unsigned long long)-DTMK_ENOENT)) bad++;
            present[r] = 0;
            break; }
        case 4: {
            if (dtmk_hist_add((const struct dtmk_map *)L, &key4, 5, &lost) != 0 || lost) bad++;
            lpresent[r] = 1; cnt[r]++;
            unsigned long long a = dtmk_map_lookup((const struct dtmk_map *)L, &key4, 0, &lost);
            if (!a || ((volatile unsigned long long *)a)[3] != cnt[r]) bad++;   /* bucket of 5 */
            break; }
        case 5: {
            if (g.next() % 4) break;
            unsigned long long rc = dtmk_map_delete((const struct dtmk_map *)L, &key4, &lost);
            if (rc != (lpresent[r] ? 0ull : (unsigned long long)-DTMK_ENOENT)) bad++;
            lpresent[r] = 0; cnt[r] = 0;
            break; }
        }
    }
    return bad;
}
extern "C" int mc_stress(unsigned long long H, unsigned long long L, int threads, int ops, int nk, unsigned seed) {
    dtmk_mc_clear(&g_mc, 0, 1);
    dtmk_mc_begin(&g_mc);
    std::vector<std::thread> th;
    std::vector<int> bad(threads, 0);
    for (int t = 0; t < threads; t++) th.emplace_back([&, t] { bad[t] = worker(t, H, L, ops, nk, seed); });
    int total = 0;
    for (int t = 0; t < threads; t++) { th[t].join(); total += bad[t]; }
    return total;
}
"""


def test_threads_sharing_one_cache_see_their_own_keys_exactly():
    if not shutil.which("g++"):
        pytest.skip("g++ not found")
    shim = C.HOST_SHIM
    for name in ("atomicAdd(unsigned long long", "atomicAdd(unsigned *", "atomicCAS(unsigned *",
                 "atomicCAS(unsigned long long", "__threadfence()", "__nanosleep"):
        shim = "\n".join(l for l in shim.splitlines() if name not in l)
    src = "\n".join([shim, THREAD_SHIM, SHIM_EXTRA.replace("static inline void __threadfence_block() {}", ""),
                     '#include "dtrace_mk_abi.h"', C.host_maps_header().replace('#include "dtrace_mk_abi.h"', ""),
                     STRESS])
    td = Path(tempfile.mkdtemp(prefix="mc_stress_"))
    (td / "s.cpp").write_text(src)
    so = td / "s.so"
    res = subprocess.run(["g++", "-std=c++17", "-O2", "-shared", "-fPIC", "-fno-strict-aliasing", "-w", "-pthread",
                          f"-I{KERNEL_DIR}", "-o", str(so), str(td / "s.cpp")], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-4000:]
    lib = ctypes.CDLL(str(so))
    lib.mc_stress.argtypes = [ctypes.c_ulonglong, ctypes.c_ulonglong, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                              ctypes.c_uint]
    for seed in range(3):                          # fresh maps: each run's model starts empty
        maps = DeviceMaps(C.HostDevice, [MapDef("h", "hash", 8, 8, 4096), MapDef("l", "hist_log2", 4, 8 * 64, 4096)], 1)
        assert lib.mc_stress(maps.desc_addr(0), maps.desc_addr(1), 6, 20000, 24, seed) == 0, seed
        assert int(maps.stats(0)["del_gen"]) > 0 and int(maps.stats(0)["probe_exhausted"]) == 0


# ---------------------------------------------------------------------------- builds

def _obs_bytes(ptx: str) -> int:
    m = re.search(r"\.shared \.align \d+ \.b8 O\[(\d+)\];", ptx)
    assert m, "the observer's shared struct O is not in the PTX"
    return int(m.group(1))


@pytest.fixture(scope="module")
def mk_ptx():
    src = (KERNEL_DIR / "megakernel.cu").read_text()
    return {d: nvrtc_compile(src, "megakernel.cu", "sm_90a", "ptx", defines=d).decode()
            for d in ((), ("DTMK_MAP_CACHE",))}


def test_megakernel_observer_grows_by_the_cache(mk_ptx):
    base, mc = mk_ptx[()], mk_ptx[("DTMK_MAP_CACHE",)]
    grow = _obs_bytes(mc) - _obs_bytes(base)
    assert abs(grow - CACHE_BYTES) < 16                    # O is 16-aligned: its tail padding moves
    # dtmk_vm_run_records takes the cache (mangled: P14dtmk_map_cache) only in the variant
    assert "14dtmk_map_cache" in mc and "dtmk_map_cache" not in base and "dtmk_mc_cur" not in base


def test_harness_builds_with_the_cache():
    src = (KERNEL_DIR / "bpf_vm_harness.cu").read_text()
    plain = nvrtc_compile(src, "bpf_vm_harness.cu", "sm_90a", "ptx").decode()
    assert "dtmk_mc_cur" not in plain
    assert nvrtc_compile(src, "bpf_vm_harness.cu", "sm_90a", "cubin", defines=("DTMK_MAP_CACHE",))[:4] == b"\x7fELF"
    csrc = (KERNEL_DIR / "bpf_compiled_harness.cu").read_text()
    assert len(nvrtc_compile(csrc, "bpf_compiled_harness.cu", "sm_90a", "ltoir",
                             defines=("DTMK_MAP_CACHE",))) > 0


def test_compiled_tier_links_the_cache_build():
    spec = C.megakernel_spec(("DTMK_MAP_CACHE", "DTMK_VM_CODE_SMEM"))
    assert "DTMK_MAP_CACHE" in spec.defines and spec.tag != C.MEGAKERNEL_SPEC.tag
    assert C.megakernel_spec(()) == C.MEGAKERNEL_SPEC
