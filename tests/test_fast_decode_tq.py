"""The per-sequence fast TurboQuant decode (kvviz/families/turboquant/decode.py): its reduce's loop budget, the method's
attend and timed rows, and a batch against one sequence at a time. The caches are the seed compressor's
(tq_compress.wgsl, held bit for bit to the oracle in tests/test_turboquant.py); the oracle is the seed kernel's,
kvviz.families.turboquant.oracle.attention_oracle (tests/harness.py tq_check, tolerance 2e-5 * max(1, max |V^|), tight
enough to see the other QJL scale). The scenarios every fast decode shares (heads 32..128, GQA 1 / 4 / 8, ragged;
one partition and many; large values and spread norms; a 49152-token context; the softmax variants; no subgroups;
bad input) are in tests/test_conformance.py.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from kvviz.families.turboquant import decode as fq
from kvviz.families.turboquant import oracle as tqo
import harness

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def tq(rt):
    return harness.tq_kernels(rt)


@pytest.fixture(scope="module")
def fast(rt):
    return harness.decoder(rt, "fast_decode_tq", "TQFastDecode")


def test_loop_budget_counts_the_reduce_butterflies(ctx, tq, monkeypatch):
    """The reduce's loops over 22 partitions (8 at a time) and its inverse rotation's butterfly loop are both charged
    against a software rasteriser's loop budget: one short of their sum is refused with DeviceLimitError, the sum
    itself runs (and matches the oracle)."""
    from kvviz.errors import DeviceLimitError
    from kvviz.attention import split_decode as fd
    need = fd.chunked_reduce_loops(700 // 32 + 1) + fq.reduce_butterfly_loops(128)
    assert need == 2 * (3 + 2) + (7 + 2)
    monkeypatch.setattr(tq.rt, "loop_limit", need - 1)
    with pytest.raises(DeviceLimitError):
        harness.tq_check(ctx, lens=[700, 1], kvh=2, G=4, D=128, seed=5, partition_tokens=32)
    monkeypatch.setattr(tq.rt, "loop_limit", need)
    harness.tq_check(ctx, lens=[700, 1], kvh=2, G=4, D=128, seed=5, partition_tokens=32)


def test_method_attend_and_timed_rows(rt):
    from kvviz.families.registry import get_method
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
        assert np.abs(out[s] - ref).max() <= fq.tolerance(harness.tq_max_v(qkv.device["kernels"], cache, L, d))
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
    caches = harness.tq_caches(tq, rng, lens, kvh, d)
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

