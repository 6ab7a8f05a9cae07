"""Prometheus metrics: a small registry, the text exposition format (0.0.4), and a
scrape endpoint (an `http.server` thread; 127.0.0.1 by default).  No client library.

Metrics (base units; labels are low-cardinality: rank, task_class, peer, comm_op, cause,
state — never a task index or a request id):

    dtrace_mk_task_duration_seconds            histogram  rank, task_class
    dtrace_mk_task_dispatch_wait_seconds_total counter    rank, task_class   ready -> dispatch
    dtrace_mk_dependency_wait_seconds_total    counter    rank, task_class   dep:wait -> dep:release
    dtrace_mk_notify_lag_seconds_total         counter    rank, task_class
    dtrace_mk_remote_wait_seconds              histogram  rank, peer, comm_op
    dtrace_mk_step_duration_seconds            histogram  rank
    dtrace_mk_queue_depth                      gauge      rank   (the last epoch's maximum)
    dtrace_mk_coverage_events_total            counter    rank, state (eligible|executed|throttled|lost)
    dtrace_mk_epochs_total                     counter    rank
    dtrace_mk_findings                         gauge      rank, cause   (the latest diagnosis)
    dtrace_mk_export_spans_dropped_total       counter    exporter

Task-duration buckets from summaries: an `EpochSummary` holds per-class counts and sums,
not single durations, so `observe_summary` adds the exact count and sum and puts the
class's tasks into the bucket of their mean duration (and the max into its own bucket);
`observe_task` (full task traces, hook contexts) is exact.
"""
from __future__ import annotations

import math
import re
import threading
from bisect import bisect_left
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from ..collectors.records import EpochSummary, Names, RemoteWait

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

#: seconds: 1 us .. 100 ms, roughly 1-2.5-5 per decade
LATENCY_BUCKETS = (1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3,
                   2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 1e-1)
STEP_BUCKETS = (1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 1e-1, 2.5e-1, 5e-1, 1.0)

#: label names that would explode cardinality; the registry refuses them
FORBIDDEN_LABELS = frozenset({"task_index", "task", "request", "request_id", "request_slot",
                              "request_gen", "comm_gen", "tile", "event_id"})

LabelKey = Tuple[str, ...]


def _escape(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _fmt(v: float) -> str:
    if isinstance(v, int):
        return str(v)
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    if math.isnan(v):
        return "NaN"
    if v == int(v) and abs(v) < 1e15:
        return str(int(v))
    return repr(float(v))


def _labels(names: Sequence[str], values: Sequence[str], extra: str = "") -> str:
    parts = [f'{n}="{_escape(str(v))}"' for n, v in zip(names, values)]
    if extra:
        parts.append(extra)
    return "{" + ",".join(parts) + "}" if parts else ""


class _Metric:
    kind = ""

    def __init__(self, name: str, help: str, labels: Sequence[str]):
        bad = FORBIDDEN_LABELS.intersection(labels)
        if bad:
            raise ValueError(f"metric {name}: label {sorted(bad)[0]!r} is high-cardinality")
        self.name, self.help, self.labels = name, help, tuple(labels)

    def _key(self, labels: Mapping[str, object]) -> LabelKey:
        if set(labels) != set(self.labels):
            raise ValueError(f"metric {self.name}: labels {sorted(labels)}, expected {list(self.labels)}")
        return tuple(str(labels[n]) for n in self.labels)

    def header(self) -> List[str]:
        return [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} {self.kind}"]


class Counter(_Metric):
    kind = "counter"

    def __init__(self, name, help, labels):
        if not name.endswith("_total"):
            raise ValueError(f"counter {name}: name must end in _total")
        super().__init__(name, help, labels)
        self.values: Dict[LabelKey, float] = {}

    def inc(self, amount: float = 1, **labels) -> None:
        if amount < 0:
            raise ValueError(f"counter {self.name}: negative increment {amount}")
        k = self._key(labels)
        self.values[k] = self.values.get(k, 0) + amount

    def get(self, **labels) -> float:
        return self.values.get(self._key(labels), 0)

    def render(self) -> List[str]:
        return self.header() + [f"{self.name}{_labels(self.labels, k)} {_fmt(v)}"
                                for k, v in sorted(self.values.items())]


class Gauge(_Metric):
    kind = "gauge"

    def __init__(self, name, help, labels):
        super().__init__(name, help, labels)
        self.values: Dict[LabelKey, float] = {}

    def set(self, value: float, **labels) -> None:
        self.values[self._key(labels)] = value

    def clear(self) -> None:
        self.values.clear()

    def get(self, **labels) -> float:
        return self.values.get(self._key(labels), 0)

    def render(self) -> List[str]:
        return self.header() + [f"{self.name}{_labels(self.labels, k)} {_fmt(v)}"
                                for k, v in sorted(self.values.items())]


class Histogram(_Metric):
    kind = "histogram"

    def __init__(self, name, help, labels, buckets: Sequence[float]):
        super().__init__(name, help, labels)
        self.buckets = tuple(sorted(buckets))
        self.values: Dict[LabelKey, List[float]] = {}   # per-bucket counts + [+Inf], sum, count

    def _row(self, labels) -> List[float]:
        k = self._key(labels)
        row = self.values.get(k)
        if row is None:
            row = self.values[k] = [0] * (len(self.buckets) + 1) + [0.0, 0]
        return row

    def observe(self, value: float, count: int = 1, **labels) -> None:
        """`count` observations of `value` (`count` > 1: a summary's tasks at their mean)."""
        if count <= 0:
            return
        row = self._row(labels)
        row[bisect_left(self.buckets, value)] += count
        row[-2] += value * count
        row[-1] += count

    def add_sum(self, total: float, count: int, representative: float, **labels) -> None:
        """Exact sum and count; the observations counted in `representative`'s bucket."""
        if count <= 0:
            return
        row = self._row(labels)
        row[bisect_left(self.buckets, representative)] += count
        row[-2] += total
        row[-1] += count

    def count(self, **labels) -> int:
        row = self.values.get(self._key(labels))
        return int(row[-1]) if row else 0

    def render(self) -> List[str]:
        out = self.header()
        for k, row in sorted(self.values.items()):
            acc = 0
            for le, c in zip(list(self.buckets) + [math.inf], row[:-2]):
                acc += c
                le_label = f'le="{_fmt(le)}"'
                out.append(f"{self.name}_bucket{_labels(self.labels, k, le_label)} {_fmt(acc)}")
            out.append(f"{self.name}_sum{_labels(self.labels, k)} {_fmt(row[-2])}")
            out.append(f"{self.name}_count{_labels(self.labels, k)} {_fmt(row[-1])}")
        return out


class MetricsRegistry:
    """The job's live metrics.  Thread-safe: observers (the collector loop) and the
    scrape thread take one lock; observe_* never block on I/O."""

    def __init__(self, names: Optional[Names] = None, prefix: str = "dtrace_mk"):
        self.names = names or Names.standard()
        self.lock = threading.Lock()
        p = prefix
        self._metrics: List[_Metric] = []
        self.task_duration = self._add(Histogram(
            f"{p}_task_duration_seconds", "Task run time (task:begin -> task:end) per task class.",
            ("rank", "task_class"), LATENCY_BUCKETS))
        self.dispatch_wait = self._add(Counter(
            f"{p}_task_dispatch_wait_seconds_total", "Ready -> dispatch time of tasks, summed.",
            ("rank", "task_class")))
        self.dependency_wait = self._add(Counter(
            f"{p}_dependency_wait_seconds_total", "Local dependency wait (dep:wait -> dep:release), summed.",
            ("rank", "task_class")))
        self.notify_lag = self._add(Counter(
            f"{p}_notify_lag_seconds_total", "Producer end -> event release lag, summed per producer class.",
            ("rank", "task_class")))
        self.remote_wait = self._add(Histogram(
            f"{p}_remote_wait_seconds", "Remote wait (comm:wait) per waiting rank, peer and comm op.",
            ("rank", "peer", "comm_op"), LATENCY_BUCKETS))
        self.step_duration = self._add(Histogram(
            f"{p}_step_duration_seconds", "Decode step (epoch) duration.", ("rank",), STEP_BUCKETS))
        self.queue_depth = self._add(Gauge(
            f"{p}_queue_depth", "Worker queue depth maximum in the rank's latest epoch.", ("rank",)))
        self.coverage = self._add(Counter(
            f"{p}_coverage_events_total",
            "Monitor coverage: hook events eligible, executed, throttled and lost "
            "(eligible = executed + throttled + lost).", ("rank", "state")))
        self.epochs = self._add(Counter(f"{p}_epochs_total", "Epoch summaries received.", ("rank",)))
        self.findings = self._add(Gauge(
            f"{p}_findings", "Findings of the latest diagnosis per rank and cause.", ("rank", "cause")))
        self.spans_dropped = self._add(Counter(
            f"{p}_export_spans_dropped_total", "Spans an exporter could not deliver (lost).",
            ("exporter",)))

    def _add(self, m):
        """Register a metric family; one of the same name and type is returned instead
        (so two sinks on one registry share their families)."""
        for old in self._metrics:
            if old.name == m.name:
                if type(old) is not type(m) or old.labels != m.labels:
                    raise ValueError(f"metric {m.name}: registered twice with different type/labels")
                return old
        self._metrics.append(m)
        return m

    register = _add

    # --- observers
    def observe_summary(self, s: EpochSummary) -> None:
        r = str(s.rank)
        with self.lock:
            for c in s.classes:
                if c.count <= 0:
                    continue
                tc = self.names.task_class(c.task_class)
                mean = c.dur_sum_ns / c.count / 1e9
                if c.count > 1 and c.dur_max_ns:
                    self.task_duration.add_sum((c.dur_sum_ns - c.dur_max_ns) / 1e9, c.count - 1, mean,
                                               rank=r, task_class=tc)
                    self.task_duration.observe(c.dur_max_ns / 1e9, rank=r, task_class=tc)
                else:
                    self.task_duration.add_sum(c.dur_sum_ns / 1e9, c.count, mean, rank=r, task_class=tc)
                self.dispatch_wait.inc(c.dispatch_wait_sum_ns / 1e9, rank=r, task_class=tc)
                self.dependency_wait.inc(c.dep_wait_sum_ns / 1e9, rank=r, task_class=tc)
                self.notify_lag.inc(c.notify_lag_sum_ns / 1e9, rank=r, task_class=tc)
            self.step_duration.observe(max(s.step_ns, 0) / 1e9, rank=r)
            self.queue_depth.set(s.queue_depth_max, rank=r)
            cov = s.coverage
            for state in ("eligible", "executed", "throttled", "lost"):
                self.coverage.inc(getattr(cov, state), rank=r, state=state)
            self.epochs.inc(rank=r)

    def observe_remote_wait(self, w: RemoteWait) -> None:
        with self.lock:
            self.remote_wait.observe(max(w.wait_end_ns - w.wait_begin_ns, 0) / 1e9, rank=str(w.rank),
                                     peer=str(w.peer), comm_op=self.names.comm_op(w.comm_op))

    def observe_task(self, rank: int, task_class: str, dur_ns: int) -> None:
        with self.lock:
            self.task_duration.observe(dur_ns / 1e9, rank=str(rank), task_class=task_class)

    def observe_result(self, result: Mapping) -> None:
        with self.lock:
            self.findings.clear()
            counts: Dict[Tuple[str, str], int] = {}
            for f in result.get("findings", []):
                k = (str(f["rank"]), f["cause"])
                counts[k] = counts.get(k, 0) + 1
            for (r, cause), n in counts.items():
                self.findings.set(n, rank=r, cause=cause)

    def observe_records(self, records: Iterable) -> None:
        """Every EpochSummary and RemoteWait in `records` (each observation counts: feed
        each record once, e.g. through `live.MetricsRecordSink`)."""
        for rec in records:
            if isinstance(rec, EpochSummary):
                self.observe_summary(rec)
            elif isinstance(rec, RemoteWait):
                self.observe_remote_wait(rec)

    def count_dropped_spans(self, exporter: str, n: int) -> None:
        if n > 0:
            with self.lock:
                self.spans_dropped.inc(n, exporter=exporter)

    # --- exposition
    def render(self) -> str:
        with self.lock:
            lines: List[str] = []
            for m in self._metrics:
                lines += m.render()
        return "\n".join(lines) + "\n"


class _Handler(BaseHTTPRequestHandler):
    registry: MetricsRegistry

    def do_GET(self):  # noqa: N802 (http.server API)
        if self.path.split("?")[0] not in ("/metrics", "/"):
            self.send_error(404, "only /metrics")
            return
        body = self.server.registry.render().encode()   # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("Content-Type", CONTENT_TYPE)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, fmt, *args):   # quiet: no line per scrape
        pass


class MetricsServer:
    """The scrape endpoint: GET /metrics on `host:port` (port 0: an ephemeral one) from a
    daemon thread.  `close()` stops it."""

    def __init__(self, registry: MetricsRegistry, port: int = 0, host: str = "127.0.0.1"):
        self.registry = registry
        self._srv = ThreadingHTTPServer((host, port), _Handler)
        self._srv.daemon_threads = True
        self._srv.registry = registry          # type: ignore[attr-defined]
        self._thread = threading.Thread(target=self._srv.serve_forever, name="dtrace-mk-metrics",
                                        daemon=True)
        self._thread.start()

    @property
    def port(self) -> int:
        return self._srv.server_address[1]

    @property
    def url(self) -> str:
        host = self._srv.server_address[0]
        return f"http://{host}:{self.port}/metrics"

    def close(self) -> None:
        self._srv.shutdown()
        self._srv.server_close()
        self._thread.join(timeout=5)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def parse_exposition(text: str) -> Dict[str, Dict[str, object]]:
    """Parse the text format into {name: {"type", "help", "samples": [(labels, value)]}}
    (samples keyed by their family: `x_bucket`, `x_sum`, `x_count` go to `x`).  For tests
    and tools; raises ValueError on a malformed line."""
    fams: Dict[str, Dict[str, object]] = {}
    sample_re = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (\S+)$')
    label_re = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"(,|$)')
    for n, line in enumerate(text.splitlines(), 1):
        if not line:
            continue
        if line.startswith("# HELP ") or line.startswith("# TYPE "):
            _, kw, name, rest = line.split(" ", 3)
            fams.setdefault(name, {"samples": []})["help" if kw == "HELP" else "type"] = rest
            continue
        if line.startswith("#"):
            continue
        m = sample_re.match(line)
        if not m:
            raise ValueError(f"line {n}: not a sample: {line!r}")
        name, body, value = m.group(1), m.group(3) or "", m.group(4)
        labels: Dict[str, str] = {}
        pos = 0
        while pos < len(body):
            lm = label_re.match(body, pos)
            if not lm:
                raise ValueError(f"line {n}: bad labels: {body!r}")
            labels[lm.group(1)] = re.sub(r"\\(.)", lambda e: "\n" if e.group(1) == "n" else e.group(1),
                                         lm.group(2))
            pos = lm.end()
        fam = name
        for suf in ("_bucket", "_sum", "_count"):
            if name.endswith(suf) and name[:-len(suf)] in fams and \
                    fams[name[:-len(suf)]].get("type") == "histogram":
                fam = name[:-len(suf)]
        if fam not in fams:
            raise ValueError(f"line {n}: sample {name} before its # TYPE")
        fams[fam]["samples"].append((name, labels, float(value)))   # type: ignore[union-attr]
    return fams
