"""Kernel families as units: shader includes and defines, kernel specs checked against the shaders'
own declarations, self-packing immediates, the family registry, and the product path importing no
numpy reference. Everything here but `test_compile_refuses_a_mismatched_spec` runs without a GPU."""
from __future__ import annotations

import struct
import subprocess
import sys

import numpy as np
import pytest

from kvviz.errors import InvalidInput, ShaderCompileError
from kvviz.families.fp8.format import FORMATS
from kvviz.gpu.kernel_spec import READ, READ_WRITE, KernelSpec, Struct, ro, rw
from kvviz.gpu.shaders import ShaderSpec, declarations, render_wgsl_defines, resolve_includes
from kvviz.families import catalogue as families  # Representative defines for the kernels that take them (everything else takes none).
_FP8 = dict(FORMATS["e4m3"].defines(), PER_TENSOR="false", NAME="fp8_e4m3fn")
DEFINES = {
    "int4/write.wgsl": {"GROUP": 32}, "int4/dequant.wgsl": {"GROUP": 32},
    "fp8/write.wgsl": _FP8, "fp8/dequant.wgsl": _FP8, "common/selftest.wgsl": _FP8,
    "kivi/write_tok.wgsl": {"BITS": 2}, "kivi/write_kgroup.wgsl": {"BITS": 2},
    "kivi/dequant.wgsl": {"BITS": 2},
}


def _generated_defines() -> dict:
    """The generated split-K decodes' and TurboQuant writer's defines, rendered by their own generators for one
    representative shape each (int8 / q4_1 / 2-bit KIVI / TurboQuant / NVFP4, head 64, GQA 2)."""
    from kvviz.families.ggml import format as gg
    from kvviz.families.turboquant import format as tqf
    from kvviz.attention import split_decode as fd
    from kvviz.families.fp4 import decode as f4d
    from kvviz.families.ggml import decode as fgd
    from kvviz.families.kivi import decode as fkd
    from kvviz.families.turboquant import decode as fqd
    from kvviz.families.turboquant import writer as fwt
    def lay(fmt, L=8):
        return fd.choose_layout(fmt, 64, 2, L, 16384)
    return {
        "attention/split_decode.wgsl": fd.render(fd.INT8, 64, 2, lay(fd.INT8), scatter=True),
        "ggml/decode_fast.wgsl": fgd.render(gg.TYPES["q4_1"], 64, 2, lay(fgd._FMT), scatter=True),
        "kivi/decode_fast.wgsl": fkd.render(2, 64, 2, lay(fkd.code_format(2)), 32, scatter=True),
        "turboquant/decode_fast.wgsl": fqd.render(64, 2, lay(fqd.TQ_FORMAT, 4), scatter=True),
        "turboquant/decode_fast_paged.wgsl": fqd.render(64, 2, lay(fqd.TQ_FORMAT, 4), True, 16, True, True),
        "fp4/decode_fast.wgsl": f4d.render(64, 2, lay(f4d._FMT), 16, True, True),
        "turboquant/write_fast.wgsl": fwt.render_defines(64, 8, tqf.TQSettings(64)),
        **prefill_defines(),
    }


def prefill_defines() -> dict:
    """The prefill shells' defines (kvviz/attention/prefill.py), each at head 64, GQA 2, its split (partials) kernel."""
    from kvviz.attention import prefill as pf

    lay = pf.choose_layout(64, 2, 16384)
    return {path: {**{k: str(v) for k, v in pf.sizes(lay, 16, True).items()}, **defines}
            for path, defines in pf.representative_defines(64).items()}


DEFINES.update(_generated_defines())


# ------------------------------------------------------------------------------------ includes
def test_include_resolves_nested_files(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "inner.wgsl").write_text("const INNER: u32 = 1u;\n")
    (tmp_path / "a" / "outer.wgsl").write_text('// #include "a/inner.wgsl"\nconst OUTER: u32 = 2u;\n')
    src = resolve_includes('  // #include "a/outer.wgsl"\nfn main() {}\n', "k.wgsl", root=tmp_path)
    assert src.splitlines() == ["const INNER: u32 = 1u;", "const OUTER: u32 = 2u;", "fn main() {}"]


def test_missing_include_names_the_line_and_the_file(tmp_path):
    with pytest.raises(ShaderCompileError) as e:
        resolve_includes('fn a() {}\n// #include "quant/nope.wgsl"\n', "fam/k.wgsl", root=tmp_path)
    msg = str(e.value)
    assert "fam/k.wgsl:2" in msg and "quant/nope.wgsl" in msg and "names no file" in msg
    assert "relative to the shaders/ folder" in e.value.hint


def test_include_cycle_is_refused(tmp_path):
    (tmp_path / "x.wgsl").write_text('// #include "y.wgsl"\n')
    (tmp_path / "y.wgsl").write_text('// #include "x.wgsl"\n')
    with pytest.raises(ShaderCompileError, match="includes itself"):
        resolve_includes('// #include "x.wgsl"\n', "k.wgsl", root=tmp_path)


def test_quant_kernels_include_common_and_turboquant_shares_its_steps():
    src = ShaderSpec("int8/write.wgsl").rendered()
    assert "fn div_rn_bits(" in src and not any(l.lstrip().startswith("// #include") for l in src.splitlines())
    comp = ShaderSpec("turboquant/tq_compress.wgsl", "tq_compress_keys").rendered()
    # keys: the prologue's norm tree + the residual tree; values: the prologue's tree
    assert comp.count("if tid < 64u { red[tid] = red[tid] + red[tid + 64u]; }") == 3
    assert comp.count("rot[i + stride] = a - b;") == 3  # keys: polar and JL transforms; values: polar


# ------------------------------------------------------------------------------------ defines
def test_wgsl_defines_fill_placeholders_and_a_missing_one_is_an_error():
    assert render_wgsl_defines("const B: u32 = {{BITS}}u;", (("BITS", "4"),), "k") == "const B: u32 = 4u;"
    with pytest.raises(ShaderCompileError, match=r"no value for \{\{GROUP\}\}"):
        render_wgsl_defines("const G: u32 = {{GROUP}}u; const B = {{BITS}};", (("BITS", "2"),), "int4_write")
    spec = KernelSpec("int4/write.wgsl").define(GROUP=64).shader()
    assert spec.defines == (("GROUP", "64"),) and "const G: u32 = 64u;" in spec.rendered()


def test_glsl_declarations_follow_the_defines():
    src = ShaderSpec("attention/paged_attn_weights.comp").rendered()
    d = declarations(src, "glsl", (("KV_Q8", "1"),))
    assert d.bindings[1] == ("kc", READ) and d.bindings[4] == ("o", READ_WRITE)
    assert d.immediates[-1] == ("scale", "f32") and len(d.immediates) == 8


# ------------------------------------------------------------------------------------ specs
def _all_specs():
    for name in families.FAMILIES:
        for spec in families.kernel_specs(name):
            yield pytest.param(spec, id=f"{name}:{spec.name}")


@pytest.mark.parametrize("kspec", list(_all_specs()))
def test_every_kernel_spec_matches_its_shader(kspec):
    """The declared bindings (names, access, order), immediates and params sizes agree with the shader."""
    shader = kspec.shader(**DEFINES.get(kspec.path, {}))
    kspec.check(declarations(shader.rendered(), shader.language, shader.defines), shader.path)


def test_a_spec_that_disagrees_with_the_shader_is_refused_naming_both():
    good = families.kernel_specs("int8")[0]
    wrong_access = KernelSpec(good.path, bindings=ro("key_in", "val_in", "slots", "k_cache") + rw("v_cache"),
                              immediates=good.immediates)
    shader = good.shader()
    decl = declarations(shader.rendered(), "wgsl")
    with pytest.raises(ShaderCompileError) as e:
        wrong_access.check(decl, "shaders/int8/write.wgsl")
    msg = str(e.value)
    assert "binding 3: the spec says k_cache (read), the shader declares k_cache (read_write)" in msg
    assert "int8/write.wgsl" in msg
    missing = KernelSpec(good.path, bindings=good.bindings[:4], immediates=Struct("P", "kvh hd bs"))
    with pytest.raises(ShaderCompileError) as e:
        missing.check(decl, "x")
    assert "binding 4: the spec says nothing, the shader declares v_cache (read_write)" in str(e.value)
    assert "immediates: the spec says {kvh: u32, hd: u32, bs: u32}" in str(e.value)
    renamed = KernelSpec(good.path, bindings=ro("key", "val_in", "slots") + rw("k_cache", "v_cache"),
                         immediates=good.immediates)
    with pytest.raises(ShaderCompileError, match="binding 0: the spec says key .read., the shader declares key_in"):
        renamed.check(decl, "x")
    params = families.kernel_specs("turboquant")[2]  # tq_rotate_q: a 16-word params buffer
    short = KernelSpec(params.path, params.entry, params.bindings, buffers=(("params", Struct("p", "a b", words=8)),))
    tq = params.shader()
    with pytest.raises(ShaderCompileError, match="declares 16 words, the params struct p packs 8"):
        short.check(declarations(tq.rendered(), "wgsl"), "x")
    with pytest.raises(ShaderCompileError, match="entry point 'nope'"):
        KernelSpec(params.path, "nope", params.bindings).check(declarations(tq.rendered(), "wgsl"), "x")


def test_compile_refuses_a_mismatched_spec(rt):
    bad = KernelSpec("copy/copy_vec4.wgsl", bindings=ro("src", "dst"), immediates=Struct("Params", "n_vec4 stride"))
    with pytest.raises(ShaderCompileError, match="binding 1: the spec says dst .read., the shader declares dst .read_write."):
        rt.compile(bad)
    k = rt.compile(families.kernel_specs("copy")[0])
    assert k.immediate_size == 8 and k.pack(n_vec4=3, stride=4) == struct.pack("<2I", 3, 4)
    with pytest.raises(TypeError, match="binds 2 buffers"):
        k.dispatch((1, 1, 1), [None])


# ------------------------------------------------------------------------------------ immediates
def test_struct_packs_itself():
    s = Struct("Pc", "num_kv_heads num_heads head_size scale:f32")
    want = struct.pack("<3If", 2, 8, 64, 0.125)
    assert s.size == 16 and s.pack(2, 8, 64, 0.125) == want
    assert s.pack(scale=0.125, head_size=64, num_heads=8, num_kv_heads=2) == want
    with pytest.raises(TypeError, match=r"missing fields \['scale'\]"):
        s.pack(num_kv_heads=2, num_heads=8, head_size=64)
    with pytest.raises(TypeError, match=r"unknown fields \['extra'\]"):
        s.pack(num_kv_heads=2, num_heads=8, head_size=64, scale=1.0, extra=1)
    with pytest.raises(TypeError, match="takes 4 fields"):
        s.pack(1, 2)
    with pytest.raises(ValueError):
        s.pack(-1, 2, 3, 1.0)  # not a u32
    p = Struct("params", "n x:f32", words=16)
    arr = p.array(7, np.float32(1 / 3))
    assert arr.dtype == np.uint32 and arr.shape == (16,) and arr[0] == 7 and not arr[2:].any()
    assert arr[1] == np.array([1 / 3], np.float32).view(np.uint32)[0]
    assert p.pack(1, 1e300)[4:8] == np.array([np.inf], np.float32).tobytes()  # beyond f32: infinity
    with pytest.raises(ValueError, match="type 'f64'"):
        Struct("bad", "x:f64")


# ------------------------------------------------------------------------------------ registry
def test_registry_finds_each_reference_by_name():
    expect = {"paged": "write_cache_int8", "int8": "quantize", "int4": "quantize_groups", "fp8": "quantize",
              "kivi": "write_buffers", "turboquant": "attention_oracle"}
    for name, fn in expect.items():
        fam = families.family(name)
        mod = families.reference(name)
        assert mod.__name__ == fam.reference and callable(getattr(mod, fn))
        assert fam.format is None or fam.format.startswith(("kvviz.families.", "kvviz.attention.int8_records"))
        assert all(s.path.startswith(fam.shaders + "/") for s in families.kernel_specs(name))
    with pytest.raises(InvalidInput, match="no numpy reference"):
        families.reference("copy")
    with pytest.raises(InvalidInput, match="Unknown kernel family 'int2'"):
        families.family("int2")


def test_product_path_imports_no_reference():
    code = (
        "import sys\n"
        "import kvviz.attention.paged, kvviz.attention.records, kvviz.families.turboquant.kernels, kvviz.gpu.copy\n"
        "import kvviz.families.catalogue, kvviz.methods, kvviz.analysis.session, kvviz.families.turboquant.bias\n"
        "import kvviz.methods.live_cache, kvviz.live.decode\n"
        "print(sorted(m for m in sys.modules if m.endswith(('.oracle', '_oracle', '_oracles'))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout
