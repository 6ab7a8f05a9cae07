"""`export_result`: the one call the diagnose/launch side makes.

    from dtrace_mk.exporters import export_result
    report = export_result(result, acc, exporters=["otlp=http://127.0.0.1:4318",
                                                   "json=spans.jsonl", "perfetto=run.perfetto-trace"],
                           job_id="job-42", rank_info={0: RankInfo("node1", 0), 1: RankInfo("node1", 1)})

Exporter specs (strings, or objects for long-lived ones):

    "otlp" | "otlp=URL"      OTLP/HTTP protobuf (no URL: the OTEL_EXPORTER_OTLP_* variables)
    "json=PATH"              JSON lines, one span per line (`spans.span_to_dict`)
    "console"                one line per span on stdout
    "perfetto=PATH"          native Perfetto trace (`perfetto.build_perfetto`)
    "prometheus=PATH"        the metrics' text exposition, written once
    BufferedSpanExporter     kept across calls (the caller shuts it down): live export
    SpanExporter             any SDK exporter (wrapped in a BufferedSpanExporter, shut down here)
    MetricsRegistry          the records and the result are observed into it

Exporters made from strings are shut down before returning; spans an OTLP backend did
not take within the timeout are counted as dropped, reported in the returned dict
(`exporters[i]["dropped"]`) and by a warning line on stderr.
"""
from __future__ import annotations

import sys
from typing import Any, Callable, Dict, Iterable, Mapping, Optional, Sequence, Union

from opentelemetry.sdk.trace.export import SpanExporter

from .batch import ExportBatch, ExportError, RawEvidence, RankInfo, build_batch
from .otel import (DEFAULT_MAX_BUFFER, BufferedSpanExporter, JsonLinesSpanExporter,
                   make_console_exporter, make_otlp_exporter, otlp_traces_url)
from .perfetto import write_perfetto
from .prometheus import MetricsRegistry
from .spans import build_spans

SPEC_KINDS = ("otlp", "json", "console", "perfetto", "prometheus")

ExporterSpec = Union[str, BufferedSpanExporter, SpanExporter, MetricsRegistry]


def parse_spec(spec: str):
    kind, _, arg = spec.partition("=")
    kind = kind.strip().lower()
    if kind not in SPEC_KINDS:
        raise ExportError(f"exporter {spec!r}: unknown kind {kind!r} (one of {', '.join(SPEC_KINDS)})")
    if kind in ("json", "perfetto", "prometheus") and not arg:
        raise ExportError(f"exporter {spec!r}: needs a file ({kind}=PATH)")
    if kind == "console" and arg:
        raise ExportError(f"exporter {spec!r}: console takes no argument")
    return kind, arg or None


def export_batch(batch: ExportBatch, exporters: Sequence[ExporterSpec], *,
                 timeout_s: Optional[float] = None, max_buffer: int = DEFAULT_MAX_BUFFER,
                 warn: Optional[Callable[[str], None]] = None, out=None,
                 steps: Optional[Iterable[int]] = None) -> Dict[str, Any]:
    warn = warn or (lambda m: print(m, file=sys.stderr))
    specs = [parse_spec(e) if isinstance(e, str) else (None, e) for e in exporters]
    for kind, arg in specs:      # all checked before anything is written or sent
        if kind is None and not isinstance(arg, (MetricsRegistry, BufferedSpanExporter, SpanExporter)):
            raise ExportError(f"exporter {arg!r}: not a spec string, SpanExporter, "
                              f"BufferedSpanExporter or MetricsRegistry")
    try:
        return _export(batch, specs, timeout_s, max_buffer, warn, out, steps)
    except OSError as e:
        raise ExportError(f"{e.filename or 'export'}: cannot write ({e.strerror})") from None


def _export(batch, specs, timeout_s, max_buffer, warn, out, steps) -> Dict[str, Any]:
    registries = [e for _, e in specs if isinstance(e, MetricsRegistry)]
    spans = None
    report: Dict[str, Any] = {"job_id": batch.job_id, "spans": 0, "exporters": []}

    def get_spans():
        nonlocal spans
        if spans is None:
            spans = build_spans(batch, steps=steps)
            report["spans"] = len(spans)
        return spans

    def on_drop(name: str, n: int) -> None:
        for reg in registries:
            reg.count_dropped_spans(name, n)

    for kind, arg in specs:
        if kind == "perfetto":
            counts = write_perfetto(arg, batch)
            report["exporters"].append({"kind": "perfetto", "path": arg, **counts})
        elif kind == "prometheus":
            reg = MetricsRegistry(batch.names)
            reg.observe_records(batch.records)
            reg.observe_result(batch.result)
            with open(arg, "w") as fh:
                fh.write(reg.render())
            report["exporters"].append({"kind": "prometheus", "path": arg})
        elif isinstance(arg, MetricsRegistry):
            arg.observe_records(batch.records)
            arg.observe_result(batch.result)
            report["exporters"].append({"kind": "metrics"})
        elif kind == "json":
            ex = JsonLinesSpanExporter(arg)
            try:
                ex.export(get_spans())
            finally:
                ex.shutdown()
            report["exporters"].append({"kind": "json", "path": arg, "spans": ex.written})
        else:
            own = True
            if kind == "otlp":
                buf = BufferedSpanExporter(make_otlp_exporter(arg, timeout_s=timeout_s), "otlp",
                                           max_buffer, warn=warn, on_drop=on_drop)
                target = otlp_traces_url(arg) if arg else "(OTEL_EXPORTER_OTLP_* environment)"
            elif kind == "console":
                buf = BufferedSpanExporter(make_console_exporter(out), "console", max_buffer,
                                           warn=warn, on_drop=on_drop)
                target = "stdout"
            elif isinstance(arg, BufferedSpanExporter):
                buf, own, target = arg, False, arg.name
            else:
                buf = BufferedSpanExporter(arg, type(arg).__name__, max_buffer, warn=warn, on_drop=on_drop)
                target = type(arg).__name__
            if kind == "otlp" and not batch.looks_like_unix_time():
                warn("dtrace-mk: otlp: span times are before 2001 (the hosts' clock is not Unix "
                     "time and the result has no wall_offset_ns); backends may show or drop "
                     "them as old")
            before = buf.dropped
            buf.export(get_spans())
            if own:
                buf.shutdown()
            st = buf.stats()
            st["dropped_now"] = buf.dropped - before
            report["exporters"].append({"kind": kind or "spans", "target": target, **st})
    return report


def export_result(result: Mapping[str, Any], records: Any, exporters: Sequence[ExporterSpec] = ("console",),
                  *, job_id: Optional[str] = None, service_name: str = "dtrace_mk",
                  rank_info: Optional[Mapping[int, RankInfo]] = None, names=None,
                  task_traces=None, evidence: Iterable[RawEvidence] = (),
                  timeout_s: Optional[float] = None, max_buffer: int = DEFAULT_MAX_BUFFER,
                  warn: Optional[Callable[[str], None]] = None, out=None,
                  steps: Optional[Iterable[int]] = None,
                  wall_offset_ns: Optional[int] = None) -> Dict[str, Any]:
    """Export a diagnosis `result` and the `records` it came from to `exporters`.
    `steps`: spans of these decode steps only (Perfetto and metrics take everything).
    Returns a report: {"job_id", "spans", "exporters": [per-exporter stats]}."""
    batch = build_batch(result, records, job_id=job_id, service_name=service_name,
                        rank_info=rank_info, names=names, task_traces=task_traces, evidence=evidence,
                        wall_offset_ns=wall_offset_ns)
    return export_batch(batch, exporters, timeout_s=timeout_s, max_buffer=max_buffer, warn=warn, out=out,
                        steps=steps)
