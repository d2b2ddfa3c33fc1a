"""Live caches of models with sliding-window layers (Gemma 2/3): a windowed layer's decode attends to the
last W positions only, and its cache holds only those.

`WindowedLiveCache` puts the model's layers into groups, one cache each (built like any live cache by
`make_live_cache`), and routes every call of the decoder to the group of the layer:
  global layers   one cache over the sequence's block table, as for a model without windows;
  window W, ring  the method's own cache over a block table of ceil(W / block_size) blocks, used as a ring:
                  position p is stored in slot p mod W and the decode runs over min(length, W) slots. The
                  paged decode kernels take a block table and a context length and nothing else; a decode
                  step's softmax does not depend on the order of the keys (they carry their RoPE phase), so
                  the ring's slots are exactly the window. For caches whose records depend on their own
                  token alone (`LiveCache.ring_safe`: f32, the per-token int8 and record formats).
  window W, requantised  other methods (KIVI's groups of 32 positions, per-tensor scales): a
                  `RequantCache` that quantises the last W positions, in order, every step.
What the window's caches hold is shown as they are: their attention weights and per-token scales are
those of the last W positions (0 / NaN before), their blocks are the ring's, and the block inspector's
records carry the absolute position each ring slot holds now.
"""
from __future__ import annotations

import numpy as np

from kvviz.errors import InvalidInput
from kvviz.methods.base import KVMethod
from kvviz.methods.live_cache import BlockTable, LiveCache, RequantCache, TokenScales, check_softcap, make_live_cache

_F32 = np.float32


class _Group:
    """Layers sharing one cache: their window (0 = global), the model layers, the cache, its kind."""

    def __init__(self, window: int, layers: list[int], cache: LiveCache, kind: str):
        self.window, self.layers, self.cache, self.kind = window, layers, cache, kind

    @property
    def ring(self) -> bool:
        return self.kind == "ring"


def _ring_table(table: BlockTable, window: int) -> BlockTable:
    """A pool for a ring of `window` positions (never more blocks than the sequence's own pool)."""
    blocks = -(-window // table.block_size)
    extra = 1 if table.policy == "contiguous" else 2  # the other policies leave gaps between the blocks they take
    return BlockTable(min(table.num_blocks, blocks * extra), table.block_size, table.policy, table.seed)


class WindowedLiveCache(LiveCache):
    """One live cache per group of layers (see the module docstring); the LiveCache interface over all."""

    path = "sliding-window layers in a ring of their window, the others as the method keeps them"

    def __init__(self, method, ctx, table: BlockTable, n_layers, n_heads, n_kv_heads, head_size, scale, windows,
                 *, incremental: bool = True, softcap: float = 0.0):
        self.groups: list[_Group] = []
        super().__init__(ctx, table, n_layers, n_heads, n_kv_heads, head_size, scale)
        self.softcap = softcap = check_softcap(softcap)  # every group's (the module docstring of live_cache)
        windows = [int(w) for w in windows]
        if len(windows) != n_layers:
            raise InvalidInput(f"{len(windows)} sliding windows for {n_layers} layers")
        self.windows = tuple(windows)
        args = (n_heads, n_kv_heads, head_size, scale)
        glob = [i for i, w in enumerate(windows) if not w]
        if glob:
            c = make_live_cache(method, ctx, table, len(glob), *args, incremental=incremental, softcap=softcap)
            self.groups.append(_Group(0, glob, c, "global"))
        for w in sorted({w for w in windows if w}):
            layers = [i for i, x in enumerate(windows) if x == w]
            c = make_live_cache(method, ctx, _ring_table(table, w), len(layers), *args, incremental=incremental,
                                softcap=softcap)
            if c.ring_safe:
                self.groups.append(_Group(w, layers, c, "ring"))
                continue
            if not isinstance(method, KVMethod):  # the f32 cache is ring-safe; anything else is a method
                raise InvalidInput(f"a {type(c).__name__} cannot hold a sliding window")
            c = RequantCache(ctx, BlockTable(table.num_blocks, table.block_size, table.policy, table.seed),
                             len(layers), *args, method=method, window=w, layer_ids=layers)
            c.softcap = softcap
            self.groups.append(_Group(w, layers, c, "requantised"))
        self._where = {li: (g, j) for g in self.groups for j, li in enumerate(g.layers)}
        first = self.groups[0].cache
        self.method_id = first.method_id
        self.label = first.label + "; " + "; ".join(
            f"layers with a {g.window}-position window: " + ("a ring of the window's positions" if g.ring else
                                                             "the window re-quantised every step")
            for g in self.groups if g.window)
        if not glob:  # every layer windowed: the table drawn is the first window's ring
            self.table = first.table

    @property
    def length(self) -> int:
        return self._length

    @length.setter
    def length(self, n: int) -> None:
        """Positions written; setting it (a restored step) sets every group's: a ring holds min(n, W)."""
        self._length = int(n)
        for g in self.groups:
            g.cache.length = min(self._length, g.window) if g.ring else self._length

    # -- routing ---------------------------------------------------------------------------------

    def window_of(self, layer: int) -> int:
        return self.windows[layer]

    def group_of(self, layer: int) -> _Group:
        return self._where[int(layer)][0]

    def _segments(self, g: _Group, start: int, t: int):
        """(first index into the t new tokens, count, ring slot) of the writes of positions start..start+t-1
        into ring group g: the last W positions only, split where the ring wraps."""
        w = g.window
        skip = max(0, t - w)
        p, end, out = start + skip, start + t, []
        while p < end:
            r = p % w
            n = min(end - p, w - r)
            out.append((p - start, n, r))
            p += n
        return out

    def write(self, layer, k, v, start):
        g, j = self._where[layer]
        if not g.ring:
            g.cache.write(j, k, v, start)
            return
        for i, n, r in self._segments(g, start, k.shape[1]):
            g.cache.table.ensure(r + n)
            g.cache.write(j, k[:, i:i + n], v[:, i:i + n], r)

    def extend(self, layer, k, v, start):
        g, j = self._where[layer]
        if g.ring:
            self.write(layer, k, v, start)
        else:
            g.cache.extend(j, k, v, start)
        if layer == self.n_layers - 1:
            self.length = start + k.shape[1]

    def attend(self, layer, q, context_len):
        g, j = self._where[layer]
        return g.cache.attend(j, q, min(context_len, g.window) if g.ring else context_len)

    def append_attend(self, layer, q, k, v, pos):
        g, j = self._where[layer]
        if not g.ring or pos < g.window:  # no wrap yet: slot = position, the cache's own fused step
            out = g.cache.append_attend(j, q, k, v, pos)
        else:
            r = pos % g.window
            g.cache.write(j, k[:, None, :], v[:, None, :], r)
            out = g.cache.attend(j, q, g.window)
            g.cache._wrote(j, q, g.window)
        self._wrote(layer, q, pos + 1)
        return out

    def attend_causal(self, layer, q, start):
        """A global layer: its cache's (one prefill dispatch). A windowed layer attends each query over its last W
        positions: its re-quantised window, the decode once a query (each query's window quantised as its decode
        sees it); its ring, one prefill dispatch while it has not wrapped (start + T <= W: its slots are the
        positions, and every query's window reaches back to position 0), the decode for a single query after. A
        chunk of several queries past the wrap is refused: the ring no longer holds the older keys its first
        queries see."""
        g, j = self._where[layer]
        if not g.ring:
            return g.cache.attend_causal(j, q, start)
        # the positions written are the ring's (its own cache checks them), not the global layers' table's
        q = self._causal_query(q, start, written=False)
        T, w = q.shape[0], g.window
        if start + T <= w:
            return g.cache.attend_causal(j, q, start)
        if T == 1:
            return self.attend(layer, q[0], start + 1)[None]
        raise InvalidInput(
            f"layer {layer} has a sliding window of {w} positions, held as a ring of its last {w}: a chunk of {T} "
            f"queries from position {start} sees positions from {max(0, start - w + 1)}, which the ring no longer "
            "holds after the chunk's writes",
            f"Attend chunks that end within the first {w} positions, or one position at a time past them.")

    def weights(self, layer, q, context_len):
        g, j = self._where[layer]
        if not g.ring:
            return g.cache.weights(j, q, context_len)
        n, w = int(context_len), g.window
        m = min(n, w)
        got = np.asarray(g.cache.weights(j, q, m))
        out = np.zeros((got.shape[0], n), got.dtype)
        out[:, self.ring_positions(w, n, m)] = got[:, :m]
        return out

    @staticmethod
    def ring_positions(w: int, n: int, m: int | None = None) -> np.ndarray:
        """The position each of the first m ring slots of a window of w holds when n positions were written."""
        r = np.arange(min(n, w) if m is None else m)
        return r + w * ((n - 1 - r) // w)

    # -- what the caches hold -----------------------------------------------------------------

    def bytes_per_token(self):
        """Bytes a position inside every window costs over all layers (a windowed layer's cache holds at
        most its window)."""
        return float(sum(g.cache.bytes_per_token() for g in self.groups))

    def inspect_block(self, layer, block, kv_head, which="K"):
        g, j = self._where[layer]
        recs = g.cache.inspect_block(j, block, kv_head, which)
        if g.ring:
            n = self.length
            for rec in recs:
                if rec.position >= 0:
                    rec.position = int(self.ring_positions(g.window, n, rec.position + 1)[-1])
        return recs

    def token_scales(self, layer, kv_head):
        g, j = self._where[layer]
        ts = g.cache.token_scales(j, kv_head)
        if ts is None or not g.ring:
            return ts
        n, w = self.length, g.window
        m = min(n, w)
        pos = self.ring_positions(w, n, m)
        k, v = np.full(n, np.nan), np.full(n, np.nan)
        k[pos], v[pos] = np.asarray(ts.k, np.float64)[:m], np.asarray(ts.v, np.float64)[:m]
        note = (ts.note + "; " if ts.note else "") + (f"sliding window of {w}: a ring of {w} slots holds positions "
                                                      f"{n - m}..{n - 1}")
        return TokenScales(k, v, ts.k_label, ts.v_label, note)

    def layer_table(self, layer: int) -> BlockTable:
        """The block table the layer's cache uses (a windowed layer's ring)."""
        return self.group_of(layer).cache.table

    def describe(self) -> dict:
        d = super().describe()
        d["windows"] = [{"window": g.window, "layers": list(g.layers), "kind": g.kind,
                         "blocks": list(g.cache.table.blocks), "label": g.cache.label} for g in self.groups if g.window]
        return d



def make_model_cache(method: str | KVMethod, ctx, table: BlockTable, n_layers: int, n_heads: int, n_kv_heads: int,
                     head_size: int, scale: float, windows=(), incremental: bool = True,
                     softcap: float = 0.0) -> LiveCache:
    """`make_live_cache`, or a WindowedLiveCache when some layer has a sliding window (windows: one a layer,
    0 = global attention); softcap: the model's attention logits soft-cap (0: none)."""
    if windows and any(int(w) for w in windows):
        return WindowedLiveCache(method, ctx, table, n_layers, n_heads, n_kv_heads, head_size, scale, windows,
                                 incremental=incremental, softcap=softcap)
    return make_live_cache(method, ctx, table, n_layers, n_heads, n_kv_heads, head_size, scale, incremental=incremental,
                           softcap=softcap)
