"""Pass 4, lower: `ResolvedProgram` -> `LoweredProgram` (eBPF programs, map definitions,
the printing plan).

One program per (hook clause, probe), section = the hook's section, so the object has
the same shape as a clang-built monitor.  Code is generated as assembly text (uBPF
syntax with labels) and assembled by `dtrace_mk.bpf.asm`, so what the golden tests show
is exactly what runs.  Each assembly line remembers the source span it came from, so a
verifier rejection at instruction N maps back to the clause and statement.

Register conventions:
    r6  the context pointer (saved from r1 on entry)
    r7  the value of the aggregation being updated (survives helper calls)
    r0-r5, r8, r9  expression temporaries (no calls happen inside an expression)

Stack (r10-relative; sizes fixed per program):
    [-8*(i+1)]                    scratch variable i (zeroed on entry)
    (stores are always register stores, stx, as clang emits them; LLVM 14's objdump
    does not decode the immediate-store form)
    KEY = -(8*nvars + 64)         map key buffer, 8 bytes per key (4 bytes, value 0, for
                                  maps without keys)
    VAL = KEY - 32                initial value for a new hash entry
    EV  = VAL - 8*(1+16)          evidence record: u64 tag, then u64 per field

Map semantics (chosen so the same object is correct with many workers at once):
    count/sum/avg, no key   per_worker_array[1]; lookup, null check, atomic add
    count/sum/avg, keyed    hash; lookup, else insert zeroes with NOEXIST and look up
                            again (a racing insert is harmless), null check, atomic add
    min/max/stats           hash (key 0 when unkeyed): initial min U64_MAX, compare-and-
                            store for min/max (monotonic, so a lost race only delays)
    hist / lhist            hist_log2 / hist_linear via the hist_add helper
    evidence(...)           ringbuf `dtmk_evidence` via ringbuf_output (byte budget)
    exit()                  array `dtmk_exit`, the host stops when it reads non-zero
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

from ...abi import definition as abi
from ...bpf import asm
from ...bpf.program import BpfObject, MapDef, Program
from .. import ast
from ..diagnostics import Span, error
from .fold import const_value
from .resolve import MapInfo, ResolvedClause, ResolvedProgram

PLAN_VERSION = 1
EVIDENCE_MAP = "dtmk_evidence"
EXIT_MAP = "dtmk_exit"
NOTE_PLAN = "dtmk_plan"          # BpfObject.notes key (ELF section of the same name)


@dataclass
class Options:
    max_entries: int = 4096             # hash / histogram maps
    evidence_budget: int = 4096         # evidence bytes per worker per epoch
    evidence_ring: int = 65536          # ring bytes per worker


@dataclass
class LoweredProgram:
    obj: BpfObject
    plan: dict
    asm: Dict[str, str]                              # program name -> assembly text
    origins: Dict[str, List[Optional[Span]]]         # program name -> span per slot
    resolved: ResolvedProgram


VALUE_WORDS = {"count": ["count"], "sum": ["sum"], "min": ["min"], "max": ["max"],
               "avg": ["count", "sum"], "stats": ["count", "sum", "min", "max"]}
_CMP = {"==": "jeq", "!=": "jne", "<": "jlt", "<=": "jle", ">": "jgt", ">=": "jge"}
_INVERSE = {"==": "!=", "!=": "==", "<": ">=", ">=": "<", "<=": ">", ">": "<="}
_MIRROR = {"==": "==", "!=": "!=", "<": ">", ">": "<", "<=": ">=", ">=": "<="}
_ALU = {"+": "add", "-": "sub", "*": "mul", "/": "div", "%": "mod", "&": "and", "|": "or",
        "^": "xor", "<<": "lsh", ">>": "rsh"}
_TEMPS = ("r0", "r1", "r2", "r3", "r4", "r5", "r8", "r9")
U64 = (1 << 64) - 1


def map_def(m: MapInfo, opt: Options) -> MapDef:
    keyed = bool(m.keys)
    key_size = 8 * len(m.keys) if keyed else 4
    if m.agg in ("count", "sum", "avg"):
        vs = 8 * len(VALUE_WORDS[m.agg])
        if keyed:
            return MapDef(m.bpf_name, "hash", key_size, vs, opt.max_entries)
        return MapDef(m.bpf_name, "per_worker_array", 4, vs, 1)
    if m.agg in ("min", "max", "stats"):
        return MapDef(m.bpf_name, "hash", key_size, 8 * len(VALUE_WORDS[m.agg]),
                      opt.max_entries if keyed else 1)
    if m.agg == "hist":
        return MapDef(m.bpf_name, "hist_log2", key_size, 8 * abi.HIST_LOG2_BUCKETS,
                      opt.max_entries if keyed else 1)
    lo, hi, step = m.lhist
    md = MapDef(m.bpf_name, "hist_linear", key_size, 0, opt.max_entries if keyed else 1,
                lin_lo=lo, lin_hi=hi, lin_step=step)
    md.value_size = 8 * md.hist_buckets
    return md


def _fits_imm(v: int) -> bool:
    return 0 <= v < (1 << 31)


class _Gen:
    """Code generator for one (clause, hook) program."""

    def __init__(self, rp: ResolvedProgram, rc: ResolvedClause, hook: abi.Hook,
                 defs: Dict[str, MapDef]):
        self.rp, self.rc, self.hook, self.defs = rp, rc, hook, defs
        self.lines: List[Tuple[str, Optional[Span]]] = []
        self.span: Optional[Span] = rc.clause.span
        self.nlabel = 0
        self.free = list(_TEMPS)
        self.var_off = {v: -8 * (i + 1) for i, v in enumerate(rc.variables)}
        self.key_off = -(8 * len(rc.variables) + 64)
        self.val_off = self.key_off - 32
        self.ev_off = self.val_off - 8 * 17
        if -self.ev_off > abi.STACK_SIZE:
            raise error(rc.clause.span, f"too many scratch variables ({len(rc.variables)}); the "
                                        f"{abi.STACK_SIZE}-byte stack holds at most "
                                        f"{(abi.STACK_SIZE - 232) // 8}")

    # -- emission --------------------------------------------------------------------
    def emit(self, text: str) -> None:
        self.lines.append(("    " + text, self.span))

    def label(self) -> str:
        self.nlabel += 1
        return f"L{self.nlabel}"

    def place(self, lbl: str) -> None:
        self.lines.append((f"{lbl}:", None))

    def comment(self, text: str) -> None:
        self.lines.append((f"; {text}", None))

    def alloc(self, span: Span) -> str:
        if not self.free:
            raise error(span, "expression too complex (ran out of registers); split it with "
                              "$variables")
        return self.free.pop(0)

    def release(self, r: str) -> None:
        self.free.insert(0, r)

    def mov_const(self, r: str, v: int) -> None:
        v &= U64
        if _fits_imm(v):
            self.emit(f"mov {r}, {v}")
        else:
            self.emit(f"lddw {r}, 0x{v:x}")

    def stack_ptr(self, r: str, off: int) -> None:
        self.emit(f"mov {r}, r10")
        self.emit(f"add {r}, {off}")

    # -- expressions -----------------------------------------------------------------
    def const_of(self, e: ast.Expr) -> Optional[int]:
        if isinstance(e, ast.Int):
            return e.value & U64
        if isinstance(e, ast.Str):
            return e.id
        if isinstance(e, ast.Ident) and e.kind == "const":
            return e.const
        if isinstance(e, ast.Ident) and e.kind == "probe":
            return self.hook.id
        return None

    def value(self, e: ast.Expr) -> str:
        c = self.const_of(e)
        if c is not None:
            r = self.alloc(e.span)
            self.mov_const(r, c)
            return r
        if isinstance(e, ast.Ident):
            f = abi.FIELDS_BY_NAME[e.field]
            r = self.alloc(e.span)
            op = {4: "ldxw", 8: "ldxdw", 2: "ldxh"}[f.size]
            self.emit(f"{op} {r}, [r6+{f.offset}]")
            return r
        if isinstance(e, ast.Var):
            r = self.alloc(e.span)
            self.emit(f"ldxdw {r}, [r10{self.var_off[e.name]}]")
            return r
        if isinstance(e, ast.Unary):
            if e.op == "!":
                return self.materialize(e)
            r = self.value(e.operand)
            self.emit(f"neg {r}" if e.op == "-" else f"xor {r}, -1")
            return r
        if isinstance(e, ast.Binary):
            if e.op in _ALU:
                left = self.value(e.left)
                c = self.const_of(e.right)
                if c is not None and _fits_imm(c):
                    self.emit(f"{_ALU[e.op]} {left}, {c}")
                else:
                    right = self.value(e.right)
                    self.emit(f"{_ALU[e.op]} {left}, {right}")
                    self.release(right)
                return left
            return self.materialize(e)
        raise AssertionError(type(e))

    def value_into_r7(self, e: ast.Expr) -> None:
        """The aggregated value into r7 (loaded straight there when it is a field)."""
        if isinstance(e, ast.Ident) and e.kind == "field":
            f = abi.FIELDS_BY_NAME[e.field]
            self.emit(f"{'ldxdw' if f.size == 8 else 'ldxw'} r7, [r6+{f.offset}]")
            return
        if isinstance(e, ast.Var):
            self.emit(f"ldxdw r7, [r10{self.var_off[e.name]}]")
            return
        r = self.value(e)
        self.emit(f"mov r7, {r}")
        self.release(r)

    def materialize(self, e: ast.Expr) -> str:
        r = self.alloc(e.span)
        skip = self.label()
        self.emit(f"mov {r}, 0")
        self.branch(e, skip, False)
        self.emit(f"mov {r}, 1")
        self.place(skip)
        return r

    def branch(self, e: ast.Expr, target: str, when: bool) -> None:
        """Jump to target when bool(e) == when; fall through otherwise."""
        c = const_value(e)      # not `probe`: a jump there would leave dead code behind
        if c is not None:
            if bool(c) == when:
                self.emit(f"ja {target}")
            return
        if isinstance(e, ast.Unary) and e.op == "!":
            self.branch(e.operand, target, not when)
            return
        if isinstance(e, ast.Binary) and e.op in ("&&", "||"):
            both = (e.op == "&&") != when      # && with when=False / || with when=True
            if both:
                self.branch(e.left, target, when)
                self.branch(e.right, target, when)
            else:
                skip = self.label()
                self.branch(e.left, skip, not when)
                self.branch(e.right, target, when)
                self.place(skip)
            return
        if isinstance(e, ast.Binary) and e.op in _CMP:
            op, left, right = e.op, e.left, e.right
            if self.const_of(left) is not None and self.const_of(right) is None:
                op, left, right = _MIRROR[op], right, left
            if not when:
                op = _INVERSE[op]
            lr = self.value(left)
            c = self.const_of(right)
            if c is not None and _fits_imm(c):
                self.emit(f"{_CMP[op]} {lr}, {c}, {target}")
            else:
                rr = self.value(right)
                self.emit(f"{_CMP[op]} {lr}, {rr}, {target}")
                self.release(rr)
            self.release(lr)
            return
        r = self.value(e)
        self.emit(f"{'jne' if when else 'jeq'} {r}, 0, {target}")
        self.release(r)

    # -- statements ------------------------------------------------------------------
    def build_key(self, keys: List[ast.Expr]) -> None:
        if not keys:
            self.emit("mov r1, 0")
            self.emit(f"stxw [r10{self.key_off}], r1")
            return
        for i, k in enumerate(keys):
            r = self.value(k)
            self.emit(f"stxdw [r10{self.key_off + 8 * i:+d}], {r}")
            self.release(r)

    def lookup_or_insert(self, md: MapDef, init: List[int], skip: str) -> None:
        """Leave a value pointer in r0 or jump to skip (map full)."""
        have = self.label()
        self.emit(f"lddw r1, map:{md.name}")
        self.stack_ptr("r2", self.key_off)
        self.emit("call map_lookup_elem")
        if md.type in ("array", "per_worker_array"):
            self.emit(f"jeq r0, 0, {skip}")
            return
        self.emit(f"jne r0, 0, {have}")
        cur = None
        for i, w in enumerate(init):
            if w != cur:
                self.emit(f"mov r1, {w}")
                cur = w
            self.emit(f"stxdw [r10{self.val_off + 8 * i:+d}], r1")
        self.emit(f"lddw r1, map:{md.name}")
        self.stack_ptr("r2", self.key_off)
        self.stack_ptr("r3", self.val_off)
        self.emit("mov r4, 1")      # BPF_NOEXIST: a concurrent insert wins, we add to it
        self.emit("call map_update_elem")
        self.emit(f"lddw r1, map:{md.name}")
        self.stack_ptr("r2", self.key_off)
        self.emit("call map_lookup_elem")
        self.emit(f"jeq r0, 0, {skip}")
        self.place(have)

    def map_assign(self, s: ast.MapAssign) -> None:
        m = self.rp.maps[s.target.name]
        md = self.defs[m.bpf_name]
        self.build_key(s.target.keys)
        if s.args:
            self.value_into_r7(s.args[0])
        skip = self.label()
        if m.agg in ("hist", "lhist"):
            self.emit(f"lddw r1, map:{md.name}")
            self.stack_ptr("r2", self.key_off)
            self.emit("mov r3, r7")
            self.emit("call hist_add")
            return
        words = VALUE_WORDS[m.agg]
        init = [-1 if w == "min" else 0 for w in words]
        self.lookup_or_insert(md, init, skip)
        for i, w in enumerate(words):
            off = 8 * i
            if w == "count":
                self.emit("mov r1, 1")
                self.emit(f"xadddw [r0+{off}], r1")
            elif w == "sum":
                self.emit(f"xadddw [r0+{off}], r7")
            else:
                nxt = skip if i == len(words) - 1 else self.label()
                self.emit(f"ldxdw r1, [r0+{off}]")
                self.emit(f"{'jle' if w == 'min' else 'jge'} r1, r7, {nxt}")
                self.emit(f"stxdw [r0+{off}], r7")
                if nxt != skip:
                    self.place(nxt)
        self.place(skip)

    def evidence(self, s: ast.Call) -> None:
        tag = next(ev.tag for ev in self.rp.evidence if ev.span == s.span)
        self.emit(f"mov r1, {tag}")
        self.emit(f"stxdw [r10{self.ev_off}], r1")
        for i, a in enumerate(s.args):
            r = self.value(a)
            self.emit(f"stxdw [r10{self.ev_off + 8 * (i + 1):+d}], {r}")
            self.release(r)
        self.emit(f"lddw r1, map:{EVIDENCE_MAP}")
        self.stack_ptr("r2", self.ev_off)
        self.emit(f"mov r3, {8 * (len(s.args) + 1)}")
        self.emit("mov r4, 0")
        self.emit("call ringbuf_output")

    def exit_call(self) -> None:
        skip = self.label()
        self.emit("mov r1, 0")
        self.emit(f"stxw [r10{self.key_off}], r1")
        self.emit(f"lddw r1, map:{EXIT_MAP}")
        self.stack_ptr("r2", self.key_off)
        self.emit("call map_lookup_elem")
        self.emit(f"jeq r0, 0, {skip}")
        self.emit("mov r1, 1")
        self.emit("stxdw [r0+0], r1")
        self.place(skip)

    def stmts(self, body: List[ast.Stmt]) -> None:
        for s in body:
            self.span = s.span
            self.comment(self.rp.source.text[s.span.start:s.span.end].split("\n")[0])
            if isinstance(s, ast.VarAssign):
                r = self.value(s.value)
                self.emit(f"stxdw [r10{self.var_off[s.name]}], {r}")
                self.release(r)
            elif isinstance(s, ast.If) and isinstance(s.cond, ast.Int):
                self.stmts(s.then if s.cond.value else s.orelse)    # folded: only the live side
            elif isinstance(s, ast.If):
                els, end = self.label(), self.label()
                self.branch(s.cond, els, False)
                self.stmts(s.then)
                self.span = s.span
                if s.orelse:
                    self.emit(f"ja {end}")
                self.place(els)
                self.stmts(s.orelse)
                self.place(end)
            elif isinstance(s, ast.MapAssign):
                self.map_assign(s)
            elif isinstance(s, ast.Call):
                if s.func == "evidence":
                    self.evidence(s)
                elif s.func == "exit":
                    self.exit_call()
            assert len(self.free) == len(_TEMPS), "register leak"

    def program(self) -> List[Tuple[str, Optional[Span]]]:
        c = self.rc.clause
        self.comment(f"clause {c.index}: {', '.join(p.name for p in c.probes)} as {self.hook.name}")
        self.emit("mov r6, r1")
        if self.rc.variables:
            self.emit("mov r0, 0")
        for v in self.rc.variables:
            self.emit(f"stxdw [r10{self.var_off[v]}], r0")
        end = "out"
        if isinstance(c.predicate, ast.Int) and not c.predicate.value:
            self.comment("predicate is always false")
        elif isinstance(c.predicate, ast.Int):
            pass
        elif c.predicate is not None:
            self.span = c.predicate.span
            self.comment("predicate /" + self.rp.source.text[c.predicate.span.start:c.predicate.span.end] + "/")
            self.branch(c.predicate, end, False)
        if not (isinstance(c.predicate, ast.Int) and not c.predicate.value):
            self.stmts(c.body)
        self.span = c.span
        self.place(end)
        self.emit("mov r0, 0")
        self.emit("exit")
        return self.lines


def _assemble(lines: List[Tuple[str, Optional[Span]]], map_names: List[str]):
    text = "\n".join(t for t, _ in lines) + "\n"
    insns = asm.assemble(text, maps=map_names)
    origins: List[Optional[Span]] = []
    for t, sp in lines:
        body = t.strip()
        if not body or body.startswith(";") or body.endswith(":"):
            continue
        n = 2 if body.split()[0] == "lddw" else 1
        origins += [sp] * n
    assert len(origins) == len(insns), (len(origins), len(insns))
    return text, insns, origins


def _key_plan(k) -> dict:
    return {"name": k.name, "type": k.ty, "size": 8}


def lower(rp: ResolvedProgram, opt: Optional[Options] = None) -> LoweredProgram:
    """The pass: ResolvedProgram -> LoweredProgram (raises CompileError)."""
    opt = opt or Options()
    defs: Dict[str, MapDef] = {}
    for m in rp.maps.values():
        defs[m.bpf_name] = map_def(m, opt)
    if rp.evidence:
        defs[EVIDENCE_MAP] = MapDef(EVIDENCE_MAP, "ringbuf", 0, 0, opt.evidence_ring,
                                    budget_bytes=opt.evidence_budget)
    if rp.uses_exit:
        defs[EXIT_MAP] = MapDef(EXIT_MAP, "array", 4, 8, 1)
    map_names = list(defs)
    for md in defs.values():
        md.validate()

    programs: List[Program] = []
    texts: Dict[str, str] = {}
    origins: Dict[str, List[Optional[Span]]] = {}
    writers: Dict[str, List[str]] = {n: [] for n in defs}
    prog_plan = []
    for rc in rp.clauses:
        for h in rc.hooks:
            name = f"c{rc.clause.index}_{h.name.replace(':', '_')}"
            g = _Gen(rp, rc, h, defs)
            text, insns, org = _assemble(g.program(), map_names)
            if len(insns) > abi.MAX_INSNS:
                raise error(rc.clause.span, f"clause compiles to {len(insns)} instructions for probe "
                                            f"'{h.name}' (at most {abi.MAX_INSNS})")
            programs.append(Program(name, h.section, h, insns))
            texts[name] = text
            origins[name] = org
            for i in sorted({ins.imm for ins in insns if ins.is_lddw and ins.src == 1}):
                writers[map_names[i]].append(name)
            prog_plan.append({"name": name, "section": h.section, "probe": h.name,
                              "clause": rc.clause.index})

    plan = build_plan(rp, defs, writers, prog_plan)
    obj = BpfObject(programs, [defs[n] for n in map_names], license="GPL",
                    schema_hash=rp.schema.hash,
                    notes={NOTE_PLAN: json.dumps(plan, sort_keys=True, separators=(",", ":"))})
    return LoweredProgram(obj, plan, texts, origins, rp)


def build_plan(rp: ResolvedProgram, defs: Dict[str, MapDef], writers: Dict[str, List[str]],
               programs: List[dict]) -> dict:
    """The printing plan: everything the host needs to render the maps (JSON-serialisable)."""
    maps = []
    for m in rp.maps.values():
        md = defs[m.bpf_name]
        entry = {"name": m.name, "bpf_map": m.bpf_name, "agg": m.agg, "map_type": md.type,
                 "key_size": md.key_size, "keys": [_key_plan(k) for k in m.keys],
                 "value_size": md.value_size, "programs": writers[m.bpf_name]}
        if m.agg in VALUE_WORDS:
            entry["value"] = [{"name": w, "type": "u64", "offset": 8 * i}
                              for i, w in enumerate(VALUE_WORDS[m.agg])]
        elif m.agg == "hist":
            entry["value"] = {"buckets": abi.HIST_LOG2_BUCKETS, "layout": "log2"}
        else:
            entry["value"] = {"buckets": md.hist_buckets, "layout": "linear", "lo": md.lin_lo,
                              "hi": md.lin_hi, "step": md.lin_step}
        maps.append(entry)
    used_types = {k["type"] for m in maps for k in m["keys"]}
    used_types |= {f.ty for ev in rp.evidence for f in ev.fields}
    names = {"task_class": rp.schema.names("task_class"), "comm_op": rp.schema.names("comm_op"),
             "hook": {str(h.id): h.name for h in abi.HOOKS}}
    if "event" in used_types:
        names["event"] = rp.schema.names("event")
    host: dict = {"BEGIN": [], "END": [], "intervals": []}
    for rc in rp.clauses:
        c = rc.clause
        if not c.is_host:
            continue
        acts = []
        for s in c.body:
            if isinstance(s, ast.Call):
                a = s.args[0] if s.args else None
                if s.func == "exit":
                    acts.append({"op": "exit"})
                elif isinstance(a, ast.Str):
                    acts.append({"op": "print", "text": a.value})
                elif isinstance(a, ast.MapRef):
                    acts.append({"op": "clear" if s.func == "clear" else "print", "map": a.name})
        for p in c.probes:
            if p.kind == "interval":
                host["intervals"].append({"probe": p.name, "ms": p.interval_ms, "actions": acts})
            else:
                host[p.kind].extend(acts)
    ev = None
    if rp.evidence:
        md = defs[EVIDENCE_MAP]
        ev = {"map": EVIDENCE_MAP, "budget_bytes": md.budget_bytes, "ring_bytes": md.max_entries,
              "records": [{"tag": e.tag, "clause": e.clause, "fields": [_key_plan(f) for f in e.fields],
                           "programs": [p["name"] for p in programs if p["clause"] == e.clause]}
                          for e in rp.evidence]}
    return {"plan_version": PLAN_VERSION, "source": rp.source.text,
            "schema": {"model": rp.schema.model, "hash": rp.schema.hash},
            "names": names, "maps": maps, "evidence": ev,
            "exit_map": EXIT_MAP if rp.uses_exit else None,
            "host": host, "programs": programs}
