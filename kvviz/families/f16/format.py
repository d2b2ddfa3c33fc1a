"""The f16 paged cache (method f16): IEEE binary16 K/V, two halves a u32 word.

Record (u32 words) of one token and KV head: head_size/2 words, element 2w in the low 16 bits of word w
and 2w+1 in the high 16 bits (little-endian: the words' bytes are the float16 array's bytes). Paged
[num_blocks, kv_heads, block_size, head_size/2]. Conversion from float32: round to nearest even with
subnormals (numpy astype(float16)); binary16's largest finite value is 65504 and every |x| >= 65520
(65504 + half a step) rounds to infinity, which the method refuses before dispatch.
"""
from __future__ import annotations

import numpy as np

from kvviz.errors import InvalidInput

F16_MAX = 65504.0
OVERFLOW = np.float32(65520.0)  # the smallest |x| that rounds to infinity


def words_per_token(head_size: int) -> int:
    return head_size // 2


def check_range(name: str, x: np.ndarray) -> None:
    """InvalidInput when some |x| would round to infinity in float16 (|x| >= 65520)."""
    a = np.abs(np.asarray(x, np.float32))
    if a.size and float(a.max()) >= OVERFLOW:
        idx = tuple(int(i) for i in np.argwhere(a >= OVERFLOW)[0])
        raise InvalidInput(
            f"{name} has {int(np.count_nonzero(a >= OVERFLOW))} value(s) of magnitude >= 65520 (first at index {idx}: "
            f"{float(np.asarray(x, np.float32)[idx]):.6g}), which float16 would store as infinity: its largest "
            f"finite value is {F16_MAX:g}.",
            "Scale K/V into float16's range (|x| <= 65504), or pick a method with a scale (int8_token, fp8_*).",
        )


def pack_records(h: np.ndarray) -> np.ndarray:
    """float16 [..., D] -> records [..., D/2] u32."""
    h = np.ascontiguousarray(h, np.float16)
    return h.view(np.uint32).reshape(*h.shape[:-1], h.shape[-1] // 2).astype(np.uint32)


def unpack_records(records: np.ndarray) -> np.ndarray:
    """records [..., D/2] u32 -> float16 [..., D]."""
    r = np.ascontiguousarray(records, np.uint32)
    return r.view(np.float16).reshape(*r.shape[:-1], r.shape[-1] * 2)
