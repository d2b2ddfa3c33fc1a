"""`kvviz eval` (kvviz/quality): llama.cpp's statistics and chunking, the stored baseline, the passes over the tiny
random GGUF of tests/tiny_llama.py, the outputs (strict JSON, CSV, Markdown, the run history), and the host-side
transforms of a method (Hadamard rotation, llama.cpp's way of running its types) against a numpy emulation."""
from __future__ import annotations

import csv
import json
import math
import sqlite3

import numpy as np
import pytest

from kvviz import cli
from kvviz.errors import InvalidInput, UnsupportedShape
from kvviz.families.registry import get_method, registry
from kvviz.history.db import MIGRATIONS, SCHEMA_VERSION, HistoryDB, HistoryError
from kvviz.methods.transform import (TransformedMethod, gguf_order, hadamard, k_block, q8_0_round_trip,
                                     transform_of)
from kvviz.paging import make_batch
from kvviz.quality import baseline as qb, report, run as qr, stats as qs
from kvviz.quality.evaluate import EvalSettings, default_ctx, evaluate, prepare
from kvviz.quality.text import chunk_text
from kvviz.sources.gguf_llama import permute_llamacpp

from tiny_llama import write_tiny_gguf


# ------------------------------------------------------------------------------------------------ statistics
def _llama_cpp_sums(nll, nll_b, kld, same, dp):
    """llama.cpp's kl_divergence_result sums and final formulas, written out as its C++ does them."""
    n = len(nll)

    def mu(s, s2):
        f = s / n
        df = s2 / n - f * f
        return f, (math.sqrt(df / (n - 1)) if df > 0 and n > 10 else 0.0)

    lq = mu(sum(nll), sum(x * x for x in nll))
    lb = mu(sum(nll_b), sum(x * x for x in nll_b))
    cov = (sum(a * b for a, b in zip(nll, nll_b)) / n - (sum(nll) / n) * (sum(nll_b) / n)) / (n - 1)
    mse = mu(sum(x * x for x in dp), sum(x ** 4 for x in dp))
    top = sum(same) / n
    return {"ppl": math.exp(lq[0]), "ppl_err": math.exp(lq[0]) * lq[1], "ln_ppl_ratio": lq[0] - lb[0],
            "ln_ppl_ratio_err": math.sqrt(lq[1] ** 2 + lb[1] ** 2 - 2 * cov), "kld_mean": mu(sum(kld), sum(
                x * x for x in kld))[0], "kld_err": mu(sum(kld), sum(x * x for x in kld))[1],
            "dp_rms": math.sqrt(mse[0]), "dp_rms_err": 0.5 / math.sqrt(mse[0]) * mse[1], "same_top": top,
            "same_top_err": math.sqrt(top * (1 - top) / (n - 1))}


def test_statistics_are_llama_cpps():
    rng = np.random.default_rng(3)
    n = 300
    nll_b = rng.gamma(2.0, 1.2, n)
    nll = nll_b + rng.normal(0.02, 0.05, n)
    kld = rng.lognormal(-6, 1.5, n)
    same = rng.random(n) < 0.93
    dp = rng.normal(0, 0.01, n)
    v = qs.PositionValues(nll, nll_b, kld, same, dp, np.arange(n) % 50 + 50, np.arange(n) // 50)
    got = qs.summarize(v, ctx=101)
    want = _llama_cpp_sums(nll.tolist(), nll_b.tolist(), kld.tolist(), same.tolist(), dp.tolist())
    for k, w in want.items():
        assert got[k] == pytest.approx(w, rel=1e-9, abs=1e-15), k
    ks = np.sort(kld)
    for f, key in ((0.5, "kld_median"), (0.9, "kld_p90"), (0.99, "kld_p99"), (0.999, "kld_p99_9")):
        assert got[key] == pytest.approx(np.percentile(ks, 100 * f)), key
    assert got["kld_max"] == ks[-1] and got["scored_positions"] == n
    bins = got["kld_by_position"]["bins"]
    assert sum(b["count"] for b in bins) == n and bins[0]["from"] == 50 and bins[-1]["to"] == 100
    h = got["kld_histogram"]
    assert sum(h["counts"]) + h["below"] + h["above"] == n
    # below 11 values there is no error (llama.cpp prints 0 there)
    small = qs.summarize(qs.PositionValues(*(a[:10] for a in (nll, nll_b, kld, same, dp, v.position, v.chunk))))
    assert math.isnan(small["kld_err"]) and math.isnan(small["ln_ppl_ratio_err"]) and small["kld_mean"] > 0


def test_percentile_interpolates_as_llama_cpp():
    v = np.array([0.0, 1.0, 2.0, 10.0])
    assert qs.percentile(v, 0.5) == 1.5 and qs.percentile(v, 0.999) == pytest.approx(10.0 - 8 * 0.003)
    assert qs.percentile(v, 0) == 0 and qs.percentile(v, 1) == 10


# ------------------------------------------------------------------------------------------------ chunking
def test_chunks_are_llama_cpps():
    toks = np.arange(100, 230)
    ch = chunk_text(toks, 32, 4096, bos_id=1)
    assert ch.n_chunks == 4 and ch.first == 16 and ch.scored_per_chunk == 15 and ch.scored == 60
    c1 = ch.chunk(1)
    assert c1[0] == 1 and list(c1[1:]) == list(range(133, 164))  # BOS replaces the chunk's first token
    assert list(ch.targets(1)) == list(range(149, 164))  # logits of positions 16..30 score tokens 17..31
    assert list(ch.positions()) == list(range(16, 31))
    assert chunk_text(toks, 32, 4096, chunks=2).n_chunks == 2
    assert chunk_text(toks, 32, 4096).chunk(0)[0] == 100  # no BOS: the text's own first token
    with pytest.raises(InvalidInput, match="needs at least 128"):
        chunk_text(toks[:100], 64, 4096)
    with pytest.raises(InvalidInput, match="past the model's context"):
        chunk_text(toks, 64, 48)
    specs = EvalSettings(methods=("q8_0:llama_cpp=cpu", "all", "q8_0")).method_specs()
    assert specs == ["q8_0:llama_cpp=cpu"] + sorted(registry()) and EvalSettings().method_specs() == sorted(registry())
    assert default_ctx(7639, 8192) == 2048 and default_ctx(7639, 1024) == 1024 and default_ctx(300, 8192) == 128


# ------------------------------------------------------------------------------------------------ baseline
def test_stored_baseline_is_within_its_code_step(tmp_path):
    rng = np.random.default_rng(0)
    logits = rng.normal(0, 4, (20, 300))
    logits[3] = 0.0  # a flat row
    logits[4, 7] = 60.0  # a row most of whose values lie past the code range
    lp = qs.log_softmax(logits)
    codes, top = qb.encode(lp)
    raw = codes * qb.STEP + top[:, None] - qb.RANGE
    inside = lp - top[:, None] > -qb.RANGE
    assert np.abs(raw - lp)[inside].max() <= qb.STEP / 2 + 1e-12
    back = qb.decode(codes, top)
    assert np.allclose(np.exp(back).sum(1), 1.0)
    ident = {"model_sha256": "x", "tokens_sha256": "y", "ctx": 8, "n_chunks": 2}
    w = qb.BaselineWriter(ident, 20, 300, {"note": "test"}, tmp_path)
    tok = rng.integers(0, 300, 20)
    for c in range(2):
        w.add(lp[10 * c:10 * c + 10], tok[10 * c:10 * c + 10], np.arange(10), c)
    assert qb.BaselineStore.open(ident, tmp_path) is None  # not complete yet: never read
    store = w.finish()
    assert 0 <= store.kld_floor < 1e-7
    idx, rows = qb.BaselineStore.open(ident, tmp_path).rows(1)
    assert list(idx) == list(range(10, 20)) and np.array_equal(rows.top, np.argmax(lp[10:], 1))
    assert np.allclose(rows.nll, -lp[np.arange(10, 20), tok[10:]])
    assert qb.BaselineStore.open(dict(ident, ctx=9), tmp_path) is None


# ------------------------------------------------------------------------------------------------ transforms
def test_hadamard_and_gguf_order():
    for n in (64, 128):
        h = hadamard(n).astype(np.float64)
        assert np.allclose(h @ h, np.eye(n), atol=1e-6) and np.array_equal(h, h.T)
    assert (k_block(64), k_block(128), k_block(192), k_block(256)) == (64, 128, 64, 256)
    d = 64
    rows = np.arange(2 * d, dtype=np.float32).reshape(2 * d, 1)  # two heads of row indices
    perm = permute_llamacpp(rows, 2)[:d, 0]  # what llama.cpp's converter puts in the GGUF, head 0
    assert np.array_equal(perm, np.arange(d)[gguf_order(d)])
    with pytest.raises(UnsupportedShape):
        transform_of({"rotation": "hadamard"}, 96)
    with pytest.raises(InvalidInput, match="contradicts"):
        transform_of({"rotation": "hadamard", "llama_cpp": "cpu-unrotated"}, 64)
    t = transform_of({"llama_cpp": "cpu"}, 96)  # llama.cpp rotates no such head: the rest applies
    assert (t.k_rot, t.gguf, t.q8_query) == (0, True, True)


def _attention(q, k, v, scale):
    """q [H, D], k/v [T, kvh, D] float64 -> [H, D]."""
    g = q.shape[0] // k.shape[1]
    out = np.zeros_like(q)
    for h in range(q.shape[0]):
        s = k[:, h // g] @ q[h] * scale
        p = np.exp(s - s.max())
        out[h] = (p / p.sum()) @ v[:, h // g]
    return out


@pytest.mark.parametrize("spec", [{"llama_cpp": "cpu"}, {"llama_cpp": "cpu-unrotated"}, {"rotation": "hadamard"}])
def test_llama_cpp_setting_matches_its_numpy_emulation(ctx, spec):
    """q8_0 as llama.cpp's CPU backend runs it: K = q8_0(H P k), V = q8_0(H v), scores against q8_0(H P q), the
    output rotated back, all in numpy with gguf's q8_0 (which kvviz's writer matches bit for bit)."""
    from gguf import GGMLQuantizationType as T
    from gguf.quants import dequantize, quantize

    rng = np.random.default_rng(5)
    n, kvh, heads, d = 45, 2, 4, 64
    key = rng.normal(0, 1, (n, kvh, d)).astype(np.float32)
    value = rng.normal(0, 1, (n, kvh, d)).astype(np.float32)
    q = rng.normal(0, 1, (1, heads, d)).astype(np.float32)
    m = get_method("q8_0", **spec)
    assert isinstance(m, TransformedMethod) and m.id == "q8_0" and m.options() == spec
    batch = make_batch([n], 16)
    out = m.attend(ctx, m.quantize(ctx, batch, key, value), batch, q, 0.125)[0]

    rot = spec.get("llama_cpp") != "cpu-unrotated"
    order = gguf_order(d) if "llama_cpp" in spec else np.arange(d)
    h = hadamard(64).astype(np.float64) if rot else np.eye(64)

    def q8(x):
        return dequantize(quantize(np.ascontiguousarray(x, np.float32).reshape(-1, d), T.Q8_0), T.Q8_0).reshape(x.shape)

    kk = q8(key[..., order].astype(np.float64) @ h)
    vv = q8(value.astype(np.float64) @ h)
    qq = q[0][..., order].astype(np.float64) @ h
    if "llama_cpp" in spec:
        qq = q8(qq)
    want = _attention(qq.astype(np.float64), kk.astype(np.float64), vv.astype(np.float64), 0.125) @ h
    assert np.abs(out - want).max() < 2e-5 * np.abs(want).max()
    # the reconstruction of K is back in the model's order and basis
    rec = m.dequantised_rows(ctx, m.quantize(ctx, batch, key, value), batch, "K")[:n]
    assert np.abs(rec - key).max() < 0.05
    assert "as llama.cpp" in m.label or "Hadamard" in m.label
    assert "host" in m.layouts(d, 16)[0].description


def test_q8_0_round_trip_is_ggmls():
    """Bit for bit gguf.quants' Q8_0 quantise and dequantise (ggml's arithmetic): random rows, an all-zero block,
    codes at exact halves (roundf: away from zero), scales below f16's smallest and past its range."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize, quantize

    x = np.linspace(-3, 3, 64, dtype=np.float32).reshape(2, 32)
    d = np.abs(x).max(axis=1, keepdims=True) / 127
    assert np.allclose(q8_0_round_trip(x), np.round(x / d) * d.astype(np.float16).astype(np.float32), atol=1e-6)
    rng = np.random.default_rng(3)
    a = rng.standard_normal((40, 3, 64)).astype(np.float32)
    a[0, 0, :32] = 0.0
    a[1, 0, :32] = np.arange(32, dtype=np.float32) - 15.5  # halves after the scale
    a[1, 0, 0] = 127.0
    a[2] *= 1e-30  # the scale flushes to 0 in f16
    for arr in (a, a * 1e5):
        with np.errstate(over="ignore"):
            want = dequantize(quantize(arr.reshape(-1, 64), GGMLQuantizationType.Q8_0), GGMLQuantizationType.Q8_0)
        assert np.array_equal(q8_0_round_trip(arr), np.asarray(want, np.float32).reshape(arr.shape), equal_nan=True)


# ------------------------------------------------------------------------------------------------ passes
@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("eval") / "tiny.gguf"
    write_tiny_gguf(path, head_size=64, context_length=512)
    text = tmp_path_factory.mktemp("text") / "text.txt"
    text.write_text("The quick brown fox jumps over the lazy dog, and the cat sat on the mat. " * 8)
    return str(path), str(text)


@pytest.mark.gpu
def test_eval_passes_baseline_reuse_and_outputs(tiny, ctx, tmp_path):
    path, text = tiny
    s = EvalSettings(model_path=path, texts=(text,), ctx=32, chunks=3, methods=("f32", "q8_0", "turboquant"),
                     parts=("kv", "v"), error_stride=8)
    prep = prepare(s)
    assert prep.chunking.scored == 45 and [r.name for r in prep.runs] == [
        "f32", "q8_0", "q8_0 (V only)", "turboquant", "turboquant (V only)"]
    seen = []
    res = evaluate(prep, ctx, cache_root=tmp_path, on_row=lambda r, v: seen.append((r, v)))
    assert not res["baseline"]["reused"] and 0 <= res["baseline"]["kld_floor"] < 1e-7
    rows = {(r["spec"], r["part"]): r for r in res["rows"]}
    f32 = rows[("f32", "kv")]
    # the baseline's own cache again: the same logits, so nothing but the stored distributions' resolution
    assert f32["ppl"] == pytest.approx(f32["ppl_base"], rel=1e-6) and f32["same_top"] == 1.0
    assert f32["kld_max"] < 1e-6 and max(f32["layer_error"]) < 1e-5
    q8 = rows[("q8_0", "kv")]
    assert q8["scored_positions"] == 45 and q8["kld_mean"] > 10 * f32["kld_mean"] and 0 < q8["bits_per_element"] < 10
    assert q8["kld_err"] > 0 and q8["kld_p99"] <= q8["kld_max"] and len(q8["layer_error"]) == 2
    assert 0 < rows[("q8_0", "v")]["kld_mean"] < q8["kld_mean"] * 2
    assert "no reconstruction" in rows[("turboquant", "v")]["error"]
    assert len(seen) == 5 and len(seen[1][1]) == 45
    again = evaluate(prepare(EvalSettings(model_path=path, texts=(text,), ctx=32, chunks=3, methods=("q8_0",))),
                     ctx, cache_root=tmp_path)
    assert again["baseline"]["reused"] and again["rows"][0]["kld_mean"] == pytest.approx(q8["kld_mean"], rel=1e-9)

    # strict JSON, CSV and Markdown; the run history gives the same rows back
    out = tmp_path / "r"
    report.write_json(res, f"{out}.json")
    json.loads((tmp_path / "r.json").read_text(), parse_constant=lambda c: pytest.fail(f"non-strict {c}"))
    report.write_csv(res, f"{out}.csv")
    lines = list(csv.reader(open(f"{out}.csv")))
    assert lines[0][0] == "spec" and len(lines[1]) == len(report.CSV_COLUMNS) and "nan" not in open(f"{out}.csv").read()
    md = report.markdown(res)
    assert "| `q8_0` | K+V |" in md and "45 scored positions" in md
    with HistoryDB() as db:
        rid = db.record_eval(res)
        back = db.eval_result(rid)
        assert [r["spec"] for r in back["rows"]] == [r["spec"] for r in res["rows"]]
        assert back["rows"][1]["kld_mean"] == q8["kld_mean"] and back["chunking"] == res["chunking"]
        assert db.runs()[0].source == "eval"
        with pytest.raises(HistoryError, match="no kernel timings"):
            db.pin(rid)


@pytest.mark.gpu
def test_each_layer_alone(tiny, ctx, tmp_path):
    path, text = tiny
    res = evaluate(prepare(EvalSettings(model_path=path, texts=(text,), ctx=32, chunks=2, methods=("q4_0",),
                                        layers=True, error_stride=0)), ctx, cache_root=tmp_path)
    lay = res["layers"]
    assert [r["layer"] for r in lay] == [0, 1] and all(r["kld_mean"] > 0 for r in lay)
    assert all(math.isnan(e) for e in res["rows"][0]["layer_error"])  # error_stride 0: not measured
    assert [r["layer"] for r in report.layer_rows(res)] == [0, 1]


@pytest.mark.gpu
def test_the_gpu_and_numpy_forwards_give_the_same_statistics(tiny, ctx, tmp_path):
    """Both forwards are float32 in different summation orders (the GPU's tiled products and reductions, numpy's
    BLAS), so their logits differ by float32 rounding (KL below 1e-5 a position, tests/test_forward_model.py): the
    baseline's PPL within 1e-5 relative. Through a quantised cache more: a key or value one rounding apart can land
    on the other side of a quantisation step, which moves that element by a whole code step (q4_0's are coarse), so
    a method's means (PPL, mean KLD, RMS dp) within 1e-3 relative and one position's extremes (p99, max KLD)
    within 1e-2. The baseline's identity is the same: the store the numpy forward wrote serves the GPU run, and
    says which forward computed it."""
    path, text = tiny
    common = dict(model_path=path, texts=(text,), ctx=32, chunks=3, methods=("f32", "q8_0", "q4_0"), error_stride=8)
    res = {fw: evaluate(prepare(EvalSettings(**common, forward=fw)), ctx, cache_root=tmp_path / fw)
           for fw in ("numpy", "gpu")}
    assert res["gpu"]["forward"]["path"] == "gpu"
    assert res["numpy"]["forward"] == {"path": "numpy", "reason": "asked for"}
    for fw in ("numpy", "gpu"):
        assert not res[fw]["baseline"]["reused"] and res[fw]["baseline"]["forward"].startswith(f"forward: {fw} (")
        assert all(r["forward"] == fw for r in res[fw]["rows"])
    for a, b in zip(res["numpy"]["rows"], res["gpu"]["rows"]):
        assert a["spec"] == b["spec"] and a["scored_positions"] == b["scored_positions"] == 45
        assert b["ppl_base"] == pytest.approx(a["ppl_base"], rel=1e-5)
        for k, rel in (("ppl", 1e-3), ("kld_mean", 1e-3), ("dp_rms", 1e-3), ("kld_p99", 1e-2), ("kld_max", 1e-2)):
            assert b[k] == pytest.approx(a[k], rel=rel, abs=1e-7), (a["spec"], k)
        assert abs(b["same_top"] - a["same_top"]) <= 1 / 45, a["spec"]  # one position's top token at most
        assert np.allclose(b["layer_error"], a["layer_error"], rtol=1e-2, atol=1e-6), a["spec"]
    f32 = res["gpu"]["rows"][0]
    assert f32["ppl"] == pytest.approx(f32["ppl_base"], rel=1e-5) and f32["kld_max"] < 1e-6  # its own baseline
    assert res["gpu"]["rows"][1]["kld_mean"] > 1e3 * f32["kld_mean"]  # q8_0 far above the floor
    # the GPU forward against the baseline the numpy forward stored: reused, and still the floor for f32
    cross = evaluate(prepare(EvalSettings(**dict(common, methods=("f32",)), forward="gpu")), ctx,
                     cache_root=tmp_path / "numpy")
    assert cross["baseline"]["reused"] and cross["baseline"]["forward"] == "forward: numpy (asked for)"
    assert cross["rows"][0]["kld_mean"] < 1e-6 and cross["rows"][0]["same_top"] == 1.0
    assert "Baseline forward: numpy (asked for)." in report.describe(cross)[1]
    assert "Baseline forward" not in report.describe(res["gpu"])[1] and "Forward: gpu" in report.describe(res["gpu"])[1]


@pytest.mark.gpu
def test_the_gpu_forward_keeps_a_prefill_on_the_device(tiny, ctx, tmp_path, monkeypatch):
    """On the GPU forward a layer's attention that is one prefill stays on the device (copied into the forward's
    activations there; its checked rows read after the chunk): the same numbers, to the bit, as reading it back and
    writing it again."""
    from kvviz.gpu.runtime import DeviceRows
    from kvviz.methods.live_cache import LiveCache

    path, text = tiny
    common = dict(model_path=path, texts=(text,), ctx=32, chunks=2, methods=("f32", "q8_0"), error_stride=8,
                  forward="gpu")
    later = []
    finish = qr.ChunkAttention.finish

    def counted(self):
        later.append(sum(isinstance(c[5], DeviceRows) for c in self._checks))
        return finish(self)

    monkeypatch.setattr(qr.ChunkAttention, "finish", counted)
    on_device = evaluate(prepare(EvalSettings(**common)), ctx, cache_root=tmp_path / "a")
    assert sum(later) > 0
    monkeypatch.setattr(LiveCache, "attend_causal_on_device", lambda self, layer, q, start:
                        self.attend_causal(layer, q, start))
    later.clear()
    host = evaluate(prepare(EvalSettings(**common)), ctx, cache_root=tmp_path / "b")
    assert sum(later) == 0
    for a, b in zip(on_device["rows"], host["rows"]):
        for k in ("ppl", "ppl_base", "kld_mean", "kld_max", "same_top", "layer_error"):
            assert a[k] == b[k], (a["spec"], k)


@pytest.mark.gpu
def test_kivi_gives_the_same_numbers_on_both_forwards_past_one_piece(ctx, tmp_path):
    """A chunk of 640 tokens goes to the caches in the eval's pieces (512, then 128) on either forward (the GPU
    forward would take it whole): KIVI keeps its recent window exact relative to what a piece has written, so a piece
    of another size gives other numbers (the whole chunk in one piece moves the perplexity by percents here). The
    scored half of the chunk (from position 320) spans both pieces. The same tolerances as above. One stored baseline
    serves both (as it does for users): the GPU forward's pass is KIVI's alone."""
    path, text = tmp_path / "tiny.gguf", tmp_path / "text.txt"
    write_tiny_gguf(path, head_size=64, context_length=1024)
    text.write_text("The quick brown fox jumps over the lazy dog, and the cat sat on the mat. " * 34)
    rows = {}
    for fw in ("numpy", "gpu"):
        s = EvalSettings(model_path=str(path), texts=(str(text),), ctx=640, chunks=1, methods=("kivi",),
                         error_stride=0, forward=fw)
        res = evaluate(prepare(s), ctx, cache_root=tmp_path / "cache")
        rows[fw] = res["rows"][0]
    assert qr.PIECE == 512 and rows["gpu"]["scored_positions"] == 319 and rows["gpu"]["kld_mean"] > 1
    for k in ("ppl", "kld_mean"):
        assert rows["gpu"][k] == pytest.approx(rows["numpy"][k], rel=1e-3), k


# ------------------------------------------------------------------------------------------------ the command
@pytest.mark.parametrize("argv, match", [
    (["--methods", "nope"], "unknown method 'nope'"),
    (["--methods", "q8_0:bits=3"], "has no option 'bits'"),
    (["--methods", "int8_token:llama_cpp=cpu"], "has no option 'llama_cpp'"),
    (["--parts", "kv,x"], "--parts"),
    (["--text", "/nonexistent/text"], "no such file"),
    (["--ctx", "100000"], "past the model's context"),
])
def test_eval_refuses_bad_input_in_one_line(argv, match, tiny, capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("KVVIZ_CACHE_DIR", str(tmp_path))
    path, text = tiny
    extra = [] if "--text" in argv else ["--text", text]
    rc = cli.main(["eval", "--model", path, *extra, *argv])
    err = capsys.readouterr().err
    assert rc == 2 and match in err and err.count("\n") == 1 and "Traceback" not in err


def test_eval_refuses_a_forward_it_does_not_know_in_one_line(tiny, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["eval", "--model", tiny[0], "--forward", "cuda"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "--forward" in err and "'cuda'" in err and err.count("\n") == 1
    with pytest.raises(InvalidInput, match="--forward 'cuda'; choose one of auto, gpu, numpy"):
        EvalSettings(forward="cuda").validate()


def test_eval_refuses_a_text_that_is_not_utf8(tiny, capsys, tmp_path):
    bad = tmp_path / "latin1.txt"
    bad.write_bytes("caf\xe9 ".encode("latin-1") * 50)
    assert cli.main(["eval", "--model", tiny[0], "--text", str(bad)]) == 2
    assert "not UTF-8" in capsys.readouterr().err


@pytest.mark.gpu
def test_eval_command_writes_its_files(tiny, capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("KVVIZ_CACHE_DIR", str(tmp_path / "cache"))
    path, text = tiny
    out = tmp_path / "run"
    rc = cli.main(["eval", "--model", path, "--text", text, "--ctx", "32", "--chunks", "2", "--methods",
                   "q8_0:llama_cpp=cpu", "--out", str(out), "--forward", "gpu"])
    printed = capsys.readouterr().out
    assert rc == 0 and all(len(ln) <= 100 or ln.strip().startswith("/") and " " not in ln.strip()  # a path whole
                           for ln in printed.splitlines())
    assert "q8_0:llama_cpp=cpu" in printed and "30 scored positions" in printed
    data = json.loads((tmp_path / "run.json").read_text())
    assert data["rows"][0]["spec"] == "q8_0:llama_cpp=cpu" and data["command"].startswith("kvviz eval --model")
    assert "forward: gpu (asked for" in printed and data["forward"]["path"] == "gpu"
    assert "Forward: gpu (asked for" in (tmp_path / "run.md").read_text()
    assert next(csv.DictReader(open(tmp_path / "run.csv")))["forward"] == "gpu"
    assert (tmp_path / "run.md").read_text().startswith("# KV-cache quality")
    assert cli.main(["runs", "show", str(data["history_run_id"])]) == 0
    assert "q8_0:llama_cpp=cpu" in capsys.readouterr().out
    # --reuse: the row already in run.json is kept, only the new method is measured
    rc = cli.main(["eval", "--model", path, "--text", text, "--ctx", "32", "--chunks", "2", "--methods",
                   "q8_0:llama_cpp=cpu,int8_token", "--out", str(out), "--reuse"])
    assert rc == 0 and "(reused)" in capsys.readouterr().out
    again = json.loads((tmp_path / "run.json").read_text())
    assert [r["spec"] for r in again["rows"]] == ["q8_0:llama_cpp=cpu", "int8_token"]
    assert again["rows"][0]["reused"] and again["rows"][0]["kld_mean"] == data["rows"][0]["kld_mean"]
    assert "reused" not in again["rows"][1]
    assert cli.main(["eval", "--model", path, "--reuse"]) == 2


def test_a_version_1_history_takes_evals(tmp_path):
    """A history written before evals were kept (schema 1) is migrated in place: its runs stay, evals go in."""
    path = tmp_path / "runs.sqlite3"
    c = sqlite3.connect(path)
    c.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
    MIGRATIONS[1](c)
    c.execute("INSERT INTO meta VALUES ('schema_version', '1')")
    c.execute("INSERT INTO runs(created, source, adapter, adapter_json) VALUES ('2026-01-01T00:00:00Z', 'bench', "
              "'gpu', '{}')")
    c.commit()
    c.close()
    row = {"spec": "q8_0", "part": "kv", "part_label": "K+V", "layer": None, "scored_positions": 10, "kld_mean": 0.5,
           "kld_err": float("nan")}
    with HistoryDB(path) as db:
        assert db.schema_version() == SCHEMA_VERSION == 2 and len(db.runs()) == 1
        rid = db.record_eval({"adapter": "gpu", "rows": [row], "layers": [], "chunking": {"scored": 10}})
        back = db.eval_result(rid)
        assert back["rows"][0]["kld_mean"] == 0.5 and back["rows"][0]["kld_err"] is None  # strict JSON: NaN is null
        with pytest.raises(HistoryError, match="not an eval"):
            db.eval_result(1)


@pytest.mark.gpu
def test_rows_taken_a_few_at_a_time_give_the_same_statistics(tiny, ctx, tmp_path, monkeypatch):
    path, text = tiny
    s = EvalSettings(model_path=path, texts=(text,), ctx=32, chunks=2, methods=("q8_0",), error_stride=0)
    whole = evaluate(prepare(s), ctx, cache_root=tmp_path / "a")["rows"][0]
    monkeypatch.setattr(qr, "ROWS", 4)  # 15 scored positions a chunk: 4 slices, the last one short
    sliced = evaluate(prepare(s), ctx, cache_root=tmp_path / "b")["rows"][0]
    for k in ("kld_mean", "kld_err", "kld_p99", "ppl", "same_top", "dp_rms"):
        assert sliced[k] == pytest.approx(whole[k], rel=1e-12, abs=1e-15), k


@pytest.mark.gpu
def test_soft_capped_model(ctx, tmp_path):
    """The random Gemma 2 of the architecture tests (attention logits soft-capped at 5, layers 0 and 2 in windows of
    8): its eval runs every chunk through the capped causal prefill. The f32 pass's attention output is within 1e-5
    (relative RMS, float32 rounding) of numpy's float32 capped attention over the same q, K, V in every layer, and it
    reproduces the stored baseline; q8_0's statistics are finite. A context of 8: a windowed layer's ring takes a chunk
    that ends within its window."""
    from kvviz.sources.random_gguf import RECIPES, write_random_gguf

    path = tmp_path / "gemma2.gguf"
    write_random_gguf(RECIPES["gemma2"], path)
    text = tmp_path / "text.txt"
    text.write_text("The quick brown fox jumps over the lazy dog, and the cat sat on the mat. " * 4)
    res = evaluate(prepare(EvalSettings(model_path=str(path), texts=(str(text),), ctx=8, chunks=3,
                                        methods=("f32", "q8_0"), error_stride=2)), ctx, cache_root=tmp_path / "c")
    f32, q8 = res["rows"]
    assert max(f32["layer_error"]) < 1e-5 and f32["kld_max"] < 1e-6 and f32["same_top"] == 1.0
    assert q8["scored_positions"] == f32["scored_positions"] == 9 and "error" not in q8
    stats = ("kld_mean", "kld_max", "ppl", "ppl_base", "same_top", "dp_rms")
    assert all(math.isfinite(q8[k]) for k in stats) and q8["kld_mean"] > f32["kld_mean"]
    assert all(math.isfinite(e) and 0 < e < 0.1 for e in q8["layer_error"])


def _device_counts(monkeypatch):
    """Counts of the layers whose q/K/V the eval took on the device (ChunkAttention.device returned their attention)
    and of those it handed back to the host (None)."""
    counts = {"device": 0, "host": 0}
    device = qr.ChunkAttention.device

    def counted(self, *args):
        out = device(self, *args)
        counts["host" if out is None else "device"] += 1
        return out

    monkeypatch.setattr(qr.ChunkAttention, "device", counted)
    return counts


@pytest.mark.gpu
def test_the_gpu_forward_hands_q_k_v_over_on_the_device(tiny, ctx, tmp_path, monkeypatch):
    """On the GPU forward a layer whose cache writes K/V from the device (the f32 baseline, the fast writers that
    take device rows) never reads q, K or V back during the chunk: the same statistics and layer errors, to the bit,
    as through the host (the hand-off removed)."""
    path, text = tiny
    common = dict(model_path=path, texts=(text,), ctx=32, chunks=2, error_stride=8, forward="gpu",
                  methods=("f32", "f16", "int8_token", "int4_group", "q8_0", "q4_0", "nvfp4", "turboquant"))
    counts = _device_counts(monkeypatch)
    on_device = evaluate(prepare(EvalSettings(**common)), ctx, cache_root=tmp_path / "a")
    assert counts["device"] > 0 and counts["host"] == 0
    monkeypatch.delattr(qr.ChunkAttention, "device")
    host = evaluate(prepare(EvalSettings(**common)), ctx, cache_root=tmp_path / "b")
    assert [r["spec"] for r in on_device["rows"]] == [r["spec"] for r in host["rows"]]
    for a, b in zip(on_device["rows"], host["rows"]):
        for k in ("ppl", "ppl_base", "kld_mean", "kld_max", "same_top", "layer_error"):
            assert a[k] == b[k], (a["spec"], k)


@pytest.mark.gpu
@pytest.mark.parametrize("spec", ["q8_0:llama_cpp=cpu", "kivi"])
def test_a_cache_that_cannot_take_device_rows_falls_back_to_the_host(tiny, ctx, tmp_path, monkeypatch, spec):
    """A method whose cache cannot write K/V from the device (the llama.cpp CPU transform runs on the host; KIVI's
    cache keeps host state) takes the host path layer by layer: the same statistics as with no hand-off at all."""
    path, text = tiny
    common = dict(model_path=path, texts=(text,), ctx=32, chunks=1, error_stride=8, forward="gpu", methods=(spec,))
    counts = _device_counts(monkeypatch)
    tried = evaluate(prepare(EvalSettings(**common)), ctx, cache_root=tmp_path / "a")
    assert counts["host"] > 0
    monkeypatch.delattr(qr.ChunkAttention, "device")
    host = evaluate(prepare(EvalSettings(**common)), ctx, cache_root=tmp_path / "b")
    for a, b in zip(tried["rows"], host["rows"]):
        for k in ("ppl", "kld_mean", "kld_max", "same_top", "layer_error"):
            assert a[k] == b[k], (a["spec"], k)
