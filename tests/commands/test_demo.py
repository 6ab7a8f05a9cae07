"""The README's demo: a 2-rank job under mpiexec (sim ranks) with a late all-reduce
signal on rank 1, a query attached live through the control socket, the collector's
diagnosis and a spans file with links across ranks."""
import json
from pathlib import Path
import sys

import pytest

from dtrace_mk.cli import main



def _spans(path):
    return [json.loads(l) for l in path.read_text().splitlines() if l.strip()]


@pytest.mark.mpi
def test_demo_diagnoses_the_remote_stall_at_rank_1(capsys, runtime_dir, tmp_path):
    spans = tmp_path / "spans.jsonl"
    trace = tmp_path / "demo.perfetto-trace"
    assert main(["demo", "--spans", str(spans), "--perfetto", str(trace)]) == 0
    out = capsys.readouterr().out
    # the Perfetto trace: a track per rank and worker, slices of both ranks
    sys.path.insert(0, str(Path(__file__).parents[1] / "exporters"))   # the decoder of its tests
    from test_perfetto import check_well_formed, decode, summarize
    tr = decode(trace.read_bytes())
    check_well_formed(tr)
    tracks, events = summarize(tr)
    assert any("rank 1" in t.name for t in tracks.values()) and len(events) > 100
    assert f"perfetto: {trace}" in out
    assert "remote_stall rooted at rank 1 (allreduce_attn layer 0), steps 12-23, observed on rank(s) 0" in out, out
    # the live query: attached at a step boundary on both ranks, output per rank with coverage
    assert "query 1 rank 0, step 23 (final; attached at step 2)" in out
    assert "query 1 rank 1, step 23 (final; attached at step 2)" in out
    for e, x, t, l in __import__("re").findall(
            r"coverage @remote_wait_us: eligible (\d+), executed (\d+), throttled (\d+), lost (\d+)", out):
        assert int(e) == int(x) + int(t) + int(l) > 0
    # spans: remote waits on rank 0 link to rank 1's signal spans (and the other way)
    rows = _spans(spans)
    rank_of = {s["span_id"]: s["attributes"]["dtrace_mk.rank"] for s in rows}
    cross = [(s["attributes"]["dtrace_mk.rank"], rank_of[ln["span_id"]]) for s in rows
             for ln in s["links"] if ln["span_id"] in rank_of]
    assert (0, 1) in cross and all(a != b for a, b in cross)
    assert f"{len(cross)} links from a rank's remote wait" in out
    assert {s["resource"]["dtrace_mk.rank"] for s in rows} == {0, 1}
    # escalated evidence: the injected stall makes steps slow, their slowest task runs come
    # as children of that rank's step span (and no clean step before the fault has any)
    steps = {s["span_id"]: s for s in rows if s["name"].startswith("step ")}
    ev = [s for s in rows if s["name"].startswith("evidence: ")]
    assert ev and all(s["parent_span_id"] in steps for s in ev)
    for s in ev:
        parent = steps[s["parent_span_id"]]["attributes"]
        a = s["attributes"]
        assert (a["dtrace_mk.rank"], a["dtrace_mk.step"]) == (parent["dtrace_mk.rank"], parent["dtrace_mk.step"])
        assert a["dtrace_mk.evidence.reason"] == "slow_step" and a["dtrace_mk.step"] >= 12   # the fault: 12-23


class OtlpReceiver:
    """A local OTLP/HTTP endpoint that decodes what it receives (opentelemetry-proto)."""

    def __init__(self):
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
        import threading
        self.spans = []
        outer = self

        class H(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (http.server API)
                req = ExportTraceServiceRequest()
                req.ParseFromString(self.rfile.read(int(self.headers["Content-Length"])))
                for rs in req.resource_spans:
                    for ss in rs.scope_spans:
                        outer.spans.extend(ss.spans)
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *a):
                pass
        self.srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.srv.server_address[1]}"
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()

    def close(self):
        self.srv.shutdown()
        self.srv.server_close()


@pytest.mark.mpi
def test_demo_json_no_fault_and_otlp(capsys, runtime_dir, tmp_path):
    rx = OtlpReceiver()
    try:
        assert main(["demo", "--no-fault", "--steps", "8", "-f", "json", "--otlp", rx.url,
                     "--spans", str(tmp_path / "s.jsonl")]) == 0
    finally:
        rx.close()
    rows = [json.loads(l) for l in capsys.readouterr().out.splitlines() if l.strip()]
    maps = [r for r in rows if r.get("type") == "map"]
    assert {r["rank"] for r in maps} == {0, 1} and all("coverage" in r for r in maps)
    diag = rows[-1]
    assert diag["type"] == "diagnosis" and diag["verdict"] == "none" and diag["findings"] == []
    assert diag["cross_rank_links"] > 0
    # the running backend got the same spans, links included
    assert len(rx.spans) == diag["spans"]
    assert sum(len(s.links) for s in rx.spans) == diag["links"]


def test_demo_rejects_bad_options(capsys):
    assert main(["demo", "--steps", "2"]) == 2
    assert "--steps: expected >= 4" in capsys.readouterr().err
    assert main(["demo", "--backend", "gpu"]) == 2
    assert "demo --backend gpu: needs 2 GPUs visible to CuPy, found 0" in capsys.readouterr().err


def test_demo_summaries_flag_reaches_the_gpu_ranks_and_is_refused_on_sim(capsys, monkeypatch):
    """--summaries device: the GPU ranks' serve command carries it (the stand-in GPU demo,
    tests/launch/test_demo_gpu_fake.py, runs it end to end); on the sim backend it is an
    error, said before anything starts."""
    from dtrace_mk.launch import launcher, serve
    seen = []

    class Started(Exception):
        pass

    def start_job(ranks, cmd, **kw):
        seen.append(cmd)
        raise Started
    monkeypatch.setattr(serve, "gpu_count", lambda: 2)
    monkeypatch.setattr(launcher, "start_job", start_job)
    with pytest.raises(Started):
        main(["demo", "--backend", "gpu", "--summaries", "device"])
    (cmd,) = seen
    assert cmd[cmd.index("--summaries") + 1] == "device" and cmd[cmd.index("--backend") + 1] == "gpu"
    assert main(["demo", "--backend", "sim", "--summaries", "device"]) == 2
    assert "demo --summaries device: the summaries run in the GPU megakernel's device VM" in capsys.readouterr().err
