"""The causal prefill (kvviz/attention/prefill.py) held to its float64 oracle (kvviz/attention/prefill_oracle.py:
exact causal attention over the dequantised cache) within 2e-5 x max(1, max |V|) (prefill_oracle.tolerance says why).

Two levels, one grid each:
  - the kernel over caches of random records built in numpy (tests/harness.py make_records; their values are what
    the words decode to): every record format, head sizes 64 / 128 / an odd one the format allows, GQA 1 / 4 / 8,
    ragged chunks over scattered blocks (a whole-sequence chunk, chunks that start mid-sequence, a single-token chunk,
    an empty one), keys in one partition and in many (the reduce);
  - every live cache (LiveCache.attend_causal, the contract the eval's forward calls), each method written through
    its own GPU writer (extend) and its prefill held to the method's dequantised cache from its family's numpy oracle
    (the seed int8 and TurboQuant caches: the codes their writers wrote, read back; kvviz/families/prefill_oracles.py
    says why), for a whole prefill, a chunk from mid-sequence and a single token.
Plus a long context on lavapipe (split under its loop limit; an asked-for partition past it refused), values near
overflow, exact ties, and bad input refused with a message naming what is wrong.
"""
from __future__ import annotations

import numpy as np
import pytest

import harness
from kvviz.attention import prefill as pf
from kvviz.attention import prefill_oracle as po
from kvviz.attention import split_decode as fd
from kvviz.families import prefill_oracles as pfo
from kvviz.errors import DeviceLimitError, InvalidInput, UnsupportedShape
from kvviz.methods.live_cache import BlockTable, LiveCache, RequantCache, make_live_cache
from kvviz.paging import make_batch

pytestmark = pytest.mark.gpu

# (context lens after the chunk, chunk lens): a whole sequence, a chunk from mid-sequence, a single token at the end
# of a long one, a one-token sequence, an empty chunk
CHUNKS = (([37, 100, 300, 1, 20], [37, 17, 1, 1, 0]), ([64, 129, 5], [40, 129, 5]))


def record_case(rt, fmt, D, kvh, G, chunks, bs=16, seed=0, amp=1.0, q_amp=1.0, tensor=(0.5, 2.0), per_head=False,
                partition_tokens=None, policy="scattered", workgroup=None, variant=None, softcap=0.0):
    """The prefill over random records of `fmt` held to the oracle (workgroup, variant: the kernel's, default the
    adapter's; softcap: the logits' soft-cap, 0 none: then the output is also checked to be far, 10 tolerances or
    more, from the uncapped oracle's, so a case whose cap does not bite fails); returns (out, ref, plan)."""
    lens, qlens = chunks
    rng = np.random.default_rng(seed)
    batch = make_batch(lens, bs, policy=policy, seed=seed)
    scales = tensor if fmt.scale == "tensor" and not per_head else (1.0, 1.0)
    (kw, kf), (vw, vf) = harness.build_caches(fmt, rng, batch, kvh, D, amp, scales)
    tb = None
    if per_head:  # the vLLM per-KV-head layout: scales[K|V * kv heads + h]
        hs = rng.uniform(0.5, 2.0, (2, kvh)).astype(np.float32)
        kf, vf = kf * hs[0][None, :, None, None], vf * hs[1][None, :, None, None]
        tb = rt.upload(hs.reshape(-1).view(np.uint32), "head_scales")
    elif fmt.scale == "tensor":
        tb = rt.upload(np.array([0.0, 0.0, *tensor], np.float32).view(np.uint32), "tensor")
    q = (rng.standard_normal((sum(qlens), kvh * G, D)) * q_amp).astype(np.float32)
    scale = D ** -0.5
    prefill = pf.Prefill(rt, workgroup, variant) if workgroup or variant else harness.decoder(rt, "prefill", "Prefill")
    plan = pf.plan_records(prefill, pf.record_format(fmt, per_head), rt.upload(kw, "k"), rt.upload(vw, "v"), kvh, q,
                           batch, qlens, scale, tensor=tb, partition_tokens=partition_tokens, softcap=softcap)
    out = prefill.run(plan)
    ref = po.causal(q, kf, vf, batch.block_tables, batch.context_lens, qlens, bs, scale, softcap=softcap)
    tol = po.tolerance(float(np.abs(vf).max()))
    assert np.isfinite(out).all()
    err = float(np.abs(out - ref).max(initial=0.0))
    assert err <= tol, (f"{fmt.name} D{D} G{G} {chunks} cap {softcap}: max error {err:.3g} > {tol:.3g} "
                        f"({plan.describe()})")
    if softcap:
        plain = po.causal(q, kf, vf, batch.block_tables, batch.context_lens, qlens, bs, scale)
        assert np.abs(out - plain).max() > 10 * tol, f"{fmt.name} D{D} G{G}: the cap {softcap} changes nothing"
    return out, ref, plan


def _odd(fmt) -> int:
    """An odd head size (not a power of two) the format allows."""
    return 3 * fmt.group_size if fmt.group_size else 68


# every record format: head 128 with GQA 4 over the first chunk set in one partition (blocks of 16); the format's odd
# head size with GQA 8 and head 64 with MHA over the second set with keys in partitions of 32 (the reduce), blocks of
# 16 and 32
RECORD_CASES = (
    [pytest.param(f, 128, 2, 4, 0, None, 16, id=f"{harness.fmt_id(f)}-D128-G4") for f in harness.FORMATS]
    + [pytest.param(f, _odd(f), 1, 8, 1, 32, 16, id=f"{harness.fmt_id(f)}-D{_odd(f)}-G8-split") for f in harness.FORMATS]
    + [pytest.param(f, 64, 3, 1, 1, 32, 32, id=f"{harness.fmt_id(f)}-D64-G1-split-bs32") for f in harness.FORMATS[:3]]
)


@pytest.mark.parametrize("fmt,D,kvh,G,chunks,pt,bs", RECORD_CASES)
def test_record_formats(ctx, fmt, D, kvh, G, chunks, pt, bs):
    _, _, plan = record_case(ctx.rt, fmt, D, kvh, G, CHUNKS[chunks], bs=bs, seed=D + G, partition_tokens=pt)
    assert (plan.num_partitions > 1) == (pt is not None)
    lens, qlens = CHUNKS[chunks]
    assert plan.num_tiles == sum(-(-n // plan.layout.bq) for n in qlens)


@pytest.mark.parametrize("workgroup", [64, 128])
def test_workgroup_sizes(ctx, workgroup):
    """Both workgroup sizes the planner picks (64 invocations on a software adapter, 128 on a GPU) on any adapter:
    int8 records, head 128 with GQA 4 and the odd head 68 with MHA, keys in one partition and in many."""
    record_case(ctx.rt, fd.INT8, 128, 2, 4, CHUNKS[0], seed=3, workgroup=workgroup)
    _, _, plan = record_case(ctx.rt, fd.INT8, 68, 2, 1, CHUNKS[1], seed=4, partition_tokens=32, workgroup=workgroup)
    assert plan.layout.workgroup == workgroup


@pytest.mark.parametrize("variant", list(pf.VARIANTS))
def test_variants(ctx, variant):
    """Every variant of the kernel (kvviz/attention/prefill.py VARIANTS; the full grid above runs the adapter's
    default): int8 records at head 128 with GQA 4 in one partition; f32 at the odd head 68 with GQA 8, keys in
    partitions of 32 (the reduce), logits around +-100 (the online max moves by tens between tiles); and
    TurboQuant's live cache (its tile code rotates K and V in workgroup memory between the kernel's barriers)."""
    rt = ctx.rt
    _, _, plan = record_case(rt, fd.INT8, 128, 2, 4, CHUNKS[0], seed=21, variant=variant)
    assert plan.layout.variant.name == variant and f"variant {variant}" in plan.describe()
    record_case(rt, fd.F32, 68, 1, 8, CHUNKS[1], seed=22, amp=4.0, q_amp=10.0, partition_tokens=32, variant=variant)
    default = ctx.prefill
    ctx.prefill = pf.Prefill(rt, variant=variant)
    try:
        live_case(ctx, harness.get_method("turboquant"), CHUNKED, D=64, kvh=2, G=4, seed=3)
    finally:
        ctx.prefill = default
    with pytest.raises(InvalidInput, match="no variant"):
        pf.Prefill(rt, variant="nope")


def test_register_tiles_unroll():
    """Every unrolled loop of the kernel (TM, TN, ND4, CT; kvviz/gpu/shaders.py unrolls at most UNROLL_MAX iterations)
    stays within the unroller's bound for every variant, group, head size and workgroup size the planner makes: a loop
    left a loop would move its private arrays out of registers and escape loop_cost's count (lavapipe's loop limit)."""
    from kvviz.gpu.shaders import UNROLL_MAX

    for v in pf.VARIANTS.values():
        for wg in ((v.workgroup,) if v.workgroup else (pf.WORKGROUP, pf.WORKGROUP_SOFTWARE)):
            for G in range(1, pf.MAX_GROUP + 1):
                for D in (4, 64, 68, 128, 256):
                    for limit, scratch in ((16384, 0), (32768, 0), (49152, 0), (49152, D)):
                        try:
                            lay = pf.choose_layout(D, G, limit, scratch, wg, v)
                        except DeviceLimitError:
                            continue
                        assert max(lay.tm, lay.tn, lay.nd4, lay.cols) <= UNROLL_MAX, (v.name, wg, G, D, lay.describe())


def test_per_head_scales(ctx):
    """FP8 codes with one scale a KV head and K|V (the vLLM per-head layout), head 128, GQA 2."""
    record_case(ctx.rt, fd.fp8_format("e4m3", True), 128, 4, 2, CHUNKS[0], per_head=True, seed=5)


def test_extreme_values_and_ties(ctx):
    """Logits around +-400 (a peaked softmax: the online max moves by hundreds between tiles), V near 1e30 (finite
    output), and every key equal (the weights tie: the output is the mean of the visible V rows)."""
    rt = ctx.rt
    record_case(rt, fd.F32, 128, 2, 4, CHUNKS[0], amp=4.0, q_amp=40.0, seed=7)
    record_case(rt, fd.F32, 64, 1, 4, CHUNKS[1], amp=1e30, seed=8)
    record_case(rt, fd.F16, 64, 1, 4, CHUNKS[1], amp=1e4, seed=9)  # f16 values up to ~5e4, near its 65504 limit
    D, kvh, H, bs = 64, 1, 4, 8
    lens, qlens = [77, 300], [77, 40]
    batch = make_batch(lens, bs, policy="scattered", seed=2)
    rng = np.random.default_rng(3)
    nb = batch.num_blocks
    key = np.broadcast_to(rng.standard_normal(D).astype(np.float32), (nb, kvh, bs, D)).copy()
    val = rng.standard_normal((nb, kvh, bs, D)).astype(np.float32)
    q = rng.standard_normal((sum(qlens), H, D)).astype(np.float32)
    prefill = harness.decoder(rt, "prefill", "Prefill")
    out = prefill.run(pf.plan_records(prefill, pf.F32, rt.upload(key, "k"), rt.upload(val, "v"), kvh, q, batch, qlens,
                                      0.125, partition_tokens=64))
    row = 0
    for s, (L, n) in enumerate(zip(lens, qlens)):
        vs = val[[batch.slot(s, t) // bs for t in range(L)], 0, [batch.slot(s, t) % bs for t in range(L)]]
        for t in range(n):
            mean = vs[: L - n + t + 1].astype(np.float64).mean(0)
            assert np.abs(out[row + t] - mean).max() < 1e-5
        row += n


def test_long_context_under_the_loop_limit(ctx):
    """A 20000-token sequence's last 8 queries: on an adapter with a loop limit (lavapipe) the planner splits the keys
    so no invocation passes it (the reduce combines them), and a partition asked for past it is refused."""
    rt = ctx.rt
    _, _, plan = record_case(rt, fd.INT8, 64, 1, 4, ([20000, 3], [8, 3]), seed=11)
    prefill = harness.decoder(rt, "prefill", "Prefill")
    if rt.loop_limit is not None:
        assert plan.num_partitions > 1
        assert pf.loop_cost(plan.layout, plan.partition_tokens) <= rt.loop_limit
        with pytest.raises(DeviceLimitError, match="loop limit"):
            prefill.split(plan.layout, 3, 1, 70000, 70000)


# ------------------------------------------------------------------------------ live caches: the contract
def _table(n: int, bs: int = 16) -> BlockTable:
    return BlockTable(-(-n // bs) + 3, bs, "scattered", seed=1)


def live_case(ctx, method, chunks, D=64, kvh=2, G=4, bs=16, make_kv=None, seed=0, one_dispatch=True, softcap=0.0,
              decode=0):
    """`method` ('f32' or an instance)'s live cache over one layer, written and attended chunk by chunk as a chunked
    prefill runs it: for each (start, T) of `chunks`, positions start..start+T-1 written by the cache's writer
    (extend), then their queries attended causally and held to the oracle over the method's dequantised cache of
    positions 0..start+T-1 (one_dispatch: by the prefill, never the decode loop). softcap: the model's logits
    soft-cap (the cache's and the oracle's); decode: then so many decode steps (append_attend, a token at a time),
    each held to the oracle's last query. Returns (cache, [(q, out, tolerance, uncapped oracle) of each chunk and
    step])."""
    rng = np.random.default_rng(seed)
    L = max(a + n for a, n in chunks)
    k, v = (make_kv or harness.quant_kv)(rng, L + decode, kvh, D)
    H = kvh * G
    scale = D ** -0.5
    table = _table(L + decode, bs)
    cache = make_live_cache(method, ctx, table, 1, H, kvh, D, scale, softcap=softcap)

    def no_decode(*a):
        raise AssertionError(f"{cache.label}: attend_causal ran the decode loop instead of a prefill dispatch")

    if one_dispatch and not softcap:  # a soft-capped cache's decode is itself the prefill; it never loops
        cache.attend = no_decode  # every cache attends a chunk in one prefill dispatch
    outs = []

    def check(q, out, start, T):
        b = table.batch(start + T)
        # a re-quantising cache prefills over the method's device-only cache: its full quantize of the same rows (the
        # same writer) gives the records the reference reads
        qkv = cache._quantized(0, start + T)[0] if isinstance(cache, RequantCache) else None
        if method != "f32" and method.id == "int8_seed":  # the codes its writer wrote (prefill_oracles says why)
            qkv = method.read_back(ctx, cache.layers[0], b)
        fk, fv = pfo.method_caches(None if method == "f32" else method, b, k[: start + T], v[: start + T], qkv)
        ref = po.causal(q, fk, fv, b.block_tables, b.context_lens, [T], bs, scale, softcap=softcap)
        plain = po.causal(q, fk, fv, b.block_tables, b.context_lens, [T], bs, scale) if softcap else ref
        tol = po.tolerance(float(np.abs(fv).max()))
        err = float(np.abs(out - ref).max(initial=0.0))
        assert np.isfinite(out).all() and err <= tol, f"{cache.label} start {start} T {T}: {err:.3g} > {tol:.3g}"
        outs.append((q, out, tol, plain))

    for start, T in chunks:
        if start + T > table.capacity or start + T > cache.length:
            w0 = min(start, cache.length)
            cache.extend(0, k[w0 : start + T].transpose(1, 0, 2), v[w0 : start + T].transpose(1, 0, 2), w0)
        q = rng.standard_normal((T, H, D)).astype(np.float32)
        out = cache.attend_causal(0, q, start)
        assert out.shape == (T, H, D) and out.dtype == np.float32
        check(q, out, start, T)
    for p in range(L, L + decode):
        q = rng.standard_normal((H, D)).astype(np.float32)
        out = cache.append_attend(0, q, k[p], v[p], p)
        assert out.shape == (H, D) and out.dtype == np.float32 and cache.length == p + 1
        check(q[None], out[None], p, 1)
    if one_dispatch and not softcap:
        del cache.attend
    return cache, outs


def test_live_f32_and_int8_seed(ctx):
    """The f32 baseline and the seed int8 cache (PagedLiveCache): one dispatch, the oracle's values, and the decode
    loop (LiveCache.attend_causal's base) giving the same within the tolerance."""
    for method in ("f32", harness.get_method("int8_seed")):
        cache, outs = live_case(ctx, method, [(0, 100), (100, 50), (150, 1)], D=64, kvh=2, G=4)
        q, out, tol, _ = outs[1]
        loop = LiveCache.attend_causal(cache, 0, q, 100)  # both within the tolerance of the same oracle
        assert np.abs(loop - out).max() <= 2 * tol


def test_shape_the_prefill_refuses_runs_the_decode_loop(ctx):
    """Head 66 (not a multiple of 4): the prefill refuses it (UnsupportedShape), the f32 live cache still answers
    through the decode once a query, within the oracle's tolerance."""
    live_case(ctx, "f32", [(0, 20), (20, 3)], D=66, kvh=1, G=2, one_dispatch=False)


def test_bad_input_is_refused(ctx):
    rt = ctx.rt
    prefill = harness.decoder(rt, "prefill", "Prefill")
    batch = make_batch([10, 4], 16)
    k = rt.upload(np.zeros(2 * 2 * 16 * 64, np.float32), "k")
    q = np.zeros((6, 8, 64), np.float32)

    def plan(q=q, lens=(3, 3), kvh=2, scale=0.1, fmt=pf.F32, kbuf=k):
        return pf.plan_records(prefill, fmt, kbuf, kbuf, kvh, q, batch, list(lens), scale)

    with pytest.raises(InvalidInput, match="do not divide"):
        plan(kvh=3)
    with pytest.raises(InvalidInput, match="sum to"):
        plan(lens=(3, 2))
    with pytest.raises(InvalidInput, match="does not fit"):
        plan(q=np.zeros((12, 8, 64), np.float32), lens=(7, 5))
    with pytest.raises(InvalidInput, match="NaN|finite"):
        plan(q=np.full((6, 8, 64), np.nan, np.float32))
    with pytest.raises(InvalidInput, match="scale"):
        plan(scale=-1.0)
    with pytest.raises(UnsupportedShape, match="multiple of 4"):
        plan(q=np.zeros((6, 8, 66), np.float32))
    with pytest.raises(UnsupportedShape, match="head size"):
        plan(q=np.zeros((6, 8, 100), np.float32), fmt=pf.record_format(fd.int4_format(32)))
    with pytest.raises(InvalidInput, match="cache holds"):
        plan(kbuf=rt.upload(np.zeros(64, np.float32), "small"))
    cache = make_live_cache("f32", ctx, _table(20), 1, 8, 2, 64, 0.125)
    with pytest.raises(InvalidInput, match=r"q \[T, 8, 64\]"):
        cache.attend_causal(0, np.zeros((3, 4, 64), np.float32), 0)
    with pytest.raises(InvalidInput, match="not written"):
        cache.attend_causal(0, np.zeros((3, 8, 64), np.float32), 200)


# every per-token-record method's live cache (appended by its writer), the per-tensor FP8 cache (quantised again for
# the chunk's context) and the vLLM-style FP8 caches (scales calibrated on the first chunk, then frozen)
CHUNKED = [(0, 64), (64, 45), (109, 1)]
RECORD_METHODS = [
    ("int8_seed", {}, 128), ("int8_token", {}, 64), ("f16", {}, 64), ("fp8_e4m3", {}, 64),
    ("fp8_e5m2", {"scale_mode": "per_tensor"}, 64), ("int4_group", {"group_size": 32}, 96),
    ("vllm_fp8_e4m3", {"calib_tokens": 64}, 64), ("vllm_fp8_e5m2", {"scale_granularity": "per_head", "calib_tokens": 64}, 64),
    ("vllm_fp8_e4m3", {"scales": "given", "k_scale": 0.005, "v_scale": 0.01}, 64),
]


@pytest.mark.parametrize("method,opts,D", [pytest.param(m, o, D, id=f"{m}-" + "-".join(f"{a}={b}" for a, b in o.items()))
                                           for m, o, D in RECORD_METHODS])
def test_live_record_methods(ctx, method, opts, D):
    live_case(ctx, harness.get_method(method, **opts), CHUNKED, D=D, kvh=2, G=4)


GGML_TYPES = ["q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl", "mxfp4"]


@pytest.mark.parametrize("method", GGML_TYPES)
def test_live_ggml_types(ctx, method):
    """llama.cpp's block types (their live cache: the fast writer's rows), head 64 with GQA 4 for every type, and q8_0
    at head 96 (three blocks) with GQA 8 (the shell's element function is one for every type: the record formats'
    grid above covers the kernel's shapes)."""
    live_case(ctx, harness.get_method(method), CHUNKED, D=64, kvh=2, G=4, make_kv=harness.ggml_kv)
    if method == "q8_0":
        live_case(ctx, harness.get_method(method), CHUNKED, D=96, kvh=1, G=8, make_kv=harness.ggml_kv, seed=2)


def test_live_nvfp4(ctx):
    """NVFP4 (a tensor scale over the sequence: its cache quantised again for each chunk's context), head 64 with GQA 4
    and 80 (five 16-element blocks) with MHA."""
    live_case(ctx, harness.get_method("nvfp4"), CHUNKED, D=64, kvh=2, G=4, make_kv=harness.nvfp4_kv)
    live_case(ctx, harness.get_method("nvfp4"), CHUNKED, D=80, kvh=2, G=1, make_kv=harness.nvfp4_kv, seed=1)


@pytest.mark.parametrize("opts,D,G", [({"bits": 2, "recent": 0}, 64, 4), ({"bits": 4, "recent": 16}, 72, 8),
                                      ({"bits": 2, "recent": 128}, 128, 1)],
                         ids=["b2-r0-D64", "b4-r16-D72", "b2-r128-D128"])
def test_live_kivi(ctx, opts, D, G):
    """KIVI's live cache (key groups quantised as they fill, the window in f32): chunks of 64, 45 and 1 positions (whole
    key groups, a group that fills inside a chunk, the window's rows); head 72 runs padded to 80."""
    live_case(ctx, harness.get_method("kivi", **opts), CHUNKED, D=D, kvh=1, G=G)


@pytest.mark.parametrize("opts,D", [({}, 64), ({"bits": 3, "v_bits": 3, "outlier_share": 0.5, "qjl_scale": "unbiased"}, 64),
                                    ({"bits": 1, "v_bits": 4}, 72)],
                         ids=["seed-D64", "3-bit-outliers-unbiased-D64", "1-4-bit-D72"])
def test_live_turboquant(ctx, opts, D):
    """TurboQuant (quantised again for each chunk's context): the seed configuration, the outlier split (two instances
    of their own rotation, codebook and QJL), and head 72 rotated in R^128."""
    live_case(ctx, harness.get_method("turboquant", **opts), CHUNKED, D=D, kvh=2, G=4)


def test_every_method_is_covered():
    """Every registered method's live cache is held to the oracle above (a method added later must join a grid)."""
    tested = {m for m, _, _ in RECORD_METHODS} | set(GGML_TYPES) | {"nvfp4", "kivi", "turboquant"}
    assert tested == set(harness.registry())


def test_bench_prefill_rows(rt):
    """`kvviz bench` at a prefill shape: the prefill of the f32 cache and of a method's, each timed (GPU timestamps,
    printed, never asserted) and within its tolerance of the oracle on the checked queries; torch's row says why it
    has no time where torch has no CUDA device."""
    from kvviz.bench import BenchShape, check_shape, failed_rows, run_bench

    shape = BenchShape("tiny-prefill", (40, 70), 4, 2, 64, 16, "scattered", (40, 9))
    check_shape(shape)
    res = run_bench([shape], runs=2, warmup=1, methods=("q8_0", "int8_seed"), rt=rt, compare_torch=True,
                    log=lambda *a: None)
    rows = {r["kernel"]: r for r in res["rows"] if r["role"] == "prefill"}
    assert {"prefill_f32", "prefill_q8_0", "prefill_int8_seed", "torch_sdpa_causal_bf16"} <= set(rows)
    for k in ("prefill_f32", "prefill_q8_0", "prefill_int8_seed"):
        r = rows[k]
        assert r["within_tolerance"] and r["gpu_us_median"] > 0 and r["flops"] > 0, r
        assert r["note"].startswith("checked on 25 of 49 queries"), r["note"]
    assert rows["prefill_q8_0"]["note"] == "checked on 25 of 49 queries"
    # the seed cache: the attention over the codes read back, the writer's codes against its quantiser beside it
    assert "over the seed writer's codes as read back (against its numpy quantiser: 0 off-tie" in \
        rows["prefill_int8_seed"]["note"], rows["prefill_int8_seed"]["note"]
    assert not failed_rows(res)
    assert res["rows"][0]["shape"]["query_lens"] == [40, 9]
    # two variants of the kernel over the same cache, a row each, named with the variant
    res = run_bench([shape], runs=2, warmup=1, methods=(), rt=rt, log=lambda *a: None,
                    prefill_variants=("rows", "spread"))
    rows = {r["kernel"]: r for r in res["rows"] if r["role"] == "prefill"}
    assert set(rows) == {"prefill_f32 (rows)", "prefill_f32 (spread)"}
    assert all(r["within_tolerance"] for r in rows.values()) and not failed_rows(res)
    assert "variant spread" in rows["prefill_f32 (spread)"]["variant"]
    with pytest.raises(InvalidInput, match="no prefill variant"):
        run_bench([shape], runs=1, warmup=0, methods=(), rt=rt, log=lambda *a: None, prefill_variants=("nope",))
    with pytest.raises(InvalidInput, match="chunk length"):
        check_shape(BenchShape("bad", (4,), 4, 2, 64, 16, "contiguous", (5,)))


def test_sliding_window_layers(ctx):
    """A model cache with a global layer and layers of a sliding window of 8 (kvviz/methods/live_window.py): the global
    layer and a window's ring before it wraps attend a chunk in one prefill dispatch; past the wrap a single query
    attends over its last 8 positions; a chunk of several queries past the wrap is refused (the ring no longer holds
    the keys its first queries see)."""
    from kvviz.methods.live_window import WindowedLiveCache

    rng = np.random.default_rng(5)
    W, D, kvh, H = 8, 64, 2, 4
    k, v = (rng.standard_normal((12, kvh, D)).astype(np.float32) for _ in range(2))
    table = _table(12)
    cache = WindowedLiveCache("f32", ctx, table, 2, H, kvh, D, D ** -0.5, (0, W))

    def ref(q, start, window):  # each query over positions (p - window, p], float64
        out = np.zeros(q.shape, np.float64)
        for t in range(q.shape[0]):
            p = start + t
            lo = max(0, p - window + 1) if window else 0
            for h in range(H):
                s = (k[lo : p + 1, h // 2] @ q[t, h]).astype(np.float64) * D ** -0.5
                e = np.exp(s - s.max())
                out[t, h] = (e / e.sum()) @ v[lo : p + 1, h // 2]
        return out

    for start, T in ((0, 6), (6, 2), (8, 1)):
        for layer in (0, 1):
            cache.extend(layer, k[start : start + T].transpose(1, 0, 2), v[start : start + T].transpose(1, 0, 2), start)
        q = rng.standard_normal((T, H, D)).astype(np.float32)
        for layer, window in ((0, 0), (1, W)):
            out = cache.attend_causal(layer, q, start)
            assert np.abs(out - ref(q, start, window)).max() <= po.tolerance(float(np.abs(v).max()))
    for layer in (0, 1):
        cache.extend(layer, k[9:12].transpose(1, 0, 2), v[9:12].transpose(1, 0, 2), 9)
    q = rng.standard_normal((3, H, D)).astype(np.float32)
    assert np.abs(cache.attend_causal(0, q, 9) - ref(q, 9, 0)).max() <= po.tolerance(float(np.abs(v).max()))
    with pytest.raises(InvalidInput, match="sliding window of 8"):
        cache.attend_causal(1, q, 9)


def test_seed_int8_is_checked_over_the_codes_written(ctx):
    """The seed int8 cache's prefill is held to the attention over the codes its writer wrote (read back), the writer's
    codes to its numpy quantiser on their own (kvviz.bench.prefill_check). GLSL's round() leaves the direction of a .5
    tie to the driver: a writer that rounds one the other way (as on NVIDIA) holds a code the quantiser does not, one
    V step at a position a query weighs fully. The prefill over that cache is right and passes; the quantiser's cache
    would put it far past the tolerance. A code off away from a tie fails as the writer's fault, and an output off by
    twice the tolerance as the kernel's."""
    from kvviz.bench import prefill_check

    rt = ctx.rt
    m = harness.get_method("int8_seed")
    D, kvh, H, bs = 64, 1, 2, 16
    lens = [20, 9]
    batch = make_batch(lens, bs, policy="scattered", seed=4)
    rng = np.random.default_rng(12)
    key, value = (rng.uniform(-3, 3, (batch.num_tokens, kvh, D)).astype(np.float32) for _ in range(2))
    # token row 0 (sequence 0, position 0; its query sees only it): amax 127/32, so 127 / amax is 32 exactly and
    # dim 5 = 2.5/32 scales to 2.5, a tie the quantiser rounds to even (2)
    value[0, 0, 0], value[0, 0, 5] = 127 / 32, 2.5 / 32
    q = rng.standard_normal((sum(lens), H, D)).astype(np.float32)
    scale = D ** -0.5
    rows = np.arange(sum(lens))
    qkv = m.quantize(ctx, batch, key, value)
    cache = qkv.device["cache"]

    def with_code(tok: int, dim: int, code: int):
        """The cache with V code `dim` of token row `tok` set to `code`, read back; its prefill and the check."""
        words = ctx.paged.read(cache, "v")
        slot = int(batch.slot_mapping[tok])
        rec = words[slot // bs, 0, slot % bs]
        codes = rec[:-1].view(np.int8)
        codes[dim] = code
        rt.write(cache.v, words)
        got = m.read_back(ctx, cache, batch)
        out = ctx.prefill.run(m.prefill_plan(ctx, got, batch, q, lens, scale))
        return got, out, prefill_check(rt, m, batch, key, value, got, q, lens, scale, rows, out)

    got, out, pc = with_code(0, 5, 3)  # the tie rounded away from zero
    assert pc.ok and "0 off-tie / 1 tie mismatches" in pc.note, pc.note
    fk, fv = pfo.method_caches(m, batch, key, value)  # the numpy quantiser's cache: code 2 there
    old = po.causal(q, fk, fv, batch.block_tables, batch.context_lens, lens, bs, scale)
    assert np.abs(out - old).max() > 100 * pc.tol
    bad = out.copy()
    bad[7, 1, 3] += 2 * pc.tol
    wrong = prefill_check(rt, m, batch, key, value, got, q, lens, scale, rows, bad)
    assert not wrong.ok and wrong.err > wrong.tol
    code = int(np.rint(value[1, 0, 9] * np.float32(127 / np.abs(value[1, 0]).max())))
    _, _, off = with_code(1, 9, code + (1 if code < 127 else -1))  # not at a tie
    assert not off.ok and off.note.startswith("FAILED: outside the seed writer's allowance"), off.note


# ------------------------------------------------------------------------------ soft-capped logits (Gemma 2)
@pytest.mark.parametrize("variant", list(pf.VARIANTS))
def test_soft_capped_scores(ctx, variant):
    """Every variant soft-caps every score (scale q.k -> cap tanh(scale q.k / cap) before the mask and the softmax) as
    the oracle does: int8 records at head 128 with GQA 4, logits of hundreds under a cap of 50 (tanh saturates: the
    largest keys tie at the cap; record_case checks the output is far from the uncapped one); f32 at the odd head 68
    with GQA 8
    under a cap of 1, keys in partitions of 32 (the reduce). The grid above runs the same kernels with the cap 0."""
    rt = ctx.rt
    record_case(rt, fd.INT8, 128, 2, 4, CHUNKS[0], seed=21, amp=4.0, q_amp=40.0, variant=variant, softcap=50.0)
    record_case(rt, fd.F32, 68, 1, 8, CHUNKS[1], seed=22, amp=4.0, q_amp=10.0, partition_tokens=32, variant=variant,
                softcap=1.0)


def test_soft_capped_formats(ctx):
    """The cap over two more record formats of attention/prefill.wgsl, f16 and int4 groups of 32 (a scale and a zero
    a group), at head 64 (keys in partitions of 32), logits of tens under a cap of 5 (the other shells: the live
    caches below); a cap that is negative or not finite refused."""
    rt = ctx.rt
    record_case(rt, fd.F16, 64, 2, 4, CHUNKS[0], seed=31, q_amp=20.0, softcap=5.0)
    record_case(rt, fd.int4_format(32), 64, 1, 8, CHUNKS[1], seed=32, q_amp=20.0, partition_tokens=32, softcap=5.0)
    batch = make_batch([10], 16)
    kb = rt.upload(np.zeros(16 * 64, np.float32), "k")
    for bad in (-1.0, float("inf"), float("nan")):
        with pytest.raises(InvalidInput, match="soft-cap"):
            pf.plan_records(ctx.prefill, pf.F32, kb, kb, 1, np.zeros((2, 2, 64), np.float32), batch, [2], 0.1,
                            softcap=bad)


SOFTCAP_METHODS = [("f32", {}, 64, None), ("int8_seed", {}, 64, None), ("q4_0", {}, 64, harness.ggml_kv),
                   ("turboquant", {}, 64, None), ("kivi", {"bits": 2, "recent": 16}, 64, None),
                   ("nvfp4", {}, 64, harness.nvfp4_kv), ("vllm_fp8_e4m3", {"calib_tokens": 64}, 64, None)]


@pytest.mark.parametrize("method,opts,D,make_kv", SOFTCAP_METHODS, ids=[m for m, *_ in SOFTCAP_METHODS])
def test_live_soft_capped(ctx, method, opts, D, make_kv):
    """A soft-capped model's live cache (the cap 5 of the random Gemma 2; keys over six decades, so most logits sit
    far past it): each chunk through the capped prefill, then three decode steps (append_attend) each through the
    prefill of one query, all held to the capped oracle and away from the uncapped one (the decode kernels, which have
    no cap, did not answer). The cache kinds: the f32 and seed int8 paged caches, a per-token record cache (q4_0), the
    re-quantising cache (TurboQuant, NVFP4), KIVI's and the vLLM FP8 cache."""
    m = method if method == "f32" else harness.get_method(method, **opts)
    cache, outs = live_case(ctx, m, CHUNKED, D=D, kvh=2, G=4, make_kv=make_kv, softcap=5.0, decode=3)
    assert cache.softcap == 5.0 and cache.last_weights(0) is None  # the weights kernel has no cap
    assert max(float(np.abs(out - plain).max()) / tol for _, out, tol, plain in outs) > 10


def test_soft_capped_shape_without_prefill_is_refused(ctx):
    """Head 66 (the prefill takes multiples of 4): a soft-capped cache refuses a chunk and a decode step with one line
    naming the cap and the prefill, where an uncapped one would run its decode."""
    D, H, kvh = 66, 2, 1
    cache = make_live_cache("f32", ctx, _table(8), 1, H, kvh, D, D ** -0.5, softcap=5.0)
    rng = np.random.default_rng(1)
    k, v = (rng.standard_normal((kvh, 4, D)).astype(np.float32) for _ in range(2))
    cache.extend(0, k, v, 0)
    with pytest.raises(UnsupportedShape, match="soft-caps its attention logits .at 5.*causal prefill"):
        cache.attend_causal(0, rng.standard_normal((4, H, D)).astype(np.float32), 0)
    with pytest.raises(UnsupportedShape, match="soft-caps its attention logits .at 5.*multiple of 4"):
        cache.append_attend(0, rng.standard_normal((H, D)).astype(np.float32), k[:, 0], v[:, 0], 4)
    with pytest.raises(InvalidInput, match="soft-cap"):
        make_live_cache("f32", ctx, _table(8), 1, H, kvh, D, D ** -0.5, softcap=-5.0)


def test_live_soft_capped_transformed(ctx):
    """A method transformed on the host (q8_0 with the Hadamard rotation: scores unchanged, the output rotated back)
    passes the cap to its inner cache: a chunk and two decode steps land near the capped attention over the exact K/V
    (within q8_0's rounding) and far from the uncapped one."""
    m = harness.get_method("q8_0", rotation="hadamard")
    D, kvh, H, L = 64, 2, 4, 40
    rng = np.random.default_rng(8)
    k, v = harness.ggml_kv(rng, L + 2, kvh, D)
    table = _table(L + 2)
    cache = make_live_cache(m, ctx, table, 1, H, kvh, D, D ** -0.5, softcap=5.0)
    assert cache.softcap == 5.0 and cache.inner.softcap == 5.0 and cache.last_weights(0) is None
    cache.extend(0, k[:L].transpose(1, 0, 2), v[:L].transpose(1, 0, 2), 0)
    outs = [(L, L, cache.attend_causal(0, q := rng.standard_normal((L, H, D)).astype(np.float32), 0), q)]
    for p in (L, L + 1):
        q = rng.standard_normal((H, D)).astype(np.float32)
        outs.append((p + 1, 1, cache.append_attend(0, q, k[p], v[p], p)[None], q[None]))
    for n, T, out, q in outs:
        b = table.batch(n)
        fk, fv = pfo.method_caches(None, b, k[:n], v[:n])
        capped = po.causal(q, fk, fv, b.block_tables, b.context_lens, [T], 16, D ** -0.5, softcap=5.0)
        plain = po.causal(q, fk, fv, b.block_tables, b.context_lens, [T], 16, D ** -0.5)
        near, far = np.abs(out - capped).max(), np.abs(out - plain).max()
        assert near < 0.02 * np.abs(fv).max() and far > 10 * near, (n, near, far)
