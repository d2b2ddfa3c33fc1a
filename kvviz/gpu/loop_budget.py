"""Loop budgets: how many loop iterations one shader invocation of each kernel runs, and the check
that refuses a dispatch the adapter would silently truncate.

Mesa's llvmpipe (lavapipe, the software Vulkan driver CI and GPU-less users run) gives every shader
invocation one loop limiter, set to 65535 when the invocation starts and decremented at the back-edge
of *every* loop, once per iteration and once more when the loop exits; when it reaches zero every
loop exits at its next back-edge, and the kernel returns a wrong result without any error
(gallivm's lp_exec_endloop; see docs/loop-limits.md). `GpuRuntime.loop_limit` measures the bound at
start-up with shaders/probe/loop_limit.wgsl; hardware adapters show none.

Each function below is an upper bound of the limiter decrements of the costliest invocation
(thread 0), counting every loop as (iterations + 2) and no loop as unrolled: the real count is at
most this (checked against the measured failure thresholds on lavapipe in
tests/test_long_context.py), so a dispatch whose bound fits the limit is never truncated. Kernels written for kvviz
are split over the context so their counts do not grow with it; the seed kernels, which stay as
given, are refused past their longest safe context with a message naming the limit.
"""
from __future__ import annotations

from typing import Callable

from kvviz.errors import DeviceLimitError

PARTITION = 512  # positions per workgroup of the split paged kernels (the shaders' PARTITION)


def _loop(n: int) -> int:
    """Decrements charged to one loop entry that runs n iterations: one per iteration, one for the
    exit, and one of margin (the seed decode's measured thresholds on lavapipe sit one decrement per
    tile above the exact count; with the margin every bound stays below the measured thresholds)."""
    return max(0, int(n)) + 2


def _cdiv(a: int, b: int) -> int:
    return -(-int(a) // int(b))


def seed_int8_decode(context_len: int, head_size: int) -> int:
    """paged_attn_q8.comp (the seed int8 decode): 128 threads, every pass strides over the whole context."""
    c = _cdiv(head_size, 128)
    tiles = _cdiv(context_len, 128)
    hs4 = head_size // 4
    pass1 = _loop(tiles) + tiles * _loop(hs4)
    pass2 = _loop(tiles) + tiles * (_loop(hs4) + _loop(7) + _loop(c) + c * _loop(128))
    return 3 * _loop(c) + pass1 + _loop(7) + pass2


def split_decode_partition(head_size: int, wpt_loop: int | None = None) -> int:
    """paged_attn_f32.comp: one partition of PARTITION positions, whatever the context."""
    c = _cdiv(head_size, 128)
    tiles = PARTITION // 128
    inner = head_size if wpt_loop is None else wpt_loop
    return (3 * _loop(c) + _loop(tiles) + tiles * _loop(inner) + _loop(7)
            + _loop(tiles) + tiles * (_loop(inner) + _loop(7) + _loop(c) + c * _loop(128)))


def split_reduce(context_len: int, head_size: int) -> int:
    """paged_attn_reduce.wgsl: strided loops over ceil(context / PARTITION) partitions."""
    parts = _cdiv(context_len, PARTITION)
    chunks = _cdiv(parts, 128)
    return 2 * _loop(chunks) + 2 * _loop(7) + _loop(chunks) + chunks * _loop(128)


def split_weights_partition(head_size: int, q8: bool) -> int:
    """paged_attn_weights.comp: one partition's logits and stats."""
    tiles = PARTITION // 128
    inner = head_size // 4 if q8 else head_size
    return _loop(_cdiv(head_size, 128)) + _loop(tiles) + tiles * _loop(inner) + 2 * _loop(7) + _loop(tiles)


def softmax_partitioned(row_len: int) -> int:
    """softmax_partitioned.wgsl: strided loops over the row's partitions, then one partition."""
    chunks = _cdiv(_cdiv(row_len, PARTITION), 128)
    return 2 * _loop(chunks) + 2 * _loop(7) + _loop(PARTITION // 128)


def tq_seed_flash(seq_len: int, head_size: int) -> int:
    """flash_attention_tq.wgsl (the seed TurboQuant kernel): 256 threads, 256-position tiles over the whole context."""
    tiles = _cdiv(seq_len, 256)
    pw, jw = head_size // 16, head_size // 32
    per_tile = _loop(pw) + pw * _loop(16) + _loop(jw) + jw * _loop(32) + _loop(256)
    return _loop(tiles) + tiles * per_tile + _loop(max(1, head_size).bit_length())


def tq_scores_partition(head_size: int) -> int:
    """tq_scores.wgsl: one partition of PARTITION positions."""
    pw, jw = head_size // 16, head_size // 32
    per_pos = _loop(pw) + pw * _loop(16) + _loop(jw) + jw * _loop(32)
    steps = PARTITION // 256
    return 2 * _loop(steps) + steps * per_pos


def longest_context(cost: Callable[[int], int], limit: int, hi: int = 1 << 31) -> int:
    """Largest context n >= 0 with cost(n) <= limit (cost non-decreasing in n); 0 if none."""
    if cost(1) > limit:
        return 0
    lo = 1
    if cost(hi) <= limit:
        return hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if cost(mid) <= limit:
            lo = mid
        else:
            hi = mid
    return lo


def check(rt, kernel: str, cost: Callable[[int], int], context_len: int, what: str = "context") -> None:
    """Refuse a dispatch whose invocations would run past the adapter's loop limit.

    `cost(n)` is the kernel's decrement bound at context length n (other shape parameters bound in).
    """
    limit = getattr(rt, "loop_limit", None)
    if limit is None or context_len <= 0:
        return
    need = cost(int(context_len))
    if need <= limit:
        return
    longest = longest_context(cost, limit)
    raise DeviceLimitError(
        f"{kernel} cannot take {context_len} tokens on {rt.summary.name}: its longest context here is "
        f"{longest} tokens. This adapter ends every shader invocation's loops after {limit} iterations in "
        f"total (measured at start-up); the kernel would need about {need}, and its result would be "
        f"silently wrong.",
        "Use a hardware GPU adapter, a shorter context, or a method whose kernels are split over the "
        "context (f32, int8_token, fp8, int4_group, kivi).",
    )
