"""The statistics of a quality run, from per-position values, with llama.cpp's formulas.

llama.cpp's `llama-perplexity --kl-divergence` (tools/perplexity/perplexity.cpp) sums per position and
prints, for N scored positions:
  mean +- error   f = sum/N, error = sqrt((sum2/N - f^2)/(N - 1)) (0 when that variance is <= 0; none (NaN)
                  for N <= 10, where llama.cpp prints 0)
  PPL             exp(mean NLL) +- PPL * error(NLL)
  ln(PPL_q/PPL_b) mean(NLL_q) - mean(NLL_b) +- sqrt(e_q^2 + e_b^2 - 2 cov), cov = (sum_qb/N - m_q m_b)/(N - 1)
                  (0 when N < 10)
  KLD             mean +- error of the per-position KL(p_base || p_q); median and percentiles by linear
                  interpolation at fraction * (N - 1) of the sorted values (numpy's "linear")
  same top p      share of positions whose top token is the baseline's +- sqrt(p (1 - p)/(N - 1))
  RMS dp          dp = p_q(token) - p_base(token) of the text's next token: sqrt(mean dp^2) +-
                  0.5/RMS * error(dp^2)
The sums here are float64 over float64 values (llama.cpp adds float32 values into float64 sums).
Beyond llama.cpp: KLD against the position in the chunk (binned, each bin's mean with its error), and
the KLD distribution on fixed log10 bins (what the window draws and the history keeps).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from kvviz.metrics import mean_and_error  # llama.cpp's mean_and_uncertainty
from kvviz.quality.baseline import kld_from_codes, shifted_logits

PERCENTILES = (0.9, 0.95, 0.99, 0.999)
# log10 KLD bin edges of the stored distribution: 1e-10 .. 1e2 in tenths of a decade
HIST_LO, HIST_HI, HIST_STEP = -10.0, 2.0, 0.1
POSITION_BINS = 8


def covariance(a: np.ndarray, b: np.ndarray) -> float:
    """llama.cpp's covariance of the means of a and b (0 below 10 values)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    n = a.size
    if n < 10:
        return 0.0
    return float(((a * b).sum() / n - (a.sum() / n) * (b.sum() / n)) / (n - 1))


def percentile(sorted_values: np.ndarray, fraction: float) -> float:
    """llama.cpp's percentile of sorted values: linear interpolation at fraction * (N - 1)."""
    v = np.asarray(sorted_values, np.float64)
    if v.size == 0:
        return math.nan
    if fraction <= 0:
        return float(v[0])
    if fraction >= 1:
        return float(v[-1])
    p = fraction * (v.size - 1)
    i = int(p)
    p -= i
    return float((1 - p) * v[i] + p * v[min(i + 1, v.size - 1)])


@dataclass
class PositionValues:
    """Per scored position of one run against the baseline (float64 arrays of N, `position` the position in
    its chunk, `chunk` the chunk's index)."""

    nll: np.ndarray  # -log p_q(next token)
    nll_base: np.ndarray  # -log p_base(next token)
    kld: np.ndarray  # KL(p_base || p_q), nats
    same_top: np.ndarray  # bool: the run's top token is the baseline's
    p_diff: np.ndarray  # p_q(next token) - p_base(next token)
    position: np.ndarray  # int
    chunk: np.ndarray  # int

    @classmethod
    def concat(cls, parts: list["PositionValues"]) -> "PositionValues":
        names = cls.__dataclass_fields__
        if not parts:
            return cls(**{n: np.zeros(0, bool if n == "same_top" else np.int64 if n in ("position", "chunk")
                                     else np.float64) for n in names})
        return cls(**{n: np.concatenate([getattr(p, n) for p in parts]) for n in names})

    def __len__(self) -> int:
        return int(self.kld.size)


def summarize(v: PositionValues, ctx: int | None = None, bins: int = POSITION_BINS) -> dict:
    """The run's statistics: what llama.cpp prints, the KLD against position and its log10 histogram."""
    n = len(v)
    out: dict = {"scored_positions": n}
    if n == 0:
        return out
    lq, eq = mean_and_error(v.nll)
    lb, eb = mean_and_error(v.nll_base)
    cov = covariance(v.nll, v.nll_base)
    ratio_err = math.sqrt(max(eq * eq + eb * eb - 2.0 * cov, 0.0)) if n > 10 else math.nan
    ppl, ppl_b = math.exp(lq), math.exp(lb)
    kld_mean, kld_err = mean_and_error(v.kld)
    ks = np.sort(v.kld)
    mse, mse_err = mean_and_error(v.p_diff * v.p_diff)
    rms = math.sqrt(mse)
    same = float(np.count_nonzero(v.same_top)) / n
    out.update({
        "ppl": ppl, "ppl_err": ppl * eq,
        "ppl_base": ppl_b, "ppl_base_err": ppl_b * eb,
        "ln_ppl_ratio": lq - lb, "ln_ppl_ratio_err": ratio_err,
        "ppl_ratio": math.exp(lq - lb), "ppl_ratio_err": math.exp(lq - lb) * ratio_err,
        "nll_correlation": cov / (eq * eb) if eq > 0 and eb > 0 else math.nan,
        "kld_mean": kld_mean, "kld_err": kld_err,
        "kld_median": percentile(ks, 0.5),
        **{f"kld_p{_pct_name(f)}": percentile(ks, f) for f in PERCENTILES},
        "kld_max": float(ks[-1]), "kld_min": float(ks[0]),
        "same_top": same, "same_top_err": math.sqrt(same * (1 - same) / (n - 1)) if n > 10 else math.nan,
        "dp_rms": rms, "dp_rms_err": 0.5 / rms * mse_err if rms > 0 else mse_err,
        "dp_mean": mean_and_error(v.p_diff)[0], "dp_max": float(np.max(np.abs(v.p_diff))),
    })
    out["kld_by_position"] = by_position(v, ctx, bins)
    out["kld_histogram"] = log_histogram(v.kld)
    return out


def _pct_name(f: float) -> str:
    """0.9 -> '90', 0.999 -> '99_9' (a JSON key)."""
    s = f"{100 * f:.1f}".rstrip("0").rstrip(".")
    return s.replace(".", "_")


def by_position(v: PositionValues, ctx: int | None, bins: int = POSITION_BINS) -> dict:
    """KLD against the position in the chunk: `bins` equal ranges of the scored positions, each with its
    position range, count, mean KLD and error (llama.cpp's formula within the bin)."""
    lo = int(v.position.min())
    hi = int(v.position.max()) + 1 if ctx is None else int(ctx) - 1
    edges = np.unique(np.linspace(lo, hi, bins + 1).round().astype(np.int64))
    rows = []
    for a, b in zip(edges[:-1], edges[1:]):
        sel = (v.position >= a) & (v.position < b)
        m, e = mean_and_error(v.kld[sel]) if sel.any() else (math.nan, math.nan)
        rows.append({"from": int(a), "to": int(b), "count": int(sel.sum()), "kld_mean": m, "kld_err": e})
    return {"bins": rows}


def log_histogram(kld: np.ndarray) -> dict:
    """Counts of log10 KLD on fixed bins (HIST_LO..HIST_HI by HIST_STEP); values at or below 10^HIST_LO
    (zero included) are counted in `below`, values above 10^HIST_HI in `above`."""
    k = np.asarray(kld, np.float64)
    n_bins = int(round((HIST_HI - HIST_LO) / HIST_STEP))
    with np.errstate(divide="ignore", invalid="ignore"):
        lg = np.where(k > 0, np.log10(np.where(k > 0, k, 1.0)), -np.inf)
    below = int(np.count_nonzero(lg <= HIST_LO))
    above = int(np.count_nonzero(lg > HIST_HI))
    inside = lg[(lg > HIST_LO) & (lg <= HIST_HI)]
    counts, _ = np.histogram(inside, bins=n_bins, range=(HIST_LO, HIST_HI))
    return {"log10_from": HIST_LO, "log10_step": HIST_STEP, "counts": [int(c) for c in counts], "below": below,
            "above": above}


def histogram_edges(h: dict) -> np.ndarray:
    """The log10 bin edges of a `log_histogram` result."""
    n = len(h["counts"])
    return h["log10_from"] + h["log10_step"] * np.arange(n + 1)


def position_values(logits_q: np.ndarray, base, tokens: np.ndarray, position: np.ndarray,
                    chunk: int) -> PositionValues:
    """PositionValues of one chunk's scored rows: logits_q [N, vocab] of the run (or its log-probabilities),
    `base` the baseline's BaseRows of the same rows, `tokens` the next tokens [N]. KL(stored baseline || run) by
    kvviz.quality.baseline.kld_from_codes (the stored rows normalised, as decode_with_probs reads them)."""
    rows = np.arange(tokens.size)
    z, lse = shifted_logits(logits_q)
    nll = lse - z[rows, tokens]
    kld = np.maximum(kld_from_codes(np.asarray(base.codes), z, lse), 0.0)
    nll_b = np.asarray(base.nll, np.float64)
    return PositionValues(
        nll=nll, nll_base=nll_b, kld=kld, same_top=np.argmax(z, axis=1) == np.asarray(base.top),
        p_diff=np.exp(-nll) - np.exp(-nll_b), position=np.asarray(position, np.int64),
        chunk=np.full(tokens.size, int(chunk), np.int64))


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """log p along the last axis, float64."""
    z = np.array(logits, np.float64)
    z -= z.max(axis=-1, keepdims=True)
    z -= np.log(np.exp(z).sum(axis=-1, keepdims=True))
    return z
