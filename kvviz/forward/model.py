"""The decoder's forward pass on the GPU: `GpuForward` (a plan's weights on the device and the dispatches of a pass)
and `GpuRunner`, one sequence on it with the numpy runner's interface (kvviz/sources/llama_numpy.py's LlamaRunner:
prefill, step, kv, capture), so the live decoder, capture and eval take either.

A chunk of T tokens at positions p0.. goes through: the embedding lookup, then per layer
  rms norm -> QKV product (+ bias) -> (per-head q/k norms) -> RoPE, keys and values into the runner's f32 cache
  -> attention -> output product added to the residual (or normed, then added) -> rms norm -> gate/up product
  -> SwiGLU / GeGLU -> down product added to the residual (or normed, then added)
and the final norm and the logits product (soft-capped where the plan says so). Everything stays on the device
except where the caller takes part:
  attend      (per token, the numpy runner's hook) attend(layer, q [H, D], k [n_kv, D], v, pos) -> [H, D]
  attend_chunk (batched prefill) attend_chunk(layer, q [T, H, D], k [n_kv, T, D], v, start) -> [T, H, D] (or
                 DeviceRows of that shape on this runtime, submitted: copied into the activations on the device)
  kv_sink     kv_sink(layer, k [n_kv, T, D], v, start): the keys (after RoPE) and values of each layer
An attend_chunk with a method `device(layer, qkv, layout, t, start)` is offered each layer's q/k/v on the device
first (qkv: the [T, layout.ld] f32 activations, laid out as QkvLayout says, its dispatches submitted): it returns
the attention as DeviceRows (submitted) or a host [T, H, D], with no read-back of q/k/v, or None (the layer then
calls attend_chunk itself, from the host).
The hooks get the GPU's q/k/v (read back once a layer) and hand their attention back (written once a layer); the
runner's own cache is written either way, so `kv()` and a later step without a hook stay valid. Without a hook the
attention is the forward's own causal kernel over that cache (kvviz/forward/kernels.py), the counterpart of the
numpy runner's float32 attention.
"""
from __future__ import annotations

import copy
import logging
import weakref
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from kvviz.errors import Cancelled, DeviceLimitError, InvalidInput, KvvizError, NonFiniteResult, UnsupportedShape
from kvviz.forward.kernels import WEIGHT_DTYPES, DeviceMatrix, ForwardKernels, f16_exact, upload_matrix
from kvviz.forward.plan import ForwardPlan, plan_of
from kvviz.gpu.copy import copy_dispatch
from kvviz.gpu.runtime import DeviceRows, GpuRuntime
from kvviz.sources.llama_numpy import Capture, LlamaRunner

log = logging.getLogger("kvviz.forward")

WEIGHT_POLICIES = ("exact",) + WEIGHT_DTYPES  # exact: f16 where the values are f16 values, else f32
DEFAULT_CHUNK = 2048  # tokens a prefill pass takes at most (fewer where the activations pass a binding)
LOGIT_ROWS = 256  # logits rows a product computes at most (all_logits)
_F32 = np.float32


@dataclass(frozen=True)
class QkvLayout:
    """Where one layer's q, K and V lie in the forward's fused activations, a [T, ld] float32 row-major buffer after
    RoPE: columns q..q + n_heads * head_size - 1 (head after head), then K from k and V from v
    (n_kv_heads * head_size each). What a chunk hook's `device` needs to take them on the device."""

    ld: int
    q: int
    k: int
    v: int
    n_heads: int
    n_kv_heads: int
    head_size: int


@dataclass
class DeviceLayer:
    attn_norm: object
    qkv: DeviceMatrix
    wo: DeviceMatrix
    ffn_norm: object
    gate_up: DeviceMatrix
    down: DeviceMatrix
    qkv_bias: object = None
    wo_bias: object = None
    gate_up_bias: object = None
    down_bias: object = None
    q_norm: object = None
    k_norm: object = None
    post_attn_norm: object = None
    post_ffn_norm: object = None
    window: int = 0
    rope: int = 0


class GpuForward:
    """A plan's weights on one runtime and the dispatches of its passes. weights: "exact" (a matrix goes to the
    device in f16 when every value of it is an f16 value, else in f32: the numpy forward's arithmetic either way),
    "f16" (every matrix rounded to f16; values beyond f16's range refused) or "f32"."""

    def __init__(self, model, rt: GpuRuntime, *, weights: str = "exact", chunk: int = DEFAULT_CHUNK,
                 max_binding: int | None = None):
        if weights not in WEIGHT_POLICIES:
            raise InvalidInput(f"weights {weights!r}; choose one of {', '.join(WEIGHT_POLICIES)}")
        self.rt = rt
        self.plan: ForwardPlan = plan_of(model)
        self.weights = weights
        self.max_binding = int(max_binding or rt.max_binding)
        self.kernels = ForwardKernels(rt)
        p = self.plan
        check_plan(p, rt)
        widest = max(p.qkv_width, 2 * p.ffn, p.hidden, p.n_heads * p.head_size)
        fit = self.max_binding // (4 * widest)
        if fit < 1:
            raise DeviceLimitError(f"one token's activations ({widest} floats) pass the adapter's storage-binding "
                                   f"limit of {self.max_binding / 2**20:.1f} MiB ({rt.summary.name})")
        self.chunk = max(1, min(int(chunk), fit))
        self.dtypes: dict[str, str] = {}
        self._buffers: list = []
        self._mats: list[DeviceMatrix] = []
        try:
            self._upload()
        except KvvizError:
            self.close()
            raise
        except Exception as exc:  # wgpu's allocation errors: the device has no room for the weights
            self.close()
            raise DeviceLimitError(f"the model's weights could not be placed on {rt.summary.name}: {exc}",
                                   "Use --forward numpy, or f16 weights, or a GPU with more memory.") from exc
        log.info("%s", self.describe())

    # -- weights ---------------------------------------------------------------------------------------------------
    def _dtype(self, blocks, name: str) -> str:
        if self.weights != "exact":
            return self.weights
        return "f16" if f16_exact(blocks) else "f32"

    def _matrix(self, blocks, name: str) -> DeviceMatrix:
        dt = self._dtype(blocks, name)
        m = upload_matrix(self.rt, blocks, name, dt, self.max_binding)
        self.dtypes[name] = dt
        self._mats.append(m)
        return m

    def _vector(self, a, name: str):
        if a is None:
            return None
        v = np.concatenate([np.asarray(b, _F32).reshape(-1) for b in a]) if isinstance(a, list) else a
        buf = self.rt.upload(np.ascontiguousarray(v, _F32), name)
        self._buffers.append(buf)
        return buf

    def _upload(self) -> None:
        p = self.plan
        self.tok_embd = self._matrix([p.tok_embd], "token_embd")
        self.output = self.tok_embd if p.tied else self._matrix([p.output], "output")
        self.out_norm = self._vector(p.out_norm, "output_norm")
        self.output_bias = self._vector(p.output_bias, "output_bias")
        self.layers: list[DeviceLayer] = []
        for i in range(p.n_layers):
            lp = p.layers[i]  # read now (a mapped model dequantises the layer here), dropped after its upload
            b = f"blk.{i}."
            self.layers.append(DeviceLayer(
                attn_norm=self._vector(lp.attn_norm, b + "attn_norm"), qkv=self._matrix(lp.qkv, b + "attn_qkv"),
                wo=self._matrix([lp.wo], b + "attn_output"), ffn_norm=self._vector(lp.ffn_norm, b + "ffn_norm"),
                gate_up=self._matrix(lp.gate_up, b + "ffn_gate_up"), down=self._matrix([lp.w_down], b + "ffn_down"),
                qkv_bias=self._vector(lp.qkv_bias, b + "attn_qkv_bias"), wo_bias=self._vector(lp.wo_bias, b + "attn_output_bias"),
                gate_up_bias=self._vector(lp.gate_up_bias, b + "ffn_gate_up_bias"),
                down_bias=self._vector(lp.down_bias, b + "ffn_down_bias"), q_norm=self._vector(lp.q_norm, b + "attn_q_norm"),
                k_norm=self._vector(lp.k_norm, b + "attn_k_norm"),
                post_attn_norm=self._vector(lp.post_attn_norm, b + "post_attention_norm"),
                post_ffn_norm=self._vector(lp.post_ffn_norm, b + "post_ffw_norm"), window=int(lp.window),
                rope=int(lp.rope)))

    @property
    def weight_bytes(self) -> int:
        return int(sum(m.nbytes for m in self._mats) + sum(b.size for b in self._buffers))

    def describe(self) -> str:
        n16 = sum(1 for d in self.dtypes.values() if d == "f16")
        return (f"GPU forward on {self.rt.summary.name}: {self.weight_bytes / 2**20:.0f} MiB of weights "
                f"({n16} of {len(self.dtypes)} matrices in f16), prefill chunks of {self.chunk}")

    def close(self) -> None:
        for m in self._mats:
            m.destroy()
        for b in self._buffers:
            b.destroy()
        self._mats, self._buffers = [], []


def check_plan(p: ForwardPlan, rt: GpuRuntime) -> None:
    """UnsupportedShape where the forward's kernels cannot take the plan on this adapter."""
    if p.head_size % 16:
        raise UnsupportedShape(f"the GPU forward takes head sizes that are multiples of 16, this model's is {p.head_size}",
                               "Use --forward numpy.")
    if p.n_kv_heads < 1 or p.n_heads % p.n_kv_heads:
        raise UnsupportedShape(f"{p.n_heads} query heads are not a multiple of {p.n_kv_heads} KV heads")
    if p.rope_mode not in ("neox", "normal") or p.rotated % 2 or p.rotated > p.head_size:
        raise UnsupportedShape(f"RoPE {p.rope_mode!r} over {p.rotated} of {p.head_size} dims")
    if p.act not in ("silu", "gelu_tanh"):
        raise UnsupportedShape(f"activation {p.act!r}")
    if "subgroup" not in rt.features:
        raise UnsupportedShape(f"{rt.summary.name} has no subgroup operations, which the GPU forward's attention "
                               "needs", "Use --forward numpy.")


# The forward of the model read last per runtime: the live decoder's paths (baseline, teacher-forced, free) and a
# second decoder on the same model share one copy of the weights on the device.
_FORWARDS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def forward_for(model, rt: GpuRuntime, weights: str = "exact") -> GpuForward:
    """The GpuForward of `model` on `rt` (made once). The previous model's is no longer held here: its device
    memory goes with the last runner that uses it."""
    held = _FORWARDS.get(rt)
    if held is not None:
        ref, w, fwd = held
        if ref() is model and w == weights:
            return fwd
        del _FORWARDS[rt]
    fwd = GpuForward(model, rt, weights=weights)
    _FORWARDS[rt] = (weakref.ref(model), weights, fwd)
    return fwd


# ------------------------------------------------------------------------------------------------ the runner
class _Activations:
    """One runner's work buffers for chunks of up to `rows` tokens."""

    def __init__(self, rt: GpuRuntime, p: ForwardPlan, rows: int):
        self.rows = rows
        f = 4 * rows
        self.ids = rt.empty(f, "fwd-ids")
        # one block of cos, sin [rows, R/2] per RoPE variant, each at a storage offset the adapter takes
        align = rt.offset_alignment
        self.table_bytes = -(-2 * rows * (p.rotated // 2) * 4 // align) * align
        self.tables = rt.empty(self.table_bytes * len(p.ropes), "fwd-rope-tables")
        self.x = rt.empty(f * p.hidden, "fwd-x")
        self.h = rt.empty(f * p.hidden, "fwd-h")
        self.qkv = rt.empty(f * p.qkv_width, "fwd-qkv")
        self.o = rt.empty(f * p.n_heads * p.head_size, "fwd-attn")
        self.gu = rt.empty(f * 2 * p.ffn, "fwd-gate-up")
        self.a = rt.empty(f * p.ffn, "fwd-glu")

    def destroy(self) -> None:
        for b in (self.ids, self.tables, self.x, self.h, self.qkv, self.o, self.gu, self.a):
            b.destroy()


AttendFn = Callable[[int, np.ndarray, np.ndarray, np.ndarray, int], np.ndarray]
ChunkAttendFn = Callable[[int, np.ndarray, np.ndarray, np.ndarray, int], np.ndarray]
KvSinkFn = Callable[[int, np.ndarray, np.ndarray, int], None]


class GpuRunner:
    """One sequence on a GpuForward: its position, its f32 KV cache on the device, what it recorded (record=True:
    Q, K before and after RoPE, V of every position, for `capture`). The numpy LlamaRunner's interface."""

    def __init__(self, model, rt: GpuRuntime | None = None, *, record: bool = False, weights: str = "exact",
                 forward: GpuForward | None = None):
        if forward is None:
            forward = forward_for(model, rt if rt is not None else GpuRuntime(), weights)
        self.forward = forward
        self.rt = forward.rt
        self.k = forward.kernels
        self.plan = forward.plan
        self.model = model
        self.cfg = getattr(model, "config", None)
        self.record = record
        self._cap = 0
        self._caches: list = []  # per layer (k, v) buffers [cap, n_kv, D]
        self._act: _Activations | None = None
        self._logit_buf = None  # (rows, logits [rows, vocab], normed rows [rows, hidden])
        self._one = None  # default_attend's query and output buffers
        self._rec: dict | None = None  # host arrays of what record keeps, [L, heads, cap, D]
        self.reset()

    # -- state -------------------------------------------------------------------------------------------------------
    def reset(self) -> None:
        self.pos = 0
        self.tokens: list[int] = []
        self.last_logits: np.ndarray | None = None

    @property
    def _row_bytes(self) -> int:
        return self.plan.n_kv_heads * self.plan.head_size * 4

    def _ensure(self, n: int) -> None:
        if n <= self._cap:
            return
        p = self.plan
        fit = self.forward.max_binding // self._row_bytes
        if n > fit:
            raise DeviceLimitError(f"a KV cache of {n} positions ({n * self._row_bytes / 2**20:.1f} MiB a layer) "
                                   f"passes the adapter's storage-binding limit of "
                                   f"{self.forward.max_binding / 2**20:.1f} MiB", "Use --forward numpy.")
        cap = min(max(n, 2 * self._cap, 64), max(n, p.context_length), fit)
        nbytes = cap * self._row_bytes
        new = [(self.rt.empty(nbytes, f"fwd-kcache-{i}"), self.rt.empty(nbytes, f"fwd-vcache-{i}"))
               for i in range(p.n_layers)]
        used = self.pos * self._row_bytes
        for (ok, ov), (nk, nv) in zip(self._caches, new):
            self.rt.copy(ok, nk, used)
            self.rt.copy(ov, nv, used)
            ok.destroy()
            ov.destroy()
        self._caches = new
        if self.record:
            def grow(old, heads):
                a = np.zeros((p.n_layers, heads, cap, p.head_size), _F32)
                if old is not None and self.pos:
                    a[:, :, :self.pos] = old[:, :, :self.pos]
                return a
            old = self._rec or {}
            self._rec = {"q": grow(old.get("q"), p.n_heads), "k_pre": grow(old.get("k_pre"), p.n_kv_heads),
                         "k": grow(old.get("k"), p.n_kv_heads), "v": grow(old.get("v"), p.n_kv_heads)}
        self._cap = cap

    def _activations(self, rows: int) -> _Activations:
        if self._act is None or self._act.rows < rows:
            if self._act is not None:
                self._act.destroy()
            self._act = _Activations(self.rt, self.plan, rows)
        return self._act

    def kv(self) -> tuple[np.ndarray, np.ndarray]:
        """The cache as numpy arrays: k (after RoPE), v, each [L, n_kv, pos, D] float32."""
        p = self.plan
        if self.pos == 0 or not self._caches:
            z = np.zeros((p.n_layers, p.n_kv_heads, 0, p.head_size), _F32)
            return z, z.copy()
        shape, n = (self.pos, p.n_kv_heads, p.head_size), self.pos * self._row_bytes
        ks = [self.rt.read(kb, _F32, shape, nbytes=n).transpose(1, 0, 2) for kb, _ in self._caches]
        vs = [self.rt.read(vb, _F32, shape, nbytes=n).transpose(1, 0, 2) for _, vb in self._caches]
        return np.ascontiguousarray(np.stack(ks)), np.ascontiguousarray(np.stack(vs))

    def capture(self, start: int = 0, stop: int | None = None) -> Capture:
        """What record=True kept for positions start..stop (the numpy runner's Capture)."""
        if not self.record:
            raise InvalidInput("this runner was created with record=False", "Create it with record=True.")
        stop = self.pos if stop is None else stop
        if not 0 <= start <= stop <= self.pos:
            raise InvalidInput(f"capture range {start}..{stop} outside the sequence 0..{self.pos}")
        sl = slice(start, stop)
        ids = np.asarray(self.tokens[sl], dtype=np.int64)
        r = self._rec
        return Capture(q=r["q"][:, :, sl].copy(), k_pre_rope=r["k_pre"][:, :, sl].copy(), k=r["k"][:, :, sl].copy(),
                       v=r["v"][:, :, sl].copy(), tokens=ids,
                       token_strings=self.model.tokenizer.token_strings(ids.tolist()), config=self.cfg,
                       start_pos=start)

    def __deepcopy__(self, memo):
        """A copy of the sequence (its cache copied on the device) on the same forward and weights."""
        new = copy.copy(self)
        memo[id(self)] = new
        new.tokens = list(self.tokens)
        new.last_logits = None if self.last_logits is None else self.last_logits.copy()
        new._act = None
        new._logit_buf = None
        new._one = None
        new._rec = None if self._rec is None else {k: v.copy() for k, v in self._rec.items()}
        nbytes = self._cap * self._row_bytes
        new._caches = []
        for i, (kb, vb) in enumerate(self._caches):
            pair = (self.rt.empty(nbytes, f"fwd-kcache-{i}"), self.rt.empty(nbytes, f"fwd-vcache-{i}"))
            self.rt.copy(kb, pair[0], self.pos * self._row_bytes)
            self.rt.copy(vb, pair[1], self.pos * self._row_bytes)
            new._caches.append(pair)
        return new

    def _check_ids(self, ids: Sequence[int]) -> np.ndarray:
        a = np.asarray(ids, dtype=np.int64).reshape(-1)
        if a.size and (a.min() < 0 or a.max() >= self.plan.vocab):
            raise InvalidInput(f"token id out of range 0..{self.plan.vocab - 1}: {int(a.min())}..{int(a.max())}")
        if self.pos + a.size > self.plan.context_length:
            raise InvalidInput(f"{self.pos + a.size} tokens exceed the model's context of {self.plan.context_length}",
                               "Use a shorter prompt or reset() the runner.")
        return a

    @property
    def prefill_chunk(self) -> int:
        """Tokens a batched prefill takes at a time: the pieces `attend_chunk` is called with."""
        return self.forward.chunk

    # -- passes --------------------------------------------------------------------------------------------------------
    def prefill(self, token_ids: Sequence[int], attend: AttendFn | None = None, *,
                attend_chunk: ChunkAttendFn | None = None, kv_sink: KvSinkFn | None = None,
                progress: Callable[[int, int], None] | None = None, cancel: Callable[[], bool] | None = None,
                all_logits: bool = False, logits_from: int = 0) -> np.ndarray:
        """Run `token_ids` after what the runner holds; returns the last token's logits [vocab] ([T, vocab] with
        all_logits: rows logits_from.. only, [T - logits_from, vocab]; the rows before are neither computed nor
        read back). With `attend`: token by token through the hook (like repeated `step` calls); else in chunks of
        up to `prefill_chunk` tokens, the attention by `attend_chunk` when given, else the forward's own kernel;
        `kv_sink` gets each layer's keys and values. progress(done, total) counts layer passes; cancel() returning
        True raises Cancelled and restores the position."""
        ids = self._check_ids(token_ids)
        if ids.size == 0:
            raise InvalidInput("prefill needs at least one token")
        if attend is not None and attend_chunk is not None:
            raise InvalidInput("give attend (token by token) or attend_chunk (batched), not both")
        if not 0 <= logits_from < ids.size:
            raise InvalidInput(f"logits_from {logits_from} is outside the {ids.size} tokens given")
        first = logits_from if all_logits else ids.size - 1  # the first row whose logits are returned
        start = self.pos
        L = self.plan.n_layers
        rows = []
        try:
            if attend is not None:
                for i, tid in enumerate(ids.tolist()):
                    if cancel is not None and cancel():
                        raise Cancelled()
                    rows.append(self._chunk(np.array([tid]), token_hook=attend, logits="last" if i >= first else None))
                    if progress is not None:
                        progress((i + 1) * L, ids.size * L)
                out = np.concatenate([r for r in rows if r is not None])
            else:
                step = self.prefill_chunk
                total = -(-ids.size // step) * L
                for ci, c0 in enumerate(range(0, ids.size, step)):
                    c = ids[c0:c0 + step]
                    done = ci * L

                    def prog(layer, done=done):
                        progress(done + layer, total)

                    want = c0 + c.size > first  # this chunk holds rows whose logits are returned
                    rows.append(self._chunk(c, chunk_hook=attend_chunk, kv_sink=kv_sink, cancel=cancel,
                                            layer_done=prog if progress is not None else None,
                                            logits="all" if want else None, first_row=max(0, first - c0)))
                out = np.concatenate([r for r in rows if r is not None])
        except BaseException:
            self.pos = start
            del self.tokens[start:]
            raise
        self.last_logits = out[-1]
        return out if all_logits else out[-1]

    def step(self, token_id: int, attend: AttendFn | None = None) -> np.ndarray:
        """Feed one token at the current position; returns its [vocab] logits."""
        tid = self._check_ids([token_id])
        start = self.pos
        try:
            logits = self._chunk(tid, token_hook=attend, logits="last")
        except BaseException:
            self.pos = start
            del self.tokens[start:]
            raise
        self.last_logits = logits[-1]
        return self.last_logits

    def generate(self, n: int, greedy: bool = True, *, attend: AttendFn | None = None, temperature: float = 1.0,
                 top_k: int | None = None, rng: np.random.Generator | None = None, stop_at_eos: bool = True,
                 on_token: Callable[[int], None] | None = None, cancel: Callable[[], bool] | None = None) -> list[int]:
        """Pick up to n tokens from the last logits, feeding each one back (the numpy runner's generate)."""
        if self.last_logits is None:
            raise InvalidInput("generate() needs a prompt", "Call prefill() with the prompt tokens first.")
        rng = rng if rng is not None else np.random.default_rng()
        eos = getattr(self.cfg, "eos_id", None)
        out: list[int] = []
        for _ in range(n):
            if cancel is not None and cancel():
                raise Cancelled()
            tid = LlamaRunner._pick(self.last_logits, greedy, temperature, top_k, rng)
            out.append(tid)
            if on_token is not None:
                on_token(tid)
            if stop_at_eos and tid == eos:
                break
            self.step(tid, attend)
        return out

    # -- one chunk -----------------------------------------------------------------------------------------------------
    def _prepare(self, ids: np.ndarray) -> _Activations:
        """Room for ids at positions pos..: the cache, the work buffers, the ids and RoPE tables on the device."""
        p, rt = self.plan, self.rt
        t, p0 = int(ids.size), self.pos
        self._ensure(p0 + t)
        act = self._activations(t)
        rt.write(act.ids, ids.astype(np.uint32))
        for r in range(len(p.ropes)):
            cos, sin = p.rope_tables(np.arange(p0, p0 + t), r)
            rt.write(act.tables, np.concatenate([cos.reshape(-1), sin.reshape(-1)]), offset=r * act.table_bytes)
        return act

    def _qkv(self, lw: DeviceLayer, act: _Activations, t: int) -> list:
        """Norm, QKV product (+ bias), per-head q/k norms: qkv before RoPE."""
        p, k = self.plan, self.k
        D, nh, nkv, nq = p.head_size, p.n_heads, p.n_kv_heads, p.n_heads * p.head_size
        ds = k.rms_norm(act.x, lw.attn_norm, act.h, t, p.hidden, p.rms_eps)
        ds += k.matmul(act.h, t, lw.qkv, act.qkv, bias=lw.qkv_bias)
        if lw.q_norm is not None:
            ds += k.rms_norm(None, lw.q_norm, act.qkv, t * nh, D, p.rms_eps, per=nh, in_ld=p.qkv_width,
                             out_ld=p.qkv_width, inplace=True)
        if lw.k_norm is not None:
            ds += k.rms_norm(None, lw.k_norm, act.qkv, t * nkv, D, p.rms_eps, per=nkv, in_off=nq, in_ld=p.qkv_width,
                             out_off=nq, out_ld=p.qkv_width, inplace=True)
        return ds

    def _rope(self, lw: DeviceLayer, kc, vc, act: _Activations, t: int, p0: int) -> list:
        p = self.plan
        tables = (act.tables, lw.rope * act.table_bytes, act.table_bytes)
        return self.k.rope(act.qkv, tables, kc, vc, t, p.n_heads, p.n_kv_heads, p.head_size, rot=p.rotated,
                           start=p0, cap=self._cap, mode=p.rope_mode)

    def _attention(self, lw: DeviceLayer, kc, vc, act: _Activations, t: int, p0: int) -> list:
        p = self.plan
        return self.k.attention(act.qkv, kc, vc, act.o, t, p.n_heads, p.n_kv_heads, p.head_size, start=p0,
                                scale=p.scale, softcap=p.attn_softcap, window=lw.window)

    def layer_dispatches(self, li: int, t: int, p0: int) -> list:
        """Layer li of a chunk of t tokens at p0 with the forward's own attention (after _prepare)."""
        lw, (kc, vc) = self.forward.layers[li], self._caches[li]
        act = self._act
        return (self._qkv(lw, act, t) + self._rope(lw, kc, vc, act, t, p0) + self._attention(lw, kc, vc, act, t, p0)
                + self._tail(lw, act, t))

    def pass_dispatches(self, token_ids: Sequence[int]) -> list:
        """The whole pass of token_ids at the current position as one list of dispatches (the embedding, every
        layer with the forward's own attention, the final norm and the last token's logits), ready for GpuRuntime.run
        or .time; the position does not move. What the benchmarks time."""
        ids = self._check_ids(token_ids)
        if ids.size == 0 or ids.size > self.forward.chunk:
            raise InvalidInput(f"a pass takes 1..{self.forward.chunk} tokens, got {ids.size}")
        t, p0 = int(ids.size), self.pos
        act = self._prepare(ids)
        ds = self.k.embed(act.ids, self.forward.tok_embd, act.x, t, scale=self.plan.embed_scale)
        for li in range(self.plan.n_layers):
            ds += self.layer_dispatches(li, t, p0)
        return ds + self._logit_dispatches(act, t - 1, 1)

    def pass_logits(self) -> np.ndarray:
        """The [vocab] logits a run of pass_dispatches computed."""
        if self._logit_buf is None:
            raise InvalidInput("no pass has been prepared", "Run the dispatches of pass_dispatches() first.")
        return self.rt.read(self._logit_buf[1], _F32, (self.plan.vocab,), nbytes=self.plan.vocab * 4)

    def _chunk(self, ids: np.ndarray, *, token_hook=None, chunk_hook=None, kv_sink=None, cancel=None,
               layer_done=None, logits: str | None = "last", first_row: int = 0) -> np.ndarray | None:
        """ids at positions pos..pos+T-1 through every layer; advances the position; returns the logits of the last
        row, of rows first_row.. (logits="all") or None."""
        p, k, rt = self.plan, self.k, self.rt
        t, p0 = int(ids.size), self.pos
        act = self._prepare(ids)
        D, nh, nkv = p.head_size, p.n_heads, p.n_kv_heads
        nq = nh * D
        host = token_hook is not None or chunk_hook is not None or kv_sink is not None or self.record
        per_layer = host or cancel is not None or layer_done is not None
        # the chunk hook's device hand-off, where nothing else needs the layer's q/k/v on the host
        on_device = (getattr(chunk_hook, "device", None) if token_hook is None and kv_sink is None and not self.record
                     else None)
        layout = QkvLayout(p.qkv_width, 0, nq, nq + nkv * D, nh, nkv, D)
        pending = k.embed(act.ids, self.forward.tok_embd, act.x, t, scale=p.embed_scale)
        for li, (lw, (kc, vc)) in enumerate(zip(self.forward.layers, self._caches)):
            if cancel is not None and cancel():
                raise Cancelled()
            if not host:
                pending += self.layer_dispatches(li, t, p0)
            else:
                pending += self._qkv(lw, act, t)
                if self.record:
                    rt.run(pending)
                    pending = []
                    pre = rt.read(act.qkv, _F32, (t, p.qkv_width), nbytes=t * p.qkv_width * 4)
                    self._rec["k_pre"][li, :, p0:p0 + t] = pre[:, nq:nq + nkv * D].reshape(t, nkv, D).transpose(1, 0, 2)
                rt.submit(pending + self._rope(lw, kc, vc, act, t, p0))  # a read below waits for it
                pending = []
                o = None if on_device is None else on_device(li, act.qkv, layout, t, p0)
                attended = o is not None
                if not attended:
                    qkv = rt.read(act.qkv, _F32, (t, p.qkv_width), nbytes=t * p.qkv_width * 4)
                    q = qkv[:, :nq].reshape(t, nh, D)
                    kk = np.ascontiguousarray(qkv[:, nq:nq + nkv * D].reshape(t, nkv, D).transpose(1, 0, 2))
                    vv = np.ascontiguousarray(qkv[:, nq + nkv * D:].reshape(t, nkv, D).transpose(1, 0, 2))
                    if self.record:
                        self._rec["q"][li, :, p0:p0 + t] = q.transpose(1, 0, 2)
                        self._rec["k"][li, :, p0:p0 + t] = kk
                        self._rec["v"][li, :, p0:p0 + t] = vv
                    if kv_sink is not None:
                        kv_sink(li, kk, vv, p0)
                    if token_hook is not None:
                        rt.write(act.o, np.ascontiguousarray(self._call_token_hook(token_hook, li, q, kk, vv, p0), _F32))
                    elif chunk_hook is not None:
                        o, attended = chunk_hook(li, np.ascontiguousarray(q), kk, vv, p0), True
                    else:
                        pending += self._attention(lw, kc, vc, act, t, p0)
                if attended:
                    shape = tuple(o.shape) if isinstance(o, DeviceRows) else np.shape(o)
                    if shape != (t, nh, D):
                        raise InvalidInput(f"attend_chunk() returned shape {shape} for layer {li}, expected "
                                           f"{(t, nh, D)}", "The chunk attention hook must return [T, n_heads, head_size].")
                    if isinstance(o, DeviceRows):  # submitted on the device: copied there into the activations
                        pending.append(copy_dispatch(rt, o.buffer, act.o, t * nq * 4))
                    else:
                        rt.write(act.o, np.ascontiguousarray(o, _F32))
                pending += self._tail(lw, act, t)
            if per_layer:  # the layer's work submitted (for progress and cancel); the next read waits for it
                rt.submit(pending)
                pending = []
                if layer_done is not None:
                    layer_done(li + 1)
        self.pos = p0 + t
        self.tokens.extend(int(i) for i in ids.tolist())
        if logits is None:
            rt.run(pending)
            return None
        return self._logits(act, t, pending, first_row if logits == "all" else t - 1)

    def default_attend(self, layer: int, q: np.ndarray, k_new: np.ndarray, v_new: np.ndarray, pos: int) -> np.ndarray:
        """The forward's own attention of one query q [n_heads, D] at `pos` over the runner's cache (which holds
        k_new / v_new already: the hook is called after the store), on the device -> [n_heads, D]. The numpy
        runner's default_attend, for a hook that falls back to the runner's own attention."""
        p, rt = self.plan, self.rt
        nq = p.n_heads * p.head_size
        if self._one is None:
            self._one = (rt.empty(nq * 4, "fwd-one-query"), rt.empty(nq * 4, "fwd-one-out"))
        qb, ob = self._one
        rt.write(qb, np.ascontiguousarray(q, _F32).reshape(-1))
        kc, vc = self._caches[layer]
        rt.run(self.k.attention(qb, kc, vc, ob, 1, p.n_heads, p.n_kv_heads, p.head_size, start=int(pos), ld=nq,
                                scale=p.scale, softcap=p.attn_softcap, window=self.forward.layers[layer].window))
        return rt.read(ob, _F32, (p.n_heads, p.head_size), nbytes=nq * 4)

    def _call_token_hook(self, hook, li, q, kk, vv, p0) -> np.ndarray:
        p = self.plan
        outs = []
        for j in range(q.shape[0]):
            o = np.asarray(hook(li, q[j].copy(), kk[:, j].copy(), vv[:, j].copy(), p0 + j))
            if o.shape != (p.n_heads, p.head_size):
                raise InvalidInput(f"attend() returned shape {o.shape} for layer {li}, expected "
                                   f"{(p.n_heads, p.head_size)}", "The attention hook must return [n_heads, head_size].")
            outs.append(o)
        return np.stack(outs)

    def _tail(self, lw: DeviceLayer, act: _Activations, t: int) -> list:
        """The attention's output product and the feed-forward block, each added to the residual x."""
        p, k = self.plan, self.k
        H = p.hidden
        ds = []
        if lw.post_attn_norm is None:
            ds += k.matmul(act.o, t, lw.wo, act.x, bias=lw.wo_bias, residual=True)
        else:
            ds += k.matmul(act.o, t, lw.wo, act.h, bias=lw.wo_bias)
            ds += k.rms_norm(act.h, lw.post_attn_norm, act.x, t, H, p.rms_eps, add=True)
        ds += k.rms_norm(act.x, lw.ffn_norm, act.h, t, H, p.rms_eps)
        ds += k.matmul(act.h, t, lw.gate_up, act.gu, bias=lw.gate_up_bias)
        ds += k.glu(act.gu, act.a, t, p.ffn, p.act)
        if lw.post_ffn_norm is None:
            ds += k.matmul(act.a, t, lw.down, act.x, bias=lw.down_bias, residual=True)
        else:
            ds += k.matmul(act.a, t, lw.down, act.h, bias=lw.down_bias)
            ds += k.rms_norm(act.h, lw.post_ffn_norm, act.x, t, H, p.rms_eps, add=True)
        return ds

    def _logit_buffers(self, rows: int):
        """(logits [rows, vocab], normed rows [rows, hidden]) buffers of at least `rows` rows."""
        p = self.plan
        if self._logit_buf is None or self._logit_buf[0] < rows:
            if self._logit_buf is not None:
                self._logit_buf[1].destroy()
                self._logit_buf[2].destroy()
            self._logit_buf = (rows, self.rt.empty(rows * p.vocab * 4, "fwd-logits"),
                               self.rt.empty(rows * p.hidden * 4, "fwd-final-h"))
        return self._logit_buf[1], self._logit_buf[2]

    def _logit_dispatches(self, act: _Activations, r0: int, n: int) -> list:
        """The final norm of rows r0..r0+n-1 of x and their logits (soft-capped where the plan says so)."""
        p, k = self.plan, self.k
        lbuf, hbuf = self._logit_buffers(n)
        ds = k.rms_norm(act.x, self.forward.out_norm, hbuf, n, p.hidden, p.rms_eps, in_off=r0 * p.hidden)
        ds += k.matmul(hbuf, n, self.forward.output, lbuf, bias=self.forward.output_bias)
        if p.final_softcap > 0:
            ds += k.softcap(lbuf, n * p.vocab, p.final_softcap)
        return ds

    def _logits(self, act: _Activations, t: int, pending: list, first: int) -> np.ndarray:
        """The logits of rows first..t-1, LOGIT_ROWS rows a product (and fewer where [rows, vocab] passes a
        binding)."""
        V = self.plan.vocab
        per = max(1, min(LOGIT_ROWS, self.forward.max_binding // (4 * V)))
        out = np.empty((t - first, V), _F32)
        for r0 in range(first, t, per):
            n = min(per, t - r0)
            self.rt.run(pending + self._logit_dispatches(act, r0, n))
            pending = []
            out[r0 - first:r0 - first + n] = self.rt.read(self._logit_buf[1], _F32, (n, V), nbytes=n * V * 4)
        if not np.isfinite(out).all():
            raise NonFiniteResult(
                f"the GPU forward's logits at positions {self.pos - t + first}..{self.pos - 1} are not finite",
                "Run the same prompt with --forward numpy: non-finite logits there too mean the model (its weights) is "
                "the cause; finite ones mean the GPU path is.")
        return out
