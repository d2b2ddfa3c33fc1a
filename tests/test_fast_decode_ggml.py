"""The fast split-K ggml decode (kvviz/families/ggml/decode.py) through the methods: attend and the timed
rows, the shapes it leaves to the first-wave path, and the prefetching kernel bit for bit. The scenarios every fast
decode shares (every type over heads 32..256, block sizes 8..32, GQA 1..8, ragged and scattered; zeros and values
near the f16 limit; a 20000+ token context; the softmax variants; no subgroups; bad input) are in
tests/test_conformance.py, the oracle check in tests/harness.py (_ggml_check: gguf's bytes, gguf.quants.dequantize
through the f32 paged decode's arithmetic in float64, tolerance 2e-5 * max(1, max |V^|)).
"""
from __future__ import annotations

import numpy as np
import pytest

from kvviz.families.ggml import decode as fgd
from kvviz.families.registry import get_method
from kvviz.families.ggml import oracle as og
from kvviz.paging import make_batch

from harness import DECODES

pytestmark = pytest.mark.gpu

TYPES = fgd.TYPES


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
    """A GQA group of 32 query heads per KV head (the fast decodes take 1..16): the method's attend keeps the
    dequantise + f32 decode, and its timed rows have no fast decode. Head size 96, which no power-of-two lane split
    divides inside 32-element blocks, takes the fast decode (its lanes walk the head with padding)."""
    rng = np.random.default_rng(3)
    m = get_method("q4_0")
    D, lens = 96, [40, 0, 9]
    batch = make_batch(lens, 16, policy="scattered", seed=1)
    k = rng.standard_normal((sum(lens), 1, D)).astype(np.float32)
    qkv = m.quantize(ctx, batch, k, k)
    q = rng.standard_normal((len(lens), 2, D)).astype(np.float32)
    assert m._fast_plan(ctx, qkv.device["cache"], batch, q, D ** -0.5) is not None
    q = rng.standard_normal((len(lens), 32, D)).astype(np.float32)
    assert m._fast_plan(ctx, qkv.device["cache"], batch, q, D ** -0.5) is None
    ref, tol = og.reference_attention(m, batch, k, k, q, D ** -0.5)
    assert float(np.abs(m.attend(ctx, qkv, batch, q, D ** -0.5) - ref).max()) <= tol
    assert not [r for r in m.timed_kernels(ctx, batch, k, k, q, D ** -0.5, qkv) if r.impl == "fast" and r.role == "decode"]


@pytest.mark.parametrize("tname", TYPES)
def test_prefetch_bit_identical(ctx, tname):
    """The software-pipelined split (next step's block-table reads and words loaded before this step's
    arithmetic) does the same arithmetic: bit for bit the single-buffered kernel's output, over ragged
    lengths with an empty and a single-token sequence and partitions past a sequence's end."""
    lens = [33, 0, 150, 1]
    case = dict(D=64, bs=8, kvh=2, G=2, lens=lens, seed=3, words=False, partition_tokens=32)
    a = DECODES[tname].check(ctx, prefetch=True, **case).out
    b = DECODES[tname].check(ctx, prefetch=False, **case).out
    np.testing.assert_array_equal(a, b)

