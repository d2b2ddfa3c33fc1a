"""`kvviz bench`: every kernel row carries the required fields and agrees with its oracle.

Times are printed, never asserted; this checks the bench's structure and its correctness verdicts.
"""
import json

import pytest

from kvviz.bench import BenchShape, format_table, run_bench
from kvviz.cli import main

from harness import checked_variant_rows

pytestmark = pytest.mark.gpu

FIELDS = ("kernel", "variant", "shape", "gpu_us_min", "gpu_us_median", "gpu_us_p90", "bytes_moved", "gbps",
          "pct_of_copy", "max_abs_err_vs_oracle", "adapter")


def test_bench_rows_fields_and_oracle_checks(rt):
    shape = BenchShape("tiny", (33, 70), 4, 2, 64, 16, "scattered")
    res = run_bench([shape], runs=2, warmup=1, rt=rt, log=lambda *a: None)
    rows = res["rows"]
    for r in rows:
        for f in FIELDS:
            assert f in r, f
    kernels = {r["kernel"] for r in rows}
    for k in ("copy_buffer", "copy_shader", "reshape_and_cache_q8", "paged_attn_q8", "reshape_and_cache_f32",
              "paged_attn_f32", "paged_attn_weights_q8", "paged_attn_weights_f32"):
        assert k in kernels
    checked = [r for r in rows if r["tolerance"] is not None]
    # seed writer+decode+weights per front end, f32 writer+decode+weights, one end-to-end row per method
    assert len(checked) >= 9 + 6
    bad = [(r["kernel"], r["variant"], r["max_abs_err_vs_oracle"], r["tolerance"]) for r in checked if not r["within_tolerance"]]
    assert not bad, bad
    # the int8-query variant beside the seed layout's fast decode: checked against its own oracle, and the
    # note says how far the query's int8 rounding puts it from the f32-query oracle
    i8q = [r for r in rows if r["kernel"] == "fast_decode_int8 (int8 query)"]
    assert len(i8q) == 1 and i8q[0]["within_tolerance"] and i8q[0]["impl"] == "fast"
    assert "dot4I8Packed" in i8q[0]["variant"] and "f32-query oracle" in i8q[0]["note"]
    # the timing frame's floor: a near-empty dispatch timed like every row, with no rate (it moves nothing worth one)
    floor = [r for r in rows if r["kernel"] == "timing_floor"]
    assert len(floor) == 1 and floor[0]["gpu_us_median"] > 0 and floor[0]["gbps"] is None
    assert floor[0]["pct_of_copy"] is None and floor[0]["flops"] is None and "fixed cost" in floor[0]["note"]
    assert res["timing_floor_us"] == floor[0]["gpu_us_median"]
    timed = [r for r in rows if r["gpu_us_median"] is not None]
    assert all(r["gpu_us_min"] <= r["gpu_us_median"] <= r["gpu_us_p90"] for r in timed)
    assert all(r["bytes_moved"] > 0 and r["gbps"] > 0 for r in timed if r["kernel"] != "timing_floor")


def _no_constants(name):
    raise ValueError(f"not strict JSON: {name}")


def test_bench_cli_writes_json(tmp_path, capsys):
    out = tmp_path / "b.json"
    assert main(["bench", "--shape", "quick-d64-mha", "--runs", "2", "--warmup", "1", "--no-methods",
                 "--frontends", "glslang", "--json", str(out)]) == 0
    data = json.loads(out.read_text(), parse_constant=_no_constants)  # strict: NaN/Infinity are not JSON
    assert data["adapter"]["name"] and data["rows"]
    unchecked = [r for r in data["rows"] if r["tolerance"] is None]
    assert unchecked and all(r["within_tolerance"] is None for r in unchecked)  # no false "fail" claims
    assert any(r["gbps"] is None for r in data["rows"])  # untimed rows: null, not NaN
    text = capsys.readouterr().out
    assert "paged_attn_q8" in text and "median us" in text
    assert main(["bench", "--shape", "nope"]) == 2


def test_a_method_that_breaks_is_failed_not_skipped(rt, monkeypatch):
    """A method that cannot take a shape is skipped; one whose kernel breaks (here: its shader does not
    compile) is a FAILED row, which makes `kvviz bench` exit 1."""
    from kvviz.bench import failed_rows
    from kvviz.errors import ShaderCompileError
    from kvviz.families.int8.method_token import Int8PerToken

    def broken(self, *a, **k):
        raise ShaderCompileError("int8/write.wgsl:3:1 error: expected a declaration")

    monkeypatch.setattr(Int8PerToken, "quantize", broken)
    shape = BenchShape("tiny", (20,), 2, 1, 48, 16, "contiguous")
    res = run_bench([shape], runs=1, warmup=0, rt=rt, log=lambda *a: None, frontends=("glslang",))
    rows = {r["kernel"]: r for r in res["rows"]}
    assert rows["int8_token"]["note"].startswith("FAILED: int8/write.wgsl:3:1")
    assert rows["q8_0"]["note"].startswith("skipped")  # head 48 is not a whole number of 32-element q8_0 blocks
    assert [r["kernel"] for r in failed_rows(res)] == ["int8_token"]


def test_bench_table_cuts_a_kernel_name_only_to_fit():
    from kvviz.bench import format_table

    shape = {"name": "s", "num_seqs": 1, "num_tokens": 1, "num_heads": 1, "num_kv_heads": 1, "head_size": 4,
             "block_size": 1}
    long = "paged_attn_f32 (over the dequantised cache)"
    row = {"kernel": long, "variant": "int8 per token (WGSL) with a long variant name", "shape": shape,
           "gpu_us_median": 1.0, "gpu_us_min": 1.0, "gpu_us_p90": 1.0, "gbps": 1.0, "pct_of_copy": 1.0,
           "max_abs_err_vs_oracle": None, "tolerance": None, "within_tolerance": None, "note": ""}
    text = format_table({"rows": [row]})
    assert row["variant"] in text and all(len(ln) <= 100 for ln in text.splitlines())
    assert long in format_table({"rows": [row]}, None)  # --wide
    line = next(ln for ln in text.splitlines() if ln.startswith("paged_attn_f32"))
    assert "..." in line and "cache)" in line  # shortened in the middle, both ends kept
    assert long[:30] in format_table({"rows": [dict(row, kernel=long[:30])]})  # a name that fits is whole


def test_bench_variant_rows_are_checked(rt):
    """--variants: the int4 cache's fast decode with the int8 query, with f16-pair P.V and with the reduce folded in,
    each timed and held to its own oracle (the int8 query's dequantised values; pv_tolerance on top for f16 P.V)."""
    shape = BenchShape("tiny", (33, 70), 4, 2, 64, 16, "scattered")
    names = ["fast_decode_int4 (int8 query)", "fast_decode_int4 (reduce folded in)"]
    if "shader-f16" in rt.features:
        names.append("fast_decode_int4 (int8 query, f16x2 P.V)")
    rows = checked_variant_rows(rt, "int4_group", names)
    assert "f32-query oracle" in rows[names[0]]["note"]
    plain = run_bench([shape], runs=1, warmup=0, rt=rt, log=lambda *a: None, frontends=("glslang",),
                      methods=("int4_group",))
    assert not any("(int8 query" in r["kernel"] and "int4" in r["kernel"] for r in plain["rows"])


def test_bench_turboquant_variant_rows_are_checked(rt):
    """--variants: TurboQuant's paged decode with the int8 query (4 and 2 tokens a row), timed and held to its own
    oracle (the seed estimator of the int8 query), with its distance to the f32-query oracle in the note."""
    names = ("fast_decode_tq_paged (int8 query)", "fast_decode_tq_paged (int8 query, 2 tokens a row)")
    rows = checked_variant_rows(rt, "turboquant", names)
    for name in names:
        assert "f32-query oracle" in rows[name]["note"] and "int8 query" in rows[name]["variant"]


def test_bench_kivi_variant_rows_are_checked(rt):
    """--variants: the fast KIVI decode with the int8 query (4 and 2 tokens a row), timed and held to its own oracle
    (the float64 attention over the requantised query's codes), with its distance to the f32-query oracle in the note:
    nonzero, as the sequences are long enough for key groups to leave the method's default recent window."""
    names = ("fast_decode_kivi (int8 query)", "fast_decode_kivi (int8 query, 2 tokens a row)")
    rows = checked_variant_rows(rt, "kivi", names, lens=(200, 170))
    for name in names:
        note = rows[name]["note"]
        assert "f32-query oracle" in note and "int8 q" in rows[name]["variant"]
        assert float(note.split("oracle: ")[1].split()[0]) > 0


def test_bench_ranks_each_methods_fastest_decode_against_f16(rt):
    """The closing block: each method's fastest checked decode (its exact one or a variant) over the f16 decode of
    the same shape and run, in the JSON and the text."""
    shape = BenchShape("tiny", (33, 70), 4, 2, 64, 16, "scattered")
    res = run_bench([shape], runs=1, warmup=0, rt=rt, log=lambda *a: None, frontends=("glslang",),
                    methods=("f16", "int4_group"), variants=True)
    got = {b["method"]: b for b in res["decode_vs_f16"]}
    assert {"f16", "int4_group"} <= set(got) and got["f16"]["vs_f16"] == 1.0
    int4 = [r for r in res["rows"] if r["method"] == "int4_group" and r["role"] == "decode" and r["impl"] == "fast"]
    assert len(int4) > 1  # the exact decode and its variants
    fastest = min(int4, key=lambda r: r["gpu_us_median"])
    assert got["int4_group"]["kernel"] == fastest["kernel"]
    assert got["int4_group"]["vs_f16"] == pytest.approx(fastest["gpu_us_median"] / got["f16"]["us"])
    text = format_table(res)
    assert "against the f16 decode of" in text and f"{got['int4_group']['vs_f16']:5.2f} x f16" in text
    assert all(len(ln) <= 100 for ln in text.splitlines())
    from kvviz.tables import clean

    assert json.loads(json.dumps(clean(res), allow_nan=False))["decode_vs_f16"] == res["decode_vs_f16"]
