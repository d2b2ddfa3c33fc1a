"""llama.cpp (ggml) block types as KV-cache records: q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl and mxfp4.

Every type quantises blocks of 32 consecutive elements of one token's head vector; a block is stored
byte for byte as ggml lays it out (ggml-common.h, gguf.quants), little-endian:

    type    bytes  block
    q8_0     34    d f16 | qs int8[32]                                  x = d*q
    q4_0     18    d f16 | qs u8[16] (q[j] low nibble, q[j+16] high)    x = d*(q-8)
    q4_1     20    d f16 | m f16 | qs u8[16]                            x = d*q + m
    q5_0     22    d f16 | qh u32 (bit j = bit 4 of q[j]) | qs u8[16]   x = d*(q-16)
    q5_1     24    d f16 | m f16 | qh u32 | qs u8[16]                   x = d*q + m
    iq4_nl   18    d f16 | qs u8[16]                                    x = d*IQ4_NL_VALUES[q]
    mxfp4    17    e u8 (E8M0) | qs u8[16] (E2M1 codes)                 x = 2^(e-128)*MXFP4_VALUES[q]

A token's record (one KV head) is the ggml row of its head vector -- D/32 blocks back to back, exactly
the bytes gguf.quants.quantize returns for that row -- padded with zero bytes to whole u32 words
(byte 4w+l of the row is byte l of word w). Paged cache [num_blocks, kv_heads, block_size, wpt] u32.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

BLOCK = 32  # elements per block (QK8_0 = QK4_0 = ... = QK_MXFP4 = 32)
# Blocks whose largest |x| is below this are written as ggml writes a block whose scale is 0 (id = 0):
# gguf's codes for them come from float32 arithmetic on subnormals (and 1/d overflows to inf below
# ~2^-121), which GPUs may flush; their f16 scale is 0 (mxfp4: see MXFP4 in kvviz/families/ggml/oracle.py).
TINY = np.float32(2.0**-100)
F16_MAX = 65504.0
IQ4_NL_VALUES = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)
MXFP4_VALUES = (0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12)  # E2M1 values doubled (gguf kvalues)


@dataclass(frozen=True)
class GgmlType:
    name: str
    index: int  # TYPE define of the shaders
    block_bytes: int
    header: int  # bytes of scale / min / exponent at the start of a block
    qh: bool  # a 32-bit high-bit plane after the header (q5_*)
    has_min: bool
    bits: int  # bits of one code
    gguf: str  # gguf.GGMLQuantizationType name

    @property
    def bits_per_element(self) -> float:
        return self.block_bytes * 8 / BLOCK

    def row_bytes(self, head_size: int) -> int:
        return head_size // BLOCK * self.block_bytes

    def words_per_token(self, head_size: int) -> int:
        return -(-self.row_bytes(head_size) // 4)

    def defines(self) -> dict:
        return {"TYPE": self.index, "BPB": self.block_bytes, "HDR": self.header, "QH": int(self.qh),
                "LOG2_UP": log2_up_table_wgsl()}


TYPES = {t.name: t for t in (
    GgmlType("q8_0", 0, 34, 2, False, False, 8, "Q8_0"),
    GgmlType("q4_0", 1, 18, 2, False, False, 4, "Q4_0"),
    GgmlType("q4_1", 2, 20, 4, False, True, 4, "Q4_1"),
    GgmlType("q5_0", 3, 22, 2, True, False, 5, "Q5_0"),
    GgmlType("q5_1", 4, 24, 4, True, True, 5, "Q5_1"),
    GgmlType("iq4_nl", 5, 18, 2, False, False, 4, "IQ4_NL"),
    GgmlType("mxfp4", 6, 17, 1, False, False, 4, "MXFP4"),
)}


# ------------------------------------------------------------------------------ f16 and E8M0
def f16_bits_to_f32(bits) -> np.ndarray:
    return np.asarray(bits, np.uint16).view(np.float16).astype(np.float32)


def e8m0_half(e) -> np.ndarray:
    """2^(e-128) as float32 (ggml_e8m0_to_fp32_half: the MXFP4 scale times 1/2, for the doubled values)."""
    e = np.asarray(e, np.uint32)
    bits = np.where(e < 2, np.uint32(0x00200000) << e, (e - np.uint32(1)) << np.uint32(23)).astype(np.uint32)
    return bits.view(np.float32)


_LOG2_UP = None


def log2_up_table() -> np.ndarray:
    """[256] u32: for an amax with biased float32 exponent be, floor(log2f(amax)) is be - 127, or be - 126
    when amax's 23-bit mantissa is >= table[be] (2^23: never). ggml and gguf compute the MXFP4 exponent
    as floor(log2f(amax)) with a correctly rounded float32 log2, which rounds amax just below a power of
    two (within ~|k| * 2^-24 relative) up to that power; the writer reproduces it from this table.
    Derived from float64 log2 rounded to float32 (checked against numpy's float32 log2 in the tests)."""
    global _LOG2_UP
    if _LOG2_UP is None:
        tab = np.full(256, 1 << 23, np.uint32)
        m = np.arange((1 << 23) - 4096, 1 << 23, dtype=np.uint32)
        for be in range(1, 255):
            x = ((np.uint32(be) << np.uint32(23)) | m).view(np.float32)
            lg = np.log2(x.astype(np.float64)).astype(np.float32)
            up = np.floor(lg) > be - 127
            if up.any():
                tab[be] = m[np.argmax(up)]
        _LOG2_UP = tab
    return _LOG2_UP


def log2_up_table_wgsl() -> str:
    """The table as a WGSL array body, 16 values a line (a define spanning lines is named, not spelled out,
    in shader names and logs)."""
    t = [f"{int(v)}u" for v in log2_up_table()]
    return ",\n".join(", ".join(t[i:i + 16]) for i in range(0, 256, 16))


# ------------------------------------------------------------------------------ records
def rows_to_records(rows: np.ndarray, head_size: int, t: GgmlType) -> np.ndarray:
    """ggml rows [..., D/32 * block_bytes] u8 -> records [..., wpt] u32 (zero padded)."""
    rows = np.ascontiguousarray(rows, np.uint8)
    w = t.words_per_token(head_size)
    pad = np.zeros((*rows.shape[:-1], 4 * w), np.uint8)
    pad[..., : rows.shape[-1]] = rows
    return pad.view(np.uint32).reshape(*rows.shape[:-1], w)


def records_to_rows(records: np.ndarray, head_size: int, t: GgmlType) -> np.ndarray:
    """records [..., wpt] u32 -> ggml rows [..., D/32 * block_bytes] u8 (what gguf.quants.dequantize takes)."""
    r = np.ascontiguousarray(records, np.uint32)
    return r.view(np.uint8).reshape(*r.shape[:-1], 4 * r.shape[-1])[..., : t.row_bytes(head_size)].copy()


def unpack_rows(rows: np.ndarray, head_size: int, t: GgmlType) -> dict:
    """ggml rows -> {"codes": [..., D] int (q8_0: int8 values; others 0..15 / 0..31), "scale": [..., D/32]
    f32 (d; mxfp4: 2^(e-127), the OCP scale), "min": [..., D/32] f32 (q4_1, q5_1), "scale_bits": [..., D/32]
    (f16 bits of d; mxfp4: e)}."""
    nb = head_size // BLOCK
    b = np.ascontiguousarray(rows, np.uint8).reshape(*rows.shape[:-1], nb, t.block_bytes)
    out = {}
    if t.name == "mxfp4":
        e = b[..., 0].astype(np.uint32)
        out["scale_bits"] = e
        out["scale"] = (e8m0_half(e) * np.float32(2)).astype(np.float32)
    else:
        d = b[..., 0:2].copy().view(np.uint16)[..., 0]
        out["scale_bits"] = d.astype(np.uint32)
        out["scale"] = f16_bits_to_f32(d)
        if t.has_min:
            out["min"] = f16_bits_to_f32(b[..., 2:4].copy().view(np.uint16)[..., 0])
    qs = b[..., t.header + (4 if t.qh else 0):]
    if t.name == "q8_0":
        codes = qs.view(np.int8).astype(np.int32)
    else:
        codes = np.concatenate([qs & 0x0F, qs >> 4], axis=-1).astype(np.int32)
        if t.qh:
            qh = b[..., t.header:t.header + 4].copy().view(np.uint32)[..., 0]
            hi = (qh[..., None] >> np.arange(32, dtype=np.uint32)) & np.uint32(1)
            codes = codes | (hi.astype(np.int32) << 4)
    out["codes"] = codes.reshape(*rows.shape[:-1], head_size)
    return out
