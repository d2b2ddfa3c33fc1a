"""Kernels of the llama.cpp block-type caches (family "ggml").

ggml: shaders/ggml/write.wgsl and ggml_dequant.wgsl, one pair of KernelSpecs per block type (the
type's defines, kvviz.families.ggml.format.GgmlType.defines); numpy reference kvviz/families/ggml/oracle.py.
Methods: kvviz/families/ggml/method.py.
The host side (chunked writer dispatches, dequantise windows) is kvviz/attention/records.py's.
"""
from __future__ import annotations

import logging

import numpy as np

from kvviz.attention import records as qk
from kvviz.families.ggml.format import TYPES, GgmlType
from kvviz.gpu.kernel_spec import KernelSpec, Struct, ro, rw
from kvviz.gpu.runtime import Dispatch

log = logging.getLogger("kvviz.families.ggml.kernels")

_TOKENS = ro("key_in", "val_in", "slots")
_DEQUANT_IMM = Struct("P", "kvh hd bs wpt win0")
# `zero` is 0 at run time: the writer xors products with it so that no driver fuses them into an add.
GGML_WRITE = KernelSpec("ggml/write.wgsl", bindings=_TOKENS + rw("k_cache", "v_cache"),
                        immediates=Struct("P", "kvh hd bs wpt zero"))
GGML_DEQUANT = KernelSpec("ggml/dequant.wgsl", bindings=ro("k_cache", "v_cache", "items") + rw("k_out", "v_out"),
                          immediates=_DEQUANT_IMM)


def write_spec(t: GgmlType) -> KernelSpec:
    return GGML_WRITE.define(**t.defines())


def dequant_spec(t: GgmlType) -> KernelSpec:
    return GGML_DEQUANT.define(**{k: v for k, v in t.defines().items() if k != "LOG2_UP"})


KERNELS = {
    "ggml": tuple(s for t in TYPES.values() for s in (write_spec(t), dequant_spec(t))),
}


def shared_token_dispatches(rt, passes, key, value, slots, imm) -> list[Dispatch]:
    """Several kernels over the same token rows with K and V uploaded once: `passes` is [(kernel, extra
    bindings after key/value/slots)], run in order, each over every chunk before the next one starts
    (a per-tensor amax pass completes before the writer reads it). Grid (rows, kv_heads, 2)."""
    T, kvh, D = key.shape
    chunks = qk.row_chunks(rt, T, kvh * D * 4)
    if len(chunks) > 1:
        log.info("%d token rows in %d chunks (grid and storage-binding limits)", T, len(chunks))
    ups = [(a, b, [rt.upload(key[a:b], "key"), rt.upload(value[a:b], "value"),
                   rt.upload(np.ascontiguousarray(slots[a:b]).astype(np.uint32), "slots")]) for a, b in chunks]
    return [kern.dispatch((b - a, kvh, 2), bufs + list(extra), imm=imm) for kern, extra in passes for a, b, bufs in ups]
