"""What the CLI prints on a terminal: tables of at most 100 characters a line (every cell whole with
--wide), numbers right-aligned in their columns, and `kvviz bench`'s closing count line.

Each case runs `kvviz.cli.main(argv)` in-process; one quick bench (one method, one run) is shared by the
cases that read its output or its JSON."""
import contextlib
import io
import json
import re

import pytest

from kvviz.bench import closing_line, failed_rows
from kvviz.cli import build_parser, main
from kvviz.families.registry import registry
from kvviz.history.db import record_bench_result
from kvviz.live import measure
from kvviz.tables import WIDTH, TextColumn, shorten, text_table

BENCH = ["bench", "--quick", "--runs", "1", "--warmup", "0", "--methods", "int8_token", "--frontends", "glslang"]
CLOSING = re.compile(r"^(\d+) rows, (\d+) checked within tolerance, (\d+) failed$")


def run_cli(argv, capsys):
    try:
        rc = main(argv)
    except SystemExit as exc:
        rc = exc.code
    out, err = capsys.readouterr()
    return rc, out, err


def assert_fits(out: str, width: int = WIDTH):
    """Every line within `width`, except a line that is only a file path (printed whole, to be copied)."""
    long = [ln for ln in out.splitlines() if len(ln) > width and not (ln.strip().startswith("/") and " " not in ln.strip())]
    assert not long, f"{len(long)} line(s) over {width} characters, e.g. {long[0]!r}"


def assert_numbers_aligned(lines, header, names):
    """Each named (right-aligned) column's cells end where its header name ends, on every row."""
    assert lines, "no rows"
    for name in names:
        end = header.index(name) + len(name)
        for ln in lines:
            assert ln[end - 1] != " " and (len(ln) == end or ln[end] == " "), (name, ln)


@pytest.fixture(scope="module")
def quick_bench(tmp_path_factory, rt):
    """(exit code, stdout, the JSON written) of one quick bench of one method."""
    path = tmp_path_factory.mktemp("bench") / "bench.json"
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        rc = main(BENCH + ["--json", str(path)])
    return rc, out.getvalue(), json.loads(path.read_text()), str(path)


# ------------------------------------------------------------------------------------- the formatter
def test_shorten_keeps_both_ends():
    s = "fast split-K (4 partition(s) of 1024 tokens, 128 threads (8 rows x 16 lanes))"
    short = shorten(s, 30)
    assert len(short) == 30 and short.startswith("fast split-K") and short.endswith("lanes))") and "..." in short
    assert shorten("short", 30) == "short"


def test_text_table_fits_and_aligns_numbers():
    cols = (TextColumn("name", min_width=10), TextColumn("value", True), TextColumn("unit"))
    rows = [["x" * 150, "1.5", "us"], ["y", "12345.6", "us"]]
    lines = text_table(cols, rows, 60)
    assert all(len(ln) <= 60 for ln in lines)
    assert_numbers_aligned(lines[1:], lines[0], ["value"])
    wide = text_table(cols, rows, None)
    assert "x" * 150 in wide[1]


# ------------------------------------------------------------------------------------------- bench
def test_bench_lines_fit_100_columns(quick_bench):
    rc, out, result, _ = quick_bench
    assert rc in (0, 1)
    assert_fits(out)
    assert result["rows"]


def test_bench_closes_with_its_counts(quick_bench):
    rc, out, result, _ = quick_bench
    last = out.rstrip().splitlines()[-1]
    m = CLOSING.match(last)
    assert m, last
    rows = result["rows"]
    checked = [r for r in rows if r["tolerance"] is not None and r["within_tolerance"]
               and not str(r["note"]).startswith("FAILED")]
    assert [int(x) for x in m.groups()] == [len(rows), len(checked), len(failed_rows(result))]
    assert rc == (1 if failed_rows(result) else 0)


def test_bench_numbers_aligned(quick_bench):
    _, out, _, _ = quick_bench
    blocks = out.split("\n== ")[1:]  # one table per shape
    assert len(blocks) == 2
    for block in blocks:
        lines = block.split("\n\n")[0].splitlines()
        header = next(ln for ln in lines if ln.startswith("kernel"))
        rows = [ln for ln in lines[lines.index(header) + 1:] if not ln.startswith(("- ", " "))]
        assert_numbers_aligned(rows, header, ["median us", "min", "p90", "GB/s", "%copy", "GFLOP/s", "max err", "ok"])


def test_bench_wide_prints_every_variant_whole(quick_bench, capsys, monkeypatch):
    import kvviz.bench

    _, _, result, _ = quick_bench
    long = "a variant described at length: " + "x" * 140 + " (the end of it)"
    result = json.loads(json.dumps(result))
    result["rows"][0]["variant"] = long
    monkeypatch.setattr(kvviz.bench, "run_bench", lambda *a, **k: result)
    rc, out, _ = run_cli(BENCH + ["--wide"], capsys)
    assert long in out
    assert CLOSING.match(out.rstrip().splitlines()[-1])
    rc, out, _ = run_cli(BENCH, capsys)
    assert long not in out and "(the end of it)" in out  # shortened in the middle, both ends kept
    assert_fits(out)


def test_closing_line_counts_failures():
    rows = [{"tolerance": 1e-3, "within_tolerance": True, "note": ""},
            {"tolerance": 1e-3, "within_tolerance": False, "note": ""},
            {"tolerance": None, "within_tolerance": None, "note": "FAILED: no shader"},
            {"tolerance": None, "within_tolerance": None, "note": ""}]
    assert closing_line(rows) == "4 rows, 1 checked within tolerance, 2 failed"


# ---------------------------------------------------------------------------- roofline, runs, diff
def test_roofline_columns_aligned(quick_bench, capsys):
    _, _, _, path = quick_bench
    rc, out, err = run_cli(["roofline", path], capsys)
    assert rc == 0, err
    assert_fits(out)
    lines = out.splitlines()
    header = next(ln for ln in lines if ln.startswith("kernel"))
    rows = lines[lines.index(header) + 1:]
    assert_numbers_aligned(rows, header, ["FLOP/B", "GFLOP/s", "median us"])
    bound = header.index("bound")
    assert all(ln[bound - 1] == " " and ln[bound] != " " for ln in rows)


def test_runs_and_diff_fit_100_columns(quick_bench, capsys):
    _, _, result, path = quick_bench
    result = json.loads(json.dumps(result))
    result["rows"][0]["variant"] = "a variant described at length " + "y" * 120
    run_id, _ = record_bench_result(result)
    for argv in (["runs", "list"], ["runs", "show", str(run_id)], ["diff", path, str(run_id)]):
        rc, out, err = run_cli(argv, capsys)
        assert rc == 0, (argv, err)
        if argv[1] == "list":  # its first line names the history file, whole whatever its length
            out = out.split("\n", 1)[1]
        assert_fits(out)
        assert "y" * 120 not in out
    rc, out, _ = run_cli(["runs", "show", str(run_id), "--wide"], capsys)
    assert "y" * 120 in out


# -------------------------------------------------------------------------------------------- live
def test_live_default_is_one_method_per_family():
    specs = [s for s, _ in measure.check_args(build_parser().parse_args(["live"]))]
    families = {measure.family_of(k) for k in registry()}
    assert sorted(measure.family_of(s) for s in specs) == sorted(families)
    assert len(specs) == len(families) < len(registry())
    all_specs = [s for s, _ in measure.check_args(build_parser().parse_args(["live", "--methods", "all"]))]
    assert set(registry()) <= {s.split(":")[0] for s in all_specs}


def test_live_help_says_the_default_and_all(capsys):
    with pytest.raises(SystemExit):
        main(["live", "-h"])
    out = " ".join(capsys.readouterr().out.split())
    assert "one method per family" in out and "'all'" in out and "--wide" in out


def test_live_table_fits_and_names_the_cache_path(monkeypatch, capsys, smollm2, ctx):
    import kvviz.gpu.runtime as gpu_runtime
    import kvviz.live.decode as decode
    import kvviz.methods.context as method_context
    import kvviz.sources.gguf_llama as gguf_llama

    kinds = {"kivi": "KiviLiveCache", "int8_seed": "MethodPagedCache", "turboquant": "RequantCache"}
    seen = []

    def fake(path, ids, n_new, key, *a, **k):
        seen.append(key)
        if key == "q4_0":
            raise RuntimeError("boom " + "z" * 200)
        return {"kl_mean": 1.234e-05, "kl_max": 0.0123, "top1_agree_rate": 0.875, "free_first_divergence": 3,
                "config": {"quant_cache_kind": kinds.get(key, "RecordLiveCache")}, "timings": {"step_s_mean": 0.42}}

    monkeypatch.setattr(decode, "run_live", fake)
    monkeypatch.setattr(gguf_llama, "load_gguf_llama", lambda path: smollm2)
    monkeypatch.setattr(gpu_runtime, "GpuRuntime", lambda *a, **k: None)
    monkeypatch.setattr(method_context, "GpuContext", lambda *a, **k: ctx)
    rc, out, err = run_cli(["live", "--n-new", "1", "--prompt", "Hello"], capsys)
    assert rc == 1 and f"1 of {len(seen)} method(s) failed: q4_0" in err
    assert seen == measure.default_specs()
    assert_fits(out)
    assert "--methods all" in out
    assert "appended token by token (GPU)" in out and "re-quantised every step" in out
    assert "RecordLiveCache" not in out and "RequantCache" not in out
    lines = out.splitlines()
    header = next(ln for ln in lines if ln.startswith("method"))
    rows = [ln for ln in lines[lines.index(header) + 1:] if "failed" not in ln]
    assert_numbers_aligned(rows, header, ["mean KL ± err", "max KL", "top-1 ± err", "diverges at", "s/step"])
    rc, out, _ = run_cli(["live", "--n-new", "1", "--prompt", "Hello", "--methods", "q4_0", "--wide"], capsys)
    assert "z" * 200 in out


def test_live_all_rows_fit_100_columns():
    row = {"spec": "turboquant:bits=1;v_bits=1", "bits_per_element": 1.53, "kl_mean": 0.123, "kl_max": 1.5,
           "top1_agree_rate": 0.5, "decode_us": 1234.0, "dequant_us": 56.0,
           "decode_kernels": ["turboquant_fast_decode_" + "k" * 80, "turboquant_reduce"], "impl": "fast",
           "warnings": ["a warning about the scales " + "w" * 120]}
    natural = [max(len(c.name), n) for c, n in zip(measure.ALL_COLUMNS, measure._ALL_CELLS)]
    natural[0] = len(row["spec"]) + 4
    lines = measure._all_lines(row, measure.stream_widths(measure.ALL_COLUMNS, natural, WIDTH), WIDTH)
    assert len(lines) == 2 and all(len(ln) <= WIDTH for ln in lines)
    wide = measure._all_lines(row, measure.stream_widths(measure.ALL_COLUMNS, natural, None), None)
    assert len(wide) == 1 and "k" * 80 in wide[0] and "w" * 120 in wide[0]
    failed = measure._all_lines({"spec": "kivi", "bits_per_element": 4.5, "error": "RuntimeError: " + "e" * 200},
                                measure.stream_widths(measure.ALL_COLUMNS, natural, WIDTH), WIDTH)
    assert len(failed) == 1 and len(failed[0]) <= WIDTH and failed[0].startswith("kivi")
