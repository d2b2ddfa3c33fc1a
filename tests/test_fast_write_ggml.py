"""Conformance of the fast writers of the llama.cpp block types and NVFP4 (kvviz/families/ggml/writer.py,
shaders/ggml/write_fast.wgsl, write_nvfp4.wgsl) on the GPU (lavapipe in CI) against the oracles
kvviz/families/ggml/oracle.py (gguf.quants; iq4_nl: llama.cpp's reference) and kvviz/families/fp4/oracle.py.

Exact, word for word, over head sizes 32 / 64 / 128 / 256 and block sizes 1 / 16 / 32, ragged sequences,
padding slots, all-zero rows, exact ties of every type's rounding, values near the f16 limit (a block scale
just below 65504), MXFP4 amaxes at powers of two, subnormals: the caches are filled with a garbage pattern
first, so every word of a written record (padding bytes included) must be stored and no other word touched.
Every type runs at the default lane split and at twice the blocks a lane (one lane a row at head 64 .. 128);
the writers need no cross-lane reduction, so there is no subgroup variant of their own (NVFP4's amax pass,
fast_write's WRITE_FP8_AMAX, runs with and without subgroups). A 2-D grid (grid limit forced to 16) and
the methods' wiring (writer impl "fast", the first-wave writer timed beside it) are checked too, and iq4_nl's
division (write_ggml.wgsl div_fast) against float32 a / b on its own.
"""
from __future__ import annotations

import os

os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")

import numpy as np
import pytest

from kvviz.errors import InvalidInput
from kvviz.families.fp4 import format as f4
from kvviz.families.ggml import format as fg
from kvviz.attention import writers as fw
from kvviz.families.fp8 import kernels as fp8_kernels
from kvviz.families.fp4 import writer as fw4
from kvviz.families.ggml import writer as fwg
from kvviz.attention import records as qk
from kvviz.families.registry import get_method
from kvviz.families.fp4 import oracle as of4
from kvviz.families.ggml import oracle as og
from kvviz.paging import PAD_SLOT, make_batch

TYPES = ("q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl", "mxfp4")
GARBAGE = np.uint32(0xA5C3E1F7)
# (head_size, block_size, context lens, policy, pad_every, kv_heads)
SHAPES = [
    (32, 1, [3, 0, 5], "scattered", 4, 2),
    (64, 16, [1, 23, 0, 9], "contiguous", 0, 2),
    (128, 32, [37, 2], "scattered", 5, 1),
    (256, 16, [19, 4], "fragmented", 3, 1),
]
SIDS = [f"D{s[0]}-bs{s[1]}" for s in SHAPES]


def special_rows(name: str, D: int) -> list[np.ndarray]:
    """Rows of D elements: all zero, signed zeros, exact ties of the type's rounding, values near its f16
    (or E8M0 / E4M3) limit, MXFP4 log2 edges, subnormals next to normal values."""
    i = np.arange(D)
    rows = [np.zeros(D, np.float32), np.where(i % 2, 0.0, -0.0).astype(np.float32),
            np.where(i % 3 == 0, 1e-40, (i - D / 2) * 0.01).astype(np.float32)]
    halves = ((i % 41) - 20).astype(np.float32) / np.float32(2)          # k/2: ties and codes
    blk = i % 32
    if name == "q8_0":      # d = 1: x = k + 1/2 rounds away from zero
        t = np.clip(halves * 3, -126.5, 126.5).astype(np.float32)
        t[blk == 0] = 127.0
        t[blk == 1], t[blk == 2] = np.float32(0.49999997), np.float32(-0.49999997)   # + 0.5 would round them up
        n = np.where(i % 2, np.float32(np.inf), np.float32(-np.inf)).astype(np.float32)
        rows += [t, (np.linspace(-1, 1, D) * np.float32(65500 * 127)).astype(np.float32), np.nextafter(t, n)]
    elif name in ("q4_0", "q5_0"):
        lim = 8 if name == "q4_0" else 16
        t = np.clip(halves, -lim + 0.5, lim - 0.5).astype(np.float32)
        t[blk == 0] = -float(lim)
        rows += [t, (np.linspace(-1, 1, D) * np.float32(65500 * lim)).astype(np.float32)]
    elif name in ("q4_1", "q5_1"):
        top = 15 if name == "q4_1" else 31
        t = np.clip(np.abs(halves), 0, top).astype(np.float32)
        t[blk == 0], t[blk == 31] = float(top), 0.0
        h = np.linspace(-65500, 65500 * (top - 1), D).astype(np.float32)   # d and min just inside f16
        h[blk == 0], h[blk == 31] = -65500.0, 65500.0 * (top - 1)
        rows += [t, h]
    elif name == "iq4_nl":
        t = (halves * 5).astype(np.float32)
        t[blk == 0] = 113.0
        rows += [t, (np.linspace(-1, 1, D) * np.float32(65000 * 100)).astype(np.float32)]
    else:                   # mxfp4: amax 4 (d = 1/2): E2M1 midpoints; amax at / just below powers of two
        mids = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 0.5, 1.5, 3.0, -0.25, -0.75, -2.5, -5.0, 6.0, -6.0],
                        np.float32)
        t = np.resize(mids, D)
        t[blk == 0] = 4.0
        if D % 32:           # NVFP4 heads of 16k elements: no 32-element edge rows
            return rows + [t]
        e = np.resize(np.array([2.0**20, np.nextafter(np.float32(2.0**20), np.float32(0)), 2.0**-80,
                                np.nextafter(np.float32(2.0**-80), np.float32(0))], np.float32), D // 32)
        edge = (np.linspace(-1, 1, D).reshape(-1, 32) * e[:, None]).astype(np.float32)
        edge[:, 7] = e
        # amax within 44 ulp of 2^128: e = 253, d = 2^125, gguf's 8d and 12d (and their errors) overflow to inf
        big = (np.resize(np.linspace(-1, 1, 32), D) * np.float32(np.finfo(np.float32).max)).astype(np.float32)
        big[blk == 0] = np.finfo(np.float32).max
        rows += [t, edge.reshape(D), np.full(D, np.float32(3.0e38)) * np.where(i % 2, 1, -1).astype(np.float32), big]
    return rows


def make_rows(rng, name, T, kvh, D):
    k = (rng.standard_normal((T, kvh, D)) * 10.0 ** rng.uniform(-3, 3, (T, kvh, 1))).astype(np.float32)
    v = (rng.standard_normal((T, kvh, D)) * 10.0 ** rng.uniform(-2, 2, (T, kvh, 1))).astype(np.float32)
    if D >= 64:  # an outlier channel
        k[:, :, 5] *= np.float32(300.0)
    for j, r in enumerate(special_rows(name, D)):
        if j < T:
            k[j, 0] = r
            v[T - 1 - j, -1] = r[::-1]
    return k, v


def scatter(batch, recs, fill=GARBAGE):
    """Per-row records [tokens, kvh, W] -> paged words, unwritten slots keeping `fill`."""
    T, kvh, W = recs.shape
    out = np.full((batch.num_blocks, kvh, batch.block_size, W), fill, np.uint32)
    sm = np.asarray(batch.slot_mapping).astype(np.int64)
    real = sm != PAD_SLOT
    out[sm[real] // batch.block_size, :, sm[real] % batch.block_size] = recs[real]
    return out


def caches(rt, batch, kvh, wpt):
    n = batch.num_blocks * kvh * batch.block_size * wpt
    return rt.upload(np.full(n, GARBAGE, np.uint32), "k"), rt.upload(np.full(n, GARBAGE, np.uint32), "v")


def run_ggml(rt, name, batch, k, v, **kw):
    t = fg.TYPES[name]
    kvh, D = k.shape[1], k.shape[2]
    wpt = t.words_per_token(D)
    kb, vb = caches(rt, batch, kvh, wpt)
    d = fwg.ggml_dispatches(rt, name, k, v, batch.slot_mapping, kb, vb, batch.block_size, **kw)
    rt.run(d)
    shape = (batch.num_blocks, kvh, batch.block_size, wpt)
    return rt.read(kb, np.uint32, shape), rt.read(vb, np.uint32, shape), d


def check_ggml(rt, name, batch, k, v, **kw):
    gk, gv, d = run_ggml(rt, name, batch, k, v, **kw)
    t = fg.TYPES[name]
    for which, got, x in (("K", gk, k), ("V", gv, v)):
        want = scatter(batch, og.quantize(x, t))
        bad = np.argwhere((got != want).any(-1))
        assert bad.size == 0, (name, which, kw, bad[:3].tolist(),
                               [(got[tuple(b)].tobytes().hex(), want[tuple(b)].tobytes().hex()) for b in bad[:2]])
    return d


@pytest.mark.parametrize("name", TYPES)
def test_ggml_words_equal_the_oracle(ctx, name):
    """Every head size and block size at the default lanes, and twice the blocks a lane at every other shape
    (alternating over the types, so each type and each shape meets both lane counts: every pair of type, shape and
    lanes at least once): words == the oracle's."""
    rng = np.random.default_rng(hash(name) % 1000)
    for j, (D, bs, lens, policy, pe, kvh) in enumerate(SHAPES):
        batch = make_batch(lens, bs, policy=policy, pad_every=pe)
        k, v = make_rows(rng, name, batch.num_tokens, kvh, D)
        check_ggml(ctx.rt, name, batch, k, v)
        if (TYPES.index(name) + j) % 2 == 0:
            base = fwg.min_blocks_per_lane(fg.TYPES[name])
            check_ggml(ctx.rt, name, batch, k, v, blocks_per_lane=2 * base)


def test_q8_0_both_roundf_forms_write_the_same_words(ctx):
    """q8_0's roundf as trunc(q + copysign(0.5 - 2^-25, q)) (write_ggml.wgsl Q8_TRUNC, the default: every other
    q8_0 test runs it) and on the bits of q + 1.5 * 2^23 with a tie fix (Q8_TRUNC off) both write gguf's words over
    every shape, the special rows included (exact ties, x = +-0.49999997 at d = 1, where adding 0.5 itself would
    round up), with and without the exchange."""
    rng = np.random.default_rng(21)
    for D, bs, lens, policy, pe, kvh in SHAPES:
        batch = make_batch(lens, bs, policy=policy, pad_every=pe)
        k, v = make_rows(rng, "q8_0", batch.num_tokens, kvh, D)
        assert "Q8_TRUNC=true" in check_ggml(ctx.rt, "q8_0", batch, k, v)[-1].kernel.name
        d = check_ggml(ctx.rt, "q8_0", batch, k, v, q8_trunc=False)
        assert "Q8_TRUNC=false" in d[-1].kernel.name
        check_ggml(ctx.rt, "q8_0", batch, k, v, q8_trunc=False, blocks_per_lane=2)

@pytest.mark.parametrize("name", [n for n in TYPES if fwg.min_blocks_per_lane(fg.TYPES[n]) > 1])
def test_block_exchange_and_whole_words_write_the_same_words(ctx, name):
    """The types whose blocks end inside a word (q8_0 34 B, q4_0 / iq4_nl 18 B, q5_0 22 B, mxfp4 17 B): a lane a
    block handing the shared word over by a subgroup shuffle (the default where a unit fits the smallest
    subgroup) and whole words a lane both write the oracle's words; 3 and 5 blocks a row leave a unit short
    (an idle partner lane), and the shuffle crosses rows of one workgroup."""
    rt = ctx.rt
    base = fwg.min_blocks_per_lane(fg.TYPES[name])
    if not (fw.subgroups_available(rt) and base <= fw.smallest_subgroup(rt)):
        pytest.skip("this adapter's subgroups cannot hold a unit of blocks: the writer takes whole words a lane")
    rng = np.random.default_rng(11)
    for D, bs, lens, policy, pe, kvh in [(96, 16, [21, 0, 6], "scattered", 4, 3), (160, 8, [9, 2], "contiguous", 0, 2),
                                         (128, 16, [40], "fragmented", 0, 2)]:
        batch = make_batch(lens, bs, policy=policy, pad_every=pe, seed=D)
        k, v = make_rows(rng, name, batch.num_tokens, kvh, D)
        d = check_ggml(rt, name, batch, k, v, exchange=True)
        assert "XCH=1" in d[-1].kernel.name and "NB=1" in d[-1].kernel.name
        d = check_ggml(rt, name, batch, k, v, exchange=False)
        assert "XCH=0" in d[-1].kernel.name
    assert "XCH=1" in check_ggml(rt, name, batch, k, v)[-1].kernel.name   # the default here


@pytest.mark.parametrize("name", ["q8_0", "q4_1", "iq4_nl", "mxfp4"])
def test_staged_and_in_place_stores_write_the_same_words(ctx, name):
    """The records stored through workgroup memory by consecutive threads (write_ggml.wgsl STAGE) and each lane
    storing its own words: both the oracle's words, with and without the exchange, over rows that leave a
    workgroup's last rows empty (21 + 6 tokens x 3 heads is not a multiple of its rows) and padding slots."""
    rt = ctx.rt
    rng = np.random.default_rng(12)
    batch = make_batch([21, 0, 6], 16, policy="scattered", pad_every=4, seed=5)
    k, v = make_rows(rng, name, batch.num_tokens, 3, 96)
    default = check_ggml(rt, name, batch, k, v)[-1].kernel.name
    assert ("STAGE=0" if name in fwg.NO_STAGE else "STAGE=1") in default
    for stage in (True, False):
        assert f"STAGE={int(stage)}" in check_ggml(rt, name, batch, k, v, stage=stage)[-1].kernel.name
        check_ggml(rt, name, batch, k, v, stage=stage, exchange=False)

def run_nvfp4(rt, batch, k, v, **kw):
    kvh, D = k.shape[1], k.shape[2]
    wpt = f4.words_per_token(D)
    kb, vb = caches(rt, batch, kvh, wpt)
    tb = rt.upload(np.zeros(4, np.uint32), "tensor")
    d = fw4.nvfp4_dispatches(rt, k, v, batch.slot_mapping, kb, vb, tb, batch.block_size, **kw)
    rt.run(d)
    shape = (batch.num_blocks, kvh, batch.block_size, wpt)
    return rt.read(kb, np.uint32, shape), rt.read(vb, np.uint32, shape), rt.read(tb, np.uint32, nbytes=16), d


def check_nvfp4(rt, batch, k, v, **kw):
    gk, gv, tw, d = run_nvfp4(rt, batch, k, v, **kw)
    rk, rv, (sk, sv) = of4.quantize_batch(k, v, batch.slot_mapping)
    for which, got, rec in (("K", gk, rk), ("V", gv, rv)):
        want = scatter(batch, rec)
        bad = np.argwhere((got != want).any(-1))
        assert bad.size == 0, ("nvfp4", which, kw, bad[:3].tolist(),
                               [(got[tuple(b)].tobytes().hex(), want[tuple(b)].tobytes().hex()) for b in bad[:2]])
    real = batch.slot_mapping != PAD_SLOT
    if real.any():
        assert tw[2:4].view(np.float32).tolist() == [float(sk), float(sv)]
    return d


def nvfp4_rows(rng, T, kvh, D):
    k, v = make_rows(rng, "mxfp4", T, kvh, D)
    i = np.arange(D)
    if T > 3:
        # amax 2688 * 6 * 4 = 64512: s_t = 24, a group of amax 576 gets e4m3 4: x = 96 * E2M1 midpoints (ties)
        t = np.resize(np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.25, -2.5, -5.0, 0.5, 6.0, -1.75, 3.0, 1.0, 6.0],
                               np.float32), D) * np.float32(96.0)
        k[3, 0] = t
        k[2, 0, 0] = 64512.0
        v[3, 0] = np.where(i % 16 == 0, 1e-39, 1e-3 * (i % 7)).astype(np.float32)   # subnormals, tiny groups
    return k, v


def nvfp4_tie_rows(rng, k, v) -> list:
    """[(K, V)] with nvfp4_rows' ties, amax 64512 and subnormal row over moderate values, or [] for 3 tokens or
    fewer. nvfp4_rows' other rows reach 3.4e38, so the tensor's s_t there leaves no code at a tie; here the
    ties are real and the groups they mark take the exact path."""
    if k.shape[0] <= 3:
        return []
    kt, vt = (rng.standard_normal(k.shape).astype(np.float32) * np.float32(50.0) for _ in range(2))
    kt[2, 0, 0], kt[3, 0], vt[3, 0] = k[2, 0, 0], k[3, 0], v[3, 0]
    return [(kt, vt)]


@pytest.mark.parametrize("variant", ["default", "no-subgroups"])
def test_nvfp4_words_equal_the_oracle(ctx, variant):
    rt = ctx.rt
    rng = np.random.default_rng(7)
    var = fw.Variant(rt, False, None) if variant == "no-subgroups" else None
    for D, bs, lens, policy, pe, kvh in SHAPES + [(80, 16, [21, 3], "scattered", 4, 2), (16, 1, [4, 5], "contiguous", 3, 1)]:
        batch = make_batch(lens, bs, policy=policy, pad_every=pe)
        k0, v0 = nvfp4_rows(rng, batch.num_tokens, kvh, D)
        for k, v in [(k0, v0)] + nvfp4_tie_rows(rng, k0, v0):
            d = check_nvfp4(rt, batch, k, v, variant=var)
            ng = fw4.nvfp4_groups_default(rt, D)   # the default: records staged through workgroup memory at 4 groups
            assert f"-DNG={ng} " in d[-1].kernel.name and f"STAGE={int(ng >= 4)}" in d[-1].kernel.name
            check_nvfp4(rt, batch, k, v, variant=var, groups_per_lane=4)
            check_nvfp4(rt, batch, k, v, variant=var, groups_per_lane=4 * -(-D // 64))
            # s_t from its own one-invocation pass (write_nvfp4_scale.wgsl) or from every thread: the same words and tensor
            for g, sp in ((4, True), (None, False), (4, False)):
                d = check_nvfp4(rt, batch, k, v, variant=var, groups_per_lane=g, scale_pass=sp)
                assert ("nvfp4_scale_fast" in d[-2].kernel.name) == sp and f"SCALE_PASS={int(sp)}" in d[-1].kernel.name
            if variant == "default":   # each lane storing its own words
                check_nvfp4(rt, batch, k, v, stage=False)
                check_nvfp4(rt, batch, k, v, stage=False, groups_per_lane=4)
                check_nvfp4(rt, batch, k, v, stage=False, groups_per_lane=4 * -(-D // 64))


@pytest.mark.parametrize("groups", [1, 2])
def test_nvfp4_groups_a_lane_below_a_scale_word(ctx, groups):
    """1 or 2 groups a lane (write_nvfp4.wgsl SUBW): a scale word's bytes come from 4 / groups lanes through subgroup
    shuffles, and a marked group is redone in its lane before any word is written; K and V in one lane or on two (KVS). The oracle's words, staged and
    stored in place, over ties and subnormals (nvfp4_rows), head sizes 64 .. 256 (8 .. 16 lanes a row at 1 group),
    padding slots and a workgroup whose last rows are empty; head sizes not a multiple of 64 are refused."""
    rt = ctx.rt
    if not fw.subgroups_available(rt):
        pytest.skip("no subgroups on this adapter: the writer refuses 1 or 2 groups a lane (tested below)")
    rng = np.random.default_rng(21)
    for D, lens, kvh in ((128, [21, 0, 6], 3), (64, [9, 4], 2), (192, [5, 17], 1), (256, [3], 2)):
        batch = make_batch(lens, 16, policy="scattered", pad_every=4, seed=D)
        k, v = nvfp4_rows(rng, batch.num_tokens, kvh, D)
        for (k, v), stage, kvs in ((r, s, x) for r in [(k, v)] + nvfp4_tie_rows(rng, k, v) for s in (True, False)
                                   for x in (False, True)):
            d = check_nvfp4(rt, batch, k, v, groups_per_lane=groups, stage=stage, kv_split=kvs)
            assert f"-DNG={groups} " in d[-1].kernel.name and "SUBW=1" in d[-1].kernel.name
            assert f"KVS={int(kvs)}" in d[-1].kernel.name
    batch = make_batch([4], 16)
    k, v = nvfp4_rows(rng, batch.num_tokens, 1, 80)
    with pytest.raises(InvalidInput, match="multiple of 64"):
        run_nvfp4(rt, batch, k, v, groups_per_lane=groups)


def test_nvfp4_near_rule_with_an_inexact_divider(ctx):
    """1/s_t and 1/e4m3 moved 3 ulp (a driver's inexact division): the 16-ulp check still gives the exact codes."""
    rt = ctx.rt
    batch = make_batch([30, 7], 16, policy="scattered", pad_every=5)
    rng = np.random.default_rng(8)
    k, v = nvfp4_rows(rng, batch.num_tokens, 2, 128)
    saved = fw4.nvfp4_spec
    fw4.nvfp4_spec = lambda *a, **kw: saved(*a, **kw).define(INV_ULPS=3)
    try:
        for k, v in [(k, v)] + nvfp4_tie_rows(rng, k, v):
            check_nvfp4(rt, batch, k, v)
            check_nvfp4(rt, batch, k, v, stage=False)
    finally:
        fw4.nvfp4_spec = saved


def test_two_dimensional_grid(ctx):
    """Grid limit 16: more workgroups than that take one dispatch on a 2-D grid, exact."""
    rt = ctx.rt
    saved = dict(rt.limits)
    rt.limits["max-compute-workgroups-per-dimension"] = 16
    try:
        batch = make_batch([300, 1, 150], 16, policy="scattered", pad_every=9)
        rng = np.random.default_rng(3)
        for name in ("q8_0", "q5_1"):
            k, v = make_rows(rng, name, batch.num_tokens, 2, 256)
            d = check_ggml(rt, name, batch, k, v)
            assert len(d) == 1 and d[0].grid[1] > 1 and max(d[0].grid) <= 16
        k, v = nvfp4_rows(rng, batch.num_tokens, 2, 256)
        d = check_nvfp4(rt, batch, k, v)
        # the amax pass strides over the rows (AMAX_BLOCKS row blocks a workgroup): its grid is only kept in bounds;
        # at one block a workgroup it takes a 2-D grid too (then the one-invocation scale pass, then the writer)
        assert len(d) == 2 + fw4.NVFP4_SCALE_PASS and all(max(x.grid) <= 16 for x in d) and d[-1].grid[1] > 1
        blocks, fp8_kernels.AMAX_BLOCKS = fp8_kernels.AMAX_BLOCKS, 1
        try:
            d = check_nvfp4(rt, batch, k, v)
        finally:
            fp8_kernels.AMAX_BLOCKS = blocks
        assert all(x.grid[1] > 1 and max(x.grid) <= 16 for x in d if "nvfp4_scale_fast" not in x.kernel.name)
    finally:
        rt.limits.clear()
        rt.limits.update(saved)


# ------------------------------------------------------------------------------ through the methods
@pytest.mark.parametrize("mid", ["q8_0", "iq4_nl", "mxfp4", "nvfp4"])
def test_methods_write_with_the_fast_writer(ctx, mid):
    """quantize() runs the fast writer (impl "fast") and its words equal the first-wave writer's; the timed
    rows list both writers with role "writer"."""
    m = get_method(mid)
    batch = make_batch([20, 0, 7], 16, policy="scattered", pad_every=6)
    k, v = (nvfp4_rows if mid == "nvfp4" else (lambda r, T, h, D: make_rows(r, mid, T, h, D)))(
        np.random.default_rng(11), batch.num_tokens, 2, 128)
    qkv = m.quantize(ctx, batch, k, v)
    qc = qkv.device["cache"]
    assert qc.extra["writer_impl"] == "fast"
    fast = [qk.read_cache(ctx.rt, qc, w) for w in ("K", "V")]
    m2 = get_method(mid)
    m2.writer_impl = "first-wave"
    q2 = m2.quantize(ctx, batch, k, v)
    assert q2.device["cache"].extra["writer_impl"] == "first-wave"
    for a, b in zip(fast, [qk.read_cache(ctx.rt, q2.device["cache"], w) for w in ("K", "V")]):
        np.testing.assert_array_equal(a, b)
    q = np.random.default_rng(1).standard_normal((batch.num_seqs, 4, 128)).astype(np.float32)
    rows = m.timed_kernels(ctx, batch, k, v, q, 0.1, qkv)
    w = [(r.name, r.impl) for r in rows if r.role == "writer"]
    assert w == [(f"{mid} writer", "first-wave"), (f"{mid} writer (fast)", "fast")], w


def test_iq4_fast_division_is_div_rn(ctx):
    """common/quant.wgsl's div_fast (the fast writers' divisions: a float estimate of the significands' quotient
    corrected on the exact remainder) gives div_rn's bits, i.e. IEEE float32 a / b, over random operands of every exponent
    (subnormals, overflow to inf, underflow to subnormals and zero) and iq4_nl's own operands."""
    from kvviz.gpu.runtime import STORAGE_RO, STORAGE_RW, Dispatch
    from kvviz.gpu.shaders import ShaderSpec, resolve_includes

    rt = ctx.rt
    src = resolve_includes('// #include "common/quant.wgsl"\n', "test") + """
@group(0) @binding(0) var<storage, read> ab: array<vec2<u32>>;
@group(0) @binding(1) var<storage, read_write> res: array<vec2<u32>>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) g: vec3<u32>) {
  let i = g.x;
  if (i >= arrayLength(&res)) { return; }
  let a = bitcast<f32>(ab[i].x);
  let b = bitcast<f32>(ab[i].y);
  res[i] = vec2<u32>(div_fast_bits(a, b), div_rn_bits(a, b));
}
"""
    kern = rt.kernel(ShaderSpec("tests/iq4_div_fast_probe.wgsl"), [STORAGE_RO, STORAGE_RW], 0, _source=src)
    rng = np.random.default_rng(5)
    n = 1 << 18

    def finite(bits):
        return bits[((bits >> 23) & 0xFF) != 0xFF]

    r = lambda k: rng.integers(0, 1 << 32, k, dtype=np.uint64).astype(np.uint32)  # noqa: E731
    a = [finite(r(n)), finite(r(n)) & np.uint32(0x807FFFFF), finite(r(n))]          # any, subnormal, any
    b = [finite(r(n)), finite(r(n)), finite(r(n)) & np.uint32(0x807FFFFF)]          # any, any, subnormal
    small = (rng.integers(-134, -119, n).astype(np.float32)).view(np.uint32)         # the trials' numerators
    mx = (rng.standard_normal(n) * 10.0 ** rng.uniform(-15, 6, n)).astype(np.float32).view(np.uint32)
    a.append(small), b.append(mx)
    a.append(np.full(n, np.float32(1.0)).view(np.uint32)), b.append(mx)
    m = min(len(x) for x in a + b)
    A = np.concatenate([x[:m] for x in a])
    B = np.concatenate([x[:m] for x in b])
    keep = (B & np.uint32(0x7FFFFFFF)) != 0
    A, B = A[keep], B[keep]
    with np.errstate(all="ignore"):
        want = (A.view(np.float32) / B.view(np.float32)).view(np.uint32)
    ab = rt.upload(np.stack([A, B], 1).reshape(-1), "ab")
    out = rt.upload(np.zeros(2 * len(A), np.uint32), "res")
    rt.run([Dispatch(kern, [ab, out], (-(-len(A) // 64), 1, 1))])
    got = rt.read(out, np.uint32, (len(A), 2))
    bad = np.flatnonzero(got[:, 0] != want)
    assert bad.size == 0, [(hex(A[i]), hex(B[i]), hex(got[i, 0]), hex(want[i])) for i in bad[:4]]
    assert (got[:, 1] == want).all()


def test_mxfp4_exponent_formula(ctx):
    """write_ggml.wgsl's mxfp4_e (floor(log2f(amax)) - 2 + 127 by a formula, not a table) equals gguf's
    np.floor(np.log2(amax)) - 2 + 127 and kvviz/families/ggml/format.py log2_up_table for every non-tiny exponent, at
    the mantissas around each rounding threshold and at random ones."""
    import re

    from kvviz.gpu.runtime import STORAGE_RO, STORAGE_RW, Dispatch
    from kvviz.gpu.shaders import SHADER_DIR, ShaderSpec, resolve_includes

    rt = ctx.rt
    text = (SHADER_DIR / "ggml/write_fast.wgsl").read_text()
    fn = re.search(r"^fn mxfp4_e\(.*?^}\n", text, re.S | re.M).group(0)
    src = resolve_includes('// #include "common/quant.wgsl"\n', "test") + fn + """
@group(0) @binding(0) var<storage, read> a: array<u32>;
@group(0) @binding(1) var<storage, read_write> res: array<u32>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) g: vec3<u32>) {
  if (g.x < arrayLength(&res)) { res[g.x] = mxfp4_e(a[g.x]); }
}
"""
    kern = rt.kernel(ShaderSpec("tests/mxfp4_e_probe.wgsl"), [STORAGE_RO, STORAGE_RW], 0, _source=src)
    tab = fg.log2_up_table().astype(np.int64)
    rng = np.random.default_rng(9)
    bits = []
    for be in range(27, 255):   # amax >= 2^-100 (TINY): be >= 27
        m = np.concatenate([tab[be] + np.arange(-3, 3), [0, 1, (1 << 23) - 1], rng.integers(0, 1 << 23, 8)])
        m = m[(m >= 0) & (m < (1 << 23))]
        bits.append((be << 23) | m)
    A = np.concatenate(bits).astype(np.uint32)
    ab = rt.upload(A, "a")
    out = rt.upload(np.zeros(len(A), np.uint32), "res")
    rt.run([Dispatch(kern, [ab, out], (-(-len(A) // 64), 1, 1))])
    got = rt.read(out, np.uint32, (len(A),))
    want = (np.floor(np.log2(A.view(np.float32))) - 2 + 127).astype(np.int64)
    assert (want == (A >> 23).astype(np.int64) - 2 + ((A & 0x7FFFFF) >= tab[A >> 23])).all()
    bad = np.flatnonzero(got != want)
    assert bad.size == 0, [(hex(A[i]), int(got[i]), int(want[i])) for i in bad[:4]]
