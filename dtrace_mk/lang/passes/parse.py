"""Pass 1, parse: query text -> `ast.Program`.

A hand-written lexer and recursive-descent parser.  Errors are `CompileError`s with the
span of the offending token; nothing here knows about fields, probes or the schema
(that is `resolve`).

Grammar (EBNF; `;` separates statements, a trailing one is optional):

    program    = { clause } ;
    clause     = probes [ "/" expr "/" ] "{" [ stmt { ";" stmt } [ ";" ] ] "}" ;
    probes     = probe { "," probe } ;
    probe      = IDENT ":" ( IDENT | "*" )            (* task:end, task:* *)
               | "BEGIN" | "END" | "interval" ":" ( "ms" | "s" ) ":" INT ;
    stmt       = map "=" IDENT "(" [ args ] ")"       (* aggregation *)
               | VAR "=" expr
               | "if" "(" expr ")" block [ "else" ( stmt_if | block ) ]
               | IDENT "(" [ args ] ")" ;             (* print, clear, evidence, exit *)
    map        = MAP [ "[" expr { "," expr } "]" ] ;  (* @name or @ *)
    expr       = precedence climbing over || && | ^ & (== !=) (< <= > >=) (<< >>) (+ -)
                 (* / %), unary ! ~ -, primary ;
    primary    = INT [ "ns" | "us" | "ms" | "s" ] | STRING | IDENT { "." IDENT } | VAR
               | "(" expr ")" ;

Inside a predicate a bare "/" ends the predicate; write division in parentheses.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import List, Tuple

from .. import ast
from ..diagnostics import CompileError, Source, Span, error

TIME_UNITS = {"ns": 1, "us": 1_000, "ms": 1_000_000, "s": 1_000_000_000}


@dataclass(frozen=True)
class Token:
    kind: str       # "ident" "int" "str" "map" "var" "op" "eof"
    text: str
    span: Span
    value: object = None

    def describe(self) -> str:
        if self.kind == "eof":
            return "end of input"
        return f"'{self.text}'"


_OPS = ["&&", "||", "==", "!=", "<=", ">=", "<<", ">>",
        "{", "}", "(", ")", "[", "]", ",", ";", ":", "/", "=", "<", ">", "+", "-", "*",
        "%", "&", "|", "^", "!", "~", "."]
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_NUMBER = re.compile(r"(0[xX][0-9a-fA-F]+|[0-9]+)([A-Za-z_][A-Za-z0-9_]*)?")


def lex(src: Source) -> List[Token]:
    text, i, out = src.text, 0, []
    n = len(text)
    while i < n:
        c = text[i]
        if c in " \t\r\n":
            i += 1
            continue
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
            continue
        if text.startswith("/*", i):
            j = text.find("*/", i + 2)
            if j < 0:
                raise error(Span(i, i + 2), "unterminated comment")
            i = j + 2
            continue
        if c == '"':
            j, buf = i + 1, []
            while j < n and text[j] != '"' and text[j] != "\n":
                if text[j] == "\\" and j + 1 < n:
                    esc = text[j + 1]
                    buf.append({"n": "\n", "t": "\t", '"': '"', "\\": "\\"}.get(esc, esc))
                    j += 2
                    continue
                buf.append(text[j])
                j += 1
            if j >= n or text[j] != '"':
                raise error(Span(i, j), "unterminated string")
            out.append(Token("str", text[i:j + 1], Span(i, j + 1), "".join(buf)))
            i = j + 1
            continue
        if c.isdigit():
            m = _NUMBER.match(text, i)
            digits, suffix = m.group(1), m.group(2)
            value = int(digits, 0)
            if suffix:
                if suffix not in TIME_UNITS:
                    raise error(Span(m.start(2), m.end(2)),
                                f"unknown unit '{suffix}' after a number (expected ns, us, ms or s)")
                value *= TIME_UNITS[suffix]
            if value >= 1 << 64:
                raise error(Span(i, m.end()), f"number {text[i:m.end()]} does not fit in 64 bits")
            out.append(Token("int", m.group(0), Span(i, m.end()), value))
            i = m.end()
            continue
        if c in "@$":
            m = _IDENT.match(text, i + 1)
            if c == "$" and not m:
                raise error(Span(i, i + 1), "expected a variable name after '$'")
            j = m.end() if m else i + 1
            out.append(Token("map" if c == "@" else "var", text[i:j], Span(i, j)))
            i = j
            continue
        m = _IDENT.match(text, i)
        if m:
            out.append(Token("ident", m.group(0), Span(i, m.end())))
            i = m.end()
            continue
        for op in _OPS:
            if text.startswith(op, i):
                out.append(Token("op", op, Span(i, i + len(op))))
                i += len(op)
                break
        else:
            raise error(Span(i, i + 1), f"unexpected character '{c}'")
    out.append(Token("eof", "", Span(n, n)))
    return out


# precedence climbing table: op -> binding power (higher binds tighter)
_BINARY = {"||": 1, "&&": 2, "|": 3, "^": 4, "&": 5, "==": 6, "!=": 6,
           "<": 7, "<=": 7, ">": 7, ">=": 7, "<<": 8, ">>": 8, "+": 9, "-": 9,
           "*": 10, "/": 10, "%": 10}


class Parser:
    def __init__(self, src: Source):
        self.src = src
        self.toks = lex(src)
        self.pos = 0
        self.in_predicate = 0     # >0: a bare '/' ends the predicate
        self.nesting = 0          # parentheses/brackets depth inside the predicate

    # -- token helpers ---------------------------------------------------------------
    @property
    def tok(self) -> Token:
        return self.toks[self.pos]

    def peek(self, k: int = 1) -> Token:
        return self.toks[min(self.pos + k, len(self.toks) - 1)]

    def advance(self) -> Token:
        t = self.tok
        if t.kind != "eof":
            self.pos += 1
        return t

    def at(self, text: str) -> bool:
        return self.tok.kind == "op" and self.tok.text == text

    def expect(self, text: str, what: str = "") -> Token:
        if not self.at(text):
            ctx = f" {what}" if what else ""
            raise error(self.tok.span, f"expected '{text}'{ctx}, got {self.tok.describe()}")
        return self.advance()

    # -- program ---------------------------------------------------------------------
    def program(self) -> ast.Program:
        clauses = []
        while self.tok.kind != "eof":
            c = self.clause()
            c.index = len(clauses)
            clauses.append(c)
        if not clauses:
            raise error(self.tok.span, "empty query: expected a probe such as 'task:end'")
        return ast.Program(clauses)

    def clause(self) -> ast.Clause:
        start = self.tok.span
        probes = [self.probe()]
        while self.at(","):
            self.advance()
            probes.append(self.probe())
        pred = None
        if self.at("/"):
            self.advance()
            self.in_predicate += 1
            pred = self.expr()
            self.in_predicate -= 1
            self.expect("/", "to end the predicate")
        if not self.at("{"):
            raise error(self.tok.span, f"expected '{{' to start the action block, got {self.tok.describe()}")
        body = self.block()
        return ast.Clause(start.to(self.toks[self.pos - 1].span), probes, pred, body)

    def probe(self) -> ast.Probe:
        t = self.tok
        if t.kind != "ident":
            raise error(t.span, f"expected a probe (e.g. 'task:end', 'BEGIN', 'interval:ms:100'), "
                                f"got {t.describe()}")
        self.advance()
        if t.text in ("BEGIN", "END"):
            return ast.Probe(t.span, t.text, t.text)
        if t.text == "interval":
            self.expect(":", "after 'interval'")
            unit = self.tok
            if unit.kind != "ident" or unit.text not in ("ms", "s"):
                raise error(unit.span, f"expected 'ms' or 's' in interval:UNIT:N, got {unit.describe()}")
            self.advance()
            self.expect(":", f"after 'interval:{unit.text}'")
            num = self.tok
            if num.kind != "int" or num.text != str(num.value) or num.value <= 0:
                raise error(num.span, f"expected a positive whole number of {unit.text} in "
                                      f"interval:{unit.text}:N, got {num.describe()}")
            self.advance()
            ms = num.value * (1000 if unit.text == "s" else 1)
            return ast.Probe(t.span.to(num.span), "interval", f"interval:{unit.text}:{num.value}", ms)
        if not self.at(":"):
            raise error(self.tok.span, f"expected ':' after '{t.text}' in a probe name such as "
                                       f"'task:end', got {self.tok.describe()}")
        self.advance()
        n = self.tok
        if n.kind == "ident" or (n.kind == "op" and n.text == "*"):
            self.advance()
            return ast.Probe(t.span.to(n.span), "hook", f"{t.text}:{n.text}")
        raise error(n.span, f"expected a probe name after '{t.text}:', got {n.describe()}")

    # -- statements ------------------------------------------------------------------
    def block(self) -> List[ast.Stmt]:
        self.expect("{")
        stmts: List[ast.Stmt] = []
        while not self.at("}"):
            if self.tok.kind == "eof":
                raise error(self.tok.span, "expected '}' to close the action block, got end of input")
            if self.at(";"):
                self.advance()
                continue
            s = self.stmt()
            stmts.append(s)
            if isinstance(s, ast.If):
                continue
            if not (self.at(";") or self.at("}")):
                raise error(self.tok.span, f"expected ';' or '}}' after a statement, got {self.tok.describe()}")
        self.advance()
        return stmts

    def stmt(self) -> ast.Stmt:
        t = self.tok
        if t.kind == "map":
            ref = self.mapref()
            if not self.at("="):
                raise error(self.tok.span, f"expected '=' after {ref.name} (maps are assigned an "
                                           f"aggregation such as count()), got {self.tok.describe()}")
            self.advance()
            f = self.tok
            if f.kind != "ident" or self.peek().text != "(":
                raise error(f.span, f"expected an aggregation (count, sum, avg, min, max, stats, hist, "
                                    f"lhist) after '{ref.name} =', got {f.describe()}")
            self.advance()
            args, end = self.call_args()
            return ast.MapAssign(t.span.to(end), ref, f.text, args, f.span)
        if t.kind == "var":
            self.advance()
            self.expect("=", f"after {t.text}")
            e = self.expr()
            return ast.VarAssign(t.span.to(e.span), t.text[1:], e)
        if t.kind == "ident" and t.text == "if":
            return self.if_stmt()
        if t.kind == "ident" and self.peek().text == "(":
            self.advance()
            args, end = self.call_args(allow_maps=True)
            return ast.Call(t.span.to(end), t.text, args, t.span)
        raise error(t.span, f"expected a statement (@map = aggregation, $var = expression, if, or a "
                            f"call such as print(@map)), got {t.describe()}")

    def if_stmt(self) -> ast.If:
        start = self.advance().span
        self.expect("(", "after 'if'")
        saved = self.in_predicate
        self.in_predicate = 0
        cond = self.expr()
        self.in_predicate = saved
        self.expect(")", "to close the condition")
        then = self.block()
        orelse: List[ast.Stmt] = []
        if self.tok.kind == "ident" and self.tok.text == "else":
            self.advance()
            if self.tok.kind == "ident" and self.tok.text == "if":
                orelse = [self.if_stmt()]
            else:
                orelse = self.block()
        return ast.If(start.to(self.toks[self.pos - 1].span), cond, then, orelse)

    def mapref(self) -> ast.MapRef:
        t = self.advance()
        keys: List[ast.Expr] = []
        span = t.span
        if self.at("["):
            self.advance()
            saved = self.in_predicate
            self.in_predicate = 0
            keys.append(self.expr())
            while self.at(","):
                self.advance()
                keys.append(self.expr())
            self.in_predicate = saved
            span = span.to(self.expect("]", "to close the map key").span)
        return ast.MapRef(span, t.text, keys)

    def call_args(self, allow_maps: bool = False) -> Tuple[list, Span]:
        self.expect("(")
        args: list = []
        saved = self.in_predicate
        self.in_predicate = 0
        if not self.at(")"):
            while True:
                if self.tok.kind == "map":
                    args.append(self.mapref())
                else:
                    args.append(self.expr())
                if not self.at(","):
                    break
                self.advance()
        self.in_predicate = saved
        end = self.expect(")", "to close the argument list").span
        return args, end

    # -- expressions -----------------------------------------------------------------
    def expr(self, min_bp: int = 1) -> ast.Expr:
        left = self.unary()
        while True:
            t = self.tok
            if t.kind != "op" or t.text not in _BINARY:
                return left
            if t.text == "/" and self.in_predicate:
                return left
            bp = _BINARY[t.text]
            if bp < min_bp:
                return left
            self.advance()
            right = self.expr(bp + 1)
            left = ast.Binary(left.span.to(right.span), t.text, left, right)

    def unary(self) -> ast.Expr:
        t = self.tok
        if t.kind == "op" and t.text in ("!", "~", "-"):
            self.advance()
            e = self.unary()
            return ast.Unary(t.span.to(e.span), t.text, e)
        return self.primary()

    def primary(self) -> ast.Expr:
        t = self.tok
        if t.kind == "int":
            self.advance()
            return ast.Int(t.span, t.value, t.text)
        if t.kind == "str":
            self.advance()
            return ast.Str(t.span, t.value)
        if t.kind == "var":
            self.advance()
            return ast.Var(t.span, t.text[1:])
        if t.kind == "ident":
            self.advance()
            name, span = t.text, t.span
            while self.at(".") and self.peek().kind == "ident":
                self.advance()
                nxt = self.advance()
                name += "." + nxt.text
                span = span.to(nxt.span)
            if self.at("("):
                raise error(span.to(self.tok.span), f"'{name}(...)' cannot be used in an expression "
                                                    f"(calls are statements; aggregations go in '@map = {name}(...)')")
            return ast.Ident(span, name)
        if t.kind == "op" and t.text == "(":
            self.advance()
            saved = self.in_predicate
            self.in_predicate = 0
            e = self.expr()
            self.in_predicate = saved
            self.expect(")", "to close the parenthesis")
            return e
        if t.kind == "map":
            raise error(t.span, f"a map cannot be read in an expression (maps are aggregations; "
                                f"print them with print({t.text}))")
        raise error(t.span, f"expected an expression, got {t.describe()}")


def parse(src: Source) -> ast.Program:
    """The pass: Source -> ast.Program (raises CompileError)."""
    return Parser(src).program()
