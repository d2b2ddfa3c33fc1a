"""Kernels of the f16 family: KernelSpec rows of every variant (first-wave writer and dequantise,
fast writer) and their host launchers. Shaders in shaders/f16/."""
from __future__ import annotations


import numpy as np

from kvviz.attention import writers as fw
from kvviz.attention.records import TOKENS
from kvviz.gpu.kernel_spec import KernelSpec, Struct, ro, rw
from kvviz.gpu.runtime import Dispatch, GpuRuntime



WRITE_F16 = KernelSpec("f16/write_fast.wgsl", bindings=TOKENS + rw("k_cache", "v_cache"),
                       immediates=Struct("P", "kvh hd bs items gx"))

F16_DEQUANT = KernelSpec("f16/dequant.wgsl", bindings=ro("k_cache", "v_cache", "items") + rw("k_out", "v_out"),
                         immediates=Struct("P", "kvh hd bs wpt win0"))

def f16_dispatches(rt: GpuRuntime, key, value, slots, k_buf, v_buf, block_size: int) -> list[Dispatch]:
    """f16 records [hd/2 words], element 2w in the low half of word w (numpy astype(float16) bits); key and value
    host arrays or DeviceRows (fw.check_rows)."""
    key, value, sm = fw.check_rows(key, value, slots)
    T, kvh, D = key.shape
    kern = rt.compile(WRITE_F16)
    out = []
    for a, b in fw.input_chunks(rt, T, kvh * D * 4):
        if b <= a:
            continue
        items = (b - a) * kvh * (D // 4)
        gx, gy, gz = fw.grid_2d(rt, -(-items // fw.WG))
        ins = [fw.row_input(rt, key, a, b, "key"), fw.row_input(rt, value, a, b, "value"),
               rt.upload(sm[a:b].astype(np.uint32), "slots")]
        out.append(kern.dispatch((gx, gy, gz), ins + [k_buf, v_buf],
                                 imm=kern.pack(kvh, D, block_size, items, gx)))
    return out


# Every variant of the family's kernels, first-wave and fast (kvviz/families/catalogue.py).
KERNELS = (WRITE_F16, F16_DEQUANT)
