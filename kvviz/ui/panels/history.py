"""The GPU timing panel's History tab: the run history on disk (kvviz.history), across restarts.

Every run of the window is recorded (and every `kvviz bench`, from the command line). The tab lists
the runs newest first; selecting one plots its kernels' medians over every run of the same shape with
p10-p90 error bars. A run can be pinned as the baseline: the pin is stored in the database, so it is
still pinned after a restart, and the Kernels tab shows each kernel's change against it. The compare
view puts any two runs side by side, kernel by kernel, with the verdict of `kvviz diff` (a
Mann-Whitney U test on the samples: faster, slower or within noise).
"""
from __future__ import annotations

import logging
import math
from collections import Counter

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QColor
from PySide6.QtWidgets import (
    QAbstractItemView,
    QComboBox,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QSplitter,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from kvviz.history.db import HistoryDB, HistoryError, shape_label
from kvviz.history.diff import FASTER, SLOWER, TEST_NAME, diff, side_of_run
from kvviz.tables import Table
from kvviz.ui.style import kernel_color
from kvviz.ui.widgets.drawn_when_shown import DrawnWhenShown
from kvviz.ui.widgets.ticks import log_ticks

log = logging.getLogger("kvviz.ui.history")

VERDICT_COLORS = {FASTER: QColor(20, 130, 20), SLOWER: QColor(170, 20, 20)}
MAX_PLOTTED_KERNELS = 10
FAILED = object()  # what _guard returns when a database call failed


def _table() -> QTableWidget:
    t = QTableWidget()
    t.setEditTriggers(QAbstractItemView.NoEditTriggers)
    t.verticalHeader().setVisible(False)
    t.verticalHeader().setDefaultSectionSize(19)
    return t


def _fill(t: QTableWidget, headers, rows, colors=None, color_col: int = -1) -> None:
    t.clear()
    t.setColumnCount(len(headers))
    t.setHorizontalHeaderLabels(headers)
    t.setRowCount(len(rows))
    for i, r in enumerate(rows):
        for j, v in enumerate(r):
            it = QTableWidgetItem(str(v))
            if colors and colors[i] is not None and j == color_col % len(r):
                it.setForeground(colors[i])
            t.setItem(i, j, it)
    t.resizeColumnsToContents()


class HistoryView(DrawnWhenShown, QWidget):
    baseline_changed = Signal(object)  # the pinned kvviz.history.db.Run, or None

    RUN_COLUMNS = ["run", "created (UTC)", "source", "adapter", "method", "shapes", "kernels", "baseline"]
    COMPARE_COLUMNS = ["kernel", "variant", "verdict", "change", "A median (p10-p90) us", "B median (p10-p90) us",
                       "p", "shape"]

    def __init__(self, parent=None):
        super().__init__(parent)
        self.db: HistoryDB | None = None
        self._damaged_said: dict = {}  # the damaged runs last said in the log
        self.run_list: list = []
        self.comparison: dict | None = None
        self.runs_tab: Table | None = None
        self.curves: list = []  # (PlotDataItem, shape key) of the plotted series
        self.compare_tab: Table | None = None
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        top = QHBoxLayout()
        self.status = QLabel("No run history open.")
        self.status.setWordWrap(True)
        top.addWidget(self.status, 1)
        self.pin_button = QPushButton("Pin selected")
        self.pin_button.setToolTip("Make the selected run the baseline (kept in the history, across restarts)")
        self.pin_button.clicked.connect(self._pin_selected)
        self.unpin_button = QPushButton("Unpin")
        self.unpin_button.clicked.connect(self.unpin)
        self.refresh_button = QPushButton("Refresh")
        self.refresh_button.setToolTip("Read the history again (kvviz bench runs from a terminal appear)")
        self.refresh_button.clicked.connect(self.reload)
        for b in (self.pin_button, self.unpin_button, self.refresh_button):
            top.addWidget(b)
        lay.addLayout(top)
        split = QSplitter(Qt.Vertical)
        self.runs_table = _table()
        self.runs_table.setSelectionBehavior(QAbstractItemView.SelectRows)
        self.runs_table.setSelectionMode(QAbstractItemView.SingleSelection)
        self.runs_table.itemSelectionChanged.connect(self.redraw)
        split.addWidget(self.runs_table)
        self.plot = pg.PlotWidget()
        pi = self.plot.getPlotItem()
        pi.setLabel("bottom", "run")
        pi.setLabel("left", "median us, p10-p90 bars (log)")
        pi.showGrid(x=True, y=True, alpha=0.25)
        # The legend under the plot, in the plot item's own layout: it never covers the data.
        self.legend = pg.LegendItem(labelTextSize="7pt", colCount=2)
        self.legend.setParentItem(pi)
        pi.layout.addItem(self.legend, 4, 1)
        pi.legend = self.legend  # pi.plot(name=...) adds its curve here
        split.addWidget(self.plot)
        cmp = QWidget()
        cl = QVBoxLayout(cmp)
        cl.setContentsMargins(0, 0, 0, 0)
        row = QHBoxLayout()
        row.addWidget(QLabel("Compare run A"))
        self.a_box = QComboBox()
        row.addWidget(self.a_box, 1)
        row.addWidget(QLabel("with run B"))
        self.b_box = QComboBox()
        row.addWidget(self.b_box, 1)
        self.compare_button = QPushButton("Compare")
        self.compare_button.setToolTip(f"Kernel by kernel: medians, p10-p90 and a verdict ({TEST_NAME})")
        self.compare_button.clicked.connect(self._compare_clicked)
        row.addWidget(self.compare_button)
        cl.addLayout(row)
        self.compare_summary = QLabel(f"Verdicts: {TEST_NAME} on the samples; faster / slower / within noise.")
        self.compare_summary.setWordWrap(True)
        cl.addWidget(self.compare_summary)
        self.compare_table = _table()
        cl.addWidget(self.compare_table, 1)
        split.addWidget(cmp)
        split.setSizes([160, 170, 200])
        lay.addWidget(split, 1)
        self._set_enabled(False)

    # ------------------------------------------------------------------ the database
    def open(self, path=None) -> bool:
        """Open the history (default: the user's); a history that cannot be opened is said here and the
        rest of the window carries on without it."""
        if self.db is not None:
            self.db.close()
            self.db = None
        try:
            self.db = HistoryDB(path)
        except HistoryError as exc:
            self.status.setText(f"Run history not available: {exc.one_line()}")
            log.warning("run history not available: %s", exc.one_line())
            self._set_enabled(False)
            return False
        self._set_enabled(True)
        self.reload()
        return True

    def close_db(self) -> None:
        if self.db is not None:
            self.db.close()
            self.db = None
            self._set_enabled(False)

    def _set_enabled(self, on: bool) -> None:
        for w in (self.pin_button, self.unpin_button, self.refresh_button, self.compare_button, self.a_box, self.b_box):
            w.setEnabled(on)

    def _guard(self, what: str, fn, *args):
        """Run a database call; a failure is said in the tab, never raised into the window."""
        try:
            return fn(*args)
        except (HistoryError, OSError) as exc:
            msg = exc.one_line() if isinstance(exc, HistoryError) else str(exc)
        except Exception as exc:  # noqa: BLE001 - sqlite3 errors (locked, disk full): the app stays up
            msg = f"{type(exc).__name__}: {exc}"
        self.status.setText(f"{what} failed: {msg}")
        log.warning("run history: %s failed: %s", what, msg)
        return FAILED

    def record(self, res) -> int | None:
        """Record a window run; its id, or None when no history is open or the write failed."""
        if self.db is None:
            return None
        run_id = self._guard("recording the run", self.db.record_results, res)
        if run_id is FAILED:
            return None
        self.reload(select=run_id, b=run_id)  # the compare view's B follows the newest run
        return run_id

    def baseline(self):
        run = self._guard("reading the baseline", self.db.baseline) if self.db is not None else None
        return None if run is FAILED else run

    def pin(self, run_id: int) -> None:
        if self.db is None:
            return
        if self._guard("pinning", self.db.pin, int(run_id)) is not FAILED:
            self.reload(select=int(run_id), a=int(run_id))  # A: the baseline
            self.baseline_changed.emit(self.baseline())

    def unpin(self) -> None:
        if self.db is None:
            return
        if self._guard("unpinning", self.db.unpin) is not FAILED:
            self.reload()
            self.baseline_changed.emit(None)

    def _pin_selected(self) -> None:
        rid = self.selected_run()
        if rid is not None:
            self.pin(rid)

    def selected_run(self) -> int | None:
        rows = self.runs_table.selectionModel().selectedRows() if self.runs_table.selectionModel() else []
        if not rows:
            return None
        return self.run_list[rows[0].row()].id

    # ------------------------------------------------------------------ drawing
    def reload(self, select: int | None = None, a: int | None = None, b: int | None = None) -> None:
        """Read the runs again; `select` a run in the table, set the compare view's A and B."""
        if self.db is None:
            return
        runs = self._guard("reading the runs", self.db.runs, 500)
        if runs is FAILED:
            return
        self.run_list = runs
        base = next((r for r in runs if r.baseline), None)
        damaged = self.db.damaged
        self.status.setText(f"{len(runs)} run(s) in {self.db.path}" + (" (read-only)" if self.db.readonly else "")
                            + (f"; baseline: run {base.id}" if base else "; no baseline pinned")
                            + (f"; {len(damaged)} damaged run(s) skipped: " + ", ".join(map(str, damaged))
                               if damaged else ""))
        if damaged and damaged != self._damaged_said:  # said once, not on every reload
            self._damaged_said = dict(damaged)
            log.warning("run history %s: damaged run(s) skipped: %s", self.db.path,
                        "; ".join(f"run {i} ({why})" for i, why in damaged.items()))
        rows = [[r.id, r.created, r.source, r.adapter_name, r.method or "", "; ".join(r.shapes), r.kernel_count,
                 "pinned" if r.baseline else ""] for r in runs]
        self.runs_tab = Table("history_runs", list(self.RUN_COLUMNS), rows, "Run history (newest first)")
        keep = self.selected_run() if select is None else select
        self.runs_table.blockSignals(True)
        _fill(self.runs_table, self.RUN_COLUMNS, rows)
        self.runs_table.blockSignals(False)
        ids = [r.id for r in runs]
        if ids:
            self.runs_table.selectRow(ids.index(keep) if keep in ids else 0)
        self.redraw()  # every compute records a run: a hidden plot is drawn when its tab is shown
        a_keep = self.a_box.currentData() if a is None else a
        b_keep = self.b_box.currentData() if b is None else b
        for box in (self.a_box, self.b_box):
            box.blockSignals(True)
            box.clear()
            for r in runs:
                box.addItem(f"{r.id}: {r.source} {r.created} {r.method or '; '.join(r.shapes[:1])}", r.id)
            box.blockSignals(False)
        # defaults: A the baseline (else the run before the newest), B the newest
        a_def = a_keep if a_keep in ids else (base.id if base else (ids[1] if len(ids) > 1 else None))
        b_def = b_keep if b_keep in ids else (ids[0] if ids else None)
        if a_def is not None:
            self.a_box.setCurrentIndex(ids.index(a_def))
        if b_def is not None:
            self.b_box.setCurrentIndex(ids.index(b_def))

    def _draw(self) -> None:
        """The selected run's kernels over every run of the same shape: median with p10-p90 bars."""
        pi = self.plot.getPlotItem()
        pi.clear()
        self.legend.clear()
        self.curves = []
        rid = self.selected_run()
        if self.db is None or rid is None:
            return
        run = self._guard("reading the run", self.db.run, rid)
        if run is FAILED:
            return
        values, xs_all = [], set()

        # one curve per (kernel, variant, shape): a kernel timed on several shapes gets a curve per shape,
        # never one line through all of them, and its legend entry names the shape
        many = Counter((k.name, k.variant) for k in run.kernels[:MAX_PLOTTED_KERNELS])
        for i, k in enumerate(run.kernels[:MAX_PLOTTED_KERNELS]):
            series = self._guard("reading a kernel's history", self.db.kernel_series, k.name, k.variant, k.shape_key)
            if series is FAILED or not series:
                continue
            x = np.array([s[0] for s in series], np.float64)
            p10, med, p90 = (np.log10(np.maximum([s[j] for s in series], 1e-9)) for j in (1, 2, 3))
            color = kernel_color(i)
            name = k.name + (f" [{k.variant}]" if k.variant else "")
            if many[(k.name, k.variant)] > 1:
                name += f" ({shape_label(k.shape)})"
            curve = pi.plot(x, med, pen=pg.mkPen(color, width=1.5), symbol="o", symbolSize=5, symbolBrush=color,
                            name=name)
            self.curves.append((curve, k.shape_key))
            pi.addItem(pg.ErrorBarItem(x=x, y=med, top=p90 - med, bottom=med - p10, beam=0.12, pen=pg.mkPen(color)))
            values += [s[j] for s in series for j in (1, 2, 3)]
            xs_all.update(int(v) for v in x)
        ticks = log_ticks(values)
        if ticks:
            pi.getAxis("left").setTicks(ticks)
        pi.getAxis("bottom").setTicks([[(float(v), str(v)) for v in sorted(xs_all)], []])
        pi.setTitle(f"Kernels of run {run.id} over the runs of its shape", size="9pt")

    # ------------------------------------------------------------------ compare
    def _compare_clicked(self) -> None:
        a, b = self.a_box.currentData(), self.b_box.currentData()
        if a is None or b is None:
            self.compare_summary.setText("Pick two runs.")
            return
        self.compare(int(a), int(b))

    def compare(self, a_id: int, b_id: int) -> dict | None:
        """Diff run B against run A (kvviz.history.diff) and show it."""
        if self.db is None:
            return None
        ra = self._guard("reading run A", self.db.run, a_id)
        rb = self._guard("reading run B", self.db.run, b_id) if ra is not FAILED else FAILED
        if ra is FAILED or rb is FAILED:
            return None
        d = diff(side_of_run(ra), side_of_run(rb))
        self.comparison = d
        rows, colors = [], []

        def stat(s):
            return f"{s['median_us']:,.1f} ({s['p10_us']:,.1f}-{s['p90_us']:,.1f})"

        for r in d["rows"]:
            ch = "" if r["change_pct"] is None else f"{r['change_pct']:+.1f}%"
            p = "" if r["p_value"] is None or math.isnan(r["p_value"]) else f"{r['p_value']:.2g}"
            rows.append([r["kernel"], r["variant"], r["verdict"], ch, stat(r["a"]), stat(r["b"]), p, r["shape"]])
            colors.append(VERDICT_COLORS.get(r["verdict"]))
        _fill(self.compare_table, self.COMPARE_COLUMNS, rows, colors, color_col=2)
        self.compare_tab = Table("history_compare", list(self.COMPARE_COLUMNS), rows, f"Run {b_id} against run {a_id}")
        c = d["counts"]
        extra = [f"only in A: {len(d['only_in_a'])}" if d["only_in_a"] else "",
                 f"only in B: {len(d['only_in_b'])}" if d["only_in_b"] else ""] + d["notes"]
        self.compare_summary.setText(
            f"Run {b_id} against run {a_id}: {c[FASTER]} faster, {c[SLOWER]} slower, {c['within noise']} within noise "
            f"({TEST_NAME})" + "".join(f"; {e}" for e in extra if e))
        return d

    def tables(self) -> list:
        return [t for t in (self.runs_tab, self.compare_tab) if t is not None]
