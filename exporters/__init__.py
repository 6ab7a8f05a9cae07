"""dtrace_mk.exporters (installed under the dtrace_mk namespace): the collector's
results in the tools users already have.  Encoders are pure (golden-file tested);
transports move their output.

    batch      ExportBatch (the one input), build_batch, RecordSet, RankInfo, TaskTrace,
               RawEvidence; saved results (RESULT.json + RESULT.records.msgpack)
    spans      OpenTelemetry span encoder (ReadableSpans, deterministic ids, links
               wait -> signal), the JSON-lines span format
    otel       transports: OTLP/HTTP, JSON lines, console; BufferedSpanExporter (bounded
               buffer, counted loss)
    perfetto   native Perfetto trace encoder (+ task trace adapters: sim, GPU, Chrome JSON)
    protowire  minimal protobuf wire writer/reader
    prometheus MetricsRegistry, text exposition, MetricsServer (scrape endpoint)
    live       MetricsRecordSink, TeeRecordSink: live metrics from the collector's record stream
    api        export_result(result, records, exporters=[...]): the call diagnose/launch make

See docs/exporters.md.
"""
from .batch import (ExportBatch, ExportError, RankInfo, RawEvidence, RecordSet, TaskSlice, TaskTrace,
                    build_batch, load_records, load_result, records_path_for, save_records, save_result)
from .live import MetricsRecordSink, TeeRecordSink
from .prometheus import MetricsRegistry, MetricsServer

#: names from the modules that need the OpenTelemetry SDK, imported at first use: a
#: collector saves its result (batch) whether or not the SDK imports, and only exporting
#: spans says that it is missing
_NEEDS_OTEL = {"export_batch": "api", "export_result": "api", "parse_spec": "api",
               "BufferedSpanExporter": "otel", "JsonLinesSpanExporter": "otel", "make_otlp_exporter": "otel"}


def __getattr__(name: str):
    mod = _NEEDS_OTEL.get(name)
    if mod is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib
    try:
        m = importlib.import_module(f".{mod}", __name__)
    except ImportError as e:
        raise ImportError(f"exporting spans needs the OpenTelemetry SDK (pip install opentelemetry-sdk "
                          f"opentelemetry-exporter-otlp-proto-http; the project's dependencies): {e}") from e
    return getattr(m, name)

__all__ = ["export_result", "export_batch", "parse_spec", "ExportBatch", "ExportError", "RankInfo",
           "RawEvidence", "RecordSet", "TaskSlice", "TaskTrace", "build_batch", "load_records",
           "load_result", "records_path_for", "save_records", "save_result", "BufferedSpanExporter",
           "JsonLinesSpanExporter", "make_otlp_exporter", "MetricsRegistry", "MetricsServer",
           "MetricsRecordSink", "TeeRecordSink"]
