"""Device queries' interval clauses cut at step boundaries (runtime/device_query.py).

The "device" is `summary_windows.ReferenceDevice` (the device runtime protocol over a
reference runtime the test fires with each step's records when the step runs, as the
device VM runs over the kernel's records); `final` trails `started` like a kernel that
runs ahead of its flushes.  Each case checks what an interval prints against the events
of exactly the steps its header names, computed here from the records."""
from collections import Counter

import pytest

from dtrace_mk.abi import context
from dtrace_mk.lang import compile_query, render_text
from dtrace_mk.errors import UserError
from dtrace_mk.runtime.device_query import BufferedQueryRun, DeviceQueryRun, device_query_run
from dtrace_mk.runtime.reference import PARKED
from dtrace_mk.runtime.summary_windows import ReferenceDevice

WORKERS = 4
MS = 1_000_000


def _step(k):
    """Step k's records: task:end of classes 0..2 on every worker, k + 1 of class 0 on
    worker 0 (so each step's counts differ), durations that grow with the step."""
    recs = []
    for w in range(WORKERS):
        for c in range(3):
            for i in range((k + 1) if (w, c) == (0, 0) else 1):
                recs.append(context.pack("task:end", decode_step=k, worker=w, task_class=c,
                                         dur_ns=1000 * (k + 1) + 7 * i, ts_ns=k * MS))
    return recs


def _query(text, dev=None):
    """The QueryRun launch.api makes for `text` on a device runtime (device_query_run)."""
    dev = dev or ReferenceDevice(WORKERS)
    q = device_query_run(compile_query(text).obj, dev)
    q.begin()
    return dev, q


def _run(dev, q, steps, tick_at=(), ahead=2):
    """Run steps (the kernel `ahead` steps in front of its flushes), ticking the query's
    host clock once after each step in tick_at (1 ms per tick: interval:ms:1 fires)."""
    clock = 0
    q.tick(clock)
    for k in steps:
        dev.run_step(_step(k))
        dev.final = k - ahead
        if k in tick_at:
            clock += MS
        q.tick(clock)                           # (no clause due: a DeviceQueryRun drains)


def _counts(lo, hi, key=lambda r: 0):
    c = Counter()
    for k in range(lo, hi + 1):
        for r in _step(k):
            c[key(r)] += 1
    return c


def _worker(r):
    return int.from_bytes(r[context.OFF_WORKER:context.OFF_WORKER + 4], "little")


def _intervals(q):
    """[(steps, map blocks after that header)] in order."""
    out = []
    for b in q.blocks:
        if b["type"] == "interval":
            out.append((b["steps"], []))
        elif b["type"] == "map" and out and b["when"].startswith("interval"):
            out[-1][1].append(b)
    return out


def test_print_and_clear_each_interval_holds_exactly_its_steps():
    dev, q = _query("task:end { @n[worker] = count(); } interval:ms:1 { print(@n); clear(@n); }")
    assert isinstance(q, DeviceQueryRun)                 # the hot tier cuts
    _run(dev, q, range(0, 12), tick_at={3, 7, 8})
    dev.final = 11                              # the launch ended: every step flushed
    q.finish()
    got = _intervals(q)
    assert [s for s, _ in got] == [[0, 3], [4, 7], [8, 8]]
    for (lo, hi), (m,) in got:
        want = _counts(lo, hi, _worker)
        assert {e["key"][0]: e["value"] for e in m["entries"]} == dict(want)
        assert m["coverage"]["eligible"] == m["coverage"]["executed"] == sum(want.values())
    (last,) = [b for b in q.blocks if b["type"] == "map" and b["when"] == "exit"]
    assert {e["key"][0]: e["value"] for e in last["entries"]} == dict(_counts(9, 11, _worker))
    assert dev.cleared == []                    # nothing emptied on the device
    assert len(dev.attached) == 4 and dev.detached == dev.attached[:3]
    assert [dev.firsts[a] for a in dev.attached] == [0, 4, 8, 9]


def test_a_clause_waits_until_its_steps_are_final_and_clauses_keep_their_order():
    dev, q = _query('task:end { @n = count(); } interval:ms:1 { print(@n); clear(@n); } '
                    'interval:ms:2 { print("two"); }')
    _run(dev, q, range(0, 4), tick_at={3}, ahead=3)      # final = 0: step 3's cut is not final
    assert [b["type"] for b in q.blocks] == []           # the text clause waits behind the cut
    dev.final = 2                                        # steps 0-2 final (the boundary is 4)
    q.drain()
    assert q.blocks == []
    dev.final = 3
    q.drain()
    assert [b["type"] for b in q.blocks] == ["interval", "map"]
    q.tick(2 * MS)                                       # interval:ms:1 again (step 4 unstarted) + ms:2
    dev.run_step(_step(4))
    dev.final = 4
    q.drain()
    kinds = [(b["type"], b.get("probe") or b.get("text")) for b in q.blocks]
    assert kinds[2:] == [("interval", "interval:ms:1"), ("map", None), ("interval", "interval:ms:2"),
                         ("text", "two")]
    assert q.blocks[2]["steps"] == [4, 3]                # a cut with no new step: nothing in it
    assert q.blocks[3]["entries"][0]["value"] == 0
    assert "no new step" in render_text(q.blocks[2:3])


def test_print_without_clear_accumulates_across_cuts():
    dev, q = _query("task:end { @n = count(); @d = hist(task.dur_ns); @s = stats(task.dur_ns); } "
                    "interval:ms:1 { print(@n); print(@d); print(@s); }")
    _run(dev, q, range(0, 10), tick_at={2, 5})
    dev.final = 9
    q.drain()
    got = _intervals(q)
    assert [s for s, _ in got] == [[0, 2], [3, 5]]
    ref_dev, ref = _query("task:end { @n = count(); @d = hist(task.dur_ns); @s = stats(task.dur_ns); }")
    for k in range(0, 6):                       # one attachment fed steps 0-5: the second print
        ref_dev.run_step(_step(k))
    want = {b["name"]: b for b in (ref.block(pm, "x") for pm in ref.plan["maps"])}
    for m in got[1][1]:
        assert m["entries"] == want[m["name"]]["entries"], m["name"]
        assert m["coverage"] == want[m["name"]]["coverage"]
    assert sum(b["value"] for b in got[0][1][0]["entries"]) == sum(_counts(0, 2).values())


def test_a_cleared_unkeyed_count_prints_zero_and_a_report_adds_the_live_steps():
    dev, q = _query("task:end { @n = count(); } interval:ms:1 { clear(@n); print(@n); }")
    _run(dev, q, range(0, 6), tick_at={2})
    dev.final = 5
    q.drain()                                    # the clause at boundary 3 ran: clear, then print
    (_, (z,)), = _intervals(q)
    assert z["entries"] == [{"key": [], "value": 0}] and z["coverage"]["eligible"] == 0
    (m,) = [q.block(pm, "interval") for pm in q.plan["maps"]]      # a report: + the live segment
    assert m["entries"][0]["value"] == m["coverage"]["eligible"] == sum(_counts(3, 5).values())


def test_no_cut_before_the_query_has_started_a_step():
    dev, q = _query("task:end { @n = count(); } interval:ms:1 { print(@n); clear(@n); }")
    q.tick(0)
    q.tick(MS)                                   # nothing started: the cut is the first step
    assert len(dev.attached) == 1
    dev.run_step(_step(0))
    dev.final = 0
    q.drain()
    assert _intervals(q)[0][0] == [0, -1]


def test_exit_in_an_ended_segment_is_seen_when_it_is_folded():
    dev, q = _query("task:end /step == 1/ { exit(); } task:end { @n = count(); } "
                    "interval:ms:1 { print(@n); clear(@n); }")
    _run(dev, q, range(0, 3), tick_at={1}, ahead=5)   # exit() ran in segment 0 (steps 0-1)
    assert not q.exited
    assert q.poll_exit()                               # every live segment's exit map is read


def test_evidence_of_every_segment_is_printed_at_the_end():
    dev, q = _query("task:end /task.class == 1 && worker == 0/ { evidence(step); @n = count(); } "
                    "interval:ms:1 { print(@n); clear(@n); }")
    _run(dev, q, range(0, 6), tick_at={1, 3})
    dev.final = 5
    blocks = q.finish()
    steps = [b["fields"]["step"] for b in blocks if b["type"] == "evidence"]
    assert sorted(steps) == list(range(0, 6))
    assert len(dev.attached) == 3


def test_a_clause_without_map_actions_makes_no_cut():
    dev, q = _query('task:end { @n = count(); } interval:ms:1 { print("tick"); }')
    _run(dev, q, range(0, 4), tick_at={1, 3})
    assert len(dev.attached) == 1
    assert [b.get("text") for b in q.blocks if b["type"] == "text"] == ["tick", "tick"]
    assert all("steps" not in b for b in q.blocks if b["type"] == "interval")


def _buffered(text, tier="compiled"):
    dev = ReferenceDevice(WORKERS)
    dev.tier = tier
    return _query(text, dev)


@pytest.mark.parametrize("tier", ["compiled", "auto"])
def test_outside_the_hot_tier_two_attachments_take_turns_and_each_interval_is_exact(tier):
    """A BufferedQueryRun: the query and a parked twin, attached once; each cut rearms the
    idle one (no attach: nothing for the tier to build), a folded one is emptied on the
    device and waits.  Every interval holds exactly its steps, over several turns."""
    dev, q = _buffered("task:end { @n[worker] = count(); @d = hist(task.dur_ns); } "
                       "interval:ms:1 { print(@n); print(@d); clear(@n); clear(@d); }", tier)
    assert isinstance(q, BufferedQueryRun)
    a, b = dev.attached
    assert dev.firsts[b] == PARKED
    _run(dev, q, range(0, 16), tick_at={2, 5, 9, 12}, ahead=1)
    dev.final = 15
    q.finish()
    got = _intervals(q)
    assert [s for s, _ in got] == [[0, 2], [3, 5], [6, 9], [10, 12]]
    ref_dev, ref = _query("task:end { @n[worker] = count(); @d = hist(task.dur_ns); }")
    for (lo, hi), (n, d) in got:
        assert {e["key"][0]: e["value"] for e in n["entries"]} == dict(_counts(lo, hi, _worker))
        assert n["coverage"]["eligible"] == n["coverage"]["executed"] == sum(_counts(lo, hi).values())
        one = ReferenceDevice(WORKERS)                   # one attachment fed exactly steps lo..hi
        one.started = lo
        _, r = _query("task:end { @d = hist(task.dur_ns); }", one)
        for k in range(lo, hi + 1):
            one.run_step(_step(k))
        (want,) = [r.block(pm, "x") for pm in r.plan["maps"]]
        assert d["entries"] == want["entries"]
    assert dev.attached == [a, b] and dev.detached == []            # never attached again
    assert [aid for aid, _ in dev.rearmed] == [b, a, b, a]
    assert [f for _, f in dev.rearmed] == [3, 6, 10, 13]
    assert set(dev.cleared) == {"n", "d"}                           # emptied after each fold
    (last, _) = [b for b in q.blocks if b["type"] == "map" and b["when"] == "exit"]
    assert {e["key"][0]: e["value"] for e in last["entries"]} == dict(_counts(13, 15, _worker))
    assert sorted(q.attachments()) == [a, b]                        # both detached at the end


def test_a_buffered_clause_reuses_the_latest_cut_while_the_other_attachment_is_busy():
    """The idle attachment is the one folded last: a clause due before the previous cut's
    steps are final has none, and reuses the latest cut; every step is still printed once."""
    dev, q = _buffered("task:end { @n = count(); } interval:ms:1 { print(@n); clear(@n); }")
    _run(dev, q, range(0, 6), tick_at={1, 2}, ahead=4)      # step 2's tick: step 1 not final
    dev.final = 5
    q.drain()
    got = _intervals(q)
    assert [s for s, _ in got] == [[0, 1], [2, 1]]
    assert len(dev.rearmed) == 1
    for (lo, hi), (m,) in got:
        assert m["entries"][0]["value"] == sum(_counts(lo, hi).values())


def test_a_buffered_query_without_interval_map_actions_has_no_twin():
    dev, q = _buffered('task:end { @n = count(); } interval:ms:1 { print("tick"); }')
    assert len(dev.attached) == 1 and q.idle == []


def test_no_room_for_the_twin_clears_in_place_and_says_so(monkeypatch):
    dev = ReferenceDevice(WORKERS)
    dev.tier = "compiled"
    real = dev.attach
    monkeypatch.setattr(dev, "attach", lambda obj, **kw: real(obj, **kw) if not dev.attached else
                        (_ for _ in ()).throw(UserError("hook task:end already has 8 programs")))
    dev, q = _query("task:end { @n = count(); } interval:ms:1 { print(@n); clear(@n); }", dev)
    _run(dev, q, range(0, 4), tick_at={1})
    dev.final = 3
    q.drain()
    assert dev.cleared == ["n"]
    (w,) = [b for b in q.blocks if b["type"] == "warning"]
    assert "no cut at a step boundary (hook task:end already has 8 programs)" in w["text"]


def test_folded_segments_are_forgotten_once_every_worker_loaded_their_detach():
    dev, q = _query("task:end { @n = count(); } interval:ms:1 { print(@n); clear(@n); }")
    dev.lag = 1                                  # the last table change not yet loaded
    _run(dev, q, range(0, 6), tick_at={1, 3})
    dev.final = 5
    q.drain()
    assert dev.detached == dev.attached[:2]
    assert dev.forgotten == dev.attached[:1]     # the second detach is the unloaded change
    dev.lag = 0
    q.drain()
    assert dev.forgotten == dev.attached[:2]


def test_a_cut_the_runtime_refuses_clears_in_place_and_says_so(monkeypatch):
    from dtrace_mk.errors import UserError
    dev, q = _query("task:end { @n = count(); } interval:ms:1 { print(@n); clear(@n); }")
    _run(dev, q, range(0, 2), tick_at=())

    def full(*a, **k):
        raise UserError("no free attachment slot")
    monkeypatch.setattr(dev, "attach", full)
    q.tick(MS)
    q.drain()
    warn = [b["text"] for b in q.blocks if b["type"] == "warning"]
    assert warn and "no free attachment slot" in warn[0] and "in place" in warn[0]
    assert dev.cleared == ["n"]


@pytest.mark.parametrize("agg", ["count()", "sum(task.dur_ns)", "min(task.dur_ns)", "max(task.dur_ns)",
                                 "avg(task.dur_ns)", "stats(task.dur_ns)", "hist(task.dur_ns)",
                                 "lhist(task.dur_ns, 0, 20000, 2000)"])
def test_every_aggregation_folds_to_what_one_attachment_holds(agg):
    """Cuts at steps 2 and 5, no clear: the map after the second equals one attachment's
    over steps 0-5, entry for entry and coverage included."""
    text = f"task:end {{ @m[task.class] = {agg}; }}"
    dev, q = _query(text + " interval:ms:1 { print(@m); }")
    _run(dev, q, range(0, 8), tick_at={2, 5})
    dev.final = 7
    q.drain()
    ref_dev, ref = _query(text)
    for k in range(0, 6):
        ref_dev.run_step(_step(k))
    (want,) = [ref.block(pm, "x") for pm in ref.plan["maps"]]
    (m,) = _intervals(q)[1][1]
    key = lambda e: str(e["key"])              # noqa: E731  (merge orders entries its own way)
    assert sorted(m["entries"], key=key) == sorted(want["entries"], key=key)
    assert m["coverage"] == want["coverage"]


def test_at_most_max_live_segments_then_a_clause_reuses_the_latest_cut():
    """A kernel far ahead of its flushes: cuts stop at MAX_LIVE_SEGMENTS attachments (each
    holds a program slot); the clauses beyond reuse the latest boundary, and every step
    is still printed exactly once."""
    from dtrace_mk.runtime.device_query import MAX_LIVE_SEGMENTS
    dev, q = _query("task:end { @n[worker] = count(); } interval:ms:1 { print(@n); clear(@n); }")
    q.tick(0)
    alive = []
    for k in range(0, 12):
        dev.run_step(_step(k))
        dev.final = k - 6
        q.tick((k + 1) * MS)
        alive.append(len(q.segments))
    assert max(alive) == MAX_LIVE_SEGMENTS
    dev.final = 11
    q.finish()
    got = _intervals(q)
    nxt = 0
    for (lo, hi), (m,) in got:
        assert lo == nxt
        assert {e["key"][0]: e["value"] for e in m["entries"]} == dict(_counts(lo, hi, _worker))
        nxt = hi + 1
    (last,) = [b for b in q.blocks if b["type"] == "map" and b["when"] == "exit"]
    assert {e["key"][0]: e["value"] for e in last["entries"]} == dict(_counts(nxt, 11, _worker))
    assert any(hi < lo for (lo, hi), _ in got)          # some clause reused a cut


def test_ranks_told_the_same_cut_step_print_the_same_steps_even_when_one_lags():
    """A job's rank 0 decides when a clause runs and the step its cut starts at
    (launch.api: its grant + CUT_LEAD_STEPS); rank 1 runs two steps behind and learns of
    each clause late.  Both ranks' intervals name the same steps and each holds exactly
    those steps' events; the clause's time is rank 0's."""
    text = "task:end { @n[worker] = count(); } interval:ms:1 { print(@n); clear(@n); }"
    (d0, q0), (d1, q1) = _query(text), _query(text)
    q0.tick(0)
    told, clock = [], 0                         # (clause, ts, at) not yet seen by rank 1
    for k in range(0, 12):
        d0.run_step(_step(k))
        d0.final = k - 1
        if k in (3, 7):
            clock += MS
            for i, ts in q0.due_clauses(clock):
                at = d0.unstarted_step() + 1
                q0.run_clause(i, ts, at)
                told.append((i, ts, at))
        q0.drain()
        if k >= 2:                              # rank 1: two steps behind; hears one step late
            d1.run_step(_step(k - 2))
            d1.final = k - 3
            for c in [c for c in told if c[2] - 1 <= k]:
                q1.run_clause(*c)
                told.remove(c)
            q1.drain()
    for k in (10, 11):
        d1.run_step(_step(k))
    d0.final = d1.final = 11
    q0.finish()
    q1.finish()
    heads = [[b for b in q.blocks if b["type"] == "interval"] for q in (q0, q1)]
    assert [h["steps"] for h in heads[0]] == [h["steps"] for h in heads[1]] == [[0, 4], [5, 8]]
    assert [h["ts_ns"] for h in heads[0]] == [h["ts_ns"] for h in heads[1]] == [MS, 2 * MS]
    for q in (q0, q1):
        for (lo, hi), (m,) in _intervals(q):
            assert {e["key"][0]: e["value"] for e in m["entries"]} == dict(_counts(lo, hi, _worker))


def test_a_cut_step_already_started_here_cuts_at_the_first_unstarted_one():
    dev, q = _query("task:end { @n = count(); } interval:ms:1 { print(@n); clear(@n); }")
    q.tick(0)
    for k in range(0, 6):
        dev.run_step(_step(k))
    q.run_clause(0, MS, at_step=3)              # this rank is past step 3: it cuts at 6
    dev.final = 5
    q.drain()
    ((steps, (m,)),) = _intervals(q)
    assert steps == [0, 5] and m["entries"][0]["value"] == sum(_counts(0, 5).values())


def test_a_forced_clause_at_the_end_names_only_the_steps_that_started():
    """Detached before its cut step (a job's cut starts one step past the grant): the last
    clause runs at the end with what the segments hold, and its header stops at the last
    started step, not at the cut's."""
    dev, q = _query("task:end { @n = count(); } interval:ms:1 { print(@n); clear(@n); }")
    q.tick(0)
    for k in range(0, 4):
        dev.run_step(_step(k))
    q.run_clause(0, MS, at_step=9)
    dev.final = 3
    q.drain()
    assert q.blocks == []                        # step 8 is not final: the clause waits
    q.finish()
    ((steps, (m,)),) = _intervals(q)
    assert steps == [0, 3] and m["entries"][0]["value"] == sum(_counts(0, 3).values())


def test_told_the_step_of_its_latest_cut_a_rank_reuses_that_cut_however_far_it_ran():
    """Rank 0 reused its latest cut (it was at the segment cap, or nothing had started
    since) and tells that step; a rank that has run past it reuses the same cut instead of
    cutting at its own first unstarted step: both ticks name the same (empty) range."""
    dev, q = _query("task:end { @n = count(); } interval:ms:1 { print(@n); clear(@n); }")
    q.tick(0)
    dev.run_step(_step(0))
    assert q.run_clause(0, MS, at_step=2) == 2           # the cut at 2 (step 1 unstarted)
    for k in (1, 2, 3):
        dev.run_step(_step(k))
    assert q.run_clause(0, 2 * MS, at_step=2) == 2 and len(dev.attached) == 2
    dev.final = 3
    q.drain()
    assert [s for s, _ in _intervals(q)] == [[0, 1], [2, 1]]


def test_due_clauses_name_each_clause_once_even_when_two_are_the_same():
    dev, q = _query('task:end { @n = count(); } interval:ms:1 { print("a"); } interval:ms:1 { print("a"); }')
    assert q.due_clauses(0) == []                # the first tick starts the intervals
    assert q.due_clauses(2 * MS) == [(0, MS), (0, 2 * MS), (1, MS), (1, 2 * MS)]
