"""numpy oracle of the `f16` paged cache (kvviz/families/f16/method.py; record: kvviz/families/f16/format.py).

    half = float16(x)      numpy astype(np.float16): round to nearest even, subnormals kept
    dequantised = float32(half)   exact

The GPU writer (shaders/f16/write_fast.wgsl) converts on the float bits with the same rounding, so the
cache words equal `write_cache` word for word; the dequantise kernel (shaders/f16/dequant.wgsl) widens
exactly. Values with |x| >= 65520 would become infinity and are refused by the method (and here).
"""
from __future__ import annotations

import numpy as np

from kvviz.attention.paged_oracle import per_token_caches, through_f32_decode
from kvviz.families.f16.format import check_range, pack_records, unpack_records  # noqa: F401 - the record format
from kvviz.paging import PAD_SLOT


def quantize(x: np.ndarray) -> np.ndarray:
    """x [..., D] float32 -> float16 [..., D] (InvalidInput where a value would overflow)."""
    x = np.asarray(x, np.float32)
    check_range("x", x)
    return x.astype(np.float16)


def dequantize(h: np.ndarray) -> np.ndarray:
    return np.asarray(h, np.float16).astype(np.float32)


def write_cache(cache: np.ndarray, x: np.ndarray, slot_mapping: np.ndarray, block_size: int) -> np.ndarray:
    """The writer on one of K or V: cache [num_blocks, kv_heads, block_size, D/2] u32 (a modified copy);
    x [tokens, kv_heads, D] float32; PAD_SLOT rows skipped."""
    out = np.array(cache, np.uint32, copy=True)
    sm = np.asarray(slot_mapping).astype(np.int64)
    real = sm != PAD_SLOT
    recs = pack_records(quantize(x))
    out[sm[real] // block_size, :, sm[real] % block_size] = recs[real]
    return out


def method_attention(method, batch, key, value, q, scale, qkv=None):
    """f16 caches attended in float64 (the dequantise + f32 decode path, or the fast f16 decode): the
    f32 kernels' tolerance 2e-5 * max(1, max|V^|) (kvviz/attention/paged_oracle.py)."""
    fk, fv = per_token_caches(batch, key, value, lambda x: dequantize(quantize(x)))
    return through_f32_decode(batch, q, scale, fk, fv)
