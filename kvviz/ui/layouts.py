"""Layouts that reflow instead of scrolling sideways: a row of controls that wraps (`FlowLayout`), a label kept
with its field (`labelled`), a splitter that stacks its panes when they do not fit side by side
(`ReflowSplitter`). Every panel of the window is usable in a 486 px dock at 1280x800 with these."""
from __future__ import annotations

from PySide6.QtCore import QEvent, QObject, QPoint, QRect, QSize, Qt
from PySide6.QtWidgets import QHBoxLayout, QLabel, QLayout, QSplitter, QWidget


class FlowLayout(QLayout):
    """Widgets in a row that wraps: as many per line as the width holds, the next ones on the following line, so
    a row of controls is never wider than its widest control (a narrow dock gets two lines, not a sideways
    scroll). A widget added with a stretch takes a line of its own, its whole width."""

    def __init__(self, parent=None, spacing: int = 6):
        super().__init__(parent)
        self._items: list = []
        self._stretch: dict = {}
        self.setContentsMargins(0, 0, 0, 0)
        self.setSpacing(spacing)

    def addItem(self, item) -> None:  # noqa: N802 - Qt naming
        self._items.append(item)

    def addWidget(self, w, stretch: int = 0) -> None:  # noqa: N802
        super().addWidget(w)
        if stretch:
            self._stretch[id(self._items[-1])] = stretch

    def insertWidget(self, index: int, w, stretch: int = 0) -> None:  # noqa: N802
        self.addWidget(w, stretch)
        self._items.insert(index, self._items.pop())
        self.invalidate()

    def addStretch(self, stretch: int = 0) -> None:  # noqa: N802 - a flow has no empty room to share
        pass

    def count(self) -> int:
        return len(self._items)

    def itemAt(self, i: int):  # noqa: N802
        return self._items[i] if 0 <= i < len(self._items) else None

    def takeAt(self, i: int):  # noqa: N802
        if 0 <= i < len(self._items):
            it = self._items.pop(i)
            self._stretch.pop(id(it), None)
            return it
        return None

    def expandingDirections(self):  # noqa: N802
        return Qt.Orientation(0)

    def hasHeightForWidth(self) -> bool:  # noqa: N802
        return True

    def heightForWidth(self, width: int) -> int:  # noqa: N802
        return self._place(QRect(0, 0, width, 0), False)

    def setGeometry(self, rect) -> None:  # noqa: N802
        super().setGeometry(rect)
        self._place(rect, True)

    def sizeHint(self):  # noqa: N802
        shown = [it for it in self._items if not it.isEmpty()]
        w = sum(it.sizeHint().width() for it in shown) + self.spacing() * max(0, len(shown) - 1)
        h = max((it.sizeHint().height() for it in shown), default=0)
        m = self.contentsMargins()
        return QSize(w + m.left() + m.right(), h + m.top() + m.bottom())

    def minimumSize(self):  # noqa: N802
        size = QSize()
        for it in self._items:
            if not it.isEmpty():
                size = size.expandedTo(it.minimumSize() if id(it) in self._stretch else it.sizeHint())
        m = self.contentsMargins()
        return size + QSize(m.left() + m.right(), m.top() + m.bottom())

    def _place(self, rect, apply: bool) -> int:
        m = self.contentsMargins()
        r = rect.adjusted(m.left(), m.top(), -m.right(), -m.bottom())
        x, y, line_h = r.x(), r.y(), 0
        sp = self.spacing()
        line: list = []

        def flush():
            nonlocal line
            if apply:  # the line's widgets centred on its height
                for it, px, size in line:
                    it.setGeometry(QRect(QPoint(px, y + (line_h - size.height()) // 2), size))
            line = []

        for it in self._items:
            if it.isEmpty():
                continue
            hint = it.sizeHint()
            if id(it) in self._stretch:  # a line of its own, the whole width
                if line:
                    flush()
                    y += line_h + sp
                    x, line_h = r.x(), 0
                w = max(r.width(), it.minimumSize().width())
                h = it.heightForWidth(w) if it.hasHeightForWidth() else hint.height()
                line_h = max(h, it.minimumSize().height())
                line.append((it, r.x(), QSize(w, line_h)))
                flush()
                y += line_h + sp
                x, line_h = r.x(), 0
                continue
            if line and x + hint.width() > r.right() + 1:
                flush()
                y += line_h + sp
                x, line_h = r.x(), 0
            line.append((it, x, hint))
            x += hint.width() + sp
            line_h = max(line_h, hint.height())
        if line:
            flush()
            y += line_h
        elif y > r.y():
            y -= sp
        return y - rect.y() + m.bottom()


def labelled(label: str, widget: QWidget, tip: str = "") -> QWidget:
    """A label and its field as one item of a flow (they wrap together, never apart)."""
    box = QWidget()
    lay = QHBoxLayout(box)
    lay.setContentsMargins(0, 0, 0, 0)
    lay.setSpacing(4)
    lab = QLabel(label)
    if tip:
        lab.setToolTip(tip)
    lay.addWidget(lab)
    lay.addWidget(widget, 1)
    return box


class ReflowSplitter(QSplitter):
    """A splitter whose panes sit side by side while its width holds both at their minimum width (plus
    `slack`), and one above the other when it does not: its minimum width is the widest pane's, never the sum."""

    def __init__(self, parent=None, slack: int = 40, pane: int = 0):
        super().__init__(Qt.Horizontal, parent)
        self.slack = slack
        self.pane = pane  # the least width a pane gets side by side (0: its minimum width)
        self.setChildrenCollapsible(False)

    def _side_by_side_width(self) -> int:
        ws = [max(self.pane, self.widget(i).minimumSizeHint().expandedTo(self.widget(i).minimumSize()).width())
              for i in range(self.count()) if not self.widget(i).isHidden()]
        return sum(ws) + self.handleWidth() * max(0, len(ws) - 1) + self.slack

    def minimumSizeHint(self):  # noqa: N802
        hints = [self.widget(i).minimumSizeHint().expandedTo(self.widget(i).minimumSize())
                 for i in range(self.count()) if not self.widget(i).isHidden()]
        w = max((h.width() for h in hints), default=0)
        if self.orientation() == Qt.Horizontal:
            h = max((h.height() for h in hints), default=0)
        else:
            h = sum(h.height() for h in hints) + self.handleWidth() * max(0, len(hints) - 1)
        return QSize(w, h)

    def resizeEvent(self, ev) -> None:  # noqa: N802
        want = Qt.Horizontal if ev.size().width() >= self._side_by_side_width() else Qt.Vertical
        if want != self.orientation():
            self.setOrientation(want)
            self.updateGeometry()
        super().resizeEvent(ev)


class _LongText(QObject):
    """See `long_text_field`."""

    def __init__(self, edit, tip: str, show_end: bool):
        super().__init__(edit)
        self.edit, self.tip, self.show_end = edit, tip, show_end
        edit.textChanged.connect(self.update)
        edit.installEventFilter(self)
        self.update()

    def update(self, *_) -> None:
        e = self.edit
        e.setToolTip(f"{e.text()}\n{self.tip}" if e.text() else self.tip)
        if not e.hasFocus():
            e.setCursorPosition(len(e.text()) if self.show_end else 0)

    def eventFilter(self, obj, ev) -> bool:  # noqa: N802 - Qt naming
        if ev.type() in (QEvent.FocusOut, QEvent.Resize, QEvent.Show):
            self.update()
        return False


def long_text_field(edit, tip: str, show_end: bool = False) -> None:
    """A line edit whose text may be longer than the field (a list of context lengths, a file path): out of focus it
    shows the text's start (or its end: a path's file name), and its tooltip holds the whole text above `tip`
    (kvviz.ui.audit does not call such a field cut)."""
    edit._long_text = _LongText(edit, tip, show_end)


def path_field(edit, tip: str) -> None:
    """A file path's line edit: its end (the file's name) shows, the whole path is its tooltip."""
    long_text_field(edit, tip, show_end=True)
