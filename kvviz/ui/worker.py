"""One worker QThread that runs every GPU task of the window, one at a time.

Modelled on Orange's ConcurrentWidgetMixin: the UI thread submits a `Task` (a function of
`progress(frac, msg)` and `cancel() -> bool`); a new task cancels the one it supersedes (a new
compute cancels a running compute, sweep, comparison or live decode; a live decode cancels a
running compute; a new sweep a running sweep, ...) and replaces it in the queue (a pending task
removed so is reported by `dropped`). Tasks check the cancel flag between GPU calls (Session.compute
raises `Cancelled`, Session.sweep returns the points it has). Results, errors and progress come back as
queued signals, so slots run on the UI thread and the UI never waits on the GPU.

All wgpu work happens on this single thread, so the GPU device is never used by two threads at once.
"""
from __future__ import annotations

import gc
import itertools
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Callable

from PySide6.QtCore import QObject, QThread, Signal

_ids = itertools.count(1)
_UI_GC = {"runners": 0, "collector": None}


def _ui_thread_gc(acquire: bool) -> None:
    """Python's cyclic garbage collector runs on whichever thread happens to allocate; run on the worker, it
    destroys the Qt objects of widget cycles there, and PySide deadlocks against the UI thread destroying their
    relatives (a fresh-clone test run hung so: gdb showed gc_collect_generations on the worker in ~QObject
    waiting for the GIL, the UI thread in ~QObject waiting for a Qt mutex). While any worker thread lives,
    pyqtgraph's GarbageCollector keeps automatic collection off and collects on a timer of the UI thread;
    when the last worker has stopped, automatic collection is back."""
    if acquire:
        if _UI_GC["runners"] == 0:
            from pyqtgraph.util.garbage_collector import GarbageCollector

            _UI_GC["collector"] = GarbageCollector(interval=1.0)  # gc.disable() + a UI-thread timer
        _UI_GC["runners"] += 1
        return
    _UI_GC["runners"] -= 1
    if _UI_GC["runners"] == 0 and _UI_GC["collector"] is not None:
        _UI_GC["collector"].timer.stop()
        _UI_GC["collector"] = None
        gc.enable()


# kind of the new task -> kinds it cancels and replaces
SUPERSEDES = {
    "compute": {"compute", "sweep", "compare", "live", "bias"},
    "sweep": {"sweep"},
    "compare": {"compare"},
    "inspect": {"inspect"},
    "adapter": {"adapter"},
    "model": {"model"},  # load a model and read its shapes
    "bias": {"bias"},  # TurboQuant estimator bias of one (sequence, head) of the current results
    "live": {"live", "compute", "sweep", "compare"},  # live decode: it and the main compute cancel each other
}


@dataclass(eq=False)
class Task:
    kind: str
    fn: Callable  # fn(progress, cancel) -> result
    label: str = ""
    id: int = field(default_factory=lambda: next(_ids))
    cancel_event: threading.Event = field(default_factory=threading.Event)
    payload: object = None  # what the submitter wants back with the result (e.g. the config)
    started_at: float = 0.0

    @property
    def cancelled(self) -> bool:
        return self.cancel_event.is_set()

    def cancel(self) -> None:
        self.cancel_event.set()


class _Thread(QThread):
    def __init__(self, runner: "TaskRunner"):
        super().__init__()
        self.runner = runner
        self.setObjectName("kvviz-worker")

    def run(self) -> None:  # worker thread
        r = self.runner
        while True:
            with r._cond:
                while not r._pending and not r._stopping:
                    r._cond.wait()
                if r._stopping:
                    return
                task = r._pending.pop(0)
                r._current = task
            task.started_at = time.perf_counter()
            r.started.emit(task)

            def progress(frac, msg, _t=task):
                r.progress.emit(_t, float(frac), str(msg))

            try:
                result = task.fn(progress, task.cancel_event.is_set)
            except BaseException as exc:  # noqa: BLE001 - every error goes to the window
                exc.__kvviz_traceback__ = traceback.format_exc()
                with r._cond:
                    r._current = None
                r.failed.emit(task, exc)
                keep = (task, exc)
                del exc
            else:
                with r._cond:
                    r._current = None
                r.finished.emit(task, result)
                keep = (task, result)
                del result
            # This thread must never drop the last reference to what a task holds (its function closes over
            # widgets): a Qt object destroyed here, while the UI thread destroys its relatives, deadlocks
            # PySide (a Qt mutex held here waiting for the GIL, the GIL held there waiting for the mutex;
            # seen as a hung pytest-qt run). The UI thread releases them (TaskRunner._release, queued).
            with r._cond:
                r._graveyard.append(keep)
            del task, progress, keep
            r.release.emit()
            if not r._pending:
                r.idle.emit()


class TaskRunner(QObject):
    """Owns the worker thread and the queue of pending tasks."""

    started = Signal(object)  # Task
    progress = Signal(object, float, str)  # Task, fraction, message
    finished = Signal(object, object)  # Task, result
    failed = Signal(object, object)  # Task, exception
    idle = Signal()
    dropped = Signal(object)  # Task: a pending task removed before it ran (superseded or cancelled)
    release = Signal()  # the worker has finished tasks whose references the UI thread must drop (_release)

    def __init__(self, parent=None):
        super().__init__(parent)
        self._cond = threading.Condition()
        self._pending: list[Task] = []
        self._current: Task | None = None
        self._graveyard: list = []  # (task, result or error) the worker is done with, dropped on the UI thread
        self._stopping = False
        self.release.connect(self._release)
        _ui_thread_gc(acquire=True)
        self._gc_held = True
        self._thread = _Thread(self)
        self._thread.start()
        from PySide6.QtCore import QCoreApplication

        app = QCoreApplication.instance()
        if app is not None:
            app.aboutToQuit.connect(self.shutdown)

    def _release(self) -> None:  # UI thread (queued from the worker)
        with self._cond:
            done, self._graveyard = self._graveyard, []
        done.clear()  # the last references to finished tasks go here, on the UI thread

    # --------------------------------------------------------------- UI thread API
    def submit(self, kind: str, fn: Callable, label: str = "", payload=None) -> Task:
        task = Task(kind, fn, label or kind, payload=payload)
        replaces = SUPERSEDES.get(kind, {kind})
        with self._cond:
            gone = [t for t in self._pending if t.kind in replaces]
            self._pending = [t for t in self._pending if t.kind not in replaces]
            if self._current is not None and self._current.kind in replaces:
                self._current.cancel()
            self._pending.append(task)
            self._cond.notify()
        self._dropped(gone)
        return task

    def _dropped(self, tasks) -> None:
        for t in tasks:
            t.cancel()
            self.dropped.emit(t)

    def cancel_all(self) -> bool:
        """Cancel the running task and drop the pending ones. True if anything was cancelled."""
        with self._cond:
            had = bool(self._pending) or self._current is not None
            gone = list(self._pending)
            self._pending.clear()
            if self._current is not None:
                self._current.cancel()
        self._dropped(gone)
        return had

    def cancel_kind(self, kind: str) -> bool:
        """Cancel the running task and drop the pending ones of `kind` only. True if anything was cancelled."""
        with self._cond:
            gone = [t for t in self._pending if t.kind == kind]
            self._pending = [t for t in self._pending if t.kind != kind]
            had = bool(gone)
            if self._current is not None and self._current.kind == kind:
                self._current.cancel()
                had = True
        self._dropped(gone)
        return had

    @property
    def current(self) -> Task | None:
        return self._current

    @property
    def busy(self) -> bool:
        with self._cond:
            return self._current is not None or bool(self._pending)

    def pending_kinds(self) -> list[str]:
        with self._cond:
            return [t.kind for t in self._pending]

    def shutdown(self, timeout_ms: int = 15000) -> None:
        with self._cond:
            self._stopping = True
            self._pending.clear()
            if self._current is not None:
                self._current.cancel()
            self._cond.notify_all()
        self._thread.wait(timeout_ms)
        if self._gc_held and self._thread.isFinished():  # only once the worker can no longer run a collection
            self._gc_held = False
            _ui_thread_gc(acquire=False)
