"""Host launchers of the paged-cache kernels: the seed int8 writer and decode, the f32 baseline
writer and decode, and the attention-weights kernel for both formats.

Kernel family "paged" (kvviz/families/catalogue.py): shaders in shaders/attention/, kernel specs below, numpy
reference kvviz/attention/paged_oracle.py, tests tests/test_paged_conformance.py.

Everything is checked on the host before dispatch (shapes, dtypes, NaN/Inf, head sizes, block ids):
out-of-bounds reads on a GPU return 0 silently. Device limits are handled rather than hit:
  - more than 65535 tokens (the grid limit) -> the writer is dispatched in chunks;
  - a pool larger than the storage-binding limit -> bound one window of blocks at a time, each
    dispatch seeing only the sequences / tokens whose blocks lie in its window.
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import numpy as np

from kvviz.errors import DeviceLimitError, InvalidInput, UnsupportedShape, require_f32
from kvviz.attention.writers import row_input
from kvviz.gpu.kernel_spec import KernelSpec, Struct, ro, rw
from kvviz.gpu.runtime import DeviceRows, Dispatch, GpuRuntime
from kvviz.gpu.shaders import FRONTEND_GLSLANG, GLSL_FRONTENDS
from kvviz.gpu import loop_budget
from kvviz.gpu.loop_budget import PARTITION
from kvviz.paging import PAD_SLOT, PagedBatch

log = logging.getLogger("kvviz.attention.paged")

FORMATS = ("q8", "f32")
MAX_HEAD_SIZE = 256  # shared arrays in the decode kernels

# ------------------------------------------------------------------------------ kernel specs
_WRITER_IMM = Struct("Pc", "key_stride value_stride num_kv_heads head_size block_size")
_ATTN_IMM = Struct("Pc", "num_kv_heads num_heads head_size block_size max_num_blocks_per_seq q_stride "
                         "max_context_len scale:f32")
_WRITER_BINDINGS = ro("key", "value") + rw("key_cache", "value_cache") + ro("slot_mapping")
WRITER_Q8 = KernelSpec("attention/reshape_and_cache_q8.comp", bindings=_WRITER_BINDINGS, immediates=_WRITER_IMM)
WRITER_F32 = KernelSpec("attention/reshape_and_cache_f32.comp", bindings=_WRITER_BINDINGS, immediates=_WRITER_IMM)
DECODE_Q8 = KernelSpec("attention/paged_attn_q8.comp", bindings=ro("q", "kc", "vc", "block_tables", "context_lens") + rw("o"),
                       immediates=_ATTN_IMM)
DECODE_F32 = KernelSpec("attention/paged_attn_f32.comp",
                        bindings=ro("q", "kc", "vc", "block_tables", "context_lens") + rw("partials"), immediates=_ATTN_IMM)
WEIGHTS = KernelSpec("attention/paged_attn_weights.comp", bindings=ro("q", "kc", "block_tables", "context_lens") + rw("o", "stats"),
                     immediates=_ATTN_IMM)  # define KV_Q8 for the int8 cache
REDUCE = KernelSpec("attention/paged_attn_reduce.wgsl", bindings=ro("partials", "context_lens") + rw("out"),
                    immediates=Struct("P", "num_heads head_size num_partitions max_context_len"))
SOFTMAX = KernelSpec("attention/softmax_partitioned.wgsl", bindings=ro("stats", "row_lens") + rw("out"),
                     immediates=Struct("P", "num_heads row_len num_partitions normaliser row_base"))
KERNELS = (WRITER_Q8, WRITER_F32, DECODE_Q8, DECODE_F32, WEIGHTS, REDUCE, SOFTMAX)


def _cdiv(a: int, b: int) -> int:
    return -(-int(a) // int(b))


def words_per_token(fmt: str, head_size: int) -> int:
    """32-bit words of one token's vector for one KV head."""
    return head_size // 4 + 1 if fmt == "q8" else head_size


def check_head_size(fmt: str, head_size: int) -> None:
    if fmt not in FORMATS:
        raise InvalidInput(f"Unknown paged cache format {fmt!r}; expected one of {FORMATS}")
    if head_size <= 0 or head_size > MAX_HEAD_SIZE:
        raise UnsupportedShape(
            f"head_size {head_size} is not supported: the paged kernels hold the query in a "
            f"{MAX_HEAD_SIZE}-float shared array; the nearest head size that works is "
            f"{MAX_HEAD_SIZE if head_size > 0 else 4}.",
            f"Use a head size between 4 and {MAX_HEAD_SIZE}.",
        )
    if fmt == "q8" and head_size % 4:
        below, above = head_size // 4 * 4, head_size // 4 * 4 + 4
        raise UnsupportedShape(
            f"head_size {head_size} is not a multiple of 4: the int8 cache packs 4 codes per word; the nearest head "
            f"sizes that work are {f'{below} and {above}' if below else above}.",
            "Use a head size that is a multiple of 4.",
        )


@dataclass
class PagedCache:
    """K and V caches on the device, in one format, with their logical shape."""

    fmt: str
    num_blocks: int
    num_kv_heads: int
    block_size: int
    head_size: int
    k: object
    v: object

    @property
    def wpt(self) -> int:
        return words_per_token(self.fmt, self.head_size)

    @property
    def block_bytes(self) -> int:
        return self.num_kv_heads * self.block_size * self.wpt * 4

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return (self.num_blocks, self.num_kv_heads, self.block_size, self.wpt)

    @property
    def dtype(self):
        return np.uint32 if self.fmt == "q8" else np.float32

    @property
    def nbytes(self) -> int:
        return self.num_blocks * self.block_bytes

    def bytes_per_token(self) -> int:
        """Bytes one token occupies in K + V over all KV heads (codes and scales)."""
        return 2 * self.num_kv_heads * self.wpt * 4


@dataclass
class _Window:
    first_block: int
    num_blocks: int


def softmax_dispatch(rt: GpuRuntime, stats, row_lens, out, num_heads: int, rows: int, row_len: int,
                     num_partitions: int, normaliser: int = 0, row_base: int = 0) -> Dispatch:
    """The second pass of a split attention-weights kernel (shaders/attention/softmax_partitioned.wgsl):
    normaliser 0 = the paged decodes' e * (1 / (sum + 1e-6)), 1 = the TurboQuant seed's e / sum."""
    return rt.compile(SOFTMAX).dispatch((num_heads, rows, _cdiv(max(row_len, 1), PARTITION)), [stats, row_lens, out],
                                        num_heads, row_len, num_partitions, normaliser, row_base)


class PagedKernels:
    """Launchers for one runtime. `frontend` picks how GLSL reaches wgpu (glslang or naga-glsl)."""

    def __init__(self, rt: GpuRuntime, frontend: str = FRONTEND_GLSLANG):
        if frontend not in GLSL_FRONTENDS:
            raise InvalidInput(f"Unknown GLSL front end {frontend!r}; choose one of {GLSL_FRONTENDS}")
        self.rt = rt
        self.frontend = frontend

    # ------------------------------------------------------------- kernels
    def _writer(self, fmt: str):
        return self.rt.compile(WRITER_Q8 if fmt == "q8" else WRITER_F32, self.frontend)

    def _decode(self, fmt: str):
        """The seed int8 decode (one pass over the whole context), or the split f32 decode's first pass."""
        return self.rt.compile(DECODE_Q8 if fmt == "q8" else DECODE_F32, self.frontend)

    def _reduce(self):
        return self.rt.compile(REDUCE)

    def _weights(self, fmt: str):
        return self.rt.compile(WEIGHTS, self.frontend, **({"KV_Q8": 1} if fmt == "q8" else {}))

    # --------------------------------------------------------------- cache
    def allocate(self, fmt: str, num_blocks: int, num_kv_heads: int, block_size: int, head_size: int) -> PagedCache:
        check_head_size(fmt, head_size)
        if num_kv_heads <= 0 or block_size <= 0 or num_blocks <= 0:
            raise InvalidInput("num_blocks, num_kv_heads and block_size must be positive")
        wpt = words_per_token(fmt, head_size)
        nbytes = num_blocks * num_kv_heads * block_size * wpt * 4
        if num_kv_heads * block_size * wpt * 4 > self.rt.max_binding:
            raise DeviceLimitError("One cache block is larger than the storage-binding limit.")
        k = self.rt.empty(nbytes, f"k_cache_{fmt}", binding=False)
        v = self.rt.empty(nbytes, f"v_cache_{fmt}", binding=False)
        return PagedCache(fmt, num_blocks, num_kv_heads, block_size, head_size, k, v)

    def read(self, cache: PagedCache, which: str = "k") -> np.ndarray:
        buf = cache.k if which == "k" else cache.v
        return self.rt.read(buf, cache.dtype, cache.shape)

    def window_blocks(self, cache: PagedCache) -> int:
        """Largest number of blocks one binding can hold, a multiple of the offset alignment step."""
        per = self.rt.max_binding // cache.block_bytes
        if per >= cache.num_blocks:
            return cache.num_blocks
        step = self.rt.offset_alignment // math.gcd(cache.block_bytes, self.rt.offset_alignment)
        return max(step, per // step * step)

    def _binding(self, cache: PagedCache, buf, win: _Window):
        if win.first_block == 0 and win.num_blocks == cache.num_blocks and cache.nbytes <= self.rt.max_binding:
            return buf
        return (buf, win.first_block * cache.block_bytes, win.num_blocks * cache.block_bytes)

    # --------------------------------------------------------------- write
    def write_dispatches(self, cache: PagedCache, key, value, slot_mapping) -> list[Dispatch]:
        """Validate, upload and return the writer dispatches (not yet run). key / value: host arrays, or DeviceRows
        (float32 [num_tokens, n_kv, D] already on the device, bound in place: no host check of their values is
        possible) where the whole input goes to one binding window with no padding slots; else UnsupportedShape."""
        on_device = isinstance(key, DeviceRows) or isinstance(value, DeviceRows)
        desc = f"[num_tokens, {cache.num_kv_heads}, {cache.head_size}]"
        if on_device:
            if not (isinstance(key, DeviceRows) and isinstance(value, DeviceRows)):
                raise InvalidInput("key and value must both be on the device or both on the host")
            T = int(key.shape[0]) if len(key.shape) == 3 else 0
            if len(key.shape) != 3 or tuple(value.shape) != tuple(key.shape):
                raise InvalidInput(f"key/value must both be {desc}; got {key.shape} and {value.shape}")
        else:
            T = np.asarray(key).shape[0] if np.asarray(key).ndim else 0
            key = require_f32("key", key, desc, 3)
            value = require_f32("value", value, desc, 3)
        if key.shape[1:] != (cache.num_kv_heads, cache.head_size) or value.shape != key.shape:
            raise InvalidInput(f"key/value must both be {desc}; got {key.shape} and {value.shape}")
        sm = np.asarray(slot_mapping)
        if sm.dtype.kind not in "ui" or sm.shape != (T,):
            raise InvalidInput(f"slot_mapping must be an integer array of length {T}, got {sm.dtype} {sm.shape}")
        sm = sm.astype(np.int64)
        real = sm != PAD_SLOT
        if (sm[real] < 0).any() or (sm[real] >= cache.num_blocks * cache.block_size).any():
            bad = int(sm[real][(sm[real] < 0) | (sm[real] >= cache.num_blocks * cache.block_size)][0])
            raise InvalidInput(
                f"slot {bad} is outside the cache ({cache.num_blocks} blocks x {cache.block_size} slots)",
                "Slots must be < num_blocks * block_size, or 0xFFFFFFFF for padding.",
            )
        kern = self._writer(cache.fmt)
        W = self.window_blocks(cache)
        wslots = cache.block_size * W
        win_of = np.where(real, sm // wslots, -1)
        # Tokens per dispatch: the grid limit, and the storage-binding limit of the key/value inputs.
        chunk = max(1, min(self.rt.max_grid, self.rt.max_binding // (cache.num_kv_heads * cache.head_size * 4)))
        out: list[Dispatch] = []
        windows = sorted(set(int(w) for w in np.unique(win_of) if w >= 0))
        if len(windows) > 1 or T > chunk:
            log.info("%s writer: %d tokens in chunks of at most %d, over %d binding windows of %d blocks",
                     cache.fmt, T, chunk, len(windows), W)
        for w in windows:
            rows = np.flatnonzero(win_of == w)
            if len(windows) == 1 and len(rows) == T and (not (~real).any()):
                rows = None  # fast path: the whole input, no gather
            if on_device and rows is not None:
                raise UnsupportedShape(f"{cache.fmt} writer: rows on the device are written whole, and these take "
                                       f"{len(windows)} binding windows or padding slots")
            for start in range(0, T if rows is None else len(rows), chunk):
                if on_device:
                    kk = row_input(self.rt, key, start, min(T, start + chunk), "key")
                    vv = row_input(self.rt, value, start, min(T, start + chunk), "value")
                    ss = sm[start:start + chunk]
                elif rows is None:
                    sel = slice(start, start + chunk)
                    kk, vv, ss = key[sel], value[sel], sm[sel]
                else:
                    r = rows[start : start + chunk]
                    kk, vv, ss = key[r], value[r], sm[r]
                local = (ss - w * wslots).astype(np.uint32)
                nb = min(W, cache.num_blocks - w * W)
                win = _Window(w * W, nb)
                imm = kern.pack(
                    key_stride=cache.num_kv_heads * cache.head_size, value_stride=cache.num_kv_heads * cache.head_size,
                    num_kv_heads=cache.num_kv_heads, head_size=cache.head_size, block_size=cache.block_size,
                )
                out.append(
                    Dispatch(
                        kern,
                        [
                            kk if on_device else self.rt.upload(kk, "key"),
                            vv if on_device else self.rt.upload(vv, "value"),
                            self._binding(cache, cache.k, win),
                            self._binding(cache, cache.v, win),
                            self.rt.upload(local, "slot_mapping"),
                        ],
                        (len(local), cache.num_kv_heads, 1),
                        imm,
                    )
                )
        return out

    def write(self, cache: PagedCache, key, value, slot_mapping) -> None:
        """Store key/value [T, n_kv, D] at the slots; submitted, not waited for (a later read or run sees it)."""
        self.rt.submit(self.write_dispatches(cache, key, value, slot_mapping))

    # -------------------------------------------------------------- decode
    def _check_decode(self, cache: PagedCache, q, batch: PagedBatch, scale: float):
        desc = f"[num_seqs, num_heads, {cache.head_size}]"
        q = require_f32("q", q, desc, 3)
        S, H, D = q.shape
        if D != cache.head_size:
            raise InvalidInput(f"q has head size {D}, the cache {cache.head_size}")
        if S != batch.num_seqs:
            raise InvalidInput(f"q has {S} sequences, the batch {batch.num_seqs}")
        if H % cache.num_kv_heads:
            raise UnsupportedShape(
                f"{H} query heads are not divisible by {cache.num_kv_heads} KV heads",
                "GQA needs num_heads to be a multiple of num_kv_heads.",
            )
        if batch.num_blocks != cache.num_blocks or batch.block_size != cache.block_size:
            raise InvalidInput(
                f"The batch was laid out for {batch.num_blocks} blocks of {batch.block_size}; the cache has "
                f"{cache.num_blocks} of {cache.block_size}."
            )
        with np.errstate(over="ignore"):
            scale32 = np.float32(scale)
        if not np.isfinite(scale) or not np.isfinite(scale32):
            raise InvalidInput(f"softmax scale must be a finite float32 (|scale| < 3.4e38), got {scale}")
        batch.validate()
        return q

    def _seq_groups(self, cache: PagedCache, batch: PagedBatch, extra_per_seq: int = 0):
        """Group sequences so each group's blocks fit one binding window and one grid row, and its
        per-sequence outputs (`extra_per_seq` bytes each) one storage binding."""
        W = self.window_blocks(cache)
        step = self.rt.offset_alignment // math.gcd(cache.block_bytes, self.rt.offset_alignment)
        per_binding = self.rt.max_binding // cache.block_bytes
        need = -(-batch.context_lens.astype(np.int64) // batch.block_size)
        spans = []
        for s in range(batch.num_seqs):
            used = batch.block_tables[s, : need[s]].astype(np.int64)
            spans.append((int(used.min()), int(used.max())) if used.size else (0, 0))
        max_seqs = self.rt.max_grid
        if extra_per_seq:
            if extra_per_seq > self.rt.max_binding:
                raise DeviceLimitError(
                    f"One sequence's attention outputs need {extra_per_seq / 2**20:.1f} MiB, over the adapter's "
                    f"storage-binding limit of {self.rt.max_binding / 2**20:.1f} MiB.",
                    "Use fewer heads or a shorter context.",
                )
            max_seqs = min(max_seqs, self.rt.max_binding // extra_per_seq)
        if W == cache.num_blocks and batch.num_seqs <= max_seqs:
            return [(list(range(batch.num_seqs)), _Window(0, cache.num_blocks))]
        groups = []
        order = sorted(range(batch.num_seqs), key=lambda s: spans[s][0])
        cur, lo, hi = [], None, None
        for s in order:
            a, b = spans[s]
            nlo = a if lo is None else min(lo, a)
            nhi = b if hi is None else max(hi, b)
            base = nlo // step * step
            if cur and ((nhi - base + 1) > per_binding or len(cur) >= max_seqs):
                base0 = lo // step * step
                groups.append((cur, _Window(base0, min(per_binding, cache.num_blocks - base0))))
                cur, nlo, nhi = [], a, b
            cur.append(s)
            lo, hi = nlo, nhi
            if (b - a // step * step + 1) > per_binding:
                raise DeviceLimitError(
                    f"Sequence {s} spans blocks {a}..{b}, more than one storage binding holds "
                    f"({per_binding} blocks of {cache.block_bytes} bytes).",
                    "Allocate with a window (make_batch(window=...)) or use a smaller pool.",
                )
        if cur:
            base0 = lo // step * step
            groups.append((cur, _Window(base0, min(per_binding, cache.num_blocks - base0))))
        log.info("%d sequences in %d dispatch groups (binding windows of up to %d blocks, at most %d sequences each)",
                 batch.num_seqs, len(groups), per_binding, max_seqs)
        return groups

    def _check_loops(self, kind: str, cache: PagedCache, mcl: int) -> None:
        """Refuse what the adapter's loop limit would truncate (only the unsplit seed decode can hit it)."""
        D = cache.head_size
        if kind == "decode" and cache.fmt == "q8":
            loop_budget.check(self.rt, "The seed int8 decode (paged_attn_q8)", lambda n: loop_budget.seed_int8_decode(n, D), mcl)
        elif kind == "decode":
            loop_budget.check(self.rt, "The f32 decode (paged_attn_f32 + reduce)",
                              lambda n: max(loop_budget.split_decode_partition(D), loop_budget.split_reduce(n, D)), mcl)
        else:
            loop_budget.check(self.rt, "The attention-weights kernel",
                              lambda n: max(loop_budget.split_weights_partition(D, cache.fmt == "q8"),
                                            loop_budget.softmax_partitioned(n)), mcl)

    def _attn_dispatches(self, kind: str, cache: PagedCache, q, batch: PagedBatch, scale: float, max_context_len=None):
        """Dispatches of the decode or the weights kernel, one group of sequences per binding window.

        The f32 decode and the weights kernel are split over the context in partitions of PARTITION
        positions (a second dispatch combines them); the seed int8 decode runs as given, one workgroup
        per (head, sequence).
        """
        q = self._check_decode(cache, q, batch, scale)
        S, H, D = q.shape
        mcl = int(batch.max_context_len if max_context_len is None else max_context_len)
        self._check_loops(kind, cache, mcl)
        split = not (kind == "decode" and cache.fmt == "q8")
        parts = _cdiv(max(mcl, 1), PARTITION) if split else 1
        if parts > self.rt.max_grid:
            raise DeviceLimitError(
                f"A context of {mcl} tokens needs {parts} partitions of {PARTITION}, over the adapter's "
                f"{self.rt.max_grid} workgroups per grid dimension."
            )
        kern = self._decode(cache.fmt) if kind == "decode" else self._weights(cache.fmt)
        out_per_seq = H * D if kind == "decode" else H * max(mcl, 1)
        part_per_seq = H * parts * ((D + 2) if kind == "decode" else 2) if split else 0
        dispatches, outputs = [], []
        for seqs, win in self._seq_groups(cache, batch, extra_per_seq=max(out_per_seq, part_per_seq) * 4):
            idx = np.asarray(seqs)
            bt = batch.block_tables[idx].astype(np.int64)
            need = -(-batch.context_lens[idx].astype(np.int64) // batch.block_size)
            cols = np.arange(bt.shape[1])[None, :] < need[:, None]
            bt_local = np.where(cols, bt - win.first_block, 0).astype(np.uint32)
            imm = kern.pack(cache.num_kv_heads, H, D, cache.block_size, bt.shape[1], H * D, mcl, float(scale))
            o = self.rt.empty(len(seqs) * out_per_seq * 4, f"{kind}_out")
            self.rt.check_size(q[idx].nbytes, "q")
            lens = self.rt.upload(batch.context_lens[idx].astype(np.uint32), "context_lens")
            bufs = [self.rt.upload(q[idx], "q"), self._binding(cache, cache.k, win)]
            if kind == "decode":
                bufs.append(self._binding(cache, cache.v, win))
            bufs += [self.rt.upload(bt_local, "block_tables"), lens]
            if not split:
                dispatches.append(Dispatch(kern, bufs + [o], (H, len(seqs), 1), imm))
            elif kind == "decode":
                partials = self.rt.empty(len(seqs) * part_per_seq * 4, "decode_partials")
                dispatches.append(Dispatch(kern, bufs + [partials], (H, len(seqs), parts), imm))
                dispatches.append(self._reduce().dispatch((H, len(seqs), 1), [partials, lens, o], H, D, parts, mcl))
            else:
                stats = self.rt.empty(len(seqs) * part_per_seq * 4, "weights_stats")
                dispatches.append(Dispatch(kern, bufs + [o, stats], (H, len(seqs), parts), imm))
                row_lens = self.rt.upload(np.minimum(batch.context_lens[idx], mcl).astype(np.uint32), "row_lens")
                dispatches.append(softmax_dispatch(self.rt, stats, row_lens, o, H, len(seqs), max(mcl, 1), parts))
            outputs.append((idx, o))
        return dispatches, outputs, out_per_seq

    def decode_dispatches(self, cache, q, batch, scale, max_context_len=None):
        d, outs, _ = self._attn_dispatches("decode", cache, q, batch, scale, max_context_len)
        return d, outs

    def _collect(self, outputs, S, per_seq, shape_tail):
        res = np.zeros((S, per_seq), dtype=np.float32)
        for idx, buf in outputs:
            res[idx] = self.rt.read(buf, np.float32, (len(idx), per_seq))
        return res.reshape((S,) + shape_tail)

    def decode(self, cache: PagedCache, q, batch: PagedBatch, scale: float, max_context_len=None) -> np.ndarray:
        """Run the paged decode; returns [num_seqs, num_heads, head_size] f32."""
        d, outs, per = self._attn_dispatches("decode", cache, q, batch, scale, max_context_len)
        self.rt.run(d)
        S, H, D = np.asarray(q).shape
        return self._collect(outs, S, per, (H, D))

    def weights(self, cache: PagedCache, q, batch: PagedBatch, scale: float, max_context_len=None) -> np.ndarray:
        """Attention weights the decode applies: [num_seqs, num_heads, max_context_len] f32."""
        d, outs, per = self._attn_dispatches("weights", cache, q, batch, scale, max_context_len)
        self.rt.run(d)
        S, H, _ = np.asarray(q).shape
        return self._collect(outs, S, per, (H, per // H))
