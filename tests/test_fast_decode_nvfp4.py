"""Conformance of the fast split-K NVFP4 decode (kvviz/families/fp4/decode.py) on the local adapter.

The caches are written by the method itself (NvFp4.quantize: the GPU writer and its per-tensor scales) and
read back; the words read back must equal the oracle's (kvviz.families.fp4.oracle.quantize_batch, bit for bit), and
the reference is the method's attention oracle over those words: kvviz.families.fp4.oracle.dequantize (e2m1 * e4m3,
then * s_t in float32: the method's dequantiser's values) through the f32 paged decode's arithmetic in
float64 (kvviz.attention.paged_oracle).

Tolerance: |fast - oracle| <= 2e-5 * max(1, max |V^|), V^ = the dequantised values (fast_decode_fp4.tolerance,
the f32 fast decodes' bound): f32 accumulation in another order, exp2 for exp, the tensor scales folded into
the query and the weight.
Grid: head sizes 16 (4 dims a lane), 64, 128 (8 dims), 256 (whole sub-blocks) and 80 (a multiple of 16, not of
32: one lane a row), GQA 1 / 3 / 4 / 8, block sizes 1 / 16 / 32, ragged lengths with 0 and 1, scattered block
tables, several partitions, zeros, values across the E4M3 scale range, a 20000+ token context, the one-lane
variant without subgroups, prefetch on / off (bit-identical), scatter on / off, refusals, the method's attend /
timed rows. Small heads where the shape does not matter: lavapipe compiles each kernel for seconds.
"""
from __future__ import annotations

import numpy as np
import pytest

from kvviz.errors import DeviceLimitError, InvalidInput, UnsupportedShape
from kvviz.families.fp4 import format as f4
from kvviz.families.fp4 import decode as ffd
from kvviz.attention import records as qk
from kvviz.methods import reference
from kvviz.methods.base import get_method
from kvviz.methods.records import DequantisedAttention
from kvviz.families.fp4 import oracle as o4
from kvviz.attention import paged_oracle as O
from kvviz.paging import PAD_SLOT, make_batch

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def fast(rt):
    return ffd.Fp4FastDecode(rt)


def quantised(ctx, D, bs, kvh, lens, *, seed=0, k_amp=1.0, v_amp=1.0, zeros=False, words=True):
    """(method, qkv, batch, float64 dequantised caches {"K", "V"}, max |V^|) over the method's own cache."""
    rng = np.random.default_rng(seed)
    m = get_method("nvfp4")
    batch = make_batch(lens, bs, policy="scattered", seed=seed)
    T = int(sum(lens))
    if zeros:
        k = np.zeros((T, kvh, D), np.float32)
        v = k.copy()
    else:
        k = (rng.standard_normal((T, kvh, D)) * k_amp).astype(np.float32)
        v = (rng.standard_normal((T, kvh, D)) * v_amp).astype(np.float32)
    qkv = m.quantize(ctx, batch, k, v)
    qc = qkv.device["cache"]
    st = m.tensor_scales(ctx, qkv)
    wpt = f4.words_per_token(D)
    if words:
        ref = o4.quantize_batch(k, v, batch.slot_mapping)
        assert st == tuple(float(s) for s in ref[2])
    sm = batch.slot_mapping.astype(np.int64)
    real = sm != PAD_SLOT
    caches = {}
    for i, which in enumerate(("K", "V")):
        full = qk.read_cache(ctx.rt, qc, which).reshape(batch.num_blocks, kvh, bs, wpt)
        if words:  # the words of every token are the oracle's
            np.testing.assert_array_equal(full[sm[real] // bs, :, sm[real] % bs], ref[i][real])
        deq = o4.dequantize(*f4.unpack_records(full, D), np.float32(st[i]))  # the method's dequantiser's values
        caches[which] = deq.astype(np.float64)
    rows = np.zeros(batch.num_blocks * bs, bool)
    rows[sm[real]] = True
    vmax = float(np.abs(caches["V"].reshape(-1, kvh, D)[rows]).max(initial=0.0))
    return m, qkv, batch, caches, vmax


def check(ctx, fast, D, bs, kvh, G, lens, *, seed=0, q_amp=1.0, k_amp=1.0, v_amp=1.0, zeros=False, words=True, **kw):
    """Quantise with the method, decode with the fast kernel, compare with the oracle over the words read back.
    Returns (plan, output, max error / tolerance)."""
    m, qkv, batch, caches, vmax = quantised(ctx, D, bs, kvh, lens, seed=seed, k_amp=k_amp, v_amp=v_amp,
                                            zeros=zeros, words=words)
    rng = np.random.default_rng(seed + 1)
    q = (rng.standard_normal((len(lens), kvh * G, D)) * q_amp).astype(np.float32)
    scale = D ** -0.5
    ref = O.decode(q.astype(np.float64), caches["K"], caches["V"], batch.block_tables, batch.context_lens, bs, scale)
    qc = qkv.device["cache"]
    plan = fast.plan(qc.k, qc.v, qc.extra["tensor"], kvh, q, batch, scale, **kw)
    ctx.rt.run(plan.dispatches)
    out = fast.read(plan)
    assert out.shape == (len(lens), kvh * G, D) and np.isfinite(out).all()
    for s, n in enumerate(lens):
        if n == 0:
            assert not out[s].any(), "an empty sequence must give 0"
    tol = ffd.tolerance(vmax)
    err = float(np.abs(out - ref).max(initial=0.0))
    assert err <= tol, f"nvfp4 D{D} bs{bs} G{G} kvh{kvh} lens {lens[:6]}: max error {err:.3g} > {tol:.3g} ({plan.describe()})"
    print(f"\n[fast nvfp4] D{D} bs{bs} G{G} kvh{kvh}: {err / tol:.2e} of the tolerance; {plan.describe()}")
    return plan, out, err / tol


RAGGED = [31, 33, 1, 0, 150]
GRID = [  # head size, block size, kv heads, G, lens
    (64, 16, 2, 1, RAGGED),  # 4 dims a lane (16 lanes) / 8 on lavapipe's subgroups
    (128, 32, 1, 4, [1, 31, 0, 33, 77]),  # 8 dims a lane
    (256, 1, 1, 1, [70, 33, 0, 1]),  # whole sub-blocks a lane; block size 1
    (16, 16, 2, 3, RAGGED),  # 4 dims a lane (4 lanes), GQA 3
    (80, 16, 1, 1, [40, 0, 1, 17]),  # a multiple of 16, not of 32: one lane a row (5 sub-blocks)
]


@pytest.mark.parametrize("D,bs,kvh,G,lens", GRID, ids=[f"D{d}-bs{bs}-kvh{h}-G{g}" for d, bs, h, g, _ in GRID])
def test_grid(ctx, fast, D, bs, kvh, G, lens):
    check(ctx, fast, D, bs, kvh, G, lens, seed=D + bs + G)


def test_gqa8_partitions(ctx, fast):
    """GQA 8, several partitions of a scattered table."""
    plan, _, _ = check(ctx, fast, 64, 32, 1, 8, [300, 33, 0, 1], seed=9, partition_tokens=64)
    assert plan.num_partitions == 5


def test_zeros_and_scale_range(ctx, fast):
    """All-zero keys and values (s_t at its 2^-126 floor, zero scales): exactly zero out. Values ~1e4 and
    ~1e-3 in one batch (E4M3 scales from their top to subnormals and 0: a sub-block far below the tensor's
    amax), and large amplitudes (s_t ~ 4e26)."""
    _, out, _ = check(ctx, fast, 64, 16, 2, 1, [40, 1, 33], zeros=True)
    assert not out.any()
    check(ctx, fast, 64, 16, 2, 1, [60, 33, 1], seed=11, k_amp=1e4, v_amp=1e4, q_amp=1e-4)
    check(ctx, fast, 64, 16, 1, 2, [50, 9], seed=12, k_amp=1e30, v_amp=1e30, q_amp=1e-30)


def test_mixed_magnitudes(ctx, fast):
    """Sub-blocks spanning E4M3's whole range: each token row scaled by 10^[-6, 0] (the smallest take
    subnormal or zero E4M3 scales)."""
    m = get_method("nvfp4")
    rng = np.random.default_rng(21)
    lens, D, kvh, G = [90, 17], 64, 1, 4
    batch = make_batch(lens, 16, policy="scattered", seed=21)
    T = sum(lens)
    amp = 10.0 ** rng.uniform(-6, 0, (T, kvh, D // 16, 1))
    k = (rng.standard_normal((T, kvh, D // 16, 16)) * amp).reshape(T, kvh, D).astype(np.float32)
    v = (rng.standard_normal((T, kvh, D // 16, 16)) * amp[::-1]).reshape(T, kvh, D).astype(np.float32)
    qkv = m.quantize(ctx, batch, k, v)
    sc = qkv.extra["k_fields"]["scale_bits"]
    assert (sc[batch.slot_mapping != PAD_SLOT] < 8).any(), "some E4M3 scales should be subnormal or zero"
    q = rng.standard_normal((2, kvh * G, D)).astype(np.float32) * 1e3
    out = m.attend(ctx, qkv, batch, q, 0.125)
    r, tol = reference("nvfp4")(m, batch, k, v, q, 0.125)
    assert np.abs(out - r).max() <= tol


def test_long_context(ctx, fast):
    """1 x 20000+ tokens: many partitions, each within lavapipe's loop budget."""
    plan, _, _ = check(ctx, fast, 64, 16, 1, 1, [20000 + 17], seed=5, words=False)
    assert plan.num_partitions > 4


def test_no_subgroups_variant(ctx, fast):
    """One lane a token row (whole sub-blocks), no shuffles: the fallback for adapters without subgroups."""
    assert fast.layout(128, 4, subgroups=False).lanes == 1
    check(ctx, fast, 32, 16, 2, 1, [5, 100, 0, 33], seed=4, subgroups=False)


def test_prefetch_bit_identical_and_scatter(ctx, fast):
    """Prefetch on / off: the same arithmetic, bit for bit; scatter on / off: each within the tolerance."""
    if fast.layout(64, 2).lanes < 2:
        pytest.skip("no subgroups: one lane a row, no scatter")
    args = (ctx, fast, 64, 16, 2, 2, [70, 33, 1, 0])
    _, a, _ = check(*args, seed=3, prefetch=True)
    _, b, _ = check(*args, seed=3, prefetch=False)
    np.testing.assert_array_equal(a, b)
    check(*args, seed=3, scatter=False)
    check(*args, seed=3, scatter=True, prefetch=False)


def test_refuses_bad_input(ctx, fast):
    m, qkv, batch, _, _ = quantised(ctx, 64, 16, 1, [64, 3], seed=1, words=False)
    qc = qkv.device["cache"]
    tb = qc.extra["tensor"]
    q = np.ones((2, 4, 64), np.float32)
    with pytest.raises(UnsupportedShape, match="GQA group of 17"):
        fast.plan(qc.k, qc.v, tb, 1, np.ones((2, 17, 64), np.float32), batch, 0.1)
    with pytest.raises(UnsupportedShape, match="multiple of 16"):
        fast.plan(qc.k, qc.v, tb, 1, np.ones((2, 4, 56), np.float32), batch, 0.1)
    with pytest.raises(UnsupportedShape, match="over 256"):
        fast.plan(qc.k, qc.v, tb, 1, np.ones((2, 4, 272), np.float32), batch, 0.1)
    with pytest.raises(InvalidInput):
        fast.plan(qc.k, qc.v, tb, 1, np.ones((3, 4, 64), np.float32), batch, 0.1)  # sequences
    with pytest.raises(InvalidInput):
        fast.plan(qc.k, qc.v, tb, 3, q, batch, 0.1)  # 4 heads over 3 KV heads
    with pytest.raises(InvalidInput):
        fast.plan(qc.k, qc.v, tb, 1, q, batch, float("nan"))
    with pytest.raises(InvalidInput):
        fast.plan(qc.k, qc.v, tb, 1, q.astype(np.float64) + np.nan, batch, 0.1)
    with pytest.raises(InvalidInput, match="tensor-scale"):
        fast.plan(qc.k, qc.v, None, 1, q, batch, 0.1)
    with pytest.raises(InvalidInput, match="unroll"):
        fast.plan(qc.k, qc.v, tb, 1, q, batch, 0.1, unroll=3)
    with pytest.raises(InvalidInput, match="partition_tokens"):
        fast.plan(qc.k, qc.v, tb, 1, q, batch, 0.1, partition_tokens=-4)
    small = ctx.rt.upload(np.zeros(16, np.uint32), "small")
    with pytest.raises(InvalidInput, match="cache holds"):
        fast.plan(small, qc.v, tb, 1, q, batch, 0.1)
    if ctx.rt.loop_limit is not None:  # one partition longer than lavapipe's loop budget
        with pytest.raises(DeviceLimitError, match="loop limit"):
            fast.plan(qc.k, qc.v, tb, 1, q, batch, 0.1, partition_tokens=64 * 1024 * 1024, rows=1)


def test_method_end_to_end(ctx):
    """NvFp4.attend runs the fast decode where it takes the shape (within the oracle's tolerance) and the
    first-wave path otherwise (GQA 17: the same output as dequantise + f32 decode); timed_kernels lists both."""
    m = get_method("nvfp4")
    rng = np.random.default_rng(2)
    lens, D, kvh, G = [45, 0, 17], 64, 2, 4
    batch = make_batch(lens, 16, policy="scattered", seed=2)
    k = rng.standard_normal((sum(lens), kvh, D)).astype(np.float32)
    v = rng.standard_normal((sum(lens), kvh, D)).astype(np.float32)
    q = rng.standard_normal((3, kvh * G, D)).astype(np.float32)
    qkv = m.quantize(ctx, batch, k, v)
    assert m._fast_plan(ctx, qkv.device["cache"], batch, q, 0.125) is not None
    out = m.attend(ctx, qkv, batch, q, 0.125)
    r, tol = reference("nvfp4")(m, batch, k, v, q, 0.125)
    assert np.abs(out - r).max() <= tol
    first = DequantisedAttention.attend(m, ctx, qkv, batch, q, 0.125)
    assert np.abs(first - r).max() <= tol
    rows = m.timed_kernels(ctx, batch, k, v, q, 0.125, qkv)
    names = [r.name for r in rows]
    fast_rows = [r for r in rows if r.name.startswith("fast_decode_nvfp4 (")]
    assert len(fast_rows) == 1 and fast_rows[0].impl == "fast" and fast_rows[0].role == "decode", names
    assert fast_rows[0].bytes > 0 and fast_rows[0].flops > 0
    assert any(r.name == "paged_attn_f32 (over the dequantised cache)" and r.impl == "first-wave" for r in rows), names
    assert any(r.role == "dequantise" for r in rows), names
    ctx.rt.run(fast_rows[0].dispatches)
    # a shape the fast decode refuses (GQA 17 > 16) keeps the first-wave path
    q17 = rng.standard_normal((3, 17, D)).astype(np.float32)
    m1, qkv1, batch1, _, _ = quantised(ctx, D, 16, 1, lens, seed=3, words=False)
    assert m1._fast_plan(ctx, qkv1.device["cache"], batch1, q17, 0.125) is None
    out17 = m1.attend(ctx, qkv1, batch1, q17, 0.125)
    assert out17.shape == (3, 17, D) and np.isfinite(out17).all()
    np.testing.assert_array_equal(out17, DequantisedAttention.attend(m1, ctx, qkv1, batch1, q17, 0.125))
