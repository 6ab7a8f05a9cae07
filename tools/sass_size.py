"""How many bytes of SASS each source function of a megakernel build takes (no GPU).

    python tools/sass_size.py [--preset 1b] [--defines DEF+DEF] [--top 25] [--nvdisasm PATH]
                              [--monitor summary [--no-fold]]

Session 29 found the hot summary slows the SMs that share a GPC with an observer SM through
the instruction path (docs/dev/hook_cost_analysis.md "Session 29"): observers that only
execute fresh code slow their GPC-mates as the VM does.  The 1b kernel is ~750 KB of SASS (no
hooks) to ~940 KB (observer build), far above an SM's instruction cache, so code size is a
cost of its own.  This compiles megakernel.cu for sm_90a through NVRTC with -lineinfo (the
model's own defines added, gpu.megakernel_defines), disassembles it with nvdisasm (pip
nvidia-cuda-nvdisasm; --nvdisasm or $PATH) and attributes every instruction to the source
function whose body holds its line: prints KB per file and the --top functions (inlined
copies summed).

--monitor summary: the compiled tier's build instead -- megakernel.cu with the build's defines
(-DDTMK_COMPILED_TIER) LTO-linked with the summary monitor (dtrace_mk.runtime.live
SUMMARY_QUERY) by nvJitLink, as bench/hooks.py's summary_cm runs it -- and also the SASS
functions (kernel, __noinline__ subroutines) by size: where the compiled drain's code lies
(docs/results/hooks.md "Session 38").  --no-fold: the monitor with the generic map helpers
(summary_cmgen).  The monitor's map addresses are host ones (its shapes' constants differ
from a device run's, not its code)."""
from __future__ import annotations

import argparse
import bisect
import collections
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SASS_BYTES = 16                       # (sm_90: one instruction = 16 bytes)
_FILE_LINE = re.compile(r'//## File "([^"]*)", line (\d+)')
_INSTR = re.compile(r"^\s+/\*[0-9a-f]{4,}\*/\s")
_FUNC = re.compile(r'\s*(?:template\s*<[^>]*>\s*)?(?:static\s+|extern\s+"C"\s+)?(?:__device__|__global__)[^;(]*?\b([A-Za-z_]\w*)\s*\(')
_BOUNDS = re.compile(r"__launch_bounds__\s*\([^)]*\)")
# a SASS function's label: the kernel ("dtmk_megakernel:") or a subroutine of it, a __noinline__
# body ("$dtmk_megakernel$_Z10hook_flushRK8MkParamsR6Worker:")
_SYMBOL = re.compile(r"^\$?([A-Za-z_]\w*)(?:\$(\S+))?:\s*$")
_MANGLED = re.compile(r"_Z(?:L)?(\d+)")


def function_starts(text: str) -> list:
    """[(line, name)] of the __device__ / __global__ function definitions in a source text
    (a declaration ending in ';' is not one)."""
    out = []
    for i, ln in enumerate(text.splitlines(), 1):
        m = _FUNC.match(_BOUNDS.sub("", ln))
        if m and not ln.rstrip().endswith(";"):
            out.append((i, m.group(1)))
    return out


def instruction_lines(sass: str, sources: dict) -> list:
    """[(file name, function, line)] per instruction of `nvdisasm -g` output, in address
    order; sources: {path as the line info names it: its text}.  An instruction before any
    line info is ("?", "?", 0); one in a file not given (file, "?", line)."""
    starts = {p: function_starts(t) for p, t in sources.items()}
    keys = {p: [s for s, _ in st] for p, st in starts.items()}
    out = []
    cur = None
    for ln in sass.splitlines():
        m = _FILE_LINE.search(ln)
        if m:
            cur = (m.group(1), int(m.group(2)))
            continue
        if not _INSTR.match(ln):
            continue
        if cur is None:
            out.append(("?", "?", 0))
            continue
        path, line = cur
        st = starts.get(path)
        k = bisect.bisect_right(keys[path], line) - 1 if st else -1
        out.append((Path(path).name, st[k][1] if k >= 0 else "?", line))
    return out


def instruction_functions(sass: str, sources: dict) -> list:
    """[(file name, function)] per instruction (instruction_lines without the line)."""
    return [(f, fn) for f, fn, _ in instruction_lines(sass, sources)]


_TEMPLATE_INT = re.compile(r"IL[a-z](\d+)EE")


def demangle(sym: str) -> str:
    """The plain name of an Itanium-mangled free function (_Z10hook_flushRK8MkParams... ->
    hook_flush; a template on one integer, _Z8run_taskILj0EEv... -> run_task<0>: -DDTMK_OFF_COPY=3's
    two run_task copies); anything else as given (no c++filt on the CI machine)."""
    m = _MANGLED.match(sym)
    if not m:
        return sym
    n = int(m.group(1))
    name = sym[m.end():m.end() + n]
    if len(name) != n:
        return sym
    t = _TEMPLATE_INT.match(sym, m.end() + n)
    return f"{name}<{t.group(1)}>" if t else name


def instruction_symbols(sass: str) -> list:
    """The SASS function (kernel or __noinline__ subroutine, demangled) of each instruction of
    `nvdisasm` output, in address order: where the code lies, which inlined source functions
    (instruction_functions) do not tell -- an instruction cache holds a subroutine's lines,
    its hot and cold paths interleaved.  Before any label: "?"."""
    out, cur = [], "?"
    for ln in sass.splitlines():
        if _INSTR.match(ln):
            out.append(cur)
            continue
        m = _SYMBOL.match(ln)          # (section and local labels, ".text.k:" / ".L_x_0:", do not match)
        if m:
            cur = demangle(m.group(2)) if m.group(2) else m.group(1)
    return out


def attribute(sass: str, sources: dict) -> collections.Counter:
    """Instructions per (file name, function) of `nvdisasm -g` output (instruction_functions
    summed: inlined copies together)."""
    return collections.Counter(instruction_functions(sass, sources))


def disassemble(cubin: bytes, tool: str, kdir=None) -> tuple:
    """(nvdisasm -g text, {path: source text}) of a megakernel cubin built with -lineinfo;
    kdir: the kernel sources it was built from (default: this tree's kernels/)."""
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "k.cubin"
        p.write_bytes(cubin)
        sass = subprocess.run([tool, "-g", "-c", str(p)], capture_output=True, text=True, check=True).stdout
    kdir = Path(kdir) if kdir else ROOT / "kernels"
    paths = set(m.group(1) for m in _FILE_LINE.finditer(sass))
    # (NVRTC names the main file as given, the includes by their path)
    return sass, {pth: ((kdir / Path(pth).name).read_text() if (kdir / Path(pth).name).exists() else "")
                  for pth in paths}


def find_nvdisasm(given=None) -> str:
    """nvdisasm: the given path, $PATH, or the pip wheel's (nvidia/cu13/bin) next to cuda.bindings."""
    if given:
        return given
    if shutil.which("nvdisasm"):
        return shutil.which("nvdisasm")
    for base in map(Path, sys.path):
        for cand in base.glob("nvidia/cu*/bin/nvdisasm"):
            return str(cand)
    raise SystemExit("sass_size: no nvdisasm (pip install nvidia-cuda-nvdisasm, or --nvdisasm PATH)")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="1b")
    ap.add_argument("--defines", default="", help="DEF+DEF: the build's defines (the model's are added)")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--nvdisasm", default=None)
    ap.add_argument("--monitor", choices=("summary",), help="the compiled tier's build, this monitor linked in")
    ap.add_argument("--no-fold", action="store_true", help="with --monitor: the generic map helpers (no shapes)")
    a = ap.parse_args(argv)
    from dtrace_mk.kernels import build
    from dtrace_mk.megakernel import gpu
    from dtrace_mk.megakernel.presets import PRESETS
    if a.preset not in PRESETS:
        ap.error(f"--preset: unknown {a.preset!r} (known: {', '.join(PRESETS)})")
    tool = find_nvdisasm(a.nvdisasm)
    kdir = ROOT / "kernels"
    defs = gpu.megakernel_defines(PRESETS[a.preset], 1, tuple(d for d in a.defines.split("+") if d))
    if a.monitor:
        cubin, monitor = linked_cubin(defs, not a.no_fold)
    else:
        cubin = build.nvrtc_compile((kdir / "megakernel.cu").read_text(), "megakernel.cu", "sm_90a", "cubin", defs,
                                    include_dirs=[str(kdir)], options=("-lineinfo",))
    sass, sources = disassemble(cubin, tool)
    if a.monitor:                      # (the monitor's line info names a file that is not in kernels/)
        sources.update({pth: monitor for pth in sources if Path(pth).name == "monitor.cu"})
    cnt = attribute(sass, sources)
    total = sum(cnt.values())
    print(f"{a.preset} {'+'.join(defs) or '(default)'}: {total} instructions, {total * SASS_BYTES / 1024:.0f} KB of SASS")
    per_file = collections.Counter()
    for (f, _), c in cnt.items():
        per_file[f] += c
    for f, c in per_file.most_common():
        print(f"  {f:<22}{c * SASS_BYTES / 1024:>8.1f} KB")
    print(f"--- top {a.top} functions (inlined copies summed)")
    for (f, fn), c in cnt.most_common(a.top):
        print(f"  {f:<22}{fn:<32}{c * SASS_BYTES / 1024:>8.1f} KB")
    if a.monitor:
        syms = collections.Counter(instruction_symbols(sass))
        print(f"--- top {a.top} SASS functions (kernel, __noinline__ subroutines): instructions, KB")
        for s, c in syms.most_common(a.top):
            print(f"  {s[-60:]:<62}{c:>7}{c * SASS_BYTES / 1024:>8.1f} KB")
    return 0


def linked_cubin(defs, fold: bool) -> tuple:
    """(cubin, monitor source): megakernel.cu with `defs` as the compiled tier builds it
    (compiled.megakernel_spec) LTO-linked with the summary monitor, both with -lineinfo."""
    from dtrace_mk.kernels import build
    from dtrace_mk.runtime import compiled as C
    from dtrace_mk.runtime.live import summary_monitor
    rt = C.HostCompiledRuntime(1)
    rt.fold_maps = fold
    rt.attach(summary_monitor().obj, tier="compiled")
    monitor = rt.monitor()
    spec = C.megakernel_spec(defs)
    kdir = ROOT / "kernels"
    k = build.nvrtc_compile((kdir / spec.name).read_text(), spec.name, "sm_90a", "ltoir", spec.defines,
                            options=("-lineinfo",))
    m = build.nvrtc_compile(monitor, "monitor.cu", "sm_90a", "ltoir", (), options=("-lineinfo",))
    return C.link_cubin([(spec.name, k), ("monitor.cu", m)], "sm_90a", lineinfo=True), monitor


if __name__ == "__main__":
    sys.exit(main())
