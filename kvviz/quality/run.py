"""Quality of a KV format over a text: perplexity and KL divergence against the f32 paged cache, teacher-forced.

For each method the model runs over every chunk of the text (kvviz/quality/text.py) as a batched prefill, on
the GPU forward (kvviz/forward/model.py) or the numpy one (kvviz/sources/llama_numpy.py) as `forward` chooses
(kvviz/forward/select.py), in pieces of PIECE tokens: each layer's K/V of a piece is written into the method's
paged cache by its GPU writer (LiveCache.extend), then the piece's queries attend causally over the cache
(LiveCache.attend_causal), the piece's own positions included, as an engine's chunked prefill does. The piece is
the eval's, not the forward's: a cache whose records depend on how many positions were written before a query
attends (KIVI's recent window kept exact) gives the same numbers on either forward. The f32 baseline runs the
same way through the f32 paged cache; its distributions are stored once per (model, text, chunking)
(kvviz/quality/baseline.py), whichever forward computed them. The statistics are llama.cpp's
(kvviz/quality/stats.py).

Beyond the K+V run of each method:
  K only / V only  (parts "k", "v") the method's GPU writer quantises the layer's K and V, its dequantise
                   kernel reads them back (KVMethod.dequantised_rows), and the f32 paged cache holds the
                   method's K with the exact V (or the exact K with its V): which half costs what. A method
                   that keeps no reconstruction (TurboQuant's keys are an inner-product estimator) says so.
  each layer alone (layers=True) one pass per layer with only that layer's cache quantised.
  attention error  in every pass, the relative RMS error of each layer's attention output against float32
                   attention (numpy) over the same q, K, V, on every `error_stride`-th query of a piece.
"""
from __future__ import annotations

import math
import os
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from kvviz.errors import Cancelled, InvalidInput
from kvviz.families.registry import get_method
from kvviz.forward.select import ForwardChoice, make_runner
from kvviz.gpu.copy import gather_dispatch
from kvviz.gpu.runtime import DeviceRows
from kvviz.methods.base import batch_layouts
from kvviz.methods.live_cache import BlockTable, cache_kind
from kvviz.methods.live_window import make_model_cache
from kvviz.methods.transform import TransformedMethod, gguf_interleaved
from kvviz.paging import make_batch
from kvviz.quality import stats as qs
from kvviz.quality.baseline import BaselineStore, BaselineWriter, file_sha256
from kvviz.quality.text import Chunking
from kvviz.sources.llama_numpy import gqa_attention

_F32 = np.float32
PARTS = {"kv": "K+V", "k": "K only", "v": "V only"}
BASELINE = "f32"
BASELINE_CACHE = "f32 paged cache (GPU)"
ROWS = 32  # scored positions turned into distributions by one host task at most (float64 [ROWS, vocab] arrays) ...
TASK_BYTES = 8 << 20  # ... and fewer where a float64 [rows, vocab] array would pass this (a few live a task)
# Host threads for the distributions: numpy's exp/log/sums release the GIL, so blocks of rows run in parallel
# beside the next chunk's forward. Bounded: each task holds a few [ROWS, vocab] float64 arrays.
HOST_THREADS = max(1, min(8, os.cpu_count() or 1))
AHEAD = 2  # chunks whose distributions may still be computing while the forward runs the next
PIECE = 512  # tokens a prefill piece: written into the cache, then attending (fewer where a GPU forward takes fewer)

ProgressFn = Callable[[float, str], None]
CancelFn = Callable[[], bool]


@dataclass(frozen=True)
class MethodRun:
    """One pass to measure: a method spec ("q8_0", "kivi:bits=4") as parsed, and which part is quantised."""

    spec: str
    method: str
    options: dict = field(default_factory=dict)
    part: str = "kv"  # "kv", "k" or "v"
    layer: int | None = None  # only this layer quantised (None: every layer)

    @property
    def name(self) -> str:
        s = self.spec if self.part == "kv" else f"{self.spec} ({PARTS[self.part]})"
        return s if self.layer is None else f"{s} [layer {self.layer}]"

    def build(self, config=None):
        """The method instance ('f32' stays the string); a transformed one in the GGUF order of the model
        whose `config` is given."""
        if self.method == BASELINE:
            return self.method
        m = get_method(self.method, **self.options)
        if isinstance(m, TransformedMethod) and config is not None:
            m = m.with_interleaved(gguf_interleaved(config))
        return m


def bits_per_element(method, head_size: int, block_size: int, context_len: int) -> float:
    """Mean of the K and V layouts' bits per element at this head size, scales included (KIVI: for a
    sequence of context_len tokens); 32 for the f32 cache."""
    if method == BASELINE:
        return 32.0
    k, v = batch_layouts(method, make_batch([context_len], block_size), head_size)
    return (k.bits_per_element + v.bits_per_element) / 2.0


# ---------------------------------------------------------------------------------------------- attention
class _LayerError:
    """Sums of each layer's attention-output error against float32 attention over the same q, K, V."""

    def __init__(self, cfg, stride: int):
        n_layers = cfg.n_layers
        self.cfg = cfg
        self.stride = max(int(stride), 0)
        self.err2 = np.zeros(n_layers)
        self.ref2 = np.zeros(n_layers)
        self.count = np.zeros(n_layers, np.int64)

    def rows(self, t: int) -> np.ndarray:
        """The queries of a piece of t that are checked."""
        return np.arange(0, t, self.stride) if self.stride else np.zeros(0, np.int64)

    def sums(self, checks: list) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(err2, ref2, count) a layer of `checks`: (layer, t, q_rows [len(rows(t)), H, D] the checked queries of a
        piece of t, k_all / v_all [n_kv, start+t, D] (exact), out_rows [len(rows(t)), H, D] what the cache gave at
        them, start). Arithmetic alone, for a host thread; `merge` adds them in the chunks' order (the same sums
        whatever thread computed them)."""
        n = len(self.err2)
        out = (np.zeros(n), np.zeros(n), np.zeros(n, np.int64))
        for layer, t, q_rows, k_all, v_all, out_rows, start in checks:
            self._add(out, layer, t, q_rows, k_all, v_all, out_rows, start)
        return out

    def merge(self, sums) -> None:
        self.err2 += sums[0]
        self.ref2 += sums[1]
        self.count += sums[2]

    def _add(self, into, layer: int, t: int, q_rows, k_all, v_all, out_rows, start: int) -> None:
        rows = self.rows(t)
        if not rows.size:
            return
        c = self.cfg
        w = c.window(layer) if hasattr(c, "window") else 0
        end = start + int(rows[-1]) + 1  # the last checked query's extent: later keys are masked for all of them
        # the checked queries in one product, each masked to its own causal extent
        ref = gqa_attention(np.ascontiguousarray(np.asarray(q_rows).transpose(1, 0, 2)), k_all[:, :end], v_all[:, :end],
                            scale=getattr(c, "query_scale", None), cap=getattr(c, "attn_softcap", 0.0), window=w,
                            q_pos=start + rows).transpose(1, 0, 2).astype(np.float64)
        into[0][layer] += float(np.sum((np.asarray(out_rows, np.float64) - ref) ** 2))
        into[1][layer] += float(np.sum(ref ** 2))
        into[2][layer] += rows.size

    def result(self) -> list:
        with np.errstate(invalid="ignore", divide="ignore"):
            rel = np.sqrt(self.err2 / self.ref2)
        return [float(x) if c else math.nan for x, c in zip(rel, self.count)]


class ChunkAttention:
    """The runner's attend_chunk hook for one chunk: each layer's K/V written into its cache, then causal
    attention over it. `caches[layer]` is the cache layer `layer` uses (one shared cache for all layers,
    or the f32 cache for the layers a single-layer run leaves unquantised).
    With `rt` (the GPU forward's runtime), an attention that is one prefill stays on the device (DeviceRows: the
    forward copies it into its activations there), and its checked rows are read after the chunk (`finish`),
    when the GPU has done the chunk: a layer then waits for the GPU once (its q, K and V), not twice. Where the
    layer's cache writes K/V from the device (LiveCache.extend_on_device), `device` takes q, K and V there too, and
    the layer does not wait for the GPU at all: the layer errors' q, K and V are read after the chunk as well. The
    layer errors' arithmetic is left to the caller (finish() gives the checks, _LayerError.sums computes them)."""

    def __init__(self, caches: list, n_kv: int, head_size: int, ctx_len: int, errors: _LayerError | None,
                 rt=None):
        self.caches = caches
        self.errors = errors
        self.rt = rt
        n_layers = len(caches)
        self._k = np.zeros((n_layers, n_kv, ctx_len, head_size), _F32) if errors is not None and errors.stride else None
        self._v = np.zeros_like(self._k) if self._k is not None else None
        self._checks: list = []  # _LayerError.sums' checks; DeviceRows in place of out_rows until finish()
        self._on_device: dict = {}  # (layer, start) -> the DeviceRows q, K, V of a layer's piece, read in finish()
        self._held: list = []  # the chunk's gathered buffers, kept until finish(): the GPU reads them until then

    def __call__(self, layer: int, q: np.ndarray, k: np.ndarray, v: np.ndarray, start: int):
        cache = self.caches[layer]
        cache.extend(layer, k, v, start)
        if self.rt is not None:
            out = cache.attend_causal_on_device(layer, q, start)
        else:
            out = np.asarray(cache.attend_causal(layer, q, start), _F32)
        if self._k is not None:
            t = k.shape[1]
            self._k[layer, :, start:start + t] = k
            self._v[layer, :, start:start + t] = v
            rows = self.errors.rows(t)
            got = out if isinstance(out, DeviceRows) else np.asarray(out, _F32)[rows]
            self._checks.append((layer, t, np.asarray(q, _F32)[rows], self._k[layer, :, :start + t],
                                 self._v[layer, :, :start + t], got, start))
        return out

    def device(self, layer: int, qkv, layout, t: int, start: int):
        """The GPU forward's device hand-off (GpuRunner._chunk): the layer's q, K and V gathered out of the forward's
        activations `qkv` (columns as `layout`, a QkvLayout, says) into buffers of their own, new for this layer and
        piece (the activations hold the next layer's before the GPU is done with these), K/V written by the cache
        from there and the causal prefill run over it with q from there. The attention (DeviceRows, submitted, or a
        host array where the cache has no prefill for the shape), or None where the cache does not write K/V from the
        device: the forward then reads q, K and V and calls this hook from the host (nothing was written).
        No value of q, K or V is checked on the host here (the forward checks its logits for non-finite values)."""
        cache = self.caches[layer]
        if self.rt is None or not cache.takes_device_rows():
            return None
        rt, D = self.rt, layout.head_size

        def gather(name, col, heads):  # (DeviceRows, its gather dispatch)
            buf = rt.empty(t * heads * D * 4, f"eval-{name}-layer{layer}")
            self._held.append(buf)
            return DeviceRows(buf, (t, heads, D)), gather_dispatch(rt, qkv, buf, t, heads * D, layout.ld, col)

        (k, gk), (v, gv) = gather("k", layout.k, layout.n_kv_heads), gather("v", layout.v, layout.n_kv_heads)
        rt.submit([gk, gv])
        if not cache.extend_on_device(layer, k, v, start):
            return None
        q, gq = gather("q", layout.q, layout.n_heads)
        rt.submit([gq])
        out = cache.attend_causal_on_device(layer, q, start)
        if self._k is not None:
            self._on_device[(layer, start)] = (k, v)
            got = out if isinstance(out, DeviceRows) else np.asarray(out, _F32)[self.errors.rows(t)]
            self._checks.append((layer, t, q, self._k[layer, :, :start + t], self._v[layer, :, :start + t], got,
                                 start))
        return out

    def finish(self) -> list:
        """The chunk's checks for _LayerError.sums: what the chunk left on the device (the K and V that `device`
        gathered, the checked queries and the checked rows of the attentions) read back in one gather, after the
        chunk (the GPU has done it)."""
        parts, place = [], []  # read_gather's parts; where each one's array goes

        def rows_of(d: DeviceRows, what):  # the checked rows of a DeviceRows [t, h, d]
            t, h, dd = d.shape
            row = h * dd * 4
            parts.append((d.buffer, [(int(r) * row, row) for r in self.errors.rows(t)], np.float32))
            place.append(what + (d.shape,))

        for (layer, start), (k, v) in self._on_device.items():
            for d, into in ((k, self._k), (v, self._v)):
                parts.append((d.buffer, [(0, int(np.prod(d.shape)) * 4)], np.float32))
                place.append(("kv", into, layer, start, d.shape))
        for n, (_, _, q, _, _, out, _) in enumerate(self._checks):
            if isinstance(q, DeviceRows):
                rows_of(q, ("check", n, 2))
            if isinstance(out, DeviceRows):
                rows_of(out, ("check", n, 5))
        checks = [list(c) for c in self._checks]
        for got, what in zip(self.rt.read_gather(parts) if parts else [], place):
            if what[0] == "kv":  # every check sees its K/V (views of these arrays) before any is summed
                _, into, layer, start, (t, h, d) = what
                into[layer, :, start:start + t] = got.reshape(t, h, d).transpose(1, 0, 2)
            else:
                _, n, col, (_, h, d) = what
                checks[n][col] = got.reshape(-1, h, d)
        self._checks, self._on_device, self._held = [], {}, []
        return [tuple(c) for c in checks]


class PartCache:
    """K only or V only: the method's GPU writer quantises the layer's K and V over positions 0..start+T-1
    (`method.for_layer(layer).quantize`), its dequantise kernel reads them back (`dequantised_rows`), and
    the f32 paged cache holds the method's K with the exact V ("k") or the exact K with the method's V ("v")."""

    def __init__(self, method, part: str, f32_cache, block_size: int, ctx):
        self.method, self.part, self.f32, self.block_size, self.ctx = method, part, f32_cache, block_size, ctx
        self.path = (f"{'K' if part == 'k' else 'V'} read back from the method's cache, "
                     f"{'V' if part == 'k' else 'K'} exact, in the f32 paged cache (GPU)")
        self._k: dict[int, np.ndarray] = {}
        self._v: dict[int, np.ndarray] = {}

    def extend(self, layer: int, k: np.ndarray, v: np.ndarray, start: int) -> None:
        t = k.shape[1]
        kk = np.concatenate([self._k[layer][:, :start], k], axis=1) if start else np.asarray(k, _F32)
        vv = np.concatenate([self._v[layer][:, :start], v], axis=1) if start else np.asarray(v, _F32)
        self._k[layer], self._v[layer] = kk, vv
        n = start + t
        batch = make_batch([n], self.block_size)
        m = self.method.for_layer(layer)
        key = np.ascontiguousarray(kk.transpose(1, 0, 2))
        value = np.ascontiguousarray(vv.transpose(1, 0, 2))
        qkv = m.quantize(self.ctx, batch, key, value)
        which = "K" if self.part == "k" else "V"
        rec = m.dequantised_rows(self.ctx, qkv, batch, which)
        if rec is None:
            raise InvalidInput(f"{self.method.id}: no reconstruction of its cache to read back, so no "
                               f"{PARTS[self.part]} run", "K only / V only runs need the method's dequantised "
                               "cache (KVMethod.dequantised_rows).")
        rec = np.asarray(rec, _F32)[:n].transpose(1, 0, 2)
        if self.part == "k":
            self.f32.extend(layer, rec, vv, 0)
        else:
            self.f32.extend(layer, kk, rec, 0)

    def attend_causal(self, layer: int, q: np.ndarray, start: int) -> np.ndarray:
        return self.f32.attend_causal(layer, q, start)

    def attend_causal_on_device(self, layer: int, q: np.ndarray, start: int):
        return self.f32.attend_causal_on_device(layer, q, start)

    def takes_device_rows(self) -> bool:
        return False  # its K and V are quantised and read back on the host


# ---------------------------------------------------------------------------------------------- passes
@dataclass
class EvalModel:
    """What a pass needs of the model and the text."""

    model: object
    path: str
    chunking: Chunking
    gpu: object  # kvviz.methods.context.GpuContext
    block_size: int = 16
    error_stride: int = 16
    forward: str = "auto"  # the model's forward: "auto", "gpu" or "numpy" (kvviz/forward/select.py)
    _runner: object = field(default=None, init=False, repr=False)
    choice: ForwardChoice | None = field(default=None, init=False)  # what runner() chose, and why

    @property
    def cfg(self):
        return self.model.config

    def runner(self):
        """The runner every pass uses (made once: the GPU forward's weights and buffers stay on the device
        between passes; each chunk resets it)."""
        if self._runner is None:
            self._runner, self.choice = make_runner(self.model, self.gpu.rt, forward=self.forward)
        return self._runner

    def table(self) -> BlockTable:
        n = -(-self.chunking.ctx // self.block_size)
        return BlockTable(n, self.block_size)

    @property
    def scale(self) -> float:
        """The model's softmax scale (1/sqrt(head size) unless its architecture says otherwise)."""
        return float(getattr(self.cfg, "query_scale", 1.0 / np.sqrt(self.cfg.head_size)))

    def cache(self, method, table: BlockTable | None = None):
        """The cache of every layer (sliding-window layers keep their window, as the live decode does)."""
        c = self.cfg
        return make_model_cache(method, self.gpu, table or self.table(), c.n_layers, c.n_heads, c.n_kv_heads,
                                c.head_size, self.scale, windows=getattr(c, "layer_windows", ()),
                                softcap=getattr(c, "attn_softcap", 0.0))


def _attention(em: EvalModel, run: MethodRun, method, errors) -> ChunkAttention:
    """The chunk's caches for a pass: the method's for every layer (or its K-only / V-only form), or
    the f32 cache for all layers but `run.layer`."""
    c = em.cfg
    if run.part != "kv":
        cache = PartCache(method, run.part, em.cache(BASELINE), em.block_size, em.gpu)
    else:
        cache = em.cache(method)
    caches = [cache] * c.n_layers
    if run.layer is not None:
        f32 = em.cache(BASELINE)
        caches = [cache if li == run.layer else f32 for li in range(c.n_layers)]
    on_device = em.choice is not None and em.choice.path == "gpu"
    return ChunkAttention(caches, c.n_kv_heads, c.head_size, em.chunking.ctx, errors,
                          em.gpu.rt if on_device else None)


def run_pass(em: EvalModel, run: MethodRun, on_rows: Callable, progress: ProgressFn | None = None,
             cancel: CancelFn | None = None, label: str = "") -> dict:
    """Every chunk through `run`'s caches. After each chunk, for its scored positions r0 .. r0+n-1 (counted from
    the chunk's first scored one), up to ROWS at a time: on_rows(i, r0, logits [n, vocab] float32) on a host thread (any
    order, several at once: it must only compute), and what it returns, when callable, called with no argument
    on this thread in the rows' order (to store them).
    Returns {"layer_error": [...], "cache_path": ..., "wall_s": ...}."""
    method = run.build(em.cfg)
    ch = em.chunking
    errors = _LayerError(em.cfg, em.error_stride)
    runner = em.runner()
    t0 = time.perf_counter()
    cache_path = ""
    queued: deque = deque()  # (chunk, futures of its row blocks) in order
    per_task = max(1, min(ROWS, TASK_BYTES // (8 * int(em.cfg.vocab))))

    def merge_later(checks):  # the layer errors' arithmetic on a host thread, merged in order by commit()
        sums = errors.sums(checks)
        return lambda: errors.merge(sums)

    def commit(until: int) -> None:  # store the finished chunks' rows, oldest first, until `until` are left
        while len(queued) > until:
            for f in queued.popleft()[1]:
                done = f.result()
                if callable(done):
                    done()

    with ThreadPoolExecutor(HOST_THREADS, thread_name_prefix="kvviz-eval-rows") as pool:
        try:
            for i in range(ch.n_chunks):
                if cancel is not None and cancel():
                    raise Cancelled()
                runner.reset()
                attn = _attention(em, run, method, errors)
                cache_path = getattr(attn.caches[run.layer or 0], "path", "") or cache_path

                tokens = ch.chunk(i)
                starts = range(0, tokens.size, PIECE)
                rows = []
                for j, p0 in enumerate(starts):
                    def step(done, total, i=i, j=j):  # the runner's layer passes of this piece
                        if progress is not None:
                            progress((i + (j + done / total) / len(starts)) / ch.n_chunks,
                                     f"{label}: chunk {i + 1}/{ch.n_chunks}")

                    piece = tokens[p0:p0 + PIECE]
                    if p0 + piece.size > ch.first:  # a piece with scored rows: their logits, from the first scored one
                        rows.append(runner.prefill(piece, attend_chunk=attn, all_logits=True,
                                                   logits_from=max(0, ch.first - p0), progress=step, cancel=cancel))
                    else:
                        runner.prefill(piece, attend_chunk=attn, progress=step, cancel=cancel)
                checks = attn.finish()
                logits = rows[0] if len(rows) == 1 else np.concatenate(rows)
                n = logits.shape[0] - 1  # the last position has no next token
                queued.append((i, [pool.submit(on_rows, i, r0, logits[r0:min(r0 + per_task, n)])
                                   for r0 in range(0, n, per_task)]
                               + ([pool.submit(merge_later, checks)] if checks else [])))
                del attn, logits
                commit(AHEAD)
            commit(0)
        except BaseException:
            for _, futs in queued:
                for f in futs:
                    f.cancel()
            raise
    return {"layer_error": errors.result(), "cache_path": cache_path, "wall_s": time.perf_counter() - t0,
            "forward": em.choice.path}


def baseline_identity(em: EvalModel, model_sha: str) -> dict:
    return {"model_sha256": model_sha, **em.chunking.identity(), "baseline": BASELINE_CACHE,
            "block_size": em.block_size}


def ensure_baseline(em: EvalModel, progress: ProgressFn | None = None, cancel: CancelFn | None = None,
                    root=None, model_sha: str | None = None) -> tuple[BaselineStore, dict]:
    """The stored baseline of (model, text, chunking), computed first when there is none: (store, info)
    with info["reused"] and, when computed, its pass's wall time and layer errors."""
    sha = model_sha or file_sha256(em.path)
    ident = baseline_identity(em, sha)
    store = BaselineStore.open(ident, root)
    if store is not None:
        return store, {"reused": True, "folder": str(store.folder), "wall_s": 0.0,
                       "forward": store.meta.get("forward")}
    ch = em.chunking
    em.runner()  # the forward chosen before the writer records it
    info = {"model": str(em.path), "text": ch.names, "tokens": int(ch.tokens.size), "cache": BASELINE_CACHE,
            "adapter": em.gpu.rt.summary.line(), "forward": em.choice.line()}
    w = BaselineWriter(ident, ch.scored, em.cfg.vocab, info, root)
    pos = ch.positions()

    def add(i, r0, logits):
        sl = slice(r0, r0 + logits.shape[0])
        enc = w.encode_rows(logits, ch.targets(i)[sl], pos[sl], i)
        return lambda: w.put(enc)

    try:
        r = run_pass(em, MethodRun(BASELINE, BASELINE), add, progress, cancel, "f32 baseline")
        store = w.finish()
    except BaseException:
        w.abandon()
        raise
    return store, {"reused": False, "folder": str(store.folder), "wall_s": r["wall_s"],
                   "layer_error": r["layer_error"], "forward": info["forward"]}


def measure(em: EvalModel, store: BaselineStore, run: MethodRun, progress: ProgressFn | None = None,
            cancel: CancelFn | None = None) -> tuple[dict, qs.PositionValues]:
    """One pass of `run` against the stored baseline: (row of statistics, its per-position values)."""
    ch = em.chunking
    parts: list[qs.PositionValues] = []
    pos = ch.positions()

    def add(i, r0, logits):
        sl = slice(r0, r0 + logits.shape[0])
        _, base = store.rows(i, sl)
        v = qs.position_values(logits, base, ch.targets(i)[sl], pos[sl], i)
        return lambda: parts.append(v)

    method = run.build(em.cfg)
    r = run_pass(em, run, add, progress, cancel, run.name)
    values = qs.PositionValues.concat(parts)
    row = {"spec": run.spec, "method": run.method, "options": dict(run.options), "part": run.part,
           "part_label": PARTS[run.part], "layer": run.layer,
           "label": "f32 paged cache" if method == BASELINE else method.label,
           "bits_per_element": bits_per_element(method, em.cfg.head_size, em.block_size, ch.ctx),
           "cache_path": r["cache_path"],
           "cache_kind": "native" if method == BASELINE else cache_kind(method),
           "wall_s": r["wall_s"], "forward": r["forward"], "layer_error": r["layer_error"]}
    row.update(qs.summarize(values, ch.ctx))
    return row, values
