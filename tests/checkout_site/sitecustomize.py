"""Python processes the tests start (and the test session itself, through tests/conftest.py) use THIS checkout's
kvviz and its shaders.

setup.py maps the top-level shaders/ to the package `kvviz.shaders`; an editable install resolves that name through
its own finder, to the checkout it was installed from. A checkout tested with another checkout's virtual
environment (a git worktree beside the main one) would compile the other checkout's shaders. Where the kvviz
imported is this checkout's, `kvviz.shaders` is bound here to this checkout's shaders/ before anything loads them;
in a checkout tested with its own environment both are the same folder and nothing changes.
"""
import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def use_checkout_shaders() -> None:
    shaders = ROOT / "shaders"
    if "kvviz.shaders" in sys.modules or not (shaders / "__init__.py").is_file():
        return
    try:
        import kvviz
    except ImportError:
        return
    if Path(kvviz.__file__).resolve().parents[1] != ROOT:
        return
    spec = importlib.util.spec_from_file_location("kvviz.shaders", shaders / "__init__.py",
                                                  submodule_search_locations=[str(shaders)])
    mod = importlib.util.module_from_spec(spec)
    sys.modules["kvviz.shaders"] = mod
    spec.loader.exec_module(mod)
    kvviz.shaders = mod


use_checkout_shaders()
