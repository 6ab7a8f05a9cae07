"""Span transports: a local OTLP/HTTP receiver decodes what the SDK exporter sends for a
2-rank run; a closed port gives counted, reported loss; the bounded buffer; the JSON-lines
and console exporters; the OTEL_EXPORTER_OTLP_* variables."""
import io
import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (ExportTraceServiceRequest,
                                                                      ExportTraceServiceResponse)
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from dtrace_mk.exporters import export_result
from dtrace_mk.exporters.api import export_batch
from dtrace_mk.exporters.batch import ExportError
from dtrace_mk.exporters.otel import BufferedSpanExporter, otlp_traces_url
from dtrace_mk.exporters.spans import build_spans

from exporter_helpers import RANK_INFO, tiny_batch, two_rank_run


class Receiver:
    """OTLP/HTTP trace receiver on 127.0.0.1 (ephemeral port): decodes every request."""

    def __init__(self):
        self.requests = []      # (path, headers, ExportTraceServiceRequest)
        outer = self

        class H(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                body = self.rfile.read(int(self.headers["Content-Length"]))
                req = ExportTraceServiceRequest()
                req.ParseFromString(body)
                outer.requests.append((self.path, dict(self.headers), req))
                out = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *a):
                pass

        self.srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.thread = threading.Thread(target=self.srv.serve_forever, daemon=True)
        self.thread.start()
        self.base = f"http://127.0.0.1:{self.srv.server_address[1]}"

    def close(self):
        self.srv.shutdown()
        self.srv.server_close()

    def spans(self):
        """[(resource attrs, span)] over all requests."""
        out = []
        for _, _, req in self.requests:
            for rs in req.resource_spans:
                res = {a.key: _val(a.value) for a in rs.resource.attributes}
                for ss in rs.scope_spans:
                    for sp in ss.spans:
                        out.append((res, sp))
        return out


def _val(v):
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_val(x) for x in v.array_value.values]
    return getattr(v, kind)


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.close()


def _closed_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_otlp_receiver_gets_spans_parents_links_times_and_attributes(receiver):
    res, tr = two_rank_run()
    rep = export_result(res, tr, [f"otlp={receiver.base}"], job_id="job-2r", rank_info=RANK_INFO,
                        timeout_s=10)
    (ex,) = rep["exporters"]
    assert ex["exported"] == rep["spans"] > 0 and ex["dropped"] == 0, ex
    assert all(path == "/v1/traces" for path, _, _ in receiver.requests)
    got = receiver.spans()
    assert len(got) == rep["spans"]
    by_id = {sp.span_id: (res_, sp) for res_, sp in got}
    assert len(by_id) == len(got)
    def attrs(sp):
        return {a.key: _val(a.value) for a in sp.attributes}
    cov = {f"dtrace_mk.coverage.{k}" for k in ("eligible", "executed", "throttled", "lost")}
    n_links = 0
    for r, sp in got:
        assert r["service.name"] == "dtrace_mk" and r["dtrace_mk.job_id"] == "job-2r"
        assert r["host.name"] == "node-a" and r["dtrace_mk.gpu"] == r["dtrace_mk.rank"]
        a = attrs(sp)
        assert cov <= set(a) and a["dtrace_mk.rank"] == r["dtrace_mk.rank"]
        assert 0 < sp.start_time_unix_nano <= sp.end_time_unix_nano
        if sp.name.startswith("step "):
            assert sp.parent_span_id == b""
        else:
            pr, parent = by_id[sp.parent_span_id]
            assert parent.name.startswith("step ") and parent.trace_id == sp.trace_id
            assert pr["dtrace_mk.rank"] == r["dtrace_mk.rank"]
            assert parent.start_time_unix_nano <= sp.start_time_unix_nano
            assert sp.end_time_unix_nano <= parent.end_time_unix_nano
        for link in sp.links:
            n_links += 1
            lr, target = by_id[link.span_id]
            assert link.trace_id == target.trace_id
            assert target.name == sp.name.replace("comm:wait", "comm:signal")
            ta = attrs(target)
            assert (ta["dtrace_mk.comm.op"], ta["dtrace_mk.comm.gen"]) == \
                (a["dtrace_mk.comm.op"], a["dtrace_mk.comm.gen"])
            assert lr["dtrace_mk.rank"] == a["dtrace_mk.comm.peer"] != r["dtrace_mk.rank"]
    assert n_links == 32                 # every remote wait of the run links to its signal
    names = [sp.name for _, sp in got]
    assert names.count("finding: remote_stall") >= 1
    assert sum(n.startswith("step ") for n in names) == 8        # 2 ranks x 4 steps


def test_standard_environment_variables_are_honoured(receiver, monkeypatch):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.base)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "x-dtrace-token=abc123")
    rep = export_batch(tiny_batch(), ["otlp"], timeout_s=10)
    assert rep["exporters"][0]["exported"] == 16
    path, headers, _ = receiver.requests[0]
    assert path == "/v1/traces" and headers.get("x-dtrace-token") == "abc123"
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", receiver.base + "/custom/traces")
    export_batch(tiny_batch(), ["otlp"], timeout_s=10)
    assert receiver.requests[-1][0] == "/custom/traces"


def test_down_backend_loss_is_counted_and_reported():
    warnings = []
    url = f"http://127.0.0.1:{_closed_port()}"
    rep = export_batch(tiny_batch(), [f"otlp={url}"], timeout_s=0.3, max_buffer=10,
                       warn=warnings.append)
    (ex,) = rep["exporters"]
    assert ex["exported"] == 0 and ex["dropped"] == 16 and ex["buffered"] == 0
    assert ex["failures"] >= 1
    assert any("otlp span export failed" in w for w in warnings)
    assert any("lost at shutdown" in w for w in warnings)


def test_down_backend_counts_into_metrics_registry():
    from dtrace_mk.exporters import MetricsRegistry
    reg = MetricsRegistry()
    url = f"http://127.0.0.1:{_closed_port()}"
    export_batch(tiny_batch(), [reg, f"otlp={url}"], timeout_s=0.3, warn=lambda m: None)
    assert reg.spans_dropped.get(exporter="otlp") == 16
    assert "dtrace_mk_export_spans_dropped_total{exporter=\"otlp\"} 16" in reg.render()


class Flaky(SpanExporter):
    def __init__(self):
        self.up = False
        self.got = []

    def export(self, spans):
        if not self.up:
            return SpanExportResult.FAILURE
        self.got += list(spans)
        return SpanExportResult.SUCCESS

    def shutdown(self):
        pass


def test_buffer_is_bounded_and_drains_when_the_backend_returns():
    spans = build_spans(tiny_batch())
    fl, warnings = Flaky(), []
    buf = BufferedSpanExporter(fl, "flaky", max_buffer=20, batch_size=4, warn=warnings.append)
    assert buf.export(spans) is False                     # 16 buffered
    assert (buf.buffered, buf.dropped) == (16, 0) and len(warnings) == 1
    buf.export(spans[:10])                                # 26 > 20: oldest 6 dropped
    assert (buf.buffered, buf.dropped, buf.exported) == (20, 6, 0)
    fl.up = True
    assert buf.flush() is True
    assert (buf.buffered, buf.exported, len(fl.got)) == (0, 20, 20)
    assert fl.got[-10:] == spans[:10] and fl.got[0] is spans[6]   # oldest dropped, order kept


def test_raising_exporter_is_a_counted_failure_not_an_exception():
    class Boom(Flaky):
        def export(self, spans):
            raise ConnectionError("no route")
    warnings = []
    buf = BufferedSpanExporter(Boom(), "boom", warn=warnings.append)
    assert buf.export(build_spans(tiny_batch())[:3]) is False
    assert buf.failures == 1 and "ConnectionError: no route" in warnings[0]
    buf.shutdown()
    assert buf.dropped == 3


def test_json_lines_and_console(tmp_path):
    p = tmp_path / "spans.jsonl"
    out = io.StringIO()
    rep = export_batch(tiny_batch(), [f"json={p}", "console"], out=out)
    lines = p.read_text().splitlines()
    assert len(lines) == 16 == rep["exporters"][0]["spans"]
    first = json.loads(lines[0])
    assert set(first) == {"trace_id", "span_id", "parent_span_id", "name", "kind", "start_time_unix_nano",
                          "end_time_unix_nano", "status", "attributes", "links", "resource", "scope"}
    text = out.getvalue().splitlines()
    assert len(text) == 16 and text[0].startswith("rank 0 step 0 @")
    assert any("links=1" in t for t in text) and all("[cov " in t for t in text)


def test_spec_errors_name_the_spec():
    with pytest.raises(ExportError, match="unknown kind 'zipkin'"):
        export_batch(tiny_batch(), ["zipkin=x"])
    with pytest.raises(ExportError, match=r"needs a file \(json=PATH\)"):
        export_batch(tiny_batch(), ["json"])


def test_otlp_url_gets_the_traces_path():
    assert otlp_traces_url("http://h:4318") == "http://h:4318/v1/traces"
    assert otlp_traces_url("http://h:4318/") == "http://h:4318/v1/traces"
    assert otlp_traces_url("https://h/otlp/v1/traces") == "https://h/otlp/v1/traces"


def test_wall_offset_moves_spans_to_unix_time_and_its_absence_is_reported(receiver):
    res, tr = two_rank_run()
    warnings = []
    export_result(res, tr, [f"otlp={receiver.base}"], timeout_s=10, warn=warnings.append)
    assert any("before 2001" in w for w in warnings)
    before = {sp.span_id: sp.start_time_unix_nano for _, sp in receiver.spans()}
    receiver.requests.clear()
    offset = 1_764_000_000 * 10**9                 # the collector's time_ns() - monotonic_ns()
    warnings.clear()
    export_result(dict(res, wall_offset_ns=offset), tr, [f"otlp={receiver.base}"], timeout_s=10,
                  warn=warnings.append)
    assert warnings == []
    after = {sp.span_id: sp.start_time_unix_nano for _, sp in receiver.spans()}
    assert after.keys() == before.keys() and all(after[k] - before[k] == offset for k in after)


def test_bad_exporters_are_refused_before_anything_is_written(tmp_path):
    p = tmp_path / "s.jsonl"
    with pytest.raises(ExportError, match="not a spec string"):
        export_batch(tiny_batch(), [f"json={p}", object()])
    assert not p.exists()
    with pytest.raises(ExportError, match=r"nodir/t.perfetto-trace: cannot write"):
        export_batch(tiny_batch(), [f"perfetto={tmp_path / 'nodir' / 't.perfetto-trace'}"])
