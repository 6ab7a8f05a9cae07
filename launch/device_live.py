"""Live queries in the device VM of a rank's running megakernel (GPU backend).

    host = ServingHost(...)                       # launch.api
    mk = gpu.Megakernel(cfg, batch, tp=group)
    host.live_runtime = DeviceQueries(mk)         # before the first launch
    ... the serving loop (launch/serve.py serve_gpu): one resident launch for many steps
    (mk.start_resident / grant / poll / finish), boundary() between launches ...

`DeviceQueries` is the runtime a `lang.host.QueryRun` attaches to (attach / detach /
maps / coverage / evidence): a `runtime.live.LiveSession` on the rank's megakernel, whose
`DeviceRuntime` hook tables are wired into every launch with `Megakernel.set_observer`.
A query attached while the resident kernel runs is verified and written to the device
tables (a generation bump) with first_epoch = the first step no worker has started (the
grant, `Megakernel.unstarted_step`); every worker reloads changed tables at the gate of the
step they are due at (control[CTL_GEN_DUE]: that first epoch), or earlier in idle time,
so it counts from that step's first event on, exactly, without the kernel parking; its maps and coverage
live in device memory, read with device-to-host copies (runtime.live: exact for the
epochs every worker has flushed, all of them once the launch ended).  The host never feeds
these queries: the device VM runs them over the kernel's own hook contexts.

Host clauses (BEGIN/END) run as usual; `interval:` clauses run on the host's clock --
rank 0's, for the whole job (a fed query's run on its records' ts_ns, which device
queries do not see: launch.api `_tick_device_queries`); each one that prints or clears a
map is a cut at a step boundary, its maps read once those steps are final
(runtime.device_query: in the hot tier the query attached again with `replaces=`,
elsewhere two attachments taking turns, `rearm` and `clear_map`); the exit map is read
once a step (`read_map`).

It is also the runtime of the agent's device summaries (`serve --summaries device`:
runtime.summary_windows attaches the summary's task half here, window after window, and
reads each window once every worker has flushed its steps: `final_epoch`).
"""
from __future__ import annotations


class DeviceQueries:
    """The `QueryRun` runtime of a rank's megakernel (module doc).  Called from the
    serving loop's thread only (while the resident kernel runs, or between launches)."""

    def __init__(self, mk, tier: str = "hot"):
        """tier: hot (device VM), compiled or auto (runtime.live.LiveSession / tiers)."""
        from ..runtime.live import LiveSession
        self.session = LiveSession(mk, tier=tier)

    @property
    def tier(self) -> str:
        """The session's tier (a device query cuts its intervals only in "hot":
        runtime.device_query)."""
        return self.session.tier

    def boundary(self) -> None:
        """A launch boundary: the tier manager starts promotions and swaps in finished
        builds (no event is lost or counted twice across a swap: runtime.tiers)."""
        self.session.boundary()

    def swap_pending(self) -> bool:
        """Would the next boundary() swap code in (TierManager.swap_pending)?  The
        resident serving loop then ends its launch: a swap happens only between
        launches.  The hot tier never swaps."""
        tm = getattr(self.session, "tiers", None)
        return tm is not None and tm.swap_pending(self.coverage)

    def attach(self, obj, verify: bool = True, first_epoch=None, tier=None, replaces=None, follows=None,
               **kw) -> int:
        """Verify (AttachRefused, a UserError, if not) and attach; counts from the first
        decode step no worker has started (module doc), or from `first_epoch` if later.
        tier: the session's by default; "hot" keeps it in the device VM (no promotion).
        replaces: an attachment that stops counting where this one starts (a summary
        window's predecessor; the same table change, due at that step: workers load it in
        idle time before).  follows: promoted whenever that attachment is (a buffered
        query's parked twin: TierManager.follow)."""
        return self.session.attach(obj, first_epoch=self._from(first_epoch), tier=tier, replaces=replaces,
                                   follows=follows)

    def rearm(self, aid: int, first_epoch=None, replaces=None) -> int:
        """Attachment `aid` (ended, or attached with first_epoch=PARKED) counts again from
        the first step no worker has started, or `first_epoch` if later; `replaces` stops
        there (LiveSession.rearm).  Returns that step."""
        first = self._from(first_epoch)
        self.session.rearm(aid, first, replaces=replaces)
        return first

    def _from(self, first_epoch) -> int:
        """The first decode step no worker has started, or first_epoch if later."""
        return max(self.unstarted_step(), 0 if first_epoch is None else int(first_epoch))

    def first_epoch_of(self, aid: int) -> int:
        return int(self.session.rt._get(aid).first_epoch)

    def unstarted_step(self) -> int:
        return self.session.mk.unstarted_step()

    def final_epoch(self) -> int:
        """Every step <= this is complete on the device and its hook work flushed: the
        maps hold all of it (runtime.live.LiveSession.snapshot's bound; -1: none yet)."""
        return self.session.final_epoch()

    def detach(self, aid: int) -> None:
        self.session.detach(aid)

    def forget(self, aid: int) -> None:
        """Give a detached attachment's device memory back; the caller knows no worker
        still runs it (runtime.summary_windows: every worker loaded the detach's tables)."""
        self.session.rt.forget(aid)

    def table_gen(self) -> int:
        """The generation of the last table change (attach / detach)."""
        return self.session.gen

    def loaded_gen(self) -> int:
        """Every worker runs tables of this generation or later (a small device read)."""
        return self.session.loaded_gen()

    def retire(self) -> int:
        """Free the device tables' slots of complete steps (coverage rows, rate-limit and
        ring budget slots; coverage() keeps reporting them from the host): the resident
        serving loop calls it every few steps, since the tables hold only COV_ROWS (64)
        steps at a time (runtime.live.LiveSession.retire_complete)."""
        return self.session.retire_complete()

    # read while the resident kernel runs: device-to-host copies on the session's
    # non-blocking side stream (never behind the kernel's stream)
    def maps(self, aid: int):
        with self.session.side:
            return self.session.rt.maps(aid)

    def read_map(self, aid: int, name: str):
        """One map of an attachment, read alone (a small copy: the exit map of a query)."""
        with self.session.side:
            return self.session.rt._get(aid).maps.readback(names=(name,))[name]

    def clear_map(self, aid: int, name: str) -> None:
        """A query's clear(@map): the device map emptied (as created) while the kernel runs."""
        with self.session.side:
            self.session.rt.clear_map(aid, name, stream=self.session.side)

    def coverage(self, aid: int, upto=None):
        """Coverage rows (of epochs <= upto when given); rows of steps the kernel is still
        running are not checked for the invariant (read mid-update), the final ones are."""
        final = self.session.final_epoch()
        with self.session.side:
            rows = self.session.rt.coverage(aid, check_upto=final)
        return rows if upto is None else [c for c in rows if c.epoch <= upto]

    def evidence(self, aid: int):
        with self.session.side:
            return self.session.rt.evidence(aid)
