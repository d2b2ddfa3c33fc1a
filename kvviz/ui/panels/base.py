"""The panel base class: a widget that draws `Results` from the tables it exports.

A panel keeps what it plots as `kvviz.tables.Table`s (Qt-free), draws from them, and exports
them: PNG at 2x device pixel ratio, SVG through QSvgGenerator, CSV of exactly the plotted points.
"""
from __future__ import annotations

import contextlib
import html
import os

import pyqtgraph as pg
from PySide6.QtCore import QEvent, QObject, Qt, Signal
from PySide6.QtWidgets import QHBoxLayout, QLabel, QMenu, QSizePolicy, QToolButton, QVBoxLayout, QWidget

from kvviz.history.numbers import change, headline_numbers, spec
from kvviz.ui.export import SCREEN_DPI, save_png, save_svg
from kvviz.ui.layouts import FlowLayout
from kvviz.ui.widgets.labels import ElidedLabel

PANEL_FORMATS = ("png", "svg", "csv")
DELTA_COLORS = {"better": "#1a7a1a", "worse": "#a01010"}  # a change against the pinned run


class InfoLabel(QLabel):
    """A panel's info line: word-wrapped, small, hidden while empty (the full text always shows)."""

    def __init__(self, text: str = "", parent=None):
        super().__init__(text, parent)
        self.setObjectName("panelInfo")
        self.setWordWrap(True)
        self.setTextFormat(Qt.PlainText)
        self.setStyleSheet("#panelInfo { color: #333; }")
        self.setTextInteractionFlags(Qt.TextSelectableByMouse)
        self.setVisible(bool(text))

    def setText(self, text: str) -> None:  # noqa: N802 - Qt naming
        super().setText(text)
        self.setVisible(bool(text))


def keep_whole(layout) -> None:
    """The widgets of a tool row never narrower than their text: combo boxes sized to their longest item,
    spin boxes, buttons and check boxes at their size hint (a dock narrower than the row scrolls it)."""
    from PySide6.QtWidgets import QAbstractButton, QAbstractSpinBox, QComboBox, QLabel as _QLabel

    for i in range(layout.count()):
        item = layout.itemAt(i)
        w = item.widget()
        if w is None:
            if item.layout() is not None:
                keep_whole(item.layout())
            continue
        if isinstance(w, QComboBox):
            w.setSizeAdjustPolicy(QComboBox.AdjustToContents)
        if isinstance(w, (QComboBox, QAbstractSpinBox, QAbstractButton)) or (
                isinstance(w, _QLabel) and not w.wordWrap() and not isinstance(w, ElidedLabel)):
            pol = w.sizePolicy()
            pol.setHorizontalPolicy(QSizePolicy.Fixed)
            w.setSizePolicy(pol)


class _CurrentTextFit(QObject):
    """Keeps a combo box's minimum width at its current text's (see fit_current_text)."""

    def __init__(self, combo):
        super().__init__(combo)
        self.combo = combo
        self.text = None
        combo.installEventFilter(self)
        combo.currentIndexChanged.connect(self.update)
        combo.currentTextChanged.connect(self.update)
        self.update()

    def update(self, *_) -> None:
        from PySide6.QtCore import QSize
        from PySide6.QtWidgets import QStyle, QStyleOptionComboBox

        combo = self.combo
        self.text = combo.currentText()
        opt = QStyleOptionComboBox()
        combo.initStyleOption(opt)
        text_w = combo.fontMetrics().horizontalAdvance(self.text)
        if combo.count() and not combo.itemIcon(max(combo.currentIndex(), 0)).isNull():
            text_w += combo.iconSize().width() + 4
        h = combo.sizeHint().height()
        size = combo.style().sizeFromContents(QStyle.CT_ComboBox, opt, QSize(text_w + 2, h), combo)
        if combo.minimumWidth() != size.width():
            combo.setMinimumWidth(size.width())

    def eventFilter(self, obj, ev) -> bool:  # noqa: N802 - Qt naming
        # an index set with the combo's signals blocked (a panel filling its fields) is caught here
        if ev.type() in (QEvent.Paint, QEvent.Show, QEvent.FontChange) and obj.currentText() != self.text:
            self.update()
        return False


def fit_current_text(combo) -> None:
    """A combo box never narrower than its current item's text (it may grow; a longer item's text needs
    no room until it is chosen): the minimum width follows the selection."""
    combo._current_text_fit = _CurrentTextFit(combo)


class Panel(QWidget):
    key = ""
    title = ""
    # The headline numbers (kvviz.history.numbers keys; "k_*" for every key with that start) the panel shows: their
    # change against the pinned run is said on a line under the info line, from the app state's baseline.
    baseline_keys: tuple = ()
    selection_changed = Signal()

    def __init__(self, state=None, parent=None):
        super().__init__(parent)
        self.state = state  # kvviz.ui.state.AppState (None: a panel on its own, e.g. rendering a report)
        self.res = None
        self.setObjectName(f"panel_{self.key}")
        self.setWindowTitle(self.title)
        self.setAutoFillBackground(True)
        outer = QVBoxLayout(self)
        outer.setContentsMargins(4, 2, 4, 4)
        outer.setSpacing(3)
        bar = QHBoxLayout()
        bar.setSpacing(6)
        # the panel's selectors and buttons wrap onto a second line in a narrow dock (kept beside Export)
        self.tools = FlowLayout()
        bar.addLayout(self.tools, 1)
        # The info line under the tool row, wrapped: never cut, whatever the dock's width (an elided line
        # beside the selectors showed "3..." in a narrow dock).
        self.info = InfoLabel("")
        self.export_button = QToolButton()
        self.export_button.setText("Export")
        self.export_button.setToolTip(f"Export the {self.title} panel: PNG (2x), SVG, CSV of the plotted data")
        self.export_button.setPopupMode(QToolButton.InstantPopup)
        menu = QMenu(self.export_button)
        for fmt in PANEL_FORMATS:
            menu.addAction(f"{fmt.upper()}...", lambda f=fmt: self._export_clicked(f))
        self.export_button.setMenu(menu)
        bar.addWidget(self.export_button)
        outer.addLayout(bar)
        outer.addWidget(self.info)
        # Said when the panel's results no longer match the Workload settings (an invalid field, a failed run).
        self.stale_label = QLabel("")
        self.stale_label.setObjectName("staleNote")
        self.stale_label.setWordWrap(True)
        self.stale_label.setStyleSheet("#staleNote { background: #fff4d6; color: #6b4a00; padding: 2px 4px; "
                                       "border: 1px solid #e6c36a; border-radius: 3px; font-size: 8pt; }")
        self.stale_label.hide()
        outer.addWidget(self.stale_label)
        # the change of the panel's numbers against the pinned run (green: better, red: worse)
        self.delta_note = QLabel("")
        self.delta_note.setObjectName("deltaNote")
        self.delta_note.setWordWrap(True)
        self.delta_note.setTextFormat(Qt.RichText)
        self.delta_note.setStyleSheet("#deltaNote { color: #333; font-size: 8pt; }")
        self.delta_note.hide()
        outer.insertWidget(outer.indexOf(self.info) + 1, self.delta_note)
        self._numbers = (None, {})  # (results, their headline numbers)
        if state is not None:  # the note follows the app state's notices (kvviz.ui.state), never the panel's own code
            state.notices_changed.connect(self.sync_stale)
            state.baseline_changed.connect(self.sync_deltas)
        self.body = QVBoxLayout()
        self.body.setContentsMargins(0, 0, 0, 0)
        self.body.setSpacing(3)
        outer.addLayout(self.body, 1)

    PLOT_ROW_HEIGHT = 150  # px a plot keeps at least (its axis labels, a few ticks): a short dock scrolls instead

    def keep_plot_room(self) -> None:
        """Every plot view of the panel at least PLOT_ROW_HEIGHT tall a row of plots, so a short dock (the middle
        column's tabs under a tall overview) scrolls the panel instead of squeezing its plots to a few pixels."""
        for view in self.findChildren(pg.GraphicsView):
            ci = getattr(view, "ci", None)
            rows = max(1, ci.layout.rowCount()) if ci is not None and hasattr(ci, "layout") else 1
            if view.minimumHeight() < self.PLOT_ROW_HEIGHT * rows:
                view.setMinimumHeight(self.PLOT_ROW_HEIGHT * rows)

    def showEvent(self, ev) -> None:  # noqa: N802 - Qt naming
        if not getattr(self, "_tools_kept_whole", False):
            self._tools_kept_whole = True
            self.keep_plot_room()
            keep_whole(self.tools)
            bar = self.layout().itemAt(0).layout()
            keep_whole(bar)
            if self.tools.count() == 0:  # no selectors: the info line goes beside the Export button (a row saved)
                self.layout().removeWidget(self.info)
                bar.insertWidget(1, self.info, 1)
        super().showEvent(ev)

    # ---------------------------------------------------------------- data
    def set_results(self, res) -> None:
        self.res = res
        self.refresh()
        self.sync_stale()
        self.sync_deltas()

    def numbers(self) -> dict:
        """The headline numbers of the panel's results (computed once per results)."""
        if self.res is None:
            return {}
        if self._numbers[0] is not self.res:
            self._numbers = (self.res, headline_numbers(self.res))
        return self._numbers[1]

    def baseline_changes(self) -> list:
        """[(key, now, Change)] of the panel's numbers against the pinned run ([] without one)."""
        b = self.state.baseline if self.state is not None else None
        if b is None or not b.numbers or self.res is None or not self.baseline_keys:
            return []
        now = self.numbers()
        keys = []
        for k in self.baseline_keys:
            keys += sorted(n for n in now if n.startswith(k[:-1])) if k.endswith("*") else [k]
        out = []
        for k in keys:
            c = change(k, now.get(k), b.numbers.get(k))
            if c is not None:
                out.append((k, now[k], c))
        return out

    def sync_deltas(self) -> None:
        """The line of the numbers' changes against the pinned run (hidden without a baseline)."""
        changes = self.baseline_changes()
        if not changes:
            self.delta_note.hide()
            return
        b = self.state.baseline
        parts = [f"{spec(k).label} <span style='color:{DELTA_COLORS.get(c.verdict, '#333')}'>{c.text}</span>"
                 for k, _now, c in changes]
        self.delta_note.setText(f"vs pinned {html.escape(b.title)}: " + " \u00b7 ".join(parts))
        self.delta_note.show()

    def has_content(self) -> bool:
        """Whether the panel shows something a notice can make stale (the results of a run)."""
        return self.res is not None

    def sync_stale(self) -> None:
        """The stale note as the app state says: shown while a notice makes this panel's content stale."""
        why = self.state.stale_why(self.key) if self.state is not None else None
        if why and self.has_content():
            text = f"Stale: {why}"
            if self.stale_label.text() != text:
                self.stale_label.setText(text)
            self.stale_label.setToolTip(text)
            self.stale_label.show()
        else:
            self.stale_label.hide()

    @property
    def is_stale(self) -> bool:
        return not self.stale_label.isHidden()

    def refresh(self) -> None:
        """Rebuild the tables from `self.res` and the panel's selections, then draw them."""

    def tables(self) -> list:
        """[Table]: the first is the main plotted data, others are extra plotted data."""
        return []

    # -------------------------------------------------------------- export
    def _export_clicked(self, fmt: str) -> None:
        if self.state is not None:
            self.state.export_requested.emit(self, fmt)

    def export(self, fmt: str, path: str, size=None, dpi=None) -> list:
        """Write the panel as `fmt` to `path`; a figure (PNG, SVG) at `size` (a QSize of logical pixels, default
        the panel's) and `dpi` (PNG default 192, i.e. 2x; SVG 96)."""
        figure = {k: v for k, v in (("size", size), ("dpi", dpi)) if v is not None}
        if fmt == "png":
            return [self.export_png(path, **figure)]
        if fmt == "svg":
            return [self.export_svg(path, **figure)]
        if fmt == "csv":
            return self.export_csv(path)
        raise ValueError(fmt)

    def export_png(self, path: str, size=None, dpi: float = 192.0) -> str:
        with self.figure_mode():
            return save_png(self, path, dpi / SCREEN_DPI, size)

    def export_svg(self, path: str, size=None, dpi: float = SCREEN_DPI) -> str:
        with self.figure_mode():
            return save_svg(self, path, f"kvviz: {self.title}", size, dpi)

    def controls(self) -> list:
        """The widgets a figure leaves out: the tool row (selectors, the Export button, the elided info
        line), buttons, combo boxes, check boxes, text fields, spin boxes, tab bars and the stale note;
        with a plot in the panel also its tables (their numbers are the CSV)."""
        import pyqtgraph as pg
        from PySide6.QtWidgets import (
            QAbstractButton,
            QAbstractItemView,
            QAbstractSpinBox,
            QComboBox,
            QLineEdit,
            QPlainTextEdit,
            QSlider,
            QTabBar,
        )

        kinds = (QAbstractButton, QComboBox, QLineEdit, QAbstractSpinBox, QSlider, QTabBar, QPlainTextEdit,
                 ElidedLabel)
        out = [w for w in self.findChildren(QWidget) if isinstance(w, kinds)] + [self.stale_label, self.info,
                                                                                   self.delta_note]
        if any(v.isVisible() for v in self.findChildren(pg.GraphicsView)):
            out += [w for w in self.findChildren(QAbstractItemView) if not isinstance(w, pg.GraphicsView)]
        for i in range(self.tools.count()):
            w = self.tools.itemAt(i).widget()
            if w is not None:
                out.append(w)
        return out

    def figure_mode(self):
        """Context manager: the panel as a figure, its controls hidden while it is painted."""
        from PySide6.QtWidgets import QApplication

        @contextlib.contextmanager
        def cm():
            hidden = [w for w in self.controls() if not w.isHidden()]
            for w in hidden:
                w.hide()
            if self.layout() is not None:
                self.layout().activate()
            QApplication.processEvents()
            try:
                yield self
            finally:
                for w in hidden:
                    w.show()

        return cm()

    def export_csv(self, path: str) -> list:
        """The main table to `path`, every other table to `<stem>_<table>.csv` beside it."""
        tabs = self.tables()
        if not tabs:
            raise ValueError(f"{self.title}: nothing to export yet")
        stem, ext = os.path.splitext(str(path))
        out = [tabs[0].write_csv(path)]
        for t in tabs[1:]:
            out.append(t.write_csv(f"{stem}_{t.name}{ext or '.csv'}"))
        return out
