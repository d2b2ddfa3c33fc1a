"""The fast split-K KIVI decode (kvviz/families/kivi/decode.py) through the method (attend, timed rows, the
first-wave path where it cannot), and its software-pipelined kernel bit for bit against the single-buffered one,
and the prefetch default. The caches are the method's own, held to kvviz.families.kivi.oracle.write_buffers word for word
and the decode to the method's attention oracle (tests/harness.py kivi_check, tolerance 2e-5 * max(1, max |V^|)).
The scenarios every fast decode shares (bits 2 / 4, recent 0 / 16 / 128, heads 64..128 with the padded 120 and
80 / 112, block sizes 8..64, GQA 1..8, ragged and scattered; a 20000+ token context; one partition and many;
zeros and values ~1e4; the softmax variants; no subgroups; bad input) are in tests/test_conformance.py.
"""
from __future__ import annotations

import numpy as np
import pytest

from kvviz.families.kivi import format as kl
from kvviz.attention import split_decode as fd
from kvviz.families.kivi import decode as fk
from kvviz.families.registry import get_method
from kvviz.families.kivi import oracle as okv
from kvviz.paging import make_batch

import harness

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def fast(rt):
    return harness.decoder(rt, "fast_decode_kivi", "KiviFastDecode")


def test_method_attend_and_timed_rows(ctx):
    """Kivi.attend runs the fast decode (head 120 padded to 128, the padding cut back) and agrees with the
    method's end-to-end oracle; a shape it cannot take (D*bs not a multiple of 128) keeps the first-wave path;
    timed_kernels lists the fast decode beside the dequantise + f32 decode and decode_time picks it."""
    from kvviz.gpu.timed import decode_kernels

    rng = np.random.default_rng(21)
    for D, bs, lens in ((120, 16, [90, 33, 0, 1]), (16, 4, [70, 5])):
        m = get_method("kivi", bits=4, recent=16)
        batch = make_batch(lens, bs, policy="scattered", seed=2)
        k, v = harness.kivi_kv(rng, sum(lens), 2, D)
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
    case = dict(bits=bits, recent=recent, D=D, bs=bs, kvh=kvh, G=G, lens=lens, seed=bs + G, words=False, **kw)
    ra = harness.kivi_check(ctx, prefetch=True, **case)
    rb = harness.kivi_check(ctx, prefetch=False, **case)
    a, out_a, b, out_b = ra.plan, ra.out, rb.plan, rb.out
    assert a.prefetch and not b.prefetch and a.layout == b.layout
    np.testing.assert_array_equal(out_a, out_b)
    gps = a.layout.row_groups // (kl.GROUP // a.tokens_per_group_row)  # key groups a sweep
    assert -(-a.partition_tokens // kl.GROUP // gps) == sweeps
    # the unrolled kernel's default takes the prefetching kernel at these layouts (a few words a lane a step); the
    # adapter's default is the looped kernel on a software rasteriser (fast_decode.use_looped)
    assert fk.prefetch_words(bits, a.layout) <= fd.PREFETCH_MAX_WORDS
    args = (bits, *a.dispatches[0].buffers[1:4], kvh, np.zeros((len(lens), kvh * G, a.shape[2]), np.float32),
            make_batch(lens, bs, policy="scattered", seed=bs + G), 0.1, recent)
    c = fast.plan(*args, looped=False, **kw)
    assert c.prefetch == fd.PREFETCH and c.dispatches[0].kernel is (a if fd.PREFETCH else b).dispatches[0].kernel
    assert fast.plan(*args, **kw).looped == fd.use_looped(ctx.rt) and not a.looped


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

