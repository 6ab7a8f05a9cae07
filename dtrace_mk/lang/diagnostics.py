"""Compile diagnostics: source spans, messages, and the ONE renderer.

Passes never print.  They raise `CompileError` (one or more `Diagnostic`s, each with a
`Span` into the query text); `render()` turns them into what users and tests see:

    <query>:1:26: error: unknown task class "atn"; did you mean "attn", "attn_o"?
    task:end /task.class == "atn"/ { @[task.layer] = count(); }
                            ^~~~~

Tests compare this full rendering, so its format changes only here.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence

from ..errors import Rejected


@dataclass(frozen=True)
class Source:
    """The query text and the name shown in messages (a file name or `<query>`)."""
    text: str
    name: str = "<query>"

    def line(self, n: int) -> str:
        lines = self.text.splitlines() or [""]
        return lines[n - 1] if 1 <= n <= len(lines) else ""

    def position(self, offset: int) -> "tuple[int, int]":
        """1-based (line, column) of a character offset."""
        offset = max(0, min(offset, len(self.text)))
        before = self.text[:offset]
        line = before.count("\n") + 1
        col = offset - (before.rfind("\n") + 1) + 1
        return line, col


@dataclass(frozen=True)
class Span:
    start: int          # character offset, inclusive
    end: int            # character offset, exclusive (== start for a point)

    def to(self, other: "Span") -> "Span":
        return Span(min(self.start, other.start), max(self.end, other.end))


@dataclass(frozen=True)
class Diagnostic:
    span: Span
    message: str
    severity: str = "error"
    notes: Sequence[str] = ()


class CompileError(Rejected):
    """A query the compiler refused.  str() is the full rendering (exit status 1)."""

    def __init__(self, diagnostics: Sequence[Diagnostic], source: Optional[Source] = None):
        self.diagnostics: List[Diagnostic] = list(diagnostics)
        self.source = source
        super().__init__(self.rendered())

    def with_source(self, source: Source) -> "CompileError":
        return CompileError(self.diagnostics, source)

    def rendered(self) -> str:
        if self.source is None:
            return "\n".join(f"error: {d.message}" for d in self.diagnostics)
        return render(self.source, self.diagnostics)


def error(span: Span, message: str, *notes: str) -> CompileError:
    return CompileError([Diagnostic(span, message, "error", tuple(notes))])


def render_one(source: Source, d: Diagnostic) -> str:
    line, col = source.position(d.span.start)
    text = source.line(line)
    end_line, _ = source.position(max(d.span.start, d.span.end - 1))
    # Underline to the end of the span, or to the end of the line when it spans lines.
    if end_line == line:
        width = max(1, d.span.end - d.span.start)
    else:
        width = max(1, len(text) - (col - 1))
    width = min(width, max(1, len(text) - (col - 1) + 1))
    prefix = "".join(ch if ch == "\t" else " " for ch in text[:col - 1])
    out = [f"{source.name}:{line}:{col}: {d.severity}: {d.message}", text,
           prefix + "^" + "~" * (width - 1)]
    out += [f"note: {n}" for n in d.notes]
    return "\n".join(out)


def render(source: Source, diagnostics: Sequence[Diagnostic]) -> str:
    """Every diagnostic, in source order, separated by newlines (no trailing newline)."""
    ds = sorted(diagnostics, key=lambda d: (d.span.start, d.span.end))
    return "\n".join(render_one(source, d) for d in ds)


def near(names: Sequence[str]) -> str:
    """'; did you mean "a", "b"?' or '' when there are none."""
    if not names:
        return ""
    return "; did you mean " + ", ".join(f'"{n}"' for n in names) + "?"
