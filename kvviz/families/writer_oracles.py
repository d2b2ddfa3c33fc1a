"""numpy oracle of the fast writers (kvviz/attention/writers.py): the exact cache words each one must
leave, from the oracles of the methods they write for. The fast writers reproduce those words bit for bit
(codes, scales, zeros, FP8 bytes, f16 halves, KIVI residual rows and side streams); the only freedom the
seed's oracle grants (a one-code difference at a .5 tie, kvviz/attention/paged_oracle.py compare_int8_cache) is not
needed, because the fast seed-layout writer divides 127/amax and amax/127 exactly.

Each function takes the token rows (key or value [tokens, kv_heads, D] float32), the batch and the
method's options, and returns the paged record words [num_blocks, kv_heads, block_size, words per token]
(slots no token writes stay 0).
"""
from __future__ import annotations

import numpy as np

from kvviz.families.int4 import format as asym
from kvviz.families.fp8 import format as fmt8
from kvviz.attention.int8_records import pack_records as pack_int8
from kvviz.families.f16 import oracle as of16
from kvviz.families.fp8 import oracle as of8
from kvviz.families.int4 import oracle as o4
from kvviz.families.int8 import oracle as o8
from kvviz.families.kivi import oracle as okv
from kvviz.attention import paged_oracle as op
from kvviz.paging import PAD_SLOT


def scatter(batch, records: np.ndarray) -> np.ndarray:
    """Per-row records [tokens, kvh, W] -> paged [num_blocks, kvh, block_size, W] (real rows only)."""
    T, kvh, W = records.shape
    out = np.zeros((batch.num_blocks, kvh, batch.block_size, W), np.uint32)
    sm = np.asarray(batch.slot_mapping).astype(np.int64)
    real = sm != PAD_SLOT
    out[sm[real] // batch.block_size, :, sm[real] % batch.block_size] = records[real]
    return out


def int8_seed(batch, x) -> np.ndarray:
    """The seed writer's records (reshape_and_cache_q8.comp through kvviz/attention/paged_oracle.py)."""
    x = np.asarray(x, np.float32)
    shape = (batch.num_blocks, x.shape[1], batch.block_size, x.shape[2] // 4 + 1)
    return op.write_cache_int8(np.zeros(shape, np.uint32), x, batch.slot_mapping, batch.block_size)


def int8_token(batch, x) -> np.ndarray:
    return scatter(batch, pack_int8(*o8.quantize(x)))


def fp8(batch, x, fmt_key: str, mode: str) -> np.ndarray:
    fmt = fmt8.FORMATS[fmt_key]
    codes, scales = of8.quantize(x, fmt, mode, batch.slot_mapping)
    return scatter(batch, fmt8.pack_records(codes, scales if mode == "per_token" else None))


def fp8_tensor_scale(batch, x, fmt_key: str) -> np.float32:
    """The per-tensor scale the writer stores in tensor[2|3]."""
    return np.float32(of8.scale_of(of8.tensor_amax(x, batch.slot_mapping), fmt8.FORMATS[fmt_key]))


def int4(batch, x, group: int) -> np.ndarray:
    return scatter(batch, asym.pack_records(*o4.quantize_groups(x, group)))


def f16(batch, x) -> np.ndarray:
    return scatter(batch, of16.pack_records(of16.quantize(x)))


def kivi(batch, key, value, bits: int, recent: int) -> dict:
    """{"k": [num_blocks, kvh, kstride], "v": [num_blocks, kvh, bs*(KW+2)], "res": [rows, 2, kvh, D]}."""
    return okv.write_buffers(batch, key, value, bits, recent)
