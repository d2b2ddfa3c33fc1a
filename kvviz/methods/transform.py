"""Host-side transforms of a method's cache: the Walsh-Hadamard rotation, and llama.cpp's way of running its types.

Two options every method takes through the registry (kvviz/families/registry.py), besides its own:

  rotation = "hadamard"  Q, K and V are rotated by an orthonormal Walsh-Hadamard matrix before the method's
                         writer, as llama.cpp rotates them for a quantised cache (attn_rot_k / attn_rot_v in
                         its src/llama-kv-cache.cpp): K and Q in blocks of the largest power of two that
                         divides the head size (64 at least), V in blocks of 64; the attention output is
                         rotated back (the matrix is its own inverse). Scores q.k and the weights are those of
                         the rotated vectors, so the cache is a format of its own (QuaRot and SpinQuant rotate
                         so): quantisation error is spread over the block's dimensions. The head size must be
                         a multiple of 64.
  llama_cpp = "cpu"      (the llama.cpp block types only) the type as llama.cpp's CPU backend runs it: the
                         rotation above wherever llama.cpp applies it (head size a multiple of 64), K and Q
                         in the GGUF's dimension order (llama models store interleaved rotary pairs; kvviz's
                         loader works in the rotate-half order, so a 32-element block holds other dimensions),
                         and Q converted to q8_0 for the dot products (its flash attention converts Q to the
                         type's vec_dot_type: q8_0, or q8_1 for q4_1 / q5_1, whose values are q8_0's; the
                         f16 rounding of q8_1's block sum is not reproduced). "cpu-unrotated": the same with
                         LLAMA_ATTN_ROT_DISABLE=1.

The transforms run on the host, in float32, on the K/V handed to the writer and on the query handed to the
decode: the GPU kernels are the method's own and the cache holds the rotated (and reordered) values, which
its block inspector shows. A rotated method is `TransformedMethod` (the method's id and options, its label
saying the transform); its live cache is `TransformedLiveCache`.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
from gguf.quants import np_roundf

from kvviz.errors import InvalidInput, UnsupportedShape
from kvviz.methods.base import KVMethod, OptionSpec
from kvviz.methods.live_cache import LiveCache

_F32 = np.float32

ROTATION = OptionSpec(
    "rotation", str, "none",
    "'hadamard': Q, K and V rotated by a Walsh-Hadamard matrix on the host before the writer, as llama.cpp "
    "rotates quantised caches (K and Q in blocks of the largest power of two dividing the head size, V in blocks "
    "of 64; the output rotated back); the cache holds rotated values. Head size a multiple of 64.",
    choices=("none", "hadamard"))
LLAMA_CPP = OptionSpec(
    "llama_cpp", str, "off",
    "'cpu': as llama.cpp's CPU backend runs this type: its Hadamard rotation (head size a multiple of 64), K and Q "
    "in the GGUF's dimension order, Q converted to q8_0 for the dot products; 'cpu-unrotated': the same with "
    "LLAMA_ATTN_ROT_DISABLE=1.",
    choices=("off", "cpu", "cpu-unrotated"))
OPTIONS = (ROTATION, LLAMA_CPP)
NAMES = tuple(o.name for o in OPTIONS)
LLAMA_CPP_FAMILY = "ggml"


def gguf_interleaved(config) -> bool:
    """Whether the model's GGUF stores K in interleaved rotary pairs: models with llama.cpp's "norm" RoPE do
    (its converter permutes their Q/K rows, kvviz's loader permutes them back to rotate-half); "neox" models
    (Qwen, Gemma, Phi-3) keep the rotate-half order in the file too."""
    return str(getattr(config, "rope_style", "norm")) == "norm"


def options_for(family: str) -> tuple[OptionSpec, ...]:
    """The transform options a method of `family` takes."""
    return OPTIONS if family == LLAMA_CPP_FAMILY else (ROTATION,)


def hadamard(n: int) -> np.ndarray:
    """The orthonormal n x n Walsh-Hadamard matrix (Sylvester's order, llama.cpp's ggml_gen_hadamard):
    symmetric, its own inverse."""
    if n < 1 or n & (n - 1):
        raise InvalidInput(f"a Walsh-Hadamard matrix needs a power of two, got {n}")
    h = np.ones((1, 1), np.float64)
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return (h / np.sqrt(n)).astype(_F32)


def k_block(head_size: int) -> int:
    """llama.cpp's rotation block of K (and Q): the largest power of two that divides the head size, from 64."""
    n = 64
    while head_size % (2 * n) == 0:
        n *= 2
    return n


V_BLOCK = 64


def gguf_order(head_size: int) -> np.ndarray:
    """Index map from the rotate-half order to the GGUF's interleaved order: x_gguf = x[..., idx]
    (x_gguf[2i + c] = x[c * D/2 + i], llama.cpp's converter permutation of a head)."""
    return np.arange(head_size).reshape(2, head_size // 2).T.reshape(-1)


def q8_0_round_trip(x: np.ndarray) -> np.ndarray:
    """x through ggml's q8_0 and back (blocks of 32 along the last axis): what llama.cpp's CPU dot products see.
    gguf.quants' Q8_0 arithmetic (ggml-quants.c's, bit for bit: d = amax / 127 in float32, the codes roundf(x / d)
    by the reciprocal, d stored as f16), without packing the blocks into bytes and out again."""
    a = np.ascontiguousarray(x, _F32)
    blocks = a.reshape(-1, 32)
    d = np.abs(blocks).max(axis=1, keepdims=True) / 127
    with np.errstate(divide="ignore"):
        inv = np.where(d == 0, 0, 1 / d)
    codes = np_roundf(blocks * inv).astype(np.int8)
    with np.errstate(over="ignore"):  # a block past f16's range: its scale is inf, as ggml stores it
        d16 = d.astype(np.float16).astype(_F32)
    return (codes.astype(_F32) * d16).reshape(a.shape)


@dataclass(frozen=True)
class Transform:
    """What is done to Q, K and V on the host: rotation blocks (0: none), the GGUF order, Q through q8_0."""

    k_rot: int = 0
    v_rot: int = 0
    gguf: bool = False
    q8_query: bool = False
    what: str = ""  # in words, for labels

    @property
    def identity(self) -> bool:
        return not (self.k_rot or self.v_rot or self.gguf or self.q8_query)


def transform_of(options: dict, head_size: int, interleaved: bool = True) -> Transform:
    """The Transform the options ask for at this head size (`interleaved`: the model's GGUF stores K in
    interleaved rotary pairs; False for models whose GGUF keeps the rotate-half order)."""
    rot = options.get("rotation", "none")
    lc = options.get("llama_cpp", "off")
    if rot == "hadamard" and lc == "cpu-unrotated":
        raise InvalidInput("rotation 'hadamard' contradicts llama_cpp 'cpu-unrotated'",
                           "Give one: llama_cpp 'cpu' rotates as llama.cpp does.")
    if rot == "hadamard" and head_size % 64:
        raise UnsupportedShape(f"rotation 'hadamard' needs a head size that is a multiple of 64, got {head_size}",
                               "llama.cpp rotates only such heads; use rotation 'none'.")
    rotate = rot == "hadamard" or (lc == "cpu" and head_size % 64 == 0)
    words = []
    if lc != "off":
        words.append("as llama.cpp's CPU backend runs it" + ("" if rotate else ", rotation off"))
    elif rotate:
        words.append("Hadamard-rotated")
    return Transform(k_block(head_size) if rotate else 0, V_BLOCK if rotate else 0, lc != "off" and interleaved,
                     lc != "off", "; ".join(words))


class _Maps:
    """The host transforms of one head size."""

    def __init__(self, t: Transform, head_size: int):
        self.t, self.d = t, head_size
        self.hk = hadamard(t.k_rot) if t.k_rot else None
        self.hv = hadamard(t.v_rot) if t.v_rot else None
        self.order = gguf_order(head_size) if t.gguf else None
        self.inverse = np.argsort(self.order) if t.gguf else None

    @staticmethod
    def _rot(x, h):
        n = h.shape[0]
        a = np.asarray(x, _F32)
        return (a.reshape(*a.shape[:-1], a.shape[-1] // n, n) @ h).reshape(a.shape).astype(_F32, copy=False)

    def k(self, x):
        a = np.asarray(x, _F32)
        if self.order is not None:
            a = a[..., self.order]
        return self._rot(a, self.hk) if self.hk is not None else np.ascontiguousarray(a)

    def q(self, x):
        a = self.k(x)
        return q8_0_round_trip(a) if self.t.q8_query else a

    def k_back(self, x):
        a = self._rot(x, self.hk) if self.hk is not None else np.asarray(x, _F32)
        return np.ascontiguousarray(a[..., self.inverse]) if self.inverse is not None else a

    def v(self, x):
        return self._rot(x, self.hv) if self.hv is not None else np.asarray(x, _F32)

    v_back = v  # the V rotation is its own inverse


class TransformedMethod(KVMethod):
    """A method whose Q, K and V pass through a Transform on the host (kvviz/methods/transform.py's docstring)."""

    def __init__(self, inner: KVMethod, transform_options: dict, interleaved: bool = True):
        # not KVMethod.__init__: the inner method parsed its own options
        self.inner = inner
        self.transform_options = dict(transform_options)
        self.interleaved = bool(interleaved)
        self.id = inner.id
        self.family = inner.family
        self.nominal_bits = inner.nominal_bits
        self.attend_kernel = inner.attend_kernel
        self.weights_kernel = inner.weights_kernel
        self.OPTIONS = tuple(inner.OPTIONS) + options_for(inner.family)
        self._maps: dict[int, _Maps] = {}
        t = transform_of(self.transform_options, 64, interleaved)  # the words; any head size gives the same
        self.label = f"{inner.label} ({t.what})" if t.what else inner.label

    def __getattr__(self, name):  # everything the transform does not change is the inner method's
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    def maps(self, head_size: int) -> _Maps:
        m = self._maps.get(head_size)
        if m is None:
            m = self._maps[head_size] = _Maps(transform_of(self.transform_options, head_size, self.interleaved),
                                              head_size)
        return m

    def transform(self, head_size: int) -> Transform:
        return self.maps(head_size).t

    def options(self) -> dict:
        return {**self.inner.options(), **self.transform_options}

    def with_interleaved(self, interleaved: bool) -> "TransformedMethod":
        """The same method for a model whose GGUF stores K in interleaved pairs (True) or rotate-half (False)."""
        return TransformedMethod(self.inner, self.transform_options, interleaved)

    def for_layer(self, layer: int) -> "TransformedMethod":
        inner = self.inner.for_layer(layer)
        return self if inner is self.inner else TransformedMethod(inner, self.transform_options, self.interleaved)

    # -------------------------------------------------------------- shapes and layouts
    def check(self, num_heads, num_kv_heads, head_size, block_size):
        self.inner.check(num_heads, num_kv_heads, head_size, block_size)
        self.maps(head_size)

    def _note(self, layouts, head_size):
        t = self.transform(head_size)
        if t.identity:
            return layouts
        parts = []
        if t.gguf:
            parts.append("K and Q in the GGUF's interleaved dimension order")
        if t.k_rot:
            parts.append(f"K and Q Hadamard-rotated in blocks of {t.k_rot}, V in blocks of {t.v_rot}")
        if t.q8_query:
            parts.append("Q through q8_0 for the dot products")
        note = "; ".join(parts) + " (on the host: the cache holds the transformed values)"
        return tuple(replace(lay, description=(lay.description + " " if lay.description else "") + f"[{note}]")
                     for lay in layouts)

    def layouts(self, head_size, block_size):
        return self._note(self.inner.layouts(head_size, block_size), head_size)

    @property
    def layouts_for_batch(self):
        hook = getattr(self.inner, "layouts_for_batch")  # AttributeError when the inner method has none

        def layouts_for_batch(batch, head_size):
            return self._note(hook(batch, head_size), head_size)

        return layouts_for_batch

    # -------------------------------------------------------------- GPU
    def quantize(self, ctx, batch, key, value):
        m = self.maps(np.shape(key)[-1])
        return self.inner.quantize(ctx, batch, m.k(key), m.v(value))

    def attend(self, ctx, qkv, batch, q, scale):
        m = self.maps(np.shape(q)[-1])
        return m.v_back(self.inner.attend(ctx, qkv, batch, m.q(q), scale))

    def weights(self, ctx, qkv, batch, q, scale):
        return self.inner.weights(ctx, qkv, batch, self.maps(np.shape(q)[-1]).q(q), scale)

    def inspect_block(self, ctx, qkv, batch, block, kv_head, which):
        return self.inner.inspect_block(ctx, qkv, batch, block, kv_head, which)

    def dequantised_rows(self, ctx, qkv, batch, which):
        rows = self.inner.dequantised_rows(ctx, qkv, batch, which)
        if rows is None:
            return None
        m = self.maps(np.shape(rows)[-1])
        return m.k_back(rows) if which == "K" else m.v_back(rows)

    def code_statistics(self, ctx, qkv, batch, key, value):
        m = self.maps(np.shape(key)[-1])
        return self.inner.code_statistics(ctx, qkv, batch, m.k(key), m.v(value))

    def unrounded_codes(self, qkv, which, x):
        m = self.maps(np.shape(x)[-1])
        return self.inner.unrounded_codes(qkv, which, m.k(x) if which == "K" else m.v(x))

    def saturated_codes(self, qkv, which, x):
        m = self.maps(np.shape(x)[-1])
        return self.inner.saturated_codes(qkv, which, m.k(x) if which == "K" else m.v(x))

    def timed_kernels(self, ctx, batch, key, value, q, scale, qkv=None):
        m = self.maps(np.shape(key)[-1])
        return self.inner.timed_kernels(ctx, batch, m.k(key), m.v(value), m.q(q), scale, qkv)

    def fast_cache_format(self, head_size):
        return None  # the fast decode reads the cache with the caller's query: only through attend()

    def code_values(self):
        return self.inner.code_values()

    def token_scales(self, qkv, kv_head, n):
        return self.inner.token_scales(qkv, kv_head, n)

    # -------------------------------------------------------------- live decode
    @property
    def has_live_cache(self) -> bool:
        return self.inner.has_live_cache

    def live_cache(self, ctx, table, n_layers, n_heads, n_kv_heads, head_size, scale):
        inner = self.inner.live_cache(ctx, table, n_layers, n_heads, n_kv_heads, head_size, scale)
        return None if inner is None else TransformedLiveCache(inner, self, head_size)


class TransformedLiveCache(LiveCache):
    """A method's live cache with Q, K and V transformed on the host (K, V before the writer, Q before the
    decode, the output rotated back). Everything else is the inner cache's."""

    path = "transformed on the host, then the method's cache"  # kvviz live's cache path (the instance says which)

    def __init__(self, inner: LiveCache, method: TransformedMethod, head_size: int):
        # not LiveCache.__init__: the state (table, length, queries) is the inner cache's
        self.__dict__["inner"] = inner
        self.__dict__["maps"] = method.maps(head_size)
        self.__dict__["method"] = method
        self.__dict__["method_id"] = inner.method_id
        self.__dict__["label"] = f"{inner.label} ({method.transform(head_size).what})"
        self.__dict__["path"] = f"{inner.path}, Q/K/V transformed on the host"

    def __getattr__(self, name):
        return getattr(self.__dict__["inner"], name)

    @property
    def softcap(self) -> float:  # the inner cache's (set through __setattr__), not LiveCache's class default
        return self.inner.softcap

    def __setattr__(self, name, value):
        if name in ("label", "path"):
            self.__dict__[name] = value
        else:
            setattr(self.inner, name, value)

    def _kv(self, k, v):
        m = self.maps
        return m.k(np.asarray(k, _F32)), m.v(np.asarray(v, _F32))

    def write(self, layer, k, v, start):
        self.inner.write(layer, *self._kv(k, v), start)

    def extend(self, layer, k, v, start):
        self.inner.extend(layer, *self._kv(k, v), start)

    def takes_device_rows(self) -> bool:
        return False  # the transform of K and V runs on the host (the inner cache would get them untransformed)

    def extend_on_device(self, layer, k, v, start):
        return False

    def attend(self, layer, q, context_len):
        return self.maps.v_back(self.inner.attend(layer, self.maps.q(q), context_len))

    def attend_causal(self, layer, q, start):
        return self.maps.v_back(self.inner.attend_causal(layer, self.maps.q(q), start))

    def attend_causal_on_device(self, layer, q, start):
        return self.attend_causal(layer, q, start)  # the output is rotated back on the host

    def append_attend(self, layer, q, k, v, pos):
        kk, vv = self._kv(k, v)
        return self.maps.v_back(self.inner.append_attend(layer, self.maps.q(q), kk, vv, pos))

    def weights(self, layer, q, context_len):
        return self.inner.weights(layer, self.maps.q(q), context_len)

    def last_weights(self, layer):
        return self.inner.last_weights(layer)

    def load(self, k_all, v_all):
        for li in range(self.inner.n_layers):
            self.extend(li, k_all[li], v_all[li], 0)

    def bytes_per_token(self):
        return self.inner.bytes_per_token()

    def inspect_block(self, layer, block, kv_head, which="K"):
        return self.inner.inspect_block(layer, block, kv_head, which)

    def token_scales(self, layer, kv_head):
        return self.inner.token_scales(layer, kv_head)

    def describe(self):
        return dict(self.inner.describe(), label=self.label)
