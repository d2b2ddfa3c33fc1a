"""The live cache of the vLLM-style FP8 methods (kvviz/families/fp8_vllm/method.py): written token by token,
with the scales calibrated once and FROZEN, as a serving engine does (on the first write's positions below
calib_tokens when the method sets it).

Per layer: the FP8 code cache (u32 records of D/4 words), its side buffers (kvviz.families.fp8_vllm.kernels.
ScaleBuffers: amax, scales, saturation counters) and an f32 paged cache the dequantiser fills block by
block; attention runs through the f32 paged decode over it. With scales="calibrate" the FIRST write of a
layer calibrates (amax over the rows written / fp8_max): in live decode that is the prompt's prefill
(kvviz/live/decode.py: every prompt token but the last, batched), so every later token is quantised with
the prompt's scales and whatever exceeds the prompt's range saturates. The writer counts saturated
elements per layer, K/V and KV head; `token_scales` (the live cache view) and `describe` say how many.
A forked free-running path (decode.py LivePath.fork) gets a fresh cache filled from the whole f32 history
in one write: it calibrates on that history (prompt and the tokens generated before the fork).
"""
from __future__ import annotations

import numpy as np

from kvviz.families.fp8_vllm import kernels as fk
from kvviz.attention import records as qk
from kvviz.methods.live_cache import LiveCache, TokenScales, _tokens_major
from kvviz.methods.base import QuantizedKV

_F32 = np.float32


class _LayerQKV:
    """cache.qkv[layer]: the method's QuantizedKV view of one layer (scales per token row, saturation)."""

    def __init__(self, cache: "VllmFp8LiveCache"):
        self._c = cache

    def __getitem__(self, layer: int) -> QuantizedKV:
        return self._c.layer_qkv(int(layer))

    def __len__(self) -> int:
        return self._c.n_layers


class VllmFp8LiveCache(LiveCache):
    path = "appended, scales frozen (GPU)"  # kvviz live's cache path

    def __init__(self, ctx, table, n_layers, n_heads, n_kv_heads, head_size, scale, *, method):
        super().__init__(ctx, table, n_layers, n_heads, n_kv_heads, head_size, scale)
        method.check(n_heads, n_kv_heads, head_size, table.block_size)
        self.method = method
        self.method_id = method.id
        self.label = f"{method.label} (incremental; scales frozen after the first write)"
        rt = ctx.rt
        words = table.num_blocks * n_kv_heads * table.block_size * method.wpt(head_size)
        self.layers = []
        for li in range(n_layers):
            k = qk.alloc_words(rt, words, f"{method.id}_k_cache_l{li}")
            v = qk.alloc_words(rt, words, f"{method.id}_v_cache_l{li}")
            qc = qk.QuantCache(method.id, table.num_blocks, n_kv_heads, table.block_size, head_size,
                               table.block_size * method.wpt(head_size), table.block_size * method.wpt(head_size), k, v)
            bufs = fk.ScaleBuffers.allocate(rt, n_kv_heads, method.given, f"{method.id}_l{li}")
            f32c = ctx.paged.allocate("f32", table.num_blocks, n_kv_heads, table.block_size, head_size)
            qc.extra["scales"] = bufs  # where the method's prefill finds the scales (as after its quantize)
            if not method.per_head:
                qc.extra["tensor"] = bufs.tensor
            self.layers.append((qc, bufs, f32c))
        # positions [a, b) each layer calibrated on (None: not yet; given scales need none)
        self.calibrated_on: list[tuple[int, int] | None] = [None] * n_layers
        self.qkv = _LayerQKV(self)

    def write(self, layer, k, v, start):
        rt, m = self.ctx.rt, self.method
        qc, bufs, f32c = self.layers[layer]
        kt, vt = _tokens_major(k), _tokens_major(v)
        T = kt.shape[0]
        if not T:
            return
        slots = self.table.slots(start, start + T).astype(np.int64)
        ds = []
        if m.given is None and self.calibrated_on[layer] is None:
            pos = np.arange(start, start + T)
            cal = fk.calibration_slots(slots, pos, m.calib_tokens)
            ds += fk.calibrate_dispatches(rt, bufs, kt, vt, cal, m.fmt, m.per_head)
            stop = start + T if not m.calib_tokens else min(start + T, max(start, m.calib_tokens))
            self.calibrated_on[layer] = (int(start), int(stop))
        ds += fk.write_dispatches(rt, qc, bufs, kt, vt, slots, m.fmt, m.per_head)
        bs = self.table.block_size
        blocks = sorted({self.table.blocks[p // bs] for p in range(start, start + T)})
        items = np.array([(b, 0, 0, 0) for b in blocks], np.uint32).reshape(-1, 4)
        ds += fk.dequant_dispatches(self.ctx, qc, bufs, f32c, None, m.fmt, m.per_head, items=items)
        rt.run(ds)

    def attend(self, layer, q, context_len):
        if self.softcap:
            return self._capped_attend(self._causal_plan(layer), q, self.table.batch(context_len))
        return self.ctx.paged.decode(self.layers[layer][2], np.asarray(q, _F32)[None], self.table.batch(context_len),
                                     self.scale)[0]

    def _causal_plan(self, layer):
        m, qc = self.method, self.layers[layer][0]
        e = np.zeros(0)
        qkv = QuantizedKV(m, self.head_size, self.n_kv_heads, e, e, e, e, m.code_range, device={"cache": qc})
        return lambda q, batch: m.prefill_plan(self.ctx, qkv, batch, q, [q.shape[0]], self.scale, softcap=self.softcap)

    def attend_causal(self, layer, q, start):
        """The method's prefill over the FP8 codes in place with the frozen scales (one dispatch), not over the f32
        copy the decode reads."""
        return self._prefill(layer, q, start, self._causal_plan(layer))

    def weights(self, layer, q, context_len):
        return self.ctx.paged.weights(self.layers[layer][2], np.asarray(q, _F32)[None],
                                      self.table.batch(context_len), self.scale)[0]

    def bytes_per_token(self):
        return float(self.n_layers * self.n_kv_heads * 2 * self.method.wpt(self.head_size) * 4)

    # ------------------------------------------------------------------ what the cache holds
    def side(self, layer: int) -> dict:
        """amax / scales [2, kvh] f32 and saturated [2, kvh] counts of one layer, read from the GPU."""
        return self.layers[layer][1].read(self.ctx.rt)

    def head_scales(self, layer: int) -> tuple[np.ndarray, np.ndarray]:
        sc = self.side(layer)["scales"]
        g = np.arange(self.n_kv_heads) if self.method.per_head else np.zeros(self.n_kv_heads, np.int64)
        return sc[0][g], sc[1][g]

    def saturated(self) -> np.ndarray:
        """[layers, 2 (K, V), kv_heads] elements saturated so far."""
        return np.stack([self.side(li)["saturated"] for li in range(self.n_layers)])

    def layer_qkv(self, layer: int) -> QuantizedKV:
        m, n = self.method, self.length
        side = self.side(layer)
        ks, vs = self.head_scales(layer)
        qkv = QuantizedKV(m, self.head_size, self.n_kv_heads, None, None,
                          np.broadcast_to(ks, (n, self.n_kv_heads)).astype(_F32),
                          np.broadcast_to(vs, (n, self.n_kv_heads)).astype(_F32), m.code_range,
                          device={"cache": self.layers[layer][0], "f32": self.layers[layer][2]},
                          extra={"head_scales": (ks, vs), "amax": side["amax"], "saturated": side["saturated"]})
        qkv.warnings = m.saturation_warnings(side["saturated"], n * self.n_kv_heads * self.head_size,
                                             self._where(layer))
        return qkv

    def _where(self, layer: int) -> str:
        on = self.calibrated_on[layer]
        return "" if on is None else f"positions {on[0]}..{on[1] - 1}, then frozen"

    def token_scales(self, layer, kv_head):
        n = self.length
        if n == 0:
            return None
        side = self.side(layer)
        ks, vs = self.head_scales(layer)
        per = "per-head" if self.method.per_head else "per-tensor"
        if self.method.given is not None:
            src = "given"
        else:
            on = self.calibrated_on[layer]
            src = "not calibrated yet" if on is None else f"calibrated on positions {on[0]}..{on[1] - 1} (prefill), frozen"
        sk, sv = (int(x) for x in side["saturated"][:, kv_head])
        note = (f"{self.method_id}: {per} scale {src}; saturated so far in this layer and KV head: "
                f"K {sk}, V {sv} of {n * self.head_size} values")
        return TokenScales(np.full(n, float(ks[kv_head])), np.full(n, float(vs[kv_head])), "K scale", "V scale", note)

    def inspect_block(self, layer, block, kv_head, which="K"):
        return self.method.inspect_block(self.ctx, self.layer_qkv(layer), self.table.batch(self.length), block,
                                         kv_head, which)

    def warnings(self) -> list[str]:
        sat = self.saturated()
        return self.method.saturation_warnings(sat.sum(axis=0), self.n_layers * self.length * self.n_kv_heads * self.head_size,
                                               "every layer's first write, then frozen")

    def describe(self) -> dict:
        d = super().describe()
        sat = self.saturated()
        d.update(saturated_k=int(sat[:, 0].sum()), saturated_v=int(sat[:, 1].sum()), warnings=self.warnings(),
                 calibrated_on=[None if c is None else list(c) for c in self.calibrated_on])
        return d
