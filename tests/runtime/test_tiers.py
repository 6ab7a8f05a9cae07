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
from contextlib import contextmanager
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from threading import Event

import pytest

from dtrace_mk.bpf.coverage import Coverage
from dtrace_mk.runtime import compiled as C
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
        return key, _build_work(self, "gate", "builds", "fail_builds", "nvJitLink said no", f"cubin{sorted(key)}")

    def commit_promotion(self, aid, key, artifact):
        if aid not in self._tier or key != frozenset(self.compiled_set | {aid}):
            return False
        self.compiled_set.add(aid)
        self._tier[aid] = "compiled"
        self.gen += 1
        return True


def _build_work(rt, gate: str, count: str, fails: str, error: str, artifact: str):
    """A background build of the fake runtime: waits for rt.<gate> (when set), counts
    itself in rt.<count>, fails while rt.<fails> > 0, else returns `artifact`."""
    def work():
        if getattr(rt, gate) is not None:
            getattr(rt, gate).wait(5)
        setattr(rt, count, getattr(rt, count) + 1)
        if getattr(rt, fails):
            setattr(rt, fails, getattr(rt, fails) - 1)
            raise RuntimeError(error)
        return artifact
    return work


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


def test_swap_pending_says_when_the_next_boundary_swaps_or_builds():
    """What a resident serving launch asks before each step (launch/device_live.py): a
    hot attachment that became hot enough, or a requested one, or a finished background
    build -> True; a build still running, or nothing to do -> False."""
    rt = FakeRuntime()
    a = rt.add(1)
    tm = TierManager(rt, TierPolicy(min_epochs=2, min_events=10 ** 9))
    rt.launch(8, 0)
    assert not tm.swap_pending()                      # one epoch: not hot yet
    rt.launch(8, 1)
    assert tm.swap_pending()                          # hot enough: built and swapped inline
    assert tm.boundary() == [a] and not tm.swap_pending()
    b = rt.add(2)
    assert not tm.swap_pending(lambda aid: [])        # the coverage reader is the caller's
    tm.request(b)
    assert tm.swap_pending(lambda aid: [])            # requested: whatever the policy says
    gate = Event()
    rt2 = FakeRuntime(gate=gate)
    c = rt2.add(1)
    with ThreadPoolExecutor(1) as ex:
        tm2 = TierManager(rt2, TierPolicy(min_epochs=1, min_events=1), executor=ex)
        rt2.launch(8, 0)
        assert tm2.swap_pending() and tm2.boundary() == [] and tm2.state[c] == BUILDING
        assert not tm2.swap_pending()                 # the build is held
        gate.set()
        tm2._jobs[c].future.result(5)
        assert tm2.swap_pending()                     # finished: the next boundary swaps it
        assert tm2.boundary() == [c] and not tm2.swap_pending()


def test_a_pinned_attachment_stays_hot_however_hot_it_is():
    """LiveSession.attach(tier="hot") on a promoting session pins the attachment (the
    agent's device summary windows): never built, never a reason to end a resident launch;
    the others still promote.  A pin ends with the attachment."""
    rt = FakeRuntime()
    a, b = rt.add(1), rt.add(2)
    tm = TierManager(rt, TierPolicy(min_epochs=1, min_events=1))
    tm.pin(a)
    rt.launch(8, 0)
    assert tm.boundary() == [b] and tm.state[a] == HOT and rt.builds == 1
    for step in range(1, 4):
        rt.launch(8, step)
        assert not tm.swap_pending() and tm.boundary() == []
    assert tm.state[a] == HOT and rt.tier(a) == "hot"
    del rt._tier[a]                          # detached: its pin goes with it
    tm.boundary()
    assert a not in tm._pinned


@contextmanager
def _build_held():
    """(gate, rt, a, tm): one program `a`, hot enough after one launch; the first boundary
    started its background build, which waits for `gate`."""
    gate = Event()
    rt = FakeRuntime(gate=gate)
    a = rt.add(1)
    with ThreadPoolExecutor(1) as ex:
        tm = TierManager(rt, TierPolicy(min_epochs=1, min_events=1), executor=ex)
        rt.launch(4, 0)
        tm.boundary()
        yield gate, rt, a, tm


def test_attachments_requested_together_all_swap_at_one_boundary():
    """tier "compiled" and two attachments at once (a buffered device query and its parked
    twin: runtime/device_query.py): each inline build is swapped in before the next is
    prepared, so the second includes the first -- none stale, both compiled at the first
    boundary, one build each, every event counted once."""
    rt = FakeRuntime()
    a, b = rt.add(1), rt.add(2)
    tm = TierManager(rt, TierPolicy())
    tm.request(a)
    tm.request(b)
    rt.launch(4, 0)
    assert tm.boundary() == [a, b]
    assert rt.tier(a) == rt.tier(b) == "compiled" and rt.builds == 2 and rt.compiled_set == {a, b}
    rt.launch(4, 1)
    assert tm.boundary() == [] and rt.builds == 2
    assert _events_counted(rt, a) == _events_counted(rt, b) == 8


def test_a_follower_is_promoted_with_its_leader_in_the_same_boundary():
    """tier "auto": a parked twin (TierManager.follow) counts nothing, so the policy would
    never promote it; it is built right after its leader, at the boundary its leader
    swaps in -- not while the leader is hot."""
    rt = FakeRuntime()
    a, b = rt.add(1), rt.add(2)
    tm = TierManager(rt, TierPolicy(min_epochs=2, min_events=10 ** 9))
    tm.follow(b, a)
    rt.rows[(a, 0, rt.gen)] = 4                  # a ran in epoch 0 only: not hot enough yet
    assert tm.boundary() == [] and rt.tier(b) == "hot"
    rt.rows[(a, 1, rt.gen)] = 4
    assert tm.boundary() == [a, b]
    assert rt.tier(a) == rt.tier(b) == "compiled" and rt.builds == 2


def test_a_stale_build_is_rebuilt_not_installed():
    with _build_held() as (gate, rt, a, tm):
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
    with _build_held() as (gate, rt, a, tm):
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


# ------------------------------------------------------------------ stage 1 -> stage 2

class TwoStageRuntime(FakeRuntime):
    """FakeRuntime whose promotions load a stage-1 module; prepare_optimize / commit_optimize
    swap the stage-2 (LTO) module of the same compiled set under a new program_gen."""

    def __init__(self, fail_opt=0, opt_gate=None, **kw):
        super().__init__(**kw)
        self.stage, self.module_set = 0, frozenset()
        self.launch_stages = []
        self.opt_builds, self.fail_opt, self.opt_gate = 0, fail_opt, opt_gate

    def launch(self, n, epoch):
        self.launch_stages.append(self.stage)
        super().launch(n, epoch)

    def commit_promotion(self, aid, key, artifact):
        if not super().commit_promotion(aid, key, artifact):
            return False
        self.stage, self.module_set = 1, frozenset(self.compiled_set)
        return True

    def prepare_optimize(self):
        key = frozenset(self.compiled_set)
        if not key or (self.stage == 2 and self.module_set == key):
            return None

        return key, _build_work(self, "opt_gate", "opt_builds", "fail_opt", "LTO link failed", f"lto{sorted(key)}")

    def commit_optimize(self, key, artifact):
        if key != frozenset(self.compiled_set):
            return False
        self.stage, self.module_set = 2, key
        self.gen += 1
        return True


def test_stage1_then_stage2_every_event_once_in_rows_g_g1_g2():
    rt = TwoStageRuntime()
    a = rt.add(1)
    g = rt.gen
    tm = TierManager(rt, TierPolicy(min_epochs=1, min_events=10 ** 9), optimize=True)
    for step in range(5):
        rt.launch(16, step)
        tm.boundary()
    assert tm.swaps == [(a, 1)] and tm.optimized == [2]      # stage 2 swaps at the NEXT boundary
    assert rt.launch_stages == [0, 1, 2, 2, 2]                # one launch ran the stage-1 module
    by_gen = {}
    for (_, _, gen), n in rt.rows.items():
        by_gen[gen] = by_gen.get(gen, 0) + n
    assert by_gen == {g: 16, g + 1: 16, g + 2: 48}
    assert _events_counted(rt, a) == 80 and rt.opt_builds == 1
    assert rt.prepare_optimize() is None                      # nothing left to improve


def test_background_stage2_waits_for_its_build_and_a_stale_one_is_rebuilt():
    gate, gate1 = Event(), Event()
    rt = TwoStageRuntime(opt_gate=gate, gate=gate1)
    a, b = rt.add(1), rt.add(2)
    with ThreadPoolExecutor(2) as ex:                         # a stage-1 build never queues behind stage 2
        tm = TierManager(rt, TierPolicy(min_epochs=100, min_events=10 ** 9), executor=ex)
        tm.request(a)                                         # tier "compiled": no policy needed
        assert tm.boundary() == []                            # stage 1 building (background)
        gate1.set()
        tm._jobs[a].future.result(5)
        rt.launch(4, 0)
        assert tm.boundary() == [a] and tm._opt is not None   # stage 2 of {a} started, held
        rt.launch(4, 1)
        assert tm.boundary() == [] and tm.optimized == []      # not finished: stage 1 keeps running
        tm.request(b)
        gate1.clear()
        rt.launch(4, 2)
        assert tm.boundary() == []                            # b's stage 1 starts (held)
        gate1.set()
        tm._jobs[b].future.result(5)
        rt.launch(4, 3)
        assert tm.boundary() == [b]                           # compiled set is now {a, b}
        gate.set()
        tm._opt.future.result(5)
        rt.launch(4, 4)
        tm.boundary()                                         # stage 2 of {a} is stale: dropped
        assert tm.optimized == [] and rt.stage == 1
        tm._opt.future.result(5)                              # stage 2 of {a, b}
        rt.launch(4, 5)
        tm.boundary()
        assert len(tm.optimized) == 1 and rt.stage == 2 and rt.module_set == {a, b}
        rt.launch(4, 6)
    assert rt.opt_builds == 2
    assert _events_counted(rt, a) == 28 and _events_counted(rt, b) == 28
    assert rt.launch_stages == [0, 1, 1, 1, 1, 1, 2]


def test_a_failed_stage2_leaves_stage1_running_and_is_not_retried():
    rt = TwoStageRuntime(fail_opt=1)
    a = rt.add(1)
    tm = TierManager(rt, TierPolicy(min_epochs=1, min_events=1), optimize=True)
    for step in range(4):
        rt.launch(8, step)
        tm.boundary()
    assert rt.stage == 1 and rt.tier(a) == "compiled" and rt.opt_builds == 1
    assert len(tm.opt_errors) == 1 and "LTO link failed" in tm.opt_errors[0]
    assert _events_counted(rt, a) == 32


def test_stage2_is_off_without_an_executor_by_default():
    rt = TwoStageRuntime()
    a = rt.add(1)
    tm = TierManager(rt, TierPolicy(min_epochs=1, min_events=1))
    for step in range(3):
        rt.launch(8, step)
        tm.boundary()
    assert rt.tier(a) == "compiled" and rt.stage == 1 and rt.opt_builds == 0


@needs_gxx
def test_host_runtime_stage1_to_stage2_handover_rows():
    rt = C.HostCompiledRuntime(2)
    b = rt.attach(_obj(7), tier="hot", init_hash=G.prefill(_obj(7)))
    hid = _obj(7).programs[0].hook.id
    g = rt.program_gen(hid)
    tm = TierManager(rt, TierPolicy(min_epochs=1, min_events=1), optimize=True)
    tm.request(b)
    assert tm.boundary() == [b] and rt.installed_stage == 1 and rt.program_gen(hid) == g + 1
    assert tm._opt is not None and tm._opt.done               # stage 2 built inline, not yet in
    rt.fire(G.random_contexts(random.Random(8), 40, 2))      # runs the stage-1 build
    tm.boundary()
    assert tm.optimized == [2] and rt.installed_stage == 2 and rt.program_gen(hid) == g + 2
    rt.fire(G.random_contexts(random.Random(9), 40, 2))
    rt.fire(G.random_contexts(random.Random(10), 40, 2))
    rows = rt.coverage(b)
    per = {}
    for c in rows:
        per[c.program_gen] = per.get(c.program_gen, 0) + c.eligible
    eligible = lambda seed: sum(1 for r in G.random_contexts(random.Random(seed), 40, 2)  # noqa: E731
                                if int.from_bytes(bytes(r)[4:8], "little") == hid)
    assert per == {g + 1: eligible(8), g + 2: eligible(9) + eligible(10)} and eligible(8) > 0
    assert tm.boundary() == [] and tm._opt is None            # stage 2 is current: nothing to do
