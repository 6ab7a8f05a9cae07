"""`dtrace-mk` command line: a thin dispatcher.

Each subcommand lives in its own module under `dtrace_mk/commands/` and is found by
discovery, so layers add commands without touching this file.  A command module
defines:

    NAME = "verify"                     # subcommand name
    HELP = "one line for --help"
    def add_arguments(parser): ...      # argparse arguments
    def run(args) -> int: ...           # exit status

User errors (`dtrace_mk.errors.UserError` and subclasses) print one line and exit with
their code; no traceback.
"""
from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from typing import List, Optional

from . import commands as _commands_pkg
from .errors import UserError


def _command_modules():
    mods = []
    for info in pkgutil.iter_modules(_commands_pkg.__path__):
        if info.name.startswith("_"):
            continue
        mod = importlib.import_module(f"{_commands_pkg.__name__}.{info.name}")
        if hasattr(mod, "NAME") and hasattr(mod, "run"):
            mods.append(mod)
    return sorted(mods, key=lambda m: getattr(m, "ORDER", 50))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="dtrace-mk",
        description="Tracing for persistent GPU megakernels: attach verified eBPF monitors to "
                    "semantic hooks, aggregate on the device with explicit coverage, and diagnose "
                    "local imbalance versus remote stalls across MPI ranks.",
        epilog="Run 'dtrace-mk COMMAND --help' for the options of one command.")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    for mod in _command_modules():
        sp = sub.add_parser(mod.NAME, help=mod.HELP, description=getattr(mod, "DESCRIPTION", mod.HELP),
                            formatter_class=argparse.RawDescriptionHelpFormatter)
        if hasattr(mod, "add_arguments"):
            mod.add_arguments(sp)
        sp.set_defaults(_run=mod.run)
    return p


def main(argv: Optional[List[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    try:
        return int(args._run(args) or 0)
    except UserError as e:
        print(f"dtrace-mk {args.command}: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
