"""The registry of quantisation methods: every family's methods, looked up by key.

The method framework (kvviz.methods.base) keeps what `@register` collects; the lookups here load every
family first (`load_all`), so they see each method whatever was imported before. The window, the CLI,
the report, the bench and the kernel lab list and build methods through these functions.
"""
from __future__ import annotations

import importlib
from typing import Callable

from kvviz.errors import InvalidInput
from kvviz.families import load_all
from kvviz.methods import transform
from kvviz.methods.base import KVMethod, OptionSpec, registered


def registry() -> dict[str, type]:
    """{key: class} of every registered method, every family loaded."""
    load_all()
    return registered()


def method_class(method_id: str) -> type:
    reg = registry()
    if method_id not in reg:
        raise InvalidInput(f"Unknown method {method_id!r}; available: {', '.join(sorted(reg))}",
                           "Pick one of the registered methods (`kvviz info` lists them).")
    return reg[method_id]


def transform_options(method_id: str) -> tuple[OptionSpec, ...]:
    """The host-side transform options the method takes besides its own (kvviz/methods/transform.py): the
    Hadamard rotation for every method, llama.cpp's way of running its types for those types."""
    return transform.options_for(family_of(method_id))


def option_schema(method_id: str) -> tuple[OptionSpec, ...]:
    """The method's options (what the window's editors, the CLI and config files take): its declared ones,
    then the transform options."""
    return tuple(method_class(method_id).OPTIONS) + transform_options(method_id)


def option_defaults(method_id: str) -> dict:
    """{option name: declared default} of a method."""
    return {o.name: o.default for o in option_schema(method_id)}


def _split(method_id: str, values) -> tuple[dict, dict]:
    """(the method's own options, the transform options) of a mapping of option values."""
    if not isinstance(values, dict):
        return values, {}
    names = {o.name for o in transform_options(method_id)}
    return ({k: v for k, v in values.items() if k not in names}, {k: v for k, v in values.items() if k in names})


def parse_options(method_id: str, values, *, text: bool = False, where: str = "method_options",
                  defaults: bool = True) -> dict:
    """The method's options from `values` (a mapping of option name to value), each parsed by its
    OptionSpec: {name: typed value} for every declared option (defaults=False: only those in `values`); the
    transform options (rotation, llama_cpp) only where `values` gives them.

    text=False: values are JSON values (a config file, `--set method_options=...`, code) and must have
    the option's type already ("4" is not an integer). text=True: values may be text a user typed
    (`kvviz live --methods kivi:bits=4`). InvalidInput names the option and lists the known ones.
    """
    cls = method_class(method_id)
    specs = transform_options(method_id)
    own, extra = _split(method_id, values)
    try:
        out = cls.parse_options(own, text=text, where=where, defaults=defaults)
    except InvalidInput as exc:  # the listing names the transform options too
        listing = ", ".join(o.describe() for o in option_schema(method_id))
        raise InvalidInput(str(exc), f"Options of {cls.id}: {listing}.") from None
    for o in specs:  # a transform option is named only where given (a plain method's options() are its own)
        if o.name in extra:
            out[o.name] = o.parse(extra[o.name], text=text, where=f"{where}: {cls.id}")
    return out


def get_method(method_id: str, **options) -> KVMethod:
    """A method instance with its options checked against its schema (InvalidInput otherwise); with a transform
    option set (rotation, llama_cpp), the method wrapped in its transform (kvviz.methods.transform)."""
    own, extra = _split(method_id, options)
    extra = {k: v for k, v in parse_options(method_id, extra, defaults=False).items()
             if v != next(o.default for o in transform_options(method_id) if o.name == k)}
    inner = method_class(method_id)(**own)
    return transform.TransformedMethod(inner, extra) if extra else inner


def reference(method_id: str) -> Callable:
    """The method's end-to-end numpy reference, imported by name: f(method, batch, key, value, q, scale,
    qkv=None) -> (output [S, H, D], tolerance). Only `kvviz bench` and the tests call it."""
    cls = method_class(method_id)
    mod, _, fn = cls.REFERENCE.partition(":")
    return getattr(importlib.import_module(mod), fn)


def reference_attention(method, batch, key, value, q, scale, qkv=None):
    """(output [S, H, D], tolerance) of any registered method: the function its REFERENCE names."""
    return reference(method.id)(method, batch, key, value, q, scale, qkv)


def family_of(method_id: str) -> str:
    """The family a registered method belongs to: its package under kvviz.families."""
    parts = method_class(method_id).__module__.split(".")
    return parts[2] if parts[:2] == ["kvviz", "families"] and len(parts) > 2 else parts[-1]
