"""Synthetic K/V/Q workloads with named presets, reproducible from a seed.

  gaussian      - i.i.d. N(0, 1): the easy case.
  llama-like    - keys with a few large-magnitude channels in every token (as real keys have,
                  see docs: per-channel max/median ~4.5 on SmolLM2) plus attention-sink tokens at
                  the start of each sequence; values milder.
  heavy-tailed  - Student-t (3 dof): rare huge entries stretch per-token scales.
  zeros         - all-zero K and V: the amax == 0 path of every quantiser.
  constant      - every element of a row equal: no spread inside a token.
"""
from __future__ import annotations

import numpy as np

from kvviz.errors import InvalidInput

PRESETS = ("gaussian", "llama-like", "heavy-tailed", "zeros", "constant")


def generate(preset: str, token_seq: np.ndarray, token_pos: np.ndarray, num_seqs: int, num_heads: int,
             num_kv_heads: int, head_size: int, seed: int = 0):
    """K, V [tokens, kv_heads, D] and Q [num_seqs, num_heads, D], float32.

    Token rows follow the batch's order (`token_seq`/`token_pos`, -1 for padding rows, which get
    zeros: the writer skips them anyway).
    """
    if preset not in PRESETS:
        raise InvalidInput(f"Unknown preset {preset!r}; choose one of {', '.join(PRESETS)}")
    rng = np.random.default_rng(seed)
    T = len(token_seq)
    shape = (T, num_kv_heads, head_size)
    q = rng.standard_normal((num_seqs, num_heads, head_size), dtype=np.float32)
    if preset == "gaussian":
        k = rng.standard_normal(shape, dtype=np.float32)
        v = rng.standard_normal(shape, dtype=np.float32)
    elif preset == "heavy-tailed":
        k = rng.standard_t(3, size=shape).astype(np.float32)
        v = rng.standard_t(3, size=shape).astype(np.float32)
    elif preset == "zeros":
        k = np.zeros(shape, np.float32)
        v = np.zeros(shape, np.float32)
    elif preset == "constant":
        k = np.repeat(rng.standard_normal((T, num_kv_heads, 1), dtype=np.float32), head_size, axis=2)
        v = np.repeat(rng.standard_normal((T, num_kv_heads, 1), dtype=np.float32), head_size, axis=2)
    else:  # llama-like
        k = rng.standard_normal(shape, dtype=np.float32)
        v = rng.standard_normal(shape, dtype=np.float32) * np.float32(0.5)
        n_out = max(2, head_size // 32)
        for h in range(num_kv_heads):
            ch = rng.choice(head_size, size=n_out, replace=False)
            # Outlier channels carry a large, mostly constant-sign offset in every token.
            k[:, h, ch] = k[:, h, ch] * np.float32(2.0) + rng.uniform(6, 12, size=n_out).astype(np.float32) * rng.choice([-1, 1], size=n_out)
            # Queries lean on the same channels, which makes those channels matter for the logits.
            group = num_heads // num_kv_heads
            q[h * group:(h + 1) * group][:, :, ch] += np.float32(0.5) * np.sign(k[0, h, ch])
        # Attention sinks: the first token of every sequence aligns with the mean query direction.
        sink = token_pos == 0
        if sink.any():
            qmean = q.mean(axis=(0, 1))
            qmean = qmean / (np.linalg.norm(qmean) + 1e-6)
            k[sink] += (np.float32(4.0 * np.sqrt(head_size)) * qmean).astype(np.float32)
    pad = np.asarray(token_seq) < 0
    k[pad] = 0
    v[pad] = 0
    return k.astype(np.float32), v.astype(np.float32), q.astype(np.float32)
