"""What the GPU forward runs: a decoder described by its weights (host f32 arrays, the numpy forward's layout) and the
switches of its architecture. `plan_of(model)` builds one from a loaded GGUF model (kvviz/sources/gguf_llama.py).

Beside the Llama decoder the plan carries what other families change (each a kernel or an epilogue of
kvviz/forward/kernels.py): biases of the Q/K/V, output, gate/up and down products and of the logits, per-head q/k
RMS norms, norms after the attention and the feed-forward block (added to the residual), GeGLU (GELU tanh) instead of
SwiGLU, an embedding scale, a query scale other than 1/sqrt(head size), soft-capping of the attention scores and of
the logits, sliding-window layers, RoPE bases and position scales per layer and a factor on RoPE's cos and sin.
Fused weights (one QKV, one gate/up matrix) are row blocks of one matrix: the plan lists a matrix as its row blocks,
in order. A model's layers are read when the forward asks for them (a model whose weights stay mapped dequantises
one layer at a time).
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from kvviz.errors import InvalidInput

_F32 = np.float32


@dataclass
class LayerPlan:
    attn_norm: np.ndarray  # [hidden]
    qkv: list  # row blocks of [nq*D + 2*nkv*D, hidden]: query heads, key heads, value heads
    wo: np.ndarray  # [hidden, nq*D]
    ffn_norm: np.ndarray  # [hidden]
    gate_up: list  # row blocks of [2*ffn, hidden]: gate rows, then up rows
    w_down: np.ndarray  # [hidden, ffn]
    qkv_bias: list | None = None  # blocks of [nq*D + 2*nkv*D]
    wo_bias: np.ndarray | None = None  # [hidden]
    gate_up_bias: list | None = None  # blocks of [2*ffn]
    down_bias: np.ndarray | None = None  # [hidden]
    q_norm: np.ndarray | None = None  # [D]: RMS norm of every query head
    k_norm: np.ndarray | None = None  # [D]
    post_attn_norm: np.ndarray | None = None  # [hidden]: x += norm(attention out . wo)
    post_ffn_norm: np.ndarray | None = None  # [hidden]: x += norm(ffn out)
    window: int = 0  # sliding window (positions a query sees, its own included); 0: all before it
    rope: int = 0  # which of the plan's RoPE tables the layer rotates with


@dataclass
class ForwardPlan:
    n_heads: int
    n_kv_heads: int
    head_size: int
    hidden: int
    ffn: int
    vocab: int
    rms_eps: float
    context_length: int
    tok_embd: np.ndarray  # [vocab, hidden]
    out_norm: np.ndarray  # [hidden]
    output: np.ndarray  # [vocab, hidden]; the same array as tok_embd when tied
    layers: Sequence = field(default_factory=list)  # LayerPlans (or a sequence that makes them when asked)
    inv_freq: np.ndarray | None = None  # [R/2] RoPE angular frequencies (float64), factors applied
    rope_scale: float = 1.0  # linear scaling: positions divided by it
    ropes: list = field(default_factory=list)  # (inv_freq, scale) per RoPE variant; default [(inv_freq, rope_scale)]
    rope_attn_factor: float = 1.0  # cos and sin multiplied by it
    rope_mode: str = "neox"  # "neox" (rotate-half, kvviz's layout) or "normal" (interleaved pairs)
    rope_dims: int = 0  # rotated dims of a head (0: all)
    act: str = "silu"  # "silu" (SwiGLU) or "gelu_tanh" (GeGLU)
    embed_scale: float = 1.0
    attn_scale: float = 0.0  # 0: 1/sqrt(head_size)
    attn_softcap: float = 0.0
    final_softcap: float = 0.0
    output_bias: np.ndarray | None = None  # [vocab]
    name: str = ""

    def __post_init__(self):
        if not self.ropes:
            self.ropes = [(self.inv_freq, self.rope_scale)]

    @property
    def n_layers(self) -> int:
        return len(self.layers)

    @property
    def tied(self) -> bool:
        return self.output is self.tok_embd

    @property
    def qkv_width(self) -> int:
        return (self.n_heads + 2 * self.n_kv_heads) * self.head_size

    @property
    def rotated(self) -> int:
        return self.rope_dims or self.head_size

    @property
    def scale(self) -> float:
        return self.attn_scale or 1.0 / math.sqrt(self.head_size)

    def rope_tables(self, positions: np.ndarray, which: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """cos, sin [T, R/2] f32 of the positions for RoPE variant `which`, as the numpy forward makes them:
        angles (positions / scale) * inv_freq in float64, cos and sin times the attention factor in float64, then
        rounded to f32."""
        inv, scale = self.ropes[which]
        ang = (np.asarray(positions, dtype=np.float64) / scale)[:, None] * np.asarray(inv, np.float64)[None, :]
        h = self.rotated // 2
        ang = ang[:, :h]
        return (np.ascontiguousarray((np.cos(ang) * self.rope_attn_factor).astype(_F32)),
                np.ascontiguousarray((np.sin(ang) * self.rope_attn_factor).astype(_F32)))


def inv_freq(head_size: int, theta: float, factors: np.ndarray | None = None) -> np.ndarray:
    """RoPE's per-pair angular frequencies [D/2] in float64 (the numpy forward's rope_inv_freq)."""
    inv = float(theta) ** (-np.arange(0, head_size, 2, dtype=np.float64) / head_size)
    return inv if factors is None else inv / np.asarray(factors, np.float64)


def _blocks(*arrays, sizes) -> list | None:
    """The arrays as row blocks of one vector, zeros where one is missing; None when all are."""
    if all(a is None for a in arrays):
        return None
    return [np.zeros(n, _F32) if a is None else a for a, n in zip(arrays, sizes)]


class _Layers(Sequence):
    """A model's layers as LayerPlans, made when asked for (the model's own layers may be read lazily)."""

    def __init__(self, model, rope_of: list[int]):
        self.model, self.rope_of = model, rope_of

    def __len__(self) -> int:
        return len(self.model.weights.layers)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        cfg, lw = self.model.config, self.model.weights.layers[i]
        nq, nkv, f = cfg.n_heads * cfg.head_size, cfg.n_kv_heads * cfg.head_size, cfg.ffn
        get = lambda name: getattr(lw, name, None)  # noqa: E731 (tensors an architecture may not have)
        window = cfg.window(i) if callable(getattr(cfg, "window", None)) else 0
        return LayerPlan(attn_norm=lw.attn_norm, qkv=[lw.wq, lw.wk, lw.wv], wo=lw.wo, ffn_norm=lw.ffn_norm,
                         gate_up=[lw.w_gate, lw.w_up], w_down=lw.w_down,
                         qkv_bias=_blocks(get("bq"), get("bk"), get("bv"), sizes=(nq, nkv, nkv)),
                         wo_bias=get("bo"), gate_up_bias=_blocks(get("b_gate"), get("b_up"), sizes=(f, f)),
                         down_bias=get("b_down"), q_norm=get("q_norm"), k_norm=get("k_norm"),
                         post_attn_norm=get("attn_post_norm"), post_ffn_norm=get("ffn_post_norm"),
                         window=int(window), rope=self.rope_of[i])


def plan_of(model) -> ForwardPlan:
    """The plan of a loaded model (kvviz/sources/gguf_llama.py: its config and weights, RoPE in kvviz's rotate-half
    layout); a ForwardPlan as it is."""
    if isinstance(model, ForwardPlan):
        return model
    cfg, w = getattr(model, "config", None), getattr(model, "weights", None)
    if cfg is None or w is None or not hasattr(w, "layers"):
        raise InvalidInput(f"the GPU forward runs loaded GGUF models, not {type(model).__name__}")
    d = cfg.head_size
    factors = getattr(w, "rope_freq_factors", None)
    ropes, rope_of = [], []
    for i in range(cfg.n_layers):
        layer_rope = getattr(cfg, "layer_rope", None)
        theta, scale = layer_rope(i) if callable(layer_rope) else (cfg.rope_theta, cfg.rope_scale)
        key = (float(theta), float(scale))
        if key not in [k for k, _ in ropes]:
            ropes.append((key, (inv_freq(d, theta, factors), float(scale))))
        rope_of.append([k for k, _ in ropes].index(key))
    tied = bool(getattr(w, "tied", w.output is w.tok_embd))
    embd = w.tok_embd
    qs = getattr(cfg, "query_scale", None)
    return ForwardPlan(n_heads=cfg.n_heads, n_kv_heads=cfg.n_kv_heads, head_size=d, hidden=cfg.hidden,
                       ffn=cfg.ffn, vocab=cfg.vocab, rms_eps=cfg.rms_eps, context_length=cfg.context_length,
                       tok_embd=embd, out_norm=w.out_norm, output=embd if tied else w.output,
                       layers=_Layers(model, rope_of), ropes=[r for _, r in ropes],
                       inv_freq=ropes[0][1][0], rope_scale=ropes[0][1][1],
                       rope_attn_factor=float(getattr(cfg, "rope_attn_factor", 1.0)),
                       act=str(getattr(cfg, "ffn_act", "silu")), embed_scale=float(getattr(cfg, "embed_scale", 1.0)),
                       attn_scale=float(qs) if qs else 0.0, attn_softcap=float(getattr(cfg, "attn_softcap", 0.0)),
                       final_softcap=float(getattr(cfg, "final_softcap", 0.0)),
                       output_bias=getattr(w, "output_bias", None), name=getattr(cfg, "name", ""))
