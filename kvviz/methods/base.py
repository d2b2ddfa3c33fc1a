"""Quantisation methods as data + behaviour, registered by name.

A method knows: which shapes it can take, its cache layout (fields, bits, bytes per token), how to
quantise a batch into its cache on the GPU (its writer kernel), how attention runs over that cache
(a native kernel, or its dequantise kernel + the f32 paged decode), and its numpy oracle.

This module is the framework only: `KVMethod`, its typed options (`OptionSpec`) and `@register`. The
methods themselves live in the families above, which register their classes here when they are
imported; the lookups by name (the registry, a method's options, its reference) belong to that layer,
which loads every family first. The window, the CLI and the report list the registry and need no
change when a method is added.
"""
from __future__ import annotations

import numbers
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass, field

import numpy as np

from kvviz.errors import InvalidInput
from kvviz.metrics import code_stats
from kvviz.paging import PAD_SLOT

_KIND_WORDS = {bool: "true or false", int: "an integer", float: "a finite number", str: "a string"}
_TRUE, _FALSE = ("true", "yes", "on", "1"), ("false", "no", "off", "0")


@dataclass(frozen=True)
class OptionSpec:
    """One typed option of a method: the window builds its editor from it, the CLI and config files
    parse through `parse`.

    type: int, float, str or bool; choices: the allowed values when they are a closed set; minimum /
    maximum: inclusive bounds of a number.
    """

    name: str
    type: type
    default: object
    help: str
    choices: tuple = ()
    minimum: float | None = None
    maximum: float | None = None

    def accepts(self) -> str:
        """What the option takes, in words: "an integer, one of 2, 4", "an integer >= 0"."""
        kind = _KIND_WORDS[self.type]
        if self.choices:
            return f"{kind}, one of " + ", ".join(repr(c) if isinstance(c, str) else str(c) for c in self.choices)
        lo, hi = self.minimum, self.maximum
        if lo is not None and hi is not None:
            return f"{kind} in [{lo:g}, {hi:g}]"
        if lo is not None:
            return f"{kind} >= {lo:g}"
        if hi is not None:
            return f"{kind} <= {hi:g}"
        return kind

    def describe(self) -> str:
        """One line for hints and tooltips: name, what it takes, default."""
        return f"{self.name} ({self.accepts()}; default {self.default!r})"

    def _bad(self, value, where: str) -> InvalidInput:
        prefix = f"{where}: " if where else ""
        return InvalidInput(f"{prefix}option {self.name!r} must be {self.accepts()}, got {value!r}",
                            f"{self.name}: {self.help}")

    def parse(self, value, *, text: bool = True, where: str = ""):
        """`value` as the option's type, checked against its choices and range; InvalidInput naming
        the option and what it accepts otherwise.

        A value of the option's type is taken as is (an int for a float option too); with text=True a
        string is also read as what a user typed ("4", "0.5", "true"); with text=False (JSON values of
        a config) a string is only a string, so {"bits": "4"} is refused.
        """
        t = self.type
        v = value
        if isinstance(v, str) and t is not str and text:
            s = v.strip()
            if t is bool:
                if s.lower() not in _TRUE + _FALSE:
                    raise self._bad(value, where)
                v = s.lower() in _TRUE
            elif t is int:
                if not re.fullmatch(r"[+-]?\d+", s):
                    raise self._bad(value, where)
                v = int(s)
            else:
                try:
                    v = float(s)
                except ValueError:
                    raise self._bad(value, where) from None
        if t is bool:
            ok = isinstance(v, (bool, np.bool_))
        elif t is int:
            ok = isinstance(v, numbers.Integral) and not isinstance(v, (bool, np.bool_))
        elif t is float:
            ok = isinstance(v, numbers.Real) and not isinstance(v, (bool, np.bool_)) and bool(np.isfinite(v))
        else:
            ok = isinstance(v, str)
        if not ok:
            raise self._bad(value, where)
        v = t(v)
        if self.choices and v not in self.choices:
            raise self._bad(value, where)
        if (self.minimum is not None and v < self.minimum) or (self.maximum is not None and v > self.maximum):
            raise self._bad(value, where)
        return v


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

    id: str = ""  # registry id, e.g. "int8_token"
    label: str = ""  # shown in the UI
    family: str = ""  # "int8", "int4", "fp8", "kivi", "turboquant", "f32"
    nominal_bits: float = 32.0
    # The kernels whose output attend() / weights() return, named when that output is NaN/Inf.
    attend_kernel: str = ""
    weights_kernel: str = ""

    # The method's typed options (what its constructor takes); each becomes an attribute of the instance.
    OPTIONS: tuple[OptionSpec, ...] = ()
    # Its end-to-end numpy reference, "module:function", imported by name by the registry's `reference`
    # (`kvviz bench` and the tests); never imported by the product.
    REFERENCE: str = ""
    # Option sets the conformance tests run (empty: every choice of each option with choices; see examples()).
    EXAMPLES: tuple[dict, ...] = ()
    # Whether the method's fast writer takes K/V already on the device (DeviceRows, bound in place through
    # kvviz/attention/writers.py row_input): the live caches then write a GPU forward's K/V without a read-back
    # (RecordLiveCache / RequantCache.extend_on_device). Set on each family whose fast writer is tested that way
    # (tests/test_fast_writers.py, tests/test_live_appends.py): a writer that touches its rows on the host first must
    # not claim it.
    device_rows_writer: bool = False

    def __init__(self, **options):
        self._options = self.parse_options(options)
        for name, val in self._options.items():
            setattr(self, name, val)
        self.configure()

    def configure(self) -> None:
        """Derived state from the parsed options (a label, a format); called by __init__."""

    @classmethod
    def parse_options(cls, values, *, text: bool = False, where: str = "method_options", defaults: bool = True) -> dict:
        """The method's options from `values` (a mapping of option name to value), each parsed by its
        OptionSpec: {name: typed value} for every declared option (defaults=False: only those in `values`).

        text=False: values are JSON values (a config file, `--set method_options=...`, code) and must have
        the option's type already ("4" is not an integer). text=True: values may be text a user typed
        (`kvviz live --methods kivi:bits=4`). InvalidInput names the option and lists the known ones.
        """
        known = {o.name: o for o in cls.OPTIONS}
        listing = ", ".join(o.describe() for o in cls.OPTIONS)
        listing = f"Options of {cls.id}: {listing}." if listing else f"{cls.id} takes no options."
        if not isinstance(values, dict):
            raise InvalidInput(f"{where} must be a JSON object of option: value, got {values!r}", listing)
        for name in values:
            if name not in known:
                raise InvalidInput(f"{where}: {cls.id} has no option {name!r}", listing)
        out = {}
        for name, spec in known.items():
            if name not in values:
                if defaults:
                    out[name] = spec.default
                continue
            try:
                out[name] = spec.parse(values[name], text=text, where=f"{where}: {cls.id}")
            except InvalidInput as exc:
                raise InvalidInput(str(exc), listing) from None
        return out

    @classmethod
    def examples(cls) -> list[dict]:
        """Option sets worth testing: EXAMPLES when declared, else each choice of every option that has
        choices ({} for a method without such options)."""
        if cls.EXAMPLES:
            return [dict(e) for e in cls.EXAMPLES]
        out = [{o.name: c} for o in cls.OPTIONS for c in o.choices]
        return out or [{}]

    def options(self) -> dict:
        """User-settable options and their current values (group size, recent window, ...)."""
        return dict(getattr(self, "_options", {}))

    def option_name(self) -> str:
        """The method's key and the options it was given that differ from their defaults, e.g.
        `turboquant qjl_scale=unbiased`: what tells two settings of one method apart (their labels may not)."""
        defaults = {o.name: o.default for o in self.OPTIONS}
        changed = [f"{k}={v}" for k, v in self.options().items() if k in defaults and v != defaults[k]]
        return " ".join([self.id] + changed)

    def for_layer(self, layer: int) -> "KVMethod":
        """The method as it quantises model layer `layer` (the session's and live decode's layer). The
        same instance for methods whose cache does not depend on the layer."""
        return self

    # ------------------------------------------------------------------ live decode (kvviz/methods/live_cache.py)
    @property
    def has_live_cache(self) -> bool:
        """Whether `live_cache` gives live decode an incremental cache for this method."""
        return False

    def live_cache(self, ctx, table, n_layers: int, n_heads: int, n_kv_heads: int, head_size: int, scale: float):
        """The method's own live cache (a kvviz.methods.live_cache.LiveCache written token by token), or None:
        live decode then quantises the whole sequence again every step through `quantize`."""
        return None

    def token_scales(self, qkv: QuantizedKV, kv_head: int, n: int):
        """(K [n], V [n], note) per-position scales of one KV head over the first n token rows of a
        one-sequence batch in position order, from `quantize`'s host copies: a per-group or per-channel
        scale averaged over the token's groups or channels, NaN where a position has none (the note then
        says why); None when the method keeps no scales."""
        if qkv.k_scales is None or qkv.v_scales is None:
            return None
        out = []
        for arr in (qkv.k_scales, qkv.v_scales):
            a = np.asarray(arr, np.float64)[:n, kv_head].reshape(n, -1)
            out.append(a.mean(-1) if a.shape[1] > 1 else a[:, 0])
        return out[0], out[1], ""

    @abstractmethod
    def check(self, num_heads: int, num_kv_heads: int, head_size: int, block_size: int) -> None:
        """Raise UnsupportedShape/InvalidInput for shapes this method cannot take."""

    @abstractmethod
    def layouts(self, head_size: int, block_size: int) -> tuple[CacheLayout, CacheLayout]:
        """(K layout, V layout)."""

    @abstractmethod
    def quantize(self, ctx, batch, key: np.ndarray, value: np.ndarray) -> QuantizedKV:
        """Run the method's GPU writer over a batch. ctx: kvviz.methods.context.GpuContext."""

    def quantize_device(self, ctx, batch, key, value) -> QuantizedKV | None:
        """The method's cache of key / value [tokens, kv_heads, D] on the device alone: the writer's dispatches
        submitted, not waited for, nothing read back and no host fields (the QuantizedKV's arrays are empty). What a
        pass that only attends over the cache through `prefill_plan` needs (kvviz eval's re-quantising cache), without
        quantize's read-back of every record. key / value are host arrays, or DeviceRows where the method's writer
        binds device rows as they are. None where the method has no such path for these inputs (the caller runs
        quantize)."""
        return None

    @abstractmethod
    def attend(self, ctx, qkv: QuantizedKV, batch, q: np.ndarray, scale: float) -> np.ndarray:
        """Decode attention over the quantised cache, on the GPU: [num_seqs, num_heads, D] f32."""

    @abstractmethod
    def weights(self, ctx, qkv: QuantizedKV, batch, q: np.ndarray, scale: float) -> np.ndarray:
        """Attention weights over positions from the GPU: [num_seqs, num_heads, max_ctx] f32."""

    @abstractmethod
    def inspect_block(self, ctx, qkv: QuantizedKV, batch, block: int, kv_head: int, which: str) -> list[TokenRecord]:
        """Decode one physical block of the cache for the block inspector."""

    # ------------------------------------------------------------------ statistics of the codes
    def code_values(self) -> np.ndarray | None:
        """The values a float code format takes, in increasing order (FP8, FP4): the code histogram then
        has one bar per value, on a code-index axis labelled with the values. None for integer codes."""
        return None

    def unrounded_codes(self, qkv: QuantizedKV, which: str, x: np.ndarray) -> np.ndarray | None:
        """The code each input of x ([tokens, kv_heads, D], token-row order) maps to before rounding and
        clamping (x / scale for a symmetric scale): saturation is the share of these beyond the code
        range. None when the method has no such map (then no saturation statistic is shown)."""
        return None

    def saturated_codes(self, qkv: QuantizedKV, which: str, x: np.ndarray) -> np.ndarray | None:
        """Boolean mask of the inputs x that saturate, when the method's exact rule is more than "the
        rounded unrounded code lies beyond the range" (FP8's round-to-nearest-even at the top); None: that
        rule on `unrounded_codes`."""
        return None

    def dequantised_rows(self, ctx, qkv: QuantizedKV, batch, which: str) -> np.ndarray | None:
        """The method's reconstruction of K or V in token-row order [tokens, kv_heads, D] (pad rows 0),
        read from its dequantised f32 cache when it keeps one (`read_f32`); None otherwise."""
        read = getattr(self, "read_f32", None)
        if read is None or "f32" not in qkv.device:
            return None
        f = np.asarray(read(ctx, qkv, which))  # [num_blocks, kv_heads, block_size, D]
        sm = np.asarray(batch.slot_mapping).astype(np.int64)
        real = np.asarray(batch.slot_mapping) != PAD_SLOT
        out = np.zeros((len(sm), f.shape[1], f.shape[3]), np.float32)
        bs = batch.block_size
        out[real] = f[sm[real] // bs, :, sm[real] % bs]
        return out

    def code_statistics(self, ctx, qkv: QuantizedKV, batch, key: np.ndarray, value: np.ndarray) -> tuple:
        """(K, V) kvviz.metrics.CodeStats over the batch's real tokens: the histogram of the
        stored codes and named statistics, each with its one-line definition.

        The default gives every method: saturated (from `unrounded_codes`, when the method defines it),
        zeroed non-zeros (from `dequantised_rows`, when it has them) and the share of the code range used;
        a float format's histogram runs over `code_values`. Index methods (TurboQuant, KIVI) override this
        with the statistics that fit them.
        """
        real = np.asarray(batch.slot_mapping) != PAD_SLOT
        out = []
        for which, codes, x in (("K", qkv.k_codes, key), ("V", qkv.v_codes, value)):
            x = np.asarray(x, np.float32)
            deq = self.dequantised_rows(ctx, qkv, batch, which) if ctx is not None else None
            out.append(code_stats(codes, qkv.code_range, real, x=x, dequantised=deq,
                                  unrounded=self.unrounded_codes(qkv, which, x), code_values=self.code_values(),
                                  saturated=self.saturated_codes(qkv, which, x)))
        return tuple(out)

    def prefill_plan(self, ctx, qkv: QuantizedKV, batch, q: np.ndarray, q_lens, scale: float, softcap: float = 0.0):
        """The causal prefill (kvviz/attention/prefill.py) over the cache `qkv` holds (what `quantize` returned, or a
        live cache's view of its buffers): a PrefillPlan of q [sum(q_lens), H, D], q_lens[s] queries of sequence s
        at its last q_lens[s] positions of `batch`, each attending to the positions up to its own; reading the
        packed cache in place; softcap: the attention logits' soft-cap (kvviz/attention/prefill.py Prefill.plan; 0:
        none). None where the method has no prefill for this shape (callers then run the decode once a query)."""
        return None

    def fast_cache_format(self, head_size: int):
        """The kvviz.attention.split_decode.CacheFormat of this method's paged cache when the fast split-K
        decode reads it in place, else None (the method keeps its own decode)."""
        return None

    def timed_kernels(self, ctx, batch, key, value, q, scale, qkv: QuantizedKV | None = None) -> list:
        """[(kernel name, dispatches, bytes moved)] for the timing panel and `kvviz bench`. With `qkv`
        (what `quantize` returned for this batch, key and value) the dispatches that filled its caches are
        reused: nothing is uploaded or quantised again."""
        return []


_REGISTRY: dict[str, type] = {}


def batch_layouts(method, batch, head_size):
    """(K, V) layouts whose bytes and bits per element are those of THIS batch: the one definition the
    overview, the block inspector, the report, the comparison, `kvviz live` and `kvviz eval` all show. A method
    whose cost depends on the batch (KIVI: the float32 residual rows of each sequence's recent tokens) accounts
    it exactly in `layouts_for_batch`; the others' `layouts` do not depend on it."""
    hook = getattr(method, "layouts_for_batch", None)
    if hook is not None:
        return hook(batch, head_size)
    return method.layouts(head_size, batch.block_size)


def register(cls):
    """Class decorator: make a method selectable everywhere by its `key`.

    A method declares its label, its options (`OPTIONS`) and its end-to-end numpy reference
    (`REFERENCE`, "module:function", imported only by `kvviz bench` and the tests); one without a key, a
    label or a reference, or with options its constructor does not set, is refused here.
    """
    if not cls.id:
        raise ValueError(f"{cls.__name__} has no key")
    if not cls.label:
        raise ValueError(f"{cls.__name__} ({cls.id}) has no label")
    if ":" not in (cls.REFERENCE or ""):
        raise ValueError(f"{cls.__name__} ({cls.id}) names no numpy reference (REFERENCE = 'module:function')")
    names = [o.name for o in cls.OPTIONS]
    if len(set(names)) != len(names):
        raise ValueError(f"{cls.__name__} ({cls.id}) declares an option twice: {names}")
    for o in cls.OPTIONS:
        o.parse(o.default)  # the declared default is a value the option accepts
    for e in cls.EXAMPLES:
        cls.parse_options(e)
    _REGISTRY[cls.id] = cls
    return cls


def registered() -> dict[str, type]:
    """{key: class} of the methods registered so far. The families above register theirs when they are
    imported; the complete registry is the families' lookup, which imports them all first."""
    return dict(_REGISTRY)
