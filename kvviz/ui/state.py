"""The window's typed app state: what the panels share and how they ask the window for work.

Panels get the `AppState`, not the window: they read `state.results`, and they ask for work by
emitting its request signals (export a panel, inspect a block, export the trace, say something in
the status bar, show an error). The window connects each request to what carries it out.
"""
from __future__ import annotations

from PySide6.QtCore import QObject, Signal


class AppState(QObject):
    results_changed = Signal(object)  # the Results every panel draws
    # requests from the panels
    export_requested = Signal(object, str)  # panel, "png" | "svg" | "csv"
    inspect_requested = Signal(int, int, str)  # physical block, KV head, "K" | "V"
    trace_export_requested = Signal()
    status_message = Signal(str)
    error = Signal(str, object)  # where, the exception

    def __init__(self, parent=None):
        super().__init__(parent)
        self.results = None

    def set_results(self, res) -> None:
        self.results = res
        self.results_changed.emit(res)


def model_label(path: str) -> str:
    return path.replace("\\", "/").rsplit("/", 1)[-1] if path else "SmolLM2-135M"
