"""Bytes a kernel must move at least once (unique bytes), for GB/s and the roofline.

Re-reads are not counted (the seed decode reads K twice): the figure is the traffic of an ideal
kernel, so GB/s against the copy bandwidth says how far a kernel is from the memory limit.
"""
from __future__ import annotations

import numpy as np

from kvviz.paging import PAD_SLOT


def writer_bytes(cache, batch, key) -> int:
    real = int(np.count_nonzero(batch.slot_mapping != PAD_SLOT))
    kvh, d = key.shape[1], key.shape[2]
    read = 2 * real * kvh * d * 4 + batch.num_tokens * 4
    written = 2 * real * kvh * cache.wpt * 4
    return int(read + written)


def decode_bytes(cache, batch, q) -> int:
    S, H, D = np.asarray(q).shape
    ctx = batch.context_lens.astype(np.int64)
    blocks = int((-(-ctx // batch.block_size)).sum())
    kv = 2 * int(ctx.sum()) * cache.num_kv_heads * cache.wpt * 4
    return int(S * H * D * 4 * 2 + kv + blocks * 4 + S * 4)


def weights_bytes(cache, batch, q) -> int:
    S, H, D = np.asarray(q).shape
    ctx = batch.context_lens.astype(np.int64)
    return int(S * H * D * 4 + int(ctx.sum()) * cache.num_kv_heads * cache.wpt * 4 + S * H * batch.max_context_len * 4)
