"""The reference server: a decode loop with request arrivals and continuous batching,
one MPI rank per GPU (or sim rank), hosting the dtrace_mk agent.

    python -m dtrace_mk.launch.serve --model tiny --steps 200
    dtrace-mk launch -n 2 -- python -m dtrace_mk.launch.serve --model small-moe --duration 60
    mpiexec -n 2 python -m dtrace_mk.launch.serve --model tiny --steps 64    # rank 0 collects

Serving model
-------------
* Requests arrive by a seeded Poisson process: `--rate` requests per decode step
  (default: 80% of the batch's capacity, batch / mean length), each with a length drawn
  from a geometric distribution of mean `--mean-len` tokens (at least 1, at most the
  model's max_seq).  Every rank draws the same sequence (tensor parallelism: the ranks
  serve the same batch).
* `--batch` request slots (continuous batching): a slot whose request produced its last
  token is refilled at the end of that step with the oldest waiting request; with none
  waiting it idles for a step (the persistent kernel's shapes are static, so an idle slot
  still computes: counted as idle slot-steps).  Request latency = arrival to last token,
  time to first token = arrival to the end of the first step in a slot (both in steps and
  in simulated time).
* Each step is one step of the reference megakernel: on the sim backend the discrete-event
  twin of the kernel (one MPI process per rank, remote signals over MPI); on the GPU
  backend (`serve_gpu`) the persistent megakernel stays RESIDENT across steps (one
  launch; a step gate lets it run a few steps ahead of the host), one GPU per rank
  (device rank % GPUs, SMs - 1 workers: one SM runs the clock-pairing kernel), tensor
  parallel across ranks (`megakernel.tp.TPGroup`).  Its hook records stream to the host
  while it runs; when every worker finished a step, the agent takes that step's records
  and live queries attach/detach at the next step (they run in the device VM:
  `launch.device_live`; the kernel waits at the gate for an attach's step).  A
  compiled-tier swap ends the launch at an agreed step and starts the next one.
  The first launch begins with warm-up steps (diagnose's GPU_LAUNCH_WARMUP_STEPS: the
  first step of a launch is cold) that are run but not observed; steps keep the device's
  numbers, so GPU serving steps start at that number, not 0 (`serve_gpu`).
  `auto` is gpu when CuPy sees a GPU per rank, else sim.  On the GPU the kernel draws
  request lengths itself (continuous batching in the kernel), so `--rate`/`--mean-len`
  do not apply there.
* `--steps N` serves N steps; `--duration S` serves until S seconds of wall time have
  passed (then stops at the next step boundary every rank agrees on).  SIGINT/SIGTERM or a
  control `stop` stop the same way.

Faults (the fault table is data: the same server, `--fault` repeatable):

    --fault late_comm:rank=1,steps=8-23,comm_op=allreduce_attn,delay_us=200
    --faults FILE        a YAML/JSON list of the same entries (scenario `faults:` syntax)

Live queries come in through the job's control socket (`dtrace-mk attach`);
`--await-attach S` holds the first served step (0; on the GPU the first after the
warm-up) until the first query is attached (demos, tests) or S seconds pass.  Progress lines go to stderr from rank 0.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

from ..errors import UserError
from ..runtime.summary_windows import DEFAULT_SUMMARIES, DEFAULT_WINDOW, MAX_WINDOW, MIN_WINDOW, SUMMARY_MODES

from ..megakernel.presets import SIM_WORKERS  # noqa: E402
DURATION_STEP_CAP = 1_000_000


class StopServing(Exception):
    """Every rank agreed to stop (raised in the same window on every rank)."""


# ----------------------------------------------------------------------- serving model

class ArrivalProcess:
    """Seeded Poisson arrivals per step and the continuous-batching slot refill; the
    sim asks `req_len(slot, gen, max_seq)` whenever a slot starts a new request."""

    def __init__(self, batch: int, rate: float, mean_len: float, seed: int, max_seq: int):
        import numpy as np
        self.rng = np.random.default_rng(seed)
        self.batch, self.rate, self.mean_len, self.max_seq = batch, rate, mean_len, max_seq
        self.queue: List[List[int]] = []          # [request id, arrival step, length]
        self.next_id = 0
        self.step = 0                              # the step being served
        self.slot_req: Dict[int, Optional[List[int]]] = {}
        self.slot_start: Dict[int, int] = {}
        self.arrived = self.finished = self.idle_slot_steps = self.tokens = 0
        self.latency_steps: List[int] = []
        self.ttft_steps: List[int] = []
        self._arrive(batch)                        # a warm start: one request per slot

    def _length(self) -> int:
        p = 1.0 / max(self.mean_len, 1.0)
        return int(min(max(1, self.rng.geometric(p)), self.max_seq))

    def _arrive(self, n: int) -> None:
        for _ in range(n):
            self.queue.append([self.next_id, self.step, self._length()])
            self.next_id += 1
            self.arrived += 1

    def on_step(self, k: int) -> None:
        """Step k begins: this step's arrivals join the queue."""
        self.step = k
        if k > 0:
            self._arrive(int(self.rng.poisson(self.rate)))
        self.tokens += sum(1 for r in self.slot_req.values() if r is not None)

    def req_len(self, slot: int, gen: int, max_seq: int) -> int:
        prev = self.slot_req.get(slot)
        if prev is not None:                       # its last token came in this step
            self.finished += 1
            self.latency_steps.append(self.step - prev[1] + 1)
        elif slot in self.slot_req:
            self.idle_slot_steps += 1
        if self.queue:
            req = self.queue.pop(0)
            self.slot_req[slot] = req
            self.ttft_steps.append(max(self.step, 0) + (1 if slot in self.slot_start else 0) - req[1] + 1)
            self.slot_start[slot] = self.step
            return min(req[2], max_seq)
        self.slot_req[slot] = None                 # idle for one step
        self.slot_start[slot] = self.step
        return 1

    def prompt_token(self, slot: int, gen: int, vocab: int) -> int:
        return (slot * 7919 + gen * 104729) % vocab

    def stats(self) -> Dict[str, Any]:
        lat = sorted(self.latency_steps)
        return {"arrived": self.arrived, "finished": self.finished, "queued": len(self.queue),
                "idle_slot_steps": self.idle_slot_steps,
                "latency_steps_p50": lat[len(lat) // 2] if lat else None,
                "latency_steps_p99": lat[min(len(lat) - 1, int(len(lat) * 0.99))] if lat else None,
                "ttft_steps_mean": round(sum(self.ttft_steps) / len(self.ttft_steps), 2)
                if self.ttft_steps else None}


# ------------------------------------------------------------------------------- faults

def parse_fault(text: str) -> Dict[str, Any]:
    """`kind:key=value,...` -> a scenario fault entry; steps `a-b` or `a`."""
    kind, _, rest = text.partition(":")
    out: Dict[str, Any] = {"kind": kind.strip()}
    for item in filter(None, (x.strip() for x in rest.split(","))):
        k, eq, v = item.partition("=")
        if not eq:
            raise UserError(f"--fault {text!r}: expected key=value, got {item!r}")
        k = k.strip()
        if k == "steps":
            a, dash, b = v.partition("-")
            try:
                out[k] = list(range(int(a), int(b) + 1)) if dash else [int(a)]
            except ValueError:
                raise UserError(f"--fault {text!r}: steps must be N or A-B, got {v!r}") from None
            continue
        try:
            out[k] = int(v)
        except ValueError:
            try:
                out[k] = float(v)
            except ValueError:
                out[k] = v
    return out


def fault_scenario(faults: List[Dict[str, Any]], model: str, ranks: int, steps: int, batch: int,
                   seed: int, source: str):
    """Validate fault entries with the scenario parser (one table of kinds/parameters)."""
    from ..collectors.scenario import parse_scenario
    return parse_scenario({"name": "serve", "ranks": ranks, "model": model, "steps": steps,
                           "batch": batch, "seed": seed, "faults": faults}, source)


# ------------------------------------------------------- shared by the sim and gpu loops

def _progress_say(host, args, rank: int):
    """Progress lines on stderr from rank 0 only (none with --quiet); also the host's."""
    say = (lambda s: None) if args.quiet or rank != 0 else \
        (lambda s: print(f"serve: {s}", file=sys.stderr, flush=True))
    host.say = say
    return say


def _steps_of(args) -> int:
    steps = args.steps if args.steps is not None else (DURATION_STEP_CAP if args.duration else 64)
    if steps < 1:
        raise UserError(f"--steps: expected >= 1, got {steps}")
    return steps


def _faults_of(args) -> list:
    """--fault entries, then those of --faults FILE (validated later, with the scenario's
    table of kinds and parameters)."""
    faults = [parse_fault(f) for f in args.fault]
    if args.faults:
        from ..collectors.scenario import _load_text
        try:
            faults += list(_load_text(Path(args.faults).read_text(), args.faults) or [])
        except OSError as e:
            raise UserError(f"--faults {args.faults}: cannot read ({e.strerror})") from None
    return faults


def _length_and_faults(args, steps: int, faults) -> str:
    text = f"{steps} steps" if args.steps is not None or not args.duration else f"{args.duration:g} s"
    if faults:
        text += ", faults: " + ", ".join(f"{f['kind']} rank {f.get('rank')}" for f in faults)
    return text


def _stop_on_signals(host) -> None:
    """SIGINT/SIGTERM stop at the next step boundary; a second one interrupts at once."""
    def on_signal(signum, frame):
        if host.stop_wanted:
            raise KeyboardInterrupt
        host.request_stop()
    for sg in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sg, on_signal)


def _await_attach(host, args, say, at: int = 0) -> None:
    if args.await_attach > 0:
        say(f"holding step {at} until a query attaches (at most {args.await_attach:g} s)")
        host.wait_for_attach(args.await_attach)


# -------------------------------------------------------------------------------- main

def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m dtrace_mk.launch.serve",
                                description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="tiny", help="model preset: tiny, small-moe, 1b (default tiny)")
    p.add_argument("--backend", choices=("auto", "sim", "gpu"), default=None,
                   help="auto (default; $DTRACE_MK_BACKEND): gpu when CuPy sees a GPU per rank, else sim")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--steps", type=int, help="decode steps to serve (default 64)")
    g.add_argument("--duration", type=float, metavar="S", help="serve for S seconds of wall time")
    p.add_argument("--batch", type=int, default=4, help="request slots (default 4)")
    p.add_argument("--rate", type=float, help="requests per step, Poisson (default 0.8 * batch / mean-len)")
    p.add_argument("--mean-len", type=float, default=8.0, help="mean request length in tokens (default 8)")
    p.add_argument("--seed", type=int, default=1, help="seed of arrivals and faults (default 1)")
    p.add_argument("--fault", action="append", default=[], metavar="KIND:K=V,...",
                   help="inject a fault (repeatable), e.g. late_comm:rank=1,steps=8-15,"
                        "comm_op=allreduce_attn,delay_us=200")
    p.add_argument("--faults", metavar="FILE", help="YAML/JSON list of fault entries")
    p.add_argument("--monitor", action="append", default=[], metavar="FILE",
                   help="a query file every rank runs from the start (beside the summary monitors)")
    p.add_argument("--await-attach", type=float, default=0.0, metavar="S",
                   help="hold the first served step (gpu: the first after the warm-up) until the "
                        "first live query attaches (at most S seconds)")
    p.add_argument("--tier", choices=("hot", "compiled", "auto"), default=None,
                   help="gpu backend: where live queries run: hot (device VM, default; "
                        "$DTRACE_MK_TIER), compiled (linked into the megakernel: the resident kernel "
                        "is relaunched at a step the ranks agree on), auto (hot, promoted when the tier policy says so)")
    p.add_argument("--summaries", choices=SUMMARY_MODES, default=None,
                   help=f"gpu backend: where the agent's summary monitors run (default {DEFAULT_SUMMARIES}, or "
                        "$DTRACE_MK_SUMMARIES): host = every hook record streams to the host agent, which "
                        "then paces the kernel; device = their task half runs in the megakernel's "
                        "device VM, read once per window of steps, and only comm:* records stream")
    p.add_argument("--summary-window", type=int, default=None, metavar="W",
                   help=f"gpu backend, --summaries device: decode steps per summary window (default "
                        f"{DEFAULT_WINDOW}, {MIN_WINDOW}..{MAX_WINDOW}).  Each window costs the host one attach, "
                        "one read and one flush: larger windows cost less per step, and a step's summary "
                        "reaches the collector up to W steps later")
    from ..commands.top import add_observer_arguments
    add_observer_arguments(p, "gpu backend, one rank", place="hw")
    p.add_argument("--kernel-define", action="append", default=None, metavar="DTMK_NAME",
                   help="gpu backend, one rank; repeatable: a compile-time variant of kernels/megakernel.cu "
                        "added to the build, for measurement (e.g. DTMK_NO_DRAIN_POLL, the wait without the drain's "
                        "poller: bench/serve.py configs workers+DTMK_NO_DRAIN_POLL; docs/results/hooks.md session 48)")
    p.add_argument("--progress-s", type=float, default=2.0, help="seconds between progress lines")
    p.add_argument("--result", metavar="FILE", help="without a launcher: write rank 0's diagnosis here")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    return p


def gpu_count() -> int:
    """CUDA devices CuPy sees (0 without CuPy or a driver): megakernel.gpu.gpu_count."""
    from ..megakernel.gpu import gpu_count as count
    return count()[0]


def resolve_backend(requested: Optional[str], ranks: Optional[int] = None) -> str:
    """auto: gpu when CuPy sees at least `ranks` GPUs (default: the MPI world's size less
    the collector), else sim."""
    import os
    b = requested or os.environ.get("DTRACE_MK_BACKEND") or "auto"
    if b not in ("auto", "sim", "gpu"):
        raise UserError(f"--backend: expected auto, sim or gpu, got {b!r}")
    if b != "auto":
        return b
    n = gpu_count()
    if n == 0:
        return "sim"
    if ranks is None:
        try:
            from mpi4py import MPI
            ranks = MPI.COMM_WORLD.Get_size() - (1 if os.environ.get("DTRACE_MK_JOB_DIR") else 0)
        except Exception:
            ranks = 1
    return "gpu" if n >= max(1, ranks) else "sim"


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return serve(args)
    except UserError as e:
        print(f"dtrace_mk.launch.serve: {e}", file=sys.stderr, flush=True)
        _abort_job(e.exit_code)
        return e.exit_code
    except BaseException:
        import traceback
        traceback.print_exc()
        sys.stderr.flush()
        _abort_job(1)
        raise


def _abort_job(code: int) -> None:
    """A rank that fails ends the whole MPI job: its peers (and the collector) would
    otherwise wait for it forever (MPI_Finalize, the window exchange, the collector's
    role split).  A single process without a launcher just returns."""
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is None or not mpi.Is_initialized() or mpi.Is_finalized():
        return
    if mpi.COMM_WORLD.Get_size() > 1:
        mpi.COMM_WORLD.Abort(code)


#: what --kernel-define takes (bench/serve.py's +D configs check the same)
KERNEL_DEFINE = re.compile(r"DTMK_[A-Z0-9_]+(=[0-9]+)?")


def kernel_defines(args: argparse.Namespace) -> tuple:
    """--kernel-define's names, checked (DTMK_NAME or DTMK_NAME=N; the kernel's own #error
    lines refuse combinations it cannot build)."""
    names = tuple(getattr(args, "kernel_define", None) or ())
    for d in names:
        if not KERNEL_DEFINE.fullmatch(d):
            raise UserError(f"--kernel-define {d!r}: expected DTMK_NAME or DTMK_NAME=N (a macro of "
                            f"kernels/megakernel.cu, e.g. DTMK_NO_DRAIN_POLL)")
    return names


def observer_build(args: argparse.Namespace, extra: tuple = ()) -> tuple:
    """serve --observer sm's build: (defines, idle SMs).  --observer-place calibrate (or auto)
    pins the observers (-DDTMK_SM_WORKER), which a grid one SM short of the GPU cannot: the
    SMs it gets may change between launches.  So the grid holds every SM and the clock
    pairs' one idles (-DDTMK_SM_IDLE: its CTA leaves at once).  Not the default (hw): on 1b
    the serving steps were 3.7% slower pinned, side by side (hooks.md sessions 52-53)."""
    from ..commands.top import observer_place_defines
    from ..megakernel.gpu import observer_defines
    pin = observer_place_defines("sm", getattr(args, "observer_place", "hw"))   # (auto resolved there)
    return (observer_defines("sm", getattr(args, "observer_sms", None)) + pin
            + (("DTMK_SM_IDLE",) if pin else ()) + tuple(extra)), (1 if pin else 0)


def place_observers_calibrated(mk, twin) -> str:
    """Calibrate the observers' SMs on `twin` (obs_place.calibrate_twin: the summary
    monitor, as top does) and pin `mk`'s there; returns the table to print."""
    import time

    from ..megakernel.obs_place import calibrate_twin
    from ..runtime.live import summary_monitor
    t0 = time.perf_counter()
    cal = calibrate_twin(twin, summary_monitor(twin.graph.schema).obj)
    mk.place_observers(cal.best)
    return (f"observer placement ({time.perf_counter() - t0:.1f} s, the cheapest of {len(cal.candidates)} "
            f"SM sets with the summary monitor attached; the SM left idle runs the clock pairs):\n"
            + "\n".join(cal.lines()))


def serve(args: argparse.Namespace) -> int:
    from ..megakernel.faults import FaultTable
    from ..megakernel.graph import build_graph
    from ..megakernel.mpi_transport import rank_clock
    from ..megakernel.presets import get_preset
    from ..megakernel.sim import Sim
    from .api import ServingHost

    backend = resolve_backend(args.backend)
    from ..commands.top import observer_place_defines
    from ..megakernel.gpu import observer_defines
    observer_defines(getattr(args, "observer", "workers"), getattr(args, "observer_sms", None))   # (the pair checked)
    observer_place_defines(getattr(args, "observer", "workers"), getattr(args, "observer_place", "hw"))
    if backend == "gpu":
        return serve_gpu(args)
    if getattr(args, "observer", "workers") != "workers":
        raise UserError(f"--observer {args.observer}: a placement of the GPU kernel's observer; the sim "
                        f"backend has none (use --backend gpu)")
    if getattr(args, "summaries", None) == "device":
        raise UserError("--summaries device: the summaries run in the GPU megakernel's device VM; a sim rank's "
                        "agent runs them over its own records (use --backend gpu, or leave the flag out)")
    if getattr(args, "summary_window", None) is not None:
        raise UserError("--summary-window: windows are the GPU backend's device summaries; a sim rank's agent "
                        "summarizes every step itself (use --backend gpu, or leave the flag out)")
    extra = kernel_defines(args)
    if extra:
        raise UserError(f"--kernel-define {extra[0]}: a variant of the GPU megakernel's build; the "
                        f"sim backend compiles none (use --backend gpu, or leave the flag out)")
    cfg = get_preset(args.model)
    if args.batch < 1:
        raise UserError(f"--batch: expected >= 1, got {args.batch}")
    if args.mean_len < 1:
        raise UserError(f"--mean-len: expected >= 1, got {args.mean_len}")
    steps = _steps_of(args)
    rate = args.rate if args.rate is not None else 0.8 * args.batch / args.mean_len
    faults = _faults_of(args)

    graphs: Dict[str, Any] = {}

    def schema_for(rank: int, ranks: int):
        graphs["g"] = build_graph(cfg, args.batch, SIM_WORKERS, rank=rank, ranks=ranks)
        return graphs["g"].schema

    host = _host(ServingHost, schema_for, backend, args.monitor)
    rank, ranks = host.rank, host.ranks
    graph = graphs["g"]
    sc = fault_scenario(faults, args.model, ranks, min(steps, 1 << 20), args.batch, args.seed,
                        "--fault/--faults")
    from ..collectors.scenario import device_fault_specs
    table = FaultTable.from_specs(device_fault_specs(sc, rank), f"--fault (rank {rank})")
    say = _progress_say(host, args, rank)
    arrivals = ArrivalProcess(args.batch, rate, args.mean_len, args.seed, cfg.max_seq)
    say(f"model {cfg.name}, {ranks} rank(s), backend {backend}, batch {args.batch}, "
        f"arrivals {rate:.2f}/step (Poisson), mean length {args.mean_len:g}, "
        + _length_and_faults(args, steps, faults))
    _stop_on_signals(host)
    _await_attach(host, args, say)

    t0 = time.monotonic()
    state = {"k": 0, "stop": None, "last_say": t0, "host0": None, "host_last": None}

    def on_clock(device_ns: int, host_ns: int) -> None:
        host.clock_sample(device_ns, host_ns)
        k = state["k"]
        if k >= steps or state["stop"] is not None:
            return
        if state["host0"] is None:
            state["host0"] = host_ns
        state["host_last"] = host_ns
        state["k"] = k + 1
        arrivals.on_step(k)
        if args.duration and time.monotonic() - t0 >= args.duration:
            host.request_stop()
        host.step(k)
        if host.should_stop(k):
            state["stop"] = k
            return
        now = time.monotonic()
        if now - state["last_say"] >= args.progress_s:
            state["last_say"] = now
            _progress(say, k, state, arrivals, host)
        host.status_extra = {"serving": {"step": k, **arrivals.stats()}}

    def sink(ctx) -> None:
        stop = state["stop"]
        if stop is not None and ctx["decode_step"] >= stop:
            return
        host.sink(ctx)

    transport = _StoppingTransport(host.comm, host, lambda: state["stop"] is not None)
    sim = Sim(graph, steps, faults=table, sink=sink, hooks=host.hooks(), seed=args.seed,
              transport=transport.port, clock=rank_clock(rank, args.seed, True),
              on_clock=on_clock, requests=arrivals)
    stopped_early = False
    try:
        transport.run(sim)
    except StopServing:
        stopped_early = True
    served = state["stop"] if state["stop"] is not None else state["k"]
    wall = time.monotonic() - t0
    st = arrivals.stats()
    sim_s = ((state["host_last"] or 0) - (state["host0"] or 0)) / 1e9
    say(f"served {served} steps in {wall:.3f} s wall ({'stopped' if stopped_early else 'done'}): "
        f"{st['arrived']} requests arrived, {st['finished']} finished, {st['queued']} waiting; "
        f"latency p50 {st['latency_steps_p50']} steps, time to first token {st['ttft_steps_mean']} "
        f"steps (mean), {st['idle_slot_steps']} idle slot-steps"
        + (f"; {arrivals.tokens / sim_s:,.0f} tokens/s simulated" if sim_s > 0 else ""))
    res = host.close()
    if res is not None and rank == 0:
        _report(res, args, say)
    return 0


#: serve_gpu: steps granted to the resident kernel ahead of the last step the host fed
RESIDENT_WINDOW = 4
#: serve_gpu: seconds of host time between clock pairs (GpuClock) while the kernel runs
#: ($DTRACE_MK_GPU_CLOCK_EVERY_S).  Pairs are also taken before and after each launch; the
#: collector fits offset and drift (1-4 ppm) through them.  Once a second: enough for the
#: fit (session 3 suspected 50 ms pairs of slowing the kernel; session 4 ruled it out:
#: 20 ms pairs left every step normal, docs/results/tp.md)
CLOCK_EVERY_S = float(os.environ.get("DTRACE_MK_GPU_CLOCK_EVERY_S", "1.0"))
#: serve_gpu: steps between retirements of the device tables' complete epochs
#: (DeviceQueries.retire): well under the 64 coverage rows, 8 rate-limit and 8 ring-budget
#: slots a live query's tables hold, with RESIDENT_WINDOW steps granted ahead
RETIRE_EVERY = 2
#: serve_gpu: the resident kernel's watchdog (a dependency wait without progress)
GPU_SERVE_WATCHDOG_MS = 5000


def serve_gpu(args: argparse.Namespace) -> int:
    """The GPU backend: one megakernel per rank (one GPU each), RESIDENT across serving
    steps: one launch serves many steps, held at a step gate RESIDENT_WINDOW steps ahead
    of the last step the host has fed, its hook records streamed to the host while it
    runs (Megakernel.start_resident / grant / poll / stop / finish).  A step is complete
    when every worker finished it; its records are fed to the agent in order, then
    host.step(k+1) runs (commands, live-query attach/detach in the device VM; an attach
    counts from the first step no worker has started, DeviceQueries.attach: the kernel
    never parks for a command: the host applies commands only after feeding the steps
    before them, so holding the kernel for one parks it for tens of ms).  The ranks
    are tensor parallel: once per completed step they agree (an allreduce on a
    communicator of their own) on stopping and on ending the launch for a compiled-tier
    swap; every rank grants the same steps, so all stop at the same one.  Records a full
    device ring refused are counted lost in the agent's coverage.

    Warm-up: the first step of a launch is cold (instruction cache, L2 and TLBs, the peer
    mappings too; each rank's launch starts when its host gets there): on 2 x H200 it made
    the all-reduces of the first served step a confident slow_task_class on both ranks.
    So the job's FIRST resident launch begins with WARMUP (= diagnose's
    GPU_LAUNCH_WARMUP_STEPS) decode steps outside the observed window: the kernel runs
    them (hooks on as usual), their records are consumed from the ring (poll) but neither
    fed to the agent nor counted lost, and no fault may name them.  Steps keep the
    device's numbers: the observed steps are WARMUP .. WARMUP+steps-1 (`--steps N` is N
    observed steps), and everything host-side counts in device steps: host.step(k), whose
    first call is host.step(WARMUP) (the host never is at a warm-up step, so no command --
    attach, report, stop -- applies at one, and no live query counts one), commands'
    apply_at, the --await-attach hold, the stop agreement, the grants, the fault table,
    progress lines, "served N steps", and so the agent's epochs, the collector's steps
    and the spans.  A ring drop has no step: all drops are counted lost (an upper bound
    when warm-up records were dropped too; none when the ring is sized).  Known limit:
    a later launch (after a compiled-tier swap) starts without a warm-up, so its first
    step is cold again."""
    from mpi4py import MPI
    from ..collectors.scenario import device_fault_specs
    from ..commands.diagnose import GPU_LAUNCH_WARMUP_STEPS as WARMUP
    from ..megakernel.faults import FaultTable
    from ..megakernel.presets import get_preset
    from .api import ServingHost
    from .device_live import DeviceQueries
    try:
        import cupy as cp
        import numpy as np
        from ..megakernel import gpu
        from ..megakernel.gpu_clock import GpuClock
    except ImportError as e:
        raise UserError(f"serve --backend gpu: needs CuPy and the GPU megakernel ({e})") from None
    cfg = get_preset(args.model)
    if args.batch < 1:
        raise UserError(f"--batch: expected >= 1, got {args.batch}")
    steps = _steps_of(args)
    summaries = summaries_of(args)
    window = summary_window_of(args, summaries)
    end = WARMUP + steps                       # device steps served: WARMUP .. end-1 observed
    faults = _faults_of(args)
    _refuse_warmup_faults(faults, WARMUP, end)
    n_gpus = gpu_count()
    if n_gpus < 1:
        raise UserError("serve --backend gpu: CuPy sees no GPU")
    held: Dict[str, Any] = {}

    def workers() -> int:
        # one SM is left free: the resident megakernel holds every SM it has a worker on,
        # and the clock pairs (gpu_clock's 1-thread globaltimer kernel) need one to run
        return max(1, int(cp.cuda.Device().attributes["MultiProcessorCount"]) - 1)

    extra = kernel_defines(args)

    def build(rank: int, ranks: int, comm):
        if ranks > n_gpus:
            raise UserError(f"serve --backend gpu: {ranks} ranks but {n_gpus} GPU(s) visible "
                            f"(one GPU per rank)")
        if ranks > 1 and getattr(args, "observer", "workers") != "workers":
            raise UserError(f"--observer {args.observer}: one rank only (tensor-parallel ranks build their "
                            f"records on the workers)")
        if ranks > 1 and extra:
            raise UserError(f"--kernel-define {extra[0]}: one rank only (tensor-parallel ranks build the "
                            f"standard kernel)")
        if ranks > 1:
            try:
                from ..megakernel.tp import TPGroup
            except ImportError as e:
                raise UserError(f"serve --backend gpu: {ranks} ranks need tensor parallelism "
                                f"(dtrace_mk.megakernel.tp: {e})") from None
            held["tp"] = TPGroup(comm)            # collective; selects device rank % GPUs
            held["mk"] = gpu.Megakernel(cfg, args.batch, tp=held["tp"], seed=args.seed, num_workers=workers())
        elif getattr(args, "observer", "workers") == "sm":
            # the observers take M more SMs (the clock pairs keep theirs): workers() - M workers;
            # pinned (calibrated), the grid holds every SM and the clock pairs' one idles
            defines, idle = observer_build(args, extra)
            cp.cuda.Device(0).use()

            def make(**kw):
                return gpu.Megakernel(cfg, args.batch, seed=args.seed, defines=defines, idle_sms=idle,
                                      num_workers=max(1, workers() - gpu.obs_sms_of(defines)), **kw)
            held["mk"] = make()
            if idle:
                held["placement"] = place_observers_calibrated(
                    held["mk"], make(weights=held["mk"].weights, graph=held["mk"].graph))
        else:
            cp.cuda.Device(0).use()
            held["mk"] = gpu.Megakernel(cfg, args.batch, seed=args.seed, num_workers=workers(), defines=extra)
        return held["mk"].graph.schema

    host = ServingHost(num_workers=lambda: held["mk"].num_workers, schema=build, backend="gpu",
                       monitors=args.monitor)
    mk = held["mk"]
    rank, ranks = host.rank, host.ranks
    # the fault table names device steps (observed: WARMUP .. end-1)
    sc = fault_scenario(faults, args.model, ranks, WARMUP + min(steps, 1 << 20), args.batch, args.seed,
                        "--fault/--faults")
    table = FaultTable.from_specs(device_fault_specs(sc, rank), f"--fault (rank {rank})")
    say = _progress_say(host, args, rank)
    tier = args.tier or os.environ.get("DTRACE_MK_TIER") or "hot"
    dq = host.live_runtime = DeviceQueries(mk, tier=tier)   # live queries run on the device
    if summaries == "device":                  # the agent's task half too, from the first observed step
        host.summarize_on_device(first_epoch=WARMUP, window=window)
    # what streams to the host: every record (host summaries), or what `feed` still uses
    stream = "all" if summaries == "host" else host.agent_hooks()
    clock = GpuClock()
    clock.feed(host)
    agree = host.comm.Dup()
    dev = cp.cuda.Device()
    served = f"steps {WARMUP}..{end - 1}" if args.steps is not None or not args.duration else f"steps {WARMUP}.."
    if "placement" in held:
        say(held["placement"])
    say(f"model {cfg.name}, {ranks} rank(s), backend gpu (device {dev.id} of {n_gpus}, "
        f"{mk.num_workers} workers), batch {args.batch}, resident kernel (first {WARMUP} steps "
        f"warm the kernel up, not observed; {served} served), summaries on the {summaries}, "
        + _length_and_faults(args, steps, faults))
    _stop_on_signals(host)
    host.step(WARMUP)            # the host starts at the first observed step (commands after it)
    _await_attach(host, args, say, at=WARMUP)
    size = abi_context_size()
    lost = host.agent.channel
    t0 = last_say = last_clock = time.monotonic()
    st = {"k": WARMUP, "dropped": 0, "gpu_ms": 0.0, "segments": 0, "warm_records": 0}
    # a query attached while the kernel runs counts from the first step no worker has
    # started (DeviceQueries.attach: first_epoch = the grant): exact from a step boundary,
    # and the kernel never parks for it (a hold parks it for the host's feeding: tens of ms)
    pending: List[Any] = []                    # streamed record arrays not fed yet

    def decide(k: int) -> int:
        """Step k is next: every rank's stop (1) / end-the-launch-for-a-swap (2) wishes."""
        if args.duration and time.monotonic() - t0 >= args.duration:
            host.request_stop()
        mine = 1 if (host.should_stop(k) or host.stop_wanted) else 0
        swap = getattr(dq, "swap_pending", None)
        if swap is not None and swap():
            mine |= 2
        return int(agree.allreduce(mine, op=MPI.BOR))

    def limit(k: int) -> int:
        """The grant after deciding step k: the same on every rank."""
        return min(end, k + RESIDENT_WINDOW)

    def take(recs, dropped: int) -> None:
        if dropped:                            # a full device ring: counted lost in coverage
            st["dropped"] += int(dropped)
            lost.add_lost(int(dropped))
        if len(recs):
            warm = recs["decode_step"] < WARMUP
            if warm.any():                     # the warm-up steps': consumed, never fed
                st["warm_records"] += int(warm.sum())
                recs = recs[~warm]
        if len(recs):
            pending.append(recs)

    def feed_until(done: int) -> List[int]:
        """Feed the records of steps < done (complete), in step then time order; returns
        the steps fed, each after its records."""
        k = st["k"]
        if done <= k:
            return []
        arr = np.concatenate(pending) if len(pending) > 1 else (pending[0] if pending else None)
        pending.clear()
        fed = list(range(k, done))
        if arr is None or not len(arr):
            return fed
        ds = arr["decode_step"].astype(np.int64)
        later = ds >= done
        if later.any():
            pending.append(arr[later])
        now_ = arr[~later]
        now_ = now_[np.lexsort((now_["ts_ns"], ds[~later]))]
        raw = now_.tobytes()
        for i in range(len(now_)):
            host.feed(raw[i * size:(i + 1) * size])
        return fed

    def advance(done: int, decisions: bool, flags: int, running: bool) -> int:
        """Steps < done are complete: feed them; host.step for each next step, and (while
        deciding) the ranks' agreement.  Every rank decides at the same steps and, while
        the kernel runs, grants k + RESIDENT_WINDOW right after each decision that goes
        on: the grant a launch ends at is the same on every rank (a function of the last
        such step, however the ranks' polls group the completed steps)."""
        for j in feed_until(done):
            st["k"] = k = j + 1
            # (the windows' reads and the next window's attach before the grant: tried after
            # it in session 45 so the kernel would run meanwhile, and reverted on a
            # late_notification at rotations in tiny; session 46 saw that artefact with this
            # order too: its cause was a wait's drain hiding a met dependency, which the
            # drain's poller fixed in sessions 47-48 (docs/results/hooks.md); not re-measured)
            host.step(k)
            host.status_extra = {"serving": {"step": j, "backend": "gpu"}}
            if k % RETIRE_EVERY == 0:
                dq.retire()
            if decisions and k < end and not flags:
                flags |= decide(k)
                if running and not flags:
                    mk.grant(limit(k))
            elif decisions and k < end and flags == 2:
                flags |= decide(k)         # between launches: a stop may still come
        return flags

    flags = decide(WARMUP)
    while st["k"] < end and not flags & 1:
        flags = 0
        host.live_runtime.boundary()           # tier swaps happen only between launches
        k = st["k"]
        # the first launch starts at device step 0: its warm-up steps run ahead of the grant
        mk.start_resident(hooks=stream, faults=table, window=limit(k) - int(mk.step),
                          watchdog_ms=GPU_SERVE_WATCHDOG_MS)
        st["segments"] += 1
        while st["k"] < end and not flags:
            recs, dropped, done = mk.poll()
            take(recs, dropped)
            now = time.monotonic()
            if now - last_clock >= CLOCK_EVERY_S:
                last_clock = now
                clock.feed(host, rounds=4)
            if done <= st["k"]:
                host.poll()
                time.sleep(0.0001)
                continue
            flags = advance(done, True, flags, True)
            if now - last_say >= args.progress_s:
                last_say = now
                kk = st["k"]
                say(f"step {kk - 1}: {(now - t0) / max(kk, 1) * 1e6:.0f} us/step wall, "
                    f"{len(host.live)} live quer{'y' if len(host.live) == 1 else 'ies'}")
        res = mk.finish()                      # ends at the current grant, the same on every rank
        st["gpu_ms"] += res.elapsed_ms
        take(res.hooks, res.hooks_dropped)
        flags = advance(int(mk.step), not flags & 1, flags, False)
        clock.feed(host, rounds=4)             # the GPU is idle between launches
    k = st["k"]
    host.step(k)                 # due detach/report commands before the final outputs
    wall = time.monotonic() - t0
    n = k - WARMUP
    ran = max(int(mk.step), 1)                 # device steps the launches ran, warm-up included
    say(f"served {n} steps{f' ({WARMUP}..{k - 1})' if n else ''} in {wall:.3f} s wall "
        f"({st['segments']} resident launch{'' if st['segments'] == 1 else 'es'}), "
        f"{st['gpu_ms'] / ran * 1000:.0f} us/step of launch time, {n * args.batch} tokens; the first "
        f"{WARMUP} steps warmed the kernel up, not observed ({st['warm_records']} records not fed); "
        f"hook records dropped by full rings: {st['dropped']} (counted lost)")
    res = host.close()
    if summaries == "device":
        w = host.agent.windows
        say(f"device summaries: {w.read_count} window{'' if w.read_count == 1 else 's'} of {w.W} steps "
            f"(the last ones shorter) read; {host.agent.stats.events} records fed to the host agent"
            + (f"; {w.refused} next window(s) refused, the last one ran longer ({w.last_refusal})"
               if w.refused else ""))
    agree.Free()
    if res is not None and rank == 0:
        _report(res, args, say)
    return 0


def summaries_of(args) -> str:
    """serve_gpu: where the agent's summaries run (--summaries, $DTRACE_MK_SUMMARIES)."""
    got = getattr(args, "summaries", None) or os.environ.get("DTRACE_MK_SUMMARIES") or DEFAULT_SUMMARIES
    if got not in SUMMARY_MODES:
        raise UserError(f"$DTRACE_MK_SUMMARIES: expected {' or '.join(SUMMARY_MODES)}, got {got!r}")
    return got


def summary_window_of(args, summaries: str):
    """serve_gpu: --summary-window, checked before any kernel is built (None: the default)."""
    w = getattr(args, "summary_window", None)
    if w is None:
        return None
    if summaries != "device":
        raise UserError(f"--summary-window {w}: only with device summaries (--summaries device); host "
                        f"summaries are flushed step by step")
    if not MIN_WINDOW <= w <= MAX_WINDOW:
        raise UserError(f"--summary-window: expected {MIN_WINDOW}..{MAX_WINDOW} steps, got {w}")
    return w


def _refuse_warmup_faults(faults: List[Dict[str, Any]], warmup: int, end: int) -> None:
    """serve_gpu: a fault entry naming a warm-up step (device steps < warmup: run, never
    observed) is an error; the scenario parser checks the rest of each entry."""
    for i, f in enumerate(faults):
        st = f.get("steps") if isinstance(f, dict) else None
        early = sorted(s for s in (st if isinstance(st, list) else [st])
                       if isinstance(s, int) and not isinstance(s, bool) and 0 <= s < warmup)
        if early:
            raise UserError(f"--fault/--faults entry {i} ({f.get('kind')}, rank {f.get('rank')}): "
                            f"step(s) {early} are the GPU backend's warm-up steps (run, not observed); "
                            f"its observed steps are {warmup}..{end - 1}")


def abi_context_size() -> int:
    from ..abi import definition as abi
    return abi.CONTEXT_SIZE


def _host(cls, schema_for, backend: str, monitors: List[str]):
    """ServingHost with the rank's graph schema: the graph needs the rank, which only
    ServingHost's collective role split knows, so the schema is a callable it calls."""
    return cls(num_workers=SIM_WORKERS, schema=schema_for, backend=backend, monitors=monitors)


class _StoppingTransport:
    """`MPITransport` whose window exchange also carries each rank's "stopped" flag: when
    every rank has passed the agreed stop step, all raise StopServing in the same window
    (they all see the same flags).  Between windows it polls the host (control requests,
    commands) without touching the transport's communicator."""

    def __new__(cls, comm, host, stopped):
        from ..megakernel.mpi_transport import MPITransport

        class T(MPITransport):
            def _exchange(self, payloads):
                mine = stopped()
                got = super()._exchange([(p, mine) for p in payloads])
                host.poll()
                if all(g[1] for g in got):
                    raise StopServing()
                return [g[0] for g in got]
        return T(comm, on_idle=host.poll)


def _progress(say, k: int, state, arrivals: ArrivalProcess, host) -> None:
    st = arrivals.stats()
    sim_ns = (state["host_last"] or 0) - (state["host0"] or 0)
    per = sim_ns / max(k, 1) / 1000.0
    say(f"step {k}: {per:.0f} us/step simulated, {st['queued']} waiting, {st['finished']} finished, "
        f"latency p50 {st['latency_steps_p50']} steps, {len(host.live)} live quer"
        f"{'y' if len(host.live) == 1 else 'ies'}")


def _report(res: Dict[str, Any], args, say) -> None:
    from ..commands.diagnose import _summary
    if args.result:
        Path(args.result).write_text(json.dumps(res, indent=1) + "\n")
        say(f"diagnosis written to {args.result}")
    if not args.quiet:
        _summary(res, sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
