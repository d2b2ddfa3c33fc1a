"""The fast NVFP4 writer: the per-tensor amax pass, the one-invocation scale pass and the writer pass
(shaders/fp4/nvfp4_write_fast.wgsl, fp4/nvfp4_scale_fast.wgsl), built on the llama.cpp block writers'
lanes and staging (kvviz/families/ggml/writer.py). The same words as the first-wave writer
fp4/nvfp4_write.wgsl and the oracle kvviz/families/fp4/oracle.py (tests/test_fast_write_ggml.py).
"""
from __future__ import annotations

from kvviz.attention import writers as fw

from kvviz.families.fp8 import kernels as fp8_kernels
from kvviz.errors import InvalidInput, UnsupportedShape
from kvviz.families.fp4 import format as f4
from kvviz.families.ggml.writer import STAGE, WG, lanes_for, stage_defines
from kvviz.gpu.kernel_spec import KernelSpec, Struct, ro, rw
from kvviz.gpu.runtime import Dispatch, GpuRuntime


_TOKENS = ro("key_in", "val_in", "slots")
WRITE_NVFP4 = KernelSpec("fp4/nvfp4_write_fast.wgsl", bindings=_TOKENS + rw("k_cache", "v_cache", "tensor"),
                         immediates=Struct("P", "kvh hd bs wpt rows gx"))


NVFP4_SCALE = KernelSpec("fp4/nvfp4_scale_fast.wgsl", bindings=rw("tensor"))


def nvfp4_spec(ng: int = 4, lanes: int = 1, head_size: int = 128, stage: bool | None = None,
               kv_split: bool = False, scale_pass: bool = False) -> KernelSpec:
    """stage (default: STAGE at 4 groups a lane or more, in place below; NVFP4_GROUPS_PER_LANE has the figures): the
    records stored through workgroup memory by consecutive threads. ng 1 or 2: a lane's scale bytes are put together
    with its neighbours' by subgroup shuffles (write_nvfp4.wgsl SUBW); kv_split (ng 1 or 2 only): K and V on
    separate lanes (KVS; `lanes` counts both)."""
    sub = ng < 4
    if stage is None:
        stage = STAGE and not sub
    return WRITE_NVFP4.define(NG=ng, LANES=lanes, REDUCE="", REDUCE_KIND="none (no value crosses lanes)", INV_ULPS=0,
                              SUBW=1 if sub else 0, KVS=1 if (sub and kv_split) else 0, SCALE_PASS=int(scale_pass),
                              SHUF_OR="return v | subgroupShuffleXor(v, m);" if sub else "return v;",
                              **stage_defines(stage, lanes, f4.words_per_token(head_size)))


# Groups of 16 a lane of the NVFP4 writer pass where subgroups and the head size allow (1: all of a lane's loads at
# once, 8 lanes a row at head 128, the scale words OR-ed together by shuffles; write_nvfp4.wgsl SUBW), else 4 (whole
# scale words a lane, its groups walked one after another). On the H200 at the anchor shape 1 group a lane is the
# fastest writer pass (against 2 and 4); 1 group is faster storing in place and 4 groups faster staged, so 1 group
# stores in place and 4 groups stage (nvfp4_spec); the lane's tensors run as a loop, faster again (figures in
# docs/benchmarks.md).
NVFP4_GROUPS_PER_LANE = 1


# At 1 or 2 groups a lane: K and V on separate lanes (write_nvfp4.wgsl KVS), twice the lanes a row. Off: at 1 group a
# lane (the default) it measured slower on the H200 than K and V in one lane (docs/benchmarks.md).
NVFP4_KV_SPLIT = False


# s_t derived once by fp4/nvfp4_scale_fast.wgsl (one invocation between the amax pass and the writer) instead of by
# every thread of the writer (two correctly rounded divisions each): the writer pass gains more than the extra
# dispatch costs (the scale pass is mostly a dispatch's fixed cost), measured on the H200 at 1 group a lane in place.
NVFP4_SCALE_PASS = True


def _sub_groups_refusal(rt: GpuRuntime, groups_per_lane: int, head_size: int) -> str | None:
    """Why 1 or 2 groups a lane (the scale words put together by subgroup shuffles among the lanes of a word) cannot
    run here, or None where they can."""
    if not (fw.subgroups_available(rt) and fw.smallest_subgroup(rt) >= 4 // groups_per_lane):
        return f"fast NVFP4 writer: {groups_per_lane} groups a lane needs subgroups of at least {4 // groups_per_lane} lanes on this adapter"
    if (head_size // f4.SUB) % 4:
        return f"fast NVFP4 writer: {groups_per_lane} groups a lane needs a head size that is a multiple of 64, got {head_size}"
    return None


def nvfp4_groups_default(rt: GpuRuntime, head_size: int) -> int:
    """NVFP4_GROUPS_PER_LANE where the adapter's subgroups and the head size (a multiple of 64) take it, else 4."""
    g = NVFP4_GROUPS_PER_LANE
    return g if g < 4 and _sub_groups_refusal(rt, g, head_size) is None else 4


def nvfp4_dispatches(rt: GpuRuntime, key, value, slots, k_buf, v_buf, tensor, block_size: int, *,
                     groups_per_lane: int | None = None, variant: fw.Variant | None = None,
                     stage: bool | None = None, kv_split: bool | None = None,
                     scale_pass: bool | None = None) -> list[Dispatch]:
    """NVFP4 records (kvviz/families/fp4/format.py) of K and V: the per-tensor amax pass (fp8/amax_fast.wgsl,
    lane groups of `variant`, into tensor[0|1], which must be zeroed before), s_t into tensor[2|3] (by the scale
    pass, fp4/nvfp4_scale_fast.wgsl, or by the writer's first row: scale_pass, default NVFP4_SCALE_PASS), then the
    writer. groups_per_lane: 16-element groups a lane (default nvfp4_groups_default); kv_split (1 or 2 groups
    a lane; default NVFP4_KV_SPLIT there): K and V on separate lanes."""
    key, value, sm = fw.check_rows(key, value, slots)
    T, kvh, D = key.shape
    if D % f4.SUB:
        raise UnsupportedShape(f"fast NVFP4 writer: head_size {D} is not a multiple of {f4.SUB}")
    if groups_per_lane is None:
        groups_per_lane = nvfp4_groups_default(rt, D)
    if groups_per_lane in (1, 2):
        why = _sub_groups_refusal(rt, groups_per_lane, D)
        if why:
            raise InvalidInput(why, "Use 4 groups a lane.")
    elif groups_per_lane < 4 or groups_per_lane % 4:
        raise InvalidInput(f"fast NVFP4 writer: groups_per_lane must be 1, 2 or a multiple of 4, got {groups_per_lane}")
    wpt = f4.words_per_token(D)
    out = fp8_kernels.amax_dispatches(rt, key, value, sm, tensor, block_size, wpt, variant or fw.Variant(rt))
    kvs = groups_per_lane < 4 and (NVFP4_KV_SPLIT if kv_split is None else kv_split)
    L = lanes_for(2 * D // f4.SUB if kvs else D // f4.SUB, groups_per_lane)
    sp = NVFP4_SCALE_PASS if scale_pass is None else scale_pass
    kern = rt.compile(nvfp4_spec(groups_per_lane, L, D, stage, kvs, sp))
    if sp:
        out.append(rt.compile(NVFP4_SCALE).dispatch((1, 1, 1), [tensor]))
    out += fw.row_dispatches(rt, kern, key, value, sm, [k_buf, v_buf, tensor],
                              lambda rows, gx: kern.pack(kvh, D, block_size, wpt, rows, gx), WG // L)
    return out


KERNELS = {"fast_write_fp4": (nvfp4_spec(), nvfp4_spec(1, 8), nvfp4_spec(1, 16, kv_split=True),
                              nvfp4_spec(1, 8, scale_pass=True), NVFP4_SCALE)}
