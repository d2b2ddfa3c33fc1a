"""What the window's start-up leaves out or runs beside its imports: ml_dtypes (slow to load) is not
imported by the window and its Kernel lab, an FP8 format's codes come from its bits, and the GPU opened
early is handed over once, its failure raised where the GPU is used."""
import os
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_window_and_its_kernel_slots_do_not_import_ml_dtypes():
    code = ("import sys; import kvviz.cli, kvviz.ui.main_window; from kvviz.lab.slots import slots; slots(); "
            "print('ml_dtypes' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, QT_QPA_PLATFORM="offscreen"))
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "False"


def test_fp8_max_codes_from_their_bits_match_ml_dtypes():
    import ml_dtypes

    from kvviz.families.fp8.format import FORMATS

    for name, dt in (("e4m3", ml_dtypes.float8_e4m3fn), ("e5m2", ml_dtypes.float8_e5m2)):
        f = FORMATS[name]
        assert f.max_code == int(np.array([f.max], np.float32).astype(dt).view(np.uint8)[0]), name
        assert f.dtype is dt


def test_the_early_gpu_is_handed_over_once_and_its_failure_raised_there(monkeypatch):
    from kvviz.errors import GpuUnavailable
    from kvviz.gpu import runtime

    assert runtime.take_early() is None  # none started

    class Fake:
        pass

    monkeypatch.setattr(runtime, "GpuRuntime", Fake)
    runtime.open_early()
    runtime.open_early()  # once
    got = runtime.take_early()
    assert isinstance(got, Fake) and runtime.take_early() is None

    def broken():
        raise GpuUnavailable("No wgpu adapter was found.")

    monkeypatch.setattr(runtime, "GpuRuntime", broken)
    runtime.open_early()
    with pytest.raises(GpuUnavailable):
        runtime.take_early()
    assert runtime.take_early() is None


def test_a_session_takes_the_early_gpu(monkeypatch):
    from kvviz.analysis import session as sess

    made = []

    class Fake:
        lost_reason = None

    monkeypatch.setattr(sess, "take_early", lambda: made.append("early") or Fake())
    s = sess.Session()
    assert isinstance(s.rt, Fake) and made == ["early"]
    assert isinstance(s.rt, Fake) and made == ["early"]  # taken once, then kept
