"""Reference VM and verifier speed, side by side in one run.

    .venv/bin/python bench/vm.py [--seconds 0.5]

For each representative monitor: validate its result once (a benchmark of a wrong
program is worthless), then run it over a fixed event mix for ~--seconds and report
instructions per run, runs/s, instructions/s and microseconds per event, relative to
the first row.  Then time the verifier on a 4096-instruction program (two shapes) and
state it in VM runs of the same program.  No assertions on timings anywhere.
"""
from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path
from typing import Callable, List, Tuple

REQUIRES = "cpu"   # what `dtrace-mk bench vm` checks before it runs: cpu, gpu, or gpu:N (N ranks, N GPUs)

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dtrace_mk.abi import context                       # noqa: E402
from dtrace_mk.abi import definition as abi             # noqa: E402
from dtrace_mk.bpf import asm                           # noqa: E402
from dtrace_mk.bpf.maps import MapSet                   # noqa: E402
from dtrace_mk.bpf.program import MapDef, Program       # noqa: E402
from dtrace_mk.bpf.vm import Vm                         # noqa: E402

HOOK = abi.hook("task:end")

FILTER = ("filter only: class == 3 && dur > 20000", [], """
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

COUNT = ("count by class (hash lookup + atomic add)", [MapDef("counts", "hash", 4, 8, 64)],
         (Path(__file__).resolve().parents[1] / "examples" / "monitors" / "count_by_class.s").read_text())

HIST = ("hist(dur) by layer (hist_add)", [MapDef("lat", "hist_log2", 4, 512, 64)], """
    ldxw r2, [r1+60]
    stxw [r10-4], r2
    ldxdw r3, [r1+96]
    lddw r1, map:lat
    mov r2, r10
    add r2, -4
    call hist_add
    mov r0, 0
    exit
""")

ALU = ("ALU/branch heavy (64 ops, no helpers)", [], "\n".join(
    ["ldxdw r2, [r1+96]", "ldxw r3, [r1+28]", "mov r0, 0"]
    + [f"{op} r0, r{2 + (i % 2)}" for i, op in
       zip(range(56), ["add", "xor", "mul", "rsh", "or", "sub", "and", "lsh"] * 7)]
    + ["jgt r0, 5, +1", "mov r0, 1", "exit"]))


def straight_line(n: int) -> str:
    """A verifiable straight-line program of exactly n slots."""
    return "\n".join(["mov r0, 0"] + ["add r0, 1"] * (n - 2) + ["exit"])


def memory_mix(n: int) -> str:
    """n slots of context loads, stack stores/loads and ALU (verifiable)."""
    block = ["ldxw r2, [r1+28]", "add r0, r2", "stxdw [r10-8], r0", "ldxdw r3, [r10-8]",
             "xor r0, r3", "add r0, 7", "and r0, 0xffff", "mov r4, r0"]
    body = ["mov r0, 0"]
    while len(body) < n - 1:
        body.append(block[(len(body) - 1) % len(block)])
    return "\n".join(body + ["exit"])


def events(k: int = 64) -> List[bytes]:
    return [context.pack("task:end", task_class=i % 8, dur_ns=1000 * (i % 50), layer=i % 4,
                         worker=0, decode_step=0) for i in range(k)]


def timed(fn: Callable[[], None], seconds: float) -> Tuple[int, float]:
    n, t0 = 0, time.perf_counter()
    while True:
        fn()
        n += 1
        dt = time.perf_counter() - t0
        if dt >= seconds:
            return n, dt


def bench_vm(seconds: float):
    evs = events()
    rows = []
    for name, defs, text in (FILTER, COUNT, HIST, ALU,
                             ("straight line, 4096 slots", [], straight_line(abi.MAX_INSNS))):
        maps = MapSet(defs) if defs else None
        prog = Program("bench", HOOK.section, HOOK, asm.assemble(text, [m.name for m in defs]))
        v = Vm(prog, maps)
        # validate once
        rs = [v.run(e) for e in evs]
        assert not any(r.lost or r.throttled for r in rs), name
        if name.startswith("count"):
            assert sum(int.from_bytes(x, "little") for x in maps["counts"].snapshot().values()) == len(evs)
        if name.startswith("straight"):
            assert rs[0].r0 == abi.MAX_INSNS - 2
        insns = sum(r.insns for r in rs)

        def one_pass():
            for e in evs:
                v.run(e)
        n, dt = timed(one_pass, seconds)
        runs = n * len(evs)
        rows.append((name, insns / len(evs), runs / dt, n * insns / dt, 1e6 * dt / runs))
    return rows


def bench_verifier(seconds: float):
    try:
        from dtrace_mk.bpf.verifier import verify
    except ImportError:
        return None
    out = []
    for name, text in (("straight line", straight_line(abi.MAX_INSNS)),
                       ("ctx/stack/ALU mix", memory_mix(abi.MAX_INSNS))):
        prog = Program("big", HOOK.section, HOOK, asm.assemble(text))
        verify(prog, [])
        n, dt = timed(lambda: verify(prog, []), seconds)
        v = Vm(prog)
        ev = events(1)[0]
        m, dt_vm = timed(lambda: v.run(ev), seconds / 2)
        out.append((name, len(prog.insns), 1e3 * dt / n, (dt / n) / (dt_vm / m)))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=0.5, help="time per measurement (default 0.5)")
    args = ap.parse_args(argv)
    print(f"reference VM, Python {platform.python_version()} on {platform.machine()}")
    rows = bench_vm(args.seconds)
    base = rows[0][3]
    print(f"{'program':45} {'insns/run':>9} {'runs/s':>10} {'Minsns/s':>9} {'us/event':>9} {'vs row 1':>8}")
    for name, ipr, rps, ips, us in rows:
        print(f"{name:45} {ipr:9.1f} {rps:10.0f} {ips / 1e6:9.2f} {us:9.2f} {ips / base:7.2f}x")
    vr = bench_verifier(args.seconds)
    if vr is None:
        print("verifier: not available in this build")
    else:
        print(f"\n{'verifier on':45} {'slots':>9} {'ms':>10} {'= VM runs':>10}")
        for name, slots, ms, ratio in vr:
            print(f"{name:45} {slots:9d} {ms:10.1f} {ratio:10.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
