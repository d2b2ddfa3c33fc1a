"""The method framework: what a quantisation method is (`KVMethod`, its options, cache layouts), the
registry, the per-token-record machinery shared by most methods and the live caches they grow.

The methods themselves live in their family folders (kvviz/families/<family>/method*.py) and register
themselves with `@register`; `registry()` loads them on first use.
"""
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
