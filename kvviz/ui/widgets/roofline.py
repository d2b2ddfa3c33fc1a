"""Roofline chart: every timed kernel a point (arithmetic intensity vs achieved GFLOP/s, log-log), the
device's ceilings as lines (the shader copy's bandwidth, f32 FMA and f16 FMA throughput measured on the same
device), and a table saying which kernels are memory- and which compute-bound. The numbers are
kvviz/bench/roofline.py's (Qt-free); this only draws them. Kernels stating 0 FLOPs (copies) are listed, not
drawn (log axes).
"""
from __future__ import annotations

import math

import pyqtgraph as pg
from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QAbstractItemView, QHBoxLayout, QLabel, QPushButton, QSplitter, QTableWidget, QTableWidgetItem, QVBoxLayout, QWidget,
)

from kvviz.report.roofline import roofline_table
from kvviz.ui.style import kernel_color, qcolor
from kvviz.ui.widgets.drawn_when_shown import DrawnWhenShown


class RooflineWidget(DrawnWhenShown, QWidget):
    measure_requested = Signal()  # measure the compute ceiling (FMA) on this device

    def __init__(self, parent=None):
        super().__init__(parent)
        self.points: list = []
        self.ceilings = None
        self.table_data = None
        self.drawn: list = []  # the points on the chart (positive FLOPs, bytes and rate: log axes)
        self.numbers: dict = {}  # id(point) -> its number on the chart and in the table
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        row = QHBoxLayout()
        self.status = QLabel("No run yet.")
        self.status.setWordWrap(True)
        self.measure_button = QPushButton("Measure ceilings")
        self.measure_button.setToolTip("Time the FMA-throughput shader (f32, and f16 with shader-f16) on this device")
        self.measure_button.clicked.connect(self.measure_requested.emit)
        row.addWidget(self.status, 1)
        row.addWidget(self.measure_button)
        lay.addLayout(row)
        split = QSplitter(Qt.Vertical)
        self.plot = pg.PlotWidget()
        pi = self.plot.getPlotItem()
        pi.setLogMode(x=True, y=True)
        pi.showGrid(x=True, y=True, alpha=0.25)
        pi.setLabel("bottom", "arithmetic intensity (FLOP / unique byte)")
        pi.setLabel("left", "achieved GFLOP/s")
        self.legend = pi.addLegend(offset=(10, 5), labelTextSize="8pt")
        split.addWidget(self.plot)
        self.table = QTableWidget()
        self.table.setEditTriggers(QAbstractItemView.NoEditTriggers)
        self.table.verticalHeader().setVisible(False)
        self.table.verticalHeader().setDefaultSectionSize(19)
        split.addWidget(self.table)
        split.setSizes([300, 160])
        lay.addWidget(split, 1)

    def set_data(self, points, ceilings) -> None:
        self.points = list(points)
        self.ceilings = ceilings
        self.table_data = roofline_table(self.points, ceilings)
        # Points are numbered (the table's # column) rather than listed in the legend: a bench holds ~40
        # kernels, a legend of that many covers the chart and repeats its colours.
        self.drawn = [p for p in self.points if p.flops > 0 and p.bytes > 0 and p.gflops > 0 and math.isfinite(p.gflops)]
        self.numbers = {id(p): i + 1 for i, p in enumerate(self.drawn)}
        self._fill()
        self.redraw()  # every compute updates it, most of them with the lab's tab hidden

    def _draw(self) -> None:
        pi = self.plot.getPlotItem()
        pi.clear()
        self.legend.clear()
        c = self.ceilings
        pts = self.drawn
        xs = [p.intensity for p in pts] + ([c.ridge] if c else [])
        if c:
            lo = min(xs) / 4 if xs else 1e-3  # the roof from a little left of the leftmost kernel
            hi = max(xs + [10.0]) * 4
            for peak, name, color in ((c.f32_gflops, "f32 FMA", (200, 40, 40)), (c.f16_gflops, "f16 FMA", (140, 60, 170))):
                if not peak:
                    continue
                ridge = peak / c.mem_gbps
                xr = [lo, min(max(ridge, lo), hi), hi]
                yr = [min(peak, c.mem_gbps * x) for x in xr]
                pi.plot(xr, yr, pen=pg.mkPen(color, width=2), name=f"{name} {peak:.3g} GFLOP/s / copy {c.mem_gbps:.3g} GB/s")
        for i, p in enumerate(pts):
            col = kernel_color(i + 1)
            pi.plot([p.intensity], [p.gflops], pen=None, symbol="o", symbolSize=9, symbolBrush=col)
            label = pg.TextItem(str(i + 1), color=col, anchor=(-0.15, 0.5))
            label.setPos(math.log10(p.intensity), math.log10(p.gflops))  # log-mode view coordinates
            pi.addItem(label)
        pi.setTitle("Roofline: every kernel (numbered as in the table) at its intensity and achieved FLOP/s; "
                    "lines: the device's ceilings", size="9pt")

    def _fill(self) -> None:
        t = self.table
        tab = self.table_data
        headers = ["#", "kernel", "FLOP/B", "GFLOP/s", "bound", "FLOPs", "bytes", "median us", "variant"]
        t.clear()
        t.setColumnCount(len(headers))
        t.setHorizontalHeaderLabels(headers)
        t.setRowCount(len(tab.rows))
        numbers = self.numbers
        for i, (kernel, variant, nbytes, flops, inten, med, gfl, bnd) in enumerate(tab.rows):
            num = numbers.get(id(self.points[i]))  # blank: not drawn (0 FLOPs on log axes)
            cells = [str(num or ""), kernel, f"{inten:.3g}", f"{gfl:.3g}", bnd, f"{flops:,.0f}", f"{nbytes:,}",
                     f"{med:,.1f}", variant]
            for j, v in enumerate(cells):
                it = QTableWidgetItem(v)
                if num and j == 0:
                    it.setForeground(qcolor(kernel_color(num)))
                if j == 0 or 2 <= j <= 7:
                    it.setTextAlignment(Qt.AlignRight | Qt.AlignVCenter)
                t.setItem(i, j, it)
        t.resizeColumnsToContents()
        c = self.ceilings
        if c is None:
            self.status.setText("Compute ceiling not measured yet on this device (Measure ceilings); bound needs it.")
        else:
            sw = " Software rasteriser: CPU times." if c.is_software else ""
            self.status.setText(f"Ceilings (this device): shader copy {c.mem_gbps:.3g} GB/s, f32 FMA {c.f32_gflops:.3g} GFLOP/s"
                                + (f", f16 FMA {c.f16_gflops:.3g}" if c.f16_gflops else "")
                                + f"; ridge {c.ridge:.3g} FLOP/B.{sw}")

    def tables(self) -> list:
        return [self.table_data] if self.table_data is not None else []
