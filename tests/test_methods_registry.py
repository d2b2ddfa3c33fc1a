"""The method registry (kvviz/families/registry.py) and the typed option schema (kvviz/methods/base.py),
without a GPU: every option type parsed from JSON values and from typed text, choices and ranges enforced
with errors naming the option, every registered method's schema, examples and numpy reference found by
name."""
import numpy as np
import pytest

from kvviz.errors import InvalidInput
from kvviz.families.registry import get_method, option_defaults, option_schema, parse_options, reference, registry
from kvviz.methods import KVMethod, OptionSpec, register
from kvviz.paging import make_batch

INT = OptionSpec("n", int, 3, "a count", minimum=0, maximum=10)
FLOAT = OptionSpec("x", float, 0.5, "a fraction", minimum=0.0, maximum=1.0)
STR = OptionSpec("mode", str, "a", "a mode", choices=("a", "b"))
BOOL = OptionSpec("on", bool, False, "a switch")
CHOICE = OptionSpec("bits", int, 2, "code bits", choices=(2, 4))


@pytest.mark.parametrize("spec,value,want", [
    (INT, 7, 7), (INT, np.int64(7), 7), (INT, "7", 7), (INT, " +7 ", 7), (INT, 0, 0), (INT, 10, 10),
    (FLOAT, 1, 1.0), (FLOAT, 0.25, 0.25), (FLOAT, "0.25", 0.25), (FLOAT, "1e-1", 0.1),
    (STR, "b", "b"),
    (BOOL, True, True), (BOOL, np.bool_(False), False), (BOOL, "true", True), (BOOL, "No", False), (BOOL, "1", True),
    (CHOICE, 4, 4), (CHOICE, "4", 4),
])
def test_parse_every_type(spec, value, want):
    got = spec.parse(value)
    assert got == want and type(got) is spec.type


@pytest.mark.parametrize("spec,value,what", [
    (INT, 1.5, "integer"), (INT, True, "integer"), (INT, "1.5", "integer"), (INT, "seven", "integer"),
    (INT, -1, "in [0, 10]"), (INT, 11, "in [0, 10]"), (STR, " b ", "'a', 'b'"),
    (FLOAT, float("nan"), "finite"), (FLOAT, float("inf"), "finite"), (FLOAT, "abc", "number"), (FLOAT, 2.0, "1"),
    (FLOAT, False, "number"),
    (STR, "c", "'a', 'b'"), (STR, 3, "string"),
    (BOOL, "maybe", "true or false"), (BOOL, 1, "true or false"),
    (CHOICE, 3, "one of 2, 4"), (CHOICE, "3", "one of 2, 4"),
])
def test_bad_values_name_the_option_and_what_it_takes(spec, value, what):
    with pytest.raises(InvalidInput) as e:
        spec.parse(value)
    assert repr(spec.name) in str(e.value) and what in str(e.value)


def test_json_values_are_not_read_as_text():
    """A config file's {"bits": "4"} is a string, not an integer; typed text is read only with text=True."""
    with pytest.raises(InvalidInput, match="bits.*integer"):
        CHOICE.parse("4", text=False)
    assert parse_options("kivi", {"bits": "4"}, text=True)["bits"] == 4
    with pytest.raises(InvalidInput, match="bits.*integer"):
        parse_options("kivi", {"bits": "4"})


def test_parse_options_fills_defaults_and_lists_known_options():
    assert parse_options("kivi", {"bits": 4}) == {"bits": 4, "recent": 128, "context_len": 4096}
    assert parse_options("kivi", {"rotation": "hadamard"}, defaults=False) == {"rotation": "hadamard"}
    assert parse_options("kivi", {"bits": 4}, defaults=False) == {"bits": 4}
    assert option_defaults("int4_group") == {"group_size": 32, "rotation": "none"}
    assert option_defaults("q4_0") == {"rotation": "none", "llama_cpp": "off"}
    with pytest.raises(InvalidInput) as e:
        parse_options("kivi", {"nope": 1})
    line = e.value.one_line()
    assert "nope" in line and all(n in line for n in ("bits", "recent", "context_len"))
    with pytest.raises(InvalidInput, match="recent"):
        parse_options("kivi", {"recent": -1})
    with pytest.raises(InvalidInput, match="context_len"):
        parse_options("kivi", {"context_len": 0})
    with pytest.raises(InvalidInput, match="method_options"):
        parse_options("kivi", [("bits", 4)])
    with pytest.raises(InvalidInput, match="Unknown method"):
        option_schema("no_such_method")
    with pytest.raises(InvalidInput, match="--methods kivi:bits=3"):
        parse_options("kivi", {"bits": "3"}, text=True, where="--methods kivi:bits=3")


def test_declared_schemas():
    """The options each method declares: closed sets as choices, bounds as ranges."""
    rot = {"rotation": ("none", "hadamard")}
    assert {o.name: o.choices for o in option_schema("int4_group")} == {"group_size": (32, 64, 128), **rot}
    for m in ("fp8_e4m3", "fp8_e5m2"):
        assert {o.name: o.choices for o in option_schema(m)} == {"scale_mode": ("per_token", "per_tensor"), **rot}
    assert {o.name: o.choices for o in option_schema("q8_0")} == {**rot, "llama_cpp": ("off", "cpu", "cpu-unrotated")}
    kivi = {o.name: o for o in option_schema("kivi")}
    assert kivi["bits"].choices == (2, 4) and kivi["recent"].minimum == 0 and kivi["context_len"].default == 4096
    tq = {o.name: o for o in option_schema("turboquant")}
    assert set(tq) == {"qjl_scale", "seed", "bits", "v_bits", "outlier_share", "rotation"} and tq["seed"].minimum == 0  # the layer is the workload's
    assert [o.name for o in option_schema("int8_seed")] == [o.name for o in option_schema("int8_token")] == ["rotation"]


@pytest.mark.parametrize("method_id", sorted(registry()))
def test_every_method_is_complete(method_id):
    """Label, schema (defaults accepted, help given), examples, options() round trip, reference by name."""
    cls = registry()[method_id]
    assert cls.label and cls.family
    for o in cls.OPTIONS:
        assert o.type in (int, float, str, bool) and o.help and o.parse(o.default) == o.default
    for ex in cls.examples():
        m = get_method(method_id, **ex)
        assert m.options() == parse_options(method_id, ex)
        assert get_method(method_id, **m.options()).options() == m.options()
    assert callable(reference(method_id))


@pytest.mark.parametrize("method_id", sorted(registry()))
def test_every_reference_runs(method_id):
    """Each method's numpy reference takes a small batch (numpy only): a method the reference does not
    know fails here, not in `kvviz bench`."""
    rng = np.random.default_rng(1)
    batch = make_batch([37, 20], 16, policy="scattered", seed=2)
    T, kvh, H, D = batch.num_tokens, 2, 4, 128
    key = rng.standard_normal((T, kvh, D)).astype(np.float32)
    value = rng.standard_normal((T, kvh, D)).astype(np.float32)
    q = rng.standard_normal((batch.num_seqs, H, D)).astype(np.float32)
    for ex in registry()[method_id].examples():
        out, tol = reference(method_id)(get_method(method_id, **ex), batch, key, value, q, D ** -0.5)
        assert out.shape == (batch.num_seqs, H, D) and np.isfinite(out).all() and tol > 0


def test_registration_needs_a_label_and_a_reference():
    class NoReference(KVMethod):
        id, label, family = "test_no_reference", "no reference", "test"

    with pytest.raises(ValueError, match="reference"):
        register(NoReference)

    class NoLabel(KVMethod):
        id, family, REFERENCE = "test_no_label", "test", "kvviz.families.registry:reference_attention"

    with pytest.raises(ValueError, match="label"):
        register(NoLabel)

    class BadDefault(KVMethod):
        id, label, family, REFERENCE = "test_bad_default", "bad", "test", "x:y"
        OPTIONS = (OptionSpec("bits", int, 3, "code bits", choices=(2, 4)),)

    with pytest.raises(InvalidInput, match="bits"):
        register(BadDefault)
    assert not {"test_no_reference", "test_no_label", "test_bad_default"} & set(registry())


def test_turboquant_layer_follows_the_workload():
    m = get_method("turboquant", seed=7)
    assert m.layer == 0 and m.for_layer(0) is m
    m12 = m.for_layer(12)
    assert m12.layer == 12 and m12.options() == m.options() and m.layer == 0
    assert m12.params(64).layer == 12
    with pytest.raises(InvalidInput, match="layer"):
        get_method("turboquant", layer=12)
    k = get_method("kivi")
    assert k.for_layer(5) is k  # a method whose cache does not depend on the layer
