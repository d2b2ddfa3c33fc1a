"""How many split-kernel workgroups an SM holds at once, measured: the fast decode's split kernel alone over
S sequences of T tokens in one partition each (S x 8 workgroups of equal work), S stepped across the counts
where another workgroup a SM would be needed (132 SMs on the H200). The median GPU time stays flat while every
workgroup is resident in one wave and jumps by about one workgroup's time where the grid outgrows the SMs'
capacity: the jump's workgroup count / SMs is how many the register file (or workgroup memory) lets an SM hold.
Run on the device:
    python3 tools/residency_probe.py [T [formats]]     (formats: int8,f16,i8q; i8q = the int8-query variant, U=4;
                                                        a "+np" suffix: without the software prefetch, render's prefetch)
"""
import sys

import numpy as np

from kvviz.gpu.runtime import GpuRuntime
from kvviz.attention import split_decode as fd
from kvviz.paging import make_batch

T = int(sys.argv[1]) if len(sys.argv) > 1 else 1024
FORMATS = (sys.argv[2] if len(sys.argv) > 2 else "int8,f16,i8q").split(",")
H, KVH, D, BS = 32, 8, 128, 16
SMS = 132
rt = GpuRuntime()
print(rt.summary.line())
fast = fd.FastDecode(rt)
rng = np.random.default_rng(0)
counts = sorted({max(1, (SMS * w + d) // KVH) for w in range(1, 9) for d in (-8, 8)})
for name in FORMATS:
    fmt = fd.F16 if name.startswith("f16") else fd.INT8
    kw = dict(qk="i8", unroll=4) if name.startswith("i8q") else {}
    kw["prefetch"] = False if name.endswith("+np") else None
    smax = max(counts)
    big = make_batch([T] * smax, BS, policy="scattered", seed=0)
    n = big.num_blocks * KVH * BS * fmt.wpt(D)
    k = rt.upload(rng.integers(0, 1 << 31, n, dtype=np.uint32) & np.uint32(0x3C3C3C3C), "k")
    v = rt.upload(rng.integers(0, 1 << 31, n, dtype=np.uint32) & np.uint32(0x3C3C3C3C), "v")
    prev = None
    for S in counts:
        batch = make_batch([T] * S, BS, policy="scattered", seed=0)
        q = rng.standard_normal((S, H, D)).astype(np.float32)
        plan = fast.plan(fmt, k, v, KVH, q, batch, 0.088, partition_tokens=T, **kw)
        t = rt.time(plan.dispatches[:1], 30, 5).median_us
        wgs = S * KVH * plan.num_partitions
        jump = "" if prev is None else f"  {t - prev:+6.1f}"
        print(f"{name:8s} {plan.layout.workgroup:4d} threads  {wgs:5d} workgroups ({wgs / SMS:4.2f} a SM)  split {t:7.1f} us{jump}", flush=True)
        prev = t
