"""Kernel families: one name for a family's shaders, launcher, bit format and numpy reference.

A family is one unit: its shaders live in shaders/<folder>/, its kernel specs (KernelSpec: shader,
entry, named bindings, immediates) and host launchers in its launcher module, its bit format in
kvviz/formats/, its numpy reference in kvviz/oracles/. The product path never imports a reference:
`reference(name)` loads one by its module name, for `kvviz bench` and the tests.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType

from kvviz.errors import InvalidInput


@dataclass(frozen=True)
class KernelFamily:
    name: str
    shaders: str  # folder under shaders/
    launcher: str  # module holding the kernel specs (KERNELS) and the host launchers
    reference: str | None  # module name of the numpy reference (None: nothing to reproduce)
    format: str | None = None  # module name of the bit format in kvviz/formats/
    specs: str = "KERNELS"  # attribute of the launcher listing the family's KernelSpecs
    key: str | None = None  # for a dict-valued attribute: the family's entry


FAMILIES: dict[str, KernelFamily] = {f.name: f for f in (
    KernelFamily("paged", "paged", "kvviz.kernels.paged", "kvviz.oracles.paged", "kvviz.formats.int8"),
    KernelFamily("copy", "copy", "kvviz.kernels.copy", None),
    KernelFamily("probe", "probe", "kvviz.gpu.runtime", None, specs="PROBES"),
    KernelFamily("int8", "quant", "kvviz.kernels.quant", "kvviz.oracles.int8", "kvviz.formats.int8", key="int8"),
    KernelFamily("int4", "quant", "kvviz.kernels.quant", "kvviz.oracles.int4", "kvviz.formats.asym", key="int4"),
    KernelFamily("fp8", "quant", "kvviz.kernels.quant", "kvviz.oracles.fp8", "kvviz.formats.fp8", key="fp8"),
    KernelFamily("fp8_vllm", "quant", "kvviz.kernels.fp8_vllm", "kvviz.oracles.fp8", "kvviz.formats.fp8"),
    KernelFamily("kivi", "quant", "kvviz.kernels.quant", "kvviz.oracles.kivi", "kvviz.formats.kivi", key="kivi"),
    KernelFamily("quant_selftest", "quant", "kvviz.kernels.quant", None, key="selftest"),
    KernelFamily("turboquant", "turboquant", "kvviz.kernels.turboquant", "kvviz.oracles.turboquant",
                 "kvviz.formats.turboquant"),
    KernelFamily("ggml", "ggml", "kvviz.kernels.ggml", "kvviz.oracles.ggml", "kvviz.formats.ggml", key="ggml"),
    KernelFamily("fp4", "fp4", "kvviz.kernels.ggml", "kvviz.oracles.fp4", "kvviz.formats.fp4", key="fp4"),
    KernelFamily("fast_write", "fast", "kvviz.kernels.fast_write", "kvviz.oracles.fast_write", key="fast_write"),
    KernelFamily("f16", "fast", "kvviz.kernels.fast_write", "kvviz.oracles.f16", "kvviz.formats.f16", key="f16"),
    # the split-K decodes and the later fast writers: generated shaders (their launchers render the defines)
    KernelFamily("fast_decode", "fast", "kvviz.kernels.fast_decode", "kvviz.oracles.paged"),
    KernelFamily("fast_decode_ggml", "fast", "kvviz.kernels.fast_decode_ggml", "kvviz.oracles.ggml", "kvviz.formats.ggml"),
    KernelFamily("fast_decode_kivi", "fast", "kvviz.kernels.fast_decode_kivi", "kvviz.oracles.kivi", "kvviz.formats.kivi"),
    KernelFamily("fast_decode_tq", "fast", "kvviz.kernels.fast_decode_tq", "kvviz.oracles.turboquant",
                 "kvviz.formats.turboquant"),
    KernelFamily("fast_decode_fp4", "fast", "kvviz.kernels.fast_decode_fp4", "kvviz.oracles.fp4", "kvviz.formats.fp4"),
    KernelFamily("fast_write_ggml", "fast", "kvviz.kernels.fast_write_ggml", "kvviz.oracles.ggml", "kvviz.formats.ggml",
                 key="fast_write_ggml"),
    KernelFamily("fast_write_tq", "fast", "kvviz.kernels.fast_write_tq", "kvviz.oracles.turboquant",
                 "kvviz.formats.turboquant"),
)}


def family(name: str) -> KernelFamily:
    try:
        return FAMILIES[name]
    except KeyError:
        raise InvalidInput(f"Unknown kernel family {name!r}; known: {', '.join(FAMILIES)}") from None


def launcher(name: str) -> ModuleType:
    return importlib.import_module(family(name).launcher)


def kernel_specs(name: str) -> tuple:
    """The family's KernelSpecs, as its launcher declares them."""
    fam = family(name)
    specs = getattr(launcher(name), fam.specs)
    return tuple(specs[fam.key] if fam.key else specs)


def reference(name: str) -> ModuleType:
    """The family's numpy reference module, loaded by name (bench and tests only)."""
    fam = family(name)
    if fam.reference is None:
        raise InvalidInput(f"Kernel family {name!r} has no numpy reference.")
    return importlib.import_module(fam.reference)
