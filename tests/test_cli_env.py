"""The CLI's output is what kvviz says, not driver noise: without XDG_RUNTIME_DIR (CI, ssh, containers)
Mesa's Vulkan loader would print "error: XDG_RUNTIME_DIR is invalid" twice on every command."""
import os
import subprocess
import sys

import pytest


@pytest.mark.gpu
def test_no_runtime_dir_noise_on_stderr():
    env = {k: v for k, v in os.environ.items() if k != "XDG_RUNTIME_DIR"}
    r = subprocess.run([sys.executable, "-m", "kvviz", "info"], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "XDG_RUNTIME_DIR" not in r.stderr, r.stderr
    assert "adapter:" in r.stdout
