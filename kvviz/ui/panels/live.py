"""Live decode panel: a real model (SmolLM2-135M or a GGUF of an architecture kvviz runs) decoded token by token through
paged GPU KV caches, f32 against a quantisation method (kvviz.live.decode.LiveDecoder).

A view over the run model kvviz.live.run.LiveRun (Qt-free: the config, the steps, the pools, the
summary, the cache view's state, the JSON export). The window runs the decoder in its worker thread
and hands every `LiveStep` to `add_step` through a queued signal, so the panel fills while the model runs:
  - the per-step KL(p_f32 || p_quant) of the next-token distribution (teacher-forced: both caches are
    fed the f32 path's tokens), red where the two greedy picks differ, and the running top-1 agreement;
  - the two generated texts side by side: the f32 cache's and the quantised cache's own free-running
    continuation, with the point where the quantised text leaves the f32 one marked;
  - the block pools of the paged caches (kvviz.ui.widgets.pool_grid);
  - the cache view of one layer and KV head (kvviz.ui.widgets.cache_view): the decoder reads it on the
    worker after every step (LiveDecoder.watch) and it arrives with the step; after the run a new
    selection is read by a small worker task, asked for through `view_read_requested`.
Summary numbers (mean / max KL, top-1 rate, free-run divergence) at the end; the per-step table is
exported as CSV and, with the summary and configuration, as JSON.
"""
from __future__ import annotations

import html
import json

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QMetaMethod, Qt, Signal
from PySide6.QtGui import QColor
from PySide6.QtWidgets import (
    QAbstractItemView,
    QComboBox,
    QFileDialog,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QMenu,
    QPlainTextEdit,
    QPushButton,
    QSizePolicy,
    QSpinBox,
    QSplitter,
    QTableWidget,
    QTableWidgetItem,
    QTabWidget,
    QTextBrowser,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from kvviz.families.registry import get_method
from kvviz.live.config import DEFAULT_PROMPT, LiveConfig
from kvviz.live.run import CacheViewState, LiveRun, describe_model
from kvviz.methods.live_cache import cache_kind
from kvviz.paging import POLICIES
from kvviz.tables import clean
from kvviz.ui.layouts import FlowLayout, labelled, path_field
from kvviz.ui.panels.base import Panel, fit_current_text, keep_whole
from kvviz.ui.panels.workload import GGUF_FILTER, MODEL_PLACEHOLDER, method_choices
from kvviz.ui.style import REF_COLOR, fit_title
from kvviz.ui.widgets.axes import set_axis
from kvviz.ui.widgets.cache_view import CacheView
from kvviz.ui.widgets.hover import Hover
from kvviz.ui.widgets.options_editor import OptionsEditor
from kvviz.ui.widgets.pool_grid import PoolGrid

LIVE_FORMATS = ("png", "svg", "csv", "json")
AGREE_COLOR = (44, 160, 44)
DISAGREE_COLOR = (214, 39, 40)
SHOWN_COLUMNS = ["step", "fed_str", "f32_str", "quant_str", "kl", "top1_agree", "p_f32", "p_quant_of_f32",
                 "free_str", "context_len", "new_blocks", "step_s"]  # of kvviz.live.run.STEP_COLUMNS


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
    # a cache-view read to run on the window's worker: job(progress, cancel), label (unconnected: run here)
    view_read_requested = Signal(object, str)
    workload_model_requested = Signal()  # "Use the Workload panel's model": the window sets model_path

    def __init__(self, state=None, parent=None):
        super().__init__(state, parent)
        self.run = LiveRun()
        menu = self.export_button.menu()
        menu.addAction("JSON...", lambda: self._export_clicked("json"))
        self.export_button.setToolTip("Export the live run: PNG (2x), SVG, CSV of the per-step table (and of the cache "
                                      "view beside it), JSON (summary + steps)")
        self.body.addLayout(self._build_controls())
        self.status = QLabel("Press Start to decode the prompt through an f32 and a quantised paged cache.")
        self.status.setWordWrap(True)
        self.status.setTextFormat(Qt.RichText)
        self.status.setSizePolicy(QSizePolicy.Ignored, QSizePolicy.Preferred)
        self.body.addWidget(self.status)

        outer = QSplitter(Qt.Vertical)
        top = QSplitter(Qt.Horizontal)
        top.addWidget(self._build_kl_plot())
        self.pool_grid = PoolGrid()
        top.addWidget(self.pool_grid)
        top.setStretchFactor(0, 3)
        top.setStretchFactor(1, 2)
        outer.addWidget(top)
        self.tabs = QTabWidget()
        self.tabs.addTab(self._build_texts(), "Texts")
        self.cache_view = CacheView()
        self.cache_view.selection_changed.connect(self._selection_changed)
        self.cache_view.q_head_changed.connect(self._draw_view)
        self.tabs.addTab(self.cache_view, "Cache view")
        self.tabs.setTabToolTip(1, "Per-position K / V scales of the quantised cache and the last step's attention "
                                   "weights, for one layer and KV head, updated after every step")
        self.table = QTableWidget()
        self.table.setEditTriggers(QAbstractItemView.NoEditTriggers)
        self.table.verticalHeader().setVisible(False)
        self.table.verticalHeader().setDefaultSectionSize(19)
        self.tabs.addTab(self.table, "Steps")
        outer.addWidget(self.tabs)
        # the KL plot and the block pools above, the texts / cache view / steps below, half the room each: the
        # cache view's plots need real height
        outer.setStretchFactor(0, 1)
        outer.setStretchFactor(1, 1)
        outer.setCollapsible(0, False)
        self.tabs.setMinimumHeight(200)
        self.view_read.connect(self._on_view_read)
        self.body.addWidget(outer, 1)
        self.info.setText("not started")

    def _build_controls(self) -> QVBoxLayout:
        """Model, method, new tokens, block size, allocation, start / stop, the method's options, the prompt."""
        controls = QVBoxLayout()
        controls.setContentsMargins(0, 0, 0, 0)
        controls.setSpacing(3)
        self.model_path = QLineEdit()
        self.model_path.setPlaceholderText(MODEL_PLACEHOLDER)
        path_field(self.model_path, "A GGUF model (llama, qwen2, qwen3, gemma2, gemma3, phi3); empty: SmolLM2-135M")
        browse = QToolButton()
        browse.setText("...")
        browse.setToolTip("Choose the model")
        browse.setPopupMode(QToolButton.InstantPopup)
        bmenu = QMenu(browse)
        bmenu.addAction("Choose a GGUF model file...", self._browse)
        bmenu.addAction("Use the Workload panel's model", self.workload_model_requested)
        bmenu.addAction("Built-in SmolLM2-135M", lambda: self.model_path.setText(""))
        browse.setMenu(bmenu)
        model_box = QWidget()
        mrow = QHBoxLayout(model_box)
        mrow.setContentsMargins(0, 0, 0, 0)
        mrow.setSpacing(3)
        mrow.addWidget(QLabel("Model"))
        mrow.addWidget(self.model_path, 1)
        mrow.addWidget(browse)
        self.model_path.setMinimumWidth(self.model_path.fontMetrics().horizontalAdvance(MODEL_PLACEHOLDER) + 12)
        # the model, the method and the run's settings wrap onto more lines in a narrow dock
        row0 = FlowLayout()
        row0.addWidget(model_box, 1)  # a line of its own: the path gets the panel's width
        self.method = QComboBox()
        for key, label in method_choices():
            self.method.addItem(label, key)
            self.method.setItemData(self.method.count() - 1, key, Qt.ToolTipRole)
        self.method.setSizeAdjustPolicy(QComboBox.AdjustToMinimumContentsLengthWithIcon)
        self.method.setMinimumContentsLength(12)
        fit_current_text(self.method)  # the chosen method's name is never cut
        row0.addWidget(labelled("Method", self.method))

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
        for lab, w in (("Tokens", self.max_new_spin), ("Block", self.block_spin), ("Policy", self.policy)):
            row0.addWidget(labelled(lab, w))
        run_box = QWidget()  # Start and Stop wrap together
        rb = QHBoxLayout(run_box)
        rb.setContentsMargins(0, 0, 0, 0)
        rb.setSpacing(6)
        rb.addWidget(self.start_button)
        rb.addWidget(self.stop_button)
        row0.addWidget(run_box)
        keep_whole(row0)
        controls.addLayout(row0)
        self.options = OptionsEditor("row")
        self.cache_note = QLabel("")
        self.cache_note.setStyleSheet("color: #8a5a00; font-size: 8pt;")
        self.cache_note.setWordWrap(True)
        self.options_row = QWidget()
        orow = QVBoxLayout(self.options_row)
        orow.setContentsMargins(0, 0, 0, 0)
        orow.setSpacing(2)
        orow.addWidget(self.options)
        orow.addWidget(self.cache_note)
        controls.addWidget(self.options_row)
        self.prompt = _Prompt()
        self.prompt.setPlainText(DEFAULT_PROMPT)
        self.prompt.setTabChangesFocus(True)
        self.prompt.setToolTip("Prompt (Ctrl+Enter starts)")
        self.prompt.setFixedHeight(46)
        self.prompt.run_requested.connect(self.start_requested)
        controls.addWidget(self.prompt)
        self.method.currentIndexChanged.connect(self._method_changed)
        self._method_changed()
        return controls

    def _build_kl_plot(self) -> pg.GraphicsLayoutWidget:
        """The per-step KL (log axis) with the running top-1 agreement on a right axis (0..1)."""
        self.glw = pg.GraphicsLayoutWidget()
        # the KL plot's data at least ~100 px tall under its two-line title, over its step axis
        self.glw.setMinimumHeight(200)
        self.kl_plot = self.glw.addPlot(row=0, col=0)
        set_axis(self.kl_plot, "left", "KL, nats")
        set_axis(self.kl_plot, "bottom", "decode step")
        self.kl_plot.setLogMode(x=False, y=True)
        self.kl_hover = Hover(self.kl_plot)
        self.kl_plot.showGrid(x=True, y=True, alpha=0.25)
        fit_title(self.kl_plot, ["next-token KL(f32 || quant)", "teacher-forced"], "9pt")
        self.agree_vb = pg.ViewBox(enableMouse=False)
        self.kl_plot.showAxis("right")
        self.kl_plot.scene().addItem(self.agree_vb)
        right = self.kl_plot.getAxis("right")
        right.linkToView(self.agree_vb)
        right.setLabel("top-1", color=f"rgb{AGREE_COLOR}")  # the running top-1 agreement (short: so is the axis)
        right.setToolTip("running top-1 agreement of the quantised and f32 greedy picks")
        right.setPen(pg.mkPen(AGREE_COLOR))
        right.setTextPen(pg.mkPen(AGREE_COLOR))
        right.setLogMode(False, False)  # the KL axis is logarithmic, the agreement is not
        self.agree_vb.setXLink(self.kl_plot)
        self.agree_vb.setYRange(0, 1.05, padding=0)
        self.agree_curve = pg.PlotCurveItem(pen=pg.mkPen(AGREE_COLOR, width=1.6, style=Qt.DashLine))
        self.agree_vb.addItem(self.agree_curve)
        self.kl_plot.vb.sigResized.connect(self._sync_views)
        self.kl_curve = self.kl_plot.plot(pen=pg.mkPen(REF_COLOR, width=1.2), symbol="o", symbolSize=7)
        return self.glw

    def _build_texts(self) -> QSplitter:
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
            title.setWordWrap(True)  # "... cache (free-running) - diverges at step 3" wraps in a narrow pane
            title.setSizePolicy(QSizePolicy.Ignored, QSizePolicy.Preferred)
            v.addWidget(title)
            box.setOpenLinks(False)
            v.addWidget(box, 1)
            texts.addWidget(w)
        return texts

    # ------------------------------------------------------------- run model
    @property
    def steps(self) -> list:
        return self.run.steps

    @property
    def running(self) -> bool:
        return self.run.running

    @property
    def summary(self) -> dict:
        return self.run.summary

    @property
    def view(self) -> dict | None:
        """The LiveDecoder.cache_view drawn in the cache view."""
        return self.run.view_state.view

    def _say(self, text: str) -> None:
        if self.state is not None:
            self.state.status_message.emit(text)

    # ------------------------------------------------------------- controls
    def _method_changed(self, *args) -> None:
        key = self.method.currentData()
        self.options.build(key)
        try:
            kind = cache_kind(get_method(key))
        except Exception:  # noqa: BLE001
            kind = "requant"
        note = {"native": "incremental paged cache (writer + paged decode on the GPU)",
                "method": "the method's own live cache"}.get(kind, "re-quantises the whole sequence every step (slow)")
        self.method.setToolTip(f"Quantisation method of the live cache: {note}")
        self.cache_note.setText("" if kind == "native" else note)
        self.options_row.setVisible(bool(self.options.editors) or kind != "native")

    def _browse(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "GGUF model", "", GGUF_FILTER)
        if path:
            self.model_path.setText(path)

    def config(self) -> LiveConfig:
        """The live decode the controls describe (checked by the decoder when it starts)."""
        return LiveConfig(
            model_path=self.model_path.text().strip(),
            prompt=self.prompt.toPlainText(),
            method=self.method.currentData() or self.method.currentText(),
            method_options=self.options.options(),
            n_new=int(self.max_new_spin.value()),
            block_size=int(self.block_spin.value()),
            policy=self.policy.currentText(),
        )

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
        self.start_button.setEnabled(not on)
        self.stop_button.setEnabled(on)

    # ------------------------------------------------------------ run events
    def begin(self, cfg: LiveConfig) -> int:
        """A new run of `cfg`: the panel is cleared. Returns the run's id (LiveRun.is_current)."""
        run_id = self.run.begin(cfg)
        self.set_running(True)
        self.kl_curve.setData([], [])
        self.agree_curve.setData([], [])
        self.pool_grid.clear()
        self.table.clear()
        self.table.setRowCount(0)
        self.base_text.clear()
        self.quant_text.clear()
        self._draw_view()
        self.status.setText(f"Loading the model and prefilling the prompt ({cfg.method}, "
                            f"{self.run.max_new} new tokens) ...")
        self.info.setText("starting ...")
        return run_id

    def set_model(self, cfg) -> None:
        self.run.set_model(cfg)
        self.cache_view.set_shape(cfg.n_layers, cfg.n_heads, cfg.n_kv_heads)
        self.status.setText(f"{describe_model(cfg)} - prefilling the prompt ...")

    def set_prefilled(self, info: dict) -> None:
        self.run.set_prefilled(info)
        self._draw_grid(highlight=False)
        self._draw_texts()
        q = self.run.describe.get("quant_cache", "")
        self.status.setText(f"Prompt of {len(self.run.prompt_strs)} tokens prefilled in {info.get('prefill_s', 0):.2f}"
                            f" s; decoding {self.run.max_new} tokens. Quantised cache: {html.escape(str(q))}")

    def add_step(self, st) -> None:
        self.run.add_step(st)
        self._draw_plots()
        self._draw_grid(highlight=True, quant_new=list(st.new_blocks))
        self._draw_texts()
        self._fill_table()
        view = getattr(st, "view", None)  # read once: the worker drops it from this step at the next one
        if view is not None:
            self._take_view(view)
        self._show_summary()

    def finish(self, result: dict | None = None, cancelled: bool = False, error: BaseException | None = None,
               why: str = "") -> None:
        self.run.finish(result, cancelled=cancelled, error=error)
        self.set_running(False)
        if error is not None:
            hint = getattr(error, "hint", "")
            self.status.setText(f"<span style='color:#8a1c13'><b>Live decode failed:</b> {html.escape(str(error))}"
                                + (f" - {html.escape(hint)}" if hint else "") + "</span>")
            self.info.setText(f"failed after {len(self.steps)} step(s)")
            return
        self._show_summary(why=why)

    # ------------------------------------------------------------ cache view
    def selection(self) -> tuple:
        """(layer, KV head) the cache view asks for."""
        return self.cache_view.selection()

    def set_selection(self, layer: int, kv_head: int) -> None:
        """Select the cache view's layer and KV head (one read, not one per spin box)."""
        self.cache_view.set_selection(layer, kv_head)

    def _selection_changed(self, *args) -> None:
        vs = self.run.view_state
        sel = self.selection()
        if vs.select(sel, self.running):
            self._read_view(vs.watch, sel)
        self._draw_view()

    def _read_view(self, watch, sel: tuple) -> None:
        """Read the cache view of `sel` from the (finished or stopped) decoder in the window's worker: all
        GPU work stays on that thread. The result comes back through `view_read`."""

        def job(progress=None, cancel=None):
            self.view_read.emit(watch, CacheViewState.read(watch, sel))

        if not self.isSignalConnected(QMetaMethod.fromSignal(self.view_read_requested)):
            job()  # a panel without a window: no worker, the decoder runs on this thread
            return
        self.view_read_requested.emit(job, f"Live decode: reading the cache view of layer {sel[0]}, KV head {sel[1]}")

    def _on_view_read(self, watch, v) -> None:
        if not self.run.view_state.accept(watch, v):
            return  # a read of an older run
        self._draw_view()
        self.view_ready.emit(v)
        self._say(f"Live decode: cache view of layer {v.get('layer')}, KV head {v.get('kv_head')}")

    def _take_view(self, v: dict) -> None:
        self.run.view_state.take(v, self.selection(), self.running)
        self._draw_view()
        self.view_ready.emit(v)

    def _draw_view(self, *args) -> None:
        vs = self.run.view_state
        self.cache_view.draw(vs.view, vs.pending(self.selection(), self.running))

    # ----------------------------------------------------------------- views
    def texts(self) -> dict:
        return self.run.texts()

    def divergence(self) -> int | None:
        return self.run.divergence()

    def _draw_plots(self) -> None:
        steps = self.steps
        n = len(steps)
        x = np.arange(n, dtype=np.float64)
        kl = np.array([s.kl for s in steps], np.float64)
        agree = np.array([bool(s.top1_agree) for s in steps])
        brushes = [pg.mkBrush(*(AGREE_COLOR if a else DISAGREE_COLOR)) for a in agree]
        self.kl_curve.setData(x, np.maximum(kl, 1e-12), symbolBrush=brushes, symbolPen=None)
        self.agree_curve.setData(x, np.cumsum(agree) / np.arange(1, n + 1))
        self.agree_vb.setYRange(0, 1.05, padding=0)
        self._sync_views()
        self.kl_plot.setXRange(-0.5, max(self.run.max_new, n) - 0.5, padding=0.02)
        self.kl_plot.enableAutoRange(axis="y")

    def _sync_views(self, *args) -> None:
        self.agree_vb.setGeometry(self.kl_plot.vb.sceneBoundingRect())
        self.agree_vb.linkedViewChanged(self.kl_plot.vb, self.agree_vb.XAxis)

    def _draw_grid(self, highlight: bool, quant_new: list | None = None) -> None:
        r = self.run
        self.pool_grid.draw(r.pool_bands(highlight, quant_new), r.num_blocks, r.block_size, r.context_len,
                            r.policy_used, highlight, quant_new)

    def _draw_texts(self) -> None:
        prompt = "".join(self.run.prompt_strs)
        tail = prompt if len(prompt) <= 600 else "\u2026" + prompt[-600:]
        div = self.divergence()
        base = [s.base_str for s in self.steps]
        free = [(s.free_str if s.free_str is not None else s.quant_str) for s in self.steps]
        self.base_text.setHtml(text_html(tail, base, div, "#dfe8f5"))
        self.quant_text.setHtml(text_html(tail, free, div, "#fbd9d3"))
        for box in (self.base_text, self.quant_text):
            sb = box.verticalScrollBar()
            sb.setValue(sb.maximum())
        method = self.run.describe.get("method") or self.method.currentData()
        self.base_title.setText("<b>f32 paged cache</b> (greedy)")
        if not self.steps:
            state = ""
        elif div is None:
            state = " <span style='color:#2c7a2c'>- same text so far</span>"
        else:
            state = f" <span style='color:#c0392b'>- \u25b8 diverges at step {div}</span>"
        self.quant_title.setText(f"<b>{html.escape(str(method))} cache</b> (free-running){state}")

    def _fill_table(self) -> None:
        tab = self.run.step_table()
        t = self.table
        idx = [tab.columns.index(c) for c in SHOWN_COLUMNS]
        t.setRowCount(len(tab.rows))
        t.setColumnCount(len(SHOWN_COLUMNS))
        t.setHorizontalHeaderLabels(SHOWN_COLUMNS)
        for i, row in enumerate(tab.rows):
            for j, k in enumerate(idx):
                v = row[k]
                s = f"{v:.4g}" if isinstance(v, float) else repr(v) if isinstance(v, str) else str(v)
                it = QTableWidgetItem(s)
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    it.setTextAlignment(Qt.AlignRight | Qt.AlignVCenter)
                if SHOWN_COLUMNS[j] == "top1_agree" and not v:
                    it.setForeground(QColor(*DISAGREE_COLOR))
                t.setItem(i, j, it)
        t.resizeColumnsToContents()
        t.scrollToBottom()

    def _show_summary(self, why: str = "") -> None:
        sm = self.summary
        n = len(self.steps)
        if not n:
            what = "Stopped before the first step." if self.run.state == "stopped" else "No steps."
            self.status.setText(what + (f" ({why})" if why else ""))
            self.info.setText(what)
            return
        agree = sum(bool(s.top1_agree) for s in self.steps)
        div = sm.get("free_first_divergence", None)
        div_s = "same text as f32" if div is None else f"free run diverges at step {div}"
        secs = [sum(s.seconds.values()) for s in self.steps]
        head = self.run.headline()
        err = sm.get("kl_err")
        kl_err = f" \u00b1 {err:.2g}" if err is not None and np.isfinite(err) else ""
        self.info.setText(f"{head}: over {n} positions, KL mean {sm['kl_mean']:.3g}{kl_err}, max {sm['kl_max']:.3g}; "
                          f"top-1 {agree}/{n}")
        line = (f"<b>{head}</b> \u00b7 {n} positions \u00b7 KL mean <b>{sm['kl_mean']:.3g}</b>{kl_err}, max "
                f"<b>{sm['kl_max']:.3g}</b> "
                f"(step {sm['kl_max_step']}) \u00b7 top-1 <b>{100 * sm['top1_agree_rate']:.0f}%</b> "
                f"({agree}/{n}) \u00b7 {div_s} \u00b7 {np.mean(secs):.2f} s/step")
        if why:
            line += f" &nbsp; <i>({html.escape(why)})</i>"
        self.status.setText(line)

    # ----------------------------------------------------------------- export
    def tables(self) -> list:
        """The per-step table and, when a view is shown, the cache view's (its query-head choice)."""
        if not self.steps:
            return []
        vs = self.run.view_state
        view = vs.table(self.cache_view.q_index(vs.view))
        return [self.run.step_table()] + ([view] if view is not None else [])

    def to_json(self) -> dict:
        return self.run.to_json()

    def export_json(self, path: str) -> str:
        if not self.steps:
            raise ValueError(f"{self.title}: nothing to export yet")

        with open(path, "w") as fh:
            json.dump(clean(self.to_json()), fh, indent=1, allow_nan=False)  # strict JSON: NaN -> null
        return str(path)

    def export(self, fmt: str, path: str) -> list:
        if fmt == "json":
            return [self.export_json(path)]
        return super().export(fmt, path)

    def _export_clicked(self, fmt: str) -> None:
        if fmt in ("csv", "json") and not self.steps:
            self._say("Live decode: nothing to export yet")
            return
        super()._export_clicked(fmt)
