"""The per-rank agent: epoch records from a sim run, remote waits and signals from
comm contexts, lost counting when sends cannot go out, bounded memory."""
from collections import Counter

from dtrace_mk.abi import context
from dtrace_mk.collectors.records import (ClockSample, EpochSummary, Names, RemoteWait, Signal,
                                          max_packed_size, pack)
from dtrace_mk.megakernel.faults import FaultTable
from dtrace_mk.megakernel.graph import build_graph
from dtrace_mk.megakernel.presets import get_preset
from dtrace_mk.megakernel.sim import Sim
from dtrace_mk.runtime.agent import ListChannel, RankAgent

WORKERS = 16
NAMES = Names.standard()


def _graph(model="tiny", batch=4):
    return build_graph(get_preset(model), batch, WORKERS)


def _run(steps=4, channel=None, faults=(), model="tiny", **kw):
    g = _graph(model)
    ch = channel if channel is not None else ListChannel()
    agent = RankAgent(0, ch, num_workers=WORKERS, schema=g.schema, **kw)
    res = Sim(g, steps, sink=agent.sink, hooks=agent.hooks,
              faults=FaultTable.from_specs(list(faults), "test")).run()
    stats = agent.close()
    return g, ch, agent, stats, res


def _summaries(ch):
    return {r.epoch: r for r in ch.records() if isinstance(r, EpochSummary)}


def test_one_summary_per_epoch_with_task_counts_of_the_graph():
    g, ch, agent, stats, res = _run(steps=4)
    sums = _summaries(ch)
    assert sorted(sums) == [0, 1, 2, 3]
    per_class = Counter(t.cls for t in g.tasks if not t.dynamic)
    for k, s in sums.items():
        assert s.rank == 0 and s.epoch == k
        assert {c.task_class: c.count for c in s.classes} == dict(per_class)
        assert s.coverage.consistent and s.coverage.eligible > 0 and s.coverage.lost == 0
        assert res.step_start_ns[k] <= s.begin_ns < s.end_ns <= res.step_end_ns[k] + 10_000
        for c in s.classes:
            assert c.dur_max_ns * c.count >= c.dur_sum_ns >= c.dur_max_ns > 0
    assert stats.epochs == 4 and stats.records_lost == 0
    assert stats.bytes_sent == sum(len(p) for p in ch.payloads)
    assert all(len(p) <= ch.max_payload for p in ch.payloads)


def test_faults_show_in_the_fields_their_detectors_read():
    attn = NAMES.task_class_id("attn")
    qkv = NAMES.task_class_id("qkv")
    _, ch, *_ = _run(steps=4, faults=[
        {"kind": "starve_ready", "task_class": "attn", "delay_us": 50, "steps": [1]},
        {"kind": "late_notification", "task_class": "qkv", "delay_us": 40, "steps": [2]},
        {"kind": "slow_task_class", "task_class": "attn", "extra_us": 30, "steps": [3]},
        {"kind": "queue_saturation", "worker": 3, "extra_tasks": 20, "steps": [0]}])
    s = _summaries(ch)
    disp = [s[k].class_stat(attn).dispatch_wait_sum_ns for k in range(4)]
    assert disp[1] >= 50_000 * s[1].class_stat(attn).count and disp[0] == disp[2] == disp[3] == 0
    lag = [s[k].class_stat(qkv).notify_lag_sum_ns for k in range(4)]
    assert lag[2] >= lag[1] + 40_000 and lag[1] == lag[3]
    dur = [s[k].class_stat(attn).dur_sum_ns for k in range(4)]
    assert dur[3] - dur[2] >= 30_000 * s[3].class_stat(attn).count
    assert s[0].queue_depth_max >= 20 and s[0].queue_depth_worker == 3
    assert s[1].queue_depth_max < 20


def test_expert_work_per_expert_on_moe_layers():
    _, ch, *_ = _run(steps=2, model="small-moe")
    for s in _summaries(ch).values():
        assert len(s.expert_counts) == get_preset("small-moe").n_experts
        assert sum(s.expert_counts) > 0


def _comm(hook, step, ts, **kw):
    base = dict(rank=0, worker=1, sm=1, decode_step=step, task_class=NAMES.task_class_id("allreduce"),
                layer=1, comm_op=NAMES.comm_op_id("allreduce_mlp"), comm_gen=7 + step, peer_rank=1,
                ts_ns=ts, event_id=3, event_gen=step + 1)
    base.update(kw)
    return context.pack(hook, **base)


def test_remote_waits_and_signals_become_records():
    ch = ListChannel()
    agent = RankAgent(0, ch, num_workers=4)
    for step in range(3):
        agent.feed(_comm("comm:signal", step, 1000 + step * 10_000))
        agent.feed(_comm("comm:wait", step, 5000 + step * 10_000, wait_ns=3000))
    agent.clock_sample(123, 456)
    agent.close()
    recs = ch.records()
    waits = [r for r in recs if isinstance(r, RemoteWait)]
    sigs = [r for r in recs if isinstance(r, Signal)]
    assert [(w.step, w.comm_gen, w.wait_begin_ns, w.wait_end_ns) for w in waits] == \
        [(k, 7 + k, 2000 + k * 10_000, 5000 + k * 10_000) for k in range(3)]
    assert all((w.rank, w.peer, w.layer, w.comm_op) == (0, 1, 1, NAMES.comm_op_id("allreduce_mlp"))
               for w in waits)
    assert [(s.step, s.signal_ns, s.peer) for s in sigs] == [(k, 1000 + k * 10_000, 1) for k in range(3)]
    sums = _summaries(ch)
    assert [(s.remote_wait_count, s.remote_wait_sum_ns, s.remote_wait_max_ns)
            for _, s in sorted(sums.items())] == [(1, 3000, 3000)] * 3
    assert [r for r in recs if isinstance(r, ClockSample)] == [ClockSample(0, 123, 456)]


def test_evidence_over_the_budget_is_throttled_in_coverage():
    ch = ListChannel()
    agent = RankAgent(0, ch, num_workers=1, budget_bytes_per_step=80 * 2)  # 80-byte records
    for i in range(5):
        agent.feed(_comm("comm:wait", 0, 5000 + i, wait_ns=10, worker=0, comm_gen=i))
    agent.close()
    assert len([r for r in ch.records() if isinstance(r, RemoteWait)]) == 2
    cov = _summaries(ch)[0].coverage
    assert cov.throttled == 3 and cov.consistent


def test_what_cannot_be_sent_is_counted_lost_not_dropped():
    # the channel takes 3 messages, then refuses (a collector that stopped draining)
    ch = ListChannel(refuse_after=3, max_payload=400)
    g, ch, agent, stats, _ = _run(steps=6, channel=ch)
    assert stats.records_lost > 0
    assert stats.records == stats.records_sent + stats.records_lost
    assert ch.lost_total == stats.records_lost            # travels in message headers
    assert len(ch.records()) == stats.records_sent


class _SummariesOnly(ListChannel):
    """Refuses every message without a summary: wait/signal records are lost."""

    def send(self, payload, records=0):
        from dtrace_mk.collectors.records import unpack_stream
        if not any(isinstance(r, EpochSummary) for r in unpack_stream(payload)):
            self.refused += 1
            return False
        return super().send(payload, records)


def test_lost_waits_move_from_executed_to_lost_in_the_epoch_coverage():
    ch = _SummariesOnly()
    agent = RankAgent(0, ch, num_workers=4)
    for i in range(4):
        agent.feed(_comm("comm:wait", 0, 5000 + i, wait_ns=10, comm_gen=i))
    agent.close()
    (summary,) = _summaries(ch).values()
    assert summary.remote_wait_count == 4
    assert summary.coverage.lost == 4 and summary.coverage.executed == summary.coverage.eligible - 4
    assert summary.coverage.consistent
    assert agent.stats.records_lost == 4 and ch.lost_total == 4


def test_memory_stays_bounded_over_many_steps():
    _, _, short, s_short, _ = _run(steps=4)
    _, ch, long, s_long, _ = _run(steps=24)
    assert s_long.max_open_epochs <= long.max_open_epochs
    assert s_long.max_map_entries <= s_short.max_map_entries
    assert len(long.rt.coverage_table(long.aid).rows()) == 0      # flushed epochs' rows dropped
    assert long.maps["dtmk_evidence"]._used == {}                  # and their budget use
    for name in ("dur", "end_ts", "queue_max"):
        assert len(long.maps[name].snapshot()) == 0
    assert len(_summaries(ch)) == 24
    # every record has a packed-size bound the transport can rely on
    assert all(len(p) <= ch.max_payload for p in ch.payloads)
    assert max_packed_size(EpochSummary) < ch.max_payload


def test_an_epoch_flushes_once_a_later_step_arrives_not_at_the_end():
    ch = ListChannel()
    agent = RankAgent(0, ch, num_workers=4, flush_lag=1)
    agent.feed(context.pack("task:end", decode_step=0, ts_ns=10, task_class=1, dur_ns=5, worker=0))
    assert _summaries(ch) == {}
    agent.feed(context.pack("task:end", decode_step=1, ts_ns=20, task_class=1, dur_ns=5, worker=0))
    assert list(_summaries(ch)) == [0]
    # a straggler of the flushed epoch is counted, not merged into a shipped summary
    agent.feed(context.pack("task:end", decode_step=0, ts_ns=21, task_class=1, dur_ns=5, worker=0))
    agent.close()
    s = _summaries(ch)
    assert sorted(s) == [0, 1] and agent.stats.late_events == 1
    assert s[0].class_stat(1).count == 1
    assert s[1].coverage.lost == 1 and s[1].coverage.consistent


def test_user_monitors_run_beside_the_summary(tmp_path):
    q = tmp_path / "q.d"
    q.write_text('task:end /task.class == "attn"/ { @n = count(); }')
    _, ch, agent, *_ = _run(steps=2, monitors=[str(q)])
    blocks = agent.user_blocks[str(q)]
    (b,) = [b for b in blocks if b.get("name") == "@n"]
    assert b["entries"][0]["value"] == 2 * sum(1 for t in _graph().tasks if t.class_name == "attn")
    assert len(_summaries(ch)) == 2


def test_two_tensor_parallel_ranks_ship_joinable_waits_and_signals():
    from dtrace_mk.collectors.join import join
    from dtrace_mk.megakernel.mpi_transport import run_loopback
    cfg = get_preset("tiny")
    graphs = [build_graph(cfg, 4, WORKERS, rank=r, ranks=2) for r in range(2)]
    chans = [ListChannel(), ListChannel()]
    agents = [RankAgent(r, chans[r], num_workers=WORKERS, schema=graphs[r].schema) for r in range(2)]
    late = FaultTable.from_specs([{"kind": "late_comm", "comm_op": "allreduce_attn", "layer": 0,
                                   "delay_us": 100, "steps": [2]}], "test")
    run_loopback(cfg, 4, WORKERS, 2, 4, faults={1: late}, sinks=[a.sink for a in agents],
                 graphs=graphs, on_clock=[a.clock_sample for a in agents], hooks=agents[0].hooks)
    for a in agents:
        a.close()
    recs = [r for c in chans for r in c.records()]
    waits = [r for r in recs if isinstance(r, RemoteWait)]
    sigs = [r for r in recs if isinstance(r, Signal)]
    samples = [r for r in recs if isinstance(r, ClockSample)]
    # every step has both ops' all-reduces of every layer; every wait joins its signals
    assert {(w.rank, w.peer) for w in waits} == {(0, 1), (1, 0)}
    assert len(waits) == 2 * 4 * 2 * cfg.n_layers
    j = join(waits, sigs, expected_ranks=[0, 1])
    assert j.unmatched_waits == [] and j.missing_ranks == []
    assert len(samples) == 2 * (4 + 1)
    # the late signal shows as a long remote wait on rank 0 (local inputs excluded)
    by = {(w.rank, w.step, w.comm_op, w.layer): w.wait_end_ns - w.wait_begin_ns for w in waits}
    op = NAMES.comm_op_id("allreduce_attn")
    assert by[(0, 2, op, 0)] >= 100_000 > 20 * by[(0, 1, op, 0)]
    for s in _summaries(chans[0]).values():
        assert s.remote_wait_count == 2 * cfg.n_layers


def test_the_step_byte_budget_throttles_evidence_records_not_summaries():
    ch = ListChannel()
    agent = RankAgent(0, ch, num_workers=4, budget_bytes_per_step=40)
    for i in range(6):      # ~12 bytes each packed: 3 fit in 40 bytes
        agent.feed(_comm("comm:signal", 0, 1000 + i, comm_gen=i, worker=i % 4))
    agent.close()
    sigs = [r for r in ch.records() if isinstance(r, Signal)]
    assert 0 < len(sigs) < 6
    (s,) = _summaries(ch).values()
    assert s.coverage.throttled == 6 - len(sigs) and s.coverage.consistent
    assert sum(len(pack(x)) for x in sigs) <= 40
