"""The control socket without MPI: a stand-in serving thread answers the requests."""
import json
import os
import queue
import socket
import stat
import threading

import pytest

from dtrace_mk.bpf.elfwrite import write_object
from dtrace_mk.errors import UserError
from dtrace_mk.lang.pipeline import compile_query
from dtrace_mk.launch import jobs
from dtrace_mk.launch.api import validate_object
from dtrace_mk.launch.control import ControlClient, ControlError, ControlServer

QUERY = "task:end { @n[task.class] = count(); }"


class FakeServing:
    """Drains the server's requests on its own thread like ServingHost.poll does."""

    def __init__(self, server):
        self.server = server
        self.seen = []
        self.stop = threading.Event()
        self.t = threading.Thread(target=self.run, daemon=True)
        self.t.start()

    def run(self):
        while not self.stop.is_set():
            try:
                r = self.server.requests.get(timeout=0.05)
            except queue.Empty:
                continue
            self.seen.append((r.op, r.body.get("id"), r.body.get("why")))
            if r.op == "attach":
                r.answer({"ok": True, "op": "attach", "id": 7, "apply_at": 3})
            elif r.op == "detach":
                r.answer({"ok": True, "op": "detach", "id": r.body["id"], "apply_at": 4})
            else:
                r.answer({"ok": True, "op": r.op, "step": 5, "ranks": 2, "attachments": []})


@pytest.fixture
def served(runtime_dir):
    job = jobs.new_job(2)
    server = ControlServer(job, validate_object)
    fake = FakeServing(server)
    yield job, server, fake
    fake.stop.set()
    server.close()


def _obj():
    return write_object(compile_query(QUERY).obj)


def test_socket_is_owner_only_and_status_answers(served):
    job, server, _ = served
    assert stat.S_IMODE(os.stat(job.socket_path).st_mode) == 0o600
    assert ControlClient(job).status()["step"] == 5


def _raw(job, line: bytes):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(5)
    s.connect(str(job.socket_path))
    s.sendall(line)
    data = b""
    while not data.endswith(b"\n"):
        chunk = s.recv(4096)
        if not chunk:
            break
        data += chunk
    s.close()
    return json.loads(data)


def test_every_request_needs_the_token(served):
    job, _, fake = served
    r = _raw(job, json.dumps({"v": 1, "token": "0" * 64, "op": "status"}).encode() + b"\n")
    assert not r["ok"] and "bad token" in r["error"]
    r = _raw(job, json.dumps({"v": 1, "op": "stop"}).encode() + b"\n")
    assert not r["ok"] and "bad token" in r["error"]
    r = _raw(job, b"not json\n")
    assert not r["ok"] and "JSON" in r["error"]
    r = _raw(job, json.dumps({"v": 9, "token": job.token, "op": "status"}).encode() + b"\n")
    assert not r["ok"] and "protocol version" in r["error"]
    assert fake.seen == []                    # nothing reached the serving side


def test_rejected_object_never_reaches_the_job(served):
    job, _, fake = served
    with pytest.raises(ControlError, match="rejected"):
        ControlClient(job).attach(b"\x7fELF garbage", "bad.o", "", stream=False)
    with pytest.raises(ControlError, match="not base64"):
        _ = ControlClient(job).request({"op": "attach", "object": "%%%"})
    assert fake.seen == []


def test_attach_streams_until_end_and_leaving_detaches(served):
    job, server, fake = served
    reply, stream = ControlClient(job).attach(_obj(), "<query>", QUERY, stream=True)
    assert reply == {"ok": True, "op": "attach", "id": 7, "apply_at": 3}
    server.publish(7, {"type": "output", "id": 7, "seq": 1, "final": False, "ranks": {}})
    assert next(stream)["seq"] == 1
    server.end(7, "detached")
    assert next(stream) == {"type": "end", "id": 7, "reason": "detached"}
    # a second client that goes away: the server asks the serving side to detach
    reply, stream = ControlClient(job).attach(_obj(), "<query>", QUERY, stream=True)
    stream.close()                            # closes the socket
    deadline = __import__("time").monotonic() + 10
    while ("detach", 7, "client left") not in fake.seen and __import__("time").monotonic() < deadline:
        __import__("time").sleep(0.01)
    assert ("detach", 7, "client left") in fake.seen


def test_dead_job_is_reported(runtime_dir):
    job = jobs.new_job()
    with pytest.raises(ControlError, match="not running"):
        ControlClient(job).status()
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(job.socket_path))              # a socket file with nobody accepting
    s.close()
    with pytest.raises(ControlError, match="not running"):
        ControlClient(job).status()


def test_validate_object_checks_what_the_client_checked():
    obj = validate_object(_obj(), "q")
    assert [p.hook.name for p in obj.programs] == ["task:end"]
    with pytest.raises(UserError):
        validate_object(b"\x7fELF\x02\x01\x01", "cut.o")
