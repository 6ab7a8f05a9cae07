"""`dtrace-mk launch`: run a serving job under mpiexec with the collector beside it.

    dtrace-mk launch -n 2 -- python -m dtrace_mk.launch.serve --model tiny --duration 60
    dtrace-mk launch -n 2 --json-spans spans.jsonl --prometheus-port 9464
    dtrace-mk launch -n 4 --otlp http://127.0.0.1:4318 -- python -m dtrace_mk.launch.serve --model small-moe

Starts `mpiexec -n N COMMAND : -n 1 python -m dtrace_mk.launch.collector` (the venv's
mpiexec; COMMAND defaults to the reference server `python -m dtrace_mk.launch.serve
--model tiny`).  Each serving rank hosts the agent (`dtrace_mk.launch.api.ServingHost`);
serving rank 0 serves the job's control socket, so from another terminal:

    dtrace-mk attach --job ID -e 'comm:wait { @wait_us[comm.peer] = sum(comm.wait_ns / 1000); }'
    dtrace-mk list --job ID          dtrace-mk detach --job ID --id N

The job id goes to stdout; progress lines to stderr.  Ctrl-C stops the job at a step
boundary (agents flush, the collector diagnoses and exports); a second Ctrl-C kills it.
At the end the diagnosis is printed (and written with --out) and spans are exported
(--json-spans FILE, --otlp URL or --otlp env for the OTEL_EXPORTER_OTLP_* variables).
The exit status is the job's.
"""
from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

from ..errors import UserError
from ..runtime.summary_windows import DEFAULT_SUMMARIES, SUMMARY_MODES

NAME = "launch"
ORDER = 30
HELP = "start a serving job under mpiexec with the collector; attach to it live"
DESCRIPTION = __doc__.split("\n\n", 1)[1]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("-n", "--ranks", type=int, default=2, help="serving ranks (default 2)")
    p.add_argument("--backend", choices=("auto", "gpu", "sim"), default="auto",
                   help="the ranks' backend (auto: gpu when CuPy sees a GPU per rank, else sim)")
    p.add_argument("--otlp", metavar="URL", help="export spans over OTLP/HTTP at the end ('env': "
                                                  "the OTEL_EXPORTER_OTLP_* variables)")
    p.add_argument("--json-spans", metavar="FILE", help="write spans as JSON lines")
    p.add_argument("--prometheus-port", type=int, metavar="P",
                   help="serve live metrics on 127.0.0.1:P while the job runs")
    p.add_argument("--out", metavar="RESULT.json", help="also write the diagnosis here")
    p.add_argument("--tier", choices=("hot", "compiled", "auto"), default=None,
                   help="gpu backend: where live queries run (the reference server's --tier, "
                        "passed as $DTRACE_MK_TIER): hot = device VM (default), compiled = linked "
                        "into the megakernel at the next launch boundary, auto = hot, promoted by "
                        "the tier policy")
    p.add_argument("--summaries", choices=SUMMARY_MODES, default=None,
                   help="gpu backend: where the ranks' summary monitors run (the reference server's "
                        "--summaries, passed as $DTRACE_MK_SUMMARIES): host = every hook record to the "
                        f"rank's agent, device = their task half in the device VM (default {DEFAULT_SUMMARIES})")
    p.add_argument("--ready-timeout", type=float, default=120.0, metavar="S",
                   help="give up when the control socket is not up after S seconds (default 120)")
    p.add_argument("--quiet", action="store_true", help="fewer progress lines")
    p.add_argument("command", nargs=argparse.REMAINDER, metavar="-- COMMAND ...",
                   help="the serving command (default: python -m dtrace_mk.launch.serve --model tiny)")


def run(args: argparse.Namespace) -> int:
    from ..launch.launcher import start_job, terminate_as_interrupt
    cmd = list(args.command)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if args.prometheus_port is not None and not 0 <= args.prometheus_port < 65536:
        raise UserError(f"--prometheus-port: expected 0..65535, got {args.prometheus_port}")
    say = lambda s: print(f"launch: {s}", file=sys.stderr, flush=True)  # noqa: E731
    with terminate_as_interrupt():
        return _run(args, cmd, say, start_job)


def _run(args, cmd, say, start_job) -> int:
    job = start_job(args.ranks, cmd, backend=args.backend, otlp=args.otlp, json_spans=args.json_spans,
                    prometheus_port=args.prometheus_port, quiet=args.quiet,
                    tier=getattr(args, "tier", None), summaries=getattr(args, "summaries", None))
    rc = 130
    try:
        print(f"job {job.job.id}", flush=True)
        say(f"job {job.job.id}: {args.ranks} serving rank(s) + collector: "
            + " ".join(shlex.quote(a) for a in job.argv))
        try:      # Ctrl-C from here on (also while waiting for the control socket) stops gracefully
            if job.wait_ready(time.monotonic() + args.ready_timeout):
                say(f"job {job.job.id} is serving; from another terminal:\n"
                    f"  dtrace-mk attach --job {job.job.id} -e 'task:end {{ @n[task.class] = count(); }}'\n"
                    f"  dtrace-mk list --job {job.job.id}\n"
                    f"  Ctrl-C here stops the job at a step boundary")
            elif job.running():
                say(f"job {job.job.id}: no control socket after {args.ready_timeout:g} s (is COMMAND "
                    f"hosting dtrace_mk.launch.api.ServingHost?); waiting for it to end")
            rc = job.wait()
        except KeyboardInterrupt:
            say(f"stopping job {job.job.id} (Ctrl-C again kills it)")
            try:
                rc = job.stop(say=say)
            except KeyboardInterrupt:
                job.kill()
                rc = 130
        say(f"job {job.job.id} ended (exit status {rc})")
        res = job.result()
        if res is not None:
            from ..launch.launcher import summary_lines
            print("\n".join(summary_lines(res)))
            for e in (res.get("export") or {}).get("exporters", []):
                print(f"spans: {res['export']['spans']} -> {e['kind']} "
                      f"{e.get('path') or e.get('target')}"
                      + (f" ({e['dropped']} dropped)" if e.get("dropped") else ""))
            if args.out:
                try:
                    Path(args.out).write_text(json.dumps(res, indent=1) + "\n")
                except OSError as e:
                    raise UserError(f"--out {args.out}: cannot write ({e.strerror})") from None
                from ..exporters import records_path_for
                rec = records_path_for(job.job.result_path)
                if rec.is_file():      # the records too: `dtrace-mk export --result OUT` works
                    try:
                        records_path_for(args.out).write_bytes(rec.read_bytes())
                    except OSError as e:
                        raise UserError(f"--out {args.out}: cannot write its records "
                                        f"({e.strerror})") from None
                print(f"result: {args.out}")
        else:
            say("no diagnosis (the collector wrote none)")
    except KeyboardInterrupt:
        job.kill()
        rc = 130
    finally:
        if job.running():
            job.kill()
        job.cleanup()
    return rc
