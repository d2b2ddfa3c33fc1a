"""llama.cpp's logits and tokenisations of the small random models of kvviz.sources.random_gguf, stored as
test fixtures (tests/data/llamacpp/<recipe>.npz) that tests/test_architectures.py checks kvviz against.

For each recipe (a real family member's shapes scaled down, with its architecture's quirks):
  1. the model is written with F32 weights and llama.cpp computes the logits of the recipe's token sequence;
  2. the model is written with the recipe's quantised weight type (Q4_K, Q5_K, Q6_K, Q8_0), and
     - llama.cpp dequantises it with ggml's own code (llama_model_quantize to ALL_F32, allow_requantize)
       and computes the logits of that F32 file: the reference for kvviz, which reads the quantised file
       and dequantises it with gguf.quants;
     - llama.cpp computes the logits of the quantised file itself (it then quantises the activations to
       Q8 blocks before each product with a quantised matrix): stored to show how far that lands;
  3. llama.cpp tokenises a few strings with the recipe's vocabulary (llama_tokenize, special tokens parsed).
llama.cpp runs with float32 K/V caches, without flash attention, one batch for the whole sequence.
The fixtures keep the logits and a SHA-256 of the tensor data, not the models: the tests write the
models again from the recipes and check the hashes first.

llama-cpp-python 0.3.36 built from source for this CPU: GGML_NATIVE off, AVX2 + FMA + F16C, no AVX-512 and
no AMX (CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX512=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF"
pip install --no-binary llama-cpp-python llama-cpp-python==0.3.36), in a venv with numpy and gguf.

With --model FILE.gguf (a quantised model) it writes no fixture: it prints how far llama.cpp's logits on
the file itself are from its logits on the file's ggml float32 dequantisation (which kvviz's forward
matches), over the tokens of a fixed English passage: the difference the window and `kvviz info` explain.

Run from the repository root:
    PYTHONPATH=. /path/to/venv-with-llama-cpp/bin/python tools/llamacpp_reference.py [--only NAME ...]
    PYTHONPATH=. /path/to/venv-with-llama-cpp/bin/python tools/llamacpp_reference.py --model FILE.gguf
"""
from __future__ import annotations

import argparse
import ctypes
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kvviz.sources.random_gguf import RECIPES, vocab_of, write_random_gguf  # noqa: E402

OUT = ROOT / "tests" / "data" / "llamacpp"
# Strings tokenised with every vocabulary: merges, ties, bytes outside the vocabulary, spaces, special tokens.
STRINGS = [
    "hello world",
    "the theory is in a hat",
    " leading space and  two  spaces",
    "été Über naïve \u4e16\u754c \U0001F600",
    "line\nbreak\ttab",
    "<start_of_turn>user hello<end_of_turn>",
    "<|user|> hello <|end|> and after",
    "</s> end <s>",
    "",
]


def random_strings(n: int = 30, seed: int = 7) -> list[str]:
    """Strings drawn from pieces the vocabularies merge (and tie on), spaces, bytes outside them, specials."""
    pool = ["hello", " world", "the", " th", "e", "in", "ing", " a", "an", "and", "nd", "ll", "o", "st", "re",
            " ", "  ", "\n", "\t", "\u00e9", "t\u00e9", "\u00f6", "\u4e16", "\U0001F600", "!", "?", "7", "42",
            "<|end|>", "<end_of_turn>", "<s>", "Z", "q"]
    rng = np.random.default_rng(seed)
    return ["".join(pool[i] for i in rng.integers(0, len(pool), rng.integers(1, 12))) for _ in range(n)]


def run_llama(path: Path, tokens: list[int]) -> np.ndarray:
    """llama.cpp's logits [T, vocab] of `tokens` (one batch, f32 K/V, no flash attention)."""
    from llama_cpp import Llama

    n = len(tokens)
    llm = Llama(model_path=str(path), n_ctx=max(64, n), n_batch=max(64, n), n_ubatch=max(64, n), logits_all=True,
                type_k=0, type_v=0, flash_attn=False, n_threads=2, n_threads_batch=2, verbose=False, seed=0)
    llm.eval(tokens)
    out = np.array(llm.scores[:n], dtype=np.float32)
    llm.close()
    return out


def ggml_dequantised(src: Path, dst: Path) -> None:
    """Write `src` again with every tensor in F32, dequantised by llama.cpp's own (ggml) code."""
    import llama_cpp

    p = llama_cpp.llama_model_quantize_default_params()
    p.ftype = llama_cpp.LLAMA_FTYPE_ALL_F32
    p.allow_requantize = True
    p.pure = True
    p.nthread = 2
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(p))
    if rc != 0:
        raise RuntimeError(f"llama_model_quantize failed on {src.name} ({rc})")


def check_all_f32(path: Path) -> None:
    from gguf import GGUFReader

    bad = [t.name for t in GGUFReader(path).tensors if t.tensor_type.name != "F32"]
    if bad:
        raise RuntimeError(f"{path.name}: not dequantised: {bad[:4]}")


def tokenize(path: Path, strings: list[str]) -> list[list[int]]:
    from llama_cpp import Llama

    llm = Llama(model_path=str(path), vocab_only=True, verbose=False)
    out = [llm.tokenize(s.encode("utf-8"), add_bos=False, special=True) for s in strings]
    llm.close()
    return out


def one(name: str, tmp: Path) -> Path:
    import llama_cpp

    r = RECIPES[name]
    f32 = tmp / f"{name}.f32.gguf"
    quant = tmp / f"{name}.{r.qtype}.gguf"
    deq = tmp / f"{name}.{r.qtype}.ggml-f32.gguf"
    info = write_random_gguf(r, f32, "F32")
    qinfo = write_random_gguf(r, quant, r.qtype)
    tokens = info["tokens"]
    logits_f32 = run_llama(f32, tokens)
    ggml_dequantised(quant, deq)
    check_all_f32(deq)
    logits_q = run_llama(deq, tokens)
    logits_q_direct = run_llama(quant, tokens)
    strings = STRINGS + random_strings()
    toks = tokenize(f32, strings)
    voc = vocab_of(r)
    out = OUT / f"{name}.npz"
    OUT.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(
        out,
        recipe=np.array(name), arch=np.array(r.arch), qtype=np.array(r.qtype),
        tokens=np.asarray(tokens, np.int64),
        logits_f32=logits_f32, logits_quant=logits_q, logits_quant_direct=logits_q_direct.astype(np.float16),
        sha256_f32=np.array(info["sha256"]), sha256_quant=np.array(qinfo["sha256"]),
        strings=np.array(json.dumps(strings)), token_ids=np.array(json.dumps(toks)),
        n_vocab=np.array(len(voc["tokens"])), llama_cpp_version=np.array(llama_cpp.__version__),
    )
    return out


PASSAGE = ("The history of the printing press begins in the fifteenth century, when movable type made books cheaper "
           "to produce. Within fifty years presses were at work in more than two hundred cities across Europe, and "
           "the number of books in circulation rose from thousands to millions. Scholars could now compare the same "
           "text in many places, errors were corrected in later editions, and ideas travelled faster than ever.")


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, np.float64)
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def quantised_file_gap(path: Path) -> None:
    from llama_cpp import Llama

    llm = Llama(model_path=str(path), vocab_only=True, verbose=False)
    tokens = llm.tokenize(PASSAGE.encode("utf-8"), add_bos=True, special=False)
    llm.close()
    with tempfile.TemporaryDirectory() as d:
        deq = Path(d) / "ggml-f32.gguf"
        ggml_dequantised(path, deq)
        ref = run_llama(deq, tokens)
    got = run_llama(path, tokens)
    a, b = log_softmax(ref), log_softmax(got)
    kl = (np.exp(a) * (a - b)).sum(-1)
    agree = float((ref.argmax(-1) == got.argmax(-1)).mean())
    print(f"{path.name}: {len(tokens)} tokens; llama.cpp on the file vs on its ggml float32 dequantisation: "
          f"KL mean {kl.mean():.2e}, max {kl.max():.2e} nats; argmax equal at {100 * agree:.1f}% of positions")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", action="append", choices=sorted(RECIPES), help="recipes to run (default: all)")
    ap.add_argument("--model", type=Path, help="a quantised GGUF: print llama.cpp's own gap on it (no fixture)")
    args = ap.parse_args()
    if args.model is not None:
        quantised_file_gap(args.model)
        return 0
    with tempfile.TemporaryDirectory() as d:
        for name in args.only or list(RECIPES):
            out = one(name, Path(d))
            print(f"{name}: {out.relative_to(ROOT)} ({out.stat().st_size // 1024} KiB)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
