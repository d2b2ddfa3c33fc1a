"""Small random-weight GGUFs of each architecture kvviz runs, written the way llama.cpp's converter writes
real ones: the shapes of a real member of the family scaled down, its metadata keys, its tensor names.

A `Recipe` fixes everything (shapes, quirks, vocabulary, seed), so the same recipe writes the same bytes
on any machine: tools/llamacpp_reference.py runs llama.cpp over the files of `RECIPES` and stores the
logits, and the tests write the files again from the recipe and compare kvviz's forward with them.

Weight types: "F32", or a quantised GGML type. Types gguf's numpy code can quantise (Q8_0, Q5_0, Q4_0...)
are quantised from the random float32 weights; for K-quant types (Q4_K, Q5_K, Q6_K...) the blocks
themselves are random (codes, sub-block scales), with the f16 super-block scales set so that the weights
have the recipe's spread: a valid encoding of some weights, which is all a reader of the file needs.
Norm weights, biases and RoPE factors stay F32, as llama.cpp's quantiser keeps them.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

import gguf
import numpy as np
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize

# K-quant types written as random blocks: (block bytes, offset of the f16 scale d, offset of the f16 minimum
# scale dmin or None, offset of the packed 6-bit sub-block scales or None, codes' midpoint)
_K_BLOCKS = {"Q4_K": (144, 0, 2, 4, 7.5), "Q5_K": (176, 0, 2, 4, 15.5), "Q6_K": (210, 208, None, None, 32.0)}

SPM_SPACE = "\u2581"


# ----------------------------------------------------------------------------------------------
# Vocabularies


def byte_chars() -> list[str]:
    """GPT-2's byte -> printable-unicode table, in byte order: the symbols of a byte-level BPE vocabulary."""
    bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    table = dict(zip(bs, cs))
    return [chr(table[b]) for b in range(256)]


BPE_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
BPE_MERGES = ["Ġ t", "h e", "Ġt he", "i n", "Ġ a", "e r", "o n", "Ġ w", "o r", "l d", "Ġw or", "Ġwor ld",
              "l l", "e ll", "h ell", "hell o", "Ġ hello", "i s", "Ġ is", "a n", "Ġa n", "n d", "Ġan d"]


def bpe_vocab() -> dict:
    """A byte-level BPE vocabulary (GGUF tokenizer model "gpt2"): specials, the 256 byte symbols, merges."""
    merged = []
    for m in BPE_MERGES:
        t = m.replace(" ", "")
        if t not in merged:
            merged.append(t)
    tokens = BPE_SPECIALS + byte_chars() + merged
    return {"model": "gpt2", "tokens": tokens, "merges": BPE_MERGES,
            "types": [3] * len(BPE_SPECIALS) + [1] * (len(tokens) - len(BPE_SPECIALS)), "bos": 1, "eos": 2}


_SPM_PIECES = [
    # (piece, score): merged pieces outscore their parts; a few scores tie on purpose (leftmost merge wins)
    (SPM_SPACE + "t", -1.0), ("he", -1.0), (SPM_SPACE + "the", -2.0), ("in", -3.0), ("ing", -4.0),
    (SPM_SPACE + "a", -3.0), ("er", -5.0), ("on", -5.0), (SPM_SPACE + "w", -6.0), ("or", -6.0), ("ld", -7.0),
    (SPM_SPACE + "wor", -8.0), (SPM_SPACE + "world", -9.0), ("ll", -7.0), ("llo", -10.0), (SPM_SPACE + "he", -9.0),
    (SPM_SPACE + "hello", -11.0), ("is", -6.0), (SPM_SPACE + "is", -8.0), ("an", -4.0), (SPM_SPACE + "an", -8.0),
    (SPM_SPACE + "and", -9.0), ("nd", -9.0), ("st", -10.0), (SPM_SPACE + "st", -12.0), ("re", -10.0), ("at", -10.0),
    ("en", -10.0), ("es", -11.0), ("ed", -11.0), (SPM_SPACE + SPM_SPACE, -12.0), ("\u00e9", -20.0), ("\u00f6", -20.0),
    (SPM_SPACE + "\u00e9t\u00e9", -25.0), ("\u00e9t\u00e9", -24.0), ("t\u00e9", -22.0),
]


def spm_vocab(*, gemma: bool = False) -> dict:
    """A SentencePiece vocabulary (GGUF tokenizer model "llama"): unknown/BOS/EOS, the 256 <0xXX> byte tokens,
    single characters and merged pieces with scores, and two control tokens written in chat templates.
    gemma=True lays it out as Gemma's files do (pad, eos, bos, unk first; no leading-space prefix)."""
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)] + [SPM_SPACE] + list("ABCDEFGHIJ.,!?'0123456789")
    if gemma:
        head = [("<pad>", 0.0, 3), ("<eos>", 0.0, 3), ("<bos>", 0.0, 3), ("<unk>", 0.0, 2)]
        bos, eos = 2, 1
    else:
        head = [("<unk>", 0.0, 2), ("<s>", 0.0, 3), ("</s>", 0.0, 3)]
        bos, eos = 1, 2
    if gemma:
        ctrl = [("<start_of_turn>", 0.0, 3), ("<end_of_turn>", 0.0, 3)]
    else:  # Phi-3's chat tokens (llama.cpp looks <|endoftext|> up in Phi-3 vocabularies)
        ctrl = [("<|user|>", 0.0, 4), ("<|end|>", 0.0, 3), ("<|endoftext|>", 0.0, 3)]
    entries = head + [(f"<0x{b:02X}>", 0.0, 6) for b in range(256)] + ctrl
    entries += [(c, -30.0 - i * 0.01, 1) for i, c in enumerate(letters)]
    entries += [(p, s, 1) for p, s in _SPM_PIECES]
    return {"model": "llama", "tokens": [e[0] for e in entries], "scores": [e[1] for e in entries],
            "types": [e[2] for e in entries], "bos": bos, "eos": eos, "add_space_prefix": not gemma}


# ----------------------------------------------------------------------------------------------
# Recipes


@dataclass(frozen=True)
class Recipe:
    """One small model: the shapes of `member` scaled down, its quirks, a vocabulary and a seed."""

    name: str
    arch: str
    member: str  # the real model whose shape this scales down
    n_layers: int
    hidden: int
    n_heads: int
    n_kv_heads: int
    head_size: int
    ffn: int
    vocab: str = "bpe"  # "bpe", "spm" or "spm_gemma"
    qtype: str = "Q8_0"  # the quantised weight type its second file uses
    rope_theta: float = 10000.0
    rms_eps: float = 1e-5
    context_length: int = 256
    tied: bool = False
    fused_qkv: bool = False
    fused_up: bool = False
    qkv_bias: bool = False
    k_bias_outliers: float = 0.0  # a few K channels offset by this much (Qwen2's large key channels)
    qk_norm: bool = False
    post_norms: bool = False
    rope_freqs: bool = False  # Llama 3 frequency factors (rope_freqs.weight)
    long_rope: bool = False  # Phi-3 long-context factors (rope_factors_short/long) and attention factor
    embed_std: float = 1.0
    name_meta: str = ""  # general.name (Phi-3 vocabularies depend on it)
    kv: tuple = ()  # (writer method, value) pairs of architecture metadata
    seed: int = 0
    n_tokens: int = 40  # the token sequence the reference logits are of

    def tokens(self, n_vocab: int, bos: int) -> list[int]:
        """The fixed token sequence: BOS, then ids drawn from the vocabulary by the recipe's seed."""
        rng = np.random.default_rng(self.seed + 1000)
        return [int(bos)] + [int(t) for t in rng.integers(3, n_vocab, self.n_tokens - 1)]


RECIPES: dict[str, Recipe] = {r.name: r for r in (
    Recipe("llama", "llama", "Mistral 7B (GQA 4, SentencePiece)", 2, 256, 8, 2, 32, 512, vocab="spm", qtype="Q4_K",
           rope_theta=1e6, name_meta="tiny mistral"),
    Recipe("llama3", "llama", "Llama 3.2 1B (GQA 4, rope factors, tied)", 2, 256, 8, 2, 32, 512, qtype="Q5_K",
           rope_theta=500000.0, rope_freqs=True, tied=True, embed_std=0.25, name_meta="tiny llama 3"),
    Recipe("qwen2", "qwen2", "Qwen2.5 0.5B (GQA 7, QKV bias, tied)", 2, 448, 7, 1, 64, 1216, qtype="Q8_0",
           rope_theta=1e6, rms_eps=1e-6, tied=True, qkv_bias=True, k_bias_outliers=12.0, embed_std=0.2, name_meta="tiny qwen2.5"),
    Recipe("qwen3", "qwen3", "Qwen3 0.6B (head 128 > hidden/heads, Q/K norms)", 2, 256, 4, 2, 128, 768,
           qtype="Q6_K", rope_theta=1e6, rms_eps=1e-6, tied=True, qk_norm=True, embed_std=0.25, name_meta="tiny qwen3"),
    Recipe("gemma2", "gemma2", "Gemma 2 2B (head 256, soft-capping, alternating windows)", 4, 256, 2, 1, 256, 512,
           vocab="spm_gemma", qtype="Q8_0", rms_eps=1e-6, tied=True, post_norms=True, embed_std=1 / 8,
           name_meta="tiny gemma 2",
           kv=(("add_key_length", 256), ("add_value_length", 256), ("add_sliding_window", 8),
               ("add_attn_logit_softcapping", 5.0), ("add_final_logit_softcapping", 4.0))),
    Recipe("gemma3", "gemma3", "Gemma 3 4B (head 256, 5 windowed : 1 global, local RoPE 10000)", 6, 256, 4, 1, 256,
           512, vocab="spm_gemma", qtype="Q4_K", rope_theta=1e6, rms_eps=1e-6, qk_norm=True, post_norms=True,
           embed_std=1 / 8, name_meta="tiny gemma 3",
           kv=(("add_key_length", 256), ("add_value_length", 256), ("add_sliding_window", 12),
               ("add_rope_scaling_type", "linear"), ("add_rope_scaling_factor", 8.0))),
    Recipe("phi3", "phi3", "Phi-3 mini 128k (fused QKV and gate/up, long-context RoPE)", 2, 256, 4, 4, 64, 512,
           vocab="spm", qtype="Q6_K", fused_qkv=True, fused_up=True, long_rope=True, context_length=4096,
           name_meta="tiny phi3",
           kv=(("add_sliding_window", 2047), ("add_rope_scaling_orig_ctx_len", 256),
               ("add_rope_scaling_attn_factors", 1.19))),
)}


def vocab_of(recipe: Recipe) -> dict:
    return bpe_vocab() if recipe.vocab == "bpe" else spm_vocab(gemma=recipe.vocab == "spm_gemma")


# ----------------------------------------------------------------------------------------------
# Weights


def _packed_scales(sc: np.ndarray) -> np.ndarray:
    """The 12 bytes of Q4_K/Q5_K sub-block scales and minima with minimum = scale for each of the 8
    sub-blocks (ggml's get_scale_min_k4 layout): with dmin = d * midpoint every sub-block is centred on 0."""
    lo, hi = sc[..., :4], sc[..., 4:]
    a = lo | ((hi >> 4) << 6)
    b = (hi & 0xF) | ((hi & 0xF) << 4)
    return np.concatenate([a, a, b], axis=-1).astype(np.uint8)


def _quantised(rng: np.random.Generator, a: np.ndarray, qtype: str, std: float):
    """(bytes [rows, row bytes] uint8, GGML type) of the float32 matrix `a` in `qtype`."""
    qt = GGMLQuantizationType[qtype]
    if qtype not in _K_BLOCKS:
        return quantize(a, qt), qt
    size, d_off, dmin_off, sc_off, mid = _K_BLOCKS[qtype]
    rows, cols = a.shape
    if cols % 256:
        raise ValueError(f"{qtype} needs rows of a multiple of 256 values, not {cols}")
    raw = rng.integers(0, 256, (rows, cols // 256, size), dtype=np.uint8)
    if sc_off is not None:
        raw[:, :, sc_off:sc_off + 12] = _packed_scales(rng.integers(8, 64, (rows, cols // 256, 8), dtype=np.uint8))

    def set_scales(d: float) -> None:
        raw[:, :, d_off:d_off + 2] = np.frombuffer(np.float16(d).tobytes(), np.uint8)
        if dmin_off is not None:
            raw[:, :, dmin_off:dmin_off + 2] = np.frombuffer(np.float16(d * mid).tobytes(), np.uint8)

    set_scales(1e-3)
    got = float(dequantize(raw.reshape(rows, -1), qt).std())
    set_scales(1e-3 * std / got)
    return raw.reshape(rows, -1), qt


def _matrices(recipe: Recipe, v: int) -> dict[str, tuple[tuple[int, ...], float]]:
    """name -> (shape [out, in], standard deviation) of every matrix."""
    H, D, F = recipe.hidden, recipe.head_size, recipe.ffn
    nq, nkv = recipe.n_heads * D, recipe.n_kv_heads * D
    m = {"token_embd.weight": ((v, H), recipe.embed_std)}
    if not recipe.tied:
        m["output.weight"] = ((v, H), 0.25)
    for i in range(recipe.n_layers):
        b = f"blk.{i}."
        if recipe.fused_qkv:
            m[b + "attn_qkv.weight"] = ((nq + 2 * nkv, H), 0.3)
        else:
            m[b + "attn_q.weight"] = ((nq, H), 0.3)
            m[b + "attn_k.weight"] = ((nkv, H), 0.3)
            m[b + "attn_v.weight"] = ((nkv, H), 0.2)
        m[b + "attn_output.weight"] = ((H, nq), 0.15)
        if recipe.fused_up:
            m[b + "ffn_up.weight"] = ((2 * F, H), 0.15)
        else:
            m[b + "ffn_gate.weight"] = ((F, H), 0.15)
            m[b + "ffn_up.weight"] = ((F, H), 0.15)
        m[b + "ffn_down.weight"] = ((H, F), 0.1)
    return m


def _vectors(recipe: Recipe, rng: np.random.Generator) -> dict[str, np.ndarray]:
    H, D = recipe.hidden, recipe.head_size
    nq, nkv = recipe.n_heads * D, recipe.n_kv_heads * D

    def norm(n):
        return (1.0 + 0.1 * rng.standard_normal(n, dtype=np.float32)).astype(np.float32)

    out = {"output_norm.weight": norm(H)}
    for i in range(recipe.n_layers):
        b = f"blk.{i}."
        out[b + "attn_norm.weight"] = norm(H)
        out[b + "ffn_norm.weight"] = norm(H)
        if recipe.qkv_bias:
            out[b + "attn_q.bias"] = (0.5 * rng.standard_normal(nq, dtype=np.float32)).astype(np.float32)
            kb = (0.5 * rng.standard_normal(nkv, dtype=np.float32)).astype(np.float32)
            if recipe.k_bias_outliers:
                kb[[3, D // 2 + 3]] += np.float32(recipe.k_bias_outliers)
            out[b + "attn_k.bias"] = kb
            out[b + "attn_v.bias"] = (0.2 * rng.standard_normal(nkv, dtype=np.float32)).astype(np.float32)
        if recipe.qk_norm:
            out[b + "attn_q_norm.weight"] = norm(D)
            out[b + "attn_k_norm.weight"] = norm(D)
        if recipe.post_norms:
            out[b + "post_attention_norm.weight"] = norm(H)
            out[b + "post_ffw_norm.weight"] = norm(H)
    half = D // 2
    if recipe.rope_freqs:
        out["rope_freqs.weight"] = np.linspace(1.0, 8.0, half, dtype=np.float32)
    if recipe.long_rope:
        out["rope_factors_short.weight"] = np.linspace(1.0, 2.0, half, dtype=np.float32)
        out["rope_factors_long.weight"] = np.linspace(1.0, 16.0, half, dtype=np.float32)
    return out


def write_random_gguf(recipe: Recipe, path, wtype: str = "F32") -> dict:
    """Write the recipe's model with its matrices in `wtype` ("F32" or a GGML quantised type); returns
    {"tokens": the token sequence, "sha256": of the tensor data}. The same recipe and type write the same
    bytes."""
    voc = vocab_of(recipe)
    n_vocab = len(voc["tokens"])
    rng = np.random.default_rng(recipe.seed)
    wr = gguf.GGUFWriter(str(path), recipe.arch)
    wr.add_name(recipe.name_meta or recipe.name)
    wr.add_block_count(recipe.n_layers)
    wr.add_context_length(recipe.context_length)
    wr.add_embedding_length(recipe.hidden)
    wr.add_feed_forward_length(recipe.ffn)
    wr.add_head_count(recipe.n_heads)
    wr.add_head_count_kv(recipe.n_kv_heads)
    if recipe.head_size * recipe.n_heads != recipe.hidden and not any(k == "add_key_length" for k, _ in recipe.kv):
        wr.add_key_length(recipe.head_size)
        wr.add_value_length(recipe.head_size)
    wr.add_rope_freq_base(recipe.rope_theta)
    wr.add_layer_norm_rms_eps(recipe.rms_eps)
    wr.add_rope_dimension_count(recipe.head_size)
    for method, value in recipe.kv:
        if method == "add_rope_scaling_type":
            value = gguf.RopeScalingType(value)
        getattr(wr, method)(value)
    wr.add_tokenizer_model(voc["model"])
    wr.add_tokenizer_pre("default")
    wr.add_token_list(voc["tokens"])
    wr.add_token_types(voc["types"])
    if "scores" in voc:
        wr.add_token_scores(voc["scores"])
        wr.add_add_space_prefix(voc["add_space_prefix"])
        wr.add_add_bos_token(True)
    else:
        wr.add_token_merges(voc["merges"])
        wr.add_add_bos_token(False)
    wr.add_bos_token_id(voc["bos"])
    wr.add_eos_token_id(voc["eos"])
    digest = hashlib.sha256()
    tensors = {}
    for name, (shape, std) in _matrices(recipe, n_vocab).items():
        a = (std * rng.standard_normal(shape, dtype=np.float32)).astype(np.float32)
        if wtype == "F32":
            tensors[name] = (a, None)
        else:
            tensors[name] = _quantised(rng, a, wtype, std)
    for name, a in _vectors(recipe, rng).items():
        tensors[name] = (a, None)
    for name in sorted(tensors):
        data, qt = tensors[name]
        digest.update(name.encode() + np.ascontiguousarray(data).tobytes())
        wr.add_tensor(name, data, raw_dtype=qt)
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()
    return {"tokens": recipe.tokens(n_vocab, voc["bos"]), "sha256": digest.hexdigest()}


__all__ = ["RECIPES", "Recipe", "bpe_vocab", "spm_vocab", "write_random_gguf"]
