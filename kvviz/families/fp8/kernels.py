"""Kernels of the fp8 family: KernelSpec rows of every variant (first-wave writer and dequantise,
fast writer) and their host launchers. Shaders in shaders/fp8/."""
from __future__ import annotations


from kvviz.attention import writers as fw
from kvviz.attention.records import DEQUANT_IMM, DEQUANT_OUT, TOKENS, WRITE_IMM
from kvviz.gpu.kernel_spec import KernelSpec, ro, rw
from kvviz.gpu.runtime import Dispatch, GpuRuntime



# FP8 kernels take the format's defines (kvviz.families.fp8.format.Fp8Format.defines), PER_TENSOR and NAME.
FP8_AMAX = KernelSpec("fp8/amax.wgsl", bindings=TOKENS + rw("tensor"), immediates=WRITE_IMM)

FP8_WRITE = KernelSpec("fp8/write.wgsl", bindings=TOKENS + rw("k_cache", "v_cache", "tensor"), immediates=WRITE_IMM)

FP8_DEQUANT = KernelSpec("fp8/dequant.wgsl", bindings=ro("k_cache", "v_cache", "tensor", "items") + DEQUANT_OUT,
                         immediates=DEQUANT_IMM)

_FP8_DEFAULTS = dict(MBITS=3, BIAS=7, MAX_BITS=0x43E00000, MAX_CODE=0x7E, FMAX="448.0", PER_TENSOR="false", NAME="fp8_e4m3fn")

WRITE_FP8 = KernelSpec("fp8/write_fast.wgsl", bindings=TOKENS + rw("k_cache", "v_cache", "tensor"), immediates=fw.ROW_IMM)

WRITE_FP8_AMAX = KernelSpec("fp8/amax_fast.wgsl", bindings=TOKENS + rw("tensor"), immediates=fw.ROW_IMM)

WRITE_FP8 = WRITE_FP8.define(REDUCE=fw.REDUCE_WORKGROUP, **_FP8_DEFAULTS, **fw.LANE_DEFAULTS)

WRITE_FP8_AMAX = WRITE_FP8_AMAX.define(REDUCE=fw.REDUCE_WORKGROUP, **fw.LANE_DEFAULTS)

# Lanes a row of the FP8 per-tensor writer pass by default: it reduces nothing across lanes, so any lane count is
# legal without subgroups. 16 measured fastest on the H200 at the anchor, against 4, 8 and 32 (docs/benchmarks.md).
PER_TENSOR_LANES = 16

def fp8_dispatches(rt: GpuRuntime, fmt, per_tensor: bool, key, value, slots, k_buf, v_buf, tensor, block_size: int, *,
                   variant: fw.Variant | None = None) -> list[Dispatch]:
    """FP8 records (kvviz/families/fp8/format.py `fmt`), per-token scale word or per-tensor scales in `tensor`
    ([amax K, amax V, scale K, scale V], zeroed before): the codes of fp8/write.wgsl."""
    key, value, sm = fw.check_rows(key, value, slots)
    T, kvh, D = key.shape
    var = variant or fw.Variant(rt)
    L, nv, pad = var.split(D // 4)
    if per_tensor and variant is None:   # no row reduction: the lanes need no subgroup (PER_TENSOR_LANES)
        L, nv, pad = fw.padded_split(D // 4, fw.choose_lanes(D // 4, 0, PER_TENSOR_LANES), PER_TENSOR_LANES)
    d = dict(fmt.defines(), PER_TENSOR="true" if per_tensor else "false", NAME=fmt.name, NV=nv,
             PAD="true" if pad else "false", **var.defines(L))
    wpt = D // 4 + (0 if per_tensor else 1)
    out = []
    if per_tensor:
        out += amax_dispatches(rt, key, value, sm, tensor, block_size, wpt, var)
    kern = rt.compile(WRITE_FP8, **d)
    out += fw.row_dispatches(rt, kern, key, value, sm, [k_buf, v_buf, tensor],
                           lambda rows, gx: kern.pack(kvh, D, block_size, wpt, rows, gx), fw.WG // L)
    return out

# Row blocks a workgroup of the per-tensor amax pass (it strides over the rows: any grid is correct; fewer
# workgroups, fewer reductions and atomics). 16 measured fastest on the H200 at the anchor, against 1, 4 and 64
# (FP8 per-tensor's pass, the slot and the values loaded together; NVFP4's the same; docs/benchmarks.md).
AMAX_BLOCKS = 16

def amax_dispatches(rt: GpuRuntime, key, value, sm, tensor, block_size: int, wpt: int, var: fw.Variant) -> list[Dispatch]:
    """The per-tensor amax pass (fp8/amax_fast.wgsl) of the FP8 per-tensor and NVFP4 writers: max |x| bits of
    K and V into tensor[0|1] (zeroed before)."""
    T, kvh, D = key.shape
    L, nv, pad = var.split(D // 4)
    amax = rt.compile(WRITE_FP8_AMAX, NV=nv, PAD="true" if pad else "false", **var.defines(L))
    return fw.row_dispatches(rt, amax, key, value, sm, [tensor],
                           lambda rows, gx: amax.pack(kvh, D, block_size, wpt, rows, gx), AMAX_BLOCKS * (fw.WG // L))


# Every variant of the family's kernels, first-wave and fast (kvviz/families/catalogue.py).
KERNELS = (FP8_AMAX, FP8_WRITE, FP8_DEQUANT, WRITE_FP8_AMAX, WRITE_FP8)
