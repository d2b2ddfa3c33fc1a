"""Kernel families: one name for a family's shaders, launcher, bit format and numpy reference.

A kernel family is one unit: its shaders live in shaders/<folder>/, its kernel specs (KernelSpec: shader,
entry, named bindings, immediates) and host launchers in its launcher module, its bit format and its
numpy reference in its quantisation family's folder (kvviz/families/<family>/format.py, oracle.py). The
product path never imports a reference: `reference(name)` loads one by its module name, for
`kvviz bench` and the tests.
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
    format: str | None = None  # module name of the bit format
    specs: str = "KERNELS"  # attribute of the launcher listing the family's KernelSpecs
    key: str | None = None  # for a dict-valued attribute: the family's entry


FAMILIES: dict[str, KernelFamily] = {f.name: f for f in (
    KernelFamily("paged", "attention", "kvviz.attention.paged", "kvviz.attention.paged_oracle", "kvviz.attention.int8_records"),
    KernelFamily("copy", "copy", "kvviz.gpu.copy", None),
    KernelFamily("probe", "probe", "kvviz.gpu.runtime", None, specs="PROBES"),
    KernelFamily("int8", "int8", "kvviz.families.int8.kernels", "kvviz.families.int8.oracle", "kvviz.attention.int8_records"),
    KernelFamily("int4", "int4", "kvviz.families.int4.kernels", "kvviz.families.int4.oracle", "kvviz.families.int4.format"),
    KernelFamily("fp8", "fp8", "kvviz.families.fp8.kernels", "kvviz.families.fp8.oracle", "kvviz.families.fp8.format"),
    KernelFamily("fp8_vllm", "fp8_vllm", "kvviz.families.fp8_vllm.kernels", "kvviz.families.fp8.oracle", "kvviz.families.fp8.format"),
    KernelFamily("kivi", "kivi", "kvviz.families.kivi.kernels", "kvviz.families.kivi.oracle", "kvviz.families.kivi.format"),
    KernelFamily("quant_selftest", "common", "kvviz.attention.records", None, key="selftest"),
    KernelFamily("turboquant", "turboquant", "kvviz.families.turboquant.kernels", "kvviz.families.turboquant.oracle",
                 "kvviz.families.turboquant.format"),
    KernelFamily("ggml", "ggml", "kvviz.families.ggml.kernels", "kvviz.families.ggml.oracle", "kvviz.families.ggml.format", key="ggml"),
    KernelFamily("fp4", "fp4", "kvviz.families.fp4.kernels", "kvviz.families.fp4.oracle", "kvviz.families.fp4.format", key="fp4"),
    KernelFamily("f16", "f16", "kvviz.families.f16.kernels", "kvviz.families.f16.oracle", "kvviz.families.f16.format"),
    # the split-K decodes and the later fast writers: generated shaders (their launchers render the defines)
    KernelFamily("fast_decode", "attention", "kvviz.attention.split_decode", "kvviz.attention.paged_oracle"),
    # the causal prefill over every cache: one kernel, a shell per cache layout (kvviz/attention/prefill.py)
    KernelFamily("prefill", "attention", "kvviz.attention.prefill", "kvviz.attention.prefill_oracle"),
    KernelFamily("fast_decode_ggml", "ggml", "kvviz.families.ggml.decode", "kvviz.families.ggml.oracle", "kvviz.families.ggml.format"),
    KernelFamily("fast_decode_kivi", "kivi", "kvviz.families.kivi.decode", "kvviz.families.kivi.oracle", "kvviz.families.kivi.format"),
    KernelFamily("fast_decode_tq", "turboquant", "kvviz.families.turboquant.decode", "kvviz.families.turboquant.oracle",
                 "kvviz.families.turboquant.format"),
    KernelFamily("fast_decode_fp4", "fp4", "kvviz.families.fp4.decode", "kvviz.families.fp4.oracle", "kvviz.families.fp4.format"),
    KernelFamily("fast_write_ggml", "ggml", "kvviz.families.ggml.writer", "kvviz.families.ggml.oracle", "kvviz.families.ggml.format",
                 key="fast_write_ggml"),
    KernelFamily("fast_write_fp4", "fp4", "kvviz.families.fp4.writer", "kvviz.families.fp4.oracle", "kvviz.families.fp4.format",
                 key="fast_write_fp4"),
    KernelFamily("fast_write_tq", "turboquant", "kvviz.families.turboquant.writer", "kvviz.families.turboquant.oracle",
                 "kvviz.families.turboquant.format"),
    # the model's forward pass on the GPU: matrix products, norms, RoPE, attention, activations
    KernelFamily("forward", "forward", "kvviz.forward.kernels", "kvviz.forward.oracle"),
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
