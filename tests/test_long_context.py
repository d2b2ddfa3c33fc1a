"""Long contexts, on every attention kernel: right at every length the product accepts, refused with
the adapter's limit where a seed kernel (kept as given) cannot be right.

Why this file exists: Mesa's llvmpipe (lavapipe, CI's driver) stops every shader invocation's loops
after 65535 iterations in total and returns a wrong result without an error. The unsplit f32 decode
returned 13911.5 instead of 19999.5 at head 64 x 40000 tokens. The kernels written for kvviz are now
split over the context (kvviz/gpu/loop_budget.py); the seed kernels are refused past the longest
context whose loop count fits the limit measured at start-up (`GpuRuntime.loop_limit`).

Test data: zero keys give uniform weights, and V = position makes the decode's exact answer the mean
position, (n - 1) / 2. Tolerance: the f32 kernels' conformance tolerance, 2e-5 * max|V|.
"""
from __future__ import annotations

import numpy as np
import pytest

from kvviz.errors import DeviceLimitError
from kvviz.gpu import loop_budget
from kvviz.attention.paged import PagedKernels
from kvviz.attention import paged_oracle as O
from kvviz.paging import make_batch


def _software(rt) -> bool:
    return rt.loop_limit is not None


def _positions(pk, fmt, head_size, n, block_size=16):
    batch = make_batch([n], block_size)
    k = np.zeros((n, 1, head_size), np.float32)
    v = np.broadcast_to(np.arange(n, dtype=np.float32)[:, None, None], (n, 1, head_size)).copy()
    cache = pk.allocate(fmt, batch.num_blocks, 1, block_size, head_size)
    pk.write(cache, k, v, batch.slot_mapping)
    return cache, batch, np.ones((1, 2, head_size), np.float32)


def test_start_up_self_check_finds_the_software_loop_limit(rt):
    probed = rt._probe_loop_limit()  # the probe itself: rt.loop_limit may be an earlier run's answer
    assert rt.loop_limit == probed
    if "llvmpipe" in rt.summary.name.lower():
        assert probed == 65535
    else:  # a hardware adapter ran the probe's 2^20 iterations
        assert probed is None or probed > 65535


# 64 x 40000: the length the unsplit decode got wrong; 256 x 131072: the longest, past 2^16 tokens, its K and V 128 MiB
# each. Head 128 at 40000 tokens is the ragged batch's below; 128 x 45000, where the seed decode fails, the seed
# decode's with and without its check.
@pytest.mark.parametrize("head_size,n", [(64, 40000), (256, 131072)])
def test_f32_decode_and_weights_are_right_at_long_contexts(rt, head_size, n):
    pk = PagedKernels(rt)
    cache, batch, q = _positions(pk, "f32", head_size, n)
    out = pk.decode(cache, q, batch, 0.1)
    assert np.abs(out - (n - 1) / 2).max() <= 2e-5 * n, f"mean position {out.mean()} != {(n - 1) / 2}"
    w = pk.weights(cache, q, batch, 0.1)
    np.testing.assert_allclose(w, 1.0 / n, rtol=1e-5)


def test_split_decode_matches_the_oracle_on_ragged_random_long_batch(rt):
    """Non-uniform weights, so the partitions' maxima differ and the combine is exercised; a
    1-token, a partition-boundary (512, 513) and a 40000-token sequence, scattered blocks."""
    pk = PagedKernels(rt)
    lens = [1, 512, 513, 40000]
    batch = make_batch(lens, 16, policy="scattered", seed=3)
    rng = np.random.default_rng(7)
    H, KVH, D = 4, 2, 128
    k = (rng.standard_normal((batch.num_tokens, KVH, D)) * 2).astype(np.float32)
    v = rng.standard_normal((batch.num_tokens, KVH, D)).astype(np.float32)
    q = rng.standard_normal((len(lens), H, D)).astype(np.float32)
    for fmt in ("f32", "q8") if not _software(rt) else ("f32",):
        cache = pk.allocate(fmt, batch.num_blocks, KVH, 16, D)
        pk.write(cache, k, v, batch.slot_mapping)
        kc = pk.read(cache, "k")
        vc = pk.read(cache, "v")
        kf = O.dequantize_cache_int8(kc) if fmt == "q8" else kc.astype(np.float64)
        vf = O.dequantize_cache_int8(vc) if fmt == "q8" else vc.astype(np.float64)
        scale = 1 / np.sqrt(D)
        ref = O.decode(q, kf, vf, batch.block_tables, batch.context_lens, 16, scale)
        out = pk.decode(cache, q, batch, scale)
        assert np.abs(out - ref).max() <= 2e-5 * max(1.0, np.abs(vf).max()), fmt
        wref = O.decode_weights(q, kf, batch.block_tables, batch.context_lens, 16, scale)
        w = pk.weights(cache, q, batch, scale)
        assert np.abs(w - wref).max() <= 1e-6, fmt
        np.testing.assert_allclose(w.sum(-1), 1.0, atol=1e-5)


# The seed decode's loop count (loop_budget.seed_int8_decode) takes one 128-wide column of a head up to 128 and two
# at 256: one head size of each. Head 128 and its failing length are the next test's.
@pytest.mark.parametrize("head_size", [64, 256])
def test_seed_int8_decode_right_up_to_its_limit_and_refused_past_it(rt, head_size):
    pk = PagedKernels(rt)
    if not _software(rt):  # no loop bound: the seed is right at the failing lengths
        cache, batch, q = _positions(pk, "q8", head_size, 45000)
        assert np.abs(pk.decode(cache, q, batch, 0.1) - 22499.5).max() <= 2e-5 * 45000
        return
    longest = loop_budget.longest_context(lambda n: loop_budget.seed_int8_decode(n, head_size), rt.loop_limit)
    cache, batch, q = _positions(pk, "q8", head_size, longest)
    out = pk.decode(cache, q, batch, 0.1)
    assert np.abs(out - (longest - 1) / 2).max() <= 2e-5 * longest
    cache, batch, q = _positions(pk, "q8", head_size, longest + 1)
    with pytest.raises(DeviceLimitError) as err:
        pk.decode(cache, q, batch, 0.1)
    msg = str(err.value)
    assert f"after {rt.loop_limit} iterations" in msg and f"its longest context here is {longest} tokens" in msg


def test_the_loop_limit_is_real_and_the_check_is_what_prevents_a_wrong_number(rt, monkeypatch):
    """Without the check, the seed decode at head 128 x 45000 is silently wrong on lavapipe."""
    if not _software(rt):
        pytest.skip("hardware adapter: no loop limit to demonstrate (the previous test checks 45000 is right)")
    pk = PagedKernels(rt)
    cache, batch, q = _positions(pk, "q8", 128, 45000)
    monkeypatch.setattr(rt, "loop_limit", None)
    out = pk.decode(cache, q, batch, 0.1)
    assert np.abs(out - 22499.5).max() > 10.0


def test_turboquant_seed_refused_past_its_limit_and_scores_right_at_long_context(rt):
    from kvviz.families.turboquant.kernels import TurboQuantKernels
    from kvviz.families.turboquant import oracle as tqo
    tq = TurboQuantKernels(rt)
    d, n = 128, 40000
    rng = np.random.default_rng(5)
    K = rng.standard_normal((n, 1, d)).astype(np.float32)
    V = rng.standard_normal((n, 1, d)).astype(np.float32)
    cache = tq.allocate(1, d, n)
    tq.compress(cache, K, V)
    q = rng.standard_normal((1, 2, d)).astype(np.float32)
    kw, vw = tq.read(cache)
    ref, wref = tqo.attention_oracle(q, kw, vw, 1, n, n - 1, n, 0.1, cache.params, return_weights=True)
    w = tq.scores(cache, q, n - 1, 0.1)
    assert np.abs(w - wref).max() <= 1e-5 + 1e-4 * np.abs(wref).max()
    np.testing.assert_allclose(w.sum(-1), 1.0, atol=1e-4)
    if _software(rt):
        longest = loop_budget.longest_context(lambda m: loop_budget.tq_seed_flash(m, d), rt.loop_limit)
        assert longest < n
        with pytest.raises(DeviceLimitError, match=f"after {rt.loop_limit} iterations"):
            tq.decode(cache, q[0], n - 1, 0.1)
        out = tq.attention(cache, q, longest - 1, 0.1, max_seq=longest)
        ref = tqo.attention_oracle(q, kw, vw, 1, n, longest - 1, longest, 0.1, cache.params)
    else:
        out = tq.decode(cache, q[0], n - 1, 0.1)[None]
    assert np.abs(out - ref).max() <= 1e-5 + 1e-4 * np.abs(ref).max()
