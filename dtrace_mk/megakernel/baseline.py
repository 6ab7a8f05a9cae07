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
                  ("k_norm", "k_proj", "k_gate_up", "k_rope", "k_attn", "k_router", "k_expert", "k_finish")}
        for n in ("k_attn", "k_router", "k_expert", "k_proj", "k_gate_up"):
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
