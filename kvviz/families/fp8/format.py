"""The OCP 8-bit floats of the FP8 caches: E4M3FN (bias 7, 3 mantissa bits, max 448, no inf,
0x7F/0xFF NaN) and E5M2 (bias 15, 2 mantissa bits, max 57344, IEEE-like inf/NaN).

Record (u32 words) of a token and KV head: D/4 code words (lane l of a word = byte l, little-endian),
then, with per-token scales, the float32 bits of the scale. Per-tensor scales live in one side word
each for K and V. value = fp8_value * scale; scale = max(amax / fp8_max, SCALE_FLOOR).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

SCALE_FLOOR = np.float32(2.0**-126)  # smallest normal float32: keeps the divisor normal
SCALE_MODES = ("per_token", "per_tensor")


@dataclass(frozen=True)
class Fp8Format:
    name: str
    dtype_name: str  # the ml_dtypes type, looked up when first used (ml_dtypes is slow to load: not at start-up)
    mbits: int
    bias: int
    max: float

    @property
    def dtype(self):
        import ml_dtypes

        return getattr(ml_dtypes, self.dtype_name)

    @property
    def max_bits(self) -> int:
        return int(np.array([self.max], np.float32).view(np.uint32)[0])

    @property
    def sat_bits(self) -> int:
        """float32 bits of the largest magnitude this format takes without saturating: a value whose |x|
        bits are above it has no finite RNE code (ml_dtypes turns it into NaN for E4M3FN, inf for E5M2;
        the kernels clip it to +-max). E4M3FN: 464 (the tie between 448 and 480 rounds to even 448);
        E5M2: the float below 61440 (that tie rounds to 65536, beyond max)."""
        mx = np.float32(self.max)
        nxt = np.float32(self.max) + np.float32(2.0 ** (np.floor(np.log2(self.max)) - self.mbits))
        mid = np.float32((mx + nxt) / 2)
        bits = int(np.array([mid], np.float32).view(np.uint32)[0])
        return bits if np.isfinite(np.array([mid], np.float32).astype(self.dtype).astype(np.float32)[0]) else bits - 1

    @property
    def max_code(self) -> int:
        """The code of +max, from its bits: exponent field (e + bias) above the mantissa field (the slot
        registry reads it for every FP8 method's shader defines, so it needs no ml_dtypes)."""
        e = int(np.floor(np.log2(self.max)))
        m = int(round((self.max / 2.0 ** e - 1.0) * 2 ** self.mbits))
        return ((e + self.bias) << self.mbits) | m

    def defines(self) -> dict:
        """The shader defines of this format (quant/fp8_*.wgsl, common/selftest.wgsl)."""
        return {"MBITS": self.mbits, "BIAS": self.bias, "MAX_BITS": self.max_bits, "MAX_CODE": self.max_code,
                "FMAX": f"{self.max:.1f}"}


FORMATS = {
    "e4m3": Fp8Format("fp8_e4m3fn", "float8_e4m3fn", 3, 7, 448.0),
    "e5m2": Fp8Format("fp8_e5m2", "float8_e5m2", 2, 15, 57344.0),
}


def words_per_token(head_size: int, has_scale: bool) -> int:
    return head_size // 4 + (1 if has_scale else 0)


def decode(codes: np.ndarray, fmt: Fp8Format) -> np.ndarray:
    """uint8 codes -> their float32 values."""
    return np.asarray(codes, dtype=np.uint8).view(fmt.dtype).astype(np.float32)


def pack_records(codes: np.ndarray, scales: np.ndarray | None) -> np.ndarray:
    """codes [..., D] uint8 (+ scales [...]) -> records [..., D/4 (+1)] u32: lane l of a word is byte l (LE)."""
    c = np.ascontiguousarray(codes, dtype=np.uint8)
    words = c.reshape(*c.shape[:-1], c.shape[-1] // 4, 4).copy().view("<u4")[..., 0].astype(np.uint32)
    if scales is None:
        return words
    sb = np.ascontiguousarray(scales, dtype=np.float32).view(np.uint32)[..., None]
    return np.concatenate([words, sb], axis=-1)


def unpack_records(records: np.ndarray, head_size: int, has_scale: bool):
    r = np.ascontiguousarray(records, dtype=np.uint32)
    nw = head_size // 4
    codes = r[..., :nw].copy().view(np.uint8).reshape(*r.shape[:-1], head_size)
    scales = r[..., nw].copy().view(np.float32) if has_scale else None
    return codes, scales
