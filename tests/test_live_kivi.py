"""KIVI live decode appends: each step writes only the new token (and, when a 32-token key group fills, that
group) through the method's writers into KIVI's paged cache (kvviz/families/kivi/live_cache.py); the re-quantising
cache (`RequantCache`, the whole sequence through `Kivi.quantize` every step) is the cross-check.

Tolerance: both caches hold the same codes, side words and residual f32 rows (asserted word for word), and
attend through the same kernels (the method's dequantise, then its decode) over the same values, so the
outputs are expected to be bit-equal; where they are not, the bound is the f32 decode's own tolerance,
2e-5 * max(1, max|V|) (tests/test_live_appends.py uses the same)."""
from __future__ import annotations

import numpy as np
import pytest

from kvviz.errors import InvalidInput
from kvviz.families.kivi.format import n_quantised
from kvviz.methods.live_cache import BlockTable, RequantCache, make_live_cache
from kvviz.families.kivi.live_cache import KiviLiveCache
from kvviz.families.registry import get_method
from kvviz.families.kivi.method import Kivi

pytestmark = pytest.mark.gpu

D, BS, NB = 64, 16, 16


def _kv(rng, n_layers, kvh, T, d=D):
    return [(rng.standard_normal((kvh, T, d)).astype(np.float32) * 2,
             rng.standard_normal((kvh, T, d)).astype(np.float32) * 3) for _ in range(n_layers)]


def _pair(ctx, m, n_layers, kvh, d=D, nb=NB):
    shape = (n_layers, 2 * kvh, kvh, d, d ** -0.5)
    a = KiviLiveCache(ctx, BlockTable(nb, BS, "scattered", seed=3), *shape, method=m)
    b = make_live_cache(m, ctx, BlockTable(nb, BS, "scattered", seed=3), *shape, incremental=False)
    assert isinstance(b, RequantCache)
    return a, b


def _same_words(a: KiviLiveCache, b: RequantCache, layer: int):
    """The words of a's buffers == the method's whole-sequence quantisation (b's last quantize)."""
    ref = b.qkv[layer].extra["buffers"]
    got = a.method.read_buffers(a.ctx, a._view(layer))
    n = a.layers[layer].n
    rows = n - n_quantised(n, a.method.recent)
    assert np.array_equal(got["k"], ref["k"]), "K codes / side stream differ"
    assert np.array_equal(got["v"], ref["v"]), "V records differ"
    assert np.array_equal(got["res"][:rows], ref["res"][:rows]), "residual rows differ"


# every recent window (none, one group, one block of 128, one not a multiple of the group) with each width where the
# window's edge and the group's differ (20); 2- and 4-bit codes share the writer's code path otherwise
@pytest.mark.parametrize("bits,recent,kvh", [(2, 0, 2), (4, 16, 2), (2, 128, 4), (2, 20, 2), (4, 20, 4)])
def test_appends_match_requantising(ctx, bits, recent, kvh):
    rng = np.random.default_rng(bits * 1000 + recent * 10 + kvh)
    m = get_method("kivi", bits=bits, recent=recent)
    n_layers = 2
    a, b = _pair(ctx, m, n_layers, kvh)
    # appends until two key groups were quantised on the way (recent 128 quantises its first at L = 160)
    P = 70
    steps = next(s for s in range(1, 101) if n_quantised(P + s, recent) >= n_quantised(P, recent) + 64 or s == 100)
    prompt = _kv(rng, n_layers, kvh, P)
    for c in (a, b):
        for li, (k, v) in enumerate(prompt):
            c.extend(li, k, v, 0)
    vmax = max(float(np.abs(v).max()) for _, v in prompt)
    tol = 2e-5 * max(1.0, vmax)
    worst, bit_equal = 0.0, True
    for pos in range(P, P + steps):
        step = _kv(rng, n_layers, kvh, 1)
        vmax = max(vmax, max(float(np.abs(v).max()) for _, v in step))
        q = rng.standard_normal((2 * kvh, D)).astype(np.float32)
        for li, (k, v) in enumerate(step):
            oa = a.append_attend(li, q, k[:, 0], v[:, 0], pos)
            ob = b.append_attend(li, q, k[:, 0], v[:, 0], pos)
            assert oa.shape == ob.shape == (2 * kvh, D)
            worst = max(worst, float(np.abs(oa - ob).max()))
            bit_equal &= bool(np.array_equal(oa, ob))
            assert worst <= 2e-5 * max(1.0, vmax), (pos, li, worst)
        if (pos + 1) % 32 == 0 or pos == P + steps - 1:
            for li in range(n_layers):
                _same_words(a, b, li)
    # same codes, same kernels, same order: the outputs are the same floats
    assert bit_equal, f"outputs differ by up to {worst} (tolerance {tol})"
    assert a.length == P + steps
    assert a.layers[0].nq == n_quantised(P + steps, recent)
    assert a.decode_path in ("fast", "first-wave")  # the decode ran in the step's submit
    # the views read through the method's hooks agree with the re-quantising cache's
    for li in range(n_layers):
        assert np.array_equal(a.weights(li, q, a.length), b.weights(li, q, b.length))
        blk = a.table.blocks[2]
        for which in "KV":
            ra, rb = a.inspect_block(li, blk, kvh - 1, which), b.inspect_block(li, blk, kvh - 1, which)
            assert [r.position for r in ra] == [r.position for r in rb]
            assert all(np.array_equal(x.words, y.words) for x, y in zip(ra, rb))
    ta, tb = a.token_scales(1, 0), b.token_scales(1, 0)
    assert ta.k.shape == (P + steps,)
    np.testing.assert_array_equal(ta.k, tb.k)
    np.testing.assert_array_equal(ta.v, tb.v)
    assert "appended token by token" in a.label


@pytest.mark.parametrize("writer_impl", ["fast", "first-wave"])
def test_padded_head_and_long_prompt(ctx, writer_impl):
    """A head size KIVI runs padded (40 -> 48), a prompt written in two chunks (as the prefill's 512-token
    chunks arrive), both of the method's writers, and each decode path: the one the cache picks, the
    method's own attend after the writer's submit, the first-wave decode fused into the step's submit."""
    rng = np.random.default_rng(7)
    m = get_method("kivi", bits=2, recent=20)
    m.writer_impl = writer_impl
    a, b = _pair(ctx, m, 1, 2, d=40)
    (k, v), = _kv(rng, 1, 2, 75, d=40)
    for c in (a, b):
        c.extend(0, k[:, :50], v[:, :50], 0)
        c.extend(0, k[:, 50:], v[:, 50:], 50)
    paths = set()
    for pos in range(75, 125):
        (sk, sv), = _kv(rng, 1, 2, 1, d=40)
        q = rng.standard_normal((4, 40)).astype(np.float32)
        if pos == 90:  # no fused fast decode: the method's attend (probed), then what the probe found
            a.fuse_fast, a.attend_reads_f32 = False, None
        if pos == 105:  # the first-wave decode fused, whatever the method's attend runs
            a.attend_reads_f32 = True
        oa = a.append_attend(0, q, sk[:, 0], sv[:, 0], pos)
        ob = b.append_attend(0, q, sk[:, 0], sv[:, 0], pos)
        paths.add(a.decode_path)
        assert oa.shape == (4, 40)
        if pos < 105:  # the method's own decode: the same floats
            assert np.array_equal(oa, ob), (pos, a.decode_path, float(np.abs(oa - ob).max()))
        else:  # the same decode while Kivi.attend is first-wave; another (fast vs first-wave) once it is not
            assert np.abs(oa - ob).max() <= 2e-5 * max(1.0, float(np.abs(v).max()), float(np.abs(sv).max()))
    assert {"the method's attend", "first-wave"} <= paths
    _same_words(a, b, 0)


@pytest.mark.parametrize("recent", [0, 16, 128])
def test_writer_work_per_step_is_constant(ctx, recent):
    """Per step the writer covers the new token only (1 row); once every 32 steps, when n_q grows, exactly
    one 32-row key group is quantised and the residual window (< recent + 32 rows) written again: bounded
    by recent, not by the sequence length."""
    m = get_method("kivi", bits=2, recent=recent)
    c = KiviLiveCache(ctx, BlockTable(40, BS), 1, 4, 2, D, 0.125, method=m)
    rng = np.random.default_rng(2)
    (k, v), = _kv(rng, 1, 2, 40)
    c.extend(0, k, v, 0)
    assert c.last_write["token_rows"] == 40 and c.last_write["group_rows"] == 32 * (n_quantised(40, recent) // 32)
    group_steps = 0
    # to 232 tokens: every recent window quantises three or more key groups on the way (recent 128 its first at
    # 160), and the host rows kept at the end (recent + 64 at most) are fewer than the sequence's
    for pos in range(40, 232):
        (sk, sv), = _kv(rng, 1, 2, 1)
        c.append_attend(0, rng.standard_normal((4, D)).astype(np.float32), sk[:, 0], sv[:, 0], pos)
        w = c.last_write
        grew = n_quantised(pos + 1, recent) != n_quantised(pos, recent)
        # the token writer's input is exactly the rows it is given (K rows uploaded: rows * kv_heads * D f32)
        assert w["dispatches"][0].buffers[0].size == w["token_rows"] * 2 * D * 4
        if grew:
            group_steps += 1
            assert w["group_rows"] == 32 and len(w["groups"]) == 1
            assert w["groups"][0] == n_quantised(pos + 1, recent) // 32 - 1
            assert w["token_rows"] == 32 + w["residual_rows"] and w["residual_rows"] <= recent + 31
        else:
            assert w["group_rows"] == 0 and w["token_rows"] == 1 and len(w["dispatches"]) == 1
    assert group_steps == (n_quantised(232, recent) - n_quantised(40, recent)) // 32 >= 3
    assert len(c.layers[0].hk) <= recent + 64  # host rows kept: the window and the last group only


def test_retried_step_and_bad_input(ctx):
    """A step written again at the same position (the decoder retries a cancelled step) gives the same
    cache; positions past the pool, gaps, and roll-backs past the kept rows raise InvalidInput."""
    rng = np.random.default_rng(4)
    m = get_method("kivi", bits=4, recent=0)
    a, b = _pair(ctx, m, 1, 2, nb=4)  # 64 slots
    (k, v), = _kv(rng, 1, 2, 63)
    q = rng.standard_normal((4, D)).astype(np.float32)
    for c in (a, b):
        c.extend(0, k[:, :31], v[:, :31], 0)
    a.append_attend(0, q, k[:, 31] + 1, v[:, 31] - 1, 31)  # quantises group 0 from a wrong row ...
    oa = a.append_attend(0, q, k[:, 31], v[:, 31], 31)  # ... written again: rolled back, group 0 again
    ob = b.append_attend(0, q, k[:, 31], v[:, 31], 31)
    assert np.array_equal(oa, ob)
    _same_words(a, b, 0)
    for pos in range(32, 63):
        oa = a.append_attend(0, q, k[:, pos], v[:, pos], pos)
        ob = b.append_attend(0, q, k[:, pos], v[:, pos], pos)
    assert np.array_equal(oa, ob)
    _same_words(a, b, 0)
    extra = rng.standard_normal((2, D)).astype(np.float32)
    a.append_attend(0, q, extra, extra, 63)  # the pool's last slot
    with pytest.raises(InvalidInput, match="past the pool"):
        a.append_attend(0, q, extra, extra, 64)
    with pytest.raises(InvalidInput):
        a.extend(0, k[:, :2], v[:, :2], 63)  # 63..64: past the pool
    c = KiviLiveCache(ctx, BlockTable(8, BS), 1, 4, 2, D, 0.125, method=m)
    (k2, v2), = _kv(rng, 1, 2, 100)
    c.extend(0, k2, v2, 0)  # n_q = 96: rows kept from 64 on
    with pytest.raises(InvalidInput, match="in order"):
        c.append_attend(0, q, extra, extra, 101)  # a gap
    with pytest.raises(InvalidInput, match="no longer kept"):
        c.extend(0, k2[:, :5], v2[:, :5], 5)  # group 0 is quantised and its rows dropped
    with pytest.raises(InvalidInput):
        c.attend(0, q, 10)  # KIVI's cache of a shorter context is another cache
    with pytest.raises(InvalidInput):
        c.append_attend(0, q, np.full((2, D), np.nan, np.float32), extra, 100)
    assert c.layers[0].n == 100 and c.layers[0].nq == 96  # nothing changed by the refused writes


class _KiviAppending(Kivi):
    """KIVI with its live cache hook (the snippet proposed for kvviz/families/kivi/method.py), not registered."""

    @property
    def has_live_cache(self) -> bool:
        return True

    def live_cache(self, ctx, table, n_layers, n_heads, n_kv_heads, head_size, scale):
        return KiviLiveCache(ctx, table, n_layers, n_heads, n_kv_heads, head_size, scale, method=self)


def test_live_decoder_with_a_cancelled_step(ctx, tmp_path):
    """A real (tiny) model through LiveDecoder: the appending cache gives the re-quantising cache's next-token
    distributions bit for bit, also when a step is cancelled half-way through the layers and run again."""
    from tiny_llama import write_tiny_gguf

    from kvviz.live import Cancelled, LiveDecoder
    from kvviz.sources.gguf_llama import load_gguf_llama

    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path, head_size=32, seed=1)
    model = load_gguf_llama(path)
    prompt = [5 + (7 * i) % 200 for i in range(29)]
    m = _KiviAppending(bits=2, recent=0)  # recent 0: a key group fills at L = 32, 64
    ref = LiveDecoder(model, m, ctx=ctx, block_size=4, incremental=False)
    dec = LiveDecoder(model, m, ctx=ctx, block_size=4)
    for d in (ref, dec):
        d.start(prompt, 8)
    assert isinstance(dec.caches["quant"], KiviLiveCache) and isinstance(ref.caches["quant"], RequantCache)
    ref.run()
    dec.run(2)  # positions 28, 29
    calls = {"n": 0}

    def cancel_late():  # step start, the baseline's layers, then the quantised path's first layer(s)
        calls["n"] += 1
        return calls["n"] >= 2 + model.config.n_layers + 1

    with pytest.raises(Cancelled):
        dec.step(cancel_late)
    assert dec.caches["quant"].layers[0].n == dec.caches["quant"].length + 1  # layer 0 ran ahead
    assert dec.cache_view(0, 0)["weights_quant"] is None  # no weights of a half-written step
    dec.run()  # the cancelled step again (position 30), then on through the groups filling at 32
    for a, b in zip(dec.steps, ref.steps):
        assert a.quant_token == b.quant_token
        np.testing.assert_array_equal(a.logp_quant, b.logp_quant)
    v = dec.steps[-1].view
    assert "error" not in v and v["weights_quant"] is not None
    np.testing.assert_array_equal(v["scales"].k, ref.steps[-1].view["scales"].k)
