"""`kvviz bench --sweep context|batch`: decode time and per-byte throughput of the seed int8 decode and the
fast decodes (int8 on the seed layout, f16, f32) over a range of context lengths or batch sizes, with the
copy shader of the same run as the reference (and torch SDPA bf16 with --compare-torch).

Qt-free, like kvviz/bench.py. Each point builds its caches once (the seed int8 writer, the f32 writer, f16
records packed on the host), times every decode with GPU timestamps, and checks the fast decodes against the
kernel they stand beside (the seed int8 decode, the f32 decode) on the same cache: a point whose fast output
differs beyond the f32 paged tolerance is marked FAILED, never silently kept.
"""
from __future__ import annotations

import time

import numpy as np

from kvviz.bench import TIMING_FLOOR_NOTE, BenchShape, _max_err, _row, _torch_row, make_inputs
from kvviz.errors import DeviceLimitError, InvalidInput, KvvizError
from kvviz.gpu.runtime import GpuRuntime
from kvviz.attention import split_decode as fd
from kvviz.gpu.copy import measure_copy
from kvviz.gpu.fma import measure_timing_floor
from kvviz.attention.paged import PagedKernels
from kvviz.attention.traffic import decode_bytes
from kvviz.tables import paragraph

SWEEPS = {
    "context": (512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072),  # one sequence
    "batch": (1, 2, 4, 8, 15, 16, 32, 64),  # sequences of 4096 tokens
}
HEADS, KV_HEADS, HEAD_SIZE, BLOCK = 32, 8, 128, 16


def sweep_shapes(param: str, values=None, ctx: int = 4096, seqs: int = 1) -> list[BenchShape]:
    if param not in SWEEPS:
        raise InvalidInput(f"--sweep must be one of {', '.join(SWEEPS)}, got {param!r}")
    vals = list(values) if values else list(SWEEPS[param])
    bad = [v for v in vals if not isinstance(v, (int, np.integer)) or v <= 0]
    if bad or not vals:
        raise InvalidInput(f"sweep values must be positive integers, got {vals}")
    if param == "context":
        return [BenchShape(f"sweep-ctx-{n}", (int(n),) * seqs, HEADS, KV_HEADS, HEAD_SIZE, BLOCK, "scattered") for n in vals]
    return [BenchShape(f"sweep-batch-{n}", (ctx,) * int(n), HEADS, KV_HEADS, HEAD_SIZE, BLOCK, "scattered") for n in vals]


def _f16_cache(rt, batch, key, value, kvh, D):
    """f16 paged records packed on the host (RNE, numpy): [num_blocks, kvh, bs, D/2] u32 for K and V."""
    out = []
    sm = batch.slot_mapping.astype(np.int64)
    for x in (key, value):
        words = np.zeros((batch.num_blocks, kvh, batch.block_size, D // 2), np.uint32)
        h = x.astype(np.float16).view(np.uint16).astype(np.uint32).reshape(len(x), kvh, D // 2, 2)
        words[sm // batch.block_size, :, sm % batch.block_size] = h[..., 0] | (h[..., 1] << 16)
        out.append(rt.upload(words, "f16_cache"))
    return out


def run_sweep(param: str, values=None, runs: int = 20, warmup: int = 3, compare_torch: bool = False,
              rt: GpuRuntime | None = None, log=print, ctx: int = 4096) -> dict:
    """ctx: tokens per sequence of a batch sweep."""
    shapes = sweep_shapes(param, values, ctx=ctx)
    rt = rt or GpuRuntime()
    adapter = rt.summary.to_json()
    for line in paragraph(f"adapter: {rt.summary.line()}"):
        log(line)
    pk, fast = PagedKernels(rt), fd.FastDecode(rt)
    copy_gbps, _ = measure_copy(rt, 256 << 20, runs, warmup)
    log(f"copy shader: {copy_gbps:.0f} GB/s")
    floor_us = measure_timing_floor(rt, runs, warmup).median_us
    log(f"timing floor: {floor_us:.1f} us (a near-empty dispatch in its own pass; {TIMING_FLOOR_NOTE})")
    points = []
    for shape in shapes:
        t0 = time.perf_counter()
        batch, key, value, q = make_inputs(shape)
        S, H, D, kvh = batch.num_seqs, shape.num_heads, shape.head_size, shape.num_kv_heads
        scale = float(1.0 / np.sqrt(D))
        rows = []
        try:
            caches = {}
            for fmt in ("q8", "f32"):
                c = pk.allocate(fmt, batch.num_blocks, kvh, batch.block_size, D)
                pk.write(c, key, value, batch.slot_mapping)
                caches[fmt] = c
            kf16, vf16 = _f16_cache(rt, batch, key, value, kvh, D)
            refs = {}
            for fmt, impl in (("q8", "seed"), ("f32", "baseline")):
                c = caches[fmt]
                try:
                    d, outs = pk.decode_dispatches(c, q, batch, scale)
                except DeviceLimitError as exc:  # the seed decode past a software rasteriser's loop budget
                    rows.append(_row(f"paged_attn_{fmt}", impl, shape, None, 0, copy_gbps, None, None, adapter,
                                     f"skipped: {exc}", role="decode", impl=impl))
                    continue
                t = rt.time(d, runs, warmup)
                refs[fmt] = pk._collect(outs, S, H * D, (H, D))
                rows.append(_row(f"paged_attn_{fmt}", impl, shape, t, decode_bytes(c, batch, q), copy_gbps, None, None,
                                 adapter, role="decode", impl=impl))
            for f, k, v, ref_of in ((fd.INT8, caches["q8"].k, caches["q8"].v, "q8"),
                                    (fd.F16, kf16, vf16, None),
                                    (fd.F32, caches["f32"].k, caches["f32"].v, "f32")):
                plan = fast.plan(f, k, v, kvh, q, batch, scale)
                t = rt.time(plan.dispatches, runs, warmup)
                nbytes, _ = fd.decode_traffic(f, batch, H, kvh, D, plan.num_partitions)
                err, note, tol = None, "", None
                if ref_of in refs:  # the same cache through the kernel it stands beside
                    tol = 2e-5 * max(1.0, float(np.abs(value).max()))
                    err, note = _max_err(fast.read(plan), refs[ref_of], f"fast_decode_{f.name}")
                rows.append(_row(f"fast_decode_{f.name}", plan.describe(), shape, t, nbytes, copy_gbps, err, tol,
                                 adapter, note, role="decode", impl="fast"))
            for c in caches.values():
                c.k.destroy()
                c.v.destroy()
            kf16.destroy()
            vf16.destroy()
        except KvvizError as exc:
            rows.append(_row("sweep point", param, shape, None, 0, copy_gbps, None, None, adapter, f"FAILED: {exc}"))
        if compare_torch:
            rows.append(_torch_row(shape, runs, warmup, copy_gbps, adapter))
        point = {"param": param, "value": shape.context_lens[0] if param == "context" else len(shape.context_lens),
                 "tokens": int(sum(shape.context_lens)), "rows": rows}
        points.append(point)
        log(f"{param} = {point['value']}: " + ", ".join(
            f"{r['kernel']} {r['gpu_us_median']:.1f} us ({r['pct_of_copy']:.0f}% of copy)"
            for r in rows if r["gpu_us_median"] is not None and r["pct_of_copy"] is not None)
            + f"  [{time.perf_counter() - t0:.1f} s]")
    return {"adapter": adapter, "sweep": param, "copy_gbps": copy_gbps, "timing_floor_us": floor_us, "runs": runs, "warmup": warmup,
            "created": time.strftime("%Y-%m-%dT%H:%M:%S"), "points": points}
