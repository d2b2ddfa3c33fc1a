"""The window's typed app state: what the panels share and how they ask the window for work.

Panels get the `AppState`, not the window: they read `state.results`, and they ask for work by
emitting its request signals (export a panel, inspect a block, export the trace, say something in
the status bar, show an error). The window connects each request to what carries it out.

It also holds what is wrong right now, as `Notice`s keyed by where they come from (the Workload's
fields, the last compute, the Kernel lab's file, an export ...). Each notice says which panels it
makes stale and whether the error banner shows it. Every panel's stale note, the banner and the
Workload's red field are drawn from these notices alone (`notices_changed`): a notice is reported
when something fails and resolved when the same thing succeeds, so no panel clears or keeps a note of
its own and none can outlive what it says.
"""
from __future__ import annotations

from dataclasses import dataclass

from PySide6.QtCore import QObject, Signal

from kvviz.errors import KvvizError

# The panels that draw the window's `Results` (a failed or invalid compute leaves them showing the last run).
RESULT_PANELS = frozenset({"overview", "cache_layout", "scales", "codes", "attention", "timing", "compare",
                           "block_inspector", "qjl_bias"})


@dataclass(frozen=True)
class Notice:
    """Something that is wrong now, or a view that no longer matches its inputs.

    source: what it is about; a later success of the same source resolves it ("compute", "workload",
    "lab", "export", ...). title: the banner's title. exc: the error (None for a notice that is not an
    error: the Workload edited since the last run). stale: the keys of the panels whose content it makes
    stale; why: what their stale note says. field: the SessionConfig field it names (the Workload marks it).
    banner: whether the error banner shows it.
    """

    source: str
    title: str
    exc: BaseException | None = None
    stale: frozenset = frozenset()
    why: str = ""
    field: str | None = None
    banner: bool = True

    def message(self) -> str:
        e = self.exc
        if e is None:
            return self.why
        return str(e) if isinstance(e, KvvizError) else f"{type(e).__name__}: {e}"

    def hint(self) -> str:
        e = self.exc
        if e is None:
            return ""
        if isinstance(e, KvvizError):
            return e.hint
        return "Unexpected error (details in the log); the window keeps working."


@dataclass(frozen=True)
class Baseline:
    """The pinned run of the history, as the panels compare against it: its id, how it is named, its headline
    numbers (kvviz.history.numbers; {} for a bench run, which has timings only)."""

    run_id: int
    title: str
    numbers: dict


class AppState(QObject):
    results_changed = Signal(object)  # the Results every panel draws
    notices_changed = Signal()  # a notice was reported, resolved or dismissed
    baseline_changed = Signal()  # a run was pinned or unpinned: `baseline`
    # requests from the panels
    export_requested = Signal(object, str)  # panel, "png" | "svg" | "csv"
    inspect_requested = Signal(int, int, str)  # physical block, KV head, "K" | "V"
    trace_export_requested = Signal()
    status_message = Signal(str)
    error = Signal(str, object)  # where, the exception

    def __init__(self, parent=None):
        super().__init__(parent)
        self.results = None
        self._notices: dict[str, Notice] = {}  # source -> notice, in the order reported (the newest last)
        self._dismissed: set = set()  # sources whose banner the user closed (their stale notes stay)
        self.baseline: Baseline | None = None

    def set_baseline(self, baseline: Baseline | None) -> None:
        self.baseline = baseline
        self.baseline_changed.emit()

    def set_results(self, res) -> None:
        self.results = res
        self.results_changed.emit(res)

    # ------------------------------------------------------------------ notices
    def report(self, notice: Notice) -> None:
        """Replace the notice of `notice.source` (the newest goes to the end: the banner shows it)."""
        self._notices.pop(notice.source, None)
        self._notices[notice.source] = notice
        self._dismissed.discard(notice.source)
        self.notices_changed.emit()

    def resolve(self, *sources: str) -> None:
        """The sources succeeded: their notices go (a source without one is ignored)."""
        gone = [s for s in sources if s in self._notices]
        for s in gone:
            del self._notices[s]
            self._dismissed.discard(s)
        if gone:
            self.notices_changed.emit()

    def resolve_where(self, pred) -> None:
        """Resolve every notice for which pred(notice) is true."""
        self.resolve(*[s for s, n in self._notices.items() if pred(n)])

    def notice(self, source: str) -> Notice | None:
        return self._notices.get(source)

    def notices(self) -> list[Notice]:
        return list(self._notices.values())

    def stale_why(self, panel_key: str) -> str | None:
        """What the panel's stale note says (the newest notice that makes it stale), None when it is current."""
        for n in reversed(list(self._notices.values())):
            if panel_key in n.stale:
                return n.why or n.message()
        return None

    def banner_notices(self) -> list[Notice]:
        """The notices the banner shows, newest first (those dismissed left out)."""
        return [n for n in reversed(list(self._notices.values())) if n.banner and n.source not in self._dismissed]

    def dismiss_banner(self) -> None:
        """The user closed the banner: what it showed is dismissed (a new report shows again)."""
        shown = [n.source for n in self.banner_notices()]
        if shown:
            self._dismissed.update(shown)
            self.notices_changed.emit()

    def marked_field(self) -> tuple[str, str] | None:
        """(field, message) of the newest notice that names a Workload field."""
        for n in reversed(list(self._notices.values())):
            if n.field:
                return n.field, n.message()
        return None


def model_label(path: str) -> str:
    return path.replace("\\", "/").rsplit("/", 1)[-1] if path else "SmolLM2-135M"
