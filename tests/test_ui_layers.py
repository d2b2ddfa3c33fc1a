"""Layering of the window: panels reach kernels, formats and references only through the session (the
import contract in pyproject.toml holds it: tests/test_layers.py); the QJL panel through TurboQuant's bias."""
def test_qjl_bias_panel_goes_through_tq_bias():
    from kvviz.families.turboquant import bias as tq_bias
    from kvviz.ui.panels import qjl_bias

    assert qjl_bias.unsupported_reason is tq_bias.unsupported_reason
    assert tq_bias.unsupported_reason(64) == ""
    assert tq_bias.unsupported_reason(96) == ""  # the rotation padded to 128 (the general kernels)
    why = tq_bias.unsupported_reason(300)
    assert "300" in why and "256" in why
