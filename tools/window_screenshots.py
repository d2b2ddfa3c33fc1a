#!/usr/bin/env python3
"""The window's screenshots, each under its own Xvfb screen, with a throw-away settings file and run history
(so no saved dock arrangement is restored and the user's history is not touched).

Default: the README's four, the default layout and the live-decode layout at 1280x800 and 1920x1080, each
listing the widgets whose text is cut (kvviz.ui.audit).

--panels: every panel and every tab at 1280x800 after a run, a sweep, a method comparison, a live decode and a
Kernel lab run (one PNG each, the panel raised in the window), the window with an invalid field (the banner and
the stale notes), then the same window at 1920x1080 and in the live layout; the audit of every panel and tab
(kvviz.ui.audit.audit_window) in each layout is printed.

    .venv/bin/python tools/window_screenshots.py            # the README's four into assets/
    .venv/bin/python tools/window_screenshots.py --only 1280x800 --out /tmp/shots
    .venv/bin/python tools/window_screenshots.py --panels --out /tmp/panels
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIZES = ("1280x800", "1920x1080")
LIVE = "8"  # tokens of the live decode (int8_seed), as app.py's KVVIZ_SCREENSHOT_LIVE
PANEL_WAIT_S = 900  # the method comparison of the default workload takes minutes on lavapipe


def shoot(size: str, live: bool, out_dir: str) -> tuple[int, str]:
    name = f"screenshot-{'live-' if live else ''}{size}.png"
    path = os.path.join(out_dir, name)
    with tempfile.TemporaryDirectory(prefix="kvviz-shot-") as tmp:
        env = dict(os.environ, KVVIZ_SETTINGS=os.path.join(tmp, "settings.ini"), KVVIZ_SCREENSHOT_AUDIT="1",
                   KVVIZ_DATA_DIR=os.path.join(tmp, "data"), XDG_RUNTIME_DIR=os.environ.get("XDG_RUNTIME_DIR", tmp))
        env.pop("QT_QPA_PLATFORM", None)
        env.pop("KVVIZ_SCREENSHOT_LIVE", None)
        if live:
            env["KVVIZ_SCREENSHOT_LIVE"] = LIVE
        cmd = ["xvfb-run", "-a", "-s", f"-screen 0 {size}x24", sys.executable, os.path.join(ROOT, "main.py"), "gui",
               "--screenshot", path]
        p = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True)
    return p.returncode, (p.stdout + p.stderr).strip()


# ------------------------------------------------------------------------------ every panel and tab
def shoot_panels(out_dir: str) -> int:
    """Run the panel scenario (`_panels`) in a window under an Xvfb screen of 1920x1080."""
    with tempfile.TemporaryDirectory(prefix="kvviz-panels-") as tmp:
        env = dict(os.environ, KVVIZ_DATA_DIR=os.path.join(tmp, "data"),
                   XDG_RUNTIME_DIR=os.environ.get("XDG_RUNTIME_DIR", tmp), PYTHONPATH=os.pathsep.join(
                       [ROOT] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
        env.pop("QT_QPA_PLATFORM", None)
        cmd = ["xvfb-run", "-a", "-s", "-screen 0 1920x1080x24", sys.executable, os.path.abspath(__file__),
               "--inner-panels", os.path.abspath(out_dir), "--tmp", tmp]
        return subprocess.run(cmd, env=env, cwd=ROOT).returncode


def _panels(out_dir: str, tmp: str) -> int:
    from PySide6.QtCore import QSettings, Qt
    from PySide6.QtGui import QImage
    from PySide6.QtWidgets import QApplication, QDockWidget, QTabWidget

    from kvviz.ui.audit import audit_window
    from kvviz.ui.main_window import APP, ORG, MainWindow

    app = QApplication.instance() or QApplication(sys.argv[:1])
    app.setOrganizationName(ORG)
    app.setApplicationName(APP)
    app.setStyle("Fusion")
    settings = QSettings(os.path.join(tmp, "settings.ini"), QSettings.IniFormat)
    win = MainWindow(settings=settings)
    win.setGeometry(0, 0, 1280, 800)
    win.show()
    t0 = time.perf_counter()

    def say(msg: str) -> None:
        print(f"[{time.perf_counter() - t0:6.1f} s] {msg}", flush=True)

    def wait(cond, what: str, limit: float = PANEL_WAIT_S) -> None:
        end = time.perf_counter() + limit
        while not cond():
            if time.perf_counter() > end:
                raise TimeoutError(f"{what}: no answer after {limit:.0f} s")
            app.processEvents()
            time.sleep(0.02)
        for _ in range(20):  # the repaints after it
            app.processEvents()
            time.sleep(0.01)

    def idle() -> bool:
        return not win.runner.busy

    def settle() -> None:
        wait(idle, "the worker")

    shots: list[str] = []
    audits: list[str] = []

    size = {"want": (1280, 800)}

    def grab(name: str) -> None:
        app.processEvents()
        if win.size().toTuple() != size["want"]:  # a minimum size that grew the window past the screen's
            audits.append(f"{name}: the window is {win.width()}x{win.height()}, not {size['want'][0]}x{size['want'][1]} "
                          f"(its minimum {win.minimumSizeHint().width()}x{win.minimumSizeHint().height()}, the "
                          f"overview's {win.central.minimumHeight()} px tall)")
        path = os.path.join(out_dir, f"{len(shots) + 1:02d}-{name}.png")
        # a palette of 256 colours without dithering: a fifth of the bytes, text and flat plot colours unchanged
        img = win.grab().toImage().convertToFormat(QImage.Format_Indexed8, Qt.ThresholdDither | Qt.AvoidDither)
        if not img.save(path, "PNG", 0):  # quality 0: the strongest compression
            raise OSError(f"could not write {path}")
        shots.append(path)

    def audit(where: str) -> None:
        lines = audit_window(win, where)
        audits.append(f"== {where}: {len(lines)} line(s)")
        audits.extend(lines)

    # a run, pinned as the baseline; another method run against it; a sweep; a comparison; a live decode; a lab run
    wait(lambda: win.results is not None, "the first compute")
    settle()
    say(f"first results: {win.results.method.id}")
    win.timing.pin_current()
    win.workload.method.setCurrentIndex(win.workload.method.findData("kivi"))
    wait(lambda: win.results.method.id == "kivi", "the kivi compute")
    settle()
    win.run_now()  # a Run (F5): kept in the run history
    settle()
    say("kivi run against the pinned int8 run")
    win.timing.sweep_values.setText("64, 256, 1024")
    got = {}
    win.sweep_ready.connect(lambda pts: got.setdefault("sweep", pts))
    win.compare_ready.connect(lambda rows: got.setdefault("compare", rows))
    win.live_finished.connect(lambda r: got.setdefault("live", r))
    win._raise_dock("timing")
    win.timing.sweep_button.click()
    wait(lambda: "sweep" in got, "the sweep")
    settle()
    say(f"sweep: {len(got['sweep'])} points")
    win.request_compare()
    wait(lambda: "compare" in got, "the comparison")
    settle()
    say(f"comparison: {len(got['compare'])} rows")
    win.live.set_config(max_new=int(LIVE), block_size=8, policy="scattered")
    win._raise_dock("live")
    win.start_live()
    wait(lambda: "live" in got, "the live decode")
    settle()
    say(f"live decode: {len(win.live.steps)} steps")
    win.lab.set_slot("int8_token.dequantise")
    win.lab.new_file(os.path.join(tmp, "int8_token_dequantise.wgsl"))
    wait(lambda: len(win.lab.runs) == 1, "the kernel lab run")
    settle()
    say("kernel lab run")
    win.reset_layout()
    wait(lambda: True, "the layout")

    def slug(text: str) -> str:
        return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")

    docks = [d for d in win.findChildren(QDockWidget) if d.parentWidget() is win]
    order = list(win.docks)
    docks.sort(key=lambda d: order.index(d.objectName()[5:]) if d.objectName()[5:] in order else len(order))
    for d in docks:
        if d is win.docks["workload"]:
            continue  # beside every other shot
        d.show()
        d.raise_()
        wait(lambda: True, d.windowTitle())
        tabs = [tw for tw in d.findChildren(QTabWidget) if tw.isVisible()]
        if not tabs:
            grab(slug(d.windowTitle()))
            continue
        for tw in tabs:
            keep = tw.currentIndex()
            for i in range(tw.count()):
                tw.setCurrentIndex(i)
                wait(lambda: True, tw.tabText(i))
                grab(f"{slug(d.windowTitle())}-{slug(tw.tabText(i))}")
            tw.setCurrentIndex(keep)
    win.reset_layout()
    wait(lambda: True, "the layout")
    audit("1280x800 default layout")
    win.show_live_layout()
    wait(lambda: True, "the live layout")
    grab("live-layout")
    audit("1280x800 live layout")
    # an unreadable field: the banner, the field marked, every panel's stale note (and the cards whole)
    win.reset_layout()
    lens = win.workload.context_lens.text()
    win.workload.context_lens.setText(lens + ", 1x7")
    win.request_compute()
    wait(lambda: win.banner.isVisible(), "the refused context lengths")
    grab("invalid-context-lengths")
    audit("1280x800 with the error banner and stale notes")
    win.workload.context_lens.setText(lens)
    win.workload.auto_run.setChecked(False)  # the settings as they were: nothing to recompute
    win._sync_edited()
    wait(lambda: not win.banner.isVisible(), "the fixed context lengths")
    # the stored comparison run reopened (nothing recomputed)
    hv = win.timing.history_view
    hv.reload()
    stored = next((r.id for r in hv.run_list if r.kind == "compare"), None)
    if stored is not None and win.open_run(stored):
        wait(lambda: True, "the stored run")
        win._raise_dock("compare")
        grab("stored-comparison-reopened")
    win.setGeometry(0, 0, 1920, 1080)
    size["want"] = (1920, 1080)
    wait(lambda: True, "1920x1080")
    win.reset_layout()
    wait(lambda: True, "the 1920x1080 layout")
    audit("1920x1080 default layout")
    grab("1920x1080-default")
    win.show_live_layout()
    wait(lambda: True, "the live layout")
    audit("1920x1080 live layout")
    grab("1920x1080-live-layout")
    say(f"{len(shots)} screenshots in {out_dir}")
    print("\n".join(audits), flush=True)
    win.close()
    return 0 if all(not a or a.startswith("==") for a in audits) else 1


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(ROOT, "assets"), help="folder for the PNGs (default assets/)")
    ap.add_argument("--only", choices=SIZES, action="append", help="only this size (repeatable)")
    ap.add_argument("--no-live", action="store_true", help="only the default layout")
    ap.add_argument("--live-only", action="store_true", help="only the live-decode layout")
    ap.add_argument("--panels", action="store_true", help="every panel and tab after a run, a sweep, a comparison "
                                                          "and a live decode, with the audit of every layout")
    ap.add_argument("--inner-panels", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--tmp", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.inner_panels:
        return _panels(a.inner_panels, a.tmp)
    os.makedirs(a.out, exist_ok=True)
    if a.panels:
        return shoot_panels(a.out)
    rc = 0
    for size in a.only or SIZES:
        for live in ((False,) if a.no_live else (True,) if a.live_only else (False, True)):
            code, text = shoot(size, live, a.out)
            print(f"== {size} {'live' if live else 'default'}: exit {code}\n{text}\n", flush=True)
            rc = rc or code
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
