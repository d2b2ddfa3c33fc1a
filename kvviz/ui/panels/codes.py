"""Code histogram panel: K and V code distributions with clip rate, zero fraction and range used."""
from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QAbstractItemView, QCheckBox, QTableWidget, QTableWidgetItem

from kvviz.report.tables import code_hist_table, code_stats_table
from kvviz.ui.panels.base import Panel
from kvviz.ui.style import K_COLOR, V_COLOR


def _pct(x: float) -> str:
    return f"{100.0 * x:.2f}%"


class CodesPanel(Panel):
    key = "codes"
    title = "Code histogram"

    def __init__(self, state=None, parent=None):
        super().__init__(state, parent)
        self.hist = self.stats = None
        self.log_y = QCheckBox("log counts")
        self.log_y.toggled.connect(lambda *_: self.refresh())
        self.tools.addWidget(self.log_y)
        self.glw = pg.GraphicsLayoutWidget()
        self.glw.setMinimumSize(120, 120)
        self.k_plot = self.glw.addPlot(row=0, col=0)
        self.v_plot = self.glw.addPlot(row=1, col=0)
        self.v_plot.setXLink(self.k_plot)
        for p in (self.k_plot, self.v_plot):
            p.setLabel("left", "count")
            p.showGrid(x=False, y=True, alpha=0.25)
        self.v_plot.setLabel("bottom", "code")
        self.bar_x = np.zeros(0)
        self.k_bars = None
        self.v_bars = None
        self.body.addWidget(self.glw, 1)
        self.table = QTableWidget()
        self.table.setEditTriggers(QAbstractItemView.NoEditTriggers)
        self.table.verticalHeader().setDefaultSectionSize(19)
        self.table.setVerticalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
        self.table.setFixedHeight(3 * 19 + 8)
        self.body.addWidget(self.table)

    def refresh(self) -> None:
        res = self.res
        if res is None:
            return
        self.hist = code_hist_table(res)
        self.stats = code_stats_table(res)
        vals = self.hist.column("code").astype(np.float64)
        integral = bool(np.all(np.mod(vals, 1) == 0))
        if integral:  # integer codes: bars at their values
            x = vals
            width = float(np.min(np.diff(x))) * 0.9 if len(x) > 1 else 0.9
            ticks = None
        else:  # FP8 and other float codes: one evenly spaced bar per distinct value, ticks name the values
            x = np.arange(len(vals), dtype=np.float64)
            width = 0.9
            idx = np.unique(np.linspace(0, len(vals) - 1, min(5, len(vals))).round().astype(int))
            ticks = [[(float(i), f"{vals[i]:.3g}") for i in idx], []]
        self.bar_x = x
        log = self.log_y.isChecked()
        for which, plot, col, st, counts, attr in (
            ("K", self.k_plot, K_COLOR, res.k_stats, self.hist.column("k_count"), "k_bars"),
            ("V", self.v_plot, V_COLOR, res.v_stats, self.hist.column("v_count"), "v_bars"),
        ):
            old = getattr(self, attr)
            if old is not None:
                plot.removeItem(old)
            h = counts.astype(np.float64)
            if log:
                h = np.log10(np.maximum(h, 0) + 1.0)
            bars = pg.BarGraphItem(x=x, height=h, width=width, brush=pg.mkBrush(*col, 200), pen=pg.mkPen(None))
            plot.addItem(bars)
            setattr(self, attr, bars)
            plot.setLabel("left", f"{which}: log10(n+1)" if log else f"{which} count")
            plot.setTitle(f"{which}: clip {_pct(st.clip_rate)}, zeros {_pct(st.zero_fraction)}", size="8pt")
            plot.getAxis("bottom").setTicks(ticks)
            plot.enableAutoRange()
        lo, hi = res.qkv.code_range
        self.info.setText(f"{res.method.id}: codes {lo:g} .. {hi:g}, {len(self.hist)} distinct values")
        self.v_plot.setLabel("bottom", "code" if integral else "code value (distinct values, in order)")
        t = self.table
        names = {"clip_rate": "clip rate", "zero_fraction": "zeros", "range_used": "range used", "total": "codes",
                 "code_min": "min", "code_max": "max"}
        t.clear()
        t.setRowCount(2)
        t.setColumnCount(len(self.stats.rows))
        t.setHorizontalHeaderLabels([names.get(r[0], r[0]) for r in self.stats.rows])
        t.setVerticalHeaderLabels(["K", "V"])
        for j, (name, k, v) in enumerate(self.stats.rows):
            for i, val in ((0, k), (1, v)):
                if name in ("clip_rate", "zero_fraction", "range_used"):
                    s = _pct(val)
                elif isinstance(val, float) and val != int(val):
                    s = f"{val:.6g}"
                else:
                    s = f"{int(val)}"
                it = QTableWidgetItem(s)
                it.setTextAlignment(Qt.AlignRight | Qt.AlignVCenter)
                t.setItem(i, j, it)
        t.resizeColumnsToContents()

    def tables(self) -> list:
        return [t for t in (self.hist, self.stats) if t is not None]
