"""Asymmetric (min/max) n-bit codes: int4_group records and the packing KIVI shares.

A group of float32 values is stored as codes 0..L (L = 2^bits - 1), a float32 scale and a float32
zero (the group minimum): value = code * scale + zero. A group whose max - min is below MIN_RANGE is
degenerate: scale 0, every code 0, value = zero exactly (docs/kernels.md, "Asymmetric codes").

Codes are packed LSB first: element (32/bits)*w + l of a row sits in bits l*bits.. of word w.
int4_group record of a token and KV head: D/8 code words, then per group g: word D/8 + 2g = scale
bits, word D/8 + 2g + 1 = zero bits.
"""
from __future__ import annotations

import numpy as np

MIN_RANGE = np.float32(2.0**-100)
INT4_GROUPS = (32, 64, 128)


def int4_words_per_token(head_size: int, group: int) -> int:
    return head_size // 8 + 2 * (head_size // group)


def pack_codes(codes: np.ndarray, bits: int) -> np.ndarray:
    """codes [..., D] (< 2^bits) -> words [..., D*bits/32] u32, element (32/bits)*w + l at bits l*bits."""
    c = np.asarray(codes, dtype=np.uint32)
    per = 32 // bits
    c = c.reshape(*c.shape[:-1], c.shape[-1] // per, per)
    shifts = (np.arange(per, dtype=np.uint32) * bits).astype(np.uint32)
    return np.bitwise_or.reduce(c << shifts, axis=-1).astype(np.uint32)


def unpack_codes(words: np.ndarray, bits: int) -> np.ndarray:
    w = np.asarray(words, dtype=np.uint32)
    per = 32 // bits
    shifts = (np.arange(per, dtype=np.uint32) * bits).astype(np.uint32)
    c = (w[..., None] >> shifts) & np.uint32((1 << bits) - 1)
    return c.reshape(*w.shape[:-1], w.shape[-1] * per).astype(np.uint8)


def pack_records(codes, scales, zeros) -> np.ndarray:
    """int4_group record: [..., D/8 + 2*D/G] u32 (codes, then (scale, zero) per group)."""
    cw = pack_codes(codes, 4)
    sz = np.stack([np.asarray(scales, np.float32), np.asarray(zeros, np.float32)], axis=-1)
    sz = np.ascontiguousarray(sz).view(np.uint32).reshape(*cw.shape[:-1], -1)
    return np.concatenate([cw, sz], axis=-1)


def unpack_records(records: np.ndarray, head_size: int, group: int):
    """int4_group records -> (codes uint8 [..., D], scales f32 [..., D/G], zeros f32 [..., D/G])."""
    r = np.ascontiguousarray(records, dtype=np.uint32)
    nw = head_size // 8
    codes = unpack_codes(r[..., :nw], 4)
    sz = r[..., nw:].copy().view(np.float32).reshape(*r.shape[:-1], head_size // group, 2)
    return codes, sz[..., 0].copy(), sz[..., 1].copy()
