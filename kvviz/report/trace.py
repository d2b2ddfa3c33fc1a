"""Timings as a Chrome trace (JSON "traceEvents"), which opens in Perfetto and chrome://tracing.

Every timed dispatch is an event: each timed kernel has its own track (a thread, named
"kernel [variant]"), and each pass `GpuRuntime.time` ran is one complete ("X") event on it at the time
it ran on the device's timestamp clock: the warm-up passes (category "warmup", args.warmup true) and
every timed sample (category "timed"; `dur` is the sample). `ts` is microseconds after the earliest
timestamp of the run, so the tracks line up as the kernels ran one after another. A timing without
start times (made from samples only) is laid out back to back after the previous track's last event
and its events say `"placed": true`. Each kernel's summary (min/p10/median/p90, bytes moved, GB/s,
timing method, source hash) is in `otherData.kernels`.

`timeline_spans` is the same layout as plain records, for the window's timeline.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

from kvviz.tables import clean


@dataclass(frozen=True)
class Span:
    """One pass of one timed kernel on the run's timeline."""

    track: int  # index of the timing row (one track per timed kernel)
    kernel: str
    variant: str
    index: int  # sample number (timed) or warm-up pass number among those kept
    start_us: float  # after the run's earliest timestamp
    end_us: float
    warmup: bool
    placed: bool = False  # True: no start time was measured; laid out back to back

    @property
    def dur_us(self) -> float:
        return self.end_us - self.start_us


def timeline_spans(timings) -> list[Span]:
    """Every kept pass of every timing row (`.kernel`, `.variant`, `.timing`), on one clock."""
    origins = [t.timing.origin_ns for t in timings if t.timing.origin_ns is not None and t.timing.starts_us]
    origin = min(origins) if origins else 0.0
    spans: list[Span] = []
    cursor = 0.0  # where a timing without start times goes
    for track, t in enumerate(timings):
        tm = t.timing
        if tm.starts_us and tm.origin_ns is not None:
            off = (tm.origin_ns - origin) / 1e3
            for i, (a, b) in enumerate(tm.warmup_spans_us):
                spans.append(Span(track, t.kernel, t.variant, i, off + a, off + b, True))
            for i, (a, b) in enumerate(tm.spans_us):
                spans.append(Span(track, t.kernel, t.variant, i, off + a, off + b, False))
        else:
            ts = cursor
            for i, d in enumerate(tm.samples_us):
                spans.append(Span(track, t.kernel, t.variant, i, ts, ts + float(d), False, placed=True))
                ts += float(d)
        cursor = max([cursor] + [s.end_us for s in spans])
    return spans


def track_name(row) -> str:
    return f"{row.kernel} [{row.variant}]"


def chrome_trace(res) -> dict:
    adapter = res.adapter
    events = [
        {"name": "process_name", "ph": "M", "pid": 1, "tid": 0, "args": {"name": f"kvviz: {adapter.name}"}},
    ]
    for track, t in enumerate(res.timings):
        tid = track + 1
        events.append({"name": "thread_name", "ph": "M", "pid": 1, "tid": tid, "args": {"name": track_name(t)}})
        events.append({"name": "thread_sort_index", "ph": "M", "pid": 1, "tid": tid, "args": {"sort_index": tid}})
    for s in timeline_spans(res.timings):
        args = {"kernel": s.kernel, "variant": s.variant, "warmup": s.warmup,
                ("warmup_pass" if s.warmup else "sample"): s.index}
        if s.placed:
            args["placed"] = True
        events.append({
            "name": f"{s.kernel} (warm-up)" if s.warmup else s.kernel,
            "cat": "warmup" if s.warmup else "timed",
            "ph": "X",
            "ts": s.start_us,
            "dur": s.dur_us,
            "pid": 1,
            "tid": s.track + 1,
            "args": clean(args),
        })
    kernels = []
    for track, t in enumerate(res.timings):
        tm = t.timing
        kernels.append(clean({
            "track": track + 1,
            "kernel": t.kernel,
            "variant": t.variant,
            "role": getattr(t, "role", None),
            "impl": getattr(t, "impl", None),
            "timing_method": tm.method,
            "runs": len(tm.samples_us),
            "warmup_runs": tm.warmup_runs,
            "warmup_passes_shown": len(tm.warmup_spans_us),
            "min_us": tm.min_us,
            "p10_us": tm.p10_us,
            "median_us": tm.median_us,
            "p90_us": tm.p90_us,
            "bytes_moved": t.bytes_moved,
            "gbps": t.gbps,
            "pct_of_copy": t.pct_of_copy,
            "source_hash": tm.source_hash,
            "shaders": [{"name": n, "source_hash": h} for n, h in tm.kernels],
        }))
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": clean({
            "adapter": adapter.line(),
            "software_rasteriser": bool(adapter.is_software),
            "method": res.method.id,
            "config": res.config.to_json(),
            "copy_gbps": res.copy_gbps,
            "kernels": kernels,
        }),
    }


def write_chrome_trace(path, res) -> str:
    with open(path, "w") as fh:
        json.dump(chrome_trace(res), fh, indent=1, allow_nan=False)
    return str(path)
