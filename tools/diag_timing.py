"""Cross-checks GPU timestamp timings against wall-clock throughput on the current adapter.

For a few kernels at the anchor shape: isolated runs (submit + wait each), back-to-back runs in one
submit, and wall-clock of N back-to-back dispatches in one submit divided by N.
"""
import time

import numpy as np

from kvviz.bench import SHAPES, make_inputs
from kvviz.gpu.runtime import GpuRuntime
from kvviz.kernels.copy import copy_shader_dispatches
from kvviz.kernels.paged import PagedKernels

rt = GpuRuntime()
shape = SHAPES["decode-15x4096"]
batch, key, value, q = make_inputs(shape)
pk = PagedKernels(rt)
cases = {}
for fmt in ("q8", "f32"):
    c = pk.allocate(fmt, batch.num_blocks, shape.num_kv_heads, shape.block_size, shape.head_size)
    pk.write(c, key, value, batch.slot_mapping)
    cases[f"decode_{fmt}"] = pk.decode_dispatches(c, q, batch, 1 / np.sqrt(128))[0]
    cases[f"writer_{fmt}"] = pk.write_dispatches(c, key, value, batch.slot_mapping)
cases["copy_shader"] = copy_shader_dispatches(rt, 2 * key.nbytes)[0]


def wall(d, n):
    groups = [rt._bind_group(x) for x in d]
    enc = rt.device.create_command_encoder()
    p = enc.begin_compute_pass()
    for _ in range(n):
        rt._record(p, d, groups)
    p.end()
    rt.queue.submit([enc.finish()])
    rt._wait()
    t0 = time.perf_counter()
    enc = rt.device.create_command_encoder()
    p = enc.begin_compute_pass()
    for _ in range(n):
        rt._record(p, d, groups)
    p.end()
    rt.queue.submit([enc.finish()])
    rt._wait()
    return (time.perf_counter() - t0) / n * 1e6


for name, d in cases.items():
    iso = rt.time(d, runs=20, warmup=3, isolate=True)
    b2b = rt.time(d, runs=20, warmup=3, isolate=False)
    w = wall(d, 50)
    print(f"{name:14s} isolated median {iso.median_us:9.1f} min {iso.min_us:9.1f} | back-to-back median {b2b.median_us:9.1f} "
          f"min {b2b.min_us:9.1f} | wall/N (50 in one pass) {w:9.1f} us")
    print("   isolated samples:", [round(x) for x in iso.samples_us[:10]])
    print("   b2b samples:     ", [round(x) for x in b2b.samples_us[:10]])
