"""Render every panel of a `Results` to PNG without a window (used by `kvviz report`).

Needs PySide6; the caller sets QT_QPA_PLATFORM=offscreen before Qt is imported when there is no
display. Panels are built standalone (no main window), fed the results, laid out at a fixed size
and painted at 2x device pixel ratio, exactly as the window exports them.
"""
from __future__ import annotations

import logging
import os
import sys

from kvviz.errors import KvvizError
from kvviz.families.turboquant.bias import inner_product_bias
from kvviz.ui.panels import (
    AttentionPanel,
    CacheLayoutPanel,
    CodesPanel,
    ComparePanel,
    OverviewPanel,
    ScalesPanel,
    TimingPanel,
)
from kvviz.ui.panels.qjl_bias import QjlBiasPanel
from kvviz.ui.style import setup_pyqtgraph

PANEL_SIZES = {
    "overview": (1100, 260),
    "cache_layout": (1000, 640),
    "scales": (1100, 700),
    "codes": (1100, 560),
    "attention": (1000, 760),
    "timing": (1000, 720),
    "compare": (900, 640),
    "qjl_bias": (1000, 640),
}


def _quiet_qt(mode, context, message) -> None:
    """Qt's own messages go to the log (debug), not to the terminal: the offscreen platform says
    "This plugin does not support propagateSizeHints()" for every panel."""
    logging.getLogger("kvviz.qt").debug("Qt: %s", message)


def _app():
    from PySide6.QtCore import qInstallMessageHandler
    from PySide6.QtWidgets import QApplication

    qInstallMessageHandler(_quiet_qt)
    app = QApplication.instance()
    if app is None:
        app = QApplication(sys.argv[:1] or ["kvviz"])
        app.setStyle("Fusion")
    return app


def _draw_bias(panel, rt) -> None:
    """The QJL bias panel's estimate for its default selection (sequence 0, head 0), computed here as the
    window's worker would; a refusal is drawn as the panel's message."""
    seq, head = panel.selection()
    try:
        q, K, seed, layer = panel.inputs()
        panel.set_bias(inner_product_bias(q, K, seed, layer, rt=rt), seq, head)
    except KvvizError as exc:
        panel.set_error(exc)


def render_report_figures(res, out_dir: str, compare_rows=None, sweep_points=None, rt=None) -> dict:
    """{panel key: PNG file name} for every panel, written into out_dir (the QJL bias estimate runs on `rt`,
    a GpuRuntime, when given)."""
    from PySide6.QtCore import Qt
    from PySide6.QtWidgets import QApplication

    _app()
    setup_pyqtgraph()
    os.makedirs(out_dir, exist_ok=True)
    classes = [OverviewPanel, CacheLayoutPanel, ScalesPanel, CodesPanel, AttentionPanel, TimingPanel, QjlBiasPanel]
    if compare_rows:
        classes.append(ComparePanel)
    figures = {}
    for cls in classes:
        p = cls(None)
        p.setAttribute(Qt.WA_DontShowOnScreen, True)
        p.resize(*PANEL_SIZES.get(cls.key, (1000, 640)))
        p.export_button.hide()
        p.show()
        QApplication.processEvents()
        p.set_results(res)
        if cls is ComparePanel:
            p.set_rows(compare_rows)
        if cls is TimingPanel and sweep_points:
            p.set_sweep(sweep_points)
        if cls is QjlBiasPanel and not p.reason:
            _draw_bias(p, rt)
        QApplication.processEvents()
        name = f"{cls.key}.png"
        p.export_png(os.path.join(out_dir, name))
        figures[cls.key] = name
        p.close()
        p.deleteLater()
    QApplication.processEvents()
    return figures
