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


def option_schema(method_id: str) -> tuple[OptionSpec, ...]:
    """The method's declared options (what the window's editors, the CLI and config files take)."""
    return tuple(method_class(method_id).OPTIONS)


def option_defaults(method_id: str) -> dict:
    """{option name: declared default} of a method."""
    return {o.name: o.default for o in option_schema(method_id)}


def parse_options(method_id: str, values, *, text: bool = False, where: str = "method_options",
                  defaults: bool = True) -> dict:
    """The method's options from `values` (a mapping of option name to value), each parsed by its
    OptionSpec: {name: typed value} for every declared option (defaults=False: only those in `values`).

    text=False: values are JSON values (a config file, `--set method_options=...`, code) and must have
    the option's type already ("4" is not an integer). text=True: values may be text a user typed
    (`kvviz live --methods kivi:bits=4`). InvalidInput names the option and lists the known ones.
    """
    return method_class(method_id).parse_options(values, text=text, where=where, defaults=defaults)


def get_method(method_id: str, **options) -> KVMethod:
    """A method instance with its options checked against its schema (InvalidInput otherwise)."""
    return method_class(method_id)(**options)


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
