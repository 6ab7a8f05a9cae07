"""Compile megakernel.cu cubins for several define sets in parallel (fills the kernel
cache before a GPU session's tests and benches, which then load them; gpu.precompile).

    python tools/precompile.py "" DTMK_NO_HOOKS DTMK_WS_NEXT+DTMK_NO_HOOKS ...

Each argument is one build: defines joined by '+', in the order the caller passes them
(the cache key hashes the tuple); "" is the default build.  Exit status 1 if any failed."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    from dtrace_mk.megakernel import gpu
    sets = [tuple(d for d in spec.split("+") if d) for spec in (sys.argv[1:] or [""])]
    failed = 0
    for defs, (secs, err) in gpu.precompile(sets, workers=min(len(sets), 16)).items():
        name = "+".join(defs) or "(default)"
        print(f"{name}: FAILED {err!r}" if err is not None else f"{name}: {secs:.1f} s", flush=True)
        failed += err is not None
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
