"""Selecting a table's row from code.

QTableView.selectRow reads the keyboard modifiers Qt last saw: with Ctrl held (or a Ctrl press whose release never
arrived) it toggles the row in an extended selection, so a row that was already selected is deselected. A row the
program selects (a click on a plot, the newest run after a reload) is selected whatever keys are down.
"""
from __future__ import annotations

from PySide6.QtCore import QItemSelectionModel
from PySide6.QtWidgets import QTableView


def select_row(table: QTableView, row: int) -> None:
    """Make `row` the selection and the current row of `table` (a row out of range clears the selection)."""
    model, sel = table.model(), table.selectionModel()
    if model is None or sel is None:
        return
    if not 0 <= row < model.rowCount():
        table.clearSelection()
        return
    index = model.index(row, 0)
    sel.setCurrentIndex(index, QItemSelectionModel.NoUpdate)
    sel.select(index, QItemSelectionModel.ClearAndSelect | QItemSelectionModel.Rows)
