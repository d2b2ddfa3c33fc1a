"""The block pools of a live decode's paged caches as grids, one band per cache (f32, quant, free run),
filling as the sequence grows; the blocks allocated by the last step are outlined.

It draws the `PoolBand`s of kvviz.live.run.LiveRun.pool_bands with the Cache layout panel's cell
image (kvviz.ui.panels.cache_layout.pool_image).
"""
from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QRectF
from PySide6.QtGui import QColor, QPen
from PySide6.QtWidgets import QGraphicsRectItem, QLabel, QSizePolicy, QVBoxLayout, QWidget

from kvviz.ui.style import FREE_COLOR, seq_color


CELL = 12  # pixels of one block cell in the grid image (1 px gap included)


def pool_image(owner: np.ndarray, fill: np.ndarray, block_size: int, cols: int, cell: int = CELL) -> np.ndarray:
    """RGB uint8 image [rows*cell, cols*cell, 3] of the pool (row-major, block b at row b // cols)."""
    n = len(owner)
    rows = max(1, -(-n // cols))
    img = np.full((rows * cell, cols * cell, 3), 255, dtype=np.uint8)
    inner = cell - 1
    for b in range(n):
        r, c = divmod(b, cols)
        y0, x0 = r * cell, c * cell
        s = int(owner[b])
        if s < 0:
            img[y0:y0 + inner, x0:x0 + inner] = FREE_COLOR
            continue
        col = np.array(seq_color(s), dtype=np.float64)
        light = (col * 0.3 + 255 * 0.7).astype(np.uint8)
        img[y0:y0 + inner, x0:x0 + inner] = light
        w = int(round(inner * min(1.0, fill[b] / block_size)))
        if fill[b] > 0:
            w = max(1, w)
        img[y0:y0 + inner, x0:x0 + w] = col.astype(np.uint8)
    return img



class PoolGrid(QWidget):
    """`draw(bands, ...)` shows the pools; `cells` = allocated blocks drawn per band key."""

    def __init__(self, parent=None):
        super().__init__(parent)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.setSpacing(1)
        self.view = pg.GraphicsLayoutWidget()
        self.view.setMinimumHeight(60)
        self.plot = self.view.addPlot()
        self.plot.setMouseEnabled(x=False, y=False)
        self.plot.setMenuEnabled(False)
        self.plot.hideButtons()
        self.plot.invertY(True)
        self.plot.setAspectLocked(True)
        self.plot.hideAxis("bottom")
        self.plot.setTitle("block pools", size="9pt")
        self.image = pg.ImageItem(axisOrder="row-major")
        self.plot.addItem(self.image)
        self._new_rects: list = []
        lay.addWidget(self.view, 1)
        self.label = QLabel("")
        self.label.setWordWrap(True)
        self.label.setStyleSheet("font-size: 8pt; color: #44505c;")
        self.label.setSizePolicy(QSizePolicy.Ignored, QSizePolicy.Preferred)
        lay.addWidget(self.label)
        self.cells: dict = {}  # band key -> allocated blocks drawn

    def clear(self) -> None:
        self.image.clear()
        self._clear_new_rects()
        self.label.setText("")

    def _clear_new_rects(self) -> None:
        for r in self._new_rects:
            self.plot.removeItem(r)
        self._new_rects = []

    def columns(self, n: int, bands: int, gap: int) -> int:
        """Columns of each pool's grid that make the cells largest in the view (at most 64)."""
        vw, vh = max(self.view.width() - 60, 50), max(self.view.height() - 30, 30)
        best, best_scale = min(n, 32), 0.0
        for cols in range(1, min(n, 64) + 1):
            rows = -(-n // cols)
            w, h = cols * CELL, bands * (rows * CELL + gap)
            scale = min(vw / w, vh / h)
            if scale > best_scale * 1.05:  # prefer fewer rows on a near tie
                best, best_scale = cols, scale
        return best

    def draw(self, bands: list, num_blocks: int, block_size: int, context_len: int, policy: str,
             highlight: bool, quant_new: list | None = None) -> None:
        """The pools of `num_blocks` blocks of `block_size` tokens; with `highlight` each band's new blocks
        outlined and the quantised cache's named in the label."""
        self._clear_new_rects()
        n = num_blocks
        if n <= 0:
            return
        gap = CELL // 2
        cols = self.columns(n, len(bands), gap)
        rows = -(-n // cols)
        band_h = rows * CELL
        img = np.full((len(bands) * (band_h + gap) - gap, cols * CELL, 3), 255, np.uint8)
        ticks = []
        self.cells = {}
        for i, band in enumerate(bands):
            y0 = i * (band_h + gap)
            img[y0:y0 + band_h] = pool_image(band.owner, band.fill, block_size, cols)
            self.cells[band.key] = int((band.owner >= 0).sum())
            ticks.append((y0 + band_h / 2, band.label))
            for b in band.new if highlight else ():
                r, c = divmod(int(b), cols)
                rect = QGraphicsRectItem(c * CELL - 0.5, y0 + r * CELL - 0.5, CELL, CELL)
                pen = QPen(QColor(0, 0, 0))
                pen.setWidthF(2.0)
                pen.setCosmetic(True)
                rect.setPen(pen)
                self.plot.addItem(rect)
                self._new_rects.append(rect)
        self.image.setImage(img, levels=(0, 255), autoLevels=False)
        self.image.setRect(QRectF(0, 0, img.shape[1], img.shape[0]))
        self.plot.getAxis("left").setTicks([ticks, []])
        self.plot.setRange(QRectF(0, 0, img.shape[1], img.shape[0]), padding=0.03)
        q = next((b.blocks for b in bands if b.key == "quant"), [])
        new = ", ".join(str(b) for b in (quant_new or [])) if highlight else ""
        self.label.setText(
            f"{n} blocks x {block_size} tokens per pool ({policy}),"
            f" {context_len} tokens cached. quant block table: {q}" + (f"; new this step: {new}" if new else ""))
