"""gpu.Megakernel's tensor-parallel set-up on the CPU: a NumPy stand-in for CuPy and a
stand-in TPGroup (the same API as megakernel/tp.py) let the constructor, the parameter
block and the control words run without a GPU, so shapes, shards and the IPC table are
checked before any device time is spent (the kernel itself: tests/gpu/test_tp.py)."""
import sys
import types

import numpy as np
import pytest

from dtrace_mk.abi import definition as D
from dtrace_mk.megakernel import gpu
from dtrace_mk.megakernel import reference as R
from dtrace_mk.megakernel.presets import PRESETS


class FakeArr(np.ndarray):
    @property
    def data(self):
        return types.SimpleNamespace(ptr=self.__array_interface__["data"][0])

    def set(self, a):
        self[...] = a

    def get(self):
        return np.asarray(self)


def _w(a):
    return np.ascontiguousarray(a).view(FakeArr)


@pytest.fixture()
def fake_cupy(monkeypatch):
    dev = types.SimpleNamespace(attributes={"MultiProcessorCount": 16}, compute_capability="90", use=lambda: None)
    cp = types.SimpleNamespace(
        float32=np.float32, int32=np.int32, int64=np.int64, uint8=np.uint8, uint32=np.uint32, uint64=np.uint64,
        zeros=lambda shape, dtype=np.float64: _w(np.zeros(shape, dtype)),
        full=lambda shape, v, dtype=None: _w(np.full(shape, v, dtype)),
        asarray=lambda a, dtype=None: _w(np.asarray(a, dtype)),
        cuda=types.SimpleNamespace(Device=lambda *a: dev))
    monkeypatch.setitem(sys.modules, "cupy", cp)
    fn = types.SimpleNamespace(max_dynamic_shared_size_bytes=0)
    monkeypatch.setattr(gpu, "load_module", lambda *a, **k: types.SimpleNamespace(get_function=lambda n: fn))
    return cp


class FakeGroup:
    """megakernel.tp.TPGroup's interface, in one process."""
    def __init__(self, rank, ranks):
        self.rank, self.ranks, self.comm, self.barriers, self.exchanged = rank, ranks, None, 0, None

    def alloc_shared(self, shape, dtype):
        return _w(np.zeros(shape, dtype))

    def exchange(self, ptrs):
        self.exchanged = list(ptrs)
        return [list(ptrs) if q == self.rank else [0x1000 * (q + 1), 0x2000 * (q + 1)] for q in range(self.ranks)]

    def barrier(self):
        self.barriers += 1


@pytest.mark.parametrize("name", ["tiny", "small-moe"])
def test_tp_megakernel_builds_the_rank_share(fake_cupy, name):
    cfg = PRESETS[name]
    W = R.make_weights(cfg, 0)
    grp = FakeGroup(1, 2)
    mk = gpu.Megakernel(cfg, batch=2, weights=W, tp=grp)
    lc = R.tp_local_config(cfg, 1, 2)
    g = mk.graph
    assert (g.rank, g.ranks, mk.lcfg) == (1, 2, lc)
    # weights: this rank's shards of the full weights
    sh = R.shard_weights(cfg, W, 1, 2)
    for k in W:
        np.testing.assert_array_equal(np.asarray(mk.weights[k]), sh[k], err_msg=k)
    # buffers in the local shape; events: counters + last sender; receive slots per rank
    E = len(g.events)
    assert mk.buf["qkv"].shape == (cfg.n_layers, 2, lc.qkv_dim)
    assert mk.buf["k_cache"].shape[3] == lc.n_kv_heads and mk.buf["act"].shape[2] == lc.ffn
    assert mk._ev_all.shape == (2 * E,) and mk.buf["events"].shape == (E,)
    assert mk.buf["events"].data.ptr == mk._ev_all.data.ptr
    assert mk.buf["tp_recv"].shape == (2 * cfg.n_layers, 2, 2, cfg.hidden)
    assert grp.exchanged == [mk._ev_all.data.ptr, mk.buf["tp_recv"].data.ptr]
    peers = np.asarray(mk.tables["tp_peers"])
    assert peers.shape == (2, 2) and list(peers[1]) == grp.exchanged and list(peers[0]) == [0x1000, 0x2000]
    # the parameter block the kernel reads
    p = dict(zip(gpu.PARAM_FIELDS, (int(x) for x in np.asarray(mk._params(3, 3)))))
    assert p["rank"] == 1 and p["ranks"] == 2
    assert (p["n_heads"], p["n_kv_heads"], p["qkv_dim"], p["ffn"], p["expert_ffn"]) == \
        (lc.n_heads, lc.n_kv_heads, lc.qkv_dim, lc.ffn, lc.expert_ffn)
    assert p["hidden"] == cfg.hidden and p["vocab"] == cfg.vocab
    assert p["tp_peers"] == mk.tables["tp_peers"].data.ptr and p["tp_recv"] == mk.buf["tp_recv"].data.ptr
    assert p["tp_part"] == mk.buf["tp_part"].data.ptr and p["ev_comm_op"] == mk.tables["ev_comm_op"].data.ptr
    assert p["n_events"] == E and p["events"] == mk._ev_all.data.ptr
    np.testing.assert_array_equal(np.asarray(mk.tables["ev_comm_op"]), [e.comm_op for e in g.events])
    # hooks="all" adds the comm hooks only for ranks > 1
    mk._prepare("all", False, None, 2000, 16)
    m = int(np.asarray(mk.buf["control"])[gpu.CTL_HOOK_MASK])
    assert m & (1 << D.hook("comm:signal").id) and m & (1 << D.hook("comm:wait").id)
    # reset zeroes the last-sender words too
    mk._ev_all[:] = 7
    mk.reset()
    assert not np.asarray(mk._ev_all).any()


def test_single_rank_is_unchanged(fake_cupy):
    cfg = PRESETS["tiny"]
    mk = gpu.Megakernel(cfg, batch=2, tp=FakeGroup(0, 1))      # a group of one: single GPU
    assert mk.tp is None and mk.lcfg is cfg and "tp_peers" not in mk.tables
    p = dict(zip(gpu.PARAM_FIELDS, (int(x) for x in np.asarray(mk._params(1, 1)))))
    assert p["ranks"] == 1 and p["tp_peers"] == p["tp_part"] == p["tp_recv"] == p["ev_comm_op"] == 0
    assert p["n_heads"] == cfg.n_heads and p["qkv_dim"] == cfg.qkv_dim
    mk._prepare("all", False, None, 2000, 16)
    m = int(np.asarray(mk.buf["control"])[gpu.CTL_HOOK_MASK])
    assert m == gpu.hook_mask("all") and not m & (1 << D.hook("comm:wait").id)
