"""The wheel built from the repository carries every shader and runs its kernels once installed.

Built with `pip wheel` (setuptools in an isolated build environment, as `make` installs kvviz), then
unpacked into a fresh virtual environment. The environment takes kvviz from the wheel and the other
dependencies (wgpu, numpy, ...) from this test environment's site-packages through a .pth file, so the
test needs no download beyond the build backend, and `kvviz bench --quick` (one timed run a kernel) runs from a folder outside
the repository: every kernel is compiled from the installed package's shaders.
"""
import json
import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_wheel_ships_the_shaders_and_runs_the_bench(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # nothing of the checkout on the path
    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "-q", "-w", str(dist)],
                   check=True, cwd=tmp_path, env=env)
    wheel = next(dist.glob("kvviz-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    shaders = [p.relative_to(ROOT / "shaders").as_posix() for p in (ROOT / "shaders").rglob("*")
               if p.name.endswith((".wgsl", ".comp", ".wgsl.j2"))]
    assert shaders and all(f"kvviz/shaders/{s}" in names for s in shaders), \
        [s for s in shaders if f"kvviz/shaders/{s}" not in names]

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, env=env)
    py = venv / "bin" / "python"
    site = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True, env=env).stdout.strip())
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site), str(wheel)],
                   check=True, cwd=tmp_path, env=env)
    # dependencies from this environment (its .pth files, among them kvviz's editable finder, are not read)
    (site / "zz_test_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")

    where = subprocess.run(
        [str(py), "-c", "import kvviz, kvviz.gpu.shaders as s; print(kvviz.__file__); print(s.SHADER_DIR)"],
        check=True, capture_output=True, text=True, cwd=tmp_path, env=env).stdout.split()
    assert all(w.startswith(str(venv)) for w in where), where  # kvviz and its shaders from the wheel

    out = tmp_path / "bench.json"
    r = subprocess.run([str(py), "-m", "kvviz", "bench", "--quick", "--runs", "1", "--warmup", "0", "--frontends", "glslang",
         "--json", str(out)],
                       capture_output=True, text=True, cwd=tmp_path, timeout=500, env=env)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    rows = json.loads(out.read_text())["rows"]
    checked = [row for row in rows if row["tolerance"] is not None]
    assert checked and all(row["within_tolerance"] for row in checked)
