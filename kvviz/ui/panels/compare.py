"""Method comparison panel: every registered method on the same K/V and queries, as a Pareto
scatter of KL against bits per element or against decode time (the method's decode kernels, GPU
timestamps), and a table. Runs kvviz.analysis.compare in the worker on demand.
"""
from __future__ import annotations

import math

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QAbstractItemView, QComboBox, QLabel, QPushButton, QSplitter, QTableWidget, QTableWidgetItem,
)

from kvviz.report.compare_run import compare_available
from kvviz.tables import compare_table
from kvviz.ui.panels.base import Panel
from kvviz.ui.style import kernel_color


# the scatter's x axis: (row key, axis label, what "better" means for the front)
X_AXES = {
    "bits": ("bits_per_element", "bits per element (K and V mean, scales included)", "fewer bits"),
    "decode": ("decode_total_us", "decode time, us (GPU timestamps; a first-wave decode's dequantise pass included)",
               "faster decode"),
}


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
        self._texts = []
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
        self.body.addWidget(self.status)
        split = QSplitter(Qt.Vertical)
        self.plot = pg.PlotWidget()
        pi = self.plot.getPlotItem()
        pi.setLabel("bottom", "bits per element (K and V mean, scales included)")
        pi.setLabel("left", "KL mean (log)")
        pi.setLogMode(x=False, y=True)
        pi.getAxis("left").enableAutoSIPrefix(False)
        pi.showGrid(x=True, y=True, alpha=0.25)
        self.scatter = pg.ScatterPlotItem(size=11, pen=pg.mkPen("k"))
        pi.addItem(self.scatter)
        self.front = pi.plot(pen=pg.mkPen((120, 120, 120), width=1, style=Qt.DashLine))
        split.addWidget(self.plot)
        self.table = QTableWidget()
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
        self._update_availability()
        if self.rows and self.res is not None:
            self.status.setText(f"{len(self.rows)} methods compared (results of an earlier run; press the button to "
                                "compare on the current workload)")

    def set_rows(self, rows: list, cancelled: bool = False) -> None:
        self.rows = [dict(r) for r in rows]
        self.table_data = compare_table(self.rows)
        pi = self.plot.getPlotItem()
        for t in self._texts:
            pi.removeItem(t)
        self._texts = []
        axis = self.x_axis.currentData() or "bits"
        xkey, xlabel, better = X_AXES[axis]
        log_x = axis == "decode"  # fast and first-wave decodes lie 10-20x apart
        pi.setLogMode(x=log_x, y=True)
        pi.setLabel("bottom", xlabel)
        bits = np.array([_num(r.get(xkey)) for r in self.rows], np.float64)
        kl = np.array([_num(r.get("kl_mean")) for r in self.rows], np.float64)
        ok = np.isfinite(bits) & np.isfinite(kl) & ((bits > 0) if log_x else True)
        lx = np.log10(np.where(ok, bits, 1.0)) if log_x else bits  # scatter and text items take view coordinates
        pos = kl[ok & (kl > 0)]
        floor = float(pos.min()) / 10.0 if pos.size else 1e-12  # KL 0 (lossless) sits one decade below the rest
        kl = np.where(ok, np.maximum(kl, floor), kl)
        ly = np.log10(kl)
        spots = []
        groups: dict = {}
        for i, r in enumerate(self.rows):
            if not ok[i]:
                continue
            spots.append({"pos": (lx[i], ly[i]), "brush": pg.mkBrush(*kernel_color(i)), "data": r.get("method")})
            groups.setdefault((round(lx[i], 3), round(ly[i], 3)), []).append(str(r.get("method")))
        for (x, y), keys in groups.items():  # one label per spot: methods that coincide share it
            ti = pg.TextItem(" = ".join(keys), color=(30, 30, 30), anchor=(0, 1))
            ti.setPos(x, y)
            pi.addItem(ti)
            self._texts.append(ti)
        self.scatter.setData(spots)
        if ok.any():
            idx = np.flatnonzero(ok)
            f = idx[pareto_front(bits[idx], kl[idx])]
            self.front.setData(bits[f], kl[f])  # PlotDataItem applies the log itself
        else:
            self.front.setData([], [])
        t = self.table
        tab = self.table_data
        t.clear()
        t.setRowCount(len(tab.rows))
        t.setColumnCount(len(tab.columns))
        t.setHorizontalHeaderLabels(tab.columns)
        for i, row in enumerate(tab.rows):
            for j, v in enumerate(row):
                s = (f"{v:.4g}" if isinstance(v, float) and not math.isnan(v)
                     else "" if v is None or isinstance(v, float) else str(v))
                t.setItem(i, j, QTableWidgetItem(s))
        t.resizeColumnsToContents()
        self.status.setText(f"{len(self.rows)} methods on the same K/V" + (" (cancelled: partial)" if cancelled else "")
                            + f"; dashed: Pareto front ({better} and lower KL is better)"
                            + ("" if ok.all() else f"; {int((~ok).sum())} without a value on this axis, not drawn"))

    def n_points(self) -> int:
        return len(self.scatter.data)

    def tables(self) -> list:
        return [self.table_data] if self.table_data is not None else []
