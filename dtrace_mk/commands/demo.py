"""`dtrace-mk demo`: a 2-rank serving job with an injected remote stall, a query attached
live, the collector's diagnosis and spans with cross-rank links.

What it runs (the same pieces as `dtrace-mk launch` + `dtrace-mk attach`):

1. `mpiexec -n 2 python -m dtrace_mk.launch.serve --model tiny ... : -n 1 collector`:
   two tensor-parallel ranks of the reference megakernel (sim backend: a discrete-event
   twin of the kernel, one MPI process per rank) serving Poisson request arrivals with
   continuous batching, each hosting the agent.  The fault table makes rank 1's
   all-reduce signal after attention late (`late_comm`, +200 us) for the second half of
   the steps: the same binary, the fault is data.
2. Once the job's control socket is up, the query below is compiled and verified here,
   sent over the socket, broadcast to both ranks and attached at a step boundary; its
   maps stream back while the job runs (per rank, with coverage).
3. At the end the collector aligns the ranks' clocks, joins remote waits to signals by
   (comm_op, comm_gen) and names the root cause: a remote stall rooted at rank 1, seen as
   waiting on rank 0.  Spans (a span per rank and step, remote waits linked to the
   sender's signal span) go to a JSON-lines file, and with --otlp URL to a running
   OpenTelemetry backend.

With 2 GPUs visible to CuPy (`--backend auto`, the default) the ranks are GPU ranks: one
megakernel per GPU, tensor parallel, RESIDENT: one launch for every step (a step
boundary is where the agent takes the step's records and the live query attaches); the
first GPU_LAUNCH_WARMUP_STEPS (2) steps warm the kernel up and are not observed, and the
steps keep the device's numbers, so `--steps 16` serves steps 2-17 (the fault's steps 8-15
lie inside them).  The live query then runs in the device VM of the running kernel and
counts `task:end` per step (`QUERY_GPU`), and the fault is the same `late_comm` row of the
device fault table.  Otherwise sim ranks.
"""
from __future__ import annotations

import argparse
import json
import sys
import os
import re
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

from ..errors import UserError
from ..runtime.summary_windows import DEFAULT_SUMMARIES, SUMMARY_MODES

NAME = "demo"
ORDER = 1
HELP = "2-rank job with an injected remote stall: live query, diagnosis, spans"
DESCRIPTION = __doc__.split("\n\n", 1)[1]

#: The live query: average remote wait per comm op and quarter of the run (step / Q).
#: Both ranks wait longer once the fault starts -- the query alone cannot say who is late;
#: the collector's join of waits to signals can.
QUERY = 'comm:wait {{ @remote_wait_us[comm.op, step / {q}] = avg(comm.wait_ns / 1000); }}'


#: On GPU ranks: tasks finished per decode step, counted in the device VM (the same count
#: on every step and rank: the tasks of one step of the rank's graph).
QUERY_GPU = 'task:end { @task_end[step] = count(); }'


def query_for(steps: int, backend: str = "sim") -> str:
    if backend == "gpu":
        return QUERY_GPU
    return QUERY.format(q=max(1, steps // 4))
FAULT_DELAY_US = 200


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--backend", choices=("auto", "sim", "gpu"), default="auto",
                   help="auto (default): GPU ranks when CuPy sees 2 GPUs, else sim ranks")
    p.add_argument("--model", default="tiny", help="model preset (default tiny)")
    p.add_argument("--steps", type=int, default=24, help="decode steps (default 24; the fault "
                                                         "covers the second half)")
    p.add_argument("--batch", type=int, default=4, help="request slots (default 4)")
    p.add_argument("--no-fault", action="store_true", help="run without the injected fault")
    p.add_argument("--spans", default=None, metavar="FILE",
                   help="spans as JSON lines (default: dtrace_mk_demo.spans.jsonl in the temp dir)")
    p.add_argument("--perfetto", default=None, metavar="FILE",
                   help="Perfetto trace of the job: a track per rank and worker, remote-wait flows "
                        "(default: dtrace_mk_demo.perfetto-trace in the temp dir; open in ui.perfetto.dev)")
    p.add_argument("--otlp", metavar="URL", help="also export the spans over OTLP/HTTP "
                                                  "(e.g. http://127.0.0.1:4318)")
    p.add_argument("--prometheus-port", type=int, metavar="P", help="live metrics while it runs")
    p.add_argument("--interval", type=float, default=0.5, metavar="S",
                   help="seconds between the live query's outputs (default 0.5)")
    p.add_argument("--timeout", type=float, default=120.0, metavar="S",
                   help="give up after S seconds (default 120)")
    p.add_argument("-f", "--format", choices=("text", "json"), default="text",
                   help="text, or newline-delimited JSON (query blocks, then the diagnosis)")
    p.add_argument("--summaries", choices=SUMMARY_MODES, default=None,
                   help="GPU backend: where the ranks' summary monitors run (serve --summaries; "
                        f"default {DEFAULT_SUMMARIES}, or $DTRACE_MK_SUMMARIES)")


def fault_spec(steps: int) -> str:
    first = steps // 2
    return (f"late_comm:rank=1,steps={first}-{steps - 1},comm_op=allreduce_attn,layer=0,"
            f"delay_us={FAULT_DELAY_US}")


def cross_rank_links(spans_path: Path) -> Dict[str, int]:
    """Spans in the file, and links from a rank's span to a span of another rank."""
    spans = [json.loads(line) for line in spans_path.read_text().splitlines() if line.strip()]
    rank_of = {s["span_id"]: s["attributes"].get("dtrace_mk.rank") for s in spans}
    links = cross = 0
    for s in spans:
        for ln in s.get("links", []):
            links += 1
            if rank_of.get(ln["span_id"], s["attributes"].get("dtrace_mk.rank")) != \
                    s["attributes"].get("dtrace_mk.rank"):
                cross += 1
    return {"spans": len(spans), "links": links, "cross_rank_links": cross}


def run(args: argparse.Namespace) -> int:
    from ..launch.api import render_output
    from ..launch.control import ControlClient
    from ..launch.launcher import start_job, summary_lines, terminate_as_interrupt
    from .attach import compile_for_attach

    if args.steps < 4:
        raise UserError(f"--steps: expected >= 4 (the fault covers the second half), got {args.steps}")
    from ..launch.serve import gpu_count
    n_gpus = gpu_count() if args.backend != "sim" else 0
    if args.backend == "gpu" and n_gpus < 2:
        raise UserError(f"demo --backend gpu: needs 2 GPUs visible to CuPy, found {n_gpus}; "
                        f"use --backend sim")
    backend = "gpu" if n_gpus >= 2 else "sim"
    summaries = getattr(args, "summaries", None)
    if summaries == "device" and backend != "gpu":
        raise UserError("demo --summaries device: the summaries run in the GPU megakernel's device VM; this "
                        "demo runs on the sim backend (2 GPUs needed)")
    text = args.format == "text"
    say = print if text else (lambda *a, **k: None)
    query = query_for(args.steps, backend)
    raw, name, qtext = compile_for_attach(query, None)          # rejected here, never sent
    spans = Path(args.spans or Path(tempfile.gettempdir()) / "dtrace_mk_demo.spans.jsonl").resolve()
    if spans.exists():
        spans.unlink()
    cmd = ["python", "-m", "dtrace_mk.launch.serve", "--model", args.model, "--steps", str(args.steps),
           "--batch", str(args.batch), "--await-attach", "30", "--quiet", "--backend", backend]
    if not args.no_fault:
        cmd += ["--fault", fault_spec(args.steps)]
    if summaries is not None and backend == "gpu":
        cmd += ["--summaries", summaries]
    if backend == "gpu":
        from .diagnose import GPU_LAUNCH_WARMUP_STEPS as warm
        what = (f"GPU backend: 2 GPUs, one resident launch; the first {warm} steps warm it up, "
                f"not observed")
        served = f"steps {warm}-{warm + args.steps - 1}"
    else:
        what, served = "sim backend", f"steps 0-{args.steps - 1}"
    say(f"== dtrace_mk demo: 2 ranks of the {args.model} megakernel ({what}), batch "
        f"{args.batch}, {args.steps} decode steps ({served}) ==")
    if not args.no_fault:
        say(f"fault table: late_comm on rank 1 (allreduce_attn, layer 0, +{FAULT_DELAY_US} us) in steps "
            f"{args.steps // 2}-{args.steps - 1}; the same binary runs every step")
    t0 = time.monotonic()
    deadline = t0 + args.timeout
    log = tempfile.NamedTemporaryFile("w+", prefix="dtmk-demo-", suffix=".log")
    job = start_job(2, cmd, backend=backend, otlp=args.otlp, json_spans=str(spans),
                    prometheus_port=args.prometheus_port, quiet=True, stdout=log, stderr=log)
    outputs: List[Dict[str, Any]] = []
    final: Optional[Dict[str, Any]] = None
    guard = terminate_as_interrupt().__enter__()
    try:
        say(f"job {job.job.id}: mpiexec -n 2 (serving ranks) : -n 1 (collector)")
        if not job.wait_ready(deadline):
            raise UserError(f"demo: the job's control socket did not come up ({_tail(log)})")
        reply, stream = ControlClient(job.job).attach(raw, name, qtext, stream=True,
                                                      interval_s=args.interval)
        where = "in the device VM of each rank's megakernel" if backend == "gpu" else \
            "in each rank's runtime"
        keys = "decode step" if backend == "gpu" else \
            f"comm op, quarter of the run = step / {max(1, args.steps // 4)}"
        say(f"attached live through the control socket (as dtrace-mk attach does), query "
            f"{reply['id']} at step {reply['apply_at']}, running {where}:\n  {query}\n  (keys: {keys})")
        for msg in stream:
            if msg.get("type") == "output":
                outputs.append(msg)
                if msg.get("final"):
                    final = msg
                elif text:
                    steps = sorted({p["step"] for p in msg["ranks"].values()})
                    print(f"  live output at step {steps[-1]}: " + _oneline(msg, query.split()[0]))
            elif msg.get("type") == "end":
                break
            if time.monotonic() > deadline:
                raise UserError(f"demo: no end after {args.timeout:g} s")
        rc = job.wait(timeout_s=max(1.0, deadline - time.monotonic()))
        if rc != 0:
            raise UserError(f"demo: the MPI job exited with status {rc} ({_tail(log)})")
        res = job.result()
        if res is None:
            raise UserError(f"demo: the collector wrote no diagnosis ({_tail(log)})")
        perfetto = write_perfetto(res, job.job, args.perfetto)
    finally:
        if job.running():
            job.kill()
        job.cleanup()
        log.close()
        guard.__exit__()
    links = cross_rank_links(spans) if spans.is_file() else {"spans": 0, "links": 0, "cross_rank_links": 0}
    links["perfetto_file"] = str(perfetto) if perfetto else None
    if not text:
        if final is not None:
            sys.stdout.write(render_output(final, "json"))
        print(json.dumps({"type": "diagnosis", "backend": backend, "query": query,
                          "verdict": res["verdict"], "findings": res["findings"],
                          "coverage": res["coverage"], "spans_file": str(spans), **links,
                          "wall_s": round(time.monotonic() - t0, 2)}, sort_keys=True))
        return 0
    print("\n-- diagnosis (the collector: clocks aligned, waits joined to signals by comm_op/comm_gen) --")
    for line in summary_lines(res):
        print(line)
    print("\n-- the live query's final output (per rank, with coverage) --")
    sys.stdout.write(render_output(final, "text") if final else "(no output)\n")
    print(f"\nspans: {links['spans']} spans, {links['cross_rank_links']} links from a rank's remote wait "
          f"to the other rank's signal -> {spans}")
    if perfetto:
        print(f"perfetto: {perfetto} (open in https://ui.perfetto.dev)")
    for e in (res.get("export") or {}).get("exporters", []):
        if e["kind"] == "otlp":
            print(f"spans: {e.get('exported', 0)} exported to {e.get('target')}"
                  + (f", {e['dropped']} dropped" if e.get("dropped") else ""))
    print(f"({time.monotonic() - t0:.1f} s)  next: dtrace-mk launch -n 2 -- python -m "
          f"dtrace_mk.launch.serve --model tiny --duration 60, then dtrace-mk attach --job ID -e 'QUERY'")
    return 0


def write_perfetto(res, job, path: Optional[str]) -> Optional[Path]:
    """The job's Perfetto trace from its result and records (what `dtrace-mk export
    --perfetto` writes); None when the collector kept no records."""
    from ..exporters import export_result, load_records, records_path_for
    rec = records_path_for(job.result_path)
    if not rec.is_file():
        return None
    out = Path(path or Path(tempfile.gettempdir()) / "dtrace_mk_demo.perfetto-trace").resolve()
    export_result(res, load_records(rec), [f"perfetto={out}"], job_id=job.id)
    return out


def _oneline(msg: Dict[str, Any], hook: str = "comm:wait") -> str:
    parts = []
    for r, part in sorted(msg["ranks"].items(), key=lambda kv: int(kv[0])):
        n = sum(b["coverage"]["eligible"] for b in part["blocks"] if b.get("type") == "map")
        parts.append(f"rank {r}: {n} {hook} events")
    return ", ".join(parts) or "(nothing yet)"


def _tail(log) -> str:
    """What went wrong, from the job's output: the last error line (a rank's traceback
    ends in one; Open MPI's kill notice comes after it), else the last lines; the whole
    log is kept beside the temp files (named in the message)."""
    try:
        log.flush()
        log.seek(0)
        text = log.read()
    except (OSError, ValueError):
        return "no log"
    lines = [l.rstrip() for l in text.splitlines() if l.strip()]
    if not lines:
        return "no output"
    keep = Path(tempfile.gettempdir()) / f"dtrace_mk_demo_failed_{os.getpid()}.log"
    try:
        keep.write_text(text)
        where = f"; full log: {keep}"
    except OSError:
        where = ""
    errors = [l.strip() for l in lines if re.match(r"^\s*(\w+\.)*\w*(Error|Exception|Refused)\b|^\s*error:", l)
              or "Error:" in l]
    if errors:
        return f"first error: {errors[0]}" + (f" (last: {errors[-1]})" if errors[-1] != errors[0] else "") + where
    return "last output: " + " | ".join(lines[-3:]) + where
