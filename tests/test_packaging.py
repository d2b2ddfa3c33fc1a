"""The wheel built from the repository carries every shader and runs its kernels once installed.

Built with `pip wheel` (setuptools in an isolated build environment, as `make` installs kvviz), then
unpacked into a fresh virtual environment. The environment takes kvviz from the wheel and the other
dependencies (wgpu, numpy, ...) from this test environment's site-packages through a .pth file, so the
test needs no download beyond the build backend, and `kvviz bench` (one timed run a kernel, one method of every family)
runs from a folder outside the repository: its kernels are compiled from the installed package's shaders.
"""
import json
import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from kvviz.families.registry import family_of, registry

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_wheel_ships_the_shaders_and_runs_the_bench(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # nothing of the checkout on the path
    dist = tmp_path / "dist"
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "-v", "-w", str(dist)],
                           check=True, cwd=tmp_path, env=env, capture_output=True, text=True)
    # the build backend's own log (pip -v shows it): no "Package would be ignored" for a shader folder
    assert "would be ignored" not in build.stdout + build.stderr, \
        [ln for ln in (build.stdout + build.stderr).splitlines() if "absent from the `packages`" in ln]
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

    # one method of each family: every family's shader folder is read from the wheel (the next test holds every
    # folder to the package list); every method's kernels are the other tests' business
    families = {}
    for key in sorted(registry()):
        families.setdefault(family_of(key), key)
    out = tmp_path / "bench.json"
    r = subprocess.run([str(py), "-m", "kvviz", "bench", "--shape", "quick-ragged", "--runs", "1", "--warmup", "0",
                        "--frontends", "glslang", "--methods", ",".join(families.values()), "--json", str(out)],
                       capture_output=True, text=True, cwd=tmp_path, timeout=500, env=env)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    rows = json.loads(out.read_text())["rows"]
    checked = [row for row in rows if row["tolerance"] is not None]
    assert checked and all(row["within_tolerance"] for row in checked)
    assert {row.get("method") for row in rows} >= set(families.values())


def test_every_shader_folder_is_a_listed_package_with_its_files_as_data(monkeypatch):
    """setup.py lists each folder of shaders/ as a package `kvviz.shaders.<folder>` whose data are its shader
    files: a folder Python can import but setuptools was not told of is built with a warning wall."""
    import setuptools

    got = {}
    monkeypatch.setattr(setuptools, "setup", lambda **kw: got.update(kw))
    monkeypatch.chdir(ROOT)
    src = (ROOT / "setup.py").read_text()
    exec(compile(src, str(ROOT / "setup.py"), "exec"), {"__name__": "__main__"})
    folders = sorted(p.name for p in (ROOT / "shaders").iterdir() if p.is_dir() and p.name != "__pycache__")
    assert folders
    for f in folders:
        pkg = f"kvviz.shaders.{f}"
        assert pkg in got["packages"], pkg
        files = [p.name for p in (ROOT / "shaders" / f).iterdir() if p.is_file()]
        patterns = got["package_data"][pkg]
        assert files and all(any(Path(n).match(pat) for pat in patterns) for n in files), (f, files, patterns)
    assert got["package_dir"] == {"kvviz.shaders": "shaders"}
