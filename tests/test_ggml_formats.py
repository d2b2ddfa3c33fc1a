"""llama.cpp block types (q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl) and MXFP4 as KV caches: bit identity with
the gguf package and conformance of the GPU writer / dequantiser / decode on lavapipe.

What is exact and why (kvviz/families/ggml/oracle.py, shaders/ggml/write.wgsl):
  * The GPU's cache bytes EQUAL gguf.quants.quantize's bytes (q8_0..q5_1, mxfp4) over random, outlier
    and tie-heavy inputs: divisions are correctly rounded, products are never fused into the add after
    them, f16 conversion is integer round-to-nearest-even. Documented exceptions (blocks with max|x| <
    2^-100; the sign of a q4_1/q5_1 zero minimum) are tested as such. iq4_nl is held to the oracle's
    transcription of llama.cpp's reference, which is itself checked against a scalar transcription.
  * The dequantised f32 cache EQUALS gguf.quants.dequantize bit for bit (every d*q is exact in f32).
  * Attention runs through the f32 paged decode: |out - ref| <= 2e-5 * max(1, max|V^|) and weights within
    2e-6 against the float64 oracle over gguf's dequantised caches (tests/test_quant_methods.py's bounds).
"""
from __future__ import annotations

import gguf
import ml_dtypes
import numpy as np
import pytest

from kvviz.errors import InvalidInput, UnsupportedShape
from kvviz.families.ggml import format as fg
from kvviz.families.registry import get_method, registry
from kvviz.families.ggml import oracle as og
from kvviz.paging import make_batch

from harness import ggml_kv as make_kv
from harness import ggml_method_check as check_method

TYPES = ("q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl", "mxfp4")
GGUF_QUANTIZES = ("q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "mxfp4")


def gguf_rows(x, name):
    """gguf.quants.quantize of [..., D] rows -> [..., D/32 * block_bytes] u8."""
    t = fg.TYPES[name]
    x = np.ascontiguousarray(x, np.float32)
    with np.errstate(over="ignore", invalid="ignore"):  # gguf's MXFP4 errors overflow near float32 max (harmless)
        return np.asarray(gguf.quants.quantize(x.reshape(-1, x.shape[-1]), og.qtype(t))).reshape(*x.shape[:-1], -1)


# ------------------------------------------------------------------------------------- inputs
def random_blocks(rng, n):
    return (rng.standard_normal((n, 32)) * 10.0 ** rng.uniform(-4, 4, (n, 1))).astype(np.float32)


def outlier_blocks(rng, n):
    """Gaussian blocks with one to three elements 30x-3000x larger (llama-like outlier channels)."""
    b = rng.standard_normal((n, 32)).astype(np.float32)
    for i in range(n):
        idx = rng.choice(32, rng.integers(1, 4), replace=False)
        b[i, idx] *= np.float32(10.0 ** rng.uniform(1.5, 3.5)) * rng.choice([-1, 1])
    return b


def tie_blocks(name):
    """Blocks whose scale is a power of two and whose other elements sit exactly halfway between two
    codes (and on codes), at several binades: every rounding rule's tie case is exercised."""
    halves = np.arange(-40, 41, dtype=np.float32) / np.float32(2)  # k/2
    rows = []
    for p in (-6, 0, 5):
        s = np.float32(2.0**p)
        if name == "q8_0":  # d = 1, id = 1: x = k + 1/2, roundf away from zero
            anchor, vals = 127.0, np.clip(halves * 3, -126.5, 126.5)
        elif name in ("q4_0", "q5_0"):  # max = -8 (-16): d = 1; x*id + 8.5 (16.5) lands on integers + 1/2 + 1/2
            lim = 8 if name == "q4_0" else 16
            anchor, vals = -float(lim), np.clip(halves, -lim + 0.5, lim - 0.5)
        elif name in ("q4_1", "q5_1"):  # min 0, max 15 (31): d = 1; (x - m)*id + 0.5
            top = 15 if name == "q4_1" else 31
            anchor, vals = float(top), np.clip(np.abs(halves), 0, top)
        elif name == "mxfp4":  # amax 4: e = 127, d = 1/2, values 0..6: midpoints 0.25 .. 5 and their negatives
            anchor = 4.0
            mids = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 0.5, 1.5, 3.0], np.float32)
            vals = np.concatenate([mids, -mids, [6.0, -6.0, 0.0, -0.0]])
        else:
            anchor, vals = 113.0, halves * 5
        for start in range(0, len(vals), 31):
            chunk = vals[start:start + 31]
            blk = np.zeros(32, np.float32)
            blk[0] = anchor
            blk[1:1 + len(chunk)] = chunk
            if name in ("q4_1", "q5_1"):
                blk[31] = 0.0  # min 0 exactly
            rows.append(blk * s)
    return np.asarray(rows, np.float32)


def log2_edge_blocks():
    """MXFP4: amax just below / at a power of two over many binades (float32 log2 rounds some up)."""
    rows = []
    for k in list(range(-90, 120, 7)) + [2, 3, 126, 127]:
        p = np.float32(2.0**k)
        for a in (p, np.nextafter(p, np.float32(0)), np.nextafter(np.nextafter(p, np.float32(0)), np.float32(0)),
                  np.float32(p * np.float32(1 - 2.0**-20))):
            blk = np.linspace(-1, 1, 32).astype(np.float32) * a
            blk[7] = a
            rows.append(blk)
    return np.asarray(rows, np.float32)


# --------------------------------------------------------------------- CPU: oracle vs gguf itself
@pytest.mark.parametrize("name", GGUF_QUANTIZES)
def test_oracle_is_gguf(name):
    """The oracle's bytes are gguf's, apart from the two documented exceptions, which are exercised."""
    rng = np.random.default_rng(1)
    t = fg.TYPES[name]
    x = np.concatenate([random_blocks(rng, 300), outlier_blocks(rng, 100), tie_blocks(name), np.zeros((2, 32), np.float32)])
    np.testing.assert_array_equal(og.quantize_blocks(x, t), gguf_rows(x, name).reshape(len(x), -1))
    # blocks below 2^-100: zero-scale codes, scale bits as gguf's (f16 zero) and a zero dequantisation
    tiny = (rng.standard_normal((20, 32)) * 2.0**-110).astype(np.float32)  # max |x| < 2^-100
    ours, theirs = og.quantize_blocks(tiny, t), gguf_rows(tiny, name).reshape(len(tiny), -1)
    if name != "mxfp4":
        np.testing.assert_array_equal(ours[:, :t.header], theirs[:, :t.header])
    assert (og.dequantize_rows(ours, 32, t) == 0).all()
    assert (np.asarray(gguf.quants.dequantize(theirs, og.qtype(t))) == 0).all() or name == "mxfp4"
    if t.has_min:  # a block whose minimum is a zero of both signs: the f16 min is -0
        z = np.zeros((1, 32), np.float32)
        z[0, 3] = -0.0
        z[0, 9] = 2.0
        b = og.quantize_blocks(z, t)
        assert b[0, 2:4].view(np.uint16)[0] == 0x8000
        np.testing.assert_array_equal(b[:, 4:], gguf_rows(z, name).reshape(1, -1)[:, 4:])


def test_log2_table_matches_numpy():
    """The MXFP4 exponent table reproduces floor(np.log2(float32)) (what gguf computes) near powers of two."""
    x = log2_edge_blocks().max(-1)
    bits = x.view(np.uint32)
    be = bits >> 23
    e_tab = be.astype(np.int64) - 127 + ((bits & 0x7FFFFF) >= fg.log2_up_table()[be])
    np.testing.assert_array_equal(e_tab, np.floor(np.log2(x)).astype(np.int64))
    assert (fg.log2_up_table()[[129, 200, 254]] < (1 << 23)).all()  # k = 2 .. 127 do round up near 2^k


def _iq4_scalar(x):
    """A scalar transcription of llama.cpp quantize_row_iq4_nl_impl (one block, ntry 7, weight x^2),
    float32 numpy scalars, unfused: an independent check of the vectorised oracle."""
    f = np.float32
    v = [f(a) for a in fg.IQ4_NL_VALUES]

    def best(a):
        if a <= v[0]:
            return 0
        if a >= v[15]:
            return 15
        ml, mu = 0, 15
        while mu - ml > 1:
            mav = (ml + mu) // 2
            if a < v[mav]:
                mu = mav
            else:
                ml = mav
        return mu - 1 if f(a - v[mu - 1]) < f(v[mu] - a) else mu

    amax, mx = f(0), f(0)
    for a in x:
        if abs(a) > amax:
            amax, mx = abs(a), a
    if amax < f(1e-15):
        d = f(0)
    else:
        def sums(id_):
            sqx = sq2 = f(0)
            for a in x:
                q = v[best(f(id_ * a))]
                wq = f(f(a * a) * q)
                sqx = f(sqx + f(wq * a))
                sq2 = f(sq2 + f(wq * q))
            return sqx, sq2

        d = f(f(-mx) / f(-127))
        sqx, sq2 = sums(f(f(1) / d))
        d = f(sqx / sq2)
        bst = f(d * sqx)
        for itry in range(-7, 8):
            sqx, sq2 = sums(f(f(itry - 127) / mx))
            if sq2 > 0 and f(sqx * sqx) > f(bst * sq2):
                d = f(sqx / sq2)
                bst = f(d * sqx)
    id_ = f(f(1) / d) if d != 0 else f(0)
    L = [best(f(id_ * a)) for a in x]
    return np.float16(d).view(np.uint16), L


def test_iq4_nl_oracle_is_llamacpps_scalar_search():
    rng = np.random.default_rng(3)
    x = np.concatenate([random_blocks(rng, 12), outlier_blocks(rng, 6), tie_blocks("iq4_nl")[:2], np.zeros((1, 32), np.float32)])
    got = og.quantize_iq4_nl(x)
    for i, blk in enumerate(x):
        dh, L = _iq4_scalar(blk)
        assert got[i, :2].view(np.uint16)[0] == dh, i
        codes = np.concatenate([got[i, 2:] & 15, got[i, 2:] >> 4])
        np.testing.assert_array_equal(codes, L, err_msg=str(i))
    # ties of best_index pick the upper value; NaN the last, as the C binary search does
    V = np.array(fg.IQ4_NL_VALUES, np.float32)
    mids = (V[:-1] + V[1:]) / 2
    np.testing.assert_array_equal(og.best_index(mids), np.arange(1, 16))
    # its error is the least-squares one llama.cpp aims at: no worse than the plain amax/127 scale
    deq = og.dequantize_rows(got, 32, fg.TYPES["iq4_nl"])
    plain = (x.max(-1, keepdims=True) / np.float32(127)).astype(np.float16).astype(np.float32)
    assert ((deq - x) ** 2).sum() <= ((V[og.best_index(x / np.where(plain == 0, 1, plain))] * plain - x) ** 2).sum()


def test_mxfp4_dequantisation_is_ocp():
    """gguf's MXFP4 dequantisation = E2M1 value * E8M0 scale as ml_dtypes decodes them."""
    rng = np.random.default_rng(4)
    x = np.concatenate([random_blocks(rng, 50), log2_edge_blocks()])
    t = fg.TYPES["mxfp4"]
    raw = og.quantize_blocks(x, t)
    f = fg.unpack_rows(raw, 32, t)
    e8 = f["scale_bits"].astype(np.uint8).view(ml_dtypes.float8_e8m0fnu).astype(np.float32)
    e2 = np.asarray(fg.MXFP4_VALUES, np.float32)[f["codes"]] / 2
    np.testing.assert_array_equal(e2 * e8[:, :1], og.dequantize_rows(raw, 32, t))
    np.testing.assert_array_equal(f["scale"], e8)


# -------------------------------------------------------------------------- GPU: writer bit identity
def _run(ctx, name, x):
    """Blocks [n, 32] through the GPU writer as rows of one KV head (D = 128) -> (cache bytes [n, bpb], f32 rows)."""
    m = get_method(name)
    n = len(x)
    pad = (-n) % 4
    rows = np.concatenate([x, np.zeros((pad, 32), np.float32)]).reshape(-1, 1, 128)
    batch = make_batch([len(rows)], 16)
    qkv = m.quantize(ctx, batch, rows, rows)
    raw = fg.records_to_rows(qkv.extra["k_records"], 128, m.fmt).reshape(-1, m.fmt.block_bytes)[:n]
    f = m.read_f32(ctx, qkv, "K")
    sm = batch.slot_mapping.astype(np.int64)
    deq = f[sm // 16, 0, sm % 16].reshape(-1, 32)[:n]
    return raw, deq


@pytest.mark.parametrize("name", TYPES)
def test_gpu_writer_is_bit_identical(ctx, name):
    """GPU bytes == gguf.quants.quantize (iq4_nl: the llama.cpp reference) over random, outlier, tie, log2-edge
    and zero blocks; the GPU's dequantised values == gguf.quants.dequantize, bit for bit."""
    rng = np.random.default_rng(5)
    parts = [random_blocks(rng, 24), outlier_blocks(rng, 16), tie_blocks(name), np.zeros((1, 32), np.float32)]
    if name == "mxfp4":
        parts.append(log2_edge_blocks())
    x = np.concatenate(parts)
    raw, deq = _run(ctx, name, x)
    t = fg.TYPES[name]
    want = gguf_rows(x, name).reshape(len(x), -1) if name in GGUF_QUANTIZES else og.quantize_blocks(x, t)
    bad = np.flatnonzero((raw != want).any(-1))
    assert bad.size == 0, [(i, raw[i].tobytes().hex(), want[i].tobytes().hex()) for i in bad[:3]]
    ref = np.asarray(gguf.quants.dequantize(want, og.qtype(t)), np.float32)
    np.testing.assert_array_equal(deq.view(np.uint32), ref.view(np.uint32))


@pytest.mark.parametrize("name", TYPES)
def test_gpu_dequantises_any_block(ctx, name):
    """Random block bytes (every code, both signs of zero, f16 subnormal scales; finite scales and E8M0
    exponents 2..252, the range the writer produces) written straight into the cache: the GPU's dequantisation equals gguf's bit for bit."""
    t = fg.TYPES[name]
    m = get_method(name)
    batch = make_batch([24], 8)
    z = np.zeros((24, 2, 64), np.float32)
    qkv = m.quantize(ctx, batch, z, z)
    qc = qkv.device["cache"]
    rng = np.random.default_rng(13)
    rows = rng.integers(0, 256, (qc.num_blocks, 2, 8, t.row_bytes(64)), dtype=np.uint8)
    blocks = rows.reshape(-1, t.block_bytes)
    if name == "mxfp4":
        blocks[:, 0] = rng.integers(2, 253, len(blocks))
    else:
        for o in range(0, t.header, 2):  # f16 fields: exponent 31 (inf / NaN) -> 30
            hi = blocks[:, o + 1]
            blocks[:, o + 1] = np.where((hi & 0x7C) == 0x7C, hi & 0xFB, hi)
    recs = fg.rows_to_records(rows, 64, t)
    ctx.rt.write(qc.k, recs)
    ctx.rt.run(qkv.device["dequant"])
    got = m.read_f32(ctx, qkv, "K")
    want = og.dequantize(recs, 64, t)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


def test_gpu_tiny_blocks_and_signed_zeros(ctx):
    """The documented exceptions on the GPU: blocks below 2^-100 and a q4_1 minimum of -0 and +0."""
    rng = np.random.default_rng(6)
    tiny = (rng.standard_normal((8, 32)) * 2.0**-110).astype(np.float32)
    z = np.zeros((2, 32), np.float32)
    z[0, 5] = -0.0
    z[0, 9] = 3.0
    z[1, ::2] = -0.0
    x = np.concatenate([tiny, z])
    for name in ("q8_0", "q4_0", "q4_1", "mxfp4"):
        raw, deq = _run(ctx, name, x)
        np.testing.assert_array_equal(raw, og.quantize_blocks(x, fg.TYPES[name]), err_msg=name)
        assert (deq[:8] == 0).all()


def test_gpu_small_magnitudes(ctx):
    """Blocks of max |x| around 1e-14 .. 1e-10 and 2^-98 (just above the 2^-100 cut): bit identity holds for
    every type (q8_0 .. mxfp4: the products stay normal floats)."""
    rng = np.random.default_rng(10)
    x = np.concatenate([(rng.standard_normal((4, 32)) * s).astype(np.float32) for s in (1e-14, 1e-12, 1e-10, 2.0**-98)])
    x[-4:, 0] = np.float32(2.0**-98)
    for name in GGUF_QUANTIZES:
        raw, deq = _run(ctx, name, x)
        np.testing.assert_array_equal(raw, gguf_rows(x, name).reshape(len(x), -1), err_msg=name)


def test_gpu_iq4_nl_subnormal_sums(ctx):
    """iq4_nl's scale search over blocks of max |x| below ~2^-34 sums float32 subnormals (w*q*x with w = x^2):
    bit identity there needs a device that keeps subnormals, as lavapipe does (kvviz/families/ggml/oracle.py)."""
    if not ctx.rt.summary.is_software:
        pytest.skip("bit identity of iq4_nl's subnormal sums is only claimed on denormal-preserving lavapipe")
    rng = np.random.default_rng(11)
    x = np.concatenate([(rng.standard_normal((4, 32)) * s).astype(np.float32) for s in (2e-15, 1e-14, 1e-12)])
    raw, _ = _run(ctx, "iq4_nl", x)
    np.testing.assert_array_equal(raw, og.quantize_blocks(x, fg.TYPES["iq4_nl"]))


# (the methods' grid over shapes: tests/test_conformance.py test_method_conformance)
# -------------------------------------------------------------------------- limits and refusals
def test_f16_scale_range(ctx):
    """A q8_0 block needing a scale above 65504 is refused before dispatch (never stored as inf); just below
    the limit it is stored exactly as gguf stores it. iq4_nl refuses max |x| >= 6.55e6 (its scale is about
    amax/113); mxfp4's E8M0 scale takes every finite float32."""
    batch = make_batch([4], 8)
    base = np.ones((4, 1, 64), np.float32)
    ok = base.copy()
    ok[0, 0, 0] = np.float32(65519.0 * 127)  # d = 65519: f16 65504
    raw, deq = _run(ctx, "q8_0", ok.reshape(-1, 32))
    np.testing.assert_array_equal(raw, gguf_rows(ok.reshape(-1, 32), "q8_0").reshape(-1, 34))
    assert np.isfinite(deq).all()
    for name, big in (("q8_0", 65520.0 * 127), ("q4_0", 65520.0 * 8), ("q5_0", 65520.0 * 16), ("q4_1", -7e4), ("q5_1", -7e4),
                      ("iq4_nl", 1e7)):
        bad = base.copy()
        bad[2, 0, 40] = np.float32(big)
        with pytest.raises(InvalidInput, match="f16"):
            get_method(name).quantize(ctx, batch, base, bad)
        with pytest.raises(InvalidInput, match="f16"):  # what live decode's appends go through
            get_method(name).check_values(bad[2:3], base[2:3])
    near = base.copy()
    near[0, 0, 9] = np.float32(6.5e6)  # iq4_nl: just under its refusal bound, the scale (~amax/113) fits f16
    raw, deq = _run(ctx, "iq4_nl", near.reshape(-1, 32))
    np.testing.assert_array_equal(raw, og.quantize_blocks(near.reshape(-1, 32), fg.TYPES["iq4_nl"]))
    assert np.isfinite(deq).all() and abs(deq[0, 9] - 6.5e6) < 6.5e6 / 100
    with np.errstate(over="ignore"):
        assert np.isinf(np.float16(np.float32(65520.0 * 127) / np.float32(127)))  # what gguf would have stored
    pos = base.copy()
    pos[0, 0, 3] = np.float32(7e4)  # q4_1 stores d = (max - min)/15 and the min: a large max is fine
    raw, _ = _run(ctx, "q4_1", pos.reshape(-1, 32))
    np.testing.assert_array_equal(raw, gguf_rows(pos.reshape(-1, 32), "q4_1").reshape(-1, 20))
    huge = base.copy()
    huge[1, 0, :] = np.float32(3e38)
    raw, deq = _run(ctx, "mxfp4", huge.reshape(-1, 32))
    np.testing.assert_array_equal(raw, gguf_rows(huge.reshape(-1, 32), "mxfp4").reshape(-1, 17))
    assert np.isfinite(deq).all() and deq.max() > 1e38


def test_shapes_and_invalid_input(ctx):
    for name in TYPES:
        m = get_method(name)
        for D in (48, 80, 96 + 8, 512):
            with pytest.raises(UnsupportedShape):
                m.check(4, 2, D, 16)
        m.check(4, 2, 96, 16)
        batch = make_batch([3], 8)
        k = np.ones((3, 1, 64), np.float32)
        for bad in (np.where(np.arange(64) == 5, np.nan, k).astype(np.float32), k.astype(np.float64), k[:, :, :32]):
            with pytest.raises(InvalidInput):
                m.quantize(ctx, batch, bad, k)


def test_layouts_inspector_and_bytes(ctx):
    """bytes per 32 elements as llama.cpp lays them out; cache bytes = layout x tokens; the inspector's words
    and fields are the cache's."""
    want = {"q8_0": 34, "q4_0": 18, "q4_1": 20, "q5_0": 22, "q5_1": 24, "iq4_nl": 18, "mxfp4": 17}
    batch = make_batch([20, 13], 16, policy="scattered", pad_every=4)
    rng = np.random.default_rng(8)
    k, v = make_kv(rng, batch.num_tokens, 2, 128)
    for name in TYPES:
        m = get_method(name)
        kl, vl = m.layouts(128, 16)
        assert fg.TYPES[name].block_bytes == want[name]
        assert kl.bytes_per_token_per_head == 4 * want[name] == vl.bytes_per_token_per_head  # 4 blocks, no padding
        assert kl.bits_per_element == want[name] / 4
        assert sum(f.total_bits for f in kl.fields) == 8 * 4 * want[name]
        assert m.layouts(32, 16)[0].bytes_per_token_per_head == 4 * fg.TYPES[name].words_per_token(32)  # padded
        qkv = m.quantize(ctx, batch, k, v)
        qc = qkv.device["cache"]
        assert qc.k_words * qc.num_blocks * qc.num_kv_heads * 4 == kl.bytes_per_token_per_head * batch.num_blocks * 16 * 2
        for s in range(batch.num_seqs):
            blk = int(batch.seq_blocks[s][0])
            recs = m.inspect_block(ctx, qkv, batch, blk, 1, "V")
            rows = batch.token_rows(s)
            for r in recs:
                if r.position < 0:
                    continue
                t = rows[r.position]
                np.testing.assert_array_equal(r.words, qkv.extra["v_records"][t, 1])
                np.testing.assert_array_equal(r.fields["codes"], qkv.v_codes[t, 1])
                np.testing.assert_array_equal(r.fields["scale"], qkv.v_scales[t, 1])
        ks, vs, note = m.token_scales(qkv, 0, len(batch.token_rows(0)))
        assert note and np.isfinite(ks).all() and (ks >= 0).all()


def test_chunked_writer_and_windows(ctx):
    """Grid limit 8 and a 48 KiB binding: the writer runs in many chunks, the f32 cache in windows; still exact."""
    rt = ctx.rt
    saved = dict(rt.limits)
    rt.limits["max-compute-workgroups-per-dimension"] = 8
    rt.limits["max-storage-buffer-binding-size"] = 48 << 10
    try:
        batch = make_batch([150, 9], 16, policy="contiguous", pad_every=11)
        k, v = make_kv(np.random.default_rng(9), batch.num_tokens, 1, 64)
        m = get_method("q4_1")
        m.writer_impl = "first-wave"  # the fast writer's 2-D grid needs no chunks (tests/test_fast_write_ggml.py)
        qkv = check_method(ctx, m, batch, k, v, 2)
        assert len(qkv.device["writer"]) > batch.num_tokens // 8
        m.writer_impl = "fast"
        qkv = check_method(ctx, m, batch, k, v, 2)
        assert qkv.device["cache"].extra["writer_impl"] == "fast"
    finally:
        rt.limits.clear()
        rt.limits.update(saved)


def test_registered():
    reg = registry()
    assert set(TYPES) <= set(reg)
    assert all(reg[n].family == "ggml" for n in TYPES)
