"""The job's collector: the MPMD process `dtrace-mk launch` starts beside the serving ranks.

    mpiexec -n N SERVING-COMMAND : -n 1 python -m dtrace_mk.launch.collector --result R.json \\
        [--json-spans FILE] [--otlp URL] [--prometheus-port P] [--job-id ID]

It is the second MPI app (`MPI.APPNUM == 1`; `collectors.transport.roles`), receives
every serving rank's agent records (`collectors.transport.CollectorLoop`), serves live
Prometheus metrics while the job runs (`--prometheus-port`, 127.0.0.1), and when every
rank said BYE (or went silent) diagnoses (`collectors.diagnose`), writes the result and
its records (`exporters.save_result`: R.json + R.records.msgpack) and exports spans
(`exporters.export_result`: JSON lines, OTLP/HTTP).  A spool file beside the result
keeps every message, so a job that dies still leaves a partial result.

Sim ranks' clocks are simulated: their host clock starts near 0 at the job's start, so
the result's `wall_offset_ns` is the Unix time of the collector's start (spans land at
the time the job ran); GPU ranks use `time.monotonic_ns()` and the usual offset.
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from typing import List, Optional


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dtrace_mk.launch.collector")
    p.add_argument("--result", required=True)
    p.add_argument("--json-spans")
    p.add_argument("--otlp")
    p.add_argument("--prometheus-port", type=int)
    p.add_argument("--job-id", default="local")
    p.add_argument("--backend", default="sim")
    p.add_argument("--silence-timeout", type=float, default=300.0)
    p.add_argument("--quiet", action="store_true")
    a = p.parse_args(argv)
    wall0 = time.time_ns()
    from mpi4py import MPI
    from ..collectors import transport as T
    world = MPI.COMM_WORLD
    roles, sub = T.roles(world)

    def say(s: str) -> None:
        if not a.quiet:
            print(f"collector: {s}", file=sys.stderr, flush=True)

    if not roles.is_collector:       # extra processes of the collector app
        return 0
    # SIGINT/SIGTERM: keep collecting; the ranks stop at a step boundary and say BYE
    stop = {"n": 0}

    def on_signal(signum, frame):
        stop["n"] += 1
        if stop["n"] > 1:
            raise KeyboardInterrupt
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, on_signal)

    acc = T.CollectorSink(use_pingpongs=(a.backend == "gpu"))
    sink = acc
    server = None
    if a.prometheus_port is not None:
        from ..exporters import MetricsRecordSink, MetricsRegistry, MetricsServer, TeeRecordSink
        reg = MetricsRegistry()
        try:
            server = MetricsServer(reg, port=a.prometheus_port)
            say(f"metrics at {server.url}")
        except OSError as e:
            say(f"--prometheus-port {a.prometheus_port}: cannot listen ({e.strerror}); no live metrics")
        sink = TeeRecordSink(acc, MetricsRecordSink(reg))
    # spans go out per decode step while the job runs (exporters.stream); the end adds
    # the findings and whatever was not joined live
    wall_offset = wall0 if a.backend != "gpu" else time.time_ns() - time.monotonic_ns()
    exporters = []
    if a.json_spans:
        exporters.append(f"json={a.json_spans}")
    if a.otlp:
        exporters.append(f"otlp={a.otlp}" if a.otlp != "env" else "otlp")
    stream = None
    if exporters:
        from ..exporters import TeeRecordSink
        from ..exporters.stream import StepSpanStream
        try:
            stream = StepSpanStream(acc, exporters, ranks=roles.ranks, job_id=a.job_id,
                                    wall_offset_ns=wall_offset, warn=say)
            sink = TeeRecordSink(sink, stream)
        except Exception as e:      # a bad spec/file must not lose the diagnosis
            say(f"span export disabled: {e}")
    loop = T.CollectorLoop(T.MpiPort(world), list(range(roles.ranks)), sink,
                           silence_timeout_s=a.silence_timeout, progress=None,
                           spool=T.open_spool(a.result + ".spool"))
    t0 = time.monotonic()
    loop.run()
    loop.close()
    res = acc.result(None, ranks=roles.ranks)
    res["scenario"] = a.job_id
    res["job_id"] = a.job_id
    res["transport"].update(loop.report())
    if loop.notes:             # serve --monitor FILE: those queries' output, per rank
        from ..collectors.transport import monitors_output
        res["monitors"] = monitors_output(loop.notes)
    res["wall_offset_ns"] = wall_offset
    res["timing"] = {"collector_s": round(time.monotonic() - t0, 2)}
    res["telemetry"] = {"bytes": res["telemetry_bytes"], "records_lost": sum(acc.lost_records.values())}
    if server is not None:
        reg.observe_result(res)
    if stream is not None:
        try:
            rep = stream.finish(res, acc)
            res["export"] = rep
            for e in rep["exporters"]:
                where = e.get("path") or e.get("target")
                say(f"{rep['spans']} spans -> {e['kind']} {where} ({rep['live_spans']} while "
                    f"the job ran)" + (f" ({e.get('dropped', 0)} dropped)" if e.get("dropped") else ""))
        except Exception as e:      # an export failure must not lose the diagnosis
            res["export"] = {"error": str(e)}
            say(f"span export failed: {e}")
    from ..exporters import records_path_for, save_records, save_result
    save_records(records_path_for(a.result), acc)          # records first: the result's
    save_result(a.result + ".tmp", res)                     # appearance means both are there
    os.replace(a.result + ".tmp", a.result)
    try:
        os.unlink(a.result + ".spool")
    except OSError:
        pass
    if server is not None:
        server.close()
    say(f"diagnosis written ({len(res['findings'])} finding(s))")
    return 0


if __name__ == "__main__":
    sys.exit(main())
