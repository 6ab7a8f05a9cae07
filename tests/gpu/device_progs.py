"""Random verified programs and contexts for the device VM's differential tests.

`random_object(rnd, parallel_safe)` writes an eBPF object (assembly through
dtrace_mk.bpf.asm) that the verifier accepts: filters and arithmetic over context
fields (every ALU and JMP op, 64- and 32-bit, K and X), stack spills and fills of all
sizes, byte swaps, lddw constants, and map work through every device helper.

parallel_safe=True restricts map work to what gives the same final maps whatever order
32 lanes run in: counters through xadd on pre-filled hash keys / array entries,
histograms, updates of keys unique per event (task_index), ring records compared as a
multiset with budgets that never bind.  parallel_safe=False adds order-dependent work
(inserting counters into small hash maps that fill up, tight ring budgets, deletes):
those runs compare in serial mode (one event at a time, the reference's order).

Used by tests/gpu/test_device_vm.py, tests/gpu/test_compiled_tier.py, bench/vm_device.py
and (CPU only) tests/runtime/test_device_sources.py and tests/runtime/test_compiled.py;
`groups` packs objects into hook tables and `device_skip` names the vm_cases the device
tiers do not run.
"""
from __future__ import annotations

import random
import struct
from typing import Dict, List, Tuple

from dtrace_mk.abi import context
from dtrace_mk.abi import definition as abi
from dtrace_mk.bpf.asm import assemble
from dtrace_mk.bpf.program import BpfObject, MapDef, Program
from dtrace_mk.runtime.device import MAX_PROGS

HOOK = abi.hook("task:end")
FIELDS = [f for f in abi.CONTEXT_FIELDS if f.name in HOOK.valid_fields]
ALU = ["add", "sub", "mul", "div", "mod", "or", "and", "xor", "lsh", "rsh", "arsh", "mov"]
JMP = ["jeq", "jne", "jgt", "jge", "jlt", "jle", "jsgt", "jsge", "jslt", "jsle", "jset"]
IMMS = [0, 1, 2, 3, 7, 8, 15, 31, 32, 63, 64, 255, 1000, -1, -2, -8, -1000, 0x7FFFFFFF, -0x80000000]
SCAL = [7, 8, 9]   # scalar registers; r6 = ctx


def maps_for(parallel_safe: bool, rnd: random.Random) -> List[MapDef]:
    small = not parallel_safe and rnd.random() < 0.6
    return [
        MapDef("counts", "hash", 4, 8, 4 if small else 64),
        MapDef("arr", "array", 4, 16, 4),
        MapDef("pw", "per_worker_array", 4, 8, 2),
        MapDef("lat", "hist_log2", 4, 512, 3 if small else 64),
        MapDef("lin", "hist_linear", 8, 0, 3 if small else 64, lin_lo=-100, lin_hi=1000, lin_step=50),
        MapDef("seen", "hash", 4, 16, 8 if small else 4096),
        MapDef("ev", "ringbuf", 0, 0, (64 if small else 1 << 16), budget_bytes=(48 if small else 1 << 16)),
    ]


def _fix(m: MapDef) -> MapDef:
    if m.type == "hist_linear":
        m.value_size = 8 * m.hist_buckets
    return m


def _alu(rnd: random.Random) -> List[str]:
    op = rnd.choice(ALU + ["neg", "swap", "lddw"])
    d = rnd.choice(SCAL)
    w = rnd.choice(["", "", "32"])
    if op == "neg":
        return [f"neg{w} r{d}"]
    if op == "swap":
        return [f"{rnd.choice(['le', 'be'])}{rnd.choice([16, 32, 64])} r{d}"]
    if op == "lddw":
        return [f"lddw r{d}, {rnd.getrandbits(64)}"]
    if rnd.random() < 0.5:
        return [f"{op}{w} r{d}, r{rnd.choice(SCAL)}"]
    if op in ("lsh", "rsh", "arsh"):
        return [f"{op}{w} r{d}, {rnd.randrange(32 if w else 64)}"]
    return [f"{op}{w} r{d}, {rnd.choice(IMMS) if rnd.random() < 0.7 else rnd.randrange(-(1 << 31), 1 << 31)}"]


def _ctx_load(rnd: random.Random) -> List[str]:
    f = rnd.choice(FIELDS)
    return [f"ldx{'dw' if f.size == 8 else 'w'} r{rnd.choice(SCAL)}, [r6+{f.offset}]"]


def _stack(rnd: random.Random) -> List[str]:
    sfx, size = rnd.choice([("b", 1), ("h", 2), ("w", 4), ("dw", 8)])
    off = -8 * rnd.randint(9, 12) + size * rnd.randrange(8 // size)   # fp-96..fp-65: scratch
    r = rnd.choice(SCAL)
    if rnd.random() < 0.3:
        return [f"st{sfx} [r10{off:+d}], {rnd.choice(IMMS)}", f"ldx{sfx} r{r}, [r10{off:+d}]"]
    return [f"stx{sfx} [r10{off:+d}], r{rnd.choice(SCAL)}", f"ldx{sfx} r{r}, [r10{off:+d}]"]


def _key(rnd: random.Random, mask: int) -> List[str]:
    r = rnd.choice(SCAL)
    return [f"mov r2, r{r}", f"and r2, {mask}", "stxw [r10-4], r2"]


def _map_work(rnd: random.Random, parallel_safe: bool, lab: str) -> List[str]:
    kinds = ["count_hit", "arr", "pw", "hist", "lin", "seen", "ring", "worker", "time"]
    if not parallel_safe:
        kinds += ["count_insert", "count_insert", "delete", "arr_update", "update_flags"]
    k = rnd.choice(kinds)
    v = rnd.choice(SCAL)
    if k == "count_hit":          # keys 0..3 are pre-filled: lookup always hits
        return _key(rnd, 3) + ["lddw r1, map:counts", "mov r2, r10", "add r2, -4", "call map_lookup_elem",
                               f"jeq r0, 0, {lab}", "mov r1, 1", "xadddw [r0+0], r1", f"{lab}:"]
    if k == "count_insert":       # lookup, else insert 1 (fills small maps: order matters)
        return _key(rnd, 15) + ["lddw r1, map:counts", "mov r2, r10", "add r2, -4", "call map_lookup_elem",
                                f"jeq r0, 0, {lab}i", "mov r1, 1", "xadddw [r0+0], r1", f"ja {lab}",
                                f"{lab}i:", "stdw [r10-16], 1", "lddw r1, map:counts", "mov r2, r10",
                                "add r2, -4", "mov r3, r10", "add r3, -16", "mov r4, 0",
                                "call map_update_elem", f"mov r{v}, r0", f"{lab}:"]
    if k == "arr":
        # parallel-safe: one access width per word (a 64-bit add's carry out of the low
        # half depends on the order of 32-bit adds to that half)
        w, off = ("w", 0) if rnd.random() < 0.5 else ("dw", 8)
        if not parallel_safe:
            w, off = rnd.choice(["w", "dw"]), rnd.choice([0, 8])
        return _key(rnd, 7) + ["lddw r1, map:arr", "mov r2, r10", "add r2, -4", "call map_lookup_elem",
                               f"jeq r0, 0, {lab}", f"mov r1, r{v}", f"xadd{w} [r0+{off}], r1",
                               "mov r2, 5", "xadddw [r0+8], r2", f"{lab}:"]
    if k == "arr_update":
        return _key(rnd, 7) + [f"stxdw [r10-24], r{v}", f"stxdw [r10-16], r{rnd.choice(SCAL)}",
                               "lddw r1, map:arr", "mov r2, r10", "add r2, -4", "mov r3, r10",
                               "add r3, -24", f"mov r4, {rnd.choice([0, 1, 2, 0, 5])}",
                               "call map_update_elem", f"mov r{v}, r0"]
    if k == "pw":
        return _key(rnd, 3) + ["lddw r1, map:pw", "mov r2, r10", "add r2, -4", "call map_lookup_elem",
                               f"jeq r0, 0, {lab}", "mov r1, 1", "xadddw [r0+0], r1", f"{lab}:"]
    if k == "hist":
        return _key(rnd, 3 if parallel_safe else 7) + [
            "lddw r1, map:lat", "mov r2, r10", "add r2, -4", f"mov r3, r{v}", "call hist_add", f"mov r{v}, r0"]
    if k == "lin":
        return [f"mov r2, r{v}", "and r2, 1", "stxdw [r10-8], r2", "lddw r1, map:lin", "mov r2, r10",
                "add r2, -8", f"mov r3, r{rnd.choice(SCAL)}", "call hist_add"]
    if k == "seen":               # key = task_index: unique per event in the contexts
        return ["ldxw r2, [r6+32]", "stxw [r10-4], r2", f"stxdw [r10-48], r{v}",
                f"stxdw [r10-40], r{rnd.choice(SCAL)}", "lddw r1, map:seen", "mov r2, r10", "add r2, -4",
                "mov r3, r10", "add r3, -48", "mov r4, 0", "call map_update_elem", f"mov r{v}, r0"]
    if k == "update_flags":
        return ["ldxw r2, [r6+32]", "and r2, 7", "stxw [r10-4], r2", f"stxdw [r10-48], r{v}",
                "stdw [r10-40], 9", "lddw r1, map:seen", "mov r2, r10", "add r2, -4", "mov r3, r10",
                "add r3, -48", f"mov r4, {rnd.choice([0, 1, 2, 3])}", "call map_update_elem", f"mov r{v}, r0"]
    if k == "delete":
        return _key(rnd, 15) + ["lddw r1, map:counts", "mov r2, r10", "add r2, -4", "call map_delete_elem",
                                f"mov r{v}, r0"]
    if k == "ring":
        n = rnd.choice([8, 16, 24])
        return [f"stxdw [r10-{8 * i}], r{rnd.choice(SCAL)}" for i in range(n // 8, 0, -1)] + [
            "lddw r1, map:ev", "mov r2, r10", f"add r2, -{n}", f"mov r3, {n}", "mov r4, 0",
            "call ringbuf_output", f"mov r{v}, r0"]
    if k == "worker":
        return ["call get_worker_id", f"mov r{v}, r0"]
    return ["call ktime_get_ns", f"mov r{v}, r0"]


def random_program_text(rnd: random.Random, parallel_safe: bool, n_blocks: int = 8) -> str:
    lines = ["mov r6, r1"] + [f"ldxw r{r}, [r6+{rnd.choice([28, 32, 36, 56, 24])}]" for r in SCAL]
    lab = 0
    for b in range(n_blocks):
        lines.append(f"B{b}:")
        for _ in range(rnd.randint(1, 4)):
            r = rnd.random()
            if r < 0.45:
                lines += _alu(rnd)
            elif r < 0.6:
                lines += _ctx_load(rnd)
            elif r < 0.72:
                lines += _stack(rnd)
            else:
                lab += 1
                lines += _map_work(rnd, parallel_safe, f"M{lab}")
        if rnd.random() < 0.5:             # forward branch over some blocks
            tgt = f"B{rnd.randint(b + 1, n_blocks)}" if b + 1 <= n_blocks else "B{n_blocks}"
            w = rnd.choice(["", "", "32"])
            rhs = f"r{rnd.choice(SCAL)}" if rnd.random() < 0.4 else str(rnd.choice(IMMS))
            lines.append(f"{rnd.choice(JMP)}{w} r{rnd.choice(SCAL)}, {rhs}, {tgt}")
    lines.append(f"B{n_blocks}:")
    lines.append(f"mov r0, r{rnd.choice(SCAL)}")
    lines.append("exit")
    return "\n".join(lines)


def random_object(rnd: random.Random, parallel_safe: bool, n_progs: int = 1) -> BpfObject:
    maps = [_fix(m) for m in maps_for(parallel_safe, rnd)]
    names = [m.name for m in maps]
    progs = []
    for i in range(n_progs):
        text = random_program_text(rnd, parallel_safe, rnd.randint(2, 10))
        progs.append(Program(f"p{i}", HOOK.section, HOOK, assemble(text, names)))
    return BpfObject(progs, maps, path="<random>")


def prefill(obj: BpfObject) -> Dict[str, Dict[bytes, bytes]]:
    """Hash contents both runtimes start with (keys 0..3 of `counts`)."""
    return {"counts": {struct.pack("<I", k): bytes(8) for k in range(4)}}


def random_contexts(rnd: random.Random, n: int, num_workers: int, epochs: int = 2) -> List[bytes]:
    out = []
    for i in range(n):
        f = {}
        for fd in FIELDS:
            if fd.name in ("abi_version", "hook"):
                continue
            bits = 8 * fd.size
            r = rnd.random()
            f[fd.name] = (rnd.randrange(8) if r < 0.5 else rnd.getrandbits(bits) if r < 0.8
                          else rnd.randrange(1 << 20))
        f["worker"] = rnd.randrange(num_workers)
        f["decode_step"] = rnd.randrange(epochs)
        f["task_index"] = i                      # unique: the `seen` map's key
        out.append(context.pack(HOOK, **f))
    return out


# ---------------------------------------------------------------------------------
# comparing a reference run with a device run
# ---------------------------------------------------------------------------------

def snapshot(ms) -> Dict[str, object]:
    out = {}
    for m in ms:
        if m.kind == "ringbuf":
            out[m.name] = {w: [(r.epoch, r.data) for r in m.snapshot() if r.worker == w]
                           for w in range(m.num_workers)}
        elif m.kind in ("array", "per_worker_array"):
            out[m.name] = m.snapshot(skip_zero=True)
        else:
            out[m.name] = m.snapshot()
        out[m.name + ".stats"] = (m.stats.lost, m.stats.throttled)
    return out


def coverage_dict(rows) -> Dict[Tuple[str, str, int, int], Tuple[int, int, int, int]]:
    return {(c.program, c.hook, c.epoch, c.program_gen): (c.eligible, c.executed, c.throttled, c.lost)
            for c in rows}


def compare_maps(ref_maps, dev_maps, ordered: bool) -> List[str]:
    a, b = snapshot(ref_maps), snapshot(dev_maps)
    probs = []
    for k in a:
        x, y = a[k], b.get(k)
        if not ordered and isinstance(x, dict) and x and isinstance(next(iter(x.values())), list) \
                and k in ("ev",):
            x = {w: sorted(v) for w, v in x.items()}
            y = {w: sorted(v) for w, v in y.items()}
        if x != y:
            probs.append(f"map {k}: reference {_short(x)} != device {_short(y)}")
    return probs


def _short(v, n: int = 600) -> str:
    s = repr(v)
    return s if len(s) <= n else s[:n] + "..."


def compare_fires(ref_results: List[list], batch) -> List[str]:
    """ref_results[i]: the reference's FireResult list for event i."""
    probs = []
    for i, frs in enumerate(ref_results):
        dev = batch.results(i)
        if len(dev) != len(frs):
            probs.append(f"event {i}: reference ran {len(frs)} programs, device {len(dev)}")
            continue
        for fr, (aid, name, outcome, r0) in zip(frs, dev):
            if fr.program != name or fr.outcome != outcome:
                probs.append(f"event {i} {name}: outcome reference {fr.outcome} device {outcome}")
            elif fr.r0 is not None and fr.r0 != r0:
                probs.append(f"event {i} {name}: r0 reference {fr.r0:#x} device {r0 if r0 is None else hex(r0)}")
        if len(probs) > 20:
            break
    return probs


def groups(objs, limit: int = MAX_PROGS):
    """Objects packed into groups of at most `limit` programs (one hook table, one build)."""
    group, n = [], 0
    for o in objs:
        if n + len(o.programs) > limit:
            yield group
            group, n = [], 0
        group.append(o)
        n += len(o.programs)
    if group:
        yield group


def device_skip(case) -> str:
    """Why a vm_cases case does not run on the device tiers ("" when it does)."""
    if case.error is not None or case.name.startswith("fault_"):
        return "faults: the device VM runs verified programs only (no run-time checks)"
    if case.expect_trace is not None or "trace_printk" in case.asm_text:
        return "trace_printk is not implemented on the device yet"
    if case.expect_hints is not None or case.options.get("prog_type") == "control":
        return "control programs (priority hints) are not attachable in ABI v1"
    return ""
