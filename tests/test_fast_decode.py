"""The fast split-K decode (kvviz/attention/split_decode.py): its reduces, prefetch, conversions and rendered
variants, over caches built in numpy record by record (tests/harness.py make_records) and held to the float64
oracle of the same words (kvviz/attention/paged_oracle.decode) within the f32 kernels' tolerance, 2e-5 x max(1, max |V|).
The scenarios every fast decode shares (every format ragged with GQA, head sizes, one partition and many, the
scatter and all-lane softmax, no subgroups, extreme values, ties, a long context, bad input) are in
tests/test_conformance.py.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from kvviz.errors import InvalidInput
from kvviz.attention import split_decode as fd
from kvviz.attention import paged_oracle as O
from kvviz.paging import PAD_SLOT
from kvviz.paging import make_batch

import harness
from harness import FORMATS

pytestmark = pytest.mark.gpu


def run_case(rt, *args, **kw):
    """tests/harness.py run_case (asserts the oracle's tolerance) -> (out, ref, batch)."""
    return harness.run_case(rt, *args, **kw)[:3]


def test_reduce_partitions_few_and_many(rt):
    """Both reduces give the oracle's output: the chunked one (3 partitions, 6 where 32 tokens a step) and the wide one
    (fast_decode.reduce_spec from WIDE_REDUCE_FROM partitions: 14, one step of GROUPS * CHUNK with groups given fewer
    than CHUNK; 69 or more, two full steps and a partial one). The 33-token sequence leaves all but a few partitions
    empty, the empty sequence all."""
    assert fd.reduce_spec(8) is fd.REDUCE and fd.reduce_spec(fd.WIDE_REDUCE_FROM) is fd.REDUCE_WIDE
    step = fd.FastDecode(rt).layout(fd.INT8, 128, 4).tokens_per_step  # the adapter's layout: 32 on lavapipe, 16 on the H200
    counts = []
    for pt in (1024, 416, 160, step):
        counts.append(fd.split_context(pt, 0, step, 2200)[1])
        run_case(rt, fd.INT8, [700, 33, 0, 2200], 8, 2, 128, 16, partition_tokens=pt)
        kv = rt.empty(138 * 2 * 16 * 128 * 4, "kv")  # 138 blocks of 16 f32 tokens, 2 KV heads: 2200 tokens
        plan = fd.FastDecode(rt).plan(fd.F32, kv, kv, 2, np.zeros((1, 8, 128), np.float32), make_batch([2200], 16), 0.1,
                                      partition_tokens=pt)
        assert plan.describe().endswith(", wide reduce") == (counts[-1] >= fd.WIDE_REDUCE_FROM), plan.describe()
    wide_step = fd.WIDE_REDUCE_GROUPS * fd.WIDE_REDUCE_CHUNK
    assert max(counts[:2]) < fd.WIDE_REDUCE_FROM <= min(counts[2:]) and counts[3] > 2 * wide_step, counts


@pytest.mark.parametrize("D", [4, 72, 256])
def test_wide_reduce_head_sizes(rt, D):
    """The wide reduce's lanes own dims lane + 64 j: a head of 4 (lanes 4..63 idle), 72 (one lane past 64) and 256
    (every lane four dims), over 45 partitions with ragged and empty sequences, f32 and f16 caches."""
    fast = fd.FastDecode(rt)
    for fmt in (fd.F32, fd.F16):
        step = fast.layout(fmt, D, 2).tokens_per_step  # a small head takes many tokens a step
        n = 45 * step - 7
        run_case(rt, fmt, [n, 1, 0, n // 2], 4, 2, D, 16, partition_tokens=step)


@pytest.mark.parametrize("fmt", [fd.F16, fd.INT8, fd.int4_format(32)], ids=lambda f: f.name)
def test_block_ids_a_step_ahead(rt, fmt, monkeypatch):
    """The block-table entries loaded a step ahead (BT_AHEAD_FORMATS) give the same bits as loaded in the step that
    uses them, over ragged, scattered sequences and a block size that is not a power of two."""
    lens = [1, 250, 0, 77, 300]
    outs = []
    for ahead in (("f16", "int8", "int4"), ()):
        monkeypatch.setattr(fd, "BT_AHEAD_FORMATS", ahead)
        outs.append(run_case(rt, fmt, lens, 8, 2, 64, 5, prefetch=True, partition_tokens=96)[0])
    np.testing.assert_array_equal(outs[0], outs[1])


def test_traffic_counts_each_record_once():
    batch = make_batch([100, 0, 28], 16)
    nbytes, flops = fd.decode_traffic(fd.INT8, batch, 8, 2, 128, 1)
    assert flops == 4 * 128 * 8 * 128
    kv = 2 * 128 * 2 * 33 * 4
    assert kv < nbytes < kv + 64 * 1024
    assert PAD_SLOT not in batch.block_tables  # the tables the kernel reads hold only real blocks


def test_sweep_points_checked_and_strict_json(rt, tmp_path):
    """`kvviz bench --sweep`: every fast decode of a point is checked against the kernel it stands beside on
    the same cache, and the JSON is strict."""
    import json

    from kvviz.bench import save_json
    from kvviz.bench.sweep import run_sweep
    from kvviz.cli import main

    res = run_sweep("batch", [1, 2], runs=1, warmup=0, rt=rt, log=lambda *a: None, ctx=40)
    assert [p["value"] for p in res["points"]] == [1, 2]
    assert res["timing_floor_us"] > 0   # the frame every point's times include (kvviz.gpu.fma.measure_timing_floor)
    for p in res["points"]:
        fast = {r["kernel"]: r for r in p["rows"] if r["impl"] == "fast"}
        assert set(fast) == {"fast_decode_int8", "fast_decode_f16", "fast_decode_f32"}
        assert fast["fast_decode_int8"]["within_tolerance"] and fast["fast_decode_f32"]["within_tolerance"]
        assert fast["fast_decode_f16"]["within_tolerance"] is None  # nothing it stands beside: no claim
    save_json(res, tmp_path / "s.json")
    json.loads((tmp_path / "s.json").read_text(), parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))
    assert main(["bench", "--sweep", "context", "--values", "0,-5"]) == 2
    assert main(["bench", "--values", "5"]) == 2


def test_unchecked_module_variant_same_output(rt):
    """The shader module without naga's runtime checks (a measured variant) computes the same output."""
    from kvviz.gpu.trusted import available

    if not available():
        pytest.skip("this wgpu build has no wgpuDeviceCreateShaderModuleTrusted")
    a, _, _ = run_case(rt, fd.INT8, [37, 300, 1], 8, 2, 128, 16)
    b, _, _ = run_case(rt, fd.INT8, [37, 300, 1], 8, 2, 128, 16, checks=False)
    assert np.array_equal(a, b)


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f"{f.name}-{f.scale}-{f.group_size}")
def test_prefetch_and_constant_block_bit_identical(rt, fmt):
    """The software-pipelined kernel (next step's loads issued before this step's arithmetic), the block size
    rendered as a constant and the integer codes converted by the 2^23 mantissa trick do the same
    arithmetic as the plain kernel (prefetch=True forces the prefetch where the default would not take it):
    equal bit for bit, over
    ragged lengths with an empty sequence, a single token, a partition past the end and a partial step."""
    lens = [37, 0, 300, 1, 129, 16]
    unroll = 2
    base, ref, _ = run_case(rt, fmt, lens, 8, 2, 128, 16, tensor=(0.02, 0.5), prefetch=False, const_block=False,
                            partition_tokens=64, unroll=unroll)
    got, _, _ = run_case(rt, fmt, lens, 8, 2, 128, 16, tensor=(0.02, 0.5), prefetch=True, const_block=True,
                         partition_tokens=64, magic=True, unroll=unroll)
    np.testing.assert_array_equal(got, base)


def test_int8_conversions_every_code(rt, monkeypatch):
    """Every int8 code -128..127 in K and V: the codes converted by f16 pairs (I8X4_VIA_F16, the default), by the
    2^23 trick alone and by unpack4xI8 give the same output bit for bit, within the oracle's tolerance."""
    kvh, D, bs = 2, 128, 16
    batch = make_batch([300, 17], bs, policy="scattered", seed=3)
    n = batch.num_blocks * kvh * bs
    codes = (np.arange(n * D) * 7 % 256).astype(np.uint8).reshape(n, D)   # every byte, in shifting orders
    words = np.empty((n, D // 4 + 1), np.uint32)
    words[:, :D // 4] = codes.view(np.uint32)
    words[:, D // 4] = np.float32(0.03).view(np.uint32)
    vwords = words.copy()
    vwords[:, :D // 4] = codes[::-1].copy().view(np.uint32)
    q = np.random.default_rng(3).standard_normal((2, 8, D)).astype(np.float32)
    k, v = rt.upload(words.ravel(), "k"), rt.upload(vwords.ravel(), "v")
    fast = fd.FastDecode(rt)
    outs = []
    for magic, via_f16 in ((False, True), (True, True), (True, False)):
        monkeypatch.setattr(fd, "I8X4_VIA_F16", via_f16)
        outs.append(fast.decode(fd.INT8, k, v, kvh, q, batch, 0.088, magic=magic, partition_tokens=64))
    np.testing.assert_array_equal(outs[1], outs[0])
    np.testing.assert_array_equal(outs[2], outs[0])
    val = lambda w: w[:, :D // 4].copy().view(np.int8).astype(np.float64) * 0.03  # noqa: E731
    shape = (batch.num_blocks, kvh, bs, D)
    ref = O.decode(q, val(words).reshape(shape), val(vwords).reshape(shape), batch.block_tables, batch.context_lens, bs, 0.088)
    assert np.abs(outs[0] - ref).max() <= 2e-5 * max(1.0, float(np.abs(val(vwords)).max()))


@pytest.mark.parametrize("unroll,lanes,bs", [(1, 16, 8), (2, 8, 32), (2, 4, 5)])
def test_prefetch_layouts(rt, unroll, lanes, bs):
    """Prefetch over other layouts (1 token a row per step, 8 and 4 lanes a row) and a block size that is not
    a power of two, against the oracle and bit for bit against the plain kernel. Every layout here takes
    the prefetch: prefetch=True forces it where the default (fast_decode.prefetch_fits) would not."""
    lens = [1, 250, 0, 77]
    a, _, _ = run_case(rt, fd.INT8, lens, 8, 2, 64, bs, unroll=unroll, lanes=lanes, prefetch=True, partition_tokens=96,
                       magic=True)
    b, _, _ = run_case(rt, fd.INT8, lens, 8, 2, 64, bs, unroll=unroll, lanes=lanes, prefetch=False, partition_tokens=96)
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("fmt", [fd.F32, fd.INT8, fd.int4_format(32)], ids=lambda f: f.name)
def test_lazy_rescale(rt, fmt):
    """Rescaling only when the running max grows: against the oracle (run_case's f32 tolerance), over large
    logits (the max jumps often) and ragged lengths, with and without prefetch."""
    for scatter in (True, False):  # the scatter softmax's lazy rescale moves the max only past it + LAZY_TAU
        run_case(rt, fmt, [1, 0, 333, 64], 8, 2, 128, 16, q_amp=20.0, lazy=True, partition_tokens=128, scatter=scatter)
        run_case(rt, fmt, [257, 5], 4, 4, 64, 8, lazy=True, prefetch=True, scatter=scatter)
        run_case(rt, fmt, [700, 3], 8, 2, 64, 16, q_amp=1.0, lazy=True, scatter=scatter)  # logits within LAZY_TAU


def test_scatter_default_and_refusals(rt):
    """Where the scatter softmax is the default, where it is refused (one lane a row, f16 P.V), and its lazy
    rescale: one branch on subgroupAny for the whole step."""
    fast = fd.FastDecode(rt)
    lay = fast.layout(fd.INT8, 64, 4)
    assert fd.SCATTER and "scatter softmax" in fd.render(fd.INT8, 64, 4, lay, scatter=True)["VARIANT"]
    one = fast.layout(fd.INT8, 64, 4, subgroups=False)
    with pytest.raises(InvalidInput, match="scatter"):
        fd.render(fd.INT8, 64, 4, one, scatter=True)
    lazy = fd.render(fd.INT8, 64, 4, lay, lazy=True, scatter=True)["STEP"]   # one subgroup-uniform rescale branch
    assert lazy.count("if (anyg) {") == 1 and "subgroupAny(" in lazy
    assert "anyg" not in fd.render(fd.INT8, 64, 4, lay, scatter=True)["STEP"]


@pytest.mark.parametrize("per_tensor", [False, True])
def test_fp8_e4m3_unit_folded_into_query_and_v_scale(rt, monkeypatch, per_tensor):
    """The e4m3 codes enter the dots as value / 2^8 and the 2^8 goes into the query and the V scale once
    (fast_decode.FP8_UNIT): the rendered kernel multiplies no vec4 of codes by 256, and its outputs are the ones of
    the kernel that does, bit for bit (power-of-two scalings are exact; no weight underflows here), over wide values
    and a long row."""
    fmt = fd.fp8_format("e4m3", per_tensor)
    lay = fd.FastDecode(rt).layout(fmt, 128, 4)
    r = fd.render(fmt, 128, 4, lay, scatter=True)
    assert "* 256.0;" not in r["HELPERS"] and "p.scale_log2 * 256.0" in r["PROLOGUE"] and "* 256.0)" in r["STEP"]
    kw = dict(amp=30.0, q_amp=3.0, tensor=(0.02, 0.5), partition_tokens=256)
    folded, _, _ = run_case(rt, fmt, [700, 1, 33], 8, 2, 128, 16, **kw)
    monkeypatch.setattr(fd, "FP8_UNIT", {})
    plain, _, _ = run_case(rt, fmt, [700, 1, 33], 8, 2, 128, 16, **kw)
    np.testing.assert_array_equal(folded, plain)


@pytest.mark.parametrize("kind", ["e4m3", "e5m2"])
def test_fp8_conversion_every_code(rt, kind):
    """The fast decode's FP8 -> f32 conversion (bytes moved into f16 bit patterns, unpack2x16float) is exact for
    every finite code, subnormals and -0 included: a one-token sequence's output is its V record dequantised
    (p = 1), compared bit for bit with ml_dtypes' decoding times the token's scale (a power of two, so the
    product is exact; -0 reads +0, the accumulator's sign). An adapter that flushed f16 subnormals in the conversion would fail here."""
    fmt = fd.fp8_format(kind, False)
    D = 128
    codes = np.arange(256, dtype=np.uint8)
    codes = codes[np.isfinite(codes.view(ml_dtypes.float8_e4m3fn if kind == "e4m3" else ml_dtypes.float8_e5m2).astype(np.float32))]
    n = -(-len(codes) // D)
    rows = np.resize(codes, n * D).reshape(n, D)
    batch = make_batch([1] * n, 16, policy="scattered", seed=1)
    scale = np.float32(0.5)
    words = np.zeros((batch.num_blocks, 1, 16, fmt.wpt(D)), np.uint32)
    for s in range(n):
        slot = int(batch.slot_mapping[s])
        words[slot // 16, 0, slot % 16, :D // 4] = rows[s].view(np.uint32)
        words[slot // 16, 0, slot % 16, D // 4] = scale.view(np.uint32)
    k = np.zeros_like(words)
    k[..., D // 4] = scale.view(np.uint32)
    out = fd.FastDecode(rt).decode(fmt, rt.upload(k.reshape(-1), "k"), rt.upload(words.reshape(-1), "v"), 1,
                                   np.ones((n, 1, D), np.float32), batch, 0.1)
    want = rows.view(ml_dtypes.float8_e4m3fn if kind == "e4m3" else ml_dtypes.float8_e5m2).astype(np.float32) * scale
    want = want + np.float32(0.0)  # -0 -> +0: the accumulator starts at +0 (+0 + -0 = +0)
    np.testing.assert_array_equal(out[:, 0].view(np.uint32), want.view(np.uint32))
