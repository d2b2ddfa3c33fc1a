"""Code histogram panel: K and V code distributions, one bar per representable code, and the method's code
statistics (KVMethod.code_statistics; each column's tooltip gives its definition)."""
from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QAbstractItemView, QCheckBox, QTableWidget, QTableWidgetItem

from kvviz.tables import code_hist_table, code_stats_table
from kvviz.ui.panels.base import Panel
from kvviz import units
from kvviz.ui.style import K_COLOR, V_COLOR, fit_title
from kvviz.ui.widgets.axes import set_axis
from kvviz.ui.widgets.hover import Hover


def _pct(x: float) -> str:
    return f"{100.0 * x:.2f}%"


def _text(val, unit: str) -> str:
    """A statistic as the table shows it (see kvviz.metrics.Statistic.text)."""
    v = float(val)
    if not np.isfinite(v):
        return "n/a"
    if unit == "fraction":
        return _pct(v)
    if unit == "bits":
        return f"{v:.3f} bits"
    if unit == "count" or v == int(v):
        return f"{int(v)}"
    return f"{v:.4g}"


def _value_ticks(vals: np.ndarray, n: int = 9) -> list:
    """Ticks on a code-index axis naming the values: the ends, zero and values that are powers of two
    (+-1, +-16, ...) spread along the axis."""
    if len(vals) == 0:
        return []
    a = np.abs(vals)
    with np.errstate(divide="ignore"):
        nice = np.flatnonzero((vals == 0) | ((a > 0) & (np.mod(np.log2(np.where(a > 0, a, 1)), 1) == 0)))
    if len(nice) > n:
        nice = nice[np.unique(np.linspace(0, len(nice) - 1, n).round().astype(int))]
    idx = sorted(set(nice.tolist()) | {0, len(vals) - 1} | set(np.flatnonzero(vals == 0)[:1].tolist()))
    return [(float(i), f"{vals[i] + 0.0:g}") for i in idx]


MAX_BARS = 1024  # more representable codes than this (f16: 63,488) are binned on the value axis


def nice_width(span: float, n: int = 200) -> float:
    """A bin width of 1, 2 or 5 x 10^k giving about `n` bins over `span`."""
    if not span > 0:
        return 1.0
    raw = span / n
    e = np.floor(np.log10(raw))
    for m in (1.0, 2.0, 5.0, 10.0):
        if m * 10.0 ** e >= raw:
            return float(m * 10.0 ** e)
    return float(10.0 ** (e + 1))


def value_bins(values: np.ndarray, k_counts: np.ndarray, v_counts: np.ndarray, n: int = 200):
    """A value-axis histogram of a format with too many codes for one bar each: (edges, k, v, width),
    bins of one `width` over the values that occur, each code's count in the bin of its value."""
    vals = np.asarray(values, np.float64)
    seen = (np.asarray(k_counts) + np.asarray(v_counts)) > 0
    if not seen.any():
        seen = np.ones(len(vals), bool)
    lo, hi = float(vals[seen].min()), float(vals[seen].max())
    w = nice_width(hi - lo, n)
    start = np.floor(lo / w) * w
    nb = max(1, int(np.floor((hi - start) / w)) + 1)
    edges = start + w * np.arange(nb + 1, dtype=np.float64)
    k = np.histogram(vals, bins=edges, weights=np.asarray(k_counts, np.float64))[0]
    v = np.histogram(vals, bins=edges, weights=np.asarray(v_counts, np.float64))[0]
    return edges, k, v, w


class CodesPanel(Panel):
    key = "codes"
    title = "Code histogram"
    baseline_keys = ("k_*", "v_*")  # said against the pinned run (Panel.sync_deltas)

    def __init__(self, state=None, parent=None):
        super().__init__(state, parent)
        self.hist = self.stats = None
        self.binned = None  # (edges, K counts, V counts, width) when the codes are binned on the value axis
        self.log_y = QCheckBox("log counts")
        self.log_y.toggled.connect(lambda *_: self.refresh())
        self.tools.addWidget(self.log_y)
        self.glw = pg.GraphicsLayoutWidget()
        self.glw.setMinimumSize(120, 120)
        self.k_plot = self.glw.addPlot(row=0, col=0)
        self.v_plot = self.glw.addPlot(row=1, col=0)
        self.v_plot.setXLink(self.k_plot)
        for p in (self.k_plot, self.v_plot):
            set_axis(p, "left", "count")
            set_axis(p, "bottom", "")
            p.showGrid(x=False, y=True, alpha=0.25)
        self.v_plot.setLabel("bottom", "code")
        self.k_hover = Hover(self.k_plot, lambda x, y: self._describe_bar("K", x))
        self.v_hover = Hover(self.v_plot, lambda x, y: self._describe_bar("V", x))
        self.bar_x = np.zeros(0)
        self.k_bars = None
        self.v_bars = None
        self.body.addWidget(self.glw, 1)
        self.table = QTableWidget()
        self.table.setEditTriggers(QAbstractItemView.NoEditTriggers)
        self.table.verticalHeader().setDefaultSectionSize(19)
        self.table.setVerticalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
        self.table.setFixedHeight(3 * 19 + 8)
        self.body.addWidget(self.table)

    def refresh(self) -> None:
        res = self.res
        if res is None:
            return
        self.hist = code_hist_table(res)
        self.stats = code_stats_table(res)
        # One bar of width 1 per representable code (zero counts included): the bars tile the axis, no gaps
        # at any zoom. Integer codes sit at their value; float codes (FP8, FP4) at their index among the
        # format's values in order, the ticks naming the values.
        x = self.hist.column("bin").astype(np.float64)
        vals = self.hist.column("code").astype(np.float64)
        integral = res.k_stats.axis == "code" and res.v_stats.axis == "code"
        # A format with more codes than MAX_BARS (f16) is binned on its value axis, drawn as one step curve
        # per K / V: a bar per code (63,488 of them) took seconds to draw and showed nothing a bar could.
        self.binned = None if integral or len(x) <= MAX_BARS else value_bins(
            vals, self.hist.column("k_count"), self.hist.column("v_count"))
        ticks = None if integral or self.binned is not None else [_value_ticks(vals), []]
        self.bar_x = x
        log = self.log_y.isChecked()
        for which, plot, col, st, counts, attr in (
            ("K", self.k_plot, K_COLOR, res.k_stats, self.hist.column("k_count"), "k_bars"),
            ("V", self.v_plot, V_COLOR, res.v_stats, self.hist.column("v_count"), "v_bars"),
        ):
            old = getattr(self, attr)
            if old is not None:
                plot.removeItem(old)
            if self.binned is not None:
                edges, kb, vb, _w = self.binned
                counts = kb if which == "K" else vb
            h = counts.astype(np.float64)
            if log:
                h = np.log10(np.maximum(h, 0) + 1.0)
            if self.binned is not None:
                bars = pg.PlotDataItem(self.binned[0], h, stepMode="center", fillLevel=0,
                                       brush=pg.mkBrush(*col, 160), pen=pg.mkPen(col, width=1))
            else:
                bars = pg.BarGraphItem(x=x, height=h, width=1.0, brush=pg.mkBrush(*col, 200), pen=pg.mkPen(None))
            plot.addItem(bars)
            setattr(self, attr, bars)
            plot.setLabel("left", f"{which}: log10(n+1)" if log else f"{which} count")
            head = list(st.stats.values())[:2]
            fit_title(plot, [f"{which}: " + (f"{head[0].label} {head[0].text()}" if head else "")]
                      + [f"{t.label} {t.text()}" for t in head[1:]], "8pt")
            plot.getAxis("bottom").setTicks(ticks)
            plot.enableAutoRange()
        lo, hi = res.qkv.code_range
        n_seen = int(np.count_nonzero(self.hist.column("k_count") + self.hist.column("v_count")))
        self.info.setText(f"{res.method.id}: codes {lo:g} .. {hi:g}, {n_seen} of {len(self.hist)} values occur")
        if integral:
            self.v_plot.setLabel("bottom", "code")
        elif self.binned is not None:
            self.v_plot.setLabel("bottom", f"value (bin width {self.binned[3]:g})")
        else:
            self.v_plot.setLabel("bottom", "code (index of the format's values; ticks: value)")
        t = self.table
        t.clear()
        t.setRowCount(2)
        t.setColumnCount(len(self.stats.rows))
        t.setVerticalHeaderLabels(["K", "V"])
        for j, (name, label, k, v, unit, definition) in enumerate(self.stats.rows):
            hdr = QTableWidgetItem(label)
            hdr.setToolTip(f"{name}: {definition}")
            t.setHorizontalHeaderItem(j, hdr)
            for i, val in ((0, k), (1, v)):
                it = QTableWidgetItem(_text(val, unit))
                it.setToolTip(f"{label}: {definition}")
                it.setTextAlignment(Qt.AlignRight | Qt.AlignVCenter)
                t.setItem(i, j, it)
        t.resizeColumnsToContents()

    def _describe_bar(self, which: str, x: float) -> str | None:
        """The code (or value bin) under the mouse and its count."""
        if self.hist is None or not len(self.hist):
            return None
        if self.binned is not None:
            edges, kb, vb, w = self.binned
            i = int(np.searchsorted(edges, x, side="right")) - 1
            if not 0 <= i < len(kb):
                return None
            n = (kb if which == "K" else vb)[i]
            return f"values {units.si(edges[i], '', 4)} .. {units.si(edges[i + 1], '', 4)}\n{which}: {int(n):,} codes"
        i = int(np.argmin(np.abs(self.bar_x - x)))
        if abs(self.bar_x[i] - x) > 0.5:
            return None
        _bin, code, k, v = self.hist.rows[i]
        return f"code {units.si(code, '', 4)}\n{which}: {int(k if which == 'K' else v):,} codes"

    def tables(self) -> list:
        return [t for t in (self.hist, self.stats) if t is not None]
