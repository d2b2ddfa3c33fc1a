"""The GPU forward against the numpy forward on a random GGUF of every architecture kvviz reads
(kvviz/sources/random_gguf.py's recipes: Llama / Mistral, Llama 3 with RoPE factors, Qwen2 with Q/K/V biases, Qwen3
with per-head Q/K norms, Gemma 2 with soft-capping and alternating windows, Gemma 3 with windowed layers on their own
RoPE base, Phi-3 with fused weights and long-context RoPE factors): the logits of a prefilled chunk and of decode
steps, KL below 1e-5 and the same argmax at every position. A hardware adapter runs every recipe; a software
rasteriser, where each recipe's kernels take tens of seconds to compile, the two whose switches nothing else here
covers (Qwen2: biases and a GQA group of 7; Phi-3: fused weights and the factor on RoPE's cos and sin)."""
from __future__ import annotations

import numpy as np
import pytest

from kvviz.forward.model import GpuForward, GpuRunner
from kvviz.live.metrics import kl_logits
from kvviz.sources.gguf_llama import load_gguf_llama
from kvviz.sources.llama_numpy import LlamaRunner

random_gguf = pytest.importorskip("kvviz.sources.random_gguf", reason="the architecture recipes are not in this tree")

pytestmark = pytest.mark.gpu
SOFTWARE_RECIPES = ("qwen2", "phi3")


@pytest.mark.parametrize("name", sorted(random_gguf.RECIPES))
def test_every_architecture_matches_the_numpy_forward(rt, tmp_path, name):
    recipe = random_gguf.RECIPES[name]
    if rt.summary.is_software and name not in SOFTWARE_RECIPES:
        pytest.skip(f"{name}: the hardware run covers it (tests/test_forward_model.py covers the Llama forward here)")
    path = tmp_path / f"{name}.gguf"
    random_gguf.write_random_gguf(recipe, path, "F32")
    model = load_gguf_llama(path)
    ids = [int(i) for i in np.random.default_rng(1).integers(3, model.config.vocab, 22)]
    n, g = LlamaRunner(model, record=False), GpuRunner(model, forward=GpuForward(model, rt))
    ref, got = n.prefill(ids[:20], all_logits=True), g.prefill(ids[:20], all_logits=True)
    for j in ids[20:]:
        ref = np.concatenate([ref, n.step(j)[None]])
        got = np.concatenate([got, g.step(j)[None]])
    kls = [kl_logits(a, b) for a, b in zip(ref, got)]
    assert max(kls) < 1e-5, f"{name}: KL up to {max(kls):.3g}"
    assert (ref.argmax(-1) == got.argmax(-1)).all()
