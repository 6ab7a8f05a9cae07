"""`dtrace-mk diagnose`: run a scenario under MPI and name the root cause of slow steps.

    dtrace-mk diagnose --scenario tests/scenarios/pair_remote_stall_r1.yaml --out result.json
    dtrace-mk score result.json --scenario tests/scenarios/pair_remote_stall_r1.yaml

Starts `mpiexec -n RANKS <rank> : -n 1 <collector>` (MPMD; the collector is the second
app, `MPI.APPNUM == 1`).  Each rank runs the megakernel for its rank (sim backend:
the discrete-event simulation, one MPI process per rank) with the scenario's faults for
that rank, and the per-rank agent with the default summary monitors (the scenario's
`monitors`, query files, run beside them; their printed output comes back under
"monitors" in the result) ships per-step summaries, remote waits, signal times and clock samples to
the collector, which aligns clocks, joins waits to signals by (comm_op, comm_gen),
classifies the waits and writes the result JSON:

    {"scenario", "verdict": "fault"|"none", "findings": [{"cause", "rank", "observed_on",
     "task_class"?, "comm_op"?, "layer"?, "steps", "confidence", "impact_us",
     "coverage"}], "telemetry_bytes", "coverage", ...}

--backend auto|sim|gpu  overrides the scenario's backend (auto = gpu when CuPy sees at
                        least as many GPUs as the scenario has ranks, else sim).  gpu:
                        one tensor-parallel megakernel per GPU (rank r on GPU r % count),
                        the scenario's faults loaded as data into the same binary,
                        %globaltimer paired with the host clock (gpu_clock), real
                        host ping-pongs in the clock model.
--out FILE              the result (default: SCENARIO-NAME.result.json here; '-' = stdout)
--timeout S             wall-clock limit for the MPI job (default 600); ranks still
                        running then are reported lost and the result is partial.

The launcher is $DTRACE_MK_MPIEXEC when set (a path or a name on PATH, e.g. Open MPI's
`mpirun`), else the venv's mpiexec, else mpiexec / mpirun on PATH; Open MPI gets
--oversubscribe (and --allow-run-as-root as root).

Progress lines go to stderr; the summary to stdout.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from ..errors import UserError

NAME = "diagnose"
ORDER = 40
HELP = "run a scenario under mpiexec (sim or GPU ranks) and diagnose local vs remote causes"
DESCRIPTION = __doc__.split("\n\n", 1)[1]

from ..megakernel.presets import SIM_WORKERS  # noqa: E402  (re-exported for bench/collector.py)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--scenario", required=True, metavar="FILE", help="scenario file (YAML or JSON)")
    p.add_argument("--backend", choices=("auto", "sim", "gpu"), default=None,
                   help="override the scenario's backend (auto: gpu when enough GPUs, else sim)")
    p.add_argument("--out", metavar="RESULT.json",
                   help="where to write the result (default SCENARIO-NAME.result.json; '-' = stdout)")
    p.add_argument("--timeout", type=float, default=600.0, metavar="S",
                   help="wall-clock limit of the MPI job in seconds (default 600)")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")


# ------------------------------------------------------------------------------ launch

ENV_MPIEXEC = "DTRACE_MK_MPIEXEC"


def find_mpiexec() -> str:
    """$DTRACE_MK_MPIEXEC (a path or a name on PATH, e.g. Open MPI's `mpirun`), else the
    venv's mpiexec (next to sys.executable), else mpiexec / mpirun on PATH."""
    forced = os.environ.get(ENV_MPIEXEC)
    if forced:
        w = forced if os.path.sep in forced else shutil.which(forced)
        if not w or not (os.path.isfile(w) and os.access(w, os.X_OK)):
            raise UserError(f"diagnose: ${ENV_MPIEXEC}={forced!r} is not an executable file")
        return w
    here = Path(sys.executable).parent
    for name in ("mpiexec", "mpirun"):
        p = here / name
        if p.is_file() and os.access(p, os.X_OK):
            return str(p)
    for name in ("mpiexec", "mpirun"):
        w = shutil.which(name)
        if w:
            return w
    raise UserError("diagnose: no mpiexec next to the Python interpreter "
                    f"({here}) or on PATH; install the 'mpich' package (pip install mpich)")


def mpi_flavour(mpiexec: str) -> str:
    """'openmpi', 'mpich' (Hydra) or 'unknown', from `mpiexec --version`."""
    try:
        out = subprocess.run([mpiexec, "--version"], capture_output=True, text=True, timeout=20)
        text = (out.stdout + out.stderr).lower()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    if "open mpi" in text or "open-mpi" in text or "openrte" in text:
        return "openmpi"
    if "hydra" in text or "mpich" in text:
        return "mpich"
    return "unknown"


def mpi_flags(flavour: str) -> List[str]:
    """The launcher flags a job of this project needs under `flavour` (Open MPI: more
    ranks than cores, root in containers, no single-copy path without ptrace rights)."""
    flags: List[str] = []
    if flavour == "openmpi":
        flags.append("--oversubscribe")
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            flags.append("--allow-run-as-root")
        # containers without ptrace rights (CMA) fail vader's single-copy path
        flags += ["--mca", "btl_vader_single_copy_mechanism", "none"]
    return flags


def mpiexec_command(mpiexec: str, ranks: int, child_args: List[str],
                    flavour: Optional[str] = None) -> List[str]:
    """`mpiexec [flags] -n RANKS python -m ... : -n 1 python -m ...` (MPMD)."""
    flags = mpi_flags(flavour or mpi_flavour(mpiexec))
    child = [sys.executable, "-m", "dtrace_mk.commands.diagnose"] + child_args
    return [mpiexec] + flags + ["-n", str(ranks)] + child + [":", "-n", "1"] + child


def gpu_count() -> Tuple[int, str]:
    """(GPUs CuPy sees, why none when 0): megakernel.gpu.gpu_count."""
    from ..megakernel.gpu import gpu_count as count
    return count()


def gpu_tp_available() -> bool:
    """True when the GPU tensor-parallel launcher (dtrace_mk.megakernel.tp) is present."""
    try:
        from ..megakernel.tp import TPGroup  # noqa: F401
    except ImportError:
        return False
    return True


def resolve_backend(requested: str, ranks: int) -> str:
    """auto = gpu when CuPy sees at least `ranks` GPUs (and, for more than one rank, the
    tensor-parallel GPU launcher is there), else sim; gpu without them is a UserError."""
    if requested == "sim":
        return "sim"
    n, why = gpu_count()
    ok = n >= ranks and (ranks == 1 or gpu_tp_available())
    if requested == "gpu" and not ok:
        if n < ranks:
            raise UserError(f"--backend gpu: the scenario has {ranks} rank(s), one GPU "
                            f"each, but {why or f'CuPy sees {n} GPU(s)'}; use --backend sim")
        raise UserError("--backend gpu: the tensor-parallel GPU launcher "
                        "(dtrace_mk.megakernel.tp) is not installed; use --backend sim")
    return "gpu" if ok else "sim"


def run(args: argparse.Namespace) -> int:
    from ..collectors.scenario import load_scenario
    from ..collectors.score import validate_result
    sc = load_scenario(args.scenario)
    if args.timeout <= 0:
        raise UserError(f"--timeout: expected > 0, got {args.timeout}")
    backend = resolve_backend(args.backend or sc.backend, sc.ranks)
    for m in sc.monitors:
        mp = Path(m) if Path(m).is_absolute() else Path(sc.source).parent / m
        if not mp.is_file():
            raise UserError(f"{sc.source}: monitors: no query file {m!r} (looked at {mp})")
    say = (lambda s: None) if args.quiet else (lambda s: print(f"diagnose: {s}", file=sys.stderr, flush=True))
    t0 = time.monotonic()
    res = run_job([(Path(args.scenario), None)], backend, args.timeout, say,
                  quiet=args.quiet)[0]
    if res is None:
        raise UserError(f"diagnose {sc.name}: the MPI job ended without a result; see the "
                        f"messages above")
    validate_result(res, "diagnose result")
    res.setdefault("timing", {})["wall_s"] = round(time.monotonic() - t0, 2)
    text = json.dumps(res, indent=1, sort_keys=False) + "\n"
    if args.out == "-":
        sys.stdout.write(text)
        _summary(res, sys.stderr)
    else:
        out = Path(args.out or f"{sc.name}.result.json")
        try:
            out.write_text(text)
        except OSError as e:
            raise UserError(f"--out {out}: cannot write ({e.strerror})") from None
        _summary(res, sys.stdout)
        print(f"result: {out}")
    return 0


def run_job(runs: List[Tuple[Path, Optional[int]]], backend: str, timeout_s: float, say,
            quiet: bool = False, **extra: Any) -> List[Optional[Dict[str, Any]]]:
    """Run several scenarios in ONE mpiexec launch (all with the same number of ranks):
    `runs` = [(scenario file, ranks override or None)].  Returns each result (None where
    the job produced none).  The e2e tests use this to keep launches few."""
    from ..collectors.scenario import load_scenario
    scs = [load_scenario(p) for p, _ in runs]
    nranks = {(n or sc.ranks) for sc, (_, n) in zip(scs, runs)}
    if len(nranks) != 1:
        raise UserError(f"diagnose: one launch runs one number of ranks, got {sorted(nranks)}")
    ranks = nranks.pop()
    mpiexec = find_mpiexec()
    if backend == "gpu":
        # NVRTC compile + weight upload precede a rank's first message
        extra.setdefault("silence_timeout_s", 300.0)
    with tempfile.TemporaryDirectory(prefix="dtmk-diagnose-") as tmp:
        job = {"backend": backend, "deadline_s": max(5.0, timeout_s - 5.0), "quiet": quiet,
               "runs": [{"scenario": str(Path(p).resolve()), "ranks": ranks,
                         "result": str(Path(tmp) / f"result{i}.json")}
                        for i, (p, _) in enumerate(runs)], **extra}
        job_path = Path(tmp) / "job.json"
        job_path.write_text(json.dumps(job))
        cmd = mpiexec_command(mpiexec, ranks, ["--job", str(job_path)])
        names = ", ".join(sc.name for sc in scs)
        say(f"{names}: {ranks} ranks, backend {backend}: {Path(mpiexec).name} -n {ranks} "
            f"(ranks) : -n 1 (collector)")
        last = Path(job["runs"][-1]["result"])
        rc = _launch(cmd, last, timeout_s, say)
        out: List[Optional[Dict[str, Any]]] = []
        for r, sc in zip(job["runs"], scs):
            p = Path(r["result"])
            if p.is_file():
                out.append(json.loads(p.read_text()))
            elif Path(r["result"] + ".spool").is_file():
                say(f"{sc.name}: the MPI job ended (exit status {rc}) before the collector "
                    f"wrote a result; partial result from what it had received")
                out.append(_from_spool(r["result"] + ".spool", sc, ranks, rc, backend))
            else:
                out.append(None)
        return out


def _from_spool(spool: str, sc, ranks: int, rc: int, backend: str = "sim") -> Dict[str, Any]:
    from dataclasses import replace
    from ..collectors import transport as T
    if sc.ranks != ranks:
        sc = replace(sc, ranks=ranks)
    # the sim's clock samples are on simulated hosts: real ping-pongs only count for gpu
    acc = T.CollectorSink(use_pingpongs=(backend == "gpu"))
    loop = T.replay_spool(spool, list(range(ranks)), acc)
    res = _result(acc, loop, sc, ranks)
    res["transport"]["job_exit_status"] = rc
    res["transport"]["from_spool"] = True
    return res


def _launch(cmd: List[str], result_path: Path, timeout_s: float, say) -> int:
    """Run the MPI job; kill it at the timeout, or shortly after the result appeared
    (a hung rank must not hang diagnose)."""
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            start_new_session=True)
    deadline = time.monotonic() + timeout_s
    seen_result: Optional[float] = None
    try:
        while True:
            rc = proc.poll()
            if rc is not None:
                return rc
            now = time.monotonic()
            if seen_result is None and result_path.is_file():
                seen_result = now
            if now >= deadline or (seen_result is not None and now - seen_result > 10.0):
                say("stopping the MPI job (" + ("timeout" if now >= deadline else
                                                "result written, ranks still running") + ")")
                _kill(proc)
                return proc.wait()
            time.sleep(0.05)
    except KeyboardInterrupt:
        _kill(proc)
        raise


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _summary(res: Dict[str, Any], fh) -> None:
    p = lambda s="": print(s, file=fh)  # noqa: E731
    cov = res["coverage"]
    tel = res.get("telemetry", {})
    p(f"scenario {res['scenario']}: verdict {res['verdict']}, {len(res['findings'])} finding(s)")
    for f in res["findings"]:
        what = f.get("task_class") or f.get("comm_op") or ""
        extra = f" layer {f['layer']}" if "layer" in f else ""
        p(f"  {f['cause']:<18} root rank {f['rank']} {what}{extra} steps {f['steps']} "
          f"observed on {f['observed_on']}  confidence {f['confidence']:.2f}  "
          f"impact {f['impact_us']} us")
    if res.get("missing_ranks") or res.get("partial"):
        p(f"  partial result: missing ranks {res.get('missing_ranks', [])}, incomplete "
          f"{res.get('incomplete_ranks', {})}")
    p(f"coverage: eligible {cov['eligible']}, executed {cov['executed']}, throttled "
      f"{cov['throttled']}, lost {cov['lost']}")
    per = tel.get("bytes_per_rank_step")
    p(f"telemetry: {res['telemetry_bytes']} bytes" + (f" ({per} bytes per rank per step)" if per else ""))


# --------------------------------------------------------------------- inside mpiexec

def mpi_main(argv: Optional[List[str]] = None) -> int:
    """One process of the MPI job: a serving rank or the collector (by MPI.APPNUM).
    Runs the job's scenarios one after the other (MPI tags apart per scenario)."""
    from dataclasses import replace
    from mpi4py import MPI
    from ..collectors import transport as T
    from ..collectors.scenario import load_scenario
    p = argparse.ArgumentParser(prog="dtrace_mk.commands.diagnose (MPI child)")
    p.add_argument("--job", required=True)
    a = p.parse_args(argv)
    job = json.loads(Path(a.job).read_text())
    t_start = time.monotonic()
    deadline = t_start + float(job["deadline_s"])
    world = MPI.COMM_WORLD
    roles, sub = T.roles(world)
    who = "collector" if roles.is_collector and not roles.is_rank else f"rank {roles.rank}"
    quiet = bool(job.get("quiet"))

    def say(s: str) -> None:
        if not quiet:
            print(f"diagnose [{who}]: {s}", file=sys.stderr, flush=True)

    if not (roles.is_rank or roles.is_collector):     # extra processes of the collector app
        say("nothing to do (one collector process is enough)")
        return 0
    port = T.MpiPort(world)
    try:
        for i, run_ in enumerate(job["runs"]):
            sc = load_scenario(run_["scenario"])
            if run_.get("ranks") and run_["ranks"] != sc.ranks:
                sc = replace(sc, ranks=int(run_["ranks"]))
            t_run = time.monotonic()
            tags = T.Tags.for_run(i)
            if roles.is_collector and not roles.is_rank:          # MPMD collector
                loop, acc = _collector(port, roles, tags, job, say, run_["result"])
                loop.run(deadline)
                loop.close()
                _write_result(run_["result"], acc, loop, sc, roles, t_run)
                say(f"{sc.name}: result written ({time.monotonic() - t_run:.1f} s)")
                continue
            if roles.is_collector:                                 # rank 0 collects in-process
                loop, acc = _collector(port, roles, tags, job, say, run_["result"])
                channel = T.DirectChannel(loop, roles.rank)
            else:
                loop, acc = None, None
                channel = T.RankChannel(port, roles.collector, roles.rank, tags=tags)
            kill = job.get("kill") or {}        # tests: this rank's process dies at a step
            serve_rank(sc, roles.rank, roles.ranks, sub, channel, backend=job["backend"],
                       say=say, scenario_dir=Path(run_["scenario"]).parent,
                       die_at_step=kill.get("step") if kill.get("rank") == roles.rank else None,
                       start_pings=8 if roles.mpmd else 0)
            if loop is not None:
                loop.run(deadline)
                loop.close()
                _write_result(run_["result"], acc, loop, sc, roles, t_run)
                say(f"{sc.name}: result written ({time.monotonic() - t_run:.1f} s)")
            if sub is not None:
                sub.Barrier()           # between scenarios only, never inside a run
    finally:
        if sub is not None:
            sub.Free()
    return 0


def _collector(port, roles, tags, job, say, result_path: str):
    from ..collectors import transport as T
    acc = T.CollectorSink(use_pingpongs=(job["backend"] == "gpu"))
    ranks = list(range(roles.ranks))
    loop = T.CollectorLoop(port, ranks, acc, silence_timeout_s=float(job.get("silence_timeout_s", 60.0)),
                           progress=say, tags=tags, spool=T.open_spool(result_path + ".spool"))
    return loop, acc


def _result(acc, loop, sc, ranks: int) -> Dict[str, Any]:
    res = acc.result(sc, ranks=ranks)
    res["transport"].update(loop.report())
    if loop.notes:             # user monitors' output, per rank (beside the diagnosis)
        from ..collectors.transport import monitors_output
        res["monitors"] = monitors_output(loop.notes)
    tb = res["telemetry_bytes"]
    res["telemetry"] = {"bytes": tb, "bytes_per_step": round(tb / max(sc.steps, 1), 1),
                        "bytes_per_rank_step": round(tb / max(sc.steps * ranks, 1), 1),
                        "records_lost": sum(acc.lost_records.values())}
    return res


def _write_result(path: str, acc, loop, sc, roles, t_start: float) -> None:
    res = _result(acc, loop, sc, roles.ranks)
    res["timing"] = {"collector_s": round(time.monotonic() - t_start, 2)}
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(res, fh)
    os.replace(tmp, path)


def serve_rank(sc, rank: int, ranks: int, comm, channel, *, backend: str = "sim", say=print,
               scenario_dir: Path = Path("."), die_at_step: Optional[int] = None,
               start_pings: int = 8) -> None:
    """Run the scenario's megakernel for `rank` with the agent attached (sim or GPU)."""
    from ..collectors.scenario import device_fault_specs
    from ..megakernel.faults import FaultTable
    from ..megakernel.presets import get_preset
    from ..runtime.agent import RankAgent
    if backend == "gpu":
        return _serve_rank_gpu(sc, rank, ranks, comm, channel, say=say, scenario_dir=scenario_dir,
                               die_at_step=die_at_step, start_pings=start_pings)
    if backend != "sim":
        raise UserError(f"diagnose: unknown backend {backend!r}")
    cfg = get_preset(sc.model)
    graph, transport = _sim_rank_graph(cfg, sc, rank, ranks, comm)
    monitors = [str(Path(m) if Path(m).is_absolute() else scenario_dir / m) for m in sc.monitors]
    agent = RankAgent(rank, channel, num_workers=graph.num_workers, schema=graph.schema,
                      monitors=monitors, budget_bytes_per_step=sc.budget_bytes_per_step)
    # start-up ping-pongs need a collector that answers at once (MPMD); rank 0 collecting
    # in-process polls only while its own sim runs, so then the periodic ones must do
    agent.start(pings=start_pings)
    faults = FaultTable.from_specs(device_fault_specs(sc, rank), f"{sc.source} rank {rank}")
    t0 = time.monotonic()
    _dying(agent, die_at_step, say)
    res = _run_sim(graph, sc, faults, agent, transport, rank)
    _sim_pingpongs(agent, graph, sc, rank, res)
    stats = agent.close()
    say(f"{sc.steps} steps simulated in {time.monotonic() - t0:.1f} s; "
        f"{stats.records_sent} records, {stats.bytes_sent} bytes sent, {stats.records_lost} lost")


def _dying(agent, die_at_step: Optional[int], say) -> None:
    if die_at_step is None:               # fault injection for the transport's tests
        return
    feed = agent.sink

    def dying_sink(ctx):
        if ctx["decode_step"] >= die_at_step:
            say(f"dying at step {die_at_step} (test)")
            os._exit(17)
        feed(ctx)
    agent.sink = dying_sink


_TP_GROUPS: Dict[int, Any] = {}
#: Hook ring headroom: a chunk of steps may fill at most this share of a worker's ring.
GPU_RING_SHARE = 0.5
#: Clock pairs taken before the first launch and after the last (the fit needs >= 3 per
#: window), GPU_CLOCK_SPACING_S apart: the slope error is about bound / span.
GPU_CLOCK_PRIMING = 4
GPU_CLOCK_SPACING_S = 0.05


def _serve_rank_gpu(sc, rank: int, ranks: int, comm, channel, *, say=print,
                    scenario_dir: Path = Path("."), die_at_step: Optional[int] = None,
                    start_pings: int = 8) -> None:
    """GPU ranks: one tensor-parallel megakernel per GPU (`TPGroup` over the serving
    communicator picks GPU rank % count), the scenario's faults as a device fault table
    (the same binary for every scenario), the steps in chunks of launches sized so no
    worker's hook ring overflows; after each chunk its hook contexts go to the agent in
    ts order, and a %globaltimer/host clock pair (gpu_clock) is taken between launches.
    Every launch first runs GPU_LAUNCH_WARMUP_STEPS warm-up steps whose records are not
    fed (faults moved, records renumbered to scenario steps: launch_fault_specs,
    renumber_ctx).
    Every rank runs the same chunks (a run is collective).  Hook contexts the device
    dropped (ring full) are counted in the channel's lost records, so the result's
    telemetry.records_lost shows them."""
    import numpy as np
    from ..collectors.scenario import device_fault_specs
    from ..megakernel.faults import FaultTable
    from ..megakernel.presets import get_preset
    from ..runtime.agent import RankAgent
    try:
        from ..megakernel import gpu
        from ..megakernel.gpu_clock import GpuClock
    except ImportError as e:
        raise UserError(f"diagnose --backend gpu: rank {rank}: {e}") from None
    cfg = get_preset(sc.model)
    t0 = time.monotonic()
    if ranks > 1 or gpu_tp_available():
        try:
            from ..megakernel.tp import TPGroup
        except ImportError as e:
            raise UserError(f"diagnose --backend gpu: {ranks} ranks need the tensor-parallel "
                            f"launcher dtrace_mk.megakernel.tp ({e})") from None
        # one group per communicator: the job's scenarios run one after the other on it
        group = _TP_GROUPS.get(id(comm))
        if group is None:
            group = _TP_GROUPS[id(comm)] = TPGroup(comm)
        if (group.rank, group.ranks) != (rank, ranks):
            raise UserError(f"diagnose: rank {rank} of {ranks} is rank {group.rank} of "
                            f"{group.ranks} in the tensor-parallel group")
        mk = gpu.Megakernel(cfg, sc.batch, seed=sc.seed, tp=group)
    else:
        group = None
        mk = gpu.Megakernel(cfg, sc.batch, seed=sc.seed)
    graph = mk.graph
    # warm-up (no hooks, no faults), then fresh requests from step 0: the measured steps
    # start with warm caches on every rank, as the sim's do
    mk.run(GPU_WARMUP_STEPS, watchdog_ms=GPU_WATCHDOG_MS)
    mk.reset()
    clock = GpuClock()
    say(f"megakernel ready on GPU {_device_id()} ({graph.num_workers} workers, "
        f"{time.monotonic() - t0:.1f} s)")
    monitors = [str(Path(m) if Path(m).is_absolute() else scenario_dir / m) for m in sc.monitors]
    agent = RankAgent(rank, channel, num_workers=graph.num_workers, schema=graph.schema,
                      monitors=monitors, budget_bytes_per_step=sc.budget_bytes_per_step)
    agent.start(pings=start_pings)
    specs = device_fault_specs(sc, rank)
    fault_src = f"{sc.source} rank {rank}"
    FaultTable.from_specs(specs, fault_src)          # a bad fault is an error before any launch
    _dying(agent, die_at_step, say)
    _clock_pairs(clock, agent, GPU_CLOCK_PRIMING)
    t_run = time.monotonic()
    done, dropped, launches = 0, 0, 0
    hook_cap = int(getattr(mk, "hook_cap", 1 << 14))
    # every launch runs `warm` discarded steps before its scenario steps (see
    # GPU_LAUNCH_WARMUP_STEPS): the ring holds both
    warm = GPU_LAUNCH_WARMUP_STEPS
    chunk = max(1, gpu_chunk_steps(graph, len(agent.hooks), hook_cap) - warm)
    together = comm is not None and ranks > 1
    evidence = GpuEvidence(sc, rank, graph, agent.hooks, warm)

    def agree(value: int, op: str) -> int:
        """Every rank launches the same chunks: the chunk and stop decisions are agreed."""
        if not together:
            return value
        from mpi4py import MPI
        return int(comm.allreduce(int(value), op=MPI.MIN if op == "min" else MPI.MAX))

    while done < sc.steps:
        n = min(chunk, sc.steps - done)
        stopped = None
        k0 = int(mk.step) + warm              # the kernel step of scenario step `done`
        off = k0 - done                       # kernel step = scenario step + off (this launch)
        faults = FaultTable.from_specs(launch_fault_specs(specs, done, n, off), fault_src)
        try:                                  # collective: the ranks meet right before the launch
            res = mk.run(warm + n, hooks=agent.hooks, faults=faults, watchdog_ms=GPU_WATCHDOG_MS)
        except gpu.WatchdogFired as e:          # this chunk's hooks are lost with it
            res, stopped = None, e
        launches += 1
        clock.feed(agent)                     # the GPU is idle between launches
        if res is not None:
            if res.hooks_dropped:               # in full: an upper bound when the ring
                dropped += res.hooks_dropped    # also dropped warm-up records (never when sized)
                channel.add_lost(res.hooks_dropped)
            evidence.add(res.hooks, off, k0)
            for ctx in gpu.hook_dicts(res.hooks):          # sorted by ts_ns
                if ctx["decode_step"] >= k0:               # the launch's warm-up steps: not fed
                    agent.sink(renumber_ctx(ctx, off, graph.cfg.n_layers))
        agent.progress()
        if stopped is not None:
            say(f"steps {done}..{done + n - 1}: {stopped}; the result is partial")
        if agree(stopped is not None, "max"):
            break
        done += n
        # next chunk: as many steps as fit GPU_RING_SHARE of the fullest worker's ring
        # (this launch's records cover warm + n steps)
        want = sc.steps
        if len(res.hooks):
            per_worker = int(np.bincount(res.hooks["worker"].astype(np.int64)).max())
            want = max(1, int(hook_cap * GPU_RING_SHARE * (warm + n) // max(per_worker, 1)) - warm)
        chunk = agree(want, "min")
    evidence.write(say)
    _clock_pairs(clock, agent, GPU_CLOCK_PRIMING)
    stats = agent.close()
    if group is not None:
        del mk
        group.close()           # unmap the peers' buffers (collective; the next scenario maps anew)
    cr = clock.report()
    say(f"{done} of {sc.steps} steps on the GPU in {launches} launch(es) (+{warm} warm-up steps each), "
        f"{time.monotonic() - t_run:.2f} s; {stats.records_sent} records, {stats.bytes_sent} "
        f"bytes sent, {stats.records_lost} lost, {dropped} hook contexts dropped on the device; "
        f"clock pairs {cr.get('pairs')}, bound {cr.get('bound_ns_min')}..{cr.get('bound_ns_max')} ns")


def _device_id() -> str:
    try:
        import cupy
        return str(cupy.cuda.Device().id)
    except Exception:
        return "?"


def _clock_pairs(clock, agent, n: int, spacing_s: float = None) -> None:
    """n clock pairs spacing_s apart (the first at once), answering pings meanwhile."""
    spacing_s = GPU_CLOCK_SPACING_S if spacing_s is None else spacing_s
    for i in range(n):
        if i:
            until = time.monotonic() + spacing_s
            while time.monotonic() < until:
                agent.progress()
                time.sleep(0.001)
        clock.feed(agent)
        agent.progress()


def gpu_chunk_steps(graph, n_hooks: int, hook_cap: int, share: float = GPU_RING_SHARE) -> int:
    """Steps per launch so that no worker's hook ring (hook_cap contexts) fills beyond
    `share`, at the static bound: every hook fires once per task of the fullest worker's
    plan and per dynamic task (which any worker may take)."""
    dyn = sum(1 for t in graph.tasks if t.dynamic)
    per_step = (max((len(p) for p in graph.worker_plans), default=0) + dyn) * max(n_hooks, 1)
    return max(1, int(hook_cap * share) // max(per_step, 1))


#: Decode steps run (and discarded) before the scenario's, after which the state is reset.
GPU_WARMUP_STEPS = 2
#: Decode steps every launch runs BEFORE its scenario steps, in the same launch, and whose
#: records are not fed to the agent.  The first step of a launch is slower than the rest
#: (instruction cache, L2 and TLBs -- the peer mappings too -- cold after the host's work
#: between launches; each rank's launch starts when its host gets there), which the sim
#: never shows: on 2 x H200 it made the all-reduce tasks of scenario step 0 look like a
#: confident slow_task_class (0.99) on both ranks.  Inside one launch the warm-up steps'
#: all-reduces also line the ranks up, so launch skew ends before scenario step 0.  The
#: scenario's faults are shifted to the kernel steps (launch_fault_specs) and the
#: records renumbered back (renumber_ctx), so the agent, the join keys (comm_gen) and the
#: epochs see scenario steps only.  docs/dev/megakernel_contract.md "Cold launches".
GPU_LAUNCH_WARMUP_STEPS = 2
#: Environment variable naming a folder: each GPU rank writes its per-class, per-step
#: evidence table there (GpuEvidence; tests/gpu/test_diagnose_gpu.py sets it).
ENV_GPU_EVIDENCE = "DTRACE_MK_GPU_EVIDENCE"


def launch_fault_specs(specs: List[Dict[str, Any]], done: int, n: int, off: int) -> List[Dict[str, Any]]:
    """The device fault specs of one launch: the scenario steps done..done+n-1 that a
    fault names, moved to kernel steps (+ off); a fault with no step in the launch is left
    out (so nothing is injected into the launch's warm-up steps)."""
    out = []
    for f in specs:
        steps = f.get("steps")
        if steps is None:
            mine = list(range(done, done + n))
        else:
            mine = [int(k) for k in (steps if isinstance(steps, list) else [steps]) if done <= int(k) < done + n]
        if mine:
            out.append({**f, "steps": [k + off for k in mine]})
    return out


_COMM_HOOKS = ("comm:signal", "comm:wait")


def renumber_ctx(ctx: Dict[str, Any], off: int, n_layers: int) -> Dict[str, Any]:
    """A hook context of kernel step k as one of scenario step k - off: decode_step,
    task_gen (= the step), comm_gen (= step * n_layers + layer, comm hooks) and event_gen
    (a wait target or signal count: c * (k + 1), or k for the step event) move together,
    identically on every rank (every rank runs the same launches)."""
    if not off:
        return ctx
    k = int(ctx["decode_step"])
    s = k - off
    ctx["decode_step"] = s
    if ctx.get("task_gen") == k:
        ctx["task_gen"] = s
    if ctx.get("hook") in _COMM_HOOKS and ctx.get("comm_gen") is not None:
        ctx["comm_gen"] = int(ctx["comm_gen"]) - off * n_layers
    eg = ctx.get("event_gen")
    if eg:
        eg = int(eg)
        if eg == k:
            ctx["event_gen"] = s
        elif eg % (k + 1) == 0:
            ctx["event_gen"] = eg // (k + 1) * (s + 1)
    return ctx


class GpuEvidence:
    """Per task class and step of one GPU rank, from the device records: tasks run, mean
    task:end duration, mean dependency wait (dep:release), mean comm:wait, in us; the
    launches' warm-up steps too (negative steps relative to the launch's first scenario
    step are marked warm).  Written as JSON to $DTRACE_MK_GPU_EVIDENCE/<scenario>.rank<r>.json
    when that is set (nothing otherwise): the evidence a failed GPU diagnosis test prints."""

    def __init__(self, sc, rank: int, graph, hooks, warm: int):
        self.dir = os.environ.get(ENV_GPU_EVIDENCE)
        self.sc, self.rank, self.graph, self.warm = sc, rank, graph, warm
        self.hooks = list(hooks or [])
        self.acc: Dict[Tuple[int, bool, str], List[float]] = {}
        self.launches: List[Dict[str, int]] = []

    def add(self, recs, off: int, k0: int) -> None:
        if not self.dir:
            return
        import numpy as np
        from ..abi import definition as Dd
        from ..megakernel.graph import CLASS_IDS
        names = {v: k for k, v in CLASS_IDS.items()}
        self.launches.append({"kernel_step0": k0 - self.warm, "warm": self.warm, "offset": off,
                              "records": int(len(recs))})
        cols = {"task:end": ("dur_ns", 1), "dep:release": ("wait_ns", 2), "comm:wait": ("wait_ns", 3)}
        for hook, (field, col) in cols.items():
            m = recs[recs["hook"] == Dd.hook(hook).id]
            for cls, k, v in zip(m["task_class"].astype(np.int64), m["decode_step"].astype(np.int64),
                                 m[field].astype(np.float64)):
                key = (int(k) - off, int(k) < k0, names.get(int(cls), str(int(cls))))
                row = self.acc.setdefault(key, [0.0, 0, 0.0, 0, 0.0, 0])   # (sum, n) per column
                row[2 * col - 2] += v
                row[2 * col - 1] += 1

    def rows(self) -> List[Dict[str, Any]]:
        out = []
        for (step, w, cls), r in sorted(self.acc.items()):
            mean = lambda i: round(r[i] / r[i + 1] / 1e3, 2) if r[i + 1] else None  # noqa: E731
            out.append({"step": step, "warm": w, "class": cls, "tasks": r[1],
                        "dur_us": mean(0), "dep_wait_us": mean(2), "comm_wait_us": mean(4)})
        return out

    def write(self, say) -> None:
        if not self.dir:
            return
        path = Path(self.dir) / f"{self.sc.name}.rank{self.rank}.json"
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps({"scenario": self.sc.name, "rank": self.rank, "hooks": self.hooks,
                                        "launches": self.launches, "rows": self.rows()}, indent=1))
        except OSError as e:
            say(f"evidence: cannot write {path}: {e.strerror}")
#: Watchdog of the GPU runs: a wait longer than this stops the megakernel (partial result).
GPU_WATCHDOG_MS = 5000


def _sim_rank_graph(cfg, sc, rank: int, ranks: int, comm):
    """(graph, MPI sim transport or None) for one sim rank: rank `rank` of a `ranks`-way
    tensor-parallel graph whose remote signals travel over `comm` (the serving ranks'
    communicator, without the collector)."""
    from ..megakernel.graph import build_graph
    transport = None
    if ranks > 1:
        from ..megakernel.mpi_transport import MPITransport
        transport = MPITransport(comm)
        if (transport.rank, transport.size) != (rank, ranks):
            raise UserError(f"diagnose: rank {rank} of {ranks} is MPI rank {transport.rank} of "
                            f"{transport.size} in the serving communicator")
    graph = build_graph(cfg, sc.batch, SIM_WORKERS, rank=rank, ranks=ranks)
    return graph, transport


def _sim_pingpongs(agent, graph, sc, rank: int, res) -> None:
    """Score-P ping-pongs on the SIMULATED hosts (the real ones say nothing about them):
    at every step start t, the collector's host (rank 0's, host offset 0) sends at t, the
    rank's host stamps its clock at t + L, the reply lands at t + 2L, L = the sim's
    one-way comm latency.  Ranks of one simulated host (8 per host) come out at offset 0
    up to read jitter; further hosts at their offsets, which the clock model removes."""
    from ..megakernel.cost import model_costs
    from ..megakernel.mpi_transport import rank_clock
    clock = rank_clock(rank, sc.seed, True)
    lat = max(1, int(model_costs(graph.cfg).comm_ns))
    for i, t in enumerate(res.step_start_ns):
        agent.pingpong(t, clock.host_ns(t + lat, 10_000 + i), t + 2 * lat)


def _run_sim(graph, sc, faults, agent, transport, rank: int):
    """Run the sim with the agent as the hook sink and clock-sample callback."""
    from ..megakernel.mpi_transport import rank_clock
    from ..megakernel.sim import Sim
    sim = Sim(graph, sc.steps, faults=faults, sink=agent.sink, hooks=agent.hooks, seed=sc.seed,
              transport=transport.port if transport is not None else None,
              clock=rank_clock(rank, sc.seed, True), on_clock=agent.clock_sample)
    if transport is None:
        return sim.run()
    return transport.run(sim)


if __name__ == "__main__":
    sys.exit(mpi_main())
