"""GPU timing panel: the kernels of the last run (median, min-p90, bytes, GB/s, % of copy, timing
method), their bandwidth against the copy line (p10-p90 error bars), the run history on disk (History
tab, kvviz/ui/panels/history.py), a pinned baseline kept there (delta % per kernel, coloured by the
samples' verdict), a latency sweep over context length or batch size and the timeline of the last
run's dispatches (Timeline tab, kvviz/ui/widgets/timeline.py).
"""
from __future__ import annotations

import math

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QColor
from PySide6.QtWidgets import (
    QAbstractItemView,
    QComboBox,
    QLabel,
    QLineEdit,
    QPushButton,
    QSplitter,
    QTableWidget,
    QTableWidgetItem,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from kvviz.history.diff import FASTER, SLOWER, TEST_NAME, compare_samples
from kvviz import units
from kvviz.tables import (
    history_entry, history_table, partitions_of, series_name, sweep_table, timing_key, timings_table,
)
from kvviz.ui.layouts import FlowLayout, labelled
from kvviz.ui.panels.base import Panel
from kvviz.ui.panels.history import HistoryView
from kvviz.ui.style import WARN_BG, WARN_FG, fit_title, kernel_color, legend_below
from kvviz.ui.widgets.axes import set_axis
from kvviz.ui.widgets.hover import Hover, nearest
from kvviz.ui.widgets.timeline import TimelineWidget
from kvviz.ui.widgets.tables import select_row

SOFTWARE_FLAG = "lavapipe: CPU timings, not GPU"


def parse_values(text: str) -> list:
    """Sweep values typed as "64, 128, 256": positive integers; ValueError naming the first bad one."""
    out = []
    for p in text.replace(";", ",").replace(" ", ",").split(","):
        p = p.strip()
        if not p:
            continue
        try:
            v = int(p)
        except ValueError:
            raise ValueError(f"Sweep value {p!r} is not an integer: give positive integers separated by commas.") from None
        if v < 1:
            raise ValueError(f"Sweep value {v} is not a positive integer: give token counts or sequence counts >= 1.")
        out.append(v)
    return out


class TimingPanel(Panel):
    key = "timing"
    title = "GPU timing"
    baseline_keys = ("decode_us", "f32_decode_us", "copy_gbps")  # said against the pinned run (Panel.sync_deltas)
    sweep_requested = Signal(str, object)  # param, values
    kernel_selected = Signal(str)  # "kernel [variant]" clicked in the table, the bars or the timeline

    def __init__(self, state=None, parent=None):
        super().__init__(state, parent)
        self.history: list = []
        self.pinned: dict | None = None
        self.pinned_run = 0
        self.pinned_samples: dict = {}  # "kernel [variant]" -> samples of the pinned run (verdicts)
        self.run_id: int | None = None  # the last results' id in the run history
        self._bar_errors = None
        self.sweep_points: list = []
        self.timing_tab = self.hist_tab = self.sweep_tab = None
        self._bar_texts = []
        self.selected_key = ""  # the kernel selected in every linked view (select_kernel)
        self._sweep_series: list = []  # (name, xs, medians, rows) of the drawn sweep series (hover)

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
        self.warn.setWordWrap(True)  # the adapter's name may be long: the line wraps, never cut
        self.body.addWidget(self.warn)

        self.tabs = QTabWidget()
        # --- kernels
        kern = QSplitter(Qt.Vertical)
        self.table = QTableWidget()
        self.table.setEditTriggers(QAbstractItemView.NoEditTriggers)
        self.table.setSelectionBehavior(QAbstractItemView.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SingleSelection)
        self.table.verticalHeader().setVisible(False)
        self.table.verticalHeader().setDefaultSectionSize(19)
        self.table.itemSelectionChanged.connect(self._table_selection)
        kern.addWidget(self.table)
        self.bar_plot = pg.PlotWidget()
        bp = self.bar_plot.getPlotItem()
        set_axis(bp, "bottom", "bandwidth", "B/s", 1e9)  # the bars are GB/s
        set_axis(bp, "left", "kernel")
        bp.showGrid(x=True, y=False, alpha=0.3)
        bp.setLogMode(x=True, y=False)
        bp.setMouseEnabled(x=False, y=False)
        bp.invertY(True)
        # the copy's bandwidth as a dashed line, its value in the title (a label on the line sat on a bar's text)
        self.copy_line = pg.InfiniteLine(angle=90, pen=pg.mkPen((200, 30, 30), width=2, style=Qt.DashLine))
        bp.addItem(self.copy_line)
        bp.vb.sigResized.connect(lambda *_: self._place_bar_labels())
        self._bar_geom = None  # where the drawn bars and whiskers are: their labels are placed to fit the view
        self.bars = None
        self.bar_hover = Hover(bp, self._describe_bar, crosshair="y")
        self.bar_hover.clicked.connect(lambda x, y: self._select_row(int(round(y))))
        kern.addWidget(self.bar_plot)
        kern.setStretchFactor(0, 2)
        kern.setStretchFactor(1, 3)
        kern.setSizes([180, 270])
        self.tabs.addTab(kern, "Kernels")
        # --- history (on disk: kvviz.history; opened by attach_history)
        self.history_view = HistoryView()
        self.history_view.baseline_changed.connect(self._baseline_changed)
        self.tabs.addTab(self.history_view, "History")
        # --- sweep
        sw = QWidget()
        sl = QVBoxLayout(sw)
        sl.setContentsMargins(0, 0, 0, 0)
        row = FlowLayout()  # wraps in a narrow dock
        self.sweep_param = QComboBox()
        self.sweep_param.addItem("context length", "context")
        self.sweep_param.addItem("batch (sequences)", "batch")
        self.sweep_param.currentIndexChanged.connect(self._param_changed)
        self.sweep_values = QLineEdit("64, 128, 256, 512, 1024")
        self.sweep_values.setToolTip("Values of the swept parameter, comma separated")
        self.sweep_button = QPushButton("Run sweep")
        self.sweep_button.clicked.connect(self._sweep_clicked)
        self.sweep_values.setMinimumWidth(self.sweep_values.fontMetrics().horizontalAdvance("64, 128, 256, 512, 1024") + 16)
        row.addWidget(labelled("Sweep", self.sweep_param))
        row.addWidget(self.sweep_values)
        row.addWidget(self.sweep_button)
        sl.addLayout(row)
        self.sweep_plot = pg.PlotWidget()
        spi = self.sweep_plot.getPlotItem()
        set_axis(spi, "left", "median time per run", "s", 1e-6)  # the sweep's times are microseconds
        set_axis(spi, "bottom", "tokens per sequence")
        spi.setLogMode(x=True, y=True)
        spi.showGrid(x=True, y=True, alpha=0.25)
        self.sweep_legend = legend_below(spi, columns=2)  # under the axis: never over the curves
        self.sweep_plot.setMinimumHeight(220)
        self.sweep_hover = Hover(spi, self._describe_sweep_point)
        sl.addWidget(self.sweep_plot, 1)
        self.sweep_status = QLabel("No sweep yet: runs Session.sweep in the worker (cancel with Esc).")
        sl.addWidget(self.sweep_status)
        self.tabs.addTab(sw, "Sweep")
        # --- timeline of the last run's dispatches
        self.timeline = TimelineWidget()
        self.timeline.track_clicked.connect(self._select_row)
        self.tabs.addTab(self.timeline, "Timeline")
        self.body.addWidget(self.tabs, 1)

    # ---------------------------------------------------------------- results
    def attach_history(self, path=None) -> bool:
        """Open the run history (default: the user's data directory): every later set_results is
        recorded there, and a baseline pinned in an earlier session is pinned again."""
        if not self.history_view.open(path):
            return False
        self._baseline_changed(self.history_view.baseline())
        return True

    def set_results(self, res) -> None:
        self.history.append(history_entry(res, len(self.history) + 1))
        self.run_id = None  # these results are not in the run history until a Run, a pin or a sweep keeps them
        self.timeline.set_timings(res.timings)
        super().set_results(res)

    def refresh(self) -> None:
        res = self.res
        if res is None:
            return
        self.warn.setVisible(bool(res.adapter.is_software))
        self.warn.setText(f"{SOFTWARE_FLAG}  ({res.adapter.name})")
        self.timing_tab = timings_table(res, self.pinned)
        self.hist_tab = history_table(self.history)
        methods = sorted({t.timing.method for t in res.timings})
        floor = res.timing_floor_us
        self.info.setText(f"timing: {', '.join(methods)}; copy {res.copy_gbps:.2f} GB/s"
                          + (f"; timing floor {floor:.1f} us (a near-empty dispatch in its own pass: a row near it is "
                             "mostly fixed cost)" if floor == floor else "")
                          + (f"; pinned run {self.pinned_run}" if self.pinned else ""))
        self._fill_table()
        self._draw_bars()

    def _fill_table(self) -> None:
        t = self.table
        tab = self.timing_tab
        # "impl": seed (as given), first-wave, fast or baseline (kvviz/gpu/timed.py), so a method's seed and
        # fast kernels read side by side
        headers = ["kernel", "median us (min-p90)", "vs pin", "GB/s", "% of copy", "bytes", "impl", "variant", "timing"]
        t.clear()
        t.setRowCount(len(tab.rows))
        t.setColumnCount(len(headers))
        t.setHorizontalHeaderLabels(headers)
        for i, r in enumerate(tab.rows):
            kernel, variant, med, mn, p90, runs, nbytes, gbps, pct, method, delta = r
            impl = getattr(self.res.timings[i], "impl", "") if self.res is not None and i < len(self.res.timings) else ""
            cells = [kernel, f"{med:,.1f} ({mn:,.1f}-{p90:,.1f})", "" if math.isnan(delta) else f"{delta:+.1f}%",
                     f"{gbps:.3g}", f"{pct:.1f}", f"{nbytes:,}", impl, variant, f"{method} x{runs}"]
            for j, c in enumerate(cells):
                it = QTableWidgetItem(c)
                if 1 <= j <= 5:
                    it.setTextAlignment(Qt.AlignRight | Qt.AlignVCenter)
                if j == 2 and not math.isnan(delta):
                    self._verdict_cell(it, i)
                t.setItem(i, j, it)
        t.resizeColumnsToContents()
        self._show_selection()

    def _verdict_cell(self, it, i: int) -> None:
        """Colour a "vs pin" cell by the samples' verdict against the pinned run (not by a fixed %)."""
        row = self.res.timings[i]
        ref = self.pinned_samples.get(timing_key(row))
        if not ref:
            return
        v = compare_samples(ref, row.timing.samples_us)
        it.setForeground(QColor(20, 130, 20) if v.verdict == FASTER else QColor(170, 20, 20) if v.verdict == SLOWER
                         else QColor(0, 0, 0))
        it.setToolTip(f"{v.verdict} than pinned run {self.pinned_run} (p = {v.p_value:.2g}, {TEST_NAME}"
                      + (f"; {v.note}" if v.note else "") + ")")

    def _draw_bars(self) -> None:
        res = self.res
        bp = self.bar_plot.getPlotItem()
        if self._bar_errors is not None:
            bp.removeItem(self._bar_errors)
            self._bar_errors = None
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
        # p10-p90 of the samples as GB/s (the p90 time is the low bandwidth end)
        lo_g = np.log10([max(t.bytes_moved / (t.timing.p90_us * 1e-6) / 1e9, 1e-6) if t.timing.p90_us > 0 else g[i]
                         for i, t in enumerate(res.timings)])
        hi_g = np.log10([max(t.bytes_moved / (t.timing.p10_us * 1e-6) / 1e9, 1e-6) if t.timing.p10_us > 0 else g[i]
                         for i, t in enumerate(res.timings)])
        self._bar_errors = pg.ErrorBarItem(x=lg, y=y, left=np.maximum(lg - lo_g, 0), right=np.maximum(hi_g - lg, 0),
                                           beam=0.25, pen=pg.mkPen((20, 20, 20), width=1.2))
        bp.addItem(self._bar_errors)
        hi = max(hi_g.max(), lg.max(), math.log10(max(res.copy_gbps, 1e-6))) + 0.3
        for i, t in enumerate(res.timings):
            ti = pg.TextItem(f"{units.si(t.gbps * 1e9, 'B/s')} ({t.pct_of_copy:.1f}%)", color=(30, 30, 30), anchor=(0, 0.5))
            ti.setPos(lg[i], y[i])
            bp.addItem(ti)
            self._bar_texts.append(ti)
        self.copy_line.setValue(math.log10(max(res.copy_gbps, 1e-6)))
        bp.getAxis("left").setTicks([[(float(i), f"{t.kernel}") for i, t in enumerate(res.timings)]])
        bp.setYRange(-0.6, len(g) - 0.4, padding=0)
        self._bar_geom = (lg, np.maximum(hi_g, lg), lo, max(hi, hi_g.max()), y, np.minimum(lo_g, lg))
        self._place_bar_labels()
        self._show_selection()
        # a row per kernel at least as tall as its label's line (and the first and last label, 0.6 row from the
        # view's edge, inside it), plus the title and the bottom axis: a short dock scrolls rather than stacking
        # the labels on each other (set after _bar_geom: the resize re-places the labels)
        row = self.bar_plot.fontMetrics().height() + 4
        self.bar_plot.setMinimumHeight(int((len(g) + 0.2) * row) + 95)
        fit_title(bp, ["Bandwidth per kernel", "unique bytes / median",
                       f"dashed: buffer copy {units.si(res.copy_gbps * 1e9, 'B/s')}"], "9pt")

    def _place_bar_labels(self) -> None:
        """Each bar's "GB/s (% of copy)" label inside its bar (white, at its start) where the bar is long enough
        for it left of its p10-p90 whisker, else just past the whisker's end; the axis reaches far enough right
        for every outside label to show whole at the view's width (re-placed when the plot is resized)."""
        if self._bar_geom is None or not self._bar_texts:
            return
        # ends: the bars' p10-p90 whisker ends (outside labels start there); starts: the whiskers' left ends
        lg, ends, lo, hi0, y, starts = self._bar_geom
        bp = self.bar_plot.getPlotItem()
        width = max(bp.vb.width(), 40.0)
        fm = self.bar_plot.fontMetrics()
        texts = [ti.textItem.toPlainText() for ti in self._bar_texts]
        tw = np.array([fm.horizontalAdvance(t) + 8 for t in texts], np.float64)
        hi = hi0
        for _ in range(12):  # the decades per pixel depend on hi: settle it (a wider axis can move a label out)
            px = width / (hi - lo)  # pixels per decade
            inside = (starts - lo) * px >= tw + 8  # left-aligned in the bar, clear of its whisker
            need = [ends[i] + tw[i] / px for i in range(len(lg)) if not inside[i]]
            if not need or max(need) <= hi + 1e-9:
                break
            # hi so that end + tw * (hi - lo) / width <= hi for every outside label
            hi = max(hi, *[lo + (ends[i] - lo) * width / max(width - tw[i], width * 0.1)
                           for i in range(len(lg)) if not inside[i]])
        for i, ti in enumerate(self._bar_texts):
            ti.setColor((255, 255, 255) if inside[i] else (30, 30, 30))
            ti.setAnchor((0, 0.5))
            ti.setPos(lo + 5 / px if inside[i] else ends[i], y[i])
        if abs(bp.vb.viewRange()[0][1] - hi) > 1e-9 or abs(bp.vb.viewRange()[0][0] - lo) > 1e-9:
            bp.setXRange(lo, hi, padding=0)

    # ---------------------------------------------------------------- pin
    def pin_current(self) -> None:
        """Pin the last results as the baseline: in the run history (it stays pinned across restarts)
        when one is open, else for this panel only."""
        if self.res is None:
            return
        if self.run_id is None and self.history_view.db is not None:
            # results of an automatic recompute are not in the history yet: pinning them keeps them
            self.run_id = self.history_view.record(self.res, "run")
        if self.run_id is not None:
            self.history_view.pin(self.run_id)  # -> baseline_changed -> _baseline_changed
            return
        self.pinned = {timing_key(t): float(t.timing.median_us) for t in self.res.timings}
        self.pinned_samples = {timing_key(t): tuple(t.timing.samples_us) for t in self.res.timings}
        self.pinned_run = len(self.history)
        self.refresh()

    def unpin(self) -> None:
        if self.history_view.db is not None:
            self.history_view.unpin()  # -> baseline_changed(None) -> _baseline_changed
        else:
            self._baseline_changed(None)

    def _baseline_changed(self, run) -> None:
        """The pinned run of the history (a kvviz.history.db.Run) or None."""
        if run is None:
            self.pinned, self.pinned_samples, self.pinned_run = None, {}, 0
        else:
            self.pinned = run.medians()
            self.pinned_samples = {k.key: tuple(k.samples_us) for k in run.kernels}
            self.pinned_run = run.id
        if self.res is not None:
            self.refresh()

    # ---------------------------------------------------------------- sweep
    def _param_changed(self) -> None:
        ctx = self.sweep_param.currentData() == "context"
        self.sweep_values.setText("64, 128, 256, 512, 1024" if ctx else "1, 2, 4, 8, 16")

    def _sweep_clicked(self) -> None:
        try:
            values = parse_values(self.sweep_values.text())
        except ValueError as exc:
            self.sweep_status.setText(str(exc))
            self.sweep_values.setStyleSheet("border: 1px solid #c0392b;")
            self.sweep_values.setToolTip(str(exc))
            return
        self.sweep_values.setStyleSheet("")
        self.sweep_values.setToolTip("Values of the swept parameter, comma separated")
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
        set_axis(spi, "bottom", "tokens per sequence" if param == "context" else "sequences in the batch")
        # one series per kernel across the sweep: the fast decode's partition count changes with the shape, and
        # is said by each point's hover readout, not by a series of its own
        kernels = []
        for r in self.sweep_tab.rows:
            if series_name(r[3]) not in kernels:
                kernels.append(series_name(r[3]))
        self._sweep_series = []
        for i, k in enumerate(kernels):
            rows = sorted((r for r in self.sweep_tab.rows if series_name(r[3]) == k), key=lambda r: float(r[1]))
            xs, ys = [float(r[1]) for r in rows], [float(r[4]) for r in rows]
            spi.plot(xs, ys, pen=pg.mkPen(kernel_color(i + 1), width=2),
                     symbol="o", symbolSize=6, symbolBrush=kernel_color(i + 1), name=k)
            self._sweep_series.append((k, xs, ys, rows))
            # p10-p90 of the timed runs as error bars, in the log10 space the axes plot in
            pts = [(float(r[1]), float(r[4]), float(r[8]), float(r[6])) for r in rows
                   if r[1] > 0 and np.isfinite(float(r[8])) and np.isfinite(float(r[6])) and float(r[8]) > 0]
            if pts:
                x, med, p10, p90 = (np.log10(np.array(c)) for c in zip(*pts))
                spi.addItem(pg.ErrorBarItem(x=x, y=med, top=np.maximum(p90 - med, 0), bottom=np.maximum(med - p10, 0),
                                            beam=0.02, pen=pg.mkPen(kernel_color(i + 1), width=1)))
        fit_title(spi, [f"Kernel latency vs {param}", f"{self.res.config.method if self.res else ''}", "median of runs"],
                  "9pt")
        n = len(self.sweep_points)
        self.sweep_status.setText(f"{n} point(s)" + (" - cancelled, partial sweep" if cancelled else "")
                                  + f"; {len(self.sweep_tab)} plotted points")
        self.tabs.setCurrentIndex(2)

    def _describe_sweep_point(self, x: float, y: float) -> str | None:
        vb = self.sweep_plot.getPlotItem().getViewBox()
        best = None
        for name, xs, ys, rows in self._sweep_series:
            lx = [math.log10(v) if v > 0 else float("nan") for v in xs]
            ly = [math.log10(v) if v > 0 else float("nan") for v in ys]
            i = nearest(lx, ly, x, y, vb)
            if i is not None:
                d = math.hypot((lx[i] - x) / vb.viewPixelSize()[0], (ly[i] - y) / vb.viewPixelSize()[1])
                if best is None or d < best[0]:
                    best = (d, name, rows[i])
        if best is None:
            return None
        _d, name, r = best
        parts = partitions_of(r[3])
        what = "tokens per sequence" if r[0] == "context" else "sequences"
        return (f"{name}\n{what} {r[1]} ({r[2]} tokens)\nmedian {units.time_us(r[4])} "
                f"(p10-p90 {units.time_us(r[8])}-{units.time_us(r[6])})"
                + (f"\n{parts} partitions" if parts else ""))

    # ---------------------------------------------------------------- the selected kernel (linked views)
    def _describe_bar(self, x: float, y: float) -> str | None:
        res = self.res
        i = int(round(y))
        if res is None or not 0 <= i < len(res.timings) or abs(y - i) > 0.35:
            return None
        t = res.timings[i]
        tm = t.timing
        return (f"{t.kernel} [{t.variant}]\n{units.si(t.gbps * 1e9, 'B/s')} ({t.pct_of_copy:.1f}% of copy)\n"
                f"median {units.time_us(tm.median_us)} (min {units.time_us(tm.min_us)}, p90 {units.time_us(tm.p90_us)})\n"
                f"{units.nbytes(t.bytes_moved)} moved; click: select it everywhere")

    def _table_selection(self) -> None:
        rows = self.table.selectionModel().selectedRows() if self.table.selectionModel() else []
        if rows:
            self._select_row(rows[0].row())

    def _select_row(self, i: int) -> None:
        res = self.res
        if res is None or not 0 <= i < len(res.timings):
            return
        key = timing_key(res.timings[i])
        if key != self.selected_key:
            self.select_kernel(key)
            self.kernel_selected.emit(key)

    def select_kernel(self, key: str) -> None:
        """Show `key` ("kernel [variant]") as the selected kernel: its table row, its bar, its timeline track."""
        self.selected_key = key
        self._show_selection()

    def selected_index(self) -> int | None:
        res = self.res
        if res is None or not self.selected_key:
            return None
        keys = [timing_key(t) for t in res.timings]
        return keys.index(self.selected_key) if self.selected_key in keys else None

    def _show_selection(self) -> None:
        i = self.selected_index()
        t = self.table
        t.blockSignals(True)
        if i is None:
            t.clearSelection()
        else:
            select_row(t, i)
        t.blockSignals(False)
        if self.bars is not None and self.res is not None:
            n = len(self.res.timings)
            pens = [pg.mkPen((0, 0, 0), width=2.5) if j == i else pg.mkPen(None) for j in range(n)]
            self.bars.setOpts(pens=pens)
        self.timeline.set_selected_track(i)

    def tables(self) -> list:
        return [t for t in (self.timing_tab, self.hist_tab, self.sweep_tab) if t is not None]
