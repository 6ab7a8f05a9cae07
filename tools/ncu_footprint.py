"""How many KB of SASS a kernel run executed -- its instruction footprint -- from an Nsight
Compute source export (no GPU).

    ncu --section SourceCounters -o rep <program>            (on the GPU; plan 63)
    ncu -i rep.ncu-rep --page source --csv --print-source sass > src.csv
    python tools/ncu_footprint.py src.csv [--min 1,1000,10000] [--diff A:B]

Session 30 measured the instruction caches (tools/icache_probe.py): an SM's ICC holds
~32 KB, shared by the two SMs of a TPC; a GPC's L1.5 (GCC) ~128-160 KB, shared by its ~16
SMs.  The code a GPC's SMs execute in a step must fit the GCC, or they all fetch from L2:
the workers' per-step code plus an observer SM's (or an inlined monitor's) is the budget
that decides what a hook costs (docs/dev/hook_cost_analysis.md "Session 30").  This prints,
per kernel launch in the export (in order, numbered from 0), the KB of instructions
executed at least N times for each --min N, and with --diff A:B the KB executed in launch B
and never in launch A (the same build: what a monitor adds), largest first by address run.

    DTRACE_MK_LINEINFO=1 ncu ... ; python tools/ncu_footprint.py src.csv --build 0=1b:DTMK_NO_HOOKS+DTMK_SM_WORKER \
        --build 1,2=1b:DTMK_OBS_SM+...+DTMK_SM_WORKER        (on the GPU machine)

--build LAUNCHES=PRESET:DEFS names the build those launches ran: the tool compiles it again
(the kernel cache's cubin, $DTRACE_MK_LINEINFO=1 as in the profiled run: the same SASS with
a line table), disassembles it with nvdisasm -g (tools/sass_size.py) and prints the executed
KB per source function (inlined copies summed), and with --diff per function too -- and,
when both launches ran that build, the new 128-byte lines per SASS function (kernel or
__noinline__ subroutine: where the added code lies in the instruction caches); --lines
FN,FN adds their instructions per source line.  It needs the profiled machine's NVRTC
(another NVRTC emits other SASS: the instruction counts differ, and the tool says so): on
the GPU machine, or here with that NVRTC version loaded (docs/dev/hook_cost_analysis.md
"Session 30", Method).

--match NAME=PRESET:DEFS (repeated) names each launch by its build's instruction count (one
launch per build variant: plans 153, 157, 158) and prints its lines per SASS function; --raw CSV
adds that launch's instruction-cache metrics from the same run's `ncu --page raw --csv`, and
--stall REASON (e.g. stall_no_inst) that stall reason's warp samples per SASS function.  Each
matched launch also gets the GCC model's count (GCC_SETS x GCC_WAYS: its hot lines beyond their
set's ways), and --predict K=PRESET:DEFS lays launch K's hot code out as another build places its
functions (session 58: the off cost as the GCC's conflict misses, and a layout that removes them)."""
from __future__ import annotations

import argparse
import collections
import csv
import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SASS_BYTES = 16                         # (sm_90: one instruction = 16 bytes)
LINE_BYTES = 128                        # an instruction cache line (the unit fetched; assumed, as L1's)
EXEC = "Instructions Executed"


def load(path, column: str = EXEC) -> list:
    """[launch: [instructions executed per address, in address order]] of an ncu source CSV
    (each launch opens with a "Kernel Name" row, then its header row); column: another per-address
    counter instead (a stall reason's samples, e.g. "stall_no_inst")."""
    launches, cur, col = [], None, None
    with open(path, newline="") as f:
        for row in csv.reader(f):
            if not row:
                continue
            if row[0] == "Kernel Name":
                cur, col = [], None
                launches.append(cur)
                continue
            if cur is None:
                raise ValueError(f"{path}: not an ncu source export (no 'Kernel Name' row first)")
            if col is None:
                if column not in row:
                    raise ValueError(f"{path}: no '{column}' column (export with --section SourceCounters)")
                col = row.index(column)
                continue
            cur.append(int(float(row[col].replace(",", "") or 0)))
    if not launches:
        raise ValueError(f"{path}: no kernel in the export")
    return launches


def footprint_kb(counts, min_exec: int = 1) -> float:
    """KB of the instructions executed at least min_exec times (warp-level counts)."""
    return sum(1 for c in counts if c >= min_exec) * SASS_BYTES / 1024


def lines_kb(counts, min_exec: int = 1, line_bytes: int = LINE_BYTES, only=None) -> float:
    """KB of the cache lines (line_bytes, from the kernel's first instruction: a cubin's code
    starts line-aligned) that hold an instruction executed at least min_exec times: what the
    instruction caches hold, executed or not (session 31: ~20% more than the instructions
    alone); only: a set of instruction indexes to count."""
    return len(hot_lines(counts, min_exec, line_bytes, only)) * line_bytes / 1024


def hot_lines(counts, min_exec: int = 1, line_bytes: int = LINE_BYTES, only=None) -> set:
    """The lines (indices) with an instruction executed >= min_exec times (only: as in lines_kb)."""
    per = line_bytes // SASS_BYTES
    idx = range(len(counts)) if only is None else only
    return {i // per for i in idx if counts[i] >= min_exec}


def new_lines(a, b, min_exec: int = 1, line_bytes: int = LINE_BYTES) -> set:
    """The lines (index of each line_bytes line) launch b executed an instruction of (>= min_exec
    times) and launch a executed none of: the lines b brought into the caches."""
    if len(a) != len(b):
        raise ValueError(f"--diff: the launches are of different builds ({len(a)} vs {len(b)} instructions)")
    per = line_bytes // SASS_BYTES
    old = {i // per for i, x in enumerate(a) if x}
    return {i // per for i, x in enumerate(b) if x >= min_exec} - old


def new_lines_kb(a, b, min_exec: int = 1, line_bytes: int = LINE_BYTES) -> float:
    """KB of new_lines."""
    return len(new_lines(a, b, min_exec, line_bytes)) * line_bytes / 1024


def added(a, b, min_exec: int = 1) -> list:
    """The instructions launch b executed (>= min_exec times) and launch a never did, as runs
    of consecutive addresses: [(first index, length, executions)], the longest first.  Both
    launches must be of one build (same instruction list)."""
    if len(a) != len(b):
        raise ValueError(f"--diff: the launches are of different builds ({len(a)} vs {len(b)} instructions)")
    runs, start = [], None
    for i, (x, y) in enumerate(zip(a, b)):
        on = y >= min_exec and x == 0
        if on and start is None:
            start = i
        if not on and start is not None:
            runs.append((start, i - start, sum(b[start:i])))
            start = None
    if start is not None:
        runs.append((start, len(b) - start, sum(b[start:])))
    return sorted(runs, key=lambda r: (-r[1], r[0]))


def per_function(counts, funcs, min_exec: int = 1, only=None) -> collections.Counter:
    """KB executed (>= min_exec times) per (file, function); funcs: one (file, function) per
    instruction (tools/sass_size.py instruction_functions); only: a set of instruction
    indexes to count (e.g. those added() found)."""
    if len(funcs) != len(counts):
        raise ValueError(f"the build has {len(funcs)} instructions, the launch {len(counts)}: not the profiled "
                         f"build (other defines, or another NVRTC than the profiled machine's)")
    kb = collections.Counter()
    for i, (c, f) in enumerate(zip(counts, funcs)):
        if c >= min_exec and (only is None or i in only):
            kb[f] += SASS_BYTES / 1024
    return kb


def new_lines_per_symbol(a, b, symbols, min_exec: int = 1, line_bytes: int = LINE_BYTES) -> collections.Counter:
    """KB of the lines launch b executed an instruction of (>= min_exec times) and launch a
    executed none of, per SASS function (symbols: one per instruction, tools/sass_size.py
    instruction_symbols; a line is its first instruction's).  Where the added code lies: a
    subroutine's executed instructions sit among its cold ones (session 34, the observers'
    summary path: ~1.2 KB of lines per KB executed, hook_flush 4.6 KB on 5.4 KB)."""
    if not (len(a) == len(b) == len(symbols)):
        raise ValueError(f"launches of {len(a)} / {len(b)} instructions, a build of {len(symbols)}: not the "
                         f"profiled build")
    out = collections.Counter()
    for ln in new_lines(a, b, min_exec, line_bytes):
        out[symbols[ln * (line_bytes // SASS_BYTES)]] += line_bytes / 1024
    return out


def build_lines(spec: str) -> list:
    """(file, function, line, SASS function) per instruction of the megakernel build
    "PRESET:DEF+DEF" (NVRTC, the kernel cache, nvdisasm: the GPU machine's tools, or here with
    the GPU machine's NVRTC version loaded: docs/dev/hook_cost_analysis.md "Session 30", Method)."""
    preset, _, defs = spec.partition(":")
    os.environ["DTRACE_MK_LINEINFO"] = "1"
    sys.path.insert(0, str(ROOT))
    from dtrace_mk.megakernel import gpu
    from dtrace_mk.megakernel.presets import PRESETS
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r} (known: {', '.join(PRESETS)})")
    sys.path.insert(0, str(ROOT / "tools"))
    import sass_size as ss
    cubin = gpu.compile_source("sm_90a", "cubin", defines=gpu.megakernel_defines(
        PRESETS[preset], 1, tuple(d for d in defs.split("+") if d)))
    sass, sources = ss.disassemble(cubin, ss.find_nvdisasm())
    return [x + (sym,) for x, sym in zip(ss.instruction_lines(sass, sources), ss.instruction_symbols(sass))]


def parse_match(spec: str, what: str = "--match") -> tuple:
    """"NAME=PRESET:DEF+DEF" -> (NAME, "PRESET:DEF+DEF")."""
    name, sep, build = spec.partition("=")
    if not sep or ":" not in build:
        raise ValueError(f"{what} {spec!r}: expected NAME=PRESET:DEF+DEF")
    return name, build


def build_symbols(spec: str) -> list:
    """The SASS function of each instruction of build "PRESET:DEF+DEF" (build_lines' last field)."""
    return [x[3] for x in build_lines(spec)]


def parse_builds(specs) -> dict:
    """["0=1b:DEFS", "1,2=1b:DEFS"] -> {launch: "1b:DEFS"}."""
    out = {}
    for spec in specs:
        launches, sep, build = spec.partition("=")
        if not sep or ":" not in build:
            raise ValueError(f"--build {spec!r}: expected LAUNCHES=PRESET:DEF+DEF (e.g. 0=1b:DTMK_NO_HOOKS)")
        for k in launches.split(","):
            out[int(k)] = build
    return out


def per_line(counts, lines, functions, min_exec: int = 1, only=None) -> collections.Counter:
    """Instructions executed (>= min_exec times) per (function, file, line) of the named
    functions; lines: one (file, function, line) per instruction; only: as in per_function."""
    out = collections.Counter()
    for i, (c, (f, fn, ln, *_)) in enumerate(zip(counts, lines)):
        if fn in functions and c >= min_exec and (only is None or i in only):
            out[(fn, f, ln)] += 1
    return out


def print_lines(title: str, cnt: collections.Counter) -> None:
    print(f"--- {title}: instructions per source line")
    for (fn, f, ln), n in sorted(cnt.items()):
        print(f"  {fn:<28}{f}:{ln:<6}{n:>5}  ({n * SASS_BYTES} B)")


def print_functions(title: str, kb: collections.Counter, top: int = 25) -> None:
    print(f"--- {title}: {sum(kb.values()):.1f} KB; the top {top} functions")
    for (f, fn), v in kb.most_common(top):
        print(f"  {f:<20}{fn:<32}{v:>7.1f} KB")


def match_builds(launches, sizes: dict) -> list:
    """The build name of each launch, told apart by instruction count (sizes: name -> count;
    None where no build has the launch's count).  Two builds of one count cannot be told apart."""
    by_size = {}
    for name, n in sizes.items():
        if n in by_size:
            raise ValueError(f"--match: {by_size[n]} and {name} both have {n} instructions (not told apart)")
        by_size[n] = name
    return [by_size.get(len(c)) for c in launches]


#: the instruction caches' metrics plans 153, 157, 158 collect (ncu --metrics), as printed by --raw
RAW_METRICS = (("gpu__time_duration.sum", "time"), ("sm__icc_requests_lookup_miss.sum", "ICC miss"),
               ("gcc__cache_requests_type_instruction.sum", "GCC instr req"),
               ("gcc__cache_requests_type_instruction_lookup_miss.sum", "GCC instr miss"),
               ("gcc__gcc2xbar_requests_type_instruction.sum", "GCC->L2 instr"))


def load_raw(path) -> list:
    """[(launch ID, {metric: value})] of an `ncu --page raw --csv` export (a header row, a units
    row, then one row per launch), only RAW_METRICS."""
    with open(path, newline="") as f:
        rows = [r for r in csv.reader(f) if r]
    if len(rows) < 2 or "ID" not in rows[0]:
        raise ValueError(f"{path}: not an ncu raw export (no 'ID' column)")
    hdr = rows[0]
    cols = {m: hdr.index(m) for m, _ in RAW_METRICS if m in hdr}
    if not cols:
        raise ValueError(f"{path}: none of {', '.join(m for m, _ in RAW_METRICS)}")
    at_id = hdr.index("ID")
    return [(int(r[at_id]), {m: float(r[i].replace(",", "")) for m, i in cols.items()}) for r in rows[2:]]


#: the GPC cache (GCC, L1.5) as a set-associative cache of 128-byte lines: 64 sets x 16 ways (128 KB,
#: session 30's size).  Session 58 fitted it to plan 157: the hot lines (executed >= 1000 times) that
#: overflow their set -- no hooks 1, offxw 3, offcopyw 26, off 20 -- group the builds as their GCC -> L2
#: instruction fetches do (181 K, 182 K, 217 K, 225 K) and as their off cost does (~0, ~0, +1.5..1.8,
#: +1.6..1.8%); 128 x 8 (26, 12, 47, 41) does not.  A cyclic shift of the addresses (where the module
#: loads) changes nothing, so the overflow is a property of the cubin's layout.
GCC_SETS, GCC_WAYS = 64, 16


def set_overflow(lines, sets: int = GCC_SETS, ways: int = GCC_WAYS) -> int:
    """How many of `lines` (128-byte line indices) find their set full: sum over sets of the lines
    beyond `ways` -- the hot code's conflict misses in a cache of that shape, per pass over it."""
    per = collections.Counter(line % sets for line in lines)
    return sum(max(0, n - ways) for n in per.values())


def hot_runs(counts, symbols, min_exec: int = 1) -> dict:
    """A launch's hot code per SASS function, position-free: {function: {"size": its instructions,
    "runs": [[first, count], ...]}} (offsets from the function's first instruction, instructions
    executed >= min_exec times) -- what tools/gcc_layout.py saves and lays out again."""
    if len(counts) != len(symbols):
        raise ValueError(f"the launch has {len(counts)} instructions, the build {len(symbols)}")
    first, out = {}, {}
    for i, sym in enumerate(symbols):
        first.setdefault(sym, i)
        f = out.setdefault(sym, {"size": 0, "runs": []})
        f["size"] += 1
        if counts[i] >= min_exec:
            off, runs = i - first[sym], f["runs"]
            if runs and runs[-1][0] + runs[-1][1] == off:
                runs[-1][1] += 1
            else:
                runs.append([off, 1])
    return {k: v for k, v in out.items() if v["runs"]}


def lay_out(runs: dict, new_symbols, alias=None) -> tuple:
    """The lines (indices) the hot code `runs` (hot_runs) takes in a build whose functions lie as
    `new_symbols` say, each hot instruction at its offset in its function (alias: new name -> old
    name, e.g. -DDTMK_HOT_FIRST's renames; a template's instance keeps its arguments).  Returns
    (lines, the functions not in that build, those whose size changed: offsets there approximate)."""
    alias = alias or {}
    first, size = {}, collections.Counter()
    for i, sym in enumerate(new_symbols):
        old = canonical(sym, alias)
        first.setdefault(old, i)
        size[old] += 1
    lines, gone, resized = set(), set(), set()
    for sym, f in runs.items():
        if sym not in first:
            gone.add(sym)
            continue
        if size[sym] != f["size"]:
            resized.add(sym)
        for off, n in f["runs"]:
            lines.update(range((first[sym] + off) * SASS_BYTES // LINE_BYTES,
                               (first[sym] + off + n - 1) * SASS_BYTES // LINE_BYTES + 1))
    return lines, gone, resized


def relayout(counts, symbols, new_symbols, min_exec: int = 1, alias=None) -> tuple:
    """lay_out of launch `counts` (of the build with `symbols`): its hot lines in another layout (alias
    applies to both builds' names: a hot-first launch lays out in a build without the renames too)."""
    return lay_out(hot_runs(counts, canonical_symbols(symbols, alias or {}), min_exec), new_symbols, alias)


def hot_first_alias(source=None) -> dict:
    """-DDTMK_HOT_FIRST's (and -DDTMK_HOT_OBS's) renames (kernels/megakernel.cu, the one list): {new name: old name}, the
    first old name of a new one (a6wait_evt is wait_event, also where it is -DDTMK_OFF_COPY's copy 0,
    wait_event_off, itself mapped to wait_event: the wait a task runs while nothing observes; its name
    is the kernel's WAIT_EVENT_COPY_0u)."""
    sys.path.insert(0, str(ROOT))
    from dtrace_mk.kernels.build import layout_renames, wait_copies
    text = (source or (ROOT / "kernels" / "megakernel.cu").read_text())
    out = {}
    for old, new in layout_renames(text).items():
        out.setdefault(new, old)
    out.setdefault(wait_copies(text)[0], "wait_event")
    return out


def canonical(sym: str, alias: dict) -> str:
    """A SASS function's name before any rename of `alias` (a template's instance keeps its arguments)."""
    base, lt, rest = sym.partition("<")
    return alias.get(base, base) + lt + rest


def canonical_symbols(symbols, alias: dict) -> list:
    """canonical of each instruction's SASS function (build_symbols' list)."""
    return [canonical(s, alias) for s in symbols]


#: all warp-state samples of an address (the denominator of --stall)
ALL_SAMPLES = "Warp Stall Sampling (All Samples)"


def samples_per_symbol(samples, symbols) -> collections.Counter:
    """A per-address counter (one launch's samples of a stall reason) summed per SASS function."""
    if len(samples) != len(symbols):
        raise ValueError(f"the launch has {len(samples)} instructions, the build {len(symbols)}")
    out = collections.Counter()
    for n, sym in zip(samples, symbols):
        out[sym] += n
    return out


def print_matched(launches, specs, min_exec: int, raw=None, stall=None) -> tuple:
    """--match: per launch its build, KB of lines executed >= min_exec times in all and in the
    largest SASS functions, (raw) the instruction caches' metrics of that launch, and (stall:
    (reason, [launch: samples per address], [launch: all samples per address])) that stall
    reason's warp samples per SASS function -- where a launch waited for instructions (plan 157:
    the hook build's extra stall_no_inst samples sat in run_body, not in the wait).  Returns
    (each launch's build name or None, {name: its SASS function per instruction})."""
    syms = {}
    for spec in specs:
        name, build = parse_match(spec)
        syms[name] = build_symbols(build)
    names = match_builds(launches, {k: len(v) for k, v in syms.items()})
    metrics = dict(raw or [])
    for k, (c, name) in enumerate(zip(launches, names)):
        m = metrics.get(k, {})
        extra = "  ".join(f"{label} {m[key]:,.3f} ms" if key.startswith("gpu__time") else f"{label} {m[key]:,.0f}"
                          for key, label in RAW_METRICS if key in m)
        print(f"--- launch {k}: {name or '(no --match build)'}, {sum(c) / 1e6:.1f} M instructions executed, "
              f"{lines_kb(c, min_exec):.2f} KB of lines >= {min_exec}  {extra}")
        if name:                            # (new over a launch that ran nothing: all its lines)
            by = new_lines_per_symbol([0] * len(c), c, syms[name], min_exec)
            print("    " + ", ".join(f"{s_}={v:.2f}" for s_, v in by.most_common(8)))
            hot = hot_lines(c, min_exec)
            print(f"    GCC model {GCC_SETS} x {GCC_WAYS}: {len(hot)} hot lines, {set_overflow(hot)} beyond their "
                  f"set's ways")
            if stall:
                reason, per, alls = stall
                st = samples_per_symbol(per[k], syms[name])
                tot, every = sum(per[k]), sum(alls[k])
                print(f"    {reason}: {tot:,} of {every:,} samples ({100 * tot / max(every, 1):.1f}%): "
                      + ", ".join(f"{s_}={v:,}" for s_, v in st.most_common(8)))
    return names, syms


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("csv")
    ap.add_argument("--min", default="1,1000,10000", help="thresholds N: KB executed at least N times")
    ap.add_argument("--diff", metavar="A:B", help="the KB launch B executed and launch A never did")
    ap.add_argument("--build", action="append", default=[], metavar="LAUNCHES=PRESET:DEFS",
                    help="the build those launches ran: per-function KB (GPU machine: NVRTC, nvdisasm)")
    ap.add_argument("--lines", metavar="FN,FN", help="with --build: also instructions per source line of these "
                                                     "functions (with --diff: of what launch B added)")
    ap.add_argument("--match", action="append", default=[], metavar="NAME=PRESET:DEFS",
                    help="builds told apart by instruction count: each launch is named by its build and its "
                         "lines per SASS function printed (plans 153, 157, 158: one launch per build variant)")
    ap.add_argument("--raw", metavar="CSV", help="the same run's `ncu --page raw --csv` export: the instruction "
                                                "caches' metrics per launch beside its lines")
    ap.add_argument("--predict", action="append", default=[], metavar="K=PRESET:DEFS",
                    help="with --match: launch K's hot code laid out as that build lays out its functions "
                         "(-DDTMK_HOT_FIRST's renames followed): its lines beyond the GCC model's ways")
    ap.add_argument("--stall", metavar="REASON", help="with --match: this stall reason's warp samples (a column "
                                                      "of the export, e.g. stall_no_inst) per SASS function")
    a = ap.parse_args(argv)
    try:
        mins = [int(x) for x in a.min.split(",") if x] or [1]
        launches = load(a.csv)
        builds = parse_builds(a.build)
    except (OSError, ValueError) as e:
        ap.error(str(e))
    if any(k >= len(launches) for k in builds):
        ap.error(f"--build: the export has launches 0..{len(launches) - 1}")
    if a.lines and not builds:
        ap.error("--lines needs --build (the source lines come from the build)")
    print(f"{'launch':<8}{'instructions':>13}" + "".join(f"{'>=' + str(m):>12}" for m in mins) + "   (KB executed)")
    for k, c in enumerate(launches):
        print(f"{k:<8}{len(c):>13}" + "".join(f"{footprint_kb(c, m):>12.1f}" for m in mins))
    print(f"{'':<21}" + "".join(f"{'>=' + str(m):>12}" for m in mins) + f"   (KB of {LINE_BYTES}-byte lines)")
    for k, c in enumerate(launches):
        print(f"{k:<21}" + "".join(f"{lines_kb(c, m):>12.1f}" for m in mins))
    if a.stall and not a.match:
        ap.error("--stall needs --match (the functions come from the builds)")
    if a.match:
        try:
            stall = (a.stall, load(a.csv, a.stall), load(a.csv, ALL_SAMPLES)) if a.stall else None
            names, syms = print_matched(launches, a.match, mins[0], load_raw(a.raw) if a.raw else None, stall)
        except (OSError, ValueError) as e:
            ap.error(str(e))
    if a.predict and not a.match:
        ap.error("--predict needs --match (launch K's build)")
    for spec in a.predict:
        try:
            k, build = parse_match(spec, "--predict")
        except ValueError as e:
            ap.error(str(e))
        if not k.isdigit() or int(k) >= len(launches) or not names[int(k)]:
            ap.error(f"--predict {spec!r}: K must be a launch --match named (0..{len(launches) - 1})")
        k = int(k)
        try:
            new = build_symbols(build)
        except ValueError as e:
            ap.error(f"--predict {build}: {e}")
        got, gone, resized = relayout(launches[k], syms[names[k]], new, mins[0], hot_first_alias())
        print(f"--- launch {k} ({names[k]}) laid out as {build}: {len(got)} hot lines, {set_overflow(got)} beyond their "
              f"set's ways (GCC model {GCC_SETS} x {GCC_WAYS}; was {set_overflow(hot_lines(launches[k], mins[0]))})"
              + (f"; not in that build: {', '.join(sorted(gone))}" if gone else "")
              + (f"; resized (offsets approximate): {', '.join(sorted(resized))}" if resized else ""))
    lines, funcs = {}, {}
    for b in sorted(set(builds.values())):
        try:
            lines[b] = build_lines(b)
        except ValueError as e:
            ap.error(f"--build {b}: {e}")
        funcs[b] = [(f, fn) for f, fn, *_ in lines[b]]
    want = {x for x in (a.lines or "").split(",") if x}
    for k, b in sorted(builds.items()):
        try:
            print_functions(f"launch {k} ({b}), executed >= {mins[0]} times", per_function(launches[k], funcs[b], mins[0]))
        except ValueError as e:
            ap.error(f"--build {b}, launch {k}: {e}")
    if a.diff:
        try:
            i, j = (int(x) for x in a.diff.split(":"))
            if not (0 <= i < len(launches) and 0 <= j < len(launches)):
                raise IndexError(f"the export has launches 0..{len(launches) - 1}")
            runs = added(launches[i], launches[j], mins[0])
        except (ValueError, IndexError) as e:
            ap.error(f"--diff {a.diff}: {e}")
        kb = sum(r[1] for r in runs) * SASS_BYTES / 1024
        print(f"--- launch {j} executed {kb:.1f} KB that launch {i} never did, in {len(runs)} runs "
              f"({new_lines_kb(launches[i], launches[j], mins[0]):.1f} KB of {LINE_BYTES}-byte lines launch {i} "
              f"executed nothing of); the longest:")
        for s, n, e in runs[:15]:
            print(f"  instructions {s}..{s + n - 1}: {n * SASS_BYTES / 1024:.2f} KB, executed {e}")
        if j in builds:
            idx = {x for s, n, _ in runs for x in range(s, s + n)}
            print_functions(f"what launch {j} added, per function", per_function(launches[j], funcs[builds[j]], mins[0], idx))
            if i in builds and builds[i] == builds[j]:
                syms = [x[3] for x in lines[builds[j]]]
                by_sym = new_lines_per_symbol(launches[i], launches[j], syms, mins[0])
                print(f"--- what launch {j} added, KB of new {LINE_BYTES}-byte lines per SASS function "
                      f"(a __noinline__ body: its hot and cold code interleaved): {sum(by_sym.values()):.1f} KB")
                for sym, v in by_sym.most_common(25):
                    print(f"  {sym:<52}{v:>7.2f} KB")
            if want:
                print_lines(f"what launch {j} added, {', '.join(sorted(want))}",
                            per_line(launches[j], lines[builds[j]], want, mins[0], idx))
    elif want:
        for k, b in sorted(builds.items()):
            print_lines(f"launch {k}, {', '.join(sorted(want))}", per_line(launches[k], lines[b], want, mins[0]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
