"""Host launchers of the TurboQuant kernels: the compressor (tq_compress.wgsl), the query rotation
(tq_rotate_q.wgsl), the UNMODIFIED seed flash_attention_tq.wgsl for decode and causal prefill chunks,
and tq_scores.wgsl (the same estimator's softmax weights or logits over positions).

Family "turboquant" (kvviz/families/catalogue.py): shaders in shaders/turboquant/, kernel specs below,
bit format kvviz/families/turboquant/format.py, numpy reference kvviz/families/turboquant/oracle.py, tests
tests/test_turboquant.py.

The seed kernels' cache (TQCache) is not paged: one cache holds ONE sequence, `cache_cap` positions for every KV
head, in regions (keys [polar | jl | norms], values [polar | norms]) with slot = kv_head * cache_cap + t. The
method's cache is paged: the general compressor below (tq_general_compress) writes per-token records through the
batch's slot mapping (at the seed configuration the seed compressor's words, bit for bit), read by the paged fast
decode (kvviz/families/turboquant/decode.py plan_paged).

Everything is checked on the host before dispatch (docs/kernels.md, "TurboQuant"): head_size a
power of two, <= 128, a multiple of 32 (UnsupportedShape); max_seq <= cache_cap, start_pos + n_queries
<= max_seq, positions [0, max_seq) written, finite inputs, an integral GQA ratio, norms that fit f16
(InvalidInput). Grids larger than the device's per-dimension limit are split (rows / queries).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from kvviz.attention import records as qk
from kvviz.attention.paged import softmax_dispatch
from kvviz.errors import DeviceLimitError, InvalidInput, UnsupportedShape, require_f32
from kvviz.families.turboquant import format as tqf
from kvviz.gpu import loop_budget
from kvviz.gpu.kernel_spec import KernelSpec, Struct, ro, rw
from kvviz.gpu.runtime import Dispatch, GpuRuntime

MAX_HEAD_SIZE = 128
F16_MAX = 65504.0

# ------------------------------------------------------------------------------ kernel specs
# Parameters travel in a 16-word storage buffer `params: array<u32, 16>` (the seed kernel's convention).
_CENTROIDS = " c0:f32 c1:f32 c2:f32 c3:f32"
COMPRESS_PARAMS = Struct("tq_compress_params", "n_rows n_kv_heads head_size cache_cap dst_pos sign_off row_base "
                         "inv_sqrt_d:f32" + _CENTROIDS + " b0:f32 b1:f32 b2:f32", words=16)
ROTATE_PARAMS = Struct("tq_rotate_params", "n_rows n_heads head_size q_cap sign_off row_base inv_sqrt_d:f32", words=16)
ATTENTION_PARAMS = Struct("tq_attention_params", "n_heads n_kv_heads head_size max_seq start_pos scale:f32 q_cap "
                          "out_stride qjl_scale:f32 sign_off" + _CENTROIDS + " q_base cache_cap", words=16)
SCORES_PARAMS = Struct("tq_scores_params", "n_heads n_kv_heads head_size max_seq start_pos scale:f32 q_cap out_len "
                       "qjl_scale:f32 unused" + _CENTROIDS + " q_base cache_cap", words=16)

_COMPRESS = dict(bindings=ro("src") + rw("cache") + ro("signs", "params"), buffers=(("params", COMPRESS_PARAMS),))
COMPRESS_KEYS = KernelSpec("turboquant/tq_compress.wgsl", "tq_compress_keys", **_COMPRESS)
COMPRESS_VALUES = KernelSpec("turboquant/tq_compress.wgsl", "tq_compress_values", **_COMPRESS)
ROTATE_Q = KernelSpec("turboquant/tq_rotate_q.wgsl", "tq_rotate_q", bindings=ro("src") + rw("qrot") + ro("signs", "params"),
                      buffers=(("params", ROTATE_PARAMS),))
FLASH_SEED = KernelSpec("turboquant/flash_attention_tq.wgsl", "flash_attention_tq",
                        bindings=ro("qrot", "k_cache", "v_cache") + rw("out_batch") + ro("params", "signs"),
                        buffers=(("params", ATTENTION_PARAMS),))
SCORES = KernelSpec("turboquant/tq_scores.wgsl", "tq_scores", bindings=ro("qrot", "k_cache") + rw("out") + ro("params") + rw("stats"),
                    buffers=(("params", SCORES_PARAMS),))
# General settings (bits 1-4, the outlier split, head sizes up to 256): compressor into per-token records of
# a paged cache, and a dequantiser into an f32 paged cache the f32 decode attends over.
GENERAL_COMPRESS_PARAMS = Struct("tq_general_compress_params", "n_rows n_kv_heads head_size block_size wpt row_base "
                                 "keys n_ch rot bits chan_off code_off jl_off norm_off inv_sqrt_p:f32", words=16)
_INSTANCE = "n_ch rot bits chan_off sign_off cb_off code_off jl_off norm_off inv_sqrt_p:f32 used qjl_scale:f32"
GENERAL_DEQUANT_PARAMS = Struct(
    "tq_general_dequant_params",
    "n_kv_heads head_size block_size wpt_k wpt_v win0 unused0 unused1 "
    + " ".join(" ".join(f"{w.split(':')[0]}_{slot}" + (":f32" if w.endswith(":f32") else "") for w in _INSTANCE.split())
               for slot in ("k0", "k1", "v0", "v1")),
    words=64)
GENERAL_COMPRESS = KernelSpec("turboquant/tq_general_compress.wgsl", "tq_general_compress",
                              bindings=ro("src", "slots", "chans", "signs", "codebook", "params") + rw("cache"),
                              buffers=(("params", GENERAL_COMPRESS_PARAMS),))
GENERAL_DEQUANT = KernelSpec("turboquant/tq_general_dequant.wgsl", "tq_general_dequant",
                             bindings=ro("k_cache", "v_cache", "chans", "signs", "codebook", "params", "items")
                             + rw("k_out", "v_out"), buffers=(("params", GENERAL_DEQUANT_PARAMS),))
# 64-lane entry points of the same kernels, for rotations of at most 64 coordinates (the same results, 4x fewer
# idle lanes: a software rasteriser pays for every lane at every barrier)
GENERAL_COMPRESS64 = KernelSpec("turboquant/tq_general_compress.wgsl", "tq_general_compress64",
                                bindings=GENERAL_COMPRESS.bindings, buffers=GENERAL_COMPRESS.buffers)
GENERAL_DEQUANT64 = KernelSpec("turboquant/tq_general_dequant.wgsl", "tq_general_dequant64",
                               bindings=GENERAL_DEQUANT.bindings, buffers=GENERAL_DEQUANT.buffers)
KERNELS = (COMPRESS_KEYS, COMPRESS_VALUES, ROTATE_Q, FLASH_SEED, SCORES, GENERAL_COMPRESS, GENERAL_DEQUANT,
           GENERAL_COMPRESS64, GENERAL_DEQUANT64)


def check_general_head_size(head_size: int) -> None:
    """Head sizes of the general-settings kernels: 4..256 (the rotation is padded to a power of two <= 256;
    the f32 paged decode that attends over the dequantised cache holds up to 256)."""
    d = int(head_size)
    if d < 4 or d > tqf.MAX_ROTATION:
        raise UnsupportedShape(
            f"head_size {head_size} is not supported by TurboQuant: the rotation is padded to the next power of "
            f"two, at most {tqf.MAX_ROTATION} (the kernels' 256 lanes), and the vector needs >= 4 channels; the "
            f"nearest head size that works is {4 if d < 4 else tqf.MAX_ROTATION}.",
            f"Use a head size between 4 and {tqf.MAX_ROTATION}.",
        )


def check_head_size(head_size: int) -> None:
    d = int(head_size)
    if d <= 0 or d & (d - 1) or d > MAX_HEAD_SIZE or d % 32:
        raise UnsupportedShape(
            f"head_size {head_size} is not supported by TurboQuant: it must be a power of two (Walsh-Hadamard), "
            f"<= {MAX_HEAD_SIZE} (the kernels' shared arrays) and a multiple of 32 (whole JL sign words).",
            "Use head_size 32, 64 or 128.",
        )


def check_gqa(n_heads: int, n_kv_heads: int) -> None:
    if n_kv_heads <= 0 or n_heads <= 0 or n_heads % n_kv_heads:
        raise UnsupportedShape(
            f"{n_heads} query heads are not a multiple of {n_kv_heads} KV heads",
            "GQA needs num_heads to be a multiple of num_kv_heads.",
        )


def resolve_qjl_scale(qjl_scale, d: int) -> float:
    if isinstance(qjl_scale, str):
        if qjl_scale not in tqf.QJL_SCALES:
            raise InvalidInput(f"qjl_scale must be one of {tqf.QJL_SCALES} or a number, got {qjl_scale!r}")
        return tqf.qjl_scale_value(qjl_scale, d)
    v = float(qjl_scale)
    if not math.isfinite(v):
        raise InvalidInput(f"qjl_scale must be finite, got {qjl_scale}")
    return v


@dataclass
class TQCache:
    """One sequence's compressed K and V on the device, with its sign vectors and centroids."""

    n_kv_heads: int
    head_size: int
    cache_cap: int
    params: tqf.TQParams
    k: object
    v: object
    signs: object
    written: np.ndarray = field(default=None)  # [cache_cap] bool: positions written so far

    @property
    def seed(self) -> int:
        return self.params.seed

    @property
    def layer(self) -> int:
        return self.params.layer

    @property
    def k_words(self) -> int:
        return tqf.key_cache_words(self.n_kv_heads, self.cache_cap, self.head_size)

    @property
    def v_words(self) -> int:
        return tqf.value_cache_words(self.n_kv_heads, self.cache_cap, self.head_size)

    @property
    def length(self) -> int:
        """Positions [0, length) are all written."""
        if not self.written.any():
            return 0
        if self.written.all():
            return self.cache_cap
        return int(np.argmin(self.written))

    key_bytes_per_vector = staticmethod(tqf.key_bytes_per_vector)
    value_bytes_per_vector = staticmethod(tqf.value_bytes_per_vector)

    @property
    def nbytes(self) -> int:
        return (self.k_words + self.v_words) * 4


class TurboQuantKernels:
    """Launchers for one runtime."""

    def __init__(self, rt: GpuRuntime):
        self.rt = rt

    # ------------------------------------------------------------------ kernels
    def _compress_kernel(self, which: str):
        return self.rt.compile(COMPRESS_KEYS if which == "k" else COMPRESS_VALUES)

    def _rotate_kernel(self):
        return self.rt.compile(ROTATE_Q)

    def _seed_kernel(self):
        return self.rt.compile(FLASH_SEED)

    def _scores_kernel(self):
        return self.rt.compile(SCORES)

    # ------------------------------------------------------------------ cache
    def allocate(self, n_kv_heads: int, head_size: int, cache_cap: int, seed: int = tqf.DEFAULT_SEED, layer: int = 0) -> TQCache:
        check_head_size(head_size)
        if n_kv_heads <= 0 or cache_cap <= 0:
            raise InvalidInput(f"n_kv_heads and cache_cap must be positive, got {n_kv_heads} and {cache_cap}")
        if layer < 0 or seed < 0:
            raise InvalidInput(f"seed and layer must be non-negative, got {seed} and {layer}")
        p = tqf.TQParams(int(head_size), int(seed), int(layer))
        kw = tqf.key_cache_words(n_kv_heads, cache_cap, head_size)
        vw = tqf.value_cache_words(n_kv_heads, cache_cap, head_size)
        k = self.rt.empty(kw * 4, "tq_k_cache")
        v = self.rt.empty(vw * 4, "tq_v_cache")
        # wgpu zero-fills new buffers: unwritten slots read as zero words (a zero vector).
        signs = self.rt.upload(p.signs_buffer(), "tq_signs")
        return TQCache(int(n_kv_heads), int(head_size), int(cache_cap), p, k, v, signs, np.zeros(int(cache_cap), bool))

    def read(self, cache: TQCache) -> tuple[np.ndarray, np.ndarray]:
        """Host copies of the (K, V) cache words."""
        return self.rt.read(cache.k, np.uint32, (cache.k_words,)), self.rt.read(cache.v, np.uint32, (cache.v_words,))

    # ------------------------------------------------------------------ compress
    def compress_dispatches(self, cache: TQCache, keys, values, start_pos: int = 0) -> list[Dispatch]:
        """Validate, upload, and return the dispatches that write keys/values [tokens, kv_heads, d] of
        ONE sequence at positions start_pos.. of `cache` (not yet run; the positions are marked written
        now, so run the dispatches before attending)."""
        desc = f"[tokens, {cache.n_kv_heads}, {cache.head_size}]"
        keys = require_f32("keys", keys, desc, 3)
        values = require_f32("values", values, desc, 3)
        if keys.shape[1:] != (cache.n_kv_heads, cache.head_size) or values.shape != keys.shape:
            raise InvalidInput(f"keys/values must both be {desc}; got {keys.shape} and {values.shape}")
        T = keys.shape[0]
        start_pos = int(start_pos)
        if start_pos < 0 or start_pos + T > cache.cache_cap:
            raise InvalidInput(
                f"positions {start_pos}..{start_pos + T - 1} do not fit a cache of {cache.cache_cap} positions",
                "Allocate the cache with a larger cache_cap.",
            )
        for name, a in (("keys", keys), ("values", values)):
            if T and float(np.sqrt((a.astype(np.float64) ** 2).sum(-1)).max()) > F16_MAX:
                raise InvalidInput(
                    f"a {name} vector has a norm above {F16_MAX:g}: TurboQuant stores norms as f16",
                    "Scale the input down; f16 norms overflow to infinity.",
                )
        if T == 0:
            return []
        p = cache.params
        c, b = p.centroids, p.boundaries
        out: list[Dispatch] = []
        chunk = self.rt.max_grid
        if cache.n_kv_heads > chunk:
            raise DeviceLimitError(f"{cache.n_kv_heads} KV heads exceed the grid limit {chunk}.")
        kb = self.rt.upload(keys, "tq_keys")
        vb = self.rt.upload(values, "tq_values")
        for base in range(0, T, chunk):
            rows = min(chunk, T - base)
            prm = COMPRESS_PARAMS.array(
                T, cache.n_kv_heads, cache.head_size, cache.cache_cap, start_pos, p.sign_off, base,
                tqf.inv_sqrt_d(cache.head_size), *c, *b,
            )
            pb = self.rt.upload(prm, "tq_compress_params")
            grid = (rows, cache.n_kv_heads, 1)
            out.append(self._compress_kernel("k").dispatch(grid, [kb, cache.k, cache.signs, pb]))
            out.append(self._compress_kernel("v").dispatch(grid, [vb, cache.v, cache.signs, pb]))
        cache.written[start_pos : start_pos + T] = True
        return out

    def compress(self, cache: TQCache, keys, values, start_pos: int = 0) -> None:
        self.rt.run(self.compress_dispatches(cache, keys, values, start_pos))

    # ------------------------------------------------------------------ rotate
    def rotate_q_dispatches(self, q, params: tqf.TQParams, signs_buf=None, q_cap: int | None = None):
        """q [n_q, n_heads, d] f32 -> (dispatches, buffer [q_rot | q_jl | sums], q_cap)."""
        check_head_size(params.head_size)
        q = require_f32("q", q, f"[n_queries, n_heads, {params.head_size}]", 3)
        nq, H, d = q.shape
        if d != params.head_size:
            raise InvalidInput(f"q has head size {d}, the cache {params.head_size}")
        if nq == 0:
            raise InvalidInput("q has no query rows")
        q_cap = nq if q_cap is None else int(q_cap)
        if q_cap < nq:
            raise InvalidInput(f"q_cap {q_cap} is smaller than the {nq} query rows")
        if H > self.rt.max_grid:
            raise DeviceLimitError(f"{H} heads exceed the grid limit {self.rt.max_grid}.")
        if signs_buf is None:
            signs_buf = self.rt.upload(params.signs_buffer(), "tq_signs")
        out = self.rt.empty((2 * q_cap * H * d + q_cap * H) * 4, "tq_qrot")
        qb = self.rt.upload(q, "tq_q")
        ds = []
        for base in range(0, nq, self.rt.max_grid):
            rows = min(self.rt.max_grid, nq - base)
            prm = ROTATE_PARAMS.array(nq, H, d, q_cap, params.sign_off, base, tqf.inv_sqrt_d(d))
            ds.append(self._rotate_kernel().dispatch((rows, H, 1), [qb, out, signs_buf, self.rt.upload(prm, "tq_rotate_params")]))
        return ds, out, q_cap

    def rotate_q(self, q, params: tqf.TQParams, q_cap: int | None = None) -> np.ndarray:
        """Run tq_rotate_q; returns the whole [q_rot | q_jl | sums] buffer as f32."""
        ds, buf, q_cap = self.rotate_q_dispatches(q, params, q_cap=q_cap)
        self.rt.run(ds)
        nq, H, d = np.asarray(q).shape
        return self.rt.read(buf, np.float32, (2 * q_cap * H * d + q_cap * H,))

    # ------------------------------------------------------------------ attention
    def _check_attention(self, cache: TQCache, q, start_pos: int, max_seq, scale: float, qjl_scale):
        q = require_f32("q", q, f"[n_queries, n_heads, {cache.head_size}]", 3)
        nq, H, d = q.shape
        if d != cache.head_size:
            raise InvalidInput(f"q has head size {d}, the cache {cache.head_size}")
        check_gqa(H, cache.n_kv_heads)
        if nq == 0:
            raise InvalidInput("q has no query rows")
        start_pos = int(start_pos)
        if start_pos < 0:
            raise InvalidInput(f"start_pos must be >= 0, got {start_pos}")
        max_seq = start_pos + nq if max_seq is None else int(max_seq)
        if max_seq > cache.cache_cap:
            raise InvalidInput(
                f"max_seq {max_seq} exceeds the cache capacity {cache.cache_cap}",
                "max_seq bounds the positions read; it cannot exceed cache_cap.",
            )
        if start_pos + nq > max_seq:
            raise InvalidInput(
                f"start_pos + n_queries = {start_pos + nq} exceeds max_seq {max_seq}",
                "The last query sits at position start_pos + n_queries - 1 and must be < max_seq.",
            )
        if not cache.written[:max_seq].all():
            missing = int(np.flatnonzero(~cache.written[:max_seq])[0])
            raise InvalidInput(
                f"position {missing} of the cache was never written, but max_seq is {max_seq}",
                "Compress every position the queries attend to first.",
            )
        with np.errstate(over="ignore"):
            scale32 = np.float32(scale)
        if not np.isfinite(scale) or not np.isfinite(scale32):
            raise InvalidInput(f"softmax scale must be a finite float32 (|scale| < 3.4e38), got {scale}")
        if H > self.rt.max_grid:
            raise DeviceLimitError(f"{H} heads exceed the grid limit {self.rt.max_grid}.")
        return q, start_pos, max_seq, resolve_qjl_scale(qjl_scale, d)

    def attention_dispatches(self, cache: TQCache, q, start_pos: int, scale: float, qjl_scale="reference", max_seq=None):
        """Rotation + seed flash_attention_tq dispatches for queries [n_q, n_heads, d] at positions
        start_pos..start_pos+n_q-1 (causal; n_q = 1 and start_pos = pos is decode).
        Returns (dispatches, out buffer [n_q, n_heads, d] f32)."""
        q, start_pos, max_seq, qs = self._check_attention(cache, q, start_pos, max_seq, scale, qjl_scale)
        nq, H, d = q.shape
        # The seed runs as given: one workgroup walks the query's whole window, so a software
        # rasteriser's loop limit bounds the context it can take.
        loop_budget.check(self.rt, "The TurboQuant seed kernel (flash_attention_tq)",
                          lambda n: loop_budget.tq_seed_flash(n, d), max_seq)
        ds, qrot, q_cap = self.rotate_q_dispatches(q, cache.params, cache.signs)
        out = self.rt.empty(nq * H * d * 4, "tq_attn_out")
        c = cache.params.centroids
        for base in range(0, nq, self.rt.max_grid):
            rows = min(self.rt.max_grid, nq - base)
            prm = ATTENTION_PARAMS.array(
                H, cache.n_kv_heads, d, max_seq, start_pos, scale, q_cap, H * d, qs, cache.params.sign_off, *c,
                base, cache.cache_cap,
            )
            ds.append(self._seed_kernel().dispatch(
                (H, rows, 1), [qrot, cache.k, cache.v, out, self.rt.upload(prm, "tq_attn_params"), cache.signs]))
        return ds, out

    def attention(self, cache: TQCache, q, start_pos: int, scale: float, qjl_scale="reference", max_seq=None) -> np.ndarray:
        """Run the seed kernel; returns [n_q, n_heads, d] f32."""
        ds, out = self.attention_dispatches(cache, q, start_pos, scale, qjl_scale, max_seq)
        self.rt.run(ds)
        nq, H, d = np.asarray(q).shape
        return self.rt.read(out, np.float32, (nq, H, d))

    def decode(self, cache: TQCache, q, pos: int, scale: float, qjl_scale="reference") -> np.ndarray:
        """One query [n_heads, d] at position pos, attending over [0, pos]: [n_heads, d] f32."""
        q = np.asarray(q)
        return self.attention(cache, q.reshape((1,) + q.shape[-2:]), pos, scale, qjl_scale, max_seq=int(pos) + 1)[0]

    def prefill(self, cache: TQCache, q, start_pos: int, scale: float, qjl_scale="reference") -> np.ndarray:
        """A causal chunk of queries [n, n_heads, d] at positions start_pos..start_pos+n-1."""
        return self.attention(cache, q, start_pos, scale, qjl_scale)

    # ------------------------------------------------------------------ scores
    def scores_dispatches(self, cache: TQCache, q, start_pos: int, scale: float, qjl_scale="reference", max_seq=None,
                          mode: str = "weights"):
        """tq_scores dispatches: softmax weights (mode 'weights') or logits ('logits') of the seed's estimator,
        [n_q, n_heads, max_seq] f32 (0 past each query's causal window)."""
        if mode not in ("weights", "logits"):
            raise InvalidInput(f"mode must be 'weights' or 'logits', got {mode!r}")
        q, start_pos, max_seq, qs = self._check_attention(cache, q, start_pos, max_seq, scale, qjl_scale)
        nq, H, d = q.shape
        loop_budget.check(self.rt, "tq_scores", lambda n: max(loop_budget.tq_scores_partition(d),
                                                              loop_budget.softmax_partitioned(n)), max_seq)
        ds, qrot, q_cap = self.rotate_q_dispatches(q, cache.params, cache.signs)
        out_len = max(max_seq, 1)
        parts = -(-out_len // loop_budget.PARTITION)
        if parts > self.rt.max_grid:
            raise DeviceLimitError(f"{out_len} positions need {parts} partitions, over the grid limit {self.rt.max_grid}.")
        out = self.rt.empty(nq * H * out_len * 4, "tq_scores_out")
        c = cache.params.centroids
        for base in range(0, nq, self.rt.max_grid):
            rows = min(self.rt.max_grid, nq - base)
            prm = SCORES_PARAMS.array(H, cache.n_kv_heads, d, max_seq, start_pos, scale, q_cap, out_len, qs, 0, *c,
                                      base, cache.cache_cap)
            stats = self.rt.empty(rows * H * parts * 2 * 4, "tq_scores_stats")
            ds.append(self._scores_kernel().dispatch(
                (H, rows, parts), [qrot, cache.k, out, self.rt.upload(prm, "tq_scores_params"), stats]))
            if mode == "weights":
                pos = start_pos + base + np.arange(rows, dtype=np.int64)
                lens = np.minimum(np.minimum(pos + 1, max_seq), out_len).astype(np.uint32)
                ds.append(softmax_dispatch(self.rt, stats, self.rt.upload(lens, "tq_row_lens"), out, H, rows, out_len,
                                           parts, normaliser=1, row_base=base))
        return ds, out, out_len

    def scores(self, cache: TQCache, q, start_pos: int, scale: float, qjl_scale="reference", max_seq=None,
               mode: str = "weights") -> np.ndarray:
        ds, out, out_len = self.scores_dispatches(cache, q, start_pos, scale, qjl_scale, max_seq, mode)
        self.rt.run(ds)
        nq, H, _ = np.asarray(q).shape
        return self.rt.read(out, np.float32, (nq, H, out_len))


# ---------------------------------------------------------------------- traffic
def compress_bytes(cache: TQCache, tokens: int) -> int:
    """Unique bytes of compressing `tokens` positions: f32 K and V in, compressed K and V out."""
    d, kvh = cache.head_size, cache.n_kv_heads
    return int(tokens * kvh * (2 * d * 4 + TQCache.key_bytes_per_vector(d) + TQCache.value_bytes_per_vector(d)))


def attention_bytes(cache: TQCache, n_queries: int, n_heads: int, max_seq: int) -> int:
    """Unique bytes of the seed kernel: rotated queries, the compressed K and V of max_seq positions, the output."""
    d, kvh = cache.head_size, cache.n_kv_heads
    q = n_queries * n_heads * (2 * d + 1) * 4
    kv = max_seq * kvh * (TQCache.key_bytes_per_vector(d) + TQCache.value_bytes_per_vector(d))
    return int(q + kv + n_queries * n_heads * d * 4 + 2 * d * 4)


def scores_bytes(cache: TQCache, n_queries: int, n_heads: int, max_seq: int) -> int:
    d, kvh = cache.head_size, cache.n_kv_heads
    return int(n_queries * n_heads * (2 * d + 1) * 4 + max_seq * kvh * TQCache.key_bytes_per_vector(d)
               + n_queries * n_heads * max_seq * 4)


# ---------------------------------------------------------------------- general settings
@dataclass
class GeneralTQCache:
    """A general-settings TurboQuant cache of one batch: paged K/V records (kvviz.attention.records.QuantCache)
    and what the kernels read next to them (channel tables, signs, codebooks of every instance)."""

    settings: tqf.TQSettings
    qc: object  # kvviz.attention.records.QuantCache
    chans: np.ndarray  # [2 (K, V), kv_heads, d] u32
    chans_buf: object
    signs_buf: object
    codebook_buf: object
    offsets: dict  # (which, i) -> (sign_off, cb_off)


def general_allocate(rt: GpuRuntime, st: tqf.TQSettings, batch, kvh: int, chans_k, chans_v) -> GeneralTQCache:
    d = st.head_size
    check_general_head_size(d)
    qc = qk.alloc_cache(rt, "turboquant", batch, kvh, d, batch.block_size * st.wpt("K"), batch.block_size * st.wpt("V"))
    chans = np.stack([np.asarray(chans_k, np.uint32), np.asarray(chans_v, np.uint32)])
    signs, books, offsets = [], [], {}
    so = co = 0
    for which in ("K", "V"):
        for i, ins in enumerate(st.instances(which)):
            sp, sj = ins.signs
            c, b = ins.codebook
            offsets[(which, i)] = (so, co)
            signs += [sp, sj]
            books += [c, b]
            so += 2 * ins.P
            co += len(c) + len(b)
    return GeneralTQCache(st, qc, chans, rt.upload(chans, "tq_chans"), rt.upload(np.concatenate(signs), "tq_gen_signs"),
                          rt.upload(np.concatenate(books).astype(np.float32), "tq_gen_codebooks"), offsets)


def general_compress_dispatches(rt: GpuRuntime, gc: GeneralTQCache, key: np.ndarray, value: np.ndarray,
                                slots: np.ndarray) -> list[Dispatch]:
    """The compressor over token rows key/value [T, kvh, d] (slots: PAD_SLOT rows skipped): one dispatch
    per (K|V, instance, chunk of <= max_grid rows)."""
    st = gc.settings
    T, kvh, d = key.shape
    if T == 0:
        return []
    if kvh > rt.max_grid:
        raise DeviceLimitError(f"{kvh} KV heads exceed the grid limit {rt.max_grid}.")
    kerns = {256: rt.compile(GENERAL_COMPRESS), 64: rt.compile(GENERAL_COMPRESS64)}
    sb = rt.upload(np.asarray(slots, np.int64).astype(np.uint32), "tq_gen_slots")
    out: list[Dispatch] = []
    for which, x, cache in (("K", key, gc.qc.k), ("V", value, gc.qc.v)):
        xb = rt.upload(np.ascontiguousarray(x, np.float32), "tq_gen_src")
        cb = rt.upload(gc.chans[0 if which == "K" else 1], "tq_gen_chans")
        for i, ins in enumerate(st.instances(which)):
            sp, sj = ins.signs
            c, b = ins.codebook
            signs = rt.upload(np.concatenate([sp, sj]), "tq_gen_inst_signs")
            book = rt.upload(np.concatenate([c, b]).astype(np.float32), "tq_gen_inst_codebook")
            for base in range(0, T, rt.max_grid):
                rows = min(rt.max_grid, T - base)
                prm = GENERAL_COMPRESS_PARAMS.array(
                    T, kvh, d, gc.qc.block_size, st.wpt(which), base, int(which == "K"), ins.n_ch, ins.P, ins.bits,
                    ins.chan_off, ins.code_off, max(ins.jl_off, 0), ins.norm_off, tqf.inv_sqrt_d(ins.P))
                kern = kerns[64 if ins.P <= 64 else 256]
                out.append(kern.dispatch((rows, kvh, 1), [xb, sb, cb, signs, book, rt.upload(prm, "tq_gen_params"), cache]))
    return out


def general_dequant_dispatches(ctx, gc: GeneralTQCache, f32c, batch, qjl_scale: str = "reference") -> list[Dispatch]:
    """Dequantise the batch's used blocks into the f32 paged cache (keys with the QJL term at `qjl_scale`)."""
    st = gc.settings
    small = max(i.P for w in ("K", "V") for i in st.instances(w)) <= 64
    kern = ctx.rt.compile(GENERAL_DEQUANT64 if small else GENERAL_DEQUANT)
    slots = []
    for which in ("K", "V"):
        inst = st.instances(which)
        for i in range(2):
            if i < len(inst):
                ins = inst[i]
                so, co = gc.offsets[(which, i)]
                qs = tqf.qjl_scale_general(qjl_scale, ins.P) if which == "K" else 0.0
                slots += [ins.n_ch, ins.P, ins.bits, ins.chan_off, so, co, ins.code_off, max(ins.jl_off, 0),
                          ins.norm_off, tqf.inv_sqrt_d(ins.P), 1, qs]
            else:
                slots += [0] * 10 + [0, 0.0]

    def params(w0):
        return ctx.rt.upload(GENERAL_DEQUANT_PARAMS.array(gc.qc.num_kv_heads, st.head_size, gc.qc.block_size,
                                                          st.wpt("K"), st.wpt("V"), w0, 0, 0, *slots), "tq_gen_dq_params")

    bufs = [gc.qc.k, gc.qc.v, gc.chans_buf, gc.signs_buf, gc.codebook_buf]
    out = []
    items = qk.dequant_items(batch)
    for w0, nb, kb, vb in qk.f32_windows(ctx, f32c):
        sel = items[(items[:, 0] >= w0) & (items[:, 0] < w0 + nb)]
        pb = params(w0)
        for a, b in qk.row_chunks(ctx.rt, len(sel), 16):
            chunk = np.ascontiguousarray(sel[a:b])
            out.append(kern.dispatch((b - a, gc.qc.num_kv_heads, 2),
                                     bufs + [pb, ctx.rt.upload(chunk, "tq_gen_items"), kb, vb]))
    return out
