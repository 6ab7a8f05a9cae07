"""The job registry: where a running job's control socket and token live.

    job = new_job(ranks=2, command=[...])      # the launcher (or a standalone server)
    job.dir, job.socket_path, job.token
    find_job("j3f9a1c")                        # attach / detach / list
    list_jobs()

Layout (owner-only; checked, never trusted blindly):

    $DTRACE_MK_RUNTIME_DIR  or  $XDG_RUNTIME_DIR/dtrace_mk  or  /tmp/dtrace_mk-$UID     (0700)
      <job id>/                 0700
        control.sock            0600   Unix stream socket, served by serving rank 0
        token                   0600   32 random bytes (hex); every request carries it
        job.json                0600   {"id", "ranks", "command", "backend", "launcher_pid", "started"}
        result.json             the collector's diagnosis when the job ended (launcher reads it)

A directory that is not ours or is group/other accessible is refused with a message
naming it (someone else could read the token or swap the socket).  Job ids are
`j` + 8 hex digits from `secrets`; a job's directory is removed by whoever created it
when the job ends (the launcher), so a directory whose socket refuses connections is a
job that died without cleaning up: `list` says so and `prune` removes it.
"""
from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import socket
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from ..errors import UserError

ENV_RUNTIME_DIR = "DTRACE_MK_RUNTIME_DIR"
ENV_JOB_DIR = "DTRACE_MK_JOB_DIR"          # set by the launcher for the job's processes
JOB_ID_RE = re.compile(r"^j[0-9a-f]{8}$")
SOCKET_NAME = "control.sock"
TOKEN_NAME = "token"
INFO_NAME = "job.json"
RESULT_NAME = "result.json"


class JobError(UserError):
    """A job that does not exist, is not running, or whose files are unsafe."""


def runtime_dir(create: bool = True) -> Path:
    """The registry's base directory (created 0700 when missing; refused when unsafe)."""
    env = os.environ.get(ENV_RUNTIME_DIR)
    if env:
        base = Path(env)
    elif os.environ.get("XDG_RUNTIME_DIR") and Path(os.environ["XDG_RUNTIME_DIR"]).is_dir():
        base = Path(os.environ["XDG_RUNTIME_DIR"]) / "dtrace_mk"
    else:
        base = Path("/tmp") / f"dtrace_mk-{os.getuid()}"
    if create and not base.exists():
        base.mkdir(mode=0o700, parents=True, exist_ok=True)
    if base.exists():
        check_private_dir(base)
    return base


def check_private_dir(path: Path) -> None:
    """Refuse a directory that is a symlink, not ours, or open to group/other."""
    try:
        st = os.lstat(path)
    except OSError as e:
        raise JobError(f"{path}: cannot stat ({e.strerror})") from None
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise JobError(f"{path}: expected a directory, found a link or a file (refused)")
    if st.st_uid != os.getuid():
        raise JobError(f"{path}: owned by uid {st.st_uid}, not you (uid {os.getuid()}); refused")
    if st.st_mode & 0o077:
        raise JobError(f"{path}: mode {stat.S_IMODE(st.st_mode):04o} lets others in; expected 0700 "
                       f"(chmod 700 {path})")


def _private_file(path: Path) -> None:
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise JobError(f"{path}: not a private file of yours (mode {stat.S_IMODE(st.st_mode):04o}, "
                       f"uid {st.st_uid}); refused")


@dataclass
class Job:
    id: str
    dir: Path

    @property
    def socket_path(self) -> Path:
        return self.dir / SOCKET_NAME

    @property
    def token_path(self) -> Path:
        return self.dir / TOKEN_NAME

    @property
    def result_path(self) -> Path:
        return self.dir / RESULT_NAME

    @property
    def token(self) -> str:
        """The job's token (the file must be private: 0600, ours)."""
        try:
            _private_file(self.token_path)
            return self.token_path.read_text().strip()
        except FileNotFoundError:
            raise JobError(f"job {self.id}: no token file ({self.token_path}); the job is not "
                           f"running") from None
        except OSError as e:
            raise JobError(f"{self.token_path}: cannot read ({e.strerror})") from None

    def info(self) -> Dict[str, Any]:
        try:
            return json.loads((self.dir / INFO_NAME).read_text())
        except (OSError, ValueError):
            return {"id": self.id}

    def alive(self, timeout_s: float = 1.0) -> bool:
        """True when something accepts connections on the control socket."""
        if not self.socket_path.exists():
            return False
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(timeout_s)
        try:
            s.connect(str(self.socket_path))
            return True
        except OSError:
            return False
        finally:
            s.close()

    def remove(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)


def new_job(ranks: int = 1, command: Sequence[str] = (), backend: str = "", **info: Any) -> Job:
    """Create a job directory with a fresh id and token."""
    base = runtime_dir()
    for _ in range(16):
        jid = "j" + secrets.token_hex(4)
        d = base / jid
        try:
            d.mkdir(mode=0o700)
        except FileExistsError:
            continue
        os.chmod(d, 0o700)            # whatever the umask
        _write_private(d / TOKEN_NAME, secrets.token_hex(32) + "\n")
        doc = {"id": jid, "ranks": ranks, "command": list(command), "backend": backend,
               "launcher_pid": os.getpid(), "started": time.time(), **info}
        _write_private(d / INFO_NAME, json.dumps(doc))
        return Job(jid, d)
    raise JobError(f"{base}: could not pick a free job id")


def job_from_dir(path: str) -> Job:
    d = Path(path)
    check_private_dir(d)
    return Job(d.name, d)


def find_job(job_id: Optional[str]) -> Job:
    """The job named `job_id`; with None, the only running job (an error when there are
    none or several)."""
    if job_id is None:
        live = [j for j in list_jobs() if j.alive()]
        if len(live) == 1:
            return live[0]
        if not live:
            raise JobError("no running job (start one with dtrace-mk launch)")
        raise JobError(f"{len(live)} running jobs ({', '.join(j.id for j in live)}); pick one with --job")
    if not JOB_ID_RE.match(job_id):
        raise JobError(f"--job {job_id!r}: not a job id (they look like j3f9a1c02; see dtrace-mk list)")
    d = runtime_dir(create=False) / job_id
    if not d.is_dir():
        raise JobError(f"job {job_id}: no such job (dtrace-mk list shows the running ones)")
    check_private_dir(d)
    return Job(job_id, d)


def list_jobs() -> List[Job]:
    base = runtime_dir(create=False)
    if not base.is_dir():
        return []
    out = []
    for d in sorted(base.iterdir()):
        if JOB_ID_RE.match(d.name) and d.is_dir():
            out.append(Job(d.name, d))
    return out


def prune() -> List[str]:
    """Remove the directories of jobs that died without cleaning up; their ids."""
    gone = []
    for j in list_jobs():
        pid = j.info().get("launcher_pid")
        if not j.alive() and not (isinstance(pid, int) and _pid_alive(pid)):
            j.remove()
            gone.append(j.id)
    return gone


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
