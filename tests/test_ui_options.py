"""The shared method-options editor (kvviz.ui.widgets.options_editor) built from the typed option schema."""
import pytest
from PySide6.QtWidgets import QCheckBox, QComboBox, QDoubleSpinBox, QLineEdit, QSpinBox

from kvviz.errors import InvalidInput
from kvviz.methods import OptionSpec
from kvviz.families.registry import option_schema

SCHEMA = (
    OptionSpec("bits", int, 4, "bits per code", choices=(2, 4, 8)),
    OptionSpec("recent", int, 16, "tokens kept in f32", minimum=0, maximum=512),
    OptionSpec("ratio", float, 0.5, "a fraction", minimum=0.0, maximum=1.0),
    OptionSpec("signed", bool, True, "signed codes"),
    OptionSpec("tag", str, "x", "a free label"),
)


@pytest.fixture
def schema(monkeypatch):
    import kvviz.ui.widgets.options_editor as oe

    monkeypatch.setattr(oe, "option_specs", lambda method_id: SCHEMA if method_id == "fake" else ())
    return SCHEMA


@pytest.mark.parametrize("layout", ["form", "row"])
def test_editors_follow_the_schema(qtbot, schema, monkeypatch, layout):
    from kvviz.ui.widgets.options_editor import OptionsEditor

    ed = OptionsEditor(layout)
    qtbot.addWidget(ed)
    ed.build("fake")
    e = ed.editors
    assert isinstance(e["bits"], QComboBox)
    assert [e["bits"].itemData(i) for i in range(e["bits"].count())] == [2, 4, 8]
    assert e["bits"].currentData() == 4
    assert isinstance(e["recent"], QSpinBox) and (e["recent"].minimum(), e["recent"].maximum()) == (0, 512)
    e["recent"].setValue(9999)  # the spin box holds the range
    assert e["recent"].value() == 512
    assert isinstance(e["ratio"], QDoubleSpinBox) and (e["ratio"].minimum(), e["ratio"].maximum()) == (0.0, 1.0)
    assert isinstance(e["signed"], QCheckBox) and e["signed"].isChecked()
    assert isinstance(e["tag"], QLineEdit)
    assert "bits per code" in e["bits"].toolTip() and "one of 2, 4, 8" in e["bits"].toolTip()
    assert "tokens kept in f32" in e["recent"].toolTip()

    # every value is read through OptionSpec.parse
    parsed = []
    real = OptionSpec.parse

    def spy(self, value, **kw):
        parsed.append(self.name)
        return real(self, value, **kw)

    monkeypatch.setattr(OptionSpec, "parse", spy)
    assert ed.options() == {"recent": 512}
    assert sorted(parsed) == sorted(s.name for s in SCHEMA)
    with qtbot.waitSignal(ed.changed):
        e["bits"].setCurrentIndex(e["bits"].findData(8))
    ed.set_value("signed", "false")  # a user's text, parsed
    assert ed.values() == {"bits": 8, "recent": 512, "ratio": 0.5, "signed": False, "tag": "x"}
    assert ed.options() == {"bits": 8, "recent": 512, "signed": False}
    with pytest.raises(InvalidInput, match="bits"):
        ed.set_value("bits", 3)  # not a choice: refused by the schema


def test_every_registered_method_gets_its_editors(qtbot):
    from kvviz.families.registry import registry
    from kvviz.ui.widgets.options_editor import OptionsEditor

    ed = OptionsEditor()
    qtbot.addWidget(ed)
    for key in registry():
        ed.build(key)
        specs = option_schema(key)
        assert list(ed.editors) == [s.name for s in specs]
        assert ed.values() == {s.name: s.default for s in specs}  # the defaults, typed
        assert ed.options() == {}
        for s in specs:
            w = ed.editors[s.name]
            if s.choices:
                assert isinstance(w, QComboBox)
            elif s.type is int:
                assert isinstance(w, QSpinBox) and w.minimum() == (s.minimum if s.minimum is not None else -2**31)
    ed.build("no_such_method")
    assert ed.editors == {} and ed.options() == {}


def test_values_given_at_build_are_shown(qtbot, schema):
    from kvviz.ui.widgets.options_editor import OptionsEditor

    ed = OptionsEditor("row")
    qtbot.addWidget(ed)
    ed.build("fake", {"bits": 2, "ratio": 0.25, "tag": "y"})
    assert ed.editors["bits"].currentData() == 2 and ed.editors["ratio"].value() == 0.25
    assert ed.options() == {"bits": 2, "ratio": 0.25, "tag": "y"}
    ed.editors["tag"].setText("x")
    assert ed.options() == {"bits": 2, "ratio": 0.25}
