"""Compiled tier on the GPU: compiled == device VM == reference VM (r0, outcome, maps, map
stats, coverage rows), and the hot -> compiled swap at a launch boundary loses and
doubles nothing.

Self-contained and quick (well under a minute on an H200 host): programs are packed
into groups of at most 8 per hook table, so each group costs one nvJitLink link
(kernels/bpf_compiled_harness.cu + the group's monitor); the kernel's LTO-IR and every
linked cubin are cached under $DTRACE_MK_CACHE.  The engine-agnostic vm_cases run on
the compiled tier in CI already (tests/runtime/test_compiled.py, host build).
"""
from __future__ import annotations

import random
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

sys.path.insert(0, str(Path(__file__).resolve().parent))

import device_progs as G                                     # noqa: E402


def _init(obj):
    return {k: v for k, v in G.prefill(obj).items() if k in {m.name for m in obj.maps}}


def _groups(objs, limit=8):
    group, n = [], 0
    for o in objs:
        if n + len(o.programs) > limit:
            yield group
            group, n = [], 0
        group.append(o)
        n += len(o.programs)
    if group:
        yield group


def _three_way(objs, ctxs, workers, *, serial, **kw):
    """Reference, device VM and compiled tier over the same attachments and events."""
    from dtrace_mk.runtime.compiled import CompiledRuntime
    from dtrace_mk.runtime.device import DeviceRuntime
    from dtrace_mk.runtime.reference import ReferenceRuntime
    ref, vm, cm = ReferenceRuntime(num_workers=workers), DeviceRuntime(workers), CompiledRuntime(workers)
    ids = []
    for obj in objs:
        init = _init(obj)
        ra = ref.attach(obj, **kw)
        for name, items in init.items():
            for k, v in items.items():
                ref.maps(ra)[name].update(k, v)
        ids.append((ra, vm.attach(obj, init_hash=init, **kw), cm.attach(obj, tier="compiled", init_hash=init, **kw)))
    rres = [ref.fire(c) for c in ctxs]
    vb = vm.fire(ctxs, serial=serial)
    cb = cm.fire(ctxs, serial=serial)
    return ref, vm, cm, ids, rres, vb, cb


def _problems(ref, vm, cm, ids, rres, vb, cb, ordered):
    probs = [f"vm: {p}" for p in G.compare_fires(rres, vb)] + [f"compiled: {p}" for p in G.compare_fires(rres, cb)]
    for ra, va, ca in ids:
        probs += [f"vm: {p}" for p in G.compare_maps(ref.maps(ra), vm.maps(va), ordered)]
        probs += [f"compiled: {p}" for p in G.compare_maps(ref.maps(ra), cm.maps(ca), ordered)]
        rc = G.coverage_dict(ref.coverage(ra))
        for name, rt, a in (("vm", vm, va), ("compiled", cm, ca)):
            got = G.coverage_dict(rt.coverage(a))
            if got != rc:
                probs.append(f"{name}: coverage of attachment {ra}: reference {rc} got {got}")
    return probs


def test_random_programs_serial_three_way():
    rnd = random.Random(424242)
    objs = [G.random_object(rnd, parallel_safe=i % 3 == 0, n_progs=rnd.randint(1, 3)) for i in range(16)]
    for gi, group in enumerate(_groups(objs)):
        ctxs = G.random_contexts(rnd, 128, 3, epochs=3)
        r = _three_way(group, ctxs, 3, serial=True)
        probs = _problems(*r, ordered=True)
        assert not probs, f"group {gi}:\n" + "\n".join(probs[:20])


def test_random_parallel_safe_programs_many_warps_three_way():
    rnd = random.Random(515151)
    objs = [G.random_object(rnd, parallel_safe=True, n_progs=rnd.randint(1, 3)) for _ in range(8)]
    for gi, group in enumerate(_groups(objs)):
        ctxs = G.random_contexts(rnd, 2000, 5, epochs=2)
        r = _three_way(group, ctxs, 5, serial=False)
        probs = _problems(*r, ordered=False)
        assert not probs, f"group {gi}:\n" + "\n".join(probs[:20])


def test_sampling_and_rate_limit_serial_three_way():
    rnd = random.Random(616161)
    objs = [G.random_object(rnd, parallel_safe=False, n_progs=2) for _ in range(2)]
    ctxs = G.random_contexts(rnd, 150, 2, epochs=3)
    r = _three_way(objs, ctxs, 2, serial=True, sample_every=3, max_per_epoch=9)
    assert not _problems(*r, ordered=True)


def test_hot_to_compiled_swap_at_a_launch_boundary():
    """A hot, B hot.  Launch 1: both interpreted.  Promote A (build + swap at the
    boundary).  Launch 2: A compiled, B interpreted (one kernel, mixed tiers).  Maps as
    the reference's after both launches; A's rows: gen g for launch 1, g+1 for launch 2,
    and every event counted once."""
    from dtrace_mk.runtime.compiled import CompiledRuntime
    from dtrace_mk.runtime.reference import ReferenceRuntime
    rnd = random.Random(717171)
    a, b = G.random_object(rnd, parallel_safe=False), G.random_object(rnd, parallel_safe=False)
    b1, b2 = G.random_contexts(rnd, 200, 2, epochs=2), G.random_contexts(rnd, 200, 2, epochs=2)
    ref, cm = ReferenceRuntime(num_workers=2), CompiledRuntime(2)
    ids = []
    for obj in (a, b):
        init = _init(obj)
        ra = ref.attach(obj)
        for name, items in init.items():
            for k, v in items.items():
                ref.maps(ra)[name].update(k, v)
        ids.append((ra, cm.attach(obj, init_hash=init)))
    (ra, ca), (rb, cb) = ids
    hid = a.programs[0].hook.id
    g = cm.program_gen(hid)
    rres1 = [ref.fire(c) for c in b1]
    batch1 = cm.fire(b1, serial=True)
    t0 = time.perf_counter()
    assert cm.promote(ca)
    build = time.perf_counter() - t0
    assert cm.tier(ca) == "compiled" and cm.tier(cb) == "hot" and cm.program_gen(hid) == g + 1
    rres2 = [ref.fire(c) for c in b2]
    batch2 = cm.fire(b2, serial=True)
    probs = G.compare_fires(rres1, batch1) + G.compare_fires(rres2, batch2)
    for r_id, c_id in ids:
        probs += G.compare_maps(ref.maps(r_id), cm.maps(c_id), ordered=True)
        # the reference has no tiers: one gen; the device splits the same counts over g, g+1
        tot = lambda rows: {(c.program, c.epoch): (c.eligible, c.executed, c.throttled, c.lost) for c in rows}
        merged = {}
        for c in cm.coverage(c_id):
            k = (c.program, c.epoch)
            merged[k] = tuple(x + y for x, y in zip(merged.get(k, (0, 0, 0, 0)),
                                                    (c.eligible, c.executed, c.throttled, c.lost)))
        if merged != tot(ref.coverage(r_id)):
            probs.append(f"coverage {c_id}: reference {tot(ref.coverage(r_id))} device {merged}")
    assert not probs, "\n".join(probs[:20])
    rows = cm.coverage(ca)
    assert {c.program_gen for c in rows} == {g, g + 1}
    assert sum(c.eligible for c in rows if c.program_gen == g) == 200
    assert sum(c.eligible for c in rows if c.program_gen == g + 1) == 200
    print(f"\npromotion build (translate + monitor LTO-IR + link + load): {build * 1e3:.0f} ms; "
          f"{cm.last_build}")


def test_tier_manager_promotes_a_hot_monitor():
    from dtrace_mk.runtime.compiled import CompiledRuntime
    from dtrace_mk.runtime.tiers import COMPILED, TierManager, TierPolicy
    rnd = random.Random(818181)
    obj = G.random_object(rnd, parallel_safe=True)
    cm = CompiledRuntime(2)
    aid = cm.attach(obj, init_hash=_init(obj))
    tm = TierManager(cm, TierPolicy(min_epochs=2, min_events=10 ** 9))
    sent = 0
    for step in range(4):
        ctxs = G.random_contexts(rnd, 300, 2, epochs=1)
        ctxs = [c[:56] + step.to_bytes(4, "little") + c[60:] for c in ctxs]     # decode_step = step
        cm.fire(ctxs)
        sent += len(ctxs)
        tm.boundary()
    assert tm.state[aid] == COMPILED and cm.tier(aid) == "compiled"
    rows = cm.coverage(aid)
    assert sum(c.eligible for c in rows) == sent
    assert len({c.program_gen for c in rows}) == 2
