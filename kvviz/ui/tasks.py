"""The window's task table: one entry per kind of worker task says how its result is shown, how a
failure or a cancel is reported, and whether a newer task has made it stale.

`MainWindow` dispatches every worker event through `TASKS`; a new kind of task is one `register`
call (plus the `submit` that starts it), not a branch in the window.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from kvviz.errors import Cancelled
from kvviz.ui.state import RESULT_PANELS, model_label


@dataclass(frozen=True)
class TaskKind:
    name: str
    failure_title: str  # the error banner's title when a task of this kind fails
    done: Callable  # (window, task, result): show the result
    failed: Callable | None = None  # (window, task, exc): what else a failure changes (after the banner)
    cancelled: Callable | None = None  # (window, task): replaces the default "cancelled" status
    current: Callable = lambda win, task: True  # False: a newer task replaced this one
    stale_is_silent: bool = False  # a replaced task's failure shows nothing at all
    quiet: bool = False  # no status-line text (quick background lookups)
    dropped_is_cancel: bool = False  # removed before it ran (replaced while pending): report it as cancelled
    # A failure is a notice of the app state (kvviz.ui.state) under the task's name, resolved by the next task
    # of the kind that succeeds: the banner shows it, and it makes these panels' content stale, saying why.
    stale: frozenset = frozenset()
    stale_why: str = ""  # the stale note's words, before the error's first line
    resolves: tuple = ()  # other notices a success resolves (a compute that ran: the Workload's)


TASKS: dict[str, TaskKind] = {}


def register(kind: TaskKind) -> TaskKind:
    TASKS[kind.name] = kind
    return kind


# ------------------------------------------------------------------ compute
def _compute_done(win, task, result) -> None:
    if task.cancelled:  # cancelled after its last step: a cancel leaves no results, no history entry
        win._task_failed(task, Cancelled())
        return
    win._show_results(result, task.payload.cfg)
    if task.payload.explicit:  # a run the user asked for is kept in the run history; a recompute is not
        win.keep_run(result, "run")


def _compute_failed(win, task, exc) -> None:
    if task is win._compute_task:
        win.drop_preview()
        win.status_label.setText("Compute failed" + (" - showing the previous results" if win.results else ""))
        win.compute_failed.emit(exc)


def _compute_cancelled(win, task) -> None:
    win.drop_preview()
    win.default_cancelled(task)


register(TaskKind("compute", "Compute failed", _compute_done, _compute_failed, _compute_cancelled,
                  current=lambda win, task: task is win._compute_task, stale=RESULT_PANELS,
                  stale_why="these are the results of the last run; the run after it failed",
                  resolves=("workload", "edited", "Load config", "stored", "model")))


# ------------------------------------------------------------------ sweep
def _sweep_done(win, task, result) -> None:
    win.timing.set_sweep(result, task.cancelled)
    res = task.payload[2]
    if res is not None and result:  # the sweep's points and samples kept in the run history
        win.timing.history_view.record_sweep(res, result)
    win.status_label.setText(f"Sweep: {len(result)} point(s)" + (" (cancelled)" if task.cancelled else ""))
    win.sweep_ready.emit(result)


def _sweep_cancelled(win, task) -> None:
    win.default_cancelled(task)
    win.timing.sweep_status.setText("Sweep cancelled.")


register(TaskKind("sweep", "Sweep failed", _sweep_done,
                  lambda win, task, exc: win.timing.sweep_status.setText(f"Sweep failed: {exc}"), _sweep_cancelled))


# ------------------------------------------------------------------ compare
def _compare_done(win, task, result) -> None:
    win.compare.set_rows(result, task.cancelled)
    win.compare_res = task.payload  # the results whose K/V were compared (stale once others are shown)
    win.sync_compare_stale()
    if result and not task.cancelled:  # kept in the run history with the results it compared on
        win.keep_run(task.payload, "compare", {"compare_rows": result})
    win.status_label.setText(f"Compared {len(result)} methods")
    win.compare_ready.emit(result)


register(TaskKind("compare", "Comparison failed", _compare_done,
                  lambda win, task, exc: win.compare.status.setText(f"Comparison failed: {exc}")))


# ------------------------------------------------------------------ adapter, model
register(TaskKind("adapter", "No GPU adapter", lambda win, task, result: win._set_adapter(result), quiet=True))


def _model_done(win, task, result) -> None:
    win.workload.set_model_info(task.payload, result)
    win.status_label.setText(f"Loaded {model_label(task.payload)}: {result.n_layers} layers, "
                             f"{result.n_heads} heads, {result.n_kv_heads} KV heads, head size {result.head_size}")
    win.model_info_ready.emit(task.payload, result)


register(TaskKind("model", "Model", _model_done,
                  lambda win, task, exc: win.workload.set_model_error(task.payload, str(exc))))


# ------------------------------------------------------------------ QJL bias, block inspector
def _bias_done(win, task, result) -> None:
    res, seq, head = task.payload
    if res is win.results and res is win.bias.res and (seq, head) == win.bias.selection():
        win.bias.set_bias(result, seq, head)
        win.bias_ready.emit(result)


register(TaskKind("bias", "QJL bias", _bias_done, lambda win, task, exc: win.bias.set_error(exc),
                  cancelled=lambda win, task: None, quiet=True))


def _inspect_done(win, task, result) -> None:
    res, block, kvh, which = task.payload
    if res is win.results:
        win.inspector.set_records(result, block, kvh, which)
        win.inspect_ready.emit(result)


register(TaskKind("inspect", "Block inspector", _inspect_done, quiet=True))


# ------------------------------------------------------------------ live decode
def _live_done(win, task, result) -> None:
    win.live_decoder = result["decoder"]
    win.live.finish(result)
    win.status_label.setText(f"Live decode: {win.live.info.text()}")
    win.live_finished.emit(result)


def _live_cancelled(win, task) -> None:
    why = win._live_why
    win.live.finish(cancelled=True, why=why or "stopped")
    win.status_label.setText("Live decode " + (why or "stopped") + f" after {len(win.live.steps)} step(s)")
    win.task_cancelled.emit("live")


register(TaskKind("live", "Live decode failed", _live_done, lambda win, task, exc: win.live.finish(error=exc),
                  _live_cancelled, current=lambda win, task: task.payload == win._live_run, stale_is_silent=True,
                  dropped_is_cancel=True))


# the live panel's cache-view read after a run: the job hands the view to the panel itself
register(TaskKind("live_view", "Live decode: cache view", lambda win, task, result: None, quiet=True))
