"""Host checks that keep non-finite numbers out of the results (Qt-free).

`check_logits` refuses, before any dispatch, inputs whose f32 attention logits would overflow: the
kernels compute the dot product q.k in float32 and then multiply by the softmax scale, so a finite
q and k of magnitude ~1e20 give logits of ~1e40 = inf, and every weight becomes NaN. The check is
float64 over the actual data: a bound on every partial sum of the f32 dot product
(max(1, scale) * sum_i |q_i k_i|) and the exact logits scale * q.k, computed per position only when the
cheap bound max(1, scale) * max|k| * sum_i |q_i| exceeds the float32 range.

`check_finite_result` rejects a GPU result read back with NaN/Inf, naming the kernel that produced it.
"""
from __future__ import annotations

import numpy as np

from kvviz.errors import InvalidInput, NonFiniteResult

F32_MAX = float(np.finfo(np.float32).max)
_CHUNK = 8192  # token rows per float64 chunk (bounded memory at long contexts)


def logit_bounds(batch, key: np.ndarray, q: np.ndarray, scale: float):
    """(bound, exact) [num_seqs, num_heads] float64: bound = max(1, scale) * max over positions of
    sum_i |q_i k_i| (no partial sum of the f32 dot product, before or after scaling, exceeds it);
    exact = max over positions of |scale * q.k|. Heads map to KV heads as in the kernels (h // group)."""
    S, H, D = q.shape
    kvh = key.shape[1]
    g = max(H // kvh, 1)
    q64 = np.asarray(q, np.float64).reshape(S, kvh, g, D)
    qa = np.abs(q64)
    bound = np.zeros((S, H))
    exact = np.zeros((S, H))
    for s in range(S):
        rows = batch.token_rows(s)
        for a in range(0, len(rows), _CHUNK):
            k = np.asarray(key[rows[a:a + _CHUNK]], np.float64).transpose(1, 0, 2)  # [kvh, n, D]
            dot = np.matmul(q64[s], k.transpose(0, 2, 1)).reshape(H, -1)  # [kvh, g, n] -> [H, n] (BLAS)
            absdot = np.matmul(qa[s], np.abs(k).transpose(0, 2, 1)).reshape(H, -1)
            exact[s] = np.maximum(exact[s], np.abs(dot).max(-1) * abs(scale))
            bound[s] = np.maximum(bound[s], absdot.max(-1) * max(1.0, abs(scale)))
    return bound, exact


def quick_bound(batch, key: np.ndarray, q: np.ndarray, scale: float) -> float:
    """A cheap upper bound of every logit_bounds bound: max(1, scale) * max|k| * sum_i |q_i| (exact max |k| in
    float32, the rest float64), over all sequences and heads."""
    S, H, D = q.shape
    kvh = key.shape[1]
    g = max(H // kvh, 1)
    q1 = np.abs(np.asarray(q, np.float64)).sum(-1).reshape(S, kvh, g).max(-1)  # [S, kvh]
    if key.shape[0] == 0 or D == 0:
        return 0.0
    rowmax = np.maximum(key.max(-1), -key.min(-1))  # [tokens, kvh] max |k|, no |key| copy
    worst = 0.0
    for s in range(S):
        rows = batch.token_rows(s)
        if len(rows):
            kmax = rowmax[rows].max(0).astype(np.float64)  # [kvh]
            worst = max(worst, float((kmax * q1[s]).max()))
    return worst * max(1.0, abs(scale))


def check_logits(batch, key: np.ndarray, q: np.ndarray, scale: float) -> None:
    """InvalidInput when the f32 logits scale * q.k (or a partial sum of q.k) would overflow float32."""
    if quick_bound(batch, key, q, scale) <= F32_MAX:
        return  # the usual case: no need for the per-position pass
    bound, exact = logit_bounds(batch, key, q, scale)
    bad = bound > F32_MAX
    if not bad.any():
        return
    s, h = np.unravel_index(int(np.argmax(bound)), bound.shape)
    n = int(bad.sum())
    raise InvalidInput(
        f"the f32 logits scale*q.k overflow float32 for sequence {s} head {h}: |logit| bound "
        f"{bound[s, h]:.3g} > {F32_MAX:.2g} (exact max |scale*q.k| {exact[s, h]:.3g}; {n} of {bound.size} "
        f"(sequence, head) pairs overflow)",
        "The softmax would see inf and every attention weight would be NaN. Scale q or K down (check the "
        "dump's units); nothing was dispatched.",
    )


def check_finite_result(what: str, kernel: str, arr) -> None:
    """NonFiniteResult when a GPU result [num_seqs, num_heads, ...] has NaN/Inf: `what` it is, from `kernel`."""
    a = np.asarray(arr)
    if a.dtype.kind != "f":
        return
    bad = ~np.isfinite(a)
    if not bad.any():
        return
    first = tuple(int(i) for i in np.argwhere(bad)[0])
    where = f"sequence {first[0]} head {first[1]}" if len(first) >= 2 else f"index {first}"
    raise NonFiniteResult(
        f"{kernel} returned {int(bad.sum())} NaN/Inf values of {a.size} in the {what} (first at {where})")
