"""Where the observer SM's hot summary costs the workers (GPU; session 16): the observer-SM
build (-DDTMK_OBS_SM -DDTMK_OBS_SMS=M) with the summary monitor attached, beside its own
nothing-attached run and measurement-only variants of it, all in ONE process on the same
weights, launches alternating (side-by-side ratios: session 16's separate probe runs drifted
+-2% between runs, the size of the parts being split).

    python bench/obs_split.py [--presets 1b] [--reps 5] [--sms 4] [--variants base,nopush,...]

Rows (each % over `plain`, the base build -- or the --base variant's -- with nothing attached,
and over `nohooks`):
  base      the summary as it runs
  nopush    workers capture, push no entry (-DDTMK_OSQ_NOPUSH): the capture's share
  discard   entries pushed, the observers take them without running them (-DDTMK_OSQ_DISCARD)
  lazy      entries stored after the signal, published after the next (-DDTMK_OSQ_LAZY_PUB)
  lazydefer / lazydefer1 / lazydefer16   lazy with the entries staged in shared memory after the
            signal and stored by the next wait's first failed poll, up to 4 / 1 / 16 at once
            (-DDTMK_OSQ_DEFER=N); deferB a second instance of lazydefer; defernomaps: with
            -DDTMK_OSQ_NOMAPS; lazydefer16 with the summary keyed by (class, worker) instead of class:
            spread16 (defer16B: lazydefer16 again, the spread)
  fences4 / atoms8 / loads16   discard + per entry 4 fences / 8 atomics on one word / 16
            dependent L2 loads: which kind of the observers' work costs the workers
  codesmem  the programs' code in shared memory (-DDTMK_VM_CODE_SMEM)
  warps3    three observer warps per SM instead of six (-DDTMK_OBS_SM_WARPS=3: as much work,
            half as many warps at it)
  count3 / count1   the base build running counts on the summary's three hooks / one count on
            task:end only, instead of the summary (is it the map work, or the VM calls?)
  novm      the observers build each entry's records into their rings and drain them without
            running the VM (-DDTMK_OSQ_NOVM): the record building's share
  nolow     the observers never store OSQ_W_LOW (-DDTMK_OSQ_NOLOW): what the workers' raises
            pay for the epochs the observers hold (coverage snapshots wrong: measurement only)
  novmnolow / lazynolow / lazydiscard / lazycount1   those combined (session 17)
  atoms8s / loads16s   atoms8 / loads16 at a word per lane and entry (-DDTMK_OSQ_SCATTER):
            the plain ones' lanes share one word, so a warp's requests coalesce into one
  areactl / lazyareactl   the worker's queue words found through the control words at each
            use, as before session 17 (-DDTMK_OSQ_AREA_CTL; now kept in its Worker)
  lazyinline / lazynovm   the lazy build with the push inlined into run_task
            (-DDTMK_OSQ_PUSH_INLINE) / with NOVM
  lazynomaps   the lazy build whose VM runs every program but no map helper touches memory
            (-DDTMK_OSQ_NOMAPS: lookups return NULL): the map work's share of the VM's (session 18)
  lazydesc  the lazy build whose observers run descriptor programs (the summary's three) into
            a shared-memory shadow per warp, flushed at epoch ends (-DDTMK_OSQ_DESC)
  lazydescnoflush   lazydesc whose shadow is dropped instead of flushed (-DDTMK_OSQ_NOFLUSH):
            the observers write no map at all (maps stay empty: measurement only)
  lazynoraise   the lazy build whose waiting workers never raise OBS_PENDING (session 19)
  nomapsburn2k / nomapsburn6k   lazynomaps whose observers spin 2000 / 6000 cycles more per
            entry after running it (-DDTMK_OSQ_BURN): busy observers, no memory (session 19)
  nomaps16 / nomaps16burn30k   lazydefer16 with NOMAPS / and 30000 cycles (~16 us) more per
            entry: is the maps' share the observers' lateness (a full entry's map calls take
            ~10-20 us) rather than their memory?  (session 26)
  nomaps16pages4 / nomaps16icode / nomaps16icodeL   nomaps16 whose observers then load from 4
            pages of 2 MB per entry (-DDTMK_OSQ_PAGES=4: TLB reach) / run ~3 K / ~12 K instructions
            of straight-line code (-DDTMK_OSQ_ICODE=256 / 1024: instruction caches) (session 26)
  multi2 / multi4 / multi8 / multi4nomaps   lazydefer16 whose observer warps run up to 2 / 4 / 8
            entries of one worker per round (-DDTMK_OSQ_MULTI=D, at most 32 / the warp's workers: 5-6
            on 1b; / with NOMAPS): session 26's observer throughput
  deep16 / deep16x / deep16nomaps   lazydefer16 with 256 / 1024 entries per worker queue instead
            of 64 (-DDTMK_OSQ_N=K; / 256 with NOMAPS): do the workers pay for the queues' backpressure?
            (session 27)
  nomaps16atoms8s / nomaps16loads16s   nomaps16 whose observers then do 8 atomics / 16 dependent
            L2 loads per entry at a word per lane (session 19's synthetic work, until then only after
            DISCARD): does map-like memory work beside the real VM cost what the maps do? (session 27)
  lazyB / nomapsB   a second instance of lazy / lazynomaps (same build, own memory): the
            spread between instances of one build in one run
  nopush16 / discard16   the CLI's build (lazydefer16) whose workers capture and push nothing /
            whose observers drop every entry: today's floors under the compiled summary
            (session 53: its +2.8% is above the observers' share; is it the capture or the entry?)
  nopre16 / nohold16 / nowait16   nopush16 without run_task's capture before the body (the t_ready /
            t_begin stamps, the hook bits: -DDTMK_OSQ_NOPRE) / without the hold before the signal
            (-DDTMK_OSQ_NOHOLD) / without the wait's dep:release capture (-DDTMK_OSQ_NOWAITCAP): which
            part of the capture costs (session 54; measurement only, nothing reads what they drop)
  shadow16  nopush16 whose workers do the summary's three updates themselves, after the signal, into
            a shared-memory shadow (-DDTMK_OSQ_WSHADOW): a compiled tier aggregating on the workers,
            above the capture (session 54; measurement only)
  shadowdefer16  shadow16 whose updates are staged after the signal and applied one per failed poll
            of a later wait (-DDTMK_OSQ_WSHADOW_DEFER; session 62, measurement only): is a worker-side
            aggregation free in the worker's idle polls?  Each shadow build's counters (dtmk_wsh_sink,
            one more launch after the timing: task:end's and task:ready's counts, the bins' total)
            must agree: printed, `shadow_equal` (dep:release counts the waits that spun: not compared)
  hotobs16  lazydefer16 with its hot functions -- the workers' osq_defer_flush / osq_raise, the
            observers' osq_observer, osq_run_entry, hook_flush, obs_sync, the VM -- placed after the
            workers' hot region (-DDTMK_HOT_OBS; session 61, measurement only)
  lookcall16   lazydefer16 with the wait's first-look call the observer-SM build had until session
            54 (a __noinline__ call returning 0 there; -DDTMK_OSQ_LOOK_CALL)
  uncap16   lazydefer16 whose waiting workers raise OBS_PENDING past the awaited task's step, as
            before session 54 (-DDTMK_OSQ_RAISE_UNCAPPED: the next task's hold then stores before
            its signal); uncapB a second instance of it
  dafter4 / dafter12   lazydefer16 whose waits store the staged entries from the 4th / 12th failed
            poll on instead of the first (-DDTMK_OSQ_DEFER_AFTER=K: does the flush delay the poll that
            sees a short wait's dependency met?  session 54)
  dinline   lazydefer16 whose wait stores the staged entries inline instead of through a call
            (-DDTMK_OSQ_DEFER_INLINE: the call's restores miss the L1 the poll emptied; session 54)
  lazywarps5 / nomapswarps5   lazy / lazynomaps with five observer warps per SM instead of six
            (-DDTMK_OBS_SM_WARPS=5: what lazydesc's larger Obs leaves room for)
--place: every build with -DDTMK_SM_WORKER, worker k on the k-th SM in id order (observers on
the last ones) in every launch, so that no row differs from another by where its plans ran;
--observer-smids 1,3,5,7: the observers on those SMs instead (each beside a worker in its TPC?);
--worker-order natural: the workers in the block order an unplaced launch gives (probed), not by id.
--idle-smids 4,5,...: with --observer-smids, those SMs run nothing in every build (-DDTMK_SM_IDLE; the
no-hook build leaves the observers' SMs idle too, so all plan the same workers): do the maps still
cost the workers when no worker runs near the observers?  (session 27)
Tokens of every run must equal the no-hook build's."""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import numpy as np

REQUIRES = "gpu"   # what `dtrace-mk bench obs_split` checks before it runs: cpu, gpu, or gpu:N (N ranks, N GPUs)

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from benchio import add_place_args, place_args  # noqa: E402

STEPS = {"tiny": 64, "1b": 16}
#: variant -> defines added to the observer-SM build (kernels/mk_obs_sm.cuh, megakernel.cu)
VARIANTS = {"base": (), "nopush": ("DTMK_OSQ_NOPUSH",), "discard": ("DTMK_OSQ_DISCARD",),
            "lazy": ("DTMK_OSQ_LAZY_PUB",),
            "fences4": ("DTMK_OSQ_DISCARD", "DTMK_OSQ_FENCES=4"), "atoms8": ("DTMK_OSQ_DISCARD", "DTMK_OSQ_ATOMS=8"),
            "loads16": ("DTMK_OSQ_DISCARD", "DTMK_OSQ_LOADS=16"), "codesmem": ("DTMK_VM_CODE_SMEM",),
            "warps3": ("DTMK_OBS_SM_WARPS=3",), "count3": (), "count1": (),
            "novm": ("DTMK_OSQ_NOVM",), "nolow": ("DTMK_OSQ_NOLOW",), "novmnolow": ("DTMK_OSQ_NOVM", "DTMK_OSQ_NOLOW"),
            "lazynolow": ("DTMK_OSQ_LAZY_PUB", "DTMK_OSQ_NOLOW"), "lazydiscard": ("DTMK_OSQ_LAZY_PUB", "DTMK_OSQ_DISCARD"),
            "lazycount1": ("DTMK_OSQ_LAZY_PUB",),
            "atoms8s": ("DTMK_OSQ_DISCARD", "DTMK_OSQ_ATOMS=8", "DTMK_OSQ_SCATTER"),
            "loads16s": ("DTMK_OSQ_DISCARD", "DTMK_OSQ_LOADS=16", "DTMK_OSQ_SCATTER"),
            "areactl": ("DTMK_OSQ_AREA_CTL",), "lazyareactl": ("DTMK_OSQ_LAZY_PUB", "DTMK_OSQ_AREA_CTL"),
            "lazyinline": ("DTMK_OSQ_LAZY_PUB", "DTMK_OSQ_PUSH_INLINE"), "lazynovm": ("DTMK_OSQ_LAZY_PUB", "DTMK_OSQ_NOVM"),
            "lazynomaps": ("DTMK_OSQ_LAZY_PUB", "DTMK_OSQ_NOMAPS"),
            "lazynoraise": ("DTMK_OSQ_LAZY_PUB", "DTMK_OSQ_NORAISE"),
            "lazyB": ("DTMK_OSQ_LAZY_PUB",), "lazydefer": ("DTMK_OSQ_LAZY_PUB", "DTMK_OSQ_DEFER=4"),
            "lazydefer1": ("DTMK_OSQ_LAZY_PUB", "DTMK_OSQ_DEFER=1"),
            "lazydefer16": ("DTMK_OSQ_LAZY_PUB", "DTMK_OSQ_DEFER=16"),
            "deferB": ("DTMK_OSQ_LAZY_PUB", "DTMK_OSQ_DEFER=4"),
            "defernomaps": ("DTMK_OSQ_LAZY_PUB", "DTMK_OSQ_DEFER=4", "DTMK_OSQ_NOMAPS"),
            "defer16B": ("DTMK_OSQ_LAZY_PUB", "DTMK_OSQ_DEFER=16"),
            "spread16": ("DTMK_OSQ_LAZY_PUB", "DTMK_OSQ_DEFER=16"),
            "nomapsB": ("DTMK_OSQ_LAZY_PUB", "DTMK_OSQ_NOMAPS"),
            "nomaps16": ("DTMK_OSQ_LAZY_PUB", "DTMK_OSQ_DEFER=16", "DTMK_OSQ_NOMAPS"),
            "nomaps16pages4": ("DTMK_OSQ_LAZY_PUB", "DTMK_OSQ_DEFER=16", "DTMK_OSQ_NOMAPS", "DTMK_OSQ_PAGES=4"),
            "nomaps16icode": ("DTMK_OSQ_LAZY_PUB", "DTMK_OSQ_DEFER=16", "DTMK_OSQ_NOMAPS", "DTMK_OSQ_ICODE=256"),
            "nomaps16icodeL": ("DTMK_OSQ_LAZY_PUB", "DTMK_OSQ_DEFER=16", "DTMK_OSQ_NOMAPS", "DTMK_OSQ_ICODE=1024"),
            "multi2": ("DTMK_OSQ_LAZY_PUB", "DTMK_OSQ_DEFER=16", "DTMK_OSQ_MULTI=2"),
            "multi4": ("DTMK_OSQ_LAZY_PUB", "DTMK_OSQ_DEFER=16", "DTMK_OSQ_MULTI=4"),
            "multi8": ("DTMK_OSQ_LAZY_PUB", "DTMK_OSQ_DEFER=16", "DTMK_OSQ_MULTI=8"),
            "multi4nomaps": ("DTMK_OSQ_LAZY_PUB", "DTMK_OSQ_DEFER=16", "DTMK_OSQ_MULTI=4", "DTMK_OSQ_NOMAPS"),
            "deep16": ("DTMK_OSQ_LAZY_PUB", "DTMK_OSQ_DEFER=16", "DTMK_OSQ_N=256"),
            "deep16x": ("DTMK_OSQ_LAZY_PUB", "DTMK_OSQ_DEFER=16", "DTMK_OSQ_N=1024"),
            "deep16nomaps": ("DTMK_OSQ_LAZY_PUB", "DTMK_OSQ_DEFER=16", "DTMK_OSQ_N=256", "DTMK_OSQ_NOMAPS"),
            "nomaps16atoms8s": ("DTMK_OSQ_LAZY_PUB", "DTMK_OSQ_DEFER=16", "DTMK_OSQ_NOMAPS", "DTMK_OSQ_ATOMS=8",
                                "DTMK_OSQ_SCATTER"),
            "nomaps16loads16s": ("DTMK_OSQ_LAZY_PUB", "DTMK_OSQ_DEFER=16", "DTMK_OSQ_NOMAPS", "DTMK_OSQ_LOADS=16",
                                 "DTMK_OSQ_SCATTER"),
            "nomaps16burn30k": ("DTMK_OSQ_LAZY_PUB", "DTMK_OSQ_DEFER=16", "DTMK_OSQ_NOMAPS", "DTMK_OSQ_BURN=30000"),
            "lazywarps5": ("DTMK_OSQ_LAZY_PUB", "DTMK_OBS_SM_WARPS=5"),
            "nomapswarps5": ("DTMK_OSQ_LAZY_PUB", "DTMK_OSQ_NOMAPS", "DTMK_OBS_SM_WARPS=5"),
            "nomapsburn2k": ("DTMK_OSQ_LAZY_PUB", "DTMK_OSQ_NOMAPS", "DTMK_OSQ_BURN=2000"),
            "nomapsburn6k": ("DTMK_OSQ_LAZY_PUB", "DTMK_OSQ_NOMAPS", "DTMK_OSQ_BURN=6000"),
            "nopush16": ("DTMK_OSQ_LAZY_PUB", "DTMK_OSQ_DEFER=16", "DTMK_OSQ_NOPUSH"),
            "discard16": ("DTMK_OSQ_LAZY_PUB", "DTMK_OSQ_DEFER=16", "DTMK_OSQ_DISCARD"),
            "nopre16": ("DTMK_OSQ_LAZY_PUB", "DTMK_OSQ_DEFER=16", "DTMK_OSQ_NOPUSH", "DTMK_OSQ_NOPRE"),
            "nohold16": ("DTMK_OSQ_LAZY_PUB", "DTMK_OSQ_DEFER=16", "DTMK_OSQ_NOPUSH", "DTMK_OSQ_NOHOLD"),
            "nowait16": ("DTMK_OSQ_LAZY_PUB", "DTMK_OSQ_DEFER=16", "DTMK_OSQ_NOPUSH", "DTMK_OSQ_NOWAITCAP"),
            "shadow16": ("DTMK_OSQ_LAZY_PUB", "DTMK_OSQ_DEFER=16", "DTMK_OSQ_NOPUSH", "DTMK_OSQ_WSHADOW"),
            "shadowdefer16": ("DTMK_OSQ_LAZY_PUB", "DTMK_OSQ_DEFER=16", "DTMK_OSQ_NOPUSH", "DTMK_OSQ_WSHADOW",
                              "DTMK_OSQ_WSHADOW_DEFER"),
            "hotobs16": ("DTMK_OSQ_LAZY_PUB", "DTMK_OSQ_DEFER=16", "DTMK_HOT_OBS"),
            "lookcall16": ("DTMK_OSQ_LAZY_PUB", "DTMK_OSQ_DEFER=16", "DTMK_OSQ_LOOK_CALL"),
            "uncap16": ("DTMK_OSQ_LAZY_PUB", "DTMK_OSQ_DEFER=16", "DTMK_OSQ_RAISE_UNCAPPED"),
            "uncapB": ("DTMK_OSQ_LAZY_PUB", "DTMK_OSQ_DEFER=16", "DTMK_OSQ_RAISE_UNCAPPED"),
            "dafter4": ("DTMK_OSQ_LAZY_PUB", "DTMK_OSQ_DEFER=16", "DTMK_OSQ_DEFER_AFTER=4"),
            "dafter12": ("DTMK_OSQ_LAZY_PUB", "DTMK_OSQ_DEFER=16", "DTMK_OSQ_DEFER_AFTER=12"),
            "dinline": ("DTMK_OSQ_LAZY_PUB", "DTMK_OSQ_DEFER=16", "DTMK_OSQ_DEFER_INLINE"),
            "lazydesc": ("DTMK_OSQ_LAZY_PUB", "DTMK_OSQ_DESC"),
            "lazydescnoflush": ("DTMK_OSQ_LAZY_PUB", "DTMK_OSQ_DESC", "DTMK_OSQ_NOFLUSH")}
#: variant -> the query it attaches instead of the summary monitor (live.SUMMARY_QUERY)
QUERIES = {"count3": "task:end { @n[worker] = count(); }\ndep:release { @m[worker] = count(); }\n"
                     "task:ready { @k[worker] = count(); }\n",
           "count1": "task:end { @n[worker] = count(); }\n"}
QUERIES["lazycount1"] = QUERIES["count1"]
# the summary with the worker in its per-class keys: the same map work, but no two observer
# warps update one entry at once (session 25: is it the 24 warps' contention on one key per class?)
QUERIES["spread16"] = ("task:end { @lat[task.class, worker] = hist(task.dur_ns); }\n"
                       "dep:release { @dep_wait[task.class, worker] = sum(dep.wait_ns); }\n"
                       "task:ready { @queue[worker] = max(queue.depth); }\n")
DEFAULT_VARIANTS = "base,nopush,discard,lazy,fences4,atoms8,loads16,warps3,count3,count1"


def split_defines(sms: int, variants, place: bool = False, idle_smids=()) -> dict:
    """Each run's Megakernel defines: "nohooks" and each variant's (the eager publish: `lazy`
    rows add -DDTMK_OSQ_LAZY_PUB); --place pins every build's workers."""
    from benchio import pin_defines
    obs = ("DTMK_OBS_SM", f"DTMK_OBS_SMS={sms}")
    pin = pin_defines(idle_smids) if place else ()
    return {"nohooks": ("DTMK_NO_HOOKS",) + pin, **{v: obs + VARIANTS[v] + pin for v in variants}}


def split_builds(name: str, sms: int, variants, place: bool = False, idle_smids=()) -> set:
    """The megakernel define sets split_preset builds, as the kernel cache keys them
    (tools/kcache.py --plan reads a plan's stages through argv_builds)."""
    from dtrace_mk.megakernel import gpu
    from dtrace_mk.megakernel.presets import PRESETS
    return {gpu.megakernel_defines(PRESETS[name], 1, d) for d in split_defines(sms, variants, place, idle_smids).values()}


def split_preset(name: str, reps: int, sms: int, variants, log, clocks: float = 0.0, place: bool = False,
                 obs_smids=None, worker_order: str = "id", idle_smids=()) -> dict:
    from benchio import place_by_smid, sample_clocks, shadow_sink, timed_rounds
    from dtrace_mk.megakernel import gpu
    from dtrace_mk.megakernel.presets import PRESETS
    from dtrace_mk.lang.pipeline import compile_query
    from dtrace_mk.megakernel.reference import make_weights
    from dtrace_mk.runtime.live import LiveSession, summary_monitor
    cfg, steps = PRESETS[name], STEPS.get(name, 16)
    w = make_weights(cfg, 0)
    defs = split_defines(sms, variants, place, idle_smids)
    # --idle-smids: those SMs run nothing in every build, and the no-hook build leaves the
    # observers' SMs idle too (so every build plans the same workers)
    idle = {"nohooks": len(idle_smids) + sms if idle_smids else 0, "obs": len(idle_smids)}
    todo = split_builds(name, sms, variants, place, idle_smids)
    for _, err in gpu.precompile(todo, workers=min(8, len(todo))).values():
        if err is not None:
            raise err
    mks = {"nohooks": gpu.Megakernel(cfg, batch=1, weights=w, defines=defs["nohooks"], idle_sms=idle["nohooks"])}
    lives = {}
    for v in variants:
        mks[v] = gpu.Megakernel(cfg, batch=1, weights=w, defines=defs[v], idle_sms=idle["obs"])
        lives[v] = LiveSession(mks[v])
        schema = mks[v].graph.schema
        mon = (compile_query(QUERIES[v], schema, name=f"<obs_split {v}>") if v in QUERIES
               else summary_monitor(schema))
        lives[v].attach(mon.obj)
    if place:                          # worker k on the k-th SM in id order (the observers' SMs last)
        for k, m in mks.items():
            base = place_by_smid(m, obs_smids, idle_smids, worker_order, observers=k != "nohooks")
            if k in ("nohooks", variants[0]):
                log(f"{name}: {k} SMs by worker: {base}")
        log(f"{name}: workers placed (-DDTMK_SM_WORKER), SMs in {worker_order} order"
            + (f", observers on SMs {list(obs_smids)}" if obs_smids else "")
            + (f", SMs {list(idle_smids)} idle (-DDTMK_SM_IDLE)" if idle_smids else ""))

    def launch(key):
        if key == "nohooks":
            mks[key].reset()
            return mks[key].run(steps, poison=False)
        if key == "plain":                 # the first (--base) build, nothing attached, no observer state
            m, live = mks[variants[0]], lives[variants[0]]
            m.reset()
            m.set_observer(0, None)
            res = m.run(steps, poison=False)
            m.set_observer(int(live.rt.tables.data.ptr), live.state)
            return res
        mks[key].reset()
        lives[key].start(steps)
        return lives[key].wait()

    keys = ["nohooks", "plain"] + list(variants)
    times, last = timed_rounds(keys, reps, steps, launch)
    shadows = {v: shadow_sink(mks[v], lambda: launch(v)) for v in variants if "DTMK_OSQ_WSHADOW" in VARIANTS[v]}
    med = {k: statistics.median(v) for k, v in times.items()}
    out = {"preset": name, "observer_sms": sms, "placed": place, "observer_smids": list(obs_smids or ()),
           "idle_smids": list(idle_smids),
           "worker_order": worker_order if place else None, "steps_per_launch": steps, "reps": reps,
           "us_per_step": med,
           "pct_over_plain": {v: 100.0 * (med[v] / med["plain"] - 1.0) for v in variants},
           "pct_over_nohooks": {k: 100.0 * (med[k] / med["nohooks"] - 1.0) for k in keys[1:]},
           "tokens_equal": all(np.array_equal(last["nohooks"].tokens, last[k].tokens) for k in keys)}
    if shadows:                        # (the deferred updates are all applied: same counts as shadow16's;
        out["shadow"] = shadows        # dep:release's count is the waits that spun: timing's, not compared)
        out["shadow_equal"] = (len({(c["n"][0], c["n"][2]) for c in shadows.values()}) == 1
                               and all(c["hist"] == c["n"][0] >= c["n"][1] for c in shadows.values()))
    log(str(out))
    log(f"{name}, {sms} observer SMs: nohooks {med['nohooks']:.1f} us/step, plain {med['plain']:.1f} "
        f"({out['pct_over_nohooks']['plain']:+.2f}%); tokens equal: {out['tokens_equal']}")
    log(f"{'variant':>9} {'us/step':>8} {'/ plain':>8} {'/ nohooks':>9}")
    for v in variants:
        log(f"{v:>9} {med[v]:>8.1f} {out['pct_over_plain'][v]:>+7.2f}% {out['pct_over_nohooks'][v]:>+8.2f}%")
    if clocks > 0:                     # (session 18: does a busier build run at a lower clock?)
        out["clocks"] = ck = sample_clocks(keys, launch, clocks, log)
        log(f"{'key':>11} {'SM MHz':>7} {'min':>6} {'mem MHz':>8} {'W':>6} {'n':>4}  reasons")
        for k, c in ck.items():
            log(f"{k:>11} {c['sm_mhz']:>7.0f} {c['sm_mhz_min']:>6.0f} {c['mem_mhz']:>8.0f} {c['power_w']:>6.1f} "
                f"{c['samples']:>4}  {' '.join(c['reasons'])}")
    return out


def parse_args(argv=None):
    """(options, variants with --base first, observer SM ids, idle SM ids) of a command line."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--presets", default="1b")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--sms", type=int, default=4, help="observer SMs (-DDTMK_OBS_SMS)")
    ap.add_argument("--variants", default=DEFAULT_VARIANTS, help=f"comma list of: {', '.join(VARIANTS)}")
    ap.add_argument("--clocks", type=float, default=0.0, metavar="S",
                    help="then run each build S seconds more while nvidia-smi samples its SM clock and power")
    ap.add_argument("--base", default="base", metavar="VARIANT",
                    help="the variant whose build, nothing attached, is the plain row (and runs first); "
                         "e.g. lazy to compare the lazy builds with their own plain")
    add_place_args(ap)
    ap.add_argument("--out", default=".")
    a = ap.parse_args(argv)
    obs_smids, idle_smids = place_args(ap, a, a.sms)
    if a.reps < 2:
        ap.error("--reps must be >= 2 (round 0 is a warm-up)")
    variants = [v for v in a.variants.split(",") if v]
    bad = [v for v in variants if v not in VARIANTS]
    if bad or not variants:
        ap.error(f"--variants: unknown {bad} (known: {', '.join(VARIANTS)})" if bad else "--variants: none given")
    if a.base not in VARIANTS:
        ap.error(f"--base: unknown variant {a.base!r} (known: {', '.join(VARIANTS)})")
    variants = [a.base] + [v for v in variants if v != a.base]     # (plain is the first one's build)
    return a, variants, obs_smids, idle_smids


def argv_builds(argv) -> set:
    """The define sets a command line's run builds, every preset's (tools/kcache.py --plan)."""
    a, variants, _, idle_smids = parse_args(argv)
    return set().union(*(split_builds(p, a.sms, variants, a.place, idle_smids) for p in a.presets.split(",") if p))


def main(argv=None) -> int:
    a, variants, obs_smids, idle_smids = parse_args(argv)
    from benchio import run_presets
    run_presets(a.out, f"obs_split_sms{a.sms}", a.presets,
                lambda p, log: split_preset(p, a.reps, a.sms, variants, log, a.clocks, a.place, obs_smids, a.worker_order,
                                               idle_smids))
    return 0


if __name__ == "__main__":
    sys.exit(main())
