"""Live decode (kvviz.live): a real model token by token through paged GPU caches, quantised vs f32."""
from __future__ import annotations

import math

import numpy as np
import pytest

from kvviz.live.metrics import kl_logits, log_softmax, summarize_live
from kvviz.errors import InvalidInput
from kvviz.live import BlockTable, Cancelled, LiveDecoder, RequantCache, make_live_cache, run_live
from kvviz.families.registry import registry
from kvviz.families.int8.method_seed import Int8PerTokenSeed
from kvviz.attention.paged_oracle import unpack_int8_words
from kvviz.sources.gguf_llama import load_gguf_llama
from kvviz.sources.llama_numpy import LlamaRunner

pytestmark = pytest.mark.gpu

# ----------------------------------------------------------------------------------------------
# A tiny random llama GGUF (tests/tiny_llama.py); head_size 32 so every method's shapes fit.

from tiny_llama import N_HEADS, N_KV, N_LAYERS  # noqa: E402
from tiny_llama import write_tiny_gguf as _write_tiny  # noqa: E402

HEAD_DIM = 32


def write_tiny_gguf(path, seed=0):
    return _write_tiny(path, head_size=HEAD_DIM, seed=seed)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("live") / "tiny.gguf"
    write_tiny_gguf(path)
    return load_gguf_llama(path)


PROMPT = [5 + (7 * i) % 200 for i in range(13)]  # 13 tokens: 12 prefilled, the 13th fed at step 0


def _runner_logits(model, prompt, fed):
    """The runner's own float32 decode: prefill prompt[:-1], then feed prompt[-1] and `fed` one by one."""
    r = LlamaRunner(model, record=False)
    r.prefill(prompt[:-1])
    out = [r.step(prompt[-1])]
    for t in fed:
        out.append(r.step(t))
    return out


class ZeroKeys(Int8PerTokenSeed):
    """A deliberately bad method (keys cached as zeros -> uniform attention), to force divergence."""

    id = "test_zero_keys"

    def quantize(self, ctx, batch, key, value):
        return super().quantize(ctx, batch, np.zeros_like(key), value)


# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("policy", ["contiguous", "scattered"])
def test_f32_gpu_path_matches_runner(tiny, ctx, policy):
    """The f32 paged kernels (writer + decode, on the GPU) reproduce the runner's float32 attention."""
    dec = LiveDecoder(tiny, "f32", ctx=ctx, block_size=4, policy=policy, free_run=False)
    dec.start(PROMPT, 6)
    steps = dec.run()
    ref = _runner_logits(tiny, PROMPT, [s.base_token for s in steps[:-1]])
    for s, lg in zip(steps, ref):
        # measured max |diff| of log-probs: 7.5e-6 (lavapipe)
        np.testing.assert_allclose(s.logp_base, log_softmax(lg), atol=1e-4)
        assert s.base_token == int(np.argmax(lg))
        assert s.kl == 0.0 and s.top1_agree  # method 'f32' runs the same kernels on its own cache
    assert dec.caches["quant"].layers[0].fmt == "f32"


def test_numpy_baseline_is_the_runner(tiny, ctx):
    dec = LiveDecoder(tiny, "int8_seed", ctx=ctx, baseline="numpy", free_run=False)
    dec.start(PROMPT, 3)
    steps = dec.run()
    ref = _runner_logits(tiny, PROMPT, [s.base_token for s in steps[:-1]])
    for s, lg in zip(steps, ref):
        np.testing.assert_allclose(s.logp_base, log_softmax(lg).astype(np.float32), atol=1e-6)
    assert "baseline" not in dec.caches and s.base_blocks == []


def test_int8_small_nonzero_kl_and_blocks_grow(tiny, ctx):
    bs = 4
    dec = LiveDecoder(tiny, "int8_seed", ctx=ctx, block_size=bs, policy="scattered", seed=3)
    dec.start(PROMPT, 8)
    assert dec.num_blocks == 2 * math.ceil((len(PROMPT) + 7) / bs)
    q = dec.caches["quant"]
    assert len(q.table.blocks) == math.ceil((len(PROMPT) - 1) / bs)  # the prefilled tokens
    prev = list(q.table.blocks)
    for _ in range(8):
        s = dec.step()
        assert s.context_len == len(PROMPT) + s.index
        assert len(s.blocks) == math.ceil(s.context_len / bs)
        assert len(set(s.blocks)) == len(s.blocks) and s.blocks[: len(prev)] == prev  # grows, never moves
        assert s.new_blocks == s.blocks[len(prev):]
        assert (len(s.new_blocks) == 1) == ((s.context_len - 1) % bs == 0)
        prev = list(s.blocks)
        assert 0.0 < s.kl < 0.05, s.kl  # measured 6e-5..4e-4
        assert s.kl == pytest.approx(kl_logits(s.logp_base, s.logp_quant), rel=1e-3, abs=1e-9)
    assert sorted(prev) != list(range(len(prev)))  # scattered, not a run of blocks
    summ = dec.summary()
    assert summ["n_steps"] == 8 and 0 < summ["kl_mean"] < 0.05 and summ["top1_agree_rate"] >= 0.75
    assert summ["texts"]["baseline"] == tiny.tokenizer.decode(summ["per_step"]["base_token"])
    # The q8 cache holds every position's K at its slot: dequantised, it is the runner's K to int8 precision.
    k_ref = dec.quant.runner.kv()[0]  # [L, n_kv, T, D]
    for li in range(N_LAYERS):
        codes, scales = unpack_int8_words(q.read_tokens(li, "K"))  # [T, n_kv, D], [T, n_kv]
        deq = codes.astype(np.float32) * scales[..., None]
        ref = k_ref[li].transpose(1, 0, 2)
        assert deq.shape == ref.shape == (len(PROMPT) + 7, N_KV, HEAD_DIM)
        np.testing.assert_allclose(deq, ref, atol=float(np.abs(ref).max()) / 127 * 0.51 + 1e-6)
    with pytest.raises(InvalidInput, match="steps are done"):
        dec.step()


@pytest.mark.parametrize("policy", ["contiguous", "scattered"])
def test_cache_view_reads_the_selected_layer(tiny, ctx, policy):
    """After every step the decoder reads one layer / KV head of the quantised cache (its watch): the
    int8 scale words of the positions so far, read from the sequence's blocks only, and the last step's
    attention weights of both caches; a new selection applies from the next step."""
    dec = LiveDecoder(tiny, "int8_seed", ctx=ctx, block_size=4, policy=policy, seed=1)
    dec.start(PROMPT, 4)
    q = dec.caches["quant"]
    assert dec.watch.selection == (N_LAYERS // 2, 0)
    g = N_HEADS // N_KV

    def check(st, layer, kvh):
        v = st.view
        assert (v["layer"], v["kv_head"], v["context_len"]) == (layer, kvh, st.context_len) and v["watch"] is dec.watch
        for which, got in (("K", v["scales"].k), ("V", v["scales"].v)):
            np.testing.assert_array_equal(got, unpack_int8_words(q.read_tokens(layer, which))[1][:, kvh])
        assert v["q_heads"] == list(range(kvh * g, (kvh + 1) * g))
        for key, cache in (("weights_quant", q), ("weights_base", dec.caches["baseline"])):
            np.testing.assert_array_equal(v[key], cache.last_weights(layer)[v["q_heads"]])
        assert v["seconds"] > 0 and st.seconds["view"] >= v["seconds"]

    for li in range(N_LAYERS):  # read_positions = read_tokens (the whole pool), block by block
        for which in "KV":
            np.testing.assert_array_equal(q.read_positions(li, which), q.read_tokens(li, which))
    st = dec.step()
    check(st, N_LAYERS // 2, 0)
    dec.watch.select(0, N_KV - 1)  # from another thread in the window: applies from the next step
    st = dec.step()
    check(st, 0, N_KV - 1)
    assert dec.steps[0].view is None  # only the newest step keeps its view
    assert "view" not in st.to_json()
    # the view of any layer on demand (the window's worker, after the run)
    v = dec.watch.read(1, 0)
    assert (v["layer"], v["kv_head"]) == (1, 0)
    np.testing.assert_array_equal(v["scales"].k, unpack_int8_words(q.read_tokens(1, "K"))[1][:, 0])
    with pytest.raises(InvalidInput, match="layer"):
        dec.cache_view(N_LAYERS, 0)
    nov = LiveDecoder(tiny, "int8_seed", ctx=ctx, block_size=4, watch=False)
    nov.start(PROMPT, 1)
    assert nov.step().view is None and nov.watch is None


def test_generic_requant_path_equals_native(tiny, ctx):
    """int8_seed through RequantCache (whole sequence re-quantised every step) = the native path."""
    a = LiveDecoder(tiny, "int8_seed", ctx=ctx, block_size=4, free_run=False)
    b = LiveDecoder(tiny, "int8_seed", ctx=ctx, block_size=4, free_run=False, incremental=False)
    assert not isinstance(a._cache("method", BlockTable(8, 4)), RequantCache)
    for d in (a, b):
        d.start(PROMPT, 5)
        d.run()
    assert isinstance(b.caches["quant"], RequantCache)
    for sa, sb in zip(a.steps, b.steps):
        np.testing.assert_allclose(sa.logp_quant, sb.logp_quant, atol=1e-6)
        assert sa.kl == pytest.approx(sb.kl, rel=1e-3, abs=1e-9)
    w = b.caches["quant"].last_weights(1)
    assert w.shape == (N_HEADS, len(PROMPT) + 4) and np.allclose(w.sum(-1), 1, atol=1e-4)


def test_free_run_forks_and_matches_own_generation(tiny, ctx):
    """With a bad method the quantised path's own text leaves the baseline's; after the fork it is
    exactly what greedy generation through that method's cache produces."""
    n = 8
    dec = LiveDecoder(tiny, ZeroKeys(), ctx=ctx, block_size=4)
    dec.start(PROMPT, n)
    dec.run()
    summ = dec.summary()
    div = summ["free_first_divergence"]
    assert div is not None and div < n - 1 and summ["kl_mean"] > 1e-3
    # the paths share one sequence until their fed tokens differ: the step after the first divergence
    assert dec.free is not None and not dec.steps[div].free_forked and dec.steps[div + 1].free_forked
    # independent: one runner fed its own tokens through a fresh ZeroKeys cache
    cache = make_live_cache(ZeroKeys(), ctx, BlockTable(16, 4), N_LAYERS, N_HEADS, N_KV, HEAD_DIM, HEAD_DIM ** -0.5)
    r = LlamaRunner(tiny, record=False)
    r.prefill(PROMPT[:-1], kv_sink=cache.extend)
    hook = lambda li, q, k, v, pos: cache.append_attend(li, q, k, v, pos)  # noqa: E731
    r.step(PROMPT[-1], hook)
    own = r.generate(n, attend=hook, stop_at_eos=False)
    assert summ["per_step"]["free_token"] == own
    assert summ["texts"]["quant_free"] == tiny.tokenizer.decode(own)


def test_cancel(tiny, ctx):
    ref = LiveDecoder(tiny, "int8_seed", ctx=ctx, block_size=4)
    ref.start(PROMPT, 4)
    ref.run()

    dec = LiveDecoder(tiny, "int8_seed", ctx=ctx, block_size=4)
    with pytest.raises(Cancelled):
        dec.start(PROMPT, 4, cancel=lambda: True)
    assert not dec.started
    dec.start(PROMPT, 4)
    dec.step()
    calls = {"n": 0}

    def cancel_on_4th():  # step start, baseline layers 0 and 1, then quant layer 0
        calls["n"] += 1
        return calls["n"] >= 4

    last_q = list(dec.quant.cache.last_q)
    with pytest.raises(Cancelled):
        dec.step(cancel_on_4th)
    assert len(dec.steps) == 1 and dec.base.runner.pos == dec.quant.runner.pos == len(PROMPT)
    assert all(a is b for a, b in zip(dec.quant.cache.last_q, last_q))  # last_weights: the last complete step
    dec.run()  # continues as if nothing happened
    for a, b in zip(dec.steps, ref.steps):
        assert a.base_token == b.base_token and a.blocks == b.blocks
        np.testing.assert_allclose(a.logp_quant, b.logp_quant, atol=1e-6)

    dec.start(PROMPT, 4)
    done = []
    with pytest.raises(Cancelled):
        dec.run(on_step=done.append, cancel=lambda: len(done) >= 2)
    assert len(dec.steps) == 2


def test_errors(tiny, ctx):
    with pytest.raises(InvalidInput, match="Unknown method"):
        LiveDecoder(tiny, "no_such_method", ctx=ctx)
    with pytest.raises(InvalidInput, match="policy"):
        LiveDecoder(tiny, "int8_seed", ctx=ctx, policy="nope")
    dec = LiveDecoder(tiny, "int8_seed", ctx=ctx)
    with pytest.raises(InvalidInput, match="before start"):
        dec.step()
    with pytest.raises(InvalidInput, match="context"):
        dec.start(PROMPT, 300)
    dec = LiveDecoder(tiny, "int8_seed", ctx=ctx, block_size=4, num_blocks=2, policy="contiguous")
    with pytest.raises(InvalidInput, match="free blocks"):
        dec.start(PROMPT, 4)


def test_run_live_dict(tiny, ctx):
    import json

    r = run_live(None, PROMPT, 3, "int8_seed", "scattered", model=tiny, ctx=ctx, block_size=4)
    json.dumps(r)
    assert r["n_steps"] == 3 and len(r["steps"]) == 3 and r["config"]["policy"] == "scattered"
    assert r["blocks"]["quant"]["length"] == len(PROMPT) + 2
    assert r == r | summarize_live(r["steps"], r["texts"])  # the dict carries the summary of its steps


OTHER_METHODS = sorted(k for k in registry() if k != "int8_seed")


def test_methods_are_registered():
    assert {"int8_token", "int4_group", "fp8_e4m3", "fp8_e5m2", "kivi", "turboquant"} <= set(OTHER_METHODS)


@pytest.mark.parametrize("method", OTHER_METHODS)
def test_every_registered_method_runs_live(tiny, ctx, method):
    # head_size 32 fits every method's constraints, so an UnsupportedShape here is a failure.
    dec = LiveDecoder(tiny, method, ctx=ctx, block_size=4, free_run=False)
    dec.start(PROMPT, 3)
    steps = dec.run()
    assert all(np.isfinite(s.kl) and s.kl >= 0 for s in steps)
    assert all(len(s.blocks) == math.ceil(s.context_len / 4) for s in steps)
    # the cache view: what the method stores per position (a scale, or e.g. TurboQuant's norms), labelled
    v = steps[-1].view
    assert "error" not in v, v.get("error")
    sc, n = v["scales"], steps[-1].context_len
    assert sc.k.shape == sc.v.shape == (n,) and sc.k_label and sc.v_label and sc.note
    for a in (sc.k, sc.v):
        assert np.all(np.isnan(a) | (np.isfinite(a) & (a >= 0)))
    cache = dec.caches["quant"]
    if method != "kivi":  # KIVI: NaN where a token is still in the f32 recent window
        assert np.isfinite(sc.v).all()
    if hasattr(cache, "qkv"):  # re-quantising cache: the method's QuantizedKV of the layer
        qkv = cache.qkv[v["layer"]]
        if np.ndim(qkv.v_scales) == 2 and method != "kivi":  # one value per token: shown as stored
            np.testing.assert_array_equal(sc.v, qkv.v_scales[:n, 0])
    else:  # an appending cache: the scales shown are the records' own, as the block inspector decodes them
        recs = cache.inspect_block(v["layer"], cache.table.blocks[0], 0, "V")
        shown = [r.fields["scale"] for r in recs if r.position >= 0 and "scale" in r.fields and np.ndim(r.fields["scale"]) == 0]
        if shown and method != "kivi":
            np.testing.assert_allclose(sc.v[: len(shown)], shown, rtol=1e-6)
    assert v["weights_quant"].shape == v["weights_base"].shape == (N_HEADS // N_KV, n)
    np.testing.assert_allclose(v["weights_quant"].sum(-1), 1, atol=1e-4)


# ----------------------------------------------------------------------------------------------
# Typed live settings and the method hooks live decode goes through


def test_live_config_round_trip():
    import json

    from kvviz.live.config import LiveConfig

    cfg = LiveConfig(prompt="hi", n_new=5, policy="scattered", block_size=8, watch_layer=1, watch_kv_head=0)
    cfg = cfg.with_method_spec("kivi:bits=4;recent=64")
    assert cfg.method == "kivi" and cfg.method_options == {"bits": 4, "recent": 64}
    assert cfg.method_spec == "kivi:bits=4;recent=64"
    back = LiveConfig.from_json(json.loads(json.dumps(cfg.to_json())))
    assert back == cfg
    assert LiveConfig().with_method_spec("f32").method == "f32"
    for bad, name in [({"method": "nope"}, "nope"), ({"method": "kivi", "method_options": {"bits": 3}}, "bits"),
                      ({"method": "f32", "method_options": {"bits": 4}}, "f32"), ({"n_new": 0}, "n_new"),
                      ({"policy": "nope"}, "policy"), ({"baseline": "cpu"}, "baseline"), ({"block_size": 1.5}, "block_size"),
                      ({"bogus": 1}, "bogus")]:
        with pytest.raises(InvalidInput, match=name):
            LiveConfig.from_json({**cfg.to_json(), **bad})
    with pytest.raises(InvalidInput, match="bits"):
        cfg.with_method_spec("kivi:bits=3")


def test_decoder_from_config(tiny, ctx):
    from kvviz.live.config import LiveConfig

    cfg = LiveConfig(method="int4_group", method_options={"group_size": 32}, n_new=2, block_size=4,
                     policy="scattered", seed=1, free_run=False, watch_layer=0, watch_kv_head=1)
    dec = LiveDecoder.from_config(tiny, cfg, ctx=ctx)
    assert dec.config == cfg and dec.method == "int4_group" and dec.method_options == {"group_size": 32}
    assert dec.watch.selection == (0, 1) and dec.block_size == 4 and dec.policy == "scattered"
    dec.start(PROMPT, cfg.n_new)
    assert len(dec.run()) == 2


def test_live_cache_through_method_hooks(ctx):
    """int8_seed's own incremental cache comes from its `live_cache` hook; a subclass that changes
    quantize re-quantises; TurboQuant quantises layer l with layer l's rotation."""
    from kvviz.methods.live_cache import MethodPagedCache, cache_kind
    from kvviz.families.registry import get_method

    args = (ctx, BlockTable(16, 4), N_LAYERS, N_HEADS, N_KV, HEAD_DIM, HEAD_DIM ** -0.5)
    seed = get_method("int8_seed")
    assert isinstance(make_live_cache(seed, *args), MethodPagedCache) and cache_kind(seed) == "native"
    assert isinstance(make_live_cache(ZeroKeys(), *args), RequantCache) and cache_kind(ZeroKeys()) == "requant"
    assert cache_kind("f32") == "native" and cache_kind(get_method("kivi")) == "native"
    assert cache_kind(get_method("turboquant")) == "requant"
    with pytest.raises(TypeError, match="KVMethod"):
        cache_kind("kivi")  # a key is resolved by the registry first
    tq = make_live_cache(get_method("turboquant", seed=5), *args)
    assert [m.layer for m in tq.methods] == list(range(N_LAYERS)) and {m.seed for m in tq.methods} == {5}


def test_measure_arguments_become_live_configs():
    import argparse

    from kvviz.live.config import LiveConfig
    from kvviz.live.measure import add_arguments, check_args

    ap = argparse.ArgumentParser()
    add_arguments(ap)
    got = check_args(ap.parse_args(["--methods", "f32,kivi:bits=4;recent=0", "--n-new", "3", "--block-size", "8"]))
    assert [s for s, _ in got] == ["f32", "kivi:bits=4;recent=0"]
    assert all(isinstance(c, LiveConfig) and c.n_new == 3 and c.block_size == 8 for _, c in got)
    assert got[1][1].method_options == {"bits": 4, "recent": 0}


# ----------------------------------------------------------------------------------------------
# The real model


@pytest.mark.slow
def test_smollm2_int8_live(smollm2, ctx):
    tok = smollm2.tokenizer
    ids = tok.encode("The history of the printing press begins in the fifteenth century, when Johannes "
                     "Gutenberg combined movable metal type, oil-based ink and a wooden press")[:20]
    assert len(ids) == 20
    r = run_live(None, ids, 8, "int8_seed", "scattered", model=smollm2, ctx=ctx)
    # Measured (lavapipe): kl_mean 1.0e-3, kl_max 3.2e-3, top-1 agreement 8/8. The f32 path leaking into
    # the quantised one gives KL 0; a wrong slot, scale or head mapping gives KL >> 0.05.
    assert 1e-6 < r["kl_mean"] < 0.02 and r["kl_max"] < 0.1, r["per_step"]["kl"]
    assert r["top1_agree_rate"] >= 0.75
    # The GPU f32 paged baseline generates what the numpy runner generates on its own.
    runner = LlamaRunner(smollm2, record=False)
    runner.prefill(ids)
    assert r["per_step"]["base_token"] == runner.generate(8, stop_at_eos=False)
    assert r["blocks"]["quant"]["length"] == 27 and len(r["blocks"]["quant"]["blocks"]) == 2
