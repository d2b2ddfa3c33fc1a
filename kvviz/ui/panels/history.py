"""The GPU timing panel's History tab: the run history on disk (kvviz.history), across restarts.

The runs worth keeping are recorded: a Run (F5), a pin, a timing sweep and a method comparison in the
window, every `kvviz bench` from the command line; an automatic recompute is not (window runs of an older
kvviz, recorded on every compute, are kind "auto" and listed only under "all, with auto"). The tab lists the
runs newest first, filtered by kind and by a text in their name or method; a run can be named, deleted,
and opened in the window as it was computed (its stored results, no recompute). Selecting one plots its
kernels' medians over every run of the same shape with p10-p90 error bars. A run can be pinned as the
baseline: the pin is stored in the database, so it is still pinned after a restart, and every panel with
a number shows its change against it. The compare view puts any two runs side by side, kernel by kernel,
with the verdict of `kvviz diff` (a Mann-Whitney U test on the samples: faster, slower or within noise).
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
    QInputDialog,
    QLabel,
    QLineEdit,
    QMessageBox,
    QPushButton,
    QSplitter,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from kvviz.history.db import HIDDEN_KINDS, KINDS, HistoryDB, HistoryError, shape_label
from kvviz.ui.layouts import FlowLayout, labelled
from kvviz.history.diff import FASTER, SLOWER, TEST_NAME, diff, side_of_run
from kvviz.tables import Table, shorten
from kvviz import units
from kvviz.ui.style import fit_legend_columns, kernel_color, legend_below
from kvviz.ui.widgets.axes import set_axis
from kvviz.ui.widgets.drawn_when_shown import DrawnWhenShown
from kvviz.ui.widgets.hover import Hover, nearest
from kvviz.ui.widgets.tables import select_row

log = logging.getLogger("kvviz.ui.history")

VERDICT_COLORS = {FASTER: QColor(20, 130, 20), SLOWER: QColor(170, 20, 20)}
MAX_PLOTTED_KERNELS = 10
LEGEND_ROW_PX = 22  # one row of the legend under the plot (7pt text and its sample line)
DATA_MIN_PX = 240  # the title, at least ~150 px of data and the run axis above the legend
LEGEND_NAME_CHARS = 34  # a legend entry's name, shortened in the middle (the hover readout says it whole)
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


# the runs the list shows: (label, kinds or None for every kind, hidden kinds too)
SHOWN = [("kept runs", None, False), ("all, with auto", None, True)] + [(k, (k,), True) for k in KINDS]


def short_name(r, width: int = 24) -> str:
    name = r.label if len(r.label) <= width else r.label[:width - 1] + "\u2026"
    return f"run {r.id}" + (f" '{name}'" if name else "") + f" ({r.kind or r.source})"


class HistoryView(DrawnWhenShown, QWidget):
    baseline_changed = Signal(object)  # the pinned kvviz.history.db.Run, or None
    open_requested = Signal(int)  # a run id: show it in the window as it was computed

    RUN_COLUMNS = ["run", "name", "kind", "created (UTC)", "method", "shapes", "kernels", "results", "baseline"]
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
        lay.setSpacing(3)
        self.status = QLabel("No run history open.")
        self.status.setWordWrap(True)
        lay.addWidget(self.status)
        # which runs: by kind (automatic recomputes of an older kvviz hidden unless asked for) and by a text
        filters = FlowLayout()
        self.kind_box = QComboBox()
        for label, kinds, hidden in SHOWN:
            self.kind_box.addItem(label, (kinds, hidden))
        self.kind_box.setToolTip("Which runs to list: those kept (Run, pin, sweep, comparison, bench), every run "
                                 f"(with the {', '.join(HIDDEN_KINDS)} runs an older kvviz recorded on every "
                                 "recompute), or one kind")
        self.kind_box.currentIndexChanged.connect(lambda *_: self.reload())
        self.filter_edit = QLineEdit()
        self.filter_edit.setPlaceholderText("name or method")
        self.filter_edit.setClearButtonEnabled(True)
        self.filter_edit.setToolTip("List the runs whose name or method contains this text")
        self.filter_edit.textChanged.connect(lambda *_: self.reload())
        filters.addWidget(labelled("Show", self.kind_box))
        filters.addWidget(labelled("Filter", self.filter_edit))
        lay.addLayout(filters)
        actions = FlowLayout()
        self.open_button = QPushButton("Open")
        self.open_button.setToolTip("Show the selected run in the window as it was computed (its stored results, no "
                                    "recompute)")
        self.open_button.clicked.connect(self._open_selected)
        self.name_button = QPushButton("Name...")
        self.name_button.setToolTip("Name the selected run")
        self.name_button.clicked.connect(self._name_selected)
        self.delete_button = QPushButton("Delete...")
        self.delete_button.setToolTip("Delete the selected runs (and their stored results)")
        self.delete_button.clicked.connect(self._delete_selected)
        self.pin_button = QPushButton("Pin selected")
        self.pin_button.setToolTip("Make the selected run the baseline (kept in the history, across restarts)")
        self.pin_button.clicked.connect(self._pin_selected)
        self.unpin_button = QPushButton("Unpin")
        self.unpin_button.clicked.connect(self.unpin)
        self.refresh_button = QPushButton("Refresh")
        self.refresh_button.setToolTip("Read the history again (kvviz bench runs from a terminal appear)")
        self.refresh_button.clicked.connect(self.reload)
        for b in (self.open_button, self.name_button, self.delete_button, self.pin_button, self.unpin_button,
                  self.refresh_button):
            actions.addWidget(b)
        lay.addLayout(actions)
        split = QSplitter(Qt.Vertical)
        split.setChildrenCollapsible(False)
        self.runs_table = _table()
        self.runs_table.setSelectionBehavior(QAbstractItemView.SelectRows)
        self.runs_table.setSelectionMode(QAbstractItemView.ExtendedSelection)
        self.runs_table.setMinimumHeight(90)
        self.runs_table.itemSelectionChanged.connect(self.redraw)
        self.runs_table.itemDoubleClicked.connect(lambda *_: self._open_selected())
        split.addWidget(self.runs_table)
        self.plot = pg.PlotWidget()
        pi = self.plot.getPlotItem()
        set_axis(pi, "bottom", "run")
        set_axis(pi, "left", "median (p10-p90)", "s", 1e-6)  # the history's times are microseconds
        pi.setLogMode(x=False, y=True)
        pi.showGrid(x=True, y=True, alpha=0.25)
        # The legend under the plot, in the plot item's own layout: it never covers the data. The plot is kept
        # tall enough for the data above a full legend (MAX_PLOTTED_KERNELS entries in two columns).
        self.legend = legend_below(pi, columns=2, size="7pt")
        self.plot.setMinimumHeight(LEGEND_ROW_PX * ((MAX_PLOTTED_KERNELS + 1) // 2) + DATA_MIN_PX)
        self.points: list = []  # (name, runs, log10 medians, series) of the drawn curves (hover)
        self.hover = Hover(pi, self._describe_point)
        split.addWidget(self.plot)
        cmp = QWidget()
        cl = QVBoxLayout(cmp)
        cl.setContentsMargins(0, 0, 0, 0)
        row = FlowLayout()
        self.a_box = QComboBox()
        self.b_box = QComboBox()
        self.compare_button = QPushButton("Compare")
        self.compare_button.setToolTip(f"Kernel by kernel: medians, p10-p90 and a verdict ({TEST_NAME})")
        self.compare_button.clicked.connect(self._compare_clicked)
        row.addWidget(labelled("Compare run A", self.a_box))
        row.addWidget(labelled("with run B", self.b_box))
        row.addWidget(self.compare_button)
        cl.addLayout(row)
        self.compare_summary = QLabel(f"Verdicts: {TEST_NAME} on the samples; faster / slower / within noise.")
        self.compare_summary.setWordWrap(True)
        cl.addWidget(self.compare_summary)
        self.compare_table = _table()
        self.compare_table.setMinimumHeight(80)
        cl.addWidget(self.compare_table, 1)
        split.addWidget(cmp)
        split.setSizes([150, 240, 180])
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
        for w in (self.pin_button, self.unpin_button, self.refresh_button, self.compare_button, self.a_box, self.b_box,
                  self.open_button, self.name_button, self.delete_button, self.kind_box, self.filter_edit):
            w.setEnabled(on)
        if on and self.db is not None and self.db.readonly:
            for w in (self.pin_button, self.unpin_button, self.name_button, self.delete_button):
                w.setEnabled(False)

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

    def record(self, res, kind: str = "run", extra: dict | None = None) -> int | None:
        """Record a window run (a Run, a pin, a comparison with `extra` = its rows) with its results; its id, or None
        when no history is open or the write failed."""
        if self.db is None:
            return None
        run_id = self._guard("recording the run", self.db.record_results, res, "", kind, extra)
        return self._recorded(run_id)

    def record_sweep(self, res, points: list) -> int | None:
        """Record a timing sweep of the config of `res` (its points and every kernel's samples)."""
        if self.db is None or not points:
            return None
        return self._recorded(self._guard("recording the sweep", self.db.record_sweep, res, points))

    def _recorded(self, run_id) -> int | None:
        if run_id is FAILED:
            return None
        self.reload(select=run_id, b=run_id)  # the compare view's B follows the newest run
        return run_id

    def selected_runs(self) -> list[int]:
        rows = self.runs_table.selectionModel().selectedRows() if self.runs_table.selectionModel() else []
        return [self.run_list[r.row()].id for r in sorted(rows, key=lambda r: r.row())]

    def _open_selected(self) -> None:
        rid = self.selected_run()
        if rid is not None:
            self.open_requested.emit(rid)

    def rename(self, run_id: int, name: str) -> bool:
        if self.db is None or self._guard("naming the run", self.db.rename, int(run_id), name) is FAILED:
            return False
        self.reload(select=int(run_id))
        return True

    def _name_selected(self) -> None:
        rid = self.selected_run()
        if rid is None:
            return
        cur = next((r.label for r in self.run_list if r.id == rid), "")
        name, ok = QInputDialog.getText(self, f"Name run {rid}", "Name (empty: none)", QLineEdit.Normal, cur)
        if ok:
            self.rename(rid, name)

    def delete_runs(self, ids) -> list[int]:
        """Delete runs (a pinned one too: the baseline goes with it)."""
        if self.db is None or not ids:
            return []
        had_pin = any(r.baseline and r.id in ids for r in self.run_list)
        done = self._guard("deleting runs", self.db.delete, ids)
        if done is FAILED:
            return []
        self.reload()
        if had_pin:
            self.baseline_changed.emit(None)
        return done

    def _delete_selected(self) -> None:
        ids = self.selected_runs()
        if not ids:
            return
        what = f"run {ids[0]}" if len(ids) == 1 else f"{len(ids)} runs ({', '.join(map(str, ids))})"
        if QMessageBox.question(self, "Delete runs", f"Delete {what} and the results kept with it?") \
                == QMessageBox.Yes:
            self.delete_runs(ids)

    def baseline_run_id(self) -> int | None:
        """The pinned run's id (whether or not the list shows it)."""
        if self.db is None:
            return None
        rid = self._guard("reading the baseline", self.db.baseline_id)
        return None if rid is FAILED else rid

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
        kinds, hidden = self.kind_box.currentData() or (None, False)
        text = self.filter_edit.text().strip()
        runs = self._guard("reading the runs", lambda: self.db.runs(500, kinds=kinds, text=text, hidden=hidden))
        if runs is FAILED:
            return
        self.run_list = runs
        base = self.baseline_run_id()
        damaged = self.db.damaged
        shown = self.kind_box.currentText() + (f" matching '{text}'" if text else "")
        self.status.setText(f"{len(runs)} run(s) ({shown}) in {self.db.path}" + (" (read-only)" if self.db.readonly else "")
                            + (f"; baseline: run {base}" if base else "; no baseline pinned")
                            + (f"; {len(damaged)} damaged run(s) skipped: " + ", ".join(map(str, damaged))
                               if damaged else ""))
        if damaged and damaged != self._damaged_said:  # said once, not on every reload
            self._damaged_said = dict(damaged)
            log.warning("run history %s: damaged run(s) skipped: %s", self.db.path,
                        "; ".join(f"run {i} ({why})" for i, why in damaged.items()))
        rows = [[r.id, r.label, r.kind or r.source, r.created, r.method or "", "; ".join(r.shapes), r.kernel_count,
                 "stored" if r.snapshot else "", "pinned" if r.baseline else ""] for r in runs]
        self.runs_tab = Table("history_runs", list(self.RUN_COLUMNS), rows, "Run history (newest first)")
        keep = self.selected_run() if select is None else select
        self.runs_table.blockSignals(True)
        _fill(self.runs_table, self.RUN_COLUMNS, rows)
        self.runs_table.blockSignals(False)
        ids = [r.id for r in runs]
        if ids:
            select_row(self.runs_table, ids.index(keep) if keep in ids else 0)
        self.redraw()  # every compute records a run: a hidden plot is drawn when its tab is shown
        a_keep = self.a_box.currentData() if a is None else a
        b_keep = self.b_box.currentData() if b is None else b
        for box in (self.a_box, self.b_box):
            box.blockSignals(True)
            box.clear()
            for r in runs:
                box.addItem(short_name(r), r.id)
                box.setItemData(box.count() - 1, r.describe(), Qt.ToolTipRole)
            box.blockSignals(False)
        # defaults: A the baseline (else the run before the newest), B the newest
        a_def = a_keep if a_keep in ids else (base if base in ids else (ids[1] if len(ids) > 1 else None))
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
        self.points = []
        for item in (self.hover.vline, self.hover.hline, self.hover.text):  # pi.clear() took them out too
            if item is not None:
                pi.addItem(item, ignoreBounds=True)
        rid = self.selected_run()
        if self.db is None or rid is None:
            return
        run = self._guard("reading the run", self.db.run, rid)
        if run is FAILED:
            return
        if not run.kernels:  # a comparison keeps its rows, not kernels of its own
            pi.setTitle(f"Run {run.id} ({run.kind or run.source}) has no timed kernels: Open shows what it kept",
                        size="9pt")
            return
        xs_all = set()

        # one curve per (kernel, variant, shape): a kernel timed on several shapes gets a curve per shape,
        # never one line through all of them, and its legend entry names the shape
        many = Counter((k.name, k.variant) for k in run.kernels[:MAX_PLOTTED_KERNELS])
        # a legend entry names the kernel; its variant (a method's long label) only where two kernels share a name
        variants: dict = {}
        for k in run.kernels[:MAX_PLOTTED_KERNELS]:
            variants.setdefault(k.name, set()).add(k.variant)
        for i, k in enumerate(run.kernels[:MAX_PLOTTED_KERNELS]):
            series = self._guard("reading a kernel's history", self.db.kernel_series, k.name, k.variant, k.shape_key)
            if series is FAILED or not series:
                continue
            x = np.array([s[0] for s in series], np.float64)
            p10, med, p90 = (np.log10(np.maximum([s[j] for s in series], 1e-9)) for j in (1, 2, 3))
            color = kernel_color(i)
            name = k.name + (f" [{k.variant}]" if k.variant and len(variants[k.name]) > 1 else "")
            if many[(k.name, k.variant)] > 1:
                name += f" ({k.shape.get('name') or shape_label(k.shape)})"  # a sweep point by its name
            curve = pi.plot(x, 10.0 ** med, pen=pg.mkPen(color, width=1.5), symbol="o", symbolSize=5,
                            symbolBrush=color, name=shorten(name, LEGEND_NAME_CHARS))  # the log axis: the values
            self.curves.append((curve, k.shape_key))
            self.points.append((name, x, med, series))
            pi.addItem(pg.ErrorBarItem(x=x, y=med, top=p90 - med, bottom=med - p10, beam=0.12, pen=pg.mkPen(color)))
            xs_all.update(int(v) for v in x)
        pi.getAxis("bottom").setTicks([[(float(v), str(v)) for v in sorted(xs_all)], []])
        if xs_all:  # half a run beyond the first and the last: the p10-p90 beams keep their width (one run too)
            pi.setXRange(min(xs_all) - 0.5, max(xs_all) + 0.5, padding=0)
        pi.setTitle(f"Kernels of run {run.id} over the runs of its shape", size="9pt")
        # the data keeps its room above however many rows the legend takes at this width
        fit_legend_columns(pi, self.legend)
        rows = -(-len(self.legend.items) // max(1, self.legend.columnCount))
        self.plot.setMinimumHeight(DATA_MIN_PX + LEGEND_ROW_PX * max(rows, 1))

    def _describe_point(self, x: float, y: float) -> str | None:
        vb = self.plot.getPlotItem().getViewBox()
        best = None
        for name, xs, lmed, series in self.points:
            i = nearest(xs, lmed, x, y, vb)
            if i is not None:
                px, py = vb.viewPixelSize()
                d = math.hypot((xs[i] - x) / px, (lmed[i] - y) / py)
                if best is None or d < best[0]:
                    best = (d, name, series[i])
        if best is None:
            return None
        _d, name, (run, p10, med, p90) = best
        return (f"{name}\nrun {int(run)}: median {units.time_us(med)}\n"
                f"p10-p90 {units.time_us(p10)}-{units.time_us(p90)}")

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
