"""Conformance of the fast split-K TurboQuant decode (kvviz/families/turboquant/decode.py) on the local adapter.

The caches are written by the seed compressor (tq_compress.wgsl, itself held bit for bit to the oracle in
tests/test_turboquant.py) and read back; the oracle is the seed kernel's: kvviz.families.turboquant.oracle.
attention_oracle, float64 over the SAME packed words (rotation of q in f32 as on the GPU, the estimator,
a plain softmax, the inverse RHT of the rotated-space accumulator).

Tolerance: |fast - oracle| <= 2e-5 * max(1, max |V^|), V^ = the dequantised values n_v * RHT^-1(c[vidx])
of the sequence's tokens: the f32 fast decodes' bound (f32 accumulation in another order, exp2, f32
centroids and scales; measured ~1e-7 to 5e-7 here). It is tighter than the seed kernel's
(1e-5 + 1e-4 * |oracle|) at unit scale, and each case checks that it would catch the other QJL scale.
Shapes: head 64 and 128 (and 32), GQA 1/4/8, ragged lengths with empty and single-token sequences,
one partition and many, large values and logits, a 49152-token context, and the no-subgroup fallback.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from kvviz.errors import InvalidInput, UnsupportedShape
from kvviz.families.turboquant import decode as fq
from kvviz.families.turboquant import oracle as tqo
pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def tq(rt):
    from kvviz.families.turboquant.kernels import TurboQuantKernels

    return TurboQuantKernels(rt)


@pytest.fixture(scope="module")
def fast(rt):
    return fq.TQFastDecode(rt)


def _caches(tq, rng, lens, kvh, d, k_amp=1.0, v_amp=1.0, spread=False):
    caches = []
    for L in lens:
        c = tq.allocate(kvh, d, max(L, 1), layer=1)
        if L:
            K = rng.standard_normal((L, kvh, d)) * k_amp
            V = rng.standard_normal((L, kvh, d)) * v_amp
            if spread:  # norms over 4 decades
                K *= 10.0 ** rng.uniform(-2, 2, (L, kvh, 1))
                V *= 10.0 ** rng.uniform(-2, 2, (L, kvh, 1))
            tq.compress(c, K.astype(np.float32), V.astype(np.float32))
        caches.append(c)
    return caches


def _max_v(tq, cache, L, d):
    kw, vw = tq.read(cache)
    dec = tqo.decode_cache(kw, vw, cache.n_kv_heads, cache.cache_cap, d)
    c = cache.params.centroids.astype(np.float64)
    sp, _ = cache.params.signs
    v = tqo.rht_inverse(c[dec.v_idx[:, :L]], sp) * dec.v_norm[:, :L, None].astype(np.float64)
    return float(np.abs(v).max(initial=0.0))


def check(tq, fast, lens, kvh, G, d, *, seed=0, qjl="reference", q_amp=1.0, scale=None, **kw):
    rng = np.random.default_rng(seed)
    amps = {k: kw.pop(k) for k in ("k_amp", "v_amp", "spread") if k in kw}
    caches = _caches(tq, rng, lens, kvh, d, **amps)
    H = kvh * G
    q = (rng.standard_normal((len(lens), H, d)) * q_amp).astype(np.float32)
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    plan = fast.plan(caches, q, lens, scale, qjl, **kw)
    tq.rt.run(plan.rotate + plan.dispatches)
    out = fast.read(plan)
    assert np.isfinite(out).all()
    other = "unbiased" if qjl == "reference" else "reference"
    worst, caught = 0.0, False
    for s, L in enumerate(lens):
        if L == 0:
            assert not out[s].any(), "an empty sequence must give 0"
            continue
        kw_, vw_ = tq.read(caches[s])
        ref = tqo.attention_oracle(q[s:s + 1], kw_, vw_, kvh, caches[s].cache_cap, L - 1, L, scale, caches[s].params, qjl)[0]
        tol = fq.tolerance(_max_v(tq, caches[s], L, d))
        err = float(np.abs(out[s] - ref).max())
        assert err <= tol, f"D{d} G{G} kvh{kvh} seq {s} (L={L}) {qjl}: max error {err:.3g} > {tol:.3g} ({plan.describe()})"
        worst = max(worst, err / tol)
        if L > 1:
            alt = tqo.attention_oracle(q[s:s + 1], kw_, vw_, kvh, caches[s].cache_cap, L - 1, L, scale, caches[s].params, other)[0]
            caught |= float(np.abs(alt - ref).max()) > 10 * tol
    print(f"\n[fast tq] D{d} G{G} kvh{kvh} lens {lens[:5]}{'...' if len(lens) > 5 else ''} {qjl}: "
          f"worst error {worst:.2e} of the tolerance; {plan.describe()}")
    return plan, caught


@pytest.mark.parametrize("d,G,kvh", [(128, 4, 2), (128, 1, 2), (64, 8, 1), (64, 1, 3), (32, 4, 1)])
def test_ragged_heads_and_gqa(tq, fast, d, G, kvh):
    plan, caught = check(tq, fast, [37, 0, 1, 300, 16], kvh, G, d, seed=d + G)
    assert caught, "the tolerance must be tight enough to see the other QJL scale"


def test_loop_budget_counts_the_reduce_butterflies(tq, fast, monkeypatch):
    """The reduce's loops over 22 partitions (8 at a time) and its inverse rotation's butterfly loop are both charged
    against a software rasteriser's loop budget: one short of their sum is refused with DeviceLimitError, the sum
    itself runs (and matches the oracle)."""
    from kvviz.errors import DeviceLimitError
    from kvviz.attention import split_decode as fd
    need = fd.chunked_reduce_loops(700 // 32 + 1) + fq.reduce_butterfly_loops(128)
    assert need == 2 * (3 + 2) + (7 + 2)
    monkeypatch.setattr(tq.rt, "loop_limit", need - 1)
    with pytest.raises(DeviceLimitError):
        check(tq, fast, [700, 1], 2, 4, 128, seed=5, partition_tokens=32)
    monkeypatch.setattr(tq.rt, "loop_limit", need)
    check(tq, fast, [700, 1], 2, 4, 128, seed=5, partition_tokens=32)


@pytest.mark.parametrize("qjl", ["reference", "unbiased"])
def test_partitions_single_and_many(tq, fast, qjl):
    lens = [700, 1, 0, 333]
    plan, caught = check(tq, fast, lens, 2, 4, 128, seed=3, qjl=qjl, partition_tokens=32)
    assert plan.num_partitions == 700 // 32 + 1 and caught
    plan, _ = check(tq, fast, lens, 2, 4, 128, seed=3, qjl=qjl, partition_tokens=4096)
    assert plan.num_partitions == 1


def test_large_values_and_logits(tq, fast):
    # norms up to ~5e4 (the f16 range), logits in the hundreds: the online max and the merges must hold
    check(tq, fast, [200, 1, 57], 2, 4, 128, seed=11, k_amp=30.0, v_amp=3500.0, q_amp=8.0, partition_tokens=64)


def test_spread_norms(tq, fast):
    # key and value norms over 4 decades (1e-2 .. 1e2 x the unit scale)
    check(tq, fast, [150, 3, 0, 64], 2, 4, 64, seed=12, spread=True, partition_tokens=32)


def test_long_context_one_sequence(tq, fast):
    n = 49152  # ~48k tokens, one sequence, one KV head: the default split (many partitions)
    plan, caught = check(tq, fast, [n], 1, 2, 128, seed=5, q_amp=4.0)  # a peaked softmax over the whole context
    assert plan.num_partitions > 8 and caught


def test_no_subgroups_fallback(tq, fast):
    lay = fast.layout(64, 1, subgroups=False, unroll=1)
    assert lay.lanes == 1
    check(tq, fast, [90, 0, 1], 2, 1, 64, seed=8, subgroups=False, unroll=1, partition_tokens=32)


def test_bad_input_is_refused(tq, fast):
    rng = np.random.default_rng(1)
    caches = _caches(tq, rng, [10, 5], 2, 64)
    q = rng.standard_normal((2, 4, 64)).astype(np.float32)
    with pytest.raises(InvalidInput):
        fast.plan(caches, q, [10, 6], 0.1)  # position 5 of sequence 1 never written
    with pytest.raises(InvalidInput):
        fast.plan(caches, q, [0, 0], 0.1)
    with pytest.raises(InvalidInput):
        fast.plan(caches[:1], q, [10, 5], 0.1)
    with pytest.raises(InvalidInput):
        fast.plan(caches, q, [10, 5], float("nan"))
    with pytest.raises(UnsupportedShape):
        fast.plan(caches, rng.standard_normal((2, 3, 64)).astype(np.float32), [10, 5], 0.1)  # GQA 3/2
    other = _caches(tq, rng, [10], 1, 64)
    with pytest.raises(InvalidInput):
        fast.plan([caches[0], other[0]], q, [10, 10], 0.1)  # another KV head count


def test_method_attend_and_timed_rows(rt):
    from kvviz.methods import get_method
    from kvviz.methods.context import GpuContext
    from kvviz.paging import make_batch

    m = get_method("turboquant", qjl_scale="unbiased")
    rng = np.random.default_rng(4)
    d, kvh, H = 64, 2, 8
    batch = make_batch([29, 0, 1, 70], 16, policy="scattered", seed=2)
    key = rng.standard_normal((batch.num_tokens, kvh, d)).astype(np.float32)
    value = rng.standard_normal((batch.num_tokens, kvh, d)).astype(np.float32)
    ctx = GpuContext(rt)
    qkv = m.quantize(ctx, batch, key, value)
    q = rng.standard_normal((batch.num_seqs, H, d)).astype(np.float32)
    scale = 1.0 / math.sqrt(d)
    out = m.attend(ctx, qkv, batch, q, scale)
    for s in range(batch.num_seqs):
        L = int(batch.context_lens[s])
        if not L:
            assert not out[s].any()
            continue
        kw, vw = qkv.extra["words"][s]
        cache = qkv.device["caches"][s]
        ref = tqo.attention_oracle(q[s:s + 1], kw, vw, kvh, cache.cache_cap, L - 1, L, scale, cache.params, "unbiased")[0]
        assert np.abs(out[s] - ref).max() <= fq.tolerance(_max_v(qkv.device["kernels"], cache, L, d))
    timed = m.timed_kernels(ctx, batch, key, value, q, scale, qkv)
    rows = {(t.role, t.impl): t for t in timed}
    assert rows[("decode", "seed")].name == "flash_attention_tq (decode)"
    fast_row = rows[("decode", "fast")]
    assert fast_row.name.startswith("fast_decode_tq") and fast_row.dispatches and fast_row.bytes > 0
    # the timed dispatches recompute the same output (the rotated query was filled before)
    rt.run(fast_row.dispatches)
    plan = m.fast_plan(ctx, qkv, batch, q, scale)
    rt.run(plan.rotate + plan.dispatches)
    np.testing.assert_array_equal(rt.read(plan.out, np.float32, plan.shape), out)


def test_batch_equals_one_sequence_at_a_time_and_splits_write_own_buffers(tq, fast):
    """The batch plan (per-sequence partials, overlapping splits) gives bit for bit what each sequence
    decoded alone gives (same partition length), on a ragged batch with an empty sequence; and no two split
    dispatches of the plan write the same buffer (wgpu would order them with a barrier)."""
    rng = np.random.default_rng(7)
    lens, kvh, G, d = [300, 0, 1, 777, 64], 2, 4, 64
    caches = _caches(tq, rng, lens, kvh, d)
    H = kvh * G
    q = rng.standard_normal((len(lens), H, d)).astype(np.float32)
    scale = 1.0 / math.sqrt(d)
    plan = fast.plan(caches, q, lens, scale, partition_tokens=128)
    splits = [x for x in plan.dispatches if x.kernel is plan.dispatches[0].kernel]  # the split kernel's dispatches
    assert len(splits) == sum(1 for n in lens if n)
    written = [id(x.buffers[-1]) for x in splits]  # the split's only read_write binding: its partials
    assert len(set(written)) == len(written), "two split dispatches write the same partials buffer"
    tq.rt.run(plan.rotate + plan.dispatches)
    out = fast.read(plan)
    assert not out[1].any()
    for s, L in enumerate(lens):
        if L == 0:
            continue
        one = fast.plan([caches[s]], q[s:s + 1], [L], scale, partition_tokens=plan.partition_tokens)
        tq.rt.run(one.rotate + one.dispatches)
        assert np.array_equal(fast.read(one)[0], out[s]), f"sequence {s} differs from its one-sequence decode"


def test_scatter_and_all_lane_softmax(tq, fast):
    """The per-sequence decode with the reduce-scatter softmax (the default) and the all-lane one."""
    for scatter in (True, False):
        check(tq, fast, [37, 0, 300], 1, 3, 64, seed=4, q_amp=3.0, scatter=scatter)
