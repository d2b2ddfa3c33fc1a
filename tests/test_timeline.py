"""A real timeline: GpuRuntime.time keeps every pass's start and end (warm-up included) on the device's
timestamp clock and names the shaders it timed; the Chrome trace has one event per pass on a track
per kernel; the window's timeline widget draws and zooms them. Structure only: no duration is asserted.
"""
import json
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np
import pytest

from kvviz.gpu.shaders import ShaderSpec
from kvviz.gpu.timing import TimingResult, kernel_sources, source_hash
from kvviz.gpu.copy import copy_shader_dispatches, time_copy_buffer
from kvviz.report.trace import chrome_trace, timeline_spans, write_chrome_trace

pytestmark = pytest.mark.gpu


def _no_constants(name):
    raise ValueError(f"not strict JSON: {name}")


@dataclass
class Row:  # what the trace and the widget read of a kvviz.analysis.session.TimingRow
    kernel: str
    variant: str
    timing: TimingResult
    bytes_moved: int = 1 << 20
    copy_gbps: float = 1.0
    role: str = "other"
    impl: str = "baseline"

    @property
    def gbps(self):
        return self.timing.gbps(self.bytes_moved)

    @property
    def pct_of_copy(self):
        return 100.0 * self.gbps / self.copy_gbps


@pytest.fixture(scope="module")
def timed(rt):
    """Two kernels timed one after the other on the adapter, and one timing made from samples only."""
    d, _ = copy_shader_dispatches(rt, 1 << 20)
    a = rt.time(d, runs=5, warmup=3)
    b, _ = time_copy_buffer(rt, 1 << 20, runs=4, warmup=2)
    c = TimingResult.from_samples([10.0, 12.0, 11.0], "cuda-events")  # no start times (torch's rows)
    return d, [Row("copy_shader", "wgsl vec4", a), Row("copy_buffer", "copy_buffer_to_buffer", b),
               Row("torch_sdpa", "bf16", c)]


def test_time_keeps_every_pass_on_the_device_clock(rt, timed):
    d, rows = timed
    a, b = rows[0].timing, rows[1].timing
    assert a.method == b.method == ("gpu-timestamps" if rt.has_timestamps else a.method)
    assert len(a.starts_us) == len(a.samples_us) == 5 and len(b.starts_us) == 4
    # lavapipe has no clocks to warm: exactly the asked-for warm-up passes, each timestamped
    if rt.summary.is_software:
        assert a.warmup_runs == len(a.warmup_spans_us) == 3 and b.warmup_runs == len(b.warmup_spans_us) == 2
    for t in (a, b):
        spans = t.spans_us
        assert [e - s for s, e in spans] == pytest.approx(list(t.samples_us))
        assert min([s for s, _ in spans] + [s for s, _ in t.warmup_spans_us]) == 0.0  # the origin is the first stamp
        assert all(s <= e for s, e in t.warmup_spans_us)
        # the warm-up was waited for before the timed passes were submitted; passes start in order
        assert max(e for _, e in t.warmup_spans_us) <= min(s for s, _ in spans)
        assert list(t.starts_us) == sorted(t.starts_us)
    # one clock for the device: b was timed after a returned
    assert b.origin_ns > a.origin_ns + a.spans_us[-1][1] * 1e3
    # what was timed: the copy shader with its source hash; a recorded copy names no shader
    assert a.kernels == kernel_sources(d) == ((d[0].kernel.name, source_hash(d[0].kernel)),)
    assert a.source_hash == source_hash(d[0].kernel) and len(a.source_hash) == 16
    assert b.kernels == () and b.source_hash is None


def test_the_public_timing_api_is_unchanged(rt):
    d, _ = copy_shader_dispatches(rt, 1 << 16)
    t = rt.time(d, 3)  # positional runs, as before
    assert len(t.samples_us) == 3 and t.min_us <= t.median_us <= t.p90_us
    assert t.p10_us <= t.median_us
    old = TimingResult.from_samples([3.0, 1.0, 2.0], "gpu-timestamps")
    assert (old.min_us, old.median_us, old.starts_us, old.origin_ns, old.source_hash) == (1.0, 2.0, (), None, None)
    assert json.loads(json.dumps(t.to_json(), allow_nan=False))["runs"] == 3
    with pytest.raises(ValueError, match="start times"):
        TimingResult.from_samples([1.0, 2.0], "gpu-timestamps", starts_us=[0.0])


def test_source_hash_is_the_source_as_compiled():
    def k(path, defines=(), frontend="", source=None):
        return SimpleNamespace(name=path, spec=ShaderSpec(path, "main", frontend, defines), source=source)

    base = source_hash(k("attention/paged_attn_weights.comp"))
    assert base == source_hash(k("attention/paged_attn_weights.comp"))  # stable
    assert base != source_hash(k("attention/paged_attn_weights.comp", (("KV_Q8", "1"),)))  # defines count
    assert base != source_hash(k("attention/paged_attn_weights.comp", frontend="naga-glsl"))  # front end counts
    assert base != source_hash(k("attention/paged_attn_f32.comp"))
    # a kernel carrying its own text (a user's shader) is hashed from that text
    assert source_hash(k("x.wgsl", source="fn a() {}")) != source_hash(k("x.wgsl", source="fn b() {}"))
    assert source_hash(k("no/such/file.wgsl")) is None


def test_trace_has_one_event_per_pass(timed, tmp_path):
    _, rows = timed
    res = SimpleNamespace(adapter=SimpleNamespace(name="test", is_software=True, line=lambda: "test adapter"),
                          method=SimpleNamespace(id="int8"), config=SimpleNamespace(to_json=lambda: {"k": 1}),
                          copy_gbps=float("nan"), timings=rows)
    p = write_chrome_trace(tmp_path / "trace.json", res)
    tr = json.loads(open(p).read(), parse_constant=_no_constants)  # strict JSON (the NaN copy_gbps is null)
    assert tr["otherData"]["copy_gbps"] is None
    xs = [e for e in tr["traceEvents"] if e["ph"] == "X"]
    timed_ev = [e for e in xs if e["cat"] == "timed"]
    warm_ev = [e for e in xs if e["cat"] == "warmup"]
    assert len(timed_ev) == sum(len(r.timing.samples_us) for r in rows)  # one event per sample
    assert len(warm_ev) == sum(len(r.timing.warmup_spans_us) for r in rows)  # warm-up marked
    assert all(e["args"]["warmup"] for e in warm_ev) and not any(e["args"]["warmup"] for e in timed_ev)
    assert all(e["name"].endswith("(warm-up)") for e in warm_ev)
    names = {e["tid"]: e["args"]["name"] for e in tr["traceEvents"] if e["name"] == "thread_name"}
    assert names == {i + 1: f"{r.kernel} [{r.variant}]" for i, r in enumerate(rows)}  # a track per kernel
    for i, r in enumerate(rows):
        mine = [e for e in timed_ev if e["tid"] == i + 1]
        assert [e["dur"] for e in mine] == pytest.approx(list(r.timing.samples_us))
        assert [e["args"]["sample"] for e in mine] == list(range(len(r.timing.samples_us)))
    assert min(e["ts"] for e in xs) == 0.0
    # the tracks follow one another on the device clock; a timing without start times comes after, marked
    end = {i: max(e["ts"] + e["dur"] for e in xs if e["tid"] == i) for i in (1, 2, 3)}
    start = {i: min(e["ts"] for e in xs if e["tid"] == i) for i in (1, 2, 3)}
    assert start[2] > end[1] and start[3] >= end[2]
    assert all(e["args"].get("placed") for e in xs if e["tid"] == 3)
    assert not any(e["args"].get("placed") for e in xs if e["tid"] != 3)
    ks = tr["otherData"]["kernels"]
    assert [k["kernel"] for k in ks] == [r.kernel for r in rows]
    assert ks[0]["source_hash"] == rows[0].timing.source_hash and ks[1]["source_hash"] is None
    assert chrome_trace(res)["traceEvents"] == tr["traceEvents"]


def test_timeline_widget_draws_and_zooms(qtbot, timed):
    from kvviz.ui.widgets.timeline import TimelineWidget

    _, rows = timed
    w = TimelineWidget()
    qtbot.addWidget(w)
    w.resize(900, 300)
    w.show()
    w.set_timings(rows)
    spans = timeline_spans(rows)
    n_timed = sum(len(r.timing.samples_us) for r in rows)
    n_warm = sum(len(r.timing.warmup_spans_us) for r in rows)
    assert len(w.timed_bars.opts["x0"]) == n_timed and len(w.warm_bars.opts["x0"]) == n_warm
    np.testing.assert_allclose(w.timed_bars.opts["width"], [s.dur_us for s in spans if not s.warmup])
    assert f"{n_timed} timed passes and {n_warm} warm-up passes of 3 kernels" in w.summary.text()
    lo, hi = w.x_range()
    assert lo <= 0.0 and hi >= max(s.end_us for s in spans)
    w.zoom(4.0)
    zlo, zhi = w.x_range()
    assert (zhi - zlo) == pytest.approx((hi - lo) / 4.0, rel=1e-6)
    w.fit()
    assert w.x_range() == pytest.approx((lo, hi))
    s = next(s for s in spans if not s.warmup and s.track == 1)
    assert w.span_at((s.start_us + s.end_us) / 2, 1.0) == s
    assert w.span_at((s.start_us + s.end_us) / 2, 1.5) is None  # between tracks
    assert f"sample {s.index}" in w.describe(s)
    w.set_timings(rows[:1])  # a new run replaces the old bars
    assert len(w.timed_bars.opts["x0"]) == len(rows[0].timing.samples_us)


def test_hardware_warmup_batches_its_passes(rt, monkeypatch):
    """On a hardware adapter the warm-up runs for its wall time in growing batches (an idle GPU between tiny
    submits never reaches its clocks: the first fast decode of a process read 2.5x slow on an H200). Driven here
    by treating lavapipe as hardware: the warm-up passes must outnumber the asked-for 3 and be a doubling series."""
    import dataclasses

    from kvviz.gpu.runtime import WARMUP_BATCH_MAX

    monkeypatch.setattr(rt, "summary", dataclasses.replace(rt.summary, is_software=False))
    d, _ = copy_shader_dispatches(rt, 1 << 12)
    real = rt.queue
    submits = []

    class Queue:  # counts the submits of the timing call, forwards everything
        def submit(self, bufs):
            submits.append(len(bufs))
            return real.submit(bufs)

        def __getattr__(self, name):
            return getattr(real, name)

    monkeypatch.setattr(rt, "queue", Queue())
    t = rt.time(d, runs=3, warmup=3, warmup_ms=60.0)
    assert t.warmup_runs >= 9
    # batched: many passes a submit (3 passes and a wait a submit before, i.e. 1.5 passes per submit counting reads)
    assert t.warmup_runs >= 4 * len(submits), (t.warmup_runs, len(submits))
    assert WARMUP_BATCH_MAX * 2 <= 4096  # the warm-up query set fits wgpu's query-set limit
    assert len(t.samples_us) == 3 and all(s <= e for s, e in t.warmup_spans_us)
