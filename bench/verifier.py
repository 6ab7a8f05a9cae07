"""Verifier speed: CPU seconds to verify 4096-slot programs.

    python bench/verifier.py [--repeat N]

Programs (each just under abi.MAX_INSNS slots):
  straight   4094 ALU instructions in a row
  branchy    ctx load + forward branch + two stack spills per block (joins everywhere)
  lookups    map_lookup_elem + null check + read-modify-write of the value, repeated
Each is first VALIDATED (it must be accepted, with the expected insn_count), then timed
(best of --repeat runs of verify(), process CPU time).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REQUIRES = "cpu"   # what `dtrace-mk bench verifier` checks before it runs: cpu, gpu, or gpu:N (N ranks, N GPUs)

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dtrace_mk.abi import definition as abi            # noqa: E402
from dtrace_mk.bpf.asm import assemble                 # noqa: E402
from dtrace_mk.bpf.program import MapDef, Program      # noqa: E402
from dtrace_mk.bpf.verifier import verify              # noqa: E402

MAPS = [MapDef("counts", "hash", 4, 64, 64)]


def straight() -> str:
    return "\n".join(["mov r0, 0"] + ["add r0, 1"] * (abi.MAX_INSNS - 2) + ["exit"])


def branchy() -> str:
    body, i = ["mov r6, r1", "mov r7, 0"], 0
    while len(body) < abi.MAX_INSNS - 8:
        s = 8 * (i % 60 + 1)
        body += ["ldxw r2, [r6+24]", f"jgt r2, {i % 50}, a{i}", "add r7, 1",
                 f"stxdw [r10-{s}], r7", f"a{i}: stxdw [r10-{s + 8}], r10",
                 f"ldxdw r3, [r10-{s + 8}]"]
        i += 1
    return "\n".join(body + ["mov r0, r7", "exit"])


def lookups() -> str:
    body, i = ["mov r6, r1"], 0
    while len(body) + 11 < abi.MAX_INSNS - 2 - 400:      # lddw takes two slots
        body += ["stw [r10-4], 0", "lddw r1, map:counts", "mov r2, r10", "add r2, -4",
                 "call map_lookup_elem", f"jeq r0, 0, b{i}", "ldxdw r1, [r0+8]", "add r1, 1",
                 "stxdw [r0+8], r1", f"b{i}: mov r0, 0"]
        i += 1
    return "\n".join(body + ["exit"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    hook = abi.hook("task:end")
    for name, make in (("straight", straight), ("branchy", branchy), ("lookups", lookups)):
        insns = assemble(make(), maps=[m.name for m in MAPS])
        prog = Program(name, hook.section, hook, insns)
        res = verify(prog, MAPS)                          # validate: accepted
        assert res.insn_count == len(insns) <= abi.MAX_INSNS, (name, res)
        best = float("inf")
        for _ in range(args.repeat):
            t0 = time.process_time()
            verify(prog, MAPS)
            best = min(best, time.process_time() - t0)
        print(f"{name:9s} {len(insns):5d} slots  max path {res.max_path_insns:5d}  "
              f"{best * 1e3:8.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
