"""Method comparison panel: every registered method on the same K/V and queries, as a Pareto
scatter of KL against bits per element or against decode time (the method's decode kernels, GPU
timestamps), and a table. Runs kvviz.analysis.compare in the worker on demand.

A point is one method at one setting, named by its key and the options that set it apart
(`turboquant qjl_scale=unbiased`); its colour is its family (the legend under the plot). Names are drawn
beside the points where they fit, the Pareto front's first, and never over one another; the hover
readout names every point, and a click selects its table row.
"""
from __future__ import annotations

import math

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QColor
from PySide6.QtWidgets import (
    QAbstractItemView, QComboBox, QLabel, QPushButton, QSplitter, QTableWidget, QTableWidgetItem,
)

from kvviz import units
from kvviz.families.registry import family_of
from kvviz.history.numbers import change
from kvviz.report.compare_run import compare_available
from kvviz.tables import compare_name, compare_table
from kvviz.ui.panels.base import DELTA_COLORS, Panel
from kvviz.ui.style import kernel_color, legend_below
from kvviz.ui.widgets.axes import set_axis
from kvviz.ui.widgets.hover import Hover, PointLabels, nearest
from kvviz.ui.widgets.tables import select_row


# the scatter's x axis: (row key, axis title, its unit and scale, what "better" means for the front)
X_AXES = {
    "bits": ("bits_per_element", "bits per element (K and V mean, scales included)", ("", 1.0), "fewer bits"),
    "decode": ("decode_total_us", "decode time (GPU timestamps; a first-wave decode's dequantise pass included)",
               ("s", 1e-6), "faster decode"),
}


def _family(method: str) -> str:
    try:
        return family_of(method)
    except Exception:  # noqa: BLE001 - a row of a method this build does not register (a stored comparison)
        return method


def pareto_front(bits: np.ndarray, kl: np.ndarray) -> np.ndarray:
    """Indices of the points no other point beats on both bits and KL, sorted by bits."""
    idx = [i for i in range(len(bits))
           if not any((bits[j] <= bits[i] and kl[j] <= kl[i]) and (bits[j] < bits[i] or kl[j] < kl[i])
                      for j in range(len(bits)))]
    return np.array(sorted(idx, key=lambda i: bits[i]), dtype=np.int64)


def _num(v) -> float:
    return float("nan") if v is None else float(v)


class ComparePanel(Panel):
    key = "compare"
    title = "Method comparison"
    compare_requested = Signal()

    def __init__(self, state=None, parent=None):
        super().__init__(state, parent)
        self.rows: list = []
        self.table_data = None
        self.run_button = QPushButton("Compare all methods")
        self.run_button.setToolTip("Run every registered method on the current K/V/Q (in the worker)")
        self.run_button.clicked.connect(self.compare_requested)
        self.tools.addWidget(self.run_button)
        self.x_axis = QComboBox()
        self.x_axis.addItem("KL vs bits per element", "bits")
        self.x_axis.addItem("KL vs decode time", "decode")
        self.x_axis.setToolTip("The scatter's x axis: the cache's bits per element, or the GPU time of the method's "
                               "decode on this workload (its fast split-K decode where it has one)")
        self.x_axis.currentIndexChanged.connect(lambda _i: self.set_rows(self.rows) if self.rows else None)
        self.tools.addWidget(self.x_axis)
        self.status = QLabel("")
        self.status.setWordWrap(True)  # a long summary takes two lines, never the dock's width
        self.body.addWidget(self.status)
        split = QSplitter(Qt.Vertical)
        self.plot = pg.PlotWidget()
        pi = self.plot.getPlotItem()
        set_axis(pi, "bottom", X_AXES["bits"][1])
        set_axis(pi, "left", "KL mean, nats")  # KL(f32 || quantised) over (sequence, head): the status line says it
        pi.setLogMode(x=False, y=True)
        pi.showGrid(x=True, y=True, alpha=0.25)
        self.legend = legend_below(pi, columns=4)
        self.scatter = pg.ScatterPlotItem(size=11, pen=pg.mkPen("k"))
        pi.addItem(self.scatter)
        self.front = pi.plot(pen=pg.mkPen((120, 120, 120), width=1, style=Qt.DashLine))
        self.ring = pg.ScatterPlotItem(size=19, pen=pg.mkPen((0, 0, 0), width=2.2), brush=pg.mkBrush(None))
        pi.addItem(self.ring)
        self.labels = PointLabels(pi)
        self.hover = Hover(pi, self._describe)
        self.hover.clicked.connect(self._clicked)
        self._xy = ([], [], [])  # view coordinates of the drawn points and their row indices
        self.plot.setMinimumHeight(240)
        split.addWidget(self.plot)
        self.table = QTableWidget()
        self.table.setSelectionBehavior(QAbstractItemView.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SingleSelection)
        self.table.itemSelectionChanged.connect(self._mark_selected_row)
        self.table.setEditTriggers(QAbstractItemView.NoEditTriggers)
        self.table.verticalHeader().setVisible(False)
        self.table.verticalHeader().setDefaultSectionSize(19)
        split.addWidget(self.table)
        split.setStretchFactor(0, 3)
        split.setStretchFactor(1, 2)
        self.body.addWidget(split, 1)
        self._update_availability()

    def _update_availability(self) -> None:
        ok = compare_available()
        self.run_button.setEnabled(ok)
        if not self.rows:
            self.status.setText("Press 'Compare all methods' to run every method on the same K/V." if ok else
                                "Not available: kvviz.analysis.compare is not part of this build.")

    def refresh(self) -> None:
        self._update_availability()  # rows of an earlier run are marked stale by the window (its notices)

    def has_content(self) -> bool:
        return bool(self.rows)

    def set_rows(self, rows: list, cancelled: bool = False) -> None:
        self.rows = [dict(r) for r in rows]
        self.table_data = compare_table(self.rows)
        pi = self.plot.getPlotItem()
        axis = self.x_axis.currentData() or "bits"
        xkey, xlabel, (xunit, xscale), better = X_AXES[axis]
        log_x = axis == "decode"  # fast and first-wave decodes lie 10-20x apart
        set_axis(pi, "bottom", xlabel, xunit, xscale)
        pi.setLogMode(x=log_x, y=True)
        bits = np.array([_num(r.get(xkey)) for r in self.rows], np.float64)
        kl = np.array([_num(r.get("kl_mean")) for r in self.rows], np.float64)
        ok = np.isfinite(bits) & np.isfinite(kl) & ((bits > 0) if log_x else True)
        lx = np.log10(np.where(ok, bits, 1.0)) if log_x else bits  # scatter and text items take view coordinates
        pos = kl[ok & (kl > 0)]
        floor = float(pos.min()) / 10.0 if pos.size else 1e-12  # KL 0 (lossless) sits one decade below the rest
        kl = np.where(ok, np.maximum(kl, floor), kl)
        ly = np.log10(kl)
        families = list(dict.fromkeys(_family(str(r.get("method"))) for r in self.rows))
        colour = {f: kernel_color(i) for i, f in enumerate(families)}
        spots, xs, ys, idx_drawn = [], [], [], []
        for i, r in enumerate(self.rows):
            if not ok[i]:
                continue
            fam = _family(str(r.get("method")))
            spots.append({"pos": (lx[i], ly[i]), "brush": pg.mkBrush(*colour[fam]), "data": i})
            xs.append(lx[i])
            ys.append(ly[i])
            idx_drawn.append(i)
        self.scatter.setData(spots)
        self._xy = (xs, ys, idx_drawn)
        self.legend.clear()
        for fam in families:  # the families' colours
            sample = pg.ScatterPlotItem(size=9, pen=pg.mkPen("k"), brush=pg.mkBrush(*colour[fam]))
            self.legend.addItem(sample, fam)
        front = []
        if ok.any():
            idx = np.flatnonzero(ok)
            front = idx[pareto_front(bits[idx], kl[idx])]
            self.front.setData(bits[front], kl[front])  # PlotDataItem applies the log itself
        else:
            self.front.setData([], [])
        # names beside the points where they fit: the Pareto front's first, then the rest by KL
        order = list(front) + sorted((i for i in idx_drawn if i not in set(front)), key=lambda i: kl[i])
        self.labels.set_labels([(lx[i], ly[i], compare_name(self.rows[i]), (30, 30, 30)) for i in order],
                               list(zip(xs, ys)))
        self._mark_selected_row()
        t = self.table
        tab = self.table_data
        t.clear()
        t.setRowCount(len(tab.rows))
        t.setColumnCount(len(tab.columns))
        t.setHorizontalHeaderLabels(tab.headers())
        for i, row in enumerate(tab.rows):
            for j, v in enumerate(row):
                s = (f"{v:.4g}" if isinstance(v, float) and not math.isnan(v)
                     else "" if v is None or isinstance(v, float) else str(v))
                t.setItem(i, j, QTableWidgetItem(s))
        t.resizeColumnsToContents()
        self.sync_deltas()
        self.status.setText(f"{len(self.rows)} methods on the same K/V" + (" (cancelled: partial)" if cancelled else "")
                            + f"; dashed: Pareto front ({better} and lower KL is better)"
                            + ("" if ok.all() else f"; {int((~ok).sum())} without a value on this axis, not drawn"))

    DELTA_COLUMN = "KL vs pinned"

    def sync_deltas(self) -> None:
        """Each compared method's KL against the pinned run's, in a column after the KL (the panel's numbers are
        the methods', not the shown run's: no line under the info)."""
        self.delta_note.hide()
        t = self.table
        for j in range(t.columnCount() - 1, -1, -1):  # the column of an earlier call
            h = t.horizontalHeaderItem(j)
            if h is not None and h.text() == self.DELTA_COLUMN:
                t.removeColumn(j)
        b = self.state.baseline if self.state is not None else None
        base = (b.numbers or {}).get("kl_mean") if b is not None else None
        if base is None or not self.rows or self.table_data is None or "kl_mean" not in self.table_data.columns:
            return
        col = self.table_data.columns.index("kl_mean") + 1
        t.insertColumn(col)
        head = QTableWidgetItem(self.DELTA_COLUMN)
        head.setToolTip(f"each method's KL mean against the pinned {b.title}'s ({base:.3g} nats)")
        t.setHorizontalHeaderItem(col, head)
        for i, r in enumerate(self.rows):
            c = change("kl_mean", _num(r.get("kl_mean")), base)
            it = QTableWidgetItem(c.text if c is not None else "")
            it.setTextAlignment(Qt.AlignRight | Qt.AlignVCenter)
            if c is not None and c.verdict in DELTA_COLORS:
                it.setForeground(QColor(DELTA_COLORS[c.verdict]))
            t.setItem(i, col, it)
        t.resizeColumnToContents(col)

    def n_points(self) -> int:
        return len(self.scatter.data)

    # ---------------------------------------------------------------- hover and selection
    def _nearest(self, x: float, y: float) -> int | None:
        xs, ys, rows = self._xy
        j = nearest(xs, ys, x, y, self.plot.getPlotItem().getViewBox())
        return None if j is None else rows[j]

    def _describe(self, x: float, y: float) -> str | None:
        i = self._nearest(x, y)
        if i is None:
            return None
        r = self.rows[i]
        dec = r.get("decode_total_us")
        return (f"{compare_name(r)}\n{r.get('label', '')}\n{units.si(r.get('bits_per_element'), '', 4)} bits per element"
                f"\nKL mean {units.si(r.get('kl_mean'), '', 3)} nats, rel. L2 {units.si(r.get('rel_l2'), '', 3)}"
                + (f"\ndecode {units.time_us(dec)}" if dec is not None and math.isfinite(float(dec)) else ""))

    def _clicked(self, x: float, y: float) -> None:
        i = self._nearest(x, y)
        if i is not None:
            select_row(self.table, i)

    def _mark_selected_row(self) -> None:
        rows = self.table.selectionModel().selectedRows() if self.table.selectionModel() else []
        xs, ys, drawn = self._xy
        i = rows[0].row() if rows else None
        j = drawn.index(i) if i in drawn else None
        self.ring.setData([] if j is None else [{"pos": (xs[j], ys[j])}])

    def tables(self) -> list:
        return [self.table_data] if self.table_data is not None else []
