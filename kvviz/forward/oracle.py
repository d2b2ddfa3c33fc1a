"""numpy references of the forward's kernels (kvviz/forward/kernels.py), with the tolerances their tests use and why.

The matrix products and the attention are references in float64 with a bound on the f32 kernel's error that holds
for any order of summation (the kernels sum in tiles and lanes, numpy in blocks: orders differ, neither is
"right"): |fl(sum) - sum| <= n u sum |terms| (u = 2^-24, n terms, f32 accumulation), plus one rounding of the
result. The elementwise kernels do the numpy forward's f32 operations in the same order; they differ from it only
where a compiler fuses a product into a sum (fma: one rounding fewer) or where WGSL's sqrt, division, exp and tanh
are not correctly rounded (a few ulp).
"""
from __future__ import annotations

import numpy as np

U32 = 2.0 ** -24  # f32's unit roundoff
_F32 = np.float32


def matmul_ref(x: np.ndarray, w: np.ndarray, bias: np.ndarray | None = None,
               residual: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(x . w^T (+ bias) (+ residual) in float64, the elementwise bound of an f32-accumulated kernel's error).
    w is the matrix as the device holds it (an f16 copy: pass its values)."""
    x64, w64 = np.asarray(x, np.float64), np.asarray(w, np.float64)
    ref = x64 @ w64.T
    mag = np.abs(x64) @ np.abs(w64).T
    if bias is not None:
        ref = ref + np.asarray(bias, np.float64)
        mag = mag + np.abs(np.asarray(bias, np.float64))
    if residual is not None:
        ref = ref + np.asarray(residual, np.float64)
        mag = mag + np.abs(np.asarray(residual, np.float64))
    k = x64.shape[-1]
    return ref, (k + 3) * U32 * mag + np.finfo(np.float32).tiny


def rms_norm_ref(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """The numpy forward's rms_norm (kvviz/sources/llama_numpy.py), f32."""
    x = np.asarray(x, _F32)
    with np.errstate(over="ignore"):  # sums of squares past f32's range: inf, and y = 0, in the kernel too
        ms = np.mean(x * x, axis=-1, keepdims=True)
    return x * (_F32(1.0) / np.sqrt(ms + _F32(eps))) * np.asarray(w, _F32)


def rms_norm_tolerance(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """The kernel's sum of squares in another order (n u relative at most) and WGSL's sqrt and division (2.5 ulp
    each): a relative error of (n + 8) u of each output, f32's rounding of x * inv * w included."""
    n = np.asarray(x).shape[-1]
    ref = np.abs(rms_norm_ref(x, w, eps).astype(np.float64))
    return (n + 8) * U32 * ref + np.finfo(np.float32).tiny


def rope_ref(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, mode: str = "neox", rot: int | None = None) -> np.ndarray:
    """RoPE of x [T, heads, D] with tables [T, R/2] (R = rot, default D) in f32: rotate-half ("neox", the numpy
    forward's apply_rope: x * cos + rotate(x) * sin) or interleaved pairs ("normal"); dims from R on unchanged."""
    x = np.asarray(x, _F32)
    d = x.shape[-1]
    r = d if rot is None else rot
    h = r // 2
    c, s = np.asarray(cos, _F32)[:, None, :], np.asarray(sin, _F32)[:, None, :]
    out = x.copy()
    if mode == "neox":
        x0, x1 = x[..., :h], x[..., h:r]
        out[..., :h] = x0 * c - x1 * s
        out[..., h:r] = x1 * c + x0 * s
    else:
        x0, x1 = x[..., 0:r:2], x[..., 1:r:2]
        out[..., 0:r:2] = x0 * c - x1 * s
        out[..., 1:r:2] = x1 * c + x0 * s
    return out


def rope_tolerance(x: np.ndarray, rot: int | None = None) -> np.ndarray:
    """A fused product (one rounding fewer than numpy's two): 2 u of |x0| + |x1| per output."""
    x = np.abs(np.asarray(x, np.float64))
    d = x.shape[-1]
    r = d if rot is None else rot
    h = r // 2
    tol = np.zeros_like(x)
    pair = x[..., :h] + x[..., h:r]
    tol[..., :h], tol[..., h:r] = pair, pair
    return 2 * U32 * tol + np.finfo(np.float32).tiny


def attention_ref(q: np.ndarray, k: np.ndarray, v: np.ndarray, start: int, scale: float, softcap: float = 0.0,
                  window: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(out [T, H, D], bound) in float64: q [T, H, D] at positions start.., k, v [S, nkv, D] positions 0..S-1; the
    query at p sees j <= p and, with a window W > 0, p - j < W; scores (q.k) * scale, soft-capped when softcap > 0.
    The bound: the f32 kernel's dot products ((D + 2) u of sum |q||k| scaled, moved through exp: that much relative
    per weight), its online softmax's rescales and sums ((S + 8) u relative) over sum_j p_j |v_j|."""
    q64, k64, v64 = (np.asarray(a, np.float64) for a in (q, k, v))
    t, nh, d = q64.shape
    s_len, nkv, _ = k64.shape
    g = nh // nkv
    kh = np.repeat(k64, g, axis=1)  # [S, H, D]
    vh = np.repeat(v64, g, axis=1)
    s = np.einsum("thd,shd->ths", q64, kh) * scale
    mag = np.einsum("thd,shd->ths", np.abs(q64), np.abs(kh)) * abs(scale)
    if softcap > 0:
        s = softcap * np.tanh(s / softcap)
    pos = start + np.arange(t)[:, None]
    j = np.arange(s_len)[None, :]
    ok = j <= pos
    if window > 0:
        ok &= (pos - j) < window
    s = np.where(ok[:, None, :], s, -np.inf)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    out = np.einsum("ths,shd->thd", p, vh)
    rel = (d + 2) * U32 * np.where(ok[:, None, :], mag, 0.0).max(axis=-1, keepdims=True) * 2 + (s_len + 8) * U32
    bound = rel * np.einsum("ths,shd->thd", p, np.abs(vh)) + np.finfo(np.float32).tiny
    return out, bound


def silu_ref(x: np.ndarray) -> np.ndarray:
    """The numpy forward's SiLU: x * sigmoid(x) written with tanh, f32."""
    x = np.asarray(x, _F32)
    return x * (_F32(0.5) * (_F32(1.0) + np.tanh(_F32(0.5) * x)))


def gelu_tanh_ref(x: np.ndarray) -> np.ndarray:
    """GELU, tanh approximation, f32: (0.5 x) (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""
    x = np.asarray(x, _F32)
    inner = _F32(0.7978845608) * (x + _F32(0.044715) * (x * x * x))
    return (_F32(0.5) * x) * (_F32(1.0) + np.tanh(inner))


def glu_ref(gate: np.ndarray, up: np.ndarray, act: str = "silu") -> np.ndarray:
    a = silu_ref(gate) if act == "silu" else gelu_tanh_ref(gate)
    return a * np.asarray(up, _F32)


def glu_tolerance(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """WGSL's tanh (not correctly rounded: an absolute error of a few ulp of 1 inside (1 + tanh)) and fused
    products: 16 u of |gate| |up| (the activation is at most |gate| in size)."""
    return 16 * U32 * np.abs(np.asarray(gate, np.float64) * np.asarray(up, np.float64)) + np.finfo(np.float32).tiny


def softcap_ref(x: np.ndarray, cap: float) -> np.ndarray:
    x = np.asarray(x, _F32)
    return _F32(cap) * np.tanh(x / _F32(cap))


def softcap_tolerance(x: np.ndarray, cap: float) -> np.ndarray:
    """WGSL's tanh and division: 8 ulp of the result, and 8 u of the cap near zero (tanh's absolute error)."""
    return 8 * U32 * (np.abs(softcap_ref(x, cap).astype(np.float64)) + cap) + np.finfo(np.float32).tiny


def embed_ref(table: np.ndarray, ids: np.ndarray, scale: float = 1.0) -> np.ndarray:
    rows = np.asarray(table, _F32)[np.asarray(ids, np.int64)]
    return rows if scale == 1.0 else rows * _F32(scale)


def forward_ref(plan, ids) -> np.ndarray:
    """The logits [T, vocab] of tokens `ids` at positions 0.. through a forward plan (kvviz/forward/plan.py), in
    numpy: f32 products and element-wise steps in the numpy forward's order, the attention in float64 (cast to
    f32). The reference of the plan's switches the Llama numpy forward does not have (biases, q/k norms, post
    norms, GeGLU, scales, soft-caps, sliding windows, RoPE per layer)."""
    p = plan
    ids = np.asarray(ids, np.int64)
    t, d, nh, nkv = ids.size, p.head_size, p.n_heads, p.n_kv_heads

    def linear(x, blocks, bias):
        w = np.concatenate(blocks) if isinstance(blocks, list) else blocks
        y = x @ w.T
        if bias is not None:
            y = y + (np.concatenate(bias) if isinstance(bias, list) else bias)
        return y

    x = embed_ref(p.tok_embd, ids, p.embed_scale)
    for i in range(p.n_layers):
        lp = p.layers[i]
        cos, sin = p.rope_tables(np.arange(t), lp.rope)
        h = rms_norm_ref(x, lp.attn_norm, p.rms_eps)
        qkv = linear(h, lp.qkv, lp.qkv_bias)
        q = qkv[:, :nh * d].reshape(t, nh, d)
        k = qkv[:, nh * d:(nh + nkv) * d].reshape(t, nkv, d)
        v = qkv[:, (nh + nkv) * d:].reshape(t, nkv, d)
        if lp.q_norm is not None:
            q = rms_norm_ref(q, lp.q_norm, p.rms_eps)
        if lp.k_norm is not None:
            k = rms_norm_ref(k, lp.k_norm, p.rms_eps)
        q = rope_ref(q, cos, sin, p.rope_mode, p.rotated)
        k = rope_ref(k, cos, sin, p.rope_mode, p.rotated)
        o, _ = attention_ref(q, k, v, 0, p.scale, p.attn_softcap, lp.window)
        a = linear(o.astype(_F32).reshape(t, nh * d), lp.wo, lp.wo_bias)
        x = x + (rms_norm_ref(a, lp.post_attn_norm, p.rms_eps) if lp.post_attn_norm is not None else a)
        h = rms_norm_ref(x, lp.ffn_norm, p.rms_eps)
        gu = linear(h, lp.gate_up, lp.gate_up_bias)
        f = linear(glu_ref(gu[:, :p.ffn], gu[:, p.ffn:], p.act), lp.w_down, lp.down_bias)
        x = x + (rms_norm_ref(f, lp.post_ffn_norm, p.rms_eps) if lp.post_ffn_norm is not None else f)
    logits = linear(rms_norm_ref(x, p.out_norm, p.rms_eps), p.output, p.output_bias)
    return softcap_ref(logits, p.final_softcap) if p.final_softcap > 0 else logits
