"""Stale state never lies (pytest-qt, offscreen): every panel's stale note, the error banner and the Workload's red
field come from the app state's notices (kvviz.ui.state); an input broken and fixed again, a kernel that stops
compiling and compiles again, settings edited with auto-run off: each panel and the banner say so, and stop
saying so, as the inputs change."""
import pytest

from kvviz.ui.state import RESULT_PANELS
from ui_windows import WAIT, _module_window, settings, shared_window, window  # noqa: F401  (fixtures)

pytestmark = pytest.mark.gpu


def result_panels(w):
    return [p for p in w.panels + [w.bias] if p.key in RESULT_PANELS]


def stale_keys(w):
    return {p.key for p in w.panels + [w.bias, w.lab, w.live] if p.is_stale}


def shown_results(w):
    """The results panels that show something (a comparison not run yet has nothing to call stale)."""
    return {p.key for p in result_panels(w) if p.has_content()}


def test_a_broken_input_marks_every_panel_and_the_fix_clears_them(qtbot, shared_window):
    w = shared_window
    assert {p.key for p in w.panels + [w.bias]} == RESULT_PANELS  # every panel that draws the results
    # a head size the kernels refuse (in the worker): the banner, the field, every results panel's note
    with qtbot.waitSignal(w.compute_failed, timeout=WAIT):
        w.workload.head_size.setValue(7)
    assert w.banner.isVisible() and "not a multiple of 4" in w.banner.title.text()
    assert w.workload.invalid_field == "head_size" and w.workload.head_size.property("kvvizInvalid")
    assert stale_keys(w) == shown_results(w) == RESULT_PANELS - {"compare"}
    for p in result_panels(w):
        if p.key == "compare":
            continue
        assert "head_size" in p.stale_label.text() and p.stale_label.text().startswith("Stale:"), p.key
    # the timing panel's own work (a pin of the shown results, a sweep tab) does not clear its note
    w.timing.pin_current()
    assert w.timing.is_stale
    # fixed: a new compute, every note and the banner gone, the field no longer red
    with qtbot.waitSignal(w.results_ready, timeout=WAIT):
        w.workload.head_size.setValue(64)
    assert stale_keys(w) == set() and not w.banner.isVisible()
    assert w.workload.invalid_field is None and not w.workload.head_size.property("kvvizInvalid")
    # a method change after it: nothing comes back
    with qtbot.waitSignal(w.results_ready, timeout=WAIT):
        w.workload.method.setCurrentIndex(w.workload.method.findData("int8_token"))
    assert stale_keys(w) == set() and not w.banner.isVisible()
    # a dismissed banner keeps the notes, and a new error shows again
    with qtbot.waitSignal(w.compute_failed, timeout=WAIT):
        w.workload.head_size.setValue(7)
    w.banner._dismiss()
    assert not w.banner.isVisible() and w.timing.is_stale  # dismissed, not resolved
    with qtbot.waitSignal(w.compute_failed, timeout=WAIT):
        w.workload.num_heads.setValue(5)  # 5 query heads over 2 KV heads: a new error
    assert w.banner.isVisible() and w.timing.is_stale
    with qtbot.waitSignal(w.results_ready, timeout=WAIT):
        w.workload.num_heads.setValue(4)
        w.workload.head_size.setValue(64)
    assert not w.banner.isVisible() and stale_keys(w) == set()


def test_unreadable_context_lengths_mark_their_field(qtbot, shared_window):
    w = shared_window
    w.workload.context_lens.setText("40, 1x7")
    w.request_compute()
    assert w.workload.invalid_field == "context_lens" and w.workload.context_lens.property("kvvizInvalid")
    assert "integers" in w.banner.title.text() and "integers" in w.workload.context_lens.toolTip()
    assert stale_keys(w) == shown_results(w)
    # the overview's cards are whole under the banner and the stale note
    qtbot.wait(50)
    for c in w.overview.cards.values():
        assert c.value.height() >= c.value.fontMetrics().height(), c.value.text()
    w.workload.context_lens.setText("40, 17")
    with qtbot.waitSignal(w.results_ready, timeout=WAIT):
        w.request_compute()
    assert stale_keys(w) == set() and not w.banner.isVisible() and w.workload.invalid_field is None


def test_settings_edited_with_auto_run_off_mark_the_results_stale(qtbot, window):
    w = window
    w.workload.auto_run.setChecked(False)
    w.workload.method.setCurrentIndex(w.workload.method.findData("int8_token"))
    assert stale_keys(w) == shown_results(w) and not w.banner.isVisible()  # a note, not an error
    assert "changed since" in w.codes.stale_label.text()
    # edited back to what was computed: nothing is stale
    w.workload.method.setCurrentIndex(w.workload.method.findData(w.results.config.method))
    assert stale_keys(w) == set()
    w.workload.method.setCurrentIndex(w.workload.method.findData("int8_token"))
    with qtbot.waitSignal(w.results_ready, timeout=WAIT):
        w.run_now()
    assert stale_keys(w) == set()
    w.workload.auto_run.setChecked(True)
    # comparison rows of an earlier run are marked stale (a note, not an error)
    rows = [{"method": "int8_seed", "label": "int8", "bits_per_element": 8.25, "kl_mean": 1e-4, "rel_l2": 0.01}]
    w.compare.set_rows(rows)
    w.compare_res = w.results
    w.sync_compare_stale()
    assert not w.compare.is_stale
    with qtbot.waitSignal(w.results_ready, timeout=WAIT):
        w.run_now()
    assert w.compare.is_stale and "earlier run" in w.compare.stale_label.text()
    assert stale_keys(w) == {"compare"} and not w.banner.isVisible()


def test_the_kernel_lab_banner_and_stale_mark_follow_the_file(qtbot, window, tmp_path):
    w = window
    lab = w.lab
    lab.set_slot("int8_token.dequantise")
    path = tmp_path / "k.wgsl"
    lab.new_file(str(path))
    qtbot.waitUntil(lambda: len(lab.runs) == 1, timeout=WAIT)
    assert lab.last.check.ok and not lab.is_stale
    good = path.read_text()
    path.write_text(good.replace("fn main", "fn main oops", 1))  # no longer compiles
    qtbot.waitUntil(lambda: lab.errors.count() > 0, timeout=WAIT)
    assert w.banner.isVisible() and w.banner.title.text().startswith("Kernel lab")
    assert lab.is_stale and "last run that compiled" in lab.stale_label.text()
    assert lab.check_label.text().startswith("Oracle check")  # the last good check is still shown, marked stale
    assert stale_keys(w) == {"kernel_lab"}  # nothing else
    path.write_text(good)  # compiles again: the banner and the mark go without a new compute
    qtbot.waitUntil(lambda: len(lab.runs) == 2, timeout=WAIT)
    assert not w.banner.isVisible() and not lab.is_stale and lab.errors.count() == 0
