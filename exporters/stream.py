"""Spans exported per decode step while a job runs (BatchSpanProcessor-style).

    acc = CollectorSink(...)                                  # the collector's Accumulator
    stream = StepSpanStream(acc, ["otlp=http://127.0.0.1:4318", "json=spans.jsonl"],
                            ranks=2, job_id="j1", wall_offset_ns=w)
    sink = TeeRecordSink(acc, stream)                         # the transport feeds `sink`
    ... CollectorLoop(port, ranks, sink).run() ...
    report = stream.finish(result)                            # findings, the rest; shut down

When is a step exported?  Step k is *joined* once every rank has sent its epoch summary
for k, or was declared dead (`on_rank_lost`), or is *late*: some rank is already more than
`late_steps` steps past k.  Then the spans of step k (`spans.build_spans`
over that step's records and the clock model fitted so far) go to a background thread,
which hands them to each exporter's `BufferedSpanExporter` (bounded buffer, loss counted).
A late rank's spans of step k go out when its summary for k arrives.

Span ids are deterministic hashes of logical keys (job, rank, step, comm_op, comm_gen...),
so a remote wait's link names the sender's signal span whether that span was exported
before, with or after it.  `finish(result)` builds the whole job once more (with the
diagnosis: finding spans) and sends every span whose id was not sent yet; the union is
the end-of-job span set of `export_result` (same ids, parents, links, attributes).  Span
times of live steps come from the clock fit at that moment; the end-of-job fit uses every
sample, so they may differ by the fit's error (`clock.pair_error_bound_ns`, ns to us).

Threading contract: the RecordSink calls (`on_bytes`, `on_record`, `on_rank_lost`,
`on_lost_records`) come from the collector's loop thread, must come AFTER the
accumulator's (put this sink after it in the `TeeRecordSink`), never block on I/O and
never raise; building and sending happen on this object's daemon thread.  `finish` is
called once, from the collector's thread, after the loop ended.
"""
from __future__ import annotations

import sys
import threading
from collections import deque
from typing import Any, Callable, Deque, Dict, List, Mapping, Optional, Sequence, Set, Tuple

from ..collectors.diagnose import RecordSink
from .api import parse_spec
from .batch import ExportError, RankInfo, RecordSet, build_batch
from .otel import (DEFAULT_MAX_BUFFER, BufferedSpanExporter, JsonLinesSpanExporter,
                   make_console_exporter, make_otlp_exporter, otlp_traces_url)
from .spans import A, build_spans

DEFAULT_LATE_STEPS = 8


class StepSpanStream(RecordSink):
    """See the module docstring.  `exporters`: span spec strings (`otlp`, `otlp=URL`,
    `json=PATH`, `console`) or `BufferedSpanExporter`s (not shut down here)."""

    def __init__(self, acc, exporters: Sequence[Any], *, ranks: int, job_id: str,
                 service_name: str = "dtrace_mk", rank_info: Optional[Mapping[int, RankInfo]] = None,
                 names=None, wall_offset_ns: int = 0, late_steps: int = DEFAULT_LATE_STEPS,
                 timeout_s: Optional[float] = None, max_buffer: int = DEFAULT_MAX_BUFFER,
                 warn: Optional[Callable[[str], None]] = None, background: bool = True):
        self.acc = acc
        self.ranks = list(range(ranks)) if isinstance(ranks, int) else list(ranks)
        self.job_id, self.service_name = job_id, service_name
        self.rank_info = dict(rank_info or {})
        self.names, self.wall_offset_ns = names, int(wall_offset_ns)
        self.late_steps = max(1, int(late_steps))
        self.warn = warn or (lambda m: print(m, file=sys.stderr, flush=True))
        self.outs: List[Tuple[str, Any, BufferedSpanExporter, bool]] = []   # kind, target, buf, own
        for e in exporters:
            self.outs.append(self._make(e, timeout_s, max_buffer))
        # what arrived, by step (collector thread only)
        self._seen = {"summaries": 0, "waits": 0, "signals": 0, "evidence": 0}
        self._sum: Dict[int, list] = {}
        self._wait: Dict[int, list] = {}
        self._sig: Dict[int, list] = {}
        self._ev: Dict[int, list] = {}            # escalated evidence (sent before its step's summary)
        self._have: Dict[int, Set[int]] = {r: set() for r in self.ranks}
        self._newest: Dict[int, int] = {}
        self._lost: Set[int] = set()
        self._next: Optional[int] = None          # the lowest step not yet joined
        self._joined_without: Dict[int, Set[int]] = {}   # step -> ranks it went out without
        # handed to the worker
        self._q: Deque[Tuple[List[int], Optional[Set[int]], RecordSet]] = deque()
        self._cv = threading.Condition()
        self._stop = False
        self.sent_ids: Set[int] = set()           # span ids handed to the exporters (worker)
        self.steps_live = 0
        self.spans_live = 0
        self.errors = 0
        self.last_error: Optional[str] = None
        self._thread = None
        if background:
            self._thread = threading.Thread(target=self._work, name="dtrace_mk-span-stream", daemon=True)
            self._thread.start()

    # -- exporters -------------------------------------------------------------------
    def _make(self, spec, timeout_s, max_buffer):
        if isinstance(spec, BufferedSpanExporter):
            return ("spans", spec.name, spec, False)
        if not isinstance(spec, str):
            raise ExportError(f"exporter {spec!r}: a span spec string or a BufferedSpanExporter")
        kind, arg = parse_spec(spec)
        if kind == "otlp":
            ex = make_otlp_exporter(arg, timeout_s=timeout_s)
            target = otlp_traces_url(arg) if arg else "(OTEL_EXPORTER_OTLP_* environment)"
        elif kind == "json":
            try:
                ex = JsonLinesSpanExporter(arg)
            except OSError as e:
                raise ExportError(f"{arg}: cannot write ({e.strerror})") from None
            target = arg
        elif kind == "console":
            ex, target = make_console_exporter(), "stdout"
        else:
            raise ExportError(f"exporter {spec!r}: {kind} is not a span exporter (live export "
                              f"takes otlp, json, console)")
        return (kind, target, BufferedSpanExporter(ex, kind, max_buffer, warn=self.warn), True)

    # -- RecordSink (collector thread) ---------------------------------------------------
    def on_bytes(self, rank: int, data: bytes) -> None:
        self._scan()

    def on_record(self, rank: int, record) -> None:
        self._scan()

    def on_lost_records(self, rank: int, count: int) -> None:
        pass

    def on_rank_lost(self, rank: int) -> None:
        self._lost.add(rank)
        self._advance()

    def _scan(self) -> None:
        acc = self.acc
        new_steps = set()
        for name, by in (("summaries", self._sum), ("waits", self._wait), ("signals", self._sig),
                         ("evidence", self._ev)):
            lst = getattr(acc, name, ())
            i0 = self._seen[name]
            if i0 >= len(lst):
                continue
            for r in lst[i0:]:
                k = r.epoch if name == "summaries" else r.step
                by.setdefault(k, []).append(r)
                if name == "summaries":
                    self._have.setdefault(r.rank, set()).add(k)
                    self._newest[r.rank] = max(self._newest.get(r.rank, k), k)
                    new_steps.add((r.rank, k))
            self._seen[name] = len(lst)
        if self._next is None and self._sum:
            self._next = min(self._sum)
        # a late rank's step that went out without it
        late = [(r, k) for r, k in new_steps if r in self._joined_without.get(k, ())]
        for r, k in late:
            self._joined_without[k].discard(r)
            self._enqueue([k], {r})
        self._advance()

    def _advance(self) -> None:
        if self._next is None:
            return
        newest = max(self._newest.values(), default=-1)
        ready: List[int] = []
        while self._next <= newest:
            k = self._next
            missing = set()
            for r in self.ranks:
                if k in self._have.get(r, ()) or r in self._lost:
                    continue
                if newest - k > self.late_steps:
                    missing.add(r)            # late: goes out without it
                    continue
                break
            else:
                if missing:
                    self._joined_without[k] = missing
                ready.append(k)
                self._next = k + 1
                continue
            break
        if ready:
            self._enqueue(ready, None)

    def _enqueue(self, steps: List[int], only_ranks: Optional[Set[int]]) -> None:
        rs = RecordSet()
        for k in steps:
            rs.summaries.extend(self._sum.get(k, ()))
            rs.waits.extend(self._wait.get(k, ()))
            rs.evidence.extend(self._ev.get(k, ()))
        for k in sorted({k + d for k in steps for d in (-1, 0, 1)}):
            rs.signals.extend(self._sig.get(k, ()))     # a wait's signal may carry a neighbour step
        rs.clock_samples = list(self.acc.clock_samples)
        rs.pingpongs = list(self.acc.pingpongs)
        with self._cv:
            self._q.append((steps, only_ranks, rs))
            self._cv.notify()
        if self._thread is None:
            self._drain()

    # -- the worker ---------------------------------------------------------------------
    def _work(self) -> None:
        while True:
            with self._cv:
                while not self._q and not self._stop:
                    self._cv.wait()
                if not self._q and self._stop:
                    return
            self._drain()

    def _drain(self) -> None:
        while True:
            with self._cv:
                if not self._q:
                    return
                items = list(self._q)
                self._q.clear()
            # coalesce: one clock fit and one build for everything queued
            steps: List[int] = []
            only: Dict[int, Optional[Set[int]]] = {}
            rs = RecordSet()
            for st, ranks, r in items:
                for k in st:
                    if k not in only:
                        steps.append(k)
                        only[k] = ranks
                    elif only[k] is not None:
                        only[k] = None if ranks is None else (only[k] | ranks)
                rs.summaries.extend(r.summaries)
                rs.waits.extend(r.waits)
                rs.signals.extend(r.signals)
                rs.evidence.extend(r.evidence)
            rs.clock_samples, rs.pingpongs = items[-1][2].clock_samples, items[-1][2].pingpongs
            rs.summaries = list({(s.rank, s.epoch): s for s in rs.summaries}.values())
            rs.waits = list({id(w): w for w in rs.waits}.values())
            rs.signals = list({id(g): g for g in rs.signals}.values())
            try:
                spans = self._build({"findings": []}, rs, steps)
                out = []
                for sp in spans:
                    k, r = sp.attributes.get(A + "step"), sp.attributes.get(A + "rank")
                    o = only.get(k)
                    if o is not None and r not in o:
                        continue
                    if sp.context.span_id in self.sent_ids:
                        continue
                    out.append(sp)
                self._send(out)
                self.steps_live += len(steps)
                self.spans_live += len(out)
            except Exception as e:    # a bug here must not take the collector down
                self.errors += 1
                self.last_error = f"{type(e).__name__}: {e}"
                self.warn(f"dtrace-mk: live span export of steps {steps[:3]}...: {self.last_error} "
                          f"(they go out at the end)")

    def _build(self, result, records, steps):
        batch = build_batch(result, records, job_id=self.job_id, service_name=self.service_name,
                            rank_info=self.rank_info, names=self.names,
                            wall_offset_ns=self.wall_offset_ns)
        return build_spans(batch, steps=steps)

    def _send(self, spans) -> None:
        if not spans:
            return
        for sp in spans:
            self.sent_ids.add(sp.context.span_id)
        for _, _, buf, _ in self.outs:
            buf.export(spans)

    # -- the end ---------------------------------------------------------------------------
    def finish(self, result: Mapping[str, Any], records: Any = None) -> Dict[str, Any]:
        """Stop the worker (after what is queued), then send every span of the whole job
        (findings included) that was not sent live, and shut the own exporters down.
        Returns a report like `export_result`'s plus `live_spans`, `live_steps`."""
        self._scan()
        with self._cv:
            self._stop = True
            self._cv.notify()
        if self._thread is not None:
            self._thread.join()
        self._drain()
        res = dict(result)
        res.setdefault("findings", [])
        spans = self._build(res, records if records is not None else self.acc, None)
        rest = [sp for sp in spans if sp.context.span_id not in self.sent_ids]
        self._send(rest)
        report: Dict[str, Any] = {"job_id": self.job_id, "spans": len(spans),
                                  "live_spans": self.spans_live, "live_steps": self.steps_live,
                                  "end_spans": len(rest), "exporters": []}
        if self.errors:
            report["live_errors"] = self.errors
            report["live_last_error"] = self.last_error
        for kind, target, buf, own in self.outs:
            if own:
                buf.shutdown()
            st = buf.stats()
            entry = {"kind": kind, ("path" if kind == "json" else "target"): target, **st}
            report["exporters"].append(entry)
        return report
