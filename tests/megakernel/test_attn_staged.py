"""CI (no GPU): attention staged in shared memory (kernels/mk_ops.cuh op_attn_staged,
op_rope_attn).  The staged path issues every global load of an attn task in one batch
after pos (no global load after its first CTA barrier), is the path of every build
(eager baseline, megakernel with and without -DDTMK_ROPE_IN_ATTN) unless
-DDTMK_ATTN_UNSTAGED, fits the benchmark's requests in the task scratch, and its
arithmetic order (modelled in NumPy here) matches the reference within fp32 tolerance.
The bits (staged == unstaged == eager) are checked on the GPU
(tests/gpu/test_attn_staged_gpu.py, tests/gpu/test_megakernel_fused_gpu.py)."""
import re
from dataclasses import replace

import numpy as np
import pytest

from dtrace_mk.kernels.build import ptx_function
from dtrace_mk.megakernel import gpu
from dtrace_mk.megakernel.presets import PRESETS
from dtrace_mk.megakernel.reference import ReferenceModel, Requests

STAGED_T = "_Z14op_attn_stagedILb1EEvRK8MkParamsiiiiPf"     # op_attn_staged<true>  (rope_in_attn)
STAGED_F = "_Z14op_attn_stagedILb0EEvRK8MkParamsiiiiPf"     # op_attn_staged<false> (op_attn)
ROPE_ATTN = "_Z12op_rope_attnRK8MkParamsiiiPf"
OP_ATTN = "_Z7op_attnRK8MkParamsiiiPf"
RUN_BODY = "_Z8run_bodyRK8MkParamsR6WorkeriiPfPKi"

_func = ptx_function                           # a .func's definition, None when the PTX has none


def _calls(body, mangled):
    return re.search(r"call(?:\.uni)?\s*(?:\([^)]*\),\s*)?" + re.escape(mangled) + r"\b", body) is not None


def _one_load_batch(body):
    """Every global load before the first CTA barrier; the data loads (ld.global.cg: qkv
    row, caches) at most 2 per thread (the 2-deep batch).  (baseline.cu reads MkParams
    fields from global memory too: plain ld.global, cached, the same in the old code.)"""
    first_bar = body.index("bar.sync")
    loads = [m.start() for m in re.finditer(r"\bld\.global", body)]
    assert loads and all(i < first_bar for i in loads), "a global load after the first barrier"
    data = [i for i in loads if body.startswith("ld.global.cg", i)]
    assert 1 <= len(data) <= 2


def test_rope_in_attn_build_stages_the_task(megakernel_ptx):
    ptx = megakernel_ptx(("DTMK_ROPE_IN_ATTN",))
    assert _calls(_func(ptx, RUN_BODY), ROPE_ATTN)
    rope_attn = _func(ptx, ROPE_ATTN)
    assert _calls(rope_attn, STAGED_T) and _calls(rope_attn, OP_ATTN)     # staged, else the old path
    _one_load_batch(_func(ptx, STAGED_T))
    _one_load_batch(_func(ptx, STAGED_F))
    assert _calls(_func(ptx, OP_ATTN), STAGED_F)


@pytest.mark.parametrize("name", ["megakernel.cu", "baseline.cu"])
def test_plain_attn_is_staged(megakernel_ptx, name):
    ptx = megakernel_ptx((), name)
    op = _func(ptx, OP_ATTN)
    assert _calls(op, STAGED_F)
    _one_load_batch(_func(ptx, STAGED_F))
    if name == "megakernel.cu":                # without the define run_body never ropes in attn
        assert not _calls(_func(ptx, RUN_BODY), ROPE_ATTN)


def test_unstaged_define_keeps_the_global_memory_path(megakernel_ptx):
    ptx = megakernel_ptx(("DTMK_ROPE_IN_ATTN", "DTMK_ATTN_UNSTAGED"))
    assert _func(ptx, STAGED_T) is None and _func(ptx, STAGED_F) is None
    assert not _calls(_func(ptx, OP_ATTN), STAGED_F)


# ---- the smem budget ----------------------------------------------------------------------

def staged_floats(rep, hd, T):
    """kernels/mk_ops.cuh attn_staged_floats: q [rep][hd] | k [T][hd+4] | v [T][hd] | s [rep][T] | 1/l [rep]"""
    return rep * hd + T * (2 * hd + 4) + rep * T + rep


def test_source_budget_formula_is_the_one_modelled():
    src = (gpu.KERNEL_DIR / "mk_ops.cuh").read_text()
    assert "return (long)rep * hd + (long)T * (2 * hd + 4) + (long)rep * T + rep;" in src
    assert "attn_staged_floats(rep, hd, T) <= (long)P.max_seq + MK_WARPS + MK_THREADS" in src


@pytest.mark.parametrize("batch", [1, 4, 8])
def test_benchmark_requests_fit_the_task_scratch(batch):
    """1b (rope_in_attn): every T the benchmark's requests reach (reference.Requests:
    lengths min_len .. min_len + span - 1) takes the staged path, inside the scratch below
    xs_off that gpu.smem_layout reserves; a rope pair per thread."""
    cfg, req = PRESETS["1b"], Requests()
    rep, hd = cfg.n_heads // cfg.n_kv_heads, cfg.head_dim
    cap = cfg.max_seq + gpu.MK_WARPS + gpu.MK_THREADS
    xs_off = gpu.smem_layout(cfg, batch, 1, gpu.megakernel_defines(cfg, 1))[0]
    assert cap <= xs_off
    t_max = req.min_len + req.span - 1
    assert staged_floats(rep, hd, t_max) <= cap and (rep + 1) * hd // 2 <= gpu.MK_THREADS
    assert rep <= gpu.MK_WARPS and hd % 4 == 0


def test_tiny_covers_both_paths():
    """tiny (max_seq 128): short T staged, longer T on the old path -- the GPU tests of tiny
    (fused s4r, variants) run both in one launch."""
    c = PRESETS["tiny"]
    rep, cap = c.n_heads // c.n_kv_heads, c.max_seq + gpu.MK_WARPS + gpu.MK_THREADS
    fits = [staged_floats(rep, c.head_dim, T) <= cap for T in range(1, 8)]
    assert fits[0] and not fits[-1]


# ---- NumPy model of op_attn_staged<true>'s arithmetic order --------------------------------

def _fmaf(a, b, c):
    return np.float32(np.float64(a) * np.float64(b) + np.float64(c))


def _staged_model(cfg, qkv_row, kc, vc, p, g):
    """out [rep, hd] and the cache rows (k, v) of position p, in the kernel's fp32 order."""
    hd, nh, nkv = cfg.head_dim, cfg.n_heads, cfg.n_kv_heads
    rep, half, T = nh // nkv, hd // 2, p + 1
    f32 = np.float32
    q = qkv_row[g * rep * hd:(g + 1) * rep * hd].reshape(rep, hd).copy()
    k = np.concatenate([kc[:p, g], qkv_row[(nh + g) * hd:(nh + g + 1) * hd][None]]).astype(f32)
    v = np.concatenate([vc[:p, g], qkv_row[(nh + nkv + g) * hd:(nh + nkv + g + 1) * hd][None]]).astype(f32)
    for i in range(half):                                   # rope_angle / rope_rot
        inv = f32(f32(cfg.rope_theta) ** (f32(-2.0) * f32(i) / f32(hd)))
        ang = f32(f32(p) * inv)
        s, c = f32(np.sin(ang)), f32(np.cos(ang))
        for vec in list(q) + [k[T - 1]]:
            a, bb = vec[i], vec[i + half]
            vec[i], vec[i + half] = _fmaf(a, c, -f32(bb * s)), _fmaf(a, s, f32(bb * c))
    scale = f32(1.0 / np.sqrt(np.float64(hd)))
    sc = np.zeros((rep, T), f32)
    for j in range(rep):
        for t in range(T):
            acc = f32(0.0)
            for d in range(hd):                             # d ascending (steps of 4, fmaf each)
                acc = _fmaf(q[j, d], k[t, d], acc)
            sc[j, t] = f32(acc * scale)
    out = np.zeros((rep, hd), f32)
    for j in range(rep):
        e = np.exp(sc[j] - sc[j].max()).astype(f32)
        inv_l = f32(1.0) / f32(sum(e.tolist(), 0.0))
        for d in range(hd):
            o = f32(0.0)
            for t in range(T):                              # t ascending
                o = _fmaf(e[t], v[t, d], o)
            out[j, d] = f32(o * inv_l)
    return out, k[T - 1], v[T - 1]


def test_numpy_model_of_staged_order_matches_reference():
    cfg = replace(PRESETS["tiny"], n_heads=4, n_kv_heads=2, head_dim=16, max_seq=16)
    rng = np.random.default_rng(7)
    hd, nh, nkv = cfg.head_dim, cfg.n_heads, cfg.n_kv_heads
    rep = nh // nkv
    ref = ReferenceModel.__new__(ReferenceModel)
    ref.cfg = cfg
    for p in (0, 3, 6):
        qkv_row = rng.standard_normal((nh + 2 * nkv) * hd).astype(np.float32)
        kc = rng.standard_normal((cfg.max_seq, nkv, hd)).astype(np.float32)
        vc = rng.standard_normal((cfg.max_seq, nkv, hd)).astype(np.float32)
        pos = np.array([p])
        q = ref._rope(qkv_row[:nh * hd].reshape(1, nh, hd), pos)[0]
        k_new = ref._rope(qkv_row[nh * hd:(nh + nkv) * hd].reshape(1, nkv, hd), pos)[0]
        v_new = qkv_row[(nh + nkv) * hd:].reshape(nkv, hd)
        for g in range(nkv):
            out, krow, vrow = _staged_model(cfg, qkv_row, kc, vc, p, g)
            np.testing.assert_allclose(krow, k_new[g], rtol=1e-5, atol=1e-5)
            np.testing.assert_array_equal(vrow, v_new[g])
            kk = np.concatenate([kc[:p, g], k_new[g][None]]).astype(np.float64)
            vv = np.concatenate([vc[:p, g], v_new[g][None]]).astype(np.float64)
            for j in range(rep):
                s = kk @ q[g * rep + j] / np.sqrt(hd)
                w = np.exp(s - s.max())
                np.testing.assert_allclose(out[j], (w @ vv) / w.sum(), rtol=1e-4, atol=1e-5)
