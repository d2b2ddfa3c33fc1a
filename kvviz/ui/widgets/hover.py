"""Hover readouts and crosshairs for pyqtgraph plots (as in Nsight and Perfetto views).

`Hover(plot, describe)` draws a dashed crosshair at the mouse and a readout box beside it: what
`describe(x, y)` says about the point under the mouse (the nearest data point, a bar, a heatmap cell),
or else the mouse's coordinates in the axes' units (UnitAxis.value_text). The box flips to the other side
of the mouse near the view's right and bottom edges, so it stays inside the data. A click emits `clicked`
with the same view coordinates. Crosshair and readout are hidden when the mouse leaves the view and while a
figure is exported (kvviz.ui.export hides every item marked `kvviz_hover`).
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QObject, QPointF, Qt, Signal

from kvviz.ui.widgets.axes import UnitAxis


def _axis_text(plot, side: str, v: float) -> str:
    axis = plot.getAxis(side)
    if isinstance(axis, UnitAxis):
        return axis.value_text(v)
    return f"{(10.0 ** v if axis.logMode else v):.4g}"


def nearest(xs, ys, x: float, y: float, vb, max_px: float = 24.0) -> int | None:
    """Index of the data point (view coordinates xs, ys) nearest to (x, y) on screen, within max_px pixels."""
    xs, ys = np.asarray(xs, np.float64), np.asarray(ys, np.float64)
    if xs.size == 0:
        return None
    px, py = vb.viewPixelSize()
    if not (px > 0 and py > 0):
        return None
    d = np.hypot((xs - x) / px, (ys - y) / py)
    d[~np.isfinite(d)] = np.inf
    i = int(np.argmin(d))
    return i if d[i] <= max_px else None


class Hover(QObject):
    clicked = Signal(float, float)  # view coordinates of a left click in the plot's view

    def __init__(self, plot, describe: Callable[[float, float], str | None] | None = None,
                 crosshair: str = "xy", parent=None):
        super().__init__(parent)
        self.plot = plot
        self.describe = describe
        self.vb = plot.getViewBox()
        pen = pg.mkPen((90, 90, 90, 200), width=1, style=Qt.DashLine)
        self.vline = pg.InfiniteLine(angle=90, pen=pen, movable=False) if "x" in crosshair else None
        self.hline = pg.InfiniteLine(angle=0, pen=pen, movable=False) if "y" in crosshair else None
        self.text = pg.TextItem("", color=(20, 20, 20), anchor=(0, 1), fill=pg.mkBrush(255, 255, 255, 235),
                                border=pg.mkPen((120, 120, 120)))
        self.text.setZValue(1000)
        for item in (self.vline, self.hline, self.text):
            if item is None:
                continue
            item.kvviz_hover = True
            item.hide()
            plot.addItem(item, ignoreBounds=True)
        self.last = ""
        scene = plot.scene()
        scene.sigMouseMoved.connect(self._moved)
        scene.sigMouseClicked.connect(self._clicked)

    def _inside(self, pos) -> bool:
        return self.vb.sceneBoundingRect().contains(pos)

    def hide(self) -> None:
        for item in (self.vline, self.hline, self.text):
            if item is not None:
                item.hide()

    def _moved(self, pos) -> None:
        try:
            if not self._inside(pos):
                self.hide()
                return
            p = self.vb.mapSceneToView(pos)
            self.show_at(p.x(), p.y())
        except RuntimeError:  # the plot is being destroyed
            pass

    def show_at(self, x: float, y: float) -> str:
        """Crosshair and readout at view coordinates (x, y); the readout's text."""
        if self.vline is not None:
            self.vline.setPos(x)
            self.vline.show()
        if self.hline is not None:
            self.hline.setPos(y)
            self.hline.show()
        text = self.describe(x, y) if self.describe is not None else None
        if not text:
            text = f"{_axis_text(self.plot, 'bottom', x)}, {_axis_text(self.plot, 'left', y)}"
        self.last = text
        self.text.setText(text)
        (x0, x1), (y0, y1) = self.vb.viewRange()
        right = (x - x0) > 0.6 * (x1 - x0) if x1 > x0 else False
        inverted = self.vb.state.get("yInverted", False)
        frac = (y - y0) / (y1 - y0) if y1 > y0 else 0.5
        top = (frac > 0.6) != inverted  # near the top edge on screen: the box goes below the mouse
        self.text.setAnchor((1.05 if right else -0.05, -0.1 if top else 1.1))
        self.text.setPos(x, y)
        self.text.show()
        return text

    def _clicked(self, ev) -> None:
        try:
            if ev.button() != Qt.LeftButton or not self._inside(ev.scenePos()):
                return
            p = self.vb.mapSceneToView(ev.scenePos())
        except RuntimeError:
            return
        if math.isfinite(p.x()) and math.isfinite(p.y()):
            self.clicked.emit(p.x(), p.y())

    def click_at(self, x: float, y: float) -> None:
        """What a click at view coordinates (x, y) does (tests and keyboard-driven selection)."""
        self.clicked.emit(float(x), float(y))

    def scene_point(self, x: float, y: float) -> QPointF:
        return self.vb.mapViewToScene(QPointF(x, y))


class PointLabels(QObject):
    """Text labels beside data points that never overlap one another: each is tried right, left, above and
    below its point (in that order) and shown only where it overlaps no label already placed; the rest are
    left to the hover readout. Placed again whenever the view's range or size changes. Labels are given in
    priority order (the first ones are placed first)."""

    def __init__(self, plot, font_pt: float = 8.0, parent=None):
        super().__init__(parent)
        self.plot = plot
        self.vb = plot.getViewBox()
        self.items: list = []  # (x, y, TextItem) in view coordinates
        self.font_pt = font_pt
        self.vb.sigRangeChanged.connect(self.place)
        self.vb.sigResized.connect(self.place)

    def clear(self) -> None:
        for _x, _y, it in self.items:
            self.plot.removeItem(it)
        self.items = []

    def set_labels(self, labels, markers=(), marker_px: float = 6.0) -> None:
        """labels: (x, y, text, rgb) in view coordinates (log axes: log10 positions), most important first;
        markers: (x, y) of every drawn point (default the labels' own), which no label may cover (a square of
        2 x marker_px around each)."""
        from PySide6.QtGui import QFont

        self.clear()
        self.markers = [(float(x), float(y)) for x, y in (markers or [(lb[0], lb[1]) for lb in labels])]
        self.marker_px = marker_px
        for x, y, text, color in labels:
            it = pg.TextItem(str(text), color=color, anchor=(0, 0.5))
            f = QFont(it.textItem.font())
            f.setPointSizeF(self.font_pt)
            it.setFont(f)
            self.plot.addItem(it, ignoreBounds=True)
            self.items.append((float(x), float(y), it))
        self.place()

    def shown(self) -> list[str]:
        return [it.textItem.toPlainText() for _x, _y, it in self.items if it.isVisible()]

    def place(self, *_) -> None:
        from PySide6.QtCore import QRectF

        placed: list = []
        pad = 3.0
        m = getattr(self, "marker_px", 6.0)
        for mx, my in getattr(self, "markers", []):
            if math.isfinite(mx) and math.isfinite(my):
                q = self.vb.mapViewToScene(QPointF(mx, my))
                placed.append(QRectF(q.x() - m, q.y() - m, 2 * m, 2 * m))
        for x, y, it in self.items:
            if not (math.isfinite(x) and math.isfinite(y)):
                it.hide()
                continue
            br = it.textItem.boundingRect()
            w, h = max(br.width(), 1.0), max(br.height(), 1.0)
            p = self.vb.mapViewToScene(QPointF(x, y))
            view = self.vb.sceneBoundingRect()
            spot = None
            # (anchor, scene rect of the text) for right, left, above, below the point
            gap = m + pad + 1.0  # pixels between the point and its label: clear of its own marker
            for anchor, rect in (((-gap / w, 0.5), QRectF(p.x() + gap, p.y() - h / 2, w, h)),
                                 ((1 + gap / w, 0.5), QRectF(p.x() - gap - w, p.y() - h / 2, w, h)),
                                 ((0.5, 1 + gap / h), QRectF(p.x() - w / 2, p.y() - gap - h, w, h)),
                                 ((0.5, -gap / h), QRectF(p.x() - w / 2, p.y() + gap, w, h))):
                if not view.contains(rect):
                    continue
                grown = rect.adjusted(-pad, -pad, pad, pad)
                if any(grown.intersects(r) for r in placed):
                    continue
                spot = (anchor, rect)
                break
            if spot is None:
                it.hide()
                continue
            it.setAnchor(spot[0])
            it.setPos(x, y)
            it.show()
            placed.append(spot[1])
