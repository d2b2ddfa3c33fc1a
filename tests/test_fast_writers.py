"""The fast writers (kvviz/attention/writers.py, shaders/fast/write_*.wgsl) beyond their shared grid: the codes
near every halfway point with an exact and an inexact divider, the margin that keeps them exact, the lane choice,
2-D grids, KIVI's key-group writer, the methods' wiring (writer_impl, the timed rows) and the small-subgroup
defaults. Every word is held to the numpy oracles of the methods they write for (kvviz/attention/writer_oracles.py).
The grid of every writer over shapes and variants (covering pairs), the inexact divider over it, and bad input
are in tests/test_conformance.py; timings are printed by `test_fast_and_first_wave_rows_side_by_side`, never
asserted.
"""
from __future__ import annotations

import numpy as np
import pytest

from kvviz.errors import InvalidInput
from kvviz.errors import UnsupportedShape
from kvviz.attention import writers as fw
from kvviz.families.kivi import kernels as kivi_kernels
from kvviz.families.int8 import kernels as int8_kernels
from kvviz.families.f16 import kernels as f16_kernels
from kvviz.attention import records as qk
from kvviz.families.registry import get_method
from kvviz.families import writer_oracles as ofw
from kvviz.paging import make_batch

from harness import WRITER_SHAPES as SHAPES
from harness import make_rows
from harness import oracle_words
from harness import run_writer


def test_the_margin_is_what_keeps_the_codes_exact(rt):
    """A divider 40 ulp off (beyond the 16-ulp margin) does change codes at exact ties: the inexact-divider check
    (tests/test_conformance.py test_exact_codes_with_an_inexact_divider) can fail."""
    batch = make_batch([40], 16)
    k, v = make_rows(np.random.default_rng(1), 40, 1, 64, "int8_token")
    gk, _, _, _ = run_writer(rt, "int8_token", batch, k, v, fw.Variant(rt, inv_ulps=40))
    assert (gk != ofw.int8_token(batch, k)).any()


def _near_halves(lo: int, hi: int, span: int = 40) -> np.ndarray:
    """Every float32 within `span` ulp of each halfway point k + 1/2, k in [lo, hi) (the halfway points included),
    in the order k + 1/2, one ulp below, one above, two below, ...: a value next to its halfway point shares a vec4
    with ones farther out, so one unsure neighbour does not send a whole vec4 to the exact path and hide a wrong
    code (sorted, the test passes with the fast path's margin at 1 unit)."""
    h = (np.arange(lo, hi) + 0.5).astype(np.float32)
    steps = np.zeros(2 * span + 1, np.int32)
    steps[1::2], steps[2::2] = -np.arange(1, span + 1), np.arange(1, span + 1)
    # neighbouring floats of one sign are neighbouring integers of their bits (downwards: bits - 1 if positive)
    bits = h.view(np.int32)[:, None] + np.where(h < 0, -1, 1)[:, None] * steps
    return bits.astype(np.int32).reshape(-1).view(np.float32)


def _rows_with(head: np.ndarray, vals: np.ndarray, D: int) -> np.ndarray:
    """Rows of D values: `head` first (it fixes the row's scale), then `vals` in order (the last row padded with them)."""
    per = D - len(head)
    n = -(-len(vals) // per)
    body = np.resize(vals, n * per).reshape(n, per)
    return np.concatenate([np.broadcast_to(head, (n, len(head))), body], 1).astype(np.float32)


@pytest.mark.parametrize("ulps", [-3, 0, 3])
def test_codes_within_40_ulp_of_every_halfway_point(ctx, ulps, monkeypatch):
    """The fast path's codes come from integer ops on the bits of q + 3 x 2^k (write_common.wgsl round_fixed4 and
    asym_codes4v_fast); a code is sure only 8 units of 2^(k-22) away from a halfway point. Every value within 40 ulp
    of every halfway point of int8_token (scale exactly 1: amax 127), int4 (min 0, max 15 a group: scale 1) and KIVI
    (min 0, max 2^bits - 1 a row and a channel's key group), with the divider exact and 3 ulp off either way: the
    oracle's words."""
    from kvviz.families.kivi import oracle as okv
    D = 64
    i8 = _rows_with(np.array([127.0], np.float32), _near_halves(-127, 127), D)
    batch = make_batch([len(i8)], 16)
    var = fw.Variant(ctx.rt, inv_ulps=ulps)
    gk, gv, _, _ = run_writer(ctx.rt, "int8_token", batch, i8[:, None, :], i8[::-1, None, :].copy(), var)
    np.testing.assert_array_equal(gk, ofw.int8_token(batch, i8[:, None, :]))
    np.testing.assert_array_equal(gv, ofw.int8_token(batch, i8[::-1, None, :].copy()))
    # int4, groups of 32: each group 0, 15, then 30 values near the halfway points of [0, 15]
    g = _rows_with(np.array([0.0, 15.0], np.float32), _near_halves(0, 15), 32).reshape(-1)
    i4 = np.resize(g, (-(-len(g) // D)) * D).reshape(-1, D)
    batch = make_batch([len(i4)], 16)
    gk, gv, _, _ = run_writer(ctx.rt, "int4-32", batch, i4[:, None, :], i4[::-1, None, :].copy(), var)
    np.testing.assert_array_equal(gk, ofw.int4(batch, i4[:, None, :], 32))
    np.testing.assert_array_equal(gv, ofw.int4(batch, i4[::-1, None, :].copy(), 32))
    # KIVI: V per token over the head, K per channel over 32-token groups; rows 32g, 32g + 1 are 0 and the top level
    real = fw.Variant
    monkeypatch.setattr(fw, "Variant", lambda rt, subgroups=None, lanes=None: real(rt, subgroups, lanes, ulps))
    for bits in (2, 4):
        top = float(2 ** bits - 1)
        near = _near_halves(0, 2 ** bits - 1)
        ends = np.array([0.0, top], np.float32)
        v = _rows_with(ends, near, D)
        cols = _rows_with(ends, near, 32)   # a channel's 32 positions of a key group: 0, top, then values
        G = max(-(-len(cols) // D), -(-len(v) // 32))
        k = np.resize(cols, (G * D, 32)).reshape(G, D, 32).transpose(0, 2, 1).reshape(G * 32, D).copy()
        T = G * 32
        v = np.resize(v, (T, D))
        batch = make_batch([T], 16)
        m = get_method("kivi", bits=bits, recent=0)
        got = m.read_buffers(ctx, m.quantize(ctx, batch, k[:, None, :], v[:, None, :]))
        ref = okv.write_buffers(batch, k[:, None, :], v[:, None, :], bits, 0)
        np.testing.assert_array_equal(got["k"], ref["k"])
        np.testing.assert_array_equal(got["v"], ref["v"])


@pytest.mark.parametrize("ulps", [-3, 3])
def test_kivi_exact_with_an_inexact_divider(ctx, ulps, monkeypatch):
    from kvviz.families.kivi import oracle as okv
    real = fw.Variant
    monkeypatch.setattr(fw, "Variant", lambda rt, subgroups=None, lanes=None: real(rt, subgroups, lanes, ulps))
    batch = make_batch([70, 1, 45], 16, policy="scattered", pad_every=6, seed=2)
    k, v = make_rows(np.random.default_rng(8), batch.num_tokens, 2, 64, "int4")
    for bits, recent in ((2, 0), (4, 16)):
        m = get_method("kivi", bits=bits, recent=recent)
        got = m.read_buffers(ctx, m.quantize(ctx, batch, k, v))
        ref = okv.write_buffers(batch, k, v, bits, recent)
        np.testing.assert_array_equal(got["k"], ref["k"])
        np.testing.assert_array_equal(got["v"], ref["v"])


def test_lane_choice_nests_with_groups():
    assert fw.choose_lanes(32, 0, 32) == 32 and fw.choose_lanes(20, 0, 32) == 4 and fw.choose_lanes(15, 0, 32) == 1
    assert fw.choose_lanes(16, 4, 32) == 16  # int4 G=32 at D=128: a group is 4 lanes
    assert fw.choose_lanes(10, 5, 32) == 1 and fw.choose_lanes(10, 2, 32) == 2 and fw.choose_lanes(12, 6, 32) == 2
    assert fw.choose_lanes(64, 0, 5) == 4  # at most the largest power of two below the limit


def test_two_dimensional_grid_without_chunks(rt):
    """The grid limit forced to 16: more workgroups than that are one dispatch on a 2-D grid, exact."""
    saved = dict(rt.limits)
    rt.limits["max-compute-workgroups-per-dimension"] = 16
    try:
        batch = make_batch([300, 1, 150], 16, policy="scattered", pad_every=9)
        rng = np.random.default_rng(3)
        k, v = make_rows(rng, batch.num_tokens, 2, 64, "int8_token")
        var = fw.Variant(rt, False, 16)  # 16 lanes: 4 rows a workgroup, > 16 workgroups
        n = batch.num_blocks * 2 * 16 * 17
        kb, vb = rt.upload(np.zeros(n, np.uint32), "k"), rt.upload(np.zeros(n, np.uint32), "v")
        d = int8_kernels.int8_dispatches(rt, k, v, batch.slot_mapping, kb, vb, 16, variant=var)
        assert len(d) == 1 and d[0].grid[1] > 1 and max(d[0].grid) <= 16
        rt.run(d)
        shape = (batch.num_blocks, 2, 16, 17)
        np.testing.assert_array_equal(rt.read(kb, np.uint32, shape), ofw.int8_token(batch, k))
        np.testing.assert_array_equal(rt.read(vb, np.uint32, shape), ofw.int8_token(batch, v))
        f = f16_kernels.f16_dispatches(rt, k, v, batch.slot_mapping, kb, vb, 16)
        assert len(f) == 1 and f[0].grid[1] > 1
    finally:
        rt.limits.clear()
        rt.limits.update(saved)


@pytest.mark.slow
def test_more_than_65535_tokens_in_one_dispatch(rt):
    """70,000 tokens, one row a workgroup (64 lanes, head 256): 70,000 workgroups on a 2-D grid."""
    T, D = 70000, 256
    batch = make_batch([T], 16)
    rng = np.random.default_rng(5)
    k = rng.standard_normal((T, 1, D)).astype(np.float32)
    v = (k * np.float32(0.5)).astype(np.float32)
    n = batch.num_blocks * 16 * (D // 4 + 1)
    kb, vb = rt.upload(np.zeros(n, np.uint32), "k"), rt.upload(np.zeros(n, np.uint32), "v")
    d = int8_kernels.int8_dispatches(rt, k, v, batch.slot_mapping, kb, vb, 16, seed=True, variant=fw.Variant(rt, False, 64))
    assert len(d) == 1 and d[0].grid[0] * d[0].grid[1] >= T > rt.max_grid and d[0].grid[1] > 1
    rt.run(d)
    shape = (batch.num_blocks, 1, 16, D // 4 + 1)
    np.testing.assert_array_equal(rt.read(kb, np.uint32, shape), ofw.int8_seed(batch, k))
    np.testing.assert_array_equal(rt.read(vb, np.uint32, shape), ofw.int8_seed(batch, v))


# ------------------------------------------------------------------------------ through the methods
METHODS = [("int8_token", {}), ("fp8_e4m3", {"scale_mode": "per_token"}), ("fp8_e5m2", {"scale_mode": "per_tensor"}),
           ("int4_group", {"group_size": 32}), ("kivi", {"bits": 2, "recent": 0}), ("kivi", {"bits": 4, "recent": 16})]
MIDS = [f"{m}-" + "-".join(f"{a}={b}" for a, b in o.items()) for m, o in METHODS]


def _cache_words(ctx, m, qkv):
    qc = qkv.device["cache"]
    out = [qk.read_cache(ctx.rt, qc, "K"), qk.read_cache(ctx.rt, qc, "V")]
    if m.family == "kivi":
        out.append(m.read_buffers(ctx, qkv)["res"])
    return out


@pytest.mark.parametrize("no_subgroups", [False, True], ids=["default", "no-subgroups"])
@pytest.mark.parametrize("mk", METHODS, ids=MIDS)
def test_methods_write_through_the_fast_writer(ctx, mk, no_subgroups, monkeypatch):
    """quantize() runs the fast writer by default; writer_impl = "first-wave" gives the same words (and
    the method's oracle, checked in tests/test_quant_methods.py); an adapter without subgroups gets the
    workgroup-memory variant."""
    if no_subgroups:
        monkeypatch.setattr(fw, "subgroups_available", lambda rt: False)
    key, opts = mk
    batch = make_batch([70, 1, 0, 45], 16, policy="scattered", pad_every=6, seed=2)
    rng = np.random.default_rng(8)
    k, v = make_rows(rng, batch.num_tokens, 2, 64, "int4" if key in ("int4_group", "kivi") else "int8_token")
    fast = get_method(key, **opts)
    q1 = fast.quantize(ctx, batch, k, v)
    assert q1.device["cache"].extra["writer_impl"] == "fast"
    first = get_method(key, **opts)
    first.writer_impl = "first-wave"
    q2 = first.quantize(ctx, batch, k, v)
    assert q2.device["cache"].extra["writer_impl"] == "first-wave"
    for a, b in zip(_cache_words(ctx, fast, q1), _cache_words(ctx, first, q2)):
        np.testing.assert_array_equal(a, b)
    bad = get_method(key, **opts)
    bad.writer_impl = "turbo"
    with pytest.raises(InvalidInput, match="writer_impl"):
        bad.quantize(ctx, batch, k, v)


@pytest.mark.parametrize("row_sets", [1, 2, 8])
def test_kivi_key_groups_at_other_row_sets(ctx, row_sets, monkeypatch):
    """write_kivi_kgroup.wgsl at 1, 2 and 8 row sets (32, 16, 4 rows a thread; the product takes 4): the oracle's
    words, K and V, head 64 and 128."""
    from kvviz.families.kivi import oracle as okv
    monkeypatch.setattr(kivi_kernels, "KGROUP_ROW_SETS", row_sets)
    for D, bits in ((64, 2), (128, 4)):
        assert kivi_kernels.kgroup_defines(ctx.rt, D)["RS"] == row_sets
        batch = make_batch([100, 33], 16, policy="scattered", pad_every=5, seed=row_sets)
        k, v = make_rows(np.random.default_rng(D + row_sets), batch.num_tokens, 2, D, "int4")
        m = get_method("kivi", bits=bits, recent=0)
        qkv = m.quantize(ctx, batch, k, v)
        assert qkv.device["cache"].extra["writer_impl"] == "fast"
        got, ref = m.read_buffers(ctx, qkv), okv.write_buffers(batch, k, v, bits, 0)
        np.testing.assert_array_equal(got["k"], ref["k"])
        np.testing.assert_array_equal(got["v"], ref["v"])


def test_kivi_key_groups_beyond_the_workgroup_take_the_first_wave_writer(ctx, monkeypatch):
    """A head whose key-group tile the adapter's workgroup cannot hold: kgroup_defines says why, and the method
    writes the cache with the first-wave writers instead (the same words), saying so in writer_impl."""
    from kvviz.families.kivi import oracle as okv
    monkeypatch.setitem(ctx.rt.limits, "max-compute-workgroup-storage-size", 4096)   # 128 x D/4 bytes needed: D <= 128
    assert kivi_kernels.kgroup_defines(ctx.rt, 128)["NV4"] == 32
    with pytest.raises(UnsupportedShape, match="workgroup memory"):
        kivi_kernels.kgroup_defines(ctx.rt, 256)
    batch = make_batch([70], 16, seed=3)
    k, v = make_rows(np.random.default_rng(5), batch.num_tokens, 1, 256, "int4")
    m = get_method("kivi", bits=2, recent=0)
    qkv = m.quantize(ctx, batch, k, v)
    assert qkv.device["cache"].extra["writer_impl"] == "first-wave"
    got, ref = m.read_buffers(ctx, qkv), okv.write_buffers(batch, k, v, 2, 0)
    np.testing.assert_array_equal(got["k"], ref["k"])
    np.testing.assert_array_equal(got["v"], ref["v"])


def test_kivi_key_group_written_when_it_fills(ctx):
    """The key-group writer takes any list of (sequence, group) with their token rows: a group written
    alone after its 32nd token arrives (a live append) gives the prefill's words."""
    m = get_method("kivi", bits=2, recent=0)
    batch = make_batch([64], 16, policy="scattered", seed=4)
    rng = np.random.default_rng(9)
    k, v = make_rows(rng, 64, 1, 64, "int4")
    qkv = m.quantize(ctx, batch, k, v)
    qc = qkv.device["cache"]
    want = qk.read_cache(ctx.rt, qc, "K").copy()
    key, value, sm, row_res, res, info_buf, groups, rows, bt_off, mbs = qc.extra["writer_args"]
    # wipe the second group's code words and side words, then write that group alone
    kbuf = qk.read_cache(ctx.rt, qc, "K")
    kbuf[:] = 0
    ctx.rt.queue.write_buffer(qc.k, 0, kbuf.tobytes())
    d = kivi_kernels.kivi_group_dispatches(ctx.rt, 2, key, sm, np.asarray(groups[1:], np.uint32), np.asarray(rows[1:]), info_buf,
                                 qc.k, batch.block_size, qc.k_words, bt_off, mbs)
    ctx.rt.run(d)
    got = qk.read_cache(ctx.rt, qc, "K")
    kw = 64 * 2 // 32
    blocks = np.asarray(batch.seq_blocks[0])
    for pos in range(32, 64):  # the second group's code words
        b, o = blocks[pos // 16], pos % 16
        np.testing.assert_array_equal(got[b, 0, o * kw:(o + 1) * kw], want[b, 0, o * kw:(o + 1) * kw])
    for pos in range(32):  # the first group's were not rewritten
        b, o = blocks[pos // 16], pos % 16
        assert not got[b, 0, o * kw:(o + 1) * kw].any()
    ws = 64 * 16 // 16
    side = np.concatenate([got[b, 0, 16 * kw:16 * kw + ws] for b in blocks])
    side_want = np.concatenate([want[b, 0, 16 * kw:16 * kw + ws] for b in blocks])
    np.testing.assert_array_equal(side[2 * 64:4 * 64], side_want[2 * 64:4 * 64])  # group 1's (scale, zero) words
    assert not side[:2 * 64].any()


def test_fast_and_first_wave_rows_side_by_side(ctx):
    """Every method's timed kernels carry its writers as role "writer" rows, impl "fast" and "first-wave"
    (f16: fast only; int8_seed: seed and fast). Replayed and printed, never asserted on time."""
    batch = make_batch([96, 40], 16, pad_every=7)
    rng = np.random.default_rng(4)
    k, v = make_rows(rng, batch.num_tokens, 2, 64, "f16")  # values every method takes
    q = rng.standard_normal((2, 4, 64)).astype(np.float32)
    want = {"int8_seed": {"seed", "fast"}, "f16": {"fast"}}
    for key, opts in [("int8_seed", {}), ("int8_token", {}), ("fp8_e4m3", {"scale_mode": "per_tensor"}),
                      ("int4_group", {}), ("kivi", {"bits": 2, "recent": 0}), ("f16", {})]:
        m = get_method(key, **opts)
        rows = [t for t in m.timed_kernels(ctx, batch, k, v, q, 0.125) if t.role == "writer"]
        assert {t.impl for t in rows} == want.get(key, {"fast", "first-wave"}), [(t.name, t.impl) for t in rows]
        for t in rows:
            r = ctx.rt.time(t.dispatches, runs=3, warmup=1)
            print(f"{key:12s} {t.name:45s} {t.impl:10s} {r.median_us:8.0f} us ({r.method}), {t.bytes} bytes")


def test_seed_writer_default_on_a_small_guaranteed_subgroup(rt, monkeypatch):
    """Where wgpu guarantees only subgroups of 4 (NVIDIA), the seed-layout writer's default is 4 lanes a row
    through shuffles (int8_kernels.SEED_SUBGROUP_LANES), the other writers keep 8 lanes through workgroup memory; the
    default seed writer still writes the seed oracle's words."""
    if not fw.subgroups_available(rt):
        pytest.skip("this adapter has no subgroups: the seed writer's default is the workgroup-memory one")
    monkeypatch.setattr(fw, "smallest_subgroup", lambda rt: 4)
    var = int8_kernels.seed_variant(rt)
    assert var.subgroups and var.lanes(32) == 4
    assert not fw.Variant(rt).subgroups and fw.Variant(rt).lanes(32) == fw.AUTO_LANES
    D, bs, lens, policy, pad_every, kvh = SHAPES[1]
    batch = make_batch(lens, bs, policy=policy, pad_every=pad_every, seed=3)
    k, v = make_rows(np.random.default_rng(3), batch.num_tokens, kvh, D, "int8_seed")
    gk, gv, _, _ = run_writer(rt, "int8_seed", batch, k, v, None)
    for x, got in ((k, gk), (v, gv)):
        np.testing.assert_array_equal(got, oracle_words("int8_seed", batch, x, None))


@pytest.mark.parametrize("writer", ["int4-32", "int4-128"])
def test_int4_group_reduction_by_shuffles_inside_a_small_subgroup(rt, writer, monkeypatch):
    """Where wgpu guarantees only subgroups of 4, the default int4 writer takes 8 lanes through workgroup memory
    but reduces a group of 4 units (G = 32) by shuffles: an aligned span of 4 lanes lies in one subgroup. G = 128
    spans 8 lanes and keeps workgroup memory. Both write the oracle's words."""
    if not fw.subgroups_available(rt):
        pytest.skip("this adapter has no subgroups: every int4 reduction goes through workgroup memory")
    monkeypatch.setattr(fw, "smallest_subgroup", lambda rt: 4)
    var = fw.Variant(rt)
    assert not var.subgroups and var.lanes(16, 4) == fw.AUTO_LANES
    assert var.defines(8, span=4)["REDUCE_KIND"] == "subgroup shuffles"
    assert var.defines(8, span=8)["REDUCE_KIND"] == "workgroup memory"
    assert fw.Variant(rt, False).defines(8, span=4)["REDUCE_KIND"] == "workgroup memory"   # asked for: kept
    D, bs, lens, policy, pad_every, kvh = SHAPES[1]   # D = 128: 16 units, 8 lanes
    batch = make_batch(lens, bs, policy=policy, pad_every=pad_every, seed=5)
    k, v = make_rows(np.random.default_rng(5), batch.num_tokens, kvh, D, writer)
    gk, gv, _, method = run_writer(rt, writer, batch, k, v, var)
    np.testing.assert_array_equal(gk, oracle_words(writer, batch, k, method))
    np.testing.assert_array_equal(gv, oracle_words(writer, batch, v, method))


# ------------------------------------------------------------------------------ rows already on the device
DEVICE_METHODS = [("int8_token", {}), ("f16", {}), ("int4_group", {"group_size": 32}),
                  ("fp8_e4m3", {"scale_mode": "per_token"}), ("nvfp4", {}), ("q8_0", {}), ("q4_0", {})]


def _fast_words(ctx, m, batch, key, value, kvh, D):
    w = m.wpt(D)
    qc = qk.alloc_cache(ctx.rt, m.id, batch, kvh, D, batch.block_size * w, batch.block_size * w)
    tb = m._tensor_buffer(ctx)
    if tb is not None:
        qc.extra["tensor"] = tb
    d = m.fast_writer(ctx.rt, qc, key, value, np.asarray(batch.slot_mapping, np.uint32))
    assert d
    ctx.rt.run(d)
    return qk.read_cache(ctx.rt, qc, "K"), qk.read_cache(ctx.rt, qc, "V")


@pytest.mark.parametrize("chunk", [None, 4], ids=["one-binding", "chunks-of-4"])
@pytest.mark.parametrize("mk", DEVICE_METHODS, ids=[m for m, _ in DEVICE_METHODS])
def test_fast_writers_take_rows_on_the_device(ctx, mk, chunk, monkeypatch):
    """K/V already on the device (DeviceRows, bound in place) give the words of the same rows uploaded, in one
    binding and in binding chunks (4 tokens of 2 x 64 floats: 2 KiB, an aligned offset on every adapter)."""
    from kvviz.gpu.runtime import DeviceRows

    if chunk is not None:
        monkeypatch.setattr(fw, "input_chunks", lambda rt, n, row_bytes: [(s, min(n, s + chunk)) for s in range(0, n, chunk)])
    key_, opts = mk
    kvh, D = 2, 64
    batch = make_batch([13, 6], 16, policy="scattered", seed=4)
    rng = np.random.default_rng(12)
    k = rng.standard_normal((batch.num_tokens, kvh, D)).astype(np.float32)
    v = (rng.standard_normal((batch.num_tokens, kvh, D)) * 0.25).astype(np.float32)
    host = _fast_words(ctx, get_method(key_, **opts), batch, k, v, kvh, D)
    on_device = (DeviceRows(ctx.rt.upload(k, "k-rows"), k.shape), DeviceRows(ctx.rt.upload(v, "v-rows"), v.shape))
    dev = _fast_words(ctx, get_method(key_, **opts), batch, *on_device, kvh, D)
    for a, b in zip(host, dev):
        np.testing.assert_array_equal(a, b)


def test_device_rows_at_an_unaligned_binding_offset_are_refused(ctx, monkeypatch):
    """A binding chunk of device rows that would start at an offset the adapter cannot bind is refused
    (UnsupportedShape: the caller writes from the host), never bound misaligned."""
    from kvviz.gpu.runtime import DeviceRows

    monkeypatch.setitem(ctx.rt.limits, "min-storage-buffer-offset-alignment", 256)
    monkeypatch.setattr(fw, "input_chunks", lambda rt, n, row_bytes: [(s, min(n, s + 3)) for s in range(0, n, 3)])
    batch = make_batch([8], 16)
    k = np.ones((8, 1, 32), np.float32)  # 128-byte rows: the second chunk starts at byte 384
    rows = DeviceRows(ctx.rt.upload(k, "k-rows"), k.shape)
    with pytest.raises(UnsupportedShape, match="alignment"):
        _fast_words(ctx, get_method("int8_token"), batch, rows, rows, 1, 32)
    with pytest.raises(UnsupportedShape, match="alignment"):
        f16_kernels.f16_dispatches(ctx.rt, rows, rows, batch.slot_mapping, rows.buffer, rows.buffer, 16)
