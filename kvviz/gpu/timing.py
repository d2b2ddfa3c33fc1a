"""Summaries of GPU timings. Timings are reported, never asserted."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class TimingResult:
    method: str  # "gpu-timestamps" or "wall-clock (...)": always shown next to the number
    samples_us: tuple[float, ...] = field(repr=False)
    min_us: float = 0.0
    median_us: float = 0.0
    p90_us: float = 0.0

    @classmethod
    def from_samples(cls, samples, method: str) -> "TimingResult":
        s = np.asarray(samples, dtype=np.float64)
        return cls(
            method=method,
            samples_us=tuple(float(x) for x in s),
            min_us=float(s.min()),
            median_us=float(np.median(s)),
            p90_us=float(np.percentile(s, 90)),
        )

    @property
    def is_gpu_time(self) -> bool:
        return self.method == "gpu-timestamps"

    def gbps(self, nbytes: int) -> float:
        return nbytes / (self.median_us * 1e-6) / 1e9 if self.median_us > 0 else float("nan")

    def to_json(self) -> dict:
        return {
            "method": self.method,
            "min_us": self.min_us,
            "median_us": self.median_us,
            "p90_us": self.p90_us,
            "runs": len(self.samples_us),
        }
