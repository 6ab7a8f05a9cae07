"""Producer->consumer notification latency between persistent CTAs on different SMs
(issue 4: ~4 us per dependency level in the megakernel).  docs/dev/notify_latency.md.

    python bench/notify.py [--quick] [--iters N] [--reps R] [--json FILE]

A ring of 2 (or 3: the 2-hop chain) CTAs of 512 threads, one per SM (dynamic shared
memory forces that; %smid is checked).  Per iteration every CTA waits for its event
counter, checks the payload its predecessor wrote (512 u32, poisoned first), writes
the payload of its successor, bar.syncs and signals.  One-way latency = elapsed time
of CTA 0 over the timed iterations / (iterations * hops in the ring).  Spins are
bounded: every CHECK-th poll reads the abort word and %globaltimer; a timeout sets a
status word and aborts the other CTAs, so nothing deadlocks.

Variants (one kernel each, compile-time configuration):
  a    megakernel today: bar.sync; t0 red.release.gpu.add | t0 ld.relaxed poll, every
       16th poll 2 control loads + globaltimer; fence.acq_rel.gpu; bar.sync(512)
  a1k  as a, control check every 1024th poll (cost of the every-16th check)
  b    ld.acquire poll, no fence
  b2   ld.relaxed poll, then one ld.acquire of the counter instead of the fence
  c    ld.relaxed poll, no fence, payload read ld.global.cg (L1 bypass; practical, not
       model-sanctioned)
  cu   ld.relaxed poll, no fence, plain payload loads: UNSAFE (stale L1 shows as bad)
  d    producer st.release.gpu (value) instead of red.release.add
  d2   producer fence.acq_rel.gpu + red.relaxed.gpu
  d3   producer atom.release.gpu.add (waits for the L2 answer)
  e    whole warp 0 polls (__any_sync) instead of thread 0
  f    as a with __nanosleep(32) in the spin;  f2: __nanosleep(200)
  g    as a with 32-thread CTAs (no 512-thread wake): a - g = wake cost of 512 threads
  h    2-hop chain: ring of 3 CTAs, pattern a (per hop and per 2-hop chain)
Floors (one CTA, dependent chains): L2 ld.relaxed, ld.acquire, atom round trip,
fence.acq_rel.gpu alone, bar.sync of 512 threads, globaltimer read.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

REQUIRES = "gpu"   # what `dtrace-mk bench notify` checks before it runs: cpu, gpu, or gpu:N (N ranks, N GPUs)

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

SLOTS = 8            # u64 per CTA in `out`
OUT_ELAPSED, OUT_BAD, OUT_SMID, OUT_DONE, OUT_POLLS = 0, 1, 2, 3, 4
POISON = 0xFFFFFFFF
DYN_SMEM = 160 * 1024   # > half an SM's shared memory: one CTA per SM

# name: (POLL, FENCE, CHECK, SLEEP, PROD, WARP, PLD, n_cta, threads, safe, description)
#  POLL 0 ld.relaxed.gpu  1 ld.acquire.gpu
#  FENCE 0 none  1 fence.acq_rel.gpu  2 ld.acquire of the counter
#  PROD 0 red.release.add  1 st.release  2 fence + red.relaxed  3 atom.release.add
#  PLD 0 plain payload loads  1 ld.global.cg
VARIANTS = {
    "a":   (0, 1, 16, 0, 0, 0, 0, 2, 512, True, "megakernel: red.release | relaxed poll/16 + fence.acq_rel + bar.sync"),
    "a1k": (0, 1, 1024, 0, 0, 0, 0, 2, 512, True, "a, control check every 1024th poll"),
    "b":   (1, 0, 16, 0, 0, 0, 0, 2, 512, True, "ld.acquire poll, no fence"),
    "b2":  (0, 2, 16, 0, 0, 0, 0, 2, 512, True, "relaxed poll + one ld.acquire instead of fence"),
    "c":   (0, 0, 16, 0, 0, 0, 1, 2, 512, True, "relaxed poll, no fence, payload ld.cg"),
    "cu":  (0, 0, 16, 0, 0, 0, 0, 2, 512, False, "relaxed poll, no fence, plain loads (UNSAFE)"),
    "d":   (0, 1, 16, 0, 1, 0, 0, 2, 512, True, "producer st.release instead of red"),
    "d2":  (0, 1, 16, 0, 2, 0, 0, 2, 512, True, "producer fence.acq_rel + red.relaxed"),
    "d3":  (0, 1, 16, 0, 3, 0, 0, 2, 512, True, "producer atom.release.add (returns)"),
    "e":   (0, 1, 16, 0, 0, 1, 0, 2, 512, True, "warp 0 polls (__any_sync)"),
    "f":   (0, 1, 16, 32, 0, 0, 0, 2, 512, True, "a + __nanosleep(32) per poll"),
    "f2":  (0, 1, 16, 200, 0, 0, 0, 2, 512, True, "a + __nanosleep(200) per poll"),
    "g":   (0, 1, 16, 0, 0, 0, 0, 2, 32, True, "a with 32-thread CTAs (no 512 wake)"),
    "h":   (0, 1, 16, 0, 0, 0, 0, 3, 512, True, "ring of 3 (2-hop chain), pattern a"),
}
FLOORS = ("l2_ld_relaxed", "l2_ld_acquire", "atom_roundtrip", "fence_acq_rel", "barsync_512", "globaltimer")

SOURCE = r"""
typedef unsigned long long u64;
typedef unsigned int u32;

__device__ __forceinline__ u64 gtime() { u64 t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); return t; }
__device__ __forceinline__ u32 smid() { u32 s; asm volatile("mov.u32 %0, %%smid;" : "=r"(s)); return s; }
__device__ __forceinline__ u64 ld_relaxed(const u64 *p) {
    u64 v; asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory"); return v; }
__device__ __forceinline__ u64 ld_acquire(const u64 *p) {
    u64 v; asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory"); return v; }
__device__ __forceinline__ u32 ld_volatile_u32(const u32 *p) {
    u32 v; asm volatile("ld.volatile.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory"); return v; }
__device__ __forceinline__ u32 ld_cg_u32(const u32 *p) {
    u32 v; asm volatile("ld.global.cg.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory"); return v; }
__device__ __forceinline__ void fence_acq_rel() { asm volatile("fence.acq_rel.gpu;" ::: "memory"); }
__device__ __forceinline__ void red_release_add(u64 *p, u64 v) {
    asm volatile("red.release.gpu.global.add.u64 [%0], %1;" :: "l"(p), "l"(v) : "memory"); }
__device__ __forceinline__ void red_relaxed_add(u64 *p, u64 v) {
    asm volatile("red.relaxed.gpu.global.add.u64 [%0], %1;" :: "l"(p), "l"(v) : "memory"); }
__device__ __forceinline__ void st_release(u64 *p, u64 v) {
    asm volatile("st.release.gpu.global.u64 [%0], %1;" :: "l"(p), "l"(v) : "memory"); }
__device__ __forceinline__ u64 atom_release_add(u64 *p, u64 v) {
    u64 r; asm volatile("atom.release.gpu.global.add.u64 %0, [%1], %2;" : "=l"(r) : "l"(p), "l"(v) : "memory"); return r; }

#define CTL_GEN 0
#define CTL_ABORT 1
#define ST_TIMEOUT 0

__device__ __forceinline__ u32 payload_val(int i, int tid) { return ((u32)(i + 1) << 10) | (u32)tid; }

/* wait until *flag >= target; false on abort/timeout.  The poller (thread 0, or all of
 * warp 0) spins; the rest of the CTA waits in the closing bar.sync (the wake). */
template <int POLL, int FENCE, int CHECK, int SLEEP, int WARP>
__device__ __forceinline__ bool wait_ge(const u64 *flag, u64 target, u32 *ctl, u32 *status,
                                        u64 deadline, u64 *polls) {
    __shared__ int s_ok;
    const bool poller = WARP ? (threadIdx.x < 32) : (threadIdx.x == 0);
    if (poller) {
        int ok = 1;
        unsigned it = 0;
        for (;;) {
            ++it;
            u64 v = POLL ? ld_acquire(flag) : ld_relaxed(flag);
            bool done = v >= target;
            if (WARP) done = __any_sync(0xffffffffu, done);
            if (done) break;
            if (SLEEP) __nanosleep(SLEEP);
            if (it & (CHECK - 1)) continue;
            /* the megakernel's every-16th work: two control words + the clock */
            const u32 gen = ld_volatile_u32(ctl + CTL_GEN);
            const u32 ab = ld_volatile_u32(ctl + CTL_ABORT);
            bool stop = (ab | (gen & 0)) != 0;
            if (!stop && gtime() > deadline) {
                if ((threadIdx.x & 31) == 0) { atomicExch(status + ST_TIMEOUT, 1u); atomicExch(ctl + CTL_ABORT, 1u); }
                stop = true;
            }
            if (WARP) stop = __any_sync(0xffffffffu, stop);
            if (stop) { ok = 0; break; }
        }
        if (ok) {
            if (FENCE == 1) fence_acq_rel();
            if (FENCE == 2) (void)ld_acquire(flag);
        }
        if (threadIdx.x == 0) { s_ok = ok; *polls += it; }
    }
    __syncthreads();
    return s_ok != 0;
}

template <int PROD>
__device__ __forceinline__ void post(u64 *flag, u64 value) {
    if (PROD == 0) red_release_add(flag, 1);
    else if (PROD == 1) st_release(flag, value);
    else if (PROD == 2) { fence_acq_rel(); red_relaxed_add(flag, 1); }
    else (void)atom_release_add(flag, 1);
}

template <int PLD>
__device__ __forceinline__ int check_payload(const u32 *buf, int i) {
    const u32 v = PLD ? ld_cg_u32(buf + threadIdx.x) : buf[threadIdx.x];
    return v != payload_val(i, threadIdx.x);
}

/* ring of gridDim.x CTAs: CTA r waits flags[r], checks payload[r], writes payload[r+1],
 * bar.syncs, signals flags[r+1].  CTA 0 starts each round. */
template <int POLL, int FENCE, int CHECK, int SLEEP, int PROD, int WARP, int PLD>
__device__ void ring(u64 *flags, u32 *payload, u32 *ctl, u32 *status, u64 *out,
                     int warm, int iters, u64 timeout_ns) {
    extern __shared__ u32 dyn_smem[];
    const int r = blockIdx.x, n = gridDim.x, nx = (r + 1) % n, B = blockDim.x;
    const u64 deadline = gtime() + timeout_ns;
    if (threadIdx.x == 0) dyn_smem[0] = 0;   /* the dynamic shared memory only pins one CTA per SM */
    u64 polls = 0, t0 = 0, t1 = 0;
    int bad = 0, done = 0;
    const int total = warm + iters;
    for (int i = 0; i < total; ++i) {
        const u64 tgt = (u64)(i + 1);
        if (r == 0 && i == warm) t0 = gtime();
        int mism = 0;
        if (r != 0) {
            if (!wait_ge<POLL, FENCE, CHECK, SLEEP, WARP>(flags + r, tgt, ctl, status, deadline, &polls)) break;
            mism = check_payload<PLD>(payload + r * B, i);
        }
        payload[nx * B + threadIdx.x] = payload_val(i, threadIdx.x);
        bad += __syncthreads_count(mism);          /* the producer's bar.sync after its body */
        if (threadIdx.x == 0) post<PROD>(flags + nx, tgt);
        if (r == 0) {
            if (!wait_ge<POLL, FENCE, CHECK, SLEEP, WARP>(flags, tgt, ctl, status, deadline, &polls)) break;
            /* checked before the next round's bar.sync, so CTA 1 cannot overwrite it early */
            bad += __syncthreads_count(check_payload<PLD>(payload, i));
        }
        done = i + 1;
    }
    t1 = gtime();
    if (threadIdx.x == 0) {
        out[r * 8 + 0] = (r == 0 && done == total) ? t1 - t0 : 0;
        out[r * 8 + 1] = (u64)bad;
        out[r * 8 + 2] = smid();
        out[r * 8 + 3] = (u64)done;
        out[r * 8 + 4] = polls;
    }
}

#define RING(NAME, ...)                                                                     \
    extern "C" __global__ void __launch_bounds__(512) NAME(u64 *flags, u32 *payload, u32 *ctl, \
            u32 *status, u64 *out, int warm, int iters, u64 timeout_ns) {                   \
        ring<__VA_ARGS__>(flags, payload, ctl, status, out, warm, iters, timeout_ns);        \
    }
@RINGS@

/* floors: one CTA; out[0] = elapsed ns for n ops, out[1] = a value (kept live) */
extern "C" __global__ void __launch_bounds__(512) floors(int mode, u64 *buf, u64 *out, int n) {
    u64 acc = 0;
    __syncthreads();
    const u64 t0 = gtime();
    if (mode == 4) {
        for (int k = 0; k < n; ++k) { __syncthreads(); acc += k; }
    } else if (threadIdx.x == 0) {
        u64 x = 0;
        for (int k = 0; k < n; ++k) {
            if (mode == 0) x = ld_relaxed(buf + (x & 1));              /* buf[0] = buf[1] = 0 */
            else if (mode == 1) x = ld_acquire(buf + (x & 1));
            else if (mode == 2) x = atom_release_add(buf + 2 + (x & 1), 0);
            else if (mode == 3) fence_acq_rel();
            else if (mode == 5) x += gtime();
        }
        acc = x;
    }
    __syncthreads();
    const u64 t1 = gtime();
    if (threadIdx.x == 0) { out[0] = t1 - t0; out[1] = acc; }
}
"""


def kernel_source() -> str:
    rings = "\n".join(f"RING(ring_{k}, {', '.join(str(x) for x in v[:7])})" for k, v in VARIANTS.items())
    return SOURCE.replace("@RINGS@", rings)


def compile_cubin(arch: str = "sm_90a") -> bytes:
    from dtrace_mk.kernels.build import nvrtc_compile
    return nvrtc_compile(kernel_source(), name="notify.cu", arch=arch, target="cubin",
                         options=("-lineinfo",))


def verdict(out_rows, status_timeout: int, n_cta: int, total: int, safe: bool) -> str:
    """'ok', or what went wrong, from the per-CTA rows (elapsed, bad, smid, done, polls)."""
    if status_timeout:
        return "TIMEOUT"
    rows = [list(out_rows[r]) for r in range(n_cta)]
    if any(row[OUT_DONE] != total for row in rows):
        return "INCOMPLETE"
    if len({row[OUT_SMID] for row in rows}) != n_cta:
        return "SAME_SM"
    bad = sum(row[OUT_BAD] for row in rows)
    if bad:
        return f"BAD{bad}" if safe else f"stale{bad}"
    if rows[0][OUT_ELAPSED] == 0:
        return "NO_TIME"
    return "ok"


def run_variant(cp, mod, key, warm, iters, timeout_ns):
    import numpy as np
    POLL, FENCE, CHECK, SLEEP, PROD, WARP, PLD, n_cta, threads, safe, _ = VARIANTS[key]
    k = mod.get_function(f"ring_{key}")
    k.max_dynamic_shared_size_bytes = DYN_SMEM
    flags = cp.zeros(n_cta, cp.uint64)
    payload = cp.full(n_cta * threads, POISON, cp.uint32)
    ctl = cp.zeros(4, cp.uint32)
    status = cp.zeros(4, cp.uint32)
    out = cp.zeros(n_cta * SLOTS, cp.uint64)
    k((n_cta,), (threads,), (flags, payload, ctl, status, out, np.int32(warm), np.int32(iters),
                             np.uint64(timeout_ns)), shared_mem=DYN_SMEM)
    cp.cuda.runtime.deviceSynchronize()
    o = out.get().reshape(n_cta, SLOTS)
    total = warm + iters
    v = verdict(o, int(status.get()[0]), n_cta, total, safe)
    f = flags.get()
    if v == "ok" and any(int(x) != total for x in f):
        v = "FLAGS"
    hop_ns = o[0, OUT_ELAPSED] / (iters * n_cta) if o[0, OUT_ELAPSED] else float("nan")
    polls = float(o[:, OUT_POLLS].sum()) / (total * n_cta)
    return hop_ns, v, polls, [int(s) for s in o[:, OUT_SMID]]


def run_floor(cp, mod, mode, n):
    import numpy as np
    k = mod.get_function("floors")
    buf = cp.zeros(8, cp.uint64)
    out = cp.zeros(2, cp.uint64)
    k((1,), (512,), (np.int32(mode), buf, out, np.int32(n)))
    cp.cuda.runtime.deviceSynchronize()
    return float(out.get()[0]) / n


def card(cp) -> str:
    p = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
    name = p["name"].decode() if isinstance(p["name"], bytes) else p["name"]
    return (f"{name}, {p['multiProcessorCount']} SMs, sm_{p['major']}{p['minor']}, "
            f"L2 {p['l2CacheSize'] >> 20} MiB, driver {cp.cuda.runtime.driverGetVersion()}, "
            f"runtime {cp.cuda.runtime.runtimeGetVersion()}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer iterations (< 30 s)")
    ap.add_argument("--iters", type=int, default=None)
    ap.add_argument("--reps", type=int, default=None)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--timeout-ms", type=float, default=3000.0)
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    iters = a.iters or (2000 if a.quick else 20000)
    reps = a.reps or (3 if a.quick else 7)
    warm = max(50, iters // 20)
    import cupy as cp
    import hashlib
    from dtrace_mk.kernels.build import cache_dir
    cubin = compile_cubin()
    path = cache_dir() / f"notify_{hashlib.sha256(cubin).hexdigest()[:16]}.cubin"
    path.write_bytes(cubin)
    mod = cp.RawModule(path=str(path))

    print(f"card: {card(cp)}")
    print(f"iters {iters} (+{warm} warm-up), reps {reps}, median of reps; one-way ns per hop")
    floors = {}
    for m, name in enumerate(FLOORS):
        n = 2000 if name == "barsync_512" else 4000
        run_floor(cp, mod, m, 200)
        floors[name] = statistics.median(run_floor(cp, mod, m, n) for _ in range(reps))
    results, failed = {}, False
    for key in a.variants.split(","):
        runs = [run_variant(cp, mod, key, warm, iters, int(a.timeout_ms * 1e6)) for _ in range(reps)]
        verdicts = sorted({r[1] for r in runs})
        v = "ok" if verdicts == ["ok"] else "/".join(x for x in verdicts if x != "ok")
        hop = statistics.median(r[0] for r in runs)
        results[key] = dict(hop_ns=hop, verdict=v, polls_per_wait=statistics.median(r[2] for r in runs),
                            smids=runs[0][3], spread_ns=max(r[0] for r in runs) - min(r[0] for r in runs))
        if VARIANTS[key][9] and v != "ok":
            failed = True
    base = results.get("a", {}).get("hop_ns")
    print("\nfloors (one CTA, dependent chain, ns per op):")
    for name, ns in floors.items():
        print(f"  {name:16s} {ns:8.0f}")
    print(f"\n{'var':4s} {'one-way ns':>10s} {'vs a':>6s} {'spread':>7s} {'polls':>7s} {'check':>8s}  sms        what")
    for key, r in results.items():
        ratio = r["hop_ns"] / base if base else float("nan")
        print(f"{key:4s} {r['hop_ns']:10.0f} {ratio:6.2f} {r['spread_ns']:7.0f} {r['polls_per_wait']:7.1f} "
              f"{r['verdict']:>8s}  {','.join(map(str, r['smids'])):10s} {VARIANTS[key][10]}")
    if "h" in results:
        print(f"h: 2-hop chain = {2 * results['h']['hop_ns']:.0f} ns (2 x one-way)")
    if "a" in results and "g" in results:
        print(f"wake of 512 threads (a - g): {results['a']['hop_ns'] - results['g']['hop_ns']:.0f} ns")
    if a.json:
        Path(a.json).write_text(json.dumps(dict(card=card(cp), iters=iters, reps=reps, floors=floors,
                                                variants=results), indent=1))
    print("RESULT", "FAIL (a safe variant timed out, saw bad payload or shared an SM)" if failed else "OK")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
