"""Host dtrace_mk inside an existing serving loop: the agent, live queries, the control socket.

    from dtrace_mk.launch.api import ServingHost

    host = ServingHost(num_workers=132, schema=graph.schema)   # every serving rank (collective)
    step = 0
    while serving and not host.should_stop(step):
        host.step(step)                     # at each decode-step boundary, on every rank
        for rec in run_one_step():          # packed 128-byte hook contexts (device ring, sim)
            host.feed(rec)                  #   or host.sink(ctx_dict) for the sim's dicts
        host.clock_sample(device_ns, host_ns)   # when the loop has a (device, host) reading
        step += 1
    result = host.close()                   # final outputs, agent BYE; the diagnosis when
                                            # this rank also collects (not MPMD), else None

What it does
------------
* Runs the per-rank agent (`runtime.agent.RankAgent`: default summary monitors, epochs,
  shipping to the collector over `collectors.transport`).  Under `dtrace-mk launch` the
  collector is an MPMD process (`MPI.APPNUM == 1`); without one, serving rank 0 also
  collects (in-process) and `close()` returns the diagnosis.
* On serving rank 0, when the process belongs to a job (`DTRACE_MK_JOB_DIR`, set by
  `dtrace-mk launch`; or `job=`), serves the job's control socket (`launch.control`).
* Live queries: an attach request (an ELF object, verified by the client and again by
  rank 0's control thread) becomes a command `{op, id, apply_at}` that rank 0 sends to
  every serving rank over MPI (non-blocking Isend on a private communicator; the others
  test for it in `step`/`poll`).  Each rank applies a command at its first step boundary
  `>= apply_at` (rank 0 picks its current step + 2, so coupled ranks apply it at the same
  step; a rank that learns of it later applies it at once and its output says at which
  step), attaching the object to its own runtime (`lang.host.QueryRun`, verified again
  at attach).  Every `interval_s` rank 0 asks for a report: each rank renders the
  query's maps through the printing plan (with coverage) and sends the blocks to rank 0,
  which streams them to the attached client once every rank's part has arrived.
  Detach (or the client leaving, or the job ending) gives a final report.
* A loop whose megakernel runs monitors itself (the GPU backend: `live_runtime` =
  `launch.device_live.DeviceQueries`) runs live queries there, never fed; their
  `interval:` clauses run on rank 0's clock, which tells every rank each tick and the step
  to cut at (`clause` commands: runtime.device_query), so the ranks' ticks cover the same
  steps; with
  `summarize_on_device(first_epoch)` the agent's summaries run there too
  (their task half, in windows of steps), the loop need feed only `agent_hooks()`
  records, and `step(k)` ships the windows the device has completed.

Threading and cost: everything runs on the caller's thread except the control socket's
threads (which only queue requests).  `feed` is the hot path: one dict lookup per live
query on the record's hook id, then the monitors.  `step`/`poll` never block.

MPI: the constructor is collective over `MPI.COMM_WORLD` (the collector process, when
MPMD, must call `collectors.transport.roles` too -- `launch.collector` does); the other
calls use point-to-point messages only, so they never deadlock a loop whose ranks run at
different speeds.
"""
from __future__ import annotations

import os
import struct
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Set

from ..abi import context
from ..abi import definition as abi
from ..errors import UserError

TAG_DOWN = 7301          # rank 0 -> ranks: commands
TAG_UP = 7302            # ranks -> rank 0: outputs, stop requests
#: A device query's cut in a job of several ranks starts this many steps past rank 0's
#: grant: a rank that learns of it one agreed step late has not started that step either.
CUT_LEAD_STEPS = 1
_HOOK = struct.Struct("<I")
_OFF_HOOK = context.OFF_HOOK
ALL_HOOKS = tuple(h.name for h in abi.HOOKS)


def validate_object(raw: bytes, name: str = "<query>"):
    """Load and verify an attach request's ELF object; a `UserError`/`Rejected` names the
    problem.  Pure: called on the control thread."""
    from ..bpf.elf import load_object
    from ..bpf.verifier import verify
    from ..lang.host import find_plan
    obj = load_object(bytes(raw), name=name)
    if not obj.programs:
        raise UserError(f"{name}: no programs to attach")
    for p in obj.programs:
        pt = abi.PROGRAM_TYPES_BY_NAME.get(p.prog_type)
        if pt is None or not pt.attachable:
            raise UserError(f"{name}: program '{p.name}': {p.prog_type} programs cannot be attached")
        try:
            verify(p, obj.maps)
        except UserError as e:
            e.args = (f"{name}: {p.section} {p.name}: {e}",)
            raise
    if find_plan(obj) is None:
        raise UserError(f"{name}: no printing plan (compile it from a query: dtrace-mk compile)")
    return obj


@dataclass
class LiveQuery:
    aid: int
    name: str
    run: Any                       # lang.host.QueryRun
    hooks: Set[int]
    attached_at: int
    printed: int = 0               # text blocks already reported
    exit_told: bool = False        # its exit() reported to rank 0 (which detaches it everywhere)
    exit_polled: int = -1          # a device query: the step its exit map was last read at


@dataclass
class _Attachment:                 # rank 0's view, for status and reports
    aid: int
    name: str
    text: str
    apply_at: int
    interval_s: float
    next_report: float
    seq: int = 0
    detaching: bool = False
    parts: Dict[int, Dict[int, dict]] = field(default_factory=dict)   # seq -> rank -> part
    final_seq: Optional[int] = None


class _Link:
    """Commands down (rank 0 -> all) and outputs up (all -> rank 0) on a private
    communicator; non-blocking sends, tested receives."""

    def __init__(self, comm):
        self.comm = comm
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.sends: List[Any] = []

    def _isend(self, obj, dest: int, tag: int) -> None:
        self.sends.append(self.comm.isend(obj, dest=dest, tag=tag))
        self.sends = [r for r in self.sends if not r.Test()]

    def down(self, cmd: dict) -> None:
        for d in range(1, self.size):
            self._isend(cmd, d, TAG_DOWN)

    def up(self, msg: dict) -> None:
        self._isend(msg, 0, TAG_UP)

    def recv(self, tag: int, source: int) -> List[Any]:
        out = []
        while self.comm.iprobe(source=source, tag=tag):
            out.append(self.comm.recv(source=source, tag=tag))
        return out

    def close(self, timeout_s: float = 2.0) -> None:
        deadline = time.monotonic() + timeout_s
        while self.sends and time.monotonic() < deadline:
            self.sends = [r for r in self.sends if not r.Test()]
            if self.sends:
                time.sleep(0.001)
        for r in self.sends:
            try:
                r.Cancel()
            except Exception:     # already complete
                pass
        self.sends = []


class ServingHost:
    """See the module docstring.  `schema`: the task schema, or a callable
    `(rank, ranks) -> schema` (the graph of a rank needs its rank).  `say(line)` gets
    progress lines."""

    def __init__(self, *, num_workers: int, schema=None, comm=None, job=None,
                 monitors: Sequence[str] = (), budget_bytes_per_step: Optional[int] = None,
                 backend: str = "sim", say: Optional[Callable[[str], None]] = None,
                 apply_lag: int = 2, escalate: Optional[bool] = None):
        from mpi4py import MPI
        from ..collectors import transport as T
        from ..runtime.agent import RankAgent
        from . import jobs
        world = comm if comm is not None else MPI.COMM_WORLD
        self.roles, sub = T.roles(world)
        if not self.roles.is_rank:
            raise UserError("ServingHost: this process is the MPMD collector, not a serving rank "
                            "(run launch.collector there)")
        self.rank, self.ranks = self.roles.rank, self.roles.ranks
        self.comm = sub
        self.say = say or (lambda s: print(f"dtrace-mk [rank {self.rank}]: {s}", file=sys.stderr,
                                           flush=True))
        if callable(schema):           # schema(rank, ranks[, comm]): the graph needs the rank first
            import inspect
            try:
                n_args = len(inspect.signature(schema).parameters)
            except (TypeError, ValueError):
                n_args = 2
            schema = schema(self.rank, self.ranks, sub) if n_args >= 3 else schema(self.rank, self.ranks)
        self.schema = schema
        if callable(num_workers):      # known once the schema callable built the rank's kernel
            num_workers = num_workers()
        self.num_workers = num_workers
        #: the runtime live queries attach to, when not the host reference runtime: on the
        #: GPU backend `launch.device_live.DeviceQueries` (the device VM of the running
        #: megakernel); None: each query runs in a host ReferenceRuntime fed by `feed`
        self.live_runtime = None
        self.backend = backend
        self.apply_lag = max(1, apply_lag)
        port = T.MpiPort(world)
        self.loop = self.acc = None
        if self.roles.is_collector:               # rank 0 collects in-process (not MPMD)
            self.acc = T.CollectorSink(use_pingpongs=(backend == "gpu"))
            self.loop = T.CollectorLoop(port, list(range(self.ranks)), self.acc,
                                        progress=None, silence_timeout_s=300.0)
            channel = T.DirectChannel(self.loop, self.rank)
        else:
            channel = T.RankChannel(port, self.roles.collector, self.rank)
        # escalated evidence (runtime/agent.py) by default on sim ranks only: on GPU ranks the
        # host agent already paces serving (operations.md), one more program per task:end
        # would slow it further
        self.agent = RankAgent(self.rank, channel, num_workers=num_workers, schema=schema,
                               monitors=monitors, budget_bytes_per_step=budget_bytes_per_step,
                               escalate=(backend != "gpu") if escalate is None else escalate)
        self.agent.start(pings=8 if self.roles.mpmd else 0)
        self._agent_hooks = {abi.hook(h).id for h in self.agent.hooks}
        self.link = _Link(sub.Dup())
        self.live: Dict[int, LiveQuery] = {}
        self.pending: List[dict] = []
        self.step_now = -1
        self.stop_at: Optional[int] = None
        self.stop_wanted = False            # a local reason to stop (signal, duration)
        self.closed = False
        self._last_poll = 0.0
        # rank 0: the job's control socket
        self.server = None
        self.job = None
        self.attachments: Dict[int, _Attachment] = {}
        self._next_id = 1
        self.status_extra: Dict[str, Any] = {}
        if self.rank == 0:
            job_dir = os.environ.get(jobs.ENV_JOB_DIR) if job is None else None
            self.job = job if job is not None else (jobs.job_from_dir(job_dir) if job_dir else None)
            if self.job is not None:
                from .control import ControlServer
                self.server = ControlServer(self.job, validate_object)

    # -- the serving loop's calls -------------------------------------------------------
    def hooks(self) -> List[str]:
        """Hooks the serving loop should emit: all of them (a live query may attach to any)."""
        return list(ALL_HOOKS)

    def summarize_on_device(self, first_epoch: int, window: Optional[int] = None) -> None:
        """Device summaries (runtime/agent.py `summarize_on`): the agent's task half runs in
        `live_runtime`, the device VM of this rank's megakernel, beside the live queries, so
        the serving loop need stream only `agent_hooks()` to `feed`; `step(k)` ships the
        summaries' windows the device has completed."""
        if self.live_runtime is None:
            raise UserError("device summaries: the rank has no device runtime (live_runtime)")
        self.agent.summarize_on(self.live_runtime, first_epoch, window)
        self._agent_hooks = {abi.hook(h).id for h in self.agent.hooks}

    def agent_hooks(self) -> List[str]:
        """The hooks whose records `feed` uses when live queries run on the device."""
        return list(self.agent.hooks)

    def sink(self, ctx: Mapping[str, Any]) -> None:
        """The sim backend's sink (one context dict)."""
        from ..megakernel.sim import pack_ctx
        self.feed(pack_ctx(ctx))

    def feed(self, rec: bytes) -> None:
        """One packed 128-byte context (in nondecreasing ts order per worker)."""
        hid = _HOOK.unpack_from(rec, _OFF_HOOK)[0]
        if hid in self._agent_hooks:
            self.agent.feed(rec)
        for q in self.live.values():
            if hid in q.hooks:
                q.run.feed(rec)

    def clock_sample(self, device_ns: int, host_ns: int) -> None:
        self.agent.clock_sample(device_ns, host_ns)

    def step(self, k: int) -> None:
        """Decode step `k` begins on this rank (every record of the steps before it was
        fed): apply due commands, make progress; with device summaries, ship the windows
        complete by then (RankAgent.device_progress)."""
        self.step_now = k
        self.agent.device_progress(k - 1)
        self.poll(force=True)

    def should_stop(self, k: int) -> bool:
        """True from the step the job agreed to stop at (a control `stop`, or any rank's
        `request_stop`)."""
        return self.stop_at is not None and k >= self.stop_at

    def request_stop(self) -> None:
        """Ask the job to stop at a step boundary soon (a signal handler may call it)."""
        self.stop_wanted = True

    def poll(self, force: bool = False) -> None:
        """Non-blocking progress: commands, control requests, reports, the agent's channel."""
        now = time.monotonic()
        if not force and now - self._last_poll < 0.002:
            return
        self._last_poll = now
        if self.rank == 0:
            for msg in self.link.recv(TAG_UP, _any_source()):
                self._on_up(msg)
            self._control(now)
            if self.stop_wanted and self.stop_at is None:
                self._broadcast({"op": "stop"})
        else:
            self.pending.extend(self.link.recv(TAG_DOWN, 0))
            if self.stop_wanted and self.stop_at is None and not getattr(self, "_asked", False):
                self._asked = True
                self.link.up({"op": "stop_request", "rank": self.rank})
        if self.pending and self.step_now >= 0:
            due = [c for c in self.pending if c["apply_at"] <= self.step_now]
            if due:
                self.pending = [c for c in self.pending if c["apply_at"] > self.step_now]
                for c in due:
                    self._apply(c)
        if self.live_runtime is not None:
            self._tick_device_queries()
        self._tell_exits()
        self.agent.progress()

    def _tick_device_queries(self) -> None:
        """Queries in the device VM are never fed: their interval clauses run on the host's
        clock -- rank 0's, for every rank: it tells each clause due to the whole job with
        the step its cut starts at (CUT_LEAD_STEPS past its grant, which no rank has
        started), so every rank's tick covers the same steps (`--merge` pairs them) -- and
        their exit map is read once a step (the kernel may be a few steps ahead of the
        host: such a query counts on until rank 0's detach applies)."""
        for q in self.live.values():
            if q.exit_told or q.run.exited:
                continue
            if self.rank == 0:
                due = q.run.due_clauses(time.monotonic_ns())
                if due:
                    at = int(self.live_runtime.unstarted_step()) + (CUT_LEAD_STEPS if self.ranks > 1 else 0)
                    a = self.attachments.get(q.aid)
                    for i, ts_ns in due:
                        cut = q.run.run_clause(i, ts_ns, at)    # where it did cut (or reused one)
                        if self.ranks > 1:      # after the attach on every rank (its apply_at)
                            self.link.down({"op": "clause", "id": q.aid, "clause": i, "ts_ns": ts_ns,
                                            "at": at if cut is None else cut,
                                            "apply_at": a.apply_at if a is not None else self.step_now})
            q.run.drain()
            if q.exit_polled != self.step_now:
                q.exit_polled = self.step_now
                q.run.poll_exit()

    def _tell_exits(self) -> None:
        """A query that ran exit() on this rank stops here at once (QueryRun); rank 0 is
        told, and detaches it on every rank at the next step boundary (bpftrace's exit()
        ends the whole trace, and so it does for a job)."""
        for q in self.live.values():
            if q.run.exited and not q.exit_told:
                q.exit_told = True
                msg = {"op": "exit", "id": q.aid, "rank": self.rank, "step": self.step_now}
                if self.rank == 0:
                    self._on_up(msg)
                else:
                    self.link.up(msg)

    def wait_for_attach(self, timeout_s: float) -> bool:
        """Hold before serving until the first query is attached (demos, tests) or the
        timeout passes; every rank calls it.  True when a query came."""
        deadline = time.monotonic() + timeout_s
        got = False
        while time.monotonic() < deadline:
            if self.rank == 0:
                self._control(time.monotonic())
                got = bool(self.attachments)
            else:
                self.pending.extend(self.link.recv(TAG_DOWN, 0))
                got = any(c["op"] in ("attach", "go") for c in self.pending)
            if got:
                break
            self.agent.progress()
            time.sleep(0.005)
        if self.rank == 0:
            self._broadcast({"op": "go"})
        else:
            while not any(c["op"] == "go" for c in self.pending) and time.monotonic() < deadline + 30:
                self.pending.extend(self.link.recv(TAG_DOWN, 0))
                time.sleep(0.002)
        self.pending = [c for c in self.pending if c["op"] != "go"]
        return got

    def close(self, timeout_s: float = 10.0):
        """End of serving: final outputs of live queries, the agent's last epochs and BYE.
        Returns the diagnosis when this rank collected in-process, else None."""
        if self.closed:
            return None
        self.closed = True
        deadline = time.monotonic() + timeout_s
        for aid in list(self.live):
            self._final(aid, "job ended")
        if self.rank == 0:
            for a in list(self.attachments.values()):
                a.detaching = True
                if a.apply_at > self.step_now:           # never attached anywhere
                    self.attachments.pop(a.aid)
                    if self.server is not None:
                        self.server.end(a.aid, f"job ended before step {a.apply_at}, where the query "
                                               f"would have attached")
            end = min(deadline, time.monotonic() + 5.0)
            while self.attachments and time.monotonic() < end:   # the other ranks' final parts
                msgs = self.link.recv(TAG_UP, _any_source())
                for msg in msgs:
                    self._on_up(msg)
                if not msgs:
                    time.sleep(0.002)
            for a in list(self.attachments.values()):      # ranks whose final part never came
                if -1 in a.parts:
                    self._publish(a, -1, partial=True)
                elif self.server is not None:
                    self.server.end(a.aid, "job ended")
            if self.server is not None:
                self.server.close("job ended")
        self.agent.close(max(0.5, deadline - time.monotonic()))
        self.link.close()
        if self.loop is not None:
            self.loop.run(deadline_s=time.monotonic() + timeout_s)
            self.loop.close()
            res = self.acc.result(None, ranks=self.ranks)
            res["scenario"] = self.job.id if self.job is not None else "serve"
            res["transport"].update(self.loop.report())
            return res
        return None

    # -- rank 0: control requests ----------------------------------------------------------
    def _control(self, now: float) -> None:
        if self.server is None:
            return
        import queue as _q
        while True:
            try:
                r = self.server.requests.get_nowait()
            except _q.Empty:
                break
            try:
                r.answer(self._request(r))
            except UserError as e:
                r.answer({"ok": False, "error": str(e)})
        for a in list(self.attachments.values()):
            if not a.detaching and now >= a.next_report and self.step_now >= a.apply_at:
                a.next_report = now + a.interval_s
                if not self.server.subscribers(a.aid):      # nobody streams it: no report
                    continue
                a.seq += 1
                self._broadcast({"op": "report", "id": a.aid, "seq": a.seq})

    def _request(self, r) -> Dict[str, Any]:
        if r.op == "status":
            return {"ok": True, "op": "status", "step": self.step_now, "ranks": self.ranks,
                    "job": self.job.info() if self.job else {}, "stopping": self.stop_at is not None,
                    **self.status_extra,
                    "attachments": [{"id": a.aid, "name": a.name, "text": a.text,
                                     "apply_at": a.apply_at, "interval_s": a.interval_s,
                                     "detaching": a.detaching,
                                     "subscribers": self.server.subscribers(a.aid)}
                                    for a in self.attachments.values()]}
        if self.stop_at is not None or self.closed:
            raise UserError(f"the job is stopping (at step {self.stop_at}); nothing attached")
        if r.op == "attach":
            from ..bpf.elfwrite import write_object
            aid = self._next_id
            self._next_id += 1
            iv = r.body.get("interval_s", 1.0)
            iv = float(iv) if isinstance(iv, (int, float)) and iv > 0 else 1.0
            apply_at = max(self.step_now, 0) + self.apply_lag
            self.attachments[aid] = _Attachment(aid, str(r.body.get("name") or "<query>"),
                                                str(r.body.get("text") or "")[:4000], apply_at,
                                                max(0.05, iv), time.monotonic() + iv)
            self._broadcast({"op": "attach", "id": aid, "object": write_object(r.obj),
                             "name": str(r.body.get("name") or "<query>")}, apply_at)
            self.say(f"query {aid} ({self.attachments[aid].name}) attaches at step {apply_at}")
            return {"ok": True, "op": "attach", "id": aid, "apply_at": apply_at}
        if r.op == "detach":
            aid = r.body["id"]
            a = self.attachments.get(aid)
            if a is None or a.detaching:
                raise UserError(f"no attached query {aid} (dtrace-mk list shows them)")
            a.detaching = True
            apply_at = max(self.step_now + 1, a.apply_at)
            self._broadcast({"op": "detach", "id": aid,
                             "why": r.body.get("why", "detached")}, apply_at)
            self.say(f"query {aid} detaches at step {apply_at}")
            return {"ok": True, "op": "detach", "id": aid, "apply_at": apply_at}
        if r.op == "stop":
            self.stop_wanted = True
            at = self._broadcast({"op": "stop"})
            return {"ok": True, "op": "stop", "at_step": at}
        raise UserError(f"unknown op {r.op!r}")

    def _broadcast(self, cmd: dict, apply_at: Optional[int] = None) -> int:
        if apply_at is None:
            apply_at = max(self.step_now, 0) + self.apply_lag
        cmd = dict(cmd, apply_at=apply_at)
        if cmd["op"] == "stop":
            self.stop_at = apply_at if self.stop_at is None else min(self.stop_at, apply_at)
        self.link.down(cmd)
        self.pending.append(cmd)
        return apply_at

    # -- every rank: commands --------------------------------------------------------------
    def _apply(self, c: dict) -> None:
        op = c["op"]
        if op == "attach":
            from ..bpf.elf import load_object
            from ..lang.host import QueryRun
            from ..runtime.device_query import device_query_run
            try:
                obj = load_object(bytes(c["object"]))
                if self.live_runtime is not None:       # runs in the device VM, not fed here
                    q = device_query_run(obj, self.live_runtime)
                else:
                    q = QueryRun(obj, None, num_workers=self.num_workers)
                q.begin()
            except UserError as e:        # verified twice before; report, never crash serving
                err = {"op": "error", "id": c["id"], "rank": self.rank, "error": str(e)}
                if self.rank == 0:
                    self._on_up(err)
                else:
                    self.link.up(err)
                return
            hooks = {p.hook.id for p in obj.programs} if self.live_runtime is None else set()
            self.live[c["id"]] = LiveQuery(c["id"], c.get("name", "<query>"), q, hooks, self.step_now)
        elif op == "clause":                    # rank 0's interval tick (_tick_device_queries)
            q = self.live.get(c["id"])
            if q is not None and not q.exit_told:
                q.run.run_clause(c["clause"], c["ts_ns"], c["at"])
        elif op == "report":
            q = self.live.get(c["id"])
            if q is not None:
                self._send_part(q, c["seq"], final=False)
        elif op == "detach":
            if c["id"] in self.live:
                self._final(c["id"], c.get("why", "detached"))
        elif op == "stop":
            self.stop_at = c["apply_at"] if self.stop_at is None else min(self.stop_at, c["apply_at"])

    def _final(self, aid: int, why: str) -> None:
        q = self.live.pop(aid)
        q.run.finish()
        self._send_part(q, -1, final=True, why=why)
        if self.live_runtime is not None:
            for att in q.run.attachments():
                try:                      # the device VM stops running it from the next launch
                    self.live_runtime.detach(att)
                except UserError as e:
                    self.say(f"query {aid}: detach from the device: {e}")

    def _send_part(self, q: LiveQuery, seq: int, final: bool, why: str = "") -> None:
        run = q.run
        if final:
            blocks = run.blocks[q.printed:]
        else:
            blocks = list(run.blocks[q.printed:])
            q.printed = len(run.blocks)
            blocks.extend(run.map_blocks(run.plan["maps"], "interval"))
        msg = {"op": "part", "id": q.aid, "seq": seq, "final": final, "why": why, "rank": self.rank,
               "step": self.step_now, "attached_at": q.attached_at, "blocks": blocks}
        if self.rank == 0:
            self._on_up(msg)
        else:
            self.link.up(msg)

    # -- rank 0: outputs -------------------------------------------------------------------
    def _on_up(self, msg: dict) -> None:
        op = msg.get("op")
        if op == "stop_request":
            self.stop_wanted = True
            return
        a = self.attachments.get(msg.get("id"))
        if a is None:
            return
        if op == "exit":
            if not a.detaching:
                a.detaching = True
                why = f"exit() on rank {msg['rank']} at step {msg['step']}"
                at = self._broadcast({"op": "detach", "id": a.aid, "why": why},
                                     max(self.step_now + 1, a.apply_at))
                self.say(f"query {a.aid}: {why}; detaches at step {at}")
            return
        if op == "error":
            self.say(f"query {a.aid} failed on rank {msg['rank']}: {msg['error']}")
            if self.server is not None:
                self.server.publish(a.aid, {"type": "error", "id": a.aid, "rank": msg["rank"],
                                            "error": msg["error"]})
            return
        seq = msg["seq"]
        if msg["final"]:
            a.final_seq = seq
            a.detaching = True
        a.parts.setdefault(seq, {})[msg["rank"]] = {k: msg[k] for k in ("step", "attached_at", "blocks", "why")}
        if len(a.parts[seq]) == self.ranks:
            self._publish(a, seq)

    def _publish(self, a: _Attachment, seq: int, partial: bool = False) -> None:
        parts = a.parts.pop(seq, {})
        final = seq == -1
        if self.server is not None:
            self.server.publish(a.aid, {"type": "output", "id": a.aid, "seq": seq, "final": final,
                                        "partial": partial,
                                        "ranks": {str(r): p for r, p in sorted(parts.items())}})
            if final:
                why = next((p.get("why") for p in parts.values() if p.get("why")), "detached")
                self.server.end(a.aid, why)
        if final:
            self.attachments.pop(a.aid, None)


def _any_source() -> int:
    from mpi4py import MPI
    return MPI.ANY_SOURCE


def _span(values) -> str:
    lo, hi = min(values), max(values)
    return f"{lo}" if lo == hi else f"{lo}..{hi}"


def render_merged(msg: Mapping[str, Any], fmt: str = "text") -> str:
    """One streamed output message as ONE view of the job: every rank's maps combined
    (lang.printing.merge_blocks), under a header naming the ranks and their steps (each
    rank's maps are as of its own step); ranks without output yet are named."""
    import json
    from ..lang import printing
    parts = sorted(((int(r), p) for r, p in msg.get("ranks", {}).items()), key=lambda rp: rp[0])
    have = [(r, p) for r, p in parts if p["blocks"]]
    waiting = [r for r, p in parts if not p["blocks"]]
    merged = printing.merge_blocks([p["blocks"] for _, p in have], [r for r, _ in have])
    if fmt == "json":
        head = {"query": msg["id"], "ranks": [r for r, _ in have], "steps": [p["step"] for _, p in have],
                "final": msg.get("final", False)}
        return "".join(json.dumps({**head, **b}, sort_keys=True) + "\n" for b in merged)
    what = "final" if msg.get("final") else "interval"
    ranks = ", ".join(str(r) for r, _ in have) or "none"
    head = f"-- query {msg['id']}, ranks {ranks} merged"
    if have:
        head += (f" ({what}; step {_span([p['step'] for _, p in have])}, attached at step "
                 f"{_span([p['attached_at'] for _, p in have])})")
    if waiting:
        head += f"; no output yet from rank{'s' if len(waiting) > 1 else ''} {', '.join(map(str, waiting))}"
    text = printing.render_text(merged)
    return head + " --\n" + (text.rstrip("\n") if text.strip() else "(no output yet)") + "\n"


def render_output(msg: Mapping[str, Any], fmt: str = "text", merge: bool = False) -> str:
    """One streamed output message as text (per rank: a header, then the maps as the
    printing plan renders them, coverage under each) or NDJSON; merge: one view of every
    rank (render_merged)."""
    import json
    from ..lang import printing
    if merge:
        return render_merged(msg, fmt)
    out = []
    for r, part in sorted(msg.get("ranks", {}).items(), key=lambda kv: int(kv[0])):
        if fmt == "json":
            for b in part["blocks"]:
                out.append(json.dumps({"query": msg["id"], "rank": int(r), "step": part["step"],
                                       "final": msg.get("final", False), **b}, sort_keys=True))
            continue
        what = "final" if msg.get("final") else "interval"
        out.append(f"-- query {msg['id']} rank {r}, step {part['step']} ({what}; attached at step "
                   f"{part['attached_at']}) --")
        text = printing.render_text(part["blocks"])
        out.append(text.rstrip("\n") if text.strip() else "(no output yet)")
    return "\n".join(out) + "\n"
