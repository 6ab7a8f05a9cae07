"""Property tests of the verifier (hypothesis).

1. The scalar domain is sound: every concrete result of an ALU op or branch on values
   inside two abstract scalars lies inside the abstract result.
2. On random, mostly plausible programs the verifier either accepts or raises
   VerifierError (never another exception), and an accepted program's result is sane.
3. Whatever the verifier accepts never faults in the bounds-checking reference VM
   (dtrace_mk.bpf.vm, VMFault), and never runs more instructions than max_path_insns.
4. Arbitrary slots (garbage fields included) never crash the verifier.

DTRACE_MK_VERIFIER_EXAMPLES=N raises the example count for a deeper local run.
"""
from __future__ import annotations

import os
import random
import struct

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dtrace_mk.abi import definition as abi
from dtrace_mk.bpf import isa, vm
from dtrace_mk.bpf.asm import assemble
from dtrace_mk.bpf.maps import MapSet
from dtrace_mk.bpf.program import MapDef, Program
from dtrace_mk.bpf.verifier import VerifierError, verify
from dtrace_mk.bpf.verifier import scalar as S

M64, M32 = (1 << 64) - 1, (1 << 32) - 1
EXAMPLES = int(os.environ.get("DTRACE_MK_VERIFIER_EXAMPLES", "300"))
SETTINGS = settings(max_examples=EXAMPLES, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])

# ------------------------------------------------------------------ 1. scalar domain

INTERESTING = [0, 1, 2, 7, 8, 15, 16, 31, 32, 63, 64, 255, 0x7FFFFFFF, 0x80000000, M32,
               1 << 32, (1 << 63) - 1, 1 << 63, M64 - 7, M64]
u64 = st.one_of(st.sampled_from(INTERESTING), st.integers(0, M64), st.integers(0, 300))
value_sets = st.lists(u64, min_size=1, max_size=4)


def abstract(values):
    out = S.const(values[0])
    for v in values[1:]:
        out = S.join(out, S.const(v))
    return out


@st.composite
def abstract_values(draw):
    """(Scalar, members): an abstract value and concrete values it contains; built from
    joined constants, an unsigned range, a signed range or a tnum."""
    kind = draw(st.integers(0, 3))
    if kind == 0:
        xs = draw(value_sets)
        return abstract(xs), xs
    if kind in (1, 2):
        lo, hi = sorted((draw(u64), draw(u64)))
        if kind == 1:
            a = S.urange(lo, hi)
            pick = st.integers(lo, hi)
        else:
            slo, shi = sorted((S.to_signed(lo), S.to_signed(hi)))
            a = S.make(0, M64, slo, shi, S.t_unknown())
            pick = st.integers(slo, shi).map(lambda v: v & M64)
        xs = [lo if kind == 1 else a.smin & M64, hi if kind == 1 else a.smax & M64]
        xs += draw(st.lists(pick, max_size=3))
        return a, xs
    value, mask = draw(u64), draw(u64)
    t = S.Tnum(value & ~mask, mask)
    xs = [t.value, t.value | t.mask] + [t.value | (r & t.mask) for r in draw(st.lists(u64, max_size=3))]
    return S.from_tnum(t), xs


def to_s(v, bits):
    return S.to_signed(v, bits)


def concrete_alu(op, a, b, is64):
    """RFC 9669 semantics, written independently of the verifier and the VM."""
    bits = 64 if is64 else 32
    m = (1 << bits) - 1
    a, b = a & m, b & m
    r = {
        "add": lambda: a + b, "sub": lambda: a - b, "mul": lambda: a * b,
        "div": lambda: a // b if b else 0, "mod": lambda: a % b if b else a,
        "or": lambda: a | b, "and": lambda: a & b, "xor": lambda: a ^ b,
        "lsh": lambda: a << (b & (bits - 1)), "rsh": lambda: a >> (b & (bits - 1)),
        "arsh": lambda: to_s(a, bits) >> (b & (bits - 1)), "neg": lambda: -a,
        "mov": lambda: b,
    }[op]()
    return r & m


def concrete_cond(op, a, b, is64):
    bits = 64 if is64 else 32
    m = (1 << bits) - 1
    a, b = a & m, b & m
    sa, sb = to_s(a, bits), to_s(b, bits)
    return {"jeq": a == b, "jne": a != b, "jgt": a > b, "jge": a >= b, "jlt": a < b,
            "jle": a <= b, "jsgt": sa > sb, "jsge": sa >= sb, "jslt": sa < sb,
            "jsle": sa <= sb, "jset": bool(a & b)}[op]


@SETTINGS
@given(op=st.sampled_from(sorted(S.ALU)), ax=abstract_values(), by=abstract_values(),
       is64=st.booleans())
def test_alu_is_sound(op, ax, by, is64):
    (a, xs), (b, ys) = ax, by
    assert all(a.contains(x) for x in xs) and all(b.contains(y) for y in ys)
    res = S.alu(op, a, b, is64)
    for x in xs:
        for y in ys:
            want = concrete_alu(op, x, y, is64)
            assert res.contains(want), (op, is64, hex(x), hex(y), hex(want), res)


@SETTINGS
@given(op=st.sampled_from(["jeq", "jne", "jgt", "jge", "jlt", "jle", "jsgt", "jsge", "jslt",
                           "jsle", "jset"]), ax=abstract_values(), by=abstract_values(),
       is64=st.booleans())
def test_branch_refinement_is_sound(op, ax, by, is64):
    (a, xs), (b, ys) = ax, by
    taken, fall = S.branch(op, a, b, is64)
    for x in xs:
        for y in ys:
            side = taken if concrete_cond(op, x, y, is64) else fall
            assert side is not None, (op, is64, hex(x), hex(y), "edge marked infeasible")
            assert side[0].contains(x) and side[1].contains(y), (op, is64, hex(x), hex(y), side)


@SETTINGS
@given(xs=value_sets, width=st.sampled_from([16, 32, 64]), to_be=st.booleans())
def test_byteswap_is_sound(xs, width, to_be):
    res = S.byteswap(abstract(xs), width, to_be)
    for x in xs:
        v = x & ((1 << width) - 1)
        if to_be:
            v = int.from_bytes(v.to_bytes(width // 8, "little"), "big")
        assert res.contains(v)


# ------------------------------------------------------------------ 2./3. random programs

MAPS = [
    MapDef("counts", "hash", 4, 64, 16),
    MapDef("arr", "array", 4, 16, 4),
    MapDef("lat", "hist_log2", 4, 512, 16),
    MapDef("ev", "ringbuf", 0, 0, 1, budget_bytes=4096),
]
MAP_NAMES = [m.name for m in MAPS]
HOOK = abi.hook("task:end")
VALID = [f for f in abi.CONTEXT_FIELDS if f.name in HOOK.valid_fields]
ALU_OPS = ["add", "sub", "mul", "div", "mod", "or", "and", "xor", "lsh", "rsh", "arsh", "mov"]
JMP_OPS = ["jeq", "jne", "jgt", "jge", "jlt", "jle", "jsgt", "jsge", "jslt", "jsle", "jset"]
IMMS = st.one_of(st.sampled_from([0, 1, 3, 7, 8, 16, 31, 32, 56, 63, 64, -1, -8, 0x7FFFFFFF]),
                 st.integers(-(1 << 31), (1 << 31) - 1))
REGS = st.sampled_from([0, 2, 3, 4, 5, 7, 7, 8, 8, 9, 9])
ANY_REG = st.one_of(st.sampled_from([0, 2, 3, 7, 7, 8, 8, 9, 9]), st.integers(0, 10))
SIZES = st.sampled_from([("b", 1), ("h", 2), ("w", 4), ("dw", 8)])


@st.composite
def op_ctx_load(draw):
    dst = draw(REGS)
    if draw(st.integers(0, 9)) == 0:                 # sometimes an arbitrary offset
        sfx, size = draw(SIZES)
        return [f"ldx{sfx} r{dst}, [r6{draw(st.integers(-8, 136)):+d}]"]
    f = draw(st.sampled_from(VALID))
    sfx = {4: "w", 8: "dw"}[f.size]
    return [f"ldx{sfx} r{dst}, [r6+{f.offset}]"]


@st.composite
def op_alu(draw):
    op = draw(st.sampled_from(ALU_OPS))
    w = draw(st.sampled_from(["", "", "32"]))
    dst = draw(REGS)
    if op in ("lsh", "rsh", "arsh") and draw(st.integers(0, 9)):
        return [f"{op}{w} r{dst}, {draw(st.integers(0, 31 if w else 63))}"]
    if draw(st.booleans()):
        return [f"{op}{w} r{dst}, r{draw(ANY_REG)}"]
    return [f"{op}{w} r{dst}, {draw(IMMS)}"]


@st.composite
def op_misc_alu(draw):
    dst = draw(REGS)
    return [draw(st.sampled_from([f"neg r{dst}", f"be16 r{dst}", f"le32 r{dst}",
                                  f"be64 r{dst}", f"lddw r{dst}, {draw(st.integers(0, M64))}"]))]


@st.composite
def op_stack(draw):
    sfx, size = draw(SIZES)
    off = -size * draw(st.integers(1, 64 // size))
    if draw(st.integers(0, 9)) == 0:
        off = draw(st.integers(-520, 4))
    kind = draw(st.integers(0, 2))
    if kind == 0:
        return [f"st{sfx} [r10{off:+d}], {draw(IMMS)}"]
    if kind == 1:
        return [f"stx{sfx} [r10{off:+d}], r{draw(ANY_REG)}"]
    return [f"ldx{sfx} r{draw(REGS)}, [r10{off:+d}]"]


@st.composite
def reinit(draw):
    """Usually rewrite r2..r5 after a call (which leaves them uninitialised)."""
    return ["mov r2, 1", "mov r3, 8", "mov r4, 0", "mov r5, 3"] if draw(st.integers(0, 3)) else []


@st.composite
def op_lookup(draw):
    """key on the stack, lookup, usually a null check around an access through r0."""
    m = draw(st.sampled_from(["counts", "counts", "arr", "arr", "lat", "ev"]))
    key = draw(st.one_of(st.integers(0, 5), st.just("ctx")))
    out = []
    if key == "ctx":
        out.append("ldxw r2, [r6+24]")
        out.append("stxw [r10-4], r2")
    else:
        out.append(f"stw [r10-4], {key}")
    out += [f"lddw r1, map:{m}", "mov r2, r10", "add r2, -4", "call map_lookup_elem"]
    out += draw(reinit())
    if draw(st.integers(0, 3)):                      # null check, then use the value
        out.append(f"{draw(st.sampled_from(['jeq', 'jeq', 'jne']))} r0, 0, skip{{id}}")
        for _ in range(draw(st.integers(1, 3))):
            out += draw(st.one_of(op_value_access(), op_ptr_arith("skip{id}")))
        out.append("skip{id}:")
    return out


@st.composite
def op_value_access(draw):
    """An access through r0 (a map value after a lookup, when the program did one)."""
    sfx, size = draw(SIZES)
    off = draw(st.one_of(st.sampled_from([0, 8, 16, 56, 60, 64]), st.integers(-8, 72)))
    kind = draw(st.integers(0, 3))
    if kind == 0:
        return [f"ldx{sfx} r{draw(st.sampled_from([2, 3, 4]))}, [r0{off:+d}]"]
    if kind == 1:
        return [f"st{sfx} [r0{off:+d}], {draw(IMMS)}"]
    if kind == 2:
        return [f"stx{sfx} [r0{off:+d}], r{draw(ANY_REG)}"]
    w = draw(st.sampled_from(["w", "dw"]))
    return [f"xadd{w} [r0{off:+d}], r{draw(st.sampled_from([2, 3, 7]))}"]


@st.composite
def op_ptr_arith(draw, skip="out"):
    reg = draw(st.sampled_from([0, 0, 2, 7]))
    mask = draw(st.sampled_from([7, 15, 56, 63]))
    return draw(st.sampled_from([
        [f"add r0, r{reg}"], [f"add r0, {draw(IMMS)}"], ["add r0, 8"], ["mov r7, r0"],
        [f"and r{reg}, {mask}"], ["mov r0, r7"], ["mov r2, r10", "add r2, -8"],
        [f"and r2, {mask}", f"lsh r2, {draw(st.sampled_from([0, 2, 3]))}", "add r0, r2"],
        ["ldxw r2, [r6+24]", f"jgt r2, {draw(st.sampled_from([3, 7, 8, 56]))}, {skip}",
         "add r0, r2"],
        # a bound checked on a copy (maybe disturbed in between) narrows the original
        ["ldxw r2, [r6+24]", "mov r3, r2", draw(st.sampled_from(["", "add r2, 1", "add r3, 1",
                                                                   "stxdw [r10-16], r2"])),
         f"{draw(st.sampled_from(['jgt', 'jsgt', 'jge', 'jgt32']))} r3, "
         f"{draw(st.sampled_from([3, 7, 8, 56]))}, {skip}",
         draw(st.sampled_from(["", "ldxdw r2, [r10-16]"])), "add r0, r2"]]))


@st.composite
def op_helper(draw):
    k = draw(st.integers(0, 4))
    if k == 0:
        return ["call ktime_get_ns"] + draw(reinit())
    if k == 1:
        return ["call get_worker_id"] + draw(reinit())
    if k == 2:
        return ["stdw [r10-16], 7", "lddw r1, map:ev", "mov r2, r10", "add r2, -16",
                f"mov r3, {draw(st.sampled_from([8, 16, 24]))}", "mov r4, 0", "call ringbuf_output"] + draw(reinit())
    if k == 3:
        return ["stw [r10-4], 1", "lddw r1, map:lat", "mov r2, r10", "add r2, -4",
                f"mov r3, r{draw(REGS)}", "call hist_add"] + draw(reinit())
    return ["stw [r10-4], 2", "stdw [r10-24], 1", "stdw [r10-16], 2", "lddw r1, map:arr",
            "mov r2, r10", "add r2, -4", "mov r3, r10", "add r3, -24", "mov r4, 0",
            "call map_update_elem"] + draw(reinit())


OPS = st.one_of(op_ctx_load(), op_alu(), op_alu(), op_misc_alu(), op_stack(), op_lookup(),
                op_lookup(), op_lookup(), op_ptr_arith(), op_helper())


@st.composite
def programs(draw):
    """A DAG program: straight-line ops with forward branches (null checks, bounds checks,
    plain compares) to later ops or to the common exit."""
    n = draw(st.integers(1, 14))
    ops = [draw(OPS) for _ in range(n)]
    lines = ["mov r6, r1", "mov r0, 0", "mov r2, 1", "mov r3, 8", "mov r4, 0", "mov r5, 3",
             "mov r7, 0", "mov r8, 16", "mov r9, -1"]
    branches = []
    for i, op in enumerate(ops):
        op = [line.replace("{id}", str(i)) for line in op]
        lines.append(f"L{i}:")
        lines += op
        if draw(st.integers(0, 3)) == 0 or (op[-1] == "call map_lookup_elem" and draw(st.integers(0, 5))):
            target = f"L{draw(st.integers(i + 1, n))}" if i + 1 < n else "out"
            if draw(st.booleans()):
                target = "out"
            if op[-1] == "call map_lookup_elem":
                lines.append(f"{draw(st.sampled_from(['jeq', 'jeq', 'jne']))} r0, 0, {target}")
            else:
                jop = draw(st.sampled_from(JMP_OPS)) + draw(st.sampled_from(["", "", "32"]))
                rhs = f"r{draw(ANY_REG)}" if draw(st.booleans()) else str(draw(IMMS))
                lines.append(f"{jop} r{draw(REGS)}, {rhs}, {target}")
    lines.append(f"L{n}:")
    lines.append("out:")
    lines.append(draw(st.sampled_from(["mov r0, 0", "mov r0, 0", "mov r0, r2", ""])))
    lines.append("exit")
    return "\n".join(line for line in lines if line)  # (ops may hold "" placeholders)


def _verify(text):
    insns = assemble(text, maps=MAP_NAMES)
    prog = Program("p", HOOK.section, HOOK, insns)
    try:
        return prog, verify(prog, MAPS)
    except VerifierError as e:
        assert e.rule and str(e).startswith(f"insn {e.pc}: {e.rule}: " if e.pc is not None
                                            else f"{e.rule}: ")
        return prog, None


@SETTINGS
@given(text=programs(), seeds=st.lists(st.integers(0, M64), min_size=1, max_size=3))
def test_accepted_programs_are_sane_and_never_fault_in_the_vm(text, seeds):
    """Rejections are VerifierErrors in the one message format (checked in _verify); an
    accepted program has a sane result, never faults in the reference VM and never runs
    more instructions than max_path_insns."""
    prog, res = _verify(text)
    if res is None:
        return
    assert 1 <= res.max_path_insns <= res.insn_count == len(prog.insns)
    assert res.helpers_used <= set(abi.HELPERS_BY_ID)
    assert res.maps_used <= set(range(len(MAPS)))
    assert 0 <= res.stack_depth <= abi.STACK_SIZE and res.stack_depth % 8 == 0
    maps = MapSet(MAPS)
    for k in range(3):                                   # some hash keys exist, others not
        maps["counts"].update(struct.pack("<I", k), bytes(64))
    machine = vm.Vm(prog, maps, prog_type="observe")
    for seed in seeds:
        try:
            run = machine.run(_ctx_bytes(seed), worker=0, epoch=0)
        except vm.VMFault as e:
            raise AssertionError(f"accepted program faulted: {e}\n{text}") from None
        assert run.insns <= res.max_path_insns


def _ctx_bytes(seed: int) -> bytes:
    rnd = random.Random(seed)
    raw = bytearray(rnd.getrandbits(8) for _ in range(abi.CONTEXT_SIZE))
    if seed % 2:                                          # small values hit the map keys
        for f in abi.CONTEXT_FIELDS:
            raw[f.offset:f.offset + f.size] = rnd.randrange(4).to_bytes(f.size, "little")
    return bytes(raw)


def test_generator_produces_accepted_programs():
    """Guard against a generator that only produces rejected programs (the VM property
    would then be vacuous): a fixed sample must contain accepted ones that use map values."""
    seen = {"accepted": 0, "value": 0}

    @settings(max_examples=150, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(text=programs())
    def sample(text):
        if _verify(text)[1] is not None:
            seen["accepted"] += 1
            seen["value"] += "[r0" in text and "map_lookup_elem" in text

    sample()
    assert seen["accepted"] >= 10 and seen["value"] >= 3, seen


# ------------------------------------------------------------------ 4. raw slots

_OPCODES = sorted(isa.OPCODES) + [0x00, 0x8F, 0xFF]


@st.composite
def raw_programs(draw):
    """Arbitrary slots: mostly valid opcodes with small random fields, a few garbage."""
    n = draw(st.integers(1, 12))
    out = []
    for _ in range(n):
        op = draw(st.sampled_from(_OPCODES))
        small = draw(st.booleans())
        out.append(isa.Insn(op, draw(st.integers(0, 11 if small else 15)),
                            draw(st.integers(0, 11 if small else 15)),
                            draw(st.integers(-3, 3) if small else st.integers(-(1 << 15), (1 << 15) - 1)),
                            draw(st.one_of(st.integers(-2, 16), st.sampled_from([32, 64, 130, 200]),
                                           st.integers(-(1 << 31), (1 << 31) - 1)))))
    if draw(st.booleans()):
        out += [isa.Insn(isa.BPF_ALU64 | isa.BPF_MOV | isa.BPF_K, 0), isa.Insn(isa.BPF_JMP | isa.BPF_EXIT)]
    return out


@SETTINGS
@given(insns=raw_programs(), seed=st.integers(0, M64))
def test_raw_slots_never_crash_the_verifier(insns, seed):
    prog = Program("raw", HOOK.section, HOOK, insns)
    try:
        res = verify(prog, MAPS)
    except VerifierError as e:
        assert str(e).startswith(f"insn {e.pc}: {e.rule}: " if e.pc is not None else f"{e.rule}: ")
        return
    machine = vm.Vm(prog, MapSet(MAPS), prog_type="observe")
    try:
        run = machine.run(_ctx_bytes(seed), worker=0, epoch=0)
    except vm.VMFault as e:
        raise AssertionError(f"accepted program faulted: {e}\n{insns}") from None
    assert run.insns <= res.max_path_insns
