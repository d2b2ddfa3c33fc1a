"""The fast split-K NVFP4 decode (kvviz/families/fp4/decode.py): sub-blocks over E4M3's whole scale range,
the prefetching kernel bit for bit, and the method end to end (attend, timed rows, the first-wave path where the
shape is refused). The caches are the method's own, held bit for bit to kvviz.families.fp4.oracle.quantize_batch and the
decode to the method's attention oracle over those words (tests/harness.py nvfp4_check, tolerance
2e-5 * max(1, max |V^|)). The scenarios every fast decode shares (heads 16..256 and 80, GQA 1..8, block sizes
1..32, ragged and scattered; zeros and the E4M3 scale range; a 20000+ token context; the softmax variants; no
subgroups; bad input) are in tests/test_conformance.py.
"""
from __future__ import annotations

import numpy as np
import pytest

from kvviz.families.registry import get_method, reference
from kvviz.methods.records import DequantisedAttention
from kvviz.paging import PAD_SLOT
from kvviz.paging import make_batch

import harness

pytestmark = pytest.mark.gpu


def test_mixed_magnitudes(ctx):
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


def test_prefetch_bit_identical(ctx):
    """Prefetch on / off: the same arithmetic, bit for bit (each within the tolerance of the oracle)."""
    case = dict(D=64, bs=16, kvh=2, G=2, lens=[70, 33, 1, 0], seed=3)
    a = harness.nvfp4_check(ctx, prefetch=True, **case).out
    b = harness.nvfp4_check(ctx, prefetch=False, **case).out
    np.testing.assert_array_equal(a, b)


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
    m1, qkv1, batch1, _, _ = harness.nvfp4_quantised(ctx, D, 16, 1, lens, seed=3, words=False)
    assert m1._fast_plan(ctx, qkv1.device["cache"], batch1, q17, 0.125) is None
    out17 = m1.attend(ctx, qkv1, batch1, q17, 0.125)
    assert out17.shape == (3, 17, D) and np.isfinite(out17).all()
    np.testing.assert_array_equal(out17, DequantisedAttention.attend(m1, ctx, qkv1, batch1, q17, 0.125))
