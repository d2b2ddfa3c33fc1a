"""Metrics of a live decode (kvviz.live.decode): next-token KL of the quantised path against the f32
baseline, top-1 agreement, and the texts both paths generate.

The per-step KL is KL(p_f32 || p_quant) of the next-token distributions, in nats, computed in float64
from the logits. In a live run it is measured teacher-forced: both paths were fed the baseline's
tokens, so step i compares two distributions over the same prefix. A run's statistics rest on its steps
(one position each): `n_positions`, with the standard errors of the mean KL and of the top-1 agreement by
llama.cpp's formulas (kvviz/quality/stats.py); `kvviz eval` measures thousands of positions.
"""
from __future__ import annotations

from typing import Iterable, Mapping

import numpy as np

from kvviz.metrics import mean_and_error


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """log p along the last axis, float64."""
    z = np.asarray(logits, dtype=np.float64)
    z = z - z.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def kl_logits(logits_p: np.ndarray, logits_q: np.ndarray) -> float:
    """KL(p || q) in nats from two logit vectors (p = softmax(logits_p))."""
    lp, lq = log_softmax(logits_p), log_softmax(logits_q)
    return float(max(np.sum(np.exp(lp) * (lp - lq)), 0.0))


def _get(step, name, default=None):
    if isinstance(step, Mapping):
        return step.get(name, default)
    return getattr(step, name, default)


def _error_or_none(err: float) -> float | None:
    """A standard error, or None where there is none (too few positions): NaN is not JSON."""
    return float(err) if np.isfinite(err) else None


def summarize_live(steps: Iterable, texts: Mapping[str, str] | None = None) -> dict:
    """Summary of a live run from its steps (kvviz.live.decode.LiveStep objects or their dicts).

    Returns mean/max/median KL, top-1 agreement rate, the free-running comparison (first step where
    the quantised path's own continuation leaves the baseline's, and the share of positions where the
    two generated token sequences agree), per-step lists and the texts.
    """
    steps = list(steps)
    kl = np.array([float(_get(s, "kl")) for s in steps], dtype=np.float64)
    agree = np.array([bool(_get(s, "top1_agree")) for s in steps], dtype=bool)
    nll_d = np.array([float(_get(s, "nll_delta", np.nan)) for s in steps], dtype=np.float64)
    base = [int(_get(s, "base_token")) for s in steps]
    free = [_get(s, "free_token") for s in steps]
    has_free = bool(steps) and all(f is not None for f in free)
    out = {
        "n_steps": len(steps),
        "kl_definition": "KL(p_f32 || p_quant) of the next-token distribution, nats, teacher-forced "
                         "(both paths fed the f32 baseline's tokens)",
        "n_positions": int(kl.size),
        "kl_mean": float(kl.mean()) if kl.size else float("nan"),
        "kl_err": _error_or_none(mean_and_error(kl)[1] if kl.size else float("nan")),
        "kl_median": float(np.median(kl)) if kl.size else float("nan"),
        "kl_max": float(kl.max()) if kl.size else float("nan"),
        "kl_max_step": int(kl.argmax()) if kl.size else -1,
        "top1_agree_rate": float(agree.mean()) if agree.size else float("nan"),
        # no error below 11 positions, as for the KL: None (JSON null), so a summary compares equal to itself
        "top1_agree_err": (float(np.sqrt(agree.mean() * (1 - agree.mean()) / (agree.size - 1))) if agree.size > 10
                           else None),
        "top1_disagree_steps": [int(i) for i in np.flatnonzero(~agree)],
        # mean over steps of -log p_quant(baseline token) + log p_f32(baseline token)
        "nll_delta_mean": float(np.nanmean(nll_d)) if np.isfinite(nll_d).any() else float("nan"),
        "per_step": {
            "kl": kl.tolist(),
            "top1_agree": agree.tolist(),
            "base_token": base,
            "quant_token": [int(_get(s, "quant_token")) for s in steps],
            "base_str": [_get(s, "base_str", "") for s in steps],
            "quant_str": [_get(s, "quant_str", "") for s in steps],
            "base_p": [float(_get(s, "base_p", np.nan)) for s in steps],
            "quant_p_of_base": [float(_get(s, "quant_p_of_base", np.nan)) for s in steps],
        },
    }
    if has_free:
        free = [int(f) for f in free]
        diverge = next((i for i, (a, b) in enumerate(zip(base, free)) if a != b), None)
        out["free_first_divergence"] = diverge  # None: the quantised path generated the baseline's text
        out["free_token_match_rate"] = float(np.mean([a == b for a, b in zip(base, free)]))
        out["per_step"]["free_token"] = free
        out["per_step"]["free_str"] = [_get(s, "free_str", "") for s in steps]
    if texts:
        out["texts"] = dict(texts)
    return out


def table_row(summary: dict, method: str) -> str:
    """One markdown table row: method | mean KL | max KL | top-1 agreement | free-run divergence."""
    div = summary.get("free_first_divergence", "-")
    div = "never" if div is None else div
    return (f"| {method} | {summary['kl_mean']:.4g} | {summary['kl_max']:.4g} | "
            f"{summary['top1_agree_rate']:.3f} | {div} |")
