"""End to end under real mpiexec (sim backend, 2 ranks + the collector): launch, list,
attach (streaming), a rejected query and a rejected object leave the job serving,
detach, Ctrl-C stops the job cleanly with a diagnosis, a finished job is reported.

Every wait is on a condition with a deadline (a line on a pipe, a status answer), never a
bare sleep."""
import os
import queue
import signal
import subprocess
import sys
import threading
import time

import pytest

from dtrace_mk.launch import jobs
from dtrace_mk.launch.control import ControlClient, ControlError

pytestmark = pytest.mark.mpi

QUERY = "comm:wait { @wait_us[comm.peer] = sum(comm.wait_ns / 1000); }"
EXIT_QUERY = "task:end { @n[rank] = count(); } task:end /rank == 1/ { exit(); }"
DEADLINE_S = 60


def _mpiexec_or_fail():
    from dtrace_mk.commands.diagnose import find_mpiexec
    find_mpiexec()          # UserError (a failure) when ./dev.sh was not run


class Proc:
    """A dtrace-mk subprocess whose output lines arrive on queues."""

    def __init__(self, *args, env):
        # SIGINT back to its default in the child: a test run started in the background of
        # a non-interactive shell (`./dev.sh test &`) inherits SIGINT ignored, and Python
        # then installs no KeyboardInterrupt handler, so the Ctrl-C this test sends would
        # be ignored (the job never stops; its ranks outlive the test)
        self.p = subprocess.Popen([sys.executable, "-m", "dtrace_mk", *args], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, env=env,
                                  preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        self.out, self.err = queue.Queue(), queue.Queue()
        self.lines = {"out": [], "err": []}
        for name, pipe, q in (("out", self.p.stdout, self.out), ("err", self.p.stderr, self.err)):
            threading.Thread(target=self._pump, args=(name, pipe, q), daemon=True).start()

    def _pump(self, name, pipe, q):
        for line in pipe:
            self.lines[name].append(line)
            q.put(line)
        q.put(None)

    def wait_line(self, pred, which="out", timeout=DEADLINE_S):
        q = self.out if which == "out" else self.err
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            assert left > 0, f"no matching line within {timeout} s; {which}: {''.join(self.lines[which])[-2000:]}"
            try:
                line = q.get(timeout=left)
            except queue.Empty:
                continue
            assert line is not None, f"stream ended; {which}: {''.join(self.lines[which])[-3000:]}"
            if pred(line):
                return line

    def finish(self, timeout=DEADLINE_S):
        rc = self.p.wait(timeout=timeout)
        deadline = time.monotonic() + 10
        for q in (self.out, self.err):      # drain to the end markers
            while time.monotonic() < deadline:
                try:
                    if q.get(timeout=1) is None:
                        break
                except queue.Empty:
                    continue
        return rc, "".join(self.lines["out"]), "".join(self.lines["err"])


def _run(*args, env):
    return subprocess.run([sys.executable, "-m", "dtrace_mk", *args], capture_output=True, text=True,
                          env=env, timeout=DEADLINE_S)


def _status_until(job, pred, timeout=DEADLINE_S):
    deadline = time.monotonic() + timeout
    while True:
        st = ControlClient(job).status()
        if pred(st):
            return st
        assert time.monotonic() < deadline, f"status never matched: {st}"
        time.sleep(0.05)


def test_launch_attach_list_detach_stop(runtime_dir, tmp_path):
    launch_attach_list_detach_stop(runtime_dir, tmp_path, "sim")


def launch_attach_list_detach_stop(runtime_dir, tmp_path, backend: str):
    """The second-terminal workflow on `backend` (sim here; tests/gpu/test_launch_attach_gpu.py
    runs it on 2 GPU ranks)."""
    _mpiexec_or_fail()
    env = dict(os.environ, DTRACE_MK_RUNTIME_DIR=runtime_dir)
    spans = tmp_path / "spans.jsonl"
    launch = Proc("launch", "-n", "2", "--backend", backend, "--json-spans", str(spans),
                  "--prometheus-port", "0", "--",
                  "python", "-m", "dtrace_mk.launch.serve", "--model", "tiny", "--duration", "120",
                  "--progress-s", "100",
                  "--fault", "late_comm:rank=1,steps=4-100000,comm_op=allreduce_attn,delay_us=200",
                  env=env)
    try:
        jid = launch.wait_line(lambda l: l.startswith("job ")).split()[1]
        url = launch.wait_line(lambda l: "metrics at http" in l, which="err").split()[-1]
        launch.wait_line(lambda l: "is serving" in l, which="err")
        job = jobs.find_job(jid)
        # list: the job is running
        r = _run("list", env=env)
        assert r.returncode == 0 and f"{jid}  running  2 rank(s)" in r.stdout, r.stdout + r.stderr

        # a query the compiler rejects: one clear message, exit 1, nothing sent
        r = _run("attach", "--job", jid, "-e", "task:end { @x = count(task.nosuch); }", env=env)
        assert r.returncode == 1 and "error" in r.stderr and "Traceback" not in r.stderr, r.stderr
        # an object the job rejects (bypassing the client's checks): refused, job untouched
        with pytest.raises(ControlError, match="rejected"):
            ControlClient(job).attach(b"\x7fELF not an object", "bad.o", "", stream=False)
        st0 = ControlClient(job).status()
        assert st0["attachments"] == []

        # attach, streaming
        att = Proc("attach", "--job", jid, "-e", QUERY, "--interval", "0.2", env=env)
        att.wait_line(lambda l: "attached query 1" in l, which="err")
        att.wait_line(lambda l: l.startswith("@wait_us[1]:"))         # rank 0 waits on rank 1
        att.wait_line(lambda l: l.startswith("coverage @wait_us: eligible"))
        st = _status_until(job, lambda s: s["step"] > st0["step"] and s["attachments"])
        assert st["attachments"][0]["id"] == 1 and st["attachments"][0]["subscribers"] == 1
        r = _run("list", "--job", jid, env=env)
        assert "query 1: <query> attached at step" in r.stdout and QUERY in r.stdout, r.stdout

        # detach from another process: the streaming client gets the final maps and ends
        r = _run("detach", "--job", jid, "--id", "1", env=env)
        assert r.returncode == 0 and "query 1 of job" in r.stdout, r.stdout + r.stderr
        rc, out, err = att.finish()
        assert rc == 0, err
        assert "(final; attached at step" in out and "query 1: detached" in err
        r = _run("detach", "--job", jid, "--id", "1", env=env)
        assert r.returncode == 2 and "no attached query 1" in r.stderr
        _status_until(job, lambda s: not s["attachments"])

        # Ctrl-C on an attached client: it detaches and prints the final maps (here as one
        # view of both ranks: --merge)
        att = Proc("attach", "--job", jid, "-e", QUERY, "--interval", "0.2", "--merge", env=env)
        att.wait_line(lambda l: l.startswith("coverage @wait_us: eligible"))
        att.p.send_signal(signal.SIGINT)
        rc, out, err = att.finish()
        assert rc == 0 and "detaching query 2" in err, err
        assert "merged (final; step" in out and "-- query 2 rank " not in out, out
        _status_until(job, lambda s: not s["attachments"])

        # exit() on one rank ends the query on every rank: rank 1 exits at its first
        # task:end, rank 0 keeps counting until the detach it is sent applies (on GPU ranks
        # the query runs in the device VM: the host reads its exit map once a step)
        att = Proc("attach", "--job", jid, "-e", EXIT_QUERY, "--interval", "30", env=env)
        rc, out, err = att.finish()
        assert rc == 0 and "query 3: exit() on rank 1 at step" in err, err
        finals = [l for l in out.splitlines() if l.startswith("-- query 3 rank ")]
        assert len(finals) == 2 and all("(final; attached at step" in l for l in finals), out
        assert any(l.startswith("@n[0]: ") for l in out.splitlines()), out
        _status_until(job, lambda s: not s["attachments"])

        # live metrics from the collector while the job runs
        import urllib.request
        deadline = time.monotonic() + DEADLINE_S
        while True:
            body = urllib.request.urlopen(url, timeout=5).read().decode()
            if 'dtrace_mk_epochs_total{rank="1"}' in body and 'dtrace_mk_epochs_total{rank="0"}' in body:
                break
            assert time.monotonic() < deadline, body[-2000:]
            time.sleep(0.1)
        assert 'dtrace_mk_remote_wait_seconds_count{' in body

        # Ctrl-C: the job stops at a step boundary, the collector diagnoses and exports
        launch.p.send_signal(signal.SIGINT)
        rc, out, err = launch.finish()
        assert rc == 0, err[-3000:]
        assert "remote_stall rooted at rank 1" in out, out + err[-2000:]
        assert f"-> json {spans}" in out
        assert spans.is_file() and '"links":[{' in spans.read_text()
        assert not job.dir.exists()                                     # cleaned up
    finally:
        if launch.p.poll() is None:
            launch.p.kill()
    # the job is gone: attach says so in one line, exit 2
    r = _run("attach", "--job", jid, "-e", QUERY, env=env)
    assert r.returncode == 2 and f"job {jid}: no such job" in r.stderr and "Traceback" not in r.stderr
    r = _run("list", env=env)
    assert r.stdout.strip() == "no jobs"


def test_dead_job_is_reported_and_pruned(runtime_dir):
    env = dict(os.environ, DTRACE_MK_RUNTIME_DIR=runtime_dir)
    job = jobs.new_job(2)                    # a job whose processes died without cleaning up
    info = job.info()
    info["launcher_pid"] = 2 ** 22 + 4321
    (job.dir / jobs.INFO_NAME).write_text(__import__("json").dumps(info))
    r = _run("attach", "--job", job.id, "-e", QUERY, env=env)
    assert r.returncode == 2 and f"job {job.id}: not running" in r.stderr, r.stderr
    r = _run("list", env=env)
    assert f"{job.id}  not running" in r.stdout
    r = _run("list", "--prune", env=env)
    assert f"removed dead job {job.id}" in r.stdout and not job.dir.exists()


def test_a_failing_rank_ends_the_job_with_its_exit_status(runtime_dir):
    _mpiexec_or_fail()
    env = dict(os.environ, DTRACE_MK_RUNTIME_DIR=runtime_dir)
    r = _run("launch", "-n", "2", "--", "python", "-m", "dtrace_mk.launch.serve",
             "--fault", "late_comm:rank=3,steps=1,comm_op=allreduce_attn,delay_us=5", env=env)
    assert r.returncode == 2, r.stderr[-2000:]
    assert "faults[0] (late_comm): rank must be an integer in 0..1, got 3" in r.stderr
    assert "no diagnosis" in r.stderr and "Traceback" not in r.stderr
    assert os.listdir(runtime_dir) == []                     # the job's directory is gone
