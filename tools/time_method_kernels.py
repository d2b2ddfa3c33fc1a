"""GPU-timestamp medians of methods' own kernels at a bench shape, with method options, without the end-to-end
numpy check `kvviz bench` adds (at the anchor, gguf's numpy IQ4_NL quantiser alone runs for minutes). The
kernels' correctness is the conformance suites' (make test); this only times them.

    python tools/time_method_kernels.py [--shape decode-15x4096] [--runs 30] iq4_nl turboquant:bits=3,v_bits=3 ...
"""
import argparse

import numpy as np

from kvviz.bench import SHAPES, make_inputs
from kvviz.gpu.runtime import GpuRuntime
from kvviz.gpu.copy import time_copy_shader
from kvviz.gpu.timed import checked
from kvviz.families.registry import get_method, method_class
from kvviz.methods.context import GpuContext


def parse(spec: str):
    name, _, opts = spec.partition(":")
    raw = dict(kv.split("=", 1) for kv in opts.split(",") if kv)
    return name, method_class(name).parse_options(raw, text=True, defaults=False)


def setup(a):
    """The runtime, context, bench inputs of shape a.shape and the copy shader's GB/s (printed): what a timing
    tool over a bench shape starts with."""
    rt = GpuRuntime()
    ctx = GpuContext(rt)
    shape = SHAPES[a.shape]
    batch, key, value, q = make_inputs(shape)
    scale = float(1 / np.sqrt(shape.head_size))
    ct, nbytes = time_copy_shader(rt, 2 * key.nbytes, a.runs, 3)  # the bench's memory roof: read + write bytes
    copy = ct.gbps(nbytes)
    print(f"adapter: {rt.summary.line()}\nshape: {a.shape}; copy shader {copy:.0f} GB/s (median {ct.median_us:.1f} us)")
    return rt, ctx, batch, key, value, q, scale, copy


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("methods", nargs="+", help="NAME or NAME:opt=value,opt=value")
    ap.add_argument("--shape", default="decode-15x4096", choices=sorted(SHAPES))
    ap.add_argument("--runs", type=int, default=30)
    a = ap.parse_args()
    rt, ctx, batch, key, value, q, scale, copy = setup(a)
    print(f"{'method':<40} {'kernel':<46} {'median us':>10} {'p90 us':>9} {'GB/s':>8} {'%copy':>6}")
    for spec in a.methods:
        name, opts = parse(spec)
        m = get_method(name, **opts)
        for tk in checked(m.timed_kernels(ctx, batch, key, value, q, scale), name):
            t = rt.time(tk.dispatches, a.runs)
            g = t.gbps(tk.bytes)
            print(f"{spec:<40} {tk.name:<46} {t.median_us:10.1f} {t.p90_us:9.1f} {g:8.0f} {100 * g / copy:6.1f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
