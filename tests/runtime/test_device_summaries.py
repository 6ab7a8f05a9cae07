"""Device summaries (runtime/agent.py `summarize_on`, runtime/summary_windows.py): the
summary's task half runs where the kernel runs it, in windows of steps, and the host
keeps the comm half over the comm:* records only.  What the agent ships must equal what
the host-only agent ships from every record: every EpochSummary (class stats,
notification lag, queue depth, experts, remote-wait totals, coverage), every RemoteWait
and Signal -- whatever the windows' size and however far the "kernel" runs ahead of the
host (a window attached after its first step started leaves its predecessor a longer
range).

The "device" here is `summary_windows.ReferenceDevice`: the runtime protocol over a
reference runtime that the test fires with each step's records when the step runs (as
the device VM runs over the kernel's own records), never fed by the agent.  On the GPU
the same comparison runs against the megakernel's device VM
(tests/gpu/test_device_summaries_gpu.py)."""
import random
import struct
from collections import Counter

import pytest

from dtrace_mk.abi import context
from dtrace_mk.abi import definition as D
from dtrace_mk.collectors.records import EpochSummary, RemoteWait, Signal
from dtrace_mk.errors import UserError
from dtrace_mk.launch.api import ALL_HOOKS
from dtrace_mk.megakernel.faults import FaultTable
from dtrace_mk.megakernel.graph import build_graph
from dtrace_mk.megakernel.mpi_transport import run_loopback
from dtrace_mk.megakernel.presets import get_preset
from dtrace_mk.megakernel.sim import pack_ctx
from dtrace_mk.runtime.agent import ListChannel, RankAgent
from dtrace_mk.runtime.summary_windows import ReferenceDevice, SummaryWindows

WORKERS = 12
BATCH = 4
STEPS = 15
FIRST = 2                        # like the GPU's warm-up: steps 0-1 run, never observed


def _hid(rec):
    return struct.unpack_from("<I", rec, context.OFF_HOOK)[0]


#: the device runtime protocol over a reference runtime the test fires as the kernel would
DeviceModel = ReferenceDevice


def _gpu_style_wait(rec):
    """A comm:wait as the GPU reports it: the consumer's whole dependency wait (the sim
    reports only the part the remote data was missing; architecture.md "GPU comm:wait"),
    here 30 us more, so the agent's clipping at the last local producer end matters."""
    if _hid(rec) != context.hook_id("comm:wait"):
        return rec
    off = D.FIELDS_BY_NAME["wait_ns"].offset
    b = bytearray(rec)
    struct.pack_into("<Q", b, off, struct.unpack_from("<Q", b, off)[0] + 30_000)
    return bytes(b)


def _tp_records(steps=STEPS, late_steps=(5, 6, 11)):
    """Per rank, step -> packed records of a 2-rank tensor-parallel tiny run, rank 1's
    attention all-reduce late at some steps (long remote waits on rank 0); comm:wait
    records GPU-style (_gpu_style_wait)."""
    cfg = get_preset("tiny")
    graphs = [build_graph(cfg, BATCH, WORKERS, rank=r, ranks=2) for r in range(2)]
    late = FaultTable.from_specs([{"kind": "late_comm", "comm_op": "allreduce_attn", "layer": 0,
                                   "delay_us": 80, "steps": list(late_steps)}], "test")
    per = [dict() for _ in range(2)]
    sinks = [(lambda r: lambda c: per[r].setdefault(c["decode_step"], []).append(_gpu_style_wait(pack_ctx(c))))(r)
             for r in range(2)]
    run_loopback(cfg, BATCH, WORKERS, 2, steps, faults={1: late}, sinks=sinks, graphs=graphs,
                 hooks=ALL_HOOKS, clock_skew=False)
    return graphs, per


def _by_kind(ch):
    recs = ch.records()
    sums = {r.epoch: r for r in recs if isinstance(r, EpochSummary)}
    waits = Counter(r for r in recs if isinstance(r, RemoteWait))
    sigs = Counter(r for r in recs if isinstance(r, Signal))
    return sums, waits, sigs


def _host_agent(graph, rank, per):
    ch = ListChannel()
    a = RankAgent(rank, ch, num_workers=WORKERS, schema=graph.schema, escalate=False)
    for k in range(FIRST, STEPS):
        for r in per[k]:
            a.feed(r)
    a.close()
    return ch


def _device_agent(graph, rank, per, window, ahead, final_lag=lambda k: 0, dev=None):
    """The serving loop's order: the kernel runs up to ahead(k) steps past the host's step
    k; the host feeds step k's streamed (comm) records, then device_progress(k), the
    device's final epoch k - final_lag(k) (its workers' flushes lag the steps done)."""
    ch = ListChannel()
    dev = dev or DeviceModel(WORKERS)
    a = RankAgent(rank, ch, num_workers=WORKERS, schema=graph.schema, escalate=False)
    a.summarize_on(dev, FIRST, window)
    fed = {context.hook_id(h) for h in a.hooks}
    for k in range(FIRST, STEPS):
        while dev.started < min(STEPS, k + 1 + ahead(k)):
            dev.run_step(per[dev.started] if dev.started in per else [])
        for r in per[k]:
            if _hid(r) in fed:
                a.feed(r)
        dev.final = k - final_lag(k)
        a.device_progress(k)
    dev.final = STEPS - 1                # the launch ended: every step that ran is final
    a.close()
    return ch, dev, a


@pytest.fixture(scope="module")
def tp_run():
    return _tp_records()


@pytest.mark.parametrize("window,ahead,lag", [
    (3, lambda k: 0, lambda k: 0),                        # in lock-step
    (4, lambda k: 4, lambda k: k % 3),                    # the GPU serving loop's grant window
    (2, lambda k: random.Random(k).randrange(0, 7), lambda k: 1),   # windows attached after their first step
    (64, lambda k: 2, lambda k: 0),                       # one window for the whole run
], ids=["lockstep", "ahead4", "late_attach", "one_window"])
def test_device_summaries_ship_what_the_host_summaries_ship(tp_run, window, ahead, lag):
    graphs, per = tp_run
    for rank in range(2):
        want = _by_kind(_host_agent(graphs[rank], rank, per[rank]))
        ch, dev, agent = _device_agent(graphs[rank], rank, per[rank], window, ahead, lag)
        got = _by_kind(ch)
        assert sorted(got[0]) == list(range(FIRST, STEPS))
        for k in range(FIRST, STEPS):
            assert got[0][k] == want[0][k], (rank, k)
        assert got[1] == want[1] and got[2] == want[2]
        assert sum(got[1].values()) > 0 and sum(got[2].values()) > 0
        # the host saw only the comm hooks; every window was read once (but those attached
        # for steps that never ran); a detached window is given back once every worker
        # runs the detach's tables (the CPU model loads them at once)
        assert set(agent.hooks) == {"comm:signal", "comm:wait"}
        comm = {context.hook_id("comm:wait"), context.hook_id("comm:signal")}
        assert agent.stats.events == sum(_hid(r) in comm for k in range(FIRST, STEPS) for r in per[rank][k])
        assert agent.windows.read_count == sum(f < STEPS for f in dev.firsts.values())
        assert not agent.windows.retiring and sorted(dev.forgotten) == sorted(dev.attached)


def test_the_late_senders_wait_is_clipped_the_same_way(tp_run):
    """A remote wait starts no earlier than the awaited event's last local producer end
    (@end_ts, a task-half map): with device summaries that map comes from the window, and
    evidence of a later window's epoch waits for it."""
    graphs, per = tp_run
    want = _by_kind(_host_agent(graphs[0], 0, per[0]))[1]
    ch, _, _ = _device_agent(graphs[0], 0, per[0], 3, lambda k: 5, final_lag=lambda k: k % 4)
    got = _by_kind(ch)[1]
    assert got == want
    long = {w.step for w in got if w.wait_end_ns - w.wait_begin_ns >= 60_000}
    assert long == {5, 6, 11}
    # the clipping moved waits' begins (the GPU-style waits start 30 us before the sim's)
    unclipped = {w for w in got if w.wait_end_ns - w.wait_begin_ns >= 30_000}
    assert len(unclipped) < len(got)


def test_a_full_window_map_counts_lost_in_that_epochs_coverage(tp_run, monkeypatch):
    from dtrace_mk.runtime import agent as agent_mod
    monkeypatch.setattr(agent_mod, "DEVICE_SUMMARY_ENTRIES", 40)    # @queue_max: 12 workers a step
    graphs, per = tp_run
    ch, _, _ = _device_agent(graphs[0], 0, per[0], 8, lambda k: 2)
    sums = _by_kind(ch)[0]
    lost = {k: s.coverage.lost for k, s in sums.items()}
    assert any(lost.values()) and all(s.coverage.consistent for s in sums.values())


class CrowdedDevice(DeviceModel):
    """A device whose hook tables refuse an attach while `full(started)` says they are full
    of live queries' programs (DeviceRuntime raises UserError: the table holds 8)."""

    def __init__(self, workers, full):
        super().__init__(workers)
        self.full, self.refusals = full, 0

    def attach(self, obj, verify=True, first_epoch=None, tier=None, **kw):
        if self.attached and self.full(self.started):
            self.refusals += 1
            raise UserError("hook task:end already has 8 programs; the device table holds 8")
        return super().attach(obj, verify, first_epoch, tier, **kw)


def test_a_refused_successor_window_lengthens_the_last_one_and_is_tried_again(tp_run):
    """While live queries fill the device tables the next window cannot attach: the last
    window counts on (its range grows), the successor is tried again later, and what the
    agent ships still equals the host summaries."""
    graphs, per = tp_run
    want = _by_kind(_host_agent(graphs[0], 0, per[0]))
    ch, dev, agent = _device_agent(graphs[0], 0, per[0], 2, lambda k: 1,
                                   dev=CrowdedDevice(WORKERS, lambda s: 5 <= s < 11))
    got = _by_kind(ch)
    assert got[0] == want[0] and got[1] == want[1] and got[2] == want[2]
    assert dev.refusals >= 2 and agent.windows.refused == dev.refusals
    assert "already has 8 programs" in agent.windows.last_refusal
    firsts = sorted(dev.firsts.values())
    assert any(b - a > 2 for a, b in zip(firsts, firsts[1:]))      # a window longer than 2 steps


def test_windows_never_count_a_started_step_and_cover_every_step_once():
    """SummaryWindows alone: ranges are consecutive from the first epoch, each window
    attached no earlier than the first unstarted step, however late the host is."""
    from dtrace_mk.lang.pipeline import compile_query
    obj = compile_query("task:end { @n[step] = count(); }").obj
    dev = DeviceModel(4)
    w = SummaryWindows(dev, obj, 3, window=4)
    ranges = []
    rng = random.Random(7)
    for final in range(0, 60):
        dev.started = max(dev.started, final + 1 + rng.randrange(0, 9))
        ranges += [(r.first, r.end) for r in w.read(final)]
    ranges += [(r.first, r.end) for r in w.close(70)]
    assert ranges[0][0] == 3 and ranges[-1][1] == 71
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
    for aid in dev.attached:
        att = dev.rt._get(aid) if aid not in dev.forgotten else None
        assert att is None or att.first_epoch >= 3
    assert not dev.rt.attachments()           # closed: nothing attached any more


def test_summarize_on_refuses_escalation_and_a_second_call():
    g = build_graph(get_preset("tiny"), BATCH, WORKERS)
    a = RankAgent(0, ListChannel(), num_workers=WORKERS, schema=g.schema, escalate=True)
    with pytest.raises(UserError, match="escalated evidence"):
        a.summarize_on(DeviceModel(WORKERS), 0)
    b = RankAgent(0, ListChannel(), num_workers=WORKERS, schema=g.schema, escalate=False)
    b.summarize_on(DeviceModel(WORKERS), 0)
    with pytest.raises(UserError, match="once"):
        b.summarize_on(DeviceModel(WORKERS), 0)


def test_a_window_counts_only_its_range_and_is_given_back_once_every_worker_loaded_its_detach(tp_run):
    """Each window's maps and coverage hold exactly its range (its end is its successor's
    first epoch, on the device: attach(replaces=)), however far the kernel runs ahead of
    the host; a detached window's memory goes back only once loaded_gen() reaches the
    detach's table generation (workers pick a change up in idle time: `lag` holds the last
    two changes back here)."""
    from dtrace_mk.lang.pipeline import compile_query
    obj = compile_query("task:end { @n[step] = count(); }").obj
    _, per = tp_run
    dev = DeviceModel(WORKERS)
    dev.lag = 2
    w = SummaryWindows(dev, obj, FIRST, window=3)
    reads = []
    for k in range(STEPS):
        while dev.started < min(STEPS, k + 3):
            dev.run_step(per[0][dev.started])
        dev.final = k
        reads += w.read(k)
        if w.retiring:           # the newest detach is not loaded yet: still held
            assert w.retiring[-1][1] > dev.loaded_gen()
        assert all(gen > dev.loaded_gen() for _, gen in w.retiring)
    reads += w.close(STEPS - 1)
    ends = {context.hook_id("task:end")}
    for r in reads:
        counted = {struct.unpack("<Q", key)[0] for key in r.maps["n"].snapshot()}
        assert counted == set(range(r.first, r.end)), (r.first, r.end, counted)
        want = Counter(k for k in range(r.first, r.end) for rec in per[0][k] if _hid(rec) in ends)
        got = {struct.unpack("<Q", key)[0]: struct.unpack("<Q", v)[0] for key, v in r.maps["n"].snapshot().items()}
        assert got == dict(want)
        assert {c.epoch for c in r.coverage} == set(range(r.first, r.end))
    assert [r.first for r in reads][0] == FIRST and all(a.end == b.first for a, b in zip(reads, reads[1:]))
    assert dev.forgotten and len(dev.forgotten) < len(dev.detached)


def test_window_maps_hold_the_window_and_the_host_s_lag():
    """serve --summary-window W: a window's maps hold W steps plus the host's lag
    (DEVICE_SUMMARY_LAG), in powers of two of the default's 8192 entries (60 steps of 1b's
    @queue_max); the default window keeps the default size."""
    from dtrace_mk.runtime.agent import DEVICE_SUMMARY_ENTRIES, device_summary_entries
    assert [device_summary_entries(w) for w in (2, 16, 17, 64, 77, 256)] == \
        [DEVICE_SUMMARY_ENTRIES, DEVICE_SUMMARY_ENTRIES, 2 * DEVICE_SUMMARY_ENTRIES, 2 * DEVICE_SUMMARY_ENTRIES,
         4 * DEVICE_SUMMARY_ENTRIES, 8 * DEVICE_SUMMARY_ENTRIES]
    g = build_graph(get_preset("tiny"), BATCH, WORKERS)
    for window, entries in ((None, DEVICE_SUMMARY_ENTRIES), (64, 2 * DEVICE_SUMMARY_ENTRIES)):
        a = RankAgent(0, ListChannel(), num_workers=WORKERS, schema=g.schema, escalate=False)
        a.summarize_on(DeviceModel(WORKERS), 0, window)
        assert a.windows.W == (window or 16)
        hashes = [m for m in a.windows.obj.maps if m.type == "hash"]
        assert hashes and {m.max_entries for m in hashes} == {entries}
