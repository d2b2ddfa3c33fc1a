"""vllm_fp8_e4m3 and vllm_fp8_e5m2: the FP8 KV cache as vLLM runs it (`--kv-cache-dtype fp8_e4m3 / fp8_e5m2`):
FP8 codes with a scale that is NOT the token's own, one per tensor (K and V each) or one per KV head.

Scales (option `scales`):
  "calibrate": scale = max(amax / fp8_max, 2^-126), amax over the K (V) seen, as engines calibrate
               (vLLM's --calculate-kv-scales): in a session every real token of the batch, or only the
               positions < calib_tokens of each sequence; in live decode the prompt (prefill), after
               which the scales are FROZEN. Computed on the GPU (fp8_vllm_amax + fp8_vllm_scale).
  "given"    : k_scale / v_scale as given (vLLM's checkpoint scales; 1.0, vLLM's default without them).
Values beyond the calibrated range saturate to +-max: the writer counts them per KV head and the method
says so (QuantizedKV.warnings, extra["saturated"]; the live cache view's note).
Record: D/4 words of codes; the scales sit in a side buffer (amortised, not counted per token).
Shaders quant/fp8_vllm_*.wgsl (the FP8 encoder of common/quant.wgsl); kernels kvviz/families/fp8_vllm/kernels.py;
oracle kvviz/families/fp8/oracle.py (vllm_*); tests tests/test_fp8_vllm.py.
"""
from __future__ import annotations

import numpy as np

from kvviz.attention import prefill, records as qk
from kvviz.attention.split_decode import fp8_format
from kvviz.families.fp8 import format as fmt8
from kvviz.families.fp8_vllm import kernels as fk
from kvviz.families.fp8_vllm.live_cache import VllmFp8LiveCache
from kvviz.methods.base import CacheLayout, LayoutField, OptionSpec, register
from kvviz.methods.records import PerTokenRecordMethod
from kvviz.metrics import format_values, scaled_codes

GRANULARITIES = ("per_tensor", "per_head")
SCALE_SOURCES = ("calibrate", "given")
F32_MIN_NORMAL = float(fmt8.SCALE_FLOOR)


class _VllmFp8Base(PerTokenRecordMethod):
    family = "fp8_vllm"
    nominal_bits = 8.0
    fmt_key = ""
    OPTIONS = (
        OptionSpec("scale_granularity", str, "per_tensor", "per_tensor: one scale for all of K and one for V "
                   "(vLLM's k_scale / v_scale); per_head: one per KV head", choices=GRANULARITIES),
        OptionSpec("scales", str, "calibrate", "calibrate: scale = amax / fp8_max over the K/V seen (a session's "
                   "batch, or its first calib_tokens positions; live decode: the prompt, then frozen); given: "
                   "k_scale and v_scale", choices=SCALE_SOURCES),
        OptionSpec("calib_tokens", int, 0, "calibrate on positions < calib_tokens of each sequence only (0: every "
                   "token of the batch; in live decode: of the prompt)", minimum=0),
        OptionSpec("k_scale", float, 1.0, "the K scale with scales=given (vLLM's default without checkpoint "
                   "scales is 1.0)", minimum=F32_MIN_NORMAL, maximum=3.0e38),
        OptionSpec("v_scale", float, 1.0, "the V scale with scales=given", minimum=F32_MIN_NORMAL, maximum=3.0e38),
    )
    REFERENCE = "kvviz.families.fp8.oracle:vllm_attention"
    EXAMPLES = ({}, {"scale_granularity": "per_head"}, {"calib_tokens": 8},
                {"scales": "given", "k_scale": 0.005, "v_scale": 0.01})
    scale_granularity: str
    scales: str
    calib_tokens: int
    k_scale: float
    v_scale: float

    def configure(self):
        self.fmt = fmt8.FORMATS[self.fmt_key]
        self.code_range = (-self.fmt.max, self.fmt.max)
        how = "given" if self.scales == "given" else (
            f"amax of the first {self.calib_tokens} positions" if self.calib_tokens else "amax calibrated")
        self.label = f"vLLM {self.fmt.name} ({self.scale_granularity.replace('_', '-')} scale, {how})"

    @property
    def per_head(self) -> bool:
        return self.scale_granularity == "per_head"

    @property
    def given(self) -> tuple[float, float] | None:
        return (self.k_scale, self.v_scale) if self.scales == "given" else None

    def wpt(self, head_size):
        return head_size // 4

    def writer_spec(self):
        return fk.WRITE

    def dequant_spec(self):
        return fk.DEQUANT

    def prefill_format(self, head_size):
        """The FP8 records with the scale of the tensor (the ScaleBuffers' tensor words) or of the KV head (its
        scales words, index K|V * kv heads + head): the prefill reads both in place."""
        return prefill.record_format(fp8_format(self.fmt_key, True), per_head=self.per_head)

    def prefill_scales(self, qc):
        bufs = qc.extra["scales"]
        return bufs.scales if self.per_head else bufs.tensor

    def fast_cache_format(self, head_size):
        """Per-tensor scales: the fast split-K decode reads the FP8 codes in place (scales from the tensor
        buffer); per-head scales: the first-wave dequantise + f32 decode."""
        if self.per_head:
            return None

        return fp8_format(self.fmt_key, True)

    def unpack(self, records, head_size):
        codes, _ = fmt8.unpack_records(records, head_size, False)
        return {"codes": fmt8.decode(codes, self.fmt), "code_bits": codes,
                "scale": np.zeros(records.shape[:-1], np.float32)}

    # ------------------------------------------------------------------ GPU
    def _build(self, ctx, batch, key, value):
        key, value, sm = self._validate(batch, key, value)
        T, kvh, D = key.shape
        rt = ctx.rt
        qc = qk.alloc_cache(rt, self.id, batch, kvh, D, batch.block_size * self.wpt(D), batch.block_size * self.wpt(D))
        bufs = fk.ScaleBuffers.allocate(rt, kvh, self.given, self.id)
        qc.extra["scales"] = bufs
        if not self.per_head:
            qc.extra["tensor"] = bufs.tensor  # the fast decode's per-tensor scale words
        f32c = qk.alloc_f32(ctx, batch, kvh, D)
        wd = []
        if self.given is None:
            cal = fk.calibration_slots(sm, batch.token_pos, self.calib_tokens)
            wd += fk.calibrate_dispatches(rt, bufs, key, value, cal, self.fmt, self.per_head)
        wd += fk.write_dispatches(rt, qc, bufs, key, value, sm, self.fmt, self.per_head)
        dd = fk.dequant_dispatches(ctx, qc, bufs, f32c, batch, self.fmt, self.per_head)
        return key, value, qc, f32c, wd, dd

    def quantize(self, ctx, batch, key, value):
        qkv = super().quantize(ctx, batch, key, value)
        side = qkv.device["cache"].extra["scales"].read(ctx.rt)
        T = qkv.k_codes.shape[0]
        g = np.arange(qkv.num_kv_heads) if self.per_head else np.zeros(qkv.num_kv_heads, np.int64)
        ks, vs = side["scales"][0][g], side["scales"][1][g]
        qkv.k_scales = np.broadcast_to(ks, (T, len(g))).astype(np.float32)
        qkv.v_scales = np.broadcast_to(vs, (T, len(g))).astype(np.float32)
        qkv.extra["head_scales"] = (ks, vs)
        qkv.extra["amax"] = side["amax"]
        qkv.extra["saturated"] = side["saturated"]  # [2 (K, V), kvh] elements clipped to +-max
        n_real = int(np.count_nonzero(batch.slot_mapping != qk.PAD_SLOT)) * qkv.num_kv_heads * qkv.head_size
        qkv.warnings += self.saturation_warnings(side["saturated"], n_real)
        return qkv

    def code_values(self):
        """Every finite value of the FP8 format, in order (the histogram's code-index axis)."""
        return format_values(self.fmt.dtype)

    def unrounded_codes(self, qkv, which, x):
        """x / scale: a value with |x / scale| > max saturates to +-max."""
        return scaled_codes(x, qkv.k_scales if which == "K" else qkv.v_scales)

    def saturated_codes(self, qkv, which, x):
        """|x / scale| past the format's saturation bound (float32 bits above fmt.sat_bits: no finite
        round-to-nearest-even code; the writer clips it to +-max)."""
        u = np.abs(self.unrounded_codes(qkv, which, x)).astype(np.float32)
        return u.view(np.uint32) > np.uint32(self.fmt.sat_bits)

    def saturation_warnings(self, saturated: np.ndarray, per_tensor_elements: int, where: str = "") -> list[str]:
        """One line when any element saturated: counts for K and V, what the range was."""
        k, v = (int(x) for x in np.asarray(saturated).sum(axis=1))
        if not k and not v:
            return []
        src = ("the given scales" if self.given is not None else
               f"the scales calibrated on {'positions < ' + str(self.calib_tokens) if self.calib_tokens else 'the K/V seen'}"
               + (where and f" ({where})"))
        return [f"{self.id}: {k} of {per_tensor_elements} K and {v} of {per_tensor_elements} V values lie beyond "
                f"{src} (|x / scale| past the largest {self.fmt.name} value {self.fmt.max:g}) and saturated to "
                f"+-{self.fmt.max:g}"]

    def inspect_block(self, ctx, qkv, batch, block, kv_head, which):
        recs = super().inspect_block(ctx, qkv, batch, block, kv_head, which)
        ks, vs = qkv.extra["head_scales"]
        s = float((ks if which == "K" else vs)[kv_head])
        for r in recs:
            r.fields["scale"] = s
        return recs

    # ------------------------------------------------------------------ live decode
    @property
    def has_live_cache(self) -> bool:
        return True

    def live_cache(self, ctx, table, n_layers, n_heads, n_kv_heads, head_size, scale):
        return VllmFp8LiveCache(ctx, table, n_layers, n_heads, n_kv_heads, head_size, scale, method=self)

    # ------------------------------------------------------------------ layout
    def layouts(self, head_size, block_size):
        f = self.fmt
        nw = head_size // 4
        per = "head" if self.per_head else "tensor"
        how = (f"given ({self.k_scale:g} for K, {self.v_scale:g} for V)" if self.given is not None else
               f"max(amax/{f.max:g}, 2^-126), amax over the calibration tokens, then frozen")
        side = "2 x kv_heads f32 (one per KV head)" if self.per_head else "2 f32 (one for K, one for V)"

        def one(which):
            return CacheLayout(
                method=self.id, which=which, head_size=head_size,
                fields=(
                    LayoutField("codes", f.name, 8, head_size, "token", "saturating RNE of x/scale"),
                    LayoutField("scale", "f32", 32, 1, per, how),
                ),
                bytes_per_token_per_head=float(nw * 4),
                description=(
                    f"vLLM-style OCP {f.name} (max {f.max:g}) with a {per} scale, {how}; values beyond the scale's "
                    f"range saturate to +-{f.max:g} (counted). Dequantised = fp8*scale. Paged [num_blocks, kv_heads, "
                    f"{block_size}, {nw}] u32, codes only; the scales ({side}) sit in a side buffer, amortised "
                    "over the cache and not counted per token."
                ),
                word_map=f"words 0..{nw - 1}: 4 FP8 codes each (element 4w+l in byte l); side buffer: amax, scales, "
                         "saturation counts, each [K heads | V heads]",
            )

        return one("K"), one("V")


@register
class VllmFp8E4M3(_VllmFp8Base):
    id = "vllm_fp8_e4m3"
    label = "vLLM fp8 e4m3fn"
    fmt_key = "e4m3"


@register
class VllmFp8E5M2(_VllmFp8Base):
    id = "vllm_fp8_e5m2"
    label = "vLLM fp8 e5m2"
    fmt_key = "e5m2"
