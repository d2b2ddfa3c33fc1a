"""The Kernel lab: slot contracts, `kvviz kernel new` output passing its own slot's
check, a wrong user kernel failing the oracle check with the right count of bad elements and where, a syntax
error with its line and column, the source view, `kvviz bench --kernel`.

Timings are printed, never asserted. The oracle checks' tolerances are the slots' own (kvviz/lab/slots.py).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kvviz.bench import BenchShape, failed_rows, make_inputs, run_bench
from kvviz.cli import main
from kvviz.gpu.kernel_spec import READ_WRITE
from kvviz.lab import check
from kvviz.lab.slots import DEQUANT_ORACLES, render_markdown, slot, slots
from kvviz.lab.source import KernelCompileError
from kvviz.paging import PAD_SLOT

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[1]
SHAPE = BenchShape("lab-test", (37, 20), 4, 2, 64, 16, "scattered")


@pytest.fixture(scope="module")
def inputs():
    return make_inputs(SHAPE)


# ------------------------------------------------------------------------------ contracts
def test_every_slot_has_a_contract():
    from kvviz.families.registry import registry
    from kvviz.methods.records import PerTokenRecordMethod

    s = slots()
    for sid in ("f32.writer", "f32.decode", "f32.reduce", "int8_seed.writer", "int8_seed.decode", "fast.decode_f32",
                "fast.reduce", "int8_token.writer_fast", "int4_group.writer_fast", "fp8_e4m3.writer_fast",
                "int8_seed.writer_fast", "fast.decode_f16", "fast.decode_int8", "fast.decode_fp8_e4m3",
                "fast.decode_fp8_e5m2", "fast.decode_int4", "f16.writer_fast", "f16.dequantise",
                "vllm_fp8_e4m3.writer", "vllm_fp8_e5m2.dequantise"):
        assert sid in s, sid
    for mid, cls in registry().items():
        if issubclass(cls, PerTokenRecordMethod) and cls.family in DEQUANT_ORACLES:
            writer = f"{mid}.writer" if cls.has_first_wave_writer else f"{mid}.writer_fast"
            assert writer in s and f"{mid}.dequantise" in s, mid
    for sl in s.values():
        assert [(b.binding, b.name) for b in sl.buffers] == list(enumerate(b.name for b in sl.spec.bindings)), sl.id
        assert [b.access == "read_write" for b in sl.buffers] == [b.access == READ_WRITE for b in sl.spec.bindings]
        assert all(b.elem and b.shape and b.layout for b in sl.buffers), sl.id
        assert [f.name for f in sl.immediates] == list(sl.spec.immediates.names if sl.spec.immediates else ())
        assert sl.grid and sl.oracle and sl.tolerance, sl.id
        caches = [b for b in sl.buffers if b.name in ("k_cache", "v_cache", "key_cache", "value_cache", "kc", "vc")]
        if sl.method and caches:  # a method's cache is described by its CacheLayout (the block inspector's data)
            assert all("Words:" in b.layout for b in caches), sl.id


def test_docs_slots_md_is_current():
    """docs/slots.md is generated: `python -m kvviz.lab.slots > docs/slots.md` after a contract changes."""
    assert (ROOT / "docs" / "slots.md").read_text() == render_markdown()


def test_kernel_list_and_bad_input(capsys, tmp_path):
    assert main(["kernel", "list"]) == 0
    out = capsys.readouterr().out
    assert all(sid in out for sid in slots())
    assert main(["kernel", "list", "f32.reduce"]) == 0
    assert "num_partitions: u32" in capsys.readouterr().out
    assert main(["kernel", "new", "no.such.slot", str(tmp_path / "x.wgsl")]) == 2
    assert main(["kernel", "new", "f32.reduce", str(tmp_path / "x.comp")]) == 2  # a WGSL slot wants .wgsl
    assert main(["bench", "--quick", "--kernel", "f32.reduce"]) == 2  # no =FILE
    assert main(["bench", "--quick", "--kernel", f"f32.reduce={tmp_path / 'missing.wgsl'}"]) == 2
    err = capsys.readouterr().err
    assert "expected SLOT=FILE" in err and "no such file" in err


# ------------------------------------------------------------------------------ kernel new passes its own check
@pytest.mark.parametrize("sid", sorted(slots()))
def test_kernel_new_passes_its_slot(ctx, inputs, tmp_path, sid):
    s = slot(sid)
    path = tmp_path / f"k{s.suffix}"
    assert main(["kernel", "new", sid, str(path)]) == 0
    run = check.lab_run(ctx, sid, inputs, path=str(path), runs=2, warmup=1, info=False)
    print(run.check.summary(), [(t.name, round(t.timing.median_us, 1)) for t in run.timings])
    assert run.check.ok, run.check.summary()
    assert run.check.bad == 0 and run.check.total > 0
    from kvviz.lab.slots import siblings

    # the user's kernel, the slot's built-in, then the slot's other built-in implementations
    assert [t.impl for t in run.timings][:2] == ["user", s.impl]
    assert {t.impl for t in run.timings[2:]} <= {x.impl for x in siblings(sid)}


# ------------------------------------------------------------------------------ a wrong kernel
def test_wrong_kernel_fails_with_the_right_count(ctx, inputs, tmp_path):
    """int8_token's dequantiser with channel 3 of every head vector off by one code: exactly 2 (K, V) x real
    tokens x KV heads elements are outside the (exact) tolerance, all in channel 3."""
    s = slot("int8_token.dequantise")
    src = s.starting_source()
    needle = "let v = f32(code) * bitcast<f32>(load_w(which, rec + p.hd / 4u));"
    assert needle in src
    path = tmp_path / "wrong.wgsl"
    path.write_text(src.replace(needle, "let v = (f32(code) + select(0.0, 1.0, d == 3u)) * bitcast<f32>(load_w(which, rec + p.hd / 4u));"))
    batch, key, value, q = inputs
    real = int(np.count_nonzero(np.asarray(batch.slot_mapping) != PAD_SLOT))
    kvh, D = key.shape[1], key.shape[2]
    run = check.lab_run(ctx, s.id, inputs, path=str(path), runs=1, warmup=0, info=False)
    c = run.check
    print(c.summary())
    assert not c.ok
    assert c.bad == 2 * real * kvh
    assert c.total == 2 * real * kvh * D
    assert all(col % D == 3 for _, col in c.where)
    assert c.heat.sum() == c.bad and c.heat.shape[0] <= 48 and c.heat.shape[1] <= 64
    assert c.max_err > 0


def test_writer_outside_its_slots_is_caught(ctx, inputs, tmp_path):
    """The f32 writer also writing the slot after its own: the rows it must write are right, but words of
    cache slots no token maps to changed, which the check reports (untouched > 0) and fails."""
    s = slot("f32.writer")
    src = s.starting_source()
    lines = src.splitlines()
    # the body's store lines into key_cache: duplicate each one shifted by head_size (the next slot)
    out = []
    for line in lines:
        out.append(line)
        if "key_cache[" in line and "=" in line and line.strip().endswith(";") and "]" in line.split("=")[0]:
            lhs, rhs = line.split("=", 1)
            out.append(lhs.replace("key_cache[", "key_cache[head_size * num_kv_heads + ") + "=" + rhs)
    assert len(out) > len(lines)
    path = tmp_path / "oob.comp"
    path.write_text("\n".join(out) + "\n")
    c = check.lab_run(ctx, s.id, inputs, path=str(path), runs=1, warmup=0, info=False).check
    print(c.summary())
    assert c.untouched and c.untouched > 0
    assert not c.ok


# ------------------------------------------------------------------------------ compile errors
def test_wgsl_syntax_error_line_and_column(rt, tmp_path):
    s = slot("int8_token.writer")
    lines = s.starting_source().splitlines()
    at = next(i for i, l in enumerate(lines) if "let amax" in l)
    lines.insert(at, "  let broken = 1.0 +;")
    path = tmp_path / "syntax.wgsl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(KernelCompileError) as ei:
        check.load_user(rt, s.id, str(path))
    d = ei.value.diagnostics[0]
    print(ei.value)
    assert (d.file, d.line, d.column) == (str(path), at + 1, len("  let broken = 1.0 +") + 1)
    assert "expected expression" in d.message


def test_wgsl_errors_map_through_includes(rt, tmp_path):
    """A user file with `// #include` lines (the built-in int8_token writer as written, includes unresolved):
    an error after the includes is reported at the user file's line, not the rendered text's; an error the
    include causes (a redefinition) at the included file's line."""
    from kvviz.gpu.shaders import SHADER_DIR

    raw = (SHADER_DIR / "int8" / "write.wgsl").read_text()
    assert raw.count("// #include") == 2
    text = raw.rstrip("\n") + "\nfn oops() { let y = undefined_name; }\n"
    path = tmp_path / "inc.wgsl"
    path.write_text(text)
    with pytest.raises(KernelCompileError) as ei:
        check.load_user(rt, "int8_token.writer", str(path))
    d = ei.value.diagnostics[0]
    assert (d.file, d.line, d.column) == (str(path), len(text.splitlines()), len("fn oops() { let y = ") + 1)
    again = tmp_path / "twice.wgsl"
    again.write_text('// #include "common/quant.wgsl"\n' + raw)
    with pytest.raises(KernelCompileError) as ei:
        check.load_user(rt, "int8_token.writer", str(again))
    d = ei.value.diagnostics[0]
    common = (SHADER_DIR / "common" / "quant.wgsl").read_text().splitlines()
    assert d.file == "shaders/common/quant.wgsl" and "redefinition" in d.message
    assert common[d.line - 1][d.column - 1:].split()[0].rstrip(":") in d.message


def test_glsl_error_line_and_column(rt, tmp_path):
    s = slot("f32.writer")
    lines = s.starting_source().splitlines()
    at = next(i for i, l in enumerate(lines) if "uint token_idx" in l)
    lines.insert(at + 1, "  uint nope = undeclared_thing + 1u;")
    path = tmp_path / "bad.comp"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(KernelCompileError) as ei:
        check.load_user(rt, s.id, str(path))
    d = ei.value.diagnostics[0]
    print(ei.value)
    assert (d.line, d.column) == (at + 2, len("  uint nope = ") + 1)
    assert "undeclared" in d.message


def test_pipeline_validation_error_is_clear(rt, tmp_path):
    """A kernel naga parses but the pipeline refuses (4096 threads a workgroup): 'failed validation', the
    limit named, at the @workgroup_size line."""
    src = slot("int8_token.dequantise").starting_source()
    assert "@workgroup_size(64)" in src
    path = tmp_path / "big.wgsl"
    path.write_text(src.replace("@workgroup_size(64)", "@workgroup_size(4096)"))
    with pytest.raises(KernelCompileError, match="failed validation") as ei:
        check.load_user(rt, "int8_token.dequantise", str(path))
    d = ei.value.diagnostics[0]
    line = next(i for i, l in enumerate(src.splitlines(), 1) if "@workgroup_size" in l)
    assert d.line == line and "4096" in d.message


def test_contract_mismatch_is_a_clear_error(rt, tmp_path):
    path = tmp_path / "k.wgsl"
    path.write_text(slot("int8_token.writer").starting_source())
    with pytest.raises(KernelCompileError, match="does not meet the contract of slot int8_token.dequantise"):
        check.load_user(rt, "int8_token.dequantise", str(path))


# ------------------------------------------------------------------------------ source view
def test_source_view(ctx, inputs, tmp_path):
    run = check.lab_run(ctx, "int8_token.writer", inputs, runs=1, warmup=0)
    info = run.info
    assert info.workgroup_size == (64, 1, 1)
    assert info.workgroup_bytes == 64 * 4  # s_red: array<u32, 64>
    assert info.immediates_bytes == 16
    assert "not shown" in info.driver_code_kind and "fn main" in info.driver_code
    assert info.grid.startswith("(")
    run = check.lab_run(ctx, "f32.decode", inputs, runs=1, warmup=0)
    assert "OpEntryPoint GLCompute" in run.info.driver_code and "spirv-dis" in run.info.driver_code_kind
    assert run.info.workgroup_size == (128, 1, 1)
    # s_q[256] + s_red[128] + s_acc[256] + s_w[128] + s_pb[128] + s_bo[128], 4 bytes each
    assert run.info.workgroup_bytes == 4 * (256 + 128 + 256 + 128 + 128 + 128)


# ------------------------------------------------------------------------------ bench --kernel
def test_bench_kernel_rows(rt, tmp_path):
    good = tmp_path / "good.wgsl"
    assert main(["kernel", "new", "f32.reduce", str(good)]) == 0
    bad = tmp_path / "bad.wgsl"
    needle = "out[o_base + tid] = acc0 * inv_sum;"
    assert needle in good.read_text()
    bad.write_text(good.read_text().replace(needle, "out[o_base + tid] = 2.0 * acc0 * inv_sum;"))
    shape = BenchShape("tiny", (33, 70), 4, 2, 64, 16, "scattered")
    res = run_bench([shape], runs=2, warmup=1, frontends=("glslang",), methods=False, rt=rt, log=lambda *a: None,
                    kernels=[("f32.reduce", str(good)), ("f32.reduce", str(bad))])
    rows = {r["kernel"]: r for r in res["rows"]}
    u = rows[f"f32.reduce (user: {good})"]
    assert u["within_tolerance"] is True and u["check"]["bad"] == 0 and u["gpu_us_median"] > 0
    assert rows["built-in attention/paged_attn_reduce.wgsl (baseline)"]["impl"] == "baseline"
    assert rows["built-in attention/split_reduce.wgsl (fast)"]["impl"] == "fast"  # the slot's fast sibling beside it
    b = rows[f"f32.reduce (user: {bad})"]
    assert b["within_tolerance"] is False and b["check"]["bad"] > 0
    assert [r["kernel"] for r in failed_rows(res)] == [f"f32.reduce (user: {bad})"]


def test_user_wgsl_loops_unrolled_and_errors_still_map(rt, tmp_path):
    """A user's `// @unroll` loop is expanded as the built-in kernels' are (kvviz.gpu.shaders.unroll_loops), and a
    compile error after the expanded loop still names the user's own line."""
    s = slot("int8_token.writer_fast")
    path = tmp_path / "w.wgsl"
    assert main(["kernel", "new", s.id, str(path)]) == 0
    text = path.read_text()
    assert "// @unroll" in text
    uk = check.compile_user(rt, s, text, "w.wgsl")
    assert "// @unroll" not in uk.rendered and "const j = 0u;" in uk.rendered
    assert len(uk.where) == uk.rendered.count("\n") + 1
    lines = text.split("\n")
    bad = len(lines) - 1 - lines[::-1].index(next(x for x in lines[::-1] if x.strip() == "}"))  # the entry point's last brace
    lines.insert(bad, "  let oops: u32 = 1.5;")
    with pytest.raises(check.KernelCompileError) as ei:
        check.compile_user(rt, s, "\n".join(lines), "w.wgsl")
    assert any(d.line == bad + 1 for d in ei.value.diagnostics), [(d.line, d.message[:60]) for d in ei.value.diagnostics]


# ------------------------------------------------------------------------------ the loop limit
# Kernels whose output is right but which never end where a loop is not bounded: each appends a loop to a slot's own
# starting kernel after its last write (kvviz/lab/loop_check.py; lavapipe ends every loop of an invocation after
# 65535 iterations, and removes a loop that does nothing unless it is kept).
_WGSL_END = "    if (which == 0u) { k_out[out_base + i] = v; } else { v_out[out_base + i] = v; }\n  }\n}"
_GLSL_END = "    value_cache[dst_base + d] = value[v_src + d];\n  }\n}"
ENDLESS = {
    "wgsl loop {}": ("int8_token.dequantise", ".wgsl", _WGSL_END, "  loop { }\n}"),
    # a loop on data that never meets its condition (no code word is all ones: int8 codes of finite values)
    "wgsl data loop": ("int8_token.dequantise", ".wgsl", _WGSL_END,
                       "  var w = load_w(which, 0u);\n"
                       "  while (w != 0xFFFFFFFFu && lid.x == 0u) { w = w & load_w(which, lid.x); }\n}"),
    "glsl while": ("f32.writer", ".comp", _GLSL_END,
                   "  while (slot_mapping[token_idx] != PAD_SLOT && tid == 0u && head_idx == 0u) { }\n}"),
}


@pytest.mark.parametrize("case", sorted(ENDLESS))
def test_endless_loop_is_flagged(ctx, rt, inputs, tmp_path, case):
    if rt.loop_limit is None:
        pytest.skip("an adapter without a loop limit would run these kernels forever")
    sid, suffix, end, loop = ENDLESS[case]
    s = slot(sid)
    src = s.starting_source()
    assert src.count(end) == 1
    path = tmp_path / f"endless{suffix}"
    path.write_text(src.replace(end, end[:-1] + loop))
    c = check.lab_run(ctx, sid, inputs, path=str(path), runs=0, info=False).check
    print(c.summary())
    assert c.within_tolerance and c.bad == 0  # the output is right...
    assert c.loop_limited and c.loop_limit == rt.loop_limit and not c.ok  # ...but its invocations hit the limit
    assert "loop limit" in c.summary() and c.summary().endswith("FAILED")
    assert c.verdict == "FAILED the loop limit" and c.to_json()["loop_limited"] == c.loop_limited
    # the same kernel without the loop: checked, not flagged
    path.write_text(src)
    c = check.lab_run(ctx, sid, inputs, path=str(path), runs=1, warmup=0, info=False).check
    assert c.ok and c.loop_limited == 0


def test_loop_checked_build_times_the_kernel_as_written(ctx, rt, inputs, tmp_path):
    """The check runs the loop-checked build; the timings are of the kernel as written (no check buffer bound)."""
    s = slot("int8_token.dequantise")
    path = tmp_path / "k.wgsl"
    path.write_text(s.starting_source())
    uk = check.compile_user(rt, s, path.read_text(), str(path))
    lc = uk.kernel.loop_check
    assert (lc is not None) == (rt.loop_limit is not None)
    if lc is not None:
        assert len(lc.kernel.bindings) == len(uk.kernel.bindings) + 1 and lc.binding == len(s.spec.bindings)
    run = check.lab_run(ctx, s.id, inputs, path=str(path), runs=1, warmup=0, info=False)
    assert run.check.ok
    user = [t for t in run.timings if t.impl == "user"]
    assert len(user) == 1 and user[0].timing.median_us > 0
