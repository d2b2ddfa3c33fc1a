"""A tiny random llama GGUF written the way llama.cpp's converter writes one (Q/K rows permuted for
interleaved RoPE), shared by the live-model and live-decode tests."""
from __future__ import annotations

import numpy as np

from kvviz.sources.gguf_llama import permute_llamacpp
from kvviz.sources.random_gguf import byte_chars

N_LAYERS, N_HEADS, N_KV, FFN = 2, 4, 2, 96
THETA, EPS = 1000.0, 1e-5
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["Ġ t", "h e", "Ġt he", "i n", "Ġ a"]


def vocab() -> list[str]:
    return SPECIALS + byte_chars() + [m.replace(" ", "") for m in MERGES]


def hf_weights(seed: int, n_vocab: int, head_size: int) -> dict[str, np.ndarray]:
    """Random weights in the Hugging Face (rotate-half) layout, the ground truth of the tests."""
    rng = np.random.default_rng(seed)
    hidden = N_HEADS * head_size

    def m(*shape, s=0.15):
        return (rng.standard_normal(shape) * s).astype(np.float32)

    w = {"token_embd.weight": m(n_vocab, hidden, s=1.0), "output_norm.weight": 1 + m(hidden, s=0.1),
         "output.weight": m(n_vocab, hidden, s=0.2)}
    for i in range(N_LAYERS):
        b = f"blk.{i}."
        w[b + "attn_norm.weight"] = 1 + m(hidden, s=0.1)
        w[b + "attn_q.weight"] = m(N_HEADS * head_size, hidden, s=0.3)
        w[b + "attn_k.weight"] = m(N_KV * head_size, hidden, s=0.3)
        w[b + "attn_v.weight"] = m(N_KV * head_size, hidden)
        w[b + "attn_output.weight"] = m(hidden, N_HEADS * head_size)
        w[b + "ffn_norm.weight"] = 1 + m(hidden, s=0.1)
        w[b + "ffn_gate.weight"] = m(FFN, hidden)
        w[b + "ffn_up.weight"] = m(FFN, hidden)
        w[b + "ffn_down.weight"] = m(hidden, FFN)
    return w


def write_tiny_gguf(path, *, head_size=16, tied=False, arch="llama", drop=(), merges=True, seed=0, context_length=256,
                    int8=(), head_count=N_HEADS, head_count_kv=N_KV, embedding_length=None, nan=(), f16=False):
    """Write the model; returns its weights in the rotate-half layout. Tensors named in `int8` are stored as
    GGML I8 (a type gguf's numpy dequantiser does not take), those named in `nan` with a NaN in them; with f16
    every matrix is stored as F16 (norms stay F32, as llama.cpp's converter writes them).
    head_count, head_count_kv and embedding_length set the metadata only (the tensors keep their shapes), for
    files whose metadata is wrong."""
    import gguf

    voc = vocab()
    hf = hf_weights(seed, len(voc), head_size)
    if f16:
        hf = {n: a.astype(np.float16).astype(np.float32) if a.ndim == 2 else a for n, a in hf.items()}
    wr = gguf.GGUFWriter(str(path), arch)
    wr.add_block_count(N_LAYERS)
    wr.add_context_length(context_length)
    wr.add_embedding_length(N_HEADS * head_size if embedding_length is None else embedding_length)
    wr.add_feed_forward_length(FFN)
    wr.add_head_count(head_count)
    wr.add_head_count_kv(head_count_kv)
    wr.add_rope_freq_base(THETA)
    wr.add_layer_norm_rms_eps(EPS)
    wr.add_tokenizer_model("gpt2")
    wr.add_tokenizer_pre("default")
    wr.add_token_list(voc)
    wr.add_token_types([3] * len(SPECIALS) + [1] * (len(voc) - len(SPECIALS)))
    if merges:
        wr.add_token_merges(MERGES)
    wr.add_bos_token_id(1)
    wr.add_eos_token_id(2)
    for name, a in hf.items():
        if name in drop or (tied and name == "output.weight"):
            continue
        if name.endswith("attn_q.weight"):
            a = permute_llamacpp(a, N_HEADS)
        elif name.endswith("attn_k.weight"):
            a = permute_llamacpp(a, N_KV)
        if name in nan:
            a = a.copy()
            a.flat[a.size // 2] = np.nan
        if f16 and a.ndim == 2:
            a = a.astype(np.float16)
        wr.add_tensor(name, a.astype(np.int8) if name in int8 else a)
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()
    if tied:
        hf["output.weight"] = hf["token_embd.weight"]
    return hf
