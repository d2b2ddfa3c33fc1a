"""Render widgets to PNG (at a chosen device pixel ratio) and to fully vector SVG (through QSvgGenerator).

pyqtgraph's SVGExporter fails with PySide6 >= 6.11 (pyqtgraph#3485), so SVG export paints the widget
(and with it every pyqtgraph scene inside it) into a QSvgGenerator. What would otherwise reach the SVG as
a bitmap is drawn as vectors while it is painted: the graphics views' cached backgrounds (a full-size white
PNG each), scatter symbols (a pixmap atlas on screen) and images (heatmaps, the block-pool grid), which are
drawn as one rectangle per run of equal pixels. The hover crosshairs and readouts are hidden.

`ExportDialog` asks the size (the layout's, in logical pixels) and the DPI of a PNG or SVG figure.
"""
from __future__ import annotations

import contextlib

import numpy as np
from PySide6.QtCore import QPoint, QRect, QRectF, QSize, Qt
from PySide6.QtGui import QColor, QImage, QPainter
from PySide6.QtSvg import QSvgGenerator
from PySide6.QtWidgets import (
    QApplication, QDialog, QDialogButtonBox, QFormLayout, QGraphicsItem, QLabel, QSpinBox, QWidget,
)

SCREEN_DPI = 96.0  # logical pixels per inch: a figure of W px at this DPI is W / 96 inches wide
MAX_VECTOR_RECTS = 60000  # an image needing more rectangles than this stays a bitmap in the SVG


def _settle(widget: QWidget) -> None:
    """Make sure layouts and pyqtgraph ranges are up to date before painting."""
    if widget.layout() is not None:
        widget.layout().activate()
    QApplication.processEvents()


@contextlib.contextmanager
def _sized(widget: QWidget, size: QSize | None):
    """The widget at `size` (logical pixels) while the block runs, then at its own size again."""
    if size is None or size == widget.size():
        yield
        return
    old_min, old_max, old = widget.minimumSize(), widget.maximumSize(), widget.size()
    widget.setFixedSize(size)
    _settle(widget)
    try:
        yield
    finally:
        widget.setMinimumSize(old_min)
        widget.setMaximumSize(old_max)
        widget.resize(old)
        QApplication.processEvents()


def grab_image(widget: QWidget, dpr: float = 2.0) -> QImage:
    """The widget painted into an image of dpr x its size (logical size unchanged)."""
    _settle(widget)
    size = widget.size()
    img = QImage(QSize(int(round(size.width() * dpr)), int(round(size.height() * dpr))), QImage.Format_ARGB32)
    img.setDevicePixelRatio(dpr)
    img.fill(widget.palette().window().color() if widget.autoFillBackground() else QColor("white"))
    p = QPainter(img)
    try:
        p.setRenderHint(QPainter.Antialiasing, True)
        p.setRenderHint(QPainter.TextAntialiasing, True)
        with _hover_hidden(widget):
            widget.render(p, QPoint(0, 0))
    finally:
        p.end()
    return img


def save_png(widget: QWidget, path: str, dpr: float = 2.0, size: QSize | None = None) -> str:
    """The widget as a PNG of `size` logical pixels (default its own) times `dpr` (2: 192 DPI)."""
    with _sized(widget, size), _no_scroll_bars(widget):
        img = grab_image(widget, dpr)
    if not img.save(str(path), "PNG"):
        raise OSError(f"could not write {path}")
    return str(path)


# ------------------------------------------------------------------------------------------- scenes
def _scenes(widget: QWidget) -> list:
    import pyqtgraph as pg

    views = widget.findChildren(pg.GraphicsView)
    if isinstance(widget, pg.GraphicsView):
        views.append(widget)
    return [v for v in views if v.scene() is not None]


def _scene_items(widget: QWidget, kind) -> list:
    return [it for v in _scenes(widget) for it in v.scene().items() if isinstance(it, kind)]


@contextlib.contextmanager
def _hover_hidden(widget: QWidget):
    """Hover crosshairs and readouts (kvviz.ui.widgets.hover) hidden while a figure is painted."""
    from PySide6.QtWidgets import QGraphicsItem as _Item

    shown = [it for it in _scene_items(widget, _Item) if getattr(it, "kvviz_hover", False) and it.isVisible()]
    for it in shown:
        it.hide()
    try:
        yield
    finally:
        for it in shown:
            it.show()


@contextlib.contextmanager
def _no_scroll_bars(widget: QWidget):
    """Tables and text views without their scroll bars while a figure is painted (a figure does not scroll, and
    the style draws a scroll bar's arrows from bitmaps)."""
    from PySide6.QtWidgets import QAbstractScrollArea

    import pyqtgraph as pg

    areas = [(a, a.horizontalScrollBarPolicy(), a.verticalScrollBarPolicy())
             for a in widget.findChildren(QAbstractScrollArea) if not isinstance(a, pg.GraphicsView)]
    for a, _h, _v in areas:
        a.setHorizontalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
        a.setVerticalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
    if areas:
        _settle(widget)
    try:
        yield
    finally:
        for a, h, v in areas:
            a.setHorizontalScrollBarPolicy(h)
            a.setVerticalScrollBarPolicy(v)


@contextlib.contextmanager
def _uncached(widget: QWidget):
    """The views paint their backgrounds directly: a cached background reaches an SVG as a bitmap."""
    from PySide6.QtWidgets import QGraphicsView

    views = [(v, v.cacheMode()) for v in _scenes(widget)]
    for v, _ in views:
        v.setCacheMode(QGraphicsView.CacheNone)
    try:
        yield
    finally:
        for v, mode in views:
            v.setCacheMode(mode)


class _VectorScatter:
    """While painting into an SVG: scatter points as vector symbols. pyqtgraph draws them from a pixmap
    atlas on screen (one embedded bitmap per point in an SVG); in export mode it draws each symbol."""

    def __init__(self, widget: QWidget):
        import pyqtgraph as pg

        self.items = _scene_items(widget, pg.ScatterPlotItem)

    def __enter__(self):
        for it in self.items:
            it.setExportMode(True, {"antialias": True})
        return self

    def __exit__(self, *exc):
        for it in self.items:
            it.setExportMode(False)


def pixel_rects(rgba: np.ndarray) -> list[tuple[int, int, int, int, int]]:
    """An image [rows, cols] of packed colours as rectangles (x, y, width, height, colour): runs of equal
    pixels along each row, merged down the rows while the same run repeats (a cell of a grid is one)."""
    rgba = np.asarray(rgba)
    rows, cols = rgba.shape
    done, open_ = [], {}
    for y in range(rows):
        row = rgba[y]
        cut = np.flatnonzero(row[1:] != row[:-1]) + 1
        starts = np.concatenate([[0], cut])
        ends = np.concatenate([cut, [cols]])
        now = {}
        for x0, x1 in zip(starts.tolist(), ends.tolist()):
            key = (x0, x1, int(row[x0]))
            if key in open_:
                now[key] = open_.pop(key)
            else:
                now[key] = y
        for (x0, x1, c), y0 in open_.items():
            done.append((x0, y0, x1 - x0, y - y0, c))
        open_ = now
    for (x0, x1, c), y0 in open_.items():
        done.append((x0, y0, x1 - x0, rows - y0, c))
    return done


class _VectorImage(QGraphicsItem):
    """An ImageItem's picture as filled rectangles (its pixels' colours after its lookup table and levels)."""

    def __init__(self, image_item, rects):
        super().__init__(image_item.parentItem())
        self.setTransform(image_item.transform())
        self.setPos(image_item.pos())
        self.setZValue(image_item.zValue())
        self.setOpacity(image_item.opacity())
        self.rects = rects
        self.bounds = image_item.boundingRect()
        # a pixmap item draws its pixmap at its offset, in its own coordinates (bounds include it)
        off = image_item.offset() if hasattr(image_item, "offset") else None
        self.dx, self.dy = (off.x(), off.y()) if off is not None else (0.0, 0.0)

    def boundingRect(self):  # noqa: N802 - Qt's name
        return self.bounds

    def paint(self, p, *args) -> None:
        p.setPen(Qt.NoPen)
        p.setRenderHint(QPainter.Antialiasing, False)
        for x, y, w, h, c in self.rects:
            if (c >> 24) == 0:  # transparent
                continue
            # a hair wider and taller than the cell: no seam of background between neighbours in a viewer
            p.fillRect(QRectF(x + self.dx, y + self.dy, w + 0.02, h + 0.02), QColor.fromRgba(c))


@contextlib.contextmanager
def _vector_images(widget: QWidget):
    import pyqtgraph as pg
    from pyqtgraph.functions import ndarray_from_qimage

    from PySide6.QtWidgets import QGraphicsPixmapItem

    swapped = []
    for it in _scene_items(widget, (pg.ImageItem, QGraphicsPixmapItem)):
        if not it.isVisible():
            continue
        if isinstance(it, QGraphicsPixmapItem):  # a colour bar's gradient
            qimage = it.pixmap().toImage() if not it.pixmap().isNull() else None
        else:
            if it.image is None:
                continue
            if it.qimage is None:
                it.render()
            qimage = it.qimage
        if qimage is None or qimage.isNull():
            continue
        arr = ndarray_from_qimage(qimage.convertToFormat(QImage.Format_ARGB32))
        packed = arr.view(np.uint32).reshape(arr.shape[0], arr.shape[1])
        rects = pixel_rects(packed)
        if len(rects) > MAX_VECTOR_RECTS:
            continue
        vec = _VectorImage(it, rects)
        it.hide()
        swapped.append((it, vec))
    try:
        yield
    finally:
        for it, vec in swapped:
            scene = vec.scene()
            if scene is not None:
                scene.removeItem(vec)
            it.show()


def save_svg(widget: QWidget, path: str, title: str = "", size: QSize | None = None, dpi: float = SCREEN_DPI) -> str:
    """The widget as a vector SVG of `size` logical pixels (default its own); `dpi` sets its physical size
    (width / dpi inches), as a document that places it reads it."""
    with _sized(widget, size), _no_scroll_bars(widget):
        _settle(widget)
        size = widget.size()
        gen = QSvgGenerator()
        gen.setFileName(str(path))
        gen.setSize(size)
        gen.setViewBox(QRect(0, 0, size.width(), size.height()))
        gen.setResolution(int(round(dpi)))
        gen.setTitle(title or widget.windowTitle() or "kvviz")
        gen.setDescription("kvviz panel")
        p = QPainter()
        if not p.begin(gen):
            raise OSError(f"could not write {path}")
        try:
            p.fillRect(QRect(0, 0, size.width(), size.height()), Qt.white)
            with _uncached(widget), _VectorScatter(widget), _vector_images(widget), _hover_hidden(widget):
                widget.render(p, QPoint(0, 0))
        finally:
            p.end()
    return str(path)


# ------------------------------------------------------------------------------------------- dialog
class ExportDialog(QDialog):
    """Size and DPI of an exported figure: width and height in logical pixels (the panel's layout at that
    size) and the DPI (a PNG's pixels: size x DPI / 96; an SVG's physical size: size / DPI inches)."""

    def __init__(self, fmt: str, size: QSize, parent=None):
        super().__init__(parent)
        self.fmt = fmt
        self.setWindowTitle(f"Export as {fmt.upper()}")
        form = QFormLayout(self)
        self.width_box, self.height_box = QSpinBox(), QSpinBox()
        for box, v in ((self.width_box, size.width()), (self.height_box, size.height())):
            box.setRange(120, 8000)
            box.setSuffix(" px")
            box.setValue(int(v))
            box.valueChanged.connect(self._update_note)
        self.dpi_box = QSpinBox()
        self.dpi_box.setRange(48, 1200)
        self.dpi_box.setValue(192 if fmt == "png" else 96)
        self.dpi_box.setSuffix(" DPI")
        self.dpi_box.valueChanged.connect(self._update_note)
        form.addRow("Width", self.width_box)
        form.addRow("Height", self.height_box)
        form.addRow("Resolution", self.dpi_box)
        self.note = QLabel("")
        self.note.setWordWrap(True)
        form.addRow(self.note)
        buttons = QDialogButtonBox(QDialogButtonBox.Ok | QDialogButtonBox.Cancel)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        form.addRow(buttons)
        self._update_note()

    def figure_size(self) -> QSize:
        return QSize(self.width_box.value(), self.height_box.value())

    def dpi(self) -> int:
        return self.dpi_box.value()

    def _update_note(self) -> None:
        w, h, dpi = self.width_box.value(), self.height_box.value(), self.dpi_box.value()
        inches = f"{w / dpi:.2f} x {h / dpi:.2f} in ({w / dpi * 25.4:.0f} x {h / dpi * 25.4:.0f} mm)"
        if self.fmt == "png":
            k = dpi / SCREEN_DPI
            self.note.setText(f"An image of {round(w * k)} x {round(h * k)} pixels, {inches} at {dpi} DPI.")
        else:
            self.note.setText(f"Vector graphics, {inches} when placed at {dpi} DPI.")
