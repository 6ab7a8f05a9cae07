"""The dtrace_mk query language: bpftrace/DTrace-shaped queries -> verified eBPF objects.

    from dtrace_mk.lang import compile_query, run_events, render_text
    res = compile_query('task:end { @[task.class] = hist(task.dur_ns); }')
    res.obj          # BpfObject (programs per hook section, maps, dtmk_plan note)
    res.plan         # printing plan (JSON-serialisable)
    print(render_text(run_events(res.obj, records)))

See docs/language.md; the passes are listed in dtrace_mk/lang/pipeline.py.
"""

__all__ = ["compile_query", "CompileError", "run_events", "render_text", "render_json"]


def __getattr__(name):          # lazy: importing the package stays cheap
    if name == "compile_query":
        from .pipeline import compile_query
        return compile_query
    if name == "CompileError":
        from .diagnostics import CompileError
        return CompileError
    if name == "run_events":
        from .host import run_events
        return run_events
    if name in ("render_text", "render_json"):
        from . import printing
        return getattr(printing, name)
    raise AttributeError(name)
