"""Roofline: every bench row's FLOPs, GFLOP/s, intensity and bound agree with each other
and with the ceilings measured in the same run; the FMA probe's sink matches numpy (a probe that skips its
loop is caught); the arithmetic counts; the report's SVG. Timings are printed, never asserted."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

import kvviz.bench.roofline as roofline
from kvviz.bench import BenchShape, format_table, make_inputs, run_bench, save_json
from kvviz.attention import arith
from kvviz.bench.roofline import Ceilings, Point, bound
from kvviz.report.roofline import roofline_svg, roofline_table

pytestmark = pytest.mark.gpu


def test_bench_roofline_keys_consistent(rt, tmp_path):
    shape = BenchShape("tiny", (33, 70), 4, 2, 64, 16, "scattered")
    res = run_bench([shape], runs=2, warmup=1, frontends=("glslang",), methods=True, rt=rt, log=lambda *a: None)
    rl = res["roofline"]
    c = Ceilings(rl["mem_gbps"], rl["f32_gflops"], rl["f16_gflops"])
    print(format_table(res))
    assert rl["mem_gbps"] > 0 and rl["f32_gflops"] > 0
    assert math.isclose(rl["ridge_flop_per_byte"], rl["f32_gflops"] / rl["mem_gbps"], rel_tol=1e-12)
    copy = next(r for r in res["rows"] if r["kernel"] == "copy_shader")
    assert math.isclose(copy["gbps"], rl["mem_gbps"], rel_tol=1e-12)  # the memory roof is this run's shader copy
    fma = next(r for r in res["rows"] if r["kernel"] == "fma_f32")
    assert math.isclose(fma["gflops"], rl["f32_gflops"], rel_tol=1e-12)
    # the timing floor (a near-empty dispatch: the frame, not arithmetic) claims no FLOPs and stays off the roofline
    floor = next(r for r in res["rows"] if r["kernel"] == "timing_floor")
    assert floor["flops"] is None and floor["bound"] is None and floor["intensity"] is None
    timed = [r for r in res["rows"] if r["gpu_us_median"] and r is not floor]
    stated = [r for r in timed if r["flops"] is not None]
    # every timed row states its arithmetic (copies 0), and the decodes state 4 D H tokens + softmax
    assert len(stated) == len(timed), [r["kernel"] for r in timed if r["flops"] is None]
    for r in stated:
        assert math.isclose(r["intensity"], r["flops"] / r["bytes_moved"], rel_tol=1e-12), r["kernel"]
        assert math.isclose(r["gflops"], r["flops"] / (r["gpu_us_median"] * 1e3), rel_tol=1e-12), r["kernel"]
        if not r["kernel"].startswith("fma_"):
            assert r["bound"] == ("memory" if r["intensity"] < c.ridge else "compute"), r["kernel"]
    batch = make_inputs(shape)[0]
    dec = next(r for r in res["rows"] if r["kernel"] == "paged_attn_f32")
    assert dec["flops"] == int(np.sum(batch.context_lens)) * 4 * (4 * 64 + 4)
    assert next(r for r in res["rows"] if r["kernel"] == "reshape_and_cache_f32")["flops"] == 0
    assert "bound" in format_table(res).splitlines()[2] and "roofline ceilings" in format_table(res)
    p = tmp_path / "b.json"
    save_json(res, str(p))
    json.loads(p.read_text(), parse_constant=lambda n: pytest.fail(f"non-strict JSON constant {n}"))


def test_fma_probe_checks_its_sink(rt):
    from kvviz.gpu.fma import check_fma, fma_dispatches, measure_fma

    r = measure_fma(rt, "f32", runs=2, warmup=1)
    print(f"f32 FMA: {r.gflops:.3g} GFLOP/s ({r.timing.method})")
    assert r.rel_err < 1e-4 and r.flops > 0 and r.bytes > 0
    d, flops, out, threads, iters = fma_dispatches(rt, "f32", groups=4, iters=64)
    assert flops == 4 * 256 * 64 * 64
    rt.run(d)
    assert check_fma(rt, out, threads, iters, "f32") < 1e-5
    assert check_fma(rt, out, threads, iters + 40, "f32") > 1e-3  # a probe that ran other iterations is caught


def test_arith_counts():
    from kvviz.paging import make_batch

    b = make_batch([10, 30], 16)
    assert arith.decode_flops(b, 8, 64) == 40 * 8 * (4 * 64 + 4)
    assert arith.writer_flops(b, 2, 64, 2.0) == 2 * 40 * 2 * 64 * 2
    nblk = sum(len(x) for x in b.seq_blocks)
    assert arith.dequant_flops(b, 2, 64, 1.0) == 2 * nblk * 16 * 2 * 64
    assert arith.reduce_flops(2, 8, 64, 3) == 2 * 8 * 3 * (3 + 128)


def test_points_bounds_and_svg():
    c = Ceilings(mem_gbps=100.0, f32_gflops=1000.0, f16_gflops=2000.0)
    assert c.ridge == 10.0
    lo = Point("low", "v", bytes=1000, flops=2000.0, median_us=1.0)  # 2 FLOP/B
    hi = Point("high", "v", bytes=1000, flops=50_000.0, median_us=100.0)  # 50 FLOP/B
    zero = Point("copy", "v", bytes=1000, flops=0.0, median_us=1.0)
    assert lo.intensity == 2.0 and lo.bound(c) == "memory" and lo.gflops == 2.0
    assert hi.bound(c) == "compute" and hi.to_json(c)["attainable_gflops"] == 1000.0
    assert zero.bound(c) == "memory" and bound(float("nan"), c) == "-"
    assert lo.to_json(c)["attainable_gflops"] == 200.0
    svg = roofline_svg([lo, hi, zero], c)
    assert svg.startswith("<svg") and svg.count("<circle") == 2 and "0 FLOPs (not drawn): copy" in svg
    assert "f16 FMA" in svg
    t = roofline_table([lo, hi, zero], c)
    assert [r[-1] for r in t.rows] == ["memory", "compute", "memory"]


def test_every_method_kernel_states_its_arithmetic(ctx):
    """Every registered method's timed kernels state FLOPs (TimedKernel.flops) for the roofline: writers,
    dequantisers, decodes, weights and rotations all > 0; a decode between its QK^T + PV FMAs at the shape it
    runs and QK^T + PV plus the softmax (the fast decode's
    kvviz.attention.split_decode.decode_traffic counts only the FMAs)."""
    from kvviz.gpu.timed import checked
    from kvviz.families.registry import registry

    shape = BenchShape("tiny", (20, 9), 4, 2, 64, 16, "scattered")
    batch, key, value, q = make_inputs(shape)
    for mid, cls in sorted(registry().items()):
        m = cls()
        for tk in checked(m.timed_kernels(ctx, batch, key, value, q, 0.125), mid):
            assert tk.flops > 0, (mid, tk.name)
            if tk.role == "decode":  # QK^T + PV as FMAs at least; the softmax's 4 a logit where the kernel counts it
                qkpv = int(np.sum(batch.context_lens)) * 4 * 4 * 64
                assert qkpv <= tk.flops <= arith.decode_flops(batch, 4, 64), (mid, tk.name, tk.flops)


def test_report_has_the_roofline(tmp_path):
    """The report folder of a window run: roofline.svg (every kernel stating FLOPs a point), its table in
    report.json and csv/, the figure in report.md beside the panels' figures; the ceilings the window measured."""
    from kvviz.analysis.session import Session, SessionConfig
    from kvviz.bench.roofline import ceilings_from_results, measure_fma_gflops, points_from_results
    from kvviz.report.writer import write_report

    s = Session()
    res = s.compute(SessionConfig(context_lens=(40, 17), num_heads=4, num_kv_heads=2, head_size=64, timing_runs=3))
    res.roofline_ceilings = ceilings_from_results(res, measure_fma_gflops(s.rt, runs=2, warmup=1))
    paths = write_report(str(tmp_path), res, figures={"window": "window.png"})
    svg = (tmp_path / "roofline.svg").read_text()
    drawn = [p for p in points_from_results(res) if p.flops > 0]
    assert svg.count("<circle") == len(drawn) > 0 and "f32 FMA" in svg
    assert "(roofline.svg)" in open(paths["md"]).read()
    rows = json.load(open(paths["json"]))["panels"]["roofline"]["roofline"]
    print(rows)
    assert (tmp_path / "csv" / "roofline_roofline.csv").exists()


def test_bench_methods_subset_and_roofline_cli(rt, tmp_path, capsys):
    """`kvviz bench --methods` times only the named methods; `kvviz roofline FILE` places every timed row of the
    file that states its arithmetic (one SVG point each, duplicates named by method) under the file's ceilings."""
    from kvviz.cli import main
    from kvviz.bench.roofline import bench_roofline

    shape = BenchShape("tiny", (33, 70), 4, 2, 64, 16, "scattered")
    res = run_bench([shape], runs=2, warmup=1, frontends=("glslang",), methods=("q8_0", "f16"), rt=rt, log=lambda *a: None)
    methods = {r["method"] for r in res["rows"]}
    assert methods == {None, "int8_seed", "q8_0", "f16"}, methods
    p = tmp_path / "b.json"
    save_json(res, str(p))
    pts, c = bench_roofline(json.loads(p.read_text()))
    timed = [r for r in res["rows"] if r["gpu_us_median"] and r["flops"] is not None
             and not r["kernel"].startswith(("fma_", "copy_buffer"))]
    assert len(pts) == len(timed) and len({pt.kernel for pt in pts}) == len(pts)  # every name says whose it is
    assert c is not None and math.isclose(c.mem_gbps, res["roofline"]["mem_gbps"])
    svg = tmp_path / "r.svg"
    assert main(["roofline", str(p), "--svg", str(svg)]) == 0
    out = capsys.readouterr().out
    drawn = [pt for pt in pts if pt.flops > 0]
    assert svg.read_text().count("<circle") == len(drawn) and all(pt.kernel in out for pt in pts)
    assert main(["roofline", str(p), "--shape", "nope"]) == 2
    assert main(["bench", "--quick", "--methods", "q8_0,nope"]) == 2
    assert main(["bench", "--quick", "--methods", "q8_0", "--no-methods"]) == 2


def test_the_fma_ceiling_is_measured_once_a_device_unless_asked_again(rt, monkeypatch):
    calls = []

    def fake_measure(r):
        calls.append(r)
        return {"f32": 100.0 + len(calls)}

    monkeypatch.setattr(roofline, "measure_fma_gflops", fake_measure)
    monkeypatch.setattr(roofline, "_FMA_OF_DEVICE", roofline.weakref.WeakKeyDictionary())
    assert roofline.device_fma_gflops(rt) == {"f32": 101.0}
    assert roofline.device_fma_gflops(rt) == {"f32": 101.0} and len(calls) == 1  # the window's recomputes
    assert roofline.device_fma_gflops(rt, refresh=True) == {"f32": 102.0}  # "Measure ceilings"
    assert roofline.device_fma_gflops(rt) == {"f32": 102.0} and calls == [rt, rt]
