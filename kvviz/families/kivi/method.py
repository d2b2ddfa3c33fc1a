"""kivi: KIVI-style paged KV cache (arXiv:2402.02750): keys per channel over groups of 32 tokens,
values per token, asymmetric 2 or 4 bits, the most recent tokens of each sequence in float32.

Options: bits in {2, 4}; recent R >= 0 (default 128); context_len (default 4096): the sequence length
the layout's bytes/bits accounting assumes (`layouts_for_batch` accounts a concrete batch exactly).
Which tokens are quantised, the group -> block mapping and the buffers: kvviz/families/kivi/format.py.
Shaders: kivi/write_tok.wgsl (values + residual rows), kivi/write_kgroup.wgsl (key groups),
kivi/dequant.wgsl (-> f32 PagedCache for the f32 decode / weights).

Head sizes that are not a multiple of 16 (120, ...): the head is padded to the next multiple of 16 on the
host (keys with zero channels: per-channel groups of zeros are exact; values by repeating channel 0: the
token's min and max, so its codes, are unchanged), the kernels run at the padded size, and the padding is
dropped again (queries padded with zeros, outputs and host copies cut back). The padded channels' codes
and side words are stored: the layout counts them.

Writer order inside one compute pass: the token kernel (every row: V codes or residual copy) and the
key-group kernel (one workgroup per (complete group, kv head), reading the group's 32 rows gathered
on the host and locating its side words through the block table) touch disjoint words.
"""
from __future__ import annotations

import logging

import numpy as np

from kvviz.attention import arith, prefill, records as qk
from kvviz.attention.traffic import decode_bytes
from kvviz.errors import InvalidInput, UnsupportedShape
from kvviz.families.int4.format import unpack_codes
from kvviz.families.kivi import decode as fdk, format as layout, kernels as kivi_kernels
from kvviz.families.kivi.live_cache import KiviLiveCache
from kvviz.gpu.runtime import Dispatch
from kvviz.gpu.timed import TimedKernel
from kvviz.methods.base import CacheLayout, KVMethod, LayoutField, OptionSpec, QuantizedKV, TokenRecord, register
from kvviz.methods.records import DequantisedAttention
from kvviz.metrics import Statistic, code_stats, levels_used
from kvviz.paging import PAD_SLOT

log = logging.getLogger("kvviz.families.kivi.method")

BITS = (2, 4)
GROUP = layout.GROUP


@register
class Kivi(DequantisedAttention, KVMethod):
    id = "kivi"
    label = "KIVI (K per channel, V per token)"
    family = "kivi"
    nominal_bits = 2.0
    attend_kernel = "fast/decode_kivi + decode_reduce over the packed cache (or paged_attn_f32 over the dequantised cache)"
    OPTIONS = (
        OptionSpec("bits", int, 2, "bits of every quantised K and V code (16 2-bit or 8 4-bit codes a word: a head size "
                   "that is not a multiple of 16, e.g. 120, runs padded to the next one, K with zero channels, V "
                   "with channel 0 repeated, so the codes are unchanged and the padding is counted)", choices=BITS),
        OptionSpec("recent", int, 128, "the most recent tokens of each sequence kept in float32 (rounded up to "
                   "whole 32-token key groups)", minimum=0),
        OptionSpec("context_len", int, 4096, "the sequence length the layout's bytes and bits per element assume "
                   "(residual rows amortised over it); a concrete batch is accounted exactly by "
                   "layouts_for_batch", minimum=1),
    )
    REFERENCE = "kvviz.families.kivi.oracle:method_attention"
    EXAMPLES = ({"bits": 2, "recent": 0}, {"bits": 4, "recent": 16}, {"bits": 2, "recent": 128})
    bits: int
    recent: int
    context_len: int
    # The writer quantize() runs: "fast" (shaders/fast/write_kivi_*.wgsl) or "first-wave" (shaders/quant/
    # kivi_write_*.wgsl); timed_kernels times both side by side.
    writer_impl: str = "fast"

    def configure(self):
        self.nominal_bits = float(self.bits)
        self.label = f"KIVI {self.bits}-bit (K per channel/32 tok, V per token, recent {self.recent} f32)"

    @property
    def levels(self) -> int:
        return (1 << self.bits) - 1

    # ------------------------------------------------------------------ shapes and layout
    @staticmethod
    def padded_head(head_size: int) -> int:
        """The head size the kernels run at: the next multiple of 16 (16 2-bit codes a word, D*bs/16 side
        words a block for any block size)."""
        return -(-int(head_size) // 16) * 16

    def check(self, num_heads, num_kv_heads, head_size, block_size):
        qk.check_common_shape(num_heads, num_kv_heads, head_size, block_size, 1, "")
        qk.check_common_shape(num_heads, num_kv_heads, self.padded_head(head_size), block_size, 16,
                              f"KIVI runs head {head_size} padded to {self.padded_head(head_size)}")

    def _pad(self, key, value):
        """K/V padded to padded_head channels: zeros for K, channel 0 repeated for V."""
        D = key.shape[-1]
        extra = self.padded_head(D) - D
        if not extra:
            return key, value
        key = np.concatenate([key, np.zeros(key.shape[:-1] + (extra,), np.float32)], -1)
        value = np.concatenate([value, np.repeat(value[..., :1], extra, -1)], -1)
        return np.ascontiguousarray(key), np.ascontiguousarray(value)

    @staticmethod
    def _pad_q(q, Dp: int):
        q = np.asarray(q, np.float32)
        if q.shape[-1] == Dp:
            return q
        return np.ascontiguousarray(np.concatenate([q, np.zeros(q.shape[:-1] + (Dp - q.shape[-1],), np.float32)], -1))

    def attend(self, ctx, qkv, batch, q, scale):
        """The fast split-K decode over the packed cache (kvviz/families/kivi/decode.py) where it takes the
        shape; otherwise the first-wave path: the f32 paged decode over the dequantised cache."""
        qc = qkv.device["cache"]
        qp = self._pad_q(q, qc.head_size)
        plan = self._fast_plan(ctx, qc, batch, qp, scale)
        if plan is not None:
            ctx.rt.run(plan.dispatches)
            return ctx.rt.read(plan.out, np.float32, plan.shape)[..., : qkv.head_size]
        return DequantisedAttention.attend(self, ctx, qkv, batch, qp, scale)[..., : qkv.head_size]

    def prefill_plan(self, ctx, qkv, batch, q, q_lens, scale, softcap=0.0):
        """The prefill over the packed cache in place (kivi/prefill.wgsl: each value by the dequantiser's own element
        function, kivi/value.wgsl: key groups, value records, the f32 window), the query padded to the kernels' head
        size and the output cut back."""
        qc = qkv.device["cache"]
        Dp, bs = qc.head_size, batch.block_size
        seq_plan = qc.extra["plan"]
        bt_off = qc.extra.get("bt_off", 4 * len(seq_plan.context_lens))
        mbs = qc.extra.get("mbs", batch.block_tables.shape[1])
        defines = {"BITS": str(self.bits), "KSTRIDE": str(layout.k_stride(Dp, bs, self.bits))}
        plan = ctx.prefill.plan(prefill.KIVI, defines, qc.k, qc.v, [qc.extra["res"], qc.extra["info"]], qc.num_kv_heads,
                                self._pad_q(q, Dp), batch, q_lens, scale, label=f"prefill kivi {self.bits}-bit",
                                block_tables=qc.extra["info"], bt_off=bt_off, max_blocks=mbs, softcap=softcap)
        plan.head_size = qkv.head_size
        return plan

    def _fast_plan(self, ctx, qc, batch, qp, scale, **variant):
        """The fast KIVI decode's plan over the cache `qc` (qp: the query padded to its head size), or None
        where it cannot take the shape (fast_decode_kivi.unsupported: head size, GQA group, block size).
        `variant`: the plan's keywords (qk="i8", unroll, ...)."""
        H = np.shape(qp)[1] if np.ndim(qp) == 3 else 0
        kvh = qc.num_kv_heads
        if not H or H % kvh or fdk.unsupported(self.bits, qc.head_size, H // kvh, batch.block_size):
            return None
        return fdk.KiviFastDecode(ctx.rt).plan(self.bits, qc.k, qc.v, qc.extra["res"], kvh, qp, batch, scale,
                                               seq_plan=qc.extra["plan"], info=qc.extra["info"], **variant)

    def fast_plan(self, ctx, qkv, batch, q, scale, **variant):
        """The fast decode's plan over the method's cache (q padded to the kernels' head size; the plan's output is at
        that size), or None where it cannot take the shape. `variant`: the plan's keywords (qk="i8", unroll, ...)."""
        qc = qkv.device["cache"]
        return self._fast_plan(ctx, qc, batch, self._pad_q(q, qc.head_size), scale, **variant)

    def _fast_rows(self, ctx, qc, batch, q, scale):
        """The fast KIVI decode's timed row (impl "fast", role "decode"; [] where it cannot take the shape)."""
        plan = self._fast_plan(ctx, qc, batch, q, scale)
        if plan is None:
            return []
        nbytes, flops = fdk.decode_traffic(batch, qc.extra["plan"], self.bits, q.shape[1], qc.num_kv_heads, qc.head_size,
                                           plan.num_partitions)
        return [TimedKernel(f"fast_decode_kivi ({plan.num_partitions} partitions)", plan.dispatches, nbytes, "decode",
                            "fast", flops)]

    def weights(self, ctx, qkv, batch, q, scale):
        return DequantisedAttention.weights(self, ctx, qkv, batch, self._pad_q(q, qkv.device["cache"].head_size), scale)

    def read_f32(self, ctx, qkv, which: str) -> np.ndarray:
        return DequantisedAttention.read_f32(self, ctx, qkv, which)[..., : qkv.head_size]

    # ------------------------------------------------------------------ live decode (kvviz/families/kivi/live_cache.py)
    @property
    def has_live_cache(self) -> bool:
        return True

    def live_cache(self, ctx, table, n_layers, n_heads, n_kv_heads, head_size, scale):
        """Appends token by token: the new token into the f32 residual window, a 32-token key group quantised
        (with its V codes) when it fills, through this method's writers; attends with this method's decode."""
        return KiviLiveCache(ctx, table, n_layers, n_heads, n_kv_heads, head_size, scale, method=self)

    def _accounting(self, head_size: int, residual_fraction: float, note: str):
        D = self.padded_head(head_size)  # the padded channels are stored too
        KW = layout.kw(D, self.bits)
        res = residual_fraction * D * 4
        k_bpt = KW * 4 + D / 4 + res  # codes + side stream (2 f32 per channel per 32 tokens) + residual
        v_bpt = (KW + 2) * 4 + res
        return k_bpt, v_bpt, note

    def _layouts(self, head_size, block_size, residual_fraction, note):
        D = self.padded_head(head_size)
        KW = layout.kw(D, self.bits)
        WS = layout.ws(D, block_size)
        k_bpt, v_bpt, note = self._accounting(head_size, residual_fraction, note)
        if D != head_size:
            note += (f" Head {head_size} runs padded to {D} channels (K: zero channels, V: channel 0 repeated); the "
                     f"padding's codes, side words and residual floats are stored and counted.")
        b = self.bits
        dt = f"uint{b}"
        if block_size <= 32:
            span = f"a group's side data spans 32/bs = {32 / block_size:g} block(s)"
        else:
            span = f"a block carries bs/32 = {block_size / 32:g} groups' side data"
        common = (
            f"Quantised positions: [0, n_q) with n_q = floor(max(L - {self.recent}, 0)/32)*32; positions "
            f"[n_q, L) are float32 rows of the residual buffer [rows, 2 (K,V), kv_heads, {D}]. {note}"
        )
        k = CacheLayout(
            method=self.id, which="K", head_size=head_size,
            fields=(
                LayoutField("codes", dt, b, D, "token", "per-channel asymmetric, groups of 32 tokens"),
                LayoutField("scale", "f32", 32, D, "channel-group", "(max-min)/%d over the group's 32 tokens" % self.levels),
                LayoutField("zero", "f32", 32, D, "channel-group", "group minimum of the channel"),
                LayoutField("residual", "f32", 32, D, "token", f"only the last {self.recent}..{self.recent + 31} tokens"),
            ),
            bytes_per_token_per_head=float(k_bpt),
            description=(
                f"KIVI keys, {b} bits: per channel over groups of 32 consecutive positions [32g, 32g+32) of a "
                f"sequence; each group's per-channel (scale, zero) live in the sequence's side stream, paged "
                f"with the block table: {WS} side words per block (D*bs/16 = 2 f32 per channel per 32 tokens), "
                f"so {span}; any block size works. "
                + common
            ),
            word_map=(
                f"per (block, head): words [0, {block_size * KW}) = token o's {KW} code words at o*{KW} "
                f"(element {32 // b}w+l in bits {b}l..); words [{block_size * KW}, {block_size * KW + WS}) = side "
                f"stream words [j*{WS}, (j+1)*{WS}) of the sequence (j = logical block): stream word 2*{D}*g + 2c = "
                f"scale, +1 = zero of channel c, group g"
            ),
        )
        v = CacheLayout(
            method=self.id, which="V", head_size=head_size,
            fields=(
                LayoutField("codes", dt, b, D, "token", "per-token asymmetric over the head vector"),
                LayoutField("scale", "f32", 32, 1, "token", "(max-min)/%d" % self.levels),
                LayoutField("zero", "f32", 32, 1, "token", "token minimum"),
                LayoutField("residual", "f32", 32, D, "token", f"only the last {self.recent}..{self.recent + 31} tokens"),
            ),
            bytes_per_token_per_head=float(v_bpt),
            description=f"KIVI values, {b} bits, per token (asymmetric). " + common,
            word_map=f"per (block, head): token o's record at o*{KW + 2}: {KW} code words, f32 scale, f32 zero (min)",
        )
        return k, v

    def layouts(self, head_size, block_size):
        L = self.context_len
        frac = (L - layout.n_quantised(L, self.recent)) / L
        note = (
            f"Bytes/token assume one sequence of context_len = {L} tokens (residual {L - layout.n_quantised(L, self.recent)} "
            f"f32 rows amortised over {L}) and full blocks; residual tokens also keep their (zeroed) code slots."
        )
        return self._layouts(head_size, block_size, frac, note)

    def layouts_for_batch(self, batch, head_size):
        """Layouts whose bytes/token are exact for this batch: residual rows / tokens of the batch."""
        p = layout.plan(batch.context_lens, self.recent)
        n = max(1, int(np.asarray(batch.context_lens, np.int64).sum()))
        note = (
            f"Bytes/token for this batch: {p.total_res} residual f32 rows over {n} tokens, full blocks assumed; "
            "residual tokens also keep their (zeroed) code slots."
        )
        return self._layouts(head_size, batch.block_size, p.total_res / n, note)

    # ------------------------------------------------------------------ GPU
    def _prepare(self, ctx, batch, key, value):
        rt = ctx.rt
        key, value = qk.check_kv(key, value)
        T, kvh, D = key.shape
        self.check(kvh, kvh, D, batch.block_size)
        sm = qk.check_batch(batch, T)
        qk.check_magnitude("key", key)
        qk.check_magnitude("value", value)
        key, value = self._pad(key, value)
        D = key.shape[2]
        for s in range(batch.num_seqs):
            pos = batch.token_pos[batch.token_rows(s)]
            if len(pos) != int(batch.context_lens[s]) or (pos != np.arange(len(pos))).any():
                raise InvalidInput(
                    f"kivi: sequence {s} has {len(pos)} token rows for a context of {int(batch.context_lens[s])}; "
                    "KIVI quantises keys per channel over whole 32-token groups, so the batch must hold every "
                    "position 0..L-1 of each sequence once.",
                    "Write whole sequences (prefill) with this method.",
                )
        bs = batch.block_size
        KW = layout.kw(D, self.bits)
        kstride = layout.k_stride(D, bs, self.bits)
        plan = layout.plan(batch.context_lens, self.recent)
        qc = qk.alloc_cache(rt, self.id, batch, kvh, D, kstride, bs * (KW + 2))
        res = qk.alloc_words(rt, max(1, plan.total_res) * 2 * kvh * D, f"{self.id}_residual")
        S = batch.num_seqs
        mbs = batch.block_tables.shape[1]
        info = np.concatenate([plan.seq_info().reshape(-1), batch.block_tables.astype(np.uint32).reshape(-1)])
        info_buf = rt.upload(info, "kivi_info")
        qc.extra.update(res=res, info=info_buf, plan=plan)
        bt_off = 4 * S

        # per-row residual index
        tseq, tpos = batch.token_seq, batch.token_pos
        real = sm != PAD_SLOT
        row_res = np.full(T, PAD_SLOT, dtype=np.uint32)
        if T:
            r = real & (tseq >= 0)
            nq_row = np.where(r, plan.n_q[np.maximum(tseq, 0)], 0)
            is_res = r & (tpos >= nq_row)
            row_res[is_res] = (plan.res_off[tseq[is_res]] + tpos[is_res] - nq_row[is_res]).astype(np.uint32)

        defines = {"BITS": self.bits}
        # key groups: (seq, g) for every complete quantised group, and their token rows
        groups, rows = [], []
        for s in range(S):
            ng = int(plan.n_q[s]) // GROUP
            if not ng:
                continue
            srows = batch.token_rows(s)
            for g in range(ng):
                groups.append((s, g, 0, 0))
                rows.append(srows[g * GROUP : (g + 1) * GROUP])
        qc.extra["writer_args"] = (key, value, sm, row_res, res, info_buf, groups, rows, bt_off, mbs)
        out, qc.extra["writer_impl"] = self._writer(ctx, qc, self.writer_impl)
        f32c = qk.alloc_f32(ctx, batch, kvh, D)
        dk = rt.compile(kivi_kernels.KIVI_DEQUANT, **defines)
        dd = qk.dequant_dispatches(
            ctx, dk, [qc.k, qc.v, res, info_buf], f32c, batch,
            lambda w0: dk.pack(kvh, D, bs, kstride, bt_off, mbs, w0),
        )
        return key, value, qc, f32c, out, dd, row_res

    def _writer(self, ctx, qc, impl: str):
        """(dispatches, impl) of the writer `impl` ("fast": fast/write_kivi_tok + write_kivi_kgroup, reading
        each key group's rows in place; "first-wave": quant/kivi_write_tok + kivi_write_kgroup, the groups'
        rows gathered on the host) over the buffers _prepare set up. Both write the same words."""
        if impl not in ("fast", "first-wave"):
            raise InvalidInput(f"kivi: writer_impl must be 'fast' or 'first-wave', got {impl!r}")
        rt = ctx.rt
        key, value, sm, row_res, res, info_buf, groups, rows, bt_off, mbs = qc.extra["writer_args"]
        T, kvh, D = key.shape
        bs, kstride = qc.block_size, qc.k_words
        defines = {"BITS": self.bits}
        out: list[Dispatch] = []
        if impl == "fast":
            try:
                if T:
                    out += kivi_kernels.kivi_token_dispatches(rt, self.bits, key, value, sm, row_res, qc.k, qc.v, res, bs, kstride)
                out += kivi_kernels.kivi_group_dispatches(rt, self.bits, key, sm, np.asarray(groups, np.uint32).reshape(-1, 4),
                                                np.asarray(rows, np.int64).reshape(-1, GROUP), info_buf, qc.k, bs,
                                                kstride, bt_off, mbs)
                return out, impl
            except UnsupportedShape as exc:  # a head the fast key-group writer's workgroup cannot hold: the same words
                log.info("kivi: %s; the first-wave writers write this cache", exc)
                out, impl = [], "first-wave"
        if T:
            tok = rt.compile(kivi_kernels.KIVI_WRITE_TOK, **defines)
            imm = tok.pack(kvh, D, bs, kstride)
            out += qk.token_dispatches(rt, tok, key, value, sm, [qc.k, qc.v, res], lambda n: imm, extra_rows=[row_res], z=1)
        if groups:
            gk = rt.compile(kivi_kernels.KIVI_WRITE_KGROUP, **defines)
            garr = np.asarray(groups, dtype=np.uint32)
            rarr = np.asarray(rows, dtype=np.int64)
            imm = gk.pack(kvh, D, bs, kstride, bt_off, mbs)
            for a, b in qk.row_chunks(rt, len(groups), GROUP * kvh * D * 4):
                r = rarr[a:b].reshape(-1)
                out.append(gk.dispatch((b - a, kvh, 1), [
                    rt.upload(key[r], "kivi_key_groups"),
                    rt.upload(sm[r].astype(np.uint32), "kivi_group_slots"),
                    rt.upload(garr[a:b], "kivi_groups"),
                    info_buf, qc.k,
                ], imm=imm))
        return out, impl

    def read_buffers(self, ctx, qkv) -> dict:
        """Raw K, V ([num_blocks, kv_heads, words]) and residual ([rows, 2, kv_heads, D] f32) buffers."""
        qc = qkv.device["cache"]
        p = qc.extra["plan"]
        rows = max(1, p.total_res)
        res = ctx.rt.read(qc.extra["res"], np.float32, (rows, 2, qc.num_kv_heads, qc.head_size),
                          nbytes=rows * 2 * qc.num_kv_heads * qc.head_size * 4)
        return {"k": qk.read_cache(ctx.rt, qc, "K"), "v": qk.read_cache(ctx.rt, qc, "V"), "res": res}

    def quantize(self, ctx, batch, key, value):
        D0 = int(np.shape(key)[-1])  # the head size given (the kernels run at padded_head(D0))
        key, value, qc, f32c, wd, dd, row_res = self._prepare(ctx, batch, key, value)
        ctx.rt.run(wd + dd)
        T, kvh, D = key.shape
        bs = batch.block_size
        KW = layout.kw(D, self.bits)
        WS = layout.ws(D, bs)
        qkv = QuantizedKV(self, D, kvh, None, None, None, None, (0, self.levels), device={"cache": qc, "f32": f32c, "writer": wd, "dequant": dd})
        bufs = self.read_buffers(ctx, qkv)
        kbuf, vbuf = bufs["k"], bufs["v"]
        sm = batch.slot_mapping.astype(np.int64)
        real = sm != PAD_SLOT
        blk, off = sm[real] // bs, sm[real] % bs
        k_codes = np.zeros((T, kvh, D), np.int32)
        v_codes = np.zeros((T, kvh, D), np.int32)
        k_scale = np.zeros((T, kvh, D), np.float32)
        k_zero = np.zeros((T, kvh, D), np.float32)
        v_scale = np.zeros((T, kvh), np.float32)
        v_zero = np.zeros((T, kvh), np.float32)
        kc = kbuf[:, :, : bs * KW].reshape(batch.num_blocks, kvh, bs, KW)
        vr = vbuf.reshape(batch.num_blocks, kvh, bs, KW + 2)
        k_codes[real] = unpack_codes(kc[blk, :, off], self.bits)
        v_codes[real] = unpack_codes(vr[blk, :, off, :KW], self.bits)
        v_scale[real] = vr[blk, :, off, KW].view(np.float32)
        v_zero[real] = vr[blk, :, off, KW + 1].view(np.float32)
        # per-token view of the key group parameters, read from the side streams
        streams = self.side_streams(batch, kbuf, kvh, D)
        plan = qc.extra["plan"]
        residual = row_res != PAD_SLOT
        for s in range(batch.num_seqs):
            nq = int(plan.n_q[s])
            if nq:
                rows = batch.token_rows(s)[:nq]
                st = streams[s][:, np.arange(nq) // GROUP]  # [kvh, nq, D, 2]
                k_scale[rows] = st[..., 0].transpose(1, 0, 2)
                k_zero[rows] = st[..., 1].transpose(1, 0, 2)
        qkv.head_size = D0
        qkv.k_codes, qkv.v_codes, qkv.k_scales, qkv.v_scales = k_codes[..., :D0], v_codes[..., :D0], k_scale[..., :D0], v_scale
        qkv.extra.update(
            k_zeros=k_zero[..., :D0], v_zeros=v_zero, residual=residual, row_res=row_res, plan=plan,
            side_streams=streams, buffers=bufs, ws=WS, padded_head=D,
        )
        return qkv

    def code_statistics(self, ctx, qkv, batch, key, value):
        """KIVI's statistics over the quantised tokens only (the recent float32 rows keep zeroed code slots
        and are counted as a share of their own): saturated (0 by construction: every value lies inside its
        group's min..max), zeroed non-zeros, range used, the recent share, the mean range (max - min) of a
        group in the input's units and the mean share of the 2^bits levels one group uses (K: one channel
        over 32 tokens, V: one token's head vector)."""
        real = np.asarray(batch.slot_mapping) != PAD_SLOT
        resid = np.asarray(qkv.extra["residual"], bool)
        quant = real & ~resid
        n_real = max(1, int(real.sum()))
        plan = qkv.extra["plan"]
        out = []
        for which, codes, x, sc, zp in (("K", qkv.k_codes, key, qkv.k_scales, qkv.extra["k_zeros"]),
                                        ("V", qkv.v_codes, value, qkv.v_scales, qkv.extra["v_zeros"])):
            x = np.asarray(x, np.float32)
            s, z = np.asarray(sc, np.float32), np.asarray(zp, np.float32)
            if s.ndim == x.ndim - 1:
                s, z = s[..., None], z[..., None]
            with np.errstate(divide="ignore", invalid="ignore"):
                unr = np.where(s != 0, (x - z) / np.where(s != 0, s, 1), 0).astype(np.float32)
            if which == "K":
                groups = [np.asarray(codes)[batch.token_rows(q)[: int(plan.n_q[q])]].reshape(-1, GROUP, *codes.shape[1:])
                          for q in range(batch.num_seqs) if int(plan.n_q[q])]
                used = np.concatenate([levels_used(g, self.levels + 1, 1).reshape(-1) for g in groups]) if groups else np.zeros(0)
            else:
                used = levels_used(np.asarray(codes)[quant], self.levels + 1, -1).reshape(-1)
            rng = (s * self.levels)[quant].reshape(-1)
            extra = [
                Statistic("recent_share", "kept in float32", float(np.count_nonzero(real & resid)) / n_real,
                          f"share of the real tokens in each sequence's recent window (>= {self.recent} tokens, whole "
                          "32-token key groups) that stay float32: their codes are not counted here"),
                Statistic("group_range_mean", "group range (mean)", float(rng.mean()) if rng.size else float("nan"),
                          "mean of max - min over the quantised groups (K: one channel over 32 tokens, V: one token), "
                          "in the input's units", "value"),
                Statistic("levels_used_mean", "levels used per group", float(used.mean()) if used.size else float("nan"),
                          f"mean share of the {self.levels + 1} codes one group uses"),
            ]
            deq = self.dequantised_rows(ctx, qkv, batch, which) if ctx is not None else None
            out.append(code_stats(codes, qkv.code_range, quant, x=x, dequantised=deq, unrounded=unr, extra=extra,
                                  saturation="share of the quantised values outside their group's min..max "
                                  "(0 by construction for min-max asymmetric codes)"))
        return tuple(out)

    def side_streams(self, batch, kbuf, kvh, D) -> list:
        """Per sequence [kvh, groups, D, 2] (scale, zero) read from the side stream words of its blocks."""
        bs = batch.block_size
        KW, WS = layout.kw(D, self.bits), layout.ws(D, bs)
        p = layout.plan(batch.context_lens, self.recent)
        out = []
        for s in range(batch.num_seqs):
            ng = int(p.n_q[s]) // GROUP
            blocks = np.asarray(batch.seq_blocks[s], dtype=np.int64)
            idx = np.arange(ng * 2 * D)
            words = kbuf[blocks[idx // WS], :, bs * KW + idx % WS] if ng else np.zeros((0, kvh), np.uint32)
            out.append(np.ascontiguousarray(words.T).view(np.float32).reshape(kvh, ng, D, 2))
        return out

    def token_scales(self, qkv, kv_head, n):
        got = super().token_scales(qkv, kv_head, n)
        resid = np.asarray(qkv.extra["residual"], bool)[:n]  # rows still in the f32 recent window
        k, v, _ = got
        return (np.where(resid, np.nan, k), np.where(resid, np.nan, v),
                "none yet for the recent tokens, kept in f32")

    def inspect_block(self, ctx, qkv, batch, block, kv_head, which):
        qc = qkv.device["cache"]
        D, bs = qc.head_size, batch.block_size
        KW, WS = layout.kw(D, self.bits), layout.ws(D, bs)
        bufs = self.read_buffers(ctx, qkv)
        plan = qc.extra["plan"]
        pos = batch.block_positions(block)[1]
        owner = int(batch.block_owner()[block])
        recs = []
        for o in range(bs):
            p = int(pos[o])
            if which == "K":
                words = bufs["k"][block, kv_head, o * KW : (o + 1) * KW].copy()
            else:
                words = bufs["v"][block, kv_head, o * (KW + 2) : (o + 1) * (KW + 2)].copy()
            fields: dict = {"codes": unpack_codes(words[:KW], self.bits).astype(np.int32)}
            if p >= 0 and p >= int(plan.n_q[owner]):
                r = int(plan.res_off[owner]) + p - int(plan.n_q[owner])
                fields["residual_f32"] = bufs["res"][r, 0 if which == "K" else 1, kv_head].copy()
            elif p >= 0 and which == "K":
                g = p // GROUP
                st = qkv.extra["side_streams"][owner][kv_head, g]
                fields.update(group=g, scale=st[:, 0].copy(), zero=st[:, 1].copy())
            elif p >= 0:
                fields.update(scale=float(words[KW:KW + 1].view(np.float32)[0]), zero=float(words[KW + 1:].view(np.float32)[0]))
            recs.append(TokenRecord(slot=block * bs + o, position=p, words=words, fields=fields))
        if which == "K" and recs:
            recs[0].fields["block_side_words"] = bufs["k"][block, kv_head, bs * KW : bs * KW + WS].copy()
        return recs

    def timed_kernels(self, ctx, batch, key, value, q, scale, qkv=None):
        if qkv is not None:  # the writer and dequantise dispatches quantize ran, over its caches
            f32c, wd, dd = qkv.device["f32"], qkv.device["writer"], qkv.device["dequant"]
        else:
            key, value, qc, f32c, wd, dd, _ = self._prepare(ctx, batch, key, value)
            ctx.rt.run(wd + dd)
        T, kvh, D = key.shape
        D = self.padded_head(D)
        k_lay, v_lay = self.layouts_for_batch(batch, np.asarray(q).shape[-1])
        q = self._pad_q(q, D)
        real = int(np.count_nonzero(batch.slot_mapping != PAD_SLOT))
        stored = int(round(real * kvh * (k_lay.bytes_per_token_per_head + v_lay.bytes_per_token_per_head)))
        w_bytes = 2 * real * kvh * D * 4 + T * 4 + stored
        nblk = sum(len(b) for b in batch.seq_blocks)
        d_bytes = stored + 2 * nblk * kvh * batch.block_size * D * 4
        dec, _ = ctx.paged.decode_dispatches(f32c, q, batch, scale)
        qc = qkv.device["cache"] if qkv is not None else qc
        impl = qc.extra.get("writer_impl", "first-wave")
        other = "first-wave" if impl == "fast" else "fast"
        names = {"first-wave": "kivi writer (tokens + key groups)", "fast": "kivi writer (tokens + key groups, fast)"}
        writers = {impl: wd, other: self._writer(ctx, qc, other)[0]}
        w_flops = arith.writer_flops(batch, kvh, D, arith.WRITER_PER_ELEMENT["kivi"])
        return [TimedKernel(names[i], writers[i], int(w_bytes), "writer", i, w_flops) for i in ("first-wave", "fast")] + [
            TimedKernel("kivi dequantise", dd, int(d_bytes), "dequantise", "first-wave",
                        arith.dequant_flops(batch, kvh, D, arith.DEQUANT_PER_ELEMENT["kivi"])),
            TimedKernel("paged_attn_f32 (over the dequantised cache)", dec, decode_bytes(f32c, batch, q), "decode",
                        "first-wave", arith.decode_flops(batch, q.shape[1], D)),
        ] + self._fast_rows(ctx, qc, batch, q, scale)
