"""Reference VM: the engine-agnostic case files (tests/bpf/vm_cases/*.txt) plus unit
tests of what the case format cannot express (decode-once reuse, budgets, fault detail,
properties over random ALU operands)."""
import struct
import sys
from pathlib import Path

import pytest

from dtrace_mk.abi import context
from dtrace_mk.abi import definition as abi
from dtrace_mk.bpf import asm, isa, vm
from dtrace_mk.bpf.maps import MapSet
from dtrace_mk.bpf.program import MapDef

sys.path.insert(0, str(Path(__file__).resolve().parent / "vm_cases"))
import harness  # noqa: E402

CASES = harness.all_cases()
ENGINE = harness.ReferenceEngine()


def test_there_are_cases():
    assert len(CASES) >= 40


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_case(path):
    skip, problems = harness.run_and_check(path, ENGINE)
    if skip:
        pytest.skip(skip)
    assert not problems, f"{path.name}:\n  " + "\n  ".join(problems)


def _ctx(**kw):
    return context.pack("task:end", **kw)


def _run(text, maps=(), ctx=None, **kw):
    defs = list(maps)
    ms = MapSet(defs, kw.pop("num_workers", 1)) if defs else None
    prog = asm.assemble(text, [m.name for m in defs])
    return vm.run(prog, ctx or _ctx(), ms, **kw)


def test_every_opcode_has_semantics():
    # each opcode in the table decodes to a closure that is not the invalid-opcode fault
    for op, info in isa.OPCODES.items():
        imm = 16 if info.op == isa.BPF_END and info.kind == "alu" else 0
        if info.kind == "ld_imm64":
            insns = isa.lddw(0, 5) + [isa.Insn(isa.BPF_JMP | isa.BPF_EXIT)]
        elif info.kind == "call":
            insns = [isa.Insn(op, imm=abi.HELPERS_BY_NAME["get_worker_id"].id),
                     isa.Insn(isa.BPF_JMP | isa.BPF_EXIT)]
        elif info.kind in ("ldx", "st", "stx", "atomic"):
            insns = [isa.Insn(op, dst=10 if info.kind != "ldx" else 0, src=10 if info.kind != "st" else 0,
                              off=-8, imm=imm), isa.Insn(isa.BPF_JMP | isa.BPF_EXIT)]
            if info.kind == "ldx":
                insns[0] = isa.Insn(op, dst=0, src=10, off=-8)
        else:
            insns = [isa.Insn(op, dst=0, src=1 if info.src == isa.BPF_X else 0, off=0, imm=imm),
                     isa.Insn(isa.BPF_JMP | isa.BPF_EXIT)]
        vm.run(insns, _ctx())   # must not raise "invalid opcode"


def test_invalid_opcode_faults_only_when_executed():
    insns = [isa.Insn(isa.BPF_JMP | isa.BPF_EXIT), isa.Insn(0xFF)]
    assert vm.run(insns, _ctx()).r0 == 0
    with pytest.raises(vm.VMFault, match=r"^pc 0: invalid opcode 0xff$"):
        vm.run([isa.Insn(0xFF)], _ctx())


def test_vm_is_reusable_and_state_resets():
    prog = asm.assemble("ldxw r0, [r10-4]\nadd r0, 1\nstxw [r10-4], r0\nexit")
    v = vm.Vm(prog)
    assert [v.run(_ctx()).r0 for _ in range(3)] == [1, 1, 1]   # stack zeroed per run


def test_instruction_budget_and_interpret_count():
    loop = "mov r0, 0\nl:\nadd r0, 1\njlt r0, 10, l\nexit"
    assert vm.interpret_count(asm.assemble(loop), _ctx()) == 1 + 2 * 10 + 1
    with pytest.raises(vm.VMFault, match="instruction budget of 15 exhausted") as ei:
        vm.run(asm.assemble(loop), _ctx(), max_insns=15)
    assert ei.value.insns == 16


def test_ktime_clock_injectable():
    r = _run("call ktime_get_ns\nexit", ctx=_ctx(ts_ns=77))
    assert r.r0 == 77
    r = _run("call ktime_get_ns\nexit", clock=lambda: 123)
    assert r.r0 == 123


def test_worker_and_epoch_override():
    r = vm.run(asm.assemble("call get_worker_id\nexit"), _ctx(worker=3), worker=5)
    assert r.r0 == 5


def test_control_program_cannot_call_observe_helpers():
    prog = asm.assemble("mov r1, 0\nmov r2, 0\nmov r3, 0\nmov r4, 0\nmov r5, 0\ncall trace_printk\nexit")
    with pytest.raises(vm.VMFault, match="helper trace_printk is not allowed in control programs"):
        vm.Vm(prog, prog_type="control").run(_ctx())


def test_map_value_pointer_writes_through():
    m = MapDef("a", "array", 4, 8, 2)
    ms = MapSet([m])
    prog = asm.assemble("lddw r1, map_value:a+0\nstdw [r1+0], 42\nmov r0, 0\nexit", ["a"])
    vm.run(prog, _ctx(), ms)
    assert ms["a"].snapshot()[bytes(4)] == (42).to_bytes(8, "little")


def test_readonly_map_value_refuses_store():
    m = MapDef(".rodata", "array", 4, 8, 1, init_value=b"hi\0", read_only=True)
    ms = MapSet([m])
    prog = asm.assemble("lddw r1, map_value#0\nldxb r0, [r1+1]\nstb [r1+0], 1\nexit")
    with pytest.raises(vm.VMFault, match=r"pc 3: store of 1 bytes at map value\+0: the map is read-only"):
        vm.run(prog, _ctx(), ms)


@pytest.mark.parametrize("op,fn", [
    ("add", lambda a, b: a + b), ("sub", lambda a, b: a - b), ("mul", lambda a, b: a * b),
    ("div", lambda a, b: a // b if b else 0), ("mod", lambda a, b: a % b if b else a),
    ("or", lambda a, b: a | b), ("and", lambda a, b: a & b), ("xor", lambda a, b: a ^ b),
    ("lsh", lambda a, b: a << (b & 63)), ("rsh", lambda a, b: a >> (b & 63)),
    ("arsh", lambda a, b: (a - ((a >> 63) << 64)) >> (b & 63)),
])
def test_alu64_matches_python_model(op, fn):
    import random
    rnd = random.Random(op)
    vals = [0, 1, 2, 63, 64, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF, 1 << 63, (1 << 64) - 1]
    vals += [rnd.getrandbits(64) for _ in range(20)]
    prog = asm.assemble(f"ldxdw r0, [r1+96]\nldxdw r2, [r1+104]\n{op} r0, r2\nexit")
    prog32 = asm.assemble(f"ldxdw r0, [r1+96]\nldxdw r2, [r1+104]\n{op}32 r0, r2\nexit")
    v64, v32 = vm.Vm(prog), vm.Vm(prog32)
    for a in vals:
        for b in vals[:12]:
            ctx = _ctx(dur_ns=a, wait_ns=b)
            assert v64.run(ctx).r0 == fn(a, b) & ((1 << 64) - 1), (op, a, b)
            a32, b32 = a & 0xFFFFFFFF, b & 0xFFFFFFFF
            if op == "arsh":
                want = ((a32 - ((a32 >> 31) << 32)) >> (b32 & 31)) & 0xFFFFFFFF
            elif op in ("lsh", "rsh"):
                want = fn(a32, b32 & 31) & 0xFFFFFFFF
            else:
                want = fn(a32, b32) & 0xFFFFFFFF
            assert v32.run(ctx).r0 == want, (op + "32", a, b)


@pytest.mark.parametrize("fmt,args,want", [
    ("%d|%u|%x", (0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF), "-1|4294967295|ffffffff"),
    ("%lld %llu %llx", ((1 << 64) - 1, (1 << 64) - 1, 255), "-1 18446744073709551615 ff"),
    ("%5d|%-3u|%05x|%%", (7, 1, 0xab), "    7|1  |000ab|%"),
    ("%c%c %p", (104, 105, 16), "hi 0x10"),
    ("%s", (0,), None), ("%d %d %d %d", (1, 2, 3), None), ("bad %", (), None),
])
def test_printk_formats(fmt, args, want):
    assert vm.format_printk(fmt, args) == want


FAULTING = [p for p in CASES if "-- error" in p.read_text()]


@pytest.mark.parametrize("path", FAULTING, ids=[p.stem for p in FAULTING])
def test_verifier_rejects_every_faulting_case(path):
    """Accepted programs never fault: every case whose program faults on the reference VM
    must be refused by the verifier."""
    from dtrace_mk.bpf.verifier import verify
    from dtrace_mk.errors import Rejected
    case = harness.parse_case(path)
    obj = case.object()
    with pytest.raises(Rejected):
        verify(obj.programs[0], obj.maps, prog_type=obj.programs[0].prog_type)


def test_operand_faults_name_the_problem():
    exit_ = isa.Insn(isa.BPF_JMP | isa.BPF_EXIT)
    xadd = isa.OPCODES[isa.BPF_STX | isa.BPF_ATOMIC | isa.BPF_DW].opcode
    cases = [
        ([isa.Insn(xadd, dst=10, src=1, off=-8, imm=0x50), exit_], "pc 0: unsupported atomic operation imm=0x50"),
        ([isa.Insn(isa.BPF_ALU | isa.BPF_END | isa.END_TO_BE, dst=0, imm=8), exit_],
         "pc 0: byte swap width must be 16, 32 or 64, got 8"),
        ([isa.Insn(isa.BPF_ALU64 | isa.BPF_MOV | isa.BPF_K, dst=10, imm=1), exit_],
         "pc 0: r10 (frame pointer) is read-only"),
        ([isa.Insn(isa.BPF_ALU64 | isa.BPF_MOV | isa.BPF_X, dst=0, src=12), exit_], "pc 0: invalid register r12"),
        ([isa.Insn(xadd, dst=10, src=10, off=-8, imm=isa.ATOMIC_ADD | isa.ATOMIC_FETCH), exit_],
         "pc 0: r10 (frame pointer) is read-only"),
        (isa.lddw_map(1, None, 3) + [exit_], "pc 0: map #3 does not exist (object has 0 maps)"),
    ]
    for insns, msg in cases:
        with pytest.raises(vm.VMFault) as ei:
            vm.run(insns, _ctx())
        assert str(ei.value) == msg


def test_map_value_reference_needs_array():
    ms = MapSet([MapDef("h", "hash", 4, 8, 4)])
    with pytest.raises(vm.VMFault, match="pc 0: map_value reference needs an array map, 'h' is hash"):
        vm.run(asm.assemble("lddw r1, map_value#0\nexit"), _ctx(), ms)


def test_helper_needs_a_map_pointer():
    with pytest.raises(vm.VMFault, match="pc 2: map_lookup_elem: r1 is not a map pointer"):
        vm.run(asm.assemble("mov r1, r10\nmov r2, r10\ncall map_lookup_elem\nexit"), _ctx())


def test_worker_out_of_range_for_per_worker_maps():
    ms = MapSet([MapDef("p", "per_worker_array", 4, 8, 1)], num_workers=2)
    with pytest.raises(ValueError, match="worker 2 out of range"):
        vm.run(asm.assemble("mov r0, 0\nexit"), _ctx(worker=2), ms)


def _sx(v, bits):
    return v - (1 << bits) if v >> (bits - 1) else v


JMP_MODEL = {
    "jeq": lambda a, b, s: a == b, "jne": lambda a, b, s: a != b, "jset": lambda a, b, s: bool(a & b),
    "jgt": lambda a, b, s: a > b, "jge": lambda a, b, s: a >= b,
    "jlt": lambda a, b, s: a < b, "jle": lambda a, b, s: a <= b,
    "jsgt": lambda a, b, s: _sx(a, s) > _sx(b, s), "jsge": lambda a, b, s: _sx(a, s) >= _sx(b, s),
    "jslt": lambda a, b, s: _sx(a, s) < _sx(b, s), "jsle": lambda a, b, s: _sx(a, s) <= _sx(b, s),
}


@pytest.mark.parametrize("op", sorted(JMP_MODEL))
def test_jumps_match_python_model(op):
    import random
    rnd = random.Random(op)
    vals = [0, 1, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF, 1 << 32, (1 << 63) - 1, 1 << 63, (1 << 64) - 1]
    vals += [rnd.getrandbits(64) for _ in range(8)]
    imms = [0, 1, -1, 0x7FFFFFFF, -0x80000000, 5]
    for width, sfx in ((64, ""), (32, "32")):
        reg = vm.Vm(asm.assemble(f"ldxdw r2, [r1+104]\nldxdw r1, [r1+96]\nmov r0, 0\n"
                                 f"{op}{sfx} r1, r2, +1\nexit\nmov r0, 1\nexit"))
        m = (1 << width) - 1
        for a in vals:
            for b in vals:
                got = reg.run(_ctx(dur_ns=a, wait_ns=b)).r0
                assert got == JMP_MODEL[op](a & m, b & m, width), (op + sfx, a, b)
            for k in imms:
                kp = vm.Vm(asm.assemble(f"ldxdw r1, [r1+96]\nmov r0, 0\n{op}{sfx} r1, {k}, +1\nexit\n"
                                        f"mov r0, 1\nexit"))
                got = kp.run(_ctx(dur_ns=a)).r0
                assert got == JMP_MODEL[op](a & m, k & m, width), (op + sfx, a, k)
