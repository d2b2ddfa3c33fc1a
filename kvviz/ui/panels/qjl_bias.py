"""QJL bias panel: TurboQuant's inner-product estimators against the true q.k on the current K/Q.

For the current results (any method) and a chosen sequence and query head, the head's query is
scored against every key of that sequence in its KV head: the keys go through the TurboQuant GPU
compressor (kvviz.families.turboquant.bias.inner_product_bias, run in the worker with the session's runtime)
and the three estimators are plotted against the true q.k, each with its least-squares slope through
the origin (dashed line; the fit with an intercept is in the table) and the y = x line.

The estimators: reference (QJL scale sqrt(pi/2)/d, as the reference code), unbiased (sqrt(pi/2)/sqrt(d),
unbiased for an orthonormal rotation), polar only (the 2-bit PolarQuant part, no QJL correction).
The rotation uses the TurboQuant method's seed and layer when the results are TurboQuant's, else the
default seed (42) and layer 0. TurboQuant needs a head size that is a power of two, <= 128 and a
multiple of 32; for any other head size the panel says why instead of plotting.
"""
from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QAbstractItemView, QComboBox, QLabel, QSpinBox, QSplitter, QStackedWidget, QTableWidget, QTableWidgetItem,
)

from kvviz.families.turboquant.bias import DEFAULT_SEED, ESTIMATORS, unsupported_reason  # noqa: F401 (re-exported)
from kvviz.tables import Table
from kvviz.ui.panels.base import Panel
from kvviz.ui.style import SEQ_COLORS, fit_legend_columns, fit_title, legend_below
from kvviz.ui.widgets.axes import set_axis
from kvviz.ui.widgets.hover import Hover

EST_LABELS = {
    "reference": "reference  \u221a(\u03c0/2)/d",
    "unbiased": "unbiased  \u221a(\u03c0/2)/\u221ad",
    "polar_only": "polar only",
}
EST_COLORS = {"reference": SEQ_COLORS[0], "unbiased": SEQ_COLORS[2], "polar_only": SEQ_COLORS[1]}


def tq_params(res) -> tuple[int, int]:
    """(seed, layer) of the TurboQuant rotation for these results: the method's own when it is TurboQuant."""
    opts = {}
    try:
        opts = dict(res.method.options()) if res.method.id == "turboquant" else {}
    except Exception:  # noqa: BLE001 - a method without options
        opts = {}
    return int(opts.get("seed", DEFAULT_SEED)), int(getattr(res.method, "layer", 0))


def tq_setting(res) -> dict:
    """The TurboQuant setting the estimators are drawn at: the results' method's bits and outlier share when
    it is TurboQuant (kvviz.families.turboquant.bias takes every setting), else the seed configuration ({})."""
    try:
        if res.method.id == "turboquant":
            return {"bits": int(res.method.bits), "outlier_share": float(res.method.outlier_share)}
    except AttributeError:
        pass
    return {}


def bias_inputs(res, seq: int, head: int):
    """(q [d], K [n, d], positions [n], kv_head) of (seq, head) of the results, keys in position order."""
    H, kvh = res.q.shape[1], res.key.shape[1]
    group = max(1, H // kvh)
    kv_head = head // group
    rows = res.batch.token_rows(seq)
    q = np.ascontiguousarray(res.q[seq, head], dtype=np.float32)
    K = np.ascontiguousarray(res.key[rows, kv_head], dtype=np.float32)
    pos = np.asarray(res.batch.token_pos[rows], dtype=np.int64)
    return q, K, pos, kv_head


class QjlBiasPanel(Panel):
    key = "qjl_bias"
    title = "QJL bias"
    bias_requested = Signal()  # the window runs inner_product_bias in the worker, then calls set_bias

    def __init__(self, state=None, parent=None):
        super().__init__(state, parent)
        self.bias = None  # BiasResult shown
        self.shown = None  # (results, seq, head) of the BiasResult shown
        self.points = self.fits = None
        self.reason = ""
        self._dirty = False
        self._on_screen = None  # None: not in a dock (use isVisible); else the dock's visibilityChanged
        self.seq = QComboBox()
        self.seq.setSizeAdjustPolicy(QComboBox.AdjustToContents)
        self.seq.setToolTip("Sequence whose keys are scored")
        self.head = QSpinBox()
        self.head.setPrefix("head ")
        self.head.setToolTip("Query head (its KV head's keys are scored)")
        for w in (self.seq, self.head):
            self.tools.addWidget(w)
        self.seq.currentIndexChanged.connect(self._sel_changed)
        self.head.valueChanged.connect(self._sel_changed)

        self.stack = QStackedWidget()
        self.message = QLabel("No results yet.")
        self.message.setWordWrap(True)
        self.message.setAlignment(Qt.AlignCenter)
        self.message.setTextInteractionFlags(Qt.TextSelectableByMouse)
        self.message.setStyleSheet("color: #44505c; font-size: 10pt; padding: 18px;")
        self.stack.addWidget(self.message)

        split = QSplitter(Qt.Vertical)
        self.plot = pg.PlotWidget()
        pi = self.plot.getPlotItem()
        set_axis(pi, "bottom", "true q\u00b7k")
        set_axis(pi, "left", "est. q\u00b7k")  # short: a short dock gives the axis little height
        pi.showGrid(x=True, y=True, alpha=0.25)
        legend_below(pi, columns=2)  # under the axis: never over the points
        self.hover = Hover(pi)  # crosshair and readout in the axes' units
        self.diag = pi.plot(pen=pg.mkPen((60, 60, 60), width=1, style=Qt.DashLine), name="y = x")
        self.curves, self.slope_lines = {}, {}
        for name in ESTIMATORS:
            col = EST_COLORS[name]
            self.curves[name] = pi.plot(pen=None, symbol="o", symbolSize=5, symbolPen=None,
                                        symbolBrush=pg.mkBrush(*col, 150), name=EST_LABELS[name])
            self.slope_lines[name] = pi.plot(pen=pg.mkPen(col, width=1.4, style=Qt.DashDotLine))
        self.plot.setMinimumHeight(240)  # title, legend and axes leave the data room: a short dock scrolls instead
        split.setChildrenCollapsible(False)
        split.addWidget(self.plot)
        self.table = QTableWidget()
        self.table.setEditTriggers(QAbstractItemView.NoEditTriggers)
        self.table.verticalHeader().setVisible(False)
        self.table.verticalHeader().setDefaultSectionSize(19)
        self.table.setToolTip("Slope through the origin: est ~ a\u00b7true; fit: est ~ a\u00b7true + b (least squares)")
        split.addWidget(self.table)
        split.setStretchFactor(0, 4)
        split.setStretchFactor(1, 1)
        self.stack.addWidget(split)
        self.body.addWidget(self.stack, 1)

    # ------------------------------------------------------------- selection
    def selection(self) -> tuple:
        return max(0, self.seq.currentIndex()), self.head.value()

    def set_selection(self, seq: int, head: int) -> None:
        self.seq.setCurrentIndex(seq)
        self.head.setValue(head)

    def params(self) -> tuple[int, int]:
        return tq_params(self.res) if self.res is not None else (0, 0)

    def inputs(self):
        """(q, K, seed, layer) the worker scores for the current selection."""
        s, h = self.selection()
        q, K, _, _ = bias_inputs(self.res, s, h)
        seed, layer = self.params()
        return q, K, seed, layer

    def _sel_changed(self, *args) -> None:
        if self.res is not None and not self.reason:
            self.selection_changed.emit()
            self._request()

    # ------------------------------------------------------------------ data
    def refresh(self) -> None:
        res = self.res
        if res is None:
            return
        S, H = res.q.shape[0], res.q.shape[1]
        cur = self.seq.currentIndex()
        self.seq.blockSignals(True)
        self.head.blockSignals(True)
        self.seq.clear()
        self.seq.addItems([f"seq {s} ({int(res.batch.context_lens[s])} tok)" for s in range(S)])
        self.seq.setCurrentIndex(cur if 0 <= cur < S else 0)
        self.head.setRange(0, H - 1)
        self.seq.blockSignals(False)
        self.head.blockSignals(False)
        d = int(res.key.shape[2])
        self.reason = unsupported_reason(d, **tq_setting(res))
        if self.reason:
            self.bias = self.shown = self.points = self.fits = None
            self.show_message(f"TurboQuant cannot take these keys (head size {d}), so there is no QJL bias to show.\n\n"
                              f"{self.reason}")
            self.info.setText(f"head size {d}: not supported by TurboQuant")
            return
        self._request()

    def on_screen(self) -> bool:
        return self.isVisible() if self._on_screen is None else self._on_screen

    def set_on_screen(self, visible: bool) -> None:
        """The dock's visibilityChanged: a tabbed dock behind another tab is not on screen (the estimate
        waits until it is raised)."""
        self._on_screen = bool(visible)
        if visible and self._dirty and self.res is not None and not self.reason:
            self._request()

    def _request(self) -> None:
        """Ask for a new estimate now if the panel is on screen, else when it is shown."""
        if self.on_screen():
            self._dirty = False
            s, h = self.selection()
            self.info.setText(f"seq {s}, head {h}: compressing keys on the GPU ...")
            self.bias_requested.emit()
        else:
            self._dirty = True

    def showEvent(self, ev) -> None:  # noqa: N802 - Qt naming
        super().showEvent(ev)
        if self._on_screen is None and self._dirty and self.res is not None and not self.reason:
            self._request()

    def show_message(self, text: str) -> None:
        self.message.setText(text)
        self.stack.setCurrentIndex(0)

    def set_error(self, exc: BaseException) -> None:
        hint = getattr(exc, "hint", "")
        self.show_message(f"Could not estimate the bias: {exc}" + (f"\n{hint}" if hint else ""))
        self.info.setText("failed")

    def set_bias(self, bias, seq: int, head: int) -> None:
        """Draw a kvviz.families.turboquant.bias.BiasResult of (seq, head) of the current results."""
        res = self.res
        self.bias = bias
        self.shown = (res, seq, head)
        _, _, pos, kv_head = bias_inputs(res, seq, head)
        n = int(bias.true.size)
        true = np.asarray(bias.true, np.float64)
        self.points = Table("points", ["position", "true_qk"] + [f"est_{e}" for e in ESTIMATORS],
                            title=f"seq {seq}, head {head} (KV head {kv_head}): estimated vs true q.k")
        for i in range(n):
            self.points.rows.append([int(pos[i]), float(true[i])] + [float(bias.est[e][i]) for e in ESTIMATORS])
        self.fits = Table("fits", ["estimator", "qjl_scale", "slope_origin", "fit_slope", "fit_intercept", "rmse", "n"],
                          title="least-squares slopes: through the origin, and with an intercept")
        for e in ESTIMATORS:
            a, b = bias.fits[e]
            rmse = float(np.sqrt(np.mean((np.asarray(bias.est[e]) - true) ** 2))) if n else float("nan")
            self.fits.rows.append([e, float(bias.qjl_scales.get(e, 0.0)), float(bias.slopes[e]), a, b, rmse, n])

        lo, hi = (float(true.min()), float(true.max())) if n else (0.0, 1.0)
        span = max(hi - lo, 1e-9)
        xs = np.array([lo - 0.05 * span, hi + 0.05 * span])
        self.diag.setData(xs, xs)
        legend = self.plot.getPlotItem().legend
        for e in ESTIMATORS:
            self.curves[e].setData(true, np.asarray(bias.est[e], np.float64))
            self.slope_lines[e].setData(xs, bias.slopes[e] * xs)
            lab = legend.getLabel(self.curves[e]) if legend is not None else None
            if lab is not None:
                lab.setText(f"{EST_LABELS[e]}: slope {bias.slopes[e]:.3f}", size="8pt")
        if legend is not None:
            fit_legend_columns(self.plot.getPlotItem(), legend)  # the longer names in the plot's width
        fit_title(self.plot.getPlotItem(), [f"seq {seq}, head {head} \u2192 KV head {kv_head}: {n} keys", f"d = {bias.d}"],
                  "9pt")
        self.plot.getPlotItem().enableAutoRange()
        self._fill_table()
        seed, layer = self.params()
        self.info.setText("slopes (through 0): " + ", ".join(f"{e} {bias.slopes[e]:.3f}" for e in ESTIMATORS)
                          + f"  |  TurboQuant seed {seed}, layer {layer}")
        self.stack.setCurrentIndex(1)

    def _fill_table(self) -> None:
        t, tab = self.table, self.fits
        t.clear()
        t.setRowCount(len(tab.rows))
        t.setColumnCount(len(tab.columns))
        t.setHorizontalHeaderLabels(tab.columns)
        for i, row in enumerate(tab.rows):
            for j, v in enumerate(row):
                it = QTableWidgetItem(f"{v:.4g}" if isinstance(v, float) else str(v))
                if j:
                    it.setTextAlignment(Qt.AlignRight | Qt.AlignVCenter)
                t.setItem(i, j, it)
        t.resizeColumnsToContents()

    def n_points(self) -> int:
        return len(self.curves["reference"].getData()[0] if self.curves["reference"].getData()[0] is not None else [])

    def tables(self) -> list:
        return [t for t in (self.points, self.fits) if t is not None]
