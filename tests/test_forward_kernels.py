"""Conformance of the GPU forward's kernels (kvviz/forward/kernels.py) with their numpy oracles
(kvviz/forward/oracle.py, where each tolerance is derived): shapes off the tiles and lanes, single rows and tokens,
refused empty inputs, weight matrices in parts, f16 weights near f16's limit, extreme activations, long contexts
where the adapter's loop limit allows them and a refusal where it does not. A hardware adapter also runs the head
sizes of real models (their kernels take long to compile on a software rasteriser)."""
from __future__ import annotations

import numpy as np
import pytest

from kvviz.errors import DeviceLimitError, InvalidInput, UnsupportedShape
from kvviz.forward import kernels as K
from kvviz.forward import oracle as O

pytestmark = pytest.mark.gpu

RNG = np.random.default_rng(7)


@pytest.fixture(scope="module")
def fk(rt):
    return K.ForwardKernels(rt)


def _f16(a):
    return np.asarray(a, np.float32).astype(np.float16).astype(np.float32)


def _product(rt, fk, x, w, dtype, *, bias=None, residual=None, max_bytes=None, **kw):
    m, n = x.shape[0], w.shape[0]
    mat = K.upload_matrix(rt, [w], "w", dtype, max_bytes)
    xb = rt.upload(x, "x")
    ob = rt.upload(residual, "out") if residual is not None else rt.empty(m * n * 4, "out")
    bb = rt.upload(bias, "bias") if bias is not None else None
    rt.run(fk.matmul(xb, m, mat, ob, bias=bb, residual=residual is not None, **kw))
    out = rt.read(ob, np.float32, (m, n))
    ref, bound = O.matmul_ref(x, _f16(w) if dtype == "f16" else w, bias, residual)
    return out, ref, bound, mat


# ------------------------------------------------------------------------------------------------ matrix products
GEMM_CASES = [  # M, N, K, tile, weights
    (2, 3, 1, K.MEDIUM, "f32"),        # K of one element: the element-wise loads
    (9, 65, 29, K.MEDIUM, "f32"),      # every dimension off the tile
    (64, 64, 64, K.MEDIUM, "f16"),     # whole tiles
    (130, 200, 68, K.MEDIUM, "f16"),   # tails of M, N and K
    (37, 131, 33, K.LARGE, "f16"),     # f16 rows of odd length (two halves a word straddle rows)
    (70, 40, 2048, K.MEDIUM, "f16"),   # a long K: 128 steps of the loop
]
HARDWARE_GEMM = [(129, 257, 96, K.LARGE, "f32"), (512, 384, 4096, K.LARGE, "f16"), (300, 1000, 576, K.LARGE, "f32")]


@pytest.mark.parametrize("m,n,k,cfg,dtype", GEMM_CASES, ids=[f"{c[0]}x{c[1]}x{c[2]}-{c[3].bm}-{c[4]}" for c in GEMM_CASES])
def test_gemm_matches_the_float64_product_within_its_bound(rt, fk, m, n, k, cfg, dtype):
    _gemm_case(rt, fk, m, n, k, cfg, dtype)


@pytest.mark.parametrize("m,n,k,cfg,dtype", HARDWARE_GEMM, ids=[f"{c[0]}x{c[1]}x{c[2]}-{c[3].bm}-{c[4]}" for c in HARDWARE_GEMM])
def test_gemm_at_model_sizes(rt, fk, m, n, k, cfg, dtype):
    if rt.summary.is_software:
        pytest.skip("each tile variant compiles for seconds on a software rasteriser; one large-tile case runs above")
    _gemm_case(rt, fk, m, n, k, cfg, dtype)


def _gemm_case(rt, fk, m, n, k, cfg, dtype):
    x = RNG.standard_normal((m, k)).astype(np.float32)
    w = RNG.standard_normal((n, k)).astype(np.float32)
    out, ref, bound, _ = _product(rt, fk, x, w, dtype, config=cfg, matvec=False)
    err = np.abs(out - ref)
    assert np.isfinite(out).all() and (err <= bound).all(), f"max err {err.max():.3g}, worst over bound {(err / bound).max():.3g}"


@pytest.mark.parametrize("m,dtype,k", [(1, "f32", 96), (3, "f16", 200), (8, "f32", 37), (1, "f16", 4096)])
def test_matvec_matches_the_float64_product_within_its_bound(rt, fk, m, dtype, k):
    x = RNG.standard_normal((m, k)).astype(np.float32)
    w = RNG.standard_normal((83, k)).astype(np.float32)
    out, ref, bound, _ = _product(rt, fk, x, w, dtype, matvec=True)
    assert (np.abs(out - ref) <= bound).all()


@pytest.mark.parametrize("matvec", [False, True])
def test_bias_residual_and_a_matrix_in_parts(rt, fk, matvec):
    """Parts of 64 rows (a binding limit made small): every part writes its own columns; bias and residual added."""
    m = 4 if matvec else 20
    x = RNG.standard_normal((m, 40)).astype(np.float32)
    w = RNG.standard_normal((150, 40)).astype(np.float32)
    b = RNG.standard_normal(150).astype(np.float32)
    r = RNG.standard_normal((m, 150)).astype(np.float32)
    out, ref, bound, mat = _product(rt, fk, x, w, "f32", bias=b, residual=r, max_bytes=64 * 40 * 4, matvec=matvec,
                                    config=K.MEDIUM)
    assert [rows for _, rows, _ in mat.parts] == [64, 64, 22]
    assert (np.abs(out - ref) <= bound).all()


def test_f16_weights_near_the_limit_of_f16(rt, fk):
    """Weights of +-65504 and their neighbours stay exact in f16; the f32 accumulation does not overflow."""
    w = RNG.choice(np.array([65504.0, -65504.0, 65472.0, -0.000061035156, 6.1035156e-05], np.float32), size=(33, 64))
    x = RNG.standard_normal((5, 64)).astype(np.float32)
    for matvec in (True, False):
        out, ref, bound, mat = _product(rt, fk, x, w, "f16", matvec=matvec)
        assert mat.dtype == "f16" and K.f16_exact([w])
        assert np.isfinite(out).all() and (np.abs(out - ref) <= bound).all()


def test_weights_beyond_f16_are_refused_in_f16_and_kept_in_f32(rt):
    w = np.full((4, 8), 70000.0, np.float32)
    with pytest.raises(InvalidInput, match="beyond f16's range"):
        K.upload_matrix(rt, [w], "blk.0.ffn_down", "f16")
    assert not K.f16_exact([w])
    assert K.upload_matrix(rt, [w], "blk.0.ffn_down", "f32").dtype == "f32"


def test_empty_products_and_rows_too_wide_are_refused(rt, fk):
    mat = K.upload_matrix(rt, [np.ones((8, 8), np.float32)], "w", "f32")
    buf = rt.empty(1024, "x")
    with pytest.raises(InvalidInput, match="0 rows"):
        fk.matmul(buf, 0, mat, buf)
    with pytest.raises(InvalidInput, match="empty matrix"):
        K.upload_matrix(rt, [np.zeros((0, 8), np.float32)], "w", "f32")
    with pytest.raises(DeviceLimitError, match="one row of 100 f32 values"):
        K.upload_matrix(rt, [np.ones((2, 100), np.float32)], "w", "f32", max_bytes=256)
    with pytest.raises(UnsupportedShape, match="GEMM tile"):
        K.GemmConfig(64, 64, 16, 6, 4).check()


# ------------------------------------------------------------------------------------------------ RMS norm
@pytest.mark.parametrize("rows,n,scale", [(1, 1, 1.0), (3, 7, 1.0), (2, 129, 1e-3), (4, 1000, 1e18), (1, 576, 30.0)])
def test_rms_norm(rt, fk, rows, n, scale):
    x = (RNG.standard_normal((rows, n)) * scale).astype(np.float32)
    w = (1 + 0.1 * RNG.standard_normal(n)).astype(np.float32)
    xb, wb, ob = rt.upload(x, "x"), rt.upload(w, "w"), rt.empty(x.nbytes, "o")
    rt.run(fk.rms_norm(xb, wb, ob, rows, n, 1e-5))
    out = rt.read(ob, np.float32, x.shape)
    assert (np.abs(out - O.rms_norm_ref(x, w, 1e-5)) <= O.rms_norm_tolerance(x, w, 1e-5)).all()


def test_rms_norm_per_head_in_place_and_added_to_a_residual(rt, fk):
    """Per-head norms of the key heads inside a qkv row (offsets, strides, in place), and dst += norm(src)."""
    t, nq, nkv, d = 3, 4, 2, 16
    ld = (nq + 2 * nkv) * d
    qkv = RNG.standard_normal((t, ld)).astype(np.float32)
    w = (1 + 0.1 * RNG.standard_normal(d)).astype(np.float32)
    qb, wb = rt.upload(qkv, "qkv"), rt.upload(w, "w")
    rt.run(fk.rms_norm(None, wb, qb, t * nkv, d, 1e-6, per=nkv, in_off=nq * d, in_ld=ld, out_off=nq * d, out_ld=ld,
                       inplace=True))
    out = rt.read(qb, np.float32, (t, ld))
    keys = qkv[:, nq * d:(nq + nkv) * d].reshape(t, nkv, d)
    ref = qkv.copy()
    ref[:, nq * d:(nq + nkv) * d] = O.rms_norm_ref(keys, w, 1e-6).reshape(t, -1)
    tol = np.zeros_like(ref) + np.finfo(np.float32).tiny
    tol[:, nq * d:(nq + nkv) * d] = O.rms_norm_tolerance(keys, w, 1e-6).reshape(t, -1)
    assert (np.abs(out - ref) <= tol).all()
    x = RNG.standard_normal((2, 24)).astype(np.float32)
    res = RNG.standard_normal((2, 24)).astype(np.float32)
    w2 = np.ones(24, np.float32)
    xb, w2b, rb = rt.upload(x, "x"), rt.upload(w2, "w"), rt.upload(res, "res")
    rt.run(fk.rms_norm(xb, w2b, rb, 2, 24, 1e-5, add=True))
    got = rt.read(rb, np.float32, (2, 24))
    assert np.allclose(got, res + O.rms_norm_ref(x, w2, 1e-5), rtol=0, atol=1e-5)


# ------------------------------------------------------------------------------------------------ RoPE
@pytest.mark.parametrize("mode,rot,t,start", [("neox", None, 5, 0), ("normal", None, 1, 9), ("neox", 8, 3, 2),
                                              ("normal", 12, 4, 0)])
def test_rope_rotates_queries_and_keys_and_stores_keys_and_values(rt, fk, mode, rot, t, start):
    nq, nkv, d, cap = 3, 1, 16, 16
    r = d if rot is None else rot
    qkv = (RNG.standard_normal((t, (nq + 2 * nkv) * d)) * 4).astype(np.float32)
    ang = RNG.uniform(-1e4, 1e4, (t, r // 2))  # large positions: the tables hold any angle
    cos, sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
    qb, tb = rt.upload(qkv, "qkv"), rt.upload(np.concatenate([cos.ravel(), sin.ravel()]), "tables")
    kc, vc = rt.empty(cap * nkv * d * 4, "kc"), rt.empty(cap * nkv * d * 4, "vc")
    rt.run(fk.rope(qb, tb, kc, vc, t, nq, nkv, d, rot=rot, start=start, cap=cap, mode=mode))
    heads = qkv.reshape(t, nq + 2 * nkv, d)
    ref = heads.copy()
    ref[:, :nq + nkv] = O.rope_ref(heads[:, :nq + nkv], cos, sin, mode, rot)
    tol = np.zeros_like(ref) + np.finfo(np.float32).tiny
    tol[:, :nq + nkv] = O.rope_tolerance(heads[:, :nq + nkv], rot) if mode == "neox" else 4 * O.U32 * np.abs(heads[:, :nq + nkv]).max()
    out = rt.read(qb, np.float32, ref.shape)
    assert (np.abs(out - ref) <= tol).all()
    kcache = rt.read(kc, np.float32, (cap, nkv, d))
    vcache = rt.read(vc, np.float32, (cap, nkv, d))
    assert np.array_equal(kcache[start:start + t], out[:, nq:nq + nkv])
    assert np.array_equal(vcache[start:start + t], heads[:, nq + nkv:])


def test_rope_refuses_a_cache_too_small_and_odd_dims(rt, fk):
    b = rt.empty(4096, "b")
    with pytest.raises(InvalidInput, match="do not fit a cache of 4"):
        fk.rope(b, b, b, b, 3, 1, 1, 16, start=2, cap=4)
    with pytest.raises(UnsupportedShape, match="RoPE of 7 dims"):
        fk.rope(b, b, b, b, 1, 1, 1, 16, rot=7, cap=4)


# ------------------------------------------------------------------------------------------------ attention
ATTN_CASES = [  # T, start, nq, nkv, D, window, softcap
    (1, 0, 2, 1, 16, 0, 0.0),       # one token at position 0: attends to itself only
    (1, 300, 6, 2, 32, 0, 0.0),     # a decode step over a longer cache
    (5, 0, 4, 2, 16, 0, 0.0),
    (37, 20, 3, 1, 48, 0, 0.0),     # GQA 3, three vec4s a lane, a chunk after 20 cached positions
    (20, 5, 12, 4, 16, 7, 0.0),     # a sliding window shorter than the chunk
    (9, 40, 8, 8, 16, 0, 20.0),     # MHA, soft-capped scores
    (3, 0, 80, 1, 16, 0, 0.0),      # a group of 80 heads: two head blocks a KV head
    (4, 20000, 2, 1, 16, 0, 0.0),   # tens of thousands of positions
]
HARDWARE_ATTN = [(64, 100, 32, 8, 128, 0, 0.0), (17, 3, 16, 8, 256, 4096, 50.0), (1, 5000, 32, 8, 128, 0, 0.0)]


def _attention_case(rt, fk, t, start, nq, nkv, d, window, softcap):
    s = start + t
    qkv = RNG.standard_normal((t, (nq + 2 * nkv) * d)).astype(np.float32)
    k = RNG.standard_normal((s, nkv, d)).astype(np.float32)
    v = RNG.standard_normal((s, nkv, d)).astype(np.float32)
    qb, kb, vb, ob = rt.upload(qkv, "qkv"), rt.upload(k, "k"), rt.upload(v, "v"), rt.empty(t * nq * d * 4, "o")
    scale = 1.0 / np.sqrt(d)
    rt.run(fk.attention(qb, kb, vb, ob, t, nq, nkv, d, start=start, scale=scale, softcap=softcap, window=window))
    out = rt.read(ob, np.float32, (t, nq, d))
    ref, bound = O.attention_ref(qkv[:, :nq * d].reshape(t, nq, d), k, v, start, scale, softcap, window)
    err = np.abs(out - ref)
    assert np.isfinite(out).all() and (err <= bound).all(), f"max err {err.max():.3g}"


@pytest.mark.parametrize("case", ATTN_CASES, ids=[f"T{c[0]}-s{c[1]}-{c[2]}/{c[3]}-d{c[4]}-w{c[5]}-c{c[6]:g}" for c in ATTN_CASES])
def test_attention_matches_the_float64_softmax(rt, fk, case):
    _attention_case(rt, fk, *case)


@pytest.mark.parametrize("case", HARDWARE_ATTN, ids=[f"T{c[0]}-s{c[1]}-{c[2]}/{c[3]}-d{c[4]}" for c in HARDWARE_ATTN])
def test_attention_at_real_head_sizes(rt, fk, case):
    if rt.summary.is_software:
        pytest.skip("head sizes 128 and 256 compile for minutes on a software rasteriser; the hardware run covers them")
    _attention_case(rt, fk, *case)


def test_attention_past_the_loop_limit_is_refused(rt, fk):
    """On an adapter that bounds loop iterations, a context beyond the attention's longest is refused with the
    limit named; elsewhere nothing bounds it (a cost check, no dispatch)."""
    limit = rt.loop_limit
    n = 70000
    b = rt.empty(16, "b")
    if limit is None or K.attention_loop_cost(16, 1, 1, n) <= limit:
        assert limit is None
        return
    with pytest.raises(DeviceLimitError, match="loop"):
        fk.attention(b, b, b, b, 1, 1, 1, 16, start=n - 1)


def test_attention_refuses_shapes_it_does_not_take(rt, fk):
    b = rt.empty(16, "b")
    with pytest.raises(UnsupportedShape, match="multiples of 16"):
        fk.attention(b, b, b, b, 1, 2, 1, 24)
    with pytest.raises(UnsupportedShape, match="not a multiple"):
        fk.attention(b, b, b, b, 1, 3, 2, 16)
    with pytest.raises(InvalidInput, match="no tokens"):
        fk.attention(b, b, b, b, 0, 2, 1, 16)


# ------------------------------------------------------------------------------------------------ element-wise
@pytest.mark.parametrize("act", ["silu", "gelu_tanh"])
def test_glu(rt, fk, act):
    t, f = 3, 77
    g = (RNG.standard_normal((t, f)) * 4).astype(np.float32)
    g[0, :8] = [100.0, -100.0, 1e-6, -1e-6, 30.0, -30.0, 9.03, 0.0]  # tanh saturated, tiny, zero
    u = RNG.standard_normal((t, f)).astype(np.float32)
    gb, ob = rt.upload(np.concatenate([g, u], 1), "gu"), rt.empty(g.nbytes, "o")
    rt.run(fk.glu(gb, ob, t, f, act))
    out = rt.read(ob, np.float32, g.shape)
    assert (np.abs(out - O.glu_ref(g, u, act)) <= O.glu_tolerance(g, u)).all()


def test_softcap(rt, fk):
    x = np.concatenate([RNG.standard_normal(500) * 40, [1e30, -1e30, 0.0, 1e-20, 30.0]]).astype(np.float32)
    xb = rt.upload(x, "x")
    rt.run(fk.softcap(xb, x.size, 30.0))
    out = rt.read(xb, np.float32, x.shape)
    assert (np.abs(out - O.softcap_ref(x, 30.0)) <= O.softcap_tolerance(x, 30.0)).all()
    assert out[-5] == 30.0 and out[-4] == -30.0
    with pytest.raises(InvalidInput, match="positive"):
        fk.softcap(xb, 4, 0.0)


@pytest.mark.parametrize("dtype,parts", [("f32", 4), ("f16", 1)])
def test_embedding_lookup_over_parts(rt, fk, dtype, parts):
    table = RNG.standard_normal((100, 24)).astype(np.float32)
    ids = np.array([0, 31, 32, 99, 63, 64, 5], np.uint32)  # the first and last rows of parts of 32
    mat = K.upload_matrix(rt, [table], "token_embd", dtype, 32 * 24 * 4 if parts > 1 else None)
    assert len(mat.parts) == parts
    ib, ob = rt.upload(ids, "ids"), rt.empty(ids.size * 24 * 4, "o")
    rt.run(fk.embed(ib, mat, ob, ids.size, scale=float(np.sqrt(24))))
    ref = O.embed_ref(_f16(table) if dtype == "f16" else table, ids, float(np.sqrt(24)))
    assert np.array_equal(rt.read(ob, np.float32, ref.shape), ref)
