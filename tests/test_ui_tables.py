"""A row the program selects stays selected whatever keys Qt last saw held: after a Ctrl shortcut (Qt keeps its
modifier state from the last key event), QTableView.selectRow toggles an already-selected row off in an extended
selection; kvviz.ui.widgets.tables.select_row selects it."""
from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QAbstractItemView, QTableWidget, QTableWidgetItem

from kvviz.ui.widgets.tables import select_row


def _table(qtbot) -> QTableWidget:
    t = QTableWidget(3, 2)
    t.setSelectionBehavior(QAbstractItemView.SelectRows)
    t.setSelectionMode(QAbstractItemView.ExtendedSelection)
    for i in range(3):
        for j in range(2):
            t.setItem(i, j, QTableWidgetItem(f"{i},{j}"))
    qtbot.addWidget(t)
    t.show()
    return t


def rows(t) -> list[int]:
    return [r.row() for r in t.selectionModel().selectedRows()]


def test_select_row_after_a_ctrl_shortcut(qtbot):
    t = _table(qtbot)
    select_row(t, 0)
    qtbot.keyClick(t, Qt.Key_R, Qt.ControlModifier)  # a Ctrl shortcut, as the window's Ctrl+R
    try:
        assert QGuiApplication.keyboardModifiers() & Qt.ControlModifier  # Qt still counts Ctrl as held
        t.selectRow(0)  # Qt's own: the selected row toggles off
        assert rows(t) == []
        select_row(t, 0)
        select_row(t, 0)  # selected, and stays selected when selected again
        assert rows(t) == [0] and t.currentRow() == 0
        select_row(t, 2)
        assert rows(t) == [2] and t.currentRow() == 2
        select_row(t, 3)  # past the last row: nothing selected
        assert rows(t) == []
    finally:
        qtbot.keyClick(t, Qt.Key_Control)  # leaves no held modifier to the next test
