"""Multi-rank sim: every rank's `Sim` exchanges remote signals with its peers.

Two transports run the same protocol, so their results are identical:

* `MPITransport` -- each rank is a real MPI process (mpi4py):
      mpiexec -n 4 python -c "from dtrace_mk.megakernel.mpi_transport import run_mpi; ..."
      mpiexec -n 4 dtrace-mk run --backend sim --model tiny
* `LoopbackTransport` -- N ranks' sims in one process (unit tests, the collector's
  many-rank benchmark); `run_loopback(...)`.

Messages
--------
A remote signal is the tuple `Msg = (dest, ts, sender, seq, event, count, comm_op,
comm_gen)`: rank `sender`'s `seq`-th signal (1, 2, ...) adds `count` to event `event`
(a global event id: every rank's event table is the same, graph.py) on rank `dest`,
landing at sim time `ts` (= issue time + `comm_ns`), for the logical all-reduce
`(comm_op, comm_gen)`.  `Sim.deliver` puts it in the receiver's event heap ordered by
(ts, after local events of the same ts, sender, seq), so the processing order never
depends on when a message was delivered -- only that it was delivered before ts.

Synchronisation (conservative parallel discrete-event simulation)
-----------------------------------------------------------------
The lookahead L is the minimum comm latency (`ModelCosts.comm_ns`, default 2.5 us,
the one-way NVLink flag latency measured between two H200s): a signal issued at t lands
at t + comm_ns >= t + L.  The ranks advance in global windows:

    loop:
        every rank sends to every rank (an alltoall of point-to-point messages):
            (failed?, bound, its signals for that rank)
            bound = min(its next pending event, the ts of everything it sends now)
        deliver what arrived; G = min of all bounds (the same number on every rank)
        if G is the end of time: stop (every heap empty, nothing in flight)
        every rank processes its events with ts < G + L

A signal produced in a window lands at >= G + L, i.e. in a later window, after its
delivery.  Every rank makes the same collective calls in the same order, so the loop
cannot deadlock (messages of one (source, tag) cannot overtake each other, so windows
never mix); a rank whose sim raised reports `failed` in the next exchange and
every rank stops (the failed rank re-raises its exception, the others raise
RuntimeError naming it).  One exchange per window; windows skip idle time.

Clocks
------
Multi-rank runs give each rank `RankClock.for_rank(rank, seed)` by default (offset
37..236 us, drift +-1..4 ppm, 32 ns ticks; host clock per 8 ranks): hook ts_ns and
`SimResult.clock_samples` ((device_ns, host_ns) at each step start and at the end) are
in that rank's clocks; the simulation itself runs in one sim time.  `clock_skew=False`
gives identity clocks.  An agent ships the samples as `collectors.records.ClockSample(
rank, device_ns, host_ns)`; pass `on_clock=callable(device_ns, host_ns)` to get them
as they are taken.
"""
from __future__ import annotations

from typing import Any, Callable, List, Mapping, Optional, Sequence, Tuple, Union

from ..errors import UserError
from . import faults as F
from .cost import ModelCosts
from .graph import TaskGraph, build_graph
from .presets import ModelConfig
from .sim import END_OF_TIME, RankClock, Sim, SimResult, Sink

_TAG = 0x5D7C
Msg = Tuple[int, int, int, int, int, int, int, int]   # dest, ts, sender, seq, event, count, comm_op, comm_gen
FaultsArg = Union[None, F.FaultTable, Sequence[Optional[F.FaultTable]], Mapping[int, F.FaultTable]]


class RankPort:
    """What one rank's Sim sees as its transport: buffers the signals it sends."""

    def __init__(self, rank: int, ranks: int):
        self.rank, self.ranks = rank, ranks
        self.seq = 0
        self.out: List[Msg] = []

    def send(self, event: int, owner_rank: int, count: int, ts_ns: int, comm_op: int = -1,
             comm_gen: int = 0) -> None:
        if not 0 <= owner_rank < self.ranks or owner_rank == self.rank:
            raise RuntimeError(f"rank {self.rank}: signal to rank {owner_rank} of {self.ranks}")
        self.seq += 1
        self.out.append((owner_rank, ts_ns, self.rank, self.seq, event, count, comm_op, comm_gen))

    def take(self) -> List[Msg]:
        out, self.out = self.out, []
        return out


def _deliver(sim: Sim, msgs: Sequence[Msg]) -> None:
    for _dest, ts, sender, seq, event, count, op, gen in msgs:
        sim.deliver(event, count, ts, sender, seq, op, gen)


def _bound(sim: Sim, out: Sequence[Msg]) -> int:
    b = sim.next_ts()
    for m in out:
        if m[1] < b:
            b = m[1]
    return b


class LoopbackTransport:
    """N ranks in one process, the same windows as MPITransport (identical results).
    `lookahead_ns` (default: the smallest comm_ns) may be set lower -- more, shorter
    windows, the same results (tests use it to show the results do not depend on the
    windows)."""

    def __init__(self, ranks: int, lookahead_ns: Optional[int] = None):
        if ranks < 1:
            raise UserError(f"ranks: expected >= 1, got {ranks}")
        self.ports = [RankPort(r, ranks) for r in range(ranks)]
        self.windows = 0
        self.lookahead_ns = lookahead_ns

    def port(self, rank: int) -> RankPort:
        return self.ports[rank]

    def run(self, sims: Sequence[Sim]) -> List[SimResult]:
        if len(sims) != len(self.ports):
            raise UserError(f"loopback: {len(sims)} sims for {len(self.ports)} ranks")
        for r, s in enumerate(sims):
            if s.rank != r or s.transport is not self.ports[r]:
                raise UserError(f"loopback: sim {r} is not rank {r} on this transport's port")
        L = min(s.costs.comm_ns for s in sims)
        if self.lookahead_ns is not None:
            if not 1 <= self.lookahead_ns <= L:
                raise UserError(f"lookahead_ns: expected 1..{L} (the smallest comm_ns), got {self.lookahead_ns}")
            L = self.lookahead_ns
        for s in sims:
            s.start()
        while True:
            outs = [p.take() for p in self.ports]
            g = min(_bound(s, o) for s, o in zip(sims, outs))
            for o in outs:
                for m in o:
                    sims[m[0]].deliver(m[4], m[5], m[1], m[2], m[3], m[6], m[7])
            if g >= END_OF_TIME:
                break
            self.windows += 1
            for s in sims:
                s.advance(g + L)
        return [s.finish() for s in sims]


class MPITransport:
    """This MPI process is one rank of `comm` (default MPI.COMM_WORLD; every process of
    `comm` must be a sim rank).  `on_idle()` (optional) is called now and then while
    this rank waits for slower peers (e.g. to poll an in-process collector); it must
    not raise or block, and must not use `comm`."""

    def __init__(self, comm=None, on_idle: Optional[Callable[[], Any]] = None):
        if comm is None:
            from mpi4py import MPI
            comm = MPI.COMM_WORLD
        self.comm = comm
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.port = RankPort(self.rank, self.size)
        self.windows = 0
        self.on_idle = on_idle

    def _exchange(self, payloads: List[Any]) -> List[Any]:
        """alltoall of small objects by point-to-point messages, polled with short
        sleeps: a rank that waits for slower peers yields its core (ranks often
        outnumber cores in CI), where MPI's blocking collectives would spin."""
        import time
        comm, me, size = self.comm, self.rank, self.size
        sends = [comm.isend(payloads[d], dest=d, tag=_TAG) for d in range(size) if d != me]
        got: List[Any] = [None] * size
        got[me] = payloads[me]
        pending = [s for s in range(size) if s != me]
        spins = 0
        while pending:
            left = []
            for src in pending:
                msg = comm.improbe(source=src, tag=_TAG)
                if msg is None:
                    left.append(src)
                else:
                    got[src] = msg.recv()
            pending = left
            if pending:
                spins += 1
                if spins > 50:
                    time.sleep(20e-6)
                    if self.on_idle is not None and spins % 64 == 0:
                        self.on_idle()
        for r in sends:
            r.wait()
        return got

    def run(self, sim: Sim) -> SimResult:
        from mpi4py import MPI
        comm, size = self.comm, self.size
        if sim.rank != self.rank or sim.g.ranks != size or sim.transport is not self.port:
            raise UserError(f"mpi: the sim of rank {sim.rank} of {sim.g.ranks} does not match MPI rank "
                            f"{self.rank} of {size} (build it with transport=MPITransport().port)")
        L = comm.allreduce(sim.costs.comm_ns, op=MPI.MIN)
        err: Optional[BaseException] = None
        try:
            sim.start()
        except Exception as e:  # reported to the peers in the next exchange
            err = e
        while True:
            out = self.port.take()
            bound = END_OF_TIME if err is not None else _bound(sim, out)
            per_dest: List[List[Msg]] = [[] for _ in range(size)]
            for m in out:
                per_dest[m[0]].append(m)
            recv = self._exchange([(err is not None, bound, per_dest[d]) for d in range(size)])
            failed = [src for src, (bad, _, _) in enumerate(recv) if bad]
            if failed:
                if err is not None:
                    raise err
                raise RuntimeError(f"sim rank(s) {failed} failed; rank {self.rank} stopped with them")
            g = END_OF_TIME
            for _bad, b, msgs in recv:
                _deliver(sim, msgs)
                if b < g:
                    g = b
            if g >= END_OF_TIME:
                break
            self.windows += 1
            try:
                sim.advance(g + L)
            except Exception as e:
                err = e
        return sim.finish()


# ------------------------------------------------------------------------ conveniences

def _faults_of(faults: FaultsArg, rank: int) -> Optional[F.FaultTable]:
    if faults is None or isinstance(faults, F.FaultTable):
        return faults
    if isinstance(faults, Mapping):
        return faults.get(rank)
    return faults[rank] if rank < len(faults) else None


def rank_clock(rank: int, seed: int, clock_skew: bool) -> RankClock:
    return RankClock.for_rank(rank, seed) if clock_skew else RankClock()


def run_loopback(cfg: ModelConfig, batch: int, num_workers: int, ranks: int, steps: int, *,
                 faults: FaultsArg = None, sinks: Optional[Sequence[Optional[Sink]]] = None,
                 seed: int = 0, clock_skew: bool = True, costs: Optional[ModelCosts] = None,
                 graphs: Optional[Sequence[TaskGraph]] = None,
                 on_clock: Optional[Sequence[Optional[Callable[[int, int], Any]]]] = None,
                 clocks: Optional[Sequence[RankClock]] = None, **sim_kw) -> List[SimResult]:
    """Run `ranks` ranks of `cfg` in this process.  `faults`: one table for every rank,
    or per rank (a sequence, or a mapping rank -> table); `sinks[r]` receives rank r's
    hook contexts; `clocks[r]` overrides rank r's clock (else `clock_skew` decides);
    other keywords go to every `Sim`."""
    tr = LoopbackTransport(ranks)
    graphs = graphs or [build_graph(cfg, batch, num_workers, rank=r, ranks=ranks, costs=costs)
                        for r in range(ranks)]
    sims = [Sim(graphs[r], steps, faults=_faults_of(faults, r), costs=costs, seed=seed,
                sink=sinks[r] if sinks else None, transport=tr.port(r),
                clock=clocks[r] if clocks else rank_clock(r, seed, clock_skew),
                on_clock=on_clock[r] if on_clock else None, **sim_kw)
            for r in range(ranks)]
    return tr.run(sims)


def run_mpi(cfg: ModelConfig, batch: int, num_workers: int, steps: int, *, comm=None,
            faults: FaultsArg = None, sink: Optional[Sink] = None, seed: int = 0,
            clock_skew: bool = True, costs: Optional[ModelCosts] = None,
            graph: Optional[TaskGraph] = None, clock: Optional[RankClock] = None,
            **sim_kw) -> SimResult:
    """This MPI process's rank of an `mpiexec -n R` run (every rank calls it with the
    same arguments, except `sink` and `clock`; `faults` may be per rank as in
    run_loopback)."""
    tr = MPITransport(comm)
    graph = graph or build_graph(cfg, batch, num_workers, rank=tr.rank, ranks=tr.size, costs=costs)
    sim = Sim(graph, steps, faults=_faults_of(faults, tr.rank), costs=costs, seed=seed, sink=sink,
              transport=tr.port, clock=clock or rank_clock(tr.rank, seed, clock_skew), **sim_kw)
    return tr.run(sim)


def mpi_world() -> Tuple[int, int]:
    """(rank, size) when this process was started by an MPI launcher (mpiexec/mpirun;
    MPICH hydra, Open MPI, PMIx), else (0, 1) without importing mpi4py."""
    import os
    for rk, sz in (("PMI_RANK", "PMI_SIZE"), ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
                   ("PMIX_RANK", "PMIX_SIZE")):
        if rk in os.environ and sz in os.environ:
            try:
                size = int(os.environ[sz])
            except ValueError:
                continue
            if size > 1:
                from mpi4py import MPI
                return MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
            return 0, 1
    return 0, 1
