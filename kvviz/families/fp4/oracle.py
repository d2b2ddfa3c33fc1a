"""numpy oracle of the NVFP4 cache (kvviz/families/fp4/method.py; record format kvviz/families/fp4/format.py).

NVIDIA's two-level scheme as vLLM's reference (ref_nvfp4_quant) runs it, with correctly rounded float32
divisions where vLLM multiplies by reciprocals (the GPU divides with common.wgsl's div_rn):
    amax_t  = max |x| over every real token row and KV head of the batch (K and V separately)
    s_t     = max(amax_t / 2688, 2^-126)            f32 tensor scale, 2688 = 6 (E2M1 max) * 448 (E4M3 max)
    y       = x / s_t
    per 16 consecutive elements of a token's head vector:
      sc    = E4M3(max|y| / 6)                      round to nearest even, saturating at 448 (ml_dtypes)
      S     = value of sc
      code  = E2M1(clip(y / S, -6, 6))              round to nearest even (ml_dtypes float4_e2m1fn);
                                                    S = 0 (a sub-block of zeros or below E4M3's range): codes 0
    dequantised = (e2m1 * S) * s_t                  the first product is exact, the second one rounding
gguf implements NVFP4 dequantisation only (gguf.quants.NVFP4: e2m1 * ue4m3 per 64-element block);
tests/test_fp4_formats.py checks e2m1 * S against it and the GPU against this oracle, bit for bit.
"""
from __future__ import annotations

import numpy as np

from kvviz.attention.paged_oracle import per_token_caches, through_f32_decode
from kvviz.families.fp4.format import (  # noqa: F401
    E2M1_VALUES,
    SCALE_FLOOR,
    SUB,
    TENSOR_DIV,
    pack_records,
    unpack_records,
)
from kvviz.paging import PAD_SLOT


def tensor_scale(x: np.ndarray) -> np.float32:
    amax = np.float32(np.abs(np.asarray(x, np.float32)).max(initial=0))
    return np.float32(max(np.float32(amax / TENSOR_DIV), SCALE_FLOOR))


def _ml_dtypes():
    import ml_dtypes  # when first used, not at start-up: loading it registers every ufunc loop it adds

    return ml_dtypes


def e4m3_codes(s: np.ndarray) -> np.ndarray:
    s = np.minimum(np.asarray(s, np.float32), np.float32(448))
    return s.astype(_ml_dtypes().float8_e4m3fn).view(np.uint8)


def e4m3_values(c: np.ndarray) -> np.ndarray:
    return np.asarray(c, np.uint8).view(_ml_dtypes().float8_e4m3fn).astype(np.float32)


def quantize(x: np.ndarray, s_t) -> tuple[np.ndarray, np.ndarray]:
    """x [..., D] f32, tensor scale s_t -> (codes u8 [..., D], E4M3 scale codes u8 [..., D/16])."""
    x = np.asarray(x, np.float32)
    D = x.shape[-1]
    y = (x / np.float32(s_t)).astype(np.float32)
    g = y.reshape(*x.shape[:-1], D // SUB, SUB)
    sc = e4m3_codes((np.abs(g).max(-1) / np.float32(6)).astype(np.float32))
    S = e4m3_values(sc)[..., None]
    ok = S > 0
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.clip((g / np.where(ok, S, np.float32(1))).astype(np.float32), -6, 6)
    codes = z.astype(_ml_dtypes().float4_e2m1fn).view(np.uint8) & np.uint8(0x0F)
    codes = np.where(ok, codes, np.uint8(0)).astype(np.uint8)
    return codes.reshape(x.shape), sc


def dequantize(codes: np.ndarray, scale_codes: np.ndarray, s_t) -> np.ndarray:
    c = np.asarray(codes, np.uint8)
    D = c.shape[-1]
    S = e4m3_values(scale_codes)[..., None]
    v = (E2M1_VALUES[c].reshape(*c.shape[:-1], D // SUB, SUB) * S).astype(np.float32)
    return (v * np.float32(s_t)).astype(np.float32).reshape(c.shape)


def quantize_batch(key, value, slot_mapping):
    """(K records, V records, (s_t K, s_t V)) of a batch: records [tokens, kvh, wpt] (zeros for padding rows)."""
    real = np.asarray(slot_mapping) != PAD_SLOT
    out = []
    scales = []
    for x in (key, value):
        s_t = tensor_scale(x[real])
        codes, sc = quantize(x, s_t)
        rec = pack_records(codes, sc)
        rec[~real] = 0
        out.append(rec)
        scales.append(s_t)
    return out[0], out[1], tuple(scales)


def reference_attention(method, batch, key, value, q, scale, qkv=None):
    real = batch.slot_mapping != PAD_SLOT
    st = {id(key): tensor_scale(key[real]), id(value): tensor_scale(value[real])}

    def deq(x):
        return dequantize(*quantize(x, st[id(x)]), st[id(x)])

    fk, fv = per_token_caches(batch, key, value, deq)
    return through_f32_decode(batch, q, scale, fk, fv)
