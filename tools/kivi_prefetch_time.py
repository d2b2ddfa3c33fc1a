"""GPU-timestamp medians of the fast KIVI decode (kvviz/kernels/fast_decode_kivi.py) with its default, with the
software-pipelined loads forced off and forced on (plan's prefetch None / False / True), at a bench shape; the
on and off outputs must agree bit for bit (exit 1 otherwise). The method writes the caches (Kivi.quantize).
Run on the device (tools/device-siblings.sh does):

    python3 tools/kivi_prefetch_time.py [--shape decode-15x4096] [--runs 30] [BITS:RECENT ...]

BITS:RECENT defaults to 2:128 4:128 2:0 4:0 (the method's default window, and none).
"""
import argparse
import os
import sys

import numpy as np

from kvviz.bench import SHAPES
from kvviz.kernels import fast_decode_kivi as fk
from kvviz.methods import get_method

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from time_method_kernels import setup  # noqa: E402  (the shared bench-shape setup)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("configs", nargs="*", default=["2:128", "4:128", "2:0", "4:0"], help="BITS:RECENT")
    ap.add_argument("--shape", default="decode-15x4096", choices=sorted(SHAPES))
    ap.add_argument("--runs", type=int, default=30)
    a = ap.parse_args()
    rt, ctx, batch, key, value, q, scale, copy = setup(a)
    print(f"{'kivi':<12} {'prefetch':<14} {'median us':>10} {'p90 us':>9} {'GB/s':>8} {'%copy':>6}  plan")
    fast = fk.KiviFastDecode(rt)
    ok = True
    for cfg in a.configs:
        bits, recent = (int(x) for x in cfg.split(":"))
        m = get_method("kivi", bits=bits, recent=recent)
        qkv = m.quantize(ctx, batch, key, value)
        qc = qkv.device["cache"]
        qp = m._pad_q(q, qc.head_size)
        kvh = qc.num_kv_heads
        outs = {}
        for pf in (None, False, True):
            plan = fast.plan(bits, qc.k, qc.v, qc.extra["res"], kvh, qp, batch, scale, seq_plan=qc.extra["plan"],
                             info=qc.extra["info"], prefetch=pf)
            rt.run(plan.dispatches)
            outs[pf] = fast.read(plan)
            t = rt.time(plan.dispatches, a.runs)
            nb, _ = fk.decode_traffic(batch, qc.extra["plan"], bits, qp.shape[1], kvh, qc.head_size,
                                      plan.num_partitions)
            g = t.gbps(nb)
            what = {None: f"default ({'on' if plan.prefetch else 'off'})", False: "off", True: "on"}[pf]
            print(f"{cfg:<12} {what:<14} {t.median_us:10.1f} {t.p90_us:9.1f} {g:8.0f} {100 * g / copy:6.1f}  "
                  f"{plan.describe()}", flush=True)
        same = np.array_equal(outs[True], outs[False]) and bool(np.isfinite(outs[True]).all())
        ok &= same
        print(f"{cfg:<12} on == off bit for bit: {same}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
