"""vLLM-style FP8 caches (vllm_fp8_e4m3 / vllm_fp8_e5m2: kvviz/families/fp8_vllm/method.py, shaders
quant/fp8_vllm_*.wgsl) on the GPU (lavapipe) against the numpy oracle (kvviz/families/fp8/oracle.py vllm_*).

Exact (0 tolerance), and why: the calibration's amax is a max of float bits, the scale one correctly
rounded division (common.wgsl div_rn_bits == numpy float32 `amax / fp8_max`), the codes the saturating
RNE encoder checked bit for bit against ml_dtypes, the dequantised cache one float32 multiply, and a
saturated element is one whose x / scale has no finite ml_dtypes FP8 value -- so cache words, scales,
saturation counts (per KV head, K and V) and the dequantised f32 cache must EQUAL the oracle's.
Attention runs through the f32 paged decode: |out - ref| <= 2e-5 * max(1, max|V^|) (its conformance
tolerance, kvviz/attention/paged_oracle.py).
"""
from __future__ import annotations

import os

os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")

import numpy as np
import pytest

from kvviz.errors import InvalidInput, UnsupportedShape
from kvviz.attention import records as qk
from kvviz.methods.live_cache import BlockTable, make_live_cache
from kvviz.families.registry import get_method, reference
from kvviz.families.fp8 import oracle as of8
from kvviz.attention import paged_oracle as op
from kvviz.paging import PAD_SLOT, make_batch

pytestmark = pytest.mark.gpu

IDS = ("vllm_fp8_e4m3", "vllm_fp8_e5m2")


def make_kv(rng, T, kvh, D):
    """Gaussian K/V whose later positions grow (so a calibration on the first ones saturates), with a
    zero vector, a -0.0/+0.0 vector and values on exact FP8 rounding ties of a power-of-two scale."""
    grow = 1.0 + np.arange(T, dtype=np.float64)[:, None, None] / 4.0
    k = (rng.standard_normal((T, kvh, D)) * grow).astype(np.float32)
    v = (rng.standard_normal((T, kvh, D)) * grow * 0.1).astype(np.float32)
    if T > 3:
        k[1] = 0.0
        v[1, :, ::2], v[1, :, 1::2] = -0.0, 0.0
        k[2, :, :] = np.float32(1.0625)  # a tie of E4M3 (1 + 1/16 between 1 and 1.125) and of E5M2
    return k, v


def oracle(m, batch, k, v):
    ks, vs = of8.vllm_method_scales(m, batch, k, v)
    real = batch.slot_mapping != PAD_SLOT
    nb, bs = batch.num_blocks, batch.block_size
    sm = batch.slot_mapping.astype(np.int64)
    T, kvh, D = k.shape
    out = {"scales": (ks, vs)}
    for which, x, s in (("K", k, ks), ("V", v, vs)):
        codes, sat = of8.vllm_quantize(x, s, m.fmt)
        recs = of8.pack_records(codes, None)
        full = np.zeros((nb, kvh, bs, D // 4), np.uint32)
        full[sm[real] // bs, :, sm[real] % bs] = recs[real]
        out[which] = full.reshape(nb, kvh, bs * D // 4)
        f = np.zeros((nb, kvh, bs, D), np.float32)
        f[sm[real] // bs, :, sm[real] % bs] = of8.vllm_dequantize(codes, s, m.fmt)[real]
        out["f" + which] = f
        out["sat" + which] = sat[real].sum(axis=(0, 2))  # per KV head
    return out


# (head_size, block_size, context lens, policy, kv_heads, heads)
SHAPES = [
    (64, 8, [1, 37, 20], "contiguous", 2, 4),
    (128, 16, [70, 0, 33], "scattered", 2, 4),
    (256, 32, [45], "fragmented", 1, 2),
    (80, 4, [9, 1], "scattered", 2, 2),
]
OPTIONS = [{}, {"scale_granularity": "per_head"}, {"calib_tokens": 6}, {"calib_tokens": 6, "scale_granularity": "per_head"},
           {"scales": "given", "k_scale": 0.004, "v_scale": 2.0**-126}]


@pytest.mark.parametrize("mid", IDS)
@pytest.mark.parametrize("opts", OPTIONS, ids=lambda o: "-".join(f"{a}={b}" for a, b in o.items()) or "default")
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"D{s[0]}-bs{s[1]}-{s[3]}")
def test_cache_scales_saturation_and_attention_exact(ctx, mid, opts, shape):
    D, bs, lens, policy, kvh, H = shape
    m = get_method(mid, **opts)
    batch = make_batch(lens, bs, policy=policy, seed=3, pad_every=5)
    rng = np.random.default_rng(D + bs)
    k, v = make_kv(rng, batch.num_tokens, kvh, D)
    qkv = m.quantize(ctx, batch, k, v)
    ref = oracle(m, batch, k, v)
    for which in ("K", "V"):
        np.testing.assert_array_equal(qk.read_cache(ctx.rt, qkv.device["cache"], which), ref[which], err_msg=which)
        np.testing.assert_array_equal(m.read_f32(ctx, qkv, which).view(np.uint32), ref["f" + which].view(np.uint32))
    for got, want in zip(qkv.extra["head_scales"], ref["scales"]):
        np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    np.testing.assert_array_equal(qkv.extra["saturated"], np.stack([ref["satK"], ref["satV"]]))
    if not m.per_head:  # the fast decode's tensor words 2, 3 hold the K and V scales
        t = ctx.rt.read(qkv.device["cache"].extra["tensor"], np.uint32, nbytes=16).view(np.float32)
        np.testing.assert_array_equal(t[2:], [ref["scales"][0][0], ref["scales"][1][0]])
        assert m.fast_cache_format(D) is not None
    n_sat = int(ref["satK"].sum() + ref["satV"].sum())
    assert bool(qkv.warnings) == (n_sat > 0)
    if n_sat:
        assert f"{int(ref['satK'].sum())} of" in qkv.warnings[0] and "saturated" in qkv.warnings[0]
    if opts.get("scales") == "given":
        assert n_sat > 0  # v_scale 2^-126: every nonzero V value is far beyond the range
    elif not opts.get("calib_tokens"):
        assert n_sat == 0  # calibrated on everything it holds: nothing is beyond the range
    q = rng.standard_normal((batch.num_seqs, H, D)).astype(np.float32)
    # the largest |logit| is 8: keeps the f32 kernels' logit rounding inside the weight tolerance
    logits = np.einsum("shd,bkpd->shbkp", q.astype(np.float64), ref["fK"].astype(np.float64))
    scale = float(np.float32(8.0 / max(1e-30, np.abs(logits).max())))
    out = m.attend(ctx, qkv, batch, q, scale)
    want, tol = reference(mid)(m, batch, k, v, q, scale)
    assert np.abs(out - want).max() <= tol
    w = m.weights(ctx, qkv, batch, q, scale)
    ref_w = op.decode_weights(q, ref["fK"].astype(np.float64), batch.block_tables, batch.context_lens, bs, scale)
    assert np.abs(w - ref_w).max() <= 2e-6


@pytest.mark.parametrize("mid", IDS)
def test_saturation_threshold_is_the_rounding_tie(ctx, mid):
    """scale 1 (given): values just below / at / above the last tie saturate exactly as ml_dtypes says.
    E4M3FN: 464 rounds to even 448 (not saturated), the next float above saturates; E5M2: 61440 rounds to
    65536, beyond max (saturated), the float below it does not. Zeros and signs keep their codes."""
    m = get_method(mid, scales="given", k_scale=1.0, v_scale=1.0)
    f = m.fmt
    tie = np.float32(464.0 if f.max == 448.0 else 61440.0)
    vals = np.array([np.nextafter(tie, 0), tie, np.nextafter(tie, np.inf), f.max, -tie, -np.nextafter(tie, np.inf),
                     0.0, -0.0, 1e30, -1e30, 2.0**-149, 3e38], np.float32)
    D = 12
    x = np.zeros((1, 1, D), np.float32)
    x[0, 0, : len(vals)] = vals
    batch = make_batch([1], 1)
    qkv = m.quantize(ctx, batch, x, -x)
    want = int((~np.isfinite(vals.astype(f.dtype).astype(np.float32))).sum())
    assert want == (5 if f.max == 448.0 else 7)
    np.testing.assert_array_equal(qkv.extra["saturated"], [[want], [want]])
    codes = qk.read_cache(ctx.rt, qkv.device["cache"], "K").reshape(-1)[: D // 4].view(np.uint8)
    np.testing.assert_array_equal(codes, of8.encode(x.reshape(-1), f))


def test_calibration_window_and_empty_batches(ctx):
    """calib_tokens counts positions per sequence; a batch without calibration rows (or without rows)
    gets the 2^-126 floor, which saturates every nonzero value: counted, said, and the same as the oracle."""
    m = get_method("vllm_fp8_e4m3", calib_tokens=2, scale_granularity="per_head")
    batch = make_batch([3, 5], 4, policy="scattered", seed=1)
    rng = np.random.default_rng(5)
    k, v = make_kv(rng, batch.num_tokens, 2, 32)
    qkv = m.quantize(ctx, batch, k, v)
    ref = oracle(m, batch, k, v)
    rows = batch.token_pos < 2
    want = of8.scale_of(np.abs(k[rows]).max(axis=(0, 2)), m.fmt)
    np.testing.assert_array_equal(qkv.extra["head_scales"][0], want)
    np.testing.assert_array_equal(qkv.extra["saturated"], np.stack([ref["satK"], ref["satV"]]))
    # no row at all: still a valid (empty) cache; attention over nothing
    empty = make_batch([0], 4)
    z = np.zeros((0, 1, 32), np.float32)
    qe = m.quantize(ctx, empty, z, z)
    assert qe.warnings == [] and not qe.extra["saturated"].any()
    np.testing.assert_array_equal(qe.extra["head_scales"][0], [of8.SCALE_FLOOR])


def test_options_are_checked():
    with pytest.raises(InvalidInput, match="k_scale"):
        get_method("vllm_fp8_e4m3", k_scale=0.0)
    with pytest.raises(InvalidInput, match="scale_granularity"):
        get_method("vllm_fp8_e5m2", scale_granularity="per_token")
    with pytest.raises(InvalidInput, match="calib_tokens"):
        get_method("vllm_fp8_e5m2", calib_tokens=-1)
    with pytest.raises(UnsupportedShape, match="multiple of 4"):
        get_method("vllm_fp8_e4m3").check(4, 2, 66, 16)
    k, v = get_method("vllm_fp8_e4m3", scale_granularity="per_head").layouts(128, 16)
    assert k.bytes_per_token_per_head == 128 and k.bits_per_element == 8.0
    assert "per_head" not in k.description and "head scale" in k.description


def test_live_cache_freezes_the_prompt_scales_and_counts_what_saturates(ctx):
    """Live decode: the first write (the prompt's prefill) calibrates; a later token 4x beyond the prompt's
    range is written with the frozen scales and saturates. Counts, scales, and the attention through the
    f32 decode all against the oracle; the cache view's note says how many saturated."""
    n_layers, H, kvh, D, bs = 2, 4, 2, 32, 4
    m = get_method("vllm_fp8_e4m3", scale_granularity="per_head")
    table = BlockTable(8, bs, "scattered", seed=3)
    cache = make_live_cache(m, ctx, table, n_layers, H, kvh, D, D ** -0.5)
    rng = np.random.default_rng(11)
    P = 9
    kp = rng.standard_normal((n_layers, kvh, P, D)).astype(np.float32)
    vp = rng.standard_normal((n_layers, kvh, P, D)).astype(np.float32)
    for li in range(n_layers):
        cache.extend(li, kp[li], vp[li], 0)
    k_new = (rng.standard_normal((kvh, D)) * 4 * np.abs(kp).max()).astype(np.float32)
    v_new = (vp[0, :, 0] * 0.5).astype(np.float32)  # inside the range: no V saturation
    q = rng.standard_normal((H, D)).astype(np.float32)
    out = cache.append_attend(0, q, k_new, v_new, P)
    ks = of8.vllm_scales(kp[0].transpose(1, 0, 2), np.ones(P, bool), m.fmt, True)
    vs = of8.vllm_scales(vp[0].transpose(1, 0, 2), np.ones(P, bool), m.fmt, True)
    got_ks, got_vs = cache.head_scales(0)
    np.testing.assert_array_equal(got_ks, ks)
    np.testing.assert_array_equal(got_vs, vs)
    K = np.concatenate([kp[0].transpose(1, 0, 2), k_new[None]], 0)
    V = np.concatenate([vp[0].transpose(1, 0, 2), v_new[None]], 0)
    ck, sat_k = of8.vllm_quantize(K, ks, m.fmt)
    cv, sat_v = of8.vllm_quantize(V, vs, m.fmt)
    assert sat_k[P].sum() > 0 and not sat_k[:P].any() and not sat_v.any()
    np.testing.assert_array_equal(cache.side(0)["saturated"], [sat_k.sum(axis=(0, 2)), sat_v.sum(axis=(0, 2))])
    assert not cache.side(1)["saturated"].any()
    fk = of8.vllm_dequantize(ck, ks, m.fmt).astype(np.float64)
    fv = of8.vllm_dequantize(cv, vs, m.fmt).astype(np.float64)
    g = H // kvh
    ref = np.stack([np.exp(s - s.max()) / np.exp(s - s.max()).sum() @ fv[:, h // g]
                    for h in range(H) for s in [fk[:, h // g] @ q[h].astype(np.float64) * D ** -0.5]])
    assert np.abs(out - ref).max() <= 2e-5 * max(1.0, np.abs(fv).max())
    cache.length = P + 1
    sc = cache.token_scales(0, 1)
    assert sc.k.shape == (P + 1,) and (sc.k == ks[1]).all()
    assert f"K {int(sat_k[:, 1].sum())}, V 0" in sc.note and "frozen" in sc.note
    d = cache.describe()
    assert d["saturated_k"] == int(sat_k.sum()) and d["saturated_v"] == 0 and d["warnings"]
    assert cache.qkv[0].warnings and np.ndim(cache.qkv[0].v_scales) == 2


def test_single_token_prompt_calibrates_on_that_token(ctx):
    m = get_method("vllm_fp8_e5m2")
    table = BlockTable(2, 4)
    cache = make_live_cache(m, ctx, table, 1, 2, 1, 16, 0.25)
    x = np.arange(16, dtype=np.float32)[None] - 8
    cache.append_attend(0, np.ones((2, 16), np.float32), x, x, 0)
    ks, _ = cache.head_scales(0)
    assert ks[0] == of8.scale_of(np.float32(8.0), m.fmt) and not cache.side(0)["saturated"].any()


def test_live_calibration_window(ctx):
    """calib_tokens in live decode: the prefill's first positions only; the rest of the prompt may saturate."""
    m = get_method("vllm_fp8_e4m3", calib_tokens=3)
    cache = make_live_cache(m, ctx, BlockTable(4, 4), 1, 2, 1, 8, 0.25)
    x = np.zeros((1, 6, 8), np.float32)
    x[0, :, 0] = [1, 2, 3, 4, 5, 6]
    cache.extend(0, x, x, 0)
    ks, _ = cache.head_scales(0)
    assert ks[0] == of8.scale_of(np.float32(3.0), m.fmt) and cache.calibrated_on[0] == (0, 3)
    _, sat = of8.vllm_quantize(x[0][:, None, :], ks, m.fmt)
    assert int(sat.sum()) == 3  # 4, 5, 6 are beyond 3 * (464/448)
    np.testing.assert_array_equal(cache.side(0)["saturated"][0], [3])
