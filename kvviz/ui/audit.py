"""Cut text in the window: which visible widgets (and plot titles/axis labels) show less than their text.

`cut_text(root)` walks every visible widget under `root` and lists those whose text does not fit the
room they have: a combo box's current text wider than its edit field, a one-line label narrower than its
text, a label lower than its lines (a card's number cut in half), a button or check box narrower than
its label, a line edit or spin box narrower than its value, a pyqtgraph plot title wider than its plot.
A widget scrolled out of a dock's view is not cut (the dock scrolls to it); one squeezed narrower than
its text is. `scrolling_docks(win)` lists the docks whose panel is wider than the dock (a sideways
scroll), `stray_tab_bars(win)` the dock tab bars drawn over the overview or over each other.

`audit_window(win)` runs all three over every panel and every tab of the window, not only those on
screen: it raises each dock in turn and shows each tab of each tab widget in turn, then puts them back.
Used by tests/test_ui_layout.py (in `make test`) and tools/window_screenshots.py.
"""
from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import Qt as QtGui_Qt, QTextDocument
from PySide6.QtWidgets import (
    QAbstractButton, QAbstractSpinBox, QCheckBox, QComboBox, QLabel, QLineEdit, QPushButton, QStyle,
    QStyleOptionButton, QStyleOptionComboBox, QTabBar, QToolButton, QWidget,
)

SLACK = 1  # px of rounding


def _name(w) -> str:
    parts = []
    p = w
    while p is not None and len(parts) < 4:
        if p.objectName():
            parts.append(p.objectName())
        p = p.parentWidget()
    return f"{type(w).__name__}({'/'.join(reversed(parts))})"


def _text_width(fm, text: str) -> int:
    return max((fm.horizontalAdvance(line) for line in text.split("\n")), default=0)


def _label_height_cut(w: QLabel) -> int:
    """Pixels of height missing for a label's lines (0 when they fit)."""
    text = w.text()
    if not text or w.pixmap() is not None and not w.pixmap().isNull():
        return 0
    if w.wordWrap():
        need = w.heightForWidth(w.width())
    else:
        fm = w.fontMetrics()
        need = fm.height() * (text.count("\n") + 1) + 2 * w.margin()
        if w.textFormat() == Qt.RichText or (w.textFormat() == Qt.AutoText and QtGui_Qt.mightBeRichText(text)):
            need = fm.height()  # one line of rich text at least (its own line breaks are not counted)
    return max(0, need - w.height() - 2 * SLACK)


def _label_cut(w: QLabel) -> int:
    """Pixels missing for a label's text (0 when it fits)."""
    text = w.text()
    if not text or w.wordWrap() or w.pixmap() is not None and not w.pixmap().isNull():
        return 0
    if type(w).__name__ == "ElidedLabel":  # elides on purpose: the full text is its tooltip
        return 0
    room = w.contentsRect().width() - 2 * w.margin() - max(w.indent(), 0)
    rich = w.textFormat() == Qt.RichText or (w.textFormat() == Qt.AutoText and QtGui_Qt.mightBeRichText(text))
    if rich:
        doc = QTextDocument()
        doc.setDefaultFont(w.font())
        doc.setDocumentMargin(0)
        doc.setHtml(text)
        need = int(doc.idealWidth() + 0.999)
    else:
        need = _text_width(w.fontMetrics(), text)
    return max(0, need - room - SLACK)


def _combo_cut(w: QComboBox) -> int:
    opt = QStyleOptionComboBox()
    w.initStyleOption(opt)
    field = w.style().subControlRect(QStyle.CC_ComboBox, opt, QStyle.SC_ComboBoxEditField, w)
    need = w.fontMetrics().horizontalAdvance(w.currentText())
    if not w.itemIcon(max(w.currentIndex(), 0)).isNull() and w.count():
        need += w.iconSize().width() + 4
    return max(0, need - field.width() - SLACK)


def _button_cut(w: QAbstractButton) -> int:
    text = w.text().replace("&&", "\0").replace("&", "").replace("\0", "&")
    if not text:
        return 0
    fm = w.fontMetrics()
    need = fm.horizontalAdvance(text)
    if isinstance(w, QCheckBox):
        opt = QStyleOptionButton()
        w.initStyleOption(opt)
        room = w.style().subElementRect(QStyle.SE_CheckBoxContents, opt, w).width()
        return max(0, need - room - SLACK)
    if isinstance(w, QPushButton):
        opt = QStyleOptionButton()
        w.initStyleOption(opt)
        room = w.style().subElementRect(QStyle.SE_PushButtonContents, opt, w).width()
        if not w.icon().isNull():
            need += w.iconSize().width() + 4
        if w.menu() is not None:
            need += 12
        return max(0, need - room - SLACK)
    if isinstance(w, QToolButton):
        if w.toolButtonStyle() == Qt.ToolButtonIconOnly and not w.icon().isNull():
            return 0
        # the tool button's own hint is its text plus frame and menu arrow
        return max(0, w.sizeHint().width() - w.width() - 2)
    return max(0, w.sizeHint().width() - w.width() - 2)


def _edit_cut(w: QLineEdit) -> int:
    text = w.text() or ""
    if not text:
        return 0
    fm = w.fontMetrics()
    m = w.textMargins()
    room = w.contentsRect().width() - m.left() - m.right() - 4  # QLineEdit's own 2 px each side
    return max(0, fm.horizontalAdvance(text) - room - SLACK)


def _plot_clipped(view) -> list[str]:
    """A view (a PlotWidget or a GraphicsLayoutWidget) whose plots are wider than it: their right part is cut off
    (a sideways overflow no scroll bar shows)."""
    ci = getattr(view, "centralWidget", None)
    if ci is not None and ci.geometry().width() > view.viewport().width() + 1:
        return [f"{_name(view)}: plots {ci.geometry().width():.0f} px wide in a {view.viewport().width()} px view "
                "(their minimum is wider than the view: clipped)"]
    return []


def _plot_cuts(view) -> list[str]:
    """The pyqtgraph plots of a view (a PlotWidget or a GraphicsLayoutWidget): a title wider than its plot,
    an axis label longer than its axis, a text item out of its plot."""
    import pyqtgraph as pg

    out = []
    shown = view.mapToScene(view.viewport().rect()).boundingRect().adjusted(-4, -4, 4, 4)
    for pi in [i for i in view.scene().items() if isinstance(i, pg.PlotItem) and i.isVisible()]:
        title = getattr(pi, "titleLabel", None)
        if title is not None and title.isVisible() and title.text:
            r = title.item.sceneBoundingRect()
            if r.width() > pi.width() + 2 or not shown.contains(r):
                out.append(f"{_name(view)}: plot title {title.text[:60]!r} ({r.width():.0f} px) not inside its "
                           f"plot ({pi.width():.0f} px) and view")
        vb_rect = pi.vb.sceneBoundingRect().adjusted(-1, -1, 1, 1)
        for it in pi.items:
            if isinstance(it, pg.TextItem) and it.isVisible() and it.textItem.toPlainText().strip():
                r = it.sceneBoundingRect()
                if r.width() > 0 and not vb_rect.contains(r):
                    out.append(f"{_name(view)}: plot text {it.textItem.toPlainText()[:40]!r} runs out of its plot")
        for side in ("left", "bottom", "right"):
            if side not in pi.axes:
                continue
            ax = pi.getAxis(side)
            if not ax.isVisible() or not ax.label.isVisible() or not ax.labelText:
                continue
            need = ax.label.boundingRect().width()
            room = ax.height() if side in ("left", "right") else ax.width()
            if need > room + 2:
                out.append(f"{_name(view)}: {side} axis label {ax.labelText!r} needs {need:.0f} px, has {room:.0f}")
    return out


def _on_screen(w) -> bool:
    """Visible, some part inside every ancestor (a dock's scroll area, a splitter), and in a raised dock."""
    from PySide6.QtCore import QPoint, QRect
    from PySide6.QtWidgets import QDockWidget

    if not w.isVisible() or w.width() <= 0 or w.height() <= 0:
        return False
    top = w.window()
    r = QRect(w.mapTo(top, QPoint(0, 0)), w.size())
    p = w.parentWidget()
    while p is not None and p is not top:
        r = r.intersected(QRect(p.mapTo(top, QPoint(0, 0)), p.size()))
        if isinstance(p, QDockWidget) and p.visibleRegion().isEmpty():
            return False  # a dock tab that is not raised
        p = p.parentWidget()
    return not r.isEmpty()


def cut_text(root: QWidget, plots: bool = True) -> list[str]:
    """Every visible widget under `root` whose text is cut, one line each ("" list: nothing cut), and every plot
    view whose plots are wider than it; with plots=False the titles, axis labels and texts inside pyqtgraph plots
    are not looked at."""
    import pyqtgraph as pg

    out = []
    for w in [root] + root.findChildren(QWidget):
        if not _on_screen(w):
            continue  # hidden, scrolled out of its dock, or in a dock tab that is not the raised one
        if isinstance(w, QComboBox):
            miss = _combo_cut(w)
            what = w.currentText()
        elif isinstance(w, QAbstractSpinBox):
            le = w.findChild(QLineEdit)
            miss = _edit_cut(le) if le is not None else 0
            what = le.text() if le is not None else ""
        elif isinstance(w, QLineEdit):
            if isinstance(w.parentWidget(), (QAbstractSpinBox, QComboBox)):
                continue
            if getattr(w, "_long_text", None) is not None and not w.hasFocus():
                continue  # its whole text is its tooltip (kvviz.ui.layouts.long_text_field)
            miss, what = _edit_cut(w), w.text()
        elif isinstance(w, QAbstractButton):
            if w.parentWidget() is not None and type(w.parentWidget()).__name__ in ("QTabBar", "QDockWidget"):
                continue  # tab scroll arrows, dock float/close buttons
            miss, what = _button_cut(w), w.text()
        elif isinstance(w, QLabel):
            miss, what = _label_cut(w), w.text()
            low = _label_height_cut(w)
            if low > 0 and not miss:
                out.append(f"{_name(w)}: {what[:60]!r} cut vertically by {low} px (height {w.height()})")
        elif isinstance(w, QTabBar):
            for i in range(w.count()):
                if w.isTabVisible(i) and w.tabRect(i).width() < w.tabSizeHint(i).width() - 1:
                    out.append(f"{_name(w)}: tab {w.tabText(i)!r} elided ({w.tabRect(i).width()} of "
                               f"{w.tabSizeHint(i).width()} px)")
            continue
        elif isinstance(w, pg.GraphicsView):
            out += _plot_clipped(w)
            if plots:
                out += _plot_cuts(w)
            continue
        else:
            continue
        if miss > 0:
            out.append(f"{_name(w)}: {what[:60]!r} cut by {miss} px (width {w.width()})")
    return out


def scrolling_docks(win) -> list[str]:
    """Docks on screen whose panel is wider than the dock (it scrolls sideways to show all of it)."""
    from PySide6.QtWidgets import QDockWidget, QScrollArea

    out = []
    for d in win.findChildren(QDockWidget):
        sc = d.widget()
        if not isinstance(sc, QScrollArea) or not d.isVisible() or d.visibleRegion().isEmpty():
            continue
        w, vp = sc.widget(), sc.viewport()
        if w is not None and w.width() > vp.width() + 1:
            out.append(f"{d.objectName()}: panel {w.width()} px wide in a {vp.width()} px dock")
    return out


def tab_bar_is_current(tb, docks) -> bool:
    """Whether a dock tab bar of the main window belongs to the docks as they are arranged now: it lies along
    the edge of a dock of its own tabs, as wide as that dock (QMainWindow keeps the tab bars of earlier
    arrangements at their old places)."""
    titles = {tb.tabText(i) for i in range(tb.count())}
    r = tb.geometry()
    return tb.count() > 0 and any(
        d.windowTitle() in titles and d.geometry().left() == r.left() and d.geometry().width() == r.width()
        and min(abs(d.geometry().bottom() + 1 - r.top()), abs(r.bottom() + 1 - d.geometry().top())) <= 8
        for d in docks)


def stray_tab_bars(win) -> list[str]:
    """Dock tab bars of the main window left from an earlier arrangement of the docks and not hidden, and tab
    bars painted over the central widget (the overview)."""
    from PySide6.QtCore import QRect
    from PySide6.QtWidgets import QDockWidget

    docks = [d for d in win.findChildren(QDockWidget) if d.parentWidget() is win and d.isVisible() and not d.isFloating()]
    bars = [tb for tb in win.findChildren(QTabBar) if tb.parentWidget() is win and tb.isVisible()]
    out = []
    c = win.centralWidget()
    central = QRect(c.mapTo(win, c.rect().topLeft()), c.size()) if c is not None and c.isVisible() else QRect()
    for tb in bars:
        names = " | ".join(tb.tabText(j) for j in range(tb.count()))
        shown = tb.visibleRegion().translated(tb.geometry().topLeft())
        if not tab_bar_is_current(tb, docks):
            out.append(f"tab bar ({names}) at {tb.x()},{tb.y()} is left from an earlier dock arrangement"
                       + (" and painted" if not shown.isEmpty() else ""))
        if central.isValid() and shown.intersects(central):
            out.append(f"tab bar ({names}) at {tb.x()},{tb.y()} painted over the overview")
    return out


def _settle(app, rounds: int = 3) -> None:
    for _ in range(rounds):
        app.processEvents()


def audit_window(win, where: str = "", plots: bool = True) -> list[str]:
    """Cut text, sideways scrolling and stray tab bars over every panel and every tab of `win`: each dock raised
    in turn (a hidden one shown for its turn), each tab of the tab widgets in it shown in turn, each line
    prefixed with the dock (and tab) it was seen in. The raised docks, the current tabs and the hidden docks are
    put back afterwards. plots=False leaves out what is inside the pyqtgraph plots (see cut_text)."""
    from PySide6.QtWidgets import QApplication, QDockWidget, QTabWidget

    app = QApplication.instance()
    prefix = f"{where}: " if where else ""
    docks = [d for d in win.findChildren(QDockWidget) if d.parentWidget() is win]
    raised = [d for d in docks if d.isVisible() and not d.visibleRegion().isEmpty()]
    hidden = [d for d in docks if d.isHidden()]
    out: list[str] = []
    seen: set = set()

    def add(lines, ctx):
        for ln in lines:
            key = ln.split(" (width ")[0]
            if key not in seen:
                seen.add(key)
                out.append(f"{prefix}{ctx}: {ln}")

    _settle(app)
    add(cut_text(win.centralWidget(), plots), "overview")
    add(cut_text(win.statusBar(), plots), "status bar")
    add(stray_tab_bars(win), "window")
    for d in docks:
        if d.isHidden():
            d.show()
        d.raise_()
        _settle(app)
        title = d.windowTitle()
        add(cut_text(d, plots), title)
        add([ln for ln in scrolling_docks(win) if ln.startswith(d.objectName() + ":")], title)
        for tw in d.findChildren(QTabWidget):
            if not tw.isVisible():
                continue
            keep = tw.currentIndex()
            for i in range(tw.count()):
                if not tw.isTabVisible(i) or i == keep:
                    continue
                tw.setCurrentIndex(i)
                _settle(app)
                ctx = f"{title} / {tw.tabText(i)}"
                add(cut_text(tw.widget(i), plots), ctx)
                add([ln for ln in scrolling_docks(win) if ln.startswith(d.objectName() + ":")], ctx)
            tw.setCurrentIndex(keep)
    for d in hidden:
        d.hide()
    for d in raised:
        d.raise_()
    _settle(app)
    add(stray_tab_bars(win), "window")
    return out
