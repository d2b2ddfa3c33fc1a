"""Screenshot of the GPU timing panel for one method (seed and fast kernels side by side):
    xvfb-run -s "-screen 0 1920x1080x24" python tools/screenshot_timing.py int8_seed assets/screenshot-timing.png
Runs the window on a 15-sequence ragged workload (lavapipe: times are CPU times), raises the timing panel
alone and saves it."""
import sys
import tempfile

from PySide6.QtCore import QSettings, QTimer
from PySide6.QtWidgets import QApplication

from kvviz.analysis.session import Session, SessionConfig
from kvviz.ui.main_window import MainWindow

method, out = (sys.argv[1], sys.argv[2]) if len(sys.argv) > 2 else ("int8_seed", "assets/screenshot-timing.png")
app = QApplication.instance() or QApplication([])
settings = QSettings(tempfile.mktemp(suffix=".ini"), QSettings.IniFormat)
cfg = SessionConfig(method=method, context_lens=(512, 300, 700, 1024), num_heads=8, num_kv_heads=2, head_size=128,
                    timing_runs=5)
win = MainWindow(settings=settings, config=cfg, session=Session(), debounce_ms=50)
win.resize(1600, 1000)
win.show()


def shoot(*_):
    def later():
        if win.runner.busy:
            QTimer.singleShot(500, later)
            return
        dock = win.timing.parentWidget()
        while dock is not None and not hasattr(dock, "setFloating"):
            dock = dock.parentWidget()
        if dock is not None:
            dock.setFloating(True)
            dock.resize(1500, 900)
            dock.raise_()
        QTimer.singleShot(1500, lambda: (win.timing.grab().save(out), print("saved", out), app.quit()))

    QTimer.singleShot(500, later)


win.results_ready.connect(shoot)
app.exec()
