"""Compiled tier, the runtimes: tables with compiled slots and the promotion protocol.

GPU: `CompiledRuntime` = DeviceRuntime whose launches run kernels/bpf_compiled_harness.cu
linked with the current monitor; `attach(..., tier="compiled")` or `promote(aid)` (the
tier swap: see dtrace_mk/runtime/tiers.py for the policy and the handover rules).

CPU: `HostCompiledRuntime`, the same interface over the g++ build of the same monitor
source (compiled.host): maps, tables and coverage in the device layouts in host memory,
events fired serially as the harness does -- the differential test without a GPU.
"""
from __future__ import annotations

from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np

from ...abi import definition as abi
from ...errors import UserError
from .. import device as D
from .host import HostDevice, host_library
from .link import HARNESS_SPEC, STAGE_FAST, STAGE_LTO, BuildTimes, build_linked
from .translator import HOOK_IDS, MapShape, MonitorProgram, monitor_source

PROG_F_COMPILED = 1                   # kernels/bpf_prog_flags.h DTMK_PROG_F_COMPILED
PROG_F_INLINE = D.PROG_F_INLINE



def _monitor_programs(entries: Iterable[Tuple[object, object]], cm_ids: Dict[int, int],
                      fold_maps: bool = True) -> List[MonitorProgram]:
    """MonitorProgram per (attachment, _DevProg), cm_id = cm_ids[id(_DevProg)]; programs
    the inline form can run get it too (the table flag decides which form runs).
    fold_maps: each map's shape of constants (else every helper call is the generic one)."""
    out = []
    for att, dp in entries:
        recs = D.encode_program(dp.program.insns, att.maps.desc_addrs, att.maps.value_addrs, dp.program.name,
                                dp.facts.extremum_stores)
        plan = dp.facts.plan
        addrs = att.maps.desc_addrs
        shadow = {addrs[i]: im for i, im in plan.maps.items()} if plan.ok else None
        shapes = {addrs[i]: MapShape.of(att.maps.host_descs[i]) for i in range(len(addrs))} if fold_maps else {}
        out.append(MonitorProgram(dp.program.hook.id, cm_ids[id(dp)], f"{att.id}:{dp.program.name}", recs,
                                  dp.max_insns, dp.stack_depth, shadow, shapes))
    return out


class _CompiledMixin:
    """Table publishing with compiled slots, cm_id bookkeeping, the promotion protocol of
    dtrace_mk.runtime.tiers (prepare_promotion / commit_promotion)."""

    inline_tier = True    # compiled programs that qualify run at the hook site (megakernel)
    #: map helpers folded to each map's shape (kernels/bpf_map_ops.cuh); False: the generic
    #: helpers, as before session 38 (bench/hooks.py measures the two side by side)
    fold_maps = True
    #: a compiled program that also has descriptors runs them (the host build's test of
    #: the descriptor form); else its compiled code (the compiled tier as promised)
    desc_over_compiled = False

    def _cm_init(self) -> None:
        self._cm_id: Dict[int, int] = {}          # id(_DevProg) -> cm_id (compiled, in the tables)
        self._cm_reserved: Dict[int, int] = {}    # id(_DevProg) -> cm_id (promotion being built)
        self._next_cm = 0
        self._tier: Dict[int, str] = {}           # attachment -> "compiled" (absent: "hot")
        self.installed_stage = 0                  # stage of the loaded module (0: none/host)

    def attachments(self) -> List[int]:
        return list(self._atts)

    def runs_inline(self, att, dp) -> bool:
        """A compiled program runs in the inline form (kernels/bpf_inline.cuh) when the
        runtime allows it (`inline_tier`), its plan qualifies and every event runs it
        (no sampling, no rate limit: those need the warp's tickets)."""
        return (self.inline_tier and att.sample_every <= 1 and att.max_per_epoch is None
                and dp.facts.plan.ok)

    def forms(self, aid: int) -> Dict[str, str]:
        """How each program of a compiled attachment runs: "inline", or "ring: <why>"
        (the inline plan's reason, the runtime's choice, sampling or a rate limit); a hot
        one (or descriptors over compiled code): DeviceRuntime.forms'."""
        att = self._atts[aid]
        out = {}
        hot = super().forms(aid)                 # not compiled: DeviceRuntime's forms
        for dp in att.progs:
            if id(dp) not in self._cm_id or (dp.descs is not None and self.desc_over_compiled):
                out[dp.program.name] = hot[dp.program.name]
                continue
            if self.runs_inline(att, dp):
                out[dp.program.name] = "inline"
                continue
            plan = dp.facts.plan
            why = (plan.reason if not plan.ok else "the runtime runs compiled programs through the ring"
                   if not self.inline_tier else "sampling / a rate limit needs the warp's tickets")
            out[dp.program.name] = f"ring: {why}"
        return out

    def tier(self, aid: int) -> str:
        return self._tier.get(aid, "hot")

    def _compiled_entries(self, extra: Optional[int] = None) -> List[Tuple[object, object]]:
        out = []
        for hid in HOOK_IDS:
            for (a, d) in self._by_hook[hid]:
                if id(d) in self._cm_id or (extra is not None and a.id == extra):
                    out.append((a, d))
        return out

    def monitor(self, extra: Optional[int] = None, stage: int = STAGE_LTO) -> str:
        """The monitor source for what is compiled now (plus attachment `extra`, whose
        programs take their reserved cm_ids), for a build of `stage`.  Stage 1 -- the swap,
        on the promotion's critical path -- keeps the generic map helpers: folding the maps'
        shapes adds about a third to the monitor's relocatable compile (session 38: 150 ->
        200 ms on the 2-core box); stage 2 (the background LTO build that replaces it)
        folds them when `fold_maps`."""
        ids = dict(self._cm_id)
        if extra is not None:
            for dp in self._atts[extra].progs:
                ids.setdefault(id(dp), self._cm_reserved.get(id(dp), -1))
        fold = self.fold_maps and stage != STAGE_FAST
        return monitor_source(_monitor_programs(self._compiled_entries(extra), ids, fold))

    def _reserve(self, aid: int) -> None:
        for dp in self._atts[aid].progs:
            if id(dp) not in self._cm_id and id(dp) not in self._cm_reserved:
                self._cm_reserved[id(dp)] = self._next_cm
                self._next_cm += 1

    DEFAULT_TIER = "hot"

    def attach(self, obj, verify: bool = True, *, tier: Optional[str] = None, **kw) -> int:
        """Attach like DeviceRuntime; tier "compiled" also marks the programs compiled
        (same program_gen as a hot attach), "hot" leaves them to the VM until promoted."""
        tier = tier or self.DEFAULT_TIER
        if tier not in ("hot", "compiled"):
            raise UserError(f"tier must be 'hot' or 'compiled', got {tier!r}")
        aid = super().attach(obj, verify, **kw)
        if tier == "compiled":
            self._mark_compiled(aid)
            for hid in self._hooks_of(aid):
                self._publish(hid)
        return aid

    def _mark_compiled(self, aid: int) -> None:
        self._reserve(aid)
        for dp in self._atts[aid].progs:
            if id(dp) not in self._cm_id:
                self._cm_id[id(dp)] = self._cm_reserved.pop(id(dp))
        self._tier[aid] = "compiled"

    def _fill_slot(self, e, att, dp) -> None:
        """DeviceRuntime's slot plus the compiled flag, cm_id and inline flag."""
        super()._fill_slot(e, att, dp)
        cm = self._cm_id.get(id(dp))
        if cm is not None:
            e["flags"] |= PROG_F_COMPILED | (cm << 16)
            if dp.descs is not None and not self.desc_over_compiled:   # compiled: the program's code
                e["flags"] = int(e["flags"]) & ~(PROG_F_INLINE | D.PROG_F_DESC | D.PROG_F_LEAN)
                e["descs"], e["n_descs"] = 0, 0
            if self.runs_inline(att, dp):
                e["flags"] |= PROG_F_INLINE

    def _hooks_of(self, aid: int) -> List[int]:
        return sorted({dp.program.hook.id for dp in self._atts[aid].progs})

    # -- promotion protocol (dtrace_mk.runtime.tiers) --------------------------------------
    def prepare_promotion(self, aid: int) -> Tuple[str, object]:
        """Fix what the build will contain (cm_ids reserved, the monitor source) on the
        calling thread; returns (key, work): work() does the host-only build and may run on
        any thread; key identifies the compiled set it was built for."""
        if aid not in self._atts:
            raise KeyError(f"no attachment {aid}")
        self._reserve(aid)
        src = self.monitor(extra=aid, stage=STAGE_FAST)
        return src, self._build_work(src, STAGE_FAST)

    def prepare_optimize(self) -> Optional[Tuple[str, object]]:
        """Stage 2: (key, work) for the full LTO build of what is compiled now, or None
        when there is nothing to improve (nothing compiled, or the loaded module is
        already the LTO one for this monitor).  work() may run on any thread."""
        src = self.monitor()
        if not self._cm_id or (self.installed_stage == STAGE_LTO and self._installed_src() == src):
            return None
        return src, self._build_work(src, STAGE_LTO)

    def commit_optimize(self, key: str, artifact: object) -> bool:
        """At a launch boundary: load the stage-2 module built for `key` and republish
        every hook with a compiled program under a new program_gen (so the events of the
        stage-1 and stage-2 modules fall in distinct coverage rows, g+1 and g+2).  False
        (nothing changed) when the compiled set moved on since prepare_optimize."""
        if not self._cm_id or self.monitor() != key:
            return False
        self._install(key, artifact)
        hooks = sorted({dp.program.hook.id for a in self._atts.values() for dp in a.progs if id(dp) in self._cm_id})
        for hid in hooks:
            self._gen[hid] += 1
            self._publish(hid)
        return True

    def _installed_src(self) -> Optional[str]:
        return getattr(self, "_module_src", None) or getattr(self, "_lib_src", None)

    def commit_promotion(self, aid: int, key: str, artifact: object) -> bool:
        """At a launch boundary: take the built artifact, mark the attachment's programs
        compiled and publish their hooks under a new program_gen.  False (nothing changed)
        when the attachment is gone or the compiled set moved on since prepare."""
        if (aid not in self._atts or self.tier(aid) == "compiled"
                or self.monitor(extra=aid, stage=STAGE_FAST) != key):
            return False
        self._install(key, artifact)
        self._mark_compiled(aid)
        for hid in self._hooks_of(aid):
            self._gen[hid] += 1
            self._publish(hid)
        return True

    def promote(self, aid: int) -> bool:
        """prepare + build + commit now (the next launch runs compiled)."""
        key, work = self.prepare_promotion(aid)
        return self.commit_promotion(aid, key, work())

    def _build_work(self, src: str, stage: int = STAGE_LTO):
        raise NotImplementedError

    def _install(self, src: str, artifact: object) -> None:
        raise NotImplementedError


class HostCompiledRuntime(_CompiledMixin, D.DeviceRuntime):
    """The compiled tier on the CPU (g++), DeviceRuntime's interface: attach (every
    program compiled), fire(records) serially (the harness's serial mode), maps(aid),
    coverage(aid).  Maps, tables and coverage are the device layouts in host memory."""

    def __init__(self, num_workers: int = 1, *, max_insns: int = abi.MAX_INSNS, clock_from_ctx: bool = True,
                 opt: str = "-O1", inline: bool = False, descriptors: bool = False, defines: Sequence[str] = (),
                 lean_domains=None):
        if num_workers < 1:
            raise ValueError("num_workers must be >= 1")
        self.opt = opt                          # g++ optimisation level of the host build
        self.defines = tuple(defines)           # ... and its -D options (the device code's opt-in variants)
        # inline: qualifying programs run as the megakernel's hook site runs them (shadow
        # flushed at the end of every fire(): the epoch end); else as the harness does.
        # descriptors: programs that reduce run from their descriptors there instead (the
        # descriptor form of kernels/bpf_inline.cuh, on the host)
        # lean_domains: programs whose keys are dense run in the lean form (its banks per
        # worker, folded at the end of every fire())
        self.inline_tier = inline
        self.descriptors = descriptors
        self.desc_over_compiled = descriptors or lean_domains is not None
        self._lean_init(lean_domains)
        self.cp = HostDevice
        self.num_workers = num_workers
        self.max_insns = max_insns
        self.code_cap = 1 << 30
        self.flags = D.FLAG_CLOCK_FROM_CTX if clock_from_ctx else 0
        self.host_tables = np.zeros(D.NUM_HOOKS, dtype=D.HOOK_TABLE_DTYPE)
        self.tables = HostDevice.asarray(self.host_tables.view(np.uint8))
        self.status = HostDevice.zeros(4, np.uint64)
        self._gen = {h.id: 0 for h in abi.HOOKS}
        self._by_hook = {h.id: [] for h in abi.HOOKS}
        self._atts, self._detached = {}, {}
        self._next = 1
        self._cm_init()
        self._lib = None
        self._lib_src: Optional[str] = None

    # HostCompiledRuntime: compiled at attach (the host has no interpreter: a "hot"
    # attachment is refused by fire() until promoted; for the promotion protocol's tests).
    DEFAULT_TIER = "compiled"

    def _build_work(self, src: str, stage: int = STAGE_LTO):
        return lambda: (host_library(src, self.opt, self.defines), stage)

    def prepare_optimize(self):
        # the host build has one stage; the protocol still runs (a "stage 2" artifact is
        # the same library) so the handover rows of stage 1 -> 2 can be checked on the CPU
        src = self.monitor()
        if not self._cm_id or self.installed_stage == STAGE_LTO and self._lib_src == src:
            return None
        return src, self._build_work(src, STAGE_LTO)

    def _install(self, src: str, artifact: object) -> None:
        if isinstance(artifact, tuple):
            artifact, self.installed_stage = artifact
        self._lib, self._lib_src = artifact, src

    def fire(self, records, **kw) -> D.FireBatch:
        if isinstance(records, (list, tuple)):
            blob = b"".join(bytes(r) for r in records)
        else:
            blob = bytes(records)
        if len(blob) % abi.CONTEXT_SIZE:
            raise UserError(f"context records: {len(blob)} bytes is not a multiple of {abi.CONTEXT_SIZE}")
        ev = np.frombuffer(blob, np.uint8).copy()
        n = len(blob) // abi.CONTEXT_SIZE
        words = ev.reshape(-1, abi.CONTEXT_SIZE).view("<u4") if n else np.zeros((0, 32), "<u4")
        hooks = words[:, 1].copy()
        bad = np.flatnonzero((hooks < 1) | (hooks > abi.MAX_HOOK_ID))
        if bad.size:
            raise UserError(f"context record {int(bad[0])}: field 'hook': {int(hooks[bad[0]])} is not a hook id")
        badw = np.flatnonzero(words[:, 6] >= self.num_workers)
        if badw.size:
            raise UserError(f"context record {int(badw[0])}: field 'worker': {int(words[badw[0], 6])} is out "
                            f"of range for {self.num_workers} workers")
        hot = [f"{a.id}:{d.program.name}" for hid in HOOK_IDS for a, d in self._by_hook[hid] if id(d) not in self._cm_id]
        if hot:
            raise UserError(f"host compiled tier: {', '.join(hot)} not compiled (no interpreter on the host); "
                            f"promote first")
        src = self.monitor(stage=self.installed_stage or STAGE_LTO)   # (the installed stage's form)
        if self._lib_src != src:
            self._install(src, host_library(src, self.opt, self.defines))
        r0 = np.zeros(max(n, 1) * D.MAX_PROGS, np.uint64)
        out = np.zeros(max(n, 1) * D.MAX_PROGS, np.uint8)
        if n:
            rc = self._lib.dtmk_host_fire(self.tables.ctypes.data, ev.ctypes.data, n, r0.ctypes.data,
                                          out.ctypes.data, self.flags)
            if rc:
                raise UserError("host compiled tier: a table slot is not compiled (no interpreter on the host)")
        slots = {hid: [(a.id, d.program.name) for a, d in ents] for hid, ents in self._by_hook.items()}
        return D.FireBatch(slots, hooks, r0.reshape(-1, D.MAX_PROGS)[:n], out.reshape(-1, D.MAX_PROGS)[:n])


class CompiledRuntime(_CompiledMixin, D.DeviceRuntime):
    """DeviceRuntime whose launches run kernels/bpf_compiled_harness.cu linked with the
    monitor of every program marked compiled (CuPy + GPU); hot programs run in the VM of
    the same kernel.  `attach(..., tier="compiled")` compiles at attach (same program_gen
    as a hot attach); `promote(aid)` / the tiers.TierManager protocol swap a hot one in
    at the next launch under a new program_gen.  `last_build`: what the last build cost."""

    def __init__(self, num_workers: int = 1, *, link_stage: int = STAGE_LTO, **kw):
        super().__init__(num_workers, **kw)
        self._cm_init()
        self.arch = kw.get("arch") or self._arch()
        self.link_stage = link_stage        # what ensure_module builds (promotions: stage 1)
        self.last_build: Optional[BuildTimes] = None
        self._module_src: Optional[str] = None
        src = self.monitor(stage=self.link_stage)
        self._install(src, self._build_work(src, self.link_stage)())

    def _arch(self) -> str:
        cc = self.cp.cuda.Device().compute_capability
        return f"sm_{cc}a" if cc == "90" else f"sm_{cc}"

    def _build_work(self, src: str, stage: int = STAGE_LTO):
        arch = self.arch
        return lambda: build_linked(src, HARNESS_SPEC, stage, arch)

    def _install(self, src: str, artifact) -> None:
        path, times = artifact
        if src == self._module_src and times.stage == self.installed_stage:
            return
        self.last_build = times
        self.installed_stage = times.stage
        self.module = self.cp.RawModule(path=str(path))
        self.kernel = self.module.get_function("dtmk_compiled_harness")
        self.kernel.max_dynamic_shared_size_bytes = self.smem_bytes(D.MAX_WARPS)
        self._module_src = src

    # CompiledRuntime: hot (device VM) by default; "compiled" takes effect from the next
    # launch, whose module is built once for everything attached compiled since.
    DEFAULT_TIER = "hot"
    inline_tier = False   # the harness runs records, it has no hook site

    def ensure_module(self) -> Optional[BuildTimes]:
        """Build and load the module for what is compiled now, if it changed (launch()
        does this first).  Returns the build's times, None when nothing changed."""
        src = self.monitor(stage=self.link_stage)
        if src == self._module_src:
            return None
        self._install(src, self._build_work(src, self.link_stage)())
        return self.last_build

    def launch(self, *a, **kw) -> None:
        self.ensure_module()
        super().launch(*a, **kw)

    def detach(self, aid: int) -> None:
        super().detach(aid)
        self._tier.pop(aid, None)
        for dp in self._detached[aid].progs:
            self._cm_id.pop(id(dp), None)
            self._cm_reserved.pop(id(dp), None)
        # the loaded module keeps the detached programs' code until the next build: the
        # tables no longer name their cm_ids, so it never runs (no relink on detach)
