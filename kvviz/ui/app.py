"""`kvviz gui` / `python main.py` / `make run`: create the QApplication and the main window.

With `--screenshot PATH` the window computes the default (or --config) workload, waits for the
results (and the block inspector's first read), grabs itself to PATH and quits: `make run` uses it
when there is no display (under Xvfb). KVVIZ_SETTINGS=FILE.ini keeps the window's settings in that
file instead of the user's QSettings (handy for screenshots and tests). With KVVIZ_SCREENSHOT_LIVE=N (or
N:METHOD) as well, the screenshot is taken after a live decode of N tokens (of the method, default
int8_seed), with the Live decode and QJL bias panels raised and widened. KVVIZ_SCREENSHOT_AUDIT=1 also
prints every widget whose text is cut (kvviz.ui.audit). tools/window_screenshots.py takes the README's four.
With `--open RUN|PATH` the window shows a stored run or a report as it was computed instead of computing.
"""
from __future__ import annotations

import os
import sys
import tempfile
import traceback

from kvviz.analysis.session import SessionConfig
from kvviz.ui.audit import cut_text, scrolling_docks
from kvviz.ui.main_window import APP, ORG, MainWindow


def _runtime_dir() -> None:
    if not os.environ.get("XDG_RUNTIME_DIR"):
        d = os.path.join(tempfile.gettempdir(), f"kvviz-runtime-{os.getuid() if hasattr(os, 'getuid') else 0}")
        os.makedirs(d, mode=0o700, exist_ok=True)
        os.environ["XDG_RUNTIME_DIR"] = d


def make_settings():
    from PySide6.QtCore import QSettings

    path = os.environ.get("KVVIZ_SETTINGS")
    if path:
        return QSettings(path, QSettings.IniFormat)
    return QSettings(ORG, APP)


def main(args=None) -> int:
    _runtime_dir()
    from PySide6.QtCore import QTimer
    from PySide6.QtWidgets import QApplication

    app = QApplication.instance() or QApplication(sys.argv[:1])
    app.setOrganizationName(ORG)
    app.setApplicationName(APP)
    app.setStyle("Fusion")
    screenshot = getattr(args, "screenshot", None)
    cfg_path = getattr(args, "config", None)
    cfg = SessionConfig.load(cfg_path) if cfg_path else None
    opened = getattr(args, "open", None)
    win = MainWindow(settings=make_settings(), config=cfg, autostart=not opened)
    if opened:  # a run of the history (its id) or a report: shown as computed, nothing recomputed
        QTimer.singleShot(0, lambda: win.open_run(int(opened)) if str(opened).isdigit()
                          else win.open_stored_file(opened))
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
                if os.environ.get("KVVIZ_SCREENSHOT_AUDIT"):
                    try:
                        cuts = cut_text(win)
                        print(f"kvviz: {len(cuts)} widget(s) with cut text" + "".join(f"\n  {c}" for c in cuts))
                        wide = scrolling_docks(win)
                        print(f"kvviz: {len(wide)} dock(s) scroll sideways" + "".join(f"\n  {c}" for c in wide))
                    except Exception:  # noqa: BLE001 - the audit must not keep the window open
                        traceback.print_exc()
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

        live_spec = os.environ.get("KVVIZ_SCREENSHOT_LIVE", "").strip()
        live_n = int(live_spec.split(":")[0] or 0) if live_spec else 0
        live_method = live_spec.split(":", 1)[1] if ":" in live_spec else None
        if live_n > 0:
            def start_live(*_):
                if state.get("live"):
                    return
                state["live"] = True
                win.live.set_config(max_new=live_n, method=live_method, block_size=8, policy="scattered")
                win.show_live_layout()
                win.start_live()

            win.results_ready.connect(start_live)
            win.live_finished.connect(lambda *_: when_idle(0))
            win.task_cancelled.connect(lambda kind: when_idle(1) if kind == "live" else None)
        else:
            win.results_ready.connect(lambda *_: when_idle(0))
        win.compute_failed.connect(lambda *_: when_idle(1))
        QTimer.singleShot(300_000, lambda: finish(2))
    win.show()
    code = app.exec()
    return rc["code"] if screenshot else code


if __name__ == "__main__":
    raise SystemExit(main())
