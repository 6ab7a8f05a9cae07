#!/usr/bin/env python3
"""Build the example C monitors with the system clang.

    python examples/monitors/build.py [-o OUT_DIR] [FILE.c ...]

Each monitor is compiled with `clang -target bpf -O2 -g -c` against the generated
header `dtrace_mk/abi/include/dtrace_mk_bpf.h` (so the objects carry the hook ABI
version and BTF map definitions).  Default output directory: examples/monitors/build/.
Then check an object with `dtrace-mk verify OUT_DIR/task_latency.o`.

Tests import this file (by path) for `compile_monitor` and `find_clang`.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import List, Optional, Sequence

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
INCLUDE = REPO / "dtrace_mk" / "abi" / "include"
EXAMPLES = sorted(HERE.glob("*.c"))
CFLAGS = ("-target", "bpf", "-O2", "-g", "-c")


def find_clang() -> Optional[str]:
    """The clang to use: $CLANG, else `clang`, else `clang-14`..`clang-19`; None if absent."""
    env = os.environ.get("CLANG")
    if env:
        return shutil.which(env) or (env if Path(env).exists() else None)
    for name in ("clang",) + tuple(f"clang-{v}" for v in range(19, 13, -1)):
        found = shutil.which(name)
        if found:
            return found
    return None


class BuildError(RuntimeError):
    pass


def compile_monitor(src: os.PathLike, out_dir: os.PathLike, *, clang: Optional[str] = None,
                    extra_flags: Sequence[str] = ()) -> Path:
    """Compile one C monitor into OUT_DIR/<stem>.o and return the path.  Raises
    BuildError with clang's diagnostics on failure."""
    clang = clang or find_clang()
    if clang is None:
        raise BuildError("clang not found (set $CLANG)")
    src = Path(src)
    out = Path(out_dir) / (src.stem + ".o")
    out.parent.mkdir(parents=True, exist_ok=True)
    cmd = [clang, *CFLAGS, f"-I{INCLUDE}", *extra_flags, str(src), "-o", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise BuildError(f"{' '.join(cmd)}\n{r.stderr}")
    return out


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-o", "--out-dir", default=str(HERE / "build"))
    ap.add_argument("files", nargs="*", help="C monitors (default: all examples)")
    args = ap.parse_args(argv)
    srcs = [Path(f) for f in args.files] or EXAMPLES
    for src in srcs:
        try:
            out = compile_monitor(src, args.out_dir)
        except BuildError as e:
            print(f"build.py: {e}", file=sys.stderr)
            return 1
        print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
