"""Under load and faults: many computes in one window and a long live decode stay
within a stated memory bound; a lost device, a broken shader and a cancel leave the window working
and the files and history whole.

Memory is measured with kvviz.gpu.memory.snapshot(): process RSS (/proc/self/statm) and the live
wgpu buffers (wgpu-py's object tracker and wgpu-native's hub), after a garbage collection. Each load
test prints its figures (run pytest with -s to see them).
"""
from __future__ import annotations

import gc
import json
import os
import time

import numpy as np
import pytest

from kvviz.analysis.session import Results, Session, SessionConfig
from kvviz.errors import DeviceLostError, ShaderCompileError
from kvviz.gpu.memory import snapshot
from kvviz.families.registry import family_of, registry
import ui_windows  # noqa: E402
from ui_windows import WAIT, settings  # noqa: F401  (fixture: a throw-away settings file)

pytestmark = pytest.mark.gpu

MB = 2**20


def tiny_config(method: str = "int8_seed", **kw) -> SessionConfig:
    """The smallest workload every method takes: a compute is little GPU work, so the test measures the window."""
    base = dict(context_lens=(9, 5), num_heads=2, num_kv_heads=1, head_size=32, timing_runs=3, method=method)
    base.update(kw)
    return SessionConfig(**base)



def open_window(qtbot, settings, session=None, cfg=None):
    """A window on `session` (the suite's, conftest, for the tests that neither lose the device nor break its kernels),
    else on a Session of its own: the load test and the fault tests open their own device."""
    return ui_windows.open_window(qtbot, settings, session or Session(), cfg or tiny_config())


def compute(qtbot, win, cfg: SessionConfig):
    """One compute through the window's own path (workload config -> worker -> every panel)."""
    win.workload.set_config(cfg)
    with qtbot.waitSignal(win.results_ready, timeout=WAIT) as blocker:
        win.request_compute()
    qtbot.waitUntil(lambda: not win.runner.busy, timeout=WAIT)  # and the block inspector's read after it
    return blocker.args[0]


def live_results() -> int:
    return sum(1 for o in gc.get_objects() if isinstance(o, Results))


# ------------------------------------------------------------------------------------ load
def compute_order(methods: list[str]) -> tuple[list[str], int]:
    """The methods the window computes in turn, and how many of them are the warm-up before the first snapshot.

    Warm-up: every method once (every kernel compiled, every panel drawn once). Then one method of each
    implementation (a method's module: the ggml types, the two fp8 formats, the two vLLM fp8 formats share
    theirs and allocate through the same code), so that every implementation's per-compute allocations run after
    the snapshot; the last is the warm-up's last method, so the buffers the current results hold are the same at
    both snapshots."""
    impl = {m: registry()[m].__module__ for m in methods}
    last = methods[-1]
    one_each = {}
    for m in methods:
        one_each.setdefault(impl[m], m)
    after = [m for module, m in one_each.items() if module != impl[last]] + [last]
    return list(methods) + after, len(methods)


RSS_BOUND_MB = 30.0  # see test_many_computes_in_one_window


@pytest.mark.slow  # CI runs it (no marker is deselected)
def test_many_computes_in_one_window(qtbot, settings):
    """Every method in a row in one window, then one method of each implementation again (compute_order), on a tiny
    workload.

    Bounds, from the snapshot after the warm-up (every kernel compiled, every panel drawn once) to the snapshot after
    the last compute:
      * GPU buffers: no growth (+2 allowed). Every compute allocates ~20 buffers (caches, inputs,
        16 MiB copy buffers for the bandwidth line); they must all be freed with the results.
      * wgpu-native's buffers and bind groups: the same.
      * Results objects alive: at most 2 (the one on screen, one on its way), never one per compute.
      * RSS: under 30 MB of growth over the computes after the warm-up. What legitimately grows is
        the timing history and the run history's table (one entry per run) and Qt/pyqtgraph caches,
        a few tens of KB a compute. A leaked bandwidth buffer (16 MiB host staging per compute)
        or leaked panel images would blow through it within a few computes.
    """
    order, WARMUP = compute_order(list(registry()))
    N_COMPUTES = len(order)
    assert order[WARMUP - 1] == order[-1] and {registry()[m].__module__ for m in order[WARMUP:]} == \
        {cls.__module__ for cls in registry().values()}
    win = open_window(qtbot, settings, cfg=tiny_config(order[0]))
    t0 = time.perf_counter()
    warm = None
    for i in range(1, N_COMPUTES):  # the window's first compute was #0
        res = compute(qtbot, win, tiny_config(order[i]))
        assert res.method.id == order[i]
        if i == WARMUP - 1:
            del res
            warm, t_warm = snapshot(), time.perf_counter()
    del res
    end = snapshot()
    elapsed = time.perf_counter() - t0
    n_results = live_results()
    print(f"\n{N_COMPUTES} window computes: warm-up ({WARMUP}): {warm.line()}\n"
          f"                     end ({N_COMPUTES}): {end.line()}\n"
          f"                     RSS growth {end.rss_mb - warm.rss_mb:+.1f} MB, GPU buffers "
          f"{end.buffers - warm.buffers:+d}, Results alive {n_results}; {elapsed:.1f} s "
          f"({(time.perf_counter() - t_warm) / (N_COMPUTES - WARMUP):.3f} s a compute after warm-up)")
    assert len(win.timing.history) == N_COMPUTES
    assert end.buffers - warm.buffers <= 2, (warm.line(), end.line())
    assert end.buffer_bytes - warm.buffer_bytes <= 1 * MB, (warm.line(), end.line())
    assert end.native_buffers - warm.native_buffers <= 2, (warm.line(), end.line())
    assert end.bind_groups - warm.bind_groups <= 2, (warm.line(), end.line())
    assert n_results <= 2
    assert end.rss_mb - warm.rss_mb < RSS_BOUND_MB, (warm.line(), end.line())
    assert not win.banner.isVisible()
    win.close()


# 200 steps measured after the warm-up: the GPU objects may not grow at all, which a few steps show, and over 200
# steps the RSS bound below catches a host leak of some tens of KB a step (a step's logits or cache reads kept).
LIVE_TOKENS = 300
LIVE_WARMUP = 100


@pytest.fixture(scope="module")
def long_tiny(tmp_path_factory):
    from tiny_llama import write_tiny_gguf

    from kvviz.sources.gguf_llama import load_gguf_llama

    path = tmp_path_factory.mktemp("load") / "tiny-long.gguf"
    write_tiny_gguf(path, head_size=32, context_length=LIVE_TOKENS + 64)
    return load_gguf_llama(path)


@pytest.mark.slow  # CI runs it
def test_long_live_decode(long_tiny, ctx):
    """LIVE_TOKENS tokens decoded live (f32 and int8 paged caches on the GPU, the window's settings:
    distributions not kept, the cache view on), measured after 100 steps and at the end.

    Bounds: GPU buffers do not grow (+2 allowed): the pools are sized at start() for every token
    and each step's small inputs are freed with it. RSS grows by less than 10 MB over the 200 steps after the warm-up:
    what legitimately grows is O(tokens) (the runners' K/V history, 2 paths x 2 layers
    x 2 x 2 KV heads x 32 x 4 B = 2 KB a token; each LiveStep with its block tables, <= 2 KB a
    step at block size 16) - about 1.2 MB at 300 tokens. The steps keep no distributions and only the
    newest keeps its cache view: both are checked on the steps themselves (the tiny model's vocabulary
    is too small for a kept distribution to show in RSS).
    """
    from kvviz.live import LiveDecoder

    # baseline="numpy": the f32 reference runs in the runner (the int8 path's paged cache is on the GPU);
    # with the f32 GPU cache too each step costs ~1.6x as much and the test would take minutes.
    dec = LiveDecoder(long_tiny, "int8_seed", block_size=16, policy="scattered", keep_distributions=False,
                      baseline="numpy", ctx=ctx)
    dec.start([5 + (7 * i) % 200 for i in range(13)], LIVE_TOKENS)
    t0 = time.perf_counter()
    for _ in range(LIVE_WARMUP):
        dec.step()
    warm = snapshot()
    t_warm = time.perf_counter()
    while len(dec.steps) < LIVE_TOKENS and not dec.finished:
        dec.step()
    end = snapshot()
    t_end = time.perf_counter()
    n = len(dec.steps)
    print(f"\n{n}-token live decode: after {LIVE_WARMUP} steps: {warm.line()}\n"
          f"                        after {n}: {end.line()}\n"
          f"                        RSS growth {end.rss_mb - warm.rss_mb:+.1f} MB, GPU buffers "
          f"{end.buffers - warm.buffers:+d}; {t_end - t0:.1f} s ({(t_end - t_warm) / (n - LIVE_WARMUP) * 1e3:.1f} ms a step)")
    assert n == LIVE_TOKENS
    assert dec.steps[-1].context_len == 12 + LIVE_TOKENS
    assert all(np.isfinite(s.kl) for s in dec.steps)
    assert sum(s.view is not None for s in dec.steps) <= 1
    assert all(s.logp_base is None and s.logp_quant is None for s in dec.steps)
    assert end.buffers - warm.buffers <= 2, (warm.line(), end.line())
    assert end.native_buffers - warm.native_buffers <= 2, (warm.line(), end.line())
    assert end.bind_groups - warm.bind_groups <= 2, (warm.line(), end.line())
    assert end.rss_mb - warm.rss_mb < 10.0, (warm.line(), end.line())


# ------------------------------------------------------------------------------------ faults
def test_lost_device_mid_compute(qtbot, settings):
    """The device is lost in the middle of a compute (destroyed between two dispatches): the window
    stays up, the banner says the device was lost, the previous results stay on screen, and the next
    compute runs on a new device."""
    session = Session()
    win = open_window(qtbot, settings, session)
    before, old_rt = win.results, session.rt
    calls = {"n": 0}
    real_run = old_rt.run

    def run_then_lose(dispatches):
        calls["n"] += 1
        if calls["n"] == 2:  # after the f32 baseline's writer, before its decode
            old_rt.device.destroy()
        return real_run(dispatches)

    old_rt.run = run_then_lose
    with qtbot.waitSignal(win.compute_failed, timeout=WAIT) as blocker:
        win.request_compute()
    qtbot.waitUntil(lambda: not win.runner.busy, timeout=WAIT)
    assert isinstance(blocker.args[0], DeviceLostError)
    assert calls["n"] >= 2
    assert win.isVisible() and win.banner.isVisible()
    assert "device lost" in win.banner.title.text().lower()
    assert "new device" in win.banner.hint.text()
    assert win.results is before  # the last good results stay on screen
    # the next compute opens a new device and succeeds
    res = compute(qtbot, win, tiny_config("fp8_e4m3"))
    assert session.rt is not old_rt and not session.rt.lost_reason
    assert np.isfinite(res.out_q).all() and not win.banner.isVisible()
    # ... and the lost runtime is not kept alive by anything (the wgpu logger's loss watcher held it)
    import weakref

    gone = weakref.ref(old_rt)
    del old_rt, real_run, run_then_lose, before, blocker
    gc.collect()
    assert gone() is None
    # the block inspector reads the new results on the new device
    with qtbot.waitSignal(win.inspect_ready, timeout=WAIT):
        win.inspector.show_block(int(res.batch.seq_blocks[0][0]))
    win.close()


BROKEN = "int4/write.wgsl"


def test_shader_compile_error_in_one_kernel(qtbot, settings, monkeypatch):
    """One kernel's shader does not compile: its method reports a ShaderCompileError naming the file
    and the line, in the banner; a method of every other family still computes in the same window and session."""
    from kvviz.gpu.shaders import ShaderSpec

    real_source = ShaderSpec.source

    def source(self):
        src = real_source(self)
        return src + "\nfn broken_on_purpose( -> {\n" if self.path == BROKEN else src

    monkeypatch.setattr(ShaderSpec, "source", source)
    session = Session()
    win = open_window(qtbot, settings, session, tiny_config("int8_seed"))
    win.workload.set_config(tiny_config("int4_group"))
    with qtbot.waitSignal(win.compute_failed, timeout=WAIT) as blocker:
        win.request_compute()
    qtbot.waitUntil(lambda: not win.runner.busy, timeout=WAIT)
    err = blocker.args[0]
    assert isinstance(err, ShaderCompileError)
    assert BROKEN in str(err)
    import re

    assert re.search(r":\d+:\d+|line \d+", str(err)), str(err)  # where in the file
    assert BROKEN in win.banner.title.text()
    # a method of every other family (each family's kernels compile after the failed one)
    family = {}
    for k in registry():
        family.setdefault(family_of(k), k)
    others = ["int8_token" if k == "int8_seed" else k for fam, k in family.items() if fam != "int4"]
    assert len(others) == len(family) - 1 >= 8, others
    for m in others:
        res = compute(qtbot, win, tiny_config(m))
        assert res.method.id == m and np.isfinite(res.out_q).all()
    # the broken kernel was not cached: fixed, it compiles in the same session
    monkeypatch.setattr(ShaderSpec, "source", real_source)
    res = compute(qtbot, win, tiny_config("int4_group"))
    assert res.method.id == "int4_group"
    win.close()


# ------------------------------------------------------------------------------------ cancel
def _tree(path):
    out = {}
    for root, _dirs, files in os.walk(path):
        for f in files:
            p = os.path.join(root, f)
            with open(p, "rb") as fh:
                out[os.path.relpath(p, path)] = fh.read()
    return out


class _Stop(BaseException):
    """Stands for Ctrl+C / a cancel: a BaseException, so no `except Exception` swallows it."""


@pytest.fixture(scope="module")
def small_results(session):
    return session.compute(tiny_config("int8_seed"))


@pytest.mark.parametrize("stop_at", ["csv", "json", "trace"])
def test_report_cancelled_midway_leaves_nothing(small_results, tmp_path, monkeypatch, stop_at):
    """write_report interrupted after some files: a new folder is not created, an existing report
    folder keeps its old files byte for byte, no staging folder is left behind; then it completes."""
    import kvviz.report.writer as writer
    from kvviz.tables import Table

    def stop(*a, **k):
        raise _Stop()

    if stop_at == "csv":
        real = Table.write_csv
        n = {"i": 0}

        def write_csv(self, path):
            n["i"] += 1
            if n["i"] == 4:  # the 4th CSV of each report
                n["i"] = 0
                raise _Stop()
            return real(self, path)

        monkeypatch.setattr(Table, "write_csv", write_csv)
    elif stop_at == "json":
        monkeypatch.setattr(writer, "report_markdown", stop)  # after report.json is written
    else:
        monkeypatch.setattr(writer, "write_chrome_trace", stop)
    new = tmp_path / "new"
    with pytest.raises(_Stop):
        writer.write_report(str(new), small_results)
    assert not new.exists()
    old = tmp_path / "old"
    old.mkdir()
    (old / "report.json").write_text('{"old": true}')
    (old / "notes.txt").write_text("mine")
    with pytest.raises(_Stop):
        writer.write_report(str(old), small_results)
    assert _tree(old) == {"report.json": b'{"old": true}', "notes.txt": b"mine"}
    assert sorted(os.listdir(tmp_path)) == ["old"]  # no .partial staging folder left
    monkeypatch.undo()
    paths = writer.write_report(str(old), small_results)
    assert json.load(open(paths["json"]))["config"]["method"] == "int8_seed"
    assert (old / "notes.txt").read_text() == "mine"
    assert sorted(os.listdir(tmp_path)) == ["old"]


def test_window_export_cancelled_midway(qtbot, settings, session, tmp_path, monkeypatch):
    """The window's report export stopped after some panel PNGs: no folder, no leftovers; the window
    then exports the whole folder."""
    win = open_window(qtbot, settings, session)
    n = {"i": 0}
    from kvviz.ui.panels.base import Panel

    real = Panel.export_png

    def export_png(self, path):
        n["i"] += 1
        if n["i"] == 3:
            raise _Stop()
        return real(self, path)

    monkeypatch.setattr(Panel, "export_png", export_png)
    out = tmp_path / "report"
    with pytest.raises(_Stop):
        win.export_report(str(out))
    assert not out.exists() and os.listdir(tmp_path) == []
    monkeypatch.undo()
    paths = win.export_report(str(out))
    assert os.path.dirname(paths["json"]) == str(out)
    rep = json.load(open(paths["json"]))
    for key in ("window", "overview", "timing"):
        assert (out / rep["figures"][key]).exists()
    assert sorted(os.listdir(tmp_path)) == ["report"]
    win.close()


def test_cancelled_compute_adds_no_history(qtbot, settings, session, monkeypatch):
    """A compute cancelled at any of its steps (every cancel check in Session.compute, in turn),
    or cancelled after its last step but before the window took the results: no history entry,
    no new results, the previous ones stay; then a compute adds exactly one entry."""
    win = open_window(qtbot, settings, session)
    before, hist = win.results, list(win.timing.history)
    real_compute = session.compute
    checks = {"n": 0}

    def count_checks(cfg, progress=None, cancel=None):
        def c():
            checks["n"] += 1
            return cancel() if cancel else False

        return real_compute(cfg, progress, c)

    monkeypatch.setattr(session, "compute", count_checks)
    compute(qtbot, win, tiny_config())
    total = checks["n"]
    assert total >= 5
    hist = list(win.timing.history)
    before = win.results
    for k in range(1, total + 1):
        def cancel_at_k(cfg, progress=None, cancel=None, k=k):
            seen = {"n": 0}

            def c():
                seen["n"] += 1
                if seen["n"] >= k:
                    win.runner.current.cancel()  # what the Cancel button does, from inside the step
                return cancel()

            return real_compute(cfg, progress, c)

        monkeypatch.setattr(session, "compute", cancel_at_k)
        with qtbot.waitSignal(win.task_cancelled, timeout=WAIT):
            win.request_compute()
        qtbot.waitUntil(lambda: not win.runner.busy, timeout=WAIT)
        assert win.results is before, k
        assert win.timing.history == hist, k
    # cancelled after the compute returned, before the window showed it
    def cancel_after(cfg, progress=None, cancel=None):
        res = real_compute(cfg, progress, cancel)
        win.runner.current.cancel()
        return res

    monkeypatch.setattr(session, "compute", cancel_after)
    with qtbot.waitSignal(win.task_cancelled, timeout=WAIT):
        win.request_compute()
    qtbot.waitUntil(lambda: not win.runner.busy, timeout=WAIT)
    assert win.results is before and win.timing.history == hist
    monkeypatch.setattr(session, "compute", real_compute)
    compute(qtbot, win, tiny_config())
    assert len(win.timing.history) == len(hist) + 1
    win.close()
