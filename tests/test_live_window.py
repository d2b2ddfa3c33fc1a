"""Live decode of a model with sliding-window layers (kvviz/methods/live_window.py): the paged caches of the
windowed layers hold the last W positions (a ring for per-token formats, the window re-quantised for the
others), and the decode through them is the model's: the f32 paged kernels reproduce the numpy forward's
windowed attention past the window's wrap, the int8 ring gives the records of the int8 cache of the
window in order, and what the views show is the window as the caches hold it."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from kvviz.live import LiveDecoder, RequantCache
from kvviz.live.metrics import log_softmax
from kvviz.methods.live_window import WindowedLiveCache
from kvviz.sources.gguf_llama import load_gguf_llama
from kvviz.sources.llama_numpy import LlamaRunner
from kvviz.sources.random_gguf import RECIPES, Recipe, write_random_gguf

pytestmark = pytest.mark.gpu

W = 5  # the windowed layers' window: not a multiple of the block sizes below, so the ring's last block is partial
# Gemma 3's quirks at a size lavapipe decodes quickly: layers 0 and 1 windowed, layer 2 global
RECIPE = Recipe("gemma3-live", "gemma3", "Gemma 3 (3 layers, window 5, period 3)", 3, 64, 2, 1, 32, 128,
                vocab="spm_gemma", rope_theta=1e6, rms_eps=1e-6, qk_norm=True, post_norms=True, embed_std=1 / 8,
                kv=(("add_key_length", 32), ("add_value_length", 32), ("add_sliding_window", W),
                    ("add_sliding_window_pattern", 3)))
PROMPT = [2, 40, 51, 77, 300, 120, 9]  # 6 prefilled (past the window already), the 7th fed at step 0
STEPS = 9  # positions up to 15: the ring wraps twice


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = tmp_path_factory.mktemp("live-window") / "gemma3-live.gguf"
    write_random_gguf(RECIPE, path)
    m = load_gguf_llama(path)
    assert m.config.layer_windows == (W, W, 0)
    return m


def _runner_logits(model, fed):
    r = LlamaRunner(model, record=False)
    r.prefill(PROMPT[:-1])
    out = [r.step(PROMPT[-1])]
    for t in fed:
        out.append(r.step(t))
    return out


@pytest.mark.parametrize("block_size,policy", [(4, "contiguous"), (2, "scattered")])
def test_f32_ring_matches_numpy_window(model, ctx, block_size, policy):
    """The f32 paged decode over the ring's slots = the numpy forward's windowed attention."""
    dec = LiveDecoder(model, "f32", ctx=ctx, block_size=block_size, policy=policy, free_run=False)
    dec.start(PROMPT, STEPS)
    steps = dec.run()
    ref = _runner_logits(model, [s.base_token for s in steps[:-1]])
    for s, lg in zip(steps, ref):
        np.testing.assert_allclose(s.logp_base, log_softmax(lg), atol=1e-4)  # float32 rounding only
        assert s.base_token == int(np.argmax(lg))
    q = dec.caches["quant"]
    assert isinstance(q, WindowedLiveCache) and [g.kind for g in q.groups] == ["global", "ring"]
    ring = q.group_of(0).cache
    assert len(ring.table.blocks) == -(-W // block_size)  # the ring holds the window, not the sequence
    assert len(q.table.blocks) == -(-steps[-1].context_len // block_size)  # the global layer holds all of it
    # without the window the paged decode would not be the model's: the numpy forward with global layers
    full = _runner_logits(model.__class__(config=model.config.__class__(**{
        **model.config.__dict__, "layer_windows": ()}), weights=model.weights, tokenizer=model.tokenizer),
        [s.base_token for s in steps[:-1]])
    assert max(np.abs(log_softmax(a) - s.logp_base).max() for a, s in zip(full, steps)) > 1e-3


def test_int8_ring_equals_window_requantised(model, ctx):
    """The int8 cache as a ring (appended token by token) and the int8 cache of the window re-quantised in
    order every step hold the same per-token records: the same logits."""
    a = LiveDecoder(model, "int8_seed", ctx=ctx, block_size=4, free_run=False)
    b = LiveDecoder(model, "int8_seed", ctx=ctx, block_size=4, free_run=False, incremental=False)
    for d in (a, b):
        d.start(PROMPT, STEPS)
        d.run()
    assert a.caches["quant"].group_of(0).kind == "ring"
    assert a.describe()["quant_cache_windows"] == [{"window": W, "layers": [0, 1], "kind": "ring"}]
    assert a.describe()["quant_cache_kind"] == "MethodPagedCache"  # how the method keeps its global layer
    assert b.caches["quant"].group_of(0).kind == "requantised"
    assert isinstance(b.caches["quant"].group_of(0).cache, RequantCache)
    for sa, sb in zip(a.steps, b.steps):
        # same records; the ring sums the window's keys in slot order, the re-quantised cache in position
        # order: float32 rounding only (measured 3.3e-6)
        np.testing.assert_allclose(sa.logp_quant, sb.logp_quant, atol=2e-5)
        assert 0.0 < sa.kl < 0.05


def test_views_show_the_window(model, ctx):
    dec = LiveDecoder(model, "int8_seed", ctx=ctx, block_size=2, free_run=False)
    dec.start(PROMPT, STEPS)
    dec.run()
    n = dec.steps[-1].context_len
    v = dec.cache_view(0, 0)
    assert v["window"] == W and v["context_len"] == n
    ring = dec.caches["quant"].group_of(0).cache.table.blocks
    assert v["blocks"] == list(ring)
    assert v["position_blocks"][: n - W] == [None] * (n - W)
    assert v["position_blocks"][n - W:] == [ring[(p % W) // 2] for p in range(n - W, n)]
    for key in ("weights_quant", "weights_base"):
        w = v[key]
        assert w.shape == (2, n) and np.all(w[:, : n - W] == 0) and np.allclose(w[:, n - W:].sum(-1), 1, atol=1e-5)
    k = v["scales"].k
    assert np.isnan(k[: n - W]).all() and np.isfinite(k[n - W:]).all() and "sliding window of 5" in v["scales"].note
    g = dec.cache_view(2, 0)  # the global layer: every position
    assert g["window"] == 0 and None not in g["position_blocks"] and np.isfinite(g["scales"].k).all()
    # the block inspector: each ring slot's record carries the position it holds now
    q = dec.caches["quant"]
    held = sorted(r.position for b in ring for r in q.inspect_block(0, b, 0) if r.position >= 0)
    assert held == list(range(n - W, n))


def test_kivi_windowed_layers_requantise_the_window(model, ctx):
    """A method whose records depend on their neighbours (KIVI's groups of 32) holds a windowed layer as the
    window re-quantised in order; its weights and scales cover the window only."""
    dec = LiveDecoder(model, "kivi", ctx=ctx, block_size=4, free_run=False)
    dec.start(PROMPT, 4)
    dec.run()
    q = dec.caches["quant"]
    assert q.group_of(0).kind == "requantised" and q.group_of(2).kind == "global"
    n = dec.steps[-1].context_len
    w = q.last_weights(1)
    assert np.all(w[:, : n - W] == 0) and np.allclose(w[:, n - W:].sum(-1), 1, atol=1e-4)
    assert "layers with a 5-position window: the window re-quantised every step" in q.label


def test_fork_refills_the_ring(model, ctx):
    """A forked path's cache is filled from the f32 history (the last W positions into the ring): its next
    step gives the logits of the path it was forked from."""
    dec = LiveDecoder(model, "int8_seed", ctx=ctx, block_size=2, free_run=False)
    dec.start(PROMPT, STEPS)
    for _ in range(STEPS - 1):
        dec.step()
    fork = dec.quant.fork("copy", dec._cache("method", dec._table()))
    tok = dec._next_base
    np.testing.assert_allclose(fork.step(tok, None), dec.quant.step(tok, None), atol=1e-5)


def test_soft_capped_model_decodes_as_the_numpy_forward(tmp_path, ctx):
    """The random Gemma 2 (attention logits soft-capped at 5, layers 0 and 2 in windows of 8, head 256): every decode
    step of the f32 paged cache runs the causal prefill of one query (kvviz/methods/live_cache.py), the only kernel
    that caps the scores, and gives the numpy forward's log-probabilities within 1e-4 (float32 rounding only: the
    f32 cache holds the forward's own K/V, and the kernel's float32 sums run in another order), past the windows'
    wrap; the q8_0 cache's teacher-forced path runs beside it with a small, finite KL. The weights kernel has no cap:
    the view shows no weights."""
    path = tmp_path / "gemma2.gguf"
    write_random_gguf(RECIPES["gemma2"], path)
    model = load_gguf_llama(path)
    assert model.config.attn_softcap == 5.0 and model.config.layer_windows == (8, 0, 8, 0)
    dec = LiveDecoder(model, "q8_0", ctx=ctx, block_size=4, free_run=False)
    dec.start(PROMPT, STEPS)
    steps = dec.run()
    ref = _runner_logits(model, [s.base_token for s in steps[:-1]])
    for s, lg in zip(steps, ref):
        np.testing.assert_allclose(s.logp_base, log_softmax(lg), atol=1e-4)
        assert s.base_token == int(np.argmax(lg))
        assert np.isfinite(s.kl) and 0 <= s.kl < 0.05
    assert steps[-1].context_len > 8 + 1
    assert all(c.softcap == 5.0 for c in dec.caches.values())
    view = dec.cache_view(1, 0)
    assert view["weights_quant"] is None and view["weights_base"] is None
    # the cap bites: the numpy forward without it is far from what the caches gave
    plain = dataclasses.replace(model, config=dataclasses.replace(model.config, attn_softcap=0.0))
    far = _runner_logits(plain, [s.base_token for s in steps[:-1]])
    assert max(np.abs(s.logp_base - log_softmax(lg)).max() for s, lg in zip(steps, far)) > 1e-2


def test_session_shows_a_windowed_layer_as_its_cache_holds_it(model, rt):
    """The window's analysis of one layer of a model: a sliding-window layer's K/V are the last W positions
    (what its cache holds, what its last query sees), said in the source note; a global layer's are all."""
    from kvviz.analysis.session import Session, SessionConfig

    session = Session(rt)
    base = dict(source="model", model_path=str(model.path), prompt="hello world and the theory is in a hat",
                timing_runs=3, block_size=4)
    n = len(model.tokenizer.encode(base["prompt"]))
    assert n > W
    res = session.compute(SessionConfig(**base, layer=0))
    assert [int(x) for x in res.batch.context_lens] == [W]
    assert f"sliding window of {W}" in res.source_note and res.scale == pytest.approx(model.config.query_scale)
    cap = session.capture(SessionConfig(**base, layer=0))
    np.testing.assert_array_equal(res.key[res.batch.token_rows(0)], cap.k[0][:, -W:].transpose(1, 0, 2))
    glob = session.compute(SessionConfig(**base, layer=2))
    assert [int(x) for x in glob.batch.context_lens] == [n] and "sliding window" not in glob.source_note
