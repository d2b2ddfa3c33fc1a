"""The Qt-free session on every source: synthetic presets, a real model (SmolLM2), a KV dump file."""
import numpy as np
import pytest

from kvviz.analysis.metrics import outlier_ratio
from kvviz.analysis.session import Session, SessionConfig
from kvviz.errors import InvalidInput

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def session(rt):
    return Session(rt)


def test_synthetic_presets_compute(session):
    for preset in ("gaussian", "llama-like", "heavy-tailed", "zeros", "constant"):
        cfg = SessionConfig(preset=preset, context_lens=(40, 17), num_heads=4, num_kv_heads=2, head_size=64, timing_runs=3)
        res = session.compute(cfg)
        assert res.out_ref.shape == (2, 4, 64) and res.w_q.shape == (2, 4, 40)
        if preset == "zeros":
            # amax == 0: every code 0, every scale exactly 1.0, attention uniform
            assert res.k_stats.zero_fraction == 1.0
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
