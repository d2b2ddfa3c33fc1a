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


# Imports that may stay inside a function, and why: Qt (and the window, from the Qt-free core), torch and
# transformers (optional extras), wgpu (the core loads without a GPU stack), resource (Unix only), ml_dtypes
# (loading it registers its ufunc loops one by one, slowing the window's start-up; the float8, float4 and
# bfloat16 paths load it when they need it).
LAZY_ROOTS = ("PySide6", "pyqtgraph", "shiboken6", "torch", "transformers", "wgpu", "resource", "ml_dtypes")
LAZY_KVVIZ = ("kvviz.ui", "kvviz.cli_report")


def _function_imports(path):
    import ast

    tree = ast.parse(open(path).read(), path)
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(fn):
                if isinstance(node, ast.Import):
                    yield node.lineno, node.names[0].name
                elif isinstance(node, ast.ImportFrom):
                    yield node.lineno, ("." * node.level) + (node.module or "")


def test_imports_sit_at_the_top_of_modules():
    """Every import inside a function is a deliberate lazy one (LAZY_ROOTS; the window from outside it)."""
    bad = []
    for dirpath, _, files in os.walk(os.path.join(ROOT, "kvviz")):
        for f in files:
            if not f.endswith(".py"):
                continue
            p = os.path.join(dirpath, f)
            here = os.path.relpath(p, ROOT).replace(os.sep, ".")
            for line, mod in _function_imports(p):
                lazy_ui = mod.startswith(LAZY_KVVIZ) and not here.startswith("kvviz.ui.")
                if mod.split(".")[0] not in LAZY_ROOTS and not lazy_ui:
                    bad.append(f"{os.path.relpath(p, ROOT)}:{line}: {mod}")
    assert not bad, "imports inside functions (move them to the top of the module):\n" + "\n".join(bad)
