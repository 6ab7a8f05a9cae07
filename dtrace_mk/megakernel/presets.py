"""Model presets of the reference megakernel (a Llama-style decoder, optionally MoE).

`PRESETS[name]` is a `ModelConfig`; `get_preset(name)` raises a `UserError` naming the
known presets.  Dimensions:

| preset    | hidden | layers | heads/kv | head_dim | ffn  | vocab | max_seq | MoE                                  |
|-----------|--------|--------|----------|----------|------|-------|---------|--------------------------------------|
| tiny      | 256    | 2      | 4 / 2    | 64       | 512  | 1024  | 128     | -                                    |
| small-moe | 512    | 4      | 8 / 4    | 64       | 1024 | 4096  | 256     | layers 1,3: 8 experts, top-2, ffn 256 |
| 1b        | 2048   | 16     | 32 / 8   | 64       | 8192 | 32000 | 2048    | -                                    |
| wide-tp   | 512    | 2      | 64 / 8   | 64       | 4096 | 1024  | 128     | -  (comm_tile_n 512)                 |

`1b` has Llama-3.2-1B's shapes (hidden 2048, 16 layers, GQA 32/8, head_dim 64, ffn 8192)
except the vocabulary: 32000 (Llama-2 sized) instead of 128256, which keeps the LM
head at 500 tiles of 64 columns instead of 2004.

`wide-tp` exists for many-rank tensor-parallel sims (the collector's benchmark): 64 q
heads split 1..64 ways (kv heads split up to 8 ranks, replicated beyond), ffn 4096 = 64
tiles, one comm task per destination rank (comm_tile_n = hidden).  It is not a real
model shape (q_dim 4096 > hidden 512) and has no GPU reference.

Tensor-parallel splits (`graph.tp_shard`): R ranks need n_heads % R == 0, n_kv_heads %
R == 0 or R % n_kv_heads == 0, (ffn / tile_n) % R == 0 (dense layers), (expert_ffn /
tile_n) % R == 0 (MoE).  tiny: 1, 2, 4 ranks; small-moe: 1, 2, 4; 1b: 1, 2, 4, 8, 16, 32;
wide-tp: 1, 2, 4, ..., 64.

Lowering options (graph.py, "Fused norm and split-K"): `fuse_norm` drops the RMSNorm
levels (each consumer tile normalises its input row itself), `split_k = S` splits the
attn_o and mlp_down projections into S K-slices with deterministic partial buffers.
Both are on for `1b` (fuse_norm, split_k 4; `dataclasses.replace(cfg, fuse_norm=False,
split_k=1)` is the previous lowering), off elsewhere; both are single-rank
only.  `qkv_tile_n` (fused lowering only): `1b` uses 24-column qkv tiles, 128 per layer
instead of 48, so the qkv level streams W_qkv on 128 SMs instead of 48 (H200, 2026-11-30:
1351 vs 1393 us/step; 32 columns 1355, 16 columns 1467).  `rope_in_attn` (fused lowering
only, on for `1b` since session 6): no rope_kv_append level; each attn task ropes its
slot's q heads and k head and appends its cache row before attending (H200, 2026-11-30:
1235 vs 1311 us/step, one dependency level less per layer).  `slice_events` (fused
lowering with split_k >= 2, off everywhere): each mlp_down K-slice waits only for the gate_up
tiles of its slice, and the residual h lives in two buffers by layer parity so that down's
K-slice 0 can commit before the other slices' gate_up tiles have read h.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Tuple

from ..errors import UserError


# Workers of the sim backend when no GPU says otherwise: one per SM of an H200.
SIM_WORKERS = 132

@dataclass(frozen=True)
class ModelConfig:
    name: str
    hidden: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    max_seq: int
    moe_layers: Tuple[int, ...] = ()     # layers whose MLP is MoE
    n_experts: int = 0
    top_k: int = 0
    expert_ffn: int = 0
    rms_eps: float = 1e-5
    rope_theta: float = 10000.0
    tile_n: int = 64                     # output columns per matmul tile
    comm_tile_n: int = 0                 # columns per all-reduce comm task (0: tile_n)
    # lowering options (graph.py "Fused norm and split-K"); single rank, dense models only
    fuse_norm: bool = False              # RMSNorm computed in its consumers' prologue
    split_k: int = 1                     # K splits of attn_o / mlp_down (> 1 needs fuse_norm)
    qkv_tile_n: int = 0                  # q|k|v columns per qkv tile, fused lowering only (0: tile_n)
    rope_in_attn: bool = False           # fused lowering only: each attn task ropes its q/k and appends
                                         # its kv head's cache row itself (no rope_kv_append level)
    head_events: bool = False            # fused lowering only: attn waits for its kv group's qkv tiles,
                                         # attn_o K-slice k for the attn tasks of its heads only
    slice_events: bool = False           # fused lowering only: mlp_down K-slice s waits for the gate_up
                                         # tiles of its slice only; h is double-buffered by layer parity

    def __post_init__(self) -> None:
        def bad(field: str, msg: str) -> UserError:
            return UserError(f"model {self.name!r}: {field}: {msg}")
        for f in ("hidden", "n_layers", "n_heads", "n_kv_heads", "head_dim", "ffn", "vocab",
                  "max_seq", "tile_n"):
            if getattr(self, f) < 1:
                raise bad(f, f"expected >= 1, got {getattr(self, f)}")
        if self.n_heads % self.n_kv_heads:
            raise bad("n_kv_heads", f"must divide n_heads={self.n_heads}, got {self.n_kv_heads}")
        for f in ("hidden", "ffn", "vocab"):
            if getattr(self, f) % self.tile_n:
                raise bad(f, f"must be a multiple of tile_n={self.tile_n}, got {getattr(self, f)}")
        if self.comm_tile_n < 0 or (self.comm_tile_n and self.hidden % self.comm_tile_n):
            raise bad("comm_tile_n", f"must divide hidden={self.hidden} (0: tile_n), got {self.comm_tile_n}")
        for l in self.moe_layers:
            if not 0 <= l < self.n_layers:
                raise bad("moe_layers", f"layer {l} is outside 0..{self.n_layers - 1}")
        if self.split_k < 1:
            raise bad("split_k", f"expected >= 1, got {self.split_k}")
        if self.split_k > 1:
            if not self.fuse_norm:
                raise bad("split_k", f"split_k={self.split_k} needs fuse_norm=True (the fused norm "
                          f"prologue sums the split partials)")
        if self.qkv_tile_n:   # used by the fused lowering only (ignored by the others, like split_k)
            if self.qkv_tile_n < 0:
                raise bad("qkv_tile_n", f"expected >= 0, got {self.qkv_tile_n}")
            if self.qkv_dim % self.qkv_tile_n:
                raise bad("qkv_tile_n", f"must divide qkv_dim={self.qkv_dim}, got {self.qkv_tile_n}")
        if self.head_events and self.fuse_norm:
            Tq = self.qkv_tile_n or self.tile_n
            if self.head_dim % Tq:
                raise bad("head_events", f"qkv tiles must not straddle heads: {Tq} columns per tile "
                          f"do not divide head_dim={self.head_dim}")
            if self.n_kv_heads % self.split_k:
                raise bad("head_events", f"split_k={self.split_k} must divide n_kv_heads={self.n_kv_heads}")
        if self.slice_events and self.fuse_norm:
            if self.split_k < 2:
                raise bad("slice_events", f"needs split_k >= 2 (mlp_down's K-slices), got {self.split_k}")
            if (self.ffn // self.split_k) % self.tile_n:
                raise bad("slice_events", f"gate_up tiles must not straddle K-slices: {self.tile_n} columns "
                          f"per tile do not divide ffn / split_k = {self.ffn // self.split_k}")
        if self.fuse_norm:
            if self.moe_layers:
                raise bad("fuse_norm", "not supported with MoE layers (their norms fold the expert partials)")
            if self.hidden % 4:
                raise bad("fuse_norm", f"needs hidden % 4 == 0, got {self.hidden}")
        if self.moe_layers:
            if self.n_experts < 1 or not 1 <= self.top_k <= self.n_experts:
                raise bad("top_k", f"expected 1..n_experts={self.n_experts}, got {self.top_k}")
            if self.expert_ffn < 1 or self.expert_ffn % self.tile_n:
                raise bad("expert_ffn", f"must be a positive multiple of tile_n={self.tile_n}, "
                          f"got {self.expert_ffn}")

    @property
    def q_dim(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_dim

    @property
    def qkv_dim(self) -> int:
        return self.q_dim + 2 * self.kv_dim

    @property
    def comm_tile(self) -> int:
        """Columns per all-reduce comm task (tensor-parallel graphs)."""
        return self.comm_tile_n or self.tile_n

    def is_moe(self, layer: int) -> bool:
        return layer in self.moe_layers


PRESETS: Dict[str, ModelConfig] = {
    "tiny": ModelConfig("tiny", hidden=256, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=64,
                        ffn=512, vocab=1024, max_seq=128),
    "small-moe": ModelConfig("small-moe", hidden=512, n_layers=4, n_heads=8, n_kv_heads=4, head_dim=64,
                             ffn=1024, vocab=4096, max_seq=256, moe_layers=(1, 3), n_experts=8,
                             top_k=2, expert_ffn=256),
    "1b": ModelConfig("1b", hidden=2048, n_layers=16, n_heads=32, n_kv_heads=8, head_dim=64,
                      ffn=8192, vocab=32000, max_seq=2048, rope_theta=500000.0,
                      fuse_norm=True, split_k=4, qkv_tile_n=24, rope_in_attn=True),
    # sim-scale preset for many-rank tensor parallelism (up to 64 ranks); not Llama-shaped
    "wide-tp": ModelConfig("wide-tp", hidden=512, n_layers=2, n_heads=64, n_kv_heads=8, head_dim=64,
                           ffn=4096, vocab=1024, max_seq=128, comm_tile_n=512),
}


def get_preset(name: str) -> ModelConfig:
    try:
        return PRESETS[name]
    except KeyError:
        raise UserError(f"--model: unknown preset {name!r} (known: {', '.join(PRESETS)})") from None
