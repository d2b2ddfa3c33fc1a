"""Every architecture kvviz runs, against llama.cpp: the forward on small random models of each (F32 and a
quantised weight type) matches llama.cpp's logits, and the tokenisers its token ids.

The fixtures (tests/data/llamacpp/<recipe>.npz) are written by tools/llamacpp_reference.py; they hold
llama.cpp's logits and a SHA-256 of each model's tensor data, and the models are written again here from
their recipes (kvviz.sources.random_gguf), so a changed recipe fails on its hash, not on its logits.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from kvviz.errors import InvalidInput
from kvviz.sources.archs import ARCHS, describe_config, summary_line
from kvviz.sources.gguf_llama import load_gguf_llama, read_config
from kvviz.sources.gguf_weights import parse_budget
from kvviz.sources.llama_numpy import LlamaRunner, gqa_attention
from kvviz.sources.random_gguf import RECIPES, write_random_gguf

DATA = Path(__file__).resolve().parent / "data" / "llamacpp"
KL_MAX = 1e-5  # per position; the float32 forwards differ only in rounding (measured 1e-11 to 1.3e-6)


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, np.float64)
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def kl(ref: np.ndarray, got: np.ndarray) -> np.ndarray:
    """KL(ref || got) at every position [T], nats."""
    a, b = log_softmax(ref), log_softmax(got)
    return (np.exp(a) * (a - b)).sum(-1)


def fixture(name: str) -> dict:
    with np.load(DATA / f"{name}.npz") as f:
        return {k: f[k] for k in f.files}


_FILES: dict = {}
_MODELS: dict = {}


def model_of(name: str, wtype: str, tmp_path_factory, **load):
    """The recipe's model in `wtype` ("F32" or "quant"), written once per session and checked against the
    fixture's hash; `load` goes to load_gguf_llama."""
    if (name, wtype) not in _FILES:
        r, fx = RECIPES[name], fixture(name)
        qt = "F32" if wtype == "F32" else r.qtype
        path = tmp_path_factory.mktemp(name) / f"{name}.{qt}.gguf"
        info = write_random_gguf(r, path, qt)
        want = str(fx["sha256_f32" if wtype == "F32" else "sha256_quant"])
        assert info["sha256"] == want, f"{name} {qt}: the recipe no longer writes the fixture's model; run " \
                                       "tools/llamacpp_reference.py again"
        assert info["tokens"] == fx["tokens"].tolist()
        _FILES[(name, wtype)] = path
    key = (name, wtype, tuple(sorted(load.items())))
    if key not in _MODELS:
        _MODELS[key] = load_gguf_llama(_FILES[(name, wtype)], **load)
    return _MODELS[key]


@pytest.mark.parametrize("wtype", ["F32", "quant"])
@pytest.mark.parametrize("name", sorted(RECIPES))
def test_forward_matches_llamacpp(name, wtype, tmp_path_factory):
    fx = fixture(name)
    model = model_of(name, wtype, tmp_path_factory)
    assert model.config.arch == str(fx["arch"])
    got = LlamaRunner(model, record=False).prefill(fx["tokens"].tolist(), all_logits=True)
    ref = fx["logits_f32" if wtype == "F32" else "logits_quant"]
    k = kl(ref, got)
    assert k.max() < KL_MAX, f"{name} {wtype}: KL {k.max():.2e} at position {int(k.argmax())}"
    np.testing.assert_array_equal(got.argmax(-1), ref.argmax(-1))
    if wtype == "quant":
        # llama.cpp on the quantised file itself quantises the activations too: it lands farther from kvviz
        # than ggml's float32 dequantisation of the same file does (the reason the window gives)
        direct = kl(fx["logits_quant_direct"].astype(np.float32), got)
        assert direct.mean() > 100 * k.mean()


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_tokenizer_matches_llamacpp(name, tmp_path_factory):
    fx = fixture(name)
    tok = model_of(name, "F32", tmp_path_factory).tokenizer
    strings, ids = json.loads(str(fx["strings"])), json.loads(str(fx["token_ids"]))
    assert len(strings) == len(ids) > 5
    for s, want in zip(strings, ids):
        assert tok.encode(s, add_bos=False) == want, repr(s)
    assert tok.encode("hello", add_bos=True)[0] == tok.bos_id


def test_sentencepiece_details(tmp_path_factory):
    """What the fixtures' strings rely on, spelled out: merges by score, byte fallback, the space prefix,
    special tokens in the text, decoding."""
    tok = model_of("llama", "F32", tmp_path_factory).tokenizer  # SentencePiece, space prefix
    t = tok.tokens
    assert [t[i] for i in tok.encode("hello world", add_bos=False)] == ["\u2581hello", "\u2581world"]
    ids = tok.encode("\u4e16", add_bos=False)  # no such piece: its UTF-8 bytes, after the space piece
    assert [t[i] for i in ids] == ["\u2581", "<0xE4>", "<0xB8>", "<0x96>"]
    assert tok.decode(tok.encode("hello \u4e16 world", add_bos=False)) == "hello \u4e16 world"
    assert tok.decode(tok.encode("hello", add_bos=True), skip_special=True) == "hello"
    assert tok.token_strings(ids) == [" ", "\ufffd", "\ufffd", "\ufffd"]
    assert tok.encode("<|end|>", add_bos=False) == [t.index("<|end|>")]
    gem = model_of("gemma2", "F32", tmp_path_factory).tokenizer  # Gemma: no space prefix, BOS 2
    assert [gem.tokens[i] for i in gem.encode("hello", add_bos=False)] == ["he", "llo"]
    for text in ("<start_of_turn>user hello<end_of_turn>", " two  spaces", "été 世"):
        assert gem.decode(gem.encode(text)) == "<bos>" + text and tok.decode(tok.encode(text, add_bos=False)) == text
    assert gem.encode("x")[0] == 2 and gem.bos_id == 2 and gem.eos_id == 1


@pytest.mark.parametrize("name", ["gemma2", "gemma3"])
def test_step_by_step_matches_batched(name, tmp_path_factory):
    """Decoding one token at a time (the attention hook's path: window, soft-cap, query scale) gives the
    logits of the batched prefill, past the window."""
    fx = fixture(name)
    model = model_of(name, "F32", tmp_path_factory)
    ids = fx["tokens"].tolist()
    ref = LlamaRunner(model, record=False).prefill(ids, all_logits=True)
    r = LlamaRunner(model, record=False)
    r.prefill(ids[:5])
    got = np.stack([r.step(t) for t in ids[5:]])
    np.testing.assert_allclose(got, ref[5:], rtol=1e-4, atol=1e-4)
    assert max(model.config.layer_windows) < len(ids) - 5


def test_window_and_softcap_matter(tmp_path_factory):
    """The fixtures pin the window and the soft-caps: without them the forward leaves llama.cpp's logits."""
    import dataclasses

    fx = fixture("gemma2")
    model = model_of("gemma2", "F32", tmp_path_factory)
    ids = fx["tokens"].tolist()
    for change in ({"layer_windows": (0,) * model.config.n_layers}, {"attn_softcap": 0.0}, {"final_softcap": 0.0}):
        other = dataclasses.replace(model, config=dataclasses.replace(model.config, **change))
        got = LlamaRunner(other, record=False).prefill(ids, all_logits=True)
        assert kl(fx["logits_f32"], got).max() > 1e-3, change


def test_gqa_attention_window_oracle():
    """The windowed, soft-capped attention against a per-query loop."""
    rng = np.random.default_rng(3)
    q = rng.standard_normal((4, 7, 8)).astype(np.float32)
    k = rng.standard_normal((2, 12, 8)).astype(np.float32)
    v = rng.standard_normal((2, 12, 8)).astype(np.float32)
    out = gqa_attention(q, k, v, q_start=3, scale=0.3, cap=2.0, window=4, k_start=0)
    for h in range(4):
        for i in range(7):
            pos = 3 + i
            keys = [j for j in range(12) if j <= pos and pos - j < 4]
            s = np.array([2.0 * np.tanh(0.3 * q[h, i] @ k[h // 2, j] / 2.0) for j in keys])
            p = np.exp(s - s.max())
            p /= p.sum()
            np.testing.assert_allclose(out[h, i], p @ v[h // 2, keys], rtol=1e-5, atol=1e-6)


def test_gqa_attention_at_given_positions():
    """Queries at scattered positions (every 3rd, as the eval's attention-error check takes them) in one call
    equal each query alone at its own position, window and soft-cap included."""
    rng = np.random.default_rng(4)
    q = rng.standard_normal((4, 5, 8)).astype(np.float32)
    k = rng.standard_normal((2, 15, 8)).astype(np.float32)
    v = rng.standard_normal((2, 15, 8)).astype(np.float32)
    pos = np.array([0, 3, 6, 9, 14])
    out = gqa_attention(q, k, v, scale=0.3, cap=2.0, window=6, q_pos=pos)
    for i, p in enumerate(pos):
        one = gqa_attention(q[:, i:i + 1], k[:, :p + 1], v[:, :p + 1], q_start=int(p), scale=0.3, cap=2.0, window=6)
        np.testing.assert_allclose(out[:, i], one[:, 0], rtol=1e-5, atol=1e-6)


def test_mapped_weights_under_a_tiny_budget(tmp_path_factory):
    """A budget too small for a float32 copy: weights stay in file form, each layer is dequantised when the
    forward reaches it, and the logits are those of the resident model."""
    fx = fixture("gemma3")
    ids = fx["tokens"].tolist()
    resident = model_of("gemma3", "quant", tmp_path_factory)
    mapped = model_of("gemma3", "quant", tmp_path_factory, weight_budget=300_000)
    assert resident.weights.mode == "resident" and mapped.weights.mode == "mapped"
    layers = mapped.weights.layers
    got = LlamaRunner(mapped, record=False).prefill(ids, all_logits=True)
    ref = LlamaRunner(resident, record=False).prefill(ids, all_logits=True)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
    assert kl(fx["logits_quant"], got).max() < KL_MAX
    n = mapped.config.n_layers
    assert layers.reads == n and layers.resident_bytes <= max(300_000, max(
        layers[i].nbytes for i in range(n)))  # the budget holds (one layer alone may exceed it)
    LlamaRunner(mapped, record=False).prefill(ids[:3])
    assert layers.reads > n  # evicted layers were read again
    big = model_of("gemma3", "quant", tmp_path_factory, weight_budget=10**9)
    assert big.weights.mode == "resident"


def test_budget_setting(monkeypatch):
    assert parse_budget("512M") == 512 << 20 and parse_budget("1.5G") == int(1.5 * (1 << 30))
    assert parse_budget("4096") == 4096 and parse_budget("2 GiB") == 2 << 30
    with pytest.raises(InvalidInput, match="not a size"):
        parse_budget("lots")
    from kvviz.sources import gguf_weights

    monkeypatch.setenv("KVVIZ_WEIGHT_BUDGET", "3M")
    assert gguf_weights.default_budget() == 3 << 20


def test_describe_config(tmp_path_factory):
    c3 = model_of("gemma3", "quant", tmp_path_factory).config
    rows = dict(describe_config(c3))
    assert rows["sliding window"] == "12 positions on 5 of 6 layers (global: 5)"
    assert rows["rope"] == "base 1e6, linear scaling x8, windowed layers base 10000"
    assert "GQA 4" in rows["attention"] and "head size 256" in rows["attention"]
    assert rows["weights"].startswith("Q4_K x") and "activations" in rows["vs llama.cpp"]
    assert rows["forward"].startswith("the GPU forward on a hardware adapter")
    c2 = model_of("gemma2", "F32", tmp_path_factory).config
    assert c2.layer_windows == (8, 0, 8, 0) and c2.attn_softcap == 5.0 and c2.final_softcap == 4.0
    assert "soft-capped at 5" in dict(describe_config(c2))["attention"] and "vs llama.cpp" not in dict(
        describe_config(c2))
    phi = model_of("phi3", "F32", tmp_path_factory).config
    assert phi.context_length == 256 and phi.rope_attn_factor == pytest.approx(1.19)
    assert any("not applied" in n for n in phi.notes)
    assert "GQA 4" in summary_line(model_of("llama", "F32", tmp_path_factory).config)


def _meta_only(path, arch="gemma2", n_layers=46, hidden=512, heads=4, head=64, **extra):
    """A GGUF with metadata and a vocabulary but no tensors: enough for read_config."""
    import gguf

    from kvviz.sources.random_gguf import spm_vocab

    voc = spm_vocab(gemma=True)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(n_layers)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(4 * hidden)
    w.add_head_count(heads)
    w.add_head_count_kv(1)
    w.add_key_length(head)
    w.add_value_length(head)
    for k, v in extra.items():
        getattr(w, k)(v)
    w.add_tokenizer_model(voc["model"])
    w.add_token_list(voc["tokens"])
    w.add_token_scores(voc["scores"])
    w.add_token_types(voc["types"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return read_config(path)


def test_gemma_query_scale_and_window_pattern(tmp_path):
    """llama.cpp's rules: the 27B models (Gemma 2: 46 layers, Gemma 3: 62) scale queries by
    1/sqrt(hidden/heads), the others by 1/sqrt(head size); the window pattern's period can be set."""
    c = _meta_only(tmp_path / "a.gguf")
    assert c.query_scale == pytest.approx(1 / math.sqrt(512 / 4)) and c.layer_windows[:3] == (4096, 0, 4096)
    c = _meta_only(tmp_path / "b.gguf", n_layers=42)
    assert c.query_scale == pytest.approx(1 / 8)
    c = _meta_only(tmp_path / "c.gguf", arch="gemma3", n_layers=8, add_sliding_window=512,
                   add_sliding_window_pattern=4)
    assert c.layer_windows == (512, 512, 512, 0, 512, 512, 512, 0) and c.rope_theta_swa == 10000.0
    c = _meta_only(tmp_path / "d.gguf", arch="gemma3", n_layers=4)  # no window in the file: none
    assert c.layer_windows == () and c.sliding_layers == ()


def test_refusals_name_what_is_missing(tmp_path):
    with pytest.raises(InvalidInput, match="architecture 'mamba' is not one kvviz runs"):
        _meta_only(tmp_path / "m.gguf", arch="mamba")
    with pytest.raises(InvalidInput, match="RoPE scaling 'yarn'"):
        _meta_only(tmp_path / "y.gguf", arch="qwen2", add_rope_scaling_type=__import__("gguf").RopeScalingType.YARN)
    # a Qwen3 file without its per-head norms: the message names the tensors
    import gguf

    r = RECIPES["qwen3"]
    path = tmp_path / "q3.gguf"
    write_random_gguf(r, path)
    rd = gguf.GGUFReader(path)
    w = gguf.GGUFWriter(str(tmp_path / "q3-no-norm.gguf"), "qwen3")
    for f in rd.fields.values():
        if f.name.startswith("GGUF.") or f.name == "general.architecture":
            continue
        w.add_key_value(f.name, f.contents(), f.types[0], f.types[-1] if len(f.types) > 1 else None)
    for t in rd.tensors:
        if "attn_k_norm" not in t.name:
            w.add_tensor(t.name, np.array(t.data), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(InvalidInput, match=r"blk\.0\.attn_k_norm\.weight"):
        load_gguf_llama(tmp_path / "q3-no-norm.gguf")


def test_every_architecture_has_a_fixture():
    assert {r.arch for r in RECIPES.values()} == set(ARCHS)
    assert all((DATA / f"{n}.npz").is_file() for n in RECIPES)


def test_kvviz_info_model(tmp_path_factory, capsys, monkeypatch):
    """`kvviz info --model FILE`: the model's rows from its metadata, without weights or a GPU; a file that is
    not one kvviz runs: one line, exit 2."""
    from kvviz.cli import main

    model_of("gemma3", "quant", tmp_path_factory)
    path = _FILES[("gemma3", "quant")]
    assert main(["info", "--model", str(path)]) == 0
    out = capsys.readouterr().out
    for part in ("architecture:   gemma3 (Gemma 3)", "GQA 4", "head size 256", "12 positions on 5 of 6 layers",
                 "windowed layers base 10000", "Q4_K x", "forward:        the GPU forward on a hardware adapter", "quantises the activations",
                 "memory:         float32 weights"):
        assert part in out, (part, out)
    monkeypatch.setenv("KVVIZ_WEIGHT_BUDGET", "1M")
    assert main(["info", "--model", str(path)]) == 0
    assert "dequantised layer by layer (weight budget 1 MiB" in capsys.readouterr().out
    bad = tmp_path_factory.mktemp("bad") / "x.gguf"
    _meta_only(bad, arch="qwen3")  # metadata only: read_config takes it
    bad.write_bytes(bad.read_bytes().replace(b"qwen3", b"mamba"))
    assert main(["info", "--model", str(bad)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "architecture 'mamba' is not one kvviz runs" in err[0]


def test_weights_are_named_as_in_the_file(tmp_path_factory):
    """What a refusal of a damaged weight names: the file's tensor (and the part of a fused one)."""
    phi = [n for n, _ in model_of("phi3", "F32", tmp_path_factory).weights.named()]
    assert "blk.0.attn_qkv.weight (K rows)" in phi and "blk.1.ffn_up.weight (gate rows)" in phi
    assert "rope_freqs.weight" in phi  # Phi-3's short factors, read as the RoPE frequency factors
    qwen = [n for n, _ in model_of("qwen2", "F32", tmp_path_factory).weights.named()]
    assert "blk.1.attn_k.bias" in qwen and "output.weight" not in qwen  # tied
    gem = [n for n, _ in model_of("gemma3", "F32", tmp_path_factory).weights.named()]
    assert {"blk.5.post_ffw_norm.weight", "blk.5.attn_q_norm.weight", "output.weight"} <= set(gem)
