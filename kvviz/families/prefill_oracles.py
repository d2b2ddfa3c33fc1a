"""numpy oracle of the causal prefill's caches (kvviz/attention/prefill.py): each method's dequantised paged cache, from
its family's own numpy quantiser and dequantiser, which kvviz/attention/prefill_oracle.causal attends over."""
from __future__ import annotations

import numpy as np

from kvviz.attention import paged_oracle as op
from kvviz.families.f16 import oracle as o16
from kvviz.families.fp4 import oracle as of4
from kvviz.families.fp8 import oracle as o8f
from kvviz.families.ggml import oracle as og
from kvviz.families.int4 import oracle as o4
from kvviz.families.int8 import oracle as o8
from kvviz.families.kivi import oracle as okv
from kvviz.families.turboquant import format as tqf
from kvviz.paging import PAD_SLOT


def method_caches(method, batch, key, value, qkv=None) -> tuple[np.ndarray, np.ndarray]:
    """(K, V) float64 paged caches [num_blocks, kv_heads, block_size, D] of `method` (None: the f32 cache) after it
    wrote key / value [tokens, kv_heads, D] through `batch`: its family's numpy quantiser and dequantiser, as its
    REFERENCE computes them (the writers' codes are the oracles' bit for bit: the writers divide correctly
    rounded). Two methods' caches come from `qkv` (the method's QuantizedKV, its records read back from the GPU)
    instead, because their writers may round differently from the numpy quantiser, within what the writers' own
    checks allow:
      TurboQuant   a 2-bit index may flip where a rotated coordinate sits within float rounding of a centroid
                   boundary (tests/test_turboquant.py);
      int8_seed    the seed GLSL writer divides 127 / amax with the driver's OpFDiv (Vulkan allows 2.5 ULP; NVIDIA's
                   is not exact) and rounds with GLSL round(), whose direction at .5 is the implementation's: a code
                   one step off at a rounding tie and a scale a ULP off (paged_oracle.compare_int8_cache allows both;
                   one such V code moves an output by its weight x the scale, past the attention's tolerance). Without
                   `qkv` (or with a QuantizedKV that holds no host codes) its numpy quantiser's cache."""
    key = np.asarray(key, np.float32)
    value = np.asarray(value, np.float32)
    D = key.shape[-1]
    if method is None:
        return op.per_token_caches(batch, key, value, lambda x: x)
    fam = method.family
    mid = method.id
    if mid == "int8_seed":
        if qkv is not None and np.size(qkv.k_codes):
            return tuple(op.scatter_rows(batch, np.asarray(c, np.float64) * np.asarray(s, np.float64)[..., None])
                         for c, s in ((qkv.k_codes, qkv.k_scales), (qkv.v_codes, qkv.v_scales)))
        shape = (batch.num_blocks, key.shape[1], batch.block_size, D // 4 + 1)
        k = op.write_cache_int8(np.zeros(shape, np.uint32), key, batch.slot_mapping, batch.block_size)
        v = op.write_cache_int8(np.zeros(shape, np.uint32), value, batch.slot_mapping, batch.block_size)
        return op.dequantize_cache_int8(k), op.dequantize_cache_int8(v)
    if fam == "int8":
        return op.per_token_caches(batch, key, value, lambda x: o8.dequantize(*o8.quantize(x)))
    if fam == "f16":
        return op.per_token_caches(batch, key, value, lambda x: o16.dequantize(o16.quantize(x)))
    if fam == "int4":
        G = method.group_for(D)
        return op.per_token_caches(batch, key, value, lambda x: o4.dequantize_groups(*o4.quantize_groups(x, G), G))
    if fam == "fp8":
        def deq(x):
            return o8f.dequantize(*o8f.quantize(x, method.fmt, method.scale_mode, batch.slot_mapping), method.fmt)

        return op.per_token_caches(batch, key, value, deq)
    if fam == "fp8_vllm":
        ks, vs = o8f.vllm_method_scales(method, batch, key, value)
        return tuple(op.scatter_rows(batch, o8f.vllm_dequantize(o8f.vllm_quantize(x, s, method.fmt)[0], s,
                                                                method.fmt).astype(np.float64))
                     for x, s in ((key, ks), (value, vs)))
    if fam == "ggml":
        return op.per_token_caches(batch, key, value, lambda x: og.dequantize(og.quantize(x, method.fmt), D, method.fmt))
    if fam == "fp4":
        real = np.asarray(batch.slot_mapping) != PAD_SLOT
        out = []
        for x in (key, value):
            st = of4.tensor_scale(x[real])
            out.append(op.scatter_rows(batch, of4.dequantize(*of4.quantize(x, st), st).astype(np.float64)))
        return tuple(out)
    if fam == "kivi":
        k, v, _ = okv.pad_head(key, value)
        ref = okv.write_buffers(batch, k, v, method.bits, method.recent)
        fk, fv = okv.dequantize_cache(batch, k, v, method.bits, method.recent, ref["per_seq"])
        return fk[..., :D].astype(np.float64), fv[..., :D].astype(np.float64)
    if fam == "turboquant":
        if qkv is None:
            raise ValueError("TurboQuant's prefill reference reads the GPU's records: pass the method's QuantizedKV")
        st = method.settings(D)
        kvh = key.shape[1]
        ident = np.tile(np.arange(D, dtype=np.int64), (kvh, 1))
        ck, cv = qkv.extra.get("channels", (ident, ident))
        fk = tqf.dequantize_general(qkv.extra["k_records"], ck, st, "K", method.qjl_scale)
        fv = tqf.dequantize_general(qkv.extra["v_records"], cv, st, "V")
        return op.scatter_rows(batch, fk.astype(np.float64)), op.scatter_rows(batch, fv.astype(np.float64))
    raise ValueError(f"no prefill reference for method {mid!r} (family {fam!r})")
