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
from kvviz.gpu.templates import render_defines
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


# ---------------------------------------------------------------------------------- forms of the arithmetic
FMA_FORMS = KernelSpec("probe/fma_forms.wgsl", bindings=rw("out"), immediates=Struct("P", "iters seed:f32 mul:f32"))


@dataclass(frozen=True)
class FmaForm:
    """One form of the probe's arithmetic (shaders/probe/fma_forms.wgsl): type, vector width, independent chains,
    steps of each chain an iteration, and the step as the fma builtin ("fma") or as a * m + c ("muladd").
    FmaForm() is the roofline probe's own form (shaders/probe/fma.wgsl)."""

    dtype: str = "f32"
    width: int = 4
    chains: int = 8
    repeat: int = 1
    op: str = "fma"
    mul: str = "const"  # the multiplier: "const" m (a constant per component), "const1" (0.999 in every component),
    # "uniform" (0.999 from the immediates: a register, not a constant), "chain" (the next chain's value: no compiler
    # can fold the steps)

    def __post_init__(self):
        if self.dtype not in ("f32", "f16") or self.width not in (1, 2, 4) or self.op not in ("fma", "muladd") \
                or self.mul not in ("const", "const1", "uniform", "chain") \
                or not 1 <= self.chains <= 64 or not 1 <= self.repeat <= 16:
            raise ValueError(f"FMA form {self}: dtype f32 / f16, width 1 / 2 / 4, 1..64 chains, 1..16 repeats, "
                             f"op fma / muladd, mul const / const1 / uniform / chain")

    @property
    def label(self) -> str:
        t = self.dtype if self.width == 1 else f"vec{self.width}<{self.dtype}>"
        mul = {"const": "m", "const1": "0.999", "uniform": "m from p", "chain": "next chain"}[self.mul]
        return f"{t} x {self.chains} chains x {self.repeat}, " + (f"fma(a, {mul}, c)" if self.op == "fma" else f"a * {mul} + c")

    @property
    def flops_per_iteration(self) -> int:
        return 2 * self.width * self.chains * self.repeat


def form_dispatches(rt: GpuRuntime, form: FmaForm, groups: int | None = None, iters: int | None = None):
    """(dispatches, flops, out buffer, threads, iters) of one form; the same grid and iteration rules as
    fma_dispatches, with the iterations cut by `repeat` so every form runs about as many steps."""
    sw = rt.summary.is_software
    groups = min(int(groups or (64 if sw else 8192)), rt.max_grid)
    iters = int(iters or max(1, (512 if sw else 4096) * 8 * 4 // (form.chains * form.width * form.repeat)))
    if rt.loop_limit is not None:
        iters = min(iters, max(1, rt.loop_limit // 2))
    defines = render_defines("probe/fma_forms.wgsl.j2", T=form.dtype, W=form.width, C=form.chains, R=form.repeat,
                             op=form.op, mul=form.mul)
    kern = rt.compile(FMA_FORMS, T=form.dtype, ENABLE="enable f16;" if form.dtype == "f16" else "", **defines)
    threads = groups * WORKGROUP
    out = rt.empty(threads * 4, f"fma_form_{form.dtype}_out")
    d = [kern.dispatch((groups, 1, 1), [out], iters=iters, seed=0.5, mul=0.999)]
    return d, float(threads) * iters * form.flops_per_iteration, out, threads, iters


def form_sinks(form: FmaForm, iters: int, fused: bool = True) -> np.ndarray:
    """The sink of each of the 256 seeds (thread t has seed t & 255) by stepping the chains in numpy: f16 steps
    exactly (float64 holds an f16 product and its sum with c exactly, then one rounding: the fma's; fused=False
    rounds the product first), f32 ones to within a rare double rounding of a step."""
    ft = np.float16 if form.dtype == "f16" else np.float32
    s = (np.arange(256, dtype=np.float32) * np.float32(1e-3) + np.float32(0.5)).astype(ft)
    m = (np.full(1, 0.999) if form.width == 1 or form.mul != "const" else 0.999 - 0.001 * np.arange(form.width))
    m = m.astype(ft)
    c = ft(1e-3)
    a = [np.repeat(s[:, None], form.width, 1)]
    for _ in range(form.chains - 1):
        a.append((a[-1] + c).astype(ft))
    a = np.stack(a).astype(np.float64)  # [chains, 256, width]
    m64, c64 = m.astype(np.float64), np.float64(c)
    C = form.chains
    for _ in range(iters * form.repeat):
        if form.mul == "chain":  # in the shader's order: chain C - 1 takes chain 0's new value
            for k in range(C):
                prod = a[k] * a[(k + 1) % C]
                a[k] = ((prod if fused else prod.astype(ft).astype(np.float64)) + c64).astype(ft)
            continue
        prod = a * m64 if fused else (a * m64).astype(ft).astype(np.float64)
        a = (prod + c64).astype(ft).astype(np.float64)
    t = a[0].astype(ft)
    for k in range(1, form.chains):
        t = (t + a[k].astype(ft)).astype(ft)
    out = t[:, 0].astype(np.float32)
    for j in range(1, form.width):
        out = out + t[:, j].astype(np.float32)
    return out


def check_form(rt: GpuRuntime, form: FmaForm, out, threads: int, iters: int) -> float:
    """The median over the threads of a sink's relative error against form_sinks (a * m + c: the fused or the
    unfused steps, the closer): 0 where the device rounds as numpy does, and a probe that skipped or added
    iterations is off by far more. The median, not the max: Vulkan leaves the rounding of a conversion to f16 to
    the device (lavapipe's differs from round-to-nearest-even on a few of the seeds, and a chain carries that
    last-bit difference on)."""
    got = rt.read(out, np.float32, (threads,)).astype(np.float64)
    seeds = np.arange(threads) & 255
    errs = []
    for fused in ((True,) if form.op == "fma" else (True, False)):
        ref = form_sinks(form, iters, fused).astype(np.float64)[seeds]
        errs.append(float(np.median(np.abs(got - ref) / np.maximum(np.abs(ref), 1e-30))))
    return min(errs)


def measure_form(rt: GpuRuntime, form: FmaForm, runs: int = 10, warmup: int = 3) -> FmaResult:
    d, flops, out, threads, iters = form_dispatches(rt, form)
    t = rt.time(d, runs=runs, warmup=warmup)
    err = check_form(rt, form, out, threads, iters)
    out.destroy()
    return FmaResult(form.label, t, flops, err, 4 * threads)
