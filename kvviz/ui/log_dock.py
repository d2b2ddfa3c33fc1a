"""The window's log: records of the `kvviz` loggers (adapter, loop limit, shader compiles, fallbacks,
session steps) shown in a dock, whichever thread logged them."""
from __future__ import annotations

import logging

from PySide6.QtCore import QObject, Qt, Signal
from PySide6.QtGui import QFontDatabase
from PySide6.QtWidgets import QPlainTextEdit, QVBoxLayout, QWidget

MAX_LINES = 5000


class _Bridge(QObject):
    record = Signal(str)


class QtLogHandler(logging.Handler):
    """A logging handler whose records reach the GUI thread through a queued signal."""

    def __init__(self, level=logging.INFO):
        super().__init__(level)
        self.bridge = _Bridge()
        self.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s", "%H:%M:%S"))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.bridge.record.emit(self.format(record))
        except RuntimeError:  # the window (and the bridge) is gone
            pass


class LogPanel(QWidget):
    """A read-only view of the log, newest at the bottom, capped at MAX_LINES lines."""

    title = "Log"
    key = "log"

    def __init__(self, parent=None, logger: str = "kvviz", level=logging.INFO):
        super().__init__(parent)
        self.view = QPlainTextEdit()
        self.view.setReadOnly(True)
        self.view.setMaximumBlockCount(MAX_LINES)
        self.view.setFont(QFontDatabase.systemFont(QFontDatabase.FixedFont))
        lay = QVBoxLayout(self)
        lay.setContentsMargins(2, 2, 2, 2)
        lay.addWidget(self.view)
        self.handler = QtLogHandler(level)
        self.handler.bridge.record.connect(self.view.appendPlainText, Qt.QueuedConnection)
        self.logger = logging.getLogger(logger)
        if self.logger.getEffectiveLevel() > level:
            self.logger.setLevel(level)
        self.logger.addHandler(self.handler)

    def detach(self) -> None:
        self.logger.removeHandler(self.handler)

    def text(self) -> str:
        return self.view.toPlainText()
