"""Arithmetic a kernel must do at least (its FLOPs), for the roofline beside the unique bytes of
kvviz/attention/traffic.py. Counting rule, the same for every kernel: a floating-point multiply, add,
subtract, divide, compare (max/min/abs) or exp counts 1, an FMA counts 2; integer index arithmetic and
bit packing count 0. Integer dot products (dot4I8Packed) are counted separately (`int_dots`); no
kernel in kvviz uses them yet, so that count is 0 everywhere it is stated.

Decodes: QK^T and PV are one FMA per (token, query head, dim) each: 4 * D * H * tokens, plus the
softmax per (token, query head): subtract the max, exp, add to the sum, compare for the max (4).
"""
from __future__ import annotations

import numpy as np

from kvviz.paging import PAD_SLOT

SOFTMAX_PER_LOGIT = 4


def _real_tokens(batch) -> int:
    return int(np.count_nonzero(np.asarray(batch.slot_mapping) != PAD_SLOT))


def decode_flops(batch, num_heads: int, head_size: int) -> float:
    """QK^T + PV as FMAs and the softmax, over every context token of every query head."""
    tokens = int(np.sum(batch.context_lens))
    return float(tokens * num_heads * (4 * head_size + SOFTMAX_PER_LOGIT))


def reduce_flops(num_seqs: int, num_heads: int, head_size: int, num_partitions: int) -> float:
    """Combining partitions: per partition a max, an exp and a rescale-add of the sum (3) and one FMA per dim."""
    return float(num_seqs * num_heads * num_partitions * (3 + 2 * head_size))


def writer_flops(batch, num_kv_heads: int, head_size: int, per_element: float) -> float:
    """A writer over K and V of the real token rows: `per_element` flops per element (0 for a copy;
    an absmax quantiser: |x| compare + divide or multiply by the scale = 2; asymmetric: min, max, subtract,
    divide = 4)."""
    return float(2 * _real_tokens(batch) * num_kv_heads * head_size * per_element)


def dequant_flops(batch, num_kv_heads: int, head_size: int, per_element: float) -> float:
    """A dequantiser over K and V of every used block (code * scale = 1, code * scale + zero = 2)."""
    nblk = sum(len(b) for b in batch.seq_blocks)
    return float(2 * nblk * batch.block_size * num_kv_heads * head_size * per_element)


# flops per element of each method family's writer and dequantiser (see the module doc)
WRITER_PER_ELEMENT = {"f32": 0.0, "int8": 2.0, "fp8": 2.0, "int4": 4.0, "ggml": 4.0, "fp4": 3.0, "kivi": 4.0}
DEQUANT_PER_ELEMENT = {"int8": 1.0, "fp8": 1.0, "int4": 2.0, "ggml": 2.0, "fp4": 2.0, "kivi": 2.0}
