"""Error metrics of a quantised path against the f32 baseline, and statistics of the codes.

Inputs are what the GPU kernels produced (baseline and quantised decode outputs and attention
weights); nothing here recomputes the quantised path in numpy.
"""
from __future__ import annotations

from dataclasses import dataclass, field

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


def mean_and_error(x: np.ndarray) -> tuple[float, float]:
    """The mean of x and its standard error as llama.cpp's perplexity tool gives them (mean_and_uncertainty):
    f = sum/N, error = sqrt((sum2/N - f^2)/(N - 1)) (float64); 0 when that variance is <= 0, and no error (NaN)
    for N <= 10, where llama.cpp prints 0 as well."""
    x = np.asarray(x, np.float64)
    n = x.size
    if n < 1:
        return float("nan"), float("nan")
    f = float(x.sum() / n)
    if n <= 10:
        return f, float("nan")
    var = float((x * x).sum() / n - f * f)
    return f, (float(np.sqrt(var / (n - 1))) if var > 0 else 0.0)


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


@dataclass(frozen=True)
class Statistic:
    """One named statistic of a cache's codes, with the one-line definition the window shows as its
    tooltip and the report prints next to it. unit: "fraction" (shown as a percentage), "bits" or
    "value" (in the input's units)."""

    name: str
    label: str
    value: float
    definition: str
    unit: str = "fraction"

    def text(self) -> str:
        v = self.value
        if not np.isfinite(v):
            return "n/a"
        if self.unit == "fraction":
            return f"{100.0 * v:.2f}%"
        if self.unit == "bits":
            return f"{v:.3f} bits"
        return f"{v:.4g}"


@dataclass
class CodeStats:
    """The histogram and the statistics of one of K or V over the real tokens.

    The histogram has one bin per representable code (zero counts included), in code order: integer
    codes sit at their own value (`bins` = the codes), float codes (FP8, FP4) at their index among the
    format's values in increasing order (`bins` = 0, 1, ...; `bin_values` the values they stand for), so
    bars of width 1 tile the axis without gaps. `stats` holds what the method defines (see
    KVMethod.code_statistics), each with its definition.
    """

    bins: np.ndarray  # x position of each bar
    bin_values: np.ndarray  # the code value of each bar
    counts: np.ndarray  # codes that took each value
    total: int
    stats: dict = field(default_factory=dict)  # name -> Statistic, in display order
    axis: str = "code"  # the x axis: "code" (integer codes) or "code index" (values in order)

    @property
    def values(self) -> np.ndarray:
        """The code values that occur (bins with a non-zero count)."""
        return self.bin_values[self.counts > 0]

    def value(self, name: str) -> float:
        return float(self.stats[name].value)

    def definitions(self) -> dict:
        return {n: s.definition for n, s in self.stats.items()}

    def to_json(self) -> dict:
        out = {n: (float(s.value) if np.isfinite(s.value) else None) for n, s in self.stats.items()}
        out["total"] = int(self.total)
        out["definitions"] = self.definitions()
        return out


# The statistics most methods share; a method's code_statistics may add its own.
SATURATED = ("saturated", "saturated", "share of the values that would have needed a code beyond the code range "
             "(clipped to the end code)")
ZEROED = ("zeroed", "zeroed non-zeros", "share of the non-zero inputs whose dequantised value is exactly 0")
RANGE_USED = ("range_used", "range used", "share of the representable codes that occur at least once")


def histogram(codes: np.ndarray, code_range, code_values: np.ndarray | None = None):
    """(bins, bin_values, counts, axis) of flat codes: every integer of code_range for integer codes,
    every value of `code_values` (a float format's values in increasing order) for float codes, the
    distinct values seen when neither applies."""
    c = np.asarray(codes).reshape(-1)
    lo, hi = code_range
    if code_values is None and float(lo) == int(lo) and float(hi) == int(hi) and (c.size == 0 or np.all(np.mod(c, 1) == 0)):
        lo, hi = int(lo), int(hi)
        if c.size:
            lo, hi = min(lo, int(c.min())), max(hi, int(c.max()))
        bins = np.arange(lo, hi + 1, dtype=np.int64)
        counts = np.bincount((c.astype(np.int64) - lo), minlength=len(bins)).astype(np.int64)
        return bins, bins.copy(), counts, "code"
    vals = np.asarray(code_values if code_values is not None else np.unique(c), np.float64)
    vals = np.unique(vals[np.isfinite(vals)]) + 0.0
    if c.size:
        vals = np.union1d(vals, np.unique(c.astype(np.float64))) + 0.0  # a value outside the declared set still shows
    idx = np.searchsorted(vals, c.astype(np.float64))
    counts = np.bincount(idx, minlength=len(vals)).astype(np.int64)
    return np.arange(len(vals), dtype=np.int64), vals, counts, "code index"


def beyond_range(u: np.ndarray, code_range, values: np.ndarray | None = None) -> np.ndarray:
    """Which unrounded codes u would need a code beyond the range: integer codes when round-half-even(u)
    leaves [lo, hi]; float codes (`values`, the format's values in order) when u lies past the largest
    value by more than half the last gap (round to nearest; an exact tie counts as in range, as E4M3's
    464 rounds to even 448; the FP8 methods pass their exact rule through `saturated_codes`)."""
    u = np.asarray(u, np.float64)
    lo, hi = code_range
    if values is None:
        r = np.rint(u)
        return (r < lo) | (r > hi)
    v = np.asarray(values, np.float64)
    top = v[-1] + (v[-1] - v[-2]) / 2 if len(v) > 1 else v[-1]
    bot = v[0] - (v[1] - v[0]) / 2 if len(v) > 1 else v[0]
    return (u > top) | (u < bot)


def code_stats(codes: np.ndarray, code_range, mask: np.ndarray | None = None, *, x: np.ndarray | None = None,
               dequantised: np.ndarray | None = None, unrounded: np.ndarray | None = None,
               code_values: np.ndarray | None = None, extra: list | None = None,
               saturation: str = SATURATED[2], saturated: np.ndarray | None = None) -> CodeStats:
    """Histogram and statistics of codes over the token rows `mask` selects (all rows when None).

    x: the inputs the codes stand for, dequantised: the method's reconstruction of them, unrounded: the
    code each input would get before rounding and clamping (same shape as codes). Each statistic is
    given only when its inputs are: saturated (needs unrounded), zeroed (needs x and dequantised),
    range_used (always); `saturated`, a boolean mask, replaces the range rule on `unrounded`. extra: more Statistic objects, appended.
    """
    def rows(a):
        if a is None:
            return None
        a = np.asarray(a)
        return (a[np.asarray(mask, bool)] if mask is not None else a).reshape(-1)

    c = rows(codes)
    bins, bin_values, counts, axis = histogram(c, code_range, code_values)
    stats = {}
    u = rows(unrounded)
    if saturated is not None:
        m = rows(saturated)
        stats["saturated"] = Statistic(*SATURATED[:2], float(np.count_nonzero(m)) / m.size if m.size else 0.0, saturation)
    elif u is not None:
        sat = beyond_range(u, code_range, bin_values if axis != "code" else None)
        n = int(np.count_nonzero(sat))
        stats["saturated"] = Statistic(*SATURATED[:2], n / u.size if u.size else 0.0, saturation)
    xi, d = rows(x), rows(dequantised)
    if xi is not None and d is not None and xi.size == d.size:
        nz = xi != 0
        stats["zeroed"] = Statistic(*ZEROED[:2], float(np.count_nonzero(nz & (d == 0))) / max(1, int(nz.sum())), ZEROED[2])
    if axis == "code" or code_values is not None:  # over the seen values alone it would always be 100%
        stats["range_used"] = Statistic(*RANGE_USED[:2], float(np.count_nonzero(counts)) / max(1, len(bins)), RANGE_USED[2])
    for st in extra or []:
        stats[st.name] = st
    return CodeStats(bins, bin_values, counts, int(c.size), stats, axis)


def index_stats(codes: np.ndarray, n_levels: int, mask: np.ndarray | None = None, what: str = "centroid") -> CodeStats:
    """Statistics of index codes (0 .. n_levels-1) that pick one of n_levels centroids: how evenly the
    indices use the centroids. No saturation: every input has a nearest centroid."""
    c = np.asarray(codes)
    c = (c[np.asarray(mask, bool)] if mask is not None else c).reshape(-1).astype(np.int64)
    counts = np.bincount(c, minlength=n_levels).astype(np.int64) if c.size else np.zeros(n_levels, np.int64)
    share = counts / max(1, c.size)
    p = share[share > 0]
    entropy = float(-(p * np.log2(p)).sum()) if p.size else 0.0
    bins = np.arange(len(counts), dtype=np.int64)
    stats = {
        "centroids_used": Statistic("centroids_used", f"{what}s used", float(np.count_nonzero(counts)) / max(1, n_levels),
                                    f"share of the {n_levels} {what}s that at least one index picks"),
        "centroid_share_min": Statistic("centroid_share_min", f"least used {what}", float(share.min()) if c.size else 0.0,
                                        f"share of the indices that pick the least used {what} (uniform: 1/{n_levels})"),
        "centroid_share_max": Statistic("centroid_share_max", f"most used {what}", float(share.max()) if c.size else 0.0,
                                        f"share of the indices that pick the most used {what} (uniform: 1/{n_levels})"),
        "index_entropy": Statistic("index_entropy", "index entropy", entropy,
                                   f"entropy of the {what} indices in bits (at most log2({n_levels}) = {np.log2(n_levels):.3g})",
                                   "bits"),
    }
    return CodeStats(bins, bins.copy(), counts, int(c.size), stats, "code")


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


def scaled_codes(x: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """x / scale in float32: x [tokens, kv_heads, D], scales [tokens, kv_heads] (one per token) or
    [tokens, kv_heads, G] (one per D/G channels). A zero scale (an all-zero group) gives code 0. This is
    the code before rounding and clamping of a symmetric quantiser: what saturation is measured from."""
    x = np.asarray(x, np.float32)
    s = np.asarray(scales, np.float32)
    if s.ndim == x.ndim - 1:
        s = s[..., None]
    else:
        s = np.repeat(s, x.shape[-1] // s.shape[-1], axis=-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(s != 0, x / np.where(s != 0, s, np.float32(1)), np.float32(0)).astype(np.float32)


def format_values(dtype) -> np.ndarray:
    """Every finite value of an 8-bit float dtype (ml_dtypes), in increasing order, -0 folded into 0."""
    v = np.arange(256, dtype=np.uint8).view(dtype).astype(np.float64)
    return np.unique(v[np.isfinite(v)]) + 0.0  # + 0.0: -0 reads as 0


def levels_used(groups: np.ndarray, n_levels: int, axis: int) -> np.ndarray:
    """Share of the n_levels codes each group uses: distinct codes along `axis` / n_levels."""
    g = np.sort(np.moveaxis(np.asarray(groups), axis, -1), axis=-1)
    if g.shape[-1] == 0:
        return np.zeros(g.shape[:-1])
    distinct = 1 + np.count_nonzero(np.diff(g, axis=-1), axis=-1)
    return distinct / float(n_levels)
