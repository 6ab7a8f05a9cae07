"""The reference megakernel on a GPU: numerics vs the NumPy reference, tokens vs the
per-operator baselines, hook streams vs the sim backend, watchdog, faults, trace."""
from collections import Counter

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

from dtrace_mk.abi import definition as D
from dtrace_mk.megakernel.faults import FaultTable
from dtrace_mk.megakernel.graph import CLASS_IDS
from dtrace_mk.megakernel.presets import PRESETS
from dtrace_mk.megakernel.reference import ReferenceModel, make_weights

BATCH = 4
_MK = {}


def megakernel(name, **kw):
    """One Megakernel per preset (compile + upload once), reset before each use."""
    from dtrace_mk.megakernel import gpu
    key = (name, tuple(sorted(kw.items())))
    if key not in _MK:
        _MK[key] = gpu.Megakernel(PRESETS[name], batch=BATCH, seed=0, **kw)
    mk = _MK[key]
    mk.reset()
    return mk


def rel_err(a, b):
    return float(np.linalg.norm((a - b).ravel()) / np.linalg.norm(b.ravel()))


@pytest.mark.parametrize("name", ["tiny", "small-moe"])
def test_logits_and_tokens_match_reference(name):
    cfg = PRESETS[name]
    mk = megakernel(name)
    steps = 7                                   # crosses request refills (req_len 3..7)
    res = mk.run(steps, per_step_launch=True, keep_logits=True)
    ref = ReferenceModel(cfg, BATCH, make_weights(cfg, 0)).run(steps)
    assert res.step_logits.shape == ref["logits"].shape
    assert np.isfinite(res.step_logits).all(), "unwritten (NaN-poisoned) logits"
    for k in range(steps):
        err = rel_err(res.step_logits[k], ref["logits"][k])
        assert err < 1e-2, f"step {k}: relative error {err:.2e}"
    np.testing.assert_array_equal(res.tokens, ref["tokens"])


@pytest.mark.parametrize("name", ["tiny", "small-moe"])
def test_one_launch_equals_launch_per_step(name):
    mk = megakernel(name)
    a = mk.run(9).tokens
    mk.reset()
    b = mk.run(9, per_step_launch=True).tokens
    np.testing.assert_array_equal(a, b)
    assert (a >= 0).all()


@pytest.mark.parametrize("name", ["tiny", "small-moe"])
def test_tokens_equal_across_megakernel_eager_and_graph(name):
    from dtrace_mk.megakernel.baseline import Baseline
    mk = megakernel(name)
    steps = 8
    t_mk = mk.run(steps).tokens
    bl = Baseline(mk)
    mk.reset()
    t_eager = bl.run(steps)["tokens"]
    mk.reset()
    t_graph = bl.run(steps, graph=True)["tokens"]
    np.testing.assert_array_equal(t_mk, t_eager)
    np.testing.assert_array_equal(t_mk, t_graph)


def _static_key(recs, graph, names=("task:ready", "task:dispatch", "task:begin", "task:end")):
    ids = {D.hook(n).id: n for n in names}
    out = Counter()
    for r in recs:
        h = int(r["hook"])
        if h in ids and not graph.tasks[int(r["task_index"])].dynamic:
            out[(ids[h], int(r["task_index"]), int(r["decode_step"]))] += 1
    return out


@pytest.mark.parametrize("name", ["tiny", "small-moe"])
def test_hook_stream_matches_sim(name):
    from dtrace_mk.abi import context
    from dtrace_mk.megakernel.sim import Sim, records_sink
    mk = megakernel(name)
    steps = 3
    res = mk.run(steps, hooks="all")
    assert res.hooks_dropped == 0
    assert (res.hooks["abi_version"] == D.ABI_VERSION).all()
    recs = []
    Sim(mk.graph, steps, sink=records_sink(recs)).run()
    sim = context.to_array(recs)
    g = mk.graph
    assert _static_key(res.hooks, g) == _static_key(sim, g)
    # every static task once per step and hook
    n_static = sum(1 for t in g.tasks if not t.dynamic)
    assert sum(_static_key(res.hooks, g, ("task:end",)).values()) == n_static * steps
    # gen:advance: same (slot, generation, step) triples
    gid = D.hook("gen:advance").id
    key = lambda a: sorted((int(r["request_slot"]), int(r["request_gen"]), int(r["decode_step"]))
                           for r in a if int(r["hook"]) == gid)
    assert key(res.hooks) == key(sim)
    # task:end carries the event target of its signal; begin the awaited one
    end = res.hooks[res.hooks["hook"] == D.hook("task:end").id]
    for r in end[:50]:
        t = g.tasks[int(r["task_index"])]
        assert int(r["event_id"]) == t.signal_event
        assert int(r["event_gen"]) == g.events[t.signal_event].triggers * (int(r["decode_step"]) + 1)
        assert int(r["tile"]) == t.tile_packed and int(r["layer"]) == t.layer
    # dynamic tasks: ready/dispatch/begin/end once each, flagged DYNAMIC
    dyn = res.hooks[[g.tasks[int(i)].dynamic if int(h) <= 4 else False
                     for i, h in zip(res.hooks["task_index"], res.hooks["hook"])]]
    if g.moe:
        assert len(dyn) > 0
        assert (dyn["flags"] & D.FLAG_DYNAMIC).all()
        c = Counter((int(r["task_index"]), int(r["decode_step"]), int(r["hook"])) for r in dyn)
        per_task = Counter()
        for (t, k, h), n in c.items():
            assert n == 1
            per_task[(t, k)] += 1
        assert set(per_task.values()) == {4}
    else:
        assert len(dyn) == 0


def test_hooks_off_by_default_and_trace():
    from dtrace_mk.megakernel import gpu
    mk = megakernel("tiny")
    res = mk.run(2)
    assert len(res.hooks) == 0 and len(res.trace) == 0
    mk.reset()
    res = mk.run(2, trace=True)
    assert res.trace_dropped == 0
    assert len(res.trace) == len(mk.graph.tasks) * 2
    assert (np.diff(res.trace["t_dispatch"].astype(np.int64)) >= 0).all()
    assert (res.trace["t_dispatch"] > 1_600_000_000 * 10**9).all()      # 64-bit epoch ns
    chrome = gpu.trace_to_chrome(res.trace, mk.graph, res.trace_dropped)
    assert sum(1 for e in chrome["traceEvents"] if e.get("cat") == "task") == len(res.trace)
    small = megakernel("tiny", trace_cap=1)
    res = small.run(1, trace=True)
    busy = sum(1 for p in small.graph.worker_plans if p)
    assert len(res.trace) == busy
    assert res.trace_dropped == len(small.graph.tasks) - busy


def test_watchdog_reports_injected_deadlock():
    from dtrace_mk.megakernel import gpu
    mk = megakernel("tiny")
    victim = next(t.index for t in mk.graph.tasks if t.cls == CLASS_IDS["attn_o"])
    with pytest.raises(gpu.WatchdogFired) as ei:
        mk.run(2, watchdog_ms=100, inject_deadlock=victim)
    rep = ei.value.report
    stuck = [w for w in rep["workers"] if w["task"] == victim and w["state"] in ("watchdog", "stopped")]
    assert stuck, rep
    ev = mk.graph.tasks[victim].wait_event
    assert stuck[0]["event"] == ev and stuck[0]["value"] < stuck[0]["target"]
    assert "attn_o" in str(ei.value)
    mk.reset()                                  # the next run is healthy
    assert (mk.run(2).tokens >= 0).all()


def _durations(res, cls):
    end = res.hooks[res.hooks["hook"] == D.hook("task:end").id]
    return end[end["task_class"] == cls]


def test_faults_change_the_measured_stream():
    mk = megakernel("tiny")
    base = mk.run(3, hooks="all")
    mk.reset()
    ft = FaultTable.from_specs([
        {"kind": "slow_task_class", "task_class": "attn", "extra_us": 40},
        {"kind": "late_notification", "task_class": "qkv", "delay_us": 50, "layer": 1},
        {"kind": "queue_saturation", "worker": 0, "extra_tasks": 20, "steps": 1},
        {"kind": "starve_ready", "task_class": "mlp_down", "delay_us": 30},
    ])
    res = mk.run(3, hooks="all", faults=ft)
    np.testing.assert_array_equal(res.tokens, base.tokens)     # faults change timing only
    slow = _durations(res, CLASS_IDS["attn"])
    assert (slow["dur_ns"] >= 40_000).all() and (slow["flags"] & D.FLAG_FAULT).all()
    assert np.median(_durations(base, CLASS_IDS["attn"])["dur_ns"]) < 40_000
    # late qkv signal of layer 1: the rope tasks waiting on it see >= 50 us dependency waits
    rope = res.hooks[(res.hooks["hook"] == D.hook("task:begin").id) & (res.hooks["task_class"] == CLASS_IDS["rope_kv_append"])
                     & (res.hooks["layer"] == 1)]
    assert (rope["wait_ns"] >= 45_000).all()
    # starve: dispatch wait_ns (ready -> dispatch) >= 30 us for mlp_down
    disp = res.hooks[(res.hooks["hook"] == D.hook("task:dispatch").id) & (res.hooks["task_class"] == CLASS_IDS["mlp_down"])]
    assert len(disp) and (disp["wait_ns"] >= 30_000).all() and (disp["flags"] & D.FLAG_FAULT).all()
    # queue saturation on worker 0 at step 1 crosses the threshold (16)
    qp = res.hooks[res.hooks["hook"] == D.hook("queue:pressure").id]
    assert len(qp) >= 1 and set(qp["worker"]) == {0} and set(qp["decode_step"]) == {1}


def test_routing_skew_moves_expert_tasks():
    mk = megakernel("small-moe")
    base = mk.run(3, hooks=["task:end"])
    mk.reset()
    ft = FaultTable.from_specs([{"kind": "routing_skew", "expert": 5, "share": 1.0}])
    res = mk.run(3, hooks=["task:end"], faults=ft)
    re = mk.cp.asnumpy(mk.buf["route_expert"])
    assert (re[:, :, 0] == 5).all()
    ex = lambda r: Counter(int(e) for e, c in zip(r.hooks["expert"], r.hooks["task_class"])
                           if c == CLASS_IDS["moe_expert"])
    et = PRESETS["small-moe"].expert_ffn // PRESETS["small-moe"].tile_n
    assert ex(res)[5] == 3 * len(mk.graph.moe) * et
    routers = res.hooks[res.hooks["task_class"] == CLASS_IDS["moe_router"]]
    assert (routers["flags"] & D.FLAG_FAULT).all()
