"""The Quality panel (kvviz/ui/panels/quality.py): a run in the window's worker over the tiny GGUF of
tests/tiny_llama.py, its rows as they finish, the plots, the CSV of what is plotted, and a stored evaluation
shown again from the run history without computing."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from PySide6.QtCore import QSettings

from kvviz.history.db import HistoryDB
from kvviz.ui.main_window import MainWindow

from tiny_llama import write_tiny_gguf

pytestmark = pytest.mark.gpu


@pytest.fixture
def window(qtbot, tmp_path, monkeypatch, session):
    monkeypatch.setenv("KVVIZ_CACHE_DIR", str(tmp_path / "cache"))
    win = MainWindow(settings=QSettings(str(tmp_path / "s.ini"), QSettings.IniFormat), session=session,
                     autostart=False)  # on the suite's device (conftest) rather than a device of its own
    qtbot.addWidget(win)
    return win


def test_quality_run_rows_plots_history(window, qtbot, tmp_path):
    model = tmp_path / "tiny.gguf"
    write_tiny_gguf(model, head_size=64, context_length=512)
    text = tmp_path / "t.txt"
    text.write_text("Every quantised cache pays in accuracy what it saves in bytes. " * 6)
    q = window.quality
    assert window.docks["quality"].widget() is not None
    q.methods.setText("q8_0,q4_0:llama_cpp=cpu")
    q.text_path.setText(str(text))
    q.ctx.setValue(32)
    q.max_tokens.setValue(96)
    q.v_only.setChecked(True)
    q.model_path.setText(str(model))
    assert q.settings().forward == "auto"
    q.forward.setCurrentIndex(q.forward.findData("gpu"))  # the GPU forward in the worker, whatever the adapter
    s = q.settings()
    assert s.parts == ("kv", "v") and s.ctx == 32 and s.texts == (str(text),) and s.model_path == str(model)
    assert s.forward == "gpu"
    q.run_button.click()
    assert not q.run_button.isEnabled() and q.stop_button.isEnabled()
    qtbot.waitUntil(lambda: not q.running, timeout=120_000)
    res = q.result
    assert [r["spec"] for r in res["rows"]] == ["q8_0", "q8_0", "q4_0:llama_cpp=cpu", "q4_0:llama_cpp=cpu"]
    assert all("error" not in r for r in res["rows"]) and res["chunking"]["scored"] == 45
    assert res["forward"]["path"] == "gpu" and "gpu forward" in q.status.text()
    assert q.table.rowCount() == 4 and "±" in q.table.item(0, 5).text()
    assert q.hist_plot.getPlotItem().listDataItems() and q.pos_plot.getPlotItem().listDataItems()
    assert len(q.layer_plot.getPlotItem().items) > 0 and len(q.pareto_plot.getPlotItem().items) > 0
    # bits vs KLD: a name beside each point where it fits (never over another), the hover names the point
    window.resize(1280, 800)
    window.show()
    window.docks["quality"].raise_()
    q.tabs.setCurrentWidget(q.pareto_plot)
    q.pareto_plot.grab()  # a paint: the view takes its auto range, and the labels their places
    qtbot.waitUntil(lambda: bool(q.pareto_labels.shown()), timeout=5_000)
    assert set(q.pareto_labels.shown()) <= {p[2].split("\n")[0] for p in q._pareto_points}
    bits, y, text = q._pareto_points[0]
    assert q._describe_pareto(bits, y) == text and "bits per element" in text and "mean KLD" in text
    out = q.export_csv(str(tmp_path / "quality.csv"))
    assert len(out) == 5 and next(csv.reader(open(out[0])))[0] == "method"
    # kept in the run history, listed, and shown again from there
    rid = res["history_run_id"]
    with HistoryDB(readonly=True) as db:
        assert db.eval_result(rid)["rows"][0]["kld_mean"] == res["rows"][0]["kld_mean"]
    assert q.stored.findData(rid) >= 0
    q.set_result({"rows": [], "layers": []})
    assert q.table.rowCount() == 0
    q.stored.setCurrentIndex(q.stored.findData(rid))
    q.open_button.click()
    qtbot.waitUntil(lambda: q.table.rowCount() == 4, timeout=20_000)
    assert q.result["history_run_id"] == rid and f"run {rid}" in q.status.text()


def test_a_shown_result_sets_the_form_to_its_settings(window):
    """The published table (eleven texts, 64 chunks of 512, the GPU forward) shown: the form says what it measured,
    and its settings are the result's (Run would measure the same chunks again)."""
    q = window.quality
    res = json.loads((Path(__file__).parents[1] / "assets" / "eval-smollm2-h200.json").read_text())
    q.set_result(res)
    st = res["settings"]
    s = q.settings()
    assert s.texts == tuple(st["texts"]) and len(s.texts) == 11
    assert s.methods == tuple(st["methods"]) and s.ctx == 512 and s.max_tokens == 512 * 64
    assert s.forward == "gpu" and s.model_path == st["model_path"] and s.parts == ("kv",) and not s.layers
    assert q.table.rowCount() == len(res["rows"])


def test_quality_refuses_bad_settings_in_its_status(window):
    q = window.quality
    q.methods.setText("q8_0,nope")
    q.run_button.click()
    assert "unknown method 'nope'" in q.status.text() and q.run_button.isEnabled() and not q.running
