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


def _three_way(objs, ctxs, workers, *, serial, link_stage=2, **kw):
    """Reference, device VM and compiled tier over the same attachments and events
    (link_stage 1: the fast relocatable link; 2: full LTO)."""
    from dtrace_mk.runtime.compiled import CompiledRuntime
    from dtrace_mk.runtime.device import DeviceRuntime
    from dtrace_mk.runtime.reference import ReferenceRuntime
    ref, vm = ReferenceRuntime(num_workers=workers), DeviceRuntime(workers)
    cm = CompiledRuntime(workers, link_stage=link_stage)
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
    for gi, group in enumerate(G.groups(objs)):
        ctxs = G.random_contexts(rnd, 128, 3, epochs=3)
        r = _three_way(group, ctxs, 3, serial=True)
        probs = _problems(*r, ordered=True)
        assert not probs, f"group {gi}:\n" + "\n".join(probs[:20])


def test_random_parallel_safe_programs_many_warps_three_way():
    rnd = random.Random(515151)
    objs = [G.random_object(rnd, parallel_safe=True, n_progs=rnd.randint(1, 3)) for _ in range(8)]
    for gi, group in enumerate(G.groups(objs)):
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


def test_random_programs_serial_three_way_stage1_link():
    """The same differential with the stage-1 (relocatable, not inlined) link."""
    rnd = random.Random(434343)
    objs = [G.random_object(rnd, parallel_safe=i % 3 == 0, n_progs=rnd.randint(1, 3)) for i in range(8)]
    for gi, group in enumerate(G.groups(objs)):
        ctxs = G.random_contexts(rnd, 128, 3, epochs=3)
        r = _three_way(group, ctxs, 3, serial=True, link_stage=1)
        assert r[2].installed_stage == 1
        probs = _problems(*r, ordered=True)
        assert not probs, f"group {gi}:\n" + "\n".join(probs[:20])


# ------------------------------------------------------------------ in the megakernel

def _mk_reference(obj, hooks, workers):
    from dtrace_mk.runtime.reference import replay
    return replay(obj, hooks, workers)


def test_megakernel_hot_then_stage1_then_stage2_counts_every_event_once():
    """The compiled tier linked INTO the megakernel (-DDTMK_COMPILED_TIER), driven by
    LiveSession(tier="auto"): launch 1 runs the summary monitor in the device VM
    (program_gen g), the boundary before launch 2 promotes it with the stage-1 link (the
    kernel's cached relocatable cubin + the monitor's cubin; g+1), the boundary before
    launch 3 swaps in the full-LTO stage 2 (g+2).  Maps equal the reference runtime over
    the kernel's own hook records of all three launches; coverage rows of g, g+1, g+2 add
    up to the reference's; tokens and logits are bit-identical to a plain run."""
    import numpy as np
    from dtrace_mk.megakernel import gpu
    from dtrace_mk.megakernel.presets import PRESETS
    from dtrace_mk.runtime.live import LiveSession, summary_monitor
    from dtrace_mk.runtime.tiers import TierPolicy
    mk = gpu.Megakernel(PRESETS["tiny"], batch=2, seed=0)
    base = mk.run(6)                                          # no observer: the outputs to match
    mk.reset()
    live = LiveSession(mk, tier="auto", policy=TierPolicy(min_epochs=1, min_events=1), background=False)
    live.tiers.optimize = True                                # stage 2 inline (committed a boundary later)
    mon = summary_monitor(mk.graph.schema)
    aid = live.attach(mon.obj)
    hid = {p.hook.id for p in mon.obj.programs}
    results, stages, times = [], [], []
    try:
        for k in range(3):
            t0 = time.perf_counter()
            live.start(2, hooks="all")                        # boundary: promote / swap, then launch
            times.append(time.perf_counter() - t0)
            stages.append((live.rt.installed_stage, live.rt.last_build))
            results.append(live.wait())
        builds = [b for _, b in stages]
        stages = [s for s, _ in stages]
        assert stages == [0, 1, 2], stages
        assert live.tiers.swaps == [(aid, 2)] and live.tiers.optimized == [3]
        assert all(r.hooks_dropped == 0 for r in results)
        snap = live.snapshot(aid)
        assert not snap.partial and snap.final_epoch == 5
        hooks = np.concatenate([r.hooks for r in results])
        ref_maps, ref_cov = _mk_reference(mon.obj, hooks, mk.num_workers)
        for name in ("lat", "dep_wait", "queue"):
            assert snap.maps[name].snapshot() == ref_maps[name].snapshot(), name
        tot = lambda rows, key: sum(getattr(r, key) for r in rows)  # noqa: E731
        for key in ("eligible", "executed", "throttled", "lost"):
            assert tot(snap.coverage, key) == tot(ref_cov, key), key
        gens = sorted({r.program_gen for r in snap.coverage})
        assert len(gens) == 3 and gens[2] == gens[0] + 2, gens
        for g in gens:                                        # every launch counted under its own gen
            assert tot([r for r in snap.coverage if r.program_gen == g], "executed") > 0, g
        assert int(snap.state["lost"].sum()) == 0
        tokens = np.concatenate([r.tokens for r in results])
        assert np.array_equal(tokens, base.tokens)
        assert np.array_equal(results[-1].logits.view(np.uint32), base.logits.view(np.uint32))
        assert builds[1].stage == 1 and builds[2].stage == 2
        print(f"\nmegakernel stage-1 build: {builds[1]}\nmegakernel stage-2 build: {builds[2]}\n"
              f"start() times (s): {[round(x, 3) for x in times]} (the 2nd includes the inline stage-2 "
              f"build; with background=True it runs on a thread); hooks {sorted(hid)}")
    finally:
        live.close()


def test_megakernel_compiled_from_the_first_launch_stage1():
    """tier="compiled": the attach is promoted at the first start() with the stage-1 link
    (no stage 2 without a background executor); maps equal the reference over the
    kernel's hook records, every row under one program_gen, outputs bit-identical."""
    import numpy as np
    from dtrace_mk.megakernel import gpu
    from dtrace_mk.megakernel.presets import PRESETS
    from dtrace_mk.runtime.live import LiveSession, summary_monitor
    mk = gpu.Megakernel(PRESETS["tiny"], batch=2, seed=0)
    base = mk.run(3)
    mk.reset()
    live = LiveSession(mk, tier="compiled", background=False)
    mon = summary_monitor(mk.graph.schema)
    aid = live.attach(mon.obj)
    try:
        t0 = time.perf_counter()
        live.start(3, hooks="all")
        boundary_s = time.perf_counter() - t0
        res = live.wait()
        assert live.rt.tier(aid) == "compiled" and live.rt.installed_stage == 1
        assert live.tier_status()[aid] == "compiled/s1"
        assert res.hooks_dropped == 0
        snap = live.snapshot(aid)
        ref_maps, ref_cov = _mk_reference(mon.obj, res.hooks, mk.num_workers)
        for name in ("lat", "dep_wait", "queue"):
            assert snap.maps[name].snapshot() == ref_maps[name].snapshot(), name
        assert sum(r.executed for r in snap.coverage) == sum(r.executed for r in ref_cov) > 0
        assert len({r.program_gen for r in snap.coverage}) == 1
        assert np.array_equal(res.tokens, base.tokens)
        assert np.array_equal(res.logits.view(np.uint32), base.logits.view(np.uint32))
        print(f"\nstart() with a stage-1 promotion: {boundary_s * 1e3:.0f} ms ({live.rt.last_build})")
    finally:
        live.close()


@pytest.mark.parametrize("inline", [True, False], ids=["inline", "ring"])
@pytest.mark.parametrize("preset", ["tiny", "small-moe"])
def test_megakernel_inline_form_equals_the_reference(inline, preset):
    """The compiled tier's two forms in the megakernel (session 8): `inline` runs the
    summary's three programs at the hook sites (kernels/bpf_inline.cuh: no ring slot, no
    drain, map updates combined per worker in shared memory and moved at epoch ends),
    `ring` through the observer ring and warp drains.  Both: coverage accounts for every
    one of the kernel's own hook records (eligible equal to the reference's), outputs
    bit-identical.  The inline form has no ring to overflow: maps (hist counts, wait sums,
    per-worker queue maxima) equal the reference runtime's over those records, nothing
    lost, and no record goes through the observer (OBS drained == 0).  The ring form takes
    every record through it; a burst that overflows its sub-ring (small-moe's routers push
    up to 16 task:ready records at once) is counted lost, so its maps equal the
    reference's only when nothing was."""
    import numpy as np
    from dtrace_mk.megakernel import gpu
    from dtrace_mk.megakernel.presets import PRESETS
    from dtrace_mk.runtime.compiled import PROG_F_INLINE
    from dtrace_mk.runtime.live import LiveSession, linked_runtime, summary_monitor
    mk = gpu.Megakernel(PRESETS[preset], batch=2, seed=0)
    base = mk.run(4)
    mk.reset()
    rt = linked_runtime(mk.num_workers, mk=mk, inline=inline)
    live = LiveSession(mk, runtime=rt, tier="compiled", background=False)
    mon = summary_monitor(mk.graph.schema)
    aid = live.attach(mon.obj)
    try:
        live.start(4, hooks="all")
        res = live.wait()
        flags = [int(rt.host_tables[p.hook.id]["progs"][0]["flags"]) for p in mon.obj.programs]
        assert all(bool(f & PROG_F_INLINE) == inline for f in flags), flags
        assert res.hooks_dropped == 0
        snap = live.snapshot(aid)
        assert not snap.partial
        ref_maps, ref_cov = _mk_reference(mon.obj, res.hooks, mk.num_workers)
        tot = lambda rows, key: sum(getattr(r, key) for r in rows)  # noqa: E731
        st = live.state.get()
        drained = int(st[:, gpu.OBS_NAMES.index("drained")].sum())
        lost = int(st[:, gpu.OBS_NAMES.index("lost")].sum())      # records the full ring refused
        assert tot(snap.coverage, "eligible") == tot(ref_cov, "eligible") > 0
        assert tot(snap.coverage, "lost") == lost
        assert tot(snap.coverage, "executed") + lost == tot(ref_cov, "executed")
        if inline:
            assert lost == 0 and drained == 0, (lost, drained)
        else:
            assert drained + lost == tot(ref_cov, "eligible"), (drained, lost)
        print(f"\n{preset} {'inline' if inline else 'ring'}: {tot(ref_cov, 'eligible')} events, {lost} lost "
              f"(ring full), {drained} drained")
        if lost == 0:
            for name in ("lat", "dep_wait", "queue"):
                assert snap.maps[name].snapshot() == ref_maps[name].snapshot(), name
                assert snap.maps[name].stats == ref_maps[name].stats, name
        if inline or preset == "tiny":
            assert lost == 0
        assert np.array_equal(res.tokens, base.tokens)
        assert np.array_equal(res.logits.view(np.uint32), base.logits.view(np.uint32))
    finally:
        live.close()


@pytest.mark.parametrize("preset", ["tiny", "1b"])
def test_observer_sm_compiled_tier_equals_the_reference(preset):
    """The compiled tier on the observer SM (-DDTMK_OBS_SM: no site form; its warps run
    the LTO-linked programs over the records, dtmk_cm_run_records, 1b on several warps):
    the summary linked at stage 2 counts what the reference runtime counts over the
    kernel's own hook records (which the observer wrote), nothing inline, nothing lost,
    every record through the observer, outputs bit-identical to the same build's plain run."""
    import numpy as np
    from dtrace_mk.megakernel import gpu
    from dtrace_mk.megakernel.presets import PRESETS
    from dtrace_mk.runtime.compiled import PROG_F_COMPILED, PROG_F_INLINE
    from dtrace_mk.runtime.live import LiveSession, linked_runtime, summary_monitor
    mk = gpu.Megakernel(PRESETS[preset], batch=2, seed=0, defines=("DTMK_OBS_SM",))
    base = mk.run(3)
    mk.reset()
    rt = linked_runtime(mk.num_workers, mk=mk)
    live = LiveSession(mk, runtime=rt)
    mon = summary_monitor(mk.graph.schema)
    aid = live.attach(mon.obj, tier="compiled")
    try:
        live.link_compiled(stage=2)
        live.start(3, hooks="all")
        res = live.wait()
        flags = [int(rt.host_tables[p.hook.id]["progs"][0]["flags"]) for p in mon.obj.programs]
        assert all(f & PROG_F_COMPILED and not f & PROG_F_INLINE for f in flags), flags
        assert res.hooks_dropped == 0
        snap = live.snapshot(aid)
        assert not snap.partial and snap.final_epoch == 2
        ref_maps, ref_cov = _mk_reference(mon.obj, res.hooks, mk.num_workers)
        for name in ("lat", "dep_wait", "queue"):
            assert snap.maps[name].snapshot() == ref_maps[name].snapshot(), name
        tot = lambda rows, key: sum(getattr(r, key) for r in rows)  # noqa: E731
        for key in ("eligible", "executed", "throttled", "lost"):
            assert tot(snap.coverage, key) == tot(ref_cov, key), key
        st = live.state.get()
        assert int(st[:, gpu.OBS_NAMES.index("lost")].sum()) == 0
        assert int(st[:, gpu.OBS_NAMES.index("drained")].sum()) == tot(ref_cov, "eligible") > 0
        assert np.array_equal(res.tokens, base.tokens)
        assert np.array_equal(res.logits.view(np.uint32), base.logits.view(np.uint32))
    finally:
        live.detach(aid)
