"""fp8_e4m3 and fp8_e5m2: real OCP FP8 KV caches (the seed WGSL quantiser's "FP8" was int8 with an amax/127 scale: docs/kernels.md).

Saturating, round-to-nearest-even conversion written with integer bit manipulation in WGSL
(shaders/common/quant.wgsl: f32_to_fp8), bit exact against ml_dtypes after clipping to +-max.
Option scale_mode:
  "per_token" : scale = max(amax/fp8_max, 2^-126) per token and KV head, stored after the codes;
  "per_tensor": one scale each for K and V, max(amax/fp8_max, 2^-126) with amax over every real token
                and head of the batch, computed on the GPU (fp8_amax.wgsl atomicMax, then the writer);
                the record holds codes only, the scales sit in a 4-word tensor buffer.
Shaders: fp8/write.wgsl, fp8_amax.wgsl, fp8_dequant.wgsl. Oracle: kvviz/families/fp8/oracle.py.
"""
from __future__ import annotations

import numpy as np

from kvviz.attention import records as qk
from kvviz.attention.split_decode import fp8_format
from kvviz.families.fp8 import format as fmt8, kernels as fp8_kernels
from kvviz.methods.base import CacheLayout, LayoutField, OptionSpec, register
from kvviz.methods.records import PerTokenRecordMethod
from kvviz.metrics import format_values, scaled_codes

SCALE_MODES = ("per_token", "per_tensor")


class _Fp8Base(PerTokenRecordMethod):
    family = "fp8"
    nominal_bits = 8.0
    device_rows_writer = True
    fmt_key = ""
    OPTIONS = (
        OptionSpec("scale_mode", str, "per_token",
                   "per_token: one f32 scale per token and KV head, stored after its codes; per_tensor: one "
                   "scale each for K and V over the whole batch (computed on the GPU)", choices=SCALE_MODES),
    )
    REFERENCE = "kvviz.families.fp8.oracle:fp8_attention"
    scale_mode: str

    def configure(self):
        self.fmt = fmt8.FORMATS[self.fmt_key]
        self.code_range = (-self.fmt.max, self.fmt.max)
        self.label = f"{self.fmt.name} ({self.scale_mode.replace('_', '-')} scale)"

    @property
    def per_tensor(self) -> bool:
        return self.scale_mode == "per_tensor"

    def wpt(self, head_size):
        return head_size // 4 + (0 if self.per_tensor else 1)

    def _defines(self):
        d = self.fmt.defines()
        d["PER_TENSOR"] = "true" if self.per_tensor else "false"
        d["NAME"] = self.fmt.name
        return d

    def writer_spec(self):
        return fp8_kernels.FP8_WRITE.define(**self._defines())

    def dequant_spec(self):
        return fp8_kernels.FP8_DEQUANT.define(**self._defines())

    def fast_writer(self, rt, qc, key, value, sm, variant=None):
        return fp8_kernels.fp8_dispatches(rt, self.fmt, self.per_tensor, key, value, sm, qc.k, qc.v, qc.extra["tensor"],
                                          qc.block_size, variant=variant)

    def fast_cache_format(self, head_size):
        return fp8_format(self.fmt_key, self.per_tensor)

    def _tensor_buffer(self, ctx):
        # [amax K, amax V, scale K, scale V] as u32 bits; zeroed (atomicMax starts from 0).
        return ctx.rt.upload(np.zeros(4, np.uint32), f"{self.id}_tensor_scales")

    def writer_dispatches(self, ctx, qc, key, value, sm):
        rt = ctx.rt
        kvh, D = key.shape[1], key.shape[2]
        out = []
        kern = rt.compile(self.writer_spec())
        imm = kern.pack(kvh, D, qc.block_size, self.wpt(D))
        if self.per_tensor:
            amax = rt.compile(fp8_kernels.FP8_AMAX)
            out += qk.token_dispatches(rt, amax, key, value, sm, [qc.extra["tensor"]], lambda n: imm)
        out += qk.token_dispatches(rt, kern, key, value, sm, [qc.k, qc.v, qc.extra["tensor"]], lambda n: imm)
        return out

    def unpack(self, records, head_size):
        codes, scales = fmt8.unpack_records(records, head_size, not self.per_tensor)
        out = {"codes": fmt8.decode(codes, self.fmt), "code_bits": codes}
        out["scale"] = scales if scales is not None else np.zeros(records.shape[:-1], np.float32)
        return out

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

    def tensor_scales(self, ctx, qkv) -> tuple[float, float]:
        """(K scale, V scale) of per_tensor mode, read from the GPU."""
        t = ctx.rt.read(qkv.device["cache"].extra["tensor"], np.uint32, nbytes=16)
        s = t[2:4].view(np.float32)
        return float(s[0]), float(s[1])

    def quantize(self, ctx, batch, key, value):
        qkv = super().quantize(ctx, batch, key, value)
        if self.per_tensor:
            ks, vs = self.tensor_scales(ctx, qkv)
            qkv.k_scales = np.full(qkv.k_codes.shape[:-1], ks, np.float32)
            qkv.v_scales = np.full(qkv.v_codes.shape[:-1], vs, np.float32)
            qkv.extra["tensor_scales"] = (ks, vs)
        return qkv

    def inspect_block(self, ctx, qkv, batch, block, kv_head, which):
        recs = super().inspect_block(ctx, qkv, batch, block, kv_head, which)
        if self.per_tensor:
            s = self.tensor_scales(ctx, qkv)[0 if which == "K" else 1]
            for r in recs:
                r.fields["scale"] = s
        return recs

    def layouts(self, head_size, block_size):
        f = self.fmt
        nw = head_size // 4
        if self.per_tensor:
            fields = (
                LayoutField("codes", f.name, 8, head_size, "token", "saturating RNE of x/scale"),
                LayoutField("scale", "f32", 32, 1, "tensor", f"max(amax_batch/{f.max:g}, 2^-126), one for K, one for V"),
            )
            bpt = float(nw * 4)
            wm = f"words 0..{nw - 1}: 4 FP8 codes each (element 4w+l in byte l); tensor buffer: [amaxK, amaxV, scaleK, scaleV] f32 bits"
            note = "The tensor scale (4 bytes for K, 4 for V) is amortised over the whole cache and not counted per token."
        else:
            fields = (
                LayoutField("codes", f.name, 8, head_size, "token", "saturating RNE of x/scale"),
                LayoutField("scale", "f32", 32, 1, "token", f"max(amax/{f.max:g}, 2^-126)"),
            )
            bpt = float((nw + 1) * 4)
            wm = f"words 0..{nw - 1}: 4 FP8 codes each (element 4w+l in byte l); word {nw}: f32 scale bits"
            note = ""

        def one(which):
            return CacheLayout(
                method=self.id,
                which=which,
                head_size=head_size,
                fields=fields,
                bytes_per_token_per_head=bpt,
                description=(
                    f"OCP {f.name} (max {f.max:g}), {self.scale_mode.replace('_', '-')} scale, saturating, "
                    f"round to nearest even; dequantised = fp8*scale. Paged [num_blocks, kv_heads, "
                    f"{block_size}, {self.wpt(head_size)}] u32. {note}"
                ).strip(),
                word_map=wm,
            )

        return one("K"), one("V")


@register
class Fp8E4M3(_Fp8Base):
    id = "fp8_e4m3"
    label = "fp8 e4m3fn"
    fmt_key = "e4m3"


@register
class Fp8E5M2(_Fp8Base):
    id = "fp8_e5m2"
    label = "fp8 e5m2"
    fmt_key = "e5m2"
