"""`dtrace-mk run-vm FILE --events EVENTS`: run a monitor on the reference VM over recorded
hook contexts and print its maps and coverage.

    dtrace-mk run-vm mon.o --events events.jsonl
    dtrace-mk run-vm prog.bin --hook task:end --events events.ctx -f json

FILE is an ELF object (clang -target bpf) or raw bytecode with --hook (which, as for
`verify`, also overrides the hook of an object's programs).  EVENTS is JSON Lines, one
context record per line with ABI field names ({"hook": "task:end", "task_class": 3,
"dur_ns": 1200}), or raw 128-byte records when the name ends in .ctx (what
`dtrace-mk run --events-out` writes).  Every program is verified, attached to the
reference runtime and fed every record in order; then maps, coverage per program, hook
and epoch (eligible = executed + throttled + lost), trace lines, evidence and faults are
printed.  --workers defaults to the largest worker id in the events plus one.

Exit status: 0 done; 1 a program was rejected by the verifier; 2 bad file or events.
"""
from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence

from ..abi import context
from ..bpf.maps import Map, RingBufMap
from ..bpf.program import BpfObject
from ..errors import UserError
from ..runtime.reference import ReferenceRuntime

NAME = "run-vm"
ORDER = 24
HELP = "run an eBPF monitor on the reference VM over recorded hook contexts; print maps and coverage"
DESCRIPTION = __doc__.split("\n\n", 1)[1]

# Sources of the object to run, tried in order: each takes the parsed arguments and
# returns a BpfObject, or None when its option was not given.  The query language adds
# one for `-e 'QUERY'` (with its own add_arguments hook) in front of the file source.
ObjectSource = Callable[[argparse.Namespace], Optional[BpfObject]]
ARGUMENT_HOOKS: List[Callable[[argparse.ArgumentParser], None]] = []
OBJECT_SOURCES: List[ObjectSource] = []

# The query language: -e 'QUERY' (and printing through a query's plan, see run()).
from ..lang import cli_hooks as _lang  # noqa: E402  (added by dtrace_mk.lang)
ARGUMENT_HOOKS.append(_lang.add_query_arguments)
OBJECT_SOURCES.append(_lang.object_from_query)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", metavar="FILE", nargs="?", help="eBPF object (.o) or raw bytecode (.bin, needs --hook)")
    p.add_argument("--events", metavar="EVENTS", required=True,
                   help="hook contexts: JSON Lines, or raw 128-byte records (.ctx)")
    p.add_argument("--hook", metavar="H", help="hook for raw bytecode; overrides an object's section hooks")
    p.add_argument("--program", metavar="NAME", help="attach only this program")
    p.add_argument("--workers", type=int, metavar="N",
                   help="worker copies of per-worker maps (default: largest worker in EVENTS + 1)")
    p.add_argument("-f", "--format", choices=("text", "json"), default="text", help="output format")
    for hook in ARGUMENT_HOOKS:
        hook(p)


def _file_source(args: argparse.Namespace) -> Optional[BpfObject]:
    if not args.file:
        return None
    from .verify import obtain_object        # one loader for FILE (+ --hook) across commands
    obj = obtain_object(args)
    if args.hook:
        from dataclasses import replace
        from ..abi import definition as abi
        try:
            h = abi.hook(args.hook)
        except KeyError:
            raise UserError(f"--hook: unknown hook '{args.hook}'") from None
        obj.programs = [replace(p, hook=h, section=h.section) for p in obj.programs]
    return obj


def object_from_args(args: argparse.Namespace) -> BpfObject:
    """The object to run: the first source that answers (plug-ins first, FILE last)."""
    for source in OBJECT_SOURCES + [_file_source]:
        obj = source(args)
        if obj is not None:
            return obj
    raise UserError("nothing to run: give FILE" + (" or -e QUERY" if OBJECT_SOURCES else ""))


@dataclass
class VmRun:
    """The result of one run-vm: the runtime and the attachment to print."""
    obj: BpfObject
    runtime: ReferenceRuntime
    attachment: int
    events: int


def execute(obj: BpfObject, records: Sequence[bytes], *, num_workers: Optional[int] = None,
            programs: Optional[Sequence[str]] = None, verify: bool = True) -> VmRun:
    """Verify and attach `obj` to a fresh reference runtime and fire every record."""
    if num_workers is None:
        num_workers = 1 + max((context.unpack(r)["worker"] for r in records), default=0)
    if num_workers < 1:
        raise UserError(f"--workers must be >= 1, got {num_workers}")
    rt = ReferenceRuntime(num_workers=num_workers)
    aid = rt.attach(obj, verify=verify, programs=programs)
    for i, rec in enumerate(records):
        try:
            rt.fire(rec)
        except UserError as e:
            raise UserError(f"event {i + 1}: {e}") from None
    rt.evidence(aid)            # drain the rings into the attachment's evidence
    return VmRun(obj, rt, aid, len(records))


# ---------------------------------------------------------------------------------
# Rendering (a query's printing plan replaces this; these are the generic forms)
# ---------------------------------------------------------------------------------

def _int_of(b: bytes) -> Optional[int]:
    return int.from_bytes(b, "little") if len(b) in (1, 2, 4, 8) else None


def _bytes_json(b: bytes) -> Dict[str, Any]:
    d: Dict[str, Any] = {"hex": b.hex()}
    v = _int_of(b)
    if v is not None:
        d["int"] = v
    return d


def _bytes_text(b: bytes) -> str:
    v = _int_of(b)
    return str(v) if v is not None else "0x" + b.hex()


def _hist_ranges(m: Map) -> List[str]:
    md = m.mdef
    if md.type == "hist_log2":
        out = ["0"]
        for i in range(1, md.hist_buckets):
            out.append(f"[{1 << (i - 1)}, {'inf' if i == md.hist_buckets - 1 else 1 << i})")
        return out
    lo, hi, st = md.lin_lo, md.lin_hi, md.lin_step
    n = md.hist_buckets
    return ([f"(-inf, {lo})"] + [f"[{lo + i * st}, {min(lo + (i + 1) * st, hi)})" for i in range(n - 2)]
            + [f"[{hi}, inf)"])


def map_json(m: Map) -> Dict[str, Any]:
    out: Dict[str, Any] = {"type": m.kind, "lost": m.stats.lost, "throttled": m.stats.throttled}
    if isinstance(m, RingBufMap):
        out["pending"] = len(m.snapshot())
        return out
    entries = []
    if m.kind in ("hist_log2", "hist_linear"):
        ranges = _hist_ranges(m)
        for k, buckets in m.snapshot().items():
            entries.append({"key": _bytes_json(k), "buckets": [
                {"bucket": i, "range": ranges[i], "count": c} for i, c in enumerate(buckets) if c]})
    elif m.kind == "per_worker_array":
        for k, vals in m.snapshot(skip_zero=True, per_worker=True).items():
            entries.append({"key": _bytes_json(k), "per_worker": [_bytes_json(v) for v in vals]})
    else:
        for k, v in m.snapshot(skip_zero=m.kind == "array").items():
            entries.append({"key": _bytes_json(k), "value": _bytes_json(v)})
    out["entries"] = entries
    return out


def result_json(run: VmRun) -> Dict[str, Any]:
    rt, aid = run.runtime, run.attachment
    return {
        "object": run.obj.path,
        "events": run.events,
        "maps": {m.name: map_json(m) for m in rt.maps(aid)},
        "coverage": [c.to_dict() for c in rt.coverage(aid)],
        "trace": rt.trace_lines(aid),
        "evidence": [{"map": name, "worker": r.worker, "epoch": r.epoch, "hex": r.data.hex()}
                     for name, r in rt.evidence(aid, drain=False)],
        "faults": [{"program": p, "epoch": ep, "pc": f.pc, "message": str(f)}
                   for p, ep, f in rt.faults(aid)],
    }


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> List[str]:
    cols = [list(map(str, c)) for c in zip(header, *rows)]
    widths = [max(len(x) for x in c) for c in cols]
    fmt = lambda r: "  ".join(str(x).ljust(w) for x, w in zip(r, widths)).rstrip()  # noqa: E731
    return [fmt(header)] + [fmt(r) for r in rows]


def render_text(run: VmRun) -> str:
    rt, aid = run.runtime, run.attachment
    out = [f"{run.obj.path}: {run.events} events, "
           f"{len(run.obj.programs)} program(s), {rt.num_workers} worker(s)"]
    if len(rt.maps(aid)):
        out.append("")
    for m in rt.maps(aid):
        stat = []
        if m.stats.lost:
            stat.append(f"{m.stats.lost} lost")
        if m.stats.throttled:
            stat.append(f"{m.stats.throttled} throttled")
        out.append(f"@{m.name} ({m.kind}" + (", " + ", ".join(stat) if stat else "") + "):")
        body: List[str] = []
        if isinstance(m, RingBufMap):
            n = sum(1 for name, _ in rt.evidence(aid, drain=False) if name == m.name)
            body.append(f"  {n} record(s) (see evidence)")
        elif m.kind in ("hist_log2", "hist_linear"):
            ranges = _hist_ranges(m)
            for k, buckets in m.snapshot().items():
                body.append(f"  [{_bytes_text(k)}]:")
                top = max(buckets) or 1
                for i, c in enumerate(buckets):
                    if c:
                        body.append(f"    {ranges[i]:>24} {c:>8} |{'@' * max(1, round(40 * c / top))}")
        elif m.kind == "per_worker_array":
            for k, vals in m.snapshot(skip_zero=True, per_worker=True).items():
                body.append(f"  [{_bytes_text(k)}]: " + " ".join(_bytes_text(v) for v in vals)
                            + f"  (sum {_bytes_text(m.snapshot(skip_zero=True, per_worker=False)[k])})")
        else:
            for k, v in m.snapshot(skip_zero=m.kind == "array").items():
                body.append(f"  [{_bytes_text(k)}]: {_bytes_text(v)}")
        out += body or ["  (empty)"]
    out.append("")
    out.append("coverage:")
    rows = [(c.program, c.hook, c.epoch, c.program_gen, c.eligible, c.executed, c.throttled, c.lost,
             ", ".join(f"{r} x{n}" for r, n in sorted(c.reasons.items())))
            for c in rt.coverage(aid)]
    if rows:
        out += ["  " + l for l in _table(("program", "hook", "epoch", "gen", "eligible", "executed",
                                          "throttled", "lost", "why"), rows)]
    else:
        out.append("  (no event reached an attached hook)")
    trace = rt.trace_lines(aid)
    if trace:
        out += ["", "trace:"] + ["  " + t for t in trace]
    ev = rt.evidence(aid, drain=False)
    if ev:
        out += ["", "evidence:"] + [f"  {name} worker {r.worker} epoch {r.epoch}: {r.data.hex()}"
                                    for name, r in ev]
    faults = rt.faults(aid)
    if faults:
        out += ["", "faults:"] + [f"  {p} epoch {ep}: {f}" for p, ep, f in faults]
    return "\n".join(out) + "\n"


def run(args: argparse.Namespace) -> int:
    obj = object_from_args(args)
    records = context.read_events(args.events)
    if _lang.print_with_plan(obj, records, args):     # compiled from a query: bpftrace-style
        return 0
    result = execute(obj, records, num_workers=args.workers,
                     programs=[args.program] if args.program else None)
    if args.format == "json":
        print(json.dumps(result_json(result), indent=1))
    else:
        print(render_text(result), end="")
    return 0
