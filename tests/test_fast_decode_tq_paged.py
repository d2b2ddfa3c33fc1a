"""Conformance of the PAGED fast TurboQuant decode (kvviz/families/turboquant/decode.py: plan_paged,
shaders/turboquant/decode_fast_paged.wgsl + decode_tq_reduce.wgsl) and of its writer on the local adapter.

The writer is the general-settings compressor (tq_general_compress.wgsl) at the seed configuration (bits 2,
v_bits 2, no outliers, head 32/64/128): per-token records [num_blocks, kv_heads, block_size, WK | WV] written
through the batch's slot mapping. `test_writer_is_the_seed_compressor` holds its words, bit for bit, to the
seed compressor's (tq_compress.wgsl, per sequence) re-laid out as records (kvviz.families.turboquant.format.seed_records)
and to the numpy oracle (kvviz.families.turboquant.oracle.compress_general).

The decode's oracle: kvviz.families.turboquant.oracle.paged_attention_oracle, float64 over the SAME records gathered
through each sequence's block table (the seed kernel's estimator, a plain softmax, the inverse RHT).
Tolerance: |fast - oracle| <= 2e-5 * max(1, max |V^|), V^ = the dequantised values n_v * RHT^-1(c[vidx]) of the
sequence's tokens (fast_decode_tq.tolerance, the f32 fast decodes' bound), and each case checks the bound would
catch the other QJL scale. The paged decode also equals the per-sequence fast decode bit for bit (same
arithmetic, same partitions), and prefetch / block size as a constant change no bit.
Shapes: heads 32/64/128, GQA 1/4/8, block sizes 1/16/32, ragged lengths with 0 and 1, scattered blocks, one
partition and many, zero vectors, large values, one 20000-token context, the no-subgroup fallback; bad input.
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
from kvviz.paging import PAD_SLOT, make_batch

pytestmark = pytest.mark.gpu

LAYER = 1


@pytest.fixture(scope="module")
def fast(rt):
    return fq.TQFastDecode(rt)


def _inputs(rng, T, kvh, d, k_amp=1.0, v_amp=1.0, zeros=0.0):
    K = rng.standard_normal((T, kvh, d)) * k_amp
    V = rng.standard_normal((T, kvh, d)) * v_amp
    if zeros:  # a share of the (token, head) vectors exactly zero (all their words 0)
        K[rng.random((T, kvh)) < zeros] = 0.0
        V[rng.random((T, kvh)) < zeros] = 0.0
    return K.astype(np.float32), V.astype(np.float32)


def write_paged(rt, batch, K, V, layer=LAYER):
    """The paged writer: tq_general_compress at the seed configuration through the batch's slot mapping.
    Returns (GeneralTQCache, K records [nb, kvh, bs, WK], V records [nb, kvh, bs, WV])."""
    T, kvh, d = K.shape
    st = tqf.TQSettings(d, layer=layer)
    assert st.is_seed
    ident = tqf.choose_channels(K, 0)
    gc = tqk.general_allocate(rt, st, batch, kvh, ident, ident)
    rt.run(tqk.general_compress_dispatches(rt, gc, K, V, batch.slot_mapping))
    shp = (batch.num_blocks, kvh, batch.block_size, -1)
    return gc, qk.read_cache(rt, gc.qc, "K").reshape(shp), qk.read_cache(rt, gc.qc, "V").reshape(shp)


def _max_v(kc, vc, batch, s, d, p):
    kw, vw = tqo.paged_sequence_words(kc, vc, batch, s, d)
    L = int(batch.context_lens[s])
    dec = tqo.decode_cache(kw, vw, kc.shape[1], L, d)
    v = tqo.rht_inverse(p.centroids.astype(np.float64)[dec.v_idx], p.signs[0]) * dec.v_norm[..., None].astype(np.float64)
    return float(np.abs(v).max(initial=0.0))


def check(rt, fast, lens, kvh, G, d, bs, *, seed=0, qjl="reference", q_amp=1.0, policy="scattered",
          k_amp=1.0, v_amp=1.0, zeros=0.0, **kw):
    rng = np.random.default_rng(seed)
    batch = make_batch(lens, bs, policy=policy, seed=seed)
    K, V = _inputs(rng, batch.num_tokens, kvh, d, k_amp, v_amp, zeros)
    gc, kc, vc = write_paged(rt, batch, K, V)
    H = kvh * G
    q = (rng.standard_normal((len(lens), H, d)) * q_amp).astype(np.float32)
    scale = 1.0 / math.sqrt(d)
    p = tqf.TQParams(d, layer=LAYER)
    plan = fast.plan_paged(gc.qc.k, gc.qc.v, kvh, q, batch, scale, p, qjl, **kw)
    assert len([x for x in plan.dispatches if x.kernel.kspec is fq.PAGED_SPLIT]) == 1, "one split dispatch a batch"
    rt.run(plan.rotate + plan.dispatches)
    out = fast.read(plan)
    assert np.isfinite(out).all()
    ref = tqo.paged_attention_oracle(q, kc, vc, batch, scale, p, qjl)
    other = tqo.paged_attention_oracle(q, kc, vc, batch, scale, p, "unbiased" if qjl == "reference" else "reference")
    worst, caught = 0.0, False
    for s, L in enumerate(lens):
        if L == 0:
            assert not out[s].any(), "an empty sequence must give 0"
            continue
        tol = fq.tolerance(_max_v(kc, vc, batch, s, d, p))
        err = float(np.abs(out[s] - ref[s]).max())
        assert err <= tol, f"D{d} G{G} kvh{kvh} bs{bs} seq {s} (L={L}) {qjl}: error {err:.3g} > {tol:.3g} ({plan.describe()})"
        worst = max(worst, err / tol)
        if L > 1:
            caught |= float(np.abs(other[s] - ref[s]).max()) > 10 * tol
    print(f"\n[paged tq] D{d} G{G} kvh{kvh} bs{bs} lens {lens[:5]}{'...' if len(lens) > 5 else ''} {qjl}: "
          f"worst error {worst:.2e} of the tolerance; {plan.describe()}")
    return plan, caught, (batch, gc, q, scale, p, out)


# ------------------------------------------------------------------------------------------------ the writer
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
@pytest.mark.parametrize("d,G,kvh,bs", [
    (32, 1, 2, 1), (32, 8, 1, 16), (32, 4, 2, 32),
    (64, 4, 2, 16), (64, 1, 3, 32), (64, 8, 1, 1),
    (128, 4, 2, 16), (128, 1, 2, 1), (128, 8, 1, 32),
])
def test_heads_gqa_block_sizes(rt, fast, d, G, kvh, bs):
    plan, caught, _ = check(rt, fast, [37, 0, 1, 300, 16], kvh, G, d, bs, seed=d + G + bs, partition_tokens=64)
    assert caught, "the tolerance must be tight enough to see the other QJL scale"
    assert plan.num_partitions == math.ceil(300 / plan.partition_tokens) > 1


@pytest.mark.parametrize("qjl", ["reference", "unbiased"])
def test_partitions_single_and_many(rt, fast, qjl):
    lens = [700, 1, 0, 333]
    plan, caught, _ = check(rt, fast, lens, 2, 4, 64, 16, seed=3, qjl=qjl, partition_tokens=64)
    assert plan.num_partitions == math.ceil(700 / plan.partition_tokens) > 4 and caught
    plan, _, _ = check(rt, fast, lens, 2, 4, 64, 16, seed=3, qjl=qjl, partition_tokens=4096)
    assert plan.num_partitions == 1


def test_zero_vectors_and_contiguous_blocks(rt, fast):
    # a fifth of the key and value vectors exactly zero (their records all 0 words)
    check(rt, fast, [90, 1, 0, 45], 2, 4, 64, 16, seed=21, zeros=0.2, policy="contiguous", partition_tokens=64)


def test_large_values_and_logits(rt, fast):
    # norms up to ~5e4 (the f16 range), logits in the hundreds: the online max and the merges must hold
    check(rt, fast, [200, 1, 57], 2, 4, 64, 16, seed=11, k_amp=30.0, v_amp=3500.0, q_amp=8.0, partition_tokens=64)


def test_long_context_one_sequence(rt, fast):
    # 20000 tokens in 16-token blocks, scattered, the default split: many partitions, each within lavapipe's loop
    # budget (kvviz/gpu/loop_budget.py); a peaked softmax over the whole context
    plan, caught, _ = check(rt, fast, [20000], 1, 2, 64, 16, seed=5, q_amp=4.0)
    assert plan.num_partitions > 8 and caught


def test_no_subgroups_fallback(rt, fast):
    lay = fast.layout(64, 1, subgroups=False, unroll=1)
    assert lay.lanes == 1
    check(rt, fast, [90, 0, 1], 2, 1, 64, 16, seed=8, subgroups=False, unroll=1, partition_tokens=32)


def test_equals_the_per_sequence_decode_and_variants(rt, fast):
    """Bit for bit: the paged decode equals the per-sequence fast decode over the seed compressor's caches of
    the same tokens (same arithmetic, same partitions), with or without prefetch and with the block size a
    constant or read from the immediates."""
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
    for kw in ({}, {"prefetch": False}, {"prefetch": True}, {"const_block": False}):
        got = fast.decode_paged(gc.qc.k, gc.qc.v, kvh, q, batch, scale, p, partition_tokens=128, **kw)
        assert np.array_equal(got, one), f"paged decode {kw} differs from the per-sequence decode"


def test_bad_input_is_refused(rt, fast):
    rng = np.random.default_rng(1)
    d, kvh, bs = 64, 2, 16
    batch = make_batch([10, 5], bs, policy="scattered", seed=1)
    K, V = _inputs(rng, batch.num_tokens, kvh, d)
    gc, _, _ = write_paged(rt, batch, K, V)
    p = tqf.TQParams(d, layer=LAYER)
    q = rng.standard_normal((2, 4, d)).astype(np.float32)
    k, v = gc.qc.k, gc.qc.v
    fast.plan_paged(k, v, kvh, q, batch, 0.1, p)  # the good case plans
    bad = make_batch([10, 5], bs, policy="scattered", seed=1)
    bad.block_tables = bad.block_tables.copy()
    bad.block_tables[1, 0] = bad.num_blocks  # out of the pool
    with pytest.raises(InvalidInput, match="block"):
        fast.plan_paged(k, v, kvh, q, bad, 0.1, p)
    empty = make_batch([10, 0], bs, seed=1)
    empty.block_tables = empty.block_tables.copy()
    empty.block_tables[1, 0] = 99  # an empty sequence's entry 0 (read, never used, by the prefetching loads)
    with pytest.raises(InvalidInput, match="entry 0"):
        fast.plan_paged(k, v, kvh, q, empty, 0.1, p)
    with pytest.raises(InvalidInput):
        fast.plan_paged(k, v, kvh, q[:1], batch, 0.1, p)  # q for one sequence, the batch has two
    with pytest.raises(InvalidInput):
        fast.plan_paged(k, v, kvh, q.astype(np.float64), batch, 0.1, p)  # not f32
    with pytest.raises(InvalidInput):
        fast.plan_paged(k, v, kvh, q[0], batch, 0.1, p)  # 2-D
    with pytest.raises(InvalidInput):
        fast.plan_paged(k, v, kvh, rng.standard_normal((2, 3, d)).astype(np.float32), batch, 0.1, p)  # GQA 3/2
    with pytest.raises(InvalidInput):
        fast.plan_paged(k, v, kvh, q, batch, float("nan"), p)
    with pytest.raises(InvalidInput, match="head size"):
        fast.plan_paged(k, v, kvh, q, batch, 0.1, tqf.TQParams(32, layer=LAYER))  # parameters of another head size
    with pytest.raises(InvalidInput, match="V cache"):
        fast.plan_paged(k, rt.empty(64, "small"), kvh, q, batch, 0.1, p)  # a V buffer too small for the pool
    with pytest.raises(InvalidInput, match="K cache"):
        fast.plan_paged(k, v, 4, rng.standard_normal((2, 8, d)).astype(np.float32), batch, 0.1, p)  # 4 KV heads
    with pytest.raises(UnsupportedShape):
        fast.plan_paged(k, v, kvh, rng.standard_normal((2, 4, 96)).astype(np.float32), batch, 0.1,
                        tqf.TQParams(96, layer=LAYER))  # not a seed head size
    with pytest.raises(UnsupportedShape):
        fast.plan_paged(k, v, 1, rng.standard_normal((2, 17, d)).astype(np.float32), batch, 0.1, p)  # GQA 17


# ------------------------------------------------------------------------------------------------ the method
def test_method_paged_cache_attend_inspector_and_timed_rows(rt):
    """Method "turboquant" (seed configuration): its cache is the paged records (the inspector shows the physical
    blocks the batch's block tables name), `attend` is the paged fast decode (held to the oracle over those
    records), the bench rows carry the paged fast decode beside the seed kernels' rows."""
    from kvviz.methods import get_method
    from kvviz.methods.context import GpuContext
    from kvviz.methods.base import reference_attention

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


@pytest.mark.parametrize("d,G,kvh,unroll", [(64, 3, 2, 2), (64, 16, 1, 2), (32, 4, 1, 4)])
def test_scatter_and_all_lane_softmax(rt, fast, d, G, kvh, unroll):
    """fast_decode's reduce-scatter softmax (the default) and the all-lane one, each against the oracle: GQA 3
    (G x U padded to a power of two), 16 (a lane owns several (head, token) slots), 4 tokens a row per step."""
    for scatter in (True, False):
        check(rt, fast, [37, 0, 1, 300], kvh, G, d, 16, seed=d + G, q_amp=3.0, partition_tokens=64, unroll=unroll,
              scatter=scatter)
