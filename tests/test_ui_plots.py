"""The window's plots as figures and as linked views: axes that say their unit, hover readouts, a kernel
clicked anywhere selected everywhere with its detail, a heatmap cell driving the attention plot, vector SVG,
strict CSV, labels that never overlap, one sweep series per kernel, the preview drawn before the timing."""
import csv
import io
import math
import types

import numpy as np
import pytest
from PySide6.QtCore import QSize
from PySide6.QtGui import QImage
from PySide6.QtWidgets import QApplication

from kvviz.bench.detail import BANDWIDTH, FIXED_COST, INSTRUCTIONS, kernel_detail
from kvviz.bench.roofline import row_flops
from kvviz.tables import timing_key
from ui_windows import WAIT, _module_window, open_window, settings, shared_window, small_config, window  # noqa: F401  (fixtures)

pytestmark = pytest.mark.gpu


def _plots(w):
    """(name, PlotItem) of every data plot of the window with axes."""
    return [("attention weights", w.attention.w_plot), ("attention difference", w.attention.d_plot),
            ("attention heatmap", w.attention.h_plot), ("scales", w.scales.s_plot),
            ("max |K|", w.scales.k_heat_plot), ("max |V|", w.scales.v_heat_plot),
            ("bandwidth bars", w.timing.bar_plot.getPlotItem()), ("sweep", w.timing.sweep_plot.getPlotItem()),
            ("history", w.timing.history_view.plot.getPlotItem()), ("timeline", w.timing.timeline.plot.getPlotItem()),
            ("roofline", w.roofline.plot.getPlotItem()), ("compare", w.compare.plot.getPlotItem())]


def test_every_plot_axis_says_what_it_shows(shared_window):
    w = shared_window
    for name, plot in _plots(w):
        for side in ("bottom", "left"):
            ax = plot.getAxis(side)
            if not ax.isVisible() or not ax.style["showValues"]:
                continue
            if name.startswith("max |") and side == "left":  # rows named by their ticks (s0, s1, ...)
                assert ax._tickLevels and ax._tickLevels[0][0][1] == "s0"
                continue
            assert ax.labelString().split(">", 1)[1].strip("</span>").strip(), (name, side)
    # the units: time axes in seconds with their prefix, rates in B/s and FLOP/s
    tl = w.timing.timeline.plot.getPlotItem().getAxis("bottom")
    assert tl.unit == "s" and tl.suffix.endswith("s") and "(" in tl.labelString()
    assert w.roofline.plot.getPlotItem().getAxis("left").unit == "FLOP/s"
    assert w.timing.sweep_plot.getPlotItem().getAxis("left").unit == "s"
    bar = w.attention.h_bar.axis
    lo, hi = bar.range
    texts = [t for t in bar.tickStrings(bar.tickValues(lo, hi, 300)[0][1], 1, 1) if t]
    assert len(texts) >= 3  # a colour bar with real ticks, not just its two ends


def test_hover_readouts_and_a_heatmap_cell_drives_the_attention_plot(shared_window):
    w = shared_window
    att = w.attention
    x = 5.0
    y = math.log10(max(att.weights.rows[5][1], 1e-12))
    text = att.w_hover.show_at(x, y)
    assert text.startswith("position 5") and "f32" in text and "quantised" in text
    assert att.h_hover.show_at(1.5, 2.5).startswith("seq 2, head 1")
    att.h_hover.click_at(1.5, 2.5)  # a click on a heatmap cell shows that sequence and head above
    assert att.selection() == (2, 1) and att.weights.title.endswith("query head 1 (softmax probabilities; "
                                                                    "diff = w_quant - w_f32)")
    assert "seq 2, head 1" in att.w_plot.titleLabel.text
    s_text = w.scales.s_hover.show_at(3.0, 0.0)
    assert s_text.startswith("position 3") and "K scale" in s_text
    b = w.timing.bar_hover.show_at(1.0, 2.0)
    assert w.results.timings[2].kernel in b and "B/s" in b and "median" in b
    # a readout over an empty spot falls back to the coordinates in the axes' units
    assert "B/s" in w.timing.bar_hover.show_at(1.0, 0.5)


def test_a_kernel_clicked_anywhere_is_selected_everywhere(shared_window):
    w = shared_window
    res = w.results
    i = next(k for k, t in enumerate(res.timings) if t.kernel == "paged_attn_f32")
    key = timing_key(res.timings[i])
    w.timing.bar_hover.click_at(0.0, float(i))  # a click on its bar
    assert w.timing.selected_key == key and w.roofline.selected_key == key
    assert w.timing.table.selectionModel().selectedRows()[0].row() == i
    assert w.timing.timeline.selected_band.isVisible()
    assert w.kernel_detail.detail.key == key and "paged_attn_f32" in w.kernel_detail.title.text()
    assert w.lab.slot_id == "f32.decode"  # its Kernel lab slot, the lab having no file open
    w.kernel_detail.lab_button.click()
    assert w.docks["kernel_lab"].isVisible()
    # from the timeline: a pass of another kernel
    j = next(k for k, t in enumerate(res.timings) if t.kernel == "reshape_and_cache_f32")
    w.timing.timeline._clicked(w.timing.timeline.spans[0].start_us, float(j))
    assert w.timing.selected_key == timing_key(res.timings[j]) == w.roofline.selected_key
    # from the roofline: its point (the chart is drawn when its tab is shown)
    rf = w.roofline
    w.docks["timing"].raise_()
    w.timing.tabs.setCurrentWidget(rf)
    QApplication.processEvents()
    m = next(k for k, p in enumerate(rf.drawn) if p.kernel == "paged_attn_f32")
    rf.hover.click_at(rf._lx[m], rf._ly[m])
    assert w.timing.selected_key == key and len(rf.ring.data) == 1


def test_kernel_detail_reads_the_dispatch_and_gives_a_verdict(shared_window):
    res = shared_window.results
    row = next(t for t in res.timings if t.kernel == "paged_attn_f32")
    d = kernel_detail(res, timing_key(row))
    assert d.dispatches and d.dispatches[0].grid == tuple(row.dispatches[0][1])
    assert all(d.dispatches[0].workgroup_size) and d.dispatches[0].invocations > 0
    assert d.bytes == row.bytes_moved and d.flops == row_flops(row, res) > 0
    assert d.verdict in (BANDWIDTH, INSTRUCTIONS, FIXED_COST) and d.why
    assert math.isclose(d.times_floor, row.timing.median_us / res.timing_floor_us)
    assert kernel_detail(res, "no such kernel [x]") is None


def test_svg_exports_are_fully_vector_at_the_size_asked(shared_window, tmp_path):
    w = shared_window
    panels = [w.overview, w.cache_layout, w.scales, w.codes, w.attention, w.timing, w.inspector]
    for p in panels:
        text = open(p.export("svg", str(tmp_path / f"{p.key}.svg"))[0]).read()
        assert "<image" not in text, p.key
    w.timing.tabs.setCurrentWidget(w.roofline)
    text = open(w.timing.export("svg", str(tmp_path / "roof.svg"), size=QSize(640, 480), dpi=192)[0]).read()
    assert "<image" not in text and 'width="84.6667mm"' in text  # 640 px at 192 DPI: 3.33 in
    png = w.attention.export("png", str(tmp_path / "att.png"), size=QSize(600, 420), dpi=96)[0]
    assert QImage(png).size() == QSize(600, 420)
    assert QImage(w.attention.export("png", str(tmp_path / "att2.png"), size=QSize(600, 420))[0]).size() == \
        QSize(1200, 840)  # 192 DPI by default: 2x
    assert not w.attention.export_button.isHidden()


def test_csv_exports_parse_strictly_with_units(shared_window, tmp_path):
    w = shared_window
    files = []
    for p in (w.cache_layout, w.scales, w.codes, w.attention, w.timing, w.inspector):
        files += p.export("csv", str(tmp_path / f"{p.key}.csv"))
    headers = {}
    for f in files:
        rows = list(csv.reader(io.StringIO(open(f, newline="").read()), strict=True))
        head, body = rows[0], rows[1:]
        headers[f] = head
        assert body, f
        for r in body:
            assert len(r) == len(head), f
            for name, cell in zip(head, r):
                assert cell.lower() not in ("nan", "inf", "-inf"), f
                if name[:1] == "w" and name[1:].isdigit():  # a block's raw u32 words, in hex
                    continue
                try:
                    v = float(cell)
                except ValueError:
                    continue
                if "." in cell or "e" in cell:
                    assert repr(v) == cell, (f, cell)  # the shortest text of the value
    att = next(h for f, h in headers.items() if f.endswith("attention_head_metrics.csv"))
    assert "kl_nats" in att and "max_weight_err" in att  # KL says its unit; the others are unitless
    ins = next(h for f, h in headers.items() if f.endswith("block_inspector.csv"))
    assert ins[:3] == ["block", "kv", "kv_head"]


def test_kivi_scales_show_the_float32_window_as_a_region(qtbot, shared_window, tmp_path):
    w = shared_window  # switched to KIVI (restored after)
    w.workload.set_config(small_config(method="kivi", method_options={"bits": 2, "recent": 32}, context_lens=(100, 40)))
    with qtbot.waitSignal(w.results_ready, timeout=WAIT):
        w.request_compute()
    qtbot.waitUntil(lambda: not w.runner.busy, timeout=WAIT)
    t = w.scales.scale_table
    k = t.column("k_scale").astype(np.float64)
    assert np.isnan(k).any() and np.isfinite(k).any()  # the recent tokens: no scale, not 0
    assert not (k == 0).any()
    assert any(type(it).__name__ == "LinearRegionItem" for it in w.scales._unscaled)
    out = w.scales.export("csv", str(tmp_path / "s.csv"))[0]
    body = list(csv.reader(open(out)))[1:]
    assert any(r[1] == "" for r in body) and all(r[1] != "0.0" for r in body)
    last = next(r for r in reversed(body) if r[1] == "")
    assert "none (kept in float32)" in w.scales.s_hover.show_at(float(last[0]), 0.0)


def test_a_clean_oracle_check_says_so_instead_of_a_black_map(shared_window):
    lab = shared_window.lab
    check = types.SimpleNamespace(summary=lambda: "ok", tolerance="exact", rows="rows", cols="cols", ok=True,
                                  heat=np.zeros((8, 4)), bad=0, total=4096, max_err=0.0, verdict="OK")
    lab.show_run(types.SimpleNamespace(check=check, info=None, timings=[]))
    assert not lab.heat_img.isVisible() and "4,096 elements within the tolerance" in lab.heat_clean.toPlainText()
    bad = types.SimpleNamespace(**{**check.__dict__, "ok": False, "bad": 3, "heat": np.eye(8, 4) * 3})
    lab.show_run(types.SimpleNamespace(check=bad, info=None, timings=[]))
    assert lab.heat_img.isVisible() and lab.heat_clean.toPlainText() == ""


def _compare_rows(n_tq=7):
    rows = [{"method": "f16", "label": "F16", "options": {}, "bits_per_element": 16.0, "kl_mean": 1e-7, "rel_l2": 1e-4}]
    for b in range(n_tq):  # TurboQuant's settings crowd at 2-6 bits
        for scale in ("reference", "unbiased"):
            rows.append({"method": "turboquant", "label": "TurboQuant 2-bit polar + 1-bit QJL (seed WGSL)",
                         "options": {"qjl_scale": scale, "bits": 1 + b % 4, "outlier_share": 0.25 * (b // 4)},
                         "bits_per_element": 2.0 + 0.5 * b + (0.05 if scale == "unbiased" else 0.0),
                         "kl_mean": 0.1 / (1 + b) * (0.7 if scale == "unbiased" else 1.0), "rel_l2": 0.1})
    return rows


def test_comparison_names_settings_apart_and_labels_never_overlap(qtbot):
    from kvviz.ui.panels import ComparePanel

    p = ComparePanel(None)
    qtbot.addWidget(p)
    p.resize(800, 600)
    p.show()
    p.set_rows(_compare_rows())
    qtbot.wait(50)
    names = list(p.table_data.column("name"))
    assert len(set(names)) == len(names)  # no two rows alike, reference and unbiased QJL scale told apart
    shown = [it for _x, _y, it in p.labels.items if it.isVisible()]
    assert 0 < len(shown) < len(names)  # the rest are left to the hover readout
    rects = [it.sceneBoundingRect() for it in shown]
    assert not any(a.intersects(b) for i, a in enumerate(rects) for b in rects[i + 1:])
    xs, ys, idx = p._xy
    j = idx.index(3)
    assert p._describe(xs[j], ys[j]).startswith(names[3])
    p._clicked(xs[j], ys[j])
    assert p.table.selectionModel().selectedRows()[0].row() == 3 and len(p.ring.data) == 1


def test_one_sweep_series_per_kernel_with_the_legend_outside(qtbot):
    from kvviz.ui.panels import TimingPanel

    p = TimingPanel(None)
    qtbot.addWidget(p)
    p.resize(800, 600)
    p.show()
    pts = []
    for v, parts in ((64, 1), (256, 1), (1024, 2), (4096, 8)):  # the fast decode's partition count grows
        k = {"median_us": float(v), "min_us": v * 0.9, "p10_us": v * 0.95, "p90_us": v * 1.1, "bytes": 100 * v,
             "role": "decode", "impl": "fast"}
        pts.append({"param": "context", "value": v, "tokens": v, "baseline_us": 2.0 * v, "baseline_p10_us": 1.9 * v,
                    "baseline_p90_us": 2.1 * v, "baseline_bytes": 400 * v,
                    "method_kernels": {f"fast_decode_int8 ({parts} partition{'s' if parts > 1 else ''})": k,
                                       "reshape_and_cache_q8": dict(k, median_us=3.0 * v)}})
    p.set_sweep(pts)
    names = [label.text for _sample, label in p.sweep_legend.items]
    assert names == ["paged_attn_f32 (baseline)", "fast_decode_int8", "reshape_and_cache_q8"]
    assert all(len(xs) == 4 for _n, xs, _ys, _r in p._sweep_series)
    pi = p.sweep_plot.getPlotItem()
    assert p.sweep_legend.parentItem() is pi and not pi.vb.sceneBoundingRect().intersects(
        p.sweep_legend.sceneBoundingRect())  # under the axis, never over the curves
    _n, xs, ys, _r = p._sweep_series[1]
    text = p._describe_sweep_point(math.log10(xs[3]), math.log10(ys[3]))
    assert text.startswith("fast_decode_int8") and "8 partitions" in text and "ms" in text


def test_the_first_picture_comes_before_the_timing(qtbot, settings, session):
    w = open_window(qtbot, settings, session)
    try:
        seen = []
        w.preview_ready.connect(lambda task, res: seen.append((res.timed, len(res.timings),
                                                               w.overview.cards["decode"].value.text())))
        with qtbot.waitSignal(w.results_ready, timeout=WAIT):
            w.request_compute()
        assert seen == [(False, 0, "timing ...")]
        assert w.results.timed and w.results.timings and w.overview.cards["decode"].value.text() != "timing ..."
        assert w.attention.res is w.results and w.scales.res is w.results
    finally:
        w.close()


def test_history_plot_keeps_room_for_its_data(shared_window, qtbot):
    w = shared_window
    w.timing.tabs.setCurrentWidget(w.timing.history_view)
    qtbot.wait(100)
    vb = w.timing.history_view.plot.getPlotItem().vb
    assert vb.height() >= 100, vb.height()
