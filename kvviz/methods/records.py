"""Host side shared by the per-token-record methods (int8_token, int4_group, fp8_*).

A per-token-record method stores, for every cache slot and KV head, one fixed-size record of u32
words (codes, then scales / zeros) in a paged cache [num_blocks, kv_heads, block_size, wpt], written
by a WGSL writer through the batch's slot_mapping. Attention runs over an f32 copy of the used blocks
made by the method's WGSL dequantise kernel, through the f32 baseline decode / weights kernels.
"""
from __future__ import annotations

import logging
from abc import abstractmethod

import numpy as np

from kvviz.attention import arith, prefill, records as qk
from kvviz.attention.split_decode import fast_decode_rows, unsupported
from kvviz.attention.traffic import decode_bytes
from kvviz.errors import InvalidInput, UnsupportedShape
from kvviz.attention.writers import device_pair
from kvviz.gpu.timed import TimedKernel
from kvviz.methods.base import KVMethod, QuantizedKV, TokenRecord
from kvviz.methods.live_records import RecordLiveCache
from kvviz.paging import PAD_SLOT

log = logging.getLogger("kvviz.methods.records")


class DequantisedAttention:
    """Attention of a method whose quantise step also fills an f32 paged cache (qkv.device["f32"]) with
    its dequantise kernel: the f32 baseline decode and weights kernels run over that cache."""

    attend_kernel = "paged_attn_f32 (over the method's dequantised cache)"
    weights_kernel = "paged_attn_weights (over the method's dequantised cache)"

    def attend(self, ctx, qkv, batch, q, scale):
        return ctx.paged.decode(qkv.device["f32"], q, batch, scale)

    def weights(self, ctx, qkv, batch, q, scale):
        return ctx.paged.weights(qkv.device["f32"], q, batch, scale)

    def read_f32(self, ctx, qkv, which: str) -> np.ndarray:
        """The dequantised f32 paged cache [num_blocks, kv_heads, block_size, head_size]."""
        return ctx.paged.read(qkv.device["f32"], "k" if which == "K" else "v")


class SiblingFastAttention:
    """attend() through the method's own fast decode (`_fast_plan(ctx, cache, batch, q, scale)`: a plan, or None
    where it cannot take the shape), else the first-wave path (DequantisedAttention): the llama.cpp types and
    NVFP4, whose decodes are fast_decode's siblings."""

    def attend(self, ctx, qkv, batch, q, scale):
        plan = self._fast_plan(ctx, qkv.device["cache"], batch, q, scale)
        if plan is None:
            return DequantisedAttention.attend(self, ctx, qkv, batch, q, scale)
        ctx.rt.run(plan.dispatches)
        return ctx.rt.read(plan.out, np.float32, plan.shape)

    def timed_kernels(self, ctx, batch, key, value, q, scale, qkv=None):
        """The per-token-record rows (writers, dequantise, f32 decode: the first-wave path) plus the fast
        decode's row ("fast_decode_<type> (N partitions)", its bytes from `_fast_traffic`) where it takes the shape."""
        if qkv is None:
            key, value, qc, f32c, wd, dd = self._build(ctx, batch, key, value)
            ctx.rt.run(wd + dd)
            qkv = QuantizedKV(self, key.shape[2], key.shape[1], None, None, None, None, self.code_range,
                              device={"cache": qc, "f32": f32c, "writer": wd, "dequant": dd})
        rows = super().timed_kernels(ctx, batch, key, value, q, scale, qkv)
        qc = qkv.device["cache"]
        plan = self._fast_plan(ctx, qc, batch, np.asarray(q, np.float32), scale)
        if plan is not None:
            nbytes, flops = self._fast_traffic(batch, plan, qc)
            rows.append(TimedKernel(f"fast_decode_{plan.label} ({plan.num_partitions} partitions)", plan.dispatches,
                                    nbytes, "decode", "fast", flops))
        return rows


class PerTokenRecordMethod(DequantisedAttention, KVMethod):
    """Subclasses define wpt(), the writer / dequantise specs and unpack().

    attend() runs the fast split-K decode over the packed cache when the method names its
    fast_cache_format() and the shape fits it; otherwise the first-wave path (the dequantise kernel into
    an f32 cache, then the f32 paged decode). weights() always runs over the dequantised cache.
    """

    attend_kernel = "fast/decode_split + decode_reduce over the packed cache (or paged_attn_f32 over the dequantised cache)"

    head_multiple: int = 4
    head_multiple_why: str = "4 codes are packed per 32-bit word"
    head_multiple_elsewhere: str = ""  # what another engine does with a model whose head is not such a multiple
    code_range: tuple = (0, 0)
    # The writer quantize() runs: "fast" (kvviz/attention/writers.py, where the method has one for the
    # shape) or "first-wave" (writer_dispatches: the method's own shaders/quant writer). Set it on an
    # instance to pick; timed_kernels times both side by side either way.
    writer_impl: str = "fast"
    has_first_wave_writer: bool = True  # False: the fast writer is the method's only writer (f16)

    # ------------------------------------------------------------------ per family
    @abstractmethod
    def wpt(self, head_size: int) -> int:
        """Per family."""

    @abstractmethod
    def writer_spec(self):
        """Per family."""

    @abstractmethod
    def dequant_spec(self):
        """Per family."""

    @abstractmethod
    def unpack(self, records: np.ndarray, head_size: int) -> dict:
        """records [..., wpt] u32 -> {"codes": ..., "scale": ..., (more fields)}."""

    def check_values(self, key: np.ndarray, value: np.ndarray) -> None:
        """Extra value checks before dispatch (finite-ness is checked already)."""

    def range_warnings(self, key: np.ndarray, value: np.ndarray, real: np.ndarray, fields: dict) -> list[str]:
        """Warnings about values this method cannot represent (say, flushed to all-zero codes), from the
        input rows `real` and the fields read back from the GPU cache ({"K": ..., "V": ...})."""
        return []

    # ------------------------------------------------------------------ shared
    def _fast_format(self, qkv, q):
        """The fast decode's cache format for this batch, or None when it cannot take the shape."""
        fmt = self.fast_cache_format(qkv.head_size)
        H = np.asarray(q).shape[1] if np.ndim(q) == 3 else 0
        if fmt is None or not H or H % qkv.num_kv_heads or unsupported(fmt, qkv.head_size, H // qkv.num_kv_heads):
            return None
        return fmt

    def attend(self, ctx, qkv, batch, q, scale):
        fmt = self._fast_format(qkv, q)
        if fmt is None:
            return DequantisedAttention.attend(self, ctx, qkv, batch, q, scale)
        qc = qkv.device["cache"]
        return ctx.fast.decode(fmt, qc.k, qc.v, qc.num_kv_heads, q, batch, scale, tensor=qc.extra.get("tensor"))

    def prefill_format(self, head_size: int):
        """The prefill's record format of this method's cache (kvviz/attention/prefill.py RecordFormat): the fast
        decode's CacheFormat; None where the method reads its records otherwise (its own prefill_plan)."""
        fmt = self.fast_cache_format(head_size)
        return None if fmt is None else prefill.RecordFormat(fmt)

    def prefill_plan(self, ctx, qkv, batch, q, q_lens, scale, softcap=0.0):
        """The prefill over the packed records in place (attention/prefill.wgsl), the per-tensor scales from the
        cache's tensor buffer; None where the method has no record format or the shape is not the prefill's."""
        fmt = self.prefill_format(qkv.head_size)
        if fmt is None or prefill.format_unsupported(fmt, qkv.head_size):
            return None
        qc = qkv.device["cache"]
        return prefill.plan_records(ctx.prefill, fmt, qc.k, qc.v, qc.num_kv_heads, q, batch, q_lens, scale,
                                    tensor=self.prefill_scales(qc), softcap=softcap)

    def prefill_scales(self, qc):
        """The buffer of the scales the prefill's format reads outside the records (the tensor buffer), or None."""
        return qc.extra.get("tensor")

    @property
    def batch_scales(self) -> bool:
        """Whether the cache holds scales over the whole batch (a per-tensor scale, a method with its own
        tensor buffer): a token's record then depends on the other tokens, and live decode re-quantises
        instead of appending."""
        return bool(getattr(self, "per_tensor", type(self)._tensor_buffer is not PerTokenRecordMethod._tensor_buffer))

    @property
    def has_live_cache(self) -> bool:
        return not self.batch_scales

    def live_cache(self, ctx, table, n_layers, n_heads, n_kv_heads, head_size, scale):
        """Appends token by token through the method's writer, attends with the fast decode
        (kvviz/methods/live_records.py)."""
        if self.batch_scales:
            return None

        return RecordLiveCache(ctx, table, n_layers, n_heads, n_kv_heads, head_size, scale, method=self)

    def check(self, num_heads, num_kv_heads, head_size, block_size):
        qk.check_common_shape(num_heads, num_kv_heads, head_size, block_size, self.head_multiple, self.head_multiple_why,
                              self.head_multiple_elsewhere)

    def _validate(self, batch, key, value):
        key, value = qk.check_kv(key, value)
        T, kvh, D = key.shape
        self.check(kvh, kvh, D, batch.block_size)
        sm = qk.check_batch(batch, T)
        self.check_values(key, value)
        return key, value, sm

    def _tensor_buffer(self, ctx):
        return None

    def writer_dispatches(self, ctx, qc, key, value, sm):
        rt = ctx.rt
        kvh, D = key.shape[1], key.shape[2]
        kern = rt.compile(self.writer_spec())
        bufs = [qc.k, qc.v] + ([qc.extra["tensor"]] if qc.extra.get("tensor") else [])
        imm = kern.pack(kvh, D, qc.block_size, self.wpt(D))
        return qk.token_dispatches(rt, kern, key, value, sm, bufs, lambda n: imm)

    def fast_writer(self, rt, qc, key, value, sm, variant=None):
        """The method's fast writer's dispatches into qc (its family's kernels), or None where it has none;
        UnsupportedShape where the shape is one it cannot take."""
        return None

    def fast_writer_dispatches(self, ctx, qc, key, value, sm):
        """The fast writer's dispatches into qc (same words as writer_dispatches), or None when the method
        has none for this shape (the first-wave writer then runs)."""
        try:
            return self.fast_writer(ctx.rt, qc, key, value, sm)
        except UnsupportedShape as exc:
            log.info("%s: no fast writer for this shape (%s); the first-wave writer runs", self.id, exc)
            return None

    def select_writer(self, ctx, qc, key, value, sm):
        """(dispatches, "fast" | "first-wave"): the writer `writer_impl` picks, the first-wave one where
        the method has no fast writer for the shape."""
        if self.writer_impl not in ("fast", "first-wave"):
            raise InvalidInput(f"{self.id}: writer_impl must be 'fast' or 'first-wave', got {self.writer_impl!r}")
        if self.writer_impl == "fast" or not self.has_first_wave_writer:
            d = self.fast_writer_dispatches(ctx, qc, key, value, sm)
            if d is not None:
                return d, "fast"
        return self.writer_dispatches(ctx, qc, key, value, sm), "first-wave"

    def dequant_dispatches(self, ctx, qc, f32c, batch):
        rt = ctx.rt
        D = qc.head_size
        tensor = qc.extra.get("tensor")
        kern = rt.compile(self.dequant_spec())
        ins = [qc.k, qc.v] + ([tensor] if tensor else [])
        return qk.dequant_dispatches(
            ctx, kern, ins, f32c, batch, lambda w0: kern.pack(qc.num_kv_heads, D, qc.block_size, self.wpt(D), w0)
        )

    def _alloc_cache(self, ctx, batch, kvh: int, D: int):
        """The batch's packed cache of this method, with its tensor-scale buffer where the method has one."""
        w = self.wpt(D)
        qc = qk.alloc_cache(ctx.rt, self.id, batch, kvh, D, batch.block_size * w, batch.block_size * w)
        tb = self._tensor_buffer(ctx)
        if tb is not None:
            qc.extra["tensor"] = tb
        return qc

    def _build(self, ctx, batch, key, value):
        key, value, sm = self._validate(batch, key, value)
        T, kvh, D = key.shape
        qc = self._alloc_cache(ctx, batch, kvh, D)
        f32c = qk.alloc_f32(ctx, batch, kvh, D)
        wd, impl = self.select_writer(ctx, qc, key, value, sm) if T else ([], self.writer_impl)
        qc.extra["writer_impl"] = impl
        dd = self.dequant_dispatches(ctx, qc, f32c, batch)
        return key, value, qc, f32c, wd, dd

    def quantize_device(self, ctx, batch, key, value):
        """KVMethod.quantize_device: the packed cache alone (no dequantised f32 cache, no read-back). DeviceRows K/V
        go to the fast writer where the method says it binds them (`device_rows_writer`) and it is the writer that
        runs; their values are not checked on the host (they are on the device). None where the fast writer refuses
        device rows of this shape."""
        on_device = device_pair(key, value, self.id)
        if on_device:
            if not (self.device_rows_writer and (self.writer_impl == "fast" or not self.has_first_wave_writer)):
                return None
            T, kvh, D = key.shape
            self.check(kvh, kvh, D, batch.block_size)
            sm = qk.check_batch(batch, T)
        else:
            key, value, sm = self._validate(batch, key, value)
            T, kvh, D = key.shape
        qc = self._alloc_cache(ctx, batch, kvh, D)
        if on_device:
            try:
                wd, impl = self.fast_writer(ctx.rt, qc, key, value, sm), "fast"
            except UnsupportedShape as exc:
                log.info("%s: K/V from the host (%s)", self.id, exc.one_line())
                return None
        else:
            wd, impl = self.select_writer(ctx, qc, key, value, sm) if T else ([], self.writer_impl)
        qc.extra["writer_impl"] = impl
        ctx.rt.submit(wd)
        e = np.zeros(0)
        return QuantizedKV(self, D, kvh, e, e, e, e, self.code_range, device={"cache": qc})

    def quantize(self, ctx, batch, key, value):
        key, value, qc, f32c, wd, dd = self._build(ctx, batch, key, value)
        ctx.rt.run(wd + dd)
        T, kvh, D = key.shape
        fields = {}
        for which in ("K", "V"):
            recs = qk.token_records(qk.read_cache(ctx.rt, qc, which), batch, self.wpt(D))
            fields[which] = (recs, self.unpack(recs, D))
        (kr, kf), (vr, vf) = fields["K"], fields["V"]
        extra = {"k_records": kr, "v_records": vr, "k_fields": kf, "v_fields": vf}
        real = batch.slot_mapping != PAD_SLOT
        return QuantizedKV(
            self, D, kvh, kf["codes"], vf["codes"], kf["scale"], vf["scale"], self.code_range,
            device={"cache": qc, "f32": f32c, "writer": wd, "dequant": dd}, extra=extra,
            warnings=self.range_warnings(key, value, real, {"K": kf, "V": vf}),
        )

    def inspect_block(self, ctx, qkv, batch, block, kv_head, which):
        qc = qkv.device["cache"]
        D = qc.head_size
        w = self.wpt(D)
        full = qk.read_cache(ctx.rt, qc, which)
        recs = full[block, kv_head].reshape(batch.block_size, w)
        fields = self.unpack(recs, D)
        pos = batch.block_positions(block)[1]
        return [
            TokenRecord(
                slot=block * batch.block_size + o,
                position=int(pos[o]),
                words=recs[o].copy(),
                fields={k: (np.asarray(v[o]) if np.ndim(v[o]) else float(v[o])) for k, v in fields.items()},
            )
            for o in range(batch.block_size)
        ]

    def _writer_bytes(self, batch, key) -> int:
        real = int(np.count_nonzero(batch.slot_mapping != PAD_SLOT))
        kvh, D = key.shape[1], key.shape[2]
        return int(2 * real * kvh * D * 4 + batch.num_tokens * 4 + 2 * real * kvh * self.wpt(D) * 4)

    def _dequant_bytes(self, batch, kvh, D) -> int:
        nblk = sum(len(b) for b in batch.seq_blocks)
        return int(2 * nblk * kvh * batch.block_size * (self.wpt(D) + D) * 4)

    def _writer_rows(self, ctx, qc, batch, key, value, wd) -> list:
        """The writer quantize ran and the other implementation over the same cache (it writes the same
        words), as TimedKernel rows with impl "fast" / "first-wave"."""
        impl = qc.extra.get("writer_impl", "first-wave")
        nbytes = self._writer_bytes(batch, key)
        flops = arith.writer_flops(batch, key.shape[1], key.shape[2], arith.WRITER_PER_ELEMENT.get(self.family, 2.0))
        names = {"fast": f"{self.id} writer (fast)", "first-wave": f"{self.id} writer"}
        rows = {impl: TimedKernel(names[impl], wd, nbytes, "writer", impl, flops)}
        if batch.num_tokens and (impl == "first-wave" or self.has_first_wave_writer):
            k, v, sm = self._validate(batch, key, value)
            if impl == "fast":
                rows["first-wave"] = TimedKernel(names["first-wave"], self.writer_dispatches(ctx, qc, k, v, sm), nbytes,
                                                 "writer", "first-wave", flops)
            else:
                d = self.fast_writer_dispatches(ctx, qc, k, v, sm)
                if d is not None:
                    rows["fast"] = TimedKernel(names["fast"], d, nbytes, "writer", "fast", flops)
        return [rows[i] for i in ("first-wave", "fast") if i in rows]

    def timed_kernels(self, ctx, batch, key, value, q, scale, qkv=None):
        if qkv is not None:  # the writer and dequantise dispatches quantize ran, over its caches
            f32c, wd, dd = qkv.device["f32"], qkv.device["writer"], qkv.device["dequant"]
        else:
            key, value, qc, f32c, wd, dd = self._build(ctx, batch, key, value)
            ctx.rt.run(wd + dd)
            qkv = QuantizedKV(self, key.shape[2], key.shape[1], None, None, None, None, self.code_range, device={"cache": qc})
        dec, _ = ctx.paged.decode_dispatches(f32c, q, batch, scale)
        kvh, D = key.shape[1], key.shape[2]
        qc = qkv.device["cache"]
        return self._writer_rows(ctx, qc, batch, key, value, wd) + [
            TimedKernel(f"{self.id} dequantise", dd, self._dequant_bytes(batch, kvh, D), "dequantise", "first-wave",
                        arith.dequant_flops(batch, kvh, D, arith.DEQUANT_PER_ELEMENT.get(self.family, 1.0))),
            TimedKernel("paged_attn_f32 (over the dequantised cache)", dec, decode_bytes(f32c, batch, q), "decode",
                        "first-wave", arith.decode_flops(batch, np.asarray(q).shape[1], D)),
        ] + fast_decode_rows(ctx, self, qc.k, qc.v, kvh, batch, q, scale, tensor=qc.extra.get("tensor"))
