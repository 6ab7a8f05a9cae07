"""Device VM vs reference VM on the GPU: identical r0, maps, map stats and coverage.

* every engine-agnostic case in tests/bpf/vm_cases that the device runs (fault cases,
  trace_printk and priority hints are skipped with the reason);
* random verified programs over random contexts, serial mode (one event at a time, the
  reference's order: small maps fill, ring budgets bind, exact equality);
* random parallel-safe programs, 32 events per warp over many warps (exact equality;
  ring records compared per worker as a multiset);
* sampling, and hot attach/detach with program_gen rows.
"""
from __future__ import annotations

import os
import random
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bpf" / "vm_cases"))

import device_progs as G                                     # noqa: E402

N_RANDOM = int(os.environ.get("DTRACE_MK_DEVICE_VM_PROGRAMS", "60"))


def fresh(workers: int, **kw):
    """A new device runtime (the compiled module is shared per process)."""
    from dtrace_mk.runtime.device import DeviceRuntime
    return DeviceRuntime(num_workers=workers, **kw)


def run_both(obj, ctxs, workers, *, serial, sample_every=1, prefill=True, max_per_epoch=None):
    from dtrace_mk.runtime.reference import ReferenceRuntime
    ref = ReferenceRuntime(num_workers=workers)
    raid = ref.attach(obj, sample_every=sample_every, max_per_epoch=max_per_epoch)
    init = G.prefill(obj) if prefill else {}
    for name, items in init.items():
        for k, v in items.items():
            ref.maps(raid)[name].update(k, v)
    ref_results = [ref.fire(c) for c in ctxs]
    dev = fresh(workers)
    daid = dev.attach(obj, sample_every=sample_every, init_hash=init, max_per_epoch=max_per_epoch)
    batch = dev.fire(ctxs, serial=serial)
    return ref, raid, ref_results, dev, daid, batch


def check_equal(ref, raid, ref_results, dev, daid, batch, ordered, text=""):
    probs = G.compare_fires(ref_results, batch)
    probs += G.compare_maps(ref.maps(raid), dev.maps(daid), ordered)
    rc, dc = G.coverage_dict(ref.coverage(raid)), G.coverage_dict(dev.coverage(daid))
    if rc != dc:
        probs.append(f"coverage: reference {rc} device {dc}")
    assert not probs, "\n".join(probs[:20]) + "\n" + text


# ------------------------------------------------------------------ vm_cases

def _case_paths():
    from harness import all_cases
    return all_cases()


class DeviceEngine:
    name = "device"

    def run(self, case):
        from harness import Outcome
        from dtrace_mk.abi import definition as abi
        workers = case.opt_int("workers", 1)
        rt = fresh(workers, max_insns=case.opt_int("max_insns", abi.MAX_INSNS))
        limit = case.opt_int("max_per_epoch", -1)
        aid = rt.attach(case.object(), verify=False, sample_every=case.opt_int("sample_every", 1),
                        max_per_epoch=None if limit < 0 else limit)
        batch = rt.fire(case.events, serial=True)
        results = [r0 for i in range(len(case.events)) for (_, _, _, r0) in batch.results(i)]
        maps, stats = {}, {}
        for m in rt.maps(aid):
            stats[m.name] = (m.stats.lost, m.stats.throttled)
            maps[m.name] = [r.data for r in m.drain()] if m.kind == "ringbuf" else \
                m.snapshot(skip_zero=m.kind in ("array", "per_worker_array"))
        rows = rt.coverage(aid)
        cov = {k: sum(getattr(c, k) for c in rows) for k in ("eligible", "executed", "throttled", "lost")}
        rt.detach(aid)
        return Outcome(results, [], maps, stats, cov, True, [], [])


@pytest.mark.parametrize("path", _case_paths(), ids=lambda p: p.stem)
def test_vm_case_on_device(path):
    from harness import check, parse_case
    case = parse_case(path)
    why = G.device_skip(case)
    if why:
        pytest.skip(why)
    probs = check(case, DeviceEngine().run(case))
    assert not probs, "\n".join(probs)


# ------------------------------------------------------------------ random programs

@pytest.mark.parametrize("seed", range(N_RANDOM))
def test_random_programs_serial(seed):
    rnd = random.Random(1000 + seed)
    obj = G.random_object(rnd, parallel_safe=seed % 3 == 0, n_progs=rnd.randint(1, 3))
    ctxs = G.random_contexts(rnd, 96, 3, epochs=3)
    r = run_both(obj, ctxs, 3, serial=True)
    check_equal(*r, ordered=True, text=f"seed {seed}")


@pytest.mark.parametrize("seed", range(N_RANDOM // 2))
def test_random_parallel_safe_programs_parallel(seed):
    rnd = random.Random(5000 + seed)
    obj = G.random_object(rnd, parallel_safe=True, n_progs=rnd.randint(1, 3))
    ctxs = G.random_contexts(rnd, 1000, 5, epochs=2)
    r = run_both(obj, ctxs, 5, serial=False)
    check_equal(*r, ordered=False, text=f"seed {seed}")


def test_sampling_serial_matches_reference():
    rnd = random.Random(7)
    obj = G.random_object(rnd, parallel_safe=False, n_progs=2)
    ctxs = G.random_contexts(rnd, 100, 2)
    r = run_both(obj, ctxs, 2, serial=True, sample_every=3)
    check_equal(*r, ordered=True)


def test_rate_limit_serial_matches_reference():
    rnd = random.Random(9)
    obj = G.random_object(rnd, parallel_safe=False, n_progs=2)
    ctxs = G.random_contexts(rnd, 120, 2, epochs=3)
    r = run_both(obj, ctxs, 2, serial=True, sample_every=2, max_per_epoch=7)
    check_equal(*r, ordered=True)


def test_rate_limit_parallel_counts():
    rnd = random.Random(10)
    obj = G.random_object(rnd, parallel_safe=True)
    ctxs = G.random_contexts(rnd, 999, 2, epochs=3)
    ref, raid, _, dev, daid, _ = run_both(obj, ctxs, 2, serial=False, max_per_epoch=50)
    assert G.coverage_dict(ref.coverage(raid)) == G.coverage_dict(dev.coverage(daid))


def test_sampling_parallel_counts():
    """In parallel, which events are sampled differs from the reference, how many does not."""
    rnd = random.Random(8)
    obj = G.random_object(rnd, parallel_safe=True)
    ctxs = G.random_contexts(rnd, 999, 2, epochs=1)
    ref, raid, _, dev, daid, _ = run_both(obj, ctxs, 2, serial=False, sample_every=4)
    tot = lambda rows: [sum(getattr(c, k) for c in rows) for k in ("eligible", "executed", "throttled", "lost")]
    assert tot(ref.coverage(raid)) == tot(dev.coverage(daid))


def test_hot_attach_detach_generations():
    """attach A, fire, attach B, fire, detach A, fire: same rows (program_gen) and maps."""
    from dtrace_mk.runtime.reference import ReferenceRuntime
    rnd = random.Random(11)
    a = G.random_object(rnd, parallel_safe=True)
    b = G.random_object(rnd, parallel_safe=True)
    batches = [G.random_contexts(rnd, 200, 2, epochs=2) for _ in range(3)]
    ref, dev = ReferenceRuntime(num_workers=2), fresh(2)
    ra = ref.attach(a)
    da = dev.attach(a)
    for name, items in G.prefill(a).items():
        for k, v in items.items():
            ref.maps(ra)[name].update(k, v)
    dev.device_maps(da).upload_hash(0, G.prefill(a)["counts"])
    for c in batches[0]:
        ref.fire(c)
    dev.fire(batches[0])
    rb, db = ref.attach(b), dev.attach(b, init_hash=G.prefill(b))
    for k, v in G.prefill(b)["counts"].items():
        ref.maps(rb)["counts"].update(k, v)
    for c in batches[1]:
        ref.fire(c)
    dev.fire(batches[1])
    ref.detach(ra)
    dev.detach(da)
    for c in batches[2]:
        ref.fire(c)
    dev.fire(batches[2])
    assert ref.program_gen("task:end") == dev.program_gen("task:end") == 3
    for r_id, d_id in ((ra, da), (rb, db)):
        assert G.coverage_dict(ref.coverage(r_id)) == G.coverage_dict(dev.coverage(d_id))
        assert not G.compare_maps(ref.maps(r_id), dev.maps(d_id), ordered=False)
    gens = {c.program_gen for c in dev.coverage(da)}
    assert gens == {1, 2}, gens


def test_seqlock_odd_generation_runs_nothing():
    """A table caught mid-write (odd gen) is skipped for that batch and counted."""
    import numpy as np
    rnd = random.Random(12)
    obj = G.random_object(rnd, parallel_safe=True)
    dev = fresh(1)
    aid = dev.attach(obj, init_hash=G.prefill(obj))
    hid = obj.programs[0].hook.id
    base = hid * 576
    dev.tables[base:base + 4].set(np.frombuffer((7).to_bytes(4, "little"), np.uint8))
    dev.status.fill(0)
    batch = dev.fire(G.random_contexts(rnd, 64, 1))
    assert int(dev.status.get()[0]) >= 1
    assert not batch.outcome.any()
    dev._publish(hid)
    batch = dev.fire(G.random_contexts(rnd, 64, 1))
    assert (batch.outcome[:, 0] != 0).all()
