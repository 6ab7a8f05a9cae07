"""`dtrace-mk top`: a live view of a running megakernel.

    dtrace-mk top --model tiny --interval-ms 200 --steps 2000
    dtrace-mk top --model 1b --backend gpu --frames 10

Attaches the built-in summary monitor (dtrace_mk.runtime.live.SUMMARY_QUERY: per task
class latency histogram, dependency-wait sum, ready-queue depth maximum) to a running
decode loop and redraws every interval: per class the tasks finished, latency p50 / p99
(log2 buckets: the bucket's upper bound), total dependency wait, the deepest ready
queue, and the monitor's coverage (eligible = executed + throttled + lost).

Backends: `gpu` hot-attaches into a running megakernel (dtrace_mk.runtime.live); `sim`
(the default without a GPU) runs the discrete-event simulator and feeds its hook
contexts into the reference runtime, advancing the simulated device clock by one
interval per frame.  --frames N stops after N frames; --no-clear prints frames one
after another (what tests and logs want).

Tiers (gpu backend): --tier hot runs the monitor in the device VM at the hook sites
(attached into the running kernel); --tier compiled links it into the megakernel
before the first launch (stage 1: the kernel's cached relocatable cubin + the monitor's
own cubin, ~0.1 s; the full-LTO stage 2 builds in the background and is swapped in at a
later launch); --tier auto attaches hot and promotes when the tier policy says the
monitor is hot (programs ran in 3 epochs or 100k events).  A swap needs a launch
boundary, so compiled/auto run the steps in --launches launches (default 1 for
compiled, 4 for auto); every event is counted once across swaps.  The sim backend has
one (interpreted) tier and ignores --tier.
"""
from __future__ import annotations

import argparse
import sys
import time
from typing import Dict, Iterable, List, Optional

from ..bpf.coverage import Coverage
from ..errors import UserError

NAME = "top"
ORDER = 34
#: --observer: where records are built (kernels/megakernel.cu "observer SM"); the build each
#: choice runs: gpu.observer_defines
OBSERVERS = ("workers", "sm")
OBSERVER_PLACES = ("auto", "hw", "calibrate")   # --observer-place (megakernel/obs_place.py)
HELP = "live view of a running megakernel (per class latency, dependency wait, queue depth, coverage)"
DESCRIPTION = __doc__.split("\n\n", 1)[1]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="tiny", help="model preset (tiny, 1b, ...)")
    p.add_argument("--batch", type=int, default=1, help="request slots")
    p.add_argument("--interval-ms", type=float, default=500.0, help="refresh interval")
    p.add_argument("--steps", type=int, default=200, help="decode steps to run")
    p.add_argument("--backend", choices=("auto", "sim", "gpu"), default="auto")
    p.add_argument("--workers", type=int, default=None, help="workers (sim; default 132)")
    p.add_argument("--frames", type=int, default=0, help="stop after N frames (0: until the run ends)")
    p.add_argument("--no-clear", action="store_true", help="do not clear the screen between frames")
    p.add_argument("--tier", choices=("hot", "compiled", "auto"), default="hot",
                   help="gpu: hot = device VM; compiled = linked into the kernel (fast link, LTO later); "
                        "auto = hot, promoted at a launch boundary when hot (default hot; sim ignores it)")
    p.add_argument("--launches", type=int, default=0, metavar="N",
                   help="gpu: run --steps in N launches (swap points; default 1, 4 with --tier auto)")
    add_observer_arguments(p, "gpu", place="auto")


def add_observer_arguments(p: argparse.ArgumentParser, scope: str, place: str = "") -> None:
    """--observer / --observer-sms (top, serve): where hook records are built and monitors
    run; the build each choice runs is gpu.observer_defines.  place: also --observer-place,
    with that default (top: auto; serve: hw -- pinned in its grid of every SM with the clock
    pairs' SM idle, launch/serve.py observer_build, its steps were 3.7% slower: hooks.md
    sessions 52-53)."""
    from ..megakernel.gpu import OBS_SMS_DEFAULT, OBS_SMS_MAX
    p.add_argument("--observer", choices=OBSERVERS, default="workers",
                   help=f"{scope}: where hook records are built and monitors run -- workers = each "
                        "worker's thread 0 (default); sm = SMs of their own (--observer-sms), the workers "
                        "only capture (-DDTMK_OBS_SM, entries published lazily; exact; 1b hot summary with "
                        "4 SMs over its own off +3.0..+9.5%% by card and observer SMs, workers ~+35%% -- "
                        "docs/results/hooks.md sessions 49-52)")
    p.add_argument("--observer-sms", type=int, default=None, metavar="M",
                   help=f"{scope}, --observer sm: observer SMs (1..{OBS_SMS_MAX}, default {OBS_SMS_DEFAULT}; the "
                        "workers get the other SMs)")
    if not place:
        return
    if place not in OBSERVER_PLACES:
        raise ValueError(f"add_observer_arguments: place default {place!r}")
    p.add_argument("--observer-place", choices=OBSERVER_PLACES, default=place,
                   help=f"{scope}, --observer sm: which SMs the observers get -- calibrate = measure "
                        "candidate SM sets with the summary monitor attached (2 launches of 16 steps each, "
                        "~3-5 s before the job; table on stderr) and pin the cheapest; hw = wherever the "
                        f"hardware puts the last blocks; auto = calibrate with --observer sm (default {place}).  "
                        "The observers slow their GPC's other SMs by an amount that depends on the SMs and "
                        "the card: 1b hot summary +3.0%% calibrated vs +6.2%% on the highest SMs, one H100; "
                        "serve's host-paced steps showed no gain -- docs/results/hooks.md session 52)")


def resolve_observer_place(observer: str, place: str) -> str:
    """--observer-place auto: calibrate where there are observer SMs to pin, else hw."""
    if place not in OBSERVER_PLACES:
        raise UserError(f"--observer-place: expected one of {', '.join(OBSERVER_PLACES)}, got {place!r}")
    if place == "auto":
        return "calibrate" if observer == "sm" else "hw"
    return place


def observer_place_defines(observer: str, place: str) -> tuple:
    """The defines --observer-place adds: calibrate pins the observers (-DDTMK_SM_WORKER), so
    it needs observer SMs to pin."""
    place = resolve_observer_place(observer, place)
    if place == "hw":
        return ()
    if observer != "sm":
        raise UserError(f"--observer-place {place}: only with --observer sm (the workers' observers "
                        f"are the workers themselves)")
    return ("DTMK_SM_WORKER",)


# ------------------------------------------------------------------------ rendering

def _us(ns: float) -> str:
    if ns >= 1e6:
        return f"{ns / 1e6:.1f}ms"
    if ns >= 1e3:
        return f"{ns / 1e3:.1f}us"
    return f"{int(ns)}ns"


def hist_quantile(buckets: List[int], q: float) -> int:
    """Upper bound (ns) of the log2 bucket holding quantile q (bucket b: [2^(b-1), 2^b))."""
    n = sum(buckets)
    if not n:
        return 0
    want, acc = q * n, 0
    for b, c in enumerate(buckets):
        acc += c
        if acc >= want:
            return 0 if b == 0 else (1 << b) - 1
    return (1 << (len(buckets) - 1)) - 1


def _key(raw: bytes) -> int:
    return int.from_bytes(raw[:8], "little")


def render_frame(plan: dict, maps, coverage: Iterable[Coverage], header: str) -> str:
    """One frame of `top` from the summary monitor's maps and coverage rows."""
    from ..lang.printing import key_label
    names = plan.get("names", {})
    lat = maps["lat"].snapshot()
    dep = maps["dep_wait"].snapshot()
    queue = maps["queue"].snapshot()
    rows: Dict[int, Dict[str, int]] = {}
    for k, v in lat.items():
        b = list(v)
        rows.setdefault(_key(k), {})["hist"] = b
    for k, v in dep.items():
        rows.setdefault(_key(k), {})["dep"] = _key(v)
    lines = [header, f"{'class':<14}{'tasks':>9}{'p50':>10}{'p99':>10}{'dep wait':>11}{'wait/task':>11}"]
    total_dep = 0
    for cls in sorted(rows, key=lambda c: -sum(rows[c].get("hist", [0]))):
        r = rows[cls]
        b = r.get("hist", [0])
        n = sum(b)
        d = r.get("dep", 0)
        total_dep += d
        label = key_label(cls, "task_class", names)
        lines.append(f"{str(label):<14}{n:>9}{_us(hist_quantile(b, 0.5)):>10}{_us(hist_quantile(b, 0.99)):>10}"
                     f"{_us(d):>11}{_us(d / n if n else 0):>11}")
    if queue:
        depths = sorted(((_key(v), _key(k)) for k, v in queue.items()), reverse=True)
        top = ", ".join(f"w{w}={d}" for d, w in depths[:4])
        lines.append(f"queue depth max {depths[0][0]} ({top})")
    else:
        lines.append("queue depth max -")
    tot = {"eligible": 0, "executed": 0, "throttled": 0, "lost": 0}
    for c in coverage:
        for k in tot:
            tot[k] += getattr(c, k)
    lines.append("coverage " + " ".join(f"{k} {v}" for k, v in tot.items()) +
                 ("  OK" if tot["eligible"] == tot["executed"] + tot["throttled"] + tot["lost"] else "  MISMATCH"))
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------ backends

def sim_frames(model: str = "tiny", steps: int = 50, interval_ms: float = 0.5, batch: int = 1,
               workers: Optional[int] = None, frames: int = 0) -> Iterable[str]:
    """Frames of `top` on the simulator + reference runtime (no GPU): each frame
    advances the simulated device clock by interval_ms."""
    from ..megakernel import sim as S
    from ..megakernel.graph import build_graph
    from ..megakernel.presets import get_preset
    from ..runtime.live import summary_monitor
    from ..runtime.reference import ReferenceRuntime
    cfg = get_preset(model)
    g = build_graph(cfg, batch, workers or 132)
    mon = summary_monitor(g.schema)
    rt = ReferenceRuntime(num_workers=g.num_workers)
    aid = rt.attach(mon.obj)
    sim = S.Sim(g, steps, sink=S.runtime_sink(rt), hooks=S.runtime_hooks(rt))
    sim.start()
    step_ns = int(interval_ms * 1e6)
    t, k = 0, 0
    while True:
        nxt = sim.next_ts()
        if nxt >= S.END_OF_TIME:
            break
        t = max(t + step_ns, nxt + 1) if k == 0 else t + step_ns
        sim.advance(t)
        k += 1
        done = sim.next_ts() >= S.END_OF_TIME
        hdr = (f"dtrace-mk top  model {model}  backend sim  t={t / 1e6:.3f} ms (sim)  frame {k}"
               + ("  [run finished]" if done else ""))
        yield render_frame(mon.plan, rt.maps(aid), rt.coverage(aid), hdr)
        if frames and k >= frames:
            return
    sim.finish()


def launch_plan(steps: int, tier: str, launches: int = 0) -> List[int]:
    """Steps per launch: --launches N (default 1, 4 for --tier auto), at most one per step."""
    n = launches or (4 if tier == "auto" else 1)
    if n < 1:
        raise UserError(f"--launches: expected >= 1, got {n}")
    n = min(n, steps)
    return [steps // n + (1 if i < steps % n else 0) for i in range(n)]


def _inline_note(live, aid) -> str:
    """ " (inline 3/3)": how many of a compiled attachment's programs run at the hook sites."""
    if not hasattr(live.rt, "forms") or live.rt.tier(aid) != "compiled":
        return ""
    forms = live.rt.forms(aid)
    return f" (inline {sum(f == 'inline' for f in forms.values())}/{len(forms)})"


def gpu_frames(model: str = "tiny", steps: int = 2000, interval_ms: float = 500.0, batch: int = 1,
               frames: int = 0, tier: str = "hot", launches: int = 0, observer: str = "workers",
               observer_sms: Optional[int] = None, observer_place: str = "auto") -> Iterable[str]:
    """Frames of `top` attached to a running megakernel (dtrace_mk.runtime.live): hot, or
    promoted to the compiled tier at launch boundaries (--tier); records built and
    monitors run by the workers or by observer SMs (--observer), placed by the hardware or
    by a calibration (--observer-place; its table goes to stderr)."""
    from ..megakernel import gpu
    from ..megakernel.presets import get_preset
    from ..runtime.live import LiveSession, summary_monitor
    if observer not in OBSERVERS:
        raise UserError(f"--observer: expected one of {', '.join(OBSERVERS)}, got {observer!r}")
    observer_place = resolve_observer_place(observer, observer_place)
    defines = gpu.observer_defines(observer, observer_sms) + observer_place_defines(observer, observer_place)
    mk = gpu.Megakernel(get_preset(model), batch=batch, defines=defines)
    live = LiveSession(mk, tier=tier)
    mon = summary_monitor(mk.graph.schema)
    if observer_place == "calibrate":
        from ..megakernel.obs_place import calibrate_session
        say = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
        cal = calibrate_session(live, mon.obj, progress=say)
        say("\n".join(cal.lines()))
    plan = launch_plan(steps, tier, launches)
    step_start = mk.step
    if tier == "hot":
        live.start(plan.pop(0))
        aid = live.attach(mon.obj)
    else:
        aid = live.attach(mon.obj)              # hot; "compiled": promoted by start()'s boundary
        live.start(plan.pop(0))
    k, t0 = 0, time.perf_counter()
    try:
        while True:
            time.sleep(interval_ms / 1e3)
            running = live.running()
            if not running:
                live.wait(raise_on_watchdog=False)
                if plan and not (frames and k + 1 >= frames):
                    live.start(plan.pop(0))     # a launch boundary: promotions / LTO swaps
                    running = True
            snap = live.snapshot(aid)
            k += 1
            tiers = "" if tier == "hot" else f"  tier {live.tier_status().get(aid, '?')}{_inline_note(live, aid)}"
            hdr = (f"dtrace-mk top  model {model}  backend gpu{tiers}  t={time.perf_counter() - t0:.1f} s  "
                   f"steps {snap.steps_done - step_start}/{steps}  final epoch {snap.final_epoch}  frame {k}"
                   + ("" if running else "  [run finished]"))
            yield render_frame(mon.plan, snap.maps, snap.coverage + snap.partial, hdr)
            if not running:
                return
            if frames and k >= frames:
                live.mk.abort()
                live.wait(raise_on_watchdog=False)
                return
    finally:
        live.close()


def _gpu_available() -> bool:
    try:
        import cupy
        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


def run(args: argparse.Namespace) -> int:
    if args.interval_ms <= 0:
        raise UserError(f"--interval-ms: expected > 0, got {args.interval_ms}")
    if args.steps < 1:
        raise UserError(f"--steps: expected >= 1, got {args.steps}")
    backend = args.backend
    if backend == "auto":
        backend = "gpu" if _gpu_available() else "sim"
    observer = getattr(args, "observer", "workers")
    observer_sms = getattr(args, "observer_sms", None)
    observer_place = getattr(args, "observer_place", "auto")
    from ..megakernel.gpu import observer_defines
    observer_defines(observer, observer_sms)        # (checks the pair before either backend)
    observer_place_defines(observer, observer_place)
    if backend == "gpu":
        it = gpu_frames(args.model, args.steps, args.interval_ms, args.batch, args.frames,
                        getattr(args, "tier", "hot"), getattr(args, "launches", 0), observer, observer_sms,
                        observer_place)
    else:
        if observer != "workers":
            raise UserError(f"--observer {observer}: a placement of the GPU kernel's observer; the sim "
                            f"backend has none (use --backend gpu)")
        it = sim_frames(args.model, args.steps, args.interval_ms, args.batch, args.workers, args.frames)
    for frame in it:
        if not args.no_clear and sys.stdout.isatty():
            sys.stdout.write("\x1b[H\x1b[2J")
        sys.stdout.write(frame + ("\n" if args.no_clear else ""))
        sys.stdout.flush()
        if backend == "sim" and sys.stdout.isatty():
            time.sleep(args.interval_ms / 1e3)
    return 0
