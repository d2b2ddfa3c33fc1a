"""Render every panel of a `Results` to PNG without a window (used by `kvviz report`).

Needs PySide6; the caller sets QT_QPA_PLATFORM=offscreen before Qt is imported when there is no
display. Panels are built standalone (no main window), fed the results, laid out at a fixed size
and painted at 2x device pixel ratio, exactly as the window exports them.
"""
from __future__ import annotations

import os
import sys

PANEL_SIZES = {
    "overview": (1100, 260),
    "cache_layout": (1000, 640),
    "scales": (1100, 700),
    "codes": (1100, 560),
    "attention": (1000, 760),
    "timing": (1000, 720),
    "compare": (900, 640),
}


def _app():
    from PySide6.QtWidgets import QApplication

    app = QApplication.instance()
    if app is None:
        app = QApplication(sys.argv[:1] or ["kvviz"])
        app.setStyle("Fusion")
    return app


def render_report_figures(res, out_dir: str, compare_rows=None, sweep_points=None) -> dict:
    """{panel key: PNG file name} for every panel, written into out_dir."""
    from PySide6.QtCore import Qt
    from PySide6.QtWidgets import QApplication

    from kvviz.ui.panels import AttentionPanel, CacheLayoutPanel, CodesPanel, ComparePanel, OverviewPanel, ScalesPanel, TimingPanel
    from kvviz.ui.style import setup_pyqtgraph

    _app()
    setup_pyqtgraph()
    os.makedirs(out_dir, exist_ok=True)
    classes = [OverviewPanel, CacheLayoutPanel, ScalesPanel, CodesPanel, AttentionPanel, TimingPanel]
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
        QApplication.processEvents()
        name = f"{cls.key}.png"
        p.export_png(os.path.join(out_dir, name))
        figures[cls.key] = name
        p.close()
        p.deleteLater()
    QApplication.processEvents()
    return figures
