"""Compile megakernel.cu cubins for several define sets in parallel (fills the kernel
cache before a GPU session's tests and benches, which then load them; gpu.precompile).

    python tools/precompile.py "" DTMK_NO_HOOKS DTMK_WS_NEXT+DTMK_NO_HOOKS ...
    python tools/precompile.py --variants [more sets ...]

Each argument is one build: defines joined by '+', in the order the caller passes them
(the cache key hashes the tuple); "" is the default build.  --variants adds every build
tests/gpu/test_megakernel_variants_gpu.py loads (each variant on each of its configurations,
with the defines the Megakernel adds for that model): compiled one after another inside the
suite they took most of a 270 s part (session 20).  Exit status 1 if any failed."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def variant_test_sets() -> list:
    """The define tuples test_megakernel_variants_gpu.py's Megakernels are built with (the
    cache keys), the default build's included."""
    from dtrace_mk.megakernel import gpu
    spec = importlib.util.spec_from_file_location("_variants_gpu", ROOT / "tests" / "gpu" / "test_megakernel_variants_gpu.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    sets = []
    for cfg, _batch, _steps in mod.CFGS.values():
        for defines in [()] + [d for d, _prefetch in mod.VARIANTS.values()]:
            sets.append(gpu.megakernel_defines(cfg, 1, defines))
    return sorted(set(sets))


def main(argv=None) -> int:
    from dtrace_mk.megakernel import gpu
    args = list(sys.argv[1:] if argv is None else argv)
    if any(a in ("-h", "--help") for a in args):
        print(__doc__)
        return 0
    bad = [a for a in args if a.startswith("-") and a != "--variants"]
    if bad:
        print(f"precompile.py: unknown option {bad[0]!r} (a build is defines joined by '+'; see --help)",
              file=sys.stderr)
        return 2
    sets = [tuple(d for d in spec.split("+") if d) for spec in args if spec != "--variants"]
    if "--variants" in args:
        sets += variant_test_sets()
    elif not sets:
        sets = [()]
    sets = sorted(set(sets))
    failed = 0
    for defs, (secs, err) in gpu.precompile(sets, workers=min(len(sets), 16)).items():
        name = "+".join(defs) or "(default)"
        print(f"{name}: FAILED {err!r}" if err is not None else f"{name}: {secs:.1f} s", flush=True)
        failed += err is not None
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
