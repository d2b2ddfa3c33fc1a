"""TurboQuant estimator bias and MSE distortion (Qt-free).

- `inner_product_bias(q, K)`: true q.k against the seed kernel's estimate with the QJL scale of the
  reference code (sqrt(pi/2)/d), with the unbiased scale for an orthonormal RHT (sqrt(pi/2)/sqrt(d)),
  and with the PolarQuant part alone. Keys go through the GPU compressor (the given runtime, or a new
  one); the estimates are computed in float64 from the packed words, in the seed kernel's formula
  (kvviz/families/turboquant/format.py `estimate_scores`).
  Slopes: `slopes` are least squares THROUGH THE ORIGIN (est ~ a * true, a = sum(t e) / sum(t t));
  `fits` are least squares WITH AN INTERCEPT (est ~ a * true + b). On zero-mean random data the two agree
  closely; docs/kernels.md ("TurboQuant") quotes 0.895 (/d), 1.001 (/sqrt(d)) and 0.884 (polar only)
  at d = 128.
- `mse_unit_vectors(d, n, bits=2)`: E|x - x_hat|^2 of random unit vectors through the GPU compressor
  (value path = PolarQuant) and the format's dequantisation x_hat = f16(|x|) * RHT^-1(c[idx]).
  The TurboQuant paper gives about 0.36 / 0.117 / 0.03 / 0.009 at 1 / 2 / 3 / 4 bits.
Every setting of the method (bits 1-4 of the keys' polar stage, the outlier split `outlier_share`, head sizes
up to 256) is covered: the seed configuration (2 bits, no split, d = 32/64/128) goes through the seed
compressor and the seed estimator formula; every other setting through the general compressor
(tq_general_compress.wgsl), its estimate being q . k^ with k^ the format's dequantised key (polar part,
QJL part at each scale; kvviz/families/turboquant/format.py `dequantize_general`, f32 reconstruction, f64 dot).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from kvviz.attention import records as qk
from kvviz.errors import InvalidInput, KvvizError
from kvviz.families.turboquant import format as tqf, kernels as tqk
from kvviz.families.turboquant.kernels import TurboQuantKernels, check_general_head_size, check_head_size
from kvviz.gpu.runtime import GpuRuntime
from kvviz.paging import make_batch

ESTIMATORS = ("reference", "unbiased", "polar_only")
DEFAULT_SEED = tqf.DEFAULT_SEED  # the rotation's seed when the caller has no TurboQuant method to take it from


def unsupported_reason(head_size: int, bits: int = 2, outlier_share: float = 0.0) -> str:
    """'' when the TurboQuant compressor takes this head size (at this setting), else why not (its error and hint)."""
    try:
        if tqf.TQSettings(int(head_size), bits, 2, outlier_share).is_seed:
            check_head_size(int(head_size))
        else:
            check_general_head_size(int(head_size))
    except KvvizError as exc:
        return f"{exc}\n{exc.hint}" if exc.hint else str(exc)
    return ""


@dataclass
class BiasResult:
    d: int
    true: np.ndarray  # [n] float64 q.k
    est: dict  # estimator name -> [n] float64 estimate
    slopes: dict = field(default_factory=dict)  # through the origin
    fits: dict = field(default_factory=dict)  # (slope, intercept) with an intercept
    qjl_scales: dict = field(default_factory=dict)

    def summary(self) -> str:
        lines = [f"d={self.d}, {self.true.size} (q, k) pairs; est = a * true (through origin) | a * true + b"]
        for name in ESTIMATORS:
            a, b = self.fits[name]
            err = self.est[name] - self.true
            lines.append(
                f"  {name:<10s} slope {self.slopes[name]:.4f} | {a:.4f} {b:+.4f}   "
                f"rmse {np.sqrt(np.mean(err ** 2)):.4f}"
            )
        return "\n".join(lines)


def _slope_origin(t: np.ndarray, e: np.ndarray) -> float:
    return float(np.dot(t, e) / np.dot(t, t))


def _fit(t: np.ndarray, e: np.ndarray) -> tuple[float, float]:
    A = np.stack([t, np.ones_like(t)], axis=1)
    (a, b), *_ = np.linalg.lstsq(A, e, rcond=None)
    return float(a), float(b)


def _runtime(rt):
    if rt is None:
        rt = GpuRuntime()
    return rt


def _compress_keys(K: np.ndarray, p: tqf.TQParams, rt=None):
    """Packed (key, value) cache words for K [n, d] (one KV head) from the GPU compressor."""
    n, d = K.shape
    rt = _runtime(rt)

    kern = TurboQuantKernels(rt)
    cache = kern.allocate(1, d, n, p.seed, p.layer)
    kern.compress(cache, K[:, None, :], K[:, None, :])
    return kern.read(cache)


def _general_estimates(q: np.ndarray, K: np.ndarray, st: tqf.TQSettings, rt=None) -> dict:
    """Estimator name -> [m*n] estimates of q [m, d] . K [n, d] through the general compressor (GPU)."""
    rt = _runtime(rt)
    n, d = K.shape
    batch = make_batch([n], 16)
    x = np.ascontiguousarray(K[batch.token_pos][:, None, :], dtype=np.float32)
    chans = tqf.choose_channels(x, st.n_outliers)
    gc = tqk.general_allocate(rt, st, batch, 1, chans, chans)
    rt.run(tqk.general_compress_dispatches(rt, gc, x, x, batch.slot_mapping))
    recs = qk.token_records(qk.read_cache(rt, gc.qc, "K"), batch, st.wpt("K"))  # rows in batch order
    order = np.argsort(batch.token_pos)
    recs = recs[order]
    polar = tqf.dequantize_general(recs, chans, st, "K", part="polar")[:, 0].astype(np.float64)
    qq = q.astype(np.float64)
    est = {"polar_only": (qq @ polar.T).ravel()}
    for name in ("reference", "unbiased"):
        corr = tqf.dequantize_general(recs, chans, st, "K", name, part="qjl")[:, 0].astype(np.float64)
        est[name] = (qq @ (polar + corr).T).ravel()
    return est


def inner_product_bias(q, K, seed: int = tqf.DEFAULT_SEED, layer: int = 0, rt=None, bits: int = 2,
                       outlier_share: float = 0.0) -> BiasResult:
    """q [m, d] (or [d]), K [n, d] f32 -> BiasResult over all m*n pairs, at a setting of the method (bits of the
    keys' polar stage, outlier_share; the seed configuration by default)."""
    q = np.atleast_2d(np.asarray(q, np.float32))
    K = np.asarray(K, np.float32)
    if K.ndim != 2 or q.shape[1] != K.shape[1]:
        raise InvalidInput(f"q must be [m, d] and K [n, d]; got {q.shape} and {K.shape}")
    if not (np.isfinite(q).all() and np.isfinite(K).all()):
        raise InvalidInput("q and K must be finite")
    d = K.shape[1]
    true = (q.astype(np.float64) @ K.astype(np.float64).T).ravel()
    if not true.any():
        what = ("the keys are all zero" if not K.any() else "the queries are all zero" if not q.any()
                else "every query is orthogonal to every key")
        n, m = K.shape[0], q.shape[0]
        raise InvalidInput(f"{what} ({n} key{'s' * (n != 1)}, {m} quer{'ies' if m != 1 else 'y'}), so every true "
                           "q.k is 0 and an estimator's slope against it is undefined; nothing was estimated",
                           "Pick another sequence, head or layer, or K/V whose keys are not all zero.")
    st = tqf.TQSettings(d, int(bits), 2, float(outlier_share), seed, layer)
    if not st.is_seed:
        check_general_head_size(d)
        scales = {name: tqf.qjl_scale_value(name, ins.P) for name in ("reference", "unbiased")
                  for ins in st.instances("K")[-1:]}
        res = BiasResult(d, true, _general_estimates(q, K, st, rt), qjl_scales=scales)
        for name in ESTIMATORS:
            res.slopes[name] = _slope_origin(true, res.est[name])
            res.fits[name] = _fit(true, res.est[name])
        return res

    check_head_size(d)
    p = tqf.TQParams(d, seed, layer)
    kw, vw = _compress_keys(K, p, rt)
    dec = tqf.decode_cache(kw, vw, 1, K.shape[0], d)
    q_rot, q_jl, sums = tqf.rotate_q_parts(q[:, None, :], p)
    scales = {name: tqf.qjl_scale_value(name, d) for name in ("reference", "unbiased")}
    est = {name: [] for name in ESTIMATORS}
    for i in range(q.shape[0]):
        args = (q_rot[i, 0], q_jl[i, 0], sums[i, 0], dec.k_idx[0], dec.k_bits[0], dec.k_norm[0], dec.k_rnorm[0], p)
        for name in ("reference", "unbiased"):
            est[name].append(tqf.estimate_scores(*args, float(np.float32(scales[name]))))
        est["polar_only"].append(tqf.estimate_scores(*args, 0.0, polar_only=True))
    est = {k: np.concatenate(v) for k, v in est.items()}
    res = BiasResult(d, true, est, qjl_scales=scales)
    for name in ESTIMATORS:
        res.slopes[name] = _slope_origin(true, est[name])
        res.fits[name] = _fit(true, est[name])
    return res


def random_bias(d: int = 128, n_keys: int = 4096, n_queries: int = 8, rng_seed: int = 0, rt=None,
                seed: int = tqf.DEFAULT_SEED, layer: int = 0, bits: int = 2, outlier_share: float = 0.0) -> BiasResult:
    """inner_product_bias on Gaussian queries and keys."""
    rng = np.random.default_rng(rng_seed)
    q = rng.standard_normal((n_queries, d)).astype(np.float32)
    K = rng.standard_normal((n_keys, d)).astype(np.float32)
    return inner_product_bias(q, K, seed, layer, rt, bits, outlier_share)


def mse_unit_vectors(d: int, n: int, bits: int = 2, rt=None, rng_seed: int = 0,
                     seed: int = tqf.DEFAULT_SEED, layer: int = 0) -> float:
    """Mean |x - x_hat|^2 over n random unit vectors (uniform on the sphere) through the GPU compressor
    and the format's dequantisation, at `bits` (1-4) of the values' polar stage: the seed compressor at 2
    bits and d = 32/64/128, the general one otherwise (f32 reconstruction `dequantize_general`)."""
    if bits not in (1, 2, 3, 4):
        raise InvalidInput(f"bits must be 1, 2, 3 or 4, got {bits}",
                           "The paper's distortion at 1/2/3/4 bits is about 0.36/0.117/0.03/0.009.")
    if n <= 0:
        raise InvalidInput("n must be positive")

    rt = _runtime(rt)
    rng = np.random.default_rng(rng_seed)
    x = rng.standard_normal((n, d))
    x = (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)
    st = tqf.TQSettings(d, 2, bits, 0.0, seed, layer)
    if not (bits == 2 and d in tqf.SEED_HEAD_SIZES):
        check_general_head_size(d)
        batch = make_batch([n], 16)
        xs = np.ascontiguousarray(x[batch.token_pos][:, None, :])
        chans = tqf.choose_channels(xs, 0)
        gc = tqk.general_allocate(rt, st, batch, 1, chans, chans)
        rt.run(tqk.general_compress_dispatches(rt, gc, xs, xs, batch.slot_mapping))
        recs = qk.token_records(qk.read_cache(rt, gc.qc, "V"), batch, st.wpt("V"))
        xhat = tqf.dequantize_general(recs, chans, st, "V")[:, 0].astype(np.float64)
        return float(np.mean(np.sum((xs[:, 0].astype(np.float64) - xhat) ** 2, axis=1)))
    check_head_size(d)
    p = tqf.TQParams(d, seed, layer)
    kern = TurboQuantKernels(rt)
    cache = kern.allocate(1, d, n, seed, layer)
    kern.compress(cache, x[:, None, :], x[:, None, :])
    kw, vw = kern.read(cache)
    dec = tqf.decode_cache(kw, vw, 1, n, d)
    xhat = tqf.dequantize_polar(dec.v_idx[0], dec.v_norm[0], p)
    return float(np.mean(np.sum((x.astype(np.float64) - xhat) ** 2, axis=1)))
