"""Tensor-parallel lowering (ranks > 1): per-rank normal form, cross-rank signal
accounting, comm generations, head/ffn coverage, errors."""
from collections import Counter, defaultdict

import pytest

from dtrace_mk.abi.definition import NONE_U32
from dtrace_mk.abi.schema import STANDARD_COMM_OPS, TaskSchema
from dtrace_mk.errors import UserError
from dtrace_mk.megakernel.graph import CLASS_IDS, build_graph, tp_shard
from dtrace_mk.megakernel.presets import PRESETS, ModelConfig

CASES = [("tiny", 2, 4, 8), ("tiny", 4, 2, 8), ("small-moe", 2, 4, 16), ("small-moe", 4, 3, 16),
         ("1b", 8, 2, 132), ("wide-tp", 16, 2, 8)]
AR = CLASS_IDS["allreduce"]


@pytest.fixture(scope="module", params=CASES, ids=lambda c: f"{c[0]}-R{c[1]}-b{c[2]}")
def graphs(request):
    name, R, batch, workers = request.param
    return [build_graph(PRESETS[name], batch, workers, rank=r, ranks=R) for r in range(R)]


def test_each_rank_is_in_normal_form_and_topological(graphs):
    for g in graphs:
        E = len(g.events)
        prod = defaultdict(list)
        for t in g.tasks:
            prod[t.signal_event].append(t.index)
        assert [t.index for t in g.tasks if t.wait_event == -1] == [0]
        for t in g.tasks:
            assert 0 <= t.signal_event < E and -1 <= t.wait_event < E
            if t.wait_event >= 0:
                assert t.wait_count == g.events[t.wait_event].triggers
                assert not g.is_remote(t.wait_event), "a task waits only on its own rank's events"
                assert prod[t.wait_event] and max(prod[t.wait_event]) < t.index, t
        flat = sorted(i for p in g.worker_plans for i in p)
        assert flat == [t.index for t in g.tasks if not t.dynamic]


def test_event_tables_identical_across_ranks_but_local_owner(graphs):
    R = len(graphs)
    base = graphs[0].events
    for g in graphs:
        assert (g.rank, g.ranks) == (graphs.index(g), R)
        assert [(e.id, e.name, e.producer_class, e.triggers, e.comm_op) for e in g.events] == \
            [(e.id, e.name, e.producer_class, e.triggers, e.comm_op) for e in base]
        for e in g.events:
            if e.comm_op >= 0:
                assert e.owner_rank == int(e.name.rsplit(".r", 1)[1]) and e.producer_class == "allreduce"
            else:
                assert e.owner_rank == g.rank
        s = TaskSchema.from_dict(g.schema.to_dict())
        assert [ev.owner_rank for ev in s.events] == [e.owner_rank for e in g.events]


def test_every_remote_signal_has_a_consumer_and_triggers_match(graphs):
    R = len(graphs)
    signals = Counter()          # (owner rank, event) -> signals per step from all ranks
    all_cons = [g.consumers() for g in graphs]
    for g, cons in zip(graphs, all_cons):
        for t in g.tasks:
            e = g.events[t.signal_event]
            signals[(e.owner_rank, e.id)] += 1
            if g.is_remote(e.id):
                assert t.cls == AR, "only comm tasks signal other ranks"
                assert t.tile[1] == e.owner_rank != g.rank
                assert cons[e.id] == [], "proxies of peers' events have no local consumer"
                assert all_cons[e.owner_rank][e.id], f"{e.name} on rank {e.owner_rank} has no consumer"
    for g in graphs:
        for e in g.events:
            if e.owner_rank == g.rank:
                assert signals[(g.rank, e.id)] == e.triggers, (g.rank, e.name)
    # each comm event gets C tiles from each of the R ranks
    g = graphs[0]
    C = g.cfg.hidden // g.cfg.comm_tile
    for e in g.events:
        if e.comm_op >= 0:
            assert e.triggers == C * R


def test_comm_gen_identical_across_ranks(graphs):
    def ops(g, step):
        return sorted({(g.events[t.signal_event].comm_op, g.comm_gen(step, t.layer), t.tile[1])
                       for t in g.tasks if t.cls == AR})
    for k in (0, 3):
        keys = [ops(g, k) for g in graphs]
        assert all(x == keys[0] for x in keys)
        L = graphs[0].cfg.n_layers
        gens = sorted({gen for _, gen, _ in keys[0]})
        assert gens == list(range(k * L, (k + 1) * L))
        assert {op for op, _, _ in keys[0]} == {0, 1}
    assert STANDARD_COMM_OPS == ("allreduce_attn", "allreduce_mlp")


def test_comm_tasks_and_consumers(graphs):
    R = len(graphs)
    for g in graphs:
        cfg = g.cfg
        C = cfg.hidden // cfg.comm_tile
        by_layer = Counter((t.layer, g.events[t.signal_event].comm_op) for t in g.tasks if t.cls == AR)
        assert by_layer == Counter({(l, op): C * R for l in range(cfg.n_layers) for op in (0, 1)})
        cons = g.consumers()
        for e in g.events:
            if e.comm_op >= 0 and e.owner_rank == g.rank:
                assert g.remote_fed(e.id)
                (c,) = cons[e.id]
                assert g.tasks[c].class_name == "rmsnorm"
                layer = int(e.name[1:].split(".")[0])
                if e.comm_op == 0:
                    assert g.tasks[c].layer == layer and g.tasks[c].tile == (1, 0, 0, 0)
                elif layer + 1 < cfg.n_layers:
                    assert g.tasks[c].layer == layer + 1 and g.tasks[c].tile == (0, 0, 0, 0)
                else:
                    assert g.tasks[c].layer == NONE_U32
            else:
                assert not g.remote_fed(e.id)
        # the comm tasks wait on the partial sums of their op
        for t in g.tasks:
            if t.cls == AR:
                src = g.events[t.wait_event].producer_class
                assert src in (("attn_o",) if g.events[t.signal_event].comm_op == 0
                               else ("mlp_down", "moe_expert"))


def test_heads_and_ffn_are_split(graphs):
    R = len(graphs)
    cfg = graphs[0].cfg
    T = cfg.tile_n
    q_heads = []
    for g in graphs:
        sh = tp_shard(cfg, g.rank, R)
        c = Counter((t.class_name, t.layer) for t in g.tasks)
        for l in range(cfg.n_layers):
            assert c[("qkv", l)] * T == sh.qkv_cols
            assert c[("rope_kv_append", l)] == sh.kv_hi - sh.kv_lo
            assert c[("attn_o", l)] == cfg.hidden // T          # row-parallel partial sums
            if not cfg.is_moe(l):
                assert c[("mlp_gate_up", l)] * T * R == cfg.ffn
                assert c[("mlp_down", l)] == cfg.hidden // T
            else:
                assert c[("moe_expert", l)] * T * R == cfg.n_experts * cfg.expert_ffn
        assert c[("lm_head", NONE_U32)] == cfg.vocab // T     # replicated
        heads = set()
        for t in g.tasks:
            if t.class_name == "attn" and t.layer == 0 and t.slot == 0:
                assert t.lo // (cfg.n_heads // cfg.n_kv_heads) == t.tile[1], "q heads of their kv head"
                heads |= set(range(t.lo, t.hi))
        assert heads == set(range(sh.q_lo, sh.q_hi))
        q_heads.append(heads)
    assert sorted(h for hs in q_heads for h in hs) == list(range(cfg.n_heads))


def test_device_tables_have_tp_extras(graphs):
    for g in graphs:
        d = g.device_tables()
        assert list(d["tp_params"]) == [g.rank, g.ranks, g.cfg.comm_tile, g.cfg.n_layers]
        assert list(d["event_comm_op"]) == [e.comm_op for e in g.events]
        assert list(d["event_owner_rank"]) == [e.owner_rank for e in g.events]


def test_kv_heads_replicated_when_ranks_exceed_them():
    cfg = PRESETS["tiny"]                # 4 q heads, 2 kv heads
    kv = [tp_shard(cfg, r, 4) for r in range(4)]
    assert [(s.kv_lo, s.kv_hi) for s in kv] == [(0, 1), (0, 1), (1, 2), (1, 2)]
    assert [(s.q_lo, s.q_hi) for s in kv] == [(0, 1), (1, 2), (2, 3), (3, 4)]
    assert [(s.kv_lo, s.kv_hi) for s in (tp_shard(cfg, r, 2) for r in range(2))] == [(0, 1), (1, 2)]


@pytest.mark.parametrize("name, R, msg", [
    ("tiny", 3, "n_heads=4 is not a multiple of 3"),
    ("tiny", 8, "n_heads=4 is not a multiple of 8"),
    ("small-moe", 8, "expert_ffn=256 is not 8 x a multiple of tile_n=64"),
    ("1b", 64, "n_heads=32 is not a multiple of 64"),
])
def test_split_errors(name, R, msg):
    with pytest.raises(UserError, match=rf"ranks: model '{name}' cannot be split over {R} ranks: {msg}"):
        build_graph(PRESETS[name], 2, 8, rank=0, ranks=R)


def test_kv_rule_and_shard_errors():
    cfg = ModelConfig("m", hidden=256, n_layers=1, n_heads=12, n_kv_heads=4, head_dim=64, ffn=768,
                      vocab=256, max_seq=16)
    with pytest.raises(UserError, match="n_kv_heads=4 must be a multiple of the ranks .* or divide them"):
        tp_shard(cfg, 0, 3)
    cfg2 = ModelConfig("m2", hidden=256, n_layers=1, n_heads=4, n_kv_heads=4, head_dim=32, ffn=512,
                       vocab=256, max_seq=16)
    with pytest.raises(UserError, match="q\\|k\\|v shard, 96 columns, is not a multiple of tile_n=64"):
        tp_shard(cfg2, 0, 4)
    with pytest.raises(UserError, match="ranks: expected >= 1, got 0"):
        tp_shard(cfg, 0, 0)
    with pytest.raises(UserError, match="comm_tile_n: must divide hidden=256"):
        ModelConfig("m3", hidden=256, n_layers=1, n_heads=4, n_kv_heads=4, head_dim=64, ffn=512,
                    vocab=256, max_seq=16, comm_tile_n=96)


def test_wide_preset_splits_64_ways():
    g = build_graph(PRESETS["wide-tp"], 2, 8, rank=63, ranks=64)
    assert sum(1 for t in g.tasks if t.cls == AR) == 2 * 2 * 64      # layers x ops x ranks
    assert tp_shard(g.cfg, 63, 64).kv_lo == 7
