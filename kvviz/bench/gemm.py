"""`kvviz bench --gemm MxNxK`: the GPU forward's matrix multiply (kvviz/forward/kernels.py) timed with GPU
timestamps on M x N x K products (M tokens x N outputs x K inputs: x [M, K] f32 times weights [N, K] transposed, f32
accumulation) with f32 and with f16 weights, in the forward's tile shapes and two alternatives, and the forward's
choice once more without naga's runtime checks (kvviz/gpu/trusted.py); each FLOP rate against the FMA
ceiling measured in the same run (kvviz/gpu/fma.py: the f32 and, with shader-f16, the f16 FMA throughput of this
adapter); torch's matmul on the same shape beside it with --compare-torch (CUDA events, like the decode rows).

Each product is checked against the float64 product on a sample of rows: a row's error is the largest
|out - ref| / bound over its elements, bound = (K + 3) u sum_k |x||w| (kvviz/forward/oracle.py: any order of f32
summation stays within it), so "within tolerance" means a ratio of at most 1.
"""
from __future__ import annotations

import re
import time
from dataclasses import dataclass

import numpy as np

from kvviz.bench.roofline import Ceilings, bound
from kvviz.errors import DeviceLimitError, InvalidInput, KvvizError, UnsupportedShape
from kvviz.forward import kernels as fk
from kvviz.forward.oracle import matmul_ref
from kvviz.gpu.copy import measure_copy
from kvviz.gpu import trusted
from kvviz.gpu.fma import dtypes, measure_fma
from kvviz.gpu.runtime import GpuRuntime
from kvviz.gpu.timing import TimingResult
from kvviz.tables import paragraph

ANCHOR = "4096x4096x2048"
CHECK_ROWS = 64  # rows of the product compared with float64 (sampled over M)
CONFIGS = (fk.LARGE, fk.MEDIUM) + fk.ALTERNATIVES


@dataclass(frozen=True)
class GemmShape:
    m: int
    n: int
    k: int

    @property
    def name(self) -> str:
        return f"gemm-{self.m}x{self.n}x{self.k}"

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.n * self.k

    def to_json(self) -> dict:
        return {"name": self.name, "m": self.m, "n": self.n, "k": self.k}


def parse_gemm(text: str) -> list[GemmShape]:
    """'4096x4096x2048,512x576x576' -> shapes; InvalidInput naming the item otherwise."""
    shapes = []
    for item in [t.strip() for t in str(text).split(",") if t.strip()]:
        m = re.fullmatch(r"(\d+)x(\d+)x(\d+)", item)
        if not m or min(int(g) for g in m.groups()) < 1:
            raise InvalidInput(f"--gemm {item!r}: give M x N x K as three positive integers, e.g. {ANCHOR}")
        shapes.append(GemmShape(*(int(g) for g in m.groups())))
    if not shapes:
        raise InvalidInput(f"--gemm: no shape in {text!r}", f"Give e.g. --gemm {ANCHOR}.")
    return shapes


def _row(kernel, variant, shape: GemmShape, timing, nbytes, flops, err, tol, adapter, note, fma):
    med = timing.median_us if timing is not None else None
    gflops = flops / (med * 1e3) if med else None
    pct = 100.0 * gflops / fma["f32"] if gflops and fma.get("f32") else None
    return {
        "kernel": kernel, "variant": variant, "method": None, "role": "matmul",
        "impl": "baseline" if kernel.startswith("torch") else "forward", "shape": shape.to_json(),
        "gpu_us_min": timing.min_us if timing else None, "gpu_us_median": med,
        "gpu_us_p90": timing.p90_us if timing else None, "timing_method": timing.method if timing else None,
        "samples_us": list(timing.samples_us) if timing else None,
        "source_hash": getattr(timing, "source_hash", None), "bytes_moved": int(nbytes),
        "gbps": timing.gbps(nbytes) if timing is not None and nbytes else None, "pct_of_copy": None,
        "max_abs_err_vs_oracle": err, "tolerance": tol,
        "within_tolerance": None if tol is None else bool(err is not None and np.isfinite(err) and err <= tol),
        "adapter": adapter, "note": note, "flops": flops, "gflops": gflops,
        "intensity": flops / nbytes if flops and nbytes else None, "bound": None,
        "pct_of_fma": pct,  # of the f32 FMA ceiling measured in the same run
    }


def _check(x, w16or32, out, rows) -> float:
    """The largest |out - ref| / bound over the sampled rows (ref and bound: kvviz/forward/oracle.py)."""
    ref, bnd = matmul_ref(x[rows], w16or32)
    return float((np.abs(out - ref) / bnd).max())


def gemm_rows(rt: GpuRuntime, shape: GemmShape, runs: int, warmup: int, adapter: dict, fma: dict,
              seed: int = 0, configs=CONFIGS) -> list[dict]:
    """The forward's matmul on `shape`: f32 and f16 weights, each tile shape of `configs` and the forward's choice
    without runtime checks; each timed and checked."""
    rng = np.random.default_rng(seed)
    m, n, k = shape.m, shape.n, shape.k
    kern = fk.ForwardKernels(rt)
    rows = []
    try:
        x = rng.standard_normal((m, k), dtype=np.float32)
        w = (rng.standard_normal((n, k), dtype=np.float32) * np.float32(1 / np.sqrt(k))).astype(np.float32)
        xb = rt.upload(x, "gemm-x")
        ob = rt.empty(m * n * 4, "gemm-out", binding=True)
    except (DeviceLimitError, InvalidInput) as exc:
        return [_row("forward_matmul", "skipped", shape, None, 0, shape.flops, None, None, adapter,
                     f"skipped: {exc.one_line()}", fma)]
    sample = np.unique(np.linspace(0, m - 1, min(m, CHECK_ROWS)).astype(np.int64))
    forwards = kern.gemm_config(m, n)  # the tile the forward takes for this shape
    chosen = forwards if forwards in configs else configs[0]
    for dtype in ("f32", "f16"):
        try:
            mat = fk.upload_matrix(rt, [w], f"gemm-w-{dtype}", dtype)
        except (DeviceLimitError, InvalidInput) as exc:
            rows.append(_row(f"forward_matmul_{dtype}w", "skipped", shape, None, 0, shape.flops, None, None, adapter,
                             f"skipped: {exc.one_line()}", fma))
            continue
        wdev = w.astype(np.float16).astype(np.float32) if dtype == "f16" else w
        nbytes = x.nbytes + mat.nbytes + m * n * 4
        runs_of = [(cfg, True) for cfg in configs] + ([(chosen, False)] if trusted.available() else [])
        for cfg, checks in runs_of:
            name = f"forward_matmul_{dtype}w"
            variant = (f"tile {cfg.label()}" + (" (the forward's choice here)" if cfg == forwards and checks else "")
                       + ("" if checks else ", runtime checks off"))
            try:
                ds = kern.matmul(xb, m, mat, ob, config=cfg, matvec=False, checks=checks)
                t = rt.time(ds, runs, warmup)
                out = rt.read(ob, np.float32, (m, n))[sample]
                err = _check(x, wdev, out, sample)
                r = _row(name, variant, shape, t, nbytes, shape.flops, err, 1.0, adapter, "", fma)
                pct = r["pct_of_fma"]
                r["note"] = ((f"{pct:.0f}% of the f32 FMA ceiling of this run; " if pct is not None else "")
                             + f"error: largest |err| / bound over {sample.size} rows")
                rows.append(r)
            except (InvalidInput, DeviceLimitError, UnsupportedShape) as exc:
                rows.append(_row(name, variant, shape, None, 0, shape.flops, None, None, adapter,
                                 f"skipped: {exc.one_line()}", fma))
            except KvvizError as exc:
                rows.append(_row(name, variant, shape, None, 0, shape.flops, None, None, adapter, f"FAILED: {exc}",
                                 fma))
        mat.destroy()
    xb.destroy()
    ob.destroy()
    return rows


def torch_rows(shape: GemmShape, runs: int, warmup: int, adapter: dict, fma: dict) -> list[dict]:
    """torch.matmul on the same shape: fp32 with TF32 off (the same arithmetic: f32 products and sums) and fp16
    (tensor cores, f32 accumulation): what a user would pick instead."""
    try:
        import torch
    except Exception as exc:
        return [_row("torch_matmul", "unavailable", shape, None, 0, shape.flops, None, None, adapter,
                     f"torch not importable: {exc}", fma)]
    if not torch.cuda.is_available():
        return [_row("torch_matmul", "unavailable", shape, None, 0, shape.flops, None, None, adapter,
                     "torch has no CUDA device", fma)]
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    out = []
    tf32 = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = False
        for dt, label in ((torch.float32, "fp32, TF32 off"), (torch.float16, "fp16, tensor cores")):
            a = torch.randn(shape.m, shape.k, device=dev, dtype=dt, generator=g)
            b = torch.randn(shape.n, shape.k, device=dev, dtype=dt, generator=g)
            for _ in range(max(1, warmup)):
                torch.matmul(a, b.T)
            samples = []
            for _ in range(runs):
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                e0.record()
                torch.matmul(a, b.T)
                e1.record()
                torch.cuda.synchronize()
                samples.append(e0.elapsed_time(e1) * 1e3)
            t = TimingResult.from_samples(samples, "cuda-events")
            item = a.element_size()
            nbytes = (a.numel() + b.numel() + shape.m * shape.n) * item
            r = _row(f"torch_matmul_{'fp32' if dt == torch.float32 else 'fp16'}",
                     f"torch {torch.__version__} {torch.cuda.get_device_name()}, {label}", shape, t, nbytes,
                     shape.flops, None, None, adapter, "", fma)
            if r["pct_of_fma"] is not None:
                r["note"] = f"{r['pct_of_fma']:.0f}% of the f32 FMA ceiling of this run (a shader's FMA throughput)"
            out.append(r)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
    return out


def run_gemm_bench(shapes, runs: int = 20, warmup: int = 3, compare_torch: bool = False,
                   rt: GpuRuntime | None = None, log=print, configs=CONFIGS) -> dict:
    """The bench result (run_bench's form): the ceilings of this run (copy, FMA) and the GEMM rows of each shape."""
    rt = rt or GpuRuntime()
    adapter = rt.summary.to_json()
    for line in paragraph(f"adapter: {rt.summary.line()}"):
        log(line)
    rows, fma = [], {}
    first = shapes[0]
    copy_gbps, copies = measure_copy(rt, 32 << 20, runs, warmup)
    for name, variant, t, nb in copies:
        r = _row(name, variant, first, t, nb, 0.0, None, None, adapter, "", {})
        r["pct_of_copy"] = 100.0 * t.gbps(nb) / copy_gbps if copy_gbps else None
        r["role"], r["impl"] = None, None
        rows.append(r)
    for dt in dtypes(rt):
        fr = measure_fma(rt, dt, runs, warmup)
        fma[dt] = fr.gflops
        r = _row(f"fma_{dt}", f"FMA throughput {dt} (compute ceiling)", first, fr.timing, fr.bytes, fr.flops, None,
                 None, adapter, f"sink rel err {fr.rel_err:.1e} vs numpy", {})
        r["role"], r["impl"], r["pct_of_fma"] = None, None, None
        rows.append(r)
    shader_copy = next(t.gbps(nb) for name, _, t, nb in copies if name == "copy_shader")
    ceilings = Ceilings(shader_copy, fma["f32"], fma.get("f16"), rt.summary.name, bool(rt.summary.is_software))
    for shape in shapes:
        rows += gemm_rows(rt, shape, runs, warmup, adapter, fma, configs=configs)
        if compare_torch:
            rows += torch_rows(shape, runs, warmup, adapter, fma)
    for r in rows:
        if r["intensity"] is not None and r["gpu_us_median"] and not r["kernel"].startswith("fma_"):
            r["bound"] = bound(r["intensity"], ceilings)
    return {"adapter": adapter, "timestamp_period_ns": rt.timestamp_period_ns,
            "created": time.strftime("%Y-%m-%dT%H:%M:%S"), "runs": runs, "warmup": warmup, "rows": rows,
            "roofline": ceilings.to_json(), "timing_floor_us": None}
