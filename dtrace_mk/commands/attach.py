"""`dtrace-mk attach`: attach a query to a running job and stream its output.

    dtrace-mk attach --job j3f9a1c02 -e 'comm:wait { @wait_us[comm.peer] = sum(comm.wait_ns / 1000); }'
    dtrace-mk attach --job j3f9a1c02 slow_attn.d --interval 2
    dtrace-mk attach --job j3f9a1c02 monitor.o --no-stream      # prints the id, stays attached

The query is compiled and verified here first (a rejected program is reported with its
source line and never reaches the job), sent over the job's control socket (owner-only,
with the job's token), verified again by the job, broadcast to every rank and attached
at a step boundary.  Its maps stream back every --interval seconds, per rank, rendered
by the query's printing plan with coverage (eligible / executed / throttled / lost);
--merge shows one view of the job instead (each map combined across ranks).
Ctrl-C detaches it (and prints the final maps); `dtrace-mk detach` from elsewhere or the
job's end does too.  FILE may be query text or an ELF object compiled from a query.
"""
from __future__ import annotations

import argparse
import sys

from ..errors import UserError

NAME = "attach"
ORDER = 31
HELP = "attach a verified query to a running job and stream its output"
DESCRIPTION = __doc__.split("\n\n", 1)[1]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--job", metavar="ID", help="job id (dtrace-mk list; default: the only running job)")
    p.add_argument("-e", dest="expr", metavar="QUERY", help="the query text")
    p.add_argument("file", nargs="?", metavar="FILE", help="query file or compiled object")
    p.add_argument("--interval", type=float, default=1.0, metavar="S", help="seconds between outputs (default 1)")
    p.add_argument("--no-stream", action="store_true", help="attach, print the id and return")
    p.add_argument("-f", "--format", choices=("text", "json"), default="text")
    p.add_argument("--merge", action="store_true",
                   help="one view of the job: each map combined across ranks by its aggregation (count / sum "
                        "added, min / max, avg and stats from summed counts and sums, histograms bucket by "
                        "bucket), coverage summed; default: a block per rank")
    p.add_argument("--schema", metavar="S", help="task schema JSON (default: the standard classes)")


def compile_for_attach(expr, path, schema_path=None):
    """(ELF bytes, name, source text) of a verified query or object; raises UserError /
    Rejected (with the rendered diagnostic) before anything is sent."""
    from pathlib import Path
    from ..bpf.elfwrite import write_object
    from ..lang.pipeline import compile_query, load_query_source, schema_from
    if (expr is None) == (path is None):
        raise UserError("give either -e QUERY or FILE")
    if path is not None:
        try:
            head = Path(path).read_bytes()[:4]
        except OSError as e:
            raise UserError(f"{path}: cannot read ({e.strerror})") from None
        if head == b"\x7fELF":
            from ..launch.api import validate_object
            raw = Path(path).read_bytes()
            validate_object(raw, str(path))
            return raw, str(path), ""
    src = load_query_source(expr, path)
    res = compile_query(src.text, schema_from(schema_path), name=src.name)
    return write_object(res.obj), src.name, src.text


def run(args: argparse.Namespace) -> int:
    from ..launch import jobs
    from ..launch.api import render_output
    from ..launch.control import ControlClient, ControlError
    if args.interval <= 0:
        raise UserError(f"--interval: expected > 0, got {args.interval}")
    raw, name, text = compile_for_attach(args.expr, args.file, args.schema)
    job = jobs.find_job(args.job)
    client = ControlClient(job)
    reply, stream = client.attach(raw, name, text, stream=not args.no_stream, interval_s=args.interval)
    aid = reply["id"]
    if stream is None:
        print(f"query {aid} attached to job {job.id} at step {reply['apply_at']}")
        return 0
    print(f"attached query {aid} to job {job.id} at step {reply['apply_at']}; Ctrl-C detaches",
          file=sys.stderr, flush=True)
    # Ctrl-C only sets a flag (the handler never raises inside a socket read, where a
    # KeyboardInterrupt could drop half a line and leave the client waiting for ever);
    # the loop polls the stream and looks at the flag between messages
    import signal
    interrupts: list = []
    old_handler = signal.signal(signal.SIGINT, lambda *_: interrupts.append(1))
    detaching = False
    try:
        while True:
            if interrupts and not detaching:
                detaching = True
                try:                      # detach explicitly, then show the final maps
                    r = client.detach(aid)
                    print(f"detaching query {aid} at step {r['apply_at']} (Ctrl-C again to leave)",
                          file=sys.stderr, flush=True)
                except ControlError as e:
                    print(f"{e}", file=sys.stderr)
                    return 130
            elif len(interrupts) > 1:
                return 130
            try:
                msg = stream.poll(0.2)
            except StopIteration:
                raise ControlError(f"job {job.id}: connection lost (the job ended?)") from None
            if msg is None:
                continue
            t = msg.get("type")
            if t == "output":
                sys.stdout.write(render_output(msg, args.format, merge=args.merge))
                sys.stdout.flush()
            elif t == "error":
                print(f"query {aid}: rank {msg.get('rank')}: {msg.get('error')}", file=sys.stderr)
            elif t == "end":
                print(f"query {aid}: {msg.get('reason')}", file=sys.stderr)
                break
    finally:
        signal.signal(signal.SIGINT, old_handler)
    return 0
