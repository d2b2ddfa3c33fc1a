"""What the window tests share: a small workload, a throw-away settings file, a window with results."""
import pytest
from PySide6.QtCore import QSettings

from kvviz.analysis.session import SessionConfig

WAIT = 90_000  # ms: lavapipe on a busy 2-core machine


def small_config(**kw) -> SessionConfig:
    base = dict(context_lens=(40, 17, 70), num_heads=4, num_kv_heads=2, head_size=64, timing_runs=3)
    base.update(kw)
    return SessionConfig(**base)


@pytest.fixture
def settings(tmp_path):
    s = QSettings(str(tmp_path / "kvviz-test.ini"), QSettings.IniFormat)
    yield s
    s.sync()


def open_window(qtbot, settings, session, cfg=None):
    """A shown MainWindow whose first compute has finished (and the inspector read its first block)."""
    from kvviz.ui.main_window import MainWindow

    win = MainWindow(settings=settings, config=cfg or small_config(), session=session, debounce_ms=50)
    qtbot.addWidget(win)
    with qtbot.waitSignal(win.results_ready, timeout=WAIT):
        win.resize(1500, 950)
        win.show()
    qtbot.waitUntil(lambda: not win.runner.busy, timeout=WAIT)
    return win


@pytest.fixture
def window(qtbot, settings, session):
    win = open_window(qtbot, settings, session)
    yield win
    win.close()
