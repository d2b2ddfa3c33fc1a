"""Times every writer at the anchor shape (15 x 4096 tokens, 8 KV heads, d128, block 16, scattered blocks):
the seed int8 writer, the first-wave writers and the fast writers (kvviz/attention/writers.py) side by
side, the fast ones in their variants (lanes a row, subgroups or workgroup memory); the fast seed-layout
writer is checked word for word against the seed oracle. Prints GPU medians, GB/s on the writer's unique bytes and
% of the copy shader measured in the same run. Timings are printed, never asserted. Run on the device:
    python3 tools/fast_write_bench.py [num_seqs ctx]
"""
import sys

import numpy as np

from kvviz.gpu.runtime import GpuRuntime
from kvviz.attention import writers as fw
from kvviz.families.kivi import kernels as kivi_kernels
from kvviz.families.int8 import kernels as int8_kernels
from kvviz.families.fp8 import kernels as fp8_kernels
from kvviz.gpu.copy import measure_copy
from kvviz.attention.traffic import writer_bytes
from kvviz.families.registry import get_method
from kvviz.methods.context import GpuContext
from kvviz.families import writer_oracles as ofw
from kvviz.paging import make_batch

ARGS = [a for a in sys.argv[1:] if not a.startswith("--")]
FLAGS = dict(a[2:].split("=", 1) for a in sys.argv[1:] if a.startswith("--") and "=" in a)
S, T = (int(ARGS[0]), int(ARGS[1])) if len(ARGS) > 1 else (15, 4096)
# --assume-subgroup=N: an experiment, not a product path: let lane groups of up to N lanes use subgroup shuffles
# although wgpu only guarantees its reported minimum (4 on NVIDIA); the words are still checked against the oracle.
ASSUME_SG = int(FLAGS.get("assume-subgroup", 0))
# --auto=N (an experiment on the default variant every method's writer takes): N lanes a row through subgroup
# shuffles where the adapter guarantees subgroups of N (N = 4 on NVIDIA); --auto=Nsg: N lanes through shuffles,
# assuming subgroups of 32 (the H200's real size; wgpu does not guarantee it). The words are the conformance
# suites' to check (the seed-layout rows below are checked here).
AUTO = FLAGS.get("auto", "")
# --per-dispatch: a writer row of several dispatches (KIVI: its tokens, then its key groups) also timed dispatch by dispatch
# --q8-trunc: q8_0's roundf as trunc(q + copysign(0.5 - 2^-25, q)) (write_ggml.wgsl Q8_TRUNC), the variant to time
# --amax-blocks=N: row blocks a workgroup of the per-tensor amax pass (fast_write.AMAX_BLOCKS), the A/B
if FLAGS.get("amax-blocks"):
    fp8_kernels.AMAX_BLOCKS = int(FLAGS["amax-blocks"])
# --kgroup-rs=N: row sets of KIVI's key-group writer (fast_write.KGROUP_ROW_SETS: N x D/4 threads, 32/N rows a thread)
if FLAGS.get("kgroup-rs"):
    kivi_kernels.KGROUP_ROW_SETS = int(FLAGS["kgroup-rs"])
# --no-stage: the llama.cpp exchange writers store each lane's words in place (write_ggml.wgsl STAGE = 0), the A/B
if "--no-stage" in sys.argv[1:]:
    from kvviz.families.ggml import writer as _fwg
    _fwg.STAGE = False
if "--q8-trunc" in sys.argv[1:]:
    from kvviz.families.ggml import writer as _fwg
    _fwg.Q8_TRUNC = True
if AUTO:
    from kvviz.attention import writers as _fw
    _n = int(AUTO.rstrip("sg"))
    if AUTO.endswith("sg"):
        _fw.smallest_subgroup = lambda rt: 32  # noqa: E731 (the experiment above)
    _fw.AUTO_LANES, _fw.MAX_LANES = _n, _n

KVH, D, BS = 8, 128, 16
rt = GpuRuntime()
ctx = GpuContext(rt)
print(rt.summary.line())
print(fw.describe(rt), f"(smallest subgroup reported: {fw.smallest_subgroup(rt)})")
copy_gbps, _ = measure_copy(rt, 256 << 20, 20, 3)
print(f"copy shader: {copy_gbps:.0f} GB/s")
batch = make_batch([T] * S, BS, policy="scattered", seed=0)
rng = np.random.default_rng(0)
key = rng.standard_normal((batch.num_tokens, KVH, D)).astype(np.float32)
value = rng.standard_normal((batch.num_tokens, KVH, D)).astype(np.float32)
RUNS, WARM = 30, 5


def report(name, dispatches, nbytes):
    t = rt.time(dispatches, RUNS, WARM)
    gbps = nbytes / (t.median_us * 1e3)
    print(f"{name:62s} {t.median_us:9.1f} us {gbps:7.0f} GB/s {100 * gbps / copy_gbps:5.1f}% of copy ({t.method})")
    return t.median_us


def report_part(name, dispatches, row_us):
    """One dispatch of a multi-dispatch row timed alone: its share of the row's time (its own bytes are not split
    out, so no GB/s: the row's bytes over a part's time read past 100 % of copy)."""
    t = rt.time(dispatches, RUNS, WARM)
    print(f"{name:62s} {t.median_us:9.1f} us {100 * t.median_us / row_us:5.1f}% of the row's time ({t.method})")


# the seed writer and the fast seed-layout writer (same bytes)
seed = get_method("int8_seed")
cache = ctx.paged.allocate("q8", batch.num_blocks, KVH, BS, D)
wd = ctx.paged.write_dispatches(cache, key, value, batch.slot_mapping)
rt.run(wd)
nbytes = writer_bytes(cache, batch, key)
report("reshape_and_cache_q8 (seed)", wd, nbytes)
seed_words = ctx.paged.read(cache, "k")
want = ofw.int8_seed(batch, key)  # the seed oracle (kvviz/attention/paged_oracle.py): 127/amax and amax/127 exact
print(f"the seed GLSL writer vs its oracle: {int((seed_words != want).sum())} of {want.size} K words differ "
      "(a driver's division need not be correctly rounded; the tests allow it 3 ULP on scales and 1 code at ties)")
variants = [("default", None, None)] + [(f"{n} lanes", None, n) for n in (4, 8, 16, 32)] + \
           [(f"no subgroups, {n} lanes", False, n) for n in (8, 32)]
if FLAGS.get("methods"):  # --methods=...: only those methods' writers (below), not these variants
    variants = []
if ASSUME_SG:
    fw.smallest_subgroup = lambda rt: ASSUME_SG  # noqa: E731 (the experiment above)
    variants = [("default", None, None)] + [(f"subgroups assumed {ASSUME_SG}, {n} lanes", True, n) for n in (4, 8, 16, 32)
                                            if n <= ASSUME_SG]
for label, sub, lanes in variants:
    try:
        var = fw.Variant(rt, sub, lanes)
    except Exception as exc:  # noqa: BLE001 (a tuning table: say what failed and go on)
        print(f"int8 seed layout, {label}: {exc}")
        continue
    fc = ctx.paged.allocate("q8", batch.num_blocks, KVH, BS, D)
    d = int8_kernels.int8_dispatches(rt, key, value, batch.slot_mapping, fc.k, fc.v, BS, seed=True, variant=var)
    rt.run(d)
    got = ctx.paged.read(fc, "k")
    same = "same words as the seed oracle" if (got == want).all() else f"{int((got != want).sum())} words differ from the seed oracle"
    report(f"fast int8 writer, seed layout ({label}; {same})", d, nbytes)

if FLAGS.get("only") == "seed":
    sys.exit(0)
# --nvfp4-groups=4,2,1: the NVFP4 writer (amax pass + writer pass) at those groups a lane (fast_write_ggml.nvfp4_dispatches;
# 1 and 2: the scale words put together by subgroup shuffles), each checked word for word against the oracle;
# --nvfp4-stage=on,off: the records staged through workgroup memory or stored in place by each lane; --nvfp4-kvs=off,on:
# K and V on separate lanes (1 or 2 groups a lane); --nvfp4-scale-pass=off,on: s_t derived once by its own dispatch
if FLAGS.get("nvfp4-groups"):
    from types import SimpleNamespace

    from kvviz.families.fp4 import format as f4
    from kvviz.families.fp4 import writer as fw4
    from kvviz.families.ggml import writer as fwg
    from kvviz.families.fp4 import oracle as of4
    wpt4 = f4.words_per_token(D)
    rk, rv, _ = of4.quantize_batch(key, value, batch.slot_mapping)
    sm4 = np.asarray(batch.slot_mapping).astype(np.int64)
    stages = [{"on": True, "off": False}[x] for x in (FLAGS.get("nvfp4-stage") or "on").split(",")]
    kvss = [{"on": True, "off": False}[x] for x in (FLAGS.get("nvfp4-kvs") or "off").split(",")]
    sps = [{"on": True, "off": False}[x] for x in (FLAGS.get("nvfp4-scale-pass") or "off").split(",")]
    for g, stg, kvs, sp in ((int(x), st, kv, s) for x in FLAGS["nvfp4-groups"].split(",") for st in stages for kv in kvss
                            for s in sps):
        n4 = batch.num_blocks * KVH * BS * wpt4
        kb4, vb4 = rt.upload(np.zeros(n4, np.uint32), "k"), rt.upload(np.zeros(n4, np.uint32), "v")
        tb4 = rt.upload(np.zeros(4, np.uint32), "tensor")
        d4 = fw4.nvfp4_dispatches(rt, key, value, batch.slot_mapping, kb4, vb4, tb4, BS, groups_per_lane=g, stage=stg,
                                  kv_split=kvs, scale_pass=sp)
        rt.run(d4)
        bad = 0
        for buf, rec in ((kb4, rk), (vb4, rv)):
            got4 = rt.read(buf, np.uint32, (batch.num_blocks, KVH, BS, wpt4))
            bad += int((got4[sm4 // BS, :, sm4 % BS] != rec).sum())
        same = "same words as the oracle" if bad == 0 else f"{bad} words differ from the oracle"
        row_us = report(f"nvfp4 writer, {g} groups a lane{'' if stg else ', stores in place'}{', K|V lanes' if kvs else ''}{', scale pass' if sp else ''} ({same})", d4, writer_bytes(SimpleNamespace(wpt=wpt4), batch, key))
        for i, d in enumerate(d4):
            report_part(f"  {i}: {d.kernel.name.split('[')[0]} {d.grid}", [d], row_us)
# --methods=kivi,q8_0: only those methods' writers below (and the seed writer above, the copy's reference)
# every method's first-wave and fast writer (their timed rows)
q = rng.standard_normal((S, 32, D)).astype(np.float32)
for key_, opts in [("int8_token", {}), ("fp8_e4m3", {}), ("fp8_e4m3", {"scale_mode": "per_tensor"}), ("fp8_e5m2", {}),
                   ("int4_group", {}), ("kivi", {"bits": 2, "recent": 128}), ("kivi", {"bits": 4, "recent": 128}),
                   ("f16", {}), ("q8_0", {}), ("q4_0", {}), ("q4_1", {}), ("q5_0", {}), ("q5_1", {}), ("iq4_nl", {}),
                   ("mxfp4", {}), ("nvfp4", {}), ("turboquant", {})]:
    if FLAGS.get("methods") and key_ not in FLAGS["methods"].split(","):
        continue
    m = get_method(key_, **opts)
    rows = [t for t in m.timed_kernels(ctx, batch, key, value, q, 0.088) if t.role == "writer"]
    for t in rows:
        row_us = report(f"{m.label}: {t.name} [{t.impl}]", t.dispatches, t.bytes)
        if "--per-dispatch" in sys.argv[1:] and len(t.dispatches) > 1:  # each dispatch of the row alone
            for i, d in enumerate(t.dispatches):
                report_part(f"  {i}: {d.kernel.name.split('[')[0]} {d.grid}", [d], row_us)
