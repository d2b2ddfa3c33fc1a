"""What a method hands the timing panel, `kvviz bench`, the sweep and the report: one record per timed
kernel, with what it moves and what it is (its role in the method, which implementation).

`impl` says which implementation a row is so rows of one method can be shown side by side:
  "seed"       a seed kernel as given, unchanged (the reference users compare against);
  "first-wave" kvviz's first straightforward kernel (a dequantise pass + the f32 decode, a scalar writer);
  "fast"       the flash-decoding / subgroup kernels (kvviz/attention/split_decode.py and the fast writers);
  "baseline"   the f32 / f16 unquantised paths.
"""
from __future__ import annotations

from dataclasses import dataclass, field

ROLES = ("writer", "decode", "prefill", "dequantise", "weights", "rotate", "reduce", "other")
IMPLS = ("seed", "first-wave", "fast", "baseline")


@dataclass(frozen=True)
class TimedKernel:
    name: str  # shown in tables: "int8_token writer", "paged_attn_q8"
    dispatches: list = field(repr=False)  # kvviz.gpu.runtime.Dispatch, replayed by GpuRuntime.time
    bytes: int  # unique bytes the kernel must move (reads + writes), for GB/s and % of copy
    role: str = "other"
    impl: str = "first-wave"
    flops: float = 0.0  # arithmetic (FMA = 2) for the roofline; 0 when not stated

    def __post_init__(self):
        if self.role not in ROLES:
            raise ValueError(f"TimedKernel {self.name!r}: role {self.role!r} not in {ROLES}")
        if self.impl not in IMPLS:
            raise ValueError(f"TimedKernel {self.name!r}: impl {self.impl!r} not in {IMPLS}")


def checked(items, owner: str) -> list[TimedKernel]:
    """`items` as a list of TimedKernel; a TypeError naming the owner for anything else (a method that
    still returns (name, dispatches, bytes) tuples)."""
    out = list(items)
    for it in out:
        if not isinstance(it, TimedKernel):
            raise TypeError(f"{owner}.timed_kernels must return kvviz.gpu.timed.TimedKernel records, got {it!r:.80}")
    return out


def decode_kernels(rows: list[TimedKernel]) -> tuple[list[TimedKernel], list[TimedKernel], str]:
    """What a method's decode costs, from its timed kernels: the fast decode rows where the method has them
    (plus a rotate row of another implementation, e.g. TurboQuant's query rotation), else every decode /
    rotate / reduce row; and, for a method without a fast decode, its dequantise rows apart. Returns
    (decode rows, dequantise rows, impl)."""
    dec = [r for r in rows if r.role in ("decode", "rotate", "reduce")]
    fast = [r for r in dec if r.impl == "fast"]
    pick = fast + [r for r in dec if r.role == "rotate" and r.impl != "fast"] if fast else dec
    impl = "fast" if fast else ",".join(sorted({r.impl for r in dec}))
    deq = [] if fast else [r for r in rows if r.role == "dequantise"]
    return pick, deq, impl


def decode_time(rt, rows: list[TimedKernel], runs: int = 10, warmup_ms: float = 50.0) -> dict:
    """GPU-timestamp medians of a method's decode (decode_kernels): decode_us (the decode kernels summed),
    dequant_us (a first-wave method's dequantise pass, None otherwise), the kernels' names and impl."""
    pick, deq, impl = decode_kernels(rows)
    times = [rt.time(r.dispatches, runs, 2, warmup_ms=warmup_ms) for r in pick]
    deq_us = sum(rt.time(r.dispatches, runs, 2, warmup_ms=warmup_ms).median_us for r in deq) if deq else None
    return {"decode_us": float(sum(t.median_us for t in times)) if times else None, "dequant_us": deq_us,
            "kernels": [r.name for r in pick], "impl": impl, "timing": times[0].method if times else "none"}
