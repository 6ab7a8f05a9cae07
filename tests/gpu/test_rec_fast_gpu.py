"""-DDTMK_REC_FAST (docs/dev/hook_cost_analysis.md round 8): hook_hold / hook_flush /
hook_post read the task record from wait_event's shared copy s_rec instead of the global
table.  The records must not change: every hook's records of a run of the variant equal
the default build's as a multiset of their non-timing fields (same weights, same steps),
tokens are identical, and no record is dropped.  Timing fields (stamps, waits, durations),
the SM, the worker (which worker pops an expert task is timing) and the queue depth
(dynamic queues) are masked; everything taken from the task record is compared."""
from collections import Counter

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

from dtrace_mk.abi import definition as D
from dtrace_mk.megakernel.faults import FaultTable
from dtrace_mk.megakernel.presets import PRESETS

FAST = ("DTMK_REC_FAST",)
MASKED = {"ts_ns", "sm", "worker", "queue_depth", "dur_ns", "wait_ns", "reserved0", "reserved1"}


def _key(recs):
    names = [n for n in recs.dtype.names if n not in MASKED]
    return Counter(tuple(int(r[n]) for n in names) for r in recs)


def _run(name, defines, faults=None, hooks="all"):
    from dtrace_mk.megakernel import gpu
    mk = gpu.Megakernel(PRESETS[name], batch=2, seed=0, defines=defines)
    mk.reset()
    res = mk.run(3, hooks=hooks, faults=faults)
    assert res.hooks_dropped == 0
    return res


@pytest.mark.parametrize("name", ["tiny", "small-moe"])
def test_rec_fast_records_equal_default(name):
    a, b = _run(name, ()), _run(name, FAST)
    np.testing.assert_array_equal(a.tokens, b.tokens)
    assert len(a.hooks) == len(b.hooks) > 0
    for h in sorted(set(int(x) for x in a.hooks["hook"])):
        ka, kb = _key(a.hooks[a.hooks["hook"] == h]), _key(b.hooks[b.hooks["hook"] == h])
        assert ka == kb, f"hook {D.HOOKS[h].name if hasattr(D, 'HOOKS') else h}: records differ"


def test_rec_fast_records_equal_default_with_faults():
    """Fault flags and the summary's three hooks alone (the bench's mask3)."""
    ft = FaultTable.from_specs([
        {"kind": "slow_task_class", "task_class": "attn", "extra_us": 5},
        {"kind": "late_notification", "task_class": "qkv", "delay_us": 5, "layer": 1},
        {"kind": "starve_ready", "task_class": "mlp_down", "delay_us": 5},
    ])
    for hooks in ("all", ["task:end", "dep:release", "task:ready"]):
        a, b = _run("tiny", (), ft, hooks), _run("tiny", FAST, ft, hooks)
        np.testing.assert_array_equal(a.tokens, b.tokens)
        assert _key(a.hooks) == _key(b.hooks)
        assert (b.hooks["flags"] & D.FLAG_FAULT).any()
