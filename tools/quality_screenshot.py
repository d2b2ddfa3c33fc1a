#!/usr/bin/env python3
"""The Quality panel's screenshot: the window at 1280x800 under Xvfb with a `kvviz eval --out PREFIX` result shown in
its Quality dock (read from PREFIX.json, nothing computed), the panel raised, one PNG.

    .venv/bin/python tools/quality_screenshot.py assets/eval-smollm2-h200.json --tab "Bits vs KLD" \\
        --out assets/screenshot-quality-1280x800.png
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TABS = ("KLD distribution", "KLD vs position", "Per layer", "Bits vs KLD")


def shoot(result_path: str, out: str, tab: str, size: str) -> None:
    """Runs in the Xvfb display: the window, the result in its Quality panel, a grab of the window."""
    sys.path.insert(0, ROOT)
    from PySide6.QtCore import QSettings, Qt, QTimer
    from PySide6.QtWidgets import QApplication

    from kvviz.ui.main_window import MainWindow

    w, h = (int(x) for x in size.split("x"))
    app = QApplication.instance() or QApplication([])
    with tempfile.TemporaryDirectory(prefix="kvviz-shot-") as tmp:
        # the window as a user sees it: its default workload computed (every panel filled), then the result
        win = MainWindow(settings=QSettings(os.path.join(tmp, "s.ini"), QSettings.IniFormat))
        win.resize(w, h)
        with open(result_path) as f:
            win.quality.set_result(json.load(f))
        d = win.docks["quality"]
        win.quality.tabs.setCurrentIndex(TABS.index(tab))

        def show_panel():  # after the window has laid its docks out: the Quality panel given most of the width
            d.show()
            d.raise_()
            win.resizeDocks([win.docks["workload"], d], [int(w * 0.235), int(w * 0.58)], Qt.Horizontal)

        def grab():
            if win.runner.busy:  # the default workload's timings still running
                QTimer.singleShot(500, grab)
                return
            win.grab()  # a paint first: the plots take their ranges and the labels their places
            QTimer.singleShot(300, lambda: (win.grab().save(out), win.close(), app.quit()))

        win.results_ready.connect(lambda *_: QTimer.singleShot(300, show_panel))
        win.results_ready.connect(lambda *_: QTimer.singleShot(1500, grab))
        win.show()
        app.exec()
    print(f"wrote {out}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("result", help="a kvviz eval --out PREFIX.json file")
    ap.add_argument("--out", default=os.path.join(ROOT, "assets", "screenshot-quality-1280x800.png"))
    ap.add_argument("--tab", default="Bits vs KLD", choices=TABS, help="the plot shown")
    ap.add_argument("--size", default="1280x800")
    ap.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)  # the run under Xvfb
    a = ap.parse_args(argv)
    if a.inside:
        shoot(a.result, a.out, a.tab, a.size)
        return 0
    env = dict(os.environ, XDG_RUNTIME_DIR=os.environ.get("XDG_RUNTIME_DIR", "/tmp"))
    env.pop("QT_QPA_PLATFORM", None)
    with tempfile.TemporaryDirectory(prefix="kvviz-shot-") as tmp:
        env["KVVIZ_DATA_DIR"] = os.path.join(tmp, "data")
        cmd = ["xvfb-run", "-a", "-s", f"-screen 0 {a.size}x24", sys.executable, os.path.abspath(__file__), a.result,
               "--out", a.out, "--tab", a.tab, "--size", a.size, "--inside"]
        return subprocess.run(cmd, env=env, cwd=ROOT).returncode


if __name__ == "__main__":
    raise SystemExit(main())
