"""The Qt-free session on every source: synthetic presets, a real model (SmolLM2), a KV dump file."""
import numpy as np
import pytest

from kvviz.metrics import outlier_ratio
from kvviz.analysis.session import SessionConfig
from kvviz.errors import InvalidInput
from kvviz.families.registry import registry

pytestmark = pytest.mark.gpu


def test_synthetic_presets_compute(session):
    for preset in ("gaussian", "llama-like", "heavy-tailed", "zeros", "constant"):
        cfg = SessionConfig(preset=preset, context_lens=(40, 17), num_heads=4, num_kv_heads=2, head_size=64, timing_runs=3)
        res = session.compute(cfg)
        assert res.out_ref.shape == (2, 4, 64) and res.w_q.shape == (2, 4, 40)
        if preset == "zeros":
            # amax == 0: every code 0, every scale exactly 1.0, attention uniform
            assert res.k_stats.counts[res.k_stats.bin_values == 0].sum() == res.k_stats.total
            assert res.k_stats.value("zeroed") == 0.0  # no non-zero input
            assert (res.qkv.k_scales[res.real_rows] == 1.0).all()
        else:
            assert res.metrics.kl.max() < 0.05


def test_llama_like_preset_has_outlier_key_channels(session):
    res = session.compute(SessionConfig(context_lens=(256,), timing_runs=3))
    assert outlier_ratio(res.k_channel_amax[0]) > 2 * outlier_ratio(res.v_channel_amax[0])


def test_model_source_captures_real_kv(session):
    cfg = SessionConfig(source="model", layer=4, timing_runs=3, prompt="The quick brown fox jumps over the lazy dog.")
    res = session.compute(cfg)
    assert res.config.num_heads == 9 and res.config.num_kv_heads == 3 and res.config.head_size == 64
    assert res.batch.num_seqs == 1 and res.key.shape[1:] == (3, 64)
    assert "SmolLM2" in res.source_note
    # a real model's keys have outlier channels, its values far fewer (docs: ~4.5 vs ~2.2)
    assert outlier_ratio(res.k_channel_amax[0]) > outlier_ratio(res.v_channel_amax[0])
    pre = session.compute(SessionConfig(**{**cfg.to_json(), "pre_rope_keys": True, "context_lens": (1,)}))
    assert not np.array_equal(pre.key, res.key)


def test_kvfile_source_round_trip(session, tmp_path):
    from kvviz.sources.kv_files import save_kv

    rng = np.random.default_rng(0)
    k = rng.standard_normal((2, 2, 50, 32)).astype(np.float32)
    v = rng.standard_normal((2, 2, 50, 32)).astype(np.float32)
    q = rng.standard_normal((2, 4, 50, 32)).astype(np.float32)
    path = save_kv(tmp_path / "kv.safetensors", k, v, q)
    res = session.compute(SessionConfig(source="kvfile", kv_file=str(path), layer=1, timing_runs=3))
    rows = res.batch.token_rows(0)
    np.testing.assert_array_equal(res.key[rows], k[1].transpose(1, 0, 2))
    np.testing.assert_array_equal(res.q[0], q[1][:, -1, :])
    with pytest.raises(InvalidInput, match="layer 2 out of range"):
        session.compute(SessionConfig(source="kvfile", kv_file=str(path), layer=2))


def test_bad_configs_raise_clear_errors(session):
    with pytest.raises(InvalidInput, match="not divisible"):
        session.compute(SessionConfig(num_heads=6, num_kv_heads=4))
    with pytest.raises(InvalidInput):
        session.compute(SessionConfig(head_size=300))
    with pytest.raises(InvalidInput, match="at least one token"):
        session.compute(SessionConfig(context_lens=(0,)))
    with pytest.raises(InvalidInput, match="Unknown setting"):
        SessionConfig.from_json({"bogus": 1})
    with pytest.raises(InvalidInput, match="No KV file"):
        session.compute(SessionConfig(source="kvfile"))


def test_hf_folder_needs_the_hf_extra(session, tmp_path):
    """A Hugging Face model folder goes through torch + transformers; without them the error says
    how to get them (torch is not a dependency of the default install)."""
    import importlib.util

    (tmp_path / "config.json").write_text("{}")
    cfg = SessionConfig(source="model", model_path=str(tmp_path), prompt="hello")
    if importlib.util.find_spec("torch") is None or importlib.util.find_spec("transformers") is None:
        with pytest.raises(InvalidInput, match="needs torch and transformers") as info:
            session.compute(cfg)
        assert "kvviz[hf]" in info.value.hint
    else:
        with pytest.raises(InvalidInput):  # an empty config.json is not a llama model
            session.compute(cfg)


# ------------------------------------------------------------------ one upload, typed results
class _CountKV:
    """Wraps rt.write: counts transfers of the exact bytes of K and of V (whole-array uploads)."""

    def __init__(self, rt, monkeypatch):
        self.rt, self.key, self.value, self.counts = rt, None, None, {"K": 0, "V": 0}
        self._write = rt.write
        monkeypatch.setattr(rt, "write", self.write)

    def watch(self, key, value):
        self.key, self.value = key, value
        self.counts = {"K": 0, "V": 0}

    def write(self, buf, array, offset=0):
        a = np.asarray(array)
        for name, x in (("K", self.key), ("V", self.value)):
            if x is not None and a.nbytes == x.nbytes and a.nbytes and np.array_equal(a.view(np.uint8).reshape(-1),
                                                                                     x.view(np.uint8).reshape(-1)):
                self.counts[name] += 1
        return self._write(buf, array, offset)


@pytest.mark.parametrize("method", sorted(registry()))
def test_kv_uploaded_once_per_compute(session, method, monkeypatch):
    """K and V reach the GPU once per compute: the f32 baseline, the method's writer and the timing all
    read that copy (before: four uploads each, two quantisations). One sequence, no padding rows, so
    every kernel takes the whole K and V."""
    from kvviz.families.registry import get_method

    counter = _CountKV(session.rt, monkeypatch)
    build = session.build_inputs

    def build_and_watch(cfg, *a, **k):
        out = build(cfg, *a, **k)
        counter.watch(out[1], out[2])
        return out

    monkeypatch.setattr(session, "build_inputs", build_and_watch)
    quantised = []
    cfg = SessionConfig(method=method, context_lens=(45,), num_heads=4, num_kv_heads=2, head_size=64, timing_runs=3)
    cls = type(get_method(method))
    real_quantize = cls.quantize

    def counting_quantize(self, *a, **k):
        quantised.append(1)
        return real_quantize(self, *a, **k)

    monkeypatch.setattr(cls, "quantize", counting_quantize)
    res = session.compute(cfg)
    assert counter.counts == {"K": 1, "V": 1}, counter.counts
    assert len(quantised) == 1
    assert {t.variant for t in res.timings} >= {res.method.label}  # the method's kernels were still timed


def test_results_carry_the_softmax_scale(session, tmp_path):
    from kvviz.report.compare_run import results_scale
    from kvviz.sources.kv_files import save_kv

    res = session.compute(SessionConfig(context_lens=(20,), num_heads=2, num_kv_heads=1, head_size=64, timing_runs=3))
    assert res.scale == pytest.approx(1 / 8) and res.summary_json()["softmax_scale"] == res.scale
    res = session.compute(SessionConfig(context_lens=(20,), num_heads=2, num_kv_heads=1, head_size=64, timing_runs=3,
                                        softmax_scale=0.05))
    assert res.scale == 0.05 and results_scale(res) == 0.05
    # a dump decides the head size: the scale is 1/sqrt(its head size), not the config's head_size
    k = np.random.default_rng(0).standard_normal((1, 1, 30, 32)).astype(np.float32)
    path = save_kv(tmp_path / "kv.npz", k, k.copy(), None)
    res = session.compute(SessionConfig(source="kvfile", kv_file=str(path), head_size=128, timing_runs=3))
    assert res.scale == pytest.approx(32 ** -0.5) and results_scale(res) == res.scale


def test_turboquant_rotation_follows_the_layer(session, tmp_path):
    """Layer 12 of a dump is quantised with layer 12's rotation signs (TQParams(d, seed, 12)), not layer 0's:
    the GPU's key words are the oracle's compression with layer 12's parameters."""
    from kvviz.families.turboquant import oracle as tqo
    from kvviz.sources.kv_files import save_kv

    rng = np.random.default_rng(3)
    L, kvh, T, d = 13, 1, 24, 64
    k = rng.standard_normal((L, kvh, T, d)).astype(np.float32)
    v = rng.standard_normal((L, kvh, T, d)).astype(np.float32)
    path = save_kv(tmp_path / "kv.npz", k, v, None)
    res = session.compute(SessionConfig(source="kvfile", kv_file=str(path), layer=12, method="turboquant",
                                        num_heads=2, timing_runs=3))
    assert res.method.layer == 12
    kw_gpu, _ = res.qkv.extra["words"][0]
    kw12, _ = tqo.compress_cache(res.key, res.value, T, tqo.TQParams(d, tqo.DEFAULT_SEED, 12))
    kw0, _ = tqo.compress_cache(res.key, res.value, T, tqo.TQParams(d, tqo.DEFAULT_SEED, 0))
    polar = kvh * T * d // 16  # the polar-index words: where the rotation shows
    assert np.mean(kw_gpu[:polar] == kw12[:polar]) > 0.99  # rounding at centroid boundaries may flip a few
    assert np.mean(kw_gpu[:polar] == kw0[:polar]) < 0.5


@pytest.mark.parametrize("method", ["int8_seed", "int4_group", "turboquant"])
def test_kv_checked_for_nan_once_per_compute(session, method, monkeypatch):
    """K and V are scanned for NaN/Inf once per compute; the writers' own input checks (which stay, for
    callers outside a session) find that memory already checked."""
    import kvviz.errors as errors

    scans = []
    real = errors._checked_already

    def spy(a):
        done = real(a)
        if not done and a.ndim == 3 and a.shape[1:] == (2, 64):  # a K/V-shaped array about to be scanned
            scans.append(a.shape)
        return done

    monkeypatch.setattr(errors, "_checked_already", spy)
    cfg = SessionConfig(method=method, context_lens=(45, 20), num_heads=4, num_kv_heads=2, head_size=64, timing_runs=3)
    session.compute(cfg)
    assert len(scans) == 2, scans  # K once, V once
    assert not errors._known_finite  # the scope ends with the compute
