"""Every attention kernel at growing contexts (zero keys, V = position: the exact output is the mean
position): prints the error, or the refusal, per kernel and length. Used for docs/loop-limits.md and
the issue notes: `python tools/long_context_sweep.py` (lavapipe here, the H200 via tools/device-check.sh long)."""
import numpy as np

from kvviz.errors import DeviceLimitError
from kvviz.gpu.runtime import GpuRuntime
from kvviz.kernels.paged import PagedKernels
from kvviz.kernels.turboquant import TurboQuantKernels
from kvviz.paging import make_batch


def main():
    rt = GpuRuntime()
    print(f"{rt.summary.name}: loop limit {rt.loop_limit}")
    pk, tq = PagedKernels(rt), TurboQuantKernels(rt)
    for fmt, hs in (("f32", 64), ("f32", 128), ("f32", 256), ("q8", 64), ("q8", 128), ("q8", 256)):
        for n in (16384, 32768, 40000, 45000, 65536, 131072, 262144):
            if hs == 256 and n > 131072:
                continue
            batch = make_batch([n], 16)
            v = np.broadcast_to(np.arange(n, dtype=np.float32)[:, None, None], (n, 1, hs)).copy()
            cache = pk.allocate(fmt, batch.num_blocks, 1, 16, hs)
            pk.write(cache, np.zeros_like(v), v, batch.slot_mapping)
            q = np.ones((1, 1, hs), np.float32)
            try:
                out = pk.decode(cache, q, batch, 0.1)
                w = pk.weights(cache, q, batch, 0.1)
                res = f"decode err {np.abs(out - (n - 1) / 2).max():.3g}  weights sum-1 {abs(w.sum() - 1):.2g}"
            except DeviceLimitError as e:
                res = "refused: " + str(e).split(" This adapter")[0]
            print(f"{fmt:4s} head {hs:3d}  {n:7d} tokens  {res}", flush=True)
            del cache
    for d in (64, 128):
        for n in (16384, 30000, 40000, 65536, 131072):
            K = np.zeros((n, 1, d), np.float32)
            V = np.ones((n, 1, d), np.float32)
            cache = tq.allocate(1, d, n)
            tq.compress(cache, K + 1e-3, V)
            q = np.zeros((1, 1, d), np.float32)
            try:
                w = tq.scores(cache, q, n - 1, 0.1)
                res = f"scores sum-1 {abs(w.sum() - 1):.2g}"
                out = tq.decode(cache, q[0], n - 1, 0.1)
                res += f"  seed decode finite {np.isfinite(out).all()}"
            except DeviceLimitError as e:
                res += "  seed refused: " + str(e).split(" This adapter")[0]
            print(f"tq   head {d:3d}  {n:7d} tokens  {res}", flush=True)


if __name__ == "__main__":
    main()
