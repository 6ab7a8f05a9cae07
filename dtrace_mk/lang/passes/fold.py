"""Pass 3, fold: `ResolvedProgram` -> the same `ResolvedProgram`, constant expressions
folded in place.

Needed for correctness, not just size: the verifier rejects unreachable instructions,
so `x && 0`, `if (0) {...}` or `/1 == 2/` must not reach code generation with a
branch whose other side is dead.  After this pass an expression is either an `ast.Int`
or contains no constant `&&`, `||`, `!` or comparison operand pair; `lower` emits only
the live side of a constant `if` or predicate.

Arithmetic is unsigned 64-bit as in eBPF: division by zero gives 0 and modulo by zero
leaves the dividend (RFC 9669).
"""
from __future__ import annotations

from typing import List, Optional

from .. import ast
from .resolve import ResolvedProgram

U64 = (1 << 64) - 1

_ARITH = {
    "+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b,
    "/": lambda a, b: a // b if b else 0, "%": lambda a, b: a % b if b else a,
    "&": lambda a, b: a & b, "|": lambda a, b: a | b, "^": lambda a, b: a ^ b,
    "<<": lambda a, b: a << (b & 63), ">>": lambda a, b: a >> (b & 63),
    "==": lambda a, b: int(a == b), "!=": lambda a, b: int(a != b), "<": lambda a, b: int(a < b),
    "<=": lambda a, b: int(a <= b), ">": lambda a, b: int(a > b), ">=": lambda a, b: int(a >= b),
    "&&": lambda a, b: int(bool(a) and bool(b)), "||": lambda a, b: int(bool(a) or bool(b)),
}


def const_value(e: ast.Expr) -> Optional[int]:
    """The u64 value of a constant expression (numbers, FLAG_* constants, schema names,
    operators over them), or None.  `probe` is not constant: it differs per program."""
    if isinstance(e, ast.Int):
        return e.value & U64
    if isinstance(e, ast.Str):
        return e.id
    if isinstance(e, ast.Ident):
        return e.const if e.kind == "const" else None
    if isinstance(e, ast.Unary):
        v = const_value(e.operand)
        if v is None:
            return None
        return {"-": (-v) & U64, "~": (~v) & U64, "!": int(not v)}[e.op]
    if isinstance(e, ast.Binary):
        a, b = const_value(e.left), const_value(e.right)
        if a is None or b is None:
            return None
        return _ARITH[e.op](a, b) & U64
    return None


def signed_const(e: ast.Expr) -> Optional[int]:
    """const_value read as a signed 64-bit number (for lhist bounds)."""
    v = const_value(e)
    if v is None:
        return None
    return v - (1 << 64) if v >> 63 else v


def _int(e: ast.Expr, v: int) -> ast.Int:
    out = ast.Int(e.span, v & U64, str(v & U64))
    return out


def _truth(e: ast.Expr) -> ast.Expr:
    """e as a 0/1 value (for `x && 1` -> x != 0)."""
    if isinstance(e, ast.Binary) and e.op in ("==", "!=", "<", "<=", ">", ">=", "&&", "||"):
        return e
    if isinstance(e, ast.Unary) and e.op == "!":
        return e
    b = ast.Binary(e.span, "!=", e, ast.Int(e.span, 0, "0"))
    return b


def fold(e: ast.Expr) -> ast.Expr:
    v = const_value(e)
    if v is not None and not isinstance(e, ast.Int):
        return _int(e, v)
    if isinstance(e, ast.Unary):
        e.operand = fold(e.operand)
    elif isinstance(e, ast.Binary):
        e.left, e.right = fold(e.left), fold(e.right)
        if e.op in ("&&", "||"):
            for c, other in ((e.left, e.right), (e.right, e.left)):
                cv = const_value(c)
                if cv is None:
                    continue
                if e.op == "&&":
                    return _truth(other) if cv else _int(e, 0)
                return _int(e, 1) if cv else _truth(other)
    return e


def _stmts(body: List[ast.Stmt]) -> None:
    for s in body:
        if isinstance(s, ast.VarAssign):
            s.value = fold(s.value)
        elif isinstance(s, ast.If):
            s.cond = fold(s.cond)
            _stmts(s.then)
            _stmts(s.orelse)
        elif isinstance(s, ast.MapAssign):
            s.target.keys = [fold(k) for k in s.target.keys]
            s.args = [fold(a) for a in s.args]
        elif isinstance(s, ast.Call) and s.func == "evidence":
            s.args = [fold(a) for a in s.args]


def fold_program(rp: ResolvedProgram) -> ResolvedProgram:
    """The pass."""
    for rc in rp.clauses:
        c = rc.clause
        if c.predicate is not None:
            c.predicate = fold(c.predicate)
        _stmts(c.body)
    return rp
