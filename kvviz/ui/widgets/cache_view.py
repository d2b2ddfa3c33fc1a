"""The cache view of a live decode: one layer and KV head of the quantised cache.

Layer / KV head / query head selectors over two plots: the per-position K and V scales the quantised
cache holds (int8_seed: the f32 scale word of each token record; other methods: what their cache
stores per token, labelled) and the last step's attention weights over positions through the f32 and
the quantised cache. It draws a `LiveDecoder.cache_view` dict (kvviz/live/decode.py); which view to
read and when is the live run model's business (kvviz.live.run.CacheViewState).
"""
from __future__ import annotations

import html

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QComboBox, QHBoxLayout, QSpinBox, QVBoxLayout, QWidget

from kvviz.live.run import pick_weights, view_scales
from kvviz.ui.style import K_COLOR, Q_COLOR, V_COLOR
from kvviz.ui.widgets.axes import set_axis
from kvviz.ui.widgets.hover import Hover
from kvviz.ui.widgets.labels import ElidedLabel

W_BASE_COLOR = (150, 150, 150)  # f32 attention weights
MAX_BLOCK_LINES = 64  # block boundaries drawn in the scale plot (none past this many blocks)


def hex_color(rgb) -> str:
    return "#%02x%02x%02x" % tuple(int(c) for c in rgb[:3])


def plot_title(plot, text: str) -> None:
    """A 9pt plot title. Keep it short: pyqtgraph makes a title's width its plot's minimum width, so a
    long one pushes the plot beside it out of the view (and lowering that minimum makes the title resize
    during Qt's teardown at exit, after its text item is gone: a crash in PySide6 6.11)."""
    plot.setTitle(text, size="9pt")


class CacheView(QWidget):
    """Selectors and the two plots of one layer / KV head; `draw(view, pending)` shows a cache view."""

    selection_changed = Signal(int, int)  # layer, KV head chosen in the spin boxes
    q_head_changed = Signal()

    def __init__(self, parent=None):
        super().__init__(parent)
        self._heads = (9, 3)  # query heads, KV heads of the model (for the query-head choices)
        self._shape = None
        v = QVBoxLayout(self)
        v.setContentsMargins(0, 0, 0, 0)
        v.setSpacing(1)
        row = QHBoxLayout()
        row.setSpacing(4)
        self.layer_spin = QSpinBox()
        self.layer_spin.setPrefix("layer ")
        self.layer_spin.setRange(0, 0)
        self.layer_spin.setToolTip("Layer whose quantised cache is shown (default: a middle layer). While the "
                                   "decode runs, the decoder reads it after every step.")
        self.kv_spin = QSpinBox()
        self.kv_spin.setPrefix("KV head ")
        self.kv_spin.setRange(0, 0)
        self.kv_spin.setToolTip("KV head whose per-position scales are shown")
        self.qhead = QComboBox()
        self.qhead.setToolTip("Attention weights: the mean over the query heads that read this KV head, or one of them")
        self.qhead.setSizeAdjustPolicy(QComboBox.AdjustToContents)
        for w in (self.layer_spin, self.kv_spin, self.qhead):
            row.addWidget(w)
        self.view_note = ElidedLabel("")
        self.view_note.setStyleSheet("font-size: 8pt; color: #44505c;")
        row.addWidget(self.view_note, 1)
        v.addLayout(row)
        self.glw = pg.GraphicsLayoutWidget()
        # tall enough for a scale plot of real height under its title and over its position axis
        self.glw.setMinimumHeight(210)
        sp = self.scale_plot = self.glw.addPlot(row=0, col=0)
        set_axis(sp, "bottom", "position (token)")
        set_axis(sp, "left", "K scale")
        sp.showGrid(x=False, y=True, alpha=0.25)
        sp.getAxis("left").enableAutoSIPrefix(False)
        self.k_scale_curve = sp.plot(pen=pg.mkPen(K_COLOR, width=1.4), connect="finite")
        self.k_new = pg.ScatterPlotItem(size=7, brush=pg.mkBrush(K_COLOR), pen=None)
        sp.addItem(self.k_new)
        # V on a right axis of its own (V scales are often several times the K ones), as in the Scales panel
        self.v_scale_vb = pg.ViewBox(enableMouse=False)
        sp.showAxis("right")
        sp.scene().addItem(self.v_scale_vb)
        ra = set_axis(sp, "right", "V scale")
        ra.linkToView(self.v_scale_vb)
        ra.enableAutoSIPrefix(False)
        self.v_scale_vb.setXLink(sp)
        self.v_scale_curve = pg.PlotDataItem(pen=pg.mkPen(V_COLOR, width=1.4), connect="finite")
        self.v_new = pg.ScatterPlotItem(size=7, brush=pg.mkBrush(V_COLOR), pen=None)
        self.v_scale_vb.addItem(self.v_scale_curve)
        self.v_scale_vb.addItem(self.v_new)
        sp.vb.sigResized.connect(self._sync_scale_views)
        self.prompt_line = pg.InfiniteLine(angle=90, pen=pg.mkPen((120, 120, 120), width=1, style=Qt.DashLine))
        self.prompt_line.setToolTip("positions right of the line were written by decode steps, left by the prefill")
        self.prompt_line.setVisible(False)
        sp.addItem(self.prompt_line, ignoreBounds=True)
        self._block_lines: list = []
        self.scale_empty = pg.TextItem("", color=(110, 110, 110), anchor=(0.5, 0.5))
        self.scale_empty.setVisible(False)
        sp.addItem(self.scale_empty, ignoreBounds=True)
        sp.setToolTip("Per-position K (left axis) and V (right axis) scales of the quantised cache. Dotted: block "
                      "boundaries; dashed: the first position written by a decode step (left of it: the prefill); "
                      "dots: the position written by the last step.")
        wp = self.weights_plot = self.glw.addPlot(row=0, col=1)
        set_axis(wp, "bottom", "position (token)")
        set_axis(wp, "left", "weight")  # the plot's title says whose: a short view keeps the label whole
        wp.setLogMode(x=False, y=True)
        wp.showGrid(x=False, y=True, alpha=0.25)
        wp.getAxis("left").enableAutoSIPrefix(False)
        # f32 as a wide grey band under the quantised line: where they agree the orange runs inside the band
        self.w_base_curve = wp.plot(pen=pg.mkPen(W_BASE_COLOR, width=4))
        self.w_quant_curve = wp.plot(pen=pg.mkPen(Q_COLOR, width=1.3))
        self.glw.ci.layout.setColumnStretchFactor(0, 1)
        self.glw.ci.layout.setColumnStretchFactor(1, 1)
        self.scale_hover = Hover(sp)  # crosshair and readout in the axes' units
        self.weights_hover = Hover(wp)
        v.addWidget(self.glw, 1)
        self.layer_spin.valueChanged.connect(self._spun)
        self.kv_spin.valueChanged.connect(self._spun)
        self.qhead.currentIndexChanged.connect(lambda *_: self.q_head_changed.emit())
        self._fill_qheads(9, 3)
        self.draw(None)

    # ------------------------------------------------------------ selection
    def selection(self) -> tuple:
        """(layer, KV head) selected."""
        return int(self.layer_spin.value()), int(self.kv_spin.value())

    def set_selection(self, layer: int, kv_head: int) -> None:
        """Select a layer and KV head: one `selection_changed`, not one per spin box."""
        for w, val in ((self.layer_spin, layer), (self.kv_spin, kv_head)):
            w.blockSignals(True)
            w.setValue(int(val))
            w.blockSignals(False)
        self._spun()

    def set_shape(self, n_layers: int, n_heads: int, n_kv_heads: int) -> None:
        """Selector ranges of a model; a model of another shape resets them to a middle layer, KV head 0."""
        new = (n_layers, n_heads, n_kv_heads) != self._shape
        self._shape = (n_layers, n_heads, n_kv_heads)
        for w in (self.layer_spin, self.kv_spin):
            w.blockSignals(True)
        self.layer_spin.setRange(0, max(n_layers - 1, 0))
        self.kv_spin.setRange(0, max(n_kv_heads - 1, 0))
        if new:
            self.layer_spin.setValue(n_layers // 2)
            self.kv_spin.setValue(0)
        for w in (self.layer_spin, self.kv_spin):
            w.blockSignals(False)
        self._fill_qheads(n_heads, n_kv_heads)

    def _fill_qheads(self, n_heads: int, n_kv_heads: int) -> None:
        """Query-head choices of the selected KV head: their mean (data -1), or one of them (its index in the group)."""
        self._heads = (n_heads, n_kv_heads)
        g = max(n_heads // max(n_kv_heads, 1), 1)
        h0 = self.kv_spin.value() * g
        keep = self.qhead.currentData()
        self.qhead.blockSignals(True)
        self.qhead.clear()
        self.qhead.addItem(f"mean of q heads {h0}-{h0 + g - 1}" if g > 1 else f"q head {h0}", -1)
        if g > 1:
            for i in range(g):
                self.qhead.addItem(f"q head {h0 + i}", i)
        i = self.qhead.findData(keep)
        self.qhead.setCurrentIndex(max(i, 0))
        self.qhead.blockSignals(False)

    def _spun(self, *args) -> None:
        self._fill_qheads(*self._heads)
        self.selection_changed.emit(*self.selection())

    def q_index(self, v: dict | None) -> int:
        """The query head chosen, as an index into the view's q_heads; -1: their mean."""
        heads = list((v or {}).get("q_heads") or [])
        i = self.qhead.currentData()
        return -1 if i is None or i >= len(heads) else int(i)

    # ------------------------------------------------------------------ draw
    def resizeEvent(self, ev) -> None:  # noqa: N802 - Qt naming
        super().resizeEvent(ev)
        self._reflow_plots(ev.size().width())

    def _reflow_plots(self, width: int) -> None:
        """The weights plot beside the scales while the view holds both at their minimum width, under them when
        it does not (a narrow dock clipped the right one)."""
        sp, wp = self.scale_plot, self.weights_plot
        need = sum(p.effectiveSizeHint(Qt.SizeHint.MinimumSize).width() for p in (sp, wp)) + 40
        stacked = width < need
        if stacked == getattr(self, "_stacked", False):
            return
        self._stacked = stacked
        ci = self.glw.ci
        ci.removeItem(wp)
        ci.addItem(wp, row=1 if stacked else 0, col=0 if stacked else 1)
        self.glw.setMinimumHeight(300 if stacked else 150)  # as Panel.PLOT_ROW_HEIGHT a row

    def _sync_scale_views(self, *args) -> None:
        self.v_scale_vb.setGeometry(self.scale_plot.vb.sceneBoundingRect())
        self.v_scale_vb.linkedViewChanged(self.scale_plot.vb, self.v_scale_vb.XAxis)

    def _set_block_lines(self, n: int, bs: int) -> None:
        """Dotted lines at the block boundaries of positions 0..n-1 (none past MAX_BLOCK_LINES blocks)."""
        xs = [b * bs - 0.5 for b in range(1, -(-n // bs))] if bs > 0 and -(-n // bs) <= MAX_BLOCK_LINES else []
        pen = pg.mkPen((175, 175, 175), width=1, style=Qt.DotLine)
        while len(self._block_lines) < len(xs):
            ln = pg.InfiniteLine(angle=90, pen=pen)
            self.scale_plot.addItem(ln, ignoreBounds=True)
            self._block_lines.append(ln)
        for i, ln in enumerate(self._block_lines):
            ln.setVisible(i < len(xs))
            if i < len(xs):
                ln.setPos(xs[i])

    def draw(self, v: dict | None, pending: str = "") -> None:
        """Show a cache view (None: none yet; a dict with "error": why it cannot be shown); `pending`
        is appended to the note (a read on its way)."""
        sp, wp = self.scale_plot, self.weights_plot
        items = (self.k_scale_curve, self.v_scale_curve, self.k_new, self.v_new, self.w_base_curve, self.w_quant_curve)
        if v is None or "error" in v:
            for it in items:
                it.setData([], [])
            self.prompt_line.setVisible(False)
            self.scale_empty.setVisible(False)
            self._set_block_lines(0, 1)
            plot_title(sp, "per-position K / V scales")
            sp.setLabel("left", "K scale", color=hex_color(K_COLOR))
            sp.getAxis("right").setLabel("V scale", color=hex_color(V_COLOR))
            plot_title(wp, "attention, last step")
            if v is None:
                self.view_note.setText("shown after the first step: the decoder reads the selected layer after "
                                       "every step" + pending)
            else:
                self.view_note.setText(f"cannot show layer {v.get('layer')}, KV head {v.get('kv_head')}: {v['error']}")
            return
        layer, kvh, n, bs = int(v["layer"]), int(v["kv_head"]), int(v["context_len"]), int(v["block_size"])
        x = np.arange(n, dtype=np.float64)
        sc = v.get("scales")
        method = v.get("method") or "quantised"
        empty = ""
        if sc is None:
            for it in items[:4]:
                it.setData([], [])
            sp.setLabel("left", "K scale", color=hex_color(K_COLOR))
            sp.getAxis("right").setLabel("V scale", color=hex_color(V_COLOR))
            what = "this cache cannot show its per-position scales"
            empty = "no per-position scales from this cache"
        else:
            k, vv = view_scales(v)
            for curve, new, a in ((self.k_scale_curve, self.k_new, k), (self.v_scale_curve, self.v_new, vv)):
                if np.isfinite(a).any():
                    curve.setData(x, a)
                else:
                    curve.setData([], [])
                if n and np.isfinite(a[-1]):
                    new.setData(x[-1:], a[-1:])  # the newest position: written by this step
                else:
                    new.setData([], [])
            sp.setLabel("left", sc.k_label, color=hex_color(K_COLOR))
            sp.getAxis("right").setLabel(sc.v_label, color=hex_color(V_COLOR))
            what = sc.note
            if n and not np.isfinite(k).any() and not np.isfinite(vv).any():
                empty = "no scales stored for these positions yet"
        self.scale_empty.setText(empty)
        self.scale_empty.setVisible(bool(empty))
        if empty:
            self.scale_empty.setPos((n - 1) / 2, 0.5)
        win = int(v.get("window") or 0)  # a sliding-window layer: its cache holds the last `win` positions
        plot_title(sp, f"scales \u00b7 layer {layer} \u00b7 KV head {kvh} \u00b7 {n} tokens"
                   + (f" \u00b7 sliding window {win} (ring of {win} slots)" if win else ""))
        pl = int(v.get("prompt_len", 0))
        self.prompt_line.setVisible(pl >= 2)
        self.prompt_line.setPos(pl - 1.5)
        self._set_block_lines(n, bs)
        self._sync_scale_views()
        sp.setXRange(-0.5, max(n, 1) - 0.5, padding=0.02)
        if empty:
            sp.setYRange(0, 1, padding=0)
        else:
            sp.enableAutoRange(axis="y")
        self.v_scale_vb.enableAutoRange(axis="y")

        # attention weights of the last step over positions: the f32 cache's and the quantised cache's
        heads = list(v.get("q_heads") or [])
        i = self.q_index(v)
        qlab = (f"mean of q heads {heads[0]}-{heads[-1]}" if len(heads) > 1 else f"q head {heads[0]}") if i < 0 \
            else f"q head {heads[i]}"
        wb, wq = pick_weights(v.get("weights_base"), i), pick_weights(v.get("weights_quant"), i)
        for curve, w in ((self.w_base_curve, wb), (self.w_quant_curve, wq)):
            if w is not None:
                curve.setData(x[: len(w)], np.maximum(w, 1e-12))  # log axis
            else:
                curve.setData([], [])
        f32 = f"<span style='color:{hex_color(W_BASE_COLOR)}'><b>f32</b></span>"
        qn = f"<span style='color:{hex_color(Q_COLOR)}'><b>{html.escape(str(method))}</b></span>"
        if wb is not None and wq is not None and len(wb) == len(wq):
            plot_title(wp, f"attention: {f32} vs {qn} \u00b7 \u03a3|\u0394w| {np.abs(wq - wb).sum():.2g}")
        elif wq is not None:
            plot_title(wp, f"attention: {qn} (no f32 paged cache)")
        else:
            plot_title(wp, "attention: not read")
        wp.setToolTip(f"Attention weights of the last step over positions ({qlab}), layer {layer}, through the "
                      f"f32 paged cache (grey band) and the {method} cache (orange)")
        wp.setXRange(-0.5, max(n, 1) - 0.5, padding=0.02)
        wp.enableAutoRange(axis="y")
        secs = v.get("seconds")
        self.view_note.setText(what + (f" \u00b7 read in {1e3 * secs:.0f} ms" if secs is not None else "") + pending)
