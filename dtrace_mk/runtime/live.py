"""Host side of a RUNNING megakernel: hot attach / detach and live map streaming.

    from dtrace_mk.megakernel import gpu
    from dtrace_mk.runtime.live import LiveSession, summary_monitor
    mk = gpu.Megakernel(cfg, batch=1)
    live = LiveSession(mk)
    live.start(steps=500)                    # one long launch, returns at once
    aid = live.attach(summary_monitor().obj) # verified, written while the kernel runs
    snap = live.snapshot(aid)                # maps + coverage, read from a side stream
    live.detach(aid)
    res = live.wait()                        # gpu.RunResult; snapshots are exact now

How it works (kernels/mk_observer.cuh, the observer part of megakernel.cu):

* `DeviceRuntime(harness=False)` owns the hook tables (`dtmk_hook_table[11]`, a seqlock
  generation each), maps and coverage in device memory.  The megakernel gets the tables'
  address and a per-worker observer state array through control words at launch.
* attach = verify (the verifier's max_path_insns becomes the per-event instruction
  bound: a monitor cannot hang the kernel), allocate maps and code by host-to-device
  copies on a non-blocking side stream (no kernel launches: the megakernel holds every
  SM), write the hook table under its seqlock, then write the host's attach stamp and
  bump the global generation control[CTL_GEN].  Every worker re-reads the control words
  every `refresh` tasks and every 16 polls of a dependency wait; on a new generation
  warp 0 first runs the records it holds under the old tables, then copies the new
  tables into shared memory and sets the enable bits of hooks with programs.
  detach is the same write with the programs removed.
* Snapshot consistency: SEQUENCE NUMBERS, not double buffering.  A snapshot reads, in
  this order, the step counter (steps finished), every worker's OBS_PENDING (the lowest
  decode step of a record it holds but has not yet run and flushed), then the maps and
  coverage.  `final_epoch = min(steps finished, min pending) - 1`: every epoch (decode
  step) up to it is complete and its coverage rows and step-keyed map entries are exact
  (each drain flushes coverage and fences before it clears OBS_PENDING).  Rows of later
  epochs are partial (`Snapshot.partial`); after `wait()` everything is final.
* Attach latency: the host converts its clock to the device's %globaltimer (calibrated
  by a tiny kernel before the launch), writes that stamp with the generation bump, and
  each worker records the ts_ns of the first event it counted under the new tables
  (OBS_FIRST_TS).  `attach_latency(gen)` = earliest such event - stamp.
"""
from __future__ import annotations

import importlib
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..bpf.coverage import Coverage
from ..bpf.maps import MapSet
from ..bpf.program import BpfObject
from ..errors import Rejected, UserError

#: The built-in summary monitor of `dtrace-mk top` and bench/hooks.py: per task class
#: latency histogram, dependency-wait sum and count, ready-queue depth maximum.
SUMMARY_QUERY = """\
task:end { @lat[task.class] = hist(task.dur_ns); }
dep:release { @dep_wait[task.class] = sum(dep.wait_ns); }
task:ready { @queue[worker] = max(queue.depth); }
"""


#: control[CTL_GEN_DUE] of a change no gate need load (a detached window past its end)
NEVER_DUE = 0xFFFFFFFF


def lean_domains(mk):
    """The dense key domains of a megakernel's hook records (descform.LeanDomains): its task
    classes, layers and experts, for the lean form (-DDTMK_LEAN_SITE)."""
    from .descform import LeanDomains
    return LeanDomains.of_model(len(mk.graph.schema.task_classes), mk.cfg.n_layers, mk.cfg.n_experts)


def summary_monitor(schema=None):
    """The summary monitor compiled by dtrace_mk.lang (a CompileResult: .obj, .plan)."""
    from ..lang.pipeline import compile_query
    return compile_query(SUMMARY_QUERY, schema, name="<dtrace-mk summary>")


def link_megakernel(monitor_src: str, arch: str = "sm_90a", stage: int = 2,
                    defines: Sequence[str] = ()) -> Tuple[bytes, float]:
    """The compiled tier in the megakernel: megakernel.cu built with -DDTMK_COMPILED_TIER
    (hook sites call dtmk_cm_run_records) + the monitor
    (dtrace_mk.runtime.compiled.monitor_source) -> one cubin.  stage 2: full LTO (the
    monitor inlined; seconds); stage 1: the kernel's cached relocatable cubin + the
    monitor's own cubin, no LTO (~0.1 s; compiled.build_linked).  Returns (cubin, seconds
    spent building and linking).  `defines`: the Megakernel's (compiled.megakernel_spec)."""
    from .compiled import build_linked, megakernel_spec
    t0 = time.perf_counter()
    path, _ = build_linked(monitor_src, megakernel_spec(defines), stage, arch)
    return path.read_bytes(), time.perf_counter() - t0


TIERS = ("hot", "compiled", "auto")


def linked_runtime(num_workers: int, mk=None, inline: bool = True, fold_maps: bool = True, **kw):
    """A DeviceRuntime (no harness) whose table slots can run compiled: attach(...,
    tier="compiled") marks them; LiveSession.link_compiled() builds the kernel.  With `mk`
    (a gpu.Megakernel) it also speaks the promotion protocol of runtime.tiers: builds are
    megakernel links (stage 1 / stage 2) and installing one loads it into `mk` for its
    next launch.  inline: compiled programs that qualify run at the hook site
    (kernels/bpf_inline.cuh); False: every compiled program takes records (ring + drain).
    fold_maps: map helpers folded to each map's shape (compiled._CompiledMixin.fold_maps)."""
    from .compiled import _CompiledMixin, build_linked, megakernel_spec
    from .device import DeviceRuntime
    spec = megakernel_spec(getattr(mk, "defines", ()))   # e.g. the -DDTMK_REC_GLOBAL build
    # the observer SM's kernels have no site form: its warps run every program, compiled
    # or not, over the records (megakernel.cu "observer SM")
    site_form = not getattr(mk, "obs_sm", False)

    class LinkedRuntime(_CompiledMixin, DeviceRuntime):
        def __init__(self):
            kw.setdefault("descriptors", site_form)      # linked kernels have the site form
            DeviceRuntime.__init__(self, num_workers, harness=False, clock_from_ctx=False, **kw)
            self._cm_init()
            self.inline_tier = inline and site_form
            self.fold_maps = fold_maps
            self.mk = mk
            self._module_src: Optional[str] = None
            self.last_build = None

        def attach(self, obj, verify: bool = True, *, tier: str = "hot", **akw) -> int:
            if tier not in ("hot", "compiled"):
                raise UserError(f"tier must be 'hot' or 'compiled', got {tier!r}")
            aid = DeviceRuntime.attach(self, obj, verify, **akw)
            if tier == "compiled":
                self._mark_compiled(aid)
                for hid in self._hooks_of(aid):
                    self._publish(hid)
            return aid

        def detach(self, aid: int) -> None:
            DeviceRuntime.detach(self, aid)
            self._tier.pop(aid, None)
            for dp in self._detached[aid].progs:
                self._cm_id.pop(id(dp), None)
                self._cm_reserved.pop(id(dp), None)

        def _build_work(self, src: str, stage: int = 2):
            arch = mk.arch if mk is not None else "sm_90a"
            return lambda: build_linked(src, spec, stage, arch)

        def _install(self, src: str, artifact) -> None:
            if mk is None:
                raise UserError("linked_runtime: promotions need the Megakernel (linked_runtime(n, mk=...))")
            path, times = artifact
            mk.load_cubin(path.read_bytes(), tag=f"cm_s{times.stage}")
            self.installed_stage, self._module_src, self.last_build = times.stage, src, times

    return LinkedRuntime()


class AttachRefused(UserError):
    """An object the running kernel will not take (the kernel keeps running)."""


@dataclass
class Snapshot:
    maps: MapSet
    coverage: List[Coverage]            # rows of epochs <= final_epoch (exact)
    partial: List[Coverage]             # rows of later epochs (still counting)
    steps_done: int                     # decode steps finished (absolute)
    final_epoch: int                    # -1: none yet
    state: Dict[str, np.ndarray] = field(default_factory=dict)   # observer words per worker


RECALIBRATE_S = 1.0      # start() pairs the clocks again when the last pairing is older (~7 round trips)


_CLOCKS: Dict[int, object] = {}    # device id -> its GpuClock (kernel, stream, pinned word), made once


def _calibrate(reps: int = 7) -> Tuple[int, int]:
    """(offset, uncertainty) in ns: device %globaltimer ~= host time.time_ns() + offset
    (the min-round-trip pairing of megakernel.gpu_clock, against the wall clock that
    attach commands are stamped with)."""
    import cupy as cp
    from ..megakernel.gpu_clock import GpuClock, best_pair
    dev = cp.cuda.Device().id
    if dev not in _CLOCKS:
        _CLOCKS[dev] = GpuClock(rounds=reps, host_clock=time.time_ns)
    # (best_pair, not GpuClock.pair: a session re-pairs at every stale start, keeping no history)
    p = best_pair(_CLOCKS[dev].read_once() for _ in range(reps))
    return p.device_ns - p.host_ns, p.bound_ns


class LiveSession:
    """Attach, detach and read monitors in a megakernel while it runs (module doc)."""

    def __init__(self, mk, *, refresh: int = 16, watchdog_ms: int = 2000, runtime=None, tier: str = "hot",
                 policy=None, background: bool = True):
        """tier: "hot" (device VM only), "compiled" (every attach is promoted at the next
        launch boundary: start()), "auto" (promoted when `policy`, a tiers.TierPolicy, says
        hot enough).  Promotions link stage 1 inside start() (~0.1 s once the kernel's
        relocatable cubin is cached); with `background` the full-LTO stage 2 builds on a
        worker thread and is swapped in at a later start().  Swaps happen only at
        start(): a running launch keeps the module and tables it started with."""
        import cupy as cp
        from ..megakernel import gpu
        from .device import DeviceRuntime
        if tier not in TIERS:
            raise UserError(f"tier must be one of {', '.join(TIERS)}, got {tier!r}")
        self.cp, self.mk, self.gpu = cp, mk, gpu
        self.refresh, self.watchdog_ms = refresh, watchdog_ms
        self.tier = tier
        if runtime is None and tier != "hot":
            runtime = linked_runtime(mk.num_workers, mk=mk)
        self.rt = runtime or DeviceRuntime(mk.num_workers, clock_from_ctx=False, harness=False,
                                           descriptors=gpu.runs_descriptors(mk.defines),
                                           lean_domains=lean_domains(mk) if gpu.lean_site(mk.defines) else None)
        self.tiers = None
        if tier != "hot":
            from concurrent.futures import ThreadPoolExecutor
            from .tiers import TierManager, TierPolicy
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="dtmk-lto") if background else None
            self.tiers = TierManager(self.rt, policy or TierPolicy(), executor=self._executor, inline_stage1=True)
        self.state = cp.asarray(np.zeros((mk.num_workers, gpu.OBS_WORDS), np.uint64))
        mk.set_observer(int(self.rt.tables.data.ptr), self.state)
        self.side = cp.cuda.Stream(non_blocking=True)
        # what DeviceRuntime.attach imports lazily, imported now: the first hot attach of a
        # session otherwise paid ~10 ms of imports (H200, session 16: 21 ms vs 6 ms)
        for mod in (".aggdesc", ".descform", ".inline", "..abi.context"):
            importlib.import_module(mod, __package__)
        self.gen = 0
        self.stamps: Dict[int, Dict[str, int]] = {}     # gen -> host/device stamps
        self.handle = None
        self.clock_drift: List[Tuple[float, int]] = []    # (seconds since the last pairing, offset change ns)
        self._calibrate_clock()
        self._pinned = cp.cuda.alloc_pinned_memory(64)
        self._word = np.frombuffer(self._pinned, np.uint32, 16)
        self._due = 0                  # control[CTL_GEN_DUE] last written

    def link_compiled(self, stage: int = 2) -> float:
        """Relink the megakernel with the programs attached tier="compiled" (needs
        runtime=linked_runtime(...)); used from the next launch.  stage 2 (default): full
        LTO, the monitor inlined (what bench/hooks.py measures); stage 1: the fast
        relocatable link.  Returns build seconds."""
        cubin, secs = self.link_work(stage)()
        self.load_linked(cubin, stage)
        return secs

    def link_work(self, stage: int = 2):
        """link_compiled's host half for the programs attached now: a callable returning
        (cubin, build seconds) that may run on any thread (nvJitLink releases the GIL:
        bench/hooks.py runs its whole-kernel links side by side); load_linked loads it."""
        src, arch, defines = self.rt.monitor(stage=stage), self.mk.arch, self.mk.defines
        return lambda: link_megakernel(src, arch, stage, defines)

    def load_linked(self, cubin, stage: int = 2) -> None:
        """link_compiled's device half: the linked module runs from the next launch."""
        self.mk.load_cubin(cubin, tag=f"cm_s{stage}")

    def boundary(self) -> List[int]:
        """A launch boundary of the tier manager (start() calls it): start promotions the
        policy asks for, swap in finished builds (stage 1 or 2).  Returns the attachments
        promoted now.  Only between launches."""
        if self.tiers is None:
            return []
        if self.running():
            raise UserError("LiveSession.boundary: a launch is still running (swaps happen between launches)")
        return self.tiers.boundary()

    def tier_status(self) -> Dict[int, str]:
        """attachment -> "hot", "building", "compiled/s1" or "compiled/s2"."""
        out = {}
        for aid in self.rt._atts:
            st = self.tiers.state.get(aid, "hot") if self.tiers else "hot"
            if getattr(self.rt, "tier", None) and self.rt.tier(aid) == "compiled":
                st = f"compiled/s{getattr(self.rt, 'installed_stage', 0)}"
            out[aid] = st
        return out

    def close(self) -> None:
        ex = getattr(self, "_executor", None)
        if ex is not None:
            ex.shutdown(wait=False, cancel_futures=True)

    # -- the run ----------------------------------------------------------------------
    def _calibrate_clock(self) -> None:
        """Pair the device clock with the host's (attach stamps are host time + offset)."""
        offset, self.clock_err = _calibrate()
        now = time.monotonic()
        if hasattr(self, "clock_offset"):
            self.clock_drift.append((now - self._calibrated_at, offset - self.clock_offset))
        self.clock_offset, self._calibrated_at = offset, now

    def start(self, steps: int, **kw) -> None:
        """Launch `steps` decode steps in one launch; returns at once."""
        if self.handle is not None and not self.mk.done(self.handle):
            raise UserError("LiveSession.start: a launch is still running")
        # a pairing goes stale: it moved +0.61..+0.68 ms over 132-145 s of launches on one H100
        # and -1.8..-2.0 ms over 83-96 s on another (session 50: +4.7 / -21 ppm); re-paired here
        if time.monotonic() - self._calibrated_at > RECALIBRATE_S:
            self._calibrate_clock()
        self.boundary()
        kw.setdefault("refresh", self.refresh)
        kw.setdefault("watchdog_ms", self.watchdog_ms)
        # nothing attached: run the build without hook code; the first attach hands the
        # running job over to the hook build (Megakernel(handoff=True), megakernel.cu)
        if (getattr(self.mk, "handoff_ok", False) and self.tiers is None and not self.rt._atts
                and not kw.get("hooks")):
            kw.setdefault("lean", True)
        self.handle = self.mk.start(steps, **kw)

    def running(self) -> bool:
        return self.handle is not None and not self.mk.done(self.handle)

    def wait(self, host_timeout_s: float = 120.0, raise_on_watchdog: bool = True):
        """Wait for the launch; returns its gpu.RunResult."""
        if self.handle is None:
            raise UserError("LiveSession.wait: nothing was started")
        res = self.mk.finish(self.handle, host_timeout_s=host_timeout_s, raise_on_watchdog=raise_on_watchdog)
        return res

    # -- attach / detach --------------------------------------------------------------
    def attach(self, obj, *, tier: Optional[str] = None, **kw) -> int:
        """Verify and attach `obj` (a BpfObject) to the running kernel; returns its id.
        A rejected, malformed or wrong-ABI object raises AttachRefused and nothing
        reaches the device; the running job continues.  It always starts in the hot tier
        (the running module has no code for it); `tier` (default: the session's)
        "compiled" promotes it at the next start(), "auto" when the policy says so.
        tier="compiled" on a session built with runtime=linked_runtime(...) and
        tier="hot" keeps the old meaning: marked compiled now, link_compiled() links.
        follows: an attachment whose promotion this one follows (TierManager.follow)."""
        t_cmd = time.time_ns()
        follows = kw.pop("follows", None)
        want = tier or self.tier
        if want not in TIERS:
            raise UserError(f"tier must be one of {', '.join(TIERS)}, got {want!r}")
        if self.tiers is None and want == "compiled" and hasattr(self.rt, "prepare_promotion"):
            kw["tier"] = "compiled"               # link_compiled() flow (bench/hooks.py)
        elif self.tiers is None and want != "hot":
            raise UserError(f"attach: tier {want!r} needs LiveSession(mk, tier='compiled' or 'auto')")
        if not isinstance(obj, BpfObject):
            raise AttachRefused(f"attach refused: expected a BpfObject, got {type(obj).__name__} "
                                f"(the running kernel continues)")
        # comm:* sites exist only in a tensor-parallel megakernel (ranks > 1: mk_comm.cuh)
        tp = getattr(getattr(self.mk, "graph", None), "ranks", 1) > 1
        bad = [] if tp else [p for p in obj.programs if p.hook.name.startswith("comm:")]
        if bad:
            raise AttachRefused(f"attach refused: {obj.path}: {bad[0].section} {bad[0].name}: a single-GPU "
                                f"megakernel has no {bad[0].hook.name} hook site (only a tensor-parallel one, "
                                f"ranks > 1, has) (the running kernel continues)")
        try:
            with self.side:
                aid = self.rt.attach(obj, verify=True, **kw)
        except (Rejected, UserError) as e:
            raise AttachRefused(f"attach refused: {e} (the running kernel continues)") from None
        due = int(kw.get("first_epoch") or 0)     # it counts from there: loaded by that step's gate
        if self.tiers is not None and want == "compiled":
            self.tiers.request(aid)
        elif self.tiers is not None and tier == "hot":      # asked for by name: never promoted
            self.tiers.pin(aid)
        elif self.tiers is not None and follows is not None:
            self.tiers.follow(aid, follows)
        self._bump(t_cmd, due)
        if getattr(self.mk, "handoff_ok", False) and self.running():
            self.mk.handoff(self.handle)     # a lean grid running: the hook build takes over
        return aid

    def rearm(self, aid: int, first_epoch: int, replaces: Optional[int] = None) -> None:
        """Attachment `aid` (ended, or attached parked) counts again from `first_epoch`,
        `replaces` stops there (runtime.reference.rearmed_hooks): one table change, loaded
        by that step's gate.  No build, no swap: compiled code reads its slot's epochs."""
        t_cmd = time.time_ns()
        with self.side:
            self.rt.rearm(aid, first_epoch, replaces=replaces)
        self._bump(t_cmd, int(first_epoch))

    def detach(self, aid: int) -> None:
        t_cmd = time.time_ns()
        if aid not in self.rt._atts:
            raise UserError(f"detach: no attachment {aid}")
        end = self.rt._get(aid).end_epoch
        with self.side:
            self.rt.detach(aid)
        # a window that counts nothing more (its end passed): no worker need load the
        # change at a gate; else it stops counting from the first unstarted step on
        self._bump(t_cmd, NEVER_DUE if end and end <= self._unstarted() else 0)

    def _unstarted(self) -> int:
        fn = getattr(self.mk, "unstarted_step", None)
        return int(fn()) if fn is not None and self.running() else 0

    def loaded_gen(self) -> int:
        """Every worker runs tables of this generation or a later one (their OBS_GEN; with no
        launch running: the last, which the next launch loads at its start)."""
        if not self.running():
            return self.gen
        return int(self.read_state()[:, self.gpu.OBS_NAMES.index("gen")].min())

    def _bump(self, t_cmd: int, due: int = 0) -> None:
        """Write the step the change is due at, the attach stamp, then the next global
        generation (side stream).  due (control[CTL_GEN_DUE], resident launches): the
        first step whose gate must load the new tables; before it workers load them only
        in idle time (mk_observer.cuh O.lazy, obs_sync OBS_AT_GATE).  0: at the next gate.  A change some worker
        has not loaded yet keeps its earlier due."""
        gpu, cp = self.gpu, self.cp
        # (the workers' generations are read only when they matter: not on an attach due at
        # once, whose latency the read would add to)
        if due > self._due and self.loaded_gen() < self.gen:
            due = self._due
        self._due = due
        self.gen += 1
        t_write = time.time_ns()
        stamp = t_write + self.clock_offset
        self._word[0], self._word[1] = stamp & 0xFFFFFFFF, stamp >> 32
        self._word[2] = self.gen
        self._word[3] = due
        ctl = int(self.mk.buf["control"].data.ptr)
        src = self._pinned.ptr
        h2d = cp.cuda.runtime.memcpyHostToDevice
        # stream order: the due before the generation that it belongs to
        cp.cuda.runtime.memcpyAsync(ctl + 4 * gpu.CTL_GEN_DUE, src + 12, 4, h2d, self.side.ptr)
        cp.cuda.runtime.memcpyAsync(ctl + 4 * gpu.CTL_STAMP, src, 8, h2d, self.side.ptr)
        cp.cuda.runtime.memcpyAsync(ctl + 4 * gpu.CTL_GEN, src + 8, 4, h2d, self.side.ptr)
        self.side.synchronize()
        self.stamps[self.gen] = {"cmd_dev": t_cmd + self.clock_offset, "write_dev": stamp,
                                 "written_host": time.time_ns()}

    # -- reading while it runs -------------------------------------------------------
    def snapshot_steps(self) -> int:
        """Decode steps finished so far (absolute), read on the side stream."""
        g = self.mk.graph
        with self.side:
            return int(self.mk.buf["events"][g.step_event:g.step_event + 1].get(stream=self.side)[0])

    def read_state(self) -> np.ndarray:
        with self.side:
            st = self.state.get(stream=self.side)
        return st

    def attach_latency(self, gen: Optional[int] = None) -> Optional[Dict[str, float]]:
        """For generation `gen` (default: the last): ms from the attach command and from
        the generation write to the first event counted under it (device clock), and to
        the first worker that loaded it.  None while no worker counted an event yet."""
        gen = gen or self.gen
        st = self.read_state()
        s = self.stamps[gen]
        mine = st[:, 3] == gen
        first = st[mine, 5]
        first = first[first > 0]
        if not first.size:
            return None
        f = int(first.min())
        loaded = int(st[mine, 4].min())
        return {"cmd_to_first_event_ms": (f - s["cmd_dev"]) / 1e6,
                "write_to_first_event_ms": (f - s["write_dev"]) / 1e6,
                "write_to_first_load_ms": (loaded - s["write_dev"]) / 1e6,
                "workers_loaded": int(mine.sum()), "clock_err_us": self.clock_err / 1e3,
                "clock_age_s": round(time.monotonic() - self._calibrated_at, 3)}

    def _final_epoch(self) -> Tuple[int, int, np.ndarray]:
        """(steps done, final_epoch, observer state): every epoch <= final_epoch is
        complete and flushed (module doc).  Reads on the side stream."""
        g = self.mk.graph
        ev = self.mk.buf["events"]
        steps_done = int(ev[g.step_event:g.step_event + 1].get(stream=self.side)[0])
        st = self.state.get(stream=self.side)
        pend = st[:, 0]
        lowest = int(pend.min()) if pend.size else (1 << 64) - 1
        return steps_done, min(steps_done, lowest) - 1, st

    def final_epoch(self) -> int:
        """Every epoch <= this is complete and flushed (-1: none yet); the side stream."""
        with self.side:
            return self._final_epoch()[1]

    def retire_complete(self) -> int:
        """Retire the device tables' per-epoch slots (coverage rows, rate-limit and ring
        budget slots) of every complete epoch (<= final_epoch), while the kernel runs or
        after it: a resident launch serves more steps than the tables hold epochs
        (DeviceRuntime.retire_epochs).  Returns the coverage rows retired."""
        if not self.rt.holds_epochs():
            return 0                      # nothing attached: no device reads
        with self.side:
            _, final, _ = self._final_epoch()
            if final < 0:
                return 0
            return self.rt.retire_epochs(final, stream=self.side)

    def snapshot(self, aid: int) -> Snapshot:
        """Maps and coverage of attachment `aid`, read on the side stream while the
        kernel runs (module doc: consistent up to final_epoch)."""
        with self.side:
            steps_done, final, st = self._final_epoch()
            att = self.rt._get(aid)
            maps = att.maps.readback()
            full, partial = [], []
            from .device import COV_DTYPE, coverage_rows
            for dp in att.progs:
                c = dp.cov.get(stream=self.side).view(COV_DTYPE)[0]
                for cv in coverage_rows(dp, c):
                    if cv.epoch <= final:
                        cv.check()
                        full.append(cv)
                    else:
                        partial.append(cv)
        full.sort(key=lambda c: (c.program, c.epoch, c.program_gen))
        partial.sort(key=lambda c: (c.program, c.epoch, c.program_gen))
        names = self.gpu.OBS_NAMES
        return Snapshot(maps, full, partial, steps_done, final,
                        {n: st[:, i].copy() for i, n in enumerate(names)})
