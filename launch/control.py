"""The control socket: attach, detach, list and stop a running job from another terminal.

Served by serving rank 0 (`api.ServingHost`) on the job's Unix socket
(`jobs.Job.socket_path`, directory 0700, socket 0600).  Protocol: newline-delimited
JSON, one request per connection, then replies on the same connection.

Request (client -> server, one line):

    {"v": 1, "token": "<hex>", "op": "status" | "attach" | "detach" | "stop", ...}

    attach  "object": base64 of the ELF object (compiled and verified by the client),
            "name": the query's file or "<query>", "text": its source (shown by list),
            "stream": true|false (stay connected and receive its output),
            "interval_s": seconds between outputs (default 1)
    detach  "id": attachment id

Replies (server -> client, one JSON object per line):

    {"ok": false, "error": "one line"}                     refused; nothing changed
    {"ok": true, "op": "status", "job": {...}, "step": S, "attachments": [...]}
    {"ok": true, "op": "attach", "id": N, "apply_at": S}   then, when streaming:
    {"type": "output", "id": N, "seq": i, "final": bool, "ranks": {"0": {"step": S,
      "attached_at": S0, "blocks": [printing blocks]}, ...}}
    {"type": "end", "id": N, "reason": "detached" | "job ended" | ...}
    {"ok": true, "op": "detach", "id": N, "apply_at": S}
    {"ok": true, "op": "stop", "at_step": S}

Checks on every request, before anything else: the peer's uid (SO_PEERCRED) is ours,
the token matches (constant-time compare), the request is one JSON line of at most
`MAX_REQUEST` bytes.  Attach objects are loaded and verified again here (the client's
verification is for its messages; the server never trusts it) before anything is
broadcast, so a rejected program leaves the job untouched.

Threading: the server runs an accept thread and one thread per connection; they never
touch the serving state.  Requests that change it go through `requests` (a queue the
serving loop drains at its own pace with `ServingHost.poll`); the connection thread
waits for the answer (bounded: `reply_timeout_s`).  Output reaches streaming clients
through `publish` / `end` (called by the serving thread; they only put into queues).
"""
from __future__ import annotations

import base64
import hmac
import json
import os
import queue
import select
import socket
import struct
import threading
import time
from typing import Any, Callable, Dict, Iterator, List, Optional

from ..errors import UserError
from .jobs import Job

PROTOCOL = 1
MAX_REQUEST = 4 << 20
REPLY_TIMEOUT_S = 15.0


class ControlError(UserError):
    """A refused request or an unreachable job (one line)."""


# ------------------------------------------------------------------------------ server

class Request:
    """A request for the serving thread; `answer(dict)` wakes the connection thread."""

    def __init__(self, op: str, body: Dict[str, Any], obj=None):
        self.op, self.body, self.obj = op, body, obj
        self._q: "queue.Queue[Dict[str, Any]]" = queue.Queue(1)

    def answer(self, reply: Dict[str, Any]) -> None:
        try:
            self._q.put_nowait(reply)
        except queue.Full:
            pass

    def wait(self, timeout_s: float) -> Optional[Dict[str, Any]]:
        try:
            return self._q.get(timeout=timeout_s)
        except queue.Empty:
            return None


class ControlServer:
    """`validate(obj_bytes) -> BpfObject` (raises UserError) runs on the connection
    thread; everything else goes to the serving thread through `requests`."""

    def __init__(self, job: Job, validate: Callable[[bytes, str], Any],
                 reply_timeout_s: float = REPLY_TIMEOUT_S):
        self.job = job
        self.token = job.token.encode()
        self.validate = validate
        self.reply_timeout_s = reply_timeout_s
        self.requests: "queue.Queue[Request]" = queue.Queue()
        self._subs: Dict[int, List["queue.Queue[Optional[Dict[str, Any]]]"]] = {}
        self._lock = threading.Lock()
        self._closed = threading.Event()
        path = str(job.socket_path)
        if os.path.exists(path):
            os.unlink(path)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)          # the socket is created 0600
        try:
            self.sock.bind(path)
        finally:
            os.umask(old)
        os.chmod(path, 0o600)
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self._thread = threading.Thread(target=self._accept, name="dtmk-control", daemon=True)
        self._thread.start()

    # -- the serving thread's side ---------------------------------------------------------
    def publish(self, aid: int, msg: Dict[str, Any]) -> None:
        with self._lock:
            for q in self._subs.get(aid, ()):
                q.put(msg)

    def end(self, aid: int, reason: str) -> None:
        with self._lock:
            for q in self._subs.pop(aid, ()):
                q.put({"type": "end", "id": aid, "reason": reason})
                q.put(None)

    def subscribers(self, aid: int) -> int:
        with self._lock:
            return len(self._subs.get(aid, ()))

    def close(self, reason: str = "job ended") -> None:
        with self._lock:
            ids = list(self._subs)
        for aid in ids:
            self.end(aid, reason)
        self._closed.set()
        try:
            self.sock.close()
        except OSError:
            pass
        try:
            os.unlink(str(self.job.socket_path))
        except OSError:
            pass
        self._thread.join(timeout=2.0)

    # -- connection threads --------------------------------------------------------------
    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = self.sock.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), name="dtmk-control-conn",
                             daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            conn.settimeout(10.0)
            try:
                self._handle(conn)
            except (OSError, ValueError):
                pass
        finally:
            try:
                conn.close()
            except OSError:
                pass

    def _refuse(self, conn: socket.socket, msg: str) -> None:
        _send(conn, {"ok": False, "error": msg})

    def _handle(self, conn: socket.socket) -> None:
        uid = _peer_uid(conn)
        if uid is not None and uid != os.getuid():
            self._refuse(conn, f"peer uid {uid} is not the job's owner")
            return
        line = _read_line(conn, MAX_REQUEST)
        if line is None:
            self._refuse(conn, f"request: expected one JSON line of at most {MAX_REQUEST} bytes")
            return
        try:
            req = json.loads(line)
            if not isinstance(req, dict):
                raise ValueError("not an object")
        except ValueError:
            self._refuse(conn, "request: not a JSON object")
            return
        tok = req.get("token")
        if not isinstance(tok, str) or not hmac.compare_digest(tok.encode(), self.token):
            self._refuse(conn, "bad token (read it from the job's token file; only its owner can)")
            return
        if req.get("v") != PROTOCOL:
            self._refuse(conn, f"protocol version {req.get('v')!r}: this job speaks {PROTOCOL}")
            return
        op = req.get("op")
        if op not in ("status", "attach", "detach", "stop"):
            self._refuse(conn, f"unknown op {op!r} (status, attach, detach, stop)")
            return
        obj = None
        if op == "attach":
            try:
                raw = base64.b64decode(req.get("object") or "", validate=True)
                obj = self.validate(raw, str(req.get("name") or "<query>"))
            except UserError as e:
                self._refuse(conn, f"rejected: {e}")
                return
            except ValueError:
                self._refuse(conn, "attach: 'object' is not base64")
                return
        elif op == "detach" and not isinstance(req.get("id"), int):
            self._refuse(conn, "detach: 'id' must be an integer")
            return
        r = Request(op, req, obj)
        sub: Optional["queue.Queue[Optional[Dict[str, Any]]]"] = None
        self.requests.put(r)
        reply = r.wait(self.reply_timeout_s)
        if reply is None:
            self._refuse(conn, f"the job did not answer within {self.reply_timeout_s:g} s "
                               f"(serving loop busy or ending)")
            return
        if op == "attach" and reply.get("ok") and req.get("stream"):
            sub = queue.Queue()
            with self._lock:
                self._subs.setdefault(reply["id"], []).append(sub)
        _send(conn, reply)
        if sub is not None:
            self._stream(conn, sub, reply["id"])

    def _stream(self, conn: socket.socket, sub, aid: int) -> None:
        conn.settimeout(10.0)
        while True:
            try:
                msg = sub.get(timeout=0.2)
            except queue.Empty:
                if _peer_closed(conn):      # the client went away (Ctrl-C): detach
                    with self._lock:
                        subs = self._subs.get(aid, [])
                        if sub in subs:
                            subs.remove(sub)
                    if not self._closed.is_set():
                        self.requests.put(Request("detach", {"id": aid, "why": "client left"}))
                    return
                continue
            if msg is None:
                return
            _send(conn, msg)


def _peer_uid(conn: socket.socket) -> Optional[int]:
    so = getattr(socket, "SO_PEERCRED", None)
    if so is None:
        return None
    try:
        creds = conn.getsockopt(socket.SOL_SOCKET, so, struct.calcsize("3i"))
        return struct.unpack("3i", creds)[1]
    except OSError:
        return None


def _peer_closed(conn: socket.socket) -> bool:
    try:
        r, _, _ = select.select([conn], [], [], 0)
        if not r:
            return False
        return conn.recv(1, socket.MSG_PEEK) == b""
    except OSError:
        return True


def _read_line(conn: socket.socket, limit: int) -> Optional[bytes]:
    buf = bytearray()
    while True:
        i = buf.find(b"\n")
        if i >= 0:
            return bytes(buf[:i])
        if len(buf) > limit:
            return None
        chunk = conn.recv(65536)
        if not chunk:
            return bytes(buf) if buf else None
        buf += chunk


def _send(conn: socket.socket, msg: Dict[str, Any]) -> None:
    conn.sendall(json.dumps(msg, separators=(",", ":")).encode() + b"\n")


# ------------------------------------------------------------------------------ client

class ControlClient:
    """Talks to one job.  Every call opens a connection; errors are ControlError with one
    line naming the job."""

    def __init__(self, job: Job, connect_timeout_s: float = 5.0):
        self.job = job
        self.connect_timeout_s = connect_timeout_s

    def _open(self, body: Dict[str, Any]) -> socket.socket:
        path = str(self.job.socket_path)
        token = self.job.token
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(self.connect_timeout_s)
        try:
            s.connect(path)
        except FileNotFoundError:
            s.close()
            raise ControlError(f"job {self.job.id}: not running (no control socket)") from None
        except OSError as e:
            s.close()
            raise ControlError(f"job {self.job.id}: not running (control socket refuses "
                               f"connections: {e.strerror or e})") from None
        try:
            _send(s, {"v": PROTOCOL, "token": token, **body})
        except OSError as e:
            s.close()
            raise ControlError(f"job {self.job.id}: connection lost ({e.strerror or e})") from None
        return s

    def _lines(self, s: socket.socket, timeout_s: Optional[float]) -> Iterator[Dict[str, Any]]:
        s.settimeout(timeout_s)
        buf = bytearray()
        while True:
            i = buf.find(b"\n")
            if i >= 0:
                line, buf = bytes(buf[:i]), buf[i + 1:]
                yield json.loads(line)
                continue
            try:
                chunk = s.recv(65536)
            except socket.timeout:
                raise ControlError(f"job {self.job.id}: no answer within {timeout_s:g} s") from None
            except OSError as e:
                raise ControlError(f"job {self.job.id}: connection lost ({e.strerror or e})") from None
            if not chunk:
                return
            buf += chunk

    def request(self, body: Dict[str, Any], timeout_s: float = REPLY_TIMEOUT_S + 5) -> Dict[str, Any]:
        s = self._open(body)
        try:
            for msg in self._lines(s, timeout_s):
                return _checked(self.job, msg)
            raise ControlError(f"job {self.job.id}: closed the connection without an answer")
        finally:
            s.close()

    def status(self) -> Dict[str, Any]:
        return self.request({"op": "status"})

    def detach(self, aid: int) -> Dict[str, Any]:
        return self.request({"op": "detach", "id": aid})

    def stop(self) -> Dict[str, Any]:
        return self.request({"op": "stop"})

    def attach(self, obj_bytes: bytes, name: str, text: str, stream: bool = True,
               interval_s: float = 1.0):
        """Returns (reply, iterator of output/end messages or None).  Close the iterator
        (or exit the process) to detach a streamed query."""
        body = {"op": "attach", "object": base64.b64encode(obj_bytes).decode(), "name": name,
                "text": text, "stream": stream, "interval_s": interval_s}
        s = self._open(body)
        buf = bytearray()
        try:
            s.settimeout(REPLY_TIMEOUT_S + 5)
            while b"\n" not in buf:
                try:
                    chunk = s.recv(65536)
                except socket.timeout:
                    raise ControlError(f"job {self.job.id}: no answer within {REPLY_TIMEOUT_S + 5:g} s") from None
                except OSError as e:
                    raise ControlError(f"job {self.job.id}: connection lost ({e.strerror or e})") from None
                if not chunk:
                    raise ControlError(f"job {self.job.id}: closed the connection without an answer")
                buf += chunk
            i = buf.find(b"\n")
            reply = _checked(self.job, json.loads(bytes(buf[:i])))
        except (ControlError, ValueError):
            s.close()
            raise
        if not stream:
            s.close()
            return reply, None
        return reply, Stream(self.job, s, bytes(buf[i + 1:]))


class Stream:
    """The output/end messages of a streamed attach.  An iterator object (not a
    generator), so a KeyboardInterrupt while waiting leaves it usable: the caller can
    detach and keep reading the final maps.  Ends after the `end` message, or when the
    connection closes (`ended` stays False then: the job went away)."""

    def __init__(self, job: Job, sock: socket.socket, rest: bytes = b""):
        self.job, self.sock = job, sock
        self.buf = bytearray(rest)
        self.ended = False
        self.closed = False
        sock.settimeout(None)

    def __iter__(self) -> "Stream":
        return self

    def poll(self, timeout_s: float) -> Optional[Dict[str, Any]]:
        """The next message, or None when none came within timeout_s (the caller checks
        its own flags, e.g. a Ctrl-C, between polls: no exception ever interrupts a read
        halfway through a line).  Raises StopIteration once the connection is closed."""
        self.sock.settimeout(timeout_s)
        try:
            return next(self)
        except _PollTimeout:
            return None
        finally:
            if not self.closed:
                self.sock.settimeout(None)

    def __next__(self) -> Dict[str, Any]:
        while not self.closed:
            i = self.buf.find(b"\n")
            if i >= 0:
                line, self.buf = bytes(self.buf[:i]), self.buf[i + 1:]
                msg = json.loads(line)
                if msg.get("type") == "end":
                    self.ended = True
                    self.close()
                return msg
            try:
                chunk = self.sock.recv(65536)
            except socket.timeout:
                raise _PollTimeout() from None       # poll(): nothing yet, the buffer intact
            except OSError:
                chunk = b""
            if not chunk:
                self.close()
                break
            self.buf += chunk
        raise StopIteration

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            try:
                self.sock.close()
            except OSError:
                pass


class _PollTimeout(Exception):
    """Stream.poll's read timed out (internal)."""


def _checked(job: Job, msg: Dict[str, Any]) -> Dict[str, Any]:
    if not msg.get("ok"):
        raise ControlError(f"job {job.id}: {msg.get('error', 'refused')}")
    return msg


def wait_for_socket(job: Job, deadline: float, alive: Callable[[], bool] = lambda: True) -> bool:
    """Wait until the job's control socket accepts connections (True), the deadline
    passes or `alive()` turns False (False)."""
    nap = 0.01
    while time.monotonic() < deadline and alive():
        if job.alive(timeout_s=0.5):
            return True
        time.sleep(nap)
        nap = min(nap * 2, 0.2)
    return job.alive(timeout_s=0.5) if alive() else False
