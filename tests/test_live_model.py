"""Live-KV sources: GGUF Llama loader, numpy runner, KV dump files, and the real SmolLM2."""
from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest

from kvviz.errors import InvalidInput
from kvviz.sources import kv_files
from kvviz.sources.gguf_llama import (
    GGUFTokenizer, load_gguf_llama, permute_llamacpp, unpermute_llamacpp,
)
from kvviz.sources.llama_numpy import Cancelled, LlamaRunner, capture_tokens, gqa_attention

# ----------------------------------------------------------------------------------------------
# A tiny random llama GGUF, written the way llama.cpp's converter writes one.

from tiny_llama import EPS, FFN, N_HEADS, N_KV, N_LAYERS, THETA, write_tiny_gguf  # noqa: E402
from tiny_llama import vocab as _vocab  # noqa: E402

HEAD_DIM = 16
HIDDEN = N_HEADS * HEAD_DIM


@pytest.fixture
def tiny(tmp_path):
    path = tmp_path / "tiny.gguf"
    hf = write_tiny_gguf(path)
    return load_gguf_llama(path), hf, path


# ----------------------------------------------------------------------------------------------
# Independent reference: float64, one token and one head at a time, explicit RoPE pairs (i, i + D/2).


def reference_logits(hf: dict[str, np.ndarray], ids: list[int]) -> np.ndarray:
    w = {k: v.astype(np.float64) for k, v in hf.items()}
    D, half, g = HEAD_DIM, HEAD_DIM // 2, N_HEADS // N_KV

    def norm(x, g_):
        return x / np.sqrt(np.mean(x * x) + EPS) * g_

    def rope(vec, pos):
        out = vec.copy()
        for i in range(half):
            a = pos * THETA ** (-2.0 * i / D)
            x0, x1 = vec[i], vec[i + half]
            out[i] = x0 * np.cos(a) - x1 * np.sin(a)
            out[i + half] = x1 * np.cos(a) + x0 * np.sin(a)
        return out

    keys = [[[] for _ in range(N_KV)] for _ in range(N_LAYERS)]
    vals = [[[] for _ in range(N_KV)] for _ in range(N_LAYERS)]
    logits = []
    for pos, tid in enumerate(ids):
        x = w["token_embd.weight"][tid].copy()
        for li in range(N_LAYERS):
            b = f"blk.{li}."
            h = norm(x, w[b + "attn_norm.weight"])
            q = w[b + "attn_q.weight"] @ h
            k = w[b + "attn_k.weight"] @ h
            v = w[b + "attn_v.weight"] @ h
            for j in range(N_KV):
                keys[li][j].append(rope(k[j * D:(j + 1) * D], pos))
                vals[li][j].append(v[j * D:(j + 1) * D])
            att = np.zeros(N_HEADS * D)
            for hd in range(N_HEADS):
                qh = rope(q[hd * D:(hd + 1) * D], pos)
                kv = hd // g
                s = np.array([qh @ kk for kk in keys[li][kv]]) / np.sqrt(D)
                p = np.exp(s - s.max())
                p /= p.sum()
                att[hd * D:(hd + 1) * D] = sum(pi * vv for pi, vv in zip(p, vals[li][kv]))
            x = x + w[b + "attn_output.weight"] @ att
            h = norm(x, w[b + "ffn_norm.weight"])
            gate = w[b + "ffn_gate.weight"] @ h
            x = x + w[b + "ffn_down.weight"] @ (gate / (1 + np.exp(-gate)) * (w[b + "ffn_up.weight"] @ h))
        logits.append(w["output.weight"] @ norm(x, w["output_norm.weight"]))
    return np.array(logits)


IDS = [5, 40, 262, 100, 7, 263, 90, 33, 150, 12, 1, 77]


# ----------------------------------------------------------------------------------------------
# Loader and tokenizer


def test_loader_config_and_unpermute(tiny):
    model, hf, _ = tiny
    cfg = model.config
    assert (cfg.n_layers, cfg.n_heads, cfg.n_kv_heads, cfg.head_size) == (N_LAYERS, N_HEADS, N_KV, HEAD_DIM)
    assert (cfg.hidden, cfg.ffn, cfg.vocab, cfg.context_length) == (HIDDEN, FFN, len(_vocab()), 256)
    assert cfg.rope_theta == THETA and cfg.rms_eps == pytest.approx(EPS)
    assert (cfg.bos_id, cfg.eos_id) == (1, 2)
    lw = model.weights.layers[1]
    np.testing.assert_array_equal(lw.wq, hf["blk.1.attn_q.weight"])
    np.testing.assert_array_equal(lw.wk, hf["blk.1.attn_k.weight"])
    np.testing.assert_array_equal(lw.wv, hf["blk.1.attn_v.weight"])
    assert all(a.dtype == np.float32 for a in (lw.wq, lw.wo, lw.w_down, model.weights.tok_embd))
    assert not model.weights.tied


def test_permutation_is_llamacpps():
    a = np.arange(3 * 8 * 2, dtype=np.float32).reshape(3 * 8, 2)
    p = permute_llamacpp(a, 3)
    # Head 0, HF rows [0..3 | 4..7] become interleaved 0,4,1,5,2,6,3,7.
    np.testing.assert_array_equal(p[:8, 0], a[[0, 4, 1, 5, 2, 6, 3, 7], 0])
    np.testing.assert_array_equal(unpermute_llamacpp(p, 3), a)


def test_tied_output(tmp_path):
    hf = write_tiny_gguf(tmp_path / "t.gguf", tied=True)
    model = load_gguf_llama(tmp_path / "t.gguf")
    assert model.weights.tied and model.weights.output is model.weights.tok_embd
    lg = LlamaRunner(model).prefill(IDS[:5], all_logits=True)
    np.testing.assert_allclose(lg, reference_logits(hf, IDS[:5]), rtol=1e-4, atol=1e-4)


def test_tokenizer_round_trip(tiny):
    tok = tiny[0].tokenizer
    vocab = _vocab()
    assert tok.encode(" the") == [vocab.index("Ġthe")]
    assert tok.encode(" in a") == [vocab.index("Ġ"), vocab.index("in"), vocab.index("Ġa")]
    for text in ["the theory in a hat", "héllo wörld 42 ✓", "  spaces\n\ttabs", "<|im_start|>user"]:
        assert tok.decode(tok.encode(text)) == text
    assert tok.encode("<|im_start|>hi")[0] == 1
    assert tok.encode("hi", add_bos=True)[0] == 1
    assert tok.token_strings(tok.encode(" the hat")) == [" the", " ", "h", "a", "t"]


def test_missing_merges_is_clear(tmp_path):
    write_tiny_gguf(tmp_path / "m.gguf", merges=False)
    with pytest.raises(InvalidInput, match="merges"):
        load_gguf_llama(tmp_path / "m.gguf")
    with pytest.raises(InvalidInput, match="not two tokens"):
        GGUFTokenizer(_vocab(), ["a b c"])


def test_wrong_architecture_and_missing_tensor(tmp_path):
    write_tiny_gguf(tmp_path / "q.gguf", arch="mamba")
    with pytest.raises(InvalidInput, match="architecture 'mamba' is not one kvviz runs") as e:
        load_gguf_llama(tmp_path / "q.gguf")
    assert "qwen2" in e.value.hint and "gemma3" in e.value.hint  # the refusal names what kvviz does run
    write_tiny_gguf(tmp_path / "d.gguf", drop=("blk.1.ffn_up.weight",))
    with pytest.raises(InvalidInput, match="blk.1.ffn_up.weight"):
        load_gguf_llama(tmp_path / "d.gguf")
    (tmp_path / "junk.gguf").write_bytes(b"not a gguf at all")
    with pytest.raises(InvalidInput, match="not a readable GGUF"):
        load_gguf_llama(tmp_path / "junk.gguf")
    # a tensor type gguf's numpy dequantiser does not implement (NotImplementedError there): a clear error naming it
    write_tiny_gguf(tmp_path / "i8.gguf", int8=("blk.0.attn_v.weight",))
    with pytest.raises(InvalidInput, match=r"cannot dequantise blk\.0\.attn_v\.weight \(I8\)"):
        load_gguf_llama(tmp_path / "i8.gguf")
    # a quantised row whose bytes are not whole blocks (ValueError there): the same clear error
    from types import SimpleNamespace

    from gguf import GGMLQuantizationType

    from kvviz.sources.gguf_llama import _dequant

    bad = SimpleNamespace(name="blk.0.attn_q.weight", tensor_type=GGMLQuantizationType.Q8_0,
                          data=np.zeros((2, 17), np.uint8), shape=[17, 2])   # q8_0 blocks are 34 bytes
    with pytest.raises(InvalidInput, match=r"cannot dequantise blk\.0\.attn_q\.weight \(Q8_0\)"):
        _dequant(bad, tmp_path / "bad.gguf")


# ----------------------------------------------------------------------------------------------
# Forward pass


def test_prefill_matches_reference(tiny):
    model, hf, _ = tiny
    runner = LlamaRunner(model)
    lg = runner.prefill(IDS, all_logits=True)
    assert lg.dtype == np.float32 and lg.shape == (len(IDS), model.config.vocab)
    np.testing.assert_allclose(lg, reference_logits(hf, IDS), rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(runner.last_logits, lg[-1])


def test_unpermute_matters(tiny):
    """Rotate-half RoPE on un-permuted weights equals llama.cpp's adjacent-pair RoPE on the raw GGUF rows,
    and skipping the un-permute changes the model."""
    model, hf, _ = tiny
    cap, _ = capture_tokens(model, IDS)
    # Layer 0 queries straight from the raw (permuted) GGUF rows with llama.cpp's adjacent-pair RoPE.
    emb = hf["token_embd.weight"][IDS].astype(np.float64)
    h = emb / np.sqrt(np.mean(emb ** 2, axis=-1, keepdims=True) + EPS) * hf["blk.0.attn_norm.weight"]
    raw = h @ permute_llamacpp(hf["blk.0.attn_q.weight"], N_HEADS).T.astype(np.float64)
    raw = raw.reshape(len(IDS), N_HEADS, HEAD_DIM // 2, 2)
    ang = np.arange(len(IDS))[:, None] * THETA ** (-2.0 * np.arange(HEAD_DIM // 2) / HEAD_DIM)
    c, s = np.cos(ang)[:, None], np.sin(ang)[:, None]
    x0, x1 = raw[..., 0], raw[..., 1]
    pairs = np.stack([x0 * c - x1 * s, x1 * c + x0 * s], axis=-1)  # [T, heads, D/2, 2]
    as_halves = pairs.transpose(0, 1, 3, 2).reshape(len(IDS), N_HEADS, HEAD_DIM)  # interleaved -> halves
    np.testing.assert_allclose(cap.q[0], as_halves.transpose(1, 0, 2), rtol=1e-4, atol=1e-4)

    bad = dict(hf)
    for i in range(N_LAYERS):
        bad[f"blk.{i}.attn_q.weight"] = permute_llamacpp(hf[f"blk.{i}.attn_q.weight"], N_HEADS)
        bad[f"blk.{i}.attn_k.weight"] = permute_llamacpp(hf[f"blk.{i}.attn_k.weight"], N_KV)
    good_lg = LlamaRunner(model).prefill(IDS, all_logits=True)
    assert np.abs(reference_logits(bad, IDS) - good_lg).max() > 1e-2


def test_step_after_prefill_matches_full_prefill(tiny):
    model, _, _ = tiny
    full = LlamaRunner(model)
    full_lg = full.prefill(IDS, all_logits=True)
    inc = LlamaRunner(model)
    inc.prefill(IDS[:5])
    rows = [inc.step(t) for t in IDS[5:]]
    np.testing.assert_allclose(np.array(rows), full_lg[5:], rtol=1e-5, atol=1e-5)
    k_full, v_full = full.kv()
    k_inc, v_inc = inc.kv()
    np.testing.assert_allclose(k_inc, k_full, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(v_inc, v_full, rtol=1e-5, atol=1e-6)
    # A second batched chunk after cached tokens attends to them too.
    two = LlamaRunner(model)
    two.prefill(IDS[:7])
    np.testing.assert_allclose(two.prefill(IDS[7:], all_logits=True), full_lg[7:], rtol=1e-5, atol=1e-5)


def test_custom_attend_identical(tiny):
    model, _, _ = tiny
    cfg = model.config
    cache = {li: ([], []) for li in range(cfg.n_layers)}
    calls = []

    def attend(layer, q, k_new, v_new, pos):
        assert q.shape == (cfg.n_heads, cfg.head_size) and k_new.shape == (cfg.n_kv_heads, cfg.head_size)
        assert q.dtype == np.float32
        ks, vs = cache[layer]
        assert len(ks) == pos
        ks.append(k_new)
        vs.append(v_new)
        calls.append((layer, pos))
        k, v = np.stack(ks, axis=1), np.stack(vs, axis=1)
        return gqa_attention(q[:, None], k, v, q_start=pos)[:, 0]

    default = LlamaRunner(model)
    default.prefill(IDS[:4])
    hooked = LlamaRunner(model)
    tok_lg = hooked.prefill(IDS[:4], attend=attend)  # token by token through the hook
    np.testing.assert_allclose(tok_lg, default.last_logits, rtol=1e-5, atol=1e-5)
    assert calls[:3] == [(0, 0), (1, 0), (0, 1)] and len(calls) == 4 * cfg.n_layers
    # Same state in, same math: decode steps through the hook are bit-identical to the default ones.
    ref = LlamaRunner(model)
    ref.prefill(IDS[:4], attend=ref.default_attend)
    for t in IDS[4:]:
        np.testing.assert_array_equal(hooked.step(t, attend=attend), ref.step(t))

    def wrong(layer, q, k_new, v_new, pos):
        return np.zeros((1, 1), np.float32)

    pos = hooked.pos
    with pytest.raises(InvalidInput, match="attend"):
        hooked.step(3, attend=wrong)
    assert hooked.pos == pos


def test_capture_shapes_sink_progress_cancel(tiny):
    model, _, _ = tiny
    runner = LlamaRunner(model)
    seen, prog = {}, []

    def sink(layer, k, v, start):
        seen[layer] = (k.copy(), v.copy(), start)

    runner.prefill(IDS, kv_sink=sink, progress=lambda d, t: prog.append((d, t)))
    cap = runner.capture()
    T = len(IDS)
    assert cap.q.shape == (N_LAYERS, N_HEADS, T, HEAD_DIM)
    assert cap.k.shape == cap.k_pre_rope.shape == cap.v.shape == (N_LAYERS, N_KV, T, HEAD_DIM)
    assert all(a.dtype == np.float32 for a in (cap.q, cap.k, cap.k_pre_rope, cap.v))
    assert cap.tokens.tolist() == IDS and len(cap.token_strings) == T and cap.config is model.config
    np.testing.assert_array_equal(cap.k[:, :, 0], cap.k_pre_rope[:, :, 0])  # position 0: no rotation
    assert not np.allclose(cap.k[:, :, 3], cap.k_pre_rope[:, :, 3])
    for li in range(N_LAYERS):
        np.testing.assert_array_equal(seen[li][0], cap.k[li])
        np.testing.assert_array_equal(seen[li][1], cap.v[li])
        assert seen[li][2] == 0
    assert prog == [(1, N_LAYERS), (2, N_LAYERS)]

    calls = iter([False, True])
    before = runner.pos
    with pytest.raises(Cancelled):
        runner.prefill([4, 5, 6], cancel=lambda: next(calls))
    assert runner.pos == before and runner.tokens == IDS


def test_generate_greedy(tiny):
    model, _, _ = tiny
    runner = LlamaRunner(model)
    runner.prefill(IDS[:3])
    out = runner.generate(4, stop_at_eos=False)
    seq = IDS[:3] + out
    full = LlamaRunner(model).prefill(seq, all_logits=True)
    assert out == [int(np.argmax(full[i])) for i in range(2, 6)]
    assert runner.pos == len(seq)
    with pytest.raises(InvalidInput, match="needs a prompt"):
        LlamaRunner(model).generate(1)
    with pytest.raises(InvalidInput, match="out of range"):
        runner.step(10_000)


# ----------------------------------------------------------------------------------------------
# KV dump files


def _kv(seed=0, L=2, H=3, T=5, D=8, qh=6):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((L, H, T, D)).astype(np.float32),
            rng.standard_normal((L, H, T, D)).astype(np.float32),
            rng.standard_normal((L, qh, T, D)).astype(np.float32))


@pytest.mark.parametrize("ext,dtype", [("safetensors", "float32"), ("safetensors", "float16"),
                                       ("safetensors", "bfloat16"), ("npz", "float32"), ("npz", "float16")])
def test_kv_round_trip(tmp_path, ext, dtype):
    import ml_dtypes

    k, v, q = _kv()
    path = kv_files.save_kv(tmp_path / f"d.{ext}", k, v, q, tokens=np.arange(5), token_strings=list("abcdé"),
                            dtype=dtype)
    d = kv_files.load_kv(path)
    cast = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    for got, want in ((d.k, k), (d.v, v), (d.q, q)):
        assert got.dtype == np.float32
        np.testing.assert_array_equal(got, want.astype(cast).astype(np.float32))
    assert d.source_dtype == dtype
    assert d.tokens.tolist() == list(range(5)) and d.token_strings == list("abcdé")
    assert (d.n_layers, d.n_kv_heads, d.n_tokens, d.head_size) == (2, 3, 5, 8)


def test_safetensors_plain_reader_writer(tmp_path):
    """The fallback used with older safetensors reads and writes files the library agrees with."""
    import ml_dtypes
    from safetensors.numpy import load_file, save_file

    k = _kv()[0].astype(ml_dtypes.bfloat16)
    save_file({"k": k, "v": k}, str(tmp_path / "a.safetensors"), metadata={"x": "1"})
    arrays, meta = kv_files._read_safetensors_raw(tmp_path / "a.safetensors")
    np.testing.assert_array_equal(arrays["k"].astype(np.float32), k.astype(np.float32))
    assert meta == {"x": "1"}
    kv_files._write_safetensors_raw(tmp_path / "b.safetensors", {"k": k, "t": np.arange(3)}, {"y": "2"})
    back = load_file(str(tmp_path / "b.safetensors"))
    np.testing.assert_array_equal(back["k"].astype(np.float32), k.astype(np.float32))
    np.testing.assert_array_equal(back["t"], np.arange(3))


def test_kv_rejections(tmp_path):
    k, v, q = _kv()
    with pytest.raises(InvalidInput, match="rank 3") as e:
        kv_files.save_kv(tmp_path / "a.npz", k[0], v[0])
    assert "[layers, kv_heads, tokens, head_size]" in e.value.hint
    np.savez(tmp_path / "only_k.npz", k=k)
    with pytest.raises(InvalidInput, match="missing 'v'"):
        kv_files.load_kv(tmp_path / "only_k.npz")
    bad = v.copy()
    bad[1, 2, 3, 4] = np.nan
    np.savez(tmp_path / "nan.npz", k=k, v=bad)
    with pytest.raises(InvalidInput, match="NaN or Inf"):
        kv_files.load_kv(tmp_path / "nan.npz")
    with pytest.raises(InvalidInput, match="differ in shape"):
        kv_files.save_kv(tmp_path / "s.npz", k, v[:, :, :4])
    with pytest.raises(InvalidInput, match="'q'"):
        kv_files.save_kv(tmp_path / "q.npz", k, v, q[:, :4])
    with pytest.raises(InvalidInput, match="unknown extension"):
        kv_files.load_kv(tmp_path / "x.txt")
    with pytest.raises(InvalidInput, match="bfloat16"):
        kv_files.save_kv(tmp_path / "b.npz", k, v, dtype="bfloat16")
    with pytest.raises(InvalidInput, match="float16"):
        kv_files.save_kv(tmp_path / "big.safetensors", k * 1e6, v, dtype="float16")
    np.savez(tmp_path / "obj.npz", k=np.array([{"a": 1}], dtype=object), v=v)
    with pytest.raises(InvalidInput, match="pickled"):
        kv_files.load_kv(tmp_path / "obj.npz")
    np.savez(tmp_path / "int.npz", k=k.astype(np.int32), v=v)
    with pytest.raises(InvalidInput, match="not a floating-point"):
        kv_files.load_kv(tmp_path / "int.npz")
    (tmp_path / "junk.safetensors").write_bytes(b"\x05\x00\x00\x00\x00\x00\x00\x00{oops")
    with pytest.raises(InvalidInput):
        kv_files.load_kv(tmp_path / "junk.safetensors")


def test_pt_files(tmp_path):
    if importlib.util.find_spec("torch") is None:
        (tmp_path / "d.pt").write_bytes(b"\x80\x04N.")
        with pytest.raises(InvalidInput, match="requires PyTorch"):
            kv_files.load_kv(tmp_path / "d.pt")
        return
    import pickle

    import torch

    k, v, _ = _kv()
    torch.save({"k": torch.from_numpy(k).bfloat16(), "v": torch.from_numpy(v)}, tmp_path / "ok.pt")
    d = kv_files.load_kv(tmp_path / "ok.pt")
    np.testing.assert_allclose(d.k, k, rtol=1e-2, atol=1e-2)

    class Evil:
        def __reduce__(self):
            return (exec, ("raise SystemExit('executed')",))

    with open(tmp_path / "evil.pt", "wb") as f:
        pickle.dump({"k": Evil()}, f)
    with pytest.raises(InvalidInput, match="refused"):
        kv_files.load_kv(tmp_path / "evil.pt")


def test_save_capture(tiny, tmp_path):
    model, _, _ = tiny
    cap, _ = capture_tokens(model, IDS)
    d = kv_files.load_kv(kv_files.save_capture(cap, tmp_path / "cap.safetensors"))
    np.testing.assert_array_equal(d.k, cap.k)
    np.testing.assert_array_equal(d.k_pre_rope, cap.k_pre_rope)
    np.testing.assert_array_equal(d.q, cap.q)
    assert d.tokens.tolist() == IDS and d.token_strings == cap.token_strings
    assert json.loads(d.metadata["config"])["n_kv_heads"] == N_KV
    assert set(kv_files.capture_to_kv(cap)) == {"k", "v", "q", "k_pre_rope", "tokens"}
    d2 = kv_files.load_kv(kv_files.save_capture(cap, tmp_path / "cap.npz", dtype="float16"))
    assert d2.source_dtype == "float16" and d2.token_strings == cap.token_strings


# ----------------------------------------------------------------------------------------------
# The real model


def _outlier_ratio(x: np.ndarray) -> float:
    """Mean over layers and heads of max/median over channels of each channel's max |x| over tokens."""
    amax = np.abs(x).max(axis=2)  # [L, H, D]
    return float(np.mean(amax.max(-1) / np.median(amax, -1)))


@pytest.mark.slow
def test_smollm2_real_kv(smollm2):
    cfg = smollm2.config
    assert (cfg.n_layers, cfg.n_heads, cfg.n_kv_heads, cfg.head_size) == (30, 9, 3, 64)
    assert cfg.rope_theta == 1e5 and smollm2.weights.tied

    tok = smollm2.tokenizer
    runner = LlamaRunner(smollm2)
    ids = tok.encode("The capital of France is")
    logits = runner.prefill(ids)
    top5 = [tok.decode([i]) for i in np.argsort(-logits)[:5]]
    assert " Paris" in top5, top5

    text = ("<|im_start|>user\nExplain in a few sentences why the sky looks blue during the day and red at "
            "sunset, and what that has to do with the size of the molecules in the air.<|im_end|>\n"
            "<|im_start|>assistant\n")
    cap, _ = capture_tokens(smollm2, tok.encode(text))
    T = cap.n_tokens
    assert cap.k.shape == (30, 3, T, 64) and cap.q.shape == (30, 9, T, 64)
    k_ratio, v_ratio = _outlier_ratio(cap.k), _outlier_ratio(cap.v)
    assert k_ratio > 3.5 and v_ratio < 3.0 and k_ratio > 1.5 * v_ratio, (k_ratio, v_ratio)

    # Decoding one more token reproduces the batched prefill of the longer sequence.
    nxt = int(np.argmax(runner.last_logits))
    step_lg = runner.step(nxt)
    full = LlamaRunner(smollm2).prefill(ids + [nxt])
    np.testing.assert_allclose(step_lg, full, rtol=1e-3, atol=1e-3)
