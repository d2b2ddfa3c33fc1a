"""The fast writers (reshape_and_cache): every method's codes and scales, written the way the best engines
write them (docs/fast-kernels.md s.3, s.7). Family "fast_write" (kvviz/families/catalogue.py): shaders
shaders/fast/write_*.wgsl + common/write_fast.wgsl; each writer reproduces its method's numpy oracle
word for word (kvviz/oracles/{paged,int8,int4,fp8,kivi,f16}.py); tests tests/test_fast_writers.py.

What makes them fast, against the first-wave writers (shaders/quant/*_write.wgsl, one 64-thread
workgroup per (token, head, K|V) and a 25-step integer division per element):
  - a small group of L lanes per (token, KV head) row, K and V together, R = 64/L rows a workgroup;
    lane l loads the vec4s l, l+L, ... (16-B coalesced loads) and packs whole code words;
  - amax / min / max by `red_min` over the lane group: subgroupShuffleXor where the adapter has subgroups
    (L never exceeds the adapter's smallest subgroup size), workgroup memory otherwise (a fallback, not a
    failure); a reduction whose lane span fits the smallest subgroup takes shuffles even then
    (`Variant.defines(span=...)`: int4's groups of 4 units at 8 lanes, measured faster on the H200);
  - codes from q = x * (1/scale), branch-free in the unrolled main loop, and sure only away from a rounding
    boundary; a lane with a value that close to one (exact ties included) redoes those words by the exact integer
    division after the loop (one copy of it in the shader): the same codes as the oracles. Where the quotient is
    known to be small (int8_token, int4, KIVI: write_common.wgsl round_fixed4 / asym_codes4v_fast) the code and
    the distance to the boundary come from integer ops on the bits of q + 3 x 2^k, with no round and no
    float-to-int: those run 16 a clock an SM on NVIDIA against 128 adds, and bound the writers more than their
    bytes do (measured faster on the H200 for KIVI 2-bit, int4 and int8_token; docs/benchmarks.md);
  - KIVI's key groups (write_kivi_kgroup.wgsl): a workgroup a (32-token group, KV head) loads the group's tile
    once, every load of a thread issued together, and reduces the channels' min / max through workgroup memory;
  - a 2-D grid (y * gx + x), so more than 65535 workgroups take one dispatch: the host splits the input
    only where it exceeds one storage binding.

Seed layout (`int8_dispatches(seed=True)`): the bytes of the seed GLSL writer reshape_and_cache_q8.comp
(clamp [-127, 127], x * (127/amax)), with 127/amax and amax/127 divided exactly (the seed's oracle
kvviz/attention/paged_oracle.py computes them in float32): int8_seed keeps the seed writer as its writer; this one
is its "fast" row and what the live cache can call.
"""
from __future__ import annotations

import logging

import numpy as np

from kvviz.errors import DeviceLimitError, InvalidInput, UnsupportedShape
from kvviz.gpu.kernel_spec import KernelSpec, Struct, ro, rw
from kvviz.gpu.runtime import Dispatch, GpuRuntime

log = logging.getLogger("kvviz.attention.writers")

_ROW_IMM = Struct("P", "kvh hd bs wpt rows gx")
_TOKENS = ro("key_in", "val_in", "slots")
# Every spec carries representative defines (one lane, the workgroup-memory reduction, ...) so it renders
# and checks on its own (tests/test_kernel_families.py); the launchers below always pass their own.
_LANE_DEFAULTS = dict(LANES=1, REDUCE_KIND="workgroup memory", NV=1, NJ=1, INV_ULPS=0)
_FP8_DEFAULTS = dict(MBITS=3, BIAS=7, MAX_BITS=0x43E00000, MAX_CODE=0x7E, FMAX="448.0", PER_TENSOR="false", NAME="fp8_e4m3fn")
WRITE_INT8 = KernelSpec("int8/write_fast.wgsl", bindings=_TOKENS + rw("k_cache", "v_cache"), immediates=_ROW_IMM)
WRITE_FP8 = KernelSpec("fp8/write_fast.wgsl", bindings=_TOKENS + rw("k_cache", "v_cache", "tensor"), immediates=_ROW_IMM)
WRITE_FP8_AMAX = KernelSpec("fp8/amax_fast.wgsl", bindings=_TOKENS + rw("tensor"), immediates=_ROW_IMM)
WRITE_INT4 = KernelSpec("int4/write_fast.wgsl", bindings=_TOKENS + rw("k_cache", "v_cache"), immediates=_ROW_IMM)
WRITE_KIVI_TOK = KernelSpec("kivi/write_tok_fast.wgsl", bindings=_TOKENS + ro("row_res") + rw("k_cache", "v_cache", "res"),
                            immediates=Struct("P", "kvh hd bs kstride rows gx"))
WRITE_KIVI_KGROUP = KernelSpec("kivi/write_kgroup_fast.wgsl",
                               bindings=ro("key_in", "slots", "grows", "groups", "info") + rw("k_cache"),
                               immediates=Struct("P", "kvh hd bs kstride bt_off mbs items gx"))
WRITE_F16 = KernelSpec("f16/write_fast.wgsl", bindings=_TOKENS + rw("k_cache", "v_cache"),
                       immediates=Struct("P", "kvh hd bs items gx"))
F16_DEQUANT = KernelSpec("f16/dequant.wgsl", bindings=ro("k_cache", "v_cache", "items") + rw("k_out", "v_out"),
                         immediates=Struct("P", "kvh hd bs wpt win0"))

# The reductions over a lane group, pasted into write_common.wgsl ({{REDUCE}}).
_REDUCE_SUBGROUP = """// red_min / red_min2: min over the `span` aligned lanes of lid's group (span a power of two <= L), by
// subgroup shuffles (red_min2: two values, half the shuffles).
fn red_min(v: vec4<u32>, lid: u32, span: u32) -> vec4<u32> {
  var m = v;
  for (var o = 1u; o < span; o = o << 1u) { m = min(m, subgroupShuffleXor(m, o)); }
  return m;
}
fn red_min2(v: vec2<u32>, lid: u32, span: u32) -> vec2<u32> {
  var m = v;
  for (var o = 1u; o < span; o = o << 1u) { m = min(m, subgroupShuffleXor(m, o)); }
  return m;
}"""
_REDUCE_WORKGROUP = """// red_min / red_min2: min over the `span` aligned lanes of lid's group, through workgroup memory (no subgroups).
var<workgroup> s_red: array<vec4<u32>, 64>;
fn red_min(v: vec4<u32>, lid: u32, span: u32) -> vec4<u32> {
  workgroupBarrier();
  s_red[lid] = v;
  workgroupBarrier();
  let base = lid - lid % span;
  var m = v;
  for (var i = 0u; i < span; i = i + 1u) { m = min(m, s_red[base + i]); }
  return m;
}
var<workgroup> s_red2: array<vec2<u32>, 64>;
fn red_min2(v: vec2<u32>, lid: u32, span: u32) -> vec2<u32> {
  workgroupBarrier();
  s_red2[lid] = v;
  workgroupBarrier();
  let base = lid - lid % span;
  var m = v;
  for (var i = 0u; i < span; i = i + 1u) { m = min(m, s_red2[base + i]); }
  return m;
}"""

MAX_LANES = 32
WG = 64

WRITE_INT8 = WRITE_INT8.define(SEED="false", REDUCE=_REDUCE_WORKGROUP, **_LANE_DEFAULTS)
WRITE_FP8 = WRITE_FP8.define(REDUCE=_REDUCE_WORKGROUP, **_FP8_DEFAULTS, **_LANE_DEFAULTS)
WRITE_FP8_AMAX = WRITE_FP8_AMAX.define(REDUCE=_REDUCE_WORKGROUP, **_LANE_DEFAULTS)
WRITE_INT4 = WRITE_INT4.define(GROUP=32, REDUCE=_REDUCE_WORKGROUP, **_LANE_DEFAULTS)
WRITE_KIVI_TOK = WRITE_KIVI_TOK.define(BITS=2, REDUCE=_REDUCE_WORKGROUP, **_LANE_DEFAULTS)
WRITE_KIVI_KGROUP = WRITE_KIVI_KGROUP.define(BITS=2, REDUCE=_REDUCE_WORKGROUP, NV4=32, RS=4, SBUF=1024, **_LANE_DEFAULTS)
# family "fast_write" (the quantised methods' writers) and family "f16" (the f16 method's kernels)
KERNELS = {"fast_write": (WRITE_INT8, WRITE_FP8, WRITE_FP8_AMAX, WRITE_INT4, WRITE_KIVI_TOK, WRITE_KIVI_KGROUP),
           "f16": (WRITE_F16, F16_DEQUANT)}


# ------------------------------------------------------------------------------ lanes and grid
def subgroups_available(rt: GpuRuntime) -> bool:
    return "subgroup" in rt.features


def smallest_subgroup(rt: GpuRuntime) -> int:
    """The adapter's smallest subgroup size as wgpu reports it (wgpu-py 0.32 spells the key
    'stackgroup_min_size'); 4 when it reports none (the smallest size Vulkan drivers use)."""
    info = getattr(getattr(rt, "adapter", None), "info", None) or {}
    for key in ("subgroup_min_size", "stackgroup_min_size"):
        try:
            n = int(info.get(key) or 0)
        except (TypeError, ValueError):
            n = 0
        if n > 0:
            return n
    return 4


def max_lanes(rt: GpuRuntime, subgroups: bool) -> int:
    """The most lanes a row may take: with subgroups a lane group must lie inside one subgroup."""
    if not subgroups:
        return MAX_LANES
    n = min(MAX_LANES, smallest_subgroup(rt))
    return 1 << (max(1, n).bit_length() - 1)


def choose_lanes(units: int, group_units: int = 0, most: int = MAX_LANES) -> int:
    """Lanes a row: the largest power of two <= `most` dividing the row's `units` (code words or vec4s)
    and, for a grouped format, nesting with the group of `group_units` units (one divides the other)."""
    L = 1 << (max(1, most).bit_length() - 1)
    while L > 1:
        if units % L == 0 and (not group_units or group_units % L == 0 or L % group_units == 0):
            return L
        L //= 2
    return 1


def grid_2d(rt: GpuRuntime, workgroups: int) -> tuple[int, int, int]:
    """(gx, gy, 1) with gx * gy >= workgroups and both within the adapter's grid limit."""
    n = max(1, int(workgroups))
    gx = min(n, rt.max_grid)
    gy = -(-n // gx)
    if gy > rt.max_grid:
        raise DeviceLimitError(f"{n} workgroups exceed a {rt.max_grid} x {rt.max_grid} grid",
                               "Write fewer tokens per batch.")
    return gx, gy, 1


def input_chunks(rt: GpuRuntime, n: int, row_bytes: int) -> list[tuple[int, int]]:
    """[start, stop) chunks of n token rows, each input within one storage binding (the grid needs none)."""
    per = max(1, rt.max_binding // max(1, row_bytes))
    return [(s, min(n, s + per)) for s in range(0, n, per)] or [(0, 0)]


AUTO_LANES = 8  # lanes a row of the default variant where subgroups of 8 are not guaranteed


class Variant:
    """How one writer is compiled: subgroups or workgroup memory, lanes a row."""

    def __init__(self, rt: GpuRuntime, subgroups: bool | None = None, lanes: int | None = None, inv_ulps: int = 0):
        """inv_ulps: move the hardware 1/scale by that many ulp (tests: an inexact divider on any device)."""
        self.inv_ulps = int(inv_ulps)
        have = subgroups_available(rt)
        auto = subgroups is None and lanes is None and have and smallest_subgroup(rt) < AUTO_LANES
        if auto:
            # wgpu guarantees subgroups of fewer than 8 lanes (Vulkan adapters report 4, NVIDIA's included):
            # 8 lanes a row through workgroup memory measured faster on the H200 than 4 lanes through
            # subgroup shuffles (int8 seed layout at the anchor shape; docs/benchmarks.md)
            subgroups, lanes = False, AUTO_LANES
        self.subgroups = have if subgroups is None else bool(subgroups)
        # where the default took workgroup memory only because subgroups are small: the widest aligned lane span a
        # shuffle reduction may still take (defines(span=...)); 0 for a variant asked for explicitly
        self.shuffle_span = max_lanes(rt, True) if auto else 0
        if self.subgroups and not have:
            raise InvalidInput("fast writer: this adapter has no subgroup feature", "Use subgroups=False.")
        self.most = max_lanes(rt, self.subgroups)
        if lanes is not None:
            if lanes < 1 or lanes & (lanes - 1) or lanes > WG:
                raise InvalidInput(f"fast writer: lanes must be a power of two in 1..{WG}, got {lanes}")
            if self.subgroups and lanes > self.most:
                raise InvalidInput(f"fast writer: {lanes} lanes exceed the adapter's smallest subgroup ({self.most})")
            self.most = lanes
        self.forced = lanes

    def lanes(self, units: int, group_units: int = 0) -> int:
        return choose_lanes(units, group_units, self.most)

    def defines(self, lanes: int, span: int | None = None) -> dict:
        """span: the widest lane span the kernel reduces over, where it is narrower than the lane group (int4's
        groups of 4 units at 8 lanes). A workgroup-memory variant whose spans all fit the adapter's smallest
        subgroup then reduces by shuffles anyway: an aligned span of lanes lies inside one subgroup."""
        sg = self.subgroups or (span is not None and 1 <= span <= self.shuffle_span)
        return {"LANES": lanes, "REDUCE": _REDUCE_SUBGROUP if sg else _REDUCE_WORKGROUP,
                "REDUCE_KIND": "subgroup shuffles" if sg else "workgroup memory", "INV_ULPS": self.inv_ulps}


def _check_rows(key, value, sm):
    key = np.ascontiguousarray(key, np.float32)
    value = np.ascontiguousarray(value, np.float32)
    if key.ndim != 3 or key.shape != value.shape:
        raise InvalidInput(f"fast writer: key and value must both be [tokens, kv_heads, head_size], got "
                           f"{key.shape} and {value.shape}")
    sm = np.asarray(sm)
    if sm.shape != (key.shape[0],):
        raise InvalidInput(f"fast writer: {key.shape[0]} token rows but {sm.shape} slots")
    if key.shape[2] % 4:
        raise UnsupportedShape(f"fast writer: head_size {key.shape[2]} is not a multiple of 4 (vec4 loads)")
    return key, value, sm.astype(np.int64)


def _row_dispatches(rt, kern, key, value, sm, cache_bufs, imm_fn, rows_per_wg: int, extra_rows=()) -> list[Dispatch]:
    """One dispatch a binding chunk of token rows, grid 2-D over its (token, KV head) rows / rows_per_wg."""
    T, kvh, D = key.shape
    out = []
    for a, b in input_chunks(rt, T, kvh * D * 4):
        if b <= a:
            continue
        rows = (b - a) * kvh
        gx, gy, gz = grid_2d(rt, -(-rows // rows_per_wg))
        bufs = [rt.upload(key[a:b], "key"), rt.upload(value[a:b], "value"), rt.upload(sm[a:b].astype(np.uint32), "slots")]
        bufs += [rt.upload(np.ascontiguousarray(e[a:b]), "rows") for e in extra_rows]
        bufs += list(cache_bufs)
        out.append(kern.dispatch((gx, gy, gz), bufs, imm=imm_fn(rows, gx)))
    return out


# The int8 seed-layout writer where wgpu guarantees only subgroups of fewer than AUTO_LANES (NVIDIA reports 4):
# 4 lanes a row through subgroup shuffles measured faster than 8 lanes through workgroup memory on the H200 (anchor
# shape; docs/benchmarks.md). The other writers (int8_token, fp8_e4m3, int4) measured slower that way, so only this
# one takes it.
SEED_SUBGROUP_LANES = 4


def seed_variant(rt: GpuRuntime) -> Variant:
    """The default variant of the seed-layout int8 writer (SEED_SUBGROUP_LANES above)."""
    if subgroups_available(rt) and smallest_subgroup(rt) < AUTO_LANES:
        return Variant(rt, True, min(SEED_SUBGROUP_LANES, max_lanes(rt, True)))
    return Variant(rt)


# ------------------------------------------------------------------------------ writers
def int8_dispatches(rt: GpuRuntime, key, value, slots, k_buf, v_buf, block_size: int, *, seed: bool = False,
                    variant: Variant | None = None) -> list[Dispatch]:
    """int8 records [hd/4 code words | f32 scale] (the seed q8 layout): int8_token's quantiser, or with
    seed=True the seed GLSL writer's (same bytes as reshape_and_cache_q8.comp; kvviz/attention/paged_oracle.py)."""
    key, value, sm = _check_rows(key, value, slots)
    T, kvh, D = key.shape
    var = variant or (seed_variant(rt) if seed else Variant(rt))
    L = var.lanes(D // 4)
    kern = rt.compile(WRITE_INT8, SEED="true" if seed else "false", NV=D // (4 * L), **var.defines(L))
    return _row_dispatches(rt, kern, key, value, sm, [k_buf, v_buf],
                           lambda rows, gx: kern.pack(kvh, D, block_size, D // 4 + 1, rows, gx), WG // L)


# Lanes a row of the FP8 per-tensor writer pass by default: it reduces nothing across lanes, so any lane count is
# legal without subgroups. 16 measured fastest on the H200 at the anchor, against 4, 8 and 32 (docs/benchmarks.md).
PER_TENSOR_LANES = 16


def fp8_dispatches(rt: GpuRuntime, fmt, per_tensor: bool, key, value, slots, k_buf, v_buf, tensor, block_size: int, *,
                   variant: Variant | None = None) -> list[Dispatch]:
    """FP8 records (kvviz/families/fp8/format.py `fmt`), per-token scale word or per-tensor scales in `tensor`
    ([amax K, amax V, scale K, scale V], zeroed before): the codes of fp8/write.wgsl."""
    key, value, sm = _check_rows(key, value, slots)
    T, kvh, D = key.shape
    var = variant or Variant(rt)
    L = var.lanes(D // 4)
    if per_tensor and variant is None:   # no row reduction: the lanes need no subgroup (PER_TENSOR_LANES)
        L = choose_lanes(D // 4, 0, PER_TENSOR_LANES)
    d = dict(fmt.defines(), PER_TENSOR="true" if per_tensor else "false", NAME=fmt.name, NV=D // (4 * L), **var.defines(L))
    wpt = D // 4 + (0 if per_tensor else 1)
    out = []
    if per_tensor:
        out += amax_dispatches(rt, key, value, sm, tensor, block_size, wpt, var)
    kern = rt.compile(WRITE_FP8, **d)
    out += _row_dispatches(rt, kern, key, value, sm, [k_buf, v_buf, tensor],
                           lambda rows, gx: kern.pack(kvh, D, block_size, wpt, rows, gx), WG // L)
    return out


# Row blocks a workgroup of the per-tensor amax pass (it strides over the rows: any grid is correct; fewer
# workgroups, fewer reductions and atomics). 16 measured fastest on the H200 at the anchor, against 1, 4 and 64
# (FP8 per-tensor's pass, the slot and the values loaded together; NVFP4's the same; docs/benchmarks.md).
AMAX_BLOCKS = 16


def amax_dispatches(rt: GpuRuntime, key, value, sm, tensor, block_size: int, wpt: int, var: Variant) -> list[Dispatch]:
    """The per-tensor amax pass (fp8/amax_fast.wgsl) of the FP8 per-tensor and NVFP4 writers: max |x| bits of
    K and V into tensor[0|1] (zeroed before)."""
    T, kvh, D = key.shape
    L = var.lanes(D // 4)
    amax = rt.compile(WRITE_FP8_AMAX, NV=D // (4 * L), **var.defines(L))
    return _row_dispatches(rt, amax, key, value, sm, [tensor],
                           lambda rows, gx: amax.pack(kvh, D, block_size, wpt, rows, gx), AMAX_BLOCKS * (WG // L))


def int4_dispatches(rt: GpuRuntime, group: int, key, value, slots, k_buf, v_buf, block_size: int, *,
                    variant: Variant | None = None) -> list[Dispatch]:
    """int4_group records (kvviz/families/int4/format.py): 8 codes a word, then (scale, zero) per group of `group`."""
    key, value, sm = _check_rows(key, value, slots)
    T, kvh, D = key.shape
    if D % 8 or group % 8 or D % group:
        raise UnsupportedShape(f"fast int4 writer: head_size {D} and group {group} must be multiples of 8, the group dividing the head")
    var = variant or Variant(rt)
    L = var.lanes(D // 8, group // 8)
    # a group's statistics are reduced over min(group units, L) lanes (write_int4.wgsl SPAN): shuffles where that
    # span fits the smallest subgroup (measured faster than workgroup memory on the H200)
    kern = rt.compile(WRITE_INT4, GROUP=group, NJ=D // (8 * L), **var.defines(L, span=min(group // 8, L)))
    wpt = D // 8 + 2 * (D // group)
    return _row_dispatches(rt, kern, key, value, sm, [k_buf, v_buf],
                           lambda rows, gx: kern.pack(kvh, D, block_size, wpt, rows, gx), WG // L)


def kivi_token_dispatches(rt: GpuRuntime, bits: int, key, value, slots, row_res, k_buf, v_buf, res, block_size: int,
                          kstride: int, *, variant: Variant | None = None) -> list[Dispatch]:
    """KIVI's per-token part (kvviz/families/kivi/format.py): V codes of quantised rows, residual rows copied."""
    key, value, sm = _check_rows(key, value, slots)
    T, kvh, D = key.shape
    kw = D * bits // 32
    var = variant or Variant(rt)
    L = var.lanes(kw)
    kern = rt.compile(WRITE_KIVI_TOK, BITS=bits, NJ=kw // L, **var.defines(L))
    return _row_dispatches(rt, kern, key, value, sm, [k_buf, v_buf, res],
                           lambda rows, gx: kern.pack(kvh, D, block_size, kstride, rows, gx), WG // L,
                           extra_rows=[np.asarray(row_res, np.uint32)])


# write_kivi_kgroup.wgsl's row sets RS (1, 2, 4 or 8) where RS x D/4 threads fit (fast_write_bench.py --kgroup-rs=N)
KGROUP_ROW_SETS = 4


def kgroup_defines(rt: GpuRuntime, head_size: int) -> dict:
    """write_kivi_kgroup.wgsl's shape: NV4 = D/4 vec4 columns, RS row sets (4 where 4 x NV4 threads fit the
    adapter's workgroup, else 2 or 1), so TG = RS x NV4 threads and 32 / RS rows a thread; SBUF its workgroup words."""
    nv4 = head_size // 4
    most = int(rt.limits.get("max-compute-invocations-per-workgroup", 256) or 256)
    shared = int(rt.limits.get("max-compute-workgroup-storage-size", 16384) or 16384)
    sbuf = lambda r: max(8 * r * nv4, 32 * nv4)  # noqa: E731 (workgroup words at r row sets)
    fits = [r for r in (8, 4, 2, 1) if r <= KGROUP_ROW_SETS and r * nv4 <= most and 4 * sbuf(r) <= shared]
    if not fits:
        raise UnsupportedShape(f"fast KIVI key-group writer: head size {head_size} needs {nv4} threads and "
                               f"{128 * nv4} bytes of workgroup memory, the adapter allows {most} and {shared}")
    return {"NV4": nv4, "RS": fits[0], "SBUF": sbuf(fits[0])}


def kivi_group_dispatches(rt: GpuRuntime, bits: int, key, slots, groups: np.ndarray, group_rows: np.ndarray, info_buf,
                          k_buf, block_size: int, kstride: int, bt_off: int, mbs: int, *, key_buf=None,
                          variant: Variant | None = None) -> list[Dispatch]:
    """KIVI key groups: groups [n, 4] u32 (seq, g, 0, 0), group_rows [n, 32] the token rows of each group
    (indices into key). Read in place from `key_buf` (the uploaded key, when given and it fits one binding),
    else from the groups' rows uploaded one binding at a time."""
    key = np.ascontiguousarray(key, np.float32)
    T, kvh, D = key.shape
    groups = np.ascontiguousarray(groups, np.uint32).reshape(-1, 4)
    group_rows = np.asarray(group_rows, np.int64).reshape(-1, 32)
    if not len(groups):
        return []
    var = variant or Variant(rt)
    kern = rt.compile(WRITE_KIVI_KGROUP, BITS=bits, **kgroup_defines(rt, D), **var.defines(1))
    sm = np.asarray(slots).astype(np.uint32)
    row_bytes = kvh * D * 4
    out = []
    whole = T * row_bytes <= rt.max_binding
    per = len(groups) if whole else max(1, rt.max_binding // (32 * row_bytes))
    kb = sb = None
    if whole:
        kb = key_buf if key_buf is not None else rt.upload(key, "key")
        sb = rt.upload(sm, "slots")
    for a in range(0, len(groups), per):
        b = min(len(groups), a + per)
        rows = group_rows[a:b]
        if whole:
            kbuf, sbuf, local = kb, sb, rows
        else:
            flat = rows.reshape(-1)
            kbuf, sbuf = rt.upload(key[flat], "kivi_key_groups"), rt.upload(sm[flat], "kivi_group_slots")
            local = np.arange(flat.size).reshape(rows.shape)
        items = (b - a) * kvh  # a workgroup a (group, KV head)
        gx, gy, gz = grid_2d(rt, items)
        out.append(kern.dispatch((gx, gy, gz), [kbuf, sbuf, rt.upload(local.astype(np.uint32), "kivi_group_rows"),
                                                rt.upload(groups[a:b], "kivi_groups"), info_buf, k_buf],
                                 imm=kern.pack(kvh, D, block_size, kstride, bt_off, mbs, items, gx)))
    return out


def f16_dispatches(rt: GpuRuntime, key, value, slots, k_buf, v_buf, block_size: int) -> list[Dispatch]:
    """f16 records [hd/2 words], element 2w in the low half of word w (numpy astype(float16) bits)."""
    key, value, sm = _check_rows(key, value, slots)
    T, kvh, D = key.shape
    kern = rt.compile(WRITE_F16)
    out = []
    for a, b in input_chunks(rt, T, kvh * D * 4):
        if b <= a:
            continue
        items = (b - a) * kvh * (D // 4)
        gx, gy, gz = grid_2d(rt, -(-items // WG))
        out.append(kern.dispatch((gx, gy, gz), [rt.upload(key[a:b], "key"), rt.upload(value[a:b], "value"),
                                                rt.upload(sm[a:b].astype(np.uint32), "slots"), k_buf, v_buf],
                                 imm=kern.pack(kvh, D, block_size, items, gx)))
    return out


# ------------------------------------------------------------------------------ per method
def method_dispatches(rt: GpuRuntime, method, qc, key, value, sm, variant: Variant | None = None):
    """The fast writer of a per-token-record method (kvviz/methods/records.py) into its cache `qc`, or
    None when it has none for this shape (the method then keeps its first-wave writer)."""
    fam = getattr(method, "family", "")
    D = np.asarray(key).shape[2]
    try:
        if fam == "int8" and method.id == "int8_token":
            return int8_dispatches(rt, key, value, sm, qc.k, qc.v, qc.block_size, variant=variant)
        if fam == "fp8" and hasattr(method, "fmt"):
            return fp8_dispatches(rt, method.fmt, method.per_tensor, key, value, sm, qc.k, qc.v, qc.extra["tensor"],
                                  qc.block_size, variant=variant)
        if fam == "int4" and hasattr(method, "group_for"):
            g = method.group_for(D)
            if g and g % 8 == 0:
                return int4_dispatches(rt, g, key, value, sm, qc.k, qc.v, qc.block_size, variant=variant)
            return None
        if fam == "f16":
            return f16_dispatches(rt, key, value, sm, qc.k, qc.v, qc.block_size)
    except UnsupportedShape as exc:
        log.info("%s: no fast writer for this shape (%s); the first-wave writer runs", method.id, exc)
        return None
    return None


def describe(rt: GpuRuntime) -> str:
    """One line for logs and the bench: which variant the fast writers run on this adapter."""
    sub = subgroups_available(rt)
    return (f"fast writers: {'subgroup shuffles' if sub else 'workgroup memory'}, up to {max_lanes(rt, sub)} "
            f"lanes a row, 2-D grid up to {rt.max_grid}^2 workgroups")


__all__ = ["KERNELS", "Variant", "choose_lanes", "int8_dispatches", "fp8_dispatches", "int4_dispatches",
           "kivi_token_dispatches", "kivi_group_dispatches", "amax_dispatches", "f16_dispatches", "method_dispatches", "describe"]
