"""The collector's transport over an in-process loopback (the MPI calls it makes are the
port's; the e2e tests run it under real mpiexec): framing, ordering, ping-pongs, BYE/FIN,
lost-record accounting, bounded in-flight sends, silent ranks."""
import pytest

from dtrace_mk.collectors import transport as T
from dtrace_mk.collectors.diagnose import Accumulator
from dtrace_mk.collectors.records import (ClockSample, Coverage, EpochSummary, PingPong,
                                          RemoteWait, Signal, pack, pack_stream)
from dtrace_mk.runtime.agent import RankAgent

COLLECTOR = 2


def _hub(n_ranks=2, **kw):
    hub = T.LoopbackHub(n_ranks + 1, **kw)
    acc = Accumulator()
    loop = T.CollectorLoop(hub.port(COLLECTOR), list(range(n_ranks)), acc, start_pings=3)
    chans = [T.RankChannel(hub.port(r), COLLECTOR, r) for r in range(n_ranks)]
    return hub, acc, loop, chans


def _summary(rank, epoch):
    return EpochSummary(rank, epoch, 100, 200, coverage=Coverage(4, 4, 0, 0))


def _bye(c):
    """Queue BYE behind the data, as close() does (close() would wait for FIN)."""
    c.queue.append(c._msg(T.BYE))
    c.queued_records.append(0)


def _pump(loop, chans, rounds=20):
    for _ in range(rounds):
        for c in chans:
            c.progress()
        loop.poll()


def test_records_arrive_in_order_and_bye_fin_ends_the_run():
    hub, acc, loop, chans = _hub()
    for r, c in enumerate(chans):
        for k in range(3):
            assert c.send(pack_stream([_summary(r, k), Signal(r, 1 - r, 0, k, k, 0, 1000 + k)]))
    _pump(loop, chans)
    assert [(s.rank, s.epoch) for s in acc.summaries if s.rank == 0] == [(0, 0), (0, 1), (0, 2)]
    assert len(acc.signals) == 6
    assert not loop.finished
    for c in chans:
        _bye(c)
    _pump(loop, chans)
    assert loop.finished and all(c.fin for c in chans)
    assert loop.run(deadline_s=None) is True
    res = acc.result(ranks=2)
    assert res["missing_ranks"] == [] and not acc.lost_ranks
    assert acc.bytes == sum(st["bytes"] for st in loop.report()["ranks"].values())


def test_start_up_ping_pongs_become_pingpong_records():
    hub, acc, loop, chans = _hub(n_ranks=1)
    ch = chans[0]
    # interleave the two ends by hand: HELLO, then pings answered one by one
    ch.in_flight.append(ch.port.isend(COLLECTOR, T.TAG_UP, ch._msg(T.HELLO)))
    for _ in range(10):
        loop.poll()
        ch.progress()
    assert len(acc.pingpongs) == 3
    for p in acc.pingpongs:
        assert isinstance(p, PingPong) and p.rank == 0 and p.t0_ns <= p.t_remote_ns <= p.t1_ns
    assert loop.report()["ranks"]["0"]["pingpongs"] == 3


def test_a_rank_on_the_collectors_host_gets_an_exact_offset_however_late_its_pongs():
    """Same host = same clock: HELLO's host identity gives one exact round trip, so a
    serving loop that answers pings hundreds of us late cannot bias the offset (seen on
    the H200 host: 290 us half-RTTs made a 276 us causal violation)."""
    from dtrace_mk.collectors.clock import fit_host_offsets
    hub, acc, loop, chans = _hub(n_ranks=2)
    fake = iter(range(0, 10 ** 9, 300_000))           # every clock read 300 us later
    loop.clock = lambda: next(fake)
    chans[0].in_flight.append(chans[0].port.isend(COLLECTOR, T.TAG_UP, chans[0]._msg(T.HELLO, T.host_identity())))
    chans[1].in_flight.append(chans[1].port.isend(COLLECTOR, T.TAG_UP, chans[1]._msg(T.HELLO, b"elsewhere/0")))
    for _ in range(10):
        loop.poll()
        for c in chans:
            c.progress()
    off = fit_host_offsets(acc.pingpongs)
    assert off[0].half_rtt_ns == 0 and off[0].offset_ns == 0       # the exact one wins
    assert off[1].half_rtt_ns > 0                                   # another host: measured
    assert loop.report()["ranks"]["0"]["pingpongs"] == 1 + 3


def test_lost_totals_in_headers_reach_the_sink_as_deltas():
    hub, acc, loop, chans = _hub(n_ranks=1)
    ch = chans[0]
    ch.add_lost(5)
    ch.send(pack(_summary(0, 0)))
    loop.poll()
    ch.add_lost(2)
    ch.send(pack(_summary(0, 1)))
    loop.poll()
    ch.send(pack(_summary(0, 2)))
    loop.poll()
    assert acc.lost_records == {0: 7}
    assert acc.result(ranks=1)["transport"]["lost_records"] == {"0": 7}


def test_bounded_in_flight_and_queue_then_refusal():
    hub, acc, loop, chans = _hub(n_ranks=1, hold_sends=True)
    ch = T.RankChannel(hub.port(0), COLLECTOR, 0, max_in_flight=2, max_queued=3)
    results = [ch.send(pack(_summary(0, k))) for k in range(8)]
    assert results == [True] * 5 + [False] * 3          # 2 in flight + 3 queued
    assert len(ch.in_flight) == 2 and len(ch.queue) == 3
    assert ch.stats.max_in_flight_seen == 2 and ch.stats.messages_refused == 3
    hub.release()
    for _ in range(5):
        ch.progress()
        hub.release()
        loop.poll()
    assert sorted(s.epoch for s in acc.summaries) == [0, 1, 2, 3, 4]


def test_an_agent_whose_collector_stops_draining_counts_its_losses():
    hub, acc, loop, _ = _hub(n_ranks=1, hold_sends=True)
    ch = T.RankChannel(hub.port(0), COLLECTOR, 0, max_in_flight=1, max_queued=1)
    agent = RankAgent(0, ch, num_workers=2)
    from dtrace_mk.abi import context
    for step in range(12):
        agent.feed(context.pack("task:end", decode_step=step, ts_ns=10 + step, task_class=1,
                                dur_ns=5, worker=0))
    agent._flush_through(agent.max_step)
    assert agent.stats.records_lost > 0
    assert agent.stats.records == agent.stats.records_sent + agent.stats.records_lost
    # the collector drains again: the next header tells it how many were lost
    hub.release()
    for _ in range(10):
        ch.progress()
        hub.release()
        loop.poll()
    ch.send(pack(_summary(0, 99)))
    for _ in range(3):
        ch.progress()
        hub.release()
        loop.poll()
    assert acc.lost_records == {0: agent.stats.records_lost}


def test_a_silent_rank_is_reported_lost_and_the_result_names_it():
    hub, acc, loop, chans = _hub()
    loop.silence_timeout_s = 0.0
    chans[0].send(pack_stream([_summary(0, 0), RemoteWait(0, 1, 0, 5, 0, 0, 11, 100, 900)]))
    _bye(chans[0])
    chans[0].progress()
    assert loop.run(deadline_s=None) is False       # returns: rank 1 never spoke
    assert acc.lost_ranks == {1}
    res = acc.result(ranks=2)
    assert res["partial"] and res["missing_ranks"] == [1]
    assert loop.report()["ranks"]["1"]["lost"] is True


def test_the_deadline_ends_the_run_with_the_unfinished_ranks_lost():
    hub, acc, loop, chans = _hub()
    chans[0].send(pack(_summary(0, 0)))
    chans[1].send(pack(_summary(1, 0)))
    assert loop.run(deadline_s=0.0) is False
    assert acc.lost_ranks == {0, 1}
    assert len(acc.summaries) == 2


def test_bad_input_is_counted_never_raised():
    hub, acc, loop, chans = _hub()
    port = hub.port(0)
    port.isend(COLLECTOR, T.TAG_UP, b"short")                                    # no header
    port.isend(COLLECTOR, T.TAG_UP, T.HEADER.pack(7, T.DATA, 1, 0) + b"x")        # unknown rank
    port.isend(COLLECTOR, T.TAG_UP, T.HEADER.pack(1, T.DATA, 1, 0) + b"x")        # wrong source
    port.isend(COLLECTOR, T.TAG_UP, T.HEADER.pack(0, 99, 1, 0))                   # unknown kind
    port.isend(COLLECTOR, T.TAG_UP, T.HEADER.pack(0, T.DATA, 1, 0) + b"\xc1\xc1")  # not msgpack
    loop.poll()
    assert loop.bad_headers == 4
    assert acc.bad_messages == {0: 1}


def test_runs_of_one_job_do_not_see_each_others_messages():
    hub = T.LoopbackHub(2)
    acc0, acc1 = Accumulator(), Accumulator()
    t0, t1 = T.Tags.for_run(0), T.Tags.for_run(1)
    loop0 = T.CollectorLoop(hub.port(1), [0], acc0, tags=t0, start_pings=0)
    loop1 = T.CollectorLoop(hub.port(1), [0], acc1, tags=t1, start_pings=0)
    c1 = T.RankChannel(hub.port(0), 1, 0, tags=t1)
    c1.send(pack(_summary(0, 5)))
    loop0.poll()
    assert acc0.summaries == []
    loop1.poll()
    assert [s.epoch for s in acc1.summaries] == [5]


def test_direct_channel_feeds_the_in_process_collector():
    acc = Accumulator()
    loop = T.CollectorLoop(None, [0], acc)
    ch = T.DirectChannel(loop, 0)
    agent = RankAgent(0, ch, num_workers=2)
    agent.start()
    from dtrace_mk.abi import context
    agent.feed(context.pack("task:end", decode_step=0, ts_ns=10, task_class=1, dur_ns=5, worker=0))
    agent.clock_sample(10, 20)
    agent.close()
    assert loop.finished
    assert [s.epoch for s in acc.summaries] == [0]
    assert acc.clock_samples == [ClockSample(0, 10, 20)]
    assert len(acc.pingpongs) == 1


def test_collector_sink_keeps_real_pingpongs_out_of_a_sim_clock_model():
    sink = T.CollectorSink(use_pingpongs=False)
    sink.on_record(0, PingPong(0, 1, 2, 3))
    assert sink.pingpongs == [] and len(sink.side_pingpongs) == 1
    sink = T.CollectorSink(use_pingpongs=True)
    sink.on_record(0, PingPong(0, 1, 2, 3))
    assert len(sink.pingpongs) == 1


def test_roles_without_mpmd_make_rank_0_the_collector():
    MPI = pytest.importorskip("mpi4py.MPI")
    roles, sub = T.roles(MPI.COMM_WORLD)
    try:
        assert roles.mpmd is False and roles.is_rank and roles.is_collector
        assert roles.rank == 0 and roles.ranks == MPI.COMM_WORLD.Get_size() == 1
    finally:
        sub.Free()


def test_messages_still_queued_when_close_times_out_are_counted_lost():
    hub = T.LoopbackHub(2, hold_sends=True)
    ch = T.RankChannel(hub.port(0), 1, 0, max_in_flight=1, max_queued=4)
    for k in range(3):
        assert ch.send(pack_stream([_summary(0, k)] * 2), records=2)
    assert ch.close(timeout_s=0.0) is False          # nobody drains, no FIN
    # one message was in flight (cancelled at the deadline), two still queued: 4 records
    assert ch.lost_total == 4 and ch.stats.records_dropped_at_close == 4
    assert hub.held == [] and ch.in_flight == []     # nothing left outstanding


def test_user_monitor_output_travels_as_a_note(tmp_path):
    import json
    q = tmp_path / "q.d"
    q.write_text("task:end { @n = count(); }")
    acc = Accumulator()
    loop = T.CollectorLoop(None, [0], acc)
    agent = RankAgent(0, T.DirectChannel(loop, 0), num_workers=2, monitors=[str(q)])
    agent.start()
    from dtrace_mk.abi import context
    for k in range(3):
        agent.feed(context.pack("task:end", decode_step=k, ts_ns=10 + k, task_class=1, dur_ns=5, worker=0))
    agent.close()
    (raw,) = loop.notes[0]
    doc = json.loads(raw)
    (b,) = [b for b in doc["blocks"] if b.get("name") == "@n"]
    assert b["monitor"] == str(q) and b["entries"][0]["value"] == 3 and doc["cut"] == 0
    assert [s.epoch for s in acc.summaries] == [0, 1, 2]


def test_a_spool_replays_into_a_partial_result_and_marks_silent_ranks_lost(tmp_path):
    """replay_spool (the launcher's partial result when the collector died after the run:
    e.g. it could not import its exporters): every message the live loop spooled reaches
    the sink, a rank whose BYE is in the spool is done -- its FIN has nobody to go to and
    is not sent -- and a rank that never said BYE is reported lost."""
    hub, acc, loop, chans = _hub()
    loop.spool = T.open_spool(str(tmp_path / "r.spool"))
    for r, c in enumerate(chans):
        for k in range(2):
            assert c.send(pack_stream([_summary(r, k)]))
    _bye(chans[0])
    _pump(loop, chans)
    loop.spool.close()
    acc2 = T.CollectorSink(use_pingpongs=False)
    lost = []
    acc2.on_rank_lost = lost.append
    replay = T.replay_spool(str(tmp_path / "r.spool"), [0, 1], acc2)
    assert sorted((s.rank, s.epoch) for s in acc2.summaries) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert lost == [1] and replay.state[0].bye and not replay.state[1].bye and replay._sends == []
