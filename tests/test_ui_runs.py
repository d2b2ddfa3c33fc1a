"""Runs worth keeping, in the window (pytest-qt, offscreen): a Run, a pin, a sweep and a comparison are kept in the
run history, a recompute is not; the History tab names, filters, deletes and opens runs; a kept run and a report
folder reopen as they were computed, without a compute; the pinned run's numbers are compared in every panel that
shows a number."""
import numpy as np
import pytest

from kvviz.ui.widgets.tables import select_row
from ui_windows import WAIT, open_window, settings, small_config, window  # noqa: F401  (fixtures)

pytestmark = pytest.mark.gpu


def computes(monkeypatch, session) -> list:
    calls = []
    real = session.compute

    def counted(*a, **k):
        calls.append(a[0])
        return real(*a, **k)

    monkeypatch.setattr(session, "compute", counted)
    return calls


def test_a_kept_run_reopens_as_computed(qtbot, window, session, monkeypatch, tmp_path):
    w = window
    hv = w.timing.history_view
    with qtbot.waitSignal(w.results_ready, timeout=WAIT):
        w.run_now()
    kept, kept_res = w.timing.run_id, w.results
    assert [r.id for r in hv.run_list] == [kept]
    with qtbot.waitSignal(w.results_ready, timeout=WAIT):  # an edit: recomputed, not kept
        w.workload.method.setCurrentIndex(w.workload.method.findData("int8_token"))
    assert [r.id for r in hv.run_list] == [kept] and w.timing.run_id is None
    calls = computes(monkeypatch, session)
    select_row(hv.runs_table, 0)
    assert hv.selected_run() == kept
    hv.open_button.click()  # Open: the stored results, nothing computed
    res = w.results
    assert res.stored_as == f"run {kept}", w.status_label.text()  # else opening it failed: the status line says why
    assert calls == [] and not w.runner.busy
    assert res.method.id == kept_res.method.id == "int8_seed" and res.stored_as == f"run {kept}"
    np.testing.assert_array_equal(res.metrics.kl, kept_res.metrics.kl)
    assert [t.timing.samples_us for t in res.timings] == [t.timing.samples_us for t in kept_res.timings]
    assert w.workload.method.currentData() == "int8_seed" and not w.overview.is_stale
    assert f"run {kept}" in w.overview.headline.text()
    assert w.inspector.is_stale and "GPU cache" in w.inspector.stale_label.text()  # it reads words it has not
    w.timing.pin_current()  # pins the opened run itself: nothing recorded again
    assert [r.id for r in hv.run_list] == [kept] and hv.baseline_run_id() == kept
    # a report folder reopens the same way
    w.export_report(str(tmp_path / "report"))
    with qtbot.waitSignal(w.results_ready, timeout=WAIT):
        w.workload.method.setCurrentIndex(w.workload.method.findData("int8_token"))
    n = len(calls)
    assert w.open_stored_file(str(tmp_path / "report")) and len(calls) == n
    assert w.results.method.id == "int8_seed" and w.results.stored_as == "report report"
    np.testing.assert_array_equal(w.results.w_q, kept_res.w_q)
    # a run without stored results says so
    assert not w.open_run(12345) and "no run 12345" in w.banner.title.text()


def test_history_tab_names_filters_deletes_keeps_sweeps_and_compares_the_pinned_run(qtbot, window):
    w = window
    hv = w.timing.history_view
    with qtbot.waitSignal(w.sweep_ready, timeout=WAIT):
        w.timing.sweep_values.setText("16, 32")
        w.timing.sweep_button.click()
    with qtbot.waitSignal(w.results_ready, timeout=WAIT):
        w.run_now()
    sweep_id = next(r.id for r in hv.run_list if r.kind == "sweep")
    run_id = w.timing.run_id
    assert [r.kind for r in hv.run_list] == ["run", "sweep"]
    assert hv.rename(run_id, "the int8 one")
    hv.filter_edit.setText("int8 ONE")
    assert [r.id for r in hv.run_list] == [run_id]
    hv.filter_edit.setText("")
    hv.kind_box.setCurrentIndex(hv.kind_box.findText("sweep"))
    assert [r.id for r in hv.run_list] == [sweep_id]
    # the sweep reopens as it was drawn
    points = list(w.timing.sweep_points)
    w.timing.set_sweep([])
    assert w.open_run(sweep_id) and [p["value"] for p in w.timing.sweep_points] == [p["value"] for p in points]
    hv.kind_box.setCurrentIndex(0)
    assert hv.delete_runs([sweep_id]) == [sweep_id] and [r.id for r in hv.run_list] == [run_id]
    # the pinned run's numbers are compared in every panel with a number
    w.timing.pin_current()
    base = w.state.baseline
    assert base is not None and base.numbers["kl_mean"] == pytest.approx(float(w.results.metrics.kl.mean()))
    with qtbot.waitSignal(w.results_ready, timeout=WAIT):
        w.workload.method.setCurrentIndex(w.workload.method.findData("int4_group"))
    cards = w.overview.cards
    kl = float(w.results.metrics.kl.mean())
    assert kl > base.numbers["kl_mean"]  # int4 against int8: a larger KL, said as worse
    assert cards["kl_mean"].delta.isVisible() and cards["kl_mean"].delta.text().startswith(("+", "x"))
    assert cards["kl_mean"].delta.toolTip().endswith("worse")
    for p in (w.cache_layout, w.codes, w.attention, w.timing):
        assert not p.delta_note.isHidden() and f"run {base.run_id}" in p.delta_note.text(), p.key
    assert "KL mean" in w.attention.delta_note.text()
    rows = [{"method": "int8_seed", "label": "int8", "bits_per_element": 8.25, "kl_mean": base.numbers["kl_mean"]},
            {"method": "kivi", "label": "kivi", "bits_per_element": 3.0, "kl_mean": 2 * base.numbers["kl_mean"]}]
    w.compare.set_rows(rows)
    t = w.compare.table
    col = [t.horizontalHeaderItem(j).text() for j in range(t.columnCount())].index(w.compare.DELTA_COLUMN)
    assert [t.item(i, col).text() for i in range(2)] == ["\u00b10%", "+100.0%"]
    w.timing.unpin()
    assert w.state.baseline is None
    assert not cards["kl_mean"].delta.isVisible() and all(
        p.delta_note.isHidden() for p in (w.cache_layout, w.codes, w.attention, w.timing))
    assert w.compare.DELTA_COLUMN not in [t.horizontalHeaderItem(j).text() for j in range(t.columnCount())]
