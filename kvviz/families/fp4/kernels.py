"""First-wave kernels of the NVFP4 cache (family "fp4"): shaders/fp4/nvfp4_write.wgsl and
nvfp4_dequant.wgsl; the per-tensor amax is the FP8 family's fp8/amax.wgsl; numpy reference
kvviz/families/fp4/oracle.py. The fast writer is kvviz/families/fp4/writer.py, the fast decode
kvviz/families/fp4/decode.py. The host side (chunked writer dispatches, dequantise windows) is
kvviz/attention/records.py's and the llama.cpp block types' (kvviz/families/ggml/kernels.py).
"""
from __future__ import annotations

from kvviz.gpu.kernel_spec import KernelSpec, Struct, ro, rw

_TOKENS = ro("key_in", "val_in", "slots")


NVFP4_WRITE = KernelSpec("fp4/nvfp4_write.wgsl", bindings=_TOKENS + rw("k_cache", "v_cache", "tensor"),
                         immediates=Struct("P", "kvh hd bs wpt"))


NVFP4_DEQUANT = KernelSpec("fp4/nvfp4_dequant.wgsl", bindings=ro("k_cache", "v_cache", "tensor", "items") + rw("k_out", "v_out"),
                           immediates=Struct("P", "kvh hd bs wpt win0"))


KERNELS = {"fp4": (NVFP4_WRITE, NVFP4_DEQUANT)}
