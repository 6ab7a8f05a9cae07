"""Speed variants of the megakernel (docs/dev/megakernel_speed.md "Session 3"): the old
code paths bench/megakernel.py --variants compares (the session-2 code, and the task
record read after the acquire) must compute the same bits as the default build --
greedy tokens and last-step logits bitwise, from the same weights and starting state --
on tiny (standard and fused/split-4 lowering, batch 4) and on 1b (batch 1).  A variant that changes an arithmetic order, reads a stale partial or loses
a release/acquire edge shows here as different bits (or NaN from the poisoned outputs)."""
from dataclasses import replace

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

from dtrace_mk.megakernel.presets import PRESETS

# name -> (defines, runtime L2 prefetch); "default" (no defines) is compared against.
# s2code switches every new default off at once; reclate only the newest (session 3).
VARIANTS = {
    "s2code": (("DTMK_POLL_FENCE", "DTMK_PROLOGUE_SERIAL", "DTMK_REC_LATE"), False),
    "reclate": (("DTMK_REC_LATE",), False),
}
CFGS = {"tiny": (PRESETS["tiny"], 4, 6),
        "tiny_s4": (replace(PRESETS["tiny"], fuse_norm=True, split_k=4), 4, 6),
        "1b": (PRESETS["1b"], 1, 4)}
_W, _REF = {}, {}


def _run(key, defines, prefetch):
    import cupy as cp
    from dtrace_mk.megakernel import gpu
    from dtrace_mk.megakernel.reference import make_weights
    cfg, batch, steps = CFGS[key]
    if key not in _W:
        _W[key] = make_weights(cfg, 0, xp=cp if cfg.name == "1b" else np)
    mk = gpu.Megakernel(cfg, batch=batch, weights=_W[key], defines=defines, prefetch=prefetch)
    mk.reset()
    res = mk.run(steps)                       # outputs NaN-poisoned before the run
    out = (res.tokens.copy(), res.logits.copy())
    del mk
    cp.get_default_memory_pool().free_all_blocks()
    return out


def _ref(key):
    if key not in _REF:
        _REF[key] = _run(key, (), False)
        assert np.isfinite(_REF[key][1]).all()
    return _REF[key]


@pytest.mark.parametrize("key", sorted(CFGS))
@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_variant_bits_equal_default(key, name):
    defines, prefetch = VARIANTS[name]
    tok0, log0 = _ref(key)
    tok, lg = _run(key, defines, prefetch)
    np.testing.assert_array_equal(tok, tok0, err_msg=f"{name} on {key}: tokens differ from the default build")
    assert np.array_equal(lg.view(np.uint32), log0.view(np.uint32)), \
        f"{name} on {key}: last-step logits not bit-identical to the default build " \
        f"(max abs diff {np.nanmax(np.abs(lg - log0)):.3e})"
