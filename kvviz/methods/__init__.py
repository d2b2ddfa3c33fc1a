"""The method framework: what a quantisation method is (`KVMethod`, its options, cache layouts), the
`@register` decorator, the per-token-record machinery shared by most methods and the live caches they grow.

The methods themselves live in the families above, each in its own folder, and register themselves
with `@register` when they are imported; the registry that looks them up by key loads them all first.
"""
from kvviz.methods.base import (  # noqa: F401
    KVMethod,
    OptionSpec,
    register,
)
