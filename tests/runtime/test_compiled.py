"""Compiled tier without a GPU (dtrace_mk.runtime.compiled).

* Differential on the CPU: the translation of random verified programs, compiled by the
  host g++ together with the device map code (kernels/bpf_maps.cuh) and the tier's
  wrapper (kernels/bpf_compiled.cuh) as a warp of one lane, run serially over random
  contexts, gives the reference VM's r0, outcome, maps, map stats and coverage rows;
  so do the engine-agnostic vm_cases the device runs; a deliberately wrong translation
  is caught.
* NVRTC: the monitors (random programs, every device vm_case) compile to LTO-IR for
  sm_90a; with nvJitLink (pip nvidia-nvjitlink) the harness and a monitor link into a
  cubin in which the hook entry point has been inlined away, and builds are cached.
* One run-prog body (bpf_run_prog.cuh) and one harness body (bpf_vm_harness.cu) for both
  tiers; every harness variant compiles with the same kernel interface; constants agree.
"""
from __future__ import annotations

import dataclasses
import random
import re
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from dtrace_mk.abi import definition as abi
from dtrace_mk.bpf import asm
from dtrace_mk.bpf.program import BpfObject, MapDef, Program
from dtrace_mk.bpf.verifier import verify
from dtrace_mk.runtime import compiled as C
from dtrace_mk.runtime import device as D
from dtrace_mk.runtime.reference import ReferenceRuntime

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "gpu"))
sys.path.insert(0, str(HERE.parent / "bpf" / "vm_cases"))

import device_progs as G                      # noqa: E402

HOOK = abi.hook("task:end")


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("DTRACE_MK_CACHE", str(tmp_path_factory.getbasetemp() / "cm_cache"))


def _attach_pair(ref, host, obj, tier=None, **kw):
    """obj on the reference and the host-compiled runtime, both hash maps pre-filled alike."""
    init = {k: v for k, v in G.prefill(obj).items() if k in {m.name for m in obj.maps}}
    ra = ref.attach(obj, **kw)
    for name, items in init.items():
        for k, v in items.items():
            ref.maps(ra)[name].update(k, v)
    return ra, host.attach(obj, init_hash=init, tier=tier, **kw)


def _run_group(objs, ctxs, workers, fold_maps=True, defines=(), **kw):
    """Reference and host-compiled runtimes, the same attachments in the same order."""
    ref, host = ReferenceRuntime(num_workers=workers), C.HostCompiledRuntime(workers, defines=defines)
    host.fold_maps = fold_maps
    pairs = [_attach_pair(ref, host, obj, **kw) for obj in objs]
    rres = [ref.fire(c) for c in ctxs]
    batch = host.fire(ctxs)
    return ref, host, pairs, rres, batch


def _diff(ref, host, pairs, rres, batch):
    probs = G.compare_fires(rres, batch)
    for ra, ha in pairs:
        probs += G.compare_maps(ref.maps(ra), host.maps(ha), ordered=True)
        rc, hc = G.coverage_dict(ref.coverage(ra)), G.coverage_dict(host.coverage(ha))
        if rc != hc:
            probs.append(f"coverage of attachment {ra}: reference {rc} compiled {hc}")
    return probs


# ------------------------------------------------------------------ CPU differential

needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="the host build needs g++")

N_OBJECTS = 48


@needs_gxx
def test_random_programs_match_the_reference_vm_on_the_cpu():
    rnd = random.Random(20261130)
    objs = [G.random_object(rnd, parallel_safe=i % 3 == 0, n_progs=rnd.randint(1, 3)) for i in range(N_OBJECTS)]
    ran = {"executed": 0, "lost": 0, "throttled": 0}
    for gi, group in enumerate(G.groups(objs)):
        ctxs = G.random_contexts(rnd, 120, 3, epochs=3)
        ref, host, pairs, rres, batch = _run_group(group, ctxs, 3)
        probs = _diff(ref, host, pairs, rres, batch)
        assert not probs, f"group {gi}:\n" + "\n".join(probs[:20])
        for ra, _ in pairs:
            for c in ref.coverage(ra):
                for k in ran:
                    ran[k] += getattr(c, k)
    # the comparison saw every outcome (not a vacuous pass)
    assert ran["executed"] > 1000 and ran["lost"] > 0 and ran["throttled"] > 0, ran


@needs_gxx
def test_sampling_and_rate_limit_match_the_reference_on_the_cpu():
    rnd = random.Random(77)
    objs = [G.random_object(rnd, parallel_safe=False, n_progs=2) for _ in range(2)]
    ctxs = G.random_contexts(rnd, 150, 2, epochs=3)
    r = _run_group(objs, ctxs, 2, sample_every=3, max_per_epoch=9)
    assert not _diff(*r)
    thr = sum(c.throttled for ra, _ in r[2] for c in r[1].coverage(r[2][0][1]))
    assert thr > 0


def _device_cases():
    from harness import all_cases, parse_case
    return [c for c in (parse_case(p) for p in all_cases()) if not G.device_skip(c)]


class HostCompiledEngine:
    name = "compiled-host"

    def run(self, case):
        from harness import Outcome
        rt = C.HostCompiledRuntime(case.opt_int("workers", 1), max_insns=case.opt_int("max_insns", abi.MAX_INSNS),
                                   opt="-O0")          # ~50 small builds: the fast g++ level
        limit = case.opt_int("max_per_epoch", -1)
        aid = rt.attach(case.object(), verify=False, sample_every=case.opt_int("sample_every", 1),
                        max_per_epoch=None if limit < 0 else limit)
        batch = rt.fire(case.events)
        results = [r0 for i in range(len(case.events)) for (_, _, _, r0) in batch.results(i)]
        maps, stats = {}, {}
        for m in rt.maps(aid):
            stats[m.name] = (m.stats.lost, m.stats.throttled)
            maps[m.name] = [r.data for r in m.drain()] if m.kind == "ringbuf" else \
                m.snapshot(skip_zero=m.kind in ("array", "per_worker_array"))
        rows = rt.coverage(aid)
        cov = {k: sum(getattr(c, k) for c in rows) for k in ("eligible", "executed", "throttled", "lost")}
        return Outcome(results, [], maps, stats, cov, True, [], [])


@needs_gxx
def test_vm_cases_on_the_cpu_compiled_tier():
    from harness import check
    cases = _device_cases()
    assert len(cases) >= 45
    bad = {}
    for case in cases:
        probs = check(case, HostCompiledEngine().run(case))
        if probs:
            bad[case.name] = probs
    assert not bad, bad


@needs_gxx
def test_instruction_budget_binds_like_the_vm():
    """Longest path over the budget: the translation counts, and the event is lost (fault)
    at the check the VM makes; coverage as the reference's."""
    text = "mov r0, 0\n" + "add r0, 1\n" * 30 + "jeq r0, 99, out\n" + "add r0, 1\n" * 10 + "out:\nexit\n"
    prog = Program("budget", HOOK.section, HOOK, asm.assemble(text, []))
    obj = BpfObject([prog], [], path="<budget>")
    recs = D.encode_program(prog.insns)
    assert C.longest_path(recs) == 43
    src = C.translate(recs, "f", max_insns=20)
    assert "cnt++" in src and "if (cnt > 20u) goto L_fault" in src
    assert "cnt++" not in C.translate(recs, "f", max_insns=43)
    ref, host = ReferenceRuntime(1, max_insns=20), C.HostCompiledRuntime(1, max_insns=20)
    ra, ha = ref.attach(obj, verify=False), host.attach(obj, verify=False)
    ev = [G.random_contexts(random.Random(1), 1, 1)[0]]
    assert ref.fire(ev[0])[0].outcome == "lost"
    assert host.fire(ev).outcome[0, 0] == D.OUT_FAULT
    assert G.coverage_dict(ref.coverage(ra)) == G.coverage_dict(host.coverage(ha))


@needs_gxx
def test_a_wrong_translation_is_caught(monkeypatch):
    """Make jsgt unsigned: the differential test must see it."""
    text = """
        ldxw r7, [r1+28]
        lddw r8, 0xfffffffffffffff0
        mov r0, 1
        jsgt r7, r8, out
        mov r0, 2
    out:
        exit
    """
    prog = Program("sgt", HOOK.section, HOOK, asm.assemble(text, []))
    obj = BpfObject([prog], [], path="<sgt>")
    ctxs = G.random_contexts(random.Random(2), 8, 1)
    assert not _diff(*_run_group([obj], ctxs, 1))
    monkeypatch.setitem(C.translator._CMP, 0x6, "{a} > {b}")
    probs = _diff(*_run_group([obj], ctxs, 1))
    assert any("r0 reference 0x1 device 0x2" in p for p in probs), probs


def _prog_bodies(src: str) -> str:
    """The ring-form program functions of a monitor (dtmk_cm_prog_<i>; not the inline form's)."""
    return "".join(c for c in src.split("static __device__ __forceinline__ int dtmk_cm_")[1:] if c.startswith("prog_"))


def test_each_map_runs_its_helpers_through_a_shape_of_its_descriptor():
    """Every map but a ringbuf gets a shape of constants equal to the descriptor the host
    wrote; a helper call right after its `lddw_map r1` names that one shape (no chain of
    tests), and the ringbuf's output helper stays the generic one."""
    obj = G.random_object(random.Random(11), parallel_safe=False, n_progs=3)
    rt = C.HostCompiledRuntime(2)
    aid = rt.attach(obj, tier="compiled")
    src = rt.monitor()
    dm = rt.device_maps(aid)
    got = {int(m.group(1), 16): tuple(int(x) for x in m.groups()[1:]) for m in re.finditer(
        r"DTMK_CONST_SHAPE\(\w+, 0x([0-9a-f]+)ull, (\d+)u, (\d+)u, (\d+)u, (\d+)u, (\d+)u", src)}
    want = {dm.desc_addr(i): tuple(int(d[f]) for f in ("type", "key_size", "value_size", "max_entries", "capacity"))
            for i, (m, d) in enumerate(zip(dm.defs, dm.host_descs)) if m.type != "ringbuf"}
    assert got == want and len(want) == len(dm.defs) - 1
    calls = [ln for ln in _prog_bodies(src).splitlines() if re.search(r"/\* \d+: call_(map_\w+|hist_add) \*/", ln)]
    assert len(calls) >= 3 and all(ln.count("(dtmk_cm_map") == 1 for ln in calls), calls
    ring = dm.desc_addr([m.type for m in dm.defs].index("ringbuf"))
    outs = [ln for ln in _prog_bodies(src).splitlines() if "call_ringbuf_output" in ln]
    assert outs and all("dtmk_cm_map" not in ln and "r0 = dtmk_ringbuf_output(" in ln for ln in outs)
    assert f"{ring:#x}ull" in src


def test_the_inline_form_keeps_the_generic_calls():
    """The inline form runs in the workers' hook code, where its helper calls are a full
    shadow window's fallback: folded, they grew hook_flush / hook_put by ~100 instructions
    each (session 38), so only the ring form (the drains) folds."""
    from dtrace_mk.runtime.live import summary_monitor
    rt = C.HostCompiledRuntime(2)
    rt.attach(summary_monitor().obj, tier="compiled")
    parts = rt.monitor().split("static __device__ __forceinline__ int dtmk_cm_")[1:]
    inline = "".join(c for c in parts if c.startswith("iprog_"))
    ring = "".join(c for c in parts if c.startswith("prog_"))
    assert "dtmk_sh_get(S," in inline and "(dtmk_cm_map" not in inline and "dtmk_hist_add((const" in inline
    assert "dtmk_hist_add_t(dtmk_cm_map" in ring


@needs_gxx
@pytest.mark.parametrize("defines", [(), ("DTMK_HASH_LOOK_FAST",)])
def test_generic_helpers_still_match_when_maps_are_not_folded(defines):
    """fold_maps=False (bench/hooks.py's A/B): no shapes, every call generic, same results;
    so with -DDTMK_HASH_LOOK_FAST (the generic helpers' register-only probe for 4- and 8-byte
    keys, opt-in: bench/hooks.py variant obssm4look)."""
    rnd = random.Random(38)
    objs = [G.random_object(rnd, parallel_safe=False, n_progs=2) for _ in range(2)]
    ctxs = G.random_contexts(rnd, 120, 2, epochs=2)
    run = _run_group(objs, ctxs, 2, fold_maps=False, defines=defines)
    src = run[1].monitor()
    assert "DTMK_CONST_SHAPE(dtmk" not in src and "dtmk_map_lookup((const struct dtmk_map *)r1" in src
    assert not _diff(*run)


@needs_gxx
def test_the_swap_builds_the_generic_form_and_stage_2_folds():
    """A promotion's stage-1 build (the swap, on its critical path) keeps the generic map
    helpers -- folding adds a third to the monitor's compile -- and the background stage 2
    folds; both run the same events alike."""
    rnd = random.Random(3)
    obj = G.random_object(rnd, parallel_safe=False, n_progs=2)
    ctxs = G.random_contexts(rnd, 60, 2, epochs=1)
    ref, rt = ReferenceRuntime(num_workers=2), C.HostCompiledRuntime(2)
    ra, aid = _attach_pair(ref, rt, obj, tier="hot")
    key, work = rt.prepare_promotion(aid)
    assert "DTMK_CONST_SHAPE(dtmk" not in key and "dtmk_map_lookup((const struct dtmk_map *)r1" in key
    assert rt.commit_promotion(aid, key, work()) and rt.installed_stage == 1
    half = len(ctxs) // 2
    rres, b1 = [ref.fire(c) for c in ctxs[:half]], rt.fire(ctxs[:half])
    assert rt._lib_src == key                                 # fire() kept the stage-1 library
    key2, work2 = rt.prepare_optimize()
    assert "DTMK_CONST_SHAPE(dtmk" in key2
    assert rt.commit_optimize(key2, work2()) and rt.installed_stage == 2
    rres2, b2 = [ref.fire(c) for c in ctxs[half:]], rt.fire(ctxs[half:])
    assert not G.compare_fires(rres, b1) and not G.compare_fires(rres2, b2)
    assert not G.compare_maps(ref.maps(ra), rt.maps(aid), ordered=True)


@needs_gxx
@pytest.mark.parametrize("kind, field, change, seen_in", [
    ("array", "max_entries", lambda v: v - 1, "map arr"),     # the last index out of range
    ("hash", "capacity", lambda v: v // 2, "map counts"),     # probes in half the table
])
def test_a_wrong_shape_is_caught(monkeypatch, kind, field, change, seen_in):
    """The shapes are what the compiled programs run: one wrong field of one map type
    and the differential test sees that map differ."""
    rnd = random.Random(20261204)
    every_index = """
        ldxw r2, [r1+28]
        and r2, 3
        stxw [r10-4], r2
        lddw r1, map:arr
        mov r2, r10
        add r2, -4
        call map_lookup_elem
        jeq r0, 0, out
        mov r1, 1
        xadddw [r0+8], r1
    out:
        mov r0, 0
        exit
    """
    arr = MapDef("arr", "array", 4, 16, 4)
    objs = [G.random_object(rnd, parallel_safe=False, n_progs=4),
            BpfObject([Program("idx", HOOK.section, HOOK, asm.assemble(every_index, ["arr"]))], [arr], path="<idx>")]
    ctxs = G.random_contexts(rnd, 150, 2, epochs=2)
    assert not _diff(*_run_group(objs, ctxs, 2))
    real = C.MapShape.of
    type_id = abi.MAP_TYPES_BY_NAME[kind].id

    def wrong(desc):
        s = real(desc)
        return s if s is None or s.type != type_id else dataclasses.replace(s, **{field: change(getattr(s, field))})
    monkeypatch.setattr(C.MapShape, "of", staticmethod(wrong))
    probs = _diff(*_run_group(objs, ctxs, 2))
    assert any(p.startswith(seen_in) for p in probs), probs


def test_loops_are_refused_by_longest_path_and_counted_by_the_translation():
    insns = asm.assemble("mov r0, 0\nl:\nadd r0, 1\njlt r0, 5, l\nexit\n", [])
    recs = D.encode_program(insns)
    with pytest.raises(C.TranslateError, match="record 2: jump to 1 closes a loop"):
        C.longest_path(recs)
    assert "if (cnt > 4096u) goto L_fault" in C.translate(recs, "f")


def test_translation_folds_constant_divisors_and_masks_shifts():
    insns = asm.assemble("""
        mov r0, 7
        div r0, 0
        mod32 r0, 0
        lsh r0, 70
        arsh32 r0, 33
        be16 r0
        exit
    """, [])
    src = C.translate(D.encode_program(insns), "f")
    assert "/* 1: div_k */ r0 = 0ull;" in src
    assert "/* 2: mod32_k */ r0 = (dtmk_u32)((dtmk_u32)r0);" in src
    assert "r0 << 6;" in src and ">> 1)" in src
    assert "(int)(dtmk_u32)r0 >> 1" in src


@needs_gxx
def test_host_runtime_refuses_bad_records():
    from dtrace_mk.errors import UserError
    rt = C.HostCompiledRuntime(1)
    rt.attach(G.random_object(random.Random(3), parallel_safe=True), init_hash={})
    with pytest.raises(UserError, match="field 'worker'"):
        rt.fire(G.random_contexts(random.Random(4), 2, 3))


# ------------------------------------------------------------------ kernel-side sources

def _fn_body(text: str, name: str) -> str:
    i = re.search(r"__device__[^;{]*\b" + name + r"\(", text).start()   # the definition, not a comment
    j = text.index("{", i)
    depth, k = 0, j
    while True:
        depth += {"{": 1, "}": -1}.get(text[k], 0)
        k += 1
        if depth == 0:
            return text[j:k]


def _norm(s: str) -> str:
    s = re.sub(r"/\*.*?\*/", "", s, flags=re.S)
    return re.sub(r"\s+", " ", s).strip()


def _kernel_text(name: str) -> str:
    return (D.KERNEL_DIR / name).read_text()


def test_both_tiers_run_one_run_prog_body():
    """Sampling, rate limit and coverage live in dtmk_run_prog (bpf_run_prog.cuh) only:
    dtmk_vm_run_prog and dtmk_cm_run_prog are one call with their tier's exec step."""
    kernels = {p.name: p.read_text() for p in D.KERNEL_DIR.iterdir() if p.suffix in (".cu", ".cuh", ".h")}
    assert not [n for n, t in kernels.items() if "BEGIN copy" in t]
    for marker in ("sample_every", "dtmk_rate_ticket(", "dtmk_cov_add("):
        users = sorted(n for n, t in kernels.items() if marker in _norm(t) and n != "bpf_maps.cuh")
        assert users == ["bpf_run_prog.cuh"], (marker, users)
    for name, fn, step, call in (("bpf_vm.cuh", "dtmk_vm_run_prog", "dtmk_vm_exec_step", "dtmk_vm_exec("),
                                 ("bpf_compiled.cuh", "dtmk_cm_run_prog", "dtmk_cm_exec_step", "dtmk_cm_exec(")):
        text = _kernel_text(name)
        assert '#include "bpf_run_prog.cuh"' in text
        assert re.fullmatch(r"\{ return dtmk_run_prog<" + step + r">\([^;]*\); \}", _norm(_fn_body(text, fn))), fn
        i = text.index("struct " + step + " {")
        assert call in _norm(text[i:text.index(fn, i)]), step
    assert "Exec::exec(" in _norm(_kernel_text("bpf_run_prog.cuh"))


def test_both_tiers_run_one_body_of_each_map_operation():
    """The helpers the VM calls (bpf_maps.cuh) are bpf_map_ops.cuh's operations over the
    descriptor, one call each; a compiled monitor's shapes reach the same templates, and the
    hash table's states are touched nowhere else."""
    text = _kernel_text("bpf_maps.cuh")
    for fn in ("dtmk_hash_find", "dtmk_map_lookup", "dtmk_map_update", "dtmk_map_delete", "dtmk_hist_add"):
        body = _norm(_fn_body(text, fn))
        if fn == "dtmk_hash_find":       # (its opt-in fast probe is the compiled tier's dtmk_hash_look)
            fast = re.fullmatch(r"\{ #ifdef DTMK_HASH_LOOK_FAST (.*) #endif (.*)", body)
            assert fast and "dtmk_hash_look<8u>(" in fast.group(1) and "dtmk_hash_find_t" not in fast.group(1)
            body = "{ " + fast.group(2)
        assert re.fullmatch(r"\{ return " + fn + r"_t\(dtmk_desc_shape\{m\}, [^;]*\); \}", body), fn
    kernels = {p.name: p.read_text() for p in D.KERNEL_DIR.iterdir() if p.suffix in (".cu", ".cuh", ".h")}
    assert sorted(n for n, t in kernels.items() if "DTMK_SLOT_BUSY" in _norm(t)) == ["bpf_map_ops.cuh"]
    ops = _kernel_text("bpf_map_ops.cuh")
    assert "dtmk_hash_find_t(dtmk_probe_shape<KEY_SIZE>{" in _norm(ops)        # the compiled tier's probe
    assert "#include" not in _norm(ops).split("#define DTMK_BPF_MAP_OPS_CUH")[1].replace(
        '#include "dtrace_mk_abi.h" #include "bpf_buckets.cuh"', "")            # includable by a monitor


def test_compiled_harness_is_the_vm_harness_body():
    """kernels/bpf_compiled_harness.cu only selects the compiled variant of bpf_vm_harness.cu."""
    assert _norm(_kernel_text("bpf_compiled_harness.cu")) == \
        '#define DTMK_HARNESS_COMPILED #include "bpf_vm_harness.cu"'
    assert C.HARNESS == "bpf_compiled_harness.cu" and "bpf_vm_harness.cu" in C.HARNESS_SOURCES


def _defines(text: str, prefix: str):
    return {m.group(1): int(m.group(2), 0) for m in re.finditer(rf"#define ({prefix}\w+) (\w+)", text)}


def test_outcome_codes_agree_everywhere():
    vm = _defines((D.KERNEL_DIR / "bpf_vm.cuh").read_text(), "DTMK_OUT_")
    assert vm == _defines((D.KERNEL_DIR / "bpf_compiled.cuh").read_text(), "DTMK_OUT_") == \
        _defines(C.PRELUDE, "DTMK_OUT_")
    assert (vm["DTMK_OUT_EXECUTED"], vm["DTMK_OUT_FAULT"], vm["DTMK_OUT_SAMPLED"]) == \
        (D.OUT_EXECUTED, D.OUT_FAULT, D.OUT_SAMPLED)


def test_every_hook_has_an_entry_point():
    assert C.HOOK_IDS == tuple(sorted(h.id for h in abi.HOOKS))
    cm = (D.KERNEL_DIR / "bpf_compiled.cuh").read_text()
    src = C.monitor_source([])
    for h in C.HOOK_IDS:
        assert f"DTMK_CM_HOOK_DECL({h})" in cm and f"case {h}: return dtmk_cm_hook_{h}(" in cm
        assert f'extern "C" __device__ int dtmk_cm_hook_{h}(' in src
    assert "DTMK_CM_HOOK_DECL(%d)" % (abi.MAX_HOOK_ID + 1) not in cm


def test_host_build_edits_only_the_ptx_one_liners():
    # the host header is bpf_maps.cuh with bpf_map_ops.cuh in place of its #include line
    inc = '#include "bpf_map_ops.cuh"'
    maps = (D.KERNEL_DIR / "bpf_maps.cuh").read_text()
    ops = (D.KERNEL_DIR / "bpf_map_ops.cuh").read_text()
    head, tail = maps.split(inc)
    orig = head + ops + tail
    host = C.host_maps_header()
    assert len(orig.splitlines()) == len(host.splitlines())
    diff = [(a, b) for a, b in zip(orig.splitlines(), host.splitlines()) if a != b]
    assert len(diff) == 2 and all("asm volatile" in a and "volatile" in b for a, b in diff)


# ------------------------------------------------------------------ NVRTC / nvJitLink

pytest.importorskip("cuda.bindings.nvrtc")


def _addrs(maps):
    return ([0x7F00_0000_0000 + 128 * i for i in range(len(maps))],
            [0x7E00_0000_0000 + 0x10000 * i if m.type == "array" else 0 for i, m in enumerate(maps)])


def _monitor_for(objs, base=0):
    progs = []
    for obj in objs:
        descs, vals = _addrs(obj.maps)
        for p in obj.programs:
            res = verify(p, obj.maps)
            progs.append(C.MonitorProgram(p.hook.id, base + len(progs), p.name,
                                          D.encode_program(p.insns, descs, vals, p.name),
                                          res.max_path_insns, res.stack_depth))
    return C.monitor_source(progs)


def test_random_monitors_compile_to_ltoir_for_sm90a():
    rnd = random.Random(5)
    objs = [G.random_object(rnd, parallel_safe=i % 2 == 0, n_progs=rnd.randint(1, 3)) for i in range(24)]
    ir = C.ltoir(_monitor_for(objs), "random_monitor.cu")
    assert len(ir) > 10000
    one = C.ltoir(_monitor_for(objs[:1]), "one.cu")
    assert 0 < len(one) < len(ir)


def test_every_device_vm_case_compiles_to_ltoir():
    progs = []
    for case in _device_cases():
        obj = case.object()
        descs, vals = _addrs(obj.maps)
        p = obj.programs[0]
        progs.append(C.MonitorProgram(p.hook.id, len(progs), case.name, D.encode_program(p.insns, descs, vals)))
    assert len(progs) >= 45
    assert len(C.ltoir(C.monitor_source(progs), "vm_cases.cu")) > 0


def test_compiled_harness_compiles_to_ltoir():
    ir, _ = C.harness_ltoir()
    assert len(ir) > 10000


def _entry(ptx: str, name: str):
    """(parameter types, static shared declarations) of kernel `name` in PTX, names removed."""
    m = re.search(r"\.entry " + name + r"\((.*?)\)\s*\{(.*?)\n\}", ptx, re.S)
    assert m, name
    params = re.findall(r"\.param (\S+) " + name + r"_param_\d+", m.group(1))
    shared = re.findall(r"\.shared (.*?) _ZZ\d+" + name + r"E\d+(\w+\[?\d*\]?);", m.group(2))
    return params, shared


def test_every_harness_variant_compiles_with_one_kernel_interface():
    """Both harness kernels (and the bench / link-time variants) from the one body: same
    parameters and static shared memory; the naive baseline only in the VM harness."""
    from dtrace_mk.kernels import build
    rdc = ["--relocatable-device-code=true"]         # the compiled harness calls the monitor's hooks
    variants = {("bpf_vm_harness.cu", ()): [], ("bpf_vm_harness.cu", ("DTMK_VM_REGS_LOCAL",)): [],
                (C.HARNESS, ()): rdc, (C.HARNESS, ("DTMK_CM_NO_VM",)): rdc}
    shapes = []
    for (name, defines), opts in variants.items():
        ptx = build.nvrtc_compile(_kernel_text(name), name, C.ARCH, "ptx", defines, options=opts).decode()
        entries = sorted(re.findall(r"\.entry (\w+)\(", ptx))
        vm = name == "bpf_vm_harness.cu"
        assert entries == (["dtmk_vm_harness", "dtmk_vm_naive"] if vm else ["dtmk_compiled_harness"]), (name, defines)
        assert ("dtmk_cm_hook_" in ptx) != vm, (name, defines)
        shapes.append(_entry(ptx, "dtmk_vm_harness" if vm else "dtmk_compiled_harness"))
    assert len(shapes[0][0]) == 12 and [n for _, n in shapes[0][1]] == ["code_off[352]", "ok", "accs[2560]"]
    assert all(sh == shapes[0] for sh in shapes), shapes


HOOK_SITE_PROBE = r"""
#include "bpf_vm.cuh"
#include "bpf_compiled.cuh"
extern "C" __global__ void dtmk_cm_hook_site_probe(const struct dtmk_hook_table *g_tables,
                                                    const struct dtmk_ctx *g_recs, dtmk_u32 n) {
    __shared__ struct dtmk_hook_table tabs[DTMK_NUM_HOOKS];
    __shared__ struct dtmk_ctx ring[32];
    __shared__ dtmk_u64 regs[DTMK_VM_NREGS * 32];
    __shared__ struct dtmk_cov_acc accs[DTMK_MAX_PROGS];
    if (threadIdx.x == 0) {
        for (int h = 1; h < DTMK_NUM_HOOKS; h++) dtmk_vm_load_table(g_tables + h, &tabs[h]);
        tabs[0].n_progs = 0;
        for (int k = 0; k < DTMK_MAX_PROGS; k++) { accs[k].cov = 0; accs[k].eligible = 0; }
    }
    if (threadIdx.x < n) ring[threadIdx.x] = g_recs[threadIdx.x];
    __syncthreads();
    if (threadIdx.x < 32) {
        dtmk_cm_run_records(tabs, ring, n, regs, accs, blockIdx.x, 0);
        if (threadIdx.x == 0)
            for (int k = 0; k < DTMK_MAX_PROGS; k++) dtmk_cov_acc_flush(&accs[k]);
    }
}
"""


def test_the_megakernel_hook_site_call_compiles_and_links():
    """dtmk_cm_run_records (what a megakernel hook site calls) compiles to LTO-IR; with
    nvJitLink it links against the empty monitor."""
    ir = C.ltoir(HOOK_SITE_PROBE, "hook_site_probe.cu")
    assert len(ir) > 1000
    if C.nvjitlink_available():
        cubin = C.link_cubin([("probe", ir), ("empty", C.ltoir(C.monitor_source([]), "empty.cu"))])
        assert b"dtmk_cm_hook_site_probe" in cubin


def test_nvrtc_errors_carry_the_log():
    with pytest.raises(D.CompileError, match="bad.cu"):
        C.ltoir("this is not C", "bad.cu")


@pytest.fixture(scope="module")
def nvjitlink():
    if not C.nvjitlink_available():
        pytest.skip("nvJitLink is not installed (pip nvidia-nvjitlink)")


def test_link_inlines_the_monitor_and_caches(nvjitlink):
    rnd = random.Random(6)
    mon = _monitor_for([G.random_object(rnd, parallel_safe=False, n_progs=2)])
    path, t1 = C.build_compiled_harness(mon)
    cubin = path.read_bytes()
    assert cubin[:4] == b"\x7fELF" and b"dtmk_compiled_harness" in cubin
    assert b"dtmk_cm_hook_4" not in cubin and b"dtmk_cm_prog_0" not in cubin   # inlined by the LTO link
    assert b"dtmk_map_lookup" in cubin                                        # the VM's helper, called
    assert t1.cached == "" and t1.link_s > 0 and t1.monitor_ltoir_s > 0
    path2, t2 = C.build_compiled_harness(mon)
    assert path2 == path and t2.cached == "cubin"


def test_link_refuses_a_monitor_without_hook_entry_points(nvjitlink):
    h, _ = C.harness_ltoir()
    part = C.ltoir(C.PRELUDE + 'extern "C" __device__ int dtmk_cm_hook_1(dtmk_u32 a, const struct dtmk_ctx *c, '
                   'dtmk_u32 w, dtmk_u32 e, dtmk_u32 f, dtmk_u64 *r) { return 4; }\n', "partial.cu")
    with pytest.raises(C.LinkError, match=r"Unresolved extern function .dtmk_cm_hook_\d+"):
        C.link_cubin([("h", h), ("partial", part)])


# ------------------------------------------------------------------ every op on edge values

EDGE = [0, 1, 2, 5, 31, 32, 33, 63, 64, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF, 0x100000000,
        0x7FFFFFFFFFFFFFFF, 0x8000000000000000, 0xFFFFFFFFFFFFFFFF, 0xFFFFFFFF80000000, 0x123456789ABCDEF0]
ALU_OPS = ["add", "sub", "mul", "div", "mod", "or", "and", "xor", "lsh", "rsh", "arsh", "mov"]
JMP_OPS = ["jeq", "jne", "jgt", "jge", "jlt", "jle", "jsgt", "jsge", "jslt", "jsle", "jset"]


def _edge_program():
    """Every ALU and JMP op, 64/32-bit, register and immediate operands, and the byte
    swaps, on a = dur_ns, b = wait_ns; result k is added into res[k] (sums over events:
    any wrong result on any event shows)."""
    lines = ["mov r6, r1", "ldxdw r8, [r6+96]", "ldxdw r9, [r6+104]"]
    k = 0

    def emit(body):
        nonlocal k
        lines.extend(["mov r7, r8"] + body + [
            f"mov r2, {k}", "stxw [r10-4], r2", "lddw r1, map:res", "mov r2, r10", "add r2, -4",
            "call map_lookup_elem", f"jeq r0, 0, S{k}", "xadddw [r0+0], r7", f"S{k}:"])
        k += 1
    for w in ("", "32"):
        for op in ALU_OPS:
            emit([f"{op}{w} r7, r9"])
            for imm in ((0, 1, 7, 31) if op in ("lsh", "rsh", "arsh") else (0, -1, 7, -0x80000000)):
                emit([f"{op}{w} r7, {imm}"])
        emit([f"neg{w} r7"])
        for c in JMP_OPS:
            for rhs in ("r9", "-1", "5", "-0x80000000"):
                emit([f"mov r3, r7", "mov r7, 1", f"{c}{w} r3, {rhs}, T{k}", "mov r7, 2", f"T{k}:"])
    for sw in ("le16", "le32", "le64", "be16", "be32", "be64"):
        emit([f"{sw} r7"])
    lines += ["mov r0, 0", "exit"]
    return "\n".join(lines), k


@needs_gxx
def test_every_alu_and_jmp_op_on_edge_values():
    from dtrace_mk.abi import context
    text, n = _edge_program()
    maps = [MapDef("res", "array", 4, 8, n)]
    prog = Program("edges", HOOK.section, HOOK, asm.assemble(text, ["res"]))
    obj = BpfObject([prog], maps, path="<edges>")
    ctxs = [context.pack(HOOK, dur_ns=a, wait_ns=b) for a in EDGE for b in EDGE]
    r = _run_group([obj], ctxs, 1)
    probs = _diff(*r)
    assert not probs, "\n".join(probs[:10])
    vals = r[0].maps(r[2][0][0])["res"].snapshot(skip_zero=True)
    assert len(vals) > 0.9 * n, f"only {len(vals)} of {n} results are non-zero"
