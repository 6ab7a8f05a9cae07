"""Per-step span export while a job runs (exporters.stream): records arrive step by step
as from the collector's transport; spans of a step reach a local OTLP/HTTP receiver once
every rank's epoch for it is in (or a rank is late/dead); at the end the union equals the
end-of-job export (same ids, parents, links, attributes; times within the clock fit)."""
import pytest

from dtrace_mk.collectors.diagnose import Accumulator
from dtrace_mk.exporters.batch import build_batch
from dtrace_mk.exporters.spans import build_spans
from dtrace_mk.exporters.stream import StepSpanStream

from exporter_helpers import RANK_INFO, two_rank_run
from test_otlp import Receiver, _val

TIME_ATTRS = {"dtrace_mk.comm.late_us", "dtrace_mk.comm.transfer_us"}


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.close()


def _arrivals(tr, steps):
    """Per (rank, step): that rank's records of the step, clock samples up to its end."""
    out = []
    cs = {r: sorted((c for c in tr.clock_samples if c.rank == r), key=lambda c: c.device_ns)
          for r in (0, 1)}
    for k in range(steps):
        for r in (0, 1):
            summ = [s for s in tr.summaries if s.rank == r and s.epoch == k]
            end = max(s.end_ns for s in summ)
            recs = ([w for w in tr.waits if w.rank == r and w.step == k]
                    + [s for s in tr.signals if s.rank == r and s.step == k]
                    + [c for c in cs[r] if c.device_ns <= end] + summ)
            cs[r] = [c for c in cs[r] if c.device_ns > end]
            out.append((r, k, recs))
    return out


def _feed(acc, stream, rank, recs):
    for x in recs:
        acc.on_record(rank, x)
        stream.on_record(rank, x)


def _steps_at(receiver):
    return {(_attrs(sp)["dtrace_mk.rank"], _attrs(sp)["dtrace_mk.step"])
            for _, sp in receiver.spans() if sp.name.startswith("step ")}


def _attrs(sp):
    return {a.key: _val(a.value) for a in sp.attributes}


def _end_of_job(res, tr):
    """The end-of-job span set (what export_result sends)."""
    return build_spans(build_batch(res, tr, job_id="job-2r", rank_info=RANK_INFO))


def test_steps_go_out_while_running_and_the_union_equals_the_end_of_job_set(receiver):
    steps = 8
    res, tr = two_rank_run(steps=steps)
    acc = Accumulator()
    stream = StepSpanStream(acc, [f"otlp={receiver.base}"], ranks=2, job_id="job-2r",
                            rank_info=RANK_INFO, timeout_s=10, background=False)
    arr = _arrivals(tr, steps)
    for r, k, recs in arr[:7]:          # rank 0 steps 0-3, rank 1 steps 0-2
        _feed(acc, stream, r, recs)
    assert _steps_at(receiver) == {(r, k) for r in (0, 1) for k in range(3)}   # step 3 waits for rank 1
    live_ids = {sp.span_id for _, sp in receiver.spans()}
    for r, k, recs in arr[7:]:
        _feed(acc, stream, r, recs)
    assert _steps_at(receiver) == {(r, k) for r in (0, 1) for k in range(steps)}
    assert not any(sp.name.startswith("finding") for _, sp in receiver.spans())
    rep = stream.finish(res, tr)
    assert rep["live_steps"] == steps and rep["exporters"][0]["dropped"] == 0, rep
    got = receiver.spans()
    ids = [sp.span_id for _, sp in got]
    assert len(ids) == len(set(ids)), "a span was sent twice"
    assert live_ids < set(ids)
    end = {sp.context.span_id.to_bytes(8, "big"): sp for sp in _end_of_job(res, tr)}
    assert set(ids) == set(end) and rep["spans"] == len(end)
    assert rep["end_spans"] == sum(1 for s in end.values() if s.name.startswith("finding"))
    for r, sp in got:
        e = end[sp.span_id]
        assert sp.name == e.name and sp.trace_id == e.context.trace_id.to_bytes(16, "big")
        assert sp.parent_span_id == (e.parent.span_id.to_bytes(8, "big") if e.parent else b"")
        assert [(l.trace_id, l.span_id) for l in sp.links] == \
            [(l.context.trace_id.to_bytes(16, "big"), l.context.span_id.to_bytes(8, "big")) for l in e.links]
        a, ea = _attrs(sp), {k: (list(v) if isinstance(v, tuple) else v) for k, v in e.attributes.items()}
        assert {k: v for k, v in a.items() if k not in TIME_ATTRS} == \
            {k: v for k, v in ea.items() if k not in TIME_ATTRS}, sp.name
        for k in TIME_ATTRS & set(a):
            assert a[k] == pytest.approx(ea[k], abs=2.0), (sp.name, k)
        # live times come from the clock fit of that moment: within a few us of the final fit
        assert abs(sp.start_time_unix_nano - e.start_time) < 5_000, sp.name
        assert abs(sp.end_time_unix_nano - e.end_time) < 5_000, sp.name
        assert r["dtrace_mk.rank"] == ea["dtrace_mk.rank"] or sp.name.startswith("finding")
    n_links = sum(len(sp.links) for _, sp in got)
    assert n_links == 32 * steps // 4


def test_a_late_rank_does_not_hold_the_others_and_its_steps_follow(receiver):
    steps = 14
    res, tr = two_rank_run(steps=steps, faults=())
    acc = Accumulator()
    stream = StepSpanStream(acc, [f"otlp={receiver.base}"], ranks=2, job_id="job-2r",
                            late_steps=3, timeout_s=10, background=False)
    arr = _arrivals(tr, steps)
    held = [(r, k, recs) for r, k, recs in arr if r == 1 and k >= 2]
    for r, k, recs in arr:
        if (r, k, recs) not in held:
            _feed(acc, stream, r, recs)
    have = _steps_at(receiver)
    # rank 0 reached step 13, rank 1 step 1: steps up to 13 - 3 - 1 went out without rank 1
    assert {k for r, k in have if r == 0} == set(range(10))
    assert {k for r, k in have if r == 1} == {0, 1}
    _feed(acc, stream, 1, held[0][2])                       # rank 1's step 2 comes late
    assert (1, 2) in _steps_at(receiver)
    stream.on_rank_lost(1)                                  # then it dies
    assert {k for r, k in _steps_at(receiver) if r == 0} == set(range(steps))
    rep = stream.finish(res, acc)
    ids = [sp.span_id for _, sp in receiver.spans()]
    assert len(ids) == len(set(ids)) and rep["exporters"][0]["exported"] == len(ids)


def test_a_backend_that_is_down_counts_its_loss_and_never_blocks_the_feed():
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    warned = []
    res, tr = two_rank_run(steps=4)
    acc = Accumulator()
    stream = StepSpanStream(acc, [f"otlp=http://127.0.0.1:{port}"], ranks=2, job_id="job-2r",
                            timeout_s=0.2, max_buffer=10, warn=warned.append)
    for r, k, recs in _arrivals(tr, 4):
        _feed(acc, stream, r, recs)
    rep = stream.finish(res, acc)
    (ex,) = rep["exporters"]
    assert ex["exported"] == 0 and ex["dropped"] == rep["spans"] > 10, ex
    assert any("spans lost at shutdown" in w for w in warned)
