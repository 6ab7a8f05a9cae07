/* mk_ops.cuh: the task bodies of the reference decoder, one CTA each.
 *
 * Shared by the persistent megakernel (one task = one call) and by the
 * kernel-per-operator baseline (one launch per operator, blockIdx picks the tile), so
 * both builds compute the same function with the same arithmetic order.
 *
 * Weights are bf16 bits (unsigned short), row-major [out, in]; activations, KV cache
 * and logits are fp32.  Matmul tiles are matvec-style (decode, batch <= a few slots):
 * one warp per output row, 16-byte weight loads, fp32 accumulation, warp reduction.
 *
 * Reference: dtrace_mk/megakernel/reference.py computes the same function in NumPy.
 */
#ifndef DTMK_MK_OPS_CUH
#define DTMK_MK_OPS_CUH

#include "mk_common.cuh"

#define MK_MAXB 4          /* batch rows per register block in a matvec */
#define MK_MAX_TOPK 8

/* Everything a task body may touch.  Field order == gpu.PARAM_FIELDS (all 8 bytes):
 * the host uploads one u64 array and the kernel reads it as this struct. */
struct MkParams {
    /* model shape */
    dtmk_u64 hidden, n_layers, n_heads, n_kv_heads, head_dim, ffn, vocab, max_seq;
    dtmk_u64 n_experts, top_k, expert_ffn, batch, qkv_dim, tile_n;
    dtmk_u64 xs_off, xs_cap;                          /* activation staging in smem (floats) */
    dtmk_u64 rms_eps_bits, rope_theta_bits;           /* fp32 bits */
    /* weights (bf16 bits) */
    dtmk_u64 w_embed, w_attn_norm, w_qkv, w_o, w_mlp_norm, w_gate, w_up, w_down;
    dtmk_u64 w_router, w_egate, w_eup, w_edown, w_final_norm, w_lm_head;
    /* activations (fp32) */
    dtmk_u64 h, xn, qkv, attn, act, k_cache, v_cache, logits, tile_max, tile_arg, moe_part;
    /* routing: int32 experts / fp32 weights [n_moe][batch][top_k] */
    dtmk_u64 route_expert, route_weight;
    /* request slots (int32 [batch]) and the request generator (reference.Requests) */
    dtmk_u64 tokens, pos, req_gen, req_len, out_tokens, n_out_steps, req_seed, req_min, req_span;
    /* scheduler tables */
    dtmk_u64 tasks, n_tasks, events, event_triggers, n_events, plan_off, plan_tasks, n_workers, step_event;
    dtmk_u64 moe, n_moe, dyn_items, dyn_head, dyn_tail, dyn_cap;
    dtmk_u64 step0, n_steps;
    /* observation and faults */
    dtmk_u64 control, hook_ring, hook_head, hook_cap, trace_ring, trace_head, trace_cap;
    dtmk_u64 worker_state, faults, n_faults, rank, queue_threshold, filler_ns, prefetch;
    /* tensor parallelism (mk_comm.cuh; ranks == 1: the rest is 0) */
    dtmk_u64 ranks, tp_peers, tp_part, tp_recv, ev_comm_op;
    /* resident launches (megakernel.cu CTL_GATE; 0 / null otherwise): the streaming hook
     * ring's host tail u64[W], drops u64[W], steps finished u64[W] (published per step) */
    dtmk_u64 resident, hook_tail, hook_drop, steps_done;
};

/* ---- matvec rows ---------------------------------------------------------------- */
#define MK_UNROLL 8        /* 16-byte weight loads in flight per lane */

/* acc[b] = dot(W[row, :K], x[b, :K]) for b < nb (nb <= MK_MAXB), summed over the warp.
 * K % 8 == 0 and x rows 16-byte aligned; x in shared memory when SHARED. */
template <bool SHARED, int U = MK_UNROLL>
__device__ __forceinline__ void mv_row(const unsigned short *W, long row, int K,
                                       const float *x, int xstride, int nb, float *acc) {
    const uint4 *w = (const uint4 *)(W + row * (long)K);
    int lane = threadIdx.x & 31;
    int k8n = K >> 3;
#pragma unroll
    for (int b = 0; b < MK_MAXB; ++b) acc[b] = 0.0f;
    int i = lane;
    for (; i + 32 * (U - 1) < k8n; i += 32 * U) {
        uint4 wv[U];
#pragma unroll
        for (int u = 0; u < U; ++u) wv[u] = __ldg(w + i + 32 * u);   /* all loads first */
#pragma unroll
        for (int u = 0; u < U; ++u) {
#pragma unroll
            for (int b = 0; b < MK_MAXB; ++b)
                if (b < nb) acc[b] += dot8<SHARED>(wv[u], x + (long)b * xstride + ((i + 32 * u) << 3));
        }
    }
    for (; i < k8n; i += 32) {
        uint4 w0 = __ldg(w + i);
#pragma unroll
        for (int b = 0; b < MK_MAXB; ++b)
            if (b < nb) acc[b] += dot8<SHARED>(w0, x + (long)b * xstride + (i << 3));
    }
#pragma unroll
    for (int b = 0; b < MK_MAXB; ++b)
        if (b < nb) acc[b] = warp_sum(acc[b]);
}

/* two rows at once (rowA of WA, rowB of WB): both rows' loads are in flight together,
 * halving the latency rounds of a warp that owns several rows (decode is latency-bound
 * per SM).  U 16-byte loads per row per lane. */
template <bool SHARED, int U>
__device__ __forceinline__ void mv_row2(const unsigned short *WA, long rowA, const unsigned short *WB, long rowB,
                                        int K, const float *x, int xstride, int nb, float *accA, float *accB) {
    const uint4 *wa = (const uint4 *)(WA + rowA * (long)K);
    const uint4 *wb = (const uint4 *)(WB + rowB * (long)K);
    int lane = threadIdx.x & 31;
    int k8n = K >> 3;
#pragma unroll
    for (int b = 0; b < MK_MAXB; ++b) { accA[b] = 0.0f; accB[b] = 0.0f; }
    int i = lane;
    for (; i + 32 * (U - 1) < k8n; i += 32 * U) {
        uint4 va[U], vb[U];
#pragma unroll
        for (int u = 0; u < U; ++u) { va[u] = __ldg(wa + i + 32 * u); vb[u] = __ldg(wb + i + 32 * u); }
#pragma unroll
        for (int u = 0; u < U; ++u) {
#pragma unroll
            for (int b = 0; b < MK_MAXB; ++b) {
                if (b < nb) {
                    const float *xb = x + (long)b * xstride + ((i + 32 * u) << 3);
                    accA[b] += dot8<SHARED>(va[u], xb);
                    accB[b] += dot8<SHARED>(vb[u], xb);
                }
            }
        }
    }
    for (; i < k8n; i += 32) {
        uint4 a0 = __ldg(wa + i), b0 = __ldg(wb + i);
#pragma unroll
        for (int b = 0; b < MK_MAXB; ++b)
            if (b < nb) {
                accA[b] += dot8<SHARED>(a0, x + (long)b * xstride + (i << 3));
                accB[b] += dot8<SHARED>(b0, x + (long)b * xstride + (i << 3));
            }
    }
#pragma unroll
    for (int b = 0; b < MK_MAXB; ++b)
        if (b < nb) { accA[b] = warp_sum(accA[b]); accB[b] = warp_sum(accB[b]); }
}

/* the same, not inlined (keeps callers that need two rows at once from spilling) */
template <bool SHARED>
__device__ __noinline__ void mv_row_nl(const unsigned short *W, long row, int K, const float *x, int xstride,
                                       int nb, float *acc) {
    float a[MK_MAXB];
    mv_row<SHARED>(W, row, K, x, xstride, nb, a);
#pragma unroll
    for (int b = 0; b < MK_MAXB; ++b) acc[b] = a[b];
}

/* copy x[0 : n] (fp32, n % 4 == 0) from global (L2) into shared xs; whole block */
__device__ __forceinline__ void stage_x(float *xs, const float *x, int n) {
    for (int i = threadIdx.x * 4; i < n; i += MK_THREADS * 4)
        *(float4 *)(xs + i) = __ldcg((const float4 *)(x + i));
    MK_SYNC();
}

/* ---- RMSNorm: xn[b] = h[b] * rsqrt(mean(h[b]^2) + eps) * w; rows lo..hi ------------ */
__device__ __noinline__ void op_rmsnorm(const MkParams &P, const unsigned short *w, const float *h, float *xn,
                           int lo, int hi, float *scratch) {
    int H = (int)P.hidden;
    float eps = __uint_as_float((dtmk_u32)P.rms_eps_bits);
    for (int b = lo; b < hi; ++b) {
        float ss = 0.0f;
        for (int i = threadIdx.x; i < H; i += MK_THREADS) { float v = __ldcg(h + (long)b * H + i); ss += v * v; }
        ss = block_sum(ss, scratch);
        float r = rsqrtf(ss / (float)H + eps);
        for (int i = threadIdx.x; i < H; i += MK_THREADS)
            xn[(long)b * H + i] = __ldcg(h + (long)b * H + i) * r * bf16_at(w, i);
    }
}

/* ---- embedding: h[b] = embed[tokens[b]] ---------------------------------------------- */
__device__ void op_embed(const MkParams &P, int b) {
    int H = (int)P.hidden;
    const unsigned short *E = (const unsigned short *)P.w_embed;
    int tok = __ldcg((const int *)P.tokens + b);
    float *h = (float *)P.h;
    for (int i = threadIdx.x; i < H; i += MK_THREADS) h[(long)b * H + i] = bf16_at(E, (long)tok * H + i);
}

/* ---- generic projection tile: y[b, n] (= or +=) W[n, :] . x[b, :], n in lo..hi ------- */
/* x is staged in shared memory xs (capacity xs_cap floats) when it fits. */
__device__ __forceinline__ void proj_store(float *y, int ystride, int b0, int nb, int n, const float *acc,
                                           bool accumulate) {
    if ((threadIdx.x & 31) != 0) return;
#pragma unroll
    for (int b = 0; b < MK_MAXB; ++b) {
        if (b < nb) {
            float *o = y + (long)(b0 + b) * ystride + n;
            *o = accumulate ? __ldcg(o) + acc[b] : acc[b];
        }
    }
}

/* ldw: row stride of W (0: K; a split-K slice of a wider matrix); ldx: row stride of x
 * (0: K); prestaged: x already sits in xs as [B][K] (a fused RMSNorm prologue wrote it). */
__device__ __noinline__ void op_proj(const unsigned short *W, int K, const float *x, float *y, int ystride,
                                     int B, int lo, int hi, bool accumulate, float *xs, int xs_cap,
                                     int ldw = 0, int ldx = 0, bool prestaged = false) {
    int warp = threadIdx.x >> 5, nw = MK_WARPS;
    long lw = ldw ? ldw : K;
    int lx = ldx ? ldx : K;
    bool staged = prestaged || (xs != 0 && B * K <= xs_cap);
    if (staged && !prestaged) {
        if (lx == K) stage_x(xs, x, B * K);
        else {
            for (int b = 0; b < B; ++b)
                for (int i = threadIdx.x * 4; i < K; i += MK_THREADS * 4)
                    *(float4 *)(xs + (long)b * K + i) = __ldcg((const float4 *)(x + (long)b * lx + i));
            MK_SYNC();
        }
    }
    float acc[MK_MAXB], acc2[MK_MAXB];
    for (int b0 = 0; b0 < B; b0 += MK_MAXB) {
        int nb = min(MK_MAXB, B - b0);
        const float *xb = staged ? xs + (long)b0 * K : x + (long)b0 * lx;
        int xst = staged ? K : lx;
        /* warp w owns rows lo+w, lo+w+nw, ...; it takes them two at a time (both rows'
         * loads in flight together) when x is staged.  No L2 prefetch of later rows: it
         * competes with these loads for bandwidth (0.86-0.94x, megakernel_speed.md "Session 3") */
        for (int n = lo + warp; n < hi; n += 2 * nw) {
            int n2 = n + nw;
            if (staged && n2 < hi) {
                mv_row2<true, 8>(W + n * lw, 0, W + n2 * lw, 0, K, xb, xst, nb, acc, acc2);
                proj_store(y, ystride, b0, nb, n, acc, accumulate);
                proj_store(y, ystride, b0, nb, n2, acc2, accumulate);
                continue;
            }
            for (int m = n; m < hi && m <= n2; m += nw) {
                if (!staged) mv_row<false>(W + m * lw, 0, K, xb, xst, nb, acc);
                else if (K >= 4096) mv_row<true, 16>(W + m * lw, 0, K, xb, xst, nb, acc);
                else mv_row<true>(W + m * lw, 0, K, xb, xst, nb, acc);
                proj_store(y, ystride, b0, nb, m, acc, accumulate);
            }
        }
    }
    if (staged) MK_SYNC();      /* xs is reused by the next task */
}

/* ---- SiLU-gated MLP up tile: act[b, n] = silu(gate[n].x) * (up[n].x) --------------- */
__device__ __noinline__ void op_gate_up(const unsigned short *Wg, const unsigned short *Wu, int K, const float *x,
                                        float *act, int astride, int B, int lo, int hi,
                                        const float *row_scale /* [B] or 0 */, const int *row_mask /* [B] or 0 */,
                                        float *xs, int xs_cap, bool prestaged = false) {
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    bool staged = prestaged || (xs != 0 && B * K <= xs_cap);
    if (staged && !prestaged) stage_x(xs, x, B * K);
    float g[MK_MAXB], u[MK_MAXB];
    for (int b0 = 0; b0 < B; b0 += MK_MAXB) {
        int nb = min(MK_MAXB, B - b0);
        for (int n = lo + warp; n < hi; n += MK_WARPS) {
            if (staged) {
                mv_row2<true, 8>(Wg, n, Wu, n, K, xs + (long)b0 * K, K, nb, g, u);
            } else {
                mv_row_nl<false>(Wg, n, K, x + (long)b0 * K, K, nb, g);
                mv_row_nl<false>(Wu, n, K, x + (long)b0 * K, K, nb, u);
            }
            if (lane == 0) {
#pragma unroll
                for (int b = 0; b < MK_MAXB; ++b) {
                    if (b < nb) {
                        float s = g[b] / (1.0f + __expf(-g[b])) * u[b];
                        if (row_scale) s *= row_scale[b0 + b];
                        if (row_mask && !row_mask[b0 + b]) s = 0.0f;
                        act[(long)(b0 + b) * astride + n] = s;
                    }
                }
            }
        }
    }
    if (staged) MK_SYNC();
}

/* ---- RoPE on q and k heads + KV-cache append for kv heads lo..hi -------------------- */
/* qkv row layout: [q heads (n_heads*hd) | k heads (nkv*hd) | v heads (nkv*hd)].
 * Rotation pairs (i, i + hd/2), angle pos * theta^(-2i/hd) (Llama/NeoX style).  A kv
 * head g owns q heads g*rep .. g*rep+rep-1. */
__device__ __noinline__ void op_rope_kv(const MkParams &P, int layer, int lo, int hi) {
    int B = (int)P.batch, hd = (int)P.head_dim, nh = (int)P.n_heads, nkv = (int)P.n_kv_heads;
    int QKV = (int)P.qkv_dim, S = (int)P.max_seq, rep = nh / nkv, half = hd / 2;
    float theta = __uint_as_float((dtmk_u32)P.rope_theta_bits);
    float *qkv = (float *)P.qkv + (long)layer * B * QKV;
    float *kc = (float *)P.k_cache + (long)layer * B * S * nkv * hd;
    float *vc = (float *)P.v_cache + (long)layer * B * S * nkv * hd;
    const int *pos = (const int *)P.pos;
    int per_g = (rep + 1) * half + half * 2;           /* rope pairs (q heads + k) + v copy */
    for (int b = 0; b < B; ++b) {
        int p = __ldcg(pos + b);
        float *row = qkv + (long)b * QKV;
        for (int idx = threadIdx.x; idx < (hi - lo) * per_g; idx += MK_THREADS) {
            int g = lo + idx / per_g, r = idx % per_g;
            if (r < (rep + 1) * half) {
                int hh = r / half, i = r % half;       /* hh < rep: q head, hh == rep: k head */
                float *v = hh < rep ? row + (long)(g * rep + hh) * hd : row + (long)nh * hd + (long)g * hd;
                float inv = powf(theta, -2.0f * (float)i / (float)hd);
                float s, c;
                sincosf((float)p * inv, &s, &c);
                float a = __ldcg(v + i), bb = __ldcg(v + i + half);
                float ra = a * c - bb * s, rb = bb * c + a * s;
                v[i] = ra; v[i + half] = rb;
                if (hh == rep) {
                    float *kd = kc + (((long)b * S + p) * nkv + g) * hd;
                    kd[i] = ra; kd[i + half] = rb;
                }
            } else {
                int d = r - (rep + 1) * half;          /* 0..hd-1 */
                float vv = __ldcg(row + (long)(nh + nkv) * hd + (long)g * hd + d);
                vc[(((long)b * S + p) * nkv + g) * hd + d] = vv;
            }
        }
    }
}

/* ---- attention, one q head after the other (long contexts: rep*T > smem) --------- */
/* smem: >= max_seq + MK_WARPS + MK_THREADS floats */
__device__ __noinline__ void op_attn_seq(const MkParams &P, int layer, int b, int g, float *smem) {
    int B = (int)P.batch, hd = (int)P.head_dim, nh = (int)P.n_heads, nkv = (int)P.n_kv_heads;
    int QKV = (int)P.qkv_dim, S = (int)P.max_seq, rep = nh / nkv;
    const float *qkv = (const float *)P.qkv + (long)layer * B * QKV;
    const float *kc = (const float *)P.k_cache + (long)layer * B * S * nkv * hd;
    const float *vc = (const float *)P.v_cache + (long)layer * B * S * nkv * hd;
    float *out = (float *)P.attn + (long)layer * B * nh * hd;
    float *sc = smem, *scratch = smem + S, *part = smem + S + MK_WARPS;
    float scale = rsqrtf((float)hd);
    int T = __ldcg((const int *)P.pos + b) + 1;
    for (int qh = g * rep; qh < g * rep + rep; ++qh) {
        const float *q = qkv + (long)b * QKV + (long)qh * hd;
        float m = -3.0e38f;
        for (int t = threadIdx.x; t < T; t += MK_THREADS) {
            const float *k = kc + (((long)b * S + t) * nkv + g) * hd;
            float s = 0.0f;
            for (int d = 0; d < hd; d += 4) {
                float4 qa = __ldcg((const float4 *)(q + d)), ka = __ldcg((const float4 *)(k + d));
                s = fmaf(qa.x, ka.x, s); s = fmaf(qa.y, ka.y, s); s = fmaf(qa.z, ka.z, s); s = fmaf(qa.w, ka.w, s);
            }
            s *= scale;
            sc[t] = s;
            m = fmaxf(m, s);
        }
        m = warp_max(m);
        MK_SYNC();
        if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = m;
        MK_SYNC();
        m = (threadIdx.x & 31) < MK_WARPS ? scratch[threadIdx.x & 31] : -3.0e38f;
        m = warp_max(m);
        float l = 0.0f;
        for (int t = threadIdx.x; t < T; t += MK_THREADS) { float e = __expf(sc[t] - m); sc[t] = e; l += e; }
        l = block_sum(l, scratch);       /* has __syncthreads: sc[] visible after */
        /* out[d] = sum_t p_t v[t, d]: groups of hd threads split t */
        int ngrp = MK_THREADS / hd, grp = threadIdx.x / hd, d = threadIdx.x % hd;
        float o = 0.0f;
        if (grp < ngrp)
            for (int t = grp; t < T; t += ngrp) o = fmaf(sc[t], __ldcg(vc + (((long)b * S + t) * nkv + g) * hd + d), o);
        part[threadIdx.x] = o;
        MK_SYNC();
        if (threadIdx.x < hd) {
            float s = 0.0f;
            for (int j = 0; j < ngrp; ++j) s += part[j * hd + threadIdx.x];
            out[(long)b * nh * hd + (long)qh * hd + threadIdx.x] = s / l;
        }
        MK_SYNC();
    }
}

/* ---- attention of request slot b, kv head g (GQA): its `rep` q heads at once -------- */
/* smem: >= max_seq + MK_WARPS + MK_THREADS floats.  Scores of all rep heads sit in
 * smem [rep][T] (falls back to op_attn_seq when they do not fit); warp j reduces head j. */
#define MK_MAX_REP 16
__device__ __noinline__ void op_attn(const MkParams &P, int layer, int b, int g, float *smem) {
    int B = (int)P.batch, hd = (int)P.head_dim, nh = (int)P.n_heads, nkv = (int)P.n_kv_heads;
    int QKV = (int)P.qkv_dim, S = (int)P.max_seq, rep = nh / nkv;
    int T = __ldcg((const int *)P.pos + b) + 1;
    int cap = S + MK_THREADS;
    if (rep * T > cap || rep > MK_MAX_REP || rep > MK_WARPS) { op_attn_seq(P, layer, b, g, smem); return; }
    const float *qkv = (const float *)P.qkv + (long)layer * B * QKV;
    const float *kc = (const float *)P.k_cache + (long)layer * B * S * nkv * hd;
    const float *vc = (const float *)P.v_cache + (long)layer * B * S * nkv * hd;
    float *out = (float *)P.attn + (long)layer * B * nh * hd;
    float *sc = smem, *stat = smem + cap;          /* stat[j] = 1 / sum of head j */
    float scale = rsqrtf((float)hd);
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    for (int idx = threadIdx.x; idx < rep * T; idx += MK_THREADS) {
        int j = idx / T, t = idx - j * T;
        const float *q = qkv + (long)b * QKV + (long)(g * rep + j) * hd;
        const float *k = kc + (((long)b * S + t) * nkv + g) * hd;
        float s = 0.0f;
        for (int d = 0; d < hd; d += 4) {
            float4 qa = __ldcg((const float4 *)(q + d)), ka = __ldcg((const float4 *)(k + d));
            s = fmaf(qa.x, ka.x, s); s = fmaf(qa.y, ka.y, s); s = fmaf(qa.z, ka.z, s); s = fmaf(qa.w, ka.w, s);
        }
        sc[idx] = s * scale;
    }
    MK_SYNC();
    if (warp < rep) {
        float *row = sc + warp * T;
        float m = -3.0e38f;
        for (int t = lane; t < T; t += 32) m = fmaxf(m, row[t]);
        m = warp_max(m);
        float l = 0.0f;
        for (int t = lane; t < T; t += 32) { float e = __expf(row[t] - m); row[t] = e; l += e; }
        l = warp_sum(l);
        if (lane == 0) stat[warp] = 1.0f / l;
    }
    MK_SYNC();
    for (int idx = threadIdx.x; idx < rep * hd; idx += MK_THREADS) {
        int j = idx / hd, d = idx - j * hd;
        const float *p = sc + j * T;
        const float *v = vc + ((long)b * S * nkv + g) * hd + d;
        float o = 0.0f;
#pragma unroll 4
        for (int t = 0; t < T; ++t) o = fmaf(p[t], __ldcg(v + (long)t * nkv * hd), o);
        out[(long)b * nh * hd + (long)(g * rep + j) * hd + d] = o * stat[j];
    }
    MK_SYNC();
}

/* ---- argmax over logits of slot b ------------------------------------------------- */
__device__ int op_argmax_row(const float *row, int V, float *smem) {
    float best = -3.0e38f; int bi = 0x7fffffff;
    for (int i = threadIdx.x; i < V; i += MK_THREADS) {
        float v = __ldcg(row + i);
        if (v > best || (v == best && i < bi)) { best = v; bi = i; }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(MK_FULL, best, o); int oi = __shfl_xor_sync(MK_FULL, bi, o);
        if (ov > best || (ov == best && oi < bi)) { best = ov; bi = oi; }
    }
    int *si = (int *)(smem + MK_WARPS);
    MK_SYNC();
    if ((threadIdx.x & 31) == 0) { smem[threadIdx.x >> 5] = best; si[threadIdx.x >> 5] = bi; }
    MK_SYNC();
    if (threadIdx.x == 0) {
        for (int w = 1; w < MK_WARPS; ++w)
            if (smem[w] > best || (smem[w] == best && si[w] < bi)) { best = smem[w]; bi = si[w]; }
        si[0] = bi;
    }
    MK_SYNC();
    int r = si[0];
    MK_SYNC();
    return r;
}

/* ==== model-level task bodies (megakernel and per-operator baseline) ==== */
#define F_SKEW 2

/* ---- request slots ----------------------------------------------------------------- */
/* identical to reference.Requests */
__device__ __forceinline__ int mk_prompt_token(const MkParams &P, int slot, int gen) {
    dtmk_u64 k = ((dtmk_u64)P.req_seed << 40) ^ ((dtmk_u64)slot << 20) ^ (dtmk_u64)gen;
    return (int)(splitmix64(k) % P.vocab);
}
__device__ __forceinline__ int mk_req_len(const MkParams &P, int slot, int gen) {
    dtmk_u64 k = ((dtmk_u64)P.req_seed << 40) ^ ((dtmk_u64)slot << 20) ^ (dtmk_u64)gen;
    dtmk_u64 n = P.req_min + splitmix64(k + 1) % P.req_span;
    return (int)min(n, P.max_seq);
}

/* ---- task bodies -------------------------------------------------------------------- */
/* MoE: fold the routed expert partials of MoE ordinal `mi` into h (fixed order) */
__device__ void moe_fold(const MkParams &P, int mi) {
    int B = (int)P.batch, H = (int)P.hidden, K = (int)P.top_k, E = (int)P.n_experts;
    int et = (int)(P.expert_ffn / P.tile_n);
    const int *re = (const int *)P.route_expert + (long)mi * B * K;
    const float *part = (const float *)P.moe_part + (long)mi * E * et * B * H;
    float *h = (float *)P.h;
    for (int b = 0; b < B; ++b)
        for (int i = threadIdx.x; i < H; i += MK_THREADS) {
            float s = 0.0f;
            for (int k = 0; k < K; ++k) {
                int e = __ldcg(re + b * K + k);
                for (int x = 0; x < et; ++x) s += __ldcg(part + (((long)e * et + x) * B + b) * H + i);
            }
            h[(long)b * H + i] += s;
        }
}

/* router of MoE ordinal mi for all slots: top-k (ties to the lower expert), softmax
 * weights over the selected logits; routing_skew forces `expert` first for a share of
 * slots (picked per (slot, step)).  Writes route_expert/route_weight. */
__device__ __noinline__ void op_router(const MkParams &P, int mi, int layer, int step, float *smem) {
    int B = (int)P.batch, H = (int)P.hidden, E = (int)P.n_experts, K = (int)P.top_k;
    const unsigned short *Wr = (const unsigned short *)P.w_router + (long)mi * E * H;
    float *lg = smem;                                          /* [B][E] */
    op_proj(Wr, H, (const float *)P.xn, lg, E, B, 0, E, false, smem + P.xs_off, (int)P.xs_cap);
    MK_SYNC();
    if (threadIdx.x < B) {
        int b = threadIdx.x;
        int *re = (int *)P.route_expert + ((long)mi * B + b) * K;
        float *rw = (float *)P.route_weight + ((long)mi * B + b) * K;
        int sel[MK_MAX_TOPK]; float val[MK_MAX_TOPK];
        for (int n = 0; n < K; ++n) {            /* top-k, ties to the lower expert */
            int bi = -1; float bv = -3.0e38f;
            for (int e = 0; e < E; ++e) {
                bool used = false;
                for (int j = 0; j < n; ++j) used |= sel[j] == e;
                float v = lg[b * E + e];
                if (!used && (bi < 0 || v > bv)) { bi = e; bv = v; }
            }
            sel[n] = bi; val[n] = bv;
        }
        /* routing_skew (faults.py): the first choice becomes `expert` (swap if chosen) */
        const long long *F = (const long long *)P.faults;
        for (int i = 0; i < (int)P.n_faults; ++i) {
            const long long *r = F + i * 8;
            if (r[0] != F_SKEW || (r[2] >= 0 && r[2] != layer) || step < r[3] || step > r[4]) continue;
            if (fault_pick((dtmk_u64)r[7], (dtmk_u32)((layer << 16) | b), (dtmk_u32)step) >= (dtmk_u32)r[6]) continue;
            int x = (int)r[5];
            if (x < 0 || x >= E) continue;
            int j = -1;
            for (int q = 0; q < K; ++q) if (sel[q] == x) j = q;
            if (j >= 0) { int ts = sel[0]; float tv = val[0]; sel[0] = sel[j]; val[0] = val[j]; sel[j] = ts; val[j] = tv; }
            else { sel[0] = x; val[0] = lg[b * E + x]; }
        }
        float m = val[0];
        for (int j = 1; j < K; ++j) m = fmaxf(m, val[j]);
        float s = 0.0f;
        for (int j = 0; j < K; ++j) { val[j] = expf(val[j] - m); s += val[j]; }
        for (int j = 0; j < K; ++j) { re[j] = sel[j]; rw[j] = val[j] / s; }
    }
    MK_SYNC();
}

/* expert tile: for slots routed to `e`: a = silu(x Wg[lo:hi]) * (x Wu[lo:hi]) scaled by
 * the gate weight, partial[e][tile][b] = Wd[:, lo:hi] a.  Unrouted slots write zeros
 * (never read by moe_fold). */
__device__ __noinline__ void op_expert(const MkParams &P, int mi, int e, int tile, int lo, int hi, float *smem) {
    int B = (int)P.batch, H = (int)P.hidden, K = (int)P.top_k, E = (int)P.n_experts, EF = (int)P.expert_ffn;
    int et = EF / (int)P.tile_n, n = hi - lo;
    float *a = smem;                      /* [B][n] */
    float *scale = smem + B * n;          /* [B] */
    int *mask = (int *)(scale + B);       /* [B] */
    if (threadIdx.x < B) {
        int b = threadIdx.x; float w = 0.0f; int on = 0;
        for (int k = 0; k < K; ++k)
            if (__ldcg((const int *)P.route_expert + ((long)mi * B + b) * K + k) == e) {
                on = 1; w = __ldcg((const float *)P.route_weight + ((long)mi * B + b) * K + k);
            }
        scale[b] = w; mask[b] = on;
    }
    MK_SYNC();
    const unsigned short *Wg = (const unsigned short *)P.w_egate + ((long)mi * E + e) * EF * H;
    const unsigned short *Wu = (const unsigned short *)P.w_eup + ((long)mi * E + e) * EF * H;
    /* a[b][j - lo] for j in lo..hi: write into smem with stride n, base shifted by -lo */
    op_gate_up(Wg, Wu, H, (const float *)P.xn, a - lo, n, B, lo, hi, scale, mask, smem + P.xs_off, (int)P.xs_cap);
    MK_SYNC();
    /* partial[b][i] = sum_j Wd[i, lo + j] a[b][j]: warp per output row, K = n (<= 256) */
    const unsigned short *Wd = (const unsigned short *)P.w_edown + ((long)mi * E + e) * H * EF;
    float *part = (float *)P.moe_part + ((((long)mi * E + e) * et + tile) * B) * H;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    for (int i = warp; i < H; i += MK_WARPS) {
        const unsigned short *row = Wd + (long)i * EF + lo;
        for (int b = 0; b < B; ++b) {
            float s = 0.0f;
            for (int j = lane; j < n; j += 32) s = fmaf(bf16_at(row, j), a[b * n + j], s);
            s = warp_sum(s);
            if (lane == 0) part[(long)b * H + i] = s;
        }
    }
}

/* ==== fused RMSNorm and split-K (ModelConfig.fuse_norm / split_k, graph.py) ==== */
/* Partial sums of split-K projections live in P.moe_part (dense models) as
 * part[set][s][B][H], set 0/1: mlp_down of layers with that parity, set 2: attn_o.
 * The residual stream after a split layer is h plus its pending partials; every reader
 * sums them in one fixed order (mk_resid), so all readers and the one committer
 * (the mlp_down tile of split 0) get the same bits.  No atomics. */
#ifndef DTMK_PROLOGUE_SERIAL
/* mk_resid4 for a compile-time S: every load first, then the adds in the same order as
 * the loop below (same bits): one L2 round trip instead of 1 + 2S dependent ones (the
 * runtime-S loop compiles to load/add/load...: ~9 serialized trips in each gate/up
 * prologue, docs/dev/megakernel_speed.md "Session 3") */
template <int S, bool PM, bool PA>
__device__ __forceinline__ float4 mk_resid4_s(const float *hp, const float *part, long BH, long off, int pm) {
    float4 v = __ldcg((const float4 *)(hp + off));
    float4 p[PM ? S : 1], q[PA ? S : 1];
#pragma unroll
    for (int s = 0; s < S; ++s) {
        if (PM) p[s] = __ldcg((const float4 *)(part + (long)(pm * S + s) * BH + off));
        if (PA) q[s] = __ldcg((const float4 *)(part + (long)(2 * S + s) * BH + off));
    }
#pragma unroll
    for (int s = 0; s < S; ++s)
        if (PM) { v.x += p[s].x; v.y += p[s].y; v.z += p[s].z; v.w += p[s].w; }
#pragma unroll
    for (int s = 0; s < S; ++s)
        if (PA) { v.x += q[s].x; v.y += q[s].y; v.z += q[s].z; v.w += q[s].w; }
    return v;
}
#endif
__device__ __forceinline__ float4 mk_resid4(const MkParams &P, int b, int i, int pm, bool pa, int S) {
    long BH = (long)P.batch * (long)P.hidden, off = (long)b * (long)P.hidden + i;
    const float *part = (const float *)P.moe_part;
#ifndef DTMK_PROLOGUE_SERIAL
    {   /* batched loads for the split factors benched (graph.py split_k 2 and 4) */
        const float *hp = (const float *)P.h;
        if (S == 4 && pm >= 0 && pa) return mk_resid4_s<4, true, true>(hp, part, BH, off, pm);
        if (S == 4 && pm >= 0) return mk_resid4_s<4, true, false>(hp, part, BH, off, pm);
        if (S == 4 && pa) return mk_resid4_s<4, false, true>(hp, part, BH, off, pm);
        if (S == 2 && pm >= 0 && pa) return mk_resid4_s<2, true, true>(hp, part, BH, off, pm);
        if (S == 2 && pm >= 0) return mk_resid4_s<2, true, false>(hp, part, BH, off, pm);
        if (S == 2 && pa) return mk_resid4_s<2, false, true>(hp, part, BH, off, pm);
    }
#endif
    float4 v = __ldcg((const float4 *)((const float *)P.h + off));
    if (pm >= 0)
        for (int s = 0; s < S; ++s) {
            float4 p = __ldcg((const float4 *)(part + (long)(pm * S + s) * BH + off));
            v.x += p.x; v.y += p.y; v.z += p.z; v.w += p.w;
        }
    if (pa)
        for (int s = 0; s < S; ++s) {
            float4 p = __ldcg((const float4 *)(part + (long)(2 * S + s) * BH + off));
            v.x += p.x; v.y += p.y; v.z += p.z; v.w += p.w;
        }
    return v;
}

/* which pending partial sets the consumer of norm `kind` at `layer` adds (S > 1):
 * kind 0 (attention norm, layer l): the mlp_down partials of layer l-1;
 * kind 1 (MLP norm): those and the layer's attn_o partials; kind 2 (final norm): the
 * last layer's mlp_down partials */
__device__ __forceinline__ void mk_pending(const MkParams &P, int kind, int layer, int S, int &pm, bool &pa) {
    pm = -1; pa = false;
    if (S <= 1) return;
    int prev = kind == 2 ? (int)P.n_layers - 1 : layer - 1;
    if (prev >= 0) pm = prev & 1;
    pa = kind == 1;
}

/* xs[b - b0][:] = rmsnorm(h[b] + pending partials) * w for slots b0 .. b0+nb-1 (whole
 * CTA; H % 4 == 0; nb * H <= xs_cap) */
__device__ __noinline__ void stage_norm(const MkParams &P, float *xs, float *scratch, int kind, int layer, int S,
                                        int b0, int nb) {
    int H = (int)P.hidden;
    float eps = __uint_as_float((dtmk_u32)P.rms_eps_bits);
    const unsigned short *w = kind == 2 ? (const unsigned short *)P.w_final_norm
        : (const unsigned short *)(kind == 0 ? P.w_attn_norm : P.w_mlp_norm) + (long)layer * H;
    int pm; bool pa;
    mk_pending(P, kind, layer, S, pm, pa);
#ifndef DTMK_PROLOGUE_SERIAL
    if (H <= MK_THREADS * 4) {
        /* one float4 per thread (1b: H = 2048): the norm weights are loaded together with
         * the residual instead of after the block sum (one L2 round trip less); same
         * expressions as the loop below, so the same bits */
        const int i = threadIdx.x * 4;
        const bool on = i < H;
        float w0 = 0.0f, w1 = 0.0f, w2 = 0.0f, w3 = 0.0f;
        if (on) {   /* asm volatile: the compiler sank plain __ldg loads past the block sum */
            unsigned short u0, u1, u2, u3;
            asm volatile("ld.global.nc.u16 %0, [%4];\n\tld.global.nc.u16 %1, [%4+2];\n\t"
                         "ld.global.nc.u16 %2, [%4+4];\n\tld.global.nc.u16 %3, [%4+6];"
                         : "=h"(u0), "=h"(u1), "=h"(u2), "=h"(u3) : "l"(w + i) : "memory");
            w0 = __uint_as_float((dtmk_u32)u0 << 16); w1 = __uint_as_float((dtmk_u32)u1 << 16);
            w2 = __uint_as_float((dtmk_u32)u2 << 16); w3 = __uint_as_float((dtmk_u32)u3 << 16);
        }
        for (int b = b0; b < b0 + nb; ++b) {
            float ss = 0.0f;
            float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (on) {
                v = mk_resid4(P, b, i, pm, pa, S);
                ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
            }
            ss = block_sum(ss, scratch);
            float r = rsqrtf(ss / (float)H + eps);
            if (on) {
                float *o = xs + (long)(b - b0) * H + i;
                o[0] = v.x * r * w0; o[1] = v.y * r * w1; o[2] = v.z * r * w2; o[3] = v.w * r * w3;
            }
        }
        MK_SYNC();
        return;
    }
#endif
    for (int b = b0; b < b0 + nb; ++b) {
        float ss = 0.0f;
        for (int i = threadIdx.x * 4; i < H; i += MK_THREADS * 4) {
            float4 v = mk_resid4(P, b, i, pm, pa, S);
            *(float4 *)(xs + (long)(b - b0) * H + i) = v;
            ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
        }
        ss = block_sum(ss, scratch);
        float r = rsqrtf(ss / (float)H + eps);
        for (int i = threadIdx.x * 4; i < H; i += MK_THREADS * 4) {   /* same elements as above */
            float *o = xs + (long)(b - b0) * H + i;
            o[0] = o[0] * r * bf16_at(w, i); o[1] = o[1] * r * bf16_at(w, i + 1);
            o[2] = o[2] * r * bf16_at(w, i + 2); o[3] = o[3] * r * bf16_at(w, i + 3);
        }
    }
    MK_SYNC();
}

/* slots per staged chunk of a fused prologue (the whole batch when it fits in xs) */
__device__ __forceinline__ int fused_chunk(const MkParams &P) {
    int c = (int)(P.xs_cap / P.hidden);
    return max(1, min(c, (int)P.batch));
}

/* fused-norm projection tile (qkv kind 0; lm_head kind 2 through op_lm_tile) */
__device__ void op_fused_proj(const MkParams &P, const unsigned short *W, float *y, int ystride, int lo, int hi,
                              int kind, int layer, int S, float *smem) {
    int H = (int)P.hidden, B = (int)P.batch, C = fused_chunk(P);
    float *xs = smem + P.xs_off;
    for (int b0 = 0; b0 < B; b0 += C) {
        int nb = min(C, B - b0);
        stage_norm(P, xs, smem, kind, layer, S, b0, nb);
        op_proj(W, H, 0, y + (long)b0 * ystride, ystride, nb, lo, hi, false, xs, (int)P.xs_cap, 0, 0, true);
    }
}

/* fused-norm gate/up tile (kind 1) */
__device__ void op_fused_gate_up(const MkParams &P, const unsigned short *Wg, const unsigned short *Wu, float *act,
                                 int lo, int hi, int layer, int S, float *smem) {
    int H = (int)P.hidden, B = (int)P.batch, C = fused_chunk(P), F = (int)P.ffn;
    float *xs = smem + P.xs_off;
    for (int b0 = 0; b0 < B; b0 += C) {
        int nb = min(C, B - b0);
        stage_norm(P, xs, smem, 1, layer, S, b0, nb);
        op_gate_up(Wg, Wu, H, 0, act + (long)b0 * F, F, nb, lo, hi, 0, 0, xs, (int)P.xs_cap, true);
    }
}

/* split-K tile s of S of a projection y = W x, W [N][Kfull] (the layer's matrix), x
 * [B][Kfull]: part[set][s][b][lo:hi] = W[lo:hi, s*Ks:(s+1)*Ks] . x[b, s*Ks:(s+1)*Ks].
 * commit (mlp_down, s == 0): first h[b][lo:hi] = h + the partials pending before this
 * layer's down projection (mlp_down of layer-1, attn_o of layer), the same sum the
 * layer's gate/up tiles normalised. */
__device__ void op_split_proj(const MkParams &P, const unsigned short *W, int Kfull, const float *x, int set,
                              int s, int S, int lo, int hi, bool commit, int layer, float *smem) {
    int B = (int)P.batch, H = (int)P.hidden, Ks = Kfull / S;
    if (commit) {
        int pm; bool pa;
        mk_pending(P, 1, layer, S, pm, pa);
        float *h = (float *)P.h;
        for (int idx = threadIdx.x * 4; idx < B * (hi - lo); idx += MK_THREADS * 4) {
            int b = idx / (hi - lo), i = lo + idx % (hi - lo);     /* (hi - lo) % 4 == 0 */
            *(float4 *)(h + (long)b * H + i) = mk_resid4(P, b, i, pm, pa, S);
        }
    }
    float *y = (float *)P.moe_part + ((long)set * S + s) * B * H;
    op_proj(W + (long)s * Ks, Ks, x + (long)s * Ks, y, H, B, lo, hi, false, smem + P.xs_off, (int)P.xs_cap,
            Kfull, Kfull);
}

/* lm head tile: logits[b, lo:hi] and the tile's (max, argmax) per slot; fused_S >= 1:
 * the final norm is computed here (ModelConfig.fuse_norm, split_k = fused_S) */
__device__ void op_lm_tile(const MkParams &P, int lo, int hi, float *smem, int fused_S = -1) {
    int B = (int)P.batch, H = (int)P.hidden, V = (int)P.vocab;
    if (fused_S >= 1)
        op_fused_proj(P, (const unsigned short *)P.w_lm_head, (float *)P.logits, V, lo, hi, 2, (int)P.n_layers,
                      fused_S, smem);
    else
        op_proj((const unsigned short *)P.w_lm_head, H, (const float *)P.xn, (float *)P.logits, V, B, lo, hi, false,
                smem + P.xs_off, (int)P.xs_cap);
    __threadfence();
    MK_SYNC();
    int tile = lo / (int)P.tile_n, nt = V / (int)P.tile_n;
    for (int b = 0; b < B; ++b) {
        int i = op_argmax_row((const float *)P.logits + (long)b * V + lo, hi - lo, smem);
        if (threadIdx.x == 0) {
            ((int *)P.tile_arg)[(long)b * nt + tile] = lo + i;
            ((float *)P.tile_max)[(long)b * nt + tile] = __ldcg((const float *)P.logits + (long)b * V + lo + i);
        }
    }
}

/* request slot b got token `tok` at `step`: record it, advance, refill when done */
__device__ void mk_slot_advance(const MkParams &P, int b, int tok_next, int step) {
    int B = (int)P.batch;
    int *pos = (int *)P.pos, *gen = (int *)P.req_gen, *tok = (int *)P.tokens, *rl = (int *)P.req_len;
    if (tok_next < 0 || tok_next >= (int)P.vocab) tok_next = 0;   /* NaN logits: keep indices valid */
    if (P.resident)        /* resident: a ring of n_out_steps rows the host reads behind */
        ((int *)P.out_tokens)[(long)((step - (int)P.step0) % (int)P.n_out_steps) * B + b] = tok_next;
    else if (step - (int)P.step0 >= 0 && step - (int)P.step0 < (int)P.n_out_steps)
        ((int *)P.out_tokens)[(long)(step - (int)P.step0) * B + b] = tok_next;
    int p = pos[b] + 1;
    if (p >= rl[b]) {
        int g = gen[b] + 1;
        gen[b] = g; pos[b] = 0; tok[b] = mk_prompt_token(P, b, g); rl[b] = mk_req_len(P, b, g);
    } else {
        pos[b] = p; tok[b] = tok_next;
    }
}

/* argmax over the lm-head tiles (whole block, ties to the lower token id); writes the
 * next tokens and advances request slots */
__device__ void op_argmax_step(const MkParams &P, int step, float *smem) {
    int B = (int)P.batch, nt = (int)(P.vocab / P.tile_n);
    int *si = (int *)(smem + MK_WARPS);
    for (int b = 0; b < B; ++b) {
        float best = -3.0e38f; int bi = 0x7fffffff;
        for (int x = threadIdx.x; x < nt; x += MK_THREADS) {
            float v = __ldcg((const float *)P.tile_max + (long)b * nt + x);
            int i = __ldcg((const int *)P.tile_arg + (long)b * nt + x);
            if (v > best || (v == best && i < bi)) { best = v; bi = i; }
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            float ov = __shfl_xor_sync(MK_FULL, best, o); int oi = __shfl_xor_sync(MK_FULL, bi, o);
            if (ov > best || (ov == best && oi < bi)) { best = ov; bi = oi; }
        }
        if ((threadIdx.x & 31) == 0) { smem[threadIdx.x >> 5] = best; si[threadIdx.x >> 5] = bi; }
        MK_SYNC();
        if (threadIdx.x == 0) {
            for (int w = 1; w < MK_WARPS; ++w)
                if (smem[w] > best || (smem[w] == best && si[w] < bi)) { best = smem[w]; bi = si[w]; }
            mk_slot_advance(P, b, bi, step);
        }
        MK_SYNC();
    }
}


#endif /* DTMK_MK_OPS_CUH */
