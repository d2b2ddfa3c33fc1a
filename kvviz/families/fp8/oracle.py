"""numpy oracle of the FP8 paged caches (methods fp8_e4m3 / fp8_e5m2; shaders quant/fp8_*.wgsl).

Formats (kvviz/families/fp8/format.py) are the OCP 8-bit floats E4M3FN and E5M2. Reference conversion:
`ml_dtypes.float8_e4m3fn` / `float8_e5m2` applied to float32 `x / scale` AFTER clipping to +-max:
the kernels saturate, while ml_dtypes turns overflow into NaN (e4m3fn) or inf (e5m2). ml_dtypes
rounds to nearest, ties to even, keeps signed zeros and handles FP8 subnormals: the GPU encoder is
bit exact against it.

Scales (float32, computed exactly as the kernels do; `x / y` is IEEE float32 division here and a
correctly rounded integer division on the GPU):
  per_token : scale = max(amax / fp8_max, 2^-126) per token and KV head (amax over the head vector);
  per_tensor: scale = max(amax / fp8_max, 2^-126) with amax over every real (non-padding) token and
              head of K (and separately of V) in the batch; computed ON THE GPU (atomicMax of the
              |x| bits, then the writer divides), one scale word each for K and V.
The 2^-126 floor (smallest normal float32) only matters for all-zero / denormal inputs: it keeps
the divisor normal. Dequantised value = fp8_value * scale (one float32 multiply).
"""
from __future__ import annotations

import numpy as np

from kvviz.families.fp8.format import (  # noqa: F401 - the format, re-exported for the tests
    FORMATS, SCALE_FLOOR, Fp8Format, decode, pack_records, unpack_records,
)
from kvviz.attention.paged_oracle import per_token_caches, scatter_rows, through_f32_decode
from kvviz.paging import PAD_SLOT


def encode(v: np.ndarray, fmt: Fp8Format) -> np.ndarray:
    """float32 values -> uint8 codes, saturating, RNE (ml_dtypes after clipping)."""
    v = np.asarray(v, dtype=np.float32)
    m = np.float32(fmt.max)
    return np.clip(v, -m, m).astype(fmt.dtype).view(np.uint8)


def scale_of(amax, fmt: Fp8Format) -> np.ndarray:
    amax = np.asarray(amax, dtype=np.float32)
    return np.maximum(amax / np.float32(fmt.max), SCALE_FLOOR).astype(np.float32)


def tensor_amax(x: np.ndarray, slot_mapping) -> np.float32:
    """amax over the real (non-padding) rows of x [tokens, kvh, D]."""
    real = np.asarray(slot_mapping, dtype=np.int64) != PAD_SLOT
    xs = np.abs(np.asarray(x, np.float32)[real])
    return np.float32(xs.max()) if xs.size else np.float32(0.0)


def quantize(x: np.ndarray, fmt: Fp8Format, mode: str, slot_mapping=None):
    """x [tokens, kvh, D] f32 -> (codes uint8 [tokens, kvh, D], scales f32 [tokens, kvh]).

    mode "per_tensor" broadcasts the single scale to every row (padding rows included).
    """
    x = np.asarray(x, dtype=np.float32)
    if mode == "per_token":
        scales = scale_of(np.abs(x).max(axis=-1), fmt)
    elif mode == "per_tensor":
        sm = np.zeros(x.shape[0], np.uint32) if slot_mapping is None else slot_mapping
        scales = np.broadcast_to(scale_of(tensor_amax(x, sm), fmt), x.shape[:-1]).astype(np.float32)
    else:
        raise ValueError(mode)
    v = (x / scales[..., None]).astype(np.float32)
    return encode(v, fmt), scales


def dequantize(codes: np.ndarray, scales: np.ndarray, fmt: Fp8Format) -> np.ndarray:
    """Exactly what the dequantise kernel computes: float32(fp8) * scale in float32."""
    return (decode(codes, fmt) * np.asarray(scales, np.float32)[..., None]).astype(np.float32)


# ------------------------------------------------------------------------------ vLLM-style scales
# Methods vllm_fp8_e4m3 / vllm_fp8_e5m2 (kvviz/families/fp8_vllm/method.py, shaders quant/fp8_vllm_*.wgsl): codes
# only in the record, the scale from a side buffer: one per tensor (K and V each) or one per KV head,
#   calibrated: scale = max(amax / fp8_max, 2^-126), amax over the calibration rows (real rows at a position
#               < calib_tokens; calib_tokens 0: every real row), computed on the GPU, then frozen;
#   given     : the user's k_scale / v_scale (float32).
# code = saturating RNE of float32 x / scale (ml_dtypes after clipping, as `encode`). An element is
# SATURATED when x / scale has no finite code: ml_dtypes' cast of the unclipped value is NaN (E4M3FN) or
# inf (E5M2): |x / scale| > 464 for E4M3FN, >= 61440 for E5M2 (Fp8Format.sat_bits).


def vllm_calibration_rows(slot_mapping, token_pos, calib_tokens: int) -> np.ndarray:
    """Boolean [tokens]: the rows calibration reads (real rows; with calib_tokens > 0 only positions below it)."""
    rows = np.asarray(slot_mapping, np.int64) != PAD_SLOT
    if calib_tokens > 0:
        rows &= np.asarray(token_pos, np.int64) < calib_tokens
    return rows


def vllm_scales(x: np.ndarray, rows: np.ndarray, fmt: Fp8Format, per_head: bool) -> np.ndarray:
    """[kv_heads] float32 calibrated scales of x [tokens, kvh, D] over the boolean `rows` (the per-tensor
    scale repeated for every head)."""
    x = np.asarray(x, np.float32)
    kvh = x.shape[1]
    sel = np.abs(x[np.asarray(rows, bool)])  # [n, kvh, D]
    if per_head:
        amax = sel.max(axis=(0, 2)) if sel.size else np.zeros(kvh, np.float32)
    else:
        amax = np.full(kvh, sel.max() if sel.size else 0.0, np.float32)
    return scale_of(amax.astype(np.float32), fmt)


def vllm_quantize(x: np.ndarray, head_scales: np.ndarray, fmt: Fp8Format):
    """x [tokens, kvh, D] f32 with one scale per KV head -> (codes uint8 [tokens, kvh, D],
    saturated bool [tokens, kvh, D]): the elements whose x / scale has no finite FP8 code."""
    x = np.asarray(x, np.float32)
    s = np.asarray(head_scales, np.float32)[None, :, None]
    with np.errstate(over="ignore"):
        v = (x / s).astype(np.float32)
        sat = ~np.isfinite(v.astype(fmt.dtype).astype(np.float32))
    return encode(v, fmt), sat


def vllm_dequantize(codes: np.ndarray, head_scales: np.ndarray, fmt: Fp8Format) -> np.ndarray:
    """float32(fp8) * scale of the KV head, one float32 multiply (the dequantise kernel)."""
    return (decode(codes, fmt) * np.asarray(head_scales, np.float32)[None, :, None]).astype(np.float32)


def vllm_method_scales(method, batch, key, value) -> tuple[np.ndarray, np.ndarray]:
    """(K [kvh], V [kvh]) scales a vllm_fp8_* method uses on this batch."""
    kvh = np.asarray(key).shape[1]
    if method.scales == "given":
        return np.full(kvh, method.k_scale, np.float32), np.full(kvh, method.v_scale, np.float32)
    rows = vllm_calibration_rows(batch.slot_mapping, batch.token_pos, method.calib_tokens)
    per_head = method.scale_granularity == "per_head"
    return vllm_scales(key, rows, method.fmt, per_head), vllm_scales(value, rows, method.fmt, per_head)


def vllm_attention(method, batch, key, value, q, scale, qkv=None):
    """End-to-end reference of vllm_fp8_*: the oracle's dequantised caches through the f32 paged decode's
    arithmetic (kvviz/attention/paged_oracle.py), tolerance 2e-5 * max(1, max|V^|)."""

    ks, vs = vllm_method_scales(method, batch, key, value)
    caches = []
    for x, s in ((key, ks), (value, vs)):
        codes, _ = vllm_quantize(x, s, method.fmt)
        caches.append(scatter_rows(batch, vllm_dequantize(codes, s, method.fmt).astype(np.float64)))
    return through_f32_decode(batch, q, scale, caches[0], caches[1])


def fp8_attention(method, batch, key, value, q, scale, qkv=None):
    def deq(x):
        codes, scales = quantize(x, method.fmt, method.scale_mode, batch.slot_mapping)
        return dequantize(codes, scales, method.fmt)

    fk, fv = per_token_caches(batch, key, value, deq)
    return through_f32_decode(batch, q, scale, fk, fv)
