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


def module_window(request, session, tmp_path_factory, cfg=None):
    """Open a window for a whole module (a generator for a module-scoped fixture): its run history and settings in
    folders of its own, closed after the module's last test."""
    from pytestqt.qtbot import QtBot

    folder = tmp_path_factory.mktemp("shared-window")
    mp = pytest.MonkeyPatch()
    mp.setenv("KVVIZ_DATA_DIR", str(folder / "data"))  # each test's own folder (conftest) is set after this one
    settings = QSettings(str(folder / "kvviz-test.ini"), QSettings.IniFormat)
    win = open_window(QtBot(request), settings, session, cfg)
    yield win
    win.close()
    win.deleteLater()
    settings.sync()
    mp.undo()


@pytest.fixture(scope="module")
def _module_window(request, qapp, session, tmp_path_factory):
    yield from module_window(request, session, tmp_path_factory)


@pytest.fixture
def shared_window(qtbot, _module_window):
    """The `window` fixture's window, opened once for a module's tests that leave it as they found it: they read
    its panels, hover, export, switch tabs, or compute its own settings again. A test that changes the workload,
    marks a field or the banner, or checks what only a fresh window shows (its first inspected block, an empty run
    history) takes `window`. Its run history and settings are in folders of its own. Each test starts and ends with
    the window's worker idle."""
    win = _module_window
    qtbot.waitUntil(lambda: not win.runner.busy, timeout=WAIT)
    yield win
    qtbot.waitUntil(lambda: not win.runner.busy, timeout=WAIT)
