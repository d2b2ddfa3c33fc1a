"""Roofline chart: every timed kernel a point (arithmetic intensity vs achieved GFLOP/s, log-log), the
device's ceilings as lines (the shader copy's bandwidth, f32 FMA and f16 FMA throughput measured on the same
device), and a table saying which kernels are memory- and which compute-bound. The numbers are
kvviz/bench/roofline.py's (Qt-free); this only draws them. Kernels stating 0 FLOPs (copies) are listed, not
drawn (log axes). Points carry their table number where it fits beside them (no label covers another); the
hover readout names any point, and a click (on a point or a table row) selects its kernel (`kernel_selected`).
"""
from __future__ import annotations

import math

import pyqtgraph as pg
from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QAbstractItemView, QHBoxLayout, QLabel, QPushButton, QSplitter, QTableWidget, QTableWidgetItem, QVBoxLayout, QWidget,
)

from kvviz import units
from kvviz.report.roofline import roofline_table
from kvviz.ui.style import fit_title, kernel_color, legend_below, qcolor
from kvviz.ui.widgets.axes import set_axis
from kvviz.ui.widgets.drawn_when_shown import DrawnWhenShown
from kvviz.ui.widgets.hover import Hover, PointLabels, nearest
from kvviz.ui.widgets.tables import select_row


def point_key(p) -> str:
    """A roofline point's kernel as the timing table names it ("kernel [variant]")."""
    return f"{p.kernel} [{p.variant}]"


class RooflineWidget(DrawnWhenShown, QWidget):
    measure_requested = Signal()  # measure the compute ceiling (FMA) on this device
    kernel_selected = Signal(str)  # "kernel [variant]" of a clicked point or table row

    def __init__(self, parent=None):
        super().__init__(parent)
        self.points: list = []
        self.ceilings = None
        self.table_data = None
        self.drawn: list = []  # the points on the chart (positive FLOPs, bytes and rate: log axes)
        self.numbers: dict = {}  # id(point) -> its number on the chart and in the table
        self.selected_key = ""
        self._lx: list = []  # log10 view coordinates of the drawn points (set when the chart is drawn)
        self._ly: list = []
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
        set_axis(pi, "bottom", "arithmetic intensity, FLOP per unique byte")
        set_axis(pi, "left", "achieved", "FLOP/s", 1e9)  # the points' rates are GFLOP/s
        pi.setLogMode(x=True, y=True)
        pi.showGrid(x=True, y=True, alpha=0.25)
        self.legend = legend_below(pi, columns=2)  # the ceilings' lines, under the axis: never over the points
        self.scatter = pg.ScatterPlotItem(size=9, pen=pg.mkPen((40, 40, 40), width=0.8))
        pi.addItem(self.scatter)
        self.ring = pg.ScatterPlotItem(size=17, pen=pg.mkPen((0, 0, 0), width=2.2), brush=pg.mkBrush(None))
        self.labels = PointLabels(pi)
        self.hover = Hover(pi, self._describe)
        self.hover.clicked.connect(self._clicked)
        self.plot.setMinimumHeight(220)
        split.addWidget(self.plot)
        self.table = QTableWidget()
        self.table.setSelectionBehavior(QAbstractItemView.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SingleSelection)
        self.table.itemSelectionChanged.connect(self._table_selection)
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
        pi.addItem(self.scatter)
        pi.addItem(self.ring)
        for item in (self.hover.vline, self.hover.hline, self.hover.text):  # pi.clear() took them out
            if item is not None:
                pi.addItem(item, ignoreBounds=True)
        self.labels.items = []
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
                pi.plot(xr, yr, pen=pg.mkPen(color, width=2),
                        name=f"{name} {units.si(peak * 1e9, 'FLOP/s')}, copy {units.si(c.mem_gbps * 1e9, 'B/s')}")
        # log-mode view coordinates: the scatter, the labels and the hover work in log10
        self._lx = [math.log10(p.intensity) for p in pts]
        self._ly = [math.log10(p.gflops) for p in pts]
        self.scatter.setData([{"pos": (x, y), "brush": pg.mkBrush(*kernel_color(i + 1)), "data": i}
                              for i, (x, y) in enumerate(zip(self._lx, self._ly))])
        self.labels.set_labels([(x, y, str(i + 1), (20, 20, 20)) for i, (x, y) in enumerate(zip(self._lx, self._ly))])
        self._show_selection()
        fit_title(pi, ["Roofline: every kernel (numbered as in the table) at its intensity and achieved FLOP/s",
                       "lines: the device's ceilings"], "9pt")  # wrapped to the plot's width, never wider

    # ---------------------------------------------------------------- hover and selection
    def _nearest(self, x: float, y: float) -> int | None:
        if len(self._lx) != len(self.drawn):
            return None
        return nearest(self._lx, self._ly, x, y, self.plot.getPlotItem().getViewBox())

    def _describe(self, x: float, y: float) -> str | None:
        i = self._nearest(x, y)
        if i is None:
            return None
        p = self.drawn[i]
        c = self.ceilings
        roof = f"\n{100 * p.gflops / c.attainable(p.intensity):.0f}% of the roof there" if c else ""
        return (f"#{i + 1} {p.kernel} [{p.variant}]\nintensity {units.si(p.intensity, '', 3)} FLOP/B\n"
                f"{units.si(p.gflops * 1e9, 'FLOP/s')}, median {units.time_us(p.median_us)}\n"
                f"bound: {p.bound(c)}{roof}")

    def _clicked(self, x: float, y: float) -> None:
        i = self._nearest(x, y)
        if i is not None:
            self._emit(point_key(self.drawn[i]))

    def _table_selection(self) -> None:
        rows = self.table.selectionModel().selectedRows() if self.table.selectionModel() else []
        if rows and rows[0].row() < len(self.points):
            self._emit(point_key(self.points[rows[0].row()]))

    def _emit(self, key: str) -> None:
        if key != self.selected_key:
            self.select_kernel(key)
            self.kernel_selected.emit(key)

    def select_kernel(self, key: str) -> None:
        """Ring the selected kernel's point and select its table row (nothing when it is not on the chart)."""
        self.selected_key = key
        self._show_selection()

    def _show_selection(self) -> None:
        keys = [point_key(p) for p in self.drawn]
        i = keys.index(self.selected_key) if self.selected_key in keys else None
        if len(self._lx) != len(self.drawn):  # not drawn yet (its tab hidden): the ring comes with the chart
            i = None
        self.ring.setData([] if i is None else [{"pos": (self._lx[i], self._ly[i])}])
        rows = [point_key(p) for p in self.points]
        t = self.table
        t.blockSignals(True)
        if self.selected_key in rows:
            select_row(t, rows.index(self.selected_key))
        else:
            t.clearSelection()
        t.blockSignals(False)

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
