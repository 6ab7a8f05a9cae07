"""`dtrace-mk list`: running jobs, or one job's live queries.

    dtrace-mk list                     every job of yours: id, ranks, step, queries
    dtrace-mk list --job j3f9a1c02     that job's attached queries (id, step, text)
    dtrace-mk list --prune             also remove jobs that died without cleaning up

A job whose control socket does not answer is listed as `not running`.
"""
from __future__ import annotations

import argparse
import json

NAME = "list"
ORDER = 33
HELP = "list running jobs and their live queries"
DESCRIPTION = __doc__.split("\n\n", 1)[1]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--job", metavar="ID", help="one job's details")
    p.add_argument("--prune", action="store_true", help="remove the directories of dead jobs")
    p.add_argument("-f", "--format", choices=("text", "json"), default="text")


def _status(job):
    from ..launch.control import ControlClient, ControlError
    from ..launch.jobs import JobError
    try:
        return ControlClient(job, connect_timeout_s=2.0).status(), None
    except (ControlError, JobError) as e:
        return None, str(e)


def run(args: argparse.Namespace) -> int:
    from ..launch import jobs
    from ..launch.control import ControlError
    if args.prune:
        for jid in jobs.prune():
            print(f"removed dead job {jid}")
    if args.job:
        job = jobs.find_job(args.job)
        st, err = _status(job)
        if st is None:
            raise ControlError(err)
        if args.format == "json":
            print(json.dumps(st, sort_keys=True))
            return 0
        info = st.get("job", {})
        serving = st.get("serving", {})
        print(f"job {job.id}: {st['ranks']} rank(s), step {st['step']}"
              + (", stopping" if st.get("stopping") else "")
              + (f", {serving.get('finished')} requests finished" if serving else "")
              + (f"  [{' '.join(info.get('command', []))}]" if info.get("command") else ""))
        if not st["attachments"]:
            print("  no live queries")
        for a in st["attachments"]:
            print(f"  query {a['id']}: {a['name']} attached at step {a['apply_at']}, "
                  f"{a['subscribers']} client(s){', detaching' if a['detaching'] else ''}")
            if a.get("text"):
                print(f"    {' '.join(a['text'].split())[:200]}")
        return 0
    rows = []
    for job in jobs.list_jobs():
        st, err = _status(job)
        rows.append({"id": job.id, "running": st is not None, "step": st and st["step"],
                     "ranks": st["ranks"] if st else job.info().get("ranks"),
                     "queries": len(st["attachments"]) if st else 0,
                     "command": job.info().get("command", []), "error": err})
    if args.format == "json":
        print(json.dumps(rows, sort_keys=True))
        return 0
    if not rows:
        print("no jobs")
    for r in rows:
        if r["running"]:
            print(f"{r['id']}  running  {r['ranks']} rank(s)  step {r['step']}  "
                  f"{r['queries']} live quer{'y' if r['queries'] == 1 else 'ies'}  {' '.join(r['command'])}")
        else:
            print(f"{r['id']}  not running ({r['error']}); dtrace-mk list --prune removes it")
    return 0
