"""`kvviz report --out DIR [--config FILE] [--set KEY=VALUE ...] [--compare]`: the window's report, headless (the CLI layer).

Builds the `SessionConfig`, runs `Session.compute`, and writes report.json, report.md, the panel
CSVs, the Chrome trace and (when PySide6 is importable) every panel as PNG, rendered offscreen by
kvviz.ui without a display. Without Qt (the GPU machine) it writes everything but the figures.
"""
from __future__ import annotations

import importlib.util
import os
import sys

from kvviz.analysis.session import Session, SessionConfig
from kvviz.checks import check_out_dir
from kvviz.errors import KvvizError
from kvviz.report.compare_run import run_compare
from kvviz.report.writer import relocate, staged_dir, write_report
from kvviz.tables import default_panel_tables, history_entry


def build_config(args) -> SessionConfig:
    cfg = SessionConfig.load(args.config) if getattr(args, "config", None) else SessionConfig()
    pairs = list(getattr(args, "set", None) or [])
    if pairs:
        cfg = cfg.with_overrides(pairs)
    cfg.validate()
    return cfg


def _progress(frac: float, msg: str) -> None:
    print(f"  [{frac * 100:5.1f}%] {msg}", file=sys.stderr, flush=True)


def render_figures(res, out_dir: str, compare_rows=None) -> tuple[dict, str]:
    """Panel PNGs via kvviz.ui (offscreen); ({} , reason) when Qt is not available."""
    missing = [m for m in ("PySide6", "pyqtgraph") if importlib.util.find_spec(m) is None]
    if missing:
        return {}, f"no figures: {', '.join(missing)} not installed (report.json, report.md and CSVs are complete)"
    if "PySide6.QtWidgets" not in sys.modules:
        os.environ["QT_QPA_PLATFORM"] = "offscreen"  # before Qt is imported: no display needed
        os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")
    try:
        from kvviz.ui.render import render_report_figures

        return render_report_figures(res, out_dir, compare_rows=compare_rows), ""
    except ImportError as exc:
        return {}, f"no figures: Qt could not be loaded ({exc})"


def main(args) -> int:
    # Every input is checked before the GPU is touched: a bad setting or --out is InvalidInput (exit 2).
    cfg = build_config(args)
    out = check_out_dir(args.out, "--out")
    print(f"kvviz report: computing {cfg.method} on {cfg.source} '{cfg.preset}', context {list(cfg.context_lens)}",
          file=sys.stderr)
    session = Session()
    res = session.compute(cfg, progress=_progress)
    compare_rows = None
    if getattr(args, "compare", False):
        try:
            compare_rows = run_compare(session, res)
        except KvvizError as exc:
            print(f"kvviz report: comparison skipped: {exc.describe()}", file=sys.stderr)
    with staged_dir(out) as stage:  # figures and files land together, or not at all (Ctrl+C, an error)
        figures, why = render_figures(res, stage, compare_rows)
        if why:
            print(f"kvviz report: {why}", file=sys.stderr)
        history = [history_entry(res, 1)]
        tables = default_panel_tables(res, compare_rows=compare_rows, history=history)
        paths = write_report(stage, res, tables, figures, compare_rows=compare_rows, history=history)
    paths = relocate(paths, stage, out)
    print(f"adapter: {res.adapter.line()}")
    for k, v in res.metrics.summary().items():
        print(f"  {k}: {v:.6g}")
    for w in res.warnings:  # what the method could not represent: said, never silent
        print(f"kvviz report: warning: {w}", file=sys.stderr)
    print(f"wrote {paths['md']}, {paths['json']}, {paths['trace']}, {len(paths['csv'])} CSV, {len(figures)} PNG")
    return 0
