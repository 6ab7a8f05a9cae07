"""Where a decode step's time goes, level by level, from the built-in task trace (GPU).

    python bench/level_profile.py [--preset 1b] [--steps 16] [--configs nohooks,off,mask3,summary,summary_cm]
                                  [--variants name=DEF+DEF,...] [--workers] [--place ...] [--out DIR]

Every configuration runs the same weights with the MPK-style trace on (one 32-byte
record per task: dispatch stamp before the wait, wait, begin..end), so all rows pay the
trace's own cost alike.  Configurations:

  nohooks     megakernel.cu built with -DDTMK_NO_HOOKS
  off         the default build, no hook enabled (the trace turns the observing path on)
  mask3       the summary's three hooks stored to the global ring (no program)
  summary     the summary monitor in the hot tier (device VM)
  summary_cm  the summary monitor in the compiled tier (LTO-linked), its inline form
              (kernels/bpf_inline.cuh: run at the hook sites)
  summary_cmring  the same through the observer ring and warp drains
  summary_cmgen   summary_cm with the generic map helpers (runtime fold_maps=False; the
              default folds each map's shape into its calls, session 38)
  <variant>   a --variants build (defines), nothing enabled

A build with -DDTMK_PHASE_PROF (e.g. --configs '' --variants phase=DTMK_PHASE_PROF) also
prints where its streamed tiles' bodies go (kernels/mk_ops.cuh "DTMK_PHASE_PROF"): staging,
the matvec through the weight ring, thread 0's waits for stages, and in batch-1 tiles warp
0's rows, releases and the tile's closing barrier, us per tile per op.

A *level* is one (layer, task class) of the graph (e.g. L3 mlp_gate_up).  Per level and
step: span = last end - first begin of its tasks; handoff = its first begin - the last
end of the tasks that signal the event it waits on (notification + the waiter's own
post-task work).  Per task: dur (begin..end), post = the same worker's next dispatch
stamp - this task's end (release signal, hook records, bookkeeping).  Printed per class,
summed over the step's levels, side by side per configuration; the critical sum
(span + handoff over the chain of levels) is compared with the measured step time.
--workers also prints, per worker and per group of SMs (8 ids, or with --gpcs a GPC of
tools/gpc_probe.py's map), its tasks' dur, its waits and its post time summed per step in each
configuration, the extra ns per task over the first configuration, and the SMs whose tasks
slowed: which workers an observing configuration slows, and in which part (session 29: the
observer SMs' GPC-mates).  --place / --observer-smids / --idle-smids place the workers as
bench/obs_split.py does (bench/benchio.py place_by_smid), every build alike.
Writes DIR/level_profile.json; the tables are printed last.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

REQUIRES = "gpu"   # what `dtrace-mk bench level_profile` checks before it runs: cpu, gpu, or gpu:N (N ranks, N GPUs)

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from dtrace_mk.megakernel import gpu  # noqa: E402
from dtrace_mk.megakernel.presets import PRESETS  # noqa: E402
from dtrace_mk.megakernel.reference import make_weights  # noqa: E402
from benchio import add_place_args, pin_defines, place_args, place_by_smid  # noqa: E402

SUMMARY_HOOKS = ("task:end", "dep:release", "task:ready")


def post_ns(tr: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Per record: the same worker's next dispatch stamp - this task's end (-1 for a
    worker's last record)."""
    post = np.full(len(tr), -1, np.int64)
    order = np.lexsort((tr["t_dispatch"], tr["worker"]))
    a, b = order[:-1], order[1:]
    same = tr["worker"][a] == tr["worker"][b]
    post[a[same]] = tr["t_dispatch"][b[same]].astype(np.int64) - end[a[same]]
    return post


def worker_stats(trace: np.ndarray, skip_steps: int = 1) -> list:
    """Per worker (by id): its SM, tasks per step and us per step in dur (begin..end), wait
    (dispatch..begin: the dependency wait) and post (end..next dispatch), steps <
    skip_steps dropped.  Which workers an observing configuration slows, and whether their
    own tasks, their waits or their post-task paths grow."""
    tr = trace[trace["step"] >= skip_steps]
    if not len(tr):
        raise ValueError("no trace records after the skipped steps")
    end = tr["t_dispatch"].astype(np.int64) + tr["wait_ns"].astype(np.int64) + tr["dur_ns"].astype(np.int64)
    post = post_ns(tr, end)
    nsteps = len(np.unique(tr["step"]))
    out = []
    for w in np.unique(tr["worker"]):
        sel = tr["worker"] == w
        sms = np.unique(tr["sm"][sel])
        p = post[sel]
        out.append({"worker": int(w), "sm": int(sms[0]) if len(sms) == 1 else -1,
                    "tasks_per_step": int(sel.sum()) / nsteps,
                    "dur_us": float(tr["dur_ns"][sel].sum()) / nsteps / 1e3,
                    "wait_us": float(tr["wait_ns"][sel].sum()) / nsteps / 1e3,
                    "post_us": float(p[p >= 0].sum()) / nsteps / 1e3})
    return out


#: print_workers names the SMs whose tasks' mean dur grew by more than this
SLOWED_NS_PER_TASK = 150


def print_workers(per: dict, emit=print, group: int = 8, gpc_of: dict = None) -> None:
    """per: {config: worker_stats(...)}.  Per group of SMs (by the first config's SMs): workers,
    tasks/step, per config dur / wait / post us per step per worker, and for every config after
    the first its extra ns per task; then the same per worker.  Groups: the GPC of each SM when
    gpc_of ({SM: GPC}, tools/gpc_probe.py) is given ("GPC ?" for an SM it lacks), else `group`
    consecutive ids.  SM -1: the worker ran on several SMs (unplaced)."""
    cols = list(per)
    first = {r["worker"]: r for r in per[cols[0]]}
    by = {c: {r["worker"]: r for r in rows} for c, rows in per.items()}
    head = "".join(f"{c[:8] + ' dur':>13}{'wait':>7}{'post':>7}" for c in cols)

    def cells(rs):                     # one config's dur / wait / post columns: the mean over worker rows rs
        return "".join(f"{sum(r[f] for r in rs) / len(rs) if rs else float('nan'):>{13 if f == 'dur_us' else 7}.1f}"
                       for f in ("dur_us", "wait_us", "post_us"))

    def extra_ns(c, ws):               # mean extra ns per task of config c over the first, on workers ws
        ws = [w for w in ws if w in by[c]]
        n = sum(first[w]["tasks_per_step"] for w in ws)
        return 1e3 * sum(by[c][w]["dur_us"] - first[w]["dur_us"] for w in ws) / n if n else float("nan")
    emit(f"--- per {'GPC' if gpc_of else f'SM group of {group}'} (us per step per worker; trace span sums; "
         f"+ns: extra ns per task over {cols[0]})")
    emit(f"  {'SMs':<9}{'wk':>4}{'n/step':>8}" + head + "".join(f"{'+ns ' + c[:8]:>14}" for c in cols[1:]))
    groups = defaultdict(list)
    for w, r in first.items():
        if r["sm"] < 0:
            groups[(2, 0)].append(w)
        elif gpc_of:
            groups[(0, gpc_of[r["sm"]]) if r["sm"] in gpc_of else (1, 0)].append(w)
        else:
            groups[(0, r["sm"] // group)].append(w)
    for key in sorted(groups):
        ws = groups[key]
        row = "".join(cells([by[c][w] for w in ws if w in by[c]]) for c in cols)
        row += "".join(f"{extra_ns(c, ws):>+14.0f}" for c in cols[1:])
        kind, g = key
        label = ("moving" if kind == 2 else "GPC ?" if kind == 1 else f"GPC {g}" if gpc_of
                 else f"{g * group}-{g * group + group - 1}")
        emit(f"  {label:<9}{len(ws):>4}{sum(first[w]['tasks_per_step'] for w in ws) / len(ws):>8.1f}" + row)
    for c in cols[1:]:                 # (session 29: the hot summary slows a fixed set of SMs)
        slow = sorted(r["sm"] for w, r in first.items() if w in by[c] and r["tasks_per_step"]
                      and (by[c][w]["dur_us"] - r["dur_us"]) / r["tasks_per_step"] > SLOWED_NS_PER_TASK / 1e3)
        rest = {r["sm"] for r in first.values()} - set(slow)
        on = lambda sms: extra_ns(c, [w for w, r in first.items() if r["sm"] in sms])   # noqa: E731
        emit(f"--- SMs whose tasks run > {SLOWED_NS_PER_TASK} ns longer in {c} than in {cols[0]}: {len(slow)} {slow} "
             f"(+{on(set(slow)):.0f} ns per task on them, {on(rest):+.0f} on the other {len(rest)})")
    emit("--- per worker (by SM)")
    emit(f"  {'SM':<5}{'wk':>4}{'n/step':>8}" + head)
    for w in sorted(first, key=lambda w: (first[w]["sm"], w)):
        row = "".join(cells([by[c][w]] if w in by[c] else []) for c in cols)
        emit(f"  {first[w]['sm']:<5}{w:>4}{first[w]['tasks_per_step']:>8.1f}" + row)


def level_stats(trace: np.ndarray, graph, skip_steps: int = 1) -> dict:
    """Per class: tasks per step, median dur / post, mean per-step sums of level span and
    handoff; plus the step's total span and the critical sum.  Steps < skip_steps dropped
    (the first step of a launch includes the start)."""
    tasks = graph.tasks
    tr = trace[trace["step"] >= skip_steps]
    if not len(tr):
        raise ValueError("no trace records after the skipped steps")
    idx = tr["task_index"].astype(np.int64)
    begin = tr["t_dispatch"].astype(np.int64) + tr["wait_ns"].astype(np.int64)
    end = begin + tr["dur_ns"].astype(np.int64)
    steps = tr["step"].astype(np.int64)
    post = post_ns(tr, end)
    lvl_of = {}
    producers = defaultdict(set)             # event -> level keys that signal it
    for t in tasks:
        if t.dynamic:
            continue
        key = (t.layer, t.class_name)
        lvl_of[t.index] = key
        producers[t.signal_event].add(key)
    lvl_wait = {lvl_of[t.index]: t.wait_event for t in tasks if t.index in lvl_of}
    first_b, last_e = {}, {}
    per_cls = defaultdict(lambda: {"dur": [], "post": [], "n": 0})
    for i in range(len(tr)):
        ti = int(idx[i])
        if ti not in lvl_of:
            continue
        key, s = lvl_of[ti], int(steps[i])
        k = (key, s)
        first_b[k] = min(first_b.get(k, 1 << 62), int(begin[i]))
        last_e[k] = max(last_e.get(k, 0), int(end[i]))
        c = per_cls[key[1]]
        c["dur"].append(int(tr["dur_ns"][i]))
        if post[i] >= 0:
            c["post"].append(int(post[i]))
        c["n"] += 1
    nsteps = len(set(int(s) for s in steps))
    span_sum, hand_sum, nlev = defaultdict(float), defaultdict(float), defaultdict(int)
    for (key, s), fb in first_b.items():
        span_sum[key[1]] += last_e[(key, s)] - fb
        nlev[key[1]] += 1
        prods = [last_e.get((p, s)) for p in producers.get(lvl_wait[key], ())]
        prods = [p for p in prods if p is not None]
        if prods:
            hand_sum[key[1]] += fb - max(prods)
    out = {}
    for cls, c in per_cls.items():
        out[cls] = {"tasks_per_step": c["n"] / nsteps, "levels_per_step": nlev[cls] / nsteps,
                    "dur_med_ns": float(np.median(c["dur"])),
                    "post_med_ns": float(np.median(c["post"])) if c["post"] else 0.0,
                    "span_us_per_step": span_sum[cls] / nsteps / 1e3,
                    "handoff_us_per_step": hand_sum[cls] / nsteps / 1e3}
    per_step = [(max(last_e[k] for k in last_e if k[1] == s) - min(first_b[k] for k in first_b if k[1] == s)) / 1e3
                for s in sorted(set(int(x) for x in steps))]
    out["_total"] = {"step_span_us": float(np.median(per_step)),
                     "critical_us": sum(v["span_us_per_step"] + v["handoff_us_per_step"]
                                        for k, v in out.items() if not k.startswith("_"))}
    return out


#: number of dtmk_obs_prof counters (kernels/megakernel.cu PROF_N)
PROF_N = 50
#: dtmk_obs_prof counter pairs (count, cycles) by index (kernels/megakernel.cu DTMK_OBS_PROF)
PROF_TABLES = (
    ("drains (one batch / whole ring), hook_post after the signal, late drains",
     (("batch", 0), ("whole", 2), ("post", 4), ("late", 6))),
    ("inside drains: VM / compiled calls, coverage flush + publish, ring moves",
     (("vm", 8), ("flush", 10), ("move", 12))),
    ("per program run: exec step, coverage count, accumulator flushes",
     (("exec", 14), ("cov", 16), ("accfl", 18))),
    ("inside the VM's exec step: helper calls, memory instructions",
     (("call", 20), ("mem", 22))),
    ("around the release signal: hook_hold (before it), one record of hook_flush (after it)",
     (("hold", 24), ("rec", 26))),
    ("the compiled tier's inline form: one event at the site, the shadow's epoch flush",
     (("inline", 28), ("shflush", 30))),
    ("with --defines DTMK_INL_PROBE (summary_cm): the same event again at once, an empty noinline call; "
     "with DTMK_LEAN_SPLIT (lean): the walk's program run, its coverage count",
     (("again", 20), ("empty", 22))),
    ("observer-SM workers: post path (end -> refresh done), release signal, osq_raise, raises that delayed a met poll",
     (("post", 32), ("signal", 34), ("raise", 36), ("rlate", 38))),
    ("after the signal: the push (observer-SM builds), worker-state stores + post_pending, refresh_control; "
     "wait_event's first look",
     (("push", 40), ("tail", 42), ("refresh", 44), ("look", 46))),
    ("of the push: the queue head's publish alone (observer-SM builds)",
     (("head", 48),)),
)


#: DTMK_PHASE_PROF (kernels/mk_ops.cuh): ops, counters per op
PH_OPS_NAMES = ("qkv", "lm_head", "mlp_gate_up", "attn_o", "mlp_down")
PH_OPS, PH_N = len(PH_OPS_NAMES), 10


def phase_rows(v, steps: int, ghz: float = 1.98) -> dict:
    """dtmk_phase_prof counters -> per op: tiles per step and per tile (thread 0, us at
    `ghz`): staging (commit / norm fold / x copy), the matvec through the ring, the time in it
    waiting for stages (ws_wait calls), the first stage's wait, waits per tile, of them long"""
    us = lambda cyc: cyc / ghz / 1e3       # noqa: E731
    out = {}
    for i, name in enumerate(PH_OPS_NAMES):
        c = v[i * PH_N:(i + 1) * PH_N]
        if not c[0]:
            continue
        out[name] = {"tiles_per_step": c[0] / steps, "staged_us": us(c[1] / c[0]), "stream_us": us(c[2] / c[0]),
                     "spin_us": us(c[3] / c[0]), "first_spin_us": us(c[6] / c[0]),
                     "waits_per_tile": c[4] / c[0], "spinning_waits_per_tile": c[5] / c[0],
                     "rows_us": us(c[7] / c[0]), "release_us": us(c[8] / c[0]), "end_bar_us": us(c[9] / c[0])}
    return out


def print_phases(config: str, v, steps: int, emit=print) -> None:
    emit(f"--- DTMK_PHASE_PROF {config}: a streamed tile's body, thread 0, us per tile "
         f"(wait: in ws_wait for stages; first: the tile's first stage's; long: waits > 400 cycles)")
    emit(f"  {'op':<13}{'tiles/step':>11}{'staged':>9}{'stream':>9}{'wait':>9}{'first':>9}{'waits':>8}{'long':>8}{'rows':>8}{'release':>8}{'endbar':>8}")
    for name, r in phase_rows(v, steps).items():
        emit(f"  {name:<13}{r['tiles_per_step']:>11.1f}{r['staged_us']:>9.2f}{r['stream_us']:>9.2f}"
             f"{r['spin_us']:>9.2f}{r['first_spin_us']:>9.2f}{r['waits_per_tile']:>8.1f}{r['spinning_waits_per_tile']:>8.1f}"
             f"{r['rows_us']:>8.2f}{r['release_us']:>8.2f}{r['end_bar_us']:>8.2f}")


def print_prof(profs: dict, steps: int, workers: int, ghz: float = 1.98, emit=print) -> None:
    """The DTMK_OBS_PROF counters per step per worker: count, us, us each (cycles at
    `ghz`, the H200's SM clock under load; bench/timer_cost.py prints the attribute);
    `emit`: where the lines go (a bench's log)."""
    us = lambda cyc: cyc / ghz / 1e3       # noqa: E731
    for title, cols in PROF_TABLES:
        emit(f"--- DTMK_OBS_PROF {title} (per step per worker)")
        emit(f"  {'config':<12}" + "".join(f"{n + ' n':>9}{'us':>8}{'us/each':>9}" for n, _ in cols))
        for c, v in profs.items():
            row = ""
            for _, k in cols:
                each = us(v[k + 1] / v[k]) if v[k] else 0.0
                row += f"{v[k] / steps / workers:>9.2f}{us(v[k + 1] / steps / workers):>8.2f}{each:>9.2f}"
            emit(f"  {c:<12}" + row)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="1b")
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--reps", type=int, default=2, help="runs per configuration (the last one is profiled)")
    ap.add_argument("--configs", default="nohooks,off,mask3,summary,summary_cm")
    ap.add_argument("--variants", default="", help="name=DEF+DEF,... extra builds profiled with nothing enabled")
    ap.add_argument("--out", default=".")
    ap.add_argument("--defines", default="", help="DEF+DEF: extra defines of the hooked build (e.g. a variant to "
                                                  "profile with --prof)")
    ap.add_argument("--prof", action="store_true",
                    help="build the hooked configurations with -DDTMK_OBS_PROF and print where thread 0's "
                         "observation time goes (drains, hook_post) per step per worker")
    ap.add_argument("--workers", action="store_true",
                    help="also print per worker (and per SM group) its tasks' dur, waits and post-task time "
                         "per step in each configuration: which workers an observing configuration slows")
    ap.add_argument("--gpcs", metavar="JSON", help="with --workers: group the SMs by GPC, from tools/gpc_probe.py's "
                                                   "gpc_probe.json (SM ids are dealt out a TPC per GPC in turn)")
    add_place_args(ap)
    a = ap.parse_args()
    gpc_of = None
    if a.gpcs:
        try:
            gpc_of = {s: g for g, sms in enumerate(json.loads(Path(a.gpcs).read_text())["groups"]) for s in sms}
        except (OSError, ValueError, KeyError, TypeError) as e:
            ap.error(f"--gpcs {a.gpcs}: not a gpc_probe.json ({e})")
    extra = tuple(d for d in a.defines.split("+") if d)
    sms = gpu.obs_sms_of(extra) if "DTMK_OBS_SM" in extra else 0
    if a.observer_smids.strip() and not sms:
        ap.error("--observer-smids needs an observer-SM build (--defines DTMK_OBS_SM+DTMK_OBS_SMS=M)")
    obs_smids, idle_smids = place_args(ap, a, sms)
    pin = pin_defines(idle_smids) if a.place else ()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    cfg = PRESETS[a.preset]
    w = make_weights(cfg, 0)

    def log(s):
        print(s, flush=True)

    builds = {}
    configs = [c for c in a.configs.split(",") if c]
    need_default = any(c in ("off", "mask3", "null3", "summary") for c in configs)
    # --idle-smids: those SMs run nothing in every build; the no-hook build idles the observers' too
    idle = {"nohooks": len(idle_smids) + sms if idle_smids else 0, "obs": len(idle_smids)}
    if "nohooks" in configs:
        builds["nohooks"] = gpu.Megakernel(cfg, batch=1, weights=w, defines=("DTMK_NO_HOOKS",) + pin,
                                           idle_sms=idle["nohooks"])
    if need_default:
        builds["default"] = gpu.Megakernel(cfg, batch=1, weights=w, idle_sms=idle["obs"],
                                           defines=(("DTMK_OBS_PROF",) if a.prof else ()) + extra + pin)
    for spec in [v for v in a.variants.split(",") if v]:
        name, defs = spec.split("=", 1)
        builds[name] = gpu.Megakernel(cfg, batch=1, weights=w, idle_sms=idle["obs"],
                                      defines=tuple(d for d in defs.split("+") if d) + pin)
        configs.append(name)
    live = None
    if "summary" in configs:
        from dtrace_mk.runtime.live import LiveSession, summary_monitor
        live = LiveSession(builds["default"])
        live.attach(summary_monitor(builds["default"].graph.schema).obj)
    if "null3" in configs:   # a null program (r0 = 0, exit) on each of the summary's hooks
        from dtrace_mk.runtime.live import LiveSession, summary_monitor
        from hooks import null_object
        live_null = LiveSession(builds["default"])
        live_null.attach(null_object(summary_monitor(builds["default"].graph.schema).obj))
        builds["default"].set_observer(0, None)
    linked = []          # the compiled tier linked into its own build: inline form / through the ring
    for c, inline, fold in (("summary_cm", True, True), ("summary_cmring", False, True), ("summary_cmgen", True, False)):
        if c in configs:
            from dtrace_mk.runtime.live import LiveSession, linked_runtime, summary_monitor
            defs = (("DTMK_OBS_PROF",) if a.prof else ()) + extra + pin
            builds[c] = gpu.Megakernel(cfg, batch=1, weights=w, defines=defs, idle_sms=idle["obs"])
            lc = LiveSession(builds[c], runtime=linked_runtime(builds[c].num_workers, inline=inline, fold_maps=fold))
            lc.attach(summary_monitor(builds[c].graph.schema).obj, tier="compiled")
            lc.link_compiled()
            linked.append(lc)
    if need_default:
        builds["default"].set_observer(0, None)
    if a.place:                        # worker k on the k-th SM in id order (observers, idle SMs last)
        for k, m in builds.items():
            order = place_by_smid(m, obs_smids, idle_smids, a.worker_order, observers=m.obs_sm)
            log(f"{k}: SMs by worker: {order}")

    def run(c):
        m = builds["nohooks"] if c == "nohooks" else builds.get(c) or builds["default"]
        if m is builds.get("default"):
            if c == "summary":
                m.set_observer(int(live.rt.tables.data.ptr), live.state)
            elif c == "null3":
                m.set_observer(int(live_null.rt.tables.data.ptr), live_null.state)
            else:
                m.set_observer(0, None)
        m.reset()
        kw = {"hooks": list(SUMMARY_HOOKS)} if c == "mask3" else {}
        prof = None
        if a.prof and "DTMK_OBS_PROF" in m.defines:
            import cupy as cp
            prof = cp.ndarray((PROF_N,), cp.uint64, memptr=m.module.get_global("dtmk_obs_prof"))
            prof[:] = 0
        phase = None
        if "DTMK_PHASE_PROF" in m.defines:
            import cupy as cp
            phase = cp.ndarray((PH_OPS * PH_N,), cp.uint64, memptr=m.module.get_global("dtmk_phase_prof"))
            phase[:] = 0
        t0 = time.perf_counter()
        r = m.run(a.steps, poison=False, trace=True, **kw)
        if prof is not None:
            profs[c] = [int(v) for v in prof.get()]
        if phase is not None:
            phases[c] = [int(v) for v in phase.get()]
        return r, m, time.perf_counter() - t0

    results, toks, profs, phases, workers = {}, {}, {}, {}, {}
    for rep in range(a.reps):
        for c in configs:
            r, m, _ = run(c)
            toks[c] = r.tokens
            if rep == a.reps - 1:
                if r.trace_dropped:
                    log(f"{c}: {r.trace_dropped} trace records dropped (raise trace_cap)")
                st = level_stats(r.trace, m.graph)
                st["_total"]["us_per_step"] = r.elapsed_ms * 1e3 / a.steps
                results[c] = st
                workers[c] = worker_stats(r.trace)
    ref = next(iter(toks.values()))
    same = {c: bool(np.array_equal(t, ref)) for c, t in toks.items()}
    (out / "level_profile.json").write_text(json.dumps({"preset": a.preset, "steps": a.steps, "results": results,
                                                        "tokens_equal": same, "obs_prof": profs,
                                                        "workers": workers, "placed": a.place,
                                                        "observer_smids": obs_smids, "idle_smids": idle_smids,
                                                        "phase_prof": phases}, indent=1))
    classes = [k for k in next(iter(results.values())) if not k.startswith("_")]
    cols = list(results)
    print(f"\n{a.preset} batch 1, {a.steps} steps, trace on in every row (first step dropped); tokens equal: {same}")
    print(f"{'':<28}" + "".join(f"{c:>12}" for c in cols))
    for field, label in (("us_per_step", "us/step (launch)"), ("step_span_us", "us/step (trace span)"),
                         ("critical_us", "critical sum us")):
        print(f"{label:<28}" + "".join(f"{results[c]['_total'][field]:>12.1f}" for c in cols))
    for field, label, scale in (("span_us_per_step", "span us/step", 1), ("handoff_us_per_step", "handoff us/step", 1),
                                ("dur_med_ns", "dur med us", 1e-3), ("post_med_ns", "post med us", 1e-3)):
        print(f"--- {label}")
        for k in classes:
            print(f"  {k:<26}" + "".join(f"{results[c].get(k, {}).get(field, float('nan')) * scale:>12.2f}"
                                         for c in cols))
    if profs:
        print_prof(profs, a.steps, builds["default"].num_workers)
    for c, v in phases.items():
        print_phases(c, v, a.steps)
    if a.workers:
        print_workers(workers, gpc_of=gpc_of)
    return 0


if __name__ == "__main__":
    sys.exit(main())
