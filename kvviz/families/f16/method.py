"""f16: the unquantised baseline a real engine keeps, K/V in IEEE binary16, two halves a u32 word.

Every speed-up and every error of a quantised method can be read against it as well as against f32.
Conversion: round to nearest even from float32 with subnormals (numpy astype(float16)); a value that
would round to infinity (|x| >= 65520; float16's largest finite value is 65504) is refused with an
InvalidInput before anything is dispatched. Cache: paged [num_blocks, kv_heads, block_size, D/2] u32,
element 2w in the low half of word w (kvviz/families/f16/format.py).
Writer: shaders/f16/write_fast.wgsl (the fast writer; f16 has no first-wave one). Attention: the fast
split-K decode reading the halves in place (kvviz/attention/split_decode.py, format "f16") where it takes the
shape, else the dequantise kernel shaders/f16/dequant.wgsl (exact widening into the f32 cache) + the
f32 paged decode; weights always over the dequantised cache. Oracle: kvviz/families/f16/oracle.py.
"""
from __future__ import annotations

import numpy as np

from kvviz.attention.split_decode import F16 as F16_FORMAT
from kvviz.families.f16 import format as fmt16, kernels as f16_kernels
from kvviz.methods.base import CacheLayout, LayoutField, register
from kvviz.methods.records import PerTokenRecordMethod


@register
class F16(PerTokenRecordMethod):
    id = "f16"
    label = "f16 (unquantised baseline)"
    family = "f16"
    nominal_bits = 16.0
    head_multiple = 4
    head_multiple_why = "the f16 writer reads 4 floats a vector load (2 halves a word)"
    code_range = (-fmt16.F16_MAX, fmt16.F16_MAX)
    REFERENCE = "kvviz.families.f16.oracle:method_attention"
    has_first_wave_writer = False
    device_rows_writer = True

    def wpt(self, head_size):
        return fmt16.words_per_token(head_size)

    def writer_spec(self):
        return f16_kernels.WRITE_F16

    def dequant_spec(self):
        return f16_kernels.F16_DEQUANT

    def fast_writer(self, rt, qc, key, value, sm, variant=None):
        return f16_kernels.f16_dispatches(rt, key, value, sm, qc.k, qc.v, qc.block_size)

    def fast_cache_format(self, head_size):
        return F16_FORMAT

    def check_values(self, key, value):
        fmt16.check_range("key", key)
        fmt16.check_range("value", value)

    def writer_dispatches(self, ctx, qc, key, value, sm):
        return f16_kernels.f16_dispatches(ctx.rt, key, value, sm, qc.k, qc.v, qc.block_size)

    def unpack(self, records, head_size):
        h = fmt16.unpack_records(records)
        # "scale": the shared record reader wants one; f16 has none (quantize / inspect_block drop it)
        return {"codes": h.astype(np.float32), "code_bits": h.view(np.uint16).copy(),
                "scale": np.ones(records.shape[:-1], np.float32)}

    def quantize(self, ctx, batch, key, value):
        qkv = super().quantize(ctx, batch, key, value)
        # f16 keeps no scales: NaN per token and KV head (what the panels show where a token has no scale)
        qkv.k_scales = np.full(qkv.k_codes.shape[:-1], np.nan, np.float32)
        qkv.v_scales = np.full(qkv.v_codes.shape[:-1], np.nan, np.float32)
        return qkv

    def token_scales(self, qkv, kv_head, n):
        """f16 keeps no scale: the live cache view shows max |half| of each token vector instead."""
        out = [np.abs(np.asarray(c, np.float64)[:n, kv_head]).max(-1) if n else np.zeros(0)
               for c in (qkv.k_codes, qkv.v_codes)]
        return out[0], out[1], "f16 keeps no scale: shown is max |x| of each token's stored halves"

    def inspect_block(self, ctx, qkv, batch, block, kv_head, which):
        recs = super().inspect_block(ctx, qkv, batch, block, kv_head, which)
        for r in recs:
            r.fields.pop("scale", None)
        return recs

    def code_values(self):
        """Every finite float16 value, in order (the histogram's code-index axis)."""
        bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float64)
        return np.unique(bits[np.isfinite(bits)]) + 0.0

    def unrounded_codes(self, qkv, which, x):
        """x itself (no scale): nothing saturates, since |x| >= 65520 is refused before writing."""
        return np.asarray(x, np.float32)

    def layouts(self, head_size, block_size):
        nw = head_size // 2

        def one(which):
            return CacheLayout(
                method=self.id,
                which=which,
                head_size=head_size,
                fields=(LayoutField("values", "f16", 16, head_size, "token",
                                    "IEEE binary16, round to nearest even from f32 (|x| >= 65520 refused)"),),
                bytes_per_token_per_head=float(nw * 4),
                description=(f"Unquantised f16 {which}: no scale; dequantised = the half widened to f32 (exact). "
                             f"Paged [num_blocks, kv_heads, {block_size}, {nw}] u32."),
                word_map=f"words 0..{nw - 1}: 2 halves each (element 2w in bits 0..15, 2w+1 in bits 16..31)",
            )

        return one("K"), one("V")
