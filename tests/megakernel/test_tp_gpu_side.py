"""CI (no GPU) half of the GPU tensor parallelism: weight shards, the NumPy TP reference,
the kernel tables of a TP graph, the comm-hook checker of the 2-GPU test against the sim
(whose semantics the kernel follows), and the system-scope code in the kernel's PTX."""
import re

import numpy as np
import pytest

from dtrace_mk.abi import context
from dtrace_mk.abi import definition as D
from dtrace_mk.megakernel import gpu
from dtrace_mk.megakernel import reference as R
from dtrace_mk.megakernel.graph import CLASS_IDS, build_graph, tp_shard
from dtrace_mk.megakernel.presets import PRESETS
from dtrace_mk.kernels import megakernel_text

SPLITS = [("tiny", 2), ("tiny", 4), ("small-moe", 2), ("small-moe", 4)]


@pytest.fixture(scope="module")
def weights():
    return {n: R.make_weights(PRESETS[n], 0) for n in ("tiny", "small-moe")}


@pytest.mark.parametrize("name, ranks", SPLITS)
def test_shards_have_local_shapes_and_reassemble(weights, name, ranks):
    cfg, W = PRESETS[name], weights[name]
    shards = [R.shard_weights(cfg, W, r, ranks) for r in range(ranks)]
    for r, s in enumerate(shards):
        want = R.weight_shapes(R.tp_local_config(cfg, r, ranks))
        assert {k: v.shape for k, v in s.items()} == want
    full = R.unshard_weights(cfg, shards)
    for k in W:
        np.testing.assert_array_equal(full[k], W[k], err_msg=k)
    # the split parts are disjoint: rank 0's qkv rows are its q heads, then its k, v heads
    sh = tp_shard(cfg, 1, ranks)
    hd = cfg.head_dim
    np.testing.assert_array_equal(shards[1]["qkv"][:, : (sh.q_hi - sh.q_lo) * hd], W["qkv"][:, sh.q_lo * hd: sh.q_hi * hd])


@pytest.mark.parametrize("name, ranks, steps", [("tiny", 2, 6), ("tiny", 4, 4), ("small-moe", 2, 3)])
def test_numpy_tp_reference_equals_single_rank_reference(weights, name, ranks, steps):
    cfg, W = PRESETS[name], weights[name]
    a = R.ReferenceModel(cfg, 4, W).run(steps)
    b = R.TPReferenceModel(cfg, 4, W, ranks).run(steps)
    err = np.abs(a["logits"] - b["logits"]).max() / np.abs(a["logits"]).max()
    assert err < 1e-5, err
    np.testing.assert_array_equal(a["tokens"], b["tokens"])


def test_single_rank_tables_unchanged_by_tp_code():
    g = build_graph(PRESETS["small-moe"], 2, 16)
    t = gpu.pack_tables(g)
    assert "ev_comm_op" not in t and "tp_peers" not in t
    assert (t["tasks"][:, 0] != CLASS_IDS["allreduce"]).all()
    norms = t["tasks"][t["tasks"][:, 0] == CLASS_IDS["rmsnorm"]]
    assert (norms[:, 14] == -1).all()          # no all-reduce to reduce


@pytest.mark.parametrize("name, ranks", SPLITS)
def test_tp_tables_local_heads_and_comm_aux(name, ranks):
    cfg = PRESETS[name]
    for r in range(ranks):
        g = build_graph(cfg, 2, 16, rank=r, ranks=ranks)
        t = gpu.pack_tables(g)["tasks"]
        lc = R.tp_local_config(cfg, r, ranks)
        rope = t[t[:, 0] == CLASS_IDS["rope_kv_append"]]
        attn = t[t[:, 0] == CLASS_IDS["attn"]]
        assert rope[:, 4].min() == 0 and rope[:, 5].max() == lc.n_kv_heads
        assert attn[:, 4].min() == 0 and attn[:, 5].max() == lc.n_heads
        # attn's kv head in the kernel: lo / (local q heads per kv head) == tile y - kv_lo
        sh = tp_shard(cfg, r, ranks)
        y = (attn[:, 10] >> 16) & 0xFFFF
        np.testing.assert_array_equal(attn[:, 4] // (lc.n_heads // lc.n_kv_heads), y - sh.kv_lo)
        recv_of = {}
        for task in g.tasks:
            row = t[task.index]
            if task.cls == CLASS_IDS["allreduce"]:
                ev = g.events[task.signal_event]
                assert row[12] == task.layer * 2 + ev.comm_op and row[14] == ev.owner_rank == task.tile[1]
                moe = g.moe_of_layer(task.layer)
                assert row[13] == (g.moe.index(moe) if moe and ev.comm_op == 1 else -1)
                if ev.owner_rank == r:
                    recv_of[ev.id] = row[12]
        consumers = [task for task in g.tasks if task.wait_event in recv_of]
        assert len(consumers) == 2 * cfg.n_layers
        for task in consumers:
            assert task.cls == CLASS_IDS["rmsnorm"]
            assert t[task.index, 14] == recv_of[task.wait_event] and t[task.index, 13] == -1


def _sim_records(name, steps, faults=None):
    from dtrace_mk.megakernel.mpi_transport import run_loopback
    from dtrace_mk.megakernel.sim import records_sink
    cfg = PRESETS[name]
    gs = [build_graph(cfg, 4, 16, rank=r, ranks=2) for r in range(2)]
    recs = [[], []]
    run_loopback(cfg, 4, 16, 2, steps, sinks=[records_sink(x) for x in recs], graphs=gs, faults=faults,
                 clock_skew=False)
    return gs, [context.to_array(x) for x in recs]


def test_comm_hook_checker_accepts_the_sim_and_catches_errors():
    """The 2-GPU test judges the kernel's comm hooks with check_comm_hooks; the sim is
    the contract, so its streams must pass, and a wrong comm_gen / a missing record fail."""
    from dtrace_mk.megakernel.tp_check import check_comm_hooks
    gs, recs = _sim_records("tiny", 3)
    for g, a in zip(gs, recs):
        assert check_comm_hooks(g, a, 3) == []
    a = recs[0].copy()
    sig = np.flatnonzero(a["hook"] == D.hook("comm:signal").id)
    a["comm_gen"][sig[0]] += 1
    assert any("comm:signal" in p for p in check_comm_hooks(gs[0], a, 3))
    wai = np.flatnonzero(recs[1]["hook"] == D.hook("comm:wait").id)
    b = np.delete(recs[1], wai[:1])
    assert any("comm:wait" in p for p in check_comm_hooks(gs[1], b, 3))


def test_late_comm_verdict_on_sim_streams():
    """The late_comm measure the GPU test applies (rank 0's comm:wait of the op) sees the
    sim's late_comm on rank 1; the same code runs on the kernel's records."""
    from dtrace_mk.megakernel.faults import FaultTable
    from dtrace_mk.megakernel.tp_check import comm_wait_ns
    L = PRESETS["tiny"].n_layers
    _, base = _sim_records("tiny", 3)
    f = {1: FaultTable.from_specs([{"kind": "late_comm", "comm_op": "allreduce_attn", "layer": L - 1,
                                    "delay_us": 300}])}
    _, late = _sim_records("tiny", 3, f)
    b, l = comm_wait_ns(base[0], 0, L - 1, L), comm_wait_ns(late[0], 0, L - 1, L)
    assert len(b) == len(l) == 3 and np.mean(l) - np.mean(b) >= 150_000


def test_kernel_ptx_has_system_scope_comm():
    """Receive events are signalled with system-scope release adds through the peer
    mapping and awaited with system-scope acquire (kernels/mk_comm.cuh)."""
    from dtrace_mk.kernels import build
    ptx = build.nvrtc_compile(megakernel_text(), "megakernel.cu", "sm_90a", "ptx",
                              ("DTMK_NO_HOOKS",)).decode(errors="replace")
    for ins in ("red.release.sys.global.add.u64", "ld.acquire.sys.global.u64", "st.relaxed.sys.global.u64"):
        assert ins in ptx, ins
    # the poll is an acquire load (no fence after it); -DDTMK_POLL_FENCE keeps the old
    # relaxed poll + fence so bench/megakernel.py can compare both in one run
    old = build.nvrtc_compile(megakernel_text(), "megakernel.cu", "sm_90a", "ptx",
                              ("DTMK_NO_HOOKS", "DTMK_POLL_FENCE")).decode(errors="replace")
    assert "ld.relaxed.sys.global.u64" in old and "fence.acq_rel.sys" in old
    assert re.search(r"membar\.sys|fence\.sc\.sys", ptx)      # __threadfence_system after the copy
