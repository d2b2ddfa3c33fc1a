"""Shared host logic of the quantised paged caches (int8_token, int4_group, fp8_*, kivi, the llama.cpp
types, NVFP4): checks, cache allocation, chunked token dispatches and dequantise windows.

The families' own kernel specs are in kvviz/families/<family>/kernels.py (shaders in shaders/<family>/,
each including shaders/common/quant.wgsl), their bit formats and numpy oracles beside them; tests
tests/test_quant_methods.py.

Every method here has
  - a WGSL writer that quantises token rows into a u32 paged cache, addressed through the batch's
    slot_mapping (and, for KIVI's key groups, its block tables);
  - a WGSL dequantise kernel that expands the used blocks into an f32 PagedCache of layout
    [num_blocks, kv_heads, block_size, head_size] (allocated with ctx.paged.allocate("f32", ...)),
    so attention runs through the f32 baseline kernels (ctx.paged.decode / ctx.paged.weights).

Device limits: writer dispatches are chunked so no grid dimension exceeds rt.max_grid and no
uploaded input exceeds rt.max_binding; the dequantise kernel binds the f32 cache one window of
blocks at a time (the same windows the f32 decode uses) with at most rt.max_grid blocks a dispatch.
A quantised cache must fit one storage binding (it is 4x-16x smaller than the f32 cache): a larger
one raises DeviceLimitError before anything is dispatched.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np

from kvviz.errors import DeviceLimitError, InvalidInput, UnsupportedShape, check_finite
from kvviz.gpu.kernel_spec import KernelSpec, Struct, ro, rw
from kvviz.gpu.runtime import Dispatch, GpuRuntime
from kvviz.attention.paged import MAX_HEAD_SIZE, PagedCache
from kvviz.paging import PAD_SLOT, PagedBatch

log = logging.getLogger("kvviz.attention.records")

# ------------------------------------------------------------------------------ kernel specs
# Writers: grid (token rows, kv heads, K|V or 1); dequantisers: grid (work items, kv heads, K|V).
WRITE_IMM = Struct("P", "kvh hd bs wpt")
DEQUANT_IMM = Struct("P", "kvh hd bs wpt win0")
TOKENS = ro("key_in", "val_in", "slots")
DEQUANT_OUT = rw("k_out", "v_out")

# Self-tests of common.wgsl's helpers (take the FP8 defines).
_SELFTEST = dict(bindings=ro("a_in", "b_in") + rw("out"), immediates=Struct("P", "n row"))
SELFTEST_DIV = KernelSpec("common/selftest.wgsl", "div_test", **_SELFTEST)
SELFTEST_FP8 = KernelSpec("common/selftest.wgsl", "fp8_test", **_SELFTEST)

KERNELS = {"selftest": (SELFTEST_DIV, SELFTEST_FP8)}


# ----------------------------------------------------------------------------------- validation
def nearest_head_sizes(head_size: int, works, most: int = MAX_HEAD_SIZE) -> str:
    """"the nearest head sizes that work are 96 and 128" (or "... head size that works is 256"): the head sizes nearest
    `head_size`, one below and one above, in 1..`most` for which `works(size)` holds: what a refusal offers instead."""
    below = next((d for d in range(min(head_size, most + 1) - 1, 0, -1) if works(d)), None)
    above = next((d for d in range(max(head_size, 0) + 1, most + 1) if works(d)), None)
    found = [str(d) for d in (below, above) if d is not None]
    if len(found) == 2:
        return f"the nearest head sizes that work are {found[0]} and {found[1]}"
    return f"the nearest head size that works is {found[0]}" if found else f"no head size up to {most} works"


def check_common_shape(num_heads: int, num_kv_heads: int, head_size: int, block_size: int, multiple: int, what: str,
                       elsewhere: str = ""):
    """The shape checks every per-token-record method shares; a head size that is not a multiple of `multiple` (why:
    `what`) is refused naming the nearest sizes that work, and `elsewhere` (what another engine does with such a
    model) in the hint."""
    if num_kv_heads <= 0 or num_heads <= 0 or block_size <= 0:
        raise InvalidInput("num_heads, num_kv_heads and block_size must be positive")
    if num_heads % num_kv_heads:
        raise UnsupportedShape(
            f"{num_heads} query heads are not divisible by {num_kv_heads} KV heads",
            "GQA needs num_heads to be a multiple of num_kv_heads.",
        )
    if head_size <= 0 or head_size > MAX_HEAD_SIZE:
        raise UnsupportedShape(
            f"head_size {head_size} is not supported: attention runs through the f32 paged decode, "
            f"which holds the query in a {MAX_HEAD_SIZE}-float shared array; "
            f"{nearest_head_sizes(head_size, lambda d: d % multiple == 0)}.",
            f"Use a head size up to {MAX_HEAD_SIZE}.",
        )
    if head_size % multiple:
        raise UnsupportedShape(
            f"head_size {head_size} is not a multiple of {multiple}: {what}; "
            f"{nearest_head_sizes(head_size, lambda d: d % multiple == 0)}.",
            f"Use a head size that is a multiple of {multiple}." + (f" {elsewhere}" if elsewhere else ""),
        )


def check_kv(key, value, num_kv_heads: int | None = None, head_size: int | None = None):
    """float32 [tokens, kv_heads, head_size] key and value of the same shape, all finite."""
    out = []
    for name, a in (("key", key), ("value", value)):
        arr = np.asarray(a)
        if arr.dtype != np.float32:
            raise InvalidInput(f"{name} must be float32, got {arr.dtype}", "Convert with .astype(np.float32).")
        if arr.ndim != 3:
            raise InvalidInput(f"{name} must be [num_tokens, num_kv_heads, head_size], got shape {arr.shape}")
        check_finite(name, arr)
        out.append(np.ascontiguousarray(arr))
    k, v = out
    if k.shape != v.shape:
        raise InvalidInput(f"key and value shapes differ: {k.shape} vs {v.shape}")
    if num_kv_heads is not None and k.shape[1] != num_kv_heads:
        raise InvalidInput(f"key has {k.shape[1]} KV heads, expected {num_kv_heads}")
    if head_size is not None and k.shape[2] != head_size:
        raise InvalidInput(f"key has head size {k.shape[2]}, expected {head_size}")
    return k, v


def check_batch(batch: PagedBatch, num_tokens: int) -> np.ndarray:
    """Validate the batch against the token rows; returns slot_mapping as int64."""
    batch.validate()
    sm = np.asarray(batch.slot_mapping)
    if sm.dtype.kind not in "ui" or sm.shape != (num_tokens,):
        raise InvalidInput(
            f"slot_mapping must be an integer array of length {num_tokens} (one per key row), got {sm.dtype} {sm.shape}"
        )
    return sm.astype(np.int64)


def check_magnitude(name: str, arr: np.ndarray, limit: float = 2.0**126) -> None:
    """Asymmetric quantisers compute max - min in float32: |x| < 2^126 keeps it finite."""
    if arr.size and float(np.abs(arr).max()) >= limit:
        raise InvalidInput(
            f"{name} has values of magnitude >= 2^126 ({float(np.abs(arr).max()):.3g}): max - min of a group "
            "would overflow float32.",
            "Scale the input down; asymmetric (min/max) quantisers need |x| < 8.5e37.",
        )


# -------------------------------------------------------------------------------- the cache
@dataclass
class QuantCache:
    """A quantised paged cache: K and V u32 buffers of `k_words` / `v_words` words per (block, kv head).

    Per-token formats: words per (block, head) = block_size * words_per_token; a token's record is
    at ((block * kv_heads + head) * words_per_block_head + offset * words_per_token).
    """

    method: str
    num_blocks: int
    num_kv_heads: int
    block_size: int
    head_size: int
    k_words: int  # words per (block, kv head) in the K buffer
    v_words: int
    k: object
    v: object
    extra: dict = field(default_factory=dict)  # side buffers (tensor scales, residual rows, ...)

    @property
    def nbytes(self) -> int:
        return self.num_blocks * self.num_kv_heads * (self.k_words + self.v_words) * 4

    def shape(self, which: str) -> tuple[int, int, int]:
        return (self.num_blocks, self.num_kv_heads, self.k_words if which == "K" else self.v_words)


def alloc_words(rt: GpuRuntime, nwords: int, label: str):
    nbytes = max(4, int(nwords) * 4)
    if nbytes > rt.max_binding:
        raise DeviceLimitError(
            f"{label} needs {nbytes / 2**20:.1f} MiB, over the storage-binding limit of "
            f"{rt.max_binding / 2**20:.1f} MiB ({rt.summary.name}); quantised caches are bound whole.",
            "Use fewer blocks (a smaller pool) or a GPU with a larger binding limit.",
        )
    return rt.empty(nbytes, label)


def alloc_cache(rt: GpuRuntime, method: str, batch: PagedBatch, kvh: int, D: int, k_words: int, v_words: int) -> QuantCache:
    n = batch.num_blocks * kvh
    k = alloc_words(rt, n * k_words, f"{method}_k_cache")
    v = alloc_words(rt, n * v_words, f"{method}_v_cache")
    return QuantCache(method, batch.num_blocks, kvh, batch.block_size, D, k_words, v_words, k, v)


def read_cache(rt: GpuRuntime, qc: QuantCache, which: str) -> np.ndarray:
    buf = qc.k if which == "K" else qc.v
    n = int(np.prod(qc.shape(which)))
    return rt.read(buf, np.uint32, qc.shape(which), nbytes=n * 4)


def token_records(full: np.ndarray, batch: PagedBatch, wpt: int) -> np.ndarray:
    """Per-token records [tokens, kvh, wpt] (zeros for padding rows) from a [nb, kvh, bs*wpt(+side)] cache."""
    bs = batch.block_size
    recs = full[:, :, : bs * wpt].reshape(full.shape[0], full.shape[1], bs, wpt)
    sm = batch.slot_mapping.astype(np.int64)
    real = sm != PAD_SLOT
    out = np.zeros((len(sm), full.shape[1], wpt), dtype=np.uint32)
    out[real] = recs[sm[real] // bs, :, sm[real] % bs, :]
    return out


# ----------------------------------------------------------------------------------- dispatch
def row_chunks(rt: GpuRuntime, n: int, row_bytes: int) -> list[tuple[int, int]]:
    """[start, stop) chunks of `n` rows: <= max_grid rows and <= max_binding bytes each."""
    per = min(rt.max_grid, max(1, rt.max_binding // max(1, row_bytes)))
    return [(s, min(n, s + per)) for s in range(0, n, per)]


def token_dispatches(rt, kernel, key, value, slots, cache_bufs, imm_fn, extra_rows=(), z: int = 2) -> list[Dispatch]:
    """Writer dispatches over token rows: grid (rows, kv_heads, z), chunked.

    Bindings: key chunk, value chunk, slots chunk, *extra row arrays (chunked the same way), *cache_bufs.
    imm_fn(rows_in_chunk) -> immediates bytes.
    """
    T, kvh, D = key.shape
    out = []
    chunks = row_chunks(rt, T, kvh * D * 4)
    if len(chunks) > 1:
        log.info("%s: %d token rows in %d chunks (grid and storage-binding limits)", kernel.name, T, len(chunks))
    for a, b in chunks:
        bufs = [rt.upload(key[a:b], "key"), rt.upload(value[a:b], "value"), rt.upload(slots[a:b].astype(np.uint32), "slots")]
        bufs += [rt.upload(np.ascontiguousarray(e[a:b]), "rows") for e in extra_rows]
        bufs += list(cache_bufs)
        out.append(kernel.dispatch((b - a, kvh, z), bufs, imm=imm_fn(b - a)))
    return out


def dequant_items(batch: PagedBatch) -> np.ndarray:
    """[n, 4] u32 work items of the dequantise kernels: (physical block, seq, logical block, 0), used blocks only."""
    items = []
    for s, blocks in enumerate(batch.seq_blocks):
        for lb, b in enumerate(blocks):
            items.append((int(b), s, lb, 0))
    if not items:
        return np.zeros((0, 4), np.uint32)
    arr = np.asarray(items, dtype=np.uint32)
    return arr[np.argsort(arr[:, 0], kind="stable")]


def f32_windows(ctx, f32c: PagedCache):
    """(first block, number of blocks, K binding, V binding) windows of the f32 cache."""
    W = ctx.paged.window_blocks(f32c)
    whole = W >= f32c.num_blocks and f32c.nbytes <= ctx.rt.max_binding
    res = []
    for w0 in range(0, f32c.num_blocks, W):
        nb = min(W, f32c.num_blocks - w0)
        if whole:
            res.append((0, nb, f32c.k, f32c.v))
        else:
            off, size = w0 * f32c.block_bytes, nb * f32c.block_bytes
            res.append((w0, nb, (f32c.k, off, size), (f32c.v, off, size)))
    return res


def dequant_dispatches(ctx, kernel, in_bufs, f32c: PagedCache, batch: PagedBatch, imm_fn, items=None) -> list[Dispatch]:
    """Dequantise dispatches: grid (items in chunk, kv_heads, 2 = K/V), one window of the f32 cache each.

    Bindings: *in_bufs, items chunk, f32 K window, f32 V window. imm_fn(win_first_block) -> immediates.
    """
    rt = ctx.rt
    items = dequant_items(batch) if items is None else items
    out = []
    windows = f32_windows(ctx, f32c)
    if len(windows) > 1:
        log.info("%s: the f32 cache is bound in %d windows", kernel.name, len(windows))
    for w0, nb, kb, vb in windows:
        sel = items[(items[:, 0] >= w0) & (items[:, 0] < w0 + nb)]
        for a, b in row_chunks(rt, len(sel), 16):
            chunk = np.ascontiguousarray(sel[a:b])
            bufs = list(in_bufs) + [rt.upload(chunk, "dequant_items"), kb, vb]
            out.append(kernel.dispatch((b - a, f32c.num_kv_heads, 2), bufs, imm=imm_fn(w0)))
    return out


def alloc_f32(ctx, batch: PagedBatch, kvh: int, D: int) -> PagedCache:
    return ctx.paged.allocate("f32", batch.num_blocks, kvh, batch.block_size, D)


# ------------------------------------------------------------------------------- self tests
def _elementwise(rt: GpuRuntime, kern, a: np.ndarray, b: np.ndarray, out_words: int) -> np.ndarray:
    n = len(a)
    groups = -(-n // 64)
    gx = min(groups, rt.max_grid)
    gy = -(-groups // gx)
    out = rt.empty(out_words * 4, "selftest_out")
    rt.run([kern.dispatch((gx, gy, 1), [rt.upload(a, "a"), rt.upload(b, "b"), out], n=n, row=gx * 64)])
    return rt.read(out, np.uint32, nbytes=out_words * 4)


def selftest_div(rt: GpuRuntime, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """div_rn_bits(a, b) on the GPU, element-wise: float32 results (compare bits with numpy a / b)."""
    a = np.ascontiguousarray(a, np.float32)
    b = np.ascontiguousarray(b, np.float32)
    kern = rt.compile(SELFTEST_DIV, MBITS=3, BIAS=7, MAX_BITS=0, MAX_CODE=0)
    return _elementwise(rt, kern, a, b, len(a)).view(np.float32)


def selftest_fp8(rt: GpuRuntime, x: np.ndarray, fmt) -> tuple[np.ndarray, np.ndarray]:
    """(codes uint8, decoded float32) of f32_to_fp8 / fp8_to_f32 on the GPU for an Fp8Format."""
    x = np.ascontiguousarray(x, np.float32)
    kern = rt.compile(SELFTEST_FP8, **{k: v for k, v in fmt.defines().items() if k != "FMAX"})
    r = _elementwise(rt, kern, x, x, 2 * len(x))
    return r[: len(x)].astype(np.uint8), r[len(x):].view(np.float32)
