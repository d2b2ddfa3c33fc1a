"""Labels that fit their panel."""
from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QPainter
from PySide6.QtWidgets import QLabel, QSizePolicy


class ElidedLabel(QLabel):
    """A one-line label that shrinks with its panel: the text is elided, the full text is the tooltip."""

    def __init__(self, text: str = "", parent=None):
        super().__init__(text, parent)
        self.setSizePolicy(QSizePolicy.Ignored, QSizePolicy.Preferred)
        self.setMinimumWidth(20)

    def setText(self, text: str) -> None:  # noqa: N802 - Qt naming
        super().setText(text)
        self.setToolTip(text)

    def minimumSizeHint(self):  # noqa: N802
        h = super().minimumSizeHint()
        h.setWidth(20)
        return h

    def paintEvent(self, ev) -> None:  # noqa: N802
        p = QPainter(self)
        fm = self.fontMetrics()
        r = self.contentsRect()
        p.drawText(r, int(self.alignment()) | Qt.AlignVCenter, fm.elidedText(self.text(), Qt.ElideRight, r.width()))
