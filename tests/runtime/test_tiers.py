"""Tiering policy and the hot -> compiled handover (dtrace_mk.runtime.tiers).

A fake runtime models what the handover rests on: a launch snapshots the tiers of the
attachments when it starts and counts each of its events once, in the rows of the
program_gen it saw; the TierManager only changes tiers between launches.  The real
runtimes' side of the protocol (tables, cm_ids, program_gen, staleness) is checked on
HostCompiledRuntime.
"""
from __future__ import annotations

import random
import shutil
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from threading import Event

import pytest

from dtrace_mk.bpf.coverage import Coverage
from dtrace_mk.runtime import compiled as C
from dtrace_mk.runtime import device as D
from dtrace_mk.runtime.tiers import BUILDING, COMPILED, FAILED, HOT, TierManager, TierPolicy

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "gpu"))
import device_progs as G                      # noqa: E402


class FakeRuntime:
    """Attachments of one program on one hook; launches of n events in one epoch."""

    def __init__(self, fail_builds=0, gate=None):
        self.gen = 1
        self._tier, self.rows, self.compiled_set = {}, {}, set()
        self.launch_tiers = []           # per launch: the tiers it ran with
        self.builds = 0
        self.fail_builds = fail_builds
        self.gate = gate                 # a build waits on it (background builds)

    def add(self, aid):
        self._tier[aid] = "hot"
        self.gen += 1
        return aid

    def attachments(self):
        return sorted(self._tier)

    def tier(self, aid):
        return self._tier[aid]

    def coverage(self, aid):
        return [Coverage("p", "task:end", e, g, n, n, 0, 0) for (a, e, g), n in self.rows.items() if a == aid]

    def launch(self, n, epoch):
        snap = dict(self._tier)          # what every block of this launch sees
        self.launch_tiers.append(snap)
        for aid in snap:
            k = (aid, epoch, self.gen)
            self.rows[k] = self.rows.get(k, 0) + n

    def prepare_promotion(self, aid):
        key = frozenset(self.compiled_set | {aid})

        def work():
            if self.gate is not None:
                self.gate.wait(5)
            self.builds += 1
            if self.fail_builds:
                self.fail_builds -= 1
                raise RuntimeError("nvJitLink said no")
            return f"cubin{sorted(key)}"
        return key, work

    def commit_promotion(self, aid, key, artifact):
        if aid not in self._tier or key != frozenset(self.compiled_set | {aid}):
            return False
        self.compiled_set.add(aid)
        self._tier[aid] = "compiled"
        self.gen += 1
        return True


def _events_counted(rt, aid):
    return sum(n for (a, _, _), n in rt.rows.items() if a == aid)


def test_policy_epochs_or_events():
    p = TierPolicy(min_epochs=2, min_events=100)
    rows = [Coverage("a", "h", 0, 1, 5, 5), Coverage("b", "h", 0, 1, 5, 5), Coverage("a", "h", 1, 1, 3, 3)]
    assert not p.hot_enough(rows)                       # b ran in one epoch only
    assert p.hot_enough(rows + [Coverage("b", "h", 1, 1, 1, 1)])
    assert p.hot_enough([Coverage("a", "h", 0, 1, 100, 100)])
    assert not p.hot_enough([Coverage("a", "h", e, 1, 4, 0, 4) for e in range(5)])   # throttled only
    assert not p.hot_enough([])
    with pytest.raises(ValueError):
        TierPolicy(min_epochs=0)


def test_swap_at_a_boundary_loses_and_doubles_nothing():
    rt = FakeRuntime()
    a = rt.add(1)
    gen0 = rt.gen
    tm = TierManager(rt, TierPolicy(min_epochs=2, min_events=10 ** 9))
    sent = 0
    for step in range(6):
        rt.launch(32, epoch=step)
        sent += 32
        swapped = tm.boundary()
        if step < 1:
            assert tm.state[a] == HOT and not swapped
        if step == 1:                # second epoch seen: built inline, swapped at this boundary
            assert swapped == [a] and tm.state[a] == COMPILED and tm.swaps == [(a, 2)]
    assert _events_counted(rt, a) == sent
    gens = {g for (_, _, g) in rt.rows}
    assert gens == {gen0, gen0 + 1}                      # hot rows, then compiled rows
    hot = sum(n for (_, _, g), n in rt.rows.items() if g == gen0)
    assert hot == 64                                     # launches 0 and 1 ran the VM
    assert [t[a] for t in rt.launch_tiers] == ["hot", "hot"] + ["compiled"] * 4
    assert rt.builds == 1


def test_background_build_swaps_at_the_first_boundary_after_it_finished():
    gate = Event()
    rt = FakeRuntime(gate=gate)
    a = rt.add(1)
    with ThreadPoolExecutor(1) as ex:
        tm = TierManager(rt, TierPolicy(min_epochs=1, min_events=1), executor=ex)
        rt.launch(8, 0)
        assert tm.boundary() == [] and tm.state[a] == BUILDING
        for step in range(1, 4):                        # the build is held: the VM keeps counting
            rt.launch(8, step)
            assert tm.boundary() == []
        gate.set()
        tm._jobs[a].future.result(5)
        rt.launch(8, 4)
        assert tm.boundary() == [a]
        rt.launch(8, 5)
    assert [t[a] for t in rt.launch_tiers] == ["hot"] * 5 + ["compiled"]
    assert _events_counted(rt, a) == 48


def test_a_stale_build_is_rebuilt_not_installed():
    gate = Event()
    rt = FakeRuntime(gate=gate)
    a = rt.add(1)
    with ThreadPoolExecutor(1) as ex:
        tm = TierManager(rt, TierPolicy(min_epochs=1, min_events=1), executor=ex)
        rt.launch(4, 0)
        tm.boundary()
        rt.compiled_set.add(99)                          # the compiled set changed meanwhile
        gate.set()
        tm._jobs[a].future.result(5)
        assert tm.boundary() == [] and tm.state[a] == HOT and rt.tier(a) == "hot"
        rt.launch(4, 1)
        tm.boundary()                                    # prepared again, for the new set
        tm._jobs[a].future.result(5)
        rt.launch(4, 2)
        assert tm.boundary() == [a]
    assert rt.builds == 2 and 99 in rt.compiled_set and rt.tier(a) == "compiled"
    assert _events_counted(rt, a) == 12


def test_failed_builds_leave_the_program_hot():
    rt = FakeRuntime(fail_builds=5)
    a = rt.add(1)
    tm = TierManager(rt, TierPolicy(min_epochs=1, min_events=1, max_failures=2))
    for step in range(5):
        rt.launch(4, step)
        tm.boundary()
    assert tm.state[a] == FAILED and rt.tier(a) == "hot"
    assert len(tm.errors[a]) == 2 and "nvJitLink said no" in tm.errors[a][0]
    assert _events_counted(rt, a) == 20


def test_detach_while_building_drops_the_job():
    gate = Event()
    rt = FakeRuntime(gate=gate)
    a = rt.add(1)
    with ThreadPoolExecutor(1) as ex:
        tm = TierManager(rt, TierPolicy(min_epochs=1, min_events=1), executor=ex)
        rt.launch(4, 0)
        tm.boundary()
        del rt._tier[a]
        gate.set()
        tm._jobs[a].future.result(5)
        assert tm.boundary() == [] and a not in tm.state


# ------------------------------------------------------------------ the real protocol

needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="the host build needs g++")

def _obj(seed):
    return G.random_object(random.Random(seed), parallel_safe=True)


@needs_gxx
def test_host_runtime_promotion_publishes_a_new_generation():
    rt = C.HostCompiledRuntime(2)
    a = rt.attach(_obj(1), init_hash=G.prefill(_obj(1)))          # compiled at attach
    b = rt.attach(_obj(2), tier="hot", init_hash=G.prefill(_obj(2)))
    hid = _obj(2).programs[0].hook.id
    assert rt.tier(b) == "hot" and rt.program_gen(hid) == 2
    slot = rt.host_tables[hid]["progs"][1]
    assert int(slot["flags"]) == 0
    with pytest.raises(Exception, match="not compiled"):
        rt.fire(G.random_contexts(random.Random(3), 4, 2))
    key, work = rt.prepare_promotion(b)
    assert rt.host_tables[hid]["progs"][1]["flags"] == 0        # nothing changes before commit
    assert rt.commit_promotion(b, key, work())
    assert rt.tier(b) == "compiled" and rt.program_gen(hid) == 3
    f0, f1 = (int(rt.host_tables[hid]["progs"][k]["flags"]) for k in (0, 1))
    assert f0 & 1 and f1 & 1 and f0 >> 16 != f1 >> 16
    ctxs = G.random_contexts(random.Random(4), 50, 2)
    rt.fire(ctxs)
    rows = rt.coverage(b)
    assert {c.program_gen for c in rows} == {3} and sum(c.eligible for c in rows) == 50
    assert sum(c.eligible for c in rt.coverage(a)) == 50


@needs_gxx
def test_host_runtime_refuses_a_stale_promotion():
    rt = C.HostCompiledRuntime(1)
    b = rt.attach(_obj(5), tier="hot", init_hash=G.prefill(_obj(5)))
    c = rt.attach(_obj(6), tier="hot", init_hash=G.prefill(_obj(6)))
    kb, wb = rt.prepare_promotion(b)
    kc, wc = rt.prepare_promotion(c)
    assert rt.commit_promotion(c, kc, wc())
    assert not rt.commit_promotion(b, kb, object())               # built before c was compiled in
    assert rt.tier(b) == "hot"
    kb, wb = rt.prepare_promotion(b)
    assert rt.commit_promotion(b, kb, wb())
    assert not rt.commit_promotion(b, kb, None)                   # already compiled
