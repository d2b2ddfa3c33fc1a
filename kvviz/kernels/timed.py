"""What a method hands the timing panel, `kvviz bench`, the sweep and the report: one record per timed
kernel, with what it moves and what it is (its role in the method, which implementation).

`impl` says which implementation a row is so rows of one method can be shown side by side:
  "seed"       a kernel as given in ../shared/seeds (the reference users compare against);
  "first-wave" kvviz's first straightforward kernel (a dequantise pass + the f32 decode, a scalar writer);
  "fast"       the flash-decoding / subgroup kernels (kvviz/kernels/fast_decode.py and the fast writers);
  "baseline"   the f32 / f16 unquantised paths.
"""
from __future__ import annotations

from dataclasses import dataclass, field

ROLES = ("writer", "decode", "dequantise", "weights", "rotate", "reduce", "other")
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
            raise TypeError(f"{owner}.timed_kernels must return kvviz.kernels.timed.TimedKernel records, got {it!r:.80}")
    return out
