"""The PAGED fast TurboQuant decode (kvviz/families/turboquant/decode.py: plan_paged, shaders/turboquant/decode_fast_paged.wgsl
+ decode_tq_reduce.wgsl) and its writer: the general-settings compressor (tq_general_compress.wgsl) at the seed
configuration (bits 2, v_bits 2, no outliers, head 32/64/128), per-token records [num_blocks, kv_heads, block_size,
WK | WV] written through the batch's slot mapping. `test_writer_is_the_seed_compressor` holds its words, bit for
bit, to the seed compressor's (tq_compress.wgsl, per sequence) re-laid out as records
(kvviz.families.turboquant.format.seed_records) and to the numpy oracle (kvviz.families.turboquant.oracle.compress_general).
The paged decode equals the per-sequence fast decode bit for bit (same arithmetic, same partitions), and prefetch /
block size as a constant change no bit; the method's cache, inspector and timed rows.
The decode's oracle (kvviz.families.turboquant.oracle.paged_attention_oracle, tests/harness.py tq_paged_check) and the
scenarios every fast decode shares (heads 32/64/128 x GQA 1/4/8 x block sizes 1/16/32; one partition and many; zero
vectors and large values; a 20000-token context; the softmax variants; no subgroups; bad input) are in
tests/test_conformance.py.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from kvviz.errors import InvalidInput, UnsupportedShape
from kvviz.families.turboquant import format as tqf
from kvviz.families.turboquant import decode as fq
from kvviz.attention import records as qk
from kvviz.families.turboquant import kernels as tqk
from kvviz.families.turboquant import oracle as tqo
from kvviz.paging import PAD_SLOT
from kvviz.paging import make_batch

import harness
from harness import TQ_LAYER as LAYER
from harness import tq_inputs as _inputs
from harness import tq_paged_max_v as _max_v
from harness import tq_write_paged as write_paged

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def fast(rt):
    return harness.decoder(rt, "fast_decode_tq", "TQFastDecode")


@pytest.mark.parametrize("d,bs,pad", [(32, 1, 0), (64, 16, 3), (128, 32, 0)])
def test_writer_is_the_seed_compressor(rt, d, bs, pad):
    """The general compressor at the seed configuration writes, per token, exactly the seed compressor's words
    (and the numpy oracle's records), through a scattered batch with padding rows, zero vectors and large norms."""
    rng = np.random.default_rng(d + bs)
    lens, kvh = [37, 0, 1, 70], 2
    batch = make_batch(lens, bs, policy="scattered", seed=d, pad_every=pad)
    K, V = _inputs(rng, batch.num_tokens, kvh, d, zeros=0.1)
    K[3] *= 400.0  # norms up to ~1e4 (f16 range)
    V[5] *= 3000.0
    gc, kc, vc = write_paged(rt, batch, K, V)
    tq = tqk.TurboQuantKernels(rt)
    for s, L in enumerate(lens):
        if L == 0:
            continue
        rows = batch.token_rows(s)
        cache = tq.allocate(kvh, d, L, layer=LAYER)
        tq.compress(cache, K[rows], V[rows])
        kw, vw = tq.read(cache)
        sk, sv = tqf.seed_records(kw, vw, kvh, L, d)  # [L, kvh, WK | WV]
        t = np.arange(L)
        blk = batch.block_tables[s, t // bs].astype(np.int64)
        np.testing.assert_array_equal(kc[blk, :, t % bs], sk, err_msg=f"K records of sequence {s}")
        np.testing.assert_array_equal(vc[blk, :, t % bs], sv, err_msg=f"V records of sequence {s}")
        # and back: the records gathered through the block table are the seed cache's words
        pk, pv = tqo.paged_sequence_words(kc, vc, batch, s, d)
        assert np.array_equal(pk, kw) and np.array_equal(pv, vw)
    # the numpy oracle's records (kvviz.families.turboquant.oracle.compress_general), real rows: equal on an IEEE adapter
    # (lavapipe); on hardware (2.5-ulp division / sqrt) only differences rounding may decide (compare_cache)
    st = tqf.TQSettings(d, layer=LAYER)
    if rt.summary.is_software:
        real = batch.slot_mapping != PAD_SLOT
        ident = tqf.choose_channels(K, 0)
        sm = batch.slot_mapping[real].astype(np.int64)
        for which, x, got in (("K", K, kc), ("V", V, vc)):
            recs, _ = tqo.compress_general(x, ident, st, which)
            np.testing.assert_array_equal(got[sm // bs, :, sm % bs], recs[real], err_msg=f"{which} records vs the oracle")
    else:
        for s, L in enumerate(lens):
            if L:
                pk, pv = tqo.paged_sequence_words(kc, vc, batch, s, d)
                rows = batch.token_rows(s)
                res = tqo.compare_cache(pk, pv, K[rows], V[rows], L, tqf.TQParams(d, layer=LAYER))
                assert res["unexplained"] == 0, res


# ------------------------------------------------------------------------------------------------ the decode
def test_equals_the_per_sequence_decode_and_variants(rt, fast):
    """Bit for bit: the paged decode (unrolled) equals the per-sequence fast decode over the seed compressor's
    caches of the same tokens (same arithmetic, same partitions), with or without prefetch and with the block size a
    constant or read from the immediates; the looped paged decode (one token's softmax step at a time) within the
    tolerance."""
    rng = np.random.default_rng(7)
    lens, kvh, G, d, bs = [300, 0, 1, 777, 64], 2, 4, 64, 16
    batch = make_batch(lens, bs, policy="scattered", seed=7)
    K, V = _inputs(rng, batch.num_tokens, kvh, d)
    gc, kc, vc = write_paged(rt, batch, K, V)
    tq = tqk.TurboQuantKernels(rt)
    caches = []
    for s, L in enumerate(lens):
        c = tq.allocate(kvh, d, max(L, 1), layer=LAYER)
        if L:
            tq.compress(c, K[batch.token_rows(s)], V[batch.token_rows(s)])
        caches.append(c)
    q = rng.standard_normal((len(lens), kvh * G, d)).astype(np.float32)
    scale = 1.0 / math.sqrt(d)
    p = tqf.TQParams(d, layer=LAYER)
    one = fast.decode(caches, q, lens, scale, partition_tokens=128)
    for kw in ({"looped": False}, {"prefetch": False}, {"prefetch": True}, {"const_block": False, "looped": False}):
        got = fast.decode_paged(gc.qc.k, gc.qc.v, kvh, q, batch, scale, p, partition_tokens=128, **kw)
        assert np.array_equal(got, one), f"paged decode {kw} differs from the per-sequence decode"
    got = fast.decode_paged(gc.qc.k, gc.qc.v, kvh, q, batch, scale, p, partition_tokens=128, looped=True)
    for s in range(len(lens)):
        assert np.abs(got[s] - one[s]).max() <= fq.tolerance(_max_v(kc, vc, batch, s, d, p) if lens[s] else 0.0)


# ------------------------------------------------------------------------------------------------ the int8 query
def test_int8_query_layout_and_its_distance_to_the_exact_query(rt, fast):
    """qk="i8": the host's query records hold each head's codes in the masks' order (a polar word's (j, k) -> element
    j + 4k, a QJL word's (j, k) -> element j + 8k) and the two scales; the decode is held to the oracle of its int8
    query (the conformance grid in tests/test_conformance.py), which is near the exact query's and not equal to it."""
    rng = np.random.default_rng(12)
    D = 64
    q_rot, q_jl = (rng.standard_normal((2, 3, D)).astype(np.float32) for _ in range(2))
    rec = fq.query_records_i8(q_rot, q_jl)
    assert rec.shape == (2, 3, fq.query_record_words(D)) and rec.dtype == np.uint32
    codes = rec[..., :D // 2].copy().view(np.int8).reshape(2, 3, D // 2 * 4)
    want_r = np.rint(q_rot / (np.abs(q_rot).max(-1, keepdims=True) / 127)).astype(np.int8)
    want_j = np.rint(q_jl / (np.abs(q_jl).max(-1, keepdims=True) / 127)).astype(np.int8)
    polar, jl = codes[..., :D].reshape(2, 3, D // 16, 4, 4), codes[..., D:].reshape(2, 3, D // 32, 8, 4)
    for j in range(4):
        for k in range(4):
            assert np.array_equal(polar[:, :, :, j, k], want_r[..., j + 4 * k::16])
    for j in range(8):
        for k in range(4):
            assert np.array_equal(jl[:, :, :, j, k], want_j[..., j + 8 * k::32])
    assert np.allclose(rec[..., -2].view(np.float32), np.abs(q_rot).max(-1) / 127)

    lens, kvh, G = [300, 1, 0, 77], 2, 4
    batch = make_batch(lens, 16, policy="scattered", seed=3)
    K, V = _inputs(rng, batch.num_tokens, kvh, D)
    gc, kc, vc = write_paged(rt, batch, K, V)
    q = rng.standard_normal((len(lens), kvh * G, D)).astype(np.float32)
    p = tqf.TQParams(D, layer=LAYER)
    exact = tqo.paged_attention_oracle(q, kc, vc, batch, 0.125, p)
    as_i8 = tqo.paged_attention_oracle(q, kc, vc, batch, 0.125, p, qk="i8")
    got = fast.decode_paged(gc.qc.k, gc.qc.v, kvh, q, batch, 0.125, p, qk="i8")
    for s, L in enumerate(lens):
        if L == 0:
            assert not got[s].any()
            continue
        m = _max_v(kc, vc, batch, s, D, p)
        assert np.abs(got[s] - as_i8[s]).max() <= fq.tolerance(m)
        gap = float(np.abs(as_i8[s] - exact[s]).max())  # one token: its weight is 1 whatever the query
        assert (0.0 < gap if L > 1 else gap == 0.0) and gap < 0.05 * m, \
            f"sequence {s}: the int8 query moves the output by {gap:.3g} (max |V| {m:.3g})"


def test_int8_query_refusals(rt, fast, monkeypatch):
    """qk is "f32" or "i8"; the int8 query is the unrolled kernel's; a codebook not symmetric about 0 is refused
    (the kernel leaves the b0 b1 term out)."""
    rng = np.random.default_rng(1)
    D, kvh = 32, 1
    batch = make_batch([20], 16)
    K, V = _inputs(rng, batch.num_tokens, kvh, D)
    gc, _, _ = write_paged(rt, batch, K, V)
    q = rng.standard_normal((1, 2, D)).astype(np.float32)
    p = tqf.TQParams(D, layer=LAYER)
    assert fq.symmetric_codebook(p.centroids) and not fq.symmetric_codebook([-1.0, -0.25, 0.5, 1.0])
    with pytest.raises(InvalidInput, match="qk"):
        fast.plan_paged(gc.qc.k, gc.qc.v, kvh, q, batch, 0.2, p, qk="f16")
    with pytest.raises(InvalidInput, match="unrolled"):
        fast.plan_paged(gc.qc.k, gc.qc.v, kvh, q, batch, 0.2, p, qk="i8", looped=True)
    monkeypatch.setattr(fq, "symmetric_codebook", lambda c: False)
    with pytest.raises(UnsupportedShape, match="symmetric"):
        fast.plan_paged(gc.qc.k, gc.qc.v, kvh, q, batch, 0.2, p, qk="i8")


# ------------------------------------------------------------------------------------------------ the method
def test_method_paged_cache_attend_inspector_and_timed_rows(rt):
    """Method "turboquant" (seed configuration): its cache is the paged records (the inspector shows the physical
    blocks the batch's block tables name), `attend` is the paged fast decode (held to the oracle over those
    records), the bench rows carry the paged fast decode beside the seed kernels' rows."""
    from kvviz.families.registry import get_method
    from kvviz.methods.context import GpuContext
    from kvviz.families.registry import reference_attention

    m = get_method("turboquant", qjl_scale="unbiased")
    rng = np.random.default_rng(4)
    d, kvh, H, bs = 64, 2, 8, 16
    batch = make_batch([29, 0, 1, 70], bs, policy="scattered", seed=2, pad_every=7)
    K, V = _inputs(rng, batch.num_tokens, kvh, d)
    ctx = GpuContext(rt)
    qkv = m.quantize(ctx, batch, K, V)
    kc = qk.read_cache(rt, qkv.device["cache"], "K").reshape(batch.num_blocks, kvh, bs, -1)
    vc = qk.read_cache(rt, qkv.device["cache"], "V").reshape(batch.num_blocks, kvh, bs, -1)
    q = rng.standard_normal((batch.num_seqs, H, d)).astype(np.float32)
    scale = 1.0 / math.sqrt(d)
    out = m.attend(ctx, qkv, batch, q, scale)
    p = m.params(d)
    ref = tqo.paged_attention_oracle(q, kc, vc, batch, scale, p, "unbiased")
    for s, L in enumerate(batch.context_lens):
        if L:
            assert np.abs(out[s] - ref[s]).max() <= fq.tolerance(_max_v(kc, vc, batch, s, d, p))
        else:
            assert not out[s].any()
    # the method's registered reference over the method's words (extra["words"]: the records re-laid out)
    mref, tol = reference_attention(m, batch, K, V, q, scale, qkv)
    assert np.abs(out - mref).max() <= tol
    # the inspector reads the physical blocks: every used slot's record is that token's record
    owner = batch.block_owner()
    blk = int(batch.seq_blocks[3][1])  # sequence 3's second block (positions 16..31)
    recs = m.inspect_block(ctx, qkv, batch, blk, 1, "K")
    assert [r.position for r in recs] == list(range(16, 32)) and owner[blk] == 3
    for o, r in enumerate(recs):
        np.testing.assert_array_equal(r.words, kc[blk, 1, o])
        assert r.slot == blk * bs + o and r.fields["norm"] == float(qkv.k_scales[batch.token_rows(3)[16 + o], 1])
    free = [b for b in range(batch.num_blocks) if owner[b] < 0]
    if free:
        assert all(r.position == -1 for r in m.inspect_block(ctx, qkv, batch, free[0], 0, "V"))
    with pytest.raises(InvalidInput):
        m.inspect_block(ctx, qkv, batch, batch.num_blocks, 0, "K")
    timed = m.timed_kernels(ctx, batch, K, V, q, scale, qkv)
    rows = {(t.role, t.impl): t for t in timed}
    assert rows[("decode", "seed")].name == "flash_attention_tq (decode)"
    assert rows[("writer", "seed")].name.startswith("tq_compress")
    assert rows[("writer", "first-wave")].name.startswith("tq_general_compress")
    fast_row = rows[("decode", "fast")]
    assert fast_row.name.startswith("fast_decode_tq_paged (") and fast_row.bytes > 0 and fast_row.flops > 0
    assert len([x for x in fast_row.dispatches if x.kernel.kspec is fq.PAGED_SPLIT]) == 1
    rt.run(fast_row.dispatches)  # the timed dispatches recompute the same output (the rotated query was filled)
    plan = m.fast_plan(ctx, qkv, batch, q, scale)
    rt.run(plan.rotate + plan.dispatches)
    np.testing.assert_array_equal(rt.read(plan.out, np.float32, plan.shape), out)

