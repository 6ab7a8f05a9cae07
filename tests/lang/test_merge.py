"""Several ranks' output as one view (lang.printing.merge_blocks, `dtrace-mk attach
--merge`).  The defining property, for every aggregation: the events split between two
"ranks" and each rank's maps merged give what ONE runtime fed all the events gives --
the same entries, the same values, the same coverage."""
from __future__ import annotations

import struct
import sys
from pathlib import Path

import pytest

from dtrace_mk.abi import context
from dtrace_mk.lang import printing
from dtrace_mk.lang.host import run_events
from dtrace_mk.lang.pipeline import compile_query
from dtrace_mk.launch.api import render_output

sys.path.insert(0, str(Path(__file__).resolve().parent))
from golden_util import EVENTS  # noqa: E402

QUERIES = [
    "task:end { @c[task.class] = count(); }",
    "task:end { @c = count(); }",
    "task:end { @s[task.class, task.layer] = sum(task.dur_ns); }",
    "task:end { @s = sum(task.dur_ns); }",
    "task:end { @a[task.class] = avg(task.dur_ns); }",
    "task:end { @a = avg(task.dur_ns); }",
    "task:end { @mn[task.layer] = min(task.dur_ns); }",
    "task:end { @mx[task.layer] = max(task.dur_ns); }",
    "task:end { @st[task.class] = stats(task.dur_ns); }",
    "task:end { @h[task.class] = hist(task.dur_ns); }",
    "task:end { @h = hist(task.dur_ns); }",
    "task:end { @l[task.layer] = lhist(task.dur_ns, 0, 40000, 2500); }",
    "dep:release { @w[dep.event] = sum(dep.wait_ns); } task:end /task.class == \"attn\"/ { @slow = max(task.dur_ns); }",
]


def _records(name):
    return context.read_events(EVENTS / name)


def _worker(rec: bytes) -> int:
    return struct.unpack_from("<I", rec, context.OFF_WORKER)[0]


def _maps(blocks):
    """Map blocks by name, entries as a key -> value dict (their order is checked apart)."""
    return {b["name"]: ({tuple(e["key"]): e["value"] for e in b["entries"]}, b["coverage"])
            for b in blocks if b["type"] == "map"}


COMM = ["comm:wait { @rw[comm.peer, comm.op] = sum(comm.wait_ns); @n[comm.op] = count(); }",
        "comm:wait { @h[comm.op] = hist(comm.wait_ns); @m = stats(comm.wait_ns); }"]


@pytest.mark.parametrize("query, events", [(q, e) for e in ("decode.jsonl", "moe.jsonl") for q in QUERIES]
                         + [(q, "comm.jsonl") for q in COMM])
def test_two_ranks_merged_equal_one_runtime_over_all_events(query, events):
    obj = compile_query(query).obj
    recs = _records(events)
    workers = max(_worker(r) for r in recs) + 1
    rank0 = [r for r in recs if _worker(r) % 2 == 0]
    rank1 = [r for r in recs if _worker(r) % 2 == 1]
    assert rank0 and rank1
    whole = run_events(obj, recs, num_workers=workers)
    parts = [run_events(obj, rank0, num_workers=workers), run_events(obj, rank1, num_workers=workers)]
    merged = printing.merge_blocks(parts)
    assert _maps(merged) == _maps(whole)
    assert any(b["entries"] for b in merged if b["type"] == "map")
    for b in merged:                               # sorted as one rank's view is: by value
        if b["type"] == "map" and b["agg"] not in ("hist", "lhist"):
            vals = [printing._sort_value(b["agg"], e["value"]) for e in b["entries"]]
            assert vals == sorted(vals)
    # and it renders as one view (the text of the whole run, up to the order of equal values)
    assert sorted(printing.render_text(merged).splitlines()) == sorted(printing.render_text(whole).splitlines())


def _block(name, agg, entries, cov=(0, 0, 0, 0), reasons=None, layout=None):
    b = {"type": "map", "when": "exit", "name": name, "agg": agg, "keys": ["k"], "entries": entries,
         "coverage": dict(zip(("eligible", "executed", "throttled", "lost"), cov), reasons=reasons or {})}
    if layout:
        b["layout"] = layout
    return b


LOG2 = {"buckets": 64, "layout": "log2"}   # (abi.HIST_LOG2_BUCKETS)


@pytest.mark.parametrize("agg, a, b, want", [
    ("count", 3, 4, 7),
    ("sum", 10, 0, 10),
    ("min", 5, 2, 2),
    ("max", 5, 2, 5),
    ("avg", {"count": 2, "sum": 10, "avg": 5}, {"count": 1, "sum": 2, "avg": 2}, {"count": 3, "sum": 12, "avg": 4}),
    ("stats", {"count": 2, "sum": 10, "avg": 5, "min": 4, "max": 6},
     {"count": 0, "sum": 0, "avg": 0, "min": 0, "max": 0},          # an empty rank's min does not count
     {"count": 2, "sum": 10, "avg": 5, "min": 4, "max": 6}),
    ("stats", {"count": 1, "sum": 7, "avg": 7, "min": 7, "max": 7},
     {"count": 3, "sum": 6, "avg": 2, "min": 1, "max": 3},
     {"count": 4, "sum": 13, "avg": 3, "min": 1, "max": 7}),
])
def test_values_merge_by_aggregation(agg, a, b, want):
    m = printing.merge_blocks([[_block("@x", agg, [{"key": [1], "value": a}])],
                               [_block("@x", agg, [{"key": [1], "value": b}])]])
    assert m[0]["entries"] == [{"key": [1], "value": want}]


def test_histograms_merge_bucket_by_bucket_and_fill_the_gap():
    """Rank 0 saw [1] and [2, 4), rank 1 [16, 32): the merged range is contiguous as one
    rank's would be (the empty buckets in between shown with 0)."""
    r0 = [{"key": [0], "value": printing.hist_buckets({"value": LOG2}, [0, 3, 1] + [0] * 61)}]
    r1 = [{"key": [0], "value": printing.hist_buckets({"value": LOG2}, [0, 1, 0, 0, 0, 2] + [0] * 58)}]
    m = printing.merge_blocks([[_block("@h", "hist", r0, layout=LOG2)], [_block("@h", "hist", r1, layout=LOG2)]])
    got = [(b["label"], b["count"]) for b in m[0]["entries"][0]["value"]]
    assert got == [("[1]", 4), ("[2, 4)", 1), ("[4, 8)", 0), ("[8, 16)", 0), ("[16, 32)", 2)]


def test_linear_histogram_edges_round_trip():
    lin = {"buckets": 6, "layout": "linear", "lo": 0, "hi": 40, "step": 10}
    counts = [2, 1, 0, 3, 1, 4]                    # under, [0,10), [10,20), [20,30), [30,40), over
    assert printing.bucket_counts(lin, printing.hist_buckets({"value": lin}, counts)) == counts
    log = [5] + [0] * 62 + [1]                     # [0] and the overflow bucket
    assert printing.bucket_counts(LOG2, printing.hist_buckets({"value": LOG2}, log)) == log


def test_coverage_is_summed_and_the_warning_stays():
    m = printing.merge_blocks([[_block("@c", "count", [], (10, 10, 0, 0))],
                               [_block("@c", "count", [], (5, 2, 1, 2), {"map_full": 2, "rate": 1})]])
    assert m[0]["coverage"] == {"eligible": 15, "executed": 12, "throttled": 1, "lost": 2,
                                "reasons": {"map_full": 2, "rate": 1}}
    text = printing.render_text(m)
    assert "coverage @c: eligible 15, executed 12, throttled 1, lost 2" in text
    assert "WARNING: @c: 2 lost and 1 throttled of 15 eligible events (map_full 2, rate 1)" in text


def test_other_blocks_keep_their_rank():
    m = printing.merge_blocks([[{"type": "text", "when": "END", "text": "done"}],
                               [{"type": "text", "when": "END", "text": "done"},
                                {"type": "warning", "text": "evidence: 3 records refused"}]], ranks=[4, 7])
    assert printing.render_text(m).splitlines() == ["[rank 4] done", "[rank 7] done",
                                                    "[rank 7] WARNING: evidence: 3 records refused"]


def _msg(parts, final=True):
    return {"id": 3, "final": final, "ranks": {str(r): p for r, p in parts.items()}}


def test_render_merged_header_names_ranks_and_steps():
    a = {"step": 23, "attached_at": 2, "blocks": [_block("@c", "count", [{"key": ["attn"], "value": 2}], (2, 2, 0, 0))]}
    b = {"step": 21, "attached_at": 2, "blocks": [_block("@c", "count", [{"key": ["attn"], "value": 5}], (5, 5, 0, 0))]}
    c = {"step": 0, "attached_at": 2, "blocks": []}
    out = render_output(_msg({0: a, 1: b, 2: c}), "text", merge=True).splitlines()
    assert out[0] == ("-- query 3, ranks 0, 1 merged (final; step 21..23, attached at step 2); "
                      "no output yet from rank 2 --")
    assert out[1] == "@c[attn]: 7"
    assert out[2] == "coverage @c: eligible 7, executed 7, throttled 0, lost 0"
    rows = render_output(_msg({0: a, 1: b}), "json", merge=True).splitlines()
    import json
    row = json.loads(rows[0])
    assert (row["ranks"], row["steps"], row["query"], row["entries"]) == ([0, 1], [23, 21], 3,
                                                                          [{"key": ["attn"], "value": 7}])
    assert render_output(_msg({0: c}, final=False), merge=True) == \
        "-- query 3, ranks none merged; no output yet from rank 0 --\n(no output yet)\n"


def _tick(probe, ts_ms, steps=None):
    b = {"type": "interval", "probe": probe, "ts_ns": ts_ms * 1_000_000}
    if steps is not None:
        b["steps"] = steps
    return b


def test_two_ticks_in_one_part_stay_two_views_paired_by_occurrence():
    """A report can carry several ticks of an interval clause; the n-th tick's maps merge
    with the n-th of every other rank (print without clear: cumulative values -- summing a
    rank's two ticks would count its first interval twice), under one header per tick."""
    def c(v, when="interval:ms:1000"):
        b = _block("@c", "count", [{"key": ["attn"], "value": v}], (v, v, 0, 0))
        b["when"] = when
        return b
    r0 = [_tick("interval:ms:1000", 1000, [4, 7]), c(10), _tick("interval:ms:1000", 2000, [8, 11]), c(25),
          c(27, "interval")]
    r1 = [_tick("interval:ms:1000", 1000, [5, 8]), c(3), _tick("interval:ms:1000", 2000, [9, 9]), c(4),
          c(6, "interval")]
    m = printing.merge_blocks([r0, r1])
    assert [(b["type"], b.get("entries", [{}])[0].get("value")) for b in m] == \
        [("interval", None), ("map", 13), ("interval", None), ("map", 29), ("map", 33)]
    text = printing.render_text(m).splitlines()
    assert text[0] == "-- interval:ms:1000 at 1000.000 ms (rank 0: steps 4-7; rank 1: steps 5-8) --"
    assert text[4] == "-- interval:ms:1000 at 2000.000 ms (rank 0: steps 8-11; rank 1: steps 9-9) --"
    # a rank with a tick more than the other: that tick stays its own
    m = printing.merge_blocks([r0[:2], r1[:4]], ranks=[0, 1])
    assert [b.get("entries", [{}])[0].get("value") for b in m if b["type"] == "map"] == [13, 4]
    assert printing.render_text([h for h in m if h["type"] == "interval"][1:]) == \
        "-- interval:ms:1000 at 2000.000 ms (rank 1: steps 9-9) --\n"
    # ticks of fed queries (sim ranks) have no steps: the header names the ranks
    m = printing.merge_blocks([[_tick("interval:ms:5", 5)], [_tick("interval:ms:5", 5)]], ranks=[2, 3])
    assert printing.render_text(m) == "-- interval:ms:5 at 5.000 ms (ranks 2, 3) --\n"
    # a job's aligned cuts (every rank's tick covers the same steps): the steps once
    m = printing.merge_blocks([[_tick("interval:ms:5", 5, [4, 7])], [_tick("interval:ms:5", 5, [4, 7])]])
    assert printing.render_text(m) == "-- interval:ms:5 at 5.000 ms, steps 4-7 (ranks 0, 1) --\n"
