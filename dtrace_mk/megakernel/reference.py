"""NumPy reference of the reference megakernel's decoder: same weights, same math.

The GPU megakernel (`kernels/megakernel.cu`), the kernel-per-operator baseline
(`baseline.py`) and this module compute one function; tests compare logits (relative
error within bf16 tolerance) and greedy tokens.

Model: Llama-style decoder, decode only (each request starts from one prompt token at
position 0), batch = request slots with continuous batching:

* weights are bf16 (kept as uint16 bit patterns), activations, KV cache and logits fp32;
* h = embed[token]; per layer: xn = rmsnorm(h) * w_attn_norm; qkv = W_qkv xn;
  RoPE (pairs i, i + hd/2; angle pos * theta^(-2i/hd)) on q and k heads; k, v appended
  to the cache at pos; GQA attention over positions 0..pos; h += W_o attn;
  xn = rmsnorm(h) * w_mlp_norm; dense MLP h += W_down (silu(W_gate xn) * W_up xn), or
  MoE: router logits W_router xn, top-k (ties to the lower expert), weights = softmax
  over the top-k logits, h += sum_k w_k expert_k(xn);
  logits = W_lm (rmsnorm(h) * w_final_norm); next token = argmax (ties to lower id).
* request slots: slot b, generation g starts with token prompt_token(b, g) at pos 0 and
  runs req_len(b, g) steps; after the last one the slot is refilled with generation g+1
  (its KV cache is overwritten from pos 0).  Both functions hash with splitmix64 like
  the kernel (`mk_slot_update` in megakernel.cu).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional

import numpy as np

MASK64 = (1 << 64) - 1


def splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


@dataclass(frozen=True)
class Requests:
    """How request slots are filled: deterministic per (slot, generation)."""
    seed: int = 1234
    min_len: int = 3
    span: int = 5          # req_len in [min_len, min_len + span)

    def prompt_token(self, slot: int, gen: int, vocab: int) -> int:
        return splitmix64((self.seed << 40) ^ (slot << 20) ^ gen) % vocab

    def req_len(self, slot: int, gen: int, max_seq: int) -> int:
        n = self.min_len + splitmix64(((self.seed << 40) ^ (slot << 20) ^ gen) + 1) % self.span
        return int(min(n, max_seq))


# ---- bf16 ------------------------------------------------------------------------

def f32_to_bf16_bits(a) -> Any:
    """Round-to-nearest-even float32 -> bf16 bit patterns (uint16); numpy or cupy."""
    xp = _xp(a)
    b = a.astype(xp.float32).view(xp.uint32)
    r = ((b >> 16) & 1) + 0x7FFF
    return ((b + r) >> 16).astype(xp.uint16)


def bf16_bits_to_f32(b) -> Any:
    xp = _xp(b)
    return (b.astype(xp.uint32) << 16).view(xp.float32)


def _xp(a):
    if type(a).__module__.startswith("cupy"):
        import cupy
        return cupy
    return np


# ---- weights -----------------------------------------------------------------------

def weight_shapes(cfg) -> Dict[str, tuple]:
    H, L, hd = cfg.hidden, cfg.n_layers, cfg.head_dim
    qkv = (cfg.n_heads + 2 * cfg.n_kv_heads) * hd
    nm = len(cfg.moe_layers)
    E, EF = max(cfg.n_experts, 1), max(cfg.expert_ffn, 8)
    n_dense = L - nm
    return {
        "embed": (cfg.vocab, H),
        "attn_norm": (L, H),
        "qkv": (L, qkv, H),
        "o": (L, H, cfg.n_heads * hd),
        "mlp_norm": (L, H),
        # dense MLP weights are stored for dense layers only (index = dense ordinal)
        "gate": (max(n_dense, 1), cfg.ffn, H),
        "up": (max(n_dense, 1), cfg.ffn, H),
        "down": (max(n_dense, 1), H, cfg.ffn),
        "router": (max(nm, 1), E, H),
        "egate": (max(nm, 1), E, EF, H),
        "eup": (max(nm, 1), E, EF, H),
        "edown": (max(nm, 1), E, H, EF),
        "final_norm": (H,),
        "lm_head": (cfg.vocab, H),
    }


def make_weights(cfg, seed: int = 0, xp=np) -> Dict[str, Any]:
    """Seeded random bf16 weights (uint16 bit patterns), numpy by default.

    With xp=cupy the weights are drawn on the GPU (for the 1b benchmark, where NumPy
    drawing would take long); they differ from the NumPy ones, so only the NumPy draw
    is compared against this reference."""
    out = {}
    if xp is np:
        rng = np.random.default_rng(seed)
        uni = lambda shape: rng.random(shape, dtype=np.float32)
    else:
        rng = xp.random.default_rng(seed)
        uni = lambda shape: rng.random(shape, dtype=xp.float32)
    for name, shape in weight_shapes(cfg).items():
        u = uni(shape) * 2.0 - 1.0                     # uniform [-1, 1)
        if name in ("attn_norm", "mlp_norm", "final_norm"):
            w = 1.0 + 0.1 * u
        elif name == "embed":
            w = u
        else:
            fan_in = shape[-1]
            w = u * np.float32(np.sqrt(3.0 / fan_in))   # unit-variance outputs
        out[name] = f32_to_bf16_bits(w.astype(xp.float32))
    return out


def moe_index(cfg) -> List[int]:
    """Per layer: ordinal among MoE layers, or -1 for a dense layer."""
    return [cfg.moe_layers.index(l) if l in cfg.moe_layers else -1 for l in range(cfg.n_layers)]


def dense_index(cfg) -> List[int]:
    out, k = [], 0
    for l in range(cfg.n_layers):
        if l in cfg.moe_layers:
            out.append(-1)
        else:
            out.append(k)
            k += 1
    return out


# ---- the model ------------------------------------------------------------------------

class ReferenceModel:
    """Step-by-step NumPy twin of the megakernel (fp32 activations, bf16 weights)."""

    def __init__(self, cfg, batch: int, weights: Dict[str, np.ndarray], requests: Requests = Requests()):
        self.cfg, self.B, self.req = cfg, batch, requests
        self.W = {k: bf16_bits_to_f32(np.asarray(v)) for k, v in weights.items()}
        c = cfg
        self.k_cache = np.zeros((c.n_layers, batch, c.max_seq, c.n_kv_heads, c.head_dim), np.float32)
        self.v_cache = np.zeros_like(self.k_cache)
        self.gen = np.zeros(batch, np.int64)
        self.pos = np.zeros(batch, np.int64)
        self.tokens = np.array([requests.prompt_token(b, 0, c.vocab) for b in range(batch)], np.int64)
        self.req_len = np.array([requests.req_len(b, 0, c.max_seq) for b in range(batch)], np.int64)
        self.moe_idx, self.dense_idx = moe_index(cfg), dense_index(cfg)
        self.last_routing: Dict[int, np.ndarray] = {}

    # -- pieces --
    def _rms(self, h, w):
        return h / np.sqrt((h.astype(np.float64) ** 2).mean(-1, keepdims=True) + self.cfg.rms_eps).astype(np.float32) * w

    def _rope(self, v, pos):
        """v: [B, nheads, hd]; rotate pairs (i, i + hd/2)."""
        hd = self.cfg.head_dim
        half = hd // 2
        inv = self.cfg.rope_theta ** (-2.0 * np.arange(half) / hd)
        ang = pos[:, None].astype(np.float64) * inv[None, :]            # [B, half]
        c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
        a, b = v[..., :half], v[..., half:]
        return np.concatenate([a * c - b * s, b * c + a * s], -1).astype(np.float32)

    def _swiglu(self, x, wg, wu):
        g, u = x @ wg.T, x @ wu.T
        return (g / (1.0 + np.exp(-g))) * u

    def step(self) -> Dict[str, np.ndarray]:
        """One decode step for all slots; returns logits [B, V] and next tokens [B]."""
        c, W = self.cfg, self.W
        h = W["embed"][self.tokens].astype(np.float32)
        for l in range(c.n_layers):
            h = h + self.attn_delta(l, self._rms(h, W["attn_norm"][l]))
            h = h + self.mlp_delta(l, self._rms(h, W["mlp_norm"][l]))
        return self._head(h)

    def attn_delta(self, l: int, xn):
        """Layer l's attention output projection W_o attn(xn) (appends k, v to the cache)."""
        c, W, B = self.cfg, self.W, self.B
        hd, nh, nkv = c.head_dim, c.n_heads, c.n_kv_heads
        rep = nh // nkv
        qkv = xn @ W["qkv"][l].T
        q = qkv[:, : nh * hd].reshape(B, nh, hd)
        k = qkv[:, nh * hd: (nh + nkv) * hd].reshape(B, nkv, hd)
        v = qkv[:, (nh + nkv) * hd:].reshape(B, nkv, hd)
        q, k = self._rope(q, self.pos), self._rope(k, self.pos)
        for b in range(B):
            self.k_cache[l, b, self.pos[b]] = k[b]
            self.v_cache[l, b, self.pos[b]] = v[b]
        att = np.zeros((B, nh, hd), np.float32)
        for b in range(B):
            T = self.pos[b] + 1
            for qh in range(nh):
                g = qh // rep
                kk = self.k_cache[l, b, :T, g]                          # [T, hd]
                s = (kk @ q[b, qh]) / np.sqrt(hd)
                p = np.exp(s - s.max())
                att[b, qh] = (p @ self.v_cache[l, b, :T, g]) / p.sum()
        return att.reshape(B, nh * hd) @ W["o"][l].T

    def mlp_delta(self, l: int, xn):
        """Layer l's MLP (dense or MoE) output for the normalised input xn."""
        c, W, B = self.cfg, self.W, self.B
        mi = self.moe_idx[l]
        if mi < 0:
            di = self.dense_idx[l]
            return self._swiglu(xn, W["gate"][di], W["up"][di]) @ W["down"][di].T
        logits = xn @ W["router"][mi].T                              # [B, E]
        out = np.zeros((B, c.hidden), np.float32)
        routing = np.zeros((B, c.top_k), np.int64)
        for b in range(B):
            order = np.lexsort((np.arange(c.n_experts), -logits[b]))[: c.top_k]
            routing[b] = order
            sel = logits[b, order]
            wts = np.exp(sel - sel.max())
            wts /= wts.sum()
            for e, wt in zip(order, wts):
                y = self._swiglu(xn[b:b + 1], W["egate"][mi, e], W["eup"][mi, e]) @ W["edown"][mi, e].T
                out[b] += wt * y[0]
        self.last_routing[l] = routing
        return out

    def _head(self, h) -> Dict[str, np.ndarray]:
        xn = self._rms(h, self.W["final_norm"])
        logits = xn @ self.W["lm_head"].T
        nxt = np.argmax(logits, -1)
        self._advance(nxt)
        return {"logits": logits.astype(np.float32), "tokens": nxt.astype(np.int64)}

    def _advance(self, nxt):
        c = self.cfg
        for b in range(self.B):
            self.pos[b] += 1
            if self.pos[b] >= self.req_len[b]:
                self.gen[b] += 1
                self.pos[b] = 0
                self.tokens[b] = self.req.prompt_token(b, int(self.gen[b]), c.vocab)
                self.req_len[b] = self.req.req_len(b, int(self.gen[b]), c.max_seq)
            else:
                self.tokens[b] = nxt[b]

    def run(self, steps: int) -> Dict[str, np.ndarray]:
        return _run_steps(self, steps)


# ---- tensor parallelism (graph.py "Tensor parallelism") ----------------------------------

# weights split per rank: name -> (axis, part); the others are replicated
_TP_SPLIT = {"qkv": (1, "qkv"), "o": (2, "q"), "gate": (1, "ffn"), "up": (1, "ffn"), "down": (2, "ffn"),
             "egate": (2, "effn"), "eup": (2, "effn"), "edown": (3, "effn")}


def tp_local_config(cfg, rank: int, ranks: int):
    """The model shape rank `rank` of `ranks` computes with (graph.tp_shard): its q / kv
    heads, ffn and expert_ffn columns; hidden, vocab and the rest unchanged.  ranks == 1:
    cfg itself."""
    from dataclasses import replace
    from .graph import tp_shard
    if ranks == 1:
        return cfg
    sh = tp_shard(cfg, rank, ranks)
    dense = any(not cfg.is_moe(l) for l in range(cfg.n_layers))
    return replace(cfg, n_heads=sh.q_hi - sh.q_lo, n_kv_heads=sh.kv_hi - sh.kv_lo,
                   ffn=sh.ffn_cols if dense else cfg.ffn,
                   expert_ffn=sh.expert_ffn_cols if cfg.moe_layers else cfg.expert_ffn)


def _tp_index(cfg, rank: int, ranks: int, part: str):
    """Indices (along the split axis) of rank's slice of `part`."""
    from .graph import tp_shard
    sh = tp_shard(cfg, rank, ranks)
    hd, nh, nkv = cfg.head_dim, cfg.n_heads, cfg.n_kv_heads
    if part == "q":
        return np.arange(sh.q_lo * hd, sh.q_hi * hd)
    if part == "qkv":
        return np.concatenate([np.arange(sh.q_lo * hd, sh.q_hi * hd),
                               nh * hd + np.arange(sh.kv_lo * hd, sh.kv_hi * hd),
                               (nh + nkv) * hd + np.arange(sh.kv_lo * hd, sh.kv_hi * hd)])
    n = sh.ffn_cols if part == "ffn" else sh.expert_ffn_cols
    return np.arange(rank * n, (rank + 1) * n)


def _tp_parts(cfg):
    dense = any(not cfg.is_moe(l) for l in range(cfg.n_layers))
    return {k: v for k, v in _TP_SPLIT.items()
            if (v[1] != "ffn" or dense) and (v[1] != "effn" or cfg.moe_layers)}


def shard_weights(cfg, weights: Dict[str, Any], rank: int, ranks: int) -> Dict[str, Any]:
    """Rank `rank`'s weights (same keys, shapes of weight_shapes(tp_local_config(...)))
    cut from the FULL weights (numpy or cupy): q|k|v rows of its heads, W_o columns of its
    q heads, gate/up rows and down columns of its ffn share, the same per expert; the rest
    replicated (the same arrays)."""
    if ranks == 1:
        return dict(weights)
    out = dict(weights)
    for name, (axis, part) in _tp_parts(cfg).items():
        a = weights[name]
        xp = _xp(a)
        idx = _tp_index(cfg, rank, ranks, part)
        if part in ("q", "ffn", "effn"):          # contiguous: a view-free slice copy
            sl = [slice(None)] * a.ndim
            sl[axis] = slice(int(idx[0]), int(idx[-1]) + 1)
            out[name] = xp.ascontiguousarray(a[tuple(sl)])
        else:
            out[name] = xp.ascontiguousarray(xp.take(a, xp.asarray(idx), axis=axis))
    return out


def unshard_weights(cfg, shards: List[Dict[str, Any]]) -> Dict[str, np.ndarray]:
    """Inverse of shard_weights over all ranks (tests): the full weights, numpy."""
    R = len(shards)
    out = {k: np.asarray(v) for k, v in shards[0].items()}
    for name, (axis, part) in _tp_parts(cfg).items():
        full_n = {"q": cfg.n_heads * cfg.head_dim, "qkv": cfg.qkv_dim, "ffn": cfg.ffn,
                  "effn": cfg.expert_ffn}[part]
        shape = list(np.asarray(shards[0][name]).shape)
        shape[axis] = full_n
        a = np.zeros(shape, np.asarray(shards[0][name]).dtype)
        for r in range(R):
            idx = _tp_index(cfg, r, R, part)
            sl = [slice(None)] * a.ndim
            sl[axis] = idx
            a[tuple(sl)] = np.asarray(shards[r][name])
        out[name] = a
    return out


class TPReferenceModel:
    """NumPy twin of the tensor-parallel megakernel: every rank computes its partial sums
    with its shard (`shard_weights`); after attn_o and after the MLP / experts the
    residual gets the sum of the R partials in rank order (what the consuming rmsnorm
    does on every rank), so h is the same on every rank."""

    def __init__(self, cfg, batch: int, weights: Dict[str, np.ndarray], ranks: int,
                 requests: Requests = Requests()):
        self.cfg, self.B, self.ranks = cfg, batch, ranks
        self.parts = [ReferenceModel(tp_local_config(cfg, r, ranks), batch,
                                     shard_weights(cfg, weights, r, ranks), requests) for r in range(ranks)]

    def step(self) -> Dict[str, np.ndarray]:
        c, P0 = self.cfg, self.parts[0]
        W = P0.W                                      # replicated: embed, norms, router, lm_head
        h = W["embed"][P0.tokens].astype(np.float32)
        for l in range(c.n_layers):
            xn = P0._rms(h, W["attn_norm"][l])
            h = h + _sum_in_order([p.attn_delta(l, xn) for p in self.parts])
            xn = P0._rms(h, W["mlp_norm"][l])
            h = h + _sum_in_order([p.mlp_delta(l, xn) for p in self.parts])
        out = P0._head(h)
        for p in self.parts[1:]:
            p._advance(out["tokens"])
        return out

    def run(self, steps: int) -> Dict[str, np.ndarray]:
        return _run_steps(self, steps)


def _run_steps(model, steps: int) -> Dict[str, np.ndarray]:
    """`steps` decode steps of a reference model: stacked logits and tokens."""
    logits, toks = [], []
    for _ in range(steps):
        r = model.step()
        logits.append(r["logits"])
        toks.append(r["tokens"])
    return {"logits": np.stack(logits), "tokens": np.stack(toks)}


def _sum_in_order(parts):
    s = np.zeros_like(parts[0], dtype=np.float32)
    for p in parts:
        s = s + p.astype(np.float32)
    return s
