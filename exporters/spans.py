"""OpenTelemetry span encoder: `ExportBatch` -> `opentelemetry.sdk.trace.ReadableSpan`s.

Pure and deterministic (ids are hashes of logical keys, never random; times come from
the records through the aligned clock), so a golden file pins the output and the
transports (`exporters.otel`) only move finished spans.

Shape (one trace per decode step; ids from `job_id`):

    step {k}                       rank r, one per (rank, step); times: the rank's epoch
    ├── comm:wait {op}             one per (receiver, comm_op, comm_gen, sender), tiles
    │                              merged; LINK -> the sender's comm:signal span
    ├── comm:signal {op}           one per (sender, comm_op, comm_gen, receiver): first..last signal
    ├── finding: {cause}           one per finding and step it names (on the finding's rank;
    │                              on the first observing rank when that rank sent nothing)
    └── evidence: {name}           one per escalated raw evidence record

Every span carries coverage (`dtrace_mk.coverage.{eligible,executed,throttled,lost}`):
its (rank, step)'s summary coverage, or the finding's own coverage on finding spans.
Every span's resource is its rank's: `service.name`, `service.instance.id`,
`dtrace_mk.job_id`, `dtrace_mk.rank`, `dtrace_mk.gpu` (when known), `host.name`.
"""
from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Mapping, Optional, Tuple

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags

from ..collectors.classify import Thresholds
from ..collectors.join import group_signals
from ..collectors.records import Coverage, RemoteWait
from .batch import ExportBatch, merge_wait_tiles

SCOPE = InstrumentationScope("dtrace_mk.exporters", "1")
A = "dtrace_mk."


def _hash_id(nbytes: int, *parts: Any) -> int:
    h = hashlib.blake2b("|".join(str(p) for p in parts).encode(), digest_size=nbytes)
    return int.from_bytes(h.digest(), "big") or 1


def evidence_span_id(job_id: str, ev) -> int:
    """A RawEvidence's span id: its rank, step, name, interval and attributes (one task run
    is escalated at most once)."""
    return _hash_id(8, job_id, "evidence", ev.rank, ev.step, ev.name, ev.begin_ns, ev.end_ns,
                    sorted(ev.attributes.items()))


@functools.lru_cache(maxsize=4096)
def trace_id(job_id: str, step: int) -> int:
    return _hash_id(16, job_id, "step", step)


@functools.lru_cache(maxsize=65536)
def step_span_id(job_id: str, rank: int, step: int) -> int:
    return _hash_id(8, job_id, "step", rank, step)


def signal_span_id(job_id: str, comm_op: int, comm_gen: int, sender: int, receiver: int) -> int:
    return _hash_id(8, job_id, "signal", comm_op, comm_gen, sender, receiver)


def wait_span_id(job_id: str, comm_op: int, comm_gen: int, sender: int, receiver: int) -> int:
    return _hash_id(8, job_id, "wait", comm_op, comm_gen, sender, receiver)


def _ctx(tid: int, sid: int) -> SpanContext:
    return SpanContext(tid, sid, is_remote=False, trace_flags=TraceFlags(TraceFlags.SAMPLED))


def _cov_attrs(c: Coverage) -> Dict[str, int]:
    return {A + "coverage.eligible": c.eligible, A + "coverage.executed": c.executed,
            A + "coverage.throttled": c.throttled, A + "coverage.lost": c.lost}


def _cov_from_dict(d: Optional[Mapping[str, int]]) -> Coverage:
    d = d or {}
    return Coverage(int(d.get("eligible", 0)), int(d.get("executed", 0)),
                    int(d.get("throttled", 0)), int(d.get("lost", 0)))


def rank_resource(batch: ExportBatch, rank: int) -> Resource:
    info = batch.info(rank)
    attrs: Dict[str, Any] = {"service.name": batch.service_name,
                             "service.instance.id": f"{batch.job_id}/rank{rank}",
                             A + "job_id": batch.job_id, A + "rank": rank,
                             "host.name": info.host}
    if info.gpu is not None:
        attrs[A + "gpu"] = info.gpu
    return Resource(attrs)


@dataclass
class _Step:
    rank: int
    step: int
    start: int
    end: int
    partial: bool          # no summary: extent taken from its children


def build_spans(batch: ExportBatch, min_latency_ns: int = 1000,
                verdict: float = Thresholds().verdict,
                steps: Optional[Iterable[int]] = None) -> List[ReadableSpan]:
    """All spans of `batch`, in a stable order: by step, rank, then start time.

    `steps`: only the spans of these decode steps (incremental export while a job runs:
    ids are deterministic, so links into steps exported earlier stay valid)."""
    only_steps = steps
    job, names = batch.job_id, batch.names
    summaries = batch.summary_index()
    res_cache: Dict[int, Resource] = {}

    def resource(r: int) -> Resource:
        if r not in res_cache:
            res_cache[r] = rank_resource(batch, r)
        return res_cache[r]

    u = batch.to_unix_ns
    children: Dict[Tuple[int, int], List[ReadableSpan]] = {}
    extent: Dict[Tuple[int, int], List[int]] = {}

    def extend(key, *ts):
        e = extent.setdefault(key, [min(ts), max(ts)])
        e[0], e[1] = min(e[0], *ts), max(e[1], *ts)

    # --- signals: one span per (comm_op, comm_gen, sender, receiver)
    groups = group_signals(batch.signals)
    for (op, gen, snd, rcv), g in sorted(groups.items()):
        key = (snd, g.step)
        b, e = u(snd, g.first_ns), u(snd, g.last_ns)
        extend(key, b, e)
        attrs = {A + "rank": snd, A + "step": g.step, A + "comm.op": names.comm_op(op),
                 A + "comm.gen": gen, A + "comm.peer": rcv, A + "layer": g.layer,
                 A + "comm.signals": g.count}
        attrs.update(_cov_attrs(batch.coverage(snd, g.step)))
        children.setdefault(key, []).append(ReadableSpan(
            f"comm:signal {names.comm_op(op)}", _ctx(trace_id(job, g.step),
                                                     signal_span_id(job, op, gen, snd, rcv)),
            _ctx(trace_id(job, g.step), step_span_id(job, snd, g.step)), resource(snd), attrs,
            kind=SpanKind.PRODUCER, start_time=b, end_time=e, instrumentation_scope=SCOPE))

    # --- waits: tiles of one (receiver, key) merged
    for k, w0, wb, we, tiles in merge_wait_tiles(batch.waits):
        w0: RemoteWait
        op, gen, snd, rcv = k
        key = (rcv, w0.step)
        b, e = u(rcv, wb), u(rcv, we)
        extend(key, b, e)
        attrs = {A + "rank": rcv, A + "step": w0.step, A + "comm.op": names.comm_op(op),
                 A + "comm.gen": gen, A + "comm.peer": snd, A + "layer": w0.layer,
                 A + "task_class": names.task_class(w0.task_class), A + "comm.tiles": tiles}
        links = []
        g = groups.get(k)
        attrs[A + "comm.joined"] = g is not None
        if g is not None:
            release = min(u(snd, g.last_ns), e - min_latency_ns)
            attrs[A + "comm.late_us"] = round(max(0, min(release, e) - b) / 1000.0, 3)
            attrs[A + "comm.transfer_us"] = round(max(0, e - max(b, release)) / 1000.0, 3)
            links.append(Link(_ctx(trace_id(job, g.step), signal_span_id(job, op, gen, snd, rcv)),
                              {A + "link": "comm_signal", A + "comm.op": names.comm_op(op),
                               A + "comm.gen": gen, A + "comm.sender": snd}))
        attrs.update(_cov_attrs(batch.coverage(rcv, w0.step)))
        children.setdefault(key, []).append(ReadableSpan(
            f"comm:wait {names.comm_op(op)}", _ctx(trace_id(job, w0.step),
                                                   wait_span_id(job, op, gen, snd, rcv)),
            _ctx(trace_id(job, w0.step), step_span_id(job, rcv, w0.step)), resource(rcv), attrs,
            links=links, kind=SpanKind.CONSUMER, start_time=b, end_time=e,
            instrumentation_scope=SCOPE))

    # --- escalated raw evidence: ids from the record's identity, never its position in the
    # batch (a live per-step build and the end-of-job build must give one record one id)
    for ev in batch.evidence:
        key = (ev.rank, ev.step)
        b, e = u(ev.rank, ev.begin_ns), u(ev.rank, ev.end_ns)
        extend(key, b, e)
        attrs = {A + "rank": ev.rank, A + "step": ev.step}
        for k2, v in sorted(ev.attributes.items()):
            attrs[A + "evidence." + k2] = v
        attrs.update(_cov_attrs(batch.coverage(ev.rank, ev.step)))
        children.setdefault(key, []).append(ReadableSpan(
            f"evidence: {ev.name}", _ctx(trace_id(job, ev.step), evidence_span_id(job, ev)),
            _ctx(trace_id(job, ev.step), step_span_id(job, ev.rank, ev.step)), resource(ev.rank),
            attrs, start_time=b, end_time=e, instrumentation_scope=SCOPE))

    # --- step spans (from summaries; from their children's extent when a rank sent none)
    steps: Dict[Tuple[int, int], _Step] = {}
    for (r, k), s in summaries.items():
        steps[(r, k)] = _Step(r, k, u(r, s.begin_ns), u(r, s.end_ns), False)
    for key, (b, e) in extent.items():
        if key in steps:
            st = steps[key]
            st.start, st.end = min(st.start, b), max(st.end, e)
        else:
            steps[key] = _Step(key[0], key[1], b, e, True)

    # --- findings: children of (rank, step); a silent rank's go to an observing rank
    findings = batch.result.get("findings", [])
    for fi, f in enumerate(findings):
        for k in f.get("steps", []):
            host = next((r for r in [f["rank"]] + list(f.get("observed_on", []))
                         if (r, k) in steps), None)
            if host is None:
                continue
            st = steps[(host, k)]
            attrs = {A + "rank": host, A + "step": k, A + "finding.cause": f["cause"],
                     A + "finding.rank": f["rank"], A + "finding.confidence": float(f["confidence"]),
                     A + "finding.impact_us": float(f["impact_us"]),
                     A + "finding.observed_on": [int(x) for x in f.get("observed_on", [])],
                     A + "finding.steps": [int(x) for x in f.get("steps", [])]}
            for k2 in ("task_class", "comm_op", "layer"):
                if k2 in f:
                    attrs[A + "finding." + k2] = f[k2]
            skip = {"cause", "rank", "observed_on", "steps", "confidence", "impact_us",
                    "coverage", "task_class", "comm_op", "layer"}
            for k2, v in sorted(f.items()):
                if k2 not in skip and isinstance(v, (int, float, str, bool)):
                    attrs[A + "finding." + k2] = v
            attrs.update(_cov_attrs(_cov_from_dict(f.get("coverage"))))
            status = (Status(StatusCode.ERROR, f["cause"]) if f["confidence"] >= verdict
                      else Status(StatusCode.UNSET))
            children.setdefault((host, k), []).append(ReadableSpan(
                f"finding: {f['cause']}", _ctx(trace_id(job, k), _hash_id(8, job, "finding", fi, k)),
                _ctx(trace_id(job, k), step_span_id(job, host, k)), resource(host), attrs,
                status=status, start_time=st.start, end_time=st.end, instrumentation_scope=SCOPE))

    out: List[ReadableSpan] = []
    keep = None if only_steps is None else set(only_steps)
    for (r, k) in sorted(steps, key=lambda rk: (rk[1], rk[0])):
        if keep is not None and k not in keep:
            continue
        st = steps[(r, k)]
        s = summaries.get((r, k))
        # no findings count here: a step span goes out while the job runs (exporters.stream),
        # before the diagnosis; its finding spans (children) come at the end
        attrs: Dict[str, Any] = {A + "rank": r, A + "step": k, A + "job_id": job}
        if s is not None:
            attrs.update({A + "queue_depth_max": s.queue_depth_max,
                          A + "queue_depth_worker": s.queue_depth_worker,
                          A + "remote_wait.count": s.remote_wait_count,
                          A + "remote_wait.sum_us": round(s.remote_wait_sum_ns / 1000.0, 3)})
        else:
            attrs[A + "partial"] = True
        attrs.update(_cov_attrs(s.coverage if s is not None else Coverage()))
        out.append(ReadableSpan(
            f"step {k}", _ctx(trace_id(job, k), step_span_id(job, r, k)), None, resource(r), attrs,
            kind=SpanKind.INTERNAL, start_time=st.start, end_time=st.end,
            instrumentation_scope=SCOPE))
        out.extend(sorted(children.get((r, k), []),
                          key=lambda sp: (sp.start_time, sp.name, sp.context.span_id)))
    return out


# ------------------------------------------------------------------ the JSON line format

def span_to_dict(span: ReadableSpan) -> Dict[str, Any]:
    """The stable JSON-file format of one span (docs/exporters.md)."""
    ctx = span.context
    return {
        "trace_id": f"{ctx.trace_id:032x}",
        "span_id": f"{ctx.span_id:016x}",
        "parent_span_id": f"{span.parent.span_id:016x}" if span.parent else None,
        "name": span.name,
        "kind": span.kind.name,
        "start_time_unix_nano": span.start_time,
        "end_time_unix_nano": span.end_time,
        "status": {"code": span.status.status_code.name,
                   **({"description": span.status.description} if span.status.description else {})},
        "attributes": {k: (list(v) if isinstance(v, tuple) else v) for k, v in span.attributes.items()},
        "links": [{"trace_id": f"{l.context.trace_id:032x}", "span_id": f"{l.context.span_id:016x}",
                   "attributes": dict(l.attributes or {})} for l in span.links],
        "resource": dict(span.resource.attributes),
        "scope": {"name": span.instrumentation_scope.name,
                  "version": span.instrumentation_scope.version},
    }


def span_to_json_line(span: ReadableSpan) -> str:
    return json.dumps(span_to_dict(span), sort_keys=True, separators=(",", ":")) + "\n"


def span_to_console_line(span: ReadableSpan) -> str:
    """One human line: rank, name, start (ms on the aligned clock), duration, key facts."""
    a = span.attributes
    dur_us = (span.end_time - span.start_time) / 1000.0
    indent = "  " if span.parent else ""
    cov = (f"cov {a.get(A + 'coverage.executed', 0)}/{a.get(A + 'coverage.eligible', 0)}"
           f" lost {a.get(A + 'coverage.lost', 0)}")
    extra = []
    for k in ("finding.confidence", "finding.impact_us", "comm.peer", "comm.gen", "comm.late_us"):
        if A + k in a:
            extra.append(f"{k.split('.')[-1]}={a[A + k]}")
    if span.links:
        extra.append(f"links={len(span.links)}")
    return (f"{indent}rank {a.get(A + 'rank')} {span.name} @{span.start_time / 1e6:.3f}ms "
            f"{dur_us:.1f}us {' '.join(extra)}{' ' if extra else ''}[{cov}]\n")
