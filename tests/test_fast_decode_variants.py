"""Conformance of the fast decode's measured variants (kvviz/attention/split_decode.py, default off):

qk="i8"  int8 query + dot4I8Packed. Its own oracle: the float64 decode (kvviz/attention/paged_oracle.decode) of the
         query dequantised by the project's int8 quantiser (kvviz/families/int8/oracle.quantize: one scale a query
         head, amax/127, round half to even). The integer dot is exact (|sum| < 2^24, so f32 of it is exact
         too) and three f32 multiplies make the logit (fewer roundings than the f32 kernel's D-term dot), the
         softmax and P.V are the f32 kernel's: the f32 kernel's tolerance, 2e-5 x max(1, max|V|).
         Against the f32-q oracle its error is bounded by the q quantisation: |q - q'| <= q_scale/2 a dim, so
         a logit moves by at most d = scale * q_scale/2 * max_t |k_t|_1 and the output by (e^(2d) - 1) max|V|.
pv="f16" P.V in f16, flushed to f32 every pv_flush steps. Its own tolerance on top of the f32 kernel's,
         fd.pv_tolerance: (3 + U + (F - 1)(U + 2)) roundings of 2^-11 a term (first order) x max|V|, plus the
         f16 underflow term 5 x tokens x 2^(shift - 25) x max(1, max|V|) / l, with l the softmax sum (from
         the oracle's weights). Against the oracle of the same query (f32 or int8).
Grid: head sizes 64..256, MHA to GQA 16, block sizes 8..32, ragged + scattered with empty and single-token
sequences, values near each format's range (and f16's), large logits, a 40000-token context at 4 heads,
no subgroups, many partitions, several flush periods and unrolls.
"""
from __future__ import annotations

import types

import numpy as np
import pytest

from kvviz.errors import InvalidInput, UnsupportedShape
from kvviz.attention import split_decode as fd
from kvviz.families.int8 import oracle as o8
from kvviz.attention import paged_oracle as O
from kvviz.paging import make_batch

from harness import FORMATS  # the cache records of every format
from harness import build_caches

pytestmark = pytest.mark.gpu


def dequant_query(q):
    codes, scales = o8.quantize(q)
    return codes.astype(np.float64) * scales.astype(np.float64)[..., None]


def run_variant(rt, fmt, lens, H, kvh, D, bs, *, qk="f32", pv="f32", seed=0, amp=1.0, q_amp=1.0,
                policy="scattered", tensor=(1.0, 1.0), unroll=2, pv_flush=fd.PV_FLUSH, **kw):
    """The variant's output, asserted within its own tolerance of its own oracle; returns
    (out, q, caches, batch, max error) for further checks."""
    rng = np.random.default_rng(seed)
    batch = make_batch(lens, bs, policy=policy, seed=seed)
    (kw_, kf), (vw_, vf) = build_caches(fmt, rng, batch, kvh, D, amp, tensor if fmt.scale == "tensor" else (1.0, 1.0))
    assert np.isfinite(kf).all() and np.isfinite(vf).all()
    q = (rng.standard_normal((len(lens), H, D)) * q_amp).astype(np.float32)
    scale = 1.0 / np.sqrt(D)
    tb = rt.upload(np.array([0.0, 0.0, *tensor], np.float32).view(np.uint32), "tensor") if fmt.scale == "tensor" else None
    out = fd.FastDecode(rt).decode(fmt, rt.upload(kw_, "k"), rt.upload(vw_, "v"), kvh, q, batch, scale, tensor=tb,
                                   qk=qk, pv=pv, unroll=unroll, pv_flush=pv_flush, **kw)
    q_ref = dequant_query(q) if qk == "i8" else q
    args = (batch.block_tables, batch.context_lens, bs, scale)
    ref = O.decode(q_ref, kf, vf, *args)
    M = float(np.abs(vf).max())
    tol = np.full(out.shape, fd.f32_tolerance(M))
    if pv in ("f16", "h2"):
        wmax = O.decode_weights(q_ref, kf, *args).max(-1, initial=0.0)
        l_sum = np.where(wmax > 0, 1.0 / np.maximum(wmax, 1e-300) - 1e-6, 1.0)  # the softmax sum: its max term is 1
        tol = tol + fd.pv_tolerance(M, max(lens), unroll, pv_flush, np.maximum(l_sum, 1.0),
                                    4 if pv == "h2" and fmt.group_size else 2)[..., None]
    err = np.abs(out - ref)
    assert np.isfinite(out).all()
    worst = np.unravel_index(np.argmax(err - tol), err.shape) if err.size else ()
    assert (err <= tol).all(), (f"{fmt.name} qk={qk} pv={pv} D{D} H{H}/{kvh} bs{bs} lens {lens[:6]}: error "
                                f"{err[worst]:.3g} > {tol[worst]:.3g} at {worst}")
    return out, q, (kf, vf), batch, float(err.max(initial=0.0))


VARIANTS = [("i8", "f32"), ("f32", "f16"), ("i8", "f16")]


# ---------------------------------------------------------------------------------- qk = "i8"
# 120: lanes that walk the head with padding (a zero int8 query word past it)
@pytest.mark.parametrize("D,H,kvh,bs", [(64, 4, 4, 8), (80, 8, 1, 16), (96, 16, 1, 32), (120, 8, 2, 16), (128, 8, 2, 16),
                                        (256, 4, 2, 16)])
def test_i8_head_sizes_and_groups(rt, D, H, kvh, bs):
    run_variant(rt, fd.INT8, [1, 17, 0, 64, 200], H, kvh, D, bs, qk="i8", seed=D)


def test_i8_error_vs_f32_query_is_the_quantisation_bound(rt):
    """Against the f32-q oracle the int8-q output errs (it must: the query is quantised), but at most by
    what the quantised query can move the logits: (e^(2d) - 1) max|V| with d = scale q_scale/2 max_t |k_t|_1."""
    D, H, kvh, bs = 128, 8, 2, 16
    out, q, (kf, vf), batch, _ = run_variant(rt, fd.INT8, [37, 100, 300, 1, 129], H, kvh, D, bs, qk="i8")
    scale = 1.0 / np.sqrt(D)
    ref_f32q = O.decode(q, kf, vf, batch.block_tables, batch.context_lens, bs, scale)
    _, qs = o8.quantize(q)
    M = float(np.abs(vf).max())
    for s, n in enumerate(batch.context_lens):
        k = O.gather_sequence(kf, batch.block_tables[s], int(n), bs)  # [kvh, n, D]
        for h in range(H):
            d = scale * qs[s, h] / 2 * np.abs(k[h // (H // kvh)]).sum(-1).max()
            bound = np.expm1(2 * d) * M + fd.f32_tolerance(M)
            err = np.abs(out[s, h] - ref_f32q[s, h]).max()
            assert err <= bound, f"seq {s} head {h}: {err:.3g} > the q-quantisation bound {bound:.3g}"
    assert np.abs(out - ref_f32q).max() > 1e-5  # the variant really quantised the query


def test_i8_query_records_match_the_oracle_quantiser():
    rng = np.random.default_rng(1)
    q = (rng.standard_normal((3, 4, 64)) * rng.uniform(0.01, 100, (3, 4, 1))).astype(np.float32)
    q[0, 0] = 0.0  # a zero head: the 1e-8 scale floor, codes 0
    q[1, 1, :4] = [0.5, -0.5, 1.5, 127.0]  # exact .5 ties at scale 1: round half to even
    codes, scales = o8.quantize(q)
    got_c, got_s = fd.quantize_query(q)
    assert np.array_equal(got_c, codes) and np.array_equal(got_s, scales)
    assert list(got_c[1, 1, :4]) == [0, 0, 2, 127]
    rec = fd.query_records_i8(q)
    assert rec.shape == (3, 4, 17) and np.array_equal(rec[..., 16].view(np.float32), scales)
    assert np.array_equal(rec[..., :16].copy().view(np.int8), codes)


def test_i8_large_logits_and_values(rt):
    """Logits of hundreds (q x40, K x4) and V in the thousands, full int8 code range."""
    run_variant(rt, fd.INT8, [50, 513, 1], 8, 2, 128, 16, qk="i8", amp=4.0, q_amp=40.0)
    run_variant(rt, fd.INT8, [9, 130], 4, 1, 64, 16, qk="i8", amp=3000.0)


# ---------------------------------------------------------------------------------- pv = "f16"
@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f"{f.name}-{f.scale}-{f.group_size}")
def test_f16_pv_every_format_ragged_gqa(rt, fmt):
    run_variant(rt, fmt, [37, 100, 0, 300, 1, 129], 8, 2, 128, 16, pv="f16", tensor=(0.02, 0.5))


# the padded lanes of head 120 under a variant are the int8 query's case above (the unrolled kernels at 120 are the slowest to build)
@pytest.mark.parametrize("D,H,kvh,bs", [(64, 4, 4, 8), (80, 8, 1, 16), (96, 16, 1, 32), (256, 4, 2, 16)])
@pytest.mark.parametrize("fmt", [fd.F16, fd.INT8], ids=lambda f: f.name)
def test_f16_pv_head_sizes_and_groups(rt, fmt, D, H, kvh, bs):
    run_variant(rt, fmt, [1, 17, 64, 0, 200], H, kvh, D, bs, pv="f16", seed=D)


@pytest.mark.parametrize("unroll,flush", [(1, 1), (2, 1), (4, 4), (2, 16)])
def test_f16_pv_flush_periods_and_unrolls(rt, unroll, flush):
    run_variant(rt, fd.INT8, [700, 33, 1, 0], 8, 2, 128, 16, pv="f16", unroll=unroll, pv_flush=flush)


def test_f16_pv_values_near_the_f16_range(rt):
    """V up to ~5e4 (f16 tops out at 65504): the 2^-shift weight keeps the f16 accumulator in range;
    int8 codes +-127 x scales up to ~400, FP8 e4m3 codes up to 448 x scale."""
    run_variant(rt, fd.F16, [300, 1, 77], 4, 1, 64, 8, pv="f16", amp=11000.0)
    run_variant(rt, fd.INT8, [300, 1, 77], 4, 1, 64, 8, pv="f16", amp=25000.0)
    run_variant(rt, fd.fp8_format("e4m3", False), [300, 1, 77], 4, 1, 64, 8, pv="f16", amp=25000.0)
    run_variant(rt, fd.F32, [50, 513], 8, 2, 128, 16, pv="f16", amp=4.0, q_amp=40.0)  # large logits


def test_f16_pv_partitions_single_and_many(rt):
    a, *_ = run_variant(rt, fd.INT8, [700, 33, 2048], 8, 2, 128, 16, pv="f16", partition_tokens=4096)
    b, *_ = run_variant(rt, fd.INT8, [700, 33, 2048], 8, 2, 128, 16, pv="f16", partition_tokens=16)
    assert a.shape == b.shape


# ---------------------------------------------------------------------------------- the packed variants
# qk="i8" over int4 groups (even / odd nibbles against the query in that order, s * dot + z * sum q a group), pv="h2"
# (f16 pairs from the integer codes' bits, V values made once in f16): attention/split_packed.wgsl.j2. Tolerances as
# above: the i8 query's is the f32 kernel's against the dequantised query's oracle; h2's is pv_tolerance (with the
# int4 value's 4 roundings a term) on top.
INT4 = [fd.int4_format(32), fd.int4_format(64)]


@pytest.mark.parametrize("gs,D,H,kvh,bs", [(32, 64, 4, 4, 8), (64, 128, 8, 2, 16), (32, 256, 4, 2, 32)])
def test_i8_int4_groups_head_sizes(rt, gs, D, H, kvh, bs):
    run_variant(rt, fd.int4_format(gs), [1, 17, 0, 64, 200], H, kvh, D, bs, qk="i8", seed=D + gs)


def test_i8_int4_query_records_follow_the_nibble_order():
    """Each 8 dims of an int4 head's query codes go as dims 0, 2, 4, 6, 1, 3, 5, 7 (a code word's even nibbles, then
    its odd ones); the scale word is the same."""
    rng = np.random.default_rng(2)
    q = rng.standard_normal((2, 3, 64)).astype(np.float32)
    codes, scales = o8.quantize(q)
    rec = fd.query_records_i8(q, fd.int4_format(32))
    got = rec[..., :16].copy().view(np.int8).reshape(2, 3, 8, 8)
    assert np.array_equal(got, codes.reshape(2, 3, 8, 8)[..., [0, 2, 4, 6, 1, 3, 5, 7]])
    assert np.array_equal(rec[..., 16], fd.query_records_i8(q)[..., 16])


@pytest.mark.parametrize("fmt,qk", [(fd.INT8, "f32"), (fd.INT8, "i8"), (INT4[0], "i8"), (INT4[1], "f32")],
                         ids=lambda x: getattr(x, "name", x) + (f"-g{x.group_size}" if getattr(x, "group_size", 0) else ""))
def test_h2_pv_ragged_gqa(rt, fmt, qk):
    run_variant(rt, fmt, [37, 100, 0, 300, 1, 129], 8, 2, 128, 16, qk=qk, pv="h2", partition_tokens=64)


@pytest.mark.parametrize("fmt,unroll,flush,scatter", [(fd.INT8, 1, 1, None), (INT4[0], 4, 4, None),
                                                     (INT4[0], 2, 16, False), (fd.INT8, 4, 2, False)],
                         ids=lambda x: getattr(x, "name", str(x)))
def test_h2_pv_flush_periods_unrolls_and_softmaxes(rt, fmt, unroll, flush, scatter):
    run_variant(rt, fmt, [700, 33, 1, 0], 4, 2, 64, 16, qk="i8", pv="h2", unroll=unroll, pv_flush=flush,
                scatter=scatter)


def test_h2_pv_values_near_the_f16_range(rt):
    """V up to ~3e4: int8 codes +-127 x scales up to ~250; int4 c * s + z with |c s| <= 2 max|V| (kept below f16's
    65504) and large logits."""
    run_variant(rt, fd.INT8, [300, 1, 77], 4, 1, 64, 8, pv="h2", amp=25000.0)
    run_variant(rt, fd.int4_format(32), [300, 1, 77], 4, 1, 64, 8, qk="i8", pv="h2", amp=8000.0)
    run_variant(rt, fd.int4_format(32), [50, 513], 8, 2, 128, 16, qk="i8", pv="h2", amp=4.0, q_amp=40.0)


def test_packed_variants_without_subgroups(rt):
    """One lane a token row (head 32: lavapipe compiles the fully unrolled one-lane kernel slowly): a lane holds whole
    groups (int4 groups of 16: two a lane)."""
    run_variant(rt, fd.int4_format(16), [5, 300, 0, 1], 2, 1, 32, 16, qk="i8", pv="h2", subgroups=False, rows=16)


# ---------------------------------------------------------------------------------- both, and the rest
@pytest.mark.parametrize("qk,pv", VARIANTS)
def test_variants_without_subgroups(rt, qk, pv):
    """One lane a token row, no shuffles (head size 64, GQA 2: lavapipe compiles the fully unrolled
    one-lane kernel slowly)."""
    run_variant(rt, fd.INT8, [5, 300, 0, 1], 4, 2, 64, 16, qk=qk, pv=pv, subgroups=False)


def test_both_variants_gqa16_block32(rt):
    run_variant(rt, fd.INT8, [1, 0, 257, 64], 16, 1, 128, 32, qk="i8", pv="f16")


@pytest.mark.slow
@pytest.mark.parametrize("qk,pv", VARIANTS)
def test_variants_long_context(rt, qk, pv):
    """40000 tokens at 4 query heads over 1 KV head: many partitions, within lavapipe's loop budget."""
    run_variant(rt, fd.INT8, [40000], 4, 1, 128, 16, qk=qk, pv=pv, policy="contiguous")


def test_variant_refusals(rt):
    fast = fd.FastDecode(rt)
    batch = make_batch([10], 16)
    q = np.zeros((1, 8, 128), np.float32)
    k = rt.upload(np.zeros(16 * 2 * 64, np.uint32), "k")
    with pytest.raises(UnsupportedShape, match="integer K codes"):
        fast.decode(fd.F16, k, k, 2, q, batch, 0.1, qk="i8")
    with pytest.raises(UnsupportedShape, match="integer K codes"):
        fast.decode(fd.fp8_format("e4m3", False), k, k, 2, q, batch, 0.1, qk="i8")
    with pytest.raises(UnsupportedShape, match="int8 and int4"):
        fast.decode(fd.F16, k, k, 2, q, batch, 0.1, pv="h2")
    with pytest.raises(InvalidInput, match="variant"):
        fast.decode(fd.INT8, k, k, 2, q, batch, 0.1, pv="bf16")
    with pytest.raises(InvalidInput, match="pv_flush"):
        fast.decode(fd.INT8, k, k, 2, q, batch, 0.1, pv="f16", pv_flush=0)
    no_f16 = fd.FastDecode(types.SimpleNamespace(features=frozenset({"subgroup"})))
    with pytest.raises(UnsupportedShape, match="shader-f16"):
        no_f16.check_variant(fd.INT8, "f32", "f16", fd.PV_FLUSH)
    no_f16.check_variant(fd.INT8, "i8", "f32", fd.PV_FLUSH)  # the int8 query needs no f16
    with pytest.raises(UnsupportedShape, match="shader-f16"):
        no_f16.check_variant(fd.int4_format(32), "i8", "h2", fd.PV_FLUSH)


def test_default_render_has_no_variant_code():
    """The default kernel stays the exact f32 one: no f16, no dot4I8Packed, an f32 query."""
    lay = fd.choose_layout(fd.INT8, 128, 4, 8, 16384)
    d = fd.render(fd.INT8, 128, 4, lay)
    text = "".join(d.values())
    assert "f16" not in text and "dot4I8Packed" not in text and d["Q_TYPE"] == "f32" and d["VARIANT"] == "f32"
    v = fd.render(fd.INT8, 128, 4, lay, "i8", "f16")
    assert "dot4I8Packed" in v["STEP"] and "vec4<f16>" in v["STEP"] and v["ENABLES"] == "enable f16;"


def test_pv_tolerance_grows_with_the_flush_period():
    assert fd.pv_tolerance(1.0, 100, 2, 1) < fd.pv_tolerance(1.0, 100, 2, 4) < fd.pv_tolerance(1.0, 100, 2, 16)
    assert fd.pv_tolerance(1.0, 100, 2, 4) < 0.01  # 17 roundings of 2^-11 plus a small underflow term
