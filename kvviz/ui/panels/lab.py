"""Kernel lab: bring your own kernel. Pick a slot, open a shader file (or start one from the slot's built-in
kernel); the panel watches the file and on every save recompiles it, checks it against the slot's oracle and
times it beside the built-in kernel, in the window's background worker (kvviz/lab/check.py does the work).

It shows: the slot's contract; the file with compile errors as file:line:column (naga's and glslang's
messages) marked in the source beside the list of errors; what the driver gets (kvviz/lab/source.py says what
that is), workgroup size, dispatch grid, workgroup memory, immediates size; the oracle check (max error, how
many elements are off and where: a map over rows x channels); a timing row per run, the built-in's beside it,
and the pinned baseline's median of the slot's built-in kernel when the History has one.

Editors that save by writing a new file and renaming it over the old one (vim, many IDEs) make
QFileSystemWatcher drop the path: the panel also watches the folder and takes the file back when it
reappears. A run that does not come back within HANG_S seconds is said to hang (the app stays up; on
hardware the driver resets the device after its timeout and the next run opens a new one).

`install(window)` docks the panel and the roofline tab into a MainWindow.
"""
from __future__ import annotations

import math
import os
import time

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QFileSystemWatcher, Qt, QTimer, Signal
from PySide6.QtGui import QColor, QFont, QTextCharFormat, QTextCursor
from PySide6.QtWidgets import (
    QAbstractItemView,
    QComboBox,
    QFileDialog,
    QFormLayout,
    QLabel,
    QListWidget,
    QPlainTextEdit,
    QPushButton,
    QSplitter,
    QTableWidget,
    QTableWidgetItem,
    QTabWidget,
    QTextEdit,
    QVBoxLayout,
    QWidget,
)

from kvviz.bench import BenchShape, make_inputs
from kvviz.bench.detail import kernel_detail
from kvviz.bench.roofline import ceilings_from_results, device_fma_gflops, points_from_results
from kvviz.gpu.shaders import FRONTEND_GLSLANG
from kvviz.lab.check import lab_run, source_info
from kvviz.lab.slots import render_text, slots
from kvviz.tables import Table
from kvviz.ui.layouts import ReflowSplitter, labelled
from kvviz.ui.panels.base import Panel
from kvviz.ui.style import fit_title
from kvviz.ui.tasks import TASKS, TaskKind, register
from kvviz.ui.widgets.hover import Hover
from kvviz.ui.widgets.kernel_detail import KernelDetailView
from kvviz.ui.widgets.labels import ElidedLabel
from kvviz.ui.widgets.panel_scroll import PanelScroll
from kvviz.ui.widgets.roofline import RooflineWidget

HANG_S = 60.0
LAB_SHAPE = None  # kvviz.bench.BenchShape used before the window has results (set on first use)


def _mono() -> QFont:
    f = QFont("monospace")
    f.setStyleHint(QFont.Monospace)
    f.setPointSize(9)
    return f


class LabPanel(Panel):
    key = "kernel_lab"
    title = "Kernel lab"
    run_requested = Signal(str, str)  # slot id, file path

    def __init__(self, state=None, parent=None):
        super().__init__(state, parent)
        self.path: str = ""
        self.runs: list = []  # [(time, LabRun)] of this file
        self.last = None  # the last LabRun
        self.diagnostics: list = []
        self.baseline_us: dict = {}  # built-in kernel -> median of the pinned run (from the History)
        self._started = 0.0
        self.watcher = QFileSystemWatcher(self)
        self.watcher.fileChanged.connect(self._file_changed)
        self.watcher.directoryChanged.connect(self._dir_changed)
        self._debounce = QTimer(self)
        self._debounce.setSingleShot(True)
        self._debounce.setInterval(150)
        self._debounce.timeout.connect(self.request_run)
        self._hang = QTimer(self)
        self._hang.setSingleShot(True)
        self._hang.timeout.connect(self._hung)

        self.slot_box = QComboBox()
        for sid, s in slots().items():
            self.slot_box.addItem(f"{sid}  ({s.role}, {s.impl})", sid)
        self.slot_box.currentIndexChanged.connect(self._slot_changed)
        self.open_button = QPushButton("Open...")
        self.open_button.clicked.connect(self._open_clicked)
        self.new_button = QPushButton("New from built-in...")
        self.new_button.setToolTip("Write the slot's built-in kernel to a file and watch it (kvviz kernel new)")
        self.new_button.clicked.connect(self._new_clicked)
        self.run_button = QPushButton("Run")
        self.run_button.setToolTip("Recompile, check and time now (it also runs on every save)")
        self.run_button.clicked.connect(self.request_run)
        for w in (labelled("Slot", self.slot_box), self.open_button, self.new_button, self.run_button):
            self.tools.addWidget(w)
        self.file_label = ElidedLabel("No file: open one, or start one from the built-in kernel.")
        self.body.addWidget(self.file_label)
        self.status = QLabel("")
        self.status.setWordWrap(True)
        self.body.addWidget(self.status)

        # the source beside the facts and the check where each gets 380 px, above them in a narrower dock
        split = ReflowSplitter(pane=380)
        # left: source + errors
        left = QSplitter(Qt.Vertical)
        self.src_tabs = QTabWidget()
        self.source = QPlainTextEdit()
        self.source.setReadOnly(True)
        self.source.setFont(_mono())
        self.source.setLineWrapMode(QPlainTextEdit.NoWrap)
        self.src_tabs.addTab(self.source, "Source")
        drv = QWidget()
        dl = QVBoxLayout(drv)
        dl.setContentsMargins(0, 0, 0, 0)
        self.driver_kind = QLabel("")
        self.driver_kind.setWordWrap(True)
        self.driver = QPlainTextEdit()
        self.driver.setReadOnly(True)
        self.driver.setFont(_mono())
        self.driver.setLineWrapMode(QPlainTextEdit.NoWrap)
        dl.addWidget(self.driver_kind)
        dl.addWidget(self.driver, 1)
        self.src_tabs.addTab(drv, "Driver code")
        self.contract = QTextEdit()
        self.contract.setReadOnly(True)
        self.contract.setFont(_mono())
        self.src_tabs.addTab(self.contract, "Contract")
        left.addWidget(self.src_tabs)
        self.errors = QListWidget()
        self.errors.setToolTip("Compile errors: click one to show its line")
        self.errors.currentRowChanged.connect(self._goto_error)
        left.addWidget(self.errors)
        left.setSizes([360, 90])
        split.addWidget(left)
        # right: facts, check, timings
        right = QWidget()
        rl = QVBoxLayout(right)
        rl.setContentsMargins(0, 0, 0, 0)
        form = QFormLayout()
        self.facts = {k: QLabel("-") for k in ("workgroup size", "dispatch grid", "workgroup memory", "immediates")}
        for k, w in self.facts.items():
            w.setTextInteractionFlags(Qt.TextSelectableByMouse)
            w.setWordWrap(True)  # a long dispatch grid wraps in a narrow dock
            form.addRow(k, w)
        rl.addLayout(form)
        self.check_label = QLabel("No check yet.")
        self.check_label.setWordWrap(True)
        rl.addWidget(self.check_label)
        self.heat = pg.PlotWidget()
        self.heat.setMaximumHeight(170)
        self.heat_img = pg.ImageItem()
        self.heat.addItem(self.heat_img)
        self.heat.getPlotItem().setMouseEnabled(x=False, y=False)
        # a check without a bad element has nothing to map: said in the map's place (an all-zero map drew a black
        # rectangle, which reads as "everything is wrong")
        self.heat_clean = pg.TextItem("", color=(26, 107, 26), anchor=(0.5, 0.5))
        self.heat.addItem(self.heat_clean, ignoreBounds=True)
        self.heat_hover = Hover(self.heat.getPlotItem(), self._describe_heat, crosshair="")
        rl.addWidget(self.heat)
        self.table = QTableWidget()
        self.table.setEditTriggers(QAbstractItemView.NoEditTriggers)
        self.table.verticalHeader().setVisible(False)
        self.table.verticalHeader().setDefaultSectionSize(19)
        rl.addWidget(self.table, 1)
        split.addWidget(right)
        split.setSizes([520, 420])
        self.body.addWidget(split, 1)
        self._rows: list = []
        self._slot_changed()

    # ------------------------------------------------------------------ slot and file
    @property
    def slot_id(self) -> str:
        return self.slot_box.currentData()

    def set_slot(self, sid: str) -> None:
        i = self.slot_box.findData(sid)
        if i >= 0:
            self.slot_box.setCurrentIndex(i)

    def _slot_changed(self) -> None:
        self.contract.setPlainText(render_text(self.slot_id))
        if self.path:
            self._debounce.start()
        else:
            self.show_builtin()

    def show_builtin(self) -> None:
        """The slot's built-in kernel in the source view (no file open): its source, the driver's code, the facts
        that need no run (the grid comes with a run)."""
        try:
            info = source_info(slots()[self.slot_id], None, [])
        except Exception as exc:  # noqa: BLE001 - a shader the view cannot render: said, the window stays up
            self.status.setText(f"Cannot show the built-in {self.slot_id}: {exc}")
            return
        self.source.setPlainText(info.source)
        self._show_facts(info)
        self.file_label.setText(f"Built-in {slots()[self.slot_id].spec.path} (read only): open a file or start one "
                                "from it to bring your own kernel.")

    def _show_facts(self, info) -> None:
        self.facts["workgroup size"].setText(" x ".join(str(x) if x else "(named constant)" for x in info.workgroup_size))
        self.facts["dispatch grid"].setText(info.grid)
        self.facts["workgroup memory"].setText(f"{info.workgroup_bytes:,} bytes (declared arrays)")
        self.facts["immediates"].setText(f"{info.immediates_bytes} bytes")
        self.driver_kind.setText(info.driver_code_kind)
        self.driver.setPlainText(info.driver_code)

    def _open_clicked(self) -> None:
        s = slots()[self.slot_id]
        path, _ = QFileDialog.getOpenFileName(self, f"Open a kernel for {s.id}", "", "Shaders (*.wgsl *.comp *.glsl)")
        if path:
            self.open_file(path)

    def _new_clicked(self) -> None:
        s = slots()[self.slot_id]
        path, _ = QFileDialog.getSaveFileName(self, f"Start a kernel for {s.id}", f"{s.id.replace('.', '_')}{s.suffix}",
                                              "Shaders (*.wgsl *.comp *.glsl)")
        if path:
            self.new_file(path)

    def new_file(self, path: str) -> None:
        """Write the slot's built-in kernel to `path` and watch it."""
        try:
            with open(path, "w") as fh:
                fh.write(slots()[self.slot_id].starting_source())
        except OSError as exc:
            self.status.setText(f"Could not write {path}: {exc}")
            return
        self.open_file(path)

    def has_content(self) -> bool:
        return self.last is not None

    def open_file(self, path: str) -> None:
        for p in self.watcher.files() + self.watcher.directories():
            self.watcher.removePath(p)
        self.path = os.path.abspath(path)
        self.runs = []
        self._rows = []
        self.last = None  # nothing of another file's runs is shown as this one's
        self.check_label.setText("No check yet.")
        self.check_label.setStyleSheet("")
        self._fill_table()
        if self.state is not None:
            self.state.resolve("lab")
        self.watcher.addPath(self.path)
        self.watcher.addPath(os.path.dirname(self.path) or ".")
        self.file_label.setText(f"Watching {self.path}: every save recompiles, checks and times it.")
        self._show_file()
        self.request_run()

    def _show_file(self) -> None:
        try:
            with open(self.path) as fh:
                text = fh.read()
        except OSError as exc:
            text = f"(cannot read {self.path}: {exc})"
        self.source.setPlainText(text)
        self._mark_errors()

    def _file_changed(self, path: str) -> None:
        if path != self.path:
            return
        if os.path.exists(self.path) and self.path not in self.watcher.files():
            self.watcher.addPath(self.path)  # replaced by rename: watch the new file
        self._debounce.start()

    def _dir_changed(self, _d: str) -> None:
        # an editor that saves by rename: the path vanished from the watcher and is back on disk
        if self.path and os.path.exists(self.path) and self.path not in self.watcher.files():
            self.watcher.addPath(self.path)
            self._debounce.start()

    # ------------------------------------------------------------------ runs
    def request_run(self) -> None:
        if not self.path:
            return
        self._show_file()
        self.status.setText(f"Compiling, checking and timing {os.path.basename(self.path)} for {self.slot_id} ...")
        self._started = time.perf_counter()
        self._hang.start(int(HANG_S * 1000))
        self.run_requested.emit(self.slot_id, self.path)

    def _hung(self) -> None:
        self.status.setText(
            f"No answer from the GPU after {HANG_S:.0f} s: the kernel may hang (a loop that never ends). The window stays "
            "up; on hardware the driver resets the device after its timeout and the next run opens a new one. "
            "Fix the kernel and save again.")

    def show_run(self, run) -> None:
        self._hang.stop()
        self.last = run
        self.diagnostics = []
        self.errors.clear()
        self.runs.append((time.strftime("%H:%M:%S"), run))
        c = run.check
        self.check_label.setText(f"Oracle check: {c.summary()}\nTolerance: {c.tolerance}\nMap: bad elements over "
                                 f"{c.rows} (down) x {c.cols} (across), binned")
        self.check_label.setStyleSheet("color: #1a6b1a;" if c.ok else "color: #a01010; font-weight: bold;")
        img = np.asarray(c.heat, np.float64).T
        self._heat = img
        if c.bad:
            self.heat_img.setImage(img, levels=(0, max(1.0, float(img.max()))))
            self.heat_img.setLookupTable(pg.colormap.get("inferno").getLookupTable(nPts=256))
            self.heat_img.show()
            self.heat_clean.setText("")
        else:
            self.heat_img.hide()
            w, h = (img.shape[0], img.shape[1]) if img.ndim == 2 else (1, 1)
            self.heat.getPlotItem().setRange(xRange=(0, max(1, w)), yRange=(0, max(1, h)), padding=0)
            self.heat_clean.setPos(max(1, w) / 2, max(1, h) / 2)
            self.heat_clean.setText(f"all {c.total:,} elements within the tolerance")
        fit_title(self.heat.getPlotItem(), [f"{c.bad} of {c.total} elements outside the tolerance",
                                             "bright: where" if c.bad else ""], "8pt")  # wrapped to the plot
        # the axes name what is binned; the check line above says they are binned (a short map has no room for it)
        self.heat.getPlotItem().setLabel("left", c.rows)
        self.heat.getPlotItem().setLabel("bottom", c.cols)
        if run.info is not None:
            self._show_facts(run.info)
        when = f"#{len(self.runs)} {self.runs[-1][0]}"  # run number and time: rows of one run stay together
        for t in run.timings:
            self._rows.append((when, t, c if t.impl == "user" else None))
        self._fill_table()
        self.status.setText(f"{os.path.basename(self.path)}: compiled, checked and timed in "
                            f"{time.perf_counter() - self._started:.1f} s ({c.verdict})")
        self._mark_errors()

    def _describe_heat(self, x: float, y: float) -> str | None:
        img = getattr(self, "_heat", None)
        if img is None or img.ndim != 2 or not self.heat_img.isVisible():
            return None
        i, j = int(x // 1), int(y // 1)
        if not (0 <= i < img.shape[0] and 0 <= j < img.shape[1] and x >= 0 and y >= 0):
            return None
        return f"bin ({i}, {j}): {int(img[i, j])} element(s) outside the tolerance"

    def show_error(self, exc) -> None:
        self._hang.stop()
        diags = list(getattr(exc, "diagnostics", ()) or [])
        self.diagnostics = diags
        self.errors.clear()
        for d in diags:
            self.errors.addItem(str(d))
        if not diags:
            self.errors.addItem(str(exc))
        self.status.setText(f"{os.path.basename(self.path) or 'kernel'}: {str(exc).splitlines()[0]}")
        self.status.setStyleSheet("color: #a01010;")
        self._mark_errors()
        if diags:
            self.errors.setCurrentRow(0)

    def _mark_errors(self) -> None:
        sels = []
        fmt = QTextCharFormat()
        fmt.setBackground(QColor(255, 215, 210))
        fmt.setProperty(QTextCharFormat.FullWidthSelection, True)
        for d in self.diagnostics:
            if d.line <= 0 or d.file != self.path:
                continue
            block = self.source.document().findBlockByNumber(d.line - 1)
            if not block.isValid():
                continue
            sel = QTextEdit.ExtraSelection()
            cur = QTextCursor(block)
            sel.cursor = cur
            sel.format = fmt
            sels.append(sel)
        self.source.setExtraSelections(sels)
        if not self.diagnostics:
            self.status.setStyleSheet("")

    def _goto_error(self, row: int) -> None:
        if not 0 <= row < len(self.diagnostics):
            return
        d = self.diagnostics[row]
        if d.file != self.path or d.line <= 0:
            return
        block = self.source.document().findBlockByNumber(d.line - 1)
        cur = QTextCursor(block)
        cur.movePosition(QTextCursor.Right, QTextCursor.MoveAnchor, max(0, d.column - 1))
        self.source.setTextCursor(cur)
        self.source.centerCursor()
        self.src_tabs.setCurrentIndex(0)

    def _fill_table(self) -> None:
        t = self.table
        headers = ["run", "kernel", "median us (min-p90)", "vs pinned built-in", "GB/s", "GFLOP/s", "check"]
        t.clear()
        t.setColumnCount(len(headers))
        t.setHorizontalHeaderLabels(headers)
        t.setRowCount(len(self._rows))
        # the newest run first, each run's rows in order: the user's kernel, then the built-ins beside it
        runs: dict = {}
        for r in self._rows:
            runs.setdefault(r[0], []).append(r)
        ordered = [r for key in reversed(list(runs)) for r in runs[key]]
        for i, (when, lt, c) in enumerate(ordered):
            tm = lt.timing
            gb = lt.bytes / (tm.median_us * 1e3) if tm.median_us > 0 else float("nan")
            gf = lt.flops / (tm.median_us * 1e3) if tm.median_us > 0 else float("nan")
            pin = self.baseline_us.get(slots()[self.slot_id].timed_name)  # the pinned run's built-in of this slot
            cells = [when, lt.name if lt.impl == "user" else f"{lt.name} ({lt.impl})",
                     f"{tm.median_us:,.1f} ({tm.min_us:,.1f}-{tm.p90_us:,.1f})",
                     f"{100 * (tm.median_us - pin) / pin:+.1f}%" if pin else "",
                     f"{gb:.3g}", f"{gf:.3g}" if math.isfinite(gf) else "-",
                     ("OK" if c.ok else f"FAILED: {c.bad} off" + (", loop limit" if c.loop_limited else ""))
                     if c is not None else ""]
            for j, v in enumerate(cells):
                it = QTableWidgetItem(v)
                if 2 <= j <= 5:
                    it.setTextAlignment(Qt.AlignRight | Qt.AlignVCenter)
                t.setItem(i, j, it)
        t.resizeColumnsToContents()

    def tables(self) -> list:
        rows = [[w, lt.name, lt.impl, lt.timing.median_us, lt.timing.min_us, lt.timing.p90_us, lt.bytes, lt.flops,
                 None if c is None else c.ok, None if c is None else c.bad, None if c is None else c.max_err]
                for w, lt, c in self._rows]
        if not rows:
            return []
        return [Table("kernel_lab", ["run", "kernel", "impl", "median_us", "min_us", "p90_us", "bytes", "flops", "ok",
                                     "bad_elements", "max_err"], rows, f"Kernel lab runs of {self.path} ({self.slot_id})")]


# ------------------------------------------------------------------------------ the window's side
def lab_inputs(results):
    """The shape the lab runs on: the window's current workload (any shape it has computed), else a small one."""
    if results is not None:
        return results.batch, results.key, results.value, results.q

    return make_inputs(BenchShape("lab", (37, 100, 129), 8, 2, 128, 16, "scattered"))


def _register_tasks() -> None:
    if "lab" in TASKS:
        return

    def done(win, task, result):
        win.lab.show_run(result)

    def failed(win, task, exc):
        win.lab.show_error(exc)

    # a failure (the file no longer compiles, the GPU refused it) makes the last good run's check and timings stale
    # until the next run of the file succeeds
    register(TaskKind("lab", "Kernel lab", done, failed, stale=frozenset({LabPanel.key}),
                      stale_why="the check and timings below are of the last run that compiled; the file now fails"))

    def ceil_done(win, task, result):
        win._roofline_fma = result
        _update_roofline(win)
        if win.timing.selected_key:  # its roofline position against the measured FMA peak
            win.select_kernel(win.timing.selected_key)

    register(TaskKind("roofline", "Roofline ceilings", ceil_done, quiet=True))


def _update_roofline(win) -> None:
    res = win.results
    if res is None:
        return
    c = ceilings_from_results(res, getattr(win, "_roofline_fma", None))
    res.roofline_ceilings = c  # the report writer draws the same roofline from the results
    win.roofline.set_data(points_from_results(res), c)


def install(win) -> LabPanel:
    """Dock the Kernel lab into a MainWindow and add the Roofline tab to its GPU timing panel."""
    from PySide6.QtWidgets import QDockWidget

    _register_tasks()
    panel = LabPanel(win.state)
    win.lab = panel
    d = QDockWidget(panel.title, win)
    d.setObjectName(f"dock_{panel.key}")
    try:  # a squeezed dock scrolls its panel, like every dock of the window

        d.setWidget(PanelScroll(panel))
    except ImportError:
        d.setWidget(panel)
    d.setFeatures(QDockWidget.DockWidgetMovable | QDockWidget.DockWidgetFloatable | QDockWidget.DockWidgetClosable)
    win.docks[panel.key] = d
    win.addDockWidget(Qt.RightDockWidgetArea, d)
    if "timing" in win.docks:
        win.tabifyDockWidget(win.docks["timing"], d)
        win.docks["timing"].raise_()
    for a in win.menuBar().actions():  # View menu: show / hide the lab like every panel
        if a.menu() is not None and a.text().replace("&", "") == "View":
            a.menu().addAction(d.toggleViewAction())

    def run(slot_id: str, path: str) -> None:
        session = win.session
        res = win.results
        fe = getattr(getattr(win, "workload", None), "frontend", None)
        frontend = (fe.currentText() if fe is not None else "") or FRONTEND_GLSLANG
        job = lambda p, c: lab_run(session.ctx(frontend), slot_id, lab_inputs(res), path=path)  # noqa: E731
        win.runner.submit("lab", job, f"kernel lab {slot_id}", (slot_id, path))

    panel.run_requested.connect(run)

    win.roofline = RooflineWidget()
    win.timing.tabs.addTab(win.roofline, "Roofline")
    win._roofline_fma = None

    def measure(refresh: bool = False) -> None:
        session = win.session
        if refresh:
            session.forget_ceilings()  # the next compute measures the copy bandwidth and timing floor again
        win.runner.submit("roofline", lambda p, c: device_fma_gflops(session.rt, refresh), "measure the FMA ceiling")

    win.roofline.measure_requested.connect(lambda: measure(refresh=True))  # the button measures again

    # linked views: a kernel clicked in the timing table, its bars, the timeline or the roofline is selected in
    # all of them, shown in the Kernel detail tab, and its Kernel lab slot is chosen (when the lab has no file of
    # its own open); "Open in Kernel lab" raises the lab
    win.kernel_detail = KernelDetailView()
    win.timing.tabs.addTab(win.kernel_detail, "Kernel detail")

    def select_kernel(key: str) -> None:
        win.timing.select_kernel(key)
        win.roofline.select_kernel(key)
        d = kernel_detail(win.results, key) if win.results is not None else None
        win.kernel_detail.show_detail(d)
        if d is not None and d.lab_slot and not panel.path:
            panel.set_slot(d.lab_slot)

    def open_in_lab(sid: str) -> None:
        panel.set_slot(sid)
        win.docks[panel.key].show()
        win.docks[panel.key].raise_()

    win.select_kernel = select_kernel
    win.timing.kernel_selected.connect(select_kernel)
    win.roofline.kernel_selected.connect(select_kernel)
    win.kernel_detail.open_in_lab.connect(open_in_lab)

    def on_results(res) -> None:
        _update_roofline(win)
        if win.timing.selected_key:  # the selected kernel in the new results
            select_kernel(win.timing.selected_key)
        if win._roofline_fma is None:
            measure()
        hv = getattr(win.timing, "history_view", None)
        base = hv.baseline() if hv is not None and getattr(hv, "db", None) is not None else None
        panel.baseline_us = {k.name: float(k.median_us) for k in base.kernels} if base is not None else {}

    win.results_ready.connect(on_results)
    if win.results is not None:  # installed after the first run came in
        on_results(win.results)
    return panel
