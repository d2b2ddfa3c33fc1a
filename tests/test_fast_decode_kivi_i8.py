"""Conformance of the fast KIVI decode's int8-query variant (kvviz/families/kivi/decode.py, qk="i8", default off).

Oracle: kvviz.families.kivi.oracle.attention_i8 over the words the method's writers made (read back and decoded,
harness.kivi_seq_fields; the words themselves held to oracle.write_buffers): the query pre-scaled and times each key
group's scales in float32 as the kernel makes it, requantised by oracle.requantize_query (the kernel's codes bit for
bit), then the float64 attention over those codes. Tolerance: the f32 kernel's, 2e-5 x max(1, max |V^|) (the module
docstring of kvviz/families/kivi/decode.py says why). Every output is also compared with the exact-query oracle: it
must differ (the variant really quantised the query) by no more than the requantisation moves the logits.
Grid: bits 2 and 4; heads 64, 128 and 80 / 112 (lanes that do not own whole code words, padded lanes); GQA 1 and 4;
recent 0, 16, 128; lengths 0, 1, 31, 32, 33 and longer; 20017 tokens; large, tiny and all-zero queries; exact ties of
the rounding and codes clamped to 127; the all-lane softmax, 4 tokens a step, no prefetch (bit for bit), no subgroups;
the requantiser on its own (a probe kernel) over every exponent; the refusals. The kernels are the unrolled ones, so
the shapes are chosen for what they reach (lavapipe builds each in seconds).
"""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from kvviz.attention import split_decode as fd
from kvviz.errors import InvalidInput
from kvviz.families.kivi import decode as fk
from kvviz.families.kivi import oracle as okv
from kvviz.families.registry import get_method
from kvviz.paging import make_batch

import harness

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def fast(rt):
    return harness.decoder(rt, "fast_decode_kivi", "KiviFastDecode")


def requant_shift(fields, q, scale, kvh):
    """Per (sequence, head): the largest |logit| change (base 2) the requantisation makes over the sequence's quantised
    tokens, max_t sum_c |code_c step - qk_c| K code_{t,c}; and every channel's rounding checked: at most step / 2, at
    most a step where the code clamps to 127 (a group whose step is 0 has codes 0 and |qk| < 2^-119)."""
    S, H, D = q.shape
    G = H // kvh
    q2 = okv.query_prescale(q, scale)
    out = np.zeros((S, H))
    for s, f in enumerate(fields):
        ng = len(f["k_codes"]) // okv.GROUP
        if not ng:
            continue
        for h in range(kvh):
            qk = (q2[s, h * G : (h + 1) * G][None] * f["k_scale"][:, h][:, None]).astype(np.float32)  # [ng, G, D]
            codes, _, step = okv.requantize_query(qk)
            st = step.astype(np.float64)[..., None]
            err = np.abs(codes * st - qk.astype(np.float64))
            assert ((err <= np.where(np.abs(codes) == okv.QI8_MAX, st, st / 2)) | (st == 0)).all()
            kc = f["k_codes"][:, h].reshape(ng, okv.GROUP, D).astype(np.float64)
            out[s, h * G : (h + 1) * G] = np.einsum("ngd,ntd->ngt", err, kc).max(axis=(0, 2))
    return out


def run_i8(ctx, fast, bits, recent, D, kvh, G, lens, *, seed=0, bs=16, k=None, q=None, q_amp=1.0, k_amp=1.0,
           scale=None, words=True, distance=True, **kw):
    """The int8-query decode over the method's own cache, asserted within fast_decode_kivi.tolerance of
    oracle.attention_i8 (over the words read back) and, where `distance`, within the requantisation's bound of the
    exact-query oracle. Returns what it compared (out, ref, exact at the padded head size; fields, qp, scale, tol)."""
    rng = np.random.default_rng(seed)
    m = get_method("kivi", bits=bits, recent=recent)
    batch = make_batch(lens, bs, policy="scattered", seed=seed)
    kk, v = harness.kivi_kv(rng, int(sum(lens)), kvh, D, k_amp)
    k = kk if k is None else k
    q = (rng.standard_normal((len(lens), kvh * G, D)) * q_amp).astype(np.float32) if q is None else q
    scale = D ** -0.5 if scale is None else scale
    qkv = m.quantize(ctx, batch, k, v)
    qc = qkv.device["cache"]
    Dp = qc.head_size
    qp = m._pad_q(q, Dp)
    bufs = m.read_buffers(ctx, qkv)
    if words:
        kp, vp, _ = okv.pad_head(k, v)
        ref_words = okv.write_buffers(batch, kp, vp, bits, recent)
        np.testing.assert_array_equal(bufs["k"], ref_words["k"])
        np.testing.assert_array_equal(bufs["v"], ref_words["v"])
    fields = harness.kivi_seq_fields(bufs, batch, bits, recent, kvh, Dp)
    plan = fast.plan(bits, qc.k, qc.v, qc.extra["res"], kvh, qp, batch, scale, seq_plan=qc.extra["plan"],
                     info=qc.extra["info"], qk="i8", **kw)
    assert not plan.looped and plan.qk == "i8" and "int8 q" in plan.describe()
    ctx.rt.run(plan.dispatches)
    out = fast.read(plan)
    assert np.isfinite(out).all()
    harness.empty_gives_zero(out, lens)
    ref = okv.attention_i8(qp, scale, fields, kvh)
    fkc, fvc = harness.kivi_dequantised_caches(bufs, batch, bits, recent, kvh, Dp)
    M = float(np.abs(fvc).max(initial=0.0))
    tol = fk.tolerance(M)
    err = np.abs(out - ref)
    worst = np.unravel_index(np.argmax(err), err.shape) if err.size else ()
    assert err.max(initial=0.0) <= tol, (f"bits {bits} recent {recent} D{D} G{G} lens {lens[:6]}: error "
                                         f"{err[worst]:.3g} > {tol:.3g} at {worst} ({plan.describe()})")
    exact = harness.O.decode(qp.astype(np.float64), fkc.astype(np.float64), fvc.astype(np.float64), batch.block_tables,
                             batch.context_lens, bs, scale)
    if distance:
        # the two oracles' logits differ by the requantisation's shifts (natural units: x ln 2) and f32 roundings
        d = requant_shift(fields, qp, scale, kvh) * np.log(2.0) + 1e-6
        bound = np.expm1(2 * d)[..., None] * M + 2 * tol
        assert (np.abs(out - exact) <= bound).all(), "past the query's requantisation bound"
    return SimpleNamespace(out=out, ref=ref, exact=exact, plan=plan, fields=fields, qp=qp, scale=scale, tol=tol)


GRID = [  # bits, recent, D, kvh, G, lens
    (2, 0, 64, 2, 1, [0, 1, 31, 32, 33, 100]),
    (2, 16, 128, 1, 4, [33, 0, 1, 31, 32, 150]),
    (4, 128, 64, 2, 4, [300, 1, 0, 31, 32, 33, 161]),
    (4, 16, 128, 2, 1, [1, 31, 32, 33, 0, 97]),
    # head 80 at 4-bit: on an 8-lane subgroup 4 lanes of 20 channels, a vec4's codes from the word holding them
    (4, 0, 80, 1, 1, [64, 0, 1, 33, 95]),
    # head 112 at 2-bit: lanes of 16 channels walking 128 (padded: a zero query past the head)
    (2, 128, 112, 2, 1, [200, 33, 0, 1, 32]),
]


@pytest.mark.parametrize("bits,recent,D,kvh,G,lens", GRID, ids=[f"b{c[0]}-r{c[1]}-D{c[2]}-G{c[4]}" for c in GRID])
def test_i8_grid(ctx, fast, bits, recent, D, kvh, G, lens):
    """Ragged, scattered lengths with an empty and a single-token sequence, a key group's edges (31, 32, 33) and
    several groups; within the f32 tolerance of the variant's oracle and the requantisation bound of the exact one,
    and measurably away from the exact one (the query was quantised)."""
    r = run_i8(ctx, fast, bits, recent, D, kvh, G, lens, seed=D + G + recent + bits)
    if any(okv.n_quantised(n, recent) for n in lens):  # some key group was quantised
        assert np.abs(r.out - r.exact).max() > 1e-5


def test_i8_long_context(ctx, fast):
    """20017 tokens in one sequence (many partitions and the wide reduce; the residual in the last), the grid's first
    kernel."""
    r = run_i8(ctx, fast, 2, 128, 64, 1, 1, [20000 + 17], seed=5, words=False)
    assert r.plan.num_partitions >= fd.WIDE_REDUCE_FROM
    assert np.abs(r.out - r.exact).max() > 1e-6


def test_i8_query_magnitudes(ctx, fast):
    """Large query norms (logits of hundreds, a peaked softmax; m's exponent high), tiny ones (the group-scaled query
    below 2^-119: all-zero codes, the logits the bias alone) and an all-zero query (m = 0: zero codes and step):
    finite and within the tolerance (the grid's 4-bit GQA-4 kernel)."""
    case = (4, 0, 64, 2, 4, [96, 33, 1, 0])
    run_i8(ctx, fast, *case, seed=1, q_amp=30.0, k_amp=4.0)
    r = run_i8(ctx, fast, *case, seed=2, q_amp=1e-20, k_amp=1e-20)
    assert np.abs(r.out - r.exact).max() <= r.tol
    r = run_i8(ctx, fast, *case, seed=3, q=np.zeros((4, 8, 64), np.float32))
    assert np.abs(r.out - r.exact).max() <= r.tol  # nothing to round: the exact decode's (uniform) weights


def test_i8_rounding_ties_and_clamps(ctx, fast, monkeypatch):
    """A cache whose key groups' scales are exactly 1 (codes 0..15, with 0 and 15 in every channel) and a scale with
    f32(scale * log2 e) = 1/8, so that the kernel's qk is the query / 8 exactly: most channels land on exact ties of
    the rounding (x.5 with an even floor), some at +-127.75 and +-127.5 (clamped to +-127). Within the tolerance of the
    oracle, while an oracle rounding ties away from zero, or one not clamping, is far off: the case tells them apart."""
    bits, D, kvh, G, lens = 4, 64, 1, 4, [64, 96, 33]
    rng = np.random.default_rng(17)
    T = sum(lens)
    k = rng.integers(0, 16, (T, kvh, D)).astype(np.float32)
    for s0, n in zip(np.cumsum([0] + lens[:-1]), lens):
        for g in range(n // okv.GROUP):
            k[s0 + okv.GROUP * g] = 0.0
            k[s0 + okv.GROUP * g + 1] = 15.0
    x = (2 * rng.integers(-60, 60, (len(lens), kvh * G, D)) + 0.5).astype(np.float32)  # ties with an even floor
    x[..., ::5] += 0.25  # and some that are not ties
    sign = np.where(np.arange(kvh * G) % 2, 1.0, -1.0)[:, None]
    x[..., 3::8] = 127.75 * sign  # m, clamped to +-127
    x[..., 7::16] = 127.5 * sign  # a tie that rounds to +-128, clamped
    q = (x * 2.0 ** -11).astype(np.float32)  # qk = q / 8 = x * 2^-14; m = 127.75 * 2^-14: the factor is 2^14
    scale = 0.125 / fd.LOG2E
    assert np.float32(scale * fd.LOG2E) == 0.125
    codes, factor, _ = okv.requantize_query(okv.query_prescale(q, scale))
    ties = np.abs(x) % 1 == 0.5
    assert (factor == 2.0 ** 14).all() and ties.mean() > 0.6
    assert (codes[ties & (np.abs(x) < 127)] % 2 == 0).all()
    assert (codes[..., 3::8] == 127 * sign).all() and (codes[..., 7::16] == 127 * sign).all()
    r = run_i8(ctx, fast, bits, 0, D, kvh, G, lens, k=k, q=q, scale=scale)
    assert all(np.all(f["k_scale"] == 1.0) and not np.any(f["k_zero"]) for f in r.fields)
    real = okv.requantize_query

    def away(qk):  # ties away from zero
        c, f, st = real(qk)
        y = (np.asarray(qk, np.float32) * f[..., None]).astype(np.float32)
        return np.clip(np.sign(y) * np.floor(np.abs(y) + 0.5), -127, 127), f, st

    def unclamped(qk):  # +-128 kept
        c, f, st = real(qk)
        return np.rint((np.asarray(qk, np.float32) * f[..., None]).astype(np.float32)), f, st

    for wrong in (away, unclamped):
        monkeypatch.setattr(okv, "requantize_query", wrong)
        other = okv.attention_i8(r.qp, r.scale, r.fields, kvh)
        monkeypatch.undo()
        assert np.abs(other - r.ref).max() > 5 * r.tol, wrong.__name__


def test_i8_all_lane_softmax_unroll4_and_no_subgroups(ctx, fast):
    """The all-lane softmax (the lanes' partial logits summed, not reduce-scattered) at 4 tokens a step, without the
    prefetch; and the one-lane layout (no subgroups: m a lane's own maximum, no shuffles)."""
    r = run_i8(ctx, fast, 4, 16, 64, 2, 1, [1, 31, 32, 33, 0, 130], seed=8, scatter=False, unroll=4, prefetch=False)
    assert r.plan.layout.unroll == 4 and not r.plan.prefetch
    r = run_i8(ctx, fast, 2, 0, 32, 1, 1, [97, 0, 64, 3], seed=9, subgroups=False)
    assert r.plan.layout.lanes == 1


def test_i8_prefetch_bit_identical(ctx, fast):
    """The software-pipelined loads do the same arithmetic: the variant's output bit for bit without them (the grid's
    first kernel with and without the prefetch)."""
    case = (2, 0, 64, 2, 1, [0, 1, 31, 32, 33, 100])
    a = run_i8(ctx, fast, *case, seed=67, distance=False)
    b = run_i8(ctx, fast, *case, seed=67, distance=False, prefetch=False)
    assert a.plan.prefetch == fd.PREFETCH and not b.plan.prefetch
    np.testing.assert_array_equal(a.out, b.out)


def test_requantiser_bit_for_bit(rt):
    """shaders/kivi/query_i8.wgsl (the decode's requantiser) on given rows against oracle.requantize_query, codes and
    steps bit for bit: random rows at every exponent from 2^-130 to 2^127 (m in the subnormals, below and at the 2^-119
    threshold, up to f32's largest), all-zero rows, rows of ties (x.5 at the factor) and of codes clamped to 127, and an
    infinite m (step NaN, codes unspecified)."""
    rng = np.random.default_rng(4)
    D = 16
    rows = []
    for e in range(-130, 128):  # m about 2^e
        r = rng.standard_normal(D) * 2.0 ** e
        rows.append(r)
    rows += [np.zeros(D), np.full(D, 2.0 ** -119), np.full(D, 2.0 ** -120), np.full(D, np.finfo(np.float32).max),
             np.full(D, np.finfo(np.float32).tiny), np.array([1e-45] * D)]
    ties = (2 * rng.integers(-60, 60, (8, D)) + 0.5) * 2.0 ** -9  # x.5 at the factor 2^9 (m in [2^-3, 2^-2))
    ties[:, 0] = 127.75 * 2.0 ** -9  # clamped
    ties[1, 0] = -127.5 * 2.0 ** -9  # a tie at the clamp
    rows += list(ties)
    x = np.array(rows)
    with np.errstate(over="ignore"):
        x = x.astype(np.float32)
    inf = np.zeros((1, D), np.float32)
    inf[0, 3] = np.inf
    x = np.concatenate([x, inf])
    codes, factor, step = fk.requantize_on_device(rt, x)
    c, f, st = okv.requantize_query(x)
    np.testing.assert_array_equal(factor.view(np.uint32), f.view(np.uint32))
    np.testing.assert_array_equal(step[:-1].view(np.uint32), st[:-1].view(np.uint32))
    np.testing.assert_array_equal(codes[:-1], c[:-1])
    assert np.isnan(step[-1]) and np.isnan(st[-1])
    m = np.abs(x[:-1]).max(-1)
    assert ((m < 2.0 ** -119) == (step[:-1] == 0)).all() and (codes[:-1][m < 2.0 ** -119] == 0).all()
    nz = step[:-1] > 0
    assert (np.abs(codes[:-1][nz]).max(-1) >= 64).all()  # the row's largest code is 64..127 (m in [0.5, 1) x 2^k)
    assert (np.abs(c[-len(ties) - 1 : -1, 0]) == 127).all() and (c[-len(ties) - 1 : -1, 1:] % 2 == 0).all()


def test_i8_refusals(ctx, fast):
    m = get_method("kivi", bits=2, recent=0)
    batch = make_batch([64, 3], 16, seed=1)
    k = np.ones((67, 1, 64), np.float32)
    qc = m.quantize(ctx, batch, k, k).device["cache"]
    args = (2, qc.k, qc.v, qc.extra["res"], 1, np.ones((2, 4, 64), np.float32), batch, 0.1)
    with pytest.raises(InvalidInput, match="looped"):
        fast.plan(*args, seq_plan=qc.extra["plan"], qk="i8", looped=True)
    with pytest.raises(InvalidInput, match="variant"):
        fast.plan(*args, seq_plan=qc.extra["plan"], qk="bf16")
    lay = fast.layout(2, 64, 4)
    with pytest.raises(InvalidInput, match="looped"):
        fk.render(2, 64, 4, lay, 32, 16, looped=True, qk="i8")


def test_default_render_has_no_variant_code():
    """The default kernel stays the exact f32 one (no requantiser, no dot4I8Packed); the variant's byte words follow
    the K code words' byte order: a 4-bit word's even and odd nibbles, a 2-bit word's four shifts, pack4xU8 where a
    lane does not own whole words."""
    for bits, D, L in ((4, 64, 8), (2, 64, 8), (4, 80, 4)):
        fmt = fk.code_format(bits) if D != 80 else fk.SPLIT4
        lay = fd.choose_layout(fmt, D, 4, L, 16384)
        d = fk.render(bits, D, 4, lay, 16, 16, True, True)
        text = "".join(d.values())
        assert "dot4I8Packed" not in text and "qi8_" not in text and d["VARIANT"] == "f32"
        v = fk.render(bits, D, 4, lay, 16, 16, True, True, qk="i8")
        assert "dot4I8Packed" in v["QSTEP"] and "fn qi8_scales" in v["HELPERS"] and v["VARIANT"] == fd.variant_name("i8")
        assert "subgroupShuffleXor(qm0" in v["GROUP"] and "qk0_0" not in v["PROLOGUE"]
        masks = {4: ["kw0_0 & 0x0F0F0F0Fu", "(kw0_0 >> 4u) & 0x0F0F0F0Fu"],
                 2: ["kw0_0 & 0x03030303u"] + [f"(kw0_0 >> {s}u) & 0x03030303u" for s in (2, 4, 6)]}[bits]
        if D == 80:
            assert "pack4xU8" in v["QSTEP"]
        else:
            assert all(mk in v["QSTEP"] for mk in masks)
