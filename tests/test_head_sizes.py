"""The head sizes real models use (80, 96, 112, 120, 192, 256; vLLM's attention tests cover them) through
TurboQuant, int4_group and KIVI, on the GPU (lavapipe) against the numpy oracles.

  TurboQuant: head sizes other than 32/64/128 run the general kernels with the rotation padded to the next
    power of two (kvviz/families/turboquant/format.py); exactness as tests/test_turboquant_settings.py states (words
    and dequantised cache equal to the oracle on lavapipe; attention within 2e-5 * max(1, max|V^|)).
  int4_group: a group_size that does not divide the head size becomes the largest multiple of 8 below it
    that does, with at most 8 groups (Int4Group.group_for); the cache words equal the oracle's at that group
    and the dequantised cache within the fma allowance of tests/test_quant_methods.py.
  KIVI: a head that is not a multiple of 16 runs padded to one (K zero channels, V channel 0 repeated); the
    words equal the oracle's on the padded input, the per-token value codes equal the unpadded quantiser's.
"""
from __future__ import annotations

import os

os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")

import numpy as np
import pytest

from kvviz.errors import UnsupportedShape
from kvviz.families.registry import get_method, reference
from kvviz.families.int4 import oracle as o4
from kvviz.families.kivi import oracle as okv
from kvviz.paging import make_batch

from test_quant_methods import check_method, make_kv  # noqa: E402 - the per-token conformance helpers
from test_turboquant_settings import _check_caches  # noqa: E402 - the general TurboQuant check

pytestmark = pytest.mark.gpu

HEAD_SIZES = (80, 96, 112, 120, 192, 256)


@pytest.mark.parametrize("D", HEAD_SIZES)
def test_turboquant_takes_real_head_sizes(ctx, D):
    m = get_method("turboquant")  # the default (seed) configuration: only the head size is new
    m.check(8, 2, D, 16)
    P = 128 if D <= 128 else 256
    k_l, v_l = m.layouts(D, 16)
    if P != D:
        assert f"{D} -> {P}" in k_l.description and "extra bits per element" in k_l.description
    assert k_l.bits_per_element == pytest.approx(32 * (P * 3 // 32 + 1) / D)  # 2-bit codes + JL bits + norms over P
    batch = make_batch([23, 9], 8, policy="scattered", seed=D, pad_every=4)
    rng = np.random.default_rng(D)
    T = batch.num_tokens
    k = rng.standard_normal((T, 2, D)).astype(np.float32)
    v = rng.standard_normal((T, 2, D)).astype(np.float32)
    qkv = _check_caches(ctx, m, batch, k, v)
    q = rng.standard_normal((2, 4, D)).astype(np.float32)
    out = m.attend(ctx, qkv, batch, q, D ** -0.5)
    ref, tol = reference("turboquant")(m, batch, k, v, q, D ** -0.5)
    assert out.shape == (2, 4, D) and np.abs(out - ref).max() <= tol


def test_turboquant_seed_sizes_keep_the_seed_kernels(ctx):
    m = get_method("turboquant")
    for D in (32, 64, 128):
        assert m.uses_seed(D) and "the seed compressor's words, per token" in m.layouts(D, 16)[0].description
    batch = make_batch([5], 4)
    x = np.random.default_rng(0).standard_normal((5, 1, 64)).astype(np.float32)
    qkv = m.quantize(ctx, batch, x, x)
    assert "caches" in qkv.device and "paged" in qkv.device and "general" not in qkv.device
    with pytest.raises(UnsupportedShape, match="256"):
        m.check(2, 1, 320, 16)


@pytest.mark.parametrize("D,G,want", [(80, 32, 16), (112, 32, 16), (120, 32, 24), (120, 64, 40), (96, 64, 48),
                                      (80, 128, 80), (192, 128, 96), (256, 32, 32), (64, 128, 64), (200, 32, 0)])
def test_int4_group_rule(D, G, want):
    m = get_method("int4_group", group_size=G)
    assert m.group_for(D) == want
    if want:
        m.check(4, 2, D, 16)
        assert m.wpt(D) == D // 8 + 2 * (D // want)
        assert f"group of {want} " in m.layouts(D, 16)[0].description
    else:
        with pytest.raises(UnsupportedShape, match="no group"):
            m.check(4, 2, D, 16)


def test_int4_group_says_which_group_it_uses(ctx):
    """At a head size group_size does not divide (a head-24 dump at the default 32), the label, the options and
    a warning of the quantised cache say the group used (24); at one it divides, the label and options are the
    asked ones and there is no warning. The session's results and their JSON carry them."""
    from kvviz.analysis.session import Session, SessionConfig

    m = get_method("int4_group")
    m.check(2, 2, 24, 16)
    assert m.label == "int4 per group G=24 (32 does not divide head 24)" and m.options() == {"group_size": 24}
    batch = make_batch([11, 3], 8, policy="scattered", seed=4)
    rng = np.random.default_rng(24)
    k, v = make_kv(rng, batch.num_tokens, 2, 24)
    qkv = m.quantize(ctx, batch, k, v)
    assert qkv.warnings[0] == ("int4_group: group_size 32 does not divide head size 24: groups of 24 elements are "
                               "used (1 a token)")
    m.check(2, 2, 64, 16)
    assert m.label == "int4 per group G=32" and m.options() == {"group_size": 32}
    assert not m.quantize(ctx, batch, *make_kv(rng, batch.num_tokens, 2, 64)).warnings
    res = Session(ctx.rt).compute(SessionConfig(method="int4_group", head_size=24, num_heads=2, num_kv_heads=2,
                                                context_lens=(9, 4), timing_runs=3))
    assert res.method.label.startswith("int4 per group G=24 ") and any("groups of 24" in w for w in res.warnings)
    js = res.summary_json()
    assert js["method"]["options"] == {"group_size": 24} and js["config"]["method_options"] in ({}, {"group_size": 32})


@pytest.mark.parametrize("D", [80, 112, 120])
@pytest.mark.parametrize("G", [32, 64])
def test_int4_group_at_odd_head_sizes(ctx, D, G):
    m = get_method("int4_group", group_size=G)
    batch = make_batch([37, 1, 20], 8, policy="scattered", seed=1, pad_every=5)
    rng = np.random.default_rng(D + G)
    k, v = make_kv(rng, batch.num_tokens, 2, D)
    check_method(ctx, m, batch, k, v, 4)  # words exact, dequantised within the fma allowance, attention
    q = rng.standard_normal((3, 4, D)).astype(np.float32)
    qkv = m.quantize(ctx, batch, k, v)
    ref, tol = reference("int4_group")(m, batch, k, v, q, D ** -0.5)
    assert np.abs(m.attend(ctx, qkv, batch, q, D ** -0.5) - ref).max() <= tol
    assert qkv.k_scales.shape[-1] == D // m.group_for(D)


@pytest.mark.parametrize("D", [80, 112, 120])
@pytest.mark.parametrize("bits", [2, 4])
def test_kivi_at_odd_head_sizes(ctx, D, bits):
    m = get_method("kivi", bits=bits, recent=16)
    m.check(4, 2, D, 8)
    batch = make_batch([70, 5, 33], 8, policy="scattered", seed=2)
    rng = np.random.default_rng(D * bits)
    k, v = make_kv(rng, batch.num_tokens, 2, D)
    qkv = m.quantize(ctx, batch, k, v)
    Dp = m.padded_head(D)
    assert qkv.head_size == D and qkv.k_codes.shape[-1] == D and qkv.extra["padded_head"] == Dp
    kp, vp, _ = okv.pad_head(k, v)
    ref = okv.write_buffers(batch, kp, vp, bits, 16)
    bufs = m.read_buffers(ctx, qkv)
    np.testing.assert_array_equal(bufs["k"], ref["k"])
    np.testing.assert_array_equal(bufs["v"], ref["v"])
    fk, fv = okv.dequantize_cache(batch, kp, vp, bits, 16, ref["per_seq"])
    got = m.read_f32(ctx, qkv, "V")
    assert got.shape[-1] == D
    zs = [dict(qs, k_codes=0 * qs["k_codes"], v_codes=0 * qs["v_codes"], k_res=0 * qs["k_res"], v_res=0 * qs["v_res"])
          for qs in ref["per_seq"]]
    _, vz = okv.dequantize_cache(batch, kp, vp, bits, 16, zs)
    tol = 2.0**-22 * (np.abs(fv[..., :D]).astype(np.float64) + 2.0 * np.abs(vz[..., :D]))  # the fma allowance
    assert (np.abs(got.astype(np.float64) - fv[..., :D]) <= tol).all()
    # padding V with channel 0 leaves every token's range, so its codes, as the unpadded quantiser's
    s0 = batch.token_rows(0)[: int(ref["plan"].n_q[0])]
    codes, _, _ = o4.quantize_groups(v[s0], D, (1 << bits) - 1)
    np.testing.assert_array_equal(qkv.v_codes[s0], codes)
    q = rng.standard_normal((3, 4, D)).astype(np.float32)
    out = m.attend(ctx, qkv, batch, q, D ** -0.5)
    want, tol = reference("kivi")(m, batch, k, v, q, D ** -0.5)
    assert out.shape == (3, 4, D) and np.abs(out - want).max() <= tol
    k_l, _ = m.layouts(D, 8)
    assert k_l.head_size == D and (Dp == D or f"padded to {Dp}" in k_l.description)
