"""No cut text at 1280x800: every visible combo box, label, button, field and plot
title of every panel shows its whole text in the default layout and the live-decode layout; the panels
under the overview and the live decode's KL plot get real height; the f16 code histogram is binned on its
value axis (a few hundred points, not 63,488 bars); the History tab's legend sits outside the data and a
kernel timed on two shapes gets a line per shape (pytest-qt, offscreen)."""
import numpy as np
import pyqtgraph as pg
import pytest
from PySide6.QtWidgets import QComboBox

from kvviz.analysis.session import SessionConfig
from kvviz.ui.audit import cut_text, scrolling_docks
from kvviz.ui.widgets.tables import select_row
from ui_windows import WAIT, _module_window, module_window, settings, settled, shared_window, small_config  # noqa: F401  (fixtures)

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def default_window(request, qapp, session, tmp_path_factory):
    """A window of the default workload (its labels: "seq 0 (300 tok)", ...; the screenshots' workload), for the
    sizes below in turn: each lays the window out anew at its size, as a user resizing it does."""
    yield from module_window(request, session, tmp_path_factory, SessionConfig(timing_runs=3))


def _at(qtbot, w, width, height):
    w.resize(width, height)
    qtbot.wait(50)
    w._default_layout()
    w._size_docks()
    qtbot.wait(300)


def _each_tab(w):
    """Raise every dock in turn (each tab of each group), yielding its key."""
    for key, d in w.docks.items():
        if not d.isVisible() and not d.isFloating():
            continue
        d.raise_()
        yield key


def test_audit_finds_a_cut_combo(qtbot):
    """The audit itself can fail: a combo squeezed below its text is reported, one that fits is not."""
    from PySide6.QtWidgets import QHBoxLayout, QWidget

    box = QWidget()
    qtbot.addWidget(box)
    lay = QHBoxLayout(box)
    combo = QComboBox()
    combo.addItem("seq 0 (300 tok, 19 blocks)")
    combo.setMinimumContentsLength(3)
    combo.setSizeAdjustPolicy(QComboBox.AdjustToMinimumContentsLengthWithIcon)
    combo.setFixedWidth(60)
    lay.addWidget(combo)
    box.show()
    qtbot.waitExposed(box)
    assert any("seq 0 (300 tok" in c for c in cut_text(box))
    combo.setFixedWidth(combo.sizeHint().width() + 200)
    qtbot.wait(20)
    assert cut_text(box) == []


@pytest.mark.parametrize("size", [(1280, 800), (1920, 1080)])
def test_no_cut_text_and_no_clipped_plots_in_either_layout(qtbot, default_window, size):
    """The default layout, then (reset, as the View menu does) the live-decode layout, at one size.

    Default layout: no cut text in any panel, and the combos with a sequence in them as wide as their text.
    Live layout: no cut text, and no view's plots wider than the view. A plot title can hold its plot (and the view's
    whole layout) at the title's one-line width, wider than the view: the live KL plot at 1280x800 (its right "top-1"
    axis cut) and the Scales plots at 1920x1080 are the views where that would show."""
    w = default_window
    qtbot.waitUntil(lambda: not w.runner.busy, timeout=WAIT)
    _at(qtbot, w, *size)
    cuts = cut_text(w)
    assert cuts == [], "\n".join(cuts)
    for key in _each_tab(w):
        settled(qtbot, key, lambda: cut_text(w.docks[key]))
    for combo in w.findChildren(QComboBox):
        if combo.isVisible() and combo.currentText().startswith("seq "):
            need = combo.fontMetrics().horizontalAdvance(combo.currentText())
            assert combo.width() > need, (combo.currentText(), combo.width(), need)

    _at(qtbot, w, *size)
    w.show_live_layout()
    _live_plot_as_after_a_run(w.live)
    qtbot.wait(300)
    cuts = cut_text(w)
    assert cuts == [], "live layout:\n" + "\n".join(cuts)
    for key in _each_tab(w):
        settled(qtbot, key, lambda: cut_text(w.docks[key]))
    for view in w.findChildren(pg.GraphicsView):
        ci = getattr(view, "centralWidget", None)
        if view.isVisible() and ci is not None and view.viewport().width() > 150:
            assert ci.geometry().width() <= view.viewport().width() + 1, (view.parentWidget().objectName(),
                                                                         ci.geometry().width())


def test_default_layout_at_1280x800_gives_the_panels_height(qtbot, shared_window):
    w = shared_window
    _at(qtbot, w, 1280, 800)
    w.docks["cache_layout"].raise_()
    qtbot.wait(100)
    assert scrolling_docks(w) == []
    for key, glw in (("scales", w.scales.glw), ("codes", w.codes.glw)):
        w.docks[key].raise_()
        qtbot.wait(150)
        assert glw.height() >= 250, (key, glw.height())  # was ~150 under the overview, two side by side
        assert scrolling_docks(w) == [], key
    w.show_live_layout()
    qtbot.wait(300)
    assert w.docks["live"].isVisible() and w.live.glw.height() >= 150, w.live.glw.height()
    cuts = cut_text(w)
    assert cuts == [], "\n".join(cuts)


def test_f16_histogram_is_binned_on_its_value_axis(qtbot, shared_window):
    w = shared_window  # switched to f16 here (restored after)
    w.workload.set_config(small_config(method="f16"))
    with qtbot.waitSignal(w.results_ready, timeout=WAIT):
        w.request_compute()
    qtbot.waitUntil(lambda: not w.runner.busy, timeout=WAIT)
    cp = w.codes
    res = w.results
    assert len(cp.hist) > 60_000  # the table (CSV) keeps one row per f16 code
    assert cp.binned is not None
    edges, kb, vb, width = cp.binned
    assert len(edges) <= 600 and np.allclose(np.diff(edges), width)
    for item, counts, st in ((cp.k_bars, kb, res.k_stats), (cp.v_bars, vb, res.v_stats)):
        assert isinstance(item, pg.PlotDataItem) and not isinstance(item, pg.BarGraphItem)
        assert len(item.xData) <= 600  # one step per bin, drawn fast
        assert int(round(counts.sum())) == int(st.counts.sum())  # every code counted once
    # every bin holds exactly the codes whose value falls in it
    vals = cp.hist.column("code").astype(np.float64)
    kc = cp.hist.column("k_count")
    i = int(np.argmax(kb))
    inside = (vals >= edges[i]) & (vals < edges[i + 1])
    assert kb[i] == kc[inside].sum()
    label = cp.v_plot.getAxis("bottom").labelText
    assert "value" in label and f"{width:g}" in label
    # integer codes keep one bar per code
    w.workload.set_config(small_config(method="int8_token"))
    with qtbot.waitSignal(w.results_ready, timeout=WAIT):
        w.request_compute()
    assert cp.binned is None and isinstance(cp.k_bars, pg.BarGraphItem)


def test_history_legend_outside_the_data_and_a_line_per_shape(qtbot, tmp_path):
    from kvviz.history.db import HistoryDB, KernelRecord, shape_key
    from kvviz.ui.panels.history import HistoryView

    shapes = [dict(num_seqs=2, context_lens=64, num_heads=4, num_kv_heads=2, head_size=64, block_size=16),
              dict(num_seqs=8, context_lens=4096, num_heads=32, num_kv_heads=8, head_size=128, block_size=16)]
    rng = np.random.default_rng(0)
    path = tmp_path / "runs.sqlite3"
    adapter = {"name": "test adapter", "driver": "t", "backend": "Vulkan", "is_software": True}
    with HistoryDB(path) as db:
        for r in range(4):
            ks = [KernelRecord("paged_attn_f32", "f32 baseline", tuple(rng.normal(100 * (1 + 9 * j), 2, 8)),
                               "gpu-timestamps", sh, None, "decode", "baseline", "abc", 4096, 3)
                  for j, sh in enumerate(shapes)]
            db.record("bench", adapter, ks)
    hv = HistoryView()
    qtbot.addWidget(hv)
    hv.resize(700, 700)
    hv.show()
    assert hv.open(path)
    select_row(hv.runs_table, 0)
    qtbot.wait(100)
    assert len(hv.curves) == 2  # one line per shape, never one line through both
    keys = {shape_key(s) for s in shapes}
    seen = set()
    for curve, key in hv.curves:
        x, y = curve.getData()
        assert len(x) == 4 and key in keys
        seen.add(key)
        # a line of one shape: its medians stay within its shape's range (~100 us or ~1000 us)
        assert np.ptp(y) < 0.5, (key, y)
    assert seen == keys
    names = [lab.text for _s, lab in hv.legend.items]
    assert len(set(names)) == 2  # the legend names the shapes apart
    vb = hv.plot.getPlotItem().vb
    assert not hv.legend.sceneBoundingRect().intersects(vb.sceneBoundingRect())  # legend not over the data


def _live_plot_as_after_a_run(lp):
    """The live panel's KL plot as after the screenshots' 8-step int8_seed decode: KL 4e-4 .. 1e-6 on its log
    axis (tick labels 10^-5, 10^-6 widen the left axis), the running top-1 agreement 1.0 on the right axis."""
    kl = np.array([1.3e-4, 4.5e-5, 1.0e-4, 1.6e-4, 5.0e-5, 1.2e-4, 4.1e-4, 1.0e-6])
    x = np.arange(len(kl), dtype=np.float64)
    lp.kl_curve.setData(x, kl)
    lp.agree_curve.setData(x, np.ones_like(x))
    lp.agree_vb.setYRange(0, 1.05, padding=0)
    lp._sync_views()
    lp.kl_plot.setXRange(-0.5, len(kl) - 0.5, padding=0.02)
    lp.kl_plot.enableAutoRange(axis="y")


def test_a_fitted_title_never_holds_its_plot_wider_than_the_view(qtbot):
    """fit_title wraps a title to its plot's view box, and the title's width is no minimum width of the plot:
    however narrow the view, the plot and its right axis stay inside it and the title inside the plot."""
    from PySide6.QtWidgets import QApplication

    from kvviz.ui.style import fit_title

    glw = pg.GraphicsLayoutWidget()
    qtbot.addWidget(glw)
    plot = glw.addPlot(row=0, col=0)
    plot.setLabel("left", "KL (nats)")
    plot.setLabel("bottom", "step")
    plot.showAxis("right")
    plot.getAxis("right").setLabel("top-1")
    plot.setLogMode(y=True)
    plot.plot([0, 1, 2, 3], [1e-4, 1e-6, 3e-5, 2e-4])
    bar = pg.ColorBarItem(values=(0, 1), colorMap=pg.colormap.get("viridis"), interactive=False, width=12)
    glw.addItem(bar, row=0, col=1)
    fit_title(plot, ["next-token KL(f32 || quant)", "teacher-forced", "a much longer third part of the title"], "9pt")
    glw.resize(700, 300)
    glw.show()
    qtbot.waitExposed(glw)
    lines = []
    for width in (700, 420, 377, 320, 700):
        glw.resize(width, 300)
        for _ in range(5):
            qtbot.wait(30)
            QApplication.processEvents()
        vw = glw.viewport().width()
        assert glw.ci.geometry().width() <= vw + 1, (width, glw.ci.geometry().width(), vw)
        assert plot.getAxis("right").sceneBoundingRect().right() <= vw + 1, width
        title = plot.titleLabel.item.sceneBoundingRect()
        assert title.left() >= plot.vb.sceneBoundingRect().left() - 2, width
        assert title.right() <= plot.vb.sceneBoundingRect().right() + 2, width
        assert cut_text(glw) == [], width
        lines.append(plot.titleLabel.text.count("<br>") + 1)
    assert lines[0] < lines[3] and lines[-1] == lines[0], lines  # wraps when narrow, unwraps when wide again
