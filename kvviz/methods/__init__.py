"""Quantisation methods. Every module of this package is imported here, so a method module registers
itself by being in the folder (kvviz/methods/base.py: `register`)."""
import importlib as _importlib
import pkgutil as _pkgutil

from kvviz.methods.base import (  # noqa: F401
    KVMethod,
    OptionSpec,
    get_method,
    method_class,
    option_defaults,
    option_schema,
    parse_options,
    reference,
    register,
    registry,
)

for _m in sorted(_pkgutil.iter_modules(__path__), key=lambda m: m.name):
    _importlib.import_module(f"{__name__}.{_m.name}")
