"""The tensor-parallel per-operator baseline's math on the CPU: R ranks as threads
(NumPy, an in-place all-reduce through a barrier) give the single-process reference's
tokens; the shards partition the weights exactly (the GPU run swaps in CuPy + NCCL)."""
import threading

import numpy as np
import pytest

from dtrace_mk.errors import UserError
from dtrace_mk.megakernel.baseline import TPBaseline, tp_shard_weights
from dtrace_mk.megakernel.presets import PRESETS
from dtrace_mk.megakernel.reference import ReferenceModel, bf16_bits_to_f32, make_weights

CFG = PRESETS["tiny"]
B, STEPS = 4, 9               # crosses request refills (req_len 3..7)


class ThreadAllReduce:
    """In-place sum over R threads, in rank order (deterministic)."""

    def __init__(self, ranks):
        self.bar = threading.Barrier(ranks)
        self.slots = [None] * ranks

    def for_rank(self, r):
        def allreduce(a):
            self.slots[r] = a.copy()
            self.bar.wait()
            total = self.slots[0].copy()
            for s in self.slots[1:]:
                total += s
            self.bar.wait()
            a[...] = total
        return allreduce


def run_tp(ranks, weights):
    ar = ThreadAllReduce(ranks)
    out, errs = [None] * ranks, []

    def rank_main(r):
        try:
            bl = TPBaseline(CFG, B, r, ranks, weights=weights, allreduce=ar.for_rank(r), xp=np)
            out[r] = bl.run(STEPS)
        except BaseException as e:          # surface in the main thread
            errs.append(e)
            ar.bar.abort()
    ts = [threading.Thread(target=rank_main, args=(r,)) for r in range(ranks)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout=120)
    if errs:
        raise errs[0]
    return out


@pytest.fixture(scope="module")
def weights():
    return make_weights(CFG, 0)


@pytest.fixture(scope="module")
def reference(weights):
    return ReferenceModel(CFG, B, weights).run(STEPS)


@pytest.mark.parametrize("ranks", [1, 2, 4])
def test_tp_ranks_give_reference_tokens(ranks, weights, reference):
    outs = run_tp(ranks, weights)
    for r, o in enumerate(outs):
        np.testing.assert_array_equal(o["tokens"], reference["tokens"], err_msg=f"rank {r}")
        err = np.linalg.norm(o["logits"] - reference["logits"][-1]) / np.linalg.norm(reference["logits"][-1])
        assert err < 1e-4, f"rank {r}: logits relative error {err:.2e}"


def test_without_the_allreduce_the_tokens_differ(weights, reference):
    """The all-reduce is load-bearing: a rank alone with half the heads/ffn is wrong."""
    bl = TPBaseline(CFG, B, 0, 2, weights=weights, allreduce=lambda a: None, xp=np)
    assert not np.array_equal(bl.run(STEPS)["tokens"], reference["tokens"])


def test_shards_partition_the_weights(weights):
    R = 2
    sh = [tp_shard_weights(CFG, weights, r, R) for r in range(R)]
    f = lambda a: bf16_bits_to_f32(a)  # noqa: E731
    # row-parallel o and down: the shards' columns concatenate to the full matrix
    np.testing.assert_array_equal(np.concatenate([s["o"] for s in sh], axis=2), weights["o"])
    np.testing.assert_array_equal(np.concatenate([s["down"] for s in sh], axis=2), weights["down"])
    np.testing.assert_array_equal(np.concatenate([s["gate"] for s in sh], axis=1), weights["gate"])
    hd, nh, nkv = CFG.head_dim, CFG.n_heads, CFG.n_kv_heads
    q0 = sh[0]["qkv"][:, : (nh // R) * hd]
    np.testing.assert_array_equal(q0, weights["qkv"][:, : (nh // R) * hd])
    k1 = sh[1]["qkv"][:, (nh // R) * hd: (nh // R + nkv // R) * hd]
    np.testing.assert_array_equal(k1, weights["qkv"][:, (nh + nkv // R) * hd: (nh + 2 * (nkv // R)) * hd])
    assert sh[0]["lm_head"] is weights["lm_head"] and f(sh[1]["embed"]).shape == (CFG.vocab, CFG.hidden)


def test_moe_and_bad_splits_are_user_errors(weights):
    with pytest.raises(UserError, match="MoE"):
        tp_shard_weights(PRESETS["small-moe"], make_weights(PRESETS["small-moe"], 0), 0, 2)
    with pytest.raises(UserError, match="cannot be split"):
        tp_shard_weights(CFG, weights, 0, 3)
