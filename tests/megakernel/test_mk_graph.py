"""Graph builder invariants (MPK normal form), presets, schema and device tables."""
from collections import Counter, defaultdict, deque
from dataclasses import replace

import numpy as np
import pytest

from dtrace_mk.abi.definition import NONE_U32
from dtrace_mk.abi.schema import STANDARD_TASK_CLASSES, TaskSchema
from dtrace_mk.errors import UserError
from dtrace_mk.megakernel.graph import CLASS_IDS, build_graph, fused_lowering, pack_tile
from dtrace_mk.megakernel.presets import PRESETS, ModelConfig, get_preset

# "1b" uses the fused-norm / split-K lowering; "1b:std" is 1b with the standard lowering
CASES = [("tiny", 4, 8), ("tiny", 1, 1), ("small-moe", 8, 16), ("small-moe", 3, 132), ("1b", 2, 132),
         ("1b:std", 2, 132)]
REQUIRED = ("rmsnorm", "qkv", "rope_kv_append", "attn", "attn_o", "mlp_gate_up", "mlp_down",
            "moe_router", "moe_expert", "lm_head", "argmax")


@pytest.fixture(scope="module", params=CASES, ids=lambda c: f"{c[0]}-b{c[1]}-w{c[2]}")
def graph(request):
    name, batch, workers = request.param
    base, _, opt = name.partition(":")
    cfg = replace(PRESETS[base], fuse_norm=False, split_k=1) if opt == "std" else PRESETS[base]
    return build_graph(cfg, batch, workers)


def producers(g):
    out = defaultdict(list)
    for t in g.tasks:
        out[t.signal_event].append(t)
    return out


def _rope_in_attn(graph):
    return graph.cfg.rope_in_attn and fused_lowering(graph.cfg, graph.ranks)


def test_indices_classes_and_ids(graph):
    for i, t in enumerate(graph.tasks):
        assert t.index == i
        assert 0 <= t.cls < len(STANDARD_TASK_CLASSES)
    for name in REQUIRED:
        assert CLASS_IDS[name] == [r[0] for r in STANDARD_TASK_CLASSES].index(name)
    used = {t.class_name for t in graph.tasks}
    expect = set(REQUIRED) - ({"moe_router", "moe_expert"} if not graph.cfg.moe_layers else set())
    if graph.cfg.moe_layers and len(graph.cfg.moe_layers) == graph.cfg.n_layers:
        expect -= {"mlp_gate_up", "mlp_down"}
    if _rope_in_attn(graph):
        expect -= {"rope_kv_append"}          # each attn task ropes its own slot
    assert used == expect


def test_every_task_waits_on_one_and_signals_one(graph):
    E = len(graph.events)
    boundary = [t.index for t in graph.tasks if t.wait_event == -1]
    assert boundary == [0], "only task 0 waits on the step boundary"
    for t in graph.tasks:
        assert -1 <= t.wait_event < E and 0 <= t.signal_event < E, t
        assert t.wait_event != t.signal_event


def test_triggers_equal_producer_counts(graph):
    prod = producers(graph)
    for e in graph.events:
        ps = prod[e.id]
        assert e.triggers == len(ps), f"{e.name}: triggers {e.triggers}, producers {len(ps)}"
        assert {p.class_name for p in ps} == {e.producer_class}, e.name


def test_wait_counts_match_event_triggers(graph):
    for t in graph.tasks:
        if t.wait_event >= 0:
            assert t.wait_count == graph.events[t.wait_event].triggers, t
        else:
            assert t.wait_count == 0


def test_topological_order_and_acyclic(graph):
    prod = producers(graph)
    for t in graph.tasks:
        if t.wait_event >= 0:
            assert max(p.index for p in prod[t.wait_event]) < t.index, t


def test_every_task_reachable_and_single_sink(graph):
    cons = graph.consumers()
    seen, q = {0}, deque([0])
    while q:
        t = graph.tasks[q.popleft()]
        for c in cons[t.signal_event]:
            if c not in seen:
                seen.add(c)
                q.append(c)
    assert seen == set(range(len(graph.tasks)))
    # the step event is argmax's and nothing inside the step waits on it
    step = graph.events[graph.step_event]
    assert step.producer_class == "argmax" and step.triggers == 1
    assert cons[graph.step_event] == []
    # every event except the step event has consumers (so every task is upstream of argmax)
    for e in graph.events:
        if e.id != graph.step_event:
            assert cons[e.id], e.name


def test_task_identity_unique_and_layers(graph):
    cfg = graph.cfg
    keys = Counter((t.cls, t.layer, t.expert, t.tile, t.slot) for t in graph.tasks)
    assert max(keys.values()) == 1
    for t in graph.tasks:
        if t.class_name in ("lm_head", "argmax"):
            assert t.layer == NONE_U32
        elif t.layer != NONE_U32:
            assert 0 <= t.layer < cfg.n_layers
        else:
            assert t.class_name == "rmsnorm"      # the final norm
        assert (t.expert != NONE_U32) == (t.class_name == "moe_expert")
        assert t.dynamic == (t.class_name == "moe_expert")
        assert (t.slot != NONE_U32) == (t.class_name == "attn")
        if t.slot != NONE_U32:
            assert t.slot < graph.batch and t.tile[2] == t.slot
        assert 0 <= t.lo < t.hi
        assert t.tile_packed == pack_tile(t.tile)


def test_class_counts_per_layer(graph):
    cfg, B, T = graph.cfg, graph.batch, graph.cfg.tile_n
    c = Counter((t.class_name, t.layer) for t in graph.tasks)
    S = cfg.split_k if cfg.fuse_norm else 1
    for l in range(cfg.n_layers):
        assert c[("rmsnorm", l)] == (2 if not cfg.fuse_norm else int(l == 0))
        assert c[("qkv", l)] == cfg.qkv_dim // ((cfg.fuse_norm and cfg.qkv_tile_n) or T)
        assert c[("rope_kv_append", l)] == (0 if _rope_in_attn(graph) else cfg.n_kv_heads)
        assert c[("attn", l)] == cfg.n_kv_heads * B
        assert c[("attn_o", l)] == cfg.hidden // T * S
        if cfg.is_moe(l):
            assert c[("moe_router", l)] == 1
            assert c[("moe_expert", l)] == cfg.n_experts * cfg.expert_ffn // T
            assert c[("mlp_gate_up", l)] == c[("mlp_down", l)] == 0
        else:
            assert c[("mlp_gate_up", l)] == cfg.ffn // T
            assert c[("mlp_down", l)] == cfg.hidden // T * S
    assert c[("rmsnorm", NONE_U32)] == int(not cfg.fuse_norm)
    assert c[("lm_head", NONE_U32)] == cfg.vocab // T
    assert c[("argmax", NONE_U32)] == 1


def test_worker_plans_partition_static_tasks(graph):
    flat = [i for p in graph.worker_plans for i in p]
    static = [t.index for t in graph.tasks if not t.dynamic]
    assert sorted(flat) == static
    assert len(graph.worker_plans) == graph.num_workers
    for p in graph.worker_plans:
        assert p == sorted(p), "a plan must follow the topological order"
    owner = graph.task_worker()
    assert all((owner[t.index] == -1) == t.dynamic for t in graph.tasks)


def test_moe_tables(graph):
    cfg = graph.cfg
    assert [m.layer for m in graph.moe] == list(cfg.moe_layers)
    for m in graph.moe:
        assert graph.tasks[m.router_task].class_name == "moe_router"
        assert graph.tasks[m.router_task].signal_event == m.router_event
        assert m.expert_tiles == cfg.expert_ffn // cfg.tile_n
        for e in range(cfg.n_experts):
            for x in range(m.expert_tiles):
                t = graph.tasks[m.expert_base + e * m.expert_tiles + x]
                assert (t.class_name, t.layer, t.expert, t.tile[0]) == ("moe_expert", m.layer, e, x)
                assert t.wait_event == m.router_event and t.signal_event == m.expert_event
        assert graph.moe_of_layer(m.layer) is m


def test_schema_emitted_and_round_trips(graph):
    s = graph.schema
    d = s.to_dict()
    s2 = TaskSchema.from_dict(d)
    assert s2.hash == s.hash == d["hash"]
    assert [e.name for e in s.events] == [e.name for e in graph.events]
    assert [e.triggers for e in s.events] == [e.triggers for e in graph.events]
    assert [l.kind for l in s.layers] == ["moe" if graph.cfg.is_moe(i) else "dense"
                                         for i in range(graph.cfg.n_layers)]
    assert s.names("comm_op") == ["allreduce_attn", "allreduce_mlp"]
    assert s.class_id("attn") == CLASS_IDS["attn"]


def test_device_tables(graph):
    d = graph.device_tables()
    T, E, W = len(graph.tasks), len(graph.events), graph.num_workers
    for k, v in d.items():
        assert isinstance(v, np.ndarray) and v.ndim == 1, k
        assert v.dtype == (np.int64 if k in ("task_tile", "params") else np.int32), k
        if k.startswith("task_"):
            assert len(v) == T, k
    assert len(d["event_triggers"]) == E
    assert d["plan_offsets"][0] == 0 and d["plan_offsets"][-1] == len(d["plan_tasks"])
    for w in range(W):
        assert list(d["plan_tasks"][d["plan_offsets"][w]:d["plan_offsets"][w + 1]]) == graph.worker_plans[w]
    cons = graph.consumers()
    for e in range(E):
        a, b = d["event_consumer_offsets"][e], d["event_consumer_offsets"][e + 1]
        assert list(d["event_consumers"][a:b]) == cons[e]
    t = graph.tasks[-1]
    assert d["task_layer"][-1] == -1 and d["task_cls"][-1] == t.cls
    assert list(d["task_tile"]) == [x.tile_packed for x in graph.tasks]
    assert list(d["task_wait_event"]) == [x.wait_event for x in graph.tasks]
    assert int(d["params"][0]) == T and int(d["params"][4]) == graph.step_event
    for i, m in enumerate(graph.moe):
        assert d["layer_moe"][m.layer] == i and d["moe_expert_base"][i] == m.expert_base


def test_build_is_deterministic():
    a = build_graph(PRESETS["small-moe"], 8, 16)
    b = build_graph(PRESETS["small-moe"], 8, 16)
    assert a.worker_plans == b.worker_plans and a.tasks == b.tasks
    assert a.schema.hash == b.schema.hash


def test_plans_spread_parallel_work():
    g = build_graph(PRESETS["1b"], 8, 132)
    owner = g.task_worker()
    qkv0 = [owner[t.index] for t in g.tasks if t.class_name == "qkv" and t.layer == 0]
    assert len(set(qkv0)) == len(qkv0), "independent tiles of one op go to distinct workers"


def test_presets():
    t = get_preset("tiny")
    assert (t.hidden, t.n_layers, t.n_heads, t.n_kv_heads, t.head_dim, t.ffn, t.vocab, t.max_seq) == \
        (256, 2, 4, 2, 64, 512, 1024, 128)
    m = get_preset("small-moe")
    assert m.moe_layers == (1, 3) and m.n_experts == 8 and m.top_k == 2 and m.n_layers == 4
    b = get_preset("1b")
    assert (b.hidden, b.n_layers, b.n_heads, b.n_kv_heads, b.head_dim, b.ffn, b.vocab, b.max_seq) == \
        (2048, 16, 32, 8, 64, 8192, 32000, 2048)
    with pytest.raises(UserError, match=r"unknown preset 'x' \(known: tiny, small-moe, 1b, wide-tp\)"):
        get_preset("x")


@pytest.mark.parametrize("kw, msg", [
    (dict(n_kv_heads=3), "n_kv_heads: must divide n_heads=4"),
    (dict(ffn=500), "ffn: must be a multiple of tile_n=64"),
    (dict(moe_layers=(5,), n_experts=4, top_k=2, expert_ffn=64), "moe_layers: layer 5 is outside 0..1"),
    (dict(moe_layers=(1,), n_experts=4, top_k=5, expert_ffn=64), "top_k: expected 1..n_experts=4"),
])
def test_model_config_errors(kw, msg):
    base = dict(name="m", hidden=256, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=64, ffn=512,
                vocab=1024, max_seq=128)
    base.update(kw)
    with pytest.raises(UserError, match="model 'm': " + msg.replace("(", r"\(").replace(")", r"\)")):
        ModelConfig(**base)


def test_build_errors():
    with pytest.raises(UserError, match="--batch: expected 1..65535, got 0"):
        build_graph(PRESETS["tiny"], 0, 4)
    with pytest.raises(UserError, match="num_workers"):
        build_graph(PRESETS["tiny"], 1, 0)
    with pytest.raises(UserError, match="rank: expected 0..1, got 2"):
        build_graph(PRESETS["tiny"], 1, 4, rank=2, ranks=2)
    with pytest.raises(UserError, match=r"ranks: model 'tiny' cannot be split over 3 ranks: n_heads=4"):
        build_graph(PRESETS["tiny"], 1, 4, rank=0, ranks=3)
