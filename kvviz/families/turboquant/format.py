"""TurboQuant's bit format (arXiv:2504.19874): the sign generator, the randomized Hadamard rotation,
the 2-bit Lloyd-Max codebook, the packed cache regions and the estimator that reads them.

Conventions (docs/kernels.md, "TurboQuant"; the GPU side is shaders/turboquant/):

- Signs: xoshiro256** whose 4 state words come from SplitMix64, seeded with `seed ^ layer`; the polar
  signs from that seed, the JL signs from `seed' * 0x9E3779B97F4A7C15 + 1` (wrapping u64), where
  seed' = seed ^ layer; sign = +1 if `next_u64() & 1` else -1. The signs buffer holds per layer
  `[polar(d) | jl(d)]` f32, so a layer's signs start at `layer * 2d`.
- RHT: `y = WHT(x * s) / sqrt(d)`, butterfly (a+b, a-b) at strides 1, 2, 4, ...; inverse
  `WHT(y / sqrt(d)) * s`.
- Centroids: 2-bit Lloyd-Max on the coordinate density of a rotated unit vector,
  proportional to (1-x^2)^((d-3)/2) on [-1, 1], computed here by Gauss-Legendre quadrature.
- Words: polar indices 16 a word (element j at bits 2j, LSB first), JL bits 32 a word (element j at
  bit j), norms as pack2x16float(n, rn) (f16 round to nearest even; values: pack2x16float(n, 0)).
- Cache of one sequence, `cache_cap` positions for every KV head, slot = kv_head * cache_cap + t:
  keys [polar | jl | norms], values [polar | norms].

`d` below is the head size.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from statistics import NormalDist

import numpy as np

MASK64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15
DEFAULT_SEED = 42
EPS = np.float32(1e-12)  # below this a vector (or residual) is treated as zero
LANES = 128  # workgroup size of the compress / rotate kernels; reductions are trees over 128 lanes
QJL_SCALES = ("reference", "unbiased")


# ------------------------------------------------------------------------------------ generator
class SplitMix64:
    """Vigna's SplitMix64 (state += golden gamma, then the murmur-style mix)."""

    def __init__(self, seed: int):
        self.state = int(seed) & MASK64

    def next_u64(self) -> int:
        self.state = (self.state + GOLDEN) & MASK64
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
        return z ^ (z >> 31)


def _rotl(x: int, k: int) -> int:
    return ((x << k) | (x >> (64 - k))) & MASK64


class Xoshiro256StarStar:
    """xoshiro256** 1.0 (Blackman & Vigna), state from four SplitMix64 outputs unless given."""

    def __init__(self, seed: int | None = None, state=None):
        if state is not None:
            self.s = [int(v) & MASK64 for v in state]
        else:
            sm = SplitMix64(seed)
            self.s = [sm.next_u64() for _ in range(4)]

    def next_u64(self) -> int:
        s = self.s
        result = (_rotl((s[1] * 5) & MASK64, 7) * 9) & MASK64
        t = (s[1] << 17) & MASK64
        s[2] ^= s[0]
        s[3] ^= s[1]
        s[1] ^= s[2]
        s[0] ^= s[3]
        s[2] ^= t
        s[3] = _rotl(s[3], 45)
        return result


def generate_signs(seed: int, n: int) -> np.ndarray:
    """n signs (+1.0 / -1.0, f32): +1 where next_u64() is odd."""
    rng = Xoshiro256StarStar(seed)
    return np.array([1.0 if rng.next_u64() & 1 else -1.0 for _ in range(n)], dtype=np.float32)


def jl_seed(seed: int) -> int:
    return (int(seed) * GOLDEN + 1) & MASK64


@lru_cache(maxsize=256)
def _layer_signs(seed: int, layer: int, d: int) -> tuple[bytes, bytes]:
    s = (int(seed) ^ int(layer)) & MASK64
    return generate_signs(s, d).tobytes(), generate_signs(jl_seed(s), d).tobytes()


def layer_signs(d: int, seed: int = DEFAULT_SEED, layer: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(polar signs [d], jl signs [d]) of one layer, f32."""
    p, j = _layer_signs(int(seed), int(layer), int(d))
    return np.frombuffer(p, np.float32).copy(), np.frombuffer(j, np.float32).copy()


def signs_buffer(d: int, n_layers: int, seed: int = DEFAULT_SEED) -> np.ndarray:
    """All layers' signs, per layer [polar(d) | jl(d)] f32; layer l starts at l * 2d."""
    out = np.empty(n_layers * 2 * d, np.float32)
    for layer in range(n_layers):
        p, j = layer_signs(d, seed, layer)
        out[layer * 2 * d : layer * 2 * d + d] = p
        out[layer * 2 * d + d : (layer + 1) * 2 * d] = j
    return out


# ------------------------------------------------------------------------------------ transforms
def wht(x: np.ndarray) -> np.ndarray:
    """Unnormalised Walsh-Hadamard transform over the last axis, butterfly (a+b, a-b) at strides
    1, 2, 4, ... in the array's dtype (element pairs (i, i+h) inside blocks of 2h, as the kernels)."""
    x = np.array(x, copy=True)
    d = x.shape[-1]
    lead = x.shape[:-1]
    h = 1
    while h < d:
        v = x.reshape(lead + (d // (2 * h), 2, h))
        a = v[..., 0, :].copy()
        b = v[..., 1, :].copy()
        v[..., 0, :] = a + b
        v[..., 1, :] = a - b
        x = v.reshape(lead + (d,))
        h *= 2
    return x


def inv_sqrt_d(d: int) -> np.float32:
    """The f32 1/sqrt(d) the kernels receive from the host (computed in f64, rounded once)."""
    return np.float32(1.0 / math.sqrt(d))


def rht(x: np.ndarray, signs: np.ndarray) -> np.ndarray:
    """Forward RHT in float64: WHT(x * s) / sqrt(d)."""
    x = np.asarray(x, np.float64)
    return wht(x * signs.astype(np.float64)) / math.sqrt(x.shape[-1])


def rht_inverse(y: np.ndarray, signs: np.ndarray) -> np.ndarray:
    """Inverse RHT in float64: WHT(y / sqrt(d)) * s."""
    y = np.asarray(y, np.float64)
    return wht(y / math.sqrt(y.shape[-1])) * signs.astype(np.float64)


def tree_sum_f32(a: np.ndarray) -> np.ndarray:
    """Sum over the last axis (<= 128 values) the way the kernels do: 128 lanes, zeros past d,
    strides 64, 32, ..., 1, each step one f32 addition."""
    a = np.asarray(a, np.float32)
    d = a.shape[-1]
    if d > LANES:
        raise ValueError("tree_sum_f32 handles at most 128 values")
    buf = np.zeros(a.shape[:-1] + (LANES,), np.float32)
    buf[..., :d] = a
    s = LANES // 2
    while s >= 1:
        buf[..., :s] = buf[..., :s] + buf[..., s : 2 * s]
        s //= 2
    return buf[..., 0].copy()


# ------------------------------------------------------------------------------------ centroids
@lru_cache(maxsize=64)
def _lloyd_max_2bit(d: int, nodes: int = 512, tol: float = 1e-16, max_iter: int = 100000):
    if d < 4:
        raise ValueError("Lloyd-Max centroids need d >= 4")
    xg, wg = np.polynomial.legendre.leggauss(nodes)
    expo = (d - 3) / 2.0

    def moments(lo, hi):
        x = (hi - lo) / 2.0 * xg + (hi + lo) / 2.0
        w = wg * (hi - lo) / 2.0
        f = np.power(np.clip(1.0 - x * x, 0.0, None), expo)
        return float(np.sum(w * x * f)), float(np.sum(w * f))

    # Symmetric density: centroids (-beta, -alpha, alpha, beta), boundaries (-m, 0, m).
    sigma = 1.0 / math.sqrt(d)
    alpha, beta = 0.4528 * sigma, 1.5104 * sigma  # Gaussian Lloyd-Max start
    it = 0
    for it in range(max_iter):
        m = (alpha + beta) / 2.0
        n1, z1 = moments(0.0, m)
        n2, z2 = moments(m, 1.0)
        na, nb = n1 / z1, n2 / z2
        delta = max(abs(na - alpha), abs(nb - beta))
        alpha, beta = na, nb
        if delta < tol:
            break
    m = (alpha + beta) / 2.0
    return (-beta, -alpha, alpha, beta), (-m, 0.0, m), it


def lloyd_max_2bit(d: int) -> tuple[np.ndarray, np.ndarray]:
    """(centroids [4], boundaries [3]) in float64 for head size d (iterated to convergence)."""
    c, b, _ = _lloyd_max_2bit(int(d))
    return np.array(c), np.array(b)


@dataclass(frozen=True)
class TQParams:
    """Everything the encoders and the estimator need for one head size / seed / layer."""

    head_size: int
    seed: int = DEFAULT_SEED
    layer: int = 0

    @property
    def centroids(self) -> np.ndarray:
        """f32 centroids, as passed to the kernels."""
        return lloyd_max_2bit(self.head_size)[0].astype(np.float32)

    @property
    def boundaries(self) -> np.ndarray:
        """f32 decision boundaries (midpoints computed in f64, rounded once); the middle one is 0."""
        return lloyd_max_2bit(self.head_size)[1].astype(np.float32)

    @property
    def signs(self) -> tuple[np.ndarray, np.ndarray]:
        return layer_signs(self.head_size, self.seed, self.layer)

    @property
    def sign_off(self) -> int:
        return self.layer * 2 * self.head_size

    def signs_buffer(self) -> np.ndarray:
        return signs_buffer(self.head_size, self.layer + 1, self.seed)


def qjl_scale_value(kind: str, d: int) -> float:
    """'reference' sqrt(pi/2)/d (the reference code), 'unbiased' sqrt(pi/2)/sqrt(d) (orthonormal RHT)."""
    if kind == "reference":
        return math.sqrt(math.pi / 2.0) / d
    if kind == "unbiased":
        return math.sqrt(math.pi / 2.0) / math.sqrt(d)
    raise ValueError(f"qjl_scale must be one of {QJL_SCALES}, got {kind!r}")


# ------------------------------------------------------------------------------------ packing
def _f16_bits(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, np.float32).astype(np.float16).view(np.uint16).astype(np.uint32)


def pack2x16float(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """WGSL pack2x16float(vec2(lo, hi)): f16 RNE of each, lo in bits 0..15."""
    return _f16_bits(lo) | (_f16_bits(hi) << 16)


def unpack2x16float(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    w = np.asarray(w, np.uint32)
    lo = (w & 0xFFFF).astype(np.uint16).view(np.float16).astype(np.float32)
    hi = (w >> 16).astype(np.uint16).view(np.float16).astype(np.float32)
    return lo, hi


def pack_2bit(idx: np.ndarray) -> np.ndarray:
    """[..., d] indices 0..3 -> [..., d/16] u32, element j at bits 2j (LSB first)."""
    idx = np.asarray(idx, np.uint32)
    d = idx.shape[-1]
    v = idx.reshape(idx.shape[:-1] + (d // 16, 16))
    sh = (2 * np.arange(16, dtype=np.uint32))
    return np.bitwise_or.reduce(v << sh, axis=-1).astype(np.uint32)


def unpack_2bit(words: np.ndarray, d: int) -> np.ndarray:
    w = np.asarray(words, np.uint32)
    sh = (2 * np.arange(16, dtype=np.uint32))
    return ((w[..., :, None] >> sh) & 3).reshape(w.shape[:-1] + (d,)).astype(np.uint8)


def pack_1bit(bits: np.ndarray) -> np.ndarray:
    """[..., d] 0/1 -> [..., d/32] u32, element j at bit j."""
    b = np.asarray(bits, np.uint32)
    d = b.shape[-1]
    v = b.reshape(b.shape[:-1] + (d // 32, 32))
    return np.bitwise_or.reduce(v << np.arange(32, dtype=np.uint32), axis=-1).astype(np.uint32)


def unpack_1bit(words: np.ndarray, d: int) -> np.ndarray:
    w = np.asarray(words, np.uint32)
    return ((w[..., :, None] >> np.arange(32, dtype=np.uint32)) & 1).reshape(w.shape[:-1] + (d,)).astype(np.uint8)


# ------------------------------------------------------------------------------------ cache layout
def key_cache_words(n_kv_heads: int, cache_cap: int, d: int) -> int:
    vecs = n_kv_heads * cache_cap
    return vecs * d // 16 + vecs * d // 32 + vecs


def value_cache_words(n_kv_heads: int, cache_cap: int, d: int) -> int:
    vecs = n_kv_heads * cache_cap
    return vecs * d // 16 + vecs


def key_regions(n_kv_heads: int, cache_cap: int, d: int) -> tuple[int, int]:
    """(jl_off, norm_off) in words of the key cache [polar | jl | norms]."""
    vecs = n_kv_heads * cache_cap
    jl_off = vecs * d // 16
    return jl_off, jl_off + vecs * d // 32


def key_bytes_per_vector(d: int) -> int:
    return (d // 16 + d // 32 + 1) * 4


def value_bytes_per_vector(d: int) -> int:
    return (d // 16 + 1) * 4


def seed_records(k_cache: np.ndarray, v_cache: np.ndarray, n_kv_heads: int, cache_cap: int, d: int):
    """One sequence's seed cache words (regions, slot = kv_head * cache_cap + t) as per-token records of the paged
    seed-configuration layout: (K [cache_cap, kvh, d/16 + d/32 + 1], V [cache_cap, kvh, d/16 + 1]) u32, the
    records tq_general_compress writes at bits 2 / v_bits 2 without outliers (K [polar | jl | norms], V [polar | norm])."""
    dec = decode_cache(k_cache, v_cache, n_kv_heads, cache_cap, d)
    k = np.concatenate([dec.k_polar_words, dec.k_jl_words, dec.k_norm_words[..., None]], -1)
    v = np.concatenate([dec.v_polar_words, dec.v_norm_words[..., None]], -1)
    return np.ascontiguousarray(k.transpose(1, 0, 2), np.uint32), np.ascontiguousarray(v.transpose(1, 0, 2), np.uint32)


def seed_words(k_records: np.ndarray, v_records: np.ndarray, d: int, cache_cap: int | None = None):
    """The inverse of seed_records: per-token records K [T, kvh, d/16 + d/32 + 1], V [T, kvh, d/16 + 1] of one
    sequence (positions 0..T-1) -> its seed cache words (k_words, v_words) of cache_cap >= max(T, 1) positions
    (unwritten positions 0)."""
    kr = np.asarray(k_records, np.uint32)
    vr = np.asarray(v_records, np.uint32)
    T, kvh, _ = kr.shape
    cap = max(T, 1) if cache_cap is None else int(cache_cap)
    pw, jw = d // 16, d // 32
    vecs = kvh * cap
    jl_off, norm_off = key_regions(kvh, cap, d)
    kw = np.zeros(key_cache_words(kvh, cap, d), np.uint32)
    vw = np.zeros(value_cache_words(kvh, cap, d), np.uint32)
    kt = kr.transpose(1, 0, 2)  # [kvh, T, wk]
    vt = vr.transpose(1, 0, 2)
    kp = kw[: vecs * pw].reshape(kvh, cap, pw)
    kp[:, :T] = kt[..., :pw]
    kw[jl_off : jl_off + vecs * jw].reshape(kvh, cap, jw)[:, :T] = kt[..., pw : pw + jw]
    kw[norm_off : norm_off + vecs].reshape(kvh, cap)[:, :T] = kt[..., pw + jw]
    vw[: vecs * pw].reshape(kvh, cap, pw)[:, :T] = vt[..., :pw]
    vw[vecs * pw : vecs * pw + vecs].reshape(kvh, cap)[:, :T] = vt[..., pw]
    return kw, vw


@dataclass
class DecodedCache:
    """Fields of a TurboQuant cache, [kv_heads, cache_cap, ...]."""

    k_idx: np.ndarray  # [kvh, cap, d] u8
    k_bits: np.ndarray  # [kvh, cap, d] u8
    k_norm: np.ndarray  # [kvh, cap] f32 (f16 values)
    k_rnorm: np.ndarray  # [kvh, cap] f32
    v_idx: np.ndarray  # [kvh, cap, d] u8
    v_norm: np.ndarray  # [kvh, cap] f32
    k_polar_words: np.ndarray  # [kvh, cap, d/16]
    k_jl_words: np.ndarray  # [kvh, cap, d/32]
    k_norm_words: np.ndarray  # [kvh, cap]
    v_polar_words: np.ndarray  # [kvh, cap, d/16]
    v_norm_words: np.ndarray  # [kvh, cap]


def decode_cache(k_cache: np.ndarray, v_cache: np.ndarray, n_kv_heads: int, cache_cap: int, d: int) -> DecodedCache:
    k_cache = np.asarray(k_cache, np.uint32)
    v_cache = np.asarray(v_cache, np.uint32)
    pw, jw = d // 16, d // 32
    vecs = n_kv_heads * cache_cap
    jl_off, norm_off = key_regions(n_kv_heads, cache_cap, d)
    kp = k_cache[: vecs * pw].reshape(n_kv_heads, cache_cap, pw)
    kj = k_cache[jl_off : jl_off + vecs * jw].reshape(n_kv_heads, cache_cap, jw)
    kn = k_cache[norm_off : norm_off + vecs].reshape(n_kv_heads, cache_cap)
    vp = v_cache[: vecs * pw].reshape(n_kv_heads, cache_cap, pw)
    vn = v_cache[vecs * pw : vecs * pw + vecs].reshape(n_kv_heads, cache_cap)
    n, rn = unpack2x16float(kn)
    vnorm, _ = unpack2x16float(vn)
    return DecodedCache(
        unpack_2bit(kp, d), unpack_1bit(kj, d), n, rn, unpack_2bit(vp, d), vnorm, kp, kj, kn, vp, vn
    )


def dequantize_polar(idx: np.ndarray, norm: np.ndarray, p: TQParams) -> np.ndarray:
    """PolarQuant reconstruction in float64: norm * RHT^-1(c[idx])."""
    c = p.centroids.astype(np.float64)
    sp, _ = p.signs
    return rht_inverse(c[np.asarray(idx)], sp) * np.asarray(norm, np.float64)[..., None]


# ------------------------------------------------------------------------------------ queries
def rotate_q_parts(q: np.ndarray, p: TQParams):
    """The f32 query rotation of shaders/turboquant/tq_rotate_q.wgsl, in its order: q [..., d] ->
    (q_rot = WHT(q*s)*inv_sqrt_d, q_jl = WHT(q_rot*s_jl)*inv_sqrt_d, sums = 128-lane tree of q_jl)."""
    q = np.asarray(q, np.float32)
    sp, sj = p.signs
    inv = inv_sqrt_d(p.head_size)
    q_rot = (wht((q * sp).astype(np.float32)) * inv).astype(np.float32)
    q_jl = (wht((q_rot * sj).astype(np.float32)) * inv).astype(np.float32)
    return q_rot, q_jl, tree_sum_f32(q_jl)


# ------------------------------------------------------------------------------------ estimator
def estimate_scores(q_rot, q_jl, q_sum, dec_k_idx, dec_k_bits, k_norm, k_rnorm, p: TQParams, qjl_scale: float,
                    polar_only: bool = False) -> np.ndarray:
    """Estimated q.k (no softmax scale) in float64 for one query head against keys [..., T, d]:
    n * sum q_rot*c[idx] + n*rn*qjl_scale*(2*sum_{bit=1} q_jl - sum q_jl)."""
    c = p.centroids.astype(np.float64)
    qr = np.asarray(q_rot, np.float64)
    qj = np.asarray(q_jl, np.float64)
    n = np.asarray(k_norm, np.float64)
    polar = n * (c[np.asarray(dec_k_idx)] @ qr)
    if polar_only:
        return polar
    pos = np.asarray(dec_k_bits, np.float64) @ qj
    signed = 2.0 * pos - float(q_sum)
    return polar + n * np.asarray(k_rnorm, np.float64) * float(qjl_scale) * signed


# ====================================================================================== general settings
# TurboQuant at the paper's settings (arXiv:2504.19874, section 4.3), any head size up to 256:
#   bits      b of the polar (MSE) stage of keys, 1-4 (keys add the 1-bit QJL residual);
#   v_bits    the values' polar width, 1-4;
#   outlier_share  a share of each head's channels at one more bit: the channels are split into an
#             outlier and a regular set (the n_o channels of largest RMS over the tokens quantised, per KV
#             head) and each set is its own TurboQuant instance (its own norm, rotation, codebook, QJL).
#             Effective polar width b + n_o/d: share 0.5 gives the paper's 2.5- and 3.5-bit configurations
#             from b = 2 and 3.
# Rotation of an instance of n channels: the RHT over P = the next power of two >= max(n, 32) coordinates,
# the vector zero-padded (a WHT needs a power of two; 32 keeps whole JL words). The P rotated coordinates
# are all stored: padding costs b * (P - n) code bits (and P - n JL bits) per vector.
# Codebook: the b-bit Lloyd-Max quantiser of one coordinate of a rotated unit vector in R^P (density
# proportional to (1 - x^2)^((P-3)/2)); index = number of boundaries <= y.
# Record of one token and KV head in a paged cache [num_blocks, kv_heads, block_size, wpt] u32, instances
# in order (outliers first): keys [codes | jl | norms] per instance, values [codes | norm]; codes are a
# bit stream of b-bit indices (index j at bits j*b.., LSB first, crossing word boundaries), jl bits 32 a
# word, norms pack2x16float(n, rn) (values: (n, 0)).
# The seed configuration (b = v_b = 2, no split, d in 32/64/128) keeps the seed layout and kernels.
MAX_BITS = 4
MAX_ROTATION = 256
ROT_LANES = 256  # workgroup size of the general kernels; their reductions are trees over 256 lanes
SEED_HEAD_SIZES = (32, 64, 128)


def rotation_size(n: int) -> int:
    """P: the next power of two >= max(n, 32)."""
    P = 32
    while P < n:
        P *= 2
    return P


@lru_cache(maxsize=128)
def _lloyd_max(P: int, bits: int, grid: int = 200001, tol: float = 1e-13, max_iter: int = 20000):
    if P < 4:
        raise ValueError("Lloyd-Max centroids need P >= 4")
    L = min(1.0, 14.0 / math.sqrt(P))  # beyond, the density is below exp(-98) of its peak
    x = np.linspace(-L, L, grid)
    logf = (P - 3) / 2.0 * np.log1p(-np.minimum(x * x, 1 - 1e-15))
    f = np.exp(logf - logf.max())
    # cumulative integrals of f and x f (trapezoid), for the mass and first moment of any interval
    dx = x[1] - x[0]
    F = np.concatenate([[0.0], np.cumsum((f[1:] + f[:-1]) / 2 * dx)])
    xf = x * f
    G = np.concatenate([[0.0], np.cumsum((xf[1:] + xf[:-1]) / 2 * dx)])
    n = 1 << bits
    sigma = 1.0 / math.sqrt(P)

    c = np.array([NormalDist().inv_cdf((i + 0.5) / n) * sigma for i in range(n)])
    for _ in range(max_iter):
        b = (c[1:] + c[:-1]) / 2
        edges = np.concatenate([[-L], b, [L]])
        Fe, Ge = np.interp(edges, x, F), np.interp(edges, x, G)
        new = (Ge[1:] - Ge[:-1]) / (Fe[1:] - Fe[:-1])
        new = (new - new[::-1]) / 2  # the density is symmetric: keep the codebook exactly symmetric
        done = np.max(np.abs(new - c)) < tol
        c = new
        if done:
            break
    return tuple(c), tuple((c[1:] + c[:-1]) / 2)


def lloyd_max(P: int, bits: int) -> tuple[np.ndarray, np.ndarray]:
    """(centroids [2^bits], boundaries [2^bits - 1]) in float64 of the b-bit quantiser in R^P."""
    if not 1 <= bits <= MAX_BITS + 1:
        raise ValueError(f"bits must be 1..{MAX_BITS + 1}, got {bits}")
    if bits == 2:  # the seed's codebook (Gauss-Legendre on the exact density): the same centroids everywhere
        return lloyd_max_2bit(int(P))
    c, b = _lloyd_max(int(P), int(bits))
    return np.array(c), np.array(b)


def instance_seed(seed: int, i: int) -> int:
    """The sign seed of instance i (0: the seed itself, so an unsplit power-of-two head has the seed's signs)."""
    return int(seed) if i == 0 else jl_seed(jl_seed(int(seed)) + i) & 0x7FFFFFFFFFFFFFFF


@dataclass(frozen=True)
class TQInstance:
    """One TurboQuant instance of a record: n channels rotated in R^P at `bits` bits."""

    n_ch: int
    chan_off: int  # first position of its channels in the head's channel table
    P: int
    bits: int
    seed: int
    layer: int
    code_off: int  # word offsets inside the record
    code_words: int
    jl_off: int  # keys only (-1 for values)
    norm_off: int

    @property
    def levels(self) -> int:
        return 1 << self.bits

    @property
    def codebook(self) -> tuple[np.ndarray, np.ndarray]:
        """f32 (centroids, boundaries), as passed to the kernels."""
        c, b = lloyd_max(self.P, self.bits)
        return c.astype(np.float32), b.astype(np.float32)

    @property
    def signs(self) -> tuple[np.ndarray, np.ndarray]:
        return layer_signs(self.P, self.seed, self.layer)


@dataclass(frozen=True)
class TQSettings:
    head_size: int
    bits: int = 2
    v_bits: int = 2
    outlier_share: float = 0.0
    seed: int = DEFAULT_SEED
    layer: int = 0

    @property
    def n_outliers(self) -> int:
        if self.outlier_share <= 0:
            return 0
        return int(min(self.head_size - 1, max(1, round(self.outlier_share * self.head_size))))

    @property
    def is_seed(self) -> bool:
        """The seed configuration: the seed layout and kernels (flash_attention_tq) serve it."""
        return self.bits == 2 and self.v_bits == 2 and self.n_outliers == 0 and self.head_size in SEED_HEAD_SIZES

    def instances(self, which: str) -> tuple[TQInstance, ...]:
        d, no = self.head_size, self.n_outliers
        b = self.bits if which == "K" else self.v_bits
        parts = [(no, 0, b + 1), (d - no, no, b)] if no else [(d, 0, b)]
        out, off = [], 0
        for i, (n, coff, bb) in enumerate(parts):
            P = rotation_size(n)
            cw = -(-P * bb // 32)
            jl = off + cw if which == "K" else -1
            norm = off + cw + (P // 32 if which == "K" else 0)
            out.append(TQInstance(n, coff, P, bb, instance_seed(self.seed, i), self.layer, off, cw, jl, norm))
            off = norm + 1
        return tuple(out)

    def wpt(self, which: str) -> int:
        last = self.instances(which)[-1]
        return last.norm_off + 1

    def bits_per_element(self, which: str) -> float:
        return self.wpt(which) * 32.0 / self.head_size

    def polar_bits(self, which: str) -> float:
        """Mean polar code bits per channel (the paper's setting: b + share)."""
        return sum(i.n_ch * i.bits for i in self.instances(which)) / self.head_size


def choose_channels(x: np.ndarray, n_outliers: int) -> np.ndarray:
    """Channel table [kv_heads, d] u32 of x [rows, kv_heads, d]: per head the n_outliers channels of largest
    RMS over the rows (ties: the lower channel), ascending, then the others, ascending. Identity if none."""
    x = np.asarray(x, np.float64)
    kvh, d = x.shape[1], x.shape[2]
    out = np.tile(np.arange(d, dtype=np.uint32), (kvh, 1))
    if n_outliers <= 0:
        return out
    ms = (x * x).mean(axis=0) if x.shape[0] else np.zeros((kvh, d))
    for h in range(kvh):
        order = np.argsort(-ms[h], kind="stable")
        out[h] = np.concatenate([np.sort(order[:n_outliers]), np.sort(order[n_outliers:])])
    return out


def pack_bits(codes: np.ndarray, bits: int) -> np.ndarray:
    """[..., P] codes < 2^bits -> [..., ceil(P*bits/32)] u32: code j at bits j*bits.. (LSB first, across words)."""
    c = np.asarray(codes, np.uint64)
    P = c.shape[-1]
    nw = -(-P * bits // 32)
    out = np.zeros(c.shape[:-1] + (nw + 1,), np.uint64)
    for j in range(P):
        pos = j * bits
        w, sh = pos // 32, pos % 32
        v = c[..., j] << np.uint64(sh)
        out[..., w] |= v & np.uint64(0xFFFFFFFF)
        out[..., w + 1] |= v >> np.uint64(32)
    return out[..., :nw].astype(np.uint32)


def unpack_bits(words: np.ndarray, P: int, bits: int) -> np.ndarray:
    w = np.asarray(words, np.uint64)
    w = np.concatenate([w, np.zeros(w.shape[:-1] + (1,), np.uint64)], axis=-1)
    out = np.zeros(w.shape[:-1] + (P,), np.uint8)
    mask = np.uint64((1 << bits) - 1)
    for j in range(P):
        pos = j * bits
        i, sh = pos // 32, pos % 32
        v = (w[..., i] | (w[..., i + 1] << np.uint64(32))) >> np.uint64(sh)
        out[..., j] = (v & mask).astype(np.uint8)
    return out


def tree_sum_lanes(a: np.ndarray, lanes: int = ROT_LANES) -> np.ndarray:
    """tree_sum_f32 over `lanes` lanes (strides lanes/2, ..., 1): the general kernels' order."""
    a = np.asarray(a, np.float32)
    buf = np.zeros(a.shape[:-1] + (lanes,), np.float32)
    buf[..., : a.shape[-1]] = a
    s = lanes // 2
    while s >= 1:
        buf[..., :s] = buf[..., :s] + buf[..., s : 2 * s]
        s //= 2
    return buf[..., 0].copy()


@dataclass
class GeneralRecords:
    """Fields of general-setting records [..., wpt] of K or V, per instance (lists in instance order)."""

    idx: list  # [..., P] u8
    jl_bits: list  # [..., P] u8 (keys) or None
    norm: list  # [...] f32 (f16 values)
    rnorm: list  # [...] f32 (keys) or None


def unpack_general(records: np.ndarray, st: TQSettings, which: str) -> GeneralRecords:
    r = np.asarray(records, np.uint32)
    out = GeneralRecords([], [], [], [])
    for ins in st.instances(which):
        out.idx.append(unpack_bits(r[..., ins.code_off : ins.code_off + ins.code_words], ins.P, ins.bits))
        n, rn = unpack2x16float(r[..., ins.norm_off])
        out.norm.append(n)
        if which == "K":
            out.jl_bits.append(unpack_1bit(r[..., ins.jl_off : ins.jl_off + ins.P // 32], ins.P))
            out.rnorm.append(rn)
        else:
            out.jl_bits.append(None)
            out.rnorm.append(None)
    return out


def dequantize_general(records: np.ndarray, chans: np.ndarray, st: TQSettings, which: str,
                       qjl_scale: str = "reference", part: str = "all") -> np.ndarray:
    """float32 reconstruction [..., kv_heads, d] from records [..., kv_heads, wpt] and the channel table
    [kv_heads, d], in the dequantise kernel's f32 order (shaders/turboquant/tq_general_dequant.wgsl):
      y = c[idx]; keys: y += (rn * qjl_scale) * ((WHT(2*bit - 1) * inv_sqrt_P) * s_jl);
      x = ((WHT(y) * inv_sqrt_P) * s_polar) * n, the first n_ch coordinates to the instance's channels.
    qjl_scale: the kind ('reference' sqrt(pi/2)/P, 'unbiased' sqrt(pi/2)/sqrt(P), P of each instance).
    part "polar" drops the QJL term, "qjl" keeps only it (both for the bias panel's estimators)."""
    r = np.asarray(records, np.uint32)
    chans = np.asarray(chans, np.int64)
    kvh = chans.shape[0]
    out = np.zeros(r.shape[:-1] + (st.head_size,), np.float32)
    rec = unpack_general(r, st, which)
    for i, ins in enumerate(st.instances(which)):
        c, _ = ins.codebook
        sp, sj = ins.signs
        inv = inv_sqrt_d(ins.P)
        y = c[rec.idx[i]].astype(np.float32)
        if part == "qjl":
            y = np.zeros_like(y)
        if which == "K" and part != "polar":
            z = np.where(rec.jl_bits[i] == 1, np.float32(1.0), np.float32(-1.0)).astype(np.float32)
            qs = np.float32(qjl_scale_value(qjl_scale, ins.P))
            a = (rec.rnorm[i] * qs).astype(np.float32)
            t = ((wht(z) * inv).astype(np.float32) * sj).astype(np.float32)
            y = (y + (a[..., None] * t).astype(np.float32)).astype(np.float32)
        x = (((wht(y) * inv).astype(np.float32) * sp).astype(np.float32) * rec.norm[i][..., None]).astype(np.float32)
        for h in range(kvh):
            cols = chans[h, ins.chan_off : ins.chan_off + ins.n_ch]
            out[..., h, cols] = x[..., h, : ins.n_ch]
    return out


def qjl_scale_general(kind: str, P: int) -> float:
    """The QJL scale of an instance rotated in R^P: 'reference' sqrt(pi/2)/P, 'unbiased' sqrt(pi/2)/sqrt(P)."""
    return qjl_scale_value(kind, P)
