"""TurboQuant at the paper's settings (kvviz/families/turboquant/format.py "general settings"; kernels
shaders/turboquant/tq_general_{compress,dequant}.wgsl; oracle kvviz/families/turboquant/oracle.py `compress_general`,
`dequantize_general`): polar bits 1-4 for keys (+ the 1-bit QJL residual) and values, the outlier-channel
split (2.5- and 3.5-bit configurations), head sizes up to 256 through a padded rotation.

What is exact and why: the compressor follows the oracle's float32 order (256-lane trees, butterflies,
one correctly rounded division and sqrt each), so on lavapipe every record word (codes, JL bits, f16 norms)
and every dequantised f32 value EQUALS the oracle's. A device with a 2.5-ulp division/sqrt or FMA
contraction may pick the neighbouring index where a rotated coordinate lies within a few ulps of a
boundary (as the seed compressor on the H200, docs/kernels.md): on such a device a word may differ only in
such a vector, and a dequantised value by 2^-18 of its vector's norm elsewhere. Attention runs through the
f32 paged decode over the dequantised cache: |out - ref| <= 2e-5 * max(1, max|V^|) (the f32 kernels').
"""
from __future__ import annotations

import math
import os

os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")

import numpy as np
import pytest

from kvviz.families.turboquant import bias as tq_bias
from kvviz.errors import InvalidInput
from kvviz.families.turboquant import format as tqf
from kvviz.families.registry import get_method, reference
from kvviz.families.turboquant import oracle as tqo
from kvviz.paging import PAD_SLOT, make_batch


SETTINGS = [dict(bits=b, v_bits=b) for b in (1, 3, 4)] + [
    dict(bits=2, v_bits=2, outlier_share=0.5), dict(bits=3, v_bits=3, outlier_share=0.5),
    dict(bits=2, v_bits=2, outlier_share=0.25, qjl_scale="unbiased"), dict(bits=1, v_bits=4), dict(bits=4, v_bits=1)]
SIDS = ["-".join(f"{k}={v}" for k, v in s.items()) for s in SETTINGS]


# ------------------------------------------------------------------------------------ format, no GPU
def test_codebooks():
    """Lloyd-Max of one rotated coordinate in R^P: symmetric, sorted, boundaries the midpoints; 1 bit is
    +-E|x| = +-Gamma(P/2)/(Gamma((P+1)/2) sqrt(pi)); 2 bits agree with the seed's quadrature to 1e-8 of the
    coordinate scale; the distortion per coordinate falls as the paper's 0.36 / 0.117 / 0.03 / 0.009 (x 1/P)."""
    for P in (32, 64, 128, 256):
        for b in range(1, 6):
            c, bd = tqf.lloyd_max(P, b)
            assert len(c) == 2**b and np.all(np.diff(c) > 0) and np.allclose(c, -c[::-1], atol=0)
            np.testing.assert_allclose(bd, (c[1:] + c[:-1]) / 2, rtol=0, atol=1e-15)
        e_abs = math.exp(math.lgamma(P / 2) - math.lgamma((P + 1) / 2)) / math.sqrt(math.pi)
        np.testing.assert_allclose(tqf.lloyd_max(P, 1)[0], [-e_abs, e_abs], rtol=1e-6)
        np.testing.assert_array_equal(tqf.lloyd_max(P, 2)[0], tqf.lloyd_max_2bit(P)[0])  # the seed codebook itself
        c3 = tqf.lloyd_max(P, 3)[0]  # a Lloyd-Max fixed point: each centroid the mean of its cell (5e-7 relative)
        assert abs(c3[0] + c3[-1]) == 0 and 0.5 < c3[-1] * math.sqrt(P) < 2.5


@pytest.mark.parametrize("bits", [1, 2, 3, 4, 5])
def test_bit_stream_packing_crosses_words(bits):
    rng = np.random.default_rng(bits)
    for P in (32, 64, 128, 256):
        codes = rng.integers(0, 2**bits, (3, P)).astype(np.uint8)
        codes[0] = 2**bits - 1  # all ones: every straddling code's high bits land in the next word
        w = tqf.pack_bits(codes, bits)
        assert w.shape == (3, -(-P * bits // 32))
        np.testing.assert_array_equal(tqf.unpack_bits(w, P, bits), codes)
        if bits == 3:  # code 10 sits in bits 30..32: two in word 0, one in word 1
            assert (w[0, 0] >> 30) == 3 and (w[0, 1] & 1) == 1


def test_settings_accounting():
    st = tqf.TQSettings(128, 2, 2, 0.5)
    k, v = st.instances("K"), st.instances("V")
    assert [(i.n_ch, i.P, i.bits) for i in k] == [(64, 64, 3), (64, 64, 2)]
    assert st.polar_bits("K") == st.polar_bits("V") == 2.5  # the paper's 2.5-bit setting
    assert st.wpt("K") == (6 + 2 + 1) + (4 + 2 + 1) and st.wpt("V") == (6 + 1) + (4 + 1)
    assert tqf.TQSettings(128, 3, 3, 0.5).polar_bits("K") == 3.5
    assert tqf.TQSettings(128, 2, 2, 0.25).instances("K")[0].n_ch == 32  # the paper's example: 32 of 128 at 3 bits
    assert tqf.TQSettings(128).is_seed and not tqf.TQSettings(96).is_seed and not tqf.TQSettings(128, 3).is_seed
    assert tqf.TQSettings(128, 4, 4, 0.75).n_outliers == 96
    assert tqf.TQSettings(5, 2, 2, 0.01).n_outliers == 1  # at least one channel, at most d - 1
    m = get_method("turboquant", bits=3, v_bits=3, outlier_share=0.5)
    k_l, v_l = m.layouts(128, 16)
    assert k_l.bytes_per_token_per_head == 4 * m.settings(128).wpt("K")
    assert sum(f.total_bits for f in k_l.fields) == 8 * k_l.bytes_per_token_per_head
    assert sum(f.total_bits for f in v_l.fields) == 8 * v_l.bytes_per_token_per_head
    assert "Outlier split" in k_l.description and "3.5" in m.label
    with pytest.raises(InvalidInput, match="bits"):
        get_method("turboquant", bits=5)
    with pytest.raises(InvalidInput, match="outlier_share"):
        get_method("turboquant", outlier_share=0.9)
    assert get_method("turboquant").label.endswith("(seed WGSL)")  # the default stays the seed configuration


def test_channel_choice_ties_and_zeros():
    x = np.zeros((4, 2, 8), np.float32)
    x[:, 0, 5] = 3.0
    x[:, 0, 2] = 3.0  # a tie with channel 5: both taken when 2 are asked, the lower first when 1 is
    x[:, 1, 7] = -1.0
    t = tqf.choose_channels(x, 1)
    assert list(t[0]) == [2, 0, 1, 3, 4, 5, 6, 7] and list(t[1]) == [7, 0, 1, 2, 3, 4, 5, 6]
    assert list(tqf.choose_channels(x, 2)[0][:2]) == [2, 5]
    assert list(tqf.choose_channels(np.zeros((0, 1, 4), np.float32), 2)[0]) == [0, 1, 2, 3]  # no tokens: the first


# ------------------------------------------------------------------------------------ GPU against the oracle
def _check_caches(ctx, m, batch, k, v):
    """The records and the dequantised f32 caches against the oracle (see the module doc)."""
    qkv = m.quantize(ctx, batch, k, v)
    st, (ck, cv), kr, vr, fk, fv = tqo.general_caches(m, batch, k, v)
    np.testing.assert_array_equal(qkv.extra["channels"][0], ck)
    real = batch.slot_mapping != PAD_SLOT
    sm = batch.slot_mapping.astype(np.int64)[real]
    bs = batch.block_size
    exact = ctx.rt.summary.is_software
    for which, recs, f in (("K", kr, fk), ("V", vr, fv)):
        got = qkv.extra["k_records" if which == "K" else "v_records"]
        bad = (got[real] != recs[real]).any(-1)
        if exact:
            assert not bad.any(), f"{which}: {int(bad.sum())} records differ"
        elif bad.any():  # only vectors with a coordinate within 8 steps of a boundary
            x = (k if which == "K" else v)[real]
            for ins in st.instances(which):
                e = tqo.encode_instance(x, ck if which == "K" else cv, ins, which == "K")
                near = (tqo.boundary_margin(e.rotated, tqo.TQParams(ins.P)) <= 8).any(-1) if ins.bits == 2 else True
                assert (~bad | near).all()
        gf = m.read_f32(ctx, qkv, which)[sm // bs, :, sm % bs]
        want = f[real]
        if exact:
            np.testing.assert_array_equal(gf.view(np.uint32), want.view(np.uint32))
        else:
            tol = 2.0**-18 * np.linalg.norm(want.astype(np.float64), axis=-1, keepdims=True)
            assert (np.abs(gf - want)[~bad] <= np.broadcast_to(tol, want.shape)[~bad]).all()
    # the slots of padding rows and unused block slots stay zero in the f32 cache
    full = m.read_f32(ctx, qkv, "V")
    used = np.zeros(full.shape[0] * bs, bool)
    used[sm] = True
    assert not full.transpose(0, 2, 1, 3).reshape(-1, full.shape[1], full.shape[3])[~used].any()
    return qkv


# (head_size, block_size, context lens, policy, pad_every, kv_heads, heads)
SHAPES = [(64, 8, [1, 37, 20], "contiguous", 0, 2, 4), (128, 16, [70, 0, 33], "scattered", 5, 2, 4),
          (96, 4, [9], "fragmented", 3, 1, 2)]


@pytest.mark.gpu
@pytest.mark.parametrize("opts", SETTINGS, ids=SIDS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"D{s[0]}-bs{s[1]}-{s[3]}")
def test_compressor_dequantiser_and_attention(ctx, opts, shape):
    D, bs, lens, policy, pad, kvh, H = shape
    m = get_method("turboquant", **opts)
    batch = make_batch(lens, bs, policy=policy, seed=4, pad_every=pad)
    rng = np.random.default_rng(D * bs)
    T = batch.num_tokens
    k = rng.standard_normal((T, kvh, D)).astype(np.float32)
    k[:, :, 5] *= 20.0  # an outlier channel (the split must pick it)
    v = (rng.standard_normal((T, kvh, D)) * 3).astype(np.float32)
    if T > 3:
        k[1] = 0.0  # a zero vector: every word 0, dequantised to 0
        v[2, :, :] = 0.5  # a constant vector
        k[3, :, 1:] = 0.0  # a one-hot vector: its rotation hits exact ties of the butterflies
    qkv = _check_caches(ctx, m, batch, k, v)
    if opts.get("outlier_share"):
        st = m.settings(D)
        assert 5 in qkv.extra["channels"][0][0, : st.n_outliers]
    q = rng.standard_normal((batch.num_seqs, H, D)).astype(np.float32)
    scale = D ** -0.5
    out = m.attend(ctx, qkv, batch, q, scale)
    ref, tol = reference("turboquant")(m, batch, k, v, q, scale)
    assert np.abs(out - ref).max() <= tol
    w = m.weights(ctx, qkv, batch, q, scale)
    assert np.allclose(w.sum(-1)[np.asarray(batch.context_lens) > 0], 1.0, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("bits", [1, 2, 3, 4])
def test_dequantised_key_is_the_estimator(ctx, bits):
    """q . k^ (the dequantised key) equals the estimator of the seed kernel's formula on the same words:
    n * sum q_rot*c[idx] + n * rn * qjl_scale * sum q_jl*(2*bit - 1), to float32 rounding (2e-5 relative)."""
    D, n = 128, 40
    m = get_method("turboquant", bits=bits, v_bits=1, qjl_scale="unbiased")  # v_bits 1: the general kernels at every bits
    batch = make_batch([n], 16)
    rng = np.random.default_rng(bits)
    k = rng.standard_normal((n, 1, D)).astype(np.float32)
    qkv = m.quantize(ctx, batch, k, k)
    st = m.settings(D)
    ins = st.instances("K")[0]
    f = qkv.extra["k_fields"]
    fk = m.read_f32(ctx, qkv, "K")
    sm = batch.slot_mapping.astype(np.int64)
    khat = fk[sm // 16, 0, sm % 16].astype(np.float64)
    q = rng.standard_normal(D).astype(np.float32)
    p = tqf.TQParams(D, m.seed, 0)
    q_rot, q_jl, _ = tqf.rotate_q_parts(q, p)
    c = ins.codebook[0].astype(np.float64)
    polar = f.norm[0][:, 0] * (c[f.idx[0][:, 0]] @ q_rot.astype(np.float64))
    sgn = 2.0 * f.jl_bits[0][:, 0].astype(np.float64) - 1.0
    corr = f.norm[0][:, 0] * f.rnorm[0][:, 0] * tqf.qjl_scale_value("unbiased", D) * (sgn @ q_jl.astype(np.float64))
    est = polar + corr
    np.testing.assert_allclose(khat @ q.astype(np.float64), est, rtol=0, atol=2e-5 * np.abs(est).max())


@pytest.mark.gpu
def test_distortion_and_bias_at_every_setting(rt):
    """The values' MSE on unit vectors at 1-4 bits (paper: about 0.36, 0.117, 0.03, 0.009) and the QJL bias
    panel's data at every setting: the unbiased scale has slope 1 within 0.05, the reference one is below."""
    want = {1: 0.36, 2: 0.117, 3: 0.034, 4: 0.0093}
    for b, mse in want.items():
        got = tq_bias.mse_unit_vectors(128, 1500, b, rt=rt)
        assert abs(got - mse) < 0.12 * mse, (b, got)
    for opts in ({"bits": 1}, {"bits": 3}, {"bits": 4}, {"bits": 2, "outlier_share": 0.5}):
        r = tq_bias.random_bias(128, 512, 4, rt=rt, **opts)
        assert abs(r.slopes["unbiased"] - 1.0) < 0.05, (opts, r.slopes)
        assert r.slopes["reference"] < r.slopes["unbiased"]
        assert set(r.est) == set(tq_bias.ESTIMATORS) and all(e.shape == (4 * 512,) for e in r.est.values())
    assert tq_bias.unsupported_reason(80) == "" and "256" in tq_bias.unsupported_reason(300)


@pytest.mark.gpu
def test_single_token_empty_and_inspector(ctx):
    m = get_method("turboquant", bits=3, v_bits=2, outlier_share=0.25)
    batch = make_batch([1, 0], 4)
    k = np.full((1, 1, 64), 0.25, np.float32)
    qkv = _check_caches(ctx, m, batch, k, -k)
    out = m.attend(ctx, qkv, batch, np.ones((2, 1, 64), np.float32), 0.125)
    assert not out[1].any() and np.isfinite(out).all()
    fv = tqo.general_caches(m, batch, k, -k)[5]
    np.testing.assert_allclose(out[0, 0], fv[0, 0], rtol=0, atol=2e-5)  # one value: the weight is 1
    assert np.linalg.norm(out[0, 0] + 0.25) < 0.5 * np.linalg.norm(k)  # and it is -k, up to the 2-bit distortion
    recs = m.inspect_block(ctx, qkv, batch, int(batch.seq_blocks[0][0]), 0, "K")
    assert recs[0].position == 0 and recs[1].position == -1
    assert set(recs[0].fields) >= {"polar_idx0", "jl_bits0", "norm0", "channels0", "polar_idx1"}
    assert len(recs[0].words) == m.settings(64).wpt("K")
    tk = m.timed_kernels(ctx, batch, k, -k, np.ones((2, 1, 64), np.float32), 0.125, qkv)
    assert [t.role for t in tk] == ["writer", "dequantise", "decode"]
