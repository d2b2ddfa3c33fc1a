"""TurboQuant (arXiv:2504.19874) as a kvviz method. The seed configuration (the default): 2-bit PolarQuant +
1-bit QJL keys, 2-bit PolarQuant values, in a PAGED cache: per-token records [num_blocks, kv_heads, block_size,
WK | WV] u32 written through the batch's slot mapping by the fast writer (kvviz/families/turboquant/writer.py,
shaders/turboquant/write_fast.wgsl: subgroup shuffles, tests/test_fast_write_tq.py) or, on an adapter without subgroups, the
general compressor (tq_general_compress.wgsl); both write the seed compressor's words bit for bit
(tests/test_fast_decode_tq_paged.py), so the
batch's block tables are real and the block inspector shows the physical blocks. Decode (`attend`) by the paged
fast split-K decode (kvviz/families/turboquant/decode.py plan_paged, shaders/turboquant/decode_fast_paged.wgsl + decode_tq_reduce.wgsl:
one split dispatch and one reduce for the batch). The UNMODIFIED seed kernels stay as the reference: the seed
compressor tq_compress.wgsl and flash_attention_tq.wgsl over per-sequence caches (slot = kv_head * cache_cap +
position, in regions), their own timed rows beside the fast one; the weights (tq_scores) and shapes the fast decode
cannot take (a GQA group over 16) read per-sequence caches holding the paged records' words re-laid out.

The paper's settings (options bits, v_bits, outlier_share; head sizes other than 32/64/128, up to 256) run
through the general kernels (shaders/turboquant/tq_general_*.wgsl; kvviz/families/turboquant/format.py "general
settings"): the same compressor into per-token records of the paged cache, and a dequantiser into an f32 paged
cache whose keys are the TurboQuant estimate (polar + QJL: the estimator is linear in q), attended by the f32
paged decode and weights kernels. Rotation of a head that is not a power of two: the RHT over the next power of
two, the vector zero-padded (the padded coordinates' codes are stored: the layout counts them).
"""
from __future__ import annotations

import numpy as np

from kvviz.attention import arith, prefill, records as qk
from kvviz.attention.traffic import decode_bytes
from kvviz.errors import InvalidInput, UnsupportedShape, check_finite
from kvviz.families.turboquant import decode as fdq, format as tqf, kernels as tqk, writer as fwt
from kvviz.attention.writers import device_pair
from kvviz.gpu.timed import TimedKernel
from kvviz.methods.base import CacheLayout, KVMethod, LayoutField, OptionSpec, QuantizedKV, TokenRecord, register
from kvviz.metrics import index_stats
from kvviz.paging import PAD_SLOT

F16_MIN_NORMAL = 2.0**-14  # 6.1e-5
F16_MIN_SUBNORMAL = 2.0**-24  # 6.0e-8; a norm at or below half of it is stored as f16 0


@register
class TurboQuantMethod(KVMethod):
    id = "turboquant"
    label = "TurboQuant 2-bit polar + 1-bit QJL (seed WGSL)"
    family = "turboquant"
    nominal_bits = 2.75  # mean of K (3.25) and V (2.25) bits per element at head size 128, norms included
    attend_kernel = "fast_decode_tq_paged (split-K over the paged records; flash_attention_tq is the reference)"
    weights_kernel = "tq_scores"
    device_rows_writer = True  # the seed configuration's fast writer (quantize_device; the others decline them)

    OPTIONS = (
        OptionSpec("qjl_scale", str, "reference", "scale of the QJL residual estimate: reference sqrt(pi/2)/d "
                   "(the seed kernel's) or unbiased sqrt(pi/2)/sqrt(d) (d: the rotation's size)",
                   choices=tuple(tqf.QJL_SCALES)),
        OptionSpec("seed", int, tqf.DEFAULT_SEED, "seed of the rotation's random signs (combined with the layer)",
                   minimum=0),
        OptionSpec("bits", int, 2, "bits of the keys' polar (MSE) stage; keys add the 1-bit QJL residual. 2 with "
                   "v_bits 2, no outliers and head size 32/64/128 is the seed configuration (seed kernels)",
                   choices=(1, 2, 3, 4)),
        OptionSpec("v_bits", int, 2, "bits of the values' polar stage", choices=(1, 2, 3, 4)),
        OptionSpec("outlier_share", float, 0.0, "share of each head's channels (those of largest RMS over the "
                   "tokens quantised, per KV head) quantised by a second TurboQuant instance at one more bit: "
                   "b + share bits per channel; 0.5 gives the paper's 2.5- and 3.5-bit settings from bits 2 and 3",
                   minimum=0.0, maximum=0.75),
    )
    REFERENCE = "kvviz.families.turboquant.oracle:method_attention"
    EXAMPLES = ({}, {"qjl_scale": "unbiased"}, {"bits": 1, "v_bits": 1}, {"bits": 3, "v_bits": 3},
                {"bits": 4, "v_bits": 4}, {"bits": 2, "v_bits": 2, "outlier_share": 0.5},
                {"bits": 3, "v_bits": 3, "outlier_share": 0.5}, {"bits": 1, "v_bits": 4, "qjl_scale": "unbiased"})
    # the settings the method comparison adds to the default (kvviz/report/compare_run.py): the paper's
    # 1-4 bit widths and the 2.5- / 3.5-bit outlier split, with the unbiased QJL scale
    COMPARE_SETTINGS = tuple({"bits": b, "v_bits": b, "qjl_scale": "unbiased"} for b in (1, 2, 3, 4)) + (
        {"bits": 2, "v_bits": 2, "outlier_share": 0.5, "qjl_scale": "unbiased"},
        {"bits": 3, "v_bits": 3, "outlier_share": 0.5, "qjl_scale": "unbiased"})
    qjl_scale: str
    seed: int
    bits: int
    v_bits: int
    outlier_share: float
    layer: int = 0  # the model layer quantised: its rotation signs are seeded with it (for_layer)

    def configure(self):
        self.seed_config = self.bits == 2 and self.v_bits == 2 and self.outlier_share == 0.0
        if not self.seed_config:
            share = f" + {self.outlier_share:g} outliers" if self.outlier_share else ""
            self.label = (f"TurboQuant K {self.bits}-bit polar + 1-bit QJL, V {self.v_bits}-bit{share} "
                          f"({self.bits + self.outlier_share:g}/{self.v_bits + self.outlier_share:g}-bit setting)")
            self.nominal_bits = (self.bits + 1 + self.v_bits) / 2.0 + self.outlier_share
            self.attend_kernel = "paged_attn_f32 (over the TurboQuant estimate, tq_general_dequant)"
            self.weights_kernel = "paged_attn_weights (over the TurboQuant estimate)"

    def settings(self, head_size: int) -> tqf.TQSettings:
        """The format of this method at a head size (its is_seed: the seed layout and kernels serve it)."""
        return tqf.TQSettings(int(head_size), self.bits, self.v_bits, self.outlier_share, self.seed, self.layer)

    def uses_seed(self, head_size: int) -> bool:
        return self.settings(head_size).is_seed

    def for_layer(self, layer: int) -> "TurboQuantMethod":
        """This method for model layer `layer`: the rotation's signs are those of that layer."""
        layer = int(layer)
        if layer < 0:
            raise InvalidInput(f"layer must be non-negative, got {layer}")
        if layer == self.layer:
            return self
        m = type(self)(**self.options())
        m.layer = layer
        return m

    def check(self, num_heads, num_kv_heads, head_size, block_size):
        if self.uses_seed(head_size):
            tqk.check_head_size(head_size)
        else:
            tqk.check_general_head_size(head_size)
        tqk.check_gqa(num_heads, num_kv_heads)
        if block_size <= 0:
            raise UnsupportedShape(f"block_size must be positive, got {block_size}")

    def params(self, head_size: int) -> tqf.TQParams:
        return tqf.TQParams(int(head_size), self.seed, self.layer)

    # ------------------------------------------------------------------ layout
    def layouts(self, head_size, block_size):
        if not self.uses_seed(head_size):
            return self._general_layouts(head_size, block_size)
        tqk.check_head_size(head_size)
        d = head_size
        c, b = tqf.lloyd_max_2bit(d)
        cs = ", ".join(f"{x:+.6f}" for x in c)
        wk, wv = d // 16 + d // 32 + 1, d // 16 + 1
        common = (
            f"Paged: per-token records [num_blocks, kv_heads, {block_size}, {wk} (K) | {wv} (V)] u32, written through "
            "the batch's slot mapping (fast_write_tq, or tq_general_compress without subgroups: the seed compressor's "
            "words, per token); the seed "
            "kernels' reference rows read the same words per sequence, in regions (slot = kv_head * cache_cap + "
            "position). "
            f"Rotation: RHT with seeded signs (seed {self.seed} ^ layer {self.layer}); 2-bit Lloyd-Max "
            f"centroids for d={d}: {cs}."
        )
        k = CacheLayout(
            method=self.id,
            which="K",
            head_size=d,
            fields=(
                LayoutField("polar_idx", "uint2", 2, d, "vector", "Lloyd-Max index of each RHT-rotated coordinate of k/|k|"),
                LayoutField("jl_bits", "bit", 1, d, "vector", "sign of WHT((r/|r|) * s_jl), r = residual in rotated space"),
                LayoutField("norm", "f16", 16, 1, "vector", "|k| (pack2x16float low half)"),
                LayoutField("residual_norm", "f16", 16, 1, "vector", "|r| of the unit vector (high half)"),
            ),
            bytes_per_token_per_head=tqk.TQCache.key_bytes_per_vector(d),
            description="Keys: PolarQuant (2 bits) + QJL residual signs (1 bit) + two f16 norms. " + common,
            word_map=(
                f"record words 0..{d // 16 - 1}: polar indices, element j at bits 2j (LSB first); words "
                f"{d // 16}..{d // 16 + d // 32 - 1}: QJL bits, element j at bit j; word {d // 16 + d // 32}: "
                "pack2x16float(norm, residual_norm)"
            ),
        )
        v = CacheLayout(
            method=self.id,
            which="V",
            head_size=d,
            fields=(
                LayoutField("polar_idx", "uint2", 2, d, "vector", "Lloyd-Max index of each RHT-rotated coordinate of v/|v|"),
                LayoutField("norm", "f16", 16, 1, "vector", "|v| (pack2x16float low half)"),
                LayoutField("pad", "f16", 16, 1, "vector", "high half of the norm word, always 0"),
            ),
            bytes_per_token_per_head=tqk.TQCache.value_bytes_per_vector(d),
            description="Values: PolarQuant only (2 bits) + f16 norm; reconstructed as norm * RHT^-1(c[idx]). " + common,
            word_map=(
                f"record words 0..{d // 16 - 1}: polar indices, element j at bits 2j; word {d // 16}: "
                "pack2x16float(norm, 0)"
            ),
        )
        return k, v

    # ------------------------------------------------------------------ quantise
    def _seq_rows(self, batch, s: int) -> np.ndarray:
        rows = batch.token_rows(s)
        L = int(batch.context_lens[s])
        if len(rows) != L or not np.array_equal(batch.token_pos[rows], np.arange(L)):
            raise InvalidInput(
                f"sequence {s} has {len(rows)} token rows for a context of {L}: TurboQuant compresses "
                "each sequence whole, positions 0..L-1"
            )
        return rows

    @staticmethod
    def _check_kv(batch, key, value):
        """key / value as float32 [num_tokens, kvh, d] arrays of the batch, finite, at a seed head size:
        (key, value, T, kvh, d)."""
        key = np.asarray(key)
        value = np.asarray(value)
        for name, a in (("key", key), ("value", value)):
            if a.dtype != np.float32 or a.ndim != 3:
                raise InvalidInput(f"{name} must be float32 [num_tokens, num_kv_heads, head_size], got {a.dtype} {a.shape}")
            check_finite(name, a)
        if value.shape != key.shape or key.shape[0] != batch.num_tokens:
            raise InvalidInput(f"key/value must be [{batch.num_tokens}, kvh, D]; got {key.shape} and {value.shape}")
        T, kvh, d = key.shape
        tqk.check_head_size(d)
        return key, value, T, kvh, d

    def _caches(self, ctx, batch, key, value):
        key, value, T, kvh, d = self._check_kv(batch, key, value)
        batch.validate()
        kern = tqk.TurboQuantKernels(ctx.rt)
        caches, dispatches, rows_of = [], [], []
        for s in range(batch.num_seqs):
            rows = self._seq_rows(batch, s)
            L = len(rows)
            cache = kern.allocate(kvh, d, max(L, 1), self.seed, self.layer)
            if L:
                # a run of consecutive rows is passed as a view (its upload can be shared, see
                # GpuRuntime.shared_inputs); other rows are gathered
                sel = slice(int(rows[0]), int(rows[0]) + L) if (np.diff(rows) == 1).all() else rows
                dispatches += kern.compress_dispatches(cache, key[sel], value[sel], 0)
            caches.append(cache)
            rows_of.append(rows)
        return kern, caches, dispatches, rows_of

    def _seed_paged(self, ctx, batch, key, value):
        """The seed configuration's paged writer: tq_general_compress at bits 2 / v_bits 2 (no outliers: identity
        channel tables) through the batch's slot mapping. Returns (GeneralTQCache, writer dispatches, rows of each
        sequence); every sequence's rows must be its positions 0..L-1 (the decode reads them all)."""
        key, value, T, kvh, d = self._check_kv(batch, key, value)
        sm = qk.check_batch(batch, T)
        rows_of = [self._seq_rows(batch, s) for s in range(batch.num_seqs)]
        used = np.concatenate(rows_of) if rows_of else np.zeros(0, np.int64)
        for name, a in (("keys", key), ("values", value)):
            if used.size and float(np.sqrt((a[used].astype(np.float64) ** 2).sum(-1)).max()) > tqk.F16_MAX:
                raise InvalidInput(f"a {name} vector has a norm above {tqk.F16_MAX:g}: TurboQuant stores norms as f16",
                                   "Scale the input down; f16 norms overflow to infinity.")
        st = self.settings(d)
        ident = np.tile(np.arange(d, dtype=np.uint32), (kvh, 1))
        gc = tqk.general_allocate(ctx.rt, st, batch, kvh, ident, ident)
        wd, impl = self._seed_writer(ctx, gc, key, value, sm)
        return gc, wd, rows_of, impl

    @staticmethod
    def _seed_writer(ctx, gc, key, value, sm, impl: str = "auto"):
        """(dispatches, impl) of the seed configuration's paged writer into gc: the fast writer
        (kvviz/families/turboquant/writer.py, impl "fast") where the adapter has subgroups, else (or impl "first-wave")
        tq_general_compress. Both write the same words. Inputs validated by the caller."""
        key, value = np.ascontiguousarray(key), np.ascontiguousarray(value)
        if impl != "first-wave":
            wd = fwt.dispatches(ctx.rt, gc.settings, key, value, sm, gc.qc.k, gc.qc.v, gc.qc.block_size, checked=True)
            if wd is not None:
                return wd, "fast"
        return tqk.general_compress_dispatches(ctx.rt, gc, key, value, sm), "first-wave"

    def quantize_device(self, ctx, batch, key, value):
        """KVMethod.quantize_device, for the seed configuration: the paged records alone, as prefill_plan reads them
        (no read-back, no per-sequence seed caches, no host fields). Host K/V are checked as quantize checks them;
        DeviceRows (bound in place by the fast writer) by their shape only. None for the other settings, and for
        DeviceRows where the fast writer cannot take them (no subgroups, a binding offset the adapter refuses)."""
        d = int(key.shape[-1])
        if not self.uses_seed(d):
            return None
        if device_pair(key, value, self.id):
            T, kvh, d = key.shape
            sm = qk.check_batch(batch, T)
            st = self.settings(d)
            ident = np.tile(np.arange(d, dtype=np.uint32), (kvh, 1))
            gc = tqk.general_allocate(ctx.rt, st, batch, kvh, ident, ident)
            try:
                wd = fwt.dispatches(ctx.rt, st, key, value, sm, gc.qc.k, gc.qc.v, gc.qc.block_size)
            except UnsupportedShape:
                wd = None
            if wd is None:
                return None
        else:
            gc, wd, _, _ = self._seed_paged(ctx, batch, key, value)
            kvh = int(np.shape(key)[1])
        ctx.rt.submit(wd)
        e = np.zeros(0)
        return QuantizedKV(self, d, kvh, e, e, e, e, (0, 3), device={"paged": gc})

    def quantize(self, ctx, batch, key, value):
        if not self.uses_seed(np.asarray(key).shape[-1]):
            return self._general_quantize(ctx, batch, key, value)
        gc, wd, rows_of, writer_impl = self._seed_paged(ctx, batch, key, value)
        ctx.rt.run(wd)
        T, kvh, d = np.asarray(key).shape
        p = self.params(d)
        st = gc.settings
        recs = {w: qk.token_records(qk.read_cache(ctx.rt, gc.qc, w), batch, st.wpt(w)) for w in ("K", "V")}
        dk, dv = tqf.unpack_general(recs["K"], st, "K"), tqf.unpack_general(recs["V"], st, "V")
        k_idx, v_idx, k_bits = dk.idx[0], dv.idx[0], dk.jl_bits[0]
        k_norm, k_rnorm, v_norm = dk.norm[0], dk.rnorm[0], dv.norm[0]
        # the seed kernels' per-sequence caches (tq_scores weights; the seed decode where the fast one cannot take
        # the shape) hold the same words, re-laid out in regions: uploaded, not compressed again
        kern = tqk.TurboQuantKernels(ctx.rt)
        signs = ctx.rt.upload(p.signs_buffer(), "tq_signs")
        caches, words = [], []
        for rows in rows_of:
            L = len(rows)
            kw, vw = tqf.seed_words(recs["K"][rows], recs["V"][rows], d)
            words.append((kw, vw))
            written = np.ones(max(L, 1), bool) if L else np.zeros(1, bool)
            caches.append(tqk.TQCache(kvh, d, max(L, 1), p, ctx.rt.upload(kw, "tq_k_cache"),
                                      ctx.rt.upload(vw, "tq_v_cache"), signs, written))
        used = np.concatenate(rows_of) if rows_of else np.zeros(0, np.int64)
        warnings = self.range_warnings(np.asarray(key)[used], np.asarray(value)[used], k_norm[used], v_norm[used])
        extra = {
            "k_jl_bits": k_bits,
            "k_residual_norms": k_rnorm,
            "k_dequant_polar": tqf.dequantize_polar(k_idx, k_norm, p).astype(np.float32),
            "v_dequant": tqf.dequantize_polar(v_idx, v_norm, p).astype(np.float32),
            "centroids": p.centroids,
            "boundaries": p.boundaries,
            "qjl_scale": self.qjl_scale,
            "qjl_scale_value": tqf.qjl_scale_value(self.qjl_scale, d),
            "k_records": recs["K"], "v_records": recs["V"],
            "words": words,
            "note": "k_dequant_polar is the PolarQuant part only: QJL bits estimate inner products, they do not reconstruct k.",
        }
        return QuantizedKV(
            self, d, kvh, k_idx, v_idx, k_norm, v_norm, (0, 3),
            device={"paged": gc, "cache": gc.qc, "writer": wd, "writer_impl": writer_impl, "signs": signs, "caches": caches,
                    "kernels": kern},
            extra=extra, warnings=warnings,
        )

    def code_statistics(self, ctx, qkv, batch, key, value):
        """Centroid usage of the PolarQuant indices (K and V) over the real tokens: the share of the
        centroids used, the least and most used centroid's share and the index entropy; no saturation (every
        rotated coordinate has a nearest centroid). With the outlier split the instances' indices are
        counted on the widest instance's centroid set."""
        real = np.asarray(batch.slot_mapping) != PAD_SLOT
        n = int(qkv.code_range[1]) + 1
        return tuple(index_stats(c, n, real) for c in (qkv.k_codes, qkv.v_codes))

    @staticmethod
    def range_warnings(key, value, k_norm, v_norm) -> list[str]:
        """What the compressor cannot keep, from the inputs [n, kvh, d] and the stored (f16) norms [n, kvh]:
        vectors with a norm under 1e-12 (treated as zero), under the f16 range (the norm rounds to 0) and in
        the f16 subnormal range (the norm keeps fewer bits)."""
        counts = {"eps": {}, "f16zero": {}, "subnormal": {}}
        for which, x, stored in (("K", key, k_norm), ("V", value, v_norm)):
            n = np.sqrt((np.asarray(x, np.float64) ** 2).sum(-1))
            stored = np.asarray(stored, np.float32)
            zeroed = (n > 0) & (stored == 0)
            counts["eps"][which] = int((zeroed & (n < float(tqf.EPS))).sum())
            counts["f16zero"][which] = int((zeroed & (n >= float(tqf.EPS))).sum())
            counts["subnormal"][which] = int(((stored > 0) & (stored < F16_MIN_NORMAL)).sum())
        total = 2 * int(np.asarray(k_norm).size)
        what = {
            "eps": f"have a norm below {float(tqf.EPS):g} and are stored as zero (the compressor treats them as "
                   "zero vectors)",
            "f16zero": f"have a norm below the f16 range (at or under {F16_MIN_SUBNORMAL / 2:.3g} the f16 norm rounds "
                       "to 0) and are stored as zero",
            "subnormal": f"have a norm in the f16 subnormal range (< {F16_MIN_NORMAL:.3g}): the stored norm keeps "
                         "fewer than 11 significant bits",
        }
        out = []
        for kind, c in counts.items():
            if sum(c.values()):
                out.append(f"turboquant: {sum(c.values())} of {total} vectors (K {c['K']}, V {c['V']}) {what[kind]}")
        return out

    # ------------------------------------------------------------------ attention
    def _check_q(self, qkv, batch, q):
        q = np.asarray(q)
        if q.dtype != np.float32 or q.ndim != 3:
            raise InvalidInput(f"q must be float32 [num_seqs, num_heads, head_size], got {q.dtype} {q.shape}")
        check_finite("q", q)
        S, H, D = q.shape
        if S != batch.num_seqs or D != qkv.head_size:
            raise InvalidInput(f"q is {q.shape}; expected [{batch.num_seqs}, num_heads, {qkv.head_size}]")
        tqk.check_gqa(H, qkv.num_kv_heads)
        if len(qkv.device["caches"]) != batch.num_seqs:
            raise InvalidInput("This TurboQuant cache was built for another batch.")
        return q

    def attend_dispatches(self, qkv, batch, q, scale):
        """Decode (one query per sequence at its last position) dispatches: [(seq, dispatches, out buffer)]."""
        kern = qkv.device["kernels"]
        out = []
        for s, cache in enumerate(qkv.device["caches"]):
            L = int(batch.context_lens[s])
            if L == 0:
                continue
            ds, buf = kern.attention_dispatches(cache, q[s : s + 1], L - 1, scale, self.qjl_scale, max_seq=L)
            out.append((s, ds, buf))
        return out

    def prefill_plan(self, ctx, qkv, batch, q, q_lens, scale, softcap=0.0):
        """The prefill over the paged records in place (turboquant/prefill.wgsl), any setting: each tile's codes, QJL
        bits and norms rotated back in workgroup memory with the dequantiser's arithmetic, then attended."""
        gc = qkv.device["paged"] if "paged" in qkv.device else qkv.device["general"]
        st = gc.settings

        def instances(which):
            out = []
            for i, ins in enumerate(st.instances(which)):
                so, co = gc.offsets[(which, i)]
                qs = tqf.qjl_scale_general(self.qjl_scale, ins.P) if which == "K" else 0.0
                out.append({"n_ch": ins.n_ch, "P": ins.P, "bits": ins.bits, "chan_off": ins.chan_off, "sign_off": so,
                            "cb_off": co, "code_off": ins.code_off, "jl_off": max(ins.jl_off, 0),
                            "norm_off": ins.norm_off, "inv": int(np.float32(tqf.inv_sqrt_d(ins.P)).view(np.uint32)),
                            "qjl": int(np.float32(qs).view(np.uint32))})
            return out

        ki, vi = instances("K"), instances("V")
        qc = gc.qc
        return ctx.prefill.plan(
            prefill.TURBOQUANT, lambda lay: prefill.render_turboquant(ki, vi, st.wpt("K"), st.wpt("V"), lay), qc.k, qc.v,
            [gc.chans_buf, gc.signs_buf, gc.codebook_buf], qc.num_kv_heads, q, batch, q_lens, scale,
            label="prefill turboquant", key_scratch=max(i["P"] for i in ki + vi),
            per_tile=lambda lay: prefill.turboquant_tile_loops(lay, ki, vi), softcap=softcap)

    def fast_plan(self, ctx, qkv, batch, q, scale, **variant):
        """The paged fast split-K decode over the seed configuration's records (kvviz/families/turboquant/decode.py
        plan_paged: one split + one reduce for the batch), or None where it cannot take the shape (the seed kernel
        then serves). `variant`: plan_paged's keywords (qk="i8", unroll, ...)."""
        H, D = np.asarray(q).shape[1:]
        lens = [int(L) for L in batch.context_lens]
        if "paged" not in qkv.device or not any(lens) or fdq.unsupported(D, H // qkv.num_kv_heads):
            return None
        qc = qkv.device["cache"]
        return fdq.TQFastDecode(ctx.rt).plan_paged(qc.k, qc.v, qkv.num_kv_heads, q, batch, scale, self.params(D),
                                                   self.qjl_scale, signs=qkv.device["signs"], **variant)

    def attend(self, ctx, qkv, batch, q, scale):
        if "general" in qkv.device:
            return ctx.paged.decode(qkv.device["f32"], q, batch, scale)
        q = self._check_q(qkv, batch, q)
        S, H, D = q.shape
        plan = self.fast_plan(ctx, qkv, batch, q, scale)
        if plan is not None:  # the fast split-K decode; the seed flash_attention_tq stays the timed reference row
            ctx.rt.run(plan.rotate + plan.dispatches)
            return ctx.rt.read(plan.out, np.float32, plan.shape)
        jobs = self.attend_dispatches(qkv, batch, q, scale)
        ctx.rt.run([d for _, ds, _ in jobs for d in ds])
        res = np.zeros((S, H, D), np.float32)
        for s, _, buf in jobs:
            res[s] = ctx.rt.read(buf, np.float32, (H, D))
        return res

    def weights_dispatches(self, qkv, batch, q, scale, mode: str = "weights"):
        kern = qkv.device["kernels"]
        out = []
        for s, cache in enumerate(qkv.device["caches"]):
            L = int(batch.context_lens[s])
            if L == 0:
                continue
            ds, buf, out_len = kern.scores_dispatches(cache, q[s : s + 1], L - 1, scale, self.qjl_scale, max_seq=L, mode=mode)
            out.append((s, ds, buf, out_len))
        return out

    def weights(self, ctx, qkv, batch, q, scale):
        if "general" in qkv.device:
            return ctx.paged.weights(qkv.device["f32"], q, batch, scale)
        q = self._check_q(qkv, batch, q)
        S, H, _ = q.shape
        jobs = self.weights_dispatches(qkv, batch, q, scale)
        ctx.rt.run([d for _, ds, _, _ in jobs for d in ds])
        res = np.zeros((S, H, max(batch.max_context_len, 1)), np.float32)
        for s, _, buf, out_len in jobs:
            res[s, :, :out_len] = ctx.rt.read(buf, np.float32, (H, out_len))
        return res

    # ------------------------------------------------------------------ inspector
    @staticmethod
    def _check_inspect(qkv, batch, block, kv_head, which):
        if not 0 <= int(block) < batch.num_blocks:
            raise InvalidInput(f"block {block} is outside the pool of {batch.num_blocks} blocks")
        if not 0 <= int(kv_head) < qkv.num_kv_heads:
            raise InvalidInput(f"kv_head {kv_head} is outside 0..{qkv.num_kv_heads - 1}")
        if which not in ("K", "V"):
            raise InvalidInput(f"which must be 'K' or 'V', got {which!r}")

    def inspect_block(self, ctx, qkv, batch, block, kv_head, which):
        if "general" in qkv.device:
            return self._general_inspect_block(ctx, qkv, batch, block, kv_head, which)
        if "paged" in qkv.device:
            return self._paged_inspect_block(ctx, qkv, batch, block, kv_head, which)
        self._check_inspect(qkv, batch, block, kv_head, which)
        d = qkv.head_size
        pw, jw = d // 16, d // 32
        owner, pos = batch.block_positions(int(block))
        dec = None
        if owner >= 0:
            cache = qkv.device["caches"][owner]
            kw, vw = qkv.device["kernels"].read(cache)  # what sits in GPU memory now
            dec = tqf.decode_cache(kw, vw, qkv.num_kv_heads, cache.cache_cap, d)
        records = []
        for o in range(batch.block_size):
            p = int(pos[o])
            slot = int(block) * batch.block_size + o
            if p < 0 or dec is None:
                nwords = pw + jw + 1 if which == "K" else pw + 1
                zeros = np.zeros(d, np.int32)
                fields = {"polar_idx": zeros, "norm": 0.0}
                if which == "K":
                    fields.update({"jl_bits": zeros.copy(), "residual_norm": 0.0})
                records.append(TokenRecord(slot, -1, np.zeros(nwords, np.uint32), fields))
                continue
            h = int(kv_head)
            tq_slot = h * dec.k_idx.shape[1] + p
            if which == "K":
                words = np.concatenate([dec.k_polar_words[h, p], dec.k_jl_words[h, p], [dec.k_norm_words[h, p]]]).astype(np.uint32)
                fields = {
                    "polar_idx": dec.k_idx[h, p].astype(np.int32),
                    "jl_bits": dec.k_bits[h, p].astype(np.int32),
                    "norm": float(dec.k_norm[h, p]),
                    "residual_norm": float(dec.k_rnorm[h, p]),
                    "tq_slot": tq_slot,
                }
            else:
                words = np.concatenate([dec.v_polar_words[h, p], [dec.v_norm_words[h, p]]]).astype(np.uint32)
                fields = {
                    "polar_idx": dec.v_idx[h, p].astype(np.int32),
                    "norm": float(dec.v_norm[h, p]),
                    "tq_slot": tq_slot,
                }
            records.append(TokenRecord(slot, p, words, fields))
        return records

    def _paged_inspect_block(self, ctx, qkv, batch, block, kv_head, which):
        """The records of one physical block of the paged cache, as they sit in GPU memory now."""
        self._check_inspect(qkv, batch, block, kv_head, which)
        gc = qkv.device["paged"]
        st = gc.settings
        w = st.wpt(which)
        recs = qk.read_cache(ctx.rt, gc.qc, which)[int(block), int(kv_head)].reshape(batch.block_size, w)
        dec = tqf.unpack_general(recs, st, which)
        _, pos = batch.block_positions(int(block))
        out = []
        for o in range(batch.block_size):
            fields = {"polar_idx": dec.idx[0][o].astype(np.int32)}
            if which == "K":
                fields["jl_bits"] = dec.jl_bits[0][o].astype(np.int32)
                fields["residual_norm"] = float(dec.rnorm[0][o])
            fields["norm"] = float(dec.norm[0][o])
            out.append(TokenRecord(slot=int(block) * batch.block_size + o, position=int(pos[o]), words=recs[o].copy(),
                                   fields=fields))
        return out

    # ------------------------------------------------------------------ timing
    def timed_kernels(self, ctx, batch, key, value, q, scale, qkv=None):
        T, kvh, d = np.asarray(key).shape
        if not self.uses_seed(d):
            return self._general_timed_kernels(ctx, batch, key, value, q, scale, qkv)
        if qkv is None:  # the method's paged cache (its writer's dispatches, what the fast decode reads)
            qkv = self.quantize(ctx, batch, key, value)
        # the seed reference rows: the seed compressor's per-sequence caches (its timed writer row), and the seed
        # kernels over them
        kern, caches, comp, rows_of = self._caches(ctx, batch, key, value)
        ctx.rt.run(comp)
        seed_qkv = QuantizedKV(self, d, kvh, None, None, None, None, (0, 3), device={"caches": caches, "kernels": kern})
        q = self._check_q(qkv, batch, q)
        H = q.shape[1]
        attn = [d_ for _, ds, _ in self.attend_dispatches(seed_qkv, batch, q, scale) for d_ in ds]
        scores = [d_ for _, ds, _, _ in self.weights_dispatches(seed_qkv, batch, q, scale) for d_ in ds]
        ctx.rt.run(attn + scores)  # fills the rotated-query buffers the timed seed dispatches read
        rot = [x for x in attn if x.kernel.spec.entry == "tq_rotate_q"]
        seed = [x for x in attn if x.kernel.spec.entry == "flash_attention_tq"]
        sc = [x for x in scores if x.kernel.spec.entry == "tq_scores"]
        lens = [int(L) for L in batch.context_lens]
        comp_b = sum(tqk.compress_bytes(c, L) for c, L in zip(caches, lens))
        attn_b = sum(tqk.attention_bytes(c, 1, H, L) for c, L in zip(caches, lens) if L)
        sc_b = sum(tqk.scores_bytes(c, 1, H, L) for c, L in zip(caches, lens) if L)
        rot_b = sum(1 for L in lens if L) * H * d * 4 * 4
        lg = int(np.log2(d)) if d > 0 else 0
        tokens = int(sum(lens))

        real = int(np.count_nonzero(np.asarray(batch.slot_mapping) != PAD_SLOT))
        wk, wv = fdq.paged_words(d)
        paged_b = 2 * real * kvh * d * 4 + batch.num_tokens * 4 + real * kvh * (wk + wv) * 4
        return [
            # compress: per K and V vector a Walsh-Hadamard rotation (d log2 d adds), norm and codebook search (~4 d)
            TimedKernel("tq_compress (keys + values)", comp, comp_b, "writer", "seed",
                        arith.writer_flops(batch, kvh, d, lg + 4)),
            TimedKernel("tq_rotate_q", rot, rot_b, "rotate", "first-wave",
                        float(sum(1 for L in lens if L) * H * d * (lg + 1))),
            TimedKernel("flash_attention_tq (decode)", seed, attn_b, "decode", "seed", arith.decode_flops(batch, H, d)),
        ] + self._paged_writer_rows(
            ctx, qkv, batch, key, value, paged_b, arith.writer_flops(batch, kvh, d, lg + 4)
        ) + self._fast_rows(ctx, qkv, batch, q, scale) + [
            TimedKernel("tq_scores (weights)", sc, sc_b, "weights", "first-wave",
                        float(tokens * H * (2 * d + arith.SOFTMAX_PER_LOGIT))),
        ]

    def _paged_writer_rows(self, ctx, qkv, batch, key, value, nbytes, flops):
        """The paged records' writers: tq_general_compress (first-wave) and, where the adapter has subgroups, the
        fast writer (kvviz/families/turboquant/writer.py), each into a cache of its own; the method's is marked."""
        own = qkv.device.get("writer_impl", "first-wave")
        names = {"first-wave": "tq_general_compress (paged records)", "fast": "fast_write_tq (keys + values)"}
        rows = {own: (qkv.device["writer"])}
        gc = qkv.device["paged"]
        if batch.num_tokens:
            sm = qk.check_batch(batch, np.asarray(key).shape[0])
            other = "fast" if own == "first-wave" else "first-wave"
            kvh = gc.qc.num_kv_heads
            gc2 = tqk.general_allocate(ctx.rt, gc.settings, batch, kvh, gc.chans[0], gc.chans[1])
            wd, impl = self._seed_writer(ctx, gc2, key, value, sm, other)
            if impl == other:
                rows[other] = wd
        return [TimedKernel(names[i] + ("; the method's writer" if i == own == "first-wave" else ""), rows[i], nbytes,
                            "writer", i, flops)
                for i in ("first-wave", "fast") if i in rows]

    def _fast_rows(self, ctx, qkv, batch, q, scale):
        """The paged fast split-K decode's timed row (impl "fast", role "decode"; [] where it cannot take the shape)."""
        plan = self.fast_plan(ctx, qkv, batch, q, scale)
        if plan is None:
            return []
        ctx.rt.run(plan.rotate)  # the rotated query the timed split reads (timed in its own row, tq_rotate_q)
        nbytes, flops = fdq.decode_traffic_paged(batch, q.shape[1], qkv.num_kv_heads, q.shape[2], plan.num_partitions)
        return [TimedKernel(f"fast_decode_tq_paged ({plan.num_partitions} partitions)", plan.dispatches, nbytes,
                            "decode", "fast", flops)]

    # ================================================================== the paper's settings (general kernels)
    def _general_layouts(self, head_size, block_size):
        tqk.check_general_head_size(head_size)
        st = self.settings(head_size)
        d = head_size
        out = []
        for which in ("K", "V"):
            inst = st.instances(which)
            fields, words = [], []
            for i, ins in enumerate(inst):
                tag = ("outlier " if len(inst) > 1 and i == 0 else "") + f"instance {i}" if len(inst) > 1 else "vector"
                fields.append(LayoutField(f"polar_idx{i}" if len(inst) > 1 else "polar_idx", f"uint{ins.bits}", ins.bits,
                                          ins.P, "vector", f"{tag}: Lloyd-Max index ({ins.bits} bits) of each of the "
                                          f"{ins.P} RHT-rotated coordinates of its {ins.n_ch} channels / their norm"))
                if which == "K":
                    fields.append(LayoutField(f"jl_bits{i}" if len(inst) > 1 else "jl_bits", "bit", 1, ins.P, "vector",
                                              "sign of WHT((r/|r|) * s_jl), r = residual in rotated space"))
                fields.append(LayoutField(f"norm{i}" if len(inst) > 1 else "norm", "f16", 16, 1, "vector", "|x| of the channels"))
                fields.append(LayoutField(f"residual_norm{i}" if len(inst) > 1 else "residual_norm", "f16", 16, 1, "vector",
                                          "|r| of the unit vector" if which == "K" else "high half of the norm word, 0"))
                words.append(
                    f"instance {i} ({ins.n_ch} channels, P={ins.P}, {ins.bits} bits): codes words "
                    f"{ins.code_off}..{ins.code_off + ins.code_words - 1} (index j at bits {ins.bits}j.., LSB first, "
                    f"across words)" + (f"; jl words {ins.jl_off}..{ins.jl_off + ins.P // 32 - 1} (element j at bit j)"
                                        if which == "K" else "") + f"; word {ins.norm_off}: pack2x16float(norm, "
                    + ("residual_norm)" if which == "K" else "0)"))
            pad = [f"{ins.n_ch} -> {ins.P}" for ins in inst if ins.P != ins.n_ch]
            pad_bits = sum((ins.P - ins.n_ch) * (ins.bits + (1 if which == "K" else 0)) for ins in inst) / d
            split = (f"Outlier split: the {inst[0].n_ch} channels of largest RMS over the tokens quantised (per KV "
                     f"head) at {inst[0].bits} bits, the other {inst[1].n_ch} at {inst[1].bits}: each set its own "
                     "instance (norm, rotation, codebook" + (", QJL" if which == "K" else "") + "). ") if len(inst) > 1 else ""
            padding = (f"Rotation padded to a power of two ({', '.join(pad)} coordinates, zeros appended): the "
                       f"padded coordinates' codes cost {pad_bits:.2f} extra bits per element. ") if pad else ""
            what = ("Keys: PolarQuant + 1-bit QJL residual signs + f16 norms; attended as the dequantised "
                    "estimate n*RHT^-1(c[idx] + rn*qjl_scale*J^T(2*bits-1)) through the f32 paged decode. "
                    if which == "K" else "Values: PolarQuant + f16 norm; reconstructed as n*RHT^-1(c[idx]). ")
            out.append(CacheLayout(
                method=self.id, which=which, head_size=d, fields=tuple(fields),
                bytes_per_token_per_head=float(st.wpt(which) * 4),
                description=(what + split + padding +
                             f"Polar bits per channel {st.polar_bits(which):g}. Paged [num_blocks, kv_heads, "
                             f"{block_size}, {st.wpt(which)}] u32 (the general kernels, tq_general_*.wgsl). Rotation: "
                             f"RHT with seeded signs (seed {self.seed} ^ layer {self.layer}; instance 1: a derived seed)."),
                word_map="; ".join(words),
            ))
        return out[0], out[1]

    def _general_build(self, ctx, batch, key, value):
        key = np.asarray(key)
        value = np.asarray(value)
        for name, a in (("key", key), ("value", value)):
            if a.dtype != np.float32 or a.ndim != 3:
                raise InvalidInput(f"{name} must be float32 [num_tokens, num_kv_heads, head_size], got {a.dtype} {a.shape}")
            check_finite(name, a)
        if value.shape != key.shape:
            raise InvalidInput(f"key and value shapes differ: {key.shape} vs {value.shape}")
        T, kvh, d = key.shape
        self.check(kvh, kvh, d, batch.block_size)
        sm = qk.check_batch(batch, T)
        real = sm != PAD_SLOT
        st = self.settings(d)
        for name, a in (("keys", key), ("values", value)):
            if T and float(np.sqrt((a[real].astype(np.float64) ** 2).sum(-1)).max(initial=0)) > tqk.F16_MAX:
                raise InvalidInput(f"a {name} vector has a norm above {tqk.F16_MAX:g}: TurboQuant stores norms as f16",
                                   "Scale the input down; f16 norms overflow to infinity.")
        ck = tqf.choose_channels(key[real], st.n_outliers)
        cv = tqf.choose_channels(value[real], st.n_outliers)
        gc = tqk.general_allocate(ctx.rt, st, batch, kvh, ck, cv)
        f32c = qk.alloc_f32(ctx, batch, kvh, d)
        wd = tqk.general_compress_dispatches(ctx.rt, gc, np.ascontiguousarray(key), np.ascontiguousarray(value), sm)
        dd = tqk.general_dequant_dispatches(ctx, gc, f32c, batch, self.qjl_scale)
        return key, value, sm, st, gc, f32c, wd, dd

    def _general_quantize(self, ctx, batch, key, value):
        key, value, sm, st, gc, f32c, wd, dd = self._general_build(ctx, batch, key, value)
        ctx.rt.run(wd + dd)
        T, kvh, d = key.shape
        recs = {w: qk.token_records(qk.read_cache(ctx.rt, gc.qc, w), batch, st.wpt(w)) for w in ("K", "V")}
        dec = {w: tqf.unpack_general(recs[w], st, w) for w in ("K", "V")}
        real = sm != PAD_SLOT

        def norms(w):
            n = np.stack(dec[w].norm, -1)  # [T, kvh, instances]
            return n[..., 0] if n.shape[-1] == 1 else n

        warnings = []
        n_inst = len(st.instances("K"))
        for i in range(n_inst):
            subs = []
            for w, x in (("K", key), ("V", value)):
                ins = st.instances(w)[i]
                ch = gc.chans[0 if w == "K" else 1][:, ins.chan_off:ins.chan_off + ins.n_ch].astype(np.int64)
                subs.append(np.stack([x[:, h, ch[h]] for h in range(kvh)], 1)[real])
            got = self.range_warnings(subs[0], subs[1], dec["K"].norm[i][real], dec["V"].norm[i][real])
            tag = f" (instance {i}: {st.instances('K')[i].n_ch} channels)" if n_inst > 1 else ""
            warnings += [g.replace("turboquant:", f"turboquant{tag}:") for g in got]
        extra = {
            "settings": st,
            "channels": (gc.chans[0], gc.chans[1]),
            "k_records": recs["K"], "v_records": recs["V"],
            "k_fields": dec["K"], "v_fields": dec["V"],
            "qjl_scale": self.qjl_scale,
            "note": "general settings: the f32 cache holds the keys' TurboQuant estimate (polar + QJL) and the "
                    "values' PolarQuant reconstruction, read back in read_f32",
        }
        cr = (0, (1 << max(i.bits for w in ("K", "V") for i in st.instances(w))) - 1)
        return QuantizedKV(
            self, d, kvh, np.concatenate(dec["K"].idx, -1), np.concatenate(dec["V"].idx, -1), norms("K"), norms("V"),
            cr, device={"general": gc, "cache": gc.qc, "f32": f32c, "writer": wd, "dequant": dd}, extra=extra,
            warnings=warnings,
        )

    def read_f32(self, ctx, qkv, which: str) -> np.ndarray:
        """General settings: the dequantised f32 paged cache [num_blocks, kv_heads, block_size, head_size]."""
        return ctx.paged.read(qkv.device["f32"], "k" if which == "K" else "v")

    def _general_inspect_block(self, ctx, qkv, batch, block, kv_head, which):
        if which not in ("K", "V"):
            raise InvalidInput(f"which must be 'K' or 'V', got {which!r}")
        gc, st = qkv.device["general"], qkv.extra["settings"]
        w = st.wpt(which)
        full = qk.read_cache(ctx.rt, gc.qc, which)
        recs = full[int(block), int(kv_head)].reshape(batch.block_size, w)
        dec = tqf.unpack_general(recs, st, which)
        pos = batch.block_positions(block)[1]
        chans = gc.chans[0 if which == "K" else 1][int(kv_head)]
        out = []
        for o in range(batch.block_size):
            fields = {}
            for i, ins in enumerate(st.instances(which)):
                sfx = str(i) if len(dec.idx) > 1 else ""
                fields[f"polar_idx{sfx}"] = dec.idx[i][o].astype(np.int32)
                if which == "K":
                    fields[f"jl_bits{sfx}"] = dec.jl_bits[i][o].astype(np.int32)
                    fields[f"residual_norm{sfx}"] = float(dec.rnorm[i][o])
                fields[f"norm{sfx}"] = float(dec.norm[i][o])
                if len(dec.idx) > 1:
                    fields[f"channels{sfx}"] = chans[ins.chan_off:ins.chan_off + ins.n_ch].astype(np.int32)
            out.append(TokenRecord(slot=int(block) * batch.block_size + o, position=int(pos[o]), words=recs[o].copy(),
                                   fields=fields))
        return out

    def _general_timed_kernels(self, ctx, batch, key, value, q, scale, qkv=None):
        if qkv is not None:
            st, f32c, wd, dd = qkv.extra["settings"], qkv.device["f32"], qkv.device["writer"], qkv.device["dequant"]
        else:
            key, value, sm, st, gc, f32c, wd, dd = self._general_build(ctx, batch, key, value)
            ctx.rt.run(wd + dd)
        kvh, d = np.asarray(key).shape[1], np.asarray(key).shape[2]
        real = int(np.count_nonzero(batch.slot_mapping != PAD_SLOT))
        words = st.wpt("K") + st.wpt("V")
        w_bytes = 2 * real * kvh * d * 4 + batch.num_tokens * 4 + real * kvh * words * 4
        nblk = sum(len(b) for b in batch.seq_blocks)
        d_bytes = nblk * kvh * batch.block_size * (words + 2 * d) * 4
        dec, _ = ctx.paged.decode_dispatches(f32c, q, batch, scale)
        lg = int(np.ceil(np.log2(max(d, 1))))
        return [
            # compress: a padded Walsh-Hadamard rotation (d log2 d adds), norm and codebook search (~4 d) per vector;
            # dequantise: the inverse rotation and the scale (d log2 d + d)
            TimedKernel("tq_general_compress (keys + values)", wd, int(w_bytes), "writer", "first-wave",
                        arith.writer_flops(batch, kvh, d, lg + 4)),
            TimedKernel("tq_general_dequant (estimate -> f32 cache)", dd, int(d_bytes), "dequantise", "first-wave",
                        arith.dequant_flops(batch, kvh, d, lg + 1)),
            TimedKernel("paged_attn_f32 (over the TurboQuant estimate)", dec, decode_bytes(f32c, batch, q), "decode",
                        "first-wave", arith.decode_flops(batch, np.asarray(q).shape[1], d)),
        ]
