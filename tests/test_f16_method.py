"""Conformance of the f16 method (kvviz/families/f16/method.py) on the GPU (lavapipe in CI) against its numpy
oracle (kvviz/families/f16/oracle.py: numpy astype(float16)).

Exact: the cache words (the writer rounds to nearest even on the float bits, subnormal halves included)
and the dequantised f32 cache (halves widened exactly). Attention: the fast f16 decode (or the f32 decode
over the dequantised cache) accumulates in f32 against the float64 reference over the same halves:
|out - ref| <= 2e-5 * max(1, max|V^|) (kvviz/attention/paged_oracle.py); weights within 2e-6.
"""
from __future__ import annotations

import os

os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")

import numpy as np
import pytest

from kvviz.errors import InvalidInput, UnsupportedShape
from kvviz.attention import records as qk
from kvviz.families.registry import get_method, reference
from kvviz.families.f16 import oracle as of16
from kvviz.attention import paged_oracle as op
from kvviz.paging import PAD_SLOT, make_batch

# (head_size, block_size, context lens, policy, pad_every, kv_heads, heads)
SHAPES = [
    (64, 8, [1, 37, 0, 20], "contiguous", 0, 2, 4),
    (128, 16, [70, 5, 0, 33], "scattered", 5, 2, 8),
    (256, 32, [100, 1], "scattered", 3, 1, 2),
    (80, 16, [45, 0, 1], "fragmented", 4, 1, 1),
    (96, 8, [33, 17], "scattered", 0, 2, 8),
    (128, 32, [40], "contiguous", 0, 4, 4),
]
SIDS = [f"D{d}-bs{b}-{p}-pad{pe}-gqa{h // k}" for d, b, _, p, pe, k, h in SHAPES]


def make_kv(rng, T, kvh, D):
    """Gaussian K/V over 10 decades (f16 subnormals and values near 65504 included), a zero row, signed
    zeros, exact ties of the f16 grid and the largest values that still round to 65504."""
    k = (rng.standard_normal((T, kvh, D)) * 10.0 ** rng.uniform(-7, 3, (T, kvh, 1))).astype(np.float32)
    v = (rng.standard_normal((T, kvh, D)) * 10.0 ** rng.uniform(-2, 2, (T, kvh, 1))).astype(np.float32)
    special = np.resize(np.array([65504.0, 65519.99, -65519.0, 1.0 + 2.0 ** -11, -(1.0 + 3 * 2.0 ** -11), 2.0 ** -25,
                                  3 * 2.0 ** -26, 1.5 * 2.0 ** -24, 2.0 ** -15 + 2.0 ** -25, 0.0, -0.0, 1e-9],
                                 np.float32), D)
    if T > 2:
        k[0] = 0.0
        k[1] = special
        v[2] = special[::-1]
    return k, v


def oracle_words(batch, x):
    D = x.shape[2]
    shape = (batch.num_blocks, x.shape[1], batch.block_size, D // 2)
    return of16.write_cache(np.zeros(shape, np.uint32), x, batch.slot_mapping, batch.block_size)


@pytest.mark.parametrize("shape", SHAPES, ids=SIDS)
def test_conformance(ctx, shape):
    D, bs, lens, policy, pad_every, kvh, H = shape
    batch = make_batch(lens, bs, policy=policy, pad_every=pad_every, seed=D)
    rng = np.random.default_rng(D + bs)
    k, v = make_kv(rng, batch.num_tokens, kvh, D)
    m = get_method("f16")
    qkv = m.quantize(ctx, batch, k, v)
    qc = qkv.device["cache"]
    assert qc.extra["writer_impl"] == "fast"
    real = batch.slot_mapping != PAD_SLOT
    for which, x in (("K", k), ("V", v)):
        got = qk.read_cache(ctx.rt, qc, which).reshape(batch.num_blocks, kvh, bs, D // 2)
        np.testing.assert_array_equal(got, oracle_words(batch, x))
        # the dequantised f32 cache is the halves widened exactly
        f = m.read_f32(ctx, qkv, which)
        want = np.zeros_like(f)
        sm = batch.slot_mapping.astype(np.int64)
        want[sm[real] // bs, :, sm[real] % bs] = of16.dequantize(of16.quantize(x))[real]
        np.testing.assert_array_equal(f.view(np.uint32), want.view(np.uint32))
    np.testing.assert_array_equal(qkv.k_codes[real], of16.dequantize(of16.quantize(k))[real])
    assert np.isnan(qkv.k_scales).all() and qkv.k_scales.shape == (batch.num_tokens, kvh)  # no scales
    q = rng.standard_normal((batch.num_seqs, H, D)).astype(np.float32)
    scale = 1 / np.sqrt(D)
    out = m.attend(ctx, qkv, batch, q, scale)
    ref, tol = reference("f16")(m, batch, k, v, q, scale)
    assert np.abs(out - ref).max(initial=0) <= tol
    fk = np.zeros((batch.num_blocks, kvh, bs, D), np.float64)
    sm = batch.slot_mapping.astype(np.int64)
    fk[sm[real] // bs, :, sm[real] % bs] = of16.dequantize(of16.quantize(k))[real]
    w = m.weights(ctx, qkv, batch, q, scale)
    wref = op.decode_weights(q, fk, batch.block_tables, batch.context_lens, bs, scale, w.shape[2])
    # 2e-6 (the f32 kernels' weights tolerance) plus what f32 logits of this size may carry: each weight
    # moves by at most 2 x the largest logit error, D roundings of 2^-24 of scale * sum |q k|
    big = 0.0
    for s_, n in enumerate(batch.context_lens):
        if n:
            ks = np.abs(op.gather_sequence(fk, batch.block_tables[s_], int(n), bs))  # [kvh, n, D]
            for h in range(H):
                big = max(big, float((ks[h // (H // kvh)] @ np.abs(q[s_, h].astype(np.float64))).max()) * scale)
    assert np.abs(w - wref).max(initial=0) <= 2e-6 + 2 * D * 2.0 ** -24 * big


def test_attend_takes_the_fast_f16_decode(ctx):
    m = get_method("f16")
    assert m.fast_cache_format(128).name == "f16"
    batch = make_batch([64, 9], 16, policy="scattered")
    rng = np.random.default_rng(2)
    k, v = make_kv(rng, batch.num_tokens, 2, 128)
    q = rng.standard_normal((2, 8, 128)).astype(np.float32)
    qkv = m.quantize(ctx, batch, k, v)
    timed = m.timed_kernels(ctx, batch, k, v, q, 0.1, qkv)
    assert [t.impl for t in timed if t.role == "writer"] == ["fast"]
    assert any(t.role == "decode" and t.impl == "fast" and "f16" in t.name for t in timed)


def test_overflow_is_refused_before_dispatch(ctx):
    """|x| >= 65520 would be stored as infinity: refused with the value, its index and the f16 range."""
    m = get_method("f16")
    batch = make_batch([5], 16)
    k = np.zeros((5, 1, 64), np.float32)
    ok = k.copy()
    ok[1, 0, 3] = 65519.99
    qkv = m.quantize(ctx, batch, ok, ok)
    assert float(qkv.k_codes[1, 0, 3]) == 65504.0
    bad = k.copy()
    bad[2, 0, 7] = -65520.0
    with pytest.raises(InvalidInput) as e:
        m.quantize(ctx, batch, k, bad)
    msg = str(e.value)
    assert "value" in msg and "65520" in msg and "65504" in msg and "(2, 0, 7)" in msg and "infinity" in msg
    with pytest.raises(InvalidInput, match="NaN"):
        m.quantize(ctx, batch, np.full((5, 1, 64), np.nan, np.float32), k)
    with pytest.raises(InvalidInput):
        of16.quantize(np.array([1e6], np.float32))


def test_shapes_it_cannot_take(ctx):
    m = get_method("f16")
    with pytest.raises(UnsupportedShape, match="multiple of 4"):
        m.check(4, 2, 62, 16)
    with pytest.raises(UnsupportedShape):
        m.check(4, 3, 64, 16)
    with pytest.raises(UnsupportedShape):
        m.check(4, 1, 512, 16)


def test_layout_and_inspector(ctx):
    m = get_method("f16")
    k_lay, v_lay = m.layouts(128, 16)
    assert k_lay.bits_per_element == 16.0 and k_lay.bytes_per_token_per_head == 256
    assert [f.name for f in k_lay.fields] == ["values"] and "2w" in k_lay.word_map
    batch = make_batch([20, 3], 8, policy="scattered", pad_every=4)
    rng = np.random.default_rng(7)
    k, v = make_kv(rng, batch.num_tokens, 2, 64)
    qkv = m.quantize(ctx, batch, k, v)
    blk = int(batch.seq_blocks[0][1])
    recs = m.inspect_block(ctx, qkv, batch, blk, 1, "V")
    assert len(recs) == 8 and [r.position for r in recs] == list(range(8, 16))
    for r in recs:
        row = np.flatnonzero((batch.token_seq == 0) & (batch.token_pos == r.position))[0]
        np.testing.assert_array_equal(r.words, of16.pack_records(of16.quantize(v[row, 1])))
        np.testing.assert_array_equal(r.fields["values"] if "values" in r.fields else r.fields["codes"],
                                      of16.dequantize(of16.quantize(v[row, 1])))
        assert "scale" not in r.fields
    vals = m.code_values()
    assert vals[0] == -65504 and vals[-1] == 65504 and len(vals) == 63487  # -0 and +0 are one value
