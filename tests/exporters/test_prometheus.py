"""Prometheus metrics: scraped over HTTP from the endpoint, parsed from the exposition
text; histogram invariants, exact sums and counts, coverage counters, label hygiene."""
import math
import urllib.error
import urllib.request

import pytest

from dtrace_mk.collectors.records import Names
from dtrace_mk.exporters.prometheus import (CONTENT_TYPE, MetricsRegistry, MetricsServer,
                                            parse_exposition)

from exporter_helpers import two_rank_run

NAMES = Names.standard()


def scrape(url):
    with urllib.request.urlopen(url, timeout=10) as r:
        assert r.headers["Content-Type"] == CONTENT_TYPE
        return parse_exposition(r.read().decode())


@pytest.fixture(scope="module")
def run_records():
    return two_rank_run()


def samples(fams, family, name=None, **labels):
    return [(n, l, v) for n, l, v in fams[family]["samples"]
            if (name is None or n == name) and all(l.get(k) == str(x) for k, x in labels.items())]


def one(fams, family, name=None, **labels):
    (s,) = samples(fams, family, name, **labels)
    return s[2]


def test_scrape_endpoint_serves_live_summaries(run_records):
    res, tr = run_records
    reg = MetricsRegistry()
    with MetricsServer(reg, port=0) as srv:
        assert srv.url.startswith("http://127.0.0.1:")
        empty = scrape(srv.url)
        assert empty["dtrace_mk_task_duration_seconds"]["type"] == "histogram"
        assert empty["dtrace_mk_task_duration_seconds"]["samples"] == []
        reg.observe_records(tr.summaries + tr.waits)      # live: the next scrape sees it
        reg.observe_result(res)
        fams = scrape(srv.url)
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(srv.url.replace("/metrics", "/nope"), timeout=10)
        assert e.value.code == 404

    # task durations: exact count and sum per (rank, class); buckets cumulative, +Inf == count
    for r in (0, 1):
        for cid, cname in enumerate(NAMES.task_classes):
            stats = [c for s in tr.summaries if s.rank == r for c in s.classes if c.task_class == cid]
            if not stats:
                assert not samples(fams, "dtrace_mk_task_duration_seconds", rank=r, task_class=cname)
                continue
            n = sum(c.count for c in stats)
            tot = sum(c.dur_sum_ns for c in stats) / 1e9
            fam = "dtrace_mk_task_duration_seconds"
            assert one(fams, fam, fam + "_count", rank=r, task_class=cname) == n
            assert math.isclose(one(fams, fam, fam + "_sum", rank=r, task_class=cname), tot, rel_tol=1e-9)
            buckets = samples(fams, fam, fam + "_bucket", rank=r, task_class=cname)
            vals = [v for _, _, v in buckets]
            assert vals == sorted(vals) and buckets[-1][1]["le"] == "+Inf" and vals[-1] == n
            les = [float(l["le"]) for _, l, _ in buckets]
            assert les == sorted(les)
            dw = sum(c.dep_wait_sum_ns for c in stats) / 1e9
            assert math.isclose(one(fams, "dtrace_mk_dependency_wait_seconds_total", rank=r,
                                    task_class=cname), dw, rel_tol=1e-9)
    # remote wait by peer and op: the injected stall shows in rank 0's attention waits
    fam = "dtrace_mk_remote_wait_seconds"
    for r, p in ((0, 1), (1, 0)):
        for op in NAMES.comm_ops:
            ws = [w for w in tr.waits if w.rank == r and w.peer == p and NAMES.comm_op(w.comm_op) == op]
            assert one(fams, fam, fam + "_count", rank=r, peer=p, comm_op=op) == len(ws)
            assert math.isclose(one(fams, fam, fam + "_sum", rank=r, peer=p, comm_op=op),
                                sum(w.wait_end_ns - w.wait_begin_ns for w in ws) / 1e9, rel_tol=1e-9)
    slow = one(fams, fam, fam + "_sum", rank=0, peer=1, comm_op="allreduce_attn")
    fast = one(fams, fam, fam + "_sum", rank=1, peer=0, comm_op="allreduce_attn")
    assert slow - fast > 300e-6                   # 2 layers x 200 us late
    # coverage counters add up and obey eligible = executed + throttled + lost
    fam = "dtrace_mk_coverage_events_total"
    for r in (0, 1):
        cov = {st: one(fams, fam, rank=r, state=st) for st in ("eligible", "executed", "throttled", "lost")}
        assert cov["eligible"] == sum(s.coverage.eligible for s in tr.summaries if s.rank == r) > 0
        assert cov["eligible"] == cov["executed"] + cov["throttled"] + cov["lost"]
        assert one(fams, "dtrace_mk_epochs_total", rank=r) == 4
        assert one(fams, "dtrace_mk_queue_depth", rank=r) == \
            max(tr.summaries, key=lambda s: (s.rank == r, s.epoch)).queue_depth_max
    assert one(fams, "dtrace_mk_findings", rank=1, cause="remote_stall") >= 1
    # every counter is named *_total; no label is high-cardinality
    for name, fam_d in fams.items():
        if fam_d["type"] == "counter":
            assert name.endswith("_total")
        for _, labels, _ in fam_d["samples"]:
            assert set(labels) <= {"rank", "task_class", "peer", "comm_op", "state", "cause", "le",
                                   "exporter"}


def test_registry_refuses_bad_labels_and_counter_names():
    from dtrace_mk.exporters.prometheus import Counter, Histogram
    with pytest.raises(ValueError, match="high-cardinality"):
        Histogram("x_seconds", "h", ("rank", "task_index"), (1.0,))
    with pytest.raises(ValueError, match="must end in _total"):
        Counter("x_seconds", "h", ("rank",))
    reg = MetricsRegistry()
    with pytest.raises(ValueError, match="labels"):
        reg.epochs.inc(rank="0", request_id="7")


def test_exposition_escapes_and_formats():
    reg = MetricsRegistry()
    reg.observe_task(0, 'we"ird\\class\n', 2_000)              # ns
    reg.observe_task(0, 'we"ird\\class\n', 1_000_000_000)
    text = reg.render()
    assert 'task_class="we\\"ird\\\\class\\n"' in text
    fams = parse_exposition(text)
    fam = "dtrace_mk_task_duration_seconds"
    b = {l["le"]: v for n, l, v in fams[fam]["samples"] if n == fam + "_bucket"}
    assert b["1e-06"] == 0 and b["2.5e-06"] == 1 and b["0.1"] == 1 and b["+Inf"] == 2
    assert next(l for n, l, v in fams[fam]["samples"])["task_class"] == 'we"ird\\class\n'
    with pytest.raises(ValueError, match="line 1"):
        parse_exposition("not a metric line !\n")
    assert parse_exposition('# TYPE a_total counter\na_total{x="p\\\\n"} 1\n')["a_total"]["samples"][0][1] \
        == {"x": "p\\n"}                         # an escaped backslash before n is not a newline


def test_live_record_sink_feeds_metrics_beside_the_accumulator(run_records):
    from dtrace_mk.collectors.diagnose import Accumulator
    from dtrace_mk.collectors.records import pack_stream
    from dtrace_mk.exporters.live import MetricsRecordSink, TeeRecordSink
    res, tr = run_records
    reg, acc = MetricsRegistry(), Accumulator()
    sink = TeeRecordSink(acc, MetricsRecordSink(reg))
    for r in (0, 1):
        sink.on_bytes(r, pack_stream([s for s in tr.summaries if s.rank == r]
                                     + [w for w in tr.waits if w.rank == r]
                                     + [c for c in tr.clock_samples if c.rank == r]))
    sink.on_bytes(1, b"\xc1garbage")
    sink.on_lost_records(1, 7)
    sink.on_rank_lost(1)
    with MetricsServer(reg) as srv:
        fams = scrape(srv.url)
    assert len(acc.summaries) == len(tr.summaries) and acc.bad_messages == {1: 1}
    assert one(fams, "dtrace_mk_epochs_total", rank=0) == 4
    assert one(fams, "dtrace_mk_bad_messages_total", rank=1) == 1
    assert one(fams, "dtrace_mk_records_lost_total", rank=1) == 7
    assert one(fams, "dtrace_mk_rank_lost", rank=1) == 1
    assert one(fams, "dtrace_mk_telemetry_bytes_total", rank=0) > 0


def test_two_sinks_on_one_registry_share_families():
    from dtrace_mk.exporters.live import MetricsRecordSink
    reg = MetricsRegistry()
    a, b = MetricsRecordSink(reg), MetricsRecordSink(reg)
    a.on_lost_records(0, 2)
    b.on_lost_records(0, 3)
    fams = parse_exposition(reg.render())
    assert one(fams, "dtrace_mk_records_lost_total", rank=0) == 5
    assert reg.render().count("# TYPE dtrace_mk_records_lost_total") == 1
