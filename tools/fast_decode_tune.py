"""Times the fast decode at the anchor shape (15 x 4096, 32/8 heads, d128, block 16, scattered) over
partition lengths, tokens per step and the no-subgroup variant, for the int8 (seed layout), f16 and
f32 caches; prints GPU medians and GB/s against the copy shader. Run on the device:
    python3 tools/fast_decode_tune.py [num_seqs ctx]
"""
import sys

import numpy as np

from kvviz.gpu.runtime import GpuRuntime
from kvviz.kernels import fast_decode as fd
from kvviz.kernels.copy import measure_copy
from kvviz.paging import make_batch

S, T = (int(sys.argv[1]), int(sys.argv[2])) if len(sys.argv) > 2 else (15, 4096)
POLICY = sys.argv[3] if len(sys.argv) > 3 else "scattered"  # how blocks are handed out: contiguous / scattered
ONLY = sys.argv[4].split(",") if len(sys.argv) > 4 else None  # formats to time, e.g. int8,f16
H, KVH, D, BS = 32, 8, 128, 16
rt = GpuRuntime()
print(rt.summary.line())
copy_gbps, _ = measure_copy(rt, 256 << 20, 20, 3)
print(f"copy shader: {copy_gbps:.0f} GB/s")
batch = make_batch([T] * S, BS, policy=POLICY, seed=0)
print(f"{S} x {T} tokens, {POLICY} blocks")
rng = np.random.default_rng(0)
fast = fd.FastDecode(rt)
q = rng.standard_normal((S, H, D)).astype(np.float32)
for fmt in (fd.INT8, fd.F16, fd.F32, fd.fp8_format("e4m3", False), fd.int4_format(32)):
    if ONLY and fmt.name not in ONLY:
        continue
    n = batch.num_blocks * KVH * BS * fmt.wpt(D)
    k = rt.upload(rng.integers(0, 1 << 31, n, dtype=np.uint32) & np.uint32(0x3C3C3C3C), "k")
    v = rt.upload(rng.integers(0, 1 << 31, n, dtype=np.uint32) & np.uint32(0x3C3C3C3C), "v")
    cases = [(True, ln, u, r, pt, True) for ln in (8, 16, 32) for r in (0, 16) for u in (1, 2) for pt in (None, 1024, 2048)]
    if fmt not in (fd.INT8, fd.F16):
        cases = [(True, ln, 2, 0, pt, True) for ln in (8, 16, 32) for pt in (None, 1024)]
    if ONLY:  # the default layout, with and without naga's runtime checks (kvviz/gpu/trusted.py)
        cases = [(True, 16, 2, 0, None, True), (True, 16, 2, 0, None, False)]
    for sub, lanes, unroll, rows, pt, checks in cases:
        try:
            plan = fast.plan(fmt, k, v, KVH, q, batch, 0.088, partition_tokens=pt, subgroups=sub, unroll=unroll,
                             rows=rows, lanes=lanes, checks=checks)
        except Exception as exc:  # noqa: BLE001 (a tuning table: say what failed and go on)
            print(f"{fmt.name} sub={sub} U={unroll} rows={rows} pt={pt}: {exc}")
            continue
        t = rt.time(plan.dispatches, 30, 5)
        nb, _ = fd.decode_traffic(fmt, batch, H, KVH, D, plan.num_partitions)
        gbps = nb / (t.median_us * 1e3)
        print(f"{fmt.name:9s} subgroups={sub!s:5s} checks={checks!s:5s} {plan.describe():80s} {t.median_us:8.1f} us "
              f"{gbps:7.0f} GB/s {100 * gbps / copy_gbps:5.1f}% of copy")
