"""Speed variants of the megakernel (docs/dev/megakernel_speed.md "Session 3"): the old
code paths bench/megakernel.py --variants compares (the session-2 code, and the task
record read after the acquire) must compute the same bits as the default build --
greedy tokens and last-step logits bitwise, from the same weights and starting state --
on tiny (standard and fused/split-4 lowering, batch 4) and on 1b (batch 1).  A variant that changes an arithmetic order, reads a stale partial or loses
a release/acquire edge shows here as different bits (or NaN from the poisoned outputs).
Session 4's TMA weight streaming (DTMK_WSTREAM*, the default build since then; the old
path is DTMK_NO_WSTREAM) must give the same bits too, and its per-launch counters must
show that every covered tile really went through the ring."""
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
    # session 4: weight tiles through shared memory with TMA bulk copies, started before the
    # dependency wait (kernels/mk_ops.cuh "weight streaming"); 4 x 32 KB, 8 and 9 x 16 KB rings
    "wstream": (("DTMK_WSTREAM",), False),
    "wstream8": (("DTMK_WSTREAM", "DTMK_WS_NST=8", "DTMK_WS_STAGE=16384"), False),
    "wstream9": (("DTMK_WSTREAM", "DTMK_WS_NST=9", "DTMK_WS_STAGE=16384"), False),
    "wstream_nh": (("DTMK_WSTREAM", "DTMK_NO_HOOKS"), False),
    "wstream_nopre": (("DTMK_WSTREAM", "DTMK_WS_NOPRE"), False),     # ring only, started by the body
    # the weight stream is the default build since session 4: the old matvec path must
    # still give the same bits (hooks on and off)
    "nowstream": (("DTMK_NO_WSTREAM",), False),
    "nowstream_nh": (("DTMK_NO_WSTREAM", "DTMK_NO_HOOKS"), False),
    # session 4b: the next static task's stream follows the current one through the ring
    # (docs/dev/megakernel_speed.md "Session 4b"); with the wait's start off, the body's
    # ws_begin fills the free slots
    "wsnext": (("DTMK_WS_NEXT",), False),
    "wsnext_nh": (("DTMK_WS_NEXT", "DTMK_NO_HOOKS"), False),
    "wsnext_nopre": (("DTMK_WS_NEXT", "DTMK_WS_NOPRE"), False),
    # ... the next stream only into slots free at a task boundary, not the tile's tail
    "wsnext_notail": (("DTMK_WS_NEXT", "DTMK_WS_NEXT_NOTAIL"), False),
    # session 5: the weight stream's copies are L2 evict-first by default; the old copies
    "evictnormal": (("DTMK_WS_EVICT_NORMAL",), False),
    # session 19: the worker's plan and its records in shared memory (the loop head and the
    # first look read no global table); _short: a plan longer than 1 task keeps the global reads
    "plansmem": (("DTMK_PLAN_SMEM=96",), False),
    "plansmem_nh": (("DTMK_PLAN_SMEM=96", "DTMK_NO_HOOKS"), False),
    "plansmem_short": (("DTMK_PLAN_SMEM=1",), False),
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


# ---- the weight stream really ran (a variant that silently kept the old path would pass
# the bit test above) ----------------------------------------------------------------------
WS_VARIANTS = ["wstream", "wstream8", "wstream9", "wstream_nopre"]


def _ws_expected(tasks, cfg, B, xs_cap, stage):
    """(streams, stages) one step of the graph's static tasks should take through the ring:
    kernels/mk_ops.cuh ws_task_desc / ws_desc in Python (fused qkv, lm_head, gate/up; split-K
    attn_o, mlp_down; batch <= 4, one rank)"""
    if B > 4:
        return 0, 0
    H, chunk = cfg.hidden, max(1, min(xs_cap // cfg.hidden, B))
    streams = stages = 0
    for r in tasks:
        cls, lo, hi, dyn, a12, a13 = int(r[0]), int(r[4]), int(r[5]), int(r[9]), int(r[12]), int(r[13])
        if dyn:
            continue
        if cls in (1, 9, 5):
            if a12 < 0 or (cls == 9 and a13 < 1) or chunk < B:
                continue
            K, two, contig = H, cls == 5, True
        elif cls in (4, 6):
            if a12 <= 1:
                continue
            K = (cfg.n_heads * cfg.head_dim if cls == 4 else cfg.ffn) // a12
            if B * K > xs_cap:
                continue
            two, contig = False, False
        else:
            continue
        per = 2 * K * (2 if two else 1)
        rps = min(stage // per, 32 if (contig or not two) else 16)
        if rps < 1 or (2 * K) % 16:
            continue
        streams += 1
        stages += -(-(hi - lo) // rps)
    return streams, stages


def _run_counting(key, defines, *counters):
    """One run of CFGS[key] built with `defines`; each (kernel global, words) counter is
    zeroed before and read after.  Returns (the Megakernel, [counter values...])."""
    import cupy as cp
    from dtrace_mk.megakernel import gpu
    from dtrace_mk.megakernel.reference import make_weights
    cfg, batch, steps = CFGS[key]
    if key not in _W:
        _W[key] = make_weights(cfg, 0, xp=cp if cfg.name == "1b" else np)
    mk = gpu.Megakernel(cfg, batch=batch, weights=_W[key], defines=defines)
    arrs = [cp.ndarray((n,), cp.uint64, memptr=mk.module.get_global(g)) for g, n in counters]
    for a in arrs:
        a[:] = 0
    mk.reset()
    mk.run(steps)
    return mk, [[int(v) for v in a.get()] for a in arrs]


@pytest.mark.parametrize("key", sorted(CFGS))
@pytest.mark.parametrize("name", WS_VARIANTS)
def test_wstream_takes_every_covered_tile(key, name):
    """dtmk_ws_stats after a run: every covered static tile's stream was started by its
    dependency wait (prediction == body: no restart by a body), and exactly the predicted
    stages went through the ring; the standard lowering (tiny) streams nothing"""
    import cupy as cp
    cfg, batch, steps = CFGS[key]
    defines, _ = VARIANTS[name]
    mk, (got,) = _run_counting(key, defines, ("dtmk_ws_stats", 3))
    kv = dict((d.split("=", 1) + [""])[:2] for d in defines)
    stage = int(kv.get("DTMK_WS_STAGE") or 32768)
    streams, stages = _ws_expected(mk.tables["tasks"].get(), mk.lcfg, batch, mk.xs_cap, stage)
    del mk
    cp.get_default_memory_pool().free_all_blocks()
    if key == "tiny":
        assert streams == 0 and got == [0, 0, 0], got
        return
    assert streams > 0
    pre = 0 if "DTMK_WS_NOPRE" in kv else streams       # NOPRE: every stream started by its body
    want = [stages * steps, pre * steps, (streams - pre) * steps]
    assert got == want, f"{name} on {key}: [stages, started by the wait, by the body] = {got}, expected {want}"


# ---- session 4b: DTMK_WS_NEXT chains each worker's streams (counters: mk_ops.cuh ws_end /
# ws_prestart, dtmk_ws_next_stats = [chained, started early]) -------------------------------
NEXT_VARIANTS = ["wsnext", "wsnext_nopre", "wsnext_notail"]   # NOTAIL: the same counters


def _next_expected(tasks, plan_off, plan_tasks, steps, cfg, B, xs_cap, stage):
    """[stages, started by a wait, started by a body] and [chained, started early] for one
    launch of `steps` steps: per worker the plan repeated `steps` times (the next step's first
    task follows the last one within a launch); a streamed task after a streamed one is
    chained, after an unstreamed one started early by that task's wait, the worker's first
    one started by its own wait (tests/kernels/test_wstream.py _next_counts, the model's rule)"""
    one = {}
    for t in range(len(tasks)):
        n_st, n_stages = _ws_expected(tasks[t:t + 1], cfg, B, xs_cap, stage)
        one[t] = n_stages if n_st else 0
    chain = early = pre = stages = 0
    for w in range(len(plan_off) - 1):
        seq = [int(t) for t in plan_tasks[plan_off[w]:plan_off[w + 1]]] * steps
        for i, t in enumerate(seq):
            if not one[t]:
                continue
            stages += one[t]
            if i == 0:
                pre += 1
            elif one[seq[i - 1]]:
                chain += 1
            else:
                early += 1
                pre += 1
    return [stages, pre, 0], [chain, early]


@pytest.mark.parametrize("key", sorted(CFGS))
@pytest.mark.parametrize("name", NEXT_VARIANTS)
def test_wsnext_chains_the_plan(key, name):
    """dtmk_ws_stats / dtmk_ws_next_stats after a run equal the plan's prediction: every
    streamed tile after a streamed one was live when its wait began (chained), every other one
    was started by a wait, none restarted by a body; the same stages went through the ring as
    in the default build.  DTMK_WS_NOPRE: the wait starts nothing (no early start), so the
    streams the wait would have started are started by their bodies.  tiny (standard
    lowering): nothing streams."""
    import cupy as cp
    cfg, batch, steps = CFGS[key]
    defines, _ = VARIANTS[name]
    mk, (got, ngot) = _run_counting(key, defines, ("dtmk_ws_stats", 3), ("dtmk_ws_next_stats", 2))
    host = lambda a: a.get() if hasattr(a, "get") else np.asarray(a)      # noqa: E731
    want, nwant = _next_expected(host(mk.tables["tasks"]), host(mk.tables["plan_off"]),
                                 host(mk.tables["plan_tasks"]), steps, mk.lcfg, batch, mk.xs_cap, 32768)
    del mk
    cp.get_default_memory_pool().free_all_blocks()
    if key == "tiny":
        assert want[0] == 0 and got == [0, 0, 0] and ngot == [0, 0], (got, ngot)
        return
    assert want[0] > 0 and nwant[0] > 0
    if "DTMK_WS_NOPRE" in defines:      # no wait starts a stream: the early ones start in their bodies
        want, nwant = [want[0], 0, want[1]], [nwant[0], 0]
    assert (got, ngot) == (want, nwant), \
        f"{name} on {key}: [stages, by a wait, by a body], [chained, early] = {got}, {ngot}; expected {want}, {nwant}"
