"""The query language's plug-ins for commands owned elsewhere (`run-vm`, `verify`).

    add_query_arguments(parser)      -e QUERY, --schema S
    object_from_query(args)          the compiled BpfObject, or None without -e
    print_with_plan(obj, records, args) -> bool
                                     render through the printing plan (bpftrace-style
                                     maps, host clauses, coverage); False when the
                                     object has no plan (a clang-built monitor)
"""
from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence

from ..bpf.program import BpfObject


def add_query_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("-e", dest="expr", metavar="QUERY", help="compile and run this query instead of FILE")
    if not any("--schema" in a.option_strings for a in p._actions):
        p.add_argument("--schema", metavar="S", help="task schema JSON for -e (default: standard classes)")


def object_from_query(args: argparse.Namespace) -> Optional[BpfObject]:
    if getattr(args, "expr", None) is None:
        return None
    from ..errors import UserError
    from .pipeline import compile_query, schema_from
    if getattr(args, "file", None):
        raise UserError("give either -e QUERY or FILE, not both")
    return compile_query(args.expr, schema_from(getattr(args, "schema", None))).obj


def print_with_plan(obj: BpfObject, records: Sequence[bytes], args: argparse.Namespace) -> bool:
    from . import host, printing
    plan = host.find_plan(obj)
    if plan is None or getattr(args, "program", None) or getattr(args, "hook", None):
        return False
    blocks = host.run_events(obj, records, plan, num_workers=getattr(args, "workers", None))
    fmt = getattr(args, "format", "text")
    sys.stdout.write(printing.render_json(blocks) if fmt == "json" else printing.render_text(blocks))
    return True
