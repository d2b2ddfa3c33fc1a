"""Per-token int8 records: the seed q8 cache and the int8_token cache share this layout.

Record (u32 words) of one token and KV head: head_size/4 code words (element 4w + l in byte l of word
w, little-endian, two's complement), then the float32 bits of the scale. Dequantised value =
code * scale. The two quantisers differ (docs/kernels.md, "Per-token int8"):

- the seed writer (shaders/attention/reshape_and_cache_q8.comp): code = clamp(round(x * (127/amax)),
  -127, 127), scale = amax/127 (1 when amax = 0);
- int8_token (shaders/int8/write.wgsl): scale = max(amax/127, SCALE_FLOOR),
  code = clamp(round(x / scale), -128, 127).
"""
from __future__ import annotations

import numpy as np

QMAX = np.float32(127.0)
SCALE_FLOOR = np.float32(1e-8)  # int8_token's scale floor (a float32 constant in the shader)


def words_per_token(head_size: int) -> int:
    return head_size // 4 + 1


def pack_records(codes: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """codes [..., D] int8 + scales [...] -> records [..., D/4 + 1] u32."""
    c = np.ascontiguousarray(codes, dtype=np.int8)
    d = c.shape[-1]
    words = c.view(np.uint8).reshape(*c.shape[:-1], d // 4, 4).copy().view("<u4")[..., 0].astype(np.uint32)
    sb = np.ascontiguousarray(scales, dtype=np.float32).view(np.uint32)[..., None]
    return np.concatenate([words, sb], axis=-1)


def unpack_records(records: np.ndarray):
    """records [..., D/4 + 1] u32 -> (codes int8 [..., D], scales float32 [...])."""
    r = np.ascontiguousarray(records, dtype=np.uint32)
    codes = r[..., :-1].copy().view(np.int8).reshape(*r.shape[:-1], (r.shape[-1] - 1) * 4)
    return codes, r[..., -1].copy().view(np.float32)
