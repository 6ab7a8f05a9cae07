"""Kernel-per-operator baseline of the reference megakernel (CuPy), eager or as a
captured CUDA graph.

Same model, weights, buffers and task bodies as the megakernel (kernels/baseline.cu
calls mk_ops.cuh), one launch per operator:

    bl = Baseline(mk)                       # shares mk's weights and buffers
    mk.reset(); toks = bl.run(steps)        # eager launches
    mk.reset(); toks = bl.run(steps, graph=True)   # one captured step, replayed
    bl.run(steps, matmul="cublas")          # projections through cuBLAS (cupy.matmul)

`matmul="cublas"` replaces the matvec kernels by cuBLAS GEMMs (bf16 weights upcast once
to fp32 (2x the weight bytes), fp32 activations) for the timing comparison; its
rounding differs from the shared task bodies, so only the default build promises the
megakernel's exact tokens.
"""
from __future__ import annotations

import time
from typing import Any, Dict, List, Optional

import numpy as np

from .gpu import MK_THREADS, Megakernel, load_module, set_smem
from .graph import fused_lowering
from .reference import dense_index, moe_index

ROWS = MK_THREADS // 32        # output rows per block of a projection launch (warp per row)


class Baseline:
    def __init__(self, mk: Megakernel, matmul: str = "kernels"):
        import cupy as cp
        self.cp, self.mk, self.cfg = cp, mk, mk.cfg
        if matmul not in ("kernels", "cublas"):
            raise ValueError(matmul)
        self.matmul = matmul
        arch = mk.arch
        self.module = load_module(arch, "baseline.cu")
        self.k = {n: self.module.get_function(n) for n in
                  ("k_norm", "k_proj", "k_gate_up", "k_rope", "k_attn", "k_router", "k_expert", "k_finish",
                   "k_fused_proj", "k_fused_gate_up", "k_split_proj")}
        for n in ("k_attn", "k_router", "k_expert", "k_proj", "k_gate_up", "k_fused_proj", "k_fused_gate_up",
                  "k_split_proj"):
            set_smem(self.k[n], mk.smem)
        self.step_dev = cp.zeros(1, cp.int32)
        self._graph = None
        self._f32: Dict[str, Any] = {}

    # -- one decode step as a list of launches --------------------------------------
    def _step(self, params) -> None:
        cp, c, mk, k = self.cp, self.cfg, self.mk, self.k
        B, H, L = mk.B, c.hidden, c.n_layers
        W, buf = mk.weights, mk.buf
        ptr = lambda a, off=0: np.uint64(int(a.data.ptr) + off)  # noqa: E731
        i32 = np.int32
        blk = (MK_THREADS,)
        mi_of, di_of = moe_index(c), dense_index(c)
        sm = mk.smem
        fold = -1

        def proj(w_arr, w_off_elems, K, x, y, N, acc):
            """y [B, N] (+)= x [B, K] @ W[off: off + N*K].reshape(N, K).T"""
            if self.matmul == "cublas":
                Wf = self._w32(w_arr).reshape(-1)[w_off_elems: w_off_elems + N * K].reshape(N, K)
                r = cp.matmul(x, Wf.T)
                if acc:
                    y += r
                else:
                    y[...] = r
                return
            k["k_proj"]((N // ROWS,), blk, (params, ptr(w_arr, 2 * w_off_elems), i32(K), ptr(x), ptr(y), i32(N),
                                             i32(ROWS), i32(1 if acc else 0)), shared_mem=sm)

        if fused_lowering(c, mk.graph.ranks):
            if self.matmul == "cublas":
                raise ValueError("matmul='cublas' follows the standard lowering only (fuse_norm is on)")
            self._step_fused(params, proj)
            return

        for l in range(L):
            k["k_norm"]((1,), blk, (params, i32(0), i32(l), i32(fold)))
            fold = -1
            proj(W["qkv"], l * c.qkv_dim * H, H, buf["xn"], buf["qkv"][l], c.qkv_dim, False)
            k["k_rope"]((c.n_kv_heads,), blk, (params, i32(l)))
            k["k_attn"]((c.n_kv_heads, B), blk, (params, i32(l)), shared_mem=sm)
            proj(W["o"], l * H * c.q_dim, c.q_dim, buf["attn"][l], buf["h"], H, True)
            k["k_norm"]((1,), blk, (params, i32(1), i32(l), i32(-1)))
            if mi_of[l] < 0:
                di = di_of[l]
                F = c.ffn
                if self.matmul == "cublas":
                    self._cublas_gate_up(di, l)
                else:
                    k["k_gate_up"]((F // ROWS,), blk, (params, ptr(W["gate"], 2 * di * F * H), ptr(W["up"], 2 * di * F * H),
                                                      i32(H), ptr(buf["xn"]), ptr(buf["act"], 4 * l * B * F), i32(F), i32(ROWS)), shared_mem=sm)
                proj(W["down"], di * H * F, F, buf["act"][l], buf["h"], H, True)
            else:
                mi = mi_of[l]
                et = c.expert_ffn // c.tile_n
                k["k_router"]((1,), blk, (params, i32(mi), i32(l), self.step_dev), shared_mem=sm)
                k["k_expert"]((c.n_experts * et,), blk, (params, i32(mi)), shared_mem=sm)
                fold = mi
        k["k_norm"]((1,), blk, (params, i32(2), i32(-1), i32(fold)))
        proj(W["lm_head"], 0, H, buf["xn"], buf["logits"], c.vocab, False)
        k["k_finish"]((1,), blk, (params, self.step_dev))

    def _step_fused(self, params, proj) -> None:
        """The fused-norm / split-K lowering (graph.py build_fused), one launch per level:
        the same task bodies as the megakernel's (op_fused_proj, op_fused_gate_up,
        op_split_proj), so the same bits."""
        c, mk, k = self.cfg, self.mk, self.k
        B, H, L, S, F = mk.B, c.hidden, c.n_layers, c.split_k, c.ffn
        W, buf = mk.weights, mk.buf
        ptr = lambda a, off=0: np.uint64(int(a.data.ptr) + off)  # noqa: E731
        i32 = np.int32
        blk = (MK_THREADS,)
        sm = mk.smem
        di_of = dense_index(c)
        k["k_norm"]((1,), blk, (params, i32(0), i32(0), i32(-1)))          # embedding (+ unused norm)
        for l in range(L):
            k["k_fused_proj"]((c.qkv_dim // ROWS,), blk, (params, ptr(W["qkv"], 2 * l * c.qkv_dim * H), ptr(buf["qkv"][l]),
                                                          i32(c.qkv_dim), i32(ROWS), i32(0), i32(l), i32(S)), shared_mem=sm)
            k["k_rope"]((c.n_kv_heads,), blk, (params, i32(l)))
            k["k_attn"]((c.n_kv_heads, B), blk, (params, i32(l)), shared_mem=sm)
            di = di_of[l]
            if S > 1:
                k["k_split_proj"]((H // ROWS, S), blk, (params, ptr(W["o"], 2 * l * H * c.q_dim), i32(c.q_dim),
                                                        ptr(buf["attn"][l]), i32(2), i32(S), i32(ROWS), i32(0), i32(l)),
                                  shared_mem=sm)
            else:
                proj(W["o"], l * H * c.q_dim, c.q_dim, buf["attn"][l], buf["h"], H, True)
            k["k_fused_gate_up"]((F // ROWS,), blk, (params, ptr(W["gate"], 2 * di * F * H), ptr(W["up"], 2 * di * F * H),
                                                     ptr(buf["act"], 4 * l * B * F), i32(ROWS), i32(l), i32(S)), shared_mem=sm)
            if S > 1:
                k["k_split_proj"]((H // ROWS, S), blk, (params, ptr(W["down"], 2 * di * H * F), i32(F),
                                                        ptr(buf["act"][l]), i32(l & 1), i32(S), i32(ROWS), i32(1), i32(l)),
                                  shared_mem=sm)
            else:
                proj(W["down"], di * H * F, F, buf["act"][l], buf["h"], H, True)
        k["k_fused_proj"]((c.vocab // ROWS,), blk, (params, ptr(W["lm_head"]), ptr(buf["logits"]), i32(c.vocab),
                                                     i32(ROWS), i32(2), i32(L), i32(S)), shared_mem=sm)
        k["k_finish"]((1,), blk, (params, self.step_dev))

    # -- cuBLAS variant ------------------------------------------------------------------
    def _w32(self, w_arr):
        key = int(w_arr.data.ptr)
        if key not in self._f32:
            from .reference import bf16_bits_to_f32
            self._f32[key] = bf16_bits_to_f32(w_arr)
        return self._f32[key]

    def _cublas_gate_up(self, di, l):
        cp, mk, c = self.cp, self.mk, self.cfg
        x = mk.buf["xn"]
        g = cp.matmul(x, self._w32(mk.weights["gate"])[di].T)
        u = cp.matmul(x, self._w32(mk.weights["up"])[di].T)
        mk.buf["act"][l] = g / (1.0 + cp.exp(-g)) * u

    # -- runs ------------------------------------------------------------------------------
    def run(self, steps: int, graph: bool = False, poison: bool = True) -> Dict[str, Any]:
        if graph and self.matmul == "cublas":
            raise ValueError("graph capture is built for matmul='kernels' only")
        """Decode `steps` steps from mk's current state; returns tokens [steps, B] and the
        elapsed device time (ms) of the timed part (graph capture excluded)."""
        cp, mk = self.cp, self.mk
        if poison:
            mk.poison()
        mk.out_tokens = cp.full((steps, mk.B), -1, cp.int32)
        mk.set_faults(None)
        params = mk._params(steps, steps)
        self._params = params
        self.step_dev[0] = mk.step
        stream = cp.cuda.Stream(non_blocking=True)
        start, end = cp.cuda.Event(), cp.cuda.Event()
        with stream:
            if graph:
                stream.begin_capture()
                self._step(params)
                g = stream.end_capture()
                self._graph = g
                start.record(stream)
                for _ in range(steps):
                    g.launch(stream)
                end.record(stream)
            else:
                start.record(stream)
                for _ in range(steps):
                    self._step(params)
                end.record(stream)
        end.synchronize()
        mk.step += steps
        return {"tokens": cp.asnumpy(mk.out_tokens), "logits": cp.asnumpy(mk.buf["logits"]),
                "elapsed_ms": cp.cuda.get_elapsed_time(start, end)}


# ---------------------------------------------------------------------------------------
# Tensor-parallel kernel-per-operator baseline: cuBLAS matmuls + NCCL all-reduces
# ---------------------------------------------------------------------------------------
# Megatron-style, the split rules of graph.tp_shard (graph.py module doc, "Tensor
# parallelism"): rank r owns q heads [q_lo, q_hi) and kv heads [kv_lo, kv_hi) (qkv is
# column-parallel, the rank's q|k|v rows of W_qkv), W_o is row-parallel over the rank's
# heads, the dense MLP's ffn columns are split in contiguous blocks of ffn/R (gate/up
# column-parallel, down row-parallel), embedding, norms and lm_head are replicated.  Two
# all-reduces (sum) per layer: after attn_o and after mlp_down; every rank then adds the
# residual and computes the same logits and token (no gather).  Each operator is one or a
# few CuPy launches (matmuls through cuBLAS in fp32 from the bf16 weights, upcast once),
# the all-reduces through NCCL (cupy.cuda.nccl) on the compute stream.
#
# The same code runs on NumPy (xp=numpy, an `allreduce` callback): the CPU tests run R
# ranks as threads and check the tokens against the single-process ReferenceModel.

def tp_shard_weights(cfg, weights: Dict[str, Any], rank: int, ranks: int) -> Dict[str, Any]:
    """Rank `rank`'s shard of the full weights, cut exactly as the TP megakernel cuts them
    (reference.shard_weights: q|k|v rows of its heads, W_o columns of its q heads,
    gate/up rows and down columns of its contiguous ffn/R block; the rest replicated).
    Dense models only (MoE: UserError); a bad split is graph.tp_shard's UserError."""
    from ..errors import UserError
    from .graph import tp_shard
    from .reference import shard_weights
    if cfg.moe_layers:
        raise UserError(f"tensor-parallel baseline: model {cfg.name!r} has MoE layers; only "
                        f"dense models are built")
    tp_shard(cfg, rank, ranks)               # validates the split (also for ranks == 1)
    return shard_weights(cfg, weights, rank, ranks)


class NcclAllReduce:
    """In-place fp32 sum over the ranks of an mpi4py communicator (or a TPGroup's .comm)
    through cupy.cuda.nccl; the unique id is broadcast from rank 0 over MPI."""

    def __init__(self, comm):
        import os
        os.environ.setdefault("NCCL_NVLS_ENABLE", "0")   # NVLink multicast off (lent machines)
        import cupy as cp
        from cupy.cuda import nccl
        self.cp, self.nccl = cp, nccl
        comm = getattr(comm, "comm", comm)
        self.rank, self.ranks = comm.Get_rank(), comm.Get_size()
        uid = nccl.get_unique_id() if self.rank == 0 else None
        uid = comm.bcast(uid, root=0)
        self.nc = nccl.NcclCommunicator(self.ranks, uid, self.rank)

    def __call__(self, a) -> None:
        assert a.dtype == np.float32 and a.flags.c_contiguous
        stream = self.cp.cuda.get_current_stream().ptr
        self.nc.allReduce(a.data.ptr, a.data.ptr, a.size, self.nccl.NCCL_FLOAT32,
                          self.nccl.NCCL_SUM, stream)


class TPBaseline:
    """One rank of the tensor-parallel per-operator baseline.

        bl = TPBaseline(cfg, batch, rank, ranks, comm=mpi_comm)      # CuPy + NCCL
        out = bl.run(steps)     # {"tokens" [steps, B], "logits" [B, V], "elapsed_ms"}

    `weights`: the FULL make_weights(cfg, seed) dict (drawn here when None) -- sharded
    with `tp_shard_weights`; `xp=numpy` with an `allreduce(array)` callback (in-place sum
    over the ranks) runs it on the CPU; ranks == 1 needs no all-reduce."""

    def __init__(self, cfg, batch: int, rank: int = 0, ranks: int = 1, seed: int = 0,
                 weights: Optional[Dict[str, Any]] = None, comm=None, allreduce=None, xp=None,
                 requests=None):
        from .reference import Requests, bf16_bits_to_f32, make_weights
        if xp is None:
            import cupy as xp
        self.xp, self.cfg, self.B = xp, cfg, batch
        self.rank, self.ranks = rank, ranks
        self.req = requests or Requests()
        if ranks > 1 and allreduce is None:
            if comm is None:
                raise ValueError("TPBaseline: ranks > 1 needs comm (NCCL) or allreduce")
            allreduce = NcclAllReduce(comm)
        self.allreduce = allreduce
        from .graph import tp_shard
        self.shard = tp_shard(cfg, rank, ranks)
        w = weights if weights is not None else make_weights(cfg, seed)
        w = tp_shard_weights(cfg, w, rank, ranks)
        self.W = {k: xp.ascontiguousarray(bf16_bits_to_f32(xp.asarray(v))) for k, v in w.items()}
        c, sh = cfg, self.shard
        self.hq, self.hkv = sh.q_hi - sh.q_lo, sh.kv_hi - sh.kv_lo
        rep = c.n_heads // c.n_kv_heads
        self.kv_of_q = xp.asarray(np.arange(sh.q_lo, sh.q_hi) // rep - sh.kv_lo)
        half = c.head_dim // 2
        inv = c.rope_theta ** (-2.0 * np.arange(half) / c.head_dim)
        ang = np.arange(c.max_seq, dtype=np.float64)[:, None] * inv[None, :]
        self.cos = xp.asarray(np.cos(ang).astype(np.float32))
        self.sin = xp.asarray(np.sin(ang).astype(np.float32))
        self.reset()

    def reset(self) -> None:
        xp, c, B = self.xp, self.cfg, self.B
        self.k_cache = xp.zeros((c.n_layers, B, c.max_seq, self.hkv, c.head_dim), xp.float32)
        self.v_cache = xp.zeros_like(self.k_cache)
        self.pos = np.zeros(B, np.int64)
        self.gen = np.zeros(B, np.int64)
        self.req_len = np.array([self.req.req_len(b, 0, c.max_seq) for b in range(B)], np.int64)
        self.tokens = xp.asarray(np.array([self.req.prompt_token(b, 0, c.vocab) for b in range(B)],
                                          np.int64))

    # -- operators ------------------------------------------------------------------------
    def _rms(self, h, w):
        xp = self.xp
        ms = (h * h).mean(-1, keepdims=True)
        return h / xp.sqrt(ms + xp.float32(self.cfg.rms_eps)) * w

    def _rope(self, v, cos, sin):
        half = self.cfg.head_dim // 2
        a, b = v[..., :half], v[..., half:]
        return self.xp.concatenate([a * cos - b * sin, b * cos + a * sin], -1)

    def _sum(self, part):
        if self.ranks > 1:
            self.allreduce(part)
        return part

    def _schedule(self, steps: int):
        """Slot bookkeeping for `steps` steps, on the host (it does not depend on the
        tokens), uploaded once: per step the positions [B], the longest prefix T, which
        slots are refilled after it and their prompt tokens.  Advances the host state."""
        c, B = self.cfg, self.B
        pos = np.zeros((steps, B), np.int64)
        done = np.zeros((steps, B), bool)
        prompt = np.zeros((steps, B), np.int64)
        for k in range(steps):
            pos[k] = self.pos
            self.pos += 1
            for b in np.nonzero(self.pos >= self.req_len)[0]:
                done[k, b] = True
                self.gen[b] += 1
                self.pos[b] = 0
                prompt[k, b] = self.req.prompt_token(int(b), int(self.gen[b]), c.vocab)
                self.req_len[b] = self.req.req_len(int(b), int(self.gen[b]), c.max_seq)
        xp = self.xp
        return ([int(p.max()) + 1 for p in pos], xp.asarray(pos), xp.asarray(done),
                xp.asarray(prompt))

    def step(self, T: int, pos, done, prompt):
        """One decode step (positions `pos` [B], longest prefix T; after it the slots
        `done` get `prompt`, the others the argmax); returns the argmax tokens [B]."""
        xp, c, W, B = self.xp, self.cfg, self.W, self.B
        hd, hq, hkv = c.head_dim, self.hq, self.hkv
        cos, sin = self.cos[pos][:, None, :], self.sin[pos][:, None, :]
        rows = xp.arange(B)
        mask = (xp.arange(T)[None, :] > pos[:, None])[:, None, :]            # [B, 1, T]
        scale = xp.float32(1.0 / np.sqrt(hd))
        dense = dense_index(c)
        h = W["embed"][self.tokens]
        for l in range(c.n_layers):
            xn = self._rms(h, W["attn_norm"][l])
            qkv = xn @ W["qkv"][l].T
            q = self._rope(qkv[:, : hq * hd].reshape(B, hq, hd), cos, sin)
            k = self._rope(qkv[:, hq * hd: (hq + hkv) * hd].reshape(B, hkv, hd), cos, sin)
            v = qkv[:, (hq + hkv) * hd:].reshape(B, hkv, hd)
            self.k_cache[l, rows, pos] = k
            self.v_cache[l, rows, pos] = v
            K = self.k_cache[l, :, :T][:, :, self.kv_of_q]          # [B, T, hq, hd]
            V = self.v_cache[l, :, :T][:, :, self.kv_of_q]
            s = xp.einsum("bhd,bthd->bht", q, K) * scale
            s = xp.where(mask, xp.float32(-np.inf), s)
            p = xp.exp(s - s.max(-1, keepdims=True))
            att = xp.einsum("bht,bthd->bhd", p, V) / p.sum(-1)[..., None]
            h = h + self._sum(xp.ascontiguousarray(att.reshape(B, hq * hd) @ W["o"][l].T))
            xn = self._rms(h, W["mlp_norm"][l])
            di = dense[l]
            g = xn @ W["gate"][di].T
            u = xn @ W["up"][di].T
            act = g / (1.0 + xp.exp(-g)) * u
            h = h + self._sum(xp.ascontiguousarray(act @ W["down"][di].T))
        xn = self._rms(h, W["final_norm"])
        self.logits = xn @ W["lm_head"].T
        nxt = xp.argmax(self.logits, -1).astype(xp.int64)
        self.tokens = xp.where(done, prompt, nxt)
        return nxt

    def run(self, steps: int) -> Dict[str, Any]:
        """`steps` decode steps from the current state; elapsed_ms of the device (CuPy
        events) or wall time (NumPy)."""
        xp = self.xp
        toks = []
        Ts, pos, done, prompt = self._schedule(steps)
        if xp is np:
            t0 = time.perf_counter()
            for k in range(steps):
                toks.append(self.step(Ts[k], pos[k], done[k], prompt[k]))
            return {"tokens": np.stack(toks).astype(np.int64), "logits": self.logits,
                    "elapsed_ms": (time.perf_counter() - t0) * 1e3}
        start, end = xp.cuda.Event(), xp.cuda.Event()
        start.record()
        for k in range(steps):
            toks.append(self.step(Ts[k], pos[k], done[k], prompt[k]))
        end.record()
        end.synchronize()
        return {"tokens": xp.asnumpy(xp.stack(toks)).astype(np.int64),
                "logits": xp.asnumpy(self.logits),
                "elapsed_ms": xp.cuda.get_elapsed_time(start, end)}
