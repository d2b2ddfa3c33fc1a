"""Live decode appends: a per-token-record method's live cache writes only the new
token through the method's writer and attends with the fast decode; the whole-sequence re-quantising
cache (`incremental=False`) is the cross-check: same records, same outputs within f32 tolerance."""
from __future__ import annotations

import numpy as np
import pytest

from kvviz.families.registry import get_method
from kvviz.methods.live_cache import BlockTable, RequantCache, make_live_cache
from kvviz.methods.live_records import RecordLiveCache

pytestmark = pytest.mark.gpu

L, H, KVH, D, BS = 2, 8, 2, 64, 8


def _kv(rng, T):
    return [(rng.standard_normal((KVH, T, D)).astype(np.float32), rng.standard_normal((KVH, T, D)).astype(np.float32))
            for _ in range(L)]


@pytest.mark.parametrize("mid,opts", [("int8_token", {}), ("fp8_e4m3", {}), ("int4_group", {}), ("f16", {}), ("q4_0", {}),
                                      ("q8_0", {})])
def test_appends_match_requantising(ctx, mid, opts):
    rng = np.random.default_rng(5)
    m = get_method(mid, **opts)
    a = make_live_cache(m, ctx, BlockTable(12, BS, "scattered", seed=1), L, H, KVH, D, 0.125)
    b = make_live_cache(m, ctx, BlockTable(12, BS, "scattered", seed=1), L, H, KVH, D, 0.125, incremental=False)
    assert isinstance(a, RecordLiveCache) and isinstance(b, RequantCache)
    assert "fast split-K decode" in a.label  # the ggml types through their own fast decode (method._fast_plan)
    prompt = _kv(rng, 13)
    for c in (a, b):
        for li, (k, v) in enumerate(prompt):
            c.extend(li, k, v, 0)
    for pos in range(13, 20):  # 7 decode steps, each crossing into new blocks now and then
        step = _kv(rng, 1)
        q = rng.standard_normal((H, D)).astype(np.float32)
        for li, (k, v) in enumerate(step):
            oa = a.append_attend(li, q, k[:, 0], v[:, 0], pos)
            ob = b.append_attend(li, q, k[:, 0], v[:, 0], pos)
            assert np.abs(oa - ob).max() <= 2e-5 * 4, (mid, pos, li)
    # the same records in both caches (the writer is the same; only how often it runs differs)
    ra = a.inspect_block(1, a.table.blocks[1], 1, "K")
    rb = b.inspect_block(1, b.table.blocks[1], 1, "K")
    assert all(np.array_equal(x.words, y.words) for x, y in zip(ra, rb))
    ts = a.token_scales(0, 0)
    assert ts is None or ts.k.shape == (20,)


def test_append_writer_work_is_one_token(ctx):
    """The writer dispatched by a step covers the new token only, however long the sequence is."""
    m = get_method("int8_token")
    c = make_live_cache(m, ctx, BlockTable(64, 16), 1, 4, 1, 64, 0.125)
    rng = np.random.default_rng(1)
    k = rng.standard_normal((1, 500, 64)).astype(np.float32)
    c.extend(0, k, k, 0)
    grids = []
    for T in (1, 300):
        d = c._writer(0, k[:, :1], k[:, :1], T)
        grids.append([x.grid for x in d])
    assert grids[0] == grids[1]


def test_batch_scaled_methods_keep_requantising(ctx):
    """A per-tensor scale depends on every token: no appending cache for it."""
    m = get_method("fp8_e4m3", scale_mode="per_tensor")
    assert m.batch_scales and not m.has_live_cache
    assert isinstance(make_live_cache(m, ctx, BlockTable(4, 8), 1, 4, 1, 64, 0.125), RequantCache)


@pytest.mark.parametrize("mid,opts", [("nvfp4", {}), ("turboquant", {}), ("fp8_e4m3", {"scale_mode": "per_tensor"})])
def test_requantising_prefill_from_the_device_only_cache(ctx, mid, opts, monkeypatch):
    """The re-quantising cache's prefill reads the method's device-only cache (quantize_device: no read-back), from
    host K/V and from K/V already on the device (extend_on_device, the first piece of a sequence): the same outputs,
    to the bit, as through quantize's full cache; a later piece, the panels' weights and a decode after it read the
    device rows back first, and give what the host path gives."""
    from kvviz.gpu.runtime import DeviceRows

    m = get_method(mid, **opts)
    rng = np.random.default_rng(5)
    T, T2 = 21, 6
    kv = _kv(rng, T + T2)
    q = rng.standard_normal((T, H, D)).astype(np.float32)
    q2 = rng.standard_normal((T2, H, D)).astype(np.float32)

    def run(how):
        c = make_live_cache(m, ctx, BlockTable(8, BS), L, H, KVH, D, 0.125)
        assert isinstance(c, RequantCache)
        outs = []
        for li, (k, v) in enumerate(kv):
            if how == "device":
                rows = [DeviceRows(ctx.rt.upload(np.ascontiguousarray(a[:, :T].transpose(1, 0, 2)), "rows"),
                                   (T, KVH, D)) for a in (k, v)]
                assert c.takes_device_rows() == m.device_rows_writer
                if not c.extend_on_device(li, *rows, 0):
                    return None
            else:
                c.extend(li, k[:, :T], v[:, :T], 0)
            outs.append(c.attend_causal(li, q, 0))
        for li, (k, v) in enumerate(kv):
            assert not c.extend_on_device(li, None, None, T)  # only the first piece of a sequence
            c.extend(li, k[:, T:], v[:, T:], T)
            outs.append(c.attend_causal(li, q2, T))
        outs.append(c.weights(0, q2[-1], T + T2))
        return outs

    device, host = run("device"), run("host")
    monkeypatch.setattr(type(m), "quantize_device", lambda self, *a: None)
    full = run("host")
    assert run("device") is None  # no device-only cache: the rows go back to the host path
    if m.device_rows_writer:
        assert device is not None
    for outs in ([device] if device is not None else []) + [host]:
        for a, b in zip(outs, full):
            np.testing.assert_array_equal(a, b)
