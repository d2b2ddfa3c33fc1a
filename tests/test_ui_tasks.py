"""The window's task table: a new kind of worker task is one entry of kvviz.ui.tasks.TASKS."""
import pytest
from PySide6.QtCore import QSettings

from kvviz.analysis.session import Session
from kvviz.errors import InvalidInput


@pytest.fixture(scope="module")
def _module_bare_window(request, qapp, tmp_path_factory):
    """A window on a device of its own (its log holds what the device logged as it opened) that computes nothing,
    shared by this module's tests: they add a task kind, log, or read its menus."""
    from pytestqt.qtbot import QtBot

    from kvviz.ui.main_window import MainWindow

    folder = tmp_path_factory.mktemp("bare-window")
    win = MainWindow(settings=QSettings(str(folder / "t.ini"), QSettings.IniFormat), session=Session(),
                     autostart=False)
    win.show()
    QtBot(request).waitUntil(lambda: not win.runner.busy, timeout=60_000)  # the adapter task
    yield win
    win.close()
    win.deleteLater()


@pytest.fixture
def bare_window(qtbot, _module_bare_window):
    win = _module_bare_window
    qtbot.waitUntil(lambda: not win.runner.busy, timeout=60_000)
    yield win
    qtbot.waitUntil(lambda: not win.runner.busy, timeout=60_000)


def test_a_new_task_kind_runs_through_its_table_entry(qtbot, bare_window):
    from kvviz.ui.tasks import TASKS, TaskKind, register

    shown, failed = [], []
    register(TaskKind("echo", "Echo failed", lambda win, task, result: shown.append((task.payload, result)),
                      lambda win, task, exc: failed.append(str(exc))))
    try:
        win = bare_window
        win.runner.submit("echo", lambda progress, cancel: 42, "echo", payload="first")
        qtbot.waitUntil(lambda: shown == [("first", 42)], timeout=10_000)

        def boom(progress, cancel):
            raise InvalidInput("no echo here")

        win.runner.submit("echo", boom, "echo")
        qtbot.waitUntil(lambda: failed == ["no echo here"], timeout=10_000)
        assert win.banner.isVisible() and "Echo failed" in win.banner.title.text()
    finally:
        TASKS.pop("echo", None)


def test_every_task_the_window_submits_has_an_entry():
    import inspect

    from kvviz.ui import main_window
    from kvviz.ui.tasks import TASKS

    src = inspect.getsource(main_window)
    import re

    kinds = set(re.findall(r'submit\(\s*"(\w+)"', src))
    assert kinds and kinds <= set(TASKS), kinds - set(TASKS)


def test_log_dock_shows_kvviz_records_from_any_thread(qtbot, bare_window):
    import logging
    import threading

    win = bare_window
    assert "log" in win.docks
    t = threading.Thread(target=lambda: logging.getLogger("kvviz.test").info("hello from a worker thread"))
    t.start()
    t.join()
    qtbot.waitUntil(lambda: "hello from a worker thread" in win.log_panel.text(), timeout=5_000)
    # the window logged its GPU adapter when it opened it
    assert "kvviz.gpu" in win.log_panel.text()


def test_verbose_flag_logs_at_info(capfd):
    from kvviz.cli import main

    assert main(["-v", "info"]) == 0
    err = capfd.readouterr().err
    assert "INFO kvviz.gpu" in err and "loop limit" in err
    assert main(["info"]) == 0
    assert "INFO kvviz" not in capfd.readouterr().err


def test_panels_ask_through_the_typed_app_state(qtbot):
    """No panel holds the window: exports, inspections and the trace go out as AppState signals."""
    from kvviz.ui.panels import BlockInspectorPanel, CodesPanel, TimingPanel
    from kvviz.ui.state import AppState

    state = AppState()
    asked = []
    state.export_requested.connect(lambda panel, fmt: asked.append(("export", panel.key, fmt)))
    state.trace_export_requested.connect(lambda: asked.append(("trace",)))
    codes, timing, inspector = CodesPanel(state), TimingPanel(state), BlockInspectorPanel(state)
    for p in (codes, timing, inspector):
        qtbot.addWidget(p)
        assert not hasattr(p, "host")
    codes._export_clicked("csv")
    timing.trace_button.click()
    assert asked == [("export", "codes", "csv"), ("trace",)]


def test_help_menu_lists_shortcuts_and_names_the_adapter(qtbot, bare_window):
    win = bare_window
    lines = "\n".join(win.shortcut_lines())
    for keys, what in (("Ctrl+R", "Run now"), ("Ctrl+P", "Pin timings"), ("Ctrl+Shift+W", "sweep"),
                       ("Ctrl+M", "Compare"), ("Alt+1", "Show Workload"), ("F1", "Keyboard shortcuts")):
        assert any(keys in ln and what in ln for ln in lines.splitlines()), (keys, what, lines)
    about = win.about_text()
    assert win.session.rt.summary.name in about and "wgpu 0.32.0" in about and "PySide6" in about
    win._raise_dock("timing")
    assert win.docks["timing"].isVisible()


def test_the_worker_never_drops_a_tasks_last_reference(qtbot):
    """What a task's function holds (in the window: closures over widgets) is released on the UI thread,
    never on the worker: a Qt object destroyed on the worker while the UI thread destroys its relatives
    deadlocked PySide (a hung pytest-qt run). Whatever the order the threads run in, the object dies here."""
    import threading

    from kvviz.ui.worker import TaskRunner

    died_on = []

    class Held:
        def __del__(self):
            died_on.append(threading.current_thread() is threading.main_thread())

    runner = TaskRunner()
    try:
        for kind in ("compute", "sweep", "compare"):
            held = Held()
            with qtbot.waitSignal(runner.finished, timeout=10_000):
                runner.submit(kind, lambda p, c, h=held: "done")
            del held  # the test's reference: the task (in the finished signal / the graveyard) is the last
            qtbot.waitUntil(lambda: len(died_on) == ["compute", "sweep", "compare"].index(kind) + 1, timeout=10_000)
        with qtbot.waitSignal(runner.failed, timeout=10_000):
            held = Held()
            runner.submit("inspect", lambda p, c, h=held: 1 / 0)
            del held
        qtbot.waitUntil(lambda: len(died_on) == 4, timeout=10_000)
        assert died_on == [True] * 4
    finally:
        runner.shutdown()


def test_garbage_is_collected_on_the_ui_thread_only(qtbot):
    """While a TaskRunner (the window's worker thread) lives, Python's automatic cyclic collection is off and a
    timer of the UI thread collects instead, so widget cycles are never destroyed on the worker; once the last
    worker has stopped, automatic collection is back."""
    import gc

    from kvviz.ui.worker import TaskRunner

    runner = TaskRunner()
    try:
        assert not gc.isenabled()
        before = gc.get_count()[0]
        cycles = []
        for _ in range(2000):  # cyclic garbage past generation 0's threshold
            a = []
            a.append(a)
            cycles.append(a)
        del cycles, a
        qtbot.waitUntil(lambda: gc.get_count()[0] < max(before, 1000), timeout=5_000)
    finally:
        runner.shutdown()
    from kvviz.ui.worker import _UI_GC

    assert gc.isenabled() == (_UI_GC["runners"] == 0)  # other windows' workers may still be alive
