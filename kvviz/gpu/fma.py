"""Compute ceiling for the roofline: FMA throughput of a streaming-free shader (shaders/probe/fma.wgsl).

Family "probe" (no numpy reference: the kernel's output is only a sink; `check_fma` recomputes it in
numpy so a broken probe is still caught). f32 always; f16 where the adapter has shader-f16. Timed by
GPU timestamps like every kernel; flops = threads x iters x 64 (8 vec4 FMA chains, FMA = 2 flops).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvviz.gpu.kernel_spec import KernelSpec, Struct, rw
from kvviz.gpu.runtime import GpuRuntime
from kvviz.gpu.timing import TimingResult

FMA = KernelSpec("probe/fma.wgsl", bindings=rw("out"), immediates=Struct("P", "iters seed:f32"))
KERNELS = (FMA,)
FLOPS_PER_STEP = 64  # 8 chains x vec4 x (multiply + add)
WORKGROUP = 256


def dtypes(rt: GpuRuntime) -> tuple[str, ...]:
    """The FMA types this adapter can run: f32, and f16 with the shader-f16 feature."""
    return ("f32", "f16") if "shader-f16" in rt.features else ("f32",)


def _defines(dtype: str) -> dict:
    if dtype not in ("f32", "f16"):
        raise ValueError(f"FMA probe type must be f32 or f16, got {dtype!r}")
    return {"T": dtype, "ENABLE": "enable f16;" if dtype == "f16" else ""}


def fma_dispatches(rt: GpuRuntime, dtype: str = "f32", groups: int | None = None, iters: int | None = None):
    """(dispatches, flops, out buffer, threads, iters): enough threads to fill a large GPU (or 64 groups on a
    software rasteriser) and iterations inside its loop budget."""
    sw = rt.summary.is_software
    groups = int(groups or (64 if sw else 8192))
    groups = min(groups, rt.max_grid)
    iters = int(iters or (512 if sw else 4096))
    if rt.loop_limit is not None:
        iters = min(iters, max(1, rt.loop_limit // 2))
    kern = rt.compile(FMA, **_defines(dtype))
    threads = groups * WORKGROUP
    out = rt.empty(threads * 4, f"fma_{dtype}_out")
    d = [kern.dispatch((groups, 1, 1), [out], iters=iters, seed=0.5)]
    return d, float(threads) * iters * FLOPS_PER_STEP, out, threads, iters


def check_fma(rt: GpuRuntime, out, threads: int, iters: int, dtype: str) -> float:
    """Max relative error of the probe's sink against numpy (f32 math; f16 only loosely): a probe that does
    not run its loop is caught here."""
    ft = np.float16 if dtype == "f16" else np.float32
    lanes = np.arange(threads, dtype=np.uint32)
    s = ((lanes & 255).astype(np.float32) * np.float32(1e-3) + np.float32(0.5)).astype(ft)
    m = np.array([0.999, 0.998, 0.997, 0.996], ft)
    c = ft(1e-3)
    acc = [np.repeat(s[:, None], 4, 1).astype(ft)]
    for _ in range(7):
        acc.append((acc[-1] + c).astype(ft))
    # a_{n+1} = a_n m + c has the closed form a_n = m^n a_0 + c (1 - m^n) / (1 - m), in float64
    mn = np.power(m.astype(np.float64), iters)
    fin = [a.astype(np.float64) * mn + np.float64(c) * (1 - mn) / (1 - m.astype(np.float64)) for a in acc]
    t = (fin[0] + fin[1]) + (fin[2] + fin[3]) + (fin[4] + fin[5]) + (fin[6] + fin[7])
    ref = t.sum(-1)
    got = rt.read(out, np.float32, (threads,)).astype(np.float64)
    return float(np.max(np.abs(got - ref) / np.maximum(np.abs(ref), 1e-30)))


@dataclass(frozen=True)
class FmaResult:
    dtype: str
    timing: TimingResult
    flops: float
    rel_err: float
    bytes: int  # the sink it writes (4 bytes a thread): its only memory traffic

    @property
    def gflops(self) -> float:
        return self.flops / (self.timing.median_us * 1e3) if self.timing.median_us > 0 else float("nan")


def measure_fma(rt: GpuRuntime, dtype: str = "f32", runs: int = 10, warmup: int = 3) -> FmaResult:
    d, flops, out, threads, iters = fma_dispatches(rt, dtype)
    t = rt.time(d, runs=runs, warmup=warmup)
    err = check_fma(rt, out, threads, iters, dtype)
    out.destroy()
    return FmaResult(dtype, t, flops, err, 4 * threads)


# The timing frame's floor: the FMA probe cut to one step a thread on a grid of FLOOR_GROUPS workgroups (about as many
# threads as the fast decode's anchor grid), timed like every kernel: its own compute pass, begin / end timestamps.
# A row near it is mostly the frame's fixed cost. That cost moves between processes (on the H200 about twice as
# much in some processes as in others), and a pass of real work before each timed pass does not change it, so it is
# not the clocks; passes back to back in one compute pass cost about the lower figure each (tools/timing_frame.py;
# figures in docs/benchmarks.md).
FLOOR_GROUPS = 480


def measure_timing_floor(rt: GpuRuntime, runs: int = 20, warmup: int = 3) -> TimingResult:
    """GPU time of a near-empty dispatch in its own pass (FLOOR_GROUPS x 256 threads, one FMA step each)."""
    d, _, out, _, _ = fma_dispatches(rt, "f32", groups=FLOOR_GROUPS, iters=1)
    t = rt.time(d, runs=runs, warmup=warmup)
    out.destroy()
    return t
