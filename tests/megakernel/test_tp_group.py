"""TPGroup's device choice and CUDA IPC handle exchange, with a stand-in for CuPy's
runtime and an in-process communicator (the real thing runs in tests/gpu/test_tp.py)."""
import sys
import threading
import types

import pytest

from dtrace_mk.errors import UserError


class FakeRuntime:
    def __init__(self, n_dev):
        self.n_dev, self.opened, self.closed = n_dev, [], []

    def getDeviceCount(self):
        return self.n_dev

    def ipcGetMemHandle(self, p):
        return b"H" + p.to_bytes(8, "little")

    def ipcOpenMemHandle(self, h):
        self.opened.append(h)
        return 0x7000_0000_0000 + int.from_bytes(h[1:], "little")   # "mapped" address

    def ipcCloseMemHandle(self, p):
        self.closed.append(p)


class Comm:
    """allgather / Barrier between threads (one per rank)."""
    def __init__(self, shared, rank):
        self.s, self.rank = shared, rank

    def Get_rank(self):
        return self.rank

    def Get_size(self):
        return self.s["size"]

    def allgather(self, x):
        self.s["slots"][self.rank] = x
        self.s["bar"].wait()
        out = list(self.s["slots"])
        self.s["bar"].wait()
        return out

    def Barrier(self):
        self.s["bar"].wait()


@pytest.fixture()
def fake_cupy(monkeypatch):
    rt = FakeRuntime(2)
    used = []
    dev = types.SimpleNamespace(use=lambda: None)
    cuda = types.SimpleNamespace(runtime=rt, Device=lambda i: (used.append(i), dev)[1])
    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(cuda=cuda))
    return rt, used


def _run_ranks(n, fn):
    shared = {"size": n, "slots": [None] * n, "bar": threading.Barrier(n, timeout=10)}
    out, errs = [None] * n, []

    def body(r):
        try:
            out[r] = fn(Comm(shared, r))
        except Exception as e:  # noqa: BLE001
            errs.append(e)
            shared["bar"].abort()
    th = [threading.Thread(target=body, args=(r,)) for r in range(n)]
    for t in th:
        t.start()
    for t in th:
        t.join()
    return out, errs


def test_group_of_one_without_mpi(fake_cupy):
    from dtrace_mk.megakernel.tp import TPGroup
    g = TPGroup(None)
    assert (g.rank, g.ranks, g.device) == (0, 1, 0)
    assert g.exchange([0x10, 0x20]) == [[0x10, 0x20]]
    g.barrier()


def test_exchange_maps_every_peer_and_keeps_own_pointers(fake_cupy):
    from dtrace_mk.megakernel.tp import TPGroup
    rt, used = fake_cupy

    def rank(comm):
        g = TPGroup(comm)
        base = 0x1000 * (comm.rank + 1)
        return g.device, g.exchange([base, base + 8])
    out, errs = _run_ranks(2, rank)
    assert not errs, errs
    assert sorted(d for d, _ in out) == [0, 1] and sorted(used) == [0, 1]
    for r, (_, ptrs) in enumerate(out):
        assert ptrs[r] == [0x1000 * (r + 1), 0x1000 * (r + 1) + 8]          # own: as given
        q = 1 - r
        assert ptrs[q] == [0x7000_0000_0000 + 0x1000 * (q + 1), 0x7000_0000_0000 + 0x1000 * (q + 1) + 8]
    assert len(rt.opened) == 4                                             # 2 handles per peer


def test_two_ranks_on_one_gpu_are_refused(fake_cupy):
    from dtrace_mk.megakernel.tp import TPGroup
    rt, _ = fake_cupy
    rt.n_dev = 1
    out, errs = _run_ranks(2, lambda comm: TPGroup(comm))
    users = [e for e in errs if isinstance(e, UserError)]
    assert users and all(isinstance(e, (UserError, threading.BrokenBarrierError)) for e in errs)
    assert "own GPU" in str(users[0])


def test_mismatched_registrations_are_named(fake_cupy):
    from dtrace_mk.megakernel.tp import TPGroup

    def rank(comm):
        g = TPGroup(comm)
        return g.exchange([0x10] * (1 + comm.rank))
    out, errs = _run_ranks(2, rank)
    assert any("registered" in str(e) for e in errs)
