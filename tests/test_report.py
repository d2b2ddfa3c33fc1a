"""kvviz/report: panel tables, Chrome trace, report.json / report.md (Qt-free) and `kvviz report`."""
import csv
import json
import os
import subprocess
from pathlib import Path
import sys

import numpy as np
import pytest

from kvviz.analysis.session import Session, SessionConfig

pytestmark = pytest.mark.gpu
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def res(rt):
    cfg = SessionConfig(context_lens=(40, 17, 70), num_heads=4, num_kv_heads=2, head_size=64, timing_runs=3)
    return Session(rt).compute(cfg)


def test_report_package_imports_no_qt():
    code = ("import sys; import kvviz.cli_report, kvviz.report.writer, kvviz.report.trace, "
            "kvviz.tables, kvviz.report.compare_run; "
            "bad = [m for m in sys.modules if m.startswith(('PySide6', 'pyqtgraph', 'shiboken6'))]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_report_package_does_not_reach_into_the_window():
    """The report writers are Qt-free data code; rendering the panels for `kvviz report` is the CLI
    layer's job (kvviz/cli_report.py), which asks kvviz.ui for the figures."""
    import re

    for path in (Path(ROOT) / "kvviz" / "report").glob("*.py"):
        assert not re.search(r"^\s*(from|import) kvviz\.ui", path.read_text(), re.M), path


def test_tables_are_the_results(res):
    from kvviz import tables as T
    b = res.batch
    pool = T.block_pool_table(res)
    assert len(pool) == b.num_blocks
    assert pool.column("sequence").tolist() == b.block_owner().tolist()
    assert pool.column("tokens_used").tolist() == b.block_fill().tolist()
    bt = T.block_table_table(res)
    assert len(bt) == sum(len(x) for x in b.seq_blocks)
    assert sum(r[3] for r in bt.rows) == int(b.context_lens.sum())

    sc = T.token_scales_table(res, 2, 1)
    rows = b.token_rows(2)
    assert sc.column("position").tolist() == list(range(int(b.context_lens[2])))
    np.testing.assert_allclose(sc.column("k_scale"), np.asarray(res.qkv.k_scales)[rows, 1], rtol=1e-6)

    am = T.channel_amax_table(res, "K")
    assert len(am) == res.k_channel_amax.size
    np.testing.assert_allclose(am.column("amax"), res.k_channel_amax.reshape(-1), rtol=1e-6)

    h = T.code_hist_table(res)
    assert int(h.column("k_count").sum()) == int(res.k_stats.counts.sum()) == res.k_stats.total
    assert int(h.column("v_count").sum()) == res.v_stats.total

    w = T.attention_weights_table(res, 1, 3)
    n = int(b.context_lens[1])
    assert len(w) == n
    np.testing.assert_allclose(w.column("w_f32"), res.w_ref[1, 3, :n], rtol=1e-6)
    hm = T.head_metrics_table(res)
    assert len(hm) == res.metrics.kl.size

    t = T.timings_table(res)
    assert len(t) == len(res.timings)
    assert t.column("median_us").tolist() == [r.timing.median_us for r in res.timings]
    pinned = {T.timing_key(r): r.timing.median_us * 2 for r in res.timings}
    d = T.timings_table(res, pinned).column("delta_vs_pin_pct")
    np.testing.assert_allclose(d, -50.0)


def test_csv_roundtrip(res, tmp_path):
    from kvviz.tables import head_metrics_table

    t = head_metrics_table(res)
    p = t.write_csv(tmp_path / "h.csv")
    with open(p) as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == len(t)
    np.testing.assert_array_equal([float(r["kl_nats"]) for r in rows], res.metrics.kl.reshape(-1))  # KL's unit named


def test_chrome_trace(res, tmp_path):
    from kvviz.report.trace import write_chrome_trace

    # every timed sample is an event on its kernel's track (tests/test_timeline.py checks the layout)
    p = write_chrome_trace(tmp_path / "t.json", res)
    tr = json.load(open(p))
    xs = [e for e in tr["traceEvents"] if e["ph"] == "X" and e["cat"] == "timed"]
    assert len(xs) == sum(len(row.timing.samples_us) for row in res.timings)
    for k, row in zip(tr["otherData"]["kernels"], res.timings):
        assert k["kernel"] == row.kernel and k["median_us"] == row.timing.median_us
        assert k["timing_method"] == row.timing.method
        assert [e["dur"] for e in xs if e["tid"] == k["track"]] == pytest.approx(list(row.timing.samples_us))


def assert_same(a, b):
    """Equal JSON trees, floats to 1e-12 relative."""
    if isinstance(b, dict):
        assert set(a) == set(b)
        for k in b:
            assert_same(a[k], b[k])
    elif isinstance(b, list):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_same(x, y)
    elif isinstance(b, float):
        assert a == pytest.approx(b, rel=1e-12)
    else:
        assert a == b


def test_write_report_qt_free(res, tmp_path):
    from kvviz.report.writer import write_report

    paths = write_report(str(tmp_path), res)
    rep = json.load(open(paths["json"]))
    summary = json.loads(json.dumps(res.summary_json()))
    for k in ("config", "method", "layout", "batch", "attention", "codes", "timings", "copy_gbps", "timing_floor_us"):
        assert_same(rep[k], summary[k])
    assert rep["timing_floor_us"] > 0   # the frame every timing includes (kvviz.gpu.fma.measure_timing_floor)
    assert set(rep["panels"]) >= {"cache_layout", "scales", "codes", "attention", "timing"}
    md = open(paths["md"]).read()
    for s in (res.adapter.name, res.method.label, "bits per element", "kl_mean", "Timing method", "saturated", "Timing floor"):
        assert s in md
    assert len(paths["csv"]) >= 10


def test_kvviz_report_cli(tmp_path):
    """`kvviz report --out DIR` headless: PNGs of every panel, report.json, report.md, no display; no Qt
    warning on stderr; every JSON file strict (no NaN/Infinity), no CSV cell "nan", "inf" or "none"."""
    out = tmp_path / "rep"
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM")}
    env.setdefault("XDG_RUNTIME_DIR", "/tmp")
    cfg = tmp_path / "cfg.json"
    cfg.write_text(json.dumps({"context_lens": [33, 50], "num_heads": 4, "num_kv_heads": 2, "head_size": 64}))
    r = subprocess.run(
        [sys.executable, "-m", "kvviz", "report", "--out", str(out), "--config", str(cfg), "--set", "timing_runs=3",
         "--set", "policy=contiguous"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    rep = json.load(open(out / "report.json"))
    assert rep["config"]["context_lens"] == [33, 50]
    assert rep["config"]["policy"] == "contiguous" and rep["config"]["timing_runs"] == 3
    assert rep["batch"]["num_tokens"] == 83
    for key in ("overview", "cache_layout", "scales", "codes", "attention", "timing"):
        png = out / rep["figures"][key]
        assert png.exists() and png.stat().st_size > 5000, key
        with open(png, "rb") as fh:
            assert fh.read(8) == b"\x89PNG\r\n\x1a\n"
    md = (out / "report.md").read_text()
    assert "![Cache layout](cache_layout.png)" in md
    assert (out / "trace.json").exists()
    timed = [e for e in json.load(open(out / "trace.json"))["traceEvents"] if e["ph"] == "X" and e["cat"] == "timed"]
    assert len(timed) == 3 * len(rep["timings"])  # one event per sample, timing_runs=3 each
    assert "propagateSizeHints" not in r.stderr and "QFont" not in r.stderr and "Qt" not in r.stderr
    files = [os.path.join(d, f) for d, _, fs in os.walk(out) for f in fs]

    def refuse(name):
        raise ValueError(f"non-standard JSON constant {name}")

    jsons = [f for f in files if f.endswith(".json")]
    assert {"report.json", "trace.json"} <= {os.path.basename(f) for f in jsons}
    for f in jsons:
        with open(f) as fh:
            json.loads(fh.read(), parse_constant=refuse)  # as strict as JSON.parse elsewhere
    for f in (f for f in files if f.endswith(".csv")):
        for cell in open(f).read().replace("\n", ",").split(","):
            assert cell.strip().lower() not in ("nan", "inf", "-inf", "none"), (f, cell)
    assert os.path.exists(out / "qjl_bias.png")


def test_kvviz_report_bad_setting(tmp_path):
    r = subprocess.run([sys.executable, "-m", "kvviz", "report", "--out", str(tmp_path), "--set", "num_heads=6",
                        "--set", "num_kv_heads=4"], cwd=ROOT, capture_output=True, text=True, timeout=120,
                       env={**os.environ, "XDG_RUNTIME_DIR": os.environ.get("XDG_RUNTIME_DIR", "/tmp")})
    assert r.returncode == 2  # bad input (InvalidInput): one line, exit 2
    assert "not divisible" in r.stderr and "GQA" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_headless_without_qt_writes_everything_but_figures(res, tmp_path, monkeypatch):
    """On a machine without PySide6 (the GPU machine) the report still has every number."""
    import importlib.util

    from kvviz import cli_report as headless
    from kvviz.report.writer import write_report

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "PySide6" else real(name, *a))
    figures, why = headless.render_figures(res, str(tmp_path))
    assert figures == {} and "PySide6" in why
    paths = write_report(str(tmp_path), res, figures=figures)
    assert json.load(open(paths["json"]))["attention"]["kl_mean"] == pytest.approx(float(res.metrics.kl.mean()))
    assert "![" not in open(paths["md"]).read()


def test_csv_cells_of_missing_numbers_are_empty(tmp_path):
    from kvviz.tables import Table

    t = Table("t", ["a", "b", "c"], [[1.5, float("nan"), None], [float("inf"), 2, "x"]])
    rows = list(csv.reader(open(t.write_csv(tmp_path / "t.csv"))))
    assert rows == [["a", "b", "c"], ["1.5", "", ""], ["", "2", "x"]]


@pytest.mark.parametrize("sets,says,not_says", [
    (["source=kvfile", "kv_file={dump}", "layer=1"], ["the K/V file {dump}, layer 1"], ["llama-like", "[300, 517"]),
    (["source=model", "model_path={dump}", "pre_rope_keys=true"], ["the model {dump}, layer 0, pre-RoPE keys",
                                                                   "a prompt of"], ["llama-like", "context ["]),
    (["source=model"], ["the model SmolLM2-135M, layer 0"], ["llama-like"]),
    (["context_lens=[33, 50]", "preset=heavy-tailed"], ["synthetic 'heavy-tailed' (seed 0), context [33, 50]"], []),
])
def test_report_banner_names_the_source(tmp_path, capsys, monkeypatch, sets, says, not_says):
    """`kvviz report` says what it computes on before it starts: the file or model it reads, not the synthetic
    defaults it does not use (the computation itself is stopped here: only the banner is under test)."""
    from kvviz import cli_report
    from kvviz.cli import main
    from kvviz.errors import InvalidInput

    class Stopped(Session):
        def compute(self, cfg, progress=None, cancel=None):
            raise InvalidInput("stopped after the banner")

    monkeypatch.setattr(cli_report, "Session", Stopped)
    dump = str(tmp_path / "kv.safetensors")
    argv = ["report", "--out", str(tmp_path / "rep")]
    for s in sets:
        argv += ["--set", s.format(dump=dump)]
    assert main(argv) == 2
    banner = capsys.readouterr().err.splitlines()[0]
    assert banner.startswith("kvviz report: computing int8_seed on "), banner
    for s in says:
        assert s.format(dump=dump) in banner, banner
    for s in not_says:
        assert s not in banner, banner


def test_report_progress_of_a_long_build_is_a_line_every_few_seconds(capsys):
    """The window updates its status each second of a long first build; kvviz report prints the first line and
    then one every 5 s of it, and every other progress line as it comes."""
    from kvviz import cli_report

    msg = "building kernels for head size 120 (first use): attention/split_decode.wgsl, {} s"
    for s in range(1, 13):
        cli_report._progress(0.45, msg.format(s))
    cli_report._progress(0.5, "metrics")
    cli_report._progress(0.7, msg.format(1) + " (8 built)")
    lines = capsys.readouterr().err.splitlines()
    assert [ln.split(": ", 1)[1].rsplit(", ", 1)[1] for ln in lines if "building" in ln] == \
        ["1 s", "6 s", "11 s", "1 s (8 built)"]
    assert any(ln.endswith("metrics") for ln in lines)
