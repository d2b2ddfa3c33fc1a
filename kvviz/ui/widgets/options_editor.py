"""The editors of a method's options, built from its typed option schema
(kvviz.families.registry.option_schema).

One editor per `OptionSpec`: a combo box for a closed set of choices, a spin box bounded by the
option's range for an integer or a float, a check box for a bool, a line edit for free text; the
tooltip is the option's help. Values are read back through `OptionSpec.parse` only, so what the
window hands to a method is typed and checked the same way as `--set method_options=...` and config
files. Used by the Workload panel (a form) and the Live decode panel (one row).
"""
from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QFormLayout,
    QLineEdit,
    QSpinBox,
    QWidget,
)

from kvviz.families.registry import option_schema
from kvviz.ui.layouts import FlowLayout, labelled

INT_RANGE = (-2**31, 2**31 - 1)  # QSpinBox holds a C int
FLOAT_RANGE = (-1e12, 1e12)


def option_specs(method_id: str | None) -> tuple:
    """The method's OptionSpecs; () for an unknown method (its options cannot be edited)."""
    if not method_id:
        return ()
    try:
        return tuple(option_schema(method_id))
    except Exception:  # noqa: BLE001 - a method the registry does not know has no editable options
        return ()


def make_editor(spec, value, tip_prefix: str = "") -> QWidget:
    """The editor widget of one option, showing `value` (typed)."""
    if spec.choices:
        ed = QComboBox()
        for c in spec.choices:
            ed.addItem(str(c), c)
        i = ed.findData(value)
        ed.setCurrentIndex(i if i >= 0 else max(ed.findData(spec.default), 0))
        ed.setSizeAdjustPolicy(QComboBox.AdjustToContents)  # the longest choice shows whole ("reference")
        ed.setMinimumWidth(ed.sizeHint().width())
    elif spec.type is bool:
        ed = QCheckBox()
        ed.setChecked(bool(value))
    elif spec.type is int:
        ed = QSpinBox()
        lo = int(spec.minimum) if spec.minimum is not None else INT_RANGE[0]
        hi = int(spec.maximum) if spec.maximum is not None else INT_RANGE[1]
        ed.setRange(max(lo, INT_RANGE[0]), min(hi, INT_RANGE[1]))
        ed.setKeyboardTracking(False)
        ed.setAccelerated(True)
        ed.setValue(int(value))
    elif spec.type is float:
        ed = QDoubleSpinBox()
        ed.setDecimals(6)
        ed.setRange(float(spec.minimum) if spec.minimum is not None else FLOAT_RANGE[0],
                    float(spec.maximum) if spec.maximum is not None else FLOAT_RANGE[1])
        ed.setKeyboardTracking(False)
        ed.setValue(float(value))
    else:
        ed = QLineEdit(str(value))
        ed.setMinimumWidth(min(240, ed.fontMetrics().horizontalAdvance(str(value)) + 16))
    ed.setToolTip(f"{tip_prefix}{spec.describe()}\n{spec.help}")
    return ed


def editor_value(ed: QWidget):
    """What an editor holds, before parsing: the combo's item, the spin box's number, the text."""
    if isinstance(ed, QComboBox):
        return ed.currentData()
    if isinstance(ed, QCheckBox):
        return ed.isChecked()
    if isinstance(ed, (QSpinBox, QDoubleSpinBox)):
        return ed.value()
    return ed.text()


def set_editor_value(ed: QWidget, value) -> None:
    if isinstance(ed, QComboBox):
        i = ed.findData(value)
        if i < 0:
            raise ValueError(f"{value!r} is not one of the choices")
        ed.setCurrentIndex(i)
    elif isinstance(ed, QCheckBox):
        ed.setChecked(bool(value))
    elif isinstance(ed, (QSpinBox, QDoubleSpinBox)):
        ed.setValue(value)
    else:
        ed.setText(str(value))


class OptionsEditor(QWidget):
    """The option editors of one method. `layout="form"`: a label per row; `"row"`: all in one line.

    `values()` are every option's value, `options()` only those differing from the defaults (what a
    `SessionConfig` / `LiveConfig` keeps); both parsed through the schema (InvalidInput for text a
    line edit cannot be read as).
    """

    changed = Signal()

    def __init__(self, layout: str = "form", parent=None):
        super().__init__(parent)
        self.method_id = ""
        self.specs: dict = {}  # name -> OptionSpec
        self.editors: dict = {}  # name -> editor widget
        if layout == "form":
            self.lay = QFormLayout(self)
            self.lay.setContentsMargins(12, 0, 0, 0)
        else:  # a row that wraps in a narrow dock, each option's name kept with its editor
            self.lay = FlowLayout(self)
        self.form = layout == "form"

    @property
    def defaults(self) -> dict:
        return {name: s.default for name, s in self.specs.items()}

    def build(self, method_id: str | None, values: dict | None = None) -> None:
        """Editors for `method_id`'s options, showing `values` (defaults for the others)."""
        self._clear()
        self.method_id = method_id or ""
        specs = option_specs(method_id)
        self.specs = {s.name: s for s in specs}
        values = dict(values or {})
        for s in specs:
            ed = make_editor(s, values.get(s.name, s.default), f"{self.method_id} option: ")
            for sig in self._signals(ed):
                sig.connect(self._emit)
            self.editors[s.name] = ed
            if self.form:
                self.lay.addRow(s.name, ed)
            elif isinstance(ed, QCheckBox):
                ed.setText(s.name)
                self.lay.addWidget(ed)
            else:
                self.lay.addWidget(labelled(s.name, ed))
        if not self.form:
            self.lay.addStretch(1)
        self.setVisible(bool(self.editors))

    def _clear(self) -> None:
        if self.form:
            while self.lay.rowCount():
                self.lay.removeRow(0)
        else:
            while self.lay.count():
                it = self.lay.takeAt(0)
                if it.widget() is not None:
                    it.widget().deleteLater()
        self.editors, self.specs = {}, {}

    @staticmethod
    def _signals(ed):
        if isinstance(ed, QComboBox):
            return [ed.currentIndexChanged]
        if isinstance(ed, QCheckBox):
            return [ed.toggled]
        if isinstance(ed, (QSpinBox, QDoubleSpinBox)):
            return [ed.valueChanged]
        return [ed.editingFinished]

    def _emit(self, *args) -> None:
        self.changed.emit()

    def set_value(self, name: str, value) -> None:
        set_editor_value(self.editors[name], self.specs[name].parse(value))

    def values(self) -> dict:
        """Every option, typed through its OptionSpec."""
        where = f"{self.method_id} options" if self.method_id else ""
        return {name: self.specs[name].parse(editor_value(ed), where=where) for name, ed in self.editors.items()}

    def options(self) -> dict:
        """The options that differ from the method's defaults."""
        d = self.defaults
        return {k: v for k, v in self.values().items() if v != d.get(k)}
