"""The seed int8 method: symmetric per-token int8 (seeds 000 and 001), with its native paged decode."""
from __future__ import annotations

import numpy as np

from kvviz.attention import arith, prefill
from kvviz.attention.int8_records import unpack_records as unpack_int8_words
from kvviz.attention.paged import check_head_size
from kvviz.attention.split_decode import INT8, fast_decode_rows
from kvviz.attention.traffic import decode_bytes, writer_bytes
from kvviz.families.int8 import kernels as int8_kernels
from kvviz.gpu.timed import TimedKernel
from kvviz.methods.base import CacheLayout, KVMethod, LayoutField, QuantizedKV, TokenRecord, register
from kvviz.methods.live_cache import MethodPagedCache
from kvviz.metrics import scaled_codes
from kvviz.paging import PAD_SLOT


def read_token_records(ctx, cache, batch, which):
    """Host copy of every token row's record [tokens, kvh, wpt] (zeros for padding rows)."""
    full = ctx.paged.read(cache, "k" if which == "K" else "v")
    sm = batch.slot_mapping.astype(np.int64)
    real = sm != PAD_SLOT
    out = np.zeros((len(sm),) + full.shape[1:2] + full.shape[3:], dtype=full.dtype)
    out[real] = full[sm[real] // batch.block_size, :, sm[real] % batch.block_size, :]
    return out, full


@register
class Int8PerTokenSeed(KVMethod):
    id = "int8_seed"
    label = "int8 per token (seed GLSL)"
    family = "int8"
    nominal_bits = 8.0
    attend_kernel = "paged_attn_q8"
    weights_kernel = "paged_attn_weights (q8)"
    REFERENCE = "kvviz.families.int8.oracle:int8_seed_attention"

    def check(self, num_heads, num_kv_heads, head_size, block_size):
        check_head_size("q8", head_size)

    def layouts(self, head_size, block_size):
        def one(which):
            return CacheLayout(
                method=self.id,
                which=which,
                head_size=head_size,
                fields=(
                    LayoutField("codes", "int8", 8, head_size, "token", "symmetric, clamp [-127, 127]"),
                    LayoutField("scale", "f32", 32, 1, "token", "amax / 127 (1.0 for a zero vector)"),
                ),
                bytes_per_token_per_head=(head_size // 4 + 1) * 4,
                description="Per-token symmetric int8: code = clamp(round(x * 127/amax), -127, 127).",
                word_map=f"words 0..{head_size // 4 - 1}: 4 codes each (lane l = byte l, LE); word {head_size // 4}: f32 scale bits",
            )

        return one("K"), one("V")

    def quantize(self, ctx, batch, key, value):
        cache = ctx.paged.allocate("q8", batch.num_blocks, key.shape[1], batch.block_size, key.shape[2])
        w = ctx.paged.write_dispatches(cache, key, value, batch.slot_mapping)
        ctx.paged.rt.run(w)
        return self.read_back(ctx, cache, batch, w)

    def read_back(self, ctx, cache, batch, writer=None) -> QuantizedKV:
        """The QuantizedKV of a q8 paged cache as the device holds it: every token row's codes and scale read back
        (what the prefill's and the decode's oracles attend over: the seed writer's rounding may differ from the
        numpy quantiser's at ties, kvviz/families/prefill_oracles.py)."""
        k_rec, _ = read_token_records(ctx, cache, batch, "K")
        v_rec, _ = read_token_records(ctx, cache, batch, "V")
        kc, ks = unpack_int8_words(k_rec)
        vc, vs = unpack_int8_words(v_rec)
        return QuantizedKV(self, cache.head_size, cache.num_kv_heads, kc, vc, ks, vs, (-127, 127),
                           device={"cache": cache, "writer": writer})

    def unrounded_codes(self, qkv, which, x):
        """x / scale (scale = amax/127 per token: saturation 0 by construction)."""
        return scaled_codes(x, qkv.k_scales if which == "K" else qkv.v_scales)

    def dequantised_rows(self, ctx, qkv, batch, which):
        """code * scale, as paged_attn_q8 reads the cache (pad rows 0)."""
        c, s = (qkv.k_codes, qkv.k_scales) if which == "K" else (qkv.v_codes, qkv.v_scales)
        return (np.asarray(c, np.float32) * np.asarray(s, np.float32)[..., None]).astype(np.float32)

    def attend(self, ctx, qkv, batch, q, scale):
        return ctx.paged.decode(qkv.device["cache"], q, batch, scale)

    def weights(self, ctx, qkv, batch, q, scale):
        return ctx.paged.weights(qkv.device["cache"], q, batch, scale)

    def inspect_block(self, ctx, qkv, batch, block, kv_head, which):
        cache = qkv.device["cache"]
        full = ctx.paged.read(cache, "k" if which == "K" else "v")
        recs = full[block, kv_head]  # [block_size, wpt]
        codes, scales = unpack_int8_words(recs)
        pos = batch.block_positions(block)[1]
        return [
            TokenRecord(
                slot=block * batch.block_size + o,
                position=int(pos[o]),
                words=recs[o].copy(),
                fields={"codes": codes[o].astype(np.int32), "scale": float(scales[o])},
            )
            for o in range(batch.block_size)
        ]

    # ------------------------------------------------------------------ live decode
    @property
    def has_live_cache(self) -> bool:
        # the live cache runs the seed writer itself: a subclass that changes quantize() re-quantises
        return type(self).quantize is Int8PerTokenSeed.quantize

    def live_cache(self, ctx, table, n_layers, n_heads, n_kv_heads, head_size, scale):
        """The seed int8 writer + native paged decode, token by token (kvviz/methods/live_cache.py)."""
        if not self.has_live_cache:
            return None

        return MethodPagedCache(ctx, table, n_layers, n_heads, n_kv_heads, head_size, scale, method=self, fmt="q8",
                                label="int8 per token (seed GLSL), native paged decode",
                                scales_note="the f32 scale word of each int8 token record, read from the GPU cache")

    def paged_qkv(self, cache) -> QuantizedKV:
        """A QuantizedKV over one q8 PagedCache (what inspect_block reads), without host copies."""
        e = np.zeros(0)
        return QuantizedKV(self, cache.head_size, cache.num_kv_heads, e, e, e, e, (-127, 127), device={"cache": cache})

    def prefill_plan(self, ctx, qkv, batch, q, q_lens, scale, softcap=0.0):
        """The prefill over the seed writer's records in place (the int8 record format)."""
        cache = qkv.device["cache"]
        return prefill.plan_records(ctx.prefill, prefill.INT8, cache.k, cache.v, cache.num_kv_heads, q, batch, q_lens,
                                    scale, softcap=softcap)

    def fast_cache_format(self, head_size):
        return INT8  # the fast decode reads the seed writer's cache as is: a drop-in for paged_attn_q8

    def record_scales(self, records: np.ndarray) -> np.ndarray:
        """The f32 scale of each int8 token record [..., wpt] u32."""
        return unpack_int8_words(records)[1]

    def timed_kernels(self, ctx, batch, key, value, q, scale, qkv=None):
        if qkv is not None:  # the writer quantize ran, over its cache
            cache, w = qkv.device["cache"], qkv.device["writer"]
        else:
            cache = ctx.paged.allocate("q8", batch.num_blocks, key.shape[1], batch.block_size, key.shape[2])
            w = ctx.paged.write_dispatches(cache, key, value, batch.slot_mapping)
            ctx.paged.rt.run(w)
        d, _ = ctx.paged.decode_dispatches(cache, q, batch, scale)

        kvh, D, H = cache.num_kv_heads, cache.head_size, np.asarray(q).shape[1]
        out = [
            TimedKernel("reshape_and_cache_q8", w, writer_bytes(cache, batch, key), "writer", "seed",
                        arith.writer_flops(batch, kvh, D, arith.WRITER_PER_ELEMENT["int8"])),
            TimedKernel("paged_attn_q8", d, decode_bytes(cache, batch, q), "decode", "seed", arith.decode_flops(batch, H, D)),
        ]
        out += self.fast_writer_rows(ctx, cache, batch, key, value)
        return out + fast_decode_rows(ctx, self, cache.k, cache.v, cache.num_kv_heads, batch, q, scale)

    def fast_writer_rows(self, ctx, cache, batch, key, value) -> list:
        """The fast writer of the seed layout (kvviz/attention/writers.py int8_dispatches(seed=True): the seed
        writer's bytes) as a timed row, into a cache of its own; [] where that cache exceeds one binding."""
        if not batch.num_tokens or cache.nbytes > ctx.rt.max_binding:
            return []
        fc = ctx.paged.allocate("q8", cache.num_blocks, cache.num_kv_heads, cache.block_size, cache.head_size)
        d = int8_kernels.int8_dispatches(ctx.rt, key, value, batch.slot_mapping, fc.k, fc.v, cache.block_size, seed=True)
        flops = arith.writer_flops(batch, cache.num_kv_heads, cache.head_size, arith.WRITER_PER_ELEMENT["int8"])
        return [TimedKernel("reshape_and_cache_q8 (fast, seed layout)", d, writer_bytes(cache, batch, key), "writer", "fast",
                            flops)]
