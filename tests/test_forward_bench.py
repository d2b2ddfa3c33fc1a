"""`kvviz bench --gemm`: the forward's matrix multiply timed beside the FMA ceiling of the same run and checked
against float64 (kvviz/bench/gemm.py); its arguments refused before any GPU work; its rows in the bench table, the
strict JSON and the run history's shape labels."""
from __future__ import annotations

import json

import pytest

from kvviz.bench import format_table, save_json
from kvviz.bench.gemm import GemmShape, parse_gemm, run_gemm_bench
from kvviz.cli import main as cli_main
from kvviz.errors import InvalidInput
from kvviz.forward import kernels as K
from kvviz.history.db import shape_label


def test_gemm_shapes_parse_and_bad_ones_are_refused():
    assert parse_gemm("4096x4096x2048, 3x5x7") == [GemmShape(4096, 4096, 2048), GemmShape(3, 5, 7)]
    for bad in ("4096x4096", "0x4x4", "axbxc", ","):
        with pytest.raises(InvalidInput):
            parse_gemm(bad)


@pytest.mark.parametrize("argv,msg", [(["--gemm", "12x"], "three positive integers"),
                                      (["--gemm", "8x8x8", "--quick"], "drop --quick"),
                                      (["--gemm", "8x8x8", "--shape", "quick-ragged"], "drop --shape")])
def test_bench_gemm_arguments_are_refused_before_the_gpu(argv, msg, capsys):
    assert cli_main(["bench"] + argv) == 2
    assert msg in capsys.readouterr().err


@pytest.mark.gpu
def test_gemm_rows_are_timed_checked_and_placed_against_the_fma_ceiling(rt, tmp_path):
    res = run_gemm_bench([GemmShape(24, 40, 36)], runs=2, warmup=1, rt=rt, log=lambda *_: None,
                         configs=(K.MEDIUM,))
    rows = {(r["kernel"], r["variant"]): r for r in res["rows"]}
    assert "fma_f32" in {k for k, _ in rows} and res["roofline"]["f32_gflops"] > 0
    mm = [r for r in res["rows"] if r["kernel"].startswith("forward_matmul")]
    assert {r["kernel"] for r in mm} == {"forward_matmul_f32w", "forward_matmul_f16w"}
    for r in mm:
        assert r["within_tolerance"] is True and r["max_abs_err_vs_oracle"] <= 1.0
        assert r["flops"] == 2 * 24 * 40 * 36 and r["gflops"] > 0 and r["pct_of_fma"] > 0
        assert "% of the f32 FMA ceiling" in r["note"]
    text = format_table(res)
    assert "gemm-24x40x36: M 24 tokens x N 40 outputs x K 36 inputs" in text
    assert max(len(line) for line in text.splitlines()) <= 100
    path = tmp_path / "gemm.json"
    save_json(res, str(path))
    assert json.loads(path.read_text(), parse_constant=lambda c: pytest.fail(f"non-strict JSON: {c}"))["rows"]
    assert shape_label(mm[0]["shape"]) == "gemm-24x40x36: 24 x 40 x 36 (M x N x K)"
