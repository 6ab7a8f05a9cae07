"""Device VM speed: ns per instruction on the GPU, beside a naive switch interpreter.

    python bench/vm_device.py [--out DIR] [--quick]

Programs: a short filter, an ALU-heavy monitor (branches, 32/64-bit arithmetic), a
count-by-class monitor (hash lookup + atomic add) and a latency histogram (hist_add).
Each is first VALIDATED: the device VM's r0 per event and final maps must equal the
reference runtime's on a validation batch, and the naive interpreter's r0 too.

Then timed with CUDA events (median of several launches after a warm-up; each launch
re-runs its events `repeat` times in-kernel).  Engines and configurations:

  vm  1w/SM   the device VM, one warp per SM (the megakernel's observer warp):
              132 blocks x 32 threads, 32 events per warp batch (one per lane)
  vm  full    the device VM filling the GPU: 132*8 blocks x 4 warps
  naive 1w/SM the naive interpreter, same grid: one event per thread
  naive t0    the naive interpreter on ONE thread per SM (the thread-0-inline hook
              model the design's ~130 ns/insn figure came from)

Figures:
  ns/insn      per event-instruction, per warp: wall time x warps / (events x insns per
               event) -- what one observer warp spends per instruction of one event
  ns/step      per instruction step of a warp batch: wall time / (batches per warp x
               insns per event) -- the latency of one interpreted instruction
  GPU ns/insn  wall time / (all events x insns): the whole GPU's throughput
Insns per event come from the reference VM (RunResult.insns) over the same events.
"""
from __future__ import annotations

import argparse
import json
import struct
import sys
import time
from pathlib import Path

REQUIRES = "gpu"   # what `dtrace-mk bench vm_device` checks before it runs: cpu, gpu, or gpu:N (N ranks, N GPUs)

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np                                           # noqa: E402

from dtrace_mk.abi import context                            # noqa: E402
from dtrace_mk.abi import definition as abi                  # noqa: E402
from dtrace_mk.bpf import asm, isa                           # noqa: E402
from dtrace_mk.bpf.program import BpfObject, MapDef, Program  # noqa: E402
from dtrace_mk.runtime.reference import ReferenceRuntime     # noqa: E402

HOOK = abi.hook("task:end")

FILTER = ("filter", [], """
    ldxw r2, [r1+28]
    jne r2, 3, out
    ldxdw r3, [r1+96]
    jle r3, 20000, out
    mov r0, 1
    exit
out:
    mov r0, 0
    exit
""")

ALU = ("alu", [], """
    ldxdw r2, [r1+96]
    ldxdw r3, [r1+104]
    ldxw r4, [r1+28]
    ldxw r5, [r1+32]
    mov r0, r2
    add r0, r3
    mul r0, 0x9e3779b9
    xor r0, r4
    rsh r3, 3
    sub r2, r3
    lsh r4, 5
    or r4, r5
    jgt r4, 100, big
    add32 r0, r4
    mul32 r0, 7
    ja mix
big:
    arsh r0, 2
    add r0, r5
mix:
    mov r6, r0
    and r6, 0xffff
    mul r6, r2
    xor r0, r6
    rsh r6, 7
    add r0, r6
    mov r7, r5
    mod r7, 13
    add r0, r7
    jset r0, 1, odd
    neg r0
    ja tail
odd:
    be32 r0
tail:
    mov r8, r0
    lsh r8, 13
    xor r0, r8
    mov r8, r0
    rsh r8, 7
    xor r0, r8
    mov r8, r0
    lsh r8, 17
    xor r0, r8
    add r0, r2
    exit
""")

COUNT = ("count", [MapDef("counts", "hash", 4, 8, 64)], """
    ldxw r2, [r1+28]
    and r2, 15
    stxw [r10-4], r2
    lddw r1, map:counts
    mov r2, r10
    add r2, -4
    call map_lookup_elem
    jeq r0, 0, out
    mov r1, 1
    xadddw [r0+0], r1
out:
    mov r0, 0
    exit
""")

HIST = ("hist", [MapDef("lat", "hist_log2", 4, 512, 64)], """
    ldxw r2, [r1+28]
    and r2, 15
    stxw [r10-4], r2
    ldxdw r3, [r1+96]
    lddw r1, map:lat
    mov r2, r10
    add r2, -4
    call hist_add
    mov r0, 0
    exit
""")

PROGRAMS = [FILTER, ALU, COUNT, HIST]
VARIANTS = {"noprefetch": ["DTMK_VM_NO_PREFETCH"], "localregs": ["DTMK_VM_REGS_LOCAL"]}


def obj_of(spec):
    name, maps, text = spec
    insns = asm.assemble(text, [m.name for m in maps])
    return BpfObject([Program(name, HOOK.section, HOOK, insns)], list(maps), path=f"<bench {name}>")


def contexts(n: int, workers: int, seed: int = 1) -> np.ndarray:
    rnd = np.random.default_rng(seed)
    recs = bytearray(context.pack(HOOK) * n)
    a = np.frombuffer(recs, dtype=np.uint8).reshape(n, abi.CONTEXT_SIZE).copy()
    w32 = a.view("<u4")
    w64 = a.view("<u8")
    off = lambda f: abi.FIELDS_BY_NAME[f].offset
    w32[:, off("worker") // 4] = rnd.integers(0, workers, n)
    w32[:, off("task_class") // 4] = rnd.integers(0, 16, n)
    w32[:, off("task_index") // 4] = np.arange(n)
    w64[:, off("dur_ns") // 8] = rnd.integers(0, 1 << 20, n) * rnd.integers(0, 2, n) + rnd.integers(0, 40000, n)
    w64[:, off("wait_ns") // 8] = rnd.integers(0, 1 << 16, n)
    w64[:, off("ts_ns") // 8] = np.arange(n) * 1000
    return a


def prefill(obj):
    return {"counts": {struct.pack("<I", k): bytes(8) for k in range(16)}} if obj.maps and \
        obj.maps[0].name == "counts" else {}


def validate(obj, dev_rt, cp, ctx, naive_fn) -> dict:
    """Device VM vs reference (r0, maps) and naive vs reference (r0)."""
    from dtrace_mk.runtime.device import DeviceRuntime
    ref = ReferenceRuntime(num_workers=dev_rt.num_workers)
    raid = ref.attach(obj)
    for k, v in prefill(obj).get("counts", {}).items():
        ref.maps(raid)["counts"].update(k, v)
    recs = [ctx[i].tobytes() for i in range(ctx.shape[0])]
    rr = [ref.fire(r)[0] for r in recs]
    rt = DeviceRuntime(num_workers=dev_rt.num_workers)
    daid = rt.attach(obj, init_hash=prefill(obj))
    b = rt.fire(recs)
    bad = sum(1 for i, fr in enumerate(rr) if b.results(i)[0][3] != fr.r0)
    ms_ref = ref.maps(raid).snapshot()
    ms_dev = rt.maps(daid).snapshot()
    naive_r0 = naive_fn(ctx)
    bad_naive = int(sum(1 for i, fr in enumerate(rr) if int(naive_r0[i]) != fr.r0))
    vm = ref.attachment(raid).progs[0].vm          # maps compared above: now count insns
    ipe = float(np.mean([vm.run(r).insns for r in recs]))
    return {"r0_mismatch": bad, "maps_equal": ms_ref == ms_dev, "naive_r0_mismatch": bad_naive,
            "insns_per_event": ipe}


def time_it(cp, launch, reps: int = 5, warm_s: float = 0.15) -> float:
    """Median, min, max ns of one launch, after launching for warm_s seconds first (the
    clocks ramp up from idle; a few launches are not enough)."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < warm_s:
        launch()
        cp.cuda.runtime.deviceSynchronize()
    ts = []
    for _ in range(reps):
        a, b = cp.cuda.Event(), cp.cuda.Event()
        a.record()
        launch()
        b.record()
        b.synchronize()
        ts.append(cp.cuda.get_elapsed_time(a, b) * 1e6)     # ns
    return float(np.median(ts)), float(np.min(ts)), float(np.max(ts))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="write vm_device.json here")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    import cupy as cp
    from dtrace_mk.runtime.device import MAX_PROGS, DeviceRuntime
    props = cp.cuda.runtime.getDeviceProperties(0)
    sms = props["multiProcessorCount"]
    card = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
    workers = sms
    rt = DeviceRuntime(num_workers=workers)
    variants = {v: DeviceRuntime(num_workers=workers, defines=d) for v, d in VARIANTS.items()}
    ev_per_warp = 1024 if args.quick else 4096
    rows = []
    meta = {"card": card, "sms": sms, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "clock_khz": props.get("clockRate"), "variants": VARIANTS}
    for spec in PROGRAMS:
        obj = obj_of(spec)
        name = spec[0]
        # naive: raw slots + map descriptor addresses
        aid = rt.attach(obj, init_hash=prefill(obj))
        dm = rt.device_maps(aid)
        slots = np.frombuffer(isa.encode(obj.programs[0].insns), dtype=np.uint64)
        d_code = cp.asarray(slots)
        d_maps = cp.asarray(np.array(dm.desc_addrs or [0], dtype=np.uint64))

        def naive_run(ctx_np, blocks, threads_per_warp, repeat, d_ctx=None, r0=None):
            d_ctx = d_ctx if d_ctx is not None else cp.asarray(ctx_np.reshape(-1))
            n = d_ctx.size // abi.CONTEXT_SIZE
            r0 = r0 if r0 is not None else cp.zeros(n, dtype=cp.uint64)
            rt.naive((blocks,), (32,), (d_code, d_maps, d_ctx, r0, np.uint32(n), np.uint32(len(slots)),
                                        np.uint32(threads_per_warp), np.uint32(repeat)))
            return r0

        val_ctx = contexts(2048, workers, seed=7)
        v = validate(obj, rt, cp, val_ctx,
                     lambda c: naive_run(c, sms, 32, 1).get())
        ipe = v["insns_per_event"]
        n = sms * ev_per_warp
        ctx = contexts(n, workers)
        d_ctx = cp.asarray(ctx.reshape(-1))
        r0 = cp.zeros(n * MAX_PROGS, dtype=cp.uint64)
        out = cp.zeros(n * MAX_PROGS, dtype=cp.uint8)
        rep = 4 if args.quick else 8
        res = {"program": name, "insns_per_event": ipe, **v}
        # device VM, one warp per SM
        t, tmin, tmax = time_it(cp, lambda: rt.launch(d_ctx, n, r0, out, blocks=sms, warps=1, repeat=rep))
        res["vm_1w_ns_insn"] = t / (rep * ev_per_warp * ipe)
        res["vm_1w_ns_step"] = t / (rep * (ev_per_warp / 32) * ipe)
        res["vm_1w_spread"] = (tmax - tmin) / t
        res["vm_1w_clock_mhz"] = rt.last_clock_mhz()
        res["vm_1w_cycles_step"] = res["vm_1w_ns_step"] * res["vm_1w_clock_mhz"] / 1e3
        t2, _, _ = time_it(cp, lambda: rt.launch(d_ctx, n, r0, out, blocks=sms, warps=1, repeat=rep))
        res["vm_1w_repeat_ns_insn"] = t2 / (rep * ev_per_warp * ipe)
        # device VM, full GPU
        t, _, _ = time_it(cp, lambda: rt.launch(d_ctx, n, r0, out, blocks=sms * 8, warps=4, repeat=rep))
        res["vm_full_gpu_ns_insn"] = t / (rep * n * ipe)
        res["vm_full_clock_mhz"] = rt.last_clock_mhz()
        # variants (same events, one warp per SM), each validated on r0 first
        recs = [val_ctx[i].tobytes() for i in range(val_ctx.shape[0])]
        ref_r0 = [int(r) for r in rt.fire(recs).r0[:, 0]]
        for vname, vrt in variants.items():
            vaid = vrt.attach(obj, init_hash=prefill(obj))
            vr0 = [int(r) for r in vrt.fire(recs).r0[:, 0]]
            res[f"{vname}_r0_mismatch"] = sum(a != b for a, b in zip(vr0, ref_r0)) if name in ("filter", "alu") else 0
            t, _, _ = time_it(cp, lambda: vrt.launch(d_ctx, n, r0, out, blocks=sms, warps=1, repeat=rep))
            res[f"{vname}_1w_ns_insn"] = t / (rep * ev_per_warp * ipe)
            vrt.detach(vaid)
        # naive, one warp per SM, one event per thread
        nr0 = cp.zeros(n, dtype=cp.uint64)
        t, _, _ = time_it(cp, lambda: naive_run(None, sms, 32, rep, d_ctx, nr0))
        res["naive_1w_ns_insn"] = t / (rep * ev_per_warp * ipe)
        res["naive_1w_ns_step"] = t / (rep * (ev_per_warp / 32) * ipe)
        # naive, one thread per SM
        n0 = sms * (64 if args.quick else 256)
        t, _, _ = time_it(cp, lambda: naive_run(None, sms, 1, 1, d_ctx[:n0 * abi.CONTEXT_SIZE], nr0), reps=3)
        res["naive_t0_ns_insn"] = t / ((n0 / sms) * ipe)
        rows.append(res)
        print(json.dumps(res), flush=True)
        rt.detach(aid)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        Path(args.out, "vm_device.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    print(f"\n{card}, {sms} SMs, {meta['date']}")
    print(f"{'program':8} {'ins/ev':>6} {'valid':>6} | {'vm ns/insn':>10} {'vm ns/step':>10} {'cyc/step':>8} "
          f"{'MHz':>5} {'vm GPU':>8} | "
          f"{'naive ns/insn':>13} {'naive ns/step':>13} {'naive t0':>9} | {'speedup':>7} | "
          f"{'noprefetch':>10} {'localregs':>9}")
    for r in rows:
        ok = "ok" if r["r0_mismatch"] == 0 and r["maps_equal"] and r["naive_r0_mismatch"] == 0 and \
            not any(r[f"{v}_r0_mismatch"] for v in VARIANTS) else "FAIL"
        print(f"{r['program']:8} {r['insns_per_event']:6.1f} {ok:>6} | {r['vm_1w_ns_insn']:10.2f} "
              f"{r['vm_1w_ns_step']:10.1f} {r['vm_1w_cycles_step']:8.0f} {r['vm_1w_clock_mhz']:5.0f} "
              f"{r['vm_full_gpu_ns_insn']:8.4f} | {r['naive_1w_ns_insn']:13.2f} "
              f"{r['naive_1w_ns_step']:13.1f} {r['naive_t0_ns_insn']:9.1f} | "
              f"{r['naive_1w_ns_insn'] / r['vm_1w_ns_insn']:7.2f} | {r['noprefetch_1w_ns_insn']:10.2f} "
              f"{r['localregs_1w_ns_insn']:9.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
