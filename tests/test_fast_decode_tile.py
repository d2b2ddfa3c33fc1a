"""Conformance of the tile fast decode (kvviz/kernels/fast_decode_tile.py) for the caches of 4 codes a word.

The caches are built record by record in numpy (tests/test_fast_decode.py's builders) and the oracle
dequantises the same words (kvviz/oracles/paged.decode, float64). Tolerance: the f32 paged kernels',
2e-5 x max(1, max |V|) (f32 sums in another order, exp2 for exp). Shapes: head sizes 64, 128 and 256, MHA to
GQA 16, block sizes 8..32, ragged and scattered lengths with empty and single-token sequences, partitions
of one and of many chunks, a partition past a sequence's end, ties, large logits and values, long contexts.
"""
from __future__ import annotations

import numpy as np
import pytest

from kvviz.errors import InvalidInput, UnsupportedShape
from kvviz.kernels import fast_decode as fd
from kvviz.kernels import fast_decode_tile as ft
from kvviz.oracles import paged as O
from kvviz.paging import make_batch
from tests.test_fast_decode import build_caches

pytestmark = pytest.mark.gpu

FORMATS = [fd.INT8, fd.fp8_format("e4m3", False), fd.fp8_format("e5m2", False), fd.fp8_format("e4m3", True)]


def run_tile(rt, fmt, lens, H, kvh, D, bs, *, seed=0, amp=1.0, q_amp=1.0, policy="scattered", tensor=(0.02, 0.5), **kw):
    rng = np.random.default_rng(seed)
    batch = make_batch(lens, bs, policy=policy, seed=seed)
    (kw_, kf), (vw_, vf) = build_caches(fmt, rng, batch, kvh, D, amp, tensor if fmt.scale == "tensor" else (1.0, 1.0))
    q = (rng.standard_normal((len(lens), H, D)) * q_amp).astype(np.float32)
    scale = 1.0 / np.sqrt(D)
    tb = None
    if fmt.scale == "tensor":
        tb = rt.upload(np.array([0.0, 0.0, *tensor], np.float32).view(np.uint32), "tensor")
    tile = ft.TileDecode(fd.FastDecode(rt))
    out = tile.decode(fmt, rt.upload(kw_, "k"), rt.upload(vw_, "v"), kvh, q, batch, scale, tensor=tb, **kw)
    ref = O.decode(q, kf, vf, batch.block_tables, batch.context_lens, bs, scale)
    tol = 2e-5 * max(1.0, float(np.abs(vf).max()))
    err = float(np.abs(out - ref).max(initial=0.0))
    assert np.isfinite(out).all()
    assert err <= tol, f"{fmt.name} D{D} H{H}/{kvh} bs{bs} lens {lens[:6]}: max error {err:.3g} > {tol:.3g}"
    return out, ref


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f"{f.name}-{f.scale}")
def test_every_format_ragged_gqa(rt, fmt):
    """GQA 4, head 128, block 16, ragged + scattered with an empty and a single-token sequence."""
    run_tile(rt, fmt, [37, 100, 0, 300, 1, 129], 8, 2, 128, 16)


@pytest.mark.parametrize("D,H,kvh,bs", [(64, 4, 4, 8), (128, 16, 1, 32), (256, 4, 2, 16), (64, 8, 8, 16)])
def test_head_sizes_and_groups(rt, D, H, kvh, bs):
    run_tile(rt, fd.INT8, [1, 17, 64, 200, 0], H, kvh, D, bs, seed=D + H)


@pytest.mark.parametrize("unroll_a,unroll_c,lanes", [(1, 1, 2), (4, 8, 4), (2, 4, 16)])
def test_unrolls_and_lanes(rt, unroll_a, unroll_c, lanes):
    """Every phase-A / phase-C unroll and lane count, with partitions of 128 tokens (many chunks, ragged
    tails, a partition past a sequence's end)."""
    run_tile(rt, fd.INT8, [130, 1, 511, 0, 257], 8, 2, 128, 16, partition_tokens=128, unroll_a=unroll_a,
             unroll_c=unroll_c, lanes=lanes)


def test_int8_conversion_paths_agree(rt):
    """The 2^23 mantissa conversion and unpack4xI8 give the same bits."""
    a, _ = run_tile(rt, fd.INT8, [77, 300], 8, 2, 128, 16, magic=True)
    b, _ = run_tile(rt, fd.INT8, [77, 300], 8, 2, 128, 16, magic=False)
    assert np.array_equal(a, b)


def test_same_as_split_kernel_within_tolerance(rt):
    """The tile and split kernels agree on one cache (both against the oracle, and with each other)."""
    a, ref = run_tile(rt, fd.INT8, [700, 33, 2048], 8, 2, 128, 16)
    from tests.test_fast_decode import run_case

    b, _, _ = run_case(rt, fd.INT8, [700, 33, 2048], 8, 2, 128, 16)
    assert np.abs(a - b).max() <= 2e-5 * max(1.0, float(np.abs(ref).max()))


def test_large_logits_and_ties(rt):
    """Logits far outside exp's range in base e (q large), and every key equal (exact ties: the mean of V)."""
    run_tile(rt, fd.INT8, [50, 513], 8, 2, 128, 16, amp=4.0, q_amp=40.0)
    rng = np.random.default_rng(3)
    D, kvh, H, bs = 64, 1, 4, 8
    batch = make_batch([77, 1000], bs, policy="scattered", seed=2)
    nb = batch.num_blocks
    rec = np.concatenate([rng.integers(-128, 128, D, dtype=np.int8).view(np.uint32), np.float32([0.01]).view(np.uint32)])
    key = np.broadcast_to(rec, (nb, kvh, bs, D // 4 + 1)).copy()
    (vw, vf), = build_caches(fd.INT8, rng, batch, kvh, D, tensor_scales=(1.0,))
    q = rng.standard_normal((2, H, D)).astype(np.float32)
    out = ft.TileDecode(fd.FastDecode(rt)).decode(fd.INT8, rt.upload(key, "k"), rt.upload(vw, "v"), kvh, q, batch, 0.125)
    for s, n in enumerate(batch.context_lens):
        rows = [batch.slot(s, t) for t in range(int(n))]
        mean = vf.reshape(-1, kvh, D)[rows, 0].mean(0)
        assert np.abs(out[s] - mean).max() < 1e-5


@pytest.mark.slow
def test_long_context(rt):
    """40000 tokens in one sequence: many partitions, within a software rasteriser's loop budget."""
    run_tile(rt, fd.INT8, [40000], 8, 2, 128, 16, policy="contiguous")


def test_refusals(rt):
    tile = ft.TileDecode(fd.FastDecode(rt))
    batch = make_batch([10], 16)
    k = rt.upload(np.zeros(16 * 2 * 33, np.uint32), "k")
    with pytest.raises(UnsupportedShape, match="4 codes a word"):
        tile.decode(fd.F16, k, k, 2, np.zeros((1, 8, 128), np.float32), batch, 0.1)
    with pytest.raises(UnsupportedShape, match="power of two"):
        tile.decode(fd.INT8, k, k, 2, np.zeros((1, 8, 96), np.float32), batch, 0.1)
    with pytest.raises(InvalidInput, match="NaN|finite"):
        tile.decode(fd.INT8, k, k, 2, np.full((1, 8, 128), np.nan, np.float32), batch, 0.1)
    with pytest.raises(InvalidInput, match="exceed"):
        tile.decode(fd.INT8, k, k, 2, np.zeros((1, 8, 128), np.float32), batch, 0.1, partition_tokens=1 << 16)
    assert ft.unsupported(fd.INT8, 128, 4) == "" and ft.unsupported(fd.INT8, 128, 17)
