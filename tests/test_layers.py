"""The import contracts of pyproject.toml ([tool.importlinter]): the layer order, no circles among the
modules of any package, and the window kept off kernels, formats and oracles. import-linter checks
them over the code as it is (every import, those inside functions too)."""
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_import_contracts_hold():
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), NO_COLOR="1")
    r = subprocess.run([sys.executable, "-c", "from importlinter.cli import lint_imports_command; lint_imports_command()",
                        "--no-cache"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    m = re.search(r"Contracts: (\d+) kept, (\d+) broken", out)
    assert m and (int(m.group(1)), int(m.group(2))) == (3, 0), out[-4000:]
