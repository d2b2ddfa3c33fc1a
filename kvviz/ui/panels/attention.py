"""Attention error panel: f32 vs quantised attention weights over positions for one (sequence, query
head), their difference, and every head's error metrics as a heatmap and a table.
"""
from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QRectF, Qt
from PySide6.QtWidgets import (
    QAbstractItemView, QCheckBox, QComboBox, QGraphicsRectItem, QSpinBox, QSplitter, QTableWidget, QTableWidgetItem,
)

from kvviz.tables import attention_weights_table, head_metrics_table
from kvviz.ui.panels.base import Panel
from kvviz.ui.panels.scales import to_uint8
from kvviz import units
from kvviz.ui.style import Q_COLOR, REF_COLOR, V_COLOR, fit_title, legend_below, lut_viridis
from kvviz.ui.widgets.axes import color_bar, set_axis, set_bar_label, set_bar_range
from kvviz.ui.widgets.hover import Hover

# (metric key, combo box text, colour bar title, its unit in words)
METRICS = [("kl", "KL(f32 || quant)", "KL (nats)", "nats"), ("max_weight_err", "max |w err|", "max |weight error|", ""),
           ("rel_l2", "rel L2 of output", "output rel. L2 error", ""), ("cosine", "1 - cosine", "1 - output cosine", ""),
           ("topk_overlap", "1 - top-k overlap", "1 - top-k overlap", "")]


class AttentionPanel(Panel):
    key = "attention"
    title = "Attention error"
    baseline_keys = ("kl_mean", "kl_max", "cosine_min", "rel_l2_mean", "topk_overlap_mean", "max_weight_err")  # said against the pinned run (Panel.sync_deltas)

    def __init__(self, state=None, parent=None):
        super().__init__(state, parent)
        self.weights = self.heads = None
        self.seq = QComboBox()
        self.seq.setSizeAdjustPolicy(QComboBox.AdjustToContents)
        self.head = QSpinBox()
        self.head.setPrefix("head ")
        self.metric_box = QComboBox()
        for k, label, _bar, _unit in METRICS:
            self.metric_box.addItem(label, k)
        self.metric_box.setToolTip("Metric of the per-head heatmap")
        self.log_w = QCheckBox("log")
        self.log_w.setToolTip("Log scale for the weights (attention sinks dwarf the rest on a linear scale)")
        self.log_w.setChecked(True)
        self.log_w.toggled.connect(lambda on: self.w_plot.setLogMode(x=False, y=on))
        for w in (self.seq, self.head, self.log_w, self.metric_box):
            self.tools.addWidget(w)
        self.seq.currentIndexChanged.connect(self._sel_changed)
        self.head.valueChanged.connect(self._sel_changed)
        self.metric_box.currentIndexChanged.connect(lambda *_: self._draw_heatmap())

        split = QSplitter(Qt.Vertical)
        self.glw = pg.GraphicsLayoutWidget()
        self.w_plot = self.glw.addPlot(row=0, col=0, colspan=2)
        self.w_plot.setMinimumHeight(150)  # its axis label and the legend under it whole in a short dock
        set_axis(self.w_plot, "left", "weight")
        set_axis(self.w_plot, "bottom", "position in the sequence (token)")
        self.w_plot.setLogMode(x=False, y=True)
        self.w_plot.showGrid(x=True, y=True, alpha=0.25)
        legend_below(self.w_plot, columns=2)
        self.ref_curve = self.w_plot.plot(pen=pg.mkPen(REF_COLOR, width=1.5), name="f32")
        self.q_curve = self.w_plot.plot(pen=pg.mkPen(Q_COLOR, width=1.2, style=Qt.DashLine), name="quantised")
        self.d_plot = self.glw.addPlot(row=1, col=0)
        # quant - f32 (a short title: the axis is short); a common power of ten goes into the title
        set_axis(self.d_plot, "left", "\u0394w")
        self.d_plot.getAxis("left").setToolTip("quantised weight - f32 weight")
        set_axis(self.d_plot, "bottom", "position (token)")
        self.d_plot.showGrid(x=True, y=True, alpha=0.25)
        self.d_curve = self.d_plot.plot(pen=pg.mkPen(V_COLOR, width=1.0))
        self.h_plot = self.glw.addPlot(row=1, col=1)
        set_axis(self.h_plot, "bottom", "query head")
        set_axis(self.h_plot, "left", "seq")  # short: the heatmap is short; its ticks name them (s0, s1, ...)
        self.h_plot.invertY(True)
        self.h_plot.setMouseEnabled(x=False, y=False)
        self.h_img = pg.ImageItem(axisOrder="row-major")
        self.h_img.setLookupTable(lut_viridis())
        self.h_plot.addItem(self.h_img)
        self.h_sel = QGraphicsRectItem(0, 0, 1, 1)
        self.h_sel.setPen(pg.mkPen((255, 60, 60), width=2))
        self.h_plot.addItem(self.h_sel)
        self.h_bar = color_bar(label="KL", unit="")
        self.glw.addItem(self.h_bar, row=1, col=2)
        # hover readouts on every plot; a click on a heatmap cell shows that sequence and head above
        self.w_hover = Hover(self.w_plot, self._describe_position)
        self.d_hover = Hover(self.d_plot, self._describe_position)
        self.h_hover = Hover(self.h_plot, self._describe_cell, crosshair="")
        self.h_hover.clicked.connect(self._cell_clicked)
        # the per-head heatmap a third of the row: its title no longer holds it wider than its share (a title
        # holds no width, kvviz.ui.style.fit_title), and a quarter left 8 heads ~80 px at 1280x800
        self.glw.ci.layout.setColumnStretchFactor(0, 2)
        self.glw.ci.layout.setColumnStretchFactor(1, 1)
        split.addWidget(self.glw)
        self.table = QTableWidget()
        self.table.setEditTriggers(QAbstractItemView.NoEditTriggers)
        self.table.setSelectionBehavior(QAbstractItemView.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SingleSelection)
        self.table.verticalHeader().setVisible(False)
        self.table.verticalHeader().setDefaultSectionSize(19)
        self.table.cellClicked.connect(self._row_clicked)
        split.addWidget(self.table)
        split.setStretchFactor(0, 3)
        split.setStretchFactor(1, 1)
        self.body.addWidget(split, 1)

    def selection(self) -> tuple:
        return max(0, self.seq.currentIndex()), self.head.value()

    def set_selection(self, seq: int, head: int) -> None:
        self.seq.setCurrentIndex(seq)
        self.head.setValue(head)

    def refresh(self) -> None:
        res = self.res
        if res is None:
            return
        S, H = res.metrics.kl.shape
        cur = self.seq.currentIndex()
        self.seq.blockSignals(True)
        self.head.blockSignals(True)
        self.seq.clear()
        self.seq.addItems([f"seq {s} ({int(res.batch.context_lens[s])} tok)" for s in range(S)])
        self.seq.setCurrentIndex(cur if 0 <= cur < S else 0)
        self.head.setRange(0, H - 1)
        self.seq.blockSignals(False)
        self.head.blockSignals(False)
        self.heads = head_metrics_table(res)
        t = self.table
        t.clear()
        t.setRowCount(len(self.heads.rows))
        t.setColumnCount(len(self.heads.columns))
        t.setHorizontalHeaderLabels(self.heads.columns)
        for i, row in enumerate(self.heads.rows):
            for j, v in enumerate(row):
                it = QTableWidgetItem(str(v) if j < 2 else f"{v:.4g}")
                it.setTextAlignment(Qt.AlignRight | Qt.AlignVCenter)
                t.setItem(i, j, it)
        t.resizeColumnsToContents()
        summ = res.metrics.summary()
        self.info.setText(f"KL mean {summ['kl_mean']:.3g}, cos min {summ['cosine_min']:.5f}, "
                          f"rel L2 mean {summ['rel_l2_mean']:.3g}")
        self._draw_heatmap()
        self._draw_weights()

    def _heat_values(self) -> np.ndarray:
        res = self.res
        key = self.metric_box.currentData()
        a = np.asarray(getattr(res.metrics, key), np.float64)
        if key in ("cosine", "topk_overlap"):
            a = 1.0 - a
        return a

    def _draw_heatmap(self) -> None:
        if self.res is None:
            return
        a = self._heat_values()
        vmax = float(np.nanmax(a)) if a.size else 0.0
        self.h_img.setImage(to_uint8(a, vmax), levels=(0, 255), autoLevels=False)
        self.h_img.setRect(QRectF(0, 0, a.shape[1], a.shape[0]))
        self.h_plot.getAxis("left").setTicks([[(s + 0.5, f"s{s}") for s in range(a.shape[0])]])
        step = max(1, -(-a.shape[1] // 8))  # head labels at the cells' centres, at most 8 of them
        self.h_plot.getAxis("bottom").setTicks([[(h + 0.5, str(h)) for h in range(0, a.shape[1], step)]])
        _key, _text, bar_title, unit = METRICS[max(0, self.metric_box.currentIndex())]
        set_bar_label(self.h_bar, bar_title)
        set_bar_range(self.h_bar, vmax)
        self.h_plot.setRange(xRange=(0, a.shape[1]), yRange=(0, a.shape[0]), padding=0)
        fit_title(self.h_plot, [self.metric_box.currentText(), f"0 .. {vmax:.3g}"], "9pt", share=0.3)
        self._mark_selection()

    def _describe_position(self, x: float, y: float) -> str | None:
        if self.weights is None or not len(self.weights):
            return None
        i = int(round(x))
        if not 0 <= i < len(self.weights):
            return None
        _pos, wr, wq, d = self.weights.rows[i]
        return (f"position {i}\nf32 {units.si(wr, '', 4)}\nquantised {units.si(wq, '', 4)}\n"
                f"\u0394 {units.si(d, '', 3)}")

    def _cell(self, x: float, y: float) -> tuple[int, int] | None:
        if self.res is None:
            return None
        S, H = self.res.metrics.kl.shape
        s, h = int(y // 1), int(x // 1)
        return (s, h) if 0 <= s < S and 0 <= h < H and x >= 0 and y >= 0 else None

    def _describe_cell(self, x: float, y: float) -> str | None:
        cell = self._cell(x, y)
        if cell is None:
            return None
        s, h = cell
        _key, _text, bar_title, unit = METRICS[max(0, self.metric_box.currentIndex())]
        v = float(self._heat_values()[s, h])
        return f"seq {s}, head {h}\n{bar_title}: {units.si(v, '', 4)}\n(click: show its weights above)"

    def _cell_clicked(self, x: float, y: float) -> None:
        cell = self._cell(x, y)
        if cell is not None:
            self.set_selection(*cell)

    def _mark_selection(self) -> None:
        s, h = self.selection()
        self.h_sel.setRect(h, s, 1, 1)

    def _sel_changed(self, *args) -> None:
        if self.res is not None:
            self._draw_weights()
            self.selection_changed.emit()

    def _row_clicked(self, row: int, col: int) -> None:
        s, h = self.heads.rows[row][0], self.heads.rows[row][1]
        self.set_selection(int(s), int(h))

    def _draw_weights(self) -> None:
        res = self.res
        s, h = self.selection()
        self.weights = attention_weights_table(res, s, h)
        x = self.weights.column("position").astype(np.float64)
        floor = 1e-12  # log axis: exact zeros (zero-K presets) would vanish
        self.ref_curve.setData(x, np.maximum(self.weights.column("w_f32").astype(np.float64), floor))
        self.q_curve.setData(x, np.maximum(self.weights.column("w_quant").astype(np.float64), floor))
        self.d_curve.setData(x, self.weights.column("diff").astype(np.float64))
        m = res.metrics
        fit_title(self.w_plot, [f"seq {s}, head {h}: KL {m.kl[s, h]:.3g}", f"max |err| {m.max_weight_err[s, h]:.3g}",
                                f"cos {m.cosine[s, h]:.5f}", f"top-{m.k} {m.topk_overlap[s, h]:.2f}"], "9pt", share=0.78)
        self.w_plot.enableAutoRange()
        self.d_plot.enableAutoRange()
        self._mark_selection()

    def tables(self) -> list:
        return [t for t in (self.weights, self.heads) if t is not None]
