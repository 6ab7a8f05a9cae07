"""What every GPU bench writes first: a log that prints and keeps each line, and the card
line (card, SMs, date, commit) that every recorded figure carries (docs/results)."""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Callable


def logger(outdir: Path, name: str, mode: str = "w") -> Callable[[str], None]:
    """log(line): print it and append it to outdir/name (created)."""
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    f = open(outdir / name, mode)

    def log(line: str) -> None:
        print(line, flush=True)
        f.write(line + "\n")
        f.flush()
    return log


def card(cp) -> dict:
    """{"card", "sms", "date", "commit"} of the current CUDA device; commit from
    $DTMK_COMMIT (the GPU runner exports it: the device gets a tree, not a repository)."""
    dev = cp.cuda.Device()
    props = cp.cuda.runtime.getDeviceProperties(dev.id)
    name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    return {"card": name, "sms": dev.attributes["MultiProcessorCount"],
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "commit": os.environ.get("DTMK_COMMIT", "unknown")}


def each_preset(names, fn, log) -> list:
    """[fn(name) for each preset name], a failing preset logged with its traceback and
    left out: one preset's failure keeps the others' figures."""
    import traceback
    out = []
    for name in names:
        try:
            out.append(fn(name))
        except Exception as e:  # noqa: BLE001 - keep the other presets' numbers
            log(f"{name}: FAILED {e!r}\n{traceback.format_exc()}")
    return out


def run_presets(out, name: str, presets: str, fn) -> dict:
    """The common main of a GPU bench: {card..., "presets": [fn(p, log) per preset]},
    written to out/<name>.json, logged to out/<name>.log."""
    import json
    import cupy as cp
    log = logger(Path(out), f"{name}.log")
    res = {**card(cp), "presets": each_preset(presets.split(","), lambda p: fn(p, log), log)}
    (Path(out) / f"{name}.json").write_text(json.dumps(res, indent=1, default=str))
    return res


def kernels_on(m, codes: dict) -> dict:
    """{code: kernel function} of megakernel.cu built with each code's defines (the
    model's own added), to run on Megakernel m's memory by setting m.kernel: every code
    must lay out dynamic shared memory as m does (they share its params).  A name ending
    in "'" loads a second module of the same cubin (its own code addresses)."""
    from dtrace_mk.megakernel import gpu
    import cupy as cp
    out = {}
    for c, d in codes.items():
        defs = gpu.megakernel_defines(m.cfg, 1, d)
        if gpu.smem_layout(m.lcfg, m.B, 1, defs) != (m.xs_off, m.xs_cap, m.smem):
            raise RuntimeError(f"{c}: another dynamic shared-memory layout; not runnable on this Megakernel")
        if c.endswith("'"):
            path = gpu.cache_dir() / f"{gpu.source_hash(m.arch, 'cubin', defs)}_paired_copy.cubin"
            path.write_bytes(gpu.compile_source(m.arch, "cubin", defs))
            fn = cp.RawModule(path=str(path)).get_function("dtmk_megakernel")
        else:
            fn = gpu.load_module(m.arch, "megakernel.cu", defs).get_function("dtmk_megakernel")
        gpu.set_smem(fn, m.smem)
        out[c] = fn
    return out


def shadow_sink(mk, launch_once=None) -> dict:
    """-DDTMK_OSQ_WSHADOW's dtmk_wsh_sink in Megakernel mk (megakernel.cu: WSH_CLS x WSH_B log2
    bins, WSH_CLS wait sums, the depth max, then the counts of task:end, dep:release,
    task:ready): its bins' total and the three counts.  launch_once: zero the sink and run it
    first (else the sink as it stands, e.g. after a build's first launch)."""
    import re
    import cupy as cp
    from dtrace_mk.kernels import KERNEL_DIR
    src = (KERNEL_DIR / "megakernel.cu").read_text()
    cls, b = (int(re.search(rf"#define {k} (\d+)", src).group(1)) for k in ("WSH_CLS", "WSH_B"))
    sink = cp.ndarray((cls * b + cls + 4,), cp.uint64, mk.module.get_global("dtmk_wsh_sink"))
    if launch_once is not None:
        sink[:] = 0
        launch_once()
    h = sink.get()
    return {"hist": int(h[:cls * b].sum()), "n": [int(x) for x in h[-3:]]}


def rounds(pairs, reps: int) -> list:
    """The run order: a warm-up round, then `reps` rounds, every other one reversed (no
    pair always follows the same one)."""
    return [list(pairs) if r % 2 == 0 else list(pairs)[::-1] for r in range(reps + 1)]


def timed_rounds(pairs, reps: int, steps: int, launch):
    """Run launch(pair) -> RunResult for every pair in each of rounds(pairs, reps); returns
    ({pair: us/step of each timed round}, {pair: its last RunResult})."""
    times = {p: [] for p in pairs}
    last = {}
    for r, order in enumerate(rounds(pairs, reps)):
        for p in order:
            res = launch(p)
            last[p] = res
            if r:                      # round 0: the warm-up
                times[p].append(res.elapsed_ms * 1e3 / steps)
    return times, last


def record_placements(m, steps: int, n: int) -> list:
    """[(us/step, placement)] of n block-order launches of Megakernel m (a -DDTMK_SM_WORKER
    build), after one warm-up launch; launches whose workers did not each get their own SM
    are left out.  m runs in block order afterwards (no map)."""
    m.record_placement()
    found = []
    for k in range(n + 1):
        m.reset()
        res = m.finish(m.start(steps, poison=False))
        pl = m.placement()
        if k and min(pl) >= 0 and len(set(pl)) == len(pl):
            found.append((res.elapsed_ms * 1e3 / steps, pl))
    m.place_workers([])
    return found


def launch_ratios(times: dict, num: str, den: str) -> dict:
    """num over den launch by launch: the i-th launch of each (taken in the same round of an
    interleaved run) paired, so one slow launch shows as one outlier instead of moving a
    median of two.  {"median", "lo", "hi", "n", "ratios"} as fractions (0.05 = +5%); {} when
    either has no launch.  den may hold more launches than num (bench/hooks.py times off
    again later): the first len(num) are paired."""
    a, b = times.get(num) or [], times.get(den) or []
    n = min(len(a), len(b))
    if not n:
        return {}
    r = [a[i] / b[i] - 1.0 for i in range(n)]
    import statistics as st
    return {"median": st.median(r), "lo": min(r), "hi": max(r), "n": n, "ratios": r}


SMI_FIELDS = "timestamp,clocks.sm,clocks.mem,power.draw,clocks_event_reasons.active"


def sample_clocks(keys, launch, seconds: float, log=print) -> dict:
    """{key: {"sm_mhz", "sm_mhz_min", "mem_mhz", "power_w", "reasons", "samples"}}: each
    key's launch(key) repeated for `seconds` while `nvidia-smi -lms 50` samples the card;
    a sample belongs to the key whose run window holds its own timestamp (so output
    buffering cannot misattribute it).  A busy SM path that draws more power can lower the
    clock every worker runs at: same-run medians per key show it.  {} if nvidia-smi is
    missing or refuses the query (logged)."""
    import datetime
    import shutil
    import subprocess
    import threading
    if shutil.which("nvidia-smi") is None:
        log("sample_clocks: no nvidia-smi")
        return {}
    for fields in (SMI_FIELDS, SMI_FIELDS.rsplit(",", 1)[0]):   # (older drivers: no event reasons)
        p = subprocess.Popen(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader,nounits",
                              "-lms", "50"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        first = p.stdout.readline()
        if first.count(",") == fields.count(","):
            break
        log(f"sample_clocks: nvidia-smi --query-gpu={fields}: {first.strip()!r}")
        p.kill()
        p.wait()
    else:
        return {}
    lines: list = [first]
    reader = threading.Thread(target=lambda: lines.extend(iter(p.stdout.readline, "")), daemon=True)
    reader.start()
    windows = {}
    try:
        for k in keys:
            launch(k)                                   # (out of the window: a first launch's ramp)
            t0 = time.time()
            while time.time() - t0 < seconds:
                launch(k)
            windows[k] = (t0, time.time())
    finally:
        p.terminate()
        p.wait()
        reader.join(timeout=5)
    got = {k: [] for k in keys}
    for ln in lines:
        f = [x.strip() for x in ln.split(",")]
        try:
            ts = datetime.datetime.strptime(f[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
            sm, mem, pw = float(f[1]), float(f[2]), float(f[3])
        except (ValueError, IndexError):
            continue                                    # (a header or an error line)
        for k, (a, b) in windows.items():
            if a <= ts <= b:
                got[k].append((sm, mem, pw, f[4] if len(f) > 4 else ""))
    if not any(got.values()):
        log(f"sample_clocks: no sample matched a window; nvidia-smi said: {lines[:3]}")
        return {}
    import statistics as st
    out = {}
    for k, s in got.items():
        if s:
            out[k] = {"sm_mhz": st.median(x[0] for x in s), "sm_mhz_min": min(x[0] for x in s),
                      "mem_mhz": st.median(x[1] for x in s), "power_w": st.median(x[2] for x in s),
                      "reasons": sorted({x[3] for x in s}), "samples": len(s)}
    return out


def pin_defines(idle_smids=()) -> tuple:
    """The defines of a build whose workers are placed (-DDTMK_SM_WORKER) and, with idle SMs,
    whose last grid SMs run nothing (-DDTMK_SM_IDLE)."""
    return ("DTMK_SM_WORKER",) + (("DTMK_SM_IDLE",) if idle_smids else ())


def place_by_smid(m, obs_smids=(), idle_smids=(), worker_order: str = "id", observers: bool = True) -> list:
    """Place Megakernel m's workers (a pin_defines build): worker k on the k-th SM in id order
    (worker_order "id") or in the block order an unplaced launch gives (probed, "natural");
    obs_smids, then idle_smids, moved to the end, where the grid's observer and idle CTAs
    run.  observers=False (a build without observer SMs): obs_smids are moved only when
    idle_smids are given (such a build then idles them too, so it plans the same workers).
    Returns the order in force; SystemExit naming the ids when they are not the grid's."""
    from dtrace_mk.megakernel import gpu
    ids = gpu.probe_smids(m.grid, m.smem)
    base = sorted(ids) if worker_order == "id" else list(ids)
    if obs_smids and (observers or idle_smids):
        last = list(obs_smids) + list(idle_smids)
        if len(set(last)) != len(last) or not set(last) <= set(ids):
            raise SystemExit(f"--observer-smids / --idle-smids: want distinct SMs of the grid's "
                             f"{min(ids)}..{max(ids)}, got {list(obs_smids)} / {list(idle_smids)}")
        base = [i for i in base if i not in last] + last
    m.place_workers(base)
    return base


def add_place_args(ap) -> None:
    """--place, --observer-smids, --worker-order, --idle-smids (read back with place_args)."""
    ap.add_argument("--place", action="store_true",
                    help="every build with -DDTMK_SM_WORKER, its workers on the SMs in id order in every launch")
    ap.add_argument("--observer-smids", default="", metavar="ID,ID,...",
                    help="with --place: the observer SMs on these SM ids (as many as the observer SMs), the "
                         "workers on the rest in id order (session 26: observers sharing a TPC with a worker or not)")
    ap.add_argument("--worker-order", choices=("id", "natural"), default="id",
                    help="with --place: the workers on the SMs in id order, or in the block order an unplaced "
                         "launch gives them (probed), the observers' SMs moved to the end")
    ap.add_argument("--idle-smids", default="", metavar="ID,ID,...",
                    help="with --observer-smids: these SMs run nothing in every build (-DDTMK_SM_IDLE; the "
                         "no-hook build leaves the observers' SMs idle too): observers on a GPC of their own")


def place_args(ap, a, sms: int):
    """(observer SM ids, idle SM ids) of add_place_args' options, checked against `sms`
    observer SMs; ap.error names the option at fault."""
    ids = {}
    for opt in ("observer_smids", "idle_smids"):
        try:
            ids[opt] = [int(x) for x in getattr(a, opt).split(",") if x.strip()]
        except ValueError:
            ap.error(f"--{opt.replace('_', '-')}: not a comma list of SM ids: {getattr(a, opt)!r}")
    obs_smids, idle_smids = ids["observer_smids"], ids["idle_smids"]
    if idle_smids and (not obs_smids or len(set(idle_smids)) != len(idle_smids) or set(idle_smids) & set(obs_smids)):
        ap.error(f"--idle-smids needs --observer-smids and distinct ids not among them, got {a.idle_smids!r}")
    if obs_smids and (not a.place or len(set(obs_smids)) != sms):
        ap.error(f"--observer-smids needs --place and {sms} distinct ids (the observer SMs), "
                 f"got {a.observer_smids!r}")
    return obs_smids, idle_smids
