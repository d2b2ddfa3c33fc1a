"""KIVI's live cache (kvviz/families/kivi/method.py, layout kvviz/families/kivi/format.py), appended token by token.

A step at position p (length L = p + 1) writes only what KIVI writes when a token arrives:
  - the new token's K and V go into the f32 residual window (row p - n_q), through the method's token
    writer (one row);
  - when L makes n_q = floor(max(L - recent, 0)/32)*32 grow by one group, exactly that key group is
    quantised (K per channel over its 32 rows, the (scale, zero) side words) and those 32 tokens' V codes
    are written, by the method's writers, from the f32 rows this cache keeps on the host; the residual
    window (at most recent + 31 rows) is written again from row 0, because the method's layout keeps
    residual row r = position - n_q. That is O(recent) rows once every 32 steps, constant in L.
So the writer's work per step does not grow with the sequence. The buffers are the method's own layout
(K codes + paged side stream, V records, residual rows res[rows, 2, kv_heads, D], info = seq_info + block
table), one set per layer, sized for the table's pool; after a step they hold the words the method's
whole-sequence `quantize` writes for the same positions (tests/test_live_kivi.py).

Attention: the method's dequantise kernel keeps a per-layer f32 paged cache up to date block by block
(only the blocks whose values changed: the new token's, and on a group step the group's and the
window's; Kivi.weights and the first-wave decode read it). The decode is the method's, over a QuantizedKV
view of these buffers (device "cache": the QuantCache with extra res / info / plan, as Kivi._prepare sets
them; device "f32"), recorded in the step's submit after the writer where the cache can:
  - the method's fast decode plan (Kivi._fast_plan(ctx, qc, batch, q_padded, scale), the split-K decode
    over the packed cache) where the method has one for the shape;
  - else, once the method's attend was seen reading the f32 cache (KIVI's first-wave decode), the f32
    paged decode over it (q padded to the kernels' head size, the output cut back, as Kivi.attend does);
  - else the method's own `attend`, after the writer's submit (decode_path says which ran).
`RequantCache` (kvviz/methods/live_cache.py), which quantises the whole sequence again each step, is the
cross-check (`make_live_cache(..., incremental=False)`): the same words, the same outputs bit for bit.

Rewrites: writing again from a position p < L (the live decoder retries a cancelled step at the same
position; a prefill restarted at 0) rolls the layer back to p first. The host keeps the f32 rows of the
last quantised group and of the residual window, so one step (or any p whose group is still kept) can be
rolled back; an older position raises InvalidInput.
"""
from __future__ import annotations

import numpy as np

from kvviz.errors import InvalidInput
from kvviz.families.kivi import format as layout
from kvviz.families.int4.format import unpack_codes
from kvviz.attention import records as qk
from kvviz.families.kivi import kernels as kivi_kernels
from kvviz.methods.live_cache import LiveCache, TokenScales, _scale_label, _tokens_major
from kvviz.methods.base import QuantizedKV
from kvviz.paging import PAD_SLOT

_F32 = np.float32
GROUP = layout.GROUP
BT_OFF = 4  # info: [context_len, n_q, res_off, 0 | block table]: one sequence


class _Device(dict):
    """A QuantizedKV.device that notes whether the method read the dequantised f32 cache."""

    read_f32 = False

    def __getitem__(self, key):
        if key == "f32":
            self.read_f32 = True
        return dict.__getitem__(self, key)

    def get(self, key, default=None):
        if key == "f32":
            self.read_f32 = True
        return dict.get(self, key, default)


class _Layer:
    """One layer's buffers and where its sequence stands."""

    def __init__(self, qc, f32c):
        self.qc = qc  # the method's QuantCache: k, v; extra: res, info, plan (the method's names)
        self.f32 = f32c  # the dequantised f32 paged cache (kept up to date block by block)
        self.n = 0  # positions held
        self.nq = 0  # quantised positions [0, nq)
        self.h0 = 0  # position of the first host row
        self.hk = self.hv = None  # host f32 rows [h0, n) (padded head): last quantised group + window
        self.bt_n = 0  # block-table entries uploaded to info
        self.dirty = False  # after a roll-back: the GPU residual rows must be written again


class KiviLiveCache(LiveCache):
    path = "appended, key groups as they fill (GPU)"  # kvviz live's cache path

    def __init__(self, ctx, table, n_layers, n_heads, n_kv_heads, head_size, scale, *, method):
        super().__init__(ctx, table, n_layers, n_heads, n_kv_heads, head_size, scale)
        method.check(n_heads, n_kv_heads, head_size, table.block_size)
        self.method = method
        self.method_id = method.id
        rt = ctx.rt
        self.Dp = Dp = method.padded_head(head_size)
        nb, bs, kvh = table.num_blocks, table.block_size, n_kv_heads
        self.kw = layout.kw(Dp, method.bits)
        self.kstride = layout.k_stride(Dp, bs, method.bits)
        self.res_rows = int(method.recent) + GROUP  # the window never holds more than recent + 31 rows
        self.layers: list[_Layer] = []
        for li in range(n_layers):
            qc = qk.QuantCache(method.id, nb, kvh, bs, Dp, self.kstride, bs * (self.kw + 2),
                               qk.alloc_words(rt, nb * kvh * self.kstride, f"kivi_live_k_l{li}"),
                               qk.alloc_words(rt, nb * kvh * bs * (self.kw + 2), f"kivi_live_v_l{li}"))
            qc.extra.update(res=qk.alloc_words(rt, self.res_rows * 2 * kvh * Dp, f"kivi_live_residual_l{li}"),
                            info=qk.alloc_words(rt, BT_OFF + nb, f"kivi_live_info_l{li}"),
                            plan=layout.plan([0], method.recent), bt_off=BT_OFF, mbs=nb)
            self.layers.append(_Layer(qc, ctx.paged.allocate("f32", nb, kvh, bs, Dp)))
        self._dequant = rt.compile(kivi_kernels.KIVI_DEQUANT, BITS=method.bits)
        # None: not known yet; True: the method's attend reads the f32 cache (fused into the step's submit)
        self.attend_reads_f32: bool | None = None
        self.fuse_fast = True  # False: never take the method's fast decode plan into the step's submit
        self.decode_path = ""  # the decode the last attend ran: "fast", "first-wave" or "the method's attend"
        self.last_write: dict = {}  # what the last write dispatched (rows of the token writer, group rows)
        self.label = f"{method.label}, appended token by token (a key group quantised when it fills)"

    # ---------------------------------------------------------------- writing
    def _pos_limit_pool(self, stop: int) -> None:
        cap = self.table.num_blocks * self.table.block_size
        if stop > cap:
            raise InvalidInput(f"position {stop - 1} is past the pool's {cap} slots "
                               f"({self.table.num_blocks} blocks of {self.table.block_size})")

    def _pos_limit(self, stop: int) -> None:
        self._pos_limit_pool(stop)
        if stop > self.table.capacity:
            raise InvalidInput(f"position {stop - 1} is past the {self.table.capacity} slots of the "
                               f"{len(self.table.blocks)} allocated blocks")

    def _rollback(self, st: _Layer, start: int) -> None:
        nq = layout.n_quantised(start, self.method.recent)
        if nq < st.h0:
            raise InvalidInput(
                f"kivi live cache: cannot write position {start} again: the f32 rows from position {nq} "
                f"(its residual window) are no longer kept (kept from {st.h0})",
                "Write the sequence again from position 0.")
        st.hk, st.hv = st.hk[: start - st.h0], st.hv[: start - st.h0]
        st.n, st.nq, st.dirty = start, nq, True

    def _writer(self, layer: int, kt: np.ndarray, vt: np.ndarray, start: int):
        """(writer dispatches, first changed position) of storing kt, vt [T, n_kv, D] (tokens major,
        float32) at start.. in `layer`, and the host state after it."""
        m, rt, st = self.method, self.ctx.rt, self.layers[layer]
        kt, vt = qk.check_kv(kt, vt, self.n_kv_heads, self.head_size)
        qk.check_magnitude("key", kt)
        qk.check_magnitude("value", vt)
        kt, vt = m._pad(kt, vt)
        T = kt.shape[0]
        stop = start + T
        self._pos_limit(stop)
        if start == 0:
            st.n = st.nq = st.h0 = 0
            st.hk = st.hv = None
            st.dirty = False
        elif start < st.n:
            self._rollback(st, start)
        elif start > st.n:
            raise InvalidInput(f"kivi live cache: layer {layer} holds {st.n} positions, cannot write at {start}: "
                               "KIVI's key groups need every position, in order")
        R = int(m.recent)
        nq0, nq1 = st.nq, layout.n_quantised(stop, R)
        if st.hk is None:
            hk, hv = kt, vt
        else:
            hk, hv = np.concatenate([st.hk, kt]), np.concatenate([st.hv, vt])  # rows [h0, stop)
        full = nq1 != nq0 or st.dirty or start == 0
        first = nq0 if full else start  # the token writer's rows: new rows, or group rows + whole window
        rows_k = np.ascontiguousarray(hk[first - st.h0 :])
        rows_v = np.ascontiguousarray(hv[first - st.h0 :])
        pos = np.arange(first, stop, dtype=np.int64)
        slots = np.ascontiguousarray(self.table.slots(first, stop), dtype=np.uint32)
        row_res = np.where(pos >= nq1, pos - nq1, PAD_SLOT).astype(np.uint32)
        ng0, ng1 = nq0 // GROUP, nq1 // GROUP
        groups = [(0, g, 0, 0) for g in range(ng0, ng1)]
        grows = [np.arange(g * GROUP - first, (g + 1) * GROUP - first) for g in range(ng0, ng1)]

        qc = st.qc
        # info: (context_len, n_q, res_off 0, 0) and the block table's new entries
        rt.write(qc.extra["info"], np.array([stop, nq1, 0, 0], np.uint32))
        nblk = len(self.table.blocks)
        if st.bt_n < nblk:
            rt.write(qc.extra["info"], np.asarray(self.table.blocks[st.bt_n :], np.uint32),
                     offset=(BT_OFF + st.bt_n) * 4)
            st.bt_n = nblk
        qc.extra["plan"] = layout.plan([stop], R)
        qc.extra["writer_args"] = (rows_k, rows_v, slots, row_res, qc.extra["res"], qc.extra["info"], groups, grows,
                                   BT_OFF, self.table.num_blocks)
        d, qc.extra["writer_impl"] = m._writer(self.ctx, qc, m.writer_impl)
        self.last_write = {"layer": layer, "start": start, "stop": stop, "token_rows": len(rows_k),
                           "group_rows": GROUP * len(groups), "residual_rows": int((pos >= nq1).sum()),
                           "groups": [g for _, g, _, _ in groups], "dispatches": d}
        # host state: keep rows from the last quantised group on (one step can be rolled back)
        keep = max(0, nq1 - GROUP)
        keep = max(keep, st.h0)
        st.hk, st.hv = hk[keep - st.h0 :].copy(), hv[keep - st.h0 :].copy()
        st.h0, st.n, st.nq, st.dirty = keep, stop, nq1, False
        return d, first

    def _dequant_dispatches(self, layer: int, first: int, stop: int):
        """The method's dequantise kernel over the blocks of positions [first, stop) into the layer's f32 cache."""
        st, bs = self.layers[layer], self.table.block_size
        if stop <= first:
            return []
        lbs = range(first // bs, (stop - 1) // bs + 1)
        items = np.array(sorted((self.table.blocks[lb], 0, lb, 0) for lb in lbs), np.uint32).reshape(-1, 4)
        qc, kern = st.qc, self._dequant
        ins = [qc.k, qc.v, qc.extra["res"], qc.extra["info"]]
        return qk.dequant_dispatches(
            self.ctx, kern, ins, st.f32, self.table.batch(stop),
            lambda w0: kern.pack(self.n_kv_heads, self.Dp, bs, self.kstride, BT_OFF, self.table.num_blocks, w0),
            items=items)

    def _write_dispatches(self, layer, k, v, start):
        kt, vt = _tokens_major(k), _tokens_major(v)
        d, first = self._writer(layer, kt, vt, start)
        return d + self._dequant_dispatches(layer, first, start + kt.shape[0])

    def write(self, layer, k, v, start):
        self.ctx.rt.run(self._write_dispatches(layer, k, v, start))

    # ---------------------------------------------------------------- attention
    def _view(self, layer: int) -> QuantizedKV:
        st = self.layers[layer]
        return QuantizedKV(self.method, self.head_size, self.n_kv_heads, None, None, None, None,
                           (0, self.method.levels), device=_Device(cache=st.qc, f32=st.f32))

    def _check_len(self, layer: int, context_len: int) -> None:
        n = self.layers[layer].n
        if int(context_len) != n:
            raise InvalidInput(f"kivi live cache: layer {layer} holds {n} positions; KIVI's cache of a shorter "
                               f"context ({context_len}) is another cache (other tokens quantised): "
                               f"attend over all {n}")

    def _fused(self, layer: int, q: np.ndarray, batch):
        """(dispatches, read) of the decode the method's attend runs, for the step's submit, or None (then the
        method's attend runs after the writer's submit): the method's fast decode plan where it has one for
        the shape (Kivi._fast_plan: the split-K decode over the packed cache), else, once the method's attend
        was seen reading the dequantised f32 cache, its first-wave decode (the f32 paged decode over that
        cache, q padded to the kernels' head size, the output cut back), as Kivi.attend runs them."""
        rt, H, D0 = self.ctx.rt, self.n_heads, self.head_size
        qp = self.method._pad_q(np.asarray(q, _F32)[None], self.Dp)
        fast = getattr(self.method, "_fast_plan", None)
        if fast is not None and self.fuse_fast:
            plan = fast(self.ctx, self.layers[layer].qc, batch, qp, self.scale)
            if plan is not None:
                self.decode_path = "fast"
                return plan.dispatches, lambda: rt.read(plan.out, np.float32, plan.shape)[0, :, :D0]
        if not self.attend_reads_f32:
            return None
        self.decode_path = "first-wave"
        paged = self.ctx.paged
        d, outs = paged.decode_dispatches(self.layers[layer].f32, qp, batch, self.scale)
        return d, lambda: paged._collect(outs, 1, H * self.Dp, (H, self.Dp))[0, :, :D0]

    def _method_attend(self, layer: int, q: np.ndarray, batch) -> np.ndarray:
        self.decode_path = "the method's attend"
        qkv = self._view(layer)
        out = self.method.attend(self.ctx, qkv, batch, np.asarray(q, _F32)[None], self.scale)
        if self.attend_reads_f32 is None:
            self.attend_reads_f32 = bool(qkv.device.read_f32)
        return np.asarray(out, _F32)[0]

    def attend(self, layer, q, context_len):
        self._check_len(layer, context_len)
        batch = self.table.batch(context_len)
        if self.softcap:
            return self._capped_attend(self._causal_plan(layer), q, batch)
        fused = self._fused(layer, q, batch)
        if fused is None:
            return self._method_attend(layer, q, batch)
        self.ctx.rt.run(fused[0])
        return fused[1]()

    def attend_causal(self, layer, q, start):
        """The method's prefill over the layer's packed cache in place (one dispatch). KIVI's cache of a context is
        its own (the key groups and the window depend on it): the layer must hold exactly start + T positions."""
        self._check_len(layer, int(start) + np.shape(q)[0])
        return self._prefill(layer, q, start, self._causal_plan(layer))

    def _causal_plan(self, layer):
        return lambda q, batch: self.method.prefill_plan(self.ctx, self._view(layer), batch, q, [q.shape[0]],
                                                         self.scale, softcap=self.softcap)

    def append_attend(self, layer, q, k, v, pos):
        self._pos_limit_pool(pos + 1)
        if self.softcap:  # the write, then the capped prefill of one query
            return LiveCache.append_attend(self, layer, q, k, v, pos)
        self.table.ensure(pos + 1)
        w = self._write_dispatches(layer, k[:, None, :], v[:, None, :], pos)
        batch = self.table.batch(pos + 1)
        fused = self._fused(layer, q, batch)
        if fused is not None:  # writer, dequantise and decode in one submit (WebGPU orders the dispatches)
            self.ctx.rt.run(w + fused[0])
            out = fused[1]()
        else:
            self.ctx.rt.run(w)
            out = self._method_attend(layer, q, batch)
        self._wrote(layer, q, pos + 1)
        return out

    def extend(self, layer, k, v, start):
        self._pos_limit_pool(start + k.shape[1])
        super().extend(layer, k, v, start)

    def last_weights(self, layer):
        # A cancelled step (restored by the decoder) can leave a layer one token ahead of `length`: its
        # cache is then another context's, so there are no weights of the last complete step to show.
        if self.layers[layer].n != self.length:
            return None
        return super().last_weights(layer)

    def weights(self, layer, q, context_len):
        self._check_len(layer, context_len)
        out = self.method.weights(self.ctx, self._view(layer), self.table.batch(context_len),
                                  np.asarray(q, _F32)[None], self.scale)
        return np.asarray(out)[0]

    # ---------------------------------------------------------------- what it holds
    def bytes_per_token(self):
        k, v = self.method.layouts(self.head_size, self.table.block_size)
        return float(self.n_layers * self.n_kv_heads * (k.bytes_per_token_per_head + v.bytes_per_token_per_head))

    def layer_qkv(self, layer: int) -> QuantizedKV:
        """The method's QuantizedKV of one layer, as its `quantize` returns it for the same positions: host
        codes, scales and zeros read back from this cache's buffers, side streams, residual rows."""
        m, st = self.method, self.layers[layer]
        n, nq, Dp, D0, kvh = st.n, st.nq, self.Dp, self.head_size, self.n_kv_heads
        bs, nb, KW = self.table.block_size, self.table.num_blocks, self.kw
        batch = self.table.batch(n)
        qkv = self._view(layer)
        bufs = m.read_buffers(self.ctx, qkv)
        kbuf, vbuf = bufs["k"], bufs["v"]
        sm = self.table.slots(0, n).astype(np.int64)
        blk, off = sm // bs, sm % bs
        kc = kbuf[:, :, : bs * KW].reshape(nb, kvh, bs, KW)
        vr = vbuf.reshape(nb, kvh, bs, KW + 2)
        k_codes = unpack_codes(kc[blk, :, off], m.bits).astype(np.int32)
        v_codes = unpack_codes(vr[blk, :, off, :KW], m.bits).astype(np.int32)
        v_scale = np.ascontiguousarray(vr[blk, :, off, KW]).view(np.float32)
        v_zero = np.ascontiguousarray(vr[blk, :, off, KW + 1]).view(np.float32)
        streams = m.side_streams(batch, kbuf, kvh, Dp)
        k_scale = np.zeros((n, kvh, Dp), np.float32)
        k_zero = np.zeros((n, kvh, Dp), np.float32)
        if nq:
            s = streams[0][:, np.arange(nq) // GROUP]  # [kvh, nq, D, 2]
            k_scale[:nq] = s[..., 0].transpose(1, 0, 2)
            k_zero[:nq] = s[..., 1].transpose(1, 0, 2)
        p = np.arange(n)
        residual = p >= nq
        row_res = np.where(residual, p - nq, PAD_SLOT).astype(np.uint32)
        qkv.k_codes, qkv.v_codes = k_codes[..., :D0], v_codes[..., :D0]
        qkv.k_scales, qkv.v_scales = k_scale[..., :D0], v_scale
        qkv.extra.update(k_zeros=k_zero[..., :D0], v_zeros=v_zero, residual=residual, row_res=row_res,
                         plan=st.qc.extra["plan"], side_streams=streams, buffers=bufs,
                         ws=layout.ws(Dp, bs), padded_head=Dp)
        return qkv

    def inspect_block(self, layer, block, kv_head, which="K"):
        return self.method.inspect_block(self.ctx, self.layer_qkv(layer), self.table.batch(self.layers[layer].n),
                                         block, kv_head, which)

    def token_scales(self, layer, kv_head):
        n = min(self.length, self.layers[layer].n)
        if n == 0:
            return None
        got = self.method.token_scales(self.layer_qkv(layer), kv_head, n)
        if got is None:
            return None
        k, v, missing = got
        labels = [_scale_label(lay) for lay in self.method.layouts(self.head_size, self.table.block_size)]
        note = (f"{self.method.id}: " + "; ".join(lab[1] for lab in labels)
                + " (the method's live cache, read back from the GPU)") + (f"; {missing}" if missing else "")
        return TokenScales(np.asarray(k, np.float64), np.asarray(v, np.float64), labels[0][0], labels[1][0], note)

    def describe(self) -> dict:
        d = super().describe()
        d.update(n_quantised=[st.nq for st in self.layers], residual_rows=[st.n - st.nq for st in self.layers],
                 decode=self.decode_path)
        return d
