"""A dock's panel in a scroll area, so no panel's minimum size sets the window's."""
from __future__ import annotations

from PySide6.QtCore import QEvent, QSize, QTimer
from PySide6.QtWidgets import QFrame, QScrollArea, QWidget


class PanelScroll(QScrollArea):
    """A dock's panel in a scroll area: the panel takes the whole dock while the dock is at least the
    panel's minimum size and scrolls when the dock is smaller, so no panel's minimum (the live decode's
    controls, the timing tabs) sets the window's minimum size."""

    MIN = (160, 90)

    def __init__(self, panel: QWidget):
        super().__init__()
        self.setWidget(panel)
        # sized here, not by QScrollArea's widgetResizable: that asks a panel with word-wrapped labels for
        # its height-for-width (its preferred height), so a dock that could show the panel whole scrolled
        self.setWidgetResizable(False)
        self.setFrameShape(QFrame.NoFrame)
        self.setObjectName(f"scroll_{getattr(panel, 'key', 'panel')}")
        panel.installEventFilter(self)

    def fit(self) -> None:
        w = self.widget()
        vp = self.viewport().size()
        m = w.minimumSizeHint().expandedTo(w.minimumSize())
        w.resize(max(vp.width(), m.width()), max(vp.height(), m.height()))

    def resizeEvent(self, ev) -> None:  # noqa: N802 - Qt naming
        super().resizeEvent(ev)
        self.fit()

    def eventFilter(self, obj, ev) -> bool:  # noqa: N802

        if obj is self.widget() and ev.type() == QEvent.LayoutRequest:
            # self as the timer's context: a window closed before the timer fires drops the call with it
            QTimer.singleShot(0, self, self.fit)
        return False

    def sizeHint(self):  # noqa: N802 - Qt naming
        return self.widget().sizeHint()

    def minimumSizeHint(self):  # noqa: N802

        return QSize(*self.MIN)
