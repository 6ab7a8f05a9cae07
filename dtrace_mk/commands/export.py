"""`dtrace-mk export --result RESULT.json ...`: export a saved diagnosis as OpenTelemetry
spans (OTLP/HTTP, JSON lines, console), a Perfetto trace or Prometheus text."""
from __future__ import annotations

import json
import sys

NAME = "export"
HELP = "export a saved diagnosis: OTLP spans, JSON spans, console, Perfetto, Prometheus"
DESCRIPTION = """\
Export a saved diagnosis (RESULT.json, as 'dtrace-mk diagnose' writes it) together with
the records it was computed from (RESULT.records.msgpack beside it, or --records FILE):

  dtrace-mk export --result run.json --otlp http://127.0.0.1:4318
  dtrace-mk export --result run.json --json spans.jsonl --perfetto run.perfetto-trace
  dtrace-mk export --result run.json --console
  dtrace-mk export --result run.json --perfetto run.perfetto-trace --task-trace trace.json

--otlp without a URL uses the standard OTEL_EXPORTER_OTLP_TRACES_ENDPOINT /
OTEL_EXPORTER_OTLP_ENDPOINT (and _HEADERS, _TIMEOUT) variables.  A URL without a path
gets /v1/traces.  Spans the backend does not take within --timeout are counted and
reported (exit status 1), never dropped silently.  See docs/exporters.md."""
ORDER = 62


def add_arguments(p) -> None:
    p.add_argument("--result", required=True, metavar="RESULT.json", help="diagnosis result file")
    p.add_argument("--records", metavar="FILE",
                   help="records file (default: RESULT.records.msgpack beside the result)")
    p.add_argument("--otlp", nargs="?", const="", metavar="URL",
                   help="OTLP/HTTP endpoint (no URL: the OTEL_EXPORTER_OTLP_* variables)")
    p.add_argument("--json", metavar="FILE", help="spans as JSON lines, one span per line")
    p.add_argument("--console", action="store_true", help="print one line per span")
    p.add_argument("--perfetto", metavar="FILE", help="Perfetto trace (.perfetto-trace)")
    p.add_argument("--prometheus", metavar="FILE", help="metrics in the Prometheus text format")
    p.add_argument("--task-trace", metavar="FILE", action="append", default=[],
                   help="full task trace (Chrome JSON from 'dtrace-mk run --trace') for --perfetto; "
                        "repeatable, one per rank")
    p.add_argument("--job-id", metavar="ID", help="job id (default: the result's job_id, else 'local')")
    p.add_argument("--service-name", default="dtrace_mk", metavar="NAME")
    p.add_argument("--timeout", type=float, metavar="S",
                   help="OTLP timeout in seconds (default: OTEL_EXPORTER_OTLP_TIMEOUT, else 5)")
    p.add_argument("--report", action="store_true", help="print the export report as JSON")


def run(args) -> int:
    from dtrace_mk.exporters.api import export_result
    from dtrace_mk.exporters.batch import (ExportError, load_records, load_result,
                                           records_path_for)
    from dtrace_mk.exporters.perfetto import task_trace_from_chrome

    specs = []
    if args.otlp is not None:
        specs.append("otlp=" + args.otlp if args.otlp else "otlp")
    if args.json:
        specs.append("json=" + args.json)
    if args.console:
        specs.append("console")
    if args.perfetto:
        specs.append("perfetto=" + args.perfetto)
    if args.prometheus:
        specs.append("prometheus=" + args.prometheus)
    if not specs:
        raise ExportError("nothing to export to: give --otlp, --json, --console, --perfetto "
                          "or --prometheus")
    result = load_result(args.result)
    rpath = args.records or records_path_for(args.result)
    records = load_records(rpath)
    traces = []
    for path in args.task_trace:
        try:
            with open(path) as fh:
                doc = json.load(fh)
        except OSError as e:
            raise ExportError(f"{path}: cannot read task trace ({e.strerror})") from None
        except json.JSONDecodeError as e:
            raise ExportError(f"{path}:{e.lineno}:{e.colno}: not JSON ({e.msg})") from None
        traces += task_trace_from_chrome(doc)
    rep = export_result(result, records, specs, job_id=args.job_id, service_name=args.service_name,
                        task_traces=traces, timeout_s=args.timeout)
    lost = 0
    lines = []
    for e in rep["exporters"]:
        if e["kind"] in ("otlp", "console"):
            lost += e.get("dropped", 0)
            if e["kind"] == "otlp":
                lines.append(f"otlp: {e['exported']} spans to {e['target']}, {e['dropped']} lost")
        elif e["kind"] == "json":
            lines.append(f"json: {e['spans']} spans -> {e['path']}")
        elif e["kind"] == "perfetto":
            lines.append(f"perfetto: {e['tracks']} tracks, {e['slices']} slices, {e['flows']} flows, "
                         f"{e['counters']} counter samples -> {e['path']}")
        elif e["kind"] == "prometheus":
            lines.append(f"prometheus: -> {e['path']}")
    if args.report:
        print(json.dumps(rep, indent=2))
    elif lines:
        # with --console the spans own stdout; the summary goes to stderr
        print("\n".join(lines), file=sys.stderr if args.console else sys.stdout)
    return 1 if lost else 0
