"""`kvviz bench`: GPU timings of every kernel on named shapes, checked against the numpy oracles.

Qt-free. Every time is a GPU timestamp measurement (median of `runs` after `warmup` discarded runs)
unless the adapter lacks timestamps, in which case the row says "wall-clock". Bandwidth is unique
bytes moved / median time, and `pct_of_copy` compares it with the buffer copy measured in the same
run on the same device.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass

import numpy as np

from kvviz.attention import arith, paged_oracle as oracle, prefill, prefill_oracle, split_decode as fd
from kvviz.attention.paged import PagedKernels, check_head_size
from kvviz.attention.traffic import decode_bytes, weights_bytes, writer_bytes
from kvviz.bench.roofline import Ceilings, bound
from kvviz.errors import DeviceLimitError, InvalidInput, KvvizError, UnsupportedShape
from kvviz.families import prefill_oracles
from kvviz.families.fp4 import decode as ffd
from kvviz.families.ggml import decode as fdg
from kvviz.families.kivi import decode as fdk, oracle as kivi_oracle
from kvviz.families.turboquant import decode as fdq, oracle as tq_oracle
from kvviz.families.registry import get_method, reference, registry
from kvviz.gpu.copy import measure_copy
from kvviz.gpu.fma import dtypes, measure_fma, measure_timing_floor
from kvviz.gpu.runtime import GpuRuntime
from kvviz.gpu.shaders import FRONTEND_GLSLANG, FRONTEND_NAGA_GLSL
from kvviz.gpu.timed import checked
from kvviz.gpu.timing import TimingResult
from kvviz.lab.check import lab_run
from kvviz.lab.slots import slot as get_slot
from kvviz.methods.context import GpuContext
from kvviz.paging import make_batch
from kvviz.tables import WIDTH, TextColumn, clean, grouped_table, paragraph, text_table


@dataclass(frozen=True)
class BenchShape:
    name: str
    context_lens: tuple[int, ...]
    num_heads: int
    num_kv_heads: int
    head_size: int
    block_size: int
    policy: str = "contiguous"
    # a prefill shape: each sequence's chunk of queries, at its last positions (the causal prefill's rows in place
    # of the decode's); empty: a decode shape
    query_lens: tuple[int, ...] = ()

    def to_json(self) -> dict:
        lens = self.context_lens
        out = {
            "name": self.name,
            "num_seqs": len(lens),
            "context_lens": list(lens) if len(set(lens)) > 1 else lens[0],
            "num_tokens": int(sum(lens)),
            "num_heads": self.num_heads,
            "num_kv_heads": self.num_kv_heads,
            "head_size": self.head_size,
            "block_size": self.block_size,
            "policy": self.policy,
        }
        if self.query_lens:
            ql = self.query_lens
            out.update(query_lens=list(ql) if len(set(ql)) > 1 else ql[0], num_queries=int(sum(ql)))
        return out

    def label(self) -> str:
        lens = self.context_lens
        ctx = f"{lens[0]}" if len(set(lens)) == 1 else f"{min(lens)}..{max(lens)}"
        q = f", prefill of {sum(self.query_lens)} queries" if self.query_lens else ""
        return (
            f"{len(lens)}x{ctx} tok, {self.num_heads}/{self.num_kv_heads} heads, "
            f"d{self.head_size}, blk{self.block_size}{q}"
        )


SHAPES = {
    # Small enough for lavapipe in CI; ragged lengths on purpose.
    "quick-ragged": BenchShape("quick-ragged", (37, 100, 300, 129), 8, 2, 128, 16, "scattered"),
    "quick-d64-mha": BenchShape("quick-d64-mha", (64, 250), 4, 4, 64, 8),
    # The performance anchor (docs/kernels.md, "Measured on the H200"): 15 x 4096 tokens, 32/8 heads, head 128, block 16.
    "decode-15x4096": BenchShape("decode-15x4096", (4096,) * 15, 32, 8, 128, 16),
    "decode-1x32768": BenchShape("decode-1x32768", (32768,), 32, 8, 128, 16),
    # one long sequence: the anchor's 61440 tokens in a single context (the TurboQuant fast decode's target shape)
    "decode-1x61440": BenchShape("decode-1x61440", (61440,), 32, 8, 128, 16),
    # The causal prefill (kvviz/attention/prefill.py): 8 sequences of 2048 tokens prefilled whole (each query over
    # its sequence up to its own position), the anchor's heads; and a small ragged one with chunks that start
    # mid-sequence and a single-token chunk, for lavapipe.
    "prefill-8x2048": BenchShape("prefill-8x2048", (2048,) * 8, 32, 8, 128, 16, "contiguous", (2048,) * 8),
    "quick-prefill": BenchShape("quick-prefill", (37, 100, 300, 129), 8, 2, 128, 16, "scattered", (37, 17, 64, 1)),
}
QUICK = ("quick-ragged", "quick-d64-mha")
FULL = ("decode-15x4096",)


def make_inputs(shape: BenchShape, seed: int = 0):
    rng = np.random.default_rng(seed)
    batch = make_batch(shape.context_lens, shape.block_size, policy=shape.policy, seed=seed)
    T = batch.num_tokens
    key = rng.standard_normal((T, shape.num_kv_heads, shape.head_size), dtype=np.float32)
    value = rng.standard_normal((T, shape.num_kv_heads, shape.head_size), dtype=np.float32)
    q = rng.standard_normal((batch.num_seqs, shape.num_heads, shape.head_size), dtype=np.float32)
    return batch, key, value, q


def _row(kernel, variant, shape, timing, nbytes, copy_gbps, err, tol, adapter, note="", method=None, role=None,
         impl=None, flops=None):
    gbps = timing.gbps(nbytes) if timing is not None else float("nan")
    med = timing.median_us if timing is not None else None
    return {
        "kernel": kernel,
        "variant": variant,
        "method": method,  # registry id of the method the kernel belongs to (None: copy, baselines, torch)
        "role": role,  # kvviz.gpu.timed.ROLES
        "impl": impl,  # kvviz.gpu.timed.IMPLS: seed / first-wave / fast / baseline
        "shape": shape.to_json(),
        "gpu_us_min": timing.min_us if timing else None,
        "gpu_us_median": timing.median_us if timing else None,
        "gpu_us_p90": timing.p90_us if timing else None,
        "timing_method": timing.method if timing else None,
        "samples_us": list(timing.samples_us) if timing else None,
        "source_hash": getattr(timing, "source_hash", None),  # the timed shader source (kvviz.gpu.timing.source_hash)
        "bytes_moved": int(nbytes),
        "gbps": gbps,
        "pct_of_copy": 100.0 * gbps / copy_gbps if copy_gbps else None,
        "max_abs_err_vs_oracle": err,
        "tolerance": tol,
        # None when nothing was checked: a row without a tolerance claims neither pass nor fail
        "within_tolerance": None if tol is None else bool(err is not None and np.isfinite(err) and err <= tol),
        "adapter": adapter,
        "note": note,
        # roofline (kvviz/bench/roofline.py): FLOPs the kernel states (kvviz/attention/arith.py), achieved GFLOP/s,
        # FLOPs per unique byte, and memory / compute bound against the ceilings measured in the same run
        "flops": flops,
        "gflops": flops / (med * 1e3) if flops is not None and med else None,
        "intensity": flops / nbytes if flops is not None and nbytes else None,
        "bound": None,  # set by run_bench once the ceilings of the run are known
    }


def _max_err(out, ref, kernel: str):
    """(max |out - ref|, "") or, when the GPU output or the oracle holds NaN/Inf, (None, "FAILED: ...")
    naming the kernel: a non-finite row is never within tolerance (NaN compares as no error at all)."""
    out, ref = np.asarray(out), np.asarray(ref)
    bad_out, bad_ref = int(np.count_nonzero(~np.isfinite(out))), int(np.count_nonzero(~np.isfinite(ref)))
    if bad_out or bad_ref:
        parts = ([f"{kernel} output has {bad_out} NaN/Inf values of {out.size}"] if bad_out else []) + (
            [f"the oracle has {bad_ref} NaN/Inf values of {ref.size}"] if bad_ref else [])
        return None, "FAILED: " + "; ".join(parts)
    return float(np.abs(out - ref).max(initial=0.0)), ""


def _writer_check(rt, fmt, cache_words, key, batch):
    """(max abs error of the dequantised cache vs the oracle, tolerance, note)."""
    if fmt == "f32":
        ref = oracle.write_cache_f32(np.zeros_like(cache_words), key, batch.slot_mapping, batch.block_size)
        return float(np.abs(cache_words - ref).max()), 0.0, ""
    ulps = oracle.division_ulps(rt.summary)
    rep = oracle.compare_int8_cache(cache_words, key, batch.slot_mapping, batch.block_size, ulps)
    note = (f"codes: {rep['code_mismatch_not_tie']} off-tie / {rep['code_mismatch_at_ties']} tie mismatches of "
            f"{rep['codes']}; scales: {rep['scale_mismatch']} differ, max {rep['scale_max_ulp']} ULP (allowed {ulps})")
    # The verdict is the oracle comparison's; report it as error 0 (ok) or 1 (not ok).
    return (0.0 if rep["ok"] else 1.0), 0.0, note


def run_bench(
    shapes,
    runs: int = 20,
    warmup: int = 3,
    frontends=(FRONTEND_GLSLANG, FRONTEND_NAGA_GLSL),
    compare_torch: bool = False,
    methods: bool | tuple = True,
    rt: GpuRuntime | None = None,
    log=print,
    kernels=(),
    prefill_variants=(),
    variants: bool = False,
) -> dict:
    """`methods`: every registered method's kernels (True), none (False) or those named (registry ids).
    `variants`: also each method's fast-decode variants where its cache takes them (FAST_VARIANTS).
    `kernels`: (slot id, path) of user kernels (`--kernel SLOT=FILE`), each checked against its slot's oracle
    and timed beside the slot's built-in kernel on every shape (kvviz/lab/check.py). `prefill_variants`: the
    prefill kernel's variants (kvviz/attention/prefill.py VARIANTS) a prefill shape times, each cache's one after
    the other (default: the adapter's default variant)."""
    unknown = [v for v in prefill_variants if v not in prefill.VARIANTS]
    if unknown:
        raise InvalidInput(f"no prefill variant {', '.join(map(repr, unknown))}",
                           f"The variants: {', '.join(prefill.VARIANTS)}.")
    rt = rt or GpuRuntime()
    adapter = rt.summary.to_json()
    for line in paragraph(f"adapter: {rt.summary.line()}"):
        log(line)
    rows = []
    fma = {}
    floor_us = None
    ceilings = None
    for shape in shapes:
        batch, key, value, q = make_inputs(shape)
        scale = float(1.0 / np.sqrt(shape.head_size))
        kv_bytes = 2 * key.nbytes
        copy_n = max(kv_bytes, 32 << 20)
        copy_gbps, copies = measure_copy(rt, copy_n, runs, warmup)
        for name, variant, t, nb in copies:
            rows.append(_row(name, variant, shape, t, nb, copy_gbps, None, None, adapter, flops=0.0))
        if not fma:  # the compute ceiling, once a run: FMA throughput (f32, f16 with shader-f16)
            for dt in dtypes(rt):
                fr = measure_fma(rt, dt, runs, warmup)
                fma[dt] = fr.gflops
                rows.append(_row(f"fma_{dt}", f"FMA throughput {dt} (compute ceiling)", shape, fr.timing, fr.bytes, copy_gbps,
                                 None, None, adapter, f"sink rel err {fr.rel_err:.1e} vs numpy", flops=fr.flops))
            ft = measure_timing_floor(rt, runs, warmup)
            floor_us = ft.median_us
            rows.append(timing_floor_row(shape, ft, adapter))
        shader_copy = next(t.gbps(nb) for name, _, t, nb in copies if name == "copy_shader")
        if ceilings is None:
            ceilings = Ceilings(shader_copy, fma["f32"], fma.get("f16"), rt.summary.name, bool(rt.summary.is_software))
        if kernels:
            rows += _user_kernel_rows(rt, kernels, shape, (batch, key, value, q), runs, warmup, copy_gbps, adapter)
        if shape.query_lens:  # a prefill shape: the prefill of the f32 cache and of every method's cache
            rows += _prefill_rows(rt, shape, batch, key, value, runs, warmup, copy_gbps, adapter,
                                  None if methods is True else tuple(methods or ()), tuple(prefill_variants))
            if compare_torch:
                rows.append(_torch_prefill_row(shape, runs, warmup, copy_gbps, adapter))
            continue
        refs = {}
        for fmt in ("f32", "q8"):
            for fe in frontends if fmt == "q8" else (FRONTEND_GLSLANG,):
                pk = PagedKernels(rt, fe)
                variant = ("seed GLSL via " if fmt == "q8" else "f32 baseline via ") + fe
                try:
                    # GPU work first, oracle checks after: a GPU left idle during seconds of numpy
                    # drops its clocks and the next timing reads slow (seen on an H200).
                    cache = pk.allocate(fmt, batch.num_blocks, shape.num_kv_heads, shape.block_size, shape.head_size)
                    wd = pk.write_dispatches(cache, key, value, batch.slot_mapping)
                    wt = rt.time(wd, runs, warmup)
                    dd, outs = pk.decode_dispatches(cache, q, batch, scale)
                    dt = rt.time(dd, runs, warmup)
                    out = pk._collect(outs, batch.num_seqs, shape.num_heads * shape.head_size, (shape.num_heads, shape.head_size))
                    w = pk.weights(cache, q, batch, scale)
                    kc = pk.read(cache, "k")
                    werr, wtol, wnote = _writer_check(rt, fmt, kc, key, batch)
                    if fmt not in refs:
                        vc = pk.read(cache, "v")
                        if fmt == "q8":
                            kf, vf = oracle.dequantize_cache_int8(kc), oracle.dequantize_cache_int8(vc)
                        else:
                            kf, vf = kc.astype(np.float64), vc.astype(np.float64)
                        ref = oracle.decode(q, kf, vf, batch.block_tables, batch.context_lens, shape.block_size, scale)
                        refw = oracle.decode_weights(q, kf, batch.block_tables, batch.context_lens, shape.block_size, scale)
                        # the tolerance of tests/test_paged_conformance.py: f32 accumulation vs float64
                        refs[fmt] = (ref, refw, 2e-5 * max(1.0, float(np.abs(vf).max())))
                        refs[fmt + "_caches"] = (kf, vf)
                    ref, refw, tol = refs[fmt]
                    impl = "seed" if fmt == "q8" else "baseline"
                    mid = "int8_seed" if fmt == "q8" else None
                    rows.append(_row(f"reshape_and_cache_{fmt}", variant, shape, wt, writer_bytes(cache, batch, key), copy_gbps, werr, wtol, adapter, wnote,
                                     method=mid, role="writer", impl=impl,
                                     flops=arith.writer_flops(batch, shape.num_kv_heads, shape.head_size, 0.0 if fmt == "f32" else 2.0)))
                    derr, dnote = _max_err(out, ref, f"paged_attn_{fmt}")
                    rows.append(_row(f"paged_attn_{fmt}", variant, shape, dt, decode_bytes(cache, batch, q), copy_gbps, derr, tol, adapter, dnote,
                                     method=mid, role="decode", impl=impl,
                                     flops=arith.decode_flops(batch, shape.num_heads, shape.head_size)))
                    if fe == frontends[0] or fmt == "f32":  # the fast decode reads the cache as is: once per format
                        rows.append(_fast_row(rt, fmt, cache, batch, q, scale, shape, runs, warmup, copy_gbps, adapter, ref, tol, mid))
                    if fmt == "q8" and fe == frontends[0]:  # the int8-query variant and the fast writer of the seed layout
                        rows.append(_fast_i8q_row(rt, cache, batch, q, scale, shape, runs, warmup, copy_gbps, adapter,
                                                  refs["q8_caches"], ref, tol))
                        rows += _fast_seed_writer_rows(rt, cache, batch, key, value, shape, runs, warmup, copy_gbps, adapter)
                    werr, wnote = _max_err(w, refw, f"paged_attn_weights_{fmt}")
                    rows.append(_row(f"paged_attn_weights_{fmt}", variant, shape, None, weights_bytes(cache, batch, q), copy_gbps, werr, 2e-6, adapter, wnote or "correctness only"))
                except KvvizError as exc:
                    rows.append(_row(f"{fmt} kernels", variant, shape, None, 0, copy_gbps, None, None, adapter, f"FAILED: {exc}"))
        if methods:
            rows += _bench_methods(rt, shape, batch, key, value, q, scale, runs, warmup, copy_gbps, adapter, log,
                                   None if methods is True else tuple(methods), variants)
        if compare_torch:
            rows.append(_torch_row(shape, runs, warmup, copy_gbps, adapter))
    for r in rows:
        if r["intensity"] is not None and r["gpu_us_median"] and not r["kernel"].startswith("fma_"):
            r["bound"] = bound(r["intensity"], ceilings)
    return {"adapter": adapter, "timestamp_period_ns": rt.timestamp_period_ns, "created": time.strftime("%Y-%m-%dT%H:%M:%S"), "runs": runs, "warmup": warmup, "rows": rows,
            "roofline": ceilings.to_json() if ceilings else None, "timing_floor_us": floor_us,
            "decode_vs_f16": decode_vs_f16(rows)}


def decode_vs_f16(rows) -> list:
    """Each method's fastest fast decode at each decode shape (its exact decode or a variant; rows that failed or
    fell outside their tolerance are not counted), with torch SDPA's, against the f16 fast decode of the same shape
    and run: [{"shape", "method", "kernel", "us", "vs_f16"}], fastest first; vs_f16 None where the run has no f16
    decode."""
    best: dict = {}
    for r in rows:
        t = r.get("gpu_us_median")
        torch = r["kernel"] == "torch_sdpa_bf16"  # the decode's (a prefill shape's is torch_sdpa_causal_bf16)
        fast = r.get("role") == "decode" and r.get("impl") == "fast"
        if not t or not (fast or torch) or r.get("within_tolerance") is False or str(r.get("note", "")).startswith("FAILED"):
            continue
        # a row of no method is a baseline's (fast_decode_f32: "f32")
        key = (r["shape"]["name"], "torch" if torch else r.get("method") or r["kernel"].replace("fast_decode_", ""))
        if key not in best or t < best[key]["us"]:
            best[key] = {"shape": key[0], "method": key[1], "kernel": r["kernel"], "us": float(t)}
    out = []
    for (shape, _), b in best.items():
        f16 = best.get((shape, "f16"))
        out.append(dict(b, vs_f16=b["us"] / f16["us"] if f16 else None))
    return sorted(out, key=lambda b: (b["shape"], b["us"]))


TIMING_FLOOR_NOTE = ("a kernel that does next to nothing, timed in the frame every row is timed in (its own pass, "
                     "begin / end timestamps): a row near it is mostly the frame's fixed cost")


def timing_floor_row(shape, timing, adapter) -> dict:
    """The row of the timing frame's floor (kvviz.gpu.fma.measure_timing_floor): a near-empty dispatch in its own
    pass. It moves no bytes worth a rate, so GB/s and % of copy stay empty."""
    r = _row("timing_floor", "a near-empty dispatch in its own pass", shape, timing, 0, None, None, None, adapter,
             TIMING_FLOOR_NOTE)
    r["gbps"] = None
    return r


def _user_kernel_rows(rt, kernels, shape, inputs, runs, warmup, copy_gbps, adapter):
    """A user kernel row and its slot's built-in row per `--kernel SLOT=FILE`: the check against the slot's oracle
    (max error, elements outside the tolerance and where) in the user row."""
    ctx = GpuContext(rt)
    rows = []
    for slot_id, path in kernels:
        s = get_slot(slot_id)
        try:
            lr = lab_run(ctx, slot_id, inputs, path=path, runs=runs, warmup=warmup, info=False)
        except (InvalidInput, DeviceLimitError) as exc:
            rows.append(_row(f"{slot_id} (user: {path})", "user kernel", shape, None, 0, copy_gbps, None, None, adapter,
                             f"skipped: {exc.one_line()}", method=s.method, role=s.role, impl="user"))
            continue
        except KvvizError as exc:
            rows.append(_row(f"{slot_id} (user: {path})", "user kernel", shape, None, 0, copy_gbps, None, None, adapter,
                             "FAILED: " + " ".join(str(exc).split()), method=s.method, role=s.role, impl="user"))
            continue
        c = lr.check
        for lt in lr.timings:
            user = lt.impl == "user"
            r = _row(f"{slot_id} (user: {path})" if user else f"{lt.name} ({lt.impl})", "user kernel" if user else
                     f"built-in beside {slot_id}", shape, lt.timing, lt.bytes, copy_gbps, c.max_err if user else None,
                     None, adapter, c.summary() if user else "", method=s.method, role=s.role,
                     impl="user" if user else lt.impl, flops=lt.flops)
            if user:  # the slot's elementwise tolerance: within it when no element is outside and no stray write
                r["tolerance"] = s.tolerance
                r["within_tolerance"] = c.ok
                r["check"] = c.to_json()
            rows.append(r)
    return rows


def _fast_seed_writer_rows(rt, cache, batch, key, value, shape, runs, warmup, copy_gbps, adapter):
    """The fast int8 writer of the seed layout, timed and its words compared with the seed oracle's."""
    ctx = GpuContext(rt)
    out = []
    try:
        for tk in get_method("int8_seed").fast_writer_rows(ctx, cache, batch, key, value):
            t = rt.time(tk.dispatches, runs, warmup)
            d0 = tk.dispatches[0]
            names = [b.name for b in d0.kernel.kspec.bindings]
            kbuf = d0.buffers[names.index("k_cache")]  # the fast writer's own K cache: its words vs the seed oracle
            words = rt.read(kbuf, np.uint32, cache.shape, nbytes=int(np.prod(cache.shape)) * 4)
            err, tol, note = _writer_check(rt, "q8", words, key, batch)
            out.append(_row(tk.name, "fast writer (seed layout)", shape, t, tk.bytes, copy_gbps, err, tol, adapter, note,
                            method="int8_seed", role="writer", impl="fast", flops=tk.flops))
    except (InvalidInput, DeviceLimitError) as exc:
        out.append(_row("reshape_and_cache_q8 (fast, seed layout)", "fast writer", shape, None, 0, copy_gbps, None, None,
                        adapter, f"skipped: {exc}", method="int8_seed", role="writer", impl="fast"))
    return out


def _fast_row(rt, fmt, cache, batch, q, scale, shape, runs, warmup, copy_gbps, adapter, ref, tol, method):
    """The fast split-K decode over the seed writer's int8 cache or the f32 baseline cache, checked
    against the same oracle as the kernel it stands beside."""
    f = fd.INT8 if fmt == "q8" else fd.F32
    fast = fd.FastDecode(rt)
    name = f"fast_decode_{f.name}"
    try:
        plan = fast.plan(f, cache.k, cache.v, cache.num_kv_heads, q, batch, scale)
        t = rt.time(plan.dispatches, runs, warmup)
        nbytes, flops = fd.decode_traffic(f, batch, shape.num_heads, shape.num_kv_heads, shape.head_size, plan.num_partitions)
        err, note = _max_err(fast.read(plan), ref, name)
        return _row(name, f"fast split-K ({plan.describe()})", shape, t, nbytes, copy_gbps, err, tol, adapter, note,
                    method=method, role="decode", impl="fast", flops=flops)
    except (InvalidInput, DeviceLimitError) as exc:
        return _row(name, "fast split-K", shape, None, 0, copy_gbps, None, None, adapter, f"skipped: {exc}", method=method,
                    role="decode", impl="fast")


# the int8-query variant's layout: 4 tokens a row per step measured fastest for it on the H200 (faster than 2;
# figures in docs/benchmarks.md)
I8Q_UNROLL = 4


def _fast_i8q_row(rt, cache, batch, q, scale, shape, runs, warmup, copy_gbps, adapter, caches, exact, tol):
    """The measured variant of the fast decode over the seed layout's int8 cache: the query quantised to int8
    (one scale a head) and dotted with K's codes by dot4I8Packed. Checked against ITS oracle (the float64 decode
    of the dequantised int8 query: kvviz/attention/split_decode.py, variants), with the f32 kernel's tolerance;
    the note gives its distance from the f32-query oracle `exact` too (the query's quantisation error)."""
    name = "fast_decode_int8 (int8 query)"
    fast = fd.FastDecode(rt)
    try:
        plan = fast.plan(fd.INT8, cache.k, cache.v, cache.num_kv_heads, q, batch, scale, qk="i8", unroll=I8Q_UNROLL)
        t = rt.time(plan.dispatches, runs, warmup)
        nbytes, flops = fd.decode_traffic(fd.INT8, batch, shape.num_heads, shape.num_kv_heads, shape.head_size,
                                          plan.num_partitions)
        out = fast.read(plan)
        codes, qs = fd.quantize_query(q)
        kf, vf = caches
        ref = oracle.decode(codes.astype(np.float64) * qs[..., None].astype(np.float64), kf, vf, batch.block_tables,
                            batch.context_lens, shape.block_size, scale)
        err, note = _max_err(out, ref, name)
        if not note:
            note = f"vs the f32-query oracle: {float(np.abs(out - exact).max()):.2e} (the query's int8 rounding)"
        return _row(name, f"fast split-K ({plan.describe()})", shape, t, nbytes,
                    copy_gbps, err, tol, adapter, note, method="int8_seed", role="decode", impl="fast", flops=flops)
    except (InvalidInput, DeviceLimitError, UnsupportedShape) as exc:
        return _row(name, "fast split-K, int8 query", shape, None, 0, copy_gbps, None, None, adapter,
                    f"skipped: {exc}", method="int8_seed", role="decode", impl="fast")


def _bench_methods(rt, shape, batch, key, value, q, scale, runs, warmup, copy_gbps, adapter, log, only=None,
                   variants=False):
    """Every registered method's own kernels (the int8 seed is covered above), each method's decode
    output checked end to end against its numpy reference (the method's REFERENCE, found by name)."""
    ctx = GpuContext(rt)
    rows = []
    for mkey, cls in sorted(registry().items()):
        if mkey == "int8_seed" or (only is not None and mkey not in only):
            continue
        m = cls()
        try:
            m.check(shape.num_heads, shape.num_kv_heads, shape.head_size, shape.block_size)
            for tk in checked(m.timed_kernels(ctx, batch, key, value, q, scale), mkey):
                rows.append(_row(tk.name, m.label, shape, rt.time(tk.dispatches, runs, warmup), tk.bytes, copy_gbps,
                                 None, None, adapter, method=mkey, role=tk.role, impl=tk.impl,
                                 flops=tk.flops or _role_flops(tk, m, batch, shape)))
            qkv = m.quantize(ctx, batch, key, value)
            out = m.attend(ctx, qkv, batch, q, scale)
            try:
                reference_attention = reference(mkey)
            except (ImportError, AttributeError) as exc:
                raise KvvizError(f"{mkey}: its numpy reference {cls.REFERENCE!r} cannot be loaded: {exc}") from None
            ref, tol = reference_attention(m, batch, key, value, q, scale, qkv)
            err, bad = _max_err(out, ref, m.attend_kernel or f"{mkey} attend")
            rows.append(_row(f"{mkey} end to end", m.label, shape, None, 0, copy_gbps, err, tol, adapter,
                             bad or "correctness only: GPU quantise + attend vs the method's numpy oracle"))
            if variants:
                rows += _fast_variant_rows(ctx, m, mkey, qkv, batch, q, scale, shape, runs, warmup, copy_gbps, adapter)
                rows += _tq_variant_rows(ctx, m, mkey, qkv, batch, key, value, q, scale, shape, runs, warmup, copy_gbps,
                                         adapter)
                rows += _kivi_variant_rows(ctx, m, mkey, qkv, batch, key, value, q, scale, shape, runs, warmup,
                                           copy_gbps, adapter)
        except (InvalidInput, DeviceLimitError) as exc:
            # the method does not take this shape here (head size, context past a loop limit, ...)
            rows.append(_row(mkey, m.label, shape, None, 0, copy_gbps, None, None, adapter, f"skipped: {exc}"))
        except KvvizError as exc:  # a compile error, a lost device, a non-finite result: a failure
            rows.append(_row(mkey, m.label, shape, None, 0, copy_gbps, None, None, adapter, f"FAILED: {exc}"))
    return rows


PREFILL_CHECKED = 16  # queries of each sequence a prefill row is checked on: its first and last 8


def _prefill_rows(rt, shape, batch, key, value, runs, warmup, copy_gbps, adapter, only=None, variants=()):
    """The causal prefill (kvviz/attention/prefill.py) of the shape's chunks over the f32 baseline cache and over
    every registered method's cache (written by the method's writer; `only`: those named, () none), timed, then
    each checked against the float64 causal oracle over the family's dequantised cache on PREFILL_CHECKED queries of
    every sequence (all of them would take minutes of numpy at the big shapes). All timings first, the checks after:
    a GPU left idle during seconds of numpy drops its clocks. `variants`: the kernel's variants, each cache's timed
    one after the other over the same cache (a row each, named with the variant when there are several); () the
    adapter's default."""
    ctx = GpuContext(rt)
    prefills = {v: prefill.Prefill(rt, variant=v) for v in variants} or {None: ctx.prefill}
    H, kvh, D = shape.num_heads, shape.num_kv_heads, shape.head_size
    lens = np.asarray(shape.query_lens, np.int64)
    q = np.random.default_rng(1).standard_normal((int(lens.sum()), H, D), dtype=np.float32)
    scale = float(1.0 / np.sqrt(D))
    starts = np.concatenate([[0], np.cumsum(lens)[:-1]])
    half = PREFILL_CHECKED // 2
    check = np.unique(np.concatenate([np.r_[a : a + min(n, half), a + max(n - half, 0) : a + n]
                                      for a, n in zip(starts, lens)]).astype(np.int64))
    todo = [(None, "f32 baseline cache")] + [(k, c()) for k, c in sorted(registry().items())
                                            if only is None or k in only]
    timed, rows = [], []
    for mkey, m in todo:
        label = m if mkey is None else m.label
        cache = qkv = None
        for variant, pf in prefills.items():
            name = f"prefill_{mkey or 'f32'}" + (f" ({variant})" if len(prefills) > 1 else "")
            try:
                ctx.prefill = pf  # the methods' prefill_plan plans through their context's Prefill
                if mkey is None:
                    if cache is None:
                        cache = ctx.paged.allocate("f32", batch.num_blocks, kvh, batch.block_size, D)
                        rt.run(ctx.paged.write_dispatches(cache, key, value, batch.slot_mapping))
                    plan = prefill.plan_records(pf, prefill.F32, cache.k, cache.v, kvh, q, batch, lens, scale)
                    kv_bytes = 2 * D * 4
                else:
                    m.check(H, kvh, D, batch.block_size)
                    if qkv is None:
                        qkv = m.quantize(ctx, batch, key, value)
                    plan = m.prefill_plan(ctx, qkv, batch, q, lens, scale)
                    if plan is None:
                        raise UnsupportedShape(f"{mkey} has no prefill at this shape")
                    kl, vl = m.layouts(D, batch.block_size)
                    kv_bytes = kl.bytes_per_token_per_head + vl.bytes_per_token_per_head
                t = rt.time(plan.dispatches, runs, warmup)
                timed.append((mkey, m, name, label, plan, qkv, t, pf.read(plan)[check], kv_bytes))
            except (InvalidInput, DeviceLimitError, UnsupportedShape) as exc:
                rows.append(_row(name, label, shape, None, 0, copy_gbps, None, None, adapter, f"skipped: {exc}",
                                 method=mkey, role="prefill", impl="fast"))
            except KvvizError as exc:
                rows.append(_row(name, label, shape, None, 0, copy_gbps, None, None, adapter, f"FAILED: {exc}",
                                 method=mkey, role="prefill", impl="fast"))
    for mkey, m, name, label, plan, qkv, t, out, kv_bytes in timed:
        pc = prefill_check(rt, None if mkey is None else m, batch, key, value, qkv, q, lens, scale, check, out, name)
        nbytes, flops = prefill.prefill_traffic(batch, lens, H, kvh, D, kv_bytes, plan)
        r = _row(name, f"causal prefill, {label} ({plan.describe()})", shape, t, nbytes, copy_gbps, pc.err, pc.tol,
                 adapter, pc.note, method=mkey, role="prefill", impl="fast", flops=flops)
        r["within_tolerance"] = pc.ok
        rows.append(r)
    return rows


@dataclass
class PrefillCheck:
    """A prefill output against its oracle: max error and tolerance (None where the output or the oracle is not
    finite), the verdict, and a note (what was checked, or what failed)."""

    err: float | None
    tol: float
    ok: bool
    note: str


def prefill_check(rt, method, batch, key, value, qkv, q, q_lens, scale, rows, out, name: str = "prefill") -> PrefillCheck:
    """The prefill output `out` of query `rows` (indices into q) against the float64 causal oracle over `method`'s
    cache (None: the f32 cache), kvviz/families/prefill_oracles.method_caches: its family's numpy quantiser, or the
    records the writer wrote where its rounding may differ from it (the seed int8 writer, TurboQuant; `qkv` holds them,
    read back). The seed int8 writer's words are then held to its numpy quantiser on their own, within the writer's
    allowance (a code one step off only at a rounding tie, scales within the adapter's division ULPs:
    paged_oracle.compare_int8_cache, as the writer's own bench row holds them): the attention is checked over what
    the device holds, the writer against what it should hold, and the verdict needs both."""
    fk, fv = prefill_oracles.method_caches(method, batch, key, value, qkv)
    ref = prefill_oracle.causal(q, fk, fv, batch.block_tables, batch.context_lens, q_lens, batch.block_size, scale,
                                rows=rows)
    err, bad = _max_err(out, ref, name)
    tol = prefill_oracle.tolerance(float(np.abs(fv).max(initial=0)))
    ok = err is not None and err <= tol
    note = bad or f"checked on {len(rows)} of {len(q)} queries"
    if method is not None and method.id == "int8_seed" and qkv is not None:
        words = [rt.read(getattr(qkv.device["cache"], w), np.uint32, qkv.device["cache"].shape) for w in "kv"]
        reps = [oracle.compare_int8_cache(w, x, batch.slot_mapping, batch.block_size, oracle.division_ulps(rt.summary))
                for w, x in zip(words, (key, value))]
        writer = (f"the seed writer's codes as read back (against its numpy quantiser: "
                  f"{sum(r['code_mismatch_not_tie'] for r in reps)} off-tie / "
                  f"{sum(r['code_mismatch_at_ties'] for r in reps)} tie mismatches of {sum(r['codes'] for r in reps)}; "
                  f"{sum(r['scale_mismatch'] for r in reps)} scales differ, max "
                  f"{max(r['scale_max_ulp'] for r in reps)} ULP, allowed {oracle.division_ulps(rt.summary)})")
        if not all(r["ok"] for r in reps):
            ok = False
            note = "FAILED: outside the seed writer's allowance: " + writer + ("; " + note if bad else "")
        else:
            note = f"{note} over {writer}"
    return PrefillCheck(err, tol, ok, note)


def _torch_prefill_row(shape, runs, warmup, copy_gbps, adapter):
    """torch SDPA causal in bf16 at the prefill shape: what a user would pick instead. Chunks that are the whole
    sequence use is_causal; shorter chunks a boolean mask (each query over its sequence up to its own position);
    ragged shapes are padded to the longest sequence and chunk."""
    try:
        import torch
        import torch.nn.functional as F
    except Exception as exc:
        return _row("torch_sdpa_causal_bf16", "unavailable", shape, None, 0, copy_gbps, None, None, adapter,
                    f"torch not importable: {exc}", role="prefill")
    if not torch.cuda.is_available():
        return _row("torch_sdpa_causal_bf16", "unavailable", shape, None, 0, copy_gbps, None, None, adapter,
                    "torch has no CUDA device", role="prefill")
    S, L, T = len(shape.context_lens), max(shape.context_lens), max(shape.query_lens)
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    qt = torch.randn(S, shape.num_heads, T, shape.head_size, device=dev, dtype=torch.bfloat16, generator=g)
    kt = torch.randn(S, shape.num_kv_heads, L, shape.head_size, device=dev, dtype=torch.bfloat16, generator=g)
    vt = torch.randn_like(kt)
    whole = T == L and len(set(shape.context_lens)) == 1 and len(set(shape.query_lens)) == 1
    mask = None if whole else (torch.arange(L, device=dev)[None, :] <= (L - T + torch.arange(T, device=dev))[:, None])

    def sdpa():
        return F.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask, is_causal=whole, enable_gqa=True)

    for _ in range(warmup):
        sdpa()
    samples = []
    for _ in range(runs):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        sdpa()
        b.record()
        torch.cuda.synchronize()
        samples.append(a.elapsed_time(b) * 1e3)
    t = TimingResult.from_samples(samples, "cuda-events")
    seen = S * (T * (L - T) + T * (T + 1) // 2)
    nbytes = 2 * kt.numel() * 2 + 2 * qt.numel() * 2
    note = ("" if whole else "a boolean causal mask (chunks shorter than their sequence)") + (
        "; padded to the longest sequence and chunk" if len(set(shape.context_lens)) > 1 or len(set(shape.query_lens)) > 1 else "")
    return _row("torch_sdpa_causal_bf16", f"torch {torch.__version__} {torch.cuda.get_device_name()}", shape, t, nbytes,
                copy_gbps, None, None, adapter, note.strip("; "), role="prefill",
                flops=float(seen * shape.num_heads * (4 * shape.head_size + arith.SOFTMAX_PER_LOGIT)))


# The fast decode's variants timed beside a method's exact fast decode, where its cache format takes them
# (kvviz/attention/split_decode.py: QK_I8_FORMATS, PACKED_FORMATS; the llama.cpp block types' decode,
# kvviz/families/ggml/decode.py: QK_I8_TYPES, and NVFP4's, kvviz/families/fp4/decode.py, both without f16-pair P.V):
# (row suffix, plan keywords). The int8 query with 4 tokens a row (I8Q_UNROLL) and with 2, and with P.V in f16 pairs;
# the exact decode with its reduce folded in.
FAST_VARIANTS = (
    ("int8 query", dict(qk="i8", unroll=I8Q_UNROLL)),
    ("int8 query, 2 tokens a row", dict(qk="i8", unroll=2)),
    ("int8 query, f16x2 P.V", dict(qk="i8", pv="h2", pv_flush=8)),
    ("reduce folded in", dict(fold=True)),
)


def _fast_variant_rows(ctx, m, mkey, qkv, batch, q, scale, shape, runs, warmup, copy_gbps, adapter) -> list:
    """Each of FAST_VARIANTS that the method's fast cache format (or its llama.cpp block type's decode, or NVFP4's)
    takes, over the method's own caches, timed and checked
    against ITS oracle: the float64 decode (of the dequantised int8 query for qk="i8") over the method's dequantised
    cache, within the f32 kernel's tolerance, plus pv_tolerance for f16 P.V (the softmax sum taken as 1: the bound's
    largest)."""
    D = shape.head_size
    tname = getattr(m, "type_name", None)
    ggml = tname in fdg.QK_I8_TYPES
    nvfp4 = mkey == "nvfp4"
    fmt = m.fast_cache_format(D) if hasattr(m, "fast_cache_format") and not (ggml or nvfp4) else None
    if ((not (ggml or nvfp4) and (fmt is None or fmt.name not in fd.PACKED_FORMATS)) or "cache" not in qkv.device
            or "f32" not in qkv.device):
        return []
    fast = fdg.GgmlFastDecode(ctx.rt) if ggml else ffd.Fp4FastDecode(ctx.rt) if nvfp4 else fd.FastDecode(ctx.rt)
    qc = qkv.device["cache"]
    kf, vf = (m.read_f32(ctx, qkv, w).astype(np.float64) for w in ("K", "V"))
    M = float(np.abs(vf).max(initial=0.0))
    codes, qs = fd.quantize_query(q)
    queries = {"f32": np.asarray(q, np.float64), "i8": codes.astype(np.float64) * qs[..., None].astype(np.float64)}
    refs = {}
    rows = []
    for suffix, kw in FAST_VARIANTS:
        if (ggml or nvfp4) and "pv" in kw:  # the block types' and NVFP4's decodes have f32 P.V only
            continue
        name = f"fast_decode_{tname if ggml else 'nvfp4' if nvfp4 else fmt.name} ({suffix})"
        try:
            if ggml:
                plan = fast.plan(tname, qc.k, qc.v, shape.num_kv_heads, q, batch, scale, **kw)
            elif nvfp4:
                plan = fast.plan(qc.k, qc.v, qc.extra["tensor"], shape.num_kv_heads, q, batch, scale, **kw)
            else:
                plan = fast.plan(fmt, qc.k, qc.v, shape.num_kv_heads, q, batch, scale, tensor=qc.extra.get("tensor"), **kw)
            t = ctx.rt.time(plan.dispatches, runs, warmup)
            out = fast.read(plan)
        except (InvalidInput, DeviceLimitError, UnsupportedShape) as exc:
            rows.append(_row(name, m.label, shape, None, 0, copy_gbps, None, None, adapter, f"skipped: {exc}",
                             method=mkey, role="decode", impl="fast"))
            continue
        qk = kw.get("qk", "f32")
        for k in {qk, "f32"} - set(refs):
            refs[k] = oracle.decode(queries[k], kf, vf, batch.block_tables, batch.context_lens, shape.block_size, scale)
        tol = fd.f32_tolerance(M)
        if kw.get("pv") == "h2":
            tol += float(fd.pv_tolerance(M, int(batch.max_context_len), kw.get("unroll", 2), kw.get("pv_flush", fd.PV_FLUSH),
                                         1.0, 4 if fmt.group_size else 2))
        err, note = _max_err(out, refs[qk], name)
        if not note and qk == "i8":
            note = f"vs the f32-query oracle: {float(np.abs(out - refs['f32']).max()):.2e} (the query's int8 rounding)"
        if ggml:
            nbytes, flops = fdg.decode_traffic(tname, batch, shape.num_heads, shape.num_kv_heads, D, plan.num_partitions)
        elif nvfp4:
            nbytes, flops = ffd.decode_traffic(batch, shape.num_heads, shape.num_kv_heads, D, plan.num_partitions)
        else:
            nbytes, flops = fd.decode_traffic(fmt, batch, shape.num_heads, shape.num_kv_heads, D, plan.num_partitions)
        rows.append(_row(name, f"{m.label}: fast split-K ({plan.describe()})", shape, t, nbytes, copy_gbps, err, tol,
                         adapter, note, method=mkey, role="decode", impl="fast", flops=flops))
    return rows


# TurboQuant's paged decode takes the int8 query (kvviz/families/turboquant/decode.py, qk="i8"); its reduce applies the
# inverse rotation, so no folded variant
TQ_VARIANTS = (
    ("int8 query", dict(qk="i8", unroll=I8Q_UNROLL)),
    ("int8 query, 2 tokens a row", dict(qk="i8", unroll=2)),
)


def _tq_variant_rows(ctx, m, mkey, qkv, batch, key, value, q, scale, shape, runs, warmup, copy_gbps, adapter) -> list:
    """TQ_VARIANTS over the method's paged seed-configuration records (where its fast decode takes the shape), timed
    and checked against their own oracle: the seed estimator of the int8 query over the same words, within the
    method's end-to-end tolerance."""
    if m.family != "turboquant" or "paged" not in qkv.device:
        return []
    rows, ref = [], None
    for suffix, kw in TQ_VARIANTS:
        name = f"fast_decode_tq_paged ({suffix})"
        try:
            plan = m.fast_plan(ctx, qkv, batch, q, scale, **kw)
            if plan is None:
                return []
            t = ctx.rt.time(plan.rotate + plan.dispatches, runs, warmup)
            out = ctx.rt.read(plan.out, np.float32, plan.shape)
        except (InvalidInput, DeviceLimitError, UnsupportedShape) as exc:
            rows.append(_row(name, m.label, shape, None, 0, copy_gbps, None, None, adapter, f"skipped: {exc}",
                             method=mkey, role="decode", impl="fast"))
            continue
        if ref is None:
            ref, tol = tq_oracle.turboquant_attention(m, batch, key, value, q, scale, qkv, qk="i8")
            f32_ref, _ = tq_oracle.turboquant_attention(m, batch, key, value, q, scale, qkv)
        err, note = _max_err(out, ref, name)
        if not note:
            note = f"vs the f32-query oracle: {float(np.abs(out - f32_ref).max()):.2e} (the query's int8 rounding)"
        nbytes, flops = fdq.decode_traffic_paged(batch, shape.num_heads, shape.num_kv_heads, shape.head_size,
                                                 plan.num_partitions)
        rows.append(_row(name, f"{m.label}: fast split-K ({plan.describe()})", shape, t, nbytes, copy_gbps, err, tol,
                         adapter, note, method=mkey, role="decode", impl="fast", flops=flops))
    return rows


# KIVI's fast decode takes the int8 query (kvviz/families/kivi/decode.py, qk="i8": requantised a key group and query head
# in the kernel), 4 and 2 tokens a row as the other families' int8-query rows
KIVI_VARIANTS = (
    ("int8 query", dict(qk="i8", unroll=I8Q_UNROLL)),
    ("int8 query, 2 tokens a row", dict(qk="i8", unroll=2)),
)


def _kivi_variant_rows(ctx, m, mkey, qkv, batch, key, value, q, scale, shape, runs, warmup, copy_gbps, adapter) -> list:
    """KIVI_VARIANTS over the method's packed cache (where its fast decode takes the shape), timed and checked against
    their own oracle (kivi.oracle.method_attention_i8: the float64 attention over the requantised query's codes) within
    the f32 kernel's tolerance; the note gives the distance from the f32-query oracle (the query's rounding)."""
    if m.family != "kivi" or "cache" not in qkv.device:
        return []
    rows, ref = [], None
    D = shape.head_size
    for suffix, kw in KIVI_VARIANTS:
        name = f"fast_decode_kivi ({suffix})"
        try:
            plan = m.fast_plan(ctx, qkv, batch, q, scale, **kw)
            if plan is None:
                return []
            t = ctx.rt.time(plan.dispatches, runs, warmup)
            out = ctx.rt.read(plan.out, np.float32, plan.shape)[..., :D]
        except (InvalidInput, DeviceLimitError, UnsupportedShape) as exc:
            rows.append(_row(name, m.label, shape, None, 0, copy_gbps, None, None, adapter, f"skipped: {exc}",
                             method=mkey, role="decode", impl="fast"))
            continue
        if ref is None:
            ref, tol = kivi_oracle.method_attention_i8(m, batch, key, value, q, scale, qkv)
            f32_ref, _ = kivi_oracle.method_attention(m, batch, key, value, q, scale, qkv)
        err, note = _max_err(out, ref, name)
        if not note:
            note = f"vs the f32-query oracle: {float(np.abs(out - f32_ref).max()):.2e} (the query's int8 rounding)"
        qc = qkv.device["cache"]
        nbytes, flops = fdk.decode_traffic(batch, qc.extra["plan"], m.bits, shape.num_heads, shape.num_kv_heads,
                                           qc.head_size, plan.num_partitions)
        rows.append(_row(name, f"{m.label}: fast split-K ({plan.describe()})", shape, t, nbytes, copy_gbps, err, tol,
                         adapter, note, method=mkey, role="decode", impl="fast", flops=flops))
    return rows


def _role_flops(tk, m, batch, shape) -> float:
    """The arithmetic of a timed kernel that states none, from its role at this shape (kvviz/attention/arith.py)."""
    D, kvh = shape.head_size, shape.num_kv_heads
    if tk.role == "decode":
        return arith.decode_flops(batch, shape.num_heads, D)
    if tk.role == "writer":
        return arith.writer_flops(batch, kvh, D, arith.WRITER_PER_ELEMENT.get(m.family, 2.0))
    if tk.role == "dequantise":
        return arith.dequant_flops(batch, kvh, D, arith.DEQUANT_PER_ELEMENT.get(m.family, 1.0))
    return 0.0


def _torch_row(shape, runs, warmup, copy_gbps, adapter):
    """torch SDPA decode in bf16 on the same shape: what a user would pick instead."""
    try:
        import torch
        import torch.nn.functional as F
    except Exception as exc:
        return _row("torch_sdpa_bf16", "unavailable", shape, None, 0, copy_gbps, None, None, adapter, f"torch not importable: {exc}")
    if not torch.cuda.is_available():
        return _row("torch_sdpa_bf16", "unavailable", shape, None, 0, copy_gbps, None, None, adapter, "torch has no CUDA device")

    S, T = len(shape.context_lens), max(shape.context_lens)
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    qt = torch.randn(S, shape.num_heads, 1, shape.head_size, device=dev, dtype=torch.bfloat16, generator=g)
    kt = torch.randn(S, shape.num_kv_heads, T, shape.head_size, device=dev, dtype=torch.bfloat16, generator=g)
    vt = torch.randn_like(kt)
    for _ in range(warmup):
        F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True)
    samples = []
    for _ in range(runs):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True)
        b.record()
        torch.cuda.synchronize()
        samples.append(a.elapsed_time(b) * 1e3)
    t = TimingResult.from_samples(samples, "cuda-events")
    nbytes = 2 * kt.numel() * 2 + 2 * qt.numel() * 2
    note = "padded to the longest sequence" if len(set(shape.context_lens)) > 1 else ""
    return _row("torch_sdpa_bf16", f"torch {torch.__version__} {torch.cuda.get_device_name()}", shape, t, nbytes, copy_gbps, None, None, adapter, note,
                flops=float(S * T * shape.num_heads * (4 * shape.head_size + arith.SOFTMAX_PER_LOGIT)))


NARROW_COLUMNS = (TextColumn("kernel", min_width=16), TextColumn("median us", True), TextColumn("min", True),
                  TextColumn("p90", True), TextColumn("GB/s", True), TextColumn("%copy", True),
                  TextColumn("GFLOP/s", True), TextColumn("FLOP/B", True), TextColumn("bound", True),
                  TextColumn("max err", True), TextColumn("ok", True))
WIDE_COLUMNS = NARROW_COLUMNS[:1] + (TextColumn("variant"),) + NARROW_COLUMNS[1:]


def _num(x, fmt: str) -> str:
    return format(x, fmt) if isinstance(x, (int, float)) and x == x else "-"


def _short(x) -> str:
    """A number in few characters: whole from 1000, else 1-4 significant digits (an exponent from 1e6 or below 1e-4)."""
    if not isinstance(x, (int, float)) or x != x:
        return "-"
    a = abs(x)
    if a == 0:
        return "0"
    if a >= 1e6:
        return f"{x:.2g}"
    return f"{x:.0f}" if a >= 1000 else f"{x:.1f}" if a >= 10 else f"{x:.2f}" if a >= 0.01 else f"{x:.1g}"


def format_table(result: dict, width: int | None = WIDTH) -> str:
    """The bench rows as a text table, one block per shape, each line at most `width` characters: the
    variant is a line above the rows it applies to (so no column is spent on it), numbers are short,
    a long kernel name is shortened in the middle, a row's note is a line under it (a FAILED one
    wrapped whole). width None (--wide): a variant column, every cell whole, the note after its row."""
    wide = width is None
    lines = []
    shapes = []  # (shape dict, [(variant, cells, note)]) in the rows' order
    for r in result["rows"]:
        if not shapes or r["shape"]["name"] != shapes[-1][0]["name"]:
            shapes.append((r["shape"], []))
        ok = "-" if r["tolerance"] is None else ("yes" if r["within_tolerance"] else "NO")
        f = _num if wide else (lambda x, fmt: _short(x) if fmt.endswith("f") or fmt.endswith("g") else _num(x, fmt))
        cells = [f(r["gpu_us_median"], ".1f"), f(r["gpu_us_min"], ".1f"), f(r["gpu_us_p90"], ".1f"),
                 f(r["gbps"], ".1f"), f(r["pct_of_copy"], ".1f"), f(r.get("gflops"), ".3g"),
                 f(r.get("intensity"), ".3g"), r.get("bound") or "-",
                 _num(r["max_abs_err_vs_oracle"], ".2e" if wide else ".1e"), ok]
        shapes[-1][1].append((r["variant"], [r["kernel"]] + ([r["variant"]] if wide else []) + cells, r["note"] or ""))
    for s, rows in shapes:
        lines.append("")
        lines += paragraph(shape_header(s), width)
        cells, notes = [c for _, c, _ in rows], [n for _, _, n in rows]
        failed = lambda n: str(n).startswith("FAILED")  # noqa: E731
        lines += (text_table(WIDE_COLUMNS, cells, width, notes, failed) if wide else
                  grouped_table(NARROW_COLUMNS, cells, [v for v, _, _ in rows], width, notes, failed))
    against = [b for b in result.get("decode_vs_f16") or () if b["vs_f16"] is not None]
    for name in dict.fromkeys(b["shape"] for b in against):
        lines.append("")
        lines += paragraph(f"{name}: each method's fastest decode (exact or a variant, checked rows only) against the "
                           "f16 decode of this run:", width)
        lines += [f"  {b['method']:<14} {b['us']:>9.1f} us  {b['vs_f16']:5.2f} x f16   {b['kernel']}"[:width or None]
                  for b in against if b["shape"] == name]
    rl = result.get("roofline")
    if rl:
        f16 = f", f16 FMA {rl['f16_gflops']:.4g} GFLOP/s" if rl.get("f16_gflops") else ""
        lines.append("")
        lines += paragraph(
            f"roofline ceilings (same run): shader copy {rl['mem_gbps']:.4g} GB/s, f32 FMA {rl['f32_gflops']:.4g} "
            f"GFLOP/s{f16}; ridge {rl['ridge_flop_per_byte']:.3g} FLOP/B. GFLOP/s = stated FLOPs "
            "(kvviz/attention/arith.py) / median; FLOP/B = FLOPs / unique bytes; bound = memory left of the ridge, "
            "compute right of it.", width)
    return "\n".join(lines)


def shape_header(s: dict) -> str:
    """The line above a shape's rows: a decode shape's sequences and heads, a GEMM's M x N x K."""
    if "m" in s and "k" in s:
        return f"== {s['name']}: M {s['m']} tokens x N {s['n']} outputs x K {s['k']} inputs, f32 activations"
    return (f"== {s['name']}: {s['num_seqs']} seqs, {s['num_tokens']} tokens, {s['num_heads']}/"
            f"{s['num_kv_heads']} heads, d{s['head_size']}, block {s['block_size']}")


def save_json(result: dict, path: str) -> None:
    """Strict JSON (RFC 8259): NaN/Inf become null, numpy values plain numbers; other tools parse it."""
    with open(path, "w") as fh:
        json.dump(clean(result), fh, indent=2, allow_nan=False)


def check_shape(shape: BenchShape) -> None:
    """Refuse a shape the kernels cannot take before any GPU work (InvalidInput/UnsupportedShape,
    exit 2 from the CLI), with the kernels' own head-size rules."""
    if not shape.context_lens or any(int(n) < 1 for n in shape.context_lens):
        raise InvalidInput(f"shape {shape.name}: every sequence needs at least one token, got {list(shape.context_lens)}",
                           "Give --seqs and --ctx of at least 1.")
    for name in ("num_heads", "num_kv_heads", "head_size", "block_size"):
        if int(getattr(shape, name)) < 1:
            raise InvalidInput(f"shape {shape.name}: {name} must be positive, got {getattr(shape, name)}")
    if shape.query_lens and (len(shape.query_lens) != len(shape.context_lens)
                             or any(not 0 <= int(n) <= int(c) for n, c in zip(shape.query_lens, shape.context_lens))):
        raise InvalidInput(f"shape {shape.name}: a prefill needs one chunk length a sequence, each at most its context "
                           f"({list(shape.query_lens)} over {list(shape.context_lens)})")
    if shape.num_heads % shape.num_kv_heads:
        raise UnsupportedShape(f"--heads {shape.num_heads} is not divisible by --kv-heads {shape.num_kv_heads}",
                               "GQA needs the query heads to be a multiple of the KV heads.")
    for fmt in ("f32", "q8"):  # the baseline and the seed kernels every bench runs
        try:
            check_head_size(fmt, shape.head_size)
        except InvalidInput as exc:
            raise UnsupportedShape(f"--head-size: {exc}", exc.hint) from None


def closing_line(rows) -> str:
    """The line `kvviz bench` ends with: how many rows, how many checked within tolerance, how many failed."""
    rows = list(rows)
    ok = sum(1 for r in rows if r.get("tolerance") is not None and r.get("within_tolerance")
             and not str(r.get("note", "")).startswith("FAILED"))
    return f"{len(rows)} rows, {ok} checked within tolerance, {len(failed_rows({'rows': rows}))} failed"


def failed_rows(result: dict) -> list:
    """Rows that make `kvviz bench` exit 1: a kernel that FAILED, or a result outside its tolerance."""
    return [r for r in result["rows"]
            if str(r.get("note", "")).startswith("FAILED")
            or (r.get("tolerance") is not None and not r.get("within_tolerance"))]
