"""Hash maps under delete / re-insert churn on the device (default build): every event of a
churn program inserts its own key, reads it, deletes it, re-inserts it, deletes it again
and checks it is gone (counted in `err` when not), plus a per-class count by lookup /
insert-NOEXIST / lookup / xadd.  Serially over several batches with a host clear_hash
between two, in parallel over many warps (the program commutes: exact), and attached to
the megakernel's observer, each against the reference VM.  (Kept from the removed
-DDTMK_MAP_CACHE tests, which ran it only on the cache build.)"""
from __future__ import annotations

import random
import struct
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bpf" / "vm_cases"))

import device_progs as G                                     # noqa: E402
import test_device_vm as TV                                  # noqa: E402


fresh, run_both = TV.fresh, TV.run_both      # device runtime and reference side by side (test_device_vm.py)


CHURN = """
mov r6, r1
ldxdw r2, [r6+8]
stxdw [r10-16], r2
ldxw r2, [r6+32]
stxw [r10-8], r2
ldxw r2, [r6+24]
stxw [r10-4], r2
stdw [r10-24], 1
lddw r1, map:tmp
mov r2, r10
add r2, -16
mov r3, r10
add r3, -24
mov r4, 1
call map_update_elem
jne r0, 0, E1
lddw r1, map:tmp
mov r2, r10
add r2, -16
call map_lookup_elem
jeq r0, 0, E1
ldxdw r8, [r0+0]
jne r8, 1, E1
lddw r1, map:tmp
mov r2, r10
add r2, -16
call map_delete_elem
jne r0, 0, E1
lddw r1, map:tmp
mov r2, r10
add r2, -16
call map_lookup_elem
jne r0, 0, E1
stdw [r10-24], 2
lddw r1, map:tmp
mov r2, r10
add r2, -16
mov r3, r10
add r3, -24
mov r4, 1
call map_update_elem
jne r0, 0, E1
lddw r1, map:tmp
mov r2, r10
add r2, -16
call map_lookup_elem
jeq r0, 0, E1
ldxdw r8, [r0+0]
jne r8, 2, E1
lddw r1, map:tmp
mov r2, r10
add r2, -16
call map_delete_elem
jne r0, 0, E1
lddw r1, map:tmp
mov r2, r10
add r2, -16
call map_lookup_elem
jne r0, 0, E1
ja C
E1:
stw [r10-28], 0
lddw r1, map:err
mov r2, r10
add r2, -28
call map_lookup_elem
jeq r0, 0, C
mov r1, 1
xadddw [r0+0], r1
C:
ldxw r2, [r6+28]
and r2, 15
stxw [r10-32], r2
lddw r1, map:n
mov r2, r10
add r2, -32
call map_lookup_elem
jne r0, 0, X
stdw [r10-40], 0
lddw r1, map:n
mov r2, r10
add r2, -32
mov r3, r10
add r3, -40
mov r4, 1
call map_update_elem
lddw r1, map:n
mov r2, r10
add r2, -32
call map_lookup_elem
jeq r0, 0, Z
X:
mov r1, 1
xadddw [r0+0], r1
Z:
mov r0, 0
exit
"""


def churn_object(tmp_entries: int = 16384):   # >= the events in flight at once
    from dtrace_mk.abi import definition as abi
    from dtrace_mk.bpf.asm import assemble
    from dtrace_mk.bpf.program import BpfObject, MapDef, Program
    maps = [MapDef("tmp", "hash", 16, 8, tmp_entries), MapDef("n", "hash", 4, 8, 64),
            MapDef("err", "array", 4, 8, 1)]
    hook = abi.hook("task:end")
    prog = Program("churn", hook.section, hook, assemble(CHURN, [m.name for m in maps]))
    return BpfObject([prog], maps, path="<churn>")


def _churn_checks(maps, n_events):
    assert not maps["tmp"].snapshot(), "churn keys left behind"
    errs = maps["err"].snapshot(skip_zero=True)
    assert not errs, f"churn errors: {errs}"
    assert sum(struct.unpack("<Q", v)[0] for v in maps["n"].snapshot().values()) == n_events


def test_churn_serial_over_batches_and_a_host_clear():
    from dtrace_mk.runtime.reference import ReferenceRuntime
    rnd = random.Random(21)
    obj = churn_object()
    ref, dev = ReferenceRuntime(num_workers=3), fresh(3)
    raid, daid = ref.attach(obj), dev.attach(obj)
    batches = [G.random_contexts(rnd, 150, 3, epochs=2) for _ in range(4)]
    for i, ctxs in enumerate(batches):
        ref_results = [ref.fire(c) for c in ctxs]
        batch = dev.fire(ctxs, serial=True)
        assert not G.compare_fires(ref_results, batch)
        if i == 1:                     # host-side clear of `n` between two launches
            dev.device_maps(daid).clear_hash(1)
            ref.maps(raid)["n"].clear()
    probs = G.compare_maps(ref.maps(raid), dev.maps(daid), ordered=True)
    assert not probs, "\n".join(probs[:20])
    assert G.coverage_dict(ref.coverage(raid)) == G.coverage_dict(dev.coverage(daid))
    _churn_checks({m.name: m for m in dev.maps(daid)}, 300)
    assert int(dev.device_maps(daid).stats(0)["count"]) == 0      # every delete counted


def test_churn_parallel_many_warps():
    rnd = random.Random(22)
    obj = churn_object()
    ctxs = G.random_contexts(rnd, 2000, 5, epochs=2)
    r = run_both(obj, ctxs, 5, serial=False, prefill=False)
    TV.check_equal(*r, ordered=False)
    _churn_checks({m.name: m for m in r[3].maps(r[4])}, 2000)


def test_megakernel_churn_exact():
    import test_hot_attach as HA
    live = HA.session(defines=())
    obj = churn_object()
    aid = live.attach(obj)
    try:
        live.start(3, hooks="all")
        res = live.wait()
        assert res.hooks_dropped == 0
        snap = live.snapshot(aid)
        assert not snap.partial
        ref_maps, ref_cov = HA.reference_maps(obj, res.hooks, live.mk.num_workers)
        for name in ("n", "tmp", "err"):
            assert snap.maps[name].snapshot() == ref_maps[name].snapshot(), name
        tot = lambda rows, k: sum(getattr(r, k) for r in rows)  # noqa: E731
        for k in ("eligible", "executed", "throttled", "lost"):
            assert tot(snap.coverage, k) == tot(ref_cov, k), k
        n_end = tot(snap.coverage, "eligible")
        assert n_end > 0 and tot(snap.coverage, "executed") == n_end
        _churn_checks(snap.maps, n_end)
    finally:
        live.detach(aid)
