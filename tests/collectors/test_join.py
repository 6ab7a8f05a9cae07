import random

from dtrace_mk.collectors.join import join
from dtrace_mk.collectors.records import RemoteWait, Signal


def W(rank, peer, op, gen, b=0, e=10, step=0):
    return RemoteWait(rank, peer, op, gen, step, 0, 11, b, e)


def S(rank, peer, op, gen, t=5, step=0):
    return Signal(rank, peer, op, gen, step, 0, t)


def test_join_by_logical_key_not_time():
    waits = [W(0, 1, 0, 1), W(0, 1, 1, 1), W(1, 0, 0, 1)]
    sigs = [S(1, 0, 0, 1, t=10**12), S(1, 0, 1, 1, t=-5), S(0, 1, 0, 1)]
    res = join(waits, sigs)
    got = {(w.rank, w.peer, w.comm_op): g.key for w, g in res.pairs}
    assert got == {(0, 1, 0): (0, 1, 1, 0), (0, 1, 1): (1, 1, 1, 0), (1, 0, 0): (0, 1, 0, 1)}
    # shuffling timestamps does not change who pairs with whom
    rnd = random.Random(1)
    sigs2 = [Signal(s.rank, s.peer, s.comm_op, s.comm_gen, 0, 0, rnd.randint(0, 99)) for s in sigs]
    assert {(w, g.key) for w, g in join(waits, sigs2).pairs} == {(w, g.key) for w, g in res.pairs}


def test_direction_matters():
    # rank 0 waiting on rank 1 must not join rank 0's own signal to rank 1
    res = join([W(0, 1, 0, 3)], [S(0, 1, 0, 3)])
    assert res.pairs == [] and len(res.unmatched_waits) == 1 and res.unmatched_signals == 1


def test_tiles_group_to_last_signal():
    waits = [W(0, 1, 0, 2, b=0, e=30), W(0, 1, 0, 2, b=1, e=31)]
    sigs = [S(1, 0, 0, 2, t=t) for t in (20, 5, 25, 12)]
    res = join(waits, sigs)
    assert len(res.pairs) == 2
    g = res.pairs[0][1]
    assert (g.count, g.first_ns, g.last_ns) == (4, 5, 25)
    assert res.report()["signals"] == 4 and res.unmatched_signals == 0


def test_unmatched_and_missing_ranks_are_reported():
    waits = [W(0, 2, 0, 1), W(0, 2, 0, 2), W(0, 1, 0, 1)]
    sigs = [S(1, 0, 0, 1), S(1, 0, 0, 9)]
    res = join(waits, sigs, expected_ranks=range(3))
    assert res.missing_ranks == [2]
    assert res.unmatched_by_peer() == {2: 2}
    assert res.report() == {"waits": 3, "signals": 2, "joined_waits": 1, "unmatched_waits": 2,
                            "unmatched_waits_by_peer": {"2": 2}, "unmatched_signals": 1,
                            "missing_ranks": [2]}
