"""Capture Q/K/V from a local Hugging Face Llama-style model folder with torch + transformers (optional).

Nothing is downloaded (local_files_only=True). The projections' outputs are caught with forward hooks and
RoPE is applied with the model's own cos/sin tables, so the result has the same layout as the numpy
runner's `Capture`.
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from kvviz.errors import InvalidInput
from kvviz.sources.gguf_llama import LlamaConfig
from kvviz.sources.llama_numpy import CancelFn, Cancelled, Capture, ProgressFn, apply_rope, rope_cos_sin, rope_inv_freq

_HINT = "pip install kvviz[hf]  (installs torch and transformers)"


def _import_torch():
    try:
        import torch
        import transformers
    except ImportError as e:
        raise InvalidInput(f"loading a Hugging Face model needs torch and transformers ({e.name} is missing)",
                           _HINT) from e
    return torch, transformers


def _config(hf) -> LlamaConfig:
    n_heads = hf.num_attention_heads
    head_size = getattr(hf, "head_dim", None) or hf.hidden_size // n_heads
    return LlamaConfig(
        n_layers=hf.num_hidden_layers, n_heads=n_heads,
        n_kv_heads=getattr(hf, "num_key_value_heads", None) or n_heads, head_size=head_size,
        hidden=hf.hidden_size, ffn=hf.intermediate_size, vocab=hf.vocab_size,
        rope_theta=float(getattr(hf, "rope_theta", 10000.0)), rms_eps=float(getattr(hf, "rms_norm_eps", 1e-6)),
        context_length=int(getattr(hf, "max_position_embeddings", 2048)), rope_dim=head_size,
        bos_id=getattr(hf, "bos_token_id", None),
        eos_id=hf.eos_token_id if isinstance(hf.eos_token_id, int) else None,
        name=str(getattr(hf, "_name_or_path", "")),
    )


def capture_hf(model_dir: str | Path, prompt: str | Sequence[int], *, progress: ProgressFn | None = None,
               cancel: CancelFn | None = None) -> tuple[Capture, np.ndarray]:
    """Run `prompt` (text or token ids) through a local HF causal LM; returns (Capture, last-token logits)."""
    torch, transformers = _import_torch()
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise InvalidInput(f"not a model folder: {model_dir}", "Pass a local folder holding config.json and weights.")
    try:
        tok = transformers.AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
        model = transformers.AutoModelForCausalLM.from_pretrained(str(model_dir), local_files_only=True,
                                                                  torch_dtype=torch.float32)
    except (OSError, ValueError) as e:
        raise InvalidInput(f"{model_dir.name}: cannot load the model: {e}",
                           "The folder needs config.json, tokenizer files and weights.") from e
    model.eval()
    layers = getattr(getattr(model, "model", None), "layers", None)
    if layers is None or not all(hasattr(l, "self_attn") and hasattr(l.self_attn, "q_proj") for l in layers):
        raise InvalidInput(f"{model_dir.name}: model type {model.config.model_type!r} is not Llama-like",
                           "Supported: decoders with self_attn.q_proj/k_proj/v_proj and rotate-half RoPE.")
    cfg = _config(model.config)
    ids = tok.encode(prompt) if isinstance(prompt, str) else [int(i) for i in prompt]
    T, D = len(ids), cfg.head_size
    got: dict[tuple[int, str], np.ndarray] = {}
    done = [0]

    def hook(li: int, name: str):
        def fn(_mod, _inp, out):
            if cancel is not None and cancel():
                raise Cancelled()
            got[(li, name)] = out[0].detach().float().numpy()  # [T, heads*D]
            if name == "v":
                done[0] += 1
                if progress is not None:
                    progress(done[0], cfg.n_layers)
        return fn

    handles = []
    for li, layer in enumerate(layers):
        for name in ("q", "k", "v"):
            handles.append(getattr(layer.self_attn, f"{name}_proj").register_forward_hook(hook(li, name)))
    try:
        with torch.no_grad():
            x = torch.tensor([ids], dtype=torch.long)
            logits = model(input_ids=x).logits[0, -1].float().numpy()
            pos = torch.arange(T)[None, :]
            rotary = getattr(model.model, "rotary_emb", None)
            if rotary is not None:
                cos, sin = rotary(torch.zeros(1, T, D), pos)
                cos, sin = cos[0].float().numpy(), sin[0].float().numpy()
            else:
                cos, sin = rope_cos_sin(rope_inv_freq(cfg), np.arange(T))
    finally:
        for h in handles:
            h.remove()

    def stack(name: str, heads: int) -> np.ndarray:
        return np.stack([got[(li, name)].reshape(T, heads, D).transpose(1, 0, 2) for li in range(cfg.n_layers)])

    q = apply_rope(stack("q", cfg.n_heads), cos, sin).astype(np.float32)
    k_pre = stack("k", cfg.n_kv_heads).astype(np.float32)
    cap = Capture(q=q, k_pre_rope=k_pre, k=apply_rope(k_pre, cos, sin).astype(np.float32),
                  v=stack("v", cfg.n_kv_heads).astype(np.float32), tokens=np.asarray(ids, dtype=np.int64),
                  token_strings=[tok.decode([i]) for i in ids], config=cfg)
    return cap, logits
