"""Code statistics mean what their names say and histograms have one bin per code: per-method definitions
through KVMethod.code_statistics, checked against numpy on the inputs and the codes the GPU wrote."""
import numpy as np
import pytest

from kvviz.analysis.compare import batch_layouts, compare_methods
from kvviz.metrics import code_stats, format_values, histogram
from kvviz.families.registry import get_method
from kvviz.paging import PAD_SLOT, make_batch

pytestmark = pytest.mark.gpu


def _gauss(lens=(70, 33), kvh=2, D=64, seed=0, pad_every=0):
    batch = make_batch(list(lens), 16, policy="scattered", seed=seed, pad_every=pad_every)
    rng = np.random.default_rng(seed)
    T = batch.num_tokens
    key = rng.standard_normal((T, kvh, D)).astype(np.float32)
    value = rng.standard_normal((T, kvh, D)).astype(np.float32)
    return batch, key, value


def _stats(ctx, method_id, batch, key, value, **opts):
    m = get_method(method_id, **opts)
    qkv = m.quantize(ctx, batch, key, value)
    return m, qkv, m.code_statistics(ctx, qkv, batch, key, value)


@pytest.mark.parametrize("method_id", ["int8_token", "int8_seed"])
def test_int8_per_token_saturation_is_zero_on_gaussian_data(ctx, method_id):
    batch, key, value = _gauss(pad_every=5)
    m, qkv, (ks, vs) = _stats(ctx, method_id, batch, key, value)
    real = batch.slot_mapping != PAD_SLOT
    for st, codes in ((ks, qkv.k_codes), (vs, qkv.v_codes)):
        # each token's own maximum sits on +-127 by construction: that is not saturation
        assert np.count_nonzero(np.abs(np.asarray(codes)[real]) == 127) > 0
        assert st.value("saturated") == 0.0
        assert "clip_rate" not in st.stats and "clip_rate" not in st.to_json()
        assert st.total == int(real.sum()) * key.shape[1] * key.shape[2]  # pad rows not counted
        for s in st.stats.values():
            assert s.definition and s.label


def test_int8_zeroed_counts_nonzero_inputs_that_dequantise_to_zero(ctx):
    batch, key, value = _gauss()
    key[:, :, 1] = 1e-4  # far below half a step of a token whose amax is ~2.5: code 0
    key[:, :, 2] = 0.0  # true zeros are not "zeroed"
    m, qkv, (ks, vs) = _stats(ctx, "int8_token", batch, key, value)
    real = batch.slot_mapping != PAD_SLOT
    x = key[real]
    c = np.asarray(qkv.k_codes)[real]
    want = np.count_nonzero((x != 0) & (c == 0)) / np.count_nonzero(x != 0)
    assert ks.value("zeroed") == pytest.approx(want)
    assert ks.value("zeroed") >= 1 / key.shape[2] * 0.9  # channel 1 of every token
    assert vs.value("zeroed") < ks.value("zeroed")


def test_fp8_saturation_counts_values_beyond_max_over_scale(ctx):
    batch, key, value = _gauss(lens=(48,))
    # vLLM FP8 with a given K scale: |x / k_scale| > 448 saturates
    k_scale = 0.005  # 448 * 0.005 = 2.24: the tail of a standard normal beyond it
    m, qkv, (ks, vs) = _stats(ctx, "vllm_fp8_e4m3", batch, key, value, scales="given", k_scale=k_scale, v_scale=1.0)
    real = batch.slot_mapping != PAD_SLOT
    sat = float(np.float32(464.0))  # E4M3: 448 + half the last gap; the tie rounds to even 448
    want = np.count_nonzero(np.abs(key[real] / np.float32(k_scale)) > sat) / key[real].size
    assert want > 0
    assert ks.value("saturated") == pytest.approx(want)
    # the writer's own per-head count on the GPU agrees
    assert ks.value("saturated") * key[real].size == pytest.approx(int(np.asarray(qkv.extra["saturated"])[0].sum()))
    assert vs.value("saturated") == 0.0
    # per-token FP8 (scale = amax / 448) never saturates
    _, _, (k2, v2) = _stats(ctx, "fp8_e4m3", batch, key, value)
    assert k2.value("saturated") == 0.0 and v2.value("saturated") == 0.0


def test_kivi_statistics_count_quantised_rows_only(ctx):
    batch, key, value = _gauss(lens=(100, 40))
    m, qkv, (ks, vs) = _stats(ctx, "kivi", batch, key, value, bits=2, recent=32)
    resid = np.asarray(qkv.extra["residual"], bool)
    real = batch.slot_mapping != PAD_SLOT
    n_q = int((real & ~resid).sum())
    assert 0 < n_q < int(real.sum())
    assert ks.total == n_q * key.shape[1] * key.shape[2]
    assert ks.value("recent_share") == pytest.approx(float((real & resid).sum()) / real.sum())
    assert ks.value("saturated") == 0.0 and vs.value("saturated") == 0.0
    assert 0 < ks.value("levels_used_mean") <= 1 and 0 < vs.value("levels_used_mean") <= 1
    # V: one token's head vector spans its min..max, so it uses code 0 and code 3
    assert vs.value("levels_used_mean") >= 0.5
    # the mean group range of V is the mean per-token (max - min) of the quantised rows
    xv = value[real & ~resid]
    assert vs.value("group_range_mean") == pytest.approx(float((xv.max(-1) - xv.min(-1)).mean()), rel=1e-5)


def test_kivi_bits_per_element_one_definition(ctx):
    """The window, the inspector and the report show res.layouts; the comparison its own rows: the same
    batch-exact accounting (no hidden context_len)."""
    from kvviz.analysis.session import Session, SessionConfig

    cfg = SessionConfig(context_lens=(300, 77), num_heads=4, num_kv_heads=2, head_size=64, timing_runs=3,
                        method="kivi", method_options={"bits": 2, "recent": 128})
    sess = Session(ctx.rt)
    res = sess.compute(cfg)
    k, v = res.layouts
    shown = (k.bits_per_element + v.bits_per_element) / 2
    row = compare_methods(ctx, res.batch, res.key, res.value, res.q, res.scale, [res.method])[0]
    assert row["bits_per_element"] == pytest.approx(shown)
    kb, vb = batch_layouts(res.method, res.batch, 64)
    assert kb.bits_per_element == pytest.approx(k.bits_per_element)
    # 128+ recent float32 rows of 377 tokens cost far more than 2 bits: not the 4096-token figure
    assert shown > 8


def test_turboquant_centroid_usage(ctx):
    batch, key, value = _gauss(lens=(64,), D=128)
    m, qkv, (ks, vs) = _stats(ctx, "turboquant", batch, key, value)
    real = batch.slot_mapping != PAD_SLOT
    n = int(qkv.code_range[1]) + 1
    for st, codes in ((ks, qkv.k_codes), (vs, qkv.v_codes)):
        c = np.asarray(codes)[real].reshape(-1)
        share = np.bincount(c, minlength=n) / c.size
        assert st.value("centroids_used") == pytest.approx(np.count_nonzero(share) / n)
        assert st.value("centroid_share_max") == pytest.approx(share.max())
        assert 0 < st.value("index_entropy") <= np.log2(n) + 1e-9
        assert "saturated" not in st.stats and "zeroed" not in st.stats
        assert len(st.bins) == n and st.counts.sum() == c.size


# ------------------------------------------------------------------------------ histograms
def test_integer_histogram_one_bin_per_code():
    codes = np.array([-127, -3, -3, 0, 5, 127])
    bins, vals, counts, axis = histogram(codes, (-128, 127))
    assert axis == "code"
    np.testing.assert_array_equal(bins, np.arange(-128, 128))
    assert counts.sum() == codes.size and counts[bins == -3][0] == 2 and counts[bins == 1][0] == 0


def test_fp8_histogram_runs_over_every_format_value():
    import ml_dtypes

    vals = format_values(ml_dtypes.float8_e4m3fn)
    assert len(vals) == 253 and vals[0] == -448 and vals[-1] == 448 and 0.0 in vals
    codes = np.array([-448.0, 0.0, -0.0, 0.001953125, 448.0, 448.0], np.float32)
    st = code_stats(codes, (-448, 448), code_values=vals)
    assert st.axis == "code index"
    np.testing.assert_array_equal(st.bins, np.arange(253))
    assert st.counts[-1] == 2 and st.counts[np.flatnonzero(vals == 0)[0]] == 2
    assert st.value("range_used") == pytest.approx(4 / 253)


def test_session_histogram_matches_codes(ctx):
    for mid in ("int8_token", "fp8_e5m2", "int4_group"):
        batch, key, value = _gauss()
        m, qkv, (ks, vs) = _stats(ctx, mid, batch, key, value)
        real = batch.slot_mapping != PAD_SLOT
        for st, codes in ((ks, qkv.k_codes), (vs, qkv.v_codes)):
            c = np.asarray(codes)[real].reshape(-1)
            assert st.counts.sum() == c.size
            np.testing.assert_array_equal(np.diff(st.bins), 1)  # contiguous: width-1 bars leave no gap
            for val in np.unique(c)[:20]:
                assert st.counts[st.bin_values == val].sum() == np.count_nonzero(c == val)
