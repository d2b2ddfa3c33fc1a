"""Every panel usable at 1280x800 (pytest-qt, offscreen): the window's audit (kvviz.ui.audit.audit_window) over every
dock and every tab, after a run, a sweep, a comparison and a live decode, at 1280x800 and 1920x1080 and in the
live layout: no text cut (across or down), no panel wider than its dock, no tab bar of an earlier arrangement
painted; the error banner and a stale note leave the overview's numbers whole; the Workload keeps its width
whatever the method."""
import pytest

from kvviz.report.compare_run import method_instances, run_compare
from ui_windows import WAIT, open_window, settings, settled, small_config  # noqa: F401  (fixtures)

pytestmark = pytest.mark.gpu


def settle(qtbot, w):
    qtbot.waitUntil(lambda: not w.runner.busy, timeout=WAIT)
    qtbot.wait(30)


def audit(w, where):
    from kvviz.ui.audit import audit_window

    # What is inside the plots (tick labels, axis titles) is the plots' own matter; the widgets are checked here.
    return audit_window(w, where, plots=False)


def test_every_panel_and_tab_fits_in_both_layouts(qtbot, settings, session, tmp_path):
    from tiny_llama import write_tiny_gguf

    tiny = tmp_path / "tiny.gguf"  # a live decode of a tiny model: the panel filled in seconds
    write_tiny_gguf(tiny, head_size=32, seed=1)
    w = open_window(qtbot, settings, session, small_config(context_lens=(40, 17, 70, 33)))
    try:
        w.resize(1280, 800)
        w.reset_layout()
        w.timing.pin_current()  # a baseline: every card says its change, the overview gets taller
        with qtbot.waitSignal(w.results_ready, timeout=WAIT):  # and a method with a long name: a taller headline
            w.workload.method.setCurrentIndex(w.workload.method.findData("kivi"))
        # a sweep, a comparison (every method's row, four computed here to keep it short) and a live decode
        with qtbot.waitSignal(w.sweep_ready, timeout=WAIT):
            w.timing.sweep_values.setText("16, 32")
            w.timing.sweep_button.click()
        res = w.results
        rows = run_compare(session, res, methods=method_instances(res)[:4])
        w.compare.set_rows(rows)
        w.live.set_config(max_new=3, block_size=4, prompt="the cat in the hat sat", model_path=str(tiny))
        with qtbot.waitSignal(w.live_finished, timeout=WAIT):
            w.start_live()
        settle(qtbot, w)
        settled(qtbot, "1280x800", lambda: audit(w, "1280x800"))
        w.show_live_layout()
        qtbot.wait(30)
        settled(qtbot, "1280x800 live", lambda: audit(w, "1280x800 live"))
        w.reset_layout()
        qtbot.wait(30)
        assert w.size().toTuple() == (1280, 800)
        # the banner and every panel's stale note: the cards' numbers are whole (the audit checks heights too)
        w.workload.context_lens.setText("40, x")
        w.request_compute()
        assert w.banner.isVisible() and w.overview.is_stale
        qtbot.wait(30)
        settled(qtbot, "1280x800 banner", lambda: audit(w, "1280x800 banner"))
        assert w.size().toTuple() == (1280, 800)  # the centre's height never grows the window
        w.banner._dismiss()
        w.workload.context_lens.setText("40, 17, 70, 33")
        w._sync_edited()
        assert not w.banner.isVisible() and not w.overview.is_stale  # the settings computed are back
        w.resize(1920, 1080)
        w.reset_layout()
        qtbot.wait(30)
        settled(qtbot, "1920x1080", lambda: audit(w, "1920x1080"))
        w.show_live_layout()
        qtbot.wait(30)
        settled(qtbot, "1920x1080 live", lambda: audit(w, "1920x1080 live"))
    finally:
        w.close()


def test_the_workload_keeps_its_width_whatever_the_method(qtbot):
    from PySide6.QtWidgets import QScrollArea

    from kvviz.ui.panels.workload import WorkloadPanel

    wp = WorkloadPanel()
    qtbot.addWidget(wp)
    wp.resize(270, 700)
    wp.show()
    inner = wp.findChild(QScrollArea).widget()
    widths = {}
    for key in ("int8_seed", "nvfp4", "turboquant", "kivi"):
        wp.method.setCurrentIndex(wp.method.findData(key))
        qtbot.wait(10)
        widths[key] = inner.minimumSizeHint().width()
        assert wp.method_label.text() and wp.method_label.text() in wp.method.toolTip()  # the whole label, wrapped
    assert len(set(widths.values())) == 1, widths
    assert widths["int8_seed"] <= 270
