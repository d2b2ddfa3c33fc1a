"""A GGUF model's weights as float32, dequantised exactly by `gguf.quants` (bit for bit ggml's own
dequantisation), either all at load time or, when a float32 copy of the whole model would not fit the
weight budget, per layer from the mapped file.

Two ways to hold them (`ModelWeights.mode`):
  resident  every tensor dequantised once at load (the fastest forward; the default when the model's
            float32 size fits the budget)
  mapped    tensors stay in their file form (the file is memory-mapped; F32 tensors are read in place),
            and a layer is dequantised when the forward reaches it; the most recently used layers are
            kept while they fit the budget. The embedding rows a pass needs are dequantised alone, and the
            output matrix in slices of rows.
The budget: `load_gguf_llama(..., weight_budget=BYTES)`, else the KVVIZ_WEIGHT_BUDGET environment
variable ("6G", "512M", or bytes), else half of the memory available when the model is loaded.

Matrices are [out, in] like torch Linear weights, in the rotate-half RoPE layout (llama.cpp's converter
permutes the Q/K rows of `llama` models; the reader undoes it).
"""
from __future__ import annotations

import os
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
from gguf.quants import dequantize

from kvviz.errors import InvalidInput
from kvviz.sources.archs import ARCHS, ModelConfig

ProgressFn = Callable[[int, int], None]
_F32 = np.float32
_OUTPUT_ROWS = 8192  # rows of a mapped output matrix dequantised at a time: bounds the slice's memory


def permute_llamacpp(w: np.ndarray, n_heads: int) -> np.ndarray:
    """llama.cpp's converter permutation (HF rotate-half rows -> interleaved pairs), per head."""
    d = w.shape[0] // n_heads
    return w.reshape(n_heads, 2, d // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def unpermute_llamacpp(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Inverse of `permute_llamacpp`: interleaved rows back to the rotate-half (HF) layout."""
    d = w.shape[0] // n_heads
    return np.ascontiguousarray(w.reshape(n_heads, d // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape))


def dequant(t, path: Path, rows=None) -> np.ndarray:
    """float32 of tensor `t` (a gguf ReaderTensor), or of its `rows` (an index array) only."""
    data = t.data if rows is None else t.data[rows]
    try:
        a = dequantize(data, t.tensor_type)  # a plain array: the reader's tensors are views of one
    # gguf raises NotImplementedError for the types its numpy code lacks (gguf 0.19: I8, I16, I32, I64, F64, Q1_0,
    # Q8_1, Q8_K), ValueError for a row whose bytes are not whole blocks: both say the file is not one this loader
    # can read (tests/test_live_model.py checks both). Nothing else is caught: an error of ours stays one.
    except (NotImplementedError, ValueError) as e:
        raise InvalidInput(f"{path.name}: cannot dequantise {t.name} ({t.tensor_type.name}): {e}",
                           "Use a GGUF quantised with a type the gguf package can dequantise in numpy.") from e
    if rows is not None:
        return np.ascontiguousarray(a, dtype=_F32).reshape(len(rows), -1)
    shape = tuple(int(s) for s in reversed([int(x) for x in t.shape]))  # ggml lists dims innermost first
    return np.ascontiguousarray(a, dtype=_F32).reshape(shape)


def file_backed(a: np.ndarray) -> bool:
    """Whether `a` is a view of a mapped file (its chain of bases ends in the mapping, not in an array)."""
    b = a
    while isinstance(b, np.ndarray):
        b = b.base
    return b is not None


def parse_budget(text: str) -> int:
    """Bytes of "6G", "512M", "300K" or "123456" (binary units)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kKmMgGtT]?)i?[bB]?\s*", str(text))
    if not m:
        raise InvalidInput(f"weight budget {text!r} is not a size", "Write it as bytes or with a unit: 512M, 6G.")
    mult = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}[m.group(2).lower()]
    return int(float(m.group(1)) * mult)


def _available_memory() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return 8 << 30


def default_budget() -> int:
    """KVVIZ_WEIGHT_BUDGET, else half of the memory available now."""
    env = os.environ.get("KVVIZ_WEIGHT_BUDGET", "").strip()
    if env:
        return parse_budget(env)
    return _available_memory() // 2


@dataclass
class LayerWeights:
    """One decoder block; matrices are [out, in] float32. Optional tensors are None where the file has none."""

    attn_norm: np.ndarray  # [hidden]
    wq: np.ndarray  # [n_heads*D, hidden], rotate-half layout
    wk: np.ndarray  # [n_kv*D, hidden], rotate-half layout
    wv: np.ndarray  # [n_kv*D, hidden]
    wo: np.ndarray  # [hidden, n_heads*D]
    ffn_norm: np.ndarray  # [hidden]
    w_gate: np.ndarray  # [ffn, hidden]
    w_up: np.ndarray  # [ffn, hidden]
    w_down: np.ndarray  # [hidden, ffn]
    bq: np.ndarray | None = None  # [n_heads*D] (Qwen2), rotate-half layout
    bk: np.ndarray | None = None
    bv: np.ndarray | None = None
    bo: np.ndarray | None = None  # [hidden]
    q_norm: np.ndarray | None = None  # [D] per-head RMS norm of Q (Qwen3, Gemma 3)
    k_norm: np.ndarray | None = None
    attn_post_norm: np.ndarray | None = None  # [hidden] (Gemma 2/3)
    ffn_post_norm: np.ndarray | None = None
    b_gate: np.ndarray | None = None
    b_up: np.ndarray | None = None
    b_down: np.ndarray | None = None

    def named(self, layer: int, fused_qkv: bool = False, fused_up: bool = False) -> list[tuple[str, np.ndarray]]:
        """(GGUF tensor name, array) of every tensor present; a part of a fused tensor is named by the tensor
        and the part ("blk.0.attn_qkv.weight (K rows)")."""
        out = []
        for f in fields(self):
            a = getattr(self, f.name)
            if a is None:
                continue
            name = _GGUF_NAMES[f.name]
            part = _FUSED_PARTS.get(f.name)
            if part is not None and (fused_qkv if part[0] == "attn_qkv" else fused_up):
                name = f"{part[0]}.{name.rsplit('.', 1)[1]} ({part[1]} rows)"
            out.append((f"blk.{layer}.{name}", a))
        return out

    @property
    def nbytes(self) -> int:
        """Bytes of memory the layer holds (views of the mapped file, F32 tensors read in place, hold none)."""
        return sum(a.nbytes for f in fields(self) if (a := getattr(self, f.name)) is not None and not file_backed(a))


# LayerWeights field -> the GGUF tensor it comes from (of a file with separate Q/K/V and gate/up)
_GGUF_NAMES = {"attn_norm": "attn_norm.weight", "wq": "attn_q.weight", "wk": "attn_k.weight", "wv": "attn_v.weight",
               "wo": "attn_output.weight", "ffn_norm": "ffn_norm.weight", "w_gate": "ffn_gate.weight",
               "w_up": "ffn_up.weight", "w_down": "ffn_down.weight", "bq": "attn_q.bias", "bk": "attn_k.bias",
               "bv": "attn_v.bias", "bo": "attn_output.bias", "q_norm": "attn_q_norm.weight",
               "k_norm": "attn_k_norm.weight", "attn_post_norm": "post_attention_norm.weight",
               "ffn_post_norm": "post_ffw_norm.weight", "b_gate": "ffn_gate.bias", "b_up": "ffn_up.bias",
               "b_down": "ffn_down.bias"}
_FUSED_PARTS = {"wq": ("attn_qkv", "Q"), "wk": ("attn_qkv", "K"), "wv": ("attn_qkv", "V"), "bq": ("attn_qkv", "Q"),
                "bk": ("attn_qkv", "K"), "bv": ("attn_qkv", "V"), "w_gate": ("ffn_up", "gate"),
                "w_up": ("ffn_up", "up"), "b_gate": ("ffn_up", "gate"), "b_up": ("ffn_up", "up")}


class TensorFile:
    """The tensors of one GGUF by name, read from the mapped file, with shapes checked against the config."""

    def __init__(self, reader, path: Path):
        self.reader = reader  # keeps the mapping alive
        self.path = path
        self.tensors = {t.name: t for t in reader.tensors}

    def __contains__(self, name: str) -> bool:
        return name in self.tensors

    def f32(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        t = self.tensors[name]
        if t.tensor_type.name == "F32":
            a = np.asarray(t.data, dtype=_F32)  # in place: a view of the mapped file
        else:
            a = dequant(t, self.path)
        if a.size == int(np.prod(shape)) and len(shape) == 1:
            a = a.reshape(shape)
        if a.shape != shape:
            raise InvalidInput(f"{self.path.name}: tensor {name} has shape {a.shape}, expected {shape} from the "
                               "metadata", "The GGUF's metadata and tensors disagree.")
        a.setflags(write=False)
        return a

    def rows(self, name: str, idx: np.ndarray) -> np.ndarray:
        t = self.tensors[name]
        if t.tensor_type.name == "F32":
            return np.asarray(t.data, dtype=_F32)[idx]
        return dequant(t, self.path, np.asarray(idx, dtype=np.int64))

    def f32_bytes(self, name: str) -> int:
        return int(self.tensors[name].n_elements) * 4


def layer_tensor_names(cfg: ModelConfig, files: TensorFile, layer: int) -> list[str]:
    """The tensors layer `layer` needs from `files` (fused or separate Q/K/V, whichever the file has)."""
    arch = ARCHS[cfg.arch]
    b = f"blk.{layer}."
    qkv = [b + "attn_qkv.weight"] if b + "attn_qkv.weight" in files else [b + f"attn_{x}.weight" for x in "qkv"]
    return qkv + [b + n + ".weight" for n in arch.layer_tensors()]


def read_layer(cfg: ModelConfig, files: TensorFile, i: int) -> LayerWeights:
    """Layer i's weights as float32 (F32 tensors as views of the file)."""
    arch = ARCHS[cfg.arch]
    H, D, F = cfg.hidden, cfg.head_size, cfg.ffn
    nq, nkv = cfg.n_heads * D, cfg.n_kv_heads * D
    b = f"blk.{i}."

    def get(n, shape):
        return files.f32(b + n, shape)

    def opt(n, shape):
        return files.f32(b + n, shape) if b + n in files else None

    if b + "attn_qkv.weight" in files:
        qkv = get("attn_qkv.weight", (nq + 2 * nkv, H))
        wq, wk, wv = qkv[:nq], qkv[nq:nq + nkv], qkv[nq + nkv:]
        qkv_b = opt("attn_qkv.bias", (nq + 2 * nkv,))
        if qkv_b is not None:
            bq, bk, bv = qkv_b[:nq], qkv_b[nq:nq + nkv], qkv_b[nq + nkv:]
        else:
            bq, bk, bv = opt("attn_q.bias", (nq,)), opt("attn_k.bias", (nkv,)), opt("attn_v.bias", (nkv,))
    else:
        wq, wk, wv = get("attn_q.weight", (nq, H)), get("attn_k.weight", (nkv, H)), get("attn_v.weight", (nkv, H))
        bq, bk, bv = opt("attn_q.bias", (nq,)), opt("attn_k.bias", (nkv,)), opt("attn_v.bias", (nkv,))
    if cfg.rope_style == "norm":
        wq, wk = unpermute_llamacpp(wq, cfg.n_heads), unpermute_llamacpp(wk, cfg.n_kv_heads)
        bq = None if bq is None else unpermute_llamacpp(bq, cfg.n_heads)
        bk = None if bk is None else unpermute_llamacpp(bk, cfg.n_kv_heads)
    if arch.fused_gate_up:
        up = get("ffn_up.weight", (2 * F, H))
        w_gate, w_up = up[:F], up[F:]
        up_b = opt("ffn_up.bias", (2 * F,))
        b_gate, b_up = (None, None) if up_b is None else (up_b[:F], up_b[F:])
    else:
        w_gate, w_up = get("ffn_gate.weight", (F, H)), get("ffn_up.weight", (F, H))
        b_gate, b_up = opt("ffn_gate.bias", (F,)), opt("ffn_up.bias", (F,))
    lw = LayerWeights(
        attn_norm=get("attn_norm.weight", (H,)), wq=wq, wk=wk, wv=wv,
        wo=get("attn_output.weight", (H, nq)), ffn_norm=get("ffn_norm.weight", (H,)),
        w_gate=w_gate, w_up=w_up, w_down=get("ffn_down.weight", (H, F)),
        bq=bq, bk=bk, bv=bv, bo=opt("attn_output.bias", (H,)),
        q_norm=opt("attn_q_norm.weight", (D,)), k_norm=opt("attn_k_norm.weight", (D,)),
        attn_post_norm=opt("post_attention_norm.weight", (H,)), ffn_post_norm=opt("post_ffw_norm.weight", (H,)),
        b_gate=b_gate, b_up=b_up, b_down=opt("ffn_down.bias", (H,)),
    )
    for f in fields(lw):
        a = getattr(lw, f.name)
        if a is not None and a.flags.writeable:
            a.setflags(write=False)
    return lw


class MappedLayers(Sequence):
    """The layers of a mapped model: layer i dequantised when asked for, the most recently used ones kept
    while their float32 copies fit `budget` bytes (the layer asked for is always returned, even alone
    over budget). Safe to share between threads."""

    def __init__(self, cfg: ModelConfig, files: TensorFile, budget: int):
        self.cfg, self.files, self.budget = cfg, files, int(budget)
        self._cache: OrderedDict[int, LayerWeights] = OrderedDict()
        self._lock = threading.Lock()
        self.reads = 0  # layers dequantised so far (tests and the info line read it)

    def __len__(self) -> int:
        return self.cfg.n_layers

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        i = int(i)
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(i)
        with self._lock:
            lw = self._cache.get(i)
            if lw is not None:
                self._cache.move_to_end(i)
                return lw
            lw = read_layer(self.cfg, self.files, i)
            self.reads += 1
            self._cache[i] = lw
            used = sum(x.nbytes for x in self._cache.values())
            while used > self.budget and len(self._cache) > 1:
                _, old = self._cache.popitem(last=False)
                used -= old.nbytes
            return lw

    def __deepcopy__(self, memo):
        return self  # read-only weights: a copied runner shares them

    @property
    def resident_bytes(self) -> int:
        with self._lock:
            return sum(x.nbytes for x in self._cache.values())


class ModelWeights:
    """Embeddings, layers, final norm and output matrix of one model (see the module docstring)."""

    def __init__(self, cfg: ModelConfig, *, layers, out_norm: np.ndarray, tied: bool, mode: str,
                 embd: np.ndarray | None = None, output: np.ndarray | None = None, files: TensorFile | None = None,
                 output_name: str = "output.weight", output_bias: np.ndarray | None = None,
                 rope_freq_factors: np.ndarray | None = None, budget: int = 0, fused_qkv: bool = False,
                 fused_up: bool = False):
        self.cfg = cfg
        self.fused_qkv, self.fused_up = fused_qkv, fused_up
        self.layers = layers
        self.out_norm = out_norm
        self.tied = tied
        self.mode = mode
        self._embd, self._output, self._files = embd, output, files
        self._output_name = output_name
        self.output_bias = output_bias
        self.rope_freq_factors = rope_freq_factors  # [D/2] divisors of RoPE frequencies (Llama 3.1, Phi-3)
        self.budget = budget

    def __deepcopy__(self, memo):
        return self

    # -- the full matrices (resident: the arrays; mapped: dequantised now, the whole matrix) --------

    @property
    def tok_embd(self) -> np.ndarray:
        if self._embd is None:
            self._embd = self._files.f32("token_embd.weight", (self.cfg.vocab, self.cfg.hidden))
        return self._embd

    @property
    def output(self) -> np.ndarray:
        if self.tied:
            return self.tok_embd
        if self._output is None:
            self._output = self._files.f32(self._output_name, (self.cfg.vocab, self.cfg.hidden))
        return self._output

    # -- what the forward uses ----------------------------------------------------------------

    def embed(self, ids: np.ndarray) -> np.ndarray:
        """[T, hidden] float32 embeddings of token ids (times the architecture's embedding scale)."""
        ids = np.asarray(ids, dtype=np.int64)
        x = self._embd[ids] if self._embd is not None else self._files.rows("token_embd.weight", ids)
        if self.cfg.embed_scale != 1.0:
            x = x * _F32(self.cfg.embed_scale)
        return np.ascontiguousarray(x, dtype=_F32)

    def project(self, h: np.ndarray) -> np.ndarray:
        """h [T, hidden] (after the final norm) -> [T, vocab] logits, before any soft-capping."""
        out = self._output if not self.tied else self._embd
        if out is not None:
            y = h @ out.T
        else:
            name = "token_embd.weight" if self.tied else self._output_name
            vocab = self.cfg.vocab
            y = np.empty((h.shape[0], vocab), _F32)
            for r0 in range(0, vocab, _OUTPUT_ROWS):
                idx = np.arange(r0, min(vocab, r0 + _OUTPUT_ROWS))
                y[:, idx] = h @ self._files.rows(name, idx).T
        if self.output_bias is not None:
            y = y + self.output_bias
        return y

    def named(self) -> list[tuple[str, np.ndarray]]:
        """Every tensor as (name, float32 array); a mapped model dequantises each as it goes."""
        out = [("token_embd.weight", self.tok_embd)]
        for i in range(len(self.layers)):
            out += self.layers[i].named(i, self.fused_qkv, self.fused_up)
        out.append(("output_norm.weight", self.out_norm))
        if not self.tied:
            out.append((self._output_name, self.output))
        if self.output_bias is not None:
            out.append(("output.bias", self.output_bias))
        if self.rope_freq_factors is not None:
            out.append(("rope_freqs.weight", self.rope_freq_factors))
        return out


# The forward's weights are ModelWeights; LlamaWeights is the name the rest of kvviz has used for them.
LlamaWeights = ModelWeights


def required_tensors(cfg: ModelConfig, files: TensorFile) -> list[str]:
    names = ["token_embd.weight", "output_norm.weight"]
    for i in range(cfg.n_layers):
        names += layer_tensor_names(cfg, files, i)
    return names


def model_f32_bytes(cfg: ModelConfig, files: TensorFile) -> int:
    """Bytes of a float32 copy of every tensor the forward reads (F32 tensors count: a resident model copies them)."""
    names = set(required_tensors(cfg, files))
    names |= {n for n in files.tensors if n.startswith("blk.") or n in ("output.weight", "output.bias")}
    return sum(files.f32_bytes(n) for n in names if n in files)


def read_weights(cfg: ModelConfig, files: TensorFile, *, budget: int | None = None,
                 progress: ProgressFn | None = None) -> ModelWeights:
    """The model's weights, resident when their float32 size fits `budget` (default: `default_budget()`),
    else mapped. Missing tensors are refused with their names."""
    path = files.path
    arch = ARCHS[cfg.arch]
    names = required_tensors(cfg, files)
    missing = [n for n in names if n not in files]
    if missing:
        raise InvalidInput(
            f"{path.name}: {len(missing)} tensor(s) missing, e.g. {', '.join(missing[:4])}",
            f"The GGUF does not hold a dense {cfg.arch} decoder as llama.cpp writes one (mixture-of-experts and "
            "partial files are not supported).",
        )
    budget = default_budget() if budget is None else int(budget)
    H, D = cfg.hidden, cfg.head_size
    tied = arch.tied_always or "output.weight" not in files
    out_norm = files.f32("output_norm.weight", (H,))
    out_b = files.f32("output.bias", (cfg.vocab,)) if "output.bias" in files else None
    freq = None
    for name in ("rope_freqs.weight", "rope_factors_short.weight"):
        if name in files:
            freq = files.f32(name, (files.tensors[name].n_elements,)).reshape(-1)
            if freq.shape != (D // 2,):
                raise InvalidInput(f"{path.name}: {name} has {freq.size} values, expected {D // 2}",
                                   "The GGUF's RoPE frequency factors do not match the head size.")
            break
    common = dict(out_norm=out_norm, tied=tied, output_bias=out_b, rope_freq_factors=freq, budget=budget,
                  fused_qkv="blk.0.attn_qkv.weight" in files, fused_up=arch.fused_gate_up)
    if model_f32_bytes(cfg, files) > budget:
        return ModelWeights(cfg, layers=MappedLayers(cfg, files, budget), mode="mapped", files=files, **common)
    total = 2 + cfg.n_layers
    done = 0

    def tick():
        nonlocal done
        done += 1
        if progress is not None:
            progress(done, total)

    embd = _owned(files.f32("token_embd.weight", (cfg.vocab, H)))
    tick()
    layers = []
    for i in range(cfg.n_layers):
        lw = read_layer(cfg, files, i)
        for f in fields(lw):
            a = getattr(lw, f.name)
            if a is not None:
                setattr(lw, f.name, _owned(a))
        layers.append(lw)
        tick()
    output = embd if tied else _owned(files.f32("output.weight", (cfg.vocab, H)))
    tick()
    return ModelWeights(cfg, layers=layers, mode="resident", embd=embd, output=output, files=None, **common)


def _owned(a: np.ndarray) -> np.ndarray:
    """A resident copy of a view of the mapped file (a resident model does not keep the file open)."""
    if not file_backed(a):
        return a
    b = np.array(a, dtype=_F32, copy=True)
    b.setflags(write=False)
    return b
