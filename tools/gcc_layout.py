"""The GPC instruction cache's conflict misses of a megakernel build, predicted from a saved
profile (no GPU).

    python tools/gcc_layout.py save SRC.csv --match NAME=PRESET:DEFS ... [--min 1000] --out HOT.json
    python tools/gcc_layout.py predict HOT.json BUILD=PRESET:DEFS ... [--from NAME,NAME]

Session 58 (docs/dev/hook_cost_analysis.md "Session 58") found the hook build's off cost in the
GPC cache (GCC, L1.5): its instruction fetches from L2 follow the cost, and a model of it as
64 sets x 16 ways of 128-byte lines (tools/ncu_footprint.py GCC_SETS / GCC_WAYS) separates the
builds the same way -- the hot lines (executed >= 1000 times per launch) beyond their set's ways
are its conflict misses, fixed by where the cubin puts each function.

`save` keeps, per --match build of an Nsight Compute source export (plans 157-158: one launch per
build), its hot code position-free: per SASS function its size and the runs of hot instructions
(offsets in the function).  `predict` lays each saved build's hot code out as another build places
its functions (compiled here with the profiled machine's NVRTC: tools/kcache.sh makes that venv)
and prints its hot lines and how many exceed their set's ways -- a layout judged without the GPU,
as long as the functions' code is the profiled one (the sizes that changed are named).
-DDTMK_HOT_FIRST's renames (kernels/megakernel.cu) are followed: a profile keeps the functions'
names before them, so any build's hot code lays out in any other."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ncu_footprint as nf  # noqa: E402

FORMAT = 1


def layout_of(symbols) -> list:
    """[[SASS function, instructions], ...] in cubin order: the build's layout, kept with its hot code."""
    out = []
    for sym in symbols:
        if out and out[-1][0] == sym:
            out[-1][1] += 1
        else:
            out.append([sym, 1])
    return out


def symbols_of(layout) -> list:
    """The per-instruction SASS function list of a saved layout (layout_of's inverse)."""
    return [sym for sym, n in layout for _ in range(n)]


def save(csv_path, specs, min_exec: int) -> dict:
    """The HOT.json document of the first launch of each --match build in the export."""
    launches = nf.load(csv_path)
    alias = nf.hot_first_alias()
    syms = {}
    for spec in specs:
        name, build = nf.parse_match(spec)
        syms[name] = (build, nf.canonical_symbols(nf.build_symbols(build), alias))   # (names before renames)
    names = nf.match_builds(launches, {k: len(v[1]) for k, v in syms.items()})
    builds = {}
    for k, name in enumerate(names):
        if name is None or name in builds:
            continue
        build, sy = syms[name]
        hot = nf.hot_lines(launches[k], min_exec)
        builds[name] = {"build": build, "launch": k, "instructions": len(sy),
                        "hot_lines": len(hot), "overflow": nf.set_overflow(hot),
                        "functions": nf.hot_runs(launches[k], sy, min_exec),
                        "layout": layout_of(sy)}
    missing = sorted(set(syms) - set(builds))
    if missing:
        raise ValueError(f"no launch of {', '.join(missing)} in {csv_path} (told apart by instruction count)")
    return {"format": FORMAT, "source": Path(csv_path).name, "min_exec": min_exec, "gcc": [nf.GCC_SETS, nf.GCC_WAYS],
            "builds": builds}


def load(path) -> dict:
    doc = json.loads(Path(path).read_text())
    if doc.get("format") != FORMAT or "builds" not in doc:
        raise ValueError(f"{path}: not a tools/gcc_layout.py save (format {FORMAT})")
    return doc


def predict(doc, runs_of, new_symbols, alias) -> tuple:
    """(hot lines, lines beyond their set's ways, gone, resized) of saved build `runs_of` laid out
    as new_symbols."""
    lines, gone, resized = nf.lay_out(doc["builds"][runs_of]["functions"], new_symbols, alias)
    return len(lines), nf.set_overflow(lines), gone, resized


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sv = sub.add_parser("save", help="the hot code of each --match build of an ncu source export")
    sv.add_argument("csv")
    sv.add_argument("--match", action="append", required=True, metavar="NAME=PRESET:DEFS")
    sv.add_argument("--min", type=int, default=1000, help="hot: executed at least this many times (1000)")
    sv.add_argument("--out", required=True)
    pr = sub.add_parser("predict", help="saved builds' hot code laid out as other builds place their functions")
    pr.add_argument("hot")
    pr.add_argument("build", nargs="+", metavar="NAME=PRESET:DEFS")
    pr.add_argument("--from", dest="frm", help="the saved builds to lay out (default: all)")
    a = ap.parse_args(argv)
    try:
        if a.cmd == "save":
            doc = save(a.csv, a.match, a.min)
            Path(a.out).write_text(json.dumps(doc, separators=(",", ":")) + "\n")
            for name, b in doc["builds"].items():
                print(f"{name:<12} launch {b['launch']}: {b['hot_lines']} hot lines, {b['overflow']} beyond their "
                      f"set's ways (GCC model {nf.GCC_SETS} x {nf.GCC_WAYS})")
            print(f"saved {a.out}")
            return 0
        doc = load(a.hot)
        frm = a.frm.split(",") if a.frm else list(doc["builds"])
        unknown = [f for f in frm if f not in doc["builds"]]
        if unknown:
            raise ValueError(f"--from: {', '.join(unknown)} not saved in {a.hot} (saved: {', '.join(doc['builds'])})")
        alias = nf.hot_first_alias()
        for spec in a.build:
            name, build = nf.parse_match(spec, "predict")
            new = nf.build_symbols(build)
            for f in frm:
                n, over, gone, resized = predict(doc, f, new, alias)
                print(f"{f:<12} as {name:<14} {n:>5} hot lines, {over:>4} beyond their set's ways (saved layout: "
                      f"{doc['builds'][f]['overflow']})"
                      + (f"; not in it: {', '.join(sorted(gone))}" if gone else "")
                      + (f"; resized: {', '.join(sorted(resized))}" if resized else ""))
    except (OSError, ValueError) as e:
        ap.error(str(e))
    return 0


if __name__ == "__main__":
    sys.exit(main())
