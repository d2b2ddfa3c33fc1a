"""int8_token: the seed WGSL quantiser's per-token int8, made real (valid WGSL, 4 codes a word, paged).

scale = max(amax/127, 1e-8), code = clamp(round(x/scale), -128, 127): the seed's asymmetric clamp,
unlike the seed GLSL writer (clamp [-127, 127], reciprocal multiply). -128 is never produced in
practice (see kvviz/families/int8/oracle.py). Shaders: int8/write.wgsl, int8/dequant.wgsl.
"""
from __future__ import annotations

import numpy as np

from kvviz.attention import int8_records as fmt8
from kvviz.attention.split_decode import INT8
from kvviz.families.int8 import kernels as int8_kernels
from kvviz.methods.base import CacheLayout, LayoutField, register
from kvviz.methods.records import PerTokenRecordMethod
from kvviz.metrics import scaled_codes


@register
class Int8PerToken(PerTokenRecordMethod):
    id = "int8_token"
    label = "int8 per token (WGSL)"
    family = "int8"
    nominal_bits = 8.0
    code_range = (-128, 127)
    device_rows_writer = True
    REFERENCE = "kvviz.families.int8.oracle:int8_token_attention"

    def wpt(self, head_size):
        return head_size // 4 + 1

    def writer_spec(self):
        return int8_kernels.INT8_WRITE

    def dequant_spec(self):
        return int8_kernels.INT8_DEQUANT

    def fast_writer(self, rt, qc, key, value, sm, variant=None):
        return int8_kernels.int8_dispatches(rt, key, value, sm, qc.k, qc.v, qc.block_size, variant=variant)

    def fast_cache_format(self, head_size):
        return INT8  # the seed int8 record layout: 4 codes a word, then the f32 scale

    def unpack(self, records, head_size):
        codes, scales = fmt8.unpack_records(records)
        return {"codes": codes.astype(np.int32), "scale": scales}

    def range_warnings(self, key, value, real, fields):
        """The 1e-8 scale floor (the seed WGSL quantiser's, kept bit-exact with the WGSL writer and the oracle): a nonzero
        vector with amax <= 0.5e-8 gets all-zero codes, one with amax/127 < 1e-8 fewer than 127 levels."""
        zero, coarse = {}, {}
        for which, x in (("K", key), ("V", value)):
            amax = np.abs(np.asarray(x, np.float32)[real]).max(-1)  # [rows, kvh]
            floored = (amax > 0) & ((amax / fmt8.QMAX).astype(np.float32) < fmt8.SCALE_FLOOR)
            allzero = floored & ~np.asarray(fields[which]["codes"])[real].any(-1)
            zero[which], coarse[which] = int(allzero.sum()), int((floored & ~allzero).sum())
        total = 2 * int(np.count_nonzero(real)) * key.shape[1]
        floor = f"{float(fmt8.SCALE_FLOOR):.0e}".replace("e-0", "e-")  # "1e-8"
        lim = f"{127 * float(fmt8.SCALE_FLOOR):.3g}".replace("e-0", "e-")  # "1.27e-6"
        out = []
        if sum(zero.values()):
            out.append(
                f"int8_token: {sum(zero.values())} of {total} token vectors (K {zero['K']}, V {zero['V']}) are "
                f"nonzero but quantise to all-zero codes: their amax is below half the scale floor {floor} "
                f"(scale = max(amax/127, {floor})), so the cache holds zeros for them (int8_seed keeps such values)")
        if sum(coarse.values()):
            out.append(
                f"int8_token: {sum(coarse.values())} of {total} token vectors (K {coarse['K']}, V {coarse['V']}) "
                f"have amax/127 below the scale floor {floor} (amax < {lim}): "
                f"they are quantised with fewer code levels (largest |code| = round(amax/{floor}) < 127)")
        return out

    def unrounded_codes(self, qkv, which, x):
        """x / scale: with scale = amax/127 per token nothing lies beyond 127 (saturation 0) unless the
        scale floor applies."""
        return scaled_codes(x, qkv.k_scales if which == "K" else qkv.v_scales)

    def layouts(self, head_size, block_size):
        nw = head_size // 4

        def one(which):
            return CacheLayout(
                method=self.id,
                which=which,
                head_size=head_size,
                fields=(
                    LayoutField("codes", "int8", 8, head_size, "token",
                                "clamp(round(x/scale), -128, 127); -128 unreachable in practice"),
                    LayoutField("scale", "f32", 32, 1, "token", "max(amax/127, 1e-8)"),
                ),
                bytes_per_token_per_head=float((nw + 1) * 4),
                description=(
                    "Per-token int8: scale = max(amax/127, 1e-8), code = clamp(round(x/scale), "
                    "-128, 127) with a correctly rounded division; dequantised = code*scale. Paged "
                    f"[num_blocks, kv_heads, {block_size}, {nw + 1}] u32."
                ),
                word_map=f"words 0..{nw - 1}: 4 int8 codes each (element 4w+l in byte l, LE, two's complement); "
                f"word {nw}: f32 scale bits",
            )

        return one("K"), one("V")
