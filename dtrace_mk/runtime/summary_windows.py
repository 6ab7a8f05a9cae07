"""The summary monitors' task half on the device, read in windows of epochs (the GPU
rank's agent: docs/dev/gpu_agent_plan.md, runtime/agent.py "device summaries").

The device VM of a rank's running megakernel aggregates the task hooks into maps keyed by
step.  The host may read those maps while the kernel runs, but must not delete entries
of a hash map the kernel inserts into (an insert racing a delete can duplicate a key:
kernels/bpf_map_ops.cuh).  So instead of clearing read epochs, the monitor is attached
afresh for each window of W decode steps, and a read window is dropped whole:

* Window j is one attachment with first_epoch f_j: events of earlier steps are not
  eligible.  Its successor is attached with `replaces=` window j: in the same table
  change, window j's end_epoch becomes the successor's actual first epoch f_{j+1}, so
  window j counts exactly the steps f_j <= k < f_{j+1} on the device, and nothing after.
* Two windows are attached at a time, the oldest (being filled) and the next; once every
  epoch of the oldest one's range is final on the device (every worker finished and
  flushed it), its maps and coverage are read once, it is detached, and the window after
  the next is attached from f_{j+1} + W (replacing window j+1).
* An attach never counts a step a worker has started: the runtime raises first_epoch to
  the first unstarted step, and the predecessor's end with it: a window attached late
  leaves its predecessor a longer range, so the reads are exact however the host's
  timing falls.
* Why ranges end on the device (session 41): a table change is due at the step it
  changes what is counted.  The successor's is due only at its first epoch, ~W steps
  after the attach, and the detach of a window past its end never (it counts nothing
  more), so each worker loads them in idle time (a dependency wait that is not ready)
  instead of all workers draining and reloading at one step gate (measured: a
  late_notification the diagnosis saw two steps after each window change).
* A detached window's memory goes back (`forget`) once every worker runs tables of the
  detach's generation or later (`loaded_gen`).
* A successor the runtime refuses (its hook tables full of live queries' programs) is
  tried again W steps later; meanwhile the last window keeps counting (no end yet), so
  its range just grows (its maps may fill: counted lost).  Only the first window's
  refusal is an error.

A window's maps hold its range, so the agent sizes them for W plus the host's lag (a
successor attached late); what they cannot hold is counted lost in coverage, as with any
full map.

The runtime (launch.device_live.DeviceQueries on a GPU rank; `ReferenceDevice`, the
protocol over a reference runtime that the caller fires as the kernel would, on the CPU):

    attach(obj, first_epoch=, tier="hot", replaces=None) -> aid   # first_epoch >= the first unstarted step
    first_epoch_of(aid), unstarted_step(), final_epoch()   # final: every epoch <= it complete
    detach(aid), forget(aid), maps(aid) -> MapSet
    table_gen(), loaded_gen()            # the last table change; every worker runs it or later
    coverage(aid, upto=) -> [Coverage]   # rows of epochs <= upto (final: exact)
    rearm(aid, first_epoch=, replaces=) -> first   # an ended / parked one counts again
                                                   # (runtime.device_query's buffered queries)
    clear_map(aid, name), evidence(aid)  # (device queries)
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Tuple

from ..bpf.coverage import Coverage
from ..errors import UserError

#: Where a GPU rank's summary monitors run (serve / launch / demo --summaries,
#: $DTRACE_MK_SUMMARIES): "host" = every hook record streams to the rank's Python agent,
#: "device" = their task half runs here, in the device VM (the default since session 44:
#: exact against host summaries on the H200; host-paced tiny serving's late_notification two
#: steps after each window's park, sessions 45-47, went with the drain's poller, session 48:
#: docs/results/hooks.md).
SUMMARY_MODES = ("host", "device")
DEFAULT_SUMMARIES = "device"

#: Decode steps per window: each window is read once (one device-to-host copy of its
#: maps); the summaries of a step reach the collector within ~W steps.  serve's
#: --summary-window takes MIN_WINDOW..MAX_WINDOW (the agent sizes the maps for it:
#: agent.device_summary_entries).
DEFAULT_WINDOW = 16
MIN_WINDOW, MAX_WINDOW = 2, 256


@dataclass
class _Window:
    aid: int
    first: int                      # its actual first epoch


@dataclass
class WindowRead:
    """Epochs first .. end-1 of one window: its maps (host MapSet) and coverage rows."""
    first: int
    end: int
    maps: Any
    coverage: List[Coverage]


class SummaryWindows:
    """Windows of one monitor object on a device runtime (module doc)."""

    def __init__(self, runtime, obj, first_epoch: int, window: int = DEFAULT_WINDOW):
        if window < MIN_WINDOW:
            raise UserError(f"summary windows: window must be >= {MIN_WINDOW} steps, got {window}")
        self.rt, self.obj, self.W = runtime, obj, int(window)
        self.live: List[_Window] = []
        self.retiring: List[Tuple[int, int]] = []     # (detached aid, the detach's table generation)
        self.read_count = 0
        self.refused = 0                              # successor attaches refused (retried)
        self.last_refusal = ""
        self.retry_at = -1                            # the final epoch a refused successor is retried at
        self.closed = False
        self._open(int(first_epoch))
        self._try_open(self.live[0].first + self.W)

    def _open(self, want: int, replaces=None) -> None:
        aid = self.rt.attach(self.obj, first_epoch=want, tier="hot", replaces=replaces)
        self.live.append(_Window(aid, int(self.rt.first_epoch_of(aid))))

    def _try_open(self, want: int) -> None:
        """A successor of the last window, which ends where it starts."""
        try:
            self._open(want, replaces=self.live[-1].aid)
        except UserError as e:           # e.g. a hook's device table full: the last window goes on
            self.refused += 1
            self.last_refusal = str(e)
            self.retry_at = self.live[-1].first + self.W * (self.refused + 1)

    @property
    def due(self) -> int:
        """The final epoch at which read() has work: the oldest window's range complete,
        or (no successor) a refused successor's retry."""
        return self.live[1].first - 1 if len(self.live) > 1 else self.retry_at

    def read(self, final: int) -> List[WindowRead]:
        """Read (and detach) every window whose whole range is <= final, oldest first;
        attach their successors' successors."""
        out: List[WindowRead] = []
        if not self.closed and len(self.live) == 1 and final >= self.retry_at:   # refused before: again
            self._try_open(final + 1)
        while not self.closed and len(self.live) > 1 and final >= self.live[1].first - 1:
            w, nxt = self.live[0], self.live[1]
            out.append(self._take(w, nxt.first))
            self.live.pop(0)
            self._try_open(nxt.first + self.W)
        self._forget()
        return out

    def close(self, final: int) -> List[WindowRead]:
        """The end (no launch running: every step that ran is <= final): the windows'
        ranges up to final, read; every window detached, none attached any more."""
        if self.closed:
            return []
        out = self.read(final)
        self.closed = True
        for i, w in enumerate(self.live):
            end = min(final + 1, self.live[i + 1].first if i + 1 < len(self.live) else final + 1)
            if end > w.first:
                out.append(self._take(w, end))
            else:
                self._detach(w)
        self.live = []
        self._forget()
        return out

    def _take(self, w: _Window, end: int) -> WindowRead:
        maps, cov = self.rt.maps(w.aid), self.rt.coverage(w.aid, upto=end - 1)
        self._detach(w)
        self.read_count += 1
        return WindowRead(w.first, end, maps, [c for c in cov if c.epoch >= w.first])

    def _detach(self, w: _Window) -> None:
        self.rt.detach(w.aid)
        self.retiring.append((w.aid, int(self.rt.table_gen())))

    def _forget(self) -> None:
        self.retiring = forget_loaded(self.rt, self.retiring)


def forget_loaded(rt, retiring: List[tuple]) -> List[tuple]:
    """Give back the device memory of each detached attachment in `retiring` ((aid, table
    generation of its detach)) that no worker can still run (every worker loaded that
    generation); returns the ones still to wait for."""
    if not retiring:
        return retiring
    loaded = int(rt.loaded_gen())
    for aid, gen in retiring:
        if gen <= loaded:
            rt.forget(aid)
    return [(aid, gen) for aid, gen in retiring if gen > loaded]


class ReferenceDevice:
    """The device runtime protocol above (launch.device_live.DeviceQueries') on the CPU: a
    reference runtime that the caller fires with each decode step's records as the kernel
    would run them (`run_step`), never fed by the agent.  Steps < `started` have run; every
    step <= `final` is complete (the caller sets it, as the device's flushes would).  The
    CPU tests, the fake-GPU serving tests and bench/agent_host.py drive device summaries
    and device queries with it; what was attached, detached, forgotten and cleared is kept."""

    def __init__(self, num_workers: int):
        from .reference import ReferenceRuntime
        self.rt = ReferenceRuntime(num_workers=num_workers)
        self.started, self.final = 0, -1
        self.attached: List[int] = []
        self.detached: List[int] = []
        self.forgotten: List[int] = []
        self.cleared: List[str] = []
        self.rearmed: List[tuple] = []    # (aid, first epoch) of each rearm
        self.firsts = {}                  # aid -> its first epoch
        self.gen = 0                      # table changes (attach, detach)
        self.lag = 0                      # loaded_gen() trails table_gen() by this many
        self.tier = "hot"

    def run_step(self, records) -> None:
        for r in records:
            self.rt.fire(r)
        self.started += 1

    def _from(self, first_epoch) -> int:
        """The first unstarted step, or first_epoch if later."""
        return max(self.unstarted_step(), 0 if first_epoch is None else int(first_epoch))

    def attach(self, obj, verify: bool = True, first_epoch=None, tier=None, replaces=None, **kw) -> int:
        """From the first unstarted step, or first_epoch if later (DeviceQueries.attach)."""
        first = self._from(first_epoch)
        aid = self.rt.attach(obj, verify=verify, first_epoch=first, replaces=replaces)
        self.attached.append(aid)
        self.firsts[aid] = first
        self.gen += 1
        return aid

    def rearm(self, aid: int, first_epoch=None, replaces=None) -> int:
        """From the first unstarted step, or first_epoch if later (DeviceQueries.rearm)."""
        first = self._from(first_epoch)
        self.rt.rearm(aid, first, replaces=replaces)
        self.rearmed.append((aid, first))
        self.gen += 1
        return first

    def table_gen(self) -> int:
        return self.gen

    def loaded_gen(self) -> int:
        """The CPU model loads every change at once (`lag` holds the last n back, as
        workers that have not reached an idle wait yet would)."""
        return self.gen - self.lag

    def first_epoch_of(self, aid: int) -> int:
        return self.rt.attachment(aid).first_epoch

    def unstarted_step(self) -> int:
        return self.started

    def final_epoch(self) -> int:
        return self.final

    def detach(self, aid: int) -> None:
        self.detached.append(aid)
        self.rt.detach(aid)
        self.gen += 1

    def forget(self, aid: int) -> None:
        self.forgotten.append(aid)
        self.rt.forget(aid)

    def maps(self, aid: int):
        return self.rt.maps(aid)

    def clear_map(self, aid: int, name: str) -> None:
        self.cleared.append(name)
        self.rt.maps(aid)[name].clear()

    def evidence(self, aid: int):
        return self.rt.evidence(aid)

    def coverage(self, aid: int, upto=None) -> List[Coverage]:
        rows = self.rt.coverage(aid)
        return rows if upto is None else [c for c in rows if c.epoch <= upto]

