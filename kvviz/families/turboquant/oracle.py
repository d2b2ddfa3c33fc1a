"""numpy reference of TurboQuant (arXiv:2504.19874): the key and value encoders in the kernels' f32
order, the compressor over a cache, the query buffer of tq_rotate_q and the seed's attention.

The format (sign generator, rotation, codebook, packing, cache regions, the estimator) lives in
kvviz/families/turboquant/format.py and is re-exported here for the tests.

Bit exactness. The encoders below reproduce the WGSL kernels (tq_compress.wgsl, tq_rotate_q.wgsl)
operation by operation in float32, in the kernels' order:
  sum of squares: x*x per lane, then a tree over 128 lanes (lanes >= d hold 0), strides 64, 32, ..., 1;
  n = sqrt(sum); k = inv_sqrt_d / n  (inv_sqrt_d = f32(1/sqrt(d)) computed on the host in f64);
  u = (x * k) * s_polar; WHT butterflies; index by comparing with the f32 boundaries;
  r = y - c[idx]; rn = sqrt(tree(r*r)); JL input (r / rn) * s_jl; WHT; bit = (value >= 0).
Every step is one correctly rounded f32 operation (IEEE add/sub/mul/div/sqrt), and multiplications
by a sign (+-1) are exact, so with IEEE arithmetic on the device (lavapipe) the packed words agree bit
for bit. Mathematically `k = inv_sqrt_d / n` folds both scalings of `RHT(x/n)` into one factor; it is
the same transform, rounded differently from a literal `WHT((x/n)*s)/sqrt(d)` (by ~1 ulp), which is
why the reference follows the kernel and not the textbook order. A device with approximate division or
sqrt (WGSL allows 2.5 ulp) or one that contracts a*b+c into an FMA can flip an index where a rotated
coordinate lies within a few ulp of a boundary; `boundary_margin`, `jl_margin` and `f16_rounding_tie`
measure how close they come and `compare_cache` accepts a difference only there. Measured: lavapipe
exact on every word (3 x 65536 keys and values, d = 32/64/128); the H200 (NVIDIA Vulkan) differed on
65536 vectors per head size in 1 index (d=64 and d=128 each, both within 8 steps of a boundary, so that
vector's JL bits and rn changed too), a few JL bits near 0 and 1-13 f16 norm halves at f16 rounding
ties (1 f16 ulp), nothing else (docs/kernels.md, "TurboQuant").

Norms are stored as pack2x16float(n, rn): f16 round-to-nearest-even of the f32 values (numpy's
float32 -> float16 cast is RNE, like LLVM's fptrunc that lavapipe uses for WGSL pack2x16float).

Attention (the seed `flash_attention_tq`'s estimator) is computed in float64 from the packed words:
  score = (n * sum q_rot*c[idx] + n * rn * qjl_scale * (2*sum_{bit=1} q_jl - sum q_jl)) * scale,
  softmax over positions [0, min(pos_q+1, max_seq)), output = RHT^-1(sum_t p_t * vn_t * c[vidx_t]).
The seed's online softmax equals this plain softmax up to rounding.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvviz.attention.paged_oracle import scatter_rows, through_f32_decode
from kvviz.attention.split_decode import quantize_query
from kvviz.families.turboquant.format import (  # noqa: F401 - the format, re-exported for the tests
    DEFAULT_SEED,
    EPS,
    GOLDEN,
    LANES,
    MASK64,
    QJL_SCALES,
    DecodedCache,
    SplitMix64,
    TQParams,
    Xoshiro256StarStar,
    decode_cache,
    dequantize_polar,
    estimate_scores,
    generate_signs,
    inv_sqrt_d,
    jl_seed,
    key_cache_words,
    key_regions,
    layer_signs,
    lloyd_max_2bit,
    pack2x16float,
    pack_1bit,
    pack_2bit,
    qjl_scale_value,
    rht,
    rht_inverse,
    rotate_q_parts,
    seed_words,
    signs_buffer,
    tree_sum_f32,
    unpack2x16float,
    unpack_1bit,
    unpack_2bit,
    value_cache_words,
    wht,
)
from kvviz.paging import PAD_SLOT


# ------------------------------------------------------------------------------------ encoders
def quantize_index(v: np.ndarray, b: np.ndarray) -> np.ndarray:
    """`v < b1 ? (v < b0 ? 0 : 1) : (v < b2 ? 2 : 3)` on f32 values and f32 boundaries."""
    v = np.asarray(v, np.float32)
    b = np.asarray(b, np.float32)
    return np.where(v < b[1], np.where(v < b[0], 0, 1), np.where(v < b[2], 2, 3)).astype(np.uint32)


@dataclass
class EncodedKeys:
    """Per-vector results of the key encoder (leading shape of the input, then d)."""

    polar_words: np.ndarray  # [..., d/16] u32
    jl_words: np.ndarray  # [..., d/32] u32
    norm_words: np.ndarray  # [...] u32 = pack2x16float(n, rn)
    idx: np.ndarray  # [..., d] u8
    jl_bits: np.ndarray  # [..., d] u8
    norm: np.ndarray  # [...] f32 (before f16 rounding)
    residual_norm: np.ndarray  # [...] f32
    rotated: np.ndarray  # [..., d] f32: the rotated unit vector the indices were taken from
    jl_values: np.ndarray  # [..., d] f32: WHT((r/rn) * s_jl), whose signs are the bits


def _norm_and_rotate(x: np.ndarray, p: TQParams):
    x = np.asarray(x, np.float32)
    if x.shape[-1] != p.head_size:
        raise ValueError(f"last axis must be {p.head_size}, got {x.shape}")
    sp, _ = p.signs
    n = np.sqrt(tree_sum_f32(x * x)).astype(np.float32)
    zero = n < EPS
    safe = np.where(zero, np.float32(1.0), n).astype(np.float32)
    k = (inv_sqrt_d(p.head_size) / safe).astype(np.float32)
    u = ((x * k[..., None]).astype(np.float32) * sp).astype(np.float32)
    y = wht(u)
    return n, zero, y


def encode_keys(k: np.ndarray, p: TQParams) -> EncodedKeys:
    """Key encoder, float32 in the kernel's order. k: [..., d] f32."""
    n, zero, y = _norm_and_rotate(k, p)
    c, b = p.centroids, p.boundaries
    idx = quantize_index(y, b)
    r = (y - c[idx]).astype(np.float32)
    rn = np.sqrt(tree_sum_f32(r * r)).astype(np.float32)
    nores = rn < EPS
    safe_rn = np.where(nores, np.float32(1.0), rn).astype(np.float32)
    _, sj = p.signs
    jl_in = ((r / safe_rn[..., None]).astype(np.float32) * sj).astype(np.float32)
    jl = wht(jl_in)
    bits = (jl >= 0).astype(np.uint8)
    polar_words = pack_2bit(idx)
    jl_words = pack_1bit(bits)
    norm_words = pack2x16float(n, rn)
    polar_words[zero] = 0
    jl_words[zero | nores] = 0
    norm_words[zero] = 0
    idx = idx.astype(np.uint8)
    idx[zero] = 0
    bits[zero | nores] = 0
    return EncodedKeys(polar_words, jl_words, norm_words, idx, bits, n, rn, y, jl)


@dataclass
class EncodedValues:
    polar_words: np.ndarray  # [..., d/16] u32
    norm_words: np.ndarray  # [...] u32 = pack2x16float(n, 0)
    idx: np.ndarray  # [..., d] u8
    norm: np.ndarray  # [...] f32
    rotated: np.ndarray  # [..., d] f32


def encode_values(v: np.ndarray, p: TQParams) -> EncodedValues:
    """Value encoder (PolarQuant part only), float32 in the kernel's order."""
    n, zero, y = _norm_and_rotate(v, p)
    idx = quantize_index(y, p.boundaries)
    polar_words = pack_2bit(idx)
    norm_words = pack2x16float(n, np.zeros_like(n))
    polar_words[zero] = 0
    norm_words[zero] = 0
    idx = idx.astype(np.uint8)
    idx[zero] = 0
    return EncodedValues(polar_words, norm_words, idx, n, y)


def boundary_margin(rotated: np.ndarray, p: TQParams) -> np.ndarray:
    """Distance of each rotated coordinate to the nearest decision boundary, in units of one f32 ulp of
    1/sqrt(d) (the typical coordinate size, so about the absolute rounding step of the butterflies).
    Where this is a few units, a device that rounds a step differently (approximate division or sqrt,
    FMA contraction, another reduction order) may legitimately pick the neighbouring index."""
    y = np.asarray(rotated, np.float64)
    b = p.boundaries.astype(np.float64)
    dist = np.min(np.abs(y[..., None] - b), axis=-1)
    return dist / float(np.spacing(inv_sqrt_d(p.head_size)))


def jl_margin(jl_values: np.ndarray) -> np.ndarray:
    """|WHT((r/rn) * s_jl)| in units of one f32 ulp of 1.0 (the entries have unit variance): a value
    within a few units of 0 is a sign tie that another rounding could flip."""
    return np.abs(np.asarray(jl_values, np.float64)) / float(np.spacing(np.float32(1.0)))


# ------------------------------------------------------------------------------------ cache
def compress_cache(keys, values, cache_cap: int, p: TQParams, start_pos: int = 0, k_cache=None, v_cache=None):
    """Oracle of the compressor for one sequence: keys/values [tokens, kv_heads, d] written at positions
    start_pos.. of caches holding `cache_cap` positions. Returns (k_cache, v_cache) u32 word arrays;
    untouched words stay as given (zeros for new caches)."""
    keys = np.asarray(keys, np.float32)
    values = np.asarray(values, np.float32)
    T, kvh, d = keys.shape
    if k_cache is None:
        k_cache = np.zeros(key_cache_words(kvh, cache_cap, d), np.uint32)
    if v_cache is None:
        v_cache = np.zeros(value_cache_words(kvh, cache_cap, d), np.uint32)
    ek = encode_keys(keys, p)
    ev = encode_values(values, p)
    jl_off, norm_off = key_regions(kvh, cache_cap, d)
    pw, jw = d // 16, d // 32
    v_norm_off = kvh * cache_cap * pw
    for h in range(kvh):
        slots = h * cache_cap + start_pos + np.arange(T)
        k_cache[(slots[:, None] * pw + np.arange(pw)).ravel()] = ek.polar_words[:, h].ravel()
        k_cache[(jl_off + slots[:, None] * jw + np.arange(jw)).ravel()] = ek.jl_words[:, h].ravel()
        k_cache[norm_off + slots] = ek.norm_words[:, h]
        v_cache[(slots[:, None] * pw + np.arange(pw)).ravel()] = ev.polar_words[:, h].ravel()
        v_cache[v_norm_off + slots] = ev.norm_words[:, h]
    return k_cache, v_cache


def f16_rounding_tie(x: np.ndarray, ulps: int = 4) -> np.ndarray:
    """Where an f32 value lies within `ulps` f32 ulps of an f16 rounding midpoint, so that a value one
    f32 ulp away (another sqrt, another summation order) may round to the neighbouring f16."""
    x = np.asarray(x, np.float64)
    delta = ulps * 2.0 ** -23
    lo = (x * (1 - delta)).astype(np.float32).astype(np.float16)
    hi = (x * (1 + delta)).astype(np.float32).astype(np.float16)
    return lo != hi


def compare_cache(k_gpu, v_gpu, keys, values, cache_cap: int, p: TQParams, start_pos: int = 0, margin: float = 8.0) -> dict:
    """Compare device cache words with the oracle's for keys/values [T, kvh, d] written at start_pos.

    Exact agreement is expected with IEEE arithmetic. A difference is *explained* only where rounding
    may legitimately decide it: an index whose rotated coordinate is within `margin` steps of a
    boundary (`boundary_margin`; such a vector's residual, and so its JL bits and rn, change too), a JL
    bit whose value is within `margin` steps of 0 (`jl_margin`), or a norm half-word one f16 step away
    where the f32 norm sits at an f16 rounding tie (`f16_rounding_tie`). Returns counts; `unexplained`
    must be 0."""
    keys = np.asarray(keys, np.float32)
    values = np.asarray(values, np.float32)
    T, kvh, d = keys.shape
    ok, ov = compress_cache(keys, values, cache_cap, p, start_pos)
    g = decode_cache(k_gpu, v_gpu, kvh, cache_cap, d)
    o = decode_cache(ok, ov, kvh, cache_cap, d)
    ek, ev = encode_keys(keys, p), encode_values(values, p)
    sl = slice(start_pos, start_pos + T)

    def tr(a):  # [kvh, T, ...] -> [T, kvh, ...]
        return np.swapaxes(a, 0, 1)

    k_idx_d = tr(g.k_idx[:, sl] != o.k_idx[:, sl])
    v_idx_d = tr(g.v_idx[:, sl] != o.v_idx[:, sl])
    k_tie = boundary_margin(ek.rotated, p) <= margin
    v_tie = boundary_margin(ev.rotated, p) <= margin
    flipped = (k_idx_d & k_tie).any(-1)  # vectors whose residual legitimately changed
    jl_d = tr(g.k_bits[:, sl] != o.k_bits[:, sl])
    jl_tie = jl_margin(ek.jl_values) <= margin

    def half_diff(gw, ow, x, shift):
        a = ((tr(gw[:, sl]) >> shift) & 0xFFFF).astype(np.int64)
        b = ((tr(ow[:, sl]) >> shift) & 0xFFFF).astype(np.int64)
        diff = a != b
        ok_ = diff & (np.abs(a - b) == 1) & f16_rounding_tie(x)
        return diff, ok_

    n_d, n_ok = half_diff(g.k_norm_words, o.k_norm_words, ek.norm, 0)
    rn_d, rn_ok = half_diff(g.k_norm_words, o.k_norm_words, ek.residual_norm, 16)
    vn_d, vn_ok = half_diff(g.v_norm_words, o.v_norm_words, ev.norm, 0)
    vhi = ((tr(g.v_norm_words[:, sl]) >> 16) != (tr(o.v_norm_words[:, sl]) >> 16))
    unexplained = (
        (k_idx_d & ~k_tie).sum() + (v_idx_d & ~v_tie).sum()
        + (jl_d & ~jl_tie & ~flipped[..., None]).sum()
        + (n_d & ~n_ok).sum() + (rn_d & ~rn_ok & ~flipped).sum() + (vn_d & ~vn_ok).sum() + vhi.sum()
    )
    # words outside the written positions must be untouched (zeros / the oracle's zeros)
    outside = np.ones(cache_cap, bool)
    outside[sl] = False
    untouched = int((g.k_polar_words[:, outside] != 0).sum() + (g.k_jl_words[:, outside] != 0).sum()
                    + (g.k_norm_words[:, outside] != 0).sum() + (g.v_polar_words[:, outside] != 0).sum()
                    + (g.v_norm_words[:, outside] != 0).sum())
    return {
        "exact": bool(np.array_equal(np.asarray(k_gpu), ok) and np.array_equal(np.asarray(v_gpu), ov)),
        "coords": int(k_idx_d.size),
        "k_idx_diff": int(k_idx_d.sum()),
        "v_idx_diff": int(v_idx_d.sum()),
        "jl_diff": int(jl_d.sum()),
        "norm_diff": int(n_d.sum() + vn_d.sum()),
        "rnorm_diff": int(rn_d.sum()),
        "near_boundary": int(k_tie.sum() + v_tie.sum()),
        "near_jl_zero": int(jl_tie.sum()),
        "unexplained": int(unexplained) + untouched,
    }


# ------------------------------------------------------------------------------------ queries
def rotate_q(q: np.ndarray, p: TQParams, q_cap: int | None = None) -> np.ndarray:
    """tq_rotate_q oracle: q [n_q, n_heads, d] f32 -> buffer [q_rot | q_jl | sums] f32, with
    region = q_cap * n_heads * d and sums at 2*region + q*n_heads + h. float32, kernel order:
    q_rot = WHT(q*s) * inv_sqrt_d; q_jl = WHT(q_rot * s_jl) * inv_sqrt_d; sums = tree(q_jl)."""
    q = np.asarray(q, np.float32)
    nq, H, d = q.shape
    q_cap = nq if q_cap is None else q_cap
    q_rot, q_jl, sums = rotate_q_parts(q, p)
    region = q_cap * H * d
    out = np.zeros(2 * region + q_cap * H, np.float32)
    out[: nq * H * d] = q_rot.ravel()
    out[region : region + nq * H * d] = q_jl.ravel()
    out[2 * region : 2 * region + nq * H] = sums.ravel()
    return out


# ------------------------------------------------------------------------------------ attention
def attention_oracle(
    q: np.ndarray,
    k_cache: np.ndarray,
    v_cache: np.ndarray,
    n_kv_heads: int,
    cache_cap: int,
    start_pos: int,
    max_seq: int,
    scale: float,
    p: TQParams,
    qjl_scale: float | str = "reference",
    return_weights: bool = False,
    qk: str = "f32",
):
    """The seed flash_attention_tq's result in float64. q [n_queries, n_heads, d] f32 (unrotated; the
    f32 rotation of `rotate_q` is applied, as on the GPU). Query j sits at position start_pos + j and
    attends over [0, min(start_pos + j + 1, max_seq)). Returns out [n_queries, n_heads, d] (and the
    softmax weights [n_queries, n_heads, max_seq] when return_weights). qk "i8": the rotated query as the int8-query
    decode takes it (int8_query: q_rot and q_jl each quantised to int8, one scale a head)."""
    q = np.asarray(q, np.float32)
    nq, H, d = q.shape
    if isinstance(qjl_scale, str):
        qjl_scale = qjl_scale_value(qjl_scale, d)
    qjl_scale = float(np.float32(qjl_scale))  # the kernel receives it as f32 bits
    scale = float(np.float32(scale))
    dec = decode_cache(k_cache, v_cache, n_kv_heads, cache_cap, d)
    q_rot, q_jl, sums = rotate_q_parts(q, p)
    if qk == "i8":
        q_rot, q_jl = int8_query(q_rot), int8_query(q_jl)
        sums = q_jl.sum(axis=-1)
    c = p.centroids.astype(np.float64)
    sp, _ = p.signs
    group = H // n_kv_heads
    out = np.zeros((nq, H, d))
    weights = np.zeros((nq, H, max(max_seq, 0)))
    for j in range(nq):
        L = min(start_pos + j + 1, max_seq)
        if L <= 0:
            continue
        for h in range(H):
            kvh = h // group
            s = estimate_scores(
                q_rot[j, h], q_jl[j, h], sums[j, h], dec.k_idx[kvh, :L], dec.k_bits[kvh, :L],
                dec.k_norm[kvh, :L], dec.k_rnorm[kvh, :L], p, qjl_scale,
            ) * scale
            e = np.exp(s - s.max())
            w = e / e.sum()
            weights[j, h, :L] = w
            acc = (w * dec.v_norm[kvh, :L].astype(np.float64)) @ c[dec.v_idx[kvh, :L]]
            out[j, h] = rht_inverse(acc, sp)
    return (out, weights) if return_weights else out


def paged_sequence_words(k_cache: np.ndarray, v_cache: np.ndarray, batch, seq: int, d: int):
    """Sequence `seq`'s words of a PAGED seed-configuration cache (k_cache [num_blocks, kvh, block_size, WK],
    v_cache [.., WV] u32, the records gathered through its block table) in the per-sequence seed layout of
    max(L, 1) positions: what attention_oracle reads."""
    L = int(batch.context_lens[seq])
    t = np.arange(L)
    blocks = np.asarray(batch.block_tables[seq], np.int64)[t // batch.block_size]
    kr = np.asarray(k_cache)[blocks, :, t % batch.block_size]  # [L, kvh, WK]
    vr = np.asarray(v_cache)[blocks, :, t % batch.block_size]
    return seed_words(kr, vr, d)


def int8_query(x: np.ndarray) -> np.ndarray:
    """float64 [..., H, d]: x [..., H, d] f32 as the int8-query decodes take a query (split_decode.quantize_query:
    int8 codes, one f32 scale a head, round half to even), codes times scale."""
    codes, scales = quantize_query(np.asarray(x, np.float32))
    return codes.astype(np.float64) * scales.astype(np.float64)[..., None]


def paged_attention_oracle(q, k_cache, v_cache, batch, scale: float, p: TQParams, qjl_scale="reference",
                           qk: str = "f32") -> np.ndarray:
    """The fast paged TurboQuant decode's reference, float64 [S, H, d]: per sequence, attention_oracle (the seed
    kernel's estimator, softmax and inverse rotation) at its last position over the records its block table names
    (0 for a sequence without tokens). qk "i8": the int8-query variant's (attention_oracle's qk)."""
    q = np.asarray(q, np.float32)
    S, H, d = q.shape
    kvh = np.asarray(k_cache).shape[1]
    out = np.zeros((S, H, d))
    for s in range(S):
        L = int(batch.context_lens[s])
        if L == 0:
            continue
        kw, vw = paged_sequence_words(k_cache, v_cache, batch, s, d)
        out[s] = attention_oracle(q[s:s + 1], kw, vw, kvh, L, L - 1, L, scale, p, qjl_scale, qk=qk)[0]
    return out


def exact_attention(q, keys, values, start_pos: int, max_seq: int, scale: float) -> np.ndarray:
    """Plain causal softmax attention in float64 over uncompressed keys/values [T, kvh, d]."""
    q = np.asarray(q, np.float64)
    K = np.asarray(keys, np.float64)
    V = np.asarray(values, np.float64)
    nq, H, d = q.shape
    group = H // K.shape[1]
    out = np.zeros((nq, H, d))
    for j in range(nq):
        L = min(start_pos + j + 1, max_seq)
        for h in range(H):
            kvh = h // group
            s = K[:L, kvh] @ q[j, h] * scale
            e = np.exp(s - s.max())
            out[j, h] = (e / e.sum()) @ V[:L, kvh]
    return out


# ====================================================================================== general settings
# The compressor and dequantiser of the paper's settings (kvviz/families/turboquant/format.py "general settings";
# shaders turboquant/tq_general_{compress,dequant}.wgsl), float32 in the kernels' order.
from kvviz.families.turboquant.format import (  # noqa: E402,F401
    TQSettings,
    choose_channels,
    dequantize_general,
    pack_bits,
    qjl_scale_general,
    rotation_size,
    tree_sum_lanes,
    unpack_bits,
    unpack_general,
)


@dataclass
class EncodedInstance:
    idx: np.ndarray  # [..., P] u8
    jl_bits: np.ndarray | None  # [..., P] u8
    norm: np.ndarray  # [...] f32
    rnorm: np.ndarray  # [...] f32 (0 for values)
    rotated: np.ndarray  # [..., P] f32: the rotated unit vector the indices come from
    jl_values: np.ndarray | None


def encode_instance(x: np.ndarray, chans: np.ndarray, ins, keys: bool) -> EncodedInstance:
    """One instance of x [rows, kvh, d] with the channel table [kvh, d]."""
    x = np.asarray(x, np.float32)
    T, kvh, d = x.shape
    P = ins.P
    sub = np.zeros((T, kvh, P), np.float32)
    for h in range(kvh):
        sub[:, h, : ins.n_ch] = x[:, h, np.asarray(chans[h, ins.chan_off : ins.chan_off + ins.n_ch], np.int64)]
    sp, sj = ins.signs
    inv = inv_sqrt_d(P)
    n = np.sqrt(tree_sum_lanes(sub * sub)).astype(np.float32)
    zero = n < EPS
    k = (inv / np.where(zero, np.float32(1.0), n)).astype(np.float32)
    y = wht(((sub * k[..., None]).astype(np.float32) * sp).astype(np.float32))
    c, b = ins.codebook
    idx = (y[..., None] >= b).sum(-1).astype(np.uint8)  # number of boundaries <= y
    r = (y - c[idx]).astype(np.float32)
    if keys:
        rn = np.sqrt(tree_sum_lanes(r * r)).astype(np.float32)
        nores = rn < EPS
        jl = wht(((r / np.where(nores, np.float32(1.0), rn)[..., None]).astype(np.float32) * sj).astype(np.float32))
        bits = (jl >= 0).astype(np.uint8)
        bits[zero | nores] = 0
    else:
        rn, jl, bits = np.zeros_like(n), None, None
    idx[zero] = 0
    return EncodedInstance(idx, bits, n, rn, y, jl)


def compress_general(x: np.ndarray, chans: np.ndarray, st: TQSettings, which: str):
    """Records [rows, kvh, wpt] u32 of x [rows, kvh, d] (K or V) and the per-instance encodings."""
    x = np.asarray(x, np.float32)
    T, kvh, _ = x.shape
    rec = np.zeros((T, kvh, st.wpt(which)), np.uint32)
    encs = []
    for ins in st.instances(which):
        e = encode_instance(x, chans, ins, which == "K")
        zero = e.norm < EPS
        cw = pack_bits(e.idx, ins.bits)
        cw[zero] = 0
        rec[..., ins.code_off : ins.code_off + ins.code_words] = cw
        if which == "K":
            rec[..., ins.jl_off : ins.jl_off + ins.P // 32] = pack_1bit(e.jl_bits)
        nw = pack2x16float(e.norm, e.rnorm)
        nw[zero] = 0
        rec[..., ins.norm_off] = nw
        encs.append(e)
    return rec, encs


def general_caches(method, batch, key, value):
    """(settings, channel tables (K, V), K records, V records, dequantised K, V [rows, kvh, d] f32) of a
    general-settings TurboQuant method on a batch: what its kernels must produce (real rows only)."""
    key = np.asarray(key, np.float32)
    value = np.asarray(value, np.float32)
    st = method.settings(key.shape[2])
    real = np.asarray(batch.slot_mapping, np.int64) != PAD_SLOT
    ck = choose_channels(key[real], st.n_outliers)
    cv = choose_channels(value[real], st.n_outliers)
    kr, _ = compress_general(key, ck, st, "K")
    vr, _ = compress_general(value, cv, st, "V")
    kr[~real] = 0
    vr[~real] = 0
    fk = dequantize_general(kr, ck, st, "K", method.qjl_scale)
    fv = dequantize_general(vr, cv, st, "V")
    return st, (ck, cv), kr, vr, fk, fv


def general_attention(method, batch, key, value, q, scale, qkv=None):
    """End-to-end reference of the general settings: the oracle's dequantised caches (keys carrying the
    QJL estimate) through the f32 paged decode's arithmetic; tolerance 2e-5 * max(1, max|V^|)."""
    _, _, _, _, fk, fv = general_caches(method, batch, key, value)
    return through_f32_decode(batch, q, scale, scatter_rows(batch, fk.astype(np.float64)),
                               scatter_rows(batch, fv.astype(np.float64)))


def method_attention(method, batch, key, value, q, scale, qkv=None):
    """The TurboQuant method's end-to-end reference: the seed estimator (kvviz/attention/paged_oracle.py) for the seed
    configuration, `general_attention` for every other setting."""
    if method.settings(np.asarray(key).shape[2]).is_seed:

        return turboquant_attention(method, batch, key, value, q, scale, qkv)
    return general_attention(method, batch, key, value, q, scale, qkv)


def turboquant_attention(method, batch, key, value, q, scale, qkv=None, qk: str = "f32"):
    """The seed flash kernel's estimator in float64, per sequence (qk "i8": of the query as the int8-query decode
    takes it, attention_oracle's qk).

    With `qkv` (the GPU's QuantizedKV) the estimator runs over the words the GPU compressor wrote. Its
    2-bit index can legitimately flip where a rotated coordinate sits within float rounding of a
    centroid boundary (about 1e-6 of coordinates on an H200), which moves a score by more than the
    attention tolerance; the compressor's words are held to the oracle, with that allowance, in
    tests/test_turboquant.py.
    """
    p = method.params(key.shape[2])
    S, H, D = q.shape
    out = np.zeros((S, H, D), np.float64)
    words = qkv.extra["words"] if qkv is not None else None
    for s in range(batch.num_seqs):
        rows = batch.token_rows(s)
        L = len(rows)
        if L == 0:
            continue
        if words is not None:
            kc, vc = words[s]
        else:
            kc, vc = compress_cache(key[rows], value[rows], max(L, 1), p)
        o = attention_oracle(q[s][None], kc, vc, key.shape[1], max(L, 1), L - 1, L, scale, p, method.qjl_scale, qk=qk)
        out[s] = np.asarray(o).reshape(H, D)
    return out, 1e-5 + 1e-4 * float(np.abs(out).max(initial=0))
