"""Roofline (Qt-free): each kernel's arithmetic intensity (FLOPs / unique bytes) against its achieved FLOP/s,
under the device's ceilings measured in the same run: the shader copy's bandwidth (kvviz/gpu/copy.py)
and the FMA throughput (kvviz/gpu/fma.py; f32, and f16 where the adapter has shader-f16).

A kernel is memory-bound when its intensity lies left of the ridge point (f32 FMA GFLOP/s / copy GB/s),
compute-bound right of it. A kernel that states 0 FLOPs (a copy) has intensity 0: memory-bound.
"""
from __future__ import annotations

import math
import weakref
from dataclasses import dataclass

from kvviz.attention import arith
from kvviz.errors import InvalidInput
from kvviz.gpu.copy import time_copy_shader
from kvviz.gpu.fma import dtypes, measure_fma


@dataclass(frozen=True)
class Ceilings:
    mem_gbps: float  # the WGSL vec4 copy shader's bandwidth (unique bytes / median)
    f32_gflops: float
    f16_gflops: float | None = None
    adapter: str = ""
    is_software: bool = False

    @property
    def ridge(self) -> float:
        """FLOP/byte where the memory roof meets the f32 compute roof."""
        return self.f32_gflops / self.mem_gbps if self.mem_gbps > 0 else float("inf")

    def attainable(self, intensity: float) -> float:
        return min(self.f32_gflops, self.mem_gbps * intensity)

    def to_json(self) -> dict:
        return {"mem_gbps": self.mem_gbps, "f32_gflops": self.f32_gflops, "f16_gflops": self.f16_gflops,
                "ridge_flop_per_byte": self.ridge, "adapter": self.adapter, "is_software": self.is_software}


def measure_ceilings(rt, copy_bytes: int = 32 << 20, runs: int = 10, warmup: int = 3) -> tuple[Ceilings, list]:
    """(Ceilings, [(name, variant, TimingResult, bytes, flops)]) of this adapter, from GPU timestamps."""
    st, sb = time_copy_shader(rt, copy_bytes, runs, warmup)
    rows = [("copy_shader", "wgsl vec4", st, sb, 0.0)]
    peaks = {}
    for dt in dtypes(rt):
        r = measure_fma(rt, dt, runs, warmup)
        peaks[dt] = r.gflops
        rows.append((f"fma_{dt}", f"fma throughput ({dt}, rel err {r.rel_err:.1e})", r.timing, r.bytes, r.flops))
    c = Ceilings(st.gbps(sb), peaks["f32"], peaks.get("f16"), rt.summary.name, bool(rt.summary.is_software))
    return c, rows


def measure_fma_gflops(rt, runs: int = 10, warmup: int = 3) -> dict:
    """{"f32": GFLOP/s, "f16": GFLOP/s where the adapter has shader-f16} of the FMA-throughput shader."""
    return {dt: measure_fma(rt, dt, runs, warmup).gflops for dt in dtypes(rt)}


_FMA_OF_DEVICE: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def device_fma_gflops(rt, refresh: bool = False) -> dict:
    """measure_fma_gflops of `rt`'s device, measured once a runtime (refresh=True measures again): a
    device's FMA ceiling does not change between computes, and on a software adapter the probe costs
    more than a small compute, so a window that opens or recomputes does not pay for it again."""
    got = None if refresh else _FMA_OF_DEVICE.get(rt)
    if got is None:
        got = _FMA_OF_DEVICE[rt] = measure_fma_gflops(rt)
    return dict(got)


@dataclass(frozen=True)
class Point:
    kernel: str
    variant: str
    bytes: int
    flops: float
    median_us: float

    @property
    def intensity(self) -> float:
        return self.flops / self.bytes if self.bytes > 0 else float("nan")

    @property
    def gflops(self) -> float:
        return self.flops / (self.median_us * 1e3) if self.median_us > 0 else float("nan")

    @property
    def gbps(self) -> float:
        return self.bytes / (self.median_us * 1e3) if self.median_us > 0 else float("nan")

    def bound(self, c: Ceilings | None) -> str:
        return bound(self.intensity, c)

    def to_json(self, c: Ceilings | None = None) -> dict:
        d = {"kernel": self.kernel, "variant": self.variant, "bytes": self.bytes, "flops": self.flops,
             "median_us": self.median_us, "intensity": self.intensity, "gflops": self.gflops, "bound": self.bound(c)}
        if c is not None:
            att = c.attainable(self.intensity) if math.isfinite(self.intensity) else float("nan")
            d["attainable_gflops"] = att
            d["pct_of_roof"] = 100.0 * self.gflops / att if att and att > 0 else None
        return d


def bound(intensity: float, c: Ceilings | None) -> str:
    if c is None or not math.isfinite(intensity):
        return "-"
    return "memory" if intensity < c.ridge else "compute"


def row_flops(row, res) -> float:
    """A window timing row's FLOPs: the row's own `flops` when it states them, else the arithmetic of its role
    at the results' shape (kvviz/attention/arith.py)."""
    f = getattr(row, "flops", None)
    if f:
        return float(f)
    name = row.kernel
    if name.startswith("copy"):
        return 0.0
    b, q = res.batch, res.q
    S, H, D = q.shape
    kvh = res.key.shape[1]
    fam = getattr(res.method, "family", "")
    if name == "reshape_and_cache_f32":
        return 0.0
    if row.role == "decode" or name.startswith("paged_attn"):
        return arith.decode_flops(b, H, D)
    if row.role == "writer" or name.startswith("reshape_and_cache"):
        return arith.writer_flops(b, kvh, D, arith.WRITER_PER_ELEMENT.get(fam, 2.0))
    if row.role == "dequantise":
        return arith.dequant_flops(b, kvh, D, arith.DEQUANT_PER_ELEMENT.get(fam, 1.0))
    return 0.0


def points_from_results(res) -> list[Point]:
    return [Point(t.kernel, t.variant, int(t.bytes_moved), row_flops(t, res), float(t.timing.median_us))
            for t in res.timings if t.timing.median_us > 0 and not t.kernel.startswith("copy_buffer")]


def ceilings_from_results(res, fma_gflops: dict | None = None) -> Ceilings | None:
    """The memory roof from the results' shader copy row; the compute roof from `fma_gflops` (measured on the
    same device by the window's roofline task), or None without it."""
    copy = next((t for t in res.timings if t.kernel == "copy_shader"), None)
    if copy is None or not fma_gflops:
        return None
    return Ceilings(copy.gbps, fma_gflops["f32"], fma_gflops.get("f16"), res.adapter.name, bool(res.adapter.is_software))


def bench_roofline(result: dict, shape: str | None = None) -> tuple[list[Point], Ceilings | None]:
    """The roofline of a `kvviz bench --json` result: every timed row of one shape (the first one when `shape`
    is None) as a point, the ceilings measured in the same run (the bench's copy shader and FMA rows)."""
    rows = result.get("rows") if isinstance(result, dict) else None
    if not isinstance(rows, list) or not rows:
        raise InvalidInput("the file has no bench rows (expected the JSON that kvviz bench --json writes)")
    names = [r.get("shape", {}).get("name") for r in rows if isinstance(r, dict)]
    shapes = list(dict.fromkeys(n for n in names if n))
    if shape is None:
        shape = shapes[0] if shapes else None
    elif shape not in shapes:
        raise InvalidInput(f"shape {shape!r} is not in the file; it has {', '.join(shapes) or 'none'}")
    keep = [r for r in rows if r.get("shape", {}).get("name") == shape and r.get("gpu_us_median")
            and not str(r.get("kernel", "")).startswith(("copy_buffer", "fma_")) and r.get("flops") is not None]
    # (the ceilings themselves are not points; rows stating no arithmetic cannot be placed)
    seen = {}
    for r in keep:
        seen[r["kernel"]] = seen.get(r["kernel"], 0) + 1
    pts = []
    for r in keep:
        k = str(r["kernel"])
        if seen[k] > 1:  # e.g. every method's "paged_attn_f32 (over the dequantised cache)": say whose
            k = f"{k} [{r.get('method') or r.get('variant', '')}]"
        pts.append(Point(k, str(r.get("variant", "")), int(r.get("bytes_moved") or 0), float(r["flops"]),
                         float(r["gpu_us_median"])))
    c = result.get("roofline")
    ceil = None
    if isinstance(c, dict) and c.get("mem_gbps") and c.get("f32_gflops"):
        ceil = Ceilings(float(c["mem_gbps"]), float(c["f32_gflops"]),
                        float(c["f16_gflops"]) if c.get("f16_gflops") else None, str(c.get("adapter", "")),
                        bool(c.get("is_software", False)))
    return pts, ceil
