"""Workload / source panel: every field of a `SessionConfig`, plus the method's own options.

Editing any field emits `changed`; the window debounces it (~300 ms) and recomputes in the worker.
`config()` turns the fields into a `SessionConfig` (raising InvalidInput for text it cannot parse).
"""
from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QCheckBox, QComboBox, QDoubleSpinBox, QFileDialog, QFormLayout, QGroupBox, QHBoxLayout, QLineEdit,
    QPushButton, QScrollArea, QSpinBox, QVBoxLayout, QWidget,
)

from kvviz.analysis import synthetic
from kvviz.analysis.session import SOURCES, SessionConfig
from kvviz.errors import InvalidInput
from kvviz.gpu.shaders import GLSL_FRONTENDS
from kvviz.paging import POLICIES


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
    from kvviz.methods import registry

    out = []
    for key, cls in registry().items():
        label = getattr(cls, "label", "")
        try:
            label = cls().label or label  # some methods name themselves from their options
        except Exception:  # noqa: BLE001
            pass
        out.append((key, label or key))
    return out


def default_options(key: str) -> dict:
    from kvviz.methods import registry

    cls = registry().get(key)
    if cls is None:
        return {}
    try:
        return dict(cls().options())
    except Exception:  # noqa: BLE001 - a method that needs arguments simply has no editable defaults
        return {}


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

    def __init__(self, host=None, parent=None):
        super().__init__(parent)
        self.host = host
        self.setObjectName("panel_workload")
        self._loading = False
        self._opt_editors: dict = {}
        self._opt_defaults: dict = {}

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
        self.source.setToolTip("synthetic: generated K/V/Q from a preset; kvfile: a K/V dump (safetensors/npz/pt)")
        f.addRow("Source", self.source)
        self.preset = QComboBox()
        self.preset.addItems(list(synthetic.PRESETS))
        self.preset.setToolTip("Synthetic workload preset (see kvviz.analysis.synthetic)")
        f.addRow("Preset", self.preset)
        file_row = QHBoxLayout()
        self.kv_file = QLineEdit()
        self.kv_file.setPlaceholderText("K/V dump file")
        browse = QPushButton("...")
        browse.setFixedWidth(28)
        browse.clicked.connect(self._browse)
        file_row.addWidget(self.kv_file, 1)
        file_row.addWidget(browse)
        self._file_row_widget = QWidget()
        self._file_row_widget.setLayout(file_row)
        file_row.setContentsMargins(0, 0, 0, 0)
        f.addRow("KV file", self._file_row_widget)
        self.layer = _spin(0, 1000, "Layer of the dump")
        f.addRow("Layer", self.layer)
        self.context_lens = QLineEdit()
        self.context_lens.setToolTip("Tokens of each sequence, comma separated (one sequence each)")
        f.addRow("Context lengths", self.context_lens)
        self.seed = _spin(0, 2**31 - 1, "Seed of the synthetic data and the scattered allocation")
        f.addRow("Seed", self.seed)
        lay.addWidget(src)

        # --- shape
        shape = QGroupBox("Shape and paging")
        f = QFormLayout(shape)
        f.setFieldGrowthPolicy(QFormLayout.AllNonFixedFieldsGrow)
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
        f.addRow("Method", self.method)
        self.options_box = QWidget()
        self.options_form = QFormLayout(self.options_box)
        self.options_form.setContentsMargins(12, 0, 0, 0)
        f.addRow(self.options_box)
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
        self.source.currentIndexChanged.connect(self._source_changed)

    # ---------------------------------------------------------------- fields
    def _fill_methods(self) -> None:
        cur = self.method.currentData()
        self.method.blockSignals(True)
        self.method.clear()
        for key, label in method_choices():
            self.method.addItem(f"{label}", key)
            self.method.setItemData(self.method.count() - 1, key, Qt.ToolTipRole)
        if cur is not None:
            i = self.method.findData(cur)
            if i >= 0:
                self.method.setCurrentIndex(i)
        self.method.blockSignals(False)

    def _build_options(self, key: str, values: dict | None = None) -> None:
        while self.options_form.rowCount():
            self.options_form.removeRow(0)
        self._opt_editors = {}
        self._opt_defaults = default_options(key)
        values = {**self._opt_defaults, **(values or {})}
        for name, val in values.items():
            if isinstance(val, bool):
                ed = QCheckBox()
                ed.setChecked(val)
                ed.toggled.connect(self._emit)
            elif isinstance(val, int):
                ed = _spin(-2**31, 2**31 - 1, f"{key} option {name}")
                ed.setValue(val)
                ed.valueChanged.connect(self._emit)
            elif isinstance(val, float):
                ed = QDoubleSpinBox()
                ed.setDecimals(6)
                ed.setRange(-1e12, 1e12)
                ed.setKeyboardTracking(False)
                ed.setValue(val)
                ed.valueChanged.connect(self._emit)
            else:
                ed = QLineEdit(str(val))
                ed.editingFinished.connect(self._emit)
            ed.setToolTip(f"{key} option '{name}' (default {self._opt_defaults.get(name)!r})")
            self._opt_editors[name] = ed
            self.options_form.addRow(name, ed)
        self.options_box.setVisible(bool(self._opt_editors))

    def method_options(self) -> dict:
        """Options that differ from the method's defaults (what `get_method(key, **options)` takes)."""
        out = {}
        for name, ed in self._opt_editors.items():
            if isinstance(ed, QCheckBox):
                v = ed.isChecked()
            elif isinstance(ed, (QSpinBox, QDoubleSpinBox)):
                v = ed.value()
            else:
                v = ed.text()
            if v != self._opt_defaults.get(name):
                out[name] = v
        return out

    def _source_changed(self) -> None:
        file = self.source.currentText() == "kvfile"
        self._file_row_widget.setEnabled(file)
        self.layer.setEnabled(file)
        self.preset.setEnabled(not file)
        self.context_lens.setEnabled(not file)

    def _method_changed(self) -> None:
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
        try:
            self._fill_methods()
            self.source.setCurrentText(cfg.source)
            self.preset.setCurrentText(cfg.preset)
            self.kv_file.setText(cfg.kv_file)
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
            self._build_options(cfg.method, cfg.method_options)
            self.frontend.setCurrentText(cfg.frontend)
            self.timing_runs.setValue(int(cfg.timing_runs))
            self._softmax_scale = float(cfg.softmax_scale)
            self._source_changed()
        finally:
            self._loading = False

    def config(self) -> SessionConfig:
        return SessionConfig(
            source=self.source.currentText(),
            preset=self.preset.currentText(),
            context_lens=parse_context_lens(self.context_lens.text()),
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
            softmax_scale=getattr(self, "_softmax_scale", 0.0),
        )

    def set_busy(self, busy: bool) -> None:
        self.cancel_button.setEnabled(busy)
