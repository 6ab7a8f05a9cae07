/* baseline.cu: the kernel-per-operator build of the reference decoder.
 *
 * One launch per operator per layer (dtrace_mk/megakernel/baseline.py launches them
 * eagerly or replays them as a captured CUDA graph).  Every kernel calls the same task
 * bodies as the megakernel (mk_ops.cuh) with the same MkParams block, so both builds
 * compute the same bits and greedy tokens agree.  The decode step number lives in
 * device memory (`step_ptr`, advanced by k_finish) so a captured graph replays
 * unchanged step after step.
 */
#include "mk_ops.cuh"

#define BP const MkParams &P = *(const MkParams *)params

/* rmsnorm (kind 0 attention: layer 0 embeds first; 1 mlp; 2 final), after folding the
 * MoE partials of MoE ordinal `fold` (or -1) into h.  One block. */
extern "C" __global__ void __launch_bounds__(MK_THREADS) k_norm(const dtmk_u64 *params, int kind, int layer, int fold) {
    BP;
    __shared__ float scratch[MK_WARPS];
    int B = (int)P.batch, H = (int)P.hidden;
    if (fold >= 0) { moe_fold(P, fold); __threadfence(); __syncthreads(); }
    if (kind == 0 && layer == 0) { for (int b = 0; b < B; ++b) op_embed(P, b); __threadfence(); __syncthreads(); }
    const unsigned short *w = kind == 2 ? (const unsigned short *)P.w_final_norm
        : (const unsigned short *)(kind == 0 ? P.w_attn_norm : P.w_mlp_norm) + (long)layer * H;
    op_rmsnorm(P, w, (const float *)P.h, (float *)P.xn, 0, B, scratch);
}

/* y[b, n] (+)= W[n, :] . x[b, :]; block handles rows blockIdx.x*rows .. +rows */
extern "C" __global__ void __launch_bounds__(MK_THREADS) k_proj(const dtmk_u64 *params, dtmk_u64 W, int K, dtmk_u64 x,
                                                                dtmk_u64 y, int ystride, int rows, int accumulate) {
    BP;
    extern __shared__ float smem[];
    int lo = blockIdx.x * rows;
    op_proj((const unsigned short *)W, K, (const float *)x, (float *)y, ystride, (int)P.batch, lo, lo + rows,
            accumulate != 0, smem + P.xs_off, (int)P.xs_cap);
}

extern "C" __global__ void __launch_bounds__(MK_THREADS) k_gate_up(const dtmk_u64 *params, dtmk_u64 Wg, dtmk_u64 Wu,
                                                                   int K, dtmk_u64 x, dtmk_u64 act, int astride, int rows) {
    BP;
    extern __shared__ float smem[];
    int lo = blockIdx.x * rows;
    op_gate_up((const unsigned short *)Wg, (const unsigned short *)Wu, K, (const float *)x, (float *)act, astride,
               (int)P.batch, lo, lo + rows, 0, 0, smem + P.xs_off, (int)P.xs_cap);
}

/* RoPE + KV append: block = kv head */
extern "C" __global__ void __launch_bounds__(MK_THREADS) k_rope(const dtmk_u64 *params, int layer) {
    BP;
    op_rope_kv(P, layer, blockIdx.x, blockIdx.x + 1);
}

/* attention: block = (kv head, slot) */
extern "C" __global__ void __launch_bounds__(MK_THREADS) k_attn(const dtmk_u64 *params, int layer) {
    BP;
    extern __shared__ float smem[];
    op_attn(P, layer, blockIdx.y, blockIdx.x, smem);
}

extern "C" __global__ void __launch_bounds__(MK_THREADS) k_router(const dtmk_u64 *params, int mi, int layer,
                                                                  const int *step_ptr) {
    BP;
    extern __shared__ float smem[];
    op_router(P, mi, layer, *step_ptr, smem);
}

/* expert tiles: block = expert * expert_tiles + tile; experts without tokens return */
extern "C" __global__ void __launch_bounds__(MK_THREADS) k_expert(const dtmk_u64 *params, int mi) {
    BP;
    extern __shared__ float smem[];
    int et = (int)(P.expert_ffn / P.tile_n), e = blockIdx.x / et, x = blockIdx.x % et;
    int B = (int)P.batch, K = (int)P.top_k;
    __shared__ int on;
    if (threadIdx.x == 0) {
        on = 0;
        for (int i = 0; i < B * K; ++i) on |= ((const int *)P.route_expert)[(long)mi * B * K + i] == e;
    }
    __syncthreads();
    if (!on) return;
    op_expert(P, mi, e, x, x * (int)P.tile_n, (x + 1) * (int)P.tile_n, smem);
}

/* greedy token per slot over the full logits row, slot bookkeeping, step += 1 */
extern "C" __global__ void __launch_bounds__(MK_THREADS) k_finish(const dtmk_u64 *params, int *step_ptr) {
    BP;
    __shared__ float smem[2 * MK_WARPS + 4];
    int step = *step_ptr;
    for (int b = 0; b < (int)P.batch; ++b) {
        int i = op_argmax_row((const float *)P.logits + (long)b * P.vocab, (int)P.vocab, smem);
        if (threadIdx.x == 0) mk_slot_advance(P, b, i, step);
    }
    __syncthreads();
    if (threadIdx.x == 0) *step_ptr = step + 1;
}

/* ---- fused-norm / split-K lowering (ModelConfig.fuse_norm, split_k; graph.py) -------- */
/* projection with the RMSNorm (kind 0 attention, 2 final) computed in the prologue of
 * every block; block = `rows` output rows */
extern "C" __global__ void __launch_bounds__(MK_THREADS) k_fused_proj(const dtmk_u64 *params, dtmk_u64 W, dtmk_u64 y,
                                                                      int ystride, int rows, int kind, int layer, int S) {
    BP;
    extern __shared__ float smem[];
    int lo = blockIdx.x * rows;
    op_fused_proj(P, (const unsigned short *)W, (float *)y, ystride, lo, lo + rows, kind, layer, S, smem);
}

extern "C" __global__ void __launch_bounds__(MK_THREADS) k_fused_gate_up(const dtmk_u64 *params, dtmk_u64 Wg, dtmk_u64 Wu,
                                                                         dtmk_u64 act, int rows, int layer, int S) {
    BP;
    extern __shared__ float smem[];
    int lo = blockIdx.x * rows;
    op_fused_gate_up(P, (const unsigned short *)Wg, (const unsigned short *)Wu, (float *)act, lo, lo + rows, layer, S, smem);
}

/* split-K projection into partial set `set`: block (row block, split s); commit >= 0:
 * blocks of split 0 first commit the residual of layer `layer` (mlp_down) */
extern "C" __global__ void __launch_bounds__(MK_THREADS) k_split_proj(const dtmk_u64 *params, dtmk_u64 W, int Kfull,
                                                                      dtmk_u64 x, int set, int S, int rows, int commit,
                                                                      int layer) {
    BP;
    extern __shared__ float smem[];
    int lo = blockIdx.x * rows, s = blockIdx.y;
    op_split_proj(P, (const unsigned short *)W, Kfull, (const float *)x, set, s, S, lo, lo + rows,
                  commit != 0 && s == 0, layer, smem);
}
