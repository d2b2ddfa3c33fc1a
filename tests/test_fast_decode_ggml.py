"""Conformance of the fast split-K ggml decode (kvviz/families/ggml/decode.py) on the local adapter.

The caches are written by the method itself (GgmlBlockMethod.quantize: the GPU writer) and read back; the
words read back must equal the method's oracle's (kvviz.families.ggml.oracle.quantize: gguf's codes, byte for byte),
and the reference is the method's attention oracle over those words: gguf.quants.dequantize
(kvviz.families.ggml.oracle.dequantize) through the f32 paged decode's arithmetic in float64 (kvviz.attention.paged_oracle).

Tolerance: |fast - oracle| <= 2e-5 * max(1, max |V^|), V^ = the dequantised values (fast_decode_ggml.tolerance,
the f32 fast decodes' bound): f32 accumulation in another order, exp2 for exp, the block scale folded into
the dot / the weight.
Grid: head sizes 32 (4 dims a lane), 64, 128, 256 (whole blocks a lane); block sizes 8, 16, 32; GQA 1, 4, 8
(8 at head 128 only: GQA 8 at head 256 compiled in ~25 s on lavapipe, and it passed);
ragged lengths with 0, 1, 31, 33; scattered block tables; zeros; values ~1e4 (and near q8_0's f16 limit);
a 20000+ token context; the one-lane variant without subgroups; the method's attend / timed rows. Few distinct
kernels on purpose: lavapipe compiles each one for seconds.
"""
from __future__ import annotations

import numpy as np
import pytest

from kvviz.errors import DeviceLimitError, InvalidInput, UnsupportedShape
from kvviz.families.ggml import decode as fgd
from kvviz.methods.base import get_method
from kvviz.families.ggml import oracle as og
from kvviz.attention import paged_oracle as O
from kvviz.paging import make_batch

pytestmark = pytest.mark.gpu

TYPES = fgd.TYPES


@pytest.fixture(scope="module")
def fast(rt):
    return fgd.GgmlFastDecode(rt)


def check(ctx, fast, tname, D, bs, kvh, G, lens, *, seed=0, k_amp=1.0, v_amp=1.0, q_amp=1.0, zeros=False,
          words=True, **kw):
    """Quantise with the method, decode with the fast kernel, compare with the oracle over the words read back.
    Returns (plan, output, max error / tolerance)."""
    rng = np.random.default_rng(seed)
    m = get_method(tname)
    t = m.fmt
    batch = make_batch(lens, bs, policy="scattered", seed=seed)
    T = int(sum(lens))
    if zeros:
        k = np.zeros((T, kvh, D), np.float32)
        v = k.copy()
    else:
        k = (rng.standard_normal((T, kvh, D)) * k_amp).astype(np.float32)
        v = (rng.standard_normal((T, kvh, D)) * v_amp).astype(np.float32)
    H = kvh * G
    q = (rng.standard_normal((len(lens), H, D)) * q_amp).astype(np.float32)
    scale = D ** -0.5
    qkv = m.quantize(ctx, batch, k, v)
    qc = qkv.device["cache"]
    wpt = t.words_per_token(D)
    caches = {}
    for which, x in (("K", k), ("V", v)):
        from kvviz.attention import records as qk
        full = qk.read_cache(ctx.rt, qc, which).reshape(batch.num_blocks, kvh, bs, wpt)
        if words:  # the words of every token are the oracle's (gguf's bytes)
            recs = full[batch.slot_mapping // bs, :, batch.slot_mapping % bs]
            np.testing.assert_array_equal(recs, og.quantize(x, t))
        deq = og.dequantize(full, D, t)  # gguf.quants.dequantize of every record read back
        caches[which] = deq.astype(np.float64)
    ref = O.decode(q.astype(np.float64), caches["K"], caches["V"], batch.block_tables, batch.context_lens, bs, scale)
    plan = fast.plan(tname, qc.k, qc.v, kvh, q, batch, scale, **kw)
    ctx.rt.run(plan.dispatches)
    out = fast.read(plan)
    assert out.shape == (len(lens), H, D) and np.isfinite(out).all()
    real = np.zeros(batch.num_blocks * bs, bool)
    real[batch.slot_mapping] = True
    vmax = float(np.abs(caches["V"].reshape(-1, kvh, D)[real]).max(initial=0.0))
    tol = fgd.tolerance(vmax)
    err = float(np.abs(out - ref).max(initial=0.0))
    for s, n in enumerate(lens):
        if n == 0:
            assert not out[s].any(), "an empty sequence must give 0"
    assert err <= tol, (f"{tname} D{D} bs{bs} G{G} kvh{kvh} lens {lens[:6]}: max error {err:.3g} > {tol:.3g} "
                        f"({plan.describe()})")
    print(f"\n[fast ggml] {tname} D{D} bs{bs} G{G} kvh{kvh}: {err / tol:.2e} of the tolerance; {plan.describe()}")
    return plan, out, err / tol


RAGGED = [31, 33, 1, 0, 150]
GRID = [  # head size, block size, kv heads, G, lens: every type
    (128, 16, 2, 1, RAGGED),  # 16 dims a lane (8 lanes on lavapipe)
    (64, 8, 1, 4, [1, 31, 0, 33, 77]),
    (256, 32, 2, 1, [70, 33, 0, 1]),  # whole blocks a lane
    (32, 16, 2, 1, RAGGED),  # 4 dims a lane
]


@pytest.mark.parametrize("tname", TYPES)
@pytest.mark.parametrize("D,bs,kvh,G,lens", GRID, ids=[f"D{d}-bs{bs}-kvh{h}-G{g}" for d, bs, h, g, _ in GRID])
def test_grid(ctx, fast, tname, D, bs, kvh, G, lens):
    check(ctx, fast, tname, D, bs, kvh, G, lens, seed=D + bs + G)


@pytest.mark.parametrize("tname", ["q8_0", "q5_1"])
def test_gqa8(ctx, fast, tname):
    """GQA 8 (head size 128: lavapipe is slow to compile GQA 8 at 256), several partitions."""
    plan, _, _ = check(ctx, fast, tname, 128, 32, 1, 8, [300, 33, 0, 1], seed=9, partition_tokens=64)
    assert plan.num_partitions == 5


@pytest.mark.parametrize("tname", TYPES)
def test_zeros_and_large(ctx, fast, tname):
    """All-zero keys and values (zero-scale blocks): exactly zero out; values ~1e4 (logits of order one)."""
    _, out, _ = check(ctx, fast, tname, 128, 16, 2, 1, [40, 1, 33], zeros=True, words=False)
    assert not out.any()
    check(ctx, fast, tname, 128, 16, 2, 1, [60, 33, 1], seed=11, k_amp=1e4, v_amp=1e4, q_amp=1e-4)


def test_near_f16_limit(ctx, fast):
    """q8_0 blocks whose f16 scale is near its limit (|x| ~ 6e6: d ~ 5e4 of 65504)."""
    check(ctx, fast, "q8_0", 64, 16, 1, 1, [40, 7], seed=12, k_amp=1e6, v_amp=2e6, q_amp=1e-6)


def test_long_context(ctx, fast):
    """20000+ tokens: many partitions, each within lavapipe's loop budget."""
    plan, _, _ = check(ctx, fast, "q8_0", 128, 16, 2, 1, [20000 + 17, 45], seed=5, words=False)
    assert plan.num_partitions > 4


def test_no_subgroups_variant(ctx, fast):
    """One lane a token row (whole blocks), no shuffles: the fallback for adapters without subgroups."""
    assert fast.layout(128, 4, subgroups=False).lanes == 1
    check(ctx, fast, "q8_0", 32, 16, 2, 1, [5, 100, 0, 33], seed=4, subgroups=False)


def test_refuses_bad_input(ctx, fast, rt):
    m = get_method("q8_0")
    batch = make_batch([64, 3], 16, seed=1)
    k = np.ones((67, 1, 64), np.float32)
    qkv = m.quantize(ctx, batch, k, k)
    qc = qkv.device["cache"]
    q = np.ones((2, 4, 64), np.float32)
    with pytest.raises(UnsupportedShape, match="no fast decode"):
        fast.plan("q2_k", qc.k, qc.v, 1, q, batch, 0.1)
    with pytest.raises(UnsupportedShape, match="GQA group of 17"):
        fast.plan("q8_0", qc.k, qc.v, 1, np.ones((2, 17, 64), np.float32), batch, 0.1)
    with pytest.raises(UnsupportedShape, match="multiple of 32"):
        fast.plan("q8_0", qc.k, qc.v, 1, np.ones((2, 4, 48), np.float32), batch, 0.1)
    with pytest.raises(UnsupportedShape, match="over 256"):
        fast.plan("q8_0", qc.k, qc.v, 1, np.ones((2, 4, 288), np.float32), batch, 0.1)
    assert "no power-of-two lane split" in fgd.unsupported("q8_0", 96, 1) and not fgd.unsupported("q8_0", 32, 1)
    with pytest.raises(InvalidInput, match="sequences"):
        fast.plan("q8_0", qc.k, qc.v, 1, np.ones((3, 4, 64), np.float32), batch, 0.1)
    with pytest.raises(InvalidInput, match="scale"):
        fast.plan("q8_0", qc.k, qc.v, 1, q, batch, float("nan"))
    with pytest.raises(InvalidInput, match="need"):
        fast.plan("q8_0", rt.empty(64, "tiny"), qc.v, 1, q, batch, 0.1)
    if rt.loop_limit is not None:
        with pytest.raises(DeviceLimitError, match="loop limit"):
            fast.plan("q8_0", qc.k, qc.v, 1, q, batch, 0.1, partition_tokens=64 * 1024 * 1024, subgroups=False, rows=1)


@pytest.mark.parametrize("tname", TYPES)
def test_method_attend_and_timed_rows(ctx, tname):
    """The method's attend runs the fast decode and agrees with its end-to-end oracle; timed_kernels lists the
    fast decode beside the dequantise + f32 decode, and decode_time picks it."""
    from kvviz.gpu.timed import decode_kernels

    rng = np.random.default_rng(21)
    m = get_method(tname)
    D, lens = 64, [90, 33, 0, 1]
    batch = make_batch(lens, 8, policy="scattered", seed=2)
    k = rng.standard_normal((sum(lens), 2, D)).astype(np.float32)
    v = rng.standard_normal((sum(lens), 2, D)).astype(np.float32)
    q = rng.standard_normal((len(lens), 8, D)).astype(np.float32)
    qkv = m.quantize(ctx, batch, k, v)
    out = m.attend(ctx, qkv, batch, q, D ** -0.5)
    ref, tol = og.reference_attention(m, batch, k, v, q, D ** -0.5)
    assert float(np.abs(out - ref).max()) <= tol
    rows = m.timed_kernels(ctx, batch, k, v, q, D ** -0.5, qkv)
    names = [r.name for r in rows]
    assert any(n.startswith("paged_attn_f32") for n in names) and f"{tname} dequantise" in names
    fast_rows = [r for r in rows if r.impl == "fast" and r.role == "decode"]
    assert len(fast_rows) == 1 and fast_rows[0].name.startswith(f"fast_decode_{tname} (")
    assert fast_rows[0].bytes > 0 and fast_rows[0].flops > 0
    pick, deq, impl = decode_kernels(rows)
    assert pick == fast_rows and deq == [] and impl == "fast"
    ctx.rt.run(fast_rows[0].dispatches)
    got = ctx.rt.read(fast_rows[0].dispatches[-1].buffers[-1], np.float32, out.shape)
    np.testing.assert_array_equal(got, out)


def test_method_keeps_first_wave_where_it_cannot(ctx):
    """Head size 96 (no lane split inside blocks): the method's attend keeps the dequantise + f32 decode, and
    its timed rows have no fast decode."""
    rng = np.random.default_rng(3)
    m = get_method("q4_0")
    D, lens = 96, [40, 0, 9]
    batch = make_batch(lens, 16, policy="scattered", seed=1)
    k = rng.standard_normal((sum(lens), 1, D)).astype(np.float32)
    q = rng.standard_normal((len(lens), 2, D)).astype(np.float32)
    qkv = m.quantize(ctx, batch, k, k)
    assert m._fast_plan(ctx, qkv.device["cache"], batch, q, D ** -0.5) is None
    ref, tol = og.reference_attention(m, batch, k, k, q, D ** -0.5)
    assert float(np.abs(m.attend(ctx, qkv, batch, q, D ** -0.5) - ref).max()) <= tol
    assert not [r for r in m.timed_kernels(ctx, batch, k, k, q, D ** -0.5, qkv) if r.impl == "fast" and r.role == "decode"]


@pytest.mark.parametrize("tname", TYPES)
def test_prefetch_bit_identical(ctx, fast, tname):
    """The software-pipelined split (next step's block-table reads and words loaded before this step's
    arithmetic) does the same arithmetic: bit for bit the single-buffered kernel's output, over ragged
    lengths with an empty and a single-token sequence and partitions past a sequence's end."""
    lens = [33, 0, 150, 1]
    _, a, _ = check(ctx, fast, tname, 64, 8, 2, 2, lens, seed=3, words=False, prefetch=True, partition_tokens=32)
    _, b, _ = check(ctx, fast, tname, 64, 8, 2, 2, lens, seed=3, words=False, prefetch=False, partition_tokens=32)
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("tname", ["q8_0", "q4_1", "q5_0", "mxfp4"])
@pytest.mark.parametrize("kvh,G,unroll", [(2, 3, 2), (1, 4, 4), (2, 1, 1)])
def test_scatter_and_all_lane_softmax(ctx, fast, tname, kvh, G, unroll):
    """fast_decode's reduce-scatter softmax (the default) and the all-lane one, each against the oracle: GQA 3
    (G x U padded to a power of two), 4 and 1, 1 to 4 tokens a row per step, types with and without a min and
    with per-block V scales that differ between a row's lanes (the owners broadcast p, each lane scales)."""
    lens = [33, 0, 150, 1]
    for scatter in (True, False):
        check(ctx, fast, tname, 64, 8, kvh, G, lens, seed=5, words=False, q_amp=3.0, unroll=unroll,
              partition_tokens=64, scatter=scatter)
