"""The quantisation methods (int8_token, int4_group, fp8_e4m3/e5m2, kivi) on the GPU (lavapipe in CI) against
their numpy oracles (kvviz/oracles/{int8,int4,fp8,kivi}.py): the shared helpers bit for bit, huge values,
refusals, device limits, layouts, the inspector and the registry. The grid of every method x shape and the bad
input every method refuses are in tests/test_conformance.py (the check: tests/harness.py quant_method_check).

What is exact and why:
  * Every quantiser divides with a correctly rounded integer division (shaders/common/quant.wgsl,
    div_rn_bits; checked bit for bit against numpy below) and takes min / max on integer keys of
    the float bits. So the written cache words -- codes, scales, zeros, FP8 bytes, KIVI side
    streams and residual rows -- must EQUAL the oracle's, word for word: no one-code allowance at
    .5 ties is needed (a hardware x / y, 2.5 ulp in Vulkan, would need one).
  * FP8 codes are bit exact against ml_dtypes (after clipping: the kernels saturate).
  * Dequantised caches: int8 and FP8 are one float32 multiply -> exact. int4 / KIVI compute
    code*scale + zero, which Vulkan lets a driver contract into an fma (seen on an NVIDIA H200;
    lavapipe does not): allowed 2^-22 * (|result| + 2|zero|), see fused_tol.
  * Attention runs through the f32 paged decode over the dequantised cache; it accumulates in f32,
    the oracle in float64 from the oracle's dequantised cache: |out - ref| <= 2e-5 * max(1, max|V^|),
    weights within 2e-6 (the tolerances of tests/test_paged_conformance.py for the f32 kernels).
"""
from __future__ import annotations

import numpy as np
import pytest

from kvviz.errors import DeviceLimitError, InvalidInput, UnsupportedShape
from kvviz.attention import records as qk
from kvviz.families.registry import get_method, registry
from kvviz.families.fp8 import oracle as of8
from kvviz.paging import PAD_SLOT, make_batch

from harness import quant_kv as make_kv
from harness import quant_method_check as check_method


# --------------------------------------------------------------------------- the helpers themselves
def test_div_rn_bit_exact(rt):
    rng = np.random.default_rng(0)
    n = 60000
    a = rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32).view(np.float32)
    b = rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32).view(np.float32)
    ok = np.isfinite(a) & np.isfinite(b) & (b != 0)
    sub = rng.integers(-(2**23), 2**23, 20000).astype(np.float32) * np.float32(2.0**-149)  # subnormal dividends
    A = np.concatenate([a[ok], sub, rng.standard_normal(20000), sub, [0.0, -0.0, 1.0, 3.0, 0.75]]).astype(np.float32)
    B = np.concatenate([b[ok], rng.uniform(0.1, 10, 20000), rng.uniform(0.5, 3, 20000),
                        rng.uniform(1e6, 1e9, 20000),  # subnormal quotients
                        [3.0, 7.0, 3.0, 3.0, 0.75 / 127]]).astype(np.float32)
    got = qk.selftest_div(rt, A, B)
    with np.errstate(all="ignore"):
        ref = (A / B).astype(np.float32)
    bad = np.flatnonzero(got.view(np.uint32) != ref.view(np.uint32))
    assert bad.size == 0, [(A[i], B[i], got[i], ref[i]) for i in bad[:5]]


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_fp8_encoder_bit_exact(rt, fmt):
    f = of8.FORMATS[fmt]
    rng = np.random.default_rng(1)
    rand = rng.integers(0, 2**32, 100000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    rand = rand[np.isfinite(rand)]
    vals = of8.decode(np.arange(256, dtype=np.uint8), f)
    vals = np.unique(vals[np.isfinite(vals)].astype(np.float64))
    mids = ((vals[1:] + vals[:-1]) / 2).astype(np.float32)  # exact ties: round half to even
    up, down = np.nextafter(mids, np.float32(np.inf)), np.nextafter(mids, np.float32(-np.inf))
    edge = np.float32([f.max, -f.max, f.max * 1.03, f.max * 1.0625, f.max * 1.07, 3e38, -3e38, 1e-40, -1e-40, 0.0, -0.0])
    x = np.concatenate([rand, mids, up, down, vals.astype(np.float32), edge,
                        (rng.standard_normal(20000) * f.max / 4).astype(np.float32)]).astype(np.float32)
    codes, dec = qk.selftest_fp8(rt, x, f)
    ref = of8.encode(x, f)
    bad = np.flatnonzero(codes != ref)
    assert bad.size == 0, [(x[i], hex(codes[i]), hex(ref[i])) for i in bad[:5]]
    assert codes[np.flatnonzero(x == np.float32(-0.0))[0]] in (0x80, 0x00)
    assert (codes[x == np.float32(-1e-40)] == 0x80).all()  # signed zero kept
    assert (np.abs(of8.decode(codes, f)) <= f.max).all()  # saturated: never NaN / inf
    np.testing.assert_array_equal(dec.view(np.uint32), of8.decode(codes, f).view(np.uint32))


# ------------------------------------------------------------------------------------- conformance
@pytest.mark.parametrize("mk", [("int8_token", {}), ("int4_group", {"group_size": 32}), ("fp8_e4m3", {"scale_mode": "per_token"}),
                                ("fp8_e4m3", {"scale_mode": "per_tensor"}), ("fp8_e5m2", {"scale_mode": "per_token"}),
                                ("fp8_e5m2", {"scale_mode": "per_tensor"}), ("kivi", {"bits": 4, "recent": 0})],
                         ids=lambda x: x if isinstance(x, str) else None)
def test_huge_values(ctx, mk):
    """1e30 entries in some tokens' keys and values: per-token methods keep other tokens intact,
    FP8 per-tensor scales everything by 1e30/max so the ordinary tokens underflow to (signed) zero."""
    key, opts = mk
    m = get_method(key, **opts)
    batch = make_batch([40, 7], 16, policy="scattered", pad_every=6)
    rng = np.random.default_rng(5)
    T, kvh, D = batch.num_tokens, 2, 64
    k = rng.standard_normal((T, kvh, D)).astype(np.float32)
    v = rng.standard_normal((T, kvh, D)).astype(np.float32)
    k[4, 0, 3] = 1e30
    k[9, 1, :] = -1e30
    v[5, 1, 7] = 1e30
    qkv, ref = check_method(ctx, m, batch, k, v, 4)
    real = batch.slot_mapping != PAD_SLOT
    if key.startswith("fp8") and opts["scale_mode"] == "per_tensor":
        ks, vs = m.tensor_scales(ctx, qkv)
        assert ks == np.float32(1e30) / np.float32(m.fmt.max) and vs == np.float32(1e30) / np.float32(m.fmt.max)
        bits = qkv.extra["k_fields"]["code_bits"][real]
        assert np.isin(bits, [0x00, 0x80]).mean() > 0.95  # the ordinary tokens flush to +-0
    if key.startswith("fp8") and opts["scale_mode"] == "per_token":
        ordinary = real.copy()
        ordinary[[4, 5, 9]] = False
        assert (qkv.k_codes[ordinary] != 0).mean() > 0.9


def test_unsupported_shapes_and_options(ctx):
    for key, opts, D in [("int8_token", {}, 66), ("int8_token", {}, 512), ("int4_group", {"group_size": 32}, 36),
                         ("int4_group", {"group_size": 32}, 200), ("int4_group", {"group_size": 64}, 264),
                         ("fp8_e5m2", {}, 30), ("kivi", {"bits": 2}, 0), ("kivi", {"bits": 4}, 264)]:
        with pytest.raises(UnsupportedShape):
            get_method(key, **opts).check(4, 2, D, 16)
    with pytest.raises(UnsupportedShape):
        get_method("kivi").check(6, 4, 64, 16)  # GQA ratio
    for key, opts in [("int4_group", {"group_size": 16}), ("fp8_e4m3", {"scale_mode": "per_channel"}),
                      ("kivi", {"bits": 3}), ("kivi", {"recent": -1})]:
        with pytest.raises(InvalidInput):
            get_method(key, **opts)
    # asymmetric methods need max - min finite in float32
    batch = make_batch([4], 8)
    k = np.ones((4, 1, 64), np.float32)
    k[0, 0, 0] = 3e38
    for key, opts in [("int4_group", {"group_size": 32}), ("kivi", {"bits": 2})]:
        with pytest.raises(InvalidInput):
            get_method(key, **opts).quantize(ctx, batch, k, np.ones_like(k))
    # a batch laid out for fewer rows than the input
    with pytest.raises(InvalidInput):
        get_method("int8_token").quantize(ctx, make_batch([3], 8), k, k)
    # KIVI needs whole sequences (its key groups span 32 positions): a decode-step batch is refused
    import dataclasses

    full = make_batch([40], 16)
    step = dataclasses.replace(full, slot_mapping=full.slot_mapping[-1:], token_seq=full.token_seq[-1:],
                               token_pos=full.token_pos[-1:])
    one = np.ones((1, 1, 64), np.float32)
    with pytest.raises(InvalidInput):
        get_method("kivi").quantize(ctx, step, one, one)
    assert get_method("int8_token").quantize(ctx, step, one, one).k_codes.shape == (1, 1, 64)


# ----------------------------------------------------------------------------- device limits
def test_chunked_dispatches_and_windows(ctx):
    """Grid limit forced to 8 and storage binding to 48 KiB: writers, KIVI groups and the dequantise
    kernels are split into many dispatches, the f32 cache into binding windows, and stay exact."""
    rt = ctx.rt
    saved = dict(rt.limits)
    rt.limits["max-compute-workgroups-per-dimension"] = 8
    rt.limits["max-storage-buffer-binding-size"] = 48 << 10
    try:
        # contiguous: each sequence's blocks must fit one f32 binding window for the f32 decode
        batch = make_batch([150, 70, 9], 16, policy="contiguous", pad_every=11)
        rng = np.random.default_rng(11)
        k, v = make_kv(rng, batch.num_tokens, 1, 64)
        f32_bytes = batch.num_blocks * 16 * 64 * 4
        assert f32_bytes > rt.max_binding  # the f32 cache is bound in windows
        assert ctx.paged.window_blocks(ctx.paged.allocate("f32", batch.num_blocks, 1, 16, 64)) < batch.num_blocks
        for key, opts in [("int8_token", {}), ("fp8_e5m2", {"scale_mode": "per_tensor"}), ("kivi", {"bits": 4, "recent": 16})]:
            m = get_method(key, **opts)
            timed = m.timed_kernels(ctx, batch, k, v, rng.standard_normal((3, 2, 64)).astype(np.float32), 0.125)
            for tk in timed:
                assert all(max(d.grid) <= 8 for d in tk.dispatches), tk.name
                assert tk.bytes > 0
            first = next(t for t in timed if t.role == "writer" and t.impl == "first-wave")
            dequant = next(t for t in timed if t.role == "dequantise")
            assert len(first.dispatches) > batch.num_tokens // 8 and len(dequant.dispatches) > 2
            # the fast writer's 2-D grid takes the rows without chunking them by the grid limit
            fast = next(t for t in timed if t.role == "writer" and t.impl == "fast")
            assert 0 < len(fast.dispatches) < len(first.dispatches)
            check_method(ctx, m, batch, k, v, 2)
        with pytest.raises(DeviceLimitError) as e:  # a quantised cache over one binding is refused up front
            get_method("int8_token").quantize(ctx, make_batch([2000], 16), *make_kv(rng, 2000, 1, 64))
        assert "binding" in str(e.value)
    finally:
        rt.limits.clear()
        rt.limits.update(saved)


# --------------------------------------------------------------------------- layouts, inspector
def test_layout_accounting(ctx):
    D, bs = 128, 16
    lay = {k: get_method(k, **o).layouts(D, bs) for k, o in [("int8_token", {}), ("fp8_e4m3", {})]}
    assert lay["int8_token"][0].bits_per_element == 8 + 32 / D
    assert lay["fp8_e4m3"][1].bits_per_element == 8 + 32 / D
    assert get_method("fp8_e5m2", scale_mode="per_tensor").layouts(D, bs)[0].bits_per_element == 8
    for G, bits in [(32, 6.0), (64, 5.0), (128, 4.5)]:
        assert get_method("int4_group", group_size=G).layouts(D, bs)[0].bits_per_element == bits
    # KIVI 2-bit, R = 128, L = 4096: K = 2 (codes) + 2 (f32 scale+zero per channel per 32 tokens)
    # + 128 f32 rows / 4096 tokens = 1 bit; V = 2 + 64/128 + 1
    k, v = get_method("kivi", bits=2, recent=128, context_len=4096).layouts(D, bs)
    assert (k.bits_per_element, v.bits_per_element) == (5.0, 3.5)
    k, v = get_method("kivi", bits=4, recent=0, context_len=4096).layouts(D, bs)
    assert (k.bits_per_element, v.bits_per_element) == (6.0, 4.5)
    # the bytes a batch really occupies (full blocks) equal layouts_for_batch x tokens
    rng = np.random.default_rng(2)
    for bs in (8, 32, 64):
        batch = make_batch([128, 64, 192], bs, policy="scattered")
        kk, vv = make_kv(rng, batch.num_tokens, 2, 64)
        m = get_method("kivi", bits=4, recent=40)
        qkv = m.quantize(ctx, batch, kk, vv)
        qc = qkv.device["cache"]
        res_rows = qc.extra["plan"].total_res
        used = batch.num_tokens * qc.num_kv_heads
        k_bytes = qc.num_blocks * qc.num_kv_heads * qc.k_words * 4 + res_rows * qc.num_kv_heads * 64 * 4
        v_bytes = qc.num_blocks * qc.num_kv_heads * qc.v_words * 4 + res_rows * qc.num_kv_heads * 64 * 4
        kl, vl = m.layouts_for_batch(batch, 64)
        assert kl.bytes_per_token_per_head * used == pytest.approx(k_bytes, rel=1e-12)
        assert vl.bytes_per_token_per_head * used == pytest.approx(v_bytes, rel=1e-12)
        for m2 in (get_method("int4_group", group_size=64), get_method("fp8_e4m3")):
            q2 = m2.quantize(ctx, batch, kk, vv)
            assert m2.layouts(64, bs)[0].bytes_per_token_per_head * used == q2.device["cache"].num_blocks * qc.num_kv_heads * q2.device["cache"].k_words * 4


def test_inspect_block(ctx):
    batch = make_batch([20, 45], 16, policy="scattered", pad_every=4)
    rng = np.random.default_rng(3)
    k, v = make_kv(rng, batch.num_tokens, 2, 64)
    for key, opts in [("int8_token", {}), ("int4_group", {"group_size": 32}), ("fp8_e4m3", {"scale_mode": "per_tensor"}),
                      ("kivi", {"bits": 2, "recent": 8})]:
        m = get_method(key, **opts)
        qkv = m.quantize(ctx, batch, k, v)
        for s in range(batch.num_seqs):
            blk = int(batch.seq_blocks[s][0])
            for which in ("K", "V"):
                recs = m.inspect_block(ctx, qkv, batch, blk, 1, which)
                assert len(recs) == batch.block_size
                rows = batch.token_rows(s)
                codes = qkv.k_codes if which == "K" else qkv.v_codes
                for r in recs:
                    assert r.slot // batch.block_size == blk
                    if r.position < 0:
                        continue
                    t = rows[r.position]
                    if "residual_f32" in r.fields:
                        np.testing.assert_array_equal(r.fields["residual_f32"], (k if which == "K" else v)[t, 1])
                    else:
                        np.testing.assert_array_equal(r.fields["codes"], codes[t, 1])
                        sc = qkv.k_scales if which == "K" else qkv.v_scales
                        np.testing.assert_array_equal(np.asarray(r.fields["scale"]), sc[t, 1])


def test_timed_kernels_replay(ctx):
    """timed_kernels' dispatches can be replayed by GpuRuntime.time (timings are printed, never asserted)."""
    batch = make_batch([33, 20], 16, pad_every=7)
    rng = np.random.default_rng(4)
    k, v = make_kv(rng, batch.num_tokens, 2, 64)
    q = rng.standard_normal((2, 4, 64)).astype(np.float32)
    for key, opts in [("fp8_e4m3", {"scale_mode": "per_tensor"}), ("kivi", {"bits": 2, "recent": 0})]:
        for tk in get_method(key, **opts).timed_kernels(ctx, batch, k, v, q, 0.125):
            t = ctx.rt.time(tk.dispatches, runs=2, warmup=1)
            assert len(t.samples_us) == 2 and tk.bytes > 0
            print(f"{key} {tk.name} ({tk.role}, {tk.impl}): {t.median_us:.0f} us ({t.method}), {tk.bytes} bytes")


def test_registry():
    reg = registry()
    for key in ("int8_token", "int4_group", "fp8_e4m3", "fp8_e5m2", "kivi"):
        assert key in reg
    assert get_method("int4_group", group_size=64).options() == {"group_size": 64}
    assert get_method("kivi", bits=4).options()["recent"] == 128


# --------------------------------------------------------------------------- llama-like keys
def llama_like_keys(rng, T, kvh, D, outliers=(5, 40, 77, 100), factor=10.0):
    """Gaussian keys with a few channels ~10x larger in every token (a fixed sign per channel)."""
    k = rng.standard_normal((T, kvh, D)).astype(np.float32)
    ch = [c * D // 128 for c in outliers]
    sign = rng.choice([-1.0, 1.0], size=(kvh, len(ch)))
    k[:, :, ch] = (factor * sign[None] + rng.standard_normal((T, kvh, len(ch)))).astype(np.float32)
    return k


def test_llama_like_keys_per_channel_beats_per_token(ctx):
    from kvviz.analysis.compare import attention_errors, compare_methods, format_table

    D, kvh, H = 128, 2, 4
    batch = make_batch([256, 192], 16, policy="scattered", pad_every=13)
    rng = np.random.default_rng(2024)
    k = llama_like_keys(rng, batch.num_tokens, kvh, D)
    v = rng.standard_normal((batch.num_tokens, kvh, D)).astype(np.float32)
    q = rng.standard_normal((batch.num_seqs, H, D)).astype(np.float32)
    methods = [get_method(key, **o) for key, o in [
        ("int8_token", {}), ("fp8_e4m3", {"scale_mode": "per_token"}), ("fp8_e4m3", {"scale_mode": "per_tensor"}),
        ("fp8_e5m2", {"scale_mode": "per_token"}), ("fp8_e5m2", {"scale_mode": "per_tensor"}),
        ("int4_group", {"group_size": 32}), ("int4_group", {"group_size": 64}), ("int4_group", {"group_size": 128}),
        ("kivi", {"bits": 4, "recent": 0}), ("kivi", {"bits": 2, "recent": 0}), ("kivi", {"bits": 2, "recent": 128}),
    ]]
    rows = compare_methods(ctx, batch, k, v, q, float(1 / np.sqrt(D)), methods)
    print("\nllama-like keys (4 of 128 channels ~10x), 2 seqs (256, 192 tokens), 2 KV heads, 4 heads, block 16")
    print(format_table(rows, f32_bytes_per_token=2 * kvh * D * 4))
    for r in rows:  # decode time (the comparison's third axis): the fast decode where the method has one
        assert r["decode_us"] > 0 and r["decode_impl"], r
        assert (r["decode_impl"] == "fast") == (r["dequant_us"] is None), r
        assert r["decode_total_us"] == pytest.approx(r["decode_us"] + (r["dequant_us"] or 0.0))
        if r["method"] in ("int8_token", "fp8_e4m3", "fp8_e5m2", "int4_group"):
            assert r["decode_impl"] == "fast", r
    by = {(r["method"], tuple(sorted(r["options"].items()))): r for r in rows}
    kivi4 = by[("kivi", (("bits", 4), ("context_len", 4096), ("recent", 0)))]
    int4_32 = by[("int4_group", (("group_size", 32),))]
    # same group size (32), same 4 bits, nothing kept in f32 (recent 0, context multiple of 32)
    assert kivi4["kl_mean"] * 3 < int4_32["kl_mean"], (kivi4["kl_mean"], int4_32["kl_mean"])
    assert kivi4["kl_max"] < int4_32["kl_max"]
    assert kivi4["top8_overlap"] >= int4_32["top8_overlap"]
    # the metrics themselves: identical inputs give zero error, a perturbed row a positive KL
    w = rng.random((2, 3, 10))
    o = rng.standard_normal((2, 3, 8))
    same = attention_errors(w, w, o, o, [10, 6])
    assert same["kl_max"] == 0 and same["out_rel_l2"] == 0 and same["top8_overlap"] == 1
    w2 = w.copy()
    w2[0, 0, 0] *= 3
    assert attention_errors(w, w2, o, o, [10, 6])["kl_max"] > 0
