"""The live panel as a view over its run model: the cache-view state (kvviz.live.run.CacheViewState,
headless) and the LivePanel on its own with an AppState (no window), driven by a tiny random llama on
lavapipe; the panel's widgets (kvviz/ui/widgets/) show what the run model holds."""
from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from kvviz.families.registry import transform_options
from kvviz.live.config import LiveConfig
from kvviz.live.run import CacheViewState, LiveRun, decode_run, view_scales
from kvviz.attention.paged_oracle import unpack_int8_words
from tiny_llama import N_HEADS, N_KV, N_LAYERS

pytestmark = pytest.mark.gpu
PROMPT = "the cat in the hat sat"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from tiny_llama import write_tiny_gguf

    from kvviz.sources.gguf_llama import load_gguf_llama

    path = tmp_path_factory.mktemp("live_view") / "tiny.gguf"
    write_tiny_gguf(path, head_size=32, seed=1)
    return load_gguf_llama(path)


def _run(target, tiny, ctx, cfg):
    """What the window does with a live decode, `target` a LiveRun or a LivePanel (same event methods)."""
    rid = target.begin(cfg)

    def on_event(run_id, kind, payload):
        if kind == "model":
            target.set_model(payload[1])
        elif kind == "prefilled":
            target.set_prefilled(payload)

    out = decode_run(lambda path, progress: tiny, cfg, ctx, rid, on_event, lambda run_id, st: target.add_step(st),
                     lambda f, m: None, lambda: False)
    target.finish(out)
    return out


def test_cache_view_state_follows_the_selection(tiny, ctx):
    run = LiveRun()
    cfg = LiveConfig(prompt=PROMPT, method="int8_seed", n_new=3, block_size=4, policy="scattered")
    rid = run.begin(cfg)
    vs = run.view_state
    assert vs.view is None and vs.pending((0, 0), True) == ""
    seen = []

    def on_step(run_id, st):
        run.add_step(st)
        seen.append(st.view["layer"])
        vs.take(st.view, (0, 1), running=True)  # a selection made before the decoder existed ...

    def on_event(run_id, kind, payload):
        if kind == "prefilled":
            run.set_prefilled(payload)

    out = decode_run(lambda p, prog: tiny, cfg, ctx, rid, on_event, on_step, lambda f, m: None, lambda: False)
    run.finish(out)
    dec = out["decoder"]
    # ... is handed to the decoder's watch: the steps after the first read layer 0, KV head 1
    assert seen[0] == N_LAYERS // 2 and seen[1:] == [0, 0]
    assert vs.watch is dec.watch and vs.decoder is dec and vs.view["kv_head"] == 1
    # after the run a new selection needs one read, which the state marks as pending
    assert vs.select((1, 0), running=False) and vs.reading == (1, 0)
    assert "reading layer 1, KV head 0" in vs.pending((1, 0), False)
    v = CacheViewState.read(vs.watch, (1, 0))
    assert vs.accept(vs.watch, v) and vs.reading is None and vs.view is v
    assert not vs.select((1, 0), running=False)  # already shown
    assert not vs.accept(object(), v)  # a read of another decoder (an older run) is dropped
    # the view's table: one row per cached position, the K scale the cache's f32 scale word
    n = dec.quant.cache.length
    tab = vs.table(-1)
    assert tab.columns == ["position", "block", "k_scale", "v_scale", "w_f32", "w_quant"] and len(tab.rows) == n
    want = unpack_int8_words(dec.quant.cache.read_tokens(1, "K"))[1][:, 0]
    np.testing.assert_array_equal([r[2] for r in tab.rows], want.astype(np.float64))
    np.testing.assert_array_equal(view_scales(v)[0], want.astype(np.float64))
    g = N_HEADS // N_KV
    w = dec.quant.cache.last_weights(1).astype(np.float64)[:g]
    np.testing.assert_allclose([r[5] for r in vs.table(1).rows], w[1], rtol=1e-12)
    np.testing.assert_allclose([r[5] for r in tab.rows], w.mean(0), rtol=1e-12)
    # a failed read is a view with an error, and no table
    bad = CacheViewState.read(vs.watch, (N_LAYERS, 0))
    assert "out of range" in bad["error"] and vs.accept(vs.watch, bad) and vs.table() is None
    # a new run starts with an empty cache view
    run.begin(cfg)
    assert run.view_state.view is None and run.view_state.watch is None


def test_live_panel_alone_draws_its_run_model(qtbot, tiny, ctx, tmp_path):
    from PySide6.QtWidgets import QComboBox

    from kvviz.ui.panels import LivePanel
    from kvviz.ui.state import AppState

    state = AppState()
    said, exports = [], []
    state.status_message.connect(said.append)
    state.export_requested.connect(lambda panel, fmt: exports.append(fmt))
    lp = LivePanel(state)
    qtbot.addWidget(lp)
    lp.resize(900, 700)
    lp.show()
    assert not hasattr(lp, "host")
    # the method's options come from its typed schema; config() is a LiveConfig with typed options
    lp.set_config(method="kivi", max_new=3, prompt=PROMPT, block_size=4, policy="scattered")
    bits = lp.options.editors["bits"]
    assert isinstance(bits, QComboBox) and [bits.itemData(i) for i in range(bits.count())] == [2, 4]
    bits.setCurrentIndex(bits.findData(4))
    cfg = lp.config()
    assert isinstance(cfg, LiveConfig) and cfg.method_options == {"bits": 4} and cfg.validate() == cfg
    assert (cfg.n_new, cfg.block_size, cfg.policy, cfg.prompt) == (3, 4, "scattered", PROMPT)
    lp._export_clicked("json")
    assert said == ["Live decode: nothing to export yet"] and exports == []

    lp.set_config(method="int8_seed")  # no options of its own: the editors are the transform options alone
    assert set(lp.options.editors) == {o.name for o in transform_options("int8_seed")} == {"rotation"}
    reads = []
    lp.view_read_requested.connect(lambda job, label: (reads.append(label), job()))
    out = _run(lp, tiny, ctx, lp.config())
    dec = out["decoder"]
    assert lp.run.state == "done" and not lp.running and len(lp.steps) == 3
    assert lp.start_button.isEnabled() and not lp.stop_button.isEnabled()
    _, y = lp.kl_curve.getData()
    np.testing.assert_allclose(10 ** y, np.maximum([s.kl for s in dec.steps], 1e-12), rtol=1e-9)
    assert lp.pool_grid.cells["quant"] == len(dec.steps[-1].blocks)
    assert str(dec.steps[-1].blocks) in lp.pool_grid.label.text()
    assert "Done: 3 steps" in lp.info.text() and lp.table.rowCount() == 3
    # the cache view: the decoder's default (middle layer, KV head 0); a new selection is read through the signal
    assert lp.selection() == (N_LAYERS // 2, 0) and lp.view["layer"] == N_LAYERS // 2
    with qtbot.waitSignal(lp.view_ready, timeout=30_000):
        lp.set_selection(0, 1)
    assert reads == ["Live decode: reading the cache view of layer 0, KV head 1"]
    assert (lp.view["layer"], lp.view["kv_head"]) == (0, 1)
    assert said[-1] == "Live decode: cache view of layer 0, KV head 1"
    want = unpack_int8_words(dec.quant.cache.read_tokens(0, "V"))[1][:, 1]
    np.testing.assert_array_equal(lp.cache_view.v_scale_curve.getData()[1], want.astype(np.float64))
    # exports: the step table and the cache view beside it; JSON = the run model's
    files = lp.export("csv", str(tmp_path / "live.csv"))
    with open(files[1]) as fh:
        rows = list(csv.DictReader(fh))
    np.testing.assert_allclose([float(r["v_scale"]) for r in rows], want, rtol=1e-6)
    js = json.load(open(lp.export("json", str(tmp_path / "live.json"))[0]))
    assert js == json.loads(json.dumps(lp.run.to_json())) and js["config"]["method"] == "int8_seed"
    lp._export_clicked("csv")
    assert exports == ["csv"]
