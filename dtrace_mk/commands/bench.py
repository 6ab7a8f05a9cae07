"""`dtrace-mk bench [NAME [OPTIONS...]]`: list the benchmarks, or run one.

The benchmarks are the scripts under the checkout's `bench/` (they ship with the source,
not with the installed package).  Each one says what it needs in a module-level literal
read here without importing it (its imports may need a GPU):

    REQUIRES = "gpu"       # cpu | gpu | gpu:N (N ranks under mpiexec, one GPU each)
    CPU_MODE = "--cpu"     # optional: the option that runs its CPU-only part

so this command can refuse a GPU benchmark on a machine without one before it starts, with
the reason, instead of failing somewhere inside it.
"""
from __future__ import annotations

import ast
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from ..errors import UserError

NAME = "bench"
HELP = "list the benchmarks, or run one (bench/NAME.py) with its own options"
DESCRIPTION = """\
Without NAME: list the benchmarks of the checkout's bench/ directory, what each needs
(cpu, gpu, or gpu:N -- N ranks under mpiexec, a GPU each) and what it measures.

With NAME: run bench/NAME.py with the OPTIONS that follow (they are the benchmark's own;
'dtrace-mk bench NAME --help' shows them).  A GPU benchmark is refused on a machine whose
CUDA reports fewer GPUs than it needs (unless the option of its CPU-only part is given,
e.g. 'dtrace-mk bench compiled --cpu'); a gpu:N benchmark runs as N ranks under mpiexec
($DTRACE_MK_MPIEXEC, else the venv's).  The exit status is the benchmark's.

Every figure a benchmark prints is a ratio measured side by side in one run, or carries
the card, commit and date it was taken on (docs/results/).

The bench/ directory is found next to the dtrace_mk package (a source checkout), or at
$DTRACE_MK_BENCH_DIR."""
ORDER = 64

ENV_BENCH_DIR = "DTRACE_MK_BENCH_DIR"
HELPERS = ("benchio",)        # modules of bench/ that other benchmarks import, not benchmarks


@dataclass(frozen=True)
class Bench:
    name: str
    path: Path
    requires: str             # "cpu", "gpu" or "gpu:N"
    cpu_mode: Optional[str]   # the option that runs its CPU-only part, if any
    summary: str              # the docstring's first line

    @property
    def gpus(self) -> int:
        """GPUs it needs (0 for cpu); also its MPI ranks when more than one."""
        if self.requires == "cpu":
            return 0
        return int(self.requires.partition(":")[2] or 1)


def bench_dir() -> Path:
    """$DTRACE_MK_BENCH_DIR, else bench/ beside the dtrace_mk package (a checkout)."""
    forced = os.environ.get(ENV_BENCH_DIR)
    d = Path(forced) if forced else Path(__file__).resolve().parents[2] / "bench"
    if not d.is_dir():
        raise UserError(f"no bench/ directory at {d}: the benchmarks ship with the source checkout, not "
                        f"the installed package (set ${ENV_BENCH_DIR} to a checkout's bench/)")
    return d


def _literal(tree: ast.Module, name: str):
    for node in tree.body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name) and node.targets[0].id == name):
            return ast.literal_eval(node.value)
    return None


def read_bench(path: Path) -> Bench:
    """A benchmark's declaration, from its source (not imported).  UserError naming the
    file when REQUIRES is missing or malformed."""
    try:
        tree = ast.parse(path.read_text(), str(path))
    except (OSError, SyntaxError) as e:
        raise UserError(f"{path}: cannot read the benchmark: {e}") from None
    req = _literal(tree, "REQUIRES")
    ok = req == "cpu" or req == "gpu" or (isinstance(req, str) and req.startswith("gpu:")
                                          and req[4:].isdigit() and int(req[4:]) >= 1)
    if not ok:
        raise UserError(f"{path}: REQUIRES: expected \"cpu\", \"gpu\" or \"gpu:N\", got {req!r}")
    return Bench(path.stem, path, req, _literal(tree, "CPU_MODE"), _summary(ast.get_docstring(tree) or ""))


def _summary(doc: str, width: int = 100) -> str:
    """The docstring's first sentence (its first paragraph joined), cut to `width`."""
    para = " ".join(doc.strip().split("\n\n")[0].split())
    cut = para.find(". ")
    s = para[:cut + 1] if cut >= 0 else para
    return s if len(s) <= width else s[:width - 3].rstrip() + "..."


def benchmarks(directory: Optional[Path] = None) -> Dict[str, Bench]:
    """Every benchmark of bench/, by name (helper modules left out)."""
    d = directory or bench_dir()
    return {p.stem: read_bench(p) for p in sorted(d.glob("*.py"))
            if p.stem not in HELPERS and not p.stem.startswith("_")}


def refusal(b: Bench, args: Sequence[str], gpu_count) -> Optional[str]:
    """Why `b` cannot run here with `args` (None: it can).  gpu_count() -> (n, why none)."""
    if b.gpus == 0 or "-h" in args or "--help" in args or (b.cpu_mode and b.cpu_mode in args):
        return None
    n, why = gpu_count()
    if n >= b.gpus:
        return None
    have = f"{n} GPU{'s' if n != 1 else ''}" + (f" ({why})" if why else "")
    hint = f"; '{b.cpu_mode}' runs its CPU-only part" if b.cpu_mode else ""
    return f"{b.name} needs {b.gpus} GPU{'s' if b.gpus > 1 else ''}, this machine has {have}{hint}"


def command(b: Bench, args: Sequence[str]) -> List[str]:
    """The command line that runs `b`: the interpreter, or N ranks under mpiexec."""
    cmd = [sys.executable, str(b.path), *args]
    if b.gpus <= 1:
        return cmd
    from .diagnose import find_mpiexec, mpi_flags, mpi_flavour
    exe = find_mpiexec()
    return [exe, *mpi_flags(mpi_flavour(exe)), "-n", str(b.gpus), *cmd]


def render(benches: Dict[str, Bench], directory: Path) -> str:
    w = max(len(n) for n in benches) if benches else 4
    lines = [f"benchmarks in {directory}:", f"  {'NAME':<{w}}  {'NEEDS':<5}  WHAT IT MEASURES"]
    for b in benches.values():
        needs = b.requires + ("*" if b.cpu_mode else "")
        lines.append(f"  {b.name:<{w}}  {needs:<5}  {b.summary}")
    lines.append("(* has a CPU-only part)  'dtrace-mk bench NAME --help': its options; "
                 "'dtrace-mk bench NAME [OPTIONS]' runs it")
    return "\n".join(lines)


def add_arguments(p) -> None:
    import argparse
    p.add_argument("name", nargs="?", metavar="NAME", help="the benchmark (bench/NAME.py); none: list them")
    p.add_argument("options", nargs=argparse.REMAINDER, metavar="OPTIONS",
                   help="the benchmark's own options (see 'dtrace-mk bench NAME --help')")


def run(args) -> int:
    d = bench_dir()
    benches = benchmarks(d)
    if args.name is None:
        print(render(benches, d))
        return 0
    b = benches.get(args.name)
    if b is None:
        raise UserError(f"no benchmark {args.name!r} in {d} (known: {', '.join(benches)})")
    from ..megakernel.gpu_build import gpu_count
    why = refusal(b, args.options, gpu_count)
    if why:
        raise UserError(why)
    cmd = command(b, args.options)
    print(f"dtrace-mk bench: {' '.join(cmd)}", file=sys.stderr, flush=True)
    return subprocess.run(cmd).returncode
