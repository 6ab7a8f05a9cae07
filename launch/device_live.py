"""Live queries in the device VM of a rank's running megakernel (GPU backend).

    host = ServingHost(...)                       # launch.api
    mk = gpu.Megakernel(cfg, batch, tp=group)
    host.live_runtime = DeviceQueries(mk)         # before the first launch
    ... each step: host.step(k); mk.run(1, hooks=..., faults=...) ...

`DeviceQueries` is the runtime a `lang.host.QueryRun` attaches to (attach / detach /
maps / coverage / evidence): a `runtime.live.LiveSession` on the rank's megakernel, whose
`DeviceRuntime` hook tables are wired into every launch with `Megakernel.set_observer`.
A query attached at a step boundary is verified, written to the device tables and picked
up by the next launch (a generation bump); its maps and coverage live in device memory
and are read back between launches (exact: no kernel runs then).  The host never feeds
these queries: the device VM runs them over the kernel's own hook contexts.

Host clauses (BEGIN/END) run as usual; `interval:` clauses do not fire (they run on the
host's record stream, which device queries do not see).
"""
from __future__ import annotations


class DeviceQueries:
    """The `QueryRun` runtime of a rank's megakernel (module doc).  Called from the
    serving loop's thread only, between launches."""

    def __init__(self, mk, tier: str = "hot"):
        """tier: hot (device VM), compiled or auto (runtime.live.LiveSession / tiers)."""
        from ..runtime.live import LiveSession
        self.session = LiveSession(mk, tier=tier)

    def boundary(self) -> None:
        """A launch boundary: the tier manager starts promotions and swaps in finished
        builds (no event is lost or counted twice across a swap: runtime.tiers)."""
        self.session.boundary()

    def attach(self, obj, verify: bool = True, **kw) -> int:
        return self.session.attach(obj)       # verifies; AttachRefused (a UserError) if not

    def detach(self, aid: int) -> None:
        self.session.detach(aid)

    def maps(self, aid: int):
        return self.session.rt.maps(aid)

    def coverage(self, aid: int):
        return self.session.rt.coverage(aid)

    def evidence(self, aid: int):
        return self.session.rt.evidence(aid)
