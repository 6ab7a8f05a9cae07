"""The fused-norm / split-K lowering (ModelConfig.fuse_norm, split_k; graph.py "Fused
norm and split-K"): graph shape, kernel aux words, cost rule, and a NumPy emulation of
the lowering's task bodies (the semantics of mk_ops.cuh's stage_norm / op_split_proj:
partial buffers by layer parity, the split-0 mlp_down tile commits the residual) that
must agree with the reference model.  The emulation runs every group of tasks waiting
on the same event against a snapshot of the buffers taken before the group (as if they
all ran at once) and checks the result equals running them one after the other: a task
reading what a task of its own group writes would make the two differ."""
import copy
import os
import re
import sys
from dataclasses import replace

import numpy as np
import pytest

from dtrace_mk.errors import UserError
from dtrace_mk.megakernel.cost import lowered_costs, lowering_name, model_costs
from dtrace_mk.megakernel.graph import CLASS_IDS, build_graph, fused_aux, split_part_floats
from dtrace_mk.megakernel.presets import PRESETS, ModelConfig
from dtrace_mk.megakernel.reference import ReferenceModel, bf16_bits_to_f32, make_weights

sys.path.insert(0, os.path.dirname(__file__))
from test_tp_launcher_cpu import fake_cupy  # noqa: E402,F401  (the NumPy stand-in for CuPy)
from dtrace_mk.megakernel.sim import simulate

OLD_1B = replace(PRESETS["1b"], fuse_norm=False, split_k=1)


def _classes(g, name):
    return [t for t in g.tasks if t.cls == CLASS_IDS[name]]


def test_1b_preset_uses_the_fused_lowering():
    cfg = PRESETS["1b"]
    assert cfg.fuse_norm and cfg.split_k == 4
    g, old = build_graph(cfg, 1, 132), build_graph(OLD_1B, 1, 132)
    assert len(_classes(old, "rmsnorm")) == 2 * 16 + 1
    assert [t.index for t in _classes(g, "rmsnorm")] == [0]        # the embedding task
    assert g.tasks[0].wait_event == -1
    assert len(_classes(g, "attn_o")) == 4 * len(_classes(old, "attn_o"))
    assert len(_classes(g, "mlp_down")) == 4 * len(_classes(old, "mlp_down"))
    assert {t.tile[3] for t in _classes(g, "mlp_down")} == {0, 1, 2, 3}
    assert {(t.tile[0], t.tile[3]) for t in _classes(g, "attn_o") if t.layer == 0} == \
        {(x, s) for x in range(32) for s in range(4)}
    # dependency levels per step: 1 + 5 per layer + 2 with rope_in_attn (1b's default since
    # session 6), 1 + 6 per layer + 2 with the rope level, 8 per layer + 3 in the old lowering
    def depth(gr):
        d = {}
        for t in gr.tasks:
            src = [u for u in gr.tasks if u.signal_event == t.wait_event] if t.wait_event >= 0 else []
            d[t.index] = 1 + max((d[u.index] for u in src), default=0)
        return max(d.values())
    assert cfg.rope_in_attn and not _classes(g, "rope_kv_append")
    assert depth(old) == 8 * 16 + 3 and depth(g) == 1 + 5 * 16 + 2
    assert depth(build_graph(replace(cfg, rope_in_attn=False), 1, 132)) == 1 + 6 * 16 + 2
    # every event's triggers == its producers
    for e in g.events:
        assert e.triggers == sum(1 for t in g.tasks if t.signal_event == e.id)


def test_fused_aux_words():
    g = build_graph(PRESETS["1b"], 2, 132)
    aux = fused_aux(g)
    for t in g.tasks:
        want = {"qkv": (0, 4), "mlp_gate_up": (1, 4), "lm_head": (2, 4), "attn_o": (4, -1),
                "mlp_down": (4, -1), "attn": (1, -1)}.get(t.class_name)   # attn: rope_in_attn
        assert aux.get(t.index) == want
    assert fused_aux(build_graph(OLD_1B, 2, 132)) == {}
    from dtrace_mk.megakernel.gpu import pack_tables        # the kernel's task records
    rec = pack_tables(g)["tasks"]
    for t in g.tasks:
        if t.index in aux:
            assert tuple(rec[t.index, 12:14]) == aux[t.index]
        assert (rec[t.index, 11] >> 16) == t.tile[3]         # tile w: the split index
    assert split_part_floats(PRESETS["1b"], 2) == 3 * 4 * 2 * 2048
    assert split_part_floats(replace(PRESETS["1b"], split_k=1), 2) == 0


def test_tensor_parallel_graphs_keep_the_standard_lowering():
    a = build_graph(PRESETS["1b"], 2, 16, rank=1, ranks=2)
    b = build_graph(OLD_1B, 2, 16, rank=1, ranks=2)
    assert a.tasks == b.tasks and a.events == b.events and a.worker_plans == b.worker_plans
    assert fused_aux(a) == {}
    assert lowering_name(PRESETS["1b"], 2) == "standard"


@pytest.mark.parametrize("kw, msg", [
    (dict(split_k=0), "split_k: expected >= 1"),
    (dict(split_k=2), "split_k=2 needs fuse_norm=True"),
    (dict(fuse_norm=True, moe_layers=(1,), n_experts=4, top_k=2, expert_ffn=64), "fuse_norm: not supported with MoE"),
])
def test_option_errors(kw, msg):
    base = dict(name="m", hidden=256, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=64, ffn=512,
                vocab=1024, max_seq=128)
    base.update(kw)
    with pytest.raises(UserError, match=msg):
        ModelConfig(**base)


def test_build_errors():
    with pytest.raises(UserError, match=r"split_k: q_dim=256 is not a multiple of 8 x split_k=64"):
        build_graph(replace(PRESETS["tiny"], fuse_norm=True, split_k=64), 1, 8)
    assert len(build_graph(PRESETS["1b"], 32, 132).tasks) > 0        # any batch (staged in chunks)


def test_cost_rule_and_sim_1b():
    std = model_costs(PRESETS["1b"])
    low = lowered_costs(std, PRESETS["1b"])
    assert low.lowering == "fuse_norm+split_k4+rope_in_attn"
    assert low.classes["attn"].ns(1) > std.classes["attn"].ns(1)     # each attn task ropes its slot
    assert low.classes["mlp_down"].ns(1) < std.classes["mlp_down"].ns(1) / 2
    assert low.classes["qkv"].ns(1) > std.classes["qkv"].ns(1)
    assert lowered_costs(low, PRESETS["1b"]) is low                 # idempotent
    new = simulate(build_graph(PRESETS["1b"], 1, 132), 2)
    old = simulate(build_graph(OLD_1B, 1, 132), 2)
    assert new.tasks_run == build_graph(PRESETS["1b"], 1, 132).static_tasks * 2
    assert new.step_ns[-1] < 0.85 * old.step_ns[-1]


# ---- NumPy emulation of the lowering's task bodies ---------------------------------------

class Emu:
    def __init__(self, cfg, B, weights):
        self.cfg, self.B = cfg, B
        self.ref = ReferenceModel(cfg, B, weights)         # request slots, caches, weights (fp32)
        self.W = self.ref.W
        c, S = cfg, max(cfg.split_k, 1)
        z = lambda *s: np.zeros(s, np.float32)  # noqa: E731
        # slice_events: h by layer parity (kernels/mk_ops.cuh mk_hbuf), layer l's norms read h[l % 2]
        self.par = c.slice_events
        self.buf = {"h": z(2, B, c.hidden) if self.par else z(B, c.hidden), "qkv": z(c.n_layers, B, c.qkv_dim), "attn": z(c.n_layers, B, c.q_dim),
                    "act": z(c.n_layers, B, c.ffn), "part": z(3, S, B, c.hidden), "logits": z(B, c.vocab),
                    "k": self.ref.k_cache, "v": self.ref.v_cache}

    def h(self, bufs, layer):
        """the residual buffer of layer `layer`'s norms (n_layers: the final norm's)"""
        return bufs["h"][layer & 1] if self.par else bufs["h"]

    def resid(self, rd, kind, layer):
        S, L = self.cfg.split_k, self.cfg.n_layers
        v = self.h(rd, L if kind == 2 else layer).copy()
        if S > 1:
            prev = L - 1 if kind == 2 else layer - 1
            if prev >= 0:
                for s in range(S):
                    v = v + rd["part"][prev & 1, s]
            if kind == 1:
                for s in range(S):
                    v = v + rd["part"][2, s]
        return v

    def norm_in(self, rd, kind, layer):
        w = self.W["final_norm"] if kind == 2 else self.W["attn_norm" if kind == 0 else "mlp_norm"][layer]
        return self.ref._rms(self.resid(rd, kind, layer), w).astype(np.float32)

    def rope_kv(self, g, l, slots, rd, wr):
        """op_rope_kv for kv head g, layer l, the given slots: rotate q / k in the qkv rows,
        append k / v at each slot's position."""
        c = self.cfg
        hd, rep = c.head_dim, c.n_heads // c.n_kv_heads
        for b in slots:
            row = rd["qkv"][l][b]
            pos = self.ref.pos[b:b + 1]
            q = self.ref._rope(row[g * rep * hd:(g + 1) * rep * hd].reshape(1, rep, hd), pos)
            k = self.ref._rope(row[(c.n_heads + g) * hd:(c.n_heads + g + 1) * hd].reshape(1, 1, hd), pos)
            v = row[(c.n_heads + c.n_kv_heads + g) * hd:(c.n_heads + c.n_kv_heads + g + 1) * hd]
            wr["qkv"][l][b, g * rep * hd:(g + 1) * rep * hd] = q.reshape(-1)
            wr["qkv"][l][b, (c.n_heads + g) * hd:(c.n_heads + g + 1) * hd] = k.reshape(-1)
            wr["k"][l, b, self.ref.pos[b], g] = k[0, 0]
            wr["v"][l, b, self.ref.pos[b], g] = v

    def run_task(self, t, rd, wr):
        c, B, W, S = self.cfg, self.B, self.W, self.cfg.split_k
        n, l, lo, hi = t.class_name, t.layer, t.lo, t.hi
        if n == "rmsnorm":
            self.h(wr, 0)[...] = W["embed"][self.ref.tokens]
        elif n == "qkv":
            wr["qkv"][l][:, lo:hi] = self.norm_in(rd, 0, l) @ W["qkv"][l][lo:hi].T
        elif n == "rope_kv_append":
            self.rope_kv(t.tile[1], l, range(B), rd, wr)
        elif n == "attn":
            hd, g, b = c.head_dim, t.tile[1], t.slot
            if c.rope_in_attn:              # the task's own rope first; it reads what it wrote
                self.rope_kv(g, l, [b], rd, wr)
                rd = {"qkv": wr["qkv"], "k": wr["k"], "v": wr["v"]}
            T = self.ref.pos[b] + 1
            for qh in range(lo, hi):
                q = rd["qkv"][l][b, qh * hd:(qh + 1) * hd]
                s = (rd["k"][l, b, :T, g] @ q) / np.sqrt(hd)
                p = np.exp(s - s.max())
                wr["attn"][l][b, qh * hd:(qh + 1) * hd] = (p @ rd["v"][l, b, :T, g]) / p.sum()
        elif n in ("attn_o", "mlp_down"):
            x = rd["attn"][l] if n == "attn_o" else rd["act"][l]
            Wm = W["o"][l] if n == "attn_o" else W["down"][l]
            if S == 1:
                wr["h"][:, lo:hi] = rd["h"][:, lo:hi] + x @ Wm[lo:hi].T
            else:
                s, K = t.tile[3], x.shape[1] // S
                if n == "mlp_down" and s == 0:
                    self.h(wr, l + 1)[:, lo:hi] = self.resid(rd, 1, l)[:, lo:hi]
                wr["part"][2 if n == "attn_o" else l & 1, s][:, lo:hi] = \
                    x[:, s * K:(s + 1) * K] @ Wm[lo:hi, s * K:(s + 1) * K].T
        elif n == "mlp_gate_up":
            xn = self.norm_in(rd, 1, l)
            wr["act"][l][:, lo:hi] = self.ref._swiglu(xn, W["gate"][l][lo:hi], W["up"][l][lo:hi])
        elif n == "lm_head":
            wr["logits"][:, lo:hi] = self.norm_in(rd, 2, self.cfg.n_layers) @ W["lm_head"][lo:hi].T
        elif n == "argmax":
            self.out = {"logits": rd["logits"].copy(), "tokens": np.argmax(rd["logits"], -1)}
            self.ref._advance(self.out["tokens"])
        else:
            raise AssertionError(n)

    def step(self, g):
        groups = {}
        for t in g.tasks:
            groups.setdefault(t.wait_event, []).append(t)
        order = []                                  # groups in the order their first task comes
        for t in g.tasks:
            if not order or order[-1] != t.wait_event:
                if t.wait_event not in order:
                    order.append(t.wait_event)
        for e in order:
            snap = copy.deepcopy(self.buf)
            seq = copy.deepcopy(self.buf)
            for t in groups[e]:
                if t.class_name == "argmax":
                    continue
                self.run_task(t, snap, self.buf)    # all of the group against the snapshot
                self.run_task(t, seq, seq)          # one after the other
            for k in self.buf:
                np.testing.assert_array_equal(self.buf[k], seq[k], err_msg=f"hazard in group of event {e}: {k}")
            for t in groups[e]:
                if t.class_name == "argmax":
                    self.run_task(t, self.buf, self.buf)
        return self.out


    def step_eager(self, g, rng=None):
        """One step run task by task, each only once its wait event has its count: the
        LATEST ready task first (consumers before the rest of their producers' level), or
        a random ready one with `rng`.  A dependency the graph leaves out makes a task
        read what is not written yet, or write what a task still to run reads."""
        count = {e.id: 0 for e in g.events}
        pending = sorted(g.tasks, key=lambda t: -t.index)
        while pending:
            ready = [i for i, t in enumerate(pending) if t.wait_event < 0 or count[t.wait_event] >= t.wait_count]
            assert ready, "no task is ready: the graph deadlocks"
            t = pending.pop(ready[0] if rng is None else ready[int(rng.integers(len(ready)))])
            self.run_task(t, self.buf, self.buf)
            count[t.signal_event] += 1
        return self.out


def eager_runs(cfg, g, B, w, seeds, steps, one_h=False):
    """(seed, relative logit error, tokens equal) of each step of Emu.step_eager on graph g
    against the reference; seed None: the latest ready task first.  one_h: a slice_events
    graph run on one h, as a kernel without -DDTMK_H_PARITY would."""
    out = []
    for seed in seeds:
        rng = None if seed is None else np.random.default_rng(seed)
        emu, ref = Emu(cfg, B, w), ReferenceModel(cfg, B, w)
        if one_h:
            emu.par, emu.buf["h"] = False, emu.buf["h"][0].copy()
        for _ in range(steps):
            a, r = emu.step_eager(g, rng), ref.step()
            out.append((seed, np.abs(a["logits"] - r["logits"]).max() / np.abs(r["logits"]).max(),
                        bool((a["tokens"] == r["tokens"]).all())))
    return out


@pytest.mark.parametrize("rope_in_attn", [False, True])
def test_head_events_are_enough(rope_in_attn):
    """head_events: attn waits for its kv group's qkv tiles (or rope task), attn_o K-slice
    k for the attn tasks of slice k's heads only; run with the latest ready task first, the
    step still matches the reference (and the level-event graph run the same way too: the
    check itself can pass)."""
    for head_events in (True, False):
        cfg = replace(PRESETS["tiny"], fuse_norm=True, split_k=2, rope_in_attn=rope_in_attn, head_events=head_events)
        B = 2
        w = make_weights(cfg, seed=5)
        g = build_graph(cfg, B, 8)
        if head_events:
            attn = [t for t in g.tasks if t.class_name == "attn"]
            assert len({t.wait_event for t in attn}) == cfg.n_kv_heads * cfg.n_layers
            assert len({t.wait_event for t in g.tasks if t.class_name == "attn_o"}) == 2 * cfg.n_layers
        for seed, err, tokens_equal in eager_runs(cfg, g, B, w, (None, 0, 1, 2), 3):
            assert err < 1e-4 and tokens_equal, (seed, err)


def test_step_eager_catches_a_missing_dependency():
    """the check above fails for a graph whose attn tasks wait for one qkv tile only
    (from the second step on: at position 0 attention does not depend on q or k)"""
    cfg = replace(PRESETS["tiny"], fuse_norm=True, split_k=2, rope_in_attn=True, head_events=True)
    g = build_graph(cfg, 2, 8)
    g.tasks = [replace(t, wait_count=1) if t.class_name == "attn" else t for t in g.tasks]
    errs = [err for _, err, _ in eager_runs(cfg, g, 2, make_weights(cfg, seed=5), (None,), 3)]
    assert max(errs) > 1e-3, errs


def test_step_eager_catches_the_down_commit_hazard():
    """per-slice events gate_up -> down on ONE h are wrong (hand-built here from the level
    graph): down's K-slice 0 commits the residual into h while gate_up tiles of other slices
    still read it; random orders find it.  slice_events keeps h by parity (tests below)."""
    cfg = replace(PRESETS["tiny"], fuse_norm=True, split_k=2, rope_in_attn=True, head_events=True)
    g = build_graph(cfg, 2, 8)
    gu = {t.signal_event for t in g.tasks if t.class_name == "mlp_gate_up"}
    tasks, ev = [], {e: e for e in gu}                  # gate_up tile x signals a slice event
    n_ev = len(g.events)
    for t in g.tasks:
        if t.class_name == "mlp_gate_up":
            half = t.tile[0] // (cfg.ffn // cfg.tile_n // 2)
            t = replace(t, signal_event=t.signal_event if half == 0 else n_ev + t.layer)
        elif t.class_name == "mlp_down" and t.tile[3] == 1:
            t = replace(t, wait_event=n_ev + t.layer)
        if t.class_name == "mlp_down":
            t = replace(t, wait_count=t.wait_count // 2)
        tasks.append(t)
    g.tasks = tasks
    g.events = list(g.events) + [replace(g.events[0], id=n_ev + l) for l in range(cfg.n_layers)]
    errs = [err for _, err, _ in eager_runs(cfg, g, 2, make_weights(cfg, seed=5), range(4), 2)]
    assert max(errs) > 1e-3, errs


@pytest.mark.parametrize("split_k,head_events", [(2, False), (2, True), (4, False)])
def test_slice_events_with_h_by_parity_are_enough(split_k, head_events):
    """slice_events: gate_up tile x signals its K-slice's event, mlp_down K-slice s waits for
    that event only, and h is two buffers by layer parity -- the graph the hazard test above
    shows wrong with one h.  Latest-ready-first and random orders match the reference."""
    cfg = replace(PRESETS["tiny"], fuse_norm=True, split_k=split_k, rope_in_attn=True, head_events=head_events,
                  slice_events=True)
    B = 2
    g = build_graph(cfg, B, 8)
    ev = {e.id: e for e in g.events}
    ng = cfg.ffn // cfg.tile_n
    for l in range(cfg.n_layers):
        gu = [t for t in g.tasks if t.class_name == "mlp_gate_up" and t.layer == l]
        down = [t for t in g.tasks if t.class_name == "mlp_down" and t.layer == l]
        assert len({t.signal_event for t in gu}) == split_k
        for t in gu:      # tile x's columns are in K-slice x * T // (ffn / S)
            assert ev[t.signal_event].name == f"L{l}.gate_up.s{t.lo // (cfg.ffn // split_k)}"
        for t in down:
            assert ev[t.wait_event].name == f"L{l}.gate_up.s{t.tile[3]}" and t.wait_count == ng // split_k
    for seed, err, tokens_equal in eager_runs(cfg, g, B, make_weights(cfg, seed=5), (None, 0, 1, 2, 3), 3):
        assert err < 1e-4 and tokens_equal, (seed, err)


def test_slice_events_without_h_by_parity_fail():
    """the same graph run on one h (what a kernel built without -DDTMK_H_PARITY does):
    random orders find the commit hazard, so the test above checks the parity"""
    cfg = replace(PRESETS["tiny"], fuse_norm=True, split_k=2, rope_in_attn=True, slice_events=True)
    g = build_graph(cfg, 2, 8)
    errs = [err for _, err, _ in eager_runs(cfg, g, 2, make_weights(cfg, seed=5), range(4), 2, one_h=True)]
    assert max(errs) > 1e-3, errs


@pytest.mark.parametrize("change,msg", [
    (dict(split_k=1), "slice_events: needs split_k >= 2"),
    (dict(split_k=2, tile_n=64, ffn=192), "slice_events: gate_up tiles must not straddle K-slices: 64 columns per tile do not divide ffn / split_k = 96"),
])
def test_slice_events_refusals(change, msg):
    with pytest.raises(UserError, match=re.escape(f"model 'tiny': {msg}")):
        replace(PRESETS["tiny"], fuse_norm=True, slice_events=True, **change)


def test_slice_events_1b_graph_and_defines():
    """1b with slice_events: 3 more events per layer, the same tasks; the kernel gets
    DTMK_H_PARITY (also the compiled tier's linked kernel) and two h buffers"""
    from dtrace_mk.megakernel import gpu
    from dtrace_mk.runtime import compiled as C
    cfg = replace(PRESETS["1b"], slice_events=True)
    g, g0 = build_graph(cfg, 1, 132), build_graph(PRESETS["1b"], 1, 132)
    assert len(g.events) == len(g0.events) + 3 * cfg.n_layers
    assert [(t.class_name, t.layer, t.tile) for t in g.tasks] == [(t.class_name, t.layer, t.tile) for t in g0.tasks]
    defs = gpu.megakernel_defines(cfg, 1)
    assert "DTMK_H_PARITY" in defs and "DTMK_H_PARITY" not in gpu.megakernel_defines(PRESETS["1b"], 1)
    assert "DTMK_H_PARITY" in C.megakernel_spec(defs).defines
    assert gpu.h_buffers(cfg, 1) == 2 and gpu.h_buffers(PRESETS["1b"], 1) == 1
    assert gpu.h_buffers(replace(cfg, fuse_norm=False, split_k=1), 1) == 1   # standard lowering: ignored


def test_head_events_need_tiles_inside_heads():
    with pytest.raises(UserError, match="straddle heads"):
        replace(PRESETS["1b"], head_events=True)                 # 24-column qkv tiles
    g = build_graph(replace(PRESETS["1b"], head_events=True, qkv_tile_n=32), 1, 132)
    assert len([e for e in g.events if e.producer_class == "qkv"]) == 16 * 8


@pytest.mark.parametrize("split_k,rope_in_attn", [(1, False), (2, False), (4, False), (4, True)])
def test_numpy_emulation_matches_reference(split_k, rope_in_attn):
    cfg = replace(PRESETS["tiny"], fuse_norm=True, split_k=split_k, rope_in_attn=rope_in_attn)
    B, steps = 2, 6
    w = make_weights(cfg, seed=3)
    g = build_graph(cfg, B, 8)
    emu, ref = Emu(cfg, B, w), ReferenceModel(cfg, B, w)
    for _ in range(steps):
        a, r = emu.step(g), ref.step()
        err = np.abs(a["logits"] - r["logits"]).max() / np.abs(r["logits"]).max()
        assert err < 1e-4
        assert (a["tokens"] == r["tokens"]).all()
    assert bf16_bits_to_f32(w["embed"]).shape == (cfg.vocab, cfg.hidden)


def test_rope_in_attn_drops_the_rope_level():
    """rope_in_attn (fused lowering): no rope_kv_append task; every attn task waits on its
    layer's qkv event and carries the aux flag (1, -1) that makes the kernel rope first;
    one dependency level less per layer.  Ignored by the standard lowering."""
    cfg = replace(PRESETS["1b"], rope_in_attn=True)
    g, g0 = build_graph(cfg, 1, 132), build_graph(replace(cfg, rope_in_attn=False), 1, 132)
    assert not any(t.class_name == "rope_kv_append" for t in g.tasks)
    aux = fused_aux(g)
    qkv_event = {t.layer: t.signal_event for t in g.tasks if t.class_name == "qkv"}
    attn = [t for t in g.tasks if t.class_name == "attn"]
    assert len(attn) == cfg.n_layers * cfg.n_kv_heads
    for t in attn:
        assert t.wait_event == qkv_event[t.layer] and aux[t.index] == (1, -1)
    assert len(g0.tasks) - len(g.tasks) == cfg.n_layers * cfg.n_kv_heads
    old = build_graph(replace(cfg, fuse_norm=False, split_k=1), 1, 132)
    assert sum(t.class_name == "rope_kv_append" for t in old.tasks) == cfg.n_layers * cfg.n_kv_heads


def test_h_parity_build_compiles_and_changes_only_with_the_define(megakernel_ptx):
    """CI (NVRTC, no GPU): the slice_events build (-DDTMK_H_PARITY) compiles, and its norm
    prologue picks h by the layer's parity (one more `and 1` per read of h) where the default
    build's does not.  The bits are checked on the GPU (tests/gpu/test_megakernel_fused_gpu.py
    variant s4se)."""
    from dtrace_mk.kernels.build import ptx_function
    ands = {}
    for d in (("DTMK_ROPE_IN_ATTN",), ("DTMK_ROPE_IN_ATTN", "DTMK_H_PARITY")):   # (the first: test_attn_staged's too)
        body = ptx_function(megakernel_ptx(d), "_Z10stage_normRK8MkParamsPfS2_iiiii")
        ands[d[-1]] = len(re.findall(r"and\.b32\s+%r\d+, %r\d+, 1;", body))
    assert ands["DTMK_H_PARITY"] > ands["DTMK_ROPE_IN_ATTN"], ands


def test_megakernel_allocates_h_by_parity(fake_cupy):
    """host side (NumPy stand-in for CuPy): a slice_events Megakernel gets two h buffers and
    the parity define; the default keeps one [B, H] h (the standard lowering's baseline
    indexes it so)"""
    from dtrace_mk.megakernel import gpu
    B = 2
    se = gpu.Megakernel(replace(PRESETS["tiny"], fuse_norm=True, split_k=2, slice_events=True), batch=B, num_workers=4)
    one = gpu.Megakernel(replace(PRESETS["tiny"], fuse_norm=True, split_k=2), batch=B, num_workers=4)
    H = PRESETS["tiny"].hidden
    assert se.buf["h"].shape == (2, B, H) and "DTMK_H_PARITY" in se.defines
    assert one.buf["h"].shape == (B, H) and "DTMK_H_PARITY" not in one.defines
