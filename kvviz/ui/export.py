"""Render widgets to PNG (at 2x device pixel ratio) and SVG (through QSvgGenerator).

pyqtgraph's SVGExporter fails with PySide6 >= 6.11 (pyqtgraph#3485), so SVG export paints the
widget (and with it every pyqtgraph scene inside it) into a QSvgGenerator instead.
"""
from __future__ import annotations

from PySide6.QtCore import QPoint, QRect, QSize, Qt
from PySide6.QtGui import QColor, QImage, QPainter
from PySide6.QtSvg import QSvgGenerator
from PySide6.QtWidgets import QApplication, QWidget


def _settle(widget: QWidget) -> None:
    """Make sure layouts and pyqtgraph ranges are up to date before painting."""
    if widget.layout() is not None:
        widget.layout().activate()
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
        widget.render(p, QPoint(0, 0))
    finally:
        p.end()
    return img


def save_png(widget: QWidget, path: str, dpr: float = 2.0) -> str:
    img = grab_image(widget, dpr)
    if not img.save(str(path), "PNG"):
        raise OSError(f"could not write {path}")
    return str(path)


class _VectorScatter:
    """While painting into an SVG: scatter points as vector symbols. pyqtgraph draws them from a pixmap
    atlas on screen (one embedded bitmap per point in an SVG); in export mode it draws each symbol."""

    def __init__(self, widget: QWidget):
        import pyqtgraph as pg

        views = widget.findChildren(pg.GraphicsView)
        if isinstance(widget, pg.GraphicsView):
            views.append(widget)
        self.items = [it for v in views if v.scene() is not None for it in v.scene().items()
                      if isinstance(it, pg.ScatterPlotItem)]

    def __enter__(self):
        for it in self.items:
            it.setExportMode(True, {"antialias": True})
        return self

    def __exit__(self, *exc):
        for it in self.items:
            it.setExportMode(False)


def save_svg(widget: QWidget, path: str, title: str = "") -> str:
    _settle(widget)
    size = widget.size()
    gen = QSvgGenerator()
    gen.setFileName(str(path))
    gen.setSize(size)
    gen.setViewBox(QRect(0, 0, size.width(), size.height()))
    gen.setTitle(title or widget.windowTitle() or "kvviz")
    gen.setDescription("kvviz panel")
    p = QPainter()
    if not p.begin(gen):
        raise OSError(f"could not write {path}")
    try:
        p.fillRect(QRect(0, 0, size.width(), size.height()), Qt.white)
        with _VectorScatter(widget):
            widget.render(p, QPoint(0, 0))
    finally:
        p.end()
    return str(path)
