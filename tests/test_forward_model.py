"""The GPU forward (kvviz/forward/model.py) against the numpy forward on tests/tiny_llama.py's random GGUF: the
logits of a prefilled chunk and of decode steps (KL below 1e-5, the same argmax at every position), the KV cache,
the hooks the live decoder, capture and eval use, chunking and weights in parts, copies and cancels; the switches of
other architectures against the plan's numpy reference; the choice of forward; `kvviz live` and `kvviz capture`
with --forward."""
from __future__ import annotations

import copy
import dataclasses

import numpy as np
import pytest

from kvviz.cli import main as cli_main
from kvviz.errors import Cancelled, GpuUnavailable, InvalidInput, UnsupportedShape
from kvviz.forward import oracle as O
from kvviz.forward.model import GpuForward, GpuRunner
from kvviz.forward.plan import ForwardPlan, LayerPlan, inv_freq, plan_of
from kvviz.forward.select import choose, make_runner
from kvviz.live.decode import run_live
from kvviz.live.metrics import kl_logits
from kvviz.sources.gguf_llama import load_gguf_llama
from kvviz.sources.llama_numpy import LlamaRunner, capture_tokens, gqa_attention

from tiny_llama import write_tiny_gguf  # noqa: E402

pytestmark = pytest.mark.gpu

IDS = [int(i) for i in np.random.default_rng(3).integers(0, 260, 29)]
KL_MAX = 1e-5


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("fwd") / "tiny.gguf"
    write_tiny_gguf(path, head_size=32, tied=True)
    return load_gguf_llama(path)


def _variant(model, kind: str, tmp_path):
    """The tiny model as it is, with Llama 3 RoPE factors and linear scaling, or written with F16 matrices."""
    if kind == "plain":
        return model
    if kind == "rope":
        d = model.config.head_size
        w = copy.copy(model.weights)
        w.rope_freq_factors = np.linspace(1.0, 8.0, d // 2).astype(np.float32)
        return dataclasses.replace(model, config=dataclasses.replace(model.config, rope_scaling="linear", rope_scale=4.0),
                                   weights=w)
    path = tmp_path / "tiny-f16.gguf"
    write_tiny_gguf(path, head_size=32, tied=True, f16=True)
    return load_gguf_llama(path)


def _assert_close(gpu, ref):
    gpu, ref = np.atleast_2d(gpu), np.atleast_2d(ref)
    kls = [kl_logits(a, b) for a, b in zip(ref, gpu)]
    assert max(kls) < KL_MAX, f"KL up to {max(kls):.3g}"
    assert (gpu.argmax(-1) == ref.argmax(-1)).all()


@pytest.mark.parametrize("kind", ["plain", "rope", "f16"])
def test_prefill_and_decode_match_the_numpy_forward(rt, tiny, kind, tmp_path):
    model = _variant(tiny, kind, tmp_path)
    fwd = GpuForward(model, rt)
    if kind == "f16":  # "exact" weights: an F16 file's matrices are f16 values, so f16 on the device, the same arithmetic
        assert set(fwd.dtypes.values()) == {"f16"}
    else:
        assert set(fwd.dtypes.values()) == {"f32"}
    g, n = GpuRunner(model, forward=fwd), LlamaRunner(model)
    _assert_close(g.prefill(IDS, all_logits=True), n.prefill(IDS, all_logits=True))
    tok = int(n.last_logits.argmax())
    for _ in range(5):
        a, b = n.step(tok), g.step(tok)
        _assert_close(b, a)
        tok = int(a.argmax())
    (k1, v1), (k2, v2) = n.kv(), g.kv()
    assert k2.shape == k1.shape and np.allclose(k1, k2, atol=2e-5) and np.allclose(v1, v2, atol=2e-5)
    fwd.close()


def test_chunks_and_weights_in_parts_give_the_same_logits(rt, tiny):
    """Prefill chunks of 5 tokens and every matrix in parts of at most 8 KiB (a binding limit made small)."""
    fwd = GpuForward(tiny, rt, chunk=5, max_binding=8192)
    assert fwd.chunk == 5 and len(fwd.tok_embd.parts) > 1 and all(len(m.parts) > 1 for m in fwd._mats)
    g, n = GpuRunner(tiny, forward=fwd), LlamaRunner(tiny)
    _assert_close(g.prefill(IDS, all_logits=True), n.prefill(IDS, all_logits=True))
    _assert_close(g.prefill(IDS[:3]), n.prefill(IDS[:3]))  # after what it holds
    fwd.close()


def test_logits_from_computes_only_the_rows_asked_for(rt, tiny, monkeypatch):
    """all_logits from row 12 of 29 in chunks of 5 (what eval asks: the scored half of a chunk): the numpy runner's
    rows 12.., and only those go through the logits product; progress counts the GPU's layer passes, chunk by
    chunk; token by token (attend) the same rows."""
    fwd = GpuForward(tiny, rt, chunk=5)
    g, n = GpuRunner(tiny, forward=fwd), LlamaRunner(tiny)
    assert g.prefill_chunk == 5
    made, seen = [], []
    orig = GpuRunner._logit_dispatches
    monkeypatch.setattr(GpuRunner, "_logit_dispatches",
                        lambda self, act, r0, k: made.append((self.pos, r0, k)) or orig(self, act, r0, k))
    got = g.prefill(IDS, all_logits=True, logits_from=12, progress=lambda d, t: seen.append((d, t)))
    ref = n.prefill(IDS, all_logits=True, logits_from=12)
    assert got.shape == ref.shape == (17, tiny.config.vocab)
    _assert_close(got, ref)
    # chunk 10..14 from its third row, then whole chunks: 17 rows, none before position 12
    assert made == [(15, 2, 3), (20, 0, 5), (25, 0, 5), (29, 0, 4)]
    L = tiny.config.n_layers
    assert seen == [(i, 6 * L) for i in range(1, 6 * L + 1)]
    made.clear()
    _assert_close(g.prefill(IDS[:3]), n.prefill(IDS[:3]))  # the last row alone, after what it holds
    assert made == [(32, 2, 1)]
    g.reset()
    n.reset()
    tok = g.prefill(IDS[:6], attend=g.default_attend, all_logits=True, logits_from=4)
    assert tok.shape == (2, tiny.config.vocab)
    _assert_close(tok, n.prefill(IDS[:6], all_logits=True, logits_from=4))
    with pytest.raises(InvalidInput, match="logits_from 6 is outside"):
        g.prefill(IDS[:6], all_logits=True, logits_from=6)
    fwd.close()


def test_a_pass_as_dispatches_is_the_prefill(rt, tiny):
    """pass_dispatches (what the benchmarks time) computes what prefill does, bit for bit, and moves nothing."""
    a, b = GpuRunner(tiny, rt), GpuRunner(tiny, rt)
    ds = a.pass_dispatches(IDS[:7])
    rt.run(ds)
    assert a.pos == 0 and np.array_equal(a.pass_logits(), b.prefill(IDS[:7]))
    with pytest.raises(InvalidInput, match="a pass takes"):
        a.pass_dispatches([])


def test_the_hooks_see_the_numpy_forward_s_tensors(rt, tiny):
    """attend_chunk (batched), attend (per token) and kv_sink get the q / k / v the numpy forward computes, and the
    hooks' attention (numpy's, here) flows back into the GPU forward."""
    fwd = GpuForward(tiny, rt)
    n = LlamaRunner(tiny)
    sunk_n, sunk_g, seen = [], [], []
    ref = n.prefill(IDS, kv_sink=lambda li, k, v, s: sunk_n.append((li, k.copy(), v.copy(), s)))
    cache = {}

    def chunk_hook(li, q, k, v, start):
        seen.append(q.shape)
        kk, vv = cache.get(li, (np.zeros((k.shape[0], 0, k.shape[2]), np.float32),) * 2)
        kk, vv = np.concatenate([kk, k], 1), np.concatenate([vv, v], 1)
        cache[li] = (kk, vv)
        return gqa_attention(q.transpose(1, 0, 2), kk, vv, q_start=start).transpose(1, 0, 2)

    g = GpuRunner(tiny, forward=fwd)
    got = g.prefill(IDS[:20], attend_chunk=chunk_hook, kv_sink=lambda li, k, v, s: sunk_g.append((li, k, v, s)))
    got = g.prefill(IDS[20:], attend_chunk=chunk_hook, kv_sink=lambda li, k, v, s: sunk_g.append((li, k, v, s)))
    _assert_close(got, ref)
    assert seen[0] == (20, tiny.config.n_heads, tiny.config.head_size)
    k_n = np.concatenate([k for li, k, _, _ in sunk_n if li == 1], 1)
    k_g = np.concatenate([k for li, k, _, _ in sunk_g if li == 1], 1)
    assert np.allclose(k_n, k_g, atol=2e-5)
    # per token: the same hook on both runners
    hooks = {}

    def token_hook(store):
        def attend(li, q, k, v, pos):
            kk, vv = store.setdefault(li, ([], []))
            kk.append(k)
            vv.append(v)
            return gqa_attention(q[:, None], np.stack(kk, 1), np.stack(vv, 1), q_start=pos)[:, 0]
        return attend

    n2, g2 = LlamaRunner(tiny), GpuRunner(tiny, forward=fwd)
    _assert_close(g2.prefill(IDS[:6], attend=token_hook(hooks.setdefault("g", {}))),
                  n2.prefill(IDS[:6], attend=token_hook(hooks.setdefault("n", {}))))
    _assert_close(g2.step(7, token_hook(hooks["g"])), n2.step(7, token_hook(hooks["n"])))
    with pytest.raises(InvalidInput, match="attend_chunk\\(\\) returned shape"):
        g2.prefill([1, 2], attend_chunk=lambda li, q, k, v, s: q[:1])
    assert g2.pos == 7  # the refused prefill left the sequence as it was
    fwd.close()


def test_capture_matches_the_numpy_capture(rt, tiny):
    cap_n, logits_n = capture_tokens(tiny, IDS)
    cap_g, logits_g = capture_tokens(tiny, IDS, runner=GpuRunner(tiny, rt, record=True))
    _assert_close(logits_g, logits_n)
    for name in ("q", "k_pre_rope", "k", "v"):
        a, b = getattr(cap_n, name), getattr(cap_g, name)
        assert a.shape == b.shape and np.allclose(a, b, atol=5e-5), name
    assert cap_g.token_strings == cap_n.token_strings


def test_a_copy_is_its_own_sequence_and_a_cancel_restores_the_position(rt, tiny):
    g = GpuRunner(tiny, rt)
    g.prefill(IDS[:10])
    c = copy.deepcopy(g)
    a = g.step(3)
    b = c.step(3)
    assert np.array_equal(a, b)
    c.step(4)
    fresh = GpuRunner(tiny, rt)  # the same operations on a runner nobody copied
    fresh.prefill(IDS[:10])
    fresh.step(3)
    assert (g.pos, c.pos) == (11, 12) and np.array_equal(g.step(5), fresh.step(5))
    calls = []
    with pytest.raises(Cancelled):
        g.prefill(IDS, cancel=lambda: len(calls) > 0 or calls.append(1))  # at the second layer
    assert g.pos == 12 and len(g.tokens) == 12
    with pytest.raises(InvalidInput, match="at least one token"):
        g.prefill([])
    with pytest.raises(InvalidInput, match="out of range"):
        g.step(10 ** 6)


def _plan(rng, *, h=48, d=16, nh=6, nkv=2, f=40, vocab=50, layers=3) -> ForwardPlan:
    def m(*shape, s=0.2):
        return (rng.standard_normal(shape) * s).astype(np.float32)

    nq, nk = nh * d, nkv * d
    lps = []
    for i in range(layers):
        lps.append(LayerPlan(attn_norm=1 + m(h, s=0.1), qkv=[m(nq, h, s=0.3), m(nk, h, s=0.3), m(nk, h)],
                             wo=m(h, nq), ffn_norm=1 + m(h, s=0.1), gate_up=[m(f, h), m(f, h)], w_down=m(h, f),
                             qkv_bias=[m(nq), m(nk), m(nk)], wo_bias=m(h), gate_up_bias=[m(f), m(f)],
                             down_bias=m(h), q_norm=1 + m(d, s=0.1), k_norm=1 + m(d, s=0.1),
                             post_attn_norm=1 + m(h, s=0.1), post_ffn_norm=1 + m(h, s=0.1),
                             window=5 if i % 2 == 0 else 0, rope=i % 2))
    embd = m(vocab, h, s=1.0)
    local, glob = inv_freq(d, 10000.0), inv_freq(d, 1e6, np.linspace(1, 4, d // 2))
    return ForwardPlan(n_heads=nh, n_kv_heads=nkv, head_size=d, hidden=h, ffn=f, vocab=vocab, rms_eps=1e-6,
                       context_length=64, tok_embd=embd, out_norm=1 + m(h, s=0.1), output=m(vocab, h), layers=lps,
                       ropes=[(local, 1.0), (glob, 8.0)], rope_attn_factor=1.19, act="gelu_tanh",
                       embed_scale=float(np.sqrt(h)), attn_scale=0.2, attn_softcap=8.0, final_softcap=5.0,
                       output_bias=m(vocab))


@pytest.mark.parametrize("mode", ["neox", "normal"])
def test_other_architectures_switches_match_the_plan_reference(rt, mode):
    """Biases of every product and of the logits, per-head q/k norms, post norms, GeGLU, the embedding and query
    scales, soft-capped scores and logits, sliding windows and a second RoPE base and position scale on alternate
    layers, a factor on cos and sin, both RoPE layouts, an untied output: prefill and decode against forward_ref."""
    plan = _plan(np.random.default_rng(11))
    plan.rope_mode = mode
    ids = [int(i) for i in np.random.default_rng(5).integers(0, plan.vocab, 12)]
    ref = O.forward_ref(plan, ids)
    g = GpuRunner(plan, forward=GpuForward(plan, rt))
    _assert_close(g.prefill(ids[:9], all_logits=True), ref[:9])
    for j in range(9, 12):
        _assert_close(g.step(ids[j]), ref[j])


def test_the_choice_of_forward(rt, tiny, tmp_path):
    assert choose(tiny, rt, "numpy").path == "numpy"
    assert choose(tiny, rt, "gpu").path == "gpu"
    assert choose(tiny, None, "auto").path == "numpy"
    auto = choose(tiny, rt, "auto")
    assert auto.path == ("numpy" if rt.summary.is_software else "gpu")
    with pytest.raises(GpuUnavailable, match="no wgpu adapter"):
        choose(tiny, None, "gpu")
    with pytest.raises(InvalidInput, match="choose one of auto, gpu, numpy"):
        choose(tiny, rt, "cuda")
    path = tmp_path / "h24.gguf"
    write_tiny_gguf(path, head_size=24)
    odd = load_gguf_llama(path)
    with pytest.raises(UnsupportedShape, match="multiples of 16"):
        choose(odd, rt, "gpu")
    if not rt.summary.is_software:
        assert "cannot run it here" in choose(odd, rt, "auto").reason
    runner, c = make_runner(tiny, rt, forward="gpu", record=True)
    assert isinstance(runner, GpuRunner) and runner.record and c.path == "gpu"
    assert plan_of(tiny).n_layers == tiny.config.n_layers


def test_live_decode_on_the_gpu_forward_matches_numpy(rt, ctx, tiny):
    common = dict(prompt=IDS[:12], n_new=5, method="int8_seed", model=tiny, ctx=ctx, include_steps=True)
    g = run_live(**common, forward="gpu")
    n = run_live(**common, forward="numpy")
    assert g["config"]["forward"] == "gpu" and n["config"]["forward"] == "numpy"
    assert [s["base_token"] for s in g["steps"]] == [s["base_token"] for s in n["steps"]]
    assert np.allclose(g["per_step"]["kl"], n["per_step"]["kl"], rtol=1e-2, atol=1e-7)
    # the baseline through the runner's own attention (no f32 paged cache): GpuRunner.default_attend
    b = run_live(**dict(common, method="f32", n_new=3), forward="gpu", baseline="numpy", free_run=False)
    assert b["config"]["baseline"].startswith("numpy") and b["kl_max"] < 1e-6
    assert [s["base_token"] for s in b["steps"]] == [s["base_token"] for s in n["steps"][:3]]


def test_capture_and_live_cli_take_forward(tmp_path, capsys):
    model = tmp_path / "tiny.gguf"
    write_tiny_gguf(model, head_size=32)
    out = tmp_path / "cap.npz"
    assert cli_main(["capture", "--model", str(model), "--prompt", "the cat", "--out", str(out), "--forward", "gpu"]) == 0
    assert "forward: gpu" in capsys.readouterr().out
    assert np.load(out)["q"].shape[0] == 2
    with pytest.raises(SystemExit) as e:
        cli_main(["capture", "--model", str(model), "--prompt", "x", "--out", str(out), "--forward", "cuda"])
    assert e.value.code == 2
    rc = cli_main(["live", "--model", str(model), "--prompt", "the cat sat", "--n-new", "2", "--methods", "f32",
                   "--forward", "gpu"])
    text = capsys.readouterr().out
    assert rc == 0 and "forward: gpu" in text
