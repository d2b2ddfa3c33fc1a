"""A zoomable timeline of the last run's timed dispatches: one track per timed kernel, one bar per pass
(warm-up passes grey, timed samples in the kernel's colour), on the device's timestamp clock.

The layout is `kvviz.report.trace.timeline_spans`, the same one the Chrome trace writes. The mouse
wheel zooms the time axis and dragging pans it (the tracks stay put); "Fit" shows everything again.
Hovering a bar names the pass and its duration beside a crosshair; clicking one selects its kernel
(`track_clicked`), which the track shows highlighted.
"""
from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Signal
from PySide6.QtWidgets import QHBoxLayout, QLabel, QPushButton, QVBoxLayout, QWidget

from kvviz import units
from kvviz.report.trace import Span, timeline_spans
from kvviz.ui.style import kernel_color
from kvviz.ui.widgets.axes import set_axis
from kvviz.ui.widgets.hover import Hover

WARMUP_COLOR = (150, 150, 150)
BAR_HEIGHT = 0.7


class TimelineWidget(QWidget):
    track_clicked = Signal(int)  # the track (timed kernel) of a clicked pass

    def __init__(self, parent=None):
        super().__init__(parent)
        self.spans: list[Span] = []
        self.tracks: list[str] = []
        self.timed_bars = self.warm_bars = None
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        row = QHBoxLayout()
        self.summary = QLabel("No run yet.")
        self.summary.setWordWrap(True)  # the run's summary wraps in a narrow dock instead of widening it
        row.addWidget(self.summary, 1)
        self.fit_button = QPushButton("Fit")
        self.fit_button.setToolTip("Show the whole run (the wheel zooms the time axis, dragging pans it)")
        self.fit_button.clicked.connect(self.fit)
        row.addWidget(self.fit_button)
        lay.addLayout(row)
        self.plot = pg.PlotWidget()
        pi = self.plot.getPlotItem()
        set_axis(pi, "bottom", "time since start", "s", 1e-6)  # from the run's first timestamp; spans in microseconds
        set_axis(pi, "left", "kernel")
        pi.showGrid(x=True, y=False, alpha=0.25)
        pi.setMouseEnabled(x=True, y=False)
        pi.invertY(True)
        pi.getViewBox().setLimits(minXRange=1e-3)
        lay.addWidget(self.plot, 1)
        self.hover = QLabel(" ")
        lay.addWidget(self.hover)
        self.plot.scene().sigMouseMoved.connect(self._mouse_moved)
        self.crosshair = Hover(pi, self._readout, crosshair="x")
        self.crosshair.clicked.connect(self._clicked)
        self.selected_band = pg.LinearRegionItem(orientation="horizontal", movable=False,
                                                 brush=pg.mkBrush(255, 200, 0, 60), pen=pg.mkPen(None))
        self.selected_band.setZValue(-10)
        self.selected_band.hide()
        pi.addItem(self.selected_band, ignoreBounds=True)

    def set_timings(self, timings) -> None:
        """Lay out every pass of `timings` (rows with .kernel, .variant, .timing)."""
        self.set_spans(timeline_spans(timings), [f"{t.kernel} [{t.variant}]" for t in timings])

    def set_spans(self, spans, tracks) -> None:
        self.spans = list(spans)
        self.tracks = list(tracks)
        pi = self.plot.getPlotItem()
        for item in (self.timed_bars, self.warm_bars):
            if item is not None:
                pi.removeItem(item)
        self.timed_bars = self.warm_bars = None
        timed = [s for s in self.spans if not s.warmup]
        warm = [s for s in self.spans if s.warmup]
        if warm:
            self.warm_bars = self._bars(warm, [pg.mkBrush(*WARMUP_COLOR, 160)] * len(warm))
        if timed:
            self.timed_bars = self._bars(timed, [pg.mkBrush(*kernel_color(s.track), 220) for s in timed])
        pi.getAxis("left").setTicks([[(float(i), name.split(" [")[0]) for i, name in enumerate(self.tracks)], []])
        placed = sum(s.placed for s in timed)
        self.summary.setText(
            f"{len(timed)} timed passes and {len(warm)} warm-up passes of {len(self.tracks)} kernels"
            + (f"; {placed} without start times, laid end to end" if placed else "")
            + ("; warm-up grey" if warm else ""))
        self.fit()

    def _bars(self, spans, brushes):
        x0 = np.array([s.start_us for s in spans], np.float64)
        w = np.array([max(s.dur_us, 0.0) for s in spans], np.float64)
        y = np.array([s.track for s in spans], np.float64)
        item = pg.BarGraphItem(x0=x0, width=w, y=y, height=BAR_HEIGHT, brushes=brushes, pen=pg.mkPen(None))
        self.plot.getPlotItem().addItem(item)
        return item

    def fit(self) -> None:
        pi = self.plot.getPlotItem()
        if not self.spans:
            return
        lo = min(s.start_us for s in self.spans)
        hi = max(s.end_us for s in self.spans)
        pi.setRange(xRange=(lo, hi if hi > lo else lo + 1.0), yRange=(-0.6, max(1, len(self.tracks)) - 0.4), padding=0.02)

    def span_at(self, x: float, y: float) -> Span | None:
        """The pass drawn at plot coordinates (x us, y track), if any."""
        track = int(round(y))
        if abs(y - track) > BAR_HEIGHT / 2:
            return None
        hits = [s for s in self.spans if s.track == track and s.start_us <= x <= s.end_us]
        return min(hits, key=lambda s: s.dur_us) if hits else None

    def describe(self, s: Span) -> str:
        what = f"warm-up pass {s.index}" if s.warmup else f"sample {s.index}"
        return (f"{s.kernel} [{s.variant}]: {what}, {units.time_us(s.dur_us, 4)}, from {units.time_us(s.start_us, 6)} "
                f"to {units.time_us(s.end_us, 6)}" + (" (no start time measured: placed end to end)" if s.placed else ""))

    def _readout(self, x: float, y: float) -> str | None:
        s = self.span_at(x, y)
        if s is None:
            return f"{units.time_us(x, 6)}"
        what = f"warm-up pass {s.index}" if s.warmup else f"sample {s.index}"
        return f"{s.kernel}\n{what}: {units.time_us(s.dur_us, 4)}\nstarts at {units.time_us(s.start_us, 6)}"

    def _clicked(self, x: float, y: float) -> None:
        track = int(round(y))
        if 0 <= track < len(self.tracks) and abs(y - track) <= BAR_HEIGHT / 2:
            self.track_clicked.emit(track)

    def set_selected_track(self, track: int | None) -> None:
        """Highlight the track of the selected kernel (None: none)."""
        if track is None or not 0 <= track < len(self.tracks):
            self.selected_band.hide()
            return
        self.selected_band.setRegion((track - 0.5, track + 0.5))
        self.selected_band.show()

    def _mouse_moved(self, pos) -> None:
        vb = self.plot.getPlotItem().getViewBox()
        if not self.plot.sceneBoundingRect().contains(pos):
            return
        p = vb.mapSceneToView(pos)
        s = self.span_at(p.x(), p.y())
        self.hover.setText(self.describe(s) if s else " ")

    def x_range(self) -> tuple[float, float]:
        return tuple(self.plot.getPlotItem().getViewBox().viewRange()[0])

    def zoom(self, factor: float, center: float | None = None) -> None:
        """Zoom the time axis by `factor` (>1 zooms in) around `center` (default: the middle)."""
        lo, hi = self.x_range()
        c = (lo + hi) / 2 if center is None else center
        half = (hi - lo) / 2 / factor
        self.plot.getPlotItem().setXRange(c - half, c + half, padding=0)

