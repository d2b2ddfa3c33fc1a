"""Scales panel: per-token K and V scales vs position for one (sequence, KV head), and the per-channel
|K| / |V| maxima of every (sequence, KV head) as heatmaps, where outlier channels show as bright columns.
"""
from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QRectF, Qt
from PySide6.QtWidgets import QComboBox, QSpinBox

from kvviz.metrics import outlier_ratio
from kvviz.tables import channel_amax_table, token_scales_table
from kvviz.ui.panels.base import Panel
from kvviz import units
from kvviz.ui.style import K_COLOR, V_COLOR, fit_title, lut_viridis
from kvviz.ui.widgets.axes import color_bar, set_axis, set_bar_range
from kvviz.ui.widgets.hover import Hover

UNSCALED_BRUSH = (120, 120, 120, 40)  # the positions a method keeps unquantised (no scale)


def to_uint8(a: np.ndarray, vmax: float) -> np.ndarray:
    """Heatmap values -> uint8 with fixed levels (0, 255): 0 -> 0, vmax -> 255."""
    a = np.asarray(a, np.float64)
    if not vmax > 0:
        return np.zeros(a.shape, np.uint8)
    return np.clip(np.round(a / vmax * 255.0), 0, 255).astype(np.uint8)


class ScalesPanel(Panel):
    key = "scales"
    title = "Scales"

    def __init__(self, state=None, parent=None):
        super().__init__(state, parent)
        self.scale_table = self.k_amax = self.v_amax = None
        self.seq = QComboBox()
        self.seq.setSizeAdjustPolicy(QComboBox.AdjustToContents)
        self.seq.setToolTip("Sequence")
        self.kv_head = QSpinBox()
        self.kv_head.setPrefix("KV head ")
        self.tools.addWidget(self.seq)
        self.tools.addWidget(self.kv_head)
        self.seq.currentIndexChanged.connect(self._sel_changed)
        self.kv_head.valueChanged.connect(self._sel_changed)

        self.glw = pg.GraphicsLayoutWidget()
        self.glw.setMinimumSize(150, 150)
        # K scale on the left axis, V scale on a right axis of its own (they differ by ~10x)
        self.s_plot = self.glw.addPlot(row=0, col=0)
        set_axis(self.s_plot, "bottom", "position (token)")
        set_axis(self.s_plot, "left", "K scale").labelStyle = {"color": "#1f77b4"}
        self.s_plot.showGrid(x=True, y=True, alpha=0.25)
        # a position without a scale (NaN) is a gap in the line, not a drop to 0
        self.k_curve = self.s_plot.plot(pen=pg.mkPen(K_COLOR, width=1.5), name="K", connect="finite")
        self.v_view = pg.ViewBox()
        self.s_plot.showAxis("right")
        self.s_plot.scene().addItem(self.v_view)
        set_axis(self.s_plot, "right", "V scale").labelStyle = {"color": "#d62728"}
        self.s_plot.getAxis("right").linkToView(self.v_view)
        self.s_plot.getAxis("right").set_unit("V scale")
        self.s_plot.getAxis("left").set_unit("K scale")
        self._unscaled: list = []  # shaded regions (and their labels) of the positions without a scale
        # its view box at least as tall as the labels that run along its axes ("K scale", "V scale"): a short
        # dock (the live layout's tabs at 1280x800) gave it 34 px for 55 px of label
        self.s_plot.vb.setMinimumHeight(4 + max(self.s_plot.getAxis(side).label.boundingRect().width()
                                                for side in ("left", "right")))
        self.v_view.setXLink(self.s_plot)
        self.v_curve = pg.PlotDataItem(pen=pg.mkPen(V_COLOR, width=1.5), name="V", connect="finite")
        self.v_view.addItem(self.v_curve)
        self.s_plot.vb.sigResized.connect(self._sync_views)
        self.k_plot = self.v_plot = self.s_plot
        self.k_heat_plot = self.glw.addPlot(row=1, col=0)
        self.v_heat_plot = self.glw.addPlot(row=2, col=0)
        self.v_heat_plot.setXLink(self.k_heat_plot)
        lut = lut_viridis()
        self.k_img = pg.ImageItem(axisOrder="row-major")
        self.v_img = pg.ImageItem(axisOrder="row-major")
        for p, img in ((self.k_heat_plot, self.k_img), (self.v_heat_plot, self.v_img)):
            img.setLookupTable(lut)
            p.addItem(img)
            p.invertY(True)
            p.setMouseEnabled(x=True, y=False)
        self.k_sel = pg.InfiniteLine(angle=0, pen=pg.mkPen((255, 80, 80), width=1.5))
        self.v_sel = pg.InfiniteLine(angle=0, pen=pg.mkPen((255, 80, 80), width=1.5))
        self.k_heat_plot.addItem(self.k_sel)
        self.v_heat_plot.addItem(self.v_sel)
        for p in (self.k_heat_plot, self.v_heat_plot):
            set_axis(p, "bottom", "channel")  # rows: each sequence's KV heads, named by the ticks (s0, s1, ...)
            # and by the hover readout; no row title: in a short dock the heatmap is a few rows of pixels tall
        self.k_bar, self.v_bar = color_bar(label="max |K|"), color_bar(label="max |V|")
        self.s_hover = Hover(self.s_plot, self._describe_position, crosshair="x")
        self.k_hover = Hover(self.k_heat_plot, lambda x, y: self._describe_cell("K", x, y), crosshair="")
        self.v_hover = Hover(self.v_heat_plot, lambda x, y: self._describe_cell("V", x, y), crosshair="")
        self.k_hover.clicked.connect(self._cell_clicked)
        self.v_hover.clicked.connect(self._cell_clicked)
        self.glw.addItem(self.k_bar, row=1, col=1)
        self.glw.addItem(self.v_bar, row=2, col=1)
        for r in range(3):
            self.glw.ci.layout.setRowStretchFactor(r, 1)
        self.body.addWidget(self.glw, 1)

    def _sync_views(self) -> None:
        self.v_view.setGeometry(self.s_plot.vb.sceneBoundingRect())
        self.v_view.linkedViewChanged(self.s_plot.vb, self.v_view.XAxis)

    def refresh(self) -> None:
        res = self.res
        if res is None:
            return
        S, kvh = res.batch.num_seqs, res.key.shape[1]
        cur = self.seq.currentIndex()
        self.seq.blockSignals(True)
        self.kv_head.blockSignals(True)
        self.seq.clear()
        self.seq.addItems([f"seq {s} ({int(res.batch.context_lens[s])} tok)" for s in range(S)])
        self.seq.setCurrentIndex(cur if 0 <= cur < S else 0)
        self.kv_head.setRange(0, kvh - 1)
        self.seq.blockSignals(False)
        self.kv_head.blockSignals(False)
        self.k_amax = channel_amax_table(res, "K")
        self.v_amax = channel_amax_table(res, "V")
        step = max(1, -(-S // 8))
        ticks = [[(s * kvh + kvh / 2, f"s{s}") for s in range(0, S, step)],
                 [(float(r), "") for r in range(0, S * kvh + 1, kvh)]]
        ratios = []
        for which, plot, img, arr in (("K", self.k_heat_plot, self.k_img, res.k_channel_amax),
                                      ("V", self.v_heat_plot, self.v_img, res.v_channel_amax)):
            a = np.asarray(arr, np.float64).reshape(S * kvh, -1)
            vmax = float(a.max()) if a.size else 0.0
            img.setImage(to_uint8(a, vmax), levels=(0, 255), autoLevels=False)
            img.setRect(QRectF(0, 0, a.shape[1], a.shape[0]))
            set_bar_range(self.k_bar if which == "K" else self.v_bar, vmax)
            plot.getAxis("left").setTicks(ticks)
            ratio = outlier_ratio(arr) if a.size else float("nan")
            fit_title(plot, [f"max|{which}| per channel", f"0..{vmax:.3g}"], "8pt", share=0.86)
            plot.getAxis("left").setToolTip("rows: sequence x KV head")
            ratios.append(f"{which} max/median {ratio:.1f}")
            plot.setRange(xRange=(0, a.shape[1]), yRange=(0, a.shape[0]), padding=0)
        self._ratios = ", ".join(ratios)
        self._draw_scales()

    def _sel_changed(self, *args) -> None:
        if self.res is not None:
            self._draw_scales()
            self.selection_changed.emit()

    def selection(self) -> tuple:
        return max(0, self.seq.currentIndex()), self.kv_head.value()

    def _draw_scales(self) -> None:
        res = self.res
        s, h = self.selection()
        self.scale_table = token_scales_table(res, s, h)
        x = self.scale_table.column("position").astype(np.float64)
        self.k_curve.setData(x, self.scale_table.column("k_scale").astype(np.float64))
        self.v_curve.setData(x, self.scale_table.column("v_scale").astype(np.float64))
        fit_title(self.s_plot, ["scale per token", f"seq {s} / KV head {h}"], "8pt")
        self.s_plot.enableAutoRange()
        self.v_view.enableAutoRange(axis=pg.ViewBox.YAxis)
        self._sync_views()
        self._mark_unscaled(x, self.scale_table.column("k_scale").astype(np.float64),
                            self.scale_table.column("v_scale").astype(np.float64))
        kvh = res.key.shape[1]
        row = s * kvh + h + 0.5
        self.k_sel.setPos(row)
        self.v_sel.setPos(row)
        note = self.scale_table.title.split("(", 1)[1].rstrip(")") if "(" in self.scale_table.title else ""
        self.info.setText(f"{len(self.scale_table)} tokens; {getattr(self, '_ratios', '')}" + (f"; {note}" if note else ""))

    def _mark_unscaled(self, x, k, v) -> None:
        """Shade each run of positions without a scale (both K and V missing: the method keeps them unquantised)
        and say so in the run, so that the gap in the lines reads as a region, not as missing data."""
        for item in self._unscaled:
            self.s_plot.removeItem(item)
        self._unscaled = []
        none = ~np.isfinite(k) & ~np.isfinite(v)
        if not none.any() or len(x) == 0:
            return
        edges = np.flatnonzero(np.diff(np.concatenate([[0], none.astype(np.int8), [0]])))
        for a, b in zip(edges[::2], edges[1::2]):
            lo, hi = float(x[a]) - 0.5, float(x[b - 1]) + 0.5
            region = pg.LinearRegionItem((lo, hi), movable=False, brush=pg.mkBrush(*UNSCALED_BRUSH),
                                         pen=pg.mkPen((120, 120, 120, 120)))
            region.setZValue(-10)
            self.s_plot.addItem(region, ignoreBounds=True)
            label = pg.TextItem("float32:\nno scale", color=(70, 70, 70), anchor=(0.5, 0))
            self.s_plot.addItem(label, ignoreBounds=True)
            self._unscaled += [region, label]
            self._place_unscaled_label(label, (lo + hi) / 2)
        self.s_plot.vb.sigRangeChanged.connect(self._replace_unscaled_labels, Qt.UniqueConnection)

    def _place_unscaled_label(self, label, x: float) -> None:
        (_x0, _x1), (_y0, y1) = self.s_plot.vb.viewRange()
        label.setPos(x, y1)

    def _replace_unscaled_labels(self, *_) -> None:
        for item in self._unscaled:
            if isinstance(item, pg.TextItem):
                self._place_unscaled_label(item, item.pos().x())

    def _describe_position(self, x: float, y: float) -> str | None:
        t = self.scale_table
        if t is None or not len(t):
            return None
        pos = t.column("position").astype(np.float64)
        i = int(np.argmin(np.abs(pos - x)))
        if abs(pos[i] - x) > 0.5:
            return None
        _p, k, v = t.rows[i]
        none = "none (kept in float32)"
        return (f"position {int(pos[i])}\nK scale {units.si(k, '', 4) if np.isfinite(k) else none}\n"
                f"V scale {units.si(v, '', 4) if np.isfinite(v) else none}")

    def _describe_cell(self, which: str, x: float, y: float) -> str | None:
        res = self.res
        if res is None:
            return None
        arr = res.k_channel_amax if which == "K" else res.v_channel_amax
        S, kvh, D = np.asarray(arr).shape
        r, c = int(y // 1), int(x // 1)
        if not (0 <= r < S * kvh and 0 <= c < D and x >= 0 and y >= 0):
            return None
        s, h = divmod(r, kvh)
        return f"seq {s}, KV head {h}, channel {c}\nmax |{which}| {units.si(float(arr[s, h, c]), '', 4)}"

    def _cell_clicked(self, x: float, y: float) -> None:
        res = self.res
        if res is None or y < 0:
            return
        kvh = res.key.shape[1]
        r = int(y // 1)
        if 0 <= r < res.batch.num_seqs * kvh:
            s, h = divmod(r, kvh)
            self.seq.setCurrentIndex(s)
            self.kv_head.setValue(h)

    def tables(self) -> list:
        return [t for t in (self.scale_table, self.k_amax, self.v_amax) if t is not None]
