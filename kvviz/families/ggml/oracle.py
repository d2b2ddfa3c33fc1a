"""numpy oracle of the llama.cpp block-type caches (q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl, mxfp4).

q8_0, q4_0, q4_1, q5_0, q5_1, mxfp4: the field's own implementation, gguf.quants.quantize (bit exact with
ggml-quants.c's quantize_row_*_ref), over each token's head vector, with two documented exceptions the
GPU writer (shaders/ggml/write.wgsl) also makes:
  * a block whose max |x| is below 2^-100 (kvviz.families.ggml.format.TINY) gets the codes of a block whose
    scale is 0 (ggml's `id = d ? 1/d : 0` with id = 0): q8_0 0, q4_0 8, q5_0 16, q4_1 / q5_1 0, mxfp4 e = 0
    and codes 0. gguf computes those codes from subnormal float32 arithmetic (and from 1/d = inf below
    about 2^-121, where its int8 cast is undefined); their f16 scale is 0 in gguf too, so both dequantise
    to (signed) zero. mxfp4's e = floor(log2 amax) + 125 would be 0..25 there; it is 0 here.
  * q4_1 / q5_1 blocks whose minimum is a zero of both signs: numpy's min picks +0 or -0 depending on
    the SIMD lane the -0 sits in; the GPU takes the total-order minimum (-0 when a -0 is present). Only
    the sign bit of the stored f16 min can differ: codes and dequantised values are identical.
Dequantisation is gguf.quants.dequantize for every type (iq4_nl and mxfp4 included).

iq4_nl: gguf implements only its dequantisation. The quantiser follows llama.cpp's reference
(ggml-quants.c quantize_row_iq4_nl_ref -> quantize_row_iq4_nl_impl with super_block_size = block_size =
32, no importance weights (weight = x^2), ntry = 7, GROUP_MAX_EPS = 1e-15):
    amax, max = the first element of largest |x|; amax < 1e-15 -> scale 0
    d = max/127; id = 1/d; L = best_index(id*x); sumqx = sum w*q*x, sumq2 = sum w*q*q (q = values[L])
    d = sumqx/sumq2, best = d*sumqx
    for itry in -7..7: id = (itry - 127)/max; same sums; if sumq2 > 0 and sumqx^2 > best*sumq2: d, best
    stored d = f16(d); codes = best_index((d ? 1/d : 0) * x) with the float32 d
best_index returns the nearer of the two neighbouring values, the upper one on a tie (x - v[mu-1] <
v[mu] - x is false). Every operation is a single float32 operation in the C order (products left to
right, sums in element order), with no fused multiply-add: llama.cpp's own result depends on whether the
compiler contracts `sumqx += w*q*x` into an fma (GCC does with -ffp-contract=fast on FMA targets), so
this is the unfused reading of its reference. Blocks of max |x| below about 2^-34 sum float32 subnormals
(w*q*x with w = x^2): the GPU matches there on a device that keeps subnormals (lavapipe does; a device
that flushes them may pick another scale for such blocks). Tests: tests/test_ggml_formats.py.
"""
from __future__ import annotations

import gguf
import numpy as np

from kvviz.attention.paged_oracle import per_token_caches, through_f32_decode
from kvviz.families.ggml.format import (  # noqa: F401
    BLOCK,
    IQ4_NL_VALUES,
    TINY,
    TYPES,
    GgmlType,
    records_to_rows,
    rows_to_records,
)

GROUP_MAX_EPS = np.float32(1e-15)
NTRY = 7
_ZERO_CODE = {"q8_0": 0, "q4_0": 8, "q4_1": 0, "q5_0": 16, "q5_1": 0, "mxfp4": 0}


def qtype(t: GgmlType):
    return getattr(gguf.GGMLQuantizationType, t.gguf)


def _blocks(x: np.ndarray) -> np.ndarray:
    x = np.ascontiguousarray(x, np.float32)
    return x.reshape(-1, BLOCK)


def _set_codes(raw: np.ndarray, t: GgmlType, sel: np.ndarray, code: int) -> None:
    """Overwrite the codes of the selected blocks (raw [n, block_bytes] u8) with one code value."""
    off = t.header
    if t.qh:
        raw[sel, off:off + 4] = 0xFF if code >> 4 else 0
        off += 4
    if t.name == "q8_0":
        raw[sel, off:] = np.uint8(code & 0xFF)
    else:
        raw[sel, off:] = np.uint8((code & 0xF) | ((code & 0xF) << 4))


def quantize_blocks(blocks: np.ndarray, t: GgmlType) -> np.ndarray:
    """[n, 32] float32 -> [n, block_bytes] u8, as the GPU writer writes them."""
    b = np.ascontiguousarray(blocks, np.float32).reshape(-1, BLOCK)
    if t.name == "iq4_nl":
        return quantize_iq4_nl(b)
    with np.errstate(over="ignore", invalid="ignore"):  # gguf's MXFP4 errors overflow near float32 max (harmless)
        raw = np.ascontiguousarray(gguf.quants.quantize(b, qtype(t)).reshape(len(b), t.block_bytes))
    amax = np.abs(b).max(axis=-1) if len(b) else np.zeros(0, np.float32)
    tiny = amax < TINY
    if tiny.any():
        _set_codes(raw, t, tiny, _ZERO_CODE[t.name])
        if t.name == "mxfp4":
            raw[tiny, 0] = 0
    if t.has_min:
        ok = np.flatnonzero((b.min(axis=-1) == 0) & np.signbit(b).any(axis=-1))
        raw[ok, 3] = 0x80  # f16 -0 (the low byte is already 0)
    return raw


def quantize_rows(x: np.ndarray, t: GgmlType) -> np.ndarray:
    """[..., D] float32 -> ggml rows [..., D/32 * block_bytes] u8."""
    x = np.asarray(x, np.float32)
    raw = quantize_blocks(x.reshape(-1, BLOCK), t)
    return raw.reshape(*x.shape[:-1], x.shape[-1] // BLOCK * t.block_bytes)


def quantize(x: np.ndarray, t: GgmlType) -> np.ndarray:
    """[..., D] float32 -> records [..., wpt] u32 (the GPU cache words of each token row)."""
    x = np.asarray(x, np.float32)
    return rows_to_records(quantize_rows(x, t), x.shape[-1], t)


def dequantize_rows(rows: np.ndarray, head_size: int, t: GgmlType) -> np.ndarray:
    rows = np.ascontiguousarray(rows, np.uint8)
    if rows.size == 0:
        return np.zeros((*rows.shape[:-1], head_size), np.float32)
    out = gguf.quants.dequantize(rows.reshape(-1, rows.shape[-1]), qtype(t))
    return np.asarray(out, np.float32).reshape(*rows.shape[:-1], head_size)


def dequantize(records: np.ndarray, head_size: int, t: GgmlType) -> np.ndarray:
    """records [..., wpt] u32 -> [..., D] float32 through gguf.quants.dequantize."""
    return dequantize_rows(records_to_rows(records, head_size, t), head_size, t)


# ------------------------------------------------------------------------------------ iq4_nl
_V = np.array(IQ4_NL_VALUES, np.float32)


def best_index(x: np.ndarray) -> np.ndarray:
    """best_index_int8(16, kvalues_iq4nl, x), element-wise (a NaN gives 15, as the C binary search does)."""
    x = np.asarray(x, np.float32)
    ml = np.zeros(x.shape, np.int64)
    mu = np.full(x.shape, 15, np.int64)
    for _ in range(4):
        mav = (ml + mu) // 2
        lower = x < _V[mav]
        mu = np.where(lower, mav, mu)
        ml = np.where(lower, ml, mav)
    with np.errstate(invalid="ignore"):
        pick = np.where((x - _V[mu - 1]).astype(np.float32) < (_V[mu] - x).astype(np.float32), mu - 1, mu)
    return np.where(x <= _V[0], 0, np.where(x >= _V[15], 15, pick))


def _sums(b: np.ndarray, w: np.ndarray, id_: np.ndarray):
    """sumqx, sumq2 over the 32 elements in order (float32, unfused)."""
    sqx = np.zeros(len(b), np.float32)
    sq2 = np.zeros(len(b), np.float32)
    with np.errstate(all="ignore"):
        for j in range(BLOCK):
            q = _V[best_index((id_ * b[:, j]).astype(np.float32))]
            wq = (w[:, j] * q).astype(np.float32)
            sqx = (sqx + (wq * b[:, j]).astype(np.float32)).astype(np.float32)
            sq2 = (sq2 + (wq * q).astype(np.float32)).astype(np.float32)
    return sqx, sq2


def iq4_nl_scales(b: np.ndarray) -> np.ndarray:
    """The float32 scale of each block ([n, 32] -> [n]) from llama.cpp's search (module docstring)."""
    b = np.ascontiguousarray(b, np.float32)
    n = len(b)
    ax = np.abs(b)
    imax = ax.argmax(axis=-1) if n else np.zeros(0, np.int64)
    amax = ax[np.arange(n), imax] if n else np.zeros(0, np.float32)
    mx = b[np.arange(n), imax] if n else np.zeros(0, np.float32)
    live = amax >= GROUP_MAX_EPS
    safe_mx = np.where(live, mx, np.float32(1)).astype(np.float32)
    w = (b * b).astype(np.float32)
    with np.errstate(all="ignore"):
        d = ((-safe_mx) / np.float32(-127)).astype(np.float32)
        id_ = (np.float32(1) / d).astype(np.float32)
        sqx, sq2 = _sums(b, w, id_)
        d = (sqx / sq2).astype(np.float32)
        best = (d * sqx).astype(np.float32)
        for itry in range(-NTRY, NTRY + 1):
            id_ = (np.float32(itry - 127) / safe_mx).astype(np.float32)
            sqx, sq2 = _sums(b, w, id_)
            better = (sq2 > 0) & ((sqx * sqx).astype(np.float32) > (best * sq2).astype(np.float32))
            d = np.where(better, (sqx / sq2).astype(np.float32), d).astype(np.float32)
            best = np.where(better, (d * sqx).astype(np.float32), best).astype(np.float32)
    return np.where(live, d, np.float32(0)).astype(np.float32)


def quantize_iq4_nl(blocks: np.ndarray) -> np.ndarray:
    b = np.ascontiguousarray(blocks, np.float32).reshape(-1, BLOCK)
    d = iq4_nl_scales(b)
    with np.errstate(all="ignore"):
        id_ = np.where(d != 0, (np.float32(1) / np.where(d != 0, d, np.float32(1))).astype(np.float32), np.float32(0))
        L = best_index((id_[:, None] * b).astype(np.float32)).astype(np.uint8)
        dh = d.astype(np.float16).view(np.uint8).reshape(len(b), 2)
    qs = L[:, :16] | (L[:, 16:] << np.uint8(4))
    return np.concatenate([dh, qs], axis=-1).astype(np.uint8)


# ------------------------------------------------------------------------------------ end to end
def reference_attention(method, batch, key, value, q, scale, qkv=None):
    """REFERENCE of the block-type methods: gguf's codes, gguf's dequantisation, the f32 decode's attention
    in float64 (tolerance of kvviz/attention/paged_oracle.py for dequantise + f32 decode methods)."""
    t = method.fmt
    D = key.shape[-1]
    fk, fv = per_token_caches(batch, key, value, lambda x: dequantize(quantize(x, t), D, t))
    return through_f32_decode(batch, q, scale, fk, fv)
