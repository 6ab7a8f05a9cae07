"""`dtrace-mk launch`: Ctrl-C at any time after the job started stops it gracefully (a
control stop: ranks end at a step boundary and the collector diagnoses), also while
the launcher still waits for the job's control socket -- session 9's CI run under load
caught an exit status 130 (killed) from a Ctrl-C that landed in that wait."""
import argparse

import pytest

from dtrace_mk.commands import launch as L


class FakeJob:
    def __init__(self, interrupt_in):
        self.interrupt_in = interrupt_in
        self.calls = []
        self.job = argparse.Namespace(id="jtest", result_path="/nonexistent/result.json")
        self.argv = ["mpiexec", "-n", "1", "serve"]

    def _maybe(self, where):
        self.calls.append(where)
        if where == self.interrupt_in:
            raise KeyboardInterrupt

    def wait_ready(self, deadline):
        self._maybe("wait_ready")
        return True

    def running(self):
        return "stop" not in self.calls and "kill" not in self.calls

    def wait(self):
        self._maybe("wait")
        return 0

    def stop(self, say=lambda s: None):
        self.calls.append("stop")
        return 0

    def kill(self):
        self.calls.append("kill")

    def result(self):
        return None

    def cleanup(self):
        self.calls.append("cleanup")


@pytest.mark.parametrize("interrupt_in", ["wait_ready", "wait"])
def test_ctrl_c_stops_the_job_gracefully(interrupt_in):
    job = FakeJob(interrupt_in)
    args = argparse.Namespace(ranks=1, backend="sim", otlp=None, json_spans=None, prometheus_port=None,
                              quiet=True, ready_timeout=1.0, out=None)
    said = []
    rc = L._run(args, ["serve"], said.append, lambda *a, **k: job)
    assert rc == 0 and "stop" in job.calls and "kill" not in job.calls, (job.calls, said)
    assert any("stopping job jtest" in s for s in said)
