"""Pareto chart of a `kvviz live --methods all --save PREFIX` table: bits per element (x) against mean
next-token KL (y, log scale), one point per method setting, the Pareto front (no other setting has both
fewer bits and a lower KL) drawn through its points. Rendered by pyqtgraph's ImageExporter.

    xvfb-run -a .venv/bin/python tools/pareto_chart.py assets/live-all-methods.json assets/pareto.png

The f32 row (32 bits, KL 0) has no place on a log axis: it is named in the title instead. Settings that
failed or have no finite KL are left out and listed on stderr.
"""
from __future__ import annotations

import json
import math
import sys

FAMILY_COLORS = {
    "int8": (31, 119, 180), "fp8": (255, 127, 14), "vllm": (214, 39, 40), "int4": (44, 160, 44),
    "kivi": (148, 103, 189), "turboquant": (140, 86, 75), "q": (227, 119, 194), "iq4": (227, 119, 194),
    "mxfp4": (23, 190, 207), "nvfp4": (23, 190, 207),
}


def family_color(method: str):
    for prefix, c in FAMILY_COLORS.items():
        if method.startswith(prefix):
            return c
    return (127, 127, 127)


def pareto_front(points):
    """points [(bits, kl, ...)] -> the front, by increasing bits: each point's KL is below every point with
    fewer (or equal) bits."""
    front, best = [], math.inf
    for p in sorted(points, key=lambda p: (p[0], p[1])):
        if p[1] < best:
            front.append(p)
            best = p[1]
    return front


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    src, out = argv
    with open(src) as f:
        doc = json.load(f)
    pts, skipped = [], []
    for r in doc["rows"]:
        kl, bits = r.get("kl_mean"), r.get("bits_per_element")
        if r.get("method") == "f32":
            continue
        if r.get("error") or kl is None or bits is None or not kl > 0:
            skipped.append(r["spec"])
            continue
        pts.append((float(bits), float(kl), r["spec"], r["method"]))
    if skipped:
        print(f"left out (failed or no finite positive KL): {', '.join(skipped)}", file=sys.stderr)

    import numpy as np
    import pyqtgraph as pg
    from pyqtgraph.exporters import ImageExporter
    from pyqtgraph.Qt import QtCore, QtGui

    app = pg.mkQApp("pareto")
    pg.setConfigOptions(antialias=True, background="w", foreground="k")
    pw = pg.PlotWidget()
    pw.resize(1500, 950)
    plot = pw.getPlotItem()
    plot.setLogMode(x=True, y=True)  # both axes log: 2-bit to 26-bit settings and KL over 7 decades
    plot.showGrid(x=True, y=True, alpha=0.25)
    plot.setLabel("bottom", "bits per element (K and V mean, scales included; log scale)")
    plot.setLabel("left", "mean next-token KL vs the f32 cache (nats)")
    plot.setTitle(f"{doc['model']}: {doc['prompt_tokens']}-token prompt, {doc['n_new']} tokens teacher-forced "
                  f"(f32: 32 bits, KL 0); dashed: the Pareto front", size="10pt")
    plot.getAxis("left").enableAutoSIPrefix(False)
    front = pareto_front(pts)
    fx = [p[0] for p in front]
    fy = [p[1] for p in front]  # data in KL: the log axis takes log10 itself (positions below are in log10)
    plot.plot(fx, fy, pen=pg.mkPen((60, 60, 60), width=2, style=QtCore.Qt.PenStyle.DashLine), name="Pareto front")
    on_front = {p[2] for p in front}
    font = QtGui.QFont()
    font.setPointSize(9)
    small = QtGui.QFont()
    small.setPointSize(7)
    for bits, kl, spec, method in pts:
        c = family_color(method)
        size = 11 if spec in on_front else 8
        plot.plot([bits], [kl], pen=None, symbol="o", symbolSize=size, symbolBrush=pg.mkBrush(*c, 220),
                  symbolPen=pg.mkPen("k" if spec in on_front else (*c, 255), width=1.2))
        front_pt = spec in on_front
        label = pg.TextItem(spec.replace("turboquant", "tq").replace("vllm_fp8", "vllm"),
                            color=(*c, 255 if front_pt else 170), anchor=(0, 0.5))
        label.setFont(font if front_pt else small)
        label.setPos(math.log10(bits) + 0.006, math.log10(kl))  # view coordinates are log10 on both axes
        plot.addItem(label)
    ys = np.log10([p[1] for p in pts])
    xs = np.log10([p[0] for p in pts])
    plot.setXRange(float(xs.min()) - 0.03, float(xs.max()) + 0.12, padding=0)
    plot.setYRange(float(ys.min()) - 0.3, float(ys.max()) + 0.3, padding=0)
    pw.show()  # lay the widget out at its size before exporting (an unshown item exports a stale geometry)
    for _ in range(5):
        app.processEvents()
    exp = ImageExporter(plot)
    exp.parameters()["width"] = 1500
    exp.export(out)
    print(f"{out}: {len(pts)} settings, {len(front)} on the Pareto front: {', '.join(p[2] for p in front)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
