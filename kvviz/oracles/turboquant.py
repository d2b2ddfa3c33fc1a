"""numpy oracle of TurboQuant (arXiv:2504.19874): sign generator, RHT, Lloyd-Max centroids, the key and
value encoders with their packed cache layout, the query rotation and the seed's attention estimator.

Conventions (docs kernels.md section 4; the GPU side is shaders/turboquant/):

- Signs: xoshiro256** whose 4 state words come from SplitMix64, seeded with `seed ^ layer`; the polar
  signs from that seed, the JL signs from `seed' * 0x9E3779B97F4A7C15 + 1` (wrapping u64), where
  seed' = seed ^ layer; sign = +1 if `next_u64() & 1` else -1. The signs buffer holds per layer
  `[polar(d) | jl(d)]` f32, so a layer's signs start at `layer * 2d`.
- RHT: `y = WHT(x * s) / sqrt(d)`, butterfly (a+b, a-b) at strides 1, 2, 4, ...; inverse
  `WHT(y / sqrt(d)) * s`.
- Centroids: 2-bit Lloyd-Max on the coordinate density of a rotated unit vector,
  proportional to (1-x^2)^((d-3)/2) on [-1, 1], computed here by Gauss-Legendre quadrature.

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
why the oracle follows the kernel and not the textbook order. A device with approximate division or
sqrt (WGSL allows 2.5 ulp) or one that contracts a*b+c into an FMA can flip an index where a rotated
coordinate lies within a few ulp of a boundary; `boundary_margin`, `jl_margin` and `f16_rounding_tie`
measure how close they come and `compare_cache` accepts a difference only there. Measured: lavapipe
exact on every word (3 x 65536 keys and values, d = 32/64/128); the H200 (NVIDIA Vulkan) differed on
65536 vectors per head size in 1 index (d=64 and d=128 each, both within 8 steps of a boundary, so that
vector's JL bits and rn changed too), a few JL bits near 0 and 1-13 f16 norm halves at f16 rounding
ties (1 f16 ulp), nothing else.

Norms are stored as pack2x16float(n, rn): f16 round-to-nearest-even of the f32 values (numpy's
float32 -> float16 cast is RNE, like LLVM's fptrunc that lavapipe uses for WGSL pack2x16float).

Attention (the seed `flash_attention_tq`'s estimator) is computed in float64 from the packed words:
  score = (n * sum q_rot*c[idx] + n * rn * qjl_scale * (2*sum_{bit=1} q_jl - sum q_jl)) * scale,
  softmax over positions [0, min(pos_q+1, max_seq)), output = RHT^-1(sum_t p_t * vn_t * c[vidx_t]).
The seed's online softmax equals this plain softmax up to rounding.
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

    d: int
    seed: int = DEFAULT_SEED
    layer: int = 0

    @property
    def centroids(self) -> np.ndarray:
        """f32 centroids, as passed to the kernels."""
        return lloyd_max_2bit(self.d)[0].astype(np.float32)

    @property
    def boundaries(self) -> np.ndarray:
        """f32 decision boundaries (midpoints computed in f64, rounded once); the middle one is 0."""
        return lloyd_max_2bit(self.d)[1].astype(np.float32)

    @property
    def signs(self) -> tuple[np.ndarray, np.ndarray]:
        return layer_signs(self.d, self.seed, self.layer)

    @property
    def sign_off(self) -> int:
        return self.layer * 2 * self.d

    def signs_buffer(self) -> np.ndarray:
        return signs_buffer(self.d, self.layer + 1, self.seed)


def qjl_scale_value(kind: str, d: int) -> float:
    """'reference' sqrt(pi/2)/d (the reference code), 'unbiased' sqrt(pi/2)/sqrt(d) (orthonormal RHT)."""
    if kind == "reference":
        return math.sqrt(math.pi / 2.0) / d
    if kind == "unbiased":
        return math.sqrt(math.pi / 2.0) / math.sqrt(d)
    raise ValueError(f"qjl_scale must be one of {QJL_SCALES}, got {kind!r}")


# ------------------------------------------------------------------------------------ encoders
def quantize_index(v: np.ndarray, b: np.ndarray) -> np.ndarray:
    """`v < b1 ? (v < b0 ? 0 : 1) : (v < b2 ? 2 : 3)` on f32 values and f32 boundaries."""
    v = np.asarray(v, np.float32)
    b = np.asarray(b, np.float32)
    return np.where(v < b[1], np.where(v < b[0], 0, 1), np.where(v < b[2], 2, 3)).astype(np.uint32)


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
    if x.shape[-1] != p.d:
        raise ValueError(f"last axis must be {p.d}, got {x.shape}")
    sp, _ = p.signs
    n = np.sqrt(tree_sum_f32(x * x)).astype(np.float32)
    zero = n < EPS
    safe = np.where(zero, np.float32(1.0), n).astype(np.float32)
    k = (inv_sqrt_d(p.d) / safe).astype(np.float32)
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
    return dist / float(np.spacing(inv_sqrt_d(p.d)))


def jl_margin(jl_values: np.ndarray) -> np.ndarray:
    """|WHT((r/rn) * s_jl)| in units of one f32 ulp of 1.0 (the entries have unit variance): a value
    within a few units of 0 is a sign tie that another rounding could flip."""
    return np.abs(np.asarray(jl_values, np.float64)) / float(np.spacing(np.float32(1.0)))


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


def rotate_q_parts(q: np.ndarray, p: TQParams):
    q = np.asarray(q, np.float32)
    sp, sj = p.signs
    inv = inv_sqrt_d(p.d)
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
):
    """The seed flash_attention_tq's result in float64. q [n_queries, n_heads, d] f32 (unrotated; the
    f32 rotation of `rotate_q` is applied, as on the GPU). Query j sits at position start_pos + j and
    attends over [0, min(start_pos + j + 1, max_seq)). Returns out [n_queries, n_heads, d] (and the
    softmax weights [n_queries, n_heads, max_seq] when return_weights)."""
    q = np.asarray(q, np.float32)
    nq, H, d = q.shape
    if isinstance(qjl_scale, str):
        qjl_scale = qjl_scale_value(qjl_scale, d)
    qjl_scale = float(np.float32(qjl_scale))  # the kernel receives it as f32 bits
    scale = float(np.float32(scale))
    dec = decode_cache(k_cache, v_cache, n_kv_heads, cache_cap, d)
    q_rot, q_jl, sums = rotate_q_parts(q, p)
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
