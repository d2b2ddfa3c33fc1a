"""The roofline of every kernel of a window run as a PNG (for the README), and the Kernel lab beside it.

    QT_QPA_PLATFORM=offscreen .venv/bin/python tools/roofline_screenshot.py --out assets/roofline.png \
        [--method int8_token] [--seqs 15 --ctx 4096 --heads 32 --kv-heads 8 --head-size 128 --block-size 16]
    QT_QPA_PLATFORM=offscreen .venv/bin/python tools/roofline_screenshot.py --out assets/roofline-h200.png \
        --bench assets/bench/h200-....json [--shape decode-15x4096]

With --bench it draws the app's Roofline tab (the same widget) over a `kvviz bench --json` file instead: the
kernels and ceilings measured on the machine that ran the bench (a GPU machine without Qt), saved here.

Opens the window on that workload, waits for its results and the FMA ceiling the Roofline tab measures on the
same device, raises the Roofline tab of the GPU timing panel and saves that panel (2x). With --lab SLOT it also
starts that slot's built-in kernel as a user file in the Kernel lab, waits for its check and timing and saves
the lab panel beside it (<out stem>-lab.png).
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--method", default="int8_token")
    ap.add_argument("--seqs", type=int, default=4)
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-size", type=int, default=128)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--lab", default="", help="a slot to run in the Kernel lab too (say int8_token.writer)")
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--bench", default="", help="draw this kvviz bench --json file instead of running the window")
    ap.add_argument("--shape", default=None, help="with --bench: the bench shape (default: the file's first)")
    a = ap.parse_args()
    if a.bench:
        return bench_screenshot(a)
    os.environ.setdefault("XDG_RUNTIME_DIR", tempfile.gettempdir())
    from PySide6.QtCore import QElapsedTimer, QSettings
    from PySide6.QtWidgets import QApplication

    from kvviz.analysis.session import SessionConfig
    from kvviz.ui.export import save_png
    from kvviz.ui.main_window import MainWindow

    app = QApplication.instance() or QApplication([])
    td = tempfile.mkdtemp(prefix="kvviz-roofline-")
    cfg = SessionConfig(context_lens=(a.ctx,) * a.seqs, num_heads=a.heads, num_kv_heads=a.kv_heads,
                        head_size=a.head_size, block_size=a.block_size, method=a.method)
    win = MainWindow(settings=QSettings(os.path.join(td, "s.ini"), QSettings.IniFormat), config=cfg)
    if getattr(win, "roofline", None) is None:
        from kvviz.ui.panels.lab import install

        install(win)
    win.resize(1700, 1050)
    win.show()
    clock = QElapsedTimer()
    clock.start()

    def wait(cond, what):
        while not cond():
            app.processEvents()
            if clock.elapsed() > a.timeout * 1000:
                raise SystemExit(f"timed out waiting for {what}")

    wait(lambda: win.results is not None and win.roofline.ceilings is not None and not win.runner.busy,
         "the results and the ceilings")
    win.docks["timing"].raise_()
    win.timing.tabs.setCurrentWidget(win.roofline)
    app.processEvents()
    win.timing.resize(1100, 760)
    print("wrote", save_png(win.timing, a.out, 2.0))
    for p in win.roofline.points:
        print(f"{p.kernel:<50} {p.intensity:8.3g} FLOP/B {p.gflops:10.4g} GFLOP/s {p.bound(win.roofline.ceilings)}")
    c = win.roofline.ceilings
    print(f"ceilings: copy {c.mem_gbps:.4g} GB/s, f32 FMA {c.f32_gflops:.4g} GFLOP/s, f16 {c.f16_gflops}")
    if a.lab:
        lab = win.lab
        lab.set_slot(a.lab)
        from kvviz.lab.slots import slot

        lab.new_file(os.path.join(td, f"mine{slot(a.lab).suffix}"))
        wait(lambda: lab.runs and not win.runner.busy, "the lab run")
        win.docks["kernel_lab"].raise_()
        app.processEvents()
        lab.resize(1200, 760)
        stem, ext = os.path.splitext(a.out)
        print("wrote", save_png(lab, f"{stem}-lab{ext or '.png'}", 2.0))
        for t in lab.last.timings:
            print(f"{t.name:<50} {t.impl:<10} {t.timing.median_us:10.1f} us")
        print(lab.last.check.summary())
    win.close()
    return 0


def bench_screenshot(a) -> int:
    import json

    os.environ.setdefault("XDG_RUNTIME_DIR", tempfile.gettempdir())
    from PySide6.QtWidgets import QApplication

    from kvviz.bench.roofline import bench_roofline
    from kvviz.ui.export import save_png
    from kvviz.ui.style import setup_pyqtgraph
    from kvviz.ui.widgets.roofline import RooflineWidget

    app = QApplication.instance() or QApplication([])
    setup_pyqtgraph()  # the app's look (white plots)
    with open(a.bench) as fh:
        result = json.load(fh)
    pts, c = bench_roofline(result, a.shape)
    w = RooflineWidget()
    w.measure_button.hide()  # the ceilings are the bench's, measured in its run
    w.set_data(pts, c)
    w.resize(1400, 1500)
    w.show()
    from PySide6.QtWidgets import QSplitter

    w.findChild(QSplitter).setSizes([700, 800])  # the chart and every row of the table
    app.processEvents()
    print("wrote", save_png(w, a.out, 2.0))
    for p in pts:
        print(f"{p.kernel:<50} {p.intensity:8.3g} FLOP/B {p.gflops:10.4g} GFLOP/s {p.median_us:9.1f} us {p.bound(c)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
