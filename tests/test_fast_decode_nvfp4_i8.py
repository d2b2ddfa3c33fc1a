"""Conformance of the fast NVFP4 decode's int8-query variant (kvviz/families/fp4/decode.py, qk="i8", default off).

Oracle: the float64 decode (kvviz/attention/paged_oracle.decode) of the query dequantised by the project's int8
quantiser (kvviz/families/int8/oracle.quantize: one scale a query head, amax/127, round half to even) over the cache
dequantised by the NVFP4 oracle (kvviz/families/fp4/oracle.dequantize: e2m1 * e4m3 * s_t). The caches are the oracle's
words (oracle.quantize, format.pack_records) built on the host, so only the decode kernel is built on the GPU.
Tolerance: the f32 kernel's, 2e-5 x max(1, max |V^|) (fast_decode_fp4.tolerance). The integer dots are exact (16 codes
a sub-block: |dot| <= 16 x 128 x 12 < 2^24), and so is their product with the E4M3 scale; what rounds is the sum over
sub-blocks and lanes and the query scale's multiply. The softmax and P.V are the f32 kernel's. Against the f32-query
oracle the variant must differ (it quantised the query) by no more than the query's rounding can move the logits:
(e^(2d) - 1) max |V^| with d = scale x q_scale / 2 x max_t |k_t|_1.
Grid: head sizes 32 and 64 (4 and 8 dims a lane on lavapipe's 8 lanes, inside a sub-block), 128 (a sub-block a lane),
256 (two), 80 (lanes walk 128 dims with padding); GQA 1, 2 and 4; ragged (an empty and a single-token sequence) and
scattered block tables; the all-lane and the scatter softmax, 1, 2 and 4 tokens a step, the folded reduce, the prefetch;
sub-blocks over E4M3's whole scale range (448 down to subnormal and zero); large logits; exact ties; a 20000+ token
context. Kernels here are the unrolled ones (lavapipe builds each in about a second); the cases share them where their
shapes agree.
"""
from __future__ import annotations

import numpy as np
import pytest

from kvviz.attention import paged_oracle as O
from kvviz.attention import split_decode as fd
from kvviz.errors import InvalidInput
from kvviz.families.fp4 import decode as ffd
from kvviz.families.fp4 import format as f4
from kvviz.families.fp4 import oracle as o4
from kvviz.families.int8 import oracle as o8
from kvviz.paging import make_batch

from harness import checked_variant_rows, empty_gives_zero

pytestmark = pytest.mark.gpu


def dequant_query(q):
    codes, scales = o8.quantize(q)
    return codes.astype(np.float64) * scales.astype(np.float64)[..., None]


def nvfp4_cache(rt, batch, x):
    """x [slots, kvh, D] f32 (every slot of the batch's blocks) -> (words on the GPU, float64 dequantised cache
    [blocks, kvh, block size, D], s_t, E4M3 scale codes of the real tokens): the oracle's, the tensor scale over the
    batch's real tokens as the method calibrates it."""
    nb, bs = batch.num_blocks, batch.block_size
    kvh, D = x.shape[1:]
    real = np.zeros(nb * bs, bool)
    real[batch.slot_mapping] = True
    s_t = o4.tensor_scale(x[real])
    codes, sc = o4.quantize(x, s_t)
    words = f4.pack_records(codes, sc).reshape(nb, bs, kvh, -1).transpose(0, 2, 1, 3).copy()
    deq = o4.dequantize(codes, sc, s_t).astype(np.float64).reshape(nb, bs, kvh, D).transpose(0, 2, 1, 3)
    return rt.upload(words, "kv"), deq, s_t, sc[real]


def run_i8(rt, lens, H, kvh, D, bs, *, seed=0, k=None, v=None, q=None, k_amp=1.0, v_amp=1.0, q_amp=1.0,
           policy="scattered", **kw):
    """The int8-query decode over NVFP4 caches (K, V random unless given as [slots, kvh, D]), asserted within
    fast_decode_fp4.tolerance of its own oracle and within the query's rounding bound of the f32-query oracle;
    returns (out, its distance to the f32-query oracle, the E4M3 scale codes of K and V)."""
    rng = np.random.default_rng(seed)
    batch = make_batch(lens, bs, policy=policy, seed=seed)
    slots = batch.num_blocks * bs
    k = (rng.standard_normal((slots, kvh, D)) * k_amp).astype(np.float32) if k is None else k
    v = (rng.standard_normal((slots, kvh, D)) * v_amp).astype(np.float32) if v is None else v
    (kb, kf, sk, kcodes), (vb, vf, sv, vcodes) = nvfp4_cache(rt, batch, k), nvfp4_cache(rt, batch, v)
    tensor = rt.upload(np.array([0.0, 0.0, sk, sv], np.float32).view(np.uint32), "nvfp4_tensor_scales")
    q = (rng.standard_normal((len(lens), H, D)) * q_amp).astype(np.float32) if q is None else q
    scale = D ** -0.5
    fast = ffd.Fp4FastDecode(rt)
    plan = fast.plan(kb, vb, tensor, kvh, q, batch, scale, qk="i8", **kw)
    assert not plan.looped and "int8 q" in plan.describe()
    rt.run(plan.dispatches)
    out = fast.read(plan)
    assert np.isfinite(out).all()
    empty_gives_zero(out, lens)
    ref = O.decode(dequant_query(q), kf, vf, batch.block_tables, batch.context_lens, bs, scale)
    real = np.zeros(slots, bool)
    real[batch.slot_mapping] = True
    M = float(np.abs(vf.transpose(0, 2, 1, 3).reshape(slots, kvh, D)[real]).max(initial=0.0))
    tol = ffd.tolerance(M)
    err = np.abs(out - ref)
    worst = np.unravel_index(np.argmax(err), err.shape) if err.size else ()
    assert err.max(initial=0.0) <= tol, (f"D{D} H{H}/{kvh} bs{bs} lens {lens[:6]}: error {err[worst]:.3g} > {tol:.3g} "
                                         f"at {worst} ({plan.describe()})")
    # the query's int8 rounding moves the output by no more than it can move the logits
    ref_f32q = O.decode(q.astype(np.float64), kf, vf, batch.block_tables, batch.context_lens, bs, scale)
    _, qs = o8.quantize(q)
    for s, n in enumerate(batch.context_lens):
        if not n:
            continue
        ks = O.gather_sequence(kf, batch.block_tables[s], int(n), bs)  # [kvh, n, D]
        for h in range(H):
            d = scale * float(qs[s, h]) / 2 * np.abs(ks[h // (H // kvh)]).sum(-1).max()
            bound = np.expm1(2 * d) * M + tol
            assert np.abs(out[s, h] - ref_f32q[s, h]).max() <= bound, f"seq {s} head {h}: past the query's rounding bound"
    return out, float(np.abs(out - ref_f32q).max(initial=0.0)), (kcodes, vcodes)


# lavapipe's 8 lanes a row: 32 -> 4 dims a lane (a nibble of one code word), 64 -> 8 (a nibble of two), 128 -> a
# sub-block, 256 -> two, 80 -> 16 dims a lane walking 128 (padded: a zero query past the head)
@pytest.mark.parametrize("D,H,kvh,bs,lens,policy,kw", [
    (64, 8, 2, 16, [1, 17, 0, 64, 200], "scattered", {}),
    (32, 4, 2, 16, [5, 70, 0, 1], "scattered", dict(unroll=4)),
    (128, 2, 2, 32, [1, 33, 0, 130], "scattered", dict(scatter=False)),
    (256, 2, 2, 16, [130, 1, 5], "contiguous", dict(unroll=1, fold=True)),
    (80, 4, 1, 8, [1, 40, 0, 99], "scattered", dict(partition_tokens=32)),
], ids=["d64-gqa4-ragged", "d32-gqa2-unroll4", "d128-gqa1-all-lane", "d256-gqa1-unroll1-fold", "d80-gqa4-padded"])
def test_i8_head_sizes_and_gqa(rt, D, H, kvh, bs, lens, policy, kw):
    _, moved, _ = run_i8(rt, lens, H, kvh, D, bs, seed=D + bs, policy=policy, **kw)
    assert moved > 1e-5  # the variant really quantised the query


def test_i8_e4m3_scale_extremes(rt):
    """Sub-blocks over E4M3's whole scale range: each scaled by 10^[-6, 0] (the largest at 448, the smallest
    subnormal or zero), K large and the query small enough that the logits stay moderate, V small; and large logits
    (hundreds) over unit-size values. (test_i8_head_sizes_and_gqa's first shape: the same kernel.)"""
    rng = np.random.default_rng(21)
    lens, H, kvh, D, bs = [90, 1, 0, 33], 8, 2, 64, 16
    slots = make_batch(lens, bs, policy="scattered", seed=21).num_blocks * bs
    amp = 10.0 ** rng.uniform(-6, 0, (slots, kvh, D // 16, 1))
    k = (rng.standard_normal((slots, kvh, D // 16, 16)) * amp * 1e6).reshape(slots, kvh, D).astype(np.float32)
    v = (rng.standard_normal((slots, kvh, D // 16, 16)) * amp[::-1] * 1e-3).reshape(slots, kvh, D).astype(np.float32)
    _, moved, codes = run_i8(rt, lens, H, kvh, D, bs, seed=21, k=k, v=v, q_amp=1e-4)
    for c in codes:
        assert (c == 0x7E).any() and (c < 8).any(), "E4M3 scales at 448 and subnormal or zero"
    assert moved > 0
    _, moved, _ = run_i8(rt, lens, H, kvh, D, bs, seed=4, k_amp=4.0, q_amp=40.0)
    assert moved > 1e-5


def test_i8_exact_ties(rt):
    """Every key of a sequence the same (its logits tie exactly: the same integer dots), and a zero query (every
    logit 0): the softmax is uniform, the output V^'s mean, in both the kernel and its oracle."""
    rng = np.random.default_rng(5)
    lens, H, kvh, D, bs = [70, 1, 0, 33], 8, 2, 64, 16
    slots = make_batch(lens, bs, policy="scattered", seed=5).num_blocks * bs
    k = np.broadcast_to(rng.standard_normal((1, kvh, D)), (slots, kvh, D)).astype(np.float32)
    q = rng.standard_normal((len(lens), H, D)).astype(np.float32)
    q[3] = 0.0
    run_i8(rt, lens, H, kvh, D, bs, seed=5, k=k, q=q)


def test_i8_long_context(rt):
    """20017 tokens in one sequence over the default split (many partitions, each within lavapipe's loop limit), the
    softmax peaked (GQA 4 at head 64, block size 16: test_i8_head_sizes_and_gqa's first kernel)."""
    out, moved, _ = run_i8(rt, [20017], 4, 1, 64, 16, seed=5, policy="contiguous", q_amp=4.0)
    assert moved > 1e-5


def test_i8_prefetch_bit_identical(rt):
    """The software-pipelined loads do the same arithmetic: the same bits as the single-buffered kernel."""
    a, *_ = run_i8(rt, [33, 0, 150, 1], 4, 2, 64, 8, seed=3, prefetch=True, partition_tokens=32)
    b, *_ = run_i8(rt, [33, 0, 150, 1], 4, 2, 64, 8, seed=3, prefetch=False, partition_tokens=32)
    np.testing.assert_array_equal(a, b)


def test_i8_refusals(rt):
    fast = ffd.Fp4FastDecode(rt)
    batch = make_batch([10], 16)
    q = np.zeros((1, 4, 64), np.float32)
    k = rt.upload(np.zeros(16 * 2 * f4.words_per_token(64), np.uint32), "k")
    tensor = rt.upload(np.zeros(4, np.uint32), "tensor")
    with pytest.raises(InvalidInput, match="looped kernel is the exact f32 one"):
        fast.plan(k, k, tensor, 2, q, batch, 0.1, qk="i8", looped=True)
    with pytest.raises(InvalidInput, match=r"variant qk='bf16': one of \('f32', 'i8'\)"):
        fast.plan(k, k, tensor, 2, q, batch, 0.1, qk="bf16")


def test_default_render_has_no_variant_code():
    """The default kernel stays the exact f32 one: an f32 query, no dot4I8Packed, no doubled E2M1 values; the
    variant's render has them, and the looped one refuses it."""
    lay = fd.choose_layout(ffd._FMT, 128, 4, 8, 16384)
    d = ffd.render(128, 4, lay)
    text = "".join(d.values())
    assert "dot4I8Packed" not in text and "e2m1x4i8" not in text and d["Q_TYPE"] == "f32" and d["VARIANT"] == "f32"
    v = ffd.render(128, 4, lay, qk="i8")
    assert "dot4I8Packed" in v["STEP"] and "e2m1x4i8" in v["HELPERS"]
    assert v["Q_TYPE"] == "u32" and v["VARIANT"] == fd.variant_name("i8")
    with pytest.raises(InvalidInput, match="looped"):
        ffd.render(128, 4, lay, looped=True, qk="i8")
    with pytest.raises(InvalidInput, match="variant"):
        ffd.render(128, 4, lay, qk="f16")


def test_bench_variant_rows(rt):
    """kvviz bench --variants times NVFP4's int8-query decode (4 and 2 tokens a row) and its folded reduce beside its
    exact fast decode, each held to its own oracle; no f16-pair P.V row (its P.V is f32)."""
    rows = checked_variant_rows(rt, "nvfp4", ("fast_decode_nvfp4 (int8 query)",
                                         "fast_decode_nvfp4 (int8 query, 2 tokens a row)",
                                         "fast_decode_nvfp4 (reduce folded in)"))
    assert "f32-query oracle" in rows["fast_decode_nvfp4 (int8 query)"]["note"]
    assert not any("f16x2" in k for k in rows)
