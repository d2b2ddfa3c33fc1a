"""A float32 numpy decoder that exposes its K/V/Q: batched prefill, incremental decode with a pluggable
attention, and captures of every layer's tensors. One forward for every architecture of
kvviz.sources.archs; what differs between them is in the model's config and weights:
  x = embedding * embed_scale
  per layer:  h = rmsnorm(x); q, k, v = h.Wq (+bq), h.Wk (+bk), h.Wv (+bv); per-head rmsnorm of q and k
              (when the layer has q/k norms); RoPE (the layer's base and scaling); attention with the
              query scale, soft-capped logits and the layer's sliding window; o = attn.Wo (+bo),
              rmsnorm(o) when the layer has a post-attention norm; x += o
              h = rmsnorm(x); m = act(h.Wgate) * (h.Wup) . Wdown (act: SiLU or tanh-GELU), rmsnorm(m)
              when the layer has a post-MLP norm; x += m
  logits = rmsnorm(x).Wout (+bias), soft-capped when the model caps them.

Layout of everything this module hands out:
  q           [layers, n_heads,    tokens, head_size]  after RoPE (not multiplied by the query scale)
  k_pre_rope  [layers, n_kv_heads, tokens, head_size]  before RoPE (after the per-head norm where there is one)
  k           [layers, n_kv_heads, tokens, head_size]  after RoPE (what a KV cache stores)
  v           [layers, n_kv_heads, tokens, head_size]
RoPE is rotate-half (Hugging Face layout); query head h reads KV head h // (n_heads // n_kv_heads).

The attention hook used by `LlamaRunner.step` (and token-by-token prefill) is
  attend(layer, q [n_heads, D], k_new [n_kv_heads, D], v_new [n_kv_heads, D], pos) -> out [n_heads, D]
with q and k_new after RoPE and `pos` the absolute position of the new token. The hook owns its cache:
it stores k_new/v_new at `pos` and attends over positions 0..pos (the last `config.window(layer)` of them
on a sliding-window layer), scaling q.k by `config.query_scale`. The runner still records K/V in its own
float32 cache, so a later default step, `kv()` and `capture()` stay valid whichever hook ran.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from kvviz.errors import Cancelled, InvalidInput  # noqa: F401  (Cancelled: cancel() returned True)
from kvviz.sources.archs import LlamaConfig
from kvviz.sources.gguf_llama import LlamaModel, nonfinite_weight

AttendFn = Callable[[int, np.ndarray, np.ndarray, np.ndarray, int], np.ndarray]
KvSinkFn = Callable[[int, np.ndarray, np.ndarray, int], None]
# attend_chunk(layer, q [T, n_heads, D], k [n_kv, T, D], v [n_kv, T, D], start) -> [T, n_heads, D]: the batched
# prefill's attention of one piece of T tokens at positions start..start+T-1 (q and k after RoPE), causal over
# positions 0..start+T-1; the hook owns its cache (it stores k, v at start.. before attending)
ChunkAttendFn = Callable[[int, np.ndarray, np.ndarray, np.ndarray, int], np.ndarray]
ProgressFn = Callable[[int, int], None]
CancelFn = Callable[[], bool]

_F32 = np.float32
_PREFILL_CHUNK = 512  # bounds the [heads, T, S] score tensor of long prompts


@dataclass
class Capture:
    q: np.ndarray  # [L, n_heads, T, D] after RoPE
    k_pre_rope: np.ndarray  # [L, n_kv, T, D]
    k: np.ndarray  # [L, n_kv, T, D] after RoPE
    v: np.ndarray  # [L, n_kv, T, D]
    tokens: np.ndarray  # [T] int64 token ids
    token_strings: list[str]
    config: LlamaConfig
    start_pos: int = 0  # absolute position of tokens[0]

    @property
    def n_tokens(self) -> int:
        return int(self.tokens.shape[0])


# ----------------------------------------------------------------------------------------------
# Building blocks (float32 in, float32 out)


def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    ms = np.mean(x * x, axis=-1, keepdims=True)
    return x * (_F32(1.0) / np.sqrt(ms + _F32(eps))) * w


def silu(x: np.ndarray) -> np.ndarray:
    # x*sigmoid(x) via tanh: no exp overflow for large |x|, stays float32.
    return x * (_F32(0.5) * (_F32(1.0) + np.tanh(_F32(0.5) * x)))


_GELU_C = _F32(np.sqrt(2.0 / np.pi))


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    """GELU, tanh approximation (Gemma's gelu_pytorch_tanh), in float32."""
    return _F32(0.5) * x * (_F32(1.0) + np.tanh(_GELU_C * (x + _F32(0.044715) * x * x * x)))


ACTIVATIONS = {"silu": silu, "gelu_tanh": gelu_tanh}


def softcap(x: np.ndarray, cap: float) -> np.ndarray:
    """cap * tanh(x / cap): logits kept inside (-cap, cap) (Gemma 2)."""
    c = _F32(cap)
    return np.tanh(x / c) * c


def rope_inv_freq(cfg: LlamaConfig, freq_factors: np.ndarray | None = None, theta: float | None = None) -> np.ndarray:
    """Per-pair angular frequencies [D/2] in float64 (base `theta`, default the config's)."""
    d = cfg.head_size
    base = cfg.rope_theta if theta is None else theta
    inv = base ** (-np.arange(0, d, 2, dtype=np.float64) / d)
    if freq_factors is not None:
        inv = inv / freq_factors.astype(np.float64)
    return inv


def rope_cos_sin(inv_freq: np.ndarray, positions: np.ndarray, scale: float = 1.0,
                 attn_factor: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """cos/sin tables [T, D] for rotate-half RoPE (angles in float64, tables in float32), times attn_factor."""
    ang = (np.asarray(positions, dtype=np.float64) / scale)[:, None] * inv_freq[None, :]
    ang = np.concatenate([ang, ang], axis=-1)
    return (np.cos(ang) * attn_factor).astype(_F32), (np.sin(ang) * attn_factor).astype(_F32)


def apply_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Rotate-half RoPE on [..., T, D] with tables [T, D]."""
    h = x.shape[-1] // 2
    rot = np.concatenate([-x[..., h:], x[..., :h]], axis=-1)
    return x * cos + rot * sin


def gqa_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, q_start: int | None = None, *,
                  scale: float | None = None, cap: float = 0.0, window: int = 0, k_start: int = 0,
                  q_pos: np.ndarray | None = None) -> np.ndarray:
    """Causal softmax(cap(scale * q.k)).v with grouped KV heads.

    q [n_heads, T, D]; k, v [n_kv, S, D] holding positions k_start..k_start+S-1; query i sits at absolute
    position q_start + i (default k_start + S - T), or at q_pos[i] when the queries' positions are given (any
    positions, e.g. every 16th of a chunk), and sees keys up to its position, and with `window` > 0 only the
    last `window` of them. scale defaults to 1/sqrt(D); cap > 0 soft-caps the logits.
    Returns [n_heads, T, D] float32.
    """
    nh, t, d = q.shape
    nkv, s, _ = k.shape
    if q_start is None:
        q_start = k_start + s - t
    g = nh // nkv
    qg = q.reshape(nkv, g, t, d)
    sc = _F32(1.0 / np.sqrt(d) if scale is None else scale)
    scores = np.matmul(qg, k.transpose(0, 2, 1)[:, None]) * sc  # [nkv, g, T, S]
    if cap:
        scores = softcap(scores, cap)
    kpos = k_start + np.arange(s)[None, :]
    qpos = (q_start + np.arange(t))[:, None] if q_pos is None else np.asarray(q_pos, np.int64).reshape(t, 1)
    mask = kpos > qpos
    if window:
        mask = mask | (qpos - kpos >= window)
    if mask.any():
        scores = np.where(mask, _F32(-np.inf), scores)
    scores = scores - scores.max(axis=-1, keepdims=True)
    p = np.exp(scores)
    p /= p.sum(axis=-1, keepdims=True)
    out = np.matmul(p, v[:, None])  # [nkv, g, T, D]
    return out.reshape(nh, t, d)


def _linear(x: np.ndarray, w: np.ndarray, b: np.ndarray | None) -> np.ndarray:
    y = x @ w.T
    return y if b is None else y + b


# ----------------------------------------------------------------------------------------------
# Runner


class LlamaRunner:
    """Holds a model and one sequence's state: position, float32 KV cache, recorded Q / pre-RoPE K."""

    def __init__(self, model: LlamaModel, *, record: bool = True):
        self.model = model
        self.cfg = model.config
        self.record = record
        cfg, w = self.cfg, model.weights
        self._act = ACTIVATIONS[cfg.ffn_act]
        # (inverse frequencies, position divisor) of each layer: windowed layers may have their own base
        self._rope = []
        by_base: dict = {}
        for li in range(cfg.n_layers):
            theta, scale = cfg.layer_rope(li)
            if theta not in by_base:
                by_base[theta] = rope_inv_freq(cfg, w.rope_freq_factors, theta)
            self._rope.append((by_base[theta], scale))
        self._cap = 0
        self._k = self._v = self._q = self._kpre = None
        self.reset()

    # -- state ---------------------------------------------------------------------------------

    def reset(self) -> None:
        """Forget the sequence (the cache buffers are kept for reuse)."""
        self.pos = 0
        self.tokens: list[int] = []
        self.last_logits: np.ndarray | None = None

    def _ensure(self, n: int) -> None:
        if n <= self._cap:
            return
        cfg = self.cfg
        cap = max(n, 2 * self._cap, 64)
        L, D = cfg.n_layers, cfg.head_size

        def grow(old, heads):
            new = np.zeros((L, heads, cap, D), dtype=_F32)
            if old is not None and self.pos:
                new[:, :, : self.pos] = old[:, :, : self.pos]
            return new

        self._k = grow(self._k, cfg.n_kv_heads)
        self._v = grow(self._v, cfg.n_kv_heads)
        if self.record:
            self._q = grow(self._q, cfg.n_heads)
            self._kpre = grow(self._kpre, cfg.n_kv_heads)
        self._cap = cap

    def kv(self) -> tuple[np.ndarray, np.ndarray]:
        """Views of the float32 cache: k (after RoPE), v, each [L, n_kv, pos, D]."""
        if self._k is None:
            shape = (self.cfg.n_layers, self.cfg.n_kv_heads, 0, self.cfg.head_size)
            return np.zeros(shape, _F32), np.zeros(shape, _F32)
        return self._k[:, :, : self.pos], self._v[:, :, : self.pos]

    def capture(self, start: int = 0, stop: int | None = None) -> Capture:
        """Copies of everything recorded for positions start..stop (default: the whole sequence)."""
        if not self.record:
            raise InvalidInput("this runner was created with record=False", "Create LlamaRunner(model, record=True).")
        stop = self.pos if stop is None else stop
        if not 0 <= start <= stop <= self.pos:
            raise InvalidInput(f"capture range {start}..{stop} outside the sequence 0..{self.pos}")
        sl = slice(start, stop)
        ids = np.asarray(self.tokens[sl], dtype=np.int64)
        return Capture(
            q=self._q[:, :, sl].copy(), k_pre_rope=self._kpre[:, :, sl].copy(),
            k=self._k[:, :, sl].copy(), v=self._v[:, :, sl].copy(), tokens=ids,
            token_strings=self.model.tokenizer.token_strings(ids.tolist()), config=self.cfg, start_pos=start,
        )

    # -- pieces --------------------------------------------------------------------------------

    def _check_ids(self, ids: Sequence[int]) -> np.ndarray:
        a = np.asarray(ids, dtype=np.int64).reshape(-1)
        if a.size and (a.min() < 0 or a.max() >= self.cfg.vocab):
            raise InvalidInput(f"token id out of range 0..{self.cfg.vocab - 1}: {int(a.min())}..{int(a.max())}")
        if self.pos + a.size > self.cfg.context_length:
            raise InvalidInput(
                f"{self.pos + a.size} tokens exceed the model's context of {self.cfg.context_length}",
                "Use a shorter prompt or reset() the runner.")
        return a

    def _qkv(self, layer: int, lw, x: np.ndarray, positions: np.ndarray):
        """x [T, H] -> q [nh, T, D], k_pre, k, v [nkv, T, D] (q and k after RoPE)."""
        cfg = self.cfg
        t, d = x.shape[0], cfg.head_size
        h = rms_norm(x, lw.attn_norm, cfg.rms_eps)
        q, k, v = _linear(h, lw.wq, lw.bq), _linear(h, lw.wk, lw.bk), _linear(h, lw.wv, lw.bv)
        q = q.reshape(t, cfg.n_heads, d).transpose(1, 0, 2)
        k_pre = k.reshape(t, cfg.n_kv_heads, d).transpose(1, 0, 2)
        v = v.reshape(t, cfg.n_kv_heads, d).transpose(1, 0, 2)
        if lw.q_norm is not None:
            q = rms_norm(q, lw.q_norm, cfg.rms_eps)
        if lw.k_norm is not None:
            k_pre = rms_norm(k_pre, lw.k_norm, cfg.rms_eps)
        inv, scale = self._rope[layer]
        cos, sin = rope_cos_sin(inv, positions, scale, cfg.rope_attn_factor)
        return apply_rope(q, cos, sin), k_pre, apply_rope(k_pre, cos, sin), v

    def _attn_out(self, lw, x: np.ndarray, o: np.ndarray) -> np.ndarray:
        """x + Wo.o (o [T, n_heads*D]), through the post-attention norm where the layer has one."""
        y = _linear(o, lw.wo, lw.bo)
        if lw.attn_post_norm is not None:
            y = rms_norm(y, lw.attn_post_norm, self.cfg.rms_eps)
        return x + y

    def _mlp(self, lw, x: np.ndarray) -> np.ndarray:
        h = rms_norm(x, lw.ffn_norm, self.cfg.rms_eps)
        y = _linear(self._act(_linear(h, lw.w_gate, lw.b_gate)) * _linear(h, lw.w_up, lw.b_up), lw.w_down, lw.b_down)
        if lw.ffn_post_norm is not None:
            y = rms_norm(y, lw.ffn_post_norm, self.cfg.rms_eps)
        return x + y

    def attention(self, layer: int, q: np.ndarray, p0: int, t: int) -> np.ndarray:
        """Float32 attention of q [nh, t, D] at positions p0..p0+t-1 over the runner's own cache (which holds
        them already), with the model's query scale, soft-capping and the layer's window -> [nh, t, D]."""
        cfg = self.cfg
        w = cfg.window(layer)
        ks = max(0, p0 - w + 1) if w else 0
        return gqa_attention(q, self._k[layer, :, ks : p0 + t], self._v[layer, :, ks : p0 + t], q_start=p0,
                             scale=cfg.query_scale, cap=cfg.attn_softcap, window=w, k_start=ks)

    def _store(self, layer: int, p0: int, q, k_pre, k, v) -> None:
        t = k.shape[1]
        self._k[layer, :, p0 : p0 + t] = k
        self._v[layer, :, p0 : p0 + t] = v
        if self.record:
            self._q[layer, :, p0 : p0 + t] = q
            self._kpre[layer, :, p0 : p0 + t] = k_pre

    def _head(self, x: np.ndarray) -> np.ndarray:
        w = self.model.weights
        logits = w.project(rms_norm(x, w.out_norm, self.cfg.rms_eps))
        if self.cfg.final_softcap:
            logits = softcap(logits, self.cfg.final_softcap)
        return logits

    def default_attend(self, layer: int, q: np.ndarray, k_new: np.ndarray, v_new: np.ndarray, pos: int) -> np.ndarray:
        """Float32 attention over the runner's own cache (k_new/v_new are already stored there)."""
        return self.attention(layer, q[:, None, :], pos, 1)[:, 0, :]

    # -- public passes -------------------------------------------------------------------------

    def prefill(self, token_ids: Sequence[int], attend: AttendFn | None = None, *,
                kv_sink: KvSinkFn | None = None, progress: ProgressFn | None = None,
                cancel: CancelFn | None = None, all_logits: bool = False, attend_chunk: ChunkAttendFn | None = None,
                logits_from: int = 0) -> np.ndarray:
        """Run `token_ids` after whatever the runner already holds; returns logits.

        Without `attend`: batched (chunks of 512 tokens) with float32 attention; `kv_sink(layer, k, v, start_pos)`
        receives each layer's new keys (after RoPE) and values [n_kv, T, D] so a caller can fill its own cache;
        `attend_chunk` (ChunkAttendFn) replaces the float32 attention of each piece of up to 512 tokens.
        With `attend`: token by token through the hook, exactly like repeated `step` calls.
        progress(done, total) counts layer passes; cancel() returning True raises Cancelled and restores
        the position. Returns [vocab] logits of the last token, or [T, vocab] with all_logits=True (rows
        logits_from.. only: [T - logits_from, vocab]).
        """
        ids = self._check_ids(token_ids)
        if ids.size == 0:
            raise InvalidInput("prefill needs at least one token")
        if attend is not None and attend_chunk is not None:
            raise InvalidInput("prefill takes one attention hook: attend (token by token) or attend_chunk (batched)")
        if not 0 <= logits_from < ids.size:
            raise InvalidInput(f"logits_from {logits_from} is outside the {ids.size} tokens given")
        start = self.pos
        self._ensure(start + ids.size)
        L = self.cfg.n_layers
        out_rows = []
        try:
            if attend is not None:
                total = ids.size * L
                for i, tid in enumerate(ids.tolist()):
                    if cancel is not None and cancel():
                        raise Cancelled()
                    x = self._decode_one(tid, attend)
                    out_rows.append(x)
                    if progress is not None:
                        progress((i + 1) * L, total)
                xs = np.stack(out_rows)
            else:
                chunks = [ids[i : i + _PREFILL_CHUNK] for i in range(0, ids.size, _PREFILL_CHUNK)]
                total, done = len(chunks) * L, 0
                for chunk in chunks:
                    p0 = self.pos
                    x = self.model.weights.embed(chunk)
                    positions = np.arange(p0, p0 + chunk.size)
                    layers = self.model.weights.layers
                    for li in range(self.cfg.n_layers):
                        if cancel is not None and cancel():
                            raise Cancelled()
                        lw = layers[li]
                        q, k_pre, k, v = self._qkv(li, lw, x, positions)
                        self._store(li, p0, q, k_pre, k, v)
                        if kv_sink is not None:
                            kv_sink(li, k, v, p0)
                        if attend_chunk is None:
                            o = self.attention(li, q, p0, chunk.size)
                        else:
                            o = self._chunk_attend(attend_chunk, li, q, k, v, p0)
                        x = self._attn_out(lw, x, o.transpose(1, 0, 2).reshape(chunk.size, -1))
                        x = self._mlp(lw, x)
                        done += 1
                        if progress is not None:
                            progress(done, total)
                    self.pos = p0 + chunk.size
                    self.tokens.extend(chunk.tolist())
                    out_rows.append(x if all_logits else x[-1:])
                xs = np.concatenate(out_rows)
        except BaseException:
            self.pos = start
            del self.tokens[start:]
            raise
        logits = self._head(xs[logits_from:] if all_logits else xs[-1:])
        self.last_logits = logits[-1]
        return logits if all_logits else logits[-1]

    def _chunk_attend(self, hook: ChunkAttendFn, layer: int, q, k, v, p0: int) -> np.ndarray:
        """[n_heads, T, D] from a ChunkAttendFn given q [T, n_heads, D] and k, v [n_kv, T, D]."""
        t, nh, d = q.shape[1], self.cfg.n_heads, self.cfg.head_size
        o = np.asarray(hook(layer, np.ascontiguousarray(q.transpose(1, 0, 2)), k.copy(), v.copy(), p0))
        if o.shape != (t, nh, d):
            raise InvalidInput(f"attend_chunk() returned shape {o.shape} for layer {layer}, expected {(t, nh, d)}",
                               "The chunk attention hook must return [T, n_heads, head_size].")
        return o.astype(_F32, copy=False).transpose(1, 0, 2)

    def _decode_one(self, token_id: int, attend: AttendFn | None) -> np.ndarray:
        """One token through every layer at self.pos; returns its final hidden state [H] and advances."""
        pos = self.pos
        self._ensure(pos + 1)
        x = self.model.weights.embed(np.array([token_id]))
        positions = np.array([pos])
        nh, d = self.cfg.n_heads, self.cfg.head_size
        layers = self.model.weights.layers
        for li in range(self.cfg.n_layers):
            lw = layers[li]
            q, k_pre, k, v = self._qkv(li, lw, x, positions)
            self._store(li, pos, q, k_pre, k, v)
            qh, kh, vh = q[:, 0], k[:, 0], v[:, 0]
            if attend is None:
                o = self.default_attend(li, qh, kh, vh, pos)
            else:
                o = np.asarray(attend(li, qh.copy(), kh.copy(), vh.copy(), pos))
                if o.shape != (nh, d):
                    raise InvalidInput(f"attend() returned shape {o.shape} for layer {li}, expected {(nh, d)}",
                                       "The attention hook must return [n_heads, head_size].")
                o = o.astype(_F32, copy=False)
            x = self._attn_out(lw, x, o.reshape(1, -1))
            x = self._mlp(lw, x)
        self.pos = pos + 1
        self.tokens.append(int(token_id))
        return x[0]

    def step(self, token_id: int, attend: AttendFn | None = None) -> np.ndarray:
        """Feed one token at the current position; returns its [vocab] logits."""
        tid = int(self._check_ids([token_id])[0])
        start = self.pos
        try:
            x = self._decode_one(tid, attend)
        except BaseException:
            self.pos = start
            del self.tokens[start:]
            raise
        self.last_logits = self._head(x[None, :])[0]
        return self.last_logits

    def generate(self, n: int, greedy: bool = True, *, attend: AttendFn | None = None, temperature: float = 1.0,
                 top_k: int | None = None, rng: np.random.Generator | None = None, stop_at_eos: bool = True,
                 on_token: Callable[[int], None] | None = None, cancel: CancelFn | None = None) -> list[int]:
        """Pick up to n tokens from the last logits, feeding each one back (an ending EOS is not fed)."""
        if self.last_logits is None:
            raise InvalidInput("generate() needs a prompt", "Call prefill() with the prompt tokens first.")
        rng = rng if rng is not None else np.random.default_rng()
        out: list[int] = []
        for _ in range(n):
            if cancel is not None and cancel():
                raise Cancelled()
            tid = self._pick(self.last_logits, greedy, temperature, top_k, rng)
            out.append(tid)
            if on_token is not None:
                on_token(tid)
            if stop_at_eos and tid == self.cfg.eos_id:
                break
            self.step(tid, attend)
        return out

    @staticmethod
    def _pick(logits: np.ndarray, greedy: bool, temperature: float, top_k: int | None,
              rng: np.random.Generator) -> int:
        if greedy or temperature <= 0:
            return int(np.argmax(logits))
        z = logits.astype(np.float64) / temperature
        if top_k is not None and 0 < top_k < z.size:
            cut = np.partition(z, -top_k)[-top_k]
            z = np.where(z >= cut, z, -np.inf)
        p = np.exp(z - z.max())
        p /= p.sum()
        return int(rng.choice(z.size, p=p))


def capture_tokens(model: LlamaModel, token_ids: Sequence[int], *, progress: ProgressFn | None = None,
                   cancel: CancelFn | None = None, runner=None) -> tuple[Capture, np.ndarray]:
    """Batched prefill of `token_ids` on a fresh runner (or `runner`: a fresh one with record=True and this
    runner's interface, e.g. the GPU forward's); returns (Capture, last-token logits [vocab]).
    A capture holding NaN or Inf is refused, naming the model and the cause: a weight tensor that holds
    NaN/Inf, else the first layer where float32 overflowed."""
    runner = LlamaRunner(model, record=True) if runner is None else runner
    logits = runner.prefill(token_ids, progress=progress, cancel=cancel)
    cap = runner.capture()
    _check_capture_finite(model, cap)
    return cap, logits


def _check_capture_finite(model: LlamaModel, cap: Capture) -> None:
    bad = [n for n in ("q", "k_pre_rope", "k", "v") if not np.isfinite(getattr(cap, n)).all()]
    if not bad:
        return
    name = model.path.name if model.path is not None else (model.config.name or "the model")
    weight = nonfinite_weight(model)
    if weight is not None:
        raise InvalidInput(f"{name}: its weight tensor {weight} holds NaN or Inf, so the captured "
                           f"{'/'.join(bad)} are not finite; nothing was captured",
                           "The model file is damaged (or was converted from a diverged checkpoint); use another "
                           "GGUF.")
    arr = getattr(cap, bad[0])
    layer = int(np.argmax(~np.isfinite(arr).reshape(arr.shape[0], -1).all(axis=1)))
    raise InvalidInput(f"{name}: its forward pass left float32's range at layer {layer} (the captured {bad[0]} "
                       "holds NaN or Inf) although every weight is finite; nothing was captured",
                       "Try a shorter prompt, or another model file.")
