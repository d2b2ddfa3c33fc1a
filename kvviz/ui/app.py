"""`kvviz gui` / `python main.py` / `make run`: create the QApplication and the main window.

With `--screenshot PATH` the window computes the default (or --config) workload, waits for the
results (and the block inspector's first read), grabs itself to PATH and quits: `make run` uses it
when there is no display (under Xvfb). KVVIZ_SETTINGS=FILE.ini keeps the window's settings in that
file instead of the user's QSettings (handy for screenshots and tests).
"""
from __future__ import annotations

import os
import sys
import tempfile


def _runtime_dir() -> None:
    if not os.environ.get("XDG_RUNTIME_DIR"):
        d = os.path.join(tempfile.gettempdir(), f"kvviz-runtime-{os.getuid() if hasattr(os, 'getuid') else 0}")
        os.makedirs(d, mode=0o700, exist_ok=True)
        os.environ["XDG_RUNTIME_DIR"] = d


def make_settings():
    from PySide6.QtCore import QSettings

    from kvviz.ui.main_window import APP, ORG

    path = os.environ.get("KVVIZ_SETTINGS")
    if path:
        return QSettings(path, QSettings.IniFormat)
    return QSettings(ORG, APP)


def main(args=None) -> int:
    _runtime_dir()
    from PySide6.QtCore import QTimer
    from PySide6.QtWidgets import QApplication

    from kvviz.analysis.session import SessionConfig
    from kvviz.ui.main_window import APP, ORG, MainWindow

    app = QApplication.instance() or QApplication(sys.argv[:1])
    app.setOrganizationName(ORG)
    app.setApplicationName(APP)
    app.setStyle("Fusion")
    screenshot = getattr(args, "screenshot", None)
    cfg_path = getattr(args, "config", None)
    cfg = SessionConfig.load(cfg_path) if cfg_path else None
    win = MainWindow(settings=make_settings(), config=cfg)
    rc = {"code": 0}
    if screenshot:
        geo = app.primaryScreen().availableGeometry()
        win.setGeometry(geo)
        state = {"done": False}

        def finish(code: int) -> None:
            if state["done"]:
                return
            state["done"] = True
            try:
                win.save_screenshot(screenshot)
                print(f"kvviz: window saved to {screenshot}")
            except OSError as exc:
                print(f"kvviz: {exc}", file=sys.stderr)
                code = 1
            rc["code"] = code
            win.close()
            app.quit()

        def when_idle(code: int) -> None:
            # results are in: let the inspector's read and the repaint land, then grab
            def poll(left=[100]):
                left[0] -= 1
                if win.runner.busy and left[0] > 0:
                    QTimer.singleShot(100, poll)
                else:
                    QTimer.singleShot(400, lambda: finish(code))

            poll()

        win.results_ready.connect(lambda *_: when_idle(0))
        win.compute_failed.connect(lambda *_: when_idle(1))
        QTimer.singleShot(300_000, lambda: finish(2))
    win.show()
    code = app.exec()
    return rc["code"] if screenshot else code


if __name__ == "__main__":
    raise SystemExit(main())
