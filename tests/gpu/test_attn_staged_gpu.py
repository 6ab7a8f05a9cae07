"""Attention staged in shared memory (kernels/mk_ops.cuh op_attn_staged / op_rope_attn,
the default build) computes the same bits as the global-memory path it replaces
(-DDTMK_ATTN_UNSTAGED) and as the eager baseline (kernels/baseline.cu, staged k_attn
after k_rope): every step's logits bitwise and the greedy tokens, from the same weights.

tiny (max_seq 128) stages T <= 3 only, so one run goes through both the staged path and
the long-context fallback (rope_kv_slots + op_attn) as the requests (3..7 tokens) grow;
1b (rope_in_attn, batch 1) stages every T the requests reach."""
from dataclasses import replace

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

from dtrace_mk.megakernel.presets import PRESETS

CFGS = {"tiny": (PRESETS["tiny"], 4),                                                  # rope task + op_attn
        "tiny_s4r": (replace(PRESETS["tiny"], fuse_norm=True, split_k=4, rope_in_attn=True), 4),
        "1b": (PRESETS["1b"], 1)}
STEPS = 9


def _run(cfg, batch, weights, defines):
    from dtrace_mk.megakernel import gpu
    mk = gpu.Megakernel(cfg, batch=batch, weights=weights, defines=defines)
    mk.reset()
    res = mk.run(STEPS, per_step_launch=True, keep_logits=True)
    return mk, res.tokens.copy(), np.asarray(res.step_logits).copy()


@pytest.mark.parametrize("key", sorted(CFGS))
def test_staged_attention_bits_equal_unstaged_and_eager(key):
    import cupy as cp
    from dtrace_mk.megakernel.baseline import Baseline
    from dtrace_mk.megakernel.reference import make_weights
    cfg, batch = CFGS[key]
    w = make_weights(cfg, 0, xp=cp if cfg.name == "1b" else np)
    mk, tok, lg = _run(cfg, batch, w, ())
    assert np.isfinite(lg).all(), "unwritten (NaN-poisoned) logits"
    _, tok_u, lg_u = _run(cfg, batch, w, ("DTMK_ATTN_UNSTAGED",))
    np.testing.assert_array_equal(tok, tok_u)
    for k in range(STEPS):
        assert np.array_equal(lg[k].view(np.uint32), lg_u[k].view(np.uint32)), f"step {k}: staged != unstaged bits"
    mk.reset()
    e = Baseline(mk).run(STEPS)
    np.testing.assert_array_equal(tok, np.asarray(e["tokens"]))
    assert np.array_equal(lg[-1].view(np.uint32), np.asarray(e["logits"]).view(np.uint32)), "eager logit bits"
    cp.get_default_memory_pool().free_all_blocks()
