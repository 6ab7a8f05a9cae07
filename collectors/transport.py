"""The collector's transport: per-rank agents -> one collector over non-blocking MPI.

Roles
-----
* MPMD (`mpiexec -n N RANK-CMD : -n 1 COLLECTOR-CMD`): processes of the second app
  (`MPI.APPNUM == 1`) collect; the first app's processes are the serving ranks.
  `roles(comm)` says which one this process is (one allreduce at start-up, never on a
  step boundary).
* Not MPMD: world rank 0 serves *and* collects in-process (`DirectChannel`: its agent
  hands messages straight to the `CollectorLoop`, which the agent polls while it runs;
  after its serving loop ends, rank 0 runs the loop until the others are done).

Wire (rank -> collector, one MPI tag, so MPI's non-overtaking rule keeps order)
------------------------------------------------------------------------------
A message is at most `MSG_BYTES` bytes: a fixed 24-byte header
`(rank u32, kind u32, seq u64, lost_total u64)` and a payload.  Kinds:

  DATA  payload = concatenated packed records (`collectors.records`), whole records only
  PONG  payload = u64 host clock of the rank when it answered ping `seq`
  BYE   the agent is done; `lost_total` is final
  NOTE  payload = a JSON document (the printed output of user monitors), kept beside the
        records (`CollectorLoop.notes`), not part of the diagnosis

`lost_total` is the agent's running count of records it could not send (queue full,
send refused); every header carries it, so the collector learns of losses with the next
message that does get through, and reports deltas to `RecordSink.on_lost_records`.

Collector -> rank (another tag): 16 bytes `(kind u32, 0 u32, seq u64)`: PING (answer
with PONG) or FIN (the collector saw BYE; the agent may leave).

Clock alignment (Score-P style)
-------------------------------
The collector pings every rank `start_pings` times back to back when the rank says
HELLO (its agent answers in a tight loop during `RankChannel.start`), then once every
`ping_interval_s` while the run goes on (answered whenever the agent makes progress),
and keeps every round trip as a `PingPong` record; `collectors.clock` takes the
minimum-RTT one.  HELLO carries the rank's host identity (`host_identity()`: hostname +
kernel boot id); a rank on the collector's own host shares its clock, so the collector
records one exact round trip (offset 0, RTT 0) for it, as Score-P does within a node:
a busy serving loop answers pings late (hundreds of us seen on the H200 host), and a
late answer would otherwise bias the offset by half its delay.

Failure handling
----------------
A rank that says nothing (no data, no pong) for `silence_timeout_s` is reported lost
(`RecordSink.on_rank_lost`) and the loop carries on; `run(deadline_s=...)` returns at the
deadline whatever state the ranks are in, so a dead or hung rank yields a partial result
naming it, never a hang.  Bad messages are the sink's to count; the loop never raises
on a rank's input.

Threading: everything here runs on the caller's thread; nothing blocks longer than a
poll (plus `RankChannel.start`/`close`, which wait at most their timeouts).
"""
from __future__ import annotations

import struct
import time
from collections import deque
from dataclasses import dataclass, field
import json
from typing import Any, Callable, Deque, Dict, List, Optional, Sequence, Set, Tuple

from .records import PingPong


def host_identity() -> bytes:
    """Who shares this process's clocks: hostname + the kernel's boot id (containers on
    different machines may share a hostname; processes of one kernel share its clock)."""
    import socket
    try:
        with open("/proc/sys/kernel/random/boot_id", "rb") as f:
            boot = f.read().strip()
    except OSError:
        boot = b""
    return socket.gethostname().encode() + b"/" + boot

MSG_BYTES = 16384
HEADER = struct.Struct("<IIQQ")
CTRL = struct.Struct("<IIQ")
U64 = struct.Struct("<Q")
_LEN = struct.Struct("<I")
MAX_PAYLOAD = MSG_BYTES - HEADER.size

TAG_UP = 7101        # rank -> collector
TAG_DOWN = 7102      # collector -> rank


@dataclass(frozen=True)
class Tags:
    """The MPI tags of one run; runs of one job (several scenarios in one launch) use
    different tags so a late message of run i never reaches run i+1."""
    up: int = TAG_UP
    down: int = TAG_DOWN

    @classmethod
    def for_run(cls, i: int) -> "Tags":
        return cls(TAG_UP + 2 * i, TAG_DOWN + 2 * i)

HELLO, DATA, PONG, BYE, NOTE = 0, 1, 2, 3, 4   # up kinds
PING, FIN = 10, 11                        # down kinds

HostClock = Callable[[], int]


def host_clock() -> int:
    """The host clock the ping-pongs compare (system-wide monotonic, ns)."""
    return time.monotonic_ns()


# ------------------------------------------------------------------------------- ports
# A port is the little of MPI the transport uses; `MpiPort` wraps an mpi4py
# communicator, `LoopbackHub.port(i)` is an in-process stand-in for tests.

class MpiPort:
    """Point-to-point byte messages on an mpi4py communicator."""

    def __init__(self, comm):
        from mpi4py import MPI
        self.MPI = MPI
        self.comm = comm
        self.rank = comm.Get_rank()

    def isend(self, dest: int, tag: int, data: bytes):
        buf = bytearray(data)     # kept alive by the handle until the send completes
        return (self.comm.Isend([buf, self.MPI.BYTE], dest=dest, tag=tag), buf)

    @staticmethod
    def done(handle) -> bool:
        return handle[0].Test()

    def cancel(self, handle) -> None:
        try:
            handle[0].Cancel()
            handle[0].Wait()
        except Exception:       # already complete or not cancellable: nothing to do
            pass

    def irecv(self, tag: int, source: Optional[int] = None):
        buf = bytearray(MSG_BYTES)
        src = self.MPI.ANY_SOURCE if source is None else source
        return (self.comm.Irecv([buf, self.MPI.BYTE], source=src, tag=tag), buf,
                self.MPI.Status())

    def test_recv(self, handle) -> Optional[Tuple[int, bytes]]:
        req, buf, st = handle
        if not req.Test(st):
            return None
        return st.Get_source(), bytes(buf[:st.Get_count(self.MPI.BYTE)])


class LoopbackHub:
    """N in-process endpoints with MPI's ordering (per source and tag, FIFO).

    `hold_sends=True` keeps every send in flight until `release()`: a collector that
    does not drain, for tests of the agent's bounded in-flight sends."""

    def __init__(self, n: int, hold_sends: bool = False):
        self.n = n
        self.queues: Dict[Tuple[int, int], Deque[Tuple[int, bytes]]] = {}
        self.hold = hold_sends
        self.held: List[list] = []
        self.dead: Set[int] = set()

    def port(self, i: int) -> "_LoopPort":
        return _LoopPort(self, i)

    def release(self) -> None:
        self.hold = False
        for h in self.held:
            self._deliver(h)
        self.held = []

    def _deliver(self, h: list) -> None:
        src, dest, tag, data = h[1:]
        h[0] = True
        if src not in self.dead:
            self.queues.setdefault((dest, tag), deque()).append((src, data))


class _LoopPort:
    def __init__(self, hub: LoopbackHub, rank: int):
        self.hub, self.rank = hub, rank

    def isend(self, dest, tag, data):
        h = [False, self.rank, dest, tag, bytes(data)]
        if self.hub.hold:
            self.hub.held.append(h)
        else:
            self.hub._deliver(h)
        return h

    @staticmethod
    def done(handle) -> bool:
        return handle[0]

    def cancel(self, handle) -> None:
        if handle in self.hub.held:
            self.hub.held.remove(handle)

    def irecv(self, tag, source=None):
        return [tag, source]

    def test_recv(self, handle):
        q = self.hub.queues.get((self.rank, handle[0]))
        if not q:
            return None
        if handle[1] is None:
            return q.popleft()
        for i, (src, data) in enumerate(q):
            if src == handle[1]:
                del q[i]
                return src, data
        return None


# ------------------------------------------------------------------------- rank side

@dataclass
class ChannelStats:
    messages_sent: int = 0
    bytes_sent: int = 0           # payload bytes handed to MPI (headers excluded)
    messages_refused: int = 0     # send() returned False (queue full / closed)
    pongs: int = 0
    max_in_flight_seen: int = 0
    records_dropped_at_close: int = 0


class RankChannel:
    """The agent's end: bounded, non-blocking sends of fixed-size messages.

    `send(payload)` queues a message (at most `MAX_PAYLOAD` bytes) and returns False
    when `max_queued` messages are already waiting (the caller counts its records as
    lost); at most `max_in_flight` Isends are outstanding; `progress()` completes
    sends, starts queued ones and answers pings.  Never blocks (except `start`/`close`,
    bounded by their timeouts)."""

    def __init__(self, port, collector: int, rank: int, *, max_in_flight: int = 4,
                 max_queued: int = 64, clock: HostClock = host_clock, tags: Tags = Tags()):
        self.port, self.collector, self.rank = port, collector, rank
        self.tags = tags
        self.max_in_flight, self.max_queued = max_in_flight, max_queued
        self.clock = clock
        self.queue: Deque[bytes] = deque()
        self.queued_records: Deque[int] = deque()
        self.in_flight: List = []
        self.seq = 0
        self.lost_total = 0
        self.closed = False
        self.fin = False
        self.stats = ChannelStats()
        self._down = port.irecv(tags.down, collector)

    @property
    def max_payload(self) -> int:
        return MAX_PAYLOAD

    def _msg(self, kind: int, payload: bytes = b"", seq: Optional[int] = None) -> bytes:
        if seq is None:
            self.seq += 1
            seq = self.seq
        return HEADER.pack(self.rank, kind, seq, self.lost_total) + payload

    def send(self, payload: bytes, records: int = 0) -> bool:
        """Queue one message of `records` packed records; False (nothing queued) when the
        queue is full or the channel closed."""
        if len(payload) > MAX_PAYLOAD:
            raise ValueError(f"message payload {len(payload)} bytes > {MAX_PAYLOAD}")
        if self.closed or len(self.queue) >= self.max_queued:
            self.stats.messages_refused += 1
            return False
        self.queue.append(self._msg(DATA, payload))
        self.queued_records.append(records)
        self.stats.bytes_sent += len(payload)
        self.progress()
        return True

    def add_lost(self, n: int) -> None:
        self.lost_total += n

    def note(self, payload: bytes) -> bool:
        """Queue a NOTE message (JSON bytes, at most MAX_PAYLOAD; False when it does not
        fit or the queue is full)."""
        if len(payload) > MAX_PAYLOAD or self.closed or len(self.queue) >= self.max_queued:
            return False
        self.queue.append(self._msg(NOTE, payload))
        self.queued_records.append(0)
        self.progress()
        return True

    @property
    def pending(self) -> int:
        return len(self.queue) + len(self.in_flight)

    def progress(self) -> None:
        port = self.port
        if self.in_flight:
            self.in_flight = [h for h in self.in_flight if not port.done(h)]
        while self.queue and len(self.in_flight) < self.max_in_flight:
            self.in_flight.append(port.isend(self.collector, self.tags.up, self.queue.popleft()))
            self.queued_records.popleft()
            self.stats.messages_sent += 1
        if len(self.in_flight) > self.stats.max_in_flight_seen:
            self.stats.max_in_flight_seen = len(self.in_flight)
        while not self.fin:
            got = port.test_recv(self._down)
            if got is None:
                break
            kind, _, seq = CTRL.unpack_from(got[1])
            if kind != FIN:
                self._down = port.irecv(self.tags.down, self.collector)
            if kind == PING:
                # a pong goes straight out (not queued behind data): its delay is clock error
                self.in_flight.append(port.isend(self.collector, self.tags.up,
                                                 self._msg(PONG, U64.pack(self.clock()), seq)))
                self.stats.pongs += 1
            elif kind == FIN:
                self.fin = True

    def start(self, pings: int = 8, timeout_s: float = 5.0) -> None:
        """Say HELLO, then answer the collector's start-up pings in a tight loop."""
        self.in_flight.append(self.port.isend(self.collector, self.tags.up, self._msg(HELLO, host_identity())))
        deadline = time.monotonic() + timeout_s
        while self.stats.pongs < pings and time.monotonic() < deadline:
            self.progress()

    def close(self, timeout_s: float = 10.0) -> bool:
        """Send what is queued, then BYE; wait (bounded) for FIN.  What could not go out
        in time is counted in `lost_total` of the BYE.  True when FIN came."""
        deadline = time.monotonic() + timeout_s
        while self.queue and time.monotonic() < deadline:
            self.progress()
            if self.queue:
                time.sleep(0.0002)
        self.closed = True
        if self.queue:          # could not go out in time: lost, and the BYE says so
            self.lost_total += sum(self.queued_records)
            self.stats.records_dropped_at_close += sum(self.queued_records)
            self.queue.clear()
            self.queued_records.clear()
        self.in_flight.append(self.port.isend(self.collector, self.tags.up, self._msg(BYE)))
        while not self.fin and time.monotonic() < deadline:
            self.progress()
            if not self.fin:
                time.sleep(0.0005)
        while self.in_flight and time.monotonic() < deadline:
            self.in_flight = [h for h in self.in_flight if not self.port.done(h)]
            if self.in_flight:
                time.sleep(0.0002)
        for h in self.in_flight:
            self.port.cancel(h)
        self.in_flight = []
        if not self.fin:
            self.port.cancel(self._down)
        return self.fin


class DirectChannel:
    """Rank 0's agent when rank 0 also collects (not MPMD): messages go straight into
    the in-process `CollectorLoop`; `progress()` polls the loop.  Same interface as
    `RankChannel`."""

    def __init__(self, loop: "CollectorLoop", rank: int, clock: HostClock = host_clock):
        self.loop, self.rank, self.clock = loop, rank, clock
        self.seq = 0
        self.lost_total = 0
        self.closed = False
        self.fin = False
        self.stats = ChannelStats()
        loop.add_direct(rank)

    max_payload = MAX_PAYLOAD
    pending = 0

    def _deliver(self, kind: int, payload: bytes = b"") -> None:
        self.seq += 1
        self.loop.handle(HEADER.pack(self.rank, kind, self.seq, self.lost_total) + payload)

    def send(self, payload: bytes, records: int = 0) -> bool:
        if self.closed:
            self.stats.messages_refused += 1
            return False
        self._deliver(DATA, payload)
        self.stats.messages_sent += 1
        self.stats.bytes_sent += len(payload)
        return True

    def add_lost(self, n: int) -> None:
        self.lost_total += n

    def note(self, payload: bytes) -> bool:
        if self.closed or len(payload) > MAX_PAYLOAD:
            return False
        self._deliver(NOTE, payload)
        return True

    def progress(self) -> None:
        self.loop.poll()

    def start(self, pings: int = 0, timeout_s: float = 0.0) -> None:
        self._deliver(HELLO)
        # same host, same clock: one exact "round trip"
        t = self.clock()
        self.loop.sink_record(self.rank, PingPong(self.rank, t, t, t))
        st = self.loop.state[self.rank]
        st.pingpongs, st.min_rtt_ns = st.pingpongs + 1, 0

    def close(self, timeout_s: float = 0.0) -> bool:
        self.closed = True
        self._deliver(BYE)
        self.fin = True
        return True


# -------------------------------------------------------------------------- collector

@dataclass
class RankState:
    rank: int
    last_heard: float = 0.0          # time.monotonic()
    hello: bool = False
    bye: bool = False
    lost: bool = False
    lost_reported: int = 0
    messages: int = 0
    bytes: int = 0
    pings: Dict[int, int] = field(default_factory=dict)   # seq -> t0 of pings in flight
    ping_seq: int = 0
    pingpongs: int = 0
    min_rtt_ns: Optional[int] = None
    next_ping: float = 0.0
    start_pings_left: int = 0
    direct: bool = False


class CollectorLoop:
    """Receive agents' messages with a non-blocking Irecv/Test loop and feed a
    `RecordSink` (`collectors.diagnose.Accumulator`).

    `ranks`: the logical ranks expected; `address(rank)` -> the port address (world
    rank) of that rank's agent (default: the same number)."""

    def __init__(self, port, ranks: Sequence[int], sink, *,
                 address: Optional[Callable[[int], int]] = None,
                 silence_timeout_s: float = 60.0, ping_interval_s: float = 0.5,
                 start_pings: int = 8, clock: HostClock = host_clock,
                 progress: Optional[Callable[[str], None]] = None, tags: Tags = Tags(),
                 spool=None):
        self.port, self.sink = port, sink
        self.tags = tags
        self.spool = spool           # binary file: every message, length-prefixed (replay_spool)
        self.address = address or (lambda r: r)
        self.silence_timeout_s = silence_timeout_s
        self.ping_interval_s = ping_interval_s
        self.start_pings = start_pings
        self.clock = clock
        self.identity = host_identity()
        self.say = progress
        now = time.monotonic()
        self.state: Dict[int, RankState] = {r: RankState(r, last_heard=now) for r in ranks}
        self.by_address = {self.address(r): r for r in ranks} if port is not None else {}
        self._recv = port.irecv(tags.up) if port is not None else None
        self._sends: List = []
        self.bad_headers = 0
        self.notes: Dict[int, List[bytes]] = {}
        self.t_start = now

    # -- inputs ------------------------------------------------------------------------
    def add_direct(self, rank: int) -> None:
        self.state.setdefault(rank, RankState(rank, last_heard=time.monotonic())).direct = True

    def sink_record(self, rank: int, record) -> None:
        on_record = getattr(self.sink, "on_record", None)
        if on_record is not None:
            on_record(rank, record)
        else:                      # a plain RecordSink: hand it the packed record
            from .records import pack
            self.sink.on_bytes(rank, pack(record))

    def handle(self, msg: bytes, source: Optional[int] = None) -> None:
        """One message from an agent (never raises on bad input)."""
        if self.spool is not None:
            try:
                self.spool.write(_LEN.pack(len(msg)) + msg)
            except (OSError, ValueError):
                self.spool = None
        if len(msg) < HEADER.size:
            self.bad_headers += 1
            return
        rank, kind, seq, lost_total = HEADER.unpack_from(msg)
        st = self.state.get(rank)
        if st is None or (source is not None and self.by_address.get(source) != rank):
            self.bad_headers += 1
            return
        st.last_heard = time.monotonic()
        st.messages += 1
        if lost_total > st.lost_reported:
            self.sink.on_lost_records(rank, lost_total - st.lost_reported)
            st.lost_reported = lost_total
        payload = msg[HEADER.size:]
        if kind == DATA:
            st.bytes += len(payload)
            self.sink.on_bytes(rank, payload)
        elif kind == PONG:
            t1 = self.clock()
            t0 = st.pings.pop(seq, None)
            if t0 is not None and len(payload) >= 8:
                (t_remote,) = U64.unpack_from(payload)
                self.sink_record(rank, PingPong(rank, t0, t_remote, t1))
                st.pingpongs += 1
                rtt = t1 - t0
                st.min_rtt_ns = rtt if st.min_rtt_ns is None else min(st.min_rtt_ns, rtt)
                if st.start_pings_left > 0:
                    st.start_pings_left -= 1
                    self._ping(st)
        elif kind == HELLO:
            st.hello = True
            if payload and payload == self.identity:     # same host, same clock: exact
                t = self.clock()
                self.sink_record(rank, PingPong(rank, t, t, t))
                st.pingpongs += 1
                st.min_rtt_ns = 0
            if not st.direct and self.start_pings:
                st.start_pings_left = self.start_pings - 1
                self._ping(st)
        elif kind == NOTE:
            self.notes.setdefault(rank, []).append(payload)
        elif kind == BYE:
            st.bye = True
            if st.lost:          # it came back after all: its records stay, the mark goes
                st.lost = False
            if not st.direct:
                self._send(st.rank, CTRL.pack(FIN, 0, 0))
            if self.say:
                self.say(f"rank {rank} done ({st.messages} messages, {st.bytes} bytes)")
        else:
            self.bad_headers += 1

    def _send(self, rank: int, data: bytes) -> None:
        if self.port is None:          # replay_spool: nobody to answer
            return
        self._sends.append(self.port.isend(self.address(rank), self.tags.down, data))

    def _ping(self, st: RankState) -> None:
        st.ping_seq += 1
        st.pings[st.ping_seq] = self.clock()
        st.next_ping = time.monotonic() + self.ping_interval_s
        self._send(st.rank, CTRL.pack(PING, 0, st.ping_seq))

    # -- the loop ----------------------------------------------------------------------
    def poll(self) -> int:
        """Handle what has arrived; send due pings; check silences.  Returns the number
        of messages handled."""
        n = 0
        if self._recv is not None:
            while True:
                got = self.port.test_recv(self._recv)
                if got is None:
                    break
                self._recv = self.port.irecv(self.tags.up)
                self.handle(got[1], got[0])
                n += 1
        now = time.monotonic()
        if self._sends:
            self._sends = [h for h in self._sends if not self.port.done(h)]
        for st in self.state.values():
            if st.bye or st.direct:
                continue
            if st.lost:
                continue
            if now - st.last_heard > self.silence_timeout_s:
                st.lost = True
                self.sink.on_rank_lost(st.rank)
                if self.say:
                    self.say(f"rank {st.rank}: silent for {self.silence_timeout_s:g} s, "
                             f"treated as lost")
                continue
            if st.hello and now >= st.next_ping and st.start_pings_left <= 0:
                st.pings = {s: t for s, t in st.pings.items() if s > st.ping_seq - 4}
                self._ping(st)
        return n

    @property
    def finished(self) -> bool:
        return all(st.bye or st.lost for st in self.state.values())

    def run(self, deadline_s: Optional[float] = None, idle_sleep_s: float = 0.0005,
            max_idle_sleep_s: float = 0.005) -> bool:
        """Poll until every rank said BYE or was lost, or until `deadline_s` (monotonic
        seconds).  At the deadline the ranks still running are reported lost.  True
        when every rank finished cleanly."""
        nap = idle_sleep_s
        while not self.finished:
            if deadline_s is not None and time.monotonic() >= deadline_s:
                for st in self.state.values():
                    if not (st.bye or st.lost):
                        st.lost = True
                        self.sink.on_rank_lost(st.rank)
                        if self.say:
                            self.say(f"rank {st.rank}: not done at the deadline, treated as lost")
                break
            if self.poll():
                nap = idle_sleep_s
            else:                 # back off while idle: the ranks share the cores
                time.sleep(nap)
                nap = min(nap * 2, max_idle_sleep_s)
        self.poll()
        return all(st.bye for st in self.state.values())

    def close(self, timeout_s: float = 2.0) -> None:
        """Finish our sends (FINs) within the timeout and cancel the posted receive."""
        deadline = time.monotonic() + timeout_s
        while self._sends and time.monotonic() < deadline:
            self._sends = [h for h in self._sends if not self.port.done(h)]
            if self._sends:
                time.sleep(0.0002)
        for h in self._sends:
            self.port.cancel(h)
        self._sends = []
        if self._recv is not None:
            self.port.cancel(self._recv)
            self._recv = None
        if self.spool is not None:
            self.spool.close()
            self.spool = None

    def report(self) -> Dict[str, object]:
        """Transport facts for the result (beside the diagnosis)."""
        out = {}
        for r, st in sorted(self.state.items()):
            out[str(r)] = {"messages": st.messages, "bytes": st.bytes, "done": st.bye,
                           "lost": st.lost, "pingpongs": st.pingpongs,
                           "min_rtt_us": (round(st.min_rtt_ns / 1000.0, 1)
                                          if st.min_rtt_ns is not None else None)}
        return {"ranks": out, "bad_headers": self.bad_headers}


# ------------------------------------------------------------------------------ roles

@dataclass(frozen=True)
class Roles:
    """Who does what in this MPI job."""
    mpmd: bool
    is_collector: bool
    is_rank: bool
    rank: int                 # logical serving rank (-1 for an MPMD collector)
    ranks: int                # number of serving ranks
    collector: int            # world rank of the collector
    world_rank: int


def roles(comm) -> Tuple[Roles, object]:
    """Split roles by `MPI.APPNUM`; returns (Roles, the serving ranks' communicator or
    None for an MPMD collector).  Serving ranks are world ranks of app 0, in order."""
    from mpi4py import MPI
    appnum = comm.Get_attr(MPI.APPNUM)
    appnum = 0 if appnum is None else int(appnum)
    me = comm.Get_rank()
    apps = comm.allgather(appnum)
    mpmd = max(apps) > 0
    if mpmd:
        serving = [r for r, a in enumerate(apps) if a == 0]
        collector = next(r for r, a in enumerate(apps) if a != 0)
        is_collector = appnum != 0 and me == collector
        sub = comm.Split(0 if appnum == 0 else 1, me)
        if appnum != 0:
            sub.Free()
            sub = None
        rank = serving.index(me) if appnum == 0 else -1
        return Roles(True, is_collector, appnum == 0, rank, len(serving), collector, me), sub
    sub = comm.Dup()
    return Roles(False, me == 0, True, me, comm.Get_size(), 0, me), sub


# ------------------------------------------------------------------------------- sink

def CollectorSink(use_pingpongs: bool = True):
    """The `Accumulator` the collector feeds.  `use_pingpongs=False` (sim backend: the
    ranks' clock samples are on simulated host clocks, which real host ping-pongs say
    nothing about) keeps the ping-pongs out of the clock model; the transport report
    still shows their round trips."""
    from .diagnose import Accumulator

    class _Sink(Accumulator):
        def __init__(self):
            super().__init__()
            self.use_pingpongs = use_pingpongs
            self.side_pingpongs: List[PingPong] = []

        def on_record(self, rank, record):
            if isinstance(record, PingPong) and not self.use_pingpongs:
                self.side_pingpongs.append(record)
                return
            self.add(record)

    return _Sink()


def open_spool(path: str):
    """An unbuffered spool file for `CollectorLoop(spool=...)`: if the MPI job dies (a
    dead rank makes mpiexec kill everyone, the collector included), what arrived is
    still on disk and `replay_spool` turns it into a partial result."""
    return open(path, "wb", buffering=0)


def replay_spool(path: str, ranks: Sequence[int], sink) -> "CollectorLoop":
    """Feed a spool file's messages into `sink` as the live loop did; ranks that never
    said BYE are reported lost.  Returns the (port-less) loop for its report."""
    loop = CollectorLoop(None, ranks, sink, start_pings=0)
    try:
        data = open(path, "rb").read()
    except OSError:
        data = b""
    i = 0
    while i + _LEN.size <= len(data):
        (n,) = _LEN.unpack_from(data, i)
        i += _LEN.size
        if i + n > len(data):          # the last write was cut off
            break
        loop.handle(data[i:i + n])
        i += n
    for st in loop.state.values():
        if not st.bye:
            st.lost = True
            sink.on_rank_lost(st.rank)
    return loop


def monitors_output(notes: Dict[int, List[bytes]]) -> Dict[str, Any]:
    """User monitors' output that ranks sent as notes (`CollectorLoop.notes`), per rank,
    for the result's "monitors" entry (the last note of a rank wins; bad JSON is skipped)."""
    mons: Dict[str, Any] = {}
    for rank, raws in sorted(notes.items()):
        for raw in raws:
            try:
                doc = json.loads(raw)
            except ValueError:
                continue
            mons[str(rank)] = {"blocks": doc.get("blocks", []), "cut": doc.get("cut", 0)}
    return mons
