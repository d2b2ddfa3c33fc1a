"""NVFP4 as a KV-cache record: E2M1 codes, an FP8 E4M3 scale per 16 elements, an f32 scale per tensor.

Record of a token and KV head (head size D, a multiple of 16; S = D/16 sub-blocks):
    words 0 .. ceil(S/4)-1   the S E4M3 scale bytes (byte s = sub-block s), zero padded
    then D/8 words           the E2M1 codes, 8 bytes a sub-block: byte i of sub-block s holds element
                             16s+i in its low nibble and element 16s+8+i in its high nibble (gguf's
                             NVFP4 order); a code is sign (bit 3) | E2M1 magnitude index (0, .5, 1, 1.5, 2, 3, 4, 6)
The per-tensor scales live in a 4-word side buffer [amax K, amax V, scale K, scale V] (f32 bits).
value = e2m1 * e4m3 * tensor_scale. For D a multiple of 64 the record regroups into gguf's NVFP4
blocks (4 scale bytes, then 32 code bytes per 64 elements), whose gguf dequantisation is e2m1 * e4m3.
"""
from __future__ import annotations

import numpy as np

SUB = 16  # elements per E4M3 scale
E2M1_MAX = 6.0
E4M3_MAX = 448.0
TENSOR_DIV = np.float32(E2M1_MAX * E4M3_MAX)  # tensor scale = amax / 2688
SCALE_FLOOR = np.float32(2.0**-126)
# by code (sign in bit 3); code 8 (E2M1 -0) decodes to +0, as gguf's int8 kvalues do
E2M1_VALUES = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, 0, -0.5, -1, -1.5, -2, -3, -4, -6], np.float32)


def scale_words(head_size: int) -> int:
    return -(-(head_size // SUB) // 4)


def words_per_token(head_size: int) -> int:
    return scale_words(head_size) + head_size // 8


def pack_records(codes: np.ndarray, scale_codes: np.ndarray) -> np.ndarray:
    """codes [..., D] (4-bit) and scale_codes [..., D/16] (E4M3 bytes) -> records [..., wpt] u32."""
    c = np.asarray(codes, np.uint8)
    D = c.shape[-1]
    lead = c.shape[:-1]
    sw = scale_words(D)
    sb = np.zeros((*lead, 4 * sw), np.uint8)
    sb[..., : D // SUB] = scale_codes
    g = c.reshape(*lead, D // SUB, 2, 8)
    qs = (g[..., 0, :] | (g[..., 1, :] << np.uint8(4))).reshape(*lead, D // 2)
    return np.concatenate([sb, qs], axis=-1).view(np.uint32).reshape(*lead, sw + D // 8)


def unpack_records(records: np.ndarray, head_size: int):
    """records [..., wpt] u32 -> (codes u8 [..., D], scale codes u8 [..., D/16])."""
    r = np.ascontiguousarray(records, np.uint32)
    b = r.view(np.uint8).reshape(*r.shape[:-1], 4 * r.shape[-1])
    sw = scale_words(head_size)
    sc = b[..., : head_size // SUB].copy()
    qs = b[..., 4 * sw:].reshape(*r.shape[:-1], head_size // SUB, 8)
    codes = np.stack([qs & 0x0F, qs >> 4], axis=-2).reshape(*r.shape[:-1], head_size)
    return codes.astype(np.uint8), sc


def to_gguf_blocks(records: np.ndarray, head_size: int) -> np.ndarray:
    """records [..., wpt] -> gguf NVFP4 rows [..., D/64 * 36] u8 (D a multiple of 64)."""
    codes, sc = unpack_records(records, head_size)
    lead = codes.shape[:-1]
    nb = head_size // 64
    g = codes.reshape(*lead, nb, 4, 2, 8)
    qs = (g[..., 0, :] | (g[..., 1, :] << np.uint8(4))).reshape(*lead, nb, 32)
    return np.concatenate([sc.reshape(*lead, nb, 4), qs], axis=-1).reshape(*lead, nb * 36)
