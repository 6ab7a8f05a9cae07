"""Compiled tier: build latency (NVRTC LTO-IR, nvJitLink) and, on a GPU, cost per event
against the device VM.

    python bench/compiled.py --cpu [--out DIR]     # build latency only (no GPU; CI)
    python bench/compiled.py [--out DIR] [--quick]  # + GPU: validate, then time

Programs: bench/vm_device.py's (filter, alu, count by class, log2 histogram).

Build latency, each step uncached (fresh cache directory and in-memory cache per run;
median of --reps runs):
  translate      eBPF records -> CUDA C (Python)
  monitor_ltoir  NVRTC -dlto -rdc of the monitor (all four programs)
  harness_ltoir  NVRTC -dlto -rdc of kernels/bpf_compiled_harness.cu (cached by kernel
                 hash in normal use: paid once per kernel build, not per promotion)
  link           nvJitLink -lto of harness + monitor -> cubin (whole-kernel codegen)
  link_tiny      the same monitor linked with a tiny one-kernel module (what the link costs
                 when the kernel side is small)
  swap = translate + monitor_ltoir + link: what a promotion waits for with the kernel's
  LTO-IR cached (built off the launch path; the swap at the launch boundary itself is a
  module pointer and a table write).

GPU (one warp per SM, 32 events per warp batch, as bench/vm_device.py): every program
is validated first (compiled r0 per event and maps = reference runtime), then the VM
and the compiled tier are timed on the same events in the same harness shape.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import numpy as np                                           # noqa: E402

import vm_device as V                                        # noqa: E402
from dtrace_mk.runtime import compiled as C                  # noqa: E402
from dtrace_mk.runtime import device as D                    # noqa: E402

TINY = r'''
#include "bpf_maps.cuh"
extern "C" __device__ int dtmk_cm_hook_4(dtmk_u32 cm_id, const struct dtmk_ctx *ctx, dtmk_u32 worker,
                                         dtmk_u32 epoch, dtmk_u32 flags, dtmk_u64 *r0);
extern "C" __global__ void tiny(const struct dtmk_ctx *c, dtmk_u64 *r0, int *o, dtmk_u32 n) {
    for (dtmk_u32 k = 0; k < n; k++)
        o[threadIdx.x] = dtmk_cm_hook_4(k, c + threadIdx.x, 0, 0, 1, r0 + threadIdx.x);
}
'''


def bench_monitor():
    """MonitorProgram per bench program (symbolic map addresses: compile cost only)."""
    from dtrace_mk.bpf.verifier import verify
    progs = []
    for i, spec in enumerate(V.PROGRAMS):
        obj = V.obj_of(spec)
        p = obj.programs[0]
        res = verify(p, obj.maps)
        descs = [0x7F00_0000_0000 + 128 * j for j in range(len(obj.maps))]
        vals = [0x7E00_0000_0000 if m.type == "array" else 0 for m in obj.maps]
        progs.append(C.MonitorProgram(p.hook.id, i, p.name, D.encode_program(p.insns, descs, vals),
                                      res.max_path_insns, res.stack_depth))
    return progs


def build_latency(reps: int) -> dict:
    runs = []
    progs = bench_monitor()
    for _ in range(reps):
        with tempfile.TemporaryDirectory() as td:
            os.environ["DTRACE_MK_CACHE"] = td
            C._MEM.clear()
            r = {}
            t = time.perf_counter()
            src = C.monitor_source(progs)
            r["translate"] = time.perf_counter() - t
            t = time.perf_counter()
            m_ir = C.ltoir(src, "monitor.cu")
            r["monitor_ltoir"] = time.perf_counter() - t
            h_ir, r["harness_ltoir"] = C.harness_ltoir()
            if C.nvjitlink_available():
                t = time.perf_counter()
                C.link_cubin([("h", h_ir), ("m", m_ir)])
                r["link"] = time.perf_counter() - t
                tiny = C.ltoir(TINY, "tiny.cu")
                t = time.perf_counter()
                C.link_cubin([("tiny", tiny), ("m", m_ir)])
                r["link_tiny"] = time.perf_counter() - t
            runs.append(r)
    out = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    if "link" in out:
        out["swap"] = out["translate"] + out["monitor_ltoir"] + out["link"]
    out["monitor_bytes"] = len(src)
    return out


def gpu(quick: bool) -> list:
    import cupy as cp
    from dtrace_mk.runtime.compiled import CompiledRuntime
    from dtrace_mk.runtime.device import MAX_PROGS, DeviceRuntime
    from dtrace_mk.runtime.reference import ReferenceRuntime
    sms = cp.cuda.runtime.getDeviceProperties(0)["multiProcessorCount"]
    workers = sms
    vm, cm = DeviceRuntime(num_workers=workers), CompiledRuntime(num_workers=workers)
    ev_per_warp = 1024 if quick else 4096
    rows = []
    for spec in V.PROGRAMS:
        obj = V.obj_of(spec)
        name = spec[0]
        val = V.contexts(2048, workers, seed=7)
        recs = [val[i].tobytes() for i in range(val.shape[0])]
        ref = ReferenceRuntime(num_workers=workers)
        raid = ref.attach(obj)
        for k, v in V.prefill(obj).get("counts", {}).items():
            ref.maps(raid)["counts"].update(k, v)
        rr = [ref.fire(r)[0] for r in recs]
        chk = CompiledRuntime(num_workers=workers)
        caid = chk.attach(obj, tier="compiled", init_hash=V.prefill(obj))
        b = chk.fire(recs)
        res = {"program": name,
               "r0_mismatch": sum(1 for i, fr in enumerate(rr) if b.results(i)[0][3] != fr.r0),
               "maps_equal": ref.maps(raid).snapshot() == chk.maps(caid).snapshot()}
        ipe = float(np.mean([ref.attachment(raid).progs[0].vm.run(r).insns for r in recs]))
        res["insns_per_event"] = ipe
        n = sms * ev_per_warp
        d_ctx = cp.asarray(V.contexts(n, workers).reshape(-1))
        r0 = cp.zeros(n * MAX_PROGS, dtype=cp.uint64)
        out = cp.zeros(n * MAX_PROGS, dtype=cp.uint8)
        rep = 4 if quick else 8
        va = vm.attach(obj, init_hash=V.prefill(obj))
        t, _, _ = V.time_it(cp, lambda: vm.launch(d_ctx, n, r0, out, blocks=sms, warps=1, repeat=rep))
        res["vm_ns_event"] = t / (rep * ev_per_warp)
        vm.detach(va)
        ca = cm.attach(obj, tier="compiled", init_hash=V.prefill(obj))
        cm.ensure_module()
        t, _, _ = V.time_it(cp, lambda: cm.launch(d_ctx, n, r0, out, blocks=sms, warps=1, repeat=rep))
        res["compiled_ns_event"] = t / (rep * ev_per_warp)
        res["vm_over_compiled"] = res["vm_ns_event"] / res["compiled_ns_event"]
        cm.detach(ca)
        # promotion of a hot attachment: build + load + table publish, then the next launch
        ha = cm.attach(obj, init_hash=V.prefill(obj))
        C._MEM.clear()
        t0 = time.perf_counter()
        cm.promote(ha)
        res["promote_s"] = time.perf_counter() - t0
        res["promote_build"] = vars(cm.last_build) if cm.last_build else None
        cm.detach(ha)
        rows.append(res)
        print(json.dumps(res), flush=True)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cpu", action="store_true", help="build latency only (no GPU)")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", default=None, help="write compiled.json here")
    args = ap.parse_args(argv)
    meta = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "cpus": os.cpu_count()}
    lat = build_latency(args.reps)
    print("build latency (s, median of %d, uncached):" % args.reps)
    for k, v in lat.items():
        print(f"  {k:14} {v:.4f}" if isinstance(v, float) else f"  {k:14} {v}")
    rows = [] if args.cpu else gpu(args.quick)
    if rows:
        print(f"\n{'program':8} {'ins/ev':>6} {'valid':>6} | {'VM ns/ev':>9} {'compiled ns/ev':>14} {'VM/compiled':>11} "
              f"| {'promote s':>9}")
        for r in rows:
            ok = "ok" if r["r0_mismatch"] == 0 and r["maps_equal"] else "FAIL"
            print(f"{r['program']:8} {r['insns_per_event']:6.1f} {ok:>6} | {r['vm_ns_event']:9.2f} "
                  f"{r['compiled_ns_event']:14.2f} {r['vm_over_compiled']:11.2f} | {r['promote_s']:9.2f}")
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        Path(args.out, "compiled.json").write_text(json.dumps({"meta": meta, "build": lat, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
