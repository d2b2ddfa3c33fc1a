"""Kernels of the int8 family: KernelSpec rows of every variant (first-wave writer and dequantise,
fast writer) and their host launchers. Shaders in shaders/int8/."""
from __future__ import annotations


from kvviz.attention import writers as fw
from kvviz.attention.records import DEQUANT_IMM, DEQUANT_OUT, TOKENS, WRITE_IMM
from kvviz.gpu.kernel_spec import KernelSpec, ro, rw
from kvviz.gpu.runtime import Dispatch, GpuRuntime



INT8_WRITE = KernelSpec("int8/write.wgsl", bindings=TOKENS + rw("k_cache", "v_cache"), immediates=WRITE_IMM)

INT8_DEQUANT = KernelSpec("int8/dequant.wgsl", bindings=ro("k_cache", "v_cache", "items") + DEQUANT_OUT,
                          immediates=DEQUANT_IMM)

WRITE_INT8 = KernelSpec("int8/write_fast.wgsl", bindings=TOKENS + rw("k_cache", "v_cache"), immediates=fw.ROW_IMM)

WRITE_INT8 = WRITE_INT8.define(SEED="false", REDUCE=fw.REDUCE_WORKGROUP, **fw.LANE_DEFAULTS)

# The int8 seed-layout writer where wgpu guarantees only subgroups of fewer than fw.AUTO_LANES (NVIDIA reports 4):
# 4 lanes a row through subgroup shuffles measured faster than 8 lanes through workgroup memory on the H200 (anchor
# shape; docs/benchmarks.md). The other writers (int8_token, fp8_e4m3, int4) measured slower that way, so only this
# one takes it.
SEED_SUBGROUP_LANES = 4

def seed_variant(rt: GpuRuntime) -> fw.Variant:
    """The default variant of the seed-layout int8 writer (SEED_SUBGROUP_LANES above)."""
    if fw.subgroups_available(rt) and fw.smallest_subgroup(rt) < fw.AUTO_LANES:
        return fw.Variant(rt, True, min(SEED_SUBGROUP_LANES, fw.max_lanes(rt, True)))
    return fw.Variant(rt)

# ------------------------------------------------------------------------------ writers
def int8_dispatches(rt: GpuRuntime, key, value, slots, k_buf, v_buf, block_size: int, *, seed: bool = False,
                    variant: fw.Variant | None = None) -> list[Dispatch]:
    """int8 records [hd/4 code words | f32 scale] (the seed q8 layout): int8_token's quantiser, or with
    seed=True the seed GLSL writer's (same bytes as reshape_and_cache_q8.comp; kvviz/attention/paged_oracle.py)."""
    key, value, sm = fw.check_rows(key, value, slots)
    T, kvh, D = key.shape
    var = variant or (seed_variant(rt) if seed else fw.Variant(rt))
    L, nv, pad = var.split(D // 4)
    kern = rt.compile(WRITE_INT8, SEED="true" if seed else "false", NV=nv, PAD="true" if pad else "false", **var.defines(L))
    return fw.row_dispatches(rt, kern, key, value, sm, [k_buf, v_buf],
                           lambda rows, gx: kern.pack(kvh, D, block_size, D // 4 + 1, rows, gx), fw.WG // L)


# Every variant of the family's kernels, first-wave and fast (kvviz/families/catalogue.py).
KERNELS = (INT8_WRITE, INT8_DEQUANT, WRITE_INT8)
