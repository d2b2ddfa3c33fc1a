"""nvfp4: NVIDIA's FP4 KV cache: E2M1 codes, an FP8 E4M3 scale per 16 elements, an f32 scale per tensor.

The per-tensor scale is calibrated from the K / V seen, as engines calibrate: s_t = max(amax / 2688,
2^-126) with amax over every real token row and KV head of the batch (K and V separately), computed on
the GPU (fp8/amax.wgsl, then the writer; K and V are uploaded once for both passes). Each 16
consecutive elements of a token's head vector share E4M3(max|x/s_t| / 6); codes are E2M1 of
x / s_t / e4m3, round to nearest even (a tie takes the even code: 0.25 -> 0, 0.75 -> 1, 2.5 -> 2, 5 -> 4),
saturating at 6; dequantised = e2m1 * e4m3 * s_t (kvviz/families/fp4/oracle.py).
Head sizes: multiples of 16 (64, 80, 96, 112, 128, 256 ...). 4.5 bits per element (+ 32 bits per tensor).
The MXFP4 block type (E8M0 scale per 32) is kvviz/families/ggml/method.py's `mxfp4`, bit-identical to gguf.
Shaders: the writer fp4/nvfp4_write_fast.wgsl after the fast amax pass (kvviz/families/ggml/writer.py;
writer_impl "first-wave": fp4/nvfp4_write.wgsl, the same words; timed_kernels times both),
fp4/nvfp4_dequant.wgsl. Attention: the fast split-K decode over the packed cache
(kvviz/families/fp4/decode.py, shaders/fp4/decode_fast.wgsl) where it takes the shape (head sizes
16..256, GQA 1..16); otherwise the first-wave path, the dequantised f32 cache through the f32 paged decode
(quant_common.DequantisedAttention). timed_kernels lists both.
"""
from __future__ import annotations

import numpy as np

from kvviz.attention import prefill
from kvviz.families.fp4 import decode as ffd, format as f4, kernels as f4k, writer as fw4
from kvviz.families.fp8 import kernels as fp8_kernels
from kvviz.families.ggml import kernels as gk
from kvviz.methods.base import CacheLayout, LayoutField, register
from kvviz.methods.records import PerTokenRecordMethod, SiblingFastAttention
from kvviz.metrics import scaled_codes


def _e4m3(codes) -> np.ndarray:
    import ml_dtypes  # here, not at start-up: loading it registers every ufunc loop it adds, one by one

    return np.asarray(codes, np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32)


@register
class NvFp4(SiblingFastAttention, PerTokenRecordMethod):
    id = "nvfp4"
    label = "NVFP4 (E2M1, E4M3 per 16, f32 per tensor)"
    family = "fp4"
    nominal_bits = 4.5
    head_multiple = f4.SUB
    head_multiple_why = "an E4M3 scale covers 16 elements"
    code_range = (-6.0, 6.0)
    attend_kernel = "fast/decode_fp4 + decode_reduce over the packed cache (or paged_attn_f32 over the dequantised cache)"
    REFERENCE = "kvviz.families.fp4.oracle:reference_attention"
    device_rows_writer = True

    def wpt(self, head_size):
        return f4.words_per_token(head_size)

    def writer_spec(self):
        return f4k.NVFP4_WRITE

    def dequant_spec(self):
        return f4k.NVFP4_DEQUANT

    def _tensor_buffer(self, ctx):
        # [amax K, amax V, s_t K, s_t V] as u32 bits; zeroed (atomicMax starts from 0)
        return ctx.rt.upload(np.zeros(4, np.uint32), "nvfp4_tensor_scales")

    def writer_dispatches(self, ctx, qc, key, value, sm):
        rt = ctx.rt
        kvh, D = key.shape[1], key.shape[2]
        amax = rt.compile(fp8_kernels.FP8_AMAX)
        kern = rt.compile(self.writer_spec())
        imm = kern.pack(kvh, D, qc.block_size, self.wpt(D))
        tb = qc.extra["tensor"]
        return gk.shared_token_dispatches(rt, [(amax, [tb]), (kern, [qc.k, qc.v, tb])], key, value, sm, imm)

    def fast_writer(self, rt, qc, key, value, sm, variant=None):
        """The fast writer (kvviz/families/fp4/writer.py: the fast amax pass, then shaders/fp4/
        nvfp4_write_fast.wgsl; the same words as fp4/nvfp4_write.wgsl)."""
        return fw4.nvfp4_dispatches(rt, key, value, sm, qc.k, qc.v, qc.extra["tensor"], qc.block_size)

    # ------------------------------------------------------------------ attention
    def _fast_plan(self, ctx, qc, batch, q, scale):
        """The fast NVFP4 decode's plan over the packed cache `qc` and its tensor scales
        (kvviz/families/fp4/decode.py), or None where it cannot take the shape (fast_decode_fp4.unsupported)."""
        kvh, D = qc.num_kv_heads, qc.head_size
        shape = np.shape(q)
        if len(shape) != 3 or shape[2] != D or not shape[1] or shape[1] % kvh or ffd.unsupported(D, shape[1] // kvh):
            return None
        return ffd.Fp4FastDecode(ctx.rt).plan(qc.k, qc.v, qc.extra["tensor"], kvh, q, batch, scale)

    def prefill_plan(self, ctx, qkv, batch, q, q_lens, scale, softcap=0.0):
        """The prefill over the NVFP4 records in place (fp4/prefill.wgsl: each value by the dequantiser's own element
        function, fp4/nvfp4_value.wgsl, times the tensor scale)."""
        qc = qkv.device["cache"]
        wpt = self.wpt(qkv.head_size)
        return ctx.prefill.plan(prefill.NVFP4, {"WPT": str(wpt)}, qc.k, qc.v, [qc.extra["tensor"]], qc.num_kv_heads, q,
                                batch, q_lens, scale, label="prefill nvfp4", record_words=wpt, softcap=softcap)

    def _fast_traffic(self, batch, plan, qc):
        return ffd.decode_traffic(batch, plan.shape[1], qc.num_kv_heads, qc.head_size, plan.num_partitions)

    def tensor_scales(self, ctx, qkv) -> tuple[float, float]:
        """(K, V) tensor scales s_t, read from the GPU."""
        t = ctx.rt.read(qkv.device["cache"].extra["tensor"], np.uint32, nbytes=16)
        s = t[2:4].view(np.float32)
        return float(s[0]), float(s[1])

    def unpack(self, records, head_size):
        codes, sc = f4.unpack_records(records, head_size)
        e4 = _e4m3(sc)
        # "scale": e4m3 here; quantize and inspect_block multiply in the tensor scale
        return {"codes": f4.E2M1_VALUES[codes], "code_bits": codes, "scale": e4, "scale_e4m3": e4, "scale_bits": sc}

    def quantize(self, ctx, batch, key, value):
        qkv = super().quantize(ctx, batch, key, value)
        ks, vs = self.tensor_scales(ctx, qkv)
        qkv.extra["tensor_scales"] = (ks, vs)
        # the scale of each 16 elements as applied: e4m3 * s_t
        qkv.k_scales = (qkv.extra["k_fields"]["scale_e4m3"] * np.float32(ks)).astype(np.float32)
        qkv.v_scales = (qkv.extra["v_fields"]["scale_e4m3"] * np.float32(vs)).astype(np.float32)
        return qkv

    def code_values(self):
        """The 15 E2M1 values in order (the histogram's code-index axis)."""
        return np.unique(np.asarray(f4.E2M1_VALUES, np.float64))

    def unrounded_codes(self, qkv, which, x):
        """x / (e4m3 scale * tensor scale) per 16 elements: beyond +-6 saturates (an e4m3 scale rounded
        down from amax/6 can put a group's largest value there)."""
        return scaled_codes(x, qkv.k_scales if which == "K" else qkv.v_scales)

    def range_warnings(self, key, value, real, fields):
        out = []
        for which, x in (("K", key), ("V", value)):
            xs = x[real]
            if xs.size == 0:
                continue
            amax = np.abs(xs.reshape(*xs.shape[:-1], -1, f4.SUB)).max(-1)
            n = int(((fields[which]["scale_bits"][real] == 0) & (amax > 0)).sum())
            if n:
                out.append(f"nvfp4: {n} nonzero 16-element group(s) of {which} are below E4M3's range relative to the "
                           "tensor's amax (scale 0): they dequantise to zero.")
        return out

    def inspect_block(self, ctx, qkv, batch, block, kv_head, which):
        recs = super().inspect_block(ctx, qkv, batch, block, kv_head, which)
        s = self.tensor_scales(ctx, qkv)[0 if which == "K" else 1]
        for r in recs:
            r.fields["tensor_scale"] = s
            r.fields["scale"] = (np.asarray(r.fields["scale_e4m3"], np.float32) * np.float32(s)).astype(np.float32)
        return recs

    def token_scales(self, qkv, kv_head, n):
        k, v, _ = super().token_scales(qkv, kv_head, n)
        return k, v, "mean e4m3 * s_t over the token's 16-element groups"

    def layouts(self, head_size, block_size):
        ns = head_size // f4.SUB
        sw = f4.scale_words(head_size)
        w = self.wpt(head_size)
        fields = (
            LayoutField("scale", "fp8_e4m3fn", 8, ns, "group", "E4M3(max|x/s_t|/6) per 16 elements, RNE, saturating"),
            LayoutField("codes", "fp4_e2m1", 4, head_size, "token", "E2M1(x/s_t/e4m3), RNE, saturating"),
            LayoutField("s_t", "f32", 32, 1, "tensor", "max(amax/2688, 2^-126), one for K, one for V"),
        )

        def one(which):
            return CacheLayout(
                method=self.id,
                which=which,
                head_size=head_size,
                fields=fields,
                bytes_per_token_per_head=float(4 * w),
                description=(
                    f"NVFP4: E2M1 codes, an E4M3 scale per 16 elements ({ns} a token), an f32 scale per tensor "
                    f"calibrated from the batch's amax; dequantised e2m1*e4m3*s_t. Paged [num_blocks, kv_heads, "
                    f"{block_size}, {w}] u32. The tensor scale (4 bytes for K, 4 for V) is not counted per token."
                ),
                word_map=f"words 0..{sw - 1}: E4M3 scale bytes (byte s = elements 16s..16s+15); words {sw}..{w - 1}: "
                "codes, 2 words a 16-element group (byte i: element 16s+i low nibble, 16s+8+i high nibble); "
                "tensor buffer: [amaxK, amaxV, s_tK, s_tV] f32 bits",
            )

        return one("K"), one("V")
