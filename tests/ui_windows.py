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


def _workload_config(win):
    try:
        return win.workload.config()
    except Exception:  # noqa: BLE001 - a field a test left unreadable: the window is not as it was opened
        return None


def restore(qtbot, win, cfg=None) -> None:
    """The window as open_window leaves it: auto-run on, no banner, no field marked, nothing stale, and the
    Workload's settings `cfg` (small_config) computed. Computes again only where a test changed one of these."""
    cfg = cfg or small_config()
    qtbot.waitUntil(lambda: not win.runner.busy, timeout=WAIT)
    auto_run_was_off = not win.workload.auto_run.isChecked()
    if auto_run_was_off:
        win.workload.auto_run.setChecked(True)
    changed = (auto_run_was_off or win.banner.isVisible() or win.workload.invalid_field is not None
               or win.results is None or win.results.config != cfg or _workload_config(win) != cfg
               or any(p.is_stale for p in win.panels + [win.bias]))
    if changed:
        if win.banner.isVisible():
            win.banner._dismiss()
        win.workload.set_config(cfg)
        with qtbot.waitSignal(win.results_ready, timeout=WAIT):
            win.request_compute()
        qtbot.waitUntil(lambda: not win.runner.busy, timeout=WAIT)
    assert win.results.config == cfg and not win.banner.isVisible() and win.workload.invalid_field is None


@pytest.fixture
def shared_window(qtbot, _module_window):
    """The `window` fixture's window, opened once for a module's tests: they read its panels, hover, export, switch
    tabs, or change the Workload's settings, mark a field or show the banner, which restore() puts back after each
    test (computing the window's settings again where they changed). A test that checks what only a fresh window
    shows (its first inspected block, an empty run history, its timing history) or that needs the window active
    (a key press) takes `window`. Its run history and settings are in folders of its own."""
    win = _module_window
    restore(qtbot, win)
    yield win
    restore(qtbot, win)


def settled(qtbot, key: str, cuts_now) -> None:
    """No cut text or widget (`cuts_now()` lists them) once the layout has run: a dock's layout and a word-wrapped
    label's height settle over a few event-loop turns (later on a loaded machine), so the check is repeated until it
    holds, for at most two seconds, then fails with the cuts that stayed."""
    cuts = []

    def clean() -> bool:
        cuts[:] = cuts_now()
        return not cuts

    try:
        qtbot.waitUntil(clean, timeout=2000)
    except Exception:  # noqa: BLE001 - pytest-qt's timeout: the cuts that stayed say what is wrong
        raise AssertionError(f"{key}:\n" + "\n".join(cuts)) from None
