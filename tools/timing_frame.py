"""What kvviz's timing frame costs on this device. Every bench row is the GPU time of one compute pass holding the
kernel's dispatches, from the pass's begin and end timestamps (GpuRuntime.time). This times the same dispatches
three ways, 30 passes each, medians:
    pass           the product's frame: the pass's own begin / end timestamps
    in pass        timestamps written inside the pass, around the dispatches (needs timestamp-query-inside-passes)
    16 in a pass   the dispatches recorded 16 times in one pass, pass timestamps, divided by 16
for a near-empty kernel (480 workgroups of 256 threads, one FMA step: shaders/probe/fma.wgsl), the shader copy of
256 MB and the fast int8 and f16 decodes at the anchor (15 x 4096, 32/8 heads, d128, block 16, scattered).
An experiment on the device: python3 tools/timing_frame.py. Timings are printed, never asserted.
"""
import numpy as np

import kvviz.gpu.runtime as R

R.WANTED_FEATURES = R.WANTED_FEATURES + ("timestamp-query-inside-passes",)
from kvviz.attention import split_decode as fd  # noqa: E402
from kvviz.gpu import fma  # noqa: E402
from kvviz.gpu.copy import copy_shader_dispatches  # noqa: E402
from kvviz.paging import make_batch  # noqa: E402

rt = R.GpuRuntime()
print(rt.summary.line())
IN_PASS = "timestamp-query-inside-passes" in rt.features
REPS = 16


def recorder(dispatches, reps: int, inside: bool):
    groups = [rt._bind_group(d) for d in dispatches]

    def rec(enc, tw=None):
        if tw and inside:
            cp = enc.begin_compute_pass()
            cp._write_timestamp(tw["query_set"], tw["beginning_of_pass_write_index"])
        else:
            cp = enc.begin_compute_pass(timestamp_writes=tw) if tw else enc.begin_compute_pass()
        for _ in range(reps):
            rt._record(cp, dispatches, groups)
        if tw and inside:
            cp._write_timestamp(tw["query_set"], tw["end_of_pass_write_index"])
        cp.end()
    return rec


rng = np.random.default_rng(0)
S, T, H, KVH, D, BS = 15, 4096, 32, 8, 128, 16
batch = make_batch([T] * S, BS, policy="scattered", seed=0)
q = rng.standard_normal((S, H, D)).astype(np.float32)
cases = [(f"near-empty kernel ({fma.FLOOR_GROUPS} x 256 threads)", fma.fma_dispatches(rt, "f32", groups=fma.FLOOR_GROUPS, iters=1)[0]),
         ("shader copy, 256 MB", copy_shader_dispatches(rt, 256 << 20)[0])]
for fmt in (fd.INT8, fd.F16):
    n = batch.num_blocks * KVH * BS * fmt.wpt(D)
    k = rt.upload(rng.integers(0, 1 << 31, n, dtype=np.uint32) & np.uint32(0x3C3C3C3C), "k")
    v = rt.upload(rng.integers(0, 1 << 31, n, dtype=np.uint32) & np.uint32(0x3C3C3C3C), "v")
    plan = fd.FastDecode(rt).plan(fmt, k, v, KVH, q, batch, 0.088)
    cases.append((f"fast {fmt.name} decode, split + reduce", plan.dispatches))
    cases.append((f"fast {fmt.name} decode, split alone", plan.dispatches[:1]))
ft = fma.measure_timing_floor(rt, 30, 5)
print(f"the product's timing floor (kvviz.gpu.fma.measure_timing_floor): {ft.median_us:.1f} us")
print(f"{'dispatches':42s} {'pass':>9s} {'in pass':>9s} {f'{REPS} in a pass':>14s}   (median us)")
for name, d in cases:
    a = rt.time(d, 30, 5).median_us
    b = rt.time(d, 30, 5, record=recorder(d, 1, True)).median_us if IN_PASS else float("nan")
    c = rt.time(d, 10, 2, record=recorder(d, REPS, False)).median_us / REPS
    print(f"{name:42s} {a:9.1f} {b:9.1f} {c:14.1f}", flush=True)
