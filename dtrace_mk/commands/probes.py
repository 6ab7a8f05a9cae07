"""`dtrace-mk probes`: list the probes a query can use (like `bpftrace -l` / `-lv`).

    dtrace-mk probes                 # one probe per line
    dtrace-mk probes -v              # and every field valid there, with its language names
    dtrace-mk probes -v 'comm:*'     # only probes matching a pattern
    dtrace-mk probes --schema S -v   # named fields list the schema's names

Hook probes run on the device (eBPF programs); BEGIN, END and interval:ms:N run on the
host (printing, clearing, exit).
"""
from __future__ import annotations

import argparse
import fnmatch
import sys
from typing import List

from ..abi import definition as abi

NAME = "probes"
ORDER = 16
HELP = "list probes, and with -v their fields and language names"
DESCRIPTION = __doc__.split("\n\n", 1)[1]

HOST_PROBES = (("BEGIN", "host: before the first event"),
               ("END", "host: after the last event (or exit()); maps not printed here print after it"),
               ("interval:ms:N", "host: every N ms of event time (also interval:s:N)"))


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("pattern", nargs="?", default="*", help="glob over probe names (default *)")
    p.add_argument("-v", dest="verbose", action="store_true", help="show fields")
    p.add_argument("--schema", metavar="S", help="task schema JSON (names of task classes and comm ops)")


def listing(pattern: str = "*", verbose: bool = False, schema=None) -> str:
    from ..lang.passes.resolve import NAMED_FIELDS
    lines: List[str] = []
    for h in abi.HOOKS:
        if not fnmatch.fnmatchcase(h.name, pattern):
            continue
        lines.append(f"{h.name}" + (f"    # {h.doc}" if verbose else ""))
        if not verbose:
            continue
        for fname in h.valid_fields:
            f = abi.FIELDS_BY_NAME[fname]
            if not f.lang:
                continue
            extra = ""
            kind = NAMED_FIELDS.get(fname)
            if kind and schema is not None and kind in ("task_class", "comm_op", "event"):
                names = schema.names(kind)
                shown = ", ".join(names[:12]) + (", ..." if len(names) > 12 else "")
                extra = f"  [{kind} names: {shown or '(none in schema)'}]"
            lines.append(f"    {', '.join(f.lang):<40} {f.ctype}  {f.doc}{extra}")
    for name, doc in HOST_PROBES:
        if fnmatch.fnmatchcase(name, pattern) or fnmatch.fnmatchcase(name.split(":")[0], pattern):
            lines.append(name + (f"    # {doc}" if verbose else ""))
    return "\n".join(lines) + "\n"


def run(args: argparse.Namespace) -> int:
    from ..lang.pipeline import schema_from
    sys.stdout.write(listing(args.pattern, args.verbose, schema_from(args.schema)))
    return 0
