"""What the fast writers (reshape_and_cache) share: lane groups, the lane reductions, variants, the 2-D grid
and the row dispatches. Each family's fast writer (its spec and launcher in kvviz/families/<family>/
kernels.py, its shader shaders/<family>/write_fast.wgsl including shaders/common/write_fast.wgsl)
reproduces its method's numpy oracle word for word (kvviz/families/writer_oracles.py); tests
tests/test_fast_writers.py.

What makes them fast, against the first-wave writers (shaders/<family>/write.wgsl, one 64-thread
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
from kvviz.gpu.kernel_spec import Struct, ro
from kvviz.gpu.runtime import DeviceRows, Dispatch, GpuRuntime

log = logging.getLogger("kvviz.attention.writers")

ROW_IMM = Struct("P", "kvh hd bs wpt rows gx")
TOKENS = ro("key_in", "val_in", "slots")
# Every spec carries representative defines (one lane, the workgroup-memory reduction, ...) so it renders
# and checks on its own (tests/test_kernel_families.py); the launchers below always pass their own.
LANE_DEFAULTS = dict(LANES=1, REDUCE_KIND="workgroup memory", NV=1, NJ=1, INV_ULPS=0, PAD="false")

# The reductions over a lane group, pasted into write_common.wgsl ({{REDUCE}}).
REDUCE_SUBGROUP = """// red_min / red_min2: min over the `span` aligned lanes of lid's group (span a power of two <= L), by
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
REDUCE_WORKGROUP = """// red_min / red_min2: min over the `span` aligned lanes of lid's group, through workgroup memory (no subgroups).
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


# The most vec4s a lane of an exact lane split (choose_lanes) loads before a padded split is taken instead: the writers
# unroll their loops over a lane's vec4s, and a row that no power of two up to the lanes divides (25 or 15 vec4s: head
# 100, 120) would leave one or two lanes the whole row, a shader whose build time grows with the head size.
WRITER_NV_MAX = 8


def padded_split(units: int, lanes: int, most: int, unit_vec4s: int = 1) -> tuple[int, int, bool]:
    """(lanes, units a lane, padded) of a row of `units` units (vec4s, or code words of `unit_vec4s` vec4s) whose
    exact split takes `lanes`: that split while its lanes load at most WRITER_NV_MAX vec4s, else the most lanes (a
    power of two <= `most`) walking the row with padding (the last lanes' units past the row neither loaded nor
    written: the shader's PAD)."""
    if units // lanes * unit_vec4s <= WRITER_NV_MAX:
        return lanes, units // lanes, False
    L = 1 << (max(1, most).bit_length() - 1)
    nv = -(-units // L)
    return (L, nv, True) if L * nv != units else (L, nv, False)


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

    def split(self, units: int, unit_vec4s: int = 1) -> tuple[int, int, bool]:
        """(lanes, units a lane, padded) of a row of `units` units (of `unit_vec4s` vec4s) with no group to nest
        (padded_split)."""
        return padded_split(units, self.lanes(units), self.most, unit_vec4s)

    def defines(self, lanes: int, span: int | None = None) -> dict:
        """span: the widest lane span the kernel reduces over, where it is narrower than the lane group (int4's
        groups of 4 units at 8 lanes). A workgroup-memory variant whose spans all fit the adapter's smallest
        subgroup then reduces by shuffles anyway: an aligned span of lanes lies inside one subgroup."""
        sg = self.subgroups or (span is not None and 1 <= span <= self.shuffle_span)
        return {"LANES": lanes, "REDUCE": REDUCE_SUBGROUP if sg else REDUCE_WORKGROUP,
                "REDUCE_KIND": "subgroup shuffles" if sg else "workgroup memory", "INV_ULPS": self.inv_ulps}


def device_pair(key, value, who: str = "fast writer") -> bool:
    """True where key and value are DeviceRows (both, each [tokens, kv_heads, head_size], of one shape), False where
    both are host arrays; InvalidInput for a mixed or misshapen pair."""
    if not (isinstance(key, DeviceRows) or isinstance(value, DeviceRows)):
        return False
    if not (isinstance(key, DeviceRows) and isinstance(value, DeviceRows)):
        raise InvalidInput(f"{who}: key and value must both be on the device or both on the host")
    if len(key.shape) != 3 or tuple(key.shape) != tuple(value.shape):
        raise InvalidInput(f"{who}: key and value must both be [tokens, kv_heads, head_size], got "
                           f"{key.shape} and {value.shape}")
    return True


def check_rows(key, value, sm):
    """(key, value, slots as int64): key and value [tokens, kv_heads, head_size] float32, host arrays or DeviceRows
    (already on the device, e.g. gathered from the forward's activations: bound in place, never uploaded or read, so
    no host check of their values is possible)."""
    if device_pair(key, value):
        shape = tuple(key.shape)
    else:
        key = np.ascontiguousarray(key, np.float32)
        value = np.ascontiguousarray(value, np.float32)
        shape = key.shape
        if key.ndim != 3 or key.shape != value.shape:
            raise InvalidInput(f"fast writer: key and value must both be [tokens, kv_heads, head_size], got "
                               f"{key.shape} and {value.shape}")
    sm = np.asarray(sm)
    if sm.shape != (shape[0],):
        raise InvalidInput(f"fast writer: {shape[0]} token rows but {sm.shape} slots")
    if shape[2] % 4:
        raise UnsupportedShape(f"fast writer: head_size {shape[2]} is not a multiple of 4 (vec4 loads)")
    return key, value, sm.astype(np.int64)


def row_input(rt: GpuRuntime, rows, a: int, b: int, label: str):
    """Token rows a..b-1 of `rows` ([tokens, ...] float32) as a binding: uploaded from the host, or the span of a
    DeviceRows buffer (buffer, offset, size), bound in place. A span that would start at an offset the adapter cannot
    bind (min storage-buffer offset alignment) is refused with UnsupportedShape: the caller writes from the host."""
    if not isinstance(rows, DeviceRows):
        return rt.upload(rows[a:b], label)
    row = int(np.prod(rows.shape[1:])) * 4
    if (a * row) % rt.offset_alignment:
        raise UnsupportedShape(f"token row {a} of the device {label} starts at byte {a * row}, not a "
                               f"multiple of the adapter's storage offset alignment ({rt.offset_alignment})")
    return rows.buffer, a * row, (b - a) * row


def row_dispatches(rt, kern, key, value, sm, cache_bufs, imm_fn, rows_per_wg: int, extra_rows=()) -> list[Dispatch]:
    """One dispatch a binding chunk of token rows, grid 2-D over its (token, KV head) rows / rows_per_wg; key and
    value host arrays or DeviceRows (check_rows)."""
    T, kvh, D = key.shape
    out = []
    for a, b in input_chunks(rt, T, kvh * D * 4):
        if b <= a:
            continue
        rows = (b - a) * kvh
        gx, gy, gz = grid_2d(rt, -(-rows // rows_per_wg))
        bufs = [row_input(rt, key, a, b, "key"), row_input(rt, value, a, b, "value"),
                rt.upload(sm[a:b].astype(np.uint32), "slots")]
        bufs += [rt.upload(np.ascontiguousarray(e[a:b]), "rows") for e in extra_rows]
        bufs += list(cache_bufs)
        out.append(kern.dispatch((gx, gy, gz), bufs, imm=imm_fn(rows, gx)))
    return out


def describe(rt: GpuRuntime) -> str:
    """One line for logs and the bench: which variant the fast writers run on this adapter."""
    sub = subgroups_available(rt)
    return (f"fast writers: {'subgroup shuffles' if sub else 'workgroup memory'}, up to {max_lanes(rt, sub)} "
            f"lanes a row, 2-D grid up to {rt.max_grid}^2 workgroups")


