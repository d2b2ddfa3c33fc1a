"""Live decode panel: a real model (SmolLM2-135M or any llama GGUF) decoded token by token through
paged GPU KV caches, f32 against a quantisation method (kvviz.live.decode.LiveDecoder).

The window runs the decoder in its worker thread (start, then one `step` at a time) and hands every
`LiveStep` to `add_step` through a queued signal, so the panel fills while the model runs:
  - the per-step KL(p_f32 || p_quant) of the next-token distribution (teacher-forced: both caches are
    fed the f32 path's tokens), red where the two greedy picks differ, and the running top-1 agreement;
  - the two generated texts side by side: the f32 cache's and the quantised cache's own free-running
    continuation, with the point where the quantised text leaves the f32 one marked;
  - the block pools of the paged caches as grids, filling as the sequence grows (blocks allocated in
    the last step outlined);
  - the cache view of one layer and KV head (a middle layer and KV head 0 by default): the per-position
    K and V scales the quantised cache holds (int8_seed: the f32 scale word of each token record, read
    back from the GPU; other methods: what their cache stores per token, labelled) and the last step's
    attention weights over positions through the f32 and the quantised cache. The decoder reads them
    on the worker after every step (LiveDecoder.watch; only the selected layer, only the sequence's
    blocks) and they arrive with the step; after the run a new selection is read by a small worker task.
Summary numbers (mean / max KL, top-1 rate, free-run divergence) at the end; the per-step table is
exported as CSV and, with the summary and configuration, as JSON.
"""
from __future__ import annotations

import html
import json
import re

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QRectF, Qt, Signal
from PySide6.QtGui import QColor, QPen
from PySide6.QtWidgets import (
    QAbstractItemView, QCheckBox, QComboBox, QDoubleSpinBox, QFileDialog, QGraphicsRectItem, QHBoxLayout, QLabel,
    QLineEdit, QMenu, QPlainTextEdit, QPushButton, QSizePolicy, QSpinBox, QSplitter, QTableWidget, QTableWidgetItem,
    QTabWidget, QTextBrowser, QToolButton, QVBoxLayout, QWidget,
)

from kvviz.analysis.live_metrics import summarize_live
from kvviz.report.tables import Table, clean
from kvviz.ui.panels.base import ElidedLabel, Panel
from kvviz.ui.panels.cache_layout import CELL, pool_image
from kvviz.ui.panels.workload import GGUF_FILTER, MODEL_PLACEHOLDER, default_options, describe_model, method_choices
from kvviz.ui.style import K_COLOR, Q_COLOR, REF_COLOR, V_COLOR

LIVE_FORMATS = ("png", "svg", "csv", "json")
AGREE_COLOR = (44, 160, 44)
DISAGREE_COLOR = (214, 39, 40)
# grid bands: (key in the tables dict, label, colour index of kvviz.ui.style.seq_color)
PATHS = (("f32", "f32", 0), ("quant", "quant", 1), ("free", "free run", 3))
STEP_COLUMNS = ["step", "position", "fed_token", "fed_str", "f32_token", "f32_str", "quant_token", "quant_str",
                "kl", "top1_agree", "nll_delta", "p_f32", "p_quant_of_f32", "free_token", "free_str", "free_forked",
                "context_len", "blocks_quant", "new_blocks", "step_s"]
W_BASE_COLOR = (150, 150, 150)  # f32 attention weights in the cache view
MAX_BLOCK_LINES = 64  # block boundaries drawn in the scale plot (none past this many blocks)


def _tok_html(s: str) -> str:
    return html.escape(s).replace("\n", "\u21b5<br>")


def text_html(prompt_tail: str, toks: list, diverge: int | None, mark: str) -> str:
    """The prompt (grey) and the generated tokens; tokens from `diverge` on on a `mark` background."""
    parts = [f"<span style='color:#8a939c'>{_tok_html(prompt_tail)}</span>"]
    for i, t in enumerate(toks):
        if diverge is not None and i == diverge:
            parts.append("<span style='color:#c0392b; font-weight:bold'>\u25b8</span>")
        if diverge is not None and i >= diverge:
            parts.append(f"<span style='background:{mark}; color:#111'>{_tok_html(t)}</span>")
        else:
            parts.append(f"<span style='color:#102a43'>{_tok_html(t)}</span>")
    return "<div style='white-space: pre-wrap; font-size: 10pt'>" + "".join(parts) + "</div>"


def _hex(rgb) -> str:
    return "#%02x%02x%02x" % tuple(int(c) for c in rgb[:3])


def _title(plot, text: str) -> None:
    """A 9pt plot title. Keep it short: pyqtgraph makes a title's width its plot's minimum width, so a
    long one pushes the plot beside it out of the view (and lowering that minimum makes the title resize
    during Qt's teardown at exit, after its text item is gone: a crash in PySide6 6.11)."""
    plot.setTitle(text, size="9pt")


def _slug(label: str) -> str:
    """A CSV column name from an axis label: 'K scale' -> 'k_scale', '|k| norm (f16)' -> 'k_norm_f16'."""
    return re.sub(r"[^a-z0-9]+", "_", label.lower()).strip("_") or "value"


class _Options(QWidget):
    """Editors of a method's options (bool/int/float/str), in a row; `options()` = the non-default ones."""

    changed = Signal()

    def __init__(self, parent=None):
        super().__init__(parent)
        self.lay = QHBoxLayout(self)
        self.lay.setContentsMargins(0, 0, 0, 0)
        self.lay.setSpacing(4)
        self.editors: dict = {}
        self.defaults: dict = {}

    def build(self, key: str) -> None:
        while self.lay.count():
            it = self.lay.takeAt(0)
            if it.widget() is not None:
                it.widget().deleteLater()
        self.editors, self.defaults = {}, default_options(key)
        for name, val in self.defaults.items():
            if isinstance(val, bool):
                ed = QCheckBox(name)
                ed.setChecked(val)
            elif isinstance(val, int):
                ed = QSpinBox()
                ed.setRange(-2**31, 2**31 - 1)
                ed.setValue(val)
            elif isinstance(val, float):
                ed = QDoubleSpinBox()
                ed.setDecimals(6)
                ed.setRange(-1e12, 1e12)
                ed.setValue(val)
            else:
                ed = QLineEdit(str(val))
                ed.setMaximumWidth(110)
            ed.setToolTip(f"{key} option '{name}' (default {val!r})")
            if not isinstance(ed, QCheckBox):
                self.lay.addWidget(QLabel(name))
            self.lay.addWidget(ed)
            self.editors[name] = ed
        self.lay.addStretch(1)
        self.setVisible(bool(self.editors))

    def options(self) -> dict:
        out = {}
        for name, ed in self.editors.items():
            if isinstance(ed, QCheckBox):
                v = ed.isChecked()
            elif isinstance(ed, (QSpinBox, QDoubleSpinBox)):
                v = ed.value()
            else:
                v = ed.text()
            if v != self.defaults.get(name):
                out[name] = v
        return out


class _Prompt(QPlainTextEdit):
    run_requested = Signal()

    def keyPressEvent(self, ev) -> None:  # noqa: N802 - Qt naming
        if ev.key() in (Qt.Key_Return, Qt.Key_Enter) and ev.modifiers() & Qt.ControlModifier:
            self.run_requested.emit()
            return
        super().keyPressEvent(ev)


class LivePanel(Panel):
    key = "live"
    title = "Live decode"
    start_requested = Signal()
    stop_requested = Signal()
    view_read = Signal(object, object)  # LiveWatch, cache view: a worker read of a new selection (queued)
    view_ready = Signal(object)  # a new cache view (after a step, or read for a new selection), drawn

    def __init__(self, host=None, parent=None):
        super().__init__(host, parent)
        from kvviz.live.decode import DEFAULT_PROMPT
        from kvviz.paging import POLICIES

        self.steps: list = []
        self.running = False
        self.num_blocks = 0
        self.block_size = 16
        self.max_new = 0
        self.tables_now: dict = {}  # path -> block list drawn
        self.prev_tables: dict = {}
        self.context_len = 0
        self.prompt_strs: list = []
        self.model_cfg = None
        self.describe: dict = {}
        self.summary: dict = {}
        self.timings: dict = {}
        self.step_table = None
        self.policy_used = ""
        self.grid_cells: dict = {}  # path -> allocated blocks drawn in the grid
        self.view: dict | None = None  # LiveDecoder.cache_view drawn in the cache view
        self.view_table = None
        self._watch = None  # the LiveWatch of the decoder the steps come from
        self._decoder = None  # that decoder (the watch holds it weakly), for reads after the run
        self._reading = None  # (layer, KV head) a worker read is on its way for
        self._heads = (9, 3)  # query heads, KV heads of the model (for the query-head choices)
        self.state = "idle"  # idle | running | done | stopped | failed
        menu = self.export_button.menu()
        menu.addAction("JSON...", lambda: self._export_clicked("json"))
        self.export_button.setToolTip("Export the live run: PNG (2x), SVG, CSV of the per-step table (and of the cache "
                                      "view beside it), JSON (summary + steps)")

        # ---- controls
        controls = QVBoxLayout()
        controls.setContentsMargins(0, 0, 0, 0)
        controls.setSpacing(3)
        self.model_path = QLineEdit()
        self.model_path.setPlaceholderText(MODEL_PLACEHOLDER)
        self.model_path.setToolTip("A llama GGUF; empty: SmolLM2-135M")
        browse = QToolButton()
        browse.setText("...")
        browse.setToolTip("Choose the model")
        browse.setPopupMode(QToolButton.InstantPopup)
        bmenu = QMenu(browse)
        bmenu.addAction("Choose a llama GGUF file...", self._browse)
        bmenu.addAction("Use the Workload panel's model", self._same_as_workload)
        bmenu.addAction("Built-in SmolLM2-135M", lambda: self.model_path.setText(""))
        browse.setMenu(bmenu)
        mrow = QHBoxLayout()
        mrow.setSpacing(3)
        mrow.addWidget(self.model_path, 1)
        mrow.addWidget(browse)
        row0 = QHBoxLayout()
        row0.setSpacing(6)
        row0.addWidget(QLabel("Model"))
        row0.addLayout(mrow, 3)
        self.method = QComboBox()
        for key, label in method_choices():
            self.method.addItem(label, key)
            self.method.setItemData(self.method.count() - 1, key, Qt.ToolTipRole)
        self.method.setSizeAdjustPolicy(QComboBox.AdjustToMinimumContentsLengthWithIcon)
        self.method.setMinimumContentsLength(12)
        row0.addWidget(QLabel("Method"))
        row0.addWidget(self.method, 2)
        controls.addLayout(row0)

        self.max_new_spin = QSpinBox()
        self.max_new_spin.setRange(1, 4096)
        self.max_new_spin.setValue(24)
        self.max_new_spin.setToolTip("Tokens to generate")
        self.block_spin = QSpinBox()
        self.block_spin.setRange(1, 1024)
        self.block_spin.setValue(16)
        self.block_spin.setToolTip("Tokens per physical block of the paged caches")
        self.policy = QComboBox()
        self.policy.addItems(list(POLICIES))
        self.policy.setToolTip("Block allocation policy of the caches' pools")
        self.start_button = QPushButton("\u25b6 Start")
        self.start_button.setToolTip("Decode live (Ctrl+Enter in the prompt); cancels a running computation")
        self.start_button.clicked.connect(self.start_requested)
        self.stop_button = QPushButton("\u25a0 Stop")
        self.stop_button.setToolTip("Stop the live decode (the steps so far stay)")
        self.stop_button.clicked.connect(self.stop_requested)
        self.stop_button.setEnabled(False)
        row1 = QHBoxLayout()
        row1.setSpacing(6)
        for lab, w in (("New tokens", self.max_new_spin), ("Block size", self.block_spin), ("Allocation", self.policy)):
            row1.addWidget(QLabel(lab))
            row1.addWidget(w)
        row1.addStretch(1)
        row1.addWidget(self.start_button)
        row1.addWidget(self.stop_button)
        controls.addLayout(row1)
        self.options = _Options()
        self.cache_note = QLabel("")
        self.cache_note.setStyleSheet("color: #8a5a00; font-size: 8pt;")
        self.options_row = QWidget()
        orow = QHBoxLayout(self.options_row)
        orow.setContentsMargins(0, 0, 0, 0)
        orow.addWidget(self.options, 1)
        orow.addWidget(self.cache_note)
        controls.addWidget(self.options_row)
        self.body.addLayout(controls)
        self.prompt = _Prompt()
        self.prompt.setPlainText(DEFAULT_PROMPT)
        self.prompt.setTabChangesFocus(True)
        self.prompt.setToolTip("Prompt (Ctrl+Enter starts)")
        self.prompt.setFixedHeight(46)
        self.prompt.run_requested.connect(self.start_requested)
        self.body.addWidget(self.prompt)
        self.method.currentIndexChanged.connect(self._method_changed)
        self._method_changed()

        self.status = QLabel("Press Start to decode the prompt through an f32 and a quantised paged cache.")
        self.status.setWordWrap(True)
        self.status.setTextFormat(Qt.RichText)
        self.status.setSizePolicy(QSizePolicy.Ignored, QSizePolicy.Preferred)
        self.body.addWidget(self.status)

        # ---- outputs
        outer = QSplitter(Qt.Vertical)
        top = QSplitter(Qt.Horizontal)
        self.glw = pg.GraphicsLayoutWidget()
        self.glw.setMinimumHeight(110)
        self.kl_plot = self.glw.addPlot(row=0, col=0)
        self.kl_plot.setLabel("left", "KL (nats)")
        self.kl_plot.getAxis("left").enableAutoSIPrefix(False)
        self.kl_plot.setLabel("bottom", "step")
        self.kl_plot.setLogMode(x=False, y=True)
        self.kl_plot.showGrid(x=True, y=True, alpha=0.25)
        self.kl_plot.setTitle("next-token KL(f32 || quant), teacher-forced", size="9pt")
        # the running top-1 agreement on the right axis (0..1), sharing the step axis
        self.agree_vb = pg.ViewBox(enableMouse=False)
        self.kl_plot.showAxis("right")
        self.kl_plot.scene().addItem(self.agree_vb)
        right = self.kl_plot.getAxis("right")
        right.linkToView(self.agree_vb)
        right.setLabel("running top-1", color=f"rgb{AGREE_COLOR}")
        right.setPen(pg.mkPen(AGREE_COLOR))
        right.setTextPen(pg.mkPen(AGREE_COLOR))
        right.setLogMode(False, False)  # the KL axis is logarithmic, the agreement is not
        self.agree_vb.setXLink(self.kl_plot)
        self.agree_vb.setYRange(0, 1.05, padding=0)
        self.agree_curve = pg.PlotCurveItem(pen=pg.mkPen(AGREE_COLOR, width=1.6, style=Qt.DashLine))
        self.agree_vb.addItem(self.agree_curve)
        self.kl_plot.vb.sigResized.connect(self._sync_views)
        self.kl_curve = self.kl_plot.plot(pen=pg.mkPen(REF_COLOR, width=1.2), symbol="o", symbolSize=7)
        top.addWidget(self.glw)
        gbox = QWidget()
        gl = QVBoxLayout(gbox)
        gl.setContentsMargins(0, 0, 0, 0)
        gl.setSpacing(1)
        self.grid_view = pg.GraphicsLayoutWidget()
        self.grid_view.setMinimumHeight(60)
        self.grid_plot = self.grid_view.addPlot()
        self.grid_plot.setMouseEnabled(x=False, y=False)
        self.grid_plot.setMenuEnabled(False)
        self.grid_plot.hideButtons()
        self.grid_plot.invertY(True)
        self.grid_plot.setAspectLocked(True)
        self.grid_plot.hideAxis("bottom")
        self.grid_plot.setTitle("block pools", size="9pt")
        self.grid_img = pg.ImageItem(axisOrder="row-major")
        self.grid_plot.addItem(self.grid_img)
        self._new_rects: list = []
        gl.addWidget(self.grid_view, 1)
        self.grid_label = QLabel("")
        self.grid_label.setWordWrap(True)
        self.grid_label.setStyleSheet("font-size: 8pt; color: #44505c;")
        self.grid_label.setSizePolicy(QSizePolicy.Ignored, QSizePolicy.Preferred)
        gl.addWidget(self.grid_label)
        top.addWidget(gbox)
        top.setStretchFactor(0, 3)
        top.setStretchFactor(1, 2)
        outer.addWidget(top)

        self.tabs = QTabWidget()
        texts = QSplitter(Qt.Horizontal)
        self.base_title = QLabel("<b>f32 cache</b>")
        self.quant_title = QLabel("<b>quantised cache</b>")
        self.base_text = QTextBrowser()
        self.quant_text = QTextBrowser()
        for title, box in ((self.base_title, self.base_text), (self.quant_title, self.quant_text)):
            w = QWidget()
            v = QVBoxLayout(w)
            v.setContentsMargins(0, 0, 0, 0)
            v.setSpacing(1)
            title.setTextFormat(Qt.RichText)
            title.setSizePolicy(QSizePolicy.Ignored, QSizePolicy.Preferred)
            v.addWidget(title)
            box.setOpenLinks(False)
            v.addWidget(box, 1)
            texts.addWidget(w)
        self.tabs.addTab(texts, "Texts")
        self.tabs.addTab(self._build_cache_view(), "Cache view")
        self.tabs.setTabToolTip(1, "Per-position K / V scales of the quantised cache and the last step's attention "
                                   "weights, for one layer and KV head, updated after every step")
        self.table = QTableWidget()
        self.table.setEditTriggers(QAbstractItemView.NoEditTriggers)
        self.table.verticalHeader().setVisible(False)
        self.table.verticalHeader().setDefaultSectionSize(19)
        self.tabs.addTab(self.table, "Steps")
        outer.addWidget(self.tabs)
        outer.setStretchFactor(0, 1)
        outer.setStretchFactor(1, 1)
        self.view_read.connect(self._on_view_read)
        self.body.addWidget(outer, 1)
        self.info.setText("not started")

    def _build_cache_view(self) -> QWidget:
        """Layer / KV head / query head selectors over two plots: per-position scales, attention weights."""
        box = QWidget()
        v = QVBoxLayout(box)
        v.setContentsMargins(0, 0, 0, 0)
        v.setSpacing(1)
        row = QHBoxLayout()
        row.setSpacing(4)
        self.layer_spin = QSpinBox()
        self.layer_spin.setPrefix("layer ")
        self.layer_spin.setRange(0, 0)
        self.layer_spin.setToolTip("Layer whose quantised cache is shown (default: a middle layer). While the "
                                   "decode runs, the decoder reads it after every step.")
        self.kv_spin = QSpinBox()
        self.kv_spin.setPrefix("KV head ")
        self.kv_spin.setRange(0, 0)
        self.kv_spin.setToolTip("KV head whose per-position scales are shown")
        self.qhead = QComboBox()
        self.qhead.setToolTip("Attention weights: the mean over the query heads that read this KV head, or one of them")
        self.qhead.setSizeAdjustPolicy(QComboBox.AdjustToContents)
        for w in (self.layer_spin, self.kv_spin, self.qhead):
            row.addWidget(w)
        self.view_note = ElidedLabel("")
        self.view_note.setStyleSheet("font-size: 8pt; color: #44505c;")
        row.addWidget(self.view_note, 1)
        v.addLayout(row)
        self.view_glw = pg.GraphicsLayoutWidget()
        self.view_glw.setMinimumHeight(110)
        sp = self.scale_plot = self.view_glw.addPlot(row=0, col=0)
        sp.setLabel("bottom", "position")
        sp.showGrid(x=False, y=True, alpha=0.25)
        sp.getAxis("left").enableAutoSIPrefix(False)
        self.k_scale_curve = sp.plot(pen=pg.mkPen(K_COLOR, width=1.4), connect="finite")
        self.k_new = pg.ScatterPlotItem(size=7, brush=pg.mkBrush(K_COLOR), pen=None)
        sp.addItem(self.k_new)
        # V on a right axis of its own (V scales are often several times the K ones), as in the Scales panel
        self.v_scale_vb = pg.ViewBox(enableMouse=False)
        sp.showAxis("right")
        sp.scene().addItem(self.v_scale_vb)
        ra = sp.getAxis("right")
        ra.linkToView(self.v_scale_vb)
        ra.enableAutoSIPrefix(False)
        self.v_scale_vb.setXLink(sp)
        self.v_scale_curve = pg.PlotDataItem(pen=pg.mkPen(V_COLOR, width=1.4), connect="finite")
        self.v_new = pg.ScatterPlotItem(size=7, brush=pg.mkBrush(V_COLOR), pen=None)
        self.v_scale_vb.addItem(self.v_scale_curve)
        self.v_scale_vb.addItem(self.v_new)
        sp.vb.sigResized.connect(self._sync_scale_views)
        self.prompt_line = pg.InfiniteLine(angle=90, pen=pg.mkPen((120, 120, 120), width=1, style=Qt.DashLine))
        self.prompt_line.setToolTip("positions right of the line were written by decode steps, left by the prefill")
        self.prompt_line.setVisible(False)
        sp.addItem(self.prompt_line, ignoreBounds=True)
        self._block_lines: list = []
        self.scale_empty = pg.TextItem("", color=(110, 110, 110), anchor=(0.5, 0.5))
        self.scale_empty.setVisible(False)
        sp.addItem(self.scale_empty, ignoreBounds=True)
        sp.setToolTip("Per-position K (left axis) and V (right axis) scales of the quantised cache. Dotted: block "
                      "boundaries; dashed: the first position written by a decode step (left of it: the prefill); "
                      "dots: the position written by the last step.")
        wp = self.weights_plot = self.view_glw.addPlot(row=0, col=1)
        wp.setLabel("bottom", "position")
        wp.setLabel("left", "attention weight")
        wp.setLogMode(x=False, y=True)
        wp.showGrid(x=False, y=True, alpha=0.25)
        wp.getAxis("left").enableAutoSIPrefix(False)
        # f32 as a wide grey band under the quantised line: where they agree the orange runs inside the band
        self.w_base_curve = wp.plot(pen=pg.mkPen(W_BASE_COLOR, width=4))
        self.w_quant_curve = wp.plot(pen=pg.mkPen(Q_COLOR, width=1.3))
        self.view_glw.ci.layout.setColumnStretchFactor(0, 1)
        self.view_glw.ci.layout.setColumnStretchFactor(1, 1)
        v.addWidget(self.view_glw, 1)
        self.layer_spin.valueChanged.connect(self._selection_changed)
        self.kv_spin.valueChanged.connect(self._selection_changed)
        self.qhead.currentIndexChanged.connect(lambda *_: self._draw_view())
        self._fill_qheads(9, 3)
        self._draw_view()
        return box

    # ------------------------------------------------------------- controls
    def _method_changed(self, *args) -> None:
        from kvviz.live.cache import cache_kind

        key = self.method.currentData()
        self.options.build(key)
        try:
            kind = cache_kind(key)
        except Exception:  # noqa: BLE001
            kind = "requant"
        note = {"native": "incremental paged cache (writer + paged decode on the GPU)",
                "method": "the method's own live cache"}.get(kind, "re-quantises the whole sequence every step (slow)")
        self.method.setToolTip(f"Quantisation method of the live cache: {note}")
        self.cache_note.setText("" if kind == "native" else note)
        self.options_row.setVisible(bool(self.options.editors) or kind != "native")

    def _browse(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "llama GGUF model", "", GGUF_FILTER)
        if path:
            self.model_path.setText(path)

    def _same_as_workload(self) -> None:
        wl = getattr(self.host, "workload", None)
        if wl is not None:
            self.model_path.setText(wl.model_path.text().strip())

    def request(self) -> dict:
        """What the window hands to the decoder."""
        return {
            "model_path": self.model_path.text().strip(),
            "prompt": self.prompt.toPlainText(),
            "max_new": int(self.max_new_spin.value()),
            "method": self.method.currentData() or self.method.currentText(),
            "method_options": self.options.options(),
            "policy": self.policy.currentText(),
            "block_size": int(self.block_spin.value()),
        }

    def set_config(self, method: str | None = None, max_new: int | None = None, prompt: str | None = None,
                   block_size: int | None = None, policy: str | None = None, model_path: str | None = None) -> None:
        if method is not None:
            i = self.method.findData(method)
            if i >= 0:
                self.method.setCurrentIndex(i)
        if max_new is not None:
            self.max_new_spin.setValue(int(max_new))
        if prompt is not None:
            self.prompt.setPlainText(prompt)
        if block_size is not None:
            self.block_spin.setValue(int(block_size))
        if policy is not None:
            self.policy.setCurrentText(policy)
        if model_path is not None:
            self.model_path.setText(model_path)

    def set_running(self, on: bool) -> None:
        self.running = on
        self.start_button.setEnabled(not on)
        self.stop_button.setEnabled(on)

    # ------------------------------------------------------------ run events
    def begin(self, args: dict) -> None:
        self.steps = []
        self.max_new = int(args["max_new"])
        self.tables_now, self.prev_tables = {}, {}
        self.num_blocks, self.context_len = 0, 0
        self.block_size = int(args["block_size"])
        self.policy_used = str(args.get("policy", ""))
        self.prompt_strs = []
        self.summary, self.describe, self.timings = {}, {}, {}
        self.step_table = None
        self.state = "running"
        self.set_running(True)
        self.kl_curve.setData([], [])
        self.agree_curve.setData([], [])
        self.grid_img.clear()
        self._clear_new_rects()
        self.grid_label.setText("")
        self.table.clear()
        self.table.setRowCount(0)
        self.base_text.clear()
        self.quant_text.clear()
        self.view, self.view_table, self._watch, self._decoder, self._reading = None, None, None, None, None
        self._draw_view()
        self.status.setText(f"Loading the model and prefilling the prompt ({args['method']}, "
                            f"{self.max_new} new tokens) ...")
        self.info.setText("starting ...")

    def set_model(self, cfg) -> None:
        self.model_cfg = cfg
        self._set_view_shape(cfg.n_layers, cfg.n_heads, cfg.n_kv_heads)
        self.status.setText(f"{describe_model(cfg)} - prefilling the prompt ...")

    def set_prefilled(self, info: dict) -> None:
        self.num_blocks = int(info["num_blocks"])
        self.block_size = int(info["block_size"])
        self.context_len = int(info["context_len"])
        self.prompt_strs = list(info["prompt_strs"])
        self.describe = dict(info.get("describe", {}))
        self.timings["prefill_s"] = info.get("prefill_s")
        self.prev_tables = {}
        self.tables_now = {k: list(v) for k, v in info["tables"].items() if v}
        self._draw_grid(highlight=False)
        self._draw_texts()
        q = self.describe.get("quant_cache", "")
        self.status.setText(f"Prompt of {len(self.prompt_strs)} tokens prefilled in {info.get('prefill_s', 0):.2f} s; "
                            f"decoding {self.max_new} tokens. Quantised cache: {html.escape(str(q))}")

    def add_step(self, st) -> None:
        self.steps.append(st)
        self.context_len = int(st.context_len)
        self.prev_tables = self.tables_now
        self.tables_now = {"f32": list(st.base_blocks), "quant": list(st.blocks)}
        if st.free_forked and st.free_blocks:
            self.tables_now["free"] = list(st.free_blocks)
        self._draw_plots()
        self._draw_grid(highlight=True, quant_new=list(st.new_blocks))
        self._draw_texts()
        self._fill_table()
        view = getattr(st, "view", None)  # read once: the worker drops it from this step at the next one
        if view is not None:
            self._take_view(view)
        self.summary = summarize_live(self.steps, self.texts())
        self._show_summary(final=False)

    def finish(self, result: dict | None = None, cancelled: bool = False, error: BaseException | None = None,
               why: str = "") -> None:
        self.set_running(False)
        if result is not None:
            self.describe = dict(result.get("describe", self.describe))
            self.timings.update(result.get("timings", {}))
        self.summary = summarize_live(self.steps, self.texts()) if self.steps else {}
        if error is not None:
            self.state = "failed"
            hint = getattr(error, "hint", "")
            self.status.setText(f"<span style='color:#8a1c13'><b>Live decode failed:</b> {html.escape(str(error))}"
                                + (f" - {html.escape(hint)}" if hint else "") + "</span>")
            self.info.setText(f"failed after {len(self.steps)} step(s)")
            return
        self.state = "stopped" if cancelled else "done"
        self._show_summary(final=True, why=why)

    # ------------------------------------------------------------ cache view
    def selection(self) -> tuple:
        """(layer, KV head) the cache view asks for."""
        return int(self.layer_spin.value()), int(self.kv_spin.value())

    def set_selection(self, layer: int, kv_head: int) -> None:
        """Select the cache view's layer and KV head (one read, not one per spin box)."""
        for w, val in ((self.layer_spin, layer), (self.kv_spin, kv_head)):
            w.blockSignals(True)
            w.setValue(int(val))
            w.blockSignals(False)
        self._selection_changed()

    def _set_view_shape(self, n_layers: int, n_heads: int, n_kv_heads: int) -> None:
        """Selector ranges of a model; a model of another shape resets them to a middle layer, KV head 0."""
        new = (n_layers, n_heads, n_kv_heads) != getattr(self, "_shape", None)
        self._shape = (n_layers, n_heads, n_kv_heads)
        for w in (self.layer_spin, self.kv_spin):
            w.blockSignals(True)
        self.layer_spin.setRange(0, max(n_layers - 1, 0))
        self.kv_spin.setRange(0, max(n_kv_heads - 1, 0))
        if new:
            self.layer_spin.setValue(n_layers // 2)
            self.kv_spin.setValue(0)
        for w in (self.layer_spin, self.kv_spin):
            w.blockSignals(False)
        self._fill_qheads(n_heads, n_kv_heads)

    def _fill_qheads(self, n_heads: int, n_kv_heads: int) -> None:
        """Query-head choices of the selected KV head: their mean (data -1), or one of them (its index in the group)."""
        self._heads = (n_heads, n_kv_heads)
        g = max(n_heads // max(n_kv_heads, 1), 1)
        h0 = self.kv_spin.value() * g
        keep = self.qhead.currentData()
        self.qhead.blockSignals(True)
        self.qhead.clear()
        self.qhead.addItem(f"mean of q heads {h0}-{h0 + g - 1}" if g > 1 else f"q head {h0}", -1)
        if g > 1:
            for i in range(g):
                self.qhead.addItem(f"q head {h0 + i}", i)
        i = self.qhead.findData(keep)
        self.qhead.setCurrentIndex(max(i, 0))
        self.qhead.blockSignals(False)

    def _selection_changed(self, *args) -> None:
        self._fill_qheads(*self._heads)
        w = self._watch
        if w is not None:
            sel = self.selection()
            if self.running:
                w.select(*sel)  # the decoder reads it after its next step
            elif self.view is None or (self.view.get("layer"), self.view.get("kv_head")) != sel:
                self._read_view(w, sel)
        self._draw_view()

    def _read_view(self, watch, sel: tuple) -> None:
        """Read the cache view of `sel` from the (finished or stopped) decoder in the window's worker: all
        GPU work stays on that thread. The result comes back through `view_read`."""
        self._reading = sel

        def job(progress=None, cancel=None):
            try:
                v = watch.read(*sel)
            except Exception as exc:  # noqa: BLE001 - shown in the view, not as a failed computation
                v = {"error": f"{type(exc).__name__}: {exc}", "watch": watch, "layer": sel[0], "kv_head": sel[1]}
            self.view_read.emit(watch, v)

        runner = getattr(self.host, "runner", None)
        if runner is None:  # a panel without a window: no worker, the decoder runs on this thread
            job()
            return
        runner.submit("live_view", job, f"Live decode: reading the cache view of layer {sel[0]}, KV head {sel[1]}")

    def _on_view_read(self, watch, v) -> None:
        if watch is not self._watch:
            return  # a read of an older run
        if self._reading == (v.get("layer"), v.get("kv_head")):
            self._reading = None
        self.view = v
        self._draw_view()
        self.view_ready.emit(v)
        status = getattr(self.host, "status_label", None)
        if status is not None:
            status.setText(f"Live decode: cache view of layer {v.get('layer')}, KV head {v.get('kv_head')}")

    def _take_view(self, v: dict) -> None:
        w = v.get("watch")
        if w is not None:
            self._watch = w
            self._decoder = w.decoder  # keeps it (and its caches) for reads after a stopped run
            if self.running and w.selection != self.selection():
                w.select(*self.selection())  # a selection made before the decoder existed
        self.view = v
        self._draw_view()
        self.view_ready.emit(v)

    def _sync_scale_views(self, *args) -> None:
        self.v_scale_vb.setGeometry(self.scale_plot.vb.sceneBoundingRect())
        self.v_scale_vb.linkedViewChanged(self.scale_plot.vb, self.v_scale_vb.XAxis)

    def _set_block_lines(self, n: int, bs: int) -> None:
        """Dotted lines at the block boundaries of positions 0..n-1 (none past MAX_BLOCK_LINES blocks)."""
        xs = [b * bs - 0.5 for b in range(1, -(-n // bs))] if bs > 0 and -(-n // bs) <= MAX_BLOCK_LINES else []
        pen = pg.mkPen((175, 175, 175), width=1, style=Qt.DotLine)
        while len(self._block_lines) < len(xs):
            ln = pg.InfiniteLine(angle=90, pen=pen)
            self.scale_plot.addItem(ln, ignoreBounds=True)
            self._block_lines.append(ln)
        for i, ln in enumerate(self._block_lines):
            ln.setVisible(i < len(xs))
            if i < len(xs):
                ln.setPos(xs[i])

    def _draw_view(self) -> None:
        v = self.view
        sp, wp = self.scale_plot, self.weights_plot
        items = (self.k_scale_curve, self.v_scale_curve, self.k_new, self.v_new, self.w_base_curve, self.w_quant_curve)
        pending = ""
        sel = self.selection()
        if self._reading is not None:
            pending = f" \u00b7 reading layer {self._reading[0]}, KV head {self._reading[1]} \u2026"
        elif v is not None and self._watch is not None and (v.get("layer"), v.get("kv_head")) != sel:
            pending = f" \u00b7 layer {sel[0]}, KV head {sel[1]} from the next step" if self.running else ""
        if v is None or "error" in v:
            for it in items:
                it.setData([], [])
            self.prompt_line.setVisible(False)
            self.scale_empty.setVisible(False)
            self._set_block_lines(0, 1)
            _title(sp, "per-position K / V scales")
            sp.setLabel("left", "K scale", color=_hex(K_COLOR))
            sp.getAxis("right").setLabel("V scale", color=_hex(V_COLOR))
            _title(wp, "attention, last step")
            self.view_table = None
            if v is None:
                self.view_note.setText("shown after the first step: the decoder reads the selected layer after "
                                       "every step" + pending)
            else:
                self.view_note.setText(f"cannot show layer {v.get('layer')}, KV head {v.get('kv_head')}: {v['error']}")
            return
        layer, kvh, n, bs = int(v["layer"]), int(v["kv_head"]), int(v["context_len"]), int(v["block_size"])
        x = np.arange(n, dtype=np.float64)
        sc = v.get("scales")
        method = v.get("method") or "quantised"
        k = vv = None
        empty = ""
        if sc is None:
            for it in items[:4]:
                it.setData([], [])
            sp.setLabel("left", "K scale", color=_hex(K_COLOR))
            sp.getAxis("right").setLabel("V scale", color=_hex(V_COLOR))
            what = "this cache cannot show its per-position scales"
            empty = "no per-position scales from this cache"
        else:
            k, vv = np.asarray(sc.k, np.float64), np.asarray(sc.v, np.float64)
            for curve, new, a in ((self.k_scale_curve, self.k_new, k), (self.v_scale_curve, self.v_new, vv)):
                if np.isfinite(a).any():
                    curve.setData(x, a)
                else:
                    curve.setData([], [])
                if n and np.isfinite(a[-1]):
                    new.setData(x[-1:], a[-1:])  # the newest position: written by this step
                else:
                    new.setData([], [])
            sp.setLabel("left", sc.k_label, color=_hex(K_COLOR))
            sp.getAxis("right").setLabel(sc.v_label, color=_hex(V_COLOR))
            what = sc.note
            if n and not np.isfinite(k).any() and not np.isfinite(vv).any():
                empty = "no scales stored for these positions yet"
        self.scale_empty.setText(empty)
        self.scale_empty.setVisible(bool(empty))
        if empty:
            self.scale_empty.setPos((n - 1) / 2, 0.5)
        _title(sp, f"scales \u00b7 layer {layer} \u00b7 KV head {kvh} \u00b7 {n} tokens")
        pl = int(v.get("prompt_len", 0))
        self.prompt_line.setVisible(pl >= 2)
        self.prompt_line.setPos(pl - 1.5)
        self._set_block_lines(n, bs)
        self._sync_scale_views()
        sp.setXRange(-0.5, max(n, 1) - 0.5, padding=0.02)
        if empty:
            sp.setYRange(0, 1, padding=0)
        else:
            sp.enableAutoRange(axis="y")
        self.v_scale_vb.enableAutoRange(axis="y")

        # attention weights of the last step over positions: the f32 cache's and the quantised cache's
        heads = list(v.get("q_heads") or [])
        i = self.qhead.currentData()
        i = -1 if i is None or i >= len(heads) else int(i)
        qlab = (f"mean of q heads {heads[0]}-{heads[-1]}" if len(heads) > 1 else f"q head {heads[0]}") if i < 0 \
            else f"q head {heads[i]}"

        def pick(w):
            if w is None or not len(w):
                return None
            a = np.asarray(w, np.float64)
            return a.mean(0) if i < 0 else a[i]

        wb, wq = pick(v.get("weights_base")), pick(v.get("weights_quant"))
        for curve, w in ((self.w_base_curve, wb), (self.w_quant_curve, wq)):
            if w is not None:
                curve.setData(x[: len(w)], np.maximum(w, 1e-12))  # log axis
            else:
                curve.setData([], [])
        f32 = f"<span style='color:{_hex(W_BASE_COLOR)}'><b>f32</b></span>"
        qn = f"<span style='color:{_hex(Q_COLOR)}'><b>{html.escape(str(method))}</b></span>"
        if wb is not None and wq is not None and len(wb) == len(wq):
            _title(wp, f"attention: {f32} vs {qn} \u00b7 \u03a3|\u0394w| {np.abs(wq - wb).sum():.2g}")
        elif wq is not None:
            _title(wp, f"attention: {qn} (no f32 paged cache)")
        else:
            _title(wp, "attention: not read")
        wp.setToolTip(f"Attention weights of the last step over positions ({qlab}), layer {layer}, through the "
                      f"f32 paged cache (grey band) and the {method} cache (orange)")
        wp.setXRange(-0.5, max(n, 1) - 0.5, padding=0.02)
        wp.enableAutoRange(axis="y")
        secs = v.get("seconds")
        self.view_note.setText(what + (f" \u00b7 read in {1e3 * secs:.0f} ms" if secs is not None else "") + pending)
        self._fill_view_table(v, k, vv, wb, wq)

    def _fill_view_table(self, v, k, vv, wb, wq) -> None:
        n, bs = int(v["context_len"]), int(v["block_size"])
        sc = v.get("scales")
        kname = _slug(sc.k_label) if sc is not None else "k_scale"
        vname = _slug(sc.v_label) if sc is not None else "v_scale"
        tab = Table("cache_view", ["position", "block", kname, vname, "w_f32", "w_quant"],
                    title=f"cache view: layer {v['layer']}, KV head {v['kv_head']}")
        blocks = list(v.get("blocks") or [])
        for p in range(n):
            tab.rows.append([p, blocks[p // bs] if p // bs < len(blocks) else None,
                             *(float(a[p]) if a is not None and p < len(a) else None for a in (k, vv, wb, wq))])
        self.view_table = tab

    # ----------------------------------------------------------------- views
    def texts(self) -> dict:
        base = "".join(s.base_str for s in self.steps)
        free = "".join((s.free_str if s.free_str is not None else s.quant_str) for s in self.steps)
        return {"prompt": "".join(self.prompt_strs), "baseline": base, "quant_free": free,
                "quant_teacher_forced": "".join(s.quant_str for s in self.steps)}

    def divergence(self) -> int | None:
        for i, s in enumerate(self.steps):
            f = s.free_token if s.free_token is not None else s.quant_token
            if f != s.base_token:
                return i
        return None

    def _draw_plots(self) -> None:
        n = len(self.steps)
        x = np.arange(n, dtype=np.float64)
        kl = np.array([s.kl for s in self.steps], np.float64)
        agree = np.array([bool(s.top1_agree) for s in self.steps])
        brushes = [pg.mkBrush(*(AGREE_COLOR if a else DISAGREE_COLOR)) for a in agree]
        self.kl_curve.setData(x, np.maximum(kl, 1e-12), symbolBrush=brushes, symbolPen=None)
        self.agree_curve.setData(x, np.cumsum(agree) / np.arange(1, n + 1))
        self.agree_vb.setYRange(0, 1.05, padding=0)
        self._sync_views()
        self.kl_plot.setXRange(-0.5, max(self.max_new, n) - 0.5, padding=0.02)
        self.kl_plot.enableAutoRange(axis="y")

    def _sync_views(self, *args) -> None:
        self.agree_vb.setGeometry(self.kl_plot.vb.sceneBoundingRect())
        self.agree_vb.linkedViewChanged(self.kl_plot.vb, self.agree_vb.XAxis)

    def _grid_columns(self, n: int, bands: int, gap: int) -> int:
        """Columns of each pool's grid that make the cells largest in the view (at most 64)."""
        vw, vh = max(self.grid_view.width() - 60, 50), max(self.grid_view.height() - 30, 30)
        best, best_scale = min(n, 32), 0.0
        for cols in range(1, min(n, 64) + 1):
            rows = -(-n // cols)
            w, h = cols * CELL, bands * (rows * CELL + gap)
            scale = min(vw / w, vh / h)
            if scale > best_scale * 1.05:  # prefer fewer rows on a near tie
                best, best_scale = cols, scale
        return best

    def _clear_new_rects(self) -> None:
        for r in self._new_rects:
            self.grid_plot.removeItem(r)
        self._new_rects = []

    def _draw_grid(self, highlight: bool, quant_new: list | None = None) -> None:
        self._clear_new_rects()
        n = self.num_blocks
        if n <= 0:
            return
        gap = CELL // 2
        paths = [(k, lab, c) for k, lab, c in PATHS if k in self.tables_now]
        cols = self._grid_columns(n, len(paths), gap)
        rows = -(-n // cols)
        band_h = rows * CELL
        img = np.full((len(paths) * (band_h + gap) - gap, cols * CELL, 3), 255, np.uint8)
        ticks = []
        self.grid_cells = {}
        bs, ctx = self.block_size, self.context_len
        for i, (key, label, color) in enumerate(paths):
            blocks = self.tables_now[key]
            owner = np.full(n, -1, np.int64)
            fill = np.zeros(n, np.int64)
            for li, b in enumerate(blocks):
                if 0 <= b < n:
                    owner[b] = color
                    fill[b] = max(0, min(bs, ctx - li * bs))
            y0 = i * (band_h + gap)
            img[y0:y0 + band_h] = pool_image(owner, fill, bs, cols)
            self.grid_cells[key] = int((owner >= 0).sum())
            ticks.append((y0 + band_h / 2, label))
            if highlight:
                new = set(quant_new or []) if key == "quant" else set(blocks) - set(self.prev_tables.get(key, []))
                for b in sorted(new):
                    r, c = divmod(int(b), cols)
                    rect = QGraphicsRectItem(c * CELL - 0.5, y0 + r * CELL - 0.5, CELL, CELL)
                    pen = QPen(QColor(0, 0, 0))
                    pen.setWidthF(2.0)
                    pen.setCosmetic(True)
                    rect.setPen(pen)
                    self.grid_plot.addItem(rect)
                    self._new_rects.append(rect)
        self.grid_img.setImage(img, levels=(0, 255), autoLevels=False)
        self.grid_img.setRect(QRectF(0, 0, img.shape[1], img.shape[0]))
        self.grid_plot.getAxis("left").setTicks([ticks, []])
        self.grid_plot.setRange(QRectF(0, 0, img.shape[1], img.shape[0]), padding=0.03)
        q = self.tables_now.get("quant", [])
        new = ", ".join(str(b) for b in (quant_new or [])) if highlight else ""
        self.grid_label.setText(
            f"{n} blocks x {bs} tokens per pool ({self.policy_used}),"
            f" {ctx} tokens cached. quant block table: {q}" + (f"; new this step: {new}" if new else ""))

    def _draw_texts(self) -> None:
        prompt = "".join(self.prompt_strs)
        tail = prompt if len(prompt) <= 600 else "\u2026" + prompt[-600:]
        div = self.divergence()
        base = [s.base_str for s in self.steps]
        free = [(s.free_str if s.free_str is not None else s.quant_str) for s in self.steps]
        self.base_text.setHtml(text_html(tail, base, div, "#dfe8f5"))
        self.quant_text.setHtml(text_html(tail, free, div, "#fbd9d3"))
        for box in (self.base_text, self.quant_text):
            sb = box.verticalScrollBar()
            sb.setValue(sb.maximum())
        method = self.describe.get("method") or self.method.currentData()
        self.base_title.setText("<b>f32 paged cache</b> (greedy)")
        if not self.steps:
            state = ""
        elif div is None:
            state = " <span style='color:#2c7a2c'>- same text so far</span>"
        else:
            state = f" <span style='color:#c0392b'>- \u25b8 diverges at step {div}</span>"
        self.quant_title.setText(f"<b>{html.escape(str(method))} cache</b> (free-running){state}")

    def _fill_table(self) -> None:
        tab = Table("steps", list(STEP_COLUMNS), title="live decode: one row per step")
        for s in self.steps:
            tab.rows.append([s.index, s.position, s.fed_token, s.fed_str, s.base_token, s.base_str, s.quant_token,
                             s.quant_str, float(s.kl), bool(s.top1_agree), float(s.nll_delta), float(s.base_p),
                             float(s.quant_p_of_base), s.free_token, s.free_str, bool(s.free_forked),
                             int(s.context_len), " ".join(str(b) for b in s.blocks),
                             " ".join(str(b) for b in s.new_blocks), float(sum(s.seconds.values()))])
        self.step_table = tab
        t = self.table
        shown = ["step", "fed_str", "f32_str", "quant_str", "kl", "top1_agree", "p_f32", "p_quant_of_f32",
                 "free_str", "context_len", "new_blocks", "step_s"]
        idx = [tab.columns.index(c) for c in shown]
        t.setRowCount(len(tab.rows))
        t.setColumnCount(len(shown))
        t.setHorizontalHeaderLabels(shown)
        for i, row in enumerate(tab.rows):
            for j, k in enumerate(idx):
                v = row[k]
                s = f"{v:.4g}" if isinstance(v, float) else repr(v) if isinstance(v, str) else str(v)
                it = QTableWidgetItem(s)
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    it.setTextAlignment(Qt.AlignRight | Qt.AlignVCenter)
                if shown[j] == "top1_agree" and not v:
                    it.setForeground(QColor(*DISAGREE_COLOR))
                t.setItem(i, j, it)
        t.resizeColumnsToContents()
        t.scrollToBottom()

    def _show_summary(self, final: bool, why: str = "") -> None:
        sm = self.summary
        n = len(self.steps)
        if not n:
            what = "Stopped before the first step." if self.state == "stopped" else "No steps."
            self.status.setText(what + (f" ({why})" if why else ""))
            self.info.setText(what)
            return
        agree = sum(bool(s.top1_agree) for s in self.steps)
        div = sm.get("free_first_divergence", None)
        div_s = "same text as f32" if div is None else f"free run diverges at step {div}"
        secs = [sum(s.seconds.values()) for s in self.steps]
        head = {"running": f"Step {n}/{self.max_new}", "done": f"Done: {n} steps",
                "stopped": f"Stopped after {n}/{self.max_new} steps"}.get(self.state, f"{n} steps")
        self.info.setText(f"{head}: KL mean {sm['kl_mean']:.3g}, max {sm['kl_max']:.3g}; top-1 {agree}/{n}")
        line = (f"<b>{head}</b> \u00b7 KL mean <b>{sm['kl_mean']:.3g}</b>, max <b>{sm['kl_max']:.3g}</b> "
                f"(step {sm['kl_max_step']}) \u00b7 top-1 <b>{100 * sm['top1_agree_rate']:.0f}%</b> "
                f"({agree}/{n}) \u00b7 {div_s} \u00b7 {np.mean(secs):.2f} s/step")
        if why:
            line += f" &nbsp; <i>({html.escape(why)})</i>"
        self.status.setText(line)

    # ----------------------------------------------------------------- export
    def tables(self) -> list:
        if self.step_table is None:
            return []
        return [self.step_table] + ([self.view_table] if self.view_table is not None else [])

    def to_json(self) -> dict:
        return clean({
            "state": self.state,
            "config": {**self.describe, "max_new": self.max_new},
            "model": describe_model(self.model_cfg) if self.model_cfg is not None else "",
            "timings": self.timings,
            "summary": summarize_live(self.steps, self.texts()) if self.steps else {},
            "steps": [s.to_json() for s in self.steps],
        })

    def export_json(self, path: str) -> str:
        if not self.steps:
            raise ValueError(f"{self.title}: nothing to export yet")
        with open(path, "w") as fh:
            json.dump(self.to_json(), fh, indent=1)
        return str(path)

    def export(self, fmt: str, path: str) -> list:
        if fmt == "json":
            return [self.export_json(path)]
        return super().export(fmt, path)

    def _export_clicked(self, fmt: str) -> None:
        host = self.host
        if host is None:
            return
        if fmt in ("csv", "json") and not self.steps:
            host.status_label.setText("Live decode: nothing to export yet")
            return
        filt = {"png": "PNG image (*.png)", "svg": "SVG image (*.svg)", "csv": "CSV table (*.csv)",
                "json": "JSON (*.json)"}[fmt]
        path = host.ask_save_path(f"Export {self.title} as {fmt.upper()}", f"kvviz-live.{fmt}", filt)
        if not path:
            return
        try:
            out = self.export(fmt, path)
        except (OSError, ValueError) as exc:
            host.show_error("Export", exc)
            return
        host.status_label.setText(f"Wrote {', '.join(out)}")
