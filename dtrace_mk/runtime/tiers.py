"""Tiering: promote hot (interpreted) monitors to the compiled tier, swapping at launch
boundaries, with no lost or double-counted events.

Policy (`TierPolicy`): an attachment is *hot enough* once every one of its programs
has executed in at least `min_epochs` distinct epochs, or once its programs together
executed at least `min_events` events (whichever comes first; coverage rows are the
measure, so sampling and rate limits count what actually ran).  `max_failures` builds
that fail leave it in the hot tier for good (the error is kept in `TierManager.errors`).

Handover (what `TierManager.boundary()` guarantees; it is the only place a swap happens):

1. Decide.  At a launch boundary the manager reads coverage; a hot-enough attachment
   gets a build *prepared* (`runtime.prepare_promotion(aid)`: the monitor source for
   "what is compiled now + this attachment" is fixed and cm_ids reserved on the calling
   thread) and *run* (NVRTC + nvJitLink, pure host work: on a worker thread when the
   manager has an executor, inline otherwise).  The kernel keeps running the VM program
   meanwhile: nothing on the device changes.
2. Swap.  At the first boundary after the build finished (the same boundary when the
   build ran inline) - after launch j completed
   (stream order) and before launch j+1 is enqueued - `runtime.commit_promotion(aid,
   artifact)` loads the linked module that launch j+1 will use and publishes the hook
   tables with the program's slot marked compiled under program_gen g+1 (the VM slot was
   gen g).  If the compiled set changed since the build was prepared (another attach,
   detach or promotion), the artifact is stale: it is dropped and a new build prepared.
3. Count.  Every event belongs to exactly one launch, and every block of a launch reads
   the hook table once, at its start, under the table's seqlock; tables and module only
   change between launches.  So each event runs either the VM program (counted in the
   rows of gen g) or the compiled one (gen g+1), never both, never neither.  Both tiers
   count into the attachment's one coverage buffer and one set of maps: one logical
   attachment whose rows for g and g+1 add up to every eligible event.

A running persistent megakernel is the same with "launch" read as "relaunch": the
compiled tier needs the module that is linked in, so it takes effect when the kernel
is next launched; until then the hot tier keeps counting.

Two stages (runtime.compiled "Two-stage builds").  The promotion build of step 1 is
stage 1: a precompiled relocatable kernel cubin linked with the monitor's own cubin
(~0.1 s, the hook call a real call).  After a stage-1 swap the manager prepares stage 2
(`runtime.prepare_optimize()`: the full LTO link of the same compiled set, the monitor
inlined; seconds) and runs it on the executor (or inline when `optimize=True` without
one; `optimize=None`, the default, builds stage 2 only with an executor).  It swaps
exactly like step 2: at the first boundary after it finished, `runtime.commit_optimize`
loads it and republishes every hook with a compiled program under a new program_gen
(g+1 -> g+2), so step 3's argument holds for this swap too; an inline stage-2 build
commits at the NEXT boundary (at least one launch runs the stage-1 module).  A stage-2
build whose compiled set changed (a promotion, attach or detach since) is stale and
dropped, and a new one is prepared; a failed one leaves stage 1 running (`opt_errors`).
"""
from __future__ import annotations

from concurrent.futures import Executor, Future
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Protocol, Tuple

HOT, BUILDING, READY, COMPILED, FAILED = "hot", "building", "ready", "compiled", "failed"


@dataclass(frozen=True)
class TierPolicy:
    min_epochs: int = 3
    min_events: int = 100_000
    max_failures: int = 1

    def __post_init__(self):
        if self.min_epochs < 1 or self.min_events < 1 or self.max_failures < 1:
            raise ValueError("TierPolicy: min_epochs, min_events and max_failures must be >= 1")

    def hot_enough(self, rows) -> bool:
        """rows: coverage rows (bpf.coverage.Coverage) of one attachment (every tier)."""
        epochs: Dict[str, set] = {}
        total = 0
        for c in rows:
            if c.executed:
                epochs.setdefault(c.program, set()).add(c.epoch)
            total += c.executed
        if total >= self.min_events:
            return True
        progs = {c.program for c in rows}
        return bool(progs) and all(len(epochs.get(p, ())) >= self.min_epochs for p in progs)


class TieredRuntime(Protocol):
    """What the manager needs from a runtime (CompiledRuntime; fakes in the tests)."""

    def attachments(self) -> List[int]: ...
    def tier(self, aid: int) -> str: ...
    def coverage(self, aid: int) -> list: ...
    def prepare_promotion(self, aid: int) -> Tuple[Any, Callable[[], Any]]: ...
    def commit_promotion(self, aid: int, key: Any, artifact: Any) -> bool: ...


@dataclass
class _Job:
    key: Any
    future: Optional[Future] = None
    result: Any = None
    error: Optional[BaseException] = None
    done: bool = False


@dataclass
class TierManager:
    """Drives promotions.  Call `boundary()` between launches (after the previous launch
    is enqueued and before the next one; the host side of a launch boundary), from the
    thread that launches.  `executor` (e.g. a ThreadPoolExecutor(1)) runs builds in the
    background (the swap happens at the first boundary after the build finished);
    without one a build runs inside boundary() and swaps at that same boundary."""
    runtime: Any
    policy: TierPolicy = field(default_factory=TierPolicy)
    executor: Optional[Executor] = None
    state: Dict[int, str] = field(default_factory=dict)
    errors: Dict[int, List[str]] = field(default_factory=dict)
    swaps: List[Tuple[int, int]] = field(default_factory=list)    # (aid, boundary index)
    optimize: Optional[bool] = None       # stage 2: None = with an executor only
    inline_stage1: bool = False           # stage-1 builds inside boundary() even with an executor
    optimized: List[int] = field(default_factory=list)            # boundaries of stage-2 swaps
    opt_errors: List[str] = field(default_factory=list)
    _jobs: Dict[int, _Job] = field(default_factory=dict)
    _forced: set = field(default_factory=set)
    _pinned: set = field(default_factory=set)
    _follows: Dict[int, int] = field(default_factory=dict)       # aid -> its leader
    _opt: Optional[_Job] = None
    _opt_failed: set = field(default_factory=set)
    _n: int = 0

    def request(self, aid: int) -> None:
        """Promote `aid` at the next boundary whatever the policy says (tier "compiled")."""
        self._forced.add(aid)

    def follow(self, aid: int, leader: int) -> None:
        """Promote `aid` whenever `leader` is compiled, whatever its own coverage (a parked
        twin, which counts nothing until it is armed: runtime/device_query.py); in one
        boundary `leader` (attached first) swaps in before `aid` is prepared."""
        self._follows[aid] = leader

    def pin(self, aid: int) -> None:
        """Keep `aid` hot whatever the policy says (attached with tier "hot" on a session
        that promotes: e.g. the agent's summary windows, attached and detached every few
        steps, which a promotion would relaunch the resident kernel for each time)."""
        self._pinned.add(aid)
        self._forced.discard(aid)

    def boundary(self) -> List[int]:
        """One launch boundary: start builds for attachments that became hot enough, then
        swap in every build that has finished (an inline build finishes here, so it swaps
        at this boundary -- before the next one of this boundary is prepared, which then
        includes it: attachments promoted together all swap at one boundary, none stale).
        Returns the attachments swapped now."""
        self._n += 1
        self._finish_optimize()
        live = set(self.runtime.attachments())
        self._forced &= live
        self._pinned &= live
        self._follows = {a: b for a, b in self._follows.items() if a in live}
        for aid in list(self.state):
            if aid not in live:                       # detached (maybe while building)
                self.state.pop(aid, None)
                self._jobs.pop(aid, None)
        swapped: List[int] = []
        for aid in sorted(live):                      # (a leader, attached first, before its followers)
            if self.runtime.tier(aid) == "compiled":
                self.state[aid] = COMPILED
                self._forced.discard(aid)
                continue
            self.state.setdefault(aid, HOT)
            if self._wants_build(aid, self.runtime.coverage):
                self._start(aid)
                if self._jobs[aid].done:              # built inline: swapped in now, so the next
                    self._settle(aid, swapped)        # build of this boundary includes it
        for aid in sorted(self._jobs):
            job = self._jobs[aid]
            if job.future is not None and job.future.done() and not job.done:
                try:
                    job.result = job.future.result()
                except BaseException as e:            # noqa: BLE001 - kept as the attachment's error
                    job.error = e
                job.done = True
            if job.done:
                self._settle(aid, swapped)
        self._start_optimize()
        return swapped

    def _settle(self, aid: int, swapped: List[int]) -> None:
        """A finished build of `aid`: swapped in (appended to `swapped`), failed, or stale."""
        job = self._jobs.pop(aid)
        if job.error is not None:
            self._failed(aid, job.error)
        elif self.runtime.commit_promotion(aid, job.key, job.result):
            self.state[aid] = COMPILED
            self._forced.discard(aid)
            self.swaps.append((aid, self._n))
            swapped.append(aid)
        else:                                         # stale: the compiled set moved on; next
            self.state[aid] = HOT                     # boundary prepares a new build

    def _wants_build(self, aid: int, coverage: Callable[[int], list]) -> bool:
        """A hot attachment with no build running that is requested, follows a compiled
        leader, or is hot enough."""
        leader = self._follows.get(aid)
        return (self.state.get(aid, HOT) == HOT and aid not in self._jobs and aid not in self._pinned
                and (aid in self._forced or (leader is not None and self.runtime.tier(leader) == "compiled")
                     or self.policy.hot_enough(coverage(aid))))

    def swap_pending(self, coverage: Optional[Callable[[int], list]] = None) -> bool:
        """Would the next boundary() swap code in or start a build: a finished build, or
        a hot attachment that is requested or hot enough (an inline build swaps at that
        boundary)?  A resident launch ends its segment for it.  `coverage` reads an
        attachment's coverage (default runtime.coverage: e.g. a side-stream read while
        the kernel runs)."""
        def finished(j: Optional[_Job]) -> bool:
            return j is not None and (j.done or (j.future is not None and j.future.done()))
        if finished(self._opt) or any(finished(j) for j in self._jobs.values()):
            return True
        cov = coverage or self.runtime.coverage
        return any(self.runtime.tier(aid) != "compiled" and self._wants_build(aid, cov)
                   for aid in self.runtime.attachments())

    # -- stage 2 ----------------------------------------------------------------------
    def _optimizing(self) -> bool:
        if not hasattr(self.runtime, "prepare_optimize"):
            return False
        return self.executor is not None if self.optimize is None else bool(self.optimize)

    def _finish_optimize(self) -> None:
        """Swap in a finished stage-2 build (first boundary after it finished)."""
        job = self._opt
        if job is None:
            return
        if job.future is not None and job.future.done() and not job.done:
            try:
                job.result = job.future.result()
            except BaseException as e:                # noqa: BLE001
                job.error = e
            job.done = True
        if not job.done:
            return
        self._opt = None
        if job.error is not None:
            self.opt_errors.append(f"{type(job.error).__name__}: {job.error}")
            self._opt_failed.add(job.key)
        elif self.runtime.commit_optimize(job.key, job.result):
            self.optimized.append(self._n)
        # else stale: _start_optimize prepares one for the current set

    def _start_optimize(self) -> None:
        if self._opt is not None or self._jobs or not self._optimizing():
            return
        prep = self.runtime.prepare_optimize()
        if prep is None or prep[0] in self._opt_failed:
            return
        key, work = prep
        job = _Job(key)
        self._opt = job
        if self.executor is not None:
            job.future = self.executor.submit(work)
            return
        try:                                          # inline: commits at the next boundary
            job.result = work()
        except BaseException as e:                    # noqa: BLE001
            job.error = e
        job.done = True

    def _start(self, aid: int) -> None:
        key, work = self.runtime.prepare_promotion(aid)
        job = _Job(key)
        self._jobs[aid] = job
        self.state[aid] = BUILDING
        if self.executor is not None and not self.inline_stage1:
            job.future = self.executor.submit(work)
            return
        try:
            job.result = work()
        except BaseException as e:                    # noqa: BLE001
            job.error = e
        job.done = True
        self.state[aid] = READY

    def _failed(self, aid: int, err: BaseException) -> None:
        errs = self.errors.setdefault(aid, [])
        errs.append(f"{type(err).__name__}: {err}")
        self.state[aid] = FAILED if len(errs) >= self.policy.max_failures else HOT
