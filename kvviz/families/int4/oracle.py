"""numpy oracle of the `int4_group` paged cache, and the asymmetric quantiser KIVI shares.

Asymmetric quantiser with L = 2^bits - 1 levels over a set of float32 values (a group):
    mn, mx = min, max                          (total order on the float bits: -0 < +0)
    range  = mx - mn                           (float32)
    degenerate when range < 2^-100 (constant groups, all-zero vectors, denormal-only groups):
        scale = 0, every code 0, dequantised value = mn exactly
    otherwise
        scale = range / L                      (float32 division)
        code  = clamp(round((x - mn) / scale), 0, L)   (round half to even)
    zero   = mn                                stored as float32: the value code 0 stands for
    dequantised value = code * scale + zero    (float32; a GPU may fuse this into one fma)
The integer zero point of the usual formulation is -zero/scale; storing mn keeps reconstruction
exact at code 0 and avoids a division. The GPU divides with a correctly rounded integer division
(shaders/common/quant.wgsl), so codes, scales and zeros are bit-identical to this oracle; a 2^-100
threshold rather than range == 0 makes the result independent of denormal flushing on the GPU.

int4_group: groups of G in {32, 64, 128} consecutive elements of one token's head vector, L = 15.
Record and code packing: kvviz/families/int4/format.py.
"""
from __future__ import annotations

import numpy as np

from kvviz.attention.paged_oracle import per_token_caches, through_f32_decode
from kvviz.families.int4.format import (  # noqa: F401 - the record format
    MIN_RANGE,
    pack_codes,
    pack_records,
    unpack_codes,
    unpack_records,
)


def order_keys(x: np.ndarray) -> np.ndarray:
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    return np.where(u >> 31, ~u, u | np.uint32(0x80000000)).astype(np.uint32)


def keys_to_float(k: np.ndarray) -> np.ndarray:
    k = np.asarray(k, dtype=np.uint32)
    bits = np.where(k >> 31, k & np.uint32(0x7FFFFFFF), ~k).astype(np.uint32)
    return bits.view(np.float32)


def tmin(x: np.ndarray, axis: int = -1) -> np.ndarray:
    return keys_to_float(order_keys(x).min(axis=axis))


def tmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    return keys_to_float(order_keys(x).max(axis=axis))


def asym_params(mn: np.ndarray, mx: np.ndarray, levels: int):
    """(scale, degenerate mask) from float32 min and max."""
    mn = np.asarray(mn, np.float32)
    mx = np.asarray(mx, np.float32)
    rng = (mx - mn).astype(np.float32)
    ok = rng >= MIN_RANGE
    scale = np.where(ok, rng / np.float32(levels), np.float32(0)).astype(np.float32)
    return scale, ~ok


def asym_codes(x: np.ndarray, mn: np.ndarray, scale: np.ndarray, levels: int) -> np.ndarray:
    """Codes of x given broadcastable mn and scale (scale 0 = degenerate -> code 0)."""
    x = np.asarray(x, np.float32)
    ok = scale != 0
    safe = np.where(ok, scale, np.float32(1)).astype(np.float32)
    with np.errstate(over="ignore"):
        pre = ((x - mn).astype(np.float32) / safe).astype(np.float32)
    q = np.clip(np.rint(pre), 0, levels)
    return np.where(ok, q, 0).astype(np.uint8)


def asym_dequant(codes, scale, zero) -> np.ndarray:
    return (np.asarray(codes, np.float32) * np.asarray(scale, np.float32) + np.asarray(zero, np.float32)).astype(np.float32)


def quantize_groups(x: np.ndarray, group: int, levels: int = 15):
    """x [..., D] -> (codes uint8 [..., D], scales f32 [..., D/G], zeros f32 [..., D/G])."""
    x = np.asarray(x, dtype=np.float32)
    D = x.shape[-1]
    g = x.reshape(*x.shape[:-1], D // group, group)
    mn, mx = tmin(g), tmax(g)
    scale, _ = asym_params(mn, mx, levels)
    codes = asym_codes(g, mn[..., None], scale[..., None], levels).reshape(x.shape)
    return codes, scale, mn


def dequantize_groups(codes, scales, zeros, group: int) -> np.ndarray:
    c = np.asarray(codes)
    D = c.shape[-1]
    g = c.reshape(*c.shape[:-1], D // group, group)
    return asym_dequant(g, np.asarray(scales)[..., None], np.asarray(zeros)[..., None]).reshape(c.shape)


def method_attention(method, batch, key, value, q, scale, qkv=None):
    """End-to-end reference of int4_group at the group it uses for this head size (`Int4Group.group_for`):
    the oracle's dequantised caches through the f32 paged decode's arithmetic (kvviz/attention/paged_oracle.py)."""
    G = method.group_for(np.asarray(key).shape[2])
    fk, fv = per_token_caches(batch, key, value, lambda x: dequantize_groups(*quantize_groups(x, G), G))
    return through_f32_decode(batch, q, scale, fk, fv)


