"""Escalated evidence (runtime/agent.py "Escalated evidence", DTrace-style speculation):
the agent holds every task run of an epoch and ships the slowest ones only when a summary
predicate fires on that epoch; a clean run ships none.  Then the records' path: wire round
trip, the saved records, the exporters' child spans and Perfetto slices."""
from __future__ import annotations

from dtrace_mk.collectors.records import (REASON_CLASS_OUTLIER, REASON_SLOW_STEP, EpochSummary, Names,
                                          TaskEvidence, pack, unpack)
from dtrace_mk.megakernel.faults import FaultTable
from dtrace_mk.megakernel.graph import build_graph
from dtrace_mk.megakernel.presets import get_preset
from dtrace_mk.megakernel.sim import Sim
from dtrace_mk.runtime import agent as A
from dtrace_mk.runtime.agent import ListChannel, RankAgent

WORKERS = 16
NAMES = Names.standard()


def _run(steps=10, faults=(), escalate=True, batch=4):
    g = build_graph(get_preset("tiny"), batch, WORKERS)
    ch = ListChannel()
    agent = RankAgent(0, ch, num_workers=WORKERS, schema=g.schema, escalate=escalate)
    res = Sim(g, steps, sink=agent.sink, hooks=agent.hooks,
              faults=FaultTable.from_specs(list(faults), "test")).run()
    stats = agent.close()
    return g, ch.records(), stats, res


def _evidence(recs):
    return [r for r in recs if isinstance(r, TaskEvidence)]


def test_a_clean_run_holds_every_run_and_ships_none():
    g, recs, stats, _ = _run(steps=10)
    assert _evidence(recs) == []
    assert stats.held_runs == 10 * sum(1 for t in g.tasks if not t.dynamic)     # every task:end held
    assert stats.escalated_epochs == stats.escalated_runs == 0


def test_a_slow_class_instance_is_escalated_for_its_step_only():
    """One layer's mlp_down 80 us slower at step 6 (tiny's tasks take a few us): its runs
    are the class outliers of step 6, shipped with their identity; no other step ships."""
    down = NAMES.task_class_id("mlp_down")
    g, recs, stats, res = _run(steps=10, faults=[
        {"kind": "slow_task_class", "task_class": "mlp_down", "layer": 1, "extra_us": 80, "steps": [6]}])
    ev = _evidence(recs)
    assert ev and {e.step for e in ev} == {6} and len(ev) <= A.ESCALATE_MAX
    assert stats.escalated_epochs == 1 and stats.escalated_runs == len(ev)
    slow = [e for e in ev if e.reason == REASON_CLASS_OUTLIER]
    assert slow and all(e.task_class == down and e.layer == 1 for e in slow)
    by_index = {t.index: t for t in g.tasks}
    for e in ev:
        t = by_index[e.task_index]
        assert (t.cls, t.layer, t.tile_packed) == (e.task_class, e.layer, e.tile)
        assert e.end_ns - e.begin_ns >= 80_000 if e in slow else e.end_ns > e.begin_ns
        assert res.step_start_ns[6] <= e.begin_ns < e.end_ns <= res.step_end_ns[6] + 10_000
    # evidence goes out before its epoch's summary (a live exporter builds the step at it)
    kinds = [(type(r).__name__, getattr(r, "step", getattr(r, "epoch", None))) for r in recs
             if isinstance(r, (TaskEvidence, EpochSummary))]
    assert kinds.index(("TaskEvidence", 6)) < kinds.index(("EpochSummary", 6))


def test_a_slow_step_escalates_its_relatively_slowest_runs(monkeypatch):
    """Every class slower by a little at step 7 (no outlier within a class): the step is
    slower than the median of the history, so its slowest runs go out as slow_step."""
    monkeypatch.setattr(A, "OUTLIER_FACTOR", 1e9)         # only the step predicate can fire
    faults = [{"kind": "slow_task_class", "task_class": c, "extra_us": 6, "steps": [7]}
              for c in ("qkv", "attn", "attn_o", "mlp_gate_up", "mlp_down")]
    _, recs, stats, _ = _run(steps=10, faults=faults)
    ev = _evidence(recs)
    assert {e.step for e in ev} == {7} and len(ev) == A.ESCALATE_MAX
    assert all(e.reason == REASON_SLOW_STEP for e in ev)
    s = {r.epoch: r for r in recs if isinstance(r, EpochSummary)}
    assert s[7].step_ns > A.SLOW_STEP_FACTOR * sorted(x.step_ns for k, x in s.items() if k < 7)[3]


def test_escalation_off_holds_nothing():
    _, recs, stats, _ = _run(steps=8, escalate=False, faults=[
        {"kind": "slow_task_class", "task_class": "mlp_down", "extra_us": 80, "steps": [6]}])
    assert _evidence(recs) == [] and stats.held_runs == 0


def test_the_summaries_do_not_change_with_escalation():
    """The held-evidence monitor is an attachment of its own: the summaries (and their
    coverage) are the same with it and without it."""
    faults = [{"kind": "slow_task_class", "task_class": "attn", "extra_us": 50, "steps": [5]}]
    on = [r for r in _run(steps=8, faults=faults)[1] if isinstance(r, EpochSummary)]
    off = [r for r in _run(steps=8, faults=faults, escalate=False)[1] if isinstance(r, EpochSummary)]
    assert on == off


def test_wire_round_trip():
    e = TaskEvidence(3, 12, 5, 2, (1 << 16) | 7, 901, 17, 1_000_000, 1_090_000, REASON_CLASS_OUTLIER)
    assert unpack(pack(e)) == e


def test_exporters_make_child_spans_and_slices(tmp_path):
    """A saved result with escalated evidence: the records file keeps it, the spans have an
    'evidence:' child of the rank's step span, the Perfetto trace an evidence slice."""
    from dtrace_mk.exporters.batch import build_batch, load_records, save_result
    from dtrace_mk.exporters.spans import build_spans
    from dtrace_mk.collectors.diagnose import Accumulator
    _, recs, _, _ = _run(steps=10, faults=[
        {"kind": "slow_task_class", "task_class": "mlp_down", "layer": 1, "extra_us": 80, "steps": [6]}])
    acc = Accumulator()
    for r in recs:
        acc.add(r)
    res = acc.result(None)
    path = save_result(tmp_path / "r.json", res, acc)
    rs = load_records(tmp_path / "r.records.msgpack")
    assert rs.evidence == _evidence(recs)
    batch = build_batch(res, rs)
    assert [e.name for e in batch.evidence][0].startswith("mlp_down L1 tile ")
    assert batch.evidence[0].attributes["reason"] == "class_outlier"
    spans = build_spans(batch)
    ev = [s for s in spans if s.name.startswith("evidence: mlp_down L1")]
    step = {s.context.span_id: s for s in spans if s.name.startswith("step")}
    assert ev and all(s.parent.span_id in step for s in ev)
    assert all(step[s.parent.span_id].attributes["dtrace_mk.step"] == 6 for s in ev)
    assert path.is_file()
    # Perfetto: an "evidence" track of rank 0 with one slice per escalated run
    import sys
    from pathlib import Path
    from dtrace_mk.exporters.perfetto import build_perfetto
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "exporters"))
    from test_perfetto import check_well_formed, decode, summarize
    tr = decode(build_perfetto(batch)[0])
    check_well_formed(tr)
    tracks, events = summarize(tr)
    ev_tracks = {u for u, d in tracks.items() if d.name == "evidence"}
    names = [e.track_event.name for e in events if e.track_event.track_uuid in ev_tracks and e.track_event.type == 1]
    assert sorted(names) == sorted(e.name for e in batch.evidence)


def test_evidence_names_unpack_the_tile_and_skip_a_missing_layer():
    from dtrace_mk.exporters.batch import evidence_of
    lm = NAMES.task_class_id("lm_head")
    ev = evidence_of([TaskEvidence(0, 3, lm, 0xFFFFFFFF, 5, 9, 2, 10, 20, REASON_SLOW_STEP),
                      TaskEvidence(1, 3, 1, 2, (3 << 16) | 4, 9, 2, 10, 20, REASON_CLASS_OUTLIER)], NAMES)
    assert [e.name for e in ev] == ["lm_head tile 5", f"{NAMES.task_class(1)} L2 tile 4,3"]
    assert ev[1].attributes == {"class": NAMES.task_class(1), "layer": 2, "tile": "4,3", "task_index": 9,
                                "worker": 2, "reason": "class_outlier"}
