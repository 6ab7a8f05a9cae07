"""Compiled host tier (bpf/vmcompile.py) against the interpreter (bpf/vm.py), which is
the semantics: identical r0, instruction counts, losses, faults (pc, message, insns),
maps (bytes), trace lines, hints and coverage over the vm_cases tables, the random
verified programs of the device differential tests, hypothesis-generated verifiable
and raw programs, and budget edge cases."""
import random
import struct
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dtrace_mk.abi import context
from dtrace_mk.bpf import asm, vm, vmcompile
from dtrace_mk.bpf.maps import MapSet
from dtrace_mk.bpf.program import MapDef, Program
from dtrace_mk.runtime.reference import ReferenceRuntime

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "vm_cases"))
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "gpu"))
import device_progs  # noqa: E402
import harness  # noqa: E402
from test_verifier_props import MAPS as PROP_MAPS  # noqa: E402
from test_verifier_props import _ctx_bytes, programs, raw_programs  # noqa: E402

CASES = harness.all_cases()
HOOK = device_progs.HOOK
SET = settings(max_examples=150, deadline=None, database=None,
               suppress_health_check=list(HealthCheck))


def _snap(maps):
    return device_progs.snapshot(maps) if maps is not None else None


def _outcome(machine, ctx, **kw):
    try:
        res = machine.run(ctx, **kw)
    except vm.VMFault as e:
        return ("fault", e.pc, e.message, e.insns)
    except ValueError as e:
        return ("error", str(e))
    return ("ok", res.r0, res.insns, tuple(res.lost), tuple(res.throttled))


def differential(prog, make_maps, ctxs, **vm_kw):
    """Run `prog` over `ctxs` in both tiers (each with its own fresh maps); return the
    two (outcomes, maps, trace, hints) and check the compiled tier really was used."""
    got = []
    for tier in ("interp", "compiled"):
        maps = make_maps()
        machine = vm.Vm(prog, maps, tier=tier, **vm_kw)
        assert (machine._fast is not None) == (tier == "compiled")
        outs = [_outcome(machine, c) for c in ctxs]
        got.append((outs, _snap(maps), machine.trace.texts(), list(machine.hints)))
    return got


def assert_same(prog, make_maps, ctxs, **vm_kw):
    a, b = differential(prog, make_maps, ctxs, **vm_kw)
    assert a == b, f"interp {a}\ncompiled {b}\n" + vmcompile.program_source(
        vm.Vm(prog, make_maps(), **vm_kw))


# ------------------------------------------------------------------ vm_cases tables

@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_case_both_tiers(path):
    case = harness.parse_case(path)
    obj = case.object()
    prog = obj.programs[0]
    ctxs = [e if isinstance(e, (bytes, bytearray)) else context.from_dict(e) for e in case.events]
    workers = case.opt_int("workers", 1)
    assert_same(prog, lambda: MapSet(obj.maps, workers) if obj.maps else None, ctxs,
                max_insns=case.opt_int("max_insns", vm.abi.MAX_INSNS),
                trace=None, prog_type=prog.prog_type)


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_case_through_runtime(path, monkeypatch):
    """The whole runtime path (coverage, evidence, faults as the user sees them)."""
    outs = []
    for tier in ("interp", "compiled"):
        monkeypatch.setenv(vmcompile.ENV, tier)
        outs.append(harness.ReferenceEngine().run(harness.parse_case(path)))
    assert outs[0] == outs[1]


# ------------------------------------------------------------------ random programs

@pytest.mark.parametrize("seed", range(40))
def test_device_random_objects(seed):
    rnd = random.Random(seed)
    obj = device_progs.random_object(rnd, parallel_safe=seed % 2 == 0, n_progs=1)
    ctxs = device_progs.random_contexts(rnd, 24, num_workers=2)

    def maps():
        ms = MapSet(obj.maps, 2)
        for name, kv in device_progs.prefill(obj).items():
            if name in {m.name for m in obj.maps}:
                for k, v in kv.items():
                    ms[name].update(k, v)
        return ms
    assert_same(obj.programs[0], maps, ctxs)


def _prop_maps():
    ms = MapSet(PROP_MAPS)
    for k in range(3):
        ms["counts"].update(struct.pack("<I", k), bytes(64))
    return ms


@SET
@given(text=programs(), seeds=st.lists(st.integers(0, (1 << 64) - 1), min_size=1, max_size=3))
def test_generated_programs(text, seeds):
    """Verifier-property programs, verified or not (rejected ones may fault: faults must
    match too)."""
    prog = Program("p", HOOK.section, HOOK, asm.assemble(text, [m.name for m in PROP_MAPS]))
    assert_same(prog, _prop_maps, [_ctx_bytes(s) for s in seeds])


@SET
@given(insns=raw_programs(), seed=st.integers(0, (1 << 64) - 1), budget=st.sampled_from([3, 7, 4096]))
def test_raw_slots(insns, seed, budget):
    """Arbitrary slots (invalid opcodes, registers, jumps out, lddw halves, loops):
    every fault and budget exhaustion as the interpreter's."""
    prog = Program("raw", HOOK.section, HOOK, insns)
    assert_same(prog, lambda: MapSet(PROP_MAPS), [_ctx_bytes(seed)], max_insns=budget)


# ------------------------------------------------------------------ edge cases

CTX = context.pack("task:end", task_class=3, dur_ns=12345, worker=0, decode_step=0)


@pytest.mark.parametrize("budget", [1, 2, 5, 6, 7, 50, 4096])
def test_budget_boundaries(budget):
    loop = asm.assemble("mov r0, 0\nloop:\nadd r0, 1\njlt r0, 20, loop\nexit\n")
    straight = asm.assemble("\n".join(["mov r0, 0"] + ["add r0, 3"] * 6 + ["exit"]))
    for insns in (loop, straight):
        prog = Program("b", HOOK.section, HOOK, insns)
        assert_same(prog, lambda: None, [CTX], max_insns=budget)


def test_faults_mid_block_count_instructions():
    text = ("mov r2, 7\nmov r3, 9\nldxdw r4, [r1%+d]\nmov r0, 1\nexit\n")
    for off in (0, 120, 121, 128, -8):
        prog = Program("f", HOOK.section, HOOK, asm.assemble(text % off))
        a, b = differential(prog, lambda: None, [CTX])
        assert a == b
    prog = Program("f", HOOK.section, HOOK, asm.assemble(text % 121))
    out = _outcome(vm.Vm(prog, tier="compiled"), CTX)
    assert out[0] == "fault" and out[1] == 2 and out[3] == 3, out


def test_map_fast_paths_and_read_only_values():
    defs = [MapDef("h", "hash", 8, 16, 2), MapDef("a", "array", 4, 8, 4),
            MapDef(".rodata", "array", 4, 8, 1, init_value=b"abcdefgh", read_only=True)]
    text = """
        ldxdw r6, [r1+96]
        stxdw [r10-8], r6
        stdw [r10-24], 5
        stdw [r10-16], 6
        lddw r1, map:h
        mov r2, r10
        add r2, -8
        mov r3, r10
        add r3, -24
        mov r4, 1
        call map_update_elem
        mov r7, r0
        lddw r1, map:h
        mov r2, r10
        add r2, -8
        call map_lookup_elem
        jeq r0, 0, out
        ldxdw r8, [r0+8]
        add r7, r8
        stw [r10-32], 0
        lddw r1, map:.rodata
        mov r2, r10
        add r2, -32
        call map_lookup_elem
        jeq r0, 0, out
        ldxdw r8, [r0+0]
        add r7, r8
        stdw [r0+0], 1
    out:
        mov r0, r7
        exit
    """
    prog = Program("m", HOOK.section, HOOK, asm.assemble(text, [m.name for m in defs]))
    ctxs = [context.pack("task:end", dur_ns=d, worker=0, decode_step=0) for d in (1, 2, 1, 3, 4)]
    a, b = differential(prog, lambda: MapSet(defs), ctxs)
    assert a == b
    assert any(o[0] == "fault" and "read-only" in o[2] for o in b[0])   # the store to .rodata
    assert any(o[0] == "ok" and o[3] for o in b[0])                     # map_full loss


def test_runtime_tier_switch(monkeypatch):
    monkeypatch.setenv(vmcompile.ENV, "interp")
    assert ReferenceRuntime().vm_tier == "interp"
    monkeypatch.delenv(vmcompile.ENV)
    assert ReferenceRuntime().vm_tier == "compiled"
    monkeypatch.setenv(vmcompile.ENV, "fast")
    with pytest.raises(ValueError, match="DTRACE_MK_HOST_VM"):
        ReferenceRuntime()
    with pytest.raises(ValueError, match="tier"):
        vm.Vm(asm.assemble("mov r0, 0\nexit\n"), tier="jit")


def test_summary_monitors_same_in_both_tiers(load_bench):
    """The agent's default monitors over simulated records: same maps and coverage."""
    host_vm = load_bench("host_vm")
    schema, recs = host_vm.records(2, 16)
    obj = host_vm.compile_summary(schema).obj
    got = []
    for tier in ("interp", "compiled"):
        rt, aid, results, _ = host_vm.feed(obj, recs, 16, tier)
        got.append(host_vm.state(rt, aid, results))
    assert got[0] == got[1]
    assert any(got[0][0][k] for k in got[0][0])          # the monitors did aggregate
