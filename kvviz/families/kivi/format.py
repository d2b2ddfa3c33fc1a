"""KIVI's cache layout (arXiv:2402.02750): which positions are quantised, key groups, strides.

For a sequence of length L and option `recent` R, positions [0, n_q) are quantised with
n_q(L) = floor(max(L - R, 0) / GROUP) * GROUP; positions [n_q, L) stay float32 (the residual). Keys
are quantised per channel over groups of GROUP consecutive positions, values per token (both with
the asymmetric codes of kvviz/families/int4/format.py).

Buffers (u32 words unless noted), KW = D*bits/32 code words a token, WS = D*bs/16 side words a block:
  K   [num_blocks, kv_heads, bs*KW + WS]: per (block, head) the bs tokens' code words, then WS words
      of the sequence's side stream: for group g and channel c, word 2D*g + 2c = scale and
      2D*g + 2c + 1 = zero (f32 bits); stream word o lives in the sequence's logical block o // WS
      at offset o % WS (2 f32 per channel per GROUP tokens for every block size).
  V   [num_blocks, kv_heads, bs*(KW + 2)]: per token [codes KW | scale | zero].
  res [total_residual, 2 (K, V), kv_heads, D] float32: residual rows, sequence by sequence
      (res_off of a sequence = number of residual rows of the sequences before it).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

GROUP = 32
BITS = (2, 4)


def n_quantised(L: int, recent: int) -> int:
    return max(0, int(L) - int(recent)) // GROUP * GROUP


@dataclass
class Plan:
    context_lens: np.ndarray  # [S]
    n_q: np.ndarray  # [S]
    res_off: np.ndarray  # [S]
    total_res: int

    def seq_info(self) -> np.ndarray:
        """[S, 4] u32: (context_len, n_q, res_off, 0), as the kernels read it."""
        S = len(self.context_lens)
        out = np.zeros((S, 4), np.uint32)
        out[:, 0] = self.context_lens
        out[:, 1] = self.n_q
        out[:, 2] = self.res_off
        return out


def plan(context_lens, recent: int) -> Plan:
    L = np.asarray(context_lens, dtype=np.int64)
    nq = np.array([n_quantised(x, recent) for x in L], dtype=np.int64)
    cnt = L - nq
    off = np.concatenate([[0], np.cumsum(cnt)[:-1]]).astype(np.int64) if len(L) else np.zeros(0, np.int64)
    return Plan(L, nq, off, int(cnt.sum()))


def kw(head_size: int, bits: int) -> int:
    """Code words of one token."""
    return head_size * bits // 32


def ws(head_size: int, block_size: int) -> int:
    """Side-stream words of one (block, KV head)."""
    return head_size * block_size // 16


def k_stride(head_size: int, block_size: int, bits: int) -> int:
    """Words of one (block, KV head) of the K buffer."""
    return block_size * kw(head_size, bits) + ws(head_size, block_size)
