"""The panel base class: a widget that draws `Results` from the tables it exports.

A panel keeps what it plots as `kvviz.tables.Table`s (Qt-free), draws from them, and exports
them: PNG at 2x device pixel ratio, SVG through QSvgGenerator, CSV of exactly the plotted points.
"""
from __future__ import annotations

import contextlib
import os

from PySide6.QtCore import QEvent, QObject, Qt, Signal
from PySide6.QtWidgets import QHBoxLayout, QLabel, QMenu, QSizePolicy, QToolButton, QVBoxLayout, QWidget

from kvviz.ui.export import save_png, save_svg
from kvviz.ui.widgets.labels import ElidedLabel

PANEL_FORMATS = ("png", "svg", "csv")


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
        self.tools = QHBoxLayout()
        self.tools.setSpacing(6)
        bar.addLayout(self.tools)
        bar.addStretch(1)
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
        self.body = QVBoxLayout()
        self.body.setContentsMargins(0, 0, 0, 0)
        self.body.setSpacing(3)
        outer.addLayout(self.body, 1)

    def showEvent(self, ev) -> None:  # noqa: N802 - Qt naming
        if not getattr(self, "_tools_kept_whole", False):
            self._tools_kept_whole = True
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
        self.set_stale(None)
        self.refresh()

    def set_stale(self, why: str | None) -> None:
        """Say that what the panel shows is stale (why), or nothing (None)."""
        if why and self.res is not None:
            self.stale_label.setText(f"Stale: these are the results of the last run; {why}")
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

    def export(self, fmt: str, path: str) -> list:
        if fmt == "png":
            return [self.export_png(path)]
        if fmt == "svg":
            return [self.export_svg(path)]
        if fmt == "csv":
            return self.export_csv(path)
        raise ValueError(fmt)

    def export_png(self, path: str) -> str:
        with self.figure_mode():
            return save_png(self, path, 2.0)

    def export_svg(self, path: str) -> str:
        with self.figure_mode():
            return save_svg(self, path, f"kvviz: {self.title}")

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
        out = [w for w in self.findChildren(QWidget) if isinstance(w, kinds)] + [self.stale_label, self.info]
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
