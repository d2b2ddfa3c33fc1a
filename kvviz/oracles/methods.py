"""End-to-end numpy references of the registered methods, one function each (a method names its own in
`REFERENCE = "kvviz.oracles.methods:<function>"`, or points at a module of its own): quantise with the
method's oracle, then attend in float64 the way the method's GPU path does. `kvviz bench` holds each method's GPU output
to it; the per-family conformance tests check the intermediate words and caches exactly.

Tolerances (and why):
  dequantise + f32 decode methods: |gpu - ref| <= 2e-5 * max(1, max|V^|): the f32 decode
      accumulates in float32 against a float64 reference (the f32 kernels' conformance tolerance).
  turboquant (seed flash kernel): |gpu - ref| <= 1e-5 + 1e-4 * max|ref|: online softmax in float32
      over the estimator, against the float64 estimator (tests/test_turboquant.py).
"""
from __future__ import annotations

import numpy as np

from kvviz.oracles import paged as op
from kvviz.paging import PAD_SLOT


def _scatter(batch, per_row: np.ndarray) -> np.ndarray:
    """[tokens, kvh, D] values in token-row order -> paged [num_blocks, kvh, block_size, D] float64."""
    T, kvh, D = per_row.shape
    out = np.zeros((batch.num_blocks, kvh, batch.block_size, D), np.float64)
    sm = batch.slot_mapping.astype(np.int64)
    real = sm != PAD_SLOT
    out[sm[real] // batch.block_size, :, sm[real] % batch.block_size] = per_row[real]
    return out


def _per_token_caches(batch, key, value, dequantise):
    """(K, V) paged float64 caches from a per-row dequantiser [tokens, kvh, D] -> [tokens, kvh, D]."""
    return tuple(_scatter(batch, np.asarray(dequantise(x), np.float64)) for x in (key, value))


def _through_f32_decode(batch, q, scale, fk, fv):
    """Attention over dequantised caches, the way the f32 paged decode runs it, and its tolerance."""
    ref = op.decode(q, fk, fv, batch.block_tables, batch.context_lens, batch.block_size, scale)
    return ref, 2e-5 * max(1.0, float(np.abs(fv).max(initial=0)))


def int8_seed_attention(method, batch, key, value, q, scale, qkv=None):
    """The seed int8 writer's cache, attended by the seed decode."""
    shape = (batch.num_blocks, key.shape[1], batch.block_size, key.shape[2] // 4 + 1)
    k = op.write_cache_int8(np.zeros(shape, np.uint32), key, batch.slot_mapping, batch.block_size)
    v = op.write_cache_int8(np.zeros(shape, np.uint32), value, batch.slot_mapping, batch.block_size)
    return _through_f32_decode(batch, q, scale, op.dequantize_cache_int8(k), op.dequantize_cache_int8(v))


def int8_token_attention(method, batch, key, value, q, scale, qkv=None):
    from kvviz.oracles import int8 as o8

    fk, fv = _per_token_caches(batch, key, value, lambda x: o8.dequantize(*o8.quantize(x)))
    return _through_f32_decode(batch, q, scale, fk, fv)


def int4_group_attention(method, batch, key, value, q, scale, qkv=None):
    from kvviz.oracles import int4 as o4

    G = method.group_size
    fk, fv = _per_token_caches(batch, key, value, lambda x: o4.dequantize_groups(*o4.quantize_groups(x, G), G))
    return _through_f32_decode(batch, q, scale, fk, fv)


def fp8_attention(method, batch, key, value, q, scale, qkv=None):
    from kvviz.oracles import fp8 as of8

    def deq(x):
        codes, scales = of8.quantize(x, method.fmt, method.scale_mode, batch.slot_mapping)
        return of8.dequantize(codes, scales, method.fmt)

    fk, fv = _per_token_caches(batch, key, value, deq)
    return _through_f32_decode(batch, q, scale, fk, fv)


def kivi_attention(method, batch, key, value, q, scale, qkv=None):
    from kvviz.oracles import kivi as okv

    ref = okv.write_buffers(batch, key, value, method.bits, method.recent)
    fk, fv = okv.dequantize_cache(batch, key, value, method.bits, method.recent, ref["per_seq"])
    return _through_f32_decode(batch, q, scale, fk.astype(np.float64), fv.astype(np.float64))


def turboquant_attention(method, batch, key, value, q, scale, qkv=None):
    """The seed flash kernel's estimator in float64, per sequence.

    With `qkv` (the GPU's QuantizedKV) the estimator runs over the words the GPU compressor wrote. Its
    2-bit index can legitimately flip where a rotated coordinate sits within float rounding of a
    centroid boundary (about 1e-6 of coordinates on an H200), which moves a score by more than the
    attention tolerance; the compressor's words are held to the oracle, with that allowance, in
    tests/test_turboquant.py.
    """
    from kvviz.oracles import turboquant as tqo

    p = method.params(key.shape[2])
    S, H, D = q.shape
    out = np.zeros((S, H, D), np.float64)
    words = qkv.extra["words"] if qkv is not None else None
    for s in range(batch.num_seqs):
        rows = batch.token_rows(s)
        L = len(rows)
        if L == 0:
            continue
        if words is not None:
            kc, vc = words[s]
        else:
            kc, vc = tqo.compress_cache(key[rows], value[rows], max(L, 1), p)
        o = tqo.attention_oracle(q[s][None], kc, vc, key.shape[1], max(L, 1), L - 1, L, scale, p, method.qjl_scale)
        out[s] = np.asarray(o).reshape(H, D)
    return out, 1e-5 + 1e-4 * float(np.abs(out).max(initial=0))


def reference_attention(method, batch, key, value, q, scale, qkv=None):
    """(output [S, H, D], tolerance) of any registered method: the function its REFERENCE names."""
    from kvviz.methods import reference

    return reference(method.id)(method, batch, key, value, q, scale, qkv)
