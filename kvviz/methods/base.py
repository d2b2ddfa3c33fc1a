"""Quantisation methods as data + behaviour, registered by name.

A method knows: which shapes it can take, its cache layout (fields, bits, bytes per token), how to
quantise a batch into its cache on the GPU (its writer kernel), how attention runs over that cache
(a native kernel, or its dequantise kernel + the f32 paged decode), and its numpy oracle.

Adding a method = one new module under kvviz/methods/ that subclasses `KVMethod` and decorates the
class with `@register`; kvviz/methods/__init__.py imports it. The window, the CLI and the report
list `registry()` and need no change.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from kvviz.errors import InvalidInput


@dataclass(frozen=True)
class LayoutField:
    """One field of a cache record, e.g. 128 int8 codes, one f32 scale, 32 JL sign bits."""

    name: str  # "codes", "scale", "zero", "norm", "jl_bits", ...
    dtype: str  # "int8", "uint4", "uint2", "fp8_e4m3fn", "fp8_e5m2", "f32", "f16", "bit"
    bits: int  # bits of one element
    count: int  # elements in one record
    per: str = "token"  # what one record covers: "token", "group", "channel-group", "tensor", "vector"
    note: str = ""

    @property
    def total_bits(self) -> int:
        return self.bits * self.count


@dataclass(frozen=True)
class CacheLayout:
    """A method's cache layout for one of K or V, described as data (RenderDoc-style)."""

    method: str
    which: str  # "K" or "V"
    head_size: int
    fields: tuple[LayoutField, ...]
    bytes_per_token_per_head: float  # average bytes a token costs one KV head, scales included
    description: str = ""
    word_map: str = ""  # how fields sit in 32-bit words, one line a region

    @property
    def bits_per_element(self) -> float:
        """Effective bits per cached element, scales and zero points included."""
        return self.bytes_per_token_per_head * 8.0 / self.head_size

    def to_json(self) -> dict:
        return {
            "method": self.method,
            "which": self.which,
            "head_size": self.head_size,
            "bytes_per_token_per_head": self.bytes_per_token_per_head,
            "bits_per_element": self.bits_per_element,
            "fields": [f.__dict__ for f in self.fields],
            "description": self.description,
            "word_map": self.word_map,
        }


@dataclass
class TokenRecord:
    """What the block inspector shows for one token (of one KV head) in one block."""

    slot: int
    position: int  # position in its sequence, -1 if the slot is unused
    words: np.ndarray  # raw u32 words of this token's record (what sits in memory)
    fields: dict  # field name -> decoded values (np.ndarray or float)


@dataclass
class QuantizedKV:
    """A batch quantised by a method on the GPU, with host copies of what the panels need.

    codes/scales are host arrays in token-row order of the batch ([tokens, kv_heads, ...]); they are
    read back from the GPU cache, not recomputed.
    """

    method: "KVMethod"
    head_size: int
    num_kv_heads: int
    k_codes: np.ndarray  # integer codes as stored ([tokens, kvh, D]); float codes for FP8
    v_codes: np.ndarray
    k_scales: np.ndarray  # per-token (or per-group) scales as stored
    v_scales: np.ndarray
    code_range: tuple[float, float]  # smallest and largest representable code
    device: dict = field(default_factory=dict)  # method-specific device objects (caches, buffers)
    extra: dict = field(default_factory=dict)
    # What the method could not represent, said where it happens (e.g. vectors quantised to all-zero
    # codes under a scale floor); shown by the window, the report and `kvviz report`.
    warnings: list = field(default_factory=list)


class KVMethod(ABC):
    """Base class of a KV-cache quantisation method."""

    key: str = ""  # registry id, e.g. "int8_token"
    label: str = ""  # shown in the UI
    family: str = ""  # "int8", "int4", "fp8", "kivi", "turboquant", "f32"
    nominal_bits: float = 32.0
    # The kernels whose output attend() / weights() return, named when that output is NaN/Inf.
    attend_kernel: str = ""
    weights_kernel: str = ""

    def options(self) -> dict:
        """User-settable options and their current values (group size, recent window, ...)."""
        return {}

    @abstractmethod
    def check(self, num_heads: int, num_kv_heads: int, head_size: int, block_size: int) -> None:
        """Raise UnsupportedShape/InvalidInput for shapes this method cannot take."""

    @abstractmethod
    def layouts(self, head_size: int, block_size: int) -> tuple[CacheLayout, CacheLayout]:
        """(K layout, V layout)."""

    @abstractmethod
    def quantize(self, ctx, batch, key: np.ndarray, value: np.ndarray) -> QuantizedKV:
        """Run the method's GPU writer over a batch. ctx: kvviz.methods.context.GpuContext."""

    @abstractmethod
    def attend(self, ctx, qkv: QuantizedKV, batch, q: np.ndarray, scale: float) -> np.ndarray:
        """Decode attention over the quantised cache, on the GPU: [num_seqs, num_heads, D] f32."""

    @abstractmethod
    def weights(self, ctx, qkv: QuantizedKV, batch, q: np.ndarray, scale: float) -> np.ndarray:
        """Attention weights over positions from the GPU: [num_seqs, num_heads, max_ctx] f32."""

    @abstractmethod
    def inspect_block(self, ctx, qkv: QuantizedKV, batch, block: int, kv_head: int, which: str) -> list[TokenRecord]:
        """Decode one physical block of the cache for the block inspector."""

    def timed_kernels(self, ctx, batch, key, value, q, scale) -> list:
        """[(kernel name, dispatches, bytes moved)] for the timing panel and `kvviz bench`."""
        return []


_REGISTRY: dict[str, Callable[[], KVMethod]] = {}


def register(cls):
    """Class decorator: make a method selectable everywhere by its `key`."""
    if not cls.key:
        raise ValueError(f"{cls.__name__} has no key")
    _REGISTRY[cls.key] = cls
    return cls


def registry() -> dict[str, Callable[[], KVMethod]]:
    import kvviz.methods  # noqa: F401  (imports every method module, which registers itself)

    return dict(_REGISTRY)


def option_defaults(key: str) -> dict:
    """A method's options as declared: its constructor's keyword parameters and their defaults.

    The default's type is the option's type (int, float, str, bool); `check_options` holds values to it.
    """
    import inspect

    reg = registry()
    if key not in reg:
        raise InvalidInput(f"Unknown method {key!r}; available: {', '.join(sorted(reg))}",
                           "Pick one of the registered methods (`kvviz info` lists them).")
    params = inspect.signature(reg[key].__init__).parameters
    return {n: p.default for n, p in params.items()
            if n != "self" and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}


def check_options(key: str, options) -> dict:
    """`options` checked against the method's declared options: a mapping whose keys the method
    knows and whose values have each option's type. InvalidInput names the option otherwise."""
    import numbers

    known = option_defaults(key)
    listing = ", ".join(f"{n} (default {d!r})" for n, d in known.items())
    listing = f"Options of {key}: {listing}." if listing else f"{key} takes no options."
    if not isinstance(options, dict):
        raise InvalidInput(f"method_options must be a JSON object of option: value, got {options!r}",
                           listing)
    out = {}
    for name, val in options.items():
        if name not in known:
            raise InvalidInput(f"method_options: {key} has no option {name!r}", listing)
        default = known[name]
        if isinstance(default, bool):
            ok = isinstance(val, bool)
        elif isinstance(default, int):
            ok = isinstance(val, numbers.Integral) and not isinstance(val, bool)
        elif isinstance(default, float):
            ok = isinstance(val, numbers.Real) and not isinstance(val, bool) and np.isfinite(val)
        elif isinstance(default, str):
            ok = isinstance(val, str)
        else:
            ok = True
        if not ok:
            kind = {bool: "true or false", int: "an integer", float: "a finite number", str: "a string"}.get(type(default), type(default).__name__)
            raise InvalidInput(f"method_options: {key} option {name!r} must be {kind}, got {val!r}", listing)
        out[name] = int(val) if isinstance(default, int) and not isinstance(default, bool) else val
    return out


def get_method(key: str, **options) -> KVMethod:
    reg = registry()
    if key not in reg:
        raise InvalidInput(f"Unknown method {key!r}; available: {', '.join(sorted(reg))}")
    return reg[key](**check_options(key, options))
