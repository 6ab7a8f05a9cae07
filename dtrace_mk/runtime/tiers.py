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
    _jobs: Dict[int, _Job] = field(default_factory=dict)
    _n: int = 0

    def boundary(self) -> List[int]:
        """One launch boundary: start builds for attachments that became hot enough, then
        swap in every build that has finished (an inline build finishes here, so it swaps
        at this boundary).  Returns the attachments swapped now."""
        self._n += 1
        live = set(self.runtime.attachments())
        for aid in list(self.state):
            if aid not in live:                       # detached (maybe while building)
                self.state.pop(aid, None)
                self._jobs.pop(aid, None)
        for aid in sorted(live):
            if self.runtime.tier(aid) == "compiled":
                self.state[aid] = COMPILED
                continue
            st = self.state.setdefault(aid, HOT)
            if st == HOT and aid not in self._jobs and self.policy.hot_enough(self.runtime.coverage(aid)):
                self._start(aid)
        swapped = []
        for aid in sorted(self._jobs):
            job = self._jobs[aid]
            if job.future is not None and job.future.done() and not job.done:
                try:
                    job.result = job.future.result()
                except BaseException as e:            # noqa: BLE001 - kept as the attachment's error
                    job.error = e
                job.done = True
            if not job.done:
                continue
            del self._jobs[aid]
            if job.error is not None:
                self._failed(aid, job.error)
            elif self.runtime.commit_promotion(aid, job.key, job.result):
                self.state[aid] = COMPILED
                self.swaps.append((aid, self._n))
                swapped.append(aid)
            else:                                     # stale: the compiled set moved on; next
                self.state[aid] = HOT                 # boundary prepares a new build
        return swapped

    def _start(self, aid: int) -> None:
        key, work = self.runtime.prepare_promotion(aid)
        job = _Job(key)
        self._jobs[aid] = job
        self.state[aid] = BUILDING
        if self.executor is not None:
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
