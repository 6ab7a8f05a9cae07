"""Engine-agnostic eBPF VM cases (uBPF style): parse a case file, run it on an engine,
compare what came out with what the file expects.

A case file (`tests/bpf/vm_cases/*.txt`) is sections, each opened by a `-- NAME` line.
Lines before the first section and lines starting with `#` are comments.

  -- options        `key value` lines:
                       hook H            hook of the program (default task:end)
                       workers N         worker copies of per-worker maps (default 1)
                       sample_every N    sampling of the attachment (default 1)
                       max_per_epoch N   rate limit: runs per program per epoch
                       max_insns N       instruction budget per run (default abi.MAX_INSNS)
                       trace_budget N    trace_printk bytes per worker per epoch
                       prog_type T       observe | control (default observe)
                       skip ENGINE why   this engine does not run the case, and why
  -- maps           one map per line: NAME TYPE key=K value=V entries=N
                    [lin=LO,HI,STEP] [budget=B]   (order = map index in the program)
  -- asm            the program (dtrace_mk.bpf.asm syntax; map:NAME resolves by -- maps)
  -- events         JSON Lines context records ({"hook": ..., fields}); the hook
                    defaults to the case's hook; absent section = one empty record
  -- ctx-hex        instead of events: one raw 128-byte record in hex
  -- result         r0 per event, one line each (`-` = did not run or faulted), or a
                    single line = r0 of the last event
  -- error          the exact fault message (str(VMFault), "pc N: ...") of the first
                    faulting event
  -- expect-maps    `NAME[KEY] = VALUE`, `NAME = VALUE` (ringbuf records / `{}` empty),
                    `NAME.lost = N`, `NAME.throttled = N`.  KEY and VALUE are integers
                    (little endian, key_size / value_size bytes) or x"hex"; a histogram
                    value is {bucket: count} (nonzero buckets), a per-worker value a list
                    [worker0, worker1, ...], a ringbuf value a list of records.  Every
                    map named must hold exactly the entries listed (arrays: the nonzero
                    entries).
  -- expect-coverage  `eligible=N executed=N throttled=N lost=N` summed over rows (the
                    invariant eligible == executed + throttled + lost is always checked)
  -- expect-trace   trace_printk lines, exact, in order
  -- expect-hints   `worker epoch hint` per set_priority_hint call

An engine is any object with `name` and `run(case) -> Outcome`; `ReferenceEngine` runs
the reference runtime.  The sim backend and the GPU device VM provide their own engines
and run the same files (see `run_and_check`).
"""
from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from dtrace_mk.abi import context
from dtrace_mk.abi import definition as abi
from dtrace_mk.bpf import asm
from dtrace_mk.bpf.program import BpfObject, MapDef, Program

CASE_DIR = Path(__file__).resolve().parent


@dataclass
class Case:
    name: str
    path: Path
    options: Dict[str, str]
    skips: Dict[str, str]
    maps: List[MapDef]
    asm_text: str
    events: List[bytes]
    result: Optional[List[Optional[int]]] = None
    error: Optional[str] = None
    expect_maps: List[Tuple[str, str, Any, Any]] = field(default_factory=list)  # (map, kind, key, value)
    expect_coverage: Optional[Dict[str, int]] = None
    expect_trace: Optional[List[str]] = None
    expect_hints: Optional[List[Tuple[int, int, int]]] = None

    @property
    def hook(self) -> abi.Hook:
        return abi.hook(self.options.get("hook", "task:end"))

    def opt_int(self, key: str, default: int) -> int:
        return int(self.options[key], 0) if key in self.options else default

    def object(self) -> BpfObject:
        insns = asm.assemble(self.asm_text, [m.name for m in self.maps])
        h = self.hook
        prog = Program(self.name, h.section, h, insns, self.options.get("prog_type", "observe"))
        return BpfObject([prog], list(self.maps), path=str(self.path))


@dataclass
class Outcome:
    """What an engine reports.  maps: name -> snapshot in the host model's form with
    skip_zero=True (hash/array: {key: value}; per_worker_array: {key: [per worker]};
    hist: {key: [buckets]}; ringbuf: [record data, ...] in drain order)."""
    results: List[Optional[int]]
    errors: List[str]
    maps: Dict[str, Any]
    map_stats: Dict[str, Tuple[int, int]]        # name -> (lost, throttled)
    coverage: Dict[str, int]                     # summed rows
    coverage_ok: bool
    trace: List[str]
    hints: List[Tuple[int, int, int]]


class CaseError(ValueError):
    pass


def _parse_value(text: str) -> Any:
    t = re.sub(r'x"([0-9a-fA-F\s]*)"', lambda m: repr(bytes.fromhex(m.group(1))), text)
    return ast.literal_eval(t)


def _parse_map_line(line: str, where: str) -> MapDef:
    parts = line.split()
    if len(parts) < 2:
        raise CaseError(f"{where}: map line needs NAME TYPE key=K value=V entries=N: {line}")
    kw = {}
    for p in parts[2:]:
        k, _, v = p.partition("=")
        kw[k] = v
    m = MapDef(parts[0], parts[1], int(kw.get("key", "0"), 0), int(kw.get("value", "0"), 0),
               int(kw.get("entries", "1"), 0), budget_bytes=int(kw.get("budget", "0"), 0))
    if "lin" in kw:
        m.lin_lo, m.lin_hi, m.lin_step = (int(x, 0) for x in kw["lin"].split(","))
    if m.type in ("hist_log2", "hist_linear") and "value" not in kw:
        m.value_size = 8 * m.hist_buckets
    return m


def parse_case(path: Path) -> Case:
    text = path.read_text()
    sections: Dict[str, List[str]] = {}
    cur = None
    for ln, line in enumerate(text.splitlines(), 1):
        m = re.match(r"^--\s*([\w-]+)\s*$", line)
        if m:
            cur = m.group(1)
            if cur in sections:
                raise CaseError(f"{path.name}:{ln}: section '{cur}' twice")
            sections[cur] = []
            continue
        if cur is None:
            continue
        if cur != "asm" and cur != "expect-trace" and (not line.strip() or line.lstrip().startswith("#")):
            continue
        sections[cur].append(line)
    known = {"options", "maps", "asm", "events", "ctx-hex", "result", "error", "expect-maps",
             "expect-coverage", "expect-trace", "expect-hints"}
    unknown = set(sections) - known
    if unknown:
        raise CaseError(f"{path.name}: unknown section(s) {sorted(unknown)}")
    if "asm" not in sections:
        raise CaseError(f"{path.name}: no -- asm section")
    options, skips = {}, {}
    for line in sections.get("options", []):
        k, _, v = line.strip().partition(" ")
        if k == "skip":
            eng, _, why = v.strip().partition(" ")
            if not why:
                raise CaseError(f"{path.name}: 'skip {eng}' needs a reason")
            skips[eng] = why
        else:
            options[k] = v.strip()
    maps = [_parse_map_line(l.strip(), path.name) for l in sections.get("maps", [])]
    case = Case(path.stem, path, options, skips, maps, "\n".join(sections["asm"]), [])
    hook = case.hook
    if "ctx-hex" in sections:
        raw = bytes.fromhex("".join("".join(sections["ctx-hex"]).split()))
        if len(raw) != abi.CONTEXT_SIZE:
            raise CaseError(f"{path.name}: ctx-hex is {len(raw)} bytes, expected {abi.CONTEXT_SIZE}")
        case.events = [raw]
    elif "events" in sections:
        for line in sections["events"]:
            obj = json.loads(line)
            obj.setdefault("hook", hook.name)
            case.events.append(context.from_dict(obj))
    else:
        case.events = [context.pack(hook)]
    if "result" in sections:
        case.result = [None if l.strip() == "-" else int(l.strip(), 0) for l in sections["result"]]
    if "error" in sections:
        case.error = "\n".join(l.strip() for l in sections["error"])
    for line in sections.get("expect-maps", []):
        m = re.match(r"^\s*([\w.]+?)(?:\[(.+?)\])?(?:\.(lost|throttled))?\s*=\s*(.+?)\s*$", line)
        if not m:
            raise CaseError(f"{path.name}: bad expect-maps line: {line}")
        name, key, stat, val = m.groups()
        if stat:
            case.expect_maps.append((name, stat, None, int(val, 0)))
        elif key is not None:
            case.expect_maps.append((name, "entry", _parse_value(key), _parse_value(val)))
        else:
            case.expect_maps.append((name, "whole", None, _parse_value(val)))
    if "expect-coverage" in sections:
        cov = {}
        for tok in " ".join(sections["expect-coverage"]).split():
            k, _, v = tok.partition("=")
            cov[k] = int(v)
        case.expect_coverage = cov
    if "expect-trace" in sections:
        lines = sections["expect-trace"]
        while lines and not lines[-1].strip():
            lines.pop()
        case.expect_trace = lines
    if "expect-hints" in sections:
        case.expect_hints = [tuple(int(x, 0) for x in l.split()) for l in sections["expect-hints"]]
    return case


def all_cases() -> List[Path]:
    return sorted(CASE_DIR.glob("*.txt"))


# ---------------------------------------------------------------------------------
# Expected map contents in the host model's form
# ---------------------------------------------------------------------------------

def _as_bytes(v: Any, size: int, what: str) -> bytes:
    if isinstance(v, bytes):
        if len(v) != size:
            raise CaseError(f"{what}: {len(v)} bytes, expected {size}")
        return v
    return (int(v) & ((1 << (8 * size)) - 1)).to_bytes(size, "little")


def expected_maps(case: Case) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    by_name = {m.name: m for m in case.maps}
    for name, kind, key, val in case.expect_maps:
        if kind in ("lost", "throttled"):
            continue
        md = by_name.get(name)
        if md is None:
            raise CaseError(f"{case.name}: expect-maps names unknown map '{name}'")
        if md.type == "ringbuf":
            out[name] = [bytes(v) for v in val]
            continue
        snap = out.setdefault(name, {})
        if kind == "whole":
            if val != {}:
                raise CaseError(f"{case.name}: '{name} = ...' only takes {{}} for non-ringbuf maps")
            continue
        k = _as_bytes(key, md.key_size, f"{name} key")
        if md.type in ("hist_log2", "hist_linear"):
            b = [0] * md.hist_buckets
            for i, n in val.items():
                b[i] = n
            snap[k] = b
        elif md.type == "per_worker_array":
            snap[k] = [_as_bytes(x, md.value_size, f"{name} value") for x in val]
        else:
            snap[k] = _as_bytes(val, md.value_size, f"{name} value")
    return out


def check(case: Case, got: Outcome) -> List[str]:
    """Differences between what the case expects and what the engine reported."""
    probs: List[str] = []
    if not got.coverage_ok:
        probs.append(f"coverage invariant broken: {got.coverage}")
    if case.result is not None:
        want = case.result
        have = got.results if len(want) > 1 else got.results[-1:]
        if want != have:
            probs.append(f"result: expected {want}, got {have}")
    if case.error is not None:
        have = got.errors[0] if got.errors else None
        if have != case.error:
            probs.append(f"error: expected {case.error!r}, got {have!r}")
    elif got.errors:
        probs.append(f"unexpected fault: {got.errors[0]}")
    exp = expected_maps(case)
    for name, want in exp.items():
        have = got.maps.get(name)
        if have != want:
            probs.append(f"map {name}: expected {want!r}, got {have!r}")
    for name, kind, _, val in case.expect_maps:
        if kind in ("lost", "throttled"):
            lost, thr = got.map_stats.get(name, (0, 0))
            have = lost if kind == "lost" else thr
            if have != val:
                probs.append(f"map {name}.{kind}: expected {val}, got {have}")
    if case.expect_coverage is not None:
        have = {k: got.coverage.get(k) for k in case.expect_coverage}
        if have != case.expect_coverage:
            probs.append(f"coverage: expected {case.expect_coverage}, got {have}")
    if case.expect_trace is not None and got.trace != case.expect_trace:
        probs.append(f"trace: expected {case.expect_trace}, got {got.trace}")
    if case.expect_hints is not None and got.hints != case.expect_hints:
        probs.append(f"hints: expected {case.expect_hints}, got {got.hints}")
    return probs


# ---------------------------------------------------------------------------------
# The reference engine
# ---------------------------------------------------------------------------------

class ReferenceEngine:
    """Runs a case through dtrace_mk.runtime.reference (verify=False: cases include
    programs that must fault)."""
    name = "reference"

    def run(self, case: Case) -> Outcome:
        from dtrace_mk.bpf.maps import RingBufMap
        from dtrace_mk.runtime.reference import ReferenceRuntime
        rt = ReferenceRuntime(num_workers=case.opt_int("workers", 1),
                              max_insns=case.opt_int("max_insns", abi.MAX_INSNS),
                              trace_budget_bytes=case.opt_int("trace_budget", 4096))
        limit = case.opt_int("max_per_epoch", -1)
        aid = rt.attach(case.object(), verify=False, sample_every=case.opt_int("sample_every", 1),
                        max_per_epoch=None if limit < 0 else limit, allow_reserved=True)
        results, errors = [], []
        for ev in case.events:
            for fr in rt.fire(ev):
                results.append(fr.r0)
                if fr.fault is not None:
                    errors.append(str(fr.fault))
        maps = {}
        stats = {}
        for m in rt.maps(aid):
            stats[m.name] = (m.stats.lost, m.stats.throttled)
            if isinstance(m, RingBufMap):
                maps[m.name] = [r.data for r in m.drain()]
            else:
                maps[m.name] = m.snapshot(skip_zero=m.kind in ("array", "per_worker_array"))
        table = rt.coverage_table(aid)
        try:
            table.check()
            ok = True
        except AssertionError:
            ok = False
        t = table.totals()
        cov = {"eligible": t.eligible, "executed": t.executed, "throttled": t.throttled, "lost": t.lost}
        hints = [(w, e, h) for (_, w, e, h) in rt.hints(aid)]
        return Outcome(results, errors, maps, stats, cov, ok, rt.trace_lines(aid), hints)


def run_and_check(path: Path, engine) -> Tuple[Optional[str], List[str]]:
    """(skip reason or None, problems) of one case file on one engine."""
    case = parse_case(path)
    if engine.name in case.skips:
        return case.skips[engine.name], []
    return None, check(case, engine.run(case))
