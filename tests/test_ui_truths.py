"""What the window shows is true and readable: histograms with one bar per code, statistics
with their definitions, exports that are figures (no controls, vector scatter points), a report folder
with every panel in strict JSON, bad input named where it is (pytest-qt, offscreen)."""
import json
import os

import numpy as np
import pytest

from ui_windows import WAIT, _module_window, open_window, settings, shared_window, small_config, window  # noqa: F401  (fixtures)

pytestmark = pytest.mark.gpu


def _strict_json(path):
    """json.loads that refuses NaN/Infinity (as node's JSON.parse does)."""
    def bad(name):
        raise ValueError(f"{path}: non-standard JSON constant {name}")

    with open(path) as fh:
        return json.loads(fh.read(), parse_constant=bad)


# ------------------------------------------------------------------------------ histograms
def _bar_x(bars):
    return np.asarray(bars.opts["x"], np.float64), float(np.asarray(bars.opts["width"]).max()), \
        float(np.asarray(bars.opts["width"]).min())


def test_one_histogram_bar_per_integer_code(qtbot, shared_window):
    w = shared_window
    res = w.results
    lo, hi = res.qkv.code_range
    for log in (False, True):
        w.codes.log_y.setChecked(log)
        for bars in (w.codes.k_bars, w.codes.v_bars):
            x, wmax, wmin = _bar_x(bars)
            # every integer code of the range has its bar (zero counts too), bars of width 1 tile the axis
            np.testing.assert_array_equal(x, np.arange(lo, hi + 1))
            assert wmax == wmin == 1.0
        h = np.asarray(w.codes.k_bars.opts["height"], np.float64)
        counts = w.codes.hist.column("k_count").astype(np.float64)
        np.testing.assert_allclose(h, np.log10(counts + 1) if log else counts)
    w.codes.log_y.setChecked(False)


def _compute(qtbot, w, cfg):
    """The window's Workload set to `cfg` and computed (as a user switching the method does)."""
    w.workload.set_config(cfg)
    with qtbot.waitSignal(w.results_ready, timeout=WAIT):
        w.request_compute()
    qtbot.waitUntil(lambda: not w.runner.busy, timeout=WAIT)


def test_fp8_histogram_on_a_code_index_axis_with_value_ticks(qtbot, shared_window):
    w = shared_window
    _compute(qtbot, w, small_config(method="fp8_e4m3"))
    x, wmax, wmin = _bar_x(w.codes.k_bars)
    np.testing.assert_array_equal(x, np.arange(253))  # every finite E4M3 value, in order
    assert wmax == wmin == 1.0
    vals = w.codes.hist.column("code").astype(np.float64)
    assert vals[0] == -448 and vals[-1] == 448 and np.all(np.diff(vals) > 0)
    ticks = w.codes.v_plot.getAxis("bottom")._tickLevels[0]
    labels = {lab for _, lab in ticks}
    assert {"-448", "0", "448"} <= labels
    assert "value" in w.codes.v_plot.getAxis("bottom").labelText


# ------------------------------------------------------------------------------ statistics
def test_codes_table_names_and_defines_the_statistics(shared_window):
    w = shared_window
    res = w.results
    t = w.codes.table
    headers = [t.horizontalHeaderItem(j).text() for j in range(t.columnCount())]
    assert "saturated" in headers and "clip rate" not in headers and "zeros" not in headers
    j = headers.index("saturated")
    assert t.item(0, j).text() == "0.00%"  # int8 per token on Gaussian-like data: nothing saturates
    assert "beyond the code range" in t.horizontalHeaderItem(j).toolTip()
    zj = headers.index("zeroed non-zeros")
    assert t.item(0, zj).text() == res.k_stats.stats["zeroed"].text()
    assert "dequantised value is exactly 0" in t.item(0, zj).toolTip()


# ------------------------------------------------------------------------------ exports
def test_panel_exports_hold_only_the_plots(qtbot, shared_window, tmp_path):
    w = shared_window
    svg = tmp_path / "codes.svg"
    w.codes.export_svg(str(svg))
    text = svg.read_text()
    for control in ("Export", "log counts", w.codes.info.text()):
        assert control not in text, control
    assert "count" in text  # the plots' axis labels are there
    assert not w.codes.log_y.isHidden() and not w.codes.export_button.isHidden()  # restored after export


def test_svg_scatter_points_are_vector_shapes(qtbot, session, tmp_path):
    from kvviz.families.turboquant.bias import inner_product_bias
    from kvviz.ui.panels.qjl_bias import QjlBiasPanel

    res = session.compute(small_config(head_size=128))
    p = QjlBiasPanel(None)
    qtbot.addWidget(p)
    p.resize(900, 600)
    p.show()
    p.set_results(res)
    q, K, seed, layer = p.inputs()
    p.set_bias(inner_product_bias(q, K, seed, layer, rt=session.rt), 0, 0)
    n = p.n_points()
    assert n >= 40
    path = tmp_path / "bias.svg"
    p.export_svg(str(path))
    text = path.read_text()
    # pyqtgraph's pixmap atlas embeds one bitmap per point; vector symbols are one path each (the one
    # image left is the view's blank background)
    assert text.count("<image") <= 2
    assert text.count("<path") >= n


def test_report_folder_has_every_panel_and_strict_files(qtbot, shared_window, tmp_path):
    w = shared_window
    paths = w.export_report(str(tmp_path / "rep"))
    rep = _strict_json(paths["json"])
    for key in ("window", "overview", "cache_layout", "scales", "codes", "attention", "timing", "qjl_bias"):
        assert os.path.exists(tmp_path / "rep" / rep["figures"][key]), key
    assert rep["codes"]["K"]["definitions"]["saturated"]


# ------------------------------------------------------------------------------ bad input
BAD_CONFIGS = [  # (file text, the Workload field it names, the words the banner says)
    ('{"num_heads": NaN}', "num_heads", "num_heads"),
    ('{"head_size": "abc"}', "head_size", "head_size"),
    ('{"block_size": 0}', "block_size", "block_size"),
    ('{"softmax_scale": NaN}', None, "softmax_scale"),
]


def test_load_config_names_the_field(qtbot, shared_window, tmp_path, capfd):
    """Each bad file in turn in one shared_window (each names another field, so an earlier case's marks cannot pass a
    later one's checks)."""
    w = shared_window
    before = w.workload.block_size.value()
    for i, (text, field, words) in enumerate(BAD_CONFIGS):
        path = tmp_path / f"bad{i}.json"
        path.write_text(text)
        capfd.readouterr()
        assert w.load_config(str(path)) is False, text
        assert w.banner.isVisible() and words in w.banner.title.text(), text
        assert "Load config" in w.banner.title.text()
        assert "Traceback" not in capfd.readouterr().err
        assert w.workload.block_size.value() == before  # block size 0 never becomes 1
        if field:
            wid = w.workload.field_widgets()[field]
            assert wid.property("kvvizInvalid") and words in wid.toolTip(), text


def test_load_config_json_syntax_error_has_its_own_message(qtbot, shared_window, tmp_path):
    path = tmp_path / "broken.json"
    path.write_text('{"num_heads": 8,\n')
    assert shared_window.load_config(str(path)) is False
    title = shared_window.banner.title.text()
    assert "JSON syntax error" in title and "line 2" in title and "--config" not in title


def test_invalid_field_is_marked_and_panels_say_stale(qtbot, shared_window):
    w = shared_window
    w.workload.context_lens.setText("0, -5")
    w.request_compute()
    assert "context_lens" in w.banner.title.text()
    assert w.workload.context_lens.property("kvvizInvalid")
    assert all(p.is_stale for p in (w.codes, w.attention, w.timing, w.overview))
    assert "stale" in w.codes.stale_label.text().lower()
    # a good value runs again and clears both
    w.workload.context_lens.setText("40, 17")
    with qtbot.waitSignal(w.results_ready, timeout=WAIT):
        w.request_compute()
    assert not w.workload.context_lens.property("kvvizInvalid")
    assert not w.codes.is_stale


def test_sweep_values_must_be_positive(qtbot, shared_window):
    w = shared_window
    got = []
    w.timing.sweep_requested.connect(lambda *a: got.append(a))
    for text in ("0, -5", "64, x"):
        w.timing.sweep_values.setText(text)
        w.timing._sweep_clicked()
        assert not got
        assert "Sweep value" in w.timing.sweep_status.text()


def test_sweep_cancel_stops_within_one_kernel(session):
    from kvviz.errors import InvalidInput

    cfg = small_config(method="int8_token")
    rt = session.rt
    calls = []
    orig = rt.time

    def timed(*a, **k):
        calls.append(1)
        return orig(*a, **k)

    rt.time = timed
    try:
        pts = session.sweep(cfg, "context", [32, 64], cancel=lambda: len(calls) >= 1)
    finally:
        rt.time = orig
    assert pts == [] and len(calls) == 1  # the baseline timing ran, no method kernel after the cancel
    with pytest.raises(InvalidInput, match="sweep values"):
        session.sweep(cfg, "context", [0, -5])


# ------------------------------------------------------------------------------ CLI hygiene
def test_kvviz_live_exits_nonzero_when_a_method_fails(monkeypatch, capsys, smollm2):
    import kvviz.live.decode as decode
    import kvviz.sources.gguf_llama as gguf_llama
    from kvviz.live import measure

    def broken(*a, **k):
        raise RuntimeError("boom")

    monkeypatch.setattr(decode, "run_live", broken)
    monkeypatch.setattr(gguf_llama, "load_gguf_llama", lambda path: smollm2)  # the model read once a run
    rc = measure.main(["--methods", "int8_seed,kivi", "--n-new", "1", "--prompt", "Hello"])
    out, err = capsys.readouterr()
    assert rc == 1  # none ran
    assert "2 of 2 method(s) failed" in err
    assert any(ln.split() == ["int8_seed", "failed:", "RuntimeError:", "boom"] for ln in out.splitlines()), out


# ------------------------------------------------------------------------------ layouts
def test_window_fits_1280x800_with_whole_cards(qtbot, shared_window):
    w = shared_window
    m = w.minimumSizeHint()
    assert m.width() <= 1280 and m.height() <= 800, m
    w.resize(1280, 800)
    w._size_docks()
    qtbot.wait(200)
    ov = w.overview
    assert ov.columns >= 2
    for c in ov.cards.values():  # every card as wide as its value needs
        assert c.width() >= c.value.fontMetrics().horizontalAdvance(c.value.text()) + 8, c.value.text()


def test_block_inspector_scale_before_codes(qtbot, shared_window):
    w = shared_window
    _compute(qtbot, w, small_config(method="int8_token"))
    qtbot.waitUntil(lambda: w.inspector.fields_table is not None, timeout=WAIT)
    cols = w.inspector.fields_table.columns[w.inspector.SHOWN_FROM:]  # as the view shows them
    assert cols.index("scale") < cols.index("codes")
    j = cols.index("codes")
    assert w.inspector.decoded.columnWidth(j) <= w.inspector.MAX_COLUMN
    assert len(w.inspector.decoded.item(0, j).toolTip()) > 16  # the whole vector is its tooltip


def test_bandwidth_axis_labels_are_uniform(shared_window):
    """The bandwidth axis (log, GB/s) labels its decades with SI prefixes and its unit, every label the same
    style, no minor tick labelled."""
    ax = shared_window.timing.bar_plot.getPlotItem().getAxis("bottom")
    lo, hi = ax.range
    levels = ax.tickValues(lo, hi, 400)
    texts = ax.tickStrings(levels[0][1], 1.0, levels[0][0])
    assert len(texts) >= 2 and all(t.endswith("B/s") and "e" not in t.split()[0] for t in texts), texts
    assert all(t == "" for t in ax.tickStrings(levels[1][1], 1.0, levels[1][0]))  # minor ticks: no text
    assert "bandwidth" in ax.labelString()
