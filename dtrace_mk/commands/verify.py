"""`dtrace-mk verify FILE`: load an eBPF monitor object and run the verifier on each program.

    dtrace-mk verify mon.o                         # every program, against its section's hook
    dtrace-mk verify mon.o --program slow_tasks    # one program
    dtrace-mk verify prog.bin --hook task:end      # raw bytecode (8-byte slots, no maps)
    dtrace-mk verify mon.o --schema schema.json    # also check the object's task schema hash

Prints one line per accepted program:

    task/end task_latency: accepted, 10 insns, max path 9, maps: lat_by_class, helpers: hist_add

Exit status: 0 all accepted; 1 a program was rejected (the verifier's message, naming
the file, section, program and instruction); 2 the file could not be loaded (not an
eBPF object, wrong ABI, bad map definitions, schema mismatch, bad options).

`obtain_object(args)` is the one place that turns the command line into a `BpfObject`,
so other sources (a query given with -e) plug in there.
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path
from typing import List, Optional

from ..abi import definition as abi
from ..bpf.elf import ELF_MAGIC, load_object, program_from_bytes
from ..bpf.program import BpfObject, LoadError, Program
from ..errors import Rejected, UserError

NAME = "verify"
ORDER = 20
HELP = "check an eBPF monitor object (clang-built .o or raw .bin) with the verifier"
DESCRIPTION = __doc__.split("\n\n", 1)[1]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", metavar="FILE", nargs="?",
                   help="eBPF object (.o from clang -target bpf) or raw bytecode")
    p.add_argument("-e", dest="expr", metavar="QUERY",
                   help="compile this query (dtrace_mk.lang) and verify its programs instead of FILE")
    p.add_argument("--hook", metavar="H",
                   help="hook to verify against (name task:end or section task/end); required for raw "
                        "bytecode, overrides the section's hook for objects")
    p.add_argument("--schema", metavar="S", help="task schema JSON; the object's schema hash must match it")
    p.add_argument("--program", metavar="NAME", help="verify only this program")


def obtain_object(args: argparse.Namespace) -> BpfObject:
    """The object the command works on, from FILE (an ELF object, or raw bytecode with
    --hook).  Raises LoadError (a UserError) with one line naming the file."""
    if getattr(args, "expr", None) is not None:          # -e QUERY (added by the language)
        from ..lang.pipeline import compile_query, schema_from
        if args.file is not None:
            raise UserError("give either -e QUERY or FILE, not both")
        return compile_query(args.expr, schema_from(args.schema), verify=False).obj
    if args.file is None:
        raise UserError("give an object FILE or -e QUERY")
    path = Path(args.file)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise LoadError(f"{path}: cannot read: {e.strerror or e}") from None
    if data[:4] != ELF_MAGIC and args.hook:
        return program_from_bytes(data, args.hook, name=path.stem, where=str(path))
    if data[:4] != ELF_MAGIC:
        raise LoadError(f"{path}: not an eBPF object: expected an ELF file (\\x7fELF), found "
                        f"{data[:8]!r}{' (empty file)' if not data else ''}; for raw bytecode give --hook")
    return load_object(data, name=str(path))


def _hook_override(spec: Optional[str]) -> Optional[abi.Hook]:
    if spec is None:
        return None
    try:
        return abi.hook(spec)
    except KeyError:
        raise UserError(f"--hook: unknown hook '{spec}' (expected one of "
                        f"{', '.join(h.name for h in abi.HOOKS)})") from None


def check_schema(obj: BpfObject, schema_path: str) -> None:
    """Load the task schema and check the object was compiled against it (when the
    object records a schema hash)."""
    from ..abi.schema import load_schema    # imported here: optional for plain verification
    schema = load_schema(schema_path)
    if obj.schema_hash is not None and obj.schema_hash != schema.hash:
        raise LoadError(f"{obj.path}: section 'dtmk_schema': object was compiled against task schema "
                        f"{obj.schema_hash}, {schema_path} is {schema.hash}")


def select_programs(obj: BpfObject, name: Optional[str]) -> List[Program]:
    if name is None:
        return list(obj.programs)
    for p in obj.programs:
        if p.name == name:
            return [p]
    raise UserError(f"{obj.path}: --program: no program '{name}' (the object has "
                    f"{', '.join(p.name for p in obj.programs) or 'none'})")


def summary(prog: Program, obj: BpfObject, res) -> str:
    maps = ", ".join(obj.maps[i].name for i in sorted(res.maps_used)) or "none"
    helpers = ", ".join(abi.HELPERS_BY_ID[h].name if h in abi.HELPERS_BY_ID else str(h)
                        for h in sorted(res.helpers_used)) or "none"
    return (f"{prog.section} {prog.name}: accepted, {res.insn_count} insns, max path {res.max_path_insns}, "
            f"maps: {maps}, helpers: {helpers}")


def _source_suffix(prog: Program, e: Exception) -> str:
    pc = getattr(e, "pc", None)
    loc = prog.source_at(pc) if isinstance(pc, int) else None
    if loc is None:
        return ""
    return f" (at {loc}" + (f": {loc.text})" if loc.text else ")")


def run(args: argparse.Namespace) -> int:
    from ..bpf.verifier import verify
    hook = _hook_override(args.hook)
    obj = obtain_object(args)
    if args.schema:
        check_schema(obj, args.schema)
    for prog in select_programs(obj, args.program):
        if hook is not None and hook is not prog.hook:
            prog = replace(prog, hook=hook, section=hook.section)
        try:
            res = verify(prog, obj.maps)
        except Rejected as e:
            # the verifier's own error, with the place added: file, section, program and,
            # for C monitors built with -g, the source line of the instruction
            e.args = (f"{obj.path}: {prog.section} {prog.name}: {e}{_source_suffix(prog, e)}",)
            raise
        print(summary(prog, obj, res))
    sys.stdout.flush()
    return 0
