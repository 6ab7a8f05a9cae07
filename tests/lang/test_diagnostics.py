"""The one renderer of compile errors, and the pass list."""
from __future__ import annotations

from dtrace_mk.lang import pipeline
from dtrace_mk.lang.diagnostics import CompileError, Diagnostic, Source, Span, render


def test_render_points_at_the_span_on_its_line():
    src = Source("task:end {\n\t@x = bad;\n}", "q.d")
    out = render(src, [Diagnostic(Span(17, 20), "unknown field 'bad'", notes=("try task.dur_ns",))])
    assert out == ("q.d:2:7: error: unknown field 'bad'\n"
                   "\t@x = bad;\n"
                   "\t     ^~~\n"
                   "note: try task.dur_ns")


def test_span_across_lines_underlines_to_the_end_of_the_first():
    src = Source("abc def\nghi", "q")
    assert render(src, [Diagnostic(Span(4, 10), "m")]) == "q:1:5: error: m\nabc def\n    ^~~"


def test_point_at_end_of_input():
    src = Source("task:end {", "q")
    assert render(src, [Diagnostic(Span(10, 10), "m")]) == "q:1:11: error: m\ntask:end {\n          ^"


def test_errors_render_in_source_order():
    src = Source("aaa bbb", "q")
    e = CompileError([Diagnostic(Span(4, 7), "second"), Diagnostic(Span(0, 3), "first")], src)
    assert str(e).splitlines()[0] == "q:1:1: error: first"
    assert str(e).splitlines()[3] == "q:1:5: error: second"
    assert e.exit_code == 1


def test_pipeline_order():
    assert [name for name, _ in pipeline.PASSES] == ["parse", "resolve", "fold", "lower", "verify"]
