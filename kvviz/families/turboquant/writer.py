"""The fast writer of TurboQuant's seed configuration: the paged per-token records that
tq_general_compress.wgsl writes at bits 2 / v_bits 2 without outliers (K [polar d/16 | jl d/32 | norm],
V [polar d/16 | norm] u32; the seed compressor's words re-laid out, kvviz/families/turboquant/format.py seed_records),
bit for bit, from shaders/turboquant/write_fast.wgsl.

Why it is fast, against tq_general_compress (one 256-lane workgroup per (row, KV head, K|V), the norm trees
and the Walsh-Hadamard stages through workgroup memory with a barrier each, 3/4 of the lanes idle at d=32):
  - a lane group of L lanes per (token, KV head) row (L = 8 by default, at most the adapter's subgroup size and
    d/4), K and V together, 64/L rows a workgroup; each lane holds d/L elements as vec4s;
  - the butterflies across lanes by subgroupShuffleXor, the others in registers; the norm trees in registers
    and by shuffles; code words OR-combined by shuffles and stored whole;
  - the code is generated straight-line (no private arrays: nothing leaves the registers);
  - a 2-D grid (fast_write.grid_2d): more than 65535 workgroups take one dispatch.
The arithmetic is the oracle's, op for op (the shader's header says how each tree and butterfly keeps its order),
so the words equal kvviz/families/turboquant/oracle.py compress_general / encode_keys on an IEEE device
(tests/test_fast_write_tq.py), and on the H200 every word of the anchor shape equals tq_general_compress's.
Without the subgroup feature `dispatches` returns None and the caller keeps the general compressor.

On the H200 at the anchor (15 x 4096 tokens, 8 KV heads, head 128) 8 lanes a row is faster than 4 or 16, and the
kernel is far faster than tq_general_compress and the seed compressor tq_compress (figures in docs/benchmarks.md).
The kernel is bound by its instructions, not its bytes, so it saves instructions: the cross-lane butterflies as one
fma by +-1 (not an add, a subtract and a select), the code and centroid from one set of compares, the JL nibble by
ORs, and the OR of code words over 4 / 8 lanes written straight-line instead of a loop (naga bounds every loop with a
counter the driver does not see through, so a 2-step loop stays a loop).
"""
from __future__ import annotations

import numpy as np

from kvviz.attention import writers as fw
from kvviz.attention.split_decode import FastDecode
from kvviz.errors import InvalidInput, UnsupportedShape, check_finite
from kvviz.families.turboquant import format as tqf
from kvviz.families.turboquant.kernels import check_head_size
from kvviz.gpu.kernel_spec import KernelSpec, Struct, ro, rw
from kvviz.gpu.runtime import DeviceRows, Dispatch, GpuRuntime
from kvviz.paging import PAD_SLOT

WRITE_TQ = KernelSpec("turboquant/write_fast.wgsl", bindings=ro("key_in", "val_in", "slots", "signs") + rw("k_cache", "v_cache"),
                      immediates=Struct("P", "kvh bs rows gx zero inv_sqrt_d:f32"))
KERNELS = (WRITE_TQ,)
DEFAULT_LANES = 8  # lanes a row; fewer lanes = fewer shuffles per row (the butterflies cost d/L each per stage)
WG = 64
F16_MAX = 65504.0


def _f32(v) -> str:
    """An f32 value as an exact WGSL hex-float literal (naga takes no bitcast in a const expression)."""
    return float(np.float32(v)).hex() + "f"


def _vec(vals) -> str:
    return ", ".join(_f32(v) for v in vals)


def _tree(names: list[str], I: str) -> list[str]:
    """In-lane tree over the vec4s `names` (strides n/2, ..., 1: the elements' top bits): names[0] = the sum."""
    out, n = [], len(names)
    h = n // 2
    while h >= 1:
        out += [f"{I}{names[j]} = {names[j]} + {names[j + h]};" for j in range(h)]
        h //= 2
    return out


def _wht(v: list[str], L: int, I: str) -> list[str]:
    """WHT of the row held in vec4s v (element c + 4 l + 4 L j), strides 1, 2, 4 .. 2L, 4L .., in that order."""
    out = [f"{I}{x} = bfly12({x});" for x in v]
    m = 1
    while m < L:
        out += [f"{I}{x} = xbfly({x}, {m}u, lane);" for x in v]
        m *= 2
    h, n = 1, len(v)
    while h < n:
        for j in range(n):
            if j & h == 0:
                a, b = v[j], v[j + h]
                out.append(f"{I}{{ let a = {a}; {a} = a + {b}; {b} = a - {b}; }}")
        h *= 2
    return out


def _encode(which: str, L: int, NJ: int, I: str = "  ") -> list[str]:
    """One of K / V: load names {x}{j} (x = k or v) already set; stores into k_cache / v_cache."""
    x = which.lower()
    keys = which == "K"
    C, B = ("CK", "BK") if keys else ("CV", "BV")
    cache, dst = ("k_cache", "kdst") if keys else ("v_cache", "vdst")
    sp = 0 if keys else 2  # signs: [K polar | K jl | V polar], each D/4 vec4s
    J = range(NJ)
    y = [f"{x}y{j}" for j in J]
    a = [f"{x}a{j}" for j in J]
    o = [f"  // ---- {'keys' if keys else 'values'} ----"]
    o += [f"{I}var {a[j]} = opaque({x}{j} * {x}{j});" for j in J]
    o += _tree(a, I)
    o += [f"{I}let {x}n = sqrt(lane_sum({a[0]}));", f"{I}let {x}z = {x}n < EPS;",
          f"{I}let {x}k = p.inv_sqrt_d / select({x}n, 1.0, {x}z);"]
    o += [f"{I}var {y[j]} = ({x}{j} * {x}k) * signs[{sp} * (D / 4u) + lane + {j}u * L];" for j in J]
    o += _wht(y, L, I)
    q = [f"{x}q{j}" for j in J]
    o += [f"{I}let {q[j]}c = quant({y[j]}, {B}, {C});" for j in J]
    o += [f"{I}let {q[j]} = {q[j]}c.q;" for j in J]
    # polar words: lane l's byte (its 4 codes) at bits 8 (l & 3) of word (l >> 2) + (L / 4) j
    pw = [f"{x}pw{j}" for j in J]
    for j in J:
        o.append(f"{I}let {pw[j]} = or4(({q[j]}.x | ({q[j]}.y << 2u) | ({q[j]}.z << 4u) | ({q[j]}.w << 6u))"
                 f" << (8u * (lane & 3u)));")
    rn = "0.0"
    if keys:
        r = [f"{x}r{j}" for j in J]
        o += [f"{I}let {r[j]} = {y[j]} - {q[j]}c.c;" for j in J]
        o += [f"{I}{a[j]} = opaque({r[j]} * {r[j]});" for j in J]
        o += _tree(a, I)
        o += [f"{I}let {x}rn = sqrt(lane_sum({a[0]}));", f"{I}let {x}nr = {x}rn < EPS;",
              f"{I}let {x}srn = select({x}rn, 1.0, {x}nr);"]
        z = [f"{x}j{j}" for j in J]
        o += [f"{I}var {z[j]} = ({r[j]} / {x}srn) * signs[(D / 4u) + lane + {j}u * L];" for j in J]
        o += _wht(z, L, I)
        nib = [f"{x}b{j}" for j in J]
        o += [f"{I}let {nib[j]}v = select(vec4<u32>(0u), vec4<u32>(1u, 2u, 4u, 8u), {z[j]} >= vec4<f32>(0.0));" for j in J]
        o += [f"{I}let {nib[j]} = ({nib[j]}v.x | {nib[j]}v.y) | ({nib[j]}v.z | {nib[j]}v.w);" for j in J]
        rn = f"{x}rn"
    stores = []
    for j in J:
        stores.append(f"{I}  if ((lane & 3u) == 0u) {{ {cache}[{dst} + (lane >> 2u) + {L // 4}u * {j}u] = select({pw[j]}, 0u, {x}z); }}")
    if keys:  # the shuffles outside the stores' branch: every lane of the group takes part
        jz = f"{x}z || {x}nr"
        if L >= 8:  # lane l's nibble at bits 4 (l & 7) of word (l >> 3) + (L / 8) j
            for j in J:
                o.append(f"{I}let {x}jw{j} = or8({nib[j]} << (4u * (lane & 7u)));")
                stores.append(f"{I}  if ((lane & 7u) == 0u) {{ {cache}[{dst} + D / 16u + (lane >> 3u) + {L // 8}u * {j}u] = "
                              f"select({x}jw{j}, 0u, {jz}); }}")
        else:  # L = 4: word j >> 1 holds j's nibbles at 4 l + 16 (j & 1)
            for w in range(NJ // 2):
                o.append(f"{I}let {x}jw{w} = or4(({nib[2 * w]} | ({nib[2 * w + 1]} << 16u)) << (4u * lane));")
                stores.append(f"{I}  if (lane == 0u) {{ {cache}[{dst} + D / 16u + {w}u] = select({x}jw{w}, 0u, {jz}); }}")
    o.append(f"{I}if (store) {{")
    o += stores
    o.append(f"{I}  if (lane == 0u) {{ {cache}[{dst} + {'WK' if keys else 'WV'} - 1u] = "
             f"select(pack2x16float(vec2<f32>({x}n, {rn})), 0u, {x}z); }}")
    o.append(f"{I}}}")
    return o


def render_defines(d: int, L: int, st: tqf.TQSettings) -> dict:
    NJ = d // (4 * L)
    (ik,), (iv,) = st.instances("K"), st.instances("V")
    ck, bk = ik.codebook
    cv, bv = iv.codebook
    if any((np.diff(np.asarray(b, np.float64)) <= 0).any() for b in (bk, bv)):  # write_tq.wgsl quant() relies on the order
        raise UnsupportedShape("fast TurboQuant writer: the codebook boundaries must be ascending")
    I = "  "
    load = [f"{I}var {x}{j} = vec4<f32>(0.0);" for x in "kv" for j in range(NJ)]
    load.append(f"{I}if (live) {{")
    load += [f"{I}  {x}{j} = {buf}[src + {j}u * L];" for j in range(NJ) for x, buf in (("k", "key_in"), ("v", "val_in"))]
    load.append(f"{I}}}")
    lane_sum = []
    m = L // 2
    while m >= 1:
        lane_sum.append(f"  s = s + subgroupShuffleXor(s, {m}u);")
        m //= 2
    return dict(D=d, L=L, NJ=NJ, CK=_vec(ck), BK=_vec(bk),
                CV=_vec(cv), BV=_vec(bv), LOAD="\n".join(load), LANE_SUM="\n".join(lane_sum) or "  // one lane",
                KEYS="\n".join(_encode("K", L, NJ)), VALUES="\n".join(_encode("V", L, NJ)))


def subgroup_size(rt: GpuRuntime) -> int:
    """The adapter's measured subgroup size (FastDecode's probe, shared and cached on the runtime); 1 without
    the subgroup feature."""
    return FastDecode(rt).subgroup_size


def lanes_for(rt: GpuRuntime, d: int, lanes: int | None = None) -> int:
    """Lanes a row: `lanes` (default DEFAULT_LANES), capped by d/4 and the subgroup size; 0 where the adapter has no
    subgroups (or fewer than 4 lanes in one)."""
    sg = subgroup_size(rt)
    want = DEFAULT_LANES if lanes is None else int(lanes)
    if want not in (4, 8, 16):
        raise InvalidInput(f"fast TurboQuant writer: lanes must be 4, 8 or 16, got {lanes}")
    L = min(want, d // 4, 1 << (max(1, sg).bit_length() - 1))
    return L if L >= 4 else 0


def check_inputs(key, value, slots, d_expected: int | None = None):
    """key / value float32 [tokens, kv_heads, head_size] (32 / 64 / 128), finite, norms within f16; slots one a row."""
    key, value = np.asarray(key), np.asarray(value)
    for name, a in (("key", key), ("value", value)):
        if a.dtype != np.float32 or a.ndim != 3:
            raise InvalidInput(f"fast TurboQuant writer: {name} must be float32 [tokens, kv_heads, head_size], "
                               f"got {a.dtype} {a.shape}")
    if key.shape != value.shape:
        raise InvalidInput(f"fast TurboQuant writer: key and value shapes differ: {key.shape} and {value.shape}")
    T, kvh, d = key.shape
    check_head_size(d)
    if d_expected is not None and d != d_expected:
        raise InvalidInput(f"fast TurboQuant writer: head_size {d}, the settings' {d_expected}")
    sm = np.asarray(slots)
    if sm.dtype.kind not in "ui" or sm.shape != (T,):
        raise InvalidInput(f"fast TurboQuant writer: {T} token rows but slots {sm.dtype} {sm.shape}")
    for name, a in (("key", key), ("value", value)):
        check_finite(name, a)
        if T and float(np.sqrt((a.astype(np.float64) ** 2).sum(-1)).max()) > F16_MAX:
            raise InvalidInput(f"a {name} vector has a norm above {F16_MAX:g}: TurboQuant stores norms as f16",
                               "Scale the input down; f16 norms overflow to infinity.")
    return np.ascontiguousarray(key), np.ascontiguousarray(value), sm.astype(np.int64)


def dispatches(rt: GpuRuntime, st: tqf.TQSettings, key, value, slots, k_buf, v_buf, block_size: int, *,
               lanes: int | None = None, checked: bool = False) -> list[Dispatch] | None:
    """The fast writer's dispatches of key / value [T, kvh, d] into the paged caches k_buf / v_buf
    ([blocks, kvh, block_size, wpt] u32) through `slots` (PAD_SLOT rows skipped); None where it cannot run
    (no subgroups: the caller keeps tq_general_compress). checked: the caller validated the inputs already. key /
    value may be DeviceRows (on the device already: bound in place, their values unchecked)."""
    if not st.is_seed:
        raise UnsupportedShape("fast TurboQuant writer: only the seed configuration (bits 2, v_bits 2, no outliers, "
                               "head 32/64/128)", "The general compressor serves the other settings.")
    if isinstance(key, DeviceRows) or isinstance(value, DeviceRows):  # bound in place (fw.row_input), not checked
        key, value, sm = fw.check_rows(key, value, slots)
        check_head_size(key.shape[2])
    elif checked:
        key, value = np.ascontiguousarray(key, np.float32), np.ascontiguousarray(value, np.float32)
        sm = np.asarray(slots).astype(np.int64)
    else:
        key, value, sm = check_inputs(key, value, slots, st.head_size)
    T, kvh, d = key.shape
    L = lanes_for(rt, d, lanes)
    if not L:
        return None
    if T == 0:
        return []
    kern = rt.compile(WRITE_TQ, **render_defines(d, L, st))
    (ik,), (iv,) = st.instances("K"), st.instances("V")
    signs = rt.upload(np.concatenate([ik.signs[0], ik.signs[1], iv.signs[0]]).astype(np.float32), "tq_fast_signs")
    out = []
    for a, b in fw.input_chunks(rt, T, kvh * d * 4):
        if b <= a:
            continue
        rows = (b - a) * kvh
        gx, gy, gz = fw.grid_2d(rt, -(-rows // (WG // L)))
        bufs = [fw.row_input(rt, key, a, b, "tq_fast_key"), fw.row_input(rt, value, a, b, "tq_fast_value"),
                rt.upload(sm[a:b].astype(np.uint32), "tq_fast_slots"), signs, k_buf, v_buf]
        out.append(kern.dispatch((gx, gy, gz), bufs, imm=kern.pack(kvh, int(block_size), rows, gx, 0, tqf.inv_sqrt_d(d))))
    return out


def writer_bytes(batch, kvh: int, d: int) -> int:
    """Unique bytes: f32 K and V of the real rows in, the slot mapping, K and V records out."""
    real = int(np.count_nonzero(np.asarray(batch.slot_mapping) != PAD_SLOT))
    wk, wv = d // 16 + d // 32 + 1, d // 16 + 1
    return 2 * real * kvh * d * 4 + int(batch.num_tokens) * 4 + real * kvh * (wk + wv) * 4


__all__ = ["WRITE_TQ", "dispatches", "lanes_for", "render_defines", "writer_bytes", "check_inputs"]
