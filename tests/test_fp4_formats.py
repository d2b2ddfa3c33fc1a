"""NVFP4 KV cache (kvviz/families/fp4/method.py): the oracle (kvviz/families/fp4/oracle.py) against gguf's NVFP4
dequantisation and ml_dtypes' E4M3 / E2M1, and the GPU writer, dequantiser and decode on lavapipe.

Exact: the cache words and the per-tensor scales equal the oracle's (every division correctly rounded,
the encoders on the float bits); the dequantised f32 cache equals the oracle's bit for bit (an exact
product e2m1*e4m3, then one float32 multiply by s_t). Attention through the f32 paged decode:
|out - ref| <= 2e-5 * max(1, max|V^|), weights within 2e-6 (tests/test_quant_methods.py's bounds).
(MXFP4 is a ggml block type: tests/test_ggml_formats.py.)
"""
from __future__ import annotations

import gguf
import ml_dtypes
import numpy as np
import pytest

from kvviz.errors import InvalidInput, UnsupportedShape
from kvviz.families.fp4 import format as f4
from kvviz.families.registry import get_method
from kvviz.families.fp4 import oracle as o4
from kvviz.paging import PAD_SLOT, make_batch

from harness import nvfp4_kv as make_kv
from harness import nvfp4_method_check as check


# ------------------------------------------------------------------------------------ CPU
def test_oracle_against_gguf_and_ml_dtypes():
    """e2m1 * e4m3 of the oracle's records = gguf.quants.dequantize of the same bytes regrouped into gguf's
    NVFP4 blocks; E2M1 / E4M3 encodings are ml_dtypes' round to nearest even."""
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((40, 128)) * 10.0 ** rng.uniform(-3, 3, (40, 1))).astype(np.float32)
    x[3, 7] = 1e4
    s_t = o4.tensor_scale(x)
    codes, sc = o4.quantize(x, s_t)
    recs = f4.pack_records(codes, sc)
    c2, s2 = f4.unpack_records(recs, 128)
    np.testing.assert_array_equal(c2, codes)
    np.testing.assert_array_equal(s2, sc)
    g = np.asarray(gguf.quants.dequantize(f4.to_gguf_blocks(recs, 128), gguf.GGMLQuantizationType.NVFP4), np.float32)
    prod = (f4.E2M1_VALUES[codes].reshape(40, 8, 16) * o4.e4m3_values(sc)[..., None]).reshape(40, 128)
    np.testing.assert_array_equal(g, prod)
    np.testing.assert_array_equal((g * s_t).astype(np.float32), o4.dequantize(codes, sc, s_t))
    # the largest group scale saturates at 448 = E4M3 max: the tensor's amax is 6 * 448 * s_t
    assert o4.e4m3_values(sc).max() == 448
    # within E4M3's normal range (row max >= tensor max / 1000) an element is off by at most half an E2M1 step
    # of its group, 1/6 * (1 + 1/16) of the group's max (the E4M3 rounding); below it groups flush to zero
    amax = np.abs(x).max(-1, keepdims=True)
    err = np.abs(o4.dequantize(codes, sc, s_t) - x) / amax
    big = amax[:, 0] >= np.abs(x).max() / 1000
    assert big.sum() > 10 and err[big].max() <= (1 / 6) * (1 + 1 / 16)


def test_e2m1_ties_on_the_gpu(ctx):
    """s_t = 1 (tensor amax 2688), a 16-element group of max 6 (scale 1): the group's other elements at
    every E2M1 midpoint round half to even, beyond 6 saturate, signed zeros keep their sign."""
    mids = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 0.1, 6.0], np.float32)
    g1 = np.concatenate([[6.0], mids, -mids[:6]]).astype(np.float32)
    g2 = np.array([2688.0, 2000, 5, -0.0, 0.0, 1e-3, -1e-3, 100, 300, 448 * 6, 1, 2, 3, 4, 5, 6], np.float32)
    row = np.concatenate([g1, g2, np.zeros(32, np.float32)]).reshape(1, 1, 64)
    k = np.repeat(row, 4, axis=0)
    batch = make_batch([4], 8)
    qkv = check(ctx, batch, k, k, 2)
    assert qkv.extra["tensor_scales"][0] == 1.0
    codes = qkv.k_codes[0, 0]
    want = np.clip(row[0, 0, :16], -6, 6).astype(ml_dtypes.float4_e2m1fn).astype(np.float32)
    np.testing.assert_array_equal(codes[:16], want)
    assert list(codes[1:8]) == [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0]  # ties to even
    assert qkv.extra["k_fields"]["code_bits"][0, 0, 19] == 8  # -0.0 keeps its sign bit (E2M1 -0; it decodes to 0)


# ------------------------------------------------------------------------------------ GPU (the grid over shapes:
# tests/test_conformance.py test_method_conformance)
def test_tensor_scale_ignores_padding_and_zero_tensor(ctx):
    """The per-tensor amax covers the real rows only; an all-zero tensor stores s_t = 2^-126, zero scales and codes."""
    batch = make_batch([9, 6], 8, policy="scattered", pad_every=3)
    k, v = make_kv(np.random.default_rng(2), batch.num_tokens, 1, 64)
    pad = batch.slot_mapping == PAD_SLOT
    assert pad.any()
    k[pad] = 1e30
    v[:] = 0.0
    qkv = check(ctx, batch, k, v, 2)
    ks, vs = qkv.extra["tensor_scales"]
    assert ks == float(np.float32(np.abs(k[~pad]).max()) / np.float32(2688)) and vs == 2.0**-126
    assert (qkv.v_scales[~pad] == 0).all() and (qkv.v_codes[~pad] == 0).all()


def test_refusals_layout_and_inspector(ctx):
    m = get_method("nvfp4")
    for D in (40, 72, 512):
        with pytest.raises(UnsupportedShape):
            m.check(4, 2, D, 16)
    batch = make_batch([3], 8)
    one = np.ones((3, 1, 64), np.float32)
    with pytest.raises(InvalidInput):
        m.quantize(ctx, batch, np.where(np.arange(64) == 3, np.inf, one).astype(np.float32), one)
    assert m.layouts(128, 16)[0].bits_per_element == 4.5
    assert m.layouts(80, 16)[0].bytes_per_token_per_head == 4 * (2 + 10)
    batch = make_batch([20, 11], 16, policy="scattered", pad_every=4)
    k, v = make_kv(np.random.default_rng(3), batch.num_tokens, 2, 64)
    qkv = m.quantize(ctx, batch, k, v)
    for s in range(batch.num_seqs):
        rows = batch.token_rows(s)
        for r in m.inspect_block(ctx, qkv, batch, int(batch.seq_blocks[s][0]), 1, "K"):
            if r.position >= 0:
                t = rows[r.position]
                np.testing.assert_array_equal(r.words, qkv.extra["k_records"][t, 1])
                np.testing.assert_array_equal(r.fields["scale"], qkv.k_scales[t, 1])
                assert r.fields["tensor_scale"] == qkv.extra["tensor_scales"][0]
    ks, vs, note = m.token_scales(qkv, 0, len(batch.token_rows(0)))
    assert note and (ks >= 0).all()


def test_chunked_amax_then_writer(ctx):
    """Grid limit 8: the first-wave amax pass runs over every chunk before the first-wave writer starts, K and V
    uploaded once a chunk (the fast writer's 2-D grid needs no chunks: tests/test_fast_write_ggml.py)."""
    rt = ctx.rt
    saved = dict(rt.limits)
    rt.limits["max-compute-workgroups-per-dimension"] = 8
    uploads = []
    real_upload = rt.upload
    rt.upload = lambda a, label="", *x, **kw: (uploads.append(label), real_upload(a, label, *x, **kw))[1]
    try:
        batch = make_batch([50, 9], 16, policy="contiguous", pad_every=7)
        k, v = make_kv(np.random.default_rng(4), batch.num_tokens, 1, 64)
        k[-3, 0, 0] = 500.0  # the tensor's amax sits in the last chunk
        qkv = check(ctx, batch, k, v, 2, writer_impl="first-wave")
        n_chunks = -(-batch.num_tokens // 8)
        assert uploads.count("key") == n_chunks and uploads.count("value") == n_chunks
        assert len(qkv.device["writer"]) == 2 * n_chunks
    finally:
        del rt.upload
        rt.limits.clear()
        rt.limits.update(saved)
