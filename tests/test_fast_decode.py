"""Conformance of the fast split-K decode (kvviz/attention/split_decode.py) for every cache format it reads.

The caches are built here in numpy, record by record in each format's word layout, so the decode is
checked on its own (the writers have their own tests): the oracle dequantises the same words
(kvviz/attention/paged_oracle.decode, float64) and the kernel must agree within the f32 paged kernels'
tolerance, 2e-5 x max(1, max |V|): f32 accumulation in another order, exp2 for exp, and the oracle's
seed normaliser (sum + 1e-6) against the kernel's exact division.
Shapes: head sizes 64..256 (80 and 96 need 4- and 8-lane splits), MHA to GQA 16, block sizes 8..32,
ragged and scattered, empty and single-token sequences, ties, logits near the exp range, a long
context split into many partitions, and the variant without subgroups.
"""
from __future__ import annotations


import ml_dtypes
import numpy as np
import pytest

from kvviz.errors import InvalidInput, UnsupportedShape
from kvviz.attention import split_decode as fd
from kvviz.attention import paged_oracle as O
from kvviz.paging import PAD_SLOT, make_batch

pytestmark = pytest.mark.gpu

FP8 = {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}


def _fp8_codes(rng, n, kind):
    """Random finite FP8 codes (no NaN / inf encodings), every exponent including subnormals."""
    c = rng.integers(0, 256, n, dtype=np.uint8)
    if kind == "e4m3":
        c = np.where((c & 0x7F) == 0x7F, c ^ 0x01, c)
    else:
        c = np.where(((c >> 2) & 0x1F) == 0x1F, c & 0xFB, c)
    return c.astype(np.uint8)


def make_records(fmt: fd.CacheFormat, rng, n: int, D: int, amp: float = 1.0):
    """(words [n, wpt] u32, values [n, D] float64: what the words decode to) for n token records."""
    if fmt.name == "f32":
        x = (rng.standard_normal((n, D)) * amp).astype(np.float32)
        return x.view(np.uint32), x.astype(np.float64)
    if fmt.name == "f16":
        x = (rng.standard_normal((n, D)) * amp).astype(np.float16)
        return x.view(np.uint16).reshape(n, D // 2, 2).astype(np.uint32) @ np.array([1, 1 << 16], np.uint32), x.astype(np.float64)
    if fmt.name == "int8":
        codes = rng.integers(-128, 128, (n, D), dtype=np.int8)
        scale = (rng.uniform(0.5, 2.0, n) * amp / 127).astype(np.float32)
        words = np.concatenate([codes.view(np.uint32).reshape(n, D // 4), scale.view(np.uint32)[:, None]], 1)
        return words, codes.astype(np.float64) * scale[:, None].astype(np.float64)
    if fmt.fp8:
        codes = _fp8_codes(rng, n * D, fmt.fp8).reshape(n, D)
        val = codes.view(FP8[fmt.fp8]).astype(np.float64)
        cw = codes.view(np.uint32).reshape(n, D // 4)
        if fmt.scale == "token":
            scale = (rng.uniform(0.5, 2.0, n) * amp / 448).astype(np.float32)
            return np.concatenate([cw, scale.view(np.uint32)[:, None]], 1), val * scale[:, None].astype(np.float64)
        return cw, val  # per-tensor scale: applied by the caller
    if fmt.name == "int4":
        gs = fmt.group_size
        ng = D // gs
        codes = rng.integers(0, 16, (n, D), dtype=np.uint32)
        cw = (codes.reshape(n, D // 8, 8) << (4 * np.arange(8, dtype=np.uint32))).sum(-1, dtype=np.uint64).astype(np.uint32)
        s = (rng.uniform(0.1, 0.3, (n, ng)) * amp).astype(np.float32)
        z = (rng.uniform(-2.0, -1.0, (n, ng)) * amp).astype(np.float32)
        sz = np.stack([s, z], -1).reshape(n, 2 * ng)
        f32 = lambda a: a.astype(np.float32)  # noqa: E731  (the kernel's fma(c, s, z) in f32)
        val = f32(codes.astype(np.float32) * np.repeat(s, gs, 1) + np.repeat(z, gs, 1)).astype(np.float64)
        return np.concatenate([cw, sz.view(np.uint32)], 1), val
    raise ValueError(fmt)


def build_caches(fmt, rng, batch, kvh, D, amp=1.0, tensor_scales=(1.0, 1.0)):
    """Paged caches [num_blocks, kvh, bs, wpt] u32 with random records, and their float64 values."""
    nb, bs, wpt = batch.num_blocks, batch.block_size, fmt.wpt(D)
    out = []
    for ts in tensor_scales:
        words, vals = make_records(fmt, rng, nb * kvh * bs, D, amp)
        out.append((np.ascontiguousarray(words.reshape(nb, kvh, bs, wpt)), vals.reshape(nb, kvh, bs, D) * ts))
    return out


def run_case(rt, fmt, lens, H, kvh, D, bs, *, seed=0, amp=1.0, q_amp=1.0, policy="scattered", tensor=(1.0, 1.0), **kw):
    rng = np.random.default_rng(seed)
    batch = make_batch(lens, bs, policy=policy, seed=seed)
    (kw_, kf), (vw_, vf) = build_caches(fmt, rng, batch, kvh, D, amp, tensor if fmt.scale == "tensor" else (1.0, 1.0))
    q = (rng.standard_normal((len(lens), H, D)) * q_amp).astype(np.float32)
    scale = 1.0 / np.sqrt(D)
    fast = fd.FastDecode(rt)
    tb = None
    if fmt.scale == "tensor":
        tb = rt.upload(np.array([0.0, 0.0, *tensor], np.float32).view(np.uint32), "tensor")
    out = fast.decode(fmt, rt.upload(kw_, "k"), rt.upload(vw_, "v"), kvh, q, batch, scale, tensor=tb, **kw)
    ref = O.decode(q, kf, vf, batch.block_tables, batch.context_lens, bs, scale)
    tol = 2e-5 * max(1.0, float(np.abs(vf).max()))
    err = float(np.abs(out - ref).max(initial=0.0))
    assert np.isfinite(out).all()
    assert err <= tol, f"{fmt.name} D{D} H{H}/{kvh} bs{bs} lens {lens[:6]}: max error {err:.3g} > {tol:.3g}"
    return out, ref, batch


FORMATS = [fd.F32, fd.F16, fd.INT8, fd.fp8_format("e4m3", False), fd.fp8_format("e5m2", False),
           fd.fp8_format("e4m3", True), fd.int4_format(32), fd.int4_format(64)]


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f"{f.name}-{f.scale}-{f.group_size}")
def test_every_format_ragged_gqa(rt, fmt):
    """GQA 4, head 128, block 16, ragged + scattered with an empty and a single-token sequence."""
    run_case(rt, fmt, [37, 100, 0, 300, 1, 129], 8, 2, 128, 16, tensor=(0.02, 0.5))


@pytest.mark.parametrize("D,H,kvh,bs", [(64, 4, 4, 8), (80, 8, 1, 16), (96, 16, 1, 32), (256, 4, 2, 16)])
@pytest.mark.parametrize("fmt", [fd.F32, fd.INT8], ids=lambda f: f.name)
def test_head_sizes_and_groups(rt, fmt, D, H, kvh, bs):
    run_case(rt, fmt, [1, 17, 64, 200], H, kvh, D, bs, seed=D)


def test_partitions_single_and_many(rt):
    """One partition and many short ones give the same output (the reduce is exact in base 2)."""
    a, ref, _ = run_case(rt, fd.INT8, [700, 33, 2048], 8, 2, 128, 16, partition_tokens=4096)
    b, _, _ = run_case(rt, fd.INT8, [700, 33, 2048], 8, 2, 128, 16, partition_tokens=16)
    assert np.abs(a - b).max() <= 2e-5 * max(1.0, float(np.abs(ref).max()))


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


def test_no_subgroups_variant(rt):
    """The variant for adapters without subgroups (one lane a token row, no shuffles). Small heads: the
    one-lane kernel unrolls a whole head a lane for every query head of the group, and lavapipe's LLVM took
    minutes to compile the head-128 GQA-4 one (a CI test must stay well inside pytest's 600 s timeout)."""
    fast = fd.FastDecode(rt)
    assert fast.layout(fd.INT8, 128, 4, subgroups=False).lanes == 1
    run_case(rt, fd.INT8, [5, 300, 0], 4, 2, 32, 16, subgroups=False)
    run_case(rt, fd.F16, [64, 1], 2, 1, 32, 8, subgroups=False)


def test_large_logits_and_values(rt):
    """Logits around +-400 in base e (q and K large) and V near 1e30: no overflow in exp2, finite output."""
    run_case(rt, fd.F32, [50, 513], 8, 2, 128, 16, amp=4.0, q_amp=40.0)
    run_case(rt, fd.F32, [9, 130], 4, 1, 64, 16, amp=1e30)


def test_exact_ties_average(rt):
    """Every key identical: the weights tie exactly and the output is the mean of V."""
    rng = np.random.default_rng(3)
    D, kvh, H, bs = 64, 1, 4, 8
    batch = make_batch([77, 1000], bs, policy="scattered", seed=2)
    nb = batch.num_blocks
    key = np.broadcast_to(rng.standard_normal(D).astype(np.float32), (nb, kvh, bs, D)).copy()
    val = rng.standard_normal((nb, kvh, bs, D)).astype(np.float32)
    q = rng.standard_normal((2, H, D)).astype(np.float32)
    out = fd.FastDecode(rt).decode(fd.F32, rt.upload(key, "k"), rt.upload(val, "v"), kvh, q, batch, 0.125, partition_tokens=64)
    for s, n in enumerate(batch.context_lens):
        rows = [batch.slot(s, t) for t in range(int(n))]
        mean = val.reshape(-1, kvh, D)[rows, 0].astype(np.float64).mean(0)
        assert np.abs(out[s] - mean).max() < 1e-5


@pytest.mark.slow
def test_long_context_many_partitions(rt):
    """40000 tokens in one sequence: many partitions, within a software rasteriser's loop budget."""
    out, ref, _ = run_case(rt, fd.INT8, [40000], 8, 2, 128, 16, policy="contiguous")
    assert out.shape == (1, 8, 128)


def test_bad_input_is_refused(rt):
    fast = fd.FastDecode(rt)
    batch = make_batch([10], 16)
    k = rt.upload(np.zeros(16 * 2 * 33, np.uint32), "k")
    with pytest.raises(InvalidInput, match="divide"):
        fast.decode(fd.INT8, k, k, 3, np.zeros((1, 8, 128), np.float32), batch, 0.1)
    with pytest.raises(InvalidInput, match="NaN|finite"):
        fast.decode(fd.INT8, k, k, 2, np.full((1, 8, 128), np.nan, np.float32), batch, 0.1)
    with pytest.raises(UnsupportedShape, match="head size"):
        fast.decode(fd.int4_format(32), k, k, 2, np.zeros((1, 8, 100), np.float32), batch, 0.1)
    with pytest.raises(InvalidInput, match="cache holds"):  # a cache smaller than the batch's blocks
        fast.decode(fd.F32, k, k, 2, np.zeros((1, 8, 128), np.float32), batch, 0.1)
    assert fd.unsupported(fd.INT8, 512, 4) and not fd.unsupported(fd.INT8, 128, 4)


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


@pytest.mark.parametrize("fmt", [fd.F32, fd.INT8, fd.fp8_format("e4m3", True), fd.int4_format(32)], ids=lambda f: f.name)
@pytest.mark.parametrize("H,kvh,unroll,lanes", [(2, 2, 2, 8), (12, 4, 2, 8), (16, 1, 2, 8), (8, 2, 4, 4), (8, 2, 1, 2)])
def test_scatter_and_all_lane_softmax(rt, fmt, H, kvh, unroll, lanes):
    """The reduce-scatter softmax (the default where a row has 2+ lanes) and the all-lane one, each against the
    oracle, over GQA 1, 3 (G x U padded to a power of two), 4 and 16 (more (head, token) slots than lanes: a
    lane owns several), 1, 2 and 4 tokens a row per step and 2 to 8 lanes a row; ragged lengths with an empty
    sequence, one token, a partial step and a partition past the end, large logits (the max jumps often)."""
    lens = [37, 0, 1, 300, 129]
    for scatter in (True, False):
        run_case(rt, fmt, lens, H, kvh, 64, 16, tensor=(0.02, 0.5), unroll=unroll, lanes=lanes, scatter=scatter,
                 partition_tokens=64, q_amp=4.0)


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
