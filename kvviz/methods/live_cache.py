"""Per-method paged KV caches that grow one token at a time, for live decoding of a real model.

One `LiveCache` holds the K/V of every layer of one sequence: one paged pool per layer, all layers
sharing one `BlockTable` (every layer stores the same positions, so one table serves them all).
Blocks are taken from a `BlockAllocator` as the sequence grows, with its policy (contiguous,
scattered, fragmented), so the block table can be drawn as it fills.

Implementations:
  F32PagedCache     'f32'  the f32 baseline writer + f32 paged decode (the reference path)
  MethodPagedCache  a method whose cache is a format of the shared paged kernels (int8_seed: the seed
                    int8 writer + its native paged decode), written and attended token by token
  RequantCache      any other registered method: its whole sequence is quantised again by
                    `method.quantize` every step, then `method.attend` runs. Slow (O(T) per step
                    and per layer) but uses nothing the method does not already expose.
A method offers a faster path through its `live_cache(ctx, table, n_layers, n_heads, n_kv_heads,
head_size, scale)` hook (kvviz/methods/base.py); `make_live_cache` uses it when it returns a cache. What
a method's cache holds (its QuantizedKV device/extra entries) is read only through the method's hooks.

Layouts: `write` takes k, v [n_kv, T, D] (the layout of LlamaRunner's kv_sink), `attend` takes
q [n_heads, D] and returns [n_heads, D] float32, like the runner's attention hook.

Soft-capped attention logits (Gemma 2; `softcap` > 0, set by `make_live_cache`): only the causal prefill kernel
(kvviz/attention/prefill.py) caps the scores, the decode kernels do not. A soft-capped cache attends a chunk with the
prefill as any cache does, and a decode step with the same prefill over one query at the last position (causal
over every cached position: the decode's answer, capped); a cache without a prefill for the shape refuses
(UnsupportedShape) instead of running the uncapped decode. Its attention weights (the weights kernel has no cap) are
not shown: `last_weights` gives None.
"""
from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np

from kvviz.errors import InvalidInput, UnsupportedShape
from kvviz.attention import prefill
from kvviz.attention.paged import check_head_size
from kvviz.gpu.runtime import DeviceRows
from kvviz.methods.base import KVMethod, QuantizedKV, TokenRecord
from kvviz.paging import BlockAllocator, PagedBatch, batch_from_blocks

_F32 = np.float32
log = logging.getLogger("kvviz.live")


@dataclass
class TokenScales:
    """What one layer and KV head of a live cache stores per position, for positions 0..T-1: the
    per-token scale of K and V, or what the method stores in its place (labels say which)."""

    k: np.ndarray  # [T] float64; NaN where the position has none (e.g. KIVI's recent tokens, kept in f32)
    v: np.ndarray
    k_label: str  # axis labels: what the values are
    v_label: str
    note: str = ""  # one line: where the values come from


class BlockTable:
    """The block table of one growing sequence, with blocks taken from a `BlockAllocator` on demand."""

    def __init__(self, num_blocks: int, block_size: int, policy: str = "contiguous", seed: int = 0):
        if block_size <= 0:
            raise InvalidInput(f"block_size must be positive, got {block_size}")
        self.block_size = int(block_size)
        self.num_blocks = int(num_blocks)
        self.policy = policy
        self.seed = seed
        self.allocator = BlockAllocator(num_blocks, policy, seed)
        self.blocks: list[int] = []
        self.events: list[tuple[int, int]] = []  # (position that needed it, block id), in order

    @property
    def capacity(self) -> int:
        return len(self.blocks) * self.block_size

    def ensure(self, n_tokens: int) -> list[int]:
        """Allocate blocks until `n_tokens` positions fit; returns the blocks allocated now."""
        new: list[int] = []
        while self.capacity < n_tokens:
            b = self.allocator.allocate(1)[0]
            self.events.append((self.capacity, b))
            self.blocks.append(b)
            new.append(b)
        return new

    def slots(self, start: int, stop: int) -> np.ndarray:
        if stop > self.capacity:
            raise InvalidInput(f"positions up to {stop} do not fit the {len(self.blocks)} allocated blocks")
        pos = np.arange(start, stop, dtype=np.int64)
        tbl = np.asarray(self.blocks, dtype=np.int64)
        return (tbl[pos // self.block_size] * self.block_size + pos % self.block_size).astype(np.uint32)

    def batch(self, context_len: int) -> PagedBatch:
        """A one-sequence batch over the first `context_len` positions (slot_mapping covers all of them)."""
        need = -(-int(context_len) // self.block_size)
        return batch_from_blocks([self.blocks[:need]], [int(context_len)], self.block_size, self.num_blocks)

    def copy_empty(self) -> "BlockTable":
        """A fresh table on a fresh pool with the same settings (for a forked sequence)."""
        return BlockTable(self.num_blocks, self.block_size, self.policy, self.seed)


class LiveCache(ABC):
    """K/V of all layers of one sequence in a paged GPU cache, written token by token."""

    method_id: str = ""
    label: str = ""
    path: str = ""  # how the cache is kept, in a few words ("re-quantised every step"): `kvviz live`'s cache path
    # Whether each position's record depends on that position's K/V alone, so that the cache can hold a
    # sliding window as a ring (position p in slot p mod W; kvviz/methods/live_window.py)
    ring_safe: bool = False
    softcap: float = 0.0  # the model's attention logits soft-cap (0: none): see the module docstring
    _device_out: bool = False  # inside attend_causal_on_device: a prefill's output stays on the device

    def __init__(self, ctx, table: BlockTable, n_layers: int, n_heads: int, n_kv_heads: int, head_size: int,
                 scale: float):
        self.ctx = ctx
        self.table = table
        self.n_layers, self.n_heads, self.n_kv_heads, self.head_size = n_layers, n_heads, n_kv_heads, head_size
        self.scale = float(scale)
        self.length = 0  # positions written so far (in every layer, once a token has passed all layers)
        self.last_q: list[np.ndarray | None] = [None] * n_layers  # the query of each layer's last attend

    # -- to implement ------------------------------------------------------------------------

    @abstractmethod
    def write(self, layer: int, k: np.ndarray, v: np.ndarray, start: int) -> None:
        """Store k, v [n_kv, T, D] at positions start..start+T-1 (their blocks must be allocated)."""

    @abstractmethod
    def attend(self, layer: int, q: np.ndarray, context_len: int) -> np.ndarray:
        """Decode attention of q [n_heads, D] over positions 0..context_len-1 -> [n_heads, D] f32."""

    @abstractmethod
    def weights(self, layer: int, q: np.ndarray, context_len: int) -> np.ndarray:
        """Attention weights [n_heads, context_len] the decode applies."""

    def attend_causal(self, layer: int, q: np.ndarray, start: int) -> np.ndarray:
        """Causal (chunked-prefill) attention of q [T, n_heads, D] (positions start..start+T-1) over the
        cache's positions 0..start+T-1, which the caller has already written (extend). -> [T, n_heads, D] f32.
        Query t attends to positions 0..start+t.

        This base runs the decode `attend` once a query (T dispatches): the same answer for a cache whose records
        of a position do not depend on later positions. The GPU-backed caches override it with one prefill
        dispatch over the cache as it stands after the chunk's writes (kvviz/attention/prefill.py). A DeviceRows q is
        read back first: the decode takes its queries from the host."""
        if isinstance(q, DeviceRows):
            q = q.read(self.ctx.rt)
        q = self._causal_query(q, start)
        out = np.zeros(q.shape, _F32)
        for t in range(q.shape[0]):
            out[t] = self.attend(layer, q[t], start + t + 1)
        return out

    def attend_causal_on_device(self, layer: int, q: np.ndarray, start: int) -> "np.ndarray | DeviceRows":
        """attend_causal, its output left on the device where it is one prefill's [T, n_heads, D] f32 (DeviceRows:
        submitted, not waited for, so a forward on the device takes it from there without a read-back); else the
        host array attend_causal gives."""
        self._device_out = True
        try:
            return self.attend_causal(layer, q, start)
        finally:
            self._device_out = False

    def _prefill(self, layer: int, q: np.ndarray, start: int, plan) -> np.ndarray:
        """Run `plan(q, batch)` (a method's prefill_plan over the cache of positions 0..start+T-1, or None where it
        has none) and read its output (or, inside attend_causal_on_device, leave it on the device); the decode loop
        where there is no plan or the prefill refuses the shape (a soft-capped cache refuses: its decode has no
        cap)."""
        q = self._causal_query(q, start)
        if not q.shape[0]:
            return q.copy()
        why = ""
        try:
            p = plan(q, self.table.batch(int(start) + q.shape[0]))
        except UnsupportedShape as exc:
            p, why = None, exc.one_line()
        if p is None:
            if self.softcap:
                raise self._no_capped_prefill(why)
            log.info("%s: %s; the decode runs once a query", self.method_id,
                     why or "no prefill kernel for this shape")
            if isinstance(q, DeviceRows):  # the decode loop takes its queries one at a time from the host
                q = q.read(self.ctx.rt)
            return LiveCache.attend_causal(self, layer, q, start)
        if self._device_out and p.head_size in (0, p.shape[2]):
            self.ctx.rt.submit(p.dispatches)
            return DeviceRows(p.out, tuple(p.shape))
        return self.ctx.prefill.run(p)

    def _no_capped_prefill(self, why: str = "") -> UnsupportedShape:
        return UnsupportedShape(
            f"{self.method_id}: a model that soft-caps its attention logits (at {self.softcap:g}) needs the causal "
            "prefill kernel, the only one that caps them, and this cache has none for this shape"
            + (f" ({why})" if why else ""),
            "Use a method and shape the prefill takes (kvviz/attention/prefill.py), e.g. the f32 cache or int8.")

    def _capped_attend(self, plan, q: np.ndarray, batch) -> np.ndarray:
        """The decode step of a soft-capped model: q [n_heads, D] as the one query of the causal prefill
        `plan(q [1, n_heads, D], batch)` at the last position of `batch`, over all its positions -> [n_heads, D]."""
        q1 = np.asarray(q, _F32).reshape(1, self.n_heads, self.head_size)
        why = ""
        try:
            p = None if plan is None else plan(q1, batch)
        except UnsupportedShape as exc:
            p, why = None, exc.one_line()
        if p is None:
            raise self._no_capped_prefill(why)
        return self.ctx.prefill.run(p)[0]

    def _causal_query(self, q, start: int, written: bool = True) -> np.ndarray:
        """q as float32 [T, n_heads, D], checked against the cache's shape and (written) the positions it holds; a
        DeviceRows q (on the device: a prefill binds it in place) by its shape alone."""
        if not isinstance(q, DeviceRows):
            q = np.asarray(q, _F32)
        if len(q.shape) != 3 or tuple(q.shape[1:]) != (self.n_heads, self.head_size):
            raise InvalidInput(f"attend_causal takes q [T, {self.n_heads}, {self.head_size}], got {list(q.shape)}")
        if int(start) < 0:
            raise InvalidInput(f"attend_causal: start must be >= 0, got {start}")
        if written and int(start) + q.shape[0] > self.table.capacity:
            raise InvalidInput(f"attend_causal: positions up to {int(start) + q.shape[0] - 1} are not written "
                               f"(the table holds {self.table.capacity} slots): extend the chunk first")
        return q

    # -- shared --------------------------------------------------------------------------------

    def append_attend(self, layer: int, q: np.ndarray, k: np.ndarray, v: np.ndarray, pos: int) -> np.ndarray:
        """The attention hook's work: store the token's k, v [n_kv, D] at `pos`, attend over 0..pos."""
        self.table.ensure(pos + 1)
        self.write(layer, k[:, None, :], v[:, None, :], pos)
        out = self.attend(layer, q, pos + 1)
        self._wrote(layer, q, pos + 1)
        return out

    def _wrote(self, layer: int, q, context_len: int) -> None:
        self.last_q[layer] = np.array(q, dtype=_F32)
        if layer == self.n_layers - 1:
            self.length = context_len

    def extend(self, layer: int, k: np.ndarray, v: np.ndarray, start: int) -> None:
        """Prefill sink: store k, v [n_kv, T, D] at start.., allocating blocks as needed."""
        self.table.ensure(start + k.shape[1])
        self.write(layer, k, v, start)
        if layer == self.n_layers - 1:
            self.length = start + k.shape[1]

    def takes_device_rows(self) -> bool:
        """Whether extend_on_device can take K/V at all (asked before any is gathered onto the device for it); it can
        still decline a shape its writer refuses. This base takes none."""
        return False

    def extend_on_device(self, layer: int, k: DeviceRows, v: DeviceRows, start: int) -> bool:
        """extend from K/V already on the device: k, v DeviceRows of float32 [T, n_kv, D] (tokens first, the writers'
        layout; e.g. gathered from a GPU forward's activations), bound by the cache's writer in place, never read back.
        True when the writes are submitted; False when this cache cannot take them (nothing written: the caller
        extends from the host instead). This base takes none: a cache takes them only where its writer reads
        device rows as they are. No host check of the values is possible there (a forward that hands them over
        checks its logits for non-finite values)."""
        return False

    def load(self, k_all: np.ndarray, v_all: np.ndarray) -> None:
        """Fill every layer from k, v [L, n_kv, T, D] (positions 0..T-1)."""
        for li in range(self.n_layers):
            self.extend(li, k_all[li], v_all[li], 0)

    def last_weights(self, layer: int) -> np.ndarray | None:
        """Attention weights of the last query seen by `layer` over the current context (for drawing); None for a
        soft-capped model (the weights kernel has no cap: its weights would not be the model's)."""
        q = self.last_q[layer]
        if q is None or self.length == 0 or self.softcap:
            return None
        return self.weights(layer, q, self.length)

    def bytes_per_token(self) -> float:
        """Bytes one token costs in K + V over all layers and KV heads (NaN when unknown)."""
        return float("nan")

    def inspect_block(self, layer: int, block: int, kv_head: int, which: str = "K") -> list[TokenRecord]:
        raise InvalidInput(f"the {self.method_id} live cache cannot show its blocks")

    def token_scales(self, layer: int, kv_head: int) -> TokenScales | None:
        """Per-position K and V scales of one layer and KV head over positions 0..length-1 (None: this
        cache cannot tell). Reads what the cache holds (GPU or the method's host copies), on the
        calling thread: call it where the decoder runs."""
        return None

    def describe(self) -> dict:
        return {"method": self.method_id, "label": self.label, "blocks": list(self.table.blocks), "length": self.length,
                "block_size": self.table.block_size, "num_blocks": self.table.num_blocks,
                "policy": self.table.policy}


def _tokens_major(a: np.ndarray) -> np.ndarray:
    """[n_kv, T, D] -> contiguous float32 [T, n_kv, D] (the writers' layout)."""
    return np.ascontiguousarray(np.asarray(a, dtype=_F32).transpose(1, 0, 2))


class PagedLiveCache(LiveCache):
    """The shared paged kernels (kvviz.attention.paged) in one format: one PagedCache per layer."""

    fmt = "f32"
    ring_safe = True  # per-token records (f32 values; int8 codes with the token's own scale)

    def __init__(self, ctx, table, n_layers, n_heads, n_kv_heads, head_size, scale):
        super().__init__(ctx, table, n_layers, n_heads, n_kv_heads, head_size, scale)
        check_head_size(self.fmt, head_size)
        if n_heads % n_kv_heads:
            raise InvalidInput(f"{n_heads} query heads are not a multiple of {n_kv_heads} KV heads")
        self.layers = [ctx.paged.allocate(self.fmt, table.num_blocks, n_kv_heads, table.block_size, head_size)
                       for _ in range(n_layers)]

    def write(self, layer, k, v, start):
        slots = self.table.slots(start, start + k.shape[1])
        self.ctx.paged.write(self.layers[layer], _tokens_major(k), _tokens_major(v), slots)

    def takes_device_rows(self) -> bool:
        return True

    def extend_on_device(self, layer, k, v, start):
        """The paged writer binds the device rows in place (PagedKernels.write_dispatches); False where it cannot
        (rows over several binding windows, an unaligned binding chunk). No host check of the values (LiveCache)."""
        t = int(k.shape[0])
        self.table.ensure(start + t)
        try:
            d = self.ctx.paged.write_dispatches(self.layers[layer], k, v, self.table.slots(start, start + t))
        except UnsupportedShape as exc:
            log.info("%s: K/V from the host (%s)", self.method_id, exc.one_line())
            return False
        self.ctx.paged.rt.submit(d)  # the attention that reads it waits
        if layer == self.n_layers - 1:
            self.length = start + t
        return True

    def attend(self, layer, q, context_len):
        if self.softcap:
            return self._capped_attend(self._causal_plan(layer), q, self.table.batch(context_len))
        return self.ctx.paged.decode(self.layers[layer], np.asarray(q, _F32)[None], self.table.batch(context_len),
                                     self.scale)[0]

    def weights(self, layer, q, context_len):
        return self.ctx.paged.weights(self.layers[layer], np.asarray(q, _F32)[None],
                                      self.table.batch(context_len), self.scale)[0]

    def _causal_plan(self, layer):
        """plan(q, batch): the prefill over the layer's records (UnsupportedShape where it does not take the shape)."""
        fmt = prefill.F32 if self.fmt == "f32" else prefill.INT8
        cache = self.layers[layer]

        def plan(q, batch):
            why = prefill.unsupported(self.head_size, self.n_heads // self.n_kv_heads)
            if why:
                raise UnsupportedShape(f"prefill: {why}")
            return prefill.plan_records(self.ctx.prefill, fmt, cache.k, cache.v, self.n_kv_heads, q, batch,
                                        [q.shape[0]], self.scale, softcap=self.softcap)

        return plan

    def attend_causal(self, layer, q, start):
        """One prefill dispatch over the paged cache's records (kvviz/attention/prefill.py), where it takes the head
        size; else the decode loop."""
        return self._prefill(layer, q, start, self._causal_plan(layer))

    def append_attend(self, layer, q, k, v, pos):
        if self.softcap:  # the write, then the capped prefill of one query
            return LiveCache.append_attend(self, layer, q, k, v, pos)
        # Writer and decode in one compute pass, one submit: WebGPU orders dispatches of a pass, so
        # the decode sees the token the writer just stored.
        self.table.ensure(pos + 1)
        paged, cache = self.ctx.paged, self.layers[layer]
        w = paged.write_dispatches(cache, np.asarray(k, _F32)[None], np.asarray(v, _F32)[None],
                                   self.table.slots(pos, pos + 1))
        d, outs = paged.decode_dispatches(cache, np.asarray(q, _F32)[None], self.table.batch(pos + 1), self.scale)
        paged.rt.run(w + d)
        out = np.zeros((1, self.n_heads * self.head_size), _F32)
        for idx, buf in outs:
            out[idx] = paged.rt.read(buf, np.float32, (len(idx), self.n_heads * self.head_size))
        self._wrote(layer, q, pos + 1)
        return out.reshape(self.n_heads, self.head_size)

    def bytes_per_token(self):
        return float(self.n_layers * self.layers[0].bytes_per_token())

    def read_positions(self, layer: int, which: str = "K", stop: int | None = None) -> np.ndarray:
        """Raw records of positions 0..stop-1 (default: length) [T, n_kv, words], like `read_tokens`, but
        reading only the sequence's blocks (one read-back per run of consecutive block ids), not the pool."""
        stop = self.length if stop is None else int(stop)
        cache = self.layers[layer]
        buf = cache.k if which == "K" else cache.v
        bs = self.table.block_size
        blocks = self.table.blocks[: -(-stop // bs)]
        spans, i = [], 0
        while i < len(blocks):  # one span a run of consecutive block ids, all read in one round trip
            j = i + 1
            while j < len(blocks) and blocks[j] == blocks[j - 1] + 1:
                j += 1
            spans.append((blocks[i] * cache.block_bytes, (j - i) * cache.block_bytes))
            i = j
        out = self.ctx.paged.rt.read_spans(buf, spans, cache.dtype).reshape((len(blocks),) + cache.shape[1:])
        return out.transpose(0, 2, 1, 3).reshape(len(blocks) * bs, cache.num_kv_heads, cache.wpt)[:stop]

    def read_tokens(self, layer: int, which: str = "K") -> np.ndarray:
        """Raw records of positions 0..length-1: [T, n_kv, words] (u32 for q8, f32 for f32)."""
        full = self.ctx.paged.read(self.layers[layer], "k" if which == "K" else "v")
        sl = self.table.slots(0, self.length).astype(np.int64)
        bs = self.table.block_size
        return full[sl // bs, :, sl % bs, :]


class F32PagedCache(PagedLiveCache):
    method_id = "f32"
    label = "f32 paged baseline (GPU)"
    path = "f32 paged cache (GPU)"
    fmt = "f32"

    def inspect_block(self, layer, block, kv_head, which="K"):
        full = self.ctx.paged.read(self.layers[layer], "k" if which == "K" else "v")
        recs = full[block, kv_head]
        pos = _block_positions(self.table, block, self.length)
        return [TokenRecord(slot=block * self.table.block_size + o, position=int(pos[o]),
                            words=recs[o].view(np.uint32).copy(), fields={"values": recs[o].copy()})
                for o in range(self.table.block_size)]

    def token_scales(self, layer, kv_head):
        amax = [np.abs(self.read_positions(layer, w)[:, kv_head]).max(-1).astype(np.float64) for w in "KV"]
        return TokenScales(amax[0], amax[1], "max |K|", "max |V|",
                           "the f32 cache stores no scale: max |x| of each stored vector")


class MethodPagedCache(PagedLiveCache):
    """A method whose cache is one format of the shared paged kernels (`fmt`, e.g. "q8"): their writer
    and decode run token by token; blocks and per-token scales are read through the method's
    `paged_qkv` / `record_scales` hooks (kvviz/methods/base.py)."""

    path = "appended token by token (GPU)"

    def __init__(self, ctx, table, n_layers, n_heads, n_kv_heads, head_size, scale, *, method: KVMethod, fmt: str,
                 label: str, scales_note: str = ""):
        self.fmt = fmt
        super().__init__(ctx, table, n_layers, n_heads, n_kv_heads, head_size, scale)
        self.method = method
        self.method_id = method.id
        self.label = label
        self.scales_note = scales_note

    def inspect_block(self, layer, block, kv_head, which="K"):
        qkv = self.method.paged_qkv(self.layers[layer])
        return self.method.inspect_block(self.ctx, qkv, self.table.batch(self.length), block, kv_head, which)

    def token_scales(self, layer, kv_head):
        k, v = (np.asarray(self.method.record_scales(self.read_positions(layer, w)[:, kv_head]), np.float64)
                for w in "KV")
        return TokenScales(k, v, "K scale", "V scale", self.scales_note)


class RequantCache(LiveCache):
    """Any registered method, without an incremental writer: the layer's whole sequence is quantised
    again by `method.quantize` each step (host f32 copies of K/V are kept for that), then
    `method.attend` runs over the fresh cache. O(T) GPU work per token and layer: slow but exact
    for every method whose quantisation of a token does not depend on later tokens (KIVI's key groups
    of 32 and its recent window are defined by position, so re-quantising reproduces its streaming
    cache). Each layer quantises with `method.for_layer(layer)` (TurboQuant seeds its rotation per layer;
    `layer_ids` names the model layers when this cache holds some of them only).

    With `window` > 0 the cache holds a sliding-window layer: each step quantises the last `window`
    positions alone, as a sequence of their own (in order), and attends over them; weights and scales
    of the positions before the window are 0 / NaN."""

    path = "re-quantised every step"

    def __init__(self, ctx, table, n_layers, n_heads, n_kv_heads, head_size, scale, method: KVMethod, *,
                 window: int = 0, layer_ids=None):
        super().__init__(ctx, table, n_layers, n_heads, n_kv_heads, head_size, scale)
        method.check(n_heads, n_kv_heads, head_size, table.block_size)
        self.method = method
        self.window = int(window)
        ids = range(n_layers) if layer_ids is None else layer_ids
        self.methods = [method.for_layer(li) for li in ids]
        self.method_id = method.id
        self.label = f"{method.label} (re-quantised every step)"
        cap = table.num_blocks * table.block_size
        self._k = np.zeros((n_layers, cap, n_kv_heads, head_size), _F32)  # [L, pos, n_kv, D]
        self._v = np.zeros_like(self._k)
        self.qkv: list[QuantizedKV | None] = [None] * n_layers  # the method's cache of each layer's last attend
        self._qkv_len = [0] * n_layers
        # the prefill's cache of each layer: (context length, the method's quantize_device result), kept apart from
        # `qkv` (which holds the host fields the panels read)
        self._prefill_qkv: list = [None] * n_layers
        self._on_device: dict = {}  # layer -> (k, v) DeviceRows of positions 0..T-1 not copied into _k / _v yet

    def write(self, layer, k, v, start):
        t = k.shape[1]
        if start + t > self._k.shape[1]:
            raise InvalidInput(f"position {start + t - 1} is past the pool's {self._k.shape[1]} slots")
        self._host_rows(layer)
        self._k[layer, start : start + t] = _tokens_major(k)
        self._v[layer, start : start + t] = _tokens_major(v)
        self._qkv_len[layer] = -1  # stale
        self._prefill_qkv[layer] = None

    def _host_rows(self, layer: int) -> None:
        """The host copies of a layer written from the device (extend_on_device), read back when something needs
        them (a later write, the panels' quantize)."""
        rows = self._on_device.pop(layer, None)
        if rows is not None:
            k, v = rows
            t = k.shape[0]
            self._k[layer, :t] = k.read(self.ctx.rt)
            self._v[layer, :t] = v.read(self.ctx.rt)

    def takes_device_rows(self) -> bool:
        """Without a window, where the method quantises device rows (quantize_device; NVFP4's and TurboQuant's fast
        writers bind them); extend_on_device still declines a piece that does not start the sequence."""
        return not self.window and getattr(self.method, "device_rows_writer", False)

    def extend_on_device(self, layer, k, v, start):
        """The first piece of a sequence (start 0) from the device: the whole sequence so far is these rows, so the
        method quantises them where they are (quantize_device) for the prefill that follows; the host copies are read
        back only if something later needs them. False (nothing written) for a later piece, a window, or where the
        method declines the rows."""
        if not self.takes_device_rows() or int(start) != 0:
            return False
        t = int(k.shape[0])
        self.table.ensure(t)
        if t > self._k.shape[1]:
            raise InvalidInput(f"position {t - 1} is past the pool's {self._k.shape[1]} slots")
        qkv = self.methods[layer].quantize_device(self.ctx, self.table.batch(t), k, v)
        if qkv is None:
            return False
        self._on_device[layer] = (k, v)
        self._qkv_len[layer] = -1
        self._prefill_qkv[layer] = (t, qkv)
        if layer == self.n_layers - 1:
            self.length = t
        return True

    def window_start(self, context_len: int) -> int:
        """The first position a query at context_len - 1 attends to (0 without a window)."""
        return max(0, int(context_len) - self.window) if self.window else 0

    def _quantized(self, layer: int, context_len: int):
        s = self.window_start(context_len)
        batch = self.table.batch(context_len - s)
        if self.qkv[layer] is None or self._qkv_len[layer] != context_len:
            self._host_rows(layer)
            n = context_len
            self.qkv[layer] = self.methods[layer].quantize(self.ctx, batch, np.ascontiguousarray(self._k[layer, s:n]),
                                                   np.ascontiguousarray(self._v[layer, s:n]))
            self._qkv_len[layer] = context_len
        return self.qkv[layer], batch

    def attend(self, layer, q, context_len):
        qkv, batch = self._quantized(layer, context_len)
        if self.softcap:  # over the quantised window (or sequence): the query at its last position sees all of it
            return self._capped_attend(lambda q, b: self.methods[layer].prefill_plan(
                self.ctx, qkv, b, q, [q.shape[0]], self.scale, softcap=self.softcap), q, batch)
        out = self.methods[layer].attend(self.ctx, qkv, batch, np.asarray(q, _F32)[None], self.scale)
        return np.asarray(out, _F32)[0]

    def attend_causal(self, layer, q, start):
        """The method's prefill over its cache of positions 0..start+T-1 (quantised once for that context, as the
        decode at context start+T sees it), one dispatch where it has one. With a window, the decode once a query:
        each query's window is another sequence, quantised as that query's decode sees it."""
        if self.window:
            return LiveCache.attend_causal(self, layer, q, start)

        def plan(q, batch):
            qkv, batch = self._prefill_cache(layer, batch.max_context_len)
            return self.methods[layer].prefill_plan(self.ctx, qkv, batch, q, [q.shape[0]], self.scale,
                                                    softcap=self.softcap)

        return self._prefill(layer, q, start, plan)

    def _prefill_cache(self, layer: int, context_len: int):
        """(qkv, batch) of the layer's positions 0..context_len-1 for the prefill: the device-only cache
        (quantize_device) where the method has one, else quantize's (_quantized). No window here."""
        held = self._prefill_qkv[layer]
        if held is not None and held[0] == context_len:
            return held[1], self.table.batch(context_len)
        if self.qkv[layer] is not None and self._qkv_len[layer] == context_len:
            return self._quantized(layer, context_len)
        self._host_rows(layer)
        batch = self.table.batch(context_len)
        qkv = self.methods[layer].quantize_device(self.ctx, batch, np.ascontiguousarray(self._k[layer, :context_len]),
                                                  np.ascontiguousarray(self._v[layer, :context_len]))
        if qkv is None:
            return self._quantized(layer, context_len)
        self._prefill_qkv[layer] = (context_len, qkv)
        return qkv, batch

    def weights(self, layer, q, context_len):
        qkv, batch = self._quantized(layer, context_len)
        w = np.asarray(self.methods[layer].weights(self.ctx, qkv, batch, np.asarray(q, _F32)[None], self.scale))[0]
        s = self.window_start(context_len)
        if s:
            w = np.concatenate([np.zeros((w.shape[0], s), w.dtype), w], axis=1)
        return w

    def bytes_per_token(self):
        k, v = self.method.layouts(self.head_size, self.table.block_size)
        return float(self.n_layers * self.n_kv_heads * (k.bytes_per_token_per_head + v.bytes_per_token_per_head))

    def inspect_block(self, layer, block, kv_head, which="K"):
        qkv, batch = self._quantized(layer, self.length)
        recs = self.methods[layer].inspect_block(self.ctx, qkv, batch, block, kv_head, which)
        s = self.window_start(self.length)
        for r in recs:  # the window's first position is position 0 of the sequence the method quantised
            if s and r.position >= 0:
                r.position += s
        return recs

    def token_scales(self, layer, kv_head):
        """From the method's QuantizedKV of the layer, through its `token_scales` hook (host copies read
        back from the GPU by its quantize): a per-group or per-channel scale is averaged over the token's
        groups or channels, a method without scales shows what it stores (TurboQuant: the vector norms)."""
        if self.length == 0:
            return None
        qkv, _ = self._quantized(layer, self.length)
        s = self.window_start(self.length)
        got = self.methods[layer].token_scales(qkv, kv_head, self.length - s)
        if got is None:
            return None
        k, v, missing = got
        if s:  # positions before the window are no longer in this layer's cache
            k, v = (np.concatenate([np.full(s, np.nan), np.asarray(a, np.float64)]) for a in (k, v))
            missing = (f"{missing}; " if missing else "") + (f"sliding window of {self.window}: positions before "
                                                             f"{s} have left this layer's cache")
        labels = [_scale_label(lay) for lay in self.method.layouts(self.head_size, self.table.block_size)]
        note = (f"{self.method.id}: " + "; ".join(lab[1] for lab in labels)
                + " (the method's cache, read back from the GPU)")
        if missing:
            note += f"; {missing}"
        return TokenScales(k, v, labels[0][0], labels[1][0], note)


def _scale_label(layout) -> tuple[str, str]:
    """(short axis label, what it is) of what `RequantCache.token_scales` shows for one of K or V."""
    w = layout.which
    fields = {f.name: f for f in layout.fields}
    f = fields.get("scale")
    if f is not None:
        if f.per == "token" or (f.per == "group" and f.count == 1):
            return f"{w} scale", f"{w}: scale per token"
        if f.per == "tensor":
            return f"{w} tensor scale", f"{w}: one scale per tensor"
        if f.per == "group":
            return f"{w} scale (mean)", f"{w}: mean of each token's {f.count} group scales"
        if f.per == "channel-group":
            return f"{w} scale (mean)", f"{w}: mean of the {f.count} per-channel scales of each token's group"
        return f"{w} scale", f"{w}: scale per {f.per}"
    f = fields.get("norm")
    if f is not None:
        return f"|{w.lower()}| norm", f"{w}: no scale, the {f.dtype} norm of each vector"
    return f"{w} scale", f"{w}: scale"


def _block_positions(table: BlockTable, block: int, length: int) -> np.ndarray:
    pos = np.full(table.block_size, -1, dtype=np.int64)
    if block in table.blocks:
        logical = table.blocks.index(block)
        p = logical * table.block_size + np.arange(table.block_size)
        pos = np.where(p < length, p, -1)
    return pos


def _live_method(method: str | KVMethod) -> KVMethod | None:
    """None for 'f32' (the f32 paged baseline), else the method instance; a method is passed built (its
    key resolved and its options parsed by the registry above), never by key."""
    if isinstance(method, str) and method == "f32":
        return None
    if not isinstance(method, KVMethod):
        raise TypeError(f"a live cache takes 'f32' or a KVMethod instance, got {method!r}: build the method "
                        "through the registry (get_method)")
    return method


def check_softcap(softcap) -> float:
    """The attention logits' soft-cap as a float: 0 (none) or positive and finite (InvalidInput otherwise)."""
    c = float(softcap or 0.0)
    if not np.isfinite(c) or c < 0:
        raise InvalidInput(f"the attention soft-cap must be 0 (none) or a positive finite number, got {softcap}")
    return c


def make_live_cache(method: str | KVMethod, ctx, table: BlockTable, n_layers: int, n_heads: int, n_kv_heads: int,
                    head_size: int, scale: float, incremental: bool = True, softcap: float = 0.0) -> LiveCache:
    """The live cache of 'f32' (the f32 paged baseline) or a method instance: the method's own
    `live_cache` when it returns one, else re-quantisation of the whole sequence every step.
    incremental=False forces the re-quantising path for every method except 'f32' (a cross-check).
    softcap: the model's attention logits soft-cap (0: none; the module docstring says how it attends)."""
    cap = check_softcap(softcap)
    cache = _make_live_cache(method, ctx, table, n_layers, n_heads, n_kv_heads, head_size, scale, incremental)
    cache.softcap = cap
    return cache


def _make_live_cache(method, ctx, table, n_layers, n_heads, n_kv_heads, head_size, scale, incremental):
    args = (ctx, table, n_layers, n_heads, n_kv_heads, head_size, scale)
    m = _live_method(method)
    if m is None:
        return F32PagedCache(*args)
    if incremental:
        own = m.live_cache(*args)
        if own is not None:
            return own
        log.info("live cache of %s: the method has no incremental cache; its whole sequence is quantised "
                 "again every step", m.id)
    return RequantCache(*args, method=m)


def cache_path_name(kind: str) -> str:
    """The `path` of the LiveCache class named `kind` (a run's `quant_cache_kind`), or `kind` itself."""
    todo = [LiveCache]
    while todo:
        cls = todo.pop()
        if cls.__name__ == kind and cls.path:
            return cls.path
        todo += cls.__subclasses__()
    return str(kind)


def cache_kind(method: str | KVMethod) -> str:
    """'native' (the f32 baseline or the method's own incremental cache) or 'requant': the path
    `make_live_cache` takes for 'f32' or a method instance."""
    m = _live_method(method)
    return "native" if m is None or m.has_live_cache else "requant"
