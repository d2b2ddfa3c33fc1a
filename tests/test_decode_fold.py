"""The reduce folded into the split kernels (kvviz/attention/split_decode.py FOLD, shaders/attention/split_fold.wgsl):
for the fast decode's cache formats, the ggml block types and NVFP4, the folded decode against the family's oracle
(within the family's tolerance, tests/harness.py) and against the separate reduce's bits, over ragged lengths with
an empty and a single-token sequence and several partitions (some empty); its counters reset for the next run; one
partition; a long context's loop budget; a plan that asks for both refused. The fold is in the unrolled kernels only
(a plan with it never takes the looped kernel of software rasterisers)."""
from __future__ import annotations

import numpy as np
import pytest

import harness
from harness import DECODES
from kvviz.attention import split_decode as fd
from kvviz.errors import DeviceLimitError, InvalidInput
from kvviz.paging import make_batch

pytestmark = pytest.mark.gpu

LENS = [37, 100, 0, 300, 1, 129]
# one of each kind of split kernel: the fast decode's f16 and int4 groups, a ggml type with a min, NVFP4
FAMILIES = ["f16-none-0", "int4-none-32", "q4_1", "nvfp4"]


@pytest.mark.parametrize("family", FAMILIES)
def test_folded_reduce_matches_the_oracle_and_the_separate_reduce(ctx, family):
    args = dict(D=64, bs=16, kvh=2, G=2, lens=LENS, seed=3, partition_tokens=64)
    sep = DECODES[family].check(ctx, **args, fold=False, looped=False)  # the same (unrolled) split kernel
    fold = DECODES[family].check(ctx, **args, fold=True)
    assert len(sep.plan.dispatches) == 2 and len(fold.plan.dispatches) == 1
    assert fold.plan.num_partitions == 5 and fold.plan.describe().endswith("reduce folded in")
    # the same partials combined by the same arithmetic in the same order as the separate reduce's
    np.testing.assert_array_equal(fold.out, sep.out)
    # the last workgroup put every counter back to 0: a second and third run give the same bits
    ctx.rt.run(fold.plan.dispatches)
    ctx.rt.run(fold.plan.dispatches)
    counters, out = fold.plan.dispatches[0].buffers[-2:]
    assert out is fold.plan.out  # the last buffer is the output, as the separate reduce's is
    assert not ctx.rt.read(counters, np.uint32, (len(LENS) * 2,)).any()
    np.testing.assert_array_equal(ctx.rt.read(fold.plan.out, np.float32, fold.out.shape), fold.out)


def test_one_partition_and_a_long_context(rt):
    """One partition: the only workgroup of its (sequence, KV head) is the last. A context of 20000 tokens over short
    partitions (many of them: the fold's loops over the partitions in every invocation)."""
    out, ref, batch, plan = harness.run_case(rt, fd.F16, [300, 1, 0], 4, 2, 64, 16, partition_tokens=4096, fold=True)
    assert plan.num_partitions == 1
    out, ref, batch, plan = harness.run_case(rt, fd.F16, [20000, 5, 0], 4, 2, 64, 16, partition_tokens=256, fold=True)
    assert plan.num_partitions == 79


def test_the_loop_budget_counts_the_fold(rt, monkeypatch):
    """The fold's loops are charged to the split kernel's invocations (kvviz/gpu/loop_budget.py): a limit that the
    split loop alone fits but not with the fold is refused with the fold, and taken with the separate reduce."""
    fast = fd.FastDecode(rt)
    lay = fast.layout(fd.F32, 64, 4)
    batch = make_batch([4000], 16)
    kv = rt.empty(batch.num_blocks * 2 * 16 * 64 * 4, "kv")
    pt = 64 * lay.tokens_per_step
    P = -(-4000 // pt)
    split = pt // lay.tokens_per_step + 2
    monkeypatch.setattr(rt, "loop_limit", split + fd.fold_loops(P, 4, 64, lay.workgroup) - 1)
    q = np.zeros((1, 8, 64), np.float32)
    with pytest.raises(DeviceLimitError, match="loop limit"):
        fast.plan(fd.F32, kv, kv, 2, q, batch, 0.1, partition_tokens=pt, fold=True)
    assert fast.plan(fd.F32, kv, kv, 2, q, batch, 0.1, partition_tokens=pt, fold=False, looped=False).num_partitions == P


def test_a_plan_takes_one_reduce(rt):
    kv = rt.empty(16 * 2 * 16 * 64 * 4, "kv")
    with pytest.raises(InvalidInput, match="not both"):
        fd.FastDecode(rt).plan(fd.F32, kv, kv, 2, np.zeros((1, 8, 64), np.float32), make_batch([10], 16), 0.1,
                               reduce=fd.REDUCE, fold=True)
    assert fd.plan_fold(None, fd.REDUCE) is False and fd.plan_fold(True) is True
    assert fd.fold_looped(True, None) is False and fd.fold_looped(False, None) is None
    with pytest.raises(InvalidInput, match="unrolled"):
        fd.fold_looped(True, True)
