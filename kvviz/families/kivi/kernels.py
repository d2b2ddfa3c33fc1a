"""Kernels of the kivi family: KernelSpec rows of every variant (first-wave writer and dequantise,
fast writer) and their host launchers. Shaders in shaders/kivi/."""
from __future__ import annotations


import numpy as np

from kvviz.attention import writers as fw
from kvviz.attention.records import DEQUANT_OUT, TOKENS
from kvviz.errors import UnsupportedShape
from kvviz.gpu.kernel_spec import KernelSpec, Struct, ro, rw
from kvviz.gpu.runtime import Dispatch, GpuRuntime



# KIVI kernels take BITS.
KIVI_WRITE_TOK = KernelSpec("kivi/write_tok.wgsl", bindings=TOKENS + ro("row_res") + rw("k_cache", "v_cache", "res"),
                            immediates=Struct("P", "kvh hd bs kstride"))

KIVI_WRITE_KGROUP = KernelSpec("kivi/write_kgroup.wgsl", bindings=ro("key_g", "slots_g", "groups", "info") + rw("k_cache"),
                               immediates=Struct("P", "kvh hd bs kstride bt_off mbs"))

KIVI_DEQUANT = KernelSpec("kivi/dequant.wgsl", bindings=ro("k_cache", "v_cache", "res", "info", "items") + DEQUANT_OUT,
                          immediates=Struct("P", "kvh hd bs kstride bt_off mbs win0"))

WRITE_KIVI_TOK = KernelSpec("kivi/write_tok_fast.wgsl", bindings=TOKENS + ro("row_res") + rw("k_cache", "v_cache", "res"),
                            immediates=Struct("P", "kvh hd bs kstride rows gx"))

WRITE_KIVI_KGROUP = KernelSpec("kivi/write_kgroup_fast.wgsl",
                               bindings=ro("key_in", "slots", "grows", "groups", "info") + rw("k_cache"),
                               immediates=Struct("P", "kvh hd bs kstride bt_off mbs items gx"))

WRITE_KIVI_TOK = WRITE_KIVI_TOK.define(BITS=2, REDUCE=fw.REDUCE_WORKGROUP, **fw.LANE_DEFAULTS)

WRITE_KIVI_KGROUP = WRITE_KIVI_KGROUP.define(BITS=2, REDUCE=fw.REDUCE_WORKGROUP, NV4=32, RS=4, SBUF=1024, **fw.LANE_DEFAULTS)

def kivi_token_dispatches(rt: GpuRuntime, bits: int, key, value, slots, row_res, k_buf, v_buf, res, block_size: int,
                          kstride: int, *, variant: fw.Variant | None = None) -> list[Dispatch]:
    """KIVI's per-token part (kvviz/families/kivi/format.py): V codes of quantised rows, residual rows copied."""
    key, value, sm = fw.check_rows(key, value, slots)
    T, kvh, D = key.shape
    kw = D * bits // 32
    var = variant or fw.Variant(rt)
    L, nj, pad = var.split(kw, 8 // bits)  # a code word holds 32 / bits codes: 8 / bits vec4s
    kern = rt.compile(WRITE_KIVI_TOK, BITS=bits, NJ=nj, PAD="true" if pad else "false", **var.defines(L))
    return fw.row_dispatches(rt, kern, key, value, sm, [k_buf, v_buf, res],
                           lambda rows, gx: kern.pack(kvh, D, block_size, kstride, rows, gx), fw.WG // L,
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
                          variant: fw.Variant | None = None) -> list[Dispatch]:
    """KIVI key groups: groups [n, 4] u32 (seq, g, 0, 0), group_rows [n, 32] the token rows of each group
    (indices into key). Read in place from `key_buf` (the uploaded key, when given and it fits one binding),
    else from the groups' rows uploaded one binding at a time."""
    key = np.ascontiguousarray(key, np.float32)
    T, kvh, D = key.shape
    groups = np.ascontiguousarray(groups, np.uint32).reshape(-1, 4)
    group_rows = np.asarray(group_rows, np.int64).reshape(-1, 32)
    if not len(groups):
        return []
    var = variant or fw.Variant(rt)
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
        gx, gy, gz = fw.grid_2d(rt, items)
        out.append(kern.dispatch((gx, gy, gz), [kbuf, sbuf, rt.upload(local.astype(np.uint32), "kivi_group_rows"),
                                                rt.upload(groups[a:b], "kivi_groups"), info_buf, k_buf],
                                 imm=kern.pack(kvh, D, block_size, kstride, bt_off, mbs, items, gx)))
    return out


# Every variant of the family's kernels, first-wave and fast (kvviz/families/catalogue.py).
KERNELS = (KIVI_WRITE_TOK, KIVI_WRITE_KGROUP, KIVI_DEQUANT, WRITE_KIVI_TOK, WRITE_KIVI_KGROUP)
