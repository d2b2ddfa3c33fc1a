"""The decoder architectures kvviz runs, each described by what differs: its GGUF metadata, its tensors
and its quirks, all read into one `ModelConfig` that the one numpy forward (kvviz.sources.llama_numpy)
follows.

Facts are llama.cpp's (src/models/<arch>.cpp, llama-arch.cpp, llama-hparams.cpp, and the converter
convert_hf_to_gguf.py), so a GGUF means here what it means to llama.cpp:

  llama   Llama 1-3, Mistral 7B, SmolLM2. The converter permutes the rows of Q and K so that RoPE rotates
          adjacent pairs; the loader undoes it (every weight here is in the rotate-half layout). Llama 3
          frequency factors (rope_freqs.weight) and linear position scaling.
  qwen2   Qwen2 / Qwen2.5: biases on Q, K and V.
  qwen3   Qwen3: an RMS norm over each head of Q and of K before RoPE (attn_q_norm / attn_k_norm).
  gemma2  Gemma 2: embeddings times sqrt(hidden); GeGLU (tanh GELU); RMS norms before and after attention
          and the MLP; attention logits soft-capped (cap * tanh(s / cap), default 50) and final logits too
          (default 30); sliding-window layers (window 4096 unless the file says) alternating with global
          ones, layer 0 windowed; output tied to the embeddings.
  gemma3  Gemma 3: as Gemma 2 without attention soft-capping, plus Qwen3's per-head Q/K norms; five
          windowed layers for each global one, windowed layers with RoPE base 10000 (or the file's
          rope.freq_base_swa) and no position scaling, global ones with the file's base and scaling.
  phi3    Phi-3 / Phi-3.5: Q, K and V in one matrix (attn_qkv) and the gate and up projections in one
          (ffn_up, gate rows first).
Gemma norms: Gemma's RMSNorm multiplies by (1 + w); the converter stores w + 1, so the file's weight is
used as it is, like every other architecture's.
Gemma's query scale: the files carry no query_pre_attn_scalar; llama.cpp scales queries by
1/sqrt(hidden / heads) for the 27B models (recognised by their layer count: Gemma 2 46, Gemma 3 62) and
by 1/sqrt(head size) otherwise. kvviz does the same.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from kvviz.errors import InvalidInput
from kvviz.sources.gguf_meta import Meta


@dataclass(frozen=True)
class ModelConfig:
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_size: int
    hidden: int
    ffn: int
    vocab: int
    rope_theta: float
    rms_eps: float
    context_length: int
    rope_dim: int
    rope_scaling: str = "none"  # "none" or "linear"
    rope_scale: float = 1.0  # position divisor for linear scaling
    bos_id: int | None = None
    eos_id: int | None = None
    add_bos: bool = False
    name: str = ""
    arch: str = "llama"
    layer_windows: tuple[int, ...] = ()  # per layer: 0 = global attention, W = the last W positions
    rope_theta_swa: float = 0.0  # RoPE base of the windowed layers (0: rope_theta)
    rope_scale_swa: float = 1.0  # position divisor of the windowed layers
    attn_scale: float = 0.0  # the query scale (0: 1/sqrt(head_size))
    attn_softcap: float = 0.0  # attention logits -> cap * tanh(logit / cap) (0: none)
    final_softcap: float = 0.0  # output logits likewise
    embed_scale: float = 1.0  # token embeddings are multiplied by it
    rope_attn_factor: float = 1.0  # RoPE's cos and sin are multiplied by it (Phi-3 long-context models)
    ffn_act: str = "silu"  # "silu" (SwiGLU) or "gelu_tanh" (GeGLU)
    rope_style: str = "norm"  # how the FILE rotates: "norm" (adjacent pairs, permuted rows) or "neox" (halves)
    tokenizer_model: str = "gpt2"  # GGUF tokenizer.ggml.model: "gpt2" (byte-level BPE) or "llama" (SentencePiece)
    weight_types: tuple[tuple[str, int], ...] = ()  # (GGML type, tensors of that type), most common first
    notes: tuple[str, ...] = ()  # how kvviz reads something a user might expect otherwise, one line each

    @property
    def group(self) -> int:
        """Query heads per KV head (GQA)."""
        return self.n_heads // self.n_kv_heads

    def window(self, layer: int) -> int:
        """The sliding window of `layer` in positions (0: the layer attends to every earlier position)."""
        return int(self.layer_windows[layer]) if self.layer_windows else 0

    @property
    def sliding_layers(self) -> tuple[int, ...]:
        return tuple(i for i, w in enumerate(self.layer_windows) if w)

    @property
    def query_scale(self) -> float:
        """What q.k is multiplied by before the softmax (and before soft-capping)."""
        return float(self.attn_scale) if self.attn_scale else 1.0 / math.sqrt(self.head_size)

    def layer_rope(self, layer: int) -> tuple[float, float]:
        """(RoPE base, position divisor) of `layer`."""
        if self.window(layer) and self.rope_theta_swa:
            return float(self.rope_theta_swa), float(self.rope_scale_swa)
        return float(self.rope_theta), float(self.rope_scale)

    @property
    def quantised_weights(self) -> bool:
        return any(t not in ("F32", "F16", "BF16") for t, _ in self.weight_types)


# LlamaConfig is the name the rest of kvviz has used for the config of every model it loads.
LlamaConfig = ModelConfig


@dataclass(frozen=True)
class Arch:
    """One architecture: how its GGUF reads into a ModelConfig and which tensors each layer must have."""

    name: str  # general.architecture
    members: str  # the models users know by it
    rope_style: str  # "norm": the converter permuted Q/K rows for adjacent-pair RoPE; "neox": halves
    ffn_act: str = "silu"
    fused_gate_up: bool = False  # ffn_up holds [gate; up]
    qk_norm: bool = False  # attn_q_norm / attn_k_norm required
    post_norms: bool = False  # post_attention_norm / post_ffw_norm required
    tied_always: bool = False  # the embeddings are the output matrix even if the file has output.weight
    quirks: Callable[[Meta, dict], dict] | None = None  # extra ModelConfig fields from the metadata

    def layer_tensors(self) -> list[str]:
        """Required per-layer tensors besides Q/K/V (attn_qkv or attn_q + attn_k + attn_v)."""
        names = ["attn_norm", "attn_output", "ffn_norm", "ffn_up", "ffn_down"]
        if not self.fused_gate_up:
            names.append("ffn_gate")
        if self.qk_norm:
            names += ["attn_q_norm", "attn_k_norm"]
        if self.post_norms:
            names += ["post_attention_norm", "post_ffw_norm"]
        return names


def _swa_layers(meta: Meta, n_layers: int, period: int) -> list[bool]:
    """llama.cpp's sliding-window pattern: the file's per-layer list, else a period P (the file's or the
    architecture's) where layer i is windowed unless i % P == P - 1 (P = 0: every layer)."""
    pat = meta.a_get("attention.sliding_window_pattern")
    if isinstance(pat, list):
        if len(pat) < n_layers:
            raise InvalidInput(f"{meta.path.name}: '{meta.key('attention.sliding_window_pattern')}' has {len(pat)} "
                               f"entries for {n_layers} layers", "The file's metadata is inconsistent.")
        return [bool(x) for x in pat[:n_layers]]
    if pat is not None:
        period = int(pat)
    return [period == 0 or i % period < period - 1 for i in range(n_layers)]


def _gemma_scale(meta: Meta, cfg: dict, big_layers: int) -> float:
    if cfg["n_layers"] == big_layers:
        return 1.0 / math.sqrt(cfg["hidden"] / cfg["n_heads"])
    return 1.0 / math.sqrt(cfg["head_size"])


def _gemma2(meta: Meta, cfg: dict) -> dict:
    n = cfg["n_layers"]
    window = int(meta.a_get("attention.sliding_window", 4096))
    swa = _swa_layers(meta, n, 2)
    return dict(
        embed_scale=math.sqrt(cfg["hidden"]),
        layer_windows=tuple(window if s else 0 for s in swa),
        rope_theta_swa=float(meta.a_get("rope.freq_base_swa", cfg["rope_theta"])),
        rope_scale_swa=cfg["rope_scale"],
        attn_softcap=float(meta.a_get("attn_logit_softcapping", 50.0)),
        final_softcap=float(meta.a_get("final_logit_softcapping", 30.0)),
        attn_scale=_gemma_scale(meta, cfg, 46),
    )


def _gemma3(meta: Meta, cfg: dict) -> dict:
    n = cfg["n_layers"]
    window = int(meta.a_get("attention.sliding_window", 0))
    out = dict(embed_scale=math.sqrt(cfg["hidden"]), final_softcap=float(meta.a_get("final_logit_softcapping", 0.0)),
               attn_scale=_gemma_scale(meta, cfg, 62))
    if window > 0:
        swa = _swa_layers(meta, n, 6)
        out.update(layer_windows=tuple(window if s else 0 for s in swa),
                   rope_theta_swa=float(meta.a_get("rope.freq_base_swa", 10000.0)), rope_scale_swa=1.0)
    return out


def _phi3(meta: Meta, cfg: dict) -> dict:
    out: dict = {"rope_attn_factor": float(meta.a_get("rope.scaling.attn_factor", 1.0))}
    notes = []
    if int(meta.a_get("attention.sliding_window", 0) or 0) > 0:
        notes.append(f"the file's sliding window ({meta.a_get('attention.sliding_window')}) is not applied, as "
                     "llama.cpp does not apply it to Phi-3")
    orig = meta.a_get("rope.scaling.original_context_length")
    if orig is not None and cfg.get("_long_rope"):
        out["context_length"] = min(cfg["context_length"], int(orig))
        notes.append(f"long-context RoPE: the short factors apply, so the context is limited to the original "
                     f"{int(orig)} positions (llama.cpp likewise picks the short factors up to them)")
    out["notes"] = tuple(notes)
    return out


ARCHS: dict[str, Arch] = {a.name: a for a in (
    Arch("llama", "Llama 1-3, Mistral 7B, SmolLM2", "norm"),
    Arch("qwen2", "Qwen2, Qwen2.5", "neox"),
    Arch("qwen3", "Qwen3", "neox", qk_norm=True),
    Arch("gemma2", "Gemma 2", "neox", ffn_act="gelu_tanh", post_norms=True, tied_always=True, quirks=_gemma2),
    Arch("gemma3", "Gemma 3", "neox", ffn_act="gelu_tanh", qk_norm=True, post_norms=True, quirks=_gemma3),
    Arch("phi3", "Phi-3, Phi-3.5", "neox", fused_gate_up=True, quirks=_phi3),
)}


def supported_line() -> str:
    return ", ".join(f"{a.name} ({a.members})" for a in ARCHS.values())


def arch_of(meta: Meta) -> Arch:
    arch = ARCHS.get(meta.arch)
    if arch is None:
        raise InvalidInput(
            f"{meta.path.name}: architecture {meta.arch!r} is not one kvviz runs",
            f"kvviz runs the dense decoders {supported_line()}.",
        )
    return arch


def config_from_reader(reader, path: Path | str = "model.gguf") -> ModelConfig:
    """The ModelConfig of a GGUF, or InvalidInput naming what makes the file one kvviz cannot run."""
    meta = Meta(reader, Path(path))
    arch = arch_of(meta)
    hidden = meta.positive("embedding_length", int(meta.a_require("embedding_length")))
    heads_key, kv_key = meta.key("attention.head_count"), meta.key("attention.head_count_kv")
    n_heads = meta.positive("attention.head_count", meta.uniform("attention.head_count",
                                                                 meta.a_require("attention.head_count")))
    n_kv = meta.positive("attention.head_count_kv", meta.uniform("attention.head_count_kv",
                                                                 meta.a_get("attention.head_count_kv", n_heads)))
    if n_heads % n_kv:
        raise InvalidInput(
            f"{meta.path.name}: GGUF metadata '{heads_key}' = {n_heads} is not a multiple of '{kv_key}' = {n_kv}",
            "Each KV head serves a whole group of query heads; the file's metadata is inconsistent.",
        )
    if meta.a_has("attention.key_length"):
        head_size = meta.positive("attention.key_length", int(meta.a_get("attention.key_length")))
    elif hidden % n_heads:
        raise InvalidInput(
            f"{meta.path.name}: GGUF metadata '{meta.key('embedding_length')}' = {hidden} is not a multiple of "
            f"'{heads_key}' = {n_heads}, and there is no '{meta.key('attention.key_length')}' to give the head size",
            "The file's metadata is inconsistent; re-convert the model with convert_hf_to_gguf.py.",
        )
    else:
        head_size = hidden // n_heads
    v_dim = int(meta.a_get("attention.value_length", head_size))
    if v_dim != head_size:
        raise InvalidInput(
            f"{meta.path.name}: unsupported attention layout (heads {n_heads}, kv heads {n_kv}, "
            f"key length {head_size}, value length {v_dim})",
            "The runner needs equal K and V head sizes.",
        )
    for k in ("attention.key_length_swa", "attention.value_length_swa", "rope.dimension_count_swa"):
        if meta.a_has(k) and int(meta.a_get(k)) != head_size:
            raise InvalidInput(f"{meta.path.name}: '{meta.key(k)}' = {meta.a_get(k)} differs from the head size "
                               f"{head_size}", "Models whose windowed layers have another head size are not supported.")
    rope_dim = int(meta.a_get("rope.dimension_count", head_size))
    if rope_dim != head_size or head_size % 2:
        raise InvalidInput(
            f"{meta.path.name}: partial or odd RoPE (rope dims {rope_dim}, head size {head_size})",
            "The runner rotates the whole head; partial rotary models are not supported.",
        )
    # llama.cpp: the scaling type defaults to linear, its factor to none; type "none" means no scaling.
    scaling = str(meta.a_get("rope.scaling.type", "linear") or "linear")
    factor = float(meta.a_get("rope.scaling.factor", meta.a_get("rope.scale_linear", 0.0)) or 0.0)
    if scaling not in ("none", "linear"):
        raise InvalidInput(
            f"{meta.path.name}: RoPE scaling {scaling!r} is not supported",
            "Only unscaled and linearly scaled RoPE (and Llama 3 / Phi-3 frequency factors) are implemented.",
        )
    scale = factor if scaling == "linear" and factor not in (0.0, 1.0) else 1.0
    if meta.has("tokenizer.ggml.tokens"):
        n_tokens = len(meta.get("tokenizer.ggml.tokens") or [])
    else:
        n_tokens = 0
    vocab = int(meta.a_get("vocab_size", n_tokens))
    bos = meta.get("tokenizer.ggml.bos_token_id")
    eos = meta.get("tokenizer.ggml.eos_token_id")
    tok_model = str(meta.get("tokenizer.ggml.model", ""))
    # SentencePiece vocabularies add BOS unless the file says otherwise (llama.cpp's default)
    add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", tok_model == "llama"))
    if tok_model == "llama":
        bos = 1 if bos is None else bos
        eos = 2 if eos is None else eos
    cfg = dict(
        n_layers=meta.positive("block_count", int(meta.a_require("block_count"))),
        n_heads=n_heads, n_kv_heads=n_kv, head_size=head_size, hidden=hidden,
        ffn=meta.uniform("feed_forward_length", meta.a_require("feed_forward_length")),
        vocab=vocab,
        rope_theta=float(meta.a_get("rope.freq_base", 10000.0)),
        rms_eps=float(meta.a_get("attention.layer_norm_rms_epsilon", 1e-5)),
        context_length=int(meta.a_get("context_length", 2048)),
        rope_dim=rope_dim,
        rope_scaling="linear" if scale != 1.0 else "none",
        rope_scale=scale,
        bos_id=None if bos is None else int(bos),
        eos_id=None if eos is None else int(eos),
        add_bos=add_bos,
        name=str(meta.get("general.name", meta.path.stem)),
        arch=arch.name, ffn_act=arch.ffn_act, rope_style=arch.rope_style, tokenizer_model=tok_model,
    )
    names = {t.name for t in reader.tensors}
    cfg["_long_rope"] = "rope_factors_long.weight" in names
    types: dict[str, int] = {}
    for t in reader.tensors:
        types[t.tensor_type.name] = types.get(t.tensor_type.name, 0) + 1
    cfg["weight_types"] = tuple(sorted(types.items(), key=lambda kv: (-kv[1], kv[0])))
    if arch.quirks is not None:
        cfg.update(arch.quirks(meta, cfg))
    cfg.pop("_long_rope")
    windows = cfg.get("layer_windows", ())
    if windows and len(windows) != cfg["n_layers"]:
        raise InvalidInput(f"{meta.path.name}: {len(windows)} sliding-window entries for {cfg['n_layers']} layers",
                           "The file's metadata is inconsistent.")
    return ModelConfig(**cfg)


# ----------------------------------------------------------------------------------------------
# What `kvviz info` and the window's model picker say about a model


def forward_path(cfg: ModelConfig) -> str:
    """Where the model's forward runs: the rule of `--forward auto` (kvviz.forward.select.choose decides it for
    an adapter; the sources cannot ask the adapter, they sit below the forward)."""
    return "the GPU forward on a hardware adapter it fits, else numpy (CPU); --forward gpu|numpy chooses"


def _fmt_num(x: float) -> str:
    return f"{x:g}" if abs(x) < 1e5 else f"{x:.0e}".replace("e+0", "e").replace("e+", "e")


def rope_line(cfg: ModelConfig) -> str:
    parts = [f"base {_fmt_num(cfg.rope_theta)}"]
    if cfg.rope_scale != 1.0:
        parts.append(f"linear scaling x{cfg.rope_scale:g}")
    if cfg.layer_windows and cfg.rope_theta_swa and (cfg.rope_theta_swa, cfg.rope_scale_swa) != (
            cfg.rope_theta, cfg.rope_scale):
        parts.append(f"windowed layers base {_fmt_num(cfg.rope_theta_swa)}"
                     + (f" x{cfg.rope_scale_swa:g}" if cfg.rope_scale_swa != 1.0 else ""))
    if cfg.rope_attn_factor != 1.0:
        parts.append(f"cos/sin x{cfg.rope_attn_factor:.4g}")
    return ", ".join(parts)


def window_line(cfg: ModelConfig) -> str:
    slid = cfg.sliding_layers
    if not slid:
        return "none (every layer attends to all earlier positions)"
    sizes = sorted({cfg.window(i) for i in slid})
    return (f"{'/'.join(str(s) for s in sizes)} positions on {len(slid)} of {cfg.n_layers} layers "
            f"(global: {', '.join(str(i) for i in range(cfg.n_layers) if not cfg.window(i))})")


def weights_line(cfg: ModelConfig) -> str:
    return ", ".join(f"{t} x{n}" for t, n in cfg.weight_types) or "unknown"


QUANTISED_NOTE = ("on quantised weights llama.cpp also quantises the activations (to Q8 blocks) before each "
                  "matrix product; kvviz computes the file's weights exactly in float32, so its logits differ "
                  "slightly from llama.cpp's on the same file")


QUANTISED_SHORT = "llama.cpp quantises activations on quantised weights, kvviz computes the file exactly"


def describe_config(cfg: ModelConfig) -> list[tuple[str, str]]:
    """(label, value) rows: architecture, sizes, head size, GQA, window, RoPE, weights, forward path."""
    rows = [
        ("architecture", f"{cfg.arch} ({ARCHS[cfg.arch].members})" if cfg.arch in ARCHS else cfg.arch),
        ("sizes", f"{cfg.n_layers} layers, hidden {cfg.hidden}, MLP {cfg.ffn}, vocabulary {cfg.vocab}, "
                  f"context {cfg.context_length}"),
        ("attention", f"{cfg.n_heads} query heads, {cfg.n_kv_heads} KV heads (GQA {cfg.group}), head size "
                      f"{cfg.head_size}, query scale {cfg.query_scale:.4g}"
                      + (f", logits soft-capped at {cfg.attn_softcap:g}" if cfg.attn_softcap else "")),
        ("sliding window", window_line(cfg)),
        ("rope", rope_line(cfg)),
        ("weights", weights_line(cfg)),
        ("tokenizer", {"gpt2": "byte-level BPE", "llama": "SentencePiece"}.get(cfg.tokenizer_model,
                                                                             cfg.tokenizer_model or "none")),
        ("forward", forward_path(cfg)),
    ]
    extra = []
    if cfg.final_softcap:
        extra.append(f"output logits soft-capped at {cfg.final_softcap:g}")
    if cfg.embed_scale != 1.0:
        extra.append(f"embeddings x{cfg.embed_scale:.4g}")
    if cfg.ffn_act == "gelu_tanh":
        extra.append("GeGLU MLP")
    if extra:
        rows.append(("quirks", ", ".join(extra)))
    if cfg.quantised_weights:
        rows.append(("vs llama.cpp", QUANTISED_NOTE))
    for n in cfg.notes:
        rows.append(("note", n))
    return rows


def summary_line(cfg: ModelConfig) -> str:
    """One line for the window: name, architecture, shapes, window, forward path."""
    name = cfg.name or "model"
    w = cfg.sliding_layers
    win = (f", window {'/'.join(str(s) for s in sorted({cfg.window(i) for i in w}))} on {len(w)}/{cfg.n_layers} "
           "layers") if w else ""
    return (f"{name} ({cfg.arch}): {cfg.n_layers} layers, hidden {cfg.hidden}, {cfg.n_heads} heads, "
            f"{cfg.n_kv_heads} KV heads (GQA {cfg.group}), head size {cfg.head_size}{win}, RoPE {rope_line(cfg)}; "
            f"forward: {forward_path(cfg)}")


__all__ = ["ARCHS", "Arch", "LlamaConfig", "ModelConfig", "config_from_reader", "describe_config",
           "forward_path", "summary_line"]
