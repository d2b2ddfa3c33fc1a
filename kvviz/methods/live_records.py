"""Live decode over a per-token-record method's own paged cache, appended one token at a time.

Each step runs the method's writer (its fast writer by default) over the new token only, into the slot
the block table gives it, and the fast split-K decode (kvviz/attention/split_decode.py) over the packed
cache, in one submit: the writer's cost per step does not grow with the sequence, and the decode's is
the attention itself. This is how an engine runs a quantised cache; `RequantCache`
(kvviz/methods/live_cache.py), which quantises the whole sequence again every step, stays as the cross-check
(`make_live_cache(..., incremental=False)`) and gives the same records, so the same next-token KL.

Used for the per-token-record methods (kvviz/methods/records.py) whose records depend on their
own token only; a method with scales over the whole batch (a per-tensor scale) keeps re-quantising.
The ggml block types attend through their own fast decode (the method's `_fast_plan`, which
their family provides). Shapes no fast decode can take fall back to the method's first-wave
decode (dequantise + f32 paged decode, O(T) a step), said in the cache's label.
"""
from __future__ import annotations

import logging

import numpy as np

from kvviz.errors import InvalidInput, UnsupportedShape
from kvviz.attention import records as qk
from kvviz.attention.split_decode import unsupported
from kvviz.methods.live_cache import LiveCache, TokenScales, _scale_label, _tokens_major
from kvviz.methods.base import QuantizedKV

_F32 = np.float32
log = logging.getLogger("kvviz.live")


class RecordLiveCache(LiveCache):
    path = "appended token by token (GPU)"  # kvviz live's cache path
    ring_safe = True  # built only for methods whose records depend on their own token alone

    def __init__(self, ctx, table, n_layers, n_heads, n_kv_heads, head_size, scale, *, method):
        super().__init__(ctx, table, n_layers, n_heads, n_kv_heads, head_size, scale)
        method.check(n_heads, n_kv_heads, head_size, table.block_size)
        self.method = method
        self.method_id = method.id
        self.wpt = method.wpt(head_size)
        words = table.block_size * self.wpt
        n = table.num_blocks * n_kv_heads * words
        self.layers = [qk.QuantCache(method.id, table.num_blocks, n_kv_heads, table.block_size, head_size, words, words,
                                     qk.alloc_words(ctx.rt, n, f"{method.id}_live_k"),
                                     qk.alloc_words(ctx.rt, n, f"{method.id}_live_v"))
                       for _ in range(n_layers)]
        tb = method._tensor_buffer(ctx)  # a writer that binds a tensor buffer even without per-tensor scales (FP8)
        if tb is not None:  # one for every layer: it holds no per-token state here
            for qc in self.layers:
                qc.extra["tensor"] = tb
        fmt = method.fast_cache_format(head_size)
        self.fmt = None if fmt is None or unsupported(fmt, head_size, n_heads // n_kv_heads) else fmt
        # a method with a fast decode of its own (the ggml block types, whose family provides it) plans
        # it through `_fast_plan`, which returns None for a shape it cannot take
        self.fast_plan = getattr(method, "_fast_plan", None) if self.fmt is None else None
        how = ("fast split-K decode" if self.fmt else
               "the method's fast split-K decode where it takes the shape, else the first-wave decode" if self.fast_plan
               else "first-wave decode (dequantise + f32 paged decode)")
        self.label = f"{method.label}, appended token by token, {how}"

    # ---------------------------------------------------------------- writing
    def _writer(self, layer, k, v, start):
        key, value = qk.check_kv(_tokens_major(k), _tokens_major(v))
        self.method.check_values(key, value)
        slots = np.ascontiguousarray(self.table.slots(start, start + key.shape[0]), dtype=np.uint32)
        d, _ = self.method.select_writer(self.ctx, self.layers[layer], key, value, slots)
        return d

    def write(self, layer, k, v, start):
        if start + k.shape[1] > self.table.capacity:
            raise InvalidInput(f"position {start + k.shape[1] - 1} is past the pool's {self.table.capacity} slots")
        self.ctx.rt.submit(self._writer(layer, k, v, start))  # the attention that reads it waits

    def takes_device_rows(self) -> bool:
        """Where the method says its fast writer takes device rows (`device_rows_writer`) and that is the writer it
        runs (select_writer)."""
        m = self.method
        return getattr(m, "device_rows_writer", False) and (m.writer_impl == "fast" or not m.has_first_wave_writer)

    def extend_on_device(self, layer, k, v, start):
        """The method's fast writer binds the device rows in place, where the method says its fast writer takes them
        (`device_rows_writer`) and is the writer it runs (select_writer); False where it is not, or where the writer
        refuses the shape (the caller extends from the host). No host check of the values (`check_values`: LiveCache
        says why)."""
        m = self.method
        if not self.takes_device_rows():
            return False
        t = int(k.shape[0])
        self.table.ensure(start + t)
        if start + t > self.table.capacity:
            raise InvalidInput(f"position {start + t - 1} is past the pool's {self.table.capacity} slots")
        slots = np.ascontiguousarray(self.table.slots(start, start + t), dtype=np.uint32)
        try:
            d = m.fast_writer(self.ctx.rt, self.layers[layer], k, v, slots)
        except UnsupportedShape as exc:
            log.info("%s: K/V from the host (%s)", m.id, exc.one_line())
            return False
        if not d:
            return False
        self.ctx.rt.submit(d)  # the attention that reads it waits
        if layer == self.n_layers - 1:
            self.length = start + t
        return True

    # ---------------------------------------------------------------- attention
    def _f32(self, layer, batch):
        """The first-wave path: (an f32 cache of the batch's blocks, the method's dequantise dispatches
        that fill it: to run after any writer of the same step)."""
        f32c = qk.alloc_f32(self.ctx, batch, self.n_kv_heads, self.head_size)
        return f32c, self.method.dequant_dispatches(self.ctx, self.layers[layer], f32c, batch)

    def _decode(self, layer, q, batch):
        """(dispatches, read) of the decode of q [1, H, D] over `batch`."""
        if self.fmt is None and self.fast_plan is not None:
            plan = self.fast_plan(self.ctx, self.layers[layer], batch, q, self.scale)
            if plan is not None:
                return plan.dispatches, lambda: self.ctx.rt.read(plan.out, np.float32, plan.shape)
        if self.fmt is None:
            f32c, dq = self._f32(layer, batch)
            d, outs = self.ctx.paged.decode_dispatches(f32c, q, batch, self.scale)
            return dq + d, lambda: self.ctx.paged._collect(outs, 1, self.n_heads * self.head_size, (self.n_heads, self.head_size))
        qc = self.layers[layer]
        plan = self.ctx.fast.plan(self.fmt, qc.k, qc.v, self.n_kv_heads, q, batch, self.scale, tensor=qc.extra.get("tensor"))
        return plan.dispatches, lambda: self.ctx.fast.read(plan)

    def attend(self, layer, q, context_len):
        if self.softcap:
            return self._capped_attend(self._causal_plan(layer), q, self.table.batch(context_len))
        d, read = self._decode(layer, np.asarray(q, _F32)[None], self.table.batch(context_len))
        self.ctx.rt.run(d)
        return read()[0]

    def _causal_plan(self, layer):
        return lambda q, batch: self.method.prefill_plan(self.ctx, self._qkv(layer), batch, q, [q.shape[0]], self.scale,
                                                         softcap=self.softcap)

    def attend_causal(self, layer, q, start):
        """The method's prefill over the packed records in place (one dispatch), where it has one for the shape."""
        return self._prefill(layer, q, start, self._causal_plan(layer))

    def append_attend(self, layer, q, k, v, pos):
        if self.softcap:  # the write, then the capped prefill of one query
            return LiveCache.append_attend(self, layer, q, k, v, pos)
        # The new token's writer and the decode in one submit: WebGPU orders the dispatches, so the
        # decode sees the record the writer just stored.
        self.table.ensure(pos + 1)
        w = self._writer(layer, k[:, None, :], v[:, None, :], pos)
        d, read = self._decode(layer, np.asarray(q, _F32)[None], self.table.batch(pos + 1))
        self.ctx.rt.run(w + d)
        self._wrote(layer, q, pos + 1)
        return read()[0]

    def weights(self, layer, q, context_len):
        batch = self.table.batch(context_len)
        f32c, dq = self._f32(layer, batch)
        self.ctx.rt.run(dq)
        return self.ctx.paged.weights(f32c, np.asarray(q, _F32)[None], batch, self.scale)[0]

    # ---------------------------------------------------------------- what it holds
    def bytes_per_token(self):
        k, v = self.method.layouts(self.head_size, self.table.block_size)
        return float(self.n_layers * self.n_kv_heads * (k.bytes_per_token_per_head + v.bytes_per_token_per_head))

    def _qkv(self, layer) -> QuantizedKV:
        e = np.zeros(0)
        return QuantizedKV(self.method, self.head_size, self.n_kv_heads, e, e, e, e, self.method.code_range,
                           device={"cache": self.layers[layer]})

    def inspect_block(self, layer, block, kv_head, which="K"):
        return self.method.inspect_block(self.ctx, self._qkv(layer), self.table.batch(self.length), block, kv_head, which)

    def token_scales(self, layer, kv_head):
        n = self.length
        if n == 0:
            return None
        slots = self.table.slots(0, n).astype(np.int64)
        bs = self.table.block_size
        fields = []
        for which in ("K", "V"):
            full = qk.read_cache(self.ctx.rt, self.layers[layer], which)  # [nb, kvh, bs * wpt]
            recs = full[:, :, : bs * self.wpt].reshape(full.shape[0], full.shape[1], bs, self.wpt)
            fields.append(self.method.unpack(recs[slots // bs, :, slots % bs], self.head_size))
        (kf, vf), e = fields, np.zeros(0)
        qkv = QuantizedKV(self.method, self.head_size, self.n_kv_heads, kf.get("codes", e), vf.get("codes", e),
                          kf.get("scale"), vf.get("scale"), self.method.code_range)
        got = self.method.token_scales(qkv, kv_head, n)
        if got is None:
            return None
        k, v, missing = got
        labels = [_scale_label(lay) for lay in self.method.layouts(self.head_size, bs)]
        note = (f"{self.method.id}: " + "; ".join(lab[1] for lab in labels)
                + " (the method's live cache, read back from the GPU)") + (f"; {missing}" if missing else "")
        return TokenScales(np.asarray(k, np.float64), np.asarray(v, np.float64), labels[0][0], labels[1][0], note)
