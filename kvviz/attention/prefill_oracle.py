"""numpy reference of the causal prefill (kvviz/attention/prefill.py): exact causal attention in float64 over a
dequantised paged cache (each method's dequantised cache, from its family's own numpy oracle:
kvviz/families/prefill_oracles.py).

causal(): query t of sequence s (position context_lens[s] - q_lens[s] + t) attends to positions 0 .. its own,
softmax(scale * q.k) . v with the exact normaliser, every product and sum in float64; with a soft-cap c > 0 (Gemma 2)
each logit s = scale * q.k becomes c * tanh(s / c) before the mask and the softmax. The kernel accumulates in
float32 in another order (tiles of keys, an online softmax in base 2 with the query pre-scaled by scale * log2 e),
so it agrees within PREFILL_TOL(max |V|): see tolerance(). The cap does not widen it: tanh has slope at most 1, so
a capped logit carries no more error than the logit, plus tanh's own f32 rounding (a few ulp of c log2 e).
"""
from __future__ import annotations

import numpy as np

from kvviz.attention.paged_oracle import gather_sequence


def tolerance(max_abs_v: float) -> float:
    """|kernel - causal()| allowed: 2e-5 x max(1, max |V|), the fast decodes' bound (kvviz/attention/split_decode.py
    f32_tolerance). Why it holds: each output is a convex combination of V rows, so f32 rounding of the weights
    (relative ~1e-6 each, from the pre-scaled query's rounding, exp2 and the online rescale) moves it by at most a few
    1e-6 x max |V|, and the f32 sums of up to D products per score and up to tens of thousands of weighted rows per
    output add relative errors of order n x 2^-24 that the tiles keep short (sums of BK terms, rescaled per tile)."""
    return 2e-5 * max(1.0, float(max_abs_v))


def causal(q, k_cache_f, v_cache_f, block_tables, context_lens, q_lens, block_size: int, scale: float,
           rows=None, softcap: float = 0.0) -> np.ndarray:
    """[NQ, H, D] float64 from q [NQ, H, D] (the chunks of the sequences, one after the other) and dequantised caches
    [num_blocks, kv_heads, block_size, D]; rows: only these query rows (indices into q, in order), [len(rows), H, D];
    softcap: the logits' soft-cap (0: none)."""
    q = np.asarray(q, np.float64)
    NQ, H, D = q.shape
    kvh = k_cache_f.shape[1]
    G = H // kvh
    want = np.arange(NQ) if rows is None else np.asarray(rows, np.int64)
    out = np.zeros((len(want), H, D), np.float64)
    k_cache_f, v_cache_f = np.asarray(k_cache_f, np.float64), np.asarray(v_cache_f, np.float64)
    row = 0
    for s, n in enumerate(np.asarray(q_lens, np.int64)):
        n = int(n)
        sel = np.nonzero((want >= row) & (want < row + n))[0]
        if sel.size:
            L = int(context_lens[s])
            k = np.ascontiguousarray(gather_sequence(k_cache_f, block_tables[s], L, block_size))  # [kvh, L, D]
            v = np.ascontiguousarray(gather_sequence(v_cache_f, block_tables[s], L, block_size))
            t = want[sel] - row
            mask = np.arange(L)[None, :] <= (L - n + t)[:, None]  # [rows, L]: each query sees positions up to its own
            for h in range(H):
                logits = scale * (q[want[sel], h] @ k[h // G].T)
                if softcap:
                    logits = softcap * np.tanh(logits / softcap)
                logits = np.where(mask, logits, -np.inf)
                e = np.exp(logits - logits.max(-1, keepdims=True))
                out[sel, h] = (e / e.sum(-1, keepdims=True)) @ v[h // G]
        row += n
    return out
