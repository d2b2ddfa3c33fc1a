"""FMA throughput by the form of the arithmetic (kvviz/gpu/fma.py FmaForm, shaders/probe/fma_forms.wgsl): f32 and f16,
scalars, vec2 and vec4, more or fewer independent chains, several steps of each chain an iteration (which spreads
the loop's own instructions, naga's loop-bound counter among them, over more FMAs), the fma builtin against
a * m + c. What it answers: whether a device runs vec2<f16> / vec4<f16> as packed half2 operations at twice the
f32 rate, and what keeps the roofline probe (the first two rows) from it. Every row is checked against its numpy
steps (kvviz.gpu.fma.check_form: the median relative error of the sinks).
    python3 tools/fma_forms.py [--runs N]
"""
import argparse

from kvviz.gpu import fma
from kvviz.gpu.runtime import GpuRuntime

F = fma.FmaForm
FORMS = (
    F("f32"), F("f16"),  # the roofline probe's form
    # a constant multiplier: four steps of a chain an iteration spread the loop's instructions
    F("f32", 4, 8, 4), F("f16", 4, 8, 4), F("f16", 4, 16, 4), F("f16", 2, 16, 4), F("f16", 1, 32, 4),
    F("f32", 4, 8, 4, "muladd"), F("f16", 4, 8, 4, "muladd"),  # a * m + c: a compiler may fold the steps
    # coupled chains (the multiplier another chain's value): nothing to fold, fma() against a * b + c
    F("f32", 4, 8, 4, mul="chain"), F("f16", 4, 8, 4, mul="chain"), F("f16", 2, 16, 4, mul="chain"),
    F("f32", 4, 8, 4, "muladd", "chain"), F("f16", 4, 8, 4, "muladd", "chain"), F("f16", 2, 16, 4, "muladd", "chain"),
    F("f16", 2, 32, 4, "muladd", "chain"), F("f16", 1, 32, 4, "muladd", "chain"), F("f32", 1, 32, 4, "muladd", "chain"),
    # the constant multiplier's forms: the same in every component, or a register (from the immediates)
    F("f32", 4, 8, 4, mul="const1"), F("f16", 4, 8, 4, mul="const1"), F("f16", 2, 16, 4, mul="const1"),
    F("f32", 4, 8, 4, mul="uniform"), F("f16", 4, 8, 4, mul="uniform"), F("f16", 2, 16, 4, mul="uniform"),
)

ap = argparse.ArgumentParser()
ap.add_argument("--runs", type=int, default=20)
args = ap.parse_args()
rt = GpuRuntime()
print(rt.summary.line())
if "shader-f16" not in rt.features:
    raise SystemExit("this adapter has no shader-f16: only f32 forms would run")
base = {}
print(f"{'form':44s} {'median us':>10s} {'GFLOP/s':>10s} {'vs f32 same shape':>18s} {'rel err':>9s}")
for form in FORMS:
    r = fma.measure_form(rt, form, runs=args.runs, warmup=3)
    key = (form.width, form.chains, form.repeat, form.op, form.mul)
    if form.dtype == "f32":
        base[key] = r.gflops
    ratio = f"{r.gflops / base[key]:.2f}" if form.dtype == "f16" and key in base else ""
    print(f"{form.label:44s} {r.timing.median_us:10.1f} {r.gflops:10.0f} {ratio:>18s} {r.rel_err:9.1e}", flush=True)
