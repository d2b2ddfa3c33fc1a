"""TurboQuant's fast decode over the PAGED records (fast_decode_tq plan_paged: one split + one reduce for the batch)
beside the per-sequence fast decode (plan: a split + a reduce per sequence over the seed compressor's caches), at
bench shapes, on the same tokens: GPU-timestamp medians, and whether the two writers' words and the two decodes'
outputs are bit-identical.

    python tools/tq_paged_vs_seq.py [--shape decode-15x4096 --shape decode-1x61440] [--runs 30]
"""
import argparse

import numpy as np

from kvviz.bench import SHAPES, make_inputs
from kvviz.formats import turboquant as tqf
from kvviz.gpu.runtime import GpuRuntime
from kvviz.kernels import fast_decode_tq as fq
from kvviz.methods import get_method
from kvviz.methods.context import GpuContext


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", action="append", choices=sorted(SHAPES))
    ap.add_argument("--runs", type=int, default=30)
    a = ap.parse_args()
    rt = GpuRuntime()
    ctx = GpuContext(rt)
    m = get_method("turboquant")
    print(f"adapter: {rt.summary.line()}")
    for name in a.shape or ["decode-15x4096", "decode-1x61440"]:
        shape = SHAPES[name]
        batch, key, value, q = make_inputs(shape)
        scale = float(1 / np.sqrt(shape.head_size))
        d = shape.head_size
        qkv = m.quantize(ctx, batch, key, value)  # the paged records (tq_general_compress)
        kern, caches, comp, _ = m._caches(ctx, batch, key, value)  # the seed compressor's per-sequence caches
        rt.run(comp)
        same_words = all(np.array_equal(np.concatenate(kern.read(c)), np.concatenate(w))
                         for c, w in zip(caches, qkv.extra["words"]))
        fast = fq.TQFastDecode(rt)
        paged = m.fast_plan(ctx, qkv, batch, q, scale)
        seq = fast.plan(caches, q, [int(n) for n in batch.context_lens], scale, m.qjl_scale,
                        partition_tokens=paged.partition_tokens)
        rt.run(paged.rotate + paged.dispatches + seq.rotate + seq.dispatches)
        same_out = np.array_equal(fast.read(paged), fast.read(seq))
        tp = rt.time(paged.dispatches, a.runs)
        ts = rt.time(seq.dispatches, a.runs)
        nb, _ = fq.decode_traffic_paged(batch, shape.num_heads, shape.num_kv_heads, d, paged.num_partitions)
        print(f"{name}: paged {tp.median_us:.1f} us (p90 {tp.p90_us:.1f}; {len(paged.dispatches)} dispatches, "
              f"{nb / tp.median_us / 1e3:.0f} GB/s of {nb / 1e6:.1f} MB) | per-sequence {ts.median_us:.1f} us (p90 "
              f"{ts.p90_us:.1f}; {len(seq.dispatches)} dispatches) | {paged.describe()} | writers' words identical: "
              f"{same_words}; outputs bit-identical: {same_out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
