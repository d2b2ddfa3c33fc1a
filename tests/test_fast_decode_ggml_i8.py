"""Conformance of the fast ggml decode's int8-query variant (kvviz/families/ggml/decode.py, qk="i8", default off) for
every llama.cpp block type (q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl, mxfp4).

Oracle: the float64 decode (kvviz/attention/paged_oracle.decode) of the query dequantised by the project's int8
quantiser (kvviz/families/int8/oracle.quantize: one scale a query head, amax/127, round half to even) over the cache
dequantised by gguf (kvviz/families/ggml/oracle.dequantize). The caches are gguf's bytes (oracle.quantize), built on the
host, so only the decode kernel is built on the GPU.
Tolerance: the f32 kernel's, 2e-5 x max(1, max |V^|) (fast_decode_ggml.tolerance). The integer dots are exact (32 codes
a block: |dot| <= 32 x 128 x 128 < 2^24, so f32 of it, and of dot - 16 x sum q, is exact too); what rounds is the f32
product with the block's f16 scale (and the min's product with the query codes' sum), the lanes' sum, the query scale's
multiply: fewer roundings of terms no larger than the f32 kernel's D-term dot rounds. The softmax and P.V are the f32
kernel's. Against the f32-query oracle the variant must differ (it quantised the query) by no more than the query's
rounding can move the logits: (e^(2d) - 1) max |V^| with d = scale x q_scale / 2 x max_t |k_t|_1.
Grid: every type ragged with an empty and a single-token sequence and GQA 4; head sizes 32 (4 dims a lane), 64, 96 (lanes
walk the head with padding), 128, 256 (a whole block a lane), and one lane of two blocks; block sizes 8, 16, 32; values
near each type's f16 scale limit; large logits; a 3000-token context over several partitions; unrolls, the all-lane and
the scatter softmax, the folded reduce. Kernels here are the unrolled ones (lavapipe builds each in seconds), so the
shapes are chosen for what they reach, not repeated per type.
"""
from __future__ import annotations

import numpy as np
import pytest

from kvviz.attention import paged_oracle as O
from kvviz.attention import split_decode as fd
from kvviz.errors import InvalidInput
from kvviz.families.ggml import decode as fgd
from kvviz.families.ggml import format as fg
from kvviz.families.ggml import oracle as og
from kvviz.families.int8 import oracle as o8
from kvviz.paging import make_batch

from harness import checked_variant_rows, empty_gives_zero

pytestmark = pytest.mark.gpu

TYPES = fgd.QK_I8_TYPES


def dequant_query(q):
    codes, scales = o8.quantize(q)
    return codes.astype(np.float64) * scales.astype(np.float64)[..., None]


def run_i8(rt, tname, lens, H, kvh, D, bs, *, seed=0, k_amp=1.0, v_amp=1.0, q_amp=1.0, policy="scattered", **kw):
    """The int8-query decode over gguf-quantised caches, asserted within fast_decode_ggml.tolerance of its own oracle;
    returns (out, q, (K^, V^), batch)."""
    t = fg.TYPES[tname]
    rng = np.random.default_rng(seed)
    batch = make_batch(lens, bs, policy=policy, seed=seed)
    wpt = t.words_per_token(D)
    slots = batch.num_blocks * bs
    real = np.zeros(slots, bool)
    real[batch.slot_mapping] = True
    deq, bufs = [], []
    for amp in (k_amp, v_amp):
        x = (rng.standard_normal((slots, kvh, D)) * amp).astype(np.float32)
        words = og.quantize(x, t).reshape(batch.num_blocks, bs, kvh, wpt).transpose(0, 2, 1, 3).copy()
        deq.append(og.dequantize(words, D, t).astype(np.float64))
        bufs.append(rt.upload(words, "kv"))
    kf, vf = deq
    assert np.isfinite(kf).all() and np.isfinite(vf).all()
    q = (rng.standard_normal((len(lens), H, D)) * q_amp).astype(np.float32)
    scale = D ** -0.5
    fast = fgd.GgmlFastDecode(rt)
    plan = fast.plan(tname, bufs[0], bufs[1], kvh, q, batch, scale, qk="i8", **kw)
    assert not plan.looped and "int8 q" in plan.describe()
    rt.run(plan.dispatches)
    out = fast.read(plan)
    ref = O.decode(dequant_query(q), kf, vf, batch.block_tables, batch.context_lens, bs, scale)
    M = float(np.abs(vf.transpose(0, 2, 1, 3).reshape(slots, kvh, D)[real]).max(initial=0.0))
    tol = fgd.tolerance(M)
    err = np.abs(out - ref)
    assert np.isfinite(out).all()
    empty_gives_zero(out, lens)
    worst = np.unravel_index(np.argmax(err), err.shape) if err.size else ()
    assert err.max(initial=0.0) <= tol, (f"{tname} D{D} H{H}/{kvh} bs{bs} lens {lens[:6]}: error {err[worst]:.3g} > "
                                         f"{tol:.3g} at {worst} ({plan.describe()})")
    return out, q, (kf, vf), batch


@pytest.mark.parametrize("tname", TYPES)
def test_i8_every_type_ragged_gqa(rt, tname):
    """Every type, ragged and scattered (an empty and a single-token sequence), GQA 4; against the f32-query oracle
    the output moves (the query was quantised) by no more than the query's rounding bound."""
    D, H, kvh, bs = 64, 8, 2, 16
    out, q, (kf, vf), batch = run_i8(rt, tname, [1, 17, 0, 64, 200], H, kvh, D, bs, seed=7)
    scale = D ** -0.5
    ref_f32q = O.decode(q.astype(np.float64), kf, vf, batch.block_tables, batch.context_lens, bs, scale)
    _, qs = o8.quantize(q)
    M = float(np.abs(vf).max())
    for s, n in enumerate(batch.context_lens):
        if not n:
            continue
        k = O.gather_sequence(kf, batch.block_tables[s], int(n), bs)  # [kvh, n, D]
        for h in range(H):
            d = scale * float(qs[s, h]) / 2 * np.abs(k[h // (H // kvh)]).sum(-1).max()
            bound = np.expm1(2 * d) * M + fgd.tolerance(M)
            assert np.abs(out[s, h] - ref_f32q[s, h]).max() <= bound, f"seq {s} head {h}: past the query's rounding bound"
    assert np.abs(out - ref_f32q).max() > 1e-5  # the variant really quantised the query


# the lanes' slice of a block on lavapipe (8 lanes): 32 -> 4 dims, 64 -> 8, 128 -> 16, 256 -> a whole block;
# 96 -> 16 dims a lane walking 128 (padded: a zero query past the head)
@pytest.mark.parametrize("tname,D,H,kvh,bs,U", [("q8_0", 128, 4, 2, 32, 2), ("q5_1", 128, 4, 4, 16, 2),
                                                ("q4_1", 96, 2, 1, 32, 2), ("q5_0", 96, 4, 2, 16, 1),
                                                ("iq4_nl", 32, 16, 2, 8, 2), ("mxfp4", 256, 2, 1, 16, 1),
                                                ("q4_0", 256, 2, 2, 32, 1)])
def test_i8_head_sizes_and_block_sizes(rt, tname, D, H, kvh, bs, U):
    run_i8(rt, tname, [1, 33, 0, 130], H, kvh, D, bs, seed=D + bs, unroll=U)


@pytest.mark.parametrize("tname", ["q5_1", "iq4_nl"])
def test_i8_one_lane_of_two_blocks(rt, tname):
    """One lane a token row (no subgroups): a lane's dims are two whole blocks, each its own scale, min or offset."""
    run_i8(rt, tname, [5, 70, 0, 1], 1, 1, 64, 16, subgroups=False, rows=16, unroll=1)


@pytest.mark.parametrize("tname", TYPES)
def test_i8_values_near_the_f16_scale_limit(rt, tname):
    """K and V whose blocks' f16 scales (and mins) come near 65504 (mxfp4: large E8M0 exponents), the query small
    enough that the logits stay moderate; and large logits (hundreds) over unit-size values. (The shape of
    test_i8_every_type_ragged_gqa: the same kernel.)"""
    largest = {"q8_0": 65504 * 127, "q4_0": 65504 * 8, "q5_0": 65504 * 16, "q4_1": 65504.0, "q5_1": 65504.0,
               "iq4_nl": 65504 * 100, "mxfp4": 1e30}[tname]
    amp = min(largest / 5, 1e7)
    run_i8(rt, tname, [40, 1, 0, 90], 8, 2, 64, 16, seed=3, k_amp=amp, v_amp=amp, q_amp=1.0 / amp)
    run_i8(rt, tname, [40, 1, 0, 90], 8, 2, 64, 16, seed=4, k_amp=4.0, q_amp=40.0)


def test_i8_long_context_many_partitions(rt):
    """3000 tokens over partitions of 512 (the reduce combines 6) and a default split, within lavapipe's loop limit
    (GQA 4 at head 64, block size 16: test_i8_every_type_ragged_gqa's kernels)."""
    run_i8(rt, "q4_1", [3000, 1, 0, 777], 4, 1, 64, 16, policy="contiguous", partition_tokens=512)
    run_i8(rt, "q8_0", [3000, 2], 4, 1, 64, 16)


@pytest.mark.parametrize("tname,D,kw", [("q4_1", 32, dict(unroll=4, scatter=False)),
                                        ("q5_0", 64, dict(unroll=1, fold=True)),
                                        ("mxfp4", 64, dict(unroll=4, fold=True, scatter=False))],
                         ids=["unroll4-all-lane", "unroll1-fold", "unroll4-fold-all-lane"])
def test_i8_unrolls_softmaxes_and_fold(rt, tname, D, kw):
    run_i8(rt, tname, [5, 300, 0, 1], 4, 2, D, 16, seed=9, partition_tokens=64, **kw)


def test_i8_prefetch_bit_identical(rt):
    """The software-pipelined loads do the same arithmetic: the same bits as the single-buffered kernel."""
    a, *_ = run_i8(rt, "q5_1", [33, 0, 150, 1], 4, 2, 64, 8, seed=3, prefetch=True, partition_tokens=32)
    b, *_ = run_i8(rt, "q5_1", [33, 0, 150, 1], 4, 2, 64, 8, seed=3, prefetch=False, partition_tokens=32)
    np.testing.assert_array_equal(a, b)


def test_i8_refusals(rt):
    fast = fgd.GgmlFastDecode(rt)
    batch = make_batch([10], 16)
    q = np.zeros((1, 4, 64), np.float32)
    k = rt.upload(np.zeros(16 * 2 * 64, np.uint32), "k")
    with pytest.raises(InvalidInput, match="looped"):
        fast.plan("q4_0", k, k, 2, q, batch, 0.1, qk="i8", looped=True)
    with pytest.raises(InvalidInput, match="variant"):
        fast.plan("q4_0", k, k, 2, q, batch, 0.1, qk="bf16")


def test_default_render_has_no_variant_code():
    """The default kernel stays the exact f32 one: an f32 query, no dot4I8Packed; the variant's code per type (the table
    lookup only for the table types, the qh spread only for q5)."""
    lay = fd.choose_layout(fgd._FMT, 128, 4, 8, 16384)
    for tname in TYPES:
        t = fg.TYPES[tname]
        d = fgd.render(t, 128, 4, lay)
        text = "".join(d.values())
        assert "dot4I8Packed" not in text and "tab8" not in text and d["Q_TYPE"] == "f32" and d["VARIANT"] == "f32"
        v = fgd.render(t, 128, 4, lay, qk="i8")
        vt = "".join(v.values())
        assert "dot4I8Packed" in v["STEP"] and v["Q_TYPE"] == "u32" and v["VARIANT"] == fd.variant_name("i8")
        assert ("tab8(" in v["STEP"]) == (tname in ("iq4_nl", "mxfp4"))
        assert ("0x00204081u" in vt) == t.qh
    with pytest.raises(InvalidInput, match="looped"):
        fgd.render(fg.TYPES["q8_0"], 128, 4, lay, looped=True, qk="i8")


def test_bench_variant_rows_for_a_block_type(rt):
    """kvviz bench --variants times a block type's int8-query decode (4 and 2 tokens a row) and its folded reduce beside
    its exact fast decode, each held to its own oracle; no f16-pair P.V row (the block types' P.V is f32)."""
    rows = checked_variant_rows(rt, "q4_1", ("fast_decode_q4_1 (int8 query)",
                                         "fast_decode_q4_1 (int8 query, 2 tokens a row)",
                                         "fast_decode_q4_1 (reduce folded in)"))
    assert "f32-query oracle" in rows["fast_decode_q4_1 (int8 query)"]["note"]
    assert not any("f16x2" in k for k in rows)
