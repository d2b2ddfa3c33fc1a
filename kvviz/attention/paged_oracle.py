"""numpy oracles of the paged cache kernels (int8 seed writer/decode, f32 baseline writer/decode).

The int8 quantiser is reproduced operation by operation in float32, as the kernel does it:
amax = max|x|, inv = 127/amax (a float32 division), code = clamp(round(x * inv), -127, 127),
scale = amax/127 (1.0 when amax == 0). Rounding: numpy rounds half to even, like WGSL `round`;
GLSL `round` leaves exact .5 ties to the implementation, so conformance tests accept a one-code
difference only where x*inv is within float32 rounding of a .5 tie (`tie_mask`).

Decode is computed in float64 from the exact dequantised cache contents; the kernel accumulates in
float32, so its outputs agree to a stated tolerance (see tests/test_paged_conformance.py).
"""
from __future__ import annotations

import numpy as np

from kvviz.attention.int8_records import pack_records as pack_int8_words
from kvviz.attention.int8_records import unpack_records as unpack_int8_words
from kvviz.paging import PAD_SLOT

QMAX = np.float32(127.0)


def quantize_int8_per_token(x: np.ndarray):
    """x [..., D] f32 -> (codes int8 [..., D], scales f32 [...], pre-round values f32 [..., D])."""
    x = np.asarray(x, dtype=np.float32)
    amax = np.abs(x).max(axis=-1)
    safe = np.where(amax > 0, amax, np.float32(1.0))
    inv = np.where(amax > 0, QMAX / safe, np.float32(0.0)).astype(np.float32)
    pre = (x * inv[..., None]).astype(np.float32)
    codes = np.clip(np.rint(pre), -127, 127).astype(np.int8)
    scales = np.where(amax > 0, amax / QMAX, np.float32(1.0)).astype(np.float32)
    return codes, scales, pre


def tie_mask(pre: np.ndarray, rel: float = 4e-7) -> np.ndarray:
    """Where x*inv sits at (or within float32 rounding of) a .5 tie: one code either way is correct."""
    frac = np.abs(pre - np.floor(pre) - np.float32(0.5))
    return frac <= rel * np.maximum(np.abs(pre), 1.0)


def write_cache_int8(cache: np.ndarray, key: np.ndarray, slot_mapping: np.ndarray, block_size: int) -> np.ndarray:
    """Oracle of reshape_and_cache_q8 for one of K or V.

    cache [num_blocks, kv_heads, block_size, D/4+1] u32 (modified copy returned);
    key [tokens, kv_heads, D] f32; slot_mapping [tokens] u32 (PAD_SLOT skipped).
    """
    out = cache.copy()
    codes, scales, _ = quantize_int8_per_token(key)
    recs = pack_int8_words(codes, scales).astype(np.uint32)
    for t, slot in enumerate(np.asarray(slot_mapping, dtype=np.uint32)):
        if slot == PAD_SLOT:
            continue
        out[slot // block_size, :, slot % block_size, :] = recs[t]
    return out


def write_cache_f32(cache: np.ndarray, key: np.ndarray, slot_mapping: np.ndarray, block_size: int) -> np.ndarray:
    out = cache.copy()
    sm = np.asarray(slot_mapping, dtype=np.uint32)
    real = sm != PAD_SLOT
    s = sm[real].astype(np.int64)
    out[s // block_size, :, s % block_size, :] = key[real]
    return out


def dequantize_cache_int8(cache: np.ndarray) -> np.ndarray:
    """[num_blocks, kv_heads, block_size, D/4+1] u32 -> [num_blocks, kv_heads, block_size, D] f64 (exact)."""
    codes, scales = unpack_int8_words(cache)
    return codes.astype(np.float64) * scales.astype(np.float64)[..., None]


def gather_sequence(cache_f: np.ndarray, block_table: np.ndarray, context_len: int, block_size: int) -> np.ndarray:
    """Dense [kv_heads, context_len, D] view of one sequence out of a (dequantised) paged cache."""
    t = np.arange(context_len)
    blocks = np.asarray(block_table, dtype=np.int64)[t // block_size]
    return cache_f[blocks, :, t % block_size, :].transpose(1, 0, 2)


def decode_weights(q, k_cache_f, block_tables, context_lens, block_size, scale, max_context_len=None):
    """Attention weights [num_seqs, num_heads, max_ctx] with the kernels' normaliser (sum + 1e-6).

    q [num_seqs, num_heads, D]; k_cache_f: dequantised cache [num_blocks, kv_heads, block_size, D].
    """
    q = np.asarray(q, dtype=np.float64)
    S, H, D = q.shape
    kvh = k_cache_f.shape[1]
    ctx = np.minimum(np.asarray(context_lens, dtype=np.int64), max_context_len or np.iinfo(np.int64).max)
    width = int(max_context_len if max_context_len is not None else (ctx.max() if S else 0))
    out = np.zeros((S, H, width), dtype=np.float64)
    for s in range(S):
        n = int(ctx[s])
        if n == 0:
            continue
        k = gather_sequence(k_cache_f, block_tables[s], n, block_size)  # [kvh, n, D]
        for h in range(H):
            logits = scale * (k[h // (H // kvh)] @ q[s, h])
            e = np.exp(logits - logits.max())
            out[s, h, :n] = e / (e.sum() + 1e-6)
    return out


def decode(q, k_cache_f, v_cache_f, block_tables, context_lens, block_size, scale, max_context_len=None):
    """Paged decode output [num_seqs, num_heads, D] in float64 from dequantised caches."""
    w = decode_weights(q, k_cache_f, block_tables, context_lens, block_size, scale, max_context_len)
    S, H, _ = w.shape
    D = np.asarray(q).shape[-1]
    kvh = v_cache_f.shape[1]
    out = np.zeros((S, H, D), dtype=np.float64)
    for s in range(S):
        n = int(np.count_nonzero(np.arange(w.shape[2]) < min(int(context_lens[s]), w.shape[2])))
        if n == 0:
            continue
        v = gather_sequence(v_cache_f, block_tables[s], n, block_size)
        for h in range(H):
            out[s, h] = w[s, h, :n] @ v[h // (H // kvh)]
    return out


def division_ulps(adapter_summary) -> int:
    """ULPs a kernel's f32 division may be off on this adapter.

    SPIR-V's OpFDiv is only required to be within 2.5 ULP in Vulkan; lavapipe divides exactly, the
    NVIDIA driver does not (the seed's amax/127 scale differed by 1 ULP on an H200). 0 on software
    adapters, 3 elsewhere.
    """
    return 0 if adapter_summary.is_software else 3


def ulp_diff_f32(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Distance in units in the last place between float32 arrays of the same sign."""
    ai = np.asarray(a, np.float32).view(np.int32).astype(np.int64)
    bi = np.asarray(b, np.float32).view(np.int32).astype(np.int64)
    return np.abs(ai - bi)


def compare_int8_cache(got: np.ndarray, key: np.ndarray, slot_mapping: np.ndarray, block_size: int,
                       scale_ulps: int = 0, fill: int = 0) -> dict:
    """GPU int8 cache vs the oracle over the slots the batch writes.

    Codes must be equal except one code where x*127/amax is at (or within float rounding of) a .5
    tie; scales within `scale_ulps` ULP (0 = bit-equal). Returns counts and an `ok` verdict.
    """
    ref = write_cache_int8(np.full_like(got, fill), key, slot_mapping, block_size)
    sm = np.asarray(slot_mapping).astype(np.int64)
    real = sm != PAD_SLOT
    blk, off = sm[real] // block_size, sm[real] % block_size
    used = np.zeros(got.shape[:3], dtype=bool)
    used[blk, :, off] = True
    gc, gs = unpack_int8_words(got[used])
    rc, rs = unpack_int8_words(ref[used])
    _, _, pre = quantize_int8_per_token(key[real])
    tie_c = np.zeros(got.shape[:3] + (gc.shape[-1],), dtype=bool)
    tie_c[blk, :, off] = tie_mask(pre)
    tie = tie_c[used]
    diff = np.abs(gc.astype(np.int32) - rc.astype(np.int32))
    ulps = ulp_diff_f32(gs, rs)
    untouched_ok = bool((got[~used] == fill).all())
    res = {
        "codes": int(diff.size),
        "code_max_diff": int(diff.max(initial=0)),
        "code_mismatch_at_ties": int(np.count_nonzero(diff[tie])),
        "code_mismatch_not_tie": int(np.count_nonzero(diff[~tie])),
        "scales": int(gs.size),
        "scale_max_ulp": int(ulps.max(initial=0)),
        "scale_mismatch": int(np.count_nonzero(ulps)),
        "untouched_slots_kept": untouched_ok,
    }
    res["ok"] = (res["code_max_diff"] <= 1 and res["code_mismatch_not_tie"] == 0
                 and res["scale_max_ulp"] <= scale_ulps and untouched_ok)
    return res


def scatter_rows(batch, per_row: np.ndarray) -> np.ndarray:
    """[tokens, kvh, D] values in token-row order -> paged [num_blocks, kvh, block_size, D] float64."""
    T, kvh, D = per_row.shape
    out = np.zeros((batch.num_blocks, kvh, batch.block_size, D), np.float64)
    sm = batch.slot_mapping.astype(np.int64)
    real = sm != PAD_SLOT
    out[sm[real] // batch.block_size, :, sm[real] % batch.block_size] = per_row[real]
    return out


def per_token_caches(batch, key, value, dequantise):
    """(K, V) paged float64 caches from a per-row dequantiser [tokens, kvh, D] -> [tokens, kvh, D]."""
    return tuple(scatter_rows(batch, np.asarray(dequantise(x), np.float64)) for x in (key, value))


def through_f32_decode(batch, q, scale, fk, fv):
    """Attention over dequantised caches, the way the f32 paged decode runs it, and its tolerance."""
    ref = decode(q, fk, fv, batch.block_tables, batch.context_lens, batch.block_size, scale)
    return ref, 2e-5 * max(1.0, float(np.abs(fv).max(initial=0)))
