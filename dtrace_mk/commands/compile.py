"""`dtrace-mk compile`: compile a query to a verified eBPF object.

    dtrace-mk compile -e 'task:end { @[task.class] = count(); }' -o q.o
    dtrace-mk compile query.d --schema schema.json -o q.o
    dtrace-mk compile -e '...' -S            # print the disassembly instead of writing
    dtrace-mk compile -e '...' --cuda        # print the compiled tier's CUDA C for it

The object has the same form as a clang-built monitor (one program section per hook,
BTF maps); the printing plan is embedded as the `dtmk_plan` note and, because not every
reader keeps notes, also written beside the object as OUT.plan.json.  --cuda prints what the
compiled tier would link into the megakernel for the query (dtrace_mk/runtime/compiled/translator.py:
one function per program, each map's shape of constants, the per-hook entry points); its
map addresses are this process's host stand-ins, a device attach has its own.

Exit status: 0 compiled; 1 the query was rejected (the rendered diagnostic: file:line:col,
the source line and a caret under the fault); 2 a file could not be read or written.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..errors import UserError
from ..lang.diagnostics import CompileError

NAME = "compile"
ORDER = 15
HELP = "compile a bpftrace-style query to a verified eBPF object (+ printing plan)"
DESCRIPTION = __doc__.split("\n\n", 1)[1]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", metavar="FILE", nargs="?", help="query file (or give -e)")
    p.add_argument("-e", dest="expr", metavar="QUERY", help="the query text")
    p.add_argument("--schema", metavar="S", help="task schema JSON (default: the standard classes)")
    p.add_argument("-o", dest="output", metavar="OUT.o", help="object file to write")
    p.add_argument("-S", dest="asm", action="store_true", help="print the disassembly of every program")
    p.add_argument("--plan", action="store_true", help="print the printing plan (JSON)")
    p.add_argument("--cuda", action="store_true",
                   help="print the compiled tier's CUDA C for the query (map addresses are host stand-ins)")


def plan_path(obj_path: str) -> Path:
    p = Path(obj_path)
    return p.with_name(p.stem + ".plan.json") if p.suffix == ".o" else Path(str(p) + ".plan.json")


def compile_from_args(args: argparse.Namespace):
    """-e QUERY | FILE [--schema S] -> CompileResult (raises CompileError / UserError)."""
    from ..lang.pipeline import compile_query, load_query_source, schema_from
    if (args.expr is None) == (getattr(args, "file", None) is None):
        raise UserError("give a query with -e QUERY or a query FILE (one of them)")
    src = load_query_source(args.expr, getattr(args, "file", None))
    return compile_query(src.text, schema_from(getattr(args, "schema", None)), name=src.name)


def run(args: argparse.Namespace) -> int:
    try:
        res = compile_from_args(args)
    except CompileError as e:
        print(str(e), file=sys.stderr)
        return e.exit_code
    if not (args.output or args.asm or args.plan or args.cuda):
        raise UserError("nothing to do: give -o OUT.o, -S, --plan or --cuda")
    if args.asm:
        sys.stdout.write(res.disassembly())
    if args.cuda:
        from ..runtime.compiled import HostCompiledRuntime
        rt = HostCompiledRuntime(1)      # (maps in host memory: their addresses stand in for a device's)
        rt.attach(res.obj, tier="compiled")
        sys.stdout.write(rt.monitor())
    if args.plan:
        sys.stdout.write(json.dumps(res.plan, indent=1, sort_keys=True) + "\n")
    if args.output:
        from ..bpf.elfwrite import write_object
        data = write_object(res.obj)
        try:
            Path(args.output).write_bytes(data)
            plan_path(args.output).write_text(json.dumps(res.plan, indent=1, sort_keys=True) + "\n")
        except OSError as e:
            raise UserError(f"{args.output}: cannot write: {e.strerror or e}") from None
        print(f"{args.output}: {len(res.obj.programs)} program(s) "
              f"({', '.join(p.section for p in res.obj.programs)}), "
              f"{len(res.obj.maps)} map(s) ({', '.join(m.name for m in res.obj.maps)})")
    return 0
