"""`dtrace-mk export`: a saved diagnosis (RESULT.json + RESULT.records.msgpack) to JSON
spans, Perfetto, Prometheus text, the console and a down OTLP backend."""
import json
import socket

from dtrace_mk.cli import main
from dtrace_mk.exporters.batch import load_records, records_path_for, save_result

from exporter_helpers import two_rank_run


def _saved(tmp_path):
    res, tr = two_rank_run()
    p = save_result(tmp_path / "run.json", res, tr)
    return p, res, tr


def test_save_result_writes_records_beside_it(tmp_path):
    p, res, tr = _saved(tmp_path)
    assert records_path_for(p) == tmp_path / "run.records.msgpack"
    rs = load_records(records_path_for(p))
    assert (len(rs.summaries), len(rs.waits), len(rs.signals), len(rs.clock_samples), len(rs.pingpongs)) == \
        (len(tr.summaries), len(tr.waits), len(tr.signals), len(tr.clock_samples), len(tr.pingpongs))


def test_export_json_perfetto_prometheus(tmp_path, capsys):
    p, res, tr = _saved(tmp_path)
    spans, pf, prom = tmp_path / "s.jsonl", tmp_path / "t.perfetto-trace", tmp_path / "m.prom"
    assert main(["export", "--result", str(p), "--json", str(spans), "--perfetto", str(pf),
                 "--prometheus", str(prom), "--job-id", "cli-job"]) == 0
    out = capsys.readouterr().out
    lines = [json.loads(x) for x in spans.read_text().splitlines()]
    assert lines and all(x["resource"]["dtrace_mk.job_id"] == "cli-job" for x in lines)
    assert sum(1 for x in lines if x["links"]) == 32
    assert pf.stat().st_size > 0 and "perfetto: " in out and "32 flows" in out
    assert "dtrace_mk_remote_wait_seconds_bucket{" in prom.read_text()


def test_export_console(tmp_path, capsys):
    p, _, _ = _saved(tmp_path)
    assert main(["export", "--result", str(p), "--console"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("rank 0 step 0 @") and any("finding: remote_stall" in l for l in out)


def test_export_to_a_down_backend_reports_loss(tmp_path, capsys):
    p, _, _ = _saved(tmp_path)
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    rc = main(["export", "--result", str(p), "--otlp", f"http://127.0.0.1:{port}", "--timeout", "0.3"])
    cap = capsys.readouterr()
    assert rc == 1
    assert "span export failed" in cap.err and "lost" in cap.out


def test_export_errors_name_the_file(tmp_path, capsys):
    p, _, _ = _saved(tmp_path)
    records_path_for(p).unlink()
    assert main(["export", "--result", str(p), "--console"]) == 2
    assert "run.records.msgpack: cannot read records" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text("{nope")
    assert main(["export", "--result", str(bad), "--console"]) == 2
    assert "bad.json:1:2: not JSON" in capsys.readouterr().err
    assert main(["export", "--result", str(p)]) == 2
    assert "nothing to export to" in capsys.readouterr().err
    garbage = tmp_path / "g.msgpack"
    garbage.write_bytes(b"\x93\x09\x01\x02")
    assert main(["export", "--result", str(p), "--records", str(garbage), "--console"]) == 2
    assert "g.msgpack: record: unknown tag 9" in capsys.readouterr().err
