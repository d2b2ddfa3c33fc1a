"""The desktop window (pytest-qt, offscreen): panels hold the real numbers of a compute, controls
recompute through the worker, errors show in the window, cancel works, exports match the panels.

GPU work is kept small: 3 short sequences, 4/2 heads of 64, 3 timing runs.
"""
import json
import os
import xml.etree.ElementTree as ET

import numpy as np
import pytest

from PySide6.QtCore import QPointF, QSettings, Qt  # noqa: E402
from PySide6.QtGui import QImage, QKeySequence  # noqa: E402

from kvviz.analysis.session import SessionConfig  # noqa: E402
from ui_windows import WAIT, _module_window, open_window, settings, shared_window, small_config, window  # noqa: E402,F401  (fixtures)

pytestmark = pytest.mark.gpu


# --------------------------------------------------------------------------------- opening
def test_opens_with_every_panel_holding_data(window):  # a fresh window: one compute, its first block inspected
    w = window
    res = w.results
    b = res.batch
    assert res.config.context_lens == (40, 17, 70)

    # cache layout: one cell per physical block, block table cells = physical block ids
    cl = w.cache_layout
    assert len(cl.pool) == b.num_blocks
    assert cl.image.image.shape[0] * cl.image.image.shape[1] > 0
    assert cl.table.rowCount() == b.num_seqs
    for s in range(b.num_seqs):
        assert cl.table.item(s, 0).text() == str(int(b.context_lens[s]))
        for i, blk in enumerate(b.seq_blocks[s]):
            assert cl.table.item(s, i + 1).text() == str(int(blk))
    owner = b.block_owner()
    assert [r[3] for r in cl.pool.rows] == owner.tolist()
    assert [r[5] for r in cl.pool.rows] == b.block_fill().tolist()

    # scales: per-token scales of sequence 0, KV head 0 in position order
    x, y = w.scales.k_curve.getData()
    rows = b.token_rows(0)
    assert len(x) == int(b.context_lens[0])
    np.testing.assert_allclose(y, np.asarray(res.qkv.k_scales)[rows, 0], rtol=1e-6)
    _, yv = w.scales.v_curve.getData()
    np.testing.assert_allclose(yv, np.asarray(res.qkv.v_scales)[rows, 0], rtol=1e-6)
    assert w.scales.k_img.image.dtype == np.uint8
    assert w.scales.k_img.image.shape == (b.num_seqs * res.key.shape[1], res.key.shape[2])
    assert w.scales.k_img.image.max() == 255

    # code histogram: bar heights are the code counts
    np.testing.assert_array_equal(np.asarray(w.codes.k_bars.opts["height"]), 0 + w.codes.hist.column("k_count"))
    assert int(np.sum(w.codes.k_bars.opts["height"])) == int(res.k_stats.counts.sum())
    assert int(np.sum(w.codes.v_bars.opts["height"])) == int(res.v_stats.counts.sum())
    first = next(iter(res.k_stats.stats.values()))
    assert w.codes.table.item(0, 0).text() == first.text()

    # attention: f32 and quantised weights of (seq 0, head 0), every head in the table
    x, y = w.attention.ref_curve.getData()
    n = int(b.context_lens[0])
    np.testing.assert_allclose(10 ** y if w.attention.log_w.isChecked() else y,
                               np.maximum(res.w_ref[0, 0, :n], 1e-12), rtol=1e-5)
    _, yd = w.attention.d_curve.getData()
    np.testing.assert_allclose(yd, res.w_q[0, 0, :n].astype(np.float64) - res.w_ref[0, 0, :n], atol=1e-7)
    S, H = res.metrics.kl.shape
    assert w.attention.table.rowCount() == S * H
    assert float(w.attention.table.item(1, 3).text()) == pytest.approx(res.metrics.kl[0, 1], rel=1e-3)

    # timing: one table row and one bar per timed kernel
    t = w.timing
    assert t.table.rowCount() == len(res.timings)
    for i, row in enumerate(res.timings):
        assert t.table.item(i, 0).text() == row.kernel
        assert t.table.item(i, 1).text().startswith(f"{row.timing.median_us:,.1f}")
    assert len(t.bars.opts["x1"]) == len(res.timings)
    assert len(t.history) == 1

    # overview cards and the status bar
    assert w.overview.cards["kl_mean"].value.text() == f"{res.metrics.kl.mean():.3g}"
    assert res.adapter.name in w.adapter_label.text()
    assert w.software_label.isVisibleTo(w) == bool(res.adapter.is_software)
    if res.adapter.is_software:
        assert "lavapipe: CPU timings, not GPU" in w.software_label.text()
        assert w.timing.warn.isVisibleTo(w)
    assert not w.banner.isVisible()

    # the block inspector already shows the first block of sequence 0
    assert w.inspector.shown == (int(b.seq_blocks[0][0]), 0, "K")
    assert len(w.inspector.records) == b.block_size


def test_methods_listed_from_registry(shared_window):
    from kvviz.families.registry import registry

    keys = [shared_window.workload.method.itemData(i) for i in range(shared_window.workload.method.count())]
    assert set(registry()) <= set(keys)


# ---------------------------------------------------------------------------- recompute
def test_changing_a_control_recomputes_in_the_worker(qtbot, window):
    w = window
    first = w.results
    with qtbot.waitSignal(w.results_ready, timeout=WAIT) as blocker:
        w.workload.num_heads.setValue(8)  # debounced, then computed in the worker thread
    res = blocker.args[0]
    assert res is w.results and res is not first
    assert res.config.num_heads == 8
    assert w.attention.table.rowCount() == res.batch.num_seqs * 8
    assert len(w.timing.history) == 2
    assert len(w.timing.hist_tab) == sum(len(e["medians"]) for e in w.timing.history)
    # automatic recomputes are not kept in the run history on disk (a fresh one per test); a Run (F5) is, with its
    # results, and selected and plotted
    hv = w.timing.history_view
    assert hv.run_list == [] and w.timing.run_id is None
    with qtbot.waitSignal(w.results_ready, timeout=WAIT):
        w.act_run.trigger()
    res = w.results
    assert [r.id for r in hv.run_list] == [w.timing.run_id] and hv.run_list[0].kind == "run"
    assert hv.run_list[0].snapshot and hv.runs_table.rowCount() == 1 and hv.selected_run() == w.timing.run_id
    # the plot of a hidden History tab is drawn when the tab is shown, with the newest run's kernels
    w.timing.tabs.setCurrentWidget(hv)
    qtbot.waitUntil(lambda: len(hv.curves) == len(res.timings), timeout=WAIT)
    assert hv.plot.getPlotItem().listDataItems()


def test_pinned_baseline_delta(qtbot, shared_window):
    w = shared_window
    w.timing.pin_current()
    pinned = {r.kernel: r.timing.median_us for r in w.results.timings}
    with qtbot.waitSignal(w.results_ready, timeout=WAIT):
        w.request_compute()
    res = w.results
    for i, row in enumerate(res.timings):
        want = 100.0 * (row.timing.median_us - pinned[row.kernel]) / pinned[row.kernel]
        assert w.timing.timing_tab.rows[i][-1] == pytest.approx(want)
        assert w.timing.table.item(i, 2).text() == f"{want:+.1f}%"
    w.timing.unpin()
    assert w.timing.table.item(0, 2).text() == ""


def test_context_lengths_edit_recomputes(qtbot, shared_window):
    w = shared_window
    with qtbot.waitSignal(w.results_ready, timeout=WAIT):
        w.workload.context_lens.setText("33, 9")
        w.workload.context_lens.textEdited.emit("33, 9")
    assert [int(x) for x in w.results.batch.context_lens] == [33, 9]
    assert w.cache_layout.table.rowCount() == 2


def test_new_request_cancels_the_old(qtbot, shared_window):
    w = shared_window
    w.workload.set_config(small_config(context_lens=(400, 300), timing_runs=5))
    w.request_compute()
    w.workload.set_config(small_config(context_lens=(21, 5)))
    with qtbot.waitSignal(w.results_ready, timeout=WAIT) as blocker:
        w.request_compute()
    qtbot.waitUntil(lambda: not w.runner.busy, timeout=WAIT)
    assert [int(x) for x in blocker.args[0].batch.context_lens] == [21, 5]
    assert [int(x) for x in w.results.batch.context_lens] == [21, 5]


def test_cancel(qtbot, shared_window):
    w = shared_window
    before = w.results
    w.workload.set_config(small_config(context_lens=(600, 600, 600), timing_runs=20))
    with qtbot.waitSignal(w.task_cancelled, timeout=WAIT) as blocker:
        with qtbot.waitSignal(w.runner.started, timeout=WAIT):
            w.request_compute()
        w.act_cancel.trigger()  # Esc
    assert blocker.args == ["compute"]
    assert w.results is before  # the previous results stay on screen
    assert "cancel" in w.status_label.text().lower()
    assert not w.banner.isVisible()
    # and the shared_window keeps working
    w.workload.set_config(small_config(context_lens=(12,)))
    with qtbot.waitSignal(w.results_ready, timeout=WAIT):
        w.request_compute()
    assert [int(x) for x in w.results.batch.context_lens] == [12]


# ------------------------------------------------------------------------------- errors
def test_bad_input_shows_error_and_the_app_continues(qtbot, shared_window):
    w = shared_window
    good = w.results
    with qtbot.waitSignal(w.compute_failed, timeout=WAIT) as blocker:
        w.workload.num_heads.setValue(5)  # 5 query heads, 2 KV heads
    assert "not divisible" in str(blocker.args[0])
    assert w.banner.isVisible()
    assert "not divisible" in w.banner.title.text()
    assert "GQA" in w.banner.hint.text()  # the error's hint is shown
    assert w.results is good

    with qtbot.waitSignal(w.compute_failed, timeout=WAIT) as blocker:
        w.workload.num_heads.setValue(4)
        w.workload.head_size.setValue(300)
    assert "300" in w.banner.title.text()
    assert w.banner.hint.text()

    with qtbot.waitSignal(w.results_ready, timeout=WAIT):
        w.workload.head_size.setValue(32)
    assert w.results.key.shape[2] == 32
    assert not w.banner.isVisible()


def test_starting_on_a_bad_config_still_names_the_adapter(qtbot, settings, session):
    from kvviz.ui.main_window import MainWindow

    w = MainWindow(settings=settings, config=small_config(num_heads=5), session=session, debounce_ms=50)
    qtbot.addWidget(w)
    with qtbot.waitSignal(w.compute_failed, timeout=WAIT):
        w.show()
    assert w.results is None
    assert "not divisible" in w.banner.title.text()
    qtbot.waitUntil(lambda: "Adapter: (" not in w.adapter_label.text(), timeout=WAIT)
    assert session.rt.summary.name in w.adapter_label.text()
    with qtbot.waitSignal(w.results_ready, timeout=WAIT):
        w.workload.num_heads.setValue(4)
    assert not w.banner.isVisible()
    w.close()


def test_unparsable_context_lengths(qtbot, shared_window):
    w = shared_window
    w.workload.context_lens.setText("12, abc")
    w.request_compute()
    assert w.banner.isVisible() and "integers" in w.banner.title.text()
    w.workload.context_lens.setText("12, 30")
    with qtbot.waitSignal(w.results_ready, timeout=WAIT):
        w.request_compute()
    assert not w.banner.isVisible()


def test_unexpected_exception_is_shown(qtbot, shared_window, monkeypatch):
    w = shared_window

    def boom(*a, **k):
        raise RuntimeError("kaboom")

    monkeypatch.setattr(w.session, "compute", boom)
    with qtbot.waitSignal(w.compute_failed, timeout=WAIT):
        w.request_compute()
    assert "RuntimeError: kaboom" in w.banner.title.text()
    monkeypatch.undo()
    with qtbot.waitSignal(w.results_ready, timeout=WAIT):
        w.request_compute()


# ------------------------------------------------------------------------- inspector
def test_block_inspector_shows_the_session_words(qtbot, window):
    w = window
    res = w.results
    b = res.batch
    blk = int(b.seq_blocks[2][-1])  # the partly filled last block of sequence 2
    # Each change re-inspects the block shown; its result reaches the window after the worker is idle,
    # so wait for what is shown, not for the worker.
    w.inspector.which.setCurrentText("V")
    w.inspector.kv_head.setValue(1)
    qtbot.waitUntil(lambda: (w.inspector.shown or ())[1:] == (1, "V") and not w.runner.busy, timeout=WAIT)
    # click the block's cell in the pool grid
    cl = w.cache_layout
    scene_pt = cl.vb.mapViewToScene(cl.cell_center(blk))
    view_pt = cl.view.mapFromScene(scene_pt)
    assert cl.block_at(cl.cell_center(blk).x(), cl.cell_center(blk).y()) == blk
    qtbot.mouseClick(cl.view.viewport(), Qt.LeftButton, pos=view_pt)
    qtbot.waitUntil(lambda: w.inspector.shown == (blk, 1, "V"), timeout=WAIT)
    expect = w.session.inspect_block(res, blk, 1, "V")
    assert len(w.inspector.records) == len(expect) == b.block_size
    tab = w.inspector.words
    for i, rec in enumerate(expect):
        words = np.asarray(rec.words, dtype=np.uint32).reshape(-1)
        assert tab.item(i, 0).text() == str(rec.slot)
        assert tab.item(i, 1).text() == str(rec.position)
        assert [tab.item(i, 2 + j).text() for j in range(len(words))] == [f"{int(x):08x}" for x in words]
    used = int(b.context_lens[2]) - (len(b.seq_blocks[2]) - 1) * b.block_size
    assert sum(1 for r in w.inspector.records if r.position >= 0) == used
    # decoded fields: the scale column holds the decoded scale
    cols = w.inspector.fields_table.columns[w.inspector.SHOWN_FROM:]  # the view leaves block, kv, kv_head out
    assert w.inspector.fields_table.columns[:3] == ["block", "kv", "kv_head"]
    for name in expect[0].fields:
        j = cols.index(name)
        assert w.inspector.decoded.item(0, j).text() != ""
    # the layout description (bits per element) is shown
    assert f"{res.layouts[1].bits_per_element:.3f} bits per element" in w.inspector.layout_view.toPlainText()
    # hover text names block, sequence, logical index, tokens used
    tip = cl.tooltip_for(blk)
    assert f"block {blk}" in tip and "sequence 2" in tip and f"logical block {len(b.seq_blocks[2]) - 1}" in tip
    assert f"tokens used {used}/{b.block_size}" in tip


# ---------------------------------------------------------------------------- exports
def _plotted_points(w, key):
    if key == "cache_layout":
        return w.results.batch.num_blocks
    if key == "scales":
        return len(w.scales.k_curve.getData()[0])
    if key == "codes":
        return len(w.codes.k_bars.opts["height"])
    if key == "attention":
        return len(w.attention.ref_curve.getData()[0])
    if key == "timing":
        return len(w.timing.bars.opts["x1"])
    if key == "overview":
        return len(w.overview.cards)
    if key == "block_inspector":
        return len(w.inspector.records)
    raise KeyError(key)


def test_panel_exports_png_svg_csv(qtbot, shared_window, tmp_path):
    import csv

    w = shared_window
    for p in w.panels:
        if p is w.compare:
            continue
        d = w.docks.get(p.key)
        if d is not None:
            d.raise_()
        qtbot.waitUntil(lambda p=p: p.isVisible(), timeout=5000)
        png = p.export("png", str(tmp_path / f"{p.key}.png"))[0]
        img = QImage(png)
        assert not img.isNull()
        assert (img.width(), img.height()) == (2 * p.width(), 2 * p.height()), p.key
        # not blank: more than a handful of distinct colours
        small = img.scaled(64, 64)
        colours = {small.pixel(x, y) for x in range(64) for y in range(64)}
        assert len(colours) > 5, p.key
        svg = p.export("svg", str(tmp_path / f"{p.key}.svg"))[0]
        root = ET.parse(svg).getroot()
        assert root.tag.endswith("svg")
        assert len(list(root.iter())) > 10
        csvs = p.export("csv", str(tmp_path / f"{p.key}.csv"))
        with open(csvs[0]) as fh:
            rows = list(csv.reader(fh))
        assert rows[0] == p.tables()[0].headers()  # the columns, with units where a name does not say them
        assert len(rows) - 1 == _plotted_points(w, p.key), p.key


def test_csv_matches_results(shared_window, tmp_path):
    import csv

    w = shared_window
    res = w.results
    out = w.timing.export_csv(str(tmp_path / "timing.csv"))
    with open(out[0]) as fh:
        rows = list(csv.DictReader(fh))
    assert [r["kernel"] for r in rows] == [t.kernel for t in res.timings]
    assert [float(r["median_us"]) for r in rows] == [t.timing.median_us for t in res.timings]
    out = w.attention.export_csv(str(tmp_path / "att.csv"))
    with open(out[0]) as fh:
        rows = list(csv.DictReader(fh))
    n = int(res.batch.context_lens[0])
    np.testing.assert_allclose([float(r["w_quant"]) for r in rows], res.w_q[0, 0, :n], rtol=1e-6)
    with open(out[1]) as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == res.metrics.kl.size
    np.testing.assert_allclose([float(r["kl_nats"]) for r in rows], res.metrics.kl.reshape(-1), rtol=1e-9)


def test_window_png_and_trace_and_report(qtbot, shared_window, tmp_path):
    w = shared_window
    res = w.results
    shot = w.save_screenshot(str(tmp_path / "window.png"))
    img = QImage(shot)
    assert (img.width(), img.height()) == (w.width() * w.devicePixelRatio(), w.height() * w.devicePixelRatio())

    trace = json.loads(open(w.export_trace(str(tmp_path / "trace.json"))).read())
    timed = [e for e in trace["traceEvents"] if e["ph"] == "X" and not e["args"]["warmup"]]
    assert len(timed) == sum(len(row.timing.samples_us) for row in res.timings)  # one event per sample
    for track, row in enumerate(res.timings):
        mine = [e for e in timed if e["tid"] == track + 1]
        assert [e["name"] for e in mine] == [row.kernel] * len(row.timing.samples_us)
        assert [e["dur"] for e in mine] == pytest.approx(list(row.timing.samples_us))

    paths = w.export_report(str(tmp_path / "report"))
    rep = json.load(open(paths["json"]))
    assert rep["attention"] == pytest.approx(res.metrics.summary())
    assert [r["kernel"] for r in rep["timings"]] == [r.kernel for r in res.timings]
    assert [r["gpu_us_median"] for r in rep["timings"]] == pytest.approx([r.timing.median_us for r in res.timings])
    assert rep["codes"]["K"]["saturated"] == pytest.approx(res.k_stats.value("saturated"))
    assert len(rep["panels"]["cache_layout"]["blocks"]["rows"]) == res.batch.num_blocks
    for key in ("window", "overview", "cache_layout", "scales", "codes", "attention", "timing"):
        assert os.path.exists(tmp_path / "report" / rep["figures"][key]), key
    md = open(paths["md"]).read()
    assert res.adapter.name in md and "Timing method" in md and "![" in md


# ------------------------------------------------------------------ sweep and compare
def test_sweep_in_the_worker(qtbot, shared_window):
    w = shared_window
    w.timing.sweep_values.setText("16, 48")
    with qtbot.waitSignal(w.sweep_ready, timeout=WAIT) as blocker:
        w.timing.sweep_button.click()
    points = blocker.args[0]
    assert [p["value"] for p in points] == [16, 48]
    curves = w.timing.sweep_plot.getPlotItem().listDataItems()
    assert sum(len(c.getData()[0]) for c in curves) == len(w.timing.sweep_tab)
    assert len(curves) == 1 + len(points[0]["method_kernels"])
    # p10-p90 of each kernel's runs drawn as error bars (log10 space), one item per kernel
    import pyqtgraph as pg

    bars = [it for it in w.timing.sweep_plot.getPlotItem().items if isinstance(it, pg.ErrorBarItem)]
    assert len(bars) == len(curves)
    assert all(p["baseline_p10_us"] <= p["baseline_us"] <= p["baseline_p90_us"] for p in points)


def test_sweep_cancel_keeps_partial(qtbot, shared_window):
    w = shared_window
    w.timing.sweep_values.setText("256, 512, 1024, 2048")
    with qtbot.waitSignal(w.sweep_ready, timeout=WAIT) as blocker:
        with qtbot.waitSignal(w.runner.progress, timeout=WAIT):
            w.timing.sweep_button.click()
        w.cancel()
    assert len(blocker.args[0]) < 4
    assert "cancel" in w.timing.sweep_status.text().lower() or not blocker.args[0]


def test_method_comparison(qtbot, shared_window):
    from kvviz.report.compare_run import compare_available

    assert compare_available()
    w = shared_window
    with qtbot.waitSignal(w.compare_ready, timeout=WAIT) as blocker:
        w.compare.run_button.click()
    rows = blocker.args[0]
    finite = [r for r in rows if np.isfinite(r.get("bits_per_element", np.nan)) and np.isfinite(r.get("kl_mean", np.nan))]
    assert finite
    assert w.compare.n_points() == len(finite)
    assert w.compare.table.rowCount() == len(rows)
    mine = [r for r in rows if r["method"] == w.results.method.id]
    assert mine and mine[0]["kl_mean"] == pytest.approx(float(w.results.metrics.kl.mean()), rel=0.05, abs=1e-7)
    # decode time as the x axis: every method with a timed decode is a point at its GPU time (log axis)
    timed = [r for r in rows if r.get("decode_total_us") and np.isfinite(r.get("kl_mean", np.nan))]
    assert timed and all(r["decode_us"] > 0 for r in timed)
    w.compare.x_axis.setCurrentIndex(w.compare.x_axis.findData("decode"))
    assert w.compare.n_points() == len(timed)
    assert "decode time" in w.compare.plot.getPlotItem().getAxis("bottom").labelText
    xs = sorted(p.pos().x() for p in w.compare.scatter.points())
    assert xs == pytest.approx(sorted(np.log10([r["decode_total_us"] for r in timed])))
    w.compare.x_axis.setCurrentIndex(w.compare.x_axis.findData("bits"))
    assert w.compare.n_points() == len(finite)


# -------------------------------------------------------------- settings, shortcuts
def test_settings_persist_layout_and_config(qtbot, settings, session):
    from kvviz.ui.main_window import MainWindow

    w = open_window(qtbot, settings, session, small_config(context_lens=(25, 11)))
    w.docks["codes"].hide()
    w.close()
    assert settings.value("windowState") is not None
    assert json.loads(settings.value("config"))["context_lens"] == [25, 11]

    w2 = MainWindow(settings=settings, session=session, autostart=False)
    qtbot.addWidget(w2)
    w2.show()
    assert w2.workload.context_lens.text() == "25, 11"
    assert w2.workload.config().context_lens == (25, 11)
    assert not w2.docks["codes"].isVisible()
    assert w2.docks["attention"].isVisible()
    w2.close()


def test_shortcuts(qtbot, window):  # a fresh window: the active one, which takes the key press
    w = window

    def keys(a):
        return {s.toString() for s in a.shortcuts()}

    assert {"Ctrl+R", "F5"} <= keys(w.act_run)
    assert "Esc" in keys(w.act_cancel)
    assert "Ctrl+E" in keys(w.act_report)
    assert "Ctrl+Shift+S" in keys(w.act_shot)
    with qtbot.waitSignal(w.results_ready, timeout=WAIT):
        qtbot.keyClick(w, Qt.Key_F5)
    assert QKeySequence("Ctrl+E") in w.act_report.shortcuts()


def test_method_options_are_editable(qtbot, shared_window):
    from kvviz.families.registry import option_schema

    def int_options(key):
        return [s for s in option_schema(key) if s.type is int]

    w = shared_window
    wl = w.workload
    with_opts = [wl.method.itemData(i) for i in range(wl.method.count()) if int_options(wl.method.itemData(i))]
    assert with_opts, "int4_group (group_size) and kivi (bits, recent) have integer options"
    key = with_opts[0]
    wl.auto_run.setChecked(False)
    wl.method.setCurrentIndex(wl.method.findData(key))
    spec = int_options(key)[0]
    name, val = spec.name, spec.default
    new = val * 2 if val else 1
    ed = wl.options_editor.editors[name]
    if spec.choices:  # a closed set: a combo box of the choices
        assert ed.findData(new) >= 0
        ed.setCurrentIndex(ed.findData(new))
    else:
        ed.setValue(new)
    cfg = wl.config()
    assert cfg.method == key
    assert cfg.method_options == {name: new}


def test_hover_names_block(shared_window):
    cl = shared_window.cache_layout
    res = shared_window.results
    free = [b for b in range(res.batch.num_blocks) if res.batch.block_owner()[b] < 0]
    if free:
        assert cl.tooltip_for(free[0]).endswith("free")
    c = cl.cell_center(0)
    assert cl.block_at(c.x(), c.y()) == 0
    assert cl.block_at(-1, 3) == -1
    assert isinstance(c, QPointF)
