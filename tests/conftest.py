"""Shared fixtures. Qt runs offscreen in tests (set here, not by hand), the GPU is lavapipe in CI."""
import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def rt():
    from kvviz.gpu.runtime import GpuRuntime

    runtime = GpuRuntime()
    yield runtime


@pytest.fixture(scope="session")
def ctx(rt):
    from kvviz.methods.context import GpuContext

    return GpuContext(rt)
