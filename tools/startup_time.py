#!/usr/bin/env python3
"""Time from launching the window to its first results on screen, and where that time goes.

Each run starts `main.py` (what `make run` starts) in a fresh process on the current display, with a
throw-away settings file (no saved arrangement or workload is restored), and stops it once the default
workload's results are drawn. The clock starts just before the process is started; the window's phases
are marked against the same clock: Python started, the window's modules imported, the window built, the
GPU opened, the compute (worker thread), the first results drawn (everything but the kernels' timings)
and every result drawn. One untimed launch warms the file cache first; figures are medians of --runs.

    xvfb-run -a -s "-screen 0 1280x800x24" .venv/bin/python tools/startup_time.py --runs 3
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Runs in the child: the window's own code, with marks hooked onto its phases (nothing of it is changed).
CHILD = r"""
import importlib.abc, importlib.machinery, os, runpy, sys, time
T0 = float(os.environ["KVVIZ_STARTUP_T0"])
marks = [("python started", time.time() - T0)]
def mark(what):
    marks.append((what, time.time() - T0))
def wrap(cls, name, before=None, after=None):
    orig = getattr(cls, name)
    def hooked(self, *a, **k):
        if before: mark(before)
        out = orig(self, *a, **k)
        if after: mark(after)
        return out
    setattr(cls, name, hooked)
def done():
    for what, t in sorted(marks, key=lambda m: m[1]):
        print(f"mark {t:.3f} {what}", flush=True)
    os._exit(0)
def drawn(what, last):
    def after(self, *a):
        from PySide6.QtWidgets import QApplication
        QApplication.processEvents()  # the panels' paint events: the results are on screen
        mark(what)
        if last:
            done()
    return after
def patch(name, mod):
    if name == "kvviz.gpu.runtime":
        wrap(mod.GpuRuntime, "__init__", "GPU: opening", "GPU: open")
    elif name == "kvviz.analysis.session":
        wrap(mod.Session, "compute", "worker: compute starts", "worker: compute done")
    elif name == "kvviz.ui.main_window":
        mark("window modules imported")
        W = mod.MainWindow
        wrap(W, "__init__", "window: build starts", "window: built")
        for meth, what, last in (("_show_preview", "UI: first results drawn (all but the timings)", False),
                                 ("_show_results", "UI: every result drawn (timings too)", True)):
            if hasattr(W, meth):
                orig = getattr(W, meth)
                after = drawn(what, last)
                def hooked(self, *a, _o=orig, _after=after):
                    out = _o(self, *a)
                    _after(self)
                    return out
                setattr(W, meth, hooked)
class Hook(importlib.abc.MetaPathFinder):
    # patches a module of the window right after it is executed, wherever it is first imported
    NAMES = ("kvviz.gpu.runtime", "kvviz.analysis.session", "kvviz.ui.main_window")
    def find_spec(self, name, path, target=None):
        if name not in self.NAMES:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        run = spec.loader.exec_module
        def exec_module(module):
            run(module)
            patch(name, module)
        spec.loader.exec_module = exec_module
        return spec
sys.meta_path.insert(0, Hook())
sys.argv = ["main.py"]
runpy.run_path("main.py", run_name="__main__")
"""

def one_run(python: str) -> list[tuple[float, str]]:
    with tempfile.TemporaryDirectory(prefix="kvviz-startup-") as tmp:
        env = dict(os.environ, KVVIZ_SETTINGS=os.path.join(tmp, "settings.ini"), KVVIZ_DATA_DIR=os.path.join(tmp, "data"),
                   XDG_RUNTIME_DIR=os.environ.get("XDG_RUNTIME_DIR", tmp))
        env["KVVIZ_STARTUP_T0"] = repr(time.time())
        p = subprocess.run([python, "-c", CHILD], env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    marks = [(float(ln.split()[1]), ln.split(None, 2)[2]) for ln in p.stdout.splitlines() if ln.startswith("mark ")]
    if not marks:
        raise SystemExit(f"the window did not report its first results (exit {p.returncode}):\n{p.stderr[-2000:]}")
    return marks


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3, help="timed launches (default 3), after one untimed warm-up")
    ap.add_argument("--python", default=sys.executable, help="the interpreter to launch (default: this one)")
    args = ap.parse_args(argv)
    if not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")):
        raise SystemExit("no display: run it under xvfb-run (see the module's doc)")
    one_run(args.python)  # warm-up: the file cache, the shader and pipeline caches of the driver
    runs = [one_run(args.python) for _ in range(args.runs)]
    names = [w for _, w in runs[0]]
    print(f"{'phase (seconds after launch)':<32}" + "".join(f"{'run ' + str(i + 1):>8}" for i in range(len(runs)))
          + f"{'median':>8}")
    for name in names:
        ts = [dict((w, t) for t, w in r).get(name, float("nan")) for r in runs]
        print(f"{name:<32}" + "".join(f"{t:8.2f}" for t in ts) + f"{statistics.median(ts):8.2f}")
    for name in names:
        if name.startswith("UI: "):
            total = statistics.median(dict((w, t) for t, w in r)[name] for r in runs)
            print(f"{name[4:]}: {total:.2f} s after launch (median of {len(runs)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
