"""Start a serving job under mpiexec with the collector beside it; stop it cleanly.

    job = start_job(2, ["python", "-m", "dtrace_mk.launch.serve", "--model", "tiny"],
                    json_spans="spans.jsonl")
    job.wait_ready(deadline)          # the control socket answers
    ...                               # attach through launch.control.ControlClient(job.job)
    rc = job.wait()                   # or job.stop() (control `stop`, then SIGTERM, SIGKILL)
    result = job.result()             # the collector's diagnosis (None if it wrote none)
    job.cleanup()                     # removes the job directory

The MPI command is MPMD: `mpiexec -n N COMMAND : -n 1 python -m dtrace_mk.launch.collector
...` ($DTRACE_MK_MPIEXEC, e.g. `mpirun`, else the venv's mpiexec next to sys.executable,
else mpiexec/mpirun on PATH; Open MPI gets --oversubscribe, -x for the job variables and
PASS_ENV, and --allow-run-as-root when root).  Backend auto: gpu when CuPy sees a GPU per
serving rank, else sim.  The serving processes find their job
through `DTRACE_MK_JOB_DIR` (and `DTRACE_MK_BACKEND`); a leading `python`/`python3` in
COMMAND is replaced by this interpreter so the job runs in the same environment.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from ..errors import UserError
from ..runtime.summary_windows import SUMMARY_MODES
from . import jobs

DEFAULT_COMMAND = ["python", "-m", "dtrace_mk.launch.serve", "--model", "tiny"]
#: passed to the ranks with Open MPI's -x when set (MPICH's Hydra passes the environment)
PASS_ENV = ("PYTHONPATH", "NCCL_NVLS_ENABLE", "CUDA_VISIBLE_DEVICES", "DTRACE_MK_CACHE", "CUPY_CACHE_DIR",
            "DTRACE_MK_SUMMARIES", "DTRACE_MK_BUILD_LOG")


class terminate_as_interrupt:
    """`with terminate_as_interrupt():` SIGTERM/SIGHUP raise KeyboardInterrupt, so the
    Ctrl-C path (stop the job, clean up its directory) runs for them too."""

    def __enter__(self):
        def raise_interrupt(signum, frame):
            raise KeyboardInterrupt
        self.old = {s: signal.signal(s, raise_interrupt) for s in (signal.SIGTERM, signal.SIGHUP)}
        return self

    def __exit__(self, *exc):
        for s, h in self.old.items():
            signal.signal(s, h)
        return False


def mpiexec_and_flavour():
    from ..commands.diagnose import find_mpiexec, mpi_flavour
    exe = find_mpiexec()
    return exe, mpi_flavour(exe)


def build_command(mpiexec: str, flavour: str, ranks: int, command: Sequence[str],
                  collector_args: Sequence[str], export: Sequence[str] = ()) -> List[str]:
    """export: more variables Open MPI must pass on (set in the job's environment)."""
    flags: List[str] = []
    if flavour == "openmpi":
        flags.append("--oversubscribe")
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            flags.append("--allow-run-as-root")
        for v in (jobs.ENV_JOB_DIR, "DTRACE_MK_BACKEND", jobs.ENV_RUNTIME_DIR, *export):
            flags += ["-x", v]
        for v in PASS_ENV:           # when set here: carried wheels, NCCL/CUDA settings, caches
            if v in os.environ:
                flags += ["-x", v]
    cmd = list(command)
    if cmd and cmd[0] in ("python", "python3"):
        cmd[0] = sys.executable
    coll = [sys.executable, "-m", "dtrace_mk.launch.collector", *collector_args]
    return [mpiexec, *flags, "-n", str(ranks), *cmd, ":", "-n", "1", *coll]


@dataclass
class Launched:
    job: jobs.Job
    proc: subprocess.Popen
    argv: List[str]
    ranks: int
    started: float = field(default_factory=time.monotonic)
    backend: str = "sim"

    def running(self) -> bool:
        return self.proc.poll() is None

    def wait_ready(self, deadline: float) -> bool:
        """True once the control socket answers; False if the job ended or the deadline passed."""
        from .control import wait_for_socket
        return wait_for_socket(self.job, deadline, self.running)

    def wait(self, timeout_s: Optional[float] = None) -> int:
        return self.proc.wait(timeout=timeout_s)

    def stop(self, grace_s: float = 30.0, say=lambda s: None) -> int:
        """Graceful: a control `stop` (ranks stop at a step boundary, agents flush, the
        collector diagnoses); then SIGTERM to the job's process group; then SIGKILL."""
        if self.running():
            from .control import ControlClient, ControlError
            try:
                r = ControlClient(self.job, connect_timeout_s=2.0).stop()
                say(f"job {self.job.id}: stopping at step {r.get('at_step')}")
            except (ControlError, jobs.JobError) as e:
                say(f"job {self.job.id}: control stop failed ({e}); terminating")
                self._signal(signal.SIGTERM)
            try:
                return self.proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                say(f"job {self.job.id}: still running after {grace_s:g} s; terminating")
                self._signal(signal.SIGTERM)
            try:
                return self.proc.wait(timeout=5.0)
            except subprocess.TimeoutExpired:
                self._signal(signal.SIGKILL)
        return self.proc.wait()

    def kill(self) -> None:
        self._signal(signal.SIGKILL)
        self.proc.wait()

    def _signal(self, sig: int) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass

    def result(self) -> Optional[Dict[str, Any]]:
        import json
        p = self.job.result_path
        if p.is_file():
            return json.loads(p.read_text())
        spool = Path(str(p) + ".spool")
        if spool.is_file():            # the collector died with the job: a partial result
            from ..collectors import transport as T
            acc = T.CollectorSink(use_pingpongs=False)
            loop = T.replay_spool(str(spool), list(range(self.ranks)), acc)
            if not acc.summaries:
                return None            # nothing arrived: no diagnosis to speak of
            res = acc.result(None, ranks=self.ranks)
            res["transport"].update(loop.report())
            res["scenario"] = self.job.id
            res["partial_from_spool"] = True
            return res
        return None

    def cleanup(self) -> None:
        self.job.remove()


def start_job(ranks: int, command: Sequence[str] = (), *, backend: str = "auto",
              otlp: Optional[str] = None, json_spans: Optional[str] = None,
              prometheus_port: Optional[int] = None, quiet: bool = False,
              stdout=None, stderr=None, tier: Optional[str] = None,
              summaries: Optional[str] = None) -> Launched:
    if ranks < 1:
        raise UserError(f"-n: expected >= 1 serving ranks, got {ranks}")
    if tier not in (None, "hot", "compiled", "auto"):
        raise UserError(f"--tier: expected hot, compiled or auto, got {tier!r}")
    if summaries is not None and summaries not in SUMMARY_MODES:
        raise UserError(f"--summaries: expected {' or '.join(SUMMARY_MODES)}, got {summaries!r}")
    command = list(command) or list(DEFAULT_COMMAND)
    mpiexec, flavour = mpiexec_and_flavour()
    if backend not in ("auto", "sim", "gpu"):
        raise UserError(f"--backend: expected auto, sim or gpu, got {backend!r}")
    if backend in ("auto", "gpu"):   # gpu: one GPU per serving rank
        from .serve import gpu_count
        n = gpu_count()
        if backend == "gpu" and n < ranks:
            raise UserError(f"launch --backend gpu: {ranks} serving rank(s) need a GPU each; CuPy "
                            f"sees {n}")
        backend = "gpu" if n >= ranks else "sim"
    if summaries == "device" and backend != "gpu":
        raise UserError("launch --summaries device: the summaries run in the GPU megakernels' device VM; "
                        f"this job's ranks run on the {backend} backend")
    job = jobs.new_job(ranks, command, backend)
    coll = ["--result", str(job.result_path), "--job-id", job.id,
            "--backend", "gpu" if backend == "gpu" else "sim"]
    if json_spans:
        coll += ["--json-spans", str(Path(json_spans).resolve())]
    if otlp:
        coll += ["--otlp", otlp]
    if prometheus_port is not None:
        coll += ["--prometheus-port", str(prometheus_port)]
    if quiet:
        coll.append("--quiet")
    export = (("DTRACE_MK_TIER",) if tier is not None else ()) + \
        (("DTRACE_MK_SUMMARIES",) if summaries is not None else ())
    argv = build_command(mpiexec, flavour, ranks, command, coll, export=export)
    env = dict(os.environ)
    env[jobs.ENV_JOB_DIR] = str(job.dir)
    env[jobs.ENV_RUNTIME_DIR] = str(job.dir.parent)
    env["DTRACE_MK_BACKEND"] = backend
    if tier is not None:                       # the reference server's --tier default
        env["DTRACE_MK_TIER"] = tier
    if summaries is not None:                  # ... and its --summaries default
        env["DTRACE_MK_SUMMARIES"] = summaries
    try:
        proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=stdout,
                                stderr=stderr, start_new_session=True)
    except OSError as e:
        job.remove()
        raise UserError(f"launch: cannot start {argv[0]} ({e.strerror})") from None
    return Launched(job, proc, argv, ranks, backend=backend)


def step_ranges(steps: Sequence[int]) -> str:
    """[5, 6, 7, 9] -> '5-7, 9'."""
    out: List[str] = []
    s = sorted(set(int(x) for x in steps))
    i = 0
    while i < len(s):
        j = i
        while j + 1 < len(s) and s[j + 1] == s[j] + 1:
            j += 1
        out.append(str(s[i]) if i == j else f"{s[i]}-{s[j]}")
        i = j + 1
    return ", ".join(out)


def summary_lines(res: Dict[str, Any]) -> List[str]:
    """The diagnosis in a few lines: verdict, each finding (cause, root rank, what, steps
    as ranges, observed on, confidence, impact), coverage, telemetry."""
    from ..collectors.score import CONFIDENT
    cov = res["coverage"]
    sure = [f for f in res["findings"] if f["confidence"] >= CONFIDENT]
    weak = [f for f in res["findings"] if f["confidence"] < CONFIDENT]
    if weak and not sure:      # (the verdict's own threshold is lower than the display's)
        lines = [f"verdict {res['verdict']}: no finding at confidence {CONFIDENT:.2f} or more "
                 f"({len(weak)} below it, listed apart)"]
    else:
        lines = [f"verdict {res['verdict']}: {len(sure)} finding(s)"
                 + (f" (+ {len(weak)} below confidence {CONFIDENT:.2f})" if weak else "")]

    def line(f, indent):
        what = f.get("task_class") or f.get("comm_op") or ""
        extra = f" layer {f['layer']}" if "layer" in f else ""
        return (f"{indent}{f['cause']} rooted at rank {f['rank']} ({what}{extra}), steps "
                f"{step_ranges(f['steps'])}, observed on rank(s) "
                f"{', '.join(str(r) for r in f['observed_on'])}; confidence "
                f"{f['confidence']:.2f}, impact {f['impact_us']:.0f} us")
    lines += [line(f, "  ") for f in sure]
    if weak:       # listed, but apart: small, irregular effects a long run also shows
        lines.append(f"  below confidence {CONFIDENT:.2f} (possibly noise):")
        lines += [line(f, "    ") for f in weak]
    if res.get("missing_ranks") or res.get("partial"):
        lines.append(f"  partial: missing ranks {res.get('missing_ranks', [])}, incomplete "
                     f"{res.get('incomplete_ranks', {})}")
    lines.append(f"coverage: eligible {cov['eligible']}, executed {cov['executed']}, throttled "
                 f"{cov['throttled']}, lost {cov['lost']}")
    lines.append(f"telemetry: {res.get('telemetry_bytes')} bytes from the agents")
    return lines
