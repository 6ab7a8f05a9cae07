"""sim backend: determinism, hook fields and ordering, counts, request slots, fault effects."""
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from dtrace_mk.abi import context
from dtrace_mk.abi import definition as D
from dtrace_mk.errors import UserError
from dtrace_mk.megakernel.faults import FaultTable
from dtrace_mk.megakernel.graph import CLASS_IDS, build_graph
from dtrace_mk.megakernel.presets import PRESETS
from dtrace_mk.megakernel.reference import Requests
from dtrace_mk.megakernel.sim import SIM_HOOKS, Sim, chrome_trace, pack_ctx, records_sink, simulate

_GRAPHS = {}


def graph(name="tiny", batch=4, workers=8):
    key = (name, batch, workers)
    if key not in _GRAPHS:
        _GRAPHS[key] = build_graph(PRESETS[name], batch, workers)
    return _GRAPHS[key]


def run(name="tiny", batch=4, workers=8, steps=4, faults=(), seed=0, **kw):
    g = graph(name, batch, workers)
    out = []
    res = simulate(g, steps, faults=FaultTable.from_specs(list(faults)), sink=out.append, seed=seed, **kw)
    return g, res, out


def by_hook(recs, hook, cls=None):
    c = None if cls is None else CLASS_IDS[cls]
    return [r for r in recs if r["hook"] == hook and (c is None or r.get("task_class") == c)]


@pytest.fixture(scope="module")
def moe_run():
    return run("small-moe", batch=8, workers=16, steps=4)


@pytest.fixture(scope="module")
def tiny_run():
    return run("tiny", batch=4, workers=8, steps=5)


def test_deterministic_for_a_seed():
    _, r1, a = run("small-moe", 8, 16, steps=3, seed=5)
    _, r2, b = run("small-moe", 8, 16, steps=3, seed=5)
    assert a == b and r1.step_ns == r2.step_ns
    _, r3, c = run("small-moe", 8, 16, steps=3, seed=6)
    assert c != a, "the seed drives the routing"


@pytest.mark.parametrize("which", ["tiny_run", "moe_run"])
def test_contexts_have_exactly_the_valid_fields_and_pack(which, request):
    g, res, recs = request.getfixturevalue(which)
    assert recs
    for r in recs:
        h = D.HOOKS_BY_NAME[r["hook"]]
        assert set(r) - {"hook"} == set(h.valid_fields) - {"hook"}, r["hook"]
        assert pack_ctx(r) == context.from_dict(r)   # every value fits; the fast packer agrees
        assert r["rank"] == 0 and r["sm"] == r["worker"] < g.num_workers
        assert r["abi_version"] == D.ABI_VERSION
    assert {r["hook"] for r in recs} <= set(SIM_HOOKS)


@pytest.mark.parametrize("which", ["tiny_run", "moe_run"])
def test_timestamps_nondecreasing(which, request):
    _, _, recs = request.getfixturevalue(which)
    ts = [r["ts_ns"] for r in recs]
    assert ts == sorted(ts)


@pytest.mark.parametrize("which", ["tiny_run", "moe_run"])
def test_per_task_hook_order(which, request):
    g, res, recs = request.getfixturevalue(which)
    seen = defaultdict(list)
    for n, r in enumerate(recs):
        if r["hook"] in ("gen:advance", "queue:pressure"):
            continue
        seen[(r["task_index"], r["decode_step"])].append((r["hook"], r["ts_ns"], n, r))
    assert seen
    for key, hs in seen.items():
        names = [h for h, *_ in hs]
        core = [h for h in names if h.startswith("task:")]
        assert core == ["task:ready", "task:dispatch", "task:begin", "task:end"], (key, names)
        if "dep:wait" in names:
            assert names.count("dep:wait") == names.count("dep:release") == 1
            assert names.index("dep:wait") < names.index("dep:release") < names.index("task:dispatch")
        else:
            assert "dep:release" not in names
        ts = {h: t for h, t, *_ in hs}
        assert ts["task:ready"] <= ts["task:dispatch"] <= ts["task:begin"] <= ts["task:end"]
        rec = {h: r for h, _, _, r in hs}
        assert rec["task:dispatch"]["wait_ns"] == ts["task:dispatch"] - ts["task:ready"]
        assert rec["task:end"]["dur_ns"] == ts["task:end"] - ts["task:begin"]
        dep = rec["dep:release"]["wait_ns"] if "dep:release" in rec else 0
        if "dep:release" in rec:
            assert dep == ts["dep:release"] - ts["dep:wait"]
        assert rec["task:begin"]["wait_ns"] == rec["task:end"]["wait_ns"] == dep
        # one task, one identity across its hooks
        ids = {(r["task_class"], r["tile"], r["layer"], r["expert"], r["request_slot"], r["task_gen"])
               for _, _, _, r in hs}
        assert len(ids) == 1


def test_hook_counts(tiny_run, moe_run):
    for g, res, recs in (tiny_run, moe_run):
        c = Counter(r["hook"] for r in recs)
        assert c == Counter({k: v for k, v in res.hook_counts.items() if v})
        n = g.static_tasks * res.steps + sum(res.dynamic_tasks)
        for h in ("task:ready", "task:dispatch", "task:begin", "task:end"):
            assert c[h] == n == res.tasks_run
        assert c["dep:wait"] == c["dep:release"]
        assert c["gen:advance"] == g.batch * res.steps
    g, res, recs = tiny_run
    assert sum(res.dynamic_tasks) == 0 and res.hook_counts["task:end"] == g.static_tasks * 5


def test_event_fields(tiny_run):
    g, res, recs = tiny_run
    for r in by_hook(recs, "task:end"):
        t = g.tasks[r["task_index"]]
        assert r["event_id"] == t.signal_event
        assert r["event_gen"] == g.events[t.signal_event].triggers * (r["decode_step"] + 1)
    for r in by_hook(recs, "task:begin") + by_hook(recs, "dep:wait") + by_hook(recs, "task:ready"):
        t = g.tasks[r["task_index"]]
        if t.wait_event < 0:
            assert (r["event_id"], r["event_gen"]) == (g.step_event, r["decode_step"])
        else:
            assert r["event_id"] == t.wait_event
            assert r["event_gen"] == t.wait_count * (r["decode_step"] + 1)


def test_static_tasks_run_on_their_plan_worker_and_dynamic_are_flagged(moe_run):
    g, res, recs = moe_run
    owner = g.task_worker()
    for r in by_hook(recs, "task:dispatch"):
        t = g.tasks[r["task_index"]]
        if t.dynamic:
            assert r["flags"] & D.FLAG_DYNAMIC
        else:
            assert r["worker"] == owner[t.index] and not r["flags"] & D.FLAG_DYNAMIC
    assert sum(res.dynamic_tasks) > 0


def test_moe_dynamic_counts_follow_routing(moe_run):
    g, res, recs = moe_run
    cfg = g.cfg
    tiles = cfg.expert_ffn // cfg.tile_n
    per = Counter((r["decode_step"], r["layer"], r["expert"]) for r in by_hook(recs, "task:end", "moe_expert"))
    for (k, l, e), n in per.items():
        assert n == tiles                        # an active expert runs all its tiles
    for k in range(res.steps):
        active = {e for (kk, l, e) in per if kk == k}
        assert len(per) and res.dynamic_tasks[k] == tiles * sum(1 for (kk, _, _) in per if kk == k)
        assert active


def test_request_slots_follow_the_reference_requests(tiny_run):
    g, res, recs = tiny_run
    req = Requests()
    gens = [r for r in recs if r["hook"] == "gen:advance"]
    # expected generation per (step, slot) from the reference model
    pos, gen, ln = [0] * g.batch, [0] * g.batch, [req.req_len(s, 0, g.cfg.max_seq) for s in range(g.batch)]
    expect = []
    for k in range(res.steps):
        for s in range(g.batch):
            expect.append((k, s, gen[s]))
            pos[s] += 1
            if pos[s] >= ln[s]:
                gen[s] += 1
                pos[s] = 0
                ln[s] = req.req_len(s, gen[s], g.cfg.max_seq)
    assert [(r["decode_step"], r["request_slot"], r["request_gen"]) for r in gens] == expect
    # attention tasks carry their slot's request generation
    attn = by_hook(recs, "task:begin", "attn")
    gen_at = {(k, s): gg for k, s, gg in expect}
    for r in attn:
        assert r["request_gen"] == gen_at[(r["decode_step"], r["request_slot"])]
    others = [r for r in by_hook(recs, "task:begin") if r["task_class"] != CLASS_IDS["attn"]]
    assert all(r["request_slot"] == D.NONE_U32 for r in others)


def test_step_times_and_throughput(tiny_run):
    g, res, _ = tiny_run
    assert len(res.step_ns) == res.steps and all(x > 0 for x in res.step_ns)
    assert res.step_start_ns[0] == 0
    for k in range(1, res.steps):
        assert res.step_start_ns[k] > res.step_end_ns[k - 1]
    assert res.tokens == g.batch * res.steps
    assert res.tokens_per_s == pytest.approx(res.tokens * 1e9 / res.step_end_ns[-1])


def test_hooks_filter_and_no_sink():
    g = graph()
    out = []
    res = simulate(g, 2, sink=out.append, hooks=["task:end"])
    assert {r["hook"] for r in out} == {"task:end"}
    res2 = simulate(g, 2)
    assert res2.hook_counts == res.hook_counts and res2.step_ns == res.step_ns
    with pytest.raises(UserError, match="hooks: unknown hook 'task:nope'"):
        Sim(g, 2, sink=out.append, hooks=["task:nope"])


def test_records_and_runtime_sink():
    from dtrace_mk.runtime.reference import ReferenceRuntime
    g = graph()
    recs = []
    simulate(g, 1, sink=records_sink(recs))
    assert recs and all(len(r) == D.CONTEXT_SIZE for r in recs)
    rt = ReferenceRuntime(num_workers=g.num_workers)
    for r in recs:
        rt.fire(r)


def test_chrome_trace():
    g = graph()
    res = simulate(g, 2, collect_trace=True)
    tr = chrome_trace(g, res)
    tasks = [e for e in tr["traceEvents"] if e.get("cat") == "task"]
    assert len(tasks) == res.tasks_run
    assert {e["name"] for e in tasks} >= {"qkv", "attn", "argmax"}
    assert all(e["dur"] > 0 and 0 <= e["tid"] < g.num_workers for e in tasks)


def test_one_b_runs():
    g = build_graph(PRESETS["1b"], 2, 132)
    res = simulate(g, 1)
    assert res.tasks_run == g.static_tasks and res.step_ns[0] > 0


# ------------------------------------------------------------------------------ faults

def durations(recs, cls, step=None):
    return [r["dur_ns"] for r in by_hook(recs, "task:end", cls) if step is None or r["decode_step"] == step]


def test_slow_task_class(tiny_run):
    g, base, brec = tiny_run
    _, res, recs = run("tiny", 4, 8, steps=5, faults=[{"kind": "slow_task_class", "task_class": "attn",
                                                         "extra_us": 50, "layer": 1, "steps": [1, 2, 3]}])
    bmap = {(b["task_index"], b["decode_step"]): b for b in by_hook(brec, "task:end", "attn")}
    slow = by_hook(recs, "task:end", "attn")
    assert len(slow) == len(bmap)
    for r in slow:
        b = bmap[(r["task_index"], r["decode_step"])]
        hit = r["layer"] == 1 and 1 <= r["decode_step"] <= 3
        assert r["dur_ns"] - b["dur_ns"] == (50000 if hit else 0)
        assert bool(r["flags"] & D.FLAG_FAULT) == hit
    assert durations(recs, "qkv") == durations(brec, "qkv")
    assert res.step_ns[0] == base.step_ns[0] and res.step_ns[2] >= base.step_ns[2] + 50000


def test_slow_task_class_fraction():
    _, _, recs = run("tiny", 4, 8, steps=5, faults=[{"kind": "slow_task_class", "task_class": "attn",
                                                       "extra_us": 50, "fraction": 0.5, "seed": 3}])
    flagged = [r for r in by_hook(recs, "task:end", "attn") if r["flags"] & D.FLAG_FAULT]
    n = len(by_hook(recs, "task:end", "attn"))
    assert 0.25 * n < len(flagged) < 0.75 * n


def test_starve_ready_increases_dispatch_wait(tiny_run):
    _, base, brec = tiny_run
    _, res, recs = run("tiny", 4, 8, steps=5, faults=[{"kind": "starve_ready", "task_class": "qkv", "delay_us": 20}])
    waits = [r["wait_ns"] for r in by_hook(recs, "task:dispatch", "qkv")]
    assert min(waits) >= 20000
    assert max(r["wait_ns"] for r in by_hook(brec, "task:dispatch", "qkv")) < 20000
    other = [r["wait_ns"] for r in by_hook(recs, "task:dispatch", "attn_o")]
    assert max(other) < 20000
    assert res.step_ns[0] >= base.step_ns[0] + 20000 * g_layers()
    assert durations(recs, "qkv") == durations(brec, "qkv")


def test_starve_ready_applies_to_dynamic_tasks_from_their_push():
    _, _, recs = run("small-moe", 8, 16, steps=2, faults=[{"kind": "starve_ready", "task_class": "moe_expert",
                                                             "delay_us": 7}])
    waits = [r["wait_ns"] for r in by_hook(recs, "task:dispatch", "moe_expert")]
    assert waits and min(waits) >= 7000
    assert all(r["flags"] & D.FLAG_FAULT and r["flags"] & D.FLAG_DYNAMIC
               for r in by_hook(recs, "task:end", "moe_expert"))


def g_layers():
    return PRESETS["tiny"].n_layers


def test_routing_skew_concentrates_expert_tasks(moe_run):
    g, base, brec = moe_run
    _, res, recs = run("small-moe", 8, 16, steps=4, faults=[{"kind": "routing_skew", "expert": 3, "share": 1.0}])
    fixed_rows = g.batch                                  # every slot routes to expert 3
    e3 = [r for r in by_hook(recs, "task:end", "moe_expert") if r["expert"] == 3]
    keys = {(r["decode_step"], r["layer"]) for r in e3}
    assert keys == {(k, l) for k in range(4) for l in g.cfg.moe_layers}
    b3 = [r["dur_ns"] for r in by_hook(brec, "task:end", "moe_expert") if r["expert"] == 3]
    assert min(r["dur_ns"] for r in e3) > max(b3 or [0]) or len(b3) == 0
    share = lambda rr: sum(r["dur_ns"] for r in rr if r["expert"] == 3) / sum(r["dur_ns"] for r in rr)  # noqa
    assert share(by_hook(recs, "task:end", "moe_expert")) > share(by_hook(brec, "task:end", "moe_expert"))
    routers = by_hook(recs, "task:end", "moe_router")
    assert routers and all(r["flags"] & D.FLAG_FAULT for r in routers)
    assert fixed_rows == 8


def test_routing_skew_rule_per_slot():
    from dtrace_mk.megakernel.faults import fault_pick
    from dtrace_mk.megakernel.sim import sim_routing
    rows = FaultTable.from_specs([{"kind": "routing_skew", "expert": 5, "share": 0.5, "seed": 4,
                                   "layer": 3, "steps": "0-9"}]).rows
    for step in range(10):
        base = sim_routing(8, 2, 64, 3, step, 0)
        skew = sim_routing(8, 2, 64, 3, step, 0, rows)
        assert all(len(set(c)) == 2 for c in base + skew)
        for s, (b, c) in enumerate(zip(base, skew)):
            if fault_pick(4, (3 << 16) | s, step) < 500000:
                assert c[0] == 5 and (set(c) == set(b) if 5 in b else c[1] == b[1])
            else:
                assert c == b
    assert sim_routing(8, 2, 64, 2, 0, 0, rows) == sim_routing(8, 2, 64, 2, 0, 0)   # other layer
    assert sim_routing(8, 2, 64, 3, 10, 0, rows) == sim_routing(8, 2, 64, 3, 10, 0)  # out of steps


def test_queue_saturation_raises_queue_depth(tiny_run):
    _, base, brec = tiny_run
    _, res, recs = run("tiny", 4, 8, steps=5, faults=[{"kind": "queue_saturation", "worker": 2,
                                                         "extra_tasks": 40, "steps": 1}])
    d = lambda rr, w: max([r["queue_depth"] for r in rr if r["worker"] == w and "queue_depth" in r] or [0])  # noqa
    assert d(brec, 2) < 16 <= 40 <= d(recs, 2)
    press = by_hook(recs, "queue:pressure")
    assert press and all(r["worker"] == 2 and r["decode_step"] == 1 for r in press)
    assert not by_hook(brec, "queue:pressure")
    assert res.step_ns[1] > base.step_ns[1] and res.step_ns[3] == base.step_ns[3]


def test_queue_saturation_with_layer():
    g = graph()
    w = g.task_worker()[next(t.index for t in g.tasks if t.layer == 1)]
    _, res, recs = run("tiny", 4, 8, steps=2, faults=[{"kind": "queue_saturation", "worker": w,
                                                         "extra_tasks": 20, "layer": 1}])
    press = by_hook(recs, "queue:pressure")
    assert len(press) == 2 and all(r["worker"] == w for r in press)


def test_late_notification_delays_ready_of_consumers(tiny_run):
    g, base, brec = tiny_run
    _, res, recs = run("tiny", 4, 8, steps=5, faults=[{"kind": "late_notification", "task_class": "qkv",
                                                         "delay_us": 30}])

    def gap(rr):
        out = []
        for k in range(5):
            for l in range(g.cfg.n_layers):
                last = max(r["ts_ns"] for r in by_hook(rr, "task:end", "qkv") if (r["decode_step"], r["layer"]) == (k, l))
                ready = min(r["ts_ns"] for r in by_hook(rr, "task:ready", "rope_kv_append")
                            if (r["decode_step"], r["layer"]) == (k, l))
                out.append(ready - last)
        return out
    from dtrace_mk.megakernel.cost import model_costs
    notify = model_costs(g.cfg).notify_ns
    assert set(gap(brec)) == {notify}
    assert set(gap(recs)) == {notify + 30000}
    assert durations(recs, "qkv") == durations(brec, "qkv")
    assert all(r["flags"] & D.FLAG_FAULT for r in by_hook(recs, "task:end", "qkv"))


def test_late_notification_of_router_delays_dynamic_ready():
    _, _, brec = run("small-moe", 8, 16, steps=2)
    _, _, recs = run("small-moe", 8, 16, steps=2, faults=[{"kind": "late_notification",
                                                             "task_class": "moe_router", "delay_us": 10}])

    def gaps(rr):
        ends = {(r["decode_step"], r["layer"]): r["ts_ns"] for r in by_hook(rr, "task:end", "moe_router")}
        return {r["ts_ns"] - ends[(r["decode_step"], r["layer"])] for r in by_hook(rr, "task:ready", "moe_expert")}
    (b,) = gaps(brec)
    assert gaps(recs) == {b + 10000}


def test_fault_parameter_range_checked_against_graph():
    g = graph()
    with pytest.raises(UserError, match=r"faults\[0\].worker: 8 is out of range for 8 workers"):
        Sim(g, 1, faults=FaultTable.from_specs([{"kind": "queue_saturation", "worker": 8, "extra_tasks": 1}]))
    gm = graph("small-moe", 8, 16)
    with pytest.raises(UserError, match=r"faults\[0\].expert: 8 is out of range for 8 experts"):
        Sim(gm, 1, faults=FaultTable.from_specs([{"kind": "routing_skew", "expert": 8, "share": 1}]))


def test_late_comm_is_accepted_without_effect(tiny_run):
    _, base, brec = tiny_run
    _, res, recs = run("tiny", 4, 8, steps=5, faults=[{"kind": "late_comm", "comm_op": "allreduce_attn",
                                                         "delay_us": 30}])
    assert recs == brec


COUNT_BY_CLASS = (Path(__file__).resolve().parents[2] / "examples" / "monitors" / "count_by_class.s").read_text()


def test_sim_drives_an_attached_program_end_to_end():
    from dtrace_mk.bpf import asm
    from dtrace_mk.bpf.program import BpfObject, MapDef, Program
    from dtrace_mk.runtime.reference import ReferenceRuntime
    from dtrace_mk.megakernel.sim import runtime_sink
    assert D.FIELDS_BY_NAME["task_class"].offset == 28
    g = graph("small-moe", 8, 16)
    h = D.hook("task:end")
    maps = [MapDef("counts", "hash", 4, 8, 16)]
    obj = BpfObject([Program("count", h.section, h, asm.assemble(COUNT_BY_CLASS, ["counts"]), "observe")], maps)
    rt = ReferenceRuntime(num_workers=g.num_workers)
    aid = rt.attach(obj, verify=False)
    out = []
    from dtrace_mk.megakernel.sim import runtime_hooks
    assert runtime_hooks(rt) == ["task:end"]
    res = simulate(g, 3, sink=lambda c: (out.append(c), runtime_sink(rt)(c)), hooks=runtime_hooks(rt))
    assert {r["hook"] for r in out} == {"task:end"}
    snap = {int.from_bytes(k, "little"): int.from_bytes(v, "little")
            for k, v in rt.maps(aid)["counts"].snapshot().items()}
    assert snap == dict(Counter(r["task_class"] for r in by_hook(out, "task:end")))
    cov = rt.coverage(aid)
    assert [c.epoch for c in cov] == [0, 1, 2]
    assert sum(c.eligible for c in cov) == res.hook_counts["task:end"]
    assert all(c.eligible == c.executed for c in cov)


def test_expert_tasks_spread_over_waiting_workers(moe_run):
    g, res, recs = moe_run
    by = defaultdict(set)
    for r in by_hook(recs, "task:dispatch", "moe_expert"):
        by[(r["decode_step"], r["layer"])].add(r["worker"])
    assert by and all(len(ws) >= g.num_workers // 2 for ws in by.values())


ALL_FAULTS = [
    {"kind": "slow_task_class", "task_class": "attn", "extra_us": 3, "fraction": 0.5, "seed": 1},
    {"kind": "late_notification", "task_class": "rmsnorm", "delay_us": 2, "fraction": 0.5},
    {"kind": "starve_ready", "task_class": "mlp_down", "delay_us": 4},
    {"kind": "starve_ready", "task_class": "moe_router", "delay_us": 4},
    {"kind": "late_notification", "task_class": "moe_expert", "delay_us": 1, "fraction": 0.3},
    {"kind": "routing_skew", "expert": 1, "share": 0.5},
    {"kind": "queue_saturation", "worker": 0, "extra_tasks": 20, "steps": [1, 2]},
    {"kind": "queue_saturation", "worker": 0, "extra_tasks": 3, "layer": 1},
]


@pytest.mark.parametrize("name", ["tiny", "small-moe"])
@pytest.mark.parametrize("workers", [1, 2, 3, 7, 40])
@pytest.mark.parametrize("batch", [1, 5])
def test_completes_and_keeps_invariants_under_all_faults(name, workers, batch):
    g, res, recs = run(name, batch, workers, steps=3, faults=ALL_FAULTS)
    n = g.static_tasks * 3 + sum(res.dynamic_tasks)
    c = Counter(r["hook"] for r in recs)
    assert c["task:ready"] == c["task:dispatch"] == c["task:begin"] == c["task:end"] == n
    assert c["dep:wait"] == c["dep:release"] and c["gen:advance"] == batch * 3
    assert [r["ts_ns"] for r in recs] == sorted(r["ts_ns"] for r in recs)
    per = defaultdict(list)
    for r in recs:
        if r["hook"].startswith("task:"):
            per[(r["task_index"], r["decode_step"])].append(r["hook"])
    assert all(v == ["task:ready", "task:dispatch", "task:begin", "task:end"] for v in per.values())
    assert all(x > 0 for x in res.step_ns)
