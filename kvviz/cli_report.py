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


_BUILD_LINE_EVERY_S = 5.0  # a long kernel build's progress line: the first, then one this often (the window shows each)
_last_build = {"what": "", "at": 0.0}


def _progress(frac: float, msg: str) -> None:
    if msg.startswith("building kernels"):
        what, _, rest = msg.rpartition(", ")
        seconds = float(rest.split(" ", 1)[0]) if rest[:1].isdigit() else 0.0
        if what == _last_build["what"] and 0 <= seconds - _last_build["at"] < _BUILD_LINE_EVERY_S:
            return  # the same build, said less than a few seconds ago (a new build starts again from 1 s)
        _last_build.update(what=what, at=seconds)
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


def describe_source(cfg: SessionConfig) -> str:
    """The workload a config asks for, in words, before it is loaded: the synthetic preset and its context
    lengths, or the K/V file or model and the layer read from it (their shapes come from the data)."""
    keys = ", pre-RoPE keys" if cfg.pre_rope_keys else ""
    if cfg.source == "kvfile":
        return f"the K/V file {cfg.kv_file or '(none chosen)'}, layer {cfg.layer}{keys}"
    if cfg.source == "model":
        name = cfg.model_path or "SmolLM2-135M"
        return f"the model {name}, layer {cfg.layer}{keys}, a prompt of {len(cfg.prompt)} characters"
    return f"synthetic '{cfg.preset}' (seed {cfg.seed}), context {list(cfg.context_lens)}"


def main(args) -> int:
    # Every input is checked before the GPU is touched: a bad setting or --out is InvalidInput (exit 2).
    cfg = build_config(args)
    out = check_out_dir(args.out, "--out")
    print(f"kvviz report: computing {cfg.method} on {describe_source(cfg)}", file=sys.stderr)
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
