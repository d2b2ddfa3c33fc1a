"""The FMA probe's forms (kvviz/gpu/fma.py FmaForm, shaders/probe/fma_forms.wgsl): each form's sinks against its
numpy steps, a form that ran other iterations caught, the form accounting, bad forms refused."""
import pytest

from kvviz.gpu import fma

F = fma.FmaForm


def run_form(rt, form, iters):
    d, flops, out, threads, it = fma.form_dispatches(rt, form, groups=2, iters=iters)
    assert it == iters and threads == 512 and flops == threads * iters * form.flops_per_iteration
    rt.run(d)
    return out, threads


@pytest.mark.parametrize("form", [F(), F("f32", 1, 8, 3), F("f32", 2, 4, 2, "muladd", "uniform"),
                                  F("f32", 4, 3, 2, mul="const1")], ids=lambda f: f.label)
def test_f32_forms_match_their_steps(rt, form):
    out, threads = run_form(rt, form, 60)
    assert fma.check_form(rt, form, out, threads, 60) < 1e-5
    assert fma.check_form(rt, form, out, threads, 100) > 1e-3  # other iterations are caught


@pytest.mark.parametrize("form", [F("f16", 2, 4, 2, "muladd"), F("f16", 4, 4, 1, "muladd", "const1"),
                                  F("f16", 1, 6, 2, "muladd", "uniform")], ids=lambda f: f.label)
def test_f16_unfused_forms_match_their_steps(rt, form):
    if "shader-f16" not in rt.features:
        pytest.skip("no shader-f16 on this adapter")
    out, threads = run_form(rt, form, 60)
    # each step rounds the product and the sum to f16, as numpy's float16 does (lavapipe rounds so); a hardware
    # driver may reassociate a * m + c over a multiplier that does not change in the loop (NVIDIA's folds steps:
    # docs/benchmarks.md), so there the sinks are only close
    exact = rt.summary.is_software
    assert fma.check_form(rt, form, out, threads, 60) <= (0.0 if exact else 1e-2)
    # 40 more steps move the sinks by 2.9e-2 or more (the forms' numpy steps)
    assert fma.check_form(rt, form, out, threads, 100) > (1e-3 if exact else 2e-2)


def test_coupled_chains(rt):
    """The coupled chains (a_k a_(k+1) + c) in the shader's order: exact in f16 after 3 steps (before the fixed point
    hides the count), and a different step count is caught there."""
    for form in (F("f32", 4, 3, 1, mul="chain"), F("f16", 2, 5, 1, "muladd", "chain")):
        if form.dtype == "f16" and "shader-f16" not in rt.features:
            continue
        out, threads = run_form(rt, form, 3)
        assert fma.check_form(rt, form, out, threads, 3) < 1e-6, form.label
        assert fma.check_form(rt, form, out, threads, 2) > 1e-3, form.label


def test_form_accounting_and_refusals():
    assert F().flops_per_iteration == fma.FLOPS_PER_STEP  # the roofline probe's form
    assert F("f16", 2, 16, 4).flops_per_iteration == 256
    assert F("f16", 2, 16, 4, mul="chain").label == "vec2<f16> x 16 chains x 4, fma(a, next chain, c)"
    for bad in (dict(dtype="f64"), dict(width=3), dict(chains=0), dict(repeat=17), dict(op="mad"), dict(mul="x")):
        with pytest.raises(ValueError):
            F(**bad)
