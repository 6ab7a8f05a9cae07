"""`dtrace-mk detach`: detach a live query from a running job.

    dtrace-mk detach --job j3f9a1c02 --id 2

Every rank detaches it at the next step boundary; a client streaming it gets the final
maps and ends.  `dtrace-mk list --job ID` shows the ids.
"""
from __future__ import annotations

import argparse

NAME = "detach"
ORDER = 32
HELP = "detach a live query from a running job"
DESCRIPTION = __doc__.split("\n\n", 1)[1]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--job", metavar="ID", help="job id (default: the only running job)")
    p.add_argument("--id", type=int, required=True, help="the query's id (dtrace-mk list)")


def run(args: argparse.Namespace) -> int:
    from ..launch import jobs
    from ..launch.control import ControlClient
    job = jobs.find_job(args.job)
    r = ControlClient(job).detach(args.id)
    print(f"query {r['id']} of job {job.id} detaches at step {r['apply_at']}")
    return 0
