"""Summaries of GPU timings. Timings are reported, never asserted.

A `TimingResult` keeps every timed sample and, when it came from `GpuRuntime.time`, when each pass
began and ended on the device's clock (the warm-up passes too), so a timeline can lay out every
dispatch as it ran: `origin_ns` is the device clock (GPU timestamp ticks x period; `perf_counter_ns`
for wall-clock timing) of the earliest kept timestamp, and `starts_us` / `warmup_spans_us` are
microseconds after it. Results of different `time` calls on one device share that clock.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np

# Warm-up passes whose start/end are kept (the last ones, closest to the timed runs); a time-based
# warm-up on fast hardware can run thousands of passes.
MAX_WARMUP_SPANS = 256


# Times in microseconds are kept to the picosecond: far below any timestamp clock's period, and above the
# last-bit noise of the arithmetic that makes them (ticks x period / 1000, the mean of two middle samples),
# so a median reads 26288.726, not 26288.726000000002, in a table, a CSV or a JSON file.
TIME_DECIMALS = 6


@dataclass(frozen=True)
class TimingResult:
    method: str  # "gpu-timestamps" or "wall-clock (...)": always shown next to the number
    samples_us: tuple[float, ...] = field(repr=False)
    min_us: float = 0.0
    median_us: float = 0.0
    p90_us: float = 0.0
    # When each timed sample began, in us after origin_ns (its end is start + sample); () when unknown.
    starts_us: tuple[float, ...] = field(default=(), repr=False)
    # (start, end) in us after origin_ns of the warm-up passes kept (at most MAX_WARMUP_SPANS, the
    # last ones); with wall-clock timing one span per submitted batch of warm-up passes.
    warmup_spans_us: tuple[tuple[float, float], ...] = field(default=(), repr=False)
    warmup_runs: int = 0  # warm-up passes submitted (discarded from the statistics)
    origin_ns: float | None = None  # the clock at the earliest kept timestamp (see the module doc)
    kernels: tuple[tuple[str, str | None], ...] = field(default=(), repr=False)  # (shader name, source hash)

    @classmethod
    def from_samples(cls, samples, method: str, *, starts_us=None, warmup_spans_us=(), warmup_runs: int = 0,
                     origin_ns: float | None = None, kernels=()) -> "TimingResult":
        s = np.round(np.asarray(samples, dtype=np.float64), TIME_DECIMALS)
        if starts_us is not None and len(starts_us) != len(s):
            raise ValueError(f"{len(starts_us)} start times for {len(s)} samples")
        ps = lambda x: round(float(x), TIME_DECIMALS)  # noqa: E731
        return cls(
            method=method,
            samples_us=tuple(float(x) for x in s),
            min_us=ps(s.min()),
            median_us=ps(np.median(s)),
            p90_us=ps(np.percentile(s, 90)),
            starts_us=tuple(ps(x) for x in starts_us) if starts_us is not None else (),
            warmup_spans_us=tuple((ps(a), ps(b)) for a, b in warmup_spans_us),
            warmup_runs=int(warmup_runs),
            origin_ns=None if origin_ns is None else float(origin_ns),
            kernels=tuple((str(n), h) for n, h in kernels),
        )

    @property
    def is_gpu_time(self) -> bool:
        return self.method == "gpu-timestamps"

    @property
    def p10_us(self) -> float:
        return float(np.percentile(np.asarray(self.samples_us, np.float64), 10)) if self.samples_us else float("nan")

    @property
    def spans_us(self) -> tuple[tuple[float, float], ...]:
        """(start, end) of every timed sample, us after origin_ns; () when the start times are unknown."""
        return tuple((a, a + d) for a, d in zip(self.starts_us, self.samples_us))

    @property
    def source_hash(self) -> str | None:
        """The hash of the shader source(s) timed: one kernel's own hash, a hash of the hashes for a
        pass of several kernels, None when a source is unknown (a recorded copy, torch)."""
        hashes = [h for _, h in self.kernels]
        if not hashes or any(h is None for h in hashes):
            return None
        if len(hashes) == 1:
            return hashes[0]
        return hashlib.sha256("\n".join(hashes).encode()).hexdigest()[:16]

    def gbps(self, nbytes: int) -> float:
        return nbytes / (self.median_us * 1e-6) / 1e9 if self.median_us > 0 else float("nan")

    def to_json(self) -> dict:
        return {
            "method": self.method,
            "min_us": self.min_us,
            "p10_us": self.p10_us,
            "median_us": self.median_us,
            "p90_us": self.p90_us,
            "runs": len(self.samples_us),
            "warmup_runs": self.warmup_runs,
            "source_hash": self.source_hash,
        }


def source_hash(kernel) -> str | None:
    """sha256 (16 hex digits) of a compiled kernel's shader source as its front end got it: the
    front end, the defines and the rendered source (includes resolved, WGSL defines applied). A
    kernel carrying its own `source` text (a user's shader) is hashed from that text. None when the
    source cannot be read back."""
    spec = getattr(kernel, "spec", None)
    if spec is None:
        return None
    src = getattr(kernel, "source", None)
    if not isinstance(src, str):
        try:
            src = spec.rendered()
        except Exception:  # noqa: BLE001 - a file gone since the compile: the hash is unknown, not wrong
            return None
    text = f"{spec.resolved_frontend}\n{spec.entry}\n{spec.defines!r}\n{src}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def kernel_sources(dispatches) -> tuple[tuple[str, str | None], ...]:
    """(shader name, source hash) of each distinct kernel among `dispatches`, in order."""
    out = {}
    for d in dispatches:
        k = d.kernel
        name = getattr(k, "name", str(k))
        if name not in out:
            out[name] = source_hash(k)
    return tuple(out.items())
