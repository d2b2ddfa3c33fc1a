"""llama.cpp KV-cache block types (`--cache-type-k/-v`): q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl, and mxfp4.

Each quantises blocks of 32 consecutive elements of a token's head vector with an f16 scale (and an
f16 min for q4_1 / q5_1; an E8M0 exponent for mxfp4), stored byte for byte as ggml lays the block out
(kvviz/families/ggml/format.py: 34, 18, 20, 22, 24, 18 and 17 bytes per 32 elements); a token's record is its
ggml row padded to whole u32 words. Codes and scales are bit-identical to gguf.quants.quantize (iq4_nl:
to llama.cpp's reference algorithm, unfused; kvviz/families/ggml/oracle.py), and the dequantised cache to
gguf.quants.dequantize. Head sizes must be multiples of 32, as in llama.cpp.

Ties, as ggml breaks them: q8_0 rounds x/d half away from zero (roundf); q4_0 / q5_0 / q4_1 / q5_1
truncate x*id + 8.5 (16.5, 0.5), so a value halfway between two codes takes the upper code; iq4_nl takes
the upper of two equally near values; mxfp4 takes the first of gguf's E2M1 table in order (0, 1, 2, 3,
4, 6, 8, 12, then the negatives): the smaller magnitude. tests/test_ggml_formats.py drives every tie.

Documented departures and limits (kvviz/families/ggml/oracle.py has the detail):
  * blocks with max |x| < 2^-100 take the codes of a zero-scale block (their f16 scale is 0 anyway);
  * an f16 scale (or q4_1 / q5_1 min) that would round to inf (|d| >= 65520, e.g. a q8_0 block with
    max |x| >= 65520 * 127 = 8.3e6) is refused with InvalidInput before dispatch, never stored as inf
    (check_values, on the rows given to the writer, padding rows included; live decode's appends too):
    q8_0..q5_1 compute the scale on the host exactly as ggml does; iq4_nl, whose scale comes out of its
    search (about amax/113 .. amax/127), refuses max |x| >= 65504 * 100 = 6.6e6 and quantize also checks
    the scales it stored; mxfp4's E8M0 scale covers every finite float32.
Shaders: the writer ggml/write_fast.wgsl (kvviz/families/ggml/writer.py; writer_impl "first-wave":
ggml/write.wgsl, the same bytes; timed_kernels times both), ggml/dequant.wgsl. Attention: the fast split-K decode over the packed
cache (kvviz/families/ggml/decode.py, shaders/ggml/decode_fast.wgsl) where it takes the type and shape;
otherwise the dequantised f32 cache through the f32 paged decode (quant_common.DequantisedAttention).
timed_kernels lists both.
"""
from __future__ import annotations

import numpy as np

from kvviz.attention import prefill, records as qk
from kvviz.errors import InvalidInput
from kvviz.families.ggml import decode as fdg, format as fg, kernels as gk, writer as fwg
from kvviz.families.ggml.format import MXFP4_VALUES
from kvviz.methods.base import CacheLayout, LayoutField, register
from kvviz.methods.records import PerTokenRecordMethod, SiblingFastAttention
from kvviz.paging import PAD_SLOT

F16_INF_FROM = np.float32(65520.0)  # the smallest float32 that rounds to an f16 inf (ties to even)

_FORMULA = {
    "q8_0": ("d = amax/127, q = roundf(x/d) (half away from zero, through id = 1/d)", "x = d*q"),
    "q4_0": ("d = max/-8 (max: the element of largest |x|), q = min(15, trunc(x*id + 8.5))", "x = d*(q-8)"),
    "q4_1": ("d = (max-min)/15, m = min, q = min(15, trunc((x-m)*id + 0.5))", "x = d*q + m"),
    "q5_0": ("d = max/-16, q = min(31, trunc(x*id + 16.5))", "x = d*(q-16)"),
    "q5_1": ("d = (max-min)/31, m = min, q = min(31, trunc((x-m)*id + 0.5))", "x = d*q + m"),
    "iq4_nl": ("d from llama.cpp's 15-step scale search, q = the nearest of the 16 iq4_nl values", "x = d*values[q]"),
    "mxfp4": ("e = floor(log2 amax) + 125 (E8M0), q = the nearest E2M1 value of x/2^(e-127)", "x = 2^(e-127)*e2m1[q]"),
}


class GgmlBlockMethod(SiblingFastAttention, PerTokenRecordMethod):
    """A llama.cpp block type; subclasses set `id` and `type_name`."""

    family = "ggml"
    type_name = ""
    device_rows_writer = True
    attend_kernel = "fast/decode_ggml + decode_reduce over the packed cache (or paged_attn_f32 over the dequantised cache)"
    REFERENCE = "kvviz.families.ggml.oracle:reference_attention"
    head_multiple = fg.BLOCK
    head_multiple_why = "llama.cpp block types quantise blocks of 32 elements"

    @property
    def head_multiple_elsewhere(self) -> str:
        # llama.cpp's llama_init_from_model (src/llama-context.cpp), with its default flash-attention setting
        return (f"llama.cpp itself refuses such a model's {self.type_name} cache: it creates no context (\"K cache type "
                f"{self.type_name} with block size {fg.BLOCK} does not divide n_embd_head_k\"), neither padding the head "
                "nor taking another type; there f16 serves the model, here f16, the FP8, int8 and KIVI methods do.")

    @property
    def fmt(self) -> fg.GgmlType:
        return fg.TYPES[self.type_name]

    def configure(self):
        t = self.fmt
        self.nominal_bits = t.bits_per_element
        if t.name == "q8_0":
            self.code_range = (-127, 127)
        elif t.name == "mxfp4":
            self.code_range = (-6.0, 6.0)
        else:
            self.code_range = (0, (1 << t.bits) - 1)

    def code_values(self):
        """mxfp4: the 15 E2M1 values in order (the histogram's code-index axis); integer codes otherwise."""
        if self.fmt.name != "mxfp4":
            return None

        return np.unique(np.asarray(MXFP4_VALUES, np.float64) / 2)  # gguf's table holds E2M1 doubled

    # ------------------------------------------------------------------ kernels
    def wpt(self, head_size):
        return self.fmt.words_per_token(head_size)

    def writer_spec(self):
        return gk.write_spec(self.fmt)

    def dequant_spec(self):
        return gk.dequant_spec(self.fmt)

    def writer_dispatches(self, ctx, qc, key, value, sm):
        kern = ctx.rt.compile(self.writer_spec())
        kvh, D = key.shape[1], key.shape[2]
        imm = kern.pack(kvh, D, qc.block_size, self.wpt(D), 0)
        return qk.token_dispatches(ctx.rt, kern, key, value, sm, [qc.k, qc.v], lambda n: imm)

    def fast_writer(self, rt, qc, key, value, sm, variant=None):
        """The fast writer (kvviz/families/ggml/writer.py, shaders/ggml/write_fast.wgsl: a lane a few whole
        blocks, words built in registers; the same bytes)."""
        return fwg.ggml_dispatches(rt, self.type_name, key, value, sm, qc.k, qc.v, qc.block_size)

    # ------------------------------------------------------------------ attention
    def _fast_plan(self, ctx, qc, batch, q, scale):
        """The fast ggml decode's plan over the packed cache `qc` (kvviz/families/ggml/decode.py), or None
        where it cannot take the type or shape (fast_decode_ggml.unsupported)."""
        kvh, D = qc.num_kv_heads, qc.head_size
        shape = np.shape(q)
        if len(shape) != 3 or shape[2] != D or not shape[1] or shape[1] % kvh or fdg.unsupported(self.type_name, D, shape[1] // kvh):
            return None
        return fdg.GgmlFastDecode(ctx.rt).plan(self.type_name, qc.k, qc.v, kvh, q, batch, scale)

    def prefill_plan(self, ctx, qkv, batch, q, q_lens, scale, softcap=0.0):
        """The prefill over the block-type rows in place (ggml/prefill.wgsl: each value by the dequantiser's own
        element function, ggml/value.wgsl)."""
        qc = qkv.device["cache"]
        t = self.fmt
        wpt = t.words_per_token(qkv.head_size)
        defines = {k: str(v) for k, v in t.defines().items() if k != "LOG2_UP"}
        return ctx.prefill.plan(prefill.GGML, {**defines, "WPT": str(wpt)}, qc.k, qc.v, [], qc.num_kv_heads, q, batch,
                                q_lens, scale, label=f"prefill {t.name}", record_words=wpt, softcap=softcap)

    def _fast_traffic(self, batch, plan, qc):
        return fdg.decode_traffic(self.type_name, batch, plan.shape[1], qc.num_kv_heads, qc.head_size, plan.num_partitions)

    # ------------------------------------------------------------------ checks
    def check_values(self, key, value):
        """The writer's rows (the batch path and live decode's appends both come through here)."""
        for name, x in (("key", key), ("value", value)):
            self._check_f16_range(name, x)

    def _check_f16_range(self, name: str, x: np.ndarray) -> None:
        """Refuse rows whose f16 scale (or min) would be inf: the scale computed as ggml computes it
        (iq4_nl: refused from max |x| >= 65504 * 100, above which its searched scale, about amax/113 ..
        amax/127, could reach the f16 limit; quantize also checks the scales it stored)."""
        t = self.fmt
        if t.name == "mxfp4" or x.size == 0:
            return
        b = x.reshape(-1, fg.BLOCK)
        with np.errstate(over="ignore"):
            if t.name == "q8_0":
                d = np.abs(b).max(-1) / np.float32(127)
            elif t.name == "iq4_nl":
                d = np.abs(b).max(-1) / np.float32(100)
            elif t.name in ("q4_0", "q5_0"):
                d = np.abs(b).max(-1) / np.float32(8 if t.name == "q4_0" else 16)
            else:
                mn, mx = b.min(-1), b.max(-1)
                d = np.maximum((mx - mn).astype(np.float32) / np.float32(15 if t.name == "q4_1" else 31), np.abs(mn))
        d = np.asarray(d, np.float32)
        if (d >= F16_INF_FROM).any():
            i = int(np.argmax(d))
            raise InvalidInput(
                f"{self.id}: a 32-element block of the {name} (max |x| {float(np.abs(b[i]).max()):.4g}) needs an f16 "
                f"scale{' or min' if t.has_min else ''} of {float(d[i]):.4g}, beyond the f16 range (65504): llama.cpp "
                "would store inf.",
                f"Scale the input down (the largest |x| {self.id} stores is about {self._largest():.3g}), or use a "
                "float32-scale method (int8_token, fp8_*).",
            )

    def _largest(self) -> float:
        return {"q8_0": 65504 * 127, "q4_0": 65504 * 8, "q5_0": 65504 * 16, "q4_1": 65504.0, "q5_1": 65504.0,
                "iq4_nl": 65504 * 100}[self.type_name]

    # ------------------------------------------------------------------ fields
    def unpack(self, records, head_size):
        f = fg.unpack_rows(fg.records_to_rows(records, head_size, self.fmt), head_size, self.fmt)
        if self.type_name == "mxfp4":
            f["code_bits"] = f["codes"]
            f["codes"] = np.asarray(fg.MXFP4_VALUES, np.float32)[f["codes"]] * np.float32(0.5)
        return f

    def quantize(self, ctx, batch, key, value):
        qkv = super().quantize(ctx, batch, key, value)
        if self.fmt.has_min:
            qkv.extra["k_mins"] = qkv.extra["k_fields"]["min"]
            qkv.extra["v_mins"] = qkv.extra["v_fields"]["min"]
        if self.type_name == "iq4_nl":
            real = batch.slot_mapping != PAD_SLOT
            for which, s in (("key", qkv.k_scales), ("value", qkv.v_scales)):
                bad = ~np.isfinite(s[real])
                if bad.any():
                    raise InvalidInput(
                        f"iq4_nl: {int(bad.sum())} block(s) of the {which} got a scale beyond the f16 range (65504): "
                        "llama.cpp would store inf.",
                        "Scale the input down (iq4_nl stores |x| up to about 7e6), or use a float32-scale method.",
                    )
        return qkv

    def range_warnings(self, key, value, real, fields):
        out = []
        for which, x in (("K", key), ("V", value)):
            xs = x[real]
            if xs.size == 0:
                continue
            amax = np.abs(xs.reshape(*xs.shape[:-1], -1, fg.BLOCK)).max(-1)
            sc = fields[which]["scale"][real]
            n = int(((sc == 0) & (amax > 0)).sum())
            if n:
                out.append(f"{self.id}: {n} nonzero 32-element block(s) of {which} have a zero scale "
                           f"({'E8M0 below 2^-100' if self.type_name == 'mxfp4' else 'f16 underflow'}): they "
                           "dequantise to zero.")
        return out

    def token_scales(self, qkv, kv_head, n):
        """Mean |d| over the token's 32-element blocks (q4_0 / q5_0 / iq4_nl scales carry the sign of the
        block's extreme element)."""
        out = []
        for arr in (qkv.k_scales, qkv.v_scales):
            a = np.abs(np.asarray(arr, np.float64)[:n, kv_head]).reshape(n, -1)
            out.append(a.mean(-1))
        what = "2^(e-127)" if self.type_name == "mxfp4" else "|d| (f16)"
        return out[0], out[1], f"mean {what} over the token's 32-element blocks"

    # ------------------------------------------------------------------ layout
    def layouts(self, head_size, block_size):
        t = self.fmt
        nb = head_size // fg.BLOCK
        w = self.wpt(head_size)
        quant, deq = _FORMULA[t.name]
        if t.name == "mxfp4":
            fields = [LayoutField("e", "e8m0", 8, nb, "group", "shared exponent of 32 elements: scale 2^(e-127)"),
                      LayoutField("codes", "fp4_e2m1", 4, head_size, "token", quant)]
        else:
            fields = [LayoutField("d", "f16", 16, nb, "group", "block scale, f16 round to nearest even")]
            if t.has_min:
                fields.append(LayoutField("m", "f16", 16, nb, "group", "block minimum, f16"))
            if t.qh:
                fields.append(LayoutField("qh", "bit", 1, head_size, "token", "bit 4 of each code, one u32 a block"))
            dtype = {"q8_0": "int8", "iq4_nl": "uint4 (index)"}.get(t.name, "uint4")
            fields.append(LayoutField("qs", dtype, 8 if t.name == "q8_0" else 4, head_size, "token", quant))
        parts = {"q8_0": "d f16 | qs int8[32]", "q4_0": "d f16 | qs u8[16]", "q4_1": "d f16 | m f16 | qs u8[16]",
                 "q5_0": "d f16 | qh u32 | qs u8[16]", "q5_1": "d f16 | m f16 | qh u32 | qs u8[16]",
                 "iq4_nl": "d f16 | qs u8[16]", "mxfp4": "e u8 | qs u8[16]"}[t.name]
        nib = "" if t.name == "q8_0" else " (qs byte j: element j in the low nibble, element j+16 in the high)"
        pad = 4 * w - t.row_bytes(head_size)

        def one(which):
            return CacheLayout(
                method=self.id,
                which=which,
                head_size=head_size,
                fields=tuple(fields),
                bytes_per_token_per_head=float(4 * w),
                description=(
                    f"llama.cpp {t.name}: {nb} block(s) of 32 elements a token, {t.block_bytes} bytes each as ggml "
                    f"lays them out ({parts}){nib}; {quant}; dequantised {deq}. Bit-identical to gguf.quants. "
                    f"Paged [num_blocks, kv_heads, {block_size}, {w}] u32"
                    + (f" ({pad} zero padding byte(s) a token)." if pad else ".")
                ),
                word_map=f"bytes 0..{t.row_bytes(head_size) - 1} of a token's {w} words (byte 4w+l = byte l of word w, "
                f"little-endian): block b at bytes {t.block_bytes}b..{t.block_bytes}b+{t.block_bytes - 1}: {parts}",
            )

        return one("K"), one("V")


def _make(type_name: str, label: str):
    cls = type(f"Ggml_{type_name}", (GgmlBlockMethod,), {"id": type_name, "type_name": type_name, "label": label,
                                                         "__doc__": f"llama.cpp {type_name} KV cache.",
                                                         "__module__": __name__})
    return register(cls)


Q8_0 = _make("q8_0", "llama.cpp q8_0 (8.5 bits)")
Q4_0 = _make("q4_0", "llama.cpp q4_0 (4.5 bits)")
Q4_1 = _make("q4_1", "llama.cpp q4_1 (5 bits)")
Q5_0 = _make("q5_0", "llama.cpp q5_0 (5.5 bits)")
Q5_1 = _make("q5_1", "llama.cpp q5_1 (6 bits)")
IQ4_NL = _make("iq4_nl", "llama.cpp iq4_nl (4.5 bits)")
MXFP4 = _make("mxfp4", "MXFP4 (OCP, 4.25 bits)")
