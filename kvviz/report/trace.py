"""Timings as a Chrome trace (JSON "traceEvents"), which opens in Perfetto and chrome://tracing.

One complete ("X") event per timed kernel, laid out one after another on a single track: `ts` is the
sum of the previous events' durations, `dur` the kernel's median time, both in microseconds. The
event's args carry min/median/p90, every sample, bytes moved, GB/s and the timing method.
"""
from __future__ import annotations

import json

from kvviz.report.tables import clean


def chrome_trace(res, gap_us: float = 0.0) -> dict:
    adapter = res.adapter
    events = [
        {"name": "process_name", "ph": "M", "pid": 1, "tid": 0,
         "args": {"name": f"kvviz: {adapter.name}"}},
        {"name": "thread_name", "ph": "M", "pid": 1, "tid": 1,
         "args": {"name": f"kernels (median of runs, {res.timings[0].timing.method if res.timings else ''})"}},
    ]
    ts = 0.0
    for t in res.timings:
        dur = float(t.timing.median_us)
        events.append({
            "name": t.kernel,
            "cat": t.variant,
            "ph": "X",
            "ts": ts,
            "dur": dur,
            "pid": 1,
            "tid": 1,
            "args": clean({
                "variant": t.variant,
                "median_us": t.timing.median_us,
                "min_us": t.timing.min_us,
                "p90_us": t.timing.p90_us,
                "samples_us": list(t.timing.samples_us),
                "bytes_moved": t.bytes_moved,
                "gbps": t.gbps,
                "pct_of_copy": t.pct_of_copy,
                "timing_method": t.timing.method,
            }),
        })
        ts += dur + gap_us
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": clean({
            "adapter": adapter.line(),
            "software_rasteriser": bool(adapter.is_software),
            "method": res.method.id,
            "config": res.config.to_json(),
            "copy_gbps": res.copy_gbps,
        }),
    }


def write_chrome_trace(path, res) -> str:
    with open(path, "w") as fh:
        json.dump(chrome_trace(res), fh, indent=1, allow_nan=False)
    return str(path)
