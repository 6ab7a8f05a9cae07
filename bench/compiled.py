"""Compiled tier: build latency (NVRTC LTO-IR, nvJitLink) and, on a GPU, cost per event
against the device VM.

    python bench/compiled.py --cpu [--out DIR]     # build latency only (no GPU; CI)
    python bench/compiled.py [--out DIR] [--quick]  # + GPU: validate, then time

Programs: bench/vm_device.py's (filter, alu, count by class, log2 histogram).

Build latency (--cpu: no GPU needed), side by side for the two link stages of
dtrace_mk.runtime.compiled ("Two-stage builds"), for the compiled harness and for the
megakernel (-DDTMK_COMPILED_TIER):
  stage 1  the kernel's relocatable (-rdc) cubin, built once per kernel hash, linked
           without LTO with the monitor's own relocatable cubin (NVRTC): the swap path
  stage 2  the kernel's LTO-IR + the monitor's LTO-IR, nvJitLink -lto (whole-kernel
           codegen, the monitor inlined): built in the background, swapped in later
  swap_sN = translate + monitor compile + link (what a promotion waits for).
Every repetition links a DIFFERENT monitor (nonce comment) so no cache can answer;
per-repetition link times are printed (the old `link 0.0066 s` figure: see
docs/results/compiled_tier.md).

GPU (one warp per SM, 32 events per warp batch, as bench/vm_device.py): every program
is validated first (compiled r0 per event and maps = reference runtime), then the VM
and the compiled tier (stage 2, inlined, and stage 1, a real call) are timed on the
same events in the same harness shape; then a hot attachment is promoted (stage 1
build + load + table publish: promote_s) and optimised (stage 2: optimize_s).
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

REQUIRES = "gpu"   # what `dtrace-mk bench compiled` checks before it runs: cpu, gpu, or gpu:N (N ranks, N GPUs)
CPU_MODE = "--cpu"   # ... unless this option asks for its CPU-only part

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import numpy as np                                           # noqa: E402

import vm_device as V                                        # noqa: E402
from dtrace_mk.runtime import compiled as C                  # noqa: E402
from dtrace_mk.runtime import device as D                    # noqa: E402

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


def _timed(fn):
    t = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t


def build_latency(reps: int, mk_lto_reps: int = 1, megakernel: bool = True) -> dict:
    """Stage 1 (relocatable link) and stage 2 (full LTO) of the harness and of the
    megakernel, per repetition.  Kernel objects are built once (cached by kernel hash in
    normal use; their cost is reported separately); every repetition links a monitor with
    a distinct nonce comment (distinct inputs: no cache of any kind can answer), in a
    fresh cache directory.  `same_inputs` relinks rep 0's exact stage-2 harness inputs to
    show whether the link itself caches (it does not on the CPU box; see
    docs/results/compiled_tier.md)."""
    progs = bench_monitor()
    base_src = C.monitor_source(progs)
    td0 = tempfile.mkdtemp()
    os.environ["DTRACE_MK_CACHE"] = td0
    C.link._MEM.clear()
    specs = [("harness", C.HARNESS_SPEC)] + ([("megakernel", C.MEGAKERNEL_SPEC)] if megakernel else [])
    kobj, once = {}, {}
    for nm, spec in specs:
        for stage in (1, 2):
            (data, secs) = C.kernel_object(spec, stage)
            kobj[nm, stage] = data
            once[f"{nm}_kernel_{'rdc_cubin' if stage == 1 else 'ltoir'}"] = secs
    runs = []
    for rep in range(reps):
        r = {}
        src, r["translate"] = _timed(lambda: C.monitor_source(progs))
        src = src + f"\n/* bench nonce {rep} {time.time_ns()} */\n"
        m_ir, r["monitor_ltoir"] = _timed(lambda: C.ltoir(src, "monitor.cu"))
        m_rdc, r["monitor_rdc_cubin"] = _timed(lambda: C.relocatable_cubin(src, "monitor.cu"))
        m_rdc128, r["monitor_rdc_cubin_maxrreg128"] = _timed(
            lambda: C.relocatable_cubin(src, "monitor.cu", maxrreg=C.MK_MAXRREG))
        for nm, spec in specs:
            m1 = m_rdc128 if spec.maxrreg else m_rdc
            c1, r[f"{nm}_link_s1"] = _timed(lambda: C.link_relocatable([(spec.name, kobj[nm, 1]), ("m", m1)]))
            r[f"{nm}_s1_cubin_bytes"] = len(c1)
            if nm == "megakernel" and rep >= mk_lto_reps:
                continue
            c2, r[f"{nm}_link_s2"] = _timed(lambda: C.link_cubin([(spec.name, kobj[nm, 2]), ("m", m_ir)]))
            r[f"{nm}_s2_cubin_bytes"] = len(c2)
            if nm == "harness" and rep == 0:
                _, r["harness_link_s2_same_inputs"] = _timed(
                    lambda: C.link_cubin([(spec.name, kobj[nm, 2]), ("m", m_ir)]))
        runs.append(r)
    keys = sorted({k for r in runs for k in r}, key=lambda k: list(runs[0]).index(k) if k in runs[0] else 99)
    out = {k: statistics.median(r[k] for r in runs if k in r) for k in keys}
    out["per_rep"] = runs
    out.update(once)
    for nm, _ in specs:
        out[f"{nm}_swap_s1"] = out["translate"] + out["monitor_rdc_cubin" if nm == "harness"
                                                       else "monitor_rdc_cubin_maxrreg128"] + out[f"{nm}_link_s1"]
        if f"{nm}_link_s2" in out:
            out[f"{nm}_swap_s2"] = out["translate"] + out["monitor_ltoir"] + out[f"{nm}_link_s2"]
    out["monitor_bytes"] = len(base_src)
    return out


def print_latency(lat: dict, reps: int) -> None:
    print(f"build latency (s, median of {reps} distinct monitors; kernel objects built once):")
    for k, v in lat.items():
        if k != "per_rep" and not isinstance(v, dict):
            print(f"  {k:34} {v:.4f}" if isinstance(v, float) else f"  {k:34} {v}")
    print("  per repetition (link s):")
    for i, r in enumerate(lat["per_rep"]):
        print("   ", i, {k: round(v, 4) for k, v in r.items() if "link" in k})
    print(f"\n{'swap (translate + monitor compile + link)':44} {'stage 1':>9} {'stage 2':>9} {'s2/s1':>7}")
    for nm in ("harness", "megakernel"):
        if f"{nm}_swap_s1" not in lat:
            continue
        s1, s2 = lat[f"{nm}_swap_s1"], lat.get(f"{nm}_swap_s2")
        print(f"{nm:44} {s1:9.4f} {s2 if s2 is not None else float('nan'):9.4f} "
              f"{(s2 / s1) if s2 else float('nan'):7.1f}")
        print(f"{'  of which link':44} {lat[f'{nm}_link_s1']:9.4f} {lat.get(f'{nm}_link_s2', float('nan')):9.4f}")


def gpu(quick: bool) -> list:
    import cupy as cp
    from dtrace_mk.runtime.compiled import CompiledRuntime
    from dtrace_mk.runtime.device import MAX_PROGS, DeviceRuntime
    from dtrace_mk.runtime.reference import ReferenceRuntime
    sms = cp.cuda.runtime.getDeviceProperties(0)["multiProcessorCount"]
    workers = sms
    vm, cm = DeviceRuntime(num_workers=workers), CompiledRuntime(num_workers=workers)
    cm1 = CompiledRuntime(num_workers=workers, link_stage=1)
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
        ca1 = cm1.attach(obj, tier="compiled", init_hash=V.prefill(obj))
        cm1.ensure_module()
        t, _, _ = V.time_it(cp, lambda: cm1.launch(d_ctx, n, r0, out, blocks=sms, warps=1, repeat=rep))
        res["compiled_s1_ns_event"] = t / (rep * ev_per_warp)
        cm1.detach(ca1)
        # promotion of a hot attachment: build + load + table publish, then the next launch
        ha = cm.attach(obj, init_hash=V.prefill(obj))
        C.link._MEM.clear()
        t0 = time.perf_counter()
        cm.promote(ha)                                         # stage 1 (relocatable link)
        res["promote_s"] = time.perf_counter() - t0
        res["promote_build"] = vars(cm.last_build) if cm.last_build else None
        t0 = time.perf_counter()
        key, work = cm.prepare_optimize()                      # stage 2 (full LTO), then swap
        assert cm.commit_optimize(key, work())
        res["optimize_s"] = time.perf_counter() - t0
        res["optimize_build"] = vars(cm.last_build) if cm.last_build else None
        cm.detach(ha)
        rows.append(res)
        print(json.dumps(res), flush=True)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cpu", action="store_true", help="build latency only (no GPU)")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--mk-lto-reps", type=int, default=1, help="megakernel full-LTO links (seconds each)")
    ap.add_argument("--no-megakernel", action="store_true", help="harness only")
    ap.add_argument("--out", default=None, help="write compiled.json here")
    args = ap.parse_args(argv)
    meta = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "cpus": os.cpu_count()}
    lat = build_latency(args.reps, args.mk_lto_reps, not args.no_megakernel)
    print_latency(lat, args.reps)
    rows = [] if args.cpu else gpu(args.quick)
    if rows:                                  # the same harness link with a CUDA context live
        lat["after_gpu"] = build_latency(1, 0, False)
        print("after the GPU section (CUDA context live):",
              {k: round(v, 4) for k, v in lat["after_gpu"].items() if "link" in k and isinstance(v, float)})
    if rows:
        print(f"\n{'program':8} {'ins/ev':>6} {'valid':>6} | {'VM ns/ev':>9} {'compiled ns/ev':>14} {'VM/compiled':>11} "
              f"{'s1 ns/ev':>9} | {'promote s1 s':>12} {'LTO s2 s':>9}")
        for r in rows:
            ok = "ok" if r["r0_mismatch"] == 0 and r["maps_equal"] else "FAIL"
            print(f"{r['program']:8} {r['insns_per_event']:6.1f} {ok:>6} | {r['vm_ns_event']:9.2f} "
                  f"{r['compiled_ns_event']:14.2f} {r['vm_over_compiled']:11.2f} {r['compiled_s1_ns_event']:9.2f} | "
                  f"{r['promote_s']:12.3f} "
                  f"{r['optimize_s']:9.2f}")
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        Path(args.out, "compiled.json").write_text(json.dumps({"meta": meta, "build": lat, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
