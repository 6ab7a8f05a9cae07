"""Syntax tree of a query.  Every node carries a `Span` into the source.

The parser builds it; `resolve` fills in the `ty` / `field` / `const` slots of
expressions (types: "int", "str", or a named id type "task_class", "comm_op", "event",
"hook", which the printer renders as names) and checks the rest; `lower` reads it.
"""
from __future__ import annotations

from dataclasses import dataclass, field as dc_field
from typing import List, Optional, Union

from .diagnostics import Span


# --- expressions ---------------------------------------------------------------------

@dataclass
class Expr:
    span: Span

    # filled in by resolve
    ty: str = dc_field(default="int", init=False)


@dataclass
class Int(Expr):
    value: int
    text: str = ""


@dataclass
class Str(Expr):
    value: str
    # filled in by resolve: the schema id the name stands for (see Expr.ty)
    id: Optional[int] = dc_field(default=None, init=False)


@dataclass
class Ident(Expr):
    """A context field (`task.dur_ns`), builtin (`probe`) or constant (`FLAG_REMOTE`)."""
    name: str
    # filled in by resolve: kind "field" | "probe" | "const"; field = abi Field name
    kind: str = dc_field(default="", init=False)
    field: Optional[str] = dc_field(default=None, init=False)
    const: Optional[int] = dc_field(default=None, init=False)


@dataclass
class Var(Expr):
    name: str           # without '$'


@dataclass
class Unary(Expr):
    op: str             # "!", "~", "-"
    operand: Expr


@dataclass
class Binary(Expr):
    op: str             # "+", "-", "*", "/", "%", "&", "|", "^", "<<", ">>",
                        # "==", "!=", "<", "<=", ">", ">=", "&&", "||"
    left: Expr
    right: Expr


# --- statements ----------------------------------------------------------------------

@dataclass
class MapRef:
    span: Span
    name: str           # with '@', e.g. "@slow" or "@"
    keys: List[Expr] = dc_field(default_factory=list)


@dataclass
class Stmt:
    span: Span


@dataclass
class MapAssign(Stmt):
    target: MapRef
    func: str           # count, sum, avg, min, max, stats, hist, lhist
    args: List[Expr]
    func_span: Span


@dataclass
class VarAssign(Stmt):
    name: str
    value: Expr


@dataclass
class If(Stmt):
    cond: Expr
    then: List[Stmt]
    orelse: List[Stmt]


@dataclass
class Call(Stmt):
    """print, printa, clear, evidence, exit.  args are Expr or MapRef."""
    func: str
    args: List[Union[Expr, MapRef]]
    func_span: Span


# --- clauses -------------------------------------------------------------------------

@dataclass
class Probe:
    span: Span
    kind: str           # "hook" | "BEGIN" | "END" | "interval"
    name: str           # "task:end", "BEGIN", "END", "interval:ms:100"
    interval_ms: int = 0


@dataclass
class Clause:
    span: Span
    probes: List[Probe]
    predicate: Optional[Expr]
    body: List[Stmt]
    index: int = 0

    @property
    def is_host(self) -> bool:
        return self.probes[0].kind != "hook"


@dataclass
class Program:
    clauses: List[Clause]
