"""int4_group: asymmetric 4-bit per group of G consecutive elements of a token's head vector.

Seed 002's INT4 made real: 8 codes per u32 word, scale and zero in their own words (the seed wrote
zero points over other groups' scales). Option group_size G in {32, 64, 128}; at a head size G does not
divide (80, 112, 120, ...) the method uses the largest multiple of 8 below G that divides the head size and
leaves at most 8 groups (80 and 112: 16; 120: 24 at G=32), see `group_for`. scale = (max-min)/15, zero = min, code = clamp(round((x-min)/scale), 0, 15); a group with
max - min < 2^-100 (constant, all zero) is degenerate: scale 0, codes 0, dequantised exactly to min.
Shaders: int4/write.wgsl, int4/dequant.wgsl. Oracle: kvviz/families/int4/oracle.py.
"""
from __future__ import annotations

import numpy as np

from kvviz.attention import records as qk
from kvviz.attention.split_decode import int4_format
from kvviz.errors import UnsupportedShape
from kvviz.families.int4 import format as asym, kernels as int4_kernels
from kvviz.methods.base import CacheLayout, LayoutField, OptionSpec, register
from kvviz.methods.records import PerTokenRecordMethod
from kvviz.metrics import scaled_codes

GROUP_SIZES = (32, 64, 128)


@register
class Int4Group(PerTokenRecordMethod):
    id = "int4_group"
    label = "int4 per group (asymmetric)"
    family = "int4"
    nominal_bits = 4.0
    head_multiple = 8
    head_multiple_why = "8 codes are packed per 32-bit word"
    code_range = (0, 15)
    device_rows_writer = True
    OPTIONS = (
        OptionSpec("group_size", int, 32, "consecutive elements of a token's head vector sharing one scale and "
                   "zero; at a head size it does not divide, the largest multiple of 8 below it that divides the "
                   "head size into at most 8 groups (head 80 or 112: 16, head 120: 24 at 32; 40 at 64)",
                   choices=GROUP_SIZES),
    )
    REFERENCE = "kvviz.families.int4.oracle:method_attention"
    group_size: int

    def configure(self):
        self.label = f"int4 per group G={self.group_size}"
        self._fallback = ""  # what check() found at its head size when group_size does not divide it

    def fallback_note(self, head_size: int) -> str:
        """Why groups of another size are used at this head size ("" when group_size divides it)."""
        g = self.group_for(head_size)
        if not g or g == self.group_size:
            return ""
        return (f"int4_group: group_size {self.group_size} does not divide head size {head_size}: groups of {g} "
                f"elements are used ({head_size // g} a token)")

    def options(self) -> dict:
        """The options as the method runs them: at a head size group_size does not divide (after check), the group
        actually used."""
        opts = super().options()
        if self._fallback:
            opts["group_size"] = self._group_used
        return opts

    def group_for(self, head_size: int) -> int:
        """The group at this head size: group_size when it divides it, else the largest multiple of 8 below
        group_size that divides the head size into at most 8 groups (the writer keeps 8 groups' scales in
        workgroup memory; 8 codes a word never straddle a group); 0 when there is none."""
        D, G = int(head_size), self.group_size
        if D > 0 and D % G == 0:
            return G
        for g in range(G - 8, 7, -8):
            if D % g == 0 and D // g <= 8:
                return g
        return 0

    def check(self, num_heads, num_kv_heads, head_size, block_size):
        super().check(num_heads, num_kv_heads, head_size, block_size)
        if not self.group_for(head_size):
            raise UnsupportedShape(
                f"int4_group: no group of at most {self.group_size} elements (a multiple of 8, at most 8 groups a "
                f"token) divides head_size {head_size}; "
                f"{qk.nearest_head_sizes(head_size, lambda d: d % 8 == 0 and self.group_for(d) > 0)}.",
                "Use a head size that is a multiple of 8 with a divisor in 16..128 giving at most 8 groups.",
            )
        # the label and options say the group this head size runs with (the last head size checked)
        self._fallback = self.fallback_note(head_size)
        self._group_used = self.group_for(head_size)
        self.label = (f"int4 per group G={self._group_used} ({self.group_size} does not divide head {head_size})"
                      if self._fallback else f"int4 per group G={self.group_size}")

    def check_values(self, key, value):
        qk.check_magnitude("key", key)
        qk.check_magnitude("value", value)

    def wpt(self, head_size):
        return head_size // 8 + 2 * (head_size // self.group_for(head_size))

    def fast_writer(self, rt, qc, key, value, sm, variant=None):
        g = self.group_for(key.shape[2])
        if not g or g % 8:
            return None
        return int4_kernels.int4_dispatches(rt, g, key, value, sm, qc.k, qc.v, qc.block_size, variant=variant)

    def fast_cache_format(self, head_size):
        return int4_format(self.group_for(head_size))

    def writer_spec(self, head_size: int | None = None):
        return int4_kernels.INT4_WRITE.define(GROUP=self.group_for(head_size) if head_size else self.group_size)

    def dequant_spec(self, head_size: int | None = None):
        return int4_kernels.INT4_DEQUANT.define(GROUP=self.group_for(head_size) if head_size else self.group_size)

    def writer_dispatches(self, ctx, qc, key, value, sm):
        kvh, D = key.shape[1], key.shape[2]
        kern = ctx.rt.compile(self.writer_spec(D))
        imm = kern.pack(kvh, D, qc.block_size, self.wpt(D))
        return qk.token_dispatches(ctx.rt, kern, key, value, sm, [qc.k, qc.v], lambda n: imm)

    def dequant_dispatches(self, ctx, qc, f32c, batch):
        D = qc.head_size
        kern = ctx.rt.compile(self.dequant_spec(D))
        return qk.dequant_dispatches(ctx, kern, [qc.k, qc.v], f32c, batch,
                                     lambda w0: kern.pack(qc.num_kv_heads, D, qc.block_size, self.wpt(D), w0))

    def unpack(self, records, head_size):
        codes, scales, zeros = asym.unpack_records(records, head_size, self.group_for(head_size))
        return {"codes": codes.astype(int), "scale": scales, "zero": zeros}

    def quantize(self, ctx, batch, key, value):
        qkv = super().quantize(ctx, batch, key, value)
        qkv.extra["k_zeros"] = qkv.extra["k_fields"]["zero"]
        qkv.extra["v_zeros"] = qkv.extra["v_fields"]["zero"]
        note = self.fallback_note(qkv.head_size)
        if note:
            qkv.warnings.insert(0, note)
        return qkv

    def unrounded_codes(self, qkv, which, x):
        """(x - min) / scale per group: 0..15 by construction (min-max asymmetric), so saturation is 0."""
        z = qkv.extra["k_zeros" if which == "K" else "v_zeros"]
        s = qkv.k_scales if which == "K" else qkv.v_scales
        zz = np.repeat(np.asarray(z, np.float32), np.asarray(x).shape[-1] // np.asarray(z).shape[-1], axis=-1)
        return scaled_codes(np.asarray(x, np.float32) - zz, s)

    def layouts(self, head_size, block_size):
        G = self.group_for(head_size) or self.group_size
        ng = head_size // G
        nw = head_size // 8

        def one(which):
            return CacheLayout(
                method=self.id,
                which=which,
                head_size=head_size,
                fields=(
                    LayoutField("codes", "uint4", 4, head_size, "token", "clamp(round((x-min)/scale), 0, 15)"),
                    LayoutField("scale", "f32", 32, ng, "group", f"(max-min)/15 per group of {G}; 0 if degenerate"),
                    LayoutField("zero", "f32", 32, ng, "group", "group minimum: x^ = code*scale + zero"),
                ),
                bytes_per_token_per_head=float(self.wpt(head_size) * 4),
                description=(
                    f"Asymmetric int4 per group of {G} consecutive elements of a token's head vector"
                    + (f" (group_size {self.group_size} does not divide {head_size}: the largest multiple of 8 below "
                       "it that does, at most 8 groups)" if G != self.group_size else "") + "; "
                    f"{ng} group(s) a token. Degenerate groups (max-min < 2^-100) store scale 0 and "
                    f"dequantise to min exactly. Paged [num_blocks, kv_heads, {block_size}, {self.wpt(head_size)}] u32."
                ),
                word_map=f"words 0..{nw - 1}: 8 uint4 codes each (element 8w+l in bits 4l..4l+3); "
                f"words {nw}+2g / {nw}+2g+1 (g = 0..{ng - 1}): f32 scale / f32 zero (min) of group g",
            )

        return one("K"), one("V")
