"""NVRTC: the one place CUDA sources are compiled (megakernel, device VM, compiled
monitors).  Works without a GPU or driver (CI): cuda-bindings + nvidia-cuda-nvrtc.

    nvrtc_compile(source_text, name="x.cu", arch="sm_90a", target="cubin"|"ltoir"|"ptx")

kernels/ is always on the include path.  NVRTC has no C++ standard headers: sources
use the dtmk_u32/u64 typedefs of the generated dtrace_mk_abi.h."""
from __future__ import annotations

import re
from typing import Optional, Sequence

from ..errors import UserError
from . import KERNEL_DIR

TARGETS = ("cubin", "ltoir", "ptx")


class CompileError(UserError):
    """NVRTC rejected a source; the message carries NVRTC's log (file(line): ...)."""


def nvrtc_module():
    try:
        from cuda.bindings import nvrtc
    except ImportError:  # older cuda-python layout
        from cuda import nvrtc  # type: ignore
    return nvrtc


def nvrtc_version() -> str:
    """NVRTC's "major.minor" (in every kernel cache key)."""
    try:
        _, major, minor = nvrtc_module().nvrtcVersion()
        return f"{major}.{minor}"
    except Exception:  # noqa: BLE001 - no NVRTC at all: callers fail when they compile
        return "unknown"


def nvrtc_library():
    """The libnvrtc shared library this process runs (a Path), or None where it cannot be
    told: two machines whose libraries are the same file compile the same bytes
    (tools/kcache.py carries cubins to a GPU machine on that condition)."""
    from pathlib import Path
    try:
        nvrtc_module().nvrtcVersion()          # (loads the library)
        maps = Path("/proc/self/maps").read_text()
    except Exception:  # noqa: BLE001 - no NVRTC, or no /proc: unknown
        return None
    for line in maps.splitlines():
        fields = line.split(maxsplit=5)           # address perms offset dev inode [path]
        if len(fields) == 6 and re.search(r"/libnvrtc\.so[.\d]*$", fields[5]):
            return Path(fields[5])
    return None


def nvrtc_compile(source: str, name: str = "source.cu", arch: str = "sm_90a", target: str = "cubin",
                  defines: Sequence[str] = (), include_dirs: Sequence[str] = (),
                  options: Sequence[str] = ()) -> bytes:
    """Compile CUDA source text to cubin or LTO-IR (`arch` sm_XX[a]) or PTX (compute_XX).
    `options`: extra NVRTC options (e.g. -rdc=true -maxrregcount=N for a relocatable cubin)."""
    if target not in TARGETS:
        raise ValueError(f"target must be one of {TARGETS}, got {target!r}")
    nvrtc = nvrtc_module()

    def check(res, what):
        err = res[0] if isinstance(res, tuple) else res
        if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise CompileError(f"{name}: NVRTC {what}: {nvrtc.nvrtcGetErrorString(err)[1].decode()}")
        return res[1:] if isinstance(res, tuple) and len(res) > 1 else None

    (prog,) = check(nvrtc.nvrtcCreateProgram(source.encode(), name.encode(), 0, [], []), "create")
    try:
        arch_opt = arch.replace("sm_", "compute_") if target == "ptx" else arch
        opts = [f"--gpu-architecture={arch_opt}", "--std=c++17", "-default-device"]
        opts += [f"--include-path={d}" for d in include_dirs] + [f"--include-path={KERNEL_DIR}"]
        if target == "ltoir":
            opts += ["-dlto", "--relocatable-device-code=true"]
        opts += [f"-D{d}" for d in defines] + list(options)
        res = nvrtc.nvrtcCompileProgram(prog, len(opts), [o.encode() for o in opts])
        # bytes(n), never b" " * n: for n == 1 that is the interned b" ", which NVRTC would overwrite
        log = bytes(nvrtc.nvrtcGetProgramLogSize(prog)[1])
        nvrtc.nvrtcGetProgramLog(prog, log)
        if res[0] != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            text = log.decode(errors="replace").strip("\0 \n")
            raise CompileError(f"{name}: NVRTC failed ({arch}, {target}):\n{text}")
        get_size, get = {"cubin": (nvrtc.nvrtcGetCUBINSize, nvrtc.nvrtcGetCUBIN),
                         "ltoir": (nvrtc.nvrtcGetLTOIRSize, nvrtc.nvrtcGetLTOIR),
                         "ptx": (nvrtc.nvrtcGetPTXSize, nvrtc.nvrtcGetPTX)}[target]
        out = bytes(check(get_size(prog), f"{target} size")[0])
        check(get(prog, out), target)
        return bytes(out)
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def _ptx_definitions(ptx: str):
    """(header match, index of its opening brace) of each PTX .func definition, in order;
    prototypes (a ';' before any '{') are skipped."""
    for m in re.finditer(r"^\.(?:visible |weak |extern )?func\b[^\n]*", ptx, re.M):
        semi, brace = ptx.find(";", m.end()), ptx.find("{", m.end())
        if brace >= 0 and not 0 <= semi < brace:
            yield m, brace


def hot_first_renames(source: Optional[str] = None) -> dict:
    """-DDTMK_HOT_FIRST's renames of the workers' hot functions (the default layout since
    session 60; kernels/megakernel.cu's `#ifdef DTMK_HOT_FIRST` block, the one list):
    {name in the source: name in the module}, e.g. run_body -> a1run_body."""
    text = source if source is not None else (KERNEL_DIR / "megakernel.cu").read_text()
    return _renames_block(text, "DTMK_HOT_FIRST")


def hot_obs_renames(source: Optional[str] = None) -> dict:
    """-DDTMK_HOT_OBS's renames (measurement, session 61: the observer-SM build's hot functions
    placed after the workers'; kernels/megakernel.cu's `#ifdef DTMK_HOT_OBS` block), as above."""
    text = source if source is not None else (KERNEL_DIR / "megakernel.cu").read_text()
    return _renames_block(text, "DTMK_HOT_OBS")


def hot_tiny_renames(source: Optional[str] = None) -> dict:
    """-DDTMK_HOT_TINY's renames (measurement, session 66: the standard lowering's task functions
    placed after the workers' hot ones; kernels/megakernel.cu's `#ifdef DTMK_HOT_TINY` block)."""
    text = source if source is not None else (KERNEL_DIR / "megakernel.cu").read_text()
    return _renames_block(text, "DTMK_HOT_TINY")


def layout_renames(source: Optional[str] = None) -> dict:
    """Every layout rename of the kernel's functions: hot_first_renames, hot_obs_renames and
    hot_tiny_renames together (source_names and tools/ncu_footprint's alias map a build's names
    back through it)."""
    text = source if source is not None else (KERNEL_DIR / "megakernel.cu").read_text()
    return {**hot_first_renames(text), **hot_obs_renames(text), **hot_tiny_renames(text)}


def _renames_block(text: str, macro: str) -> dict:
    """{name: new name}: the `#define NAME NEWNAME` lines of the first `#ifdef MACRO` block, to its
    own #endif (a nested #if ... #endif inside it counted)."""
    lines = text[text.index(f"#ifdef {macro}\n"):].splitlines()
    out, depth = {}, 0
    for line in lines:
        word = (line.split() or [""])[0]
        depth += word in ("#if", "#ifdef", "#ifndef")
        depth -= word == "#endif"
        m = re.fullmatch(r"#define (\w+) (\w+)\s*(?:/\*.*\*/)?\s*", line)
        if m and depth == 1:
            out[m.group(1)] = m.group(2)
        if depth == 0:
            return out
    raise ValueError(f"#ifdef {macro}: no #endif")


def mangled(name: str) -> str:
    """The start of a plain function's mangled name (_Z8run_body...): what PTX, ptxas logs and
    SASS call it, before its parameters."""
    return f"_Z{len(name)}{name}"


def wait_copies(source: Optional[str] = None) -> tuple:
    """The hook build's two copies of the wait (copy 0, copy 1: kernels/megakernel.cu's
    WAIT_EVENT_COPY_0u / 1u), e.g. ("wait_event_off", "wait_event_obs")."""
    text = source if source is not None else (KERNEL_DIR / "megakernel.cu").read_text()
    copies = dict(re.findall(r"#define WAIT_EVENT_COPY_([01])u (\w+)", text))
    return copies["0"], copies["1"]


def ptx_function(ptx: str, name: str) -> Optional[str]:
    """The definition of the first PTX .func whose header line contains `name` (a mangled
    name or part of one), from `.func` to its closing brace; prototypes are skipped.  None
    when the PTX defines no such function.  For tests and reports that inspect generated code."""
    for m, brace in _ptx_definitions(ptx):
        if name in m.group(0):
            return ptx[m.start():ptx.index("\n}\n", brace) + 2]
    return None


def source_names(text: str, source: Optional[str] = None) -> str:
    """`text` (PTX, a ptxas log, SASS) with -DDTMK_HOT_FIRST's (and -DDTMK_HOT_OBS's, -DDTMK_HOT_TINY's) renamed functions under their
    source names again (_Z10a1run_body... -> _Z8run_body...), so that tests and reports read
    a build's code by the names the source gives it, whatever its layout.  a6wait_evt is
    wait_event, or the two-copy build's copy 0 (WAIT_EVENT_COPY_0u, wait_event_off) where the
    text has its copy 1 (WAIT_EVENT_COPY_1u)."""
    src = source if source is not None else (KERNEL_DIR / "megakernel.cu").read_text()
    renames, back = layout_renames(src), {}
    for old, new in renames.items():
        back.setdefault(new, old)
    copy0, copy1 = wait_copies(src)
    if mangled(copy1) in text:
        back[renames[copy0]] = copy0
    for new, old in back.items():
        text = text.replace(mangled(new), mangled(old))
    return text


def ptx_function_names(ptx: str) -> list:
    """The (mangled) names of the PTX's .func definitions, in the module's order."""
    return [re.search(r"func\s+(?:\(\.param [^)]*\)\s+)?(\w+)", m.group(0)).group(1)
            for m, _ in _ptx_definitions(ptx)]


def ptx_canonical(ptx: str, labels: bool = False) -> str:
    """`ptx` in a form two builds of the same code share: each register file's declared
    size (`.reg .f32 %f<325>;`) left out, and the virtual registers of each function renamed
    in the order they first appear (%f304 -> %f1, ...).  Virtual register names are NVRTC's
    choice and vary between processes: it once declared %f<327> for one of two builds whose
    every instruction was equal (CI, sessions 26 and 27), and once numbered one inline-asm
    load's operands %f304.. in one build and %f302.. in the other (CI, session 36).  The
    renaming is a bijection per function, so any difference in instructions, operands that
    are the same or different registers, labels or constants still shows.  labels: also
    rename branch labels ($L__BB12_3: NVRTC numbers them by the function's place in the
    module) in first-use order, to compare one function of two builds whose modules differ."""
    decl = re.compile(r"\.reg \.\w+ \t*%(\w+)<\d+>;")
    prefixes = sorted(set(decl.findall(ptx)), key=len, reverse=True)
    ptx = decl.sub(".reg", ptx)
    if not prefixes and not labels:
        return ptx
    forms = ([r"%(" + "|".join(prefixes) + r")\d+\b"] if prefixes else []) + ([r"\$L__BB\d+_\d+\b"] if labels else [])
    reg = re.compile("|".join(forms))
    names, counts = {}, {}                              # this function's renaming so far

    def rename(m):
        if m.group(0) not in names:
            kind = m.group(1) or "$L"                    # a register file's prefix, or a label
            counts[kind] = counts.get(kind, 0) + 1
            names[m.group(0)] = f"$L__BB_{counts[kind]}" if kind == "$L" else f"%{kind}{counts[kind]}"
        return names[m.group(0)]

    out = []
    for line in ptx.splitlines(keepends=True):
        if re.match(r"\s*(\.visible\s+|\.weak\s+|\.extern\s+)?\.(entry|func)\b", line):
            names.clear()                               # a new function: its own registers
            counts.clear()
        out.append(reg.sub(rename, line))
    return "".join(out)


def cache_dir():
    """Where compiled kernels are cached: $DTRACE_MK_CACHE, default ~/.cache/dtrace_mk/kernels."""
    import os
    from pathlib import Path
    d = Path(os.environ.get("DTRACE_MK_CACHE", Path.home() / ".cache" / "dtrace_mk" / "kernels"))
    d.mkdir(parents=True, exist_ok=True)
    return d


def include_closure(name: str, kdir=None) -> list:
    """kernels/<name> and every kernels/ file it #includes "..." (transitively), sorted:
    what a compiled kernel's cache key must hash (a hand-kept list goes stale)."""
    import re
    kdir = KERNEL_DIR if kdir is None else kdir
    seen, todo = set(), [name]
    while todo:
        f = todo.pop()
        if f in seen or not (kdir / f).exists():
            continue
        seen.add(f)
        todo += re.findall(r'#\s*include\s+"([^"]+)"', (kdir / f).read_text())
    return sorted(seen)
