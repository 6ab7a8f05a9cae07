"""Multi-rank sim on the loopback transport: comm hooks, joins by (comm_op, comm_gen),
clocks, determinism, remote stalls from late_comm and from a slow task on a peer."""
from collections import Counter

import pytest

from dtrace_mk.abi import context
from dtrace_mk.abi import definition as D
from dtrace_mk.errors import UserError
from dtrace_mk.megakernel.faults import FaultTable
from dtrace_mk.megakernel.graph import CLASS_IDS, build_graph
from dtrace_mk.megakernel.mpi_transport import LoopbackTransport, RankPort, run_loopback
from dtrace_mk.megakernel.presets import PRESETS
from dtrace_mk.megakernel.sim import RankClock, Sim, pack_ctx

AR = CLASS_IDS["allreduce"]
_RUNS = {}


def run(name="tiny", ranks=2, batch=4, workers=8, steps=5, faults=None, seed=0, clock_skew=False,
        **kw):
    key = (name, ranks, batch, workers, steps, repr(faults), seed, clock_skew, repr(sorted(kw.items())))
    if key not in _RUNS:
        tables = {r: FaultTable.from_specs(f) for r, f in (faults or {}).items()}
        sinks = [[] for _ in range(ranks)]
        res = run_loopback(PRESETS[name], batch, workers, ranks, steps, faults=tables,
                           sinks=[s.append for s in sinks], seed=seed, clock_skew=clock_skew, **kw)
        _RUNS[key] = (res, sinks)
    return _RUNS[key]


def hooks(recs, name, **match):
    return [h for h in recs if h["hook"] == name and all(h[k] == v for k, v in match.items())]


def comm_waits(recs):
    return {(h["comm_op"], h["comm_gen"]): h for h in hooks(recs, "comm:wait")}


@pytest.mark.parametrize("name, ranks", [("tiny", 2), ("tiny", 4), ("small-moe", 2)])
def test_contexts_valid_ordered_and_pack(name, ranks):
    res, sinks = run(name, ranks, clock_skew=True)
    for r, recs in enumerate(sinks):
        assert recs and all(h["rank"] == r for h in recs)
        for h in recs:
            assert set(h) - {"hook"} == set(D.HOOKS_BY_NAME[h["hook"]].valid_fields) - {"hook"}, h["hook"]
            assert pack_ctx(h) == context.from_dict(h)
        ts = [h["ts_ns"] for h in recs]
        assert ts == sorted(ts), "a rank's hooks come in nondecreasing ts order"
        c = Counter(h["hook"] for h in recs)
        assert c["comm:signal"] > 0 and c["comm:wait"] > 0
        assert res[r].hook_counts["comm:signal"] == c["comm:signal"]


@pytest.mark.parametrize("ranks", [2, 4])
def test_every_wait_joins_its_signals_by_comm_op_and_gen(ranks):
    steps = 5
    res, sinks = run("tiny", ranks, steps=steps)
    g = build_graph(PRESETS["tiny"], 4, 8, rank=0, ranks=ranks)
    L, C = g.cfg.n_layers, g.cfg.hidden // g.cfg.comm_tile
    sig = Counter()
    for r, recs in enumerate(sinks):
        for h in hooks(recs, "comm:signal"):
            assert h["peer_rank"] != r and h["task_class"] == AR and h["flags"] & D.FLAG_REMOTE
            assert h["comm_gen"] == h["decode_step"] * L + h["layer"]
            assert g.events[h["event_id"]].owner_rank == h["peer_rank"]
            assert h["event_gen"] == g.events[h["event_id"]].triggers * (h["decode_step"] + 1)
            sig[(r, h["peer_rank"], h["comm_op"], h["comm_gen"])] += 1
    # C tiles from every rank to every peer for every logical all-reduce
    want = {(s, d, op, gen) for s in range(ranks) for d in range(ranks) if s != d
            for op in (0, 1) for gen in range(steps * L)}
    assert set(sig) == want and set(sig.values()) == {C}
    for r, recs in enumerate(sinks):
        w = hooks(recs, "comm:wait")
        assert sorted((h["comm_op"], h["comm_gen"]) for h in w) == sorted((op, gen) for op in (0, 1)
                                                                           for gen in range(steps * L))
        for h in w:
            assert h["peer_rank"] != r and (h["peer_rank"], r, h["comm_op"], h["comm_gen"]) in sig
            assert h["flags"] & D.FLAG_REMOTE and h["task_class"] == CLASS_IDS["rmsnorm"]
            assert g.events[h["event_id"]].comm_op == h["comm_op"]
            assert res[r].signals_received == res[r].signals_sent == (ranks - 1) * C * 2 * L * steps
    # remote-fed waits and releases are flagged; local ones are not
    for h in sinks[0]:
        if h["hook"] in ("dep:wait", "dep:release", "task:begin", "task:ready") and h.get("task_class") == 0:
            remote = h["event_id"] != g.step_event and g.remote_fed(h["event_id"])
            assert bool(h["flags"] & D.FLAG_REMOTE) == remote, h


def test_comm_wait_is_the_remote_part_of_the_dependency_wait():
    _, sinks = run("tiny", 2)
    rel = {(h["task_index"], h["decode_step"]): h for h in hooks(sinks[0], "dep:release")}
    for h in hooks(sinks[0], "comm:wait"):
        r = rel.get((h["task_index"], h["decode_step"]))
        assert h["wait_ns"] <= (r["wait_ns"] if r else 0)
        if r:
            assert r["ts_ns"] == h["ts_ns"]


@pytest.mark.parametrize("ranks", [2, 4])
def test_loopback_is_deterministic_and_window_independent(ranks):
    _, a = run("tiny", ranks, clock_skew=True, seed=3)
    _RUNS.clear()
    _, b = run("tiny", ranks, clock_skew=True, seed=3)
    assert a == b
    # a much smaller lookahead gives other windows but the same streams
    g = [build_graph(PRESETS["tiny"], 4, 8, rank=r, ranks=ranks) for r in range(ranks)]
    tr = LoopbackTransport(ranks, lookahead_ns=300)
    c = [[] for _ in range(ranks)]
    sims = [Sim(g[r], 5, sink=c[r].append, seed=3, transport=tr.port(r), clock=RankClock.for_rank(r, 3))
            for r in range(ranks)]
    tr.run(sims)
    assert c == a and tr.windows > 0


def test_clock_skew_only_changes_emitted_timestamps():
    res0, plain = run("tiny", 2, steps=3, clock_skew=False)
    res1, skew = run("tiny", 2, steps=3, clock_skew=True)
    assert res0[0].step_ns == res1[0].step_ns, "clocks never change the simulation"
    for r in range(2):
        clk = RankClock.for_rank(r, 0)
        assert 37_000 <= clk.offset_ns < 237_000 and 1000 <= abs(clk.drift_ppb) <= 4000
        assert len(plain[r]) == len(skew[r])
        for p, s in zip(plain[r], skew[r]):
            assert s["ts_ns"] == clk.device_ns(p["ts_ns"]) and s["ts_ns"] % 32 == 0
            assert {**s, "ts_ns": 0} == {**p, "ts_ns": 0}
        smp = res1[r].clock_samples
        assert len(smp) == 3 + 1
        assert [d for d, _ in smp] == [clk.device_ns(t) for t in res1[r].step_start_ns + [res1[r].step_end_ns[-1]]]
        assert all(0 <= h - t < 200 for (_, h), t in zip(smp, res1[r].step_start_ns))
    assert RankClock.for_rank(0, 0) != RankClock.for_rank(1, 0)
    mine = [RankClock(offset_ns=1000 * (r + 1), drift_ppb=0, quantum_ns=32) for r in range(2)]
    _, sinks = run("tiny", 2, steps=3, clocks=mine)
    for r in range(2):
        assert [h["ts_ns"] for h in sinks[r]] == [mine[r].device_ns(h["ts_ns"]) for h in plain[r]]
    assert RankClock().identity and RankClock().device_ns(12345) == 12345


def test_on_clock_streams_the_samples():
    got = [[], []]
    res = run_loopback(PRESETS["tiny"], 2, 8, 2, 2, on_clock=[lambda d, h, r=r: got[r].append((d, h))
                                                               for r in range(2)])
    assert [got[r] for r in range(2)] == [res[r].clock_samples for r in range(2)]


LATE = {1: [{"kind": "late_comm", "comm_op": "allreduce_mlp", "layer": 0, "delay_us": 30, "steps": [2]}]}


def test_late_comm_on_rank1_stalls_rank0_on_that_generation():
    _, base = run("tiny", 2)
    _, late = run("tiny", 2, faults=LATE)
    L = PRESETS["tiny"].n_layers
    key = (1, 2 * L + 0)                            # (allreduce_mlp, step 2 layer 0)
    b0, f0 = comm_waits(base[0]), comm_waits(late[0])
    assert f0[key]["wait_ns"] - b0[key]["wait_ns"] == 30_000
    assert f0[key]["peer_rank"] == 1
    for k in b0:                                    # earlier generations are untouched
        if k[1] < key[1] or (k[1] == key[1] and k[0] < key[0]):
            assert f0[k] == b0[k]
    # the sender's comm:signal carries the delay and FLAG_FAULT
    s_base = hooks(base[1], "comm:signal", comm_op=1, comm_gen=key[1])
    s_late = hooks(late[1], "comm:signal", comm_op=1, comm_gen=key[1])
    assert len(s_late) == len(s_base) > 0
    for a, b in zip(s_base, s_late):
        assert b["ts_ns"] - a["ts_ns"] == 30_000 and b["flags"] & D.FLAG_FAULT
    # rank 0 shows no dispatch-wait anomaly: its scheduler dispatched as promptly as before
    for k in range(5):
        mb = max(h["wait_ns"] for h in hooks(base[0], "task:dispatch", decode_step=k))
        ml = max(h["wait_ns"] for h in hooks(late[0], "task:dispatch", decode_step=k))
        assert ml <= mb
    assert not any(h["flags"] & D.FLAG_FAULT for h in late[0])
    # the stall comes back: rank 1 then waits on rank 0, which was held up
    assert comm_waits(late[1])[(0, key[1] + 1)]["wait_ns"] > 25_000


def test_slow_task_on_rank1_makes_rank0_wait_remotely():
    faults = {1: [{"kind": "slow_task_class", "task_class": "mlp_down", "layer": 1, "extra_us": 40,
                   "steps": [3]}]}
    _, base = run("tiny", 2)
    _, slow = run("tiny", 2, faults=faults)
    key = (1, 3 * 2 + 1)                            # allreduce_mlp after layer 1 of step 3
    w0 = comm_waits(slow[0])[key]
    assert w0["wait_ns"] - comm_waits(base[0])[key]["wait_ns"] >= 35_000 and w0["peer_rank"] == 1
    assert comm_waits(slow[1])[key]["wait_ns"] <= comm_waits(base[1])[key]["wait_ns"]
    d0 = [h["dur_ns"] for h in hooks(slow[0], "task:end", decode_step=3)]
    assert d0 == [h["dur_ns"] for h in hooks(base[0], "task:end", decode_step=3)], "rank 0 ran no slower"
    d1 = hooks(slow[1], "task:end", decode_step=3, task_class=CLASS_IDS["mlp_down"], layer=1)
    assert all(h["dur_ns"] >= 40_000 and h["flags"] & D.FLAG_FAULT for h in d1)


def test_moe_ranks_route_identically():
    res, sinks = run("small-moe", 2, batch=8, workers=16, steps=3)
    assert res[0].dynamic_tasks == res[1].dynamic_tasks
    ex = [sorted({(h["expert"], h["decode_step"]) for h in hooks(s, "task:end", task_class=CLASS_IDS["moe_expert"])})
          for s in sinks]
    assert ex[0] == ex[1]


def test_many_ranks_loopback():
    res = run_loopback(PRESETS["wide-tp"], 2, 4, 16, 2)
    assert len(res) == 16 and all(r.signals_sent == r.signals_received == 15 * 2 * 2 * 2 for r in res)


def test_errors():
    g = build_graph(PRESETS["tiny"], 2, 8, rank=0, ranks=2)
    with pytest.raises(UserError, match="needs a multi-rank transport"):
        Sim(g, 1).run()
    tr = LoopbackTransport(2)
    with pytest.raises(UserError, match="loopback: 1 sims for 2 ranks"):
        tr.run([Sim(g, 1, transport=tr.port(0))])
    tr = LoopbackTransport(2, lookahead_ns=3000)
    with pytest.raises(UserError, match="lookahead_ns: expected 1..2500 .the smallest comm_ns., got 3000"):
        tr.run([Sim(build_graph(PRESETS["tiny"], 2, 8, rank=r, ranks=2), 1, transport=tr.port(r))
                for r in range(2)])
    with pytest.raises(RuntimeError, match="signal to rank 0 of 2"):
        RankPort(0, 2).send(3, 0, 1, 10)
