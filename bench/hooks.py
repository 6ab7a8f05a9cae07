"""Cost of observation in the reference megakernel, as ratios measured in one run.

    python bench/hooks.py [--presets tiny,1b] [--reps 5] [--placement hw|sorted|paired [--obs-sms ID,..]]
                          [--order fixed|shuffled] [--offpath [--late-modules K]] [--out DIR]

Per preset (batch 1, one launch of K decode steps, device events, median of --reps runs
taken round-robin over the variants so drift hits all alike):

  nohooks     megakernel.cu built with -DDTMK_NO_HOOKS (no hook code at all)
  off         default build, hooks compiled in, nothing enabled (the shipped default)
  off2        the same again (the spread between off and off2 is the noise floor)
  live_idle   observer tables wired in (LiveSession), nothing attached
  summary     the summary monitor (dtrace_mk.runtime.live.SUMMARY_QUERY: per-class
              latency histogram, dependency-wait sum, queue depth max) attached in the
              hot tier (device VM at the hook sites), always on; in a build with the site
              form (variant siteform) its three programs run from aggregation descriptors
              (runtime/descform.py; printed: forms)
  trace       the MPK-style full task trace (32-byte record per task), nothing else
  ring_all    every hook writing its 128-byte context to the global ring

Attribution of the summary monitor's cost (same default build, no extra compile; each
printed as % over off in the "attribution" table, with drains and epoch publishes per
step per worker that took records):

  null3       a null program (mov r0, 0; exit) on each of the summary's three hooks
              (task:end, dep:release, task:ready): records built in the observer's
              ring and drained through the VM, which does almost nothing (siteform: zero
              descriptors, i.e. the site's fixed cost)
  s_end       the summary's task:end program alone (hist of dur)
  s_dep       the summary's dep:release program alone (sum of wait)
  s_ready     the summary's task:ready program alone (max queue depth)
  nohooks_pad the -DDTMK_NO_HOOKS code with the default build's static shared memory
              (-DDTMK_SMEM_PAD = the difference of the two builds' static shared memory: same
              L1 carveout; one extra compile): off over
              nohooks_pad is the code's share of the off cost, nohooks_pad over nohooks
              the shared memory's
  mask3       the three hooks enabled in the hook mask with NO observer (no program,
              no drain): each record built in registers after its task's release
              signal and stored straight into the global ring (16-byte stores)

Build variants (--variants recglobal; docs/dev/hook_cost_analysis.md round 8): the same
weights in megakernel.cu built with the variant's defines (recglobal: -DDTMK_REC_GLOBAL,
the record path before round 8; eagerhold: -DDTMK_HOLD_EAGER, the full pre-signal hold
always -- the default since session 9 holds lazily: no pre-signal hold work when no
loaded program reads request_gen and no host ring is on)
run off, mask3, null3, summary (hot) and summary_cm (compiled tier linked with that
build) as off_<v>, ...; printed side by side with the default build, each as % over the
default build's off, plus <v>'s off over nohooks.  Their summary counts must equal the
default build's (printed).

--offpath (round 7): only nohooks / off / summary of the default build and of each
--variants build (its no-hooks build gets the variant's defines too: like for like; a
variant of hook code only, e.g. recglobal, reuses the default's), plus off2; prints us/step,
off/nohooks, summary/off, off over the default's nohooks, tokens.
e.g. `--offpath --presets tiny,1b --reps 3 --variants recglobal` (~2-3 min).

plus bytes per step (trace / ring) against the summary's map bytes per snapshot -- raw
(the ring's records; the map entries' keys and values as stored, histograms dense) and on
the wire (dtrace_mk.runtime.wire: msgpack of both, histograms sparse) -- and
the hot attach latency into a running launch (attach/detach cycles, from the host's
generation write and from the attach command to the first counted event, device clock).
Tokens of every variant must equal the nohooks tokens (checked, printed).

Writes DIR/hooks.json; prints a short table last: each build's off over nohooks and its
monitors over its own off, as the median and range of launches paired by round (own_off).
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
from pathlib import Path

import numpy as np

REQUIRES = "gpu"   # what `dtrace-mk bench hooks` checks before it runs: cpu, gpu, or gpu:N (N ranks, N GPUs)

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from dtrace_mk.megakernel import gpu  # noqa: E402
from dtrace_mk.megakernel.presets import PRESETS  # noqa: E402
from dtrace_mk.megakernel.reference import make_weights  # noqa: E402
from dtrace_mk.runtime.live import LiveSession, linked_runtime, summary_monitor  # noqa: E402
from dtrace_mk.runtime.wire import snapshot_wire, trace_wire  # noqa: E402

STEPS = {"tiny": 64, "1b": 16}
LONG = {"tiny": 4000, "1b": 600}
#: --placement: "hw", the hardware's block placement (a different SM per worker in each
#: launch: 1b's steps fall on levels ~1.5% apart, megakernel.md session 12, and each build's
#: paired rounds spread 3-8%); "sorted", every build -DDTMK_SM_WORKER with worker k on the k-th
#: SM by id in every launch (an observer-SM build's observers on the last ones): rounds agree
#: within ~1%, but that is ONE placement's cost (session 50: obssm4fold's hot summary +10.2%
#: sorted vs +4.4% placed by the hardware); "paired", one random order of the SMs per round,
#: the same for every build: pairs by round compare code at equal placement, and the rounds
#: sample placements as the hardware's do (session 50: obssm4fold's monitors cost +1.9% in
#: some rounds, +7.7% in others -- where the observers sit).  --obs-sms pins the observer-SM
#: builds' observers to the SMs named (the order's last entries) under either.  Set by main().
PLACEMENT = "hw"
PLACEMENTS = ("hw", "sorted", "paired")
OBS_PIN: list = []         # --obs-sms: sets of SMs the observers run on, set r % len in round r (empty: the order's say)
LATE_MODULES = 0           # --late-modules K (--offpath): the default's off / nohooks again after K more modules
ORDER = "fixed"            # --order: the variants' order within a timed round (round_variants)
OBS_CAL = 0                # --obs-sms calibrate[:K]: K candidate sets measured first (obs_place), the cheapest pinned
PLACED: list = []          # the Megakernels a pinned placement re-places each round (place_round)
SM_IDS: list = []          # the SMs their grids get (the same for every build)


def placed(defines=()) -> tuple:
    """A build's defines under --placement (pinned: + DTMK_SM_WORKER)."""
    return tuple(defines) + (("DTMK_SM_WORKER",) if PLACEMENT != "hw" else ())


def pin_sets(pins) -> list:
    """--obs-sms as sets: a result's "obs_sms" is a list of sets, or (before session 51) one
    flat list of SM ids."""
    return [list(p) for p in pins] if pins and isinstance(pins[0], (list, tuple)) else [list(pins)] if pins else []


def pins_text(pins) -> str:
    """--obs-sms sets as the command line spells them: 32,33,65,68/128,129,130,131."""
    return "/".join(",".join(map(str, p)) for p in pin_sets(pins))


def round_pins(rnd: int, pins=None) -> list:
    """The observer SMs pinned in round `rnd`: --obs-sms set rnd % (number of sets); [] if none."""
    sets = pin_sets(OBS_PIN if pins is None else pins)
    return sets[rnd % len(sets)] if sets else []


def round_variants(variants: list, rnd: int, order: str = None) -> list:
    """The order the table's timed round `rnd` runs its variants in: as listed ("fixed", every
    recorded table before session 62), or a permutation drawn per round, seeded by the round
    ("shuffled": no variant keeps its place or its neighbours -- session 62 saw obs_split move a
    variant ~0.5 point with its place, and the table's off / nohooks read ~1.2 points above
    --offpath's on the same cubins)."""
    order = ORDER if order is None else order
    if order == "fixed":
        return list(variants)
    import random
    return random.Random(0x5EED + rnd).sample(list(variants), len(variants))


def round_order(rnd: int, ids=None, pins=None, placement=None) -> list:
    """The SM order of round `rnd` (worker k on order[k]; an observer-SM build's observers
    are the last entries): sorted, or the round's random draw (paired, seeded by the round),
    with the round's pinned observer SMs moved to the end.  ids / pins / placement: this run's
    SM_IDS / OBS_PIN / PLACEMENT unless given (a result's "sm_ids" / "obs_sms" / "placement")."""
    ids, pins = SM_IDS if ids is None else ids, round_pins(rnd, pins)
    placement = PLACEMENT if placement is None else placement
    base = ids if placement == "sorted" else [int(x) for x in np.random.default_rng(rnd).permutation(ids)]
    return [x for x in base if x not in pins] + list(pins)


def megakernel(cfg, w, defines=()):
    """The batch-1 Megakernel of one build, placed as --placement says."""
    mk = gpu.Megakernel(cfg, batch=1, weights=w, defines=placed(defines))
    if PLACEMENT == "hw":
        return mk
    ids = mk.place_workers()                          # (the SMs the grid gets, sorted)
    if SM_IDS and ids != SM_IDS:                      # (a permutation must suit every build)
        raise RuntimeError(f"--placement {PLACEMENT}: build {defines} gets SMs {ids[:4]}..{ids[-4:]} "
                           f"({len(ids)}), the first build {SM_IDS[:4]}..{SM_IDS[-4:]} ({len(SM_IDS)})")
    SM_IDS[:] = ids
    for pins in pin_sets(OBS_PIN):
        bad = [x for x in pins if x not in ids]
        if bad:
            raise RuntimeError(f"--obs-sms: SMs {bad} are not among the {len(ids)} the grid gets ({ids[0]}..{ids[-1]})")
        if getattr(mk, "obs_sm", False) and mk.obs_sms != len(pins):
            raise RuntimeError(f"--obs-sms names {len(pins)} SMs ({','.join(map(str, pins))}); build {defines} "
                               f"has {mk.obs_sms} observer SMs")
    mk.place_workers(round_order(0))
    PLACED.append(mk)
    return mk


def place_round(rnd: int) -> None:
    """--placement paired (or several --obs-sms sets): round `rnd`'s order of the SMs, the same
    for every build made so far."""
    if PLACEMENT == "hw" or (PLACEMENT == "sorted" and len(pin_sets(OBS_PIN)) < 2):
        return
    order = round_order(rnd)
    for mk in PLACED:
        mk.place_workers(order)


def map_bytes(snap) -> int:
    """Bytes the host reads for the summary's entries (keys + values) in one snapshot."""
    n = 0
    for m in snap.maps:
        s = m.snapshot()
        for k, v in s.items():
            n += len(k) + (len(v) * 8 if isinstance(v, list) else len(v))
    return n


def summary(schema, log):
    """The summary monitor; if compiling it fails in this process (seen once on the
    device image: an AsmError from the lowering, while the same query compiled in the
    pytest process on the same machine), say why and compile it in a fresh interpreter."""
    try:
        return summary_monitor(schema)
    except Exception as e:  # noqa: BLE001
        import pickle
        import subprocess
        import traceback
        log(f"summary_monitor failed here ({sys.version.split()[0]}): {e!r}\n{traceback.format_exc()}")
        code = ("import pickle,sys; sys.path.insert(0, %r); from dtrace_mk.runtime.live import summary_monitor; "
                "sys.stdout.buffer.write(pickle.dumps(summary_monitor()))" % str(REPO))
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, check=True).stdout
        log("summary monitor compiled in a subprocess instead")
        return pickle.loads(out)


SUMMARY_HOOKS = ("task:end", "dep:release", "task:ready")


def null_object(like):
    """A null program (r0 = 0, exit) on each of the summary's hooks."""
    from dtrace_mk.abi import definition as abi
    from dtrace_mk.bpf.asm import assemble
    from dtrace_mk.bpf.program import BpfObject, Program
    progs = [Program("null_" + h.replace(":", "_"), abi.hook(h).section, abi.hook(h), assemble("mov r0, 0\nexit"))
             for h in SUMMARY_HOOKS]
    return BpfObject(progs, [], license=like.license, schema_hash=like.schema_hash, path="<null3>")


def one_program(obj, hook: str):
    """The program of `obj` on `hook` alone (all maps kept: indices stay valid)."""
    from dtrace_mk.bpf.program import BpfObject
    progs = [p for p in obj.programs if p.hook.name == hook]
    return BpfObject(progs, list(obj.maps), license=obj.license, schema_hash=obj.schema_hash,
                     path=f"<summary {hook}>")


def obs_counts(state, steps: int) -> dict:
    """Per-launch observer counters (reset by each launch): drains (VM calls) and epoch
    publishes (fenced OBS_PENDING moves) per step per worker that took records."""
    st = state.get()
    drained = st[:, 1].astype(np.int64)
    d = st[:, 7]
    drains = (d & np.uint64(0xFFFFFFFF)).astype(np.int64)
    pubs = (d >> np.uint64(32)).astype(np.int64)
    act = max(1, int((drained > 0).sum()))
    return {"records_per_step": float(drained.sum()) / steps, "workers": act,
            "drains_per_step_worker": float(drains.sum()) / steps / act,
            "publishes_per_step_worker": float(pubs.sum()) / steps / act,
            "lost": int(st[:, 2].sum())}


#: build variants of --variants: name -> extra defines
#: (rounds 6 and 7, obswarp / offcopy, and session 6's mapcache / mapcode / mapnoval were
#: measured and removed: hook_cost_analysis.md)
#: round 8 (docs/dev/hook_cost_analysis.md "Round 8"): hook_hold / hook_flush read the task
#: record from the shared copy s_rec (no L2 trip before the release signal): the default
#: since session 4; recglobal = the old path (the global task table)
BUILD_VARIANTS = {"recglobal": ("DTMK_REC_GLOBAL",), "evictnormal": ("DTMK_WS_EVICT_NORMAL",),
                  "codesmem": ("DTMK_VM_CODE_SMEM",),
                  "extrasync": ("DTMK_EXTRA_SYNC",),   # session 7: the two per-task barriers back
                  "eagerhold": ("DTMK_HOLD_EAGER",),   # the full pre-signal hold always (the lazy one: default since session 9)
                  # measurement only: mask3's sites do the summary's three updates in shared
                  # memory instead of building records (the floor of a data-driven site)
                  "idealsite": ("DTMK_IDEAL_SITE",),
                  # measurement only (session 62): the same three updates from the capture in place -- no
                  # hook_post / hook_flush / hk_capture -- into a shared-memory shadow after the signal
                  # (megakernel.cu -DDTMK_OSQ_WSHADOW without the observer SM), and deferred to the
                  # waits' failed polls (-DDTMK_OSQ_WSHADOW_DEFER); their sink is read after mask3's
                  # first run: build_shadow (every task's task:end counted once)
                  "wshincta": ("DTMK_OSQ_WSHADOW",), "wshdeferincta": ("DTMK_OSQ_WSHADOW", "DTMK_OSQ_WSHADOW_DEFER"),
                  # the site form (descriptors, compiled inline) through session 9's noinline
                  # hk_inline_run call (inlined by default since session 10)
                  "inlcall": ("DTMK_INL_NOINLINE",),
                  # the site form in the hot build (session 10: aggregation descriptors at the
                  # hook sites; summary runs from them): not the default, it costs the off path
                  "siteform": ("DTMK_SITE_FORM",),
                  # the lean form (session 63, kernels/bpf_inline.cuh): the summary's descriptor programs
                  # (dense keys) update per-worker cells from the event's record -- no ring, no
                  # drain, no interpreter, no probe; folded into the maps by obs_sync
                  "lean": ("DTMK_LEAN_SITE",),
                  # the observer SM: one SM runs every worker's records (SMs - 1 workers) on
                  # as many warps as the launch's dynamic shared memory holds Obs for (1b: 6,
                  # tiny: 1); obssm1: one warp (session 13's draft had one, lane 0 building)
                  "obssm": ("DTMK_OBS_SM",), "obssm1": ("DTMK_OBS_SM", "DTMK_OBS_SM_WARPS=1"),
                  # the observer SM with the workers' entry stores inlined into run_task (no
                  # call before the release signal; the register split may cost elsewhere)
                  "obssmin": ("DTMK_OBS_SM", "DTMK_OSQ_PUSH_INLINE"),
                  # several observer SMs (session 15: one SM's six warps cannot keep up with 1b)
                  "obssm2": ("DTMK_OBS_SM", "DTMK_OBS_SMS=2"), "obssm3": ("DTMK_OBS_SM", "DTMK_OBS_SMS=3"),
                  "obssm4": ("DTMK_OBS_SM", "DTMK_OBS_SMS=4"),
                  # four observer SMs, the workers' entries published lazily (session 16: the
                  # push cost ~4.5% of 1b's step; kernels/mk_observer.cuh osq_settle)
                  "obssm4lazy": ("DTMK_OBS_SM", "DTMK_OBS_SMS=4", "DTMK_OSQ_LAZY_PUB"),
                  # ... and the observers running descriptor programs into a shared-memory
                  # shadow per warp (session 18: exact; no cheaper than obssm4lazy in obs_split)
                  "obssm4desc": ("DTMK_OBS_SM", "DTMK_OBS_SMS=4", "DTMK_OSQ_LAZY_PUB", "DTMK_OSQ_DESC"),
                  # ... and the entries staged in shared memory after the signal, stored by the
                  # next wait whose poll fails (session 24: kernels/mk_observer.cuh osq_defer_flush)
                  "obssm4defer": ("DTMK_OBS_SM", "DTMK_OBS_SMS=4", "DTMK_OSQ_LAZY_PUB", "DTMK_OSQ_DEFER=16"),
                  # ... staging at most 4 (session 24's obssm4defer) beside it
                  "obssm4defer4": ("DTMK_OBS_SM", "DTMK_OBS_SMS=4", "DTMK_OSQ_LAZY_PUB", "DTMK_OSQ_DEFER=4"),
                  # ... whose observer warps run up to 4 entries of one worker per round (session 26, opt-in)
                  "obssm4multi": ("DTMK_OBS_SM", "DTMK_OBS_SMS=4", "DTMK_OSQ_LAZY_PUB", "DTMK_OSQ_DEFER=16",
                                  "DTMK_OSQ_MULTI=4"),
                  # ... whose idle rounds leave the records in the ring until 16 in a row found
                  # nothing (session 34: full VM batches, fewer passes over the observers' code)
                  "obssm4idle": ("DTMK_OBS_SM", "DTMK_OBS_SMS=4", "DTMK_OSQ_LAZY_PUB", "DTMK_OSQ_DEFER=16",
                                 "DTMK_OSQ_IDLE_DRAIN=16"),
                  # ... whose first two observer SMs (one TPC) build the records and the last two run
                  # them (session 35: each TPC's instruction cache holds one phase's code)
                  "obssm4split": ("DTMK_OBS_SM", "DTMK_OBS_SMS=4", "DTMK_OSQ_LAZY_PUB", "DTMK_OSQ_DEFER=16",
                                  "DTMK_OSQ_SPLIT"),
                  # the weight ring of 4 x 32 KB (the default until session 36, now 3): the hook builds'
                  # static shared memory then pushes them to the 196 KB carveout (L1 60 KB, not 92)
                  "ring4": ("DTMK_WS_NST=4",),
                  "obssm4defer_ring4": ("DTMK_OBS_SM", "DTMK_OBS_SMS=4", "DTMK_OSQ_LAZY_PUB", "DTMK_OSQ_DEFER=16",
                                        "DTMK_WS_NST=4"),
                  # 3 x 24 KB stages (72 KB): every 1b build at batch 1 in the 132 KB carveout (L1 124 KB),
                  # hook builds included; the CLI build's observer SMs then hold 4 Obs (4 warps, not 5)
                  "ring3x24": ("DTMK_WS_STAGE=24576",),
                  "obssm4defer_3x24": ("DTMK_OBS_SM", "DTMK_OBS_SMS=4", "DTMK_OSQ_LAZY_PUB", "DTMK_OSQ_DEFER=16",
                                       "DTMK_WS_STAGE=24576"),
                  # the CLI's build with 4 / 3 observer warps per observer SM (5 fit): does less observer
                  # activity at once cost the GPC-mates less, while the warps still keep up? (session 37)
                  "obssm4defer_w4": ("DTMK_OBS_SM", "DTMK_OBS_SMS=4", "DTMK_OSQ_LAZY_PUB", "DTMK_OSQ_DEFER=16",
                                     "DTMK_OBS_SM_WARPS=4"),
                  "obssm4defer_w3": ("DTMK_OBS_SM", "DTMK_OBS_SMS=4", "DTMK_OSQ_LAZY_PUB", "DTMK_OSQ_DEFER=16",
                                     "DTMK_OBS_SM_WARPS=3"),
                  # the CLI's build, its compiled summary with map helpers folded to each map's shape
                  # (summary_cm, the default since session 38) and with the generic helpers (summary_cmgen)
                  "obssm4fold": ("DTMK_OBS_SM", "DTMK_OBS_SMS=4", "DTMK_OSQ_LAZY_PUB", "DTMK_OSQ_DEFER=16"),
                  # ... with the generic map helpers (the hot tier's) probing 4- and 8-byte keys in registers
                  # (kernels/bpf_maps.cuh, opt-in since session 38): the hot summary's drain, shorter per lookup
                  "obssm4look": ("DTMK_OBS_SM", "DTMK_OBS_SMS=4", "DTMK_OSQ_LAZY_PUB", "DTMK_OSQ_DEFER=16",
                                 "DTMK_HASH_LOOK_FAST"),
                  # measurement only (session 55, --offpath): the default build whose per-task "observing?"
                  # gates are constant 0 in wait_event (offxw), run_task (offxr), or everywhere on the per-task
                  # path (offxall: statically the no-hook build's path): does the off cost sit in that code?
                  # (these and offcopyw / offcopywr in the layout they were measured in, sessions 55-57)
                  "offxw": ("DTMK_NO_HOT_FIRST", "DTMK_OFFX=1"), "offxr": ("DTMK_NO_HOT_FIRST", "DTMK_OFFX=2"),
                  "offxall": ("DTMK_NO_HOT_FIRST", "DTMK_OFFX=7"),
                  # ... wait_event's sites apart (session 56): the first look's call, the drains after its
                  # barrier, the spin loop's and the rest
                  "offxlook": ("DTMK_NO_HOT_FIRST", "DTMK_OFFX=8"), "offxsync": ("DTMK_NO_HOT_FIRST", "DTMK_OFFX=16"),
                  "offxspin": ("DTMK_NO_HOT_FIRST", "DTMK_OFFX=32"),
                  # wait_event (offcopyw) / and run_task (offcopywr) in two copies, the copy without hook code
                  # taken while the worker observes nothing (-DDTMK_OFF_COPY, session 55), in the old layout
                  "offcopyw": ("DTMK_NO_HOT_FIRST", "DTMK_OFF_COPY=1"), "offcopywr": ("DTMK_NO_HOT_FIRST", "DTMK_OFF_COPY=3"),
                  # the default before session 60: the old layout, one wait (+1.58..+2.00% off on an H100)
                  "legacy": ("DTMK_NO_HOT_FIRST", "DTMK_ONE_WAIT"),
                  # measurement (session 66): the standard lowering's task functions (tiny's) renamed to
                  # follow the hot region too (kernels/megakernel.cu DTMK_HOT_TINY), hook and no-hook builds
                  "hottiny": ("DTMK_HOT_TINY",),
                  # the session-2 poll (relaxed loads, one fence.acq_rel once met): no L1 invalidation per poll,
                  # so the poll loop's spill reloads hit L1 -- in the no-hook and the hook build alike
                  "pollfence": ("DTMK_POLL_FENCE",),
                  # measurement (session 58): the workers' hot functions renamed to follow the kernel's
                  # entry in the cubin (kernels/megakernel.cu DTMK_HOT_FIRST): one hot region of code, with
                  # one wait (the default since session 60 takes two copies of it)
                  "hotfirst": ("DTMK_ONE_WAIT",),
                  # ... with offxw's wait (hfxw) and with offcopyw's two copies of it (hfcopyw, the default
                  # since session 60): plan 158 cut the GCC's fetches (226 K -> 148 K per launch) but the off
                  # cost only 0.3%: is the rest the wait's hook code, as offxw's ~0 said?
                  "hfxw": ("DTMK_OFFX=1",), "hfcopyw": ("DTMK_OFF_COPY=1",),
                  # (session 60) copy 0 of the wait calls copy 1 itself: one wait call in the main loop,
                  # whose entry spills less (ptxas: 136 / 144 -> 112 / 132 bytes; hfxw 104 / 124)
                  "copyinwait": ("DTMK_COPY_IN_WAIT",),
                  # measurement (session 61): obssm4fold with the observer-SM build's hot functions after the
                  # workers' (the workers' osq_defer_flush / osq_raise; the observers' osq_observer, osq_run_entry,
                  # hook_flush, obs_sync, the VM: kernels/megakernel.cu DTMK_HOT_OBS) -- the GPC cache the
                  # workers of an observer's GPC share with it: does the compiled summary get cheaper?
                  "obssm4hotobs": ("DTMK_OBS_SM", "DTMK_OBS_SMS=4", "DTMK_OSQ_LAZY_PUB", "DTMK_OSQ_DEFER=16",
                                   "DTMK_HOT_OBS")}
#: build variants that run only some of BUILD_RUNS (idealsite has no records to observe)
BUILD_VARIANT_RUNS = {"idealsite": ("off", "mask3"), "wshincta": ("off", "mask3"), "wshdeferincta": ("off", "mask3"),
                      "siteform": ("off", "mask3", "null3", "summary"), "lean": ("off", "mask3", "null3", "summary"),
                      "inlcall": ("off", "summary_cm"),   # (the default hot build has no site form)
                      "obssm": ("off", "mask3", "null3", "summary", "summary_cm"),
                      "obssm1": ("off", "summary"), "obssmin": ("off", "summary"),
                      "obssm2": ("off", "summary", "summary_cm"), "obssm3": ("off", "summary", "summary_cm"),
                      "obssm4": ("off", "summary", "summary_cm"), "obssm4lazy": ("off", "summary", "summary_cm"),
                      "obssm4desc": ("off", "summary"), "obssm4defer": ("off", "summary", "summary_cm"),
                      "obssm4defer4": ("off", "summary", "summary_cm"), "obssm4multi": ("off", "summary", "summary_cm"),
                      "obssm4idle": ("off", "summary", "summary_cm"), "obssm4split": ("off", "summary", "summary_cm"),
                      "ring4": ("off", "summary", "summary_cm"), "obssm4defer_ring4": ("off", "summary", "summary_cm"),
                      "ring3x24": ("off", "summary", "summary_cm"), "obssm4defer_3x24": ("off", "summary", "summary_cm"),
                      "obssm4defer_w4": ("off", "summary", "summary_cm"), "obssm4defer_w3": ("off", "summary", "summary_cm"),
                      # (null3: the records' capture and push with a program doing nothing -- what the
                      # hot tier costs before its program; session 53: more than the compiled summary,
                      # whose floor is the entry itself: bench/obs_split.py nopush16 / discard16)
                      "obssm4fold": ("off", "null3", "summary", "summary_cm", "summary_cmgen"),
                      "obssm4look": ("off", "summary", "summary_cm"),
                      "obssm4hotobs": ("off", "null3", "summary", "summary_cm"),
                      "offxw": ("off",), "offxr": ("off",), "offxall": ("off",),   # (nothing observes in them)
                      "offxlook": ("off",), "offxsync": ("off",), "offxspin": ("off",),
                      "hotfirst": ("off", "summary"),   # (the hot summary: 1101 hot lines, 165 beyond their ways)
                      "hfxw": ("off",), "hfcopyw": ("off", "summary"), "legacy": ("off", "summary"),
                      "copyinwait": ("off", "summary"), "hottiny": ("off", "summary"),
                      "offcopyw": ("off", "mask3", "null3", "summary", "summary_cm"),
                      "offcopywr": ("off", "mask3", "null3", "summary", "summary_cm"),
                      "pollfence": ("off",)}
#: defines of hook code only: not in a variant's no-hooks build (megakernel.cu #errors with DTMK_NO_HOOKS
#: for some, ignores the others)
HOOK_ONLY_DEFINES = ("DTMK_OSQ_WSHADOW", "DTMK_OSQ_WSHADOW_DEFER",
                     "DTMK_REC_GLOBAL", "DTMK_REC_FAST", "DTMK_VM_CODE_SMEM", "DTMK_HOLD_EAGER", "DTMK_IDEAL_SITE",
                     "DTMK_INL_NOINLINE", "DTMK_SITE_FORM", "DTMK_OBS_SM", "DTMK_OBS_SM_WARPS",
                     "DTMK_OSQ_PUSH_INLINE", "DTMK_OBS_SMS", "DTMK_OSQ_LAZY_PUB", "DTMK_OSQ_DESC",
                     "DTMK_OSQ_DEFER", "DTMK_OSQ_MULTI", "DTMK_OSQ_IDLE_DRAIN", "DTMK_OSQ_SPLIT", "DTMK_HASH_LOOK_FAST",
                     "DTMK_OFFX", "DTMK_OFF_COPY", "DTMK_ONE_WAIT", "DTMK_COPY_IN_WAIT", "DTMK_HOT_OBS")


def nohook_build(defines: tuple):
    """A build variant's no-hooks build: its defines less HOOK_ONLY_DEFINES (legacy's
    DTMK_NO_HOT_FIRST stays, its DTMK_ONE_WAIT goes), or None where nothing is left of a
    variant (it reuses the default's no-hooks build)."""
    kept = tuple(d for d in defines if d.split("=")[0] not in HOOK_ONLY_DEFINES)
    return None if defines and not kept else ("DTMK_NO_HOOKS",) + kept


#: the runs of each build variant (suffixed _<variant>)
BUILD_RUNS = ("off", "mask3", "null3", "summary", "summary_cm")
#: the compiled runs: run -> whether the monitor's map helpers are folded to each map's shape
COMPILED_RUNS = {"summary_cm": True, "summary_cmgen": False}
#: the side-by-side table's columns
TABLE_RUNS = BUILD_RUNS + ("summary_cmgen",)


class Links:
    """A preset's compiled-tier whole-kernel LTO links, run side by side.  One after another
    they took 24-31 s each on the H100 host, ~90 s of a 1b bench's ~2 min before round 1
    (session 51); nvJitLink releases the GIL, so threads overlap them.  add() queues a
    session's link (LiveSession.link_work, fixed at the call); run() links all of them, then
    loads each module on this thread and calls its done(seconds) or failed(exception).
    (Side by side, a link's seconds are not its swap latency: bench/compiled.py has that.)"""

    def __init__(self, workers: int = 0):
        self.todo: list = []
        self.workers = workers

    def add(self, live, done, failed) -> None:
        self.todo.append((live, live.link_work(), done, failed))

    def run(self, log) -> None:
        if not self.todo:
            return
        from concurrent.futures import ThreadPoolExecutor
        import os
        n = self.workers or max(1, min(len(self.todo), os.cpu_count() or 1))
        t0 = time.perf_counter()
        with ThreadPoolExecutor(max_workers=n) as ex:
            futs = [ex.submit(work) for _, work, _, _ in self.todo]
        for (live, _, done, failed), f in zip(self.todo, futs):
            try:
                cubin, secs = f.result()
                live.load_linked(cubin)
            except Exception as e:  # noqa: BLE001 - the caller keeps the other figures
                failed(e)
                continue
            done(secs)
        log(f"{len(self.todo)} compiled-tier links, {n} at a time: {time.perf_counter() - t0:.1f} s")
        self.todo.clear()


def build_variant(cfg, w, defines, mon, null_obj, compiled, log, name: str, links: Links) -> dict:
    """One megakernel build (`defines`) with its own summary session (hot), null3 session
    and compiled-tier kernels: what run() of bench_preset needs for the BUILD_RUNS.
    compiled: the COMPILED_RUNS to link (empty: none), queued on `links`; after
    links.run(), b["cm"][run] holds each one that linked: its megakernel "mk", session
    "live", attachment "aid" and "link_s"."""
    b = {"mk": megakernel(cfg, w, defines)}
    b["mk"].run(2, poison=False)                    # fails here if the SM cannot hold the block
    b["mk"].reset()
    b["live"] = LiveSession(b["mk"])
    b["null"] = LiveSession(b["mk"])
    b["null"].attach(null_obj)
    b["mk"].set_observer(0, None)
    b["cm"] = {}
    for run in compiled or ():
        try:
            mkc = megakernel(cfg, w, defines)
            live = LiveSession(mkc, runtime=linked_runtime(mkc.num_workers, mk=mkc, fold_maps=COMPILED_RUNS[run]))
            aid = live.attach(mon.obj, tier="compiled")
            b["cm"][run] = entry = {"mk": mkc, "live": live, "aid": aid, "link_s": None}
            links.add(live, lambda secs, entry=entry: entry.__setitem__("link_s", secs),
                      lambda e, run=run: (log(f"{name}: compiled tier ({run}) of {defines} unavailable: {e!r}"),
                                          b["cm"].pop(run, None)))
        except Exception as e:  # noqa: BLE001 - keep the hot-tier figures
            log(f"{name}: compiled tier ({run}) of {defines} unavailable: {e!r}")
    return b


def calibrate_observers(bv: dict, mon, steps: int, log) -> dict:
    """--obs-sms calibrate: what `dtrace-mk top --observer-place calibrate` does before a job
    (obs_place.calibrate_session: OBS_CAL candidate sets, two launches each with the hot
    summary attached) on the first observer-SM build; then every build is placed with the
    observers on the chosen SMs (OBS_PIN) for the timed rounds."""
    from dtrace_mk.megakernel.obs_place import calibrate_session
    bn = next((b for b in bv if "DTMK_OBS_SM" in BUILD_VARIANTS[b]), None)
    if bn is None:
        raise RuntimeError("--obs-sms calibrate: no observer-SM build among --variants")
    b = bv[bn]
    b["mk"].reset()
    b["mk"].set_observer(int(b["live"].rt.tables.data.ptr), b["live"].state)
    t0 = time.perf_counter()
    try:
        cal = calibrate_session(b["live"], mon.obj, steps=steps, k=OBS_CAL, progress=log)
    finally:
        b["mk"].set_observer(0, None)
    log(f"observer placement ({bn}, {time.perf_counter() - t0:.1f} s):\n" + "\n".join(cal.lines()))
    OBS_PIN[:] = [cal.best]
    for mk in PLACED:
        mk.place_workers(round_order(0))
    return {"build": bn, "candidates": cal.candidates, "us_per_step": cal.us_per_step, "best": cal.best}


def run_and_build(name: str, builds) -> tuple:
    """A timed run's name -> (run, build variant): "summary_obssm4defer_w4" -> ("summary",
    "obssm4defer_w4"); a default build's run -> (name, None).  The longest build name that
    ends it wins (build names may hold "_", and one may end another)."""
    bn = max((b for b in builds if name.endswith("_" + b)), key=len, default=None)
    return (name[:-len(bn) - 1], bn) if bn else (name, None)


def own_off(times: dict, builds=()) -> dict:
    """Each build's monitors over its own off, launch by launch (benchio.launch_ratios: the
    i-th launches of an interleaved run paired), and each build's off over nohooks:
    {build: {run: {"median", "lo", "hi", "n", "ratios"}}}, "default" for the default build.
    The issue's targets are these ratios; the medians alone hid a +6% launch (session 33:
    the observer SMs are not pinned here, so their GPC-mates change from launch to launch)."""
    from benchio import launch_ratios
    out = {"default": {r: launch_ratios(times, r, "nohooks" if r == "off" else "off")
                       for r in ("off", "off2", "null3", "summary", "summary_cm") if times.get(r)}}
    for bn in builds:
        off = f"off_{bn}"
        row = {"off": launch_ratios(times, off, "nohooks")} if times.get(off) else {}
        row.update({r: launch_ratios(times, f"{r}_{bn}", off) for r in ("null3", "summary") + tuple(COMPILED_RUNS)
                    if times.get(f"{r}_{bn}") and times.get(off)})
        out[bn] = row
    return out


def span_text(rec) -> str:
    """A ratio record ({"median", "lo", "hi"}: benchio.launch_ratios) as "+m% [+lo..+hi]"; "-" for none."""
    return f"{100 * rec['median']:+.2f}% [{100 * rec['lo']:+.2f}..{100 * rec['hi']:+.2f}]" if rec else "-"


def own_off_lines(preset: str, table: dict) -> list:
    """The last table: per build, off over nohooks and the monitors over the build's own off,
    each the median [lowest..highest] of its paired launches."""
    cols = ("off", "null3", "summary") + tuple(COMPILED_RUNS)
    lines = [f"{'preset':<6} {'build':<12} " + " ".join(f"{c + (' /nohooks' if c == 'off' else ' /own off'):>27}" for c in cols)]
    for bn, row in table.items():
        lines.append(f"{preset:<6} {bn:<12} " + " ".join(f"{span_text(row.get(c)):>27}" for c in cols))
    return lines


def round_lines(r: dict) -> list:
    """--placement paired (or several --obs-sms sets): per observer-SM build and round, the SMs
    its observers ran on (the round's order's last entries) beside its monitors over its own
    off in that round -- where the observers sat against what the monitors cost (session 50:
    +1.9% to +7.7%); with several sets, then each set's median [range] over its rounds."""
    sets = pin_sets(r.get("obs_sms", []))
    if not r.get("sm_ids") or not (r.get("placement") == "paired" or (r.get("placement") == "sorted" and len(sets) > 1)):
        return []
    lines = []
    for bn, row in r.get("own_off", {}).items():
        defs = BUILD_VARIANTS.get(bn, ())
        runs = [c for c in ("null3", "summary") + tuple(COMPILED_RUNS) if row.get(c)]
        if "DTMK_OBS_SM" not in defs or not set(runs) - {"null3"}:
            continue
        m = gpu.obs_sms_of(defs)
        n = min(row[c]["n"] for c in runs)
        lines.append(f"{r['preset']:<6} {bn:<12} {'round':>5} {'observer SMs':<20} " + " ".join(f"{c:>13}" for c in runs))
        for k in range(n):
            obs = sorted(round_order(k, r["sm_ids"], sets, r["placement"])[-m:])
            lines.append(f"{r['preset']:<6} {bn:<12} {k:>5} {','.join(map(str, obs)):<20} "
                         + " ".join(f"{100 * row[c]['ratios'][k]:>+12.2f}%" for c in runs))
        if len(sets) < 2:
            continue
        lines.append(f"{r['preset']:<6} {bn:<12} {'set':>5} {'observer SMs':<20} "
                     + " ".join(f"{c + ' median [range]':>27}" for c in runs))
        for i, pins in enumerate(sets):
            per_set = {c: [row[c]["ratios"][k] for k in range(i, n, len(sets))] for c in runs}
            lines.append(f"{r['preset']:<6} {bn:<12} {i:>5} {','.join(map(str, pins)):<20} " + " ".join(
                f"{span_text(x and {'median': statistics.median(x), 'lo': min(x), 'hi': max(x)}):>27}"
                for x in per_set.values()))
    return lines


def target_lines(r: dict) -> list:
    """Issue 5's targets read from one preset's result, each met or not with the figure it was
    read from: medians of launches paired by round (own_off) with their range, the best build
    where several ran (compiled: the shipped summary_cm); off is the default (hook) build's.
    A target with nothing measured says so."""
    t, u = r.get("own_off", {}), r.get("us_per_step", {})
    pct = lambda x: f"{100 * x:+.2f}%"  # noqa: E731
    verdict = lambda ok: "met" if ok else "NOT met"  # noqa: E731

    def best(runs):
        c = [(row[run]["median"], f"{bn} {run}", row[run]) for bn, row in t.items() for run in runs if row.get(run)]
        return min(c, key=lambda x: x[0]) if c else None

    def ranged(rec, target, label=""):
        """(met by the median, the median [range] -- and whether the rounds straddle the target:
        one more run may read the other way)."""
        text = f"{pct(rec['median'])} [{pct(rec['lo'])}..{pct(rec['hi'])}]" + (f", {label}" if label else "")
        return rec["median"] <= target, text + ("; the rounds straddle it" if rec["lo"] <= target < rec["hi"] else "")

    rows = []
    off = t.get("default", {}).get("off")
    rows.append(("off <= 0.5% (hook build / no hooks)", off and ranged(off, 0.005)))
    # compiled: the shipped form (summary_cm, map helpers folded) only -- summary_cmgen is an
    # A/B of the generic helpers, and the lower of two noisy medians read +0.14% where its
    # own run read +2.22% (session 50)
    hot, cm = best(("summary",)), best(("summary_cm",))
    rows.append(("summary hot <= 5% (over its own off)", hot and ranged(hot[2], 0.05, hot[1])))
    rows.append(("summary compiled <= 1%", cm and ranged(cm[2], 0.01, cm[1])))
    trace = u["trace"] / u["off"] - 1 if u.get("trace") and u.get("off") else None
    summ = min(x for x in (hot, cm) if x) if (hot or cm) else None
    rows.append(("summary >= 5x cheaper than the trace", trace is not None and summ and (
        summ[0] <= 0 or trace / summ[0] >= 5,
        f"trace {pct(trace)} / summary {pct(summ[0])} ({summ[1]})"
        + (f" = {trace / summ[0]:.1f}x" if summ[0] > 0 else ""))))
    tw, sw = r.get("trace_wire_bytes_per_step"), r.get("summary_wire_bytes")
    rows.append((">= 100x fewer bytes (wire)", tw and sw and (tw / sw >= 100, f"{tw / sw:.0f}x")))
    a = r.get("attach_cmd_to_first_event_ms_median")
    # a worker loading a generation before the host wrote it: the stamps' clock pairing is off
    # (session 49: -2.7 ms), and so is every latency read from it
    early = [x for x in r.get("attach", []) if x["write_to_first_load_ms"] < -(x["clock_err_us"] + 100) / 1e3]
    rows.append(("hot attach <= 10 ms (command -> first counted event)", "a load before the write: the clock "
                 f"pairing is off ({min(x['write_to_first_load_ms'] for x in early):.3f} ms)" if early else
                 a is not None and (a <= 10, f"{a:.3f} ms")))
    return [f"{r['preset']:<6} {name}: " + ("not measured" if not got else f"not measured: {got}"
                                             if isinstance(got, str) else f"{verdict(got[0])} ({got[1]})")
            for name, got in rows]


def bench_preset(name: str, reps: int, log, compiled: bool = True, builds: tuple = ()) -> dict:
    cfg = PRESETS[name]
    PLACED.clear()
    SM_IDS.clear()
    t_start = time.perf_counter()                   # (progress lines: a run cut off by a timeout says where)
    w = make_weights(cfg, 0)
    steps = STEPS.get(name, 16)
    mk0 = megakernel(cfg, w, ("DTMK_NO_HOOKS",))
    mk = megakernel(cfg, w)
    pad = mk.shared_memory()[0] - mk0.shared_memory()[0]
    for m, what in ((mk0, "nohooks"), (mk, "off")):
        static, dyn, carve = m.shared_memory()
        log(f"{name}: {what} build: smem {static} static + {dyn} dynamic B -> carveout {carve} KB, L1 {256 - carve} KB")
    try:
        mk0p = megakernel(cfg, w, ("DTMK_NO_HOOKS", f"DTMK_SMEM_PAD={pad}"))
    except Exception as e:  # noqa: BLE001 - keep the rest
        log(f"{name}: nohooks_pad unavailable: {e!r}")
        mk0p = None
    live = LiveSession(mk)
    mon = summary(mk.graph.schema, log)
    wires = int(live.rt.tables.data.ptr)
    extra = {}
    # attribution sessions: own tables + state each, attached once (wired per run)
    attrib = {"null3": null_object(mon.obj), "s_end": one_program(mon.obj, "task:end"),
              "s_dep": one_program(mon.obj, "dep:release"), "s_ready": one_program(mon.obj, "task:ready")}
    sess, sess_aid = {}, {}
    for v, obj in attrib.items():
        try:
            sv = LiveSession(mk)
            sess_aid[v] = sv.attach(obj)
            sess[v] = sv
        except Exception as e:  # noqa: BLE001 - keep the rest
            log(f"{name}: attribution variant {v} unavailable: {e!r}")
    mk.set_observer(0, None)
    links = Links()                                 # the compiled tier's links, run side by side below

    def linked(key):
        return lambda secs: extra.__setitem__(key, secs)

    def cm_failed(e):
        nonlocal mkc, mkr
        import traceback
        log(f"{name}: compiled tier unavailable: {e!r}\n{''.join(traceback.format_exception(e))}")
        extra["compiled_error"] = repr(e)
        mkc = mkr = None                            # (the ring form goes with it, as before)

    def ring_failed(e):
        nonlocal mkr
        log(f"{name}: compiled tier (ring) unavailable: {e!r}")
        mkr = None
    mkc = mkr = None
    try:
        if not compiled:
            raise RuntimeError("compiled tier not requested for this preset (--compiled-presets)")                                            # the compiled tier: summary linked into the kernel
        mkc = megakernel(cfg, w)
        livec = LiveSession(mkc, runtime=linked_runtime(mkc.num_workers))
        aidc = livec.attach(mon.obj, tier="compiled")
        links.add(livec, linked("compiled_link_s"), cm_failed)
    except Exception as e:  # noqa: BLE001 - keep the hot-tier figures
        cm_failed(e)
    if mkc is not None:                             # session 8: the compiled tier through the ring
        try:                                        # (summary_cm now runs at the hook sites)
            mkr = megakernel(cfg, w)
            liver = LiveSession(mkr, runtime=linked_runtime(mkr.num_workers, inline=False))
            aidr = liver.attach(mon.obj, tier="compiled")
            links.add(liver, linked("compiled_ring_link_s"), ring_failed)
        except Exception as e:  # noqa: BLE001 - keep the rest
            ring_failed(e)

    def run(variant):
        if variant == "summary_cm":
            mkc.reset()
            return mkc.run(steps, poison=False)
        if variant == "summary_cmring":
            mkr.reset()
            return mkr.run(steps, poison=False)
        m = mk0 if variant == "nohooks" else mk0p if variant == "nohooks_pad" else mk
        m.reset()
        if variant in ("live_idle", "summary"):
            mk.set_observer(wires, live.state)
        elif variant in sess:
            mk.set_observer(int(sess[variant].rt.tables.data.ptr), sess[variant].state)
        elif m is mk:
            mk.set_observer(0, None)
        kw = {}
        if variant == "mask3":
            kw["hooks"] = list(SUMMARY_HOOKS)
        if variant == "trace":
            kw["trace"] = True
        if variant == "ring_all":
            kw["hooks"] = "all"
        return m.run(steps, poison=False, **kw)

    bv = {}
    for bn in builds:                               # build variants (--variants)
        try:
            bv[bn] = build_variant(cfg, w, BUILD_VARIANTS[bn], mon, attrib["null3"],
                                   compiled and [r for r in BUILD_VARIANT_RUNS.get(bn, BUILD_RUNS) if r in COMPILED_RUNS],
                                   log, name, links)
        except Exception as e:  # noqa: BLE001 - keep the rest (e.g. a launch the SM cannot hold)
            log(f"{name}: build variant {bn} unavailable: {e!r}")
    links.run(log)

    def run_build(variant):
        base, bn = run_and_build(variant, bv)
        b = bv[bn]
        if base in COMPILED_RUNS:
            mkc = b["cm"][base]["mk"]
            mkc.reset()
            return mkc.run(steps, poison=False)
        m = b["mk"]
        m.reset()
        if base == "summary":
            m.set_observer(int(b["live"].rt.tables.data.ptr), b["live"].state)
        elif base == "null3":
            m.set_observer(int(b["null"].rt.tables.data.ptr), b["null"].state)
        else:
            m.set_observer(0, None)
        kw = {"hooks": list(SUMMARY_HOOKS)} if base == "mask3" else {}
        return m.run(steps, poison=False, **kw)

    variants = ["nohooks", "off", "off2", "live_idle", "summary", "trace", "ring_all"]
    if mkc is not None:
        variants.append("summary_cm")
    if mkr is not None:
        variants.append("summary_cmring")
    variants += [v for v in attrib if v in sess] + ["mask3"] + (["nohooks_pad"] if mk0p is not None else [])
    for bn, b in bv.items():
        variants += [f"{r}_{bn}" for r in BUILD_VARIANT_RUNS.get(bn, BUILD_RUNS)
                     if r not in COMPILED_RUNS or r in b["cm"]]
    run_default = run

    def run(variant):  # noqa: F811 - the build variants' runs, then the default build's
        if any(variant.endswith("_" + b) for b in bv):
            return run_build(variant)
        return run_default(variant)

    if OBS_CAL:
        extra["obs_calibration"] = calibrate_observers(bv, mon, steps, log)
    times = {v: [] for v in variants}
    toks = {}
    aid = None
    log(f"{name}: builds ready ({time.perf_counter() - t_start:.1f} s): {len(variants)} runs per round, "
        f"{reps} rounds, placement {PLACEMENT}" + (f", observers on SMs {pins_text(OBS_PIN)}" if OBS_PIN else ""))
    for v in variants:                              # warm-up, tokens (summary attached from here on)
        if v == "summary":
            aid = live.attach(mon.obj)
        r = run(v)
        toks[v] = r.tokens
        if v in sess or v == "summary":
            extra.setdefault("obs_counts", {})[v] = obs_counts((sess[v] if v in sess else live).state, steps)
        if v in sess:
            sn = sess[v].snapshot(sess_aid[v])
            extra.setdefault("attrib_coverage", {})[v] = {
                k: sum(getattr(c, k) for c in sn.coverage) for k in ("eligible", "executed", "throttled", "lost")}
        if v == "mask3":
            extra["mask3_records_per_step"] = len(r.hooks) / steps
            extra["mask3_dropped"] = r.hooks_dropped
        if v == "trace":
            extra["trace_bytes_per_step"] = len(r.trace) * gpu.TRACE_BYTES / steps
            extra["trace_wire_bytes_per_step"] = len(trace_wire(r.trace)) / steps
            extra["trace_dropped"] = r.trace_dropped
        if v == "ring_all":
            extra["ring_bytes_per_step"] = len(r.hooks) * 128 / steps
            extra["ring_dropped"] = r.hooks_dropped
        if v == "summary":
            snap = live.snapshot(aid)
            extra["summary_map_bytes"] = map_bytes(snap)
            extra["summary_wire_bytes"] = len(snapshot_wire(snap.maps))
            extra["summary_coverage"] = {k: sum(getattr(c, k) for c in snap.coverage)
                                         for k in ("eligible", "executed", "throttled", "lost")}
            extra["summary_obs"] = {k: int((v_ & np.uint64(0xFFFFFFFF)).sum()) if k == "drains" else int(v_.sum())
                                    for k, v_ in snap.state.items() if k in ("drained", "lost", "drains")}
            hot_counts = {k: sum(v_) for k, v_ in snap.maps["lat"].snapshot().items()}
            extra["summary_forms"] = live.rt.forms(aid)
        for bn, b in bv.items():                   # build variants: attach, then compare counts
            if v == f"summary_{bn}":
                b["aid"] = b["live"].attach(mon.obj)
                r = run(v)
                toks[v] = r.tokens
                sn = b["live"].snapshot(b["aid"])
                extra.setdefault("build_counts_equal_hot", {})[v] = \
                    {k: sum(v_) for k, v_ in sn.maps["lat"].snapshot().items()} == hot_counts
                extra.setdefault("build_coverage", {})[v] = {
                    k: sum(getattr(c, k) for c in sn.coverage) for k in ("eligible", "executed", "throttled", "lost")}
            cm = next((c for r, c in b["cm"].items() if v == f"{r}_{bn}"), None)
            if cm is not None:
                sn = cm["live"].snapshot(cm["aid"])
                extra.setdefault("build_counts_equal_hot", {})[v] = \
                    {k: sum(v_) for k, v_ in sn.maps["lat"].snapshot().items()} == hot_counts
            if v == f"mask3_{bn}":
                extra.setdefault("build_mask3_records_per_step", {})[v] = len(r.hooks) / steps
                if "DTMK_OSQ_WSHADOW" in BUILD_VARIANTS[bn]:   # (its first mask3 launch: the sink's only one yet)
                    from benchio import shadow_sink
                    extra.setdefault("build_shadow", {})[v] = sh = shadow_sink(b["mk"])
                    log(f"{name}: {v} shadow: task:end {sh['n'][0]} (bins {sh['hist']}), dep:release {sh['n'][1]}, "
                        f"task:ready {sh['n'][2]}")
        if v in ("summary_cm", "summary_cmring"):
            snc = (livec if v == "summary_cm" else liver).snapshot(aidc if v == "summary_cm" else aidr)
            cm_counts = {k: sum(v_) for k, v_ in snc.maps["lat"].snapshot().items()}
            extra[f"{v}_counts_equal_hot"] = cm_counts == hot_counts
            extra[f"{v}_coverage"] = {k: sum(getattr(c, k) for c in snc.coverage)
                                      for k in ("eligible", "executed", "throttled", "lost")}
            extra[f"{v}_queue_workers"] = len(snc.maps["queue"].snapshot())
    log(f"{name}: warm-up done ({time.perf_counter() - t_start:.1f} s)")
    # the summary stays attached for its timed runs: detach around the others
    positions = {v: [] for v in variants}
    for rep in range(reps):
        place_round(rep)
        for k, v in enumerate(round_variants(variants, rep)):
            r = run(v)
            times[v].append(r.elapsed_ms * 1e3 / steps)
            toks[v] = r.tokens
            positions[v].append(k)
        log(f"{name}: round {rep + 1}/{reps} ({time.perf_counter() - t_start:.1f} s)")
    extra["order"], extra["positions"] = ORDER, positions   # (each launch's place in its round, by variant)
    # note: the summary attachment is in the tables for every run, but only runs with
    # the observer wired (live_idle, summary) read them: live_idle therefore has it
    # attached too -> re-time live_idle with nothing attached
    live.detach(aid)
    idle = []
    for rep in range(reps):
        place_round(rep)
        idle.append(run("live_idle").elapsed_ms * 1e3 / steps)
        times["off"].append(run("off").elapsed_ms * 1e3 / steps)
    times["live_idle"] = idle
    med = {v: statistics.median(t) for v, t in times.items()}
    base = med["nohooks"]
    out = {"preset": name, "steps_per_launch": steps, "reps": reps, "placement": PLACEMENT, "obs_sms": pin_sets(OBS_PIN),
           "sm_ids": list(SM_IDS),            # (pinned: round r's order is round_order(r) over these)
           "us_per_step": med,
           "all_us_per_step": times,
           "ratio_vs_nohooks": {v: med[v] / base - 1.0 for v in med},
           "summary_vs_off": med["summary"] / med["off"] - 1.0,
           "summary_cm_vs_off": (med["summary_cm"] / med["off"] - 1.0) if "summary_cm" in med else None,
           "attrib_vs_off": {v: med[v] / med["off"] - 1.0 for v in ("summary", "summary_cm",
                                                                   "summary_cmring", "null3",
                                                                   "s_end", "s_dep",
                                                                   "s_ready", "mask3", "trace") if v in med},
           "tokens_equal": {v: bool(np.array_equal(t, toks["nohooks"])) for v, t in toks.items()},
           "tasks": len(mk.graph.tasks), "builds": list(bv),
           "build_link_s": {bn: b["cm"].get("summary_cm", {}).get("link_s") for bn, b in bv.items()},
           "own_off": own_off(times, tuple(bv)), **extra}
    log(json.dumps({k: out[k] for k in ("preset", "us_per_step", "ratio_vs_nohooks", "tokens_equal")}))
    # hot attach latency into a running launch
    lat, mids = [], []
    mk.reset()
    mk.set_observer(wires, live.state)
    live.start(LONG.get(name, 600))
    t0 = time.perf_counter()
    while live.snapshot_steps() < 3 and time.perf_counter() - t0 < 20:
        time.sleep(0.001)
    for k in range(3):
        if not live.running():
            break
        tc = time.perf_counter()
        a = live.attach(mon.obj)
        gen = live.gen
        got = None
        while got is None and time.perf_counter() - tc < 5 and live.running():
            got = live.attach_latency(gen)
        host_ms = (time.perf_counter() - tc) * 1e3
        if got is not None:
            got["host_poll_ms"] = host_ms
            got["attach_call_ms"] = (live.stamps[gen]["written_host"] - (live.stamps[gen]["cmd_dev"] - live.clock_offset)) / 1e6
            lat.append(got)
        mid = live.snapshot(a)
        mids.append((a, mid))
        if got is not None:
            got["mid_snapshot_final_epoch"] = mid.final_epoch
            got["mid_snapshot_steps_done"] = mid.steps_done
        live.detach(a)
        time.sleep(0.02)
    live.mk.abort()
    res = live.wait(raise_on_watchdog=False)
    out["attach"] = lat
    # exactness while running: coverage rows a mid-run snapshot called final never change
    key = lambda c: (c.program, c.epoch, c.program_gen)  # noqa: E731
    row = lambda c: (c.eligible, c.executed, c.throttled, c.lost)  # noqa: E731
    stable = True
    for a, mid in mids:
        end = {key(c): row(c) for c in live.snapshot(a).coverage}
        stable &= all(end.get(key(c)) == row(c) for c in mid.coverage)
    out["final_rows_stable"] = stable if mids else None
    out["attach_run_stopped_by"] = None if res.watchdog is None else res.watchdog["reason"]
    if lat:
        out["attach_write_to_first_event_ms_median"] = statistics.median(x["write_to_first_event_ms"] for x in lat)
        out["attach_cmd_to_first_event_ms_median"] = statistics.median(x["cmd_to_first_event_ms"] for x in lat)
    # the clock pairings' moves (LiveSession.start re-pairs a stale one): (s apart, ns moved)
    out["clock_drift"] = [(round(dt, 1), dns) for dt, dns in live.clock_drift]
    log(json.dumps({"preset": name, "attach": lat, "clock_drift": out["clock_drift"]}))
    mk.set_observer(0, None)

    return out


def bench_offpath(name: str, reps: int, log, builds: tuple) -> dict:
    """--offpath: only the off-path figures, fast (no attribution, compiled tier or attach
    latency).  For the default build and each build variant v (like for like: v's defines
    also in its no-hooks build, less those of HOOK_ONLY_DEFINES; a variant of only those has
    none, it reuses the default's):
    nohooks_v, off_v and summary_v (SUMMARY_QUERY, hot tier) us/step, round-robin over
    --reps; off2 (the default build again) is the noise floor.  Tokens of every run must
    equal the default no-hooks build's."""
    cfg = PRESETS[name]
    steps = STEPS.get(name, 16)
    PLACED.clear()
    SM_IDS.clear()
    specs = {"": ()}
    specs.update({"_" + b: BUILD_VARIANTS[b] for b in builds})
    nohook_defs = {k: nohook_build(v) for k, v in specs.items()}
    todo = {placed(v) for v in specs.values()} | {placed(v) for v in nohook_defs.values() if v is not None}
    t0 = time.perf_counter()
    for defs, (_, err) in gpu.precompile(todo, workers=min(8, len(todo))).items():
        if err is not None:
            raise err
    log(f"{name}: {len(todo)} builds compiled in {time.perf_counter() - t0:.1f} s")
    w = make_weights(cfg, 0)
    mks, lives = {}, {}
    mon = None
    for k, defs in specs.items():
        try:
            mk = megakernel(cfg, w, defs)
            if nohook_defs[k] is not None:
                mks["nohooks" + k] = megakernel(cfg, w, nohook_defs[k])
            mks["off" + k] = mk
            if mon is None:
                mon = summary(mk.graph.schema, log)
            lives[k] = LiveSession(mk)
            lives[k].attach(mon.obj)
            mk.set_observer(0, None)
        except Exception as e:  # noqa: BLE001 - keep the other builds
            log(f"{name}: build {k or 'default'} {defs} unavailable: {e!r}")
    runs = [v for k in specs for v in ("nohooks" + k, "off" + k, "summary" + k) if v in mks or
            (v.startswith("summary") and k in lives and "summary" in BUILD_VARIANT_RUNS.get(k[1:], ("summary",)))]
    runs.insert(runs.index("off") + 1, "off2")
    held = []                      # (--late-modules: loaded, kept, never run)
    if LATE_MODULES:
        # session 62: the table's off reads ~1.2 points above --offpath's on the same cubins, in every round
        # and where only one module runs; the table loads ~20 modules before it times.  The same builds
        # loaded again after K more modules (copies of the off cubin, each its own load) -- does a
        # module's place among the process's loads move its speed?
        from dtrace_mk.megakernel.gpu_build import load_module
        held = [load_module(mks["off"].arch, "megakernel.cu", mks["off"].defines) for _ in range(LATE_MODULES)]
        mks["nohooks_late"], mks["off_late"] = megakernel(cfg, w, nohook_defs[""]), megakernel(cfg, w, ())
        specs["_late"] = ()
        runs += ["nohooks_late", "off_late"]
        log(f"{name}: nohooks_late / off_late loaded after {len(held)} more modules")

    def run(v):
        k = "" if v in ("off2", "off", "summary", "nohooks") else v[v.index("_"):]
        base = v[:len(v) - len(k)] if k else v
        m = mks["off" + k] if base in ("off", "off2", "summary") else mks[v]
        m.reset()
        if base == "summary":
            m.set_observer(int(lives[k].rt.tables.data.ptr), lives[k].state)
        elif base != "nohooks":
            m.set_observer(0, None)
        r = m.run(steps, poison=False)
        if base == "summary":
            m.set_observer(0, None)
        return r

    toks = {v: run(v).tokens for v in runs}          # warm-up, tokens
    times = {v: [] for v in runs}
    for rep in range(reps):
        place_round(rep)
        for v in runs:
            times[v].append(run(v).elapsed_ms * 1e3 / steps)
    med = {v: statistics.median(t) for v, t in times.items()}
    out = {"preset": name, "mode": "offpath", "steps_per_launch": steps, "reps": reps, "placement": PLACEMENT,
           "us_per_step": med,
           "all_us_per_step": times, "builds": [k.lstrip("_") or "default" for k in specs],
           "tokens_equal": {v: bool(np.array_equal(t, toks["nohooks"])) for v, t in toks.items()}}
    log(json.dumps({k: out[k] for k in ("preset", "us_per_step", "tokens_equal")}))
    return out


def print_offpath(res) -> None:
    """The --offpath table: per build, us/step and off/nohooks (issue 5 target <= +0.5%),
    summary/off, off/nohooks(default), the build's own no-hook build over the default's (nh/nh(def):
    what its defines alone do to the no-hook code); off2/off is the noise floor."""
    print(f"\n{res['card']}  {res['date']}  (--offpath, placement {PLACEMENT})")
    print(f"{'preset':<6} {'build':<11} {'nohooks us':>10} {'off us':>8} {'summary us':>10} {'off/nohooks':>11} "
          f"{'sum/off':>8} {'off/nh(def)':>11} {'nh/nh(def)':>10} {'off2/off':>8} tok")
    for r in res["presets"]:
        u = r["us_per_step"]
        for b in r["builds"]:
            k = "" if b == "default" else "_" + b
            nh = u.get("nohooks" + k, u.get("nohooks"))
            f = lambda x: f"{x:>10.1f}" if x is not None else f"{'-':>10}"  # noqa: E731
            rel = lambda a, c: f"{100 * (a / c - 1):+.2f}%" if a is not None and c else "-"  # noqa: E731
            off, sm = u.get("off" + k), u.get("summary" + k)
            tok = all(t for v, t in r["tokens_equal"].items() if (v.endswith(k) if k else "_" not in v))
            print(f"{r['preset']:<6} {b:<11} {f(nh)} {f(off)[2:]} {f(sm)} "
                  f"{rel(off, nh):>11} {rel(sm, off):>8} {rel(off, u.get('nohooks')):>11} "
                  f"{rel(u.get('nohooks' + k), u.get('nohooks')) if k else '':>10} "
                  f"{rel(u.get('off2'), u.get('off')) if not k else '':>8} {tok}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--presets", default="tiny,1b")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", default=".")
    ap.add_argument("--compiled-presets", default="tiny,1b", help="presets that also link the compiled tier")
    ap.add_argument("--variants", default="", help="build variants run side by side: " + ",".join(BUILD_VARIANTS))
    ap.add_argument("--placement", choices=PLACEMENTS, default="hw",
                    help="hw: the hardware's block placement (differs per launch); sorted: every build pins "
                         "worker k to the k-th SM (-DDTMK_SM_WORKER): one placement's cost; paired: one random "
                         "order of the SMs per round, the same for every build")
    ap.add_argument("--obs-sms", default="", metavar="ID,ID,../ID,..",
                    help="with --placement sorted|paired: the SMs (ids) the observer-SM builds' observers run on; "
                         "several sets separated by '/' take turns, set r %% N in round r (one process surveys them: "
                         "the builds and links, ~1 min on 1b, are paid once); calibrate[:K]: measure K "
                         "candidate sets first as `dtrace-mk top --observer sm` does (default 12) "
                         "and pin the cheapest")
    ap.add_argument("--order", choices=("fixed", "shuffled"), default="fixed",
                    help="the variants' order in each timed round of the table: as listed (fixed), or a "
                         "permutation per round seeded by the round (shuffled; each launch's place is in "
                         "hooks.json `positions`)")
    ap.add_argument("--late-modules", type=int, default=0, metavar="K",
                    help="with --offpath: the default's nohooks / off loaded again after K more modules "
                         "(printed as build 'late'): does a module's place among the loads move its speed?")
    ap.add_argument("--offpath", action="store_true",
                    help="only nohooks / off / summary of the default build and each --variants build (fast)")
    a = ap.parse_args(argv)
    bad = [v for v in a.variants.split(",") if v and v not in BUILD_VARIANTS]
    if bad:
        ap.error(f"--variants: unknown {bad}; known: {sorted(BUILD_VARIANTS)}")
    from benchio import run_presets
    global OBS_CAL
    cal = re.fullmatch(r"calibrate(?::(\d+))?", a.obs_sms)
    if cal:
        from dtrace_mk.megakernel.obs_place import CANDIDATES_DEFAULT
        OBS_CAL = int(cal.group(1) or CANDIDATES_DEFAULT)
        if a.placement == "hw" or not OBS_CAL:
            ap.error("--obs-sms calibrate[:K]: K >= 1 candidate sets, with --placement sorted or paired")
        a.obs_sms = ""
    try:
        pins = [[int(x) for x in g.split(",") if x.strip()] for g in a.obs_sms.split("/") if g.strip()]
    except ValueError:
        ap.error(f"--obs-sms: SM ids separated by commas, sets by '/', got {a.obs_sms!r}")
    if pins and a.placement == "hw":
        ap.error("--obs-sms: with --placement sorted or paired (the hardware's placement pins nothing)")
    if any(len(set(p)) != len(p) for p in pins):
        ap.error(f"--obs-sms: distinct SM ids in each set, got {a.obs_sms!r}")
    if any(not p for p in pins) or len({len(p) for p in pins}) > 1:
        ap.error(f"--obs-sms: every set names the same number of SMs, got {a.obs_sms!r}")
    if len(pins) > a.reps:
        ap.error(f"--obs-sms: {len(pins)} sets need at least as many rounds (--reps {a.reps})")
    if a.late_modules and not a.offpath:
        ap.error("--late-modules: with --offpath")
    if a.late_modules < 0:
        ap.error(f"--late-modules: a count >= 0, got {a.late_modules}")
    global PLACEMENT, ORDER, LATE_MODULES
    PLACEMENT, ORDER, LATE_MODULES = a.placement, a.order, a.late_modules
    OBS_PIN[:] = pins
    builds = tuple(v for v in a.variants.split(",") if v)
    if a.offpath:                                    # round 7: the off path only, per build
        res = run_presets(a.out, "hooks", a.presets, lambda p, log: bench_offpath(p, a.reps, log, builds))
        print_offpath(res)
        return 0
    res = run_presets(a.out, "hooks", a.presets,
                      lambda p, log: bench_preset(p, a.reps, log, p in a.compiled_presets.split(","), builds))
    print(f"\n{res['card']}  {res['date']}  placement {PLACEMENT}" + (f", observers on SMs {pins_text(OBS_PIN)}" if OBS_PIN else ""))
    print(f"{'preset':<6} {'nohooks us':>10} {'off':>7} {'off2':>7} {'idle':>7} {'summary':>8} {'sum-cm':>7} {'trace':>7} "
          f"{'ring':>7} {'sum-vs-off':>10} {'trace B/st':>10} {'sum B':>7} {'attach ms':>9} tok exact")
    for r in res["presets"]:
        q = r["ratio_vs_nohooks"]
        pct = lambda x: f"{100 * x:+.2f}%"  # noqa: E731
        print(f"{r['preset']:<6} {r['us_per_step']['nohooks']:>10.1f} {pct(q['off']):>7} {pct(q['off2']):>7} "
              f"{pct(q['live_idle']):>7} {pct(q['summary']):>8} {pct(q['summary_cm']) if 'summary_cm' in q else '-':>7} "
              f"{pct(q['trace']):>7} {pct(q['ring_all']):>7} "
              f"{pct(r['summary_vs_off']):>10} {r.get('trace_bytes_per_step', 0):>10.0f} "
              f"{r.get('summary_map_bytes', 0):>7} {r.get('attach_write_to_first_event_ms_median', float('nan')):>9.3f} "
              f"{all(r['tokens_equal'].values())} {r.get('final_rows_stable')}")
    # the short table: each variant against its own baseline (issue 5 targets: off/nohooks
    # <= +0.5%, summary_hot/off <= +5%); off2/off is the noise floor of this run
    print(f"\n{'preset':<6} {'off/nohooks':>11} {'off2/off':>9} {'sum_hot/off':>11} {'sum_cm/off':>10} {'cmring/off':>10} "
          f"{'trace/off':>9} {'trace B/st':>10} {'ring B/st':>10} {'sum map B':>9} {'drains':>7} tok")
    for r in res["presets"]:
        u = r["us_per_step"]
        rel = lambda a, b: f"{100 * (u[a] / u[b] - 1):+.2f}%" if a in u and b in u else "-"  # noqa: E731
        print(f"{r['preset']:<6} {rel('off', 'nohooks'):>11} {rel('off2', 'off'):>9} {rel('summary', 'off'):>11} "
              f"{rel('summary_cm', 'off'):>10} {rel('summary_cmring', 'off'):>10} {rel('trace', 'off'):>9} "
              f"{r.get('trace_bytes_per_step', 0):>10.0f} "
              f"{r.get('ring_bytes_per_step', 0):>10.0f} {r.get('summary_map_bytes', 0):>9} "
              f"{r.get('summary_obs', {}).get('drains', '-'):>7} {all(r['tokens_equal'].values())}")
    for r in res["presets"]:     # bytes, like for like: the trace per step vs one summary snapshot
        tw, sw = r.get("trace_wire_bytes_per_step"), r.get("summary_wire_bytes")
        if tw and sw:
            print(f"{r['preset']:<6} bytes: trace {r['trace_bytes_per_step']:.0f} B/step raw, {tw:.0f} wire; summary "
                  f"{r['summary_map_bytes']} B map entries, {sw} wire per snapshot: {tw / sw:.0f}x fewer on the wire "
                  f"({r['trace_bytes_per_step'] / r['summary_map_bytes']:.0f}x raw)")
    for r in res["presets"]:                          # session 8: the compiled tier's two forms are exact
        if "summary_forms" in r:
            print(f"{r['preset']:<6} summary (hot)   forms {r['summary_forms']}")
        for v in ("summary_cm", "summary_cmring"):
            if f"{v}_counts_equal_hot" in r:
                print(f"{r['preset']:<6} {v:<15} lat counts == hot: {r[f'{v}_counts_equal_hot']}  "
                      f"coverage {r.get(f'{v}_coverage')}  queue workers {r.get(f'{v}_queue_workers')}")
    # attribution of the summary's cost (each % over off; drains / publishes per step
    # per worker that took records, from one launch of the variant)
    print(f"\n{'preset':<6} {'off/nohooks':>11} {'pad/nohooks':>11} {'off/pad':>9}   (off cost = smem/carveout x code)")
    for r in res["presets"]:
        u = r["us_per_step"]
        rel = lambda a, b: f"{100 * (u[a] / u[b] - 1):+.2f}%" if a in u and b in u else "-"  # noqa: E731
        print(f"{r['preset']:<6} {rel('off', 'nohooks'):>11} {rel('nohooks_pad', 'nohooks'):>11} "
              f"{rel('off', 'nohooks_pad'):>9}")
    cols = ("summary", "summary_cm", "summary_cmring", "null3", "s_end", "s_dep", "s_ready", "mask3", "trace")
    print(f"\n{'preset':<6} " + " ".join(f"{c:>10}" for c in cols) + "   drains/st/w publishes/st/w records/st")
    for r in res["presets"]:
        a = r.get("attrib_vs_off", {})
        oc = r.get("obs_counts", {})
        dr = " ".join(f"{v}={oc[v]['drains_per_step_worker']:.2f}" for v in ("summary", "null3", "s_end", "s_dep",
                                                                             "s_ready") if v in oc)
        pb = " ".join(f"{v}={oc[v]['publishes_per_step_worker']:.2f}" for v in ("summary", "null3") if v in oc)
        rc = " ".join(f"{v}={oc[v]['records_per_step']:.0f}" for v in ("summary", "null3") if v in oc)
        print(f"{r['preset']:<6} " + " ".join(f"{100 * a[c]:>+9.2f}%" if c in a else f"{'-':>10}" for c in cols)
              + f"   {dr} | {pb} | {rc}")
    # build variants side by side (--variants): each % over the DEFAULT build's off
    if any(r.get("builds") for r in res["presets"]):
        print(f"\n{'preset':<6} {'build':<10} " + " ".join(f"{c:>10}" for c in ("nohooks",) + TABLE_RUNS)
              + f" {'off/nohooks':>11}  counts==hot tok")
        for r in res["presets"]:
            u = r["us_per_step"]
            pct = lambda v: f"{100 * (u[v] / u['off'] - 1):>+9.2f}%" if v in u else f"{'-':>10}"  # noqa: E731
            print(f"{r['preset']:<6} {'default':<10} {pct('nohooks')} " + " ".join(pct(c) for c in TABLE_RUNS)
                  + f" {100 * (u['off'] / u['nohooks'] - 1):>+10.2f}%")
            for bn in r.get("builds", []):
                eq = r.get("build_counts_equal_hot", {})
                ok = all(eq.get(f"{c}_{bn}", True) for c in ("summary",) + tuple(COMPILED_RUNS))
                tok = all(t for v, t in r["tokens_equal"].items() if v.endswith("_" + bn))
                offb = f"off_{bn}"
                ratio = f"{100 * (u[offb] / u['nohooks'] - 1):>+10.2f}%" if offb in u else f"{'-':>11}"
                print(f"{r['preset']:<6} {bn:<10} {'':>10} " + " ".join(pct(f"{c}_{bn}") for c in TABLE_RUNS)
                      + f" {ratio}  {ok} {tok}")
    # last: what the issue's targets are measured on, with the launches' range
    print("\neach build over its own off (monitors) and off over nohooks: median [lowest..highest] of launches paired by round")
    for i, r in enumerate(res["presets"]):
        for line in own_off_lines(r["preset"], r.get("own_off", {}))[(1 if i else 0):]:
            print(line)
    rl = [line for r in res["presets"] for line in round_lines(r)]
    if rl:
        print("\nper round (--placement paired, or --obs-sms sets): where each observer-SM build's observers ran, "
              "its monitors over its own off")
        print("\n".join(rl))
    print("\nissue 5's targets (this run)")
    for r in res["presets"]:
        print("\n".join(target_lines(r)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
