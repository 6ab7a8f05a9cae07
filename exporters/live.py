"""Live metrics from the collector's record stream.

The collector's transport feeds a `collectors.diagnose.RecordSink` (usually an
`Accumulator`).  To serve live metrics as records arrive, give it a `TeeRecordSink` of
the accumulator and a `MetricsRecordSink`:

    reg = MetricsRegistry()
    server = MetricsServer(reg, port=9464)          # 127.0.0.1 by default
    acc = Accumulator()
    sink = TeeRecordSink(acc, MetricsRecordSink(reg))
    ... transport calls sink.on_bytes(rank, data) ...
    result = acc.result(scenario)
    reg.observe_result(result)                      # findings gauge
    server.close()

Threading contract (as `RecordSink`): called from the collector's progress loop only;
never blocks on I/O and never raises for a bad message (it is counted).
"""
from __future__ import annotations

from ..collectors.diagnose import RecordSink
from ..collectors.records import RecordError, unpack_stream
from .prometheus import Counter, Gauge, MetricsRegistry


class MetricsRecordSink(RecordSink):
    def __init__(self, registry: MetricsRegistry):
        self.registry = registry
        p = "dtrace_mk"
        self.bad = registry.register(Counter(f"{p}_bad_messages_total",
                                         "Messages from a rank that did not decode.", ("rank",)))
        self.lost = registry.register(Counter(f"{p}_records_lost_total",
                                          "Records a rank's agent reported it could not send.", ("rank",)))
        self.rank_lost = registry.register(Gauge(f"{p}_rank_lost",
                                             "1 when the transport gave up on the rank.", ("rank",)))
        self.bytes = registry.register(Counter(f"{p}_telemetry_bytes_total",
                                           "Record bytes received per rank.", ("rank",)))

    def on_bytes(self, rank: int, data: bytes) -> None:
        try:
            recs = list(unpack_stream(data))
        except (RecordError, ValueError):
            with self.registry.lock:
                self.bad.inc(rank=str(rank))
            return
        with self.registry.lock:
            self.bytes.inc(len(data), rank=str(rank))
        self.registry.observe_records(recs)

    def on_record(self, rank: int, record) -> None:
        self.registry.observe_records([record])

    def on_rank_lost(self, rank: int) -> None:
        with self.registry.lock:
            self.rank_lost.set(1, rank=str(rank))

    def on_lost_records(self, rank: int, count: int) -> None:
        with self.registry.lock:
            self.lost.inc(count, rank=str(rank))


class TeeRecordSink(RecordSink):
    """Forwards every call to each sink in order (an exception in one is a bug there and
    is not caught: sinks must not raise)."""

    def __init__(self, *sinks: RecordSink):
        self.sinks = sinks

    def on_bytes(self, rank: int, data: bytes) -> None:
        for s in self.sinks:
            s.on_bytes(rank, data)

    def on_rank_lost(self, rank: int) -> None:
        for s in self.sinks:
            s.on_rank_lost(rank)

    def on_lost_records(self, rank: int, count: int) -> None:
        for s in self.sinks:
            s.on_lost_records(rank, count)

    def on_record(self, rank: int, record) -> None:
        for s in self.sinks:
            f = getattr(s, "on_record", None)
            if f is not None:
                f(rank, record)
