"""kvviz eval against llama.cpp itself, on SmolLM2: tests/data/llamacpp_kv_smollm2.npz holds llama.cpp's per-position
values over the same text and chunking (its f32 cache without flash attention, its q8_0 and q4_0 caches as it runs
them by default), written by tools/llamacpp_kv_caches.py (the command is in the file). llama.cpp ran the F32 copy of
the installed Q4_1 GGUF; kvviz dequantises that GGUF to the same float32 weights, so both run the same model."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from kvviz.quality import stats as qs
from kvviz.quality.baseline import BaselineStore
from kvviz.quality.evaluate import EvalSettings, evaluate, prepare
from kvviz.quality.run import baseline_identity, EvalModel

FIXTURE = Path(__file__).parent / "data" / "llamacpp_kv_smollm2.npz"

pytestmark = [pytest.mark.gpu, pytest.mark.slow]


def llama_cpp():
    z = np.load(FIXTURE)
    return json.loads(str(z["meta"])), {k: z[k] for k in z.files if k != "meta"}


def llama_cpp_stats(arrays, run):
    nll_b = arrays["f32/nll"].astype(np.float64)
    n = nll_b.size
    v = qs.PositionValues(arrays[f"{run}/nll"].astype(np.float64), nll_b, arrays[f"{run}/kld"].astype(np.float64),
                          arrays[f"{run}/same_top"].astype(bool), arrays[f"{run}/p_diff"].astype(np.float64),
                          np.zeros(n, np.int64), np.zeros(n, np.int64))
    return qs.summarize(v)


def test_kvviz_is_llama_cpp_on_smollm2(smollm2, session, ctx, tmp_path):
    meta, ll = llama_cpp()
    s = EvalSettings(ctx=meta["ctx"], chunks=meta["chunks"], methods=("q8_0:llama_cpp=cpu", "q4_0:llama_cpp=cpu"),
                     error_stride=0)
    prep = prepare(s, load_model=session.load_model)  # as the Quality panel prepares it: the Session's SmolLM2
    ch = prep.chunking
    # the same text, tokenised the same way, cut the same way
    assert np.array_equal(ch.tokens[: ll["tokens"].size], ll["tokens"]) and ch.scored == meta["scored"]
    res = evaluate(prep, ctx, cache_root=tmp_path)
    em = EvalModel(prep.model, prep.path, ch, ctx)
    store = BaselineStore.open(baseline_identity(em, res["model"]["sha256"]), tmp_path)

    # the f32 baseline: llama.cpp's f32 cache, position by position, and its PPL within llama.cpp's error
    nll_ll = ll["f32/nll"].astype(np.float64)
    nll_kv = store.arrays["nll"]
    assert np.abs(nll_kv - nll_ll).max() < 2e-3
    assert np.mean(store.arrays["top"] == ll["f32/top"]) >= 0.95
    ppl_ll, err_ll = qs.mean_and_error(nll_ll)
    assert abs(np.exp(nll_kv.mean()) - np.exp(ppl_ll)) <= np.exp(ppl_ll) * err_ll

    # q8_0 / q4_0 as llama.cpp runs them: kvviz's mean KLD and same-top-1 within llama.cpp's error bars
    rows = {r["spec"].split(":")[0]: r for r in res["rows"]}
    for run in ("q8_0", "q4_0"):
        want = llama_cpp_stats(ll, run)
        got = rows[run]
        assert "error" not in got, got.get("error")
        assert abs(got["kld_mean"] - want["kld_mean"]) <= want["kld_err"], (run, got["kld_mean"], want)
        assert abs(got["same_top"] - want["same_top"]) <= 2 * want["same_top_err"], (run, got["same_top"], want)
    # the setting matters: llama.cpp's q4_0 without its rotation lies far outside those error bars
    assert llama_cpp_stats(ll, "q4_0-unrotated")["kld_mean"] > llama_cpp_stats(ll, "q4_0")["kld_mean"] + 3 * \
        llama_cpp_stats(ll, "q4_0")["kld_err"]
