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
