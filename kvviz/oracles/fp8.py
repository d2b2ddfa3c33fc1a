"""numpy oracle of the FP8 paged caches (methods fp8_e4m3 / fp8_e5m2; shaders quant/fp8_*.wgsl).

Formats (kvviz/formats/fp8.py) are the OCP 8-bit floats E4M3FN and E5M2. Reference conversion:
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

from kvviz.formats.fp8 import (  # noqa: F401 - the format, re-exported for the tests
    FORMATS, SCALE_FLOOR, Fp8Format, decode, pack_records, unpack_records,
)
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
