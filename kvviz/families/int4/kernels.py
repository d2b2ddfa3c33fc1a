"""Kernels of the int4 family: KernelSpec rows of every variant (first-wave writer and dequantise,
fast writer) and their host launchers. Shaders in shaders/int4/."""
from __future__ import annotations


from kvviz.attention import writers as fw
from kvviz.attention.records import DEQUANT_IMM, DEQUANT_OUT, TOKENS, WRITE_IMM
from kvviz.errors import UnsupportedShape
from kvviz.gpu.kernel_spec import KernelSpec, ro, rw
from kvviz.gpu.runtime import Dispatch, GpuRuntime



INT4_WRITE = KernelSpec("int4/write.wgsl", bindings=TOKENS + rw("k_cache", "v_cache"), immediates=WRITE_IMM)  # GROUP

INT4_DEQUANT = KernelSpec("int4/dequant.wgsl", bindings=ro("k_cache", "v_cache", "items") + DEQUANT_OUT,
                          immediates=DEQUANT_IMM)  # GROUP

WRITE_INT4 = KernelSpec("int4/write_fast.wgsl", bindings=TOKENS + rw("k_cache", "v_cache"), immediates=fw.ROW_IMM)

WRITE_INT4 = WRITE_INT4.define(GROUP=32, REDUCE=fw.REDUCE_WORKGROUP, **fw.LANE_DEFAULTS)

def int4_dispatches(rt: GpuRuntime, group: int, key, value, slots, k_buf, v_buf, block_size: int, *,
                    variant: fw.Variant | None = None) -> list[Dispatch]:
    """int4_group records (kvviz/families/int4/format.py): 8 codes a word, then (scale, zero) per group of `group`."""
    key, value, sm = fw.check_rows(key, value, slots)
    T, kvh, D = key.shape
    if D % 8 or group % 8 or D % group:
        raise UnsupportedShape(f"fast int4 writer: head_size {D} and group {group} must be multiples of 8, the group dividing the head")
    var = variant or fw.Variant(rt)
    L = var.lanes(D // 8, group // 8)
    if 2 * (D // (8 * L)) > fw.WRITER_NV_MAX and variant is None:
        # a group of units no power-of-two lane count nests with (24 elements: 3 units; 28 units at groups of 32 take 4
        # lanes) leaves a lane more vec4s than at head 256: the unrolled shader would grow with the head size (minutes
        # to build on lavapipe), the first-wave writer takes it (the same words)
        raise UnsupportedShape(f"fast int4 writer: groups of {group} at head size {D} leave {L} lane(s) a row of "
                               f"{D // (8 * L)} code words each ({2 * (D // (8 * L))} vec4s, more than {fw.WRITER_NV_MAX})")
    # a group's statistics are reduced over min(group units, L) lanes (write_int4.wgsl SPAN): shuffles where that
    # span fits the smallest subgroup (measured faster than workgroup memory on the H200)
    kern = rt.compile(WRITE_INT4, GROUP=group, NJ=D // (8 * L), **var.defines(L, span=min(group // 8, L)))
    wpt = D // 8 + 2 * (D // group)
    return fw.row_dispatches(rt, kern, key, value, sm, [k_buf, v_buf],
                           lambda rows, gx: kern.pack(kvh, D, block_size, wpt, rows, gx), fw.WG // L)


# Every variant of the family's kernels, first-wave and fast (kvviz/families/catalogue.py).
KERNELS = (INT4_WRITE, INT4_DEQUANT, WRITE_INT4)
