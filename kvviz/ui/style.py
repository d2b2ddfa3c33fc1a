"""Colours, fonts and pyqtgraph defaults shared by every panel."""
from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtGui import QColor

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


def color_bar(values=(0.0, 1.0), label: str = "") -> pg.ColorBarItem:
    """A viridis colour bar (a legend of a heatmap drawn with lut_viridis over fixed levels): not linked to
    the image, its axis runs 0 .. vmax; `set_bar_range` updates it."""
    bar = pg.ColorBarItem(values=values, colorMap=pg.colormap.get("viridis"), interactive=False, width=12,
                          label=label or None)
    return bar


def set_bar_range(bar: pg.ColorBarItem, vmax: float) -> None:
    vmax = float(vmax) if vmax and np.isfinite(vmax) and vmax > 0 else 1.0
    bar.setLevels((0.0, vmax))
