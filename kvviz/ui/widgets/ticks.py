"""Axis ticks for pyqtgraph's log axes (positions in log10), shared by the timing and history plots."""
from __future__ import annotations

import math


def log_ticks(values) -> list:
    """Ticks for a pyqtgraph log axis (positions in log10): 1-2-5 steps over the values' range."""
    v = [float(x) for x in values if x and x > 0 and math.isfinite(x)]
    if not v:
        return None
    lo, hi = math.floor(math.log10(min(v))), math.ceil(math.log10(max(v)))
    major = []
    for e in range(lo, hi + 1):
        for m in ((1, 2, 5) if hi - lo <= 3 else (1,)):
            x = m * 10.0 ** e
            if min(v) / 2.5 <= x <= max(v) * 2.5:
                major.append((math.log10(x), f"{x:g}"))
    return [major, []]


def bandwidth_ticks(lo: float, hi: float) -> list:
    """Decade ticks between log10 positions lo and hi, all labelled as plain numbers (no 10^n mix)."""
    major = [(float(e), f"{10.0 ** e:g}") for e in range(math.ceil(lo), math.floor(hi) + 1)]
    minor = [(math.log10(m * 10.0 ** e), "") for e in range(math.floor(lo), math.ceil(hi) + 1) for m in range(2, 10)
             if lo <= math.log10(m * 10.0 ** e) <= hi]
    return [major, minor]
