"""The kvviz main window: a QMainWindow of dockable panels over the Qt-free `Session`.

The window edits a `SessionConfig` (Workload panel), asks the worker (kvviz.ui.worker) to run
`Session.compute`, and draws the `Results` in every panel. Two panels run their own worker jobs:
"QJL bias" (TurboQuant's estimators on the current K/Q, kvviz.families.turboquant.bias) and "Live decode"
(kvviz.live.decode.LiveDecoder, step by step; every LiveStep comes back through a queued signal).
The live decode and the main compute share the one worker and cancel each other. Dock arrangement,
window geometry and the last configuration that computed persist in QSettings ("kvviz"/"kvviz"
unless one is passed in).
"""
from __future__ import annotations

import json
import logging
import os
import platform
import re
import traceback
from dataclasses import dataclass
from dataclasses import fields as dataclass_fields
from importlib.metadata import PackageNotFoundError, version

from PySide6.QtCore import QSettings, Qt, QTimer, Signal
from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import (
    QApplication,
    QDockWidget,
    QFileDialog,
    QFrame,
    QHBoxLayout,
    QLabel,
    QMainWindow,
    QMenu,
    QMessageBox,
    QProgressBar,
    QPushButton,
    QScrollArea,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from kvviz.analysis.session import Cancelled, Session, SessionConfig
from kvviz.analysis.snapshot import FILE_NAME as RESULTS_FILE
from kvviz.analysis.snapshot import load_results
from kvviz.errors import InvalidInput, KvvizError
from kvviz.families.turboquant.bias import inner_product_bias
from kvviz.gpu.shaders import FRONTEND_GLSLANG
from kvviz.live.run import decode_run
from kvviz.report.compare_run import run_compare
from kvviz.report.trace import write_chrome_trace
from kvviz.report.writer import relocate, staged_dir, write_report
from kvviz.ui.audit import tab_bar_is_current
from kvviz.ui.export import ExportDialog, save_png
from kvviz.ui.log_dock import LogPanel
from kvviz.ui.panels import (
    AttentionPanel,
    BlockInspectorPanel,
    CacheLayoutPanel,
    CodesPanel,
    ComparePanel,
    LivePanel,
    OverviewPanel,
    QjlBiasPanel,
    ScalesPanel,
    TimingPanel,
    WorkloadPanel,
)
from kvviz.ui.panels.lab import install as install_lab
from kvviz.ui.panels.quality import install as install_quality
from kvviz.ui.panels.qjl_bias import tq_setting
from kvviz.ui.panels.timing import SOFTWARE_FLAG
from kvviz.ui.state import RESULT_PANELS, AppState, Baseline, Notice, model_label
from kvviz.ui.style import ERROR_BG, ERROR_FG, WARN_BG, WARN_FG, setup_pyqtgraph
from kvviz.ui.tasks import TASKS
from kvviz.ui.widgets.labels import ElidedLabel
from kvviz.ui.widgets.panel_scroll import PanelScroll
from kvviz.ui.worker import TaskRunner

log = logging.getLogger("kvviz.ui")

ORG = "kvviz"
APP = "kvviz"
STATE_VERSION = 5  # 5: the log dock


@dataclass(frozen=True)
class ComputeRequest:
    cfg: SessionConfig  # the settings asked for (the results' config may differ: a model's shapes)
    explicit: bool  # asked for by the user (kept in the run history)


class ErrorBanner(QFrame):
    """A dismissable banner at the top of the window: the error and its hint."""

    dismissed = Signal()

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setObjectName("errorBanner")
        self.setStyleSheet(f"#errorBanner {{ background: {ERROR_BG}; border: 1px solid #e0a09a; border-radius: 4px; }}"
                           f" QLabel {{ color: {ERROR_FG}; }}")
        lay = QHBoxLayout(self)
        lay.setContentsMargins(8, 4, 4, 4)
        icon = QLabel("\u26a0")
        icon.setStyleSheet("font-size: 16pt;")
        lay.addWidget(icon)
        text = QVBoxLayout()
        self.title = QLabel("")
        self.title.setStyleSheet("font-weight: bold;")
        self.title.setWordWrap(True)
        self.title.setTextInteractionFlags(Qt.TextSelectableByMouse)
        self.hint = QLabel("")
        self.hint.setWordWrap(True)
        self.hint.setTextInteractionFlags(Qt.TextSelectableByMouse)
        text.addWidget(self.title)
        text.addWidget(self.hint)
        lay.addLayout(text, 1)
        close = QToolButton()
        close.setText("\u2715")
        close.setToolTip("Dismiss")
        close.clicked.connect(self._dismiss)
        lay.addWidget(close, 0, Qt.AlignTop)
        self.hide()

    def _dismiss(self) -> None:
        self.hide()
        self.dismissed.emit()

    def show_notices(self, notices: list) -> None:
        """The newest notice (kvviz.ui.state.Notice) in full, the others named on a line below; hidden when none."""
        if not notices:
            self.hide()
            return
        n = notices[0]
        self.title.setText(f"{n.title}: {n.message()}")
        hint = n.hint()
        if len(notices) > 1:
            hint += ("\n" if hint else "") + "Also: " + "; ".join(f"{o.title}: {o.message().splitlines()[0][:80]}"
                                                                  for o in notices[1:])
        self.hint.setText(hint)
        self.hint.setVisible(bool(hint))
        self.show()

    def text(self) -> str:
        return f"{self.title.text()}\n{self.hint.text()}" if self.isVisible() else ""


class MainWindow(QMainWindow):
    results_ready = Signal(object)  # Results
    preview_ready = Signal(object, object)  # compute Task, its Results before the kernels' timings (Session.on_preview)
    compute_failed = Signal(object)  # exception
    task_cancelled = Signal(str)  # kind
    sweep_ready = Signal(object)
    compare_ready = Signal(object)
    inspect_ready = Signal(object)
    bias_ready = Signal(object)  # BiasResult drawn by the QJL bias panel
    model_info_ready = Signal(str, object)  # model path, LlamaConfig
    live_step = Signal(object, object)  # run id, LiveStep (emitted in the worker, queued to the UI)
    live_event = Signal(object, str, object)  # run id, "model" (path, LlamaConfig) | "prefilled" (dict), in the worker
    live_finished = Signal(object)  # {"decoder", "summary", "describe", "timings"}

    def __init__(self, settings: QSettings | None = None, config: SessionConfig | None = None,
                 session: Session | None = None, autostart: bool = True, debounce_ms: int = 300):
        super().__init__()
        setup_pyqtgraph()
        self.setWindowTitle("kvviz - KV-cache quantisation lab")
        self.settings = settings if settings is not None else QSettings(ORG, APP)
        self.session = session or Session()
        self.results = None
        self.last_good_config: SessionConfig | None = None
        self._compute_task = None
        self._adapter = None
        self._live_run = None  # id of the live decode whose steps the live panel shows
        self._live_why = ""  # why the live decode was cancelled ("" = the user stopped it)
        self.live_decoder = None  # the LiveDecoder of the last finished live run
        self.runner = TaskRunner(self)
        self.runner.started.connect(self._task_started)
        self.runner.progress.connect(self._task_progress)
        self.runner.finished.connect(self._task_finished)
        self.runner.failed.connect(self._task_failed)
        self.runner.idle.connect(self._idle)
        self.runner.dropped.connect(self._task_dropped)

        self._preview = None  # the current compute's results before its timings, drawn while it times its kernels
        self._previewed: list = []  # the panels drawing the preview
        self.preview_ready.connect(self._show_preview)
        self.session.on_preview = self._emit_preview

        self._relayout_pending = False
        self._debounce = QTimer(self)
        self._debounce.setSingleShot(True)
        self._debounce.setInterval(debounce_ms)
        self._debounce.timeout.connect(self.request_compute)

        # ---- the typed app state the panels share; they ask for work through its signals
        self.state = AppState(self)
        self.state.export_requested.connect(self.export_panel)
        self.state.inspect_requested.connect(self.request_inspect)
        self.state.trace_export_requested.connect(self.export_trace)
        self.state.status_message.connect(lambda text: self.status_label.setText(text))
        self.state.error.connect(self.show_error)
        self.compare_res = None  # the Results the Method comparison's rows were computed on
        self._shown_cfg: SessionConfig | None = None  # the config whose compute the panels show (as asked for)

        # ---- central: error banner + overview
        central = QWidget()
        cl = QVBoxLayout(central)
        cl.setContentsMargins(4, 4, 4, 0)
        cl.setSpacing(4)
        self.banner = ErrorBanner()
        self.banner.dismissed.connect(self.state.dismiss_banner)
        cl.addWidget(self.banner)
        self.overview = OverviewPanel(self.state)
        cl.addWidget(self.overview, 1)
        self.central = central
        self.setCentralWidget(central)
        self._fit_central()

        # ---- panels in docks
        self.workload = WorkloadPanel(self.state)
        self.cache_layout = CacheLayoutPanel(self.state)
        self.inspector = BlockInspectorPanel(self.state)
        self.scales = ScalesPanel(self.state)
        self.codes = CodesPanel(self.state)
        self.attention = AttentionPanel(self.state)
        self.timing = TimingPanel(self.state)
        self.timing.attach_history()  # the run history on disk: the runs worth keeping, the pinned baseline
        self.timing.history_view.open_requested.connect(self.open_run)
        self.timing.history_view.baseline_changed.connect(self._set_baseline)
        self.compare = ComparePanel(self.state)
        self.bias = QjlBiasPanel(self.state)
        self.live = LivePanel(self.state)
        self.log_panel = LogPanel(self)
        self.panels = [self.overview, self.cache_layout, self.scales, self.codes, self.attention, self.timing,
                       self.compare, self.inspector]
        self.docks = {}
        for w in [self.workload] + self.panels[1:] + [self.bias, self.live, self.log_panel]:
            d = QDockWidget(w.title, self)
            d.setObjectName(f"dock_{w.key}")
            d.setWidget(PanelScroll(w))  # a squeezed dock scrolls its panel: the window fits 1280x800
            d.setFeatures(QDockWidget.DockWidgetMovable | QDockWidget.DockWidgetFloatable | QDockWidget.DockWidgetClosable)
            self.docks[w.key] = d
        self._default_layout()

        self.overview.reflowed.connect(lambda: QTimer.singleShot(0, self, self._fit_central))
        self.workload.changed.connect(self.schedule_compute)
        self.workload.run_requested.connect(self.run_now)
        self.workload.cancel_requested.connect(self.cancel)
        self.cache_layout.block_clicked.connect(self.open_block)
        self.timing.sweep_requested.connect(self.request_sweep)
        self.compare.compare_requested.connect(self.request_compare)
        self.workload.model_requested.connect(self.request_model_info)
        self.bias.bias_requested.connect(self.request_bias)
        self.docks["qjl_bias"].visibilityChanged.connect(self.bias.set_on_screen)
        self.live.start_requested.connect(self.start_live)
        self.live.view_read_requested.connect(lambda job, label: self.runner.submit("live_view", job, label))
        self.live.workload_model_requested.connect(
            lambda: self.live.model_path.setText(self.workload.model_path.text().strip()))
        self.live.stop_requested.connect(self.stop_live)
        self.live_step.connect(self._on_live_step)
        self.live_event.connect(self._on_live_event)

        self._build_status_bar()
        self._build_actions()
        # after every panel's own connection: the banner, the Workload's red field and the centre's height follow
        # the notices once the stale notes have
        self.state.notices_changed.connect(self._sync_notices)
        self.workload.changed.connect(self._sync_edited)
        self.workload.auto_run.toggled.connect(self._sync_edited)

        self._set_baseline(self.timing.history_view.baseline() if self.timing.history_view.db is not None else None)
        install_lab(self)  # the Kernel lab dock and the GPU timing panel's Roofline tab (kvviz/ui/panels/lab.py)
        install_quality(self)  # the Quality dock: kvviz eval in the window (kvviz/ui/panels/quality.py)
        self._restore(config)
        self.workload.set_busy(False)
        # the adapter's name goes in the status bar straight away, even if the first compute fails
        session = self.session
        self.runner.submit("adapter", lambda p, c: session.rt.summary, "open the GPU")
        if autostart:
            QTimer.singleShot(0, self, self.request_compute)

    # ----------------------------------------------------------------- layout
    _PLACED = frozenset({"workload", "cache_layout", "block_inspector", "attention", "timing", "compare", "qjl_bias",
                         "live", "scales", "codes", "log"})  # the docks _default_layout places by name

    def _default_layout(self) -> None:
        d = self.docks
        for dock in d.values():
            dock.setFloating(False)
            dock.show()
        self.setCorner(Qt.TopLeftCorner, Qt.LeftDockWidgetArea)
        self.setCorner(Qt.BottomLeftCorner, Qt.LeftDockWidgetArea)
        self.setCorner(Qt.TopRightCorner, Qt.RightDockWidgetArea)
        self.setCorner(Qt.BottomRightCorner, Qt.RightDockWidgetArea)
        self.addDockWidget(Qt.LeftDockWidgetArea, d["workload"])
        self.addDockWidget(Qt.TopDockWidgetArea, d["cache_layout"])
        self.addDockWidget(Qt.TopDockWidgetArea, d["block_inspector"])
        self.tabifyDockWidget(d["cache_layout"], d["block_inspector"])
        self.addDockWidget(Qt.RightDockWidgetArea, d["attention"])
        self.addDockWidget(Qt.RightDockWidgetArea, d["timing"])
        self.splitDockWidget(d["attention"], d["timing"], Qt.Vertical)
        self.tabifyDockWidget(d["timing"], d["compare"])
        self.tabifyDockWidget(d["timing"], d["qjl_bias"])
        self.tabifyDockWidget(d["attention"], d["live"])
        self.addDockWidget(Qt.BottomDockWidgetArea, d["scales"])
        self.addDockWidget(Qt.BottomDockWidgetArea, d["codes"])
        self.splitDockWidget(d["scales"], d["codes"], Qt.Horizontal)
        self.tabifyDockWidget(d["codes"], d["log"])
        for key, dock in d.items():  # docks installed later (the kernel lab) go back to the timing group
            if key not in self._PLACED:
                self.tabifyDockWidget(d["timing"], dock)
        d["codes"].raise_()
        d["cache_layout"].raise_()
        d["timing"].raise_()
        d["attention"].raise_()
        self.resizeDocks([d["workload"], d["attention"]], [275, 580], Qt.Horizontal)
        self.resizeDocks([d["attention"], d["timing"]], [480, 520], Qt.Vertical)
        self.resizeDocks([d["cache_layout"], d["scales"]], [290, 520], Qt.Vertical)

    def _fit_central(self) -> None:
        """The centre (error banner and overview) exactly as tall as its contents need at its width: the docks
        get the rest, and the banner, the stale note and a warning line push the cards down, never over them."""
        lay = self.central.layout()
        lay.activate()
        w = max(self.central.width(), 200)
        need = lay.totalHeightForWidth(w) if lay.hasHeightForWidth() else lay.totalSizeHint().height()
        need = max(need, lay.totalMinimumSize().height())
        # never taller than the window leaves beside what the docks in its column need at least: a width measured in
        # the middle of a relayout (the live layout's narrow centre) must not make the window grow past the screen
        others = self.layout().minimumSize().height() - self.central.minimumHeight()
        room = self.height() - others - 4
        need = min(need, max(room, 120))
        if self.central.minimumHeight() != need or self.central.maximumHeight() != need:
            self.central.setFixedHeight(need)
            self._after_relayout()

    def reset_layout(self) -> None:
        """The default arrangement for the window's size. The docks pass through the wide arrangement on their way
        (top and bottom dock areas around the centre), whose minimum height at 1280x800 is more than the window's:
        the centre's height is let go meanwhile and the window keeps its size."""
        size = self.size()
        self.central.setMinimumHeight(0)
        self._default_layout()
        self._size_docks()
        if self.size() != size:  # grown on the way: back, and the docks shared again at the window's size
            self.resize(size)
            self._size_docks()
        self._fit_central()

    COMPACT = (1500, 950)  # below this width or height the default layout tabs the bottom panels together

    def is_compact(self) -> bool:
        return self.width() < self.COMPACT[0] or self.height() < self.COMPACT[1]

    def unelide_tabs(self) -> None:
        """The dock tab bars show their titles whole and scroll (arrows) when they do not fit: an elided
        "S..." or "Cache ..." said nothing."""
        from PySide6.QtWidgets import QTabBar

        for tb in self.findChildren(QTabBar):
            if tb.parentWidget() is self:
                tb.setElideMode(Qt.ElideNone)
                tb.setUsesScrollButtons(True)

    def hide_stale_tab_bars(self) -> list:
        """Hide the dock tab bars QMainWindow keeps from an earlier arrangement of the docks (the default layout
        regrouped for 1280x800, a reset): they stay "visible" under the docks at their old place, and a relayout
        (the error banner shown and dismissed) lets them paint over the overview. A tab bar is current when it
        lies along the edge of a dock of its own group, as wide as it."""
        from PySide6.QtWidgets import QTabBar

        docks = [d for d in self.docks.values() if d.isVisible() and not d.isFloating()]
        stale = [tb for tb in self.findChildren(QTabBar)
                 if tb.parentWidget() is self and not tb.isHidden() and not tab_bar_is_current(tb, docks)]
        for tb in stale:
            tb.hide()
        return stale

    def _after_relayout(self) -> None:
        """Once a dock arrangement or the centre's height has changed: no tab bar of an earlier arrangement left."""
        if not self._relayout_pending:
            self._relayout_pending = True
            QTimer.singleShot(0, self, self._relayout_done)

    def _relayout_done(self) -> None:
        self._relayout_pending = False
        self.hide_stale_tab_bars()

    def workload_min_width(self) -> int:
        """The Workload dock's width that shows its fields whole (its form scrolls inside the panel)."""
        inner = self.workload.findChild(QScrollArea)
        w = inner.widget().minimumSizeHint().width() if inner is not None and inner.widget() is not None else 0
        sb = self.style().pixelMetric(self.style().PixelMetric.PM_ScrollBarExtent)
        return max(self.workload.minimumSizeHint().width(), w + sb + 12)

    def _compact_tabs(self) -> None:
        """At 1280x800 three panels side by side under the overview got ~200 px of height each: the cache
        layout, block inspector, scales, code histogram and log become one tab group under the overview
        (each with the middle column's whole width and the height the overview leaves)."""
        d = self.docks
        self.addDockWidget(Qt.BottomDockWidgetArea, d["cache_layout"])
        for key in ("block_inspector", "scales", "codes", "log"):
            self.tabifyDockWidget(d["cache_layout"], d[key])
        d["cache_layout"].raise_()
        # the right column: one tab group of the whole height (attention's three plots and table, the timing
        # tabs over the bandwidth plot each got too little of a split at 800 px)
        for key in ["timing", "compare", "qjl_bias"] + [k for k in d if k not in self._PLACED]:
            self.tabifyDockWidget(d["attention"], d[key])
        d["attention"].raise_()

    def _size_docks(self) -> None:
        """The default layout's dock sizes as shares of the window: at 1280x800 as at 1920x1080 the overview
        keeps its cards whole and every panel gets room. Below COMPACT the panels under the overview share
        one tab group (see _compact_tabs)."""
        d = self.docks
        W, H = max(self.width(), 800), max(self.height(), 500)
        left_min = self.workload_min_width()
        if self.is_compact():
            self._compact_tabs()
            left = min(max(left_min, int(W * 0.17)), int(W * 0.26))
            right = int(W * 0.38)
            self.resizeDocks([d["workload"], d["attention"]], [left, right], Qt.Horizontal)
            self.resizeDocks([d["cache_layout"]], [H], Qt.Vertical)
            self.unelide_tabs()
            self._after_relayout()
            return
        left, right = min(max(left_min, int(W * 0.17)), int(W * 0.26)), int(W * 0.36)
        mid = W - left - right
        self.resizeDocks([d["workload"], d["attention"]], [left, right], Qt.Horizontal)
        self.resizeDocks([d["scales"], d["codes"]], [mid // 2, mid - mid // 2], Qt.Horizontal)
        self.resizeDocks([d["attention"], d["timing"]], [int(H * 0.46), int(H * 0.54)], Qt.Vertical)
        self.resizeDocks([d["cache_layout"], d["scales"]], [int(H * 0.26), int(H * 0.45)], Qt.Vertical)
        self.unelide_tabs()
        self._after_relayout()

    def show_live_layout(self) -> None:
        """The live decode and the QJL bias panels raised, the live decode's column wide and tall enough for
        its controls and a KL plot of real height (the View menu's "Live decode layout", the screenshots). In the
        compact arrangement the QJL bias is one of the middle column's tabs, not raised: under the overview's cards
        its plot would get no height."""
        d = self.docks
        compact = self.is_compact() and d["qjl_bias"] in self.tabifiedDockWidgets(d["live"])
        if compact:  # the live decode takes the right column's whole height, the QJL bias the middle's tabs
            self.tabifyDockWidget(d["cache_layout"], d["qjl_bias"])
        shown = ("live",) if self.is_compact() else ("qjl_bias", "live")
        for key in shown:
            d[key].show()
            d[key].raise_()
        W, H = max(self.width(), 800), max(self.height(), 500)
        left = min(max(self.workload_min_width(), int(W * 0.15)), int(W * 0.26))
        right = int(W * (0.5 if self.is_compact() else 0.46))
        self.resizeDocks([d["workload"], d["live"]], [left, right], Qt.Horizontal)
        if not compact:
            self.resizeDocks([d["live"], d["qjl_bias"]], [int(H * 0.64), int(H * 0.36)], Qt.Vertical)
        self.unelide_tabs()
        self._after_relayout()

    def showEvent(self, ev) -> None:  # noqa: N802 - Qt naming
        super().showEvent(ev)
        QTimer.singleShot(0, self, self.unelide_tabs)  # a restored arrangement's tab bars too
        self._after_relayout()
        if getattr(self, "_size_docks_pending", False):
            self._size_docks_pending = False
            QTimer.singleShot(0, self, self._size_docks)

    def _build_status_bar(self) -> None:
        sb = self.statusBar()
        # one line, elided at the window's width (the whole message is its tooltip): a long progress message
        # never wraps the status bar or widens the window
        self.status_label = ElidedLabel("Starting ...")
        sb.addWidget(self.status_label, 1)
        self.progress = QProgressBar()
        self.progress.setRange(0, 1000)
        self.progress.setFixedWidth(120)
        self.progress.setFormat("%p%")  # what runs is said beside it, in the status line
        self.progress.setTextVisible(True)
        self.progress.hide()
        sb.addPermanentWidget(self.progress)
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setToolTip("Cancel the running task (Esc)")
        self.cancel_button.clicked.connect(self.cancel)
        self.cancel_button.hide()
        sb.addPermanentWidget(self.cancel_button)
        self.software_label = QLabel(f" \u26a0 {SOFTWARE_FLAG} ")
        self.software_label.setStyleSheet(f"background:{WARN_BG}; color:{WARN_FG}; font-weight:bold;"
                                          " border:1px solid #e0b000; border-radius:3px; padding:1px 4px;")
        self.software_label.hide()
        sb.addPermanentWidget(self.software_label)
        self.adapter_label = QLabel("Adapter: (opening the GPU ...)")
        self.adapter_label.setStyleSheet("padding: 0 6px;")
        sb.addPermanentWidget(self.adapter_label)

    def _build_actions(self) -> None:
        m_file = self.menuBar().addMenu("&File")
        m_run = self.menuBar().addMenu("&Run")
        m_view = self.menuBar().addMenu("&View")

        def act(menu, text, slot, keys=()):
            a = QAction(text, self)
            if keys:
                a.setShortcuts([QKeySequence(k) for k in keys])
            a.triggered.connect(slot)
            menu.addAction(a)
            self.addAction(a)
            return a

        self.act_run = act(m_run, "&Run now", self.run_now, ("Ctrl+R", "F5"))
        self.act_cancel = act(m_run, "&Cancel", self.cancel, ("Esc",))
        m_run.addSeparator()
        self.act_compare = act(m_run, "Compare all &methods", self.request_compare)
        m_run.addSeparator()
        self.act_live = act(m_run, "Start &live decode", self._live_menu_start, ("Ctrl+L",))
        self.act_live_stop = act(m_run, "S&top live decode", self.stop_live)
        self.act_report = act(m_file, "&Export report folder...", self._export_report_clicked, ("Ctrl+E",))
        self.act_shot = act(m_file, "Save window &screenshot...", self._screenshot_clicked, ("Ctrl+Shift+S",))
        self.act_trace = act(m_file, "Export timings as Chrome &trace...", self.export_trace)
        m_file.addSeparator()
        self.act_open = act(m_file, "&Open report or stored results...", self._open_report_clicked, ("Ctrl+O",))
        self.act_load = act(m_file, "&Load config...", self._load_config_clicked)
        self.act_save = act(m_file, "Sa&ve config...", self._save_config_clicked)
        m_file.addSeparator()
        act(m_file, "&Quit", self.close, ("Ctrl+Q",))
        for key in ["workload", "cache_layout", "block_inspector", "scales", "codes", "attention", "timing", "compare",
                    "qjl_bias", "live", "log"]:
            m_view.addAction(self.docks[key].toggleViewAction())
        m_view.addSeparator()
        # Alt+1..Alt+9: bring a panel to the front
        for i, key in enumerate(["workload", "cache_layout", "block_inspector", "scales", "codes", "attention",
                                 "timing", "compare", "live"], start=1):
            act(m_view, f"Show {self.docks[key].windowTitle()}", lambda k=key: self._raise_dock(k), (f"Alt+{i}",))
        m_view.addSeparator()
        act(m_view, "Reset &layout", self.reset_layout)
        act(m_view, "Live decode la&yout", self.show_live_layout)
        self.act_pin = act(m_run, "&Pin timings as baseline", self.timing.pin_current, ("Ctrl+P",))
        self.act_sweep = act(m_run, "Run the timing s&weep", self._sweep_shortcut, ("Ctrl+Shift+W",))
        self.act_compare.setShortcuts([QKeySequence("Ctrl+M")])
        m_help = self.menuBar().addMenu("&Help")
        act(m_help, "&Keyboard shortcuts", self.show_shortcuts, ("F1",))
        act(m_help, "&About kvviz", self.show_about)

    def _raise_dock(self, key: str) -> None:
        d = self.docks[key]
        d.show()
        d.raise_()

    def _sweep_shortcut(self) -> None:
        self._raise_dock("timing")
        self.timing.sweep_button.click()

    def shortcut_lines(self) -> list[str]:
        """'keys  action' for every action of the menus that has a shortcut."""
        lines = []
        for menu in self.menuBar().findChildren(QMenu):
            for a in menu.actions():
                keys = ", ".join(k.toString() for k in a.shortcuts())
                if keys:
                    lines.append(f"{keys:<22} {a.text().replace('&', '')}")
        return lines

    def show_shortcuts(self) -> None:
        QMessageBox.information(self, "kvviz keyboard shortcuts", "\n".join(self.shortcut_lines()))

    def about_text(self) -> str:
        def ver(name):
            try:
                return version(name)
            except PackageNotFoundError:
                return "not installed"

        adapter = self._adapter.line() if self._adapter is not None else "not opened yet"
        return "\n".join([
            "kvviz: a desktop lab for KV-cache quantisation kernels on wgpu.",
            f"GPU adapter: {adapter}",
            f"kvviz {ver('kvviz')}, Python {platform.python_version()}, wgpu {ver('wgpu')}, "
            f"numpy {ver('numpy')}, PySide6 {ver('PySide6-Essentials')}, pyqtgraph {ver('pyqtgraph')}",
        ])

    def show_about(self) -> None:
        QMessageBox.about(self, "About kvviz", self.about_text())

    # --------------------------------------------------------------- settings
    def _restore(self, config: SessionConfig | None) -> None:
        s = self.settings
        geo = s.value("geometry")
        if geo is not None:
            self.restoreGeometry(geo)
        else:
            self.resize(1600, 1000)
        state = s.value("windowState")
        self._size_docks_pending = not (state is not None and self.restoreState(state, STATE_VERSION))
        cfg = config
        if cfg is None:
            raw = s.value("config")
            if raw:
                try:
                    cfg = SessionConfig.from_json(json.loads(raw))
                    cfg.validate()
                except (KvvizError, ValueError, TypeError):
                    cfg = None
        self.workload.set_config(cfg or SessionConfig())
        auto = s.value("autoRun")
        if auto is not None:
            self.workload.auto_run.setChecked(str(auto).lower() in ("true", "1"))

    def save_settings(self) -> None:
        s = self.settings
        s.setValue("geometry", self.saveGeometry())
        s.setValue("windowState", self.saveState(STATE_VERSION))
        cfg = self.last_good_config
        if cfg is None:
            try:
                cfg = self.workload.config()
                cfg.validate()
            except KvvizError:
                cfg = None
        if cfg is not None:
            s.setValue("config", json.dumps(cfg.to_json(), allow_nan=False))  # validated: finite
        s.setValue("autoRun", self.workload.auto_run.isChecked())
        s.sync()

    def closeEvent(self, ev) -> None:
        if self.session.on_preview == self._emit_preview:
            self.session.on_preview = None
        self.log_panel.detach()
        self.save_settings()
        self._debounce.stop()
        self.runner.shutdown()
        super().closeEvent(ev)

    # ---------------------------------------------------------------- compute
    def schedule_compute(self) -> None:
        """A control changed: recompute after the debounce interval (if auto-run is on)."""
        if self.workload.auto_run.isChecked():
            self._debounce.start()

    def run_now(self, *_) -> None:
        """A compute the user asked for (Run, F5, Ctrl+Enter, a loaded config): kept in the run history."""
        self.request_compute(explicit=True)

    def request_compute(self, explicit: bool = False) -> None:
        """Compute the Workload's settings in the worker; `explicit` ones (run_now) are recorded in the run history,
        an automatic recompute (a changed field, the first run at start) is not."""
        self._debounce.stop()
        try:
            cfg = self.workload.config()
            cfg.validate()  # every field's declared range before the worker: block size 0 is refused here
        except KvvizError as exc:
            self.report_invalid("workload", "Workload", exc)
            self.status_label.setText(f"Workload: {exc}")
            self.compute_failed.emit(exc)
            return
        self.state.resolve("workload", "edited")  # the settings are readable, and a compute of them is on its way
        session = self.session
        if cfg.source == "model" and cfg.model_path not in self.workload.model_infos:
            self.request_model_info(cfg.model_path)
        if self.live.running:
            self._live_why = "cancelled by a new computation"
        self._compute_task = self.runner.submit(
            "compute", lambda progress, cancel: session.compute(cfg, progress, cancel), f"compute {cfg.method}",
            ComputeRequest(cfg, bool(explicit)))

    def cancel(self) -> None:
        self._debounce.stop()
        if self.runner.cancel_all():
            self.status_label.setText("Cancelling ...")

    def request_inspect(self, block: int, kv_head: int, which: str) -> None:
        res = self.results
        if res is None or res.stored_as:  # stored results keep no GPU cache to read (their notice says so)
            return
        session = self.session
        self.runner.submit("inspect", lambda p, c: session.inspect_block(res, block, kv_head, which),
                           f"inspect block {block}", (res, block, kv_head, which))

    def open_block(self, block: int) -> None:
        d = self.docks["block_inspector"]
        d.show()
        d.raise_()
        self.inspector.show_block(block)

    def request_sweep(self, param: str, values) -> None:
        cfg = self.results.config if self.results is not None else None
        if cfg is None:
            try:
                cfg = self.workload.config()
            except KvvizError as exc:
                self.show_error("Sweep", exc, "sweep")
                return
        session = self.session
        values = list(values)
        self.runner.submit("sweep", lambda p, c: session.sweep(cfg, param, values, p, c), f"sweep {param}",
                           (param, values, self.results))

    def request_compare(self) -> None:
        res = self.results
        if res is None:
            return

        session = self.session
        d = self.docks["compare"]
        d.show()
        d.raise_()
        self.compare.status.setText("Comparing every method on the current K/V ...")
        self.runner.submit("compare", lambda p, c: run_compare(session, res, progress=p, cancel=c), "compare methods", res)

    def request_model_info(self, path: str) -> None:
        """Load the model (path, "" = SmolLM2) in the worker and show its shapes in the Workload panel."""
        path = (path or "").strip()
        known = self.workload.model_infos.get(path)
        if known is not None:
            self.workload.set_model_info(path, known)
            return
        session = self.session
        self.runner.submit("model", lambda p, c: session.load_model(path, p).config, f"load {model_label(path)}", path)

    def request_bias(self) -> None:
        """TurboQuant estimator bias of the bias panel's (sequence, head) of the current results, in the worker."""
        res = self.results
        if res is None or res is not self.bias.res:
            return
        seq, head = self.bias.selection()
        try:
            q, K, seed, layer = self.bias.inputs()
        except (KvvizError, IndexError, ValueError) as exc:
            self.bias.set_error(exc)
            return

        session = self.session
        setting = tq_setting(res)  # the results' TurboQuant bits / outlier share (the seed configuration otherwise)
        self.runner.submit("bias", lambda p, c: inner_product_bias(q, K, seed, layer, rt=session.rt, **setting),
                           f"QJL bias seq {seq} head {head}", (res, seq, head))

    # -------------------------------------------------------------- live decode
    def _live_menu_start(self) -> None:
        d = self.docks["live"]
        d.show()
        d.raise_()
        self.start_live()

    def start_live(self) -> None:
        """Decode the live panel's prompt through an f32 and a quantised paged cache, step by step, in the
        worker (kvviz.live.run.decode_run). Cancels a running compute (and a compute cancels it)."""
        cfg = self.live.config()
        if not cfg.prompt.strip():
            self.show_error("Live decode", InvalidInput("The prompt is empty.", "Type a prompt for the model."), "live")
            return
        self._debounce.stop()
        self._live_why = ""
        session = self.session
        frontend = self.workload.frontend.currentText() or FRONTEND_GLSLANG
        emit_step, emit_event = self.live_step.emit, self.live_event.emit
        run_id = self._live_run = self.live.begin(cfg)
        job = lambda progress, cancel: decode_run(session.load_model, cfg, session.ctx(frontend), run_id,  # noqa: E731
                                                  emit_event, emit_step, progress, cancel)
        self.runner.submit("live", job, f"live {cfg.method}", run_id)

    def stop_live(self) -> None:
        self._live_why = ""
        if self.runner.cancel_kind("live"):
            self.status_label.setText("Stopping the live decode ...")

    def _on_live_step(self, run_id, st) -> None:
        if run_id == self._live_run:
            self.live.add_step(st)

    def _on_live_event(self, run_id, kind: str, payload) -> None:
        if run_id != self._live_run:
            return
        if kind == "model":
            path, cfg = payload
            self.live.set_model(cfg)
            if path not in self.workload.model_infos:
                self.workload.set_model_info(path, cfg)
        elif kind == "prefilled":
            self.live.set_prefilled(payload)

    # ------------------------------------------------------------ task events
    # Every kind of worker task is an entry of kvviz.ui.tasks.TASKS: these handlers only dispatch.
    def _task_started(self, task) -> None:
        self.progress.setValue(0)
        self.progress.setToolTip(task.label)
        self.progress.show()
        self.cancel_button.show()
        self.workload.set_busy(True)
        if not TASKS[task.kind].quiet:
            self.status_label.setText(f"{task.label} ...")

    def _task_progress(self, task, frac: float, msg: str) -> None:
        if task is self.runner.current and not TASKS[task.kind].quiet:
            self.progress.setValue(int(frac * 1000))
            self.status_label.setText(f"{task.label}: {msg}")

    def _idle(self) -> None:
        if not self.runner.busy:
            self.progress.hide()
            self.cancel_button.hide()
            self.workload.set_busy(False)

    def _task_finished(self, task, result) -> None:
        kind = TASKS[task.kind]
        if kind.current(self, task):  # else superseded by a newer request: its results are on the way
            kind.done(self, task, result)
            if not task.cancelled:  # it succeeded: what its failure said before is no longer true
                self.state.resolve(task.kind, *kind.resolves)
            said = self.status_label.text()
            if not kind.quiet and (said == f"{task.label} ..." or said.startswith(f"{task.label}: ")) \
                    and not said.endswith(": cancelled"):
                self.status_label.setText(f"{task.label}: done")  # its own words said nothing after the start

    def _task_dropped(self, task) -> None:
        """A pending task was removed before it ran: one whose panel waits for it (a live decode) ends here."""
        kind = TASKS[task.kind]
        if kind.dropped_is_cancel and kind.current(self, task):
            self._task_failed(task, Cancelled())

    def default_cancelled(self, task) -> None:
        self.status_label.setText(f"{task.label}: cancelled" + (" - showing the previous results" if self.results else ""))
        self.task_cancelled.emit(task.kind)

    def _task_failed(self, task, exc) -> None:
        kind = TASKS[task.kind]
        current = kind.current(self, task)
        if not current and (kind.stale_is_silent or isinstance(exc, Cancelled)):
            return  # replaced by a newer task, not cancelled by the user
        if isinstance(exc, Cancelled):
            if kind.cancelled is not None:
                kind.cancelled(self, task)
            else:
                self.default_cancelled(task)
            if task.kind == "compute":
                self._sync_edited()
            return
        if not isinstance(exc, KvvizError):
            log.error("unexpected error in %s:\n%s", task.label, getattr(exc, "__kvviz_traceback__", ""))
        if task.kind == "compute" and current:
            self.report_invalid("compute", kind.failure_title, exc)
        elif task.kind != "compute":
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            self.state.report(Notice(task.kind, kind.failure_title, exc, kind.stale,
                                     f"{kind.stale_why} ({first})" if kind.stale_why else ""))
        self.status_label.setText(f"{kind.failure_title}: {exc}")
        if kind.failed is not None:
            kind.failed(self, task, exc)

    def report_invalid(self, source: str, title: str, exc: BaseException) -> None:
        """A compute refused or failed: the banner says why, the field it names is marked in the Workload and
        every results panel says its content is the last run's."""
        field = self.invalid_field(exc)
        what = f"{field or 'the workload'} is invalid ({exc})" if isinstance(exc, KvvizError) else \
            f"the last run failed ({type(exc).__name__}: {exc})"
        self.state.report(Notice(source, title, exc, RESULT_PANELS, f"these are the results of the last run; {what}",
                                 field))

    def show_error(self, where: str, exc: BaseException, source: str | None = None) -> None:
        """An error of an action (an export, a config file, a panel's request): the banner shows it until the same
        action (`source`, default `where`) succeeds or the user dismisses it."""
        self.state.report(Notice(source or where, where, exc))
        self.status_label.setText(f"{where}: {exc}")

    def resolve(self, *sources: str) -> None:
        self.state.resolve(*sources)

    # The panels that draw a compute's results before its kernels are timed: none of them shows a timing but
    # the overview's decode card (it says the timing is under way) and elapsed time.
    PREVIEW_PANELS = ("overview", "cache_layout", "scales", "codes", "attention")

    def _emit_preview(self, res) -> None:
        """Session.on_preview, on the worker thread: the results go to the UI thread (queued) with their task."""
        try:
            self.preview_ready.emit(self.runner.current, res)
        except RuntimeError:  # the window is gone; the compute carries on to its end
            pass

    def _show_preview(self, task, res) -> None:
        """Draw the current compute's results in the panels that need no timing, while the worker times them."""
        if task is not self._compute_task or task.cancelled:
            return
        self._preview = res
        self._previewed = []
        for key in self.PREVIEW_PANELS:
            p = getattr(self, key)
            try:
                p.set_results(res)
                self._previewed.append(p)
            except Exception as exc:  # noqa: BLE001 - one broken panel must not take the window down
                traceback.print_exc()
                self.show_error(f"{p.title} panel", exc)
        self._fit_central()

    def drop_preview(self) -> None:
        """The compute whose preview is drawn failed or was cancelled: its panels show the last results again."""
        previewed, self._preview, self._previewed = self._previewed, None, []
        if self.results is None:
            return
        for p in previewed:
            try:
                p.set_results(self.results)
            except Exception as exc:  # noqa: BLE001
                traceback.print_exc()
                self.show_error(f"{p.title} panel", exc)

    def clear_error(self) -> None:
        """Dismiss what the banner shows (its notices stay, and so do the stale notes they make)."""
        self.state.dismiss_banner()

    def _sync_notices(self) -> None:
        """The banner and the Workload's marked field as the app state's notices say (the panels' stale notes
        follow the same signal, kvviz.ui.panels.base.Panel.sync_stale)."""
        self.banner.show_notices(self.state.banner_notices())
        marked = self.state.marked_field()
        if marked is None:
            self.workload.clear_invalid()
        else:
            w = self.workload.field_widgets().get(marked[0])
            if self.workload.invalid_field != marked[0] or (w is not None and w.toolTip() != marked[1]):
                self.workload.mark_invalid(*marked)
        self._fit_central()
        QTimer.singleShot(0, self, self._fit_central)  # once the stale notes' heights are laid out

    def _sync_edited(self, *_) -> None:
        """With no compute on its way, the results panels say when the Workload no longer holds the settings their
        results were computed with (auto-run off, or a compute cancelled); an unreadable field is marked at once."""
        if self._debounce.isActive() or self._compute_coming():
            return  # a compute of the new settings is coming: it shows them or says why not
        try:
            cfg = self.workload.config()
            cfg.validate()
        except KvvizError as exc:
            self.report_invalid("workload", "Workload", exc)
            return
        self.state.resolve("workload")
        if self._shown_cfg is None or cfg == self._shown_cfg:
            self.state.resolve("edited")
            return
        self.state.report(Notice("edited", "Workload", None, RESULT_PANELS,
                                 "these are the results of the last run; the Workload settings have changed since "
                                 "(Run, F5, computes them)", banner=False))

    def _compute_coming(self) -> bool:
        cur = self.runner.current
        return (cur is not None and cur.kind == "compute" and not cur.cancelled) or "compute" in self.runner.pending_kinds()

    # ------------------------------------------------------------ stored runs and reports
    def open_run(self, run_id: int) -> bool:
        """Show a run of the history as it was computed: its stored results (no recompute), with the comparison or
        the sweep it held. A run without stored results (a bench) is said in the banner."""
        db = self.timing.history_view.db
        if db is None:
            self.show_error("Open run", InvalidInput("No run history is open."), "open")
            return False
        try:
            run = db.run(int(run_id))
            points = (run.extra or {}).get("sweep_points")
            if run.snapshot is None and points:  # a sweep keeps its points, not a run's results
                self._raise_dock("timing")
                self.timing.set_sweep(points)
                self.resolve("open")
                self.status_label.setText(f"Opened the sweep of run {run.id} (stored points, nothing recomputed)")
                return True
            res, extra = db.load_results(run.id)
        except KvvizError as exc:
            self.show_error("Open run", exc, "open")
            return False
        self.show_stored(res, extra, run.id)
        return True

    def open_stored_file(self, path: str) -> bool:
        """Show the results of a report folder (its results.npz) or of a results file, as they were computed."""
        p = str(path)
        if os.path.isdir(p):
            p = os.path.join(p, RESULTS_FILE)
        elif os.path.basename(p) in ("report.json", "report.md"):
            p = os.path.join(os.path.dirname(p), RESULTS_FILE)
        folder = os.path.basename(os.path.dirname(os.path.abspath(p)))
        try:
            res, extra = load_results(p, stored_as=f"report {folder}")
        except KvvizError as exc:
            self.show_error("Open report", exc, "open")
            return False
        self.show_stored(res, extra)
        return True

    def show_stored(self, res, extra: dict | None = None, run_id: int | None = None) -> None:
        """Draw results read back from a file in every panel, as a compute's (the Workload shows their settings;
        nothing is recomputed until the user asks)."""
        extra = extra or {}
        self._debounce.stop()
        self.runner.cancel_kind("compute")
        self._compute_task = None
        self.workload.set_config(res.config)
        self._show_results(res, res.config)
        self.timing.run_id = run_id  # a pin pins this run, it is not recorded again
        rows = extra.get("compare_rows")
        if rows:
            self.compare.set_rows(rows)
            self.compare_res = res
            self.sync_compare_stale()
        if extra.get("sweep_points"):
            self.timing.set_sweep(extra["sweep_points"])
        # the block inspector decodes the words of the GPU cache, which a stored run does not keep
        self.state.report(Notice("stored", "Stored results", None, frozenset({self.inspector.key}),
                                 f"the block inspector reads the GPU cache, which {res.stored_as} does not keep; "
                                 "Run (F5) computes it again", banner=False))
        self.resolve("open")
        self.status_label.setText(f"Opened {res.stored_as}: {res.method.label}, as computed (nothing recomputed)")

    def _open_report_clicked(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Open a report or stored results", "",
                                              "kvviz results (results.npz report.json);;All files (*)")
        if path:
            self.open_stored_file(path)

    def _set_baseline(self, run) -> None:
        """The pinned run (a kvviz.history.db.Run, None: unpinned) as the panels compare against it."""
        if run is None:
            self.state.set_baseline(None)
            return
        what = run.method or ", ".join(run.shapes[:1])
        title = f"run {run.id}" + (f" '{run.label}'" if run.label else "") + (f" ({what})" if what else "")
        self.state.set_baseline(Baseline(run.id, title, run.numbers))

    def keep_run(self, res, kind: str = "run", extra: dict | None = None) -> int | None:
        """Record `res` in the run history (a Run, a pin, a comparison); its id, or None (no history, a write that
        failed: the History tab says why)."""
        run_id = self.timing.history_view.record(res, kind, extra)
        if run_id is not None and kind == "run" and res is self.results:
            self.timing.run_id = run_id
        return run_id

    def sync_compare_stale(self) -> None:
        """The Method comparison's rows are stale while the window shows results other than those compared."""
        if self.compare.rows and self.compare_res is not None and self.compare_res is not self.results:
            self.state.report(Notice("compare rows", "Method comparison", None, frozenset({"compare"}),
                                     "these methods were compared on the K/V of an earlier run (Compare all methods "
                                     "compares them on the current one)", banner=False))
        else:
            self.state.resolve("compare rows")

    def _show_results(self, res, cfg: SessionConfig | None = None) -> None:
        # a panel that drew this compute's preview keeps its picture (the same analysis) unless it shows timings
        same = [p for p in self._previewed if self._preview is not None and p.res is self._preview
                and self._preview.batch is res.batch and p is not self.overview]
        self._preview, self._previewed = None, []
        self.results = res
        self._shown_cfg = cfg if cfg is not None else res.config
        self.state.set_results(res)
        self.last_good_config = res.config
        self._set_adapter(res.adapter)
        for p in self.panels + [self.bias]:
            if p in same:
                p.res = res
                continue
            try:
                p.set_results(res)
            except Exception as exc:  # noqa: BLE001 - one broken panel must not take the window down
                traceback.print_exc()
                self.state.report(Notice(f"panel {p.key}", f"{p.title} panel", exc, frozenset({p.key}),
                                         f"this panel could not draw the last run ({type(exc).__name__}: {exc}); "
                                         "it shows an earlier one"))
            else:
                self.state.resolve(f"panel {p.key}")
        self.sync_compare_stale()
        self._fit_central()  # the overview grows by its warning line (Results.warnings) when there is one
        self.workload.show_data_shapes(res.config)
        if res.config.source == "model" and res.config.model_path not in self.workload.model_infos:
            self.request_model_info(res.config.model_path)
        self.status_label.setText(f"{res.method.label}: done in {res.elapsed_s:.2f} s ({res.source_note})")
        # keep the block inspector showing a block of the new results
        blk = self.cache_layout.selected_block
        if blk < 0 and res.batch.seq_blocks and res.batch.seq_blocks[0]:
            blk = int(res.batch.seq_blocks[0][0])
        if blk >= 0:
            self.cache_layout.show_block(blk)
            self.inspector.show_block(blk)
        self.results_ready.emit(res)

    def _set_adapter(self, adapter) -> None:
        self._adapter = adapter
        self.adapter_label.setText(f"Adapter: {adapter.name} ({adapter.backend}, {adapter.adapter_type})")
        self.adapter_label.setToolTip(adapter.line())
        self.software_label.setVisible(bool(adapter.is_software))
        self.software_label.setToolTip(f"{adapter.name} is a software rasteriser: every time is a CPU time.")

    # ----------------------------------------------------------------- export
    def ask_save_path(self, caption: str, name: str, filt: str) -> str:
        path, _ = QFileDialog.getSaveFileName(self, caption, name, filt)
        return path

    def ask_figure_options(self, fmt: str, size) -> dict | None:
        """{"size": QSize, "dpi": int} of a figure from the export dialog (kvviz.ui.export), None if cancelled."""
        dlg = ExportDialog(fmt, size, self)
        if dlg.exec() != ExportDialog.Accepted:
            return None
        return {"size": dlg.figure_size(), "dpi": dlg.dpi()}

    def ask_directory(self, caption: str) -> str:
        return QFileDialog.getExistingDirectory(self, caption, os.getcwd())

    def export_panel(self, panel, fmt: str) -> list:
        if fmt in ("csv", "json") and not panel.tables():  # a panel without results has no tables
            return []
        filt = {"png": "PNG image (*.png)", "svg": "SVG image (*.svg)", "csv": "CSV table (*.csv)",
                "json": "JSON (*.json)"}[fmt]
        figure = {}
        if fmt in ("png", "svg"):
            figure = self.ask_figure_options(fmt, panel.size())
            if figure is None:
                return []
        path = self.ask_save_path(f"Export {panel.title} as {fmt.upper()}", f"kvviz-{panel.key}.{fmt}", filt)
        if not path:
            return []
        try:
            out = panel.export(fmt, path, **figure)
        except (OSError, ValueError) as exc:
            self.show_error("Export", exc)
            return []
        self.resolve("Export")
        self.status_label.setText(f"Wrote {', '.join(out)}")
        return out

    def save_screenshot(self, path: str) -> str:
        QApplication.processEvents()
        img = self.grab()
        if not img.save(str(path), "PNG"):
            raise OSError(f"could not write {path}")
        return str(path)

    def _screenshot_clicked(self) -> None:
        path = self.ask_save_path("Save window screenshot", "kvviz-window.png", "PNG image (*.png)")
        if path:
            try:
                self.save_screenshot(path)
                self.resolve("Screenshot")
                self.status_label.setText(f"Wrote {path}")
            except OSError as exc:
                self.show_error("Screenshot", exc)

    def export_trace(self, path: str | None = None) -> str:
        if self.results is None:
            self.show_error("Chrome trace", InvalidInput("No results yet.", "Wait for the first run to finish."))
            return ""
        if not path:
            path = self.ask_save_path("Export timings as Chrome trace", "kvviz-trace.json", "Chrome trace (*.json)")
            if not path:
                return ""
        out = write_chrome_trace(path, self.results)
        self.resolve("Chrome trace")
        self.status_label.setText(f"Wrote {out} (open it in https://ui.perfetto.dev)")
        return out

    def export_report(self, out_dir: str) -> dict:
        """The report folder: every panel as PNG, report.json, report.md, CSVs, trace.json."""
        res = self.results
        if res is None:
            raise InvalidInput("No results yet.", "Wait for the first run to finish.")
        # Everything goes into a staging folder first: an error part-way leaves no half-written folder.
        with staged_dir(out_dir) as stage:
            figures = {"window": "window.png"}
            save_png(self, os.path.join(stage, "window.png"), 1.0)
            tables = {}
            for p in self.panels + [self.bias, self.live]:  # every panel (QJL bias and live decode too)
                if p in (self.inspector, self.compare, self.live) and not p.tables():
                    continue  # nothing shown yet (no block picked, no comparison, no live run)
                name = f"{p.key}.png"
                hidden = not p.isVisible()
                if hidden:
                    p.resize(max(p.width(), 900), max(p.height(), 600))
                p.export_png(os.path.join(stage, name))
                figures[p.key] = name
                tables[p.key] = p.tables()
            paths = write_report(stage, res, tables, figures, compare_rows=self.compare.rows or None,
                                 sweep_points=self.timing.sweep_points or None, history=list(self.timing.history))
        paths = relocate(paths, stage, out_dir)
        self.resolve("Export report")
        self.status_label.setText(f"Report written to {out_dir}")
        return paths

    def _export_report_clicked(self) -> None:
        d = self.ask_directory("Export report into folder")
        if not d:
            return
        try:
            self.export_report(d)
        except (KvvizError, OSError) as exc:
            self.show_error("Export report", exc)

    def _load_config_clicked(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Load config", "", "JSON (*.json)")
        if path:
            self.load_config(path)

    def load_config(self, path: str) -> bool:
        """Load a config file into the Workload panel and run it. A file that is not JSON gets its own
        message (line and column); a refused value names its field, which is marked in the Workload panel
        (the settings shown stay those of the last run). False when refused."""
        try:
            cfg = SessionConfig.load(path)
        except KvvizError as exc:
            msg = str(exc).replace("--config: ", "", 1)
            title = "Load config: JSON syntax error" if "is not valid JSON" in msg else "Load config"
            self.state.report(Notice("Load config", title, type(exc)(f"{os.path.basename(path)}: {msg}", exc.hint),
                                     field=self.invalid_field(exc)))
            self.status_label.setText(f"{title}: {msg}")
            return False
        self.state.resolve("Load config")
        self.workload.set_config(cfg)
        self.run_now()
        return True

    @staticmethod
    def invalid_field(exc: BaseException) -> str | None:
        """The SessionConfig field an InvalidInput names ("block_size must be ...", "method_options: ..."),
        or None."""
        names = {f.name for f in dataclass_fields(SessionConfig)}
        if getattr(exc, "field", None) in names:  # said by the Workload panel when it cannot read a field's text
            return exc.field
        m = re.match(r"\s*(?:--set: |--config: )?(?:unknown setting )?'?(\w+)'?", str(exc))
        if m and m.group(1) in names:
            return m.group(1)
        return None

    def _save_config_clicked(self) -> None:
        path = self.ask_save_path("Save config", "kvviz-config.json", "JSON (*.json)")
        if not path:
            return
        try:
            cfg = self.workload.config()
            with open(path, "w") as fh:
                json.dump(cfg.to_json(), fh, indent=1, allow_nan=False)
        except (KvvizError, OSError) as exc:
            self.show_error("Save config", exc)
            return
        self.resolve("Save config")
        self.status_label.setText(f"Wrote {path}")
