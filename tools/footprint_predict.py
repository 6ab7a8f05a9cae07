"""Predict what a changed kernel executes from an earlier build's Nsight Compute export (no GPU).

    python tools/footprint_predict.py EXPORT --diff A:B --base COMMIT --build PRESET:DEFS [--min 1000]

Session 31 cut the observer's code (docs/dev/hook_cost_analysis.md "Session 31") and needed a
GPU call per change to see what it saved in executed KB (tools/ncu_footprint.py).  This
estimates it here instead.  EXPORT's launches ran PRESET:DEFS built at COMMIT (e.g. plan 67's
off and summary); the tool compiles that build from COMMIT's kernels/ and from this tree's
(NVRTC -lineinfo + nvdisasm: the profiled machine's NVRTC, as ncu_footprint --build), maps each
source line of COMMIT to this tree's (difflib, per file) and counts, in each build, the
instructions whose source line launch B executed at least --min times where launch A never
ran it -- the code the monitor adds -- as instructions and as 128-byte lines, per function.

The base build's count is what the method sees of the measured export, so read the new one
against it (a source line counts all its inlined copies, executed or not; the measured added
KB is printed beside it).  A changed or new source line is not in the map: its instructions
are counted apart ("unmapped, in added functions") -- changed code needs a real run to know."""
from __future__ import annotations

import argparse
import collections
import difflib
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

import ncu_footprint as nf  # noqa: E402

SASS_BYTES = nf.SASS_BYTES
LINE_BYTES = nf.LINE_BYTES


def added_weights(a, b, lines, min_exec: int = 1) -> dict:
    """{(file, line): the share of that source line's instructions in the build that launch b
    executed >= min_exec times and launch a never} for the lines with any (lines: (file,
    function, line) per instruction of their build).  A share, not a set: a line's inlined
    copies are not all on the monitor's path."""
    if not (len(a) == len(b) == len(lines)):
        raise ValueError(f"the build has {len(lines)} instructions, the launches {len(a)} / {len(b)}: "
                         f"not the profiled build (other defines or commit, or another NVRTC)")
    total, hit = collections.Counter(), collections.Counter()
    for x, y, (f, _, ln) in zip(a, b, lines):
        total[f, ln] += 1
        if y >= min_exec and x == 0:
            hit[f, ln] += 1
    return {k: hit[k] / total[k] for k in hit}


def line_map(old: str, new: str) -> dict:
    """{old line: new line} (1-based) for the lines difflib finds unchanged between two texts."""
    sm = difflib.SequenceMatcher(None, old.splitlines(), new.splitlines(), autojunk=False)
    out = {}
    for i, j, n in sm.get_matching_blocks():
        for k in range(n):
            out[i + k + 1] = j + k + 1
    return out


def predict(lines, weights: dict) -> collections.Counter:
    """Expected instructions added per function: each instruction weighs its source line's
    share (added_weights, the lines already mapped into this build)."""
    out = collections.Counter()
    for f, fn, ln in lines:
        w = weights.get((f, ln))
        if w:
            out[fn] += w
    return out


def build(spec: str, kdir: Path) -> list:
    """(file, function, line) per instruction of megakernel.cu in kdir, built as PRESET:DEFS."""
    from dtrace_mk.megakernel import gpu
    from dtrace_mk.megakernel.presets import PRESETS
    from dtrace_mk.kernels import build as kb
    import sass_size as ss
    preset, _, defs = spec.partition(":")
    if preset not in PRESETS:
        raise ValueError(f"--build: unknown preset {preset!r} (known: {', '.join(PRESETS)})")
    d = gpu.megakernel_defines(PRESETS[preset], 1, tuple(x for x in defs.split("+") if x))
    cubin = kb.nvrtc_compile((kdir / "megakernel.cu").read_text(), "megakernel.cu", "sm_90a", "cubin", d,
                             include_dirs=[str(kdir)], options=("-lineinfo",))
    return ss.instruction_lines(*ss.disassemble(cubin, ss.find_nvdisasm(), kdir))


def checkout_kernels(commit: str, dest: Path) -> Path:
    """COMMIT's kernels/ unpacked under dest (git archive)."""
    tar = dest / "k.tar"
    with open(tar, "wb") as f:
        subprocess.run(["git", "-C", str(ROOT), "archive", commit, "kernels"], stdout=f, check=True)
    with tarfile.open(tar) as t:
        t.extractall(dest)
    return dest / "kernels"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("export")
    ap.add_argument("--diff", required=True, metavar="A:B", help="launch A (monitor off), B (on) of the export")
    ap.add_argument("--base", required=True, metavar="COMMIT", help="the commit the export's build was built from")
    ap.add_argument("--build", required=True, metavar="PRESET:DEFS", help="the export's build (e.g. 1b:DTMK_OBS_SM+...)")
    ap.add_argument("--min", type=int, default=1000)
    ap.add_argument("--top", type=int, default=20)
    a = ap.parse_args(argv)
    try:
        i, j = (int(x) for x in a.diff.split(":"))
        launches = nf.load(a.export)
        if not (0 <= i < len(launches) and 0 <= j < len(launches)):
            raise ValueError(f"--diff: the export has launches 0..{len(launches) - 1}")
    except (OSError, ValueError) as e:
        ap.error(str(e))
    with tempfile.TemporaryDirectory() as d:
        try:
            old_k = checkout_kernels(a.base, Path(d))
        except subprocess.CalledProcessError:
            ap.error(f"--base {a.base}: not a commit of this repository")
        old_lines = build(a.build, old_k)
        new_lines = build(a.build, ROOT / "kernels")
        texts = {p.name: p.read_text() for p in old_k.iterdir() if p.is_file()}
    try:
        w_old = added_weights(launches[i], launches[j], old_lines, a.min)
    except ValueError as e:
        ap.error(str(e))
    new_texts = {f: (ROOT / "kernels" / f).read_text() for f in {f for f, _ in w_old}
                 if f in texts and (ROOT / "kernels" / f).exists()}
    maps = {f: line_map(texts[f], new_texts[f]) for f in new_texts}
    w_new = {(f, maps[f][ln]): w for (f, ln), w in w_old.items() if f in maps and ln in maps[f]}
    old_fn, new_fn = predict(old_lines, w_old), predict(new_lines, w_new)
    kept = {f: set(m.values()) for f, m in maps.items()}
    unmapped = collections.Counter(fn for f, fn, ln in new_lines     # changed / new lines of those functions
                                   if fn in old_fn and f in kept and ln not in kept[f])
    measured = sum(n for _, n, _ in nf.added(launches[i], launches[j], a.min))
    kb = lambda n: n * SASS_BYTES / 1024             # noqa: E731
    print(f"launch {j} over {i}, executed >= {a.min} times and never before: measured {kb(measured):.1f} KB "
          f"({nf.new_lines_kb(launches[i], launches[j], a.min):.1f} KB of {LINE_BYTES}-byte lines)")
    print(f"  base {a.base[:9]} (the method on the measured build): {kb(sum(old_fn.values())):.1f} KB")
    print(f"  this tree, expected: {kb(sum(new_fn.values())):.1f} KB, and {kb(sum(unmapped.values())):.1f} KB of "
          f"changed or new source lines in those functions (not estimated)")
    print(f"--- per function (KB): base, this tree expected, this tree unmapped")
    for fn, n in sorted(old_fn.items(), key=lambda kv: -kv[1])[:a.top]:
        print(f"  {fn:<30}{kb(n):>8.2f}{kb(new_fn.get(fn, 0)):>8.2f}{kb(unmapped.get(fn, 0)):>8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
