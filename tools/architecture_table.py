"""The table of docs/benchmarks.md "Architectures against llama.cpp": for every fixture of
tests/data/llamacpp (written by tools/llamacpp_reference.py), the model written again from its recipe,
loaded by kvviz, and kvviz's numpy forward over the fixture's tokens compared with llama.cpp's logits:
KL(llama.cpp || kvviz) per position (max and mean over positions) and how many positions have the same
argmax, for the F32 file and the quantised one (against llama.cpp over ggml's float32 dequantisation of it),
and beside it the KL of llama.cpp's own run on the quantised file (activations quantised) against kvviz.
tests/test_architectures.py asserts the same comparisons (KL < 1e-5, argmax equal everywhere).

--gelu-f16 runs the GeGLU models (Gemma) with GELU computed the way llama.cpp's CPU backend computes it:
its input rounded to float16 and the result looked up in a float16 table (ggml's GGML_GELU_FP16), to show
how much of their gap that accounts for. kvviz itself computes GELU in float32.

Run from the repository root:  python tools/architecture_table.py [--gelu-f16]
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kvviz.sources import llama_numpy  # noqa: E402
from kvviz.sources.gguf_llama import load_gguf_llama  # noqa: E402
from kvviz.sources.llama_numpy import LlamaRunner, gelu_tanh  # noqa: E402
from kvviz.sources.random_gguf import RECIPES, write_random_gguf  # noqa: E402

DATA = ROOT / "tests" / "data" / "llamacpp"


def kl(ref: np.ndarray, got: np.ndarray) -> np.ndarray:
    def lsm(x):
        x = np.asarray(x, np.float64)
        x = x - x.max(-1, keepdims=True)
        return x - np.log(np.exp(x).sum(-1, keepdims=True))

    a, b = lsm(ref), lsm(got)
    return (np.exp(a) * (a - b)).sum(-1)


def gelu_through_f16(x: np.ndarray) -> np.ndarray:
    """ggml's CPU GELU: 0 below -10, x above 10, else the float16 table's value at x rounded to float16."""
    y = gelu_tanh(x.astype(np.float16).astype(np.float32)).astype(np.float16).astype(np.float32)
    return np.where(x <= -10, np.float32(0), np.where(x >= 10, x, y)).astype(np.float32)


def main() -> int:
    if "--gelu-f16" in sys.argv[1:]:
        llama_numpy.ACTIVATIONS["gelu_tanh"] = gelu_through_f16
    print("| architecture | recipe (shape of) | weights | loads | KL max | KL mean | argmax equal | "
          "llama.cpp on the file itself: KL mean |")
    print("|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as d:
        for name, r in RECIPES.items():
            with np.load(DATA / f"{name}.npz") as f:
                fx = {k: f[k] for k in f.files}
            tokens = fx["tokens"].tolist()
            for wtype, key, sha in (("F32", "logits_f32", "sha256_f32"), (r.qtype, "logits_quant", "sha256_quant")):
                path = Path(d) / f"{name}.{wtype}.gguf"
                info = write_random_gguf(r, path, wtype)
                if info["sha256"] != str(fx[sha]):
                    raise SystemExit(f"{name} {wtype}: the recipe no longer writes the fixture's model")
                model = load_gguf_llama(path)
                got = LlamaRunner(model, record=False).prefill(tokens, all_logits=True)
                k = kl(fx[key], got)
                eq = int((got.argmax(-1) == fx[key].argmax(-1)).sum())
                direct = "" if wtype == "F32" else \
                    f"{kl(fx['logits_quant_direct'].astype(np.float32), got).mean():.1e}"
                print(f"| {r.arch} | {name}: {r.member} | {wtype} | yes | {k.max():.1e} | {k.mean():.1e} | "
                      f"{eq}/{len(tokens)} | {direct} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
