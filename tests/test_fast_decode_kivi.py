"""Conformance of the fast split-K KIVI decode (kvviz/families/kivi/decode.py) on the local adapter.

The caches are written by the method itself (Kivi.quantize: the GPU writers) and read back
(Kivi.read_buffers); the words read back must equal the method's oracle's (kvviz.families.kivi.oracle.write_buffers),
and the decode's reference is the method's attention oracle over those words: the oracle's dequantisation
(f32 code*scale + zero per key group / per token, the f32 residual rows) through the f32 paged decode's
arithmetic in float64 (kvviz.attention.paged_oracle.decode, as kvviz.families.kivi.oracle.method_attention does).

Tolerance: |fast - oracle| <= 2e-5 * max(1, max |V^|), V^ = the dequantised values (the f32 fast decodes'
bound, fast_decode.f32_tolerance): f32 accumulation in another order, exp2 for exp, the key's scale and zero
folded into the query (q.k = (q*s).code + q.z) and the value's zero summed apart (p*z), and the oracle's
seed normaliser (sum + 1e-6) against the kernel's exact division.
Grid: bits 2 / 4; head sizes 64, 128, the padded 120 (runs at 128), and 80 / 112 (lanes not owning whole
code words); block sizes 8, 16, 32, 64;
GQA 1, 4, 8; recent 0, 16, 128; ragged lengths with 0, 1, 31, 32, 33; scattered block tables; a 20000+
token context; zeros; values ~1e4; one partition and many; the variant without subgroups; the prefetching
(software-pipelined) kernel bit for bit against the single-buffered one, and its default; and the method's
attend / timed rows. Few distinct kernels on purpose: lavapipe compiles each one for seconds (one or two lanes
a row at head 80 / 112 took minutes, hence fast_decode_kivi's 4-channel lane split), so the cases share them.
"""
from __future__ import annotations

import numpy as np
import pytest

from kvviz.errors import DeviceLimitError, InvalidInput, UnsupportedShape
from kvviz.families.kivi import format as kl
from kvviz.families.int4.format import unpack_codes
from kvviz.attention import split_decode as fd
from kvviz.families.kivi import decode as fk
from kvviz.methods.base import get_method
from kvviz.families.kivi import oracle as okv
from kvviz.attention import paged_oracle as O
from kvviz.paging import make_batch

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def fast(rt):
    return fk.KiviFastDecode(rt)


def dequantised_caches(bufs, batch, bits, recent, kvh, D):
    """f32 paged caches [num_blocks, kvh, bs, D] (K^, V^) decoded from the words read back: codes, each key
    group's (scale, zero) from the side stream, each token's V (scale, zero), the residual rows; as the
    oracle dequantises (f32 code*scale + zero)."""
    bs = batch.block_size
    KW, WS = kl.kw(D, bits), kl.ws(D, bs)
    p = kl.plan(batch.context_lens, recent)
    nb = batch.num_blocks
    fk_ = np.zeros((nb, kvh, bs, D), np.float32)
    fv_ = np.zeros_like(fk_)
    kcw = bufs["k"][:, :, : bs * KW].reshape(nb, kvh, bs, KW)
    vr = bufs["v"].reshape(nb, kvh, bs, KW + 2)
    for s in range(batch.num_seqs):
        L, nq, r0 = int(p.context_lens[s]), int(p.n_q[s]), int(p.res_off[s])
        blocks = np.asarray(batch.seq_blocks[s], np.int64)
        pos = np.arange(L)
        b, o = blocks[pos // bs], pos % bs
        if nq:
            ng = nq // kl.GROUP
            idx = np.arange(ng * 2 * D)
            side = bufs["k"][blocks[idx // WS], :, bs * KW + idx % WS]  # [ng*2D, kvh]
            side = np.ascontiguousarray(side.T).view(np.float32).reshape(kvh, ng, D, 2)
            g = np.arange(nq) // kl.GROUP
            kc = unpack_codes(kcw[b[:nq], :, o[:nq]], bits).astype(np.float32)  # [nq, kvh, D]
            ks, kz = side[..., 0][:, g].transpose(1, 0, 2), side[..., 1][:, g].transpose(1, 0, 2)  # [nq, kvh, D]
            fk_[b[:nq], :, o[:nq]] = (kc * ks + kz).astype(np.float32)
            rec = vr[b[:nq], :, o[:nq]]  # [nq, kvh, KW + 2]
            vc = unpack_codes(rec[..., :KW], bits).astype(np.float32)
            vs = np.ascontiguousarray(rec[..., KW]).view(np.float32)[..., None]
            vz = np.ascontiguousarray(rec[..., KW + 1]).view(np.float32)[..., None]
            fv_[b[:nq], :, o[:nq]] = (vc * vs + vz).astype(np.float32)
        fk_[b[nq:], :, o[nq:]] = bufs["res"][r0 : r0 + L - nq, 0]
        fv_[b[nq:], :, o[nq:]] = bufs["res"][r0 : r0 + L - nq, 1]
    return fk_, fv_


def make_kv(rng, T, kvh, D, k_amp=1.0, v_amp=1.0, zeros=False):
    if zeros:
        z = np.zeros((T, kvh, D), np.float32)
        return z, z.copy()
    k = (rng.standard_normal((T, kvh, D)) * k_amp).astype(np.float32)
    v = (rng.standard_normal((T, kvh, D)) * v_amp).astype(np.float32)
    return k, v


def check(ctx, fast, bits, recent, D, bs, kvh, G, lens, *, seed=0, k_amp=1.0, v_amp=1.0, q_amp=1.0, zeros=False,
          words=True, **kw):
    """Quantise with the method, decode with the fast kernel, compare with the oracle over the words read back.
    Returns (plan, output [S, H, D], max error / tolerance)."""
    rng = np.random.default_rng(seed)
    m = get_method("kivi", bits=bits, recent=recent)
    batch = make_batch(lens, bs, policy="scattered", seed=seed)
    k, v = make_kv(rng, int(sum(lens)), kvh, D, k_amp, v_amp, zeros)
    H = kvh * G
    q = (rng.standard_normal((len(lens), H, D)) * q_amp).astype(np.float32)
    scale = D ** -0.5
    qkv = m.quantize(ctx, batch, k, v)
    qc = qkv.device["cache"]
    Dp = qc.head_size
    assert Dp == -(-D // 16) * 16
    qp = m._pad_q(q, Dp)
    bufs = m.read_buffers(ctx, qkv)
    if words:  # the words read back are the method's oracle's
        kp, vp, _ = okv.pad_head(k, v)
        ref_words = okv.write_buffers(batch, kp, vp, bits, recent)
        np.testing.assert_array_equal(bufs["k"], ref_words["k"])
        np.testing.assert_array_equal(bufs["v"], ref_words["v"])
        n = max(1, ref_words["plan"].total_res)
        np.testing.assert_array_equal(bufs["res"][:n].view(np.uint32), ref_words["res"][:n].view(np.uint32))
    fkc, fvc = dequantised_caches(bufs, batch, bits, recent, kvh, Dp)
    ref = O.decode(qp.astype(np.float64), fkc.astype(np.float64), fvc.astype(np.float64), batch.block_tables,
                   batch.context_lens, bs, scale)
    plan = fast.plan(bits, qc.k, qc.v, qc.extra["res"], kvh, qp, batch, scale, seq_plan=qc.extra["plan"],
                     info=qc.extra["info"], **kw)
    ctx.rt.run(plan.dispatches)
    out = fast.read(plan)
    assert out.shape == (len(lens), H, Dp) and np.isfinite(out).all()
    tol = fk.tolerance(float(np.abs(fvc).max(initial=0.0)))
    err = float(np.abs(out - ref).max(initial=0.0))
    for s, L in enumerate(lens):
        if L == 0:
            assert not out[s].any(), "an empty sequence must give 0"
    assert err <= tol, (f"bits {bits} recent {recent} D{D} bs{bs} G{G} kvh{kvh} lens {lens[:6]}: max error "
                        f"{err:.3g} > {tol:.3g} ({plan.describe()})")
    print(f"\n[fast kivi] bits {bits} recent {recent} D{D} bs{bs} G{G} kvh{kvh}: {err / tol:.2e} of the tolerance; "
          f"{plan.describe()}")
    return plan, out[..., :D], err / tol


RAGGED = [31, 32, 33, 1, 0, 150]
GRID = [  # bits, recent, head size, block size, kv heads, G, lens (few distinct kernels: lavapipe compiles slowly)
    (2, 0, 64, 8, 2, 1, RAGGED),
    (4, 16, 64, 16, 1, 4, [1, 31, 32, 33, 0, 77]),
    (2, 128, 128, 32, 1, 8, [200, 33, 0, 161]),
    (4, 128, 128, 64, 2, 1, [300, 31, 1]),
    (2, 16, 120, 16, 2, 4, [65, 32, 0, 1, 97]),
    (4, 0, 120, 32, 1, 1, [96, 1, 33]),
    (4, 0, 128, 8, 2, 4, RAGGED),
    (2, 16, 64, 64, 1, 1, [130, 0, 32]),
    (4, 16, 80, 8, 2, 1, [96, 33, 1, 0]),  # 80 / 112: lanes of 20 / 28 channels, not whole code words
    (2, 0, 112, 32, 2, 1, [64, 31, 65]),
]


@pytest.mark.parametrize("bits,recent,D,bs,kvh,G,lens", GRID,
                         ids=[f"b{b}-r{r}-D{d}-bs{bs}-kvh{h}-G{g}" for b, r, d, bs, h, g, _ in GRID])
def test_grid(ctx, fast, bits, recent, D, bs, kvh, G, lens):
    check(ctx, fast, bits, recent, D, bs, kvh, G, lens, seed=D + bs + G + bits)


def test_long_context(ctx, fast):
    """20000+ tokens: many partitions (each within lavapipe's loop budget), the residual in the last one."""
    L = 20000 + 17
    plan, _, _ = check(ctx, fast, 2, 128, 64, 16, 1, 1, [L, 45], seed=5, words=False)
    assert plan.num_partitions > 8 and plan.partition_tokens % 32 == 0


def test_partitions_single_and_many(ctx, fast):
    """Partitions of one key group each and one partition for everything: the same output within tolerance."""
    lens = [700, 1, 0, 333]
    a, out_a, _ = check(ctx, fast, 4, 16, 128, 16, 2, 1, lens, seed=3, partition_tokens=32)
    assert a.num_partitions == -(-700 // 32) and a.tokens_per_group_row == 8
    b, out_b, _ = check(ctx, fast, 4, 16, 128, 16, 2, 1, lens, seed=3, partition_tokens=4096)
    assert b.tokens_per_group_row == 32
    assert b.num_partitions == 1
    assert np.abs(out_a - out_b).max() <= 2 * fk.tolerance(float(np.abs(out_b).max()))


def test_unroll_one(ctx, fast):
    """One token a row group per step (the default is 2)."""
    check(ctx, fast, 2, 16, 64, 16, 1, 1, [97, 32, 0], seed=8, unroll=1)


def test_no_subgroups_variant(ctx, fast):
    """One lane a token row, no shuffles: the fallback for adapters without subgroups."""
    assert fast.layout(2, 128, 4, subgroups=False).lanes == 1
    # a small head: one lane owns the whole row, and lavapipe's compile time grows fast with D x G
    check(ctx, fast, 4, 16, 32, 16, 2, 1, [5, 300, 0, 33], seed=4, subgroups=False)


def test_zeros(ctx, fast):
    """All-zero keys and values (degenerate groups): exactly zero out."""
    _, out, _ = check(ctx, fast, 2, 16, 64, 16, 1, 1, [100, 1, 32], zeros=True)
    assert not out.any()


def test_large_values(ctx, fast):
    """Keys and values around 1e4 (logits of order one), and values around 1e4 with unit keys."""
    check(ctx, fast, 4, 16, 128, 16, 2, 4, [150, 33, 1], seed=11, k_amp=1e4, v_amp=1e4, q_amp=1e-4)
    check(ctx, fast, 2, 0, 64, 32, 1, 1, [200, 31], seed=12, v_amp=1e4)
    # logits in the tens (a peaked softmax): the online max and the merges must hold
    check(ctx, fast, 4, 16, 128, 16, 2, 1, [300, 40], seed=13, k_amp=4.0, q_amp=6.0, partition_tokens=64)


def test_refuses_bad_input(ctx, fast, rt):
    m = get_method("kivi", bits=2, recent=0)
    batch = make_batch([64, 3], 16, seed=1)
    k = np.ones((67, 1, 64), np.float32)
    qkv = m.quantize(ctx, batch, k, k)
    qc = qkv.device["cache"]
    args = (qc.k, qc.v, qc.extra["res"], 1)
    q = np.ones((2, 4, 64), np.float32)
    kw = dict(seq_plan=qc.extra["plan"])
    with pytest.raises(UnsupportedShape, match="bits 3"):
        fast.plan(3, *args, q, batch, 0.1, **kw)
    with pytest.raises(UnsupportedShape, match="GQA group of 17"):
        fast.plan(2, *args, np.ones((2, 17, 64), np.float32), batch, 0.1, **kw)
    with pytest.raises(UnsupportedShape, match="multiple of 16"):
        fast.plan(2, *args, np.ones((2, 4, 72), np.float32), batch, 0.1, **kw)
    assert "block size 4" in fk.unsupported(2, 16, 1, 4) and not fk.unsupported(2, 16, 1, 8)
    with pytest.raises(InvalidInput, match="sequences"):
        fast.plan(2, *args, np.ones((3, 4, 64), np.float32), batch, 0.1, **kw)
    with pytest.raises(InvalidInput, match="scale"):
        fast.plan(2, *args, q, batch, float("nan"), **kw)
    with pytest.raises(InvalidInput, match="context lengths"):
        fast.plan(2, *args, q, batch, 0.1, seq_plan=kl.plan([64, 4], 0))
    with pytest.raises(InvalidInput, match="needs"):
        fast.plan(2, rt.empty(64, "tiny"), *args[1:], q, batch, 0.1, **kw)
    if rt.loop_limit is not None:
        with pytest.raises(DeviceLimitError, match="loop limit"):
            fast.plan(2, *args, q, batch, 0.1, partition_tokens=64 * 1024 * 1024, subgroups=False, rows=1, **kw)


def test_method_attend_and_timed_rows(ctx):
    """Kivi.attend runs the fast decode (head 120 padded to 128, the padding cut back) and agrees with the
    method's end-to-end oracle; a shape it cannot take (D*bs not a multiple of 128) keeps the first-wave path;
    timed_kernels lists the fast decode beside the dequantise + f32 decode and decode_time picks it."""
    from kvviz.gpu.timed import decode_kernels

    rng = np.random.default_rng(21)
    for D, bs, lens in ((120, 16, [90, 33, 0, 1]), (16, 4, [70, 5])):
        m = get_method("kivi", bits=4, recent=16)
        batch = make_batch(lens, bs, policy="scattered", seed=2)
        k, v = make_kv(rng, sum(lens), 2, D)
        q = rng.standard_normal((len(lens), 8, D)).astype(np.float32)
        qkv = m.quantize(ctx, batch, k, v)
        out = m.attend(ctx, qkv, batch, q, D ** -0.5)
        ref, tol = okv.method_attention(m, batch, k, v, q, D ** -0.5)
        assert out.shape == (len(lens), 8, D)
        assert float(np.abs(out - ref).max()) <= tol
        fast_ok = not fk.unsupported(4, m.padded_head(D), 4, bs)
        assert fast_ok == (D == 120)
        rows = m.timed_kernels(ctx, batch, k, v, q, D ** -0.5, qkv)
        names = [r.name for r in rows]
        assert any(n.startswith("paged_attn_f32") for n in names) and "kivi dequantise" in names
        fast_rows = [r for r in rows if r.impl == "fast" and r.role == "decode"]
        if fast_ok:
            assert len(fast_rows) == 1 and fast_rows[0].name.startswith("fast_decode_kivi (")
            assert fast_rows[0].bytes > 0 and fast_rows[0].flops > 0
            pick, deq, impl = decode_kernels(rows)
            assert pick == fast_rows and deq == [] and impl == "fast"
            # the timed dispatches compute the same output as attend
            ctx.rt.run(fast_rows[0].dispatches)
            got = ctx.rt.read(fast_rows[0].dispatches[-1].buffers[-1], np.float32, (len(lens), 8, 128))[..., :D]
            np.testing.assert_array_equal(got, out)
        else:
            assert fast_rows == []


PREFETCH_CASES = [  # bits, recent, head size, block size, kv heads, G, lens, plan options, sweeps a partition
    # many partitions of one key group (TG 8: four row groups share a group; most row groups masked), a block
    # size that is not a power of two, the window's partial last step
    (2, 16, 64, 6, 2, 1, [97, 0, 1, 33, 64], dict(partition_tokens=32), 1),
    # GQA 4, two row groups of 32 tokens: 2 sweeps of 2 key groups a partition, so a row group's last step of a
    # group prefetches the next sweep's group (clamped to g1 - 1 past it: 100 tokens = 3 groups); the second
    # partition of 150 has no key group (the prologue's clamped loads); block 24
    (4, 0, 64, 24, 1, 4, [1, 150, 0, 100, 31], dict(partition_tokens=128, rows=2), 2),
    # 4 tokens a step, 4 row groups: 2 sweeps in the first partition of 300 (5 key groups, then the window)
    (4, 128, 32, 12, 2, 4, [300, 129, 0, 1, 161], dict(unroll=4, rows=4), 2),
    # head 80: lanes of 20 channels, one code word a vec4 (not whole words a lane)
    (4, 16, 80, 8, 2, 1, [96, 33, 1, 0], dict(partition_tokens=64), 1),
]


@pytest.mark.parametrize("bits,recent,D,bs,kvh,G,lens,kw,sweeps", PREFETCH_CASES,
                         ids=[f"b{c[0]}-r{c[1]}-D{c[2]}-bs{c[3]}-G{c[5]}" for c in PREFETCH_CASES])
def test_prefetch_bit_identical(ctx, fast, bits, recent, D, bs, kvh, G, lens, kw, sweeps):
    """The software-pipelined quantised loop (the next step's block-table reads and K / V words loaded before
    this step's arithmetic, the next sweep's key group at a group's last step) does the same arithmetic: bit
    for bit the single-buffered kernel's output, over ragged lengths with an empty and a single-token sequence,
    partitions past a sequence's end and partitions with no key group (the prologue's clamped loads)."""
    a, out_a, _ = check(ctx, fast, bits, recent, D, bs, kvh, G, lens, seed=bs + G, words=False, prefetch=True, **kw)
    b, out_b, _ = check(ctx, fast, bits, recent, D, bs, kvh, G, lens, seed=bs + G, words=False, prefetch=False, **kw)
    assert a.prefetch and not b.prefetch and a.layout == b.layout
    np.testing.assert_array_equal(out_a, out_b)
    gps = a.layout.row_groups // (kl.GROUP // a.tokens_per_group_row)  # key groups a sweep
    assert -(-a.partition_tokens // kl.GROUP // gps) == sweeps
    # the default takes the prefetching kernel at these layouts (a few words a lane a step)
    assert fk.prefetch_words(bits, a.layout) <= fd.PREFETCH_MAX_WORDS
    c = fast.plan(bits, *a.dispatches[0].buffers[1:4], kvh, np.zeros((len(lens), kvh * G, a.shape[2]), np.float32),
                  make_batch(lens, bs, policy="scattered", seed=bs + G), 0.1, recent, **kw)
    assert c.prefetch == fd.PREFETCH and c.dispatches[0].kernel is (a if fd.PREFETCH else b).dispatches[0].kernel


def test_prefetch_default(fast, monkeypatch):
    """prefetch None resolves where a lane's words of a step fit fast_decode.PREFETCH_MAX_WORDS (as the ggml
    decode's): on for the subgroup layouts (a few code words a lane), off for the one-lane layout of a large
    head (a whole row's words a lane); True / False force it; fast_decode.PREFETCH False turns the default off."""
    for bits, D in ((2, 128), (4, 128), (2, 64), (4, 256)):
        lay = fast.layout(bits, D, 4, subgroups=True)
        words = fk.prefetch_words(bits, lay)
        assert words == lay.unroll * (2 * (lay.dims_per_lane // (32 // bits)) + 2)
        assert fk.use_prefetch(bits, lay) == (fd.PREFETCH and words <= fd.PREFETCH_MAX_WORDS)
        if lay.lanes >= 8:  # a code word or two a lane a step
            assert fk.use_prefetch(bits, lay) == fd.PREFETCH
    wide = fast.layout(4, 128, 4, subgroups=False)
    assert wide.lanes == 1 and fk.prefetch_words(4, wide) == 2 * (2 * 16 + 2) > fd.PREFETCH_MAX_WORDS
    assert not fk.use_prefetch(4, wide) and fk.use_prefetch(4, wide, True)
    lay80 = fast.layout(4, 80, 1)  # lanes not owning whole code words (when subgroups split it): a word a vec4
    if lay80.dims_per_lane % 8:
        assert fk.prefetch_words(4, lay80) == lay80.unroll * (2 * (lay80.dims_per_lane // 4) + 2)
    lay = fast.layout(2, 128, 4)
    assert not fk.use_prefetch(2, lay, False)
    monkeypatch.setattr(fd, "PREFETCH", False)
    assert not fk.use_prefetch(2, lay) and fk.use_prefetch(2, lay, True)
    # the explicit False renders the single-buffered kernel, True the pipelined one
    assert "nkw0_0" in fk.render(2, 128, 4, lay, 32, 16, True)["QSTEP"]
    assert "nkw0_0" not in fk.render(2, 128, 4, lay, 32, 16, False)["QSTEP"]


@pytest.mark.parametrize("bits,recent,D,bs,kvh,G,lens,kw", [
    (2, 16, 64, 16, 1, 4, [1, 31, 32, 33, 0, 77], {}),
    (4, 16, 64, 8, 2, 3, [96, 33, 1, 0], {"unroll": 4}),  # G x U = 12: padded to 16 slots
    (2, 0, 64, 16, 1, 16, [65, 0, 40], {}),  # 32 slots over 8 lanes: a lane owns 4
], ids=["G4", "G3-U4", "G16"])
def test_scatter_and_all_lane_softmax(ctx, fast, bits, recent, D, bs, kvh, G, lens, kw):
    """fast_decode's reduce-scatter softmax (the default) and the all-lane one, each against the oracle, in
    both loops (the quantised key groups with their V zeros' sums kept by the owners, and the f32 window)."""
    for scatter in (True, False):
        check(ctx, fast, bits, recent, D, bs, kvh, G, lens, seed=11, words=False, q_amp=3.0, scatter=scatter, **kw)
