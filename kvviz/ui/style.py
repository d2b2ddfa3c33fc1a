"""Colours, fonts and pyqtgraph defaults shared by every panel."""
from __future__ import annotations

import html
import time

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QEvent, QObject
from PySide6.QtGui import QColor, QFont, QFontMetricsF

# Sequence colours (Tableau 20 order, strong tones first), free blocks grey.
SEQ_COLORS = [
    (31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40), (148, 103, 189),
    (140, 86, 75), (227, 119, 194), (188, 189, 34), (23, 190, 207), (127, 127, 127),
    (174, 199, 232), (255, 187, 120), (152, 223, 138), (255, 152, 150), (197, 176, 213),
    (196, 156, 148), (247, 182, 210), (219, 219, 141), (158, 218, 229), (90, 90, 160),
]
FREE_COLOR = (205, 205, 205)
K_COLOR = (31, 119, 180)
V_COLOR = (214, 39, 40)
REF_COLOR = (40, 40, 40)
Q_COLOR = (255, 127, 14)
ERROR_BG = "#fdecea"
ERROR_FG = "#8a1c13"
WARN_BG = "#fff1c2"
WARN_FG = "#6b4a00"


def seq_color(s: int) -> tuple:
    if s < 0:
        return FREE_COLOR
    base = SEQ_COLORS[s % len(SEQ_COLORS)]
    if s >= len(SEQ_COLORS):  # darken on wrap-around so neighbours differ
        k = 0.75 ** (s // len(SEQ_COLORS))
        base = tuple(int(c * k) for c in base)
    return base


def qcolor(rgb, alpha: int = 255) -> QColor:
    return QColor(int(rgb[0]), int(rgb[1]), int(rgb[2]), alpha)


def kernel_color(i: int) -> tuple:
    return SEQ_COLORS[i % len(SEQ_COLORS)]


def lut_viridis() -> np.ndarray:
    """A 256 x 3 uint8 lookup table for uint8 heatmaps with fixed levels (0, 255)."""
    return pg.colormap.get("viridis").getLookupTable(0.0, 1.0, 256, alpha=False).astype(np.ubyte)


def setup_pyqtgraph() -> None:
    pg.setConfigOptions(antialias=True, background="w", foreground="k", imageAxisOrder="row-major")


def plot_widget(title: str = "", left: str = "", bottom: str = "") -> pg.PlotWidget:
    w = pg.PlotWidget()
    pi = w.getPlotItem()
    if title:
        pi.setTitle(title, size="10pt")
    if left:
        pi.setLabel("left", left)
    if bottom:
        pi.setLabel("bottom", bottom)
    pi.showGrid(x=True, y=True, alpha=0.25)
    w.setMinimumHeight(140)
    return w


def legend_below(plot, columns: int = 3, size: str = "8pt") -> pg.LegendItem:
    """A legend under the plot's bottom axis, in the plot item's own layout: it never covers the data, and
    `plot.plot(name=...)` adds its entries there. At most `columns` columns, fewer when the plot is too
    narrow for them (a legend wider than the plot would hold the plot wider than its view)."""
    legend = pg.LegendItem(labelTextSize=size, colCount=columns)
    legend.setParentItem(plot)
    plot.layout.addItem(legend, 4, 1)
    plot.legend = legend
    legend._max_columns = columns
    view = _view_of(plot)
    if view is not None:  # the view's width decides (the plot's own is held by the legend it fits)
        legend._fitter = _LegendFitter(view, plot, legend)
    add = legend.addItem

    def add_and_fit(item, name):
        add(item, name)
        fit_legend_columns(plot, legend)

    legend.addItem = add_and_fit
    return legend


def fit_legend_columns(plot, legend) -> None:
    """As many columns as the widest entry leaves room for in the view's width less the plot's axes
    (1 .. the legend's maximum); in one column, entries wider than the room are shortened with "..." (the
    hover readout names the series whole): a legend never holds its plot wider than the view."""
    if not legend.items:
        return
    from PySide6.QtCore import Qt

    view = _view_of(plot)
    width = view.viewport().width() if view is not None else plot.width()
    axes = sum(plot.getAxis(s).width() for s in ("left", "right") if plot.getAxis(s).isVisible())
    room = max(60.0, width - axes - 16)
    for _sample, label in legend.items:  # measured whole (an entry shortened before may have room now)
        full = getattr(label, "_full_text", None)
        if full is None or label.text not in (full, getattr(label, "_shown", None)):  # new, or renamed since
            label._full_text = full = label.text
        if label.text != full:
            label.setText(full)
    widest = max(sample.boundingRect().width() + label.itemRect().width() + 16 for sample, label in legend.items)
    cols = int(max(1, min(legend._max_columns, room // max(widest, 1.0))))
    if cols != legend.columnCount:
        legend.setColumnCount(cols)
    if cols == 1 and widest > room:
        for sample, label in legend.items:
            fm = QFontMetricsF(label.item.font())
            keep = room - sample.boundingRect().width() - 24
            short = fm.elidedText(label._full_text, Qt.ElideMiddle, max(20.0, keep))
            if short != label.text:
                label._shown = short
                label.setText(short)


class _LegendFitter(QObject):
    """Fits a legend's columns to its view whenever the view is resized or shown."""

    def __init__(self, view, plot, legend):
        super().__init__(view)
        self.plot, self.legend = plot, legend
        view.installEventFilter(self)

    def eventFilter(self, obj, ev) -> bool:  # noqa: N802 - Qt naming
        if ev.type() in (QEvent.Resize, QEvent.Show):
            try:
                fit_legend_columns(self.plot, self.legend)
            except RuntimeError:  # the plot is gone
                pass
        return False




def fit_title(plot, parts, size: str = "9pt", share: float = 1.0) -> None:
    """Set a plot's title from `parts`: joined with ", " on one line while that fits, broken into as many
    lines as it needs otherwise (a part wider than the plot at its spaces, the font down to 7pt if a word
    still is), so that a narrow dock never cuts it. The room is the plot's view box (the title's column):
    the title itself holds no width (see `_title_holds_no_width`), so the plot's width is the view's and the
    view box's width says how much there is. Before the plot is laid out, `share` of its view's width
    less its axes stands in. The title is fitted again whenever the view or the view box is resized."""
    parts = [str(p) for p in parts if str(p)]
    plot._fit_title = (parts, size, share)
    _title_holds_no_width(plot.titleLabel)
    view = _view_of(plot)
    if view is not None and getattr(view, "_title_fitter", None) is None:
        view._title_fitter = _TitleFitter(view)
    if view is not None:
        view._title_fitter.plots[id(plot)] = plot
    if not getattr(plot, "_fit_title_hooked", False):  # the axes' widths settle after the view's resize
        plot._fit_title_hooked = True
        plot.vb.sigResized.connect(lambda *_: _refit_later(plot))
        plot.geometryChanged.connect(lambda: _refit_later(plot))
    _refit_title(plot)


def _title_holds_no_width(label) -> None:
    """pyqtgraph's LabelItem makes its text's width its minimum width (LabelItem.updateMin, run on every
    setText and every resize). A plot's title then holds the plot, and with it the view's whole layout,
    at the width of the title's text: where that is wider than the view the layout overflows the view and
    its right part (a right axis, a colour bar) is clipped, and a title wrapped later to a narrower width
    leaves the layout as wide as it was until the view is resized again. A fitted title keeps its height
    as its minimum but no width: fit_title wraps the text to the width the plot gets instead."""
    if getattr(label, "_holds_no_width", False):
        return
    from PySide6.QtCore import Qt

    def update_min():
        h = label.itemRect().height()
        label.setMinimumWidth(0)
        label.setMinimumHeight(h)
        label._sizeHint = {Qt.SizeHint.MinimumSize: (0, h), Qt.SizeHint.PreferredSize: (0, h),
                           Qt.SizeHint.MaximumSize: (-1, -1), Qt.SizeHint.MinimumDescent: (0, 0)}
        label.updateGeometry()

    label.updateMin = update_min  # the instance's own: LabelItem.setText/resizeEvent call self.updateMin()
    label._holds_no_width = True
    update_min()


def _refit_later(plot) -> None:
    """Refit once the current layout pass is over (coalesced)."""
    from PySide6.QtCore import QTimer

    if getattr(plot, "_fit_title_pending", False):
        return
    plot._fit_title_pending = True

    def run():
        plot._fit_title_pending = False
        try:
            _refit_title(plot)
        except RuntimeError:  # the plot is gone (the window closed)
            pass

    QTimer.singleShot(0, run)


def _scroll_of(view):
    """The scroll area (a dock's PanelScroll) the view is in, if any."""
    from PySide6.QtWidgets import QScrollArea

    p = view.parentWidget()
    while p is not None:
        if isinstance(p, QScrollArea) and p.widget() is not None and p.widget().isAncestorOf(view):
            return p
        p = p.parentWidget()
    return None


def _view_of(plot):
    sc = plot.scene()
    views = sc.views() if sc is not None else []
    return views[0] if views else None


class _TitleFitter(QObject):
    def __init__(self, view):
        super().__init__(view)
        self.plots = {}
        self.view = view
        self.hooked = None
        self.pending = False
        view.installEventFilter(self)

    def hook_scroll(self) -> None:
        """Also refit when the dock's scroll area is resized (a panel held wide by its titles does not shrink)."""
        sc = _scroll_of(self.view)
        if sc is not None and sc is not self.hooked:
            self.hooked = sc
            sc.viewport().installEventFilter(self)

    def eventFilter(self, obj, ev) -> bool:  # noqa: N802 - Qt naming
        if ev.type() in (QEvent.Resize, QEvent.Show):
            for plot in list(self.plots.values()):  # once the view's own resize has laid the plots out
                _refit_later(plot)
        return False


def title_lines(parts, font, room: float) -> list[str]:
    """`parts` joined with ", " into lines no wider than `room`; a part wider than that is broken at its spaces
    (a single word wider than `room` is a line of its own: the caller shrinks the font for it)."""
    fm = QFontMetricsF(font)
    pieces: list[tuple[str, bool]] = []  # (text, whether it begins a part)
    for p in parts:
        words = p.split(" ")
        if fm.horizontalAdvance(p) <= room or len(words) == 1:
            pieces.append((p, True))
            continue
        line, first = words[0], True
        for wd in words[1:]:
            if fm.horizontalAdvance(line + " " + wd) > room:
                pieces.append((line, first))
                line, first = wd, False
            else:
                line += " " + wd
        pieces.append((line, first))
    lines: list[str] = []
    for text, starts in pieces:
        if not lines:
            lines.append(text)
        elif not starts:  # the rest of a part broken at a space
            lines.append(text)
        elif fm.horizontalAdvance(lines[-1] + ", " + text) <= room:
            lines[-1] += ", " + text
        else:
            lines[-1] += ","
            lines.append(text)
    return lines


def _title_room(plot, share: float) -> float:
    """Pixels of text a fitted title may take: its view box's width (the title's column) less the title item's
    document margins, less the part of the panel scrolled out of its dock."""
    view = _view_of(plot)
    doc = plot.titleLabel.item.document().documentMargin() * 2
    off = 0.0
    if view is not None:
        sc = _scroll_of(view)
        if sc is not None:  # the panel is wider than its dock: the title gets the part of the view on screen
            off = max(0, sc.widget().width() - sc.viewport().width())
    vbw = plot.vb.width()
    if vbw >= 1 and plot.width() >= 1:
        return vbw - doc - off
    # not laid out yet: the plot's share of its view, less its axes (and the layouts' margins)
    width = view.viewport().width() if view is not None else plot.width()
    axes = sum(plot.getAxis(s).width() for s in ("left", "right") if plot.getAxis(s).isVisible())
    return width * share - axes - doc - off - 20


def _refit_title(plot) -> None:
    parts, size, share = getattr(plot, "_fit_title", ([], "9pt", 1.0))
    if not parts:
        return
    view = _view_of(plot)
    if view is not None:
        fitter = getattr(view, "_title_fitter", None)
        if fitter is not None:
            fitter.hook_scroll()
    room = max(40.0, _title_room(plot, share))
    pt = float(size.rstrip("pt"))
    font = QFont(plot.titleLabel.item.font())
    while True:  # the given size while every line fits, smaller (down to 7pt) for a word wider than the plot
        font.setPointSizeF(pt)
        lines = title_lines(parts, font, room)
        fm = QFontMetricsF(font)
        if pt <= 7 or max(fm.horizontalAdvance(x) for x in lines) <= room:
            break
        pt -= 0.5
    text = "<br>".join(html.escape(x, quote=False) for x in lines)
    new_size = f"{pt:g}pt"
    if text != plot.titleLabel.text or new_size != plot.titleLabel.opts.get("size"):
        # a title whose line count flips back and forth (its height changes the axes' tick labels, their
        # width the room) settles on the narrower text
        now, hist = time.monotonic(), getattr(plot, "_fit_title_history", [])
        hist = [(t, x) for t, x in hist if now - t < 1.0] + [(now, text)]
        plot._fit_title_history = hist[-8:]
        if len(hist) >= 6 and len({x for _, x in hist[-6:]}) <= 2:
            text = max((x for _, x in hist[-6:]), key=lambda x: x.count("<br>"))
            if text == plot.titleLabel.text:
                return
        plot.setTitle(text, size=new_size)
        h = max(30.0, plot.titleLabel.item.boundingRect().height() + 2)  # pyqtgraph fixes the row at 30 px: one line
        plot.titleLabel.setMaximumHeight(h)
        plot.layout.setRowFixedHeight(0, h)
    ci = getattr(view, "centralWidget", None) if view is not None else None
    rng = getattr(view, "range", None) if view is not None else None
    if ci is not None and rng is not None and ci.geometry().width() > rng.width() + 0.5:
        ci.setGeometry(rng)  # the view's plots back to the view's width (a title's minimum had held them wider)
