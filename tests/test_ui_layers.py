"""Layering of the window: panels reach kernels, formats and references only through kvviz.analysis."""
import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FORBIDDEN = ("kvviz.kernels", "kvviz.oracles", "kvviz.formats")


def _imports(path):
    tree = ast.parse(open(path).read(), path)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            yield node.module


def test_the_window_imports_no_kernel_format_or_reference():
    bad = []
    for dirpath, _, files in os.walk(os.path.join(ROOT, "kvviz", "ui")):
        for f in files:
            if f.endswith(".py"):
                p = os.path.join(dirpath, f)
                bad += [f"{os.path.relpath(p, ROOT)}: {m}" for m in _imports(p) if m.startswith(FORBIDDEN)]
    assert not bad, bad


def test_qjl_bias_panel_goes_through_tq_bias():
    from kvviz.families.turboquant import bias as tq_bias
    from kvviz.ui.panels import qjl_bias

    assert qjl_bias.unsupported_reason is tq_bias.unsupported_reason
    assert tq_bias.unsupported_reason(64) == ""
    assert tq_bias.unsupported_reason(96) == ""  # the rotation padded to 128 (the general kernels)
    why = tq_bias.unsupported_reason(300)
    assert "300" in why and "256" in why
