"""Pass 2, resolve: `ast.Program` + task schema -> `ResolvedProgram`.

Checks everything that does not need code generation and annotates the tree:

* probes: names exist (globs like `task:*` expand), host probes (BEGIN, END, interval)
  are not mixed with hook probes in one clause;
* identifiers: context fields by their language names (abi.LANG_FIELDS), valid at EVERY
  probe of the clause (the error names the probe), the `probe` builtin, FLAG_* constants;
* types: named id types (task.class, comm.op, event.id, probe) compare only with their
  names, which resolve through the schema at compile time (unknown names list the near
  matches); strings appear nowhere else;
* variables: assigned before use;
* maps: one aggregation per map (with one lhist range and one key arity), keys of
  8 bytes each (at most MAX_KEY_SIZE bytes), known maps in print/clear;
* statements: host clauses print/clear/exit, hook clauses aggregate/evidence/exit.

All errors of the pass are collected and raised together.
"""
from __future__ import annotations

import fnmatch
import difflib
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Set, Tuple

from ...abi import definition as abi
from ...abi.schema import TaskSchema
from .. import ast
from ..diagnostics import CompileError, Diagnostic, Source, Span, near

AGGREGATIONS = {"count": 0, "sum": 1, "avg": 1, "min": 1, "max": 1, "stats": 1, "hist": 1, "lhist": 4}
HOST_CALLS = ("print", "printa", "clear", "exit")
DEVICE_CALLS = ("evidence", "exit")
ALL_CALLS = sorted(set(HOST_CALLS) | set(DEVICE_CALLS) | set(AGGREGATIONS))
MAX_KEYS = abi.MAX_KEY_SIZE // 8
MAX_EVIDENCE_FIELDS = 16

# Fields whose values are schema ids; the printer renders them as names.
NAMED_FIELDS = {"task_class": "task_class", "comm_op": "comm_op", "event_id": "event", "hook": "hook"}
NAMED_TYPE_WORDS = {"task_class": "task class", "comm_op": "comm op", "event": "event", "hook": "probe"}
_PLURAL = {"task_class": "task classes", "comm_op": "comm ops", "event": "events", "hook": "probes"}
CONSTANTS = {f"FLAG_{k}": v for k, v in abi.FLAGS.items()}
CONSTANTS["NONE"] = abi.NONE_U32


@dataclass
class KeyInfo:
    name: str           # source text of the key expression ("task.class")
    ty: str             # "int" or a named type


@dataclass
class MapInfo:
    name: str                       # "@slow" ("@" for the unnamed map)
    bpf_name: str                   # the ELF map name ("slow", "_" for "@")
    agg: str                        # count | sum | avg | min | max | stats | hist | lhist
    keys: List[KeyInfo]
    span: Span                      # first use
    lhist: Tuple[int, int, int] = (0, 0, 0)
    clauses: Set[int] = field(default_factory=set)


@dataclass
class EvidenceInfo:
    tag: int                        # record tag (first u64 of each record)
    clause: int
    fields: List[KeyInfo]
    span: Span


@dataclass
class ResolvedClause:
    clause: ast.Clause
    hooks: List[abi.Hook]           # empty for host clauses
    variables: List[str]            # scratch variables in order of first assignment


@dataclass
class ResolvedProgram:
    source: Source
    schema: TaskSchema
    clauses: List[ResolvedClause]
    maps: Dict[str, MapInfo]        # by "@name", in order of first use
    evidence: List[EvidenceInfo]
    uses_exit: bool = False         # some hook clause calls exit()


class _Resolver:
    def __init__(self, src: Source, schema: TaskSchema):
        self.src = src
        self.schema = schema
        self.errors: List[Diagnostic] = []
        self.maps: Dict[str, MapInfo] = {}
        self.evidence: List[EvidenceInfo] = []
        self.uses_exit = False
        self.map_refs: List[ast.MapRef] = []      # print/clear args, checked at the end

    def err(self, span: Span, msg: str, *notes: str) -> None:
        self.errors.append(Diagnostic(span, msg, "error", tuple(notes)))

    def text(self, span: Span) -> str:
        return self.src.text[span.start:span.end]

    # -- probes ----------------------------------------------------------------------
    def probes(self, c: ast.Clause) -> List[abi.Hook]:
        hooks: List[abi.Hook] = []
        kinds = {p.kind == "hook" for p in c.probes}
        if len(kinds) > 1:
            p = next(p for p in c.probes if p.kind != "hook")
            self.err(p.span, f"probe '{p.name}' runs on the host and cannot share a clause with "
                             f"hook probes")
            return []
        names = [h.name for h in abi.HOOKS]
        for p in c.probes:
            if p.kind != "hook":
                if p.kind in ("BEGIN", "END") and len(c.probes) > 1:
                    self.err(p.span, f"probe '{p.name}' must be the only probe of its clause")
                continue
            if any(ch in p.name for ch in "*?["):
                found = [abi.HOOKS_BY_NAME[n] for n in names if fnmatch.fnmatchcase(n, p.name)]
                if not found:
                    self.err(p.span, f"probe pattern '{p.name}' matches no probe")
            else:
                h = abi.HOOKS_BY_NAME.get(p.name)
                if h is None:
                    self.err(p.span, f"unknown probe '{p.name}'"
                             + near(difflib.get_close_matches(p.name, names, n=3, cutoff=0.5)))
                found = [h] if h else []
            for h in found:
                if h not in hooks:
                    hooks.append(h)
        return hooks

    # -- expressions -----------------------------------------------------------------
    def expr(self, e: ast.Expr, hooks: List[abi.Hook], vars_: Dict[str, str], host: bool) -> None:
        if isinstance(e, ast.Int):
            e.ty = "int"
        elif isinstance(e, ast.Str):
            e.ty = "str"
        elif isinstance(e, ast.Var):
            if e.name not in vars_:
                self.err(e.span, f"variable ${e.name} is used before it is assigned")
                e.ty = "int"
            else:
                e.ty = vars_[e.name]
        elif isinstance(e, ast.Ident):
            self.ident(e, hooks, host)
        elif isinstance(e, ast.Unary):
            self.expr(e.operand, hooks, vars_, host)
            self.no_string(e.operand, f"operator '{e.op}'")
            e.ty = "int"
        elif isinstance(e, ast.Binary):
            self.expr(e.left, hooks, vars_, host)
            self.expr(e.right, hooks, vars_, host)
            if e.op in ("==", "!=") and (e.left.ty == "str" or e.right.ty == "str"):
                self.compare_name(e)
            else:
                self.no_string(e.left, f"operator '{e.op}'")
                self.no_string(e.right, f"operator '{e.op}'")
            e.ty = "int"
        else:  # pragma: no cover - parser builds nothing else
            raise AssertionError(type(e))

    def no_string(self, e: ast.Expr, where: str) -> None:
        if e.ty == "error":
            e.ty = "int"
            return
        if e.ty == "str":
            self.err(e.span, f"a string cannot be used with {where} (strings only name task "
                             f"classes, comm ops, events and probes in == and != comparisons)")
            e.ty = "int"

    def ident(self, e: ast.Ident, hooks: List[abi.Hook], host: bool) -> None:
        if e.name == "probe":
            e.kind, e.ty = "probe", "hook"
            if host:
                self.err(e.span, "'probe' is only available in hook clauses")
            return
        if e.name in CONSTANTS:
            e.kind, e.const, e.ty = "const", CONSTANTS[e.name], "int"
            return
        f = abi.LANG_FIELDS.get(e.name)
        if f is None:
            cands = list(abi.LANG_FIELDS) + list(CONSTANTS) + ["probe"]
            self.err(e.span, f"unknown field '{e.name}'"
                     + near(difflib.get_close_matches(e.name, cands, n=3, cutoff=0.6)))
            e.kind, e.ty = "const", "error"
            e.const = 0
            return
        e.kind, e.field, e.ty = "field", f.name, NAMED_FIELDS.get(f.name, "int")
        if host:
            self.err(e.span, f"field '{e.name}' is not available in host clauses (BEGIN, END, "
                             f"interval); only hook probes have a context")
            return
        bad = [h.name for h in hooks if not abi.field_valid(h, f.name)]
        if bad:
            where = ", ".join(f"'{b}'" for b in bad)
            avail = [h.name for h in abi.HOOKS if abi.field_valid(h, f.name)]
            self.err(e.span, f"field '{e.name}' is not valid at probe {where}",
                     f"'{e.name}' is available at: {', '.join(avail)}")

    def compare_name(self, e: ast.Binary) -> None:
        s, other = (e.left, e.right) if e.left.ty == "str" else (e.right, e.left)
        assert isinstance(s, ast.Str)
        if other.ty == "error":
            return
        if other.ty == "str":
            self.err(e.span, "comparing two strings is not supported")
            return
        kind = other.ty
        if kind not in NAMED_TYPE_WORDS:
            self.err(s.span, f"cannot compare '{self.text(other.span)}' with a string (strings name "
                             f"task classes, comm ops, events and probes)")
            return
        s.ty = kind
        word = NAMED_TYPE_WORDS[kind]
        if kind == "hook":
            h = abi.HOOKS_BY_NAME.get(s.value)
            if h is None:
                self.err(s.span, f'unknown probe "{s.value}"' + near(difflib.get_close_matches(
                    s.value, [x.name for x in abi.HOOKS], n=3, cutoff=0.5)))
                return
            s.id = h.id
            return
        lookup = {"task_class": self.schema.class_id, "comm_op": self.schema.comm_op_id,
                  "event": self.schema.event_id}[kind]
        try:
            s.id = lookup(s.value)
        except KeyError:
            nm = self.schema.near_matches(kind, s.value)
            notes = ()
            if not nm:
                names = self.schema.names(kind)
                notes = (f"{_PLURAL[kind]} in schema '{self.schema.model}': "
                         + (", ".join(names) if names else "(none)"),)
            self.err(s.span, f'unknown {word} "{s.value}"' + near(nm), *notes)

    # -- statements ------------------------------------------------------------------
    def stmts(self, body: List[ast.Stmt], rc: ResolvedClause, vars_: Dict[str, str]) -> None:
        host = not rc.hooks and rc.clause.is_host
        for s in body:
            if isinstance(s, ast.VarAssign):
                if host:
                    self.err(s.span, "scratch variables are only available in hook clauses")
                    continue
                self.expr(s.value, rc.hooks, vars_, host)
                self.no_string(s.value, "an assignment")
                if s.name not in vars_:
                    vars_[s.name] = s.value.ty
                    rc.variables.append(s.name)
                elif vars_[s.name] != s.value.ty:
                    vars_[s.name] = "int"
            elif isinstance(s, ast.If):
                if host:
                    self.err(s.span, "'if' is only available in hook clauses")
                    continue
                self.expr(s.cond, rc.hooks, vars_, host)
                self.no_string(s.cond, "'if'")
                self.stmts(s.then, rc, vars_)
                self.stmts(s.orelse, rc, vars_)
            elif isinstance(s, ast.MapAssign):
                self.map_assign(s, rc, vars_, host)
            elif isinstance(s, ast.Call):
                self.call(s, rc, vars_, host)

    def map_assign(self, s: ast.MapAssign, rc: ResolvedClause, vars_: Dict[str, str], host: bool) -> None:
        if host:
            self.err(s.span, f"aggregations run on the device; {s.target.name} cannot be updated in "
                             f"the host clause '{rc.clause.probes[0].name}'")
            return
        if s.func not in AGGREGATIONS:
            self.err(s.func_span, f"unknown aggregation '{s.func}'" + near(difflib.get_close_matches(
                s.func, list(AGGREGATIONS), n=3, cutoff=0.5)))
            return
        want = AGGREGATIONS[s.func]
        if len(s.args) != want:
            self.err(s.func_span, f"{s.func}() takes {want} argument{'s' if want != 1 else ''}, "
                                  f"got {len(s.args)}")
            return
        for a in s.args:
            if isinstance(a, ast.MapRef):
                self.err(a.span, f"a map cannot be an argument of {s.func}()")
                return
            self.expr(a, rc.hooks, vars_, host)
            self.no_string(a, f"{s.func}()")
        lh = (0, 0, 0)
        if s.func == "lhist":
            vals = []
            for a in s.args[1:]:
                v = signed_const(a)
                if v is None:
                    self.err(a.span, "lhist() bounds must be constant numbers: lhist(x, lo, hi, step)")
                    return
                vals.append(v)
            lo, hi, step = vals
            if step <= 0 or hi <= lo:
                self.err(s.func_span, f"lhist() needs lo < hi and step > 0, got {lo}, {hi}, {step}")
                return
            nb = (hi - lo + step - 1) // step + 2
            if nb > abi.HIST_LINEAR_MAX_BUCKETS:
                self.err(s.func_span, f"lhist() would have {nb} buckets (at most "
                                      f"{abi.HIST_LINEAR_MAX_BUCKETS}); use a larger step")
                return
            lh = (lo, hi, step)
        keys = []
        for k in s.target.keys:
            self.expr(k, rc.hooks, vars_, host)
            self.no_string(k, "a map key")
            keys.append(KeyInfo(self.text(k.span), k.ty))
        if len(keys) > MAX_KEYS:
            self.err(s.target.span, f"{s.target.name} has {len(keys)} keys; at most {MAX_KEYS} "
                                    f"({abi.MAX_KEY_SIZE} bytes of 8-byte keys)")
            return
        m = self.maps.get(s.target.name)
        if m is None:
            bpf = s.target.name[1:] or "_"
            self.maps[s.target.name] = MapInfo(s.target.name, bpf, s.func, keys, s.target.span, lh,
                                               {rc.clause.index})
            return
        line, col = self.src.position(m.span.start)
        if m.agg != s.func:
            self.err(s.func_span, f"map {m.name} is used with several aggregations: {s.func}() here, "
                                  f"{m.agg}() at {line}:{col}")
            return
        if len(m.keys) != len(keys):
            self.err(s.target.span, f"map {m.name} is used with {len(keys)} key(s) here and "
                                    f"{len(m.keys)} at {line}:{col}")
            return
        if m.lhist != lh:
            self.err(s.func_span, f"map {m.name} is used with lhist range {lh[0]}, {lh[1]}, {lh[2]} "
                                  f"here and {m.lhist[0]}, {m.lhist[1]}, {m.lhist[2]} at {line}:{col}")
            return
        for i, (a, b) in enumerate(zip(m.keys, keys)):
            if a.ty != b.ty:
                m.keys[i] = KeyInfo(a.name, "int")
        m.clauses.add(rc.clause.index)

    def call(self, s: ast.Call, rc: ResolvedClause, vars_: Dict[str, str], host: bool) -> None:
        f = s.func
        if f in AGGREGATIONS:
            self.err(s.func_span, f"{f}() must be assigned to a map: @name = {f}(...)")
            return
        if f not in ALL_CALLS:
            self.err(s.func_span, f"unknown function '{f}'" + near(difflib.get_close_matches(
                f, ALL_CALLS, n=3, cutoff=0.5)))
            return
        if host and f not in HOST_CALLS:
            self.err(s.func_span, f"{f}() runs on the device; it is not available in the host "
                                  f"clause '{rc.clause.probes[0].name}'")
            return
        if not host and f not in DEVICE_CALLS:
            self.err(s.func_span, f"{f}() runs on the host; use it in an END or interval clause")
            return
        if f == "exit":
            if s.args:
                self.err(s.func_span, "exit() takes no arguments")
            if not host:
                self.uses_exit = True
            return
        if f in ("print", "printa", "clear"):
            if len(s.args) != 1:
                self.err(s.func_span, f"{f}() takes one map (or, for print, one string), "
                                      f"got {len(s.args)} arguments")
                return
            a = s.args[0]
            if isinstance(a, ast.MapRef):
                if a.keys:
                    self.err(a.span, f"{f}() takes a whole map; drop the key")
                    return
                self.map_refs.append(a)
            elif f == "print" and isinstance(a, ast.Str):
                a.ty = "str"
            else:
                self.err(a.span, f"{f}() takes a map such as @name")
            return
        # evidence
        if not s.args:
            self.err(s.func_span, "evidence() needs at least one field, e.g. evidence(task.dur_ns)")
            return
        if len(s.args) > MAX_EVIDENCE_FIELDS:
            self.err(s.func_span, f"evidence() takes at most {MAX_EVIDENCE_FIELDS} fields, got {len(s.args)}")
            return
        fields = []
        for a in s.args:
            if isinstance(a, ast.MapRef):
                self.err(a.span, "a map cannot be an argument of evidence()")
                return
            self.expr(a, rc.hooks, vars_, host)
            self.no_string(a, "evidence()")
            fields.append(KeyInfo(self.text(a.span), a.ty))
        self.evidence.append(EvidenceInfo(len(self.evidence), rc.clause.index, fields, s.span))

    # -- the pass --------------------------------------------------------------------
    def run(self, prog: ast.Program) -> ResolvedProgram:
        clauses = []
        for c in prog.clauses:
            nerr = len(self.errors)
            hooks = self.probes(c)
            if len(self.errors) > nerr:
                continue            # the body is checked against probes that do not exist
            rc = ResolvedClause(c, hooks, [])
            vars_: Dict[str, str] = {}
            if c.predicate is not None:
                if c.is_host:
                    self.err(c.predicate.span, f"probe '{c.probes[0].name}' runs on the host and "
                                               f"cannot have a predicate")
                else:
                    self.expr(c.predicate, hooks, vars_, False)
                    self.no_string(c.predicate, "a predicate")
            self.stmts(c.body, rc, vars_)
            clauses.append(rc)
        for ref in self.map_refs:
            if ref.name not in self.maps:
                self.err(ref.span, f"unknown map {ref.name}" + near(difflib.get_close_matches(
                    ref.name, list(self.maps), n=3, cutoff=0.5)))
        bpf_names: Dict[str, str] = {}
        for m in self.maps.values():
            if m.bpf_name in bpf_names or m.bpf_name.startswith("dtmk_"):
                self.err(m.span, f"map name {m.name} is reserved or clashes with "
                                 f"{bpf_names.get(m.bpf_name, 'an internal map')}")
            bpf_names[m.bpf_name] = m.name
        if self.errors:
            raise CompileError(self.errors)
        return ResolvedProgram(self.src, self.schema, clauses, self.maps, self.evidence, self.uses_exit)


def signed_const(e: ast.Expr) -> Optional[int]:
    from .fold import signed_const as sc     # fold imports this module
    return sc(e)


def resolve(prog: ast.Program, src: Source, schema: TaskSchema) -> ResolvedProgram:
    """The pass: (ast.Program, Source, TaskSchema) -> ResolvedProgram (raises CompileError)."""
    return _Resolver(src, schema).run(prog)
