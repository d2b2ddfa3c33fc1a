"""Quantisation families: one folder per family holds everything of it.

A family folder (kvviz/families/<family>/) keeps its bit format (`format.py`: codes, records, per-type
facts), its methods (`method*.py`: a `KVMethod` subclass decorated with `@register`), its kernel specs
and host launchers (`kernels.py`, `decode.py`, `writer.py`), its numpy oracle (`oracle.py`) and, where
it needs one, its live cache (`live_cache.py`); its shaders are in shaders/<family>/. Families build on
the shared layers below them (kvviz.methods, kvviz.attention, kvviz.gpu, kvviz.paging).

This file imports nothing, so a family module can be imported on its own. `load_all()` imports every
family's method modules, which register their methods: the lookups of kvviz/families/registry.py
(`registry()`, `get_method`, ...) call it first.
"""
from __future__ import annotations

import functools
import importlib
import pkgutil


@functools.cache
def load_all() -> None:
    """Import every `method*.py` module of every family (each registers its methods); once a process."""
    for fam in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if not fam.ispkg:
            continue
        pkg = importlib.import_module(f"{__name__}.{fam.name}")
        for mod in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda m: m.name):
            if mod.name.startswith("method"):
                importlib.import_module(f"{pkg.__name__}.{mod.name}")
