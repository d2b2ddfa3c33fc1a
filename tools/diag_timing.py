"""Cross-checks GPU timestamp timings against wall-clock on the current adapter (device diagnostics).

For the seed decode and the f32 decode at the anchor shape: isolated runs (timestamps and wall per
run), runs back to back in one submit (timestamps), N dispatches in one pass (wall / N), N passes in
one submit (wall / N), and isolated runs right after a busy second; nvidia-smi clocks where present.
"""
import subprocess
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


def clocks():
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,clocks.mem,power.draw", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=10).stdout.strip()
    except Exception as exc:
        return f"n/a ({exc})"


def submit_wait(d, n, per_pass):
    groups = [rt._bind_group(x) for x in d]
    enc = rt.device.create_command_encoder()
    if per_pass:
        for _ in range(n):
            p = enc.begin_compute_pass()
            rt._record(p, d, groups)
            p.end()
    else:
        p = enc.begin_compute_pass()
        for _ in range(n):
            rt._record(p, d, groups)
        p.end()
    t0 = time.perf_counter()
    rt.queue.submit([enc.finish()])
    rt._wait()
    return (time.perf_counter() - t0) / n * 1e6


copy = copy_shader_dispatches(rt, 2 * key.nbytes)[0]
for fmt in ("q8", "f32"):
    c = pk.allocate(fmt, batch.num_blocks, shape.num_kv_heads, shape.block_size, shape.head_size)
    pk.write(c, key, value, batch.slot_mapping)
    d = pk.decode_dispatches(c, q, batch, 1 / np.sqrt(128))[0]
    print(f"== decode {fmt}; clocks idle-ish: {clocks()}")
    walls = []
    for _ in range(5):
        walls.append(submit_wait(d, 1, True))
    iso = rt.time(d, runs=10, warmup=1, isolate=True, warmup_ms=0)
    print(f"isolated: timestamps median {iso.median_us:.0f} us, wall per single submit {np.median(walls):.0f} us")
    print(f"one pass, 50 dispatches: wall/N {submit_wait(d, 50, False):.0f} us; clocks now: {clocks()}")
    print(f"50 passes, one submit:   wall/N {submit_wait(d, 50, True):.0f} us")
    b2b = rt.time(d, runs=20, warmup=3, isolate=False)
    print(f"back to back timestamps: median {b2b.median_us:.0f} min {b2b.min_us:.0f} p90 {b2b.p90_us:.0f}; samples {[round(x) for x in b2b.samples_us]}")
    submit_wait(copy, 2000, False)  # ~0.5 s of copies: clocks up
    hot = rt.time(d, runs=10, warmup=0, isolate=True, warmup_ms=0)
    print(f"isolated right after 0.5 s of copies: median {hot.median_us:.0f}; samples {[round(x) for x in hot.samples_us]}; clocks {clocks()}")
