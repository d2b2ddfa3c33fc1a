"""Times the tile fast decode (kvviz/kernels/fast_decode_tile.py) beside the split one (fast_decode.py) at the
anchor shape (15 x 4096, 32/8 heads, d128, block 16, scattered blocks) for the int8 (seed layout) and FP8 caches,
over its knobs; every output is checked against the oracle (kvviz/oracles/paged.decode) first. Run on the device:
    python3 tools/tile_decode_time.py [num_seqs ctx] [--formats=int8,fp8_e4m3] [--lanes=4,8,16] [--ua=1,2,4]
        [--uc=2,4,8] [--pt=0,512]
Prints the copy shader's GB/s, then one line a kernel: median GPU us (pass timestamps, 30 runs after 5 warm-up),
GB/s of its unique bytes and % of copy, max error against the oracle and the tolerance."""
import sys

import numpy as np

from kvviz.gpu.runtime import GpuRuntime
from kvviz.kernels import fast_decode as fd
from kvviz.kernels import fast_decode_tile as ft
from kvviz.kernels.copy import measure_copy
from kvviz.oracles import paged as O
from kvviz.paging import make_batch

FLAGS = dict(a[2:].split("=", 1) for a in sys.argv[1:] if a.startswith("--") and "=" in a)
ARGS = [a for a in sys.argv[1:] if not a.startswith("--")]
S, T = (int(ARGS[0]), int(ARGS[1])) if len(ARGS) > 1 else (15, 4096)
H, KVH, D, BS, SCALE = 32, 8, 128, 16, 0.088
ints = lambda key, d: [int(x) for x in FLAGS.get(key, d).split(",")]  # noqa: E731

rt = GpuRuntime()
print(rt.summary.line())
copy_gbps, _ = measure_copy(rt, 256 << 20, 20, 3)
print(f"copy shader: {copy_gbps:.0f} GB/s; {S} x {T} tokens, {H}/{KVH} heads, d{D}, block {BS}, scattered")
batch = make_batch([T] * S, BS, policy="scattered", seed=0)
rng = np.random.default_rng(0)
q = rng.standard_normal((S, H, D)).astype(np.float32)
fast = fd.FastDecode(rt)
tile = ft.TileDecode(fast)
FORMATS = {"int8": fd.INT8, "fp8_e4m3": fd.fp8_format("e4m3", False), "fp8_e5m2": fd.fp8_format("e5m2", False)}


def cache(fmt):
    """Random records: int8 codes / finite FP8 codes (|value| small) and a positive per-token scale word."""
    n = batch.num_blocks * KVH * BS
    codes = rng.integers(0, 1 << 32, (n, D // 4), dtype=np.uint32) & np.uint32(0x3F3F3F3F if fmt.fp8 else 0xFFFFFFFF)
    sc = rng.uniform(0.5, 2.0, (n, 1)).astype(np.float32) / 127
    words = np.concatenate([codes, sc.view(np.uint32)], 1)
    if fmt.fp8:
        import ml_dtypes
        kind = {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}[fmt.fp8]
        vals = codes.copy().view(np.uint8).view(kind).astype(np.float64).reshape(n, D)
    else:
        vals = codes.copy().view(np.int8).astype(np.float64).reshape(n, D)
    vals = vals * sc.astype(np.float64)
    return words, vals.reshape(batch.num_blocks, KVH, BS, D)


def line(label, fmt, plan, ref, tol):
    rt.run(plan.dispatches)
    err = float(np.abs(rt.read(plan.out, np.float32, plan.shape) - ref).max())
    t = rt.time(plan.dispatches, 30, 5).median_us
    nb, _ = fd.decode_traffic(fmt, batch, H, KVH, D, plan.num_partitions)
    gbps = nb / (t * 1e3)
    print(f"{fmt.name:8s} {label:58s} {t:8.1f} us {gbps:6.0f} GB/s {100 * gbps / copy_gbps:5.1f} %  "
          f"error {err:.2e} {'ok' if err <= tol else 'OVER'} (tol {tol:.1e})", flush=True)


for name in FLAGS.get("formats", "int8,fp8_e4m3").split(","):
    fmt = FORMATS[name]
    (kw, kf), (vw, vf) = cache(fmt), cache(fmt)
    k, v = rt.upload(kw, "k"), rt.upload(vw, "v")
    ref = O.decode(q, kf, vf, batch.block_tables, batch.context_lens, BS, SCALE)
    tol = fd.f32_tolerance(float(np.abs(vf).max()))
    plan = fast.plan(fmt, k, v, KVH, q, batch, SCALE)
    line(f"split (default): {plan.describe()}", fmt, plan, ref, tol)
    for pt in ints("pt", "0,512"):
        for la in ints("lanes", "4,8,16"):
            for ua in ints("ua", "1,2,4"):
                for uc in ints("uc", "4,8"):
                    try:
                        plan = tile.plan(fmt, k, v, KVH, q, batch, SCALE, partition_tokens=pt or None, lanes=la,
                                         unroll_a=ua, unroll_c=uc)
                    except Exception as exc:  # noqa: BLE001 (a tuning table: say what failed and go on)
                        print(f"{fmt.name:8s} tile LA<={la} UA={ua} UC={uc} pt={pt}: {exc}")
                        continue
                    line(f"tile LA={plan.layout.lanes} UA={ua} UC={uc}, {plan.num_partitions} x {plan.partition_tokens} tokens",
                         fmt, plan, ref, tol)
