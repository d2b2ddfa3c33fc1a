"""The live panel's run model (kvviz.live.run.LiveRun), headless: no Qt, a tiny random llama on lavapipe."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from kvviz.errors import Cancelled
from kvviz.live.config import LiveConfig
from kvviz.live.run import STEP_COLUMNS, LiveRun, decode_run

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_run_model_imports_no_qt():
    code = ("import sys; import kvviz.live.run; "
            "bad = [m for m in sys.modules if m.startswith(('PySide6', 'pyqtgraph', 'shiboken6', 'kvviz.ui'))]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from tiny_llama import write_tiny_gguf

    from kvviz.sources.gguf_llama import load_gguf_llama

    path = tmp_path_factory.mktemp("live_run") / "tiny.gguf"
    write_tiny_gguf(path, head_size=32, seed=0)
    return load_gguf_llama(path)


PROMPT = "the cat in the hat sat"


def _drive(run: LiveRun, tiny, ctx, cfg: LiveConfig, cancel=lambda: False):
    """What the window does: begin, run the job, hand every event and step to the model if it is current."""
    rid = run.begin(cfg)
    events = []

    def on_event(run_id, kind, payload):
        events.append(kind)
        if not run.is_current(run_id):
            return
        if kind == "model":
            run.set_model(payload[1])
        elif kind == "prefilled":
            run.set_prefilled(payload)

    def on_step(run_id, st):
        if run.is_current(run_id):
            run.add_step(st)

    out = decode_run(lambda path, progress: tiny, cfg, ctx, rid, on_event, on_step, lambda f, m: None, cancel)
    return rid, events, out


@pytest.mark.gpu
def test_a_headless_run_fills_the_model(tiny, ctx):
    run = LiveRun()
    assert run.state == "idle" and not run.running
    cfg = LiveConfig(prompt=PROMPT, method="int8_seed", n_new=3, block_size=4, policy="scattered")
    rid, events, out = _drive(run, tiny, ctx, cfg)
    assert events == ["model", "prefilled"] and rid == run.id == 1 and run.running
    run.finish(out)
    assert run.state == "done" and not run.running
    dec = out["decoder"]
    assert len(run.steps) == 3 and [s.kl for s in run.steps] == [s.kl for s in dec.steps]
    assert run.summary["kl_mean"] == pytest.approx(dec.summary()["kl_mean"])
    assert run.headline() == "Done: 3 steps"
    assert run.texts()["baseline"] == "".join(s.base_str for s in dec.steps)
    # the step table: one row per step, the KL column the steps' KL
    tab = run.step_table()
    assert tab.columns == STEP_COLUMNS and len(tab.rows) == 3
    assert [r[STEP_COLUMNS.index("kl")] for r in tab.rows] == [float(s.kl) for s in dec.steps]
    # the pool bands: every allocated block of each cache, fill = tokens cached in it
    bands = {b.key: b for b in run.pool_bands(highlight=True, quant_new=list(dec.steps[-1].new_blocks))}
    q = bands["quant"]
    assert int((q.owner >= 0).sum()) == len(dec.steps[-1].blocks) > 1
    assert int(q.fill.sum()) == run.context_len == dec.steps[-1].context_len
    assert q.new == sorted(dec.steps[-1].new_blocks)
    js = run.to_json()
    assert js["state"] == "done" and len(js["steps"]) == 3 and js["config"]["max_new"] == 3
    assert "2 layers" in js["model"]


@pytest.mark.gpu
def test_stop_and_a_newer_run_make_the_older_one_stale(tiny, ctx):
    run = LiveRun()
    cfg = LiveConfig(prompt=PROMPT, method="int8_seed", n_new=8, block_size=4)
    calls = {"n": 0}

    def cancel():  # the cancel flag rises after the first step
        calls["n"] += 1
        return len(run.steps) >= 1

    run_id = None
    with pytest.raises(Cancelled):
        run_id = run.begin(cfg)
        run.stop("cancelled by a new computation")
        decode_run(lambda p, prog: tiny, cfg, ctx, run_id, lambda *a: None,
                   lambda rid, st: run.add_step(st) if run.is_current(rid) else None, lambda f, m: None, cancel)
    run.finish(cancelled=True)
    assert run.state == "stopped" and run.why == "cancelled by a new computation"
    assert 1 <= len(run.steps) < 8 and run.headline().startswith("Stopped after")
    newer = run.begin(cfg)
    assert newer != run_id and not run.is_current(run_id) and run.steps == [] and run.why == ""
    run.finish(error=RuntimeError("x"))
    assert run.state == "failed"


def test_pool_bands_without_steps():
    run = LiveRun()
    run.begin(LiveConfig(n_new=4, block_size=2))
    run.set_prefilled({"num_blocks": 6, "block_size": 2, "context_len": 3, "prompt_strs": ["a", "b", "c"],
                       "tables": {"f32": [4, 1], "quant": [0, 5], "free": []}})
    bands = run.pool_bands(highlight=False)
    assert [b.key for b in bands] == ["f32", "quant"]  # a path without blocks has no band
    np.testing.assert_array_equal(bands[1].owner, [1, -1, -1, -1, -1, 1])
    np.testing.assert_array_equal(bands[1].fill, [2, 0, 0, 0, 0, 1])
    assert bands[0].new == []
