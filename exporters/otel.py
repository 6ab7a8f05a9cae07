"""Span transports: OTLP/HTTP (the SDK's `OTLPSpanExporter`), a JSON-lines file, the
console; and `BufferedSpanExporter`, which bounds what is held when a backend is down
and counts (and reports) what it had to drop.

Threading contract: `BufferedSpanExporter.export` is called from one thread (the
collector loop or `export_result`); it never raises for a backend failure and blocks at
most about `timeout_s` per attempt (the SDK exporter's own deadline, retries included).
"""
from __future__ import annotations

import os
import sys
import threading
from collections import deque
from typing import IO, Callable, Deque, Dict, Mapping, Optional, Sequence
from urllib.parse import urlsplit, urlunsplit

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SpanExporter, SpanExportResult

from .spans import span_to_console_line, span_to_json_line

DEFAULT_TIMEOUT_S = 5.0
DEFAULT_MAX_BUFFER = 20_000       # spans held while a backend is down
DEFAULT_BATCH = 512               # spans per export request


def otlp_traces_url(url: str) -> str:
    """A base URL (`http://host:4318`) gets the standard `/v1/traces` path; a URL with a
    path is taken as the full traces endpoint."""
    parts = urlsplit(url)
    if parts.path in ("", "/"):
        parts = parts._replace(path="/v1/traces")
    return urlunsplit(parts)


def make_otlp_exporter(endpoint: Optional[str] = None, headers: Optional[Mapping[str, str]] = None,
                       timeout_s: Optional[float] = None) -> SpanExporter:
    """The SDK's OTLP/HTTP protobuf exporter.  `endpoint=None`: the SDK reads
    OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, else OTEL_EXPORTER_OTLP_ENDPOINT + /v1/traces,
    else http://localhost:4318/v1/traces; headers from OTEL_EXPORTER_OTLP_(TRACES_)HEADERS
    unless given; `timeout_s=None`: OTEL_EXPORTER_OTLP_(TRACES_)TIMEOUT (seconds, as this
    SDK reads it) when set, else DEFAULT_TIMEOUT_S."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    if timeout_s is None and not (os.environ.get("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT")
                                  or os.environ.get("OTEL_EXPORTER_OTLP_TIMEOUT")):
        timeout_s = DEFAULT_TIMEOUT_S
    return OTLPSpanExporter(endpoint=otlp_traces_url(endpoint) if endpoint else None,
                            headers=dict(headers) if headers else None, timeout=timeout_s)


class JsonLinesSpanExporter(SpanExporter):
    """One span per line in the stable format of `spans.span_to_dict` (keys sorted)."""

    def __init__(self, path_or_stream, append: bool = False):
        if hasattr(path_or_stream, "write"):
            self._fh, self._own = path_or_stream, False
            self.path = getattr(path_or_stream, "name", None)
        else:
            self.path = str(path_or_stream)
            self._fh, self._own = open(self.path, "a" if append else "w"), True
        self.written = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        for s in spans:
            self._fh.write(span_to_json_line(s))
        self._fh.flush()
        self.written += len(spans)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        if self._own and not self._fh.closed:
            self._fh.close()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        self._fh.flush()
        return True


def make_console_exporter(out: Optional[IO[str]] = None) -> SpanExporter:
    """The SDK's console exporter with a one-line-per-span formatter."""
    return ConsoleSpanExporter(out=out or sys.stdout, formatter=span_to_console_line)


class BufferedSpanExporter:
    """Holds spans until `exporter` takes them, at most `max_buffer`; the oldest beyond
    that are dropped and counted.  Failures are reported through `warn` (one line each,
    naming the exporter and the counts), never silent.

    Counters: `exported`, `dropped`, `failures`, `buffered` (len of the buffer)."""

    def __init__(self, exporter: SpanExporter, name: str = "otlp", max_buffer: int = DEFAULT_MAX_BUFFER,
                 batch_size: int = DEFAULT_BATCH, warn: Optional[Callable[[str], None]] = None,
                 on_drop: Optional[Callable[[str, int], None]] = None):
        if max_buffer < 1:
            raise ValueError("max_buffer must be >= 1")
        self.exporter, self.name = exporter, name
        self.max_buffer, self.batch_size = max_buffer, batch_size
        self._buf: Deque[ReadableSpan] = deque()
        self._lock = threading.Lock()
        self.exported = self.dropped = self.failures = 0
        self.last_error: Optional[str] = None
        self._warn = warn or (lambda msg: print(msg, file=sys.stderr))
        self._on_drop = on_drop

    @property
    def buffered(self) -> int:
        return len(self._buf)

    def _drop(self, n: int) -> None:
        self.dropped += n
        if self._on_drop is not None:
            self._on_drop(self.name, n)

    def export(self, spans: Sequence[ReadableSpan]) -> bool:
        """Queue `spans` and send what is queued.  True when the buffer is empty after."""
        with self._lock:
            self._buf.extend(spans)
            over = len(self._buf) - self.max_buffer
            if over > 0:
                for _ in range(over):
                    self._buf.popleft()
                self._drop(over)
            return self._flush_locked()

    def flush(self) -> bool:
        with self._lock:
            return self._flush_locked()

    def _flush_locked(self) -> bool:
        while self._buf:
            batch = [self._buf[i] for i in range(min(self.batch_size, len(self._buf)))]
            try:
                ok = self.exporter.export(batch) == SpanExportResult.SUCCESS
                err = None if ok else "export failed"
            except Exception as e:   # a transport must not take the collector down
                ok, err = False, f"{type(e).__name__}: {e}"
            if not ok:
                self.failures += 1
                self.last_error = err
                self._warn(f"dtrace-mk: {self.name} span export failed ({err}); "
                           f"{len(self._buf)} spans buffered (max {self.max_buffer}), "
                           f"{self.dropped} dropped so far")
                return False
            for _ in batch:
                self._buf.popleft()
            self.exported += len(batch)
        return True

    def shutdown(self) -> None:
        """Last try; what is still buffered is lost and counted."""
        with self._lock:
            self._flush_locked()
            left = len(self._buf)
            if left:
                self._buf.clear()
                self._drop(left)
                self._warn(f"dtrace-mk: {self.name}: {left} spans lost at shutdown "
                           f"({self.dropped} dropped in all)")
        self.exporter.shutdown()

    def stats(self) -> Dict[str, object]:
        return {"exported": self.exported, "dropped": self.dropped, "buffered": self.buffered,
                "failures": self.failures, "last_error": self.last_error}
