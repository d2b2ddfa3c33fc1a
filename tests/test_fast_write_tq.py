"""Conformance of the fast TurboQuant writer (kvviz/families/turboquant/writer.py, shaders/turboquant/write_fast.wgsl) on the
local adapter: the seed configuration's paged records (K [polar d/16 | jl d/32 | norm], V [polar d/16 | norm] u32)
through the batch's slot mapping.

Held bit for bit to the numpy oracle (kvviz.families.turboquant.oracle.compress_general: the kernels' f32 order) on an
IEEE adapter (lavapipe), and on every adapter to the general compressor (tq_general_compress.wgsl, the writer it
replaces) and to the seed compressor's words (tq_compress.wgsl, re-laid out by kvviz.families.turboquant.format
seed_records). On hardware whose division / sqrt may round differently (Vulkan allows 2.5 ulp) the oracle
comparison is compare_cache's (a difference only where rounding may decide it), as for the other TurboQuant
writers. Shapes: heads 32/64/128, block sizes 1/16/32, ragged lengths with 0 and 1, padding slots, zero vectors,
norms near the f16 limits (huge, tiny, below the 1e-12 zero threshold), lanes 4/8/16, a 2-D grid, a long
batch; the method's quantize and bench rows; the fallback without subgroups (bad input: tests/test_conformance.py).
"""
from __future__ import annotations

import numpy as np
import pytest

from kvviz.families.turboquant import format as tqf
from kvviz.families.turboquant import writer as fwt
from kvviz.attention import records as qk
from kvviz.families.turboquant import kernels as tqk
from kvviz.families.turboquant import oracle as tqo
from kvviz.paging import PAD_SLOT, make_batch

pytestmark = pytest.mark.gpu

LAYER = 1


def _inputs(rng, T, kvh, d, zeros=0.0):
    K = rng.standard_normal((T, kvh, d)).astype(np.float32)
    V = rng.standard_normal((T, kvh, d)).astype(np.float32)
    if zeros:
        K[rng.random((T, kvh)) < zeros] = 0.0
        V[rng.random((T, kvh)) < zeros] = 0.0
    return K, V


def _extremes(K, V):
    """Norms near the f16 limits: huge (~3e4 < 65504), f16-subnormal (~1e-6), under f16 (~1e-9: the half rounds
    to 0, the codes stay), under the 1e-12 zero threshold (every word 0), one coordinate only (a spike)."""
    T = K.shape[0]
    for i, f in enumerate([2500.0, 1e-6, 1e-9, 1e-14]):
        r = (3 + 5 * i) % T
        K[r] *= np.float32(f)
        V[(r + 1) % T] *= np.float32(f)
    K[min(T - 1, 23)] = 0.0
    K[min(T - 1, 23), :, 5] = 7.0
    return K, V


def write(rt, batch, K, V, *, fast=True, lanes=None, layer=LAYER):
    """K / V records [num_blocks, kvh, bs, WK | WV] written by the fast writer (or the general compressor)."""
    T, kvh, d = K.shape
    st = tqf.TQSettings(d, layer=layer)
    ident = tqf.choose_channels(K, 0)
    gc = tqk.general_allocate(rt, st, batch, kvh, ident, ident)
    if fast:
        ds = fwt.dispatches(rt, st, K, V, batch.slot_mapping, gc.qc.k, gc.qc.v, batch.block_size, lanes=lanes)
        assert ds is not None, "this adapter has subgroups: the fast writer must run"
    else:
        ds = tqk.general_compress_dispatches(rt, gc, K, V, batch.slot_mapping)
    rt.run(ds)
    shp = (batch.num_blocks, kvh, batch.block_size, -1)
    return qk.read_cache(rt, gc.qc, "K").reshape(shp), qk.read_cache(rt, gc.qc, "V").reshape(shp), ds


def check_oracle(rt, batch, K, V, kc, vc):
    """The records of the real rows against the oracle: equal on an IEEE adapter, else compare_cache's bound.
    Padding rows' slots and unused slots stay 0."""
    d = K.shape[2]
    bs = batch.block_size
    st = tqf.TQSettings(d, layer=LAYER)
    real = batch.slot_mapping != PAD_SLOT
    sm = batch.slot_mapping[real].astype(np.int64)
    used = np.zeros(batch.num_blocks * bs, bool)
    used[sm] = True
    for got in (kc, vc):
        flat = got.transpose(0, 2, 1, 3).reshape(batch.num_blocks * bs, got.shape[1], -1)
        assert not flat[~used].any(), "a slot no real row maps to was written"
    if rt.summary.is_software:
        ident = tqf.choose_channels(K, 0)
        for which, x, got in (("K", K, kc), ("V", V, vc)):
            recs, _ = tqo.compress_general(x, ident, st, which)
            np.testing.assert_array_equal(got[sm // bs, :, sm % bs], recs[real], err_msg=f"{which} records vs the oracle")
    else:
        for s, L in enumerate(batch.context_lens):
            if L:
                pk, pv = tqo.paged_sequence_words(kc, vc, batch, s, d)
                rows = batch.token_rows(s)
                res = tqo.compare_cache(pk, pv, K[rows], V[rows], int(L), tqf.TQParams(d, layer=LAYER))
                assert res["unexplained"] == 0, res


@pytest.mark.parametrize("d", [32, 64, 128])
@pytest.mark.parametrize("bs,pad", [(1, 0), (16, 5), (32, 3)])
def test_records_equal_the_oracle_and_the_general_compressor(rt, d, bs, pad):
    rng = np.random.default_rng(d * 7 + bs)
    lens, kvh = [37, 0, 1, 70], 2
    batch = make_batch(lens, bs, policy="scattered", seed=d + bs, pad_every=pad)
    K, V = _extremes(*_inputs(rng, batch.num_tokens, kvh, d, zeros=0.1))
    kc, vc, _ = write(rt, batch, K, V)
    check_oracle(rt, batch, K, V, kc, vc)
    gk, gv, _ = write(rt, batch, K, V, fast=False)
    np.testing.assert_array_equal(kc, gk, err_msg="K words vs tq_general_compress")
    np.testing.assert_array_equal(vc, gv, err_msg="V words vs tq_general_compress")
    # the seed compressor's words, per sequence
    tq = tqk.TurboQuantKernels(rt)
    for s, L in enumerate(lens):
        if L:
            rows = batch.token_rows(s)
            cache = tq.allocate(kvh, d, L, layer=LAYER)
            tq.compress(cache, K[rows], V[rows])
            kw, vw = tq.read(cache)
            pk, pv = tqo.paged_sequence_words(kc, vc, batch, s, d)
            assert np.array_equal(pk, kw) and np.array_equal(pv, vw), f"sequence {s} vs tq_compress"


def test_extreme_norms_fields(rt):
    """What the extremes above store: a norm under 1e-12 gives all-zero words; ~1e-9 keeps its codes with an f16
    half of 0; a huge norm its f16; a zero vector 0 words."""
    d, kvh = 64, 1
    batch = make_batch([40], 16)
    rng = np.random.default_rng(9)
    K, V = _extremes(*_inputs(rng, 40, kvh, d))
    kc, vc, _ = write(rt, batch, K, V)
    rec = kc.reshape(-1, kvh, kc.shape[-1])[batch.slot_mapping.astype(np.int64), 0]
    st = tqf.TQSettings(d, layer=LAYER)
    f = tqf.unpack_general(rec[:, None], st, "K")
    n = np.sqrt((K[:, 0].astype(np.float64) ** 2).sum(-1))
    assert not rec[18].any() and n[18] < 1e-12  # 1e-14 row: under the zero threshold
    assert rec[13, :-1].any() and f.norm[0][13, 0] == 0.0 and 1e-12 < n[13] < 1e-6  # ~1e-9: codes, f16 norm 0
    assert f.norm[0][3, 0] == float(np.float16(n[3])) or abs(f.norm[0][3, 0] / n[3] - 1) < 1e-3
    assert n[3] > 1e4


@pytest.mark.parametrize("lanes", [4, 8, 16])
def test_lanes_give_the_same_words(rt, lanes):
    d, kvh = 128, 3
    batch = make_batch([50, 17], 16, policy="scattered", seed=1, pad_every=6)
    K, V = _inputs(np.random.default_rng(lanes), batch.num_tokens, kvh, d, zeros=0.05)
    kc, vc, ds = write(rt, batch, K, V, lanes=lanes)
    gk, gv, _ = write(rt, batch, K, V, fast=False)
    np.testing.assert_array_equal(kc, gk)
    np.testing.assert_array_equal(vc, gv)
    L = fwt.lanes_for(rt, d, lanes)
    assert L == min(lanes, fwt.subgroup_size(rt)) and len(ds) == 1


def test_two_dimensional_grid_and_a_long_batch(rt, monkeypatch):
    """A long ragged batch (6000 tokens x 2 heads) on a grid limit shrunk to 100 workgroups a dimension: one
    dispatch of gy > 1 rows of workgroups, the same words as the general compressor and the oracle."""
    d, kvh = 32, 2
    batch = make_batch([4000, 1, 1999], 16, policy="scattered", seed=4, pad_every=11)
    K, V = _inputs(np.random.default_rng(2), batch.num_tokens, kvh, d, zeros=0.01)
    gk, gv, _ = write(rt, batch, K, V, fast=False)
    monkeypatch.setattr(type(rt), "max_grid", property(lambda self: 100))
    kc, vc, ds = write(rt, batch, K, V)
    assert len(ds) == 1 and ds[0].grid[1] > 1 and ds[0].grid[0] <= 100
    np.testing.assert_array_equal(kc, gk)
    np.testing.assert_array_equal(vc, gv)
    check_oracle(rt, batch, K, V, kc, vc)


def test_method_uses_it_and_its_bench_row(rt):
    from kvviz.families.registry import get_method
    from kvviz.methods.context import GpuContext

    m = get_method("turboquant")
    d, kvh, H = 64, 2, 4
    batch = make_batch([29, 0, 1, 70], 16, policy="scattered", seed=2, pad_every=7)
    K, V = _inputs(np.random.default_rng(4), batch.num_tokens, kvh, d)
    ctx = GpuContext(rt)
    qkv = m.quantize(ctx, batch, K, V)
    assert qkv.device["writer_impl"] == "fast"
    assert all(x.kernel.kspec is fwt.WRITE_TQ for x in qkv.device["writer"])
    kc = qk.read_cache(rt, qkv.device["cache"], "K").reshape(batch.num_blocks, kvh, 16, -1)
    vc = qk.read_cache(rt, qkv.device["cache"], "V").reshape(batch.num_blocks, kvh, 16, -1)
    gk, gv, _ = write(rt, batch, K, V, fast=False, layer=m.layer)
    np.testing.assert_array_equal(kc, gk)
    np.testing.assert_array_equal(vc, gv)
    q = np.random.default_rng(5).standard_normal((batch.num_seqs, H, d)).astype(np.float32)
    timed = m.timed_kernels(ctx, batch, K, V, q, 0.125, qkv)
    rows = {(t.role, t.impl): t for t in timed}
    fast = rows[("writer", "fast")]
    assert fast.name == "fast_write_tq (keys + values)" and fast.dispatches is qkv.device["writer"]
    assert fast.bytes == fwt.writer_bytes(batch, kvh, d) and fast.flops > 0
    gen = rows[("writer", "first-wave")]
    assert gen.name.startswith("tq_general_compress") and gen.bytes == fast.bytes
    assert all(x.kernel.kspec is not fwt.WRITE_TQ for x in gen.dispatches)


def test_fallback_without_subgroups(rt, monkeypatch):
    """An adapter without subgroups (the measured subgroup size 1): no fast writer (None), the method writes with
    tq_general_compress, the same words."""
    from kvviz.families.registry import get_method
    from kvviz.methods.context import GpuContext

    d, kvh = 32, 1
    batch = make_batch([20, 3], 1)
    K, V = _inputs(np.random.default_rng(6), batch.num_tokens, kvh, d)
    want_k, want_v, _ = write(rt, batch, K, V)
    monkeypatch.setattr(rt, "_kvviz_subgroup_size", 1, raising=False)
    st = tqf.TQSettings(d, layer=LAYER)
    assert fwt.lanes_for(rt, d) == 0
    assert fwt.dispatches(rt, st, K, V, batch.slot_mapping, None, None, 1) is None
    m = get_method("turboquant").for_layer(LAYER)
    qkv = m.quantize(GpuContext(rt), batch, K, V)
    assert qkv.device["writer_impl"] == "first-wave"
    kc = qk.read_cache(rt, qkv.device["cache"], "K").reshape(want_k.shape)
    np.testing.assert_array_equal(kc, want_k)

