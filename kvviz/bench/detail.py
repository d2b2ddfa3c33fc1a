"""One timed kernel in detail (Qt-free): how it was dispatched, what it moved and computed, where it sits
on the roofline and against the timing floor, and what bounds it.

`kernel_detail(res, key)` reads one timing row of a `Results` ("kernel [variant]", as the timing table
names it): its dispatches' grids, workgroup sizes and workgroup memory (from the shader source, as the
Kernel lab reads it), its unique bytes and FLOPs (kvviz.bench.roofline.row_flops), its rates, the device's
ceilings measured in the same process (the shader copy's bandwidth; the FMA peak once measured), and the
timing floor (a near-empty dispatch in its own pass). The verdict says what bounds the kernel:

- **fixed cost**: its median is within FIXED_COST_FACTOR x the timing floor, so launching and
  synchronising a pass, not its work, is most of its time;
- **bandwidth**: it moves at least BOUND_SHARE of the shader copy's bandwidth (the memory roof);
- **instructions**: neither, or it reaches BOUND_SHARE of the FMA peak: its time goes to executing
  instructions (arithmetic, address and dequantisation work, reductions, waiting on latency) rather than
  to bytes it cannot move faster.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from kvviz.bench.roofline import Ceilings, row_flops
from kvviz.lab.slots import slots
from kvviz.lab.source import workgroup_bytes, workgroup_size
from kvviz.tables import series_name

FIXED_COST_FACTOR = 2.0  # a median within 2x the timing floor is mostly the floor
BOUND_SHARE = 0.5  # half the copy's bandwidth (or the FMA peak) counts as reaching that roof

BANDWIDTH, INSTRUCTIONS, FIXED_COST = "bandwidth", "instructions", "fixed cost"


@dataclass(frozen=True)
class DispatchDetail:
    kernel: str
    grid: tuple  # workgroups per dimension
    workgroup_size: tuple  # invocations per workgroup per dimension (0: a named constant not evaluated)
    workgroup_bytes: int  # workgroup memory the shader declares

    @property
    def workgroups(self) -> int:
        return int(math.prod(self.grid))

    @property
    def invocations(self) -> int | None:
        return self.workgroups * math.prod(self.workgroup_size) if all(self.workgroup_size) else None


@dataclass
class KernelDetail:
    key: str
    kernel: str
    variant: str
    impl: str
    role: str
    dispatches: list = field(default_factory=list)  # DispatchDetail
    bytes: int = 0
    flops: float = 0.0
    median_us: float = float("nan")
    min_us: float = float("nan")
    p90_us: float = float("nan")
    timing_method: str = ""
    gbps: float = float("nan")
    copy_gbps: float = float("nan")
    gflops: float = float("nan")
    intensity: float = float("nan")  # FLOP per unique byte
    floor_us: float = float("nan")
    ceilings: Ceilings | None = None
    verdict: str = ""
    why: str = ""
    lab_slot: str | None = None  # the Kernel lab slot whose built-in this kernel is, if any

    @property
    def share_of_copy(self) -> float:
        return self.gbps / self.copy_gbps if self.copy_gbps and self.copy_gbps > 0 else float("nan")

    @property
    def share_of_fma(self) -> float:
        c = self.ceilings
        return self.gflops / c.f32_gflops if c is not None and c.f32_gflops > 0 else float("nan")

    @property
    def times_floor(self) -> float:
        return self.median_us / self.floor_us if self.floor_us and self.floor_us > 0 else float("nan")

    @property
    def attainable_gflops(self) -> float:
        c = self.ceilings
        return c.attainable(self.intensity) if c is not None and math.isfinite(self.intensity) else float("nan")

    @property
    def roof_side(self) -> str:
        """Which roof lies above the kernel at its intensity: "bandwidth" left of the ridge, "compute" right."""
        c = self.ceilings
        if c is None or not math.isfinite(self.intensity):
            return "-"
        return "bandwidth" if self.intensity < c.ridge else "compute"

    def to_json(self) -> dict:
        return {"key": self.key, "kernel": self.kernel, "variant": self.variant, "impl": self.impl, "role": self.role,
                "dispatches": [{"kernel": d.kernel, "grid": list(d.grid), "workgroup_size": list(d.workgroup_size),
                                "workgroup_bytes": d.workgroup_bytes} for d in self.dispatches],
                "bytes": self.bytes, "flops": self.flops, "median_us": self.median_us, "gbps": self.gbps,
                "copy_gbps": self.copy_gbps, "gflops": self.gflops, "intensity": self.intensity,
                "floor_us": self.floor_us, "attainable_gflops": self.attainable_gflops, "verdict": self.verdict,
                "why": self.why, "lab_slot": self.lab_slot}


def lab_slot(kernel: str) -> str | None:
    """The Kernel lab slot whose built-in is timed as `kernel` (its partition count aside), if there is one."""
    names = (str(kernel), series_name(kernel))
    return next((sid for sid, s in slots().items() if s.timed_name and s.timed_name in names), None)


def _dispatch(name: str, grid, kernel) -> DispatchDetail:
    spec = getattr(kernel, "spec", None)
    size, mem = (0, 0, 0), 0
    src = getattr(kernel, "source", None)
    try:
        if not isinstance(src, str) and spec is not None:
            src = spec.rendered()
        if isinstance(src, str):
            lang = spec.language if spec is not None else "wgsl"
            size, mem = workgroup_size(src, lang), workgroup_bytes(src, lang)
    except Exception:  # noqa: BLE001 - a source that cannot be read back: its sizes are unknown, not wrong
        pass
    return DispatchDetail(name, tuple(int(g) for g in grid), tuple(size), int(mem))


def verdict(median_us: float, floor_us: float, share_of_copy: float, share_of_fma: float) -> tuple[str, str]:
    """(verdict, why) from the kernel's median against the timing floor and its shares of the two roofs."""
    if math.isfinite(floor_us) and floor_us > 0 and median_us <= FIXED_COST_FACTOR * floor_us:
        return FIXED_COST, (f"its median is {median_us / floor_us:.1f}x the timing floor (a near-empty dispatch in its "
                            "own pass): launching and synchronising the pass, not its work, is most of its time")
    if math.isfinite(share_of_copy) and share_of_copy >= BOUND_SHARE:
        return BANDWIDTH, (f"it moves {100 * share_of_copy:.0f}% of the shader copy's bandwidth: the memory system "
                           "is its limit")
    if math.isfinite(share_of_fma) and share_of_fma >= BOUND_SHARE:
        return INSTRUCTIONS, f"it reaches {100 * share_of_fma:.0f}% of the f32 FMA peak: arithmetic is its limit"
    fma = f" and {100 * share_of_fma:.1f}% of the FMA peak" if math.isfinite(share_of_fma) else ""
    return INSTRUCTIONS, (f"it moves {100 * share_of_copy:.1f}% of the copy's bandwidth{fma}: neither roof is near, so "
                          "its time goes to executing instructions (address and dequantisation work, reductions, "
                          "latency), not to bytes or FLOPs")


def kernel_detail(res, key: str, ceilings: Ceilings | None = None) -> KernelDetail | None:
    """The detail of the timing row `key` ("kernel [variant]") of `res`; None when it has no such row.
    `ceilings`: the device's (default res.roofline_ceilings, set once the window measured the FMA peak)."""
    row = next((t for t in res.timings if f"{t.kernel} [{t.variant}]" == key), None)
    if row is None:
        return None
    c = ceilings if ceilings is not None else getattr(res, "roofline_ceilings", None)
    tm = row.timing
    flops = float(row_flops(row, res))
    med = float(tm.median_us)
    gbps = float(row.gbps)
    gflops = flops / (med * 1e3) if med > 0 else float("nan")
    d = KernelDetail(
        key=key, kernel=row.kernel, variant=row.variant, impl=getattr(row, "impl", ""), role=getattr(row, "role", ""),
        dispatches=[_dispatch(n, g, k) for n, g, k in getattr(row, "dispatches", ())],
        bytes=int(row.bytes_moved), flops=flops, median_us=med, min_us=float(tm.min_us), p90_us=float(tm.p90_us),
        timing_method=tm.method, gbps=gbps, copy_gbps=float(res.copy_gbps), gflops=gflops,
        intensity=flops / row.bytes_moved if row.bytes_moved > 0 else float("nan"),
        floor_us=float(getattr(res, "timing_floor_us", float("nan"))), ceilings=c)
    d.verdict, d.why = verdict(med, d.floor_us, d.share_of_copy, d.share_of_fma)
    d.lab_slot = lab_slot(row.kernel)
    return d
