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
    /* grid handoff (megakernel.cu "grid handoff", -DDTMK_HANDOFF; 0 otherwise): this grid
     * is a successor; where each worker resumed is recorded there */
    dtmk_u64 handoff_in;
};
/* query heads per kv head.  (32-bit: the fields are u64 and a 64-bit divide is ~70
 * instructions wherever it is inlined -- docs/dev/megakernel_speed.md "Session 36") */
__device__ __forceinline__ int mk_rep(const MkParams &P) { return (int)((unsigned)P.n_heads / (unsigned)P.n_kv_heads); }

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
 * head g owns q heads g*rep .. g*rep+rep-1.  Slots b0 .. b1-1: op_rope_kv does every
 * slot; an attn task of a rope_in_attn graph (graph.py, -DDTMK_ROPE_IN_ATTN) its own
 * (op_rope_attn: staged in smem, rope_kv_slots only on its long-context fallback).
 * rope_angle / rope_rot are the one arithmetic of every rope path (explicit _rn
 * intrinsics: no contraction choice left to the compiler), so the staged and the
 * global-memory paths, and megakernel and eager baseline, give the same bits. */
__device__ __forceinline__ void rope_angle(int p, int i, int hd, float theta, float &s, float &c) {
    float inv = powf(theta, -2.0f * (float)i / (float)hd);
    sincosf(__fmul_rn((float)p, inv), &s, &c);
}
__device__ __forceinline__ void rope_rot(float a, float bb, float s, float c, float &ra, float &rb) {
    ra = __fmaf_rn(a, c, -__fmul_rn(bb, s));
    rb = __fmaf_rn(a, s, __fmul_rn(bb, c));
}
__device__ __forceinline__ void rope_kv_slots(const MkParams &P, int layer, int lo, int hi, int b0, int b1) {
    int B = (int)P.batch, hd = (int)P.head_dim, nh = (int)P.n_heads, nkv = (int)P.n_kv_heads;
    int QKV = (int)P.qkv_dim, S = (int)P.max_seq, rep = nh / nkv, half = hd / 2;
    float theta = __uint_as_float((dtmk_u32)P.rope_theta_bits);
    float *qkv = (float *)P.qkv + (long)layer * B * QKV;
    float *kc = (float *)P.k_cache + (long)layer * B * S * nkv * hd;
    float *vc = (float *)P.v_cache + (long)layer * B * S * nkv * hd;
    const int *pos = (const int *)P.pos;
    int per_g = (rep + 1) * half + half * 2;           /* rope pairs (q heads + k) + v copy */
    for (int b = b0; b < b1; ++b) {
        int p = __ldcg(pos + b);
        float *row = qkv + (long)b * QKV;
        for (int idx = threadIdx.x; idx < (hi - lo) * per_g; idx += MK_THREADS) {
            int g = lo + idx / per_g, r = idx % per_g;
            if (r < (rep + 1) * half) {
                int hh = r / half, i = r % half;       /* hh < rep: q head, hh == rep: k head */
                float *v = hh < rep ? row + (long)(g * rep + hh) * hd : row + (long)nh * hd + (long)g * hd;
                float s, c, ra, rb;
                rope_angle(p, i, hd, theta, s, c);
                float a = __ldcg(v + i), bb = __ldcg(v + i + half);
                rope_rot(a, bb, s, c, ra, rb);
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
__device__ __noinline__ void op_rope_kv(const MkParams &P, int layer, int lo, int hi) {
    rope_kv_slots(P, layer, lo, hi, 0, (int)P.batch);
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

#define MK_MAX_REP 16
/* ---- attention staged in shared memory (short contexts: decode of short requests) ---- */
/* One batch of global loads after pos -- the slot's rep q heads, the kv head's k and v
 * rows 0..T-1 -- into smem, then QK, softmax and PV from smem: two dependent global
 * round trips (pos, the batch) instead of one per phase.  The per-element arithmetic and
 * summation order are op_attn's (QK: d ascending in steps of 4, fmaf; PV: t ascending;
 * out = o * (1 / l)), so both paths give the same bits.  ROPE (rope_in_attn tasks): q,
 * k and v of position T-1 come from the qkv row, are roped in smem (rope_angle /
 * rope_rot: rope_kv_slots' bits) and k / v are appended to the cache rows of position
 * T-1, never read back; q and k are not written back to the qkv row (this task is the
 * only reader of slot b's q heads of group g and k head g; the task stays idempotent).
 * smem layout (floats): q [rep][hd] | k [T][hd + 4] (padded: conflict-free float4 rows)
 * | v [T][hd] | scores [rep][T] | 1 / sum [rep]; fits when attn_staged_floats <= the
 * task scratch max_seq + MK_WARPS + MK_THREADS (gpu.smem_layout).  -DDTMK_ATTN_UNSTAGED
 * keeps the global-memory paths (bench/megakernel.py variant: old vs new, same bits). */
__device__ __forceinline__ long attn_staged_floats(int rep, int hd, int T) {
    return (long)rep * hd + (long)T * (2 * hd + 4) + (long)rep * T + rep;
}
__device__ __forceinline__ bool attn_staged_fits(const MkParams &P, int T) {
#ifdef DTMK_ATTN_UNSTAGED
    return false;
#else
    int hd = (int)P.head_dim, rep = mk_rep(P);
    return (hd & 3) == 0 && rep <= MK_WARPS && rep <= MK_MAX_REP &&
           attn_staged_floats(rep, hd, T) <= (long)P.max_seq + MK_WARPS + MK_THREADS;
#endif
}
/* softmax of the score rows sc[j][0..T) in place, warp j for head j < rep; stat[j] = 1 / its
 * sum (op_attn_staged and op_attn: one spelling of the order the eager build shares) */
__device__ __forceinline__ void attn_softmax_rows(float *sc, int T, int rep, float *stat) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
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
}

template <bool ROPE>
__device__ __noinline__ void op_attn_staged(const MkParams &P, int layer, int b, int g, int p, float *smem) {
    int B = (int)P.batch, hd = (int)P.head_dim, nh = (int)P.n_heads, nkv = (int)P.n_kv_heads;
    int QKV = (int)P.qkv_dim, S = (int)P.max_seq, rep = nh / nkv, half = hd >> 1;
    int T = p + 1, KS = hd + 4, hd4 = hd >> 2;
    const float *row = (const float *)P.qkv + (long)layer * B * QKV + (long)b * QKV;
    float *kc = (float *)P.k_cache + (long)layer * B * S * nkv * hd + ((long)b * S * nkv + g) * hd;
    float *vc = (float *)P.v_cache + (long)layer * B * S * nkv * hd + ((long)b * S * nkv + g) * hd;
    long cstride = (long)nkv * hd;                         /* cache: position t at kc + t * cstride */
    float *out = (float *)P.attn + (long)layer * B * nh * hd + (long)b * nh * hd + (long)g * rep * hd;
    float *qs = smem, *ks = qs + rep * hd, *vs = ks + T * KS, *sc = vs + T * hd, *stat = sc + rep * T;
    int tid = threadIdx.x;
    /* 1. every global load of the task in one batch (<= 2 float4 per thread in flight) */
    int nq = rep * hd4, nk = T * hd4, n = nq + 2 * nk;
    int npair = ROPE ? (rep + 1) * half : 0;               /* rope pair idx: q head idx / half (k: rep) */
    float sn = 0.0f, cs = 0.0f;
    for (int i0 = tid; i0 < max(n, npair); i0 += 2 * MK_THREADS) {   /* (ROPE: every rope thread once) */
        float4 val[2];
        int so[2];                                         /* smem offset of the float4 (-1: none) */
#pragma unroll
        for (int u = 0; u < 2; ++u) {
            int idx = i0 + u * MK_THREADS;
            so[u] = -1;
            if (idx >= n) continue;
            const float *src;
            if (idx < nq) {
                int j = idx / hd4, d = (idx - j * hd4) << 2;
                src = row + (long)(g * rep + j) * hd + d;
                so[u] = j * hd + d;
            } else {
                int kv = idx >= nq + nk, x = idx - nq - kv * nk, t = x / hd4, d = (x - t * hd4) << 2;
                if (ROPE && t == T - 1) src = row + (long)(nh + kv * nkv + g) * hd + d;   /* k / v: the qkv row */
                else src = (kv ? vc : kc) + t * cstride + d;
                so[u] = kv ? (int)(vs - qs) + t * hd + d : (int)(ks - qs) + t * KS + d;
            }
            val[u] = __ldcg((const float4 *)src);
        }
        /* (ROPE) this thread's rope angle while its loads are in flight */
        if (ROPE && i0 == tid && tid < npair)
            rope_angle(p, tid % half, hd, __uint_as_float((dtmk_u32)P.rope_theta_bits), sn, cs);
#pragma unroll
        for (int u = 0; u < 2; ++u) {
            if (so[u] < 0) continue;
            *(float4 *)(qs + so[u]) = val[u];
            int vx = so[u] - (int)(vs - qs) - (T - 1) * hd;    /* (ROPE) v of position T-1 -> cache row p */
            if (ROPE && vx >= 0 && vx < hd) *(float4 *)(vc + (long)p * cstride + vx) = val[u];
        }
    }
    if (ROPE) {
        MK_SYNC();
        /* 2. rope q heads and k (row T-1) in smem; k -> cache row p */
        if (tid < npair) {
            int hh = tid / half, i = tid - hh * half;
            float *v = hh < rep ? qs + hh * hd : ks + (T - 1) * KS;
            float ra, rb;
            rope_rot(v[i], v[i + half], sn, cs, ra, rb);
            v[i] = ra; v[i + half] = rb;
            if (hh == rep) { kc[(long)p * cstride + i] = ra; kc[(long)p * cstride + i + half] = rb; }
        }
    }
    MK_SYNC();
    /* 3. scores (op_attn's order) */
    float scale = rsqrtf((float)hd);
    for (int idx = tid; idx < rep * T; idx += MK_THREADS) {
        int j = idx / T, t = idx - j * T;
        const float *q = qs + j * hd, *k = ks + t * KS;
        float s = 0.0f;
        for (int d = 0; d < hd; d += 4) {
            float4 qa = *(const float4 *)(q + d), ka = *(const float4 *)(k + d);
            s = fmaf(qa.x, ka.x, s); s = fmaf(qa.y, ka.y, s); s = fmaf(qa.z, ka.z, s); s = fmaf(qa.w, ka.w, s);
        }
        sc[idx] = s * scale;
    }
    MK_SYNC();
    /* 4. softmax: warp j, head j */
    attn_softmax_rows(sc, T, rep, stat);
    /* 5. out[j][d] = sum_t p[j][t] v[t][d], t ascending */
    for (int idx = tid; idx < rep * hd; idx += MK_THREADS) {
        int j = idx / hd, d = idx - j * hd;
        const float *pr = sc + j * T, *v = vs + d;
        float o = 0.0f;
#pragma unroll 4
        for (int t = 0; t < T; ++t) o = fmaf(pr[t], v[t * hd], o);
        out[idx] = o * stat[j];
    }
    MK_SYNC();
}

/* ---- attention of request slot b, kv head g (GQA): its `rep` q heads at once -------- */
/* smem: >= max_seq + MK_WARPS + MK_THREADS floats.  op_attn_staged<false> when q, k, v
 * fit there (short T); else scores of all rep heads sit in smem [rep][T] and q, k, v are
 * read from global memory (falls back to op_attn_seq when the scores do not fit either);
 * warp j reduces head j. */
__device__ __noinline__ void op_attn(const MkParams &P, int layer, int b, int g, float *smem) {
    int B = (int)P.batch, hd = (int)P.head_dim, nh = (int)P.n_heads, nkv = (int)P.n_kv_heads;
    int QKV = (int)P.qkv_dim, S = (int)P.max_seq, rep = nh / nkv;
    int T = __ldcg((const int *)P.pos + b) + 1;
    if (attn_staged_fits(P, T)) { op_attn_staged<false>(P, layer, b, g, T - 1, smem); return; }
    int cap = S + MK_THREADS;
    if (rep * T > cap || rep > MK_MAX_REP || rep > MK_WARPS) { op_attn_seq(P, layer, b, g, smem); return; }
    const float *qkv = (const float *)P.qkv + (long)layer * B * QKV;
    const float *kc = (const float *)P.k_cache + (long)layer * B * S * nkv * hd;
    const float *vc = (const float *)P.v_cache + (long)layer * B * S * nkv * hd;
    float *out = (float *)P.attn + (long)layer * B * nh * hd;
    float *sc = smem, *stat = smem + cap;          /* stat[j] = 1 / sum of head j */
    float scale = rsqrtf((float)hd);
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
    attn_softmax_rows(sc, T, rep, stat);
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

/* ---- rope_in_attn task (-DDTMK_ROPE_IN_ATTN, run_body case 3 with aux 1): slot b's q
 * heads of group g and k rope, KV-cache append, attention.  Staged in smem when it fits
 * (op_attn_staged<true>), else rope_kv_slots + op_attn through global memory. */
__device__ __noinline__ void op_rope_attn(const MkParams &P, int layer, int b, int g, float *smem) {
    int p = __ldcg((const int *)P.pos + b);
    int pairs = (mk_rep(P) + 1) * (int)(P.head_dim >> 1);   /* one rope pair per thread */
    if (pairs <= MK_THREADS && attn_staged_fits(P, p + 1)) { op_attn_staged<true>(P, layer, b, g, p, smem); return; }
    rope_kv_slots(P, layer, g, g + 1, b, b + 1);
    MK_SYNC();             /* the rotated q and the new cache row are read by other threads */
    op_attn(P, layer, b, g, smem);
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

/* slots per staged chunk of a fused prologue (the whole batch when it fits in xs) */
__device__ __forceinline__ int fused_chunk_of(const MkParams &P) {
    int c = (int)(P.xs_cap / P.hidden);
    return max(1, min(c, (int)P.batch));
}

#ifdef DTMK_WSTREAM
/* ==== weight streaming through shared memory (-DDTMK_WSTREAM, docs/dev/megakernel_speed.md
 * "Session 4") ====
 * A task's weight rows are copied into a ring of DTMK_WS_NST stages of DTMK_WS_STAGE bytes
 * (dynamic shared memory after xs, carved by ws_init) with TMA 1-D bulk copies
 * (cp.async.bulk ... mbarrier::complete_tx), one "full" mbarrier per stage.  The first
 * min(NST, stages) are issued by warp 1 of wait_event BEFORE the dependency is met
 * (weights do not depend on activations: ws_prestart, megakernel.cu); the rest by the
 * last of the 16 warps done with a stage (ws_release: every warp waits for every stage in
 * order and counts itself done with it, rows of its own or not), so the SM always has up
 * to NST stages in flight and nobody blocks on a producer.
 * A stage holds whole rows (of a split-K tile: the tile's K-slice of each row): rps rows of
 * A, then (gate/up) the same rps rows of B.  Row r of the tile is computed by warp r % 16
 * with the same per-lane order as mv_row / mv_row2 (lane l sums its 16-byte chunks
 * i = l, l + 32, ... in ascending order from 0.0f, then warp_sum): the bits equal the
 * default build's.  Covered: fused qkv / lm_head (op_fused_proj), fused gate/up, split-K
 * attn_o / mlp_down (op_split_proj), batch <= MK_MAXB, one rank; everything else (the
 * standard lowering, MoE experts and router, tensor parallel) keeps the old path. */
/* Three stages (session 36; four before): 96 KB in flight per SM streams as fast as 128 KB
 * (docs/results/megakernel.md "Ring depth"), and the hook builds' static shared memory
 * (Obs, 27-32 KB) then fits the no-hook build's carveout -- L1 92 KB instead of 60: 1b's
 * hook build off -2.5..-2.7%, the observer-SM build's hot summary / own off +8.1% -> +6.5%
 * (docs/results/hooks.md "Session 36").  gpu.ws_ring_default reads these two #defines: the
 * launch sizes its shared memory by them (keep the form "#define NAME number"). */
#ifndef DTMK_WS_NST
#define DTMK_WS_NST 3
#endif
#ifndef DTMK_WS_STAGE
#define DTMK_WS_STAGE 32768
#endif
#if DTMK_WS_STAGE % 128 || DTMK_WS_STAGE > 65536 || DTMK_WS_NST < 1
#error "DTMK_WS_STAGE: a multiple of 128 bytes, at most 64 KB; DTMK_WS_NST >= 1"
#endif
#define MK_WS_MAXR 32          /* rows per stage at most: one bulk copy per lane of the issuing warp */
#ifdef DTMK_WS_NEXT
/* -DDTMK_WS_NEXT (docs/dev/megakernel_speed.md "Session 4b"): the ring never drains between
 * a worker's tasks.  Global stage indices run on across streams, so "stage g + NST goes into
 * g's slot once the 16 warps are done with g" holds whatever stream g + NST belongs to: the
 * stream d being consumed is followed in the ring by nd, the stream of the worker's NEXT
 * static task (ws_next, known before d's body starts: the static per-SM plan).  Releases of
 * d's last NST stages issue nd's first ones (ws_release), and a short d (fewer than NST
 * stages) leaves its free slots to nd at once (ws_fill); at d's end nd becomes the live
 * stream with its first min(NST, stages) issued -- the state ws_start leaves -- so the next
 * wait finds it started.  State at the CTA's quiescent points (between barriers, nobody in a
 * body): global stages [seq, top) are issued, every stage below seq is landed and nobody
 * reads it; stage seq + x is d's stage x (x < d.nst), else nd's stage x - d.nst; top - seq
 * <= NST; !live => top == seq.  tests/kernels/test_wstream.py models it (random
 * interleavings, mispredictions, aborts) and shows three unsound orderings failing. */
#ifndef DTMK_WSTREAM
#error "DTMK_WS_NEXT needs the weight stream (drop DTMK_NO_WSTREAM)"
#endif
#endif
/* -DDTMK_WS_NEXT_NOTAIL (with DTMK_WS_NEXT): the next stream gets only the slots that are free
 * at a task boundary (a short stream's, an unstreamed task's wait: ws_fill), never those the
 * current tile's releases free (its tail): tests whether next-task stages issued during the
 * current level's tail steal HBM from its stragglers (docs/dev/megakernel_speed.md "Session 4b") */
#if defined(DTMK_WS_NEXT_NOTAIL) && !defined(DTMK_WS_NEXT)
#error "DTMK_WS_NEXT_NOTAIL is an option of DTMK_WS_NEXT"
#endif

struct WsDesc {             /* the weight stream of one tile */
    const char *a, *b;      /* row lo (and column k0 of a split-K slice) of A, of B (gate/up's up; 0: none) */
    unsigned row_bytes, ld_bytes;   /* bytes of a row's (slice), global row stride */
    int rows, rps, nst;     /* rows of the tile, rows per stage, stages */
};
struct WsState {
    unsigned long long full[DTMK_WS_NST];   /* mbarrier per slot: the stage's bytes landed */
    int cnt[DTMK_WS_NST];   /* warps done with the slot's stage so far */
    unsigned seq;           /* global index of the stream's first stage (all stages before it landed) */
    int live;               /* 1: d started (its first min(NST, nst) stages issued), not yet consumed */
    int on;                 /* the ring fits in the launch's dynamic shared memory */
    unsigned ring;          /* shared-window address of slot 0 (128-byte aligned) */
    char *ringp;            /* the same, generic */
    unsigned npre, nmiss;   /* streams started by the dependency wait / by a body (prediction missed) */
    int fused_c;            /* fused_chunk_of(P), set by ws_init */
    WsDesc d;
#ifdef DTMK_WS_NEXT
    WsDesc nd;              /* the stream of the worker's next static task, valid when nvalid (ws_next) */
    int nvalid;
    unsigned top;           /* one past the last issued global stage (at quiescent points) */
    unsigned nchain, nearly;   /* streams made live by the previous stream's end (ws_end) / started
                                * early by an unstreamed previous task's wait (ws_prestart) */
#endif
};
__shared__ __align__(16) WsState ws_s;
/* per launch, summed over workers at the end (megakernel.cu; tests/gpu read it by name):
 * [0] stages issued, [1] streams started by the dependency wait, [2] started by a body */
extern "C" __device__ unsigned long long dtmk_ws_stats[3];
__device__ unsigned long long dtmk_ws_stats[3];
#ifdef DTMK_WS_NEXT
/* [0] streams chained (live at the previous stream's end: not counted in dtmk_ws_stats[1]),
 * [1] streams started early by an unstreamed previous task's wait (counted in [1] there) */
extern "C" __device__ unsigned long long dtmk_ws_next_stats[2];
__device__ unsigned long long dtmk_ws_next_stats[2];
#endif

#ifdef DTMK_PHASE_PROF
/* -DDTMK_PHASE_PROF (measurement: bench/level_profile.py reads it for builds that have it;
 * docs/dev/megakernel_speed.md "Session 23"): where a streamed tile's body goes, as thread 0
 * sees it, in SM cycles summed over workers at the kernel end into dtmk_phase_prof[op][PH_N],
 * op = PH_QKV, PH_LM, PH_GU, PH_ATTNO, PH_DOWN: [0] tiles, [1] body entry -> activations staged
 * (down's commit, the norm fold or x's copy, the barrier after it), [2] staged -> the tile's
 * stream consumed (ws_end), [3] of [1] + [2], cycles in ws_wait (mbarrier.try_wait suspends the
 * thread until the stage lands or a time limit: the call is the wait), [4] ws_wait calls,
 * [5] of them longer than 400 cycles (the stage had not landed), [6] the tile's first stage's;
 * batch-1 tiles (ws_tile_xr): [7] warp 0's own rows (dot products, sums, output stores),
 * [8] its ws_release calls (fence, count, the refill's issue when last), [9] ws_end's barrier
 * (waiting for the warps with the last stage's rows).  Thread 0 is warp 0: it computes every
 * 16th row but waits for every stage. */
enum { PH_QKV, PH_LM, PH_GU, PH_ATTNO, PH_DOWN, PH_OPS };
#define PH_N 10
extern "C" __device__ unsigned long long dtmk_phase_prof[PH_OPS * PH_N];
__device__ unsigned long long dtmk_phase_prof[PH_OPS * PH_N];
__shared__ unsigned long long s_ph[PH_OPS * PH_N];
__shared__ int s_ph_op;              /* the op of the tile in progress (thread 0's), -1: none */
__shared__ long long s_ph_t;         /* thread 0: the tile's entry, then its staged stamp */
__device__ __forceinline__ void ph_begin(int op) {
    if (threadIdx.x == 0) { s_ph_op = op; s_ph_t = clock64(); }
}
__device__ __forceinline__ void ph_staged() {
    if (threadIdx.x == 0 && s_ph_op >= 0) {
        const long long t = clock64();
        s_ph[s_ph_op * PH_N + 1] += (unsigned long long)(t - s_ph_t);
        s_ph_t = t;
    }
}
__device__ __forceinline__ void ph_end() {
    if (threadIdx.x == 0 && s_ph_op >= 0) {
        s_ph[s_ph_op * PH_N] += 1;
        s_ph[s_ph_op * PH_N + 2] += (unsigned long long)(clock64() - s_ph_t);
        s_ph_op = -1;
    }
}
/* thread 0: the cycles since PH_T() (same scope) into counter k of the tile in progress */
#define PH_T() const long long ph_c = threadIdx.x == 0 ? clock64() : 0
#define PH_ADD(k) do { if (threadIdx.x == 0 && s_ph_op >= 0) s_ph[s_ph_op * PH_N + (k)] += (unsigned long long)(clock64() - ph_c); } while (0)
#else
#define PH_T() ((void)0)
#define PH_ADD(k) ((void)0)
#define ph_begin(op) ((void)0)
#define ph_staged() ((void)0)
#define ph_end() ((void)0)
#endif
__device__ __forceinline__ unsigned ws_bar(unsigned g) {
    return (unsigned)__cvta_generic_to_shared(&ws_s.full[g % DTMK_WS_NST]);
}
/* stage with global index g landed.  A bulk copy lands within microseconds; a wait of 2 s
 * is a protocol bug: trap (a launch error) instead of hanging the GPU */
__device__ __forceinline__ void ws_wait(unsigned g) {
    const unsigned bar = ws_bar(g), par = (g / DTMK_WS_NST) & 1u;
    dtmk_u64 t0 = 0;
#ifdef DTMK_PHASE_PROF
    const int ph = threadIdx.x == 0 ? s_ph_op : -1;
    const long long pc = ph >= 0 ? clock64() : 0;
#endif
    for (unsigned it = 1;; ++it) {
        unsigned ok;
        asm volatile("{\n\t.reg .pred p;\n\tmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
                     "selp.u32 %0, 1, 0, p;\n\t}" : "=r"(ok) : "r"(bar), "r"(par) : "memory");
        if (ok) break;
        if ((it & 1023) == 0) {
            if (!t0) t0 = mk_now();
            else if (mk_now() - t0 > 2000000000ull) __trap();
        }
    }
#ifdef DTMK_PHASE_PROF
    if (ph >= 0) {       /* (try_wait suspends the thread a while: time the call, not the tries) */
        const unsigned long long c = (unsigned long long)(clock64() - pc);
        s_ph[ph * PH_N + 3] += c; s_ph[ph * PH_N + 4] += 1;
        if (c > 400) s_ph[ph * PH_N + 5] += 1;
        if (g == ws_s.seq) s_ph[ph * PH_N + 6] += c;
    }
#endif
}

/* thread 0, kernel prologue: the ring after xs when the launch gave the shared memory
 * (gpu.Megakernel adds it for DTMK_WSTREAM builds); its mbarriers */
__device__ void ws_init(const MkParams &P, float *smem) {
    unsigned dyn;
    asm volatile("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dyn));
    const unsigned base = (unsigned)__cvta_generic_to_shared(smem);
    const unsigned ring = (base + (unsigned)(P.xs_off + P.xs_cap) * 4u + 127u) & ~127u;
    ws_s.on = ring - base + (unsigned)DTMK_WS_NST * DTMK_WS_STAGE <= dyn;
    ws_s.ring = ring;
    ws_s.ringp = (char *)smem + (ring - base);
    ws_s.seq = 0; ws_s.live = 0; ws_s.npre = 0; ws_s.nmiss = 0;
    ws_s.fused_c = fused_chunk_of(P);
#ifdef DTMK_WS_NEXT
    ws_s.top = 0; ws_s.nvalid = 0; ws_s.nchain = 0; ws_s.nearly = 0;
#endif
    for (int k = 0; k < DTMK_WS_NST; ++k) {
        ws_s.cnt[k] = 0;
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(ws_bar(k)) : "memory");
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n\tfence.proxy.async.shared::cta;" ::: "memory");
}

/* the stream of a tile: `rows` rows of K bf16 from a (and b), global row stride ldw
 * elements; false: this tile keeps the old path */
__device__ __forceinline__ bool ws_desc(const MkParams &P, WsDesc &d, const unsigned short *a,
                                        const unsigned short *b, int K, long ldw, int rows) {
    if (!ws_s.on || P.ranks > 1 || (int)P.batch > MK_MAXB || rows <= 0 || K <= 0) return false;
    const unsigned rb = (unsigned)K * 2u, per = b ? 2u * rb : rb;
    const bool contig = ldw == (long)K;
    int rps = (int)min((unsigned)DTMK_WS_STAGE / per, (unsigned)(contig || !b ? MK_WS_MAXR : MK_WS_MAXR / 2));
    if (rps < 1 || ((((unsigned long long)a) | ((unsigned long long)b) | rb | (unsigned long long)ldw * 2) & 15))
        return false;
    d.a = (const char *)a; d.b = (const char *)b; d.row_bytes = rb; d.ld_bytes = (unsigned)(ldw * 2);
    d.rows = rows; d.rps = rps; d.nst = (int)(((unsigned)rows + (unsigned)rps - 1u) / (unsigned)rps);   /* (both > 0: unsigned) */
    return true;
}
__device__ __forceinline__ bool ws_same(const WsDesc &x, const WsDesc &y) {
    return x.a == y.a && x.b == y.b && x.row_bytes == y.row_bytes && x.ld_bytes == y.ld_bytes && x.rows == y.rows;
}

/* whole warp: issue stage j of d as global stage g (its slot is free: never read again) */
__device__ __forceinline__ void ws_issue(const WsDesc &d, unsigned g, int j) {
    const int lane = threadIdx.x & 31;
    const int r0 = j * d.rps, n = min(d.rps, d.rows - r0);
    const bool contig = d.ld_bytes == d.row_bytes;
    const int nc = contig ? (d.b ? 2 : 1) : (d.b ? 2 * n : n);
    const unsigned bar = ws_bar(g), dst = ws_s.ring + (g % DTMK_WS_NST) * DTMK_WS_STAGE;
    /* generic-proxy reads of the slot (ordered before this by the caller's barrier or
     * release counter) before the async proxy's writes */
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    if (lane == 0)
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;"
                     :: "r"(bar), "r"((unsigned)n * d.row_bytes * (d.b ? 2u : 1u)) : "memory");
    __syncwarp();
    if (lane < nc) {
        const bool isb = contig ? lane == 1 : lane >= n;
        const int r = contig ? 0 : (isb ? lane - n : lane);
        const unsigned bytes = contig ? (unsigned)n * d.row_bytes : d.row_bytes;
        const char *src = (isb ? d.b : d.a) + (long)(r0 + r) * d.ld_bytes;
        const unsigned to = dst + (isb ? (unsigned)d.rps * d.row_bytes : 0u) + (unsigned)r * d.row_bytes;
#ifndef DTMK_WS_EVICT_NORMAL
        /* weights are read once per step (2 GB through a 50 MB L2): their lines are
         * evict-first so they do not push the kernel's code, the task tables and the
         * activations out of L2.  H200 1b: 1551 -> 1381 us/step, bits equal
         * (docs/dev/megakernel_speed.md "Session 5"); -DDTMK_WS_EVICT_NORMAL = the old copies */
        unsigned long long pol;
        asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
        asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;"
                     :: "r"(to), "l"(src), "r"(bytes), "r"(bar), "l"(pol) : "memory");
#else
        asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                     :: "r"(to), "l"(src), "r"(bytes), "r"(bar) : "memory");
#endif
    }
}
#ifndef DTMK_WS_NEXT
/* whole warp: wait for the stages of a started, never consumed stream and forget it */
__device__ void ws_drop() {
    if (!ws_s.live) return;
    const unsigned g0 = ws_s.seq;
    const int first = min(DTMK_WS_NST, ws_s.d.nst);
    for (int j = 0; j < first; ++j) ws_wait(g0 + j);
    __syncwarp();
    if ((threadIdx.x & 31) == 0) { ws_s.seq = g0 + first; ws_s.live = 0; }
    __syncwarp();
}
/* whole warp (the ring idle: ws_drop first): start d, its first min(NST, nst) stages */
__device__ void ws_start(const WsDesc &d) {
    const unsigned g0 = ws_s.seq;
    const int first = min(DTMK_WS_NST, d.nst);
    for (int j = 0; j < first; ++j) ws_issue(d, g0 + j, j);
    __syncwarp();
    if ((threadIdx.x & 31) == 0) { ws_s.d = d; ws_s.live = 1; }
    __syncwarp();
}
#else /* DTMK_WS_NEXT */
/* whole warp: wait for every issued, never consumed stage (the live stream's and the next
 * stream's started ones) and forget them */
__device__ void ws_drop() {
    if (!ws_s.live) return;              /* !live => top == seq */
    const unsigned top = ws_s.top;
    for (unsigned g = ws_s.seq; g != top; ++g) ws_wait(g);
    __syncwarp();
    if ((threadIdx.x & 31) == 0) { ws_s.seq = top; ws_s.live = 0; }
    __syncwarp();
}
/* whole warp, at a quiescent point with d (ws_s.d) live: issue every stage of d, then nd, that
 * has a free slot now -- global stages [top, seq + NST) -- and advance top */
__device__ void ws_fill() {
    const unsigned seq = ws_s.seq, top = ws_s.top;
    const int na = ws_s.d.nst, end = min(DTMK_WS_NST, na + (ws_s.nvalid ? ws_s.nd.nst : 0));
    for (int x = (int)(top - seq); x < end; ++x) {
        const bool a = x < na;
        ws_issue(a ? ws_s.d : ws_s.nd, seq + (unsigned)x, a ? x : x - na);
    }
    __syncwarp();
    if ((threadIdx.x & 31) == 0 && (int)(top - seq) < end) ws_s.top = seq + (unsigned)end;
    __syncwarp();
}
/* whole warp (the ring idle: ws_drop first): make d live, issue its first stages (and nd's,
 * when d is shorter than the ring) */
__device__ void ws_start(const WsDesc &d) {
    if ((threadIdx.x & 31) == 0) { ws_s.d = d; ws_s.live = 1; }
    __syncwarp();
    ws_fill();
}
/* whole warp (the ring idle, nvalid): the next task's stream becomes the live one now */
__device__ void ws_start_next() {
    if ((threadIdx.x & 31) == 0) { ws_s.d = ws_s.nd; ws_s.nvalid = 0; ws_s.live = 1; ++ws_s.nearly; }
    __syncwarp();
    ws_fill();
}
#endif /* DTMK_WS_NEXT */
/* whole CTA, a tile's body: make d the live stream (started by the dependency wait,
 * ws_prestart, unless that predicted another stream or none) */
#ifndef DTMK_WS_NEXT
__device__ __forceinline__ void ws_begin(const WsDesc &d) {
    const bool miss = !ws_s.live || !ws_same(ws_s.d, d);
    if (__syncthreads_or(miss)) {          /* everyone read ws_s before warp 0 rewrites it */
        if ((threadIdx.x >> 5) == 0) {
            ws_drop();
            ws_start(d);
            if (threadIdx.x == 0) ++ws_s.nmiss;
        }
        MK_SYNC();
    }
}
#else /* DTMK_WS_NEXT: also fills the free slots the wait left (-DDTMK_WS_NOPRE: a chained
       * stream's successor stages), so that ws_end's top is exact */
__device__ __forceinline__ void ws_begin(const WsDesc &d) {
    const bool hit = ws_s.live && ws_same(ws_s.d, d);
    const int full = min(DTMK_WS_NST, d.nst + (ws_s.nvalid ? ws_s.nd.nst : 0));
    if (__syncthreads_or(!hit || (int)(ws_s.top - ws_s.seq) < full)) {   /* all read ws_s first */
        if ((threadIdx.x >> 5) == 0) {
            if (!hit) {
                ws_drop();
                ws_start(d);
                if (threadIdx.x == 0) ++ws_s.nmiss;
            } else {
                ws_fill();
            }
        }
        MK_SYNC();
    }
}
#endif
/* whole CTA after the tile's rows: every stage landed and was read; the next stream
 * starts after them */
__device__ __forceinline__ void ws_end(const WsDesc &d) {
    {
        PH_T();
        MK_SYNC();
        PH_ADD(9);
    }
#ifndef DTMK_WS_NEXT
    if (threadIdx.x == 0) { ws_s.seq += (unsigned)d.nst; ws_s.live = 0; }
#else
    /* the releases issued global stages up to min(seq + d.nst + NST, seq + d.nst + nd.nst):
     * nd's first min(NST, nd.nst), the state ws_start leaves (d is ws_s.d: read before nd) */
    if (threadIdx.x == 0) {
        const unsigned s = ws_s.seq + (unsigned)d.nst;
        ws_s.seq = s;
        if (ws_s.nvalid) {
            ws_s.d = ws_s.nd; ws_s.nvalid = 0; ws_s.live = 1;
#ifndef DTMK_WS_NEXT_NOTAIL
            ws_s.top = s + (unsigned)min(DTMK_WS_NST, ws_s.nd.nst);
#else       /* only what ws_fill issued (maybe nothing: live with top == seq, the wait fills) */
            if ((int)(ws_s.top - s) < 0) ws_s.top = s;
#endif
            ++ws_s.nchain;
        } else {
            ws_s.live = 0; ws_s.top = s;
        }
    }
#endif
}
/* whole warp, done with stage j (global g; its rows computed, if any): the 16th warp done
 * refills the slot with stage j + NST.  (Session 24, plan 37: the count's fences, a release on
 * per-slot "empty" mbarriers and warps skipping stages without rows did not move the step --
 * docs/dev/megakernel_speed.md "Session 24") */
__device__ __forceinline__ void ws_release(const WsDesc &d, unsigned g, int j) {
    __syncwarp();
    int last = 0;
    if ((threadIdx.x & 31) == 0) {
        int *c = &ws_s.cnt[g % DTMK_WS_NST];
        __threadfence_block();             /* this warp's reads of the slot before the count */
        last = atomicAdd(c, 1) == MK_WARPS - 1;
        if (last) { *c = 0; __threadfence_block(); }
    }
    last = __shfl_sync(MK_FULL, last, 0);
#ifndef DTMK_WS_NEXT
    if (last && j + DTMK_WS_NST < d.nst) ws_issue(d, g + DTMK_WS_NST, j + DTMK_WS_NST);
#else
    /* global stage g + NST: d's stage j + NST, or past d's end the next stream's */
#ifndef DTMK_WS_NEXT_NOTAIL
    if (last) {
        int k = j + DTMK_WS_NST;
        const bool a = k < d.nst;
        if (!a) k -= d.nst;
        if (a || (ws_s.nvalid && k < ws_s.nd.nst)) ws_issue(a ? d : ws_s.nd, g + DTMK_WS_NST, k);
    }
#else
    if (last && j + DTMK_WS_NST < d.nst) ws_issue(d, g + DTMK_WS_NST, j + DTMK_WS_NST);
#endif
#endif
}
/* warp: acc[b] = dot(w[:k8n * 8], x[b]) (b < NB) with mv_row's per-lane order (chunks
 * i = lane, lane + 32, ... ascending, from 0.0f) and warp_sum: mv_row / mv_row2's bits.
 * TWO: also accB from the row at w2 (gate/up: the x loads shared, like mv_row2). */
template <int NB, bool TWO>
__device__ __forceinline__ void ws_row(const uint4 *w, const uint4 *w2, int k8n, const float *x, int xstride,
                                       float *acc, float *accB) {
#pragma unroll
    for (int b = 0; b < NB; ++b) { acc[b] = 0.0f; if (TWO) accB[b] = 0.0f; }
#pragma unroll 4
    for (int i = threadIdx.x & 31; i < k8n; i += 32) {
        const uint4 wv = w[i];
        uint4 wv2;
        if (TWO) wv2 = w2[i];
#pragma unroll
        for (int b = 0; b < NB; ++b) {
            const float *xb = x + (long)b * xstride + (i << 3);
            acc[b] += dot8<true>(wv, xb);
            if (TWO) accB[b] += dot8<true>(wv2, xb);
        }
    }
#pragma unroll
    for (int b = 0; b < NB; ++b) { acc[b] = warp_sum(acc[b]); if (TWO) accB[b] = warp_sum(accB[b]); }
}
/* the warp's first row in the stage starting at row r0 (rows r % 16 == warp); past the
 * stage's n rows when it has none */
__device__ __forceinline__ int ws_first_row(int warp, int r0) { return r0 + ((warp - r0) & (MK_WARPS - 1)); }
/* whole CTA, from the stream d (ws_begin before the activations were staged; xs: [NB][K]
 * in shared memory): GU false: y[b, lo + r] = A[r] . xs[b] (op_proj's store);
 * GU true: act[b, lo + r] = silu(A[r] . xs[b]) * (B[r] . xs[b]) (op_gate_up's expression) */
template <int NB, bool GU>
__device__ __forceinline__ void ws_tile(const float *xs, int K, float *y, int ystride, int lo) {
    const WsDesc &d = ws_s.d;     /* the live stream (read from shared memory: no registers held) */
    const int warp = threadIdx.x >> 5, k8n = K >> 3, rq = (int)(d.row_bytes >> 4);
    const unsigned g0 = ws_s.seq;
    float acc[MK_MAXB], accB[MK_MAXB];
    for (int j = 0; j < d.nst; ++j) {
        const int r0 = j * d.rps, n = min(d.rps, d.rows - r0);
        const unsigned g = g0 + (unsigned)j;
        /* every warp waits for every stage in order and releases it, even one without its
         * rows: a parity wait is sound only while the slot's previous phase is complete and
         * its next one cannot complete (a warp that skipped stage j could take stage j + 2 NST's
         * parity for j's completed phase, or be lapped) */
        ws_wait(g);
        const int first = ws_first_row(warp, r0);
        const uint4 *base = (const uint4 *)(ws_s.ringp + (g % DTMK_WS_NST) * DTMK_WS_STAGE);
        for (int r = first; r < r0 + n; r += MK_WARPS) {
            ws_row<NB, GU>(base + (r - r0) * rq, base + (d.rps + r - r0) * rq, k8n, xs, K, acc, accB);
            if ((threadIdx.x & 31) == 0) {
#pragma unroll
                for (int b = 0; b < NB; ++b)
                    y[(long)b * ystride + lo + r] = GU ? acc[b] / (1.0f + __expf(-acc[b])) * accB[b] : acc[b];
            }
        }
        ws_release(d, g, j);
    }
    ws_end(d);
}
/* ws_tile for one slot and K = 256 * KCH (1b batch 1: K 2048 and split attn_o's 512): a
 * lane's x chunks (the same for every row) live in registers, so shared memory serves
 * only the weights (ws_tile reads 8 KB of x per 4 KB row: its bandwidth, not HBM's, was
 * the bound of a qkv tile).  Same per-lane order: chunk m = 0, 1, ... is i = lane + 32 m. */
template <int KCH, bool GU>
__device__ __forceinline__ void ws_tile_xr(const float *xs, float *y, int lo) {
    const WsDesc &d = ws_s.d;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, rq = 32 * KCH;
    float4 xa[KCH], xb[KCH];
#pragma unroll
    for (int m = 0; m < KCH; ++m) {
        const float *p = xs + ((lane + 32 * m) << 3);
        xa[m] = *(const float4 *)p; xb[m] = *(const float4 *)(p + 4);
    }
    const unsigned g0 = ws_s.seq;
    for (int j = 0; j < d.nst; ++j) {
        const int r0 = j * d.rps, n = min(d.rps, d.rows - r0);
        const unsigned g = g0 + (unsigned)j;
        ws_wait(g);                       /* every stage, in order: see ws_tile */
        const int first = ws_first_row(warp, r0);
        const uint4 *base = (const uint4 *)(ws_s.ringp + (g % DTMK_WS_NST) * DTMK_WS_STAGE) + lane;
        PH_T();
        for (int r = first; r < r0 + n; r += MK_WARPS) {
            const uint4 *w = base + (r - r0) * rq, *w2 = base + (d.rps + r - r0) * rq;
            float acc = 0.0f, accB = 0.0f;
#pragma unroll
            for (int m = 0; m < KCH; ++m) {
                acc += dot8_regs(w[32 * m], xa[m], xb[m]);
                if (GU) accB += dot8_regs(w2[32 * m], xa[m], xb[m]);
            }
            acc = warp_sum(acc);
            if (GU) accB = warp_sum(accB);
            if (lane == 0) y[lo + r] = GU ? acc / (1.0f + __expf(-acc)) * accB : acc;
        }
        PH_ADD(7);
        {
            PH_T();
            ws_release(d, g, j);
            PH_ADD(8);
        }
    }
    ws_end(d);
}
/* the tile of the live stream (ws_begin made it ws_s.d) */
__device__ __noinline__ void ws_proj(const float *xs, int K, int nb, float *y, int ystride, int lo) {
#ifndef DTMK_WS_XSMEM
    if (nb == 1 && K == 2048) { ws_tile_xr<8, false>(xs, y, lo); return; }
    if (nb == 1 && K == 512) { ws_tile_xr<2, false>(xs, y, lo); return; }
#endif
    if (nb == 1) ws_tile<1, false>(xs, K, y, ystride, lo);
    else if (nb == 2) ws_tile<2, false>(xs, K, y, ystride, lo);
    else if (nb == 3) ws_tile<3, false>(xs, K, y, ystride, lo);
    else ws_tile<4, false>(xs, K, y, ystride, lo);
}
__device__ __noinline__ void ws_gate_up(const float *xs, int K, int nb, float *act, int astride, int lo) {
#ifndef DTMK_WS_XSMEM
    if (nb == 1 && K == 2048) { ws_tile_xr<8, true>(xs, act, lo); return; }
#endif
    if (nb == 1) ws_tile<1, true>(xs, K, act, astride, lo);
    else if (nb == 2) ws_tile<2, true>(xs, K, act, astride, lo);
    else if (nb == 3) ws_tile<3, true>(xs, K, act, astride, lo);
    else ws_tile<4, true>(xs, K, act, astride, lo);
}
#endif /* DTMK_WSTREAM */

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
/* the residual buffer the norms of layer `layer` read (n_layers: the final norm's).  One
 * buffer, except -DDTMK_H_PARITY (slice_events graphs, gpu.megakernel_defines): two by layer
 * parity, so mlp_down(l)'s K-slice 0 commits into h[(l + 1) % 2] while the gate_up tiles of
 * other slices, which no longer all finish before it, still read h[l % 2] (graph.py "Fused
 * norm and split-K") */
__device__ __forceinline__ float *mk_hbuf(const MkParams &P, int layer) {
#ifdef DTMK_H_PARITY
    return (float *)P.h + (long)(layer & 1) * (long)P.batch * (long)P.hidden;
#else
    (void)layer;
    return (float *)P.h;
#endif
}
/* h[b][i..i+3] (layer hl's mk_hbuf) plus the pending partials, in the one fixed order above */
__device__ __forceinline__ float4 mk_resid4(const MkParams &P, int hl, int b, int i, int pm, bool pa, int S) {
    long BH = (long)P.batch * (long)P.hidden, off = (long)b * (long)P.hidden + i;
    const float *part = (const float *)P.moe_part;
#ifndef DTMK_PROLOGUE_SERIAL
    {   /* batched loads for the split factors benched (graph.py split_k 2 and 4) */
        const float *hp = mk_hbuf(P, hl);
        if (S == 4 && pm >= 0 && pa) return mk_resid4_s<4, true, true>(hp, part, BH, off, pm);
        if (S == 4 && pm >= 0) return mk_resid4_s<4, true, false>(hp, part, BH, off, pm);
        if (S == 4 && pa) return mk_resid4_s<4, false, true>(hp, part, BH, off, pm);
        if (S == 2 && pm >= 0 && pa) return mk_resid4_s<2, true, true>(hp, part, BH, off, pm);
        if (S == 2 && pm >= 0) return mk_resid4_s<2, true, false>(hp, part, BH, off, pm);
        if (S == 2 && pa) return mk_resid4_s<2, false, true>(hp, part, BH, off, pm);
    }
#endif
    float4 v = __ldcg((const float4 *)(mk_hbuf(P, hl) + off));
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
    const int hl = kind == 2 ? (int)P.n_layers : layer;     /* whose h (mk_hbuf) */
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
                v = mk_resid4(P, hl, b, i, pm, pa, S);
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
            float4 v = mk_resid4(P, hl, b, i, pm, pa, S);
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

#ifdef DTMK_WSTREAM
/* (the megakernel: computed once, ws_init -- the 64-bit divide was ~70 instructions in every
 * fused task's prologue; smaller code, no measurable step change: docs/results/megakernel.md
 * "Session 36") */
__device__ __forceinline__ int fused_chunk(const MkParams &) { return ws_s.fused_c; }
#else
__device__ __forceinline__ int fused_chunk(const MkParams &P) { return fused_chunk_of(P); }
#endif

/* fused-norm projection tile (qkv kind 0; lm_head kind 2 through op_lm_tile) */
__device__ void op_fused_proj(const MkParams &P, const unsigned short *W, float *y, int ystride, int lo, int hi,
                              int kind, int layer, int S, float *smem) {
    int H = (int)P.hidden, B = (int)P.batch, C = fused_chunk(P);
    float *xs = smem + P.xs_off;
#ifdef DTMK_WSTREAM
    WsDesc d;    /* same test and pointers as ws_task_desc (cls 1 / 9) */
    if (C >= B && ws_desc(P, d, W + (long)lo * H, 0, H, H, hi - lo)) {
        ph_begin(kind == 0 ? PH_QKV : PH_LM);
        ws_begin(d);
        stage_norm(P, xs, smem, kind, layer, S, 0, B);
        ph_staged();
        ws_proj(xs, H, B, y, ystride, lo);
        ph_end();
        return;
    }
#endif
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
#ifdef DTMK_WSTREAM
    WsDesc d;    /* same test and pointers as ws_task_desc (cls 5) */
    if (C >= B && ws_desc(P, d, Wg + (long)lo * H, Wu + (long)lo * H, H, H, hi - lo)) {
        ph_begin(PH_GU);
        ws_begin(d);
        stage_norm(P, xs, smem, 1, layer, S, 0, B);
        ph_staged();
        ws_gate_up(xs, H, B, act, F, lo);
        ph_end();
        return;
    }
#endif
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
 * layer's gate/up tiles normalised (written to the next layer's mk_hbuf). */
__device__ void op_split_proj(const MkParams &P, const unsigned short *W, int Kfull, const float *x, int set,
                              int s, int S, int lo, int hi, bool commit, int layer, float *smem) {
    int B = (int)P.batch, H = (int)P.hidden, Ks = Kfull / S;
#ifdef DTMK_PHASE_PROF
    if (ws_s.on) ph_begin(Kfull == (int)P.ffn ? PH_DOWN : PH_ATTNO);   /* (ph_end below: ws path only) */
#endif
    if (commit) {
        int pm; bool pa;
        mk_pending(P, 1, layer, S, pm, pa);
        float *h = mk_hbuf(P, layer + 1);     /* = layer's but with -DDTMK_H_PARITY */
        for (int idx = threadIdx.x * 4; idx < B * (hi - lo); idx += MK_THREADS * 4) {
            int b = idx / (hi - lo), i = lo + idx % (hi - lo);     /* (hi - lo) % 4 == 0 */
            *(float4 *)(h + (long)b * H + i) = mk_resid4(P, layer, b, i, pm, pa, S);
        }
    }
    float *y = (float *)P.moe_part + ((long)set * S + s) * B * H;
#ifdef DTMK_WSTREAM
    WsDesc d;    /* same test and pointers as ws_task_desc (cls 4 / 6) */
    float *xs = smem + P.xs_off;
    if ((long)B * Ks <= (long)P.xs_cap && ws_desc(P, d, W + (long)lo * Kfull + (long)s * Ks, 0, Ks, Kfull, hi - lo)) {
        ws_begin(d);
        for (int b = 0; b < B; ++b)          /* op_proj's staging of a strided x */
            for (int i = threadIdx.x * 4; i < Ks; i += MK_THREADS * 4)
                *(float4 *)(xs + (long)b * Ks + i) = __ldcg((const float4 *)(x + (long)s * Ks + (long)b * Kfull + i));
        MK_SYNC();
        ph_staged();
        ws_proj(xs, Ks, B, y, H, lo);
        ph_end();
        return;
    }
#endif
#ifdef DTMK_PHASE_PROF
    if (threadIdx.x == 0) s_ph_op = -1;     /* the old path: not a streamed tile */
#endif
    op_proj(W + (long)s * Ks, Ks, x + (long)s * Ks, y, H, B, lo, hi, false, smem + P.xs_off, (int)P.xs_cap,
            Kfull, Kfull);
}

#ifdef DTMK_WSTREAM
/* the weight stream the body of static task record r will consume (megakernel.cu run_body:
 * the same conditions and pointers as op_fused_proj / op_fused_gate_up / op_split_proj);
 * false: none (the body keeps the old path) */
__device__ bool ws_task_desc(const MkParams &P, const int *r, WsDesc &d) {
    const int cls = r[0], layer = r[1], lo = r[4], hi = r[5], B = (int)P.batch, H = (int)P.hidden;
    /* one ws_desc call for every class (session 36: three inlined copies were ~1/3 of
     * ws_prestart's code) */
    const unsigned short *a, *b = 0;
    int K = H;
    long ldw = H;
    switch (cls) {
    case 1: case 9:   /* fused qkv / lm_head (op_lm_tile: fused when split_k r[13] >= 1) */
        if (r[12] < 0 || (cls == 9 && r[13] < 1) || fused_chunk(P) < B) return false;
        a = (cls == 1 ? (const unsigned short *)P.w_qkv + (long)layer * P.qkv_dim * H
                      : (const unsigned short *)P.w_lm_head) + (long)lo * H;
        break;
    case 5: {         /* fused gate/up */
        if (r[12] < 0 || fused_chunk(P) < B) return false;
        const long F = (long)P.ffn, di = r[14];
        a = (const unsigned short *)P.w_gate + di * F * H + (long)lo * H;
        b = (const unsigned short *)P.w_up + di * F * H + (long)lo * H;
        break;
    }
    case 4: case 6: { /* split-K attn_o / mlp_down: tile w = split index */
        const int S = r[12];
        if (S <= 1) return false;
        const int Kfull = cls == 4 ? (int)(P.n_heads * P.head_dim) : (int)P.ffn, Ks = Kfull / S;
        const int s = (int)((unsigned)r[11] >> 16);
        if ((long)B * Ks > (long)P.xs_cap) return false;
        a = (cls == 4 ? (const unsigned short *)P.w_o + (long)layer * H * Kfull
                      : (const unsigned short *)P.w_down + (long)r[14] * H * Kfull) + (long)lo * Kfull + (long)s * Ks;
        K = Ks; ldw = Kfull;
        break;
    }
    default: return false;
    }
    return ws_desc(P, d, a, b, K, ldw, hi - lo);
}
#endif

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
