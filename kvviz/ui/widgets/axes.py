"""Plot axes that say their unit: SI-prefixed ticks, labels only on major ticks, a title with the unit.

`UnitAxis` replaces a pyqtgraph axis (`set_axis(plot, "bottom", "time", "s", scale=1e-6)` for values in
microseconds). A linear axis writes its ticks with one prefix and puts it in its title ("time (ms)"); a log
axis labels decades (with 2 and 5 between them where there is room) and writes each tick with its own
prefix ("100 \u00b5s", "1 ms"); minor ticks are never labelled. The tick choice and the texts are
kvviz.units' (Qt-free, also used by the report's SVG).
"""
from __future__ import annotations

import math

import pyqtgraph as pg
from PySide6.QtGui import QFontMetricsF

from kvviz import units


class UnitAxis(pg.AxisItem):
    # class defaults: pyqtgraph's constructor already draws the label (labelString) and sets the range
    title, unit, value_scale, factor, suffix = "", "", 1.0, 1.0, ""
    _labelled: dict = {}

    def __init__(self, orientation: str, title: str = "", unit: str = "", scale: float = 1.0, **kw):
        super().__init__(orientation, **kw)
        self.autoSIPrefix = False  # the prefix is ours (units.common_prefix), not pyqtgraph's
        self.title, self.unit, self.value_scale = title, unit, float(scale)
        self.factor, self.suffix = 1.0, unit
        self._labelled: dict = {}  # rounded view position -> label text
        self.setStyle(maxTextLevel=0)  # only the major ticks carry text
        if title:
            self.setLabel(title)

    # ---------------------------------------------------------------- configuration
    def set_unit(self, title: str | None = None, unit: str | None = None, scale: float | None = None) -> None:
        if unit is not None:
            self.unit = unit
        if scale is not None:
            self.value_scale = float(scale)
        self._refresh_prefix()
        self.setLabel(self.title if title is None else title)
        self.picture = None
        self.update()

    def setLabel(self, text=None, units=None, unitPrefix=None, **args) -> None:  # noqa: N802 - pyqtgraph's name
        """pyqtgraph's setLabel: the text is the axis's title, `units` its unit (the prefix is the axis's own)."""
        if text is not None:
            self.title = text
        if units is not None:
            self.unit = units
            self._refresh_prefix()
        super().setLabel(text=text, units=None, unitPrefix=None, **args)

    def value_text(self, v: float, digits: int = 4) -> str:
        """A view coordinate of this axis as a value with its unit (hover readouts): log axes undo the log."""
        x = (10.0 ** v if self.logMode else v) * self.value_scale
        return units.si(x, self.unit, digits)

    def labelString(self) -> str:  # noqa: N802 - pyqtgraph's name
        # a log axis says its scale by its ticks (decades, each with its prefix and unit); a linear one carries
        # its common prefix and unit here
        title = self.title or self.labelText
        text = f"{title} ({self.suffix})" if title and self.suffix and not self.logMode else title
        style = ";".join(f"{k}: {v}" for k, v in self.labelStyle.items())
        return f"<span style='{style}'>{text}</span>"

    def setRange(self, mn: float, mx: float) -> None:  # noqa: N802
        super().setRange(mn, mx)
        self._refresh_prefix()

    def setLogMode(self, *args, **kw) -> None:  # noqa: N802
        super().setLogMode(*args, **kw)
        self._refresh_prefix()
        self._updateLabel()

    def _refresh_prefix(self) -> None:
        if self.logMode:
            factor, suffix = 1.0, ""
        else:
            mn, mx = self.range
            factor, suffix, _letter = units.common_prefix([mn * self.value_scale, mx * self.value_scale], self.unit)
        if (factor, suffix) != (self.factor, self.suffix):
            self.factor, self.suffix = factor, suffix
            self._updateLabel()

    # ---------------------------------------------------------------- ticks
    def _label_room(self) -> float:
        """Pixels one label needs along the axis."""
        fm = QFontMetricsF(self.style.get("tickFont") or self.font())
        if self.orientation in ("left", "right"):
            return fm.height() * 1.5
        sample = "8888.8 " + (("\u00b5" + self.unit) if self.logMode else "")
        return fm.horizontalAdvance(sample) + 10

    def tickValues(self, minVal: float, maxVal: float, size: float):  # noqa: N802
        if self._tickLevels is not None:  # fixed ticks (setTicks): pyqtgraph's own path
            return super().tickValues(minVal, maxVal, size)
        lo, hi = sorted((minVal, maxVal))
        room = max(3, int(size / self._label_room()))
        self._labelled = {}
        if self.logMode:
            labelled, minor = units.log_ticks(lo, hi, room)
            texts = units.log_tick_texts(labelled, self.unit, self.value_scale)
            self._labelled = {round(v, 9): t for v, t in zip(labelled, texts)}
            return [(1.0, labelled), (None, minor)]
        vs = self.value_scale or 1.0
        step, major, mstep, minor = units.linear_ticks(lo * vs, hi * vs, room)
        factor, _suffix, letter = units.common_prefix([lo * vs, hi * vs], self.unit)
        texts = units.tick_texts(major, step, factor, letter)
        self._labelled = {round(v / vs, 12): t for v, t in zip(major, texts)}
        return [(step / vs, [v / vs for v in major]), (mstep / vs, [v / vs for v in minor])]

    def tickStrings(self, values, scale, spacing):  # noqa: N802
        if self._tickLevels is not None:
            return super().tickStrings(values, scale, spacing)
        nd = 9 if self.logMode else 12
        out = []
        for v in values:
            t = self._labelled.get(round(v, nd))
            if t is None:  # a rounding apart: the nearest labelled tick within a millionth of the range
                near = [(abs(k - v), s) for k, s in self._labelled.items()]
                t = min(near)[1] if near and min(near)[0] <= abs(v) * 1e-9 + 1e-12 else ""
            out.append(t)
        return out


def set_axis(plot, side: str, title: str, unit: str = "", scale: float = 1.0) -> UnitAxis:
    """The plot's `side` axis as a UnitAxis (made once, then re-titled): `title` without the unit, `unit` the
    base unit of the values times `scale` (microseconds: "s", 1e-6; GB/s values: "B/s", 1e9)."""
    axis = plot.getAxis(side)
    if isinstance(axis, UnitAxis):
        axis.set_unit(title, unit, scale)
        return axis
    new = UnitAxis(side, title, unit, scale)
    plot.setAxisItems({side: new})
    new.setLogMode(*((plot.ctrl.logXCheck.isChecked(), plot.ctrl.logYCheck.isChecked())))
    new.set_unit(title, unit, scale)
    return new


def color_bar(values=(0.0, 1.0), label: str = "", unit: str = "") -> pg.ColorBarItem:
    """A viridis colour bar (a legend of a heatmap drawn with kvviz.ui.style.lut_viridis over fixed levels):
    not linked to the image, its axis runs 0 .. vmax with real 1-2-5 ticks and says what the colour is
    (`label`, `unit`); `set_bar_range` updates it."""
    bar = pg.ColorBarItem(values=values, colorMap=pg.colormap.get("viridis"), interactive=False, width=12)
    color_bar_axis(bar, label, unit)
    return bar


def set_bar_label(bar: pg.ColorBarItem, label: str, unit: str = "") -> None:
    bar.axis.set_unit(label, unit)


def set_bar_range(bar: pg.ColorBarItem, vmax: float) -> None:
    vmax = float(vmax) if vmax and math.isfinite(vmax) and vmax > 0 else 1.0
    bar.setLevels((0.0, vmax))


def color_bar_axis(bar, title: str = "", unit: str = "") -> UnitAxis:
    """A colour bar's value axis as a UnitAxis: real ticks (1-2-5 steps) over the bar's whole range."""
    side = "bottom" if bar.horizontal else "right"
    new = UnitAxis(side, title, unit)
    bar.setAxisItems({side: new})
    new.setZValue(0.5)
    new.setStyle(showValues=True)
    new.unlinkFromView()
    lo, hi = bar.values
    new.setRange(lo, hi)
    bar.axis = new
    return new


def finite_range(values) -> tuple[float, float] | None:
    v = [float(x) for x in values if x is not None and math.isfinite(float(x))]
    return (min(v), max(v)) if v else None
