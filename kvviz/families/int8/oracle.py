"""numpy oracle of the `int8_token` paged cache (the seed WGSL quantiser's
per-token int8, made valid; docs/kernels.md, "Seed WGSL quantiser").

Per token and KV head, over the head vector x (float32):
    amax  = max |x|
    scale = max(amax / 127, 1e-8)                (float32 division, float32 constant 1e-8)
    code  = clamp(round(x / scale), -128, 127)   (round half to even; x / scale a float32 division)
The clamp is the seed WGSL quantiser's asymmetric [-128, 127]; it differs from the seed int8 writer, which clamps to
[-127, 127] and multiplies by the float32 reciprocal 127/amax. Because the scale is amax/127 (rounded),
|x / scale| <= 127 * (1 + 2^-23) and rounds to at most 127: the code -128 is never produced unless the
1e-8 floor applies, where |x / scale| < 127 as well. So codes lie in [-127, 127] in practice.
The GPU divides with a correctly rounded integer division (shaders/common/quant.wgsl), so codes and
scales are bit-identical to this oracle; dequantised value = code * scale (one float32 multiply).

Record: kvviz/attention/int8_records.py (the seed's q8 record shape).
"""
from __future__ import annotations

import numpy as np

from kvviz.attention import paged_oracle as op
from kvviz.attention.paged_oracle import per_token_caches, through_f32_decode
from kvviz.attention.int8_records import QMAX, SCALE_FLOOR, pack_records, unpack_records  # noqa: F401 - the record format


def quantize(x: np.ndarray):
    """x [..., D] float32 -> (codes int8 [..., D], scales float32 [...])."""
    x = np.asarray(x, dtype=np.float32)
    amax = np.abs(x).max(axis=-1)
    scales = np.maximum(amax / QMAX, SCALE_FLOOR).astype(np.float32)
    pre = (x / scales[..., None]).astype(np.float32)
    codes = np.clip(np.rint(pre), -128, 127).astype(np.int8)
    return codes, scales


def dequantize(codes: np.ndarray, scales: np.ndarray) -> np.ndarray:
    return (np.asarray(codes, np.float32) * np.asarray(scales, np.float32)[..., None]).astype(np.float32)


def int8_seed_attention(method, batch, key, value, q, scale, qkv=None):
    """The seed int8 writer's cache, attended by the seed decode."""
    shape = (batch.num_blocks, key.shape[1], batch.block_size, key.shape[2] // 4 + 1)
    k = op.write_cache_int8(np.zeros(shape, np.uint32), key, batch.slot_mapping, batch.block_size)
    v = op.write_cache_int8(np.zeros(shape, np.uint32), value, batch.slot_mapping, batch.block_size)
    return through_f32_decode(batch, q, scale, op.dequantize_cache_int8(k), op.dequantize_cache_int8(v))


def int8_token_attention(method, batch, key, value, q, scale, qkv=None):
    fk, fv = per_token_caches(batch, key, value, lambda x: dequantize(*quantize(x)))
    return through_f32_decode(batch, q, scale, fk, fv)
