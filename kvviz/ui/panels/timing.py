"""GPU timing panel: the kernels of the last run (median, min-p90, bytes, GB/s, % of copy, timing
method), their bandwidth against the copy line, the history of every run in this window, a pinned
baseline (delta % per kernel) and a latency sweep over context length or batch size.
"""
from __future__ import annotations

import math

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QColor
from PySide6.QtWidgets import (
    QAbstractItemView, QComboBox, QHBoxLayout, QLabel, QLineEdit, QPushButton, QSplitter, QTableWidget,
    QTableWidgetItem, QTabWidget, QVBoxLayout, QWidget,
)

from kvviz.report.tables import history_entry, history_table, sweep_table, timing_key, timings_table
from kvviz.ui.panels.base import Panel
from kvviz.ui.style import WARN_BG, WARN_FG, kernel_color

SOFTWARE_FLAG = "lavapipe: CPU timings, not GPU"


def log_ticks(values) -> list:
    """Ticks for a pyqtgraph log axis (positions in log10): 1-2-5 steps over the values' range."""
    v = [float(x) for x in values if x and x > 0 and math.isfinite(x)]
    if not v:
        return None
    lo, hi = math.floor(math.log10(min(v))), math.ceil(math.log10(max(v)))
    major = []
    for e in range(lo, hi + 1):
        for m in ((1, 2, 5) if hi - lo <= 3 else (1,)):
            x = m * 10.0 ** e
            if min(v) / 2.5 <= x <= max(v) * 2.5:
                major.append((math.log10(x), f"{x:g}"))
    return [major, []]


def parse_values(text: str) -> list:
    out = []
    for p in text.replace(";", ",").replace(" ", ",").split(","):
        p = p.strip()
        if p:
            out.append(int(p))
    return out


class TimingPanel(Panel):
    key = "timing"
    title = "GPU timing"
    sweep_requested = Signal(str, object)  # param, values

    def __init__(self, state=None, parent=None):
        super().__init__(state, parent)
        self.history: list = []
        self.pinned: dict | None = None
        self.pinned_run = 0
        self.sweep_points: list = []
        self.timing_tab = self.hist_tab = self.sweep_tab = None
        self._bar_texts = []

        self.pin_button = QPushButton("Pin as baseline")
        self.pin_button.setToolTip("Keep this run's medians; the table shows each kernel's change against it")
        self.pin_button.clicked.connect(self.pin_current)
        self.unpin_button = QPushButton("Unpin")
        self.unpin_button.clicked.connect(self.unpin)
        self.trace_button = QPushButton("Chrome trace...")
        self.trace_button.setToolTip("Save the timings as a Chrome trace JSON (opens in Perfetto)")
        self.trace_button.clicked.connect(lambda: self.state and self.state.trace_export_requested.emit())
        for w in (self.pin_button, self.unpin_button, self.trace_button):
            self.tools.addWidget(w)

        self.warn = QLabel(SOFTWARE_FLAG)
        self.warn.setStyleSheet(f"background:{WARN_BG}; color:{WARN_FG}; padding:3px; font-weight:bold;"
                                f" border:1px solid #e0b000;")
        self.warn.setVisible(False)
        self.body.addWidget(self.warn)

        self.tabs = QTabWidget()
        # --- kernels
        kern = QSplitter(Qt.Vertical)
        self.table = QTableWidget()
        self.table.setEditTriggers(QAbstractItemView.NoEditTriggers)
        self.table.verticalHeader().setVisible(False)
        self.table.verticalHeader().setDefaultSectionSize(19)
        kern.addWidget(self.table)
        self.bar_plot = pg.PlotWidget()
        bp = self.bar_plot.getPlotItem()
        bp.setLabel("bottom", "GB/s (log scale)")
        bp.showGrid(x=True, y=False, alpha=0.3)
        bp.setLogMode(x=True, y=False)
        bp.setMouseEnabled(x=False, y=False)
        bp.invertY(True)
        self.copy_line = pg.InfiniteLine(angle=90, pen=pg.mkPen((200, 30, 30), width=2, style=Qt.DashLine),
                                         label="copy {value:.3g}", labelOpts={"position": 0.95, "color": (200, 30, 30)})
        bp.addItem(self.copy_line)
        self.bars = None
        kern.addWidget(self.bar_plot)
        kern.setStretchFactor(0, 2)
        kern.setStretchFactor(1, 3)
        kern.setSizes([180, 270])
        self.tabs.addTab(kern, "Kernels")
        # --- history
        hist = QSplitter(Qt.Vertical)
        self.hist_plot = pg.PlotWidget()
        hp = self.hist_plot.getPlotItem()
        hp.setLabel("bottom", "run")
        hp.setLabel("left", "median us (log)")
        hp.setLogMode(x=False, y=True)
        hp.showGrid(x=True, y=True, alpha=0.25)
        self.hist_legend = hp.addLegend(offset=(-5, 5), labelTextSize="7pt")
        hist.addWidget(self.hist_plot)
        self.hist_table = QTableWidget()
        self.hist_table.setEditTriggers(QAbstractItemView.NoEditTriggers)
        self.hist_table.verticalHeader().setVisible(False)
        self.hist_table.verticalHeader().setDefaultSectionSize(19)
        hist.addWidget(self.hist_table)
        self.tabs.addTab(hist, "History")
        # --- sweep
        sw = QWidget()
        sl = QVBoxLayout(sw)
        sl.setContentsMargins(0, 0, 0, 0)
        row = QHBoxLayout()
        self.sweep_param = QComboBox()
        self.sweep_param.addItem("context length", "context")
        self.sweep_param.addItem("batch (sequences)", "batch")
        self.sweep_param.currentIndexChanged.connect(self._param_changed)
        self.sweep_values = QLineEdit("64, 128, 256, 512, 1024")
        self.sweep_values.setToolTip("Values of the swept parameter, comma separated")
        self.sweep_button = QPushButton("Run sweep")
        self.sweep_button.clicked.connect(self._sweep_clicked)
        row.addWidget(QLabel("Sweep"))
        row.addWidget(self.sweep_param)
        row.addWidget(self.sweep_values, 1)
        row.addWidget(self.sweep_button)
        sl.addLayout(row)
        self.sweep_plot = pg.PlotWidget()
        spi = self.sweep_plot.getPlotItem()
        spi.setLabel("left", "median us")
        spi.setLabel("bottom", "tokens per sequence")
        spi.setLogMode(x=True, y=True)
        spi.showGrid(x=True, y=True, alpha=0.25)
        self.sweep_legend = spi.addLegend(offset=(10, 5), labelTextSize="8pt")
        sl.addWidget(self.sweep_plot, 1)
        self.sweep_status = QLabel("No sweep yet: runs Session.sweep in the worker (cancel with Esc).")
        sl.addWidget(self.sweep_status)
        self.tabs.addTab(sw, "Sweep")
        self.body.addWidget(self.tabs, 1)

    # ---------------------------------------------------------------- results
    def set_results(self, res) -> None:
        self.res = res
        self.history.append(history_entry(res, len(self.history) + 1))
        self.refresh()

    def refresh(self) -> None:
        res = self.res
        if res is None:
            return
        self.warn.setVisible(bool(res.adapter.is_software))
        self.warn.setText(f"{SOFTWARE_FLAG}  ({res.adapter.name})")
        self.timing_tab = timings_table(res, self.pinned)
        self.hist_tab = history_table(self.history)
        methods = sorted({t.timing.method for t in res.timings})
        self.info.setText(f"timing: {', '.join(methods)}; copy {res.copy_gbps:.2f} GB/s"
                          + (f"; pinned run {self.pinned_run}" if self.pinned else ""))
        self._fill_table()
        self._draw_bars()
        self._draw_history()

    def _fill_table(self) -> None:
        t = self.table
        tab = self.timing_tab
        headers = ["kernel", "median us (min-p90)", "vs pin", "GB/s", "% of copy", "bytes", "variant", "timing"]
        t.clear()
        t.setRowCount(len(tab.rows))
        t.setColumnCount(len(headers))
        t.setHorizontalHeaderLabels(headers)
        for i, r in enumerate(tab.rows):
            kernel, variant, med, mn, p90, runs, nbytes, gbps, pct, method, delta = r
            cells = [kernel, f"{med:,.1f} ({mn:,.1f}-{p90:,.1f})", "" if math.isnan(delta) else f"{delta:+.1f}%",
                     f"{gbps:.3g}", f"{pct:.1f}", f"{nbytes:,}", variant, f"{method} x{runs}"]
            for j, c in enumerate(cells):
                it = QTableWidgetItem(c)
                if 1 <= j <= 5:
                    it.setTextAlignment(Qt.AlignRight | Qt.AlignVCenter)
                if j == 2 and not math.isnan(delta):
                    it.setForeground(QColor(170, 20, 20) if delta > 5 else QColor(20, 130, 20) if delta < -5 else QColor(0, 0, 0))
                t.setItem(i, j, it)
        t.resizeColumnsToContents()

    def _draw_bars(self) -> None:
        res = self.res
        bp = self.bar_plot.getPlotItem()
        if self.bars is not None:
            bp.removeItem(self.bars)
        for ti in self._bar_texts:
            bp.removeItem(ti)
        self._bar_texts = []
        g = np.array([max(t.gbps, 1e-6) for t in res.timings], np.float64)
        lg = np.log10(g)
        lo = math.floor(min(lg.min(), math.log10(max(res.copy_gbps, 1e-6)))) - 0.1
        y = np.arange(len(g), dtype=np.float64)
        brushes = [pg.mkBrush(*kernel_color(i), 210) for i in range(len(g))]
        self.bars = pg.BarGraphItem(x0=np.full(len(g), lo), x1=lg, y=y, height=0.6, brushes=brushes, pen=pg.mkPen(None))
        bp.addItem(self.bars)
        hi = max(lg.max(), math.log10(max(res.copy_gbps, 1e-6))) + 1.0
        for i, t in enumerate(res.timings):
            inside = (lg[i] - lo) > 0.6 * (hi - lo)  # long bars carry their label inside, right-aligned
            ti = pg.TextItem(f"{t.gbps:.3g} GB/s ({t.pct_of_copy:.1f}%)", color=(255, 255, 255) if inside else (30, 30, 30),
                             anchor=(1, 0.5) if inside else (0, 0.5))
            ti.setPos(lg[i], y[i])
            bp.addItem(ti)
            self._bar_texts.append(ti)
        self.copy_line.setValue(math.log10(max(res.copy_gbps, 1e-6)))
        self.copy_line.label.setFormat(f"copy {res.copy_gbps:.3g} GB/s")
        bp.getAxis("left").setTicks([[(float(i), f"{t.kernel}") for i, t in enumerate(res.timings)]])
        bp.setRange(xRange=(lo, hi), yRange=(-0.6, len(g) - 0.4), padding=0)
        bp.setTitle("Bandwidth per kernel (unique bytes / median) vs buffer copy", size="9pt")

    def _draw_history(self) -> None:
        hp = self.hist_plot.getPlotItem()
        hp.clear()
        self.hist_legend.clear()
        keys = []
        for e in self.history:
            for k in e["medians"]:
                if k not in keys:
                    keys.append(k)
        for i, k in enumerate(keys):
            xs = [e["run"] for e in self.history if k in e["medians"]]
            ys = [e["medians"][k] for e in self.history if k in e["medians"]]
            hp.plot(xs, ys, pen=pg.mkPen(kernel_color(i), width=1.5), symbol="o", symbolSize=5,
                    symbolBrush=kernel_color(i), name=k.split(" [")[0])
        hp.getAxis("bottom").setTicks([[(float(e["run"]), str(e["run"])) for e in self.history], []])
        hp.getAxis("left").setTicks(log_ticks([u for e in self.history for u in e["medians"].values()]))
        t = self.hist_table
        cols = ["run", "method", "shape", "context"] + [k.split(" [")[0] for k in keys]
        t.clear()
        t.setRowCount(len(self.history))
        t.setColumnCount(len(cols))
        t.setHorizontalHeaderLabels(cols)
        for i, e in enumerate(self.history):
            vals = [str(e["run"]), e["method"], e["heads"], ",".join(map(str, e["context_lens"]))]
            vals += [f"{e['medians'][k]:,.1f}" if k in e["medians"] else "" for k in keys]
            for j, v in enumerate(vals):
                t.setItem(i, j, QTableWidgetItem(v))
        t.resizeColumnsToContents()

    # ---------------------------------------------------------------- pin
    def pin_current(self) -> None:
        if self.res is None:
            return
        self.pinned = {timing_key(t): float(t.timing.median_us) for t in self.res.timings}
        self.pinned_run = len(self.history)
        self.refresh()

    def unpin(self) -> None:
        self.pinned = None
        self.pinned_run = 0
        if self.res is not None:
            self.refresh()

    # ---------------------------------------------------------------- sweep
    def _param_changed(self) -> None:
        ctx = self.sweep_param.currentData() == "context"
        self.sweep_values.setText("64, 128, 256, 512, 1024" if ctx else "1, 2, 4, 8, 16")

    def _sweep_clicked(self) -> None:
        try:
            values = parse_values(self.sweep_values.text())
        except ValueError:
            self.sweep_status.setText("Sweep values must be integers separated by commas.")
            return
        if not values:
            self.sweep_status.setText("Give at least one sweep value.")
            return
        self.sweep_status.setText(f"Sweeping {self.sweep_param.currentData()} over {values} ...")
        self.sweep_requested.emit(self.sweep_param.currentData(), values)

    def set_sweep(self, points: list, cancelled: bool = False) -> None:
        self.sweep_points = list(points)
        self.sweep_tab = sweep_table(self.sweep_points)
        spi = self.sweep_plot.getPlotItem()
        spi.clear()
        self.sweep_legend.clear()
        if not self.sweep_points:
            self.sweep_status.setText("Sweep cancelled before the first point." if cancelled else "Sweep returned no points.")
            return
        param = self.sweep_points[0]["param"]
        spi.setLabel("bottom", "tokens per sequence" if param == "context" else "sequences in the batch")
        kernels = []
        for r in self.sweep_tab.rows:
            if r[3] not in kernels:
                kernels.append(r[3])
        for i, k in enumerate(kernels):
            rows = [r for r in self.sweep_tab.rows if r[3] == k]
            spi.plot([float(r[1]) for r in rows], [float(r[4]) for r in rows], pen=pg.mkPen(kernel_color(i + 1), width=2),
                     symbol="o", symbolSize=6, symbolBrush=kernel_color(i + 1), name=k)
        spi.getAxis("left").setTicks(log_ticks([float(r[4]) for r in self.sweep_tab.rows]))
        xs = sorted({float(p["value"]) for p in self.sweep_points if p["value"] > 0})
        spi.getAxis("bottom").setTicks([[(math.log10(v), f"{v:g}") for v in xs], []])  # log axis: ticks in log10
        spi.setTitle(f"Kernel latency vs {param} ({self.res.config.method if self.res else ''}, median of runs)", size="9pt")
        n = len(self.sweep_points)
        self.sweep_status.setText(f"{n} point(s)" + (" - cancelled, partial sweep" if cancelled else "")
                                  + f"; {len(self.sweep_tab)} plotted points")
        self.tabs.setCurrentIndex(2)

    def tables(self) -> list:
        return [t for t in (self.timing_tab, self.hist_tab, self.sweep_tab) if t is not None]
