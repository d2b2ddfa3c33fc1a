"""Never a wrong number in silence: overflowing logits, non-finite results, silent degradation.

Overflowing logits are refused before dispatch (Session.compute and `kvviz report` say why and exit
non-zero, never a KL of 0); the metrics refuse NaN/Inf instead of turning them into a perfect score;
a GPU result read back with NaN/Inf is an error naming the kernel; a range a method cannot represent
(int8_token's scale floor, TurboQuant's 1e-12 threshold and f16 norms) is a warning in the results,
the report and the CLI's output.
"""
import json

import numpy as np
import pytest

from kvviz.analysis.session import SessionConfig

pytestmark = pytest.mark.gpu

T, H, KVH, D = 16, 2, 1, 64


def _dump(tmp_path, name, k_mag=1.0, v_mag=1.0, q_mag=1.0, k=None, v=None):
    """A one-layer KV dump [1, kvh, T, D] (q [1, H, T, D]) of standard normals times the magnitudes."""
    from kvviz.sources.kv_files import save_kv

    rng = np.random.default_rng(3)
    k = (rng.standard_normal((1, KVH, T, D)) * k_mag).astype(np.float32) if k is None else k
    v = (rng.standard_normal((1, KVH, T, D)) * v_mag).astype(np.float32) if v is None else v
    q = (rng.standard_normal((1, H, T, D)) * q_mag).astype(np.float32)
    return str(save_kv(tmp_path / f"{name}.safetensors", k, v, q))


def _cfg(path, method="int8_seed", **kw):
    return SessionConfig(source="kvfile", kv_file=path, method=method, num_heads=H, num_kv_heads=KVH,
                         head_size=D, timing_runs=3, **kw)


# ------------------------------------------------------------------ overflow
def test_overflowing_logits_are_refused_before_dispatch(session, tmp_path):
    from kvviz.errors import InvalidInput

    path = _dump(tmp_path, "ovf", k_mag=1e20, q_mag=1e20)  # finite inputs, logits ~1e40
    with pytest.raises(InvalidInput, match=r"overflow float32 for sequence 0 head \d") as ei:
        session.compute(_cfg(path))
    assert "3.4e+38" in str(ei.value) and "nothing was dispatched" in ei.value.hint.lower()
    # large but representable logits (~1e35) still compute, with finite metrics
    res = session.compute(_cfg(_dump(tmp_path, "big", k_mag=1e17, q_mag=1e17)))
    assert all(np.isfinite(v) for v in res.metrics.summary().values())
    assert np.isfinite(res.w_ref).all() and np.isfinite(res.out_q).all()


def test_logit_check_is_refined_by_the_exact_products():
    """The cheap bound max|k| * sum|q| only triggers the per-position pass: orthogonal huge q and k
    (q.k = 0) pass; one head of a GQA group overflowing is named."""
    from kvviz.analysis.numeric import check_logits, quick_bound
    from kvviz.errors import InvalidInput
    from kvviz.paging import make_batch

    batch = make_batch([5, 3], 4, None, "scattered", 0)
    key = np.zeros((batch.num_tokens, 1, 8), np.float32)
    key[:, 0, 0] = 1e20
    q = np.zeros((2, 2, 8), np.float32)
    q[:, :, 1] = 1e20
    assert quick_bound(batch, key, q, 0.35) > 3.4e38
    check_logits(batch, key, q, 0.35)  # every product q_i k_i is 0: nothing overflows
    q[1, 1, 0] = 1e19  # sequence 1, head 1: 1e39
    with pytest.raises(InvalidInput, match=r"sequence 1 head 1: \|logit\| bound 1e\+39 > 3.4e\+38 .*1 of 4"):
        check_logits(batch, key, q, 0.35)


def test_kvviz_report_refuses_overflow_with_nonzero_exit(tmp_path, capsys):
    from kvviz.cli import main

    path = _dump(tmp_path, "ovf", k_mag=1e20, q_mag=1e20)
    out = tmp_path / "rep"
    rc = main(["report", "--out", str(out), "--set", "source=kvfile", "--set", f"kv_file={path}",
               "--set", f"num_heads={H}", "--set", "timing_runs=3"])
    err = capsys.readouterr()
    assert rc != 0
    assert "overflow float32" in err.err
    assert not (out / "report.json").exists() and not (out / "report.md").exists()
    assert "kl_mean" not in err.out


def test_metrics_refuse_non_finite_inputs():
    from kvviz.metrics import attention_metrics, kl_divergence
    from kvviz.errors import KvvizError, NonFiniteResult

    assert issubclass(NonFiniteResult, KvvizError)
    w = np.full((1, 2, 4), 0.25, np.float32)
    o = np.ones((1, 2, 8), np.float32)
    nan_w = np.full_like(w, np.nan)
    with pytest.raises(NonFiniteResult, match="quantised attention weights") as ei:
        attention_metrics(w, nan_w, o, o, [4])
    assert ei.value.hint
    with pytest.raises(NonFiniteResult, match="f32 attention weights"):
        attention_metrics(nan_w, nan_w, o, o, [4])  # once read as KL 0, top-8 overlap 1.0
    bad_o = o.copy()
    bad_o[0, 1, 3] = np.inf
    with pytest.raises(NonFiniteResult, match="quantised decode output"):
        attention_metrics(w, w, o, bad_o, [4])
    with pytest.raises(NonFiniteResult):
        kl_divergence(w, nan_w)
    m = attention_metrics(w, w, o, o, [4])  # finite inputs still measure
    assert m.kl.max() == 0 and m.topk_overlap.min() == 1.0


def test_non_finite_gpu_output_is_an_error_naming_the_kernel(session, tmp_path, monkeypatch):
    from kvviz.errors import NonFiniteResult
    from kvviz.families.int8.method_seed import Int8PerTokenSeed

    real = Int8PerTokenSeed.attend

    def poisoned(self, *a, **kw):
        out = real(self, *a, **kw).copy()
        out[0, 1, 5] = np.nan
        return out

    monkeypatch.setattr(Int8PerTokenSeed, "attend", poisoned)
    with pytest.raises(NonFiniteResult, match="paged_attn_q8") as ei:
        session.compute(_cfg(_dump(tmp_path, "ok")))
    assert "1 NaN/Inf" in str(ei.value) and "sequence 0 head 1" in str(ei.value)


def test_bench_row_with_non_finite_output_fails():
    from kvviz.bench import BenchShape, _max_err, _row

    shape = BenchShape("t", (4,), 2, 1, 64, 16)
    ref = np.zeros((1, 2, 64))
    out = np.zeros((1, 2, 64), np.float32)
    out[0, 0, 0] = np.nan
    err, note = _max_err(out, ref, "paged_attn_f32")
    r = _row("paged_attn_f32", "v", shape, None, 0, 1.0, err, 1e-3, {}, note)
    assert r["within_tolerance"] is False and r["note"].startswith("FAILED") and "paged_attn_f32" in r["note"]
    assert _max_err(np.zeros(3), np.zeros(3), "x") == (0.0, "")


# ------------------------------------------------------------------ silent degradation
def test_int8_token_scale_floor_warns_in_results_report_and_cli(tmp_path, capsys):
    from kvviz.cli import main

    path = _dump(tmp_path, "tiny", k_mag=1e-30, v_mag=1e-30)
    out = tmp_path / "rep"
    rc = main(["report", "--out", str(out), "--set", "source=kvfile", "--set", f"kv_file={path}",
               "--set", f"num_heads={H}", "--set", "timing_runs=3", "--set", "method=int8_token"])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    n = 2 * T * KVH
    msg = (f"int8_token: {n} of {n} token vectors (K {T * KVH}, V {T * KVH}) are nonzero but quantise to "
           "all-zero codes: their amax is below half the scale floor 1e-8")
    assert msg in cap.err
    assert msg in (out / "report.md").read_text()
    rep = json.load(open(out / "report.json"))
    assert any(msg in w for w in rep["warnings"])


def test_int8_token_warning_in_results_and_none_for_normal_data(session, tmp_path):
    rng = np.random.default_rng(1)
    k = rng.standard_normal((1, KVH, T, D)).astype(np.float32)
    k[0, 0, :4] *= 1e-30  # four all-zero key vectors
    k[0, 0, 4:6] *= 1e-7  # two key vectors under the floor, quantised coarsely but not to zero
    res = session.compute(_cfg(_dump(tmp_path, "mixed", k=k), method="int8_token"))
    assert any("int8_token: 4 of 32 token vectors (K 4, V 0) are nonzero but quantise to all-zero codes" in w
               for w in res.warnings), res.warnings
    assert any("int8_token: 2 of 32 token vectors" in w and "fewer code levels" in w for w in res.warnings), res.warnings
    assert res.summary_json()["warnings"] == res.warnings
    assert session.compute(_cfg(_dump(tmp_path, "normal"), method="int8_token")).warnings == []
    # the seed int8 path keeps such values: no warning there
    assert session.compute(_cfg(_dump(tmp_path, "mixed2", k=k), method="int8_seed")).warnings == []


def test_turboquant_tiny_vectors_warn(session, tmp_path):
    from kvviz.report.writer import report_markdown

    rng = np.random.default_rng(2)
    k = rng.standard_normal((1, KVH, T, D)).astype(np.float32)
    v = rng.standard_normal((1, KVH, T, D)).astype(np.float32)
    k[0, 0, :3] *= 1e-30  # norm < 1e-12: zeroed by the compressor
    v[0, 0, :2] *= 1e-9  # norm ~8e-9: above 1e-12 but below the f16 range, stored as 0
    v[0, 0, 5] *= 1e-6  # norm ~8e-6: an f16 subnormal, kept with reduced precision
    res = session.compute(_cfg(_dump(tmp_path, "tq", k=k, v=v), method="turboquant"))
    w = "\n".join(res.warnings)
    assert "turboquant: 3 of 32 vectors (K 3, V 0) have a norm below 1e-12 and are stored as zero" in w, w
    assert "turboquant: 2 of 32 vectors (K 0, V 2) have a norm below the f16 range" in w, w
    assert "turboquant: 1 of 32 vectors (K 0, V 1) have a norm in the f16 subnormal range" in w, w
    md = report_markdown(res)
    assert "## Warnings" in md and "have a norm below 1e-12 and are stored as zero" in md
    clean = session.compute(_cfg(_dump(tmp_path, "tqok"), method="turboquant"))
    assert clean.warnings == []


# ------------------------------------------------------------------ the window
def test_window_shows_the_warning_and_the_overflow_error(qtbot, tmp_path, session):
    pytest.importorskip("PySide6")
    from PySide6.QtCore import QSettings

    from kvviz.ui.main_window import MainWindow

    wait = 90_000
    tiny = _cfg(_dump(tmp_path, "tiny", k_mag=1e-30, v_mag=1e-30), method="int8_token")
    settings = QSettings(str(tmp_path / "kvviz-test.ini"), QSettings.IniFormat)
    w = MainWindow(settings=settings, config=tiny, session=session, debounce_ms=50)
    qtbot.addWidget(w)
    with qtbot.waitSignal(w.results_ready, timeout=wait):
        w.resize(1500, 950)
        w.show()
    qtbot.waitUntil(lambda: not w.runner.busy, timeout=wait)
    assert w.overview.warn.isVisibleTo(w)
    assert "are nonzero but quantise to all-zero codes" in w.overview.warn.text()
    assert ["warning", w.results.warnings[0]] in w.overview.summary.rows

    with qtbot.waitSignal(w.compute_failed, timeout=wait):
        w.workload.set_config(_cfg(_dump(tmp_path, "ovf", k_mag=1e20, q_mag=1e20)))
        w.request_compute()
    assert w.banner.isVisible()
    assert "overflow float32" in w.banner.title.text() and "nothing was dispatched" in w.banner.hint.text()
    w.close()
