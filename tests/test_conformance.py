"""Conformance of every fast decode and fast writer, scenario by scenario (each scenario written once, run over
the families it applies to; the families' adapters are in tests/harness.py).

Decodes: fast_decode over its cache formats (f32, f16, int8, FP8 per token / per tensor, int4 groups), the ggml
block types, KIVI, NVFP4 and TurboQuant (per sequence and paged). Each decode is held to its family's float64
oracle over the same words within the family's tolerance (2e-5 x max(1, max |V^|) for all of them), and every
case checks that empty sequences give exactly 0. Scenarios: ragged lengths with empty and single-token sequences
over scattered block tables; head sizes, GQA groups and block sizes; a long context split into many partitions;
one partition against many; the reduce-scatter softmax against the all-lane one; the variant for adapters without
subgroups; zeros and extreme values; exact ties; bad input refused with a message that says what is wrong.

Writers: the fast writers' words equal the oracles' exactly, over a covering (pairwise) grid of writers x shapes x
variants (tests/harness.py pairwise says why pairs suffice there), and with an inexact divider.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

import harness
from harness import DECODES
from harness import WRITER_REFUSALS
from harness import WRITER_SHAPES
from harness import WRITER_VARIANTS
from harness import Fact
from harness import pairwise

pytestmark = pytest.mark.gpu

RAGGED = [31, 33, 1, 0, 150]
KIVI_RAGGED = [31, 32, 33, 1, 0, 150]
FD_FORMATS = [harness.fmt_id(f) for f in harness.FORMATS]
GGML = list(harness.kernels("fast_decode_ggml").TYPES)


def case(family, _id=None, **kw):
    """One scenario case of a family: its check's arguments, plus scenario keys (expect_partitions, zero_out, ...)."""
    return pytest.param(family, kw, id=f"{family}-{_id}" if _id else family)


def run(ctx, family, args):
    """The family's check over `args` without the scenario keys."""
    scenario = {"expect_partitions", "zero_out", "min_partitions", "caught", "partition_tokens_multiple",
                "layout", "agree", "many", "group_rows", "exact"}
    return DECODES[family].check(ctx, **{k: v for k, v in args.items() if k not in scenario})


# ------------------------------------------------------------------------------ ragged, scattered, shapes
RAGGED_CASES = (
    # every fast_decode format: GQA 4, head 128, block 16, an empty and a single-token sequence
    [case(f, "D128-G4", D=128, bs=16, kvh=2, G=4, lens=[37, 100, 0, 300, 1, 129], tensor=(0.02, 0.5)) for f in FD_FORMATS]
    # head sizes 64..256 (80 and 96 need 4- and 8-lane splits), MHA to GQA 16, block sizes 8..32
    + [case(f, f"D{D}-H{H}-kvh{kvh}-bs{bs}", D=D, bs=bs, kvh=kvh, G=H // kvh, lens=[1, 17, 64, 200], seed=D)
       for f in ("f32-none-0", "int8-token-0") for D, H, kvh, bs in ((64, 4, 4, 8), (80, 8, 1, 16), (96, 16, 1, 32), (256, 4, 2, 16))]
    # every ggml type at head 128 (16 dims a lane), 64 with GQA 4, 256 (whole blocks a lane), 32 (4 dims a lane)
    + [case(t, f"D{D}-bs{bs}-kvh{kvh}-G{G}", D=D, bs=bs, kvh=kvh, G=G, lens=lens, seed=D + bs + G)
       for t in GGML for D, bs, kvh, G, lens in ((128, 16, 2, 1, RAGGED), (64, 8, 1, 4, [1, 31, 0, 33, 77]),
                                                 (256, 32, 2, 1, [70, 33, 0, 1]), (32, 16, 2, 1, RAGGED))]
    # GQA 8 (head 128: lavapipe compiles GQA 8 at head 256 slowly), several partitions
    + [case(t, "D128-G8", D=128, bs=32, kvh=1, G=8, lens=[300, 33, 0, 1], seed=9, partition_tokens=64, expect_partitions=5)
       for t in ("q8_0", "q5_1")]
    # KIVI: bits 2 / 4, recent 0 / 16 / 128, heads 64, 128, the padded 120, and 80 / 112 (lanes not owning whole
    # code words), block sizes 8..64, GQA 1 / 4 / 8
    + [case(f"kivi-b{b}-r{r}", f"D{D}-bs{bs}-kvh{kvh}-G{G}", D=D, bs=bs, kvh=kvh, G=G, lens=lens, seed=D + bs + G + b)
       for b, r, D, bs, kvh, G, lens in (
           (2, 0, 64, 8, 2, 1, KIVI_RAGGED), (4, 16, 64, 16, 1, 4, [1, 31, 32, 33, 0, 77]),
           (2, 128, 128, 32, 1, 8, [200, 33, 0, 161]), (4, 128, 128, 64, 2, 1, [300, 31, 1]),
           (2, 16, 120, 16, 2, 4, [65, 32, 0, 1, 97]), (4, 0, 120, 32, 1, 1, [96, 1, 33]),
           (4, 0, 128, 8, 2, 4, KIVI_RAGGED), (2, 16, 64, 64, 1, 1, [130, 0, 32]),
           (4, 16, 80, 8, 2, 1, [96, 33, 1, 0]), (2, 0, 112, 32, 2, 1, [64, 31, 65]))]
    # KIVI with one token a row group per step (the default is 2)
    + [case("kivi-b2-r16", "unroll1", D=64, bs=16, kvh=1, G=1, lens=[97, 32, 0], seed=8, unroll=1)]
    # KIVI, int8 query (requantised a key group and head in the kernel): bits 2 / 4, heads 64, 128 and the padded 120,
    # GQA 1 / 4, block sizes 8 / 16
    + [case(f"kivi-b{b}-r{r}", f"i8-D{D}-bs{bs}-kvh{kvh}-G{G}", D=D, bs=bs, kvh=kvh, G=G, lens=lens, seed=D + bs + G + b,
            qk="i8")
       for b, r, D, bs, kvh, G, lens in ((2, 0, 64, 16, 2, 1, KIVI_RAGGED), (4, 16, 128, 8, 1, 4, [1, 31, 32, 33, 0, 77]),
                                         (2, 16, 120, 16, 2, 4, [65, 32, 0, 1, 97]))]
    # NVFP4: heads 16 (4 dims a lane), 64, 128 (8 dims), 256 (whole sub-blocks; block size 1), 80 (one lane a row)
    + [case("nvfp4", f"D{D}-bs{bs}-kvh{kvh}-G{G}", D=D, bs=bs, kvh=kvh, G=G, lens=lens, seed=D + bs + G)
       for D, bs, kvh, G, lens in ((64, 16, 2, 1, RAGGED), (128, 32, 1, 4, [1, 31, 0, 33, 77]), (256, 1, 1, 1, [70, 33, 0, 1]),
                                   (16, 16, 2, 3, RAGGED), (80, 16, 1, 1, [40, 0, 1, 17]))]
    + [case("nvfp4", "D64-G8", D=64, bs=32, kvh=1, G=8, lens=[300, 33, 0, 1], seed=9, partition_tokens=64, expect_partitions=5)]
    # TurboQuant per sequence: heads 32..128, GQA 1 / 4 / 8, 3 KV heads
    + [case("tq", f"D{D}-G{G}-kvh{kvh}", D=D, kvh=kvh, G=G, lens=[37, 0, 1, 300, 16], seed=D + G, caught=True)
       for D, G, kvh in ((128, 4, 2), (128, 1, 2), (64, 8, 1), (64, 1, 3), (32, 4, 1))]
    # TurboQuant paged: heads 32 / 64 / 128 x GQA 1 / 4 / 8 x block sizes 1 / 16 / 32, several partitions
    + [case("tq-paged", f"D{D}-G{G}-kvh{kvh}-bs{bs}", D=D, bs=bs, kvh=kvh, G=G, lens=[37, 0, 1, 300, 16], seed=D + G + bs,
            partition_tokens=64, caught=True, min_partitions=1)
       for D, G, kvh, bs in ((32, 1, 2, 1), (32, 8, 1, 16), (32, 4, 2, 32), (64, 4, 2, 16), (64, 1, 3, 32), (64, 8, 1, 1),
                             (128, 4, 2, 16), (128, 1, 2, 1), (128, 8, 1, 32))]
    # TurboQuant paged, int8 query: heads 32 / 64 / 128, GQA 1 / 4 / 8, half a QJL word a lane (8 lanes a row at head 128)
    # and two polar words a lane (4 lanes), 2 and 4 tokens a row
    + [case("tq-paged", f"i8-D{D}-G{G}-kvh{kvh}-bs{bs}-L{lanes}-U{u}", D=D, bs=bs, kvh=kvh, G=G, lens=[37, 0, 1, 300, 16],
            seed=D + G + bs, partition_tokens=64, caught=True, min_partitions=1, qk="i8", lanes=lanes, unroll=u)
       for D, G, kvh, bs, lanes, u in ((32, 1, 2, 1, 16, 2), (64, 8, 1, 16, 16, 1), (128, 4, 2, 32, 16, 2),
                                       (128, 1, 2, 16, 4, 4))]
)


@pytest.mark.parametrize("family,args", RAGGED_CASES)
def test_ragged_scattered(ctx, family, args):
    r = run(ctx, family, args)
    if "expect_partitions" in args:
        assert r.plan.num_partitions == args["expect_partitions"]
    if "min_partitions" in args:  # the context split as asked: ceil(longest / partition) partitions, more than one
        assert r.plan.num_partitions == math.ceil(max(args["lens"]) / r.plan.partition_tokens) > args["min_partitions"]
    if args.get("caught"):
        assert r.caught, "the tolerance must be tight enough to see the other QJL scale"


# ------------------------------------------------------------------------------ the vLLM tests' head sizes
# Every head size vLLM's attention tests use, for every decode family that takes it (the fast_decode formats and
# the ggml types rotating over the sizes, so each size and each format meets at least once). Where no power of two
# divides the head into lanes of the record's slices (80, 96, 112, 120, 192 at the adapter's lanes) the lanes walk it
# with padding; the adapter's default kernel runs (the looped one on a software rasteriser), and the unrolled one
# that hardware runs is held at the padded sizes too (slow to build on lavapipe: marked slow).
VLLM_HEADS = (64, 80, 96, 112, 120, 128, 192, 256)
VLLM_FD = dict(zip(VLLM_HEADS, ("int4-none-64", "f32-none-0", "int4-none-32", "fp8_e5m2-token-0", "int8-token-0",
                                "fp8_e4m3-tensor-0", "f16-none-0", "fp8_e4m3-token-0")))
VLLM_GGML = {64: "q4_1", 96: "q5_0", 128: "iq4_nl", 192: "mxfp4", 256: "q5_1"}
VLLM_KIVI = dict(zip(VLLM_HEADS, ("kivi-b2-r0", "kivi-b4-r16", "kivi-b2-r128", "kivi-b4-r0", "kivi-b2-r16",
                                  "kivi-b4-r128", "kivi-b2-r0", "kivi-b4-r16")))
VLLM_CASES = (
    [case(f, f"D{D}-G{G}", D=D, bs=16, kvh=2, G=G, lens=[37, 100, 0, 1], tensor=(0.02, 0.5), seed=D)
     for (D, f), G in zip(VLLM_FD.items(), (1, 4, 8, 4, 1, 4, 8, 4))]
    + [case(t, f"D{D}", D=D, bs=16, kvh=2, G=4, lens=[37, 0, 1, 100], seed=D) for D, t in VLLM_GGML.items()]
    + [case(k, f"D{D}", D=D, bs=16, kvh=2, G=4, lens=[65, 0, 1, 97], seed=D) for D, k in VLLM_KIVI.items()]
    + [case("nvfp4", f"D{D}", D=D, bs=16, kvh=2, G=4, lens=[37, 0, 1, 100], seed=D) for D in VLLM_HEADS if D % 16 == 0]
    + [case("tq-paged", f"D{D}", D=D, bs=16, kvh=2, G=4, lens=[37, 0, 1, 100], seed=D, caught=True) for D in (64, 128)]
    + [pytest.param(f, dict(D=D, bs=16, kvh=2, G=4, lens=[37, 0, 1, 100], seed=D, looped=False), id=f"{f}-D{D}-unrolled",
                    marks=pytest.mark.slow)
       for f, D in (("int8-token-0", 120), ("nvfp4", 80), ("q4_0", 96), ("kivi-b2-r16", 112))]
)


@pytest.mark.parametrize("family,args", VLLM_CASES)
def test_vllm_head_sizes(ctx, family, args):
    r = run(ctx, family, args)
    lay = r.plan.layout
    assert lay.span >= args["D"] and r.out.shape[2] == args["D"]
    looped = args.get("looped") is not False and harness.fd.use_looped(ctx.rt)
    assert r.plan.looped == looped, r.plan.describe()
    if args.get("caught"):
        assert r.caught, "the tolerance must be tight enough to see the other QJL scale"


# ------------------------------------------------------------------------------ long contexts
LONG_CASES = [
    pytest.param("int8-token-0", dict(D=128, bs=16, kvh=2, G=4, lens=[40000], policy="contiguous"), 4,
                 id="int8-40000", marks=pytest.mark.slow),
    pytest.param("q8_0", dict(D=128, bs=16, kvh=2, G=1, lens=[20000 + 17, 45], seed=5, words=False), 4, id="q8_0-20017"),
    pytest.param("kivi-b2-r128", dict(D=64, bs=16, kvh=1, G=1, lens=[20000 + 17, 45], seed=5, words=False), 8,
                 id="kivi-20017"),
    pytest.param("kivi-b2-r128", dict(D=64, bs=16, kvh=1, G=1, lens=[20000 + 17, 45], seed=5, words=False, qk="i8"), 8,
                 id="kivi-i8-20017"),
    pytest.param("nvfp4", dict(D=64, bs=16, kvh=1, G=1, lens=[20000 + 17], seed=5, words=False), 4, id="nvfp4-20017"),
    pytest.param("tq", dict(D=128, kvh=1, G=2, lens=[49152], seed=5, q_amp=4.0), 8, id="tq-49152"),
    pytest.param("tq-paged", dict(D=64, bs=16, kvh=1, G=2, lens=[20000], seed=5, q_amp=4.0), 8, id="tq-paged-20000"),
    pytest.param("tq-paged", dict(D=128, bs=16, kvh=1, G=4, lens=[20000 + 17], seed=6, q_amp=4.0, qk="i8"), 8,
                 id="tq-paged-i8-20017"),
]


@pytest.mark.parametrize("family,args,min_partitions", LONG_CASES)
def test_long_context(ctx, family, args, min_partitions):
    """A context of 20000+ tokens (the default split: many partitions, each within a software rasteriser's loop
    budget, kvviz/gpu/loop_budget.py), the softmax peaked over the whole context where q_amp is set."""
    r = run(ctx, family, args)
    assert r.out.shape == (len(args["lens"]), args["kvh"] * args["G"], args["D"])
    assert r.plan.num_partitions > min_partitions
    assert r.caught, "the tolerance must be tight enough to see the other QJL scale"
    if family.startswith("kivi"):  # partitions of whole key groups, the residual in the last one
        assert r.plan.partition_tokens % 32 == 0


# ------------------------------------------------------------------------------ one partition and many
PARTITION_CASES = [
    # fast_decode: the reduce is exact in base 2, so the two agree within the f32 tolerance
    case("int8-token-0", D=128, bs=16, kvh=2, G=4, lens=[700, 33, 2048], many=16, agree=1.0),
    # KIVI: partitions of one key group each (8 tokens a group row) and one for everything (32)
    case("kivi-b4-r16", D=128, bs=16, kvh=2, G=1, lens=[700, 1, 0, 333], seed=3, many=32, agree=2.0, group_rows=(8, 32),
         exact=True),
    case("tq", "reference", D=128, kvh=2, G=4, lens=[700, 1, 0, 333], seed=3, qjl="reference", many=32, exact=True),
    case("tq", "unbiased", D=128, kvh=2, G=4, lens=[700, 1, 0, 333], seed=3, qjl="unbiased", many=32, exact=True),
    case("tq-paged", "reference", D=64, bs=16, kvh=2, G=4, lens=[700, 1, 0, 333], seed=3, qjl="reference", many=64),
    case("tq-paged", "unbiased", D=64, bs=16, kvh=2, G=4, lens=[700, 1, 0, 333], seed=3, qjl="unbiased", many=64),
]


@pytest.mark.parametrize("family,args", PARTITION_CASES)
def test_partitions_single_and_many(ctx, family, args):
    """Short partitions (many, each against the oracle) and one partition for the whole context: both right, and
    where the family's reduce is exact enough, the same output within `agree` tolerances."""
    many = run(ctx, family, dict(args, partition_tokens=args["many"]))
    one = run(ctx, family, dict(args, partition_tokens=4096))
    assert many.plan.num_partitions == math.ceil(max(args["lens"]) / many.plan.partition_tokens) > 4
    assert one.plan.num_partitions == 1
    if args.get("exact"):  # the family takes the partition length as asked
        assert many.plan.partition_tokens == args["many"]
    assert many.caught, "the tolerance must be tight enough to see the other QJL scale"
    if "group_rows" in args:
        assert (many.plan.tokens_per_group_row, one.plan.tokens_per_group_row) == args["group_rows"]
    if "agree" in args:
        bound = 2e-5 * max(1.0, float(np.abs(one.out).max()))
        assert np.abs(many.out - one.out).max() <= args["agree"] * bound


# ------------------------------------------------------------------------------ reduce-scatter and all-lane softmax
SOFTMAX_CASES = (
    # GQA 1, 3 (G x U padded to a power of two), 4 and 16 (more (head, token) slots than lanes: a lane owns
    # several), 1, 2 and 4 tokens a row per step and 2 to 8 lanes a row
    [case(f, f"H{H}-kvh{kvh}-U{u}-L{lanes}", D=64, bs=16, kvh=kvh, G=H // kvh, lens=[37, 0, 1, 300, 129], tensor=(0.02, 0.5),
          unroll=u, lanes=lanes, partition_tokens=64, q_amp=4.0)
     for f in ("f32-none-0", "int8-token-0", "fp8_e4m3-tensor-0", "int4-none-32")
     for H, kvh, u, lanes in ((2, 2, 2, 8), (12, 4, 2, 8), (16, 1, 2, 8), (8, 2, 4, 4), (8, 2, 1, 2))]
    # types with and without a min, per-block V scales that differ between a row's lanes
    + [case(t, f"kvh{kvh}-G{G}-U{u}", D=64, bs=8, kvh=kvh, G=G, lens=[33, 0, 150, 1], seed=5, words=False, q_amp=3.0,
            unroll=u, partition_tokens=64)
       for t in ("q8_0", "q4_1", "q5_0", "mxfp4") for kvh, G, u in ((2, 3, 2), (1, 4, 4), (2, 1, 1))]
    # KIVI: both loops (the quantised key groups with their V zeros' sums kept by the owners, and the f32 window)
    + [case("kivi-b2-r16", "G4", D=64, bs=16, kvh=1, G=4, lens=[1, 31, 32, 33, 0, 77], seed=11, words=False, q_amp=3.0),
       case("kivi-b4-r16", "G3-U4", D=64, bs=8, kvh=2, G=3, lens=[96, 33, 1, 0], seed=11, words=False, q_amp=3.0, unroll=4),
       case("kivi-b2-r0", "G16", D=64, bs=16, kvh=1, G=16, lens=[65, 0, 40], seed=11, words=False, q_amp=3.0),
       case("kivi-b4-r16", "i8-G4", D=64, bs=16, kvh=2, G=4, lens=[1, 31, 32, 33, 0, 77], seed=11, words=False,
            q_amp=3.0, qk="i8")]
    + [case("nvfp4", "G2", D=64, bs=16, kvh=2, G=2, lens=[70, 33, 1, 0], seed=3)]
    + [case("tq", "G3", D=64, kvh=1, G=3, lens=[37, 0, 300], seed=4, q_amp=3.0)]
    + [case("tq-paged", f"D{D}-G{G}-U{u}", D=D, bs=16, kvh=kvh, G=G, lens=[37, 0, 1, 300], seed=D + G, q_amp=3.0,
            partition_tokens=64, unroll=u)
       for D, G, kvh, u in ((64, 3, 2, 2), (64, 16, 1, 2), (32, 4, 1, 4))]
    + [case("tq-paged", "i8-D64-G3-U2", D=64, bs=16, kvh=2, G=3, lens=[37, 0, 1, 300], seed=67, q_amp=3.0,
            partition_tokens=64, unroll=2, qk="i8")]
)


@pytest.mark.parametrize("family,args", SOFTMAX_CASES)
def test_scatter_and_all_lane_softmax(ctx, family, args):
    """The reduce-scatter softmax (the default where a row has 2+ lanes) and the all-lane one, each against the
    oracle, over ragged lengths with an empty sequence, one token, a partial step and a partition past the end,
    and large logits (the max jumps often)."""
    if DECODES[family].layout(ctx, args["D"], args["G"]).lanes < 2:
        pytest.skip("no subgroups: one lane a row, no scatter softmax")
    for scatter in (True, False):
        run(ctx, family, dict(args, scatter=scatter))


# ------------------------------------------------------------------------------ adapters without subgroups
NO_SUBGROUP_CASES = [
    # the one-lane kernel unrolls a whole head a lane for every query head of the group: small heads (lavapipe's
    # LLVM took minutes to compile a head-128 GQA-4 one), the layout asked of a large one
    case("int8-token-0", "D32", D=32, bs=16, kvh=2, G=2, lens=[5, 300, 0], layout=(128, 4, {})),
    case("f16-none-0", "D32", D=32, bs=8, kvh=1, G=2, lens=[64, 1], layout=(128, 4, {})),
    case("q8_0", D=32, bs=16, kvh=2, G=1, lens=[5, 100, 0, 33], seed=4, layout=(128, 4, {})),
    case("kivi-b4-r16", D=32, bs=16, kvh=2, G=1, lens=[5, 300, 0, 33], seed=4, layout=(128, 4, {})),
    case("kivi-b2-r0", "i8", D=32, bs=16, kvh=1, G=1, lens=[5, 300, 0, 33], seed=4, layout=(128, 4, {}), qk="i8"),
    case("nvfp4", D=32, bs=16, kvh=2, G=1, lens=[5, 100, 0, 33], seed=4, layout=(128, 4, {})),
    case("tq", D=64, kvh=2, G=1, lens=[90, 0, 1], seed=8, unroll=1, partition_tokens=32, layout=(64, 1, {"unroll": 1})),
    case("tq-paged", D=64, bs=16, kvh=2, G=1, lens=[90, 0, 1], seed=8, unroll=1, partition_tokens=32,
         layout=(64, 1, {"unroll": 1})),
    # the int8 query with a whole head a lane: two polar words and a QJL word
    case("tq-paged", "i8", D=32, bs=16, kvh=2, G=1, lens=[90, 0, 1], seed=8, unroll=1, partition_tokens=32,
         layout=(32, 1, {"unroll": 1}), qk="i8"),
]


@pytest.mark.parametrize("family,args", NO_SUBGROUP_CASES)
def test_no_subgroups_variant(ctx, family, args):
    """The fallback for adapters without subgroups: one lane a token row, no shuffles."""
    D, G, kw = args["layout"]
    assert DECODES[family].layout(ctx, D, G, subgroups=False, **kw).lanes == 1
    run(ctx, family, dict(args, subgroups=False))


# ------------------------------------------------------------------------------ zeros and extreme values
EXTREME_CASES = (
    # logits around +-400 in base e (q and K large) and V near 1e30: no overflow in exp2, finite output
    [case("f32-none-0", "logits-400", D=128, bs=16, kvh=2, G=4, lens=[50, 513], amp=4.0, q_amp=40.0),
     case("f32-none-0", "V-1e30", D=64, bs=16, kvh=1, G=4, lens=[9, 130], amp=1e30)]
    # all-zero keys and values (zero-scale blocks): exactly zero out; values ~1e4 (logits of order one)
    + [case(t, "zeros", D=128, bs=16, kvh=2, G=1, lens=[40, 1, 33], zeros=True, words=False, zero_out=True) for t in GGML]
    + [case(t, "1e4", D=128, bs=16, kvh=2, G=1, lens=[60, 33, 1], seed=11, k_amp=1e4, v_amp=1e4, q_amp=1e-4) for t in GGML]
    # q8_0 blocks whose f16 scale is near its limit (|x| ~ 6e6: d ~ 5e4 of 65504)
    + [case("q8_0", "near-f16-limit", D=64, bs=16, kvh=1, G=1, lens=[40, 7], seed=12, k_amp=1e6, v_amp=2e6, q_amp=1e-6)]
    # KIVI: degenerate groups; keys and values ~1e4; values ~1e4 with unit keys; logits in the tens (a peaked
    # softmax: the online max and the merges must hold)
    + [case("kivi-b2-r16", "zeros", D=64, bs=16, kvh=1, G=1, lens=[100, 1, 32], zeros=True, zero_out=True),
       case("kivi-b4-r16", "1e4", D=128, bs=16, kvh=2, G=4, lens=[150, 33, 1], seed=11, k_amp=1e4, v_amp=1e4, q_amp=1e-4),
       case("kivi-b2-r0", "V-1e4", D=64, bs=32, kvh=1, G=1, lens=[200, 31], seed=12, v_amp=1e4),
       case("kivi-b4-r16", "peaked", D=128, bs=16, kvh=2, G=1, lens=[300, 40], seed=13, k_amp=4.0, q_amp=6.0,
            partition_tokens=64)]
    # KIVI, int8 query: zero caches (every group's scale 0, so the requantised query is 0); keys and values ~1e4;
    # logits in the tens
    + [case("kivi-b2-r16", "i8-zeros", D=64, bs=16, kvh=1, G=1, lens=[100, 1, 32], zeros=True, zero_out=True, qk="i8"),
       case("kivi-b4-r16", "i8-1e4", D=64, bs=16, kvh=2, G=4, lens=[150, 33, 1], seed=11, k_amp=1e4, v_amp=1e4,
            q_amp=1e-4, qk="i8"),
       case("kivi-b4-r16", "i8-peaked", D=128, bs=16, kvh=2, G=1, lens=[300, 40], seed=13, k_amp=4.0, q_amp=6.0, qk="i8")]
    # NVFP4: s_t at its 2^-126 floor and zero scales; E4M3 scales from their top to subnormals; s_t ~ 4e26
    + [case("nvfp4", "zeros", D=64, bs=16, kvh=2, G=1, lens=[40, 1, 33], zeros=True, zero_out=True),
       case("nvfp4", "1e4", D=64, bs=16, kvh=2, G=1, lens=[60, 33, 1], seed=11, k_amp=1e4, v_amp=1e4, q_amp=1e-4),
       case("nvfp4", "1e30", D=64, bs=16, kvh=1, G=2, lens=[50, 9], seed=12, k_amp=1e30, v_amp=1e30, q_amp=1e-30)]
    # TurboQuant: norms up to ~5e4 (the f16 range), logits in the hundreds; norms over 4 decades; a fifth of the
    # vectors exactly zero (their records all 0 words) in contiguous blocks
    + [case("tq", "large", D=128, kvh=2, G=4, lens=[200, 1, 57], seed=11, k_amp=30.0, v_amp=3500.0, q_amp=8.0,
            partition_tokens=64),
       case("tq", "spread", D=64, kvh=2, G=4, lens=[150, 3, 0, 64], seed=12, spread=True, partition_tokens=32),
       case("tq-paged", "large", D=64, bs=16, kvh=2, G=4, lens=[200, 1, 57], seed=11, k_amp=30.0, v_amp=3500.0, q_amp=8.0,
            partition_tokens=64),
       case("tq-paged", "zero-vectors", D=64, bs=16, kvh=2, G=4, lens=[90, 1, 0, 45], seed=21, zeros=0.2,
            policy="contiguous", partition_tokens=64)]
    # the int8 query: norms up to the f16 range with logits in the hundreds; zero vectors
    + [case("tq-paged", "i8-large", D=64, bs=16, kvh=2, G=4, lens=[200, 1, 57], seed=11, k_amp=30.0, v_amp=3500.0,
            q_amp=8.0, partition_tokens=64, qk="i8"),
       case("tq-paged", "i8-zero-vectors", D=128, bs=16, kvh=2, G=4, lens=[90, 1, 0, 45], seed=21, zeros=0.2,
            policy="contiguous", partition_tokens=64, qk="i8")]
)


@pytest.mark.parametrize("family,args", EXTREME_CASES)
def test_zeros_and_extreme_values(ctx, family, args):
    r = run(ctx, family, args)
    if args.get("zero_out"):
        assert not r.out.any()


def test_exact_ties_average(ctx):
    """Every key identical: the weights tie exactly and the output is the mean of V."""
    rt = ctx.rt
    fd = harness.fd
    rng = np.random.default_rng(3)
    D, kvh, H, bs = 64, 1, 4, 8
    batch = harness.make_batch([77, 1000], bs, policy="scattered", seed=2)
    nb = batch.num_blocks
    key = np.broadcast_to(rng.standard_normal(D).astype(np.float32), (nb, kvh, bs, D)).copy()
    val = rng.standard_normal((nb, kvh, bs, D)).astype(np.float32)
    q = rng.standard_normal((2, H, D)).astype(np.float32)
    fast = harness.decoder(rt, "fast_decode", "FastDecode")
    out = fast.decode(fd.F32, rt.upload(key, "k"), rt.upload(val, "v"), kvh, q, batch, 0.125, partition_tokens=64)
    for s, n in enumerate(batch.context_lens):
        rows = [batch.slot(s, t) for t in range(int(n))]
        mean = val.reshape(-1, kvh, D)[rows, 0].astype(np.float64).mean(0)
        assert np.abs(out[s] - mean).max() < 1e-5


# ------------------------------------------------------------------------------ bad input refused
REFUSERS = {"fast_decode": "int8-token-0", "fast_decode_ggml": "q8_0", "fast_decode_kivi": "kivi-b2-r0",
            "fast_decode_fp4": "nvfp4", "fast_decode_tq": "tq", "fast_decode_tq (paged)": "tq-paged"}
REFUSALS = {**{k: DECODES[v].refusals for k, v in REFUSERS.items()}, **WRITER_REFUSALS}


@pytest.mark.parametrize("kernel", list(REFUSALS))
def test_bad_input_is_refused(ctx, kernel):
    """Every bad input of the kernel is refused before anything is dispatched, with the error type its callers
    catch and (where given) a message naming what is wrong."""
    for r in REFUSALS[kernel](ctx):
        if isinstance(r, Fact):
            assert r.holds, r.what
            continue
        try:
            with pytest.raises(r.error, match=r.match):
                r.call()
        except (pytest.fail.Exception, AssertionError) as e:
            raise AssertionError(f"{kernel}, {r.what}: {e}") from None


# ------------------------------------------------------------------------------ the fast writers' words
WRITERS = ["int8_token", "int8_seed", "fp8_e4m3-per_token", "fp8_e5m2-per_token", "fp8_e4m3-per_tensor",
           "fp8_e5m2-per_tensor", "int4-32", "int4-64", "int4-128", "f16", "kivi-b2-r0", "kivi-b4-r16"]


def _writer_runs(writer, shape, variant) -> bool:
    """f16 has no reduction (one variant); KIVI's writers are reached through the method (default and without
    subgroups); one lane a row is slow on a CPU: heads 64 and 80 only. int4 keeps its full grid over the heads
    whose groups nest with power-of-two lanes (at 112 and 120 its groups of 56 and 24 elements do not, and the fast
    int4 writer leaves them to the first-wave writer: tests/test_head_sizes.py)."""
    if writer.startswith("int4") and shape[0] in (112, 120):
        return False
    if writer == "f16":
        return variant[0] == "default"
    if variant[0] == "one-lane":
        return shape[0] in (64, 80) and not writer.startswith("kivi")
    return True


# int4's lane split nests its groups in the lanes (fast_write.choose_lanes): group size, head size and the
# variant's lane limit decide it together, so the int4 writers keep their full grid; pairs cover the rest
INT4_FULL = [(w, s, v) for w in WRITERS if w.startswith("int4") for s in WRITER_SHAPES for v in WRITER_VARIANTS
             if _writer_runs(w, s, v)]
WRITER_GRID = pairwise(WRITERS, WRITER_SHAPES, WRITER_VARIANTS, allowed=_writer_runs, seed_rows=INT4_FULL)


@pytest.mark.parametrize("writer,shape,variant", [pytest.param(w, s, v, id=f"{w}-{harness.shape_id(s)}-{v[0]}")
                                                  for w, s, v in WRITER_GRID])
def test_fast_writer_words_equal_the_oracle(ctx, writer, shape, variant, monkeypatch):
    """Exact, word for word: the fast writers take q = x * (1/scale) and fall back to the correctly rounded integer
    division wherever x / scale is within 16 ulp of a rounding boundary (ties included), so codes, scales, zeros,
    FP8 bytes, f16 halves, KIVI side streams and residual rows must EQUAL the oracle's (the seed layout is also held
    to the seed oracle's own rules, compare_int8_cache, which it passes with no tie used)."""
    rt = ctx.rt
    fw, ofw = harness.fw, harness.ofw
    D, bs, lens, policy, pad_every, kvh = shape
    _, sub, lanes = variant
    if writer.startswith("kivi"):  # the token and key-group writers through the method (head 80 runs padded to 96)
        okv = harness.oracle("fast_decode_kivi")
        bits, recent = (2, 0) if writer == "kivi-b2-r0" else (4, 16)
        if sub is False:
            monkeypatch.setattr(fw, "subgroups_available", lambda rt: False)
        batch = harness.make_batch(lens, bs, policy=policy, pad_every=pad_every, seed=D + bits)
        k, v = harness.make_rows(np.random.default_rng(D * bits + recent), batch.num_tokens, kvh, D, "int4")
        m = harness.get_method("kivi", bits=bits, recent=recent)
        qkv = m.quantize(ctx, batch, k, v)
        assert qkv.device["cache"].extra["writer_impl"] == "fast"
        kp, vp, _ = okv.pad_head(k, v)
        ref = ofw.kivi(batch, kp, vp, bits, recent)
        got = m.read_buffers(ctx, qkv)
        np.testing.assert_array_equal(got["k"], ref["k"])
        np.testing.assert_array_equal(got["v"], ref["v"])
        n = ref["plan"].total_res
        np.testing.assert_array_equal(got["res"][:n].view(np.uint32), ref["res"][:n].view(np.uint32))
        return
    batch = harness.make_batch(lens, bs, policy=policy, pad_every=pad_every, seed=D + bs)
    k, v = harness.make_rows(np.random.default_rng(D * 7 + bs), batch.num_tokens, kvh, D, writer)
    gk, gv, tensor, method = harness.run_writer(rt, writer, batch, k, v, fw.Variant(rt, sub, lanes))
    for which, x, got in (("K", k, gk), ("V", v, gv)):
        ref = harness.oracle_words(writer, batch, x, method)
        bad = np.argwhere(got != ref)
        assert not bad.size, f"{writer} {which}: {len(bad)} words differ, first at {tuple(bad[0])}: " \
                             f"{got[tuple(bad[0])]:#010x} vs {ref[tuple(bad[0])]:#010x}"
        if writer == "int8_seed":  # the seed oracle's own verdict (its tie and ULP allowances unused)
            res = harness.O.compare_int8_cache(got, x, batch.slot_mapping, bs)
            assert res["ok"] and res["code_mismatch_at_ties"] == 0 and res["scale_mismatch"] == 0, res
    if writer.endswith("per_tensor"):
        sk = ofw.fp8_tensor_scale(batch, k, writer[4:8])
        sv = ofw.fp8_tensor_scale(batch, v, writer[4:8])
        np.testing.assert_array_equal(tensor[2:4].view(np.float32), [sk, sv])


def test_the_writer_grid_covers_every_pair():
    """The pairwise grid above holds every (writer, shape), (writer, variant) and (shape, variant) pair that can run."""
    factors = (WRITERS, WRITER_SHAPES, WRITER_VARIANTS)
    assert harness.covers_every_pair(WRITER_GRID, factors, _writer_runs)
    assert all(_writer_runs(*r) for r in WRITER_GRID)
    assert all(r in WRITER_GRID for r in INT4_FULL) and len(INT4_FULL) == 3 * (2 * 6 + 2)
    # and the check can fail: the greedy's last row was the only one holding some pair
    assert not harness.covers_every_pair(WRITER_GRID[:-1], factors, _writer_runs)


INEXACT = ["int8_token", "fp8_e4m3-per_token", "fp8_e5m2-per_token", "fp8_e4m3-per_tensor", "int4-32", "int4-128"]
INEXACT_GRID = pairwise(INEXACT, [WRITER_SHAPES[1], WRITER_SHAPES[3]], [-3, 3])


@pytest.mark.parametrize("writer,shape,ulps", [pytest.param(w, s, u, id=f"{w}-{harness.shape_id(s)}-{u}")
                                               for w, s, u in INEXACT_GRID])
def test_exact_codes_with_an_inexact_divider(ctx, writer, shape, ulps):
    """lavapipe divides exactly; a GPU's 1/scale may be 2.5 ulp off (Vulkan). With 1/scale moved +-3 ulp the
    codes must still equal the oracle's: the 16-ulp check sends every near-boundary value (the rows' exact
    ties and FP8 midpoints included) to the exact division."""
    rt = ctx.rt
    D, bs, lens, policy, pad_every, kvh = shape
    batch = harness.make_batch(lens, bs, policy=policy, pad_every=pad_every, seed=D + bs)
    k, v = harness.make_rows(np.random.default_rng(D + ulps), batch.num_tokens, kvh, D, writer)
    gk, gv, _, method = harness.run_writer(rt, writer, batch, k, v, harness.fw.Variant(rt, inv_ulps=ulps))
    np.testing.assert_array_equal(gk, harness.oracle_words(writer, batch, k, method))
    np.testing.assert_array_equal(gv, harness.oracle_words(writer, batch, v, method))


# ------------------------------------------------------------------------------ the methods over a long context
METHOD_LONG_CASES = [
    # writer, dequantiser and the method's attention over one 3000-token sequence (and a short one), every word
    # and dequantised value held to the oracle
    # (one llama.cpp type: the others write and decode through the same kernels, their words in the grids above)
    pytest.param("q4_0", [3000, 3], 4, 12, id="q4_0-3000"),
    pytest.param("nvfp4", [3000, 1], 5, 6, id="nvfp4-3000"),
    # per-token writers, attention through the split f32 decode: right at 45000 tokens
    pytest.param("int8_token", [45000], 0, 1, id="int8_token-45000"),
    pytest.param("fp8_e4m3", [45000], 0, 1, id="fp8_e4m3-45000"),
    pytest.param("int4_group", [45000], 0, 1, id="int4_group-45000"),
    pytest.param("kivi", [45000], 0, 1, id="kivi-45000"),
]


@pytest.mark.parametrize("method,lens,seed,data_seed", METHOD_LONG_CASES)
def test_method_long_context(ctx, method, lens, seed, data_seed):
    rng = np.random.default_rng(data_seed)
    if method == "nvfp4" or harness.get_method(method).family == "ggml":
        batch = harness.make_batch(lens, 16, policy="scattered", seed=seed)
        if method == "nvfp4":
            k, v = harness.nvfp4_kv(rng, batch.num_tokens, 1, 64)
            harness.nvfp4_method_check(ctx, batch, k, v, 2)
        else:
            k, v = harness.ggml_kv(rng, batch.num_tokens, 1, 64)
            harness.ggml_method_check(ctx, harness.get_method(method), batch, k, v, 2)
        return
    n, D = lens[0], 128
    batch = harness.make_batch(lens, 16)
    k = rng.standard_normal((n, 1, D)).astype(np.float32)
    v = rng.standard_normal((n, 1, D)).astype(np.float32)
    q = rng.standard_normal((1, 2, D)).astype(np.float32)
    m = harness.get_method(method)
    qkv = m.quantize(ctx, batch, k, v)
    out = m.attend(ctx, qkv, batch, q, 1 / np.sqrt(D))
    ref, tol = harness.method_reference(method)(m, batch, k, v, q, 1 / np.sqrt(D), qkv)
    assert np.abs(out - ref).max() <= tol


# ------------------------------------------------------------------------------ every method over shapes
# (head_size, block_size, context lens, policy, pad_every, kv_heads, heads): ragged lengths with empty and
# single-token sequences, padding slots, contiguous / scattered / fragmented blocks, MHA and GQA
QUANT_SHAPES = [
    (64, 8, [1, 37, 20], "contiguous", 0, 2, 4),
    (128, 16, [70, 5, 0, 33], "scattered", 5, 2, 4),
    (256, 32, [100, 31], "scattered", 3, 1, 2),
    (128, 8, [64, 1, 45], "fragmented", 4, 1, 3),
]
GGML_SHAPES = [
    (64, 8, [1, 37, 0, 20], "contiguous", 0, 2, 4),
    (128, 16, [40, 5, 33], "scattered", 5, 1, 4),
    (256, 32, [50, 1], "fragmented", 3, 1, 2),
]
NVFP4_SHAPES = [
    (64, 8, [1, 37, 0, 20], "contiguous", 0, 2, 4),
    (80, 16, [40, 5, 33], "scattered", 5, 1, 2),
    (128, 16, [30, 1], "fragmented", 3, 2, 4),
    (256, 32, [50, 7], "scattered", 4, 1, 2),
]
# method family -> (shapes, K/V maker, data seed of a shape, check(ctx, method, batch, k, v, heads))
METHOD_FAMILIES = {
    "int8": (QUANT_SHAPES, harness.quant_kv, lambda D, bs: D * 1000 + bs, harness.quant_method_check),
    "int4": (QUANT_SHAPES, harness.quant_kv, lambda D, bs: D * 1000 + bs, harness.quant_method_check),
    "fp8": (QUANT_SHAPES, harness.quant_kv, lambda D, bs: D * 1000 + bs, harness.quant_method_check),
    "kivi": (QUANT_SHAPES, harness.quant_kv, lambda D, bs: D * 1000 + bs, harness.quant_method_check),
    "ggml": (GGML_SHAPES, harness.ggml_kv, lambda D, bs: D * 1000 + bs, harness.ggml_method_check),
    "fp4": (NVFP4_SHAPES, harness.nvfp4_kv, lambda D, bs: D + bs,
            lambda ctx, m, batch, k, v, H: harness.nvfp4_method_check(ctx, batch, k, v, H)),
}


def _method_cases():
    """Every registered method of the families above (int8_seed: tests/test_paged_conformance.py), with each option
    set it declares worth testing (KVMethod.examples), over its family's shapes."""
    out = []
    for key, cls in sorted(harness.registry().items()):
        if cls.family not in METHOD_FAMILIES or key == "int8_seed":
            continue
        for opts in cls.examples():
            oid = "-".join(f"{a}={b}" for a, b in opts.items())
            for s in METHOD_FAMILIES[cls.family][0]:
                out.append(pytest.param(key, opts, s, id=f"{key}-{oid}-D{s[0]}-bs{s[1]}-{s[3]}-pad{s[4]}"))
    return out


@pytest.mark.parametrize("method,opts,shape", _method_cases())
def test_method_conformance(ctx, method, opts, shape):
    """The method's writer, dequantiser and attention against its numpy oracle (the family's check in
    tests/harness.py says what is exact and what the tolerances are)."""
    D, bs, lens, policy, pad, kvh, H = shape
    m = harness.get_method(method, **opts)
    _, make_kv, seed, check = METHOD_FAMILIES[m.family]
    batch = harness.make_batch(lens, bs, policy=policy, pad_every=pad, seed=3)
    k, v = make_kv(np.random.default_rng(seed(D, bs)), batch.num_tokens, kvh, D)
    check(ctx, m, batch, k, v, H)


@pytest.mark.parametrize("method,opts", [pytest.param(k, o, id=f"{k}-" + "-".join(f"{a}={b}" for a, b in o.items()))
                                         for k, cls in sorted(harness.registry().items()) for o in cls.examples()])
@pytest.mark.parametrize("bad", ["nan_k", "inf_v", "f64", "shape"])
def test_every_method_refuses_bad_input(ctx, method, opts, bad):
    """A NaN key, an infinite value, float64 input and K / V of different head sizes: refused (InvalidInput) by
    every registered method, before anything is written."""
    m = harness.get_method(method, **opts)
    batch = harness.make_batch([5, 3], 8, pad_every=2)
    T = batch.num_tokens
    k = np.ones((T, 1, 64), np.float32)
    v = np.ones((T, 1, 64), np.float32)
    if bad == "nan_k":
        k[2, 0, 5] = np.nan
    elif bad == "inf_v":
        v[0, 0, 0] = -np.inf
    elif bad == "f64":
        k = k.astype(np.float64)
    else:
        v = v[:, :, :32].copy()
    with pytest.raises(harness.InvalidInput):
        m.quantize(ctx, batch, k, v)
