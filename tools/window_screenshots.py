#!/usr/bin/env python3
"""The README's window screenshots: the default layout and the live-decode layout at 1280x800 and
1920x1080, each under its own Xvfb screen of that size, with a throw-away settings file (so no saved
dock arrangement is restored). Each run also lists the widgets whose text is cut (kvviz.ui.audit).

    .venv/bin/python tools/window_screenshots.py            # all four into assets/
    .venv/bin/python tools/window_screenshots.py --only 1280x800 --out /tmp/shots
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIZES = ("1280x800", "1920x1080")
LIVE = "8"  # tokens of the live decode (int8_seed), as app.py's KVVIZ_SCREENSHOT_LIVE


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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(ROOT, "assets"), help="folder for the PNGs (default assets/)")
    ap.add_argument("--only", choices=SIZES, action="append", help="only this size (repeatable)")
    ap.add_argument("--no-live", action="store_true", help="only the default layout")
    ap.add_argument("--live-only", action="store_true", help="only the live-decode layout")
    a = ap.parse_args(argv)
    os.makedirs(a.out, exist_ok=True)
    rc = 0
    for size in a.only or SIZES:
        for live in ((False,) if a.no_live else (True,) if a.live_only else (False, True)):
            code, text = shoot(size, live, a.out)
            print(f"== {size} {'live' if live else 'default'}: exit {code}\n{text}\n", flush=True)
            rc = rc or code
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
