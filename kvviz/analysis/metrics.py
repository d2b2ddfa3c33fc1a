"""Error metrics of a quantised path against the f32 baseline, and statistics of the codes.

Inputs are what the GPU kernels produced (baseline and quantised decode outputs and attention
weights); nothing here recomputes the quantised path in numpy.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvviz.errors import NonFiniteResult


def require_finite(what: str, a: np.ndarray) -> None:
    """NonFiniteResult when `a` has NaN/Inf: a metric of NaN weights is not a number to show (it once read
    as KL 0, top-8 overlap 1.0: a perfect result)."""
    bad = ~np.isfinite(a)
    if bad.any():
        first = tuple(int(i) for i in np.argwhere(bad)[0])
        raise NonFiniteResult(f"cannot measure: the {what} have {int(bad.sum())} NaN/Inf values of {a.size} "
                              f"(first at index {first})")


@dataclass
class AttentionMetrics:
    """Per (sequence, head) arrays [num_seqs, num_heads]."""

    max_weight_err: np.ndarray
    kl: np.ndarray  # KL(f32 || quantised) over positions, nats
    cosine: np.ndarray  # cosine similarity of the decode outputs
    rel_l2: np.ndarray  # |o_q - o_f32| / |o_f32|
    topk_overlap: np.ndarray  # |topk(w_f32) & topk(w_q)| / k
    k: int

    def summary(self) -> dict:
        return {
            "max_weight_err": float(self.max_weight_err.max()),
            "kl_mean": float(self.kl.mean()),
            "kl_max": float(self.kl.max()),
            "cosine_min": float(self.cosine.min()),
            "cosine_mean": float(self.cosine.mean()),
            "rel_l2_mean": float(self.rel_l2.mean()),
            "rel_l2_max": float(self.rel_l2.max()),
            f"top{self.k}_overlap_mean": float(self.topk_overlap.mean()),
        }


def kl_divergence(p: np.ndarray, q: np.ndarray, eps: float = 1e-30) -> np.ndarray:
    """KL(p || q) along the last axis, both renormalised (the kernels' 1e-6 makes sums 1 - tiny);
    q is floored at `eps` inside the log, so a weight flushed to 0 costs a large but finite amount."""
    p = np.asarray(p, np.float64)
    q = np.asarray(q, np.float64)
    require_finite("reference weights p", p)
    require_finite("compared weights q", q)
    p = p / np.maximum(p.sum(-1, keepdims=True), eps)
    q = q / np.maximum(q.sum(-1, keepdims=True), eps)
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(p > 0, p * (np.log(np.maximum(p, eps)) - np.log(np.maximum(q, eps))), 0.0)
    return np.maximum(terms.sum(-1), 0.0)


def attention_metrics(w_ref, w_q, out_ref, out_q, context_lens, k: int = 8) -> AttentionMetrics:
    w_ref = np.asarray(w_ref, np.float64)
    w_q = np.asarray(w_q, np.float64)
    o_r = np.asarray(out_ref, np.float64)
    o_q = np.asarray(out_q, np.float64)
    for what, a in (("f32 attention weights", w_ref), ("quantised attention weights", w_q),
                    ("f32 decode output", o_r), ("quantised decode output", o_q)):
        require_finite(what, a)
    S, H, _ = w_ref.shape
    max_err = np.abs(w_ref - w_q).max(-1)
    kl = kl_divergence(w_ref, w_q)
    dot = (o_r * o_q).sum(-1)
    nr, nq = np.linalg.norm(o_r, axis=-1), np.linalg.norm(o_q, axis=-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        cos = np.where((nr > 0) & (nq > 0), dot / (nr * nq), np.where((nr == 0) & (nq == 0), 1.0, 0.0))
        rel = np.where(nr > 0, np.linalg.norm(o_q - o_r, axis=-1) / np.where(nr > 0, nr, 1), np.linalg.norm(o_q, axis=-1))
    overlap = np.zeros((S, H))
    for s in range(S):
        n = int(context_lens[s])
        kk = min(k, n)
        if kk == 0:
            overlap[s] = 1.0
            continue
        a = np.argsort(-w_ref[s, :, :n], axis=-1, kind="stable")[:, :kk]
        b = np.argsort(-w_q[s, :, :n], axis=-1, kind="stable")[:, :kk]
        for h in range(H):
            overlap[s, h] = len(set(a[h]) & set(b[h])) / kk
    return AttentionMetrics(max_err, kl, cos, rel, overlap, k)


@dataclass
class CodeStats:
    values: np.ndarray  # distinct code values (bins)
    counts: np.ndarray
    clip_rate: float  # fraction of codes at the smallest or largest representable code
    zero_fraction: float
    range_used: float  # (max code seen - min code seen) / (code range)
    total: int

    def to_json(self) -> dict:
        return {
            "clip_rate": self.clip_rate,
            "zero_fraction": self.zero_fraction,
            "range_used": self.range_used,
            "total": self.total,
        }


def code_stats(codes: np.ndarray, code_range: tuple[float, float], mask: np.ndarray | None = None) -> CodeStats:
    """Histogram of integer codes (or FP8 values) over the real tokens (`mask` over token rows)."""
    c = np.asarray(codes)
    if mask is not None:
        c = c[np.asarray(mask, dtype=bool)]
    c = c.reshape(-1)
    lo, hi = code_range
    if c.size == 0:
        return CodeStats(np.zeros(0), np.zeros(0, np.int64), 0.0, 0.0, 0.0, 0)
    vals, counts = np.unique(c, return_counts=True)
    clip = float(np.count_nonzero((c <= lo) | (c >= hi))) / c.size
    zero = float(np.count_nonzero(c == 0)) / c.size
    span = float(hi - lo) if hi > lo else 1.0
    used = (float(c.max()) - float(c.min())) / span
    return CodeStats(vals, counts, clip, zero, used, int(c.size))


def channel_amax(x: np.ndarray, token_rows: np.ndarray) -> np.ndarray:
    """Per-channel max |x| for each KV head over the given token rows: [kv_heads, D]."""
    if len(token_rows) == 0:
        return np.zeros(x.shape[1:], np.float32)
    return np.abs(x[token_rows]).max(axis=0)


def outlier_ratio(amax_channels: np.ndarray) -> float:
    """max / median of per-channel |x| maxima: ~1-2 for Gaussian data, >4 with outlier channels."""
    a = np.asarray(amax_channels, np.float64).reshape(-1)
    med = np.median(a)
    return float(a.max() / med) if med > 0 else float("inf")
