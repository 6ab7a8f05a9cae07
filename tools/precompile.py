"""Compile megakernel.cu cubins for several define sets in parallel (fills the kernel
cache before a GPU session's tests and benches, which then load them).

    python tools/precompile.py "" DTMK_NO_HOOKS DTMK_WS_NEXT+DTMK_NO_HOOKS ...

Each argument is one build: defines joined by '+', in the order the caller passes them
(the cache key hashes the tuple); "" is the default build."""
from __future__ import annotations

import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def one(spec: str) -> str:
    from dtrace_mk.megakernel import gpu
    t0 = time.perf_counter()
    defs = tuple(d for d in spec.split("+") if d)
    try:
        gpu.compile_source("sm_90a", "cubin", defines=defs)
    except Exception as e:  # noqa: BLE001 - report, keep the others
        return f"{spec or '(default)'}: FAILED {e!r}"
    return f"{spec or '(default)'}: {time.perf_counter() - t0:.1f} s"


def main() -> int:
    specs = sys.argv[1:] or [""]
    with ProcessPoolExecutor(max_workers=min(len(specs), 16)) as ex:
        for line in ex.map(one, specs):
            print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
